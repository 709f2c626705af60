"""The learner's update alone, as built and in alternative forms, side by side in one process.

On 2 CPU cores the `cartpole-ppo` preset is bound by its learner: every update is 4 epochs x
4 minibatch steps of a 4-64-64 actor MLP and a separate critic MLP over 128 samples, which
costs about as much CPU as the actors' whole rollout. This script times that update (the
jitted, sharded step the learner runs, on a rollout of the preset's shape) against
alternatives, interleaved round by round so machine noise hits every variant alike:
  as_built            the learner's update as the learner compiles it (on CPU with XLA's
                      memory-optimized scheduler, see `learner_compiler_options`);
  default_scheduler   the same program under XLA:CPU's default scheduler (more of its ops
                      run concurrently on the pool);
  fused_twin_mlp      the same maths with the actor and critic MLPs as one program: a
                      [4, 128] first layer and one batched [2, 64, 64] second layer
                      (fewer, larger matmuls);
  shared_torso        one torso for both heads (different maths: a lower bound on what a
                      cheaper network could give, not a candidate for the preset).
Figures are medians over rounds of 10 calls: wall ms and process CPU ms (all threads) per
update, and each variant's ratio over as_built.

    python benchmarks/learner_update.py [--rounds 40] [--out benchmarks/results/learner_update.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from podrace import presets
from podrace.algos.distributions import Categorical
from podrace.config import replace, resolved
from podrace.learner_mesh import (
    env_keys,
    learner_compiler_options,
    make_algorithm,
    make_mesh,
    make_update_fn,
)
from podrace.networks import make_network
from podrace.networks.actor_critic import POLICY_GAIN, VALUE_GAIN
from podrace.networks.torsos import TORSO_GAIN
from podrace.runtime.build import dummy_trajectory, seed_key
from podrace.types import EnvSpec

PRESET = "cartpole-ppo"
SPEC = EnvSpec((4,), np.float32, 2, ())


class FusedTwinMLP(nn.Module):
    """Actor and critic tanh MLPs (64, 64) computed together: first layers concatenated,
    second layers as one batched matmul. Same function class as separate MLPs."""

    hidden: int = 64

    @nn.compact
    def __call__(self, obs: jax.Array):
        x = obs.reshape((obs.shape[0], -1)).astype(jnp.float32)
        h, ortho = self.hidden, nn.initializers.orthogonal(TORSO_GAIN)

        def twin(key, shape):
            return jnp.stack([ortho(k, shape[1:]) for k in jax.random.split(key, 2)])

        k1 = self.param("kernel_1", twin, (2, x.shape[1], h))
        b1 = self.param("bias_1", nn.initializers.zeros, (2, h))
        k2 = self.param("kernel_2", twin, (2, h, h))
        b2 = self.param("bias_2", nn.initializers.zeros, (2, h))
        first = jnp.tanh(x @ jnp.concatenate([k1[0], k1[1]], axis=1) + b1.reshape(-1))
        second = jnp.tanh(jnp.einsum("nbi,bij->nbj", first.reshape(-1, 2, h), k2) + b2)
        logits = nn.Dense(SPEC.num_actions, kernel_init=nn.initializers.orthogonal(POLICY_GAIN))(
            second[:, 0]
        )
        value = nn.Dense(1, kernel_init=nn.initializers.orthogonal(VALUE_GAIN))(second[:, 1])[:, 0]
        return Categorical(logits), value


def compiled_update(cfg, network, options: dict):
    """(compiled update, state, rollout, keys) for `network` under `cfg` on device 0;
    `options` are added to (and override) the learner's own compiler options."""
    device = jax.devices()[0]
    mesh = make_mesh([device])
    params = jax.jit(network.init)(seed_key(0, 0), np.zeros((1,) + SPEC.obs_shape, np.float32))
    algo = make_algorithm(cfg, network.apply)
    state = jax.jit(algo.init)(params)
    keys = env_keys(seed_key(0, 1), 1, cfg.env.num_envs, mesh)
    traj = dummy_trajectory(cfg, SPEC, device)
    obs = np.random.default_rng(0).normal(size=traj.obs.shape).astype(np.float32)
    traj = traj._replace(obs=jax.device_put(obs, device))
    update = make_update_fn(algo, mesh, 1, learner_compiler_options(cfg.network, mesh))
    return (
        update.jitted.lower(state, (traj,), keys).compile(compiler_options=options),
        state,
        traj,
        keys,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--out", default="benchmarks/results/learner_update.json")
    args = parser.parse_args()

    cfg = resolved(presets.get(PRESET))
    shared = resolved(replace(cfg, network=replace(cfg.network, shared_torso=True)))
    separate = make_network(cfg.network, SPEC)
    variants = {
        "as_built": (cfg, separate, {}),
        "default_scheduler": (
            cfg,
            separate,
            {"xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_DEFAULT"},
        ),
        "fused_twin_mlp": (cfg, FusedTwinMLP(), {}),
        "shared_torso": (shared, make_network(shared.network, SPEC), {}),
    }
    built, compile_s = {}, {}
    for name, (c, network, options) in variants.items():
        start = time.perf_counter()
        built[name] = compiled_update(c, network, options)
        compile_s[name] = time.perf_counter() - start
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in built}
    for _ in range(args.rounds):
        for name, (update, state, traj, keys) in built.items():
            jax.block_until_ready(update(state, (traj,), keys))
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(10):
                state, keys, _ = update(state, (traj,), keys)
            jax.block_until_ready(state)
            samples[name].append(
                ((time.perf_counter() - wall) * 1e3 / 10, (time.process_time() - cpu) * 1e3 / 10)
            )
    results = {}
    for name, rows in samples.items():
        results[name] = {
            "wall_ms": statistics.median(r[0] for r in rows),
            "cpu_ms": statistics.median(r[1] for r in rows),
            "compile_s": compile_s[name],
        }
    for name, r in results.items():
        r["wall_over_as_built"] = r["wall_ms"] / results["as_built"]["wall_ms"]
        r["cpu_over_as_built"] = r["cpu_ms"] / results["as_built"]["cpu_ms"]
        print(
            f"{name:20} wall {r['wall_ms']:.2f} ms  cpu {r['cpu_ms']:.2f} ms  "
            f"(x{r['wall_over_as_built']:.2f} wall, x{r['cpu_over_as_built']:.2f} cpu)"
        )
    report = {
        "benchmark": "learner_update",
        "preset": PRESET,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": len(os.sched_getaffinity(0)),
            "jax": jax.__version__,
        },
        "rounds": args.rounds,
        "calls_per_round": 10,
        "variants": results,
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
