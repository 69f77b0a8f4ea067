"""JaxEnvRunner vs RLlib's SingleAgentEnvRunner: env steps/s, side by side.

Same process, same ``PPOConfig`` (CartPole-v1, RLlib's default PPO module: 256x256 tanh,
separate actor and critic), same seed, for each vector width:

* **sampling**: the runner's ``sample(num_timesteps=num_envs * rollout_fragment_length)``
  alone (module inference, env steps, episodes); the JaxEnvRunner's time is split into
  rollout (device scan + host copy), buffers -> jaxsampler episodes, ``to_rllib`` and
  bookkeeping (counters, metrics);
* **training**: whole ``algo.train()`` iterations (sampling + RLlib's PPO learner + weight
  sync), env steps sampled per second of iteration wall time.

The two runners alternate, repeat after repeat (the machine may be shared: only ratios of
interleaved runs mean something), after warm-up calls (compilation, torch's first
calls) that are not timed. Reported: medians over the repeats, and the ratio of the
medians.

Usage::

    python benchmarks/rllib.py                       # 64 and 1024 envs, writes results
    python benchmarks/rllib.py --envs 64 --repeats 3 --no-write
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
import warnings
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
#: rollout_fragment_length per vector width (env steps per call: num_envs * fragment)
FRAGMENT = {64: 128, 1024: 32}


def _quiet() -> None:
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def make_config(runner: str, num_envs: int, fragment: int, *, train: bool = False) -> Any:
    """The shared PPOConfig; only ``env_runner_cls`` differs between the runners."""
    from ray.rllib.algorithms.ppo import PPOConfig

    from jaxsampler.rllib import JaxEnvRunner

    cfg = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(
            num_env_runners=0,
            num_envs_per_env_runner=num_envs,
            rollout_fragment_length=fragment,
        )
        .debugging(seed=0)
    )
    if runner == "jax":
        cfg = cfg.env_runners(env_runner_cls=JaxEnvRunner)
    if train:
        batch = num_envs * fragment
        cfg = cfg.training(
            train_batch_size_per_learner=batch, minibatch_size=min(batch, 1024), num_epochs=1
        )
    return cfg


def _build_runner(kind: str, num_envs: int, fragment: int) -> Any:
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    from jaxsampler.rllib import JaxEnvRunner

    cfg = make_config(kind, num_envs, fragment)
    cls = JaxEnvRunner if kind == "jax" else SingleAgentEnvRunner
    return cls(config=cfg)


def bench_sampling(num_envs: int, repeats: int, warmup: int) -> dict[str, Any]:
    """Interleaved ``sample()`` calls of both runners; steps/s per call and medians."""
    fragment = FRAGMENT.get(num_envs, 64)
    n = num_envs * fragment
    t0 = time.perf_counter()
    runners = {"jax": _build_runner("jax", num_envs, fragment)}
    build_jax = time.perf_counter() - t0
    runners["rllib"] = _build_runner("rllib", num_envs, fragment)
    t0 = time.perf_counter()
    runners["jax"].sample(num_timesteps=n)
    first_jax = time.perf_counter() - t0  # includes compiling both rollout chunk lengths
    for _ in range(warmup):
        for r in runners.values():
            r.sample(num_timesteps=n)
    rates: dict[str, list[float]] = {"jax": [], "rllib": []}
    split: dict[str, list[float]] = {}
    for rep in range(repeats):
        order = ("jax", "rllib") if rep % 2 == 0 else ("rllib", "jax")
        for kind in order:
            r = runners[kind]
            t = time.perf_counter()
            episodes = r.sample(num_timesteps=n)
            dt = time.perf_counter() - t
            steps = sum(len(e) for e in episodes)
            rates[kind].append(steps / dt)
            if kind == "jax":
                timing = dict(r.last_sample_timing)
                timing["total_s"] = dt
                timing["steps"] = steps
                for k, v in timing.items():
                    split.setdefault(k, []).append(float(v))
            r.get_metrics()  # keep the metrics logger from growing, as the Algorithm does
    for r in runners.values():
        r.stop()
    med = {k: statistics.median(v) for k, v in rates.items()}
    split_med = {k: statistics.median(v) for k, v in split.items()}
    total = split_med["total_s"]
    return {
        "num_envs": num_envs,
        "rollout_fragment_length": fragment,
        "num_timesteps_per_call": n,
        "jax_steps_per_s": rates["jax"],
        "rllib_steps_per_s": rates["rllib"],
        "jax_median": med["jax"],
        "rllib_median": med["rllib"],
        "ratio": med["jax"] / med["rllib"],
        "jax_time_split_s": split_med,
        "jax_time_split_fraction": {
            k: split_med[k] / total
            for k in ("rollout_s", "to_episodes_s", "to_rllib_s", "bookkeeping_s")
        },
        "jax_build_s": build_jax,
        "jax_first_sample_s": first_jax,
    }


def _time_sampling(runner: Any, sink: list[float]) -> None:
    """Wraps ``runner.sample`` to append each call's wall time to ``sink``."""
    inner = runner.sample

    def timed(**kwargs: Any) -> Any:
        t = time.perf_counter()
        out = inner(**kwargs)
        sink.append(time.perf_counter() - t)
        return out

    runner.sample = timed


