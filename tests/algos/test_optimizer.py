"""IMPALA's optimizer against NumPy references of PyTorch's RMSprop (Cleanba) and TF1's
RMSPropOptimizer (the paper), with Cleanba's clip and once-per-update linear schedule."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from podrace.algos.impala import make_optimizer
from podrace.config import ImpalaConfig
from tests.algos import numpy_reference as ref

NUM_UPDATES, NUM_MB = 3, 2


def gradient_sequence(steps: int) -> list[list[np.ndarray]]:
    """Fixed gradients: some with global norm far above 40 (the clip binds), some with
    entries ~1e-2 (eps matters), signs and scales varying per step."""
    rng = np.random.default_rng(0)
    scales = [300.0, 0.01, 5.0, 0.02, 80.0, 0.005]
    return [
        [
            (scales[k % len(scales)] * rng.normal(size=shape)).astype(np.float32)
            for shape in ((3, 4), (4,))
        ]
        for k in range(steps)
    ]


def run_optimizer(cfg: ImpalaConfig, params: list[np.ndarray], grads: list[list[np.ndarray]]):
    optimizer, _ = make_optimizer(cfg, NUM_UPDATES)
    params = [jnp.asarray(p) for p in params]
    state = optimizer.init(params)
    step = jax.jit(optimizer.update)
    for g in grads:
        updates, state = step([jnp.asarray(x) for x in g], state, params)
        params = optax.apply_updates(params, updates)
    return [np.asarray(p) for p in params]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("style", ["torch", "tf"])
def test_rmsprop_style_computes_the_reference_update(style):
    """Cleanba (torch): clip 40, RMSProp eps 0.01 outside the sqrt, decay 0.99, lr 6e-4 x
    (1 - (step // num_minibatches) / num_updates). tf: eps inside the sqrt, ms from 1."""
    cfg = ImpalaConfig(rmsprop_style=style, num_minibatches=NUM_MB)
    assert (cfg.learning_rate, cfg.rmsprop_eps, cfg.rmsprop_decay, cfg.max_grad_norm) == (
        6e-4,
        0.01,
        0.99,
        40.0,
    )
    steps = NUM_UPDATES * NUM_MB
    grads = gradient_sequence(steps)
    params = [np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), np.zeros(4, np.float32)]
    lrs = [6e-4 * (1 - (k // NUM_MB) / NUM_UPDATES) for k in range(steps)]
    expected = ref.rmsprop(params, grads, lrs, decay=0.99, eps=0.01, max_norm=40.0, style=style)
    other = ref.rmsprop(
        params,
        grads,
        lrs,
        decay=0.99,
        eps=0.01,
        max_norm=40.0,
        style="tf" if style == "torch" else "torch",
    )

    got = run_optimizer(cfg, params, grads)

    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-8)
    # The two conventions really differ on this sequence, so matching one is a real check.
    assert max(np.abs(e - o).max() for e, o in zip(expected, other)) > 1e-4


@pytest.mark.timeout(60)
def test_constant_learning_rate_without_annealing():
    cfg = dataclasses.replace(ImpalaConfig(num_minibatches=NUM_MB), anneal_lr=False)
    grads = gradient_sequence(4)
    params = [np.ones((3, 4), np.float32), np.ones(4, np.float32)]
    expected = ref.rmsprop(
        params, grads, [6e-4] * 4, decay=0.99, eps=0.01, max_norm=40.0, style="torch"
    )
    for g, e in zip(run_optimizer(cfg, params, grads), expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-8)
