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
from jaxsampler.envs.predator_prey import PredatorPrey, PredatorPreyState
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
    PredatorPrey(),
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
    if isinstance(env, PredatorPrey):
        caught = jnp.asarray(rng.random(n) < 0.5)
        return PredatorPreyState(u(-1, 1, env.num_agents, 2), caught, time)
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
    """Eager (op by op) and jitted renders agree. One env only: an eager render compiles
    every op on its own, which takes seconds. A fused kernel may round a float in its last
    bit differently, which can flip a pixel whose center lies on a shape's edge, so up to
    two pixels may differ (here none do)."""
    params = env.default_params
    for i in range(2):
        state = _row(_states(env, 2), i)
        eager = np.asarray(env.render(state, params))
        jitted = np.asarray(jax.jit(env.render)(state, params))
        assert eager.dtype == jitted.dtype == np.uint8 and eager.shape == jitted.shape
        differ = np.any(eager != jitted, axis=-1).sum()
        assert differ <= 2, f"{differ} pixels differ"


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
        "chained": draw.paint(
            draw.paint(draw.canvas(shape, draw.GREEN), rect, draw.RED),
            draw.circle_mask(shape, 12.0, 8.0, 5.0),
            draw.BLUE,
        ),
        "composed": draw.compose(
            shape,
            [(rect, draw.RED), (draw.circle_mask(shape, 12.0, 8.0, 5.0), draw.BLUE)],
            draw.GREEN,
        ),
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
    # compose paints its layers in order, like chained paint calls.
    assert m["composed"].dtype == np.uint8 and m["composed"].shape == (20, 30, 3)
    np.testing.assert_array_equal(m["composed"], m["chained"])
    assert len({tuple(v) for v in m["composed"].reshape(-1, 3)}) == 3
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


def test_cartpole_render_reads_params() -> None:
    """Per-env params (vmapped like the states): the view scales with ``x_threshold``."""
    env = CartPole()
    state, _ = env.reset(jax.random.key(0))
    states = jax.tree.map(lambda v: jnp.stack([v, v]), state.replace(x=jnp.float32(1.0)))
    base = env.default_params
    params = jax.tree.map(lambda v: jnp.asarray([v, v]), base)
    params = params.replace(x_threshold=jnp.asarray([2.4, 4.8], jnp.float32))
    frames = np.asarray(jax.jit(jax.vmap(env.render))(states, params))
    for threshold, f in zip([2.4, 4.8], frames, strict=True):
        cols = np.nonzero(_colored(f, (0, 0, 0)).any(axis=0))[0]
        expected = 150 + 1.0 * 300 / (4 * threshold)
        assert abs((cols.min() + cols.max() + 1) / 2 - expected) <= 0.5


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


# ----------------------------------------------------------------------------- others


def _render_batch(env: Env, states: Any) -> np.ndarray:
    return np.asarray(jax.jit(jax.vmap(env.render, in_axes=(0, None)))(states, env.default_params))


def _wrap(a: float) -> float:
    return (a + math.pi) % (2 * math.pi) - math.pi


def test_pendulum_rod_end_at_theta() -> None:
    """The rod points from the pivot at angle ``theta`` (0 up, counter-clockwise) and
    reaches one unit (``200 / 4.4`` px) plus its round end."""
    thetas = [-2.5, -1.0, 0.0, 0.6, 1.7, 3.0, 7.0]  # 7.0: the stored angle is not wrapped
    n = len(thetas)
    states = PendulumState(
        jnp.asarray(thetas, jnp.float32), jnp.zeros(n, jnp.float32), jnp.zeros(n, jnp.int32)
    )
    frames = _render_batch(Pendulum(), states)
    length, half_width = 200 / 4.4, 0.1 * 200 / 4.4
    for theta, f in zip(thetas, frames, strict=True):
        r, c = np.nonzero(_colored(f, (204, 77, 77)))
        dx, dy = c + 0.5 - 100.0, r + 0.5 - 100.0
        # The rod's pixel centroid lies on its axis (about half way out); half a pixel
        # of error there is an angle of 0.5 / (length / 2).
        angle = math.atan2(-dx.mean(), -dy.mean())
        assert abs(_wrap(angle - theta)) <= 0.5 / (length / 2), (theta, angle)
        assert abs(np.sqrt(dx**2 + dy**2).max() - (length + half_width)) <= 1.0
        assert _colored(f, (0, 0, 0))[99:101, 99:101].all()  # the pivot


