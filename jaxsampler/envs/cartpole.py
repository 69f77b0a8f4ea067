"""CartPole-v1 (Barto, Sutton & Anderson 1983), dynamics as in Gymnasium's reference.

Explicit Euler integration with ``tau = 0.02``; reward 1 on every step, including the
one that terminates; termination when ``|x| > 2.4`` or ``|theta| > 12 deg``; time limit
500 steps.

``render`` draws a 300 x 200 frame laid out as Gymnasium's (at half its size); see
:meth:`CartPole.render` for the exact pixel geometry.
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
from jaxsampler.spaces import Box, Discrete

__all__ = ["CartPole", "CartPoleParams", "CartPoleState"]

#: Frame size ``(H, W)`` of :meth:`CartPole.render`.
RENDER_SHAPE = (200, 300)
_TRACK_Y = 150.0  # pixel row (center) of the track and the cart
_CART_W, _CART_H = 25.0, 15.0
_POLE_W = 5.0
_CART_COLOR: draw.Color = (0, 0, 0)
_POLE_COLOR: draw.Color = (202, 152, 101)
_AXLE_COLOR: draw.Color = (129, 132, 203)
_TRACK_COLOR: draw.Color = draw.DARK_GRAY


@struct.dataclass
class CartPoleState:
    x: jax.Array
    x_dot: jax.Array
    theta: jax.Array
    theta_dot: jax.Array
    time: jax.Array


@struct.dataclass
class CartPoleParams:
    gravity: float = 9.8
    masscart: float = 1.0
    masspole: float = 0.1
    length: float = 0.5  # half the pole's length
    force_mag: float = 10.0
    tau: float = 0.02
    theta_threshold_radians: float = 12 * 2 * math.pi / 360
    x_threshold: float = 2.4
    max_steps_in_episode: int = 500


_OBS_HIGH = np.array(
    [2.4 * 2, np.finfo(np.float32).max, 12 * 2 * math.pi / 360 * 2, np.finfo(np.float32).max],
    dtype=np.float32,
)


@dataclasses.dataclass(frozen=True)
class CartPole(SingleAgentEnv):
    """CartPole-v1: push a cart left (0) or right (1) to keep a pole upright."""

    @property
    def name(self) -> str:
        """The Gymnasium id, ``"CartPole-v1"``."""
        return "CartPole-v1"

    @property
    def default_params(self) -> CartPoleParams:
        """:class:`CartPoleParams` with Gymnasium's constants (500-step limit)."""
        return CartPoleParams()

    @property
    def observation_space(self) -> Box:
        """``float32[4]``: cart position and velocity, pole angle and angular velocity (bounds
        twice the termination thresholds; velocities unbounded)."""
        return Box(-_OBS_HIGH, _OBS_HIGH, (4,), np.float32)

    @property
    def action_space(self) -> Discrete:
        """``Discrete(2)``: push the cart left (0) or right (1)."""
        return Discrete(2)

    def reset_env(self, key: jax.Array, params: CartPoleParams) -> tuple[jax.Array, CartPoleState]:
        """CartPole's start: all four state variables uniform in ``[-0.05, 0.05]``."""
        x, x_dot, theta, theta_dot = jax.random.uniform(key, (4,), jnp.float32, -0.05, 0.05)
        state = CartPoleState(x, x_dot, theta, theta_dot, jnp.zeros((), jnp.int32))
        return _obs(state), state

    def step_env(
        self, key: jax.Array, state: CartPoleState, action: jax.Array, params: CartPoleParams
    ) -> tuple[jax.Array, CartPoleState, jax.Array, jax.Array, Any]:
        """CartPole's dynamics: one explicit Euler step of the cart-pole ODE under a force of
        ``+-force_mag``; reward 1 on every step; terminated once the cart leaves
        ``[-x_threshold, x_threshold]`` or the pole tilts past ``theta_threshold_radians``
        (12 degrees). ``key`` is unused."""
        del key
        force = jnp.where(action == 1, params.force_mag, -params.force_mag)
        total_mass = params.masspole + params.masscart
        polemass_length = params.masspole * params.length
        cos, sin = jnp.cos(state.theta), jnp.sin(state.theta)
        temp = (force + polemass_length * state.theta_dot**2 * sin) / total_mass
        theta_acc = (params.gravity * sin - cos * temp) / (
            params.length * (4.0 / 3.0 - params.masspole * cos**2 / total_mass)
        )
        x_acc = temp - polemass_length * theta_acc * cos / total_mass
        new = dataclasses.replace(
            state,
            x=state.x + params.tau * state.x_dot,
            x_dot=state.x_dot + params.tau * x_acc,
            theta=state.theta + params.tau * state.theta_dot,
            theta_dot=state.theta_dot + params.tau * theta_acc,
        )
        terminated = (jnp.abs(new.x) > params.x_threshold) | (
            jnp.abs(new.theta) > params.theta_threshold_radians
        )
        reward = jnp.ones((), jnp.float32)
        return _obs(new), new, reward, terminated, self.reset_info(params)

    @property
    def render_shape(self) -> tuple[int, int]:
        """``(200, 300)``, known statically (no tracing)."""
        return RENDER_SHAPE

    def render(self, state: CartPoleState, params: CartPoleParams | None = None) -> jax.Array:
        """The cart on its track and the pole: ``uint8[200, 300, 3]``. Pure; jit/vmap-safe.

        Geometry (pixel coordinates, ``y`` down, pixel centers at ``+0.5``): the view is
        ``4 * x_threshold`` world units wide (``[-4.8, 4.8]`` by default), so with
        ``scale = W / (4 * x_threshold)`` (31.25 px per unit) the cart is a black
        ``25 x 15`` px box centered at ``(W / 2 + x * scale, 150)`` on a dark gray track
        (the row ``y = 150``). The pole (tan, 5 px wide, round ends) runs from the axle
        (purple dot) at ``(cart_x, 150 - 15 / 4)`` to the tip at
        ``axle + scale * 2 * length * (sin(theta), -cos(theta))``: upright at
        ``theta = 0``, leaning right for ``theta > 0``. A cart outside the view is not
        drawn.
        """
        params = self.default_params if params is None else params
        shape = RENDER_SHAPE
        scale = shape[1] / (4.0 * params.x_threshold)
        cart_x = shape[1] / 2 + state.x * scale
        axle_y = _TRACK_Y - _CART_H / 4
        pole_len = scale * 2.0 * params.length
        tip_x = cart_x + pole_len * jnp.sin(state.theta)
        tip_y = axle_y - pole_len * jnp.cos(state.theta)
        track = draw.rect_mask(shape, 0.0, _TRACK_Y - 0.5, shape[1], _TRACK_Y + 0.5)
        layers = [
            (track, _TRACK_COLOR),
            (draw.box_mask(shape, cart_x, _TRACK_Y, _CART_W, _CART_H), _CART_COLOR),
            (draw.segment_mask(shape, cart_x, axle_y, tip_x, tip_y, _POLE_W), _POLE_COLOR),
            (draw.circle_mask(shape, cart_x, axle_y, _POLE_W / 2), _AXLE_COLOR),
        ]
        return draw.compose(shape, layers, draw.WHITE)


def _obs(s: CartPoleState) -> jax.Array:
    return jnp.stack([s.x, s.x_dot, s.theta, s.theta_dot]).astype(jnp.float32)
