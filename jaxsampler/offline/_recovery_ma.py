"""The multi-agent half of :func:`~jaxsampler.offline.recover`: each agent's own steps in a
replayed episode, which of them a multi-agent log holds, and the
:class:`~jaxsampler.episodes.MultiAgentEpisode` chunks that add the missing ones.

An agent's step ``t`` runs from its ``t``-th observation in the episode to its next one (the
agent timestep the sampler's agent episodes and batch rows carry): the action it got at
the first, the rewards logged for it in between (summed, as a hanging agent's are). Where
the episode ends, an agent that acted and waits for its next observation gets its last one
again (the rule of a terminated ``MultiAgentEpisode``, kept for truncated ends too), so
its last acknowledged step is kept. The log may hold any subset of these steps, so a
recovered chunk holds, per agent, one run of consecutive missing steps: one chunk per env
step at which such runs end (agents whose runs end there), spanning the env steps from the
earliest of their first observations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxsampler.constants import ALL_AGENTS
from jaxsampler.episodes import MultiAgentEpisode, SampleBatch, SingleAgentEpisode
from jaxsampler.episodes.ids import agent_episode_id
from jaxsampler.host_envs.base import agent_spaces
from jaxsampler.host_envs.external import ExternalEnvBase
from jaxsampler.offline._replay import RECOVERED_INFO, _Steps, runs
from jaxsampler.offline.frames import CorruptLogError

__all__: list[str] = []


@dataclasses.dataclass
class AgentLine:
    """One agent's part of an episode: its observations (item index, observation, info;
    one more than its steps), each step's action and reward, and its end flags.

    Attributes:
        at: the item (env step) of each observation.
        obs / infos: the observations and their infos.
        actions / rewards: per step.
        terminated / truncated: the flags of its last step.
        stored_before: steps stored when the journal took its checkpoint.
    """

    at: list[int] = dataclasses.field(default_factory=list)
    obs: list[Any] = dataclasses.field(default_factory=list)
    infos: list[dict] = dataclasses.field(default_factory=list)
    actions: list[Any] = dataclasses.field(default_factory=list)
    rewards: list[float] = dataclasses.field(default_factory=list)
    terminated: bool = False
    truncated: bool = False
    stored_before: int = 0

    @property
    def waiting(self) -> bool:
        """Whether the agent acted on its last observation and waits for its next one."""
        return len(self.actions) == len(self.obs)

    @property
    def num_steps(self) -> int:
        """The agent's steps (observations with an action and a next observation)."""
        return len(self.actions)


def agent_lines(ep: _Steps) -> dict[Any, AgentLine]:
    """Each agent's steps in ``ep`` up to its end (see the module docstring)."""
    last = ep.last_index()
    lines: dict[Any, AgentLine] = {}
    for i, item in enumerate(ep.items[: last + 1]):
        for a, r in item["rewards"].items():  # logged since the agent's last action
            line = lines.get(a)
            if line is not None and line.waiting:
                line.rewards[-1] += float(r)
        for a, o in item["obs"].items():
            line = lines.setdefault(a, AgentLine())
            line.at.append(i)
            line.obs.append(o)
            line.infos.append(item["infos"][a])
            line.terminated = item["terminated"][a]
            if i < last and not line.terminated:
                line.actions.append(ep.actions[i][a])  # type: ignore[index]
                line.rewards.append(0.0)
    if last >= 0:
        _close(ep.items[last], last, lines)
    for line in lines.values():
        seen = sum(1 for i in line.at if i < ep.polled_at_checkpoint)
        line.stored_before = min(max(seen - 1, 0), line.num_steps)
    return lines


def _close(end: dict, last: int, lines: dict[Any, AgentLine]) -> None:
    """The end flags of the agents still in the episode at its last item ``end``, and
    the closing observation of those that wait for one (their last one again, there)."""
    truncated = not end["all_term"]  # truncated, or an unanswered get_action (the crash)
    abandoned = any(i.get("abandoned") for i in end["infos"].values())
    for line in lines.values():
        if line.waiting:
            line.at.append(last)
            line.obs.append(line.obs[-1])
            line.infos.append({**line.infos[-1], **({"abandoned": True} if abandoned else {})})
        elif line.at[-1] != last:
            continue  # it ended before (terminated)
        line.terminated = line.terminated or not truncated
        line.truncated = truncated


def stored_keys(
    record: Any, agent_ids: Sequence[Any], path: str
) -> Iterable[tuple[tuple[str, Any], Iterable[int]]]:
    """``((episode id, agent), agent steps)`` of what one record of a multi-agent log holds:
    a :class:`MultiAgentEpisode`'s agent episodes, or batch rows (``eps_id`` the agent's
    episode id, ``agent_index`` its position in ``agent_ids``, ``t`` its step).

    Raises:
        CorruptLogError: a single-agent episode (a log of a single-agent env).
    """
    if isinstance(record, MultiAgentEpisode):
        for a, sa in record.agent_episodes.items():
            yield (str(record.id_), a), range(sa.t_started, sa.t_started + len(sa))
    elif isinstance(record, SampleBatch):
        for key, t in _row_keys(record, agent_ids):
            yield key, (t,)
    elif isinstance(record, (tuple, SingleAgentEpisode)):
        raise CorruptLogError(
            path,
            0,
            "the log holds single-agent episodes (a single-agent env's log), "
            "not the multi-agent episodes of a multi-agent env",
        )


