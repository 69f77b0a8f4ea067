"""Plots the learning curves of the off-policy and IMPALA examples from their result files
(no training): ``benchmarks/results/{dqn_cartpole,sac_pendulum,impala_host}.png``.

* ``dqn_cartpole.png`` / ``sac_pendulum.png``: mean training return by env steps, one
  solid line per seed of the example's own run (``dqn_cartpole.json`` /
  ``sac_pendulum.json``, written by ``python -m examples.dqn`` / ``examples.sac``) and,
  when ``offpolicy_hand.json`` holds the algorithm, one dashed line per seed of the
  hand-written loop (``python -m benchmarks.offpolicy_hand``);
* ``impala_host.png``: the same for ``impala_host.json`` (``python -m examples.impala_host
  --compare``), solid async, dashed sync.

Usage: ``python -m benchmarks.plot_offpolicy [--results DIR] [--out DIR]``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from matplotlib.ticker import FuncFormatter

from benchmarks import harness

plt = harness.pyplot()

#: result file -> (offpolicy_hand.json key, title, target line)
OFFPOLICY = {
    "dqn_cartpole": ("dqn", "Double DQN on CartPole-v1 (examples/dqn.py)", 475.0),
    "sac_pendulum": ("sac", "SAC on Pendulum-v1 (examples/sac.py)", -250.0),
}
PLAIN = FuncFormatter(lambda x, _pos: f"{x:,.0f}")


def _cpus(machine: Any) -> str:
    """``"2-core CPU"`` from a record's machine (the examples' sentence or a harness dict)."""
    if isinstance(machine, dict):
        return f"{machine['cpus']}-core CPU"
    return str(machine).split(" ", 1)[0] + " CPU"


def _points(curve: list[float | None], window_steps: int) -> tuple[list[int], list[float]]:
    """A windowed curve as (env steps at each window's end, value), windows without a
    finished episode left out."""
    xs = [(k + 1) * window_steps for k, v in enumerate(curve) if v is not None]
    return xs, [v for v in curve if v is not None]


def _finish(ax: Any, title: str, target: float, out: Path) -> Path:
    ax.axhline(target, color="grey", lw=0.8, ls=":", label=f"eval target {target:g}")
    ax.set_xlabel("env steps per seed")
    ax.set_ylabel("mean training episode return")
    ax.set_title(title, fontsize=10)
    ax.xaxis.set_major_formatter(PLAIN)
    ax.yaxis.set_major_formatter(PLAIN)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="best")
    ax.figure.tight_layout()
    ax.figure.savefig(out, dpi=110)
    plt.close(ax.figure)
    return out


def plot_example(results: Path, name: str, out_dir: Path) -> Path:
    """``<name>.png`` from ``<name>.json`` (solid) and ``offpolicy_hand.json`` (dashed)."""
    key, what, target = OFFPOLICY[name]
    rec = json.loads((results / f"{name}.json").read_text())
    cfg = rec["config"]
    window = max(1, cfg["log_every"]) * cfg["num_envs"] * cfg["rollout_length"]
    fig, ax = plt.subplots(figsize=(8, 4.6))
    for i, (seed, curve) in enumerate(
        zip(rec["seeds"], rec["train_return_curve_per_seed"], strict=True)
    ):
        ax.plot(*_points(curve, window), color=f"C{i}", lw=1.2, label=f"seed {seed}, example")
    hand_path = results / "offpolicy_hand.json"
    hand = json.loads(hand_path.read_text())["algos"].get(key) if hand_path.exists() else None
    colors = {s: f"C{i}" for i, s in enumerate(rec["seeds"])}
    if hand is not None:
        for run in (r for r in hand["runs"] if r["variant"] == "hand"):
            color = colors.setdefault(run["seed"], f"C{len(colors)}")
            xs, ys = _points(run["train_return_curve"], hand["curve_window_env_steps"])
            ax.plot(xs, ys, color=color, lw=1.2, ls="--", label=f"seed {run['seed']}, by hand")
    title = (
        f"{what}, measured on a {_cpus(rec['machine'])}\nmean return of the training "
        f"episodes ended per {window:,} env steps; solid: example"
        + (", dashed: by hand" if hand is not None else "")
    )
    return _finish(ax, title, target, out_dir / f"{name}.png")


def plot_impala(results: Path, out_dir: Path) -> Path:
    """``impala_host.png`` from ``impala_host.json`` (async solid, sync dashed)."""
    rec = json.loads((results / "impala_host.json").read_text())
    fig, ax = plt.subplots(figsize=(8, 4.6))
    seeds = sorted({r["seed"] for r in rec["runs"]})
    for run in sorted(rec["runs"], key=lambda r: (r["mode"], r["seed"])):
        xs = [p[0] for p in run["train_return_curve"]]
        ys = [p[1] for p in run["train_return_curve"]]
        ls = "-" if run["mode"] == "async" else "--"
        color = f"C{seeds.index(run['seed'])}"
        ax.plot(xs, ys, color=color, ls=ls, lw=1.2, label=f"seed {run['seed']}, {run['mode']}")
    title = (
        f"IMPALA on Gymnasium CartPole-v1 (examples/impala_host.py), measured on a "
        f"{rec['cpus']}-core CPU\nmean training episode return over the last 20 batches; "
        "solid: async (AsyncActor), dashed: sync"
    )
    return _finish(ax, title, 475.0, out_dir / "impala_host.png")


def plot_all(results: Path, out_dir: Path) -> list[Path]:
    """Every plot of this module, written to ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [plot_example(results, name, out_dir) for name in OFFPOLICY]
    return paths + [plot_impala(results, out_dir)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=harness.RESULTS_DIR)
    p.add_argument("--out", type=Path, default=None, help="default: the results folder")
    args = p.parse_args(argv)
    for path in plot_all(args.results, args.out or args.results):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
