"""The transform protocol and the pipeline that runs a tuple of transforms in the rollout.

A transform is static configuration (a frozen, hashable dataclass) plus pure functions
over the *batched* step data, ``[E, A, ...]`` (envs, agents), run inside the rollout's
``lax.scan``::

    env --obs, reward--> T_1 --> T_2 --> ... --> T_n --> policy
    env <--action------- T_1 <-- T_2 <-- ... <-- T_n <-- policy

``transforms=(FrameStack(4), NormalizeObservation())`` stacks the env's frames, then
normalizes the stacks. Actions go through the chain the other way (the last transform
sees the policy's action first). Each transform sees the spaces its neighbours hand it
(:class:`Spaces`) and says what it hands on (:meth:`Transform.observation_space`,
:meth:`Transform.action_space`); a transform that does not fit its input space raises
:class:`TransformSpaceError` when the pipeline is built (by ``make_rollout``, ``Sampler``,
...), naming itself and the space.

State. Each transform keeps two pytrees (:class:`StageState`): ``shared`` (statistics
over every env and agent, e.g. a running mean; replicated across devices and kept equal
there by the transform's own collectives over ``Context.axis_name``) and ``rows`` (one
entry per env and agent, leaves ``[E, A, ...]``, e.g. a frame stack). The pipeline's
:class:`TransformState` lives in ``RolloutState.transform_state``, so it continues across
rollout calls, is donated with the rest of the state and is saved with it. A host-stepped
sampler keeps ``rows`` per ``(env, agent)`` and calls the same functions on the rows of
one poll.

What a transform sees of a step (:class:`Observed`): the new observation and reward, the
done flags, ``recorded`` (the observation becomes part of the agent's episode: the agent
acts on it, or it is the agent's final observation) and ``first`` (the observation
starts a new episode). In the device rollout a reset step's new observation is the
first of the next episode (``first``); the step before it delivered the previous
episode's real final observation (``recorded``, flags set), so statistics see final
observations, and value bootstraps at truncation see them normalized like every other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from jaxsampler.spaces import Dict, Space, Tuple
from jaxsampler.types import PyTree, TimeStep

__all__ = [
    "Context",
    "Observed",
    "Pipeline",
    "Spaces",
    "StageState",
    "Transform",
    "TransformSpaceError",
    "TransformState",
    "build_pipeline",
    "first_bad_leaf",
]


class TransformSpaceError(ValueError):
    """A transform does not fit the space it is given (raised when the pipeline is built)."""


@dataclasses.dataclass(frozen=True)
class Spaces:
    """The spaces at one transform's env side (what it receives / sends on).

    Attributes:
        obs: the observation space entering the transform (the env's, or the previous
            transform's output).
        action: the action space on the transform's env side (the env's, or what the
            previous transform accepts).
        policy_action: the policy's action space (after every transform).
    """

    obs: Space
    action: Space
    policy_action: Space


@dataclasses.dataclass(frozen=True)
class Context:
    """Static facts of the call a transform runs in.

    Attributes:
        axis_name: the mesh axis the env axis is split over (``None``: not sharded);
            statistics over envs must be reduced over it (``jax.lax.psum``).
        frozen: statistics are read but not updated (evaluation).
    """

    axis_name: str | None = None
    frozen: bool = False


@struct.dataclass
class Observed:
    """One step of env output as the transforms see it (leaves ``[E, A, ...]``).

    Attributes:
        obs: the observation pytree, leaves ``[E, A, ...]``.
        reward: ``float32[E, A]``, the reward of the transition that produced ``obs``
            (0 on a first observation).
        terminated, truncated: ``bool[E, A]``, the agent's done flags with ``obs``.
        recorded: ``bool[E, A]``, ``obs`` enters the agent's episode: the agent acts on it,
            or it is the agent's final observation. Statistics are updated from these.
        first: ``bool[E, A]``, ``obs`` is the first observation of a new episode.
        action: the policy's action that led to ``obs`` (leaves ``[E, A, ...]``, the
            policy's action space; zeros with a first observation).
        info: the env's info of the step, as the env returns it (leaves ``[E, ...]``;
            ``None`` where no info is known, e.g. on a host env's poll).
    """

    obs: PyTree
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    recorded: jax.Array
    first: jax.Array
    action: PyTree
    info: PyTree = None


@struct.dataclass
class StageState:
    """One transform's state: ``shared`` over all envs, ``rows`` per env and agent."""

    shared: PyTree = ()
    rows: PyTree = ()


@struct.dataclass
class TransformState:
    """The pipeline's state, carried in ``RolloutState.transform_state``.

    Attributes:
        stages: one :class:`StageState` per transform, in pipeline order.
        done: ``bool[E, A]``, the agents' done flags of the previous step (a final
            observation is recorded once, at the step that ends the agent).
    """

    stages: tuple[StageState, ...]
    done: jax.Array


