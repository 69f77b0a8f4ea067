"""Vectorization over the agent axis and the env axis, with auto-reset.

:func:`vmap_agents` lifts a function written for one agent onto the agent axis: it is
the mechanism of :class:`jaxsampler.envs.base.MultiAgentEnv`, which writes each agent's
observation, reward and flags once and maps them over ``jnp.arange(num_agents)``.
:func:`reset` / :func:`step` add the env axis to any env with one ``jax.vmap``.
:func:`autoreset_step` implements the library's "next-step" auto-reset (see
:mod:`jaxsampler.types`): envs flagged ``needs_reset`` are reset instead of stepped, so
the step that ended an episode keeps its real final observation.

Both the step and the reset are computed for every env and selected leaf by leaf: under
``vmap`` a ``lax.cond`` would run both branches anyway, and a select is cheaper than a
gather/scatter of the envs that need it.

For envs whose reset is expensive (procedurally generated levels), :class:`ResetPool`
is the cheaper mode: a rollout call computes ``P`` fresh resets up front
(:meth:`ResetPool.draw`) and each env that needs a reset takes a uniformly drawn pool
entry by gather (:meth:`ResetPool.autoreset_step`), so a step costs a gather instead of
``E`` resets. Each fresh start is still a draw from the env's reset distribution, but
envs that take their start from the same pool can start alike (see :class:`ResetPool`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsampler.types import TimeStep

__all__ = [
    "vmap_agents",
    "reset",
    "step",
    "autoreset_step",
    "ResetPool",
    "PoolStarts",
    "as_reset_pool",
    "select_envs",
    "acting_rows",
    "gather_agents",
    "scatter_agents",
    "param_axes",
    "broadcast_params",
]


class Env(Protocol):
    """What the env axis needs of an env: :class:`jaxsampler.envs.base.Env`'s two
    functions (structural, so this layer sits below the envs that use it)."""

    def reset(self, key: jax.Array, params: Any = None) -> tuple[Any, TimeStep]:
        """Starts an episode of one env (see :meth:`jaxsampler.envs.base.Env.reset`)."""
        ...

    def step(
        self, key: jax.Array, state: Any, action: Any, params: Any = None
    ) -> tuple[Any, TimeStep]:
        """Advances one env by one step (see :meth:`jaxsampler.envs.base.Env.step`)."""
        ...


def vmap_agents(fn: Callable[..., Any], in_axes: Any = 0) -> Callable[..., Any]:
    """Lifts a one-agent function onto the agent axis (``jax.vmap``, outputs ``[A, ...]``).

    Args:
        fn: a function written for one agent, typically ``fn(agent_id, *shared)``.
        in_axes: as for ``jax.vmap``; ``(0, None, ...)`` maps the agent ids and shares
            the rest (the usual call is on ``jnp.arange(num_agents)``).

    Safe under jit and vmap (the env axis is added around it).
    """
    return jax.vmap(fn, in_axes=in_axes)


def _default_params(env: Any) -> Any:
    try:
        return env.default_params
    except NotImplementedError:
        return None


def param_axes(env: Any, params: Any, num_envs: int) -> Any:
    """Which leaves of ``params`` are per env: a pytree of ``0`` (leading ``[E]`` axis) or
    ``None`` (shared), for ``jax.vmap``'s ``in_axes``. Decided from static shapes only.

    A leaf is shared when its shape is that of the matching leaf of ``env.default_params``,
    per env when it is ``(num_envs,) + that shape``; params of another tree structure
    than the defaults (or an env without defaults) are shared as a whole.

    Raises:
        ValueError: a leaf that is neither, naming the leaf, its shape and the two it may
            have.
    """
    default = _default_params(env)
    if default is None or params is None:
        return None
    try:
        d_paths = jax.tree_util.tree_flatten_with_path(default)[0]
        p_paths, treedef = jax.tree_util.tree_flatten_with_path(params)
    except Exception:  # pragma: no cover - exotic pytrees
        return None
    if [p for p, _ in d_paths] != [p for p, _ in p_paths]:
        return None
    axes: list[int | None] = []
    for (path, d), (_, p) in zip(d_paths, p_paths):
        d_shape, p_shape = tuple(np.shape(d)), tuple(np.shape(p))
        if p_shape == d_shape:
            axes.append(None)
        elif p_shape == (num_envs,) + d_shape:
            axes.append(0)
        else:
            raise ValueError(
                f"env_params{jax.tree_util.keystr(path)} has shape {p_shape}: expected "
                f"{d_shape} (shared by every env) or {(num_envs,) + d_shape} (one per env, "
                f"num_envs={num_envs})"
            )
    return jax.tree.unflatten(treedef, axes)


def broadcast_params(env: Any, params: Any, num_envs: int) -> Any:
    """``params`` with every leaf per env (a leading ``[E]`` axis; shared leaves repeated)."""
    axes = param_axes(env, params, num_envs)
    if axes is None:
        return jax.tree.map(lambda x: jnp.broadcast_to(x, (num_envs,) + jnp.shape(x)), params)
    return jax.tree.map(
        lambda x, ax: x if ax == 0 else jnp.broadcast_to(x, (num_envs,) + jnp.shape(x)),
        params,
        axes,
        is_leaf=lambda x: x is None,
    )


def reset(env: Env, keys: jax.Array, params: Any) -> tuple[Any, TimeStep]:
    """Resets ``E`` envs. ``keys``: ``[E]`` PRNG keys; ``params`` shared or per env
    (:func:`param_axes`). Returns leaves ``[E, ...]``. Jittable."""
    axes = param_axes(env, params, keys.shape[0])
    return jax.vmap(env.reset, in_axes=(0, axes))(keys, params)


def step(env: Env, keys: jax.Array, state: Any, action: Any, params: Any) -> tuple[Any, TimeStep]:
    """Steps ``E`` envs with ``action`` leaves ``[E, A, ...]``; ``params`` shared or per env
    (:func:`param_axes`). Jittable."""
    axes = param_axes(env, params, keys.shape[0])
    return jax.vmap(env.step, in_axes=(0, 0, 0, axes))(keys, state, action, params)


def select_envs(mask: jax.Array, on_true: Any, on_false: Any) -> Any:
    """Leaf-wise ``where(mask[e], on_true, on_false)`` for pytrees with leading env axis."""

    def sel(a: jax.Array, b: jax.Array) -> jax.Array:
        m = jnp.reshape(mask, mask.shape + (1,) * (a.ndim - mask.ndim))
        return jnp.where(m, a, b)

    return jax.tree.map(sel, on_true, on_false)


def acting_rows(acting: jax.Array, k: int) -> jax.Array:
    """``int32[E, k]``: per env, the agent indices of its acting agents first (in agent
    order), then non-acting ones, ``k`` in all (each agent at most once). With at most ``k``
    agents acting, every acting agent is among the rows. Pure.

    Args:
        acting: ``bool[E, A]``.
        k: rows per env, ``1 <= k <= A`` (static).
    """
    if k == 1:  # the first acting agent (0 if none): a sort's first row, without the sort
        return jnp.argmax(acting, axis=-1, keepdims=True).astype(jnp.int32)
    order = jnp.argsort(jnp.logical_not(acting), axis=-1, stable=True)
    return order[..., :k].astype(jnp.int32)


def gather_agents(tree: Any, rows: jax.Array) -> Any:
    """Leaves ``[E, A, ...]`` -> ``[E, k, ...]``: row ``j`` of env ``e`` is agent
    ``rows[e, j]`` (``rows``: ``int32[E, k]``, e.g. :func:`acting_rows`). Pure."""

    def take(x: jax.Array) -> jax.Array:
        return jnp.take_along_axis(x, rows.reshape(rows.shape + (1,) * (x.ndim - 2)), axis=1)

    return jax.tree.map(take, tree)


def scatter_agents(tree: Any, rows: jax.Array, num_agents: int) -> Any:
    """Leaves ``[E, k, ...]`` -> ``[E, num_agents, ...]``, the inverse of
    :func:`gather_agents` on the gathered rows: agent ``rows[e, j]`` gets row ``j``, every
    other agent zeros. Selects (no arithmetic), so values move bit for bit. Pure."""
    agents = jnp.arange(num_agents, dtype=rows.dtype)

    def put(x: jax.Array) -> jax.Array:
        out = jnp.zeros((x.shape[0], num_agents) + x.shape[2:], x.dtype)
        for j in range(rows.shape[-1]):  # k is small and static
            hit = rows[:, j : j + 1] == agents  # [E, A]
            out = jnp.where(hit.reshape(hit.shape + (1,) * (x.ndim - 2)), x[:, j : j + 1], out)
        return out

    return jax.tree.map(put, tree)


def autoreset_step(
    env: Env,
    step_keys: jax.Array,
    reset_keys: jax.Array,
    state: Any,
    action: Any,
    needs_reset: jax.Array,
    params: Any,
) -> tuple[Any, TimeStep]:
    """Steps every env, except that envs with ``needs_reset[e]`` are reset instead.

    Args:
        env: the env (static).
        step_keys, reset_keys: ``[E]`` PRNG keys, each used once.
        state: env state, leaves ``[E, ...]``.
        action: leaves ``[E, A, ...]``; ignored for envs that reset.
        needs_reset: ``bool[E]``.
        params: env params (shared by all envs, or per env: :func:`param_axes`).

    Returns:
        ``(state, timestep)`` with leaves ``[E, ...]``. Reset envs report reward 0 and
        ``terminated = truncated = False``. Jittable and vmappable.
    """
    st_state, st_ts = step(env, step_keys, state, action, params)
    re_state, re_ts = reset(env, reset_keys, params)
    return select_envs(needs_reset, re_state, st_state), select_envs(needs_reset, re_ts, st_ts)


# --------------------------------------------------------------------------- reset pool


@struct.dataclass
class PoolStarts:
    """The fresh starts of one rollout call: ``B`` blocks of ``P`` reset results
    (``B = ceil(T / refresh_every)``, or 1), block ``b`` serving steps
    ``[b * refresh_every, (b + 1) * refresh_every)``.

    Attributes:
        env_state: env state leaves ``[B * P, ...]``.
        timestep: the resets' :class:`~jaxsampler.types.TimeStep`, leaves ``[B * P, A, ...]``.
    """

    env_state: Any
    timestep: TimeStep


def _check_count(name: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"ResetPool {name} must be an int >= 1, got {value!r}")


@dataclasses.dataclass(frozen=True)
class ResetPool:
    """Cheap randomized auto-reset: envs that need a reset take one of ``size`` fresh
    resets computed per rollout call, instead of each computing its own.

    A rollout call (``make_rollout(..., reset_pool=ResetPool(P, k))``) first computes
    ``P`` resets of the env (own keys, the env's shared params), and again every
    ``refresh_every`` steps of the call if given (all computed at the call's start, as
    ``ceil(T / k)`` blocks of ``P``). At each step an env that needs a reset takes
    entry ``i ~ Uniform{0..P-1}`` of the current block (its own draw) by gather, rather
    than every env computing a reset every step and a select keeping it (the exact
    default). A call then costs ``ceil(T / k) * P`` resets instead of ``T * E``.

    The fresh-start distribution: every fresh start is an exact draw from the env's reset
    distribution (a pool entry is a reset with its own key, and which entry is taken is
    independent of it), so each episode's start is distributed as without the pool. The
    starts are not independent of each other: envs that reset within one block draw
    from the same ``P`` entries, and two of them take the same one with probability
    ``1 / P``. The envs' own first states (``rollout.init``) are exact independent resets.
    As ``P`` grows (and ``refresh_every`` shrinks) the starts tend to independent draws,
    i.e. to the default mode.

    Determinism holds (same seed and calls, same data; the pool lives in no state, it is
    derived from each call's key, so save/restore is unaffected), but the split of a
    run into calls matters: two calls of ``T`` steps draw two pools where one call of
    ``2T`` draws one, so their fresh starts differ (the default mode gives equal data).

    What it cannot serve: envs whose resets differ per env (per-env ``env_params``
    leaves, domain randomization): a pooled start built with one env's params would be
    handed to envs with others. Those rollouts raise ``ValueError``.

    Attributes:
        size: ``P``, resets per block (``>= 1``).
        refresh_every: a fresh block every this many steps of a call; ``None``: one block
            per call.
    """

    size: int
    refresh_every: int | None = None

    def __post_init__(self) -> None:
        _check_count("size", self.size)
        _check_count("refresh_every", self.refresh_every, allow_none=True)

    def num_blocks(self, rollout_length: int) -> int:
        """``B``: pool blocks one call of ``rollout_length`` steps uses."""
        if self.refresh_every is None:
            return 1
        return -(-int(rollout_length) // int(self.refresh_every))

    def check_params(self, env: Env, params: Any, num_envs: int) -> None:
        """Raises ``ValueError`` if ``params`` has per-env leaves (:func:`param_axes`):
        pooled starts are shared by every env, so they need shared params."""
        axes = param_axes(env, params, num_envs)
        if axes is None:
            return
        flat = jax.tree_util.tree_flatten_with_path(axes, is_leaf=lambda x: x is None)[0]
        per_env = [jax.tree_util.keystr(path) for path, ax in flat if ax == 0]
        if per_env:
            raise ValueError(
                f"reset_pool= needs env params shared by every env, but env_params"
                f"{', env_params'.join(per_env)} {'is' if len(per_env) == 1 else 'are'} per env: "
                "a pooled reset is built with one set of params and handed to any env. Use the "
                "exact auto-reset (reset_pool=None) with per-env params"
            )

    def draw(
        self,
        env: Env,
        key: jax.Array,
        rollout_length: int,
        params: Any,
        *,
        shard_axis: str | None = None,
        sharding: jax.sharding.Sharding | None = None,
    ) -> PoolStarts:
        """Computes the ``num_blocks(rollout_length) * size`` fresh starts of one call.

        Args:
            env: the env (static).
            key: a PRNG key, used once (split into one key per reset).
            rollout_length: ``T`` of the call.
            params: the env's params, shared by every env (:meth:`check_params`).
            shard_axis: inside a ``shard_map`` over this axis, each shard draws its own
                pool (its axis index folded into ``key``).
            sharding: where the pool lives; on a mesh, a replicated sharding, so every
                device holds the whole pool and gathers from it locally.

        Returns:
            :class:`PoolStarts`. Jittable.
        """
        if shard_axis is not None:
            key = jax.random.fold_in(key, jax.lax.axis_index(shard_axis))
        keys = jax.random.split(key, self.num_blocks(rollout_length) * int(self.size))
        env_state, ts = jax.vmap(env.reset, in_axes=(0, None))(keys, params)
        pool = PoolStarts(env_state=env_state, timestep=ts)
        if sharding is not None:
            pool = jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, sharding), pool)
        return pool

    def autoreset_step(
        self,
        env: Env,
        step_keys: jax.Array,
        index_key: jax.Array,
        t: jax.Array,
        pool: PoolStarts,
        state: Any,
        action: Any,
        needs_reset: jax.Array,
        params: Any,
    ) -> tuple[Any, TimeStep]:
        """:func:`autoreset_step` with the resets taken from ``pool``.

        Args:
            env: the env (static).
            step_keys: ``[E]`` PRNG keys for the steps.
            index_key: one PRNG key: each env's pool entry is drawn from it.
            t: ``int32[]``, the step within the call (picks the pool block).
            pool: this call's :class:`PoolStarts` (from :meth:`draw`).
            state, action, needs_reset, params: as for :func:`autoreset_step`.

        Returns:
            ``(state, timestep)`` with leaves ``[E, ...]``; envs with ``needs_reset[e]``
            hold a pool entry. Jittable.
        """
        num_envs = needs_reset.shape[0]
        block = 0 if self.refresh_every is None else t // self.refresh_every
        idx = block * self.size + jax.random.randint(index_key, (num_envs,), 0, self.size)
        fresh = jax.tree.map(lambda x: jnp.take(x, idx, axis=0, mode="clip"), pool)
        st_state, st_ts = step(env, step_keys, state, action, params)
        return (
            select_envs(needs_reset, fresh.env_state, st_state),
            select_envs(needs_reset, fresh.timestep, st_ts),
        )


def as_reset_pool(reset_pool: ResetPool | int | None) -> ResetPool | None:
    """``reset_pool=`` normalized: ``None`` (exact auto-reset), a :class:`ResetPool`, or an
    int ``P`` (``ResetPool(P)``: one pool of ``P`` per call).

    Raises:
        TypeError: anything else; ValueError: an int below 1.
    """
    if reset_pool is None or isinstance(reset_pool, ResetPool):
        return reset_pool
    if isinstance(reset_pool, (int, np.integer)) and not isinstance(reset_pool, bool):
        return ResetPool(int(reset_pool))
    raise TypeError(
        "reset_pool= takes None (exact auto-reset), an int pool size or a ResetPool, got "
        f"{type(reset_pool).__name__}"
    )
