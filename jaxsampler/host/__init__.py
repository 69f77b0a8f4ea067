"""Host-side (numpy) objects: lookback buffers, episodes, batches, and the Sampler."""

from jaxsampler.host.lookback import InfiniteLookbackBuffer

__all__ = ["InfiniteLookbackBuffer"]
