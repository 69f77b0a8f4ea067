"""Offline logs: write batches and episodes to files and read them back exactly.

Format, version 2 (what :class:`OfflineWriter` writes; paths ending in ``.gz`` hold the
same bytes gzip-compressed)::

    header   msgpack {"format": "jaxsampler.offline", "version": 2}   (always these bytes)
    frame*   magic    4 bytes  b"\\xc1JSL"  (0xc1 is a byte msgpack never uses)
             kind     1 byte   0 = record, 1 = end of a writer session
             length   8 bytes  payload size, little-endian
             crc      4 bytes  CRC-32 of the payload, little-endian
             head_crc 4 bytes  CRC-32 of the 17 bytes above, little-endian
             payload  msgpack (:mod:`jaxsampler.episodes.codec`): a :class:`SampleBatch`,
                      :class:`MultiAgentBatch`, :class:`SingleAgentEpisode` or
                      :class:`MultiAgentEpisode`; empty for an end frame

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
it to version 2.

Appending (``OfflineWriter(path, append=True)``) first follows the frame headers: an
unfinished last record left by a crashed writer is cut away with a
:class:`TornTailWarning` naming the bytes removed; damage before intact frames raises
instead (nothing is ever written over or cut from intact data). ``.gz`` files are read
whole first and any damage raises, since compressed bytes cannot be cut at a record.

Errors: every damage raises :class:`CorruptLogError` (a ``ValueError``) naming the file
and the byte offset (in the decompressed stream for ``.gz``): a checksum mismatch, a
damaged header or marker, bytes after the last record, a record that does not decode.
A log that ends inside a record, a truncated gzip stream, or a log without its end frame
(the writer crashed or is still writing) warns with :class:`TruncatedLogWarning`
after yielding every intact record. Reading never resynchronises silently:
:func:`repair_log` does that, and reports what it dropped.
"""

from __future__ import annotations

import dataclasses
import gzip
import mmap
import os
import struct
import tempfile
import warnings
import zlib
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO, cast

from jaxsampler.episodes import MultiAgentBatch, MultiAgentEpisode, SampleBatch, SingleAgentEpisode
from jaxsampler.episodes.codec import (
    DecodeError,
    TruncatedDataError,
    Unpacker,
    packb,
    scan,
    unpackb,
)

__all__ = [
    "CorruptLogError",
    "OfflineWriter",
    "RepairReport",
    "TornTailWarning",
    "TruncatedLogWarning",
    "read_batches",
    "read_episodes",
    "read_records",
    "repair_log",
    "write_batches",
    "write_episodes",
]

FORMAT, VERSION = "jaxsampler.offline", 2
_HEADERS = {v: packb({"format": FORMAT, "version": v}) for v in (1, 2)}
_HEADER_LEN = len(_HEADERS[VERSION])  # the same for both versions
_MAGIC = b"\xc1JSL"
_HEAD = struct.Struct("<4sBQI")  # magic, kind, length, payload crc
_HEAD_CRC = struct.Struct("<I")
_FRAME_LEN = _HEAD.size + _HEAD_CRC.size  # 21
_RECORD, _END = 0, 1
_CUT_HEAD = "the file ends inside a record header"
_NO_END = "no end frame (its writer crashed, or is still writing)"
_CHUNK = 1 << 24  # reads of a declared length go in chunks: a lie allocates nothing

#: What an offline log holds: batches or episodes.
Record = SampleBatch | MultiAgentBatch | SingleAgentEpisode | MultiAgentEpisode
_RECORD_TYPES = (SampleBatch, MultiAgentBatch, SingleAgentEpisode, MultiAgentEpisode)


class CorruptLogError(ValueError):
    """An offline log is damaged (or is not one). ``path`` and ``offset`` (a byte offset,
    in the decompressed stream for ``.gz``) say where; the message says what."""

    def __init__(self, path: str, offset: int, problem: str):
        super().__init__(f"{path}: corrupt offline log at byte {offset}: {problem}")
        self.path, self.offset, self.problem = path, offset, problem

    def __reduce__(self) -> tuple:
        return (type(self), (self.path, self.offset, self.problem))


class TruncatedLogWarning(UserWarning):
    """An offline log ends early: inside a record, inside its gzip stream, or without
    the end frame its writer writes on close (a crash, or a writer still writing). The
    intact records before that point were all yielded."""


