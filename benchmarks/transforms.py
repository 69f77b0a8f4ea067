"""Cost of transforms in the compiled rollout: CartPole-v1, 1024 envs x 128 steps, 64x64 MLP.

Every variant is the same jitted rollout (:func:`jaxsampler.jit_rollout`, state and
buffers donated and passed back, so steady-state calls allocate nothing) of the same
64x64 tanh :class:`~jaxsampler.MLPPolicy` (same weights), differing only in
``transforms=``:

* ``none``: no transforms (the baseline);
* ``obs``: ``NormalizeObservation()``;
* ``reward``: ``NormalizeReward()``;
* ``obs+reward``: ``(NormalizeObservation(), NormalizeReward())`` (the target: <= 1.10 x
  ``none``);
* ``scale``: ``ScaleReward(0.1)``: a stateless reward transform, i.e. the cost of the
  pipeline plumbing and the ``raw_rewards`` buffer alone;
* ``obs+scale``: ``(NormalizeObservation(), ScaleReward(0.1))``: both raw buffers, one
  set of statistics;
* ``obs+reward+clip``: ``(NormalizeObservation(), NormalizeReward(), ClipReward())``.

All variants are compiled first (compile time reported separately), then timed
round-robin in a rotating order, so machine noise hits them alike; each figure is the
median over repeats of ``inner`` back-to-back calls, blocked on before the clock is read.

Usage::

    python -m benchmarks.transforms             # full run, writes benchmarks/results/
    python -m benchmarks.transforms --quick     # smoke test, prints the table only
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import jax

import jaxsampler as js
from benchmarks import harness
from jaxsampler.transforms import NormalizeObservation
from jaxsampler.transforms.reward import ClipReward, NormalizeReward, ScaleReward

VARIANTS: dict[str, tuple[Any, ...]] = {
    "none": (),
    "obs": (NormalizeObservation(),),
    "reward": (NormalizeReward(),),
    "obs+reward": (NormalizeObservation(), NormalizeReward()),
    "scale": (ScaleReward(0.1),),
    "obs+scale": (NormalizeObservation(), ScaleReward(0.1)),
    "obs+reward+clip": (NormalizeObservation(), NormalizeReward(), ClipReward()),
}


class Variant:
    """One jitted rollout with its own state and buffers."""

    def __init__(self, name: str, num_envs: int, length: int, seed: int = 0):
        env = js.make("CartPole-v1")
        transforms = VARIANTS[name]
        pipe = js.rollout.pipeline_of(env, transforms)
        policy = js.MLPPolicy(pipe.observation_space, pipe.action_space, (64, 64), "tanh")
        self.name = name
        self.params = policy.init(jax.random.PRNGKey(seed))  # same weights for every variant
        plain = js.make_rollout(env, policy, num_envs, length, transforms=pipe)
        self.rollout = js.jit_rollout(plain)
        self.state = self.rollout.init(jax.random.PRNGKey(seed + 1))
        self.steps = num_envs * length
        t0 = time.perf_counter()
        self.state, self.traj = self.rollout(self.params, self.state)
        jax.block_until_ready(self.traj)
        self.first_call_s = time.perf_counter() - t0  # compile + one run
        self.times: list[float] = []
        # XLA's static cost estimate (the scan body counted once): a noise-free cross-check.
        buf = jax.jit(plain.allocate)(self.params, self.state)
        lowered = jax.jit(plain.run, donate_argnums=(1, 2)).lower(self.params, self.state, buf)
        cost = lowered.compile().cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        self.xla_flops = float(cost.get("flops", float("nan")))
        self.xla_bytes = float(cost.get("bytes accessed", float("nan")))

    def timed(self, inner: int) -> None:
        t0 = time.perf_counter()
        for _ in range(inner):
            self.state, self.traj = self.rollout(self.params, self.state, self.traj)
        jax.block_until_ready(self.traj)
        self.times.append((time.perf_counter() - t0) / inner)


def run(num_envs: int, length: int, repeats: int, inner: int, names: list[str]) -> dict[str, Any]:
    variants = [Variant(n, num_envs, length) for n in names]
    for v in variants:  # warm-up round
        v.timed(1)
        v.times.clear()
    for r in range(repeats):
        for v in harness.rotated(variants, r):
            v.timed(inner)
    none = next(v for v in variants if v.name == "none")
    base = statistics.median(none.times)
    rows = []
    for v in variants:
        med = statistics.median(v.times)
        rows.append(
            {
                "variant": v.name,
                "transforms": [repr(t) for t in VARIANTS[v.name]],
                "median_call_s": med,
                "min_call_s": min(v.times),
                "env_steps_per_s": v.steps / med,
                "ratio_to_none": med / base,
                "ratio_of_min_to_none": min(v.times) / min(none.times),
                # Same round, adjacent in time: slow drifts of the machine's load cancel.
                "median_paired_ratio_to_none": harness.paired_ratio(v.times, none.times),
                "xla_bytes_ratio_to_none": v.xla_bytes / none.xla_bytes,
                "compile_plus_first_call_s": v.first_call_s,
                "xla_flops_per_step": v.xla_flops,
                "xla_bytes_accessed_per_step": v.xla_bytes,
            }
        )
    return {
        "date": harness.now(),
        "command": harness.command("transforms"),
        "environment": {
            "jax": jax.__version__,
            "devices": [str(d) for d in jax.devices()],
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
        },
        "env": "CartPole-v1",
        "num_envs": num_envs,
        "rollout_length": length,
        "policy": "MLPPolicy 64x64 tanh",
        "repeats": repeats,
        "inner_calls": inner,
        "target_ratio": 1.10,
        "rows": rows,
    }


def markdown(res: dict[str, Any]) -> str:
    lines = [
        "# Transform cost in the compiled rollout (benchmarks/transforms.py)",
        "",
        f"{res['date']} · {res['env']}, {res['num_envs']} envs x {res['rollout_length']} steps, "
        f"{res['policy']} · jax {res['environment']['jax']}, "
        f"{res['environment']['cpu_count']}-core CPU · median of {res['repeats']} repeats "
        f"of {res['inner_calls']} calls, variants "
        "interleaved in a rotating order.",
        "",
        "| variant | transforms | median call ms | env steps/s | ratio to `none` | "
        "paired ratio | ratio of min times | XLA bytes/step ratio | compile + first call s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["rows"]:
        tfs = ", ".join(f"`{t}`" for t in r["transforms"]) or "—"
        lines.append(
            f"| {r['variant']} | {tfs} | {1e3 * r['median_call_s']:.1f} | "
            f"{r['env_steps_per_s']:,.0f} | {r['ratio_to_none']:.3f} | "
            f"{r['median_paired_ratio_to_none']:.3f} | {r['ratio_of_min_to_none']:.3f} | "
            f"{r['xla_bytes_ratio_to_none']:.3f} | "
            f"{r['compile_plus_first_call_s']:.2f} |"
        )
    lines.append("")
    target = next(r for r in res["rows"] if r["variant"] == "obs+reward")
    verdict = "met" if target["ratio_to_none"] <= res["target_ratio"] else "missed"
    lines.append(
        f"Target: `NormalizeObservation` + `NormalizeReward` <= {res['target_ratio']:.2f} x the "
        f"rollout without transforms: median ratio {target['ratio_to_none']:.3f} ({verdict}); "
        f"paired ratio {target['median_paired_ratio_to_none']:.3f}, ratio of the fastest "
        f"calls {target['ratio_of_min_to_none']:.3f}."
    )
    lines += [
        "",
        "*paired ratio*: median over rounds of (variant / `none`) timed in the same round "
        "(slow drifts of the machine's load cancel); *XLA bytes/step*: XLA's static estimate "
        "of the bytes one scan step accesses (`compiled.cost_analysis()`), a noise-free "
        "cross-check (flops differ by < 1%). The 2-core CPU is shared with other jobs: "
        "medians move by up to ~10% between runs.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-envs", type=int, default=1024)
    p.add_argument("--rollout-length", type=int, default=128)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--inner", type=int, default=3)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--quick", action="store_true", help="tiny sizes; print only")
    p.add_argument("--out", type=Path, default=harness.RESULTS_DIR)
    args = p.parse_args(argv)
    names = ["none"] + [n for n in args.variants if n != "none"]
    if args.quick:
        res = run(8, 16, 3, 1, names)
    else:
        res = run(args.num_envs, args.rollout_length, args.repeats, args.inner, names)
    harness.finish(res, markdown(res), "transforms", None if args.quick else args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
