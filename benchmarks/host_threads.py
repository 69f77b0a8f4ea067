"""Host threads for large calls: ``sample_batch()`` and its conversion alone, by thread
count, side by side (issue 28, item 3).

Cells (``--cells``, random policy): CartPole-v1 at 16384 and 65536 envs x 64 steps (sizes
at which a GPU's rollout takes a few ms) and Spread with 8 agents at 1024 envs x 128 steps
(the multi-agent lockstep path). Per cell and per thread count ``k`` of ``--threads``
(default 1 and the machine's cores, at most 8):

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

import jax
import numpy as np

from benchmarks import harness
from benchmarks import host_side as hs
from jaxsampler.sampling.device.parallel import host_pool, using_pool


def _conversion(sampler: Any, threads: int, before: dict[str, Any]) -> Callable[[], float]:
    """One ``batch()`` of ``sampler``'s converter over its last call's host chunks, under a
    pool of ``threads``, from ``before`` (the converter's state before that call); returns
    the seconds it took. The converter's state is put back after each, so every repeat
    converts the same call from the same state and the sampler's own calls go on as if
    none had run."""
    # (the call's chunks and end state as host copies of their own: the sampler's next
    # rollouts take the device buffers they may share memory with)
    state = jax.tree.map(np.array, sampler._end_state())
    chunks = copy.deepcopy(sampler.last_chunks)
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


def parse_cell(text: str) -> tuple[hs.Cell, int]:
    """``ENV:W:T`` (``ENV``: ``CartPole-v1`` or ``Spread<agents>``) as a cell and its T."""
    try:
        name, w, t = text.split(":")
        agents = int(name[len("Spread") :]) if name.startswith("Spread") else 1
        env = "Spread" if name.startswith("Spread") else name
        if env not in ("CartPole-v1", "Spread") or min(int(w), int(t), agents) < 1:
            raise ValueError(text)
    except ValueError:
        raise ValueError(
            f"a cell is ENV:W:T with ENV CartPole-v1 or Spread<agents>, got {text!r}"
        ) from None
    return hs.Cell(env, int(w), "random", ("sample_batch",), agents=agents), int(t)


def measure(cell: hs.Cell, T: int, threads: Sequence[int], rounds: int) -> dict[str, Any]:
    """The cell's sides over ``rounds`` rotating rounds (one warm-up call each first)."""
    notes: list[str] = []
    env = hs.make_env(cell, {}, notes)
    width = cell.num_envs
    pol, params = hs.make_policy(env, "random")
    samplers = {k: hs.make_sampler(env, pol, cell, T, {"host_threads": k}, notes) for k in threads}
    bare = hs.bare_rollout(env, pol, params, width, T)
    fns: dict[str, Callable[[], Any]] = {"rollout": bare}
    bare()  # compile and warm up
    for k, s in samplers.items():
        fns[f"sample_batch {k}"] = lambda s=s: s.sample_batch(params)
        before = copy.deepcopy(s._convert.get_state())
        s.sample_batch(params)  # compile and warm up: the call the conversion side repeats
        fns[f"conversion {k}"] = _conversion(s, k, before)
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
        "cell": cell.key,
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
        f"{res['date']} · `{res['command']}` · random policy · "
        f"{res['machine']['cpus']} CPUs · commit {res['git']['commit'][:10]}",
        "",
        "Medians of rotating rounds; `/ 1 thread` and `/ rollout`: medians of the within-round "
        "ratios (below 1: faster). `conversion k`: the converter's `batch()` over one call's "
        "host chunk, nothing else running (what a GPU's host, whose cores the device leaves "
        "idle, pays); `sample_batch k`: the call end to end on this CPU backend, where XLA "
        "computes the rollout on the same cores.",
        "",
        "| env | W x T | side | ms | min–max ms | / 1 thread | / rollout | rounds |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for c in res["cells"]:
        for name, s in c["sides"].items():
            vs_one = f"{s['vs_one_thread']:.2f}" if "vs_one_thread" in s else ""
            vs_roll = f"{s['vs_rollout']:.2f}" if "vs_rollout" in s else ""
            lines.append(
                f"| {c['cell'].rsplit(' ', 2)[0]} | {c['width']} x {c['rollout_length']} | "
                f"{name} | {s['median_s'] * 1e3:.1f} | "
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
    p.add_argument("--cells", nargs="+", default=None, metavar="ENV:W:T")
    p.add_argument("--threads", type=int, nargs="+", default=None, help="first: the baseline")
    p.add_argument("--rounds", type=int, default=None)
    harness.add_quick_out(p, "host_threads")
    args = p.parse_args(argv)
    harness.Sizes(
        full={
            "cells": ["CartPole-v1:16384:64", "CartPole-v1:65536:64", "Spread8:1024:128"],
            "rounds": 9,
        },
        quick={"cells": ["CartPole-v1:64:8", "Spread2:8:4"], "rounds": 2},
    ).apply(args)
    try:
        cells_t = [parse_cell(c) for c in args.cells]
    except ValueError as e:
        p.error(str(e))
    threads = args.threads or default_threads()
    if any(k < 1 for k in threads):
        p.error(f"--threads must be >= 1, got {threads}")
    started = time.perf_counter()
    cells = []
    for cell, T in cells_t:
        harness.log(f"{cell.key} x {T}, threads {threads} ...")
        cells.append(measure(cell, T, threads, args.rounds))
    results = {
        **harness.stamp("host threads: single-agent sample_batch by thread count", "host_threads"),
        "config": {
            "cells": args.cells,
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
