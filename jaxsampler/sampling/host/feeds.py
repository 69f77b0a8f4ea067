"""How :class:`~jaxsampler.sampling.host.HostSampler` turns polls into episodes: one feed
per kind of env, picked at construction, so the per-poll loop never branches on it.

Single-agent envs use list tracks (:class:`~jaxsampler.sampling.host.track.TrackFeed`: a
few appends per step, episodes built when a chunk closes); multi-agent envs the
:class:`CollectorFeed` (:class:`MultiAgentEpisode` objects built by the
:class:`~jaxsampler.sampling.host.collector.SampleCollector`). What the sampler and its
feed share lives in one :class:`Books`. Nothing in the books or a feed outlives its
episode, except env ranks (see :meth:`Books.forget_ranks`), so a server whose env ids are
episode ids does not grow without bound.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Container
from typing import Any, NamedTuple

from jaxsampler.constants import ALL_AGENTS
from jaxsampler.episodes.batch import MultiAgentBatch
from jaxsampler.episodes.ids import EpisodeIds, agent_episode_id
from jaxsampler.episodes.multi_agent import MultiAgentEpisode, StaticModuleMapping
from jaxsampler.episodes.single_agent import SingleAgentEpisode
from jaxsampler.host_envs.base import PollResult
from jaxsampler.sampling.host.collector import SampleCollector, episodes_to_batch

__all__ = [
    "Books",
    "OffPolicy",
    "CollectorFeed",
    "DoneRecord",
    "Feed",
    "QueuedRows",
    "env_ids_of",
    "episode_over",
]

#: One policy's agents waiting for an action: ``(policy_id, stacked obs, env ids, agent ids)``.
QueuedRows = tuple[Any, Any, list[Any], list[Any]]

#: One finished episode for the metrics: ``(episode id, return, env steps)``.
DoneRecord = tuple[str, float, int]


class OffPolicy(NamedTuple):
    """The actions one sub-env took itself at its last poll, with that poll's infos (an
    info may carry the behaviour policy's outputs; the sampler reads them when it records
    the step)."""

    actions: dict[Any, Any]  # agent id -> action
    infos: dict[Any, Any]  # agent id -> info dict of the poll


def env_ids_of(res: PollResult) -> dict[Any, None]:
    """The sub-envs a poll has data of, in order of first appearance."""
    env_ids: dict[Any, None] = {}
    for d in (res.obs, res.rewards, res.terminateds, res.truncateds):
        env_ids.update(dict.fromkeys(d))
    return env_ids


def episode_over(res: PollResult, env_id: Any) -> bool:
    """Whether the poll ends the episode of sub-env ``env_id`` (its ``"__all__"`` flags)."""
    return bool(
        res.terminateds.get(env_id, {}).get(ALL_AGENTS, False)
        or res.truncateds.get(env_id, {}).get(ALL_AGENTS, False)
    )


@dataclasses.dataclass
class Books:
    """The host sampler's bookkeeping that its feed reads and writes.

    Attributes:
        agent_ids: the env's agent ids (the agent index is the position).
        mapping: agent id -> policy id.
        policy_ids: the policies, in batch order.
        horizon: ``episode_lookback_horizon``.
        observation_space / action_space: one agent's spaces.
        agent_spaces: ``(agent id -> observation space, agent id -> action space)`` for
            an env whose agents have their own spaces (then they hold for each agent
            instead of the two above); ``None``: every agent has the two above.
        ids: the sampler's episode ids.
        mark_abandoned: batch rows get an ``abandoned`` column
            (:func:`~jaxsampler.sampling.host.collector.step_rows`).
        env_named: episode ids are the env's ids (an env whose ``names_episodes`` is true,
            such as an external env with a journal), not the sampler's own.
        rllib_compatible: agents' done flags as RLlib 2.60's ``MultiAgentEpisode`` sets
            them (the episode's computed flags OR'ed into every agent stepped in the step
            that ends it); default: each agent's own flags OR ``"__all__"``.
        rank_capacity: env ranks kept before those of envs without a running episode are
            forgotten (:meth:`forget_ranks`).
        count: episodes started so far (the next id's number).
        env_rank: env id -> order of first appearance.
        next_rank: the rank of the next new env.
        actions: env id -> agent id -> ``(action, extras)`` sent, awaiting the next poll.
        off_policy: env id -> the actions the env took itself at its last poll
            (:class:`OffPolicy`; no entry when it took none).
        states: ``(env id, agent id)`` -> recurrent policy state (``[1, 1, ...]`` leaves).
        returns: running episode id -> return so far.
        finished: episode id -> ``(env rank, poll index)`` of the poll that finished it.
        poll_index: polls fed so far.
    """

    agent_ids: tuple[Any, ...]
    mapping: dict[Any, Any]
    policy_ids: tuple[Any, ...]
    horizon: int
    observation_space: Any
    action_space: Any
    ids: EpisodeIds
    agent_spaces: tuple[dict[Any, Any], dict[Any, Any]] | None = None
    mark_abandoned: bool = False
    env_named: bool = False
    rllib_compatible: bool = False
    rank_capacity: int = 1024
    count: int = 0
    env_rank: dict[Any, int] = dataclasses.field(default_factory=dict)
    next_rank: int = 0
    actions: dict[Any, dict[Any, tuple[Any, dict[str, Any]]]] = dataclasses.field(
        default_factory=dict
    )
    off_policy: dict[Any, OffPolicy] = dataclasses.field(default_factory=dict)
    states: dict[tuple[Any, Any], Any] = dataclasses.field(default_factory=dict)
    returns: dict[str, float] = dataclasses.field(default_factory=dict)
    finished: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    poll_index: int = 0

    def new_episode_id(self, env_id: Any) -> str:
        """A new episode id for env ``env_id``: the next number of this run, or the env id
        itself where the env names its episodes (``env_named``)."""
        eid = str(env_id) if self.env_named else self.ids(0, self.count)
        self.count += 1
        return eid

    def rank(self, env_id: Any) -> int:
        """The env's order of first appearance (assigned at its first poll)."""
        rank = self.env_rank.get(env_id)
        if rank is None:
            rank = self.env_rank[env_id] = self.next_rank
            self.next_rank += 1
        return rank

    def forget_ranks(self, running: Container[Any]) -> None:
        """Forgets the ranks of envs not in ``running`` once more than ``rank_capacity``
        are known (amortized O(1) per new env: the table at least halves each time, as
        ``rank_capacity`` is at least twice the envs that run at once)."""
        if len(self.env_rank) > self.rank_capacity:
            self.env_rank = {e: r for e, r in self.env_rank.items() if e in running}

    def note_off_policy(self, env_id: Any, res: PollResult) -> None:
        """Remembers the actions sub-env ``env_id`` took itself at this poll (or that it
        took none), for the actions and records of its next step."""
        acts = res.off_policy_actions.get(env_id)
        if acts:
            self.off_policy[env_id] = OffPolicy(acts, res.infos.get(env_id, {}))
        else:
            self.off_policy.pop(env_id, None)

    def clear(self) -> None:
        """Forgets every running episode (a reset); ids continue in a new id space."""
        for d in (self.actions, self.off_policy, self.states, self.returns, self.finished):
            d.clear()
        self.ids.new_run()


class Feed(abc.ABC):
    """Polls in, episodes out; see the module docstring.

    Args:
        books: the sampler's shared bookkeeping.
    """

    def __init__(self, books: Books):
        self.books = books

    @abc.abstractmethod
    def queued(self) -> list[QueuedRows]:
        """The agents waiting for an action, per policy; the queue is emptied."""

    @abc.abstractmethod
    def feed(
        self,
        res: PollResult,
        obs: dict[Any, dict[Any, Any]],
        done: list[DoneRecord],
        env_rewards: dict[Any, dict[Any, Any]] | None = None,
    ) -> int:
        """Feeds one poll (``obs``: its checked observations); appends each episode it
        finishes to ``done``; returns the number of env steps it held. ``env_rewards``:
        the env's own rewards where ``res`` holds transformed ones (returns sum these)."""

    @abc.abstractmethod
    def close_call(self, discard_running: bool) -> list[Any]:
        """The call's chunks in closing order: finished ones, then (unless
        ``discard_running``, which forgets them) the running ones env by env, each
        continued in its ``cut`` successor."""

    @abc.abstractmethod
    def episodes(self, chunks: list[Any]) -> list[SingleAgentEpisode] | list[MultiAgentEpisode]:
        """The chunks as numpy'ized episodes."""

    @abc.abstractmethod
    def batch(self, chunks: list[Any]) -> MultiAgentBatch:
        """The chunks' rows as a batch (``count``: the chunks' env steps)."""

    @abc.abstractmethod
    def agent_steps(self, chunks: list[Any]) -> int:
        """The agent steps the chunks hold."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Forgets every running episode and every chunk not yet returned."""

    @abc.abstractmethod
    def running_ids(self) -> list[str]:
        """The ids of the running episodes, in order of their env's first appearance."""


class CollectorFeed(Feed):
    """The feed of multi-agent envs: :class:`MultiAgentEpisode` objects built by a
    :class:`SampleCollector`.

    Raises:
        ValueError: a single-agent env (its feed is
            :class:`~jaxsampler.sampling.host.track.TrackFeed`).
    """

    def __init__(self, books: Books):
        if len(books.agent_ids) == 1:
            raise ValueError(
                f"the collector feed is for multi-agent envs; this env has one agent "
                f"{books.agent_ids[0]!r} (single-agent envs use TrackFeed)"
            )
        super().__init__(books)
        self.collector = SampleCollector(
            agent_ids=books.agent_ids,
            episode_lookback_horizon=books.horizon,
            policy_ids=books.policy_ids,
        )
        self._running: dict[Any, str] = {}  # env id -> running episode id

    def queued(self) -> list[QueuedRows]:
        """The collector's inference inputs, per policy (the collector empties them)."""
        out = []
        for pid in self.books.policy_ids:
            rows = self.collector.get_inference_input_dict(pid)
            if rows.count:
                out.append((pid, rows["obs"], rows["env_id"].tolist(), rows["agent_id"].tolist()))
        return out

    def _agent_episode_id(self, ma_id: str, agent_id: Any) -> str:
        return agent_episode_id(ma_id, self.books.agent_ids.index(agent_id))

    def _new_episode(self, env_id: Any) -> MultiAgentEpisode:
        b = self.books
        ma_id = b.new_episode_id(env_id)
        mapping = b.mapping
        obs_spaces, act_spaces = b.agent_spaces or (
            dict.fromkeys(b.agent_ids, b.observation_space),
            dict.fromkeys(b.agent_ids, b.action_space),
        )
        return MultiAgentEpisode(
            ma_id,
            observation_space=dict(obs_spaces),
            action_space=dict(act_spaces),
            agent_episode_ids={a: self._agent_episode_id(ma_id, a) for a in b.agent_ids},
            agent_module_ids=dict(mapping),
            agent_to_module_mapping_fn=StaticModuleMapping(mapping),
        )

    def _start(self, e: Any, res: PollResult, obs: dict[Any, Any]) -> None:
        """Starts the episode of sub-env ``e`` with the poll's first observations."""
        b = self.books
        ep = self._new_episode(e)
        self._running[e] = ep.id_
        b.returns[ep.id_] = 0.0
        infos = res.infos.get(e, {})
        for a, o in obs.items():
            b.states.pop((e, a), None)
            self.collector.add_init_obs(
                episode=ep,
                agent_id=a,
                env_id=e,
                policy_id=b.mapping[a],
                init_obs=o,
                init_infos=infos.get(a),
            )
        b.note_off_policy(e, res)

    def feed(
        self,
        res: PollResult,
        obs: dict[Any, dict[Any, Any]],
        done: list[DoneRecord],
        env_rewards: dict[Any, dict[Any, Any]] | None = None,
    ) -> int:
        """Adds the poll's steps to the running episodes (:meth:`Feed.feed`)."""
        b, c = self.books, self.collector
        steps = 0
        for e in env_ids_of(res):
            rank = b.rank(e)
            o, infos = obs.get(e, {}), res.infos.get(e, {})
            if e not in self._running:  # a new episode (rewards before acting belong to no step)
                if o and not episode_over(res, e):  # else it ended before its first step
                    self._start(e, res, o)
                continue
            eid = self._running[e]
            rewards = res.rewards.get(e, {})
            terms, truncs = res.terminateds.get(e, {}), res.truncateds.get(e, {})
            all_done = bool(terms.get(ALL_AGENTS, False) or truncs.get(ALL_AGENTS, False))
            sent = b.actions.pop(e, {})
            ep = c.episode(eid)
            agents: dict[Any, None] = dict.fromkeys(sent)
            for d in (o, rewards, terms, truncs):
                agents.update((a, None) for a in d if a != ALL_AGENTS)
            for a in agents:
                values: dict[str, Any] = {}
                if a in sent:
                    values["actions"], extras = sent[a]
                    values.update(extras)
                if a in rewards:
                    values["rewards"] = rewards[a]
                if a in o:
                    values["new_obs"] = o[a]
                    values["infos"] = infos.get(a, {})
                    if a not in ep.agent_episodes and a not in sent:  # joins the running episode
                        b.states.pop((e, a), None)
                        ep.assign_agent_episode_id(a, self._agent_episode_id(ep.id_, a))
                        c.add_init_obs(
                            episode=eid,
                            agent_id=a,
                            env_id=e,
                            policy_id=b.mapping[a],
                            init_obs=o[a],
                            init_infos=infos.get(a),
                        )
                        values = {k: v for k, v in values.items() if k not in ("new_obs", "infos")}
                        if not values:
                            continue
                term, trunc = bool(terms.get(a, False)), bool(truncs.get(a, False))
                values["terminateds"], values["truncateds"] = term, trunc
                c.add_action_reward_next_obs(
                    eid, a, e, b.mapping[a], term or trunc or all_done, values
                )
            done_before = {a for a, sa in ep.agent_episodes.items() if sa.is_done}
            c.episode_step(eid, terminateds=terms, truncateds=truncs)
            if not b.rllib_compatible:
                _own_flags(c.episode(eid), done_before, terms, truncs)
            if env_rewards is not None:
                rewards = env_rewards.get(e, {})
            b.returns[eid] += float(sum(rewards.values()))
            steps += 1
            if all_done:
                b.finished[eid] = (rank, b.poll_index)
                done.append((eid, b.returns.pop(eid), c.episode(eid).env_t))
                c.postprocess_episode(eid, is_done=True)
                del self._running[e]
                b.off_policy.pop(e, None)
                for a in b.agent_ids:
                    b.states.pop((e, a), None)
            else:
                b.note_off_policy(e, res)
        b.poll_index += 1
        b.forget_ranks(self._running)
        return steps

    def close_call(self, discard_running: bool) -> list[Any]:
        """Closes the call's chunks (:meth:`Feed.close_call`); agents without a step in a
        chunk are pruned from it, as RLlib's env runner does."""
        if discard_running:
            for eid in self._running.values():
                self.collector.discard_episode(eid)
                self.books.returns.pop(eid, None)
            self._running.clear()
        else:
            for e in sorted(self._running, key=self.books.env_rank.__getitem__):
                self.collector.postprocess_episode(self._running[e], is_done=False)
        chunks = list(self.collector.pop_built_episodes())
        for ep in chunks:  # as RLlib's env runner (the successors are already cut)
            ep.prune_empty_agents()
        return chunks

    def episodes(self, chunks: list[Any]) -> list[MultiAgentEpisode]:
        """The chunks themselves (numpy'ized :class:`MultiAgentEpisode` objects)."""
        return list(chunks)

    def batch(self, chunks: list[Any]) -> MultiAgentBatch:
        """The chunks' rows (:func:`~jaxsampler.sampling.host.collector.episodes_to_batch`)."""
        b = self.books
        return episodes_to_batch(chunks, b.agent_ids, b.policy_ids, mark_abandoned=b.mark_abandoned)

    def agent_steps(self, chunks: list[Any]) -> int:
        """The agent steps of the chunks' agent episodes."""
        return sum(ep.agent_steps() for ep in chunks)

    def running_ids(self) -> list[str]:
        """The running episodes' ids, by their env's first appearance."""
        order = sorted(self._running, key=self.books.env_rank.__getitem__)
        return [self._running[e] for e in order]

    def reset(self) -> None:
        """Discards every running episode and every built chunk."""
        for eid in self._running.values():
            self.collector.discard_episode(eid)
        self.collector.pop_built_episodes()
        self._running.clear()


def _own_flags(ep: MultiAgentEpisode, done_before: set, terms: dict, truncs: dict) -> None:
    """The agents done in the step just added keep their own flags OR'ed with
    ``"__all__"`` only. (RLlib's ``add_env_step`` also ORs a terminated episode into them
    when every agent is done by its own flags, which marks truncated agents terminated.)"""
    all_term = bool(terms.get(ALL_AGENTS, False))
    all_trunc = bool(truncs.get(ALL_AGENTS, False))
    for a, sa in ep.agent_episodes.items():
        if sa.is_done and a not in done_before:
            sa.is_terminated = bool(terms.get(a, False)) or all_term
            sa.is_truncated = bool(truncs.get(a, False)) or all_trunc
