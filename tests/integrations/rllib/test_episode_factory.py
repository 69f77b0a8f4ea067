"""The runner's fast path: RLlib episodes built straight from a device sampler's columns
(``DeviceSampler(episode_factory=rllib_episodes)``) equal, field by field and by
``get_state()``, ``to_rllib`` of the sampler's own episodes for the same seed and calls."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("ray.rllib", reason="the RLlib conversions need ray[rllib] (the rllib extra)")
pytest.importorskip("torch", reason="jaxsampler.integrations.rllib needs torch (the rllib extra)")

from ray.rllib.env.single_agent_episode import SingleAgentEpisode as RlSingleAgentEpisode

import jaxsampler as js
from jaxsampler.integrations.rllib import to_rllib
from jaxsampler.integrations.rllib.convert import rllib_episodes
from jaxsampler.sampling.device import DeviceSampler
from tests.fakes import FakeEnv
from tests.integrations.rllib.test_convert import assert_rl_sa_equal


@dataclasses.dataclass(frozen=True)
class InfoEnv(FakeEnv):
    """FakeEnv with a nested info per step (the infos path of the converters)."""

    def step_env(self, key, state, action, params):
        obs, state, reward, terminated, _ = super().step_env(key, state, action, params)
        return obs, state, reward, terminated, {"t": state.time + 1, "x": {"a": obs[0] * 2}}

    def reset_info(self, params):
        return {"t": jnp.zeros((), jnp.int32), "x": {"a": jnp.zeros((), jnp.float32)}}


def _samplers(env, horizon, seed, topup):
    pol = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(4,))
    params = pol.init(jax.random.PRNGKey(seed))
    kw = dict(
        num_envs=3,
        rollout_length=7,
        seed=seed,
        episode_lookback_horizon=horizon,
        topup_length=topup,
    )
    return (
        DeviceSampler(env, pol, **kw),
        DeviceSampler(env, pol, episode_factory=rllib_episodes, **kw),
        params,
    )


CALLS = (
    dict(),
    dict(num_timesteps=25),
    dict(),
    dict(num_episodes=4),
    dict(num_timesteps=5, force_reset=True),
    dict(),
)


@pytest.mark.parametrize(
    "env, horizon, topup",
    [
        (js.make("CartPole-v1"), 2, None),
        (js.make("Pendulum-v1"), 1, 3),
        (InfoEnv(), 3, 2),
    ],
    ids=["CartPole", "Pendulum-topup", "infos"],
)
def test_factory_episodes_equal_to_rllib_of_sampler_episodes(env, horizon, topup):
    ref, fast, params = _samplers(env, horizon, seed=3, topup=topup)
    seen_continuation = seen_done = False
    for kwargs in CALLS:
        expected = to_rllib(ref.sample(params, **kwargs))
        got = fast.sample(params, **kwargs)
        assert len(got) == len(expected) > 0
        np.testing.assert_equal(fast.metrics.as_dict(), ref.metrics.as_dict())
        for a, b in zip(got, expected, strict=True):
            assert type(a) is RlSingleAgentEpisode
            assert_rl_sa_equal(a, b)
            for slot in RlSingleAgentEpisode.__slots__:  # every slot, not only the state
                x, y = getattr(a, slot), getattr(b, slot)
                if slot == "extra_model_outputs":
                    assert list(x) == list(y) and all(x[k] == y[k] for k in x)
                else:
                    assert x == y, slot
            seen_continuation |= a.t_started > 0 and a.observations.lookback > 0
            seen_done |= a.is_done
    assert seen_continuation and seen_done


def test_factory_infos():
    """No env infos: one separate empty dict per observation; env infos: the info pytree
    with numpy leaves over the observation slots, the reset info first."""
    _, fast, params = _samplers(js.make("CartPole-v1"), 1, seed=0, topup=None)
    infos = fast.sample(params)[0].get_infos()
    assert isinstance(infos, list) and infos and all(i == {} for i in infos)
    infos[0]["note"] = 1
    assert "note" not in infos[1]
    _, fast, params = _samplers(InfoEnv(), 1, seed=0, topup=None)
    ep = fast.sample(params)[0]
    infos = ep.get_infos()
    assert set(infos) == {"t", "x"} and ep.t_started == 0
    np.testing.assert_array_equal(infos["t"], np.arange(len(ep) + 1))
    np.testing.assert_array_equal(infos["x"]["a"], 2 * ep.get_observations()[:, 0][: len(ep) + 1])


def test_episode_factory_is_single_agent_only():
    env = js.make("Spread-v0")
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    with pytest.raises(ValueError, match="single-agent"):
        DeviceSampler(env, pol, episode_factory=rllib_episodes)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_topup_length_raises(bad):
    env = js.make("CartPole-v1")
    pol = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(4,))
    with pytest.raises(ValueError, match="topup_length"):
        DeviceSampler(env, pol, topup_length=bad)


def test_topup_chunks_follow_the_first_full_chunk():
    env = js.make("CartPole-v1")
    pol = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(4,))
    params = pol.init(jax.random.PRNGKey(0))
    s = DeviceSampler(env, pol, num_envs=2, rollout_length=8, topup_length=3)
    s.sample(params, num_timesteps=16 + 1)  # one chunk of 8 per env is short (resets too)
    assert s.metrics.num_rollout_calls >= 2
    steps = s.metrics.num_env_steps_sampled
    # one 8-step chunk, then 3-step chunks: at most one top-up past the count
    assert 17 <= steps <= 2 * 8 + 2 * 3 * (s.metrics.num_rollout_calls - 1)
    assert steps - 17 < 2 * 3
    rollout_s, convert_s = s.last_split
    assert rollout_s > 0 and convert_s > 0


def test_dict_observations_match_the_samplers_own_episodes():
    """A Dict observation (PrevActionsRewards' output) reaches RLlib's episodes leaf by
    leaf, equal to the sampler's own episodes, across a continuation."""
    from jaxsampler.transforms import PrevActionsRewards

    env = js.make("CartPole-v1")
    tf = (PrevActionsRewards(2),)
    pipe = js.rollout.pipeline_of(env, tf)
    policy = js.RandomPolicy(pipe.observation_space, pipe.action_space)
    fast = js.Sampler(env, policy, 3, 20, transforms=tf, episode_factory=rllib_episodes)
    own = js.Sampler(env, policy, 3, 20, transforms=tf)
    for _ in range(2):
        got, want = fast.sample(None), own.sample(None)
        assert len(got) == len(want) and isinstance(got[0], RlSingleAgentEpisode)
        for g, w in zip(got, want, strict=True):
            assert g.id_ == w.id_
            go, wo = g.get_observations(), w.get_observations()
            assert sorted(go) == sorted(wo) == ["observations", "prev_actions", "prev_rewards"]
            for k in wo:
                np.testing.assert_array_equal(go[k], wo[k])
