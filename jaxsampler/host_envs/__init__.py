"""Host-stepped envs: the :class:`HostEnv` protocol (``poll`` / ``send_actions``) and its
adapters for Gymnasium envs, Gymnasium vector envs, dict-API multi-agent envs and
external (simulator-driven) envs; what they do when a sub-env fails or hangs
(:mod:`jaxsampler.host_envs.failures`)."""

from jaxsampler.host_envs.base import HostEnv, MultiEnvDict, PollResult
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
from jaxsampler.host_envs.gymnasium_envs import GymnasiumHostEnv, MultiAgentDictEnv
from jaxsampler.host_envs.gymnasium_vector import GymnasiumVectorHostEnv

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
]
