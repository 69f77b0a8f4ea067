"""History in the observation: stacked frames and the previous actions and rewards.

Both transforms keep per-row history (``StageState.rows``, leaves ``[E, A, ...]``) and
share one rule for agents out of lockstep: the history advances only where the
observation is recorded (:attr:`~jaxsampler.transforms.base.Observed.recorded`: the
agent acts on it, or it is the agent's final one). Where it is not recorded (an agent
waiting for its turn, or done while others play on) the transform still hands on what
the history *would* be with this observation, but keeps none of it. An agent's history
restarts at its first recorded observation of each episode (for a single-agent env: the
episode's first observation).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsampler.constants import MASK_KEY, OBS_KEY
from jaxsampler.spaces import Box, Dict, Discrete, MultiDiscrete, Space, Tuple
from jaxsampler.transforms.base import (
    Context,
    Observed,
    Spaces,
    StageState,
    Transform,
    TransformSpaceError,
    first_bad_leaf,
)

__all__ = ["FrameStack", "FrameStackRows", "PrevActionsRewards", "PrevActionsRewardsRows"]


def _where_rows(cond: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    """``where(cond, a, b)`` with ``cond: bool[E, A]`` broadcast over trailing dims."""
    return jnp.where(cond.reshape(cond.shape + (1,) * (a.ndim - cond.ndim)), a, b)


def _push(history: jax.Array, x: jax.Array) -> jax.Array:
    """``history [E, A, n, ...]`` with its oldest entry dropped and ``x [E, A, ...]`` appended."""
    return jnp.concatenate([history[:, :, 1:], x[:, :, None].astype(history.dtype)], axis=2)


def _mask_apart(space: Space) -> bool:
    """Whether ``space`` is a ``Dict`` with an ``action_mask`` entry (kept apart)."""
    return isinstance(space, Dict) and MASK_KEY in space.spaces


def _stacked_space(space: Space, k: int) -> Space:
    if isinstance(space, Dict):
        return Dict({key: _stacked_space(s, k) for key, s in space.spaces.items()})
    if isinstance(space, Tuple):
        return Tuple([_stacked_space(s, k) for s in space.spaces])
    assert isinstance(space, Box)
    shape = (k,) + space.shape
    return Box(
        np.broadcast_to(space.low, shape), np.broadcast_to(space.high, shape), shape, space.dtype
    )


@struct.dataclass
class FrameStackRows:
    """:class:`FrameStack`'s per-row state.

    Attributes:
        frames: one ``[E, A, k, *leaf_shape]`` array per observation leaf (tree order of
            the observation without its ``action_mask`` entry), oldest first.
        fresh: ``bool[E, A]``, the agent has had no recorded observation in its current
            episode yet (its next one fills every slot).
    """

    frames: tuple[jax.Array, ...]
    fresh: jax.Array


@dataclasses.dataclass(frozen=True)
class FrameStack(Transform):
    """Stacks each agent's last ``k`` recorded observations on a new leading axis.

    An observation of shape ``(*s)`` becomes ``(k, *s)``, oldest first, newest last
    (``stack[-1]`` is the current observation). A ``Dict`` or ``Tuple`` of ``Box``
    entries has each entry stacked; the ``action_mask`` entry of a ``Dict`` passes
    through unstacked (it is the current legal-action mask). The output space repeats
    the bounds ``k`` times.

    Per env and agent: at the agent's first recorded observation of an episode (the
    episode's first observation in a single-agent env) **all ``k`` slots are filled
    with that observation**, so the stack never mixes episodes and never holds zeros.
    After it the stack advances by one frame per recorded observation
    (:attr:`~jaxsampler.transforms.base.Observed.recorded`); an agent that waits out of
    lockstep pushes no frame (it is shown its current observation in the last slot, but
    the stack keeps it only when it is recorded). A final observation (terminal or
    truncated) is stacked with its predecessors, so value bootstraps see a real stack.

    Args:
        k: the number of frames, ``>= 1``.

    Raises:
        ValueError: ``k < 1``.
        TransformSpaceError (when the pipeline is built): an observation leaf that is
            not a ``Box`` (e.g. ``Discrete``, or a ``Dict`` with a ``Discrete`` entry);
            put :class:`~jaxsampler.transforms.flatten.FlattenObservation` first.

    The state is ``rows = FrameStackRows``.
    """

    k: int = 4

    changes_obs = True

    def __post_init__(self) -> None:
        if not isinstance(self.k, (int, np.integer)) or isinstance(self.k, bool) or self.k < 1:
            raise ValueError(f"FrameStack: k must be an int >= 1, got {self.k!r}")
        object.__setattr__(self, "k", int(self.k))

    def _parts(self, space: Space) -> tuple[Space, bool]:
        """The space stacked (without any action mask) and whether a mask is kept apart."""
        if _mask_apart(space):
            assert isinstance(space, Dict)
            rest = {k: s for k, s in space.spaces.items() if k != MASK_KEY}
            return Dict(rest), True
        return space, False

    def check(self, spaces: Spaces) -> None:
        """Raises :class:`TransformSpaceError` for an observation leaf that is not a ``Box``
        (the action mask aside), or when there is nothing but a mask to stack."""
        stacked, _ = self._parts(spaces.obs)
        bad = first_bad_leaf(stacked, lambda s: isinstance(s, Box))
        if bad is not None:
            raise TransformSpaceError(
                f"FrameStack({self.k}) can only stack Box observations (or a Dict/Tuple of "
                f"Box entries): {bad}, in the observation space {spaces.obs!r}. Put "
                f"FlattenObservation() before FrameStack to stack non-Box observations."
            )
        if _mask_apart(spaces.obs) and not jax.tree.leaves(stacked.zeros()):
            raise TransformSpaceError(
                f"FrameStack({self.k}): the observation space {spaces.obs!r} has nothing but "
                f"an action mask to stack"
            )

    def observation_space(self, spaces: Spaces) -> Space:
        """Each ``Box`` leaf as ``(k, *shape)`` with its bounds repeated; an ``action_mask``
        entry unchanged."""
        stacked, has_mask = self._parts(spaces.obs)
        out = _stacked_space(stacked, self.k)
        if has_mask:
            assert isinstance(out, Dict) and isinstance(spaces.obs, Dict)
            return Dict(dict(out.spaces, **{MASK_KEY: spaces.obs.spaces[MASK_KEY]}))
        return out

    def init_rows(self, spaces: Spaces, batch_shape: tuple[int, ...]) -> Any:
        """:class:`FrameStackRows` of zero frames (``[E, A, k, *leaf_shape]`` per leaf), every
        row fresh."""
        stacked, _ = self._parts(spaces.obs)
        frames = tuple(
            jnp.zeros(tuple(batch_shape) + (self.k,) + leaf.shape, leaf.dtype)
            for leaf in jax.tree.leaves(stacked.zeros())
        )
        return FrameStackRows(frames, jnp.ones(tuple(batch_shape), jnp.bool_))

    def observe(
        self, spaces: Spaces, state: StageState, step: Observed, ctx: Context
    ) -> tuple[StageState, Observed]:
        """Hands on the stacks with the new observation pushed in (filling every slot at an
        agent's first recorded observation) and keeps them only where ``step.recorded``.
        Pure; jittable."""
        rows: FrameStackRows = state.rows
        obs = step.obs
        mask = None
        if _mask_apart(spaces.obs):
            obs = {k: v for k, v in obs.items() if k != MASK_KEY}
            mask = step.obs[MASK_KEY]
        leaves, treedef = jax.tree.flatten(obs)
        fresh = rows.fresh | step.first
        shown, kept = [], []
        for x, old in zip(leaves, rows.frames):
            filled = jnp.broadcast_to(x[:, :, None], old.shape).astype(old.dtype)
            new = _where_rows(fresh, filled, _push(old, x))
            shown.append(new)
            kept.append(_where_rows(step.recorded, new, old))
        out: Any = jax.tree.unflatten(treedef, shown)
        if mask is not None:
            out = dict(out, **{MASK_KEY: mask})
        rows = FrameStackRows(tuple(kept), fresh & ~step.recorded)
        return dataclasses.replace(state, rows=rows), dataclasses.replace(step, obs=out)


@struct.dataclass
class PrevActionsRewardsRows:
    """:class:`PrevActionsRewards`' per-row state.

    Attributes:
        actions: ``[E, A, n, *action_shape]``, the last ``n`` actions, oldest first.
        rewards: ``float32[E, A, n]``, the last ``n`` rewards, oldest first.
        pending_action: ``[E, A, *action_shape]``, the action taken on the last recorded
            observation (it enters the history with the agent's next recorded one).
        pending_reward: ``float32[E, A]``, the rewards received since the last recorded
            observation (summed, as an episode credits a waiting agent).
        armed: ``bool[E, A]``, the agent acts on its last recorded observation: the next
            step's action is its own.
        fresh: ``bool[E, A]``, no recorded observation yet in the agent's episode.
    """

    actions: jax.Array
    rewards: jax.Array
    pending_action: jax.Array
    pending_reward: jax.Array
    armed: jax.Array
    fresh: jax.Array


def _action_history_space(space: Space, n: int) -> Space:
    """The space of ``n`` stacked action ids (see :class:`PrevActionsRewards`)."""
    if isinstance(space, Discrete):
        return MultiDiscrete(np.full((n,), space.n), dtype=np.int32)
    if isinstance(space, MultiDiscrete):
        return MultiDiscrete(np.broadcast_to(space.nvec, (n,) + space.shape), dtype=space.dtype)
    assert isinstance(space, Box)
    shape = (n,) + space.shape
    if np.issubdtype(space.dtype, np.floating):
        # Policies may emit actions outside the bounds (an unclipped Gaussian sample).
        return Box(-np.inf, np.inf, shape, space.dtype)
    low = np.minimum(space.low, 0)  # the zeros of a fresh history must lie inside
    high = np.maximum(space.high, 0)
    return Box(np.broadcast_to(low, shape), np.broadcast_to(high, shape), shape, space.dtype)


@dataclasses.dataclass(frozen=True)
class PrevActionsRewards(Transform):
    """Adds each agent's last ``n`` actions and rewards to its observation.

    The observation becomes a ``Dict``::

        {"observations": <the input observation>,
         "prev_actions": the last n actions of the policy, oldest first,
         "prev_rewards": float32[n], the last n rewards, oldest first}

    Both histories are all zeros at an agent's first (recorded) observation of an
    episode and fill from the right: with ``n = 2``, the third observation of an episode
    carries ``prev_actions = [a_0, a_1]``, ``prev_rewards = [r_0, r_1]`` (``r_t`` is the
    reward of the step that took ``a_t``), the second ``[0, a_0]``, ``[0, r_0]``.

    ``prev_actions`` layout, per policy action space (the policy's side of the pipeline):

    * ``Discrete(m, start)``: ``int32[n]`` action ids ``action - start`` in ``[0, m)``,
      space ``MultiDiscrete([m] * n)`` (so :class:`~jaxsampler.transforms.flatten.
      FlattenObservation` one-hot encodes them, as RLlib's ``PrevActionsPrevRewards``
      connector does). A zero of a fresh history reads as id 0.
    * ``MultiDiscrete(nvec)``: ``[n, *nvec.shape]``, space ``MultiDiscrete`` of ``nvec``
      repeated.
    * float ``Box(shape)``: ``[n, *shape]`` as the policy emitted them (before any action
      transform clips or rescales them), space unbounded.
    * integer ``Box``: ``[n, *shape]``, bounds repeated (widened to contain 0).

    Out of lockstep (multi-agent), the history advances only at the agent's recorded
    observations: ``prev_actions`` holds the agent's own last actions, and a
    ``prev_rewards`` entry is the sum of the rewards the agent received between two of
    its recorded observations (what its episode credits to that step); rewards before its
    first observation are dropped. The rewards are those reaching this transform (after
    any reward transform listed before it). An ``action_mask`` entry of a ``Dict``
    observation moves to the top level of the output (next to ``"observations"``), where
    masking policies and :class:`~jaxsampler.transforms.flatten.FlattenObservation` look.

    Args:
        n: the history length, ``>= 1``.

    Raises:
        ValueError: ``n < 1``.
        TransformSpaceError (when the pipeline is built): the action space is not
            ``Discrete``, ``MultiDiscrete`` or ``Box``.

    The state is ``rows = PrevActionsRewardsRows``.
    """

    n: int = 1

    changes_obs = True

    def __post_init__(self) -> None:
        if not isinstance(self.n, (int, np.integer)) or isinstance(self.n, bool) or self.n < 1:
            raise ValueError(f"PrevActionsRewards: n must be an int >= 1, got {self.n!r}")
        object.__setattr__(self, "n", int(self.n))

    def check(self, spaces: Spaces) -> None:
        """Raises :class:`TransformSpaceError` unless the policy's action space is
        ``Discrete``, ``MultiDiscrete`` or ``Box``."""
        if not isinstance(spaces.policy_action, (Discrete, MultiDiscrete, Box)):
            raise TransformSpaceError(
                f"PrevActionsRewards({self.n}) supports Discrete, MultiDiscrete or Box action "
                f"spaces, got {spaces.policy_action!r} (observation space {spaces.obs!r})"
            )

    def observation_space(self, spaces: Spaces) -> Space:
        """``Dict(observations=<the input>, prev_actions=..., prev_rewards=float32[n])``, plus
        the input's ``action_mask`` at the top level (``prev_actions``' space: see the class
        docstring)."""
        inner = spaces.obs
        extra: dict[str, Space] = {}
        if _mask_apart(inner):
            assert isinstance(inner, Dict)
            extra[MASK_KEY] = inner.spaces[MASK_KEY]
            inner = Dict({k: s for k, s in inner.spaces.items() if k != MASK_KEY})
        return Dict(
            {
                OBS_KEY: inner,
                "prev_actions": _action_history_space(spaces.policy_action, self.n),
                "prev_rewards": Box(-np.inf, np.inf, (self.n,), np.float32),
                **extra,
            }
        )

    def _ids(self, space: Space, action: jax.Array) -> jax.Array:
        if isinstance(space, Discrete):
            return (action - space.start).astype(jnp.int32)
        return action.astype(space.dtype)

    def init_rows(self, spaces: Spaces, batch_shape: tuple[int, ...]) -> Any:
        """:class:`PrevActionsRewardsRows` of zeros for ``batch_shape = (E, A)``, every row
        fresh and not armed."""
        b = tuple(batch_shape)
        hist = _action_history_space(spaces.policy_action, self.n)
        act = jnp.zeros(hist.shape[1:], hist.dtype)
        return PrevActionsRewardsRows(
            actions=jnp.zeros(b + hist.shape, hist.dtype),
            rewards=jnp.zeros(b + (self.n,), jnp.float32),
            pending_action=jnp.zeros(b + act.shape, act.dtype),
            pending_reward=jnp.zeros(b, jnp.float32),
            armed=jnp.zeros(b, jnp.bool_),
            fresh=jnp.ones(b, jnp.bool_),
        )

    def observe(
        self, spaces: Spaces, state: StageState, step: Observed, ctx: Context
    ) -> tuple[StageState, Observed]:
        """Hands on the observation with both histories advanced by the agent's pending action
        and summed reward, and keeps the advance only where ``step.recorded``. Pure;
        jittable."""
        rows: PrevActionsRewardsRows = state.rows
        first, recorded = step.first, step.recorded
        fresh = rows.fresh | first
        action = self._ids(spaces.policy_action, step.action)
        # The step's action is the agent's own only if it acted on its last observation.
        pending_action = _where_rows(rows.armed & ~first, action, rows.pending_action)
        pending_reward = jnp.where(first, 0.0, rows.pending_reward + step.reward).astype(
            jnp.float32
        )
        actions = _where_rows(
            fresh, jnp.zeros_like(rows.actions), _push(rows.actions, pending_action)
        )
        rewards = _where_rows(
            fresh, jnp.zeros_like(rows.rewards), _push(rows.rewards, pending_reward)
        )
        obs = step.obs
        out: dict[str, Any] = {}
        if _mask_apart(spaces.obs):
            out[MASK_KEY] = obs[MASK_KEY]
            obs = {k: v for k, v in obs.items() if k != MASK_KEY}
        out.update(observations=obs, prev_actions=actions, prev_rewards=rewards)
        done = step.terminated | step.truncated
        rows = PrevActionsRewardsRows(
            actions=_where_rows(recorded, actions, rows.actions),
            rewards=_where_rows(recorded, rewards, rows.rewards),
            pending_action=_where_rows(recorded, jnp.zeros_like(pending_action), pending_action),
            pending_reward=jnp.where(recorded, 0.0, pending_reward).astype(jnp.float32),
            armed=recorded & ~done,
            fresh=fresh & ~recorded,
        )
        return dataclasses.replace(state, rows=rows), dataclasses.replace(step, obs=out)
