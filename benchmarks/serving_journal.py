"""Policy serving with and without the write-ahead journal (issue 32): actions/s and
``get_action`` latency, side by side.

Runs :mod:`benchmarks.serving`'s modes ``inprocess`` / ``inprocess-journal`` /
``inprocess-journal-strict`` and ``http`` / ``http-journal`` (an
:class:`~jaxsampler.host_envs.external.ExternalEnv` with ``journal=StepJournal(path,
fsync=GroupCommit(...))`` on a temporary file: each start, observation, reward, end, poll
and batch of answers is written to the OS before it is acknowledged, and fsynced once 20 ms
or 1,000 entries are unsynced; in-process with ``defer_returns=True``, so that a
``log_returns`` goes out with the next commit, and ``-strict`` without it, a write per
``log_returns``) with the same clients, phases and policy, and reports journal / no-journal
per client count: the ratio of the median actions/s over rounds and both p50 / p99
latencies. The modes are set up together and run their rounds in turn, so that a slow spell
of a shared machine hits all of them alike. Target (issue 32): >= 0.7x at 64 clients.

``--restart`` measures the other target instead: recovery after a restart within compile
time + 2 s. It runs ``examples/durable_server.py`` (journal, offline log, in-run
checkpoints every ``--checkpoint-s``) under ``--clients`` HTTP client threads for each of
``--load-s`` seconds, SIGKILLs it, starts it again on the same files and reads its ready
line: the wall time from the kill to serving again, the first sample call's compile time,
and the recovery's own seconds and steps (with and without checkpoints).

Usage::

    python -m benchmarks.serving_journal           # writes results/serving_journal.{json,md}
    python -m benchmarks.serving_journal --quick   # smoke test, prints only
    python -m benchmarks.serving_journal --restart # writes results/serving_restart.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import harness, serving, serving_client
from benchmarks.harness import fmt, thousands

PAIRS = (
    ("inprocess", "inprocess-journal"),
    ("inprocess", "inprocess-journal-strict"),
    ("http", "http-journal"),
)
SIZES = serving_client.sizes(
    full={"rounds": 3, "duration": 1.5, "clients": [1, 16, 64]},
    quick={"duration": 0.3, "clients": [1, 4]},
)


def ratios(modes: dict[str, Any]) -> list[dict[str, Any]]:
    """Journal over no journal, per pair and client count."""
    rows = []
    for plain, journal in PAIRS:
        if plain not in modes or journal not in modes:
            continue
        for n, cell in modes[plain]["cells"].items():
            other = modes[journal]["cells"].get(n)
            if other is None:
                continue
            rows.append(
                {
                    "pair": plain,
                    "journal_mode": journal,
                    "clients": cell["clients"],
                    "actions_per_s": cell["actions_per_s"],
                    "journal_actions_per_s": other["actions_per_s"],
                    "ratio": other["actions_per_s"] / cell["actions_per_s"]
                    if cell["actions_per_s"]
                    else None,
                    "p50_ms": cell["p50_ms"],
                    "journal_p50_ms": other["p50_ms"],
                    "p99_ms": cell["p99_ms"],
                    "journal_p99_ms": other["p99_ms"],
                }
            )
    return rows


def markdown(results: dict[str, Any]) -> str:
    env = results["environment"]
    md = (
        f"# {results['title']}\n\n{results['date']} · `{results['command']}` · "
        f"{env['cpu_count']} CPUs · {results['config']['rounds']} rounds x "
        f"{results['config']['duration_s']} s per cell · wall {results['wall_s']:.0f} s\n\n"
    )
    md += (
        "Journal / no journal: ratio of median actions/s over rounds (the modes' rounds run in "
        "turn, side by side). Latency of `get_action` in the client. "
        "Target: >= 0.7x at 64 clients. "
        "Journals fsync by group commit (`GroupCommit(records=1000, seconds=0.02)`); "
        "in-process journals with `defer_returns=True` (a `log_returns` goes out with the "
        "next commit) except the row that says a write per `log_returns`.\n\n"
        "| setup (journal) | clients | actions/s | with journal | ratio | p50 ms | with journal | "
        "p99 ms | with journal |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    for r in results["ratios"]:
        md += (
            f"| {serving.LABELS[r.get('journal_mode', r['pair'])]} | {r['clients']} | "
            f"{thousands(r['actions_per_s'])} | "
            f"{thousands(r['journal_actions_per_s'])} | **{fmt(r['ratio'], '.2f')}** | "
            f"{fmt(r['p50_ms'], '.2f')} | {fmt(r['journal_p50_ms'], '.2f')} | "
            f"{fmt(r['p99_ms'], '.2f')} | {fmt(r['journal_p99_ms'], '.2f')} |\n"
        )
    return md + "\nThe full per-mode tables: the `modes` field of the JSON.\n"


def start_server(directory: Path, checkpoint_s: float) -> tuple[subprocess.Popen, dict]:
    """``examples.durable_server`` on ``directory``, once it serves (its ready line)."""
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "examples.durable_server", "--dir", str(directory)]
        + ["--checkpoint-s", str(checkpoint_s)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
        env=dict(os.environ, PYTHONPATH=str(root)),
    )
    assert proc.stdout is not None
    ready = json.loads(proc.stdout.readline())
    if ready.get("event") != "ready":
        raise RuntimeError(f"the server did not start: {ready}")
    return proc, ready


def drive(address: str, clients: int, seconds: float) -> int:
    """``clients`` threads run 40-step episodes against ``address`` for ``seconds``; the
    number of actions they got."""
    from jaxsampler.serving import PolicyClient

    stop, counts = threading.Event(), [0] * clients

    def run(c: int) -> None:
        client = PolicyClient(address, retries=0)
        try:
            while not stop.is_set():
                eid = client.start_episode()
                for t in range(40):
                    client.get_action(eid, np.full(3, t, np.float32))
                    client.log_returns(eid, 1.0)
                    counts[c] += 1
                client.end_episode(eid, np.zeros(3, np.float32))
        except (ConnectionError, OSError):  # the server was killed under it
            return

    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in range(clients)]
    for th in threads:
        th.start()
    time.sleep(seconds)
    stop.set()
    return sum(counts)  # (threads still in a call die with the server: not waited for)


def restart_once(load_s: float, clients: int, checkpoint_s: float) -> dict[str, Any]:
    """One run: serve under load, SIGKILL, start again; what the restart took."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        proc, ready = start_server(Path(tmp), checkpoint_s)
        first_s = time.monotonic() - t0  # a start with nothing to recover
        actions = drive(ready["address"], clients, load_s)
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
        t0 = time.monotonic()
        proc, ready = start_server(Path(tmp), checkpoint_s)
        restart_s = time.monotonic() - t0
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    rec = ready["recovery"]
    return {
        "load_s": load_s,
        "checkpoint_s": checkpoint_s,
        "actions": actions,
        "first_start_s": first_s,
        "restart_s": restart_s,
        "startup_s": ready["startup_s"],
        "compile_s": ready["compile_s"],
        "recovery_s": rec["seconds"],
        "acknowledged_steps": rec["acknowledged_steps"],
        "recovered_steps": rec["recovered_steps"],
        # the restart's cost beyond a start with nothing to recover (imports, compilation)
        "within_target": restart_s - first_s <= 2.0 and rec["seconds"] <= 2.0,
    }


