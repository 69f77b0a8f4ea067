"""Host threads for large single-agent calls: ``sample_batch()`` and its conversion alone,
by thread count, side by side (issue 28, item 3).

Cells: CartPole-v1 with a random policy at ``--widths`` envs x ``--rollout-length`` steps
(default 16384 and 65536 x 64: the sizes at which a GPU's rollout is a few ms). Per cell
and per thread count ``k`` of ``--threads`` (default 1 and the machine's cores, at most 8):

* ``rollout``: the bare jitted rollout plus one ``jax.device_get``;
* ``sample_batch k``: ``DeviceSampler(host_threads=k).sample_batch(params)`` end to end;
* ``conversion k``: the converter's ``batch()`` over one call's host chunk (the same chunk
  for every ``k``), with nothing else running: what a host whose cores the device leaves
  idle (a GPU's) pays for the conversion, which this script cannot run on such a device.

Rounds rotate the sides; tables give medians, the paired ratios of each ``k`` to one
thread, and (``sample_batch k``) to the bare rollout. On a shared 2-core VM a second
thread sometimes waits for a core the host gives elsewhere: the min / max of the rounds
are kept in the JSON, and the Markdown shows the spread.

    python -m benchmarks.host_threads            # -> results/host_threads.{json,md}
    python -m benchmarks.host_threads --quick    # tiny smoke run, prints
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jaxsampler as js
from benchmarks import harness
from benchmarks import host_side as hs
from jaxsampler.sampling.device.parallel import host_pool, using_pool


def _conversion(sampler: Any, threads: int, before: dict[str, Any]) -> Callable[[], float]:
    """One ``batch()`` of ``sampler``'s converter over its last call's host chunks, under a
    pool of ``threads``, from ``before`` (the converter's state before that call); returns
    the seconds it took. The converter's state is put back after each, so every repeat
    converts the same call from the same state and the sampler's own calls go on as if
    none had run."""
    chunks, state = sampler.last_chunks, sampler._end_state()
    conv, pool = sampler._convert, host_pool(threads)

    def run() -> float:
        mine = conv.get_state()
        conv.set_state(copy.deepcopy(before))
        try:
            with using_pool(pool):
                t0 = time.perf_counter()
                out = conv.batch(chunks, None, state, None)
                took = time.perf_counter() - t0
            del out
        finally:
            conv.set_state(mine)
        return took

    return run


def measure(width: int, T: int, threads: Sequence[int], rounds: int) -> dict[str, Any]:
    """The cell's sides over ``rounds`` rotating rounds (one warm-up call each first)."""
    env: Any = js.make("CartPole-v1")
    cell = hs.Cell("CartPole-v1", width, "random", ("sample_batch",))
    pol, params = hs.make_policy(env, "random")
    notes: list[str] = []
    samplers = {k: hs.make_sampler(env, pol, cell, T, {"host_threads": k}, notes) for k in threads}
    bare = hs.bare_rollout(env, pol, params, width, T)
    fns: dict[str, Callable[[], Any]] = {"rollout": bare}
    for k, s in samplers.items():
        fns[f"sample_batch {k}"] = lambda s=s: s.sample_batch(params)
    before = {}
    for name, fn in fns.items():
        k = name.rpartition(" ")[2]
        if name != "rollout":
            before[int(k)] = copy.deepcopy(samplers[int(k)]._convert.get_state())
        fn()  # compile and warm up
    for k, s in samplers.items():
        fns[f"conversion {k}"] = _conversion(s, k, before[k])
    times: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(rounds):
        for name in harness.rotated(list(fns), r):
            gc.collect()
            t0 = time.perf_counter()
            out = fns[name]()
            took = time.perf_counter() - t0
            times[name].append(out if name.startswith("conversion") else took)
            del out
    one = threads[0]
    sides: dict[str, Any] = {}
    for name, ts in times.items():
        side: dict[str, Any] = {"median_s": statistics.median(ts), **_spread(ts)}
        kind, _, k = name.partition(" ")
        if k:
            side["threads"] = int(k)
            side["vs_one_thread"] = harness.paired_ratio(ts, times[f"{kind} {one}"])
        if kind == "sample_batch":
            side["vs_rollout"] = harness.paired_ratio(ts, times["rollout"])
        sides[name] = side
    return {
        "width": width,
        "rollout_length": T,
        "env_steps": width * T,
        "times_s": times,
        "sides": sides,
        "notes": notes,
    }


def _spread(ts: Sequence[float]) -> dict[str, float]:
    return {"min_s": min(ts), "max_s": max(ts)}


def markdown(res: dict[str, Any]) -> str:
    lines = [
        "# Host threads: single-agent `sample_batch()` and its conversion by thread count",
        "",
        f"{res['date']} · `{res['command']}` · CartPole-v1, random policy · "
        f"{res['machine']['cpus']} CPUs · commit {res['git']['commit'][:10]}",
        "",
        "Medians of rotating rounds; `/ 1 thread` and `/ rollout`: medians of the within-round "
        "ratios (below 1: faster). `conversion k`: the converter's `batch()` over one call's "
        "host chunk, nothing else running (what a GPU's host, whose cores the device leaves "
        "idle, pays); `sample_batch k`: the call end to end on this CPU backend, where XLA "
        "computes the rollout on the same cores.",
        "",
        "| W x T | side | ms | min–max ms | / 1 thread | / rollout | rounds |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for c in res["cells"]:
        for name, s in c["sides"].items():
            vs_one = f"{s['vs_one_thread']:.2f}" if "vs_one_thread" in s else ""
            vs_roll = f"{s['vs_rollout']:.2f}" if "vs_rollout" in s else ""
            lines.append(
                f"| {c['width']} x {c['rollout_length']} | {name} | {s['median_s'] * 1e3:.1f} | "
                f"{s['min_s'] * 1e3:.0f}–{s['max_s'] * 1e3:.0f} | {vs_one} | {vs_roll} | "
                f"{len(c['times_s'][name])} |"
            )
    return "\n".join(lines) + "\n"


def default_threads() -> list[int]:
    """1 and the machine's cores (at most 8), or just 1 on one core."""
    cores = min(os.cpu_count() or 1, 8)
    return [1] if cores == 1 else [1, cores]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--widths", type=int, nargs="+", default=None)
    p.add_argument("--rollout-length", type=int, default=None)
    p.add_argument("--threads", type=int, nargs="+", default=None, help="first: the baseline")
    p.add_argument("--rounds", type=int, default=None)
    harness.add_quick_out(p, "host_threads")
    args = p.parse_args(argv)
    harness.Sizes(
        full={"widths": [16384, 65536], "rollout_length": 64, "rounds": 9},
        quick={"widths": [64], "rollout_length": 8, "rounds": 2},
    ).apply(args)
    threads = args.threads or default_threads()
    if any(k < 1 for k in threads):
        p.error(f"--threads must be >= 1, got {threads}")
    started = time.perf_counter()
    cells = []
    for w in args.widths:
        harness.log(f"CartPole-v1 {w} x {args.rollout_length}, threads {threads} ...")
        cells.append(measure(w, args.rollout_length, threads, args.rounds))
    results = {
        **harness.stamp("host threads: single-agent sample_batch by thread count", "host_threads"),
        "config": {
            "widths": args.widths,
            "rollout_length": args.rollout_length,
            "threads": threads,
            "rounds": args.rounds,
            "quick": args.quick,
        },
        "machine": harness.machine(),
        "git": harness.git_state(),
        "cells": cells,
        "wall_s": time.perf_counter() - started,
    }
    harness.finish(
        results, markdown(results), "host_threads", harness.results_dir(args.out, args.quick)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
