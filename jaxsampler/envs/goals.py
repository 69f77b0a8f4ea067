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

__all__ = ["Goals", "GoalsParams", "GoalsState"]

_MOVES = np.array([[0.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [0.0, -1.0], [0.0, 1.0]], np.float32)


@struct.dataclass
class GoalsState:
    pos: jax.Array  # float32[N, 2]
    goals: jax.Array  # float32[N, 2]
    obs: jax.Array  # float32[N, 2N + 2], the last observation (frozen for finished agents)
    terminated: jax.Array  # bool[N], sticky
    truncated: jax.Array  # bool[N], sticky
    time: jax.Array  # int32[]


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
class Goals(Env):
    """``Goals(n=3)``: ``n`` agents, each walking to its own goal; each finishes on its own."""

    n: int = 3
    num_agents: ClassVar[int] = 3  # overridden per instance in __post_init__

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"Goals needs n >= 1 agents (an int), got {self.n!r}")
        object.__setattr__(self, "num_agents", self.n)

    @property
    def name(self) -> str:
        return "Goals-v0"

    @property
    def default_params(self) -> GoalsParams:
        return GoalsParams()

    @property
    def observation_space(self) -> Box:
        return Box(-np.inf, np.inf, (2 * self.n + 2,), np.float32)

    @property
    def action_space(self) -> Discrete:
        return Discrete(5)

    def _obs(self, pos: jax.Array, goals: jax.Array) -> jax.Array:
        n = self.n
        rel = pos[None, :, :] - pos[:, None, :]  # [observer, other, 2]
        others = np.array([[j for j in range(n) if j != i] for i in range(n)], np.int32).reshape(
            n, n - 1
        )
        rel_others = jnp.take_along_axis(rel, others[:, :, None], axis=1)  # [N, N-1, 2]
        parts = [pos, goals - pos, rel_others.reshape(n, -1)]
        return jnp.concatenate(parts, axis=-1).astype(jnp.float32)

    def _ts(self, s: GoalsState, reward: jax.Array) -> TimeStep:
        return TimeStep(
            obs=s.obs,
            reward=reward.astype(jnp.float32),
            terminated=s.terminated,
            truncated=s.truncated,
            acting=~(s.terminated | s.truncated),
            info=NoInfo(),
        )

    def reset_to(self, pos: jax.Array, goals: jax.Array) -> tuple[GoalsState, TimeStep]:
        """Starts an episode from given ``pos`` and ``goals`` (``float32[N, 2]`` each).

        Returns ``(state, timestep)`` like :meth:`reset`. Pure; safe under jit and vmap.
        """
        pos = jnp.asarray(pos, jnp.float32)
        goals = jnp.asarray(goals, jnp.float32)
        if pos.shape != (self.n, 2) or goals.shape != (self.n, 2):
            raise ValueError(
                f"reset_to needs pos and goals of shape ({self.n}, 2), got {pos.shape}, {goals.shape}"
            )

        def flags() -> jax.Array:
            return jnp.zeros((self.n,), jnp.bool_)

        s = GoalsState(
            pos, goals, self._obs(pos, goals), flags(), flags(), jnp.zeros((), jnp.int32)
        )
        # Fresh arrays for the TimeStep, none shared with the state: under an eager
        # (un-jitted) vmap, a shared array comes out as one buffer in both places, and a
        # jitted rollout that donates its state would be handed that buffer twice.
        ts = self._ts(s, jnp.zeros((self.n,), jnp.float32))
        return s, ts.replace(obs=self._obs(pos, goals), terminated=flags(), truncated=flags())

    def reset(
        self, key: jax.Array, params: GoalsParams | None = None
    ) -> tuple[GoalsState, TimeStep]:
        """Agents and goals uniform in ``[-1, 1]^2``. Pure; safe under jit and vmap."""
        k_pos, k_goal = jax.random.split(key)
        pos = jax.random.uniform(k_pos, (self.n, 2), jnp.float32, -1.0, 1.0)
        goals = jax.random.uniform(k_goal, (self.n, 2), jnp.float32, -1.0, 1.0)
        return self.reset_to(pos, goals)

    def step(
        self,
        key: jax.Array,
        state: GoalsState,
        action: jax.Array,
        params: GoalsParams | None = None,
    ) -> tuple[GoalsState, TimeStep]:
        """Moves every agent still going by ``action`` (``int[N]``, values 0..4).

        Pure and deterministic (``key`` is unused); safe under jit and vmap.
        """
        params = self.default_params if params is None else params
        going = ~(state.terminated | state.truncated)
        move = jnp.asarray(_MOVES)[action] * params.step_size  # [N, 2]
        moved = jnp.clip(state.pos + move, -params.arena, params.arena)
        pos = jnp.where(going[:, None], moved, state.pos).astype(jnp.float32)
        dist = jnp.linalg.norm(state.goals - pos, axis=-1)
        reached = going & (dist <= params.goal_radius)
        time = state.time + 1
        reward = (
            -params.step_penalty - params.distance_penalty * dist + params.goal_reward * reached
        )
        s = GoalsState(
            pos=pos,
            goals=state.goals,
            obs=jnp.where(going[:, None], self._obs(pos, state.goals), state.obs),
            terminated=state.terminated | reached,
            truncated=state.truncated | (going & ~reached & (time >= params.max_steps_in_episode)),
            time=time,
        )
        return s, self._ts(s, jnp.where(going, reward, 0.0))
