"""Single-agent episodes of a host-stepped env as plain lists (the host sampler's track feed).

A host env with one agent delivers, per poll of a running sub-env, the agent's next
observation, its reward and flags: one complete step. :class:`Track` appends such steps
to Python lists (a few list appends per step instead of the general
:class:`~jaxsampler.episodes.multi_agent.MultiAgentEpisode` bookkeeping of hanging
actions and per-agent maps) and builds, only when a chunk closes, the same numpy'ized
:class:`~jaxsampler.episodes.single_agent.SingleAgentEpisode` and the same batch rows
that the collector feed builds (:mod:`jaxsampler.sampling.feeds`; the tests check that
the two feeds agree).
"""

from __future__ import annotations

from typing import Any

from jaxsampler.episodes.lookback import batch as stack
from jaxsampler.episodes.single_agent import SingleAgentEpisode
from jaxsampler.sampling.collector import step_rows

__all__ = ["Track", "track_rows"]


class Track:
    """One chunk of a single-agent episode: ``obs`` / ``infos`` have one item more than
    ``actions`` / ``rewards`` / each ``extras`` column; the first ``lookback`` steps (and
    observations) are lookback from the previous chunk, not part of this one."""

    __slots__ = (
        "id_",
        "obs",
        "infos",
        "actions",
        "rewards",
        "extras",
        "lookback",
        "t_started",
        "terminated",
        "truncated",
        "hanging_reward",
        "polls",
    )

    def __init__(
        self,
        id_: str,
        obs: list,
        infos: list,
        *,
        actions: list | None = None,
        rewards: list | None = None,
        extras: dict[str, list] | None = None,
        lookback: int = 0,
        t_started: int = 0,
    ):
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
        succ = Track(
            self.id_,
            self.obs[-lb - 1 :],
            self.infos[-lb - 1 :],
            actions=self.actions[tail],
            rewards=self.rewards[tail],
            extras={k: v[tail] for k, v in self.extras.items()},
            lookback=lb,
            t_started=self.env_t,
        )
        succ.hanging_reward = self.hanging_reward
        return succ

    def episode(self, observation_space: Any, action_space: Any) -> SingleAgentEpisode:
        """This chunk as a numpy'ized :class:`SingleAgentEpisode` (infos stay dicts)."""
        ep = SingleAgentEpisode(
            self.id_,
            observations=self.obs,
            observation_space=observation_space,
            infos=self.infos,
            actions=self.actions,
            action_space=action_space,
            rewards=self.rewards,
            terminated=self.terminated,
            truncated=self.truncated,
            extra_model_outputs=self.extras,
            t_started=self.t_started,
            len_lookback_buffer=self.lookback,
        )
        return ep.to_numpy()


def track_rows(track: Track, agent_index: int = 0) -> dict[str, Any]:
    """The batch rows of a chunk (``len >= 1``): one per step, the columns of
    :func:`jaxsampler.sampling.collector.episodes_to_batch`."""
    lb = track.lookback
    return step_rows(
        stack(track.obs[lb:]),
        stack(track.actions[lb:]),
        track.rewards[lb:],
        track.terminated,
        track.truncated,
        track.t_started,
        track.id_,
        agent_index,
        list(track.infos[lb:-1]),
        {k: stack(col[lb:]) for k, col in track.extras.items()},
    )
