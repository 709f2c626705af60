"""With `--network.core none` the feed-forward path computes what it computed before policies
could be recurrent: bit for bit on a machine whose digests are recorded, within a tight
tolerance anywhere else.

The digests below were recorded with the code before the recurrent core existed (commit
8fb8228) under the suite's XLA flags of tests/conftest.py (jax 0.10.2, XLA:CPU), on two
machines: this project's development machine, and a 2-core AVX2/FMA machine where the
current code gave that commit's digests too. XLA's flags change how it rounds: when the
suite's flags change, record the digests (and `VALUES`) again by running this file's
computations in a checkout of that commit with the new flags.
Each covers a deterministic run end to end: the actors' rollouts (compiled and step by step),
the learner's placement, update and normalization, and the evaluator's greedy episodes.

XLA compiles for the CPU it runs on, so another CPU may round differently: a canary that
uses none of podrace's code (a small network's forward and Adam step, through Flax and
Optax) tells which machine's digests apply. Where no recorded canary matches, the run is
compared with `VALUES` (recorded on the second machine, with commit 8fb8228): each param
leaf's sum and sum of magnitudes within `RTOL` of that leaf's recorded sum of magnitudes,
and the greedy episodes' returns exactly. Rounding alone moves them by about 1e-6 (the
same runs compiled for AVX only: --xla_cpu_max_isa=AVX, at most 1.2e-6, the same returns);
one update computed otherwise moves them by far more than `RTOL`.
"""

import hashlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from podrace.runtime.run import prepare
from tests.helpers.configs import small

DIGESTS = {
    # canary of the machine -> digest of each run there
    "30195a69cf01ce47d3d57706d928d8acc972f4427bf09e9b048661c443733cb6": {
        "ppo-envpool-fused": "525cc8dc68a58a2e4c9c106f98bdf03ed90d8022319aa4c2716bde37359018d9",
        "impala-gymnasium-two-learners-normalized": (
            "6237b6978e536d5361c527b1ee9110c950efbf65255b638f5303a56ac213b55b"
        ),
    },
    "d95057c437435a58b8ef8cb862ff4796b418b9194c2138e67844deffe212d956": {
        "ppo-envpool-fused": "b87335a24c22169ad9ce7b2cc156f31b792c59a212064448bd8faa803a30b961",
        "impala-gymnasium-two-learners-normalized": (
            "236e9a7205e54c0dd9af7156ce9735c345cb3705ca3e282d314f80c179691a19"
        ),
    },
}
RTOL = 1e-4
VALUES = {
    # run -> returns of the final evaluation, (sum, sum of magnitudes) of each param leaf
    "impala-gymnasium-two-learners-normalized": (
        [183.0, 201.0],
        [
            (5.82076609e-10, 0.00140631315),
            (0.00696396007, 1.97030504),
            (-0.00917778824, 0.100986437),
            (-0.855467038, 35.7322028),
            (0.0143320537, 0.102110491),
            (-21.7610116, 582.296406),
            (0.0317071825, 0.0317071825),
            (-1.92209396, 7.0547144),
            (-0.181131251, 1.90912987),
            (-0.0204294878, 37.0296118),
            (-0.392107554, 1.91625587),
            (6.72220655, 580.73516),
        ],
    ),
    "ppo-envpool-fused": (
        [70.0, 72.0],
        [
            (1.86264515e-09, 0.0334087182),
            (0.00696403673, 3.95697546),
            (0.180349377, 0.9572566),
            (-1.28551792, 38.791204),
            (-0.0948915615, 0.852122018),
            (-22.857618, 597.915851),
            (0.0865346417, 0.0865346417),
            (-2.6760126, 11.2601167),
            (-0.360389579, 6.96718437),
            (-0.208063082, 36.5519684),
            (-1.05560542, 6.13743954),
            (4.93079368, 632.108433),
        ],
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


def run_result(tmp_path, name: str) -> tuple:
    """(final params, final evaluation's returns) of run `name`."""
    # deterministic; metrics every 2 s (the preset's), as when the digests were recorded
    deterministic = {"deterministic": True, "log.interval_s": 2.0, "log.run_name": name}
    cfg = small(tmp_path, **{**deterministic, **CHANGES[name]})
    run = prepare(cfg)
    result = run.run()
    return jax.device_get(run.learner.state.params), np.asarray(result.final_eval.returns)


def differences(params, returns, recorded) -> list[str]:
    """What of (params, returns) is not `recorded` (`VALUES`' entry) within `RTOL`."""
    recorded_returns, recorded_leaves = recorded
    leaves = [np.asarray(leaf, np.float64) for leaf in jax.tree.leaves(params)]
    found = []
    if returns.tolist() != recorded_returns:
        found.append(f"returns {returns.tolist()}, recorded {recorded_returns}")
    if len(leaves) != len(recorded_leaves):
        return [*found, f"{len(leaves)} param leaves, recorded {len(recorded_leaves)}"]
    for i, (leaf, (total, size)) in enumerate(zip(leaves, recorded_leaves)):
        got = (float(leaf.sum()), float(np.abs(leaf).sum()))
        if max(abs(got[0] - total), abs(got[1] - size)) > RTOL * size:
            found.append(f"leaf {i}: (sum, sum of magnitudes) {got}, recorded {(total, size)}")
    return found


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(VALUES))
def test_feedforward_runs_compute_what_they_computed_before(tmp_path, name):
    params, returns = run_result(tmp_path, name)
    digests = DIGESTS.get(canary())
    if digests is not None:  # a machine the digests were recorded on: bit for bit
        assert digest(params, returns) == digests[name]
    assert not differences(params, returns, VALUES[name])
