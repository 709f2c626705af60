"""Shared-memory layout of the `shm` transport and its seqlock, without any I/O policy.

Two POSIX shared-memory segments per channel:

* control (`<name>`, fixed size, created with the publisher): int64 words — a magic, the
  closed flag, LATEST = (version << 8) | slot (one word, so version and slot change together),
  the data geometry, and per slot a sequence counter and the version it holds.
* data (`<name>_d`, created at the first publish, when the params' size is known): the
  pickled layout (TreeSpec and leaf offsets) followed by `nslots` equal slots.

The single writer fills slots round robin, so the slot it writes is never the one LATEST
points at. Around the copy it makes the slot's counter odd, then even again (a seqlock).
A reader copies a slot out and keeps the copy only if the counter was even and unchanged
across the copy and the slot still holds the version LATEST named; otherwise it retries.
So a reader never sees a half-written snapshot, and the writer never waits for readers.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from podrace.sync.base import ChannelClosed, SyncError
from podrace.sync.doorbell import MAX_SOCKET_ADDRESS, socket_address
from podrace.sync.spec import TreeSpec, unreadable_tree

MAGIC = 0x706F64726163  # "podrac"
CTL_BYTES = 4096
MAX_SLOTS = 200
ALIGN = 64
PAGE = 4096

# control words
W_MAGIC, W_CLOSED, W_LATEST, W_NSLOTS, W_DATA_BYTES, W_SLOT_BYTES, W_SPEC_LEN, W_SLOT0 = range(8)
W_WRITER_PID = 8
W_REASON_LEN = 9  # bytes of UTF-8 at REASON_AT: why the channel failed
W_SEQ0 = 16  # slot i: sequence at W_SEQ0 + 2 i, version at W_SEQ0 + 2 i + 1
REASON_AT, REASON_MAX = 3584, 512  # after the last slot's words (W_SEQ0 + 2 MAX_SLOTS)

CLOSED_OPEN, CLOSED_CLOSED, CLOSED_FAILED = 0, 1, 2

_fence_lock = threading.Lock()


def check_channel_name(name: str) -> None:
    """SyncError unless `name` can name the channel's segments and doorbell socket: a plain
    name (no "/" or NUL, not "." or "..") whose socket address fits a Unix socket's 108 bytes."""
    if not isinstance(name, str):
        raise SyncError(f"shm channel name must be a str, got {type(name).__name__}")
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise SyncError(
            f"shm channel name {name!r} must be a non-empty name without '/' or NUL, not . or .."
        )
    spare = MAX_SOCKET_ADDRESS - len(socket_address(name).encode())
    if spare < 0:
        raise SyncError(
            f"shm channel name {name!r} is {len(name.encode())} bytes, at most "
            f"{len(name.encode()) + spare} fit the channel's socket address"
        )


def fence() -> None:
    """A full memory barrier: a lock release then acquire (an atomic RMW on one word).

    CPython gives no barrier primitive; without one, stores into the slot could become
    visible after the counter that declares them complete on weakly ordered CPUs.
    """
    _fence_lock.acquire()
    _fence_lock.release()


def _align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


@dataclass(frozen=True)
class Layout:
    """Where each leaf of a snapshot lives inside a slot."""

    spec: TreeSpec
    offsets: tuple[int, ...]
    used_bytes: int

    @classmethod
    def for_spec(cls, spec: TreeSpec) -> Layout:
        offsets, pos = [], 0
        for shape, dtype in zip(spec.shapes, spec.dtypes):
            offsets.append(pos)
            pos = _align(pos + int(np.prod(shape)) * dtype.itemsize, ALIGN)
        return cls(spec, tuple(offsets), max(pos, ALIGN))

    def views(self, slot: np.ndarray) -> list[np.ndarray]:
        """Leaf arrays viewing `slot` (uint8 bytes laid out by this layout)."""
        out = []
        for off, shape, dtype in zip(self.offsets, self.spec.shapes, self.spec.dtypes):
            n = int(np.prod(shape)) * dtype.itemsize
            out.append(slot[off : off + n].view(dtype).reshape(shape))
        return out


def pack_latest(version: int, slot: int) -> int:
    return (version << 8) | slot


def unpack_latest(word: int) -> tuple[int, int]:
    return word >> 8, word & 0xFF


