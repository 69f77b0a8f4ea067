"""Where envs run: the env axis of a rollout split over a mesh of devices (and processes).

A sampled rollout is written once, as code over the whole (global) env axis. Given a mesh,
its state and trajectory are placed with the env axis split over the mesh's ``"env"`` axis
and XLA partitions the jitted scan (GSPMD): each device steps its own slice of envs, and
reductions over envs (a normalizer's statistics) become collectives. Because JAX's
threefry PRNG is partitionable, every env and every policy draw gets the same random bits on
any number of devices: what differs across device counts is float rounding only (XLA may
compile a slice of the envs to slightly different instructions than the whole axis), never a
random stream.

Multi-process (``jax.distributed``): the mesh spans every process's devices; each process
holds (and converts on its host) the envs of its own devices: the contiguous global slice
:func:`local_env_slice`.
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
from jaxsampler.types import RolloutState, Trajectory

__all__ = [
    "AXIS",
    "MeshLike",
    "as_mesh",
    "check_divisible",
    "env_mesh",
    "local_env_slice",
    "state_sharding",
    "state_specs",
    "to_host",
    "traj_sharding",
    "traj_specs",
]

#: The mesh axis the env axis is split over.
AXIS = "env"

#: What ``mesh=`` accepts: a :class:`~jax.sharding.Mesh` with an ``"env"`` axis, a sequence of
#: devices, a device count (the first n of ``jax.devices()``), or ``None`` (no mesh).
MeshLike = Mesh | Sequence[jax.Device] | int | None


def env_mesh(devices: Sequence[jax.Device] | int | None = None) -> Mesh:
    """A 1-D mesh named ``"env"`` over ``devices`` (default: all devices of all processes; an
    int takes the first n).

    Raises:
        ValueError: more devices asked for than exist (the message says how to get more CPU
            devices).
    """
    if devices is None:
        devices = jax.devices()
    elif isinstance(devices, (int, np.integer)) and not isinstance(devices, bool):
        if not 1 <= devices <= jax.device_count():
            raise ValueError(
                f"asked for {devices} devices, {jax.device_count()} available "
                "(on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=N before importing "
                "jax)"
            )
        devices = jax.devices()[: int(devices)]
    listed = list(devices)  # type: ignore[arg-type]
    if not listed:
        raise ValueError("a mesh needs at least one device")
    return Mesh(np.asarray(listed), (AXIS,))


def as_mesh(mesh: MeshLike) -> Mesh | None:
    """``mesh=`` normalized: ``None`` stays ``None``; devices or a count become
    :func:`env_mesh`; a :class:`Mesh` must have an ``"env"`` axis.

    Raises:
        ValueError: a mesh without an ``"env"`` axis, or a bad device count.
        TypeError: anything else.
    """
    if mesh is None or isinstance(mesh, Mesh):
        if isinstance(mesh, Mesh) and AXIS not in mesh.axis_names:
            raise ValueError(
                f"the mesh must have an {AXIS!r} axis to split envs over, got axes "
                f"{tuple(mesh.axis_names)}"
            )
        return mesh
    if isinstance(mesh, bool):
        raise TypeError(f"mesh= takes a Mesh, devices or a device count, got {mesh!r}")
    if isinstance(mesh, (int, np.integer)):
        return env_mesh(int(mesh))
    if isinstance(mesh, Sequence) and all(isinstance(d, jax.Device) for d in mesh):
        return env_mesh(mesh)
    raise TypeError(f"mesh= takes a Mesh, devices or a device count, got {type(mesh).__name__}")


def num_shards(mesh: Mesh) -> int:
    """How many slices the env axis is cut into."""
    return int(mesh.shape[AXIS])


def check_divisible(num_envs: int, mesh: Mesh) -> None:
    """Raises ``ValueError`` naming the nearest valid env counts if ``num_envs`` cannot be
    split evenly over the mesh."""
    n = num_shards(mesh)
    if num_envs % n:
        lo = (num_envs // n) * n
        near = [c for c in (lo, lo + n) if c >= 1]
        where = f"{n} devices" + (
            f" of {jax.process_count()} processes" if jax.process_count() > 1 else ""
        )
        raise ValueError(
            f"num_envs={num_envs} cannot be split evenly over the {where} of the mesh; "
            f"nearest valid: {' or '.join(str(c) for c in near)}"
        )


def local_env_slice(mesh: Mesh, num_envs: int) -> slice:
    """The global env indices this process holds (its devices' slices, contiguous when the
    mesh lists each process's devices together, as :func:`env_mesh` does).

    Raises:
        ValueError: this process's slices are not contiguous (a hand-made mesh that
            interleaves processes).
    """
    per = num_envs // num_shards(mesh)
    mine = [
        i for i, d in enumerate(mesh.devices.reshape(-1)) if d.process_index == jax.process_index()
    ]
    if not mine:
        return slice(0, 0)
    if mine != list(range(mine[0], mine[0] + len(mine))):
        raise ValueError(
            "this process's devices are not contiguous in the mesh; build it with "
            "jaxsampler.rollout.placement.env_mesh() so each process holds one slice of envs"
        )
    return slice(mine[0] * per, (mine[-1] + 1) * per)


def state_specs(env: Any, state: RolloutState) -> RolloutState:
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


def traj_specs(traj: Trajectory) -> Trajectory:
    """``PartitionSpec`` leaves: time-major buffers split on axis 1, the slot-0 records on 0."""
    split: Trajectory = jax.tree.map(lambda _: P(None, AXIS), traj)
    env_axis: Any = P(AXIS)  # a spec where the field holds an array
    return dataclasses.replace(
        split,
        episode_count_0=env_axis,
        episode_step_0=env_axis,
        policy_state_0=jax.tree.map(lambda _: P(AXIS), traj.policy_state_0),
    )


def _named(mesh: Mesh, specs: Any) -> Any:
    return jax.tree.map(
        lambda spec: NamedSharding(mesh, spec), specs, is_leaf=lambda x: isinstance(x, P)
    )


def state_sharding(env: Any, state: RolloutState, mesh: Mesh) -> RolloutState:
    """``NamedSharding``s that split every env-axis leaf of ``state`` over ``mesh``."""
    out: RolloutState = _named(mesh, state_specs(env, state))
    return out


def traj_sharding(traj: Trajectory, mesh: Mesh) -> Trajectory:
    """``NamedSharding``s that split a trajectory's env axis (axis 1) over ``mesh``."""
    out: Trajectory = _named(mesh, traj_specs(traj))
    return out


