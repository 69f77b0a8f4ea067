"""Offline logs: write batches and episodes to files and read them back exactly.

Format: a stream of msgpack frames (https://msgpack.org), optionally gzip-compressed
(paths ending in ``.gz``). The first frame is the header ``{"format":
"jaxsampler.offline", "version": 1}``; every later frame is one record: a
:class:`SampleBatch`, :class:`MultiAgentBatch`, :class:`SingleAgentEpisode` or
:class:`MultiAgentEpisode`. Files can be appended to (one writer at a time) and read
while streaming, record by record.

The records are encoded with :mod:`jaxsampler.codec` (msgpack with exact numpy arrays),
the same codec as the policy server's wire format.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO, cast

from jaxsampler.codec import packb, unpacker
from jaxsampler.episodes import MultiAgentBatch, MultiAgentEpisode, SampleBatch, SingleAgentEpisode

__all__ = [
    "OfflineWriter",
    "read_batches",
    "read_episodes",
    "read_records",
    "write_batches",
    "write_episodes",
]

FORMAT, VERSION = "jaxsampler.offline", 1


# -- files -----------------------------------------------------------------------------


def _open(path: str, mode: str) -> BinaryIO:
    path = str(path)
    if path.endswith(".gz"):
        return cast(BinaryIO, gzip.open(path, mode))
    return cast(BinaryIO, open(path, mode))  # mode is always binary ("rb", "wb", "ab")


#: What an offline log holds: batches or episodes.
Record = SampleBatch | MultiAgentBatch | SingleAgentEpisode | MultiAgentEpisode


class OfflineWriter:
    """Appends records (batches or episodes) to an offline log file, one msgpack frame each.

    Args:
        path: the file; ``.gz`` compresses with gzip.
        append: add to an existing file (its header is kept) instead of truncating it.

    Use as a context manager, or call :meth:`close`. Not thread-safe.
    """

    def __init__(self, path: str, append: bool = False):
        exists = append and os.path.exists(str(path)) and os.path.getsize(str(path)) > 0
        self._f = _open(path, "ab" if append else "wb")
        if not exists:
            self._f.write(packb({"format": FORMAT, "version": VERSION}))

    def write(self, record: Record) -> None:
        """Appends one record (a batch or an episode) as one frame."""
        if not isinstance(
            record, (SampleBatch, MultiAgentBatch, SingleAgentEpisode, MultiAgentEpisode)
        ):
            raise TypeError(f"cannot log a {type(record).__name__}: give a batch or an episode")
        self._f.write(packb(record))

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    def __enter__(self) -> OfflineWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_records(path: str) -> Iterator[Any]:
    """Yields every record of an offline log, in file order (streaming)."""
    with _open(path, "rb") as f:
        frames = unpacker(f)
        header = next(frames, None)
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise ValueError(f"{path}: not a jaxsampler offline log (header {header!r})")
        if header.get("version") != VERSION:
            raise ValueError(f"{path}: unsupported offline log version {header.get('version')!r}")
        yield from frames


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
    """Yields the batches of an offline log (episodes in it are skipped)."""
    return (r for r in read_records(path) if isinstance(r, (SampleBatch, MultiAgentBatch)))


def write_episodes(
    path: str, episodes: Iterable[SingleAgentEpisode | MultiAgentEpisode], append: bool = False
) -> int:
    """Writes episodes (their full state) to ``path``; returns how many."""
    return _write(path, episodes, (SingleAgentEpisode, MultiAgentEpisode), "write_episodes", append)


def read_episodes(path: str) -> Iterator[SingleAgentEpisode | MultiAgentEpisode]:
    """Yields the episodes of an offline log (batches in it are skipped)."""
    return (r for r in read_records(path) if isinstance(r, (SingleAgentEpisode, MultiAgentEpisode)))
