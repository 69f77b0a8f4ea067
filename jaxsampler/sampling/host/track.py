"""Single-agent episodes of a host-stepped env as plain lists (the host sampler's track feed):
a host env with one agent delivers one complete step per poll, so a few list appends per
step replace the general :class:`~jaxsampler.episodes.multi_agent.MultiAgentEpisode`
bookkeeping of hanging actions and per-agent maps. A chunk becomes the numpy'ized
:class:`~jaxsampler.episodes.single_agent.SingleAgentEpisode` and the batch rows the
collector would build for the same steps (the tests compare them) only when it closes.
"""

from __future__ import annotations

from typing import Any

from jaxsampler.constants import ALL_AGENTS
from jaxsampler.episodes.batch import MultiAgentBatch, SampleBatch
from jaxsampler.episodes.lookback import batch as stack
from jaxsampler.episodes.single_agent import SingleAgentEpisode
from jaxsampler.host_envs.base import PollResult
from jaxsampler.sampling.host.collector import concat_rows, is_abandoned, step_rows
from jaxsampler.sampling.host.feeds import (
    Books,
    DoneRecord,
    Feed,
    QueuedRows,
    env_ids_of,
    episode_over,
)

__all__ = ["Track", "TrackFeed", "track_rows"]


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


def track_rows(track: Track, agent_index: int = 0, mark_abandoned: bool = False) -> dict[str, Any]:
    """The batch rows of a chunk (``len >= 1``): one per step, the columns of
    :func:`jaxsampler.sampling.host.collector.episodes_to_batch` (``mark_abandoned``: with the
    ``abandoned`` column)."""
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
        abandoned=(track.truncated and is_abandoned(track.infos[-1]) if mark_abandoned else None),
    )


