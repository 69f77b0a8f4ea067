"""Goals: every agent walks to its own goal; agents finish at different times.

``N`` agents on the plane, each with its own goal point. Agents and goals start uniformly
in ``[-1, 1]^2``. Every step each agent that is still going picks one of 5 discrete moves
(none, left, right, down, up) and moves ``step_size`` along that axis; positions are
clipped to ``[-arena, arena]^2``. Agents do not interact (they may overlap).

Reward of an agent that moved: ``-step_penalty - distance_penalty * d`` (``d`` its
distance to its goal after the move), plus ``goal_reward`` when it reaches its goal
(``d <= goal_radius``). Reaching the goal terminates that agent alone: from then on it
no longer acts (``acting`` False, its actions are ignored, it does not move), gets
reward 0, keeps ``terminated`` True on every later step and its observation stays the
one of the step it finished. The others go on. When ``max_steps_in_episode`` steps have
been taken, every agent still going is truncated (``truncated`` True; agents that
finished earlier, or reach their goal on that very step, are ``terminated`` only). The
episode ends when every agent is terminated or truncated.

Observation of agent ``i`` (float32, ``2N + 2``): its position, its goal relative to its
position, the other agents' positions relative to it (in agent order, skipping itself).

Scenarios with known finishing times (tests, demos) start from
:meth:`Goals.reset_to` with chosen positions and goals instead of a random ``reset``.

``render`` draws a 200 x 200 frame of the arena (see :meth:`Goals.render`).
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
from jaxsampler.envs.spread import others
from jaxsampler.spaces import Box, Discrete
from jaxsampler.types import TimeStep

__all__ = ["Goals", "GoalsMove", "GoalsParams", "GoalsState"]

_MOVES = np.array([[0.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [0.0, -1.0], [0.0, 1.0]], np.float32)


#: Frame size ``(H, W)`` of :meth:`Goals.render`.
RENDER_SHAPE = (200, 200)
_AGENT_RADIUS_PX = 5.0


@struct.dataclass
class GoalsState:
    pos: jax.Array  # float32[N, 2]
    goals: jax.Array  # float32[N, 2]
    obs: jax.Array  # float32[N, 2N + 2], the last observation (frozen for finished agents)
    terminated: jax.Array  # bool[N], sticky
    truncated: jax.Array  # bool[N], sticky
    time: jax.Array  # int32[]


@struct.dataclass
class GoalsMove:
    """What one step did, read by every agent's reward."""

    going: jax.Array  # bool[N], the agent was still going before the step
    dist: jax.Array  # float32[N], its distance to its goal after the step


@struct.dataclass
class GoalsParams:
    step_size: float = 0.1
    goal_radius: float = 0.1
    arena: float = 1.0
    step_penalty: float = 0.01
    distance_penalty: float = 0.01
    goal_reward: float = 1.0
    max_steps_in_episode: int = 50


