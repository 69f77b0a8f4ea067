"""Host-side output of envs with agent groups: each agent's data in its own spaces.

The rollout and the converter work in the groups' carrier spaces
(:class:`jaxsampler.envs.groups.GroupLayout`): one observation and action array for all
agents. What a user receives is unpacked:

* a ``MultiAgentBatch``'s policy batch holds its agents' own observations, next
  observations and actions when the policy is built for its group's own spaces (a policy
  in the carrier spaces, padded mode, saw carrier rows, so its batch keeps them); extra
  model outputs that a :class:`~jaxsampler.policies.MultiAgentPolicy` padded to a common
  width are cut back to each policy's own (``extra_shapes``);
* every ``MultiAgentEpisode`` is handed out as a copy whose agents hold their own
  observations, actions and extra model outputs and report their own spaces (RLlib's
  per-agent ``observation_space`` / ``action_space`` dicts); the converter keeps its carrier
  chunks to continue them in the next call. A lazy chunk's copy stays lazy: its build, and
  its agents' column views, unpack what they hand out.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxsampler.envs.groups import GroupLayout
from jaxsampler.episodes._sa_views import COLUMNS, EpisodeViews
from jaxsampler.episodes.lookback import InfiniteLookbackBuffer, tree_map
from jaxsampler.episodes.multi_agent import MultiAgentEpisode
from jaxsampler.episodes.single_agent import SingleAgentEpisode
from jaxsampler.policies.groups import unpad_extra

__all__ = [
    "EpisodeUnpacker",
    "GroupedOutput",
    "Unpack",
    "cut_to",
    "grouped_output",
    "policy_modes",
    "policy_unpackers",
]

#: One policy's row unpackers: ``(observations, actions, extras by key)``; ``None`` for the
#: observations and actions of a policy in the carrier spaces.
Unpack = tuple[
    Callable[[Any], Any] | None, Callable[[Any], Any] | None, dict[str, Callable[[Any], Any]]
]


def cut_to(shape: Any) -> Callable[[Any], Any]:
    """Rows ``[N, *padded]`` cut back to ``[N, *shape]`` (a view)."""
    return lambda x: unpad_extra(x, shape)


def policy_modes(policy: Any) -> dict[str, str | None] | None:
    """``policy_id -> group`` whose own spaces the policy is built for (``None``: the
    carrier's, padded mode), from a :class:`~jaxsampler.policies.MultiAgentPolicy` (or a
    policy that forwards its ``policy_ids`` / ``policy_groups``); ``None`` for others."""
    ids, groups = getattr(policy, "policy_ids", None), getattr(policy, "policy_groups", None)
    if ids is None or groups is None:
        return None
    return dict(zip(ids, groups, strict=True))


def policy_unpackers(
    layout: GroupLayout,
    agent_policy: Sequence[str],
    extra_shapes: Mapping[str, Mapping[str, Any]] | None = None,
    modes: Mapping[str, str | None] | None = None,
) -> dict[str, Unpack]:
    """``policy_id -> Unpack``: a policy built for its group's own spaces (``modes``, from
    :func:`policy_modes`) gets its rows' observations and actions unpacked; a policy in the
    carrier spaces (padded mode, and every policy that is not a ``MultiAgentPolicy``) keeps
    carrier rows, what it saw. Every policy's extras are cut to their own shapes
    (``extra_shapes``: ``policy_id -> {key: trailing shape}``, what a ``MultiAgentPolicy``
    padded them from)."""
    out: dict[str, Unpack] = {}
    for pid in dict.fromkeys(agent_policy):
        name = (modes or {}).get(pid)
        extras = {k: cut_to(s) for k, s in (extra_shapes or {}).get(pid, {}).items()}
        out[pid] = (
            None if name is None else functools.partial(layout.unpack_obs, name),
            None if name is None else functools.partial(layout.unpack_action, name),
            extras,
        )
    return out


def _buffer(buf: InfiniteLookbackBuffer, fn: Callable[[Any], Any], space: Any) -> Any:
    """A new buffer of ``fn`` applied to ``buf``'s rows (list mode: item by item)."""
    if isinstance(buf.data, list):
        data: Any = [fn(np.asarray(x)[None])[0] for x in buf.data]
    else:
        data = tree_map(fn, buf.data)
    return InfiniteLookbackBuffer.trusted(data, buf.lookback, space, borrowed=True)


