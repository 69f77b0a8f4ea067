"""``env.render``: frames drawn in JAX, checked against the state they show.

Every built-in env that renders is checked for the contract (``uint8[H, W, 3]`` of
``render_shape``; jit equals eager; ``vmap`` over states equals one render per state; no
retrace for a new state). Env-specific tests recompute where things must be drawn from
the state in NumPy, following the geometry each render documents, and find them in the
frame by color.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsampler.envs import (
    Acrobot,
    CartPole,
    MountainCar,
    MountainCarContinuous,
    Pendulum,
    Spread,
)
from jaxsampler.envs import render as draw
from jaxsampler.envs.acrobot import AcrobotState
from jaxsampler.envs.base import Env
from jaxsampler.envs.cartpole import CartPoleState
from jaxsampler.envs.goals import Goals, GoalsState
from jaxsampler.envs.mountain_car import MountainCarState
from jaxsampler.envs.pendulum import PendulumState
from jaxsampler.envs.procmaze import ProcMaze, ProcMazeState
from jaxsampler.envs.spread import SpreadState
from jaxsampler.envs.tictactoe import TicTacToe, TicTacToeState
from tests.fakes import FakeEnv

RENDERING = [
    CartPole(),
    Pendulum(),
    Acrobot(),
    MountainCar(),
    MountainCarContinuous(),
    Spread(),
    Goals(),
    TicTacToe(),
    ProcMaze(size=4),
]


def _ids(envs: list[Env]) -> list[str]:
    return [type(e).__name__ for e in envs]


def _states(env: Env, seed: int, n: int = 3) -> Any:
    """``n`` random states of ``env`` (leaves with a leading axis ``n``), built in NumPy
    from the env's state class (no env code runs, so nothing compiles here)."""
    rng = np.random.default_rng(seed)

    def u(lo: float, hi: float, *shape: int) -> jax.Array:
        return jnp.asarray(rng.uniform(lo, hi, (n, *shape)), jnp.float32)

    time = jnp.asarray(rng.integers(0, 9, n), jnp.int32)
    if isinstance(env, CartPole):
        return CartPoleState(u(-2.4, 2.4), u(-1, 1), u(-math.pi, math.pi), u(-1, 1), time)
    if isinstance(env, Pendulum):
        return PendulumState(u(-math.pi, math.pi), u(-8, 8), time)
    if isinstance(env, Acrobot):
        return AcrobotState(u(-math.pi, math.pi), u(-math.pi, math.pi), u(-1, 1), u(-1, 1), time)
    if isinstance(env, (MountainCar, MountainCarContinuous)):
        return MountainCarState(u(-1.2, 0.6), u(-0.07, 0.07), time)
    if isinstance(env, Spread):
        k = env.n
        return SpreadState(u(-1.5, 1.5, k, 2), u(-1, 1, k, 2), u(-1.5, 1.5, k, 2), time)
    if isinstance(env, Goals):
        k = env.n
        done = jnp.asarray(rng.random((n, k)) < 0.5)
        obs = jnp.zeros((n, k, 2 * k + 2), jnp.float32)
        return GoalsState(u(-1, 1, k, 2), u(-1, 1, k, 2), obs, done, jnp.zeros_like(done), time)
    if isinstance(env, TicTacToe):
        board = jnp.asarray(rng.integers(0, 3, (n, 9)), jnp.int32)
        over = jnp.asarray(rng.random((n, 2)) < 0.5)
        return TicTacToeState(board, time % 2, over, jnp.zeros((n, 2), bool), time)
    if isinstance(env, ProcMaze):
        g = 2 * env.size + 1
        walls = jnp.asarray(rng.random((n, g, g)) < 0.4)
        pos = jnp.asarray(rng.integers(0, env.size, (n, 2)) * 2 + 1, jnp.int32)
        goal = jnp.asarray(rng.integers(0, env.size, (n, 2)) * 2 + 1, jnp.int32)
        return ProcMazeState(walls, pos, goal, time)
    raise AssertionError(f"no state builder for {env.name}")


def _row(states: Any, i: int) -> Any:
    return jax.tree.map(lambda x: x[i], states)


def _colored(frame: np.ndarray, color: draw.Color | np.ndarray) -> np.ndarray:
    """``bool[H, W]``: pixels of exactly ``color``."""
    return np.all(frame == np.asarray(color, np.uint8), axis=-1)


# ----------------------------------------------------------------------------- contract


@pytest.mark.parametrize("env", RENDERING, ids=_ids(RENDERING))
def test_render_contract(env: Env) -> None:
    """dtype, shape, jit == eager, vmap == per state, one trace for all states."""
    assert env.can_render
    params = env.default_params
    states = _states(env, 1)

    def render(state: Any, params: Any) -> jax.Array:
        return env.render(state, params)

    counted = chex.assert_max_traces(render, n=1)
    jitted = jax.jit(counted)
    frames = [np.asarray(jitted(_row(states, i), params)) for i in range(3)]
    h, w = env.render_shape
    for f in frames:
        assert f.dtype == np.uint8
        assert f.shape == (h, w, 3)
    assert any(not np.array_equal(frames[0], f) for f in frames[1:]), "states look alike"
    batched = np.asarray(jax.jit(jax.vmap(env.render, in_axes=(0, None)))(states, params))
    assert batched.shape == (3, h, w, 3) and batched.dtype == np.uint8
    np.testing.assert_array_equal(batched, np.stack(frames))
    chex.clear_trace_counter()


