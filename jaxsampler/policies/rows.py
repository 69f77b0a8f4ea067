"""Evaluating a per-row function on the agent rows that need it, at a static cost.

A turn-based rollout needs a value estimate only where an agent acts or where its env
resets (the final observation's value bootstraps a truncated episode). Those rows are a
traced mask, so their number changes from step to step; :func:`where_rows` runs the
function on a fixed number of rows picked by the mask, and on every row in the rare step
where more rows are needed than that budget holds. Either way the rows in the mask get
the function's own outputs and the others zeros.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["row_budget", "where_rows"]


def row_budget(num_envs: int, num_agents: int, k: int) -> int:
    """How many rows :func:`where_rows` evaluates in the common case: the ``E x k`` acting
    rows and a quarter of the others (every agent of a resetting env needs a value; a
    quarter of the envs resetting in one step is far above any game's usual rate, and a
    step that needs more falls back to every row). Static; at most ``E x A``."""
    if not 1 <= k <= num_agents or num_envs < 1:
        raise ValueError(f"row_budget needs 1 <= k <= A and E >= 1, got {num_envs=}, {k=}")
    extra = -(-num_envs * (num_agents - k) // 4)
    return min(num_envs * num_agents, num_envs * k + extra)


def where_rows(fn: Callable[[Any], jax.Array], tree: Any, mask: jax.Array, budget: int) -> Any:
    """``where(mask, fn(tree), 0)`` on ``[E, A]`` rows, computing ``fn`` on ``budget`` rows.

    The rows where ``mask`` holds are gathered (in row-major order, padded to ``budget``
    with copies of the last row), ``fn`` runs on those and its outputs are put back; the
    other rows get zeros. In a step where more than ``budget`` rows are masked, ``fn``
    runs on every row instead (a ``lax.cond`` on a scalar: one branch runs; under a
    ``vmap`` both do). ``fn`` must treat rows independently (an MLP does), so a row's
    output does not depend on which rows share its batch, up to the float rounding of a
    matmul over another number of rows.

    Args:
        fn: ``leaves [N, ...] -> outputs [N, ...]`` (a pytree of arrays).
        tree: the inputs, leaves ``[E, A, ...]``.
        mask: ``bool[E, A]``, the rows whose outputs are needed.
        budget: rows evaluated when the mask fits (static, ``1 <= budget <= E x A``).

    Returns:
        ``fn``'s outputs with leaves ``[E, A, ...]``, zero where ``mask`` is False. Pure;
        jit-safe.

    Raises:
        ValueError: ``mask`` is not ``[E, A]`` or ``budget`` is out of range (at trace time).
    """
    if mask.ndim != 2:
        raise ValueError(f"where_rows needs a [E, A] mask, got shape {tuple(mask.shape)}")
    E, A = mask.shape
    n = E * A
    if not 1 <= budget <= n:
        raise ValueError(f"where_rows: budget must lie in [1, E x A = {n}], got {budget}")
    flat_mask = mask.reshape(n)
    flat = jax.tree.map(lambda x: x.reshape((n,) + x.shape[2:]), tree)

    def unflat(out: Any) -> Any:
        def put(y: jax.Array) -> jax.Array:
            m = flat_mask.reshape((n,) + (1,) * (y.ndim - 1))
            return jnp.where(m, y, jnp.zeros((), y.dtype)).reshape((E, A) + y.shape[1:])

        return jax.tree.map(put, out)

    def every(_: None) -> Any:
        return unflat(fn(flat))

    def few(_: None) -> Any:
        (idx,) = jnp.nonzero(flat_mask, size=budget, fill_value=n)
        picked = jax.tree.map(lambda x: jnp.take(x, idx, axis=0, mode="clip"), flat)
        out = fn(picked)
        # the padding indices (n) fall outside the rows and are dropped
        return unflat(
            jax.tree.map(
                lambda y: jnp.zeros((n,) + y.shape[1:], y.dtype).at[idx].set(y, mode="drop"),
                out,
            )
        )

    if budget == n:
        return every(None)
    return jax.lax.cond(jnp.sum(flat_mask) <= budget, few, every, None)
