"""Multi-agent conversion of a device sampler's rollout chunks into episodes or a batch.

:class:`MultiAgentConverter` turns one call's chunks into :class:`MultiAgentEpisode`
chunks (``sample()``) or a ``MultiAgentBatch`` keyed by policy id (``sample_batch()``);
both come from one vectorized pass over the call's buffers
(:func:`jaxsampler.sampling.device.agent_steps.agent_steps`) that finds every completed agent
step, or, in a call whose agents move in lockstep, straight from its episode segments
(:mod:`~jaxsampler.sampling.device.simultaneous`). Open chunks continue across calls
with RLlib's ``cut(episode_lookback_horizon)`` (mostly built from the call's columns,
:mod:`~jaxsampler.sampling.device.successors`); a step still waiting for the agent's next
observation is carried to the next call.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

import jax
import numpy as np

from jaxsampler.episodes._sa_views import view_episodes
from jaxsampler.episodes.batch import MultiAgentBatch, SampleBatch
from jaxsampler.episodes.ids import EpisodeIds, agent_episode_id
from jaxsampler.episodes.lookback import InfiniteLookbackBuffer, tree_map
from jaxsampler.episodes.multi_agent import SKIP, MultiAgentEpisode, StaticModuleMapping
from jaxsampler.episodes.single_agent import SingleAgentEpisode, reward_space
from jaxsampler.rollout import placement
from jaxsampler.sampling.device.agent_steps import (
    AgentCarry,
    AgentSteps,
    agent_steps_sharded,
    take,
    take_info,
    take_obs,
)
from jaxsampler.sampling.device.agent_steps import output_order as output_order
from jaxsampler.sampling.device.agent_views import AgentViews, EpisodeColumns, episode_columns
from jaxsampler.sampling.device.columns import (
    Columns,
    InfoPath,
    NextRows,
    Segments,
    build_columns,
    find_segments,
    no_gc,
    obs_at,
    obs_map,
    unflatten,
)
from jaxsampler.sampling.device.grouped import GroupedOutput
from jaxsampler.sampling.device.multi_calls import (
    NO_INFOS,
    check_trajectory,
    in_output_order,
    run_table,
    slice_rows,
)
from jaxsampler.sampling.device.parallel import parallel_take
from jaxsampler.sampling.device.simultaneous import is_simultaneous, simultaneous_steps
from jaxsampler.sampling.device.successors import ColumnSuccessors, ContinuedChunks
from jaxsampler.sampling.metrics import SamplerMetrics
from jaxsampler.types import Trajectory

__all__ = ["MultiAgentConverter", "check_trajectory", "output_order"]

_H = 1  # column head: the info of each call's first observation (lookback comes from cut)


@dataclasses.dataclass(frozen=True)
class _CallSteps:
    """What both outputs are built from: the call's columns and its agent steps."""

    cols: Columns  # with the one-step head
    call: Columns  # the call's own steps (infos keep the head: take_info indexes them so)
    seg: Segments
    metrics: SamplerMetrics
    steps: AgentSteps  # in output order
    pos: np.ndarray  # each step's segment
    old: AgentCarry  # the carry the call started from
    runs: np.ndarray | None = None  # first row of each (segment, agent) run, where known
    obs_rows: np.ndarray | None = None  # each row's flat [k, e, a] obs index, where known


