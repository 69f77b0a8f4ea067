"""Evaluation: exactly ``num_episodes`` complete episodes, without a short-episode bias.

::

    result = js.evaluate(env, policy, params, num_episodes=100, key=key)
    result.mean_return, result.returns, result.lengths

Why not "the first N episodes to finish": in a batch of envs the short episodes end
first, so the first N finished episodes over-represent them and the mean return is
biased (towards failures, in an env that rewards survival). :func:`evaluate` instead
fixes the episodes in advance, ``0 .. N-1``, and runs every one of them to its end:
``num_envs`` envs start with episodes ``0 .. num_envs-1`` (each env's first episode);
when ``num_episodes > num_envs``, an env whose episode ended takes the next episode not
yet started (a fresh reset, the rollout's auto-reset step), and the loop runs until the
last episode is done. Nothing is selected by when it finished, so every episode is a
sample of the same distribution and the mean is unbiased. The whole evaluation is one
jitted ``lax.while_loop`` that accumulates returns and lengths in place (no trajectory
is stored) and writes each episode's results at its index.

Keys: with ``k_reset, k_step, k_policy, k_params = jax.random.split(key, 4)``, episode
``i`` is reset with ``jax.random.fold_in(k_reset, i)`` and its step ``t`` uses
``fold_in(fold_in(k_step, i), t)``, whichever env runs it; the policy's key at loop
iteration ``n`` is ``fold_in(k_policy, n)``, and a transform that draws env params gets
``fold_in(k_params, 0)`` for the first episodes, ``fold_in(k_params, n + 1)`` at
iteration ``n``. So with a deterministic policy (``deterministic=True``) the results
do not depend on ``num_envs``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsampler import vector
from jaxsampler.envs.base import Env
from jaxsampler.policies.base import Policy
from jaxsampler.policies.greedy import greedy
from jaxsampler.rollout.scan import Transforms, check_action, check_compatible, policy_action_zeros
from jaxsampler.transforms.base import Context, Pipeline, StageState, TransformState
from jaxsampler.types import RolloutState

__all__ = ["EvalResult", "evaluate", "DEFAULT_MAX_ENVS", "DEFAULT_MAX_STEPS"]

#: ``num_envs`` defaults to ``min(num_episodes, DEFAULT_MAX_ENVS)``.
DEFAULT_MAX_ENVS = 1024
#: The step bound of an env whose params have no ``max_steps_in_episode``.
DEFAULT_MAX_STEPS = 10_000


@dataclasses.dataclass(frozen=True, repr=False)
class EvalResult:
    """The episodes of one :func:`evaluate` call (numpy arrays, one entry per episode).

    Attributes:
        returns: ``float64[N]``, each episode's return: the sum of the env's own (raw)
            rewards over its steps and agents, whatever the transforms do to rewards.
        lengths: ``int64[N]``, env steps in each episode.
        terminated: ``bool[N]``, every agent's episode ended in a terminal state.
        truncated: ``bool[N]``, some agent's episode was truncated by the env's time
            limit, or the episode was cut by ``evaluate``'s ``max_steps``.
        env_params: the params each episode ran with (leaves ``[N, ...]``, numpy), when
            they differ per episode (per-episode ``env_params``, or a transform that draws
            them); ``None`` when every episode ran with the same shared params.
        agent_returns: ``float64[N, A]``, each agent's share of ``returns``.
    """

    returns: np.ndarray
    lengths: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    env_params: Any = None
    agent_returns: np.ndarray | None = None

    @property
    def num_episodes(self) -> int:
        """Episodes evaluated."""
        return int(self.returns.shape[0])

    @property
    def mean_return(self) -> float:
        """Mean undiscounted return over the episodes."""
        return float(np.mean(self.returns))

    @property
    def std_return(self) -> float:
        """Population standard deviation (``ddof=0``) of the returns."""
        return float(np.std(self.returns))

    @property
    def mean_length(self) -> float:
        """Mean episode length in env steps."""
        return float(np.mean(self.lengths))

    def as_dict(self) -> dict[str, float | int]:
        """Summary metrics for logging, under RLlib's metric names (``episode_return_mean``,
        ``episode_len_mean``, ...) plus ``episode_return_std``, ``num_episodes`` and the
        counts of terminated and truncated episodes."""
        return {
            "num_episodes": self.num_episodes,
            "episode_return_mean": self.mean_return,
            "episode_return_std": self.std_return,
            "episode_return_min": float(np.min(self.returns)),
            "episode_return_max": float(np.max(self.returns)),
            "episode_len_mean": self.mean_length,
            "episode_len_min": int(np.min(self.lengths)),
            "episode_len_max": int(np.max(self.lengths)),
            "num_terminated": int(np.sum(self.terminated)),
            "num_truncated": int(np.sum(self.truncated)),
        }

    def __repr__(self) -> str:
        extra = "" if self.env_params is None else ", per-episode env_params"
        return (
            f"EvalResult(num_episodes={self.num_episodes}, mean_return={self.mean_return:.4g}, "
            f"std_return={self.std_return:.4g}, mean_length={self.mean_length:.4g}, "
            f"terminated={int(np.sum(self.terminated))}, "
            f"truncated={int(np.sum(self.truncated))}{extra})"
        )


def _check_count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def _shared_of(pipe: Pipeline, transform_state: Any) -> tuple[Any, ...] | None:
    """The ``shared`` statistics of a training state, checked against ``pipe``."""
    if transform_state is None:
        return None
    if isinstance(transform_state, RolloutState):
        transform_state = transform_state.transform_state
    names = [type(t).__name__ for t in pipe.transforms] or "no transforms"
    if not pipe:
        raise ValueError(
            "evaluate: transform_state was given without transforms; pass the transforms= "
            "the state was trained with"
        )
    if not isinstance(transform_state, TransformState):
        raise TypeError(
            "evaluate: transform_state must be the training RolloutState or its "
            f"transform_state (a TransformState), got {type(transform_state).__name__}"
        )
    want = jax.eval_shape(lambda: pipe.init((1, 1)))
    assert want is not None
    shared = tuple(st.shared for st in transform_state.stages)
    want_shared = tuple(st.shared for st in want.stages)
    got_def: Any = jax.tree.structure(shared)  # PyTreeDef: untyped for mypy
    same = got_def == jax.tree.structure(want_shared) and all(
        tuple(np.shape(a)) == tuple(b.shape)
        for a, b in zip(jax.tree.leaves(shared), jax.tree.leaves(want_shared))
    )
    if not same:
        raise ValueError(
            f"evaluate: transform_state does not match the transforms ({names}): pass the "
            "RolloutState (or its transform_state) of a rollout built with the same "
            "transforms= on the same env"
        )
    return shared


def _episode_params(env: Env, env_params: Any, num_episodes: int) -> tuple[Any, bool]:
    """``(params, per_episode)``: validates the shapes of ``env_params`` for ``N`` episodes."""
    try:
        axes = vector.param_axes(env, env_params, num_episodes)
    except ValueError as e:  # the per-env axis of evaluate is the episode axis
        msg = str(e).replace("(shared by every env)", "(shared by every episode)")
        msg = msg.replace(
            f"(one per env, num_envs={num_episodes})",
            f"(one per episode, num_episodes={num_episodes}: episode i runs with params i)",
        )
        raise ValueError(f"evaluate: {msg}") from None
    per_episode = any(a == 0 for a in jax.tree.leaves(axes))
    return env_params, per_episode


def _default_max_steps(env_params: Any) -> int:
    limit = getattr(env_params, "max_steps_in_episode", None)
    if limit is None:
        return DEFAULT_MAX_STEPS
    try:
        return int(np.max(np.asarray(limit))) + 1
    except (TypeError, jax.errors.ConcretizationTypeError):
        return DEFAULT_MAX_STEPS


def _per_env_fold(key: jax.Array, idx: jax.Array) -> jax.Array:
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, idx)


def _frozen_transform_state(pipe: Pipeline, shape: tuple[int, int], shared: Any) -> Any:
    """The pipeline's initial state for ``shape`` (``(E, A)``) with its stages' shared
    statistics replaced by ``shared`` (an evaluation's frozen statistics; ``None``: the
    fresh ones); ``None`` without transforms."""
    tstate = pipe.init(shape)
    if tstate is not None and shared is not None:
        tstate = dataclasses.replace(
            tstate,
            stages=tuple(StageState(sh, st.rows) for sh, st in zip(shared, tstate.stages)),
        )
    return tstate


def _observe_first(
    pipe: Pipeline, tstate: Any, ts: Any, shape: tuple[int, int], ctx: Context
) -> tuple[Any, Any]:
    """``(transform state, policy observation)`` after every env of ``shape`` was reset:
    the transforms see the reset timestep (with zero previous actions); without
    transforms the env's own observation."""
    if not pipe:
        return tstate, ts.obs
    assert tstate is not None
    zeros = policy_action_zeros(pipe, shape)
    tstate, seen = pipe.observe_timestep(tstate, ts, jnp.ones((shape[0],), jnp.bool_), zeros, ctx)
    return tstate, seen.obs


