"""jaxsampler's example trainers, a package run from the repository root.

Each example is a module: ``python -m examples.ppo --env CartPole-v1``. They import each
other as modules (``from examples import ppo``): the PPO pieces of :mod:`examples.ppo`,
the host-side learner of :mod:`examples.ppo_host`.
"""
