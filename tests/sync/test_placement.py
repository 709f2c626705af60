"""`place`: device_put without its per-leaf cost when the tree is already where it goes."""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from podrace.sync.placement import on_device, place

pytestmark = pytest.mark.timeout(60)


def tree_on(where):
    return {
        "w": jax.device_put(np.arange(6, dtype=np.float32).reshape(2, 3), where),
        "b": jax.device_put(np.ones(3, np.float32), where),
    }


def test_a_tree_already_on_the_device_comes_back_as_device_put_gives_it_without_a_copy():
    d0 = jax.devices()[0]
    one_device_mesh = NamedSharding(Mesh(np.asarray([d0]), ("x",)), P())
    tree = tree_on(one_device_mesh)  # e.g. the learner's replicated params on a one-device mesh
    placed = place(tree, d0)
    expected = jax.device_put(tree, d0)
    for got, want, src in zip(
        jax.tree.leaves(placed), jax.tree.leaves(expected), jax.tree.leaves(tree)
    ):
        assert got.sharding == want.sharding and isinstance(got.sharding, SingleDeviceSharding)
        assert got.unsafe_buffer_pointer() == src.unsafe_buffer_pointer()  # a view: nothing moved
        np.testing.assert_array_equal(got, want)
    assert (
        on_device(placed, d0) and place(placed, d0)["w"] is placed["w"]
    )  # already canonical: untouched


def test_a_tree_elsewhere_is_moved():
    d0, d1 = jax.devices()[:2]
    for source in (tree_on(d1), {"w": np.zeros((2, 3), np.float32), "b": np.ones(3, np.float32)}):
        assert not on_device(source, d0)
        placed = place(source, d0)
        assert all(
            x.devices() == {d0} and isinstance(x.sharding, SingleDeviceSharding)
            for x in jax.tree.leaves(placed)
        )
        for got, src in zip(jax.tree.leaves(placed), jax.tree.leaves(source)):
            np.testing.assert_array_equal(got, np.asarray(src))


def test_a_tree_spread_over_devices_is_not_on_one_of_them():
    devices = jax.devices()[:2]
    spread = jax.device_put(
        np.zeros((2, 4), np.float32), NamedSharding(Mesh(np.asarray(devices), ("x",)), P("x"))
    )
    assert not on_device({"a": spread}, devices[0])
    assert place({"a": spread}, devices[0])["a"].devices() == {devices[0]}
    assert place(tree_on(devices[1]), None)["w"].devices() == {devices[1]}  # None: left where it is


def _has_gpu() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


@pytest.mark.skipif(
    not _has_gpu(), reason="needs a GPU beside the CPU (run on an accelerator machine)"
)
def test_trees_cross_between_gpu_and_cpu_under_the_runtime_threads_transfer_guard():
    """--layout.actor-platform cpu: a GPU learner's params go to CPU actors, their rollouts
    back. jax.device_put from GPU to CPU counts as an implicit device-to-host transfer
    (the first such run failed in its actor: 'Disallowed device-to-host transfer')."""
    gpu, cpu = jax.devices("gpu")[0], jax.devices("cpu")[0]
    params, rollout = tree_on(gpu), tree_on(cpu)
    with jax.transfer_guard("disallow"):
        to_cpu, to_gpu = (
            place(params, cpu),
            place(rollout, NamedSharding(Mesh(np.asarray([gpu]), ("x",)), P())),
        )
    assert on_device(to_cpu, cpu) and all(x.devices() == {gpu} for x in jax.tree.leaves(to_gpu))
    np.testing.assert_array_equal(to_cpu["w"], np.arange(6).reshape(2, 3))
