"""``MultiAgentEpisode``: one multi-agent episode (chunk), RLlib-compatible.

Same constructor arguments, methods, index semantics and errors as RLlib's class of that
name in ray 2.60 (its documentation and its recorded behaviour), written anew:

* one :class:`SingleAgentEpisode` per agent (``agent_episodes``), holding only the steps
  at which that agent acted; ``env_t_to_agent_t`` maps every env step to the agent's own
  timestep, or ``"S"`` where the agent had no observation;
* an agent that acted and has not yet received its next observation is *hanging*: its
  action, extra model outputs and the rewards it collects meanwhile wait in caches and
  become one agent step when the observation arrives (rewards are summed);
* getters index env steps by default (``env_steps=True``) and each agent's own
  timeline with ``env_steps=False``.

Deviations from ray 2.60, each where RLlib 2.60 has a bug (``tests/ma_differential.py``
runs random call sequences on both classes and leaves out exactly these):
env-step getters on cut chunks return every item (1); ``get_extra_model_outputs(key,
env_steps=False)`` works (2); ``get_truncateds()["__all__"]`` is ``is_truncated`` (3);
``cut(0)`` keeps hanging agents (4); a cut chunk's ``_hanging_rewards_begin`` starts
empty, so ``get_return(include_hanging_rewards=True)`` does not count rewards twice (5);
``concat_episode`` drops hanging caches that the other chunk completed (6);
``get_extra_model_outputs`` returns hanging-only extras (7); ``is_numpy`` ignores
agents with no step yet (8); the re-recorded final observation of an agent terminated
without one is mapped to no env step (RLlib maps it to the *next* env step: that agent's
map is one entry too long, so its env-step getters with negative indices, and
``get_agents_that_stepped()``, are off by one) (9); in a cut chunk such an agent still
completes its hanging step and is done (RLlib loses both: the successor has no "last
added" observation) (10); an agent joining a cut chunk is mapped at its env step (RLlib
pads its map by the absolute ``env_t``) (11); agent-step getters with
``neg_index_as_lookback`` resolve indices in the agent's own data only (RLlib appends a
cached hanging value first, also a 0.0 reward of an agent that is not hanging) (12);
env-step extras with ``fill`` work (RLlib raises ``AttributeError``) (13); numpy'ized
rewards with ``fill`` keep the stored dtype (RLlib's is float32 when the first item is
a fill value, else float64) (14); numpy'ized info getters with ``fill`` return lists of
dicts (RLlib batches the fill dicts into arrays, or raises) (15); ``cut(n)`` keeps at
most the data there is (RLlib does not clip ``n``: the successor gets empty lookback
env steps and lookback indices differ) (16); agent-step slices of hanging agents are
lists in list mode (RLlib's ``np.append`` makes arrays) (17); ``return_list=True`` with
an int index returns a one-item list (RLlib fails an assertion) (18).

Two more differences are choices, not RLlib bugs: ``cut`` does not carry done agents into
the successor (RLlib keeps them as done agents with only lookback data, which its env
runner then prunes); and an agent that joins in the step where every other known agent
is done keeps the episode going (RLlib ends the episode there and ignores the joiner).
Behaviours matched to RLlib: rewards before an agent's first observation go to its first
step when the list constructor's ``agent_episode_ids`` names it (else they are dropped);
a done agent's caches are cleared; the episode ends terminated once every agent known
before the step is done by its own flags, and its flags are OR'ed into every agent
stepped there; ``agent_t_started`` holds started agents only; agent-step getters leave
out agents without data in range; an empty ``agent_ids`` means all agents.
"""

from __future__ import annotations

import copy
import time
from collections import defaultdict
from collections.abc import Callable, Collection
from typing import Any

import numpy as np

from jaxsampler.constants import ALL_AGENTS
from jaxsampler.episodes._tree import batch, tree_map
from jaxsampler.episodes.ids import random_episode_id
from jaxsampler.episodes.lookback import InfiniteLookbackBuffer
from jaxsampler.episodes.single_agent import SingleAgentEpisode, _empty_like

__all__ = ["MultiAgentEpisode", "MultiAgentEnvError", "SKIP", "StaticModuleMapping"]

#: Entry of ``env_t_to_agent_t`` for env steps at which an agent had no observation.
SKIP = "S"
_OUT = object()  # an index outside the data (filled or dropped)


class MultiAgentEnvError(Exception):
    """Data that violates the multi-agent env contract (RLlib's exception of that name)."""


def default_agent_to_module_mapping_fn(agent_id: Any, episode: Any) -> str:
    """RLlib's default: every agent is controlled by ``"default_policy"``."""
    return "default_policy"


class StaticModuleMapping:
    """An ``agent_to_module_mapping_fn`` that looks agents up in a fixed dict: what the
    samplers pass (their mapping is static), and unlike a lambda it pickles."""

    __slots__ = ("mapping",)

    def __init__(self, mapping: dict[Any, Any]):
        self.mapping = dict(mapping)

    def __call__(self, agent_id: Any, episode: Any) -> Any:
        return self.mapping[agent_id]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StaticModuleMapping) and other.mapping == self.mapping

    def __repr__(self) -> str:
        return f"StaticModuleMapping({self.mapping!r})"


