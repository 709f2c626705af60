"""The collector's and the relays' bookkeeping with a fake Ray (no cluster starts): how many
workers `--ray.num-workers auto` wants as nodes come and go, and the bytes the relays count
out of the learner's node."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.runtime.fake_ray import FakeRay, Worker, fake_run, make_collector, node

ray = pytest.importorskip("ray")


def collector_for(nodes: list[dict], **ray_cfg):
    run = fake_run(num_workers="auto", data_order="elastic", rollouts_per_update=2, **ray_cfg)
    order = SimpleNamespace(started=lambda slot: None, lost=lambda slot: None)
    order.wanted = lambda slot: False
    return make_collector(run, order, FakeRay(nodes))


def start(slot, node_id: str) -> None:
    """What `Collector._started` records of a worker Ray placed on `node_id`."""
    slot.node, slot.start, slot.ready = node_id, None, True


@pytest.mark.timeout(60)
def test_auto_adds_workers_as_nodes_join_and_leaves_out_a_node_its_workers_were_lost_on():
    nodes = [node("head", 1), node("a", 2)]
    collector, remote = collector_for(nodes)
    collector.look_at_cluster()
    assert [s.worker_id for s in collector.slots] == [0, 1, 2] and len(remote.launched) == 3
    for slot, where in zip(collector.slots, ["head", "a", "a"]):
        start(slot, where)
    collector.lost_nodes.clear()

    # Node a's raylet dies: Ray reports its workers lost (not their own error) while it
    # still lists the node as alive. Node b joins with room for 3: auto wants 1 + 3.
    for slot in collector.slots[1:]:
        collector._failed(slot, ray.exceptions.ActorUnavailableError("node gone", b"x" * 16))
    assert collector.lost_nodes == {"a"} and collector.pending() == 2
    nodes.append(node("b", 3))
    collector.look_at_cluster()
    assert len(collector.slots) == 4, "a node Ray still lists after its workers were lost"

    # A worker that starts on a node makes it count again.
    for slot in collector.slots[1:]:
        start(slot, "b")
    collector.lost_nodes.discard("b")
    nodes[1]["Alive"] = False
    collector.look_at_cluster()
    assert len(collector.slots) == 4

    # A worker whose own loop raised says nothing about its node.
    error = ray.exceptions.RayTaskError("next", "Traceback", ValueError("env"))
    collector._failed(collector.slots[3], error)
    assert collector.lost_nodes == {"a"}


@pytest.mark.timeout(60)
def test_auto_stops_at_max_workers():
    collector, _ = collector_for([node("head", 1), node("a", 8)], max_workers=3)
    collector.look_at_cluster()
    assert len(collector.slots) == 3


@pytest.mark.timeout(60)
def test_relays_count_one_fetch_per_node_and_version_across_their_replacements():
    from podrace.runtime.ray.relays import Relays

    head, a, b = "0" * 55 + "1", "a" * 56, "b" * 56  # Ray node ids are 56 hex digits
    relays = Relays(FakeRay(), board=None, channel="c" * 32, learner_node=head)
    assert relays.place(head) is None  # the learner's node reads the learner's board
    _, first = relays.place(a)
    assert relays.place(a) is None and set(relays.handles) == {a}
    relays.counted(a, first, 3)
    relays.counted(a, first, 5)
    relays.counted(a, first, 4)  # an older report arriving late adds nothing
    relays.ended(a, first)  # its node lost: a new relay starts counting from 0
    _, second = relays.place(a)
    relays.counted(a, first, 9)  # the ended relay's late report is ignored
    relays.counted(a, second, 2)
    assert relays.fetched == {a: 7} and relays.fetches_out() == 7
    relays.kill()
    assert relays.place(b) is None and not relays.handles


HEAD, NODE_A = "0" * 55 + "1", "a" * 56  # Ray node ids are 56 hex digits


def collector_with_relays(**ray_cfg):
    """A collector with two worker slots, relays, and a cluster of the learner's node and
    node A: its first look at the cluster places a relay on A."""
    from podrace.runtime.ray.relays import Relays
    from podrace.runtime.ray.restarts import Slot

    fake = FakeRay([node(HEAD, 1), node(NODE_A, 2)], node_id=HEAD)
    relays = Relays(fake, board=None, channel="c" * 32, learner_node=HEAD)
    order = SimpleNamespace(started=lambda slot: None, lost=lambda slot: None)
    order.wanted = lambda slot: False
    run = fake_run(num_workers=2, **ray_cfg)
    collector, remote = make_collector(run, order, fake, relays)
    collector.slots = [Slot(0), Slot(1)]
    return collector, relays


def count_reply(relay, fetched: int, collector) -> None:
    """`relay` answers the collector's question of how many versions it pulled."""
    (call,) = relay.pending("fetched")
    call.resolve(fetched)
    collector.step(0)


