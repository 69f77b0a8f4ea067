"""One actor pass over the acting agents' rows, one critic pass over those and the few
others whose value is read.

In a turn-based rollout the actor is needed on the ``E x k`` acting rows only, and a
value estimate where an agent acts or where its env resets (the final observation's
value bootstraps a truncated episode). :func:`rows_pass` runs the actor on the acting
rows and the critic on those plus a fixed budget of further rows picked from the value
mask (the non-acting agents of the envs that reset). Budgets are static; each step takes
the smallest that fits (:func:`extra_budgets`: a sixteenth, an eighth or a quarter of the
waiting rows), and a step that needs more than the largest holds (far above any game's
usual reset rate) computes the values on every row instead, so no value is ever dropped.

The critic's rows follow how many envs reset: on connect-four (7 to 42 moves, so few
resets per step) the three budgets ran 1.03x / 1.07x as fast as one budget of a quarter
(64 / 512 envs, 2-core CPU); a critic over every row costs about as much again as the
hand-written loop's whole network.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["extra_budget", "extra_budgets", "rows_pass"]

#: ``leaves [N, ...] -> (outputs [N, ...], value float[N])``: a row-wise network.
RowFn = Callable[[Any], tuple[Any, jax.Array]]


def extra_budget(num_envs: int, num_agents: int, k: int) -> int:
    """Rows :func:`rows_pass` evaluates beyond the ``E x k`` acting ones at most: a quarter
    of the other ``E x (A - k)`` rows, rounded up (a quarter of the envs resetting in one
    step is far above a game's usual rate; a step that needs more falls back to every
    row). Static; 0 when ``k == A``.

    Raises:
        ValueError: not ``1 <= k <= A`` or ``E < 1``.
    """
    if not 1 <= k <= num_agents or num_envs < 1:
        raise ValueError(f"extra_budget needs 1 <= k <= A and E >= 1, got {num_envs=}, {k=}")
    return -(-num_envs * (num_agents - k) // 4)


def extra_budgets(num_envs: int, num_agents: int, k: int) -> tuple[int, ...]:
    """The budgets :func:`rows_pass` chooses from: a sixteenth, an eighth and a quarter
    (:func:`extra_budget`) of the other ``E x (A - k)`` rows, rounded up, distinct and
    increasing. The critic then runs on about as many rows as the step needs: a game with
    long episodes (connect-four: 7 to 42 moves) resets few envs per step and takes the
    smallest, tic-tac-toe (5 to 9 moves) mostly the eighth. Static; ``(0,)`` when
    ``k == A`` (every row acts).

    Raises:
        ValueError: not ``1 <= k <= A`` or ``E < 1``.
    """
    extra_budget(num_envs, num_agents, k)  # (checks the arguments)
    m = num_envs * (num_agents - k)
    return tuple(sorted({-(-m // d) for d in (16, 8, 4)}))


def rows_pass(
    fn: RowFn,
    tree: Any,
    rows: jax.Array,
    value_rows: jax.Array,
    budget: int | Sequence[int],
) -> tuple[Any, jax.Array]:
    """``fn``'s outputs on the agent rows ``rows`` and its values on the value rows.

    The outputs are ``fn``'s on the ``E x k`` rows of ``rows`` (one gather). The values
    are ``fn``'s on those rows followed by ``b`` distinct further rows that include every
    row of ``value_rows`` outside ``rows`` (a top-k of the mask: one library call), for
    the smallest budget ``b`` they fit in; when they fit in none, on every row. The choice
    is one ``lax.switch`` on a scalar, so one critic pass runs (under ``vmap``, all do).
    ``fn`` is called on each set of rows and XLA drops what each call does not return.
    ``fn`` must treat rows independently (an MLP does): a row's outputs do not depend on
    the other rows of its batch, up to the float rounding of a matmul over another number
    of rows.

    Args:
        fn: ``leaves [N, ...] -> (outputs, value float[N])``.
        tree: the inputs, leaves ``[E, A, ...]``.
        rows: ``int32[E, k]``, distinct agent indices per env.
        value_rows: ``bool[E, A]``, the rows whose value is needed.
        budget: further rows per critic pass (static, each in ``[0, E x A]``): one int,
            or several tried smallest first (:func:`extra_budgets`).

    Returns:
        ``(outputs, value)``: ``fn``'s outputs for ``rows`` (leaves ``[E, k, ...]``) and
        ``float[E, A]`` values, ``fn``'s where ``value_rows`` holds and 0 elsewhere. Pure;
        jit-safe.

    Raises:
        ValueError: shapes that do not line up, no budget, or a budget outside
            ``[0, E x A]`` (at trace time).
    """
    if rows.ndim != 2 or value_rows.shape != (rows.shape[0],) + value_rows.shape[1:2]:
        raise ValueError(
            f"rows_pass needs rows [E, k] and value_rows [E, A], got {tuple(rows.shape)} "
            f"and {tuple(value_rows.shape)}"
        )
    (E, k), A = rows.shape, value_rows.shape[1]
    n = E * A
    budgets = sorted({operator.index(b) for b in np.atleast_1d(np.asarray(budget, np.int64))})
    if not budgets or not all(0 <= b <= n for b in budgets):
        raise ValueError(f"rows_pass: budget must lie in [0, E x A = {n}], got {budget}")
    flat = jax.tree.map(lambda x: x.reshape((n,) + x.shape[2:]), tree)
    mine = (jnp.arange(E, dtype=jnp.int32)[:, None] * A + rows.astype(jnp.int32)).reshape(E * k)
    on_rows = jnp.any(rows[..., None] == jnp.arange(A, dtype=rows.dtype), axis=1)  # [E, A]
    extra = (value_rows & ~on_rows).reshape(n)
    # the needed rows first, then other rows off ``rows``: a budget (at most the
    # E x (A - k) rows off ``rows``) never picks a row of ``rows`` twice
    score = extra.astype(jnp.float32) * 2 + (~on_rows).reshape(n).astype(jnp.float32)
    out = fn(jax.tree.map(lambda x: jnp.take(x, mine, axis=0), flat))[0]
    out = jax.tree.map(lambda y: y.reshape((E, k) + y.shape[1:]), out)

    def critic(b: int, _: None = None) -> jax.Array:  # on ``mine`` and ``b`` more rows
        idx = mine
        if b > 0:
            idx = jnp.concatenate([mine, jax.lax.top_k(score, b)[1].astype(jnp.int32)])
        value = fn(jax.tree.map(lambda x: jnp.take(x, idx, axis=0), flat))[1]
        return jnp.zeros((n,), value.dtype).at[idx].set(value, unique_indices=True)

    needed = jnp.sum(extra)
    # the smallest budget the needed rows fit in; every extra row always fits the last
    # budget when it covers the E x (A - k) rows off ``rows``, else a pass over every row
    # follows it. One ``lax.switch``: one branch runs.
    branches: list[Callable[[None], jax.Array]] = [functools.partial(critic, b) for b in budgets]
    if budgets[-1] < n - E * k:
        branches.append(lambda _: fn(flat)[1])
    if len(branches) == 1:
        v = branches[0](None)
    else:
        which = sum((needed > b).astype(jnp.int32) for b in budgets[: len(branches) - 1])
        v = jax.lax.switch(which, branches, None)
    return out, jnp.where(value_rows, v.reshape(E, A), jnp.zeros((), v.dtype))
