"""One sampler family: ``js.Sampler(...)`` builds the member that fits the env, and every
member is a ``js.Sampler``."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.sampling import DeviceSampler, HostSampler


@pytest.fixture(scope="module")
def cartpole_policy():
    env = js.make("CartPole-v1")
    return js.RandomPolicy(env.observation_space, env.action_space)


def test_device_env_builds_a_device_sampler(cartpole_policy):
    s = js.Sampler("CartPole-v1", cartpole_policy, num_envs=2, rollout_length=4)
    assert type(s) is DeviceSampler and isinstance(s, js.Sampler)
    assert sum(len(e) for e in s.sample(None)) == s.metrics.num_env_steps_sampled > 0


def test_gym_id_builds_a_host_sampler_that_is_a_sampler(cartpole_policy):
    with js.Sampler("gym:CartPole-v1", cartpole_policy, num_envs=2, rollout_length=4) as s:
        assert type(s) is HostSampler and isinstance(s, js.Sampler)
        assert s.host_env.num_envs == 2
        episodes = s.sample(None)
        assert sum(len(e) for e in episodes) == s.metrics.num_env_steps_sampled == 8


def test_make_gym_id_gives_the_host_env_the_sampler_uses(cartpole_policy):
    """``js.make("gym:<id>")`` and ``js.Sampler("gym:<id>")`` build the same envs: same seed,
    same episodes."""
    host = js.make("gym:CartPole-v1", num_envs=2, seed=7)
    assert isinstance(host, js.host_envs.HostEnv)
    with (
        js.Sampler(host, cartpole_policy, rollout_length=6, seed=7) as a,
        js.Sampler("gym:CartPole-v1", cartpole_policy, num_envs=2, rollout_length=6, seed=7) as b,
    ):
        ea, eb = a.sample(None), b.sample(None)
        assert [e.id_ for e in ea] == [e.id_ for e in eb]
        for x, y in zip(ea, eb):
            np.testing.assert_array_equal(x.get_observations(), y.get_observations())
            np.testing.assert_array_equal(x.get_actions(), y.get_actions())


def test_constructing_a_member_directly_still_works(cartpole_policy):
    env = js.make("CartPole-v1")
    s = DeviceSampler(env, cartpole_policy, num_envs=3, rollout_length=2, seed=1)
    assert isinstance(s, js.Sampler) and s.num_envs == 3


def test_bad_arguments_name_the_problem(cartpole_policy):
    with pytest.raises(TypeError, match="Sampler"):
        js.Sampler()
    with pytest.raises(TypeError, match="Sampler"):
        js.Sampler("CartPole-v1", cartpole_policy, 1, 2, 3, 4)
    with pytest.raises(ValueError, match="env_params are for pure-JAX envs"):
        js.Sampler("gym:CartPole-v1", cartpole_policy, env_params=object())
    host = js.make("gym:CartPole-v1", num_envs=2)
    with pytest.raises(ValueError, match="num_envs=3 but the host env has 2 sub-envs"):
        js.Sampler(host, cartpole_policy, num_envs=3)
    host.close()


def test_a_member_must_implement_the_whole_interface():
    class Half(js.Sampler):
        def sample(self, params, num_timesteps=None, num_episodes=None, force_reset=False):
            return []

    with pytest.raises(TypeError, match="abstract"):
        Half()


def test_a_wrapped_gymnasium_vector_env_is_a_vector_env(cartpole_policy):
    gym = pytest.importorskip("gymnasium")
    from gymnasium.wrappers.vector import RecordEpisodeStatistics

    vec = RecordEpisodeStatistics(
        gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync")
    )
    with js.Sampler(vec, cartpole_policy, rollout_length=4) as s:
        assert s.host_env.num_envs == 3
        assert s.sample(None) and s.metrics.num_env_steps_sampled == 12


def test_envs_the_factory_made_are_closed_when_the_sampler_cannot_be_built(monkeypatch):
    """A failed construction leaves no sub-env open; an env the caller built stays theirs."""
    from jaxsampler.host_envs import GymnasiumHostEnv

    closed = []
    monkeypatch.setattr(GymnasiumHostEnv, "close", lambda self: closed.append(self))
    wrong = js.RandomPolicy(js.spaces.Box(-1, 1, (5,), np.float32), js.spaces.Discrete(2))
    with pytest.raises(ValueError, match="mismatched observation space"):
        js.Sampler("gym:CartPole-v1", wrong, num_envs=2)
    assert len(closed) == 1
    env = js.make("CartPole-v1")
    policy = js.RandomPolicy(env.observation_space, env.action_space)
    with pytest.raises(ValueError, match="env_params"):
        js.Sampler("gym:CartPole-v1", policy, env_params={"x": 1})
    assert len(closed) == 2
    mine = GymnasiumHostEnv("CartPole-v1", 2)
    with pytest.raises(ValueError, match="num_envs=3"):
        js.Sampler(mine, policy, num_envs=3)
    assert len(closed) == 2  # not closed: the caller made it


def test_lookback_accepts_numpy_ints(cartpole_policy):
    s = js.Sampler("CartPole-v1", cartpole_policy, 2, 4, episode_lookback_horizon=np.int64(2))
    assert s.sample(None)
    with pytest.raises(ValueError, match="episode_lookback_horizon must be an int >= 0"):
        js.Sampler("CartPole-v1", cartpole_policy, 2, 4, episode_lookback_horizon=-1)


def test_every_member_says_how_many_envs_it_steps(cartpole_policy):
    assert js.Sampler("CartPole-v1", cartpole_policy, num_envs=3).num_envs == 3
    with js.Sampler("gym:CartPole-v1", cartpole_policy, num_envs=2) as s:
        assert s.num_envs == 2


def test_sampled_multi_agent_episodes_pickle():
    """The samplers' static agent -> module mapping is a picklable object, not a lambda."""
    import pickle

    env = js.make("TicTacToe-v0")
    mlp = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    policy = js.policies.MultiAgentPolicy(
        env, {"x": mlp, "o": mlp}, policy_mapping_fn=lambda a: "x" if a == "agent_0" else "o"
    )
    params = policy.init(jax.random.PRNGKey(0))
    for ep in js.Sampler(env, policy, num_envs=2, rollout_length=12).sample(params):
        back = pickle.loads(pickle.dumps(ep))
        assert back.id_ == ep.id_ and back.module_for("agent_1") == "o"
        for aid, sa in ep.agent_episodes.items():
            np.testing.assert_array_equal(back.agent_episodes[aid].get_actions(), sa.get_actions())
