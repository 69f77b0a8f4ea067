"""MountainCar-v0 (Moore 1990), dynamics as in Gymnasium's reference.

An underpowered car in a valley ``height = sin(3 x)`` pushes left (0), not at all (1) or
right (2). The velocity gains ``(action - 1) * force - cos(3 x) * gravity`` and is clipped
to ``[-0.07, 0.07]``; the position then moves by the new velocity and is clipped to
``[-1.2, 0.6]``. Hitting the left wall is inelastic (a negative velocity becomes 0).
Reward -1 on every step; termination when ``x >= 0.5`` and ``velocity >= 0``; time
limit 200 steps.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsampler.envs.base import SingleAgentEnv
from jaxsampler.spaces import Box, Discrete

__all__ = ["MountainCar", "MountainCarParams", "MountainCarState"]


@struct.dataclass
class MountainCarState:
    position: jax.Array  # float32[]
    velocity: jax.Array  # float32[]
    time: jax.Array  # int32[]


@struct.dataclass
class MountainCarParams:
    min_position: float = -1.2
    max_position: float = 0.6
    max_speed: float = 0.07
    goal_position: float = 0.5
    goal_velocity: float = 0.0
    force: float = 0.001
    gravity: float = 0.0025
    max_steps_in_episode: int = 200


_OBS_LOW = np.array([-1.2, -0.07], dtype=np.float32)
_OBS_HIGH = np.array([0.6, 0.07], dtype=np.float32)


@dataclasses.dataclass(frozen=True)
class MountainCar(SingleAgentEnv):
    """MountainCar-v0: accelerate left (0), coast (1) or right (2) to reach the right hilltop."""

    @property
    def name(self) -> str:
        return "MountainCar-v0"

    @property
    def default_params(self) -> MountainCarParams:
        return MountainCarParams()

    @property
    def observation_space(self) -> Box:
        return Box(_OBS_LOW, _OBS_HIGH, (2,), np.float32)

    @property
    def action_space(self) -> Discrete:
        return Discrete(3)

    def reset_env(
        self, key: jax.Array, params: MountainCarParams
    ) -> tuple[jax.Array, MountainCarState]:
        return reset_valley(key)

    def step_env(
        self, key: jax.Array, state: MountainCarState, action: jax.Array, params: MountainCarParams
    ) -> tuple[jax.Array, MountainCarState, jax.Array, jax.Array, Any]:
        del key
        push = jnp.asarray(action, jnp.float32) - 1.0
        new, terminated = valley_step(state, push * params.force, params)
        reward = jnp.full((), -1.0, jnp.float32)
        return _obs(new), new, reward, terminated, self.reset_info(params)


def reset_valley(key: jax.Array) -> tuple[jax.Array, MountainCarState]:
    """Start at rest, uniformly in ``[-0.6, -0.4]`` (both MountainCar variants); returns
    ``(obs, state)``."""
    position = jax.random.uniform(key, (), jnp.float32, -0.6, -0.4)
    state = MountainCarState(position, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32))
    return _obs(state), state


def valley_step(
    state: MountainCarState, acceleration: jax.Array, params: Any
) -> tuple[MountainCarState, jax.Array]:
    """One step of the valley dynamics given the engine's acceleration; returns
    ``(state, terminated)``. ``params`` needs the gravity, speed, position and goal fields."""
    velocity = state.velocity + acceleration - jnp.cos(3.0 * state.position) * params.gravity
    velocity = jnp.clip(velocity, -params.max_speed, params.max_speed)
    position = jnp.clip(state.position + velocity, params.min_position, params.max_position)
    # Inelastic collision with the left wall.
    velocity = jnp.where((position == params.min_position) & (velocity < 0.0), 0.0, velocity)
    new = dataclasses.replace(
        state, position=position.astype(jnp.float32), velocity=velocity.astype(jnp.float32)
    )
    terminated = (new.position >= params.goal_position) & (new.velocity >= params.goal_velocity)
    return new, terminated


def _obs(s: MountainCarState) -> jax.Array:
    return jnp.stack([s.position, s.velocity]).astype(jnp.float32)
