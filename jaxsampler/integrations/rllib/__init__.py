"""RLlib interop: RLlib's learners consume jaxsampler's data, and jaxsampler samples for RLlib.

Needs the ``rllib`` extra (``pip install -e ".[rllib]"``: ray[rllib] 2.60 and torch).

- :func:`to_rllib` / :func:`from_rllib`: exact conversions of ``SingleAgentEpisode``,
  ``MultiAgentEpisode``, ``SampleBatch`` and ``MultiAgentBatch`` (and lists of them) between
  jaxsampler's classes and RLlib's.
- :class:`JaxEnvRunner` / :class:`JaxMultiAgentEnvRunner`: RLlib ``EnvRunner`` classes backed by
  a jaxsampler ``Sampler``, for ``config.env_runners(env_runner_cls=JaxEnvRunner)``.

Importing this package is cheap; RLlib (several seconds to import) loads on first use of a
name.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> submodule that defines it
_EXPORTS = {
    "to_rllib": "convert",
    "from_rllib": "convert",
    "JaxEnvRunner": "env_runner",
    "JaxMultiAgentEnvRunner": "multi_agent_env_runner",
    "policy_from_rl_module": "module",
}

__all__ = sorted(_EXPORTS)


def require_rllib() -> None:
    """Raise a clear ``ImportError`` when RLlib or torch is missing."""
    try:
        import ray.rllib  # noqa: F401
        import torch  # noqa: F401
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "jaxsampler.integrations.rllib needs RLlib 2.60 and torch: pip install -e '.[rllib]' "
            f"(import failed: {err})"
        ) from err


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'jaxsampler.integrations.rllib' has no attribute {name!r}")
    require_rllib()
    return getattr(importlib.import_module(f"jaxsampler.integrations.rllib.{module}"), name)


def __dir__() -> list[str]:
    return __all__
