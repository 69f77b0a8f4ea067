"""Episode ids: the one place that decides their format.

Ids are lowercase hex, 32 characters (RLlib's ``uuid4().hex`` shape). Ids that a sampler
assigns are deterministic per seed, so two runs with the same seed and calls give the
same ids; ids made anywhere else are random. A sampler's ids never repeat: a field that
outgrows its width (more than 65,535 resets, 16.7M envs or 4.3G episodes per env) makes
the id longer rather than wrap.
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np

__all__ = ["EpisodeIds", "agent_episode_id", "random_episode_id"]


def random_episode_id() -> str:
    """A fresh random id (``uuid4().hex``)."""
    return uuid.uuid4().hex


class EpisodeIds:
    """Deterministic episode ids of one sampler.

    ``ids(stream, count)`` is ``<run: 14 hex><resets: 4 hex><stream: 6 hex><count: 8 hex>``:
    ``run`` comes from the seed, ``resets`` counts the sampler's resets (:meth:`new_run`),
    ``stream`` is the env index (0 where a sampler numbers all episodes in one sequence)
    and ``count`` the episode's number within its stream.

    Args:
        seed: the sampler's seed.
        stream_offset: added to every stream: a sampler that holds global envs
            ``offset .. offset + n - 1`` (one process of several) numbers its local env ``i``
            as stream ``offset + i``, so its ids are those one sampler holding every env
            would give, and no two processes give the same id.
    """

    __slots__ = ("_run", "resets", "stream_offset")

    def __init__(self, seed: int, stream_offset: int = 0):
        if isinstance(stream_offset, bool) or not isinstance(stream_offset, (int, np.integer)):
            raise TypeError(f"stream_offset must be an int, got {stream_offset!r}")
        if stream_offset < 0:
            raise ValueError(f"stream_offset must be >= 0, got {stream_offset}")
        self._run = np.random.default_rng(seed).bytes(7).hex()
        self.resets = 0
        self.stream_offset = int(stream_offset)

    def get_state(self) -> dict[str, Any]:
        """What the next ids depend on besides the streams: the run prefix (from the seed)
        and the reset count, for checkpoints."""
        return {"run": self._run, "resets": self.resets}

    def set_state(self, state: dict[str, Any]) -> None:
        """Continues the id space :meth:`get_state` describes (the stream offset stays)."""
        self._run, self.resets = str(state["run"]), int(state["resets"])

    def new_run(self) -> None:
        """Starts a new id space after a reset (ids never repeat within a sampler)."""
        self.resets += 1

    def __call__(self, stream: int, count: int) -> str:
        return f"{self._run}{self.resets:04x}{stream + self.stream_offset:06x}{count:08x}"

    def many(self, streams: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """``self(stream, count)`` of each pair, as one ``<U32`` array (vectorized: the
        hex digits come from shifts, not from a string format per id)."""
        streams, counts = np.asarray(streams, np.int64), np.asarray(counts, np.int64)
        if self.stream_offset:
            streams = streams + self.stream_offset
        head = f"{self._run}{self.resets:04x}"
        if len(head) != 18 or (
            len(streams) and (streams.max() >= 16**6 or counts.max() >= 16**8)
        ):  # wider than the fixed layout: format each
            return np.array(
                [self(s - self.stream_offset, c) for s, c in zip(streams.tolist(), counts.tolist())]
            )
        prefix = np.array([ord(ch) for ch in head], np.uint32)
        codes = np.empty((len(streams), 32), np.uint32)
        codes[:, :18] = prefix
        codes[:, 18:24] = _HEX[(streams[:, None] >> np.arange(20, -1, -4)) & 15]
        codes[:, 24:] = _HEX[(counts[:, None] >> np.arange(28, -1, -4)) & 15]
        return codes.view("<U32").reshape(len(streams))


_HEX = np.array([ord(ch) for ch in "0123456789abcdef"], np.uint32)


def agent_episode_id(episode_id: str, agent_index: int) -> str:
    """The id of an agent's episode within the multi-agent episode ``episode_id``."""
    return f"{episode_id}{agent_index:04x}"