def bench_training(num_envs: int, repeats: int, warmup: int) -> dict[str, Any]:
    """Interleaved ``algo.train()`` iterations of both configs."""
    fragment = FRAGMENT.get(num_envs, 64)
    algos = {}
    sample_s: dict[str, list[float]] = {"jax": [], "rllib": []}
    for k in ("jax", "rllib"):
        algos[k] = make_config(k, num_envs, fragment, train=True).build_algo()
        _time_sampling(algos[k].env_runner, sample_s[k])
    for _ in range(warmup):
        for a in algos.values():
            a.train()
    rates: dict[str, list[float]] = {"jax": [], "rllib": []}
    learn: dict[str, list[float]] = {"jax": [], "rllib": []}
    sample: dict[str, list[float]] = {"jax": [], "rllib": []}
    iter_s: dict[str, list[float]] = {"jax": [], "rllib": []}
    for rep in range(repeats):
        order = ("jax", "rllib") if rep % 2 == 0 else ("rllib", "jax")
        for kind in order:
            sample_s[kind].clear()
            t = time.perf_counter()
            res = algos[kind].train()
            dt = time.perf_counter() - t
            rates[kind].append(res["env_runners"]["num_env_steps_sampled"] / dt)
            iter_s[kind].append(dt)
            sample[kind].append(sum(sample_s[kind]))
            learn[kind].append(dt - sum(sample_s[kind]))
    for a in algos.values():
        a.stop()
    med = {k: statistics.median(v) for k, v in rates.items()}
    return {
        "num_envs": num_envs,
        "train_batch_size_per_learner": num_envs * fragment,
        "minibatch_size": min(num_envs * fragment, 1024),
        "num_epochs": 1,
        "jax_steps_per_s": rates["jax"],
        "rllib_steps_per_s": rates["rllib"],
        "jax_median": med["jax"],
        "rllib_median": med["rllib"],
        "ratio": med["jax"] / med["rllib"],
        "iteration_s_median": {k: statistics.median(v) for k, v in iter_s.items()},
        "sampling_s_median": {k: statistics.median(v) for k, v in sample.items()},
        "rest_s_median": {k: statistics.median(v) for k, v in learn.items()},
    }


def _markdown(result: dict[str, Any]) -> str:
    lines = [
        "# JaxEnvRunner vs RLlib's SingleAgentEnvRunner",
        "",
        f"CartPole-v1, RLlib's default PPO module (256x256 tanh), one process, "
        f"{result['machine']['cpus']} CPUs; medians of {result['repeats']} interleaved "
        "repeats (the machine was shared: compare the ratios).",
        "",
        "## sample() alone",
        "",
        "| envs | steps/call | JaxEnvRunner steps/s | RLlib runner steps/s | ratio | rollout | "
        "to episodes | to_rllib | bookkeeping |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in result["sampling"]:
        f = s["jax_time_split_fraction"]
        lines.append(
            f"| {s['num_envs']} | {s['num_timesteps_per_call']} | {s['jax_median']:,.0f} | "
            f"{s['rllib_median']:,.0f} | **{s['ratio']:.1f}x** | {f['rollout_s']:.0%} | "
            f"{f['to_episodes_s']:.0%} | {f['to_rllib_s']:.0%} | {f['bookkeeping_s']:.0%} |"
        )
    if result.get("training"):
        lines += [
            "",
            "## whole algo.train() iterations (PPO, 1 epoch, minibatch 1024)",
            "",
            "| envs | train batch | JaxEnvRunner steps/s | RLlib runner steps/s | ratio | "
            "s/iteration (jax / rllib) | of which sampling | of which the rest (learner, sync) |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for t in result["training"]:
            it, ss, rs = t["iteration_s_median"], t["sampling_s_median"], t["rest_s_median"]
            lines.append(
                f"| {t['num_envs']} | {t['train_batch_size_per_learner']} | "
                f"{t['jax_median']:,.0f} | {t['rllib_median']:,.0f} | **{t['ratio']:.1f}x** | "
                f"{it['jax']:.2f} / {it['rllib']:.2f} | {ss['jax']:.2f} / {ss['rllib']:.2f} | "
                f"{rs['jax']:.2f} / {rs['rllib']:.2f} |"
            )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", type=int, nargs="+", default=[64, 1024])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--train-repeats", type=int, default=3)
    parser.add_argument("--no-train", action="store_true", help="sampling only")
    parser.add_argument("--no-write", action="store_true", help="print, do not write results")
    args = parser.parse_args(argv)
    _quiet()
    import jax
    import ray
    import torch

    result: dict[str, Any] = {
        "benchmark": "rllib_env_runner",
        "repeats": args.repeats,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "jax": jax.__version__,
            "jax_backend": jax.default_backend(),
            "ray": ray.__version__,
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
        },
        "sampling": [],
        "training": [],
    }
    for e in args.envs:
        s = bench_sampling(e, args.repeats, args.warmup)
        print(
            f"sample() {e} envs: jax {s['jax_median']:,.0f}/s  rllib {s['rllib_median']:,.0f}/s"
            f"  ratio {s['ratio']:.1f}x  split {s['jax_time_split_fraction']}",
            flush=True,
        )
        result["sampling"].append(s)
    if not args.no_train:
        for e in args.envs:
            t = bench_training(e, args.train_repeats, 1)
            print(
                f"train() {e} envs: jax {t['jax_median']:,.0f}/s  rllib {t['rllib_median']:,.0f}/s"
                f"  ratio {t['ratio']:.1f}x",
                flush=True,
            )
            result["training"].append(t)
    if not args.no_write:
        os.makedirs(RESULTS, exist_ok=True)
        with open(os.path.join(RESULTS, "rllib.json"), "w") as f:
            json.dump(result, f, indent=1)
        with open(os.path.join(RESULTS, "rllib.md"), "w") as f:
            f.write(_markdown(result))
    print(_markdown(result))
    return result


if __name__ == "__main__":
    main()
