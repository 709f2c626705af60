"""The MinAtar torso's convolution as XLA's conv and as a product over sliced patches.

`minatar_cnn` (podrace.networks.torsos.MinAtarCNN) computes its 3x3 conv of 16 channels as
`PatchConv`: the same parameters and results as flax's `nn.Conv`, computed as one matrix
product over patches gathered by slicing. This script times the torso's forward and
backward pass over a batch of MinAtar planes (one minibatch of `minatar-ppo`) both ways,
interleaved round by round in one process so machine noise hits both alike, and reports
process CPU time per sample (all threads), the figure that bounds a learner on a shared
CPU, and wall time.

    python benchmarks/minatar_torso.py [--rounds 20] [--out benchmarks/results/minatar_torso.json]
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

from podrace.networks.torsos import MinAtarCNN, _conv


class XlaConvTorso(nn.Module):
    """MinAtarCNN with flax's `nn.Conv` in place of `PatchConv` (same parameter tree)."""

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = nn.relu(_conv(16, 3)(obs.astype(jnp.float32)))
        return nn.relu(nn.Dense(128)(x.reshape((x.shape[0], -1))))


def timed(step, params, calls: int) -> tuple[float, float]:
    """(process CPU s, wall s) per call, over `calls` calls."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(calls):
        out = step(params)
    jax.block_until_ready(out)
    return (time.process_time() - cpu) / calls, (time.perf_counter() - wall) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--channels", type=int, default=6, help="MinAtar planes (6: SpaceInvaders)")
    parser.add_argument("--out", default="benchmarks/results/minatar_torso.json")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    obs = jnp.asarray(rng.integers(0, 2, (args.batch, 10, 10, args.channels), dtype=np.uint8))
    variants = {"xla_conv": XlaConvTorso(), "patch_conv": MinAtarCNN()}
    params = variants["patch_conv"].init(jax.random.PRNGKey(0), obs)
    steps = {
        name: jax.jit(jax.grad(lambda p, m=module: (m.apply(p, obs) ** 2).mean()))
        for name, module in variants.items()
    }
    for step in steps.values():
        jax.block_until_ready(step(params))
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            samples[name].append(timed(step, params, args.calls))
    result = {
        "benchmark": "minatar_torso",
        "batch": args.batch,
        "channels": args.channels,
        "rounds": args.rounds,
        "calls_per_round": args.calls,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_avg_1m_at_end": os.getloadavg()[0],
        },
        "jax": jax.__version__,
        "variants": {
            name: {
                "cpu_us_per_sample": statistics.median(c for c, _ in s) * 1e6 / args.batch,
                "wall_us_per_sample": statistics.median(w for _, w in s) * 1e6 / args.batch,
            }
            for name, s in samples.items()
        },
    }
    v = result["variants"]
    result["cpu_ratio_patch_over_xla"] = (
        v["patch_conv"]["cpu_us_per_sample"] / v["xla_conv"]["cpu_us_per_sample"]
    )
    print(json.dumps(result, indent=2))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
