"""``HostSampler``: the :class:`~jaxsampler.sampling.base.Sampler` of envs only the host can
step (Gymnasium envs, dict-API multi-agent envs, external and served envs), so the env
steps on the host and the policy runs as one jitted call per env step."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jaxsampler.constants import ALL_AGENTS, DEFAULT_POLICY_ID
from jaxsampler.episodes.batch import MultiAgentBatch
from jaxsampler.episodes.ids import EpisodeIds
from jaxsampler.host_envs.adapt import as_host_env, is_host_stepped
from jaxsampler.host_envs.base import HostEnv, PollResult, agent_spaces, check_host_env
from jaxsampler.policies.base import Policy
from jaxsampler.policies.multi import MultiAgentPolicy
from jaxsampler.rollout.scan import Transforms, check_policy_fits
from jaxsampler.sampling.base import Sampler
from jaxsampler.sampling.host.feeds import Books, CollectorFeed, DoneRecord, Feed
from jaxsampler.sampling.host.off_policy import (
    OffPolicyCounts,
    behaviour_outputs,
    off_policy_extras,
)
from jaxsampler.sampling.host.spaces import policy_spaces
from jaxsampler.sampling.host.track import TrackFeed
from jaxsampler.sampling.host.transforms import HostTransforms, bucket
from jaxsampler.sampling.metrics import (
    SamplerMetrics,
    check_lookback,
    check_positive_int,
    explain_policy_mismatch,
    exploring_or_greedy,
)
from jaxsampler.spaces import ValueChecker, share_one_space
from jaxsampler.transforms.base import Pipeline, build_pipeline

__all__ = ["HostSampler", "abandons_episodes"]


def _default_buckets(n: int, cap: int) -> tuple[int, ...]:
    top = 1
    while top < min(max(n, 1), cap):
        top *= 2
    out, b = [], 1
    while b <= top:
        out.append(b)
        b *= 2
    return tuple(out)


def _refuse_device_options(
    host_env: HostEnv, num_envs: int | None, env_params: Any, devices: Any, mesh: Any
) -> None:
    """Raises ``ValueError`` for the family's options that have no meaning on a host env."""
    if devices is not None or mesh is not None:
        raise ValueError(
            f"devices= / mesh= split the env axis of a pure-JAX env over devices; "
            f"{type(host_env).__name__} steps its envs on the host (its policy runs on the "
            "default device): drop devices= / mesh=, or use a pure-JAX env (a "
            "jaxsampler Env or a registered id such as 'CartPole-v1')"
        )
    if env_params is not None:
        raise ValueError("env_params are for pure-JAX envs; configure a host-stepped env directly")
    if num_envs is not None and host_env.num_envs != num_envs:
        raise ValueError(f"num_envs={num_envs} but the host env has {host_env.num_envs} sub-envs")


def abandons_episodes(host_env: Any) -> bool:
    """Whether ``host_env`` can abandon episodes (its ``abandons_episodes`` attribute,
    :class:`~jaxsampler.host_envs.base.HostEnv`'s documented flag; ``False`` if absent)."""
    return bool(getattr(host_env, "abandons_episodes", False))


