"""Agent groups: agents with their own observation and action spaces on one agent axis.

A multi-agent env whose agents differ (predators and prey, a commander and workers, MPE's
``simple_tag``) declares its agents in groups, each with its own one-agent spaces::

    groups = (
        AgentGroup("predator", ("predator_0", "predator_1"), Box(-1, 1, (6,)), Discrete(5)),
        AgentGroup("prey", ("prey_0",), Box(-1, 1, (4,)), Discrete(3)),
    )

The rollout keeps its one agent axis: every agent's observation and action travel in a
*carrier* space wide enough for every group (:class:`GroupLayout`), an observation as its
flattened values followed by zeros, a Box action likewise, a discrete action as itself.
Every surface a user reads is unpacked back to the agent's own space: per-group env logic
(:class:`jaxsampler.envs.GroupedMultiAgentEnv`), policies mapped to a group
(:class:`jaxsampler.policies.MultiAgentPolicy`), episodes and batches, whose agents report
their own spaces as RLlib's do. Groups take the agent axis in declared order, each a
contiguous run of slots.

Supported group spaces: observations are :class:`~jaxsampler.spaces.Box` es of any shape
and dtype; actions are all :class:`~jaxsampler.spaces.Discrete` (starting at 0) or all
:class:`~jaxsampler.spaces.Box`. Anything else is refused when the layout is built, with
the groups and spaces named.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxsampler.spaces import Box, Discrete, Space

__all__ = ["AgentGroup", "GroupLayout"]


@dataclasses.dataclass(frozen=True)
class AgentGroup:
    """One group of agents sharing their one-agent spaces.

    Attributes:
        name: the group's name (policies and error messages use it).
        agent_ids: its agents, in agent-axis order.
        observation_space: one agent's observation space (a Box).
        action_space: one agent's action space (Discrete from 0, or Box).
    """

    name: str
    agent_ids: tuple[str, ...]
    observation_space: Space
    action_space: Space

    def __post_init__(self) -> None:
        object.__setattr__(self, "agent_ids", tuple(self.agent_ids))
        if not self.agent_ids:
            raise ValueError(f"agent group {self.name!r} has no agents")


def _size(space: Box) -> int:
    return int(np.prod(space.shape, dtype=np.int64))


def _flat_bounds(space: Box, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The space's bounds flattened and padded with zeros to ``width``."""
    low = np.zeros(width, np.float64)
    high = np.zeros(width, np.float64)
    n = _size(space)
    low[:n] = np.broadcast_to(space.low, space.shape).reshape(-1)
    high[:n] = np.broadcast_to(space.high, space.shape).reshape(-1)
    return low, high


def _carrier_dtype(dtypes: Sequence[Any]) -> np.dtype:
    """The dtype every group's values fit in: numpy's promotion, kept at 32 bits where no
    group is 64-bit (int32 with float32 promotes to float64, int32 with uint32 to int64:
    JAX holds those as 32-bit without x64; a float32 carrier is exact for integers up to
    2**24)."""
    dtype = np.result_type(*dtypes)
    if dtype.itemsize == 8 and not any(np.dtype(d).itemsize == 8 for d in dtypes):
        dtype = np.dtype({"f": np.float32, "i": np.int32, "u": np.uint32}.get(dtype.kind, dtype))
    return dtype


def _carrier_box(spaces: Sequence[Box]) -> Box:
    """The smallest flat Box that holds every space's flattened values (zeros after them)."""
    width = max(_size(s) for s in spaces)
    dtype = _carrier_dtype([s.dtype for s in spaces])
    bounds = [_flat_bounds(s, width) for s in spaces]
    low = np.min([b[0] for b in bounds], axis=0)
    high = np.max([b[1] for b in bounds], axis=0)
    return Box(low, high, (width,), dtype)


