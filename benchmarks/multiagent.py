"""Multi-agent sampling throughput: Spread at 2-32 agents, jaxsampler vs a hand-written loop.

Two measurements on the cooperative particle env ``Spread(n)`` (agent axis ``A = n``,
one shared 64x64 tanh actor-critic ``MLPPolicy`` applied to every agent):

* **Rollout** (every ``agents x widths`` cell): agent-steps/s
  (``num_envs * num_agents * T / seconds``) of

  - ``jaxsampler``: ``js.jit_rollout(js.make_rollout(env, policy, W, T))``, passing the
    previous trajectory back so the donated buffers are reused;
  - ``handwritten``: the loop a JaxMARL / PureJaxRL user writes
    (:func:`benchmarks.baselines.spread`):
    ``jax.vmap`` of ``env.step`` + ``env.reset`` over envs with same-step auto-reset
    (``jnp.where`` leaf by leaf once every agent is done), the same network
    (``MLPPolicy.forward`` with the same params), a categorical sample and its
    log-probability, all in one jitted ``lax.scan`` that stacks obs, actions, rewards,
    terminated, truncated, logp and value as scan outputs (same dtypes as jaxsampler).

  The two sides alternate round by round (the order flips every round); the ratio
  ``jaxsampler / handwritten`` of a cell is the median over rounds of the within-round
  ratio, so noise from other processes hits both sides alike. Compile time (first call)
  is reported apart. Target: ratio >= 0.9.

* **Conversion** (a subset of cells): ``js.Sampler(...).sample_batch(params)`` total time
  vs its rollout part (``Sampler._call``: the jitted rollout plus the one device-to-host
  transfer), timed inside the same call; conversion = total - rollout. Target:
  conversion / rollout < 1. Skipped (with a note) if ``Sampler`` raises
  ``NotImplementedError`` for ``num_agents != 1``.

Buffers grow as ``T * W * A * obs_dim`` with ``obs_dim = 4A + 2``: at 32 agents and
4096 envs one 128-step observation buffer is 8.7 GB. Cells whose observation buffer
would exceed ``--max-buffer-gb`` run with ``T`` halved until it fits (never below
``--min-rollout-length``); the ``T`` used is in every table.

Usage::

    python -m benchmarks.multiagent                   # full run (~6-9 min, 2 cores): results/
    python -m benchmarks.multiagent --quick           # smoke test, prints only
    python -m benchmarks.multiagent --agents 8 --widths 1024 --repeats 3 --no-conversion
    python -m benchmarks.multiagent --out /tmp/ma     # write multiagent.json/.md elsewhere
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

import jaxsampler as js
from benchmarks import baselines, harness
from jaxsampler.cli.bench import environment_info, time_calls
from jaxsampler.envs.spread import Spread
from jaxsampler.sampling import DeviceSampler

DEFAULT_AGENTS = (2, 8, 32)
DEFAULT_WIDTHS = (64, 256, 1024, 4096)
DEFAULT_CONVERSION = ((8, 64), (8, 1024), (8, 4096))
SIZES = harness.Sizes(
    full={
        "agents": list(DEFAULT_AGENTS),
        "widths": list(DEFAULT_WIDTHS),
        "rollout_length": 128,
        "repeats": 5,
        "big_repeats": 3,
        "conversion": [list(c) for c in DEFAULT_CONVERSION],
        "conversion_repeats": 3,
    },
    quick={
        "agents": [2],
        "widths": [8],
        "rollout_length": 16,
        "repeats": 1,
        "big_repeats": 1,
        "conversion": [(2, 8)],
        "conversion_repeats": 1,
    },
)
HIDDEN = (64, 64)
SIDES = ("jaxsampler", "handwritten")


def make_env_policy(num_agents: int, seed: int = 0) -> tuple[Spread, js.MLPPolicy, Any]:
    """``Spread(num_agents)``, the shared 64x64 ``MLPPolicy`` and its params (``PRNGKey(seed)``)."""
    env = Spread(num_agents)
    policy = js.MLPPolicy(env.observation_space, env.action_space, HIDDEN)
    return env, policy, policy.init(jax.random.PRNGKey(seed))


def obs_buffer_bytes(num_agents: int, num_envs: int, rollout_length: int) -> int:
    """Bytes of one float32 observation buffer ``[T, E, A, obs_dim]`` (jaxsampler: ``T + 1``)."""
    obs_dim = Spread(num_agents).observation_space.shape[0]
    return 4 * (rollout_length + 1) * num_envs * num_agents * obs_dim


def cell_rollout_length(
    num_agents: int,
    num_envs: int,
    rollout_length: int,
    max_buffer_gb: float,
    min_rollout_length: int,
) -> int:
    """``rollout_length`` halved until the observation buffer fits ``max_buffer_gb`` (0: no cap)."""
    T = rollout_length
    while (
        max_buffer_gb > 0
        and min_rollout_length < T
        and obs_buffer_bytes(num_agents, num_envs, T) > max_buffer_gb * 1e9
    ):
        T = max(min_rollout_length, T // 2)
    return T


# --------------------------------------------------------------------------- timers


class Side(harness.RoundTimer):
    """One implementation at one cell: compiles on construction, then times rounds of calls."""

    def __init__(
        self,
        name: str,
        env: Spread,
        policy: js.MLPPolicy,
        params: Any,
        num_envs: int,
        rollout_length: int,
        seed: int,
    ):
        self.name, self.params = name, params
        if name == "jaxsampler":
            rollout = js.jit_rollout(js.make_rollout(env, policy, num_envs, rollout_length))
            state = js.init_rollout_state(env, policy, num_envs, jax.random.PRNGKey(seed + 1))
            jax.block_until_ready(state)
            self._rollout, self._state = rollout, state
            self._traj: Any = None
        else:
            self._run, self._carry = baselines.spread(env, policy, num_envs, rollout_length, seed)
            jax.block_until_ready(self._carry)
            self._out = None
        super().__init__(self.call)  # trace + compile + one run

    def call(self) -> Any:
        if self.name == "jaxsampler":
            # Pass the previous trajectory back: jit_rollout donates it and writes in place.
            self._state, self._traj = self._rollout(self.params, self._state, self._traj)
            return self._traj
        self._out = None  # drop the previous outputs first, as a training loop would
        self._carry, self._out = self._run(self.params, self._carry)
        return self._out

    def acting_fraction(self) -> float:
        """Share of agent-step slots where an agent acted (jaxsampler's reset steps do not)."""
        if self.name == "jaxsampler":
            return float(np.asarray(self._traj.acting).mean())
        return 1.0


def measure_cell(
    num_agents: int,
    num_envs: int,
    rollout_length: int,
    repeats: int,
    big_repeats: int,
    *,
    target_s: float = 0.3,
    big_call_s: float = 1.0,
    seed: int = 0,
) -> dict[str, Any]:
    """Both sides at one ``(agents, width)`` cell, interleaved round by round."""
    env, policy, params = make_env_policy(num_agents, seed)
    A, W, T = num_agents, num_envs, rollout_length
    sides = {name: Side(name, env, policy, params, W, T, seed) for name in SIDES}
    warm = {
        name: min(time_calls(s.call, 1 if s.compile_s > 2 * big_call_s else 2))
        for name, s in sides.items()
    }
    call_s = max(warm.values())
    inner = max(1, min(20, math.ceil(target_s / call_s)))
    rounds = repeats if call_s < big_call_s else min(repeats, big_repeats)
    ratio_rounds = []
    for r in range(rounds):
        med = {name: sides[name].round(inner) for name in harness.alternated(SIDES, r)}
        ratio_rounds.append(med["handwritten"] / med["jaxsampler"])  # ratio of rates
    agent_steps = W * A * T
    out: dict[str, Any] = {
        "num_agents": A,
        "num_envs": W,
        "rollout_length": T,
        "agent_steps_per_call": agent_steps,
        "obs_dim": int(env.observation_space.shape[0]),
        "rounds": rounds,
        "calls_per_round": inner,
        "obs_buffer_gb": obs_buffer_bytes(A, W, T) / 1e9,
    }
    for name, s in sides.items():
        side_s = statistics.median(s.times)
        frac = s.acting_fraction()
        out[name] = {
            "compile_s": s.compile_s,
            "median_s": side_s,
            "agent_steps_per_s": agent_steps / side_s,
            "acting_fraction": frac,
            "acting_agent_steps_per_s": agent_steps * frac / side_s,
            "times_s": s.times,
            "round_median_s": s.round_s,
        }
    out["ratio"] = statistics.median(ratio_rounds)
    out["ratio_rounds"] = ratio_rounds
    out["ratio_min"], out["ratio_max"] = min(ratio_rounds), max(ratio_rounds)
    del sides
    gc.collect()
    return out


# --------------------------------------------------------------------------- conversion


def measure_conversion(
    num_agents: int, num_envs: int, rollout_length: int, repeats: int, seed: int = 0
) -> dict[str, Any]:
    """``Sampler.sample_batch`` total vs its rollout part (``Sampler._call``), in the same calls."""
    env, policy, params = make_env_policy(num_agents, seed)
    row: dict[str, Any] = {
        "num_agents": num_agents,
        "num_envs": num_envs,
        "rollout_length": rollout_length,
    }
    try:
        row.update(_time_sample_batch(env, policy, params, num_envs, rollout_length, repeats, seed))
    except NotImplementedError as e:
        row.update(status="skipped (Sampler multi-agent support missing)", error=str(e))
    except Exception as e:  # keep the rollout results of a long run if the Sampler breaks
        row.update(status=f"failed: {type(e).__name__}: {str(e)[:200]}")
    gc.collect()
    return row


def _time_sample_batch(
    env: Spread,
    policy: js.MLPPolicy,
    params: Any,
    num_envs: int,
    rollout_length: int,
    repeats: int,
    seed: int,
) -> dict[str, Any]:
    sampler = DeviceSampler(
        env, policy, num_envs=num_envs, rollout_length=rollout_length, seed=seed
    )
    rollout_s: list[float] = []
    inner_call = getattr(sampler, "_call", None)
    if inner_call is not None:

        def timed_call(p: Any) -> Any:
            t0 = time.perf_counter()
            out = inner_call(p)
            rollout_s.append(time.perf_counter() - t0)
            return out

        # an instance attribute: times the rollout inside sample_batch
        setattr(sampler, "_call", timed_call)  # noqa: B010
    t0 = time.perf_counter()
    sampler.sample_batch(params)
    first_call_s = time.perf_counter() - t0  # includes compile
    sampler.sample_batch(params)  # warm-up
    total_s, roll_s, rows, agent_rows = [], [], [], []
    for _ in range(repeats):
        rollout_s.clear()
        batch = None  # free the previous batch before timing the next
        gc.collect()
        t0 = time.perf_counter()
        batch = sampler.sample_batch(params)
        total_s.append(time.perf_counter() - t0)
        roll_s.append(sum(rollout_s) if rollout_s else float("nan"))
        rows.append(int(batch.env_steps()))
        agent_rows.append(int(batch.agent_steps()))
    assert batch is not None
    conv = [a - b for a, b in zip(total_s, roll_s, strict=True)]
    t, r, c = statistics.median(total_s), statistics.median(roll_s), statistics.median(conv)
    return {
        "status": "ok" if inner_call is not None else "ok (no Sampler._call: total only)",
        "first_call_s": first_call_s,
        "total_s_median": t,
        "rollout_s_median": r,
        "conversion_s_median": c,
        "ratio_conversion_over_rollout": c / r,
        "total_s": total_s,
        "rollout_s": roll_s,
        "conversion_s": conv,
        "env_steps": statistics.median(rows),
        "agent_steps": statistics.median(agent_rows),
        "policy_batches": sorted(map(str, batch.policy_batches))
        if hasattr(batch, "policy_batches")
        else None,
    }


# --------------------------------------------------------------------------- driver


def run_benchmark(
    agents: Sequence[int],
    widths: Sequence[int],
    rollout_length: int,
    repeats: int,
    big_repeats: int,
    conversion: Sequence[Sequence[int]],
    conversion_repeats: int,
    *,
    max_buffer_gb: float = 2.5,
    min_rollout_length: int = 32,
    seed: int = 0,
    progress: Callable[[str], None] | None = harness.log,
) -> dict[str, Any]:
    """Every rollout cell, then every conversion cell; returns the results dict."""
    started = time.perf_counter()
    cells: list[dict[str, Any]] = []
    n = len(agents) * len(widths)
    for a in agents:
        for w in widths:
            T = cell_rollout_length(
                a, w, rollout_length, max_buffer_gb, min(min_rollout_length, rollout_length)
            )
            if progress:
                progress(f"[{len(cells) + 1}/{n}] rollout: {a} agents x {w} envs x T={T}")
            cells.append(measure_cell(a, w, T, repeats, big_repeats, seed=seed))
            c = cells[-1]
            if progress:
                progress(
                    f"    jaxsampler {c['jaxsampler']['agent_steps_per_s'] / 1e6:.2f}M "
                    "agent-steps/s, "
                    f"hand-written {c['handwritten']['agent_steps_per_s'] / 1e6:.2f}M, ratio "
                    f"{c['ratio']:.2f} "
                    f"({c['rounds']} rounds x {c['calls_per_round']} calls)"
                )
    conv = []
    for a, w in conversion:
        T = cell_rollout_length(
            a, w, rollout_length, max_buffer_gb, min(min_rollout_length, rollout_length)
        )
        if progress:
            progress(f"conversion: {a} agents x {w} envs x T={T}")
        conv.append(measure_conversion(a, w, T, conversion_repeats, seed))
        if progress and not conv[-1]["status"].startswith("ok"):
            progress("    " + conv[-1]["status"])
    return {
        **harness.stamp(
            "Spread multi-agent sampling: jaxsampler vs hand-written vmap+scan; "
            "sample_batch conversion",
            "multiagent",
        ),
        "config": {
            "env": "Spread(n)",
            "policy": f"MLPPolicy {HIDDEN} tanh, shared over agents",
            "agents": list(agents),
            "widths": list(widths),
            "rollout_length": rollout_length,
            "repeats": repeats,
            "big_repeats": big_repeats,
            "max_buffer_gb": max_buffer_gb,
            "min_rollout_length": min_rollout_length,
            "conversion": [list(c) for c in conversion],
            "conversion_repeats": conversion_repeats,
            "seed": seed,
        },
        "environment": environment_info(),
        "git": harness.git_state(),
        "cells": cells,
        "conversion": conv,
        "wall_s": time.perf_counter() - started,
    }


def markdown_table(results: dict[str, Any]) -> str:
    cfg, env = results["config"], results["environment"]
    agents, widths = cfg["agents"], cfg["widths"]
    by = {(c["num_agents"], c["num_envs"]): c for c in results["cells"]}
    head = (
        "| agents | "
        + " | ".join(f"W={w}" for w in widths)
        + " |\n|---|"
        + "---:|" * len(widths)
        + "\n"
    )

    def grid(fmt: Callable[[dict[str, Any]], str]) -> str:
        return head + "".join(
            f"| {a} | "
            + " | ".join(fmt(by[a, w]) if (a, w) in by else "—" for w in widths)
            + " |\n"
            for a in agents
        )

    md = "# Multi-agent sampling: Spread, jaxsampler vs hand-written vmap + scan\n\n"
    md += (
        f"{results['date']} · `{results['command']}` · jax {env['jax']} ({env['backend']}, "
        f"{env['device_count']} device(s), {env['cpu_count']} CPUs) · shared 64x64 tanh "
        "`MLPPolicy` · "
        f"T={cfg['rollout_length']} unless the cell says otherwise · wall {results['wall_s']:.0f} "
        "s\n\n"
    )
    if results["cells"]:
        md += "## jaxsampler / hand-written, agent-steps/s (target ≥ 0.9)\n\n"
        md += "Median over rounds of the within-round ratio; [min–max over rounds].\n\n"
        md += grid(
            lambda c: (
                f"**{c['ratio']:.2f}** [{c['ratio_min']:.2f}–{c['ratio_max']:.2f}]"
                + (
                    f" (T={c['rollout_length']})"
                    if c["rollout_length"] != cfg["rollout_length"]
                    else ""
                )
            )
        )
        md += "\n## Agent-steps per second (median), jaxsampler / hand-written\n\n"
        md += (
            "Medians over all timed calls of each side: they move with the machine's load (a slow "
            "round "
            "can hit one side's median more than the other's); compare the sides with the ratios "
            "above.\n\n"
        )
        md += grid(
            lambda c: (
                f"{harness.mk(c['jaxsampler']['agent_steps_per_s'])} / "
                f"{harness.mk(c['handwritten']['agent_steps_per_s'])}"
            )
        )
        md += "\n## Compile time, seconds (first call), jaxsampler / hand-written\n\n"
        md += grid(
            lambda c: f"{c['jaxsampler']['compile_s']:.1f} / {c['handwritten']['compile_s']:.1f}"
        )
        md += "\n## Rounds x calls per round\n\n"
        md += grid(lambda c: f"{c['rounds']} x {c['calls_per_round']}")
        fr = [c["jaxsampler"]["acting_fraction"] for c in results["cells"]]
        md += (
            "\nAgent-steps count every `[T, E, A]` slot. jaxsampler resets on the step after an "
            "episode "
            "ends (Spread truncates at 25 steps), and that step takes no action: its acting "
            "fraction is "
            f"{statistics.median(fr):.3f}; the hand-written loop resets within the step (and "
            "drops each "
            "episode's final observation), so all its slots act. Both compute a step and a reset "
            "for every "
            f"env at every step.\n"
        )
    if not results["conversion"]:
        return md
    md += (
        "\n## `Sampler.sample_batch()`: conversion vs rollout "
        "(target: conversion / rollout < 1)\n\n"
    )
    md += (
        "Rollout = `Sampler._call` (jitted rollout + one device-to-host transfer), timed inside "
        "the same "
        "`sample_batch` call; conversion = total − rollout. Medians.\n\n"
    )
    md += (
        "| agents | envs | T | rows (agent-steps) | rollout ms | conversion ms | total ms "
        "| conversion / rollout |\n"
    )
    md += "|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    for r in results["conversion"]:
        if r["status"].startswith("ok"):
            md += (
                f"| {r['num_agents']} | {r['num_envs']} | {r['rollout_length']} | "
                f"{r['agent_steps']:.0f} | "
                f"{r['rollout_s_median'] * 1e3:.1f} | {r['conversion_s_median'] * 1e3:.1f} | "
                f"{r['total_s_median'] * 1e3:.1f} | **{r['ratio_conversion_over_rollout']:.2f}** "
                "|\n"
            )
        else:
            md += (
                f"| {r['num_agents']} | {r['num_envs']} | {r['rollout_length']} "
                f"| {r['status']} | | | | |\n"
            )
    return md


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--agents",
        type=int,
        nargs="+",
        help=f"agent counts (default {' '.join(map(str, DEFAULT_AGENTS))})",
    )
    p.add_argument(
        "--widths",
        type=int,
        nargs="+",
        help=f"num_envs (default {' '.join(map(str, DEFAULT_WIDTHS))})",
    )
    p.add_argument("--rollout-length", type=int, help="T, steps per call (default 128)")
    p.add_argument("--repeats", type=int, help="rounds per cell; figures are medians (default 5)")
    p.add_argument(
        "--big-repeats",
        type=int,
        help="rounds (at most --repeats) for cells whose call takes > 1 s (default 3)",
    )
    p.add_argument(
        "--max-buffer-gb",
        type=float,
        default=2.5,
        help="halve T for cells whose observation buffer exceeds this (0: never; default 2.5)",
    )
    p.add_argument(
        "--min-rollout-length", type=int, default=32, help="never halve T below this (default 32)"
    )
    p.add_argument(
        "--conversion",
        type=int,
        nargs=2,
        action="append",
        metavar=("AGENTS", "WIDTH"),
        help="a sample_batch conversion cell (repeatable; default 8 64, 8 1024, 8 4096)",
    )
    p.add_argument(
        "--conversion-repeats", type=int, help="timed sample_batch calls per cell (default 3)"
    )
    p.add_argument("--no-conversion", action="store_true", help="skip the sample_batch measurement")
    p.add_argument(
        "--no-rollout", action="store_true", help="skip the rollout grid (conversion cells only)"
    )
    p.add_argument("--seed", type=int, default=0)
    harness.add_quick_out(p, "multiagent")
    args = SIZES.apply(p.parse_args(argv))
    if args.no_conversion:
        args.conversion = []
    if args.no_rollout:
        args.agents, args.widths = [], []
    results = run_benchmark(
        args.agents,
        args.widths,
        args.rollout_length,
        args.repeats,
        args.big_repeats,
        args.conversion,
        args.conversion_repeats,
        max_buffer_gb=args.max_buffer_gb,
        min_rollout_length=args.min_rollout_length,
        seed=args.seed,
    )
    harness.finish(
        results, markdown_table(results), "multiagent", harness.results_dir(args.out, args.quick)
    )


if __name__ == "__main__":
    main()