@pytest.mark.parametrize("env", [CartPole()], ids=["CartPole"])
def test_render_without_jit_equals_jit(env: Env) -> None:
    """Eager (op by op) and jitted renders agree pixel for pixel. One env only: an eager
    render compiles every op on its own, which takes seconds."""
    params = env.default_params
    state = _row(_states(env, 2), 1)
    eager = np.asarray(env.render(state, params))
    np.testing.assert_array_equal(eager, np.asarray(jax.jit(env.render)(state, params)))


def test_no_render_raises() -> None:
    env = FakeEnv()
    assert not env.can_render
    state, _ = env.reset(jax.random.key(0))
    with pytest.raises(NotImplementedError, match="has no render"):
        env.render(state)
    with pytest.raises(NotImplementedError, match="has no render"):
        _ = env.render_shape


def test_render_shape_default_traces_render() -> None:
    """An env that overrides only ``render`` gets ``render_shape`` from its frame shape."""

    @dataclasses.dataclass(frozen=True)
    class Drawn(FakeEnv):
        def render(self, state: Any, params: Any = None) -> jax.Array:
            return draw.canvas((7, 5))

    env = Drawn()
    assert env.can_render
    assert env.render_shape == (7, 5)


# ----------------------------------------------------------------------------- primitives


@jax.jit
def _primitive_masks() -> dict[str, jax.Array]:
    shape = (20, 30)
    rect = draw.rect_mask(shape, 3.2, 4.0, 11.7, 9.5)
    return {
        "rect": rect,
        "disc": draw.circle_mask(shape, 15.0, 10.0, 4.3),
        "ring": draw.ring_mask(shape, 15.0, 10.0, 6.2, 2.0),
        "box90": draw.box_mask(shape, 15.2, 10.3, 8.0, 3.0, math.pi / 2),
        "box45": draw.box_mask(shape, 15.2, 10.3, 10.0, 6.0, math.pi / 4),
        "segment": draw.segment_mask(shape, 2.0, 3.0, 25.0, 15.0, 3.0),
        "triangle": draw.triangle_mask(shape, (0.0, 0.0), (20.0, 0.0), (0.0, 20.0)),
        "painted": draw.paint(draw.canvas(shape, draw.WHITE), rect, draw.RED),
        "circles": draw.paint_circles(
            draw.canvas(shape, draw.WHITE),
            jnp.array([8.0, 12.0]),
            jnp.array([10.0, 10.0]),
            jnp.array([5.0, 3.0]),
            np.array([draw.RED, draw.BLUE], np.uint8),
        ),
        "cells": draw.cells_image(
            jnp.array([[0, 1], [2, 0]]), np.array([draw.WHITE, draw.BLACK, draw.RED], np.uint8), 3
        ),
    }


def test_primitives_cover_pixel_centers() -> None:
    """Each mask contains exactly the pixels whose centers lie in the shape (NumPy)."""
    m = {k: np.asarray(v) for k, v in _primitive_masks().items()}
    xs, ys = np.meshgrid(np.arange(30) + 0.5, np.arange(20) + 0.5)
    rect = (xs >= 3.2) & (xs <= 11.7) & (ys >= 4.0) & (ys <= 9.5)
    np.testing.assert_array_equal(m["rect"], rect)
    d2 = (xs - 15.0) ** 2 + (ys - 10.0) ** 2
    np.testing.assert_array_equal(m["disc"], d2 <= 4.3**2)
    np.testing.assert_array_equal(m["ring"], (d2 <= 6.2**2) & (d2 >= 4.2**2))
    # A box rotated by 90 degrees is the transposed box.
    np.testing.assert_array_equal(
        m["box90"], (np.abs(xs - 15.2) <= 1.5) & (np.abs(ys - 10.3) <= 4.0)
    )
    # At 45 degrees it covers about its area (10 x 6 = 60 px), centered where asked.
    tilted = m["box45"]
    assert abs(tilted.sum() - 60) <= 6
    np.testing.assert_allclose([xs[tilted].mean(), ys[tilted].mean()], [15.2, 10.3], atol=0.3)
    # Clockwise on screen (y down): the long axis runs from upper left to lower right.
    assert tilted[int(10.3 + 3), int(15.2 + 3)] and not tilted[int(10.3 - 3), int(15.2 + 3)]
    # A capsule: distance to the segment at most width / 2.
    a, b = np.array([2.0, 3.0]), np.array([25.0, 15.0])
    p = np.stack([xs, ys], -1)
    t = np.clip(((p - a) @ (b - a)) / np.dot(b - a, b - a), 0, 1)
    dist = np.linalg.norm(p - (a + t[..., None] * (b - a)), axis=-1)
    assert np.sum(m["segment"] != (dist <= 1.5)) <= 2  # float rounding on the edge only
    np.testing.assert_array_equal(m["triangle"], xs + ys <= 20.0)
    assert m["painted"].dtype == np.uint8
    np.testing.assert_array_equal(_colored(m["painted"], draw.RED), rect)
    np.testing.assert_array_equal(_colored(m["painted"], draw.WHITE), ~rect)
    # The later disc shows where two overlap.
    first = (xs - 8.0) ** 2 + (ys - 10.0) ** 2 <= 25.0
    second = (xs - 12.0) ** 2 + (ys - 10.0) ** 2 <= 9.0
    np.testing.assert_array_equal(_colored(m["circles"], draw.BLUE), second)
    np.testing.assert_array_equal(_colored(m["circles"], draw.RED), first & ~second)
    cells = m["cells"]
    assert cells.shape == (6, 6, 3)
    np.testing.assert_array_equal(
        _colored(cells, draw.BLACK), np.kron([[0, 1], [0, 0]], np.ones((3, 3))) > 0
    )
    np.testing.assert_array_equal(
        _colored(cells, draw.RED), np.kron([[0, 0], [1, 0]], np.ones((3, 3))) > 0
    )


