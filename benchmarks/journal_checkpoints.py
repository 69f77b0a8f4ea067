"""Recovery after a crash, against how long the server ran, with and without in-run
journal checkpoints (``env.checkpoint_journal(writer)``).

A served run is played in one thread against an in-process
:class:`~jaxsampler.host_envs.external.ExternalEnv` with ``journal=StepJournal(path)``:
64 episodes at a time, 100 steps each, every step a ``log_action`` with a 4-float
observation and a ``log_returns``; after each sweep over the open episodes a
:class:`~jaxsampler.sampling.HostSampler` (a small MLP) samples 64 steps and its episodes
are appended to an offline log. With checkpoints, ``checkpoint_journal(writer)`` runs once
``--every`` steps were sampled since the last one. The run then "crashes": its last
sample call's output is never written. Per run length and mode:

* ``recover`` on a copy of the files: replaying the journal and reading the log, the time
  a restart waits before it serves (median of ``--repeats``);
* the journal's size at the crash;
* ``run steps/s``: the played run's steps per second (driver, journal, sampler and log
  together), so the cost of checkpointing shows as a ratio to the run without;
* ``checkpoint ms``: how long each ``checkpoint_journal`` call held the env (clients wait
  that long), median and maximum.

Issue 32's target is recovery within compile time + 2 s of a restart, whatever the run's
length.

    python -m benchmarks.journal_checkpoints           # writes results/journal_checkpoints.*
    python -m benchmarks.journal_checkpoints --quick   # smoke test, prints only
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import warnings
from typing import Any

import jax
import numpy as np

import jaxsampler as js
from benchmarks import harness
from jaxsampler.host_envs.external import ExternalEnv
from jaxsampler.offline import OfflineWriter, StepJournal, TruncatedLogWarning, recover
from jaxsampler.spaces import Box, Discrete

OBS, ACT = Box(-1e6, 1e6, (4,), np.float32), Discrete(2)
EPISODES, LENGTH = 64, 100


def play(tmp: str, steps: int, every: int | None) -> dict[str, Any]:
    """Plays a run of ``steps`` steps into ``tmp``/journal and ``tmp``/log, checkpointing
    every ``every`` sampled steps (``None``: never); leaves them as a crash would."""
    journal, log = os.path.join(tmp, "journal"), os.path.join(tmp, "log")
    env = ExternalEnv(OBS, ACT, max_wait_s=0.0, journal=StepJournal(journal))
    policy = js.MLPPolicy(OBS, ACT, hidden_sizes=(16,))
    params = policy.init(jax.random.PRNGKey(0))
    sampler = js.sampling.HostSampler(env, policy, seed=0, timeout_s=0.05)
    writer = OfflineWriter(log)
    obs = np.zeros(4, np.float32)
    pauses: list[float] = []
    done = started = since = 0
    open_: dict[str, int] = {}
    t0 = time.perf_counter()
    while done < steps:
        while len(open_) < EPISODES:
            open_[env.start_episode(f"e{started}")] = 0
            started += 1
        for eid in list(open_):
            env.log_action(eid, obs, 1)
            env.log_returns(eid, 1.0)
            open_[eid] += 1
            if open_[eid] == LENGTH:
                env.end_episode(eid, obs)
                del open_[eid]
        episodes = sampler.sample(params, num_timesteps=EPISODES)
        done += EPISODES
        if done >= steps:
            break  # the crash: this call's output dies with the process
        for episode in episodes:
            writer.write(episode)
        since += EPISODES
        if every is not None and since >= every:
            t = time.perf_counter()
            env.checkpoint_journal(writer)
            pauses.append(time.perf_counter() - t)
            since = 0
    run_s = time.perf_counter() - t0
    writer._close_fd()
    return {
        "run_steps_per_s": done / run_s,
        "journal_bytes": os.path.getsize(journal),
        "log_bytes": os.path.getsize(log),
        "checkpoints": len(pauses),
        "checkpoint_ms_median": 1e3 * statistics.median(pauses) if pauses else None,
        "checkpoint_ms_max": 1e3 * max(pauses) if pauses else None,
    }


def recovery_s(tmp: str, repeats: int) -> tuple[float, Any]:
    times, report = [], None
    for r in range(repeats):
        work = os.path.join(tmp, f"r{r}")
        os.makedirs(work)
        for name in ("journal", "log"):
            shutil.copy(os.path.join(tmp, name), os.path.join(work, name))
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TruncatedLogWarning)
            report = recover(
                os.path.join(work, "journal"), os.path.join(work, "log"), ExternalEnv(OBS, ACT)
            )
        times.append(time.perf_counter() - t0)
        shutil.rmtree(work)
    return statistics.median(times), report


def measure(steps: int, every: int | None, repeats: int, root: str) -> dict[str, Any]:
    tmp = tempfile.mkdtemp(dir=root)
    row: dict[str, Any] = {"steps": steps, "every": every, **play(tmp, steps, every)}
    row["recover_s"], report = recovery_s(tmp, repeats)
    row["replayed_steps"] = report.acknowledged_steps
    row["recovered_steps"] = report.recovered_steps
    row["log_read_from"] = report.log_read_from
    shutil.rmtree(tmp)
    mode = "none" if every is None else f"every {every}"
    harness.log(
        f"{steps:>8} steps, checkpoints {mode:>11}: recover {row['recover_s']:.2f} s "
        f"(replayed {row['replayed_steps']}), run {row['run_steps_per_s']:.0f} steps/s"
    )
    return row


def markdown(res: dict[str, Any]) -> str:
    md = (
        f"# {res['benchmark']}\n\n{res['date']} · `{res['command']}` · {os.cpu_count()} CPUs · "
        f"recovery: median of {res['repeats']} · wall {res['wall_s']:.0f} s\n\n"
        "A served run played in one thread (64 episodes at a time, 100 logged steps each, a"
        " host sampler writing each call's episodes to an offline log), then a crash that"
        " loses the last call's output; recovery runs on a copy of the journal and log."
        " *Checkpoints*: `env.checkpoint_journal(writer)` once that many steps were sampled"
        " since the last. *Replayed*: acknowledged steps recovery replayed from the journal;"
        " *run steps/s*: the whole played run's rate; *checkpoint ms*: how long a checkpoint"
        " held the env (clients wait that long).\n\n"
        "| run steps | checkpoints | journal KiB | replayed | recover s | log read from byte "
        "| run steps/s | vs none | checkpoint ms median / max |\n"
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    base = {r["steps"]: r["run_steps_per_s"] for r in res["rows"] if r["every"] is None}
    for r in res["rows"]:
        mode = "none" if r["every"] is None else f"every {harness.thousands(r['every'])} steps"
        pause = (
            "—"
            if r["checkpoint_ms_median"] is None
            else f"{r['checkpoint_ms_median']:.1f} / {r['checkpoint_ms_max']:.1f}"
        )
        ratio = r["run_steps_per_s"] / base[r["steps"]] if r["steps"] in base else None
        md += (
            f"| {harness.thousands(r['steps'])} | {mode} | {r['journal_bytes'] / 1024:.0f} | "
            f"{harness.thousands(r['replayed_steps'])} | {r['recover_s']:.2f} | "
            f"{harness.thousands(r['log_read_from'])} | {r['run_steps_per_s']:.0f} | "
            f"{harness.fmt(ratio, '.2f')} | {pause} |\n"
        )
    return md


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[20_000, 100_000, 300_000])
    ap.add_argument("--every", type=int, default=10_000, help="steps between checkpoints")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, print only")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.every, args.repeats = [2_000], 640, 1
    t0 = time.perf_counter()
    res: dict[str, Any] = harness.stamp(
        "Recovery time with in-run checkpoints", "journal_checkpoints"
    )
    with tempfile.TemporaryDirectory(prefix="journal-checkpoints-") as root:
        res["rows"] = [
            measure(n, every, args.repeats, root)
            for n in args.steps
            for every in (None, args.every)
        ]
    res["repeats"], res["wall_s"] = args.repeats, time.perf_counter() - t0
    out = None if args.quick else harness.RESULTS_DIR
    harness.finish(res, markdown(res), "journal_checkpoints", out)


if __name__ == "__main__":
    main()
