"""The cooperative multi-agent Spread env: layout on the agent axis, dynamics, reward."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.envs.spread import Spread, SpreadParams


def numpy_step(pos, vel, landmarks, action, p=SpreadParams()):
    push = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]], np.float64)[action]
    vel = vel * (1 - p.damping) + push * p.accel * p.dt
    pos = pos + vel * p.dt
    d = np.linalg.norm(landmarks[:, None] - pos[None], axis=-1)
    gap = np.linalg.norm(pos[:, None] - pos[None], axis=-1)
    n = len(pos)
    pairs = sum(gap[i, j] < 2 * p.agent_radius for i in range(n) for j in range(i + 1, n))
    return pos, vel, -d.min(axis=1).sum() - p.collision_penalty * pairs


def numpy_obs(pos, vel, landmarks):
    n = len(pos)
    rows = []
    for i in range(n):
        others = [pos[j] - pos[i] for j in range(n) if j != i]
        rows.append(
            np.concatenate([vel[i], pos[i], (landmarks - pos[i]).ravel(), np.ravel(others)])
        )
    return np.stack(rows)


@pytest.mark.parametrize("n", [1, 3])
def test_dynamics_reward_and_observations_match_numpy(n):
    env = js.make("Spread-v0", n=n)
    assert env.num_agents == n and env.name == "Spread-v0" and env == Spread(n=n)
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    s, ts = reset(jax.random.PRNGKey(n))
    rng = np.random.default_rng(0)
    pos, vel, land = (
        np.asarray(s.pos, np.float64),
        np.zeros((n, 2)),
        np.asarray(s.landmarks, np.float64),
    )
    np.testing.assert_allclose(ts.obs, numpy_obs(pos, vel, land), rtol=1e-6)
    for t in range(1, 26):
        a = rng.integers(0, 5, n)
        s, ts = step(jax.random.PRNGKey(t), s, a)
        pos, vel, r = numpy_step(pos, vel, land, a)
        np.testing.assert_allclose(ts.obs, numpy_obs(pos, vel, land), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(ts.reward, np.full(n, r), rtol=1e-4, atol=1e-4)  # shared reward
        assert not ts.terminated.any() and ts.acting.all()
        assert bool(ts.truncated.all()) == (t == 25)


def test_collisions_are_penalized():
    env = Spread(n=2)
    s, _ = env.reset(jax.random.PRNGKey(0))
    s = s.replace(pos=s.pos.at[1].set(s.pos[0]))
    _, ts = env.step(jax.random.PRNGKey(1), s, np.array([0, 0]))
    no_pen = SpreadParams(collision_penalty=0.0)
    _, ts0 = env.step(jax.random.PRNGKey(1), s, np.array([0, 0]), no_pen)
    np.testing.assert_allclose(ts.reward, ts0.reward - 1.0, rtol=1e-6)


def test_check_env_and_rollout_on_the_agent_axis():
    env = Spread(n=3)
    report = js.check_env(env, num_envs=4)
    assert report.ok, str(report)
    pol = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    params = pol.init(jax.random.PRNGKey(0))
    state = js.init_rollout_state(env, pol, 2, jax.random.PRNGKey(1))
    _, traj = jax.jit(js.make_rollout(env, pol, 2, 30))(params, state)
    assert traj.obs.shape == (31, 2, 3, 14) and traj.actions.shape == (30, 2, 3)
    assert traj.extras["action_logp"].shape == (30, 2, 3)
    np.testing.assert_array_equal(
        np.asarray(traj.is_reset)[25], True
    )  # one reset step after 25 steps
    np.testing.assert_array_equal(np.asarray(traj.truncated)[24], True)


def test_bad_agent_count():
    with pytest.raises(ValueError, match="n >= 1"):
        Spread(n=0)
