"""Pooled auto-reset vs the exact default: ProcMaze-v0 (expensive reset) and CartPole-v1.

Every variant is the same jitted rollout (:func:`jaxsampler.jit_rollout`, state and buffers
donated and passed back) of the same 64x64 tanh :class:`~jaxsampler.MLPPolicy` at W = 4096
envs, differing only in ``reset_pool=``:

* ``exact``: ``reset_pool=None``, every env computes a reset at every step (the default);
* ``pool P``: ``reset_pool=ResetPool(P)``, ``P`` resets per call;
* ``pool P/k``: ``ResetPool(P, refresh_every=k)``, ``P`` resets every ``k`` steps.

ProcMaze-v0 (8x8 cells: a randomized depth-first search and a breadth-first search per
reset; time limit 24 steps here, so that every call resets envs: a random-weights MLP
rarely reaches the goal) runs T = 32 steps per call, CartPole-v1 T = 128. All variants of
one env are compiled first (compile time reported separately), then timed round-robin in a rotating
order so machine noise hits them alike (after two untimed warm-up calls each); each figure
is the median over repeats of the median of ``inner`` calls (3 for CartPole, 1 for
ProcMaze), each call blocked on before the clock is read. Speedup = exact time / variant time.

Usage::

    python -m benchmarks.reset_pool           # full run, writes benchmarks/results/reset_pool.*
    python -m benchmarks.reset_pool --quick   # smoke test (W = 256), prints the table only
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import jax
import numpy as np

import jaxsampler as js
from benchmarks import harness
from benchmarks.harness import log
from jaxsampler.cli.bench import environment_info, time_calls
from jaxsampler.envs.registry import make_jax_env
from jaxsampler.vector import ResetPool

#: (env id, rollout length, variants): name -> reset_pool=.
SETUPS: list[tuple[str, int, dict[str, ResetPool | None]]] = [
    (
        "ProcMaze-v0",
        32,
        {
            "exact": None,
            "pool 64": ResetPool(64),
            "pool 256": ResetPool(256),
            "pool 256/8": ResetPool(256, refresh_every=8),
        },
    ),
    (
        "CartPole-v1",
        128,
        {
            "exact": None,
            "pool 256": ResetPool(256),
            "pool 1024": ResetPool(1024),
            "pool 256/32": ResetPool(256, refresh_every=32),
        },
    ),
]


def build(env_id: str, num_envs: int, T: int, pool: ResetPool | None) -> Any:
    env = make_jax_env(env_id)
    policy = js.MLPPolicy(env.observation_space, env.action_space, (64, 64))
    params = policy.init(jax.random.PRNGKey(0))
    rollout = js.jit_rollout(js.make_rollout(env, policy, num_envs, T, reset_pool=pool))
    env_params = env.default_params
    if env_id == "ProcMaze-v0":  # episodes end within a call, so calls do reset envs
        env_params = env_params.replace(max_steps_in_episode=24)
    state = rollout.init(jax.random.PRNGKey(1), env_params)
    t0 = time.perf_counter()
    state, traj = rollout(params, state)
    jax.block_until_ready(traj)
    compile_s = time.perf_counter() - t0
    box = {"state": state, "traj": traj}

    def call() -> Any:
        box["state"], box["traj"] = rollout(params, box["state"], box["traj"])
        return box["traj"]

    return call, compile_s, box


def measure(
    env_id: str, T: int, variants: dict[str, Any], W: int, repeats: int, inner: int
) -> list[dict]:
    log(f"{env_id}: compiling {len(variants)} variants at W={W}, T={T}")
    built = {name: build(env_id, W, T, pool) for name, pool in variants.items()}
    for name in variants:  # warm-up calls, untimed (first-touch allocations)
        time_calls(built[name][0], 2)
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(repeats):
        for name in harness.rotated(list(variants), r):
            c0 = time.process_time()
            times[name].append(statistics.median(time_calls(built[name][0], inner)))
            cpu[name].append((time.process_time() - c0) / inner)
        log(f"{env_id}: repeat {r + 1}/{repeats}")
    base = statistics.median(times["exact"])
    base_min, base_cpu = min(times["exact"]), statistics.median(cpu["exact"])
    rows = []
    for name, pool in variants.items():
        med = statistics.median(times[name])
        traj = built[name][2]["traj"]
        rows.append(
            {
                "env_id": env_id,
                "variant": name,
                "pool_size": None if pool is None else pool.size,
                "refresh_every": None if pool is None else pool.refresh_every,
                "num_envs": W,
                "rollout_length": T,
                "compile_s": built[name][1],
                "median_s": med,
                "times_s": times[name],
                "env_steps_per_s": W * T / med,
                "resets_per_call": int(np.asarray(traj.is_reset).sum()),
                "speedup_vs_exact": base / med,
                "min_s": min(times[name]),
                "speedup_vs_exact_min": base_min / min(times[name]),
                "cpu_s": statistics.median(cpu[name]),
                "cpu_speedup_vs_exact": base_cpu / statistics.median(cpu[name]),
            }
        )
    return rows


def markdown(rows: list[dict], info: dict[str, Any]) -> str:
    lines = [
        "# Pooled auto-reset vs exact (benchmarks/reset_pool.py)",
        "",
        f"W = {rows[0]['num_envs']} envs, 64x64 tanh MLP policy, one XLA CPU device; medians "
        "over repeats, variants timed round-robin. Machine: "
        f"{info['cpu_count']} cores (shared with other jobs while measured), jax {info['jax']}.",
        "",
        "Speedups: of the median wall time, of the fastest call, and of the median process "
        "CPU time (all threads; less sensitive to other jobs on a shared machine).",
        "",
        "| env | T | variant | median s/call | env steps/s | resets/call | speedup (median) "
        "| speedup (min) | speedup (CPU time) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['env_id']} | {r['rollout_length']} | {r['variant']} | {r['median_s']:.4f} | "
            f"{r['env_steps_per_s']:,.0f} | {r['resets_per_call']} | "
            f"{r['speedup_vs_exact']:.2f}x | {r['speedup_vs_exact_min']:.2f}x | "
            f"{r['cpu_speedup_vs_exact']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="W=256, 2 repeats, no files")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--only", help="one env id of the table (no files written)")
    args = parser.parse_args()
    W, repeats = (256, 2) if args.quick else (4096, args.repeats)
    info = environment_info()
    rows = []
    for env_id, T, variants in SETUPS:
        if args.only and env_id != args.only:
            continue
        reps = max(3, repeats // 2) if env_id == "ProcMaze-v0" and not args.quick else repeats
        inner = 1 if env_id == "ProcMaze-v0" or args.quick else 3
        rows.extend(measure(env_id, T, variants, W, reps, inner))
    results = {"rows": rows, "environment": info, "git": harness.git_state()}
    out = None if args.quick or args.only else harness.RESULTS_DIR
    harness.finish(results, markdown(rows, info), "reset_pool", out)


if __name__ == "__main__":
    main()
