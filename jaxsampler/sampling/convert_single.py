"""Single-agent conversion of a device sampler's rollout chunks into episodes or a batch.

:class:`SingleAgentConverter` turns the host copies of one call's chunks into numpy'ized
:class:`SingleAgentEpisode` chunks (``sample()``) or one ``SampleBatch`` (``sample_batch()``):
env-major columns once per call (:func:`~jaxsampler.sampling.columns.build_columns`),
segments with ``np.nonzero``, then numpy views (episodes) or one flat gather per column
(the batch). The only Python loop is over episodes, never over timesteps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxsampler.constants import DEFAULT_POLICY_ID
from jaxsampler.episodes.batch import MultiAgentBatch, SampleBatch
from jaxsampler.episodes.ids import EpisodeIds
from jaxsampler.episodes.lookback import InfiniteLookbackBuffer
from jaxsampler.episodes.single_agent import SingleAgentEpisode, _reward_space
from jaxsampler.sampling.base import SamplerMetrics
from jaxsampler.sampling.columns import (
    Columns,
    InfoPath,
    Segments,
    build_columns,
    find_segments,
    info_for_obs,
    no_gc,
    unflatten,
)
from jaxsampler.types import Trajectory

__all__ = ["SingleAgentConverter"]


class SingleAgentConverter:
    """Buffers -> :class:`SingleAgentEpisode` chunks or a ``SampleBatch``, one env agent.

    Carries across calls the lookback head of every env and the returns of the running
    episodes; :meth:`reset` drops both.

    Args:
        ids: the sampler's episode ids.
        num_envs: ``E``.
        observation_space, action_space: of the env's (one) agent.
        horizon: lookback steps carried into continuation chunks.
    """

    def __init__(
        self,
        ids: EpisodeIds,
        num_envs: int,
        observation_space: Any,
        action_space: Any,
        horizon: int,
    ):
        self._ids = ids
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

    def _segments(
        self, chunks: list[Trajectory], num_episodes: int | None
    ) -> tuple[Columns, Segments, SamplerMetrics]:
        H = self._horizon
        fresh = self._head is None
        cols = build_columns(chunks, self._head, self._reset_info, H, multi_agent=False)
        self._head = cols.tail(H)
        seg, m, self._partial_return = find_segments(
            cols.is_reset,
            cols.terminated,
            cols.truncated,
            cols.rewards,
            horizon=H,
            step0=np.asarray(chunks[0].episode_step_0),
            count0=np.asarray(chunks[0].episode_count_0),
            fresh=fresh,
            partial_return=self._partial_return,
            num_episodes=num_episodes,
        )
        return cols, seg, m

    def episodes(
        self, chunks: list[Trajectory], num_episodes: int | None, state: Any = None
    ) -> tuple[list[SingleAgentEpisode], SamplerMetrics]:
        """The call's episodes (finished ones, then ongoing chunks) and its metrics."""
        cols, seg, m = self._segments(chunks, num_episodes)
        H = self._horizon
        obs_space, act_space, reward_space = self._obs_space, self._act_space, _reward_space()
        trusted, episode, ids = (
            InfiniteLookbackBuffer.trusted,
            SingleAgentEpisode.trusted,
            self._ids,
        )
        extras = sorted(cols.extras.items())
        infos = list(cols.infos.items())
        fields = zip(
            *(
                x.tolist()
                for x in (seg.env, seg.start, seg.len, seg.lookback, seg.t_started, seg.count)
            ),
            seg.term.tolist(),
            seg.trunc.tolist(),
        )
        out = []
        with no_gc():  # thousands of small objects: skip cyclic-GC passes while building
            for e, start, length, lb, t_started, count, term, trunc in fields:
                a, b = H + start - lb, H + start + length  # step range incl. lookback
                if infos:
                    # The info of observation j + 1 was recorded at step j (the first
                    # observation's is zeros when the buffers do not hold it).
                    slots = np.arange(a, b + 1)
                    info = trusted(
                        unflatten({k: info_for_obs(col, e, slots) for k, col in infos}), lb
                    )
                else:
                    info = trusted([{}] * (length + lb + 1), lb)
                out.append(
                    episode(
                        ids(e, count),
                        observations=trusted(cols.obs[e, a : b + 1], lb, obs_space),
                        infos=info,
                        actions=trusted(cols.actions[e, a:b], lb, act_space),
                        rewards=trusted(cols.rewards[e, a:b], lb, reward_space),
                        extra_model_outputs={k: trusted(c[e, a:b], lb) for k, c in extras},
                        observation_space=obs_space,
                        action_space=act_space,
                        terminated=term,
                        truncated=trunc,
                        t_started=t_started,
                        t=t_started + length,
                    )
                )
        return out, m

    def batch(
        self, chunks: list[Trajectory], num_episodes: int | None, state: Any = None
    ) -> tuple[MultiAgentBatch, SamplerMetrics]:
        """One ``SampleBatch`` row per sampled (non-reset) step, episodes in
        :meth:`episodes`' order: one flat gather per column, no loop over steps."""
        cols, seg, m = self._segments(chunks, num_episodes)
        H = self._horizon
        lens = seg.len
        n_rows = int(lens.sum())
        seg_of_row = np.repeat(np.arange(len(lens)), lens)
        offset = np.arange(n_rows) - np.repeat(np.cumsum(lens) - lens, lens)
        e = seg.env[seg_of_row]
        j = H + seg.start[seg_of_row] + offset
        S = cols.is_reset.shape[1]
        flat = e * S + j  # rows of the env-major step columns, flattened
        flat_obs = flat + e  # obs have one slot more per env

        def rows(col: np.ndarray, index: np.ndarray) -> np.ndarray:
            return np.take(col.reshape((-1,) + col.shape[2:]), index, axis=0)

        ids = np.array(
            [self._ids(a, c) for a, c in zip(seg.env.tolist(), seg.count.tolist())] or [""]
        )
        data: dict[str, Any] = {
            SampleBatch.OBS: rows(cols.obs, flat_obs),
            SampleBatch.NEXT_OBS: rows(cols.obs, flat_obs + 1),
            SampleBatch.ACTIONS: rows(cols.actions, flat),
            SampleBatch.REWARDS: rows(cols.rewards, flat),
            SampleBatch.TERMINATEDS: rows(cols.terminated, flat),
            SampleBatch.TRUNCATEDS: rows(cols.truncated, flat),
            SampleBatch.T: (seg.t_started[seg_of_row] + offset).astype(np.int64),
            SampleBatch.EPS_ID: ids[seg_of_row] if n_rows else np.array([], ids.dtype),
            SampleBatch.AGENT_INDEX: np.zeros(n_rows, np.int64),
        }
        if cols.infos:
            # The info of the observation at step j was recorded with step j - 1.
            data[SampleBatch.INFOS] = unflatten(
                {k: info_for_obs(col, e, j) for k, col in cols.infos.items()}
            )
        else:
            data[SampleBatch.INFOS] = [{}] * n_rows
        for name, col in cols.extras.items():
            data[name] = rows(col, flat)
        return MultiAgentBatch({DEFAULT_POLICY_ID: SampleBatch(data)}, n_rows), m