def constrain(tree: Any, shardings: Any) -> Any:
    """``jax.lax.with_sharding_constraint`` leaf by leaf (a no-op tree when ``shardings``
    is ``None``)."""
    if shardings is None:
        return tree
    return jax.tree.map(jax.lax.with_sharding_constraint, tree, shardings)


def _leaf_to_host(x: Any) -> np.ndarray:
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
        return np.asarray(x)
    # Multi-process: this process's shards, in global order, each slice once.
    seen: dict[tuple[tuple[int | None, int | None], ...], np.ndarray] = {}
    for shard in x.addressable_shards:
        idx = tuple((s.start, s.stop) for s in shard.index)
        seen.setdefault(idx, np.asarray(shard.data))
    if len(seen) == 1:
        return next(iter(seen.values()))
    axes = [a for a in range(x.ndim) if len({k[a] for k in seen}) > 1]
    if len(axes) != 1:
        raise ValueError(f"cannot assemble local shards split over axes {axes}")
    axis = axes[0]
    parts = sorted(seen.items(), key=lambda kv: kv[0][axis][0] or 0)
    return np.concatenate([v for _, v in parts], axis=axis)


def to_host(tree: Any) -> Any:
    """``jax.device_get`` that also works on arrays spread over processes: a leaf that this
    process cannot see whole comes back as the concatenation of its own shards (its local
    envs, in global order); replicated leaves come back whole."""
    leaves, treedef = jax.tree.flatten(tree)
    if all(not isinstance(x, jax.Array) or x.is_fully_addressable for x in leaves):
        return jax.device_get(tree)
    return jax.tree.unflatten(treedef, [_leaf_to_host(x) for x in leaves])
