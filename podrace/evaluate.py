"""The evaluator: a deterministic policy on its own envs and device, in its own thread.

The learner asks for an evaluation of a params version through a bounded queue (a request
that finds the evaluator busy is dropped and counted, so evaluation never slows the
learner); the final evaluation is waited for. Episodes run to completion on fresh envs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from podrace.algos.base import is_recurrent
from podrace.control import Control
from podrace.envs import BatchedEnv
from podrace.fused_rollout import CHUNK_STEPS, FusedEpisodes, fused_episodes_for
from podrace.metrics.registry import Metrics
from podrace.pipeline import BoundedQueue
from podrace.sync.base import Subscriber
from podrace.sync.placement import place

log = logging.getLogger(__name__)

STUCK_EPISODE_STEPS = 10_000
"""An eval env still owing episodes whose current episode has run this many steps (and ten
times the longest episode this evaluation has seen) is given up: its share is taken from
the other envs' later episodes, so an env that never ends an episode (no time limit, a
policy that stalls) cannot hang the evaluation."""


@dataclass(frozen=True)
class EvalResult:
    version: int
    mean_return: float
    returns: np.ndarray
    lengths: np.ndarray
    seconds: float


@dataclass
class _Request:
    version: int
    done: threading.Event | None = None
    result: list = field(default_factory=list)


@dataclass(frozen=True)
class RecurrentGreedy:
    """A recurrent network's greedy policy: `step(params, obs [B, ...], valid [B], state) ->
    (action, next state)`, its core carried from step to step and reset by the network
    where an episode ended, as an actor's is."""

    step: Callable
    initial_state: Callable[[int], Any]
    """Number of envs -> the core's initial state (host arrays)."""


def make_greedy_policy(apply_fn: Callable) -> Callable | RecurrentGreedy:
    """jit((params, obs) -> mode of the policy distribution); for a recurrent network's
    `apply` a `RecurrentGreedy`."""
    if is_recurrent(apply_fn):

        def step(params, obs, valid, state):
            dist, _, states = apply_fn(params, obs[None], valid[None], state)
            return dist.mode()[0], jax.tree.map(lambda x: x[0], states)

        return RecurrentGreedy(jax.jit(step), apply_fn.initial_state)
    return jax.jit(lambda params, obs: apply_fn(params, obs)[0].mode())


class EpisodeTally:
    """The episodes an evaluation counts: env i counts the first quota[i] episodes of its
    own (`episodes` spread evenly over the envs, the first envs taking the remainder).

    Counting "the first `episodes` to end" instead over-counts short episodes: an env whose
    policy fails early ends two or three episodes while another plays one to the limit, so
    the mean return is biased low exactly when the policy is uneven. With per-env quotas
    every counted episode is the first (or k-th) episode of a freshly reset env. An env that
    seems never to end its episode is given up (`STUCK_EPISODE_STEPS`, with a warning): its
    missing share is filled, in the order they ended, by episodes past the other envs' quotas."""

    def __init__(self, episodes: int, num_envs: int, time_limit: int | None = None) -> None:
        """`time_limit`: the env's declared max_episode_steps, if any (no env is given up
        before its episodes could have reached it)."""
        self.quota = episodes // num_envs + (np.arange(num_envs) < episodes % num_envs)
        self._patience = max(STUCK_EPISODE_STEPS, (time_limit or 0) + 1)
        self.finished = np.zeros(num_envs, int)
        self.returns: list[float] = []
        self.lengths: list[float] = []
        self._extra_returns: list[float] = []  # episodes past their env's quota, in order
        self._extra_lengths: list[float] = []
        self._running = np.zeros(num_envs, int)  # steps since each env's last episode end
        self._longest = 0
        self._given_up = np.zeros(num_envs, bool)

    @property
    def _missing(self) -> int:
        """Episodes the given-up envs still owe."""
        return int(np.maximum(self.quota - self.finished, 0)[self._given_up].sum())

    @property
    def complete(self) -> bool:
        """Every share counted or filled; or every env given up (no episode is coming: the
        result then has fewer episodes than asked for, maybe none)."""
        owing = (self.finished < self.quota) & ~self._given_up
        return self._given_up.all() or (
            not owing.any() and len(self._extra_returns) >= self._missing
        )

    def add(self, done: np.ndarray, episode_return: np.ndarray, episode_length: np.ndarray) -> None:
        """One step ([envs]) or several ([steps, envs]) of episode ends, in step order."""
        done = np.asarray(done, bool).reshape(-1, len(self.quota))
        returns = np.asarray(episode_return).reshape(done.shape)
        lengths = np.asarray(episode_length).reshape(done.shape)
        ended_so_far = self.finished + np.cumsum(done, axis=0)  # including this step's
        counted = done & (ended_so_far <= self.quota)
        self.returns.extend(returns[counted].tolist())
        self.lengths.extend(lengths[counted].tolist())
        self._extra_returns.extend(returns[done & ~counted].tolist())
        self._extra_lengths.extend(lengths[done & ~counted].tolist())
        self.finished = ended_so_far[-1]
        after_last_end = np.argmax(done[::-1], axis=0)  # rows after each env's last end here
        self._running = np.where(done.any(axis=0), after_last_end, self._running + done.shape[0])
        if done.any():
            self._longest = max(self._longest, int(lengths[done].max()))
        stuck = (self.finished < self.quota) & ~self._given_up
        stuck &= self._running >= max(self._patience, 10 * self._longest)
        if stuck.any():
            self._given_up |= stuck
            then = (
                "the evaluation ends with the episodes it has"
                if self._given_up.all()
                else "their share is taken from the other envs' later episodes"
            )
            log.warning(
                "evaluation: env(s) %s have not ended an episode in %d steps: %s",
                np.flatnonzero(stuck).tolist(),
                self._running[stuck].min(),
                then,
            )

    @property
    def filled(self) -> int:
        """Episodes counted from other envs for the given-up ones."""
        return min(self._missing, len(self._extra_returns))

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(returns, lengths) of the counted episodes, in the order they ended."""
        missing = self._missing
        return (
            np.asarray(self.returns + self._extra_returns[:missing], float),
            np.asarray(self.lengths + self._extra_lengths[:missing], float),
        )


def run_episodes(
    env: BatchedEnv,
    policy: Callable,
    params,
    device: jax.Device,
    episodes: int,
    control: Control,
    fused: FusedEpisodes | None = None,
    time_limit: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Step `env` with the greedy policy until `episodes` episodes are counted
    (`EpisodeTally`: each env its own share, from its reset).

    Every env call (the reset too) is watched by the heartbeat and preceded by a stop check,
    so a stop is seen within one env call however long the evaluation is. With `fused`
    (built on `env`) the steps run CHUNK_STEPS per compiled call; the envs are reset at the
    start of every evaluation, so the steps a last call runs past the episodes are harmless.
    """
    steps = 0
    obs = control.call("evaluation env.reset", steps, env.reset)
    tally = EpisodeTally(episodes, env.num_envs, time_limit)
    recurrent = isinstance(policy, RecurrentGreedy)
    if recurrent:  # fresh envs, fresh memory
        core = jax.device_put(policy.initial_state(env.num_envs), device)
        valid = np.ones(env.num_envs, bool)
    if fused is not None:
        fused.begin(obs)
    while not tally.complete:
        if fused is not None:
            steps += CHUNK_STEPS
            tally.add(
                *control.call("evaluation env.step", steps, fused.chunk, params, steps=CHUNK_STEPS)
            )
        else:
            if recurrent:
                action, core = policy.step(params, *jax.device_put((obs, valid), device), core)
                action = jax.device_get(action)
            else:
                action = jax.device_get(policy(params, jax.device_put(obs, device)))
            steps += 1
            step = control.call("evaluation env.step", steps, env.step, action)
            tally.add(step.episode_done, step.episode_return, step.episode_length)
            obs = step.obs
            if recurrent:  # the next step is an autoreset where this one ended an episode
                valid = ~(step.terminated | step.truncated)
    return tally.result()


class Evaluator:
    def __init__(
        self,
        env: BatchedEnv,
        device: jax.Device,
        policy: Callable,
        subscriber: Subscriber,
        episodes: int,
        metrics: Metrics,
        control: Control,
    ):
        self.control = control
        self.lifetime = lifetime = control.lifetime
        self.env = env
        self.device = device
        self.policy = policy
        self.subscriber = subscriber
        self.episodes = episodes
        self.time_limit: int | None = None
        """The env's declared max_episode_steps, if any: no eval env is given up before it."""
        self.metrics = metrics
        self.requests: BoundedQueue[_Request] = BoundedQueue(1, lifetime)
        metrics.count("eval/dropped_requests", 0)  # a total: in every metrics line, from 0
        self.results: list[EvalResult] = []
        self.fused = fused_episodes_for(env, policy, device)
        """The greedy steps as XLA calls where the env allows it (`podrace.fused_rollout`)."""

    def warm_up(self, params) -> None:
        """Compile what the evaluator runs, on its device, without stepping its env;
        `params` as published (`Learner.acting_params()`)."""
        params = place(params, self.device)
        obs = np.zeros((self.env.num_envs,) + self.env.spec.obs_shape, self.env.spec.obs_dtype)
        if self.fused is not None:
            self.fused.compile(params, obs)
        elif isinstance(self.policy, RecurrentGreedy):
            valid = np.ones(self.env.num_envs, bool)
            core = self.policy.initial_state(self.env.num_envs)
            placed = jax.device_put((obs, valid, core), self.device)
            jax.block_until_ready(self.policy.step(params, *placed))
        else:
            jax.block_until_ready(self.policy(params, jax.device_put(obs, self.device)))

    def request(self, version: int) -> None:
        """Ask for an evaluation of `version` without waiting; dropped if busy."""
        if not self.requests.try_put(_Request(version)):
            self.metrics.count("eval/dropped_requests")

    def evaluate_final(self, version: int) -> EvalResult:
        """Evaluate `version` and wait for the result (or for the run to stop)."""
        request = _Request(version, done=threading.Event())
        self.requests.put(request)
        self.lifetime.on_stop(request.done.set)
        request.done.wait()
        self.lifetime.check()
        return request.result[0]

    def run(self) -> None:
        while True:
            request, _ = self.requests.get()
            snapshot = self.subscriber.get(min_version=request.version)
            start = time.perf_counter()
            if self.fused is not None and self.fused.env is not self.env:
                self.fused = None  # env swapped since (a wrapper): step by step through it
            returns, lengths = run_episodes(
                self.env,
                self.policy,
                snapshot.params,
                self.device,
                self.episodes,
                self.control,
                self.fused,
                self.time_limit,
            )
            result = EvalResult(
                version=snapshot.version,
                mean_return=float(returns.mean())
                if len(returns)
                else float("nan"),  # no episode ended
                returns=returns,
                lengths=lengths,
                seconds=time.perf_counter() - start,
            )
            self.results.append(result)
            self.metrics.set("eval/return", result.mean_return)
            self.metrics.set("eval/version", result.version)
            if request.done is not None:
                request.result.append(result)
                request.done.set()
