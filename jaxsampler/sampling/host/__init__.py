"""The sampler member of host-stepped envs: env steps on the host, one jitted policy call
per step, and the feeds that turn polls into episodes."""

from jaxsampler.sampling.host.collector import SampleCollector, episodes_to_batch
from jaxsampler.sampling.host.sampler import HostSampler, abandons_episodes

__all__ = ["HostSampler", "SampleCollector", "abandons_episodes", "episodes_to_batch"]
