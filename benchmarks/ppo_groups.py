"""PPO per agent group on PredatorPrey-v0 (``examples/ppo_groups.py``): who learns decides
the capture rate. Runs the example with the predators learning against a random prey, the
prey learning against random predators, and both learning, and writes the capture rate
over training (JSON, Markdown and a plot).

Usage::

    python -m benchmarks.ppo_groups            # writes results/ppo_groups.{json,md,png}
    python -m benchmarks.ppo_groups --quick    # smoke test, prints only
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import harness
from examples import ppo_groups

NAME = "ppo_groups"
MODES = ("predator", "prey", "both")
SIZES = harness.Sizes(
    full={"total_timesteps": 300_000, "num_envs": 16, "seeds": 3},
    quick={"total_timesteps": 256, "num_envs": 2, "seeds": 1},
)


def run(mode: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        argv = ["--train", mode, "--seed", str(seed), "--quiet", "--json", str(out)]
        argv += ["--total-timesteps", str(args.total_timesteps)]
        argv += ["--num-envs", str(args.num_envs)]
        if args.quick:
            argv += ["--rollout-length", "32"]
        ppo_groups.main(argv)
        return json.loads(out.read_text())


def rate_at(curve: list[list[float]], fraction: float) -> float:
    """Mean capture rate over the tenth of iterations ending at ``fraction`` of the run."""
    if not curve:
        return float("nan")
    n = len(curve)
    end = max(1, round(n * fraction))
    return float(np.mean([c for _, c, _ in curve[max(0, end - max(1, n // 10)) : end]]))


def markdown(res: dict[str, Any]) -> str:
    a = res["args"]
    lines = [
        "# PPO per agent group on PredatorPrey-v0: the capture rate depends on who learns",
        "",
        f"{res['stamp']['date']} · `{res['stamp']['command']}` · 2 predators "
        f"(`Box(4,)`, `Discrete(5)`) and a faster prey (`Box(6,)`, `Discrete(9)`), each group's "
        f"policy a 64x64 MLP on its own spaces or uniformly random; {a['total_timesteps']:,} "
        f"env steps per run, {a['num_envs']} envs x 128 steps per iteration, "
        f"{a['seeds']} seeds; a shared 2-core CPU.",
        "",
        "Capture rate: the share of episodes that end with a capture (the others reach the "
        "50-step limit), in the first iteration (sampled before any update: the untrained "
        "policies) and averaged over the first and last tenth of the iterations.",
        "",
        "| who learns | seed | capture rate, first iteration | first tenth | last tenth | wall s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in res["runs"]:
        lines.append(
            f"| {r['train']} | {r['seed']} | {r['curve'][0][1]:.2f} | {r['first']:.2f} "
            f"| {r['last']:.2f} "
            f"| {r['wall_s']:.0f} |"
        )
    lines += [
        "",
        "The predators learn to catch a random prey, the prey learns to escape random "
        "predators; with both learning, the rate follows whichever side is ahead.",
        "",
    ]
    return "\n".join(lines)


def plot(res: dict[str, Any], path: Path) -> None:
    plt = harness.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    colors = {"predator": "tab:red", "prey": "tab:green", "both": "tab:blue"}
    for r in res["runs"]:
        # a trailing mean over 5 iterations, at the last one's step
        w = min(5, len(r["curve"]))
        steps = [s / 1000 for s, _, _ in r["curve"]][w - 1 :]
        rates = np.convolve([c for _, c, _ in r["curve"]], np.ones(w) / w, mode="valid")
        who = {"predator": "predators learn", "prey": "prey learns", "both": "both learn"}
        label = who[r["train"]] if r["seed"] == 0 else None
        ax.plot(steps, rates, color=colors[r["train"]], alpha=0.8, label=label)
    ax.set_xlabel("env steps (thousands)")
    ax.set_ylabel("capture rate (share of episodes)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("PredatorPrey-v0, PPO per agent group, 3 seeds each (2-core CPU)")
    ax.legend(loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--total-timesteps", type=int)
    p.add_argument("--num-envs", type=int)
    p.add_argument("--seeds", type=int)
    harness.add_quick_out(p, NAME)
    args = SIZES.apply(p.parse_args(argv))
    runs = []
    for mode in MODES:
        for seed in range(args.seeds):
            harness.log(f"{mode} seed {seed}")
            r = run(mode, seed, args)
            r.update(seed=seed, first=rate_at(r["curve"], 0.1), last=rate_at(r["curve"], 1.0))
            runs.append(r)
    res = {
        "stamp": harness.stamp(NAME, NAME, argv),
        "args": {k: getattr(args, k) for k in ("total_timesteps", "num_envs", "seeds")},
        "runs": runs,
    }
    out = harness.results_dir(args.out, args.quick)
    harness.finish(res, markdown(res), NAME, out, plot=plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
