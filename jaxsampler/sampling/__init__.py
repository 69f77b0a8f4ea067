"""The sampler family: :class:`Sampler`, the contract and the entry point, and its two
members, :class:`DeviceSampler` (pure-JAX envs) and :class:`HostSampler` (host-stepped
envs). Both members are imported here, so that each registers itself and the base never
imports either."""

from jaxsampler.sampling.actor import ActorSample, AsyncActor
from jaxsampler.sampling.base import Sampler
from jaxsampler.sampling.callbacks import SampleReport
from jaxsampler.sampling.device import DeviceSampler
from jaxsampler.sampling.host import HostSampler
from jaxsampler.sampling.host.collector import SampleCollector, episodes_to_batch
from jaxsampler.sampling.metrics import SamplerMetrics

__all__ = [
    "ActorSample",
    "AsyncActor",
    "DeviceSampler",
    "HostSampler",
    "SampleCollector",
    "SampleReport",
    "Sampler",
    "SamplerMetrics",
    "episodes_to_batch",
]