def restart_markdown(results: dict[str, Any]) -> str:
    md = f"# {results['title']}\n\n{results['date']} · `{results['command']}`\n\n"
    md += (
        "SIGKILL under load, then a start on the same journal and log "
        "(`examples/durable_server.py`). Restart: wall time from the kill to serving "
        "again (Python and JAX imports, recovery, compilation); first start: the same for "
        "the run's first start, with nothing to recover. Target (issue 32): recovery "
        "within compile time + 2 s, i.e. a restart costs at most 2 s more than a start "
        "with nothing to recover.\n\n"
        "| checkpoints every | load s | actions before the kill | journaled steps replayed "
        "| recovered | recovery s | compile s | first start s | restart s "
        "| restart - first start s |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    for r in results["runs"]:
        every = f"{r['checkpoint_s']:g} s" if r["checkpoint_s"] else "never"
        md += (
            f"| {every} | {r['load_s']:g} | {r['actions']:,} | {r['acknowledged_steps']:,} "
            f"| {r['recovered_steps']:,} | {r['recovery_s']:.2f} | {r['compile_s']:.2f} "
            f"| {r['first_start_s']:.2f} | {r['restart_s']:.2f} "
            f"| **{r['restart_s'] - r['first_start_s']:.2f}** |\n"
        )
    return md


def restart_main(args: argparse.Namespace, argv: Sequence[str] | None) -> None:
    runs = [
        restart_once(load, args.restart_clients, every)
        for every in (args.checkpoint_s, 0.0)
        for load in args.load_s
    ]
    results: dict[str, Any] = harness.stamp(
        "Policy server restart after a SIGKILL", "serving_journal", argv
    )
    results.update(title=results["benchmark"], runs=runs)
    out = harness.results_dir(args.out, args.quick)
    harness.finish(results, restart_markdown(results), "serving_restart", out)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    serving_client.add_arguments(p, "serving_journal", SIZES)
    p.add_argument("--restart", action="store_true", help="measure restarts instead")
    p.add_argument("--load-s", type=float, nargs="+", default=[10.0, 30.0])
    p.add_argument("--restart-clients", type=int, default=16)
    p.add_argument("--checkpoint-s", type=float, default=5.0)
    args = p.parse_args(argv)
    if args.restart:
        restart_main(args, argv)
        return
    SIZES.apply(args)
    modes = list(dict.fromkeys(m for pair in PAIRS for m in pair))
    results = serving.run_benchmark(modes, serving.Phases.from_args(args), interleave=True)
    results.update(
        harness.stamp(
            "Policy serving with and without the write-ahead journal", "serving_journal", argv
        )
    )
    results["title"] = results["benchmark"]
    results["ratios"] = ratios(results["modes"])
    harness.finish(
        results, markdown(results), "serving_journal", harness.results_dir(args.out, args.quick)
    )


if __name__ == "__main__":
    main()
