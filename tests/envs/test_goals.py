"""Goals-v0: agents that finish at different times, against a NumPy re-implementation."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.envs.goals import Goals, GoalsParams

MOVES = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]], np.float32)

# Agents walking along x to goals 0.35, 0.65 and 1.05 away: a straight walk of 0.1 per step
# comes within the goal radius 0.1 after 3, 6 and 10 steps.
POS = np.array([[0.0, 0.0], [0.0, 0.5], [-0.5, -0.5]], np.float32)
GOALS = np.array([[0.35, 0.0], [0.65, 0.5], [0.55, -0.5]], np.float32)
FINISH = [3, 6, 10]


class RefGoals:
    """NumPy version of the env's rules (float32, like the env)."""

    def __init__(self, pos, goals, p: GoalsParams):
        self.pos, self.goals, self.p = np.array(pos, np.float32), np.array(goals, np.float32), p
        n = len(self.pos)
        self.term, self.trunc, self.t = np.zeros(n, bool), np.zeros(n, bool), 0
        self.obs = self.observe()

    def observe(self) -> np.ndarray:
        rows = []
        for i in range(len(self.pos)):
            others = [self.pos[j] - self.pos[i] for j in range(len(self.pos)) if j != i]
            rows.append(
                np.concatenate([self.pos[i], self.goals[i] - self.pos[i], np.ravel(others)])
            )
        return np.stack(rows).astype(np.float32)

    def step(self, action) -> np.ndarray:
        p = self.p
        going = ~(self.term | self.trunc)
        moved = np.clip(self.pos + MOVES[action] * np.float32(p.step_size), -p.arena, p.arena)
        self.pos = np.where(going[:, None], moved, self.pos).astype(np.float32)
        dist = np.sqrt(((self.goals - self.pos) ** 2).sum(-1))
        reached = going & (dist <= np.float32(p.goal_radius))
        self.t += 1
        reward = np.where(
            going, -p.step_penalty - p.distance_penalty * dist + p.goal_reward * reached, 0.0
        )
        self.term = self.term | reached
        self.trunc = self.trunc | (going & ~reached & (self.t >= p.max_steps_in_episode))
        self.obs = np.where(going[:, None], self.observe(), self.obs)
        return reward


def greedy(rel_goal: np.ndarray) -> np.ndarray:
    """Walk along the axis with the larger distance to the goal (numpy or jax arrays)."""
    xp = jnp if isinstance(rel_goal, jax.Array) else np
    dx, dy = rel_goal[..., 0], rel_goal[..., 1]
    along_x = xp.abs(dx) >= xp.abs(dy)
    return xp.where(along_x, xp.where(dx > 0, 2, 1), xp.where(dy > 0, 4, 3)).astype(np.int32)


@functools.cache
def jitted(n: int):
    env = Goals(n=n)
    return env, jax.jit(env.reset), jax.jit(env.step)


def assert_matches(ts, ref: RefGoals, reward, where: str) -> None:
    np.testing.assert_allclose(ts.obs, ref.obs, rtol=1e-6, atol=1e-6, err_msg=where)
    np.testing.assert_allclose(ts.reward, reward, rtol=1e-5, atol=1e-6, err_msg=where)
    np.testing.assert_array_equal(ts.terminated, ref.term, err_msg=where)
    np.testing.assert_array_equal(ts.truncated, ref.trunc, err_msg=where)
    np.testing.assert_array_equal(ts.acting, ~(ref.term | ref.trunc), err_msg=where)


@pytest.mark.parametrize("seed", [0, 1])
def test_random_and_greedy_walks_match_numpy(seed):
    n = 3
    _, reset, step = jitted(n)
    # A large goal radius so random walkers finish too; a short limit so the rest are truncated.
    params = GoalsParams(goal_radius=0.6, max_steps_in_episode=30)
    s, ts = reset(jax.random.PRNGKey(seed), params)
    ref = RefGoals(s.pos, s.goals, params)
    assert_matches(ts, ref, np.zeros(n), "reset")
    rng = np.random.default_rng(seed)
    for t in range(1, 33):  # two steps past the limit: nothing may change any more
        action = rng.integers(0, 5, n)
        if t % 2:  # mix greedy steps in so that agents do reach their goals
            action = greedy(ref.goals - ref.pos)
        s, ts = step(jax.random.PRNGKey(t), s, action.astype(np.int32), params)
        assert_matches(ts, ref, ref.step(action), f"step {t}")
    assert (ref.term | ref.trunc).all() and ref.term.any()


