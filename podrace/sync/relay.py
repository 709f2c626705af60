"""Relay: one subscriber that republishes into another publisher.

Put one on each node (or process) and let its N local workers subscribe to the relay's
publisher: the expensive hop (Ray object transfer, shared-memory copy) happens once per
version for all of them, and a LocalPublisher downstream adds one placement per device.
Versions keep their upstream numbers, so policy-lag accounting is unchanged.
"""

from __future__ import annotations

import threading
import time

from podrace.sync.base import ChannelClosed, Publisher, PublisherGone, Subscriber
from podrace.sync.stats import RunningStat

_ANY_VERSION = -(2**62)


class Relay:
    """Copies every new snapshot of `source` into `target` on a thread of its own.

    Coalesces like any subscriber (a slow target skips to the newest version). When the
    source closes, the relay closes the target (if `close_target`), so downstream
    readers never wait on a dead upstream. A failure, the upstream's death included, is
    kept in `error`, re-raised by `join()`, and closes the target with that error, so
    downstream readers raise PublisherGone saying why.
    """

    def __init__(
        self,
        source: Subscriber,
        target: Publisher,
        *,
        name: str = "relay",
        close_target: bool = True,
    ):
        self.source = source
        self.target = target
        self.name = name
        self._close_target = close_target
        self.error: BaseException | None = None
        self.relayed = 0
        self.last_version: int | None = None
        self._hop_time = RunningStat()
        self._thread = threading.Thread(target=self._run, name=f"podrace-relay-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        want = _ANY_VERSION
        try:
            while True:
                snapshot = self.source.get(want)
                start = time.perf_counter()
                self.target.publish(snapshot.params, version=snapshot.version)
                self._hop_time.add(time.perf_counter() - start)
                self.relayed += 1
                self.last_version = snapshot.version
                want = snapshot.version + 1
        except PublisherGone as exc:  # the upstream died or failed: not a normal end
            self.error = exc
        except ChannelClosed:
            pass  # upstream closed, relay closed, or downstream closed: a normal end
        except BaseException as exc:  # noqa: BLE001 - kept and re-raised by join()
            self.error = exc
        finally:
            # the relay owns its source: once it stops (downstream closed, upstream gone),
            # the source would only linger, reported upstream with an ever-growing lag
            try:
                self.source.close()
            except Exception:  # noqa: BLE001 - best effort, the upstream may be gone
                pass
            if self.error is not None:
                self.target.close(
                    error=f"relay {self.name!r} stopped: {type(self.error).__name__}: {self.error}"
                )
            elif self._close_target:
                self.target.close()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def close(self, timeout: float = 10.0) -> None:
        """Stop relaying (the source subscriber is closed) and wait for the thread."""
        self.source.close()
        self._thread.join(timeout)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the relay to end; re-raise what stopped it, if it failed."""
        self._thread.join(timeout)
        if self.error is not None:
            raise self.error

    def metrics(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {
            f"relay/{self.name}/relayed": self.relayed,
            f"relay/{self.name}/last_version": -1
            if self.last_version is None
            else self.last_version,
            f"relay/{self.name}/failed": int(self.error is not None),
        }
        out.update(self._hop_time.report(f"relay/{self.name}/publish_seconds"))
        return out
