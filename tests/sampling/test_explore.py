"""``Sampler(..., explore=False)``: greedy actions on device and host envs."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.envs.cartpole import CartPole
from jaxsampler.host_envs import HostEnv
from jaxsampler.host_envs.base import PollResult


class RandomObsHostEnv(HostEnv):
    """Two lockstep sub-envs with random CartPole-shaped observations; episodes of 5 steps."""

    agent_ids = ("agent_0",)
    num_envs = 2

    def __init__(self):
        env = CartPole()
        self.observation_space, self.action_space = env.observation_space, env.action_space
        self.rng = np.random.default_rng(0)
        self.t = {e: -1 for e in range(self.num_envs)}

    def poll(self, timeout=None):
        obs, rew, term, trunc = {}, {}, {}, {}
        for e in range(self.num_envs):
            o = self.rng.normal(size=4).astype(np.float32)
            obs[e] = {"agent_0": o}
            if self.t[e] >= 0:
                done = self.t[e] + 1 == 5
                rew[e] = {"agent_0": 1.0}
                term[e] = {"agent_0": done, "__all__": done}
                trunc[e] = {"agent_0": False, "__all__": False}
            self.t[e] = -1 if self.t[e] + 1 == 5 else self.t[e] + 1
        return PollResult(obs, rew, term, trunc, {}, {})

    def send_actions(self, actions):
        pass

    def reset(self):
        self.t = {e: -1 for e in range(self.num_envs)}


def _greedy_actions_match(batch) -> None:
    logits = np.asarray(batch["action_dist_inputs"])
    np.testing.assert_array_equal(np.asarray(batch["actions"]), logits.argmax(-1))


@pytest.mark.parametrize("where", ["device", "host"])
def test_explore_false_acts_by_argmax_of_the_recorded_logits(where):
    env = CartPole()
    pol = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    params = pol.init(jax.random.PRNGKey(0))
    target = env if where == "device" else RandomObsHostEnv()
    kw = {"num_envs": 4} if where == "device" else {}
    greedy = js.Sampler(target, pol, rollout_length=20, explore=False, **kw)
    assert greedy.explore is False
    batch = greedy.sample_batch(params)["default_policy"]
    assert len(batch) > 10
    _greedy_actions_match(batch)
    # The exploring sampler does not (with these logits some sampled action differs).
    target = env if where == "device" else RandomObsHostEnv()
    exploring = js.Sampler(target, pol, rollout_length=20, **kw)
    batch = exploring.sample_batch(params)["default_policy"]
    logits = np.asarray(batch["action_dist_inputs"])
    assert np.any(np.asarray(batch["actions"]) != logits.argmax(-1))


def test_explore_false_with_transforms_is_greedy_on_the_normalized_obs():
    from jaxsampler.transforms import NormalizeObservation

    env = CartPole()
    tf = (NormalizeObservation(),)
    pipe = js.rollout.pipeline_of(env, tf)
    pol = js.MLPPolicy(pipe.observation_space, pipe.action_space, hidden_sizes=(8,))
    params = pol.init(jax.random.PRNGKey(1))
    for target, kw in ((env, {"num_envs": 2}), (RandomObsHostEnv(), {})):
        s = js.Sampler(target, pol, rollout_length=15, explore=False, transforms=tf, **kw)
        _greedy_actions_match(s.sample_batch(params)["default_policy"])


@pytest.mark.parametrize("where", ["device", "host"])
def test_explore_false_refuses_a_policy_without_an_explore_switch(where):
    env = CartPole()
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    target = env if where == "device" else RandomObsHostEnv()
    with pytest.raises(TypeError, match="RandomPolicy has no explore switch"):
        js.Sampler(target, pol, explore=False)
    with pytest.raises(TypeError, match="explore must be a bool"):
        js.Sampler(target, pol, explore="no")