class ControlBlock:
    """Typed access to the control words of a mapped control segment."""

    def __init__(self, buf: Any) -> None:
        self.words = np.frombuffer(buf, dtype=np.int64, count=CTL_BYTES // 8)

    def __getitem__(self, i: int) -> int:
        return int(self.words[i])

    def __setitem__(self, i: int, value: int) -> None:
        self.words[i] = value

    def latest_version(self) -> int | None:
        word = self[W_LATEST]
        return None if word < 0 else unpack_latest(word)[0]

    def release(self) -> None:
        self.words = None  # type: ignore[assignment]  # drops the exported buffer


class SlotWriter:
    """The single writer: owns both segments, writes versions into slots round robin."""

    def __init__(self, name: str, nslots: int) -> None:
        if not 2 <= nslots <= MAX_SLOTS:
            raise ValueError(f"shm needs 2..{MAX_SLOTS} slots, got {nslots}")
        self.name = name
        self.nslots = nslots
        self._ctl_shm = _create_segment(name, CTL_BYTES)
        self.ctl = ControlBlock(self._ctl_shm.buf)
        self.ctl.words[:] = 0
        self.ctl[W_LATEST] = -1
        self.ctl[W_NSLOTS] = nslots
        self.ctl[W_WRITER_PID] = os.getpid()
        fence()
        self.ctl[W_MAGIC] = MAGIC
        self._data_shm: shared_memory.SharedMemory | None = None
        self._slots: list[np.ndarray] = []
        self.layout: Layout | None = None
        self._next = 0

    def _create_data(self, layout: Layout) -> None:
        spec_bytes = pickle.dumps((layout.spec, layout.offsets, layout.used_bytes))
        slot0 = _align(len(spec_bytes), PAGE)
        slot_bytes = _align(layout.used_bytes, PAGE)
        size = slot0 + self.nslots * slot_bytes
        self._data_shm = _create_segment(self.name + "_d", size)
        data = np.frombuffer(self._data_shm.buf, dtype=np.uint8, count=size)
        data[: len(spec_bytes)] = np.frombuffer(spec_bytes, dtype=np.uint8)
        self._slots = [
            data[slot0 + i * slot_bytes : slot0 + (i + 1) * slot_bytes] for i in range(self.nslots)
        ]
        self.layout = layout
        self.ctl[W_SPEC_LEN] = len(spec_bytes)
        self.ctl[W_SLOT0] = slot0
        self.ctl[W_SLOT_BYTES] = slot_bytes
        fence()
        self.ctl[W_DATA_BYTES] = size  # readers map the data segment once this is set

    def write(self, version: int, leaves: Sequence[np.ndarray], spec: TreeSpec) -> None:
        """Copy `leaves` (matching `spec`) into the next slot and make it LATEST."""
        if self.layout is None:
            self._create_data(Layout.for_spec(spec))
        else:
            self.layout.spec.check_spec(spec, f"published version {version}")
        assert self.layout is not None
        slot = self._next
        self._next = (slot + 1) % self.nslots
        seq_w, ver_w = W_SEQ0 + 2 * slot, W_SEQ0 + 2 * slot + 1
        self.ctl[seq_w] = self.ctl[seq_w] + 1  # odd: slot being written
        fence()
        self.ctl[ver_w] = version
        for dst, leaf in zip(self.layout.views(self._slots[slot]), leaves):
            np.copyto(dst, leaf, casting="no")
        fence()
        self.ctl[seq_w] = self.ctl[seq_w] + 1  # even: slot complete
        fence()
        self.ctl[W_LATEST] = pack_latest(version, slot)

    def mark_closed(self, state: int, reason: str = "") -> None:
        """Set the closed flag, with the reason readers report (written first)."""
        data = reason.encode("utf-8")[:REASON_MAX]
        raw = self.ctl.words.view(np.uint8)
        raw[REASON_AT : REASON_AT + len(data)] = np.frombuffer(data, dtype=np.uint8)
        self.ctl[W_REASON_LEN] = len(data)
        fence()
        self.ctl[W_CLOSED] = state
        fence()

    def close(self, state: int = CLOSED_CLOSED, reason: str = "") -> None:
        """Mark the channel closed and unlink both segments (readers keep their mappings)."""
        if self.ctl.words is None:
            return
        self.mark_closed(state, reason)
        self._slots = []
        _unmap(self.ctl, [self._data_shm, self._ctl_shm])
        for shm in (self._data_shm, self._ctl_shm):
            if shm is not None:
                with contextlib.suppress(FileNotFoundError):  # already unlinked: the goal holds
                    shm.unlink()


def _create_segment(name: str, size: int) -> shared_memory.SharedMemory:
    """A new segment whose memory is reserved now, or a SyncError saying what is missing.

    Creating a segment only sets its size: with /dev/shm too small (Docker's default is
    64 MB) the first write into a page that tmpfs cannot supply kills the whole learner
    process with SIGBUS. Reserving the pages up front (posix_fallocate) turns that into
    ENOSPC here, which the channel reports.
    """
    try:
        shm = shared_memory.SharedMemory(name=name, create=True, size=size)
    except FileExistsError:
        raise SyncError(
            f"shared-memory segment {name!r} exists already: another publisher uses that channel "
            "name, or one died without removing it (choose another name, or delete "
            f"/dev/shm/{name.lstrip('/')})"
        ) from None
    fd = getattr(shm, "_fd", -1)
    if fd < 0 or not hasattr(os, "posix_fallocate"):
        return shm  # not Linux: no tmpfs to run out of in this way
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        shm.close()
        shm.unlink()
        try:
            st = os.statvfs("/dev/shm")
            free = f"{st.f_bavail * st.f_frsize / 2**20:.0f} MiB free"
        except OSError:
            free = "free space unknown"
        raise SyncError(
            f"shared memory segment {name!r} needs {size / 2**20:.1f} MiB and /dev/shm cannot "
            f"supply it ({free}; {exc.strerror}): enlarge /dev/shm (e.g. docker run "
            "--shm-size), publish fewer bytes (transform=select/cast) or keep fewer versions"
        ) from exc
    return shm


def _map_readonly(name: str) -> mmap.mmap:
    """Map an existing segment read-only, outside the resource tracker (readers never unlink)."""
    import _posixshmem

    fd = _posixshmem.shm_open("/" + name, os.O_RDONLY, mode=0o600)
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)


