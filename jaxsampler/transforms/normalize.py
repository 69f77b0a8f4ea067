"""Running-statistics normalization of observations, and the moments it keeps.

:class:`RunningMoments` holds ``(count, mean, m2)`` and merges a masked batch in with the
parallel-variance formula (Chan, Golub & LeVeque 1979): the batch's own mean and
centred sum of squares are computed in two passes, then combined with the running ones,
which stays accurate where the one-pass ``E[x^2] - E[x]^2`` loses every digit (large
means, small variances). With the env axis sharded, the batch sums are ``psum``-reduced
over the mesh axis before the merge, so every device holds the same, global statistics.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsampler.constants import MASK_KEY
from jaxsampler.spaces import Box, Dict, Space, Tuple
from jaxsampler.transforms.base import (
    Context,
    Observed,
    Spaces,
    StageState,
    Transform,
    TransformSpaceError,
)

__all__ = ["NormalizeObservation", "RunningMoments", "normalizable_leaves"]


@struct.dataclass
class RunningMoments:
    """Count, mean and centred sum of squares of everything merged so far.

    Attributes:
        count: ``float32[]``, number of samples merged.
        mean: ``float32[*shape]``.
        m2: ``float32[*shape]``, sum of squared deviations from ``mean``.
    """

    count: jax.Array
    mean: jax.Array
    m2: jax.Array

    @classmethod
    def zeros(cls, shape: tuple[int, ...]) -> RunningMoments:
        """Empty moments for samples of ``shape``: count 0, ``mean`` and ``m2`` float32
        zeros."""
        return cls(
            jnp.zeros((), jnp.float32), jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.float32)
        )

    @property
    def var(self) -> jax.Array:
        """Population variance; 1 before any sample (so normalizing starts as identity)."""
        return jnp.where(self.count > 0, self.m2 / jnp.maximum(self.count, 1.0), 1.0)

    def merge(self, x: jax.Array, mask: jax.Array, axis_name: str | None = None) -> RunningMoments:
        """The moments with the samples ``x[mask]`` merged in.

        Args:
            x: ``[*batch, *shape]`` samples.
            mask: ``bool[*batch]``, which samples count.
            axis_name: reduce the batch sums over this mesh axis too (sharded env axis).
        """
        shape = self.mean.shape
        x = x.reshape((-1,) + shape).astype(jnp.float32)
        w = mask.reshape((-1,) + (1,) * len(shape)).astype(jnp.float32)

        def total(v: jax.Array) -> jax.Array:
            v = jnp.sum(v, axis=0)
            return v if axis_name is None else jax.lax.psum(v, axis_name)

        n_b = total(w.reshape(w.shape[0]))
        mean_b = total(x * w) / jnp.maximum(n_b, 1.0)
        m2_b = total(jnp.square(x - mean_b) * w)
        n = self.count + n_b
        delta = mean_b - self.mean
        frac = n_b / jnp.maximum(n, 1.0)
        return RunningMoments(
            count=n,
            mean=self.mean + delta * frac,
            m2=self.m2 + m2_b + jnp.square(delta) * self.count * frac,
        )


def _is_mask_key(path: tuple[Any, ...]) -> bool:
    return any(getattr(k, "key", None) == MASK_KEY for k in path)


def normalizable_leaves(space: Space) -> list[bool]:
    """Per leaf of ``space.zeros()`` (tree order): a float ``Box`` leaf that is not an
    ``action_mask``."""
    leaves = jax.tree_util.tree_flatten_with_path(space.zeros())[0]
    spaces = _leaf_spaces(space)
    return [
        isinstance(s, Box) and np.issubdtype(s.dtype, np.floating) and not _is_mask_key(path)
        for (path, _), s in zip(leaves, spaces)
    ]


def _leaf_spaces(space: Space) -> list[Space]:
    if isinstance(space, Dict):
        out: list[Space] = []
        for k in sorted(space.spaces):
            out += _leaf_spaces(space.spaces[k])
        return out
    if isinstance(space, Tuple):
        out = []
        for s in space.spaces:
            out += _leaf_spaces(s)
        return out
    return [space]


@dataclasses.dataclass(frozen=True)
class NormalizeObservation(Transform):
    """Normalizes observations with running mean and variance over every env and agent.

    ``obs -> clip((obs - mean) / sqrt(var + epsilon), -clip, clip)``, per element. The
    statistics are updated, before normalizing, from exactly the observations that enter
    the agents' episodes (``Observed.recorded``: those an agent acts on, and every real
    final observation, terminal or truncated); observations of agents that wait (out of
    lockstep) are normalized but not counted. One set of statistics is shared by every
    env and agent; with the env axis sharded they are reduced over the mesh, so all
    devices hold the global statistics.

    Float ``Box`` leaves are normalized (each its own statistics); integer leaves and any
    ``action_mask`` entry of a ``Dict`` pass through.

    Args:
        epsilon: added to the variance.
        clip: bound of the normalized values (``None``: no clipping).
        update: update the statistics (``False``: frozen, e.g. for evaluation; a frozen
            :class:`~jaxsampler.transforms.Context` freezes them too).

    The state is ``shared = tuple of RunningMoments`` (one per normalized leaf, tree order).
    """

    epsilon: float = 1e-8
    clip: float | None = 10.0
    update: bool = True

    changes_obs = True

    def check(self, spaces: Spaces) -> None:
        """Raises :class:`TransformSpaceError` unless the observation has a float ``Box`` leaf
        outside any ``action_mask``."""
        if not any(normalizable_leaves(spaces.obs)):
            raise TransformSpaceError(
                f"NormalizeObservation needs a float Box observation (or a Dict/Tuple with "
                f"float Box entries), got {spaces.obs!r}"
            )

    def observation_space(self, spaces: Spaces) -> Space:
        """The input space with every normalized leaf bounded by ``[-clip, clip]`` (unbounded
        with ``clip=None``); the other leaves unchanged."""
        bound = np.inf if self.clip is None else float(self.clip)

        def out(space: Space, in_mask: bool) -> Space:
            # Same structure, shapes and dtypes; normalized leaves get the clip bounds.
            if isinstance(space, Dict):
                return Dict({k: out(s, in_mask or k == MASK_KEY) for k, s in space.spaces.items()})
            if isinstance(space, Tuple):
                return Tuple([out(s, in_mask) for s in space.spaces])
            if isinstance(space, Box) and np.issubdtype(space.dtype, np.floating) and not in_mask:
                return Box(-bound, bound, space.shape, space.dtype)
            return space

        return out(spaces.obs, False)

    def init_shared(self, spaces: Spaces) -> Any:
        """One empty :class:`RunningMoments` per normalized leaf, in tree order."""
        leaves = jax.tree.leaves(spaces.obs.zeros())
        return tuple(
            RunningMoments.zeros(tuple(leaf.shape))
            for leaf, ok in zip(leaves, normalizable_leaves(spaces.obs))
            if ok
        )

    def observe(
        self, spaces: Spaces, state: StageState, step: Observed, ctx: Context
    ) -> tuple[StageState, Observed]:
        """Merges the recorded observations into the statistics (unless frozen), then
        normalizes and clips each float leaf with the updated ones, keeping its dtype. Pure;
        jittable."""
        leaves, treedef = jax.tree.flatten(step.obs)
        moments = list(state.shared)
        out = []
        i = 0
        for leaf, ok in zip(leaves, normalizable_leaves(spaces.obs)):
            if not ok:
                out.append(leaf)
                continue
            m = moments[i]
            if self.update and not ctx.frozen:
                m = m.merge(leaf, step.recorded, ctx.axis_name)
                moments[i] = m
            z = (leaf.astype(jnp.float32) - m.mean) / jnp.sqrt(m.var + self.epsilon)
            if self.clip is not None:
                z = jnp.clip(z, -self.clip, self.clip)
            out.append(z.astype(leaf.dtype))
            i += 1
        step = dataclasses.replace(step, obs=jax.tree.unflatten(treedef, out))
        return dataclasses.replace(state, shared=tuple(moments)), step
