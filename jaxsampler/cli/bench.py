"""Throughput measurement of jaxsampler rollouts (the ``jaxsampler bench`` command; the
benchmark scripts in ``benchmarks/`` use it too).

Compile time and steady-state time are measured separately; every timed call blocks on
its result before the clock is read; figures are medians over repeats.
:func:`compare_rollout` times the baselines of :mod:`jaxsampler.cli.baseline` (the
hand-written ``vmap`` + ``scan`` rollout, Gymnasium's ``SyncVectorEnv``) in turn with
jaxsampler's rollout, so that their ratios hold under any machine load. The scripts' own
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

from jaxsampler.cli.baseline import (
    hand_unsupported,
    make_gym_loop,
    make_hand_rollout,
    time_gym_call,
)
from jaxsampler.envs.base import Env
from jaxsampler.envs.registry import make_jax_env
from jaxsampler.policies import MLPPolicy, Policy, random_policy
from jaxsampler.rollout import jit_rollout, make_rollout
from jaxsampler.types import Trajectory

__all__ = [
    "compare_rollout",
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


def _make_policy(env: Env, policy: str, hidden_sizes: Sequence[int]) -> Policy:
    if policy == "mlp":
        return MLPPolicy(env.observation_space, env.action_space, tuple(hidden_sizes))
    if policy == "random":
        return random_policy(env)  # each agent group from its own action space
    raise ValueError(f"policy must be 'mlp' or 'random', got {policy!r}")


class _Jaxsampler:
    """jaxsampler's jitted rollout of one env and width: :meth:`compile` makes the first
    call; each :meth:`call` times one more and counts the agents that acted in it."""

    def __init__(
        self, env: Env, policy: Policy, num_envs: int, rollout_length: int, seed: int, ndev: int
    ):
        key = jax.random.PRNGKey(seed)
        self.params = policy.init(key)
        mesh = ndev if ndev > 1 else None
        self.rollout = jit_rollout(make_rollout(env, policy, num_envs, rollout_length, mesh=mesh))
        self.state = self.rollout.init(jax.random.fold_in(key, 1))
        self.traj: Trajectory | None = None

    def compile(self) -> float:
        t0 = time.perf_counter()
        self.state, self.traj = self.rollout(self.params, self.state)
        jax.block_until_ready(self.traj)
        return time.perf_counter() - t0

    def call(self) -> tuple[float, int]:
        def run() -> Trajectory:
            self.state, self.traj = self.rollout(self.params, self.state, self.traj)
            return self.traj

        (seconds,) = time_calls(run, 1)
        assert self.traj is not None
        return seconds, int(np.asarray(self.traj.acting).sum())


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
    runner = _Jaxsampler(
        env,
        _make_policy(env, policy, hidden_sizes),
        num_envs,
        rollout_length,
        seed,
        num_devices,
    )
    compile_s = runner.compile()
    if on_call is not None:
        on_call()
    times, acted = [], []
    for _ in range(repeats):
        seconds, n = runner.call()
        times.append(seconds)
        acted.append(n)
        if on_call is not None:
            on_call()
    return _row(env, env_id, num_envs, rollout_length, policy, num_devices, compile_s, times, acted)


def _row(
    env: Env,
    env_id: str,
    num_envs: int,
    rollout_length: int,
    policy: str,
    num_devices: int,
    compile_s: float,
    times: list[float],
    acted: list[int],
) -> dict[str, Any]:
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


def compare_rollout(
    env_id: str,
    num_envs: int,
    rollout_length: int,
    *,
    policy: str = "mlp",
    hidden_sizes: Sequence[int] = (64, 64),
    repeats: int = 5,
    seed: int = 0,
    num_devices: int = 1,
    hand_written: bool = True,
    gym_id: str | None = None,
    gym_steps: int = 0,
    on_call: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """:func:`measure_rollout`, with the baselines timed in turn with it.

    Each repeat times one call of every loop, the order rotating from repeat to repeat,
    so the loops see the same machine load; a ratio is the median over repeats of the
    paired ratios.

    Args:
        env_id, num_envs, rollout_length, policy, hidden_sizes, repeats, seed,
            num_devices, on_call: as for :func:`measure_rollout`.
        hand_written: also time :func:`~jaxsampler.cli.baseline.make_hand_rollout` (the
            same env, policy params, keys and ``T``, one device).
        gym_id: also time Gymnasium's ``SyncVectorEnv`` of this id at ``num_envs``,
            ``gym_steps`` steps per call (``None`` or ``gym_steps < 1``: not).

    Returns:
        :func:`measure_rollout`'s dict plus ``hand_compile_s``, ``hand_median_s``,
        ``hand_times_s``, ``hand_actions_per_s`` and ``vs_hand_written`` (hand-written
        seconds / jaxsampler seconds per call: above 1, jaxsampler is faster), and
        ``gym_id``, ``gym_steps_per_call``, ``gym_median_s``, ``gym_times_s``,
        ``gym_actions_per_s`` and ``vs_sync_vector_env`` (jaxsampler's actions/s /
        ``SyncVectorEnv``'s); each ``None`` where that loop did not run.
    """
    env = make_jax_env(env_id)
    pol = _make_policy(env, policy, hidden_sizes)
    runner = _Jaxsampler(env, pol, num_envs, rollout_length, seed, num_devices)
    compile_s = runner.compile()
    timers: dict[str, Callable[[], tuple[float, int]]] = {"js": runner.call}
    hand_compile_s = None
    if hand_written and hand_unsupported(env, policy) is None:
        hand = make_hand_rollout(env, policy, num_envs, rollout_length)
        carry = hand.init(jax.random.fold_in(jax.random.PRNGKey(seed), 1))
        t0 = time.perf_counter()
        carry, out = jax.block_until_ready(hand.run(runner.params, carry))
        hand_compile_s = time.perf_counter() - t0

        def hand_call() -> tuple[float, int]:
            nonlocal carry
            t0 = time.perf_counter()
            carry, _ = jax.block_until_ready(hand.run(runner.params, carry))
            return time.perf_counter() - t0, 0

        timers["hand"] = hand_call
    gym = None
    if gym_id is not None and gym_steps >= 1:
        gym = make_gym_loop(gym_id, num_envs, gym_steps, env, policy, runner.params, seed)
        gym.call()  # warm-up: the first steps check the env (Gymnasium's env checker)
        timers["gym"] = lambda: time_gym_call(gym)
    if on_call is not None:
        on_call()
    times: dict[str, list[float]] = {k: [] for k in timers}
    acted: dict[str, list[int]] = {k: [] for k in timers}
    names = list(timers)
    try:
        for r in range(repeats):
            for k in names[r % len(names) :] + names[: r % len(names)]:
                seconds, n = timers[k]()
                times[k].append(seconds)
                acted[k].append(n)
            if on_call is not None:
                on_call()
    finally:
        if gym is not None:
            gym.close()
    row = _row(
        env,
        env_id,
        num_envs,
        rollout_length,
        policy,
        num_devices,
        compile_s,
        times["js"],
        acted["js"],
    )
    js_rates = [a / t for a, t in zip(acted["js"], times["js"])]
    row.update(dict.fromkeys(_BASELINE_KEYS))
    if "hand" in times:
        row.update(
            hand_compile_s=hand_compile_s,
            hand_median_s=statistics.median(times["hand"]),
            hand_times_s=times["hand"],
            # the same trajectory: the same actions as jaxsampler's in each call
            hand_actions_per_s=statistics.median(a / t for a, t in zip(acted["js"], times["hand"])),
            vs_hand_written=statistics.median(h / j for h, j in zip(times["hand"], times["js"])),
        )
    if "gym" in times:
        gym_rates = [a / t for a, t in zip(acted["gym"], times["gym"])]
        row.update(
            gym_id=gym_id,
            gym_steps_per_call=gym_steps,
            gym_median_s=statistics.median(times["gym"]),
            gym_times_s=times["gym"],
            gym_actions_per_s=statistics.median(gym_rates),
            vs_sync_vector_env=statistics.median(j / g for j, g in zip(js_rates, gym_rates)),
        )
    return row


_BASELINE_KEYS = (
    "hand_compile_s",
    "hand_median_s",
    "hand_times_s",
    "hand_actions_per_s",
    "vs_hand_written",
    "gym_id",
    "gym_steps_per_call",
    "gym_median_s",
    "gym_times_s",
    "gym_actions_per_s",
    "vs_sync_vector_env",
)


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