class MultiAgentConverter:
    """Buffers -> :class:`MultiAgentEpisode` chunks or a ``MultiAgentBatch`` (see the
    module docstring).

    Carries across calls the hanging agent steps (:class:`AgentCarry`), the open episode
    chunks that ``sample()`` continues, the one-step column head and the running returns;
    :meth:`reset` drops them.

    Args:
        ids: the sampler's episode ids.
        num_envs: ``E``.
        agent_ids: the env's agent ids, in agent-axis order.
        agent_policy: each agent's policy (module) id, in agent-axis order.
        observation_space, action_space: of one agent (all agents share them).
        horizon: lookback env steps carried into continuation chunks (``cut``).
        rllib_compatible: agents' done flags as RLlib 2.60's ``MultiAgentEpisode`` sets
            them: every agent stepped in an episode's last step is terminated, and also
            truncated if the episode is (RLlib ORs the episode's flags into each agent).
            Default: each agent's own flags.
    """

    def __init__(
        self,
        ids: EpisodeIds,
        num_envs: int,
        agent_ids: tuple[Any, ...],
        agent_policy: tuple[str, ...],
        observation_space: Any,
        action_space: Any,
        horizon: int,
        rllib_compatible: bool = False,
        grouped: GroupedOutput | None = None,
    ):
        self._ids = ids
        # An env with agent groups: the outputs are unpacked to each agent's own spaces
        # (:mod:`.grouped`); the converter itself works in the carrier spaces.
        self._unpackers = grouped.batch if grouped else {}
        self._unpack_episodes = grouped.episodes if grouped else None
        self._rllib_compatible = bool(rllib_compatible)
        self._num_envs = num_envs
        self._agent_ids, self._agent_policy = agent_ids, agent_policy
        self._obs_space, self._act_space = observation_space, action_space
        self._spaces = (
            {a: observation_space for a in agent_ids},
            {a: action_space for a in agent_ids},
        )
        self._mapping = dict(zip(agent_ids, agent_policy))
        self._mapping_fn = StaticModuleMapping(self._mapping)
        self._act_zero = np.asarray(jax.tree.leaves(action_space.zeros())[0])
        self._horizon = horizon
        self._head: Columns | None = None
        self._reset_info: dict[InfoPath, np.ndarray] = {}
        self._partial_return = np.zeros(num_envs, np.float64)
        self._carry: AgentCarry | None = None  # hanging steps, per-agent progress
        self._open: dict[int, MultiAgentEpisode] = {}  # env -> its open sample() chunk
        # envs whose successor in _open came from the call's columns: nothing hangs in it,
        # its columns are numpy'ized with the columns' dtypes (not state: a restored
        # converter checks nothing and cuts its next chunks from the built chunks)
        self._plain = np.zeros(num_envs, bool)
        self._successors = ColumnSuccessors(
            ids, agent_ids, self._spaces, self._mapping, self._mapping_fn, horizon
        )
        self._next_acting = np.zeros((num_envs, len(agent_ids)), bool)
        self._continue_views = True  # (False: continued chunks extend their successors)
        # policies in order of first appearance on the agent axis, and each agent's rank
        self._pids = list(dict.fromkeys(agent_policy))
        self._rank = np.array([self._pids.index(pid) for pid in agent_policy])
        self._suffixes = [agent_episode_id("", a) for a in range(len(agent_ids))]
        self._modules = [self._mapping[aid] for aid in agent_ids]

    def reset(self, reset_info: dict[InfoPath, np.ndarray]) -> None:
        """Forgets the running episodes; ``reset_info`` holds the reset observations' info."""
        self._head = None
        self._reset_info = reset_info
        self._partial_return = np.zeros_like(self._partial_return)
        self._carry = None
        self._open = {}
        self._plain = np.zeros_like(self._plain)

    _STATE = ("_head", "_reset_info", "_partial_return", "_carry", "_open", "_next_acting")

    def get_state(self) -> dict[str, Any]:
        """What the converter carries into the next call (the lookback head, hanging agent
        steps, the open ``sample()`` chunks), for checkpoints."""
        return {name[1:]: getattr(self, name) for name in self._STATE}

    def set_state(self, state: dict[str, Any]) -> None:
        """Installs :meth:`get_state`'s output."""
        for name in self._STATE:
            setattr(self, name, state[name[1:]])
        self._plain = np.zeros_like(self._plain)

    # ------------------------------------------------------------------------- steps

    def _call_steps(
        self,
        chunks: list[Trajectory],
        num_episodes: int | None,
        state: Any,
        by_policy: bool,
        cutoff: int | None = None,
    ) -> _CallSteps:
        """Segments plus the completed agent steps of the call, rows in output order
        (``by_policy``: grouped by policy first, so each policy's rows are one slice)."""
        E, A = self._num_envs, len(self._agent_ids)
        check_trajectory(chunks, E, A)
        # Agents acting on the call's last observation: it completes their previous step.
        self._next_acting = np.asarray(
            placement.to_host(state.acting & ~state.needs_reset[:, None])
        )
        fresh = self._head is None
        cols = build_columns(chunks, self._head, self._reset_info, _H, multi_agent=True)
        self._head = cols.tail(_H)
        # The episode ends when every agent is done; it counts as truncated if some agent
        # was truncated at that step.
        done = np.all(cols.terminated | cols.truncated, axis=2)
        seg, m, self._partial_return = find_segments(
            cols.is_reset,
            done,
            done & np.any(cols.truncated, axis=2),
            cols.env_rewards.sum(axis=2, dtype=np.float64),
            horizon=_H,
            step0=np.asarray(chunks[0].episode_step_0),
            count0=np.asarray(chunks[0].episode_count_0),
            fresh=fresh,
            partial_return=self._partial_return,
            num_episodes=num_episodes,
            cutoff=cutoff,
        ).summarized()
        call = dataclasses.replace(
            cols.map(lambda c: c[:, _H:], lambda o: o), infos=cols.infos
        )  # (obs have no head)
        old = self._carry or AgentCarry.empty(call, E, A)
        step0 = np.asarray(chunks[0].episode_step_0)
        rank = self._rank if by_policy else None
        runs = obs_rows = None
        if is_simultaneous(call, old, self._next_acting):  # built in output order
            steps, pos, runs, self._carry, obs_rows = simultaneous_steps(
                call, old, step0, seg, rank, with_steps=not by_policy, with_obs_rows=by_policy
            )
        else:
            steps, self._carry = agent_steps_sharded(call, old, step0, self._next_acting)
            pos, steps = in_output_order(steps, seg, call.is_reset.shape, A, rank)
        if self._rllib_compatible and len(pos):
            # Steps ending at their episode's last env step (its last observation's slot;
            # slots count the one-step head).
            final = (seg.term | seg.trunc)[pos] & (steps.end == (seg.start + seg.len + _H)[pos])
            steps = dataclasses.replace(
                steps,
                terminated=steps.terminated | final,
                truncated=steps.truncated | (final & seg.trunc[pos]),
            )
        return _CallSteps(cols, call, seg, m, steps, pos, old, runs, obs_rows)

    def _step_columns(
        self, cs: _CallSteps, eps_ids: np.ndarray, next_infos: bool = False
    ) -> dict[str, Any]:
        steps, old, cols, call = cs.steps, cs.old, cs.cols, cs.call
        e, s, a, c = steps.env, steps.slot, steps.agent, steps.end
        A = len(self._agent_ids)
        # Observations are the bulk of the data: one flat gather from the time-major buffer
        # (as fast as from an agent-major copy, which would cost a transpose); and a row's
        # new_obs is the next row's obs except where an agent's run of rows ends: new_obs is
        # built from the batch's obs on its first read, only those end rows gathered now.
        # (A nested observation: the same per leaf.)
        rows = cs.obs_rows  # (a simultaneous call: the flat index is built already)
        obs = obs_map(
            lambda o, c: (
                parallel_take(o.reshape((-1,) + o.shape[3:]), rows)
                if rows is not None and o.flags.c_contiguous
                else take(o, c, e, s, a, time_major=True)
            ),
            call.obs,
            old.obs,
        )
        if cs.runs is not None:  # (a simultaneous call: each run's last row)
            rest = np.append(cs.runs[1:], len(e))[: len(cs.runs)] - 1
        else:
            same = np.zeros(len(e), bool)
            if len(e) > 1:
                same[:-1] = (e[1:] == e[:-1]) & (a[1:] == a[:-1]) & (s[1:] == c[:-1])
            rest = np.flatnonzero(~same)
        ends = take_obs(call.obs, old.obs, e[rest], c[rest], a[rest])
        data: dict[str, Any] = {
            SampleBatch.OBS: obs,
            SampleBatch.NEXT_OBS: NextRows(obs, rest, ends),  # (split per policy: slice_rows)
            SampleBatch.ACTIONS: take(cols.actions, old.action, e, s, a, _H),
            SampleBatch.REWARDS: steps.reward.astype(np.float32, copy=False),
            SampleBatch.TERMINATEDS: steps.terminated,
            SampleBatch.TRUNCATEDS: steps.truncated,
            SampleBatch.T: np.asarray(steps.t, np.int64),  # (no copy: steps are this call's)
            SampleBatch.EPS_ID: eps_ids,
            SampleBatch.AGENT_INDEX: np.asarray(a, np.int64),
        }
        infos = call.infos
        if infos:
            data[SampleBatch.INFOS] = unflatten(
                {k: take_info(v, old.info[k], e, s, a, A) for k, v in infos.items()}
            )
        else:  # (one empty dict per row, made on first read: see slice_rows)
            data[SampleBatch.INFOS] = NO_INFOS
        if next_infos and infos:
            data["_next_infos"] = unflatten(
                {k: take_info(v, old.info[k], e, c, a, A) for k, v in infos.items()}
            )
        for k, col in cols.extras.items():
            data[k] = take(col, old.extras[k], e, s, a, _H)
        return data

    # ------------------------------------------------------------------------- batch

    def batch(
        self,
        chunks: list[Trajectory],
        num_episodes: int | None,
        state: Any,
        cutoff: int | None = None,
    ) -> tuple[MultiAgentBatch, SamplerMetrics]:
        """``MultiAgentBatch``: one row per completed agent step, keyed by policy id; rows
        episode by episode (``sample()``'s order), then agent by agent, then by ``t``
        (``cutoff``: see :func:`~jaxsampler.sampling.device.columns.find_segments`)."""
        cs = self._call_steps(chunks, num_episodes, state, by_policy=True, cutoff=cutoff)
        steps, pos, seg = cs.steps, cs.pos, cs.seg
        self._open = {}  # open sample() chunks are stale now: the next sample() starts new chunks
        self._plain = np.zeros_like(self._plain)
        # eps_id: one string per (episode, agent) run of rows, then broadcast to the rows.
        n = len(pos)
        starts = cs.runs
        if starts is None:
            uid = pos * len(self._agent_ids) + steps.agent
            new_run = np.empty(n, bool)
            new_run[:1] = True
            np.not_equal(uid[1:], uid[:-1], out=new_run[1:])
            starts = np.flatnonzero(new_run)
        # Episode ids once per segment, then one vectorized concatenation per (segment, agent)
        # (agent_episode_id's suffix), as Python strs shared by the run's rows.
        suffix = np.array([agent_episode_id("", a) for a in range(len(self._agent_ids))])
        p, a = pos[starts], steps.agent[starts]
        ids = np.strings.add(self._ids.many(seg.env[p], seg.count[p]), suffix[a]).astype(object)
        # An object array of shared strings: 8 bytes per row (a unicode array would be 144).
        sa_ids = np.repeat(ids, np.diff(starts, append=n))
        data = self._step_columns(cs, sa_ids)
        # Rows are grouped by policy: each policy's batch is one slice (numpy views).
        bounds = np.searchsorted(self._rank[steps.agent], np.arange(len(self._pids) + 1))
        unpack = self._unpackers
        batches = {
            pid: SampleBatch(slice_rows(data, int(bounds[i]), int(bounds[i + 1]), unpack.get(pid)))
            for i, pid in enumerate(self._pids)
        }
        m = cs.metrics
        m.num_agent_steps_sampled = n
        return MultiAgentBatch(batches, m.num_env_steps_sampled), m

    # ------------------------------------------------------------------------- episodes

    def episodes(
        self,
        chunks: list[Trajectory],
        num_episodes: int | None,
        state: Any,
        cutoff: int | None = None,
    ) -> tuple[list[MultiAgentEpisode], SamplerMetrics]:
        """The call's episodes (finished ones, then ongoing chunks) and its metrics
        (``cutoff``: see :func:`~jaxsampler.sampling.device.columns.find_segments`).

        Finished chunks are lazy (:meth:`MultiAgentEpisode.lazy`): their agents' episodes
        are views into the call's columns, made on first access. An open chunk's ``cut``
        successor (which the next call continues) comes straight from the call's columns
        where :class:`~jaxsampler.sampling.device.successors.ColumnSuccessors` can build it
        (then the chunk is lazy too); other open chunks are built now and cut."""
        cs = self._call_steps(chunks, num_episodes, state, by_policy=False, cutoff=cutoff)
        seg, pos = cs.seg, cs.pos
        carry = self._carry
        assert carry is not None  # set by _call_steps
        data = episode_columns(cs.steps, cs.pos, cs.old, cs.cols, cs.call, len(self._agent_ids), _H)
        ctx = _Context(
            cs,
            data,
            AgentViews(data, data.run_start, data.run_stop, self._obs_space, self._act_space),
            carry,
            self._next_acting,
            np.asarray(chunks[0].episode_step_0),
            ContinuedChunks(cs.steps, data, self._agent_ids, self._obs_space, self._act_space),
        )
        bounds = np.searchsorted(pos, np.arange(len(seg) + 1)).tolist()
        L = cs.call.is_reset.shape[1]
        step0 = ctx.step0.tolist()
        envs, starts, lens = seg.env.tolist(), seg.start.tolist(), seg.len.tolist()
        counts, terms, truncs = seg.count.tolist(), seg.term.tolist(), seg.trunc.tolist()
        episodes: list[MultiAgentEpisode] = []
        open_keys: dict[int, _Key] = {}  # segment -> its open chunk
        plain: dict[int, _Key] = {}
        build = self._build  # (one bound method for all the call's lazy chunks)
        with no_gc():
            for i in range(len(seg)):
                e, start, length = envs[i], starts[i], lens[i]
                continues = start == 0 and step0[e] > 0
                succ = self._open.get(e) if continues else None
                done = bool(terms[i] or truncs[i])
                rows = (bounds[i], bounds[i + 1])
                hanging = not done and start + length == L
                key = _Key(ctx, i, e, counts[i], continues, succ, rows, hanging)
                if succ is not None and self._plain[e] and self._continue_views:
                    plain[i] = key
                if done:
                    episodes.append(self._lazy(key, length, True, truncs[i], build))
                else:
                    open_keys[i] = key
                    episodes.append(None)  # type: ignore[arg-type]  # (set below)
            fast = self._column_successors(ctx, open_keys)
            ctx.continued.keys.update(  # (lazy chunks that continue a plain successor)
                (i, k) for i, k in plain.items() if i not in open_keys or i in fast
            )
            still_open = {}
            for i, key in open_keys.items():
                if i in fast:  # lazy: its successor does not need the chunk built
                    episodes[i] = self._lazy(key, lens[i], False, False, build)
                else:
                    episodes[i] = still_open[i] = self._fill(None, key, hanging=key.hanging)
            # As RLlib's env runner: the open chunks' successors are cut first, then every
            # chunk loses its agents without a step and is numpy'ized.
            cut = {i: self._successor(ep) for i, ep in still_open.items()}
            self._open = {key.e: fast[i] if i in fast else cut[i] for i, key in open_keys.items()}
            self._plain = np.zeros_like(self._plain)
            self._plain[[open_keys[i].e for i in fast]] = True
            for ep in still_open.values():
                _finalize(ep.prune_empty_agents())
        m = cs.metrics
        m.num_agent_steps_sampled = len(pos)
        if self._unpack_episodes is not None:
            episodes = self._unpack_episodes(episodes)
        return episodes, m

    def _lazy(
        self, key: _Key, length: int, done: bool, truncated: bool, build: Any
    ) -> MultiAgentEpisode:
        """The lazy chunk of ``key``'s segment (``length`` env steps), built by
        ``build`` (the bound :meth:`_build`, made once per call) on first access."""
        succ, e = key.succ, key.e
        t0 = (
            succ.env_t_started
            if succ is not None
            else (int(key.ctx.step0[e]) if key.continues else 0)
        )
        return MultiAgentEpisode.lazy(
            self._ids(e, key.count) if succ is None else succ.id_,
            build,
            key,
            observation_space=self._spaces[0],
            action_space=self._spaces[1],
            agent_module_ids=self._mapping,
            agent_to_module_mapping_fn=self._mapping_fn,
            env_t_started=t0,
            env_t=(succ.env_t if succ is not None else t0) + length,
            terminated=done,
            truncated=bool(truncated),
        )

    def _column_successors(
        self, ctx: _Context, keys: dict[int, _Key]
    ) -> dict[int, MultiAgentEpisode]:
        """The successors of the open chunks (``keys``, by segment) that
        :class:`~jaxsampler.sampling.device.successors.ColumnSuccessors` builds from the
        call's columns (the others: ``_successor`` of the built chunk)."""
        return self._successors(keys, ctx, self._plain)

    def _build(self, ep: MultiAgentEpisode, key: _Key) -> None:
        """Fills a lazy chunk (see :meth:`MultiAgentEpisode.lazy`): a finished one, or an
        open one whose successor came from the call's columns (nothing hangs in it); as
        view episodes where all its steps are in this call or it continues a successor
        from the columns (:class:`~jaxsampler.sampling.device.successors.ContinuedChunks`)."""
        if key.succ is None and not key.continues:  # all its steps are in this call
            self._build_views(ep, key)
            return
        if key.succ is not None and key.ctx.continued.build(ep, key):
            return
        full = self._fill(ep if key.succ is None else None, key, hanging=key.hanging)
        if full is not ep:  # a continued chunk: the successor extended, now this episode
            ep.__dict__.update(full.__dict__)
        _finalize(ep.prune_empty_agents())

    def _build_views(self, ep: MultiAgentEpisode, key: _Key) -> None:
        """Fills a lazy finished chunk whose steps all lie in this call: its agents'
        episodes are view episodes (:class:`AgentViews`, one per run of the chunk's rows,
        built without touching the data), its maps are written on first access
        (:meth:`_fill_maps`). The same episode as :meth:`_fill` builds (agents with no step
        in the chunk have none; nothing hangs)."""
        ctx = key.ctx
        runs = ctx.tables.get("runs") or run_table(ctx)
        ma_id = ep.id_
        ids = [ma_id + suffix for suffix in self._suffixes]  # (agent_episode_id's)
        ep._agent_episode_ids.update(zip(self._agent_ids, ids))
        lo, hi = key.rows
        if hi == lo:
            return
        group = ctx.data.group
        g0, g1 = int(group[lo]), int(group[hi - 1]) + 1
        agents = tuple(runs.agent[g0:g1])  # (ints only: the GC untracks it)
        t0 = runs.t0[g0:g1]
        fields = zip(
            [ids[a] for a in agents], runs.term[g0:g1], runs.trunc[g0:g1], t0, runs.t1[g0:g1]
        )
        sas = view_episodes(
            SingleAgentEpisode, ctx.views, fields, self._obs_space, self._act_space, range(g0, g1)
        )
        by_agent, started = ep.agent_episodes, ep.agent_t_started
        aids, modules = self._agent_ids, self._modules
        for a, sa, ts in zip(agents, sas, t0):
            aid = aids[a]
            sa.agent_id, sa.module_id, sa.multi_agent_episode_id = aid, modules[a], ma_id
            by_agent[aid] = sa
            started[aid] = ts
        # (env_t_to_agent_t: on first access; readers of the agents' episodes never need it)
        ep.__dict__["_lazy_maps"] = partial(  # (the plain function: no bound method each)
            MultiAgentConverter._fill_maps, self, key, agents, ep.env_t - ep.env_t_started + 1
        )

    def _fill_maps(
        self,
        key: _Key,
        agents: tuple[int, ...],
        width: int,
        maps: dict[Any, InfiniteLookbackBuffer],
    ) -> None:
        """``env_t_to_agent_t`` of a view-built chunk (:meth:`_build_views`), all agents in
        one pass: a step's start env step maps to its agent timestep, its end env step to
        the next one (written after, as :meth:`_extend_episode` does)."""
        steps, data = key.ctx.cs.steps, key.ctx.data
        lo, hi = key.rows
        g0 = int(data.group[lo])
        entries = np.full((len(agents), width), -1, np.int64)
        local = data.group[lo:hi] - g0
        t = steps.t[lo:hi]
        entries[local, steps.start_step[lo:hi]] = t
        entries[local, steps.end_step[lo:hi]] = t + 1
        rows = entries.astype(object)
        rows[entries < 0] = SKIP
        trusted = InfiniteLookbackBuffer.trusted
        for a, row in zip(agents, rows.tolist()):
            maps[self._agent_ids[a]] = trusted(row, 0, borrowed=False)

    def _fill(self, ep: MultiAgentEpisode | None, key: _Key, hanging: bool) -> MultiAgentEpisode:
        """The chunk of segment ``key.i`` with all its steps (``ep``: a lazy episode to fill
        instead of a new one, when it does not continue a successor)."""
        ctx, i = key.ctx, key.i
        seg = ctx.cs.seg
        ep, first = self._open_episode(ep, key, int(ctx.step0[key.e]), ctx.cs.old)
        self._extend_episode(ep, first, key, int(seg.len[i]), hanging)
        if seg.term[i] or seg.trunc[i]:
            ep.is_terminated, ep.is_truncated = True, bool(seg.trunc[i])
        return ep

    def _open_episode(
        self, ep: MultiAgentEpisode | None, key: _Key, step0: int, old: AgentCarry
    ) -> tuple[MultiAgentEpisode, int]:
        """The chunk that the segment's steps of env ``key.e`` extend: the successor
        (``cut``) of the open chunk, or a new episode (also when the previous call was
        ``sample_batch``; ``ep``: a lazy one to start from); and the env step of its first
        map entry still to be written."""
        e = key.e
        if key.succ is not None:
            return key.succ, key.succ.env_t + 1  # its maps end at env step succ.env_t
        ma_id = self._ids(e, key.count)
        if ep is None:
            ep = MultiAgentEpisode(
                ma_id,
                observation_space=self._spaces[0],
                action_space=self._spaces[1],
                agent_episode_ids={
                    a: agent_episode_id(ma_id, i) for i, a in enumerate(self._agent_ids)
                },
                agent_module_ids=self._mapping,
                agent_to_module_mapping_fn=self._mapping_fn,
            )
        else:
            ep.start_at(0, 0)
            ep._agent_episode_ids.update(
                {a: agent_episode_id(ma_id, i) for i, a in enumerate(self._agent_ids)}
            )
        first = 0
        if key.continues:  # no chunk to cut: start at the earliest hanging step's observation
            hanging = old.start[e][old.pend[e]]
            first = int(min([step0, *hanging.tolist()]))
            ep.start_at(step0, step0 - first)
            for a in np.nonzero(old.pend[e])[0].tolist():
                self._ensure_agent(
                    ep,
                    a,
                    obs_at(old.obs, (e, a)),
                    {k: v[e, a] for k, v in old.info.items()},
                    int(old.n_act[e, a]) - 1,
                )
                self._set_hanging(ep, a, e, old)
        return ep, first

    def _successor(self, ep: MultiAgentEpisode) -> MultiAgentEpisode:
        """``ep.cut(horizon)`` with its lookback data numpy'ized (the next call appends
        arrays to it; env infos stay numpy'ized, as in new chunks)."""
        fast = None if ep.is_done else ep._cut_columns(max(self._horizon, 0), numpy=True)
        if fast is not None:  # (lookback columns already arrays)
            return fast
        succ = ep.cut(self._horizon)
        for sa in succ.agent_episodes.values():
            for buf in (sa.observations, sa.actions, sa.rewards, *sa.extra_model_outputs.values()):
                if not buf.finalized and buf.len_incl_lookback() > 0:
                    buf.finalize()
            if not sa.infos.finalized and sa.infos.data and sa.infos.data[0]:
                sa.infos.finalize()
        return succ

    def _set_hanging(self, ep: MultiAgentEpisode, a: int, e: int, carry: AgentCarry) -> None:
        ep.set_hanging(
            self._agent_ids[a],
            carry.action[e, a],
            float(carry.reward[e, a]),
            {k: v[e, a] for k, v in carry.extras.items()},
        )

    def _ensure_agent(
        self, ep: MultiAgentEpisode, a: int, obs: Any, info: dict[InfoPath, Any], t_started: int
    ) -> SingleAgentEpisode:
        aid = self._agent_ids[a]
        sa = ep.agent_episodes.get(aid)
        if sa is not None:
            return sa
        trusted = InfiniteLookbackBuffer.trusted
        return ep.trusted_agent(
            aid,
            observations=trusted(obs_map(lambda x: np.asarray(x)[None], obs), 0, self._obs_space),
            infos=trusted(
                unflatten({k: np.asarray(v)[None] for k, v in info.items()}) if info else [{}], 0
            ),
            actions=trusted(
                np.zeros((0,) + self._act_zero.shape, self._act_zero.dtype), 0, self._act_space
            ),
            rewards=trusted(np.zeros((0,), np.float32), 0, reward_space()),
            t_started=t_started,
            default_id=agent_episode_id(ep.id_, a),
        )

    def _extend_episode(
        self, ep: MultiAgentEpisode, first: int, key: _Key, length: int, hanging: bool
    ) -> None:
        """Appends ``length`` env steps of env ``key.e`` (agent steps ``key.rows``) to
        ``ep``; its map entries are written from env step ``first`` on. An agent new to
        ``ep`` gets views into the call's columns."""
        ctx, e = key.ctx, key.e
        cs, data, carry = ctx.cs, ctx.data, ctx.carry
        steps = cs.steps
        last = ep.env_t + length
        width = last - first + 1
        # A segment's rows run agent by agent (then by t): each agent's rows are one slice,
        # so its columns are numpy views, as a single-agent episode's are.
        lo, hi = key.rows
        cuts = (
            lo + np.searchsorted(steps.agent[lo:hi], np.arange(len(self._agent_ids) + 1))
        ).tolist()
        for a, aid in enumerate(self._agent_ids):
            r0, r1 = cuts[a], cuts[a + 1]
            pend = hanging and bool(carry.pend[e, a])
            mapped = aid in ep.env_t_to_agent_t
            entries = np.full(width, -1, np.int64)
            if r1 > r0:
                t_r = steps.t[r0:r1]
                start_r = steps.start_step[r0:r1]
                inside = start_r >= first  # earlier starts are already mapped
                entries[start_r[inside] - first] = t_r[inside]
                entries[steps.end_step[r0:r1] - first] = t_r + 1
                self._add_steps(ep, a, int(t_r[0]), r0, r1, data)
                sa = ep.agent_episodes[aid]
                sa.is_terminated, sa.is_truncated = (
                    bool(steps.terminated[r1 - 1]),
                    bool(steps.truncated[r1 - 1]),
                )
                ep.clear_hanging(aid)
            if pend:
                start = int(carry.start[e, a])
                t = int(carry.n_act[e, a]) - 1
                self._ensure_agent(
                    ep,
                    a,
                    obs_at(carry.obs, (e, a)),
                    {k: v[e, a] for k, v in carry.info.items()},
                    t,
                )
                if first <= start <= last:
                    entries[start - first] = t
                self._set_hanging(ep, a, e, carry)
            if hanging and aid not in ep.agent_episodes and ctx.next_acting[e, a]:
                # Joins with the call's last observation (it acts on it in the next call).
                L = cs.call.is_reset.shape[1]
                info = {
                    k: take_info(
                        v,
                        carry.info[k],
                        np.array([e]),
                        np.array([L + 1]),
                        np.array([a]),
                        len(self._agent_ids),
                    )[0]
                    for k, v in cs.call.infos.items()
                }
                # (a copy: the call's obs column is the host copy of the buffers itself)
                obs = obs_map(np.copy, obs_at(cs.call.obs, (L, e, a)))
                self._ensure_agent(ep, a, obs, info, int(carry.n_act[e, a]))
                entries[last - first] = int(carry.n_act[e, a])
            if not mapped and aid not in ep.agent_episodes:
                continue
            ep.extend_agent_map(aid, _map_entries(entries), first)
        ep.env_t = last

    def _add_steps(
        self, ep: MultiAgentEpisode, a: int, t0: int, r0: int, r1: int, data: EpisodeColumns
    ) -> None:
        """Agent ``a``'s steps ``r0:r1`` (rows of ``data``) added to ``ep``: a new agent
        episode of views into ``data``, or appended to the agent's existing one."""
        aid = self._agent_ids[a]
        g = int(data.group[r0])  # the rows' run: its observations are track rows r0+g..r1+g
        o0, o1 = r0 + g, r1 + g + 1
        trusted = InfiniteLookbackBuffer.trusted
        sa = ep.agent_episodes.get(aid)
        n = r1 - r0
        if sa is None:
            info_buf = (
                trusted(tree_map(lambda x: x[o0:o1], data.info_track), 0)
                if data.info_track
                else trusted([{}] + [{}] * n, 0)
            )
            sa = ep.trusted_agent(
                aid,
                observations=trusted(
                    obs_map(lambda x: x[o0:o1], data.obs_track), 0, self._obs_space
                ),
                infos=info_buf,
                actions=trusted(data.actions[r0:r1], 0, self._act_space),
                rewards=trusted(data.rewards[r0:r1], 0, reward_space()),
                t_started=t0,
                default_id=agent_episode_id(ep.id_, a),
            )
            sa.t = t0 + n
            for k, col in data.extras.items():
                sa.extra_model_outputs[k] = trusted(col[r0:r1], 0)
            return
        _extend(sa.observations, obs_map(lambda x: x[o0 + 1 : o1], data.obs_track))
        _extend(sa.actions, data.actions[r0:r1])
        _extend(sa.rewards, data.rewards[r0:r1])
        for k, col in data.extras.items():
            if k not in sa.extra_model_outputs:
                sa.extra_model_outputs[k] = InfiniteLookbackBuffer.trusted(
                    col[r0:r0], sa.actions.lookback
                )
            _extend(sa.extra_model_outputs[k], col[r0:r1])
        if data.info_track and sa.infos.finalized:
            _extend(sa.infos, tree_map(lambda x: x[o0 + 1 : o1], data.info_track))
        elif data.info_track:  # a list-mode column (a cut successor): one dict per row
            rows_info = tree_map(lambda x: x[o0 + 1 : o1], data.info_track)
            sa.infos.data.extend(tree_map(lambda x, i=i: x[i], rows_info) for i in range(n))
        else:
            sa.infos.data.extend([{}] * n)
        sa.t += n


