"""ProcMaze-v0: a procedurally generated maze per episode; an env whose reset does real work.

Every reset builds a new ``size x size``-cell perfect maze (exactly one path between any two
cells) by a randomized depth-first search (the "recursive backtracker", an explicit stack in
a ``lax.fori_loop`` of ``2 * size**2 - 1`` iterations), drops the agent on a uniformly
random cell, and runs a breadth-first search from it (a ``lax.while_loop`` of grid
relaxations) to put the goal on the cell farthest from the agent (ties broken at random).
A step is a few array lookups. So its reset costs hundreds of times its step: the case
:class:`jaxsampler.vector.ResetPool` is for (benchmarks/reset_pool.py).

The maze is a ``(2 * size + 1)``-square wall grid: cell ``(r, c)`` sits at grid position
``(2r + 1, 2c + 1)``, and the grid square between two adjacent cells is open when the
search carved a passage there.

* Actions: ``Discrete(4)``: one grid square up, right, down, left (a move into a wall
  stays put). A passage between two cells is a square of its own, so the goal is twice
  its cell distance away in steps.
* Observation (``float32[8]``, in ``[0, 1]``): the agent's grid row and column, the
  goal's, each divided by ``2 * size``, then the walls up, right, down, left of the agent
  (1 = wall).
* Reward 1 on the step that reaches the goal (terminated), 0 otherwise; truncated at
  ``max_steps_in_episode``.

``render`` draws the wall grid, the agent and the goal (see :meth:`ProcMaze.render`).
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

__all__ = ["ProcMaze", "ProcMazeParams", "ProcMazeState", "generate_maze", "cell_distances"]

# Grid moves of the four actions (up, right, down, left), in grid squares.
_MOVES = np.array([[-1, 0], [0, 1], [1, 0], [0, -1]], np.int32)


_RENDER_PX = 128  # the frame is about this many pixels wide
#: Colors of :meth:`ProcMaze.render`, by code: free, wall, goal, agent.
RENDER_PALETTE = np.array([(255, 255, 255), (60, 60, 60), (40, 170, 60), (220, 40, 40)], np.uint8)


@struct.dataclass
class ProcMazeState:
    walls: jax.Array  # bool[2n+1, 2n+1], True = wall
    pos: jax.Array  # int32[2], grid coordinates
    goal: jax.Array  # int32[2], grid coordinates
    time: jax.Array  # int32[]


@struct.dataclass
class ProcMazeParams:
    max_steps_in_episode: int = 200


def generate_maze(key: jax.Array, size: int) -> jax.Array:
    """A random perfect maze of ``size x size`` cells (randomized depth-first search
    from a uniformly random cell). Returns the wall grid, ``bool[2n+1, 2n+1]`` (True =
    wall). One env, jittable and vmappable."""
    n = size
    cells = n * n
    k_start, k_walk = jax.random.split(key)
    start = jax.random.randint(k_start, (), 0, cells)
    grid = jnp.ones((2 * n + 1, 2 * n + 1), jnp.bool_)
    grid = grid.at[1::2, 1::2].set(False)  # every cell is open; passages are carved
    visited = jnp.zeros((cells,), jnp.bool_).at[start].set(True)
    stack = jnp.zeros((cells,), jnp.int32).at[0].set(start)
    moves = jnp.asarray(_MOVES)

    def body(i: jax.Array, carry: tuple[Any, ...]) -> tuple[Any, ...]:
        grid, visited, stack, sp = carry
        cur = stack[sp - 1]
        r, c = cur // n, cur % n
        nr, nc = r + moves[:, 0], c + moves[:, 1]
        inside = (nr >= 0) & (nr < n) & (nc >= 0) & (nc < n)
        nxt = jnp.clip(nr, 0, n - 1) * n + jnp.clip(nc, 0, n - 1)
        free = inside & ~visited[nxt]
        # A uniformly random free neighbour: the largest of four uniforms among the free.
        u = jax.random.uniform(jax.random.fold_in(k_walk, i), (4,))
        d = jnp.argmax(jnp.where(free, u, -1.0))
        push = jnp.any(free)
        to = nxt[d]
        wall_r, wall_c = 2 * r + 1 + moves[d, 0], 2 * c + 1 + moves[d, 1]
        grid = grid.at[wall_r, wall_c].set(jnp.where(push, False, grid[wall_r, wall_c]))
        visited = visited.at[to].set(visited[to] | push)
        stack = stack.at[jnp.where(push, sp, sp - 1)].set(jnp.where(push, to, stack[sp - 1]))
        sp = jnp.where(push, sp + 1, sp - 1)
        return grid, visited, stack, sp

    # Each cell is pushed once (n*n - 1 pushes after the start) and popped once (n*n pops).
    grid, *_ = jax.lax.fori_loop(0, 2 * cells - 1, body, (grid, visited, stack, jnp.int32(1)))
    return grid


def cell_distances(walls: jax.Array, source: jax.Array, size: int) -> jax.Array:
    """Breadth-first-search distances (in cells) from cell ``source = (r, c)`` through the
    maze's passages, ``int32[n, n]`` (unreachable cells keep ``n * n``). Jittable."""
    n = size
    far = jnp.int32(n * n)
    open_right = ~walls[1::2, 2:-1:2]  # [n, n-1]: passage between (r, c) and (r, c+1)
    open_down = ~walls[2:-1:2, 1::2]  # [n-1, n]: passage between (r, c) and (r+1, c)
    dist = jnp.full((n, n), far, jnp.int32).at[source[0], source[1]].set(0)

    def relax(dist: jax.Array) -> jax.Array:
        step = dist + 1
        new = dist
        new = new.at[:, 1:].min(jnp.where(open_right, step[:, :-1], far))
        new = new.at[:, :-1].min(jnp.where(open_right, step[:, 1:], far))
        new = new.at[1:, :].min(jnp.where(open_down, step[:-1, :], far))
        new = new.at[:-1, :].min(jnp.where(open_down, step[1:, :], far))
        return new

    def cond(carry: tuple[jax.Array, jax.Array]) -> jax.Array:
        return carry[1]

    def body(carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        dist, _ = carry
        new = relax(dist)
        return new, jnp.any(new != dist)

    dist, _ = jax.lax.while_loop(cond, body, (dist, jnp.bool_(True)))
    return dist


@dataclasses.dataclass(frozen=True)
class ProcMaze(SingleAgentEnv):
    """A new random maze every episode; reach the cell farthest from where you start.

    Attributes:
        size: cells per side (static: it sets the shapes). The reset's work grows with
            ``size**2`` (search) and ``size**2`` times the maze's depth (distances).
    """

    size: int = 8

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 2:
            raise ValueError(f"ProcMaze size must be an int >= 2, got {self.size!r}")

    @property
    def name(self) -> str:
        """``"ProcMaze-v0"``."""
        return "ProcMaze-v0"

    @property
    def default_params(self) -> ProcMazeParams:
        """:class:`ProcMazeParams` (200-step limit); the maze's size is the static ``size``
        field, not a param."""
        return ProcMazeParams()

    @property
    def observation_space(self) -> Box:
        """``float32[8]`` in ``[0, 1]``: the agent's and the goal's grid coordinates over
        ``2 * size``, then the walls up, right, down and left of the agent."""
        return Box(0.0, 1.0, (8,), np.float32)

    @property
    def action_space(self) -> Discrete:
        """``Discrete(4)``: one grid square up, right, down or left."""
        return Discrete(4)

    def reset_env(self, key: jax.Array, params: ProcMazeParams) -> tuple[jax.Array, ProcMazeState]:
        """ProcMaze's reset, the expensive part: a fresh maze (:func:`generate_maze`), the agent
        on a uniformly random cell, the goal on a cell farthest from it by breadth-first
        search (:func:`cell_distances`; ties broken at random)."""
        n = self.size
        k_maze, k_pos, k_tie = jax.random.split(key, 3)
        walls = generate_maze(k_maze, n)
        cell = jax.random.randint(k_pos, (), 0, n * n)
        source = jnp.stack([cell // n, cell % n])
        dist = cell_distances(walls, source, n).reshape(-1).astype(jnp.float32)
        goal_cell = jnp.argmax(dist + jax.random.uniform(k_tie, (n * n,), maxval=0.5))
        state = ProcMazeState(
            walls=walls,
            pos=2 * source.astype(jnp.int32) + 1,
            goal=2 * jnp.stack([goal_cell // n, goal_cell % n]).astype(jnp.int32) + 1,
            time=jnp.zeros((), jnp.int32),
        )
        return self._obs(state), state

    def step_env(
        self, key: jax.Array, state: ProcMazeState, action: jax.Array, params: ProcMazeParams
    ) -> tuple[jax.Array, ProcMazeState, jax.Array, jax.Array, Any]:
        """ProcMaze's step: one grid square in the chosen direction unless a wall is there;
        reward 1 and terminated on reaching the goal. ``key`` is unused."""
        del key
        target = state.pos + jnp.asarray(_MOVES)[action]
        blocked = state.walls[target[0], target[1]]
        pos = jnp.where(blocked, state.pos, target)
        new = dataclasses.replace(state, pos=pos)
        terminated = jnp.all(pos == state.goal)
        reward = terminated.astype(jnp.float32)
        return self._obs(new), new, reward, terminated, self.reset_info(params)

    @property
    def render_cell_px(self) -> int:
        """Pixels per side of one wall-grid square in :meth:`render` (static)."""
        return max(2, _RENDER_PX // (2 * self.size + 1))

    @property
    def render_shape(self) -> tuple[int, int]:
        """``(G k, G k)`` for the ``G = 2 size + 1`` wall grid and ``k = render_cell_px``;
        static."""
        side = (2 * self.size + 1) * self.render_cell_px
        return (side, side)

    def render(self, state: ProcMazeState, params: ProcMazeParams | None = None) -> jax.Array:
        """The maze: ``uint8[G k, G k, 3]`` for the ``G = 2 size + 1`` square wall grid
        and ``k = render_cell_px`` (``max(2, 128 // G)``; 119 x 119 at size 8). Pure;
        jit/vmap-safe.

        Grid square ``(r, c)`` is the ``k x k`` block at rows ``r k ..`` and columns
        ``c k ..``, colored by ``RENDER_PALETTE``: white if free, dark gray if a wall,
        green the goal, red the agent (over the goal when it stands on it).
        """
        codes = state.walls.astype(jnp.int32)
        codes = codes.at[state.goal[0], state.goal[1]].set(2)
        codes = codes.at[state.pos[0], state.pos[1]].set(3)
        return draw.cells_image(codes, RENDER_PALETTE, self.render_cell_px)

    def _obs(self, state: ProcMazeState) -> jax.Array:
        scale = jnp.float32(2 * self.size)
        around = state.pos + jnp.asarray(_MOVES)
        walls = state.walls[around[:, 0], around[:, 1]]
        return jnp.concatenate(
            [state.pos / scale, state.goal / scale, walls.astype(jnp.float32)]
        ).astype(jnp.float32)
