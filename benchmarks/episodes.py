"""Buffer -> episode (and -> SampleBatch) conversion cost vs the rollout that produced the data.

CartPole-v1, 1024 envs x 128 steps, with (a) a random policy (many short episodes, the
worst case for per-episode work) and (b) a 64x64 tanh MLP policy. For each, per
``Sampler.sample()`` call: the device rollout (including the one device-to-host copy)
and the conversion into numpy'ized ``SingleAgentEpisode``s are timed separately,
interleaved, as medians over repeats. Reported: timesteps/s of the conversion and the
ratio conversion time / rollout time (goal: < 1).

    python benchmarks/episodes.py [--num-envs 1024] [--rollout-length 128] [--repeats 9]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import jax

import jaxsampler as js
from jaxsampler.bench import environment_info

RESULTS = Path(__file__).parent / "results"


def measure(policy_name: str, num_envs: int, rollout_length: int, repeats: int) -> dict:
    env = js.make("CartPole-v1")
    if policy_name == "random":
        pol = js.RandomPolicy(env.observation_space, env.action_space)
    else:
        pol = js.MLPPolicy(env.observation_space, env.action_space, (64, 64))
    params = pol.init(jax.random.PRNGKey(0))
    sampler = js.Sampler(env, pol, num_envs=num_envs, rollout_length=rollout_length, seed=0)
    for _ in range(2):  # compile, warm up
        sampler.sample(params)
    rollout_s, convert_s, batch_s, episodes, steps = [], [], [], [], []
    for _ in range(repeats):
        for build in ("episodes", "batch"):
            t0 = time.perf_counter()
            traj = sampler._call(params)  # rollout + one device-to-host transfer
            t1 = time.perf_counter()
            if build == "episodes":
                eps, metrics = sampler._to_episodes([traj], None)
            else:
                sampler._to_batch([traj], None)
            t2 = time.perf_counter()
            rollout_s.append(t1 - t0)
            (convert_s if build == "episodes" else batch_s).append(t2 - t1)
        episodes.append(len(eps))
        steps.append(metrics.num_env_steps_sampled)
    r, c, bt = (
        statistics.median(rollout_s),
        statistics.median(convert_s),
        statistics.median(batch_s),
    )
    return {
        "policy": policy_name,
        "num_envs": num_envs,
        "rollout_length": rollout_length,
        "rollout_s_median": r,
        "convert_s_median": c,
        "rollout_s": rollout_s,
        "convert_s": convert_s,
        "episodes_per_call": statistics.median(episodes),
        "env_steps_per_call": statistics.median(steps),
        "convert_timesteps_per_s": statistics.median(steps) / c,
        "convert_us_per_episode": c / statistics.median(episodes) * 1e6,
        "ratio_convert_over_rollout": c / r,
        "batch_s_median": bt,
        "batch_s": batch_s,
        "batch_timesteps_per_s": statistics.median(steps) / bt,
        "ratio_batch_over_rollout": bt / r,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-envs", type=int, default=1024)
    p.add_argument("--rollout-length", type=int, default=128)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    rows = [
        measure(name, args.num_envs, args.rollout_length, args.repeats)
        for name in ("random", "mlp")
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    payload = {
        "date": stamp,
        "argv": sys.argv[1:],
        "environment": environment_info(),
        "results": rows,
    }
    (args.out / "episodes.json").write_text(json.dumps(payload, indent=2) + "\n")
    lines = [
        "# Buffer -> episode conversion vs rollout (CartPole-v1)",
        "",
        f"{stamp} · `python benchmarks/episodes.py` · {args.num_envs} envs x {args.rollout_length} steps · "
        f"median of {args.repeats} · jax {jax.__version__}, {jax.device_count()} device(s)",
        "",
        "`sample()` builds episodes; `sample_batch()` builds one SampleBatch straight from the buffers.",
        "",
        "| policy | episodes / call | rollout ms | episodes ms | episodes timesteps/s | µs / episode | episodes / rollout | batch ms | batch / rollout |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['policy']} | {r['episodes_per_call']:.0f} | {r['rollout_s_median'] * 1e3:.1f} | "
            f"{r['convert_s_median'] * 1e3:.1f} | {r['convert_timesteps_per_s'] / 1e6:.2f}M | "
            f"{r['convert_us_per_episode']:.1f} | {r['ratio_convert_over_rollout']:.2f} | "
            f"{r['batch_s_median'] * 1e3:.1f} | {r['ratio_batch_over_rollout']:.2f} |"
        )
    (args.out / "episodes.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
