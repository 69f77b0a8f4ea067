"""The multi-agent half of :class:`jaxsampler.Sampler` (a mixin), and host helpers it shares.

``sample()`` of a multi-agent env returns :class:`MultiAgentEpisode` chunks and
``sample_batch()`` a ``MultiAgentBatch`` keyed by policy id; both come from one
vectorized pass over the call's buffers (:func:`jaxsampler.sampling.agent_steps.agent_steps`)
that finds every completed agent step. Open chunks continue across calls with RLlib's
``cut(episode_lookback_horizon)``; a step still waiting for the agent's next observation
is carried to the next call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from typing import Any

import numpy as np

from jaxsampler.episodes.batch import MultiAgentBatch, SampleBatch
from jaxsampler.episodes.ids import agent_episode_id
from jaxsampler.episodes.lookback import InfiniteLookbackBuffer, batch, tree_map
from jaxsampler.episodes.multi_agent import SKIP, MultiAgentEpisode
from jaxsampler.episodes.single_agent import SingleAgentEpisode, _reward_space
from jaxsampler.sampling.agent_steps import AgentCarry, AgentSteps, agent_steps, take, take_info
from jaxsampler.types import Trajectory

__all__ = ["MultiAgentSampling"]


@contextlib.contextmanager
def _no_gc():
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _unflatten(flat: dict[str, np.ndarray]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path, v in flat.items():
        node = tree
        *parents, last = path.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = v
    return tree


class MultiAgentSampling:
    """Multi-agent conversion methods of :class:`~jaxsampler.Sampler` (see the module docstring)."""

    def _agent_steps(
        self, chunks: list[Trajectory], num_episodes: int | None, by_policy: bool = False
    ):
        """Segments plus the completed agent steps of the call, rows in output order
        (``by_policy``: grouped by policy first, so each policy's rows are one slice)."""
        cols, seg, m = self._segments(chunks, num_episodes)
        H, E = self._col_horizon, self.num_envs
        call = {
            k: (v if k.startswith("info:") else v[:, :, H:] if k == "obs" else v[:, H:])
            for k, v in cols.items()
        }
        old = self._carry or AgentCarry.empty(call, E, self.env.num_agents)
        steps, self._carry = agent_steps(
            call, old, np.asarray(chunks[0].episode_step_0), self._next_acting
        )
        # Each step belongs to the segment of its first call step (the carried ones: step 0).
        L = call["is_reset"].shape[1]
        seg_of_step = np.full((E, L), -1, np.int64)
        lens = seg["len"]
        offset = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
        seg_of_step[np.repeat(seg["env"], lens), np.repeat(seg["start"], lens) + offset] = (
            np.repeat(np.arange(len(lens)), lens)
        )
        pos = seg_of_step[steps.env, np.maximum(steps.slot - 1, 0)]
        # One int64 sort key: (policy rank,) segment, agent, t.
        A = len(self.agent_ids)
        key = (pos + 1) * A + steps.agent
        if by_policy:  # policies in order of first appearance on the agent axis
            pids = list(dict.fromkeys(self.agent_policy))
            rank = np.array([pids.index(pid) for pid in self.agent_policy])[steps.agent]
            key = rank * ((len(seg["env"]) + 1) * A) + key
        t_span = int(steps.t.max()) + 1 if len(steps.t) else 1
        order = np.argsort(key * t_span + steps.t, kind="stable")
        order = order[pos[order] >= 0]
        steps = AgentSteps(
            **{f.name: getattr(steps, f.name)[order] for f in dataclasses.fields(AgentSteps)}
        )
        return call, cols, seg, m, steps, pos[order], old

    def _step_columns(
        self,
        call: dict[str, Any],
        cols: dict[str, Any],
        steps: AgentSteps,
        old: AgentCarry,
        eps_ids: np.ndarray,
        next_infos: bool = False,
    ) -> dict[str, Any]:
        e, s, a, c = steps.env, steps.slot, steps.agent, steps.end
        A, H = self.env.num_agents, self._col_horizon
        # Observations are the bulk of the data: the columns keep them agent-major, so the
        # rows (agent by agent, in time) gather nearly sequentially; and a row's new_obs is
        # the next row's obs except where an agent's run of rows ends.
        obs = take(cols["obs"], old.obs, e, s, a, H, agent_major=True)
        new_obs = np.empty_like(obs)
        same = np.zeros(len(e), bool)
        if len(e) > 1:
            same[:-1] = (e[1:] == e[:-1]) & (a[1:] == a[:-1]) & (s[1:] == c[:-1])
            new_obs[:-1] = obs[1:]  # one sequential copy; the other rows are gathered below
        rest = np.flatnonzero(~same)
        new_obs[rest] = take(cols["obs"], old.obs, e[rest], c[rest], a[rest], H, agent_major=True)
        data: dict[str, Any] = {
            SampleBatch.OBS: obs,
            SampleBatch.NEXT_OBS: new_obs,
            SampleBatch.ACTIONS: take(cols["actions"], old.action, e, s, a, H),
            SampleBatch.REWARDS: steps.reward.astype(np.float32),
            SampleBatch.TERMINATEDS: steps.terminated,
            SampleBatch.TRUNCATEDS: steps.truncated,
            SampleBatch.T: steps.t.astype(np.int64),
            SampleBatch.EPS_ID: eps_ids,
            SampleBatch.AGENT_INDEX: a.astype(np.int64),
        }
        info_keys = [k for k in call if k.startswith("info:")]
        data[SampleBatch.INFOS] = (
            _unflatten({k[5:]: take_info(call[k], old.info[k], e, s, a, A) for k in info_keys})
            if info_keys
            else [{}] * len(e)
        )
        if next_infos and info_keys:
            data["_next_infos"] = _unflatten(
                {k[5:]: take_info(call[k], old.info[k], e, c, a, A) for k in info_keys}
            )
        for k in call:
            if k.startswith("extra:"):
                data[k[6:]] = take(cols[k], old.extras[k[6:]], e, s, a, H)
        return data

    def _to_ma_batch(self, chunks: list[Trajectory], num_episodes: int | None):
        """``MultiAgentBatch``: one row per completed agent step, keyed by policy id; rows
        episode by episode (``sample()``'s order), then agent by agent, then by ``t``."""
        call, cols, seg, m, steps, pos, old = self._agent_steps(
            chunks, num_episodes, by_policy=True
        )
        self._open = {}  # open sample() chunks are stale now: the next sample() starts new chunks
        # eps_id: one string per (episode, agent) run of rows, then broadcast to the rows.
        n = len(pos)
        uid = pos * len(self.agent_ids) + steps.agent
        new_run = np.empty(n, bool)
        new_run[:1] = True
        np.not_equal(uid[1:], uid[:-1], out=new_run[1:])
        starts = np.flatnonzero(new_run)
        # Episode ids once per segment, then one string concatenation per (segment, agent).
        ma_ids = [
            self._episode_id(e, c) for e, c in zip(seg["env"].tolist(), seg["count"].tolist())
        ]
        suffix = [agent_episode_id("", a) for a in range(len(self.agent_ids))]
        ids = [
            ma_ids[p] + suffix[a]
            for p, a in zip(pos[starts].tolist(), steps.agent[starts].tolist())
        ]
        # An object array of shared strings: 8 bytes per row (a unicode array would be 144).
        sa_ids = np.array(ids or [""], dtype=object)[np.cumsum(new_run) - 1]
        data = self._step_columns(call, cols, steps, old, sa_ids)
        # Rows are grouped by policy: each policy's batch is one slice (numpy views).
        pids = list(dict.fromkeys(self.agent_policy))
        rank = np.array([pids.index(pid) for pid in self.agent_policy])[steps.agent]
        bounds = np.searchsorted(rank, np.arange(len(pids) + 1))
        batches = {
            pid: SampleBatch(_slice_rows(data, int(bounds[i]), int(bounds[i + 1])))
            for i, pid in enumerate(pids)
        }
        m.num_agent_steps_sampled = n
        return MultiAgentBatch(batches, m.num_env_steps_sampled), m

    def _to_ma_episodes(self, chunks: list[Trajectory], num_episodes: int | None):
        call, cols, seg, m, steps, pos, old = self._agent_steps(chunks, num_episodes)
        n_seg = len(seg["env"])
        data = self._step_columns(
            call, cols, steps, old, np.zeros(len(pos), np.int8), next_infos=True
        )
        bounds = np.searchsorted(pos, np.arange(n_seg + 1))
        step0 = np.asarray(chunks[0].episode_step_0)
        episodes, still_open = [], {}
        with _no_gc():
            for i in range(n_seg):
                e, start, length = int(seg["env"][i]), int(seg["start"][i]), int(seg["len"][i])
                continues = start == 0 and step0[e] > 0
                ep, first = self._open_episode(
                    e, int(seg["count"][i]), continues, int(step0[e]), old
                )
                rows = np.arange(bounds[i], bounds[i + 1])
                done = bool(seg["term"][i] or seg["trunc"][i])
                hanging = not done and start + length == call["is_reset"].shape[1]
                self._extend_episode(ep, first, e, length, rows, steps, data, hanging, call)
                if done:
                    ep.is_terminated, ep.is_truncated = True, bool(seg["trunc"][i])
                else:
                    still_open[e] = ep
                episodes.append(ep)
        self._open = still_open
        m.num_agent_steps_sampled = len(pos)
        return episodes, m

    def _open_episode(
        self, e: int, count: int, continues: bool, step0: int, old: AgentCarry
    ) -> tuple[MultiAgentEpisode, int]:
        """The chunk that the call's steps of env ``e`` extend: the successor (``cut``) of
        the open chunk, or a new episode (also when the previous call was ``sample_batch``);
        and the env step of its first map entry still to be written."""
        if continues and e in self._open:
            ep = self._open[e].cut(self.horizon)
            for sa in ep.agent_episodes.values():  # env infos stay numpy'ized, as in new chunks
                if not sa.infos.finalized and sa.infos.data and sa.infos.data[0]:
                    sa.infos.data, sa.infos.finalized = batch(sa.infos.data), True
            return ep, ep.env_t + 1  # its maps end at env step ep.env_t
        ma_id = self._episode_id(e, count)
        mapping = dict(zip(self.agent_ids, self.agent_policy))
        ep = MultiAgentEpisode(
            ma_id,
            observation_space={a: self._obs_space for a in self.agent_ids},
            action_space={a: self._act_space for a in self.agent_ids},
            agent_episode_ids={a: agent_episode_id(ma_id, i) for i, a in enumerate(self.agent_ids)},
            agent_module_ids=mapping,
            agent_to_module_mapping_fn=lambda aid, episode: mapping[aid],
        )
        first = 0
        if continues:  # no chunk to cut: start at the earliest hanging step's observation
            hanging = old.start[e][old.pend[e]]
            first = int(min([step0, *hanging.tolist()]))
            ep.env_t_started = ep.env_t = step0
            ep._len_lookback_buffers = step0 - first
            for a in np.nonzero(old.pend[e])[0].tolist():
                self._ensure_agent(
                    ep,
                    a,
                    old.obs[e, a],
                    {k[5:]: v[e, a] for k, v in old.info.items()},
                    int(old.n_act[e, a]) - 1,
                )
                aid = self.agent_ids[a]
                ep._hanging_actions_end[aid] = old.action[e, a]
                ep._hanging_rewards_end[aid] = float(old.reward[e, a])
                ep._hanging_extra_model_outputs_end[aid] = {
                    k: v[e, a] for k, v in old.extras.items()
                }
        return ep, first

    def _ensure_agent(
        self, ep: MultiAgentEpisode, a: int, obs: Any, info: dict, t_started: int
    ) -> SingleAgentEpisode:
        aid = self.agent_ids[a]
        sa = ep.agent_episodes.get(aid)
        if sa is not None:
            return sa
        sa = SingleAgentEpisode.__new__(SingleAgentEpisode)
        sa.id_ = ep._agent_episode_ids.setdefault(aid, agent_episode_id(ep.id_, a))
        sa.agent_id, sa.module_id, sa.multi_agent_episode_id = aid, ep.module_for(aid), ep.id_
        sa._observation_space, sa._action_space = self._obs_space, self._act_space
        sa.observations = InfiniteLookbackBuffer.trusted(np.asarray(obs)[None], 0, self._obs_space)
        sa.infos = InfiniteLookbackBuffer.trusted(
            _unflatten({k: np.asarray(v)[None] for k, v in info.items()}) if info else [{}], 0
        )
        sa.actions = InfiniteLookbackBuffer.trusted(
            np.zeros((0,) + self._act_zero.shape, self._act_zero.dtype), 0, self._act_space
        )
        sa.rewards = InfiniteLookbackBuffer.trusted(np.zeros((0,), np.float32), 0, _reward_space())
        sa.extra_model_outputs = {}
        sa.is_terminated = sa.is_truncated = False
        sa.t_started = sa.t = t_started
        sa.custom_data = {}
        sa._start_time = sa._last_step_time = None
        ep.agent_episodes[aid] = sa
        ep.agent_t_started[aid] = t_started
        return sa

    def _extend_episode(
        self,
        ep: MultiAgentEpisode,
        first: int,
        e: int,
        length: int,
        rows: np.ndarray,
        steps: AgentSteps,
        data: dict[str, Any],
        hanging: bool,
        call: dict[str, Any],
    ) -> None:
        """Appends ``length`` env steps of env ``e`` (agent steps ``rows``) to ``ep``; its map
        entries are written from env step ``first`` on."""
        last = ep.env_t + length
        width = last - first + 1
        info_keys = (
            [k for k in data[SampleBatch.INFOS]]
            if isinstance(data[SampleBatch.INFOS], dict)
            else []
        )
        extra_keys = [k for k in data if k not in _STEP_KEYS]
        agent_of_row = steps.agent[rows]
        carry = self._carry
        for a, aid in enumerate(self.agent_ids):
            r = rows[agent_of_row == a]
            pend = hanging and bool(carry.pend[e, a])
            m = ep.env_t_to_agent_t.get(aid)
            entries = np.full(width, -1, np.int64)
            if len(r):
                sa = self._ensure_agent(
                    ep,
                    a,
                    data[SampleBatch.OBS][r[0]],
                    _row_info(data, info_keys, r[0]),
                    int(steps.t[r[0]]),
                )
                inside = steps.start_step[r] >= first  # earlier starts are already mapped
                entries[steps.start_step[r][inside] - first] = steps.t[r][inside]
                entries[steps.end_step[r] - first] = steps.t[r] + 1
                _extend(sa.observations, data[SampleBatch.NEXT_OBS][r])
                _extend(sa.actions, data[SampleBatch.ACTIONS][r])
                _extend(sa.rewards, data[SampleBatch.REWARDS][r])
                for k in extra_keys:
                    if k not in sa.extra_model_outputs:
                        sa.extra_model_outputs[k] = InfiniteLookbackBuffer.trusted(
                            data[k][r][:0], sa.actions.lookback
                        )
                    _extend(sa.extra_model_outputs[k], data[k][r])
                if info_keys and sa.infos.finalized:
                    _extend(sa.infos, _take_rows(data["_next_infos"], r))
                elif info_keys:  # a list-mode column (a cut successor): one dict per row
                    rows_info = _take_rows(data["_next_infos"], r)
                    sa.infos.data.extend(
                        tree_map(lambda x, i=i: x[i], rows_info) for i in range(len(r))
                    )
                else:
                    sa.infos.data.extend([{}] * len(r))
                sa.t += len(r)
                sa.is_terminated, sa.is_truncated = (
                    bool(steps.terminated[r[-1]]),
                    bool(steps.truncated[r[-1]]),
                )
                for cache in (
                    ep._hanging_actions_end,
                    ep._hanging_rewards_end,
                    ep._hanging_extra_model_outputs_end,
                ):
                    cache.pop(aid, None)
            if pend:
                start = int(carry.start[e, a])
                t = int(carry.n_act[e, a]) - 1
                self._ensure_agent(
                    ep, a, carry.obs[e, a], {k[5:]: v[e, a] for k, v in carry.info.items()}, t
                )
                if first <= start <= last:
                    entries[start - first] = t
                ep._hanging_actions_end[aid] = carry.action[e, a]
                ep._hanging_rewards_end[aid] = float(carry.reward[e, a])
                ep._hanging_extra_model_outputs_end[aid] = {
                    k: v[e, a] for k, v in carry.extras.items()
                }
            if hanging and aid not in ep.agent_episodes and self._next_acting[e, a]:
                # Joins with the call's last observation (it acts on it in the next call).
                L = call["is_reset"].shape[1]
                info = {
                    k[5:]: take_info(
                        call[k],
                        carry.info[k],
                        np.array([e]),
                        np.array([L + 1]),
                        np.array([a]),
                        len(self.agent_ids),
                    )[0]
                    for k in call
                    if k.startswith("info:")
                }
                self._ensure_agent(ep, a, call["obs"][e, a, L], info, int(carry.n_act[e, a]))
                entries[last - first] = int(carry.n_act[e, a])
            if m is None and aid not in ep.agent_episodes:
                continue
            values = [SKIP if v < 0 else v for v in entries.tolist()]
            if m is None:
                pad = first - (ep.env_t_started - ep._len_lookback_buffers)
                ep.env_t_to_agent_t[aid] = InfiniteLookbackBuffer(
                    [SKIP] * pad + values, ep._len_lookback_buffers
                )
            else:
                m.data.extend(values)
        ep.env_t = last


_STEP_KEYS = frozenset(
    {
        SampleBatch.OBS,
        SampleBatch.NEXT_OBS,
        SampleBatch.ACTIONS,
        SampleBatch.REWARDS,
        SampleBatch.TERMINATEDS,
        SampleBatch.TRUNCATEDS,
        SampleBatch.T,
        SampleBatch.EPS_ID,
        SampleBatch.AGENT_INDEX,
        SampleBatch.INFOS,
        "_next_infos",
    }
)


def _slice_rows(data: dict[str, Any], lo: int, hi: int) -> dict[str, Any]:
    return {
        k: (_slice_rows(v, lo, hi) if isinstance(v, dict) else v[lo:hi])
        for k, v in data.items()
        if k != "_next_infos"
    }


def _take_rows(data: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    out = {}
    for k, v in data.items():
        if isinstance(v, dict):
            out[k] = _take_rows(v, rows)
        elif isinstance(v, list):
            out[k] = [v[i] for i in rows.tolist()]
        else:
            out[k] = v[rows]
    return out


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, np.ndarray]:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flatten(v, prefix + k + "/"))
        else:
            out[prefix + k] = v
    return out


def _row_info(data: dict[str, Any], info_keys: list, row: int) -> dict[str, Any]:
    """Flattened info leaves of the start observation of step ``row``."""
    if not info_keys:
        return {}
    return {k: v[row] for k, v in _flatten(data[SampleBatch.INFOS]).items()}


def _extend(buf: InfiniteLookbackBuffer, items: Any) -> None:
    """Appends arrays to a numpy'ized buffer (an empty list-mode buffer becomes numpy'ized)."""
    if not buf.finalized and buf.len_incl_lookback() == 0:
        buf.data, buf.finalized = items, True
        return
    buf.extend(items)
