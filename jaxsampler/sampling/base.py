"""The sampler family: one base class, :class:`Sampler`, and what its members share.

``js.Sampler(env, policy, ...)`` is both the documented entry point and the base class:
called on the base it picks the member for the env it is given, once, at construction:

* a pure-JAX env (a :class:`~jaxsampler.envs.base.Env` or a registered id such as
  ``"CartPole-v1"`` / ``"gymnax:Acrobot-v1"``) -> :class:`~jaxsampler.sampling.device.DeviceSampler`
  (whole jitted rollout chunks);
* a host-stepped env (a :class:`~jaxsampler.host_envs.base.HostEnv`, a Gymnasium env or
  vector env, a list of Gymnasium envs or factories, or ``"gym:<id>"``) ->
  :class:`~jaxsampler.sampling.host.HostSampler` (env steps on the host, one jitted
  policy call per step).

Either way the result is an instance of :class:`Sampler`: ``sample()`` returns
numpy'ized episodes, ``sample_batch()`` a :class:`~jaxsampler.episodes.MultiAgentBatch`,
``metrics`` the last call's :class:`SamplerMetrics`, ``reset()`` restarts every env and
``close()`` releases the env.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import numpy as np

from jaxsampler.episodes import MultiAgentBatch, MultiAgentEpisode, SingleAgentEpisode
from jaxsampler.policies.greedy import greedy

__all__ = [
    "Sampler",
    "SamplerMetrics",
    "check_lookback",
    "exploring_or_greedy",
    "check_positive_int",
    "check_sample_counts",
    "explain_policy_mismatch",
]


@dataclasses.dataclass
class SamplerMetrics:
    """Per-``sample()`` statistics: what every training loop logs.

    ``episode_*`` statistics cover the episodes *completed* in the call (NaN if none);
    ``num_episodes_ongoing`` counts chunks of episodes still running.
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


class _PicksMember(abc.ABCMeta):
    """``Sampler(...)`` on the base class builds the family member that fits the env."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is Sampler:
            from jaxsampler.sampling.factory import build_sampler

            return build_sampler(args, kwargs)
        return super().__call__(*args, **kwargs)


class Sampler(metaclass=_PicksMember):
    """Samples episodes from an env with a policy (RLlib's ``EnvRunner`` role).

    ``Sampler(env, policy, num_envs=1, rollout_length=128, seed=0, *, env_params=None,
    episode_lookback_horizon=1, transforms=None, explore=True)`` returns a
    :class:`~jaxsampler.sampling.device.DeviceSampler` for a pure-JAX env (or a registered
    env id) and a :class:`~jaxsampler.sampling.host.HostSampler` for a host-stepped one
    (a ``HostEnv``, a Gymnasium env, vector env or list of envs / factories, or
    ``"gym:<id>"``); both are instances of ``Sampler``.

    Args:
        env: a jaxsampler env, a registered env id (``js.make``), or a host-stepped env.
        policy: the policy (``(params, obs, key, state) -> (action, extras, state)``).
        num_envs: envs stepped side by side (the env axis; for ``"gym:<id>"`` the number
            of Gymnasium envs).
        rollout_length: steps per rollout call (device) or polls per call (host).
        seed: PRNG seed; the same seed and calls give identical episodes.
        env_params: env params of a pure-JAX env (default ``env.default_params``).
        episode_lookback_horizon: lookback steps carried into continuation chunks.
        transforms: env->policy / policy->env transforms (:mod:`jaxsampler.transforms`,
            env side first), the same semantics on both members. The policy must be
            built for ``js.rollout.pipeline_of(env, transforms).observation_space`` /
            ``.action_space``. Episodes and batches hold what the policy saw
            (transformed observations and rewards, policy-side actions); :attr:`metrics`
            report the env's own returns (raw rewards).
        explore: ``False``: the policy acts greedily (argmax / mean; see
            :func:`jaxsampler.policies.greedy.greedy`), e.g. for evaluation.

    Attributes:
        metrics: the :class:`SamplerMetrics` of the last ``sample()`` / ``sample_batch()``.
    """

    metrics: SamplerMetrics

    @abc.abstractmethod
    def sample(
        self,
        params: Any,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        force_reset: bool = False,
    ) -> list[SingleAgentEpisode] | list[MultiAgentEpisode]:
        """Samples and returns numpy'ized episodes: finished ones, then ongoing chunks.

        Args:
            params: policy params.
            num_timesteps: sample until at least this many env steps.
            num_episodes: reset, then sample until this many episodes finished.
            force_reset: reset all envs first (ongoing episodes are discarded).
        """

    @abc.abstractmethod
    def sample_batch(
        self,
        params: Any,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        force_reset: bool = False,
    ) -> MultiAgentBatch:
        """Like :meth:`sample`, but returns a ``MultiAgentBatch`` (policy id -> ``SampleBatch``)."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Resets every env; ongoing episodes are discarded."""

    def close(self) -> None:
        """Releases the env's resources (threads, processes, sockets). Idempotent."""

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
