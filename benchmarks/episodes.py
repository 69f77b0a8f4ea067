"""What conversion costs: ``Sampler.sample()`` / ``sample_batch()`` vs the bare rollout.

Cells: CartPole-v1 (1 agent) at 1024 envs and Spread(8) at 64, 1024 and 4096 envs, each
with a random policy and a 64x64 tanh ``MLPPolicy``, ``T`` steps per call (default 128).
In every round three things run back to back, in a rotating order, on the same env,
policy and shapes:

* ``rollout``: the bare rollout, ``js.jit_rollout(js.make_rollout(...))`` with its
  buffers passed back, plus the one ``jax.device_get`` of the trajectory (what any
  sampler must do);
* ``sample``: ``Sampler.sample(params)`` end to end (rollout + conversion into
  numpy'ized episodes);
* ``sample_batch``: ``Sampler.sample_batch(params)`` end to end.

Reported per cell: medians over rounds of each time, the within-round ratios
``sample / rollout`` and ``sample_batch / rollout`` (medians; noise from other
processes hits the three alike), and timesteps/s (env steps sampled per second) of the
three side by side. Targets (issue 11): ``sample_batch <= 1.3x`` everywhere;
``sample <= 1.5x`` (MLP) and ``<= 2x`` (random). ``sample()`` builds each episode's
buffers on first access (``SingleAgentEpisode.lazy``), so its figure is the cost of
getting the episodes, not of reading every one of them; ``--touch`` adds a
``sample+read`` side that also reads every single-agent episode's columns.

    python -m benchmarks.episodes                 # full run, writes results/episodes.*
    python -m benchmarks.episodes --quick         # smoke test, prints only
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

import jaxsampler as js
from benchmarks import harness
from benchmarks.harness import log
from jaxsampler.cli.bench import environment_info
from jaxsampler.envs.spread import Spread
from jaxsampler.sampling import DeviceSampler

CELLS = (("CartPole-v1", 1, 1024), ("Spread", 8, 64), ("Spread", 8, 1024), ("Spread", 8, 4096))
POLICIES = ("random", "mlp")
TARGETS = {"sample_batch": {"random": 1.3, "mlp": 1.3}, "sample": {"random": 2.0, "mlp": 1.5}}


def make(env_name: str, agents: int, policy_name: str) -> tuple[Any, Any, Any]:
    """The env, the policy and its params (``PRNGKey(0)``)."""
    env = js.make("CartPole-v1") if env_name == "CartPole-v1" else Spread(agents)
    if policy_name == "random":
        pol: Any = js.RandomPolicy(env.observation_space, env.action_space)
    else:
        pol = js.MLPPolicy(env.observation_space, env.action_space, (64, 64))
    return env, pol, pol.init(jax.random.PRNGKey(0))


def _read_all(episodes: list[Any]) -> None:
    for ep in episodes:
        if isinstance(ep, js.SingleAgentEpisode):
            ep.get_observations(), ep.get_actions(), ep.get_rewards()


def measure(
    env_name: str, agents: int, num_envs: int, policy_name: str, T: int, repeats: int, touch: bool
) -> dict[str, Any]:
    """One cell: ``repeats`` rounds of rollout / sample / sample_batch (rotating order)."""
    env, pol, params = make(env_name, agents, policy_name)
    rollout = js.jit_rollout(js.make_rollout(env, pol, num_envs, T))
    state = js.init_rollout_state(env, pol, num_envs, jax.random.PRNGKey(1))
    sampler = DeviceSampler(env, pol, num_envs=num_envs, rollout_length=T, seed=0)
    bare: dict[str, Any] = {"state": state, "buffers": None}

    def run_rollout() -> int:
        bare["state"], traj = rollout(params, bare["state"], bare["buffers"])
        host = jax.device_get(traj)
        bare["buffers"] = traj
        return int((~host.is_reset).sum())

    def run_sample() -> int:
        sampler.sample(params)
        return sampler.metrics.num_env_steps_sampled

    def run_sample_read() -> int:
        _read_all(sampler.sample(params))
        return sampler.metrics.num_env_steps_sampled

    def run_batch() -> int:
        sampler.sample_batch(params)
        return sampler.metrics.num_env_steps_sampled

    sides: dict[str, Callable[[], int]] = {
        "rollout": run_rollout,
        "sample": run_sample,
        "sample_batch": run_batch,
    }
    if touch:
        sides["sample+read"] = run_sample_read
    t0 = time.perf_counter()
    for fn in sides.values():  # compile and warm up
        fn()
        fn()
    warmup_s = time.perf_counter() - t0
    times: dict[str, list[float]] = {k: [] for k in sides}
    steps: dict[str, list[int]] = {k: [] for k in sides}
    names = list(sides)
    for r in range(repeats):
        for name in harness.rotated(names, r):
            gc.collect()
            t0 = time.perf_counter()
            n = sides[name]()
            times[name].append(time.perf_counter() - t0)
            steps[name].append(n)
    row: dict[str, Any] = {
        "env": env_name,
        "agents": agents,
        "num_envs": num_envs,
        "rollout_length": T,
        "policy": policy_name,
        "repeats": repeats,
        "warmup_s": warmup_s,
        "times_s": times,
        "env_steps": steps,
    }
    for name in sides:
        med = statistics.median(times[name])
        row[f"{name}_s"] = med
        row[f"{name}_timesteps_per_s"] = statistics.median(steps[name]) / med
        if name != "rollout":
            row[f"ratio_{name}"] = harness.paired_ratio(times[name], times["rollout"])
    return row


def markdown(results: dict[str, Any]) -> str:
    env = results["environment"]
    lines = [
        "# Conversion cost: `sample()` / `sample_batch()` vs the bare rollout",
        "",
        f"{results['date']} · `{results['command']}` · T={results['config']['rollout_length']} · "
        f"jax {env['jax']} ({env['backend']}, {env['device_count']} device(s), "
        f"{env['cpu_count']} CPUs) · wall {results['wall_s']:.0f} s",
        "",
        "Times are medians over rounds; ratios are medians of the within-round ratios to the "
        "bare rollout (jitted rollout + one device-to-host copy). Targets: `sample_batch` ≤ 1.3x; "
        "`sample` ≤ 1.5x (MLP), ≤ 2x (random). Timesteps/s: env steps sampled per second.",
        "",
        "| env | envs | policy | rollout ms | sample ms | sample_batch ms | **sample / rollout** "
        "| **sample_batch / rollout** | timesteps/s rollout · sample · sample_batch |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]

    def mark(r: dict[str, Any], side: str) -> str:
        ok = r[f"ratio_{side}"] <= TARGETS[side][r["policy"]]
        return f"**{r[f'ratio_{side}']:.2f}**" + ("" if ok else " ✗")

    for r in results["results"]:
        name = r["env"] if r["agents"] == 1 else f"{r['env']}({r['agents']})"
        lines.append(
            f"| {name} | {r['num_envs']} | {r['policy']} | {r['rollout_s'] * 1e3:.1f} | "
            f"{r['sample_s'] * 1e3:.1f} | {r['sample_batch_s'] * 1e3:.1f} | {mark(r, 'sample')} | "
            f"{mark(r, 'sample_batch')} | "
            + " · ".join(
                harness.mk(r[f"{side}_timesteps_per_s"])
                for side in ("rollout", "sample", "sample_batch")
            )
            + " |"
        )
    touched = [r for r in results["results"] if "ratio_sample+read" in r]
    if touched:
        lines += [
            "",
            "`sample+read`: `sample()` and then every single-agent episode's observations, "
            "actions and rewards read once (the lazily built buffers made):",
            "",
            "| env | envs | policy | sample+read / rollout |",
            "|---|---:|---|---:|",
        ]
        for r in touched:
            lines.append(
                f"| {r['env']} | {r['num_envs']} | {r['policy']} | {r['ratio_sample+read']:.2f} |"
            )
    lines.append("")
    lines.append("✗: above the target.")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rollout-length", type=int, default=128)
    p.add_argument("--repeats", type=int, default=7, help="rounds per cell (default 7)")
    p.add_argument("--big-repeats", type=int, default=3, help="rounds at 4096 envs (default 3)")
    p.add_argument(
        "--touch", action="store_true", help="also time sample() + reading every episode"
    )
    harness.add_quick_out(p, "episodes", quick="small cells; prints")
    args = p.parse_args(argv)
    cells = [("CartPole-v1", 1, 64), ("Spread", 8, 16)] if args.quick else list(CELLS)
    T = 16 if args.quick else args.rollout_length
    started = time.perf_counter()
    rows = []
    for env_name, agents, width in cells:
        for pol in POLICIES:
            log(f"{env_name} x{agents} agents, {width} envs, {pol} policy")
            reps = 2 if args.quick else args.big_repeats if width >= 4096 else args.repeats
            rows.append(measure(env_name, agents, width, pol, T, reps, args.touch))
            r = rows[-1]
            log(
                f"    sample {r['ratio_sample']:.2f}x, sample_batch {r['ratio_sample_batch']:.2f}x "
                f"(rollout {r['rollout_s'] * 1e3:.1f} ms)"
            )
            gc.collect()
    results = {
        **harness.stamp(
            "conversion: Sampler.sample / sample_batch vs the bare rollout", "episodes"
        ),
        "config": {"rollout_length": T, "cells": [list(c) for c in cells], "policies": POLICIES},
        "environment": environment_info(),
        "git": harness.git_state(),
        "results": rows,
        "wall_s": time.perf_counter() - started,
    }
    harness.finish(
        results, markdown(results), "episodes", harness.results_dir(args.out, args.quick)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