class TrackFeed(Feed):
    """The feed of single-agent envs: one list :class:`Track` per running episode."""

    def __init__(self, books: Books):
        if len(books.agent_ids) != 1:
            raise ValueError(
                f"the track feed is for single-agent envs; this env has agents {books.agent_ids}"
            )
        super().__init__(books)
        self.agent = books.agent_ids[0]
        self._tracks: dict[Any, Track] = {}  # env id -> running chunk
        self._closed: list[Track] = []  # chunks closed in this call
        self._queue: list[tuple[Any, Any]] = []  # (env id, observation) waiting for an action
        self._env_steps: dict[str, int] = {}  # episode id -> env steps (polls) so far

    def queued(self) -> list[QueuedRows]:
        """The observations waiting for an action, as one row block of the agent's policy."""
        queue, self._queue = self._queue, []
        if not queue:
            return []
        n = len(queue)
        pid = self.books.mapping[self.agent]
        return [(pid, stack([o for _, o in queue]), [e for e, _ in queue], [self.agent] * n)]

    def feed(
        self,
        res: PollResult,
        obs: dict[Any, dict[Any, Any]],
        done: list[DoneRecord],
        env_rewards: dict[Any, dict[Any, Any]] | None = None,
    ) -> int:
        """Appends the poll's steps to the running tracks (:meth:`Feed.feed`)."""
        b, agent = self.books, self.agent
        steps = 0
        for e in env_ids_of(res):
            rank = b.rank(e)
            o = obs.get(e, {})
            tr = self._tracks.get(e)
            if tr is None:  # a new episode (rewards before acting belong to no step)
                if agent not in o or episode_over(res, e):  # ended before its first step
                    continue
                info = res.infos.get(e, {}).get(agent)
                tr = self._tracks[e] = Track(
                    b.new_episode_id(e), [o[agent]], [{} if info is None else info]
                )
                b.returns[tr.id_] = 0.0
                self._env_steps[tr.id_] = 0
                b.states.pop((e, agent), None)
                self._queue.append((e, o[agent]))
                b.note_off_policy(e, res)
                continue
            rewards = res.rewards.get(e, {})
            terms, truncs = res.terminateds.get(e, {}), res.truncateds.get(e, {})
            term, trunc = bool(terms.get(agent, False)), bool(truncs.get(agent, False))
            all_done = bool(terms.get(ALL_AGENTS, False) or truncs.get(ALL_AGENTS, False))
            reward = float(rewards.get(agent, 0.0))
            sent = b.actions.pop(e, None)
            if agent in o:
                if sent is None:
                    raise ValueError(
                        f"env {e!r} delivered an observation for agent {agent!r}, which has one "
                        "waiting for its action"
                    )
                action, extras = sent[agent]
                tr.step(action, extras, reward, o[agent], res.infos.get(e, {}).get(agent) or {})
                tr.terminated, tr.truncated = term, trunc
                if not (term or trunc or all_done):
                    self._queue.append((e, o[agent]))
            else:  # a reward-only poll: the step hangs until the next observation
                if term or trunc or all_done:
                    raise ValueError(
                        f"env {e!r}: agent {agent!r} is done but its final observation is missing"
                    )
                if sent is not None:
                    b.actions[e] = sent
                tr.hanging_reward += reward
            if env_rewards is not None:
                rewards = env_rewards.get(e, {})
            b.returns[tr.id_] += float(sum(rewards.values()))
            self._env_steps[tr.id_] += 1
            tr.polls += 1
            steps += 1
            if all_done:
                b.finished[tr.id_] = (rank, b.poll_index)
                done.append((tr.id_, b.returns.pop(tr.id_), self._env_steps.pop(tr.id_)))
                self._closed.append(tr)
                del self._tracks[e]
                b.off_policy.pop(e, None)
                b.states.pop((e, agent), None)
            else:
                b.note_off_policy(e, res)
        b.poll_index += 1
        b.forget_ranks(self._tracks)
        return steps

    def close_call(self, discard_running: bool) -> list[Any]:
        """Closes the finished tracks and, unless discarded, cuts every running track that
        stepped (:meth:`Feed.close_call`)."""
        if discard_running:
            for tr in self._tracks.values():
                self.books.returns.pop(tr.id_, None)
                self._env_steps.pop(tr.id_, None)
            self._tracks.clear()
            self._queue.clear()
        else:
            for e in sorted(self._tracks, key=self.books.env_rank.__getitem__):
                tr = self._tracks[e]
                if tr.polls > 0:  # as the collector: a chunk with env steps is closed
                    self._closed.append(tr)
                    self._tracks[e] = tr.cut(self.books.horizon)
        chunks, self._closed = self._closed, []
        return chunks

    def episodes(self, chunks: list[Any]) -> list[SingleAgentEpisode]:
        """The tracks as numpy'ized :class:`SingleAgentEpisode` objects."""
        b = self.books
        return [tr.episode(b.observation_space, b.action_space) for tr in chunks]

    def batch(self, chunks: list[Any]) -> MultiAgentBatch:
        """The tracks' rows (:func:`track_rows`), all under the agent's policy id."""
        mark = self.books.mark_abandoned
        rows = [track_rows(tr, 0, mark) for tr in chunks if len(tr)]
        policy_batches = {}
        if rows:
            policy_batches[self.books.mapping[self.agent]] = SampleBatch(
                {k: concat_rows([r[k] for r in rows]) for k in rows[0]}
            )
        return MultiAgentBatch(policy_batches, sum(len(tr) for tr in chunks))

    def agent_steps(self, chunks: list[Any]) -> int:
        """The steps of the tracks (one agent: one agent step per step)."""
        return sum(len(tr) for tr in chunks)

    def running_ids(self) -> list[str]:
        """The running episodes' ids, by their env's first appearance."""
        order = sorted(self._tracks, key=self.books.env_rank.__getitem__)
        return [self._tracks[e].id_ for e in order]

    def reset(self) -> None:
        """Forgets every running track and every closed one not yet returned."""
        self._tracks.clear()
        self._closed.clear()
        self._queue.clear()
        self._env_steps.clear()
