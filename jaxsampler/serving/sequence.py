"""Per-episode sequence numbers: how the policy server tells a retried command from a new one.

A client that may retry numbers the commands of each episode (the body's ``seq`` field):
``start_episode`` is 0, then 1, 2, 3 ... (a number is used up only by a command that
succeeded; after an error the client sends the next command under the same number). For
each ``(owner, episode)`` :class:`Sequences` keeps the last number that succeeded, a
fingerprint of its request and its answer, and the one running now:

=====================================  ==============================================
incoming ``seq``                        what the server does
=====================================  ==============================================
last, same request                     replays the recorded answer (nothing runs again)
last + 1, nothing running              runs it
the one running, same request          503 ``RequestInProgress`` (retry later)
anything else (a gap, an older one,    409 :class:`~jaxsampler.serving.protocol.SequenceError`
a known number with another request)
=====================================  ==============================================

A request carrying deferred ``returns`` runs them before its command; when its command then
fails, how many of them ran is kept with its fingerprint, so a retry of the same bytes (its
answer was lost) does not run them again. Episodes without a record (started without
``seq``, or forgotten) start one at whatever number comes first.

Memory: records of episodes that are no longer running are dropped by a sweep that runs
whenever the table doubled since the last one (so the table stays within about twice the
running episodes), except the last ``max_ended`` episodes ended by ``end_episode``, whose
answer stays for a retried ``end_episode``.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from jaxsampler.serving.protocol import SequenceError

__all__ = ["Answer", "BatchIds", "RequestInProgress", "Sequences", "fingerprint"]

#: the first sweep runs once this many episodes have records
_MIN_SWEEP = 256


@dataclass(frozen=True)
class Answer:
    """A recorded answer: what a replay sends again."""

    status: int
    body: bytes
    content_type: str


class RequestInProgress(Exception):
    """The command under this ``seq`` is still running (503: retry later)."""


def fingerprint(command: str, body: bytes) -> bytes:
    """A 16-byte digest of one request (its path and body): a retry sends the same bytes."""
    return hashlib.blake2b(body, digest_size=16, person=command.encode()[:16]).digest()


class _Record:
    """One episode's numbers (see the module docstring)."""

    __slots__ = ("last", "last_fp", "answer", "running", "running_fp", "partial")

    def __init__(self) -> None:
        self.last: int | None = None  # the last seq that succeeded
        self.last_fp = b""
        self.answer: Answer | None = None
        self.running: int | None = None
        self.running_fp = b""
        self.partial: tuple[int, bytes, int] | None = None  # (seq, fp, deferred returns run)


