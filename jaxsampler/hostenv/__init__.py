"""Host-stepped envs: the ``HostEnv`` interface, adapters, the collector and the host sampler."""

from jaxsampler.hostenv.base import ALL, HostEnv, MultiEnvDict, PollResult
from jaxsampler.hostenv.collector import SampleCollector, episodes_to_batch
from jaxsampler.hostenv.external import ExternalEnv, ExternalEnvError, ExternalMultiAgentEnv
from jaxsampler.hostenv.gym import GymnasiumVectorEnv, MultiAgentDictEnv
from jaxsampler.hostenv.gym_vector import GymnasiumVectorAdapter
from jaxsampler.hostenv.offline import read_batches, read_episodes, write_batches, write_episodes
from jaxsampler.hostenv.sampler import HostSampler
from jaxsampler.hostenv.client import PolicyClient
from jaxsampler.hostenv.server import PolicyServer, PolicyServerError

__all__ = [
    "ALL",
    "ExternalEnv",
    "ExternalEnvError",
    "ExternalMultiAgentEnv",
    "PolicyClient",
    "PolicyServer",
    "PolicyServerError",
    "read_batches",
    "read_episodes",
    "write_batches",
    "write_episodes",
    "GymnasiumVectorAdapter",
    "GymnasiumVectorEnv",
    "HostEnv",
    "HostSampler",
    "MultiAgentDictEnv",
    "MultiEnvDict",
    "PollResult",
    "SampleCollector",
    "episodes_to_batch",
]
