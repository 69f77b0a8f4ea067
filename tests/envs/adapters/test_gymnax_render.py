"""The gymnax adapter's JAX rendering: MinAtar frames against a NumPy colorization of the
observation; classic-control frames against the built-in env's renderer for the same
physical state; envs it cannot draw say so."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.envs.adapters.gymnax import (
    MINATAR_BACKGROUND,
    MINATAR_CELL,
    MINATAR_PALETTE,
)

# Freeway-MinAtar renders the same way; left out here because its reset alone takes
# seconds to compile.
MINATAR = [
    "Breakout-MinAtar",
    "Asterix-MinAtar",
    "SpaceInvaders-MinAtar",
    "Seaquest-MinAtar",
]


def np_minatar_frame(obs: np.ndarray) -> np.ndarray:
    """Reference: cell by cell, channel by channel (the first active channel wins), then
    each cell blown up to MINATAR_CELL x MINATAR_CELL pixels."""
    rows, cols, channels = obs.shape
    small = np.empty((rows, cols, 3), np.uint8)
    for r in range(rows):
        for c in range(cols):
            color = MINATAR_BACKGROUND
            for ch in range(channels):
                if obs[r, c, ch] > 0.5:
                    color = MINATAR_PALETTE[ch]
                    break
            small[r, c] = color
    k = MINATAR_CELL
    big = np.empty((rows * k, cols * k, 3), np.uint8)
    for r in range(rows * k):
        for c in range(cols * k):
            big[r, c] = small[r // k, c // k]
    return big


@pytest.mark.parametrize("env_id", MINATAR)
def test_minatar_frames_are_the_colorized_observation(env_id):
    env = js.make(f"gymnax:{env_id}")
    assert env.can_render and env.render_shape == (160, 160)

    @jax.jit
    def first_frames(keys):
        states, ts = jax.vmap(env.reset)(keys)
        return jax.vmap(env.render)(states), ts.obs[:, 0]

    frames, obs = jax.device_get(first_frames(jax.random.split(jax.random.PRNGKey(1), 2)))
    assert frames.shape == (2, 160, 160, 3) and frames.dtype == np.uint8
    for e in range(2):
        np.testing.assert_array_equal(frames[e], np_minatar_frame(obs[e]))
    # Not a blank picture: something besides the background is drawn.
    assert (frames.reshape(-1, 3) != MINATAR_BACKGROUND).any(axis=-1).any()


def test_minatar_frames_follow_the_game():
    """Breakout over a few random steps: the moving ball is drawn where the observation has
    it, at every step (vmapped render inside a jitted scan)."""
    env = js.make("gymnax:Breakout-MinAtar")
    keys = jax.random.split(jax.random.PRNGKey(2), 5)

    @jax.jit
    def run(keys):
        states, _ = jax.vmap(env.reset)(jax.random.split(keys[0], 2))

        def one(carry, key):
            k_act, k_step = jax.random.split(key)
            actions = env.action_space.sample_batch(k_act, (2, 1))
            s, ts = jax.vmap(env.step)(jax.random.split(k_step, 2), carry, actions)
            return s, (jax.vmap(env.render)(s), ts.obs[:, 0])

        return jax.lax.scan(one, states, keys[1:])[1]

    frames, obs = jax.device_get(run(keys))
    assert frames.shape == (4, 2, 160, 160, 3)
    balls = set()
    for t in range(4):
        for e in range(2):
            np.testing.assert_array_equal(frames[t, e], np_minatar_frame(obs[t, e]))
            balls.add(tuple(np.argwhere(obs[t, e, :, :, 1])[0]))
    assert len(balls) > 1, "the ball moves"


def test_envs_without_a_jax_renderer_say_so():
    env = js.make("gymnax:Catch-bsuite")
    assert not env.can_render
    state, _ = env.reset(jax.random.PRNGKey(0))
    with pytest.raises(NotImplementedError, match="Catch-bsuite cannot render"):
        env.render(state)


CLASSIC = [
    ("CartPole-v1", "CartPole-v1"),
    ("Pendulum-v1", "Pendulum-v1"),
    ("Acrobot-v1", "Acrobot-v1"),
    ("MountainCar-v0", "MountainCar-v0"),
    ("MountainCarContinuous-v0", "MountainCarContinuous-v0"),
]


@pytest.mark.parametrize("gymnax_id,builtin_id", CLASSIC)
def test_classic_control_frames_equal_the_builtin_renderer(gymnax_id, builtin_id):
    ours = js.make(builtin_id)
    if not getattr(ours, "can_render", False):
        pytest.skip(f"the built-in {builtin_id} has no renderer in this checkout")
    env = js.make(f"gymnax:{gymnax_id}")
    assert env.can_render
    # Same physical state in both envs' field names (gymnax's first, then ours).
    key = jax.random.PRNGKey(4)
    g_state, _ = env.reset(key)
    for i in range(3):
        action = env.action_space.sample_batch(jax.random.fold_in(key, i), (1,))
        g_state, _ = env.step(jax.random.fold_in(key, 10 + i), g_state, action)
    names = {
        "Acrobot-v1": {
            "theta1": "joint_angle1",
            "theta2": "joint_angle2",
            "dtheta1": "velocity_1",
            "dtheta2": "velocity_2",
        }
    }.get(builtin_id)
    o_state, _ = ours.reset(key)
    fields = [f.name for f in dataclasses.fields(o_state) if f.name != "time"]
    values = {
        f: jnp.asarray(getattr(g_state, (names or {}).get(f, f)), jnp.float32) for f in fields
    }
    o_state = o_state.replace(**values, time=jnp.asarray(g_state.time, jnp.int32))
    want = np.asarray(ours.render(o_state, ours.default_params))
    got = np.asarray(jax.jit(env.render)(g_state))
    np.testing.assert_array_equal(got, want)
    assert env.render_shape == want.shape[:2]
