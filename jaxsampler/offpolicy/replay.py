"""flashbax replay buffers filled from rollouts, inside the user's jit.

Two kinds, each a frozen dataclass of pure functions (``init``, ``add``, ``sample``,
``can_sample``) around a flashbax buffer whose item structure is derived from the
rollout's own :class:`~jaxsampler.types.Trajectory`, so nobody writes a dummy item:

* :func:`make_transition_buffer`: :class:`~jaxsampler.offpolicy.items.ReplayTransition`
  items (DQN, SAC, ...) in flashbax's item buffer (default: every stored transition is
  equally likely, one gather per sample) or flat buffer (which samples pairs of
  consecutive items and returns ``.first``);
* :func:`make_sequence_buffer`: windows of ``sequence_length`` consecutive
  :class:`~jaxsampler.offpolicy.items.SequenceStep` of one ``(env, agent)`` row, from
  flashbax's trajectory buffer with ``add_batch_size = E * A`` (R2D2, recurrent
  Q-learning). A window may start anywhere, so it may cross an episode boundary; its
  ``mask`` keeps the steps of the window's first episode (the reset step that ends it
  included, which holds the real final observation) unless ``cross_episodes=True``.

Consecutive ``add`` calls must come from consecutive rollout calls of the same rollout
state (each row is one continuing timeline). Shapes are checked at trace time against the
buffer state: a trajectory of another shape or dtype raises, naming both.

Example (collect and sample inside one jitted function)::

    >>> import jax
    >>> import jaxsampler as js
    >>> env = js.make("CartPole-v1")
    >>> policy = js.RandomPolicy(env.observation_space, env.action_space)
    >>> rollout = js.make_rollout(env, policy, num_envs=4, rollout_length=16)
    >>> params, state = (), rollout.init(jax.random.PRNGKey(0))
    >>> replay = make_transition_buffer(jax.eval_shape(rollout, params, state)[1], 10_000, 64, 32)
    >>> @jax.jit
    ... def collect(state, buf, key):
    ...     state, traj = rollout(params, state)
    ...     buf = replay.add(buf, traj)
    ...     return state, buf, replay.sample(buf, key)
    >>> state, buf, batch = collect(state, replay.init(), jax.random.PRNGKey(1))
    >>> batch.obs.shape  # a ReplayTransition, leaves [32, ...]
    (32, 4)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxsampler.offpolicy._extra import require
from jaxsampler.offpolicy.items import (
    ReplayTransition,
    SequenceStep,
    sequence_steps,
    transitions,
)
from jaxsampler.types import PyTree, Trajectory

__all__ = [
    "SequenceSample",
    "TransitionReplay",
    "SequenceReplay",
    "make_transition_buffer",
    "make_sequence_buffer",
    "check_batch",
]

_KINDS = ("item", "flat")


@struct.dataclass
class SequenceSample:
    """A batch of windows from :class:`SequenceReplay`.

    Attributes:
        steps: :class:`~jaxsampler.offpolicy.items.SequenceStep`, leaves ``[S, L, ...]``;
            ``steps.policy_state`` at ``[:, 0]`` is each window's stored recurrent state.
        mask: ``bool[S, L]``: the step belongs to the window's first episode (all True
            with ``cross_episodes=True``). Combine with ``steps.valid`` for losses.
    """

    steps: SequenceStep
    mask: jax.Array


def _zeros_like(spec: PyTree) -> PyTree:
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), spec)


def _item_of(batch_spec: PyTree) -> PyTree:
    """One item (no ``[B, T]`` prefix) of a batch's shape structure."""
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape[2:], s.dtype), batch_spec)


