"""Single-agent conversion of a device sampler's rollout chunks into episodes or a batch.

:class:`SingleAgentConverter` turns the host copies of one call's chunks into numpy'ized
:class:`SingleAgentEpisode` chunks (``sample()``) or one ``SampleBatch`` (``sample_batch()``):
env-major columns once per call (:func:`~jaxsampler.sampling.device.columns.build_columns`),
segments with ``np.nonzero``, then numpy views (episodes) or one flat gather per column
(the batch; the common one-chunk call skips the env-major copy and gathers straight from
the time-major buffers, :mod:`~jaxsampler.sampling.device.single_rows`). The only Python
loop is over episodes, never over timesteps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from jaxsampler.constants import DEFAULT_POLICY_ID
from jaxsampler.episodes._sa_views import EpisodeViews
from jaxsampler.episodes.batch import Deferred, MultiAgentBatch, SampleBatch
from jaxsampler.episodes.ids import EpisodeIds
from jaxsampler.episodes.lookback import InfiniteLookbackBuffer
from jaxsampler.episodes.single_agent import SingleAgentEpisode, reward_space
from jaxsampler.sampling.device import single_rows
from jaxsampler.sampling.device.columns import (
    Columns,
    InfoPath,
    NextRows,
    Segments,
    build_columns,
    check_chunks,
    empty_infos,
    find_segments,
    info_for_obs,
    no_gc,
    obs_at,
    obs_map,
    unflatten,
)
from jaxsampler.sampling.metrics import SamplerMetrics
from jaxsampler.types import Trajectory

__all__ = ["EpisodeColumns", "EpisodeFactory", "SingleAgentConverter"]


@dataclasses.dataclass(frozen=True)
class EpisodeColumns:
    """One call's single-agent episodes as the call's env-major columns plus, per episode,
    where it sits in them: what an :data:`EpisodeFactory` builds episodes from.

    Episode ``i`` (in ``sample()``'s order: finished episodes, then ongoing chunks) is
    env ``env[i]``'s slots ``first[i]:stop[i]`` of ``actions`` / ``rewards`` / each
    extra, and ``first[i]:stop[i] + 1`` of ``obs``; the leading ``lookback[i]`` slots are
    lookback. Per-episode fields are Python lists (one ``tolist()`` per call).

    Attributes:
        obs: ``[E, S + 1, ...]`` observations (a struct of such arrays for nested spaces).
        actions, rewards: ``[E, S, ...]``.
        extras: the policy's extras by name, ``[E, S, ...]`` each.
        ids, env, first, stop, lookback, t_started, t, terminated, truncated: per episode.
        observation_space, action_space: the agent's (jaxsampler) spaces.
    """

    obs: Any
    actions: Any
    rewards: np.ndarray
    extras: dict[str, Any]
    ids: list[str]
    env: list[int]
    first: list[int]
    stop: list[int]
    lookback: list[int]
    t_started: list[int]
    t: list[int]
    terminated: list[bool]
    truncated: list[bool]
    observation_space: Any
    action_space: Any
    info_columns: tuple[tuple[InfoPath, np.ndarray], ...] = ()

    def infos(self, i: int) -> list[dict[str, Any]] | dict[str, Any]:
        """Episode ``i``'s infos over its observation slots (lookback included): one
        empty dict per slot for an env without infos, else the env's info pytree with
        numpy leaves ``[slots, ...]`` (numpy'ized), as the sampler's episodes hold them."""
        e, a, b = self.env[i], self.first[i], self.stop[i]
        if not self.info_columns:
            return [{} for _ in range(b - a + 1)]
        # The info of observation j + 1 was recorded at step j (the first observation's
        # is zeros when the buffers do not hold it).
        slots = np.arange(a, b + 1)
        return unflatten({k: info_for_obs(col, e, slots) for k, col in self.info_columns})


EpisodeFactory = Callable[[EpisodeColumns], list[Any]]
"""Builds one call's episodes (a list, in :class:`EpisodeColumns`' order) from its
columns; the default makes lazy :class:`SingleAgentEpisode` objects."""


class SingleAgentConverter:
    """Buffers -> :class:`SingleAgentEpisode` chunks or a ``SampleBatch``, one env agent.

    Carries across calls the lookback head of every env and the returns of the running
    episodes; :meth:`reset` drops both.

    Args:
        ids: the sampler's episode ids.
        num_envs: ``E``.
        observation_space, action_space: of the env's (one) agent.
        horizon: lookback steps carried into continuation chunks.
        policy_id: the batch key of :meth:`batch`.
        episode_factory: builds :meth:`episodes`' list from the call's
            :class:`EpisodeColumns`; ``None``: lazy :class:`SingleAgentEpisode` objects.
    """

    def __init__(
        self,
        ids: EpisodeIds,
        num_envs: int,
        observation_space: Any,
        action_space: Any,
        horizon: int,
        policy_id: Any = DEFAULT_POLICY_ID,
        episode_factory: EpisodeFactory | None = None,
    ):
        self._factory = episode_factory
        self._ids = ids
        self._policy_id = policy_id  # the batch key (a one-agent MultiAgentPolicy's id)
        self._obs_space, self._act_space = observation_space, action_space
        self._horizon = horizon
        self._head: Columns | None = None  # the last H steps of the previous call
        self._reset_info: dict[InfoPath, np.ndarray] = {}
        self._partial_return = np.zeros(num_envs, np.float64)

    def reset(self, reset_info: dict[InfoPath, np.ndarray]) -> None:
        """Forgets the running episodes; ``reset_info`` holds the reset observations' info."""
        self._head = None
        self._reset_info = reset_info
        self._partial_return = np.zeros_like(self._partial_return)

    def get_state(self) -> dict[str, Any]:
        """What the converter carries into the next call (numpy data), for checkpoints."""
        return {
            "head": self._head,
            "reset_info": self._reset_info,
            "partial_return": self._partial_return,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Installs :meth:`get_state`'s output."""
        self._head = state["head"]
        self._reset_info = state["reset_info"]
        self._partial_return = state["partial_return"]

    def _segments(
        self,
        chunks: list[Trajectory],
        num_episodes: int | None,
        cutoff: int | None,
        time_major_obs: bool = False,
    ) -> tuple[Columns, Segments, SamplerMetrics]:
        """The call's columns (``time_major_obs``: ``obs`` left as the buffers hold it,
        :func:`build_columns`), its segments and metrics; keeps the next call's head."""
        H = self._horizon
        fresh = self._head is None
        cols = build_columns(
            chunks,
            self._head,
            self._reset_info,
            H,
            multi_agent=False,
            time_major_obs=time_major_obs,
        )
        head = cols.tail(H)
        if cols.time_major_obs:  # the head is env-major, whichever call comes next
            head = dataclasses.replace(
                head,
                obs=obs_map(lambda o: np.ascontiguousarray(o.swapaxes(0, 1)), head.obs),
                time_major_obs=False,
            )
        self._head = head
        seg, m, self._partial_return = find_segments(
            cols.is_reset,
            cols.terminated,
            cols.truncated,
            cols.env_rewards,
            horizon=H,
            step0=np.asarray(chunks[0].episode_step_0),
            count0=np.asarray(chunks[0].episode_count_0),
            fresh=fresh,
            partial_return=self._partial_return,
            num_episodes=num_episodes,
            cutoff=cutoff,
        ).summarized()
        return cols, seg, m

    def episodes(
        self,
        chunks: list[Trajectory],
        num_episodes: int | None,
        state: Any = None,
        cutoff: int | None = None,
    ) -> tuple[list[SingleAgentEpisode], SamplerMetrics]:
        """The call's episodes (finished ones, then ongoing chunks) and its metrics
        (``cutoff``: see :func:`~jaxsampler.sampling.device.columns.find_segments`).

        Each episode is a light view of the call's columns
        (:meth:`SingleAgentEpisode.from_views`): per episode, only its object is made here;
        a column's buffer is built on its first access, and the default getters slice the
        columns without building any. Writing to an episode copies its data first.
        """
        cols, seg, m = self._segments(chunks, num_episodes, cutoff)
        if self._factory is not None:
            H = self._horizon
            start = H + seg.start
            columns = EpisodeColumns(
                obs=cols.obs,
                actions=cols.actions,
                rewards=cols.rewards,
                extras=cols.extras,
                ids=self._ids.many(seg.env, seg.count).tolist(),
                env=seg.env.tolist(),
                first=(start - seg.lookback).tolist(),
                stop=(start + seg.len).tolist(),
                lookback=seg.lookback.tolist(),
                t_started=seg.t_started.tolist(),
                t=(seg.t_started + seg.len).tolist(),
                terminated=seg.term.tolist(),
                truncated=seg.trunc.tolist(),
                observation_space=self._obs_space,
                action_space=self._act_space,
                info_columns=tuple(cols.infos.items()),
            )
            return self._factory(columns), m
        views = _EpisodeViews(cols, seg, self._horizon, self._obs_space, self._act_space)
        with no_gc():  # thousands of small objects: skip cyclic-GC passes while building
            out = SingleAgentEpisode.from_views(
                views,
                self._ids.many(seg.env, seg.count).tolist(),
                seg.term.tolist(),
                seg.trunc.tolist(),
                seg.t_started.tolist(),
                (seg.t_started + seg.len).tolist(),
                self._obs_space,
                self._act_space,
            )
        return out, m

    def batch(
        self,
        chunks: list[Trajectory],
        num_episodes: int | None,
        state: Any = None,
        cutoff: int | None = None,
    ) -> tuple[MultiAgentBatch, SamplerMetrics]:
        """One ``SampleBatch`` row per sampled (non-reset) step, episodes in
        :meth:`episodes`' order: one flat gather per column, no loop over steps (the
        common one-chunk call straight from the time-major buffers, see
        :mod:`~jaxsampler.sampling.device.single_rows`). The ``eps_id`` column is built
        on its first read."""
        check_chunks(chunks)
        if single_rows.applies(chunks, num_episodes, self._horizon):
            chunk = chunks[0]
            seg, m, carried = single_rows.segments(chunk, self._partial_return)
            self._head = single_rows.tail_head(chunk, self._horizon)
            self._partial_return = carried
            fast = SampleBatch(single_rows.batch_columns(chunk, seg, self._ids))
            return MultiAgentBatch({self._policy_id: fast}, int(seg.len.sum())), m
        # (obs time-major when the call has the head's observations: no transpose, the
        # rows gathered straight from the buffers)
        T_total = sum(int(np.shape(c.rewards)[0]) for c in chunks)
        cols, seg, m = self._segments(
            chunks, num_episodes, cutoff, time_major_obs=T_total >= self._horizon
        )
        H = self._horizon
        lens = seg.len
        n_rows = int(lens.sum())
        E, S = cols.is_reset.shape
        # Row p of segment i is step seg.start[i] + p: every per-row index is a per-segment
        # value plus p times a step (single_rows.expand_runs, no gather per index).
        first = np.cumsum(lens) - lens
        if cols.time_major_obs:  # obs [T_total + 1, E, ...]: step j of env e is row j * E + e
            obs_first, next_obs = seg.start * E + seg.env, E  # (next_obs: the next one's offset)
        else:  # env-major [E, S + 1, ...]: one slot more per env than the step columns
            obs_first, next_obs = seg.env * (S + 1) + H + seg.start, 1
        # rows of the env-major step columns and of the observations, flattened; t
        flat, flat_obs, t = single_rows.expand_runs(
            lens, [(seg.env * S + H + seg.start, 1), (obs_first, next_obs), (seg.t_started, 1)]
        )

        def rows(col: np.ndarray, index: np.ndarray) -> np.ndarray:
            return np.take(col.reshape((-1,) + col.shape[2:]), index, axis=0)

        # (a nested observation: a struct of such columns, one gather per leaf)
        obs = obs_map(lambda o: rows(o, flat_obs), cols.obs)
        # A row's new_obs is the next row's obs except at a segment's last row: new_obs is
        # built from the batch's obs on its first read, only those end rows gathered now.
        last = (first + lens - 1)[lens > 0]
        ends = obs_map(lambda o: rows(o, flat_obs[last] + next_obs), cols.obs)
        data: dict[str, Any] = {
            SampleBatch.OBS: obs,
            # (obs read-only until then: an in-place write would show in new_obs)
            SampleBatch.NEXT_OBS: Deferred(NextRows(obs, last, ends).guard()),
            SampleBatch.ACTIONS: rows(cols.actions, flat),
            SampleBatch.REWARDS: rows(cols.rewards, flat),
            SampleBatch.TERMINATEDS: rows(cols.terminated, flat),
            SampleBatch.TRUNCATEDS: rows(cols.truncated, flat),
            SampleBatch.T: t,
            # Object arrays of shared strs, as episodes_to_batch gives: 8 bytes per row (a
            # fresh <U32 column is 128 bytes per row, and its page faults cost milliseconds).
            SampleBatch.EPS_ID: single_rows.deferred_ids(self._ids, seg),
            SampleBatch.AGENT_INDEX: np.zeros(n_rows, np.int64),
        }
        if cols.infos:
            # The info of the observation at step j was recorded with step j - 1.
            e = np.repeat(seg.env, lens)
            j = flat - e * S
            data[SampleBatch.INFOS] = unflatten(
                {k: info_for_obs(col, e, j) for k, col in cols.infos.items()}
            )
        else:
            # one dict per row, built on first read (most readers never touch infos)
            data[SampleBatch.INFOS] = Deferred(partial(empty_infos, n_rows))
        for name, col in cols.extras.items():
            data[name] = rows(col, flat)
        return MultiAgentBatch({self._policy_id: SampleBatch(data)}, n_rows), m


def _flat(col: np.ndarray) -> np.ndarray:
    """An env-major column ``[E, S, ...]`` as ``[E * S, ...]`` (a view of the contiguous
    columns :func:`build_columns` makes): one episode's slots are one basic slice."""
    return col.reshape((-1,) + col.shape[2:])


class _EpisodeViews(EpisodeViews):
    """The call's episodes over its env-major columns: episode ``i`` is env ``env[i]``'s
    slots ``a[i]:b[i]`` of the step columns and ``a[i]:b[i] + 1`` of ``obs``, the leading
    ``lb[i]`` of them lookback. The default getters are one slice of a flattened column
    (flat offsets of the items after the lookback precomputed for all episodes)."""

    __slots__ = (
        "_cols",
        "_env",
        "_a",
        "_b",
        "_lb",
        "_o0",
        "_o1",
        "_s0",
        "_s1",
        "_obs",
        "_actions",
        "_rewards",
        "_extras",
        "_obs_space",
        "_act_space",
        "_infos",
    )

    def __init__(self, cols: Columns, seg: Segments, H: int, obs_space: Any, act_space: Any):
        self._cols = cols
        S = cols.rewards.shape[1]  # step slots per env (obs: one more)
        first = H + seg.start  # the first step's slot
        stop = first + seg.len  # one past the last step's slot
        # (numpy, not lists: only a column's build reads these, and numpy arrays are not
        # containers the cyclic GC traverses)
        self._a = first - seg.lookback  # first slot, lookback included
        self._b = stop
        self._env, self._lb = seg.env, seg.lookback
        self._s0, self._s1 = (seg.env * S + first).tolist(), (seg.env * S + stop).tolist()
        o = seg.env * (S + 1)
        self._o0, self._o1 = (o + first).tolist(), (o + stop + 1).tolist()
        self._obs = _flat(cols.obs) if type(cols.obs) is np.ndarray else None
        self._actions, self._rewards = _flat(cols.actions), _flat(cols.rewards)
        self._extras = {k: _flat(c) for k, c in cols.extras.items()}
        self._obs_space, self._act_space = obs_space, act_space
        self._infos = list(cols.infos.items())

    def observations(self, i: int) -> Any:
        """Episode ``i``'s observations after its lookback (views)."""
        if self._obs is not None:
            return self._obs[self._o0[i] : self._o1[i]]
        e, a, b = int(self._env[i]), int(self._a[i] + self._lb[i]), int(self._b[i])
        return obs_at(self._cols.obs, (e, slice(a, b + 1)))

    def actions(self, i: int) -> Any:
        """Episode ``i``'s actions after its lookback (a view)."""
        return self._actions[self._s0[i] : self._s1[i]]

    def rewards(self, i: int) -> Any:
        """Episode ``i``'s rewards after its lookback (a view)."""
        return self._rewards[self._s0[i] : self._s1[i]]

    def extra(self, i: int, name: str) -> Any:
        """Episode ``i``'s extra model output ``name`` after its lookback (a view), or
        ``None`` where the policy has no such output."""
        col = self._extras.get(name)
        return None if col is None else col[self._s0[i] : self._s1[i]]

    def column(self, i: int, name: str) -> Any:
        """Episode ``i``'s column ``name``: a borrowed buffer over views of the call's
        columns (extra model outputs: a new dict of them)."""
        trusted, lb = InfiniteLookbackBuffer.trusted, int(self._lb[i])
        s0, s1 = self._s0[i] - lb, self._s1[i]
        if name == "actions":
            return trusted(self._actions[s0:s1], lb, self._act_space)
        if name == "rewards":
            return trusted(self._rewards[s0:s1], lb, reward_space())
        if name == "extra_model_outputs":
            return {k: trusted(c[s0:s1], lb) for k, c in self._extras.items()}
        e, a, b = int(self._env[i]), int(self._a[i]), int(self._b[i])
        if name == "observations":
            return trusted(obs_at(self._cols.obs, (e, slice(a, b + 1))), lb, self._obs_space)
        if name != "infos":
            raise ValueError(f"an episode has no column {name!r}")
        if not self._infos:
            return trusted([{} for _ in range(b - a + 1)], lb)  # one dict per observation
        # The info of observation j + 1 was recorded at step j (the first observation's
        # is zeros when the buffers do not hold it).
        slots = np.arange(a, b + 1)
        return trusted(unflatten({k: info_for_obs(c, e, slots) for k, c in self._infos}), lb)
