"""The loops `jaxsampler bench` compares against: the hand-written vmap + scan rollout makes
jaxsampler's trajectory (so a timing ratio compares the same work), and the Gymnasium loop
counts actions as jaxsampler does (reset steps excluded)."""

import types

import jax
import numpy as np
import pytest

from jaxsampler.cli import bench
from jaxsampler.cli.baseline import GymLoop, hand_unsupported, make_gym_loop, make_hand_rollout
from jaxsampler.envs.registry import make_jax_env
from jaxsampler.policies import MLPPolicy, RandomPolicy
from jaxsampler.rollout import jit_rollout, make_rollout
from jaxsampler.spaces import Box, Dict, Discrete

E, T = 4, 40


@pytest.mark.parametrize(
    "env_id, policy",
    [
        ("CartPole-v1", "mlp"),
        ("CartPole-v1", "random"),
        ("Pendulum-v1", "mlp"),  # continuous actions: the Gaussian head and log_std
        ("Spread-v0", "mlp"),  # an agent axis of 3
    ],
)
def test_the_hand_written_rollout_makes_jaxsamplers_trajectory(env_id, policy):
    env = make_jax_env(env_id)
    if policy == "mlp":
        pol = MLPPolicy(env.observation_space, env.action_space, (8, 8))
    else:
        pol = RandomPolicy(env.observation_space, env.action_space)
    key = jax.random.PRNGKey(3)
    params = pol.init(key)
    ours = jit_rollout(make_rollout(env, pol, E, T))
    state = ours.init(jax.random.fold_in(key, 1))  # what measure_rollout does
    hand = make_hand_rollout(env, policy, E, T)
    assert hand_unsupported(env, policy) is None
    carry = hand.init(jax.random.fold_in(key, 1))
    resets = 0
    for _ in range(2):  # the second call continues both from their carried state
        state, traj = ours(params, state)
        carry, out = hand.run(params, carry)
        # Discrete choices and flags: identical. Floats: XLA fuses the two programs
        # differently (e.g. a multiply-add contracted in one), so an ulp may differ.
        for a, b in [
            (traj.actions, out.action),
            (traj.terminated, out.terminated),
            (traj.truncated, out.truncated),
        ]:
            assert np.asarray(a).dtype == np.asarray(b).dtype
            if np.issubdtype(np.asarray(a).dtype, np.floating):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
            else:
                np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(traj.obs[:T], out.obs, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(traj.obs[T], carry.obs, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(traj.rewards, out.reward, rtol=1e-5, atol=1e-6)
        if policy == "mlp":
            np.testing.assert_allclose(traj.extras["action_logp"], out.logp, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(traj.extras["vf_preds"], out.value, rtol=1e-5, atol=1e-5)
        resets += int(np.asarray(traj.is_reset).sum())
    if env_id == "CartPole-v1":  # episodes ended and restarted inside the compared data
        assert resets > 0


def test_hand_unsupported_names_what_it_cannot_run():
    fake = types.SimpleNamespace(
        observation_space=Dict(
            {"observations": Box(0.0, 1.0, (3,)), "action_mask": Box(0, 1, (2,), np.bool_)}
        ),
        action_space=Discrete(2),
    )
    assert "Box observations" in hand_unsupported(fake, "mlp")
    fake = types.SimpleNamespace(
        observation_space=Box(0.0, 1.0, (3,)), action_space=Box(0, 3, (2,), np.int32)
    )
    assert "Discrete or float Box actions" in hand_unsupported(fake, "mlp")
    assert hand_unsupported(fake, "random") is None


class _ScriptedVectorEnv:
    """A stand-in for a Gymnasium vector env: episode ends on a fixed schedule."""

    def __init__(self, ends):
        self.ends = [np.asarray(e, bool) for e in ends]
        self.t = 0

    def step(self, action):
        done = self.ends[self.t]
        self.t += 1
        zeros = np.zeros(done.shape)
        return zeros, zeros, done, np.zeros_like(done), {}


def test_the_gym_loop_does_not_count_the_reset_steps():
    # 2 envs, 4 steps: env 0 ends at step 0 (step 1 is its reset step), env 1 at step 2.
    ends = [[True, False], [False, False], [False, True], [False, False]]
    loop = GymLoop(_ScriptedVectorEnv(ends), 4, lambda obs: obs, np.zeros(2), np.zeros(2, bool))
    assert loop.call() == 8 - 2


def test_the_gym_loop_steps_gymnasium_with_the_mlp():
    env = make_jax_env("CartPole-v1")
    pol = MLPPolicy(env.observation_space, env.action_space, (8,))
    loop = make_gym_loop("CartPole-v1", 3, 50, env, "mlp", pol.init(jax.random.PRNGKey(0)), 0)
    try:
        acted = loop.call()
        assert loop.obs.shape == (3, 4)
        assert 0 < acted < 150  # an untrained policy ends episodes within 50 steps
    finally:
        loop.close()


def test_compare_rollout_times_every_loop_in_turn():
    row = bench.compare_rollout(
        "CartPole-v1", 2, 4, hidden_sizes=(8,), repeats=3, gym_id="CartPole-v1", gym_steps=4
    )
    assert len(row["times_s"]) == len(row["hand_times_s"]) == len(row["gym_times_s"]) == 3
    paired = sorted(h / j for h, j in zip(row["hand_times_s"], row["times_s"], strict=True))
    assert row["vs_hand_written"] == pytest.approx(paired[1])
    assert row["hand_compile_s"] > 0 and row["gym_steps_per_call"] == 4
    assert row["gym_actions_per_s"] > 0 and row["vs_sync_vector_env"] > 0
    alone = bench.compare_rollout(
        "CartPole-v1", 2, 4, hidden_sizes=(8,), repeats=1, hand_written=False
    )
    assert alone["vs_hand_written"] is None and alone["vs_sync_vector_env"] is None


def test_turn_based_envs_get_no_hand_written_ratio():
    """jaxsampler runs a turn-based env's policy on the mover's rows only; a plain
    vmap + scan loop runs every row, so a ratio would compare different work."""
    reason = hand_unsupported(make_jax_env("TicTacToe-v0"), "mlp")
    assert reason is not None and "max_acting=1" in reason
    assert hand_unsupported(make_jax_env("Spread-v0"), "mlp") is None
