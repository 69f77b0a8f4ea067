"""The trajectory buffers: their spec, their allocation, and the writes into them.

The buffers are scan carries written in place one time slot at a time; keeping the spec
and the writes together keeps the shapes the rollout allocates and the shapes it writes
from drifting apart.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxsampler import vector
from jaxsampler.envs.base import Env
from jaxsampler.policies.base import Policy
from jaxsampler.rollout.compat import Transforms, check_action, pipeline_of
from jaxsampler.rollout.step import Transition
from jaxsampler.transforms.base import Pipeline
from jaxsampler.types import RolloutState, Trajectory

__all__ = [
    "trajectory_spec",
    "allocate_trajectory",
    "with_start",
    "write",
    "write_next_obs",
]


def _step_outputs(
    env: Env, policy: Policy, params: Any, state: RolloutState, pipe: Pipeline
) -> tuple[Any, Any, Any]:
    """Abstract (action, extras, info) of one step, via ``jax.eval_shape``."""
    num_envs = state.needs_reset.shape[0]
    key = jax.random.PRNGKey(0)
    action, extras, _ = jax.eval_shape(policy, params, state.obs, key, state.policy_state)
    check_action(pipe.action_space, action, state.acting.shape)
    env_action = jax.eval_shape(pipe.to_env, action)
    check_action(env.action_space, env_action, state.acting.shape)
    _, ts = jax.eval_shape(
        lambda s, a: vector.step(env, jax.random.split(key, num_envs), s, a, state.env_params),
        state.env_state,
        env_action,
    )
    return action, extras, ts.info


def trajectory_spec(
    env: Env,
    policy: Policy,
    rollout_length: int,
    params: Any,
    state: RolloutState,
    transforms: Transforms = None,
) -> Trajectory:
    """Shapes and dtypes (``jax.ShapeDtypeStruct`` leaves) of the rollout's buffers.

    Args:
        env, policy: as given to :func:`~jaxsampler.rollout.scan.make_rollout`.
        rollout_length: ``T``.
        params: the policy's params (traced abstractly, never run).
        state: a state of the rollout (its ``[E, A]`` sizes and leaf dtypes are used).
        transforms: as given to ``make_rollout``; they decide whether ``raw_obs``,
            ``raw_rewards`` and ``env_params`` are tracked (else ``None``).

    Returns:
        A :class:`~jaxsampler.types.Trajectory` of specs: ``obs`` ``[T + 1, E, A, ...]``,
        ``actions``/``extras`` ``[T, E, A, ...]``, ``rewards`` ``float32[T, E, A]``, flags
        ``bool[T, E, A]``, ``is_reset`` ``bool[T, E]``, ``infos`` ``[T, E, ...]``, start
        counters ``int32[E]``. Jit-safe (it only traces abstractly).
    """
    pipe = pipeline_of(env, transforms)
    action, extras, info = _step_outputs(env, policy, params, state, pipe)
    T = rollout_length
    E, A = state.acting.shape

    def tm(x: Any, extra: int = 0) -> Any:
        return jax.tree.map(
            lambda leaf: jax.ShapeDtypeStruct((T + extra,) + tuple(leaf.shape), leaf.dtype), x
        )

    def sd(x: Any) -> Any:
        return jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(tuple(leaf.shape), leaf.dtype), x)

    def spec(shape: tuple[int, ...], dtype: Any) -> Any:  # a Trajectory of specs, not arrays
        return jax.ShapeDtypeStruct(shape, dtype)

    flags = spec((T, E, A), jnp.bool_)
    return Trajectory(
        obs=tm(state.obs, 1),
        actions=tm(action),
        rewards=spec((T, E, A), jnp.float32),
        terminated=flags,
        truncated=flags,
        acting=flags,
        is_reset=spec((T, E), jnp.bool_),
        extras=tm(extras),
        infos=tm(info),
        episode_count_0=spec((E,), jnp.int32),
        episode_step_0=spec((E,), jnp.int32),
        policy_state_0=sd(state.policy_state),
        raw_obs=tm(state.raw_obs, 1) if pipe.changes_obs else None,
        raw_rewards=spec((T, E, A), jnp.float32) if pipe.changes_reward else None,
        env_params=tm(state.env_params) if pipe.randomizes_params else None,
    )


def allocate_trajectory(
    env: Env,
    policy: Policy,
    rollout_length: int,
    params: Any,
    state: RolloutState,
    transforms: Transforms = None,
) -> Trajectory:
    """Zero-filled buffers for ``rollout_length`` steps.

    Args:
        env, policy, rollout_length, params, state, transforms: as for
            :func:`trajectory_spec`.

    Returns:
        A :class:`~jaxsampler.types.Trajectory` of zeros of :func:`trajectory_spec`'s
        shapes and dtypes. Jittable.
    """
    spec = trajectory_spec(env, policy, rollout_length, params, state, transforms)
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), spec)


def _put(buf: Any, t: jax.Array, value: Any) -> Any:
    """``buf`` (leaves ``[T, ...]``) with slot ``t`` set to ``value`` (leaves ``[...]``)."""
    return jax.tree.map(
        lambda b, v: jax.lax.dynamic_update_index_in_dim(b, v.astype(b.dtype), t, 0), buf, value
    )


def with_start(buffers: Trajectory, state: RolloutState) -> Trajectory:
    """``buffers`` stamped with the counters and policy state a call starts from.

    Args:
        buffers: the call's buffers.
        state: the state at slot 0.

    Returns:
        ``buffers`` with ``episode_count_0``/``episode_step_0`` (``int32[E]``) and
        ``policy_state_0`` (leaves ``[E, A, ...]``) taken from ``state``. Pure, jit-safe.
    """
    return dataclasses.replace(
        buffers,
        episode_count_0=state.episode_count,
        episode_step_0=state.episode_step,
        policy_state_0=state.policy_state,
    )


def write(buffers: Trajectory, t: jax.Array, transition: Transition) -> Trajectory:
    """Writes one step into the buffers at time slot ``t``.

    Each field of ``transition`` goes to the buffer field of the same name, leaf by
    leaf, cast to the buffer's dtype; a ``None`` field (a track the rollout does not
    keep) leaves its buffer as it is. Fields are written in ``transition``'s field order.

    Args:
        buffers: the :class:`~jaxsampler.types.Trajectory` (leaves ``[T (+1), ...]``).
        t: ``int32[]``, the slot (``0 <= t < T``; traced is fine).
        transition: the step's :class:`~jaxsampler.rollout.step.Transition` (leaves
            without the time axis).

    Returns:
        The updated buffers; in place when the buffers are a donated scan carry. Pure
        and jit-safe.
    """
    names = [f.name for f in dataclasses.fields(transition)]
    kept = [n for n in names if getattr(transition, n) is not None]
    # The buffers seen through the transition's structure: the tracks it writes, None
    # for the others, so one tree map lines every value up with its buffer.
    views: dict[str, Any] = {n: getattr(buffers, n) if n in kept else None for n in names}
    slots = Transition(**views)
    written = _put(slots, t, transition)
    return dataclasses.replace(buffers, **{n: getattr(written, n) for n in kept})


def write_next_obs(buffers: Trajectory, t: jax.Array, obs: Any, raw_obs: Any = None) -> Trajectory:
    """Writes the observation the next call starts from into the extra slot ``t = T``.

    Args:
        buffers: the buffers after the scan.
        t: ``int32[]``, the slot (``T``).
        obs: the final state's ``obs`` (leaves ``[E, A, ...]``).
        raw_obs: its ``raw_obs``, or ``None`` when the rollout keeps no raw observations.

    Returns:
        The updated buffers (``obs`` first, then ``raw_obs``). Pure and jit-safe.
    """
    buffers = dataclasses.replace(buffers, obs=_put(buffers.obs, t, obs))
    if raw_obs is not None:
        buffers = dataclasses.replace(buffers, raw_obs=_put(buffers.raw_obs, t, raw_obs))
    return buffers