def check_batch(
    batch: PyTree, buffer_state: Any, rows_must_match: bool = True, what: str = "trajectory"
) -> None:
    """Raises unless ``batch`` (leaves ``[B, L, ...]``) can be added to ``buffer_state``.

    flashbax itself checks only the ``[B, L]`` prefix and dtypes (a leaf of another
    trailing shape may broadcast silently); this compares every leaf's full shape.

    Args:
        batch: the items to add; buffer_state: a flashbax buffer state (``.experience``
            leaves ``[rows, capacity, ...]``).
        rows_must_match: compare ``B`` with the buffer's rows (trajectory and flat
            buffers; flashbax's item buffer flattens any ``[B, L]`` into one row).
        what: how the messages name the batch's source.

    Raises:
        ValueError: another tree structure, row count or leaf shape, naming the leaf, the
            batch's shape and the buffer's.
        TypeError: a leaf of another dtype, naming both.
    """
    stored = buffer_state.experience
    b_leaves, b_tree = jax.tree_util.tree_flatten_with_path(batch)
    s_leaves, s_tree = jax.tree_util.tree_flatten_with_path(stored)
    if b_tree != s_tree:  # type: ignore[operator]
        raise ValueError(
            f"the {what}'s items do not match the buffer's structure:\n  {what}: {b_tree}\n"
            f"  buffer: {s_tree}"
        )
    for (path, b), (_, s) in zip(b_leaves, s_leaves):
        name = jax.tree_util.keystr(path)
        rows_differ = rows_must_match and b.shape[:1] != s.shape[:1]
        if b.ndim != s.ndim or rows_differ or b.shape[2:] != s.shape[2:]:
            must = "rows and trailing dimensions" if rows_must_match else "trailing dimensions"
            raise ValueError(
                f"{what} field {name} has shape {tuple(b.shape)} ([rows, time, ...]), the "
                f"buffer's is {tuple(s.shape)} ([rows, capacity, ...]): {must} must match"
            )
        if b.dtype != s.dtype:
            raise TypeError(f"{what} field {name} has dtype {b.dtype}, the buffer's is {s.dtype}")


@dataclasses.dataclass(frozen=True)
class TransitionReplay:
    """A flashbax buffer of :class:`ReplayTransition` items (make it with
    :func:`make_transition_buffer`). Every method is pure and jit-safe.

    Attributes:
        buffer: the flashbax buffer (its own ``init`` / ``add`` / ``sample`` too).
        item: one transition's shapes and dtypes (``jax.ShapeDtypeStruct`` leaves).
        rows: rows per add, ``E * A``.
        kind: ``"item"`` or ``"flat"``.
    """

    buffer: Any
    item: ReplayTransition
    rows: int
    kind: str

    def init(self) -> Any:
        """An empty buffer state."""
        return self.buffer.init(_zeros_like(self.item))

    def add(self, buffer_state: Any, traj: Trajectory) -> Any:
        """Adds every transition of ``traj`` (invalid ones with ``valid = False``).

        Raises:
            ValueError / TypeError: at trace time, when ``traj``'s transitions do not match
                the buffer's (see :func:`check_batch`).
        """
        batch = transitions(traj)
        check_batch(batch, buffer_state, rows_must_match=self.kind == "flat")
        return self.buffer.add(buffer_state, batch)

    def sample(self, buffer_state: Any, key: jax.Array) -> ReplayTransition:
        """``sample_batch_size`` transitions, leaves ``[S, ...]``; weight by ``valid``."""
        experience = self.buffer.sample(buffer_state, key).experience
        return experience.first if self.kind == "flat" else experience

    def can_sample(self, buffer_state: Any) -> jax.Array:
        """``bool[]``: the buffer holds at least ``min_length`` items."""
        return self.buffer.can_sample(buffer_state)


def make_transition_buffer(
    traj: Trajectory,
    max_length: int,
    min_length: int,
    sample_batch_size: int,
    kind: str = "item",
) -> TransitionReplay:
    """A flashbax buffer of the transitions of rollouts shaped like ``traj``.

    Args:
        traj: a trajectory of the rollout, or its shapes
            (``jax.eval_shape(rollout, params, state)[1]``).
        max_length: capacity in transitions (rounded down to a multiple of ``E * A`` by
            the flat buffer).
        min_length: transitions held before :meth:`TransitionReplay.can_sample` is True.
        sample_batch_size: transitions per sample.
        kind: ``"item"`` (flashbax ``make_item_buffer``) or ``"flat"``
            (``make_flat_buffer`` with ``add_batch_size = E * A``).

    Returns:
        :class:`TransitionReplay`.

    Raises:
        ValueError: an unknown ``kind``, or flashbax's own argument checks.
        ImportError: flashbax is not installed (``pip install jaxsampler[offpolicy]``).
    """
    fbx = require("flashbax")
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
    spec = jax.eval_shape(transitions, traj)
    rows = int(spec.valid.shape[0])
    if kind == "item":
        buffer = fbx.make_item_buffer(
            max_length, min_length, sample_batch_size, add_sequences=True, add_batches=True
        )
    else:
        buffer = fbx.make_flat_buffer(
            max_length, min_length, sample_batch_size, add_sequences=True, add_batch_size=rows
        )
    return TransitionReplay(buffer=buffer, item=_item_of(spec), rows=rows, kind=kind)