class _Own:
    """How one agent's carrier columns become its own: its group's unpackers and spaces,
    and the cuts of its padded extras."""

    __slots__ = ("obs", "act", "cuts", "obs_space", "act_space")

    def __init__(self, layout: GroupLayout, agent_id: str, cuts: Mapping[str, Any]):
        name = layout.group_of(agent_id).name
        self.obs = functools.partial(layout.unpack_obs, name)
        self.act = functools.partial(layout.unpack_action, name)
        self.cuts = dict(cuts)
        self.obs_space = layout.observation_spaces[agent_id]
        self.act_space = layout.action_spaces[agent_id]

    def column(self, name: str, col: Any) -> Any:
        """Column ``name`` of an agent episode (a buffer; extras: a dict of them), own."""
        if name == "observations":
            return _buffer(col, self.obs, self.obs_space)
        if name == "actions":
            return _buffer(col, self.act, self.act_space)
        if name == "extra_model_outputs":
            return {
                k: _buffer(b, self.cuts[k], None) if k in self.cuts else b for k, b in col.items()
            }
        return col


class _OwnViews(EpisodeViews):
    """One agent's episodes over a call's carrier :class:`EpisodeViews`, unpacked as they
    are read: the episodes stay lazy."""

    __slots__ = ("_inner", "_own")

    def __init__(self, inner: EpisodeViews, own: _Own):
        self._inner, self._own = inner, own

    def column(self, key: Any, name: str) -> Any:
        return self._own.column(name, self._inner.column(key, name))

    def observations(self, key: Any) -> Any:
        return self._own.obs(self._inner.observations(key))

    def actions(self, key: Any) -> Any:
        return self._own.act(self._inner.actions(key))

    def rewards(self, key: Any) -> Any:
        return self._inner.rewards(key)

    def extra(self, key: Any, name: str) -> Any:
        x = self._inner.extra(key, name)
        cut = self._own.cuts.get(name)
        return x if x is None or cut is None else cut(x)


def _own_build(build: Callable[[Any], Any], own: _Own, key: Any) -> tuple:
    """A lazy agent episode's buffers (``build(key)``), own."""
    return tuple(own.column(n, c) for n, c in zip(COLUMNS, build(key), strict=True))


_SLOTS = SingleAgentEpisode.__slots__
_UNSET = object()


def _agent(sa: SingleAgentEpisode, own: _Own, views: dict[int, _OwnViews]) -> SingleAgentEpisode:
    """A copy of ``sa`` in its own spaces; unbuilt columns stay unbuilt."""
    new = SingleAgentEpisode.__new__(SingleAgentEpisode)
    for k in _SLOTS:
        v = getattr(sa, k, _UNSET)
        if v is not _UNSET:  # (an unset slot stays unset)
            setattr(new, k, v)
    if sa._lazy is not None:
        build, key = sa._lazy
        new._lazy = (functools.partial(_own_build, build, own), key)
    if sa._view is not None:
        wrapped = views.get(id(sa._view))
        if wrapped is None:
            wrapped = views[id(sa._view)] = _OwnViews(sa._view, own)
        new._view = wrapped
    for name in COLUMNS:
        col = getattr(sa, "_" + name)
        if col is not None:
            setattr(new, "_" + name, own.column(name, col))
    new._observation_space, new._action_space = own.obs_space, own.act_space
    return new


