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
from jaxsampler.integrations.rllib import to_rllib
from tests.integrations.rllib.rl_compare import rl_ma_state, same
from tests.integrations.rllib.test_convert import js_ma_state

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
        mid: {
            k: np.asarray(v.detach().cpu()) if hasattr(v, "detach") else v for k, v in cols.items()
        }
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
    for call, ref_call in zip(calls, rllib_replay(calls, obs_space, act_space), strict=True):
        for ours, ref in zip(to_rllib(call), ref_call, strict=True):
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
    for call, ref_call in zip(calls, refs, strict=True):
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
        for ep, state in zip(call, source_state, strict=True):
            same(ep.get_state(), state)


def test_ppo_pipeline_on_float32_rewards_is_exact(cartpole):
    """With rewards of the same dtype on both sides, every column is bit-identical."""
    calls, obs_space, act_space, learner = cartpole
    for call, ref_call in zip(calls, rllib_replay(calls, obs_space, act_space), strict=True):
        for ref in ref_call:
            ref.rewards.data = ref.rewards.data.astype(np.float32)
        assert_same_batch(train_batch(learner, to_rllib(call)), train_batch(learner, ref_call))


def test_continuous_actions_pipeline(cartpole):
    env, calls = sa_sample("Pendulum-v1", n_calls=2, rollout_length=5)
    obs_space, act_space = env.observation_space.to_gymnasium(), env.action_space.to_gymnasium()
    learner = build_ppo_learner("Pendulum-v1", obs_space, act_space)
    for call, ref_call in zip(calls, rllib_replay(calls, obs_space, act_space), strict=True):
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


def rllib_ma_replay(calls, obs_spaces, act_spaces):
    """RLlib's ``MultiAgentEpisode`` s for the same data, as RLlib's ``MultiAgentEnvRunner``
    builds them: ``add_env_reset``, then one ``add_env_step`` per env step with the
    agents' observations, actions, rewards, extras and done flags (``__all__`` included);
    ongoing episodes ``cut`` at each call's end, every returned chunk numpy'ized. For envs
    whose agents act at every step (no hanging agents)."""
    open_eps: dict[str, RlMultiAgentEpisode] = {}
    out = []
    for call in calls:
        returned = []
        for chunk in call:
            if chunk.env_t_started == 0:
                ep = RlMultiAgentEpisode(
                    chunk.id_,
                    observation_space=obs_spaces,
                    action_space=act_spaces,
                    agent_to_module_mapping_fn=shared_module,
                )
                ep.add_env_reset(observations=chunk.get_observations(0), infos=chunk.get_infos(0))
            else:
                ep = open_eps.pop(chunk.id_)
            n = len(chunk)
            for i in range(n):
                obs = chunk.get_observations(i + 1)
                term, trunc = {}, {}
                for aid in obs:  # an agent's flags come with its last observation
                    sa = chunk.agent_episodes[aid]
                    last = chunk.env_t_to_agent_t[aid].get(i + 1) == sa.t
                    term[aid], trunc[aid] = last and sa.is_terminated, last and sa.is_truncated
                term["__all__"] = i == n - 1 and chunk.is_terminated
                trunc["__all__"] = i == n - 1 and chunk.is_truncated
                actions = chunk.get_actions(i)
                keys = list(next(iter(chunk.agent_episodes.values())).extra_model_outputs)
                extras = {
                    aid: {k: chunk.get_extra_model_outputs(k, i)[aid] for k in keys}
                    for aid in actions
                }
                ep.add_env_step(
                    observations=obs,
                    actions=actions,
                    rewards=chunk.get_rewards(i),
                    infos=chunk.get_infos(i + 1),
                    terminateds=term,
                    truncateds=trunc,
                    extra_model_outputs=extras,
                )
            for aid, sa in ep.agent_episodes.items():  # the sampler's ids (RLlib's are random)
                sa.id_ = chunk.agent_episodes[aid].id_
            returned.append(ep)
        for ep in returned:
            if not ep.is_done:
                open_eps[ep.id_] = ep.cut(len_lookback_buffer=HORIZON)
            ep.to_numpy()
        out.append(returned)
    return out


@pytest.mark.parametrize("env_id", ["Goals-v0", "Spread-v0"])
def test_multi_agent_ppo_pipeline_on_converted_episodes_equals_rllibs_own(env_id):
    """Agents that act at every step, episodes truncated (8-step limit) and cut across
    three calls: RLlib's multi-agent PPO pipeline gives the same train batch on converted
    chunks as on RLlib's replayed ones, and the chunks agree field by field."""
    env = js.make(env_id)
    mlp = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(4,))
    pol = js.policies.MultiAgentPolicy(env, {"shared": mlp}, shared_module)
    params = env.default_params.replace(max_steps_in_episode=8)
    sampler = js.Sampler(
        env,
        pol,
        num_envs=2,
        rollout_length=5,
        seed=0,
        env_params=params,
        episode_lookback_horizon=HORIZON,
    )
    pparams = pol.init(jax.random.PRNGKey(0))
    calls = [sampler.sample(pparams) for _ in range(3)]
    assert any(e.is_done for c in calls for e in c) and any(
        e.env_t_started > 0 for c in calls for e in c
    )
    obs_space, act_space = env.observation_space.to_gymnasium(), env.action_space.to_gymnasium()
    learner = build_ppo_learner(None, obs_space, act_space, multi_agent_ids=env.agent_ids)
    spaces = ({a: obs_space for a in env.agent_ids}, {a: act_space for a in env.agent_ids})
    for call, ref_call in zip(calls, rllib_ma_replay(calls, *spaces), strict=True):
        before = [js_ma_state(e) for e in call]
        ours = to_rllib(call)
        for o, r in zip(ours, ref_call, strict=True):
            align_all_flags(o, r)
            assert_ma_chunks_agree(o, r)
            for sa in r.agent_episodes.values():  # the sampler keeps float32 rewards
                sa.rewards.data = np.asarray(sa.rewards.data, np.float32)
        assert all(e.is_numpy for e in ours)  # every chunk, as RLlib's runner returns them
        assert_same_batch(train_batch(learner, ours), train_batch(learner, ref_call))
        for ep, state in zip(
            call, before, strict=True
        ):  # the pipeline changed the conversions only
            same(js_ma_state(ep), state)