def test_viewport_maps_world_to_pixels() -> None:
    view = draw.Viewport((100, 200), -1.0, 3.0, 0.0, 2.0)
    px, py = view.to_pixel(jnp.array([-1.0, 3.0, 1.0]), jnp.array([2.0, 0.0, 1.0]))
    np.testing.assert_allclose(np.asarray(px), [0.0, 200.0, 100.0])
    np.testing.assert_allclose(np.asarray(py), [0.0, 100.0, 50.0])


# ----------------------------------------------------------------------------- CartPole


def _cartpole_frames(xs: list[float], thetas: list[float]) -> tuple[np.ndarray, Any]:
    env = CartPole()
    params = env.default_params
    state, _ = env.reset(jax.random.key(0), params)
    batch = jax.tree.map(lambda v: jnp.stack([v] * len(xs)), state)
    batch = batch.replace(x=jnp.asarray(xs, jnp.float32), theta=jnp.asarray(thetas, jnp.float32))
    frames = jax.jit(jax.vmap(env.render, in_axes=(0, None)))(batch, params)
    return np.asarray(frames), params


def test_cartpole_cart_column_follows_x() -> None:
    """The cart's pixel column is ``W / 2 + x * W / (4 * x_threshold)``."""
    xs = [-2.3, -1.1, -0.4, 0.0, 0.37, 1.25, 2.2]
    frames, params = _cartpole_frames(xs, [0.3, -0.2, 0.0, 0.1, -0.15, 0.2, -0.05])
    h, w = frames.shape[1:3]
    scale = w / (4 * params.x_threshold)
    centers = []
    for x, f in zip(xs, frames, strict=True):
        cart = _colored(f, (0, 0, 0))
        cols = np.nonzero(cart.any(axis=0))[0]
        rows = np.nonzero(cart.any(axis=1))[0]
        center = (cols.min() + cols.max() + 1) / 2  # pixel j spans [j, j + 1)
        expected = w / 2 + x * scale
        assert abs(center - expected) <= 0.5, (x, center, expected)
        assert cols.max() - cols.min() + 1 in (25, 26)  # 25 px wide
        assert abs((rows.min() + rows.max() + 1) / 2 - 150.0) <= 0.5
        # The bottom row (no pole there) is symmetric about the center.
        bottom = np.nonzero(cart[rows.max()])[0]
        assert abs(bottom.mean() + 0.5 - expected) <= 0.5
        centers.append(center)
    # Moving by dx moves the cart by dx * scale pixels.
    np.testing.assert_allclose(np.diff(centers), np.diff(xs) * scale, atol=1.0)


def test_cartpole_pole_points_along_theta() -> None:
    """The pole's farthest pixel from the axle lies in the direction ``theta`` (0 up,
    clockwise on screen), ``2 * length * scale`` (plus the round end) away."""
    thetas = [-1.0, -0.3, 0.0, 0.4, 1.2, 2.6]
    xs = [0.5, -0.5, 0.0, 1.0, -1.5, 0.2]
    frames, params = _cartpole_frames(xs, thetas)
    w = frames.shape[2]
    scale = w / (4 * params.x_threshold)
    pole_len = 2 * params.length * scale
    for x, theta, f in zip(xs, thetas, frames, strict=True):
        ax, ay = w / 2 + x * scale, 150.0 - 15.0 / 4
        r, c = np.nonzero(_colored(f, (202, 152, 101)))
        dx, dy = c + 0.5 - ax, r + 0.5 - ay
        far = np.argmax(dx**2 + dy**2)
        angle = math.atan2(dx[far], -dy[far])  # 0 is up, positive to the right
        assert abs(angle - theta) <= 2.5 / pole_len, (theta, angle)
        assert abs(math.hypot(dx[far], dy[far]) - (pole_len + 2.5)) <= 1.0
    # theta = 0: the pole rises straight above the axle.
    r, c = np.nonzero(_colored(frames[2], (202, 152, 101)))
    assert r.min() < 150 - 15 / 4 - pole_len + 1
