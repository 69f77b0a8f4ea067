"""Device-side containers (all frozen ``flax.struct`` dataclasses).

Axis conventions, fixed everywhere in the library:

* one env:      ``[A, ...]``         (agent axis always present; A = 1 for single-agent)
* vector state: ``[E, A, ...]``      (env axis, then agent axis)
* buffers:      ``[T, E, A, ...]``   time-major, as ``lax.scan`` produces them;
  observations have ``T + 1`` time slots, everything else ``T``.

Auto-reset contract ("next-step" reset, declared in :data:`AUTORESET_MODE`): when an
episode ends at step ``t`` (every agent terminated or truncated), ``obs[t + 1]`` holds
its real final observation. Step ``t + 1`` is then a *reset step*: the env is reset,
nobody acts (``acting`` is False for every agent, ``is_reset`` is True), reward is 0,
and ``obs[t + 2]`` is the new episode's first observation. So every episode is one
contiguous slice of the single observation track and nothing is ever overwritten.
"""

from __future__ import annotations

from typing import Any

import jax
from flax import struct

__all__ = [
    "AUTORESET_MODE",
    "NoInfo",
    "TimeStep",
    "RolloutState",
    "Trajectory",
    "PyTree",
    "FlagsA",
    "RewardA",
    "FlagsE",
    "CountE",
    "FlagsEA",
    "FlagsTE",
    "FlagsTEA",
    "RewardTEA",
    "Scalar",
]

#: The auto-reset contract of every jaxsampler rollout (see the module docstring).
AUTORESET_MODE = "next_step"

# Shape-annotated aliases (plain ``jax.Array``; the comment is the shape and dtype):
# ``T`` time, ``E`` env, ``A`` agent. Pytree fields (observations, actions, extras,
# infos, env and policy state) stay ``PyTree``; their leaves' leading axes are given
# in each field's docstring.
PyTree = Any
FlagsA = jax.Array  # bool[A]: one env's per-agent flags
RewardA = jax.Array  # float32[A]
FlagsE = jax.Array  # bool[E]
CountE = jax.Array  # int32[E]
FlagsEA = jax.Array  # bool[E, A]
FlagsTE = jax.Array  # bool[T, E]
FlagsTEA = jax.Array  # bool[T, E, A]
RewardTEA = jax.Array  # float32[T, E, A]
Scalar = jax.Array  # a rank-0 array (int32 counters, float32 rewards)


@struct.dataclass
class NoInfo:
    """The empty ``info`` of envs that report nothing extra (a pytree with no leaves)."""


@struct.dataclass
class TimeStep:
    """What one env returns from ``reset`` and ``step``; every leaf has a leading agent axis.

    Attributes:
        obs: observation pytree, leaves ``[A, *obs_shape]``.
        reward: ``float32[A]``, reward for the transition that produced this step
            (0 after a reset).
        terminated: ``bool[A]``, the agent reached a terminal state of the MDP.
        truncated: ``bool[A]``, the agent's episode was cut short (time limit etc.).
            Never merged with ``terminated``; both may be True together.
        acting: ``bool[A]``, which agents must send an action at the next step.
        info: env-specific pytree with a fixed structure (the same after reset and step).
    """

    obs: PyTree
    reward: RewardA
    terminated: FlagsA
    truncated: FlagsA
    acting: FlagsA
    info: PyTree = struct.field(default_factory=NoInfo)


@struct.dataclass
class RolloutState:
    """Everything a rollout carries from one call to the next (shapes ``[E, ...]``).

    Attributes:
        env_state: the vectorized env state pytree, leaves ``[E, ...]``.
        obs: current observation, leaves ``[E, A, ...]`` (the next policy input).
        acting: ``bool[E, A]``, agents that act at the next step.
        needs_reset: ``bool[E]``, the episode in this env ended; the next step resets it.
        episode_count: ``int32[E]``, index of the current episode within its env
            (0, 1, 2, ...). ``(env index, episode_count)`` identifies an episode.
        episode_step: ``int32[E]``, env steps taken in the current episode.
        policy_state: the policy's recurrent state, leaves ``[E, A, ...]``.
        key: the PRNG key the next call splits from.
        num_steps: ``int32[]``, env steps taken since :func:`init_rollout_state`
            (reset steps included), modulo 2**31.
        env_params: the env's params (a traced pytree: changing them never recompiles).
            Each leaf is either shared by every env (the shape of the env's
            ``default_params`` leaf) or per env (a leading ``[E]`` axis).
        transform_state: the state of the rollout's transforms
            (:class:`jaxsampler.transforms.TransformState`: running statistics, frame
            stacks, ...); ``None`` without transforms.
        raw_obs: the env's own observation behind ``obs`` (leaves ``[E, A, ...]``) when a
            transform changes observations; ``None`` otherwise.
    """

    env_state: PyTree
    obs: PyTree
    acting: FlagsEA
    needs_reset: FlagsE
    episode_count: CountE
    episode_step: CountE
    policy_state: PyTree
    key: jax.Array
    num_steps: Scalar
    env_params: PyTree
    transform_state: PyTree = None
    raw_obs: PyTree = None


@struct.dataclass
class Trajectory:
    """Preallocated time-major rollout buffers (one observation track).

    Attributes:
        obs: leaves ``[T + 1, E, A, ...]``; slot ``t`` is the policy input at step ``t``,
            slot ``T`` the observation the next call starts from.
        actions: leaves ``[T, E, A, ...]`` (meaningless where ``acting`` is False).
        rewards: ``float32[T, E, A]``, reward of transition ``t``.
        terminated: ``bool[T, E, A]``; truncated: ``bool[T, E, A]``, per-agent flags
            of transition ``t`` (False on reset steps).
        acting: ``bool[T, E, A]``, the agent acted at step ``t``.
        is_reset: ``bool[T, E]``, step ``t`` reset the env (see the module docstring).
        extras: policy outputs per step (e.g. ``action_logp``, ``vf_preds``), leaves
            ``[T, E, A, ...]``.
        infos: env info per step, leaves ``[T, E, ...]`` as the env returns them.
        episode_count_0: ``int32[E]``, ``RolloutState.episode_count`` at slot 0.
        episode_step_0: ``int32[E]``, ``RolloutState.episode_step`` at slot 0.
        policy_state_0: the policy state before step 0 (leaves ``[E, A, ...]``), so a
            learner can replay a recurrent policy over the chunk.
        raw_obs: with transforms that change observations, the env's own observations
            behind ``obs`` (leaves ``[T + 1, E, A, ...]``, same slots); else ``None``.
        raw_rewards: with transforms that change rewards, the env's own rewards behind
            ``rewards`` (``float32[T, E, A]``); else ``None``.
        env_params: with a transform that draws env params (domain randomization), the
            params each env stepped with at step ``t`` (leaves ``[T, E, ...]``); else
            ``None``.
    """

    obs: PyTree
    actions: PyTree
    rewards: RewardTEA
    terminated: FlagsTEA
    truncated: FlagsTEA
    acting: FlagsTEA
    is_reset: FlagsTE
    extras: PyTree
    infos: PyTree
    episode_count_0: CountE
    episode_step_0: CountE
    policy_state_0: PyTree
    raw_obs: PyTree = None
    raw_rewards: RewardTEA | None = None
    env_params: PyTree = None

    @property
    def rollout_length(self) -> int:
        """``T``."""
        return int(self.rewards.shape[0])

    @property
    def num_envs(self) -> int:
        """``E``."""
        return int(self.rewards.shape[1])

    @property
    def num_agents(self) -> int:
        """``A``."""
        return int(self.rewards.shape[2])
