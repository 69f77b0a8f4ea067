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

Usage::

    python -m benchmarks.serving_journal           # writes results/serving_journal.{json,md}
    python -m benchmarks.serving_journal --quick   # smoke test, prints only
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

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


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    serving_client.add_arguments(p, "serving_journal", SIZES)
    args = p.parse_args(argv)
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
