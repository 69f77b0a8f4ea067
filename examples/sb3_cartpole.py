"""Stable-Baselines3's PPO trains jaxsampler's CartPole-v1 through ``js.to_gymnasium``.

No glue: SB3's own ``make_vec_env`` builds its ``DummyVecEnv`` (with ``Monitor``) from
``js.to_gymnasium("CartPole-v1")``, SB3's ``check_env`` accepts the env, and the trained
policy is evaluated with SB3's ``evaluate_policy`` on a fresh face, over ``--eval-episodes``
deterministic episodes. The result goes to ``benchmarks/results/sb3_cartpole.json`` / ``.md``.

    python -m examples.sb3_cartpole                       # 150k steps, a few minutes on CPU
    python -m examples.sb3_cartpole --quick               # 4k steps, prints only

Hyperparameters: the usual ones for PPO on CartPole (8 envs, 32 steps each per rollout,
minibatches of 256, 20 epochs, gamma 0.98, GAE lambda 0.8, learning rate and clip range
decaying linearly from 1e-3 and 0.2).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from typing import Any

import numpy as np

import jaxsampler as js
from benchmarks import harness

ENV_ID = "CartPole-v1"


def train(total_timesteps: int, seed: int, eval_episodes: int) -> dict[str, Any]:
    """Trains SB3's PPO on ``js.to_gymnasium(ENV_ID)`` and evaluates it; returns the record."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_checker import check_env
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor

    torch.set_num_threads(1)
    check_env(js.to_gymnasium(ENV_ID))  # SB3's own checker: raises if it refuses the env
    venv = make_vec_env(lambda: js.to_gymnasium(ENV_ID), n_envs=8, seed=seed)
    model = PPO(
        "MlpPolicy",
        venv,
        n_steps=32,
        batch_size=256,
        n_epochs=20,
        gamma=0.98,
        gae_lambda=0.8,
        ent_coef=0.0,
        learning_rate=lambda progress: 1e-3 * progress,
        clip_range=lambda progress: 0.2 * progress,
        seed=seed,
        device="cpu",
        verbose=0,
    )
    t0 = time.perf_counter()
    model.learn(total_timesteps=total_timesteps)
    train_s = time.perf_counter() - t0
    eval_env = Monitor(js.to_gymnasium(ENV_ID))
    eval_env.reset(seed=seed + 1000)
    returns, lengths = evaluate_policy(
        model,
        eval_env,
        n_eval_episodes=eval_episodes,
        deterministic=True,
        return_episode_rewards=True,
    )
    train_returns = [float(ep["r"]) for ep in model.ep_info_buffer]
    return {
        "env": ENV_ID,
        "timesteps": int(model.num_timesteps),
        "seed": seed,
        "train_s": round(train_s, 1),
        "eval_episodes": eval_episodes,
        "eval_mean_return": float(np.mean(returns)),
        "eval_std_return": float(np.std(returns)),
        "eval_returns": [float(r) for r in returns],
        "eval_lengths": [int(n) for n in lengths],
        "last_train_mean_return": float(np.mean(train_returns)) if train_returns else None,
        "threshold": 475.0,
        "reached": bool(np.mean(returns) >= 475.0),
    }


def markdown(res: dict[str, Any]) -> str:
    """The result as a short Markdown page."""
    verdict = "reaches" if res["reached"] else "does NOT reach"
    return (
        "# Stable-Baselines3 PPO on `js.to_gymnasium('CartPole-v1')` (examples/sb3_cartpole.py)\n\n"
        f"{res['date']} · commit {res['git'].get('commit', '?')[:10]} · `{res['command']}` · "
        f"{res['machine']}\n\n"
        "SB3's `make_vec_env` (8 `DummyVecEnv` copies of the single-env face, `Monitor`), "
        "SB3's `check_env`, SB3's `evaluate_policy`; no glue code.\n\n"
        "| timesteps | train s | eval episodes | eval mean return | eval std | last train "
        "episodes' mean |\n|---:|---:|---:|---:|---:|---:|\n"
        f"| {res['timesteps']:,} | {res['train_s']} | {res['eval_episodes']} | "
        f"{res['eval_mean_return']:.1f} | {res['eval_std_return']:.1f} | "
        f"{harness.fmt(res['last_train_mean_return'], '.1f')} |\n\n"
        f"The trained policy {verdict} the CartPole-v1 threshold of 475 (deterministic "
        "evaluation on a fresh face).\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--total-timesteps", type=int, default=None, help="default 150k (--quick 4k)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-episodes", type=int, default=None, help="default 20 (--quick 3)")
    harness.add_quick_out(p, "sb3_cartpole")
    args = p.parse_args(argv)
    steps = args.total_timesteps or (4096 if args.quick else 150_000)
    episodes = args.eval_episodes or (3 if args.quick else 20)
    res: dict[str, Any] = {
        "benchmark": "sb3_cartpole",
        "date": harness.now(),
        "command": " ".join(["python", "-m", "examples.sb3_cartpole", *(argv or sys.argv[1:])]),
        "git": harness.git_state(),
        "machine": f"{os.cpu_count()}-core {platform.machine()} CPU, load {os.getloadavg()[0]:.1f}",
        "versions": harness.versions(["stable-baselines3", "torch", "gymnasium", "jax"]),
    }
    harness.log(f"training SB3 PPO for {steps:,} steps")
    res.update(train(steps, args.seed, episodes))
    harness.finish(res, markdown(res), "sb3_cartpole", harness.results_dir(args.out, args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
