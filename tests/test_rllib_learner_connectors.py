"""RLlib's own PPO learner connector pipeline on ``to_rllib(jaxsampler episodes)``.

The pipeline is the one a real ``PPOTorchLearner`` builds (``AddOneTsToEpisodesAndTruncate``,
``AddObservationsFromEpisodesToBatch``, ``AddColumnsFromEpisodesToTrainBatch``, time-dim /
state pieces, ``BatchIndividualItems``, ``NumpyToTensor``, ``GeneralAdvantageEstimation``
with the learner's real RLModule as the value function). Its train batch on converted
episodes must equal, column by column, the batch it builds from RLlib's own episodes,
replayed step by step from the same sampled data with ``add_env_reset`` / ``add_env_step``
/ ``cut`` / ``to_numpy`` the way RLlib's ``SingleAgentEnvRunner`` does.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

pytest.importorskip("ray.rllib", reason="the RLlib learner tests need ray[rllib] (the rllib extra)")
pytest.importorskip("torch", reason="RLlib's PPO learner needs torch (the rllib extra)")

import gymnasium as gym
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode as RlMultiAgentEpisode
from ray.rllib.env.single_agent_episode import SingleAgentEpisode as RlSingleAgentEpisode

import jaxsampler as js
from jaxsampler.rllib import to_rllib
from tests.test_rllib_convert import js_ma_state, same

HORIZON = 2


def build_ppo_learner(env_id, obs_space, act_space, multi_agent_ids=None):
    config = (
        PPOConfig()
        .environment(env_id if multi_agent_ids is None else None)
        .framework("torch")
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[8], head_fcnet_hiddens=[]))
        .training(gamma=0.9, lambda_=0.8)
    )
    module_id = "default_policy"
    if multi_agent_ids is not None:  # one shared module, not named "default_policy"
        module_id = "shared"
        config = config.multi_agent(policies={"shared"}, policy_mapping_fn=shared_module)
    return config.build_learner(spaces={module_id: (obs_space, act_space)})


def shared_module(agent_id, *args, **kwargs):
    return "shared"


def train_batch(learner, episodes):
    """The learner's connector pipeline on ``episodes``, as ``Learner.update`` runs it."""
    batch = learner._learner_connector(
        rl_module=learner.module,
        batch={},
        episodes=episodes,
        shared_data={},
        metrics=learner.metrics,
    )
    return {
        mid: {k: np.asarray(v.detach().cpu()) if hasattr(v, "detach") else v for k, v in cols.items()}
        for mid, cols in batch.items()
    }


def assert_same_batch(got, want, float_tol_keys=()):
    assert list(got) == list(want)
    for mid in got:
        assert sorted(got[mid]) == sorted(want[mid]), mid
        for k in got[mid]:
            g, w = got[mid][k], want[mid][k]
            if k in float_tol_keys:
                np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=k)
            else:
                same(g, w, f"{mid}/{k}")


# -------------------------------------------------------------------- single agent


def sa_sample(env_id, n_calls=2, num_envs=3, rollout_length=7, seed=0, max_steps=None):
    env = js.make(env_id)
    params = env.default_params
    if max_steps is not None:
        params = params.replace(max_steps_in_episode=max_steps)
    pol = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(4,))
    sampler = js.Sampler(
        env,
        pol,
        num_envs=num_envs,
        rollout_length=rollout_length,
        seed=seed,
        env_params=params,
        episode_lookback_horizon=HORIZON,
    )
    pparams = pol.init(jax.random.PRNGKey(seed))
    return env, [sampler.sample(pparams) for _ in range(n_calls)]