@dataclasses.dataclass(frozen=True)
class Goals(MultiAgentEnv):
    """``Goals(n=3)``: ``n`` agents, each walking to its own goal; each finishes on its own."""

    n: int = 3
    num_agents: ClassVar[int] = 3  # overridden per instance in __post_init__

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"Goals needs n >= 1 agents (an int), got {self.n!r}")
        object.__setattr__(self, "num_agents", self.n)

    @property
    def name(self) -> str:
        """``"Goals-v0"``."""
        return "Goals-v0"

    @property
    def default_params(self) -> GoalsParams:
        """:class:`GoalsParams` (50-step limit)."""
        return GoalsParams()

    @property
    def observation_space(self) -> Box:
        """``float32[2n + 2]``, unbounded: the agent's position, its goal relative to it, then
        the other agents' positions relative to it."""
        return Box(-np.inf, np.inf, (2 * self.n + 2,), np.float32)

    @property
    def action_space(self) -> Discrete:
        """``Discrete(5)``: stay, left, right, down or up by ``step_size``."""
        return Discrete(5)

    def observe(self, agent_id: jax.Array, pos: jax.Array, goals: jax.Array) -> jax.Array:
        """Agent ``agent_id``'s view of ``pos`` and ``goals`` (``float32[N, 2]`` each)."""
        mine = pos[agent_id]
        parts = [mine, goals[agent_id] - mine, (others(pos, agent_id) - mine).reshape(-1)]
        return jnp.concatenate(parts).astype(jnp.float32)

    def _world(self, pos: jax.Array, goals: jax.Array) -> GoalsState:
        def flags() -> jax.Array:
            return jnp.zeros((self.n,), jnp.bool_)

        obs = self.for_each_agent(self.observe, pos, goals)
        return GoalsState(pos, goals, obs, flags(), flags(), jnp.zeros((), jnp.int32))

    def reset_to(self, pos: jax.Array, goals: jax.Array) -> tuple[GoalsState, TimeStep]:
        """Starts an episode from given ``pos`` and ``goals`` (``float32[N, 2]`` each).

        Returns ``(state, timestep)`` like :meth:`reset`. Pure; safe under jit and vmap.
        """
        pos = jnp.asarray(pos, jnp.float32)
        goals = jnp.asarray(goals, jnp.float32)
        if pos.shape != (self.n, 2) or goals.shape != (self.n, 2):
            raise ValueError(
                f"reset_to needs pos and goals of shape ({self.n}, 2), "
                f"got {pos.shape}, {goals.shape}"
            )
        # The TimeStep's arrays are computed from the state's (per agent), never the
        # same arrays: under an eager (un-jitted) vmap a shared array comes out as one
        # buffer in both places, and a jitted rollout that donates its state would be
        # handed that buffer twice.
        s = self._world(pos, goals)
        return s, self.reset_timestep(s, self.default_params)

    def reset_world(self, key: jax.Array, params: GoalsParams) -> GoalsState:
        """Agents and goals uniform in ``[-1, 1]^2``."""
        k_pos, k_goal = jax.random.split(key)
        pos = jax.random.uniform(k_pos, (self.n, 2), jnp.float32, -1.0, 1.0)
        goals = jax.random.uniform(k_goal, (self.n, 2), jnp.float32, -1.0, 1.0)
        return self._world(pos, goals)

    def step_world(
        self, key: jax.Array, state: GoalsState, action: jax.Array, params: GoalsParams
    ) -> tuple[GoalsState, GoalsMove]:
        """Moves every agent still going by ``action`` (``int[N]``, values 0..4).

        Deterministic (``key`` is unused). The shared part is a :class:`GoalsMove`.
        """
        going = ~(state.terminated | state.truncated)
        move = jnp.asarray(_MOVES)[action] * params.step_size  # [N, 2]
        moved = jnp.clip(state.pos + move, -params.arena, params.arena)
        pos = jnp.where(going[:, None], moved, state.pos).astype(jnp.float32)
        dist = jnp.linalg.norm(state.goals - pos, axis=-1)
        reached = going & (dist <= params.goal_radius)
        time = state.time + 1
        obs = self.for_each_agent(self.observe, pos, state.goals)
        s = GoalsState(
            pos=pos,
            goals=state.goals,
            obs=jnp.where(going[:, None], obs, state.obs),
            terminated=state.terminated | reached,
            truncated=state.truncated | (going & ~reached & (time >= params.max_steps_in_episode)),
            time=time,
        )
        return s, GoalsMove(going=going, dist=dist)

    @property
    def render_shape(self) -> tuple[int, int]:
        """``(200, 200)``, known statically (no tracing)."""
        return RENDER_SHAPE

    def render(self, state: GoalsState, params: GoalsParams | None = None) -> jax.Array:
        """The arena, the goals and the agents: ``uint8[200, 200, 3]``. Pure; jit/vmap-safe.

        The view is the world square ``[-1.1 a, 1.1 a]^2`` for ``a = params.arena``
        (``y`` up); a light gray outline marks the arena's edge. Agent ``i`` has color
        ``render.AGENT_COLORS[i % 8]``: its goal is a ring of that color with radius
        ``goal_radius`` (at least 3 px), the agent a disc of radius 5 px at its position
        (drawn over the rings; a later agent over an earlier one). An agent that has
        finished (terminated or truncated) gets a black dot at its center.
        """
        params = self.default_params if params is None else params
        shape = RENDER_SHAPE
        b = 1.1 * params.arena
        view = draw.Viewport(shape, -b, b, -b, b)
        (x0, x1), (y0, y1) = view.to_pixel(
            jnp.stack([-params.arena, params.arena]), jnp.stack([params.arena, -params.arena])
        )
        outer = draw.rect_mask(shape, x0 - 1.0, y0 - 1.0, x1 + 1.0, y1 + 1.0)
        layers = [(outer & ~draw.rect_mask(shape, x0, y0, x1, y1), draw.LIGHT_GRAY)]
        colors = [draw.agent_color(i) for i in range(self.n)]
        gx, gy = view.to_pixel(state.goals[:, 0], state.goals[:, 1])
        ring_r = jnp.maximum(params.goal_radius * view.scale_x, 3.0)
        for i in range(self.n):  # static and small: one ring each
            layers.append((draw.ring_mask(shape, gx[i], gy[i], ring_r, 2.0), colors[i]))
        ax, ay = view.to_pixel(state.pos[:, 0], state.pos[:, 1])
        for i in range(self.n):
            layers.append((draw.circle_mask(shape, ax[i], ay[i], _AGENT_RADIUS_PX), colors[i]))
        done = state.terminated | state.truncated
        dots = jnp.zeros(shape, jnp.bool_)
        for i in range(self.n):
            dots |= done[i] & draw.circle_mask(shape, ax[i], ay[i], 2.0)
        layers.append((dots, draw.BLACK))
        return draw.compose(shape, layers, draw.WHITE)

    def agent_rows(self, state: GoalsState) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Goals' per-agent rows: ``(obs float32[N, 2N + 2], terminated bool[N], truncated
        bool[N])``, so ``own`` holds the agent's stored observation and sticky flags."""
        # own = (observation, terminated, truncated)
        return state.obs, state.terminated, state.truncated

    def agent_obs(
        self, agent_id: jax.Array, own: Any, state: GoalsState, params: GoalsParams
    ) -> jax.Array:
        """The observation stored in the state (``own[0]``): computed by :meth:`step_world`,
        frozen once the agent is done."""
        return own[0]  # frozen once the agent is done

    def agent_reward(
        self,
        agent_id: jax.Array,
        own: Any,
        state: GoalsState,
        shared: GoalsMove,
        params: GoalsParams,
    ) -> jax.Array:
        """Goals' reward: for an agent that was still going, ``-step_penalty -
        distance_penalty * d`` plus ``goal_reward`` if it reached its goal on this step; 0
        for an agent already done."""
        going, dist = shared.going[agent_id], shared.dist[agent_id]
        reached = going & own[1]  # it was going and is terminated: it ended just now
        reward = (
            -params.step_penalty - params.distance_penalty * dist + params.goal_reward * reached
        )
        return jnp.where(going, reward, 0.0)

    def agent_terminated(
        self, agent_id: jax.Array, own: Any, state: GoalsState, params: GoalsParams
    ) -> jax.Array:
        """The sticky flag kept in the state (``own[1]``), set when the agent reaches its
        goal."""
        return own[1]

    def agent_truncated(
        self, agent_id: jax.Array, own: Any, state: GoalsState, params: GoalsParams
    ) -> jax.Array:
        """The sticky flag kept in the state (``own[2]``), set at the time limit for agents
        still going."""
        return own[2]
