"""Construction helpers of :class:`~jaxsampler.sampling.device.DeviceSampler`: the
mesh of its ``devices=`` / ``mesh=`` arguments, the env of an id, stable reprs for its
checkpoint fingerprint."""

from __future__ import annotations

import os
import re
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from jaxsampler.envs.base import Env
from jaxsampler.rollout import placement

__all__ = [
    "ACCELERATOR_HOST_THREADS",
    "cores",
    "default_host_threads",
    "resolve_env",
    "sampler_mesh",
    "stable_repr",
]


def stable_repr(obj: Any) -> str:
    """``repr(obj)`` without memory addresses (``<function f at 0x7f..>`` -> ``<function
    f>``), so that the same configuration gives the same text in every process."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(obj))


def sampler_mesh(devices: Any, mesh: Any) -> Mesh | None:
    """The mesh of ``devices=`` / ``mesh=`` (``None``: neither given)."""
    if devices is not None and mesh is not None:
        raise ValueError(
            "give devices= (a device count or a list of devices) or mesh= (a jax Mesh with "
            "an 'env' axis), not both"
        )
    if mesh is not None:
        if not isinstance(mesh, Mesh):
            raise TypeError(
                "mesh= takes a jax.sharding.Mesh with an 'env' axis, got "
                f"{type(mesh).__name__} (for a device count or a list of devices use devices=)"
            )
        return placement.as_mesh(mesh)
    if devices is None:
        return None
    if isinstance(devices, Mesh):
        raise TypeError("devices= takes a device count or a list of devices; pass a Mesh as mesh=")
    ok_count = isinstance(devices, (int, np.integer)) and not isinstance(devices, bool)
    ok_list = isinstance(devices, (list, tuple)) and all(isinstance(d, jax.Device) for d in devices)
    if not (ok_count or ok_list):
        raise TypeError(
            f"devices= takes a device count (an int) or a list of jax devices, got {devices!r}"
        )
    return placement.as_mesh(int(devices) if ok_count else list(devices))


def resolve_env(env: Env | str) -> Env:
    """The env itself, or the pure-JAX env a registered id names."""
    if isinstance(env, str):
        from jaxsampler.envs.registry import make_jax_env

        return make_jax_env(env)  # a "gym:" id gets a TypeError that says where it belongs
    return env


def cores() -> int:
    """The machine's core count (at least 1)."""
    return os.cpu_count() or 1


#: conversion threads of a sampler on GPU / TPU devices by default (at most one per core)
ACCELERATOR_HOST_THREADS = 8


def default_host_threads(mesh: Mesh | None) -> int:
    """``host_threads=None``'s thread count. On CPU devices one per local device of the
    mesh (XLA's CPU runtime computes on the same cores: a second thread for one device's
    conversion measured no steadier gain on a 2-core machine, some calls taking twice as
    long); on GPU / TPU devices, whose host cores idle while the device computes,
    :data:`ACCELERATOR_HOST_THREADS` (or one per local device, if more). At most one per
    core, at least 1."""
    devices = list(mesh.local_devices) if mesh is not None else [jax.local_devices()[0]]
    if devices[0].platform == "cpu":
        wanted = len(devices)
    else:
        wanted = max(len(devices), ACCELERATOR_HOST_THREADS)
    return max(1, min(wanted, cores()))