class Transform:
    """Base class of transforms; subclasses are frozen dataclasses and override the hooks.

    Class flags say what a transform touches, so the rollout records the raw data it
    hides (``Trajectory.raw_obs``, ``raw_rewards``) and skips work it does not need.
    """

    #: The transform changes observations (the rollout keeps the raw ones too).
    changes_obs: ClassVar[bool] = False
    #: The transform changes rewards (the rollout keeps the raw ones too).
    changes_reward: ClassVar[bool] = False
    #: The transform changes actions on their way to the env.
    changes_action: ClassVar[bool] = False
    #: The transform draws env params at resets (:meth:`reset_params`).
    randomizes_params: ClassVar[bool] = False

    def check(self, spaces: Spaces) -> None:
        """Raises :class:`TransformSpaceError` naming the transform and the space if the
        transform cannot work on ``spaces``."""

    def observation_space(self, spaces: Spaces) -> Space:
        """The observation space this transform hands on (toward the policy)."""
        return spaces.obs

    def action_space(self, spaces: Spaces) -> Space:
        """The action space this transform accepts (from the policy side)."""
        return spaces.action

    def init_shared(self, spaces: Spaces) -> PyTree:
        """Initial ``shared`` state (leaves with explicit dtypes)."""
        return ()

    def init_rows(self, spaces: Spaces, batch_shape: tuple[int, ...]) -> PyTree:
        """Initial ``rows`` state, leaves ``[*batch_shape, ...]`` (``batch_shape = (E, A)``)."""
        return ()

    def observe(
        self, spaces: Spaces, state: StageState, step: Observed, ctx: Context
    ) -> tuple[StageState, Observed]:
        """Updates the state from ``step`` and returns the step handed on. Pure, jittable."""
        return state, step

    def to_env(self, spaces: Spaces, action: Any) -> Any:
        """Maps an action from the policy side to the env side (leaves ``[E, A, ...]``)."""
        return action

    def reset_params(
        self, state: StageState, key: jax.Array, reset: jax.Array, params: Any, ctx: Context
    ) -> tuple[StageState, Any]:
        """Env params for the next step: ``params`` per env (leaves ``[E, ...]``), with new
        ones where ``reset`` (``bool[E]``) is set. Only if :attr:`randomizes_params`."""
        return state, params


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """A tuple of transforms bound to an env's spaces (what the rollout runs).

    Attributes:
        transforms: the transforms, env side first.
        spaces: the :class:`Spaces` at each transform's env side.
        observation_space: what the policy sees.
        action_space: what the policy emits.
    """

    transforms: tuple[Transform, ...]
    spaces: tuple[Spaces, ...]
    observation_space: Space
    action_space: Space

    def __bool__(self) -> bool:
        return bool(self.transforms)

    @property
    def changes_obs(self) -> bool:
        """Whether any transform changes observations (the rollout then also records the raw
        ones, ``Trajectory.raw_obs``)."""
        return any(t.changes_obs for t in self.transforms)

    @property
    def changes_reward(self) -> bool:
        """Whether any transform changes rewards (the rollout then also records the raw ones,
        ``Trajectory.raw_rewards``)."""
        return any(t.changes_reward for t in self.transforms)

    @property
    def changes_action(self) -> bool:
        """Whether any transform maps actions on their way to the env (otherwise :meth:`to_env`
        is skipped)."""
        return any(t.changes_action for t in self.transforms)

    @property
    def randomizes_params(self) -> bool:
        """Whether any transform draws env params at resets (the rollout then calls
        :meth:`reset_params` and records ``Trajectory.env_params``)."""
        return any(t.randomizes_params for t in self.transforms)

    def init(self, batch_shape: tuple[int, int]) -> TransformState | None:
        """The initial state for ``batch_shape = (E, A)``; ``None`` for an empty pipeline."""
        if not self:
            return None
        stages = tuple(
            StageState(t.init_shared(s), t.init_rows(s, tuple(batch_shape)))
            for t, s in zip(self.transforms, self.spaces)
        )
        return TransformState(stages, jnp.zeros(tuple(batch_shape), jnp.bool_))

    def observe(
        self, state: TransformState, step: Observed, ctx: Context
    ) -> tuple[TransformState, Observed]:
        """Runs every transform's :meth:`~Transform.observe`, env side first."""
        stages = []
        for t, s, st in zip(self.transforms, self.spaces, state.stages):
            st, step = t.observe(s, st, step, ctx)
            stages.append(st)
        return dataclasses.replace(state, stages=tuple(stages)), step

    def observe_env(
        self,
        state: TransformState,
        obs: Any,
        reward: jax.Array,
        terminated: jax.Array,
        truncated: jax.Array,
        acting: jax.Array,
        first: jax.Array,
        action: Any,
        ctx: Context,
        info: Any = None,
    ) -> tuple[TransformState, Observed]:
        """:meth:`observe` of a device step: derives ``recorded`` (acting, or newly done)
        and carries the done flags. ``first``: ``bool[E]``, the step reset its env (or the
        rollout starts); ``action``: the policy's action of the step (zeroed where
        ``first``); the others ``[E, A, ...]``."""
        done = terminated | truncated
        first_ea = jnp.broadcast_to(first[:, None], done.shape)
        recorded = acting | (done & ~state.done)
        action = jax.tree.map(
            lambda a: jnp.where(
                first_ea.reshape(first_ea.shape + (1,) * (a.ndim - 2)), jnp.zeros_like(a), a
            ),
            action,
        )
        step = Observed(obs, reward, terminated, truncated, recorded, first_ea, action, info)
        state = dataclasses.replace(state, done=done)
        return self.observe(state, step, ctx)

    def observe_timestep(
        self, state: TransformState, ts: TimeStep, first: jax.Array, action: Any, ctx: Context
    ) -> tuple[TransformState, Observed]:
        """:meth:`observe_env` of a batched :class:`~jaxsampler.types.TimeStep`."""
        return self.observe_env(
            state,
            ts.obs,
            ts.reward,
            ts.terminated,
            ts.truncated,
            ts.acting,
            first,
            action,
            ctx,
            ts.info,
        )

    def to_env(self, action: Any) -> Any:
        """The env-side action of a policy action (transforms in reverse order)."""
        for t, s in zip(reversed(self.transforms), reversed(self.spaces)):
            action = t.to_env(s, action)
        return action

    def reset_params(
        self,
        state: TransformState,
        key: jax.Array,
        reset: jax.Array,
        params: Any,
        ctx: Context,
    ) -> tuple[TransformState, Any]:
        """Params of the next step from every transform that randomizes them."""
        stages = list(state.stages)
        for i, t in enumerate(self.transforms):
            if t.randomizes_params:
                key, sub = jax.random.split(key)
                stages[i], params = t.reset_params(stages[i], sub, reset, params, ctx)
        return dataclasses.replace(state, stages=tuple(stages)), params