def _select_rows(mask: jax.Array, keep: TransformState, new: TransformState) -> TransformState:
    """``new`` with the per-env ``rows`` and ``done`` of envs in ``mask`` taken from ``keep``."""
    stages = tuple(
        dataclasses.replace(n, rows=vector.select_envs(mask, k.rows, n.rows))
        for k, n in zip(keep.stages, new.stages)
    )
    return TransformState(stages, vector.select_envs(mask, keep.done, new.done))


def _gather_params(env_params: Any, per_episode: bool, idx: jax.Array) -> Any:
    """The params of episodes ``idx`` (``[E]``): rows of the per-episode table, or the
    shared params as they are."""
    if not per_episode:
        return env_params
    return jax.tree.map(lambda x: x[idx], env_params)


def _scatter(buf: Any, idx: jax.Array, value: Any) -> Any:
    """``buf[idx] = value`` leaf by leaf; indices out of range (``N``) are dropped."""
    return jax.tree.map(lambda b, v: b.at[idx].set(v.astype(b.dtype), mode="drop"), buf, value)


def _run_impl(
    params: Any,
    env_params: Any,
    shared: Any,
    keys: jax.Array,
    max_steps: jax.Array,
    *,
    env: Env,
    policy: Policy,
    pipe: Pipeline,
    num_envs: int,
    num_episodes: int,
    per_episode: bool,
) -> dict[str, Any]:
    """The whole evaluation: ``E`` slots run episodes ``0 .. N-1`` to completion.

    Slot ``e`` starts with episode ``e``; when its episode ends and episodes are left,
    it takes the next one (a reset step, as the rollout's auto-reset); the loop ends
    when every episode is done. Results are written by episode index, so they do not
    depend on which slot ran an episode nor on when it finished.
    """
    E, A, N = num_envs, env.num_agents, num_episodes
    refill = N > E
    ctx = Context(frozen=True)
    k_reset, k_step, k_pol, k_params = (keys[i] for i in range(4))
    drawn = pipe.randomizes_params
    slot_ep = jnp.arange(E, dtype=jnp.int32)
    tstate = _frozen_transform_state(pipe, (E, A), shared)
    slot_params = _gather_params(env_params, per_episode, slot_ep)
    out_params = None
    if drawn:
        assert tstate is not None
        tstate, slot_params = pipe.reset_params(
            tstate,
            jax.random.fold_in(k_params, 0),
            jnp.ones((E,), jnp.bool_),
            vector.broadcast_params(env, slot_params, E),
            ctx,
        )
        out_params = jax.tree.map(
            lambda x: jnp.zeros((N,) + x.shape[1:], x.dtype).at[:E].set(x[:N]), slot_params
        )
    env_state, ts = vector.reset(env, _per_env_fold(k_reset, slot_ep), slot_params)
    tstate, obs = _observe_first(pipe, tstate, ts, (E, A), ctx)
    init_pstate = policy.initial_state((E, A))
    has_pstate = refill and len(jax.tree.leaves(init_pstate)) > 0
    flags = jnp.zeros((E, A), jnp.bool_)
    carry = _Carry(
        t=jnp.zeros((), jnp.int32),
        env_state=env_state,
        obs=obs,
        pstate=init_pstate,
        tstate=tstate,
        slot_params=slot_params if drawn else None,
        slot_ep=slot_ep,
        next_ep=jnp.int32(E),
        needs_reset=jnp.zeros((E,), jnp.bool_),
        idle=slot_ep >= N,
        ep_t=jnp.zeros((E,), jnp.int32),
        agent_done=flags,
        term=flags,
        trunc=flags,
        returns=jnp.zeros((E, A), jnp.float32),
        out_returns=jnp.zeros((N, A), jnp.float32),
        out_lengths=jnp.zeros((N,), jnp.int32),
        out_terminated=jnp.zeros((N,), jnp.bool_),
        out_truncated=jnp.zeros((N,), jnp.bool_),
        out_params=out_params,
    )

    def cond(c: _Carry) -> jax.Array:
        return ~jnp.all(c.idle)

    def body(c: _Carry) -> _Carry:
        t, idle, needs_reset, slot_ep = c.t, c.idle, c.needs_reset, c.slot_ep
        pstate = c.pstate
        if has_pstate:  # an episode's first step starts from the initial state
            pstate = vector.select_envs(c.ep_t == 0, init_pstate, pstate)
        action, _, pstate = policy(params, c.obs, jax.random.fold_in(k_pol, t), pstate)
        check_action(pipe.action_space, action, (E, A))
        env_action = pipe.to_env(action) if pipe.changes_action else action
        check_action(env.action_space, env_action, (E, A))
        tstate, out_params = c.tstate, c.out_params
        if drawn:
            base = c.slot_params
            if per_episode:
                base = vector.select_envs(
                    needs_reset, _gather_params(env_params, True, slot_ep), base
                )
            tstate, step_params = pipe.reset_params(
                tstate, jax.random.fold_in(k_params, t + 1), needs_reset, base, ctx
            )
            out_params = _scatter(out_params, jnp.where(needs_reset, slot_ep, N), step_params)
        else:
            step_params = _gather_params(env_params, per_episode, slot_ep)
        ep_t = jnp.where(needs_reset, 0, c.ep_t)
        step_keys = jax.vmap(jax.random.fold_in)(_per_env_fold(k_step, slot_ep), ep_t)
        if refill:
            reset_keys = _per_env_fold(k_reset, slot_ep)
            env_state, ts = vector.autoreset_step(
                env, step_keys, reset_keys, c.env_state, env_action, needs_reset, step_params
            )
        else:
            env_state, ts = vector.step(env, step_keys, c.env_state, env_action, step_params)
        obs = ts.obs
        if pipe:
            tstate, seen = pipe.observe_timestep(tstate, ts, needs_reset, action, ctx)
            obs = seen.obs
            tstate = _select_rows(idle, c.tstate, tstate)
        # Slots that run an episode this step (not idle, not resetting).
        live = ~idle & ~needs_reset
        live_a = live[:, None]
        fresh = needs_reset[:, None]  # accumulators restart with a new episode
        agent_done = jnp.where(fresh, False, c.agent_done)
        ended_a = ts.terminated | ts.truncated
        newly_a = live_a & ~agent_done
        term = jnp.where(newly_a, ts.terminated, jnp.where(fresh, False, c.term))
        trunc = jnp.where(newly_a, ts.truncated, jnp.where(fresh, False, c.trunc))
        agent_done = agent_done | (live_a & ended_a)
        returns = jnp.where(fresh, 0.0, c.returns) + jnp.where(live_a, ts.reward, 0.0)
        ep_t = ep_t + live.astype(jnp.int32)
        finished = jnp.all(agent_done, axis=-1)
        cut = ~finished & (ep_t >= max_steps)
        ended = live & (finished | cut)
        at = jnp.where(ended, slot_ep, N)  # N: dropped
        # Ended slots take the next episodes, in slot order, while any are left.
        new_ep = c.next_ep + jnp.cumsum(ended.astype(jnp.int32)) - 1
        has_new = ended & (new_ep < N)
        return _Carry(
            t=t + 1,
            # Idle slots keep their final state (stepping on is undefined).
            env_state=vector.select_envs(idle, c.env_state, env_state),
            obs=vector.select_envs(idle, c.obs, obs),
            pstate=vector.select_envs(idle, c.pstate, pstate),
            tstate=tstate,
            slot_params=step_params if drawn else None,
            slot_ep=jnp.where(has_new, new_ep, slot_ep),
            next_ep=c.next_ep + jnp.sum(ended.astype(jnp.int32)),
            needs_reset=has_new,
            idle=idle | (ended & ~has_new),
            ep_t=ep_t,
            agent_done=agent_done,
            term=term,
            trunc=trunc,
            returns=returns,
            out_returns=_scatter(c.out_returns, at, returns),
            out_lengths=_scatter(c.out_lengths, at, ep_t),
            out_terminated=_scatter(c.out_terminated, at, jnp.all(term, -1) & ~cut),
            out_truncated=_scatter(c.out_truncated, at, jnp.any(trunc, -1) | cut),
            out_params=out_params,
        )

    out = jax.lax.while_loop(cond, body, carry)
    return {
        "returns": out.out_returns,
        "lengths": out.out_lengths,
        "terminated": out.out_terminated,
        "truncated": out.out_truncated,
        "env_params": out.out_params,
    }


