"""PredatorPrey: two agent groups with their own observation and action spaces.

``P`` predators (default 2) chase one prey on the square arena ``[-1, 1]^2``. The env
declares two agent groups (:class:`~jaxsampler.envs.groups.AgentGroup`), which take the
agent axis in this order:

* ``"predator"``: agents ``predator_0 .. predator_{P-1}`` (slots ``0 .. P - 1``), actions
  ``Discrete(5)``: stay, left, right, down, up, moving ``predator_speed`` (0.1) along
  that axis. Observation ``float32[4]``: its own position (``[-1, 1]`` each), then the
  prey's position relative to it (``[-2, 2]`` each). Predators do not see each other.
* ``"prey"``: agent ``prey_0`` (slot ``P``), actions ``Discrete(9)``: stay, then the
  eight compass directions (left, right, down, up, down-left, down-right, up-left,
  up-right), moving ``prey_speed`` (0.15, faster than a predator) in that direction (a
  diagonal move is ``prey_speed`` long too). Observation ``float32[2 + 2P]``: its own
  position, then every predator's position relative to it, in agent order.

The rollout's agent axis carries ``float32[max(4, 2 + 2P)]`` observations (a predator's
four values followed by zeros) and ``Discrete(9)`` actions. A predator's carrier action
outside ``0 .. 4`` (5 to 8, which a policy of the carrier space may draw) means *stay*;
so does any action outside a group's range.

Start: predators uniform in ``[-1, -0.5] x [-1, 1]``, the prey uniform in
``[0.5, 1] x [-1, 1]`` (so nobody starts caught). Every step all agents move at once;
positions are clipped to the arena. The prey is *caught* when some predator is within
``capture_radius`` (0.15) of it after the move.

Rewards: on the step of the capture every predator gets ``capture_reward`` (1.0) and the
prey ``-capture_reward``; on any other step the predators get 0 and the prey
``survival_bonus`` (0.01). A capture terminates every agent (``agents_end_together``);
otherwise, after ``max_steps_in_episode`` (50) steps, every agent is truncated. Once the
episode is over, further steps move nobody, reward 0 and keep the flags (the rollout
resets the env instead). ``step`` uses no randomness: given the reset key and the
actions, an episode is fully determined.

``render`` draws a 200 x 200 frame of the arena (see :meth:`PredatorPrey.render`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsampler.envs import render as draw
from jaxsampler.envs.base import GroupedMultiAgentEnv
from jaxsampler.envs.groups import AgentGroup
from jaxsampler.spaces import Box, Discrete

__all__ = [
    "PREDATOR_MOVES",
    "PREY_MOVES",
    "PredatorPrey",
    "PredatorPreyParams",
    "PredatorPreyState",
]

#: Unit moves of a predator's ``Discrete(5)`` action: stay, left, right, down, up.
PREDATOR_MOVES = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]], np.float32)
_D = np.float32(np.sqrt(0.5))
#: Unit moves of the prey's ``Discrete(9)`` action: stay, left, right, down, up, then the
#: diagonals down-left, down-right, up-left, up-right (length 1 too).
PREY_MOVES = np.concatenate(
    [PREDATOR_MOVES, np.array([[-_D, -_D], [_D, -_D], [-_D, _D], [_D, _D]], np.float32)]
)

#: Frame size ``(H, W)`` of :meth:`PredatorPrey.render`.
RENDER_SHAPE = (200, 200)
_RENDER_BOUND = 1.1


@struct.dataclass
class PredatorPreyState:
    pos: jax.Array  # float32[P + 1, 2]: the predators' positions, then the prey's
    caught: jax.Array  # bool[], sticky: the prey was caught
    time: jax.Array  # int32[]


@struct.dataclass
class PredatorPreyParams:
    predator_speed: float = 0.1
    prey_speed: float = 0.15
    capture_radius: float = 0.15
    capture_reward: float = 1.0
    survival_bonus: float = 0.01
    max_steps_in_episode: int = 50


@struct.dataclass
class _Step:
    """What one step did, read by every agent's reward."""

    going: jax.Array  # bool[], the episode was still going before the step
    caught: jax.Array  # bool[], the prey was caught by this step


