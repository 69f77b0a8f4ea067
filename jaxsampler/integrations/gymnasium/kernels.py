"""The jitted device side of the Gymnasium face: seeding, reset, the two auto-reset steps, render.

Every function works on ``N`` envs at once (the single-env face calls them with ``N = 1``), so
the single env and the vector env run the same per-env arithmetic. Each env carries its own
*key chain* (raw PRNG key data, ``uint32[N, ...]``): every reset and every step of that env
takes the next key of its chain (``chain, key = split(chain)``), whichever face drives it. An
env seeded with ``s`` starts its chain at :func:`seed_chains` of ``s``, so a vector env reset
with ``seed=s`` is, env by env, the single env reset with ``seed=s + i`` and then reset or
stepped the same way -- which is exactly what Gymnasium's ``SyncVectorEnv`` does with its
sub-envs.

The env is a static argument (hashable, compared by value), so every face of equal envs shares
one compiled kernel per shape. Pure JAX; nothing here imports Gymnasium.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxsampler import vector
from jaxsampler.envs.base import Env
from jaxsampler.types import TimeStep

__all__ = [
    "reset_all",
    "render_all",
    "seed_chains",
    "select",
    "select_jit",
    "step_next",
    "step_plain",
    "step_same",
]

#: Seeds must fit 64 bits: the chain's key is ``fold_in(key(low 32 bits), high 32 bits)``.
MAX_SEED = 2**64 - 1


def _split(chains: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``[N]`` chains (key data) -> (next chains as key data, ``[N]`` typed keys to use once)."""
    keys = jax.random.wrap_key_data(chains)
    pairs = jax.vmap(jax.random.split)(keys)  # [N, 2]
    return jax.random.key_data(pairs[:, 0]), pairs[:, 1]


@jax.jit
def _seed_key_data(high: jax.Array, low: jax.Array) -> jax.Array:
    return jax.vmap(lambda h, lo: jax.random.key_data(jax.random.fold_in(jax.random.key(lo), h)))(
        high, low
    )


def seed_chains(seeds: np.ndarray) -> jax.Array:
    """The key chains that seeds start (one per env).

    Args:
        seeds: ``uint64[N]``, each in ``[0, 2**64)``.

    Returns:
        ``uint32[N, ...]`` key data (the default PRNG implementation's), on the device.
    """
    seeds = np.asarray(seeds, np.uint64)
    high = (seeds >> np.uint64(32)).astype(np.uint32)
    low = (seeds & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    return _seed_key_data(high, low)


def select(mask: jax.Array, on_true: Any, on_false: Any) -> Any:
    """Leaf-wise ``where(mask[e], on_true, on_false)`` over a leading env axis (jittable)."""
    return vector.select_envs(mask, on_true, on_false)


_select = jax.jit(select)


def select_jit(mask: np.ndarray, on_true: Any, on_false: Any) -> Any:
    """:func:`select`, jitted: picks, env by env, from two pytrees already on the device."""
    return _select(mask, on_true, on_false)


@partial(jax.jit, static_argnums=0)
def reset_all(env: Env, chains: jax.Array, params: Any) -> tuple[jax.Array, Any, TimeStep]:
    """Resets ``N`` envs, each with the next key of its chain.

    Returns:
        ``(chains, state, timestep)``, leaves ``[N, ...]`` (timestep leaves ``[N, A, ...]``).
    """
    chains, keys = _split(chains)
    state, ts = vector.reset(env, keys, params)
    return chains, state, ts


@partial(jax.jit, static_argnums=0)
def step_plain(
    env: Env, chains: jax.Array, state: Any, action: Any, params: Any
) -> tuple[jax.Array, Any, TimeStep]:
    """Steps ``N`` envs (no auto-reset): the single env's step.

    Args:
        env: the env (static).
        chains: ``[N]`` key chains.
        state: env state, leaves ``[N, ...]``.
        action: leaves ``[N, A, *action_shape]``.
        params: the env's params (shared, or per env with a leading ``[N]``).

    Returns:
        ``(chains, state, timestep)``.
    """
    chains, keys = _split(chains)
    state, ts = vector.step(env, keys, state, action, params)
    return chains, state, ts


@partial(jax.jit, static_argnums=0)
def step_next(
    env: Env, chains: jax.Array, state: Any, action: Any, needs_reset: jax.Array, params: Any
) -> tuple[jax.Array, Any, TimeStep]:
    """Gymnasium's ``NEXT_STEP`` auto-reset: envs with ``needs_reset`` (``bool[N]``, their
    episode ended at the previous step) are reset instead of stepped and report reward 0,
    ``terminated = truncated = False`` and the reset's info; the action is ignored there.

    Each env uses one key of its chain, for its step or its reset.

    Returns:
        ``(chains, state, timestep)``.
    """
    chains, keys = _split(chains)
    state, ts = vector.autoreset_step(env, keys, keys, state, action, needs_reset, params)
    return chains, state, ts


@partial(jax.jit, static_argnums=0)
def step_same(
    env: Env, chains: jax.Array, state: Any, action: Any, params: Any
) -> tuple[jax.Array, Any, Any, Any, TimeStep, jax.Array]:
    """Gymnasium's ``SAME_STEP`` auto-reset: every env steps; an env whose episode ends at
    this step is reset at once (with the next key of its chain after the step's).

    Returns:
        ``(chains, state, obs, info, final, done)``: ``obs`` / ``info`` are the reset's where
        ``done`` (``bool[N]``) and the step's elsewhere; ``final`` is the step's
        :class:`~jaxsampler.types.TimeStep` (its ``obs`` / ``info`` are the final observation
        and info of the envs that are done; its reward and flags are this step's).
    """
    chains, keys = _split(chains)
    state, ts = vector.step(env, keys, state, action, params)
    done = jnp.any(ts.terminated | ts.truncated, axis=-1)
    reset_chains, reset_keys = _split(chains)
    re_state, re_ts = vector.reset(env, reset_keys, params)
    return (
        select(done, reset_chains, chains),
        select(done, re_state, state),
        select(done, re_ts.obs, ts.obs),
        select(done, re_ts.info, ts.info),
        ts,
        done,
    )


@partial(jax.jit, static_argnums=0)
def render_all(env: Env, state: Any, params: Any) -> jax.Array:
    """Every env's frame from the env's JAX renderer: ``uint8[N, H, W, 3]``."""
    num_envs = jax.tree.leaves(state)[0].shape[0]
    axes = vector.param_axes(env, params, num_envs)
    return jax.vmap(env.render, in_axes=(0, axes))(state, params)
