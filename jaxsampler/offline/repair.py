"""Repairing a damaged offline log: keep every intact record, report what was dropped."""

from __future__ import annotations

import dataclasses
import mmap
import os
import tempfile
import zlib
from typing import Any, BinaryIO, cast

from jaxsampler.episodes.codec import DecodeError, scan
from jaxsampler.offline.frames import (
    _CHUNK,
    _END,
    _FRAME_LEN,
    _HEADER_LEN,
    _HEADERS,
    _RECORD,
    VERSION,
    CorruptLogError,
    _decode_record,
    _frame_head,
    _next_frame,
    _open,
    _parse_head,
    _read_header,
)


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
        return kind != _RECORD or _decode_record(payload, path, 0) is not None
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
