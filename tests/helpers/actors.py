"""Fakes around the actor and the evaluator: scripted envs, params sources, a list sink,
and one actor run of a real env."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from podrace.actor import Actor, ActorSettings, make_policy_fns
from podrace.config import EnvConfig, NetworkConfig
from podrace.control import Control, Heartbeat, Lifetime
from podrace.envs.envpool_backend import EnvpoolEnv
from podrace.networks import make_network
from podrace.sync.base import ChannelClosed, Snapshot, Subscriber
from podrace.types import EnvSpec, EnvStep


class ScriptedEnv:
    """2 envs whose episodes end at scripted steps, with next-step autoreset.

    `ends[b]` maps a 1-based step number to "terminated" or "truncated" for env b; the step
    after an end is the autoreset step (reward 0, first obs of the next episode). Each step's
    observation is its step number; a subclass changes `observe`.
    """

    spec = EnvSpec(obs_shape=(1,), obs_dtype=np.float32, num_actions=2, action_shape=())
    num_envs = 2

    def __init__(self, ends: list[dict[int, str]], on_step=None, on_reset=None):
        self.ends, self.on_step, self.on_reset = ends, on_step, on_reset
        self.steps = 0
        self.closed = False

    def reset(self):
        if self.on_reset:
            self.on_reset()
        return np.zeros((self.num_envs, 1), np.float32)

    def step(self, actions):
        self.steps += 1
        if self.on_step:
            self.on_step(self.steps)
        kind = [self.ends[b].get(self.steps) for b in range(self.num_envs)]
        terminated = np.array([k == "terminated" for k in kind])
        truncated = np.array([k == "truncated" for k in kind])
        done = terminated | truncated
        return EnvStep(
            obs=self.observe(),
            reward=np.ones(self.num_envs, np.float32),
            terminated=terminated,
            truncated=truncated,
            episode_done=done,
            episode_return=np.where(done, float(self.steps), 0.0),
            episode_length=np.where(done, self.steps, 0),
        )

    def observe(self) -> np.ndarray:
        return np.full((self.num_envs, 1), self.steps, np.float32)

    def close(self):
        self.closed = True


class FakeParams(Subscriber):
    """Always has `version`; records the min_version of every blocking get."""

    def __init__(self, version: int = 0):
        self.version, self.gets, self.closed = version, [], False

    def poll(self):
        if self.closed:
            raise ChannelClosed("closed")
        return Snapshot(self.version, {"w": jnp.zeros(())})

    def get(self, min_version, timeout=None):
        if self.closed:
            raise ChannelClosed("closed")
        self.gets.append(min_version)
        return Snapshot(max(self.version, min_version), {"w": jnp.zeros(())})

    @property
    def acked_version(self):
        return self.version


class ListSink:
    """Keeps every rollout put into it, never full."""

    def __init__(self):
        self.rollouts = []

    def put(self, rollout):
        self.rollouts.append(rollout)
        return 0.0


class FixedLengthEnv:
    """Env i ends an episode every lengths[i] steps, with return = its length."""

    def __init__(self, lengths):
        self.lengths = np.asarray(lengths)
        self.num_envs = len(lengths)
        self.spec = EnvSpec((1,), np.dtype(np.float32), 2, ())
        self.t = np.zeros(self.num_envs, int)

    def reset(self):
        return np.zeros((self.num_envs, 1), np.float32)

    def step(self, actions):
        self.t += 1
        done = self.t % self.lengths == 0
        zeros = np.zeros(self.num_envs)
        return EnvStep(
            self.reset(), zeros, done, done & False, done, self.lengths.astype(float), self.lengths
        )

    def close(self):
        pass


ROLLOUTS = 4
"""Rollouts `run_actor` collects."""


class FixedParams(Subscriber):
    """Always the same params, at version 0."""

    def __init__(self, params):
        self.snapshot = Snapshot(0, params)

    def poll(self):
        return None

    def get(self, min_version, timeout=None):
        return self.snapshot

    @property
    def acked_version(self):
        return 0


def envpool_envs(env_id: str, num_envs: int, **env_kwargs) -> EnvpoolEnv:
    """`num_envs` envpool envs of `env_id`, seeded 7 as `run_actor`'s callers use them."""
    return EnvpoolEnv(EnvConfig(id=env_id, **env_kwargs), num_envs, seed=7)


def init_params(network: NetworkConfig, env) -> tuple:
    """`network` for `env`'s spec and its params from key 1, on the first CPU device."""
    net = make_network(network, env.spec)
    obs = np.zeros((1,) + env.spec.obs_shape, env.spec.obs_dtype)
    return net, jax.device_put(net.init(jax.random.PRNGKey(1), obs), jax.devices("cpu")[0])


def run_actor(
    env,
    T: int,
    fused: bool,
    network: NetworkConfig,
    rollouts: int = ROLLOUTS,
    must_fuse: bool = False,
) -> list:
    """The `rollouts` rollouts of length T one actor collects from `env` (closed at the end)
    with fixed params, through its fused rollout or (`fused` False) step by step. The actor
    must have a fused rollout when `fused` asks for it, and always with `must_fuse`."""
    net, params = init_params(network, env)
    policy = make_policy_fns(net.apply).on(jax.devices("cpu")[0])
    settings = ActorSettings(0, T, rollouts, max_policy_lag=1, key=jax.random.PRNGKey(3))
    sink = ListSink()
    actor = Actor(
        settings,
        env,
        policy,
        FixedParams(params),
        sink,
        Control(Lifetime(), Heartbeat("actor-0"), lambda _: None),
    )
    assert actor.fused is not None or not (fused or must_fuse)
    if not fused:
        actor.fused = None
    actor.warm_up(params)
    with jax.transfer_guard("disallow"):
        actor.run()
    env.close()
    return sink.rollouts