class MultiAgentEpisode:
    """A (chunk of a) multi-agent episode; see the module docstring and RLlib's docs.

    ``observations`` / ``infos`` / ``actions`` / ``rewards`` / ``extra_model_outputs`` are
    lists of per-env-step dicts (``{agent_id: value}``; extras ``{agent_id: {key: value}}``)
    with one observation dict more than action dicts. ``len_lookback_buffer`` leading env
    steps (``"auto"``: all of them) are lookback.
    """

    def __init__(
        self,
        id_: str | None = None,
        *,
        observations: list[dict] | None = None,
        observation_space: dict | None = None,
        infos: list[dict] | None = None,
        actions: list[dict] | None = None,
        action_space: dict | None = None,
        rewards: list[dict] | None = None,
        terminateds: dict | bool = False,
        truncateds: dict | bool = False,
        extra_model_outputs: list[dict] | None = None,
        env_t_started: int | None = None,
        agent_t_started: dict | None = None,
        len_lookback_buffer: int | str = "auto",
        agent_episode_ids: dict | None = None,
        agent_module_ids: dict | None = None,
        agent_to_module_mapping_fn: Callable[[Any, Any], Any] | None = None,
    ):
        self.id_ = id_ or random_episode_id()
        self.agent_to_module_mapping_fn = (
            agent_to_module_mapping_fn or default_agent_to_module_mapping_fn
        )
        self._agent_to_module_mapping: dict[Any, Any] = dict(agent_module_ids or {})
        self.observation_space = observation_space or {}
        self.action_space = action_space or {}
        self.env_t_started = env_t_started or 0
        self.env_t = self.env_t_started
        self.agent_t_started: defaultdict[Any, int] = defaultdict(int, agent_t_started or {})
        self.agent_episodes: dict[Any, SingleAgentEpisode] = {}
        self.env_t_to_agent_t: defaultdict[Any, InfiniteLookbackBuffer] = defaultdict(
            InfiniteLookbackBuffer
        )
        self._agent_episode_ids = dict(agent_episode_ids or {})
        self._hanging_actions_end: dict[Any, Any] = {}
        self._hanging_extra_model_outputs_end: defaultdict[Any, dict] = defaultdict(dict)
        self._hanging_rewards_end: defaultdict[Any, float] = defaultdict(float)
        self._hanging_rewards_begin: defaultdict[Any, float] = defaultdict(float)
        self.is_terminated = False
        self.is_truncated = False
        self._len_lookback_buffers = 0
        self.custom_data: dict[str, Any] = {}
        self._start_time: float | None = None
        self._last_step_time: float | None = None
        if observations:
            self._init_from_lists(
                observations,
                infos,
                actions or [],
                rewards or [],
                extra_model_outputs,
                terminateds,
                truncateds,
                len_lookback_buffer,
            )
        else:
            self.is_terminated = bool(
                terminateds.get(ALL_AGENTS, False) if isinstance(terminateds, dict) else terminateds
            )
            self.is_truncated = bool(
                truncateds.get(ALL_AGENTS, False) if isinstance(truncateds, dict) else truncateds
            )

    # -- construction from lists -------------------------------------------------------

    def _init_from_lists(
        self, observations, infos, actions, rewards, extras, terminateds, truncateds, lb
    ) -> None:
        n = len(rewards)
        if len(actions) != n or len(observations) != n + 1:
            raise ValueError(
                "need one observation dict more than action/reward dicts, got "
                f"{len(observations)} observations, "
                f"{len(actions)} actions, {len(rewards)} rewards"
            )
        infos = infos or [{} for _ in observations]
        extras = extras or [{} for _ in actions]
        lb = n if lb == "auto" else min(int(lb), n)
        agent_t_started = dict(self.agent_t_started)
        env_t_started = self.env_t_started
        self.agent_t_started = defaultdict(int)
        self.env_t_started = self.env_t = 0
        rewards = self._pre_observation_rewards(observations, actions, rewards)
        self.add_env_reset(observations=observations[0], infos=infos[0])
        for i in range(n):
            # An agent that observed but did not act (and is not hanging) is done.
            done = {
                a: True
                for a in observations[i]
                if a not in actions[i] and a not in self._hanging_actions_end
            }
            self.add_env_step(
                observations[i + 1],
                actions[i],
                rewards[i],
                infos[i + 1],
                terminateds=done,
                extra_model_outputs=extras[i],
            )
        # Move the first ``lb`` env steps into the lookback and switch to absolute agent timesteps.
        self._len_lookback_buffers = lb
        for aid, m in self.env_t_to_agent_t.items():
            real = [v for v in m.data[: lb + 1] if v != SKIP]
            sa_lb = max(real) if real else 0
            sa = self.agent_episodes[aid]
            t0 = agent_t_started.get(aid, 0)
            for buf in (
                sa.observations,
                sa.infos,
                sa.actions,
                sa.rewards,
                *sa.extra_model_outputs.values(),
            ):
                buf.lookback = sa_lb
            sa.t_started, sa.t = t0, t0 + sa.rewards.len_incl_lookback() - sa_lb
            m.data = [v if v == SKIP else v - sa_lb + t0 for v in m.data]
            m.lookback = lb
            self.agent_t_started[aid] = t0
        self.env_t_started = env_t_started
        self.env_t = env_t_started + n - lb
        # (as RLlib's list constructor: no begin cache; unspent waiting rewards hang)
        self._hanging_rewards_begin = defaultdict(float)
        for aid, r in self.__dict__.pop("_pending_first_rewards").items():
            self._hanging_rewards_end[aid] += r
        for flags, attr in ((terminateds, "is_terminated"), (truncateds, "is_truncated")):
            if isinstance(flags, dict):
                for aid, v in flags.items():
                    if aid != ALL_AGENTS and aid in self.agent_episodes:
                        setattr(self.agent_episodes[aid], attr, bool(v))
                setattr(self, attr, bool(flags.get(ALL_AGENTS, False)) or getattr(self, attr))
            else:
                setattr(self, attr, bool(flags) or getattr(self, attr))

    def _pre_observation_rewards(self, observations, actions, rewards) -> list[dict]:
        """``rewards`` without those of agents before their first observation; as RLlib's
        list constructor, an agent named in ``agent_episode_ids`` gets them added to its
        first step's reward (or, if it takes none, left as its hanging reward), the
        others' are dropped."""
        known = set(self._agent_episode_ids)
        seen: set = set()
        pending: dict[Any, float] = {}
        out = []
        for i, rew in enumerate(rewards):
            seen.update(observations[i])
            step = {a: r for a, r in rew.items() if a in seen}
            for a, r in rew.items():
                if a not in seen and a in known:
                    pending[a] = pending.get(a, 0.0) + r
            for a in list(pending):
                if a in actions[i]:  # its first step: the rewards it waited for go to it
                    step[a] = pending.pop(a) + step.get(a, 0.0)
            out.append(step)
        self._pending_first_rewards = pending
        return out

    # -- agents and modules ------------------------------------------------------------

    def module_for(self, agent_id: Any) -> Any:
        """The module (policy) id controlling ``agent_id`` (mapped once, then cached)."""
        if agent_id not in self._agent_to_module_mapping:
            self._agent_to_module_mapping[agent_id] = self.agent_to_module_mapping_fn(
                agent_id, self
            )
        return self._agent_to_module_mapping[agent_id]

    @property
    def agent_to_module_mapping(self) -> dict[Any, Any]:
        return dict(self._agent_to_module_mapping)

    def assign_module(self, agent_id: Any, module_id: Any) -> None:
        """Records that ``module_id`` controls ``agent_id`` (a sampler that already knows
        the mapping). Raises ``ValueError`` if the agent is mapped to another module."""
        current = self._agent_to_module_mapping.setdefault(agent_id, module_id)
        if current != module_id:
            raise ValueError(
                f"agent {agent_id!r} of episode {self.id_!r} is mapped to policy {current!r}, "
                f"not {module_id!r}"
            )

    def assign_agent_episode_id(self, agent_id: Any, agent_episode_id: str) -> str:
        """Names ``agent_id``'s episode in this chunk before its first step (an agent that
        joins a ``cut`` chunk); a name already known wins. Returns the agent's id."""
        return self._agent_episode_ids.setdefault(agent_id, agent_episode_id)

    @property
    def agent_ids(self) -> set:
        return set(self.agent_episodes)

    def _new_agent(self, aid: Any, observation: Any, info: Any) -> None:
        sa = SingleAgentEpisode(
            self._agent_episode_ids.get(aid),
            observation_space=self.observation_space.get(aid)
            if isinstance(self.observation_space, dict)
            else None,
            action_space=self.action_space.get(aid)
            if isinstance(self.action_space, dict)
            else None,
            agent_id=aid,
            module_id=self.module_for(aid),
            multi_agent_episode_id=self.id_,
            t_started=self.agent_t_started.get(aid, 0),
        )
        sa.observations.append(observation)
        sa.infos.append({} if info is None else info)
        self.agent_episodes[aid] = sa
        self._agent_episode_ids[aid] = sa.id_

    def _map_len(self) -> int:
        return self.env_t - self.env_t_started + self._len_lookback_buffers + 1

    # -- trusted construction (the samplers' fast path) ---------------------------------

    def start_at(self, env_t: int, len_lookback_buffer: int) -> None:
        """Makes this empty episode a chunk that starts at env step ``env_t`` with
        ``len_lookback_buffer`` env steps of lookback in its maps (not validated)."""
        self.env_t_started = self.env_t = env_t
        self._len_lookback_buffers = len_lookback_buffer

    def trusted_agent(
        self,
        agent_id: Any,
        *,
        observations: InfiniteLookbackBuffer,
        infos: InfiniteLookbackBuffer,
        actions: InfiniteLookbackBuffer,
        rewards: InfiniteLookbackBuffer,
        t_started: int,
        default_id: str | None = None,
    ) -> SingleAgentEpisode:
        """Adds (and returns) ``agent_id``'s episode over prebuilt, already-validated
        buffers, as :meth:`SingleAgentEpisode.trusted` does. Its id is the one this episode
        knows for the agent, else ``default_id`` (else a random one)."""
        sa = SingleAgentEpisode.trusted(
            self._agent_episode_ids.get(agent_id) or default_id or random_episode_id(),
            observations=observations,
            infos=infos,
            actions=actions,
            rewards=rewards,
            extra_model_outputs={},
            observation_space=self.observation_space.get(agent_id)
            if isinstance(self.observation_space, dict)
            else None,
            action_space=self.action_space.get(agent_id)
            if isinstance(self.action_space, dict)
            else None,
            terminated=False,
            truncated=False,
            t_started=t_started,
            agent_id=agent_id,
            module_id=self.module_for(agent_id),
            multi_agent_episode_id=self.id_,
        )
        self._agent_episode_ids[agent_id] = sa.id_
        self.agent_episodes[agent_id] = sa
        self.agent_t_started[agent_id] = t_started
        return sa

    def set_hanging(self, agent_id: Any, action: Any, reward: float, extras: dict) -> None:
        """``agent_id`` acted and waits for its next observation: its ``action``,
        ``extras`` and the ``reward`` collected so far wait in the hanging caches."""
        self._hanging_actions_end[agent_id] = action
        self._hanging_rewards_end[agent_id] = reward
        self._hanging_extra_model_outputs_end[agent_id] = extras

    def clear_hanging(self, agent_id: Any) -> None:
        """Empties ``agent_id``'s hanging caches (its step completed)."""
        self._hanging_actions_end.pop(agent_id, None)
        self._hanging_rewards_end.pop(agent_id, None)
        self._hanging_extra_model_outputs_end.pop(agent_id, None)

    def extend_agent_map(self, agent_id: Any, entries: list, first_env_t: int) -> None:
        """Appends ``entries`` (agent timesteps or :data:`SKIP`) to ``agent_id``'s
        ``env_t_to_agent_t``, the first one for env step ``first_env_t``; a new map is
        padded with ``SKIP`` from the chunk's first (lookback) env step."""
        m = self.env_t_to_agent_t.get(agent_id)
        if m is None:
            pad = first_env_t - (self.env_t_started - self._len_lookback_buffers)
            self.env_t_to_agent_t[agent_id] = InfiniteLookbackBuffer(
                [SKIP] * pad + entries, self._len_lookback_buffers
            )
        else:
            m.data.extend(entries)

    # -- stepping ----------------------------------------------------------------------

    def add_env_reset(self, *, observations: dict, infos: dict | None = None) -> None:
        """Adds the first observations (and infos) of the episode."""
        assert not self.is_done, "The episode is already done."
        infos = infos or {}
        for aid, obs in observations.items():
            self._new_agent(aid, obs, infos.get(aid))
            self.env_t_to_agent_t[aid] = InfiniteLookbackBuffer([self.agent_t_started.get(aid, 0)])
        self._start_time = self._last_step_time = time.perf_counter()

    def add_env_step(
        self,
        observations: dict,
        actions: dict,
        rewards: dict,
        infos: dict | None = None,
        *,
        terminateds: dict | None = None,
        truncateds: dict | None = None,
        extra_model_outputs: dict | None = None,
    ) -> None:
        """Adds one env step: the actions taken (by the agents that acted), then the
        observations, rewards, infos and done flags the env returned."""
        if self.is_done:
            raise MultiAgentEnvError(
                "Cannot call `add_env_step` on a MultiAgentEpisode that is already done!"
            )
        infos, extras = infos or {}, extra_model_outputs or {}
        terminateds, truncateds = terminateds or {}, truncateds or {}
        all_term, all_trunc = (
            bool(terminateds.get(ALL_AGENTS, False)),
            bool(truncateds.get(ALL_AGENTS, False)),
        )
        self.env_t += 1
        map_len = self._map_len()
        # Every agent known before this step done (by its own flags, not "__all__"): the
        # episode is terminated, also when some of them were truncated (RLlib's rule) -
        # unless an agent joins in this step (RLlib would end the episode and ignore it).
        joins = any(
            a not in self.agent_episodes and not terminateds.get(a) and not truncateds.get(a)
            for a in observations
        )
        every_agent_done = (
            bool(self.agent_episodes)
            and not joins
            and all(
                sa.is_done or terminateds.get(a) or truncateds.get(a)
                for a, sa in self.agent_episodes.items()
            )
        )
        for aid, m in self.env_t_to_agent_t.items():
            if aid not in observations:
                m.append(SKIP)
        agents: dict[Any, None] = {}
        for d in (observations, actions, rewards, terminateds, truncateds):
            agents.update((a, None) for a in d if a != ALL_AGENTS)
        if all_term or all_trunc:
            agents.update((a, None) for a in self.agent_episodes)
        self.is_terminated = all_term or every_agent_done
        self.is_truncated = all_trunc
        for aid in agents:  # the episode's flags are OR'ed into every agent stepped here
            term = bool(terminateds.get(aid, False)) or self.is_terminated
            trunc = bool(truncateds.get(aid, False)) or self.is_truncated
            self._agent_step(
                aid, observations, actions, rewards, infos, extras, term, trunc, map_len
            )
            if term or trunc:  # a done agent's caches go (also its rewards before joining)
                for cache in (
                    self._hanging_actions_end,
                    self._hanging_extra_model_outputs_end,
                    self._hanging_rewards_end,
                    self._hanging_rewards_begin,
                ):
                    cache.pop(aid, None)
        self._last_step_time = time.perf_counter()

    def _agent_step(
        self, aid, observations, actions, rewards, infos, extras, term, trunc, map_len
    ) -> None:
        sa = self.agent_episodes.get(aid)
        has_obs, has_act = aid in observations, aid in actions
        reward = rewards.get(aid, 0.0)
        if sa is not None and sa.is_done:
            if has_obs or has_act or aid in rewards:
                raise MultiAgentEnvError(
                    f"Agent {aid} already had its `SingleAgentEpisode.is_done` set to True, but "
                    "still received "
                    f"data in a following step! obs={observations.get(aid)} act={actions.get(aid)} "
                    f"rew={rewards.get(aid)} info={infos.get(aid)} "
                    f"extra_model_outputs={extras.get(aid)}"
                )
            return
        hanging = aid in self._hanging_actions_end
        if has_obs and has_act:
            if aid not in rewards:
                raise MultiAgentEnvError(
                    f"Agent {aid} acted (and received next obs), but did NOT receive any reward "
                    "from the env!"
                )
            if sa is None:
                raise MultiAgentEnvError(
                    f"Agent {aid} acted without ever having received an observation"
                )
            total = self._hanging_rewards_end.pop(aid, 0.0) + reward
            self._hanging_actions_end.pop(aid, None)
            self._hanging_extra_model_outputs_end.pop(aid, None)
            self._complete(
                aid,
                observations[aid],
                infos.get(aid),
                actions[aid],
                total,
                extras.get(aid),
                term,
                trunc,
            )
        elif has_obs and hanging:
            self._complete(
                aid,
                observations[aid],
                infos.get(aid),
                self._hanging_actions_end.pop(aid),
                self._hanging_rewards_end.pop(aid, 0.0) + reward,
                self._hanging_extra_model_outputs_end.pop(aid, None),
                term,
                trunc,
            )
        elif has_obs:
            if sa is not None:
                raise MultiAgentEnvError(
                    f"Agent {aid} received an observation but did not act on its previous one"
                )
            if term or trunc:
                return  # an agent that arrives done never steps
            self._new_agent(aid, observations[aid], infos.get(aid))
            self.env_t_to_agent_t[aid] = InfiniteLookbackBuffer(
                [SKIP] * (map_len - 1) + [self.agent_t_started.get(aid, 0)],
                self._len_lookback_buffers,
            )
            self._hanging_rewards_begin[aid] += reward
        elif has_act:
            if sa is None:
                raise MultiAgentEnvError(
                    f"Agent {aid} acted without ever having received an observation"
                )
            self._hanging_actions_end[aid] = actions[aid]
            self._hanging_rewards_end[aid] = reward
            self._hanging_extra_model_outputs_end[aid] = dict(extras.get(aid) or {})
            self._finish_hanging(aid, term, trunc)
        else:  # a reward only: for the pending step, or before the agent's first observation
            if sa is None:
                self._hanging_rewards_begin[aid] += reward
            else:
                self._hanging_rewards_end[aid] += reward
            if hanging:
                self._finish_hanging(aid, term, trunc)
            elif (term or trunc) and sa is not None:
                if len(sa) == 0 and sa.observations.lookback == 0:
                    self._drop_agent(aid)
                else:
                    sa.is_terminated, sa.is_truncated = term, trunc
                    self._hanging_rewards_end.pop(aid, None)

    def _finish_hanging(self, aid: Any, term: bool, trunc: bool) -> None:
        """A hanging agent that is done without a next observation."""
        if trunc and not term:
            raise MultiAgentEnvError(
                f"Agent {aid} acted and then got truncated, but did NOT receive a last "
                "(truncation) observation, "
                "required for e.g. value function bootstrapping!"
            )
        if term:
            sa = self.agent_episodes[aid]
            self._complete(
                aid,
                sa.get_observations(-1),
                sa.get_infos(-1),
                self._hanging_actions_end.pop(aid),
                self._hanging_rewards_end.pop(aid, 0.0),
                self._hanging_extra_model_outputs_end.pop(aid, None),
                True,
                trunc,
                mapped=False,
            )

    def _complete(
        self, aid, obs, info, action, reward, extras, term, trunc, mapped: bool = True
    ) -> None:
        """Adds one agent step; ``mapped=False``: its observation (a terminated agent's
        last one, re-recorded) belongs to no env step, the agent's map keeps ``SKIP``."""
        sa = self.agent_episodes[aid]
        sa.add_env_step(
            obs,
            action,
            reward,
            info,
            terminated=term,
            truncated=trunc,
            extra_model_outputs=extras or None,
        )
        if mapped:
            self.env_t_to_agent_t[aid].append(len(sa) + self.agent_t_started[aid])
        else:
            self.agent_t_started.setdefault(aid, 0)

    def _drop_agent(self, aid: Any) -> None:
        for d in (
            self.agent_episodes,
            self.env_t_to_agent_t,
            self._hanging_actions_end,
            self._hanging_extra_model_outputs_end,
            self._hanging_rewards_end,
            self._hanging_rewards_begin,
        ):
            d.pop(aid, None)

    # -- done flags --------------------------------------------------------------------

    @property
    def is_done(self) -> bool:
        return bool(self.is_terminated or self.is_truncated)

    @property
    def is_reset(self) -> bool:
        return bool(self.agent_episodes)

    def get_terminateds(self) -> dict:
        return {
            **{a: sa.is_terminated for a, sa in self.agent_episodes.items()},
            ALL_AGENTS: self.is_terminated,
        }

    def get_truncateds(self) -> dict:
        return {
            **{a: sa.is_truncated for a, sa in self.agent_episodes.items()},
            ALL_AGENTS: self.is_truncated,
        }

    def get_agents_that_stepped(self) -> set:
        """Agents with an observation at the last env step."""
        return {
            a
            for a, m in self.env_t_to_agent_t.items()
            if m.data and m.data[-1] != SKIP and a in self.agent_episodes
        }

    def prune_empty_agents(self) -> MultiAgentEpisode:
        """Removes the agent episodes without a step in this chunk (``len == 0``: e.g. an
        agent that acted and waits for its next observation), as RLlib's env runner does
        before returning a chunk; their maps and hanging caches stay (a ``cut`` successor
        made before continues them, and :meth:`concat_episode` of the successor restores
        them). Returns ``self``."""
        for aid in [a for a, sa in self.agent_episodes.items() if len(sa) == 0]:
            del self.agent_episodes[aid]
        return self

    def get_agents_to_act(self) -> set:
        """Agents with an observation at the last env step that are not done."""
        return {a for a in self.get_agents_that_stepped() if not self.agent_episodes[a].is_done}

    # -- getters -----------------------------------------------------------------------

    def _agent_list(self, agent_ids: Any) -> list:
        if agent_ids is None or (isinstance(agent_ids, Collection) and not agent_ids):
            return list(self.agent_episodes)  # (an empty collection: all agents, as RLlib)
        if isinstance(agent_ids, str) or not isinstance(agent_ids, Collection):
            agent_ids = [agent_ids]
        return [a for a in agent_ids if a in self.agent_episodes]

    def _positions(self, indices: Any, nial: bool, out_ok: bool, n_items: int) -> Any:
        """Env-step ``indices`` resolved to map positions (``_OUT`` where out of range if
        ``out_ok``, else ``IndexError``)."""
        if (
            isinstance(indices, slice)
            and indices.start is not None
            and indices.start == indices.stop
        ):
            return []  # an empty slice selects no env step, in range or not
        buf = InfiniteLookbackBuffer(list(range(n_items)), self._len_lookback_buffers)
        return buf.get(indices, neg_index_as_lookback=nial, fill=_OUT if out_ok else None)

    def _get(
        self,
        what: str,
        key: Any,
        indices: Any,
        agent_ids: Any,
        env_steps: bool,
        nial: bool,
        fill: Any,
        one_hot: bool,
        return_list: bool,
    ) -> Any:
        if return_list and not env_steps:
            raise ValueError(
                f"`MultiAgentEpisode.get_{what}()` can't be called with both `env_steps=False` "
                "and `return_list=True`!"
            )
        agents = self._agent_list(agent_ids)
        if not env_steps:
            return self._get_agent_steps(what, key, indices, agents, nial, fill, one_hot)
        if not agents:  # (indices are checked against the agents' maps: none, no error)
            return [] if return_list else {}
        per_step = what in ("observations", "infos")
        n_items = self._map_len() - (0 if per_step else 1)
        # (per-step lists treat an index outside the data as a step without data)
        pos = self._positions(indices, nial, fill is not None or return_list, n_items)
        scalar = not isinstance(pos, list)
        positions = [pos] if scalar else pos
        values = {a: self._agent_values(what, key, a, positions, fill, one_hot) for a in agents}
        if return_list:
            return [
                {a: v[i] for a, v in values.items() if v[i] is not _OUT}
                for i in range(len(positions))
            ]
        out = {}
        for a, vals in values.items():
            kept = [v for v in vals if v is not _OUT]
            if scalar:
                if kept:
                    out[a] = kept[0]
            elif kept:
                sa_buf = self._column(a, what, key)
                out[a] = batch(kept) if sa_buf is not None and sa_buf.finalized else kept
        return out

    def _column(self, aid: Any, what: str, key: Any) -> InfiniteLookbackBuffer | None:
        sa = self.agent_episodes[aid]
        if what == "extra_model_outputs":
            return sa.extra_model_outputs.get(key)
        return getattr(sa, what)

    def _hanging(self, aid: Any, what: str, key: Any) -> Any:
        if aid not in self._hanging_actions_end:
            return _OUT
        if what == "actions":
            return self._hanging_actions_end[aid]
        if what == "rewards":
            return self._hanging_rewards_end.get(aid, 0.0)
        if what == "extra_model_outputs":
            return self._hanging_extra_model_outputs_end.get(aid, {}).get(key, _OUT)
        return _OUT

    def _agent_values(
        self, what: str, key: Any, aid: Any, positions: list, fill: Any, one_hot: bool
    ) -> list:
        m = self.env_t_to_agent_t[aid]
        buf = self._column(aid, what, key)
        hanging = self._hanging(aid, what, key)
        t0 = self.agent_t_started.get(aid, 0)
        filler = None
        out = []
        for p in positions:
            v = _OUT
            agent_t = m.data[p] if p is not _OUT and 0 <= p < len(m.data) else SKIP
            if agent_t != SKIP:
                assert isinstance(agent_t, int)
                lb = (
                    buf.lookback
                    if buf is not None
                    else self.agent_episodes[aid].observations.lookback
                )
                q = agent_t - t0 + lb
                n = buf.len_incl_lookback() if buf is not None else 0
                if buf is not None and 0 <= q < n:
                    v = buf._item_at(q, None, one_hot)
                elif q == n and hanging is not _OUT:
                    v = _like_buffer(buf, hanging, one_hot)
            if v is _OUT and fill is not None:
                if filler is None:
                    ref = buf if buf is not None else InfiniteLookbackBuffer()
                    filler = ref._fill_item(fill, one_hot)
                v = filler
            out.append(v)
        return out

    def _get_agent_steps(
        self, what: str, key: Any, indices: Any, agents: list, nial: bool, fill: Any, one_hot: bool
    ) -> dict:
        out = {}
        for a in agents:
            buf = self._column(a, what, key)
            hanging = self._hanging(a, what, key)
            if buf is None:
                if hanging is _OUT:
                    continue
                buf = InfiniteLookbackBuffer([])
            if indices is not None and hanging is not _OUT:
                buf = _with_item(buf, hanging)
            kwargs = (
                {"one_hot_discrete": one_hot}
                if what not in ("rewards", "infos", "extra_model_outputs")
                else {}
            )
            value = buf.get(indices, neg_index_as_lookback=nial, fill=fill, **kwargs)
            if isinstance(value, list) and not value:
                continue  # no data in range: the agent is left out (as RLlib does)
            out[a] = value
        return out

    def get_observations(
        self,
        indices: Any = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        return_list: bool = False,
    ) -> Any:
        return self._get(
            "observations",
            None,
            indices,
            agent_ids,
            env_steps,
            neg_index_as_lookback,
            fill,
            one_hot_discrete,
            return_list,
        )

    def get_infos(
        self,
        indices: Any = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: bool = False,
    ) -> Any:
        return self._get(
            "infos",
            None,
            indices,
            agent_ids,
            env_steps,
            neg_index_as_lookback,
            fill,
            False,
            return_list,
        )

    def get_actions(
        self,
        indices: Any = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        return_list: bool = False,
    ) -> Any:
        return self._get(
            "actions",
            None,
            indices,
            agent_ids,
            env_steps,
            neg_index_as_lookback,
            fill,
            one_hot_discrete,
            return_list,
        )

    def get_rewards(
        self,
        indices: Any = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: bool = False,
    ) -> Any:
        return self._get(
            "rewards",
            None,
            indices,
            agent_ids,
            env_steps,
            neg_index_as_lookback,
            fill,
            False,
            return_list,
        )

    def get_extra_model_outputs(
        self,
        key: str | None = None,
        indices: Any = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: bool = False,
    ) -> Any:
        """Extra model outputs: ``{agent: values}`` for ``key``, ``{agent: {key: values}}``
        for all keys."""
        if key is not None:
            return self._get(
                "extra_model_outputs",
                key,
                indices,
                agent_ids,
                env_steps,
                neg_index_as_lookback,
                fill,
                False,
                return_list,
            )
        keys: dict[str, None] = {}
        for a in self._agent_list(agent_ids):
            keys.update((k, None) for k in self.agent_episodes[a].extra_model_outputs)
            keys.update((k, None) for k in self._hanging_extra_model_outputs_end.get(a, {}))
        per_key = {
            k: self._get(
                "extra_model_outputs",
                k,
                indices,
                agent_ids,
                env_steps,
                neg_index_as_lookback,
                fill,
                False,
                return_list,
            )
            for k in keys
        }
        if return_list:
            steps = len(next(iter(per_key.values()))) if per_key else 0
            return [
                {
                    a: {k: per_key[k][i][a] for k in keys if a in per_key[k][i]}
                    for a in {a for k in keys for a in per_key[k][i]}
                }
                for i in range(steps)
            ]
        out: dict[Any, dict] = {}
        for k, d in per_key.items():
            for a, v in d.items():
                out.setdefault(a, {})[k] = v
        return out

    # -- setters (agent steps, delegated to the agents' episodes) ------------------------

    def _set(self, name: str, new_data: dict, **kw: Any) -> None:
        for aid, data in new_data.items():
            if aid not in self.agent_episodes:
                raise KeyError(
                    f"unknown agent {aid!r}; this episode has "
                    f"{sorted(map(str, self.agent_episodes))}"
                )
            getattr(self.agent_episodes[aid], name)(new_data=data, **kw)

    def set_observations(
        self, *, new_data: dict, at_indices: Any = None, neg_index_as_lookback: bool = False
    ) -> None:
        self._set(
            "set_observations",
            new_data,
            at_indices=at_indices,
            neg_index_as_lookback=neg_index_as_lookback,
        )

    def set_actions(
        self, *, new_data: dict, at_indices: Any = None, neg_index_as_lookback: bool = False
    ) -> None:
        self._set(
            "set_actions",
            new_data,
            at_indices=at_indices,
            neg_index_as_lookback=neg_index_as_lookback,
        )

    def set_rewards(
        self, *, new_data: dict, at_indices: Any = None, neg_index_as_lookback: bool = False
    ) -> None:
        self._set(
            "set_rewards",
            new_data,
            at_indices=at_indices,
            neg_index_as_lookback=neg_index_as_lookback,
        )

    def set_extra_model_outputs(
        self,
        *,
        key: str,
        new_data: dict,
        at_indices: Any = None,
        neg_index_as_lookback: bool = False,
    ) -> None:
        self._set(
            "set_extra_model_outputs",
            new_data,
            key=key,
            at_indices=at_indices,
            neg_index_as_lookback=neg_index_as_lookback,
        )

    # -- counters, returns, conversion ---------------------------------------------------

    def __len__(self) -> int:
        return self.env_t - self.env_t_started

    def env_steps(self) -> int:
        return len(self)

    def agent_steps(self) -> int:
        """Completed agent steps (hanging ones excluded)."""
        return sum(len(sa) for sa in self.agent_episodes.values())

    def get_return(self, include_hanging_rewards: bool = False) -> float:
        ret = sum(sa.get_return() for sa in self.agent_episodes.values())
        if include_hanging_rewards:
            ret += sum(self._hanging_rewards_begin.values()) + sum(
                self._hanging_rewards_end.values()
            )
        return ret

    def get_duration_s(self) -> float:
        if self._start_time is None:
            return 0.0
        return (self._last_step_time or self._start_time) - self._start_time

    @property
    def is_numpy(self) -> bool:
        """All agents with at least one step are numpy'ized."""
        stepped = [sa for sa in self.agent_episodes.values() if len(sa) > 0]
        return bool(stepped) and all(sa.is_numpy for sa in stepped)

    is_finalized = is_numpy

    def to_numpy(self) -> MultiAgentEpisode:
        for sa in self.agent_episodes.values():
            sa.to_numpy()
        return self

    finalize = to_numpy

    def get_sample_batch(self) -> Any:
        """``MultiAgentBatch`` keyed by agent id (as RLlib's), ``env_steps = len(self)``."""
        from jaxsampler.episodes.batch import MultiAgentBatch

        return MultiAgentBatch(
            {a: sa.get_sample_batch() for a, sa in self.agent_episodes.items() if len(sa) > 0},
            len(self),
        )

    # -- chunks --------------------------------------------------------------------------

    def cut(self, len_lookback_buffer: int = 0) -> MultiAgentEpisode:
        """The successor chunk (same ``id_``, ``len == 0``, ``env_t_started = self.env_t``)
        with ``len_lookback_buffer`` env steps of lookback, raised so that every hanging
        agent's last observation is inside (its step then completes in the successor).
        Done agents are not carried over."""
        if self.is_done:
            raise RuntimeError(
                "Can't call `MultiAgentEpisode.cut()` when the episode is already done!"
            )
        n = int(len_lookback_buffer)
        if n < 0:
            raise ValueError(f"len_lookback_buffer must be >= 0, got {n}")
        last = self._map_len() - 1
        for aid in self._hanging_actions_end:
            data = self.env_t_to_agent_t[aid].data
            real = [i for i, v in enumerate(data) if v != SKIP]
            if real:
                n = max(n, last - real[-1])
        n = min(n, last)
        active = [a for a, sa in self.agent_episodes.items() if not sa.is_done]
        keep = lambda steps: [{a: v for a, v in d.items() if a in active} for d in steps]
        observations = keep(self.get_observations(slice(-n - 1, None), return_list=True))
        if n > 0:
            actions = keep(self.get_actions(slice(-n, None), return_list=True))
            rewards = keep(self.get_rewards(slice(-n, None), return_list=True))
            extras = keep(self.get_extra_model_outputs(None, slice(-n, None), return_list=True))
        else:
            actions, rewards, extras = [], [], []
        successor = MultiAgentEpisode(
            self.id_,
            observations=observations,
            observation_space=self.observation_space,
            infos=keep(self.get_infos(slice(-n - 1, None), return_list=True)),
            actions=actions,
            action_space=self.action_space,
            rewards=rewards,
            extra_model_outputs=extras,
            env_t_started=self.env_t,
            agent_t_started={a: self.agent_episodes[a].t for a in active},
            len_lookback_buffer="auto",
            agent_episode_ids={a: sa.id_ for a, sa in self.agent_episodes.items()},
            agent_module_ids=self.agent_to_module_mapping,
            agent_to_module_mapping_fn=self.agent_to_module_mapping_fn,
        )
        successor.custom_data = copy.deepcopy(self.custom_data)
        if self.is_numpy:
            for sa in successor.agent_episodes.values():
                sa.observations.finalize()
                if len(sa.rewards.data):
                    sa.to_numpy()
        return successor

    def slice(self, slice_: slice, *, len_lookback_buffer: int | None = None) -> MultiAgentEpisode:
        """A new episode over env steps ``slice_`` (clipped to ``[0, len]``, step 1), with
        ``len_lookback_buffer`` env steps of lookback (default: this one's). Agents keep
        their done flags only if the slice ends where this episode ends."""
        if slice_.step not in (None, 1):
            raise ValueError("MultiAgentEpisode.slice() supports step 1 only")
        n = len(self)
        start = (
            0 if slice_.start is None else (slice_.start + n if slice_.start < 0 else slice_.start)
        )
        stop = n if slice_.stop is None else (slice_.stop + n if slice_.stop < 0 else slice_.stop)
        start, stop = max(0, min(start, n)), max(0, min(stop, n))
        stop = max(stop, start)
        lb_old = self._len_lookback_buffers
        lb = lb_old if len_lookback_buffer is None else int(len_lookback_buffer)
        lb = min(lb, lb_old + start)
        first = start - lb  # env step (episode-relative) of the first observation kept
        obs_idx = slice(first, stop + 1)
        act_idx = slice(first, stop)
        kw = {"neg_index_as_lookback": True, "return_list": True}
        done_here = stop == n
        agent_t_started = {}
        for aid, m in self.env_t_to_agent_t.items():
            upto = [v for v in m.data[: lb_old + start + 1] if v != SKIP]
            later = [v for v in m.data[lb_old + start + 1 :] if v != SKIP]
            if upto or later:
                agent_t_started[aid] = upto[-1] if upto else later[0]
        out = MultiAgentEpisode(
            self.id_,
            observations=self.get_observations(obs_idx, **kw),
            observation_space=self.observation_space,
            infos=self.get_infos(obs_idx, **kw),
            actions=self.get_actions(act_idx, **kw) if stop > first else [],
            action_space=self.action_space,
            rewards=self.get_rewards(act_idx, **kw) if stop > first else [],
            extra_model_outputs=self.get_extra_model_outputs(None, act_idx, **kw)
            if stop > first
            else [],
            terminateds={
                **{a: sa.is_terminated for a, sa in self.agent_episodes.items()},
                ALL_AGENTS: self.is_terminated,
            }
            if done_here
            else False,
            truncateds={
                **{a: sa.is_truncated for a, sa in self.agent_episodes.items()},
                ALL_AGENTS: self.is_truncated,
            }
            if done_here
            else False,
            env_t_started=self.env_t_started + start,
            agent_t_started=agent_t_started,
            len_lookback_buffer=lb,
            agent_episode_ids={a: sa.id_ for a, sa in self.agent_episodes.items()},
            agent_module_ids=self.agent_to_module_mapping,
            agent_to_module_mapping_fn=self.agent_to_module_mapping_fn,
        )
        if self.is_numpy:
            out.to_numpy()
        return out

    def __getitem__(self, item: Any) -> MultiAgentEpisode:
        if isinstance(item, slice):
            return self.slice(item)
        raise NotImplementedError(
            f"{type(self).__name__} does not support getting item '{item}'! Only slice objects "
            "allowed with the syntax: `episode[a:b]`."
        )

    def concat_episode(self, other: MultiAgentEpisode) -> None:
        """Appends ``other``, the next chunk of this episode (``other.env_t_started ==
        self.env_t``, same ``id_``). Agents done here are skipped; agents new in ``other``
        are added; the hanging caches become ``other``'s (steps that ``other`` completed
        are no longer hanging)."""
        if other.id_ != self.id_:
            raise ValueError(
                f"cannot concat episodes with different ids ({self.id_} vs {other.id_})"
            )
        if self.is_done:
            raise ValueError("cannot concat onto a done episode")
        if self.env_t != other.env_t_started:
            raise ValueError(
                f"chunks do not meet: self.env_t={self.env_t}, "
                f"other.env_t_started={other.env_t_started}"
            )
        n_self = self._map_len()
        olb = other._len_lookback_buffers
        for aid, osa in other.agent_episodes.items():
            om = other.env_t_to_agent_t[aid]
            sa = self.agent_episodes.get(aid)
            if sa is not None and sa.is_done:
                continue
            if sa is None:
                self.agent_episodes[aid] = osa.slice(slice(0, len(osa)), len_lookback_buffer=0)
                self.agent_t_started[aid] = osa.t_started
                self._agent_episode_ids[aid] = osa.id_
                self._agent_to_module_mapping.setdefault(aid, osa.module_id)
                m = self.env_t_to_agent_t.get(aid)
                if m is not None:  # pruned here (no step yet): its map goes on
                    m.data = list(m.data) + list(om.data[olb + 1 :])
                else:
                    self.env_t_to_agent_t[aid] = InfiniteLookbackBuffer(
                        [SKIP] * (n_self - 1) + list(om.data[olb:]), self._len_lookback_buffers
                    )
                continue
            if len(osa) > 0:
                for k, buf in osa.extra_model_outputs.items():
                    if k not in sa.extra_model_outputs and sa.rewards.len_incl_lookback() == 0:
                        sa.extra_model_outputs[k] = InfiniteLookbackBuffer(_empty_like(buf), 0)
                sa.concat_episode(osa.slice(slice(0, len(osa)), len_lookback_buffer=0))
            self.env_t_to_agent_t[aid].data = list(self.env_t_to_agent_t[aid].data) + list(
                om.data[olb + 1 :]
            )
        for aid, m in self.env_t_to_agent_t.items():  # agents absent from other: no observation
            if aid not in other.agent_episodes:
                m.data = list(m.data) + [SKIP] * (other.env_t - other.env_t_started)
        self._hanging_actions_end = dict(other._hanging_actions_end)
        self._hanging_extra_model_outputs_end = defaultdict(
            dict, copy.deepcopy(dict(other._hanging_extra_model_outputs_end))
        )
        self._hanging_rewards_end = defaultdict(float, other._hanging_rewards_end)
        self.env_t = other.env_t
        self.is_terminated, self.is_truncated = other.is_terminated, other.is_truncated
        self._last_step_time = other._last_step_time

    # -- misc ----------------------------------------------------------------------------

    def print(self) -> None:
        """Prints which agents had an observation at which env step."""
        n = self._map_len() - self._len_lookback_buffers
        width = max([len(str(a)) for a in self.env_t_to_agent_t] + [2])
        print(("ts".ljust(width) + "".join(f"{t:>3} " for t in range(n))).rstrip())
        for aid, m in self.env_t_to_agent_t.items():
            cells = m.data[self._len_lookback_buffers :]
            print(
                (
                    str(aid).ljust(width) + "".join("   x" if v != SKIP else "    " for v in cells)
                ).rstrip()
            )

    def get_state(self) -> dict[str, Any]:
        return copy.deepcopy({k: v for k, v in self.__dict__.items()})

    @staticmethod
    def from_state(state: dict[str, Any]) -> MultiAgentEpisode:
        ep = MultiAgentEpisode.__new__(MultiAgentEpisode)
        ep.__dict__.update(copy.deepcopy(state))
        return ep

    def __repr__(self) -> str:
        returns = {a: sa.get_return() for a, sa in self.agent_episodes.items()}
        return f"MAEps(len={len(self)} done={self.is_done} Rs={returns} id_={self.id_})"


def _with_item(buf: InfiniteLookbackBuffer, item: Any) -> InfiniteLookbackBuffer:
    """A copy of ``buf`` with ``item`` appended (``buf`` itself is unchanged)."""
    out = copy.copy(buf)
    if not buf.finalized:
        out.data = list(buf.data)
    out.append(item)
    return out


def _like_buffer(buf: InfiniteLookbackBuffer | None, item: Any, one_hot: bool) -> Any:
    """A cached (hanging) item as ``buf`` would return it: numpy scalars/arrays in numpy mode."""
    if buf is None:
        return item
    if buf.finalized:
        item = (
            tree_map(lambda x: np.asarray(x)[()], item)
            if isinstance(item, (dict, tuple))
            else np.asarray(item)[()]
        )
    return buf._convert(item, one_hot) if one_hot else item
