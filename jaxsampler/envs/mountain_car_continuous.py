"""MountainCarContinuous-v0, dynamics and reward as in Gymnasium's reference.

The same valley as :mod:`jaxsampler.envs.mountain_car`, driven by a continuous force:
the action is clipped to ``[-1, 1]`` and scaled by ``power = 0.0015``. The goal is at
``x >= 0.45`` (with ``velocity >= 0``). Reward ``-0.1 * action^2`` on every step plus
100 on the step that reaches the goal. As in Gymnasium, the action penalty uses the
action *before* clipping. Time limit 999 steps.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsampler.env import SingleAgentEnv
from jaxsampler.spaces import Box

__all__ = ["MountainCarContinuous", "MountainCarContinuousParams", "MountainCarContinuousState"]


@struct.dataclass
class MountainCarContinuousState:
    position: jax.Array  # float32[]
    velocity: jax.Array  # float32[]
    time: jax.Array  # int32[]


@struct.dataclass
class MountainCarContinuousParams:
    min_action: float = -1.0
    max_action: float = 1.0
    min_position: float = -1.2
    max_position: float = 0.6
    max_speed: float = 0.07
    goal_position: float = 0.45
    goal_velocity: float = 0.0
    power: float = 0.0015
    gravity: float = 0.0025
    goal_reward: float = 100.0
    action_cost: float = 0.1
    max_steps_in_episode: int = 999


_OBS_LOW = np.array([-1.2, -0.07], dtype=np.float32)
_OBS_HIGH = np.array([0.6, 0.07], dtype=np.float32)


@dataclasses.dataclass(frozen=True)
class MountainCarContinuous(SingleAgentEnv):
    """MountainCarContinuous-v0: push with a force in ``[-1, 1]`` (shape ``(1,)``) to reach the hilltop."""

    @property
    def name(self) -> str:
        return "MountainCarContinuous-v0"

    @property
    def default_params(self) -> MountainCarContinuousParams:
        return MountainCarContinuousParams()

    @property
    def observation_space(self) -> Box:
        return Box(_OBS_LOW, _OBS_HIGH, (2,), np.float32)

    @property
    def action_space(self) -> Box:
        return Box(-1.0, 1.0, (1,), np.float32)

    def reset_env(self, key: jax.Array, params: MountainCarContinuousParams):
        position = jax.random.uniform(key, (), jnp.float32, -0.6, -0.4)
        state = MountainCarContinuousState(
            position, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32)
        )
        return state, _obs(state)

    def step_env(
        self,
        key: jax.Array,
        state: MountainCarContinuousState,
        action: jax.Array,
        params: MountainCarContinuousParams,
    ):
        del key
        a = jnp.asarray(action, jnp.float32)[0]
        force = jnp.clip(a, params.min_action, params.max_action)
        velocity = state.velocity + force * params.power - params.gravity * jnp.cos(3.0 * state.position)
        velocity = jnp.clip(velocity, -params.max_speed, params.max_speed)
        position = jnp.clip(state.position + velocity, params.min_position, params.max_position)
        # Inelastic collision with the left wall.
        velocity = jnp.where((position == params.min_position) & (velocity < 0.0), 0.0, velocity)
        new = state.replace(
            position=position.astype(jnp.float32), velocity=velocity.astype(jnp.float32)
        )
        terminated = (new.position >= params.goal_position) & (new.velocity >= params.goal_velocity)
        reward = jnp.where(terminated, params.goal_reward, 0.0) - params.action_cost * a**2
        return new, _obs(new), reward.astype(jnp.float32), terminated, self.reset_info(params)


def _obs(s: MountainCarContinuousState) -> jax.Array:
    return jnp.stack([s.position, s.velocity]).astype(jnp.float32)
