"""An RLlib ``MultiAgentEnv`` whose agents have their own spaces, sampled on the host.

RLlib's own class declares the spaces (``observation_spaces`` / ``action_spaces`` and its
``get_observation_space(agent_id)``); the host sampler reads them per agent, and its
episodes convert to RLlib's ``MultiAgentEpisode`` with each agent's space and data intact.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

pytest.importorskip("ray.rllib", reason="needs RLlib (the rllib extra)")

from ray.rllib.env.multi_agent_env import MultiAgentEnv

from jaxsampler.host_envs import MultiAgentDictEnv
from jaxsampler.integrations.rllib import to_rllib
from jaxsampler.sampling import HostSampler
from tests.host_envs.test_own_spaces import AGENTS, Hunt, _policy, _spaces


class RllibHunt(Hunt, MultiAgentEnv):
    """:class:`Hunt` as an RLlib ``MultiAgentEnv`` (its spaces set as RLlib documents)."""

    def __init__(self, uid=0):
        MultiAgentEnv.__init__(self)
        Hunt.__init__(self, uid)
        self.agents = list(AGENTS)


def test_rllib_multi_agent_env_with_own_spaces_round_trips_to_rllib_episodes():
    envs = [RllibHunt(uid) for uid in range(2)]
    henv = MultiAgentDictEnv(envs, seed=1)
    (h_obs, h_act), (r_obs, r_act) = _spaces()
    assert henv.observation_spaces["runner"] == r_obs and henv.action_spaces["hunter_1"] == h_act
    policy = _policy(henv)
    sampler = HostSampler(henv, policy, rollout_length=8, seed=0)
    episodes = sampler.sample(policy.init(jax.random.PRNGKey(0)))
    sampler.close()
    assert episodes
    for ep in episodes:
        rl = to_rllib(ep)
        for a in AGENTS:
            ours, theirs = ep.agent_episodes[a], rl.agent_episodes[a]
            want_obs, want_act = (r_obs, r_act) if a == "runner" else (h_obs, h_act)
            assert theirs.observation_space.shape == want_obs.shape
            assert type(theirs.action_space).__name__ == ("Box" if a == "runner" else "Discrete")
            np.testing.assert_array_equal(theirs.get_observations(), ours.get_observations())
            np.testing.assert_array_equal(theirs.get_actions(), ours.get_actions())
            np.testing.assert_array_equal(theirs.get_rewards(), ours.get_rewards())
            assert theirs.get_observations().shape[1:] == want_obs.shape
