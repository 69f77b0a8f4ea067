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

``render`` draws a 200 x 200 frame of the plane (see :meth:`Spread.render`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsampler.envs import render as draw
from jaxsampler.envs.base import MultiAgentEnv
from jaxsampler.spaces import Box, Discrete

__all__ = ["Spread", "SpreadParams", "SpreadState", "others"]

_PUSH = np.array([[0.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [0.0, -1.0], [0.0, 1.0]], np.float32)


#: Frame size ``(H, W)`` of :meth:`Spread.render`, and the world square it shows.
RENDER_SHAPE = (200, 200)
RENDER_BOUND = 2.0
_LANDMARK_RADIUS = 0.06


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


def others(x: jax.Array, agent_id: jax.Array) -> jax.Array:
    """The rows of ``x`` (``[N, ...]``) other than row ``agent_id``, in order: ``[N - 1, ...]``.

    A select between two static slices, not a gather (cheaper once vmapped over agents).
    """
    after = jnp.arange(x.shape[0] - 1) >= agent_id  # row k comes from x[k + 1]
    return jnp.where(after.reshape(after.shape + (1,) * (x.ndim - 1)), x[1:], x[:-1])


@dataclasses.dataclass(frozen=True)
class Spread(MultiAgentEnv):
    """``Spread(n=3)``: cooperative coverage of ``n`` landmarks by ``n`` agents.

    The particle dynamics and the team reward are whole-array world code; each agent's
    observation is written for one agent and lifted onto the agent axis by
    :class:`~jaxsampler.envs.base.MultiAgentEnv`.
    """

    n: int = 3
    num_agents: ClassVar[int] = 3  # overridden per instance in __post_init__

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"Spread needs n >= 1 agents, got {self.n!r}")
        object.__setattr__(self, "num_agents", self.n)

    @property
    def name(self) -> str:
        """``"Spread-v0"``."""
        return "Spread-v0"

    @property
    def default_params(self) -> SpreadParams:
        """:class:`SpreadParams` (25-step limit, as in "simple spread")."""
        return SpreadParams()

    @property
    def observation_space(self) -> Box:
        """``float32[4 + 2N + 2(N - 1)]``, unbounded: own velocity and position, the landmarks
        and the other agents relative to it."""
        return Box(-np.inf, np.inf, (4 + 2 * self.n + 2 * (self.n - 1),), np.float32)

    @property
    def action_space(self) -> Discrete:
        """``Discrete(5)``: no push, left, right, down or up."""
        return Discrete(5)

    def reset_world(self, key: jax.Array, params: SpreadParams) -> SpreadState:
        """Agents and landmarks uniform in ``[-1, 1]^2``, agents at rest."""
        k_pos, k_land = jax.random.split(key)
        pos = jax.random.uniform(k_pos, (self.n, 2), jnp.float32, -1.0, 1.0)
        landmarks = jax.random.uniform(k_land, (self.n, 2), jnp.float32, -1.0, 1.0)
        zeros = jnp.zeros((self.n, 2), jnp.float32)
        return SpreadState(pos, zeros, landmarks, jnp.zeros((), jnp.int32))

    def step_world(
        self, key: jax.Array, state: SpreadState, action: jax.Array, params: SpreadParams
    ) -> tuple[SpreadState, jax.Array]:
        """Moves every particle by its push (``action``: ``int[N]``); the shared part
        is the team reward (``float32[]``)."""
        push = jnp.asarray(_PUSH)[action]  # [N, 2]
        vel = state.vel * (1.0 - params.damping) + push * params.accel * params.dt
        pos = state.pos + vel * params.dt
        s = SpreadState(
            pos.astype(jnp.float32), vel.astype(jnp.float32), state.landmarks, state.time + 1
        )
        # [landmark, agent]
        dist = jnp.linalg.norm(s.landmarks[:, None, :] - s.pos[None, :, :], axis=-1)
        coverage = -jnp.sum(jnp.min(dist, axis=1))
        gap = jnp.linalg.norm(s.pos[:, None, :] - s.pos[None, :, :], axis=-1)
        pairs = jnp.sum(jnp.triu(gap < 2 * params.agent_radius, k=1))
        return s, coverage - params.collision_penalty * pairs

    @property
    def render_shape(self) -> tuple[int, int]:
        """``(200, 200)``, known statically (no tracing)."""
        return RENDER_SHAPE

    def render(self, state: SpreadState, params: SpreadParams | None = None) -> jax.Array:
        """Agents and landmarks on the plane: ``uint8[200, 200, 3]``. Pure; jit/vmap-safe.

        The view is the world square ``[-2, 2]^2`` (``y`` up), 50 px per unit; the light
        gray square outlines ``[-1, 1]^2``, where everything starts. Landmarks are dark
        gray discs of radius 0.06; agent ``i`` is a disc of radius ``agent_radius`` in
        color ``render.AGENT_COLORS[i % 8]``, drawn over the landmarks (a later agent over
        an earlier one). Anything outside the view is not drawn.
        """
        params = self.default_params if params is None else params
        shape = RENDER_SHAPE
        b = RENDER_BOUND
        view = draw.Viewport(shape, -b, b, -b, b)
        (x0, x1), (y0, y1) = view.to_pixel(jnp.array([-1.0, 1.0]), jnp.array([1.0, -1.0]))
        outer = draw.rect_mask(shape, x0 - 1.0, y0 - 1.0, x1 + 1.0, y1 + 1.0)
        layers = [(outer & ~draw.rect_mask(shape, x0, y0, x1, y1), draw.LIGHT_GRAY)]
        lx, ly = view.to_pixel(state.landmarks[:, 0], state.landmarks[:, 1])
        landmarks = jnp.zeros(shape, jnp.bool_)
        for i in range(self.n):  # static and small: one disc each
            landmarks |= draw.circle_mask(shape, lx[i], ly[i], _LANDMARK_RADIUS * view.scale_x)
        layers.append((landmarks, draw.DARK_GRAY))
        ax, ay = view.to_pixel(state.pos[:, 0], state.pos[:, 1])
        radius = params.agent_radius * view.scale_x
        for i in range(self.n):
            layers.append((draw.circle_mask(shape, ax[i], ay[i], radius), draw.agent_color(i)))
        return draw.compose(shape, layers, draw.WHITE)

    def agent_rows(self, state: SpreadState) -> tuple[jax.Array, jax.Array]:
        """Spread's per-agent rows: ``(pos, vel)``, ``float32[N, 2]`` each, so ``own`` is the
        agent's position and velocity."""
        return state.pos, state.vel  # own = (position, velocity), float32[2] each

    def agent_obs(
        self, agent_id: jax.Array, own: Any, state: SpreadState, params: SpreadParams
    ) -> jax.Array:
        """Own velocity and position, landmarks and the other agents relative to it."""
        mine, vel = own
        parts = [
            vel,
            mine,
            (state.landmarks - mine).reshape(-1),
            (others(state.pos, agent_id) - mine).reshape(-1),
        ]
        return jnp.concatenate(parts).astype(jnp.float32)

    def agent_reward(
        self,
        agent_id: jax.Array,
        own: Any,
        state: SpreadState,
        shared: jax.Array,
        params: SpreadParams,
    ) -> jax.Array:
        """The team reward every agent shares (``shared``, from :meth:`step_world`)."""
        return shared  # the team reward

    def agent_acting(
        self, agent_id: jax.Array, own: Any, state: SpreadState, params: SpreadParams
    ) -> jax.Array:
        """Always True: every agent acts on every step (Spread ends by truncation only, for all
        agents at once)."""
        return jnp.ones((), jnp.bool_)  # every agent acts every step
