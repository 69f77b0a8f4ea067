"""JaxEnvRunner vs RLlib's SingleAgentEnvRunner: env steps/s, side by side.

Same process, same ``PPOConfig`` (CartPole-v1, RLlib's default PPO module: 256x256 tanh,
separate actor and critic), same seed, for each vector width:

* **sampling**: the runner's ``sample(num_timesteps=num_envs * rollout_fragment_length)``
  alone (module inference, env steps, episodes); the JaxEnvRunner's time is split into
  rollout (device scan + host copy), buffers -> RLlib episodes (built straight from the
  call's columns; ``to_rllib`` of jaxsampler episodes only for host envs, 0 here),
  bookkeeping (counters, metrics) and the rest of ``sample()`` (RLlib's metrics timers);
* **training**: whole ``algo.train()`` iterations (sampling + RLlib's PPO learner + weight
  sync), env steps sampled per second of iteration wall time.

Each runner (or Algorithm) lives in its own process, so RLlib's runner runs in a process
without JAX, as it would in practice (JAX's CPU thread pool in the same process slows
torch's small per-step ops several-fold). The two are called alternately, one call at a
time, repeat after repeat (the machine may be shared: only ratios of interleaved runs
mean something), after warm-up calls (compilation, torch's first calls) that are not
timed. Reported: medians over the repeats, and the ratio of the medians.

torch runs with one intra-op thread in both processes (``--torch-threads``): with torch's
default two on this 2-core machine shared with other jobs, RLlib's runner fell to ~1.1k
steps/s at 64 envs (OpenMP barriers under oversubscription); with one it ran at ~10k.

Usage::

    python -m benchmarks.rllib                       # 64 and 1024 envs, writes results
    python -m benchmarks.rllib --envs 64 --repeats 3 --no-write
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import platform
import statistics
import time
import warnings
from typing import Any

from benchmarks import harness

RESULTS = str(harness.RESULTS_DIR)
#: rollout_fragment_length per vector width (env steps per call: num_envs * fragment)
FRAGMENT = {64: 128, 1024: 32}


def _quiet() -> None:
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def make_config(runner: str, num_envs: int, fragment: int, *, train: bool = False) -> Any:
    """The shared PPOConfig; only ``env_runner_cls`` differs between the runners."""
    from ray.rllib.algorithms.ppo import PPOConfig

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
    if runner == "jax":  # imported only here: RLlib's process never loads JAX
        from jaxsampler.integrations.rllib import JaxEnvRunner

        cfg = cfg.env_runners(env_runner_cls=JaxEnvRunner)
    if train:
        batch = num_envs * fragment
        cfg = cfg.training(
            train_batch_size_per_learner=batch, minibatch_size=min(batch, 1024), num_epochs=1
        )
    return cfg


def _worker(
    kind: str, what: str, num_envs: int, fragment: int, torch_threads: int, conn: Any
) -> None:
    """One runner (``what="sample"``) or one Algorithm (``"train"``) in its own process;
    each ``"run"`` message is one timed call, answered with its numbers."""
    _quiet()
    import torch

    torch.set_num_threads(torch_threads)
    n = num_envs * fragment
    t0 = time.perf_counter()
    if what == "sample":
        if kind == "jax":
            from jaxsampler.integrations.rllib import JaxEnvRunner as cls
        else:
            from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner as cls
        runner = cls(config=make_config(kind, num_envs, fragment))
    else:
        algo = make_config(kind, num_envs, fragment, train=True).build_algo()
        runner = algo.env_runner
        inner, sampled = runner.sample, [0.0]

        def timed(**kwargs: Any) -> Any:
            t = time.perf_counter()
            out = inner(**kwargs)
            sampled[0] += time.perf_counter() - t
            return out

        runner.sample = timed
    conn.send({"build_s": time.perf_counter() - t0})
    while conn.recv() == "run":
        if what == "sample":
            t = time.perf_counter()
            episodes = runner.sample(num_timesteps=n)
            dt = time.perf_counter() - t
            out = {"steps": sum(len(e) for e in episodes), "s": dt}
            out.update(getattr(runner, "last_sample_timing", {}))
            runner.get_metrics()  # as the Algorithm does each iteration
        else:
            sampled[0] = 0.0
            t = time.perf_counter()
            res = algo.train()
            dt = time.perf_counter() - t
            out = {
                "steps": int(res["env_runners"]["num_env_steps_sampled"]),
                "s": dt,
                "sampling_s": sampled[0],
            }
        conn.send(out)
    (runner.stop() if what == "sample" else algo.stop())


def _interleaved(
    what: str, num_envs: int, repeats: int, warmup: int, torch_threads: int
) -> dict[str, Any]:
    """Both runners in their own processes, called alternately (only one works at a time)."""
    ctx = mp.get_context("spawn")
    fragment = FRAGMENT.get(num_envs, 64)
    procs, conns, calls = {}, {}, {"jax": [], "rllib": []}
    build = {}
    for kind in ("jax", "rllib"):  # built one after the other, not side by side
        parent, child = ctx.Pipe()
        procs[kind] = ctx.Process(
            target=_worker, args=(kind, what, num_envs, fragment, torch_threads, child)
        )
        procs[kind].start()
        conns[kind] = parent
        build[kind] = parent.recv()["build_s"]
    try:
        first = {}
        for i in range(warmup):
            for kind in ("jax", "rllib"):
                conns[kind].send("run")
                out = conns[kind].recv()
                if i == 0:
                    first[kind] = out["s"]
        for rep in range(repeats):
            for kind in ("jax", "rllib") if rep % 2 == 0 else ("rllib", "jax"):
                conns[kind].send("run")
                calls[kind].append(conns[kind].recv())
    finally:
        for kind in procs:
            conns[kind].send("stop")
            procs[kind].join(timeout=60)
    rates = {k: [c["steps"] / c["s"] for c in v] for k, v in calls.items()}
    med = {k: statistics.median(v) for k, v in rates.items()}
    return {
        "num_envs": num_envs,
        "rollout_fragment_length": fragment,
        "jax_steps_per_s": rates["jax"],
        "rllib_steps_per_s": rates["rllib"],
        "jax_median": med["jax"],
        "rllib_median": med["rllib"],
        "ratio": med["jax"] / med["rllib"],
        "build_s": build,
        "first_call_s": first,
        "calls": calls,
    }


def bench_sampling(num_envs: int, repeats: int, warmup: int, threads: int) -> dict[str, Any]:
    """``sample(num_timesteps=num_envs * fragment)`` of each runner; the JaxEnvRunner's
    time split (median seconds and fractions)."""
    r = _interleaved("sample", num_envs, repeats, warmup, threads)
    jax_calls = r["calls"]["jax"]
    keys = ("rollout_s", "to_episodes_s", "to_rllib_s", "bookkeeping_s")
    split = {k: statistics.median(c[k] for c in jax_calls) for k in keys + ("s",)}
    r["num_timesteps_per_call"] = num_envs * r["rollout_fragment_length"]
    r["jax_time_split_s"] = split
    r["jax_time_split_fraction"] = {k: split[k] / split["s"] for k in keys}
    return r


def bench_training(num_envs: int, repeats: int, warmup: int, threads: int) -> dict[str, Any]:
    """Whole ``algo.train()`` iterations of each config."""
    r = _interleaved("train", num_envs, repeats, warmup, threads)
    batch = num_envs * r["rollout_fragment_length"]
    r.update(
        train_batch_size_per_learner=batch,
        minibatch_size=min(batch, 1024),
        num_epochs=1,
        iteration_s_median={k: statistics.median(c["s"] for c in v) for k, v in r["calls"].items()},
        sampling_s_median={
            k: statistics.median(c["sampling_s"] for c in v) for k, v in r["calls"].items()
        },
        rest_s_median={
            k: statistics.median(c["s"] - c["sampling_s"] for c in v) for k, v in r["calls"].items()
        },
    )
    return r


def _markdown(result: dict[str, Any]) -> str:
    lines = [
        "# JaxEnvRunner vs RLlib's SingleAgentEnvRunner",
        "",
        "CartPole-v1, RLlib's default PPO module (256x256 tanh), each runner in its own "
        f"process (torch threads: {result['machine']['torch_threads']}), "
        f"{result['machine']['cpus']} CPUs; medians of {result['repeats']} interleaved "
        "repeats (the machine was shared: compare the ratios). Load average (1 min) "
        f"{result['load_average_before'][0]:.1f} before, "
        f"{result['load_average_after'][0]:.1f} after the run.",
        "",
        "## sample() alone",
        "",
        "| envs | steps/call | JaxEnvRunner steps/s | RLlib runner steps/s | ratio | rollout | "
        "buffers -> RLlib episodes | bookkeeping | rest |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in result["sampling"]:
        f = s["jax_time_split_fraction"]
        lines.append(
            f"| {s['num_envs']} | {s['num_timesteps_per_call']} | {s['jax_median']:,.0f} | "
            f"{s['rllib_median']:,.0f} | **{s['ratio']:.1f}x** | {f['rollout_s']:.0%} | "
            f"{f['to_episodes_s'] + f['to_rllib_s']:.0%} | {f['bookkeeping_s']:.0%} | "
            f"{1 - sum(f.values()):.0%} |"
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
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads in both processes (default 1: see the module docstring)",
    )
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
            "torch_threads": args.torch_threads,
        },
        "sampling": [],
        "training": [],
        "load_average_before": list(os.getloadavg()),
    }
    for e in args.envs:
        s = bench_sampling(e, args.repeats, args.warmup, args.torch_threads)
        print(
            f"sample() {e} envs: jax {s['jax_median']:,.0f}/s  rllib {s['rllib_median']:,.0f}/s"
            f"  ratio {s['ratio']:.1f}x  split {s['jax_time_split_fraction']}",
            flush=True,
        )
        result["sampling"].append(s)
    if not args.no_train:
        for e in args.envs:
            t = bench_training(e, args.train_repeats, 1, args.torch_threads)
            print(
                f"train() {e} envs: jax {t['jax_median']:,.0f}/s  rllib {t['rllib_median']:,.0f}/s"
                f"  ratio {t['ratio']:.1f}x",
                flush=True,
            )
            result["training"].append(t)
    result["load_average_after"] = list(os.getloadavg())
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
