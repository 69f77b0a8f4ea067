"""The sampler family: :class:`Sampler` (the base, and the factory that picks a member),
:class:`DeviceSampler` for pure-JAX envs, :class:`HostSampler` for host-stepped envs,
their :class:`SamplerMetrics`, and the :class:`SampleCollector` that builds episodes from
host env steps."""

from jaxsampler.sampling.base import Sampler
from jaxsampler.sampling.callbacks import SampleReport
from jaxsampler.sampling.device import DeviceSampler
from jaxsampler.sampling.host import HostSampler
from jaxsampler.sampling.host.collector import SampleCollector, episodes_to_batch
from jaxsampler.sampling.metrics import SamplerMetrics

__all__ = [
    "DeviceSampler",
    "HostSampler",
    "SampleCollector",
    "SampleReport",
    "Sampler",
    "SamplerMetrics",
    "episodes_to_batch",
]
