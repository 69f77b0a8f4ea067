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
without building the chunk. :class:`ColumnSuccessors` picks the open chunks of a call
that this path takes and builds their successors.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import Any

import numpy as np

from jaxsampler.episodes._sa_views import reward_space
from jaxsampler.episodes.ids import agent_episode_id
from jaxsampler.episodes.lookback import InfiniteLookbackBuffer, tree_map
from jaxsampler.episodes.multi_agent import MultiAgentEpisode
from jaxsampler.episodes.single_agent import SingleAgentEpisode
from jaxsampler.sampling.device.agent_steps import AgentSteps
from jaxsampler.sampling.device.agent_views import EpisodeColumns
from jaxsampler.sampling.device.columns import obs_map

__all__ = ["ColumnSuccessors", "OpenChunk", "column_successors", "eligible_chunks"]


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
    flat = type(obs) is np.ndarray
    trusted = InfiniteLookbackBuffer.trusted
    obs_space, act_space = spaces[0][agent_ids[0]], spaces[1][agent_ids[0]]
    r_space = reward_space()
    t_next = (steps.t[end] + 1).tolist()
    agent_of = steps.agent[data.run_start].tolist()
    o_off_l, a_off_l = o_off.tolist(), a_off.tolist()
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
        by_agent, started, maps = succ.agent_episodes, succ.agent_t_started, succ.env_t_to_agent_t
        for g in c.runs:
            if not running[g]:
                continue
            a = agent_of[g]
            aid = agent_ids[a]
            o0, a0 = o_off_l[j], a_off_l[j]
            j += 1
            o1 = o0 + n + 1
            ob = obs[o0:o1] if flat else obs_map(lambda x, o0=o0, o1=o1: x[o0:o1], obs)
            info: Any = (
                tree_map(lambda x, o0=o0, o1=o1: x[o0:o1], infos)
                if infos
                else [{} for _ in range(n + 1)]
            )
            t = t_next[g]
            if n:
                a1 = a0 + n
                acts = trusted(actions[a0:a1], n, act_space)
                rews = trusted(rewards[a0:a1], n, r_space)
                ext = {k: trusted(col[a0:a1], n) for k, col in extras.items()}
            else:
                acts, rews, ext = trusted([], 0, act_space), trusted([], 0, r_space), {}
            by_agent[aid] = SingleAgentEpisode.trusted(
                ids[aid],
                observations=trusted(ob, n, obs_space),
                infos=trusted(info, n),
                actions=acts,
                rewards=rews,
                extra_model_outputs=ext,
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
            started[aid] = t
            maps[aid] = trusted(list(range(t - n, t + 1)), n, borrowed=False)
        if prev is not None:
            succ.custom_data = copy.deepcopy(prev.custom_data)
        succ._start_time = succ._last_step_time = now()
        out.append(succ)
    return out


def _ranges(start: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The concatenated ranges ``start[i] .. start[i] + count[i] - 1`` and each range's
    offset in them."""
    off = np.cumsum(count) - count
    idx = np.repeat(start - off, count) + np.arange(int(count.sum()))
    return idx, off
