"""Vectorization over the env axis (and helpers for the agent axis), with auto-reset.

Every env already returns a leading agent axis; :func:`vmap_agents` lifts per-agent
functions onto it. :func:`reset` / :func:`step` add the env axis with one ``jax.vmap``.
:func:`autoreset_step` implements the library's "next-step" auto-reset (see
:mod:`jaxsampler.types`): envs flagged ``needs_reset`` are reset instead of stepped, so
the step that ended an episode keeps its real final observation.

Both the step and the reset are computed for every env and selected leaf by leaf: under
``vmap`` a ``lax.cond`` would run both branches anyway, and a select is cheaper than a
gather/scatter of the envs that need it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxsampler.envs.base import Env
from jaxsampler.types import TimeStep

__all__ = ["vmap_agents", "reset", "step", "autoreset_step", "select_envs"]


def vmap_agents(fn: Callable[..., Any], in_axes: Any = 0) -> Callable[..., Any]:
    """``jax.vmap`` over the agent axis: lifts a one-agent function to ``[A, ...]`` inputs."""
    return jax.vmap(fn, in_axes=in_axes)


def reset(env: Env, keys: jax.Array, params: Any) -> tuple[Any, TimeStep]:
    """Resets ``E`` envs. ``keys``: ``[E]`` PRNG keys. Returns leaves ``[E, ...]``. Jittable."""
    return jax.vmap(env.reset, in_axes=(0, None))(keys, params)


def step(env: Env, keys: jax.Array, state: Any, action: Any, params: Any) -> tuple[Any, TimeStep]:
    """Steps ``E`` envs with ``action`` leaves ``[E, A, ...]``. Jittable."""
    return jax.vmap(env.step, in_axes=(0, 0, 0, None))(keys, state, action, params)


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
        params: env params (shared by all envs).

    Returns:
        ``(state, timestep)`` with leaves ``[E, ...]``. Reset envs report reward 0 and
        ``terminated = truncated = False``. Jittable and vmappable.
    """
    st_state, st_ts = step(env, step_keys, state, action, params)
    re_state, re_ts = reset(env, reset_keys, params)
    return select_envs(needs_reset, re_state, st_state), select_envs(needs_reset, re_ts, st_ts)
