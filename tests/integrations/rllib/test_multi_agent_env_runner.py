"""JaxMultiAgentEnvRunner against RLlib 2.60: MultiAgentEpisode chunks, each agent's
actions from the RLlib module it is mapped to, per-module weight sync without retracing,
one multi-agent PPO iteration (simultaneous and turn-based envs)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ray.rllib", reason="JaxMultiAgentEnvRunner needs ray[rllib] (the rllib extra)")
torch = pytest.importorskip("torch", reason="JaxMultiAgentEnvRunner needs torch (the rllib extra)")

from ray.rllib.algorithms.ppo import PPOConfig  # noqa: E402
from ray.rllib.core.columns import Columns  # noqa: E402
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig  # noqa: E402
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode  # noqa: E402

from jaxsampler.integrations.rllib import JaxMultiAgentEnvRunner  # noqa: E402

TOL = dict(rtol=1e-5, atol=1e-5)
MAPPING = {"agent_0": "p0", "agent_1": "p1", "agent_2": "p1"}


def config(env="Spread-v0", num_envs=3, fragment=8):
    return (
        PPOConfig()
        .environment(env)
        .multi_agent(
            policies={"p0", "p1"},
            policy_mapping_fn=lambda aid, episode, **kw: MAPPING[aid],
        )
        .env_runners(
            env_runner_cls=JaxMultiAgentEnvRunner,
            num_env_runners=0,
            num_envs_per_env_runner=num_envs,
            rollout_fragment_length=fragment,
        )
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[16]))
        .training(train_batch_size_per_learner=48, minibatch_size=24, num_epochs=1)
        .debugging(seed=0)
    )


@pytest.fixture(scope="module")
def runner():
    r = JaxMultiAgentEnvRunner(config=config())
    yield r
    r.stop()


def rllib_dist_inputs(module, obs):
    with torch.no_grad():
        out = module.forward_inference({Columns.OBS: torch.as_tensor(np.asarray(obs, np.float32))})
    return out[Columns.ACTION_DIST_INPUTS].numpy()


def check_agents_follow_their_modules(runner, episodes):
    for ep in episodes:
        for aid, sa in ep.agent_episodes.items():
            assert sa.module_id == MAPPING[aid] and len(sa) > 0 and sa.is_numpy
            obs = sa.get_observations(slice(0, len(sa)))
            logits = rllib_dist_inputs(runner.module[sa.module_id], obs)
            np.testing.assert_allclose(
                sa.get_extra_model_outputs("action_dist_inputs"), logits, **TOL
            )


def test_sample_returns_multi_agent_episodes_from_the_mapped_modules(runner):
    first = runner.sample(num_timesteps=24, force_reset=True)
    second = runner.sample(num_timesteps=24, explore=False)
    for episodes in (first, second):
        assert episodes and all(type(e) is MultiAgentEpisode for e in episodes)
        assert sum(len(e) for e in episodes) >= 24
        assert all(e.is_numpy for e in episodes)
        check_agents_follow_their_modules(runner, episodes)
    # greedy actions: argmax of the mapped module's logits
    for ep in second:
        for aid, sa in ep.agent_episodes.items():
            obs = sa.get_observations(slice(0, len(sa)))
            logits = rllib_dist_inputs(runner.module[MAPPING[aid]], obs)
            np.testing.assert_array_equal(sa.get_actions(), logits.argmax(-1))
    ongoing = {e.id_: e for e in first if not e.is_done}
    assert all(e.env_t_started == ongoing[e.id_].env_t for e in second if e.id_ in ongoing)
    metrics = runner.get_metrics()
    assert set(metrics["num_module_steps_sampled"]) == {"p0", "p1"}
    assert set(metrics["num_agent_steps_sampled"]) == set(MAPPING)


def test_weight_sync_per_module_without_retracing(runner):
    runner.sample(num_timesteps=3 * 8 + 1)  # a full chunk and a top-up: both compiled
    traces = runner.num_policy_traces
    state = runner.get_state()
    new = {k: np.asarray(v) * 2.5 for k, v in state["rl_module"]["p1"].items()}
    seq = state["weights_seq_no"] + 1
    runner.set_state({"rl_module": {"p1": new}, "weights_seq_no": seq})
    key = next(k for k in new if k.endswith("weight"))
    np.testing.assert_allclose(runner.get_state()["rl_module"]["p1"][key], new[key])
    episodes = runner.sample(num_timesteps=24)
    check_agents_follow_their_modules(runner, episodes)
    assert runner.num_policy_traces == traces


@pytest.mark.parametrize("env", ["Spread-v0", "TicTacToe-v0"])
def test_one_multi_agent_ppo_iteration(env):
    cfg = config(env, num_envs=4, fragment=12)
    if env == "TicTacToe-v0":
        cfg = cfg.multi_agent(
            policies={"p0", "p1"},
            policy_mapping_fn=lambda aid, episode, **kw: "p0" if aid == "agent_0" else "p1",
        )
    algo = cfg.build_algo()
    try:
        result = algo.train()
        assert result["env_runners"]["num_env_steps_sampled_lifetime"] >= 48
        learners = result["learners"]
        for mid in ("p0", "p1"):
            assert np.isfinite(learners[mid]["policy_loss"])
        assert algo.env_runner.get_state()["weights_seq_no"] >= 1
    finally:
        algo.stop()


def test_a_jaxmarl_suite_id_samples_as_the_native_env_does():
    """``"jaxmarl:MPE_simple_spread_v3"`` (a ``js.make`` suite id) is sampled like the
    native ``Spread-v0``: episodes of the three agents, each from its mapped module."""
    r = JaxMultiAgentEnvRunner(config=config("jaxmarl:MPE_simple_spread_v3"))
    try:
        episodes = r.sample(num_timesteps=24, force_reset=True)
        assert sum(len(e) for e in episodes) >= 24
        assert {a for e in episodes for a in e.agent_ids} == set(MAPPING)
        check_agents_follow_their_modules(r, episodes)
    finally:
        r.stop()


def test_rllib_compatible_train_batch_equals_rllibs_own_episodes_on_a_time_limit():
    """Spread ends by its time limit. The default runner (``rllib_compatible=True``) gives
    the train batch, value targets included, that RLlib's PPO learner pipeline builds from
    RLlib's own ``MultiAgentEpisode`` s replayed step by step with ``add_env_step`` (what
    RLlib's ``MultiAgentEnvRunner`` records) from the same data with the env's own flags;
    ``with_options(rllib_compatible=False)`` keeps those flags (agents truncated, not
    terminated), so GAE bootstraps there and the value targets differ."""
    from tests.integrations.rllib.test_learner_connectors import (
        build_ppo_learner,
        rllib_ma_replay,
        shared_module,
        train_batch,
    )

    def cfg(cls):
        return (
            config(fragment=26, num_envs=2)
            .multi_agent(policies={"shared"}, policy_mapping_fn=shared_module)
            .env_runners(env_runner_cls=cls)
        )

    keeps_flags = JaxMultiAgentEnvRunner.with_options(rllib_compatible=False)
    assert JaxMultiAgentEnvRunner.rllib_compatible and not keeps_flags.rllib_compatible
    with pytest.raises(TypeError, match="rllib_compatible must be a bool"):
        JaxMultiAgentEnvRunner.with_options(rllib_compatible="yes")
    from ray import cloudpickle  # how the class travels to Ray actors

    shipped = cloudpickle.loads(cloudpickle.dumps(keeps_flags))
    assert issubclass(shipped, JaxMultiAgentEnvRunner) and shipped.rllib_compatible is False
    compatible = JaxMultiAgentEnvRunner(config=cfg(JaxMultiAgentEnvRunner))
    own = keeps_flags(config=cfg(keeps_flags))
    try:
        own.set_state(compatible.get_state(components="rl_module"))
        ours = compatible.sample(num_timesteps=52, force_reset=True)
        env_flags = own.sample(num_timesteps=52, force_reset=True)
    finally:
        compatible.stop()
        own.stop()
    assert sum(e.is_truncated for e in ours) == 2  # both envs hit the 25-step limit
    obs_space, act_space = compatible._gym_obs_space, compatible._gym_act_space
    aids = compatible.agent_ids
    ref = rllib_ma_replay([env_flags], {a: obs_space for a in aids}, {a: act_space for a in aids})
    ref = ref[0]
    for ep in ref:  # (the sampler keeps float32 rewards)
        for sa in ep.agent_episodes.values():
            sa.rewards.data = np.asarray(sa.rewards.data, np.float32)
    learner = build_ppo_learner(None, obs_space, act_space, multi_agent_ids=aids)
    got, want, kept = (train_batch(learner, x)["shared"] for x in (ours, ref, env_flags))
    for k in want:
        if k != "weights_seq_no":
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    for ep, r in zip(ours, ref, strict=True):
        assert {a: (s.is_terminated, s.is_truncated) for a, s in ep.agent_episodes.items()} == {
            a: (s.is_terminated, s.is_truncated) for a, s in r.agent_episodes.items()
        }
    assert not np.allclose(kept["value_targets"], want["value_targets"], atol=1e-3)
    np.testing.assert_array_equal(kept["rewards"], want["rewards"])


def group_config(num_envs=4, fragment=12):
    """PPO on PredatorPrey-v0 (agent groups): a module per group, each built for its own
    spaces (predators: 4 observations, 5 actions; the prey: 6 and 9)."""
    return config("PredatorPrey-v0", num_envs=num_envs, fragment=fragment).multi_agent(
        policies={"predator", "prey"},
        policy_mapping_fn=lambda aid, episode, **kw: aid.rsplit("_", 1)[0],
    )


def test_agent_groups_give_each_module_its_own_spaces_and_train():
    algo = group_config().build_algo()
    try:
        runner = algo.env_runner
        spaces = runner.get_spaces()
        assert spaces["predator"][0].shape == (4,) and spaces["predator"][1].n == 5
        assert spaces["prey"][0].shape == (6,) and spaces["prey"][1].n == 9
        episodes = runner.sample(num_timesteps=48, force_reset=True)
        for ep in episodes:
            for aid, sa in ep.agent_episodes.items():
                group = aid.rsplit("_", 1)[0]
                assert sa.module_id == group
                assert sa.observation_space == spaces[group][0]
                obs = sa.get_observations(slice(0, len(sa)))
                assert obs.shape[1:] == spaces[group][0].shape
                # each agent's logits are its own module's on its own observations
                logits = rllib_dist_inputs(runner.module[group], obs)
                np.testing.assert_allclose(
                    sa.get_extra_model_outputs("action_dist_inputs"), logits, **TOL
                )
                assert np.all(np.asarray(sa.get_actions()) < spaces[group][1].n)
        # random actions: each group's drawn from its own space (not the carrier's 9)
        drawn: dict[str, set] = {"predator": set(), "prey": set()}
        for ep in runner.sample(num_timesteps=400, random_actions=True):
            for aid, sa in ep.agent_episodes.items():
                drawn[aid.rsplit("_", 1)[0]].update(np.asarray(sa.get_actions()).tolist())
        assert drawn == {"predator": set(range(5)), "prey": set(range(9))}
        result = algo.train()
        for mid in ("predator", "prey"):
            assert np.isfinite(result["learners"][mid]["policy_loss"])
    finally:
        algo.stop()


def test_a_module_mapped_across_agent_groups_is_refused():
    cfg = config("PredatorPrey-v0").multi_agent(
        policies={"p0", "p1"},
        policy_mapping_fn=lambda aid, episode, **kw: "p0" if aid != "predator_1" else "p1",
    )
    with pytest.raises(TypeError, match=r"module 'p0' is mapped to agents .* agent groups"):
        JaxMultiAgentEnvRunner(config=cfg)
