"""What framing and checksums cost: offline log format version 2 vs version 1.

A realistic log: ``--batches`` (200) SampleBatches of ``--rows`` (1000) rows with the
columns a PPO learner reads (obs float32[4], actions int64, rewards float32,
terminateds/truncateds bool, logp float32, vf_preds float32, eps_id int64), plain and
gzip-compressed. In each round, back to back in a rotating order, on the same records:

* ``write v1``: the version-1 layout (header, then one bare msgpack document per
  record), written here from the documented format with the same codec;
* ``write v2``: :class:`jaxsampler.offline.OfflineWriter` (a 21-byte frame header with
  two CRC-32s per record, an end frame on close);
* ``read v1`` / ``read v2``: :func:`jaxsampler.offline.read_records` over each file,
  every record decoded;
* ``read v1 (before)``: the version-1 file through the decoder of the commit before
  format 2 (``--baseline-ref``), loaded with ``git show`` (skipped when git cannot).

Reported: medians over rounds (``--repeats``, at least 5), the within-round ratios
``v2 / v1`` (medians), and the ratio of the fastest rounds.

    python -m benchmarks.offline_format            # full run, writes results/offline_format.*
    python -m benchmarks.offline_format --quick    # smoke test, prints only
"""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import tempfile
from collections.abc import Callable
from typing import Any, BinaryIO, cast

import numpy as np

import jaxsampler as js
from benchmarks import harness
from benchmarks.harness import log
from jaxsampler.cli.bench import environment_info
from jaxsampler.episodes.codec import packb
from jaxsampler.offline import FORMAT, OfflineWriter, read_records

#: The version-1 header: ``{"format": "jaxsampler.offline", "version": 1}`` in msgpack, as
#: the format's documentation (``jaxsampler.offline``) gives it.
HEADER_V1 = packb({"format": FORMAT, "version": 1})


