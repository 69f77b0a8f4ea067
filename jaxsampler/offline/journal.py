"""Write-ahead journal of an external env (:class:`StepJournal`) and its in-run checkpoints.

A served step is *acknowledged* when the client gets its answer: the action of a
``get_action``, the 200 of a ``log_action``, ``log_returns`` or ``end_episode``. Without a
journal, an acknowledged step lives only in the sampler's memory until the sampler's
output is written, so a server killed in between loses it. With one
(``ExternalEnv(..., journal=StepJournal(path))``) every change the env makes is written to
the journal *before* it takes effect, hence before it is acknowledged: the episode's
start, each observation (with its action for ``log_action``), each reward, the final
observation, each poll that hands steps to the sampler, each batch of answers and each
abandonment. An entry is in the OS's hands when the call returns (it survives the
server process being killed); ``fsync=True`` or a :class:`GroupCommit` makes entries
survive a machine crash too (see :class:`StepJournal`). After a crash,
:func:`~jaxsampler.offline.recover` appends every acknowledged step the log lacks (see
:mod:`jaxsampler.offline.recovery`).

Start each server run with the same journal (its new session follows the old ones;
recovery handles each session apart). Left alone, a journal grows with every step, and
recovery replays all of it. Two things shrink it: recovery compacts it (by default) to the
episode ids it held, and an **in-run checkpoint**
(:meth:`~jaxsampler.host_envs.external.ExternalEnvBase.checkpoint_journal`, called by the
sampler's loop once its outputs are in the log) rewrites it to what a crash could still
lose: the entries of the episodes running then, the ids of the finished ones, and where
the log ended. Recovery after a crash then replays only those and what came later, and
reads the log only from that point, however long the server ran. For this the journal
keeps each running episode's entries in memory until the env drops the episode.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import os
import threading
import time
import warnings
from collections.abc import Iterable, Iterator
from operator import itemgetter
from typing import Any

from jaxsampler.episodes.codec import packb
from jaxsampler.offline.frames import (
    _END,
    _HEADERS,
    _RECORD,
    VERSION,
    TruncatedLogWarning,
    _frame_head,
    read_entries,
)
from jaxsampler.offline.syncer import BackgroundSync
from jaxsampler.offline.writer import GroupCommit, LogWriteError, OfflineWriter, _fsync_dir

__all__ = ["StepJournal"]

#: entries that concern one episode (their ``"e"``); polls, answers and settles name several
_EPISODE_OPS = frozenset({"start", "submit", "returns", "end", "abandon"})
_ENTRY, _POLL, _ANSWER, _SETTLE = range(4)  # what a remembered mark is (see _Marks)
#: entries per frame of a rewritten journal (a compaction's ids, a checkpoint's entries)
_PER_FRAME = 4096

_Mark = tuple[int, int, Any]  # (sequence number, kind, encoded entry / id / (id, actions))


class StepJournal:
    """The write-ahead journal an external env writes each change to before making it
    (see the module docstring); give it to the env: ``ExternalEnv(..., journal=j)``.

    Opening appends a new session to an existing journal (a torn last entry left by a
    crash is cut away with a :class:`~jaxsampler.offline.TornTailWarning`; the temporary
    file of a checkpoint a crash interrupted is removed, the journal itself being whole)
    and reads the episode ids it holds, which the env then refuses to start again.

    Entries are encoded as the env records them (the big ones, an observation or a batch
    of answers, before it takes its lock: :meth:`encode`) and go out as one frame,
    in one write, per :meth:`commit`, which the env runs before each acknowledgement:
    entries of concurrent calls share a write (group commit). A commit returns once every
    entry recorded before it began is written (and fsynced as ``fsync`` says): the first
    caller writes everything buffered while later ones wait for that write and find their
    entries in it; :meth:`record` never waits for a write or an fsync, so the env's lock is
    never held across one. Each commit also checks that the path still names the journal
    (:class:`~jaxsampler.offline.LogReplacedError` otherwise). :meth:`checkpoint` rewrites
    the journal during the run (see the module docstring).

    Args:
        path: the journal file (an offline log of version 2 whose records are entries).
        fsync: ``False`` (default): a commit hands the entries to the OS, so a killed
            server loses nothing it acknowledged; ``True``: a commit also fsyncs (a machine
            crash loses nothing acknowledged either; an fsync per acknowledgement, slow on
            most disks); a :class:`GroupCommit`: an fsync is due at a commit once N entries
            or N seconds are unsynced, and runs on a thread of its own (no caller waits for
            it), so a machine crash loses at most that window and one fsync's time; a
            failed one fails the journal (the next commit raises).

    Attributes: ``checkpoints``, how many this journal took; ``failed``, the error that
    broke it (a checkpoint that failed after switching files), or ``None``.

    Raises:
        CorruptLogError: the journal is damaged before its last entry.
    """

    def __init__(self, path: str | os.PathLike, *, fsync: bool | GroupCommit = False):
        self.path = str(path)
        self._tmp = f"{self.path}.checkpoint"
        if os.path.exists(self._tmp):  # a checkpoint a crash interrupted before its switch
            os.remove(self._tmp)
        self._known: set[str] = set()
        self._earlier_runs = 0  # sessions of earlier runs not yet recovered
        if os.path.exists(self.path) and os.path.getsize(self.path) > 0:
            for entry in _entries(self.path):
                _note_ids(entry, self._known)
                self._earlier_runs += entry.get("op") == "open"
        if not isinstance(fsync, (bool, GroupCommit)):
            raise TypeError(f"fsync must be a bool or a GroupCommit, got {fsync!r}")
        self.fsync = fsync
        self.checkpoints = 0
        self.failed: BaseException | None = None
        # _lock guards the buffer and the marks (held briefly, also under the env's lock);
        # _write_lock orders the writes and fsyncs (held across them). Order: write, then buffer.
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._written = 0  # entries (by sequence number) handed to the OS
        self._lost = 0  # entries up to this number went down with a failed write
        self._unsynced = 0  # entries handed to the OS but not fsynced
        self._syncer = BackgroundSync("StepJournal-fsync")
        self._oldest = 0.0  # GroupCommit clock time of the oldest of them
        self._buffered: list[bytes] = []  # encoded entries of the next commit
        self._closed = False
        # What a checkpoint rewrites: each live episode's marks, the settles, the ids
        # started since the last checkpoint (see _remember).
        self._seq = 0
        self._marks: dict[str, list[_Mark]] = {}
        self._settles: list[int] = []
        self._new_ids: set[str] = set()
        if self.path.endswith(".gz"):
            raise ValueError(f"{self.path}: a journal is not compressed (no .gz)")
        self._writer = OfflineWriter(self.path, append=True, flush="manual")
        self._session_start: int = self._writer.offset or 0  # where this run's frames begin
        self._open = {"op": "open", "time": time.time(), "pid": os.getpid()}
        self.record(self._open)
        self.commit()

    def encode(self, entry: dict[str, Any]) -> bytes:
        """``entry`` encoded as :meth:`record` stores it (an env encodes big entries with it
        before taking its lock, and records the bytes under it)."""
        return packb(entry)

    def record(self, entry: dict[str, Any], payload: bytes | None = None) -> None:
        """Buffers one entry until the next :meth:`commit`; ``payload``: the entry already
        encoded (by :meth:`encode`)."""
        if payload is None:
            payload = packb(entry)
        with self._lock:
            self._buffered.append(payload)
            self._seq += 1
            self._remember(entry, payload)

    def _remember(self, entry: dict[str, Any], payload: bytes) -> None:
        """Files ``entry`` under the episodes it concerns, for the next checkpoint."""
        op, seq = entry["op"], self._seq
        if op in _EPISODE_OPS:
            eid = str(entry["e"])
            if op == "start":
                self._new_ids.add(eid)
            self._marks.setdefault(eid, []).append((seq, _ENTRY, payload))
        elif op == "poll":
            for eid in entry["ready"]:
                if (marks := self._marks.get(eid)) is not None:
                    marks.append((seq, _POLL, eid))
        elif op == "answer":
            for eid, actions in entry["actions"].items():
                if (marks := self._marks.get(eid)) is not None:
                    marks.append((seq, _ANSWER, (eid, actions)))
        elif op == "settle":
            self._settles.append(seq)

    def forget(self, episode_id: str) -> None:
        """Drops a finished episode's entries from memory (the env calls it when the
        episode's final step was polled; the next checkpoint keeps only its id)."""
        with self._lock:
            self._marks.pop(episode_id, None)

    def commit(self) -> None:
        """Returns once every entry recorded before the call is handed to the OS in one
        write (and fsyncs as ``fsync`` says); thread-safe. Concurrent callers share a
        write: whoever holds the write lock writes all that is buffered, and a caller whose
        entries that write carried returns without writing.

        Raises:
            LogWriteError: writing failed (the journal ends intact, cut back to before the
                failed entries; a later commit that waits for them raises too);
                :class:`~jaxsampler.offline.LogReplacedError`: the path no longer names the
                journal.
        """
        with self._lock:
            self._usable()
            target = self._seq
        with self._write_lock:
            with self._lock:
                self._usable()
                if target <= self._lost:
                    raise LogWriteError(
                        self.path, 0, "entries of this call went down with a failed write"
                    )
                if self._written >= target:  # an earlier caller's write carried them
                    entries, upto = [], self._written  # (an fsync may still be due)
                else:
                    entries, self._buffered, upto = self._buffered, [], self._seq
            try:
                self._write(entries)
            except BaseException:
                self._lost = upto
                raise
            self._written = upto

    def _write(self, entries: list[bytes]) -> None:
        """Writes ``entries`` as one frame and fsyncs as ``fsync`` says (under the write
        lock only: recording goes on meanwhile)."""
        n = len(entries)
        policy, writer = self.fsync, self._writer
        if n:  # one frame: a commit lands whole or (cut back after a failure) not at all
            writer._append(_array_head(n) + b"".join(entries), check_path=False)
            if policy is True:
                writer.sync()
                return
            writer.flush()
        if isinstance(policy, GroupCommit) and (n or self._unsynced):
            if not self._unsynced:
                self._oldest = policy.clock()
            self._unsynced += n
            if policy.due(self._unsynced, self._oldest):
                self._syncer.request(writer._out.fd)
                self._unsynced = 0

    def checkpoint(self, live: Iterable[str], log_offset: int | None) -> None:
        """Rewrites the journal to what a crash could still lose, then goes on writing the
        new file; the env calls it under its lock
        (:meth:`~jaxsampler.host_envs.external.ExternalEnvBase.checkpoint_journal` says
        when that is right). The new file holds what this file held before this run
        (unchanged), the ids of this run's episodes that are not ``live``, this run's
        entries of the ``live`` episodes and the polls, answers and settles among them
        (in their order), and a checkpoint entry naming ``log_offset`` (where the log
        ended: every step polled before it is stored there). It is written to a
        temporary file, fsynced and renamed over the journal, so a crash leaves either
        file whole. Every entry recorded so far is in it, so pending commits have
        nothing left to write.

        Raises:
            LogWriteError: the new file could not be written (the journal is untouched);
                once the files are switched, a failure fails the journal (``failed``).
        """
        live = set(live)
        if self._earlier_runs:
            self._earlier_runs, n = 0, self._earlier_runs
            warnings.warn(
                f"{self.path}: the journal holds {n} earlier server run(s) not recovered; each "
                "checkpoint copies them (clients wait meanwhile): run recover() before serving",
                RuntimeWarning,
                stacklevel=3,
            )
        with self._write_lock, self._lock:
            self._usable()
            marks = [self._marks[e] for e in live if self._marks.get(e)]
            first = min((m[0][0] for m in marks), default=self._seq + 1)
            self._settles = [s for s in self._settles if s >= first]
            settles = [(s, _SETTLE, None) for s in self._settles]
            dropped = sorted(self._new_ids - live)
            with open(self.path, "rb") as f:
                before = f.read(self._session_start)  # header and earlier runs
            ids = _id_frames(dropped)
            entries = [packb(self._open)] + list(_merge(marks + [settles]))
            entries.append(packb({"op": "checkpoint", "log_offset": log_offset}))
            frames = [
                _frame(entries[i : i + _PER_FRAME]) for i in range(0, len(entries), _PER_FRAME)
            ]
            # An end frame last: the writer that goes on appending to it continues the
            # session without the resume frame that marks a crashed writer.
            try:
                _write_synced(self._tmp, [before, *ids, *frames, _frame_head(_END, b"")])
            except OSError as e:
                raise self._write_error(e, "writing it") from e
            try:
                os.replace(self._tmp, self.path)
            except OSError as e:
                raise self._write_error(e, "renaming it over the journal") from e
            try:  # from here on the new file is the journal
                self._syncer.quiesce()
                self._writer._close_fd()
                _fsync_dir(os.path.dirname(os.path.abspath(self.path)))
                self._writer = OfflineWriter(self.path, append=True, flush="manual")
            except BaseException as e:
                self.failed = e
                raise
            self._session_start = len(before) + sum(len(f) for f in ids)
            self._buffered, self._unsynced, self._written = [], 0, self._seq
            self._new_ids &= live
            self.checkpoints += 1

    def _write_error(self, e: OSError, doing: str) -> LogWriteError:
        error = LogWriteError(
            self.path,
            0,
            f"a checkpoint failed {doing} ({e.strerror or e}); the journal is unchanged",
        )
        error.errno = e.errno or errno.EIO
        return error

    def _usable(self) -> None:
        e = self._syncer.error
        if e is not None and self.failed is None:
            self.failed = LogWriteError(
                self.path, 0, f"a group commit's fsync failed ({e.strerror or e})", failed=True
            )
            self.failed.errno = e.errno
        if self.failed is not None:
            raise LogWriteError(
                self.path, 0, f"the journal failed earlier ({self.failed})", failed=True
            ) from self.failed

    def known(self, episode_id: str) -> bool:
        """Whether ``episode_id`` was started in an earlier session of this journal."""
        return episode_id in self._known

    def sync(self) -> None:
        """Writes and fsyncs every entry now."""
        self.commit()
        with self._write_lock:
            self._unsynced = 0
            self._writer.sync()

    def close(self) -> None:
        """Writes what is buffered, ends the session (an end frame) and closes the file;
        idempotent."""
        if not self._closed:
            self._closed = True
            if self.failed is None:
                self.commit()
        with self._write_lock, self._lock:
            self._syncer.stop()
            self._writer.close()

    def __enter__(self) -> StepJournal:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _merge(marks: list[list[_Mark]]) -> Iterator[bytes]:
    """The encoded entries of the marks, in sequence order: an episode's own entries as
    recorded, and one poll / answer / settle per sequence number for the episodes given."""
    merged = heapq.merge(*marks, key=itemgetter(0))
    for _, group in itertools.groupby(merged, key=itemgetter(0)):
        items = list(group)
        kind = items[0][1]
        if kind == _ENTRY:
            yield items[0][2]
        elif kind == _POLL:
            yield packb({"op": "poll", "ready": [m[2] for m in items]})
        elif kind == _ANSWER:
            yield packb({"op": "answer", "actions": dict(m[2] for m in items)})
        else:
            yield packb({"op": "settle"})


