"""RLlib's PPO on CartPole-v1, sampled by jaxsampler's JaxEnvRunner (or RLlib's own runner).

The config is RLlib's tuned CartPole PPO (lr 3e-4, 6 epochs, vf_loss_coeff 0.01, one
shared 32-unit linear layer); the only difference between the two runs is
``env_runner_cls``. RLlib's learner, metrics, weight sync and checkpoints are used
unchanged::

    python -m examples.rllib_ppo --runner jax          # until mean return >= 450
    python -m examples.rllib_ppo --runner rllib        # the same config, RLlib's runner
    python -m examples.rllib_ppo --runner both --torch-threads 1 --out benchmarks/results/rllib_ppo
    python -m examples.rllib_ppo --quick               # two tiny iterations (CI)

Each iteration prints the env steps sampled so far, the mean return of the last 100
episodes (RLlib's ``episode_return_mean``) and the iteration's wall time; ``--out``
writes the learning curves as ``<out>.json`` and a Markdown table ``<out>.md``.
``--log-dir DIR`` (``--logger jsonl|tensorboard|wandb``) logs every iteration's return,
env steps/s and learner losses at step = env steps sampled (``DIR/<runner>`` with
``--runner both``); a progress bar counts iterations (``--quiet``: none).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any


def make_config(runner: str, *, quick: bool = False, seed: int = 0, num_envs: int = 16) -> Any:
    """RLlib's tuned CartPole PPO config; ``runner`` is ``"jax"`` or ``"rllib"``."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    from jaxsampler.integrations.rllib import JaxEnvRunner

    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=4 if quick else num_envs)
        .training(lr=3e-4, num_epochs=6, vf_loss_coeff=0.01)
        .rl_module(
            model_config=DefaultModelConfig(
                fcnet_hiddens=[32], fcnet_activation="linear", vf_share_layers=True
            )
        )
        .debugging(seed=seed)
    )
    if quick:
        config = config.training(train_batch_size_per_learner=128, minibatch_size=64, num_epochs=1)
    if runner == "jax":
        config = config.env_runners(env_runner_cls=JaxEnvRunner)
    elif runner != "rllib":
        raise ValueError(f"runner must be 'jax' or 'rllib', got {runner!r}")
    return config


def train(
    runner: str,
    *,
    quick: bool = False,
    target: float = 450.0,
    max_iterations: int = 200,
    max_seconds: float = 900.0,
    seed: int = 0,
    num_envs: int = 16,
    checkpoint_dir: str | None = None,
    logger: Any = None,
    quiet: bool | None = None,
) -> dict[str, Any]:
    """Trains until the mean return reaches ``target`` (or a limit); returns the curve.

    ``logger`` (a :class:`jaxsampler.integrations.loggers.Logger`) gets each iteration's scalars
    (:func:`iteration_scalars`) at step = env steps sampled; a progress bar over the
    iterations is drawn unless ``quiet`` (``None``: only on a terminal)."""
    import jaxsampler as js

    algo = make_config(runner, quick=quick, seed=seed, num_envs=num_envs).build_algo()
    curve: list[dict[str, float]] = []
    start = time.perf_counter()
    iterations = 2 if quick else max_iterations
    reached = False
    bar = js.integrations.progress.Bar(
        iterations, desc=f"rllib_ppo [{runner}]", unit="iter", quiet=quiet
    )

    def say(line: str) -> None:
        if bar.quiet:
            print(line, flush=True)
        else:
            bar.write(line)

    try:
        for i in range(iterations):
            t = time.perf_counter()
            result = algo.train()
            dt = time.perf_counter() - t
            er = result["env_runners"]
            point = {
                "iteration": i + 1,
                "env_steps": int(er["num_env_steps_sampled_lifetime"]),
                "episode_return_mean": float(er.get("episode_return_mean", float("nan"))),
                "iteration_s": dt,
                "wall_s": time.perf_counter() - start,
            }
            curve.append(point)
            steps_before = curve[-2]["env_steps"] if len(curve) > 1 else 0
            if logger is not None:
                logger.log(iteration_scalars(result, point, steps_before), step=point["env_steps"])
            bar.update(1, ret=point["episode_return_mean"])
            say(
                f"[{runner}] iter {point['iteration']:3d}  env steps {point['env_steps']:7d}  "
                f"return mean {point['episode_return_mean']:6.1f}  ({dt:.2f} s)"
            )
            if point["episode_return_mean"] >= target:
                reached = True
                break
            if point["wall_s"] > max_seconds:
                break
        if checkpoint_dir is not None:
            algo.save_to_path(checkpoint_dir)
    finally:
        bar.close()
        algo.stop()
    return {
        "runner": runner,
        "reached_target": reached,
        "target": target,
        "curve": curve,
        "seed": seed,
        "num_envs_per_env_runner": num_envs,
    }