def _row_keys(rows: SampleBatch, agent_ids: Sequence[Any]) -> Iterable[tuple[tuple[str, Any], int]]:
    """``((episode id, agent), t)`` of each row whose ``eps_id`` is an agent's episode id
    (:func:`~jaxsampler.episodes.ids.agent_episode_id` of its ``agent_index``); other rows
    name no multi-agent episode of the journal and are left out."""
    if "agent_index" not in rows or "eps_id" not in rows:
        return
    ids = np.asarray(rows["eps_id"]).tolist()
    index = np.asarray(rows["agent_index"]).tolist()
    ts = np.asarray(rows["t"]).tolist()
    for eps_id, i, t in zip(ids, index, ts, strict=True):
        eid = str(eps_id)[:-4]
        if 0 <= i < len(agent_ids) and agent_episode_id(eid, i) == str(eps_id):
            yield (eid, agent_ids[i]), int(t)


def ma_chunks(
    ep: _Steps,
    lines: dict[Any, AgentLine],
    missing: dict[Any, list[int]],
    env: ExternalEnvBase,
    modules: Mapping[Any, Any] | None = None,
) -> list[MultiAgentEpisode]:
    """The chunks holding each agent's ``missing`` steps (sorted step indices) of ``ep``:
    one per env step at which runs of them end (see the module docstring); ``modules``:
    each agent's module (policy) id (``None``: the default one for every agent)."""
    by_end: dict[int, dict[Any, tuple[int, int]]] = {}
    for a, ts in missing.items():
        for lo, hi in runs(ts):
            by_end.setdefault(lines[a].at[hi], {})[a] = (lo, hi)
    last = ep.last_index()
    end_term = bool(ep.items[last]["all_term"]) if last >= 0 else False
    return [
        _chunk(ep, lines, group, end, end_term if end == last else None, env, modules)
        for end, group in sorted(by_end.items())
    ]


def _chunk(
    ep: _Steps,
    lines: dict[Any, AgentLine],
    group: dict[Any, tuple[int, int]],
    end: int,
    end_term: bool | None,
    env: ExternalEnvBase,
    modules: Mapping[Any, Any] | None,
) -> MultiAgentEpisode:
    """One chunk: agent ``a``'s steps ``group[a] = (lo, hi)``, all ending at env step
    ``end``; ``end_term``: whether the episode ends there terminated (``False``: truncated,
    ``None``: it goes on)."""
    agents = list(env.agent_ids)
    start = min(lines[a].at[lo] for a, (lo, _) in group.items())
    obs_spaces, act_spaces = agent_spaces(env)  # each agent its own (or the shared) space
    chunk = MultiAgentEpisode(
        ep.eid,
        observation_space=obs_spaces,
        action_space=act_spaces,
        env_t_started=start,
        agent_t_started={a: lo for a, (lo, _) in group.items()},
        agent_episode_ids={a: agent_episode_id(ep.eid, agents.index(a)) for a in group},
        agent_module_ids=None if modules is None else {a: modules[a] for a in group},
    )
    # agent -> env step -> the index of its observation there (lo .. hi)
    where = {a: {lines[a].at[k]: k for k in range(lo, hi + 1)} for a, (lo, hi) in group.items()}
    for j in range(start, end + 1):
        obs, infos, actions, rewards = {}, {}, {}, {}
        for a, at in where.items():
            line = lines[a]
            if j in at:
                obs[a] = line.obs[at[j]]
                infos[a] = {**line.infos[at[j]], RECOVERED_INFO: True}
            if j > line.at[group[a][0]]:  # the rewards logged for it since the last item
                rewards[a] = float(ep.items[j]["rewards"].get(a, 0.0))
                if j - 1 in at:
                    actions[a] = line.actions[at[j - 1]]
        if j == start:
            chunk.add_env_reset(observations=obs, infos=infos)
        else:
            terms, truncs = _flags(lines, group, end_term) if j == end else ({}, {})
            chunk.add_env_step(obs, actions, rewards, infos, terminateds=terms, truncateds=truncs)
    # the episode's own end (not RLlib's "every agent in the chunk is done" rule: agents
    # of the episode that are not in this chunk may go on)
    chunk.is_terminated, chunk.is_truncated = end_term is True, end_term is False
    return chunk.to_numpy()


def _flags(
    lines: dict[Any, AgentLine], group: dict[Any, tuple[int, int]], end_term: bool | None
) -> tuple[dict, dict]:
    """The done flags at a chunk's last env step: the agents terminated there by their own
    flags, and the episode's (``"__all__"``) where it ends there, which the episode ORs
    into every agent still in it (an agent's truncation is always the episode's)."""
    terms: dict[Any, bool] = {
        a: True for a, (_, hi) in group.items() if hi == lines[a].num_steps and lines[a].terminated
    }
    truncs: dict[Any, bool] = {}
    if end_term is not None:
        terms[ALL_AGENTS], truncs[ALL_AGENTS] = end_term, not end_term
    return terms, truncs
