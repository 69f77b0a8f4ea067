"""Episode ids: the one place that decides their format.

Every id is 32 lowercase hex characters (RLlib's ``uuid4().hex`` shape). Ids that a
sampler assigns are deterministic per seed, so two runs with the same seed and calls
give the same ids; ids made anywhere else are random.
"""

from __future__ import annotations

import uuid

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
    """

    __slots__ = ("_run", "resets")

    def __init__(self, seed: int):
        self._run = np.random.default_rng(seed).bytes(7).hex()
        self.resets = 0

    def new_run(self) -> None:
        """Starts a new id space after a reset (ids never repeat within a sampler)."""
        self.resets += 1

    def __call__(self, stream: int, count: int) -> str:
        return f"{self._run}{self.resets:04x}{stream:06x}{count:08x}"


def agent_episode_id(episode_id: str, agent_index: int) -> str:
    """The id of an agent's episode within the multi-agent episode ``episode_id``."""
    return f"{episode_id}{agent_index:04x}"
