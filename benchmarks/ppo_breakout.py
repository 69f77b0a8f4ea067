"""PPO on gymnax:Breakout-MinAtar with js.CNNPolicy: jaxsampler's rollout vs the handwritten
gymnax vmap+scan loop, same seeds and hyper-parameters (examples/ppo.py).

    python -m examples.ppo --env Breakout-MinAtar --sampler jaxsampler --seeds 2 --json a.json
    python -m examples.ppo --env Breakout-MinAtar --sampler handwritten --seeds 2 --json b.json
    python -m benchmarks.ppo_breakout a.json b.json   # -> results/ppo_breakout.{json,md,png}

Agreement: the two samplers' curves agree within seed noise when, at every logged update
(smoothed over a window), the gap between the sampler means is at most the spread (max -
min) of the per-seed curves of both samplers together at that update.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from benchmarks import harness

RESULTS = harness.RESULTS_DIR


def smooth(curve: np.ndarray, window: int) -> np.ndarray:
    """NaN-aware trailing mean over ``window`` updates: ``[seeds, n] -> [seeds, n]``."""
    out = np.full(curve.shape, np.nan)
    for i in range(curve.shape[1]):
        w = curve[:, max(0, i - window + 1) : i + 1]
        ok = np.isfinite(w)
        out[:, i] = np.where(
            ok.any(1), np.where(ok, w, 0).sum(1) / np.maximum(ok.sum(1), 1), np.nan
        )
    return out


def main(paths: list[str]) -> int:
    runs = {}
    for p in paths:
        res = json.loads(Path(p).read_text())
        runs[res["config"]["sampler"]] = res
    steps_per_update = (
        runs["jaxsampler"]["config"]["num_envs"] * runs["jaxsampler"]["config"]["rollout_length"]
    )
    curves = {k: np.asarray(r["learning_curve_per_seed"], float) for k, r in runs.items()}
    n = next(iter(curves.values())).shape[1]
    window = max(1, n // 10)
    sm = {k: smooth(c, window) for k, c in curves.items()}
    means = {k: np.nanmean(c, 0) for k, c in sm.items()}
    both = np.concatenate(list(sm.values()))
    spread = np.nanmax(both, 0) - np.nanmin(both, 0)
    gap = np.abs(means["jaxsampler"] - means["handwritten"])
    agree = bool(np.all(gap[np.isfinite(gap)] <= spread[np.isfinite(gap)] + 1e-9))
    sps = {k: r["env_steps_per_s"] for k, r in runs.items()}
    out = {
        "env": runs["jaxsampler"]["config"]["env_id"],
        "config": runs["jaxsampler"]["config"],
        "seeds": runs["jaxsampler"]["seeds"],
        "env_steps_per_seed": runs["jaxsampler"]["env_steps_per_seed"],
        "env_steps_per_s": sps,
        "compile_s": {k: r["compile_s"] for k, r in runs.items()},
        "wall_s": {k: r["wall_s"] for k, r in runs.items()},
        "ratio_jaxsampler_over_handwritten": sps["jaxsampler"] / sps["handwritten"],
        "final_mean_return_per_seed": {k: r["final_mean_return_per_seed"] for k, r in runs.items()},
        "smoothing_window_updates": window,
        "max_gap_of_means": float(np.nanmax(gap)),
        "agree_within_seed_spread": agree,
        "learning_curve_per_seed": {k: r["learning_curve_per_seed"] for k, r in runs.items()},
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "ppo_breakout.json").write_text(json.dumps(out, indent=1) + "\n")
    fin = out["final_mean_return_per_seed"]
    md = [
        "# PPO on gymnax:Breakout-MinAtar, CNN policy: jaxsampler vs handwritten gymnax loop",
        "",
        f"{out['seeds']} seeds x {out['env_steps_per_seed']:,} env steps per sampler, "
        "shared 2-core CPU (other jobs running: absolute speeds are noisy), "
        "examples/ppo.py defaults for Breakout-MinAtar.",
        "",
        "| sampler | env steps/s | compile s | train s | final return per seed |",
        "|---|---:|---:|---:|---|",
    ]
    for k in ("jaxsampler", "handwritten"):
        md.append(
            f"| {k} | {sps[k]:,.0f} | {out['compile_s'][k]:.1f} | {out['wall_s'][k]:.1f} | "
            + ", ".join(f"{v:.2f}" for v in fin[k])
            + " |"
        )
    md += [
        "",
        f"Ratio jaxsampler / handwritten steps/s: {out['ratio_jaxsampler_over_handwritten']:.2f}.",
        "",
        f"Curves agree within seed noise: {agree} (rule: after a {window}-update "
        "trailing mean, the gap between the two samplers' mean curves never exceeds the "
        "max-min spread of all per-seed "
        f"curves at that update; largest gap {out['max_gap_of_means']:.2f}).",
        "",
        "![curves](ppo_breakout.png)",
        "",
    ]
    (RESULTS / "ppo_breakout.md").write_text("\n".join(md))

    plt = harness.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = (np.arange(n) + 1) * steps_per_update
    for k, color in (("jaxsampler", "tab:blue"), ("handwritten", "tab:orange")):
        for i, c in enumerate(sm[k]):
            ax.plot(x, c, color=color, alpha=0.35, lw=1, label=f"{k} seed {i}")
        ax.plot(x, means[k], color=color, lw=2.5, label=f"{k} mean")
    ax.set_xlabel("env steps per seed")
    ax.set_ylabel(f"episode return (trailing mean over {window} updates)")
    ax.ticklabel_format(style="plain", axis="x")
    ax.set_title(
        "PPO + CNNPolicy on gymnax Breakout-MinAtar, 2-core CPU:\n"
        "jaxsampler rollout vs handwritten gymnax loop"
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / "ppo_breakout.png", dpi=110)
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
