"""What 1-byte observations save: gymnax Breakout-MinAtar as float32 frames vs
``js.make("gymnax:Breakout-MinAtar", compact_obs=True)`` (uint8), side by side.

Per variant (random policy, ``--num-envs`` x ``--rollout-length``):

* ``rollout``: the jitted rollout (buffers donated back) plus one ``jax.device_get`` of the
  trajectory;
* ``sample_batch``: ``Sampler.sample_batch(params)`` end to end;
* bytes: of the trajectory on the host, of its observations, and of the returned batch
  (every numpy column's ``nbytes``; object columns count their pointers);
* peak host allocation during one extra ``sample_batch()`` call (``tracemalloc``, which
  numpy reports its buffers to; that round is not timed).

Rounds alternate the variants and rotate the sides; the tables show medians.

    python -m benchmarks.compact_obs            # -> results/compact_obs.{json,md}
    python -m benchmarks.compact_obs --quick    # tiny smoke run, prints
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

import jaxsampler as js
from benchmarks import harness

ENV = "gymnax:Breakout-MinAtar"
VARIANTS = {"float32": False, "uint8": True}
MIB = 2**20


def _nbytes(tree: Any) -> int:
    return sum(int(np.asarray(x).nbytes) for x in jax.tree.leaves(tree) if hasattr(x, "nbytes"))


def _batch_bytes(batch: Any) -> int:
    """Bytes of every array column of every policy's ``SampleBatch`` (nested dicts too)."""
    total = 0
    for pid in batch.policy_batches:
        sb = batch.policy_batches[pid]
        total += sum(_nbytes(sb[k]) for k in list(sb.keys()))
    return total


class Variant:
    """One env variant's rollout, sampler and byte counts."""

    def __init__(self, compact: bool, num_envs: int, T: int) -> None:
        self.env = js.make(ENV, compact_obs=compact)
        self.policy = js.RandomPolicy(self.env.observation_space, self.env.action_space)
        self.rollout = js.jit_rollout(js.make_rollout(self.env, self.policy, num_envs, T))
        self.state = js.init_rollout_state(self.env, self.policy, num_envs, jax.random.PRNGKey(1))
        self.buffers: Any = None
        self.sampler = js.Sampler(
            self.env, self.policy, num_envs=num_envs, rollout_length=T, seed=0
        )
        self.bytes: dict[str, int] = {}

    def run_rollout(self) -> None:
        self.state, traj = self.rollout(None, self.state, self.buffers)
        host = jax.device_get(traj)
        self.buffers = traj
        self.bytes["trajectory"] = _nbytes(host)
        self.bytes["trajectory_obs"] = _nbytes(host.obs)

    def run_batch(self) -> None:
        batch = self.sampler.sample_batch(None)
        self.bytes["batch"] = _batch_bytes(batch)
        self.bytes["batch_obs_new_obs"] = _nbytes(
            [batch.policy_batches[p][c] for p in batch.policy_batches for c in ("obs", "new_obs")]
        )

    def peak_batch_alloc(self) -> int:
        gc.collect()
        tracemalloc.start()
        try:
            self.sampler.sample_batch(None)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()


def measure(num_envs: int, T: int, repeats: int) -> dict[str, Any]:
    """Both variants, ``repeats`` alternating rounds of each side."""
    variants = {name: Variant(c, num_envs, T) for name, c in VARIANTS.items()}
    sides: dict[str, Callable[[Variant], None]] = {
        "rollout": Variant.run_rollout,
        "sample_batch": Variant.run_batch,
    }
    t0 = time.perf_counter()
    for v in variants.values():  # compile and warm up
        for fn in sides.values():
            fn(v)
            fn(v)
    warmup_s = time.perf_counter() - t0
    times: dict[str, dict[str, list[float]]] = {n: {s: [] for s in sides} for n in variants}
    for r in range(repeats):
        for name in harness.alternated(list(variants), r):
            for side in harness.rotated(list(sides), r):
                gc.collect()
                t0 = time.perf_counter()
                sides[side](variants[name])
                times[name][side].append(time.perf_counter() - t0)
    rows = {}
    for name, v in variants.items():
        med = {s: statistics.median(ts) for s, ts in times[name].items()}
        rows[name] = {
            "observation_space": repr(v.env.observation_space),
            "times_s": times[name],
            "rollout_s": med["rollout"],
            "sample_batch_s": med["sample_batch"],
            "ratio_sample_batch": harness.paired_ratio(
                times[name]["sample_batch"], times[name]["rollout"]
            ),
            "bytes": dict(v.bytes),
            "peak_alloc_sample_batch": v.peak_batch_alloc(),
        }
    return {"num_envs": num_envs, "rollout_length": T, "warmup_s": warmup_s, "rows": rows}


