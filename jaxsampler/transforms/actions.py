"""Stateless action transforms for float ``Box`` action spaces: clipping and rescaling.

Both act in :meth:`~jaxsampler.transforms.base.Transform.to_env` only, on the way from
the policy to the env. The trajectory keeps the policy's own action (before any action
transform), so log-probabilities computed from it stay exact; the env receives the
transformed one. Listed env side first, ``transforms=(ClipActions(), RescaleActions())``
rescales the policy's action first, then clips it to the env's bounds.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxsampler.spaces import Box, Space
from jaxsampler.transforms.base import Spaces, Transform, TransformSpaceError

__all__ = ["ClipActions", "RescaleActions"]


def _float_box(name: str, spaces: Spaces) -> Box:
    space = spaces.action
    if not (isinstance(space, Box) and np.issubdtype(space.dtype, np.floating)):
        raise TransformSpaceError(
            f"{name} needs a float Box action space, got {space!r} (observation space "
            f"{spaces.obs!r}); Discrete, MultiDiscrete, integer Box and Dict/Tuple action "
            f"spaces are not supported"
        )
    return space


@dataclasses.dataclass(frozen=True)
class ClipActions(Transform):
    """Clips the policy's actions to the env's ``Box`` bounds on their way to the env.

    The policy's action space is the env's (a policy may emit values outside it, e.g. an
    unclipped Gaussian sample); the trajectory records the unclipped action. Infinite
    bounds do not clip. Stateless.

    Raises:
        TransformSpaceError (when the pipeline is built): the action space is not a
            float ``Box``.
    """

    changes_action = True

    def check(self, spaces: Spaces) -> None:
        """Raises :class:`TransformSpaceError` unless the env's action space is a float ``Box``."""
        _float_box("ClipActions()", spaces)

    def to_env(self, spaces: Spaces, action: Any) -> Any:
        """``action`` (``[E, A, *shape]``) cast to the space's dtype and clipped to its bounds;
        infinite bounds leave that side as it is. Pure; jittable."""
        space = _float_box("ClipActions()", spaces)
        low = jnp.asarray(space.low, space.dtype)
        high = jnp.asarray(space.high, space.dtype)
        return jnp.clip(action.astype(space.dtype), low, high)


@dataclasses.dataclass(frozen=True)
class RescaleActions(Transform):
    """The policy acts in ``[low, high]``; its actions are mapped affinely onto the env's
    ``Box`` bounds on their way to the env.

    ``env_action = env_low + (action - low) * (env_high - env_low) / (high - low)``, per
    element, so ``low`` maps to ``env_low`` and ``high`` to ``env_high``. Actions outside
    ``[low, high]`` map outside the env's bounds: list :class:`ClipActions` before this
    transform (``transforms=(ClipActions(), RescaleActions())``) to clip after rescaling.
    The policy's action space is ``Box(low, high)`` of the env's shape and dtype; the
    trajectory records the policy's action. Stateless.

    Args:
        low, high: the policy's bounds (finite, ``low < high``), the same for every
            element.

    Raises:
        ValueError: ``low``/``high`` not finite or ``low >= high``.
        TransformSpaceError (when the pipeline is built): the action space is not a
            float ``Box``, or has an infinite bound (there is no affine map onto it).
    """

    low: float = -1.0
    high: float = 1.0

    changes_action = True

    def __post_init__(self) -> None:
        lo, hi = float(self.low), float(self.high)
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(
                f"RescaleActions: low and high must be finite with low < high, got "
                f"low={self.low!r}, high={self.high!r}"
            )
        object.__setattr__(self, "low", lo)
        object.__setattr__(self, "high", hi)

    def _env_box(self, spaces: Spaces) -> Box:
        space = _float_box(f"RescaleActions({self.low}, {self.high})", spaces)
        if not space.is_bounded:
            raise TransformSpaceError(
                f"RescaleActions({self.low}, {self.high}) needs a bounded action space (finite "
                f"low and high everywhere), got {space!r}; use ClipActions() for a partly "
                f"bounded Box"
            )
        return space

    def check(self, spaces: Spaces) -> None:
        """Raises :class:`TransformSpaceError` unless the env's action space is a float ``Box``
        with finite bounds everywhere."""
        self._env_box(spaces)

    def action_space(self, spaces: Spaces) -> Space:
        """The policy's space: ``Box(low, high)`` in the env's shape and dtype."""
        space = self._env_box(spaces)
        return Box(self.low, self.high, space.shape, space.dtype)

    def to_env(self, spaces: Spaces, action: Any) -> Any:
        """``action`` (``[E, A, *shape]``) mapped affinely from ``[low, high]`` onto the env's
        bounds, per element, in the space's dtype. Pure; jittable."""
        space = self._env_box(spaces)
        # Computed in float64 on the host: the constants are exact per element.
        scale = (space.high.astype(np.float64) - space.low.astype(np.float64)) / (
            self.high - self.low
        )
        a = action.astype(space.dtype)
        out = jnp.asarray(space.low, space.dtype) + (a - jnp.asarray(self.low, space.dtype)) * (
            jnp.asarray(scale, space.dtype)
        )
        return out
