"""The off-policy examples against the same algorithms written by hand, side by side.

For DQN (``examples/dqn.py``) and SAC (``examples/sac.py``): every seed trained by the
example and by its hand-written twin (:mod:`benchmarks.offpolicy_baselines`: same network,
hyperparameters, buffer and learner update, the collection written PureJaxRL style), the
two runs in alternating order, each compiled beforehand and timed alone; the wall-time
ratio jaxsampler / hand per seed and its median; the final greedy evaluation of both.
Writes ``benchmarks/results/offpolicy_hand.{json,md}``:

    python -m benchmarks.offpolicy_hand             # DQN and SAC, seeds 0 1 2
    python -m benchmarks.offpolicy_hand --quick     # tiny sizes; prints only
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from benchmarks import harness
from benchmarks.offpolicy_baselines import HandTrain, make_hand_dqn, make_hand_sac
from examples import dqn, sac
from examples import offpolicy_common as common

VARIANTS = ("jaxsampler", "hand")

# --------------------------------------------------------------------------- side by side


@dataclasses.dataclass(frozen=True)
class Algo:
    """One algorithm of the benchmark: its config (the example's defaults, or ``--quick``'s),
    how to build both loops, the evaluation target and the example's greedy params."""

    name: str
    result: str
    cfg: Any
    target: str
    reached: Callable[[float], bool]
    greedy: Callable[[Any], Any]
    hand: Callable[[Any, Any], HandTrain]
    make_parts: Callable[[Any], Any]


def algos(quick: bool) -> dict[str, Algo]:
    """DQN (CartPole-v1) and SAC (Pendulum-v1) at the examples' sizes (``quick``: theirs)."""
    return {
        "dqn": Algo("dqn", "dqn_cartpole", dqn.DQNConfig(**(dqn.QUICK if quick else {})),
                    "mean greedy evaluation return >= 475", lambda m: m >= 475,
                    lambda ts: {"q": ts.online, "epsilon": 0.0}, make_hand_dqn, dqn.make_parts),
        "sac": Algo("sac", "sac_pendulum", sac.SACConfig(**(sac.QUICK if quick else {})),
                    "mean greedy evaluation return > -250", lambda m: m > -250,
                    lambda ts: ts.learner.actor, make_hand_sac, sac.make_parts),
    }  # fmt: skip


def compiled(train: Callable, key: jax.Array) -> tuple[Callable, float]:
    """``train`` lowered and compiled for ``key``'s shape; the seconds it took."""
    t0 = time.perf_counter()
    fn = jax.jit(train).lower(key).compile()
    return fn, time.perf_counter() - t0


def side_by_side(algo: Algo, seeds: Sequence[int]) -> dict[str, Any]:
    """Trains every seed with both loops (the order alternating by seed: jaxsampler first
    on even rounds), each run timed alone and blocked on; evaluates each final greedy
    policy (the example's ``js.evaluate`` episodes, the same evaluation keys)."""
    cfg = algo.cfg
    parts = algo.make_parts(cfg)
    hand = algo.hand(cfg, parts)
    key0 = jax.random.PRNGKey(seeds[0])
    fns, compile_s = {}, {}
    fns["jaxsampler"], compile_s["jaxsampler"] = compiled(
        common.scan_train(parts.iteration, parts.init, cfg.num_iterations), key0
    )
    fns["hand"], compile_s["hand"] = compiled(hand.train, key0)
    greedy = {"jaxsampler": algo.greedy, "hand": hand.greedy}
    runs = []
    for r, seed in enumerate(seeds):
        for order, variant in enumerate(harness.alternated(VARIANTS, r)):
            harness.log(f"{algo.name} seed {seed}: {variant}")
            t0 = time.perf_counter()
            state, metrics = jax.block_until_ready(fns[variant](jax.random.PRNGKey(seed)))
            wall = time.perf_counter() - t0
            ev = common.evaluate(
                parts.env, parts.policy, greedy[variant](state), cfg.eval_episodes, seed
            )
            curve = common.curve(jax.device_get(metrics), max(1, cfg.log_every))
            runs.append({
                "variant": variant, "seed": seed, "order": order, "wall_s": wall,
                "eval_mean_return": float(ev.mean()), "eval_returns": ev.tolist(),
                "train_return_curve": [float(v) if np.isfinite(v) else None for v in curve],
            })  # fmt: skip
            harness.log(f"  {wall:.1f} s, eval {ev.mean():.1f}")
    return summarize(algo, seeds, runs, compile_s)