def _frame(entries: list[bytes]) -> bytes:
    """One journal frame holding the encoded ``entries`` (as a commit writes them)."""
    payload = _array_head(len(entries)) + b"".join(entries)
    return _frame_head(_RECORD, payload) + payload


def _id_frames(ids: list[str]) -> list[bytes]:
    """Frames of ``ids`` entries naming ``ids`` (none for no ids)."""
    return [
        _frame([packb({"op": "ids", "ids": ids[i : i + _PER_FRAME]})])
        for i in range(0, len(ids), _PER_FRAME)
    ]


def _compact(path: str, known: set[str]) -> None:
    """Replaces the journal at ``path`` by one holding only ``known`` (``ids`` entries),
    atomically (a new file, fsynced, renamed over it, the directory fsynced)."""
    tmp = f"{path}.compacting"
    ids = _id_frames(sorted(known)) or [_frame([packb({"op": "ids", "ids": []})])]
    _write_synced(tmp, [_HEADERS[VERSION], *ids, _frame_head(_END, b"")])
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(os.path.abspath(path)))  # the rename survives a machine crash


def _write_synced(path: str, parts: list[bytes]) -> None:
    """Writes ``parts`` to a new file at ``path`` and fsyncs it (what a rename over the
    journal may then put in its place); on failure removes it and raises the OSError."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        try:
            for part in parts:
                view = memoryview(part)
                while view:
                    view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        if os.path.exists(path):
            os.remove(path)
        raise


def _note_ids(entry: dict, known: set[str]) -> None:
    """Adds the episode ids ``entry`` names as started (a start, or a compacted journal's
    ``ids``) to ``known``."""
    op = entry.get("op")
    if op == "start":
        known.add(str(entry["e"]))
    elif op == "ids":
        known.update(str(e) for e in entry["ids"])


def _entries(path: str) -> Iterator[dict]:
    """The journal's entries; the warnings of a crashed session are expected here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TruncatedLogWarning)
        for frame in read_entries(path):  # a commit's entries, or one entry (older journals)
            yield from frame if isinstance(frame, list) else (frame,)


def _array_head(n: int) -> bytes:
    """The msgpack header of an array of ``n`` items: followed by ``n`` encoded entries, it
    encodes their list without decoding them again."""
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")
