"""``SingleAgentEpisode``: one agent's episode chunk, RLlib-compatible.

Same constructor arguments, methods, index semantics and errors as RLlib's class of that
name in ray 2.60 (its documentation and recorded behaviour), written anew. Every
per-timestep column is an :class:`InfiniteLookbackBuffer`; episodes built by
:class:`jaxsampler.Sampler` hold numpy views into one bulk host copy of the rollout
buffers.

Where RLlib 2.60 has a bug that this class does not copy, a note "RLlib deviation (En)"
sits at the code concerned, numbered as ``tests/sa_differential.py`` excuses them (the
buffers' own, (B1)-(B9), are in :mod:`jaxsampler.episodes.lookback`).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxsampler.episodes._sa_views import (
    EpisodeViews,
    LazyColumn,
    as_buffer,
    borrow,
    contains,
    empty_like,
    reward_space,
    view_episodes,
)
from jaxsampler.episodes._tree import data_len, leaves, tree_map
from jaxsampler.episodes.ids import random_episode_id
from jaxsampler.episodes.lookback import InfiniteLookbackBuffer

_empty_like = empty_like  # (multi_agent.py imports it from here)

__all__ = ["EpisodeBuffers", "SingleAgentEpisode", "reward_space"]

EpisodeBuffers = tuple[
    InfiniteLookbackBuffer,  # observations
    InfiniteLookbackBuffer,  # infos
    InfiniteLookbackBuffer,  # actions
    InfiniteLookbackBuffer,  # rewards
    dict[str, InfiniteLookbackBuffer],  # extra model outputs
]
"""The buffers of an episode, as :meth:`SingleAgentEpisode.lazy`'s ``build`` returns them."""


