"""Policies: the protocol, a random policy, Flax actor-critic MLP, CNN and GRU policies."""

from jaxsampler.policies.base import NoState, Policy, RandomPolicy, batch_dims
from jaxsampler.policies.cnn import ActorCriticCNN, CNNPolicy
from jaxsampler.policies.greedy import greedy
from jaxsampler.policies.mlp import ActorCriticMLP, MLPPolicy, RecurrentPolicy, log_prob
from jaxsampler.policies.multi import MultiAgentPolicy

__all__ = [
    "greedy",
    "Policy",
    "NoState",
    "RandomPolicy",
    "MLPPolicy",
    "CNNPolicy",
    "ActorCriticCNN",
    "MultiAgentPolicy",
    "RecurrentPolicy",
    "ActorCriticMLP",
    "batch_dims",
    "log_prob",
]
