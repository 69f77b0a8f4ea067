"""``HostSampler``: the :class:`~jaxsampler.sampling.base.Sampler` of host-stepped envs.

The env is any :class:`~jaxsampler.host_envs.base.HostEnv` (Gymnasium envs, dict-API
multi-agent envs, external / served envs); the policy is a jaxsampler policy, evaluated
as **one jitted call per policy per env step** on the observations of every agent that
must act, stacked to ``[N, 1, ...]`` (the policy protocol's ``[E, A, ...]`` with one
agent per row) and zero-padded to a fixed bucket size (``batch_sizes``; default powers
of two), so the jitted function compiles at most once per bucket. More than the largest
bucket is split into several calls.

Loop per env step: compute and send the actions of the queued agents; ``poll()``; feed
the :class:`~jaxsampler.sampling.collector.SampleCollector` (which builds
:class:`MultiAgentEpisode` objects with ``add_env_reset`` / ``add_env_step``). An
off-policy action of the poll (``off_policy_actions``) is sent and recorded instead of
the policy's (the policy is still evaluated on that observation: its extras and
recurrent state are kept; ``mark_off_policy=True`` adds an ``off_policy`` bool column).

``sample()`` / ``sample_batch()`` follow the device sampler:

* the first call (and every reset) polls the first observations before any action; a
  sub-env whose first observation is already final (``ExternalEnv.start_episode`` then
  ``end_episode``) has no step: it is not an episode (nothing is emitted or counted);
* ``num_timesteps=N``: until at least ``N`` env steps (polls of a sub-env that step it;
  reset polls are not counted);
* ``num_episodes=N``: reset first (ongoing episodes discarded; needs the env's optional
  ``reset()``, else running episodes continue), run until ``N`` episodes finished, return
  the finished ones (all that finished in the poll where the count reached ``N``); the
  next call resets again;
* neither: ``rollout_length`` polls, not counting the first poll after the sampler's
  start or a reset (it only delivers first observations); for lockstep envs that is
  ``rollout_length`` steps per sub-env, reset steps included, like one device rollout
  call of that length;
* ongoing episodes are returned as chunks (``cut`` with ``episode_lookback_horizon``)
  and continue in the next call with the same ``id_``; the actions of the last poll's
  observations are computed at the start of the next call, with that call's params.

Single-agent envs do not go through the collector: each running episode is a list
:class:`~jaxsampler.sampling.track.Track` (a few appends per step), built into the same
numpy'ized episodes and batch rows only when its chunk closes (``fast_single_agent``;
``tests/test_hostenv_track.py`` checks both paths agree). One difference: continuation
chunks get ``episode_lookback_horizon`` *agent* steps of lookback there (RLlib's
``SingleAgentEpisode.cut``) and env steps on the collector path; they differ only for
envs that send reward-only polls.

Order of the output: finished episodes (env by env, in time), then ongoing chunks (env
by env); envs in order of first appearance. Single-agent envs (one agent id) give
:class:`SingleAgentEpisode` objects (``id_`` = the episode id), multi-agent envs
:class:`MultiAgentEpisode` chunks. All are numpy'ized; ``infos`` stay lists of dicts.

Recurrent policies: the state is kept per ``(env_id, agent_id)`` on the host, reset to
``initial_state`` when the agent's episode starts, and updated only when the agent acts.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jaxsampler.constants import ALL_AGENTS, DEFAULT_POLICY_ID
from jaxsampler.episodes.batch import MultiAgentBatch, SampleBatch
from jaxsampler.episodes.ids import EpisodeIds, agent_episode_id
from jaxsampler.episodes.lookback import batch as stack
from jaxsampler.episodes.multi_agent import MultiAgentEpisode
from jaxsampler.episodes.single_agent import SingleAgentEpisode
from jaxsampler.host_envs.base import HostEnv, PollResult
from jaxsampler.policies.base import Policy
from jaxsampler.sampling.base import Sampler, SamplerMetrics, check_lookback, check_sample_counts
from jaxsampler.sampling.collector import SampleCollector, _concat, episodes_to_batch
from jaxsampler.sampling.track import Track, track_rows
from jaxsampler.spaces import compatible

__all__ = ["HostSampler"]


def _env_ids(res: PollResult) -> dict[Any, None]:
    """The sub-envs a poll has data of, in order of first appearance."""
    env_ids: dict[Any, None] = {}
    for d in (res.obs, res.rewards, res.terminateds, res.truncateds):
        env_ids.update(dict.fromkeys(d))
    return env_ids


def _all_done(res: PollResult, env_id: Any) -> bool:
    return bool(
        res.terminateds.get(env_id, {}).get(ALL_AGENTS, False)
        or res.truncateds.get(env_id, {}).get(ALL_AGENTS, False)
    )


def _default_buckets(n: int, cap: int) -> tuple[int, ...]:
    top = 1
    while top < min(max(n, 1), cap):
        top *= 2
    out, b = [], 1
    while b <= top:
        out.append(b)
        b *= 2
    return tuple(out)


class HostSampler(Sampler):
    """Samples episodes from a host-stepped env with a jaxsampler policy.

    Args:
        host_env: the env (a :class:`HostEnv`).
        policy: a :class:`Policy` (one policy for every agent) or a
            :class:`~jaxsampler.MultiAgentPolicy` built for ``host_env.agent_ids``.
        seed: PRNG seed of the policy keys and of the episode ids.
        episode_lookback_horizon: lookback env steps of continuation chunks.
        batch_sizes: the padded batch sizes (sorted; default: powers of two up to
            ``num_envs * num_agents``, at most ``max_batch_size``).
        rollout_length: polls of a call with neither ``num_timesteps`` nor ``num_episodes``.
        timeout_s: a call returns after at most about this many seconds even if fewer steps
            or episodes arrived (serving envs: clients may be idle); ``None``: no limit. A
            call also returns when the env is closed.
        max_batch_size: cap of the default ``batch_sizes``.
        mark_off_policy: add an ``off_policy`` extra (bool) to every agent step.

    Raises:
        ValueError: the policy was built for other spaces or other agent ids.
    """

    #: Single-agent envs use list-based tracks (``False``: the collector path, as multi-agent
    #: envs do; both give the same episodes and batches, the tracks cost less per step).
    fast_single_agent: bool = True

    def __init__(
        self,
        host_env: HostEnv,
        policy: Policy,
        *,
        seed: int = 0,
        episode_lookback_horizon: int = 1,
        batch_sizes: Sequence[int] | None = None,
        rollout_length: int = 128,
        max_batch_size: int = 1024,
        mark_off_policy: bool = False,
        timeout_s: float | None = None,
    ):
        check_lookback(episode_lookback_horizon)
        if not isinstance(rollout_length, int) or rollout_length < 1:
            raise ValueError(f"rollout_length must be an int >= 1, got {rollout_length!r}")
        self.host_env, self.policy = host_env, policy
        self.agent_ids = tuple(host_env.agent_ids)
        self.multi_agent = len(self.agent_ids) != 1
        self.horizon, self.rollout_length = episode_lookback_horizon, rollout_length
        self.mark_off_policy = mark_off_policy
        self.timeout_s = timeout_s
        try:
            self._poll_takes_timeout = "timeout" in inspect.signature(host_env.poll).parameters
        except (TypeError, ValueError):
            self._poll_takes_timeout = False
        self._obs_space, self._act_space = host_env.observation_space, host_env.action_space
        for what, env_space in (
            ("observation_space", self._obs_space),
            ("action_space", self._act_space),
        ):
            pol_space = getattr(policy, what)
            if not compatible(env_space, pol_space):
                raise ValueError(
                    f"mismatched {what.replace('_', ' ')}: the host env has {env_space!r}, "
                    f"policy {type(policy).__name__} was built for {pol_space!r}"
                )
        policy_agents = getattr(policy, "agent_ids", None)
        if policy_agents is not None and tuple(policy_agents) != self.agent_ids:
            raise ValueError(
                f"mismatched agent ids: the host env has {self.agent_ids}, "
                f"the policy was built for {tuple(policy_agents)}"
            )
        if hasattr(policy, "policies") and hasattr(policy, "agent_policy"):  # MultiAgentPolicy
            self._policies = dict(zip(policy.policy_ids, policy.policies))
            self._mapping = dict(zip(policy.agent_ids, policy.agent_policy))
            self._split_params = True
        else:
            self._policies = {DEFAULT_POLICY_ID: policy}
            self._mapping = dict.fromkeys(self.agent_ids, DEFAULT_POLICY_ID)
            self._split_params = False
        self.policy_ids = tuple(self._policies)
        self._known_keys = frozenset(self._mapping) | {ALL_AGENTS}  # agent keys a poll may carry
        self._unrecorded: list[tuple] = []  # policy outputs sent but not yet stored (_record)
        if batch_sizes is None:
            n = getattr(host_env, "num_envs", None)
            n = max_batch_size if not isinstance(n, int) else n * len(self.agent_ids)
            batch_sizes = _default_buckets(n, max_batch_size)
        self.batch_sizes = tuple(sorted({int(b) for b in batch_sizes}))
        if not self.batch_sizes or self.batch_sizes[0] < 1:
            raise ValueError(f"batch_sizes must be ints >= 1, got {batch_sizes!r}")
        #: policy id -> the jitted ``(params, obs[B,1,...], key, state) -> (action, extras, state, key)``
        self.policy_fns = {pid: self._make_fn(p) for pid, p in self._policies.items()}
        base = jax.random.PRNGKey(seed)
        self._keys = {pid: jax.random.fold_in(base, i) for i, pid in enumerate(self.policy_ids)}
        self._init_state = {
            pid: jax.device_get(p.initial_state((1, 1))) for pid, p in self._policies.items()
        }
        self._stateful = {pid: bool(jax.tree.leaves(s)) for pid, s in self._init_state.items()}
        self._obs_ref = jax.tree.map(np.asarray, self._obs_space.zeros())
        self._episode_ids = EpisodeIds(seed)
        self.collector = SampleCollector(
            agent_ids=self.agent_ids,
            episode_lookback_horizon=episode_lookback_horizon,
            policy_ids=self.policy_ids,
        )
        self._counter = 0
        self._needs_reset = True
        self._fresh = True
        self._running: dict[Any, str] = {}  # env id -> running episode id
        self._env_rank: dict[Any, int] = {}
        self._actions: dict[
            Any, dict
        ] = {}  # env id -> agent id -> (action, extras) sent, awaiting the poll
        self._off_policy: dict[Any, dict] = {}
        self._states: dict[tuple, Any] = {}
        self._returns: dict[str, float] = {}
        self._finished: dict[str, tuple] = {}  # episode id -> (env rank, poll index)
        self._poll_index = 0
        # Single-agent envs: episodes as plain lists (jaxsampler.sampling.track), not through the collector.
        self._fast = not self.multi_agent and self.fast_single_agent
        self._tracks: dict[Any, Track] = {}  # env id -> running chunk
        self._closed: list[Track] = []  # chunks closed in this call
        self._queue: list[tuple[Any, Any]] = []  # (env id, observation) waiting for an action
        self._env_steps: dict[str, int] = {}  # episode id -> env steps (polls) so far
        self.metrics = SamplerMetrics()

    # ------------------------------------------------------------------------- policy

    def _make_fn(self, p: Policy) -> Any:
        from jaxsampler.rollout import check_action

        space = self._act_space

        def step(params, obs, key, state):
            key, sub = jax.random.split(key)
            action, extras, state = p(params, obs, sub, state)
            batch = jax.tree.leaves(obs)[0].shape[:2]
            check_action(space, action, batch)  # at trace time: shapes and dtypes
            return action, extras, state, key

        return jax.jit(step)

    def _bucket(self, n: int) -> int:
        for b in self.batch_sizes:
            if b >= n:
                return b
        return self.batch_sizes[-1]

    def _act(self, params: Any) -> bool:
        """Computes and sends the actions of every queued agent; False if none was queued."""
        out: dict[Any, dict] = {}
        if self._fast:
            queue, self._queue = self._queue, []
            if queue:
                agent = self.agent_ids[0]
                self._act_policy(
                    self._mapping[agent],
                    params,
                    stack([o for _, o in queue]),
                    [e for e, _ in queue],
                    [agent] * len(queue),
                    out,
                )
        else:
            for pid in self.policy_ids:
                rows = self.collector.get_inference_input_dict(pid)
                if rows.count:
                    self._act_policy(
                        pid,
                        params,
                        rows["obs"],
                        rows["env_id"].tolist(),
                        rows["agent_id"].tolist(),
                        out,
                    )
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
                jax.tree.map(lambda x: x[lo:hi], obs),
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
        b = self._bucket(n)

        def pad(x: np.ndarray) -> np.ndarray:
            x = np.asarray(x)[:, None]
            if b == n:
                return x
            return np.concatenate([x, np.zeros((b - n,) + x.shape[1:], x.dtype)])

        init = self._init_state[pid]
        if self._stateful[pid]:
            rows = [self._states.get((e, a), init) for e, a in zip(env_ids, agent_ids)] + [init] * (
                b - n
            )
            state = jax.tree.map(lambda *xs: np.concatenate(xs), *rows)
        else:
            state = init
        action, extras, new_state, self._keys[pid] = self.policy_fns[pid](
            params, jax.tree.map(pad, obs), self._keys[pid], state
        )
        action, extras, new_state = jax.device_get((action, extras, new_state))  # one transfer
        # Per-row views without a tree walk per row when the leaves are plain arrays.
        act_col = action[:, 0] if isinstance(action, np.ndarray) else None
        offs = self._off_policy
        acts = []
        for i, (e, a) in enumerate(zip(env_ids, agent_ids)):
            act = (
                act_col[i] if act_col is not None else jax.tree.map(lambda x, i=i: x[i, 0], action)
            )
            off = offs.get(e)
            if off and a in off:
                act = off[a]
            acts.append(act)
            if e in out:
                out[e][a] = act
            else:
                out[e] = {a: act}
        # Recorded after the actions are sent (callers already run meanwhile).
        self._unrecorded.append((pid, env_ids, agent_ids, acts, extras, new_state))

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
                self._off_policy,
                self._actions,
            )
            for i, (e, a) in enumerate(zip(env_ids, agent_ids)):
                ext = {k: c(i) for k, c in ext_cols} if nested else {k: c[i] for k, c in ext_cols}
                if mark:
                    off = offs.get(e)
                    ext["off_policy"] = np.bool_(off is not None and a in off)
                if stateful:
                    self._states[(e, a)] = jax.tree.map(lambda x, i=i: x[i : i + 1], new_state)
                if e in sent:
                    sent[e][a] = (acts[i], ext)
                else:
                    sent[e] = {a: (acts[i], ext)}
        self._unrecorded.clear()

    # ------------------------------------------------------------------------- feeding

    def _check_obs(self, env_id: Any, agent_id: Any, obs: Any) -> Any:
        ref = self._obs_ref
        if isinstance(ref, np.ndarray) and isinstance(obs, np.ndarray) and obs.shape == ref.shape:
            return (
                obs if obs.dtype == ref.dtype else obs.astype(ref.dtype)
            )  # the common case, no tree walk

        def leaf(ref: np.ndarray, x: Any) -> np.ndarray:
            arr = np.asarray(x)
            if arr.shape != ref.shape:
                raise ValueError(
                    f"env {env_id!r} agent {agent_id!r}: observation shape {arr.shape} does not match the "
                    f"observation space {self._obs_space!r} (shape {ref.shape})"
                )
            return arr.astype(ref.dtype, copy=False)

        try:
            return jax.tree.map(leaf, self._obs_ref, obs)
        except (TypeError, KeyError) as exc:
            raise ValueError(
                f"env {env_id!r} agent {agent_id!r}: observation {obs!r} does not match the "
                f"observation space {self._obs_space!r}: {exc}"
            ) from None

    def _validate(self, res: PollResult) -> dict[Any, dict]:
        """Checks a whole poll before anything is recorded; returns the checked observations."""
        checked: dict[Any, dict] = {}
        known = self._known_keys
        for d in (res.obs, res.rewards, res.terminateds, res.truncateds):
            for env_id, per_agent in d.items():
                if per_agent.keys() <= known:
                    continue
                for a in per_agent:
                    if a != ALL_AGENTS and a not in self._mapping:
                        raise ValueError(
                            f"env {env_id!r} returned data for agent {a!r}, which is not one of the policy's / "
                            f"env's agent ids {self.agent_ids}"
                        )
        for env_id, per_agent in res.obs.items():
            checked[env_id] = {a: self._check_obs(env_id, a, o) for a, o in per_agent.items()}
        return checked

    def _agent_episode_id(self, ma_id: str, agent_id: Any) -> str:
        return (
            agent_episode_id(ma_id, self.agent_ids.index(agent_id)) if self.multi_agent else ma_id
        )

    def _new_episode_id(self) -> str:
        ma_id = self._episode_ids(0, self._counter)
        self._counter += 1
        return ma_id

    def _new_episode(self, env_id: Any) -> MultiAgentEpisode:
        ma_id = self._new_episode_id()
        mapping = self._mapping
        ids = {a: self._agent_episode_id(ma_id, a) for a in self.agent_ids}
        return MultiAgentEpisode(
            ma_id,
            observation_space={a: self._obs_space for a in self.agent_ids},
            action_space={a: self._act_space for a in self.agent_ids},
            agent_episode_ids=ids,
            agent_module_ids=dict(mapping),
            agent_to_module_mapping_fn=lambda aid, episode: mapping[aid],
        )

    def _feed_tracks(self, res: PollResult, done_log: list) -> int:
        """:meth:`_feed` of a single-agent env: appends each sub-env's step to its track."""
        obs_all = self._validate(res)
        agent = self.agent_ids[0]
        steps = 0
        rank = self._env_rank
        for e in _env_ids(res):
            if e not in rank:
                rank[e] = len(rank)
            obs = obs_all.get(e, {})
            tr = self._tracks.get(e)
            if tr is None:  # a new episode (rewards before acting belong to no step)
                if agent not in obs or _all_done(res, e):  # ended before its first step: no episode
                    continue
                info = res.infos.get(e, {}).get(agent)
                tr = self._tracks[e] = Track(
                    self._new_episode_id(), [obs[agent]], [{} if info is None else info]
                )
                self._returns[tr.id_] = 0.0
                self._env_steps[tr.id_] = 0
                self._states.pop((e, agent), None)
                self._queue.append((e, obs[agent]))
                self._off_policy[e] = res.off_policy_actions.get(e, {})
                continue
            rewards = res.rewards.get(e, {})
            terms, truncs = res.terminateds.get(e, {}), res.truncateds.get(e, {})
            term, trunc = bool(terms.get(agent, False)), bool(truncs.get(agent, False))
            all_done = bool(terms.get(ALL_AGENTS, False) or truncs.get(ALL_AGENTS, False))
            reward = float(rewards.get(agent, 0.0))
            sent = self._actions.pop(e, None)
            if agent in obs:
                if sent is None:
                    raise ValueError(
                        f"env {e!r} delivered an observation for agent {agent!r}, which has one "
                        "waiting for its action"
                    )
                tr.step(
                    sent[agent][0],
                    sent[agent][1],
                    reward,
                    obs[agent],
                    res.infos.get(e, {}).get(agent) or {},
                )
                tr.terminated, tr.truncated = term, trunc
                if not (term or trunc or all_done):
                    self._queue.append((e, obs[agent]))
            else:  # a reward-only poll: the step hangs until the next observation
                if term or trunc or all_done:
                    raise ValueError(
                        f"env {e!r}: agent {agent!r} is done but its final observation is missing"
                    )
                if sent is not None:
                    self._actions[e] = sent
                tr.hanging_reward += reward
            self._returns[tr.id_] += float(sum(rewards.values()))
            self._env_steps[tr.id_] += 1
            tr.polls += 1
            steps += 1
            if all_done:
                self._finished[tr.id_] = (rank[e], self._poll_index)
                done_log.append((tr.id_, self._returns.pop(tr.id_), self._env_steps.pop(tr.id_)))
                self._closed.append(tr)
                del self._tracks[e]
                self._off_policy.pop(e, None)
                self._states.pop((e, agent), None)
            else:
                self._off_policy[e] = res.off_policy_actions.get(e, {})
        self._poll_index += 1
        return steps

    def _feed(self, res: PollResult, done_log: list) -> int:
        """Feeds one poll to the collector; returns the number of env steps it held."""
        if self._fast:
            return self._feed_tracks(res, done_log)
        obs_all = self._validate(res)
        steps = 0
        for e in _env_ids(res):
            self._env_rank.setdefault(e, len(self._env_rank))
            obs, infos = obs_all.get(e, {}), res.infos.get(e, {})
            if e not in self._running:  # a new episode (rewards before acting belong to no step)
                if not obs or _all_done(res, e):  # ended before its first step: no episode
                    continue
                ep = self._new_episode(e)
                self._running[e] = ep.id_
                self._returns[ep.id_] = 0.0
                for a, o in obs.items():
                    self._states.pop((e, a), None)
                    self.collector.add_init_obs(
                        episode=ep,
                        agent_id=a,
                        env_id=e,
                        policy_id=self._mapping[a],
                        init_obs=o,
                        init_infos=infos.get(a),
                    )
                self._off_policy[e] = res.off_policy_actions.get(e, {})
                continue
            eid = self._running[e]
            rewards = res.rewards.get(e, {})
            terms, truncs = res.terminateds.get(e, {}), res.truncateds.get(e, {})
            all_done = bool(terms.get(ALL_AGENTS, False) or truncs.get(ALL_AGENTS, False))
            sent = self._actions.pop(e, {})
            ep = self.collector.episode(eid)
            agents: dict[Any, None] = dict.fromkeys(sent)
            for d in (obs, rewards, terms, truncs):
                agents.update((a, None) for a in d if a != ALL_AGENTS)
            for a in agents:
                values: dict[str, Any] = {}
                if a in sent:
                    values["actions"], extras = sent[a]
                    values.update(extras)
                if a in rewards:
                    values["rewards"] = rewards[a]
                if a in obs:
                    values["new_obs"] = obs[a]
                    values["infos"] = infos.get(a, {})
                    if a not in ep.agent_episodes and a not in sent:  # joins the running episode
                        self._states.pop((e, a), None)
                        # A cut chunk knows only the ids of agents seen so far.
                        ep._agent_episode_ids.setdefault(a, self._agent_episode_id(ep.id_, a))
                        self.collector.add_init_obs(
                            episode=eid,
                            agent_id=a,
                            env_id=e,
                            policy_id=self._mapping[a],
                            init_obs=obs[a],
                            init_infos=infos.get(a),
                        )
                        values = {k: v for k, v in values.items() if k not in ("new_obs", "infos")}
                        if not values:
                            continue
                term, trunc = bool(terms.get(a, False)), bool(truncs.get(a, False))
                values["terminateds"], values["truncateds"] = term, trunc
                self.collector.add_action_reward_next_obs(
                    eid, a, e, self._mapping[a], term or trunc or all_done, values
                )
            self.collector.episode_step(eid, terminateds=terms, truncateds=truncs)
            self._returns[eid] += float(sum(rewards.values()))
            steps += 1
            if all_done:
                self._finished[eid] = (self._env_rank[e], self._poll_index)
                done_log.append((eid, self._returns.pop(eid), self.collector.episode(eid).env_t))
                self.collector.postprocess_episode(eid, is_done=True)
                del self._running[e]
                self._off_policy.pop(e, None)
                for a in self.agent_ids:
                    self._states.pop((e, a), None)
            else:
                self._off_policy[e] = res.off_policy_actions.get(e, {})
        self._poll_index += 1
        return steps

    # ------------------------------------------------------------------------- sampling

    def reset(self) -> None:
        """Discards every running episode; with an env that has ``reset()`` every sub-env
        starts a new episode at the next poll."""
        reset = getattr(self.host_env, "reset", None)
        if reset is None:
            raise NotImplementedError(
                f"{type(self.host_env).__name__} has no reset(): its running episodes cannot be discarded"
            )
        reset()
        for eid in list(self._running.values()):
            self.collector.discard_episode(eid)
            self._returns.pop(eid, None)
        self.collector.pop_built_episodes()
        self._tracks.clear()
        self._closed.clear()
        self._queue.clear()
        self._unrecorded.clear()
        self._returns.clear()
        self._env_steps.clear()
        self._running.clear()
        self._actions.clear()
        self._off_policy.clear()
        self._states.clear()
        self._finished.clear()
        self._episode_ids.new_run()
        self._needs_reset = False
        self._fresh = True

    def sample(
        self,
        params: Any,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        force_reset: bool = False,
    ) -> list[SingleAgentEpisode | MultiAgentEpisode]:
        """Samples and returns numpy'ized episodes: finished ones, then ongoing chunks.

        Args:
            params: policy params (a dict ``policy_id -> params`` for a MultiAgentPolicy).
            num_timesteps: sample until at least this many env steps.
            num_episodes: reset, then sample until this many episodes finished.
            force_reset: reset first (ongoing episodes are discarded).

        Metrics of the call are in :attr:`metrics`.
        """
        chunks = self._sample(params, num_timesteps, num_episodes, force_reset)
        if self._fast:
            return [tr.episode(self._obs_space, self._act_space) for tr in chunks]
        if self.multi_agent:
            return chunks
        out = []
        for ep in chunks:
            sa = next(iter(ep.agent_episodes.values()))
            sa.agent_id = sa.module_id = sa.multi_agent_episode_id = None
            out.append(sa)
        return out

    def sample_batch(
        self,
        params: Any,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        force_reset: bool = False,
    ) -> MultiAgentBatch:
        """Like :meth:`sample`, but returns a ``MultiAgentBatch`` (policy id ->
        ``SampleBatch``; rows episode by episode in :meth:`sample`'s order, then agent by
        agent, then by ``t``) with the device sampler's columns: ``obs``, ``new_obs``,
        ``actions``, ``rewards``, ``terminateds``, ``truncateds``, ``t``, ``eps_id``,
        ``agent_index``, ``infos`` (list of dicts) and the policy's extras."""
        chunks = self._sample(params, num_timesteps, num_episodes, force_reset)
        if self._fast:
            rows = [track_rows(tr) for tr in chunks if len(tr)]
            policy_batches = {}
            if rows:
                pid = self._mapping[self.agent_ids[0]]
                policy_batches[pid] = SampleBatch(
                    {k: _concat([r[k] for r in rows]) for k in rows[0]}
                )
            batch = MultiAgentBatch(policy_batches, sum(len(tr) for tr in chunks))
        else:
            batch = episodes_to_batch(chunks, self.agent_ids, self.policy_ids)
        batch.count = self.metrics.num_env_steps_sampled
        return batch

    def _sample(
        self, params: Any, num_timesteps: int | None, num_episodes: int | None, force_reset: bool
    ) -> list[MultiAgentEpisode]:
        check_sample_counts(num_timesteps, num_episodes)
        can_reset = getattr(self.host_env, "reset", None) is not None
        if force_reset or ((num_episodes is not None or self._needs_reset) and can_reset):
            self.reset()
        self._needs_reset = False
        done_log: list[tuple] = []
        env_steps = polls = 0
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while True:
            self._act(params)
            if deadline is not None and self._poll_takes_timeout:
                polled = self.host_env.poll(timeout=max(deadline - time.monotonic(), 0.0))
            else:
                polled = self.host_env.poll()
            steps = self._feed(polled, done_log)
            env_steps += steps
            polls += (
                not self._fresh
            )  # the first poll after a (re)start only delivers first observations
            self._fresh = False
            if num_episodes is not None:
                if len(done_log) >= num_episodes:
                    break
            elif num_timesteps is not None:
                if env_steps >= num_timesteps:
                    break
            elif polls >= self.rollout_length:
                break
            if getattr(self.host_env, "closed", False) or (
                deadline is not None and time.monotonic() >= deadline
            ):
                break
        if self._fast:
            chunks = self._close_tracks(num_episodes is not None and can_reset)
        elif num_episodes is not None and can_reset:
            for eid in list(self._running.values()):
                self.collector.discard_episode(eid)
            self._needs_reset = True
            chunks = self.collector.pop_built_episodes()
        else:
            for e in sorted(self._running, key=self._env_rank.__getitem__):
                self.collector.postprocess_episode(self._running[e], is_done=False)
            chunks = self.collector.pop_built_episodes()
        done = sorted(
            (c for c in chunks if c.id_ in self._finished), key=lambda c: self._finished[c.id_]
        )
        ongoing = [c for c in chunks if c.id_ not in self._finished]
        for c in done:
            del self._finished[c.id_]
        chunks = done + ongoing
        m = SamplerMetrics(num_env_steps_sampled=env_steps, num_rollout_calls=polls)
        m.num_agent_steps_sampled = sum(len(c) if self._fast else c.agent_steps() for c in chunks)
        m.num_episodes_completed, m.num_episodes_ongoing = len(done), len(ongoing)
        if done_log:
            rets = np.array([r for _, r, _ in done_log])
            lens = np.array([n for _, _, n in done_log])
            m.episode_return_mean, m.episode_return_min, m.episode_return_max = (
                rets.mean(),
                rets.min(),
                rets.max(),
            )
            m.episode_len_mean, m.episode_len_min, m.episode_len_max = (
                lens.mean(),
                lens.min(),
                lens.max(),
            )
            for k in (
                "episode_return_mean",
                "episode_return_min",
                "episode_return_max",
                "episode_len_mean",
                "episode_len_min",
                "episode_len_max",
            ):
                setattr(m, k, float(getattr(m, k)))
        self.metrics = m
        return chunks

    def _close_tracks(self, discard_running: bool) -> list[Track]:
        """The call's chunks in closing order: finished ones, then (unless discarded) the
        running ones, env by env, each continued in its ``cut`` successor."""
        if discard_running:
            for tr in self._tracks.values():
                self._returns.pop(tr.id_, None)
                self._env_steps.pop(tr.id_, None)
            self._tracks.clear()
            self._queue.clear()
            self._needs_reset = True
        else:
            for e in sorted(self._tracks, key=self._env_rank.__getitem__):
                tr = self._tracks[e]
                if (
                    tr.polls > 0
                ):  # as the collector: a chunk with env steps is closed (even without agent steps)
                    self._closed.append(tr)
                    self._tracks[e] = tr.cut(self.horizon)
        chunks, self._closed = self._closed, []
        return chunks

    def close(self) -> None:
        """Closes the host env."""
        self.host_env.close()
