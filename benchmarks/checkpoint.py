"""Checkpoint size and save / load time: ``Sampler.save`` / ``load`` and the pure path.

Setups (both with a 64x64 tanh :class:`~jaxsampler.MLPPolicy`, three ``sample()`` calls
first so that episodes are open and the converter carries their chunks):

* ``CartPole-v1``, 4096 envs, ``rollout_length`` 128;
* ``Spread-v0`` with 8 agents (``js.make("Spread-v0", n=8)``), 1024 envs, ``rollout_length``
  32 (multi-agent: the open ``MultiAgentEpisode`` chunks and hanging steps are host state).

For each, ``sampler`` rows time ``sampler.save(path, params=params)`` (a new directory each
time) and ``sampler.load(path, params=params)``; ``pure`` rows time
``js.rollout.checkpoint.save(path, {"rollout": state, "params": params})`` and
``js.rollout.checkpoint.restore(path, like=...)`` of the same sampler's ``RolloutState``. Each time
is the median of 5 repeats after one warm-up; loads are blocked on until every array is
ready. Sizes: bytes on disk (the whole checkpoint directory), the host blob (pickled open
episode chunks, carried columns, ids, metrics: raw bytes before orbax compresses them) and
the arrays' raw bytes (``nbytes`` of every leaf). ``sample s`` is one ``sample()`` call of
the same sampler, for scale.

Usage::

    python -m benchmarks.checkpoint           # full run, writes benchmarks/results/checkpoint.*
    python -m benchmarks.checkpoint --quick   # smoke test (tiny sizes), prints the table only
    python -m benchmarks.checkpoint --quick --out DIR   # ... and writes DIR/checkpoint.*
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import jax
import numpy as np

import jaxsampler as js
from benchmarks import harness
from benchmarks.harness import log, median_time
from jaxsampler.cli.bench import environment_info

#: name -> (env id, env kwargs, num_envs, rollout_length); quick sizes in QUICK
FULL: dict[str, tuple[str, dict[str, Any], int, int]] = {
    "CartPole-v1 4096 envs": ("CartPole-v1", {}, 4096, 128),
    "Spread-v0 1024 envs x 8 agents": ("Spread-v0", {"n": 8}, 1024, 32),
}
QUICK: dict[str, tuple[str, dict[str, Any], int, int]] = {
    "CartPole-v1 16 envs": ("CartPole-v1", {}, 16, 8),
    "Spread-v0 8 envs x 2 agents": ("Spread-v0", {"n": 2}, 8, 8),
}


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def array_bytes(tree: Any) -> int:
    return int(sum(np.asarray(x).nbytes for x in jax.tree.leaves(tree)))


def measure(name: str, spec: tuple[str, dict[str, Any], int, int], repeats: int) -> list[dict]:
    env_id, env_kw, num_envs, T = spec
    env = js.make(env_id, **env_kw)
    policy = js.MLPPolicy(env.observation_space, env.action_space)
    params = policy.init(jax.random.PRNGKey(0))
    sampler = js.Sampler(env, policy, num_envs=num_envs, rollout_length=T, seed=0)
    log(f"{name}: compiling and sampling")
    sampler.sample(params)
    sample_s = median_time(lambda: sampler.sample(params), 2)
    open_chunks = sampler.metrics.num_episodes_ongoing
    rows = []
    root = Path(tempfile.mkdtemp(prefix="jaxsampler_ckpt_bench_"))
    try:
        counter = iter(range(10**6))

        def new_path() -> Path:
            return root / f"c{next(counter)}"

        # sampler.save / load
        last: list[Path] = []

        def save() -> None:
            last.append(sampler.save(new_path(), params=params))

        save_s = median_time(save, repeats)
        path = last[-1]
        meta = js.rollout.checkpoint.read_meta(path)
        load_s = median_time(lambda: jax.tree.leaves(sampler.load(path, params=params)), repeats)
        arrays, _, _ = sampler._checkpoint_parts()
        rows.append(
            {
                "setup": name,
                "what": "sampler",
                "disk_bytes": disk_bytes(path),
                "host_blob_bytes": int(meta["host_bytes"]),
                "array_bytes": array_bytes(arrays) + array_bytes(params),
                "save_s": save_s,
                "load_s": load_s,
                "dump_host_s": float(meta["dump_host_s"]),
                "sample_s": sample_s,
                "open_chunks": open_chunks,
            }
        )
        log(f"{name}: sampler save {save_s:.3f} s, load {load_s:.3f} s")
        # pure path: the same RolloutState and params
        tree = {"rollout": sampler._state, "params": params}
        last.clear()

        def pure_save() -> None:
            last.append(js.rollout.checkpoint.save(new_path(), tree))

        pure_save_s = median_time(pure_save, repeats)
        path = last[-1]
        pure_load_s = median_time(lambda: js.rollout.checkpoint.restore(path, like=tree), repeats)
        rows.append(
            {
                "setup": name,
                "what": "pure",
                "disk_bytes": disk_bytes(path),
                "host_blob_bytes": 0,
                "array_bytes": array_bytes(tree),
                "save_s": pure_save_s,
                "load_s": pure_load_s,
                "dump_host_s": 0.0,
                "sample_s": sample_s,
                "open_chunks": open_chunks,
            }
        )
        log(f"{name}: pure save {pure_save_s:.3f} s, load {pure_load_s:.3f} s")
    finally:
        sampler.close()
        shutil.rmtree(root, ignore_errors=True)
    return rows


def markdown(rows: list[dict], info: dict[str, Any], repeats: int) -> str:
    mb = 1 / 1e6
    lines = [
        "# Checkpoint size and save / load time",
        "",
        f"Median of {repeats} repeats after a warm-up (`python -m benchmarks.checkpoint`); "
        "`sampler`: `Sampler.save(path, params=params)` / `Sampler.load(path, params=params)`, "
        "`pure`: `js.rollout.checkpoint.save` / `restore(like=)` of the same `RolloutState` "
        "+ params. "
        "Host blob: pickled open episode chunks and carried columns (raw, before "
        "compression); arrays: raw bytes of every saved array; on disk: the whole directory.",
        "",
        "| setup | what | on disk MB | host blob MB | arrays MB | save s | load s | sample() s |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['setup']} | {r['what']} | {r['disk_bytes'] * mb:.2f} "
            f"| {r['host_blob_bytes'] * mb:.2f} | {r['array_bytes'] * mb:.2f} "
            f"| {r['save_s']:.3f} | {r['load_s']:.3f} | {r['sample_s']:.3f} |"
        )
    lines += [
        "",
        f"Machine: {info['backend']} backend, {info['device_count']} device(s), "
        f"{info['cpu_count']} CPUs, jax {info['jax']}, load average {info['loadavg']:.1f} at "
        "the start (other jobs shared the machine when it is above the CPU count). The "
        "sampler rows' save time includes pickling the host state (`dump_host_s` in the "
        "JSON): for Spread that is most of it (1024 open `MultiAgentEpisode` chunks of 8 "
        "agents each), and unpickling them most of the load.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=None)
    harness.add_quick_out(parser, "checkpoint", quick="tiny sizes, 1 repeat; prints")
    args = parser.parse_args()
    setups = QUICK if args.quick else FULL
    repeats = args.repeats or (1 if args.quick else 5)
    info = environment_info()
    info["loadavg"] = os.getloadavg()[0]
    rows = [r for name, spec in setups.items() for r in measure(name, spec, repeats)]
    results = {
        "benchmark": "checkpoint",
        "config": {"quick": args.quick, "repeats": repeats, "setups": list(setups)},
        "rows": rows,
        "environment": info,
        "git": harness.git_state(),
    }
    out = harness.results_dir(args.out, args.quick)
    harness.finish(results, markdown(rows, info, repeats), "checkpoint", out)


if __name__ == "__main__":
    main()
