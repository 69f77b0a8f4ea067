"""One small RLlib 2.60 DQN config on CartPole-v1, for ``JaxEnvRunner`` or RLlib's own runner.

The two runs differ only in ``env_runner_cls``. Sized to learn in a few thousand env steps
on two CPU cores: a 64-unit encoder and dueling heads, epsilon from 1.0 to 0.02 over the
first 2500 env steps, learning from step 500 on, four 32-transition updates per 32 sampled
steps (``training_intensity=4``), 500 env steps per iteration.
"""

from __future__ import annotations

from typing import Any

__all__ = ["dqn_config", "EPSILON"]

#: The epsilon schedule: ``[(timestep, epsilon), ...]``, linear in between.
EPSILON = [(0, 1.0), (2500, 0.02)]


def dqn_config(runner: str = "jax", *, seed: int = 0) -> Any:
    """The DQN config; ``runner`` is ``"jax"`` (``JaxEnvRunner``) or ``"rllib"``."""
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    from jaxsampler.integrations.rllib import JaxEnvRunner

    config = (
        DQNConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=4, rollout_fragment_length=8)
        .training(
            lr=1e-3,
            train_batch_size_per_learner=32,
            training_intensity=4,
            num_steps_sampled_before_learning_starts=500,
            target_network_update_freq=250,
            epsilon=EPSILON,
        )
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[64], head_fcnet_hiddens=[64]))
        .reporting(min_sample_timesteps_per_iteration=500, metrics_num_episodes_for_smoothing=20)
        .debugging(seed=seed)
    )
    if runner == "jax":
        config = config.env_runners(env_runner_cls=JaxEnvRunner)
    elif runner != "rllib":
        raise ValueError(f"runner must be 'jax' or 'rllib', got {runner!r}")
    return config
