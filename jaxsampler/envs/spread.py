"""Spread: a cooperative multi-agent particle task (all agents act every step).

``N`` agents and ``N`` landmarks on a 2-D plane. Every step each agent picks one of 5
discrete pushes (none, left, right, down, up); particles move with damped velocity.
All agents share one reward: minus the sum over landmarks of the distance to the closest
agent, minus ``collision_penalty`` for every pair of agents that overlap. The episode is
truncated after ``max_steps_in_episode`` steps (no termination), as in the multi-agent
particle envs' "simple spread".

Observation of agent ``i`` (float32, ``4 + 2N + 2(N - 1)``): its velocity, its position,
the landmarks' positions relative to it, the other agents' positions relative to it (in
agent order, skipping itself). Agents share one space, so they share one agent axis.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsampler.envs.base import Env
from jaxsampler.spaces import Box, Discrete
from jaxsampler.types import NoInfo, TimeStep

__all__ = ["Spread", "SpreadParams", "SpreadState"]

_PUSH = np.array([[0.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [0.0, -1.0], [0.0, 1.0]], np.float32)


@struct.dataclass
class SpreadState:
    pos: jax.Array  # float32[N, 2]
    vel: jax.Array  # float32[N, 2]
    landmarks: jax.Array  # float32[N, 2]
    time: jax.Array  # int32[]


@struct.dataclass
class SpreadParams:
    dt: float = 0.1
    damping: float = 0.25
    accel: float = 5.0
    agent_radius: float = 0.15
    collision_penalty: float = 1.0
    max_steps_in_episode: int = 25


@dataclasses.dataclass(frozen=True)
class Spread(Env):
    """``Spread(num_agents=3)``: cooperative coverage of ``num_agents`` landmarks."""

    n: int = 3
    num_agents: ClassVar[int] = 3  # overridden per instance in __post_init__

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"Spread needs n >= 1 agents, got {self.n!r}")
        object.__setattr__(self, "num_agents", self.n)

    @property
    def name(self) -> str:
        return "Spread-v0"

    @property
    def default_params(self) -> SpreadParams:
        return SpreadParams()

    @property
    def observation_space(self) -> Box:
        return Box(-np.inf, np.inf, (4 + 2 * self.n + 2 * (self.n - 1),), np.float32)

    @property
    def action_space(self) -> Discrete:
        return Discrete(5)

    def _obs(self, s: SpreadState) -> jax.Array:
        n = self.n
        rel_land = s.landmarks[None, :, :] - s.pos[:, None, :]  # [N, N, 2]
        rel_agents = s.pos[None, :, :] - s.pos[:, None, :]  # [N, N, 2]
        others = np.array([[j for j in range(n) if j != i] for i in range(n)], np.int32).reshape(
            n, n - 1
        )
        rel_others = jnp.take_along_axis(rel_agents, others[:, :, None], axis=1)  # [N, N-1, 2]
        parts = [s.vel, s.pos, rel_land.reshape(n, -1), rel_others.reshape(n, -1)]
        return jnp.concatenate(parts, axis=-1).astype(jnp.float32)

    def _ts(self, s: SpreadState, reward: jax.Array, truncated: jax.Array) -> TimeStep:
        n = self.n
        return TimeStep(
            obs=self._obs(s),
            reward=jnp.broadcast_to(reward, (n,)).astype(jnp.float32),
            terminated=jnp.zeros((n,), jnp.bool_),
            truncated=jnp.broadcast_to(truncated, (n,)),
            acting=jnp.ones((n,), jnp.bool_),
            info=NoInfo(),
        )

    def reset(
        self, key: jax.Array, params: SpreadParams | None = None
    ) -> tuple[SpreadState, TimeStep]:
        k_pos, k_land = jax.random.split(key)
        pos = jax.random.uniform(k_pos, (self.n, 2), jnp.float32, -1.0, 1.0)
        landmarks = jax.random.uniform(k_land, (self.n, 2), jnp.float32, -1.0, 1.0)
        s = SpreadState(
            pos, jnp.zeros((self.n, 2), jnp.float32), landmarks, jnp.zeros((), jnp.int32)
        )
        return s, self._ts(s, jnp.zeros((), jnp.float32), jnp.asarray(False))

    def step(
        self,
        key: jax.Array,
        state: SpreadState,
        action: jax.Array,
        params: SpreadParams | None = None,
    ):
        params = self.default_params if params is None else params
        push = jnp.asarray(_PUSH)[action]  # [N, 2]
        vel = state.vel * (1.0 - params.damping) + push * params.accel * params.dt
        pos = state.pos + vel * params.dt
        s = SpreadState(
            pos.astype(jnp.float32), vel.astype(jnp.float32), state.landmarks, state.time + 1
        )
        dist = jnp.linalg.norm(
            s.landmarks[:, None, :] - s.pos[None, :, :], axis=-1
        )  # [landmark, agent]
        coverage = -jnp.sum(jnp.min(dist, axis=1))
        gap = jnp.linalg.norm(s.pos[:, None, :] - s.pos[None, :, :], axis=-1)
        pairs = jnp.sum(jnp.triu(gap < 2 * params.agent_radius, k=1))
        reward = coverage - params.collision_penalty * pairs
        return s, self._ts(s, reward, s.time >= params.max_steps_in_episode)
