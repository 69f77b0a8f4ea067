"""Issue 28 items 3-4: what parallel conversion, overlap within a call and prefetch across
calls buy for ``DeviceSampler.sample_batch()``, side by side in one process.

The process has two XLA CPU devices (``--xla_force_host_platform_device_count=2``, set
before JAX starts). ``W`` envs per device; every variant is built once, warmed up, then
timed in rounds whose order rotates; figures are medians over rounds, ratios medians of
within-round ratios (``harness.paired_ratio``). Variants:

* ``1d_before``: one device, ``overlap=False, host_threads=1``: the pre-change call loop;
* ``1d``: one device, defaults (overlap on; one host thread for one device);
* ``1d_threads2``: one device, ``host_threads=2`` (transposes split over 2 threads);
* ``1d_prefetch``: one device, ``prefetch=True``;
* ``2d_before``: ``devices=2`` (``2 W`` envs), the pre-change host copy
  (``placement.to_host``: ``jax.device_get`` assembles each sharded leaf) and one thread;
* ``2d``: ``devices=2``, defaults (shards copied by 2 threads, 2-thread transposes);
* ``2d_prefetch``: ``devices=2``, ``prefetch=True``.

``plain`` calls run one chunk (``sample_batch(params)``); ``multi`` calls ask for
``num_timesteps = 4 W T x devices`` (4-5 chunks), where overlap within a call can act.

Usage::

    python -m benchmarks.overlap                 # writes results/overlap.{json,md}
    python -m benchmarks.overlap --quick         # W=64, T=16, prints only
"""

from __future__ import annotations

import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
    ).strip()

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax

import jaxsampler as js
from benchmarks import harness
from jaxsampler.cli.bench import environment_info
from jaxsampler.envs.spread import Spread
from jaxsampler.rollout import placement
from jaxsampler.sampling import DeviceSampler

VARIANTS: dict[str, tuple[int, dict[str, Any]]] = {
    "1d_before": (1, {"overlap": False, "host_threads": 1}),
    "1d": (1, {}),
    "1d_threads2": (1, {"host_threads": 2}),
    "1d_prefetch": (1, {"prefetch": True}),
    "2d_before": (2, {"overlap": False, "host_threads": 1}),
    "2d": (2, {}),
    "2d_prefetch": (2, {"prefetch": True}),
}


class _OldHostCopy(DeviceSampler):
    """The pre-change host copy: ``placement.to_host`` (``jax.device_get``)."""

    def _host_copy(self, traj: Any) -> Any:
        return placement.to_host(traj)


def _env_policy(name: str, policy: str) -> tuple[Any, Any]:
    env = js.make("CartPole-v1") if name == "CartPole-v1" else Spread(8)
    if policy == "random":
        pol: Any = js.RandomPolicy(env.observation_space, env.action_space)
    else:
        pol = js.MLPPolicy(env.observation_space, env.action_space, (64, 64))
    return env, pol


def measure(name: str, policy: str, W: int, T: int, repeats: int, kind: str) -> dict[str, Any]:
    """One cell: every variant's ``sample_batch`` time and env steps per second."""
    env, pol = _env_policy(name, policy)
    params = pol.init(jax.random.PRNGKey(0))
    calls: dict[str, Callable[[], int]] = {}
    for v, (d, kw) in VARIANTS.items():
        cls = _OldHostCopy if v == "2d_before" else DeviceSampler
        s = cls(env, pol, num_envs=W * d, rollout_length=T, devices=d if d > 1 else None, **kw)
        n = 4 * W * T * d if kind == "multi" else None

        def call(s: DeviceSampler = s, n: int | None = n) -> int:
            return int(s.sample_batch(params, num_timesteps=n).env_steps())

        calls[v] = call
    for fn in calls.values():
        fn(), fn()
    times: dict[str, list[float]] = {v: [] for v in calls}
    steps: dict[str, list[int]] = {v: [] for v in calls}
    for r in range(repeats):
        for v in harness.rotated(list(calls), r):
            gc.collect()
            t0 = time.perf_counter()
            steps[v].append(calls[v]())
            times[v].append(time.perf_counter() - t0)
    row: dict[str, Any] = {
        "env": name,
        "policy": policy,
        "W": W,
        "T": T,
        "calls": kind,
        "times_s": times,
    }
    for v in calls:
        row[f"{v}_s"] = statistics.median(times[v])
        row[f"{v}_steps_per_s"] = statistics.median(
            [n / t for n, t in zip(steps[v], times[v], strict=True)]
        )
    base = [n / t for n, t in zip(steps["1d_before"], times["1d_before"], strict=True)]
    for v in calls:
        mine = [n / t for n, t in zip(steps[v], times[v], strict=True)]
        row[f"speedup_{v}"] = statistics.median([a / b for a, b in zip(mine, base, strict=True)])
    return row


def markdown(results: dict[str, Any]) -> str:
    """The results as a Markdown table (throughput relative to ``1d_before``)."""
    env = results["environment"]
    lines = [
        "# Parallel conversion, overlap and prefetch (issue 28, items 3-4)",
        "",
        f"`python -m benchmarks.overlap` on {env['cpu_count']} cores, jax {env['jax']} "
        f"({env['backend']}, {env['device_count']} devices in one process). "
        "`sample_batch()` env steps/s relative to `1d_before` (one device, pre-change "
        "loop), medians of within-round ratios; `2d*` step twice the envs. "
        f"{results.get('note', '')}",
        "",
        "| cell | calls | " + " | ".join(VARIANTS) + " |",
        "|---|---|" + "---:|" * len(VARIANTS),
    ]
    for r in results["rows"]:
        cells = " | ".join(
            f"{r[f'speedup_{v}']:.2f} ({r[f'{v}_s'] * 1e3:.0f} ms)" for v in VARIANTS
        )
        lines.append(f"| {r['env']} {r['policy']} W={r['W']} T={r['T']} | {r['calls']} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the cells, prints the table, writes ``results/overlap.{json,md}``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--note", default="")
    p.add_argument("--cells", default="cp-random,cp-mlp,spread-random")
    args = p.parse_args(argv)
    W, T = (64, 16) if args.quick else (1024, 128)
    specs = {
        "cp-random": ("CartPole-v1", "random"),
        "cp-mlp": ("CartPole-v1", "mlp"),
        "spread-random": ("Spread", "random"),
    }
    rows = []
    for cell in args.cells.split(","):
        name, pol = specs[cell]
        kinds = ("plain",) if name == "Spread" else ("plain", "multi")
        for kind in kinds:
            reps = max(3, args.repeats // 2) if name == "Spread" else args.repeats
            rows.append(measure(name, pol, W, T, 2 if args.quick else reps, kind))
            harness.log(json.dumps({k: v for k, v in rows[-1].items() if k != "times_s"}))
    results = {
        "benchmark": "overlap",
        "note": args.note,
        "environment": environment_info(),
        "rows": rows,
    }
    md = markdown(results)
    print(md)
    if not args.quick:
        out = Path(args.out)
        (out / "overlap.json").write_text(json.dumps(results, indent=1) + "\n")
        (out / "overlap.md").write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