def test_acrobot_joint_and_tip_follow_angles() -> None:
    """The middle joint sits at ``l1 (sin t1, -cos t1)`` and the second link reaches
    ``l2`` further along ``t1 + t2`` (world ``y`` up, 200 / 4.4 px per unit)."""
    t1 = [0.0, 0.7, -1.2, 2.5, -3.0]
    t2 = [0.0, -1.0, 1.3, 0.4, -0.8]
    n = len(t1)
    zeros = jnp.zeros(n, jnp.float32)
    states = AcrobotState(
        jnp.asarray(t1, jnp.float32),
        jnp.asarray(t2, jnp.float32),
        zeros,
        zeros,
        jnp.zeros(n, jnp.int32),
    )
    frames = _render_batch(Acrobot(), states)
    scale = 200 / 4.4
    for a, b, f in zip(t1, t2, frames, strict=True):
        p1 = np.array([100 + scale * math.sin(a), 100 + scale * math.cos(a)])
        r, c = np.nonzero(_colored(f, (204, 204, 0)))
        pts = np.stack([c + 0.5, r + 0.5], -1)
        mid = pts[np.linalg.norm(pts - 100.0, axis=-1) > 0.5 * scale]  # not the fixed joint
        np.testing.assert_allclose(mid.mean(axis=0), p1, atol=0.5)
        r, c = np.nonzero(_colored(f, (0, 204, 204)))
        links = np.stack([c + 0.5, r + 0.5], -1)
        d2 = np.array([math.sin(a + b), math.cos(a + b)])  # link 2's direction on screen
        reach = ((links - p1) @ d2).max()
        assert abs(reach - (scale + 0.05 * scale)) <= 1.0, (a, b, reach)


@pytest.mark.parametrize("env", [MountainCar(), MountainCarContinuous()], ids=["d", "c"])
def test_mountain_car_car_and_flag(env: Env) -> None:
    """The car's pixel centroid is at the documented point above the curve; the flag's
    pennant starts at the goal's column (0.5 for MountainCar, 0.45 for the continuous)."""
    xs = [-1.1, -0.7, -0.52, -0.2, 0.1, 0.4]
    n = len(xs)
    zeros = jnp.zeros(n, jnp.float32)
    states = MountainCarState(jnp.asarray(xs, jnp.float32), zeros, jnp.zeros(n, jnp.int32))
    frames = _render_batch(env, states)
    params = env.default_params
    scale = 300 / (params.max_position - params.min_position)
    for x, f in zip(xs, frames, strict=True):
        alpha = math.atan(1.35 * math.cos(3 * x))
        height = 0.45 * math.sin(3 * x) + 0.55
        expected = [
            (x - params.min_position) * scale - 10 * math.sin(alpha),
            200 - height * scale - 10 * math.cos(alpha),
        ]
        r, c = np.nonzero(_colored(f, (0, 0, 0)))
        assert 180 <= r.size <= 220  # the 20 x 10 body, whole
        np.testing.assert_allclose([c.mean() + 0.5, r.mean() + 0.5], expected, atol=0.5)
        _, c = np.nonzero(_colored(f, (204, 204, 0)))
        goal_col = (params.goal_position - params.min_position) * scale
        assert goal_col + 1.0 <= c.min() + 0.5 <= goal_col + 2.0
        assert c.max() + 0.5 <= goal_col + 1.0 + 12.0


def test_spread_circles_at_positions() -> None:
    """Agent ``i``'s disc (color ``AGENT_COLORS[i]``) is centered at its position, each
    landmark's dark gray disc at its own (view ``[-2, 2]^2``, 50 px per unit)."""
    env = Spread(n=3)
    pos = np.array(
        [[[-1.2, 0.9], [0.3, -0.4], [1.5, 1.1]], [[0.0, 0.0], [-1.8, -1.7], [0.8, -1.3]]]
    )
    lms = np.array([[[0.9, 0.2], [-0.5, -1.4], [-1.5, 1.6]], [[1.2, 1.2], [-1.0, 0.7], [0.1, 1.0]]])
    states = SpreadState(
        jnp.asarray(pos, jnp.float32),
        jnp.zeros_like(jnp.asarray(pos, jnp.float32)),
        jnp.asarray(lms, jnp.float32),
        jnp.zeros(2, jnp.int32),
    )
    frames = _render_batch(env, states)
    radius = env.default_params.agent_radius * 50
    for f, ps, ls in zip(frames, pos, lms, strict=True):
        for i, (x, y) in enumerate(ps):
            r, c = np.nonzero(_colored(f, draw.AGENT_COLORS[i]))
            np.testing.assert_allclose(
                [c.mean() + 0.5, r.mean() + 0.5], [(x + 2) * 50, (2 - y) * 50], atol=0.25
            )
            assert abs(r.size - math.pi * radius**2) <= 2 * math.pi * radius  # a whole disc
        gray = _colored(f, draw.DARK_GRAY)
        r, c = np.nonzero(gray)
        pts = np.stack([c + 0.5, r + 0.5], -1)
        centers = np.stack([(ls[:, 0] + 2) * 50, (2 - ls[:, 1]) * 50], -1)
        nearest = np.argmin(np.linalg.norm(pts[:, None] - centers[None], axis=-1), axis=1)
        for k in range(3):
            np.testing.assert_allclose(pts[nearest == k].mean(axis=0), centers[k], atol=0.25)
            assert np.linalg.norm(pts[nearest == k] - centers[k], axis=-1).max() <= 3.0


