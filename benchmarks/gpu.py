"""The prepared GPU run: rollout actions/s from 1K to 1M envs for three envs, in one script.

For each env, ``js.jit_rollout(js.make_rollout(env, MLPPolicy(64, 64), W, T))`` (donated
buffers passed back) at widths ``W = 1024 x 4^k`` up to ``--max-width`` (default 1M):

* ``CartPole-v1`` (jaxsampler's own), ``T = 128``;
* ``gymnax:Breakout-MinAtar`` (observations ``[10, 10, 4]``, flattened by ``MLPPolicy``'s
  first layer), ``T = 32``;
* ``Spread-v0`` with ``n=8`` agents (``js.make("Spread-v0", n=8)``, agent axis 8, one
  shared policy), ``T = 32``.

``T`` is halved while the trajectory buffer would exceed ``--max-buffer-gb`` (never below
``--min-rollout-length``); the ``T`` used is in every row. A series stops early, with the
reason recorded, when a width runs out of memory (the XLA ``RESOURCE_EXHAUSTED`` error is
caught) or when the env's share of the time budget (``--budget-s``, default 460 s for the
whole script; these series get the part not kept for the host side, split evenly over
the envs still to run) would be exceeded by the next width
(predicted from the last one). actions/s counts acting agent-steps (reset steps take no
action); each figure is the median call time over at least ``--repeats`` timed calls
(more while they take under ``--min-time-s``), compile time apart.

Host side (``--parts host``, issue 28): CartPole-v1 with a random policy at
``--host-widths`` (64K, 256K and 1M envs), ``T = --host-max-steps / W`` (at most 128, at
least ``--min-rollout-length``): the bare rollout (compute, then one ``jax.device_get``),
``DeviceSampler.sample_batch()`` (its default host threads: 8 on a GPU; and
``sample_batch_1t``: the same with ``host_threads=1``) and ``sample()`` with every episode
read once (``benchmarks.host_side``'s sides), in rounds of rotating order; ratios are medians of the
within-round ratios to the bare rollout, with the split rollout / host copy / conversion.
A size whose trajectory or batch would not fit (device buffer over ``--max-buffer-gb``,
the batch's estimated host bytes over a quarter of the host's memory) is skipped with the
reason; a side (``sample+read`` first) or a size whose predicted time (scaled from the
previous size) overruns the host part's share of the budget (``--host-share``) is left
out with the reason too. Extra ``DeviceSampler`` options: ``--sampler-kwargs JSON``
(those the checkout does not take are dropped with a note).

Writes ``gpu.json`` (rows, device info: ``jax.devices()``, device kind, memory stats,
jax/jaxlib versions, ``nvidia-smi``) and ``gpu.md`` to ``--out`` (default
``benchmarks/results``). ``benchmarks/gpu.sh`` sets up the environment and runs this.

Usage::

    python -m benchmarks.gpu                          # the GPU run (< 10 min)
    python -m benchmarks.gpu --quick --out /tmp/gpu   # CPU dry run of the same code path
    python -m benchmarks.gpu --max-width 65536 --envs CartPole-v1
    python -m benchmarks.gpu --parts host --sampler-kwargs '{"prefetch": true}'
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

import jaxsampler as js
from benchmarks import harness
from benchmarks import host_side as hs
from benchmarks.harness import log
from jaxsampler.cli.bench import environment_info

#: label -> (env id, make kwargs, default T)
ENVS: dict[str, tuple[str, dict[str, Any], int]] = {
    "CartPole-v1": ("CartPole-v1", {}, 128),
    "Breakout-MinAtar": ("gymnax:Breakout-MinAtar", {}, 32),
    "Spread-8": ("Spread-v0", {"n": 8}, 32),
}
SIZES = harness.Sizes(
    full={
        "min_width": 1024,
        "max_width": 1 << 20,
        "rollout_cap": 128,
        "repeats": 5,
        "min_time_s": 0.5,
        "budget_s": 460.0,
        "host_widths": [1 << 16, 1 << 18, 1 << 20],
        "host_max_steps": 1 << 22,
        "host_repeats": 3,
    },
    quick={
        "min_width": 64,
        "max_width": 256,
        "rollout_cap": 8,
        "repeats": 2,
        "min_time_s": 0.0,
        "budget_s": 300.0,
        "host_widths": [64, 256],
        "host_max_steps": 1024,
        "host_repeats": 1,
    },
)


def widths_up_to(max_width: int, start: int = 1024, factor: int = 4) -> list[int]:
    """``start, start*factor, ...`` up to ``max_width`` (``max_width`` itself if smaller)."""
    out, w = [], start
    while w <= max_width:
        out.append(w)
        w *= factor
    return out or [max_width]


def buffer_bytes(env: Any, width: int, T: int) -> int:
    """Rough trajectory size: observations (``T + 1`` slots) plus ~32 bytes of other
    fields (action, reward, flags, logp, value, ...) per agent-step."""
    obs = int(np.prod(env.observation_space.shape)) * 4
    return width * env.num_agents * ((T + 1) * obs + 32 * T)


def _is_oom(e: BaseException) -> bool:
    text = str(e)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


def measure(env: Any, width: int, T: int, repeats: int, min_time_s: float) -> dict[str, Any]:
    """Compiles and times the rollout of ``env`` at ``width``; raises on OOM."""
    policy = js.MLPPolicy(env.observation_space, env.action_space, (64, 64))
    params = policy.init(jax.random.PRNGKey(0))
    rollout = js.jit_rollout(js.make_rollout(env, policy, width, T))
    count = jax.jit(lambda acting: acting.sum())
    t0 = time.perf_counter()
    state = rollout.init(jax.random.PRNGKey(1))
    state, traj = rollout(params, state)
    jax.block_until_ready(traj)
    state, traj = rollout(params, state, traj)  # the donated-buffer call compiles once more
    jax.block_until_ready(traj)
    compile_s = time.perf_counter() - t0
    times: list[float] = []
    acted = []
    t_start = time.perf_counter()
    while len(times) < repeats or time.perf_counter() - t_start < min_time_s:
        t0 = time.perf_counter()
        state, traj = rollout(params, state, traj)
        jax.block_until_ready(traj)
        times.append(time.perf_counter() - t0)
        acted.append(int(count(traj.acting)))
    med = statistics.median(times)
    agent_steps = width * T * env.num_agents
    return {
        "width": width,
        "rollout_length": T,
        "num_agents": env.num_agents,
        "compile_s": compile_s,
        "median_s": med,
        "times_s": times,
        "agent_steps_per_s": agent_steps / med,
        "actions_per_s": statistics.median(acted) / med,
        "acting_fraction": statistics.median(acted) / agent_steps,
        "buffer_gb": buffer_bytes(env, width, T) / 1e9,
    }


def run_env(label: str, args: argparse.Namespace, deadline: float) -> dict[str, Any]:
    """One env's series; stops at OOM or when the next width would pass ``deadline``."""
    env_id, kwargs, T0 = ENVS[label]
    env: Any = js.make(env_id, **kwargs)
    rows: list[dict[str, Any]] = []
    stopped = None
    last_s = 0.0
    for w in widths_up_to(args.max_width, args.min_width):
        T = min(T0, args.rollout_cap)
        while args.min_rollout_length < T and buffer_bytes(env, w, T) > args.max_buffer_gb * 1e9:
            T //= 2
        # Rough: the next width costs its compile plus up to 4x the last one's run time.
        predicted = 2.5 * last_s
        if time.perf_counter() + predicted > deadline:
            stopped = f"time budget: W={w} predicted ~{predicted:.0f} s, not enough left"
            break
        log(f"{label}: W={w}, T={T} ...")
        t0 = time.perf_counter()
        try:
            row = measure(env, w, T, args.repeats, args.min_time_s)
        except Exception as e:
            if not _is_oom(e):
                raise
            stopped = f"out of memory at W={w}, T={T}: {str(e).splitlines()[0][:300]}"
            break
        finally:
            gc.collect()
            jax.clear_caches()
        last_s = time.perf_counter() - t0
        row["wall_s"] = last_s
        rows.append(row)
        log(f"  {row['actions_per_s'] / 1e6:.1f}M actions/s (compile {row['compile_s']:.1f} s)")
    if stopped:
        log(f"{label}: stopped: {stopped}")
    return {"env_id": env_id, "make_kwargs": kwargs, "rows": rows, "stopped": stopped}


