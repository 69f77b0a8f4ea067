"""MountainCarContinuous-v0, dynamics and reward as in Gymnasium's reference.

The same valley as :mod:`jaxsampler.envs.mountain_car`, driven by a continuous force:
the action is clipped to ``[-1, 1]`` and scaled by ``power = 0.0015``. The goal is at
``x >= 0.45`` (with ``velocity >= 0``). Reward ``-0.1 * action^2`` on every step plus
100 on the step that reaches the goal. As in Gymnasium, the action penalty uses the
action *before* clipping. Time limit 999 steps. ``render`` draws the same frame as
MountainCar's (:func:`jaxsampler.envs.mountain_car.render_valley`), the flag at 0.45.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsampler.envs.base import SingleAgentEnv
from jaxsampler.envs.mountain_car import (
    _OBS_HIGH,
    _OBS_LOW,
    RENDER_SHAPE,
    MountainCarState,
    _obs,
    render_valley,
    reset_valley,
    valley_step,
)
from jaxsampler.spaces import Box

__all__ = ["MountainCarContinuous", "MountainCarContinuousParams", "MountainCarContinuousState"]


#: Same state as the discrete variant.
MountainCarContinuousState = MountainCarState


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


@dataclasses.dataclass(frozen=True)
class MountainCarContinuous(SingleAgentEnv):
    """MountainCarContinuous-v0: push with a force in ``[-1, 1]`` (shape ``(1,)``) to reach
    the hilltop."""

    @property
    def name(self) -> str:
        """The Gymnasium id, ``"MountainCarContinuous-v0"``."""
        return "MountainCarContinuous-v0"

    @property
    def default_params(self) -> MountainCarContinuousParams:
        """:class:`MountainCarContinuousParams` with Gymnasium's constants (goal at 0.45,
        999-step limit)."""
        return MountainCarContinuousParams()

    @property
    def observation_space(self) -> Box:
        """``float32[2]``: position in ``[-1.2, 0.6]`` and velocity in ``[-0.07, 0.07]``."""
        return Box(_OBS_LOW, _OBS_HIGH, (2,), np.float32)

    @property
    def action_space(self) -> Box:
        """``Box(-1, 1, (1,), float32)``: the engine force (``step_env`` clips it to that
        range)."""
        return Box(-1.0, 1.0, (1,), np.float32)

    def reset_env(
        self, key: jax.Array, params: MountainCarContinuousParams
    ) -> tuple[jax.Array, MountainCarContinuousState]:
        """The discrete variant's start: at rest, position uniform in ``[-0.6, -0.4]``
        (:func:`~jaxsampler.envs.mountain_car.reset_valley`)."""
        return reset_valley(key)

    def step_env(
        self,
        key: jax.Array,
        state: MountainCarContinuousState,
        action: jax.Array,
        params: MountainCarContinuousParams,
    ) -> tuple[jax.Array, MountainCarContinuousState, jax.Array, jax.Array, Any]:
        """MountainCarContinuous's dynamics: ``action[0]``, clipped to ``[min_action,
        max_action]`` and times ``power``, drives
        :func:`~jaxsampler.envs.mountain_car.valley_step`; reward ``goal_reward`` on the step
        that reaches the goal minus ``action_cost * action[0]**2`` of the *unclipped* action.
        ``key`` is unused."""
        del key
        a = jnp.asarray(action, jnp.float32)[0]
        force = jnp.clip(a, params.min_action, params.max_action)
        new, terminated = valley_step(state, force * params.power, params)
        reward = jnp.where(terminated, params.goal_reward, 0.0) - params.action_cost * a**2
        return _obs(new), new, reward.astype(jnp.float32), terminated, self.reset_info(params)

    @property
    def render_shape(self) -> tuple[int, int]:
        """``(200, 300)``, known statically (no tracing)."""
        return RENDER_SHAPE

    def render(
        self,
        state: MountainCarContinuousState,
        params: MountainCarContinuousParams | None = None,
    ) -> jax.Array:
        """The valley, the car and the flag: ``uint8[200, 300, 3]`` (see
        :func:`~jaxsampler.envs.mountain_car.render_valley`)."""
        return render_valley(state, self.default_params if params is None else params)
