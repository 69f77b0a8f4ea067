"""What a device sampler needs to overlap host work with the device's: rollout buffers
used in turn, chunk counts read on the device, a rollout dispatched ahead of the next
call, and the weights-version tags of the samples such a rollout produces.

JAX dispatch is asynchronous: a jitted rollout call returns at once and the device works
while the host copies and converts earlier chunks. Two things make that safe here:

* the rollout donates its buffers (writes the next chunk into the previous chunk's
  arrays), so a chunk that the host has not copied yet must not be passed back:
  :class:`BufferRing` hands out the buffers of the chunk *before* the newest one;
* deciding whether a call needs another chunk reads only two integers per chunk
  (:func:`chunk_counts`, computed on the device), not the whole chunk.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxsampler.types import Trajectory

__all__ = [
    "WEIGHTS_SEQ_NO",
    "BufferRing",
    "Prefetched",
    "WeightsVersion",
    "chunk_counts",
    "copy_state",
    "tag_chunk",
]

#: the extra (per-step column of episodes and batches) that holds the weights version
#: that produced each step: the name RLlib's env runners give it
WEIGHTS_SEQ_NO = "weights_seq_no"


class BufferRing:
    """The device buffers of the last rollout chunks of one rollout program, handed back
    to the rollout (which donates them) only once no pending chunk lives in them.

    Args:
        depth: how many chunks may be alive at once: ``1`` (each chunk is copied to the
            host before the next is dispatched: the previous chunk's buffers are reused)
            or ``2`` (the next chunk is dispatched while the last one is still being
            copied: the buffers of the one before it are reused, double buffering).
    """

    def __init__(self, depth: int):
        if depth not in (1, 2):
            raise ValueError(f"depth must be 1 or 2, got {depth!r}")
        self.depth = depth
        self._held: list[Trajectory] = []

    def take(self) -> Trajectory | None:
        """Buffers the next rollout may overwrite (``None``: it allocates new ones)."""
        if len(self._held) == self.depth:
            return self._held.pop(0)
        return None

    def put(self, traj: Trajectory) -> None:
        """Records the newest chunk (its buffers are reused ``depth`` dispatches later)."""
        self._held.append(traj)
        del self._held[: -self.depth]

    def clear(self) -> None:
        """Forgets every held chunk (the next rollouts allocate)."""
        self._held = []


def _counts(is_reset: jax.Array, terminated: jax.Array, truncated: jax.Array) -> jax.Array:
    live = ~is_reset
    ended = jnp.all(terminated | truncated, axis=-1) & live
    return jnp.stack([jnp.sum(live, dtype=jnp.int32), jnp.sum(ended, dtype=jnp.int32)])


_counts_jit = jax.jit(_counts)


def chunk_counts(traj: Trajectory) -> tuple[int, int]:
    """``(env steps, finished episodes)`` of a device chunk (reset steps are not steps; an
    episode finishes at the step where every agent is done), computed on the device: only
    these two integers are copied, so the caller can dispatch the next chunk before it
    copies this one. Equal to the counts of the host copy."""
    steps, done = np.asarray(_counts_jit(traj.is_reset, traj.terminated, traj.truncated))
    return int(steps), int(done)


def copy_state(state: Any) -> Any:
    """A device copy of a rollout state (same shardings), taken before a rollout that
    donates the original, so the sampler can return to it."""
    leaves, treedef = jax.tree.flatten(state)
    out = [
        jax.device_put(x, x.sharding, may_alias=False) if isinstance(x, jax.Array) else x
        for x in leaves
    ]
    return jax.tree.unflatten(treedef, out)


@dataclasses.dataclass
class Prefetched:
    """A rollout chunk dispatched at the end of one call for the next one.

    Attributes:
        traj: the chunk (device arrays; possibly still being computed).
        state_before: a copy of the rollout state it started from (the sampler goes back
            to it when the chunk is discarded).
        version: the weights version of the params it ran with.
    """

    traj: Trajectory
    state_before: Any
    version: int


class WeightsVersion:
    """The weights version of a sampler's params: a counter that moves on whenever a call
    gets params that are not the same objects (leaf by leaf, ``is``) as the previous
    call's, or the number the caller gives.

    Attributes:
        current: the version of the last call's params (``0`` for the first params seen).
    """

    def __init__(self) -> None:
        self.current = 0
        self._leaves: list[Any] | None = None

    def restart(self, version: int) -> None:
        """Continues from a checkpointed ``version``: the next params count as new (one
        more), since their identity cannot be compared with the saved run's."""
        self.current, self._leaves = version, []

    def update(self, params: Any, given: int | None = None) -> int:
        """The version of ``params``: ``given`` when not ``None`` (an int >= 0), else the
        previous version if every leaf is the previous call's object, else one more.

        Raises:
            ValueError: ``given`` is not an int >= 0.
        """
        leaves = jax.tree.leaves(params)
        if given is not None:
            if isinstance(given, bool) or not isinstance(given, (int, np.integer)) or given < 0:
                raise ValueError(f"weights_seq_no must be an int >= 0, got {given!r}")
            self.current = int(given)
        elif self._leaves is not None and not _same_objects(leaves, self._leaves):
            self.current += 1
        self._leaves = leaves
        return self.current


def _same_objects(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def tag_chunk(traj: Trajectory, version: int) -> Trajectory:
    """The host chunk with a :data:`WEIGHTS_SEQ_NO` extra ``int64[T, E, A]`` holding
    ``version`` at every step (a broadcast view: no memory per step), which the
    converters carry into every episode's extra model outputs and every batch row as
    they carry the policy's own extras. A chunk whose extras are not a dict (a policy
    without named extras) gets a dict with this entry alone.

    Raises:
        ValueError: the policy's extras already have an entry of that name.
    """
    extras = traj.extras if isinstance(traj.extras, dict) else {}
    if WEIGHTS_SEQ_NO in extras:
        raise ValueError(
            f"the policy returns an extra named {WEIGHTS_SEQ_NO!r}, where a prefetching "
            "sampler puts the weights version of each step; rename the policy's extra"
        )
    tag = np.broadcast_to(np.int64(version), np.shape(traj.rewards))
    return dataclasses.replace(traj, extras={**extras, WEIGHTS_SEQ_NO: tag})