def iteration_scalars(
    result: dict[str, Any], point: dict[str, Any], steps_before: int
) -> dict[str, float]:
    """What one iteration logs: ``episode_return_mean`` (if any episode ended so far),
    ``env_steps_per_s`` (of the iteration's wall time, learner included),
    ``iteration_s``, and the default policy's numeric learner results (losses, entropy,
    KL, learning rate) as ``learner/<name>``."""
    import math
    import numbers

    out = {
        "env_steps_per_s": (point["env_steps"] - steps_before) / point["iteration_s"],
        "iteration_s": point["iteration_s"],
    }
    if math.isfinite(point["episode_return_mean"]):
        out["episode_return_mean"] = point["episode_return_mean"]
    learner = result.get("learners", {}).get("default_policy", {})
    for k, v in learner.items():
        if hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
            v = v.item()
        if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v):
            out[f"learner/{k}"] = float(v)
    return out


def _markdown(runs: list[dict[str, Any]]) -> str:
    lines = [
        "# RLlib PPO on CartPole-v1: JaxEnvRunner vs RLlib's SingleAgentEnvRunner",
        "",
        "`examples/rllib_ppo.py` (RLlib's tuned CartPole PPO config, same seed; only "
        "`env_runner_cls` differs; each run stops at the first iteration with a mean return "
        ">= 450 over the last 100 episodes). Wall times on a 2-core CPU shared with other "
        "jobs (the two runs did not see the same load, and the learner dominates an "
        "iteration): see benchmarks/results/rllib.md for side-by-side throughput.",
        "",
        "| runner | reached 450 | iterations | env steps | final return mean | wall s | "
        "median s/iteration |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        c = run["curve"]
        its = sorted(p["iteration_s"] for p in c)
        lines.append(
            f"| {run['runner']} | {'yes' if run['reached_target'] else 'no'} | {len(c)} | "
            f"{c[-1]['env_steps']} | {c[-1]['episode_return_mean']:.1f} | "
            f"{c[-1]['wall_s']:.0f} | {its[len(its) // 2]:.2f} |"
        )
    lines += ["", "Return mean by env steps sampled:", ""]
    marks = (10_000, 25_000, 50_000, 75_000, 100_000, 150_000, 200_000)
    lines.append("| runner | " + " | ".join(f"{m // 1000}k" for m in marks) + " |")
    lines.append("|---|" + "---:|" * len(marks))
    for run in runs:
        cells = []
        for m in marks:
            pts = [p for p in run["curve"] if p["env_steps"] <= m]
            ran_past = run["curve"][-1]["env_steps"] >= m
            cells.append(f"{pts[-1]['episode_return_mean']:.0f}" if pts and ran_past else "")
        lines.append(f"| {run['runner']} | " + " | ".join(cells) + " |")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runner", choices=("jax", "rllib", "both"), default="jax")
    parser.add_argument("--quick", action="store_true", help="two tiny iterations (CI)")
    parser.add_argument("--target", type=float, default=450.0)
    parser.add_argument("--max-iterations", type=int, default=200)
    parser.add_argument("--max-seconds", type=float, default=900.0)
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write <out>.json and <out>.md (learning curves)")
    parser.add_argument(
        "--torch-threads",
        type=int,
        help="torch intra-op threads (default: torch's); 1 is faster on a small shared CPU",
    )
    import jaxsampler as js

    js.integrations.loggers.add_arguments(parser)  # --log-dir, --logger, --quiet
    args = parser.parse_args(argv)
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    runners = ("jax", "rllib") if args.runner == "both" else (args.runner,)
    runs = []
    for r in runners:
        log_dir = args.log_dir
        if log_dir is not None and len(runners) > 1:
            log_dir = Path(log_dir) / r  # one run (one step axis) per runner
        kind = args.logger or ("jsonl" if log_dir is not None else "none")
        extra = {"name": f"rllib_ppo-{r}"} if kind == "wandb" else {}
        with js.integrations.loggers.make_logger(kind, log_dir, **extra) as logger:
            runs.append(
                train(
                    r,
                    quick=args.quick,
                    target=args.target,
                    max_iterations=args.max_iterations,
                    max_seconds=args.max_seconds,
                    seed=args.seed,
                    num_envs=args.num_envs,
                    logger=logger,
                    quiet=args.quiet,
                )
            )
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out + ".json", "w") as f:
            meta = {"config": "examples/rllib_ppo.py", "torch_threads": args.torch_threads}
            json.dump({**meta, "runs": runs}, f, indent=1)
        with open(args.out + ".md", "w") as f:
            f.write(_markdown(runs))
    for run in runs:
        last = run["curve"][-1]
        print(
            f"{run['runner']}: return mean {last['episode_return_mean']:.1f} after "
            f"{last['env_steps']} env steps, {last['wall_s']:.0f} s"
            + ("" if args.quick else f" (target {args.target}: {run['reached_target']})")
        )
    return runs


if __name__ == "__main__":
    main()
