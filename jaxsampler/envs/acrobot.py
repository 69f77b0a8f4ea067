"""Acrobot-v1 (Sutton & Barto 1998, Sutton 1996), dynamics as in Gymnasium's reference.

Two links hang from a fixed joint; a torque of -1, 0 or +1 (actions 0, 1, 2) acts on the
joint between them. One fourth-order Runge-Kutta step of ``dt = 0.2`` integrates the
equations of motion ("book" variant by default, "nips" on request); the joint angles
are then wrapped into ``[-pi, pi]`` and the angular velocities clipped to
``[-4 pi, 4 pi]`` and ``[-9 pi, 9 pi]``. Termination once the free end is higher than
one link length above the fixed joint, ``-cos(t1) - cos(t1 + t2) > 1``; reward -1 on
every step except the terminating one (0). Time limit 500 steps.

``render`` draws a 200 x 200 frame (see :meth:`Acrobot.render`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsampler.envs import render as draw
from jaxsampler.envs.base import SingleAgentEnv
from jaxsampler.spaces import Box, Discrete

__all__ = ["Acrobot", "AcrobotParams", "AcrobotState"]


@struct.dataclass
class AcrobotState:
    theta1: jax.Array  # float32[], first joint angle, 0 is hanging down
    theta2: jax.Array  # float32[], second joint angle, relative to the first link
    dtheta1: jax.Array  # float32[]
    dtheta2: jax.Array  # float32[]
    time: jax.Array  # int32[]


@struct.dataclass
class AcrobotParams:
    dt: float = 0.2
    link_length_1: float = 1.0
    link_length_2: float = 1.0  # enters only the termination height (through link 1)
    link_mass_1: float = 1.0
    link_mass_2: float = 1.0
    link_com_pos_1: float = 0.5
    link_com_pos_2: float = 0.5
    link_moi: float = 1.0  # moment of inertia of either link
    max_vel_1: float = 4 * math.pi
    max_vel_2: float = 9 * math.pi
    gravity: float = 9.8
    torque_noise_max: float = 0.0
    max_steps_in_episode: int = 500


_OBS_HIGH = np.array([1.0, 1.0, 1.0, 1.0, 4 * math.pi, 9 * math.pi], dtype=np.float32)

#: Frame size ``(H, W)`` of :meth:`Acrobot.render`.
RENDER_SHAPE = (200, 200)
_LINK_COLOR: draw.Color = (0, 204, 204)
_JOINT_COLOR: draw.Color = (204, 204, 0)


@dataclasses.dataclass(frozen=True)
class Acrobot(SingleAgentEnv):
    """Acrobot-v1: apply torque -1 (0), 0 (1) or +1 (2) to swing the tip above the bar.

    Attributes:
        book_or_nips: which equations of motion to integrate, ``"book"`` (Sutton &
            Barto, Gymnasium's default) or ``"nips"`` (Sutton 1996, which drops one
            Coriolis term). A static switch: it picks a code path.
    """

    book_or_nips: str = "book"

    def __post_init__(self):
        if self.book_or_nips not in ("book", "nips"):
            raise ValueError(f"book_or_nips must be 'book' or 'nips', got {self.book_or_nips!r}")

    @property
    def name(self) -> str:
        """The Gymnasium id, ``"Acrobot-v1"``."""
        return "Acrobot-v1"

    @property
    def default_params(self) -> AcrobotParams:
        """:class:`AcrobotParams` with Gymnasium's constants (``dt = 0.2``, no torque noise,
        500-step limit)."""
        return AcrobotParams()

    @property
    def observation_space(self) -> Box:
        """``float32[6]``: cos and sin of both joint angles, then the two angular velocities
        (bounded by ``4 pi`` and ``9 pi``)."""
        return Box(-_OBS_HIGH, _OBS_HIGH, (6,), np.float32)

    @property
    def action_space(self) -> Discrete:
        """``Discrete(3)``: torque -1 (0), 0 (1) or +1 (2) on the middle joint."""
        return Discrete(3)

    def reset_env(self, key: jax.Array, params: AcrobotParams) -> tuple[jax.Array, AcrobotState]:
        """Acrobot's start: both angles and both angular velocities uniform in ``[-0.1, 0.1]``."""
        t1, t2, d1, d2 = jax.random.uniform(key, (4,), jnp.float32, -0.1, 0.1)
        state = AcrobotState(t1, t2, d1, d2, jnp.zeros((), jnp.int32))
        return _obs(state), state

    def step_env(
        self, key: jax.Array, state: AcrobotState, action: jax.Array, params: AcrobotParams
    ) -> tuple[jax.Array, AcrobotState, jax.Array, jax.Array, Any]:
        """Acrobot's dynamics: one RK4 step of ``dt`` under the chosen torque (plus uniform
        noise of size ``torque_noise_max``, drawn from ``key``), angles wrapped into
        ``[-pi, pi]``, velocities clipped; terminated once ``-cos(theta1) - cos(theta1 +
        theta2) > 1``; reward -1, or 0 on the terminating step."""
        # The noise is always drawn (no branch on a traced number); it is 0 by default.
        noise = jax.random.uniform(key, (), jnp.float32, -1.0, 1.0) * params.torque_noise_max
        torque = jnp.asarray(action, jnp.float32) - 1.0 + noise
        y0 = jnp.stack([state.theta1, state.theta2, state.dtheta1, state.dtheta2])
        y1 = _rk4(lambda y: self._dsdt(y, torque, params), y0, params.dt)
        new = dataclasses.replace(
            state,
            theta1=_wrap(y1[0], -jnp.pi, jnp.pi).astype(jnp.float32),
            theta2=_wrap(y1[1], -jnp.pi, jnp.pi).astype(jnp.float32),
            dtheta1=jnp.clip(y1[2], -params.max_vel_1, params.max_vel_1).astype(jnp.float32),
            dtheta2=jnp.clip(y1[3], -params.max_vel_2, params.max_vel_2).astype(jnp.float32),
        )
        terminated = -jnp.cos(new.theta1) - jnp.cos(new.theta2 + new.theta1) > 1.0
        reward = jnp.where(terminated, 0.0, -1.0).astype(jnp.float32)
        return _obs(new), new, reward, terminated, self.reset_info(params)

    @property
    def render_shape(self) -> tuple[int, int]:
        """``(200, 200)``, known statically (no tracing)."""
        return RENDER_SHAPE

    def render(self, state: AcrobotState, params: AcrobotParams | None = None) -> jax.Array:
        """The two links: ``uint8[200, 200, 3]``. Pure; jit/vmap-safe.

        The view is the world square ``[-b, b]^2`` with ``b = link_length_1 +
        link_length_2 + 0.2`` around the fixed joint at the frame's center (``y`` up).
        The first link (teal, 0.1 units wide) runs from the fixed joint to
        ``p1 = l1 * (sin(theta1), -cos(theta1))``, the second from ``p1`` to
        ``p1 + l2 * (sin(theta1 + theta2), -cos(theta1 + theta2))``: both hang straight
        down at zero angles. Yellow dots mark the two joints; the black line at world
        height ``link_length_1`` is the height the tip must pass.
        """
        params = self.default_params if params is None else params
        shape = RENDER_SHAPE
        l1, l2 = params.link_length_1, params.link_length_2
        bound = l1 + l2 + 0.2
        view = draw.Viewport(shape, -bound, bound, -bound, bound)
        a1, a12 = state.theta1, state.theta1 + state.theta2
        x1, y1 = l1 * jnp.sin(a1), -l1 * jnp.cos(a1)
        x2, y2 = x1 + l2 * jnp.sin(a12), y1 - l2 * jnp.cos(a12)
        (p0x, p1x, p2x), (p0y, p1y, p2y) = view.to_pixel(
            jnp.stack([0.0, x1, x2]), jnp.stack([0.0, y1, y2])
        )
        width = 0.1 * view.scale_x
        _, goal_y = view.to_pixel(0.0, l1)
        goal = draw.rect_mask(shape, 0.0, goal_y - 0.5, shape[1], goal_y + 0.5)
        link1 = draw.segment_mask(shape, p0x, p0y, p1x, p1y, width)
        link2 = draw.segment_mask(shape, p1x, p1y, p2x, p2y, width)
        joints = draw.circle_mask(shape, p0x, p0y, width * 0.6)
        joints |= draw.circle_mask(shape, p1x, p1y, width * 0.6)
        layers = [
            (goal, draw.BLACK),
            (link1 | link2, _LINK_COLOR),
            (joints, _JOINT_COLOR),
        ]
        return draw.compose(shape, layers, draw.WHITE)

    def _dsdt(self, y: jax.Array, torque: jax.Array, p: AcrobotParams) -> jax.Array:
        """Time derivative of ``y = [theta1, theta2, dtheta1, dtheta2]`` (float32[4])."""
        m1, m2 = p.link_mass_1, p.link_mass_2
        l1, lc1, lc2 = p.link_length_1, p.link_com_pos_1, p.link_com_pos_2
        i1 = i2 = p.link_moi
        g = p.gravity
        theta1, theta2, dtheta1, dtheta2 = y[0], y[1], y[2], y[3]
        d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * jnp.cos(theta2)) + i1 + i2
        d2 = m2 * (lc2**2 + l1 * lc2 * jnp.cos(theta2)) + i2
        phi2 = m2 * lc2 * g * jnp.cos(theta1 + theta2 - jnp.pi / 2.0)
        phi1 = (
            -m2 * l1 * lc2 * dtheta2**2 * jnp.sin(theta2)
            - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * jnp.sin(theta2)
            + (m1 * lc1 + m2 * l1) * g * jnp.cos(theta1 - jnp.pi / 2.0)
            + phi2
        )
        numerator = torque + d2 / d1 * phi1 - phi2
        if self.book_or_nips == "book":  # static switch
            numerator = numerator - m2 * l1 * lc2 * dtheta1**2 * jnp.sin(theta2)
        ddtheta2 = numerator / (m2 * lc2**2 + i2 - d2**2 / d1)
        ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
        return jnp.stack([dtheta1, dtheta2, ddtheta1, ddtheta2])


