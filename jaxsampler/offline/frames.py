"""The offline log format: constants, frames, errors and the streaming readers."""

from __future__ import annotations

import gzip
import struct
import warnings
import zlib
from collections.abc import Iterator
from typing import Any, BinaryIO, cast

from jaxsampler.episodes import MultiAgentBatch, MultiAgentEpisode, SampleBatch, SingleAgentEpisode
from jaxsampler.episodes.codec import DecodeError, TruncatedDataError, Unpacker, packb, unpackb

FORMAT, VERSION = "jaxsampler.offline", 2
_HEADERS = {v: packb({"format": FORMAT, "version": v}) for v in (1, 2)}
_HEADER_LEN = len(_HEADERS[VERSION])  # the same for both versions
_MAGIC = b"\xc1JSL"
_HEAD = struct.Struct("<4sBQI")  # magic, kind, length, payload crc
_HEAD_CRC = struct.Struct("<I")
_FRAME_LEN = _HEAD.size + _HEAD_CRC.size  # 21
_RECORD, _END, _RESUME = 0, 1, 2
_CUT_HEAD = "the file ends inside a record header"
_NO_END = "no end frame (its writer crashed, or is still writing)"
_UNCLOSED = "ended without its end frame"
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
    if kind not in (_RECORD, _END, _RESUME) or (kind != _RECORD and length):
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


def _decode_record(payload: bytes, path: str, pos: int, kinds: tuple = _RECORD_TYPES) -> Record:
    try:
        record = unpackb(payload)
    except DecodeError as e:
        raise CorruptLogError(path, pos, f"record does not decode: {e}") from e
    if not isinstance(record, kinds):
        raise CorruptLogError(path, pos, f"a {type(record).__name__} is not a batch or episode")
    return record


def _warn_truncated(path: str, pos: int, what: str) -> None:
    warnings.warn(
        f"{path}: offline log ends early at byte {pos}: {what}; every intact record "
        "before it was read",
        TruncatedLogWarning,
        stacklevel=4,
    )


def _warn_unclosed(path: str, start: int, pos: int) -> None:
    warnings.warn(
        f"{path}: the writer session whose frames start at byte {start} {_UNCLOSED} at "
        f"byte {pos} (its writer crashed; a later writer appended after it); every intact "
        "record was read",
        TruncatedLogWarning,
        stacklevel=4,
    )


def _read_v2(
    f: BinaryIO,
    path: str,
    kinds: tuple | None = _RECORD_TYPES,
    start: int = _HEADER_LEN,
) -> Iterator[Any]:
    """The records of a version-2 log from byte ``start`` (``kinds=None``: their payloads,
    undecoded)."""
    pos, closed = start, False
    session = pos  # where the current writer session's frames begin
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
            yield payload if kinds is None else _decode_record(payload, path, pos, kinds)
        elif kind == _RESUME:
            _warn_unclosed(path, session, pos)
        closed = kind == _END
        pos += _FRAME_LEN + length
        if kind != _RECORD:
            session = pos


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


def read_records(path: str, *, offset: int | None = None) -> Iterator[Any]:
    """Yields every record of an offline log (version 1 or 2), in file order, streaming.

    ``offset``: read only the records from this byte on; it must be a frame boundary of an
    uncompressed version-2 log, as :attr:`OfflineWriter.offset` gives (``None``: from the
    start).

    Raises:
        CorruptLogError: the file is damaged or not an offline log (records before the
            damage have been yielded), or ``offset`` is not a frame boundary.
        ValueError: ``offset`` for a ``.gz`` or version-1 log, or a negative one.

    Warns:
        TruncatedLogWarning: the log ends early (see the module docstring).
    """
    path = str(path)
    with _open(path, "rb") as f:
        version = _read_header(f, path)
        if offset is None:
            yield from (_read_v2 if version == 2 else _read_v1)(f, path)
            return
        if version != 2 or path.endswith(".gz") or offset < _HEADER_LEN:
            raise ValueError(
                f"{path}: offset={offset} needs an uncompressed version-2 log and an offset "
                f"of at least {_HEADER_LEN} (an OfflineWriter's offset)"
            )
        f.seek(offset)
        yield from _read_v2(f, path, start=offset)


def read_payloads(path: str, offset: int | None = None) -> Iterator[bytes]:
    """The undecoded payloads of a version-2 log's records (from ``offset``, a frame
    boundary), with :func:`read_records`' checks and warnings."""
    path = str(path)
    with _open(path, "rb") as f:
        if _read_header(f, path) != 2:
            raise CorruptLogError(path, 0, "reading payloads needs a version-2 log")
        if offset is not None:
            f.seek(offset)
        yield from _read_v2(f, path, None, _HEADER_LEN if offset is None else offset)


def read_entries(path: str) -> Iterator[dict | list]:
    """Yields the map (or list) records of a version-2 log that holds them instead of
    batches (a step journal's commits), with :func:`read_records`' checks and warnings."""
    path = str(path)
    with _open(path, "rb") as f:
        if _read_header(f, path) != 2:
            raise CorruptLogError(path, 0, "a journal is a version 2 log")
        yield from cast(Iterator[dict | list], _read_v2(f, path, (dict, list)))


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