def make_batches(n: int, rows: int) -> list[js.SampleBatch]:
    rng = np.random.default_rng(0)
    return [
        js.SampleBatch(
            obs=rng.standard_normal((rows, 4)).astype(np.float32),
            actions=rng.integers(0, 2, rows),
            rewards=np.ones(rows, np.float32),
            terminateds=rng.random(rows) < 0.02,
            truncateds=np.zeros(rows, bool),
            action_logp=rng.standard_normal(rows).astype(np.float32),
            vf_preds=rng.standard_normal(rows).astype(np.float32),
            eps_id=np.repeat(np.arange(rows // 50 + 1), 50)[:rows],
        )
        for _ in range(n)
    ]


def open_log(path: str, mode: str) -> BinaryIO:
    """A log file, gzip-compressed where the path ends in ``.gz`` (as the offline logs)."""
    if path.endswith(".gz"):
        return cast(BinaryIO, gzip.open(path, mode))
    return cast(BinaryIO, open(path, mode))


def write_v1(path: str, batches: list[js.SampleBatch]) -> None:
    with open_log(path, "wb") as f:
        f.write(HEADER_V1)
        for b in batches:
            f.write(packb(b))


def write_v2(path: str, batches: list[js.SampleBatch]) -> None:
    with OfflineWriter(path) as w:
        for b in batches:
            w.write(b)


def read_all(path: str) -> int:
    return sum(1 for _ in read_records(path))


def old_reader(ref: str) -> Callable[[str], int] | None:
    """The version-1 reader of commit ``ref`` (its codec's streaming unpacker)."""
    mod = harness.module_at(ref, "jaxsampler/codec.py", "codec_before")
    if mod is None:
        return None

    def read(path: str) -> int:
        with open_log(path, "rb") as f:
            frames = mod.unpacker(f)
            next(frames)  # the header
            return sum(1 for _ in frames)

    return read


def run(args: argparse.Namespace) -> dict[str, Any]:
    batches = make_batches(args.batches, args.rows)
    before = old_reader(args.baseline_ref)
    cells: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for suffix in (".msgpack", ".msgpack.gz"):
            p1, p2 = os.path.join(tmp, "v1" + suffix), os.path.join(tmp, "v2" + suffix)
            sides: dict[str, Callable[[], Any]] = {
                "write v1": lambda p1=p1: write_v1(p1, batches),
                "write v2": lambda p2=p2: write_v2(p2, batches),
            }
            write_v1(p1, batches)
            write_v2(p2, batches)
            assert read_all(p1) == read_all(p2) == len(batches)
            sides["read v1"] = lambda p1=p1: read_all(p1)
            sides["read v2"] = lambda p2=p2: read_all(p2)
            if before is not None:
                sides["read v1 (before)"] = lambda p1=p1, r=before: r(p1)
            names = list(sides)
            times: dict[str, list[float]] = {k: [] for k in names}
            for r in range(args.repeats):
                for k in harness.rotated(names, r):
                    times[k].append(harness.timed(sides[k], collect=True))
            ratio = {
                op: harness.paired_ratio(times[f"{op} v2"], times[f"{op} v1"])
                for op in ("write", "read")
            }
            cell = {
                "bytes": {"v1": os.path.getsize(p1), "v2": os.path.getsize(p2)},
                "median_s": {k: statistics.median(v) for k, v in times.items()},
                "min_s": {k: min(v) for k, v in times.items()},
                "ratio_of_min_v2_over_v1": {
                    op: min(times[f"{op} v2"]) / min(times[f"{op} v1"]) for op in ("write", "read")
                },
                "times_s": times,
                "ratio_v2_over_v1": ratio,
            }
            if before is not None:
                cell["ratio_read_v1_now_over_before"] = harness.paired_ratio(
                    times["read v1"], times["read v1 (before)"]
                )
            cells[suffix] = cell
            log(f"{suffix}: {cell['median_s']} ratio v2/v1 {ratio}")
    return {
        "config": vars(args),
        "records": args.batches,
        "rows": args.rows,
        "cells": cells,
        "environment": environment_info(),
        "git": harness.git_state(),
    }


def markdown(res: dict[str, Any]) -> str:
    mb = lambda n: f"{n / 2**20:.1f}"
    lines = [
        "# Offline log format: version 2 (framed, CRC-32) vs version 1",
        "",
        f"{res['records']} SampleBatches x {res['rows']} rows, 8 columns; medians of "
        f"{res['config']['repeats']} rounds, sides in a rotating order within each round.",
        "",
        "| file | v1 MiB | v2 MiB | write v1 s | write v2 s | write v2/v1 (min) | read v1 s | "
        "read v2 s | read v2/v1 (min) | read v1 before s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in res["cells"].items():
        m, r, q = c["median_s"], c["ratio_v2_over_v1"], c["ratio_of_min_v2_over_v1"]
        before = m.get("read v1 (before)")
        lines.append(
            f"| {name} | {mb(c['bytes']['v1'])} | {mb(c['bytes']['v2'])} | "
            f"{m['write v1']:.4f} | {m['write v2']:.4f} | {r['write']:.3f} ({q['write']:.3f}) | "
            f"{m['read v1']:.4f} | {m['read v2']:.4f} | {r['read']:.3f} ({q['read']:.3f}) | "
            f"{'-' if before is None else f'{before:.4f}'} |"
        )
    lines += [
        "",
        "Times are medians over rounds; ratios are medians of the within-round ratios, in",
        "brackets the ratio of the fastest rounds (less exposed to other processes on a",
        "shared machine). 'read v1 before' is the version-1 reader of the commit before",
        "format 2 (no depth scan, no array size checks).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--baseline-ref", default="01e598e")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, print only")
    args = ap.parse_args()
    if args.quick:
        args.batches, args.rows, args.repeats = 10, 100, 5
    res = run(args)
    out = None if args.quick else harness.RESULTS_DIR
    harness.finish(res, markdown(res), "offline_format", out)


if __name__ == "__main__":
    main()
