"""How long :func:`jaxsampler.offline.recover` takes, against the size of the journal.

A journal is written by driving an in-process
:class:`~jaxsampler.host_envs.external.ExternalEnv` with ``journal=StepJournal(path)``
from one thread: 64 episodes at a time, 100 steps each, every step a ``log_action`` with
a 4-float observation and a ``log_returns``, a ``poll`` after each sweep over the open
episodes (so the journal holds starts, observations, rewards, ends and polls, as a served
env's does; no sampler runs, so nothing is written to a log). Then, per size:

* ``recover`` into an empty log: every step is replayed and appended (a crash before the
  sampler wrote anything: the worst case);
* ``recover`` again: every step is in the log already, nothing is appended (the time to
  learn that);
* ``read``: decoding the journal's entries alone (``jaxsampler.offline.frames.read_entries``),
  the part of recovery no replay can skip: the floor of a recovery that reads the whole
  journal;
* ``compact``: the default recovery, which then replaces the journal by its episode ids,
  once, and the next recovery of that compacted journal (what a restart after a restart
  pays).

The timed recoveries above pass ``compact=False``.

Medians over ``--repeats`` (3). Issue 32's target is recovery within compile time + 2 s
of a restart.

    python -m benchmarks.journal_recovery           # writes results/journal_recovery.*
    python -m benchmarks.journal_recovery --quick   # smoke test, prints only
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

import numpy as np

from benchmarks import harness
from jaxsampler.host_envs.external import ExternalEnv
from jaxsampler.offline import StepJournal, recover
from jaxsampler.offline.frames import read_entries
from jaxsampler.spaces import Box, Discrete

OBS, ACT = Box(-1e6, 1e6, (4,), np.float32), Discrete(2)
EPISODES, LENGTH = 64, 100
KEEP = {"compact": False}  # the timed recoveries leave the journal as it is


def write_journal(path: str, steps: int) -> float:
    """Journals about ``steps`` logged steps; returns the seconds it took."""
    t0 = time.perf_counter()
    env = ExternalEnv(OBS, ACT, journal=StepJournal(path))
    obs = np.zeros(4, np.float32)
    done, started, open_ = 0, 0, {}
    while done < steps:
        while len(open_) < EPISODES:
            open_[env.start_episode(f"e{started}")] = 0
            started += 1
        for eid in list(open_):
            env.log_action(eid, obs, 1)
            env.log_returns(eid, 1.0)
            open_[eid] += 1
            done += 1
            if open_[eid] == LENGTH:
                env.end_episode(eid, obs)
                del open_[eid]
        env.poll(timeout=0)
    env.close()
    return time.perf_counter() - t0


def timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def measure(steps: int, repeats: int, tmp: str) -> dict[str, Any]:
    journal = os.path.join(tmp, f"{steps}.journal")
    write_s = write_journal(journal, steps)
    first, again, read = [], [], []
    for r in range(repeats):
        log = os.path.join(tmp, f"{steps}-{r}.log")
        t, report = timed(lambda log=log: recover(journal, log, ExternalEnv(OBS, ACT), **KEEP))
        first.append(t)
        t, report2 = timed(lambda log=log: recover(journal, log, ExternalEnv(OBS, ACT), **KEEP))
        again.append(t)
        assert report2.recovered_steps == 0
        read.append(timed(lambda: sum(1 for _ in read_entries(journal)))[0])
    size = os.path.getsize(journal)
    compact_s = timed(lambda: recover(journal, log, ExternalEnv(OBS, ACT)))[0]
    after_s = timed(lambda: recover(journal, log, ExternalEnv(OBS, ACT)))[0]
    med = statistics.median
    row = {
        "steps": report.recovered_steps,
        "journal_bytes": size,
        "compact_s": compact_s,
        "compacted_bytes": os.path.getsize(journal),
        "after_compaction_s": after_s,
        "write_s": write_s,
        "recover_s": med(first),
        "recover_again_s": med(again),
        "read_s": med(read),
    }
    row["us_per_step"] = 1e6 * row["recover_s"] / row["steps"]
    harness.log(
        f"{row['steps']:>8} steps: recover {row['recover_s']:.2f} s, again "
        f"{row['recover_again_s']:.2f} s, read {row['read_s']:.2f} s"
    )
    return row


def markdown(res: dict[str, Any]) -> str:
    md = (
        f"# {res['benchmark']}\n\n{res['date']} · `{res['command']}` · {os.cpu_count()} CPUs · "
        f"median of {res['repeats']} · wall {res['wall_s']:.0f} s\n\n"
        "A single-agent journal of logged steps (4-float observations, 64 episodes at a time,"
        " 100 steps each) recovered into an empty log (every step replayed and appended) and"
        " again (nothing left to append); `read`: decoding the journal's entries alone, the"
        " floor of a recovery that reads the whole journal. Compacting: the default"
        " recovery, which then replaces the journal by its episode ids; next: recovering"
        " the compacted journal.\n\n"
        "| steps | journal MiB | bytes/step | recover s | µs/step | again s | read s "
        "| recover / read | compacting recover s | compacted KiB | next recover s |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    for r in res["rows"]:
        md += (
            f"| {harness.thousands(r['steps'])} | {r['journal_bytes'] / 2**20:.1f} | "
            f"{r['journal_bytes'] / r['steps']:.0f} | {r['recover_s']:.2f} | "
            f"{r['us_per_step']:.0f} | {r['recover_again_s']:.2f} | {r['read_s']:.2f} | "
            f"{r['recover_s'] / r['read_s']:.1f}x | {r['compact_s']:.2f} | "
            f"{r['compacted_bytes'] / 1024:.1f} | {r['after_compaction_s']:.3f} |\n"
        )
    return md


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, print only")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.repeats = [1_000], 1
    t0 = time.perf_counter()
    res: dict[str, Any] = harness.stamp("Recovering a write-ahead journal", "journal_recovery")
    with tempfile.TemporaryDirectory(prefix="journal-recovery-") as tmp:
        res["rows"] = [measure(n, args.repeats, tmp) for n in args.steps]
    res["repeats"], res["wall_s"] = args.repeats, time.perf_counter() - t0
    out = None if args.quick else harness.RESULTS_DIR
    harness.finish(res, markdown(res), "journal_recovery", out)


if __name__ == "__main__":
    main()