def markdown(results: dict[str, Any]) -> str:
    """The side-by-side table."""
    cell = results["cell"]
    rows = cell["rows"]
    lines = [
        "# Compact observations: Breakout-MinAtar frames as float32 vs uint8 (`compact_obs=True`)",
        "",
        f"{ENV}, random policy, {cell['num_envs']} envs x T={cell['rollout_length']}, "
        f"medians of {results['config']['repeats']} alternating rounds, shared 2-core CPU. "
        "`rollout`: jitted rollout + device_get; batch bytes: every column of the returned "
        "`MultiAgentBatch`; peak: `tracemalloc` peak during one extra `sample_batch()` call.",
        "",
        "| obs dtype | rollout ms | sample_batch ms | sample_batch / rollout | trajectory MiB "
        "(obs) | batch MiB (obs + new_obs) | peak alloc MiB | peak / batch |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        b = r["bytes"]
        lines.append(
            f"| {name} | {r['rollout_s'] * 1e3:.0f} | {r['sample_batch_s'] * 1e3:.0f} | "
            f"{r['ratio_sample_batch']:.2f} | {b['trajectory'] / MIB:.0f} "
            f"({b['trajectory_obs'] / MIB:.0f}) | {b['batch'] / MIB:.0f} "
            f"({b['batch_obs_new_obs'] / MIB:.0f}) | {r['peak_alloc_sample_batch'] / MIB:.0f} | "
            f"{r['peak_alloc_sample_batch'] / b['batch']:.2f} |"
        )
    f, u = rows["float32"], rows["uint8"]
    lines += [
        "",
        f"uint8 / float32: rollout {u['rollout_s'] / f['rollout_s']:.2f}x, sample_batch "
        f"{u['sample_batch_s'] / f['sample_batch_s']:.2f}x, batch bytes "
        f"{u['bytes']['batch'] / f['bytes']['batch']:.2f}x, trajectory bytes "
        f"{u['bytes']['trajectory'] / f['bytes']['trajectory']:.2f}x.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-envs", type=int, default=None)
    p.add_argument("--rollout-length", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None)
    harness.add_quick_out(p, "compact_obs")
    args = p.parse_args(argv)
    harness.Sizes(
        full={"num_envs": 1024, "rollout_length": 128, "repeats": 5},
        quick={"num_envs": 8, "rollout_length": 8, "repeats": 2},
    ).apply(args)
    started = time.perf_counter()
    harness.log(f"{ENV}: {args.num_envs} envs x {args.rollout_length}, {args.repeats} rounds")
    results = {
        **harness.stamp("compact observations: float32 vs uint8 MinAtar frames", "compact_obs"),
        "config": {
            "env": ENV,
            "num_envs": args.num_envs,
            "rollout_length": args.rollout_length,
            "repeats": args.repeats,
        },
        "git": harness.git_state(),
        "versions": harness.versions(["jax", "jaxlib", "gymnax", "numpy"]),
        "cell": measure(args.num_envs, args.rollout_length, args.repeats),
        "wall_s": 0.0,
    }
    results["wall_s"] = time.perf_counter() - started
    harness.finish(
        results, markdown(results), "compact_obs", harness.results_dir(args.out, args.quick)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
