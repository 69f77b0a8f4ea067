"""Host-side output of envs with agent groups: each agent's data in its own spaces.

The rollout and the converter work in the groups' carrier spaces
(:class:`jaxsampler.envs.groups.GroupLayout`): one observation and action array for all
agents. What a user receives is unpacked:

* a ``MultiAgentBatch``'s policy batch holds its agents' own observations, next
  observations and actions, when all its agents are in one group (a policy over agents of
  several groups works in the carrier spaces, so its rows stay carrier rows); extra model
  outputs that a :class:`~jaxsampler.policies.MultiAgentPolicy` padded to a common width
  are cut back to the policy's own (``extra_shapes``);
* every ``MultiAgentEpisode`` is handed out as a copy whose agents hold their own
  observations, actions and extra model outputs and report their own spaces (RLlib's
  per-agent ``observation_space`` / ``action_space`` dicts); the converter keeps its carrier
  chunks to continue them in the next call. The copy builds every agent's columns, so a
  grouped env's episodes are not lazy.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxsampler.envs.groups import GroupLayout
from jaxsampler.episodes.lookback import InfiniteLookbackBuffer, tree_map
from jaxsampler.episodes.multi_agent import MultiAgentEpisode
from jaxsampler.episodes.single_agent import SingleAgentEpisode
from jaxsampler.policies.groups import unpad_extra

__all__ = [
    "Unpack",
    "cut_to",
    "grouped_layout",
    "policy_modes",
    "policy_unpackers",
    "unpack_episode",
]

#: One policy's row unpackers: ``(observations, actions, extras by key)``; ``None`` for the
#: observations and actions of a policy in the carrier spaces.
Unpack = tuple[
    Callable[[Any], Any] | None, Callable[[Any], Any] | None, dict[str, Callable[[Any], Any]]
]


def grouped_layout(env: Any, pipe: Any) -> GroupLayout | None:
    """The env's agent groups (``None`` without), checked against the transform pipeline:
    transforms that change the carrier spaces would change what every group's rows mean,
    so they are refused with a ``ValueError`` naming both spaces."""
    layout = getattr(env, "agent_layout", None)
    if layout is None:
        return None
    for kind, ours, theirs in (
        ("observation", layout.observation_space, pipe.observation_space),
        ("action", layout.action_space, pipe.action_space),
    ):
        if ours != theirs:
            raise ValueError(
                f"{getattr(env, 'name', env)} has agent groups ({layout}); its transforms "
                f"change the carrier {kind} space {ours!r} into {theirs!r}, which would "
                "change what each group's packed rows mean: use transforms that keep the "
                "spaces (e.g. reward transforms) with grouped envs"
            )
    return layout


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
    agent_ids: Sequence[str],
    agent_policy: Sequence[str],
    extra_shapes: Mapping[str, Mapping[str, Any]] | None = None,
    modes: Mapping[str, str | None] | None = None,
) -> dict[str, Unpack]:
    """``policy_id -> Unpack``: a policy built for its group's own spaces (``modes``; without
    them, a policy whose agents all sit in one group) gets its rows' observations and
    actions unpacked; a policy in the carrier spaces (padded mode) keeps carrier rows. Every
    policy's extras are cut to their own shapes (``extra_shapes``: ``policy_id -> {key:
    trailing shape}``, what a ``MultiAgentPolicy`` padded them from)."""
    agents: dict[str, list[str]] = {}
    for aid, pid in zip(agent_ids, agent_policy, strict=True):
        agents.setdefault(pid, []).append(aid)
    out: dict[str, Unpack] = {}
    for pid, aids in agents.items():
        if modes is not None:
            name = modes.get(pid)
        else:
            groups = {layout.group_of(a).name for a in aids}
            name = next(iter(groups)) if len(groups) == 1 else None
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


def _agent(
    sa: SingleAgentEpisode,
    layout: GroupLayout,
    extra_cut: Mapping[str, Callable[[Any], Any]],
) -> SingleAgentEpisode:
    aid = sa.agent_id
    name = layout.group_of(aid).name
    obs, acts = sa.observations, sa.actions  # (builds a lazy agent's columns)
    infos, rewards, extras = sa.infos, sa.rewards, sa.extra_model_outputs
    new = copy.copy(sa)
    new._lazy = new._view = new._key = None
    new._observations = _buffer(
        obs, lambda x: layout.unpack_obs(name, x), layout.observation_spaces[aid]
    )
    new._actions = _buffer(acts, lambda x: layout.unpack_action(name, x), layout.action_spaces[aid])
    new._infos, new._rewards = infos, rewards
    new._extra_model_outputs = {
        k: _buffer(b, extra_cut[k], None) if k in extra_cut else b for k, b in extras.items()
    }
    new._observation_space = layout.observation_spaces[aid]
    new._action_space = layout.action_spaces[aid]
    return new


def unpack_episode(
    ep: MultiAgentEpisode,
    layout: GroupLayout,
    extra_cuts: Mapping[str, Mapping[str, Callable[[Any], Any]]] | None = None,
) -> MultiAgentEpisode:
    """A copy of ``ep`` whose agents hold their own spaces' data (see the module docstring);
    ``extra_cuts``: ``agent_id -> {key: cut}`` for padded extra model outputs."""
    ep._ensure_built()
    cuts = extra_cuts or {}
    new = MultiAgentEpisode.__new__(MultiAgentEpisode)
    new.__dict__.update(ep.__dict__)
    new.agent_episodes = {
        a: _agent(sa, layout, cuts.get(a, {})) for a, sa in ep.agent_episodes.items()
    }
    new.observation_space = {a: layout.observation_spaces[a] for a in ep.observation_space}
    new.action_space = {a: layout.action_spaces[a] for a in ep.action_space}
    hanging = ep._hanging_actions_end
    new._hanging_actions_end = {
        a: layout.unpack_action(layout.group_of(a).name, np.asarray(x)) for a, x in hanging.items()
    }
    old_extras = ep._hanging_extra_model_outputs_end
    new._hanging_extra_model_outputs_end = copy.copy(old_extras)
    for a, d in old_extras.items():
        cut = cuts.get(a, {})
        new._hanging_extra_model_outputs_end[a] = {
            k: (cut[k](np.asarray(v)[None])[0] if k in cut else v) for k, v in d.items()
        }
    return new
