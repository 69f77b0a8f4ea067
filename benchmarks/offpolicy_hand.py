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
import functools
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
    how to build both loops, the evaluation target, the example's greedy params of a final
    state and its acting params at the first iteration (``acting(parts, state)``)."""

    name: str
    result: str
    cfg: Any
    target: str
    reached: Callable[[float], bool]
    greedy: Callable[[Any], Any]
    hand: Callable[[Any, Any], HandTrain]
    make_parts: Callable[[Any], Any]
    acting: Callable[[Any, Any], Any]


def algos(quick: bool) -> dict[str, Algo]:
    """DQN (CartPole-v1) and SAC (Pendulum-v1) at the examples' sizes (``quick``: theirs)."""
    return {
        "dqn": Algo("dqn", "dqn_cartpole", dqn.DQNConfig(**(dqn.QUICK if quick else {})),
                    "mean greedy evaluation return >= 475", lambda m: m >= 475,
                    lambda ts: {"q": ts.online, "epsilon": 0.0}, make_hand_dqn, dqn.make_parts,
                    lambda parts, ts: {"q": ts.online, "epsilon": parts.epsilon(0)}),
        "sac": Algo("sac", "sac_pendulum", sac.SACConfig(**(sac.QUICK if quick else {})),
                    "mean greedy evaluation return > -250", lambda m: m > -250,
                    lambda ts: ts.learner.actor, make_hand_sac, sac.make_parts,
                    lambda parts, ts: ts.learner.actor),
    }  # fmt: skip


def compiled(train: Callable, key: jax.Array) -> tuple[Callable, float]:
    """``train`` lowered and compiled for ``key``'s shape; the seconds it took."""
    t0 = time.perf_counter()
    fn = jax.jit(train).lower(key).compile()
    return fn, time.perf_counter() - t0


def collection_loops(algo: Algo, parts: Any, hand: HandTrain, iterations: int) -> dict:
    """Per loop, ``loop(key)``: ``iterations`` iterations of collection and buffer add only
    (no learner), from the training's first state with its first acting params; returns
    the final envs and buffer (kept, so nothing is optimised away)."""

    def jaxsampler(key: jax.Array) -> Any:
        ts = parts.init(key)
        params = algo.acting(parts, ts)

        def body(c: Any, _: Any) -> tuple[Any, None]:
            rstate, traj = parts.collect(params, c[0])
            return (rstate, parts.replay.add(c[1], traj)), None

        return jax.lax.scan(body, (ts.rollout, ts.buffer), None, iterations)[0]

    def by_hand(key: jax.Array) -> Any:
        hs = hand.init(key)
        params = hand.acting(hs, 0)

        def body(c: Any, _: Any) -> tuple[Any, None]:
            envs, tr = hand.run(params, c[0])
            return (envs, parts.replay.buffer.add(c[1], hand.items(tr))), None

        return jax.lax.scan(body, (hs.envs, hs.buffer), None, iterations)[0]

    return {"jaxsampler": jaxsampler, "hand": by_hand}


def collection_time(
    algo: Algo, parts: Any, hand: HandTrain, iterations: int, rounds: int
) -> dict[str, Any]:
    """Seconds per iteration of collection and buffer add alone, both loops, ``rounds``
    rounds in alternating order (medians, and the median paired ratio jaxsampler / hand)."""
    key = jax.random.PRNGKey(0)
    loops = collection_loops(algo, parts, hand, iterations)
    fns = {v: compiled(f, key)[0] for v, f in loops.items()}
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        for v in harness.alternated(VARIANTS, r):
            call = functools.partial(fns[v], jax.random.PRNGKey(r))
            times[v].append(harness.timed(call) / iterations)
    return {
        "iterations_per_call": iterations,
        "rounds": rounds,
        "s_per_iteration": {v: statistics.median(times[v]) for v in VARIANTS},
        "ratio": harness.paired_ratio(times["jaxsampler"], times["hand"]),
    }


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
    collection = collection_time(algo, parts, hand, min(500, cfg.num_iterations), 7)
    return {**summarize(algo, seeds, runs, compile_s), "collection": collection}


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
        "config_iterations": cfg.num_iterations,
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
        "same training written by hand (`benchmarks/offpolicy_baselines.py`: "
        "`jax.vmap(env.step)` in a `lax.scan`, a same-step auto-reset keeping the real final "
        "observation, n-step targets and items built by hand), both one `jax.jit` with the "
        "same network, "
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
        if "collection" in a:
            c, iters = a["collection"], a["config_iterations"]
            per = c["s_per_iteration"]
            share = {v: per[v] * iters / med[v] for v in per}
            lines += [
                "",
                f"Collection and buffer add alone (no learner; {c['iterations_per_call']} "
                f"iterations per call, {c['rounds']} rounds alternating): jaxsampler "
                f"{per['jaxsampler'] * 1e3:.3f} ms, hand {per['hand'] * 1e3:.3f} ms per "
                f"iteration, ratio **{c['ratio']:.2f}** (median paired); over a run's "
                f"{iters:,} iterations that is {share['jaxsampler']:.1%} (jaxsampler) and "
                f"{share['hand']:.1%} (hand) of the median training wall time: the learner "
                "takes the rest.",
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