def align_all_flags(ours, ref):
    """RLlib 2.60 ORs the episode's ``__all__`` flag into every agent still active; the
    sampler keeps each agent's own flag (a documented deviation; the sampler's
    ``rllib_compatible`` option reproduces RLlib's). Asserts that any difference is
    exactly that one, then gives the replay the sampler's agent flags."""
    for aid, r in ref.agent_episodes.items():
        o = ours.agent_episodes[aid]
        for flag, episode_flag in (
            ("is_terminated", ref.is_terminated),
            ("is_truncated", ref.is_truncated),
        ):
            if getattr(o, flag) != getattr(r, flag):
                assert getattr(r, flag) and episode_flag, (aid, flag)
                setattr(r, flag, getattr(o, flag))


def assert_ma_chunks_agree(ours, ref):
    """Field by field, up to what a replay cannot reproduce (timers, the mapping function
    object, the key order of RLlib's set-built dicts) and the list-vs-array mode of
    continuation chunks (compared by value here; see test_..._are_numpy_ized)."""
    a, b = rl_ma_state(ours), rl_ma_state(ref)
    for k in ("_start_time", "_last_step_time", "agent_to_module_mapping_fn"):
        a.pop(k), b.pop(k)
    for k in ("agent_t_started", "_agent_to_module_mapping"):
        x, y = a.pop(k), b.pop(k)
        same({i: x[i] for i in sorted(x)}, {i: y[i] for i in sorted(y)}, k)
    x, y = a.pop("env_t_to_agent_t"), b.pop("env_t_to_agent_t")
    assert sorted(x) == sorted(y)
    for aid in x:
        # RLlib's cut of a chunk shorter than the lookback horizon pads the env-step map's
        # lookback with a SKIP for the env step before the reset (['S', 0] <- lookback(2));
        # the sampler's map starts at the reset ([0] <- lookback(1)). Same steps otherwise.
        assert x[aid].get() == y[aid].get(), aid
        strip = lambda m: [v for v in m.data[: m.lookback] if v != "S"]
        assert strip(x[aid]) == strip(y[aid]), aid
    sa_a, sa_b = a.pop("agent_episodes"), b.pop("agent_episodes")
    same(a, b)
    assert list(sa_a) == list(sa_b)
    for aid in sa_a:
        x, y = dict(sa_a[aid]), dict(sa_b[aid])
        for k in ("_start_time", "_last_step_time"):
            x.pop(k), y.pop(k)
        for col in ("observations", "actions", "rewards", "infos"):
            cx, cy = x.pop(col), y.pop(col)
            assert (cx["lookback"], cx["space"]) == (cy["lookback"], cy["space"]), (aid, col)
            if col == "rewards":
                np.testing.assert_array_equal(np.asarray(cx["data"]), np.asarray(cy["data"]))
            elif col != "infos":
                same(np.asarray(cx["data"]), np.asarray(cy["data"]), f"{aid}/{col}")
        ex, ey = x.pop("extra_model_outputs"), y.pop("extra_model_outputs")
        assert list(ex) == list(ey)
        for k in ex:
            np.testing.assert_array_equal(np.asarray(ex[k]["data"]), np.asarray(ey[k]["data"]))
            assert ex[k]["lookback"] == ey[k]["lookback"]
        same(x, y, aid)


def test_multi_agent_continuation_chunks_are_numpy_ized():
    env = js.make("Goals-v0")
    mlp = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(4,))
    sampler = js.Sampler(env, mlp, num_envs=2, rollout_length=3, seed=0)
    pparams = mlp.init(jax.random.PRNGKey(0))
    chunks = [e for _ in range(2) for e in to_rllib(sampler.sample(pparams))]
    assert all(e.is_numpy for e in chunks)


def test_multi_agent_ppo_pipeline_runs_on_turn_based_chunks():
    """TicTacToe-v0 (agents alternate, so one of them always hangs at a cut)."""
    env = js.make("TicTacToe-v0")
    pol = js.policies.MultiAgentPolicy(
        env, {"shared": js.RandomPolicy(env.observation_space, env.action_space)}, shared_module
    )
    sampler = js.Sampler(env, pol, num_envs=3, rollout_length=3, seed=1, episode_lookback_horizon=1)
    obs_space, act_space = env.observation_space.to_gymnasium(), env.action_space.to_gymnasium()
    learner = build_ppo_learner(None, obs_space, act_space, multi_agent_ids=env.agent_ids)
    for _ in range(2):
        call = to_rllib(sampler.sample({"shared": ()}))
        # RLlib's is_numpy fails on a chunk without agents: check every agent episode
        assert all(sa.is_numpy for e in call for sa in e.agent_episodes.values())
        assert all(len(sa) > 0 for e in call for sa in e.agent_episodes.values())
        n_steps = sum(len(sa) for e in call for sa in e.agent_episodes.values())
        batch = train_batch(learner, call)["shared"]
        assert int(batch["loss_mask"].sum()) == n_steps