def rllib_replay(calls, obs_space, act_space):
    """RLlib's episodes for the same data: each chunk's own steps fed to RLlib's
    ``SingleAgentEpisode`` one by one; at each call's end, ongoing episodes are ``cut``
    (lookback ``HORIZON``) and every returned chunk is numpy'ized, as RLlib's runner does."""
    open_eps: dict[str, RlSingleAgentEpisode] = {}
    out = []
    for call in calls:
        returned = []
        for chunk in call:
            if chunk.t_started == 0:
                ep = RlSingleAgentEpisode(
                    chunk.id_, observation_space=obs_space, action_space=act_space
                )
                ep.add_env_reset(chunk.get_observations(0), chunk.get_infos(0))
            else:
                ep = open_eps.pop(chunk.id_)
            n = len(chunk)
            for i in range(n):
                last = i == n - 1
                ep.add_env_step(
                    chunk.get_observations(i + 1),
                    chunk.get_actions(i),
                    float(chunk.get_rewards(i)),
                    chunk.get_infos(i + 1),
                    terminated=last and chunk.is_terminated,
                    truncated=last and chunk.is_truncated,
                    extra_model_outputs={
                        k: chunk.get_extra_model_outputs(k, i) for k in chunk.extra_model_outputs
                    },
                )
            returned.append(ep)
        for ep in returned:
            if not ep.is_done:
                open_eps[ep.id_] = ep.cut(len_lookback_buffer=HORIZON)
            ep.to_numpy()
        out.append(returned)
    return out


@pytest.fixture(scope="module")
def cartpole():
    """CartPole chunks: terminated, truncated (14-step limit) and cut ones, over 3 calls."""
    env, calls = sa_sample("CartPole-v1", n_calls=3, max_steps=14, rollout_length=6, num_envs=4)
    flat = [e for c in calls for e in c]
    assert any(e.is_terminated for e in flat) and any(e.is_truncated for e in flat)
    assert any(not e.is_done for e in flat) and any(e.t_started > 0 for e in flat)
    obs_space, act_space = env.observation_space.to_gymnasium(), env.action_space.to_gymnasium()
    learner = build_ppo_learner("CartPole-v1", obs_space, act_space)
    return calls, obs_space, act_space, learner


def test_replayed_rllib_episodes_equal_the_converted_ones(cartpole):
    calls, obs_space, act_space, _ = cartpole
    for call, ref_call in zip(calls, rllib_replay(calls, obs_space, act_space)):
        for ours, ref in zip(to_rllib(call), ref_call):
            # RLlib's replay numpy'izes rewards to float64; the sampler keeps the env's
            # float32 (a documented deviation): compare values, then everything else.
            np.testing.assert_array_equal(ours.rewards.data, ref.rewards.data)
            assert ours.rewards.data.dtype == np.float32 and ref.rewards.data.dtype == np.float64
            ref.rewards.data = ref.rewards.data.astype(np.float32)
            for col in ("observations", "actions", "infos"):
                assert getattr(ours, col) == getattr(ref, col), col
            for k in ref.extra_model_outputs:
                same(ours.extra_model_outputs[k].data, ref.extra_model_outputs[k].data, k)
                assert ours.extra_model_outputs[k].lookback == ref.extra_model_outputs[k].lookback
            assert (ours.t_started, ours.t, ours.is_terminated, ours.is_truncated) == (
                ref.t_started,
                ref.t,
                ref.is_terminated,
                ref.is_truncated,
            )


def test_ppo_learner_pipeline_on_converted_episodes_equals_rllibs_own(cartpole):
    calls, obs_space, act_space, learner = cartpole
    refs = rllib_replay(calls, obs_space, act_space)
    for call, ref_call in zip(calls, refs):
        source_state = [e.get_state() for e in call]
        got = train_batch(learner, to_rllib(call))
        want = train_batch(learner, ref_call)
        cols = got["default_policy"]
        for k in ("obs", "actions", "rewards", "loss_mask", "advantages", "value_targets"):
            assert k in cols, k
        assert "action_logp" in cols and "vf_preds" in cols
        # Rewards: the sampler's float32 vs the replay's float64 (values equal); the
        # quantities computed from them (advantages, value targets) to float32 tolerance.
        assert got["default_policy"]["rewards"].dtype == np.float32
        np.testing.assert_array_equal(cols["rewards"], want["default_policy"]["rewards"])
        want["default_policy"]["rewards"] = cols["rewards"]
        assert_same_batch(got, want, float_tol_keys=("advantages", "value_targets"))
        # The pipeline changed the converted episodes (one extra step, ids), not ours.
        for ep, state in zip(call, source_state):
            same(ep.get_state(), state)


