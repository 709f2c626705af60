"""What podrace checks of a Ray cluster before it starts workers (a fake `ray.nodes()`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from podrace.config import ConfigError, RayConfig
from podrace.runtime.ray.cluster import _check_resources


def cluster(*nodes: dict, dead: dict | None = None):
    """`ray.nodes()` of alive nodes offering `nodes` (and a dead one offering `dead`)."""
    listed = [{"NodeID": f"n{i}", "Alive": True, "Resources": r} for i, r in enumerate(nodes)]
    if dead is not None:
        listed.append({"NodeID": "dead", "Alive": False, "Resources": dead})
    return SimpleNamespace(nodes=lambda: listed)


TWO_NODES = cluster(
    {"CPU": 2.0}, {"CPU": 2.0, "actor_node": 4.0}, dead={"CPU": 64.0, "actor_node": 64.0}
)


@pytest.mark.parametrize(
    "workers,resources,message",
    [
        (2, (), None),
        (4, (), None),
        (5, (), "can hold 4 of the 5 workers"),  # waited 120 s, then a TimeoutError traceback
        (2, ("actor_node=1",), None),
        (3, ("actor_node=1",), "can hold 2 of the 3 workers"),  # 2 CPUs on the actor node
        (8, ("actor_node=1",), "can hold 2 of the 8 workers"),
        (1, ("actor_node=0.9",), None),
        (1, ("gpu_node=1",), "no Ray node offers the worker resources {'gpu_node': 1.0}"),
    ],
)
def test_workers_the_cluster_cannot_hold_are_refused_before_any_starts(workers, resources, message):
    """8 workers on a node with room for 4 are refused in one line before any starts, not
    waited for until the start timeout."""
    cfg = RayConfig(num_workers=workers, worker_resources=resources)
    if message is None:
        _check_resources(TWO_NODES, cfg)
    else:
        with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("}", r"\}")):
            _check_resources(TWO_NODES, cfg)


@pytest.mark.parametrize(
    "workers,resources,message",
    [
        (8, ("actor_node=1",), None),  # two start now, the others when nodes join
        ("auto", (), None),
        (1, ("gpu_node=1",), "no Ray node offers the worker resources {'gpu_node': 1.0}"),
    ],
)
def test_the_elastic_order_needs_room_for_one_worker(workers, resources, message):
    cfg = RayConfig(
        num_workers=workers,
        worker_resources=resources,
        data_order="elastic",
        rollouts_per_update=2,
    )
    if message is None:
        _check_resources(TWO_NODES, cfg)
    else:
        with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("}", r"\}")):
            _check_resources(TWO_NODES, cfg)


def test_the_elastic_order_refuses_a_cluster_with_room_for_no_worker():
    cfg = RayConfig(data_order="elastic", worker_resources=("actor_node=1",))
    with pytest.raises(ConfigError, match="can hold no worker"):
        _check_resources(cluster({"CPU": 0.5, "actor_node": 4.0}), cfg)


def test_worker_capacity_counts_what_each_alive_node_holds():
    from podrace.runtime.ray.cluster import worker_capacity

    nodes = [
        {"NodeID": "head", "Alive": True, "Resources": {"CPU": 1.0}},
        {"NodeID": "a", "Alive": True, "Resources": {"CPU": 4.0, "actor_node": 2.0}},
        {"NodeID": "b", "Alive": True, "Resources": {"CPU": 0.5, "actor_node": 9.0}},
        {"NodeID": "gone", "Alive": False, "Resources": {"CPU": 64.0, "actor_node": 64.0}},
    ]
    ray = SimpleNamespace(nodes=lambda: nodes)
    assert worker_capacity(ray, RayConfig()) == {"head": 1, "a": 4}
    pinned = RayConfig(worker_resources=("actor_node=1",))
    assert worker_capacity(ray, pinned) == {"a": 2}
