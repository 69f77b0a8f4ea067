"""Policies: the protocol, a random policy, Flax actor-critic MLP, CNN and GRU policies,
multi-agent mapping (policies per agent group) and a self-play opponent pool."""

from jaxsampler.policies.base import NoState, Policy, RandomPolicy, batch_dims
from jaxsampler.policies.cnn import ActorCriticCNN, CNNPolicy
from jaxsampler.policies.greedy import greedy
from jaxsampler.policies.groups import unpad_extra
from jaxsampler.policies.mlp import ActorCriticMLP, MLPPolicy, RecurrentPolicy, log_prob
from jaxsampler.policies.multi import MultiAgentPolicy, random_policy
from jaxsampler.policies.pool import OpponentPool

__all__ = [
    "greedy",
    "Policy",
    "NoState",
    "RandomPolicy",
    "MLPPolicy",
    "CNNPolicy",
    "ActorCriticCNN",
    "MultiAgentPolicy",
    "random_policy",
    "unpad_extra",
    "OpponentPool",
    "RecurrentPolicy",
    "ActorCriticMLP",
    "batch_dims",
    "log_prob",
]