def summarize(
    algo: Algo, seeds: Sequence[int], runs: list[dict[str, Any]], compile_s: dict[str, float]
) -> dict[str, Any]:
    """One algorithm's record: config, runs, compile times, median wall per loop, the
    paired ratio jaxsampler / hand per seed and its median, seeds reaching the target."""
    cfg = algo.cfg
    by = {(r["variant"], r["seed"]): r for r in runs}
    wall = {v: [by[v, s]["wall_s"] for s in seeds] for v in VARIANTS}
    ratios = [j / h for j, h in zip(wall["jaxsampler"], wall["hand"], strict=True)]
    reached = {v: sum(algo.reached(by[v, s]["eval_mean_return"]) for s in seeds) for v in VARIANTS}
    return {
        "example": f"examples/{algo.name}.py",
        "env_id": cfg.env_id,
        "config": dataclasses.asdict(cfg),
        "env_steps_per_run": cfg.num_iterations * cfg.steps_per_iteration,
        "curve_window_env_steps": max(1, cfg.log_every) * cfg.steps_per_iteration,
        "seeds": list(seeds),
        "target": algo.target,
        "compile_s": compile_s,
        "runs": runs,
        "wall_s_median": {v: statistics.median(wall[v]) for v in VARIANTS},
        "ratio_per_seed": ratios,
        "ratio_median": statistics.median(ratios),
        "reached_target": reached,
    }


def markdown(res: dict[str, Any]) -> str:
    """The tables of :func:`main`'s record."""
    at = res["measured_at"]
    lines = [
        "# Off-policy examples against the same algorithms written by hand",
        "",
        f"{at['date']} · commit `{at['commit'][:10]}` · {res['machine']}, load "
        f"{at['load'][0]:.1f} · jax {res['jax']} · `{res['command']}`",
        "",
        "Each example (`examples/dqn.py`, `examples/sac.py`: `js.make_rollout` collects, "
        "`jaxsampler.offpolicy` builds the n-step targets and the buffer's items) against the "
        "same training written by hand (`benchmarks/offpolicy_hand.py`: `jax.vmap(env.step)` "
        "in a `lax.scan`, a same-step auto-reset keeping the real final observation, n-step "
        "targets and items built by hand), both one `jax.jit` with the same network, "
        "hyperparameters, flashbax buffer and learner update (the example's own). Runs "
        "alternate (jaxsampler first for even seeds); wall: one training run, compiled "
        "beforehand, blocked on. Ratio: jaxsampler / hand of the same seed, median over seeds.",
    ]
    for name, a in res["algos"].items():
        by = {(r["variant"], r["seed"]): r for r in a["runs"]}
        lines += [
            "",
            f"## {name.upper()} on {a['env_id']} ({a['env_steps_per_run']:,} env steps per run)",
            "",
            f"Compile: jaxsampler {a['compile_s']['jaxsampler']:.1f} s, hand "
            f"{a['compile_s']['hand']:.1f} s. Target: {a['target']}.",
            "",
            "| seed | jaxsampler wall s | hand wall s | ratio | jaxsampler eval | hand eval |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for s, ratio in zip(a["seeds"], a["ratio_per_seed"], strict=True):
            j, h = by["jaxsampler", s], by["hand", s]
            lines.append(
                f"| {s} | {j['wall_s']:.1f} | {h['wall_s']:.1f} | {ratio:.3f} | "
                f"{j['eval_mean_return']:.1f} | {h['eval_mean_return']:.1f} |"
            )
        med, n = a["wall_s_median"], len(a["seeds"])
        lines += [
            f"| median | {med['jaxsampler']:.1f} | {med['hand']:.1f} | "
            f"**{a['ratio_median']:.3f}** | | |",
            "",
            f"Target reached: jaxsampler {a['reached_target']['jaxsampler']}/{n} seeds, hand "
            f"{a['reached_target']['hand']}/{n}.",
        ]
    lines += ["", res["notes"], ""]
    return "\n".join(lines)


NOTES = (
    "Both loops make the configured number of env steps; jaxsampler's rollout spends one of "
    "them per episode on a masked reset step (stored with `valid = False`), the hand loop "
    "resets in the same step, so it learns from slightly more real transitions (under 1 % "
    "here). Learning curves: `dqn_cartpole.png`, `sac_pendulum.png` "
    "(`python -m benchmarks.plot_offpolicy`)."
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algos", nargs="+", choices=["dqn", "sac"], default=["dqn", "sac"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    harness.add_quick_out(p, "offpolicy_hand")
    args = p.parse_args(argv)
    table = algos(args.quick)
    res: dict[str, Any] = harness.stamp("offpolicy_hand", "offpolicy_hand", argv)
    res |= {"jax": jax.__version__, "machine": common.machine(), "notes": NOTES}
    res["algos"] = {a: side_by_side(table[a], args.seeds) for a in args.algos}
    res["measured_at"] = harness.measured_at()
    harness.finish(res, markdown(res), "offpolicy_hand", harness.results_dir(args.out, args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