def _rk4(
    derivs: Callable[[jax.Array], jax.Array], y0: jax.Array, dt: float | jax.Array
) -> jax.Array:
    """One classical Runge-Kutta step of size ``dt`` for the autonomous ODE ``y' = derivs(y)``."""
    k1 = derivs(y0)
    k2 = derivs(y0 + dt / 2.0 * k1)
    k3 = derivs(y0 + dt / 2.0 * k2)
    k4 = derivs(y0 + dt * k3)
    return y0 + dt / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4)


def _wrap(x: jax.Array, low: float, high: float) -> jax.Array:
    """Shifts ``x`` by whole periods ``high - low`` into ``[low, high]``.

    Equals Gymnasium's loop (subtract while above ``high``, add while below ``low``) in
    closed form, so a value exactly on a bound stays there.
    """
    period = high - low
    x = jnp.where(x > high, x - period * jnp.ceil((x - high) / period), x)
    return jnp.where(x < low, x + period * jnp.ceil((low - x) / period), x)


def _obs(s: AcrobotState) -> jax.Array:
    return jnp.stack(
        [
            jnp.cos(s.theta1),
            jnp.sin(s.theta1),
            jnp.cos(s.theta2),
            jnp.sin(s.theta2),
            s.dtheta1,
            s.dtheta2,
        ]
    ).astype(jnp.float32)