class SingleAgentEpisode:
    """A (chunk of an) episode of one agent: observations, actions, rewards, infos, extras.

    Takes RLlib 2.60's constructor arguments with their meaning (``id_``, the five columns,
    the spaces, ``terminated`` / ``truncated``, ``t_started``, ``len_lookback_buffer``,
    ``agent_id`` / ``module_id`` / ``multi_agent_episode_id``). ``observations`` has one
    item more than ``actions`` / ``rewards`` / each extra model output; the first
    ``len_lookback_buffer`` (``"auto"``: all given) items of each column are lookback.
    """

    __slots__ = (
        "id_",
        "agent_id",
        "module_id",
        "multi_agent_episode_id",
        "_observations",
        "_infos",
        "_actions",
        "_rewards",
        "_extra_model_outputs",
        "_lazy",
        "_view",
        "_key",
        "is_terminated",
        "is_truncated",
        "t_started",
        "t",
        "custom_data",
        "_observation_space",
        "_action_space",
        "_start_time",
        "_last_step_time",
    )
    _lazy: tuple[Callable[[Any], EpisodeBuffers], Any] | None  # see lazy()
    _view: EpisodeViews | None  # see from_views(); _key: this episode's key in it
    _key: Any
    _observations: InfiniteLookbackBuffer | None  # (None: not built yet, see LazyColumn)
    _infos: InfiniteLookbackBuffer | None
    _actions: InfiniteLookbackBuffer | None
    _rewards: InfiniteLookbackBuffer | None
    _extra_model_outputs: dict[str, InfiniteLookbackBuffer] | None

    @classmethod
    def trusted(
        cls,
        id_: str,
        *,
        observations: InfiniteLookbackBuffer,
        infos: InfiniteLookbackBuffer,
        actions: InfiniteLookbackBuffer,
        rewards: InfiniteLookbackBuffer,
        extra_model_outputs: dict[str, InfiniteLookbackBuffer],
        observation_space: Any,
        action_space: Any,
        terminated: bool,
        truncated: bool,
        t_started: int,
        agent_id: Any = None,
        module_id: Any = None,
        multi_agent_episode_id: str | None = None,
        t: int | None = None,
        custom_data: dict[str, Any] | None = None,
        step_times: tuple[float | None, float | None] = (None, None),
    ) -> SingleAgentEpisode:
        """An episode over prebuilt, already-validated buffers (RLlib's constructor accepts
        prebuilt lookback buffers too) without the constructor's checks: the samplers' and
        converters' fast path. ``t`` must be ``t_started + len(rewards)``; computed when not
        given. ``custom_data`` is taken as is (not copied); ``step_times`` is
        :attr:`step_times`.

        Unlike RLlib (not a bug fix): the samplers' rewards keep the env's float32 dtype
        (RLlib's are float64 once numpy'ized); :meth:`get_return` sums in float64."""
        ep = cls.__new__(cls)
        ep._lazy = ep._view = ep._key = None
        ep.id_ = id_
        ep.agent_id, ep.module_id, ep.multi_agent_episode_id = (
            agent_id,
            module_id,
            multi_agent_episode_id,
        )
        ep._observation_space, ep._action_space = observation_space, action_space
        ep._observations, ep._infos, ep._actions, ep._rewards = (
            observations,
            infos,
            actions,
            rewards,
        )
        ep._extra_model_outputs = extra_model_outputs
        ep.is_terminated, ep.is_truncated = terminated, truncated
        ep.t_started = t_started
        ep.t = t_started + len(rewards) if t is None else t
        ep.custom_data = {} if custom_data is None else custom_data
        ep._start_time, ep._last_step_time = step_times
        return ep

    @classmethod
    def lazy(
        cls,
        id_: str,
        build: Callable[[Any], EpisodeBuffers],
        key: Any,
        *,
        observation_space: Any,
        action_space: Any,
        terminated: bool,
        truncated: bool,
        t_started: int,
        t: int,
    ) -> SingleAgentEpisode:
        """Like :meth:`trusted`, but the buffers are built by ``build(key)`` on first access
        to any of them (the samplers make thousands of episodes per call; most users read
        few of them). ``build`` returns ``(observations, infos, actions, rewards,
        extra_model_outputs)`` as :meth:`trusted` takes them; ``t`` must be
        ``t_started + len(rewards)``."""
        ep = cls.__new__(cls)
        ep._lazy, ep._view, ep._key = (build, key), None, None
        ep._observations = ep._infos = ep._actions = ep._rewards = None
        ep._extra_model_outputs = None
        ep.id_ = id_
        ep.agent_id = ep.module_id = ep.multi_agent_episode_id = None
        ep._observation_space, ep._action_space = observation_space, action_space
        ep.is_terminated, ep.is_truncated = terminated, truncated
        ep.t_started, ep.t = t_started, t
        ep.custom_data = {}
        ep._start_time = ep._last_step_time = None
        return ep

    @classmethod
    def from_views(
        cls,
        views: EpisodeViews,
        ids: list[str],
        terminated: list[bool],
        truncated: list[bool],
        t_started: list[int],
        t: list[int],
        observation_space: Any,
        action_space: Any,
    ) -> list[SingleAgentEpisode]:
        """One episode per entry of the lists (episode ``i`` is ``views``' key ``i``), each
        a light view: a column is built (``views.column``) on its first access, and the
        default getters (``get_observations()``, ``get_actions()``, ``get_rewards()``,
        ``get_extra_model_outputs(key)``) slice the shared data without building it. The
        columns are borrowed buffers: writing to an episode copies its data first, so it
        never changes another episode or the shared data. ``t[i]`` must be
        ``t_started[i]`` plus the episode's steps."""
        fields = zip(ids, terminated, truncated, t_started, t)
        return view_episodes(cls, views, fields, observation_space, action_space)

    def _build_column(self, name: str) -> Any:
        """Builds column ``name`` of a lazy episode (all of them for a :meth:`lazy` one)
        and returns it."""
        if self._view is not None:
            value = self._view.column(self._key, name)
            setattr(self, "_" + name, value)
            return value
        if self._lazy is not None:
            self._build()
        return getattr(self, "_" + name)

    def _build(self) -> None:
        """Builds the buffers of a :meth:`lazy` episode."""
        assert self._lazy is not None
        build, key = self._lazy
        # Build first, publish after: another thread that reads meanwhile builds the same
        # views again (harmless), and an exception inside build() leaves the episode lazy.
        buffers = build(key)
        (
            self._observations,
            self._infos,
            self._actions,
            self._rewards,
            self._extra_model_outputs,
        ) = buffers
        self._lazy = None

    # The columns: built on first access (read or write) for a lazy() / from_views() episode.
    observations: LazyColumn[InfiniteLookbackBuffer] = LazyColumn()
    infos: LazyColumn[InfiniteLookbackBuffer] = LazyColumn()
    actions: LazyColumn[InfiniteLookbackBuffer] = LazyColumn()
    rewards: LazyColumn[InfiniteLookbackBuffer] = LazyColumn()
    extra_model_outputs: LazyColumn[dict[str, InfiniteLookbackBuffer]] = LazyColumn()

    def __init__(
        self,
        id_: str | None = None,
        *,
        observations: list | InfiniteLookbackBuffer | None = None,
        observation_space: Any = None,
        infos: list | InfiniteLookbackBuffer | None = None,
        actions: list | InfiniteLookbackBuffer | None = None,
        action_space: Any = None,
        rewards: list | InfiniteLookbackBuffer | None = None,
        terminated: bool = False,
        truncated: bool = False,
        extra_model_outputs: dict[str, Any] | None = None,
        t_started: int | None = None,
        len_lookback_buffer: int | str = "auto",
        agent_id: Any = None,
        module_id: Any = None,
        multi_agent_episode_id: str | None = None,
    ):
        self._lazy = self._view = self._key = None
        self.id_ = id_ or random_episode_id()
        self.agent_id, self.module_id, self.multi_agent_episode_id = (
            agent_id,
            module_id,
            multi_agent_episode_id,
        )
        observations = [] if observations is None else observations
        rewards = [] if rewards is None else rewards
        actions = [] if actions is None else actions
        if infos is None:
            n_obs = (
                observations.len_incl_lookback()
                if isinstance(observations, InfiniteLookbackBuffer)
                else data_len(observations)
            )
            infos = [{} for _ in range(n_obs)]
        n_rewards = (
            rewards.len_incl_lookback()
            if isinstance(rewards, InfiniteLookbackBuffer)
            else data_len(rewards)
        )
        if len_lookback_buffer == "auto" or (
            isinstance(len_lookback_buffer, int) and len_lookback_buffer > n_rewards
        ):
            len_lookback_buffer = n_rewards
        if isinstance(len_lookback_buffer, str) or len_lookback_buffer < 0:
            raise ValueError(
                f"len_lookback_buffer must be 'auto' or an int >= 0, got {len_lookback_buffer!r}"
            )
        lb = int(len_lookback_buffer)
        self._observation_space, self._action_space = observation_space, action_space
        self.observations = as_buffer(observations, lb, observation_space)
        self.infos = as_buffer(infos, lb, None)
        self.actions = as_buffer(actions, lb, action_space)
        self.rewards = as_buffer(rewards, lb, reward_space())
        self.extra_model_outputs = {
            k: as_buffer(v, lb, None) for k, v in (extra_model_outputs or {}).items()
        }
        self.is_terminated, self.is_truncated = terminated, truncated
        self.t_started = t_started or 0
        self.t = len(self.rewards) + self.t_started
        self.custom_data: dict[str, Any] = {}
        self._start_time: float | None = None
        self._last_step_time: float | None = None
        self.validate()

    # -- spaces ----------------------------------------------------------------------

    @property
    def observation_space(self) -> Any:
        """Like RLlib's: the space of one observation (setting it sets the buffer's)."""
        return self._observation_space

    @observation_space.setter
    def observation_space(self, value: Any) -> None:
        self._observation_space = self.observations.space = value

    @property
    def action_space(self) -> Any:
        """Like RLlib's: the space of one action (setting it sets the buffer's)."""
        return self._action_space

    @action_space.setter
    def action_space(self, value: Any) -> None:
        self._action_space = self.actions.space = value

    # -- state flags -----------------------------------------------------------------

    @property
    def is_reset(self) -> bool:
        """Like RLlib's: whether the episode has an observation (beyond its lookback)."""
        return len(self.observations) > 0

    @property
    def is_done(self) -> bool:
        """Like RLlib's: whether the episode is terminated or truncated."""
        return bool(self.is_terminated or self.is_truncated)

    @property
    def is_numpy(self) -> bool:
        """Like RLlib's: whether the columns are numpy'ized (:meth:`to_numpy`)."""
        if self._rewards is None and self._view is not None:
            return True  # (views of numpy columns)
        return self.rewards.finalized

    is_finalized = is_numpy

    def validate(self) -> None:
        """Asserts that the columns' lengths (without lookback) agree."""
        n_obs, n_infos = len(self.observations), len(self.infos)
        lengths = (n_obs, n_infos, len(self.actions), len(self.rewards))
        assert n_obs == n_infos, lengths
        if n_obs > 0:
            assert n_obs == len(self.actions) + 1 == len(self.rewards) + 1, lengths
        for k, buf in self.extra_model_outputs.items():
            assert len(buf) == len(self.rewards), (k, len(buf), len(self.rewards))

    # -- stepping --------------------------------------------------------------------

    def add_env_reset(
        self, observation: Any, infos: dict | None = None, *, validate: bool = False
    ) -> None:
        """Like RLlib's: adds the first observation (and info) of the episode.

        Addition: ``validate=True`` checks the observation against the observation space
        first (``ValueError``, and the episode is left unchanged)."""
        assert not self.is_reset, "The episode is already reset."
        assert not self.is_done, "The episode is already done."
        assert self.t == self.t_started == 0, "add_env_reset needs t == t_started == 0."
        if validate and not contains(self.observation_space, observation):
            raise ValueError(
                f"observation {observation!r} is not in the observation space "
                f"{self.observation_space!r}"
            )
        self.observations.append(observation)
        self.infos.append({} if infos is None else infos)
        self._start_time = self._last_step_time = time.perf_counter()

    def add_env_step(
        self,
        observation: Any,
        action: Any,
        reward: float,
        infos: dict | None = None,
        *,
        terminated: bool = False,
        truncated: bool = False,
        extra_model_outputs: dict[str, Any] | None = None,
        validate: bool = False,
    ) -> None:
        """Like RLlib's: adds one env step, the action taken and the reward and observation
        that followed.

        Addition: ``validate=True`` checks the observation and the action against the
        spaces before anything is changed (``ValueError``, and the episode is left
        unchanged)."""
        assert not self.is_done, "The agent is already done: no data can be added to its episode."
        if validate:
            if not contains(self.observation_space, observation):
                raise ValueError(
                    f"observation {observation!r} is not in the observation space "
                    f"{self.observation_space!r}"
                )
            if not contains(self.action_space, action):
                raise ValueError(
                    f"action {action!r} is not in the action space {self.action_space!r}"
                )
        self.observations.append(observation)
        self.actions.append(action)
        self.rewards.append(reward)
        self.infos.append({} if infos is None else infos)
        for k, v in (extra_model_outputs or {}).items():
            if k in self.extra_model_outputs:
                self.extra_model_outputs[k].append(v)
            else:
                self.extra_model_outputs[k] = InfiniteLookbackBuffer([v])
        self.t += 1
        self.is_terminated, self.is_truncated = terminated, truncated
        self._last_step_time = time.perf_counter()

    # -- getters ---------------------------------------------------------------------

    def get_observations(
        self,
        indices: Any = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
    ) -> Any:
        """Like RLlib's: the observations at ``indices`` (see
        :meth:`InfiniteLookbackBuffer.get`: ``None`` is all, lookback excluded)."""
        view = self._view  # (fill and neg_index_as_lookback do not apply to indices=None)
        if (
            view is not None
            and indices is None
            and not one_hot_discrete
            and self._observations is None
        ):
            return view.observations(self._key)
        return self.observations.get(
            indices,
            neg_index_as_lookback=neg_index_as_lookback,
            fill=fill,
            one_hot_discrete=one_hot_discrete,
        )

    def get_infos(
        self, indices: Any = None, *, neg_index_as_lookback: bool = False, fill: Any = None
    ) -> Any:
        """Like RLlib's: the infos at ``indices`` (as in :meth:`get_observations`)."""
        return self.infos.get(indices, neg_index_as_lookback=neg_index_as_lookback, fill=fill)

    def get_actions(
        self,
        indices: Any = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
    ) -> Any:
        """Like RLlib's: the actions at ``indices`` (as in :meth:`get_observations`)."""
        view = self._view  # (fill and neg_index_as_lookback do not apply to indices=None)
        if view is not None and indices is None and not one_hot_discrete and self._actions is None:
            return view.actions(self._key)
        return self.actions.get(
            indices,
            neg_index_as_lookback=neg_index_as_lookback,
            fill=fill,
            one_hot_discrete=one_hot_discrete,
        )

    def get_rewards(
        self, indices: Any = None, *, neg_index_as_lookback: bool = False, fill: Any = None
    ) -> Any:
        """Like RLlib's: the rewards at ``indices`` (as in :meth:`get_observations`)."""
        if indices is None and self._rewards is None and self._view is not None:
            return self._view.rewards(self._key)
        return self.rewards.get(indices, neg_index_as_lookback=neg_index_as_lookback, fill=fill)

    def get_extra_model_outputs(
        self,
        key: str,
        indices: Any = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
    ) -> Any:
        """Like RLlib's: the extra model output ``key`` at ``indices`` (as in
        :meth:`get_observations`); ``KeyError`` for an unknown ``key``."""
        if indices is None and self._extra_model_outputs is None and self._view is not None:
            found = self._view.extra(self._key, key)
            if found is not None:
                return found
        if key not in self.extra_model_outputs:
            raise KeyError(
                f"no extra model output {key!r}; this episode has "
                f"{sorted(self.extra_model_outputs)}"
            )
        return self.extra_model_outputs[key].get(
            indices, neg_index_as_lookback=neg_index_as_lookback, fill=fill
        )

    # -- setters ---------------------------------------------------------------------

    def set_observations(
        self, *, new_data: Any, at_indices: Any = None, neg_index_as_lookback: bool = False
    ) -> None:
        """Like RLlib's: overwrites the observations at ``at_indices`` with ``new_data``
        (see :meth:`InfiniteLookbackBuffer.set`)."""
        self.observations.set(
            new_data, at_indices=at_indices, neg_index_as_lookback=neg_index_as_lookback
        )

    def set_actions(
        self, *, new_data: Any, at_indices: Any = None, neg_index_as_lookback: bool = False
    ) -> None:
        """Like RLlib's: overwrites the actions at ``at_indices`` with ``new_data``."""
        self.actions.set(
            new_data, at_indices=at_indices, neg_index_as_lookback=neg_index_as_lookback
        )

    def set_rewards(
        self, *, new_data: Any, at_indices: Any = None, neg_index_as_lookback: bool = False
    ) -> None:
        """Like RLlib's: overwrites the rewards at ``at_indices`` with ``new_data``."""
        self.rewards.set(
            new_data, at_indices=at_indices, neg_index_as_lookback=neg_index_as_lookback
        )

    def set_extra_model_outputs(
        self,
        *,
        key: str,
        new_data: Any,
        at_indices: Any = None,
        neg_index_as_lookback: bool = False,
    ) -> None:
        """Like RLlib's: overwrites the extra model output ``key`` at ``at_indices`` with
        ``new_data``; ``KeyError`` for an unknown ``key``."""
        if key not in self.extra_model_outputs:
            raise KeyError(
                f"no extra model output {key!r}; this episode has "
                f"{sorted(self.extra_model_outputs)}"
            )
        self.extra_model_outputs[key].set(
            new_data, at_indices=at_indices, neg_index_as_lookback=neg_index_as_lookback
        )

    # -- numpy'ize -------------------------------------------------------------------

    def to_numpy(self) -> SingleAgentEpisode:
        """Converts the columns (not infos) to numpy arrays; returns ``self``."""
        self.validate()
        self.observations.finalize()
        if len(self) > 0:
            self.actions.finalize()
            self.rewards.finalize()
            for buf in self.extra_model_outputs.values():
                buf.finalize()
        return self

    finalize = to_numpy

    # -- chunks ----------------------------------------------------------------------

    def cut(self, len_lookback_buffer: int = 0) -> SingleAgentEpisode:
        """The successor chunk: same ``id_``, ``len == 0``, ``t_started = self.t``, and the last
        ``len_lookback_buffer`` steps (clipped) as its lookback.

        RLlib deviation (E2): works on a numpy'ized episode with ``Dict`` observations
        (RLlib's fails). RLlib deviation (E3): works on a numpy'ized episode without
        observations (RLlib's constructor rejects the empty observation array)."""
        assert not self.is_done, "cannot cut() a done episode"
        assert len_lookback_buffer >= 0, "len_lookback_buffer must be >= 0"
        n = len_lookback_buffer
        tail = slice(-n, None) if n > 0 else None

        def steps(buf: InfiniteLookbackBuffer) -> Any:
            return buf.get(tail) if tail is not None else empty_like(buf)

        successor = SingleAgentEpisode(
            self.id_,
            observations=self.get_observations(slice(-n - 1, None)),
            observation_space=self.observation_space,
            infos=self.get_infos(slice(-n - 1, None)),
            actions=steps(self.actions),
            action_space=self.action_space,
            rewards=steps(self.rewards),
            extra_model_outputs={k: steps(v) for k, v in self.extra_model_outputs.items()},
            t_started=self.t,
            len_lookback_buffer="auto",
            agent_id=self.agent_id,
            module_id=self.module_id,
            multi_agent_episode_id=self.multi_agent_episode_id,
        )
        successor.custom_data = copy.deepcopy(self.custom_data)
        return borrow(successor)  # (its columns are views of this episode's)

    def slice(self, slice_: slice, *, len_lookback_buffer: int | None = None) -> SingleAgentEpisode:
        """This episode's timesteps ``slice_`` as a new episode: same id, ``t_started`` moved
        by the start, done flags only if it reaches the end, lookback ``len_lookback_buffer``.

        RLlib deviation (E2): works on a numpy'ized episode with ``Dict`` observations.
        RLlib deviation (E4): the bounds are clipped to ``[0, len]`` (RLlib's reversed
        slices or bounds outside ``[-len, len]`` give columns of different lengths).
        RLlib deviation (E5): the rewards keep their space, so fill items are float32
        dummies (RLlib's slice drops it: its fill items come back raw)."""
        n = len(self)
        step = 1 if slice_.step is None else slice_.step
        start = (
            0 if slice_.start is None else (slice_.start + n if slice_.start < 0 else slice_.start)
        )
        stop = n if slice_.stop is None else (slice_.stop + n if slice_.stop < 0 else slice_.stop)
        start, stop = max(0, min(start, n)), max(0, min(stop, n))
        lb_old = self.rewards.lookback
        lb = lb_old if len_lookback_buffer is None else len_lookback_buffer
        lb = min(lb, lb_old + start)

        def cols(buf: InfiniteLookbackBuffer, extra: int) -> Any:
            a, b = buf.lookback + start - lb, buf.lookback + stop + extra
            if buf.finalized:
                return tree_map(lambda x: x[a:b:step], buf.data)
            return buf.data[a:b:step]

        return borrow(  # (its columns are views of this episode's)
            SingleAgentEpisode(
                self.id_,
                observations=cols(self.observations, 1),
                observation_space=self.observation_space,
                infos=cols(self.infos, 1),
                actions=cols(self.actions, 0),
                action_space=self.action_space,
                rewards=cols(self.rewards, 0),
                extra_model_outputs={k: cols(v, 0) for k, v in self.extra_model_outputs.items()},
                terminated=self.is_terminated if stop == n else False,
                truncated=self.is_truncated if stop == n else False,
                t_started=self.t_started + start,
                len_lookback_buffer=lb,
                agent_id=self.agent_id,
                module_id=self.module_id,
                multi_agent_episode_id=self.multi_agent_episode_id,
            )
        )

    def __getitem__(self, item: Any) -> SingleAgentEpisode:
        if isinstance(item, slice):
            return self.slice(item)
        raise NotImplementedError(
            f"{type(self).__name__} does not support getting item '{item}'! Only slice objects "
            "allowed with the syntax: `episode[a:b]`."
        )

    def concat_episode(self, other: SingleAgentEpisode) -> None:
        """Appends ``other`` (the next chunk of the same episode) to this one."""
        assert other.id_ == self.id_, (
            f"cannot concat episodes with different ids ({self.id_} vs {other.id_})"
        )
        assert not self.is_done, "cannot concat onto a done episode"
        assert self.t == other.t_started, (
            f"chunks do not meet: self.t={self.t}, other.t_started={other.t_started}"
        )
        last, first = self.get_observations(-1), other.get_observations(0)
        assert all(
            np.array_equal(np.asarray(a), np.asarray(b))
            for a, b in zip(leaves(last), leaves(first))
        ), "the last observation of self differs from the first of other"
        for k in other.extra_model_outputs:
            assert k in self.extra_model_outputs, f"extra model output {k!r} missing in self"
        self.observations.pop()
        self.infos.pop()
        self.observations.extend(other.get_observations())
        self.infos.extend(other.get_infos())
        self.actions.extend(other.get_actions())
        self.rewards.extend(other.get_rewards())
        for k, v in other.extra_model_outputs.items():
            self.extra_model_outputs[k].extend(v.get())
        self.t = other.t
        self.is_terminated, self.is_truncated = other.is_terminated, other.is_truncated
        self.custom_data.update(other.custom_data)
        self.validate()

    # -- counters and conversions ----------------------------------------------------

    def __len__(self) -> int:
        return self.t - self.t_started

    def env_steps(self) -> int:
        """Like RLlib's: ``len(self)``, the steps in this chunk."""
        return len(self)

    def agent_steps(self) -> int:
        """Like RLlib's: ``len(self)`` (one agent: one agent step per env step)."""
        return len(self)

    def get_return(self) -> float:
        """Like RLlib's: the sum of the rewards (lookback excluded), in float64 also for
        float32 rewards (see :meth:`trusted`)."""
        rewards = self.get_rewards()
        if not self.is_numpy:
            return sum(rewards)
        # RLlib sums with Python's sum(): an episode without steps returns the int 0
        return np.sum(rewards, dtype=np.float64) if len(rewards) else 0

    @property
    def step_times(self) -> tuple[float | None, float | None]:
        """``(start, last step)`` ``time.perf_counter()`` stamps (``None`` until stepped):
        what :meth:`get_duration_s` measures; set by ``add_env_reset`` / ``add_env_step``."""
        return self._start_time, self._last_step_time

    def get_duration_s(self) -> float:
        """Like RLlib's: seconds from ``add_env_reset`` to the last step (0.0 before)."""
        if self._start_time is None:
            return 0.0
        return (self._last_step_time or self._start_time) - self._start_time

    def get_data_dict(self) -> dict[str, Any]:
        """Columns as in RLlib: terminateds, truncateds, t, eps_id, obs, infos, actions,
        rewards, extras.

        RLlib deviation (E1): an episode without steps gives no rows (RLlib's has one
        terminateds / truncateds row)."""
        n = len(self)
        flags = lambda last: [False] * (n - 1) + [bool(last)] if n else []
        d: dict[str, Any] = {
            "terminateds": flags(self.is_terminated),
            "truncateds": flags(self.is_truncated),
            "t": list(range(self.t_started, self.t)),
            "eps_id": [self.id_] * n,
            "obs": self.get_observations(slice(None, -1)),
            "infos": self.get_infos(slice(None, -1)),
            "actions": self.get_actions(),
            "rewards": self.get_rewards(),
        }
        d.update({k: v.get() for k, v in self.extra_model_outputs.items()})
        if self.is_numpy:
            for k in ("terminateds", "truncateds", "t", "eps_id"):
                d[k] = np.asarray(d[k])
        return d

    def get_sample_batch(self) -> Any:
        """``SampleBatch(get_data_dict())``."""
        from jaxsampler.episodes.batch import SampleBatch

        return SampleBatch(self.get_data_dict())

    def get_state(self) -> dict[str, Any]:
        """Like RLlib's: the episode's state (buffers as their own states), for
        :meth:`from_state`."""
        return {
            "id_": self.id_,
            "agent_id": self.agent_id,
            "module_id": self.module_id,
            "multi_agent_episode_id": self.multi_agent_episode_id,
            "observation_space": self._observation_space,
            "action_space": self._action_space,
            "observations": self.observations.get_state(),
            "infos": self.infos.get_state(),
            "actions": self.actions.get_state(),
            "rewards": self.rewards.get_state(),
            "extra_model_outputs": {k: v.get_state() for k, v in self.extra_model_outputs.items()},
            "is_terminated": self.is_terminated,
            "is_truncated": self.is_truncated,
            "t_started": self.t_started,
            "t": self.t,
            "custom_data": self.custom_data,
            "_start_time": self._start_time,
            "_last_step_time": self._last_step_time,
        }

    @staticmethod
    def from_state(state: dict[str, Any]) -> SingleAgentEpisode:
        """Like RLlib's: the episode :meth:`get_state` returned ``state`` of."""
        ep = SingleAgentEpisode.__new__(SingleAgentEpisode)
        ep._lazy = ep._view = ep._key = None
        for k in (
            "id_",
            "agent_id",
            "module_id",
            "multi_agent_episode_id",
            "is_terminated",
            "is_truncated",
            "t_started",
            "t",
            "custom_data",
            "_start_time",
            "_last_step_time",
        ):
            setattr(ep, k, state[k])
        ep._observation_space, ep._action_space = state["observation_space"], state["action_space"]
        for k in ("observations", "infos", "actions", "rewards"):
            setattr(ep, k, InfiniteLookbackBuffer.from_state(state[k]))
        ep.extra_model_outputs = {
            k: InfiniteLookbackBuffer.from_state(v) for k, v in state["extra_model_outputs"].items()
        }
        return ep

    def __getstate__(self) -> dict[str, Any]:
        return self.get_state()

    def __setstate__(self, state: dict[str, Any]) -> None:
        other = SingleAgentEpisode.from_state(state)
        for k in self.__slots__:
            setattr(self, k, getattr(other, k))

    def __repr__(self) -> str:
        return f"SAEps(len={len(self)} done={self.is_done} R={self.get_return()} id_={self.id_})"
