"""The inference server: batches observations from many env workers into one policy call.

One server thread runs on one actor device and serves the env worker parts of one or more
actors (`podrace.inference.rollouts`). Its loop:

1. wait until a worker has finished its step (its reply pipe is readable: `poll` over all
   of them and a wake-up pipe), read the results from the worker's shared memory into the
   rollout being assembled; the part's next observation is now a request;
2. choose the batch (`podrace.inference.batching`): the requests that may be served
   (below), at most `max_batch` envs; once one is ready it waits at most `max_wait_s` for
   more while workers are still stepping. In the deterministic mode (`fixed_order`) a
   batch is every servable request, in the fixed order of the parts, taken once no worker
   is stepping: the same batches in every run;
3. one jitted policy call for the batch (`podrace.inference.policy`): actions, log-probs
   and values; each request's actions are written into its worker's shared memory and the
   worker told to step; the rollout gets each step's observation, action, log-prob, value
   and the version of the params that chose it.

Params come by push (`Publisher.add_push_target(server.push)`): the push thread places
each new version on the server's device and hands it over; the server acts with the newest
it has, so the steps of one rollout may span versions (each step's is recorded; the
rollout's `policy_version` is the oldest). The lag bound holds per rollout: a request of
rollout `seq` is served only with a version >= seq - max_policy_lag; until one arrives it
waits, while the server goes on serving the others (with `params_timeout_s` it fails the
run instead after that long). A part's observation that is also the last one of a rollout
gets its value from whatever version the server has (the learner needs that rollout
before it can publish the version the next rollout may need).

A worker that dies (its reply pipe ends) is restarted with fresh, derived seeds, up to
`worker_restarts` times each; its actor's rollouts not yet complete are discarded (never
consumed) and every part of that actor starts them again from its current observation.
An env that raises fails the run with one line naming the worker; a worker whose step
takes longer than the watchdog allows does too (each part's step is a heartbeat).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np

from podrace.control import Control
from podrace.envs.worker_protocol import RESET, STEP, wait_readable
from podrace.envs.workers import EnvWorkerDied
from podrace.inference.batching import ServerSettings, choose_batch, request_buckets
from podrace.inference.rollouts import BUSY, DONE, Part, ServedActor
from podrace.sync.base import Snapshot
from podrace.sync.placement import place
from podrace.wording import times

log = logging.getLogger(__name__)


class InferenceServer:
    """See the module docstring. `run()` is the server's thread; `push` the params' target."""

    def __init__(
        self,
        name: str,
        settings: ServerSettings,
        actors: Sequence[ServedActor],
        serve_fn: Callable,
        key_chain: Callable,
        device: jax.Device | None,
        control: Control,
    ) -> None:
        self.name = name
        self.settings = settings
        self.actors = list(actors)
        self.parts: list[Part] = [p for a in self.actors for p in a.parts]
        sizes = {p.size for p in self.parts}
        if len(sizes) != 1:
            raise ValueError(f"every part must have as many envs; got sizes {sorted(sizes)}")
        self.part_size = sizes.pop()
        most = len(self.parts)
        if settings.max_batch and not settings.fixed_order:
            most = max(1, min(most, settings.max_batch // self.part_size))
        self.most_requests = most
        self.buckets = request_buckets(len(self.parts), most, settings.fixed_order)
        self.serve_fn, self.key_chain, self.device, self.control = (
            serve_fn,
            key_chain,
            device,
            control,
        )
        spec = self.actors[0].spec
        self._obs = {
            n: np.zeros((n * self.part_size, *spec.obs_shape), spec.obs_dtype) for n in self.buckets
        }
        self._requests = {n: np.zeros((n, 5), np.uint32) for n in self.buckets}
        self._lock = threading.Lock()
        self._incoming: Snapshot | None = None
        self.current: Snapshot | None = None
        """The params the server acts with: the newest pushed, on its device."""
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.restarts = 0
        self.on_restart: Callable[[], None] = lambda: None
        """Called after each restart of one of its workers (the run counts them)."""
        self.batches = 0
        for actor in self.actors:
            actor.key_chain = key_chain
            actor.on_delivered = self.wake
        control.lifetime.on_stop(self.wake)

    # Params --------------------------------------------------------------------------------
    def push(self, snapshot: Snapshot) -> None:
        """Push target: place `snapshot` on the server's device (on the push thread) and
        hand it to the server, which acts with it from its next batch."""
        params = jax.block_until_ready(place(snapshot.params, self.device))
        with self._lock:
            if self._incoming is None or snapshot.version > self._incoming.version:
                self._incoming = Snapshot(snapshot.version, params)
        self.wake()

    def _take_params(self) -> None:
        with self._lock:
            incoming, self._incoming = self._incoming, None
        if incoming is not None and (
            self.current is None or incoming.version > self.current.version
        ):
            self.current = incoming

    def wake(self) -> None:
        """Make the server's wait return (new params, a rollout delivered, a stop)."""
        try:
            os.write(self._wake_w, b"w")
        except (BlockingIOError, OSError):
            pass  # a full pipe wakes it already; a closed one: the server is gone

    # Compiling -----------------------------------------------------------------------------
    def warm_up(self, params) -> None:
        """Compile the policy call for every batch size and the key chain, on the server's
        device, with `params` as published (results discarded)."""
        params = place(params, self.device)
        for n in self.buckets:
            jax.block_until_ready(self.serve_fn(params, self._obs[n], self._requests[n]))
        jax.block_until_ready(self.key_chain(self.actors[0]._chain))

    # The loop ------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            # The server's job is host observations in, host actions out: its policy call
            # takes the host arrays as they are and places them beside the params. On CPU
            # a device_put before the call cost as much again as the call itself.
            with jax.transfer_guard_host_to_device("allow"):
                self._run()
        except Exception:
            # Once the run stops, workers are closed under the server: what that makes
            # fail (a worker gone mid-step) is the stop, not an error of the run.
            self.control.check()
            raise

    def _run(self) -> None:
        for part in self.parts:
            part.worker.send(RESET)
            part.state = BUSY
            part.heartbeat.enter("env.reset", 0)
        timeout: float | None = 0.0
        while True:
            self._collect(timeout)
            self.control.check()
            self._take_params()
            if all(p.state == DONE for p in self.parts):
                return
            now = time.monotonic()
            batch, timeout = choose_batch(
                self.parts, self.current, self.settings, self.most_requests, self.name, now
            )
            if batch:
                self._serve(batch, now)
                timeout = 0.0

    def _collect(self, timeout: float | None) -> None:
        """Wait up to `timeout` s for a worker's reply or a wake-up; take every reply there is."""
        busy = {p.worker.fileno(): p for p in self.parts if p.state == BUSY}
        for fd in wait_readable([*busy, self._wake_r], timeout):
            if fd == self._wake_r:
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass  # drained: the wake-up pipe is non-blocking
            else:
                self._reply(busy[fd])

    def _reply(self, part: Part) -> None:
        try:
            command = part.worker.read_reply()
        except EnvWorkerDied as died:
            part.heartbeat.exit()
            self._restart(part, str(died))
            return
        if part.worker.pending:  # a restarted worker has built its envs; its reset follows
            return
        part.heartbeat.exit()
        now = time.monotonic()
        if command == RESET:
            part.prev_done = np.zeros(part.size, bool)
            part.rewind = False
            part.ready_at(part.seq, 0, None, now)
            return
        actor, step = part.actor, part.worker.buffers.step
        part.steps += 1
        part.prev_done = step.terminated | step.truncated
        if part.rewind:
            part.rewind = False
            part.ready_at(actor.completed, 0, None, now)
            return
        actor.builders[part.seq].result(part.t, part.rows, step)
        if part.t + 1 == self.settings.rollout_length:
            part.ready_at(part.seq + 1, 0, part.seq, now)
        else:
            part.ready_at(part.seq, part.t + 1, None, now)

    def _restart(self, part: Part, death: str) -> None:
        """`part`'s worker died: restart it (fresh seeds) and start its actor's open
        rollouts again; past the allowed restarts the run fails naming the worker."""
        self.control.check()  # no restart once the run stops (it closes the workers)
        allowed = self.settings.worker_restarts
        if part.worker.restarts >= allowed:
            why = (
                f"restarted {times(part.worker.restarts)} already, the limit for each worker"
                if allowed
                else "restarts are off"
            )
            raise EnvWorkerDied(f"{death}; {why} (env.worker_restarts {allowed})")
        log.warning(
            "%s; restarting it with fresh seeds, restart %d of %d (--env.worker-restarts, "
            "per worker)",
            death,
            part.worker.restarts + 1,
            allowed,
        )
        actor, now = part.actor, time.monotonic()
        resume = actor.discard_open()
        for other in actor.parts:
            if other is part:
                continue
            if other.state == BUSY:
                other.rewind = True  # a step in progress: its results belong to no rollout
                other.seq, other.t, other.last_for = resume, 0, None
            else:  # its worker holds its current observation: the resumed rollout's first
                other.ready_at(resume, 0, None, now)
        part.worker.restart()
        part.worker.send(RESET)
        part.state, part.rewind = BUSY, False
        part.seq, part.t, part.last_for = resume, 0, None
        part.heartbeat.enter("env worker restart", part.steps)
        self.restarts += 1
        self.on_restart()

    def _serve(self, batch: list[tuple[Part, bool]], now: float) -> None:
        size, current = self.part_size, self.current
        n = len(batch)
        bucket = next(b for b in self.buckets if b >= n)
        obs, requests = self._obs[bucket], self._requests[bucket]
        waited = params_waited = 0.0
        for r, (part, act) in enumerate(batch):
            obs[r * size : (r + 1) * size] = part.worker.buffers.step.obs
            if act:
                requests[r, :4] = part.actor.sample_keys(part.seq)[part.t]
                if part.blocked_since is not None:
                    params_waited = max(params_waited, now - part.blocked_since)
            requests[r, 4] = part.rows.start
            waited += now - part.since
        start = time.perf_counter()
        actions, logprobs, values = (
            np.asarray(x) for x in self.serve_fn(current.params, obs, requests)
        )
        inference = time.perf_counter() - start
        version = current.version
        for r, (part, act) in enumerate(batch):
            rows, actor = slice(r * size, (r + 1) * size), part.actor
            if part.last_for is not None:
                builder = actor.builders[part.last_for]
                if builder.finish(part.rows, obs[rows], values[rows]):
                    actor.complete(part.last_for)
                part.last_for = None
            if act:
                actor.builder(part.seq).act(
                    part.t,
                    part.rows,
                    obs[rows],
                    actions[rows],
                    logprobs[rows],
                    values[rows],
                    version,
                    ~part.prev_done,
                )
                part.worker.buffers.actions[...] = actions[rows]
                part.worker.send(STEP)
                part.state = BUSY
                part.blocked_since = None
                part.heartbeat.enter("env.step", part.steps)
            elif part.seq >= actor.end:
                part.state = DONE
        self.batches += 1
        self.control.record(
            {
                "server/batch_envs": n * size,
                "server/batch_requests": n,
                "server/queue_wait": waited / n,
                "server/params_wait": params_waited,
                "server/inference": inference,
            }
        )

    def close(self) -> None:
        """Release the wake-up pipe (after the server's thread has returned)."""
        # -1 first: a late wake() then fails on fd -1 instead of writing into a reused fd.
        fds = (self._wake_r, self._wake_w)
        self._wake_r = self._wake_w = -1
        for fd in fds:
            if fd >= 0:  # a second close() closes nothing
                os.close(fd)


__all__ = ["InferenceServer"]
