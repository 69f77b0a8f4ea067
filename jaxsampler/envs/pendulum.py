"""Pendulum-v1: swing a frictionless pendulum up and hold it, as in Gymnasium's reference.

Semi-implicit Euler integration with ``dt = 0.05``: the new angular velocity (clipped to
``[-8, 8]``) is used to advance the angle. The torque is clipped to ``[-2, 2]``. The
reward is ``-(angle^2 + 0.1 * thetadot^2 + 0.001 * torque^2)`` for the angle wrapped
into ``[-pi, pi)`` (0 is upright) and evaluated on the state *before* the update. The
episode never terminates; time limit 200 steps. The stored angle is never wrapped.

``render`` draws a 200 x 200 frame (see :meth:`Pendulum.render`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsampler.envs import render as draw
from jaxsampler.envs.base import SingleAgentEnv
from jaxsampler.spaces import Box

__all__ = ["Pendulum", "PendulumParams", "PendulumState"]


@struct.dataclass
class PendulumState:
    theta: jax.Array  # float32[], radians, 0 is upright, not wrapped
    theta_dot: jax.Array  # float32[], radians per second
    time: jax.Array  # int32[]


@struct.dataclass
class PendulumParams:
    max_speed: float = 8.0
    max_torque: float = 2.0
    dt: float = 0.05
    g: float = 10.0
    m: float = 1.0
    l: float = 1.0  # noqa: E741 (the pendulum's length, named as in the literature)
    max_steps_in_episode: int = 200


_OBS_HIGH = np.array([1.0, 1.0, 8.0], dtype=np.float32)

#: Frame size ``(H, W)`` of :meth:`Pendulum.render`.
RENDER_SHAPE = (200, 200)
_ROD_COLOR: draw.Color = (204, 77, 77)


@dataclasses.dataclass(frozen=True)
class Pendulum(SingleAgentEnv):
    """Pendulum-v1: apply a torque in ``[-2, 2]`` (shape ``(1,)``) to swing the pendulum up."""

    @property
    def name(self) -> str:
        """The Gymnasium id, ``"Pendulum-v1"``."""
        return "Pendulum-v1"

    @property
    def default_params(self) -> PendulumParams:
        """:class:`PendulumParams` with Gymnasium's constants (``g = 10``, 200-step limit)."""
        return PendulumParams()

    @property
    def observation_space(self) -> Box:
        """``float32[3]``: cos and sin of the angle (0 is upright) and the angular velocity in
        ``[-8, 8]``."""
        return Box(-_OBS_HIGH, _OBS_HIGH, (3,), np.float32)

    @property
    def action_space(self) -> Box:
        """``Box(-2, 2, (1,), float32)``: the torque (``step_env`` clips it to ``max_torque``)."""
        return Box(-2.0, 2.0, (1,), np.float32)

    def reset_env(self, key: jax.Array, params: PendulumParams) -> tuple[jax.Array, PendulumState]:
        """Pendulum's start: angle uniform in ``[-pi, pi]``, angular velocity uniform in
        ``[-1, 1]``."""
        high = jnp.array([math.pi, 1.0], jnp.float32)
        theta, theta_dot = jax.random.uniform(key, (2,), jnp.float32, -high, high)
        state = PendulumState(theta, theta_dot, jnp.zeros((), jnp.int32))
        return _obs(state), state

    def step_env(
        self, key: jax.Array, state: PendulumState, action: jax.Array, params: PendulumParams
    ) -> tuple[jax.Array, PendulumState, jax.Array, jax.Array, Any]:
        """Pendulum's dynamics: one semi-implicit Euler step under the clipped torque; the
        reward is minus the cost of the state *before* the step (wrapped angle squared, plus
        0.1 velocity squared, plus 0.001 torque squared); never terminates. ``key`` is
        unused."""
        del key
        u = jnp.clip(jnp.asarray(action, jnp.float32)[0], -params.max_torque, params.max_torque)
        costs = _angle_normalize(state.theta) ** 2 + 0.1 * state.theta_dot**2 + 0.001 * u**2
        theta_acc = (
            3.0 * params.g / (2.0 * params.l) * jnp.sin(state.theta)
            + 3.0 / (params.m * params.l**2) * u
        )
        theta_dot = jnp.clip(
            state.theta_dot + theta_acc * params.dt, -params.max_speed, params.max_speed
        )
        new = dataclasses.replace(
            state,
            theta=(state.theta + theta_dot * params.dt).astype(jnp.float32),
            theta_dot=theta_dot.astype(jnp.float32),
        )
        reward = (-costs).astype(jnp.float32)
        terminated = jnp.zeros((), jnp.bool_)
        return _obs(new), new, reward, terminated, self.reset_info(params)

    @property
    def render_shape(self) -> tuple[int, int]:
        """``(200, 200)``, known statically (no tracing)."""
        return RENDER_SHAPE

    def render(self, state: PendulumState, params: PendulumParams | None = None) -> jax.Array:
        """The rod at angle ``theta``: ``uint8[200, 200, 3]``. Pure; jit/vmap-safe.

        The view is the world square ``[-2.2, 2.2]^2``, so ``scale = 200 / 4.4`` px per
        unit. The rod (red, ``0.2 * scale`` wide, round ends) is one unit long whatever
        ``params.l`` (as Gymnasium draws it): from the pivot at the frame's center
        ``(100, 100)`` to ``(100 - scale * sin(theta), 100 - scale * cos(theta))`` in
        pixels, i.e. straight up at ``theta = 0`` and turning counter-clockwise as
        ``theta`` grows. A black dot marks the pivot.
        """
        shape = RENDER_SHAPE
        scale = shape[1] / 4.4
        cx, cy = shape[1] / 2, shape[0] / 2
        end_x = cx - scale * jnp.sin(state.theta)
        end_y = cy - scale * jnp.cos(state.theta)
        rod = draw.segment_mask(shape, cx, cy, end_x, end_y, 0.2 * scale)
        pivot = draw.circle_mask(shape, cx, cy, 0.05 * scale)
        return draw.compose(shape, [(rod, _ROD_COLOR), (pivot, draw.BLACK)], draw.WHITE)


def _angle_normalize(x: jax.Array) -> jax.Array:
    # Python-style modulo (sign of the divisor), so the result lies in [-pi, pi).
    return jnp.mod(x + jnp.pi, 2.0 * jnp.pi) - jnp.pi


def _obs(s: PendulumState) -> jax.Array:
    return jnp.stack([jnp.cos(s.theta), jnp.sin(s.theta), s.theta_dot]).astype(jnp.float32)
