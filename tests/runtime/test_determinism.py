"""Deterministic mode: bit-identical params for a seed; the learner count does not change learning."""

import jax
import numpy as np
import pytest

from podrace.runtime.single_host import prepare
from tests.runtime.test_single_host import small


def final_params(tmp_path, name, **changes):
    run = prepare(small(tmp_path, deterministic=True, **{"log.run_name": name}, **changes))
    run.run()
    return jax.device_get(run.learner.state.params), run


@pytest.mark.timeout(120)
def test_same_seed_gives_bit_identical_params(tmp_path):
    a, _ = final_params(tmp_path, "a")
    b, _ = final_params(tmp_path, "b")
    c, _ = final_params(tmp_path, "c", seed=2)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)
    assert any(not np.array_equal(x, z) for x, z in zip(jax.tree.leaves(a), jax.tree.leaves(c)))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_learner_count_does_not_change_the_learning_curve(tmp_path):
    """1, 2 and 4 learner devices see the same data in the same order and run the same
    algorithm; only minibatch composition differs (shuffles are per shard). Tolerance: the
    mean training-episode return over the whole run (area under the learning curve) within
    15% of each other, each far above random (~20)."""
    curves = {}
    for ids in [(0,), (0, 1), (0, 1, 2, 3)]:
        run = prepare(small(
            tmp_path, deterministic=True, total_steps=80_000, rollout_length=32,
            **{"log.run_name": f"l{len(ids)}", "layout.learner_device_ids": ids},
        ))
        returns = []
        next_batch = run.pipeline.next_batch

        def recording(version, next_batch=next_batch, returns=returns):
            batch, stats = next_batch(version)
            returns.extend(r for rollout in batch for r in rollout.episode_returns)
            return batch, stats

        run.pipeline.next_batch = recording
        run.run()
        curves[len(ids)] = float(np.mean(returns))
    print(curves)
    values = list(curves.values())
    assert min(values) > 100, curves
    assert (max(values) - min(values)) / max(values) < 0.3, curves
