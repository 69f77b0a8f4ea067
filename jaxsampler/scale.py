"""Scaling the env axis across devices with JAX's own sharding (``jax.shard_map``).

On a CPU host, ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (set before JAX is
imported) exposes N CPU devices; one per core, each running its own slice of the envs,
is how one process uses the whole machine. The same code path splits envs across GPUs,
or across hosts after ``jax.distributed.initialize()``.

``num_envs`` is the global width; it must be divisible by the number of devices. Each
device runs ``num_envs / n`` envs with PRNG streams made distinct by folding in its
shard index, so results are deterministic for a given device count (but differ from
the single-device stream).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxsampler import vector
from jaxsampler.envs.base import Env
from jaxsampler.policies.base import Policy
from jaxsampler.rollout import (
    Rollout,
    Transforms,
    _check_sizes,
    allocate_trajectory,
    init_rollout_state,
    make_rollout,
    pipeline_of,
)
from jaxsampler.types import RolloutState, Trajectory

__all__ = ["env_mesh", "make_sharded_rollout", "init_sharded_state", "state_sharding"]

AXIS = "env"


def env_mesh(devices: Sequence[jax.Device] | int | None = None) -> Mesh:
    """A 1-D mesh named ``"env"`` over ``devices`` (default: all; an int takes the first n)."""
    if devices is None:
        devices = jax.devices()
    elif isinstance(devices, int):
        if not 1 <= devices <= jax.device_count():
            raise ValueError(
                f"asked for {devices} devices, {jax.device_count()} available "
                "(on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=N before importing "
                "jax)"
            )
        devices = jax.devices()[:devices]
    return Mesh(np.asarray(list(devices)), (AXIS,))


def _state_specs(env: Env, state: RolloutState) -> RolloutState:
    """``PartitionSpec`` leaves: env-axis leaves split (per-env params and the transforms'
    per-row state included); the key, the counter, shared params and the transforms'
    shared statistics replicated."""
    split: RolloutState = jax.tree.map(lambda _: P(AXIS), state)
    replicated: Any = P()  # a spec where the field holds an array
    num_envs = state.needs_reset.shape[0]
    axes = vector.param_axes(env, state.env_params, num_envs)
    if axes is None:
        params = jax.tree.map(lambda _: P(), state.env_params)
    else:
        params = jax.tree.map(
            lambda _, ax: P(AXIS) if ax == 0 else P(),
            state.env_params,
            axes,
            is_leaf=lambda x: x is None,
        )
    tstate = state.transform_state
    if tstate is not None:
        tstate = dataclasses.replace(
            split.transform_state,
            stages=tuple(
                dataclasses.replace(st, shared=jax.tree.map(lambda _: P(), st.shared))
                for st in split.transform_state.stages
            ),
        )
    return dataclasses.replace(
        split,
        key=replicated,
        num_steps=replicated,
        env_params=params,
        transform_state=tstate,
    )


def _traj_specs(traj: Trajectory) -> Trajectory:
    """``PartitionSpec`` leaves: time-major buffers split on axis 1, the slot-0 records on 0."""
    split: Trajectory = jax.tree.map(lambda _: P(None, AXIS), traj)
    env_axis: Any = P(AXIS)  # a spec where the field holds an array
    return dataclasses.replace(
        split,
        episode_count_0=env_axis,
        episode_step_0=env_axis,
        policy_state_0=jax.tree.map(lambda _: P(AXIS), traj.policy_state_0),
    )


def state_sharding(env: Env, state: RolloutState, mesh: Mesh) -> RolloutState:
    """``NamedSharding``s that split every env-axis leaf of ``state`` over ``mesh``."""
    return jax.tree.map(
        lambda spec: NamedSharding(mesh, spec),
        _state_specs(env, state),
        is_leaf=lambda x: isinstance(x, P),
    )


def init_sharded_state(
    env: Env,
    policy: Policy,
    num_envs: int,
    key: jax.Array,
    mesh: Mesh,
    env_params: Any = None,
    transforms: Transforms = None,
) -> RolloutState:
    """:func:`~jaxsampler.rollout.init_rollout_state`, placed on ``mesh`` (env axis split)."""
    _check_divisible(num_envs, mesh)
    state = init_rollout_state(env, policy, num_envs, key, env_params, transforms)
    return jax.device_put(state, state_sharding(env, state, mesh))


def _check_divisible(num_envs: int, mesh: Mesh) -> None:
    _check_sizes(num_envs)
    n = mesh.shape[AXIS]
    if num_envs % n:
        raise ValueError(f"num_envs={num_envs} is not divisible by the {n} devices of the mesh")


def make_sharded_rollout(
    env: Env,
    policy: Policy,
    num_envs: int,
    rollout_length: int,
    mesh: Mesh,
    transforms: Transforms = None,
) -> Rollout:
    """Like :func:`~jaxsampler.rollout.make_rollout`, with the env axis split over ``mesh``.

    Returns a :class:`~jaxsampler.rollout.Rollout` whose call,
    ``rollout(params, state, buffers=None) -> (state, traj)``, takes replicated
    ``params`` and a ``state`` from its ``init(key)`` (or :func:`init_sharded_state`),
    and returns a trajectory sharded along its env axis (axis 1); ``allocate`` places
    the buffers the same way. ``transforms`` as for
    :func:`~jaxsampler.rollout.make_rollout`: their statistics are reduced over the mesh,
    so every device holds the global ones. Jittable; wrap with
    :func:`~jaxsampler.rollout.jit_rollout` to donate state and buffers.
    """
    _check_divisible(num_envs, mesh)
    per_device = num_envs // mesh.shape[AXIS]
    pipe = pipeline_of(env, transforms)
    inner = make_rollout(env, policy, per_device, rollout_length, shard_axis=AXIS, transforms=pipe)

    def run(
        params: Any, state: RolloutState, buffers: Trajectory | None = None
    ) -> tuple[RolloutState, Trajectory]:
        if buffers is None:
            buffers = allocate_trajectory(env, policy, rollout_length, params, state, pipe)
        sspec, tspec = _state_specs(env, state), _traj_specs(buffers)
        pspec = jax.tree.map(lambda _: P(), params)
        fn = jax.shard_map(
            inner.run,
            mesh=mesh,
            in_specs=(pspec, sspec, tspec),
            out_specs=(sspec, tspec),
            check_vma=False,
        )
        out: tuple[RolloutState, Trajectory] = fn(params, state, buffers)
        return out

    def allocate(params: Any, state: RolloutState) -> Trajectory:
        traj = allocate_trajectory(env, policy, rollout_length, params, state, pipe)
        specs = _traj_specs(traj)
        placed: Trajectory = jax.tree.map(
            lambda x, spec: jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec)),
            traj,
            specs,
            is_leaf=lambda x: isinstance(x, P),
        )
        return placed

    def init(key: jax.Array, env_params: Any = None) -> RolloutState:
        return init_sharded_state(env, policy, num_envs, key, mesh, env_params, pipe)

    return Rollout(
        int(num_envs),
        inner.rollout_length,
        inner.num_agents,
        run=run,
        init=init,
        allocate=allocate,
        pipeline=pipe,
    )