@struct.dataclass
class _Carry:
    """The evaluation loop's carry: ``[E, ...]`` slots (envs) and ``[N, ...]`` results."""

    t: jax.Array  # int32[]: loop iteration
    env_state: Any
    obs: Any  # [E, A, ...]: what the policy sees next
    pstate: Any
    tstate: Any
    slot_params: Any  # drawn params per slot (domain randomization), else None
    slot_ep: jax.Array  # int32[E]: the episode each slot runs (>= N: none)
    next_ep: jax.Array  # int32[]: the next episode not started
    needs_reset: jax.Array  # bool[E]: the slot starts its new episode at this step
    idle: jax.Array  # bool[E]: no episode left for the slot
    ep_t: jax.Array  # int32[E]: steps of the slot's episode
    agent_done: jax.Array  # bool[E, A]
    term: jax.Array  # bool[E, A]: each agent's flags at its last step
    trunc: jax.Array
    returns: jax.Array  # float32[E, A]
    out_returns: jax.Array  # float32[N, A]
    out_lengths: jax.Array  # int32[N]
    out_terminated: jax.Array  # bool[N]
    out_truncated: jax.Array  # bool[N]
    out_params: Any


_run = jax.jit(
    _run_impl,
    static_argnames=("env", "policy", "pipe", "num_envs", "num_episodes", "per_episode"),
)


