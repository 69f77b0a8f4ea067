"""ProcMaze-v0: the generated mazes, the goal placement and the step, against plain-Python
references (a breadth-first search over the wall grid)."""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.envs.procmaze import ProcMaze, cell_distances

SIZE = 4
MOVES = [(-1, 0), (0, 1), (1, 0), (0, -1)]  # up, right, down, left


def bfs(walls: np.ndarray, start: tuple[int, int]) -> dict[tuple[int, int], int]:
    """Grid distances (in grid squares) from ``start`` over open squares."""
    dist = {start: 0}
    todo = collections.deque([start])
    while todo:
        r, c = todo.popleft()
        for dr, dc in MOVES:
            nxt = (r + dr, c + dc)
            if not walls[nxt] and nxt not in dist:
                dist[nxt] = dist[(r, c)] + 1
                todo.append(nxt)
    return dist


@pytest.fixture(scope="module")
def resets():
    env = ProcMaze(SIZE)
    keys = jax.random.split(jax.random.PRNGKey(0), 32)
    state, ts = jax.jit(jax.vmap(env.reset))(keys)
    return env, jax.device_get(state), jax.device_get(ts)


def test_registered():
    env = js.make("ProcMaze-v0")
    assert isinstance(env, ProcMaze) and env.name == "ProcMaze-v0"
    assert js.make("ProcMaze-v0", size=5).size == 5


def test_mazes_are_perfect_and_goal_is_farthest(resets):
    env, state, ts = resets
    n = SIZE
    for e in range(state.walls.shape[0]):
        walls = np.asarray(state.walls[e])
        assert walls.shape == (2 * n + 1, 2 * n + 1)
        assert walls[0].all() and walls[-1].all() and walls[:, 0].all() and walls[:, -1].all()
        assert not walls[1::2, 1::2].any(), "every cell is open"
        assert walls[::2, ::2].all(), "wall corners are never carved"
        passages = (~walls[1::2, 2:-1:2]).sum() + (~walls[2:-1:2, 1::2]).sum()
        assert passages == n * n - 1, "a perfect maze is a spanning tree of the cells"
        start = tuple(int(v) for v in state.pos[e])
        dist = bfs(walls, start)
        cells = [(2 * r + 1, 2 * c + 1) for r in range(n) for c in range(n)]
        assert all(cell in dist for cell in cells), "every cell is reachable"
        goal = tuple(int(v) for v in state.goal[e])
        assert dist[goal] == max(dist[cell] for cell in cells), "the goal is a farthest cell"
        # The library's own distances agree with the reference (in cells: half the squares).
        got = np.asarray(cell_distances(jnp.asarray(walls), jnp.asarray(start) // 2, n))
        want = np.array([[dist[(2 * r + 1, 2 * c + 1)] // 2 for c in range(n)] for r in range(n)])
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(
            ts.obs[e, 0],
            np.concatenate(
                [
                    np.array(start + goal) / (2 * n),
                    [walls[start[0] + dr, start[1] + dc] for dr, dc in MOVES],
                ]
            ).astype(np.float32),
        )
    # Random: different mazes and starts across keys.
    assert len({np.asarray(w).tobytes() for w in state.walls}) > 25
    assert len({tuple(p) for p in np.asarray(state.pos)}) > 5


def test_walking_the_shortest_path_reaches_the_goal(resets):
    env, state, _ = resets
    e = 0
    walls = np.asarray(state.walls[e])
    goal = tuple(int(v) for v in state.goal[e])
    to_goal = bfs(walls, goal)
    one = jax.tree.map(lambda x: jnp.asarray(x[e]), state)
    step = jax.jit(env.step)
    pos = tuple(int(v) for v in state.pos[e])
    length = to_goal[pos]  # a step moves one grid square (cell, passage, cell, ...)
    for i in range(length):
        # Walk into a wall first: the agent stays put, nothing ends.
        blocked = [a for a, (dr, dc) in enumerate(MOVES) if walls[pos[0] + dr, pos[1] + dc]]
        if blocked:
            one, ts = step(jax.random.PRNGKey(i), one, jnp.array([blocked[0]]))
            assert tuple(int(v) for v in one.pos) == pos and not ts.terminated[0]
            assert ts.reward[0] == 0.0
        moves = [
            a
            for a, (dr, dc) in enumerate(MOVES)
            if to_goal.get((pos[0] + dr, pos[1] + dc), -1) == to_goal[pos] - 1
        ]
        one, ts = step(jax.random.PRNGKey(i), one, jnp.array([moves[0]]))
        pos = tuple(int(v) for v in one.pos)
        assert bool(ts.terminated[0]) == (i == length - 1)
        assert float(ts.reward[0]) == (1.0 if i == length - 1 else 0.0)
        assert env.observation_space.contains(ts.obs[0])
    assert pos == goal


def test_truncated_at_the_time_limit():
    env = ProcMaze(SIZE)
    params = env.default_params.replace(max_steps_in_episode=3)
    state, _ = env.reset(jax.random.PRNGKey(1), params)
    flags = []
    for i in range(3):
        state, ts = env.step(jax.random.PRNGKey(i), state, jnp.array([0]), params)
        flags.append(bool(ts.truncated[0]))
    assert flags == [False, False, True]


def test_jit_and_eager_resets_agree():
    env = ProcMaze(3)
    key = jax.random.PRNGKey(5)
    eager = env.reset(key)
    jitted = jax.jit(env.reset)(key)
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("size", [1, 0, 2.5, True])
def test_bad_size(size):
    with pytest.raises(ValueError, match="size must be an int >= 2"):
        ProcMaze(size)
