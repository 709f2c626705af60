"""The collector's and the relays' bookkeeping with a fake Ray (no cluster starts): how many
workers `--ray.num-workers auto` wants as nodes come and go, and the bytes the relays count
out of the learner's node."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from podrace.config import RayConfig, TrainConfig

ray = pytest.importorskip("ray")


class FakeCall:
    """What `handle.method.remote(...)` returns: a unique object ref stand-in."""

    ids = itertools.count()

    def __init__(self, name: str):
        self.name, self.id = name, next(self.ids)


class FakeHandle:
    def __init__(self):
        self.start = SimpleNamespace(remote=lambda: FakeCall("start"))
        self.next = SimpleNamespace(remote=lambda: FakeCall("next"))
        self.wait_stopped = SimpleNamespace(remote=lambda: FakeCall("wait_stopped"))
        self.fetched = SimpleNamespace(remote=lambda: FakeCall("fetched"))


class FakeRemote:
    def __init__(self):
        self.launched: list[FakeHandle] = []

    def options(self, **_):
        return self

    def remote(self, *_):
        self.launched.append(FakeHandle())
        return self.launched[-1]


def fake_ray(nodes: list[dict]):
    return SimpleNamespace(
        nodes=lambda: nodes,
        exceptions=ray.exceptions,
        kill=lambda handle, no_restart: None,
        remote=lambda cls: FakeRemote(),
        get_runtime_context=lambda: SimpleNamespace(get_node_id=lambda: "head"),
    )


def node(node_id: str, cpus: float, alive: bool = True) -> dict:
    return {"NodeID": node_id, "Alive": alive, "Resources": {"CPU": cpus}}


def collector_for(nodes: list[dict], **ray_cfg):
    from podrace.runtime.ray.collector import Collector

    cfg = TrainConfig(
        runtime="ray",
        ray=RayConfig(num_workers="auto", data_order="elastic", rollouts_per_update=2, **ray_cfg),
    )
    counts: dict[str, float] = {}
    run = SimpleNamespace(
        cfg=cfg,
        lifetime=SimpleNamespace(stopping=False),
        metrics=SimpleNamespace(count=lambda k, n=1: counts.__setitem__(k, counts.get(k, 0) + n)),
    )
    order = SimpleNamespace(started=lambda slot: None, lost=lambda slot: None)
    order.wanted = lambda slot: False
    remote = FakeRemote()
    collector = Collector(
        fake_ray(nodes), run, remote, lambda slot: None, order, relays=None, elastic=True
    )
    return collector, remote


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
    relays = Relays(fake_ray([]), board=None, channel="c" * 32, learner_node=head)
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
