"""Throughput measurement of jaxsampler rollouts (the ``jaxsampler bench`` command; the
benchmark scripts in ``benchmarks/`` use it too).

Compile time and steady-state time are measured separately; every timed call blocks on
its result before the clock is read; figures are medians over repeats. The scripts' own
bookkeeping (result files, git state, progress lines) is ``benchmarks/harness.py``'s.
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxsampler.envs.registry import make_jax_env
from jaxsampler.policies import MLPPolicy, Policy, RandomPolicy
from jaxsampler.rollout import jit_rollout, make_rollout
from jaxsampler.types import Trajectory

__all__ = [
    "compile_count",
    "environment_info",
    "time_calls",
    "measure_rollout",
    "sweep",
]


_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_compiles = {"count": 0, "listening": False}


def _on_event(event: str, duration_secs: float, **kwargs: str | int) -> None:
    if event == _BACKEND_COMPILE:
        _compiles["count"] += 1


def compile_count() -> int:
    """XLA compilations in this process since the first call of this function, counted
    from JAX's public monitoring events (any jitted function, not one cache): the
    difference of two calls is what compiled in between, e.g. 0 while timing."""
    if not _compiles["listening"]:
        jax.monitoring.register_event_duration_secs_listener(_on_event)
        _compiles["listening"] = True
    return _compiles["count"]


def environment_info() -> dict[str, Any]:
    """Versions, thread settings and devices: recorded with every benchmark result."""
    import flax

    info = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "jax": jax.__version__,
        "jaxlib": getattr(jax.lib, "__version__", None) or _jaxlib_version(),
        "flax": flax.__version__,
        "numpy": np.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "device_count": jax.device_count(),
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
        "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", ""),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", ""),
    }
    with contextlib.suppress(AttributeError):  # not on every OS
        info["affinity"] = sorted(os.sched_getaffinity(0))
    return info


def _jaxlib_version() -> str:
    import jaxlib

    return jaxlib.__version__


def time_calls(fn: Callable[[], Any], repeats: int) -> list[float]:
    """Wall times of ``repeats`` calls of ``fn``, each blocked until its result is ready."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return times


def measure_rollout(
    env_id: str = "CartPole-v1",
    num_envs: int = 1024,
    rollout_length: int = 128,
    *,
    policy: str = "mlp",
    hidden_sizes: Sequence[int] = (64, 64),
    repeats: int = 5,
    seed: int = 0,
    num_devices: int = 1,
    on_call: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Times ``jit_rollout(make_rollout(...))`` on one env id and width.

    Returns a dict with ``compile_s`` (first call: trace + compile + one run),
    ``median_s`` (steady state), ``env_steps_per_s`` (``E * T / median_s``, reset steps
    included) and ``actions_per_s`` (agent actions actually taken per second: acting
    agents only, so reset steps are not counted). ``num_devices > 1`` splits the env
    axis over that many devices (``make_rollout(..., mesh=num_devices)``). ``on_call``
    is called after the compiling call and after each timed one (outside the timing; a
    progress bar's hook), ``repeats + 1`` times in all.

    Raises:
        TypeError: ``env_id`` names a host-stepped env (``"gym:<id>"``).
    """
    env = make_jax_env(env_id)
    pol: Policy
    if policy == "mlp":
        pol = MLPPolicy(env.observation_space, env.action_space, tuple(hidden_sizes))
    elif policy == "random":
        pol = RandomPolicy(env.observation_space, env.action_space)
    else:
        raise ValueError(f"policy must be 'mlp' or 'random', got {policy!r}")
    key = jax.random.PRNGKey(seed)
    params = pol.init(key)
    mesh = num_devices if num_devices > 1 else None
    rollout = jit_rollout(make_rollout(env, pol, num_envs, rollout_length, mesh=mesh))
    state = rollout.init(jax.random.fold_in(key, 1))
    t0 = time.perf_counter()
    state, traj = rollout(params, state)
    jax.block_until_ready(traj)
    compile_s = time.perf_counter() - t0
    if on_call is not None:
        on_call()
    acted = []

    def call() -> Trajectory:
        nonlocal state, traj
        state, traj = rollout(params, state, traj)
        return traj

    times = []
    for _ in range(repeats):
        times.extend(time_calls(call, 1))
        acted.append(int(np.asarray(traj.acting).sum()))
        if on_call is not None:
            on_call()
    med = statistics.median(times)
    steps = num_envs * rollout_length
    return {
        "env_id": env_id,
        "num_envs": num_envs,
        "rollout_length": rollout_length,
        "policy": policy,
        "num_devices": num_devices,
        "compile_s": compile_s,
        "median_s": med,
        "times_s": times,
        "env_steps_per_s": steps / med,
        "actions_per_s": statistics.median(acted) / med,
        "acting_fraction": statistics.median(acted) / (steps * env.num_agents),
    }


def sweep(
    widths: Sequence[int],
    progress: Callable[[str], None] | None = None,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """:func:`measure_rollout` at each width; ``progress`` receives a line per stage."""
    rows = []
    for i, w in enumerate(widths):
        if progress:
            progress(f"[{i + 1}/{len(widths)}] width {w}: compiling and timing ...")
        rows.append(measure_rollout(num_envs=w, **kwargs))
    return rows
