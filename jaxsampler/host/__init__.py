"""Host-side (numpy) objects: lookback buffers, episodes, and the Sampler."""

from jaxsampler.host.episode import SingleAgentEpisode
from jaxsampler.host.lookback import InfiniteLookbackBuffer
from jaxsampler.host.multi_agent_episode import MultiAgentEpisode
from jaxsampler.host.sampler import Sampler, SamplerMetrics

__all__ = ["InfiniteLookbackBuffer", "MultiAgentEpisode", "SingleAgentEpisode", "Sampler", "SamplerMetrics"]
