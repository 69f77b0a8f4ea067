"""RLlib's data model in numpy: lookback buffers, single- and multi-agent episodes, batches.

This layer imports nothing above :mod:`jaxsampler.spaces` and :mod:`jaxsampler.constants`:
it is usable on its own, e.g. to read offline logs without JAX.
"""

from jaxsampler.episodes.batch import MultiAgentBatch, SampleBatch, concat_samples
from jaxsampler.episodes.lookback import InfiniteLookbackBuffer
from jaxsampler.episodes.multi_agent import MultiAgentEnvError, MultiAgentEpisode
from jaxsampler.episodes.single_agent import SingleAgentEpisode

__all__ = [
    "InfiniteLookbackBuffer",
    "MultiAgentBatch",
    "MultiAgentEnvError",
    "MultiAgentEpisode",
    "SampleBatch",
    "SingleAgentEpisode",
    "concat_samples",
]