#: Rough host bytes of one CartPole batch row (obs + new_obs, action, reward, flags, t,
#: eps_id, agent_index, and the episodes of sample+read): a size is skipped above a
#: quarter of the host's memory.
HOST_ROW_BYTES = 256
HOST_SIDES = ("rollout", "sample_batch", "sample_batch_1t", "sample+read")


def host_memory_bytes() -> int:
    """The machine's physical memory (0 if the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def host_rollout_length(width: int, args: argparse.Namespace) -> int:
    """``T`` of the host series at ``width``: ``--host-max-steps / W``, in [min T, 128]."""
    return max(args.min_rollout_length, min(128, args.host_max_steps // width))


def host_fits(env: Any, width: int, T: int, args: argparse.Namespace) -> str | None:
    """Why ``width x T`` does not fit (device buffer or host batch), or None if it does."""
    dev = buffer_bytes(env, width, T)
    if dev > args.max_buffer_gb * 1e9:
        return f"trajectory ~{dev / 1e9:.1f} GB > --max-buffer-gb {args.max_buffer_gb}"
    host, total = width * T * HOST_ROW_BYTES, host_memory_bytes()
    if total and host > total / 4:
        return f"batch ~{host / 1e9:.1f} GB > a quarter of the host's {total / 1e9:.0f} GB"
    return None


def predict(prev: dict[str, Any] | None, width: int, T: int) -> dict[str, float]:
    """Seconds per call of each side at ``width x T``, scaled from the previous size by
    the larger of the width and step ratios (episodes grow with both); {} without one."""
    if prev is None:
        return {}
    scale = max(width / prev["width"], width * T / (prev["width"] * prev["rollout_length"]))
    return {side: t * scale for side, t in prev["call_s"].items()}


def measure_host(
    width: int, T: int, args: argparse.Namespace, sides: Sequence[str], deadline: float
) -> dict[str, Any]:
    """The host-side sides of CartPole-v1 (random policy) at ``width x T``: one warm-up call
    each, then up to ``--host-repeats`` rounds in rotating order while time is left."""
    env: Any = js.make("CartPole-v1")
    cell = hs.Cell("CartPole-v1", width, "random", tuple(sides))
    pol, params = hs.make_policy(env, "random")
    notes: list[str] = []
    sampler = hs.make_sampler(env, pol, cell, T, args.sampler_kwargs, notes)
    one: Any = (
        hs.make_sampler(env, pol, cell, T, {**args.sampler_kwargs, "host_threads": 1}, notes)
        if "sample_batch_1t" in sides
        else None
    )
    every = {
        "rollout": hs.bare_rollout(env, pol, params, width, T),
        "sample_batch": lambda: sampler.sample_batch(params),
        "sample_batch_1t": lambda: one.sample_batch(params),
        "sample+read": lambda: hs.sample_and_read(sampler, params),
    }
    fns = {k: every[k] for k in sides}
    first = {}
    for name, fn in fns.items():
        t0 = time.perf_counter()
        out = fn()
        first[name] = time.perf_counter() - t0
        del out
    times: dict[str, list[float]] = {k: [] for k in fns}
    split: dict[str, list[float]] = {}
    for r in range(args.host_repeats):
        if r and time.perf_counter() + sum(t[-1] for t in times.values()) > deadline:
            break
        for name in harness.rotated(list(fns), r):
            gc.collect()
            t0 = time.perf_counter()
            out = fns[name]()
            times[name].append(time.perf_counter() - t0)
            if name == "rollout":
                split.setdefault("rollout_compute", []).append(out[0])
                split.setdefault("rollout_copy", []).append(out[1])
            del out
    return {
        "width": width,
        "rollout_length": T,
        "env_steps": width * T,
        "sides_run": list(sides),
        "first_call_s": first,
        "times_s": times,
        "split_s": split,
        "call_s": {k: statistics.median(v) for k, v in times.items()},
        "sides": hs.summarize(times, split),
        "notes": notes,
    }


def run_host(args: argparse.Namespace, deadline: float) -> dict[str, Any]:
    """The host-side series over ``--host-widths``; sizes or sides that do not fit in
    memory or in the time left are skipped with the reason (printed and recorded)."""
    env: Any = js.make("CartPole-v1")
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []

    def skip(why: str) -> None:
        log(f"host side: skipped {why}")
        skipped.append(why)

    for w in args.host_widths:
        T = host_rollout_length(w, args)
        why = host_fits(env, w, T, args)
        if why:
            skip(f"W={w}, T={T}: {why}")
            continue
        sides = list(HOST_SIDES)
        guess = predict(rows[-1] if rows else None, w, T)
        left = deadline - time.perf_counter()
        # A side needs its warm-up and at least one round (measure_host cuts rounds short).
        calls = 2
        while guess and len(sides) > 1 and sum(guess[s] for s in sides) * calls > left:
            skip(f"W={w}, T={T}: {sides[-1]} predicted ~{guess[sides[-1]]:.1f} s a call, "
                 f"{left:.0f} s left")  # fmt: skip
            sides.pop()
        if guess and guess["rollout"] * 2 > left:
            skip(f"W={w}, T={T}: out of time ({left:.0f} s left)")
            break
        log(f"host side: W={w}, T={T}: {', '.join(sides)} ...")
        try:
            row = measure_host(w, T, args, sides, deadline)
        except MemoryError as e:
            skip(f"W={w}, T={T}: host out of memory ({e})")
            break
        except Exception as e:
            if not _is_oom(e):
                raise
            skip(f"W={w}, T={T}: device out of memory: {str(e).splitlines()[0][:300]}")
            break
        finally:
            gc.collect()
            jax.clear_caches()
        rows.append(row)
        log("  " + hs.ratios_line(row))
    return {"env_id": "CartPole-v1", "policy": "random", "rows": rows, "skipped": skipped}


def device_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "jax_devices": [str(d) for d in jax.devices()],
        "device_kind": jax.devices()[0].device_kind,
        "platform": jax.devices()[0].platform,
    }
    try:
        info["memory_stats"] = jax.devices()[0].memory_stats()
    except Exception as e:
        info["memory_stats"] = f"unavailable: {e}"
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        info["nvidia_smi"] = smi.stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        info["nvidia_smi"] = f"unavailable: {e}"
    return info


def markdown(res: dict[str, Any]) -> str:
    dev = res["device"]
    lines = [
        f"# GPU run: rollout actions/s from {res['config']['min_width']} envs up",
        "",
        f"{res['date']}, `{res['command']}`, {dev['device_kind']} ({dev['platform']}), "
        f"jax {res['environment']['jax']}, whole run {res['wall_s']:.0f} s. MLPPolicy 64x64; "
        "actions/s counts acting agent-steps; medians of timed calls, compile apart.",
        "",
        "| env | W | T | agents | actions/s | agent-steps/s | call (ms) | compile (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, series in res["envs"].items():
        for r in series["rows"]:
            lines.append(
                f"| {label} | {r['width']} | {r['rollout_length']} | {r['num_agents']} | "
                f"{harness.si(r['actions_per_s'], 2)} | {harness.si(r['agent_steps_per_s'], 2)} | "
                f"{r['median_s'] * 1e3:.1f} | {r['compile_s']:.1f} |"
            )
    stops = [(k, s["stopped"]) for k, s in res["envs"].items() if s["stopped"]]
    if stops:
        lines += ["", "Series stopped early:", ""]
        lines += [f"- {k}: {why}" for k, why in stops]
    if "host_side" in res:
        lines += host_markdown(res["host_side"])
    lines.append("")
    return "\n".join(lines)


def host_markdown(host: dict[str, Any]) -> list[str]:
    """The host-side table: per width and side, ms, ratio to the bare rollout and split."""
    lines = [
        "",
        "## Host side: CartPole-v1, random policy, vs the bare rollout",
        "",
        "Ratio: median of within-round ratios to the bare rollout (compute + one "
        "`jax.device_get`); split in ms: rollout compute / host copy / conversion.",
        "",
        "| W | T | side | ms | / rollout | rollout | copy | conversion | rounds |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in host["rows"]:
        for side, s in r["sides"].items():
            ratio = f"{s['ratio']:.2f}" if "ratio" in s else "1"
            lines.append(
                f"| {r['width']} | {r['rollout_length']} | {side} | {s['median_s'] * 1e3:.1f} | "
                f"{ratio} | {s.get('rollout_s', s.get('compute_s', 0.0)) * 1e3:.1f} | "
                f"{s['copy_s'] * 1e3:.1f} | {s.get('conversion_s', 0.0) * 1e3:.1f} | "
                f"{len(r['times_s']['rollout'])} |"
            )
    if host["skipped"]:
        lines += ["", "Skipped:", ""] + [f"- {why}" for why in host["skipped"]]
    return lines


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--envs", nargs="+", choices=list(ENVS), default=list(ENVS))
    ap.add_argument("--min-width", type=int, help="default 1024")
    ap.add_argument("--max-width", type=int, help="default 1048576")
    ap.add_argument("--rollout-cap", type=int, help="T at most this (default 128)")
    ap.add_argument("--min-rollout-length", type=int, default=4)
    ap.add_argument("--max-buffer-gb", type=float, default=24.0)
    ap.add_argument("--repeats", type=int, help="default 5")
    ap.add_argument("--min-time-s", type=float, help="default 0.5")
    ap.add_argument("--budget-s", type=float, help="whole-script time budget (default 460)")
    ap.add_argument("--parts", nargs="+", choices=("rollout", "host"), default=["rollout", "host"])
    ap.add_argument("--host-widths", type=int, nargs="+", help="default 65536 262144 1048576")
    ap.add_argument("--host-max-steps", type=int, help="W x T of the host series (default 4M)")
    ap.add_argument("--host-repeats", type=int, help="rounds of the host series (default 3)")
    ap.add_argument("--host-share", type=float, default=0.45, help="of --budget-s (0.45)")
    ap.add_argument("--sampler-kwargs", type=json.loads, default={}, metavar="JSON")
    ap.add_argument("--quick", action="store_true", help="CPU dry run: W <= 256, T = 8")
    ap.add_argument("--out", type=Path, default=harness.RESULTS_DIR)
    args = SIZES.apply(ap.parse_args(argv))  # --quick: the quick values, unless given
    if args.min_width < 1 or args.max_width < 1 or args.repeats < 1 or args.budget_s <= 0:
        ap.error("--min-width, --max-width, --repeats and --budget-s must be positive")
    if min(args.host_widths) < 1 or args.host_max_steps < 1 or args.host_repeats < 1:
        ap.error("--host-widths, --host-max-steps and --host-repeats must be positive")
    if not 0 < args.host_share <= 1 or not isinstance(args.sampler_kwargs, dict):
        ap.error(f"--host-share in (0, 1] and a JSON object for --sampler-kwargs, got "
                 f"{args.host_share} and {args.sampler_kwargs!r}")  # fmt: skip
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    t_start = time.perf_counter()
    end = t_start + args.budget_s
    log(f"devices: {jax.devices()}")
    host_s = args.budget_s * args.host_share if "host" in args.parts else 0.0
    envs = {}
    labels = args.envs if "rollout" in args.parts else []
    for i, label in enumerate(labels):
        share = (end - host_s - time.perf_counter()) / (len(labels) - i)
        envs[label] = run_env(label, args, time.perf_counter() + share)
    host = run_host(args, end) if "host" in args.parts else None
    res = {
        **harness.stamp("gpu", "gpu"),
        "config": {
            k: v if not isinstance(v, Path) else str(v)
            for k, v in vars(args).items()
            if k not in ("out",)
        },
        "device": device_info(),
        "environment": environment_info(),
        "envs": envs,
        **({"host_side": host} if host is not None else {}),
        "wall_s": time.perf_counter() - t_start,
    }
    harness.finish(res, markdown(res), "gpu", args.out, default=str)


if __name__ == "__main__":
    main()