def test_ppo_pipeline_on_float32_rewards_is_exact(cartpole):
    """With rewards of the same dtype on both sides, every column is bit-identical."""
    calls, obs_space, act_space, learner = cartpole
    for call, ref_call in zip(calls, rllib_replay(calls, obs_space, act_space)):
        for ref in ref_call:
            ref.rewards.data = ref.rewards.data.astype(np.float32)
        assert_same_batch(train_batch(learner, to_rllib(call)), train_batch(learner, ref_call))


def test_continuous_actions_pipeline(cartpole):
    env, calls = sa_sample("Pendulum-v1", n_calls=2, rollout_length=5)
    obs_space, act_space = env.observation_space.to_gymnasium(), env.action_space.to_gymnasium()
    learner = build_ppo_learner("Pendulum-v1", obs_space, act_space)
    for call, ref_call in zip(calls, rllib_replay(calls, obs_space, act_space)):
        for ref in ref_call:
            ref.rewards.data = ref.rewards.data.astype(np.float32)
        assert_same_batch(train_batch(learner, to_rllib(call)), train_batch(learner, ref_call))


def test_unconverted_episodes_are_what_rllib_rejects(cartpole):
    """Why to_rllib exists: RLlib dispatches on its own classes."""
    calls, *_, learner = cartpole
    with pytest.raises(AttributeError, match="agent_ids"):
        train_batch(learner, list(calls[0]))
    assert not isinstance(calls[0][0], (RlSingleAgentEpisode, RlMultiAgentEpisode))
    _ = gym  # gymnasium spaces come from the conversion


# -------------------------------------------------------------------- multi agent


def test_multi_agent_ppo_pipeline_on_converted_goals_episodes():
    """Goals-v0 (every agent acts every step): RLlib's multi-agent pipeline runs on the
    converted chunks and yields one row per agent step (+1 bootstrap step per agent
    episode), each row's obs/action/reward/logp equal to the source agent episode's."""
    env = js.make("Goals-v0")
    mlp = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(4,))
    pol = js.MultiAgentPolicy(env, {"shared": mlp}, shared_module)
    sampler = js.Sampler(env, pol, num_envs=2, rollout_length=5, seed=0, episode_lookback_horizon=1)
    params = pol.init(jax.random.PRNGKey(0))
    obs_space, act_space = env.observation_space.to_gymnasium(), env.action_space.to_gymnasium()
    learner = build_ppo_learner(None, obs_space, act_space, multi_agent_ids=env.agent_ids)
    for _ in range(2):
        call = sampler.sample(params)
        before = [js_ma_state(e) for e in call]
        batch = train_batch(learner, to_rllib(call))["shared"]
        sa_eps = [sa for e in call for sa in e.agent_episodes.values()]
        n_rows = sum(len(sa) + 1 for sa in sa_eps)
        assert len(batch["obs"]) == n_rows and int(batch["loss_mask"].sum()) == sum(
            len(sa) for sa in sa_eps
        )
        mask = batch["loss_mask"].astype(bool)
        # RLlib iterates the episodes' agents in order; rows follow it.
        want_obs = np.concatenate([sa.get_observations(slice(0, len(sa))) for sa in sa_eps])
        want_act = np.concatenate([sa.get_actions() for sa in sa_eps])
        np.testing.assert_array_equal(np.sort(batch["obs"][mask], axis=0), np.sort(want_obs, axis=0))
        np.testing.assert_array_equal(np.sort(batch["actions"][mask], axis=0), np.sort(want_act, axis=0))
        for ep, state in zip(call, before):
            same(js_ma_state(ep), state)
