"""TicTacToe-v0 (turn-based, two agents) against a plain-Python tic-tac-toe."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.envs.tictactoe import TicTacToe, TicTacToeParams

WIN_LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


class RefGame:
    """Plain-Python tic-tac-toe with the env's rules (independent of the JAX code)."""

    def __init__(self, limit: int = 9):
        self.board = [None] * 9  # None, 0 (agent_0's X) or 1 (agent_1's O)
        self.turn = 0
        self.moves = 0
        self.limit = limit
        self.terminated = [False, False]
        self.truncated = [False, False]

    def over(self) -> bool:
        return any(self.terminated) or any(self.truncated)

    def play(self, cell: int) -> list[float]:
        if self.over():
            return [0.0, 0.0]
        me, other = self.turn, 1 - self.turn
        reward = [0.0, 0.0]
        self.moves += 1
        if self.board[cell] is not None:  # illegal: the mover loses
            reward[me], reward[other] = -1.0, 1.0
            self.terminated = [True, True]
            return reward
        self.board[cell] = me
        if any(all(self.board[c] == me for c in line) for line in WIN_LINES):
            reward[me], reward[other] = 1.0, -1.0
            self.terminated = [True, True]
        elif all(c is not None for c in self.board):
            self.terminated = [True, True]
        elif self.moves >= self.limit:
            self.truncated = [True, True]
        else:
            self.turn = other
        return reward

    def obs(self, agent: int) -> np.ndarray:
        own = [1.0 if c == agent else 0.0 for c in self.board]
        opp = [1.0 if c == 1 - agent else 0.0 for c in self.board]
        empty = [1.0 if c is None else 0.0 for c in self.board]
        return np.array(own + opp + empty, np.float32)

    def acting(self) -> list[bool]:
        return [not self.over() and self.turn == i for i in range(2)]


def assert_matches(ts, ref: RefGame, reward, where: str) -> None:
    np.testing.assert_array_equal(
        np.asarray(ts.obs), np.stack([ref.obs(0), ref.obs(1)]), err_msg=where
    )
    np.testing.assert_array_equal(
        np.asarray(ts.reward), np.asarray(reward, np.float32), err_msg=where
    )
    np.testing.assert_array_equal(np.asarray(ts.terminated), ref.terminated, err_msg=where)
    np.testing.assert_array_equal(np.asarray(ts.truncated), ref.truncated, err_msg=where)
    np.testing.assert_array_equal(np.asarray(ts.acting), ref.acting(), err_msg=where)
    np.testing.assert_array_equal(
        np.asarray(ts.info.action_mask), np.asarray(ts.obs)[:, 18:] == 1, err_msg=where
    )


def random_moves(rng: np.random.Generator, ref: RefGame, p_illegal: float) -> int:
    """A cell: an occupied one with probability ``p_illegal`` (when there is one), else an
    empty one."""
    empty = [c for c in range(9) if ref.board[c] is None]
    taken = [c for c in range(9) if ref.board[c] is not None]
    if taken and rng.random() < p_illegal:
        return int(rng.choice(taken))
    return int(rng.choice(empty)) if empty else int(rng.integers(9))


def env_slice(tree, e: int):
    """Env ``e`` of a batched pytree."""
    return jax.tree.map(lambda x: x[e], tree)


ENV = TicTacToe()
STEP = jax.jit(ENV.step)  # shared by the tests below: one compile


@functools.cache
def batched_fns(num_envs: int):
    env = TicTacToe()
    reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))
    step = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, None)))
    return env, reset, step


@pytest.mark.parametrize("seed,limit", [(0, 9), (1, 9), (2, 5)])
def test_vmapped_jitted_games_match_reference(seed, limit):
    num_envs = 24
    _, reset, step = batched_fns(num_envs)
    params = TicTacToeParams(max_steps_in_episode=limit)
    rng = np.random.default_rng(seed)
    refs = [RefGame(limit) for _ in range(num_envs)]
    p_illegal = np.linspace(0.0, 0.4, num_envs)  # some envs play only legal moves
    s, ts = reset(jax.random.split(jax.random.PRNGKey(seed), num_envs), params)
    for e, ref in enumerate(refs):
        assert_matches(env_slice(ts, e), ref, [0, 0], f"reset env {e}")
    for t in range(11):  # past the end of every game: finished games must stay frozen
        action = rng.integers(0, 9, (num_envs, 2))  # the non-mover's entry is noise, ignored
        rewards = []
        for e, ref in enumerate(refs):
            cell = random_moves(rng, ref, p_illegal[e])
            action[e, ref.turn] = cell
            rewards.append(ref.play(cell))
        s, ts = step(
            jax.random.split(jax.random.PRNGKey(t), num_envs), s, action.astype(np.int32), params
        )
        for e, ref in enumerate(refs):
            assert_matches(env_slice(ts, e), ref, rewards[e], f"step {t + 1} env {e}")
    assert all(ref.over() for ref in refs)
    outcomes = {tuple(ref.terminated) + tuple(ref.truncated) for ref in refs}
    if limit == 9:
        assert outcomes == {(True, True, False, False)}  # a legal game cannot outlast 9 moves
    else:
        assert (False, False, True, True) in outcomes  # some games hit the limit


