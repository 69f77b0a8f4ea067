"""Scaling the env axis across devices and processes: ``mesh=`` of the rollout, by name.

``make_rollout(..., mesh=...)`` and ``init_rollout_state(..., mesh=...)`` split the env axis
over a mesh (:mod:`jaxsampler.placement` says how); this module keeps the names earlier
versions used for the same thing. On a CPU host,
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (set before JAX is imported)
exposes N CPU devices; one per core, each running its own slice of the envs, is how one
process uses the whole machine. The same code path splits envs across GPUs, or across
processes and hosts after :func:`jaxsampler.distributed.initialize`.

``num_envs`` is the global width; it must be divisible by the number of devices (the error
names the nearest valid counts). Every env keeps its own PRNG stream on any device count.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Mesh

from jaxsampler.envs.base import Env
from jaxsampler.placement import env_mesh, state_sharding
from jaxsampler.policies.base import Policy
from jaxsampler.rollout import Rollout, Transforms, init_rollout_state, make_rollout
from jaxsampler.types import RolloutState

__all__ = ["env_mesh", "make_sharded_rollout", "init_sharded_state", "state_sharding"]


def init_sharded_state(
    env: Env,
    policy: Policy,
    num_envs: int,
    key: jax.Array,
    mesh: Mesh,
    env_params: Any = None,
    transforms: Transforms = None,
) -> RolloutState:
    """``init_rollout_state(..., mesh=mesh)``."""
    return init_rollout_state(env, policy, num_envs, key, env_params, transforms, mesh=mesh)


def make_sharded_rollout(
    env: Env,
    policy: Policy,
    num_envs: int,
    rollout_length: int,
    mesh: Mesh,
    transforms: Transforms = None,
) -> Rollout:
    """``make_rollout(..., mesh=mesh)``: the env axis split over ``mesh``.

    ``rollout(params, state, buffers=None) -> (state, traj)`` takes replicated ``params``
    and a ``state`` from its ``init(key)`` (or :func:`init_sharded_state`), and returns a
    trajectory sharded along its env axis (axis 1). Transforms' statistics are global
    (reduced over the mesh). Jittable; wrap with :func:`~jaxsampler.rollout.jit_rollout`
    to donate state and buffers.
    """
    return make_rollout(env, policy, num_envs, rollout_length, transforms=transforms, mesh=mesh)
