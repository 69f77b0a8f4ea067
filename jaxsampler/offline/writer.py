"""The offline log writer: durability settings, and failures that never leave a torn frame."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import gzip
import math
import os
import time
import zlib
from collections.abc import Callable
from typing import Any, Literal

from jaxsampler.episodes.codec import packb
from jaxsampler.offline.append import prepare_append, warn_if_repeated
from jaxsampler.offline.frames import (
    _END,
    _HEADERS,
    _RECORD,
    _RECORD_TYPES,
    _RESUME,
    VERSION,
    Record,
    _frame_head,
)

#: ``flush="manual"`` hands its buffered frames to the OS once they pass this many bytes.
BUFFER_LIMIT = 1 << 20
_IOV_MAX = 512  # frames per writev call (Linux allows 1024)


class LogWriteError(OSError):
    """Writing to an offline log failed; the log holds no part of what failed.

    ``errno`` is the cause's (``ENOSPC`` for a full disk, ``EFBIG`` past a file size
    limit, ``EIO``, ...; the cause is also ``__cause__``). Attributes: ``path``;
    ``offset``, the byte where the failed frames would have started (the file's end after
    the cut; compressed bytes for ``.gz``); ``records``, how many records the failed call
    did not store (the one given to :meth:`OfflineWriter.write`, or every record buffered
    under ``flush="manual"``); ``failed``, whether the writer now refuses every write
    (:class:`WriterFailedError`) instead of carrying on."""

    def __init__(
        self, path: str, offset: int, problem: str, records: int = 0, failed: bool = False
    ):
        super().__init__(f"{path}: {problem}")
        self.path, self.offset, self.problem = path, offset, problem
        self.records, self.failed = records, failed

    def __reduce__(self) -> tuple:
        return (type(self), (self.path, self.offset, self.problem, self.records, self.failed))


class LogReplacedError(LogWriteError):
    """The writer's path no longer names the file it holds open (deleted, renamed away,
    or replaced by another file or a directory): writing on would fill a file nobody can
    find, so the writer fails instead."""


class WriterFailedError(LogWriteError):
    """The writer failed earlier (``first``, also ``__cause__``) and refuses every write."""

    def __init__(self, first: LogWriteError):
        super().__init__(
            first.path,
            first.offset,
            f"the writer failed earlier and refuses further writes: {first.problem}",
            failed=True,
        )
        self.first, self.errno = first, first.errno

    def __reduce__(self) -> tuple:
        return (type(self), (self.first,))


@dataclasses.dataclass(frozen=True)
class GroupCommit:
    """When :class:`OfflineWriter` fsyncs under group commit: after a write once
    ``records`` records wait unsynced, or once the oldest unsynced record is ``seconds``
    old (whichever comes first; give one or both).

    The policy is checked at each write: with no later write, the last records wait for
    the next write, :meth:`OfflineWriter.sync` or :meth:`OfflineWriter.close`. A caller
    that must not acknowledge a record before it is durable calls ``sync()``, which costs
    one fsync for every record written since the last. ``clock`` (seconds, monotonic)
    is replaceable for tests.
    """

    records: int | None = None
    seconds: float | None = None
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        if self.records is None and self.seconds is None:
            raise ValueError("GroupCommit needs records=, seconds= or both")
        if self.records is not None and (
            not isinstance(self.records, int) or isinstance(self.records, bool) or self.records < 1
        ):
            raise ValueError(f"GroupCommit records must be an int >= 1, got {self.records!r}")
        if self.seconds is not None and not (
            isinstance(self.seconds, (int, float)) and 0 < self.seconds < math.inf
        ):
            raise ValueError(f"GroupCommit seconds must be > 0 and finite, got {self.seconds!r}")

    def due(self, unsynced: int, oldest: float) -> bool:
        """Whether ``unsynced`` records, the oldest written at ``oldest`` (by ``clock``),
        call for an fsync now."""
        if self.records is not None and unsynced >= self.records:
            return True
        return self.seconds is not None and self.clock() - oldest >= self.seconds


class _Out:
    """The log's file descriptor (opened ``O_APPEND``): whole writes, and the size they
    reached. ``write`` is what :class:`gzip.GzipFile` writes its compressed bytes to."""

    def __init__(self, fd: int, size: int):
        self.fd, self.size, self.closed = fd, size, False

    def write(self, data: Any) -> int:
        self.write_parts([data])
        return len(data)

    def write_parts(self, parts: list[Any]) -> None:
        if self.closed:  # never write to a closed (and maybe reused) descriptor
            raise ValueError("write to a closed offline log")
        for i in range(0, len(parts), _IOV_MAX):
            group = parts[i : i + _IOV_MAX]
            total = sum(len(p) for p in group)
            done = os.writev(self.fd, group)
            if done < total:  # a short write: what the disk took; the rest raises or goes on
                rest = memoryview(b"".join(group))[done:]
                while rest:
                    n = os.write(self.fd, rest)
                    if n == 0:
                        raise OSError(errno.EIO, "write made no progress")
                    rest = rest[n:]
            self.size += total

    def flush(self) -> None:
        """Nothing to flush: every write went to the OS whole."""


class OfflineWriter:
    """Appends records (batches or episodes) to an offline log file, one frame each.

    Args:
        path: the file; ``.gz`` compresses with gzip.
        append: add to an existing file (its header is kept) instead of truncating it.
            The file is checked first and is never damaged: an unfinished last record
            (a crashed writer's torn tail) is cut away with a :class:`TornTailWarning`
            naming the bytes removed; a damaged frame header before intact frames, or any
            damage in a ``.gz`` file, raises :class:`CorruptLogError` (run
            :func:`repair_log` first). Damage inside an earlier record's payload is not
            looked for (opening stays cheap: only frame headers and the last payload are
            checked); appending never touches it, and readers report it where it is. A
            version-1 file is appended to in version 1, only if it is intact: version 1
            has no framing, so a damaged one is never cut (a flipped length byte would
            look like a torn tail and cut intact records) but refused with
            :class:`CorruptLogError` (:func:`repair_log` rewrites it in version 2). When
            the last session ended without its end frame (its writer crashed), a resume
            frame is written first, so readers report that session where it ended. The
            first record written is compared with the first record of the log's last
            session: a step (episode id and step index) in both means the same run is
            written again (a sampler restarted with the same seed and deterministic ids),
            and :class:`RepeatedRunWarning` says so (a resumed sampler or recovered steps
            continue episodes without repeating a step, and pass).
        flush: ``"record"`` (the default): every :meth:`write` hands its whole frame to
            the OS before it returns, so a killed process loses no record it returned
            from (a machine crash still can: see ``fsync``). ``"manual"``: frames wait
            in the writer until :meth:`flush`, :meth:`sync`, :meth:`close` or
            :data:`BUFFER_LIMIT` bytes (fewer system calls for many small records).
        fsync: ``False`` (the default): never fsync except in :meth:`sync`; the OS writes
            the file back when it chooses, so a power loss or kernel crash can lose
            recent records. ``True``: fsync after every record (each write waits for the
            disk). A :class:`GroupCommit`: fsync after a write once enough records or
            time have gathered. When set, :meth:`close` fsyncs too. An fsync first
            flushes, whatever ``flush`` says. The first fsync of a new file also fsyncs
            its directory, so the file's name survives a crash too.

    For ``.gz`` files a writer session is one gzip member. ``flush="record"`` ends every
    record with a sync flush of the compressor (the stream up to it decompresses; each
    flush costs ratio, a few bytes and a reset of the match search: see
    ``benchmarks/offline_durability.py``); ``"manual"`` flushes the compressor only in
    :meth:`flush`, :meth:`sync` and :meth:`close`, so a killed process also loses what
    the compressor held.

    Failures are loud and leave no torn frame. When writing fails (``OSError``: a full
    disk, a file size limit, an I/O error) the file is cut back to where the failed
    frames began and :class:`LogWriteError` is raised; the writer stays usable, and when
    space frees later records are written intact. If the cut fails too, or the file is
    ``.gz`` (a compressed stream cannot resume mid-member), or an fsync fails (the
    kernel may have dropped the unsynced data), the writer *fails*: the error says so,
    :attr:`failed` holds it, and every later write or sync raises
    :class:`WriterFailedError` naming it. Before every write (and sync and close) the
    writer checks that its path still names the file it holds open (one ``stat`` call,
    about 2 us: 7% of writing a 360-byte record, less for larger ones; checking every N
    ms instead would let records returned from meanwhile vanish unnoticed); a deleted,
    renamed or replaced file raises :class:`LogReplacedError` and fails the writer.

    Attributes: ``records``, records stored or buffered by this writer; ``synced``, how
    many of them the last fsync covered; :attr:`failed`.

    Use as a context manager, or call :meth:`close` (which writes the end frame readers
    look for). Not thread-safe; one writer per file at a time.
    """

    def __init__(
        self,
        path: str,
        append: bool = False,
        *,
        flush: Literal["record", "manual"] = "record",
        fsync: bool | GroupCommit = False,
    ):
        if flush not in ("record", "manual"):
            raise ValueError(f"flush must be 'record' or 'manual', got {flush!r}")
        if not isinstance(fsync, (bool, GroupCommit)):
            raise TypeError(f"fsync must be a bool or a GroupCommit, got {fsync!r}")
        self.path, self.flush_mode, self.fsync_policy = str(path), flush, fsync
        self.records = self.synced = 0
        self.failed: LogWriteError | None = None
        self._pending: list[bytes] = []
        self._pending_bytes = self._pending_records = 0
        self._oldest = 0.0  # clock time of the oldest unsynced record
        self._abspath = os.path.abspath(self.path)  # a later chdir does not move the check
        exists = append and os.path.exists(self.path) and os.path.getsize(self.path) > 0
        self.version, ended, self._last_run_at = (
            prepare_append(self.path) if exists else (VERSION, True, None)
        )
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        fd = os.open(self.path, flags | (0 if exists else os.O_TRUNC), 0o666)
        st = os.fstat(fd)
        self._id, self._new_file = (st.st_dev, st.st_ino), not exists
        self._out = _Out(fd, st.st_size)
        self._gz: gzip.GzipFile | None = None
        if not exists or self.version == 0:  # 0: the old file held only part of a header
            self.version = VERSION
            self._pending.append(_HEADERS[VERSION])
        elif not ended:
            self._pending.append(_frame_head(_RESUME, b""))
        try:
            if self.path.endswith(".gz"):  # writes the member's gzip header at once
                self._gz = gzip.GzipFile(self.path, "ab", fileobj=self._out)
            self._write_out()
        except BaseException:
            self._close_fd()
            raise

    # -- writing -----------------------------------------------------------------------

    def write(self, record: Record) -> None:
        """Appends one record (a batch or an episode) as one frame; under
        ``flush="record"`` the frame is in the OS's hands when this returns.

        Raises:
            TypeError: ``record`` is not a batch or an episode (nothing is written).
            LogWriteError: writing failed (see the class docstring); the log ends
                intact. :class:`LogReplacedError` / :class:`WriterFailedError` are kinds.
        """
        if not isinstance(record, _RECORD_TYPES):
            raise TypeError(f"cannot log a {type(record).__name__}: give a batch or an episode")
        if self._last_run_at is not None:  # the first record appended: a repeated run?
            at, self._last_run_at = self._last_run_at, None
            warn_if_repeated(self.path, at, record)
        self._append(packb(record))

    def _append(self, payload: bytes, check_path: bool = True) -> None:
        """Appends one encoded record as one frame (:meth:`write` after its type check);
        ``check_path=False`` leaves the path check to the next :meth:`flush`."""
        self._usable()
        if check_path:
            self._check_path()
        if self.version == 2:
            self._pending.append(_frame_head(_RECORD, payload))
        self._pending.append(payload)
        self._pending_bytes += len(payload)
        self._pending_records += 1
        if self.records == self.synced:
            self._oldest = self._clock()
        self.records += 1
        policy = self.fsync_policy
        sync = policy is True or (
            isinstance(policy, GroupCommit) and policy.due(self.records - self.synced, self._oldest)
        )
        if sync:
            self._sync()
        elif self.flush_mode == "record" or self._pending_bytes >= BUFFER_LIMIT:
            self._write_out()

    def flush(self) -> None:
        """Hands every buffered record to the OS (through a sync flush of the compressor
        for ``.gz``) without fsync or closing; only :meth:`close` writes the end frame."""
        self._usable()
        self._check_path()
        self._write_out(compressor=True)

    @property
    def offset(self) -> int | None:
        """The byte where the file ends after every frame handed to the OS so far (so, after
        :meth:`flush`, after every record written): a frame boundary, where
        ``read_records(path, offset=...)`` can start reading what this writer writes
        next. ``None`` for ``.gz`` (its offsets are not in the file's bytes)."""
        return None if self._gz is not None else self._out.size

    def sync(self) -> None:
        """Flushes and fsyncs now: when it returns, every record this writer returned
        from is on disk (as far as the disk's own write cache keeps its promises).

        Raises:
            LogWriteError: as :meth:`write`; a failed fsync fails the writer.
        """
        self._usable()
        self._check_path()
        self._sync()

    def close(self) -> None:
        """Writes the end frame (and fsyncs, where ``fsync`` is set) and closes the file
        (idempotent). A failed writer is closed without an end frame, since its session
        did not end well, and without raising again.

        Raises:
            LogWriteError: the end frame could not be written or synced, or the path no
                longer names the file (:class:`LogReplacedError`); the file is closed.
        """
        if self._out.closed:
            return
        try:
            if self.failed is None:
                self._check_path()
                if self.version == 2:
                    self._pending.append(_frame_head(_END, b""))
                if self.fsync_policy is not False:
                    self._sync(trailer=True)
                else:
                    self._write_out(trailer=True)
        finally:
            self._close_fd()

    def __enter__(self) -> OfflineWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------

    def _clock(self) -> float:
        policy = self.fsync_policy
        return policy.clock() if isinstance(policy, GroupCommit) else 0.0

    def _usable(self) -> None:
        if self._out.closed:
            raise ValueError(f"{self.path}: write to a closed OfflineWriter")
        if self.failed is not None:
            raise WriterFailedError(self.failed) from self.failed

    def _fail(self, error: LogWriteError, cause: BaseException | None) -> LogWriteError:
        error.failed, self.failed = True, error
        if cause is not None:
            error.__cause__ = cause
        return error

    def _check_path(self) -> None:
        """Raises :class:`LogReplacedError` (failing the writer) unless the path still
        names the open file."""
        try:
            st = os.stat(self._abspath)
        except OSError as e:  # gone, or a directory on the way is no longer one
            problem = f"the log's path no longer exists ({e.strerror})"
        else:
            if (st.st_dev, st.st_ino) == self._id:
                return
            problem = "the log's path now names another file (it was replaced or renamed)"
        error = LogReplacedError(
            self.path,
            self._out.size,
            f"{problem}; writing on would go to a file nobody can find, so the writer fails",
        )
        error.errno = errno.ENOENT
        raise self._fail(error, None)

    def _write_out(self, compressor: bool = False, trailer: bool = False) -> None:
        """Hands the buffered frames to the OS; on failure cuts the file back to where
        they began (or fails the writer) and raises."""
        parts, n = self._pending, self._pending_records
        self._pending, self._pending_bytes, self._pending_records = [], 0, 0
        start = self._out.size
        try:
            if self._gz is None:
                self._out.write_parts(parts)
                return
            for part in parts:
                self._gz.write(part)
            if trailer:
                self._gz.close()  # ends the member; the descriptor stays open
            elif compressor or (parts and self.flush_mode == "record"):
                self._gz.flush(zlib.Z_SYNC_FLUSH)
        except OSError as e:
            self.records -= n
            raise self._cut_back(e, start, n) from e

    def _cut_back(self, cause: OSError, start: int, n: int) -> LogWriteError:
        what = f"writing {n} record(s)" if n else "writing"
        problem = f"{what} failed at byte {start} ({cause.strerror or cause})"
        try:
            os.ftruncate(self._out.fd, start)
        except OSError as e:
            error = LogWriteError(
                self.path,
                start,
                f"{problem}, and cutting the file back to byte {start} failed too "
                f"({e.strerror or e}): the log may end in a torn frame",
                n,
            )
            error.errno = cause.errno
            return self._fail(error, cause)
        self._out.size = start
        if self._gz is not None:
            error = LogWriteError(
                self.path,
                start,
                f"{problem}; a gzip stream cannot resume after a failed write, so the writer "
                "fails (the compressed file ends early; repair_log reads what it holds)",
                n,
            )
            error.errno = cause.errno
            return self._fail(error, cause)
        error = LogWriteError(
            self.path, start, f"{problem}; cut back to it, the log ends intact", n
        )
        error.errno = cause.errno
        return error

    def _sync(self, trailer: bool = False) -> None:
        self._write_out(compressor=True, trailer=trailer)
        try:
            os.fsync(self._out.fd)
            if self._new_file:  # the file's directory entry must survive a crash too
                _fsync_dir(os.path.dirname(self._abspath))
                self._new_file = False
        except OSError as e:
            error = LogWriteError(
                self.path,
                self._out.size,
                f"fsync failed ({e.strerror or e}); records since the last sync may not be "
                "on disk and cannot be synced again, so the writer fails",
                self.records - self.synced,
            )
            error.errno = e.errno
            raise self._fail(error, e) from e
        self.synced = self.records

    def _close_fd(self) -> None:
        if not self._out.closed:
            self._out.closed = True  # from here on nothing reaches the descriptor
            if self._gz is not None and not self._gz.closed:
                with contextlib.suppress(ValueError):  # its trailer would be refused
                    self._gz.close()
            os.close(self._out.fd)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