@dataclasses.dataclass(frozen=True)
class _Context:
    """What one call's chunks are built from (held by its lazy episodes)."""

    cs: _CallSteps
    data: EpisodeColumns
    views: AgentViews  # finished chunks' agents' episodes over data
    carry: AgentCarry  # the carry at the end of the call
    next_acting: np.ndarray
    step0: np.ndarray
    continued: ContinuedChunks  # view episodes of chunks that continue plain successors
    tables: dict[str, Any] = dataclasses.field(default_factory=dict)  # (made on first use)


@dataclasses.dataclass(frozen=True)
class _Key:
    """One chunk of a call: segment ``i`` of env ``e``, its rows, the successor it continues."""

    ctx: _Context
    i: int
    e: int
    count: int
    continues: bool
    succ: MultiAgentEpisode | None
    rows: tuple[int, int]
    hanging: bool = False  # the segment ends with the call (an open chunk: steps may hang)


def _map_entries(entries: np.ndarray) -> list:
    """``env_t_to_agent_t`` entries: agent timesteps, :data:`SKIP` for ``-1``."""
    out = entries.tolist()
    if (entries < 0).any():
        out = [SKIP if v < 0 else v for v in out]
    return out


def _finalize(ep: MultiAgentEpisode) -> None:
    """Numpy'izes the columns still in list mode (``to_numpy`` without its checks: the
    columns were built consistent)."""
    for sa in ep.agent_episodes.values():
        for buf in (sa.observations, sa.actions, sa.rewards, *sa.extra_model_outputs.values()):
            if not buf.finalized:
                buf.finalize()


def _extend(buf: InfiniteLookbackBuffer, items: Any) -> None:
    """Appends arrays to a numpy'ized buffer (an empty list-mode buffer becomes numpy'ized)."""
    if not buf.finalized and buf.len_incl_lookback() == 0:
        buf.data, buf.finalized = items, True
        return
    buf.extend(items)