def _move(pos: jax.Array, action: jax.Array, moves: np.ndarray, speed: Any) -> jax.Array:
    """``pos`` (``[N, 2]``) moved by ``speed`` along ``moves[action]``; an action outside
    ``0 .. len(moves) - 1`` stays."""
    n = len(moves)
    valid = (action >= 0) & (action < n)
    unit = jnp.asarray(moves)[jnp.where(valid, action, 0)]
    return pos + unit * jnp.asarray(speed, jnp.float32)


@dataclasses.dataclass(frozen=True)
class PredatorPrey(GroupedMultiAgentEnv):
    """``PredatorPrey(n_predators=2)``: predators (``Discrete(5)``, 4 observed values) chase
    a faster prey (``Discrete(9)``, ``2 + 2 * n_predators`` observed values)."""

    n_predators: int = 2
    num_agents: ClassVar[int] = 3  # overridden per instance in __post_init__
    agents_end_together: ClassVar[bool] = True

    def __post_init__(self) -> None:
        n = self.n_predators
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"PredatorPrey needs n_predators >= 1 (an int), got {n!r}")
        object.__setattr__(self, "num_agents", n + 1)

    @property
    def name(self) -> str:
        """``"PredatorPrey-v0"``."""
        return "PredatorPrey-v0"

    @property
    def default_params(self) -> PredatorPreyParams:
        """:class:`PredatorPreyParams` (50-step limit)."""
        return PredatorPreyParams()

    @property
    def agent_groups(self) -> tuple[AgentGroup, AgentGroup]:
        """``predator`` (``float32[4]`` observations, ``Discrete(5)``), then ``prey``
        (``float32[2 + 2P]``, ``Discrete(9)``)."""
        p = self.n_predators
        predator_obs = Box(
            np.array([-1, -1, -2, -2], np.float32), np.array([1, 1, 2, 2], np.float32), (4,)
        )
        prey_low = np.concatenate([[-1, -1], np.full(2 * p, -2)]).astype(np.float32)
        prey_obs = Box(prey_low, -prey_low, (2 + 2 * p,))
        ids = tuple(f"predator_{i}" for i in range(p))
        return (
            AgentGroup("predator", ids, predator_obs, Discrete(5)),
            AgentGroup("prey", ("prey_0",), prey_obs, Discrete(9)),
        )

    def reset_world(self, key: jax.Array, params: PredatorPreyParams) -> PredatorPreyState:
        """Predators uniform in ``[-1, -0.5] x [-1, 1]``, the prey in ``[0.5, 1] x [-1, 1]``."""
        k_pred, k_prey = jax.random.split(key)
        low = jnp.array([-1.0, -1.0], jnp.float32)
        high = jnp.array([-0.5, 1.0], jnp.float32)
        predators = jax.random.uniform(k_pred, (self.n_predators, 2), jnp.float32, low, high)
        prey = jax.random.uniform(k_prey, (1, 2), jnp.float32, -high, -low)
        pos = jnp.concatenate([predators, prey])
        return PredatorPreyState(pos, jnp.zeros((), jnp.bool_), jnp.zeros((), jnp.int32))

    def step_world(
        self,
        key: jax.Array,
        state: PredatorPreyState,
        action: jax.Array,
        params: PredatorPreyParams,
    ) -> tuple[PredatorPreyState, _Step]:
        """Moves every agent by its group's action (carrier ``action``: ``int[P + 1]``),
        clips to the arena and checks for a capture; nothing moves once the episode is over."""
        acts = self.group_actions(action)
        p = self.n_predators
        predators = _move(state.pos[:p], acts["predator"], PREDATOR_MOVES, params.predator_speed)
        prey = _move(state.pos[p:], acts["prey"], PREY_MOVES, params.prey_speed)
        moved = jnp.clip(jnp.concatenate([predators, prey]), -1.0, 1.0).astype(jnp.float32)
        going = ~state.caught & (state.time < params.max_steps_in_episode)
        pos = jnp.where(going, moved, state.pos)
        dist = jnp.sqrt(jnp.sum((pos[:p] - pos[p]) ** 2, axis=-1))
        caught = going & jnp.any(dist <= params.capture_radius)
        new = PredatorPreyState(pos, state.caught | caught, state.time + 1)
        return new, _Step(going, caught)

    def agent_rows(self, state: PredatorPreyState) -> jax.Array:
        """Each agent's position (``float32[P + 1, 2]``): ``own`` is the agent's position."""
        return state.pos

    def group_obs(
        self, group: str, agent_id: jax.Array, own: Any, state: Any, params: Any
    ) -> jax.Array:
        """A predator: its position and the prey's relative to it; the prey: its position
        and every predator's relative to it."""
        p = self.n_predators
        if group == "predator":
            rel = state.pos[p] - own
        else:
            rel = (state.pos[:p] - own).reshape(-1)
        return jnp.concatenate([own, rel]).astype(jnp.float32)

    def agent_reward(
        self, agent_id: jax.Array, own: Any, state: Any, shared: _Step, params: Any
    ) -> jax.Array:
        """Predators: ``capture_reward`` on the capture; the prey: ``-capture_reward`` on
        the capture, ``survival_bonus`` on every other step of the episode; 0 after it."""
        is_prey = agent_id == self.n_predators
        bonus = jnp.where(is_prey, params.survival_bonus, 0.0)
        catch = jnp.where(is_prey, -params.capture_reward, params.capture_reward)
        reward = jnp.where(shared.caught, catch, bonus)
        return jnp.where(shared.going, reward, 0.0).astype(jnp.float32)

    def agent_terminated(self, agent_id: jax.Array, own: Any, state: Any, params: Any) -> jax.Array:
        """Every agent once the prey is caught."""
        return state.caught

    def agent_truncated(self, agent_id: jax.Array, own: Any, state: Any, params: Any) -> jax.Array:
        """Every agent once ``max_steps_in_episode`` steps passed without a capture."""
        return (state.time >= params.max_steps_in_episode) & ~state.caught

    @property
    def render_shape(self) -> tuple[int, int]:
        """``(200, 200)``, known statically (no tracing)."""
        return RENDER_SHAPE

    def render(
        self, state: PredatorPreyState, params: PredatorPreyParams | None = None
    ) -> jax.Array:
        """The arena: ``uint8[200, 200, 3]``. Pure; jit/vmap-safe.

        The view is ``[-1.1, 1.1]^2`` (``y`` up) with the arena ``[-1, 1]^2`` outlined in
        light gray; predators are red discs of radius ``capture_radius`` / 2, the prey a
        green disc of the same size, drawn last. Its ring turns dark gray once caught.
        """
        params = self.default_params if params is None else params
        shape = RENDER_SHAPE
        b = _RENDER_BOUND
        view = draw.Viewport(shape, -b, b, -b, b)
        (x0, x1), (y0, y1) = view.to_pixel(jnp.array([-1.0, 1.0]), jnp.array([1.0, -1.0]))
        outer = draw.rect_mask(shape, x0 - 1.0, y0 - 1.0, x1 + 1.0, y1 + 1.0)
        layers = [(outer & ~draw.rect_mask(shape, x0, y0, x1, y1), draw.LIGHT_GRAY)]
        xs, ys = view.to_pixel(state.pos[:, 0], state.pos[:, 1])
        radius = 0.5 * params.capture_radius * view.scale_x
        for i in range(self.n_predators):
            layers.append((draw.circle_mask(shape, xs[i], ys[i], radius), draw.RED))
        p = self.n_predators
        ring = draw.circle_mask(shape, xs[p], ys[p], radius + 2.0) & state.caught
        layers.append((ring, draw.DARK_GRAY))
        layers.append((draw.circle_mask(shape, xs[p], ys[p], radius), draw.GREEN))
        return draw.compose(shape, layers, draw.WHITE)
