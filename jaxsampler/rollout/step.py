"""One step of the rollout, as pure functions the scan body composes.

The policy side, the env side and the state update are separate functions with explicit
inputs, so each can be traced and tested alone; the feature switches (transforms, domain
randomization, reset pool, recurrent state) are plain ``if``\\ s on static values here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxsampler import vector
from jaxsampler.envs.base import Env
from jaxsampler.policies.base import Policy
from jaxsampler.rollout.compat import check_action
from jaxsampler.rollout.keys import StepKeys
from jaxsampler.transforms.base import Context, Pipeline
from jaxsampler.types import RolloutState

__all__ = [
    "Transition",
    "PolicyStep",
    "Outcome",
    "acting_only",
    "policy_step",
    "env_step",
    "advance",
]


@struct.dataclass(kw_only=True)
class Transition:
    """What one step writes into the buffers at slot ``t``: every field is named as the
    :class:`~jaxsampler.types.Trajectory` field it goes to, without the time axis.

    The field order is the order :func:`~jaxsampler.rollout.buffers.write` traces its
    updates in (the optional tracks first), which keeps the lowered program as it was
    before the scan body was split up.

    Attributes:
        raw_obs: the env's own observation behind ``obs`` (leaves ``[E, A, ...]``), or
            ``None`` when no transform changes observations.
        raw_rewards: the env's own reward (``float32[E, A]``), or ``None`` when no
            transform changes rewards.
        env_params: the params each env stepped with (leaves ``[E, ...]`` or shared), or
            ``None`` without domain randomization.
        obs: the policy's input at this step (leaves ``[E, A, ...]``).
        actions: the policy's action (leaves ``[E, A, ...]``).
        rewards: the reward after the transforms (``float32[E, A]``).
        terminated, truncated: ``bool[E, A]``, the env's flags of this transition.
        acting: ``bool[E, A]``, the agents that acted (none in an env that reset).
        is_reset: ``bool[E]``, this step reset the env.
        extras: the policy's extra outputs (leaves ``[E, A, ...]``).
        infos: the env's info (leaves ``[E, ...]``).
    """

    raw_obs: Any = None
    raw_rewards: Any = None
    env_params: Any = None
    obs: Any
    actions: Any
    rewards: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    acting: jax.Array
    is_reset: jax.Array
    extras: Any
    infos: Any


@struct.dataclass
class PolicyStep:
    """The policy side of one step.

    Attributes:
        action: the policy's action, leaves ``[E, A, ...]`` (what the trajectory records).
        env_action: the action the env receives (after the transforms' ``to_env``; the
            same object as ``action`` when no transform changes actions).
        extras: the policy's extra outputs, leaves ``[E, A, ...]``.
        policy_state: the policy's recurrent state after the step, leaves ``[E, A, ...]``.
    """

    action: Any
    env_action: Any
    extras: Any
    policy_state: Any


@struct.dataclass
class Outcome:
    """What the carried state keeps from one env step (the buffers get a :class:`Transition`).

    Attributes:
        env_state: the env state after the step (or reset), leaves ``[E, ...]``.
        obs: the policy's next input (after the transforms), leaves ``[E, A, ...]``.
        raw_obs: the env's own next observation when transforms change observations, else
            the state's ``raw_obs`` unchanged.
        transform_state: the transforms' state after the step.
        env_params: the params the envs stepped with.
        acting: ``bool[E, A]``, the agents that act at the next step.
        policy_state: the policy's recurrent state after the step.
    """

    env_state: Any
    obs: Any
    raw_obs: Any
    transform_state: Any
    env_params: Any
    acting: jax.Array
    policy_state: Any


def acting_only(env: Env, policy: Policy, initial_policy_state: Any) -> int | None:
    """How many agent rows the policy runs on per env when only the acting ones need it:
    ``env.max_acting`` when the env declares fewer than ``num_agents``, the policy can act
    on rows (:attr:`~jaxsampler.policies.Policy.acts_on_rows`) and is stateless (a
    recurrent state advances for every agent at every step, so it needs every row);
    ``None`` otherwise (the policy runs on all ``E x A`` rows). Static."""
    k = getattr(env, "max_acting", None)
    stateless = len(jax.tree.leaves(initial_policy_state)) == 0
    if k is None or not 1 <= k < env.num_agents or not stateless or not policy.acts_on_rows:
        return None
    return int(k)


def policy_step(
    policy: Policy,
    pipe: Pipeline,
    env: Env,
    params: Any,
    state: RolloutState,
    key: jax.Array,
    initial_policy_state: Any,
) -> PolicyStep:
    """Runs the policy on ``state.obs`` and maps its action through the transforms.

    A recurrent state is reset to ``initial_policy_state`` in the envs whose episode
    starts at this step (``state.episode_step == 0``). In a turn-based env
    (:func:`acting_only`), the policy acts on the acting agents' rows only
    (``policy.act_on_rows``): the other agents' actions and extras are zero placeholders,
    which nothing reads (those agents do not act), except ``vf_preds``, which holds the
    value of every acting agent and of every agent of an env that resets at this step
    (GAE and n-step returns bootstrap from those); a policy that cannot restrict its
    critic (:attr:`~jaxsampler.policies.Policy.values_on_rows` False) gives every row's.
    Only for envs that declare ``agents_end_together`` (TicTacToe, every pgx game): where
    one agent can be done while the others play on, n-step returns and V-trace would
    bootstrap it from the step after its end, which is no reset step, so every row's value
    is computed there.

    Args:
        policy: the policy (static).
        pipe: the bound pipeline (static).
        env: the env (static; its action space checks the env-side action).
        params: the policy's params.
        state: the rollout state (leaves ``[E, ...]``).
        key: the policy's key for this step (:attr:`StepKeys.policy`).
        initial_policy_state: ``policy.initial_state((E, A))`` (a pytree without leaves
            for a stateless policy).

    Returns:
        The :class:`PolicyStep`. Jit-safe; the actions' shapes and dtypes are checked at
        trace time.

    Raises:
        ValueError / TypeError (at trace time): an action (policy or env side) of the
            wrong structure, shape or dtype for ``[E, A]`` and its space.
    """
    batch = (state.needs_reset.shape[0], env.num_agents)
    pstate = state.policy_state
    if len(jax.tree.leaves(initial_policy_state)) > 0:
        pstate = vector.select_envs(state.episode_step == 0, initial_policy_state, pstate)
    k = acting_only(env, policy, initial_policy_state)
    if k is None:
        action, extras, pstate = policy(params, state.obs, key, pstate)
    else:  # a turn-based env: the network runs on the acting agents' rows only
        rows = vector.acting_rows(state.acting, k)
        if policy.values_on_rows and getattr(env, "agents_end_together", False):
            # values where GAE and n-step returns read them: acting and reset rows
            needed = state.acting | state.needs_reset[:, None]
            action, extras, pstate = policy.act_on_rows(
                params, state.obs, key, pstate, rows, value_rows=needed
            )
        else:
            action, extras, pstate = policy.act_on_rows(params, state.obs, key, pstate, rows)
    check_action(pipe.action_space, action, batch)
    env_action = pipe.to_env(action) if pipe.changes_action else action
    check_action(env.action_space, env_action, batch)
    return PolicyStep(action=action, env_action=env_action, extras=extras, policy_state=pstate)


def env_step(
    env: Env,
    pipe: Pipeline,
    state: RolloutState,
    act: PolicyStep,
    keys: StepKeys,
    t: jax.Array,
    *,
    ctx: Context,
    pool: vector.ResetPool | None = None,
    starts: vector.PoolStarts | None = None,
) -> tuple[Transition, Outcome]:
    """Steps the envs (resetting those that need it) and runs the transforms on the result.

    With domain randomization the envs that reset draw new params first (from
    ``keys.params``). Without a pool each env resets itself (``keys.env_resets``); with
    one, ``keys.reset`` picks each resetting env's start among ``starts``.

    Args:
        env: the env (static).
        pipe: the bound pipeline (static).
        state: the rollout state before the step (leaves ``[E, ...]``).
        act: this step's :class:`PolicyStep`.
        keys: this step's :class:`~jaxsampler.rollout.keys.StepKeys`.
        t: ``int32[]``, the step within the call (picks the pool block).
        ctx: the transforms' context (the shard axis their statistics reduce over).
        pool, starts: the reset pool and this call's starts, or ``None`` (exact reset).

    Returns:
        ``(transition, outcome)``: what the buffers record at slot ``t`` and what the next
        state keeps. Jit-safe.
    """
    tstate, env_params = state.transform_state, state.env_params
    if pipe.randomizes_params:
        assert keys.params is not None
        tstate, env_params = pipe.reset_params(
            tstate, keys.params, state.needs_reset, env_params, ctx
        )
    if pool is None or starts is None:
        env_state, ts = vector.autoreset_step(
            env,
            keys.env_steps,
            keys.env_resets,
            state.env_state,
            act.env_action,
            state.needs_reset,
            env_params,
        )
    else:  # keys.reset picks each env's pool entry; env_resets go unused (XLA drops them)
        env_state, ts = pool.autoreset_step(
            env,
            keys.env_steps,
            keys.reset,
            t,
            starts,
            state.env_state,
            act.env_action,
            state.needs_reset,
            env_params,
        )
    obs, reward = ts.obs, ts.reward
    if pipe:
        tstate, seen = pipe.observe_timestep(tstate, ts, state.needs_reset, act.action, ctx)
        obs, reward = seen.obs, seen.reward
    transition = Transition(
        raw_obs=state.raw_obs if pipe.changes_obs else None,
        raw_rewards=ts.reward if pipe.changes_reward else None,
        env_params=env_params if pipe.randomizes_params else None,
        obs=state.obs,
        actions=act.action,
        rewards=reward,
        terminated=ts.terminated,
        truncated=ts.truncated,
        acting=state.acting & ~state.needs_reset[:, None],
        is_reset=state.needs_reset,
        extras=act.extras,
        infos=ts.info,
    )
    outcome = Outcome(
        env_state=env_state,
        obs=obs,
        raw_obs=ts.obs if pipe.changes_obs else state.raw_obs,
        transform_state=tstate,
        env_params=env_params,
        acting=ts.acting,
        policy_state=act.policy_state,
    )
    return transition, outcome


def advance(
    state: RolloutState, transition: Transition, outcome: Outcome, key: jax.Array
) -> RolloutState:
    """The state after one step.

    An env needs a reset when all its agents are done (terminated or truncated); the
    episode counter of an env that reset at this step moves on and its step count
    restarts at 0.

    Args:
        state: the state before the step.
        transition: the step's :class:`Transition` (its flags and ``is_reset``).
        outcome: the step's :class:`Outcome`.
        key: the key the next step starts from (:attr:`StepKeys.carry`).

    Returns:
        The next :class:`~jaxsampler.types.RolloutState` (counters ``int32``, flags
        ``bool``). Pure and jit-safe.
    """
    done = jnp.all(transition.terminated | transition.truncated, axis=-1)
    return dataclasses.replace(
        state,
        env_state=outcome.env_state,
        obs=outcome.obs,
        raw_obs=outcome.raw_obs,
        transform_state=outcome.transform_state,
        env_params=outcome.env_params,
        acting=outcome.acting,
        needs_reset=done,
        episode_count=state.episode_count + transition.is_reset.astype(jnp.int32),
        episode_step=jnp.where(transition.is_reset, 0, state.episode_step + 1),
        policy_state=outcome.policy_state,
        key=key,
        num_steps=state.num_steps + 1,
    )