class Sequences:
    """The per-episode sequence records of one server (thread-safe).

    Args:
        alive: whether an episode id still runs in the env (records of others are swept).
        max_ended: episodes ended by ``end_episode`` whose last answer is kept anyway.
    """

    def __init__(self, alive: Callable[[str], bool], max_ended: int = 1024):
        self._alive = alive
        self._max_ended = int(max_ended)
        self._records: dict[tuple[Hashable, str], _Record] = {}
        self._ended: OrderedDict[tuple[Hashable, str], None] = OrderedDict()
        self._sweep_at = _MIN_SWEEP
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._records)

    def begin(self, key: tuple[Hashable, str], seq: int, fp: bytes) -> Answer | int:
        """Checks ``seq`` for the episode ``key``: the recorded :class:`Answer` to replay, or
        how many of the request's deferred returns already ran (then the command is marked
        running: end it with :meth:`succeeded` or :meth:`failed`).

        Raises:
            RequestInProgress: the same request is running.
            SequenceError: a gap, an older number, or a used number with another request.
        """
        with self._lock:
            rec = self._records.get(key)
            if rec is None:
                self._maybe_sweep()
                rec = self._records[key] = _Record()
            if rec.running is not None and seq == rec.running:
                if fp != rec.running_fp:
                    raise SequenceError(f"seq {seq} is running with another command")
                raise RequestInProgress(f"seq {seq} of this episode is still running")
            if rec.last is not None and seq == rec.last:
                if fp != rec.last_fp or rec.answer is None:
                    raise SequenceError(
                        f"seq {seq} was already used by another command of this episode"
                    )
                return rec.answer
            expected = None if rec.last is None else rec.last + 1
            if rec.running is not None or (expected is not None and seq != expected):
                raise SequenceError(
                    f"seq {seq} does not follow this episode's last one "
                    f"({rec.last}; expected {expected})"
                    + (f", and seq {rec.running} is still running" if rec.running else "")
                )
            rec.running, rec.running_fp = seq, fp
            partial = rec.partial
            if partial is not None and partial[0] == seq and partial[1] == fp:
                return partial[2]
            rec.partial = None
            return 0

    def state(self, key: tuple[Hashable, str]) -> tuple[int | None, int | None] | None:
        """``(last number that succeeded, number running now)`` of ``key``; ``None`` without
        a record (any number starts one)."""
        with self._lock:
            rec = self._records.get(key)
            return None if rec is None else (rec.last, rec.running)

    def returns_ran(self, key: tuple[Hashable, str], seq: int, n: int) -> None:
        """The running request ``seq`` has run its first ``n`` deferred returns."""
        with self._lock:
            rec = self._records.get(key)
            if rec is not None and rec.running == seq:
                rec.partial = (seq, rec.running_fp, n)

    def succeeded(self, key: tuple[Hashable, str], seq: int, answer: Answer) -> None:
        """The running request ``seq`` succeeded: ``answer`` is what a retry gets."""
        with self._lock:
            rec = self._records.get(key)
            if rec is None or rec.running != seq:
                return
            rec.last, rec.last_fp, rec.answer = seq, rec.running_fp, answer
            rec.running, rec.running_fp, rec.partial = None, b"", None

    def failed(self, key: tuple[Hashable, str], seq: int) -> None:
        """The running request ``seq`` failed or was dropped: the number stays free."""
        with self._lock:
            rec = self._records.get(key)
            if rec is not None and rec.running == seq:
                rec.running, rec.running_fp = None, b""

    def forget(self, key: tuple[Hashable, str]) -> None:
        """Drops the record of ``key`` (an episode id started again, ``allow_reuse``)."""
        with self._lock:
            self._records.pop(key, None)
            self._ended.pop(key, None)

    def ended(self, key: tuple[Hashable, str]) -> None:
        """The episode ended (``end_episode``): its record stays among the last
        ``max_ended`` ended ones, for a retried ``end_episode``."""
        with self._lock:
            self._ended[key] = None
            self._ended.move_to_end(key)
            while len(self._ended) > self._max_ended:
                old, _ = self._ended.popitem(last=False)
                self._records.pop(old, None)

    def _maybe_sweep(self) -> None:
        """Drops the records of episodes that no longer run (not the recently ended ones),
        once the table has doubled since the last sweep (under the lock)."""
        if len(self._records) < self._sweep_at:
            return
        for key in [
            k
            for k, r in self._records.items()
            if k not in self._ended and r.running is None and not self._alive(k[1])
        ]:
            del self._records[key]
        self._sweep_at = max(_MIN_SWEEP, 2 * len(self._records))


class BatchIds:
    """The ``/batch`` requests that carried a request id (``POST /batch?id=...``), by
    ``(owner, id)``: a retried batch (same id, same body) gets the first answer instead of
    running its commands again; thread-safe.

    ========================================  =======================================
    incoming id                               what the server does
    ========================================  =======================================
    new                                       runs the batch, records its answer
    finished, same body                       replays the recorded answer
    running, same body                        503 ``RequestInProgress`` (retry later)
    known, another body                       409 :class:`SequenceError`
    ========================================  =======================================

    A batch that failed as a whole (an undecodable body, say) or was dropped (its client
    left before it ran) leaves its id free. The last ``max_ids`` finished ids are kept,
    oldest forgotten first (a retry after that many later batches would run again).
    """

    def __init__(self, max_ids: int = 4096):
        self._max_ids = int(max_ids)
        self._done: OrderedDict[tuple[Hashable, str], tuple[bytes, Answer]] = OrderedDict()
        self._running: dict[tuple[Hashable, str], bytes] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._done)

    def begin(self, key: tuple[Hashable, str], fp: bytes) -> Answer | None:
        """The recorded :class:`Answer` of a finished batch ``key`` to replay, or ``None``
        (then it is marked running: end it with :meth:`succeeded` or :meth:`failed`).

        Raises:
            RequestInProgress: the same batch is running.
            SequenceError: the id was used with another body.
        """
        with self._lock:
            running = self._running.get(key)
            done = self._done.get(key)
            known = running if running is not None else None if done is None else done[0]
            if known is not None and known != fp:
                raise SequenceError(f"batch id {key[1]!r} was already used with another body")
            if running is not None:
                raise RequestInProgress(f"batch {key[1]!r} is still running")
            if done is not None:
                return done[1]
            self._running[key] = fp
            return None

    def succeeded(self, key: tuple[Hashable, str], answer: Answer) -> None:
        """The running batch ``key`` finished with ``answer`` (what a retry gets)."""
        with self._lock:
            fp = self._running.pop(key, None)
            if fp is None:
                return
            self._done[key] = (fp, answer)
            while len(self._done) > self._max_ids:
                self._done.popitem(last=False)

    def failed(self, key: tuple[Hashable, str]) -> None:
        """The running batch ``key`` failed as a whole or was dropped: its id is free."""
        with self._lock:
            self._running.pop(key, None)
