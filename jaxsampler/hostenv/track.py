"""Single-agent episodes of a host-stepped env as plain lists (the HostSampler's fast path).

A host env with one agent delivers, per poll of a running sub-env, the agent's next
observation, its reward and flags: one complete step. :class:`Track` appends such steps
to Python lists (a few list appends per step instead of the general
:class:`~jaxsampler.host.multi_agent_episode.MultiAgentEpisode` bookkeeping of hanging
actions and per-agent maps) and builds, only when a chunk closes, the same numpy'ized
:class:`~jaxsampler.host.episode.SingleAgentEpisode` and the same batch rows that the
collector path builds (``tests/test_hostenv_track.py`` checks the two paths agree).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxsampler.host.batch import SampleBatch
from jaxsampler.host.episode import SingleAgentEpisode
from jaxsampler.host.lookback import batch as stack, tree_map

__all__ = ["Track", "track_rows"]


class Track:
    """One chunk of a single-agent episode: ``obs`` / ``infos`` have one item more than
    ``actions`` / ``rewards`` / each ``extras`` column; the first ``lookback`` steps (and
    observations) are lookback from the previous chunk, not part of this one."""

    __slots__ = ("id_", "obs", "infos", "actions", "rewards", "extras", "lookback", "t_started", "terminated",
                 "truncated", "hanging_reward", "polls")

    def __init__(self, id_: str, obs: list, infos: list, *, actions: list | None = None,
                 rewards: list | None = None, extras: dict[str, list] | None = None, lookback: int = 0,
                 t_started: int = 0):
        self.id_ = id_
        self.obs, self.infos = obs, infos
        self.actions = [] if actions is None else actions
        self.rewards = [] if rewards is None else rewards
        self.extras: dict[str, list] = {} if extras is None else extras
        self.lookback, self.t_started = lookback, t_started
        self.terminated = self.truncated = False
        self.hanging_reward = 0.0  # rewards of polls without an observation, for the next step
        self.polls = 0  # env steps of this chunk (polls of its sub-env, reward-only ones too)

    def __len__(self) -> int:
        return len(self.rewards) - self.lookback

    @property
    def env_t(self) -> int:
        """Steps since the episode's start (this chunk's last timestep)."""
        return self.t_started + len(self)

    def step(self, action: Any, extras: dict, reward: float, obs: Any, info: dict) -> None:
        """Appends one step (the action taken on the last observation, its reward and the
        next observation)."""
        reward += self.hanging_reward
        self.hanging_reward = 0.0
        self.actions.append(action)
        self.rewards.append(reward)
        cols = self.extras
        for k, v in extras.items():  # a policy's extras keys are fixed (one jitted function)
            col = cols.get(k)
            if col is None:
                col = cols[k] = []
            col.append(v)
        self.obs.append(obs)
        self.infos.append(info)

    def cut(self, horizon: int) -> Track:
        """The successor chunk (same id): the last ``horizon`` steps (clipped) as lookback,
        ``SingleAgentEpisode.cut`` semantics."""
        lb = min(horizon, len(self.rewards))
        tail = slice(len(self.rewards) - lb, None)
        succ = Track(self.id_, self.obs[-lb - 1:], self.infos[-lb - 1:], actions=self.actions[tail],
                     rewards=self.rewards[tail], extras={k: v[tail] for k, v in self.extras.items()},
                     lookback=lb, t_started=self.env_t)
        succ.hanging_reward = self.hanging_reward
        return succ

    def episode(self, observation_space: Any, action_space: Any) -> SingleAgentEpisode:
        """This chunk as a numpy'ized :class:`SingleAgentEpisode` (infos stay dicts)."""
        ep = SingleAgentEpisode(
            self.id_, observations=self.obs, observation_space=observation_space, infos=self.infos,
            actions=self.actions, action_space=action_space, rewards=self.rewards,
            terminated=self.terminated, truncated=self.truncated, extra_model_outputs=self.extras,
            t_started=self.t_started, len_lookback_buffer=self.lookback,
        )
        return ep.to_numpy()


def track_rows(track: Track, agent_index: int = 0) -> dict[str, Any]:
    """The batch rows of a chunk: one per step, the columns of
    :func:`jaxsampler.hostenv.collector.episodes_to_batch`."""
    n, lb = len(track), track.lookback
    obs = stack(track.obs[lb:])
    flags = np.zeros(n, bool)
    rows: dict[str, Any] = {
        SampleBatch.OBS: tree_map(lambda x: x[:n], obs),
        SampleBatch.NEXT_OBS: tree_map(lambda x: x[1:], obs),
        SampleBatch.ACTIONS: stack(track.actions[lb:]),
        SampleBatch.REWARDS: np.asarray(track.rewards[lb:], np.float32).reshape(n),
        SampleBatch.TERMINATEDS: flags.copy(),
        SampleBatch.TRUNCATEDS: flags.copy(),
        SampleBatch.T: np.arange(track.t_started, track.env_t, dtype=np.int64),
        SampleBatch.EPS_ID: np.asarray([track.id_] * n),
        SampleBatch.AGENT_INDEX: np.full(n, agent_index, np.int64),
        SampleBatch.INFOS: list(track.infos[lb:lb + n]),
    }
    rows[SampleBatch.TERMINATEDS][-1] = track.terminated
    rows[SampleBatch.TRUNCATEDS][-1] = track.truncated
    for k, col in track.extras.items():
        rows[k] = stack(col[lb:])
    return rows
