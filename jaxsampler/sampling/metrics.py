"""What every sampler call reports, and the argument checks the members share (a module
of its own so the converters and the collector need not import the sampler base)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxsampler.policies.greedy import greedy
from jaxsampler.rollout import distributed

__all__ = [
    "SamplerMetrics",
    "check_lookback",
    "check_positive_int",
    "check_sample_counts",
    "explain_policy_mismatch",
    "exploring_or_greedy",
]


@dataclasses.dataclass
class SamplerMetrics:
    """Per-``sample()`` statistics: what every training loop logs.

    ``episode_*`` statistics cover the episodes *completed* in the call (NaN if none);
    ``num_episodes_ongoing`` counts chunks of episodes still running. A sampler on a mesh
    that spans processes reports its own envs' statistics; :meth:`combine` /
    :meth:`reduce_over_processes` give those of all processes' envs.
    """

    num_env_steps_sampled: int = 0
    num_agent_steps_sampled: int = 0
    num_episodes_completed: int = 0
    num_episodes_ongoing: int = 0
    episode_return_mean: float = float("nan")
    episode_return_min: float = float("nan")
    episode_return_max: float = float("nan")
    episode_len_mean: float = float("nan")
    episode_len_min: float = float("nan")
    episode_len_max: float = float("nan")
    num_rollout_calls: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (what loggers write)."""
        return dataclasses.asdict(self)

    def set_episode_stats(self, returns: np.ndarray, lengths: np.ndarray) -> None:
        """Fills the ``episode_*`` fields from the completed episodes' returns and lengths."""
        self.num_episodes_completed = len(returns)
        if len(returns):
            self.episode_return_mean = float(np.mean(returns))
            self.episode_return_min = float(np.min(returns))
            self.episode_return_max = float(np.max(returns))
            self.episode_len_mean = float(np.mean(lengths))
            self.episode_len_min = float(np.min(lengths))
            self.episode_len_max = float(np.max(lengths))

    @classmethod
    def combine(cls, parts: Sequence[SamplerMetrics]) -> SamplerMetrics:
        """The statistics of the union of several samplers' calls (e.g. one per process):
        step, episode and chunk counts summed; means weighted by each part's completed
        episodes; minima / maxima over the parts that completed any (NaN if none did);
        ``num_rollout_calls`` the largest of the parts' (every process of one sampler
        makes the same calls).

        Raises:
            ValueError: no parts.
        """
        if not parts:
            raise ValueError("combine needs at least one SamplerMetrics")
        n = np.array([p.num_episodes_completed for p in parts], np.float64)
        out = cls(
            num_env_steps_sampled=sum(p.num_env_steps_sampled for p in parts),
            num_agent_steps_sampled=sum(p.num_agent_steps_sampled for p in parts),
            num_episodes_completed=int(n.sum()),
            num_episodes_ongoing=sum(p.num_episodes_ongoing for p in parts),
            num_rollout_calls=max(p.num_rollout_calls for p in parts),
        )
        some = n > 0
        if some.any():
            w = n[some] / n.sum()

            def values(name: str) -> np.ndarray:
                return np.array([getattr(p, name) for p in parts], np.float64)[some]

            for stat in ("return", "len"):
                setattr(out, f"episode_{stat}_mean", float(w @ values(f"episode_{stat}_mean")))
                setattr(out, f"episode_{stat}_min", float(values(f"episode_{stat}_min").min()))
                setattr(out, f"episode_{stat}_max", float(values(f"episode_{stat}_max").max()))
        return out

    def reduce_over_processes(self) -> SamplerMetrics:
        """:meth:`combine` of every process's metrics (after
        :func:`jaxsampler.rollout.distributed.initialize`), on every process; ``self``'s copy in a
        single process. A collective: every process must call it (e.g. after each
        ``sample()``), or the callers wait for the others.
        """
        fields = dataclasses.fields(self)
        # float64 values travel as pairs of uint32 words (exact, whatever jax_enable_x64 says).
        mine = np.array([float(getattr(self, f.name)) for f in fields], np.float64)
        every = np.asarray(distributed.process_allgather(mine.view(np.uint32)), np.uint32)
        parts = []
        for row in np.ascontiguousarray(every).view(np.float64):
            values: dict[str, Any] = {
                f.name: int(v) if f.type in ("int", int) else float(v)
                for f, v in zip(fields, row.tolist())
            }
            parts.append(type(self)(**values))
        return type(self).combine(parts)


def check_positive_int(name: str, value: Any) -> int:
    """Validates an int >= 1 argument (numpy ints count, bools do not) and returns it."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def check_sample_counts(num_timesteps: Any, num_episodes: Any) -> None:
    """Validates the ``num_timesteps`` / ``num_episodes`` arguments of ``sample()``."""
    if num_timesteps is not None and num_episodes is not None:
        raise ValueError("give num_timesteps or num_episodes, not both")
    for name, v in (("num_timesteps", num_timesteps), ("num_episodes", num_episodes)):
        if v is not None:
            check_positive_int(name, v)


def exploring_or_greedy(policy: Any, explore: Any) -> Any:
    """``policy`` itself (``explore=True``) or its greedy copy
    (:func:`jaxsampler.policies.greedy.greedy`, ``explore=False``).

    Raises:
        TypeError: ``explore`` is not a bool; a policy without an explore switch
            (greedy's message).
    """
    if not isinstance(explore, bool):
        raise TypeError(f"explore must be a bool, got {explore!r}")
    return policy if explore else greedy(policy)


def check_lookback(episode_lookback_horizon: Any) -> int:
    """Validates ``episode_lookback_horizon`` (an int >= 0) and returns it."""
    if (
        isinstance(episode_lookback_horizon, bool)
        or not isinstance(episode_lookback_horizon, (int, np.integer))
        or episode_lookback_horizon < 0
    ):
        raise ValueError(
            f"episode_lookback_horizon must be an int >= 0, got {episode_lookback_horizon!r}"
        )
    return int(episode_lookback_horizon)


def explain_policy_mismatch(exc: ValueError, transforms: Any) -> ValueError:
    """``exc`` (a policy that does not fit the env's spaces), with a hint where the
    sampler has transforms: the policy must be built for the spaces they hand on."""
    if transforms is None or (isinstance(transforms, (tuple, list)) and not transforms):
        return exc
    return ValueError(
        f"{exc}. With transforms=, build the policy for the spaces the transforms hand on: "
        "js.rollout.pipeline_of(env, transforms).observation_space and .action_space "
        "(for a host env: jaxsampler.transforms.build_pipeline(transforms, "
        "host_env.observation_space, host_env.action_space))"
    )