class SlotReader:
    """A reader of one channel: maps the segments read-only and copies slots out safely."""

    def __init__(self, name: str) -> None:
        self.name = name
        try:
            self._ctl_map = _map_readonly(name)
        except FileNotFoundError:
            raise ChannelClosed(f"shm channel {name!r} does not exist (publisher gone?)") from None
        self.ctl = ControlBlock(self._ctl_map)
        if self.ctl[W_MAGIC] != MAGIC:
            raise ChannelClosed(f"shm segment {name!r} is not an initialized podrace channel")
        self._data_map: mmap.mmap | None = None
        self._slots: list[np.ndarray] = []
        self.layout: Layout | None = None
        self.retries = 0

    def closed_state(self) -> int:
        return self.ctl[W_CLOSED]

    def closed_reason(self) -> str:
        fence()
        n = min(max(self.ctl[W_REASON_LEN], 0), REASON_MAX)
        return (
            self.ctl.words.view(np.uint8)[REASON_AT : REASON_AT + n]
            .tobytes()
            .decode("utf-8", "replace")
        )

    def _ensure_data(self) -> bool:
        if self.layout is not None:
            return True
        size = self.ctl[W_DATA_BYTES]
        if size == 0:
            return False
        fence()
        self._data_map = _map_readonly(self.name + "_d")
        data = np.frombuffer(self._data_map, dtype=np.uint8, count=size)
        try:
            spec, offsets, used = pickle.loads(data[: self.ctl[W_SPEC_LEN]].tobytes())
        except (AttributeError, ImportError, pickle.UnpicklingError) as exc:
            raise unreadable_tree(f"shm channel {self.name!r}", exc) from exc
        slot0, slot_bytes = self.ctl[W_SLOT0], self.ctl[W_SLOT_BYTES]
        nslots = self.ctl[W_NSLOTS]
        self._slots = [
            data[slot0 + i * slot_bytes : slot0 + (i + 1) * slot_bytes] for i in range(nslots)
        ]
        self.layout = Layout(spec, tuple(offsets), used)
        return True

    def read(self, consume: Callable[[np.ndarray], Any], attempts: int) -> tuple[int, Any] | None:
        """Run `consume(slot bytes)` on the latest slot until it did so without a concurrent
        write; return (version, its result), or None if nothing is published yet or every
        one of `attempts` tries raced with the writer.

        `consume` must copy what it keeps: the slot aliases memory the writer will reuse.
        """
        if not self._ensure_data():
            return None
        assert self.layout is not None
        for _ in range(attempts):
            word = self.ctl[W_LATEST]
            if word < 0:
                return None
            version, slot = unpack_latest(word)
            seq_w = W_SEQ0 + 2 * slot
            seq = self.ctl[seq_w]
            fence()
            if seq & 1 or self.ctl[seq_w + 1] != version:
                self.retries += 1
                continue  # the writer has moved on to this slot again: reread LATEST
            result = consume(self._slots[slot])
            fence()
            if self.ctl[seq_w] == seq:
                return version, result
            self.retries += 1
        return None

    def close(self) -> None:
        self._slots = []
        _unmap(self.ctl, [self._data_map, self._ctl_map])


def _unmap(ctl: ControlBlock, mappings: list[Any]) -> None:
    """Drop the control block's views, then close each mapping (None: never made); one whose
    memory a view still exports is unmapped by the GC once the view goes."""
    ctl.release()
    for mapping in mappings:
        if mapping is not None:
            with contextlib.suppress(BufferError):
                mapping.close()
