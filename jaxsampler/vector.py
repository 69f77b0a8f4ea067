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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxsampler.types import TimeStep

__all__ = [
    "vmap_agents",
    "reset",
    "step",
    "autoreset_step",
    "select_envs",
    "param_axes",
    "broadcast_params",
]


class Env(Protocol):
    """What the env axis needs of an env: :class:`jaxsampler.envs.base.Env`'s two
    functions (structural, so this layer sits below the envs that use it)."""

    def reset(self, key: jax.Array, params: Any = None) -> tuple[Any, TimeStep]: ...

    def step(
        self, key: jax.Array, state: Any, action: Any, params: Any = None
    ) -> tuple[Any, TimeStep]: ...


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
