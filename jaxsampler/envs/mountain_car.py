"""MountainCar-v0 (Moore 1990), dynamics as in Gymnasium's reference.

An underpowered car in a valley ``height = sin(3 x)`` pushes left (0), not at all (1) or
right (2). The velocity gains ``(action - 1) * force - cos(3 x) * gravity`` and is clipped
to ``[-0.07, 0.07]``; the position then moves by the new velocity and is clipped to
``[-1.2, 0.6]``. Hitting the left wall is inelastic (a negative velocity becomes 0).
Reward -1 on every step; termination when ``x >= 0.5`` and ``velocity >= 0``; time
limit 200 steps.

``render`` draws a 300 x 200 frame of the valley, the car and the goal flag (see
:func:`render_valley`, which both MountainCar variants use).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsampler.envs import render as draw
from jaxsampler.envs.base import SingleAgentEnv
from jaxsampler.spaces import Box, Discrete

__all__ = ["MountainCar", "MountainCarParams", "MountainCarState", "render_valley"]

#: Frame size ``(H, W)`` of both MountainCar variants' ``render``.
RENDER_SHAPE = (200, 300)
_GROUND_COLOR: draw.Color = (222, 205, 160)
_CAR_COLOR: draw.Color = (0, 0, 0)
_LINE_COLOR: draw.Color = draw.DARK_GRAY
_WHEEL_COLOR: draw.Color = (128, 128, 128)
_FLAG_COLOR: draw.Color = (204, 204, 0)
_CAR_W, _CAR_H, _CLEARANCE, _WHEEL_R = 20.0, 10.0, 5.0, 4.0
_FLAG_POLE, _FLAG_W, _FLAG_H = 25.0, 12.0, 6.0


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
        """The Gymnasium id, ``"MountainCar-v0"``."""
        return "MountainCar-v0"

    @property
    def default_params(self) -> MountainCarParams:
        """:class:`MountainCarParams` with Gymnasium's constants (200-step limit)."""
        return MountainCarParams()

    @property
    def observation_space(self) -> Box:
        """``float32[2]``: position in ``[-1.2, 0.6]`` and velocity in ``[-0.07, 0.07]``."""
        return Box(_OBS_LOW, _OBS_HIGH, (2,), np.float32)

    @property
    def action_space(self) -> Discrete:
        """``Discrete(3)``: accelerate left (0), coast (1) or accelerate right (2)."""
        return Discrete(3)

    def reset_env(
        self, key: jax.Array, params: MountainCarParams
    ) -> tuple[jax.Array, MountainCarState]:
        """MountainCar's start: at rest, position uniform in ``[-0.6, -0.4]``
        (:func:`reset_valley`)."""
        return reset_valley(key)

    def step_env(
        self, key: jax.Array, state: MountainCarState, action: jax.Array, params: MountainCarParams
    ) -> tuple[jax.Array, MountainCarState, jax.Array, jax.Array, Any]:
        """MountainCar's dynamics: :func:`valley_step` with the engine's acceleration
        ``(action - 1) * force``; reward -1 on every step; terminated once ``position >=
        goal_position`` with ``velocity >= goal_velocity``. ``key`` is unused."""
        del key
        push = jnp.asarray(action, jnp.float32) - 1.0
        new, terminated = valley_step(state, push * params.force, params)
        reward = jnp.full((), -1.0, jnp.float32)
        return _obs(new), new, reward, terminated, self.reset_info(params)

    @property
    def render_shape(self) -> tuple[int, int]:
        """``(200, 300)``, known statically (no tracing)."""
        return RENDER_SHAPE

    def render(self, state: MountainCarState, params: MountainCarParams | None = None) -> jax.Array:
        """The valley, the car and the flag: ``uint8[200, 300, 3]`` (:func:`render_valley`)."""
        return render_valley(state, self.default_params if params is None else params)


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


def valley_height(x: jax.Array) -> jax.Array:
    """The valley's height at position ``x``: ``0.45 * sin(3 x) + 0.55``."""
    return 0.45 * jnp.sin(3.0 * x) + 0.55


def render_valley(state: MountainCarState, params: Any) -> jax.Array:
    """The valley, the car and the goal flag: ``uint8[200, 300, 3]``. Pure; jit/vmap-safe.

    Geometry (pixel coordinates, ``y`` down): the view spans ``[min_position,
    max_position]`` across the 300 columns at ``scale = 300 / (max_position -
    min_position)`` px per unit (166.7 by default) on both axes, world height 0 at the
    bottom edge. The ground below the curve ``valley_height(x)`` (a dark gray line) is
    sand colored. The car is a black ``20 x 10`` px box tilted to the slope angle
    ``alpha = atan(1.35 cos(3 x))``, its center ``5 + 10 / 2`` px above the curve point
    of ``x`` along the curve's normal, i.e. at
    ``((x - min_position) * scale - 10 sin(alpha), H - valley_height(x) * scale -
    10 cos(alpha))``; two gray wheels sit under it. The flag (a dark gray pole 2 px
    wide, a yellow pennant pointing right) stands 25 px tall on the curve at
    ``goal_position``.

    Args:
        state: a :class:`MountainCarState` (one env).
        params: params with ``min_position``, ``max_position`` and ``goal_position``.
    """
    shape = RENDER_SHAPE
    h, w = shape
    scale = w / (params.max_position - params.min_position)
    view = draw.Viewport(shape, params.min_position, params.max_position, 0.0, h / scale)
    cols = params.min_position + (jnp.arange(w, dtype=jnp.float32) + 0.5) / scale
    _, curve_y = view.to_pixel(cols, valley_height(cols))
    layers = [
        (draw.below_curve_mask(shape, curve_y), _GROUND_COLOR),
        (draw.curve_mask(shape, curve_y, 1.5), _LINE_COLOR),
    ]

    # Flag.
    gx, gy = view.to_pixel(params.goal_position, valley_height(params.goal_position))
    top = gy - _FLAG_POLE
    layers.append((draw.rect_mask(shape, gx - 1.0, top, gx + 1.0, gy), _LINE_COLOR))
    pennant = draw.triangle_mask(
        shape, (gx + 1.0, top), (gx + 1.0, top + _FLAG_H), (gx + 1.0 + _FLAG_W, top + _FLAG_H / 2)
    )
    layers.append((pennant, _FLAG_COLOR))

    # Car: tangent t and normal n in pixel coordinates (y down).
    x = state.position
    alpha = jnp.arctan(1.35 * jnp.cos(3.0 * x))
    tx, ty = jnp.cos(alpha), -jnp.sin(alpha)
    nx, ny = -jnp.sin(alpha), -jnp.cos(alpha)
    px, py = view.to_pixel(x, valley_height(x))
    lift = _CLEARANCE + _CAR_H / 2
    cx, cy = px + nx * lift, py + ny * lift
    wheels = jnp.zeros(shape, jnp.bool_)
    for side in (-1.0, 1.0):
        wx = cx + side * tx * _CAR_W / 4 - nx * _CAR_H / 2
        wy = cy + side * ty * _CAR_W / 4 - ny * _CAR_H / 2
        wheels |= draw.circle_mask(shape, wx, wy, _WHEEL_R)
    layers.append((wheels, _WHEEL_COLOR))
    layers.append((draw.box_mask(shape, cx, cy, _CAR_W, _CAR_H, -alpha), _CAR_COLOR))
    return draw.compose(shape, layers, draw.WHITE)


def _obs(s: MountainCarState) -> jax.Array:
    return jnp.stack([s.position, s.velocity]).astype(jnp.float32)
