"""``cut`` successors of a call's open multi-agent chunks, straight from the call's columns.

The next ``sample()`` call continues every open chunk's ``cut(horizon)`` successor. For
the common chunk that :meth:`MultiAgentEpisode._cut_columns` itself takes (nothing
hanging, every agent still running observed at each of the chunk's last ``n + 1`` env
steps), the successor holds only the last ``n + 1`` observations (and infos) and ``n``
actions, rewards and extra model outputs of each running agent, all of them rows of this
call's :class:`EpisodeColumns` when the agent's run in the chunk has ``n`` steps or more.
:func:`eligible_chunks` finds those chunks with whole-array tests over the runs, and
:func:`column_successors` gathers their lookback rows with one ``take`` per column (copies)
and builds the same successors ``_cut_columns(n, numpy=True)`` builds from the chunk,
without building the chunk: their agents' episodes are view episodes over those rows
(:class:`~jaxsampler.sampling.device.agent_views.LookbackViews`, columns and maps built on
first access), so a call makes one object per agent episode for them, not six.
:class:`ColumnSuccessors` picks the open chunks of a call that this path takes and builds
their successors.

A chunk of the next call that continues such a successor (nothing hanging in it, each of
the successor's agents with one run of rows starting at the successor's last observation)
is read the same way as a chunk that starts in its call: :class:`ContinuedChunks` lays
out, once per call, every such run with its successor's lookback rows in front (one
scatter per column, read straight from the successors' shared rows where their agents'
columns were never built) and makes the chunk's agents view episodes over them
(:class:`~jaxsampler.sampling.device.agent_views.LookbackViews`), instead of extending the
successor's buffers agent by agent.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from functools import partial
from typing import Any

import numpy as np

from jaxsampler.episodes._sa_views import reward_space, view_episodes
from jaxsampler.episodes.ids import agent_episode_id
from jaxsampler.episodes.lookback import InfiniteLookbackBuffer, tree_map
from jaxsampler.episodes.multi_agent import SKIP, MultiAgentEpisode
from jaxsampler.episodes.single_agent import SingleAgentEpisode
from jaxsampler.sampling.device.agent_steps import AgentSteps
from jaxsampler.sampling.device.agent_views import EpisodeColumns, LookbackViews
from jaxsampler.sampling.device.columns import obs_map

__all__ = [
    "ColumnSuccessors",
    "ContinuedChunks",
    "OpenChunk",
    "column_successors",
    "eligible_chunks",
]


@dataclasses.dataclass(frozen=True)
class OpenChunk:
    """An open chunk whose successor :func:`column_successors` builds.

    ``runs``: its runs of rows (one per agent with steps in it), in the order its agents'
    episodes have in the chunk; ``n``: the successor's lookback env steps; ``env_t``: the
    chunk's last env step; ``prev``: the successor it continues (``None``: a new episode,
    then ``ma_id`` is its id)."""

    runs: list[int]
    n: int
    env_t: int
    prev: MultiAgentEpisode | None
    ma_id: str


class ColumnSuccessors:
    """The successors of a call's open chunks that :func:`column_successors` builds.

    Takes a chunk that ends with the call (``key.hanging``), that starts a new episode or
    continues a successor built so (``plain``: nothing hangs in it, its columns have the
    call columns' dtypes), in which no agent waits for an observation at the call's end
    (``carry.pend``) or joins with the call's last one, every agent of the successor it
    continues has steps, and :func:`eligible_chunks` holds.

    Args:
        ids: the sampler's episode ids (a new episode's id).
        agent_ids, spaces, mapping, mapping_fn: the env's agent ids in agent-axis order, a
            new episode's space dicts, agent -> module ids and mapping function.
        horizon: the successors' lookback env steps (at most the chunk's).
    """

    def __init__(
        self,
        ids: Any,
        agent_ids: tuple[Any, ...],
        spaces: tuple[dict, dict],
        mapping: dict[Any, Any],
        mapping_fn: Any,
        horizon: int,
    ):
        self._ids, self._agent_ids, self._spaces = ids, agent_ids, spaces
        self._mapping, self._mapping_fn = mapping, mapping_fn
        self._horizon = max(int(horizon), 0)
        self._agent_index = {aid: a for a, aid in enumerate(agent_ids)}

    def __call__(self, keys: dict[int, Any], ctx: Any, plain: np.ndarray) -> dict[int, Any]:
        """``{segment: successor}`` for the open chunks ``keys`` (segment -> the chunk's
        key: ``e``, ``count``, ``continues``, ``succ``, ``hanging``) of the call ``ctx``
        (its steps, columns, end-of-call carry, next-acting agents) that this path takes;
        ``plain``: ``bool[E]``, which envs' successors came from this path."""
        cs, data = ctx.cs, ctx.data
        S, A = len(cs.seg), len(self._agent_ids)
        h = self._horizon
        cand = np.zeros(S, bool)
        n, last = np.zeros(S, np.int64), np.zeros(S, np.int64)
        for i, key in keys.items():
            succ = key.succ
            if not key.hanging or (key.continues and (succ is None or not plain[key.e])):
                continue
            length = int(cs.seg.len[i])
            lb, t = (succ._len_lookback_buffers, succ.env_t) if succ is not None else (0, 0)
            wide = lb + length + (succ.env_t - succ.env_t_started if succ is not None else 0)
            cand[i], n[i], last[i] = True, min(h, wide), t + length
        if not cand.any():
            return {}
        env = cs.seg.env
        cand &= ~ctx.carry.pend[env].any(axis=1)
        ok, has = eligible_chunks(cs.steps, data, cs.pos, cand, n, last, A)
        ok &= ~(ctx.next_acting[env] & ~has).any(axis=1)  # (an agent joining: not here)
        run_agent = cs.steps.agent[data.run_start].tolist()
        run_bounds = np.searchsorted(cs.pos[data.run_start], np.arange(S + 1)).tolist()
        chunks, at = [], []
        for i in np.flatnonzero(ok).tolist():
            key = keys[i]
            runs = list(range(run_bounds[i], run_bounds[i + 1]))
            if key.succ is not None:  # its agents' episodes first, in their order
                g_of = {run_agent[g]: g for g in runs}
                prev = [g_of.get(self._agent_index[aid], -1) for aid in key.succ.agent_episodes]
                if -1 in prev:
                    continue  # an agent of the chunk without a step in it
                runs = prev + [g for g in runs if g not in prev]
            ma_id = "" if key.succ is not None else self._ids(key.e, key.count)
            chunks.append(OpenChunk(runs, int(n[i]), int(last[i]), key.succ, ma_id))
            at.append(i)
        succs = column_successors(
            chunks, cs.steps, data, self._agent_ids, self._spaces, self._mapping, self._mapping_fn
        )
        return dict(zip(at, succs))


