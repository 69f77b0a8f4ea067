"""The rollout's key schedule, in one place.

Every random stream a step uses is derived here from the carried key, so the schedule
(and what a change to it would break: recorded rollouts, exact resume) is read in one
function rather than pieced together from the scan body.
"""

from __future__ import annotations

import jax
from flax import struct

__all__ = ["StepKeys", "step_keys", "pool_key"]


@struct.dataclass
class StepKeys:
    """The keys of one scan step, all derived from the state's key.

    Attributes:
        carry: the key the next step starts from (``RolloutState.key`` after this step).
        policy: the policy's key for this step.
        env_steps: ``[E]`` keys, one per env's ``step``.
        reset: the reset stream as one key: a pooled reset picks each env's start with it.
        env_resets: ``[E]`` keys split from ``reset``, one per env's own reset.
        params: the domain randomizer's key, or ``None`` when nothing randomizes params.
    """

    carry: jax.Array
    policy: jax.Array
    env_steps: jax.Array
    reset: jax.Array
    env_resets: jax.Array
    params: jax.Array | None = None


def step_keys(
    key: jax.Array,
    num_envs: int,
    *,
    shard_axis: str | None = None,
    params_stream: bool = False,
) -> StepKeys:
    """Derives one step's key streams from the carried ``key``.

    The key splits into four: the next step's key, then the policy, step and reset
    streams. The params stream (only with ``params_stream``) is folded out of the reset
    key, so adding it leaves the other streams as they were. With ``shard_axis`` each
    shard folds its axis index into its streams (not into ``carry``): shards draw
    distinct values while carrying the same key. The per-env keys are separate splits of
    the step and reset streams, so an env whose step ignores its key lets XLA drop that
    work.

    Args:
        key: the carried PRNG key (raw ``uint32[2]`` or typed).
        num_envs: ``E``, the number of per-env keys (per shard, with ``shard_axis``).
        shard_axis: the mapped axis the env axis is a slice of; then this must run
            inside a ``shard_map`` (or ``vmap``) binding that axis name.
        params_stream: also derive the domain randomizer's key.

    Returns:
        The :class:`StepKeys`; ``env_steps`` and ``env_resets`` have a leading ``[E]``
        axis, the others are single keys of ``key``'s kind. Pure and jit-safe.
    """
    carry, k_pol, k_step, k_reset = jax.random.split(key, 4)
    k_params = jax.random.fold_in(k_reset, 1) if params_stream else None
    if shard_axis is not None:
        shard = jax.lax.axis_index(shard_axis)
        k_pol, k_step, k_reset = (jax.random.fold_in(k, shard) for k in (k_pol, k_step, k_reset))
        if k_params is not None:
            k_params = jax.random.fold_in(k_params, shard)
    env_steps, env_resets = jax.random.split(k_step, num_envs), jax.random.split(k_reset, num_envs)
    return StepKeys(
        carry=carry,
        policy=k_pol,
        env_steps=env_steps,
        reset=k_reset,
        env_resets=env_resets,
        params=k_params,
    )


def pool_key(key: jax.Array) -> jax.Array:
    """The key a rollout call draws its reset pool with, from the call's first ``key``.

    A fifth sibling of the first step's four streams (``split(key, 5)[4]``), equal to
    none of them, so a pooled rollout's other streams are the default mode's.

    Args:
        key: the state's key at the start of the call.

    Returns:
        One key of ``key``'s kind. Pure and jit-safe.
    """
    return jax.random.split(key, 5)[4]