@dataclasses.dataclass(frozen=True)
class SequenceReplay:
    """A flashbax trajectory buffer of :class:`SequenceStep` rows (make it with
    :func:`make_sequence_buffer`). Every method is pure and jit-safe.

    Attributes:
        buffer: the flashbax trajectory buffer (``add_batch_size = rows``).
        item: one step's shapes and dtypes.
        rows: ``E * A``.
        sequence_length: ``L``, steps per sampled window.
        cross_episodes: whether :meth:`sample`'s mask lets windows run into the next
            episode.
    """

    buffer: Any
    item: SequenceStep
    rows: int
    sequence_length: int
    cross_episodes: bool

    def init(self) -> Any:
        """An empty buffer state."""
        return self.buffer.init(_zeros_like(self.item))

    def add(self, buffer_state: Any, traj: Trajectory, policy_states: PyTree = None) -> Any:
        """Appends ``traj``'s ``T`` steps to every row.

        Args:
            buffer_state: the buffer state.
            traj: the next rollout call's trajectory.
            policy_states: per-step recurrent states (leaves ``[T, E, A, ...]``), required
                when the buffer was made with ``policy_states``.

        Raises:
            ValueError: at trace time, ``T`` shorter than ``sequence_length``, or items that
                do not match the buffer's (see :func:`check_batch`).
            TypeError: a dtype that does not match the buffer's.
        """
        _check_length(self.sequence_length, traj.rewards.shape[0])
        batch = sequence_steps(traj, policy_states)
        check_batch(batch, buffer_state)
        return self.buffer.add(buffer_state, batch)

    def sample(self, buffer_state: Any, key: jax.Array) -> SequenceSample:
        """``sample_batch_size`` windows of ``sequence_length`` steps."""
        steps = self.buffer.sample(buffer_state, key).experience
        if self.cross_episodes:
            mask = jnp.ones(steps.valid.shape, jnp.bool_)
        else:
            mask = steps.episode_id == steps.episode_id[:, :1]
        return SequenceSample(steps=steps, mask=mask)

    def can_sample(self, buffer_state: Any) -> jax.Array:
        """``bool[]``: every row holds at least ``min_length_time_axis`` steps."""
        return self.buffer.can_sample(buffer_state)


def _check_length(sequence_length: int, rollout_length: int) -> None:
    if sequence_length > rollout_length:
        raise ValueError(
            f"sequence_length {sequence_length} is longer than the rollout "
            f"(rollout_length {rollout_length})"
        )


def make_sequence_buffer(
    traj: Trajectory,
    sequence_length: int,
    max_length_time_axis: int,
    min_length_time_axis: int,
    sample_batch_size: int,
    period: int = 1,
    cross_episodes: bool = False,
    policy_states: PyTree = None,
) -> SequenceReplay:
    """A flashbax trajectory buffer of windows over rollouts shaped like ``traj``.

    Args:
        traj: a trajectory of the rollout, or its shapes (``jax.eval_shape``).
        sequence_length: ``L``, steps per window (at most the rollout length ``T``).
        max_length_time_axis: capacity per row in steps (total ``E * A`` times this).
        min_length_time_axis: steps per row before sampling is allowed (at least ``L``).
        sample_batch_size: windows per sample.
        period: spacing of window starts (``L`` for windows that never overlap).
        cross_episodes: let the mask run past the window's first episode.
        policy_states: per-step recurrent states of ``traj`` (or their shapes), leaves
            ``[T, E, A, ...]``, to store each step's recurrent state (R2D2); ``None``
            stores none.

    Returns:
        :class:`SequenceReplay`.

    Raises:
        ValueError: ``sequence_length`` longer than the rollout, or flashbax's own
            argument checks.
        ImportError: flashbax is not installed (``pip install jaxsampler[offpolicy]``).
    """
    fbx = require("flashbax")
    _check_length(sequence_length, traj.rewards.shape[0])
    spec = jax.eval_shape(sequence_steps, traj, policy_states)
    rows = int(spec.valid.shape[0])
    buffer = fbx.make_trajectory_buffer(
        add_batch_size=rows,
        sample_batch_size=sample_batch_size,
        sample_sequence_length=sequence_length,
        period=period,
        min_length_time_axis=max(min_length_time_axis, sequence_length),
        max_length_time_axis=max_length_time_axis,
    )
    return SequenceReplay(
        buffer=buffer,
        item=_item_of(spec),
        rows=rows,
        sequence_length=sequence_length,
        cross_episodes=cross_episodes,
    )