class HostSampler(Sampler):
    """Samples episodes from a host-stepped env with a jaxsampler policy.

    The env is any :class:`~jaxsampler.host_envs.base.HostEnv` (Gymnasium envs, dict-API
    multi-agent envs, external / served envs); the policy is a jaxsampler policy, evaluated
    as **one jitted call per policy per env step** on the observations of every agent that
    must act, stacked to ``[N, 1, ...]`` (the policy protocol's ``[E, A, ...]`` with one
    agent per row) and zero-padded to a fixed bucket size (``batch_sizes``; default powers
    of two), so the jitted function compiles at most once per bucket. More than the largest
    bucket is split into several calls.

    Loop per env step: compute and send the actions of the queued agents; ``poll()``; check
    the poll (agent ids, observations: :class:`~jaxsampler.spaces.ValueChecker`) and hand it
    to the sampler's feed (:mod:`jaxsampler.sampling.host.feeds`), which keeps the running
    episodes. An off-policy action of the poll (``off_policy_actions``) is sent and recorded
    instead of the policy's (the policy is still evaluated on that observation: its
    recurrent state is kept; ``mark_off_policy=True`` adds an ``off_policy`` bool column).
    Its extras describe the recorded action (:mod:`jaxsampler.sampling.host.off_policy`): a
    local-inference client's ``extra_model_outputs`` from the step's info, else the caller's
    ``info["action_logp"]``, else ``action_logp`` computed with the policy's ``log_prob``
    (one extra jitted call, only for batches with off-policy rows), else NaN; ``vf_preds``
    and other extras come from the server's forward pass unless the client sent its own.
    :attr:`HostSampler.off_policy_counts` counts which way each row went.

    Abandoned episodes (an external env's client went away: the episode ends truncated with
    ``{"abandoned": True}`` in the info of its final observation, which the episode objects
    keep) are marked in batches by a bool ``abandoned`` column, ``True`` on the episode's
    last row; the column is there whenever the env can abandon episodes (``mark_abandoned``).

    ``sample()`` / ``sample_batch()`` follow the device sampler:

    * the first call (and every reset) polls the first observations before any action; a
      sub-env whose first observation is already final (``ExternalEnv.start_episode`` then
      ``end_episode``) has no step: it is not an episode (nothing is emitted or counted);
    * ``num_timesteps=N``: until at least ``N`` env steps (polls of a sub-env that step it;
      reset polls are not counted);
    * ``num_episodes=N``: reset first (ongoing episodes discarded; needs the env's optional
      ``reset()``, see :attr:`HostEnv.resettable`, else running episodes continue), run until
      ``N`` episodes finished, return the finished ones (all that finished in the poll where
      the count reached ``N``); the next call resets again;
    * neither: ``rollout_length`` polls, not counting the first poll after the sampler's
      start or a reset (it only delivers first observations); for lockstep envs that is
      ``rollout_length`` steps per sub-env, reset steps included, like one device rollout
      call of that length;
    * ongoing episodes are returned as chunks (``cut`` with ``episode_lookback_horizon``)
      and continue in the next call with the same ``id_``; the actions of the last poll's
      observations are computed at the start of the next call, with that call's params.

    The feed is chosen once, at construction: single-agent envs use list tracks
    (:class:`~jaxsampler.sampling.host.track.TrackFeed`, a few appends per step), multi-agent
    envs the :class:`~jaxsampler.sampling.host.collector.SampleCollector`
    (:class:`~jaxsampler.sampling.host.feeds.CollectorFeed`, which builds
    :class:`MultiAgentEpisode` objects with ``add_env_reset`` / ``add_env_step``).
    Continuation chunks of single-agent episodes get ``episode_lookback_horizon`` *agent*
    steps of lookback (RLlib's ``SingleAgentEpisode.cut``).

    Order of the output: finished episodes (env by env, in time), then ongoing chunks (env
    by env); envs in order of first appearance. Single-agent envs (one agent id) give
    :class:`SingleAgentEpisode` objects (``id_`` = the episode id), multi-agent envs
    :class:`MultiAgentEpisode` chunks. All are numpy'ized; ``infos`` stay lists of dicts.

    Transforms (``transforms=``): the device rollout's transforms run on every poll
    (:mod:`jaxsampler.sampling.host.transforms`): the policy acts on, and episodes record, the
    transformed observations and rewards; actions are recorded policy side and sent through
    the transforms' ``to_env``; the metrics' returns are the env's own. An off-policy action
    (the env's own) is sent and recorded as the env gave it.

    Agents with their own spaces (a host env with ``observation_spaces`` /
    ``action_spaces``, :func:`~jaxsampler.host_envs.agent_spaces`): the policy must be a
    :class:`~jaxsampler.MultiAgentPolicy` whose policies each serve agents of one space
    (:mod:`jaxsampler.sampling.host.spaces` checks each against its agents' spaces); each
    policy's rows, the episodes and the batches hold every agent in its own spaces.
    Transforms are refused for such envs.

    Recurrent policies: the state is kept per ``(env_id, agent_id)`` on the host, reset to
    ``initial_state`` when the agent's episode starts, and updated only when the agent acts.

    Memory: no per-env or per-episode entry outlives its episode (external envs' env ids are
    episode ids, so a long-running server would otherwise grow without bound); see
    :mod:`jaxsampler.sampling.host.feeds`.

    Args:
        env: the env: a :class:`HostEnv`, or what
            :func:`~jaxsampler.host_envs.as_host_env` turns into one (a Gymnasium env or
            vector env, a list of Gymnasium envs or factories, ``"gym:<id>"``), which the
            sampler then owns (:meth:`close` closes it; so does a failed construction).
        policy: a :class:`Policy` (one policy for every agent) or a
            :class:`~jaxsampler.MultiAgentPolicy` built for ``host_env.agent_ids``.
        num_envs: the number of Gymnasium envs of a ``"gym:<id>"`` env; else, if given,
            it must equal the host env's ``num_envs``.
        rollout_length: polls of a call with neither ``num_timesteps`` nor ``num_episodes``.
        seed: PRNG seed of the policy keys and of the episode ids (and of the Gymnasium
            envs built here).
        episode_lookback_horizon: lookback env steps of continuation chunks.
        batch_sizes: the padded batch sizes (sorted; default: powers of two up to
            ``num_envs * num_agents``, at most ``max_batch_size``).
        timeout_s: a call returns after at most about this many seconds even if fewer steps
            or episodes arrived (serving envs: clients may be idle); ``None``: no limit. A
            call also returns when the env is closed.
        max_batch_size: cap of the default ``batch_sizes``.
        mark_off_policy: add an ``off_policy`` extra (bool) to every agent step.
        mark_abandoned: add an ``abandoned`` bool column to batches (``True`` on the last
            row of an abandoned episode); ``None`` (default): if the env can abandon
            episodes (:func:`abandons_episodes`: external envs and policy servers).
        rllib_compatible: multi-agent done flags exactly as RLlib 2.60's
            ``MultiAgentEpisode.add_env_step`` sets them: when a step ends the episode,
            the episode's flags (``"__all__"``, or terminated when every agent is done by
            its own flags, truncated ones included) are OR'ed into every agent stepped
            there. Default ``False``: each agent keeps its own flags OR ``"__all__"``.
        transforms: env->policy / policy->env transforms (:mod:`jaxsampler.transforms`,
            env side first, or a :class:`~jaxsampler.transforms.Pipeline` bound to the
            host env's spaces), run on each poll with the device rollout's semantics
            (:mod:`jaxsampler.sampling.host.transforms`); the policy must be built for
            the spaces they hand on (``build_pipeline(transforms,
            host_env.observation_space, host_env.action_space).observation_space``).
            Episodes and batches hold what the policy saw; :attr:`metrics` report the
            env's own returns.
        explore: ``False``: the policy acts greedily
            (:func:`jaxsampler.policies.greedy.greedy`).
        callbacks: objects with ``on_sample_end(report)``, called after every call
            (:class:`~jaxsampler.sampling.callbacks.SamplerCallback`).
        deterministic_ids: episode ids follow from ``seed`` (the same seed and calls give
            the same ids). ``None`` (default): yes, except over envs whose episodes come
            from outside callers (external envs and policy servers, whose
            ``abandons_episodes`` is set): there each sampler draws a fresh random run
            prefix, so that a restarted server's sampler appending to the same log never
            repeats the ids of an earlier run. An env that names its episodes
            (``names_episodes``, an external env with a journal) gives its own ids.
        env_params, devices, mesh: the family's pure-JAX options (``js.Sampler`` passes
            them on): refused here with a ``ValueError`` that says why.

    Raises:
        TypeError: ``env`` is not host-stepped, or not a complete :class:`HostEnv` (the
            missing members are named).
        ValueError: the policy was built for other spaces or other agent ids; a bad
            argument; ``env_params`` / ``devices`` / ``mesh`` given; ``num_envs``
            differs from the host env's.
    """

    @classmethod
    def accepts(cls, env: Any) -> bool:
        """A host-stepped env (:func:`jaxsampler.host_envs.is_host_stepped`)."""
        return is_host_stepped(env)

    def __init__(
        self,
        env: Any,
        policy: Policy,
        num_envs: int | None = None,
        rollout_length: int = 128,
        seed: int = 0,
        *,
        episode_lookback_horizon: int = 1,
        batch_sizes: Sequence[int] | None = None,
        max_batch_size: int = 1024,
        mark_off_policy: bool = False,
        mark_abandoned: bool | None = None,
        timeout_s: float | None = None,
        rllib_compatible: bool = False,
        transforms: Transforms = None,
        explore: bool = True,
        callbacks: Any = None,
        deterministic_ids: bool | None = None,
        env_params: Any = None,
        devices: Any = None,
        mesh: Any = None,
    ):
        host_env = as_host_env(env, num_envs, seed)
        if host_env is None:
            host_env = check_host_env(env)  # not host-stepped: the message says what it lacks
        try:
            _refuse_device_options(host_env, num_envs, env_params, devices, mesh)
            self._setup(
                host_env,
                policy,
                rollout_length,
                seed,
                episode_lookback_horizon=episode_lookback_horizon,
                batch_sizes=batch_sizes,
                max_batch_size=max_batch_size,
                mark_off_policy=mark_off_policy,
                mark_abandoned=mark_abandoned,
                timeout_s=timeout_s,
                rllib_compatible=rllib_compatible,
                transforms=transforms,
                explore=explore,
                callbacks=callbacks,
                deterministic_ids=deterministic_ids,
            )
        except BaseException:
            if host_env is not env:  # made here from a Gymnasium env, a list or an id
                host_env.close()
            raise

    def _setup(
        self,
        host_env: HostEnv,
        policy: Policy,
        rollout_length: int,
        seed: int,
        *,
        episode_lookback_horizon: int,
        batch_sizes: Sequence[int] | None,
        max_batch_size: int,
        mark_off_policy: bool,
        mark_abandoned: bool | None,
        timeout_s: float | None,
        rllib_compatible: bool,
        transforms: Transforms,
        explore: bool,
        callbacks: Any,
        deterministic_ids: bool | None,
    ) -> None:
        """Builds the sampler over a checked host env (arguments: the class docstring)."""
        self._init_reporting(callbacks)
        self.host_env = host_env
        policy = exploring_or_greedy(policy, explore)
        self.explore = explore
        self.policy = policy
        horizon = check_lookback(episode_lookback_horizon)
        self.rollout_length = check_positive_int("rollout_length", rollout_length)
        self.agent_ids = tuple(host_env.agent_ids)
        self.multi_agent = len(self.agent_ids) != 1
        self.mark_off_policy = mark_off_policy
        self.mark_abandoned = (
            abandons_episodes(host_env) if mark_abandoned is None else bool(mark_abandoned)
        )
        self.timeout_s = timeout_s
        obs_spaces, act_spaces = agent_spaces(host_env)
        #: whether one policy cannot serve every agent (their shapes or dtypes differ)
        self.own_spaces = not (
            share_one_space(obs_spaces.values()) and share_one_space(act_spaces.values())
        )
        first = self.agent_ids[0]
        if self.own_spaces:  # each policy serves agents of one space; no transforms
            by_policy = policy_spaces(policy, self.agent_ids, obs_spaces, act_spaces, transforms)
            pipe = build_pipeline((), obs_spaces[first], act_spaces[first])
        else:
            pipe = (
                transforms
                if isinstance(transforms, Pipeline)
                else build_pipeline(transforms, obs_spaces[first], act_spaces[first])
            )
        #: the transforms bound to the host env's spaces (empty without transforms; for
        #: agents with their own spaces, an empty one on the first agent's)
        self.pipeline = pipe
        # The policy's side: what episodes record and the policy is built for.
        self._obs_space, self._act_space = pipe.observation_space, pipe.action_space
        self._env_act_space = act_spaces[first]
        if not self.own_spaces:
            label = "the host env" + (" after its transforms" if pipe else "")
            try:
                check_policy_fits(policy, self.agent_ids, self._obs_space, self._act_space, label)
                by_policy = {}
                if isinstance(policy, MultiAgentPolicy) and policy.observation_space is None:
                    # built over an env whose agents have their own spaces: policy by policy
                    seen_obs = dict.fromkeys(self.agent_ids, self._obs_space)
                    seen_act = dict.fromkeys(self.agent_ids, self._act_space)
                    by_policy = policy_spaces(policy, self.agent_ids, seen_obs, seen_act, None)
            except ValueError as exc:
                raise explain_policy_mismatch(exc, transforms) from None
        policies, mapping, self._split_params = self._policy_table(policy)
        #: policy id -> ``(observation space, action space)`` its rows are in
        self._policy_spaces = {
            pid: by_policy.get(pid, (self._obs_space, self._act_space)) for pid in policies
        }
        self.policy_ids = tuple(policies)
        self._mapping = mapping
        self._known_keys = frozenset(mapping) | {ALL_AGENTS}  # agent keys a poll may carry
        self._unrecorded: list[tuple] = []  # policy outputs sent but not yet stored (_record)
        if batch_sizes is None:
            n = host_env.num_envs
            n = max_batch_size if not isinstance(n, int) else n * len(self.agent_ids)
            batch_sizes = _default_buckets(n, max_batch_size)
        self.batch_sizes = tuple(sorted({int(b) for b in batch_sizes}))
        if not self.batch_sizes or self.batch_sizes[0] < 1:
            raise ValueError(f"batch_sizes must be ints >= 1, got {batch_sizes!r}")
        #: policy id -> the jitted
        #: ``(params, obs[B,1,...], key, state) -> (action, extras, state, key)``
        self.policy_fns = {pid: self._make_fn(pid, p) for pid, p in policies.items()}
        #: policy id -> the jitted ``(params, obs, action, state) -> logp[B, 1]`` of the
        #: policies that have ``log_prob`` (for off-policy rows)
        self.logp_fns = {pid: jax.jit(p.log_prob) for pid, p in policies.items() if p.has_log_prob}
        #: off-policy rows recorded so far, by where their extras came from
        self.off_policy_counts = OffPolicyCounts()
        base = jax.random.PRNGKey(seed)
        self._keys = {pid: jax.random.fold_in(base, i) for i, pid in enumerate(self.policy_ids)}
        self._init_state = {
            pid: jax.device_get(p.initial_state((1, 1))) for pid, p in policies.items()
        }
        self._stateful = {pid: bool(jax.tree.leaves(s)) for pid, s in self._init_state.items()}
        # Structure, shapes and dtypes only: Gymnasium envs may return observations outside
        # their declared bounds, and the episodes record them as they came.
        self._obs_check = ValueChecker(obs_spaces[self.agent_ids[0]], values=False)
        #: agent id -> its observation check, for agents with their own spaces
        self._obs_checks = (
            {a: ValueChecker(space, values=False) for a, space in obs_spaces.items()}
            if self.own_spaces
            else {}
        )
        n_envs = host_env.num_envs
        self._books = Books(
            mark_abandoned=self.mark_abandoned,
            env_named=bool(getattr(host_env, "names_episodes", False)),
            rllib_compatible=bool(rllib_compatible),
            rank_capacity=max(2 * n_envs, 64) if isinstance(n_envs, int) else 1024,
            agent_ids=self.agent_ids,
            mapping=mapping,
            policy_ids=self.policy_ids,
            horizon=horizon,
            observation_space=self._obs_space,
            action_space=self._act_space,
            # each agent's own spaces in its episodes, where the env has them and no
            # transform changes them
            agent_spaces=(
                (obs_spaces, act_spaces)
                if not pipe
                and (
                    getattr(host_env, "observation_spaces", None) is not None
                    or getattr(host_env, "action_spaces", None) is not None
                )
                else None
            ),
            ids=_episode_ids(seed, host_env, deterministic_ids),
        )
        #: the feed chosen at construction (:mod:`jaxsampler.sampling.host.feeds`)
        self.feed: Feed = CollectorFeed(self._books) if self.multi_agent else TrackFeed(self._books)
        #: the transforms' runner (``None`` without transforms)
        self.transforms = HostTransforms(pipe, self.batch_sizes) if pipe else None
        self._needs_reset = True
        self._fresh = True
        self.metrics = SamplerMetrics()

    # ------------------------------------------------------------------------- policy

    def _policy_table(self, policy: Any) -> tuple[dict[Any, Policy], dict[Any, Any], bool]:
        """``(policy id -> policy, agent id -> policy id, params split by policy id)``."""
        if isinstance(policy, MultiAgentPolicy):
            return (
                dict(zip(policy.policy_ids, policy.policies)),
                dict(zip(policy.agent_ids, policy.agent_policy)),
                True,
            )
        return {DEFAULT_POLICY_ID: policy}, dict.fromkeys(self.agent_ids, DEFAULT_POLICY_ID), False

    def _make_fn(self, pid: Any, p: Policy) -> Any:
        from jaxsampler.rollout import check_action

        space, env_space, pipe = self._policy_spaces[pid][1], self._env_act_space, self.pipeline

        def step(params, obs, key, state):
            key, sub = jax.random.split(key)
            action, extras, state = p(params, obs, sub, state)
            batch = jax.tree.leaves(obs)[0].shape[:2]
            check_action(space, action, batch)  # at trace time: shapes and dtypes
            env_action = None
            if pipe.changes_action:  # the env's side of the action (sent, not recorded)
                env_action = pipe.to_env(action)
                check_action(env_space, env_action, batch)
            return action, env_action, extras, state, key

        return jax.jit(step)

    def _act(self, params: Any) -> bool:
        """Computes and sends the actions of every queued agent; False if none was queued."""
        out: dict[Any, dict] = {}
        try:
            for pid, obs, env_ids, agent_ids in self.feed.queued():
                self._act_policy(pid, params, obs, env_ids, agent_ids, out)
        except BaseException:
            self._unrecorded.clear()  # nothing was sent: nothing to record
            raise
        if out:
            self._send(out)
        return bool(out)

    def _act_policy(
        self, pid: Any, params: Any, obs: Any, env_ids: list, agent_ids: list, out: dict
    ) -> None:
        """The actions of one policy's rows, in calls of at most the largest bucket."""
        p_params = params[pid] if self._split_params else params
        top = self.batch_sizes[-1]
        for lo in range(0, len(env_ids), top):
            hi = min(lo + top, len(env_ids))
            self._act_rows(
                pid,
                p_params,
                jax.tree.map(lambda x, lo=lo, hi=hi: x[lo:hi], obs),
                env_ids[lo:hi],
                agent_ids[lo:hi],
                out,
            )

    def _send(self, out: dict) -> None:
        try:
            self.host_env.send_actions(out)
        except BaseException:
            self._unrecorded.clear()  # not sent: nothing to record
            raise
        self._record()

    def _act_rows(
        self, pid: Any, params: Any, obs: Any, env_ids: list, agent_ids: list, out: dict
    ) -> None:
        n = len(env_ids)
        b = bucket(n, self.batch_sizes)

        def pad(x: np.ndarray) -> np.ndarray:
            x = np.asarray(x)[:, None]
            if b == n:
                return x
            return np.concatenate([x, np.zeros((b - n,) + x.shape[1:], x.dtype)])

        init = self._init_state[pid]
        if self._stateful[pid]:
            rows = [self._books.states.get((e, a), init) for e, a in zip(env_ids, agent_ids)] + [
                init
            ] * (b - n)
            state = jax.tree.map(lambda *xs: np.concatenate(xs), *rows)
        else:
            state = init
        obs = jax.tree.map(pad, obs)
        action, env_action, extras, new_state, self._keys[pid] = self.policy_fns[pid](
            params, obs, self._keys[pid], state
        )
        action, env_action, extras, new_state = jax.device_get(
            (action, env_action, extras, new_state)
        )  # one transfer
        # Per-row views without a tree walk per row when the leaves are plain arrays.
        act_col = action[:, 0] if isinstance(action, np.ndarray) else None
        env_col = env_action[:, 0] if isinstance(env_action, np.ndarray) else None
        offs = self._books.off_policy
        acts = []
        off_rows: list[int] = []
        for i, (e, a) in enumerate(zip(env_ids, agent_ids)):
            act = (
                act_col[i] if act_col is not None else jax.tree.map(lambda x, i=i: x[i, 0], action)
            )
            to_send = act
            if env_action is not None:
                to_send = (
                    env_col[i]
                    if env_col is not None
                    else jax.tree.map(lambda x, i=i: x[i, 0], env_action)
                )
            if offs:  # empty unless some env took its own action
                off = offs.get(e)
                if off is not None and a in off.actions:
                    act = to_send = off.actions[a]
                    off_rows.append(i)
            acts.append(act)
            if e in out:
                out[e][a] = to_send
            else:
                out[e] = {a: to_send}
        if off_rows:
            extras = self._off_policy_extras(
                pid, params, obs, state, action, extras, off_rows, env_ids, agent_ids, acts
            )
        # Recorded after the actions are sent (callers already run meanwhile).
        self._unrecorded.append((pid, env_ids, agent_ids, acts, extras, new_state))

    def _off_policy_extras(
        self,
        pid: Any,
        params: Any,
        obs: Any,
        state: Any,
        action: Any,
        extras: dict,
        rows: list[int],
        env_ids: list,
        agent_ids: list,
        acts: list,
    ) -> dict:
        """The extras of one policy call with its off-policy rows describing the recorded
        actions (:func:`~jaxsampler.sampling.host.off_policy.off_policy_extras`)."""
        offs = self._books.off_policy
        given = [behaviour_outputs(offs[env_ids[i]].infos.get(agent_ids[i])) for i in rows]
        fn = self.logp_fns.get(pid)

        def logp_of(need: list[int]) -> np.ndarray:
            assert fn is not None
            taken = jax.tree.map(np.array, action)  # the policy's actions, off rows replaced
            for i in need:
                try:
                    if isinstance(taken, np.ndarray):
                        taken[i, 0] = acts[i]
                    else:
                        jax.tree.map(lambda col, x, i=i: col.__setitem__((i, 0), x), taken, acts[i])
                except (TypeError, ValueError) as exc:
                    raise ValueError(
                        f"env {env_ids[i]!r}: the off-policy action of agent {agent_ids[i]!r} "
                        f"does not fit the action space {self._policy_spaces[pid][1]!r}: {exc}"
                    ) from None
            logp = np.asarray(jax.device_get(fn(params, obs, taken, state)))
            return logp[need, 0]

        return off_policy_extras(
            extras, rows, given, None if fn is None else logp_of, self.off_policy_counts
        )

    def _record(self) -> None:
        """Stores the sent actions with their extras (and recurrent states) for the next poll."""
        for pid, env_ids, agent_ids, acts, extras, new_state in self._unrecorded:
            if all(isinstance(v, np.ndarray) for v in extras.values()):
                ext_cols = [(k, v[:, 0]) for k, v in extras.items()]
                nested = False
            else:  # nested extras: one tree walk per row
                ext_cols = [
                    (k, (lambda i, v=v: jax.tree.map(lambda x: x[i, 0], v)))
                    for k, v in extras.items()
                ]
                nested = True
            mark, stateful, offs, sent = (
                self.mark_off_policy,
                self._stateful[pid],
                self._books.off_policy,
                self._books.actions,
            )
            for i, (e, a) in enumerate(zip(env_ids, agent_ids)):
                ext = {k: c(i) for k, c in ext_cols} if nested else {k: c[i] for k, c in ext_cols}
                if mark:
                    off = offs.get(e)
                    ext["off_policy"] = np.bool_(off is not None and a in off.actions)
                if stateful:
                    self._books.states[(e, a)] = jax.tree.map(
                        lambda x, i=i: x[i : i + 1], new_state
                    )
                if e in sent:
                    sent[e][a] = (acts[i], ext)
                else:
                    sent[e] = {a: (acts[i], ext)}
        self._unrecorded.clear()

    # ------------------------------------------------------------------------- feeding

    def _validate(self, res: PollResult) -> dict[Any, dict]:
        """Checks a whole poll before anything is recorded; returns the checked observations."""
        known = self._known_keys
        for d in (res.obs, res.rewards, res.terminateds, res.truncateds):
            for env_id, per_agent in d.items():
                if per_agent.keys() <= known:
                    continue
                for a in per_agent:
                    if a != ALL_AGENTS and a not in self._mapping:
                        raise ValueError(
                            f"env {env_id!r} returned data for agent {a!r}, which is not one of "
                            f"the policy's / env's agent ids {self.agent_ids}"
                        )
        check, own = self._obs_check, self._obs_checks
        checked: dict[Any, dict] = {}
        for env_id, per_agent in res.obs.items():
            try:
                checked[env_id] = {
                    a: own.get(a, check)(o, "observation", a) for a, o in per_agent.items()
                }
            except ValueError as exc:
                raise ValueError(f"env {env_id!r}: {exc}") from None
        return checked

    # ------------------------------------------------------------------------- sampling

    @property
    def num_envs(self) -> int:
        """The host env's sub-envs (for external and served envs: their concurrent
        episode capacity)."""
        return self.host_env.num_envs

    def reset(self) -> None:
        """Discards every running episode; every sub-env starts a new episode at the next
        poll.

        Raises:
            NotImplementedError: the env cannot reset (:attr:`HostEnv.resettable`).
        """
        self.host_env.reset()
        self.feed.reset()
        if self.transforms is not None:
            self.transforms.reset()
        self._unrecorded.clear()
        self._books.clear()
        self._needs_reset = False
        self._fresh = True

    def _episodes(self, chunks: list[Any]) -> list[Any]:
        """The call's chunks as numpy'ized episodes (``infos`` stay lists of dicts)."""
        return self.feed.episodes(chunks)

    def _batch(self, chunks: list[Any]) -> MultiAgentBatch:
        """The call's chunks as a batch (``infos``: a list of dicts)."""
        batch = self.feed.batch(chunks)
        batch.count = self.metrics.num_env_steps_sampled
        return batch

    def _checkpoint_parts(self) -> tuple[dict[str, Any], Any, dict[str, Any]]:
        raise _not_checkpointable()

    def _checkpoint_fingerprint(self) -> dict[str, Any]:
        raise _not_checkpointable()

    def _poll(self, deadline: float | None) -> PollResult:
        if deadline is None:
            return self.host_env.poll()
        return self.host_env.poll(timeout=max(deadline - time.monotonic(), 0.0))

    def _collect(
        self, params: Any, num_timesteps: int | None, num_episodes: int | None, force_reset: bool
    ) -> list[Any]:
        """Runs one call; returns its chunks (the feed's), finished ones first; sets
        :attr:`metrics`."""
        can_reset = self.host_env.resettable
        if force_reset or ((num_episodes is not None or self._needs_reset) and can_reset):
            self.reset()
        self._needs_reset = False
        done_log: list[DoneRecord] = []
        env_steps = polls = 0
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while True:
            self._act(params)
            res = self._poll(deadline)
            obs = self._validate(res)
            if self.transforms is None:
                env_steps += self.feed.feed(res, obs, done_log)
            else:  # episodes get what the policy sees; returns stay the env's
                seen, obs = self.transforms.apply(res, obs, self._books.actions)
                env_steps += self.feed.feed(seen, obs, done_log, env_rewards=res.rewards)
            polls += not self._fresh  # the first poll after a (re)start: first observations only
            self._fresh = False
            if num_episodes is not None:
                if len(done_log) >= num_episodes:
                    break
            elif num_timesteps is not None:
                if env_steps >= num_timesteps:
                    break
            elif polls >= self.rollout_length:
                break
            if self.host_env.closed or (deadline is not None and time.monotonic() >= deadline):
                break
        discard = num_episodes is not None and can_reset
        if discard:
            self._needs_reset = True
        chunks = self.feed.close_call(discard)
        finished = self._books.finished
        done = sorted((c for c in chunks if c.id_ in finished), key=lambda c: finished[c.id_])
        ongoing = [c for c in chunks if c.id_ not in finished]
        for c in done:
            del finished[c.id_]
        chunks = done + ongoing
        m = SamplerMetrics(num_env_steps_sampled=env_steps, num_rollout_calls=polls)
        m.num_agent_steps_sampled = self.feed.agent_steps(chunks)
        m.set_episode_stats(
            np.array([r for _, r, _ in done_log]), np.array([n for _, _, n in done_log])
        )
        m.num_episodes_completed, m.num_episodes_ongoing = len(done), len(ongoing)
        self.metrics = m
        return chunks

    def close(self) -> None:
        """Closes the host env."""
        self.host_env.close()


def _not_checkpointable() -> NotImplementedError:
    return NotImplementedError(
        "a HostSampler cannot be checkpointed: its envs' state lives in host objects "
        "(Gymnasium envs, sub-processes, sockets) that jaxsampler cannot capture or "
        "replay exactly; use a pure-JAX env (js.make('<id>') or js.make('gymnax:<id>')) "
        "for exact resume"
    )


def _episode_ids(seed: int, env: HostEnv, deterministic: bool | None) -> EpisodeIds:
    """The sampler's episode ids (see ``deterministic_ids``)."""
    ids = EpisodeIds(seed)
    if deterministic is None:
        deterministic = not getattr(env, "abandons_episodes", False)
    if not deterministic:
        ids.set_state({"run": os.urandom(7).hex(), "resets": 0})
    return ids
