"""OpponentPool: the snapshot ring, the per-episode draw, each row played by its pick, and a
rollout in which every episode keeps one opponent."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.policies import MLPPolicy, MultiAgentPolicy, NoState, OpponentPool, Policy
from jaxsampler.spaces import Box, Discrete, Space


@dataclasses.dataclass(frozen=True)
class ConstantPolicy(Policy):
    """Plays the cell its params name, every step (so a snapshot is known by its moves)."""

    observation_space: Space
    action_space: Space

    def init(self, key: jax.Array) -> Any:
        return {"cell": jnp.int32(0)}

    def __call__(self, params, obs, key, policy_state):
        batch = jax.tree.leaves(obs)[0].shape[:-1]
        action = jnp.broadcast_to(params["cell"], batch).astype(jnp.int32)
        return action, {"action_logp": jnp.zeros(batch), "vf_preds": jnp.ones(batch)}, NoState()


@pytest.fixture(scope="module")
def masked_env():
    return js.make("TicTacToe-v0", masked_obs=True)


def constant_pool(env, size: int, p_random: float, cells: list[int]):
    """A pool of ConstantPolicy snapshots playing ``cells`` (in push order)."""
    pool = OpponentPool(ConstantPolicy(env.observation_space, env.action_space), size, p_random)
    params = pool.seeded({"cell": jnp.int32(cells[0])})
    for c in cells[1:]:
        params = pool.push(params, {"cell": jnp.int32(c)})
    return pool, params


def test_push_is_a_ring_over_the_slots(masked_env):
    pool, params = constant_pool(masked_env, 3, 0.5, [10])
    seen = [10]
    for c in range(11, 16):
        params = jax.jit(pool.push)(params, {"cell": jnp.int32(c)})
        seen.append(c)
        ref = np.zeros(3, np.int32) + 10  # slots start as copies of the seed
        for i, v in enumerate(seen):
            ref[i % 3] = v
        np.testing.assert_array_equal(params["snapshots"]["cell"], ref)
        assert int(params["filled"]) == min(len(seen), 3)
        assert int(params["next"]) == len(seen) % 3


def test_draws_the_random_player_at_p_random_and_filled_slots_uniformly(masked_env):
    pool, params = constant_pool(masked_env, 4, 0.3, [0, 1, 2])  # 3 of 4 slots filled
    n = 60_000
    picks = np.asarray(pool.draw(params, jax.random.PRNGKey(0), (n,)))
    counts = np.bincount(picks, minlength=5)
    assert counts[3] == 0  # the unfilled slot is never drawn
    expected = np.array([0.7 / 3] * 3 + [0.0, 0.3]) * n
    sd = np.sqrt(expected * (1 - expected / n))
    assert np.all(np.abs(counts - expected) <= 5 * sd + 1e-9), (counts, expected)
    params["p_random"] = jnp.float32(1.0)
    assert set(np.asarray(pool.draw(params, jax.random.PRNGKey(1), (500,)))) == {4}


def test_each_row_plays_its_pick_and_keeps_it(masked_env):
    pool, params = constant_pool(masked_env, 3, 0.5, [4, 7, 8])
    batch = (64, 2)
    obs = masked_env.observation_space.sample_batch(jax.random.PRNGKey(2), batch)
    state = pool.initial_state(batch)
    assert np.all(np.asarray(state) == -1)
    action, extras, picked = jax.jit(pool)(params, obs, jax.random.PRNGKey(3), state)
    picked, action = np.asarray(picked), np.asarray(action)
    assert set(np.unique(picked)) == {0, 1, 2, 3}  # 3 is the random player
    snap = picked < 3
    np.testing.assert_array_equal(action[snap], np.array([4, 7, 8])[picked[snap]])
    np.testing.assert_array_equal(np.asarray(extras["vf_preds"])[snap], 1.0)
    mask = np.asarray(obs["action_mask"])
    rand = ~snap
    assert np.all(mask[rand, action[rand]] | ~mask[rand].any(-1))  # legal moves only
    legal = np.where(mask.any(-1), mask.sum(-1), 9)
    np.testing.assert_allclose(
        np.asarray(extras["action_logp"])[rand], -np.log(legal[rand]), rtol=1e-6
    )
    np.testing.assert_array_equal(np.asarray(extras["vf_preds"])[rand], 0.0)
    # The next step keeps every pick (a new key draws nothing new).
    _, _, again = pool(params, obs, jax.random.PRNGKey(4), jnp.asarray(picked))
    np.testing.assert_array_equal(np.asarray(again), picked)


def test_snapshot_rows_equal_the_base_policy_on_those_params(masked_env):
    mlp = MLPPolicy(masked_env.observation_space, masked_env.action_space, (8,))
    pool = OpponentPool(mlp, size=2, p_random=0.0)
    a, b = mlp.init(jax.random.PRNGKey(0)), mlp.init(jax.random.PRNGKey(1))
    params = pool.push(pool.seeded(a), b)
    obs = masked_env.observation_space.sample_batch(jax.random.PRNGKey(2), (32, 2))
    key = jax.random.PRNGKey(3)
    state = jnp.tile(jnp.array([0, 1], jnp.int32), (32, 1))  # column 0 plays a, 1 plays b
    action, extras, _ = pool(params, obs, key, state)
    _, k_base, _ = jax.random.split(key, 3)  # the pool's key for its snapshots
    for col, p in ((0, a), (1, b)):
        want_a, want_x, _ = mlp(p, obs, k_base, NoState())
        np.testing.assert_array_equal(np.asarray(action)[:, col], np.asarray(want_a)[:, col])
        for k in want_x:
            np.testing.assert_allclose(
                np.asarray(extras[k])[:, col], np.asarray(want_x[k])[:, col], rtol=1e-6
            )


def test_in_a_rollout_each_episode_meets_one_snapshot(masked_env):
    env = masked_env
    pool, pool_params = constant_pool(env, 3, 0.0, [0, 4, 8])
    learner = js.RandomPolicy(env.observation_space, env.action_space)
    mapping = lambda agent_id: "learner" if agent_id == "agent_0" else "opponent"
    policy = MultiAgentPolicy(env, {"learner": learner, "opponent": pool}, mapping)
    params = {"learner": (), "opponent": pool_params}
    rollout = js.make_rollout(env, policy, num_envs=16, rollout_length=60)
    _, traj = rollout(params, rollout.init(jax.random.PRNGKey(0)))
    acting = np.asarray(traj.acting)[..., 1]  # [T, E] agent_1 moves
    actions = np.asarray(traj.actions)[..., 1]
    episode = np.asarray(traj.episode_count_0)[None] + np.cumsum(np.asarray(traj.is_reset), 0)
    seen = {}
    for t, e in zip(*np.nonzero(acting), strict=True):
        seen.setdefault((e, episode[t, e]), []).append(int(actions[t, e]))
    assert len(seen) > 30
    assert sum(len(moves) >= 2 for moves in seen.values()) > 10  # a redraw would show
    assert all(len(set(moves)) == 1 for moves in seen.values()), seen
    assert {moves[0] for moves in seen.values()} == {0, 4, 8}


def test_bad_input_is_named(masked_env):
    mlp = MLPPolicy(masked_env.observation_space, masked_env.action_space, (8,))
    with pytest.raises(ValueError, match="size"):
        OpponentPool(mlp, size=0)
    with pytest.raises(ValueError, match="p_random"):
        OpponentPool(mlp, p_random=1.5)
    with pytest.raises(TypeError, match="Policy"):
        OpponentPool("mlp")  # type: ignore[arg-type]
    box = Box(-1.0, 1.0, (2,), np.float32)
    with pytest.raises(TypeError, match="Discrete"):
        OpponentPool(MLPPolicy(Box(0.0, 1.0, (3,), np.float32), box, (4,)))
    gru = js.policies.RecurrentPolicy(Box(0.0, 1.0, (3,), np.float32), Discrete(2), 4)
    with pytest.raises(TypeError, match="stateless"):
        OpponentPool(gru)
    pool = OpponentPool(mlp, size=2)
    params = pool.init(jax.random.PRNGKey(0))
    other = MLPPolicy(masked_env.observation_space, masked_env.action_space, (4,))
    with pytest.raises(ValueError, match="shape"):
        pool.push(params, other.init(jax.random.PRNGKey(1)))
    with pytest.raises(ValueError, match="structure"):
        pool.push(params, {"cell": jnp.int32(0)})