def test_agents_finish_at_different_steps_with_sticky_flags():
    env, _, step = jitted(3)
    s, ts = env.reset_to(POS, GOALS)
    ref = RefGoals(POS, GOALS, env.default_params)
    finished_obs = {}
    for t in range(1, 12):
        action = greedy(np.asarray(ts.obs)[:, 2:4])  # finished agents' entries are ignored
        s, ts = step(jax.random.PRNGKey(t), s, action)
        assert_matches(ts, ref, ref.step(action), f"step {t}")
        for i, f in enumerate(FINISH):
            assert bool(ts.terminated[i]) == (t >= f)  # sticky once set
            assert not ts.truncated[i]
            if t == f:
                assert ts.reward[i] > 0.9  # the goal bonus
                finished_obs[i] = np.asarray(ts.obs[i])
            if t > f:
                assert ts.reward[i] == 0.0 and not ts.acting[i]
                np.testing.assert_array_equal(ts.obs[i], finished_obs[i])  # frozen
        assert bool(ts.terminated.all()) == (t >= 10)  # the episode ends with the last agent


def test_time_limit_truncates_only_the_agents_still_going():
    env, _, step = jitted(3)
    params = GoalsParams(max_steps_in_episode=6)  # agent 1 finishes exactly at the limit
    s, ts = env.reset_to(POS, GOALS)
    for t in range(1, 8):
        s, ts = step(jax.random.PRNGKey(t), s, greedy(np.asarray(ts.obs)[:, 2:4]), params)
        if t < 6:
            assert not ts.truncated.any()
    np.testing.assert_array_equal(ts.terminated, [True, True, False])
    np.testing.assert_array_equal(ts.truncated, [False, False, True])
    assert not ts.acting.any()


@dataclasses.dataclass(frozen=True)
class StagedGoals(Goals):
    """Goals that always starts from the fixed POS/GOALS layout."""

    def reset(self, key, params=None):
        return self.reset_to(POS, GOALS)


@dataclasses.dataclass(frozen=True)
class GreedyPolicy(js.Policy):
    observation_space: js.spaces.Space
    action_space: js.spaces.Space

    def init(self, key):
        return ()

    def __call__(self, params, obs, key, policy_state):
        return greedy(obs[..., 2:4]), {}, policy_state


def test_rollout_episode_ends_when_the_last_agent_finishes():
    env = StagedGoals(n=3)
    pol = GreedyPolicy(env.observation_space, env.action_space)
    # The user's path: an eager init, then a jitted rollout that donates state and buffers
    # (an env whose reset returns one array in both the state and the TimeStep fails here:
    # the eager vmap hands out that array as a single buffer, donated twice).
    rollout = js.jit_rollout(js.make_rollout(env, pol, 2, 23))
    state, traj = rollout((), js.init_rollout_state(env, pol, 2, jax.random.PRNGKey(0)))
    traj = jax.device_get(traj)  # a host copy: the next call reuses the device buffers
    _, traj2 = rollout((), state)
    # Episodes of 10 steps, each followed by one reset step (period 11): resets at steps
    # 10 and 21 of the first chunk, 32 and 43 (9 and 20 of the second).
    np.testing.assert_array_equal(np.nonzero(traj.is_reset[:, 0])[0], [10, 21])
    np.testing.assert_array_equal(np.nonzero(np.asarray(traj2.is_reset)[:, 0])[0], [9, 20])
    acting, term, rewards = traj.acting, traj.terminated, traj.rewards
    for i, f in enumerate(FINISH):
        want = np.arange(10) < f  # agent i acts in steps 0 .. f - 1
        np.testing.assert_array_equal(acting[:10, :, i], np.broadcast_to(want[:, None], (10, 2)))
        ended = np.arange(10) >= f - 1  # terminated[t] are the flags after step t (the f-th step)
        np.testing.assert_array_equal(term[:10, :, i], np.broadcast_to(ended[:, None], (10, 2)))
    np.testing.assert_array_equal(acting[11:21], acting[:10])  # the next episode is the same
    assert (rewards[:10][~acting[:10]] == 0.0).all()  # no reward after finishing


def test_check_env_and_registry():
    env = js.make("Goals-v0", n=2)
    assert env == Goals(n=2) and env.num_agents == 2 and env.observation_space.shape == (6,)
    report = js.check_env(env, num_envs=8)
    assert report.ok, str(report)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "3"])
def test_bad_agent_count(bad):
    with pytest.raises(ValueError, match="n >= 1"):
        Goals(n=bad)


def test_reset_to_checks_shapes():
    with pytest.raises(ValueError, match=r"shape \(3, 2\)"):
        Goals(n=3).reset_to(np.zeros((2, 2)), np.zeros((3, 2)))
