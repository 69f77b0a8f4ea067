"""The lazy side of :class:`~jaxsampler.episodes.single_agent.SingleAgentEpisode`.

:class:`EpisodeViews` is what a sampler hands its episodes instead of buffers: one object
per call over the call's shared columns that builds one episode's column on first access
(``column``) and answers the default getters (all items after the lookback) with one
slice each, without building the buffer at all. :class:`LazyColumn` is the episode
attribute that builds a column on first access. The buffers built over shared columns
are borrowed (:attr:`InfiniteLookbackBuffer.borrowed`): they copy on first write. Also
here: the space helpers the episode shares with the samplers (:func:`reward_space`,
:func:`contains`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Generic, TypeVar, cast, overload

import numpy as np

from jaxsampler.episodes.lookback import InfiniteLookbackBuffer

__all__ = [
    "COLUMNS",
    "EpisodeViews",
    "LazyColumn",
    "as_buffer",
    "borrow",
    "contains",
    "empty_like",
    "reward_space",
    "view_episodes",
]

COLUMNS = ("observations", "infos", "actions", "rewards", "extra_model_outputs")
"""The names of an episode's columns, in :data:`EpisodeBuffers` order."""


class EpisodeViews:
    """One call's episodes over shared columns, by key (e.g. the episode's index in the
    call): what :meth:`SingleAgentEpisode.from_views` episodes read from.

    A subclass implements :meth:`column` (the general path: the buffer of one column,
    built over views of the shared data and marked borrowed, so the episode's writes
    copy first) and the default-getter fast paths (the same values as
    ``column(key, name).get()``: views of the shared data, the lookback left out). The
    shared data must never be written in place by anyone while episodes read it.
    """

    __slots__ = ()

    def column(self, key: Any, name: str) -> Any:
        """Episode ``key``'s column ``name`` (one of :data:`COLUMNS`): an
        :class:`~jaxsampler.episodes.lookback.InfiniteLookbackBuffer`, or for
        ``"extra_model_outputs"`` a new dict of them by output name."""
        raise NotImplementedError

    def observations(self, key: Any) -> Any:
        """Episode ``key``'s observations after its lookback (``get_observations()``)."""
        return self.column(key, "observations").get()

    def actions(self, key: Any) -> Any:
        """Episode ``key``'s actions after its lookback (``get_actions()``)."""
        return self.column(key, "actions").get()

    def rewards(self, key: Any) -> Any:
        """Episode ``key``'s rewards after its lookback (``get_rewards()``)."""
        return self.column(key, "rewards").get()

    def extra(self, key: Any, name: str) -> Any:
        """Episode ``key``'s extra model output ``name`` after its lookback, or ``None``
        where the episodes have no output of that name."""
        outputs = self.column(key, "extra_model_outputs")
        return outputs[name].get() if name in outputs else None


_REWARD_SPACE = None


def reward_space() -> Any:
    """The space of one reward (an unbounded float32 scalar), shared by every episode."""
    global _REWARD_SPACE
    if _REWARD_SPACE is None:
        from jaxsampler.spaces import Box

        _REWARD_SPACE = Box(-np.inf, np.inf, (), np.float32)
    return _REWARD_SPACE


def contains(space: Any, x: Any) -> bool:
    """Whether ``x`` is in ``space`` by the space's own ``contains`` (``None``: any ``x``).

    Not :func:`jaxsampler.spaces.check_value`: that one leaves ``Box`` bounds unchecked
    and takes bools as ``Discrete`` values, which ``validate=True`` rejects."""
    if space is None:
        return True
    from jaxsampler.spaces import Space, convert_space

    try:
        s = space if isinstance(space, Space) else convert_space(space)
    except TypeError:
        return bool(space.contains(x))
    if isinstance(x, (dict, tuple)):
        return bool(np.asarray(s.contains(x)))
    arr = np.asarray(x)
    if arr.shape != s.shape:
        return False
    return bool(np.asarray(s.contains(arr)))


_T = TypeVar("_T")


class LazyColumn(Generic[_T]):
    """A column attribute of :class:`SingleAgentEpisode`, kept in the slot ``_<name>``.

    ``None`` in the slot means "not built yet": an episode over :class:`EpisodeViews`
    builds just that column on first access; a :meth:`~SingleAgentEpisode.lazy` episode
    builds all its columns before the first read or write of any of them.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self._name, self._slot = name, "_" + name

    @overload
    def __get__(self, episode: None, owner: type) -> LazyColumn[_T]: ...
    @overload
    def __get__(self, episode: Any, owner: type) -> _T: ...
    def __get__(self, episode: Any, owner: type) -> Any:
        if episode is None:
            return self
        value = getattr(episode, self._slot)
        if value is None:
            value = episode._build_column(self._name)
        return value

    def __set__(self, episode: Any, value: _T) -> None:
        if episode._lazy is not None:
            episode._build()
        setattr(episode, self._slot, value)


_E = TypeVar("_E")  # a SingleAgentEpisode (not imported here: it imports this module)


def view_episodes(
    cls: type[_E],
    views: EpisodeViews,
    fields: Iterable[tuple[str, bool, bool, int, int]],
    observation_space: Any,
    action_space: Any,
    keys: Iterable[Any] | None = None,
) -> list[_E]:
    """:meth:`SingleAgentEpisode.from_views`' loop: one episode of class ``cls`` per
    ``(id_, terminated, truncated, t_started, t)`` of ``fields`` (its key in ``views``:
    the matching item of ``keys``, by default its position), every column left unbuilt.
    One object and its slots per episode, nothing else."""
    new, out = cls.__new__, cast(list[_E], [])
    append = out.append
    keyed = enumerate(fields) if keys is None else zip(keys, fields)
    for key, (id_, term, trunc, ts, te) in keyed:
        ep: Any = new(cls)
        ep.id_, ep._view, ep._key, ep.t_started, ep.t = id_, views, key, ts, te
        ep.is_terminated, ep.is_truncated = term, trunc
        ep._observation_space, ep._action_space = observation_space, action_space
        ep._lazy = ep.agent_id = ep.module_id = ep.multi_agent_episode_id = None
        ep._observations = ep._infos = ep._actions = ep._rewards = None
        ep._extra_model_outputs = ep._start_time = ep._last_step_time = None
        ep.custom_data = {}
        append(ep)
    return out


def borrow(episode: Any) -> Any:
    """Marks ``episode``'s numpy'ized columns borrowed (their data are views of another
    episode's): its first write to a column copies that column. Returns ``episode``."""
    for buf in (episode.observations, episode.infos, episode.actions, episode.rewards):
        buf.borrowed = True
    for buf in episode.extra_model_outputs.values():
        buf.borrowed = True
    return episode


def empty_like(buf: InfiniteLookbackBuffer) -> Any:
    """An empty column in ``buf``'s mode (list, or zero-length arrays)."""
    return buf.get(slice(len(buf), None)) if buf.finalized else []


def as_buffer(data: Any, lookback: int, space: Any) -> InfiniteLookbackBuffer:
    """``data`` as an episode column: a buffer as is (given ``space`` where it has
    none), anything else a new buffer with ``lookback`` leading items."""
    if isinstance(data, InfiniteLookbackBuffer):
        if space is not None and data.space is None:
            data.space = space
        return data
    return InfiniteLookbackBuffer(data, lookback, space)
