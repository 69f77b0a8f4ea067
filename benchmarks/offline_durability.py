"""What durability costs the offline writer: records/s under each flush/fsync setting.

``--records`` (5,000) small SampleBatches (4 rows, 5 columns, about 400 bytes
encoded; a policy server's per-step records are this small) are written with a fresh
:class:`jaxsampler.offline.OfflineWriter` per setting, timed from open to close:

* ``no flush``: ``flush="manual"`` (frames buffered, handed to the OS every
  :data:`~jaxsampler.offline.BUFFER_LIMIT` bytes and at close);
* ``flush per record``: the default (each frame handed to the OS before ``write``
  returns; a killed process loses nothing it returned from);
* ``fsync per record``: ``fsync=True`` (``--fsync-records``, 1,000, records: each waits
  for the disk);
* ``group commit 10 ms``: ``fsync=GroupCommit(seconds=0.01)``;
* ``before``: the writer of ``--baseline-ref`` (a buffered file, no flush, no checks),
  loaded with ``git show`` (skipped when git cannot);
* ``.gz`` rows: no flush and flush per record (a sync flush of the compressor per
  record), with the file sizes.

Each round runs every setting once, in a rotating order; reported are medians over
``--repeats`` (3) rounds, records/s and the ratio to ``no flush`` (median of the
within-round ratios). Also measured: one ``os.stat`` of the log's path (the replaced-path
check every write runs) against the time of one flush-per-record write.

    python -m benchmarks.offline_durability            # writes results/offline_durability.*
    python -m benchmarks.offline_durability --quick    # smoke test, prints only
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import jaxsampler as js
from benchmarks import harness
from benchmarks.harness import log
from jaxsampler.cli.bench import environment_info
from jaxsampler.offline import GroupCommit, OfflineWriter, read_records

#: setting name -> (file suffix, OfflineWriter keyword arguments)
SETTINGS: dict[str, tuple[str, dict[str, Any]]] = {
    "no flush": ("", {"flush": "manual"}),
    "flush per record": ("", {}),
    "fsync per record": ("", {"fsync": True}),
    "group commit 10 ms": ("", {"fsync": GroupCommit(seconds=0.01)}),
    ".gz no flush": (".gz", {"flush": "manual"}),
    ".gz flush per record": (".gz", {}),
}


def make_records(n: int) -> list[js.SampleBatch]:
    rng = np.random.default_rng(0)
    return [
        js.SampleBatch(
            obs=rng.standard_normal((4, 4)).astype(np.float32),
            actions=rng.integers(0, 2, 4),
            rewards=np.ones(4, np.float32),
            terminateds=np.zeros(4, bool),
            eps_id=np.full(4, i, np.int64),
        )
        for i in range(n)
    ]


def write_with(path: str, records: list[js.SampleBatch], kwargs: dict[str, Any]) -> None:
    with OfflineWriter(path, **kwargs) as w:
        for r in records:
            w.write(r)


def old_writer(ref: str) -> type | None:
    """The ``OfflineWriter`` of commit ``ref`` (before the durability settings)."""
    mod = harness.module_at(ref, "jaxsampler/offline.py", "offline_before")
    return None if mod is None else mod.OfflineWriter


def stat_cost_s(path: str, n: int = 20_000) -> float:
    t = time.perf_counter()
    for _ in range(n):
        os.stat(path)
    return (time.perf_counter() - t) / n


def run(args: argparse.Namespace) -> dict[str, Any]:
    records = make_records(args.records)
    slow = records[: args.fsync_records]
    before = old_writer(args.baseline_ref)
    sides: dict[str, Callable[[str], Any]] = {}
    counts: dict[str, int] = {}
    for name, (_suffix, kwargs) in SETTINGS.items():
        rs = slow if name == "fsync per record" else records
        sides[name] = lambda p, rs=rs, kw=kwargs: write_with(p, rs, kw)
        counts[name] = len(rs)
    if before is not None:

        def write_before(p: str, cls: type = before) -> None:
            with cls(p) as w:
                for r in records:
                    w.write(r)

        sides["before"] = write_before
        counts["before"] = len(records)
    suffix = {k: SETTINGS[k][0] if k in SETTINGS else "" for k in sides}
    names = list(sides)
    times: dict[str, list[float]] = {k: [] for k in names}
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for r in range(args.repeats):
            for k in harness.rotated(names, r):
                path = os.path.join(tmp, k.replace(" ", "_").replace(".", "") + ".log" + suffix[k])
                times[k].append(harness.timed(lambda k=k, path=path: sides[k](path)))
                sizes[k] = os.path.getsize(path)
        for k in names:  # every setting wrote every record, readably
            path = os.path.join(tmp, k.replace(" ", "_").replace(".", "") + ".log" + suffix[k])
            assert sum(1 for _ in read_records(path)) == counts[k], k
        stat_s = stat_cost_s(path)
    rate = {k: counts[k] / statistics.median(v) for k, v in times.items()}
    ratio = {  # records/s relative to no flush, median of within-round ratios
        k: statistics.median(
            (counts[k] / t) / (counts["no flush"] / t0)
            for t, t0 in zip(times[k], times["no flush"], strict=True)
        )
        for k in names
    }
    per_write_s = 1 / rate["flush per record"]
    log(f"records/s {rate}")
    return {
        "config": vars(args),
        "records": counts,
        "records_per_s": rate,
        "ratio_to_no_flush": ratio,
        "bytes": sizes,
        "times_s": times,
        "stat_us": stat_s * 1e6,
        "flush_per_record_write_us": per_write_s * 1e6,
        "stat_share_of_a_write": stat_s / per_write_s,
        "environment": environment_info(),
        "git": harness.git_state(),
    }


def markdown(res: dict[str, Any]) -> str:
    lines = [
        "# Offline writer durability: records/s per flush/fsync setting",
        "",
        f"Small SampleBatches (4 rows, 5 columns), a fresh writer per setting, open to close; "
        f"medians of {res['config']['repeats']} rounds, settings in a rotating order within "
        f"each round. Files in `{res['config']['dir'] or tempfile.gettempdir()}`.",
        "",
        "| setting | records | records/s | ratio to no flush | file KiB |",
        "|---|---|---|---|---|",
    ]
    for k, rate in res["records_per_s"].items():
        lines.append(
            f"| {k} | {res['records'][k]} | {rate:,.0f} | {res['ratio_to_no_flush'][k]:.3f} | "
            f"{res['bytes'][k] / 1024:.0f} |"
        )
    lines += [
        "",
        f"Path check: one `os.stat` of the log's path costs {res['stat_us']:.2f} us, "
        f"{100 * res['stat_share_of_a_write']:.1f}% of one flush-per-record write "
        f"({res['flush_per_record_write_us']:.1f} us, the check included); the writer runs it "
        "before every write.",
        "",
        "'before' is the writer of the commit before the durability settings (a buffered file,",
        "no flush, no path check). Ratios are medians of the within-round ratios.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=5000)
    ap.add_argument("--fsync-records", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the logs go (default: the temp dir)")
    ap.add_argument("--baseline-ref", default="dfb9d0c")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, print only")
    args = ap.parse_args()
    if args.quick:
        args.records, args.fsync_records, args.repeats = 200, 50, 2
    res = run(args)
    out = None if args.quick else harness.RESULTS_DIR
    harness.finish(res, markdown(res), "offline_durability", out)


if __name__ == "__main__":
    main()