def test_goals_agents_rings_and_done_dots() -> None:
    """Agents' discs at their positions, goal rings of the same color around the goals,
    a black dot on exactly the agents that are done (view ``[-1.1, 1.1]^2``)."""
    env = Goals(n=3)
    pos = np.array([[-0.7, 0.6], [0.2, -0.3], [0.8, 0.9]], np.float32)
    goals = np.array([[0.5, 0.5], [-0.6, -0.7], [-0.1, 0.8]], np.float32)
    done = np.array([True, False, True])
    state = GoalsState(
        jnp.asarray(pos),
        jnp.asarray(goals),
        jnp.zeros((3, 8), jnp.float32),
        jnp.asarray(done),
        jnp.zeros(3, bool),
        jnp.zeros((), jnp.int32),
    )
    frame = np.asarray(jax.jit(env.render)(state, env.default_params))
    scale = 200 / 2.2
    ring_r = 0.1 * scale  # goal_radius, 2 px thick

    def px(p: np.ndarray) -> np.ndarray:
        return np.array([(p[0] + 1.1) * scale, (1.1 - p[1]) * scale])

    black = _colored(frame, (0, 0, 0))
    for i in range(3):
        r, c = np.nonzero(_colored(frame, draw.AGENT_COLORS[i]))
        pts = np.stack([c + 0.5, r + 0.5], -1)
        d_agent = np.linalg.norm(pts - px(pos[i]), axis=-1)
        d_goal = np.linalg.norm(pts - px(goals[i]), axis=-1)
        disc, ring = d_agent[d_agent <= 5.0], d_goal[d_goal <= ring_r + 1e-3]
        assert abs(disc.size - math.pi * 25) <= 10 * math.pi  # the whole disc of radius 5
        assert np.all((d_agent <= 5.0 + 1e-3) | (d_goal <= ring_r + 1e-3))  # nothing else
        assert ring.size > 2 * math.pi * ring_r and ring.min() >= ring_r - 2.0 - 1e-3  # hollow
        ci, cj = np.floor(px(pos[i])[::-1]).astype(int)
        assert black[ci - 1 : ci + 1, cj - 1 : cj + 1].any() == done[i]


def test_tictactoe_marks_match_board() -> None:
    """Each 40 px cell shows a red X for 1, a blue O for 2, nothing for 0; the
    background turns light gray once the game is over."""
    env = TicTacToe()
    states = _states(env, 5, n=4)
    frames = _render_batch(env, states)
    for i, f in enumerate(frames):
        board = np.asarray(states.board[i])
        for cell in range(9):
            block = f[
                40 * (cell // 3) : 40 * (cell // 3 + 1), 40 * (cell % 3) : 40 * (cell % 3 + 1)
            ]
            red, blue = _colored(block, draw.RED).sum(), _colored(block, draw.BLUE).sum()
            assert (red > 50, blue > 50) == (board[cell] == 1, board[cell] == 2)
            assert (red == 0) == (board[cell] != 1) and (blue == 0) == (board[cell] != 2)
        over = bool(np.any(np.asarray(states.terminated[i])))
        assert _colored(f[2:5, 2:5], draw.LIGHT_GRAY).all() == over
        assert _colored(f[2:5, 2:5], draw.WHITE).all() == (not over)


def test_procmaze_cells_match_layout() -> None:
    """Every grid square is one ``k x k`` block: wall / free / goal / agent colors."""
    env = ProcMaze(size=4)
    states = _states(env, 7, n=3)
    states = states.replace(goal=states.goal.at[2].set(states.pos[2]))  # agent on the goal
    frames = _render_batch(env, states)
    k = env.render_cell_px
    assert k == 128 // 9
    g = 2 * env.size + 1
    # Free white, wall dark gray, goal green, agent red (as documented).
    palette = np.array([(255, 255, 255), (60, 60, 60), (40, 170, 60), (220, 40, 40)], np.uint8)
    assert frames.shape[1:3] == (g * k, g * k) == env.render_shape
    for i, f in enumerate(frames):
        codes = np.asarray(states.walls[i]).astype(int)
        gr, gc = np.asarray(states.goal[i])
        codes[gr, gc] = 2
        ar, ac = np.asarray(states.pos[i])
        codes[ar, ac] = 3
        np.testing.assert_array_equal(f, np.kron(palette[codes], np.ones((k, k, 1), np.uint8)))
