"""With `--network.core none` the feed-forward path computes what it computed before policies
could be recurrent, bit for bit.

The digests below were recorded with the code before the recurrent core existed (commit
8fb8228), on this project's development machine (jax 0.10.2, XLA:CPU, the suite's XLA flags
of tests/conftest.py). XLA's flags change how it rounds: when the suite's flags change,
record the digests again by running this file in a checkout of that commit with the new
flags.
Each covers a deterministic run end to end: the actors' rollouts (compiled and step by step),
the learner's placement, update and normalization, and the evaluator's greedy episodes.

XLA compiles for the CPU it runs on, so another CPU may round differently: a canary that
uses none of podrace's code (a small network's forward and Adam step, through Flax and
Optax) is recorded too. Where the canary's digest differs, this machine computes floats
differently and the recorded digests say nothing: the test is skipped, not failed.
"""

import hashlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from podrace.config import replace
from podrace.presets import PRESETS
from podrace.runtime.run import prepare

CANARY = "30195a69cf01ce47d3d57706d928d8acc972f4427bf09e9b048661c443733cb6"
RUNS = {
    "ppo-envpool-fused": "525cc8dc68a58a2e4c9c106f98bdf03ed90d8022319aa4c2716bde37359018d9",
    "impala-gymnasium-two-learners-normalized": (
        "6237b6978e536d5361c527b1ee9110c950efbf65255b638f5303a56ac213b55b"
    ),
}
CHANGES = {
    "ppo-envpool-fused": {},
    "impala-gymnasium-two-learners-normalized": {
        "algo": "impala",
        "env.backend": "gymnasium",
        "impala.num_minibatches": 2,
        "layout.learner_device_ids": (0, 1),
        "normalize.obs": True,
        "normalize.reward": True,
    },
}


def small(tmp_path, **changes):
    """A short deterministic cartpole-ppo run: 12 updates of 2 actors x 8 envs x 16 steps."""
    base = {
        "total_steps": 8 * 2 * 16 * 12,
        "rollout_length": 16,
        "env.num_envs": 8,
        "layout.actors_per_device": 2,
        "ppo.num_minibatches": 4,
        "eval.every_updates": 0,
        "eval.episodes": 2,
        "eval.num_envs": 2,
        "log.console": "none",
        "log.run_dir": str(tmp_path),
        "deterministic": True,
    }
    return replace(PRESETS["cartpole-ppo"][1], **{**base, **changes})


def digest(*trees) -> str:
    """sha256 of every leaf's dtype, shape and bytes."""
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(jax.device_get(trees)):
        leaf = np.ascontiguousarray(leaf)
        h.update(f"{leaf.dtype}{leaf.shape}".encode())
        h.update(leaf.tobytes())
    return h.hexdigest()


def canary() -> str:
    """A computation that uses nothing of podrace: how this machine rounds."""

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.tanh(nn.Dense(64, kernel_init=nn.initializers.orthogonal(2**0.5))(x))
            x = nn.tanh(nn.Dense(64)(x))
            return nn.Dense(3)(x)

    net = Net()
    x = jax.random.normal(jax.random.PRNGKey(0), (256, 4))
    params = net.init(jax.random.PRNGKey(1), x)
    optimizer = optax.adam(2.5e-3, eps=1e-5)

    @jax.jit
    def step(params, opt_state):
        def loss(p):
            logits = net.apply(p, x)
            return -jnp.mean(jax.nn.log_softmax(logits)[:, 0]) + jnp.mean(jnp.exp(logits))

        grads = jax.grad(loss)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    state = (params, optimizer.init(params))
    for _ in range(4):
        state = step(*state)
    return digest(state[0])


def run_digest(tmp_path, name: str) -> str:
    cfg = small(tmp_path, **{"log.run_name": name}, **CHANGES[name])
    run = prepare(cfg)
    result = run.run()
    return digest(run.learner.state.params, result.final_eval.returns)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(RUNS))
def test_feedforward_runs_compute_what_they_computed_before(tmp_path, name):
    if canary() != CANARY:
        pytest.skip("this machine rounds differently from the one the digests were recorded on")
    assert run_digest(tmp_path, name) == RUNS[name]
