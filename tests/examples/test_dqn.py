"""examples/dqn.py: its n-step items in the flashbax buffer against a plain-Python
reconstruction from the trajectories (terminations and truncations), its Double-DQN targets
against NumPy, its epsilon-greedy policy, and a quick training run (no learning threshold:
the full run's results are in benchmarks/results/dqn_cartpole.md)."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js
from examples import dqn

E, T, N, GAMMA = 3, 16, 3, 0.9


@pytest.fixture(scope="module")
def filled():
    """Two rollout calls (CartPole with a 12-step limit, random actions) added to the buffer
    the way the example adds them."""
    env = js.make("CartPole-v1")
    policy = dqn.QPolicy(env.observation_space, env.action_space, hidden_sizes=(16,))
    params = {**policy.init(jax.random.PRNGKey(0)), "epsilon": jnp.float32(1.0)}
    rollout = js.make_rollout(env, policy, E, T)
    env_params = env.default_params.replace(max_steps_in_episode=12)
    state = js.init_rollout_state(env, policy, E, jax.random.PRNGKey(1), env_params=env_params)

    @jax.jit
    def collect(p, s):
        s, traj = rollout(p, s)
        return s, dqn.with_n_step(traj, N, GAMMA)

    replay = js.offpolicy.make_transition_buffer(
        jax.eval_shape(collect, params, state)[1], 2 * E * T, 8, 64
    )
    buf = replay.init()
    trajs = []
    for _ in range(2):
        state, traj = collect(params, state)
        buf = jax.jit(replay.add)(buf, traj)
        trajs.append(jax.tree.map(np.asarray, traj))
    return policy, params, replay, buf, trajs


def _n_step_reference(traj, e, t):
    """(reward sum, discount, bootstrap observation) of step t of env e, by walking the steps."""
    r, term, trunc = traj.rewards[:, e, 0], traj.terminated[:, e, 0], traj.truncated[:, e, 0]
    total, disc, j = 0.0, 1.0, t
    for k in range(N):
        total += disc * r[j]
        disc *= GAMMA
        if term[j]:
            return total, 0.0, traj.obs[j + 1, e, 0]
        if trunc[j] or j + 1 == T or k == N - 1:
            return total, disc, traj.obs[j + 1, e, 0]
        j += 1
    raise AssertionError("unreachable")


def test_buffer_items_carry_the_n_step_targets_of_their_step(filled):
    _, _, _, buf, trajs = filled
    exp = jax.tree.map(lambda x: np.asarray(x)[0], buf.experience)  # [2 * E * T, ...]
    assert int(buf.current_index) == 0 and bool(buf.is_full)  # exactly 2 calls of E * T
    seen_term = seen_trunc = 0
    for c, traj in enumerate(trajs):
        for e in range(E):
            for t in range(T):
                i = c * E * T + e * T + t  # row e of call c, flattened by the item buffer
                assert exp.valid[i] == traj.acting[t, e, 0]
                if not traj.acting[t, e, 0]:  # a reset step: stored, not valid
                    continue
                np.testing.assert_array_equal(exp.obs[i], traj.obs[t, e, 0])
                assert exp.action[i] == traj.actions[t, e, 0]
                total, disc, boot = _n_step_reference(traj, e, t)
                np.testing.assert_allclose(exp.extras["n_step_reward"][i], total, rtol=1e-6)
                np.testing.assert_allclose(exp.extras["n_step_discount"][i], disc, rtol=1e-6)
                np.testing.assert_array_equal(exp.extras["n_step_obs"][i], boot)
                seen_term += bool(traj.terminated[t, e, 0])
                seen_trunc += bool(traj.truncated[t, e, 0])
    assert seen_term > 0 and seen_trunc > 0  # both boundaries were exercised


def _np_q(q_params, obs):
    layers = q_params["params"]
    names = sorted(layers, key=lambda k: int(k.split("_")[1]))
    x = np.asarray(obs, np.float64)
    for n in names[:-1]:
        x = np.maximum(x @ np.asarray(layers[n]["kernel"]) + np.asarray(layers[n]["bias"]), 0)
    return x @ np.asarray(layers[names[-1]]["kernel"]) + np.asarray(layers[names[-1]]["bias"])


def test_td_targets_are_double_dqn_n_step_targets(filled):
    policy, params, replay, buf, _ = filled
    online = params["q"]
    target = policy.init(jax.random.PRNGKey(7))["q"]  # another network than the online one
    batch = jax.jit(replay.sample)(buf, jax.random.PRNGKey(3))
    y = np.asarray(jax.jit(dqn.td_targets, static_argnums=0)(policy, online, target, batch))
    b = jax.tree.map(np.asarray, batch)
    s_next = b.extras["n_step_obs"]
    a_star = _np_q(online, s_next).argmax(-1)
    q_next = _np_q(target, s_next)[np.arange(len(a_star)), a_star]
    expected = b.extras["n_step_reward"] + b.extras["n_step_discount"] * q_next
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)
    assert (b.extras["n_step_discount"] == 0).any()  # terminations in the batch: no bootstrap


def test_q_policy_epsilon_and_greedy():
    env = js.make("CartPole-v1")
    policy = dqn.QPolicy(env.observation_space, env.action_space, hidden_sizes=(16,))
    params = policy.init(jax.random.PRNGKey(0))
    obs = jax.random.normal(jax.random.PRNGKey(1), (4096, 1, 4))
    greedy_a = np.asarray(jnp.argmax(policy.q_values(params["q"], obs), -1))
    act = lambda pol, eps: np.asarray(
        pol({**params, "epsilon": jnp.float32(eps)}, obs, jax.random.PRNGKey(2), None)[0]
    )
    np.testing.assert_array_equal(act(policy, 0.0), greedy_a)
    np.testing.assert_array_equal(act(js.policies.greedy(policy), 1.0), greedy_a)
    agree = (act(policy, 1.0) == greedy_a).mean()  # uniform actions: half agree with argmax
    assert 0.45 < agree < 0.55
    assert act(policy, 1.0).dtype == env.action_space.dtype


def test_training_loop_fills_the_buffer_and_reduces_the_loss():
    cfg = dataclasses.replace(dqn.DQNConfig(**dqn.QUICK), log_every=0)
    ts, m = jax.jit(dqn.make_train(cfg))(jax.random.PRNGKey(0))
    added = cfg.num_iterations * cfg.steps_per_iteration
    assert added == cfg.buffer_size and bool(ts.buffer.is_full)
    valid = np.asarray(ts.buffer.experience.valid).sum()
    # every step is stored; the invalid ones are the reset steps (one per ended episode,
    # except an episode ending at the very last step, whose reset is not stored yet)
    episodes = np.asarray(m["episodes"]).sum()
    assert added - episodes <= valid <= added - episodes + cfg.num_envs
    loss = np.asarray(m["loss"])
    learning = np.nonzero(loss)[0]
    assert learning[0] == cfg.learning_starts // cfg.steps_per_iteration - 1
    q = len(learning) // 4
    assert loss[learning[-q:]].mean() < loss[learning[:q]].mean()
    eps = np.asarray(m["epsilon"])
    assert eps[0] == 1.0 and eps[-1] == pytest.approx(cfg.epsilon_end)


def test_quick_main_writes_results(tmp_path):
    assert dqn.main(["--quick", "--seeds", "0", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "dqn_cartpole.json").read_text())
    assert res["env_steps_per_seed"] == 2_048 and res["seeds"] == [0]
    assert len(res["eval_returns_per_seed"][0]) == res["eval_episodes"] == 2
    assert all(1 <= r <= 500 for r in res["eval_returns_per_seed"][0])
    assert len(res["commit"]) == 40 and res["date"]
    md = (tmp_path / "dqn_cartpole.md").read_text()
    assert "eval mean return" in md and res["commit"][:10] in md
