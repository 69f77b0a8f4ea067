"""Offline logs: write batches and episodes to files and read them back exactly.

Format, version 2 (what :class:`OfflineWriter` writes; paths ending in ``.gz`` hold the
same bytes gzip-compressed)::

    header   msgpack {"format": "jaxsampler.offline", "version": 2}   (always these bytes)
    frame*   magic    4 bytes  b"\\xc1JSL"  (0xc1 is a byte msgpack never uses)
             kind     1 byte   0 = record, 1 = end of a writer session, 2 = resume (a
                               session begins after one that ended without its end frame)
             length   8 bytes  payload size, little-endian
             crc      4 bytes  CRC-32 of the payload, little-endian
             head_crc 4 bytes  CRC-32 of the 17 bytes above, little-endian
             payload  msgpack (:mod:`jaxsampler.episodes.codec`): a :class:`SampleBatch`,
                      :class:`MultiAgentBatch`, :class:`SingleAgentEpisode` or
                      :class:`MultiAgentEpisode`; empty for end and resume frames

The records are encoded with :mod:`jaxsampler.episodes.codec`, the policy server's wire codec.
The checksum is zlib's CRC-32 (standard library, hardware-accelerated by zlib, several
GB/s here); CRC-32C would need a new dependency for no gain in what it detects (every
error of up to 32 consecutive bits, and all but 2**-32 of other damage). The header
checksum makes a damaged length field visible before it is trusted, so a reader never
reads or allocates what a damaged length claims, and the magic lets a repair resync at
the next intact record. :meth:`OfflineWriter.close` ends each writer session with an
end frame, so a log cut exactly between two records is noticed too. Appending adds
frames (a new gzip member for ``.gz``).

Versioning: the header names the version; a reader refuses versions it does not know
(older readers say "unsupported offline log version 2"). Version 1 (header
``"version": 1``, then bare msgpack records, no framing or checksums) is still read,
with the same safe decoder (damage that breaks its structure is an error; changed
values cannot be noticed), and is appended to in version 1; :func:`repair_log` converts
it to version 2. Resume frames came later within version 2: a reader from before them
refuses a log holding one with "unknown frame kind 2" (loudly, never misreading it);
:func:`repair_log` drops them.

Appending (``OfflineWriter(path, append=True)``) first follows the frame headers: an
unfinished last record left by a crashed writer is cut away with a
:class:`TornTailWarning` naming the bytes removed; damage before intact frames raises
instead (nothing is ever written over or cut from intact data). ``.gz`` files are read
whole first and any damage raises, since compressed bytes cannot be cut at a record. When
the last session has no end frame (its writer crashed) the new session starts with a
resume frame, so readers can say where the crashed session ended.

Durability (:class:`OfflineWriter`'s ``flush=`` and ``fsync=``): by default every
``write`` hands its whole frame to the OS before returning, so a killed process loses no
record it returned from; ``fsync=True`` or a :class:`GroupCommit` (every N records or
N seconds) makes them survive a machine crash too, and :meth:`OfflineWriter.sync` does
so on demand (a server acknowledging a stored step calls it first). Writing fails loudly
and leaves no torn frame: an ``OSError`` (a full disk, a file size limit, an I/O error)
cuts the file back to the failed frame's start and raises :class:`LogWriteError`, after
which writing may go on; where it cannot (``.gz``, a failed cut, a failed fsync) the
writer fails and every later write raises :class:`WriterFailedError`. A writer whose
path no longer names its file (deleted, renamed, replaced) raises
:class:`LogReplacedError` instead of writing into a file nobody can find.

Errors: every damage raises :class:`CorruptLogError` (a ``ValueError``) naming the file
and the byte offset (in the decompressed stream for ``.gz``): a checksum mismatch, a
damaged header or marker, bytes after the last record, a record that does not decode.
A log that ends inside a record, a truncated gzip stream, or a log without its end frame
(the writer crashed or is still writing) warns with :class:`TruncatedLogWarning`
after yielding every intact record; so does a session that ended without its end frame
before a later writer appended (the warning names where it began and ended). Reading
never resynchronises silently: :func:`repair_log` does that, and reports what it dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, cast

from jaxsampler.episodes import MultiAgentBatch, MultiAgentEpisode, SampleBatch, SingleAgentEpisode
from jaxsampler.offline import frames
from jaxsampler.offline.append import RepeatedRunWarning
from jaxsampler.offline.frames import (
    CorruptLogError,
    Record,
    TornTailWarning,
    TruncatedLogWarning,
    read_records,
)
from jaxsampler.offline.journal import StepJournal
from jaxsampler.offline.recovery import RecoveryReport, recover
from jaxsampler.offline.repair import RepairReport, repair_log
from jaxsampler.offline.writer import (
    BUFFER_LIMIT,
    GroupCommit,
    LogReplacedError,
    LogWriteError,
    OfflineWriter,
    WriterFailedError,
)

#: The format name and version in a log's header.
FORMAT, VERSION = frames.FORMAT, frames.VERSION

__all__ = [
    "BUFFER_LIMIT",
    "CorruptLogError",
    "GroupCommit",
    "LogReplacedError",
    "LogWriteError",
    "OfflineWriter",
    "RecoveryReport",
    "RepairReport",
    "RepeatedRunWarning",
    "StepJournal",
    "TornTailWarning",
    "TruncatedLogWarning",
    "WriterFailedError",
    "read_batches",
    "read_episodes",
    "read_records",
    "recover",
    "repair_log",
    "write_batches",
    "write_episodes",
]

# -- convenience -----------------------------------------------------------------------


def _write(
    path: str, items: Iterable[Any], kinds: tuple[type, ...], what: str, append: bool
) -> int:
    n = 0
    with OfflineWriter(path, append=append) as w:
        for x in items:
            if not isinstance(x, kinds):
                raise TypeError(f"{what}: got a {type(x).__name__}")
            w.write(cast(Record, x))  # checked against ``kinds`` just above
            n += 1
    return n


def write_batches(
    path: str, batches: Iterable[SampleBatch | MultiAgentBatch], append: bool = False
) -> int:
    """Writes batches to ``path``; returns how many."""
    return _write(path, batches, (SampleBatch, MultiAgentBatch), "write_batches", append)


def read_batches(path: str) -> Iterator[SampleBatch | MultiAgentBatch]:
    """Yields the batches of an offline log (episodes in it are skipped). Errors and
    warnings as :func:`read_records`."""
    return (r for r in read_records(path) if isinstance(r, (SampleBatch, MultiAgentBatch)))


def write_episodes(
    path: str, episodes: Iterable[SingleAgentEpisode | MultiAgentEpisode], append: bool = False
) -> int:
    """Writes episodes (their full state) to ``path``; returns how many."""
    return _write(path, episodes, (SingleAgentEpisode, MultiAgentEpisode), "write_episodes", append)


def read_episodes(path: str) -> Iterator[SingleAgentEpisode | MultiAgentEpisode]:
    """Yields the episodes of an offline log (batches in it are skipped). Errors and
    warnings as :func:`read_records`."""
    return (r for r in read_records(path) if isinstance(r, (SingleAgentEpisode, MultiAgentEpisode)))