def evaluate(
    env: Env,
    policy: Policy,
    params: Any,
    num_episodes: int,
    key: jax.Array,
    *,
    deterministic: bool = True,
    transforms: Transforms = None,
    transform_state: TransformState | RolloutState | None = None,
    env_params: Any = None,
    num_envs: int | None = None,
    max_steps: int | None = None,
) -> EvalResult:
    """Runs ``policy`` for exactly ``num_episodes`` complete episodes of ``env``.

    Episodes ``0 .. N-1`` are fixed in advance and each runs to its end, so short
    episodes are not over-represented (see :mod:`jaxsampler.rollout.evaluation`): with
    ``N <= num_envs`` each env contributes its first episode only; with more episodes,
    an env whose episode ended starts the next one not yet started. The evaluation is
    one jitted ``lax.while_loop``; a second call with the same env, policy, transforms,
    ``num_episodes`` and ``num_envs`` (and params of the same shapes) does not compile
    again.

    Args:
        env: the env.
        policy: the policy, built for the spaces the transforms hand on.
        params: the policy's params.
        num_episodes: ``N``, the number of episodes returned.
        key: a PRNG key (raw ``uint32[2]`` or typed); see the module docstring for how
            episodes draw their keys.
        deterministic: act greedily (:func:`jaxsampler.policies.greedy.greedy`: argmax of
            the logits, the Gaussian's mean); ``False``: act as the policy is configured
            (``explore=True`` samples).
        transforms: the transforms the policy was trained with. They run with their
            statistics frozen (``Context(frozen=True)``): normalization uses, and never
            updates, the statistics of ``transform_state``.
        transform_state: the training ``RolloutState`` (or its ``transform_state``):
            its ``shared`` statistics (e.g. ``NormalizeObservation``'s running moments)
            are used; per-env ``rows`` (frame stacks, ...) start fresh for the eval envs.
            Without it the transforms start from fresh statistics (for normalization:
            mean 0, variance 1 until updated, i.e. never while frozen).
        env_params: ``env.default_params`` by default. Shared by every episode, or per
            episode: leaves with a leading ``[N]`` axis (``vector.param_axes``
            semantics), episode ``i`` running with params ``i``.
        num_envs: envs stepped side by side; ``min(N, 1024)`` by default (more than
            ``N`` is cut to ``N``).
        max_steps: step bound of an episode; ``max_steps_in_episode + 1`` of the params
            where they have it, else 10 000. Episodes still running then are reported
            as truncated (``terminated=False``), with length ``max_steps``.

    Returns:
        An :class:`EvalResult` (numpy arrays, episode ``i`` at index ``i``).

    Raises:
        ValueError: ``num_episodes`` (or ``num_envs``, ``max_steps``) not an int >= 1;
            ``env_params`` with a leading axis other than ``num_episodes`` (naming the
            leaf and the shapes); a ``transform_state`` of other transforms; a policy
            that does not fit the env's (transformed) spaces.
        TypeError: ``deterministic=True`` with a policy that cannot act greedily (e.g.
            ``RandomPolicy``): pass ``deterministic=False`` for it.
    """
    N = _check_count(num_episodes, "num_episodes")
    E = min(N, DEFAULT_MAX_ENVS) if num_envs is None else min(_check_count(num_envs, "num_envs"), N)
    if isinstance(key, (int, np.integer)):
        raise TypeError(
            f"evaluate: key must be a PRNG key (jax.random.key(seed) or "
            f"jax.random.PRNGKey(seed)), got the int {key!r}"
        )
    pipe = check_compatible(env, policy, transforms)
    if deterministic:
        try:
            policy = greedy(policy)
        except TypeError as e:
            raise TypeError(f"evaluate(deterministic=True): {e}; or deterministic=False") from e
    shared = _shared_of(pipe, transform_state)
    env_params = env.default_params if env_params is None else env_params
    env_params, per_episode = _episode_params(env, env_params, N)
    if max_steps is None:
        max_steps = _default_max_steps(env_params)
    max_steps = _check_count(max_steps, "max_steps")
    # Python numbers as arrays: the same compiled loop serves every call.
    env_params = jax.tree.map(jnp.asarray, env_params)
    if per_episode:
        env_params = vector.broadcast_params(env, env_params, N)
    out = _run(
        params,
        env_params,
        shared,
        jax.random.split(key, 4),
        jnp.int32(max_steps),
        env=env,
        policy=policy,
        pipe=pipe,
        num_envs=E,
        num_episodes=N,
        per_episode=per_episode,
    )

    def gather(name: str, dtype: Any = None) -> Any:
        return jax.tree.map(lambda x: np.asarray(x).astype(dtype or x.dtype), out[name])

    agent_returns = gather("returns", np.float64)
    episode_params = None
    if pipe.randomizes_params:
        episode_params = gather("env_params")
    elif per_episode:
        episode_params = jax.tree.map(np.asarray, env_params)
    return EvalResult(
        returns=agent_returns.sum(axis=-1),
        lengths=gather("lengths", np.int64),
        terminated=gather("terminated", np.bool_),
        truncated=gather("truncated", np.bool_),
        env_params=episode_params,
        agent_returns=agent_returns,
    )
