"""Plots the RLlib interop results: ``benchmarks/results/rllib.png``.

Left: RLlib PPO on CartPole-v1, mean episode return by env steps sampled, with
``JaxEnvRunner`` and with RLlib's ``SingleAgentEnvRunner`` (``rllib_ppo.json``, written by
``python -m examples.rllib_ppo --out``). Right: env steps/s of the runners' ``sample()`` at
64 and 1024 envs (``rllib.json``, written by ``python -m benchmarks.rllib``), medians, with
the ratio.

Usage: ``python -m benchmarks.plot_rllib [--results benchmarks/results]``
"""

from __future__ import annotations

import argparse
import json
import pathlib

from matplotlib.ticker import FuncFormatter

from benchmarks import harness

plt = harness.pyplot()

LABELS = {"jax": "JaxEnvRunner (jaxsampler)", "rllib": "RLlib SingleAgentEnvRunner"}
COLORS = {"jax": "tab:blue", "rllib": "tab:orange"}


def _thousands(x: float, _pos: object = None) -> str:
    return f"{x / 1000:g}k" if x >= 1000 else f"{x:g}"


def plot(results: pathlib.Path) -> pathlib.Path:
    ppo = json.loads((results / "rllib_ppo.json").read_text())
    bench = json.loads((results / "rllib.json").read_text())
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))

    for run in ppo["runs"]:
        steps = [p["env_steps"] for p in run["curve"]]
        returns = [p["episode_return_mean"] for p in run["curve"]]
        ax1.plot(steps, returns, label=LABELS[run["runner"]], color=COLORS[run["runner"]])
    ax1.axhline(450, color="grey", lw=0.8, ls="--", label="target 450")
    ax1.set_xlabel("env steps sampled")
    ax1.set_ylabel("mean episode return (last 100 episodes)")
    ax1.set_title("RLlib PPO on CartPole-v1: same config and seed")
    ax1.xaxis.set_major_formatter(FuncFormatter(_thousands))
    ax1.legend(loc="lower right")
    ax1.grid(alpha=0.3)

    rows = bench["sampling"]
    xs = range(len(rows))
    width = 0.38
    for i, kind in enumerate(("jax", "rllib")):
        vals = [r[f"{kind}_median"] for r in rows]
        ax2.bar(
            [x + (i - 0.5) * width for x in xs], vals, width, label=LABELS[kind], color=COLORS[kind]
        )
    for x, r in zip(xs, rows, strict=True):
        ax2.annotate(
            f"{r['ratio']:.1f}x", (x - 0.5 * width, r["jax_median"]), ha="center", va="bottom"
        )
    ax2.set_ylim(0, 1.3 * max(r["jax_median"] for r in rows))
    ax2.set_xticks(list(xs), [f"{r['num_envs']} envs" for r in rows])
    ax2.set_ylabel("env steps/s of sample() (median)")
    ax2.set_title(f"sample() throughput, CartPole, 256x256 module, {bench['machine']['cpus']} CPUs")
    ax2.yaxis.set_major_formatter(FuncFormatter(_thousands))
    ax2.legend(loc="upper left")
    ax2.grid(alpha=0.3, axis="y")

    fig.tight_layout()
    out = results / "rllib.png"
    fig.savefig(out, dpi=110)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=pathlib.Path, default=harness.RESULTS_DIR)
    print(plot(parser.parse_args().results))


if __name__ == "__main__":
    main()