class TornTailWarning(TruncatedLogWarning):
    """:class:`OfflineWriter` (``append=True``) removed an unfinished last record (left
    by a writer that crashed) before appending; the message says how many bytes."""


# -- frames ----------------------------------------------------------------------------


def _open(path: str, mode: str) -> BinaryIO:
    if path.endswith(".gz"):
        return cast(BinaryIO, gzip.open(path, mode))
    return cast(BinaryIO, open(path, mode))  # mode is always binary ("rb", "wb", "ab")


def _frame_head(kind: int, payload: bytes) -> bytes:
    head = _HEAD.pack(_MAGIC, kind, len(payload), zlib.crc32(payload))
    return head + _HEAD_CRC.pack(zlib.crc32(head))


def _parse_head(head: bytes | memoryview) -> tuple[int, int, int] | str:
    """(kind, payload length, payload crc) of a complete frame header, or the problem."""
    magic, kind, length, crc = _HEAD.unpack_from(head)
    if magic != _MAGIC:
        return "no record marker here (damaged data, or bytes after the last record)"
    if zlib.crc32(head[: _HEAD.size]) != _HEAD_CRC.unpack_from(head, _HEAD.size)[0]:
        return "record header checksum mismatch"
    if kind not in (_RECORD, _END) or (kind == _END and length):
        return f"unknown frame kind {kind}"
    return kind, length, crc