class EpisodeUnpacker:
    """Hands out a grouped env's episodes in each agent's own spaces (the module
    docstring): a lazy episode stays lazy (its build and its agents' views unpack what
    they give), a built one is copied now."""

    def __init__(
        self, layout: GroupLayout, agent_cuts: Mapping[str, Mapping[str, Any]] | None = None
    ):
        self.layout = layout
        cuts = agent_cuts or {}
        self._own = {a: _Own(layout, a, cuts.get(a, {})) for a in layout.agent_ids}

    @functools.lru_cache(maxsize=8)  # noqa: B019 (one unpacker per converter)
    def _spaces(self, agents: tuple[str, ...]) -> tuple[dict, dict]:
        """The agents' own observation and action spaces, one pair of dicts shared by the
        call's episodes (as the converter's own chunks share theirs)."""
        layout = self.layout
        return (
            {a: layout.observation_spaces[a] for a in agents},
            {a: layout.action_spaces[a] for a in agents},
        )

    def __call__(self, episodes: Sequence[MultiAgentEpisode]) -> list[MultiAgentEpisode]:
        views: dict[str, dict[int, _OwnViews]] = {a: {} for a in self._own}
        return [self._episode(ep, views) for ep in episodes]

    def _episode(
        self, ep: MultiAgentEpisode, views: dict[str, dict[int, _OwnViews]]
    ) -> MultiAgentEpisode:
        new = MultiAgentEpisode.__new__(MultiAgentEpisode)
        d = new.__dict__
        d.update(ep.__dict__)
        d["observation_space"], d["action_space"] = self._spaces(tuple(ep.observation_space))
        lazy = d.get("_lazy")
        if lazy is not None:
            build, key = lazy
            d["_lazy"] = (functools.partial(self._build, build, views), key)
        else:
            self._unpack_agents(new, views)
        return new

    def _build(
        self, build: Callable[[Any, Any], None], views: Any, ep: MultiAgentEpisode, key: Any
    ) -> None:
        build(ep, key)
        self._unpack_agents(ep, views)

    def _unpack_agents(self, ep: MultiAgentEpisode, views: Any) -> None:
        d = ep.__dict__
        own = self._own
        d["agent_episodes"] = {
            a: _agent(sa, own[a], views[a]) for a, sa in d["agent_episodes"].items()
        }
        hanging = d["_hanging_actions_end"]
        d["_hanging_actions_end"] = {a: own[a].act(np.asarray(x)) for a, x in hanging.items()}
        extras = d["_hanging_extra_model_outputs_end"]
        new_extras = copy.copy(extras)  # (a defaultdict stays one)
        for a, outputs in extras.items():
            cuts = own[a].cuts
            new_extras[a] = {
                k: (cuts[k](np.asarray(v)[None])[0] if k in cuts else v) for k, v in outputs.items()
            }
        d["_hanging_extra_model_outputs_end"] = new_extras


class GroupedOutput:
    """What a multi-agent converter unpacks for an env with agent groups: each policy's
    batch rows (:func:`policy_unpackers`) and the episodes (:class:`EpisodeUnpacker`)."""

    def __init__(
        self,
        layout: GroupLayout,
        agent_ids: Sequence[str],
        agent_policy: Sequence[str],
        extra_shapes: Mapping[str, Mapping[str, Any]] | None = None,
        modes: Mapping[str, str | None] | None = None,
    ):
        self.batch = policy_unpackers(layout, agent_policy, extra_shapes, modes)
        shapes = extra_shapes or {}
        self.episodes = EpisodeUnpacker(
            layout,
            {
                aid: {k: cut_to(v) for k, v in shapes.get(pid, {}).items()}
                for aid, pid in zip(agent_ids, agent_policy, strict=True)
            },
        )


def grouped_output(
    env: Any, policy: Any, agent_ids: Sequence[str], agent_policy: Sequence[str]
) -> GroupedOutput | None:
    """The :class:`GroupedOutput` of a sampler's env and policy; ``None`` for an env without
    agent groups. (The sampler's transforms were checked against the groups with the
    policy, by :func:`~jaxsampler.rollout.check_compatible`.)"""
    layout = env.agent_layout
    if layout is None:
        return None
    shapes = getattr(policy, "extra_shapes", None)
    return GroupedOutput(layout, agent_ids, agent_policy, shapes, policy_modes(policy))
