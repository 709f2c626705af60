"""The actors of the served path: env worker parts in, rollouts out.

With env workers (`--env.workers N`), actor `i` is no longer one thread stepping its envs:
its `env.num_envs` envs are stepped by N worker processes, one part each, and an inference
server (`podrace.inference.server`) chooses their actions. What remains of the actor is
here: which part is where (`Part`), the rollouts being assembled from the parts' steps
(`RolloutBuilder`), its sampling keys, and the loop that hands each finished rollout to
the actor's `RolloutSink` (`ServedActor.run`, the actor's thread), exactly as the actor loop
(`podrace.actor`) would hand it over.

A rollout's arrays are filled in as the server serves and the workers step: step t of part
p writes rows `p.rows` of row t. A rollout is complete when every part has delivered its
last observation (and the server its value). Parts of one actor need not be at the same
step: one part may already act in the next rollout while another finishes this one, so an
actor has at most two rollouts open, and at most two that are not yet in the sink (the
server holds a part back rather than open a third: back-pressure without blocking the
server).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import jax
import numpy as np

from podrace.actor import ActorSettings, RolloutSink, sampling_key
from podrace.control import Control, Heartbeat
from podrace.envs.worker_protocol import EnvLink
from podrace.pipeline import BoundedQueue
from podrace.types import EnvSpec, EnvStep, Rollout, Trajectory

BUSY, READY, DONE = "busy", "ready", "done"
"""A part's states: its worker is stepping (or starting, resetting); its observation waits
for an action; it has finished every rollout of the run."""


class RolloutBuilder:
    """One rollout of one actor, filled in part by part and step by step (host arrays)."""

    def __init__(self, seq: int, length: int, num_envs: int, spec: EnvSpec, parts: int) -> None:
        T, B = length, num_envs
        self.seq = seq
        self.obs = np.empty((T, B, *spec.obs_shape), spec.obs_dtype)
        self.actions = np.empty(
            (T, B, *spec.action_shape), np.int32 if spec.discrete else np.float32
        )
        self.logprobs = np.empty((T, B), np.float32)
        self.values = np.empty((T, B), np.float32)
        self.rewards = np.empty((T, B), np.float32)
        self.terminated = np.empty((T, B), bool)
        self.truncated = np.empty((T, B), bool)
        self.valid = np.empty((T, B), bool)
        self.versions = np.empty((T, B), np.int64)
        self.episode_done = np.zeros((T, B), bool)
        self.episode_return = np.zeros((T, B), np.float64)
        self.episode_length = np.zeros((T, B), np.int64)
        self.last_obs = np.empty((B, *spec.obs_shape), spec.obs_dtype)
        self.last_value = np.empty((B,), np.float32)
        self.parts_left = parts
        self.started = time.perf_counter()

    def act(self, t: int, rows: slice, obs, action, logprob, value, version: int, valid) -> None:
        """Step t of `rows`: what the server chose and from which observation."""
        self.obs[t, rows] = obs
        self.actions[t, rows] = action
        self.logprobs[t, rows] = logprob
        self.values[t, rows] = value
        self.versions[t, rows] = version
        self.valid[t, rows] = valid

    def result(self, t: int, rows: slice, step: EnvStep) -> None:
        """Step t of `rows`: what the env returned (read from the worker's buffers)."""
        self.rewards[t, rows] = step.reward
        self.terminated[t, rows] = step.terminated
        self.truncated[t, rows] = step.truncated
        self.episode_done[t, rows] = step.episode_done
        self.episode_return[t, rows] = step.episode_return
        self.episode_length[t, rows] = step.episode_length

    def finish(self, rows: slice, obs, value) -> bool:
        """`rows` are done: their last observation and its value; True once every part is."""
        self.last_obs[rows] = obs
        self.last_value[rows] = value
        self.parts_left -= 1
        return self.parts_left == 0

    def rollout(self, actor_id: int) -> Rollout:
        """The finished rollout, as the actor loop stamps it: the oldest version that chose
        any of its actions is its `policy_version` (what the lag bound is checked on), and
        each step's version is in `behaviour_versions`."""
        done = self.episode_done  # episodes in step order, then env order, as the actor loop
        return Rollout(
            actor_id=actor_id,
            seq=self.seq,
            policy_version=int(self.versions.min()),
            trajectory=Trajectory(
                self.obs,
                self.actions,
                self.logprobs,
                self.values,
                self.rewards,
                self.terminated,
                self.truncated,
                self.valid,
                self.last_obs,
                self.last_value,
            ),
            episode_returns=self.episode_return[done],
            episode_lengths=self.episode_length[done],
            timings={"rollout": time.perf_counter() - self.started},
            behaviour_versions=self.versions,
        )


class Part:
    """One env worker's part of one actor's envs, as the server sees it."""

    def __init__(self, actor: ServedActor, index: int, worker: EnvLink, beat: Heartbeat):
        self.actor = actor
        self.index = index
        self.worker = worker
        self.heartbeat = beat
        self.rows = slice(worker.part.start, worker.part.stop)
        self.size = len(worker.part)
        self.state = BUSY
        self.seq = actor.settings.first_seq
        """The rollout of the pending request (READY) or of the step in progress (BUSY)."""
        self.t = 0
        self.last_for: int | None = None
        """READY: this observation is also the last one of rollout `last_for`, which still
        needs its value."""
        self.prev_done = np.zeros(self.size, bool)
        self.since = 0.0
        """When it became READY (a request's queueing time starts there)."""
        self.blocked_since: float | None = None
        """When it started waiting for params (the lag bound); None when it is not."""
        self.rewind = False
        """BUSY: its actor discarded the rollout of this step (a worker died): drop its
        results, start again at the actor's `resume_seq`."""
        self.steps = 0
        """Env steps this part has taken (for messages)."""

    @property
    def name(self) -> str:
        return self.worker.name

    def ready_at(self, seq: int, t: int, last_for: int | None, now: float) -> None:
        self.seq, self.t, self.last_for = seq, t, last_for
        self.state = READY
        self.since = now
        self.blocked_since = None
        if seq >= self.actor.end and last_for is None:
            self.state = DONE


class ServedActor:
    """Actor `actor_id` of the served path: its parts, sampling keys and rollouts, and the
    loop (`run`, the actor's thread) that hands each finished rollout to `out`.

    Every method but `run` is called by the one server thread that serves this actor."""

    def __init__(
        self,
        settings: ActorSettings,
        spec: EnvSpec,
        num_envs: int,
        workers: list[EnvLink],
        out: RolloutSink,
        control: Control,
        heartbeat: Callable[[str], Heartbeat],
        device: jax.Device | None = None,
    ) -> None:
        self.settings = settings
        self.spec, self.num_envs = spec, num_envs
        self.out, self.control, self.device = out, control, device
        self.workers = workers
        self.parts = [Part(self, i, w, heartbeat(w.name)) for i, w in enumerate(workers)]
        self.end = settings.first_seq + settings.num_rollouts
        self.builders: dict[int, RolloutBuilder] = {}
        self._keys: dict[int, np.ndarray] = {}
        self._chain = jax.device_put(sampling_key(settings.key), device)
        self._chain_seq = settings.first_seq
        self.key_chain: Callable | None = None
        """jit(key data -> (next key data, sample keys [T, 4])), set by the server."""
        self._finished: BoundedQueue[Rollout] = BoundedQueue(
            max(1, settings.num_rollouts), control.lifetime
        )
        """Complete rollouts on their way to the actor's thread; it holds every rollout of
        the run, so the server never waits to add one."""
        self.delivered = settings.first_seq
        """Rollouts before this one are in the sink."""
        self.completed = settings.first_seq
        """Rollouts before this one are complete (in the sink or waiting to go)."""
        self.on_delivered: Callable[[], None] = lambda: None
        """Called after each rollout went into the sink (wakes the server)."""
        self.restarts = 0

    @property
    def actor_id(self) -> int:
        return self.settings.actor_id

    # Called by the server ----------------------------------------------------------------
    def sample_keys(self, seq: int) -> np.ndarray:
        """The sampling keys of rollout `seq`'s steps, [T, 4]: the actor loop's, step by step
        from the actor's key (computed rollout by rollout, in order)."""
        while self._chain_seq <= seq:
            self._chain, keys = self.key_chain(self._chain)
            self._keys[self._chain_seq] = np.asarray(jax.device_get(keys))
            self._chain_seq += 1
        return self._keys[seq]

    def may_open(self, seq: int) -> bool:
        """Whether a part may act in rollout `seq`: it is one of the run's, and at most two
        of this actor's rollouts are out of the sink."""
        return seq < self.end and seq < self.delivered + 2

    def builder(self, seq: int) -> RolloutBuilder:
        builder = self.builders.get(seq)
        if builder is None:
            builder = self.builders[seq] = RolloutBuilder(
                seq, self.settings.rollout_length, self.num_envs, self.spec, len(self.parts)
            )
        return builder

    def complete(self, seq: int) -> None:
        """Rollout `seq` is complete: it goes to the actor's thread, for the sink."""
        rollout = self.builders.pop(seq).rollout(self.actor_id)
        self._keys.pop(seq, None)
        self.completed = seq + 1
        if not self._finished.try_put(rollout):
            raise RuntimeError(f"actor {self.actor_id}: rollout {seq} is one more than the run's")

    def discard_open(self) -> int:
        """Drop the rollouts not complete yet (a part's worker died); returns the rollout the
        parts start again at. Their steps are never consumed; the keys are kept (a retried
        rollout samples with the same keys)."""
        self.builders.clear()
        self.restarts += 1
        return self.completed

    # The actor's thread ---------------------------------------------------------------------
    def run(self) -> None:
        """Hand each finished rollout to the sink, in order, until the run's last one."""
        while self.delivered < self.end:
            rollout, _ = self._finished.get()
            self.control.check()
            if self.device is not None:  # as the actor loop's: arrays on the actor's device
                rollout = _on_device(rollout, self.device)
            rollout.timings["queue_put_wait"] = self.out.put(rollout)
            self.control.record({f"actor/{k}": v for k, v in rollout.timings.items()})
            self.delivered = rollout.seq + 1
            self.on_delivered()


def _on_device(rollout: Rollout, device: jax.Device) -> Rollout:
    import dataclasses

    start = time.perf_counter()
    trajectory = jax.block_until_ready(jax.device_put(rollout.trajectory, device))
    rollout.timings["to_device"] = time.perf_counter() - start
    return dataclasses.replace(rollout, trajectory=trajectory)


__all__ = ["BUSY", "DONE", "READY", "Part", "RolloutBuilder", "ServedActor"]