def first_bad_leaf(space: Space, ok: Callable[[Space], bool], path: str = "obs") -> str | None:
    """``"<path> is <space>"`` for the first leaf space of a ``Dict`` / ``Tuple`` tree (in
    its order) for which ``ok`` is false, or ``None`` if every leaf is fine (for
    :meth:`Transform.check` messages that name the offending entry)."""
    if isinstance(space, Dict):
        children: list[tuple[str, Space]] = [(f"[{k!r}]", s) for k, s in space.spaces.items()]
    elif isinstance(space, Tuple):
        children = [(f"[{i}]", s) for i, s in enumerate(space.spaces)]
    else:
        return None if ok(space) else f"{path} is {space!r}"
    for suffix, sub in children:
        bad = first_bad_leaf(sub, ok, path + suffix)
        if bad is not None:
            return bad
    return None


def build_pipeline(
    transforms: Sequence[Transform] | Transform | None,
    observation_space: Space,
    action_space: Space,
) -> Pipeline:
    """Binds ``transforms`` (env side first) to an env's spaces.

    Raises:
        TypeError: an element is not a :class:`Transform`.
        TransformSpaceError: a transform does not fit the space it would get.
    """
    if transforms is None:
        transforms = ()
    elif isinstance(transforms, Transform):
        transforms = (transforms,)
    transforms = tuple(transforms)
    for t in transforms:
        if not isinstance(t, Transform):
            raise TypeError(
                f"transforms must be jaxsampler.transforms.Transform objects, got "
                f"{type(t).__name__}: {t!r}"
            )
    # Action spaces are decided from the env side: each transform says what it accepts.
    # The policy's action space is known only after the last transform, so a first pass
    # finds it (the probe's policy_action is the action space so far), and a second pass
    # checks every transform and derives the observation spaces with the real one (an
    # observation may depend on it, e.g. one that carries the previous actions).
    obs, act = observation_space, action_space
    env_actions: list[Space] = []
    for t in transforms:
        env_actions.append(act)
        probe = Spaces(obs, act, act)
        t.check(probe)
        obs, act = t.observation_space(probe), t.action_space(probe)
    obs = observation_space
    spaces_list: list[Spaces] = []
    for t, a in zip(transforms, env_actions):
        s = Spaces(obs, a, act)
        t.check(s)
        spaces_list.append(s)
        obs = t.observation_space(s)
    return Pipeline(transforms, tuple(spaces_list), obs, act)
