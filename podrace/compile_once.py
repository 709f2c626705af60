"""Programs a run calls once or rarely (a network's first params, a batch of env resets),
compiled for compile speed rather than run speed.

XLA:CPU spends most of a small program's compile time optimizing it: a 64x64 MLP's init
(orthogonal kernels: random normals and QR) took 4.6-5.0 CPU seconds to compile at XLA's
default level and 1.7-1.8 with its backend optimizations off, a gymnax CartPole reset of 64
envs 1.6-1.8 against 0.6-0.7. Such a program then runs in microseconds either way. Its
results may differ from the optimized program's in the last bits of floating point (no
reassociation is allowed at either level; fusion decisions differ), the same in every run.
"""

from __future__ import annotations

from typing import Any

RUN_ONCE_OPTIONS: dict[str, Any] = {
    "xla_backend_optimization_level": 0,
    "xla_llvm_disable_expensive_passes": True,
}
"""XLA compile options for a program that runs once, on XLA:CPU."""


def compile_once(lowered: Any, platform: str) -> Any:
    """`lowered` (a `jax.stages.Lowered`) compiled for a program run once or rarely: with
    `RUN_ONCE_OPTIONS` on `platform` "cpu", as JAX compiles it elsewhere."""
    return lowered.compile(RUN_ONCE_OPTIONS if platform == "cpu" else None)
