"""Per-agent book-keeping of :class:`~jaxsampler.episodes.multi_agent.MultiAgentEpisode`.

The attributes every part of the class shares, the agent-to-module mapping, the creation
of agents' episodes, their ``env_t_to_agent_t`` maps and hanging caches, and the trusted
fast path the samplers build episodes with. Import the public names from
:mod:`jaxsampler.episodes.multi_agent`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

from jaxsampler.episodes.ids import random_episode_id
from jaxsampler.episodes.lookback import InfiniteLookbackBuffer
from jaxsampler.episodes.single_agent import SingleAgentEpisode

__all__ = [
    "SKIP",
    "MultiAgentEnvError",
    "StaticModuleMapping",
    "default_agent_to_module_mapping_fn",
]

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


_T = TypeVar("_T")


class _LazyField(Generic[_T]):
    """A per-agent attribute of a multi-agent episode, kept in the instance ``__dict__``
    under its own name (so states and pickles look as for a plain attribute). An episode
    made by ``MultiAgentEpisode.lazy`` builds all of them on the first read or write of
    any of them."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, episode: None, owner: type) -> _LazyField[_T]: ...
    @overload
    def __get__(self, episode: object, owner: type) -> _T: ...
    def __get__(self, episode: object | None, owner: type) -> Any:
        if episode is None:
            return self
        d = episode.__dict__
        if "_lazy" in d:
            _build_lazy(episode)
        return d[self._name]

    def __set__(self, episode: object, value: _T) -> None:
        d = episode.__dict__
        if "_lazy" in d:
            _build_lazy(episode)
        d[self._name] = value


class _LazyMaps(_LazyField[_T]):
    """``env_t_to_agent_t``: a :class:`_LazyField` whose maps a lazy episode's build may
    leave to a later builder, ``fill(maps)`` stored under ``_lazy_maps``, run on the first
    access to the maps themselves (readers of agents' episodes never need them)."""

    def __get__(self, episode: object | None, owner: type) -> Any:
        value = super().__get__(episode, owner)
        if episode is not None and "_lazy_maps" in episode.__dict__:
            _build_maps(episode)  # (fills ``value`` in place)
        return value

    def __set__(self, episode: object, value: _T) -> None:
        super().__set__(episode, value)
        episode.__dict__.pop("_lazy_maps", None)  # (replaced whole)


def _build_maps(episode: Any) -> None:
    """Runs a lazy episode's pending maps builder (on an exception it stays pending)."""
    d = episode.__dict__
    fill = d.pop("_lazy_maps")
    try:
        fill(d["env_t_to_agent_t"])
    except BaseException:
        d["_lazy_maps"] = fill
        raise


def _build_lazy(episode: Any) -> None:
    """Builds a lazy episode: empty per-agent state, then its ``build(episode, key)``
    fills it (on an exception the episode stays lazy)."""
    d = episode.__dict__
    build, key = d.pop("_lazy")
    try:
        episode._init_agent_state()
        d["_len_lookback_buffers"] = 0
        build(episode, key)
    except BaseException:
        d["_lazy"] = (build, key)
        raise
    # the attribute order of a constructed episode (states and pickles compare alike)
    ordered = {k: d[k] for k in _ATTR_ORDER if k in d}
    ordered.update((k, v) for k, v in d.items() if k not in ordered)
    d.clear()
    d.update(ordered)


_ATTR_ORDER = (
    "id_",
    "agent_to_module_mapping_fn",
    "_agent_to_module_mapping",
    "observation_space",
    "action_space",
    "env_t_started",
    "env_t",
    "agent_t_started",
    "agent_episodes",
    "env_t_to_agent_t",
    "_agent_episode_ids",
    "_hanging_actions_end",
    "_hanging_extra_model_outputs_end",
    "_hanging_rewards_end",
    "_hanging_rewards_begin",
    "is_terminated",
    "is_truncated",
    "_len_lookback_buffers",
    "custom_data",
    "_start_time",
    "_last_step_time",
)


# Pickles, reprs and the docs name these where users import them from.
for _public in (MultiAgentEnvError, StaticModuleMapping, default_agent_to_module_mapping_fn):
    _public.__module__ = "jaxsampler.episodes.multi_agent"
del _public


class _AgentBookkeeping:
    """The state of a multi-agent episode (set by its constructor) and its per-agent
    book-keeping: modules, agents' episodes, their env-step maps and hanging caches."""

    id_: str
    agent_to_module_mapping_fn: Callable[[Any, Any], Any]
    _agent_to_module_mapping: dict[Any, Any]
    observation_space: Any
    action_space: Any
    env_t_started: int
    env_t: int
    # The per-agent state: built on first access for a lazy episode.
    agent_t_started: _LazyField[defaultdict[Any, int]] = _LazyField()
    agent_episodes: _LazyField[dict[Any, SingleAgentEpisode]] = _LazyField()
    env_t_to_agent_t: _LazyMaps[defaultdict[Any, InfiniteLookbackBuffer]] = _LazyMaps()
    _agent_episode_ids: _LazyField[dict[Any, str]] = _LazyField()
    _hanging_actions_end: _LazyField[dict[Any, Any]] = _LazyField()
    _hanging_extra_model_outputs_end: _LazyField[defaultdict[Any, dict]] = _LazyField()
    _hanging_rewards_end: _LazyField[defaultdict[Any, float]] = _LazyField()
    _hanging_rewards_begin: _LazyField[defaultdict[Any, float]] = _LazyField()
    _len_lookback_buffers: _LazyField[int] = _LazyField()
    is_terminated: bool
    is_truncated: bool
    custom_data: dict[str, Any]
    _start_time: float | None
    _last_step_time: float | None

    def _init_agent_state(
        self, agent_t_started: dict | None = None, agent_episode_ids: dict | None = None
    ) -> None:
        """Sets the per-agent state of an episode without agents yet."""
        d = self.__dict__
        d["agent_t_started"] = defaultdict(int, agent_t_started or {})
        d["agent_episodes"] = {}
        d["env_t_to_agent_t"] = defaultdict(InfiniteLookbackBuffer)
        d["_agent_episode_ids"] = dict(agent_episode_ids or {})
        d["_hanging_actions_end"] = {}
        d["_hanging_extra_model_outputs_end"] = defaultdict(dict)
        d["_hanging_rewards_end"] = defaultdict(float)
        d["_hanging_rewards_begin"] = defaultdict(float)

    def _ensure_built(self) -> None:
        """Builds a lazy episode's per-agent state now (no-op otherwise)."""
        if "_lazy" in self.__dict__:
            _build_lazy(self)
        if "_lazy_maps" in self.__dict__:
            _build_maps(self)

    @property
    def is_done(self) -> bool:
        """Like RLlib's: whether the episode is terminated or truncated."""
        return bool(self.is_terminated or self.is_truncated)

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
        """Like RLlib's: the agent-to-module ids mapped so far (a copy)."""
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
        """Like RLlib's: the ids of the agents with an episode in this chunk."""
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
        """Length of the ``env_t_to_agent_t`` maps: every env step's observation, lookback
        included."""
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

    def _drop_agent(self, aid: Any) -> None:
        """Forgets ``aid`` entirely (episode, map and caches)."""
        for d in (
            self.agent_episodes,
            self.env_t_to_agent_t,
            self._hanging_actions_end,
            self._hanging_extra_model_outputs_end,
            self._hanging_rewards_end,
            self._hanging_rewards_begin,
        ):
            d.pop(aid, None)