def eligible_chunks(
    steps: AgentSteps,
    data: EpisodeColumns,
    pos: np.ndarray,
    candidate: np.ndarray,
    n: np.ndarray,
    last: np.ndarray,
    num_agents: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Which ``candidate`` segments have every running agent observed at each of their last
    ``n + 1`` env steps with all those steps in this call: the agent's run ends at the
    segment's last env step ``last`` and its last ``n`` steps each span one env step
    (``int[S]`` both, per segment). Segments without rows are left out.

    Returns ``(ok: bool[S], has: bool[S, A])``, ``has``: which agents have a run in each
    segment."""
    S = len(candidate)
    r0, r1 = data.run_start, data.run_stop
    has = np.zeros((S, num_agents), bool)
    if len(r0) == 0:
        return np.zeros(S, bool), has
    p = pos[r0]
    has[p, steps.agent[r0]] = True
    end = r1 - 1
    running = ~(steps.terminated[end] | steps.truncated[end])
    unit = (steps.end_step - steps.start_step) == 1
    last_bad = np.maximum.accumulate(np.where(unit, -1, np.arange(len(unit))))
    trailing = end - np.maximum(last_bad[end], r0 - 1)  # unit steps that end each run
    run_ok = ~running | ((steps.end_step[end] == last[p]) & (trailing >= n[p]))
    bad = np.bincount(p[~run_ok], minlength=S)
    runs = np.bincount(p, minlength=S)
    return candidate & (bad == 0) & (runs > 0), has


def column_successors(
    chunks: list[OpenChunk],
    steps: AgentSteps,
    data: EpisodeColumns,
    agent_ids: tuple[Any, ...],
    spaces: tuple[dict, dict],
    mapping: dict[Any, Any],
    mapping_fn: Any,
) -> list[MultiAgentEpisode]:
    """Each chunk's ``cut(n)`` successor as ``_cut_columns(n, numpy=True)`` makes it from
    the built chunk (chunks from :func:`eligible_chunks`): its running agents' lookback
    columns are copies of the call's rows, gathered for all chunks at once.

    Args:
        chunks: the open chunks.
        steps, data: the call's agent steps and columns.
        agent_ids: the env's agent ids, in agent-axis order.
        spaces: the episodes' observation and action space dicts (a new episode's).
        mapping, mapping_fn: agent -> module ids, and the mapping function (a new
            episode's)."""
    end = data.run_stop - 1
    running = ~(steps.terminated[end] | steps.truncated[end])
    act = [(c, g) for c in chunks for g in c.runs if running[g]]
    g_all = np.array([g for _, g in act], np.int64)
    n_all = np.array([c.n for c, _ in act], np.int64)
    stop = data.run_stop[g_all] if len(g_all) else np.zeros(0, np.int64)
    # track rows stop+g-n .. stop+g (observations, infos), rows stop-n .. stop-1 (the rest)
    o_idx, o_off = _ranges(stop + g_all - n_all, n_all + 1)
    a_idx, a_off = _ranges(stop - n_all, n_all)
    obs = obs_map(lambda x: np.take(x, o_idx, axis=0), data.obs_track)
    infos = tree_map(lambda x: np.take(x, o_idx, axis=0), data.info_track)
    actions = np.take(data.actions, a_idx, axis=0)
    rewards = np.take(data.rewards, a_idx, axis=0)
    extras = {k: np.take(col, a_idx, axis=0) for k, col in data.extras.items()}
    trusted = InfiniteLookbackBuffer.trusted
    obs_space, act_space = spaces[0][agent_ids[0]], spaces[1][agent_ids[0]]
    r_space = reward_space()
    t_next = (steps.t[end] + 1).tolist()
    agent_of = steps.agent[data.run_start].tolist()
    # Every running agent's episode is a view of the gathered rows (key j: the j-th
    # running agent over all chunks), its columns built on first access; the maps too.
    views = LookbackViews(
        obs, infos, actions, rewards, extras, o_off, a_off, n_all, np.zeros_like(n_all),
        obs_space, act_space, borrowed=True,
    )  # fmt: skip
    t_all = [t_next[g] for _, g in act]
    sas = view_episodes(
        SingleAgentEpisode,
        views,
        zip([""] * len(act), [False] * len(act), [False] * len(act), t_all, t_all),
        obs_space,
        act_space,
    )
    now = time.perf_counter
    out = []
    j = 0  # running agent, over all chunks
    for c in chunks:
        n, prev = c.n, c.prev
        if prev is None:
            ma_id = c.ma_id
            ids = {agent_ids[a]: agent_episode_id(ma_id, a) for a in (agent_of[g] for g in c.runs)}
            succ = MultiAgentEpisode(
                ma_id,
                observation_space=spaces[0],
                action_space=spaces[1],
                env_t_started=c.env_t,
                agent_episode_ids=ids,
                agent_module_ids=mapping,
                agent_to_module_mapping_fn=mapping_fn,
            )
        else:
            ma_id = prev.id_
            known = prev._agent_episode_ids  # (its agents' episodes' ids among them)
            ids = {}
            for g in c.runs:
                a = agent_of[g]
                ids[agent_ids[a]] = known.get(agent_ids[a]) or agent_episode_id(ma_id, a)
            succ = MultiAgentEpisode(
                ma_id,
                observation_space=prev.observation_space,
                action_space=prev.action_space,
                env_t_started=c.env_t,
                agent_episode_ids=ids,
                agent_module_ids=prev._agent_to_module_mapping,
                agent_to_module_mapping_fn=prev.agent_to_module_mapping_fn,
            )
        succ._len_lookback_buffers = n
        by_agent, started = succ.agent_episodes, succ.agent_t_started
        mapped: list[tuple[Any, int]] = []
        for g in c.runs:
            if not running[g]:
                continue
            aid = agent_ids[agent_of[g]]
            sa, t = sas[j], t_all[j]
            j += 1
            if n:
                sa.id_, sa.agent_id, sa.module_id = ids[aid], aid, succ.module_for(aid)
                sa.multi_agent_episode_id = ma_id
            else:  # (no lookback: list-mode columns, as cut(0) makes them)
                sa = SingleAgentEpisode.trusted(
                    ids[aid],
                    observations=trusted(views.observations(j - 1), 0, obs_space),
                    infos=trusted(
                        tree_map(lambda x, k=j - 1: x[o_off[k] : o_off[k] + 1], infos)
                        if infos
                        else [{}],
                        0,
                    ),
                    actions=trusted([], 0, act_space),
                    rewards=trusted([], 0, r_space),
                    extra_model_outputs={},
                    observation_space=obs_space,
                    action_space=act_space,
                    terminated=False,
                    truncated=False,
                    t_started=t,
                    agent_id=aid,
                    module_id=succ.module_for(aid),
                    multi_agent_episode_id=ma_id,
                    t=t,
                )
            by_agent[aid] = sa
            started[aid] = t
            mapped.append((aid, t))
        # env_t_to_agent_t: agent steps t - n .. t at the last n + 1 env steps, on first access
        succ.__dict__["_lazy_maps"] = partial(_successor_maps, mapped, n)
        if prev is not None:
            succ.custom_data = copy.deepcopy(prev.custom_data)
        succ._start_time = succ._last_step_time = now()
        out.append(succ)
    return out


def _successor_maps(mapped: list[tuple[Any, int]], n: int, maps: dict[Any, Any]) -> None:
    """Fills a column successor's ``env_t_to_agent_t``: each agent ``(aid, t)`` was
    observed at each of the last ``n + 1`` env steps (agent steps ``t - n .. t``)."""
    trusted = InfiniteLookbackBuffer.trusted
    for aid, t in mapped:
        maps[aid] = trusted(list(range(t - n, t + 1)), n, borrowed=False)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """The call's continued chunks laid out for views: segment -> (its first key in
    ``views``, its runs in its successor's agent order)."""

    views: LookbackViews | None
    chunks: dict[int, tuple[int, list[int]]]


class ContinuedChunks:
    """View episodes for the chunks of a call that continue a successor from
    :func:`column_successors` (see the module docstring): the same episodes, maps and
    fields as extending the successor step by step, built without copying per agent.

    The converter puts the candidates into :attr:`keys` (segment -> the chunk's key:
    ``i``, ``rows``, ``succ`` a successor from :func:`column_successors` that nothing has
    changed, and nothing hanging in the chunk); the first :meth:`build` lays out all those
    that qualify.

    Args:
        steps, data: the call's agent steps (output order) and columns.
        agent_ids: the env's agent ids, in agent-axis order.
        observation_space, action_space: of one agent.
    """

    def __init__(
        self,
        steps: AgentSteps,
        data: EpisodeColumns,
        agent_ids: tuple[Any, ...],
        observation_space: Any,
        action_space: Any,
    ):
        self._steps, self._data, self._agent_ids = steps, data, agent_ids
        self._spaces = (observation_space, action_space)
        self.keys: dict[int, Any] = {}
        self._plan: _Plan | None = None

    def build(self, ep: MultiAgentEpisode, key: Any) -> bool:
        """Fills the lazy chunk ``ep`` of ``key`` with view episodes (maps on first
        access); ``False`` (``ep`` untouched) where ``key`` is not a qualifying chunk."""
        if key.i not in self.keys:
            return False
        plan = self._plan if self._plan is not None else self._make_plan()
        found = plan.chunks.get(key.i)
        if found is None or plan.views is None:
            return False
        k0, runs = found
        succ, steps, data = key.succ, self._steps, self._data
        r1 = data.run_stop[runs]
        m = r1 - data.run_start[runs]
        olds = list(succ.agent_episodes.values())
        fields = zip(
            [sa.id_ for sa in olds],
            steps.terminated[r1 - 1].tolist(),
            steps.truncated[r1 - 1].tolist(),
            [sa.t_started for sa in olds],
            (np.array([sa.t for sa in olds]) + m).tolist(),
        )
        sas = view_episodes(
            SingleAgentEpisode, plan.views, fields, *self._spaces, range(k0, k0 + len(runs))
        )
        ma_id = ep.id_
        by_agent = ep.agent_episodes
        for aid, sa, old in zip(succ.agent_episodes, sas, olds):
            sa.agent_id, sa.module_id, sa.multi_agent_episode_id = aid, old.module_id, ma_id
            by_agent[aid] = sa
        ep.agent_t_started.update(succ.agent_t_started)
        ep._agent_episode_ids.update(succ._agent_episode_ids)
        ep._len_lookback_buffers = succ._len_lookback_buffers
        ep.custom_data = succ.custom_data
        ep._start_time, ep._last_step_time = succ._start_time, succ._last_step_time
        ep.__dict__["_lazy_maps"] = partial(
            ContinuedChunks._fill_maps, self, succ, runs, ep.env_t - succ.env_t
        )
        return True

    def _fill_maps(
        self, succ: MultiAgentEpisode, runs: list[int], width: int, maps: dict[Any, Any]
    ) -> None:
        """``env_t_to_agent_t`` of a continued chunk: its successor's maps, then env steps
        ``succ.env_t + 1 ..`` (a step's start env step maps to its agent timestep, its end
        env step to the next one)."""
        steps, data = self._steps, self._data
        r0 = data.run_start[runs]
        m = data.run_stop[runs] - r0
        idx, _ = _ranges(r0, m)
        local = np.repeat(np.arange(len(runs)), m)
        first = succ.env_t + 1
        entries = np.full((len(runs), width), -1, np.int64)
        t, start = steps.t[idx], steps.start_step[idx]
        inside = start >= first  # (the first step starts at the successor's last env step)
        entries[local[inside], start[inside] - first] = t[inside]
        entries[local, steps.end_step[idx] - first] = t + 1
        rows = entries.astype(object)
        rows[entries < 0] = SKIP
        trusted = InfiniteLookbackBuffer.trusted
        old = succ.env_t_to_agent_t
        for aid, row in zip(succ.agent_episodes, rows.tolist()):
            prev = old[aid]
            maps[aid] = trusted(prev.data + row, prev.lookback, borrowed=False)

    def _make_plan(self) -> _Plan:
        """Lays out every qualifying chunk's runs, each with its successor's lookback in
        front: one scatter per column over all of them."""
        steps, data = self._steps, self._data
        run_agent = steps.agent[data.run_start].tolist()
        aids = self._agent_ids
        extra_keys = list(data.extras)
        chunks: list[tuple[int, list[int]]] = []
        g_l: list[int] = []
        n_l: list[int] = []
        t_l: list[int] = []
        env_t_l: list[int] = []
        olds: list[Any] = []
        for i, key in self.keys.items():
            lo, hi = key.rows
            succ = key.succ
            if hi == lo or succ is None:
                continue
            g0, g1 = int(data.group[lo]), int(data.group[hi - 1]) + 1
            sas = succ.agent_episodes
            if g1 - g0 != len(sas):
                continue  # an agent of the successor without a run here, or a new one
            g_of = {aids[run_agent[g]]: g for g in range(g0, g1)}
            runs = [g_of.get(aid, -1) for aid in sas]
            n = succ._len_lookback_buffers
            if -1 in runs:
                continue
            if any(_lookback_of(sa) != (n, extra_keys if n else []) for sa in sas.values()):
                continue  # (without lookback the step-by-step path adds them empty)
            chunks.append((i, runs))
            g_l += runs
            n_l += [n] * len(runs)
            t_l += [sa.t for sa in sas.values()]
            env_t_l += [succ.env_t] * len(runs)
            olds += sas.values()
        g = np.array(g_l, np.int64)
        n_run = np.array(n_l, np.int64)
        r0 = data.run_start[g]
        ok_run = (steps.start_step[r0] == np.array(env_t_l, np.int64)) & (
            steps.t[r0] == np.array(t_l, np.int64)
        )
        sizes = [len(runs) for _, runs in chunks]
        bad = np.repeat(np.arange(len(chunks)), sizes)[~ok_run]
        keep = np.ones(len(chunks), bool)
        keep[bad] = False
        run_keep = np.repeat(keep, sizes)
        chunks = [c for c, k in zip(chunks, keep.tolist()) if k]
        if not chunks:
            self._plan = _Plan(None, {})
            return self._plan
        olds = [sa for sa, k in zip(olds, run_keep.tolist()) if k]
        g, n_run, r0 = g[run_keep], n_run[run_keep], r0[run_keep]
        m = data.run_stop[g] - r0
        views = self._lay_out(olds, g, n_run, r0, m)
        out: dict[int, tuple[int, list[int]]] = {}
        k = 0
        for i, runs in chunks:
            out[i] = (k, runs)
            k += len(runs)
        self._plan = _Plan(views, out)
        return self._plan

    def _lay_out(
        self, olds: list[Any], g: np.ndarray, n: np.ndarray, r0: np.ndarray, m: np.ndarray
    ) -> LookbackViews | None:
        """The runs ``g`` (rows ``r0 .. r0 + m``) each with the ``n`` lookback items of its
        successor's agent episode ``olds`` in front, as :class:`LookbackViews` (``None``:
        the successors' columns do not match the call's dtypes)."""
        data = self._data
        o_size, a_size = n + m + 1, n + m
        o_lo, a_lo = np.cumsum(o_size) - o_size, np.cumsum(a_size) - a_size
        dst_tr_o, _ = _ranges(o_lo + n, m + 1)
        src_tr_o, _ = _ranges(r0 + g, m + 1)
        dst_tr_a, _ = _ranges(a_lo + n, m)
        src_tr_a, _ = _ranges(r0, m)
        o_total, a_total = int(o_size.sum()), int(a_size.sum())
        # Lookback rows: a successor whose episodes are untouched views (column_successors
        # made them) reads its rows straight from their shared columns; others their data.
        pv, keys, src = _view_sources(olds)
        q = ~pv
        kq = [sa for sa, k in zip(olds, q.tolist()) if k]
        nq = n[q]
        lb_q_off = np.cumsum(nq + 1) - (nq + 1)  # in the others' observations, concatenated
        v_obs: Any = obs_map(lambda x: None, data.obs_track)
        v_inf: dict[str, Any] = {}
        v_act: np.ndarray | None = None
        v_rew: np.ndarray | None = None
        v_ext: dict[str, Any] = {}
        if src is not None:
            vo, va = src.starts(keys)
            v_obs, v_inf, v_act, v_rew, v_ext = src.arrays()
            obs_v = (_ranges(vo, n[pv])[0], _ranges(o_lo[pv], n[pv])[0])
            act_v = (_ranges(va, n[pv])[0], _ranges(a_lo[pv], n[pv])[0])
        obs_q = (_ranges(lb_q_off, nq)[0], _ranges(o_lo[q], nq)[0])
        act_q = (None, _ranges(a_lo[q], nq)[0])

        def place(track: Any, total: int, dst_tr: Any, src_tr: Any, lbs: list) -> Any:
            out = np.empty((total,) + track.shape[1:], track.dtype)
            out[dst_tr] = track[src_tr]
            for lb, (src_lb, dst_lb) in lbs:
                if lb is None:
                    continue
                if lb.dtype != track.dtype:
                    raise _Mismatch
                out[dst_lb] = lb if src_lb is None else lb[src_lb]
            return out

        def cat(*xs: Any) -> Any:
            return np.concatenate(xs) if xs else None

        def track_col(track: Any, v_col: Any, q_col: Any) -> Any:
            lbs = [(q_col, obs_q)] + ([(v_col, obs_v)] if src is not None else [])
            return place(track, o_total, dst_tr_o, src_tr_o, lbs)

        def items(col: np.ndarray, v_col: Any, lbs_q: list[Any]) -> np.ndarray:
            lbs = [(cat(*lbs_q), act_q)] + ([(v_col, act_v)] if src is not None else [])
            return place(col, a_total, dst_tr_a, src_tr_a, lbs)

        with_lb = [sa for sa, k in zip(kq, nq.tolist()) if k]
        try:
            obs = obs_map(
                lambda t, v, lb: track_col(t, v, lb),
                data.obs_track,
                v_obs,
                obs_map(cat, *(sa.observations.data for sa in kq))
                if kq
                else obs_map(lambda x: None, data.obs_track),
            )
            infos: dict[str, Any] = {}
            if data.info_track:
                blank = tree_map(lambda x: None, data.info_track)
                infos = tree_map(
                    lambda t, v, lb: track_col(t, v, lb),
                    data.info_track,
                    v_inf if src is not None else blank,
                    tree_map(cat, *(sa.infos.data for sa in kq)) if kq else blank,
                )
            actions = items(data.actions, v_act, [sa.actions.data for sa in with_lb])
            rewards = items(data.rewards, v_rew, [sa.rewards.data for sa in with_lb])
            extras = {
                k: items(col, v_ext.get(k), [sa.extra_model_outputs[k].data for sa in with_lb])
                for k, col in data.extras.items()
            }
        except _Mismatch:
            return None
        obs_space, act_space = self._spaces
        return LookbackViews(
            obs, infos, actions, rewards, extras, o_lo, a_lo, n, m, obs_space, act_space
        )


def _lookback_of(sa: Any) -> tuple[int, list[str]]:
    """A successor's agent episode's lookback and extra model output names, read from its
    views without building its columns where it is an untouched view episode."""
    view = sa._view
    if isinstance(view, LookbackViews) and (k := view.pristine(sa)) is not None:
        n = view.lookback(k)
        return n, view.output_names() if n else []
    return sa.observations.lookback, list(sa.extra_model_outputs)


def _view_sources(olds: list[Any]) -> tuple[np.ndarray, np.ndarray, LookbackViews | None]:
    """Which of ``olds`` are untouched view episodes of one :class:`LookbackViews` (the
    first such one's), their keys there, and those views (``None``: none are)."""
    src: LookbackViews | None = None
    pv = np.zeros(len(olds), bool)
    keys: list[int] = []
    for i, sa in enumerate(olds):
        view = sa._view
        if not isinstance(view, LookbackViews):
            continue
        if src is None:
            src = view
        if view is src and (k := view.pristine(sa)) is not None:
            pv[i] = True
            keys.append(k)
    return pv, np.array(keys, np.int64), src if pv.any() else None


class _Mismatch(Exception):
    """A successor's column does not have the call's dtype."""


def _ranges(start: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The concatenated ranges ``start[i] .. start[i] + count[i] - 1`` and each range's
    offset in them."""
    off = np.cumsum(count) - count
    idx = np.repeat(start - off, count) + np.arange(int(count.sum()))
    return idx, off
