"""What an inference server serves next (see `podrace.inference.server`): its settings, the
batch sizes its policy call is compiled for, and the choice of the requests one call
serves: the lag bound (a request waits for params recent enough, for at most
`params_timeout_s`), the batching wait (`max_wait_s` for more requests while workers still
step) and the deterministic mode (every servable request, in part order, once none steps).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from podrace.control import ExplainedError
from podrace.inference.rollouts import BUSY, READY, Part
from podrace.sync.base import Snapshot


@dataclass(frozen=True)
class ServerSettings:
    """What an inference server serves and when (`--inference.*`), and how often it restarts
    an env worker (`--env.worker-restarts`)."""

    rollout_length: int
    max_policy_lag: int
    max_batch: int = 0
    """Most envs (rows) per policy call; 0: every part the server serves."""
    max_wait_s: float = 0.0
    """Once a request is ready, how long to wait for more while workers still step."""
    fixed_order: bool = False
    """Deterministic batches: every servable request, in part order, once none steps."""
    params_timeout_s: float | None = None
    """Fail when a request waited this long for params the lag bound allows (None: wait)."""
    worker_restarts: int = 3
    """Restarts allowed per env worker; one more death fails the run, naming it."""


class ParamsTimeout(ExplainedError, TimeoutError):
    """A request waited longer than `params_timeout_s` for params within the lag bound."""


def request_buckets(parts: int, most: int, fixed: bool) -> list[int]:
    """Batch sizes (in requests) the policy call is compiled for: a batch is padded to the
    next one. Fixed order: always every part; else powers of two up to `most`, and `most`."""
    if fixed:
        return [parts]
    sizes = {most}
    size = 1
    while size < most:
        sizes.add(size)
        size *= 2
    return sorted(sizes)


def choose_batch(
    parts: Sequence[Part],
    current: Snapshot | None,
    s: ServerSettings,
    most_requests: int,
    server: str,
    now: float,
) -> tuple[list[tuple[Part, bool]], float | None]:
    """The requests of `parts` that inference server `server`, acting with `current`, serves
    now, each with whether it gets an action (else only the value of a rollout's last
    observation), or none and how long to wait at most. ParamsTimeout once a request has
    waited `s.params_timeout_s` for params within the lag bound."""
    busy = any(p.state == BUSY for p in parts)
    eligible: list[tuple[Part, bool]] = []
    deadline = None
    for part in parts:
        if part.state != READY:
            continue
        actor = part.actor
        act = current is not None and actor.may_open(part.seq)
        if act and current.version < part.seq - s.max_policy_lag:
            act = False
            if part.blocked_since is None:
                part.blocked_since = now
            if s.params_timeout_s is not None:
                waited = now - part.blocked_since
                if waited > s.params_timeout_s:
                    raise ParamsTimeout(
                        f"inference server {server}: actor {actor.actor_id}'s rollout "
                        f"{part.seq} waited {waited:.1f}s for params version >= "
                        f"{part.seq - s.max_policy_lag} (newest {current.version}, lag bound "
                        f"{s.max_policy_lag}; inference.params_timeout_s "
                        f"{s.params_timeout_s:g})"
                    )
                end = part.blocked_since + s.params_timeout_s
                deadline = end if deadline is None else min(deadline, end)
        if act or (current is not None and part.last_for is not None):
            eligible.append((part, act))
    wait = None if deadline is None else max(0.0, deadline - now) + 0.001
    if not eligible or (s.fixed_order and busy):
        return [], wait
    if s.fixed_order:
        return eligible, None
    if len(eligible) > most_requests:  # the longest waiting first, in part order
        oldest = sorted(eligible, key=lambda e: e[0].since)[:most_requests]
        keep = {id(p) for p, _ in oldest}
        return [e for e in eligible if id(e[0]) in keep], None
    if s.max_wait_s <= 0 or not busy or len(eligible) == most_requests:
        return eligible, None
    first = min(p.since for p, _ in eligible)
    if now >= first + s.max_wait_s:
        return eligible, None
    until = first + s.max_wait_s - now
    return [], until if wait is None else min(until, wait)


__all__ = ["ParamsTimeout", "ServerSettings", "choose_batch", "request_buckets"]
