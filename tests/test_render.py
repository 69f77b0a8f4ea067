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

from jaxsampler.envs import CartPole
from jaxsampler.envs import render as draw
from jaxsampler.envs.base import Env
from tests.fakes import FakeEnv

RENDERING = [CartPole()]


def _ids(envs: list[Env]) -> list[str]:
    return [type(e).__name__ for e in envs]


@jax.jit(static_argnums=0)
def _states(env: Env, key: jax.Array) -> Any:
    """Three different states of ``env`` (a batch: leading axis 3): reset, then two steps
    with random actions."""
    k_reset, k_act, k_step = jax.random.split(key, 3)
    params = env.default_params
    states, _ = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_reset, 3), params)
    for i in range(2):
        ka, ks = jax.random.fold_in(k_act, i), jax.random.fold_in(k_step, i)
        actions = env.action_space.sample_batch(ka, (3, env.num_agents))
        states, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            jax.random.split(ks, 3), states, actions, params
        )
    return states


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
    states = _states(env, jax.random.key(1))

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
    eager = np.asarray(env.render(_row(states, 0), params))
    np.testing.assert_array_equal(eager, frames[0])
    batched = np.asarray(jax.jit(jax.vmap(env.render, in_axes=(0, None)))(states, params))
    assert batched.shape == (3, h, w, 3) and batched.dtype == np.uint8
    np.testing.assert_array_equal(batched, np.stack(frames))
    chex.clear_trace_counter()


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


def test_primitives_cover_pixel_centers() -> None:
    """Each mask contains exactly the pixels whose centers lie in the shape (NumPy)."""
    shape = (20, 30)
    xs, ys = np.meshgrid(np.arange(30) + 0.5, np.arange(20) + 0.5)
    rect = np.asarray(draw.rect_mask(shape, 3.2, 4.0, 11.7, 9.5))
    np.testing.assert_array_equal(rect, (xs >= 3.2) & (xs <= 11.7) & (ys >= 4.0) & (ys <= 9.5))
    disc = np.asarray(draw.circle_mask(shape, 15.0, 10.0, 4.3))
    np.testing.assert_array_equal(disc, (xs - 15.0) ** 2 + (ys - 10.0) ** 2 <= 4.3**2)
    # A box rotated by 90 degrees is the transposed box.
    box = np.asarray(draw.box_mask(shape, 15.2, 10.3, 8.0, 3.0, math.pi / 2))
    np.testing.assert_array_equal(box, (np.abs(xs - 15.2) <= 1.5) & (np.abs(ys - 10.3) <= 4.0))
    # At 45 degrees it covers about its area (10 x 6 = 60 px), centered where asked.
    tilted = np.asarray(draw.box_mask(shape, 15.2, 10.3, 10.0, 6.0, math.pi / 4))
    assert abs(tilted.sum() - 60) <= 6
    np.testing.assert_allclose([xs[tilted].mean(), ys[tilted].mean()], [15.2, 10.3], atol=0.3)
    # Clockwise on screen (y down): the long axis runs from upper left to lower right.
    assert tilted[int(10.3 + 3), int(15.2 + 3)] and not tilted[int(10.3 - 3), int(15.2 + 3)]
    # A capsule: distance to the segment at most width / 2.
    seg = np.asarray(draw.segment_mask(shape, 2.0, 3.0, 25.0, 15.0, 3.0))
    a, b = np.array([2.0, 3.0]), np.array([25.0, 15.0])
    p = np.stack([xs, ys], -1)
    t = np.clip(((p - a) @ (b - a)) / np.dot(b - a, b - a), 0, 1)
    dist = np.linalg.norm(p - (a + t[..., None] * (b - a)), axis=-1)
    assert np.sum(seg != (dist <= 1.5)) <= 2
    tri = np.asarray(draw.triangle_mask(shape, (0.0, 0.0), (20.0, 0.0), (0.0, 20.0)))
    np.testing.assert_array_equal(tri, xs + ys <= 20.0)
    img = draw.paint(draw.canvas(shape, draw.WHITE), jnp.asarray(rect), draw.RED)
    assert img.dtype == jnp.uint8
    np.testing.assert_array_equal(_colored(np.asarray(img), draw.RED), rect)
    np.testing.assert_array_equal(_colored(np.asarray(img), draw.WHITE), ~rect)


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
