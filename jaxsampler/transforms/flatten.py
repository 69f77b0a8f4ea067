"""Flattening of structured observations into one float32 vector per agent."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxsampler.constants import MASK_KEY, OBS_KEY
from jaxsampler.spaces import Box, Dict, Discrete, MultiDiscrete, Space, Tuple
from jaxsampler.transforms.base import (
    Context,
    Observed,
    Spaces,
    StageState,
    Transform,
    TransformSpaceError,
    first_bad_leaf,
)

__all__ = ["FlattenObservation", "flat_size"]


def _bounds(space: Space) -> tuple[np.ndarray, np.ndarray]:
    """Flat float32 bounds of ``space``'s encoding (one-hot entries lie in [0, 1])."""
    if isinstance(space, Dict):
        parts = [_bounds(s) for s in space.spaces.values()]  # sorted keys
    elif isinstance(space, Tuple):
        parts = [_bounds(s) for s in space.spaces]
    elif isinstance(space, Discrete):
        return np.zeros(space.n, np.float32), np.ones(space.n, np.float32)
    elif isinstance(space, MultiDiscrete):
        total = int(np.sum(space.nvec, dtype=np.int64))
        return np.zeros(total, np.float32), np.ones(total, np.float32)
    else:
        assert isinstance(space, Box)
        return (
            space.low.astype(np.float32).ravel(),
            space.high.astype(np.float32).ravel(),
        )
    if not parts:
        return np.zeros(0, np.float32), np.zeros(0, np.float32)
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def flat_size(space: Space) -> int:
    """The length of ``space``'s flat encoding (see :class:`FlattenObservation`)."""
    return int(_bounds(space)[0].shape[0])


def _encode(space: Space, x: Any, batch_ndim: int) -> jax.Array:
    """``x`` (an element of ``space`` with ``batch_ndim`` leading dims) as
    ``float32[*batch, flat_size(space)]``."""
    if isinstance(space, Dict):
        parts = [_encode(s, x[k], batch_ndim) for k, s in space.spaces.items()]
    elif isinstance(space, Tuple):
        parts = [_encode(s, xi, batch_ndim) for s, xi in zip(space.spaces, x)]
    elif isinstance(space, Discrete):
        return jax.nn.one_hot(x - space.start, space.n, dtype=jnp.float32)
    elif isinstance(space, MultiDiscrete):
        flat = x.reshape(x.shape[:batch_ndim] + (-1,))
        nvec = space.nvec.ravel()
        parts = [
            jax.nn.one_hot(flat[..., j], int(nvec[j]), dtype=jnp.float32) for j in range(nvec.size)
        ]
    else:
        return x.reshape(x.shape[:batch_ndim] + (-1,)).astype(jnp.float32)
    return jnp.concatenate(parts, axis=-1)


@dataclasses.dataclass(frozen=True)
class FlattenObservation(Transform):
    """Flattens each agent's observation into one ``float32`` vector (a ``Box``).

    Encoding, concatenated in this order: a ``Box`` is flattened (row-major) and cast
    to float32, its bounds kept; ``Discrete(n, start)`` becomes ``n`` one-hot entries
    (of ``x - start``); ``MultiDiscrete(nvec)`` the one-hot encodings of its entries in
    row-major order (``sum(nvec)`` entries); a ``Dict`` its entries in sorted-key order;
    a ``Tuple`` its entries in order. A value outside a discrete space's range encodes
    as all zeros.

    The ``action_mask`` entry of a ``Dict`` observation is kept apart: the output is then
    ``Dict({"observations": <flat Box>, "action_mask": <the mask as is>})``, the keys a
    masking policy reads.

    Raises:
        TransformSpaceError (when the pipeline is built): a leaf of the observation
            space that is not a ``Box``, ``Discrete`` or ``MultiDiscrete``, or nothing
            but an action mask to flatten.

    Stateless.
    """

    changes_obs = True

    @staticmethod
    def _parts(space: Space) -> tuple[Space, Space | None]:
        if isinstance(space, Dict) and MASK_KEY in space.spaces:
            rest = Dict({k: s for k, s in space.spaces.items() if k != MASK_KEY})
            return rest, space.spaces[MASK_KEY]
        return space, None

    def check(self, spaces: Spaces) -> None:
        """Raises :class:`TransformSpaceError` for a leaf that is not a ``Box``, ``Discrete`` or
        ``MultiDiscrete`` (the action mask aside), or when nothing is left to flatten."""
        rest, _ = self._parts(spaces.obs)
        bad = first_bad_leaf(rest, lambda s: isinstance(s, (Box, Discrete, MultiDiscrete)))
        if bad is not None:
            raise TransformSpaceError(
                f"FlattenObservation() supports Box, Discrete and MultiDiscrete observations "
                f"(and Dict/Tuple of them): {bad}, in the observation space {spaces.obs!r}"
            )
        if flat_size(rest) == 0:
            raise TransformSpaceError(
                f"FlattenObservation(): the observation space {spaces.obs!r} has nothing to flatten"
            )

    def observation_space(self, spaces: Spaces) -> Space:
        """A float32 ``Box`` of :func:`flat_size` entries with the encoding's bounds, or a
        ``Dict`` of it and the untouched ``action_mask``."""
        rest, mask = self._parts(spaces.obs)
        low, high = _bounds(rest)
        flat = Box(low, high, low.shape, np.float32)
        if mask is None:
            return flat
        return Dict({OBS_KEY: flat, MASK_KEY: mask})

    def observe(
        self, spaces: Spaces, state: StageState, step: Observed, ctx: Context
    ) -> tuple[StageState, Observed]:
        """``step.obs`` (leaves ``[E, A, ...]``) encoded as ``float32[E, A, flat_size]``, the
        action mask kept apart. Stateless; pure, jittable."""
        rest, mask = self._parts(spaces.obs)
        obs = step.obs
        if mask is None:
            out: Any = _encode(rest, obs, 2)
        else:
            inner = {k: v for k, v in obs.items() if k != MASK_KEY}
            out = {OBS_KEY: _encode(rest, inner, 2), MASK_KEY: obs[MASK_KEY]}
        return state, dataclasses.replace(step, obs=out)
