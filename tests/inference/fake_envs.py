"""Envs and a policy for the inference server's tests: every action is checked where it
lands, and the policy's choice and version can be read back from what it returned.

`CheckedEnv`: env i's observation at its step n is [id_i, n] (id_i unique per env of a
run); the only action it accepts there is `expected_action(obs)`, anything else raises in
the worker (so a batch answered to the wrong worker, or rows swapped inside one, fails the
run). Every `episode` steps it terminates and autoresets on the next step (next-step
autoreset: that step's action is ignored, as podrace's convention says, but still checked).

`fake_apply`: the policy that chooses `expected_action(obs)` with certainty and whose value
is the params' version (params `{"v": version}`), so the rollout shows which version
served each step.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

import numpy as np

from podrace.types import EnvSpec, EnvStep

SPEC = EnvSpec((2,), np.dtype(np.float32), 3, ())


def expected_action(obs: np.ndarray) -> np.ndarray:
    return ((obs[..., 0] + obs[..., 1]) % 3).astype(np.int32)


def fake_apply(params, obs):
    # JAX is imported here, not with the module: env worker processes import this module to
    # unpickle the env factory, and JAX would add seconds to each one's start and exit.
    import jax.numpy as jnp

    from podrace.algos.distributions import Categorical

    choice = jnp.mod(obs[..., 0] + obs[..., 1], 3).astype(jnp.int32)
    logits = 60.0 * jnp.eye(3, dtype=jnp.float32)[choice]
    return Categorical(logits), jnp.zeros(obs.shape[:-1], jnp.float32) + params["v"]


def params(version: int) -> dict:
    return {"v": np.float32(version)}


class CheckedEnv:
    """See the module docstring."""

    spec = SPEC

    def __init__(self, num_envs: int, seed: int, factory: CheckedEnvs) -> None:
        self.num_envs = num_envs
        self.ids = (seed % 100_003) * 64 + np.arange(num_envs, dtype=np.float32)
        self.n = np.zeros(num_envs, np.float32)
        self.done = np.zeros(num_envs, bool)
        self.factory = factory
        self.slow = factory.slow_s if seed % 2 == 0 or factory.slow_all else 0.0
        self.steps = 0

    def obs(self) -> np.ndarray:
        return np.stack([self.ids, self.n], axis=-1).astype(np.float32)

    def reset(self) -> np.ndarray:
        self.n[:] = 0
        self.done[:] = False
        return self.obs()

    def step(self, actions: np.ndarray) -> EnvStep:
        want = expected_action(self.obs())
        if not np.array_equal(np.asarray(actions), want):
            raise AssertionError(f"envs {self.ids.tolist()} got actions {actions}, want {want}")
        self.steps += 1
        if self.factory.die_every and self.steps == self.factory.die_at:
            os.kill(os.getpid(), signal.SIGKILL)
        die = self.factory.die_once
        if die and self.steps == self.factory.die_at:
            try:
                os.close(os.open(die, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        if self.slow:
            time.sleep(self.slow)
        was_done = self.done.copy()
        self.n = np.where(was_done, 0, self.n + 1).astype(np.float32)
        terminated = ~was_done & (self.n % self.factory.episode == 0)
        self.done = terminated
        reward = np.where(was_done, 0.0, 1.0).astype(np.float32)
        return EnvStep(
            obs=self.obs(),
            reward=reward,
            terminated=terminated,
            truncated=np.zeros(self.num_envs, bool),
            episode_done=terminated,
            episode_return=np.where(terminated, self.factory.episode, 0).astype(np.float64),
            episode_length=np.where(terminated, self.factory.episode, 0).astype(np.int64),
        )

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class CheckedEnvs:
    """The env factory: `slow_s` per step in the workers whose seed is even (every worker
    with `slow_all`); the first
    worker to reach its step `die_at` kills itself with SIGKILL (once per run: the file
    `die_once` marks it); with `die_every`, every worker does, each restart included."""

    episode: int = 5
    slow_s: float = 0.0
    slow_all: bool = False
    die_once: str | None = None
    die_at: int = 5
    die_every: bool = False

    def __call__(self, num_envs: int, seed: int) -> CheckedEnv:
        return CheckedEnv(num_envs, seed, self)