def test_jitted_and_unjitted_agree_and_acting_alternates():
    env, step_j = ENV, STEP
    moves = [4, 0, 8, 2, 1, 7, 6, 3, 5]  # a full legal game that ends in a draw
    s_j, ts_j = jax.jit(env.reset)(jax.random.PRNGKey(0))
    s_u, ts_u = env.reset(jax.random.PRNGKey(0))
    for t, cell in enumerate(moves):
        np.testing.assert_array_equal(ts_j.acting, [t % 2 == 0, t % 2 == 1])
        action = np.array([cell, cell], np.int32)
        s_j, ts_j = step_j(jax.random.PRNGKey(t), s_j, action)
        s_u, ts_u = env.step(jax.random.PRNGKey(t), s_u, action)
        for a, b in zip(jax.tree.leaves((s_j, ts_j)), jax.tree.leaves((s_u, ts_u)), strict=True):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ts_j.terminated, [True, True])  # draw
    np.testing.assert_array_equal(ts_j.reward, [0.0, 0.0])
    np.testing.assert_array_equal(ts_j.acting, [False, False])
    assert not ts_j.info.action_mask.any()


@pytest.mark.parametrize(
    "moves,reward",
    [
        ([0, 3, 1, 4, 2], [1.0, -1.0]),  # X wins the top row on move 5
        ([0, 3, 1, 4, 8, 5], [-1.0, 1.0]),  # O wins the middle row on move 6
        ([4, 4], [1.0, -1.0]),  # O plays onto X's cell: O loses
        ([4, 0, 0], [-1.0, 1.0]),
    ],  # X plays onto O's cell: X loses
)
def test_wins_and_illegal_moves(moves, reward):
    env, step = ENV, STEP
    s, ts = env.reset(jax.random.PRNGKey(0))
    for t, cell in enumerate(moves):
        assert not ts.terminated.any()
        s, ts = step(jax.random.PRNGKey(t), s, np.array([cell, cell], np.int32))
    np.testing.assert_array_equal(ts.reward, reward)
    np.testing.assert_array_equal(ts.terminated, [True, True])
    np.testing.assert_array_equal(ts.truncated, [False, False])
    # Stepping a finished game changes nothing and nobody acts.
    s2, ts2 = step(jax.random.PRNGKey(99), s, np.array([5, 6], np.int32))
    np.testing.assert_array_equal(s2.board, s.board)
    np.testing.assert_array_equal(ts2.obs, ts.obs)
    np.testing.assert_array_equal(ts2.reward, [0.0, 0.0])
    np.testing.assert_array_equal(ts2.terminated, [True, True])
    assert not ts2.acting.any()


def test_truncation_and_termination_at_the_limit():
    env, step = ENV, STEP
    params = TicTacToeParams(max_steps_in_episode=5)
    for moves, term, trunc in (([4, 0, 8, 2, 1], False, True), ([0, 3, 1, 4, 2], True, False)):
        s, ts = env.reset(jax.random.PRNGKey(0), params)
        for t, cell in enumerate(moves):
            assert not (ts.terminated | ts.truncated).any()
            s, ts = step(jax.random.PRNGKey(t), s, np.array([cell, cell], np.int32), params)
        np.testing.assert_array_equal(ts.terminated, [term, term])
        np.testing.assert_array_equal(ts.truncated, [trunc, trunc])  # never both: terminated wins
        assert not ts.acting.any()


def test_check_env_and_random_rollout():
    env = js.make("TicTacToe-v0")
    assert env == TicTacToe() and env.num_agents == 2 and env.agent_ids == ("agent_0", "agent_1")
    report = js.check_env(env, num_envs=8)
    assert report.ok, str(report)
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    rollout = js.make_rollout(env, pol, 4, 40)
    # init and rollout in one jit: one compile
    _, traj = jax.jit(lambda key: rollout((), js.init_rollout_state(env, pol, 4, key)))(
        jax.random.PRNGKey(1)
    )
    acting, rewards = np.asarray(traj.acting), np.asarray(traj.rewards)
    is_reset, done = np.asarray(traj.is_reset), np.asarray(traj.terminated | traj.truncated).all(-1)
    assert traj.obs.shape == (41, 4, 2, 27) and traj.infos.action_mask.shape == (40, 4, 2, 9)
    np.testing.assert_array_equal(
        acting.sum(-1), np.where(is_reset, 0, 1)
    )  # exactly one mover per step
    np.testing.assert_array_equal(rewards.sum(-1), 0.0)  # zero-sum
    assert set(np.unique(rewards)) <= {-1.0, 0.0, 1.0}
    np.testing.assert_array_equal(
        is_reset[1:], done[:-1]
    )  # a reset step follows every finished game
    assert done.sum() >= 8
    for e in range(4):  # within a game, agent_0 moves on even steps, agent_1 on odd ones
        k = 0
        for t in range(40):
            if is_reset[t, e]:
                k = 0
                continue
            np.testing.assert_array_equal(acting[t, e], [k % 2 == 0, k % 2 == 1])
            k += 1
