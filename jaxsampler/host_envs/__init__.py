"""Host-stepped envs: the :class:`HostEnv` protocol (``poll`` / ``send_actions``) and its
adapters for Gymnasium envs, Gymnasium vector envs, dict-API multi-agent envs and
external (simulator-driven) envs; what they do when a sub-env fails or hangs
(:mod:`jaxsampler.host_envs.failures`); which env objects are host-stepped
(:mod:`jaxsampler.host_envs.adapt`)."""

from jaxsampler.envs.registry import register_kind
from jaxsampler.host_envs.adapt import as_host_env, is_host_stepped
from jaxsampler.host_envs.base import HostEnv, MultiEnvDict, PollResult, agent_spaces
from jaxsampler.host_envs.external import (
    CapacityError,
    EnvClosedError,
    EpisodeStateError,
    ExternalEnv,
    ExternalEnvError,
    ExternalMultiAgentEnv,
    InvalidDataError,
    UnknownEpisodeError,
    WouldBlockError,
)
from jaxsampler.host_envs.failures import EnvFailureStats, HostEnvError
from jaxsampler.host_envs.gymnasium_envs import GymnasiumHostEnv, MultiAgentDictEnv, make_gym
from jaxsampler.host_envs.gymnasium_vector import GymnasiumVectorHostEnv

# js.make("gym:<id>") builds host-stepped Gymnasium envs; the registry (a lower row) learns
# the kind from here.
register_kind("gym", make_gym)

__all__ = [
    "CapacityError",
    "EnvClosedError",
    "EnvFailureStats",
    "EpisodeStateError",
    "ExternalEnv",
    "ExternalEnvError",
    "ExternalMultiAgentEnv",
    "GymnasiumHostEnv",
    "GymnasiumVectorHostEnv",
    "HostEnv",
    "HostEnvError",
    "InvalidDataError",
    "MultiAgentDictEnv",
    "MultiEnvDict",
    "PollResult",
    "UnknownEpisodeError",
    "WouldBlockError",
    "agent_spaces",
    "as_host_env",
    "is_host_stepped",
    "make_gym",
]
