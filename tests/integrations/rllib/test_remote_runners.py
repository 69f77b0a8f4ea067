"""The RLlib runners as Ray actors (``num_env_runners >= 1``, a local Ray cluster): PPO
trains with two remote ``JaxEnvRunner`` s and restores from a checkpoint, and a remote
runner's construction error reaches ``build_algo()`` with the runner's own message."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("ray.rllib", reason="the RLlib runners need ray[rllib] (the rllib extra)")
pytest.importorskip("torch", reason="the RLlib runners need torch (the rllib extra)")

import ray
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

from jaxsampler.integrations.rllib import JaxEnvRunner, JaxMultiAgentEnvRunner

pytestmark = pytest.mark.slow

#: the checkout these tests run from, for the actors' imports
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


@pytest.fixture(scope="module")
def local_ray():
    started = not ray.is_initialized()
    if started:
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            runtime_env={"env_vars": {"PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}},
        )
    yield
    if started:
        ray.shutdown()


def config(runner=JaxEnvRunner, env="CartPole-v1", num_env_runners=2, model=None):
    return (
        PPOConfig()
        .environment(env)
        .env_runners(
            env_runner_cls=runner,
            num_env_runners=num_env_runners,
            num_envs_per_env_runner=2,
            rollout_fragment_length=8,
            num_cpus_per_env_runner=0,
        )
        .rl_module(model_config=model or DefaultModelConfig(fcnet_hiddens=[8]))
        .training(train_batch_size_per_learner=32, minibatch_size=16, num_epochs=1)
        .debugging(seed=0)
    )


def module_weights(algo):
    state = algo.learner_group.get_state(components="learner")["learner"]["rl_module"]
    return {k: np.asarray(v) for k, v in state["default_policy"].items()}


def test_trains_with_two_remote_runners_and_restores_from_a_checkpoint(local_ray, tmp_path):
    algo = config().build_algo()
    try:
        kinds = algo.env_runner_group.foreach_env_runner(
            lambda r: type(r).__name__, local_env_runner=False
        )
        assert kinds == ["JaxEnvRunner", "JaxEnvRunner"]
        for _ in range(2):
            result = algo.train()
        assert result["env_runners"]["num_env_steps_sampled_lifetime"] >= 64
        assert np.isfinite(result["learners"]["default_policy"]["policy_loss"])
        # every remote runner got the learner's weights of the last update
        seqs = algo.env_runner_group.foreach_env_runner(
            lambda r: r.get_state()["weights_seq_no"], local_env_runner=False
        )
        assert len(seqs) == 2 and min(seqs) >= 1
        path = algo.save_to_path(str(tmp_path / "ckpt"))
        saved = module_weights(algo)
    finally:
        algo.stop()
    restored = Algorithm.from_checkpoint(path)
    try:
        got = module_weights(restored)
        assert saved.keys() == got.keys()
        for k in saved:
            np.testing.assert_array_equal(got[k], saved[k], err_msg=k)
        # the restored algorithm trains on: its remote runners sample and get the
        # learner's new weights after the update (RLlib syncs them after each update)
        assert np.isfinite(restored.train()["learners"]["default_policy"]["policy_loss"])
        learner_w = module_weights(restored)
        runner_w = restored.env_runner_group.foreach_env_runner(
            lambda r: {k: np.asarray(v) for k, v in r.module.get_state().items()},
            local_env_runner=False,
        )
        assert len(runner_w) == 2
        for w in runner_w:
            shared = [k for k in w if k in learner_w]
            assert shared
            for k in shared:
                np.testing.assert_array_equal(w[k], learner_w[k], err_msg=k)
    finally:
        restored.stop()


@pytest.mark.parametrize(
    "runner,env,model,match",
    [
        (JaxEnvRunner, "CartPole-v1", DefaultModelConfig(use_lstm=True), "policy_from_rl_module"),
        (JaxEnvRunner, "NoSuchEnv-v9", None, "unknown env id"),
        (JaxMultiAgentEnvRunner, "gym:CartPole-v1", None, "MultiAgentEnvRunner"),
    ],
)
def test_a_remote_runners_construction_error_is_raised_at_build_algo(
    local_ray, runner, env, model, match
):
    """What the runner raises when built in-process (num_env_runners=0) is what
    ``build_algo()`` raises with remote runners (RLlib alone: ``IndexError``)."""
    cfg = config(runner, env, num_env_runners=1, model=model)
    if runner is JaxMultiAgentEnvRunner:
        cfg = cfg.multi_agent(policies={"p"}, policy_mapping_fn=lambda aid, ep, **kw: "p")
    with pytest.raises(Exception) as local:
        runner(config=cfg.copy().env_runners(num_env_runners=0))
    with pytest.raises(type(local.value), match=match) as remote:
        cfg.build_algo()
    assert str(remote.value) == str(local.value)
