"""The offline log writer and the checks it runs before appending."""

from __future__ import annotations

import mmap
import os
import warnings
import zlib
from typing import Any, BinaryIO, cast

from jaxsampler.episodes.codec import DecodeError, TruncatedDataError, packb, scan
from jaxsampler.offline.frames import (
    _END,
    _FRAME_LEN,
    _HEADER_LEN,
    _HEADERS,
    _NO_END,
    _RECORD,
    _RECORD_TYPES,
    VERSION,
    CorruptLogError,
    Record,
    TornTailWarning,
    TruncatedLogWarning,
    _frame_head,
    _next_frame,
    _open,
    _parse_head,
    _read_header,
    _read_v1,
    _read_v2,
)


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