class GroupLayout:
    """Where each group sits on the agent axis, and its carrier spaces.

    Built from the env's groups; hashable by them (a static argument of jitted code).

    Attributes:
        groups: the groups, in agent-axis order.
        agent_ids: every agent, group by group.
        observation_space / action_space: the carrier spaces the rollout's agent axis holds.
        observation_spaces / action_spaces: ``agent_id -> space``, each agent's own.
    """

    def __init__(self, groups: Sequence[AgentGroup]):
        groups = tuple(groups)
        if not groups:
            raise ValueError("an env with agent groups needs at least one group")
        names = [g.name for g in groups]
        if len(set(names)) != len(names):
            raise ValueError(f"agent group names repeat: {names}")
        ids = [a for g in groups for a in g.agent_ids]
        if len(set(ids)) != len(ids):
            raise ValueError(f"agent ids repeat across groups: {ids}")
        for g in groups:
            if not isinstance(g.observation_space, Box):
                raise TypeError(
                    f"agent group {g.name!r}: observation space {g.observation_space!r} is "
                    "not a Box; groups carry Box observations only"
                )
        acts = [g.action_space for g in groups]
        if all(isinstance(s, Discrete) for s in acts):
            for g in groups:
                if g.action_space.start != 0:  # type: ignore[attr-defined]
                    raise ValueError(
                        f"agent group {g.name!r}: Discrete action space "
                        f"{g.action_space!r} must start at 0 to share a carrier"
                    )
            dtype = _carrier_dtype([s.dtype for s in acts])
            self.action_space: Space = Discrete(
                max(s.n for s in acts),  # type: ignore[attr-defined]
                dtype=dtype,
            )
        elif all(isinstance(s, Box) for s in acts):
            self.action_space = _carrier_box(acts)  # type: ignore[arg-type]
        else:
            raise TypeError(
                "agent groups' action spaces must be all Discrete or all Box: "
                + ", ".join(f"{g.name}: {g.action_space!r}" for g in groups)
            )
        self.groups = groups
        self.agent_ids = tuple(ids)
        self.observation_space: Space = _carrier_box([g.observation_space for g in groups])  # type: ignore[misc]
        self.observation_spaces = {a: g.observation_space for g in groups for a in g.agent_ids}
        self.action_spaces = {a: g.action_space for g in groups for a in g.agent_ids}
        starts = np.cumsum([0] + [len(g.agent_ids) for g in groups])
        self._slices = {g.name: (int(starts[i]), int(starts[i + 1])) for i, g in enumerate(groups)}
        self._by_name = {g.name: g for g in groups}
        self._of_agent = {a: g for g in groups for a in g.agent_ids}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GroupLayout) and other.groups == self.groups

    def __hash__(self) -> int:
        return hash(self.groups)

    def __repr__(self) -> str:
        return f"GroupLayout({', '.join(f'{g.name}: {len(g.agent_ids)}' for g in self.groups)})"

    @property
    def num_agents(self) -> int:
        return len(self.agent_ids)

    def group(self, name: str) -> AgentGroup:
        """The group called ``name`` (KeyError naming the groups otherwise)."""
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no agent group {name!r}; groups: {list(self._by_name)}") from None

    def group_of(self, agent_id: str) -> AgentGroup:
        """The group of ``agent_id`` (KeyError naming the agents otherwise)."""
        try:
            return self._of_agent[agent_id]
        except KeyError:
            raise KeyError(f"no agent {agent_id!r}; agents: {list(self.agent_ids)}") from None

    def slots(self, name: str) -> tuple[int, int]:
        """``(start, stop)`` of group ``name`` on the agent axis."""
        self.group(name)
        return self._slices[name]

    # -- packing: work on numpy and jax arrays alike (slicing, reshape, concatenate) ------

    def pack_obs(self, name: str, x: Any) -> Any:
        """Observations of group ``name`` (``[..., *shape]``) as carrier rows ``[..., D]``."""
        return _pack(x, self.group(name).observation_space, self.observation_space)

    def unpack_obs(self, name: str, x: Any) -> Any:
        """Carrier rows ``[..., D]`` as group ``name``'s observations ``[..., *shape]``."""
        return _unpack(x, self.group(name).observation_space, self.observation_space)

    def pack_action(self, name: str, x: Any) -> Any:
        """Actions of group ``name`` as carrier actions (discrete ones are themselves)."""
        return _pack(x, self.group(name).action_space, self.action_space)

    def unpack_action(self, name: str, x: Any) -> Any:
        """Carrier actions as group ``name``'s actions (discrete ones are themselves)."""
        return _unpack(x, self.group(name).action_space, self.action_space)

    def unpack_agent_obs(self, agent_id: str, x: Any) -> Any:
        """Carrier rows of one agent as its own observations."""
        return self.unpack_obs(self.group_of(agent_id).name, x)

    def unpack_agent_action(self, agent_id: str, x: Any) -> Any:
        """Carrier actions of one agent as its own actions."""
        return self.unpack_action(self.group_of(agent_id).name, x)

    def sample_actions(self, key: Any, batch_shape: tuple[int, ...]) -> Any:
        """Uniform random carrier actions ``[*batch_shape, A, ...]``, each group's drawn from
        its own action space and packed (a carrier draw would give a narrower group actions
        outside its space). JAX arrays; traceable."""
        import jax
        import jax.numpy as jnp

        parts = []
        keys = jax.random.split(key, len(self.groups))
        for k, g in zip(keys, self.groups, strict=True):
            start, stop = self.slots(g.name)
            drawn = g.action_space.sample_batch(k, (*batch_shape, stop - start))
            parts.append(self.pack_action(g.name, jnp.asarray(drawn)))
        return jnp.concatenate(parts, axis=len(batch_shape))

    @functools.cached_property
    def identity(self) -> bool:
        """Whether every group's spaces equal the carrier's (packing changes nothing)."""
        return all(
            g.observation_space == self.observation_space and g.action_space == self.action_space
            for g in self.groups
        )


def _xp(x: Any) -> Any:
    if isinstance(x, np.ndarray | np.generic):
        return np
    import jax.numpy as jnp

    return jnp


def _pack(x: Any, own: Space, carrier: Space) -> Any:
    xp = _xp(x)
    x = xp.asarray(x)
    if isinstance(own, Discrete):
        return _cast(x, carrier.dtype)
    assert isinstance(own, Box) and isinstance(carrier, Box)
    batch = x.shape[: x.ndim - len(own.shape)]
    flat = _cast(x.reshape(*batch, _size(own)), carrier.dtype)
    pad = carrier.shape[0] - flat.shape[-1]
    if pad == 0:
        return flat
    return xp.concatenate([flat, xp.zeros((*batch, pad), carrier.dtype)], axis=-1)


def _unpack(x: Any, own: Space, carrier: Space) -> Any:
    xp = _xp(x)
    x = xp.asarray(x)
    if isinstance(own, Discrete):
        return _cast(x, own.dtype)
    assert isinstance(own, Box)
    batch = x.shape[:-1]
    return _cast(x[..., : _size(own)].reshape(*batch, *own.shape), own.dtype)


def _cast(x: Any, dtype: Any) -> Any:
    """``x`` in ``dtype``; itself (no copy) when it already is."""
    return x if x.dtype == dtype else x.astype(dtype)
