"""The checks an :class:`~jaxsampler.offline.OfflineWriter` runs before appending to a log:
cut a crashed writer's torn tail, refuse damage, and say whether the last session closed."""

from __future__ import annotations

import mmap
import os
import warnings
import zlib
from typing import Any, BinaryIO, cast

import numpy as np

from jaxsampler.episodes import MultiAgentBatch, MultiAgentEpisode, SampleBatch
from jaxsampler.episodes.codec import DecodeError, TruncatedDataError, scan
from jaxsampler.offline.frames import (
    _END,
    _FRAME_LEN,
    _HEADER_LEN,
    _HEADERS,
    _NO_END,
    _RECORD,
    _UNCLOSED,
    VERSION,
    CorruptLogError,
    TornTailWarning,
    TruncatedLogWarning,
    _decode_record,
    _next_frame,
    _open,
    _parse_head,
    _read_header,
    _read_v1,
    _read_v2,
)


def _walk_v2(buf: Any, pos: int, size: int) -> tuple[int, int | None, int | None, int | None]:
    """Follows the frame headers from ``pos``; returns (end of the frames followed, start
    of the first frame that is not intact or None, kind of the last intact frame or None,
    start of the first record of the last writer session that wrote one or None).
    Checks the last frame's payload."""
    last: tuple[int, int, int] | None = None  # start, payload crc, kind
    first = session_first = None  # first record of the last session with one / this one
    while pos < size:
        if size - pos < _FRAME_LEN:
            return pos, pos, _kind(last), first
        parsed = _parse_head(buf[pos : pos + _FRAME_LEN])
        if isinstance(parsed, str) or pos + _FRAME_LEN + parsed[1] > size:
            return pos, pos, _kind(last), first
        if parsed[0] != _RECORD:
            session_first = None  # an end or resume frame: the next record starts a session
        elif session_first is None:
            session_first = first = pos
        last, pos = (pos, parsed[2], parsed[0]), pos + _FRAME_LEN + parsed[1]
    if last is not None and zlib.crc32(buf[last[0] + _FRAME_LEN : pos]) != last[1]:
        # the frame before it is not checked: say "unclosed"
        return last[0], last[0], None, None if first == last[0] else first
    return pos, None, _kind(last), first


def _kind(last: tuple[int, int, int] | None) -> int | None:
    return None if last is None else last[2]


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


def prepare_append(path: str) -> tuple[int, bool, int | None]:
    """Checks an existing log before appending: returns its version (0: it holds only
    the start of a header, which is cut away), whether its last writer session ended
    with its end frame (or wrote no frame), and where the first record of the last session
    that wrote one starts (``None``: none, or not a plain version-2 log); cuts a torn
    tail, raises on damage."""
    if path.endswith(".gz"):
        return (*check_gz(path), None)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        head = f.read(_HEADER_LEN)
        if len(head) < _HEADER_LEN and _HEADERS[VERSION].startswith(head):
            _cut(f, path, 0, size)
            return 0, True, None
        f.seek(0)
        version = _read_header(f, path)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            first = None
            if version == 2:
                end, bad, last, first = _walk_v2(buf, _HEADER_LEN, size)
                ended = bad is None and last in (None, _END)
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
                later, ended = None, True  # version 1 has no sessions
        if later is not None:
            raise CorruptLogError(
                path,
                cast(int, bad),
                "damaged record before intact data; appending would hide it: run repair_log first",
            )
        if bad is not None:
            _cut(f, path, bad, size)
            first = None if first is not None and first >= bad else first
    return version, ended, first


def check_gz(path: str) -> tuple[int, bool]:
    """Reads a whole ``.gz`` log before appending (compressed bytes cannot be cut back to a
    record boundary): any damage or early end raises, a missing end frame is fine (and
    returned: (version, whether the last session ended with its end frame))."""
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
    ended = True
    for w in caught:
        if not issubclass(w.category, TruncatedLogWarning) or _UNCLOSED in str(w.message):
            continue
        if _NO_END not in str(w.message):
            raise CorruptLogError(
                path, 0, f"{w.message}; not appending to a cut .gz log: run repair_log first"
            )
        ended = False
    return version, ended


def _cut(f: BinaryIO, path: str, at: int, size: int) -> None:
    warnings.warn(
        f"{path}: removed {size - at} bytes of an unfinished last record at byte {at} "
        "(a writer crashed) before appending",
        TornTailWarning,
        stacklevel=4,
    )
    f.truncate(at)


class RepeatedRunWarning(UserWarning):
    """The first record an appending :class:`~jaxsampler.offline.OfflineWriter` writes
    holds a step (an episode id and step index; of a multi-agent episode, an agent's step)
    that the first record of the log's last writer session holds too: the same run was
    written again (a sampler restarted with the same seed and deterministic episode ids),
    and anything that groups rows by ``eps_id`` would merge two runs' episodes."""


def warn_if_repeated(path: str, at: int, record: Any) -> None:
    """Warns :class:`RepeatedRunWarning` when ``record`` and the record at byte ``at`` of
    ``path`` share a step. Continuations (a resumed sampler, recovered steps) share ids
    but never steps, so they pass."""
    with open(path, "rb") as f:
        f.seek(at)
        head = f.read(_FRAME_LEN)
        parsed = _parse_head(head)
        if isinstance(parsed, str):
            return
        payload = f.read(parsed[1])
    try:
        earlier = _decode_record(payload, path, at)
    except CorruptLogError:
        return  # damage is the readers' to report, where it is
    both = _steps(earlier) & _steps(record)
    if both:
        eid = str(min(both)[1])
        warnings.warn(
            f"{path}: the first record appended holds {len(both)} step(s) that the log's last "
            f"writer session also wrote first (episode {eid!r}, ...): the same run is being "
            "written again, so rows grouped by eps_id would merge two runs' episodes. Give "
            "the new run another seed, or HostSampler(deterministic_ids=False)",
            RepeatedRunWarning,
            stacklevel=4,
        )


def _steps(record: Any) -> set[tuple]:
    """(policy, episode id, step) of every step ``record`` holds ((agent, episode id,
    agent step) of a multi-agent episode's)."""
    if isinstance(record, MultiAgentBatch):
        return {s for pid, b in record.policy_batches.items() for s in _batch_steps(pid, b)}
    if isinstance(record, SampleBatch):
        return _batch_steps(None, record)
    if isinstance(record, MultiAgentEpisode):  # agent steps: recovery may complete an
        return {  # agent's steps of env steps whose other agents' steps are stored
            (a, str(record.id_), t)
            for a, sa in record.agent_episodes.items()
            for t in range(sa.t_started, sa.t_started + len(sa))
        }
    t0 = record.t_started
    return {(None, str(record.id_), t) for t in range(t0, t0 + len(record))}


def _batch_steps(pid: Any, batch: SampleBatch) -> set[tuple]:
    if "eps_id" not in batch or "t" not in batch:
        return set()
    eids, ts = np.asarray(batch["eps_id"]).tolist(), np.asarray(batch["t"]).tolist()
    return {(pid, str(e), int(t)) for e, t in zip(eids, ts)}