def _read(f: BinaryIO, n: int, path: str, pos: int) -> tuple[bytes, bool]:
    """Up to ``n`` bytes, read in bounded chunks; also whether a gzip stream ended early."""
    parts, got = [], 0
    try:
        while got < n:
            part = f.read(min(n - got, _CHUNK))
            if not part:
                break
            parts.append(part)
            got += len(part)
    except EOFError:  # gzip: "Compressed file ended before the end-of-stream marker"
        return b"".join(parts), True
    except (OSError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise CorruptLogError(path, pos + got, f"damaged gzip data ({e})") from e
    return b"".join(parts), False


def _read_header(f: BinaryIO, path: str) -> int:
    """Reads the file header; returns the format version."""
    head, cut = _read(f, _HEADER_LEN, path, 0)
    for version, expected in _HEADERS.items():
        if head == expected:
            return version
    if (cut or len(head) < _HEADER_LEN) and any(h.startswith(head) for h in _HEADERS.values()):
        raise CorruptLogError(path, 0, "the file ends inside its header")
    try:
        header = unpackb(head)
    except ValueError:
        header = head
    if isinstance(header, dict) and header.get("format") == FORMAT:
        problem = f"unsupported offline log version {header.get('version')!r}"
    else:
        problem = f"not a jaxsampler offline log (header {header!r})"
    raise CorruptLogError(path, 0, problem)


def _decode_record(payload: bytes, path: str, pos: int) -> Record:
    try:
        record = unpackb(payload)
    except DecodeError as e:
        raise CorruptLogError(path, pos, f"record does not decode: {e}") from e
    if not isinstance(record, _RECORD_TYPES):
        raise CorruptLogError(path, pos, f"a {type(record).__name__} is not a batch or episode")
    return record


def _warn_truncated(path: str, pos: int, what: str) -> None:
    warnings.warn(
        f"{path}: offline log ends early at byte {pos}: {what}; every intact record "
        "before it was read",
        TruncatedLogWarning,
        stacklevel=4,
    )


def _read_v2(f: BinaryIO, path: str) -> Iterator[Record]:
    pos, closed = _HEADER_LEN, False
    while True:
        head, cut = _read(f, _FRAME_LEN, path, pos)
        if not head and not cut:
            if not closed:
                _warn_truncated(path, pos, _NO_END)
            return
        if len(head) < _FRAME_LEN:
            if not _MAGIC.startswith(head[:4]):
                raise CorruptLogError(path, pos, "bytes after the last record")
            _warn_truncated(path, pos, "the gzip stream ends early" if cut else _CUT_HEAD)
            return
        parsed = _parse_head(head)
        if isinstance(parsed, str):
            raise CorruptLogError(path, pos, parsed)
        kind, length, crc = parsed
        payload, cut = _read(f, length, path, pos + _FRAME_LEN)
        if len(payload) < length:
            _warn_truncated(
                path, pos, f"the last record declares {length} bytes, {len(payload)} are present"
            )
            return
        if zlib.crc32(payload) != crc:
            raise CorruptLogError(path, pos, "record checksum mismatch")
        if kind == _RECORD:
            yield _decode_record(payload, path, pos)
        closed = kind == _END
        pos += _FRAME_LEN + length


def _read_v1(f: BinaryIO, path: str) -> Iterator[Any]:
    frames = Unpacker(f)
    while True:
        pos = _HEADER_LEN + frames.offset
        try:
            record = next(frames)
        except StopIteration:
            return
        except TruncatedDataError:
            _warn_truncated(path, pos, "the file ends inside the last record")
            return
        except DecodeError as e:
            raise CorruptLogError(path, pos, f"record does not decode: {e}") from e
        except EOFError:
            _warn_truncated(path, pos, "the gzip stream ends early")
            return
        except (OSError, zlib.error) as e:
            raise CorruptLogError(path, pos, f"damaged gzip data ({e})") from e
        if not isinstance(record, _RECORD_TYPES):
            raise CorruptLogError(path, pos, f"a {type(record).__name__} is not a batch or episode")
        yield record


def read_records(path: str) -> Iterator[Any]:
    """Yields every record of an offline log (version 1 or 2), in file order, streaming.

    Raises:
        CorruptLogError: the file is damaged or not an offline log (records before the
            damage have been yielded).

    Warns:
        TruncatedLogWarning: the log ends early (see the module docstring).
    """
    path = str(path)
    with _open(path, "rb") as f:
        version = _read_header(f, path)
        yield from (_read_v2 if version == 2 else _read_v1)(f, path)


# -- writing ---------------------------------------------------------------------------


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
            :class:`CorruptLogError` (:func:`repair_log` rewrites it in version 2).

    Use as a context manager, or call :meth:`close` (which writes the end frame readers
    look for). Not thread-safe; one writer per file at a time.
    """

    def __init__(self, path: str, append: bool = False):
        self.path = str(path)
        exists = append and os.path.exists(self.path) and os.path.getsize(self.path) > 0
        self.version = _prepare_append(self.path) if exists else VERSION
        self._f = _open(self.path, "ab" if exists else "wb")
        if not exists or self.version == 0:  # 0: the old file held only part of a header
            self.version = VERSION
            self._f.write(_HEADERS[VERSION])

    def write(self, record: Record) -> None:
        """Appends one record (a batch or an episode) as one frame."""
        if not isinstance(record, _RECORD_TYPES):
            raise TypeError(f"cannot log a {type(record).__name__}: give a batch or an episode")
        payload = packb(record)
        if self.version == 2:
            self._f.write(_frame_head(_RECORD, payload))
        self._f.write(payload)

    def flush(self) -> None:
        """Pushes the records written so far to the file (through gzip's compressor for
        ``.gz``) without closing it; only :meth:`close` writes the end frame."""
        self._f.flush()

    def close(self) -> None:
        """Writes the end frame and closes the file (idempotent)."""
        if not self._f.closed:
            if self.version == 2:
                self._f.write(_frame_head(_END, b""))
            self._f.close()

    def __enter__(self) -> OfflineWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _walk_v2(buf: Any, pos: int, size: int) -> tuple[int, int | None]:
    """Follows the frame headers from ``pos``; returns (end of the frames followed, start
    of the first frame that is not intact or None). Checks the last frame's payload."""
    last = None
    while pos < size:
        if size - pos < _FRAME_LEN:
            return pos, pos
        parsed = _parse_head(buf[pos : pos + _FRAME_LEN])
        if isinstance(parsed, str) or pos + _FRAME_LEN + parsed[1] > size:
            return pos, pos
        last, pos = (pos, parsed[2]), pos + _FRAME_LEN + parsed[1]
    if last is not None and zlib.crc32(buf[last[0] + _FRAME_LEN : pos]) != last[1]:
        return last[0], last[0]
    return pos, None


def _next_frame(buf: Any, pos: int, size: int) -> int | None:
    """Start of the first intact frame (header, length, payload checksum) at or after
    ``pos``, or None."""
    while True:
        pos = buf.find(_MAGIC, pos)
        if pos < 0 or size - pos < _FRAME_LEN:
            return None
        parsed = _parse_head(buf[pos : pos + _FRAME_LEN])
        if not isinstance(parsed, str):
            end = pos + _FRAME_LEN + parsed[1]
            if end <= size and zlib.crc32(buf[pos + _FRAME_LEN : end]) == parsed[2]:
                return pos
        pos += 1


def _walk_v1(buf: Any, pos: int, size: int) -> tuple[int, int | None, bool]:
    """(end of the intact documents, start of the first bad one or None, whether that
    one only runs past the end of the file)."""
    view = memoryview(buf)
    try:
        while pos < size:
            pos = scan(view, pos)
    except TruncatedDataError:
        return pos, pos, True
    except DecodeError:
        return pos, pos, False
    finally:
        view.release()
    return pos, None, False


def _prepare_append(path: str) -> int:
    """Checks an existing log before appending: returns its version (0: it holds only
    the start of a header, which is cut away), cuts a torn tail, raises on damage."""
    if path.endswith(".gz"):
        return _check_gz(path)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        head = f.read(_HEADER_LEN)
        if len(head) < _HEADER_LEN and _HEADERS[VERSION].startswith(head):
            _cut(f, path, 0, size)
            return 0
        f.seek(0)
        version = _read_header(f, path)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if version == 2:
                end, bad = _walk_v2(buf, _HEADER_LEN, size)
                later = None if bad is None else _next_frame(buf, bad + 1, size)
            else:
                end, bad, torn = _walk_v1(buf, _HEADER_LEN, size)
                if bad is not None:  # no framing: cutting could remove intact records
                    raise CorruptLogError(
                        path,
                        bad,
                        "damaged or torn version-1 log; version 1 has no framing, so it is "
                        "not cut automatically: run repair_log first (it rewrites the log "
                        "in version 2)",
                    )
                later = None
        if later is not None:
            raise CorruptLogError(
                path,
                cast(int, bad),
                "damaged record before intact data; appending would hide it: run repair_log first",
            )
        if bad is not None:
            _cut(f, path, bad, size)
    return version


def _check_gz(path: str) -> int:
    """Reads a whole ``.gz`` log before appending (compressed bytes cannot be cut back to a
    record boundary): any damage or early end raises, a missing end frame is fine."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with _open(path, "rb") as f:
                version = _read_header(f, path)
                for _ in (_read_v2 if version == 2 else _read_v1)(f, path):
                    pass
        except CorruptLogError as e:
            raise CorruptLogError(
                path, e.offset, f"{e.problem}; not appending: run repair_log first"
            ) from e
    for w in caught:
        if issubclass(w.category, TruncatedLogWarning) and _NO_END not in str(w.message):
            raise CorruptLogError(
                path, 0, f"{w.message}; not appending to a cut .gz log: run repair_log first"
            )
    return version


def _cut(f: BinaryIO, path: str, at: int, size: int) -> None:
    warnings.warn(
        f"{path}: removed {size - at} bytes of an unfinished last record at byte {at} "
        "(a writer crashed) before appending",
        TornTailWarning,
        stacklevel=4,
    )
    f.truncate(at)


# -- repair ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RepairReport:
    """What :func:`repair_log` kept and dropped.

    Attributes:
        path: the log repaired.
        out_path: where the intact records were written (``path`` when repaired in
            place; unchanged files are not rewritten).
        version: the input's format version (the output is always version 2).
        records: intact records kept.
        dropped: ``(offset, length)`` of every damaged byte range skipped (offsets in the
            decompressed stream for ``.gz``).
        end_frame: whether the input ended with an end frame (closed by its writer).
        truncated: whether the input's end was lost: its last bytes were dropped or its
            gzip stream ended early.
    """

    path: str
    out_path: str
    version: int
    records: int
    dropped: tuple[tuple[int, int], ...]
    end_frame: bool
    truncated: bool

    @property
    def bytes_dropped(self) -> int:
        """Total length of the damaged byte ranges skipped (:attr:`dropped`)."""
        return sum(n for _, n in self.dropped)

    @property
    def clean(self) -> bool:
        """Nothing was dropped and the input was a closed version-2 log."""
        return (
            not self.dropped and self.version == VERSION and self.end_frame and not self.truncated
        )


def _intact_v2(
    buf: Any, pos: int, size: int, path: str
) -> tuple[list[bytes], list[tuple[int, int]], bool]:
    """The payloads of the intact records, the damaged ranges, whether it ended closed."""
    payloads: list[bytes] = []
    dropped: list[tuple[int, int]] = []
    ended = False
    while pos < size:
        parsed = _parse_head(buf[pos : pos + _FRAME_LEN]) if size - pos >= _FRAME_LEN else ""
        if not isinstance(parsed, str):
            kind, length, crc = parsed
            end = pos + _FRAME_LEN + length
            payload = bytes(buf[pos + _FRAME_LEN : end]) if end <= size else b""
            if end <= size and zlib.crc32(payload) == crc and _decodes(payload, kind, path):
                if kind == _RECORD:
                    payloads.append(payload)
                pos, ended = end, kind == _END
                continue
        nxt = _next_frame(buf, pos + 1, size)
        stop = size if nxt is None else nxt
        dropped.append((pos, stop - pos))
        pos, ended = stop, False
    return payloads, dropped, ended


def _decodes(payload: bytes, kind: int, path: str) -> bool:
    try:
        return kind == _END or _decode_record(payload, path, 0) is not None
    except CorruptLogError:
        return False


def _intact_v1(
    buf: Any, pos: int, size: int, path: str
) -> tuple[list[bytes], list[tuple[int, int]], bool]:
    """The intact records before the first damage (version 1 cannot resync)."""
    payloads = []
    view = memoryview(buf)
    try:
        while pos < size:
            try:
                stop = scan(view, pos)
            except DecodeError:
                break
            payload = bytes(view[pos:stop])
            if not _decodes(payload, _RECORD, path):
                break
            payloads.append(payload)
            pos = stop
    finally:
        view.release()
    return payloads, [(pos, size - pos)] if pos < size else [], False


def repair_log(path: str, out_path: str | None = None) -> RepairReport:
    """Keeps every intact record of a damaged log, resynchronising on the frame markers.

    Writes the intact records as a closed version-2 log to ``out_path``, or, when that is
    None, replaces ``path`` (atomically, via a temporary file beside it) unless the log
    was already clean. Version-1 logs, which have no markers, keep the records before
    the first damage. ``.gz`` inputs are decompressed as far as their gzip stream goes;
    ``out_path`` ending in ``.gz`` is compressed.

    Raises:
        CorruptLogError: the header is not an offline log's (nothing to repair).
    """
    path = str(path)
    with tempfile.TemporaryFile() as tmp:
        raw_end = _decompressed(path, tmp)
        size = tmp.seek(0, os.SEEK_END)
        tmp.seek(0)
        try:
            version, start = _read_header(cast(BinaryIO, tmp), path), _HEADER_LEN
        except CorruptLogError:
            version, start = 0, 0  # a damaged header: resync on the frames if there are any
        payloads: list[bytes] = []
        dropped: list[tuple[int, int]] = []
        ended = False
        if size > start:
            with mmap.mmap(tmp.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                if version == 0:
                    nxt = _next_frame(buf, 0, size)
                    if nxt is None:
                        raise CorruptLogError(path, 0, "not a jaxsampler offline log, no record")
                    version, start = VERSION, nxt
                    dropped.append((0, nxt))
                intact = _intact_v2 if version == 2 else _intact_v1
                payloads, more, ended = intact(buf, start, size, path)
                dropped += more
        cut = raw_end is not None or (bool(dropped) and sum(dropped[-1]) == size)
    report = RepairReport(
        path, out_path or path, version, len(payloads), tuple(dropped), ended, cut
    )
    if out_path is None and report.clean:
        return report
    target = out_path or path
    fd, tmp_path = tempfile.mkstemp(
        dir=os.path.dirname(os.path.abspath(target)), suffix=".gz" if target.endswith(".gz") else ""
    )
    os.close(fd)
    mode = os.stat(target).st_mode if os.path.exists(target) else 0o666 & ~_umask()
    os.chmod(tmp_path, mode & 0o7777)  # mkstemp makes 0600; keep the file's own mode
    try:
        with _open(tmp_path, "wb") as out:
            out.write(_HEADERS[VERSION])
            for payload in payloads:
                out.write(_frame_head(_RECORD, payload))
                out.write(payload)
            out.write(_frame_head(_END, b""))
        os.replace(tmp_path, target)
    finally:
        if os.path.exists(tmp_path):
            os.unlink(tmp_path)
    return report


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _decompressed(path: str, out: Any) -> int | None:
    """Copies the log's (decompressed) bytes to ``out``; returns the decompressed size
    where a ``.gz`` stream ended early or was damaged, else None."""
    with _open(path, "rb") as f:
        pos = 0
        while True:
            try:
                part = f.read(_CHUNK)
            except (EOFError, OSError, zlib.error):
                return pos
            if not part:
                return None
            out.write(part)
            pos += len(part)


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
