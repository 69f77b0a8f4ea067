"""Replay items from a rollout's :class:`~jaxsampler.types.Trajectory` (jittable).

flashbax buffers are batch-major: an added batch has leaves ``[B, L, ...]`` (``B`` rows,
each one continuing timeline). A rollout is time-major ``[T, E, A, ...]``; here every
``(env, agent)`` pair becomes one row, row ``e * A + a``, so ``B = E * A`` (``E`` for a
single-agent env) and ``L = T``.

Fixed shapes: a buffer adds the same number of rows every time, so reset steps and steps
where an agent did not act are *kept*, with ``valid = False``, rather than dropped. A
learner weights its loss by ``valid`` (each buffer sample is a fixed-size batch; the
invalid share is one reset step per episode, plus the waiting steps of turn-based
agents). Invalid transitions have reward 0 and both flags False.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxsampler import vector
from jaxsampler.offpolicy.segments import agent_segments
from jaxsampler.types import PyTree, Trajectory

__all__ = [
    "ReplayTransition",
    "SequenceStep",
    "transitions",
    "sequence_steps",
    "episode_ids",
    "episode_starts",
    "replay_policy_states",
    "to_rows",
]


@struct.dataclass
class ReplayTransition:
    """One agent step ``(obs, action, reward, next_obs, terminated, truncated, extras)``;
    leaves ``[B, T, ...]`` from :func:`transitions`, ``[S, ...]`` when sampled.

    Attributes:
        obs: the observation the agent acted on.
        action: its action.
        reward: ``float32``, the rewards until the agent's step ends (those that arrive
            while it waits included; :mod:`~jaxsampler.offpolicy.segments`).
        next_obs: what it observed next: its next acting observation, or at an episode's
            end the **real final observation** (never the next episode's first one).
        terminated: ``bool``, the step ended in a terminal state (no bootstrap).
        truncated: ``bool``, the episode was cut there (bootstrap from ``next_obs``).
        extras: the policy's extras at the step (``action_logp``, ``vf_preds``, ...).
        valid: ``bool``, a real agent step (False on reset steps and where the agent did
            not act); weight losses by it.
    """

    obs: PyTree
    action: PyTree
    reward: jax.Array
    next_obs: PyTree
    terminated: jax.Array
    truncated: jax.Array
    extras: PyTree
    valid: jax.Array


@struct.dataclass
class SequenceStep:
    """One step of a row's timeline for sequence (trajectory) buffers; leaves ``[B, T,
    ...]`` from :func:`sequence_steps`, ``[S, L, ...]`` when sampled.

    Attributes:
        obs: the observation at the step (at a reset step: the ending episode's real final
            observation).
        action, extras: the action and the policy's extras (meaningless where not valid).
        reward: ``float32``, the agent's reward of the step as the env gave it.
        terminated, truncated: ``bool``, the agent's flags of the step.
        valid: ``bool``, the agent acted (False on reset steps).
        is_reset: ``bool``, the step is a reset step.
        episode_start: ``bool``, the step is the first of an episode (reset a recurrent
            state here when unrolling across episodes).
        episode_id: ``int32``, the env's episode counter (``RolloutState.episode_count``);
            a reset step belongs to the episode it ends.
        policy_state: the policy's recurrent state *before* the step (leaves ``[..., *]``)
            when the caller supplied per-step states, else ``None``.
    """

    obs: PyTree
    action: PyTree
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    extras: PyTree
    valid: jax.Array
    is_reset: jax.Array
    episode_start: jax.Array
    episode_id: jax.Array
    policy_state: PyTree = None


def to_rows(x: jax.Array) -> jax.Array:
    """``[T, E, A, ...]`` -> ``[E * A, T, ...]`` (row ``e * A + a``)."""
    T, E, A = x.shape[:3]
    return jnp.moveaxis(x, 0, 2).reshape((E * A, T) + tuple(x.shape[3:]))


def _agents(x: jax.Array, num_agents: int) -> jax.Array:
    """``[T, E]`` -> ``[T, E, A]``."""
    return jnp.broadcast_to(x[..., None], x.shape + (num_agents,))


def episode_starts(traj: Trajectory) -> jax.Array:
    """``bool[T, E]``: step ``t`` is the first of an episode (step 0 when the call began at
    an episode's start, and every step after a reset step). Pure, jit-safe."""
    first = (traj.episode_step_0 == 0) & ~traj.is_reset[0]
    return jnp.concatenate([first[None], traj.is_reset[:-1]], axis=0)


def episode_ids(traj: Trajectory) -> jax.Array:
    """``int32[T, E]``: the env's episode counter at each step (a reset step still counts
    for the episode it ends). Pure, jit-safe."""
    before = jnp.cumsum(traj.is_reset.astype(jnp.int32), axis=0) - traj.is_reset
    return (traj.episode_count_0[None] + before).astype(jnp.int32)


def transitions(traj: Trajectory) -> ReplayTransition:
    """Every ``(env, agent, step)`` of a rollout as a transition, leaves ``[E * A, T, ...]``.

    ``next_obs`` is read from the single observation track at the slot where the agent's
    step ends (:mod:`~jaxsampler.offpolicy.segments`): ``obs[t + 1]`` for a single-agent
    env, which after a termination or truncation is the real final observation (the reset
    step's slot), never the next episode's first observation.

    Args:
        traj: a rollout's trajectory (per-agent leaves ``[T, E, A, ...]``, ``obs`` ``[T + 1,
            E, A, ...]``).

    Returns:
        :class:`ReplayTransition`, leaves ``[E * A, T, ...]`` (see the module docstring
        for ``valid``). Pure; safe under ``jit``. ``infos`` are not included.
    """
    seg = agent_segments(traj.rewards, traj.terminated, traj.truncated, traj.acting, traj.is_reset)

    def at_end(leaf: jax.Array) -> jax.Array:
        idx = seg.end.reshape(seg.end.shape + (1,) * (leaf.ndim - 3))
        idx = jnp.broadcast_to(idx, seg.end.shape + tuple(leaf.shape[3:]))
        return jnp.take_along_axis(leaf, idx, axis=0)

    valid = traj.acting
    T = traj.rollout_length
    return ReplayTransition(
        obs=jax.tree.map(lambda x: to_rows(x[:T]), traj.obs),
        action=jax.tree.map(to_rows, traj.actions),
        reward=to_rows(jnp.where(valid, seg.reward, 0.0)),
        next_obs=jax.tree.map(lambda x: to_rows(at_end(x)), traj.obs),
        terminated=to_rows(valid & seg.terminated),
        truncated=to_rows(valid & seg.truncated),
        extras=jax.tree.map(to_rows, traj.extras),
        valid=to_rows(valid),
    )


def sequence_steps(traj: Trajectory, policy_states: PyTree = None) -> SequenceStep:
    """Every row's timeline for a sequence buffer, leaves ``[E * A, T, ...]``.

    Args:
        traj: a rollout's trajectory.
        policy_states: optional per-step recurrent states *before* each step, leaves
            ``[T, E, A, ...]`` (e.g. :func:`replay_policy_states`); a sampled window's
            first ``policy_state`` is then its R2D2-style stored state.

    Returns:
        :class:`SequenceStep`, leaves ``[E * A, T, ...]``. Pure; safe under ``jit``.

    Raises:
        ValueError: ``policy_states`` leaves without the ``[T, E, A]`` prefix.
    """
    T, E, A = traj.rewards.shape
    if policy_states is not None:
        for leaf in jax.tree.leaves(policy_states):
            if tuple(leaf.shape[:3]) != (T, E, A):
                raise ValueError(
                    f"policy_states leaves must have shape [T, E, A, ...] = [{T}, {E}, {A}, "
                    f"...], got {tuple(leaf.shape)}"
                )
        policy_states = jax.tree.map(to_rows, policy_states)
    return SequenceStep(
        obs=jax.tree.map(lambda x: to_rows(x[:T]), traj.obs),
        action=jax.tree.map(to_rows, traj.actions),
        reward=to_rows(traj.rewards.astype(jnp.float32)),
        terminated=to_rows(traj.terminated),
        truncated=to_rows(traj.truncated),
        extras=jax.tree.map(to_rows, traj.extras),
        valid=to_rows(traj.acting),
        is_reset=to_rows(_agents(traj.is_reset, A)),
        episode_start=to_rows(_agents(episode_starts(traj), A)),
        episode_id=to_rows(_agents(episode_ids(traj), A)),
        policy_state=policy_states,
    )


def replay_policy_states(
    policy: Any, params: Any, traj: Trajectory, key: jax.Array | None = None
) -> PyTree:
    """The recurrent state *before* every step of a rollout, recomputed by running the
    policy over the observation track from ``traj.policy_state_0``, reset to
    ``policy.initial_state`` at each episode's first step as the rollout does.

    Exact when the policy's next state does not depend on its sampling key (true of
    :class:`~jaxsampler.policies.RecurrentPolicy`) and ``params`` are the ones the rollout
    ran with. Costs one policy forward per step.

    Args:
        policy: the rollout's policy; params: its params.
        traj: the rollout's trajectory (``obs`` leaves ``[T + 1, E, A, ...]``).
        key: the key handed to the policy (split per step); default ``PRNGKey(0)``.

    Returns:
        The states, leaves ``[T, E, A, ...]``. Pure; safe under ``jit``.
    """
    T, E, A = traj.rewards.shape
    key = jax.random.PRNGKey(0) if key is None else key
    initial = policy.initial_state((E, A))
    starts = episode_starts(traj)
    obs = jax.tree.map(lambda x: x[:T], traj.obs)

    def body(state, x):
        obs_t, start_t, key_t = x
        state = vector.select_envs(start_t, initial, state)
        _, _, nxt = policy(params, obs_t, key_t, state)
        return nxt, state

    _, states = jax.lax.scan(body, traj.policy_state_0, (obs, starts, jax.random.split(key, T)))
    return states
