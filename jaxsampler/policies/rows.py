"""One network pass over the acting agents' rows and the few others whose value is read.

In a turn-based rollout the actor is needed on the ``E x k`` acting rows only, and a
value estimate where an agent acts or where its env resets (the final observation's
value bootstraps a truncated episode). :func:`rows_pass` runs the network once on the
acting rows plus a fixed budget of further rows picked from the value mask (the
non-acting agents of the envs that reset). Its number of rows is static; a step that
needs more than the budget holds (far above any game's usual reset rate) computes the
values on every row instead, so no value is ever dropped.

The rows are gathered once; the actor's outputs come from the acting rows and the values
from all gathered rows, so no row computes what it drops. A critic over every row, or a
critic pass inside the fallback's ``lax.cond``, cost about as much again as the
hand-written loop's whole network on the 2-core CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["extra_budget", "rows_pass"]

#: ``leaves [N, ...] -> (outputs [N, ...], value float[N])``: a row-wise network.
RowFn = Callable[[Any], tuple[Any, jax.Array]]


def extra_budget(num_envs: int, num_agents: int, k: int) -> int:
    """Rows :func:`rows_pass` evaluates beyond the ``E x k`` acting ones: a quarter of the
    other ``E x (A - k)`` rows, rounded up (a quarter of the envs resetting in one step is
    far above a game's usual rate; a step that needs more falls back to every row).
    Static; 0 when ``k == A``.

    Raises:
        ValueError: not ``1 <= k <= A`` or ``E < 1``.
    """
    if not 1 <= k <= num_agents or num_envs < 1:
        raise ValueError(f"extra_budget needs 1 <= k <= A and E >= 1, got {num_envs=}, {k=}")
    return -(-num_envs * (num_agents - k) // 4)


def rows_pass(
    fn: RowFn, tree: Any, rows: jax.Array, value_rows: jax.Array, budget: int
) -> tuple[Any, jax.Array]:
    """``fn``'s outputs on the agent rows ``rows`` and its values on the value rows.

    One gather takes the ``E x k`` rows of ``rows`` followed by ``budget`` distinct further
    rows that include every row of ``value_rows`` outside ``rows`` when they fit (a
    top-k of the mask: one library call); the outputs are ``fn``'s on the first
    ``E x k`` of them, the values ``fn``'s on all (``fn`` is called twice and XLA drops
    what each call does not return). When the rows do not fit, the values are taken
    from ``fn`` on every row instead (a ``lax.cond`` on a scalar: one branch runs; under
    ``vmap`` both do). ``fn`` must treat rows independently (an MLP does): a row's
    outputs do not depend on the other rows of its batch, up to the float rounding of a
    matmul over another number of rows.

    Args:
        fn: ``leaves [N, ...] -> (outputs, value float[N])``.
        tree: the inputs, leaves ``[E, A, ...]``.
        rows: ``int32[E, k]``, distinct agent indices per env.
        value_rows: ``bool[E, A]``, the rows whose value is needed.
        budget: further rows per call (static, ``>= 0``; :func:`extra_budget`).

    Returns:
        ``(outputs, value)``: ``fn``'s outputs for ``rows`` (leaves ``[E, k, ...]``) and
        ``float[E, A]`` values, ``fn``'s where ``value_rows`` holds and 0 elsewhere. Pure;
        jit-safe.

    Raises:
        ValueError: shapes that do not line up, or a budget outside ``[0, E x A]`` (at
            trace time).
    """
    if rows.ndim != 2 or value_rows.shape != (rows.shape[0],) + value_rows.shape[1:2]:
        raise ValueError(
            f"rows_pass needs rows [E, k] and value_rows [E, A], got {tuple(rows.shape)} "
            f"and {tuple(value_rows.shape)}"
        )
    (E, k), A = rows.shape, value_rows.shape[1]
    n = E * A
    if not 0 <= budget <= n:
        raise ValueError(f"rows_pass: budget must lie in [0, E x A = {n}], got {budget}")
    flat = jax.tree.map(lambda x: x.reshape((n,) + x.shape[2:]), tree)
    mine = (jnp.arange(E, dtype=jnp.int32)[:, None] * A + rows.astype(jnp.int32)).reshape(E * k)
    on_rows = jnp.any(rows[..., None] == jnp.arange(A, dtype=rows.dtype), axis=1)  # [E, A]
    extra = (value_rows & ~on_rows).reshape(n)
    idx = mine
    if budget > 0:
        # the needed rows first, then other rows off ``rows``: the budget (at most the
        # E x (A - k) rows off ``rows``) never picks a row of ``rows`` twice
        score = extra.astype(jnp.float32) * 2 + (~on_rows).reshape(n).astype(jnp.float32)
        _, more = jax.lax.top_k(score, budget)
        idx = jnp.concatenate([mine, more.astype(jnp.int32)])
    picked = jax.tree.map(lambda x: jnp.take(x, idx, axis=0), flat)
    # two calls on the same gathered rows: XLA keeps the outputs of the first (the acting
    # rows) and the values of the second (all of them), so no row computes what it drops
    out = fn(jax.tree.map(lambda x: x[: E * k], picked))[0]
    value = fn(picked)[1]
    out = jax.tree.map(lambda y: y.reshape((E, k) + y.shape[1:]), out)
    v = jnp.zeros((n,), value.dtype).at[idx].set(value, unique_indices=True)
    fits = jnp.sum(extra) <= budget

    def every(_: None) -> jax.Array:
        return fn(flat)[1]

    def kept(_: None) -> jax.Array:
        return v

    if budget < n - E * k:  # else every extra row always fits
        v = jnp.where(on_rows.reshape(n), v, jax.lax.cond(fits, kept, every, None))
    return out, jnp.where(value_rows, v.reshape(E, A), jnp.zeros((), v.dtype))
