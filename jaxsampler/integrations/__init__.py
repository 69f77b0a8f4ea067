"""The integrations row: jaxsampler inside other people's tools.

- :mod:`~jaxsampler.integrations.loggers`: JSON lines, TensorBoard and W&B loggers (sampler
  callbacks);
- :mod:`~jaxsampler.integrations.progress`: progress bars;
- :mod:`~jaxsampler.integrations.video`: :func:`record_video`, rendered episodes as MP4/GIF;
- :mod:`~jaxsampler.integrations.gymnasium`: :func:`to_gymnasium`, any single-agent env as a
  ``gymnasium.Env`` or ``gymnasium.vector.VectorEnv`` (Gymnasium loads on first call);
- :mod:`~jaxsampler.integrations.rllib`: ``to_rllib``, ``JaxEnvRunner`` (imported on demand:
  it needs the ``rllib`` extra).
"""

from jaxsampler.integrations import gymnasium, loggers, progress, video
from jaxsampler.integrations.gymnasium import to_gymnasium
from jaxsampler.integrations.video import record_video

__all__ = ["gymnasium", "loggers", "progress", "record_video", "to_gymnasium", "video"]
