"""Reward transforms: return-based scaling (``NormalizeReward``), constant scaling, clipping.

:class:`NormalizeReward` is the "reward scaling" of PPO implementations (Engstrom et al.
2020, "Implementation Matters in Deep Policy Gradients"; Gymnasium's ``NormalizeReward``;
Stable-Baselines3's ``VecNormalize``): each reward is divided by the running standard
deviation of a discounted return accumulator, not mean-centred, so the sign of every
reward is kept and value targets end up of order 1. :class:`ScaleReward` and
:class:`ClipReward` are stateless.

All three only change ``Observed.reward``; the rollout keeps the env's own rewards in
``Trajectory.raw_rewards`` (their ``changes_reward`` flag), so learning curves can report
raw returns while the learner trains on ``Trajectory.rewards``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxsampler.transforms.base import Context, Observed, Spaces, StageState, Transform
from jaxsampler.transforms.normalize import RunningMoments

__all__ = ["ClipReward", "NormalizeReward", "ScaleReward"]


def _number(owner: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{owner}: {name} must be a real number, got {value!r}")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{owner}: {name} must not be NaN")
    return value


@dataclasses.dataclass(frozen=True)
class NormalizeReward(Transform):
    """Divides rewards by the running standard deviation of a discounted return.

    ``reward -> clip(reward / sqrt(var + epsilon), -clip, clip)``, where ``var`` is the
    running (population) variance of the per-agent discounted returns ``G`` seen so far.

    **The return accumulator** (``rows``, one per env and agent) follows the agent's own
    transitions, the same ones a learner's GAE uses: a transition runs from an
    observation the agent acts on to its next recorded observation (``Observed.recorded``:
    one it acts on, or its final one), and its reward is the sum of the step rewards in
    between (rewards an agent receives while it waits, out of lockstep, count for the
    transition that is under way). At each step that ends a transition,
    ``G = gamma * G + transition reward``. In a single-agent env that is every step
    except the reset steps: ``G_t = gamma * G_{t-1} + r_t``.

    **Episode edges.** ``G`` restarts at 0 at each episode's first observation
    (``Observed.first``; its reward is 0 and ends no transition). At the step that ends
    the agent's episode (terminated *or* truncated) ``G`` includes the final reward, is
    counted, and is then cleared, so nothing of an ended episode leaks into the next one
    (not even into the rewards a done agent keeps getting while others play on). This
    differs on purpose from Gymnasium 1.x's wrapper, which decays by
    ``gamma * (1 - terminated)`` *before* adding the terminal reward (so that reward
    starts the next episode's return) and never restarts at truncation.

    **Statistics.** One :class:`~jaxsampler.transforms.RunningMoments` (scalar) over
    every env and agent, updated before normalizing, from the ``G`` of exactly the
    agents that end a transition at the step (recorded, not first: acting agents and
    newly done ones); with the env axis sharded the batch sums are ``psum``-reduced, so
    every device holds the global statistics. Before any update the variance is 1
    (rewards pass unscaled, except for clipping). Every reward of the step (waiting
    agents' too) is divided by the same, updated, standard deviation.

    Args:
        gamma: discount of the return accumulator, in ``[0, 1]`` (use the learner's).
        epsilon: added to the variance, ``>= 0``.
        clip: bound of the scaled rewards, ``> 0`` (``None``: no clipping).
        update: update the statistics (``False``: frozen, e.g. for evaluation; a frozen
            :class:`~jaxsampler.transforms.Context` freezes them too). The accumulators
            run on while frozen.

    State: ``shared = RunningMoments`` of ``G`` (shape ``()``); ``rows = float32[E, A]``,
    ``gamma * G`` at the agent's last transition plus the rewards received since.

    Raises:
        ValueError / TypeError: a parameter out of range or of the wrong type.
    """

    gamma: float = 0.99
    epsilon: float = 1e-8
    clip: float | None = 10.0
    update: bool = True

    changes_reward = True

    def __post_init__(self) -> None:
        gamma = _number("NormalizeReward", "gamma", self.gamma)
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"NormalizeReward: gamma must be in [0, 1], got {self.gamma!r}")
        if _number("NormalizeReward", "epsilon", self.epsilon) < 0.0:
            raise ValueError(f"NormalizeReward: epsilon must be >= 0, got {self.epsilon!r}")
        if self.clip is not None and not _number("NormalizeReward", "clip", self.clip) > 0.0:
            raise ValueError(
                f"NormalizeReward: clip must be > 0 (or None for no clipping), got {self.clip!r}"
            )
        if not isinstance(self.update, bool):
            raise TypeError(f"NormalizeReward: update must be a bool, got {self.update!r}")

    def init_shared(self, spaces: Spaces) -> RunningMoments:
        """Empty scalar :class:`~jaxsampler.transforms.RunningMoments` of the return ``G``."""
        return RunningMoments.zeros(())

    def init_rows(self, spaces: Spaces, batch_shape: tuple[int, ...]) -> jax.Array:
        """The return accumulators: ``float32[E, A]`` zeros."""
        return jnp.zeros(tuple(batch_shape), jnp.float32)

    def observe(
        self, spaces: Spaces, state: StageState, step: Observed, ctx: Context
    ) -> tuple[StageState, Observed]:
        """Advances the return accumulators, merges the returns of transitions that end here
        into the statistics (unless frozen), then scales and clips every reward (see the
        class docstring). Pure; jittable."""
        reward = step.reward.astype(jnp.float32)
        ret = jnp.where(step.first, 0.0, state.rows + reward)
        ends = step.recorded & ~step.first  # the agent's transition ends here
        moments: RunningMoments = state.shared
        if self.update and not ctx.frozen:
            moments = moments.merge(ret, ends, ctx.axis_name)
        scaled = reward / jnp.sqrt(moments.var + jnp.float32(self.epsilon))
        if self.clip is not None:
            scaled = jnp.clip(scaled, -self.clip, self.clip)
        done = step.terminated | step.truncated
        rows = jnp.where(done, 0.0, jnp.where(ends, jnp.float32(self.gamma) * ret, ret))
        step = dataclasses.replace(step, reward=scaled.astype(step.reward.dtype))
        return StageState(shared=moments, rows=rows), step


@dataclasses.dataclass(frozen=True)
class ScaleReward(Transform):
    """Multiplies every reward by a constant: ``reward -> scale * reward``. Stateless.

    Args:
        scale: a finite real number.

    Raises:
        ValueError / TypeError: ``scale`` is not a finite real number.
    """

    scale: float = 1.0

    changes_reward = True

    def __post_init__(self) -> None:
        if not math.isfinite(_number("ScaleReward", "scale", self.scale)):
            raise ValueError(f"ScaleReward: scale must be finite, got {self.scale!r}")

    def observe(
        self, spaces: Spaces, state: StageState, step: Observed, ctx: Context
    ) -> tuple[StageState, Observed]:
        """``step.reward`` times ``scale``, in the reward's dtype. Stateless; pure."""
        reward = step.reward * jnp.asarray(self.scale, step.reward.dtype)
        return state, dataclasses.replace(step, reward=reward)


@dataclasses.dataclass(frozen=True)
class ClipReward(Transform):
    """Clips rewards to ``[low, high]``, or (``sign=True``) maps them to their sign first.

    ``reward -> clip(reward, low, high)``; with ``sign=True``,
    ``reward -> clip(sign(reward), low, high)`` (the Atari "reward clipping" of DQN:
    -1, 0 or 1 with the default bounds). Stateless.

    Args:
        low: lower bound (``None``: unbounded below).
        high: upper bound (``None``: unbounded above); ``low <= high``.
        sign: replace each reward by its sign before clipping.

    Raises:
        ValueError / TypeError: a bound that is not a real number, ``low > high``.
    """

    low: float | None = -1.0
    high: float | None = 1.0
    sign: bool = False

    changes_reward = True

    def __post_init__(self) -> None:
        low = -math.inf if self.low is None else _number("ClipReward", "low", self.low)
        high = math.inf if self.high is None else _number("ClipReward", "high", self.high)
        if low > high:
            raise ValueError(
                f"ClipReward: low must be <= high, got low={self.low!r}, high={self.high!r}"
            )
        if not isinstance(self.sign, bool):
            raise TypeError(f"ClipReward: sign must be a bool, got {self.sign!r}")

    def observe(
        self, spaces: Spaces, state: StageState, step: Observed, ctx: Context
    ) -> tuple[StageState, Observed]:
        """``step.reward`` (or its sign, with ``sign=True``) clipped to ``[low, high]``, in the
        reward's dtype. Stateless; pure."""
        reward = jnp.sign(step.reward) if self.sign else step.reward
        if self.low is not None or self.high is not None:
            reward = jnp.clip(reward, self.low, self.high)
        return state, dataclasses.replace(step, reward=reward.astype(step.reward.dtype))