def a_relay_that_counted_3():
    """A collector whose relay on node A answered that it pulled 3 versions, and has been
    asked again: (collector, relays, that relay)."""
    collector, relays = collector_with_relays()
    collector.look_at_cluster()
    first = relays.handles[NODE_A]
    count_reply(first, 3, collector)
    collector.look_at_cluster()
    return collector, relays, first


@pytest.mark.timeout(60)
def test_a_late_stop_notice_of_a_replaced_relay_leaves_the_new_one_in_place_and_counting():
    collector, relays, first = a_relay_that_counted_3()
    # Node A is lost: the count call fails first; the collector forgets the relay and the
    # next look places a new one.
    first.pending("fetched")[0].fail(ray.exceptions.ActorDiedError())
    collector.step(0)
    assert NODE_A not in relays.handles and first.killed
    collector.look_at_cluster()
    second = relays.handles[NODE_A]
    assert second is not first
    # Then Ray's notice that the first relay stopped arrives: it is about the first only.
    first.pending("wait_stopped")[0].fail(ray.exceptions.ActorDiedError())
    collector.step(0)
    assert relays.handles.get(NODE_A) is second and not second.killed
    count_reply(second, 2, collector)
    assert relays.fetched == {NODE_A: 5} and collector.fetches_out() == 5


@pytest.mark.timeout(60)
def test_a_replaced_relays_count_call_still_in_flight_does_not_stop_the_new_one_counting():
    collector, relays, first = a_relay_that_counted_3()  # asked again; no answer yet
    # The first relay stops (its subscription failed): it is killed and replaced while its
    # count call is still in flight.
    first.pending("wait_stopped")[0].resolve("RuntimeError: lost the learner's board")
    collector.step(0)
    assert NODE_A not in relays.handles and first.killed
    collector.look_at_cluster()
    second = relays.handles[NODE_A]
    assert second is not first and second.pending("fetched"), "the new relay is never asked"
    count_reply(second, 2, collector)
    # The first relay's late answer counts nothing, and leaves the new relay in place.
    first.pending("fetched")[0].resolve(9)
    collector.step(0)
    assert relays.handles.get(NODE_A) is second
    collector.look_at_cluster()
    count_reply(second, 4, collector)
    assert relays.fetched == {NODE_A: 7} and collector.fetches_out() == 7


@pytest.mark.timeout(60)
def test_weight_bytes_out_counts_only_the_versions_that_leave_the_learners_node():
    """`weight_bytes_out` is `fetches_out()` copies of the params: 0 while every worker
    runs on the learner's node, then one per (other node, version), however many workers
    there pull it and whether directly or through the node's relay."""
    from podrace.runtime.ray.relays import Relays
    from podrace.runtime.ray.restarts import Slot

    nodes = [node(HEAD, 4)]
    fake = FakeRay(nodes, node_id=HEAD)
    relays = Relays(fake, board=None, channel="c" * 32, learner_node=HEAD)
    order = SimpleNamespace(started=lambda slot: None, lost=lambda slot: None)
    order.received, order.wanted = (lambda slot, shipment: None), (lambda slot: True)
    collector, remote = make_collector(fake_run(num_workers=3), order, fake, relays)
    collector.add([Slot(0), Slot(1), Slot(2)])
    workers = [Worker(handle) for handle in remote.launched]
    for worker in workers:
        worker.start(HEAD)
    collector.step(0)
    collector.look_at_cluster()
    assert not relays.handles  # the learner's node reads the learner's board
    for version in range(3):
        for worker in workers:
            worker.deliver(version, fetched=(version,))
        collector.step(0)
    assert collector.fetches_out() == 0

    # Node A joins; workers 1 and 2 restart there and pull versions 2-4 from the learner's
    # board before their node's relay is up: each version leaves once.
    nodes.append(node(NODE_A, 2))
    for worker in workers[1:]:
        worker.die()
    collector.step(0)
    moved = [Worker(handle) for handle in remote.launched[3:]]
    for worker in moved:
        worker.start(NODE_A)
    collector.step(0)
    assert set(relays.handles) == {NODE_A}
    moved[0].deliver(3, fetched=(2, 3))
    moved[1].deliver(3, fetched=(3,))
    workers[0].deliver(3, fetched=(3,))
    collector.step(0)
    moved[0].deliver(4, fetched=(4,))
    collector.step(0)
    assert collector.fetches_out() == 3
    # The relay pulls the versions from then on: 2 more.
    collector.look_at_cluster()
    count_reply(relays.handles[NODE_A], 2, collector)
    assert collector.fetches_out() == 5
