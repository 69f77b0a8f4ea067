"""The sampler member of pure-JAX envs: whole jitted rollout chunks, converted on the host
in bulk (one package, so the converters never import the host member's feeds)."""

from jaxsampler.sampling.device.sampler import DeviceSampler

__all__ = ["DeviceSampler"]
