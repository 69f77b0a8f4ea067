"""Gymnasium's own vector envs through the same HostEnv interface and sampler."""

from __future__ import annotations

import functools

import gymnasium as gym
import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.host_envs.gymnasium_vector import GymnasiumVectorHostEnv


def policy_and_params():
    env = js.make("CartPole-v1")
    pol = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,), explore=False)
    return pol, pol.init(jax.random.PRNGKey(0))


def episodes_data(sampler, params, calls=3):
    out = []
    for _ in range(calls):
        for ep in sampler.sample(params):
            out.append(
                (
                    len(ep),
                    ep.is_terminated,
                    ep.is_truncated,
                    np.asarray(ep.get_observations()),
                    np.asarray(ep.get_actions()),
                    np.asarray(ep.get_rewards()),
                )
            )
    return out


def test_sync_vector_env_equals_the_list_of_envs():
    """A SyncVectorEnv (next-step autoreset) gives the same episodes as the same envs
    stepped one by one (GymnasiumHostEnv), with the same seeds and a greedy policy."""
    pol, params = policy_and_params()
    vec = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1", max_episode_steps=30)] * 3)
    a = js.Sampler(vec, pol, rollout_length=40, seed=7)
    assert type(a).__name__ == "HostSampler" and isinstance(a.host_env, GymnasiumVectorHostEnv)
    b = js.Sampler(
        [lambda: gym.make("CartPole-v1", max_episode_steps=30)] * 3, pol, rollout_length=40, seed=7
    )
    got, want = episodes_data(a, params), episodes_data(b, params)
    assert len(got) == len(want) and len(got) > 3
    assert any(w[2] for w in want)  # truncations happen (time limit 30)
    for g, w in zip(got, want, strict=True):
        assert g[:3] == w[:3]
        for x, y in zip(g[3:], w[3:], strict=True):
            np.testing.assert_array_equal(x, y)


def test_async_vector_env_runs_in_worker_processes():
    pol, params = policy_and_params()
    # "spawn": forking a process that runs JAX threads can deadlock.
    vec = gym.vector.AsyncVectorEnv(
        [functools.partial(gym.make, "CartPole-v1")] * 2, context="spawn"
    )
    try:
        s = js.Sampler(vec, pol, rollout_length=20, seed=0)
        batch = s.sample_batch(params)["default_policy"]
        assert batch.count == s.metrics.num_env_steps_sampled > 0
        np.testing.assert_array_equal(batch["rewards"], 1.0)  # CartPole
        same = batch["eps_id"][1:] == batch["eps_id"][:-1]  # consecutive rows of one episode
        np.testing.assert_array_equal(batch["new_obs"][:-1][same], batch["obs"][1:][same])
        assert same.sum() > 10
    finally:
        vec.close()


def test_other_autoreset_modes_are_refused():
    vec = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1")] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    with pytest.raises(ValueError, match="NEXT_STEP"):
        GymnasiumVectorHostEnv(vec)
