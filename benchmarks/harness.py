"""What the benchmark scripts share: formatting, timing, the command line and result files.

* numbers: :func:`si` (``1.23M``, ``456k``), :func:`mk`, :func:`thousands`, :func:`fmt`;
* timing: :func:`timed` (one call), :func:`median_time`, :class:`RoundTimer` (a call timed
  in rounds); the order of the sides in round ``r`` (:func:`rotated`, :func:`alternated`)
  and the figures over rounds (:func:`paired_ratio`, :func:`median_min_max`);
* the command line: :class:`Sizes` (full and ``--quick`` defaults), :func:`add_quick_out`
  (``--quick``, ``--out``) and :func:`results_dir` (where a run writes);
* records and files: :func:`stamp` (benchmark, date, command), :func:`command`,
  :func:`git_state`, :func:`versions`, :func:`write_results` (JSON + Markdown, and a plot),
  :func:`finish` (print, then write), :func:`pyplot`, :func:`log`.

The measurements that the installed ``jaxsampler bench`` command makes stay in the library,
:mod:`jaxsampler.cli.bench` (``environment_info``, ``time_calls``, ``compile_count``,
``measure_rollout``); the scripts import them from there.

Importing this module imports neither JAX nor jaxsampler (``scaling.py``'s parent process
must not start JAX): the timing functions import them when they are called.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

#: The repository root: the working directory of the scripts' own subprocesses
#: (``python -m benchmarks.<script>`` finds this checkout's packages there).
ROOT = Path(__file__).resolve().parents[1]
#: Where full runs write their result files (``--quick`` runs print only).
RESULTS_DIR = Path(__file__).resolve().parent / "results"

T = TypeVar("T")

# --------------------------------------------------------------------------- numbers

_PREFIXES = ((1e9, "G"), (1e6, "M"), (1e3, "k"))


def si(x: float, decimals: int | None = None) -> str:
    """``x`` with a G / M / k suffix. By default three significant digits (``1.23M``,
    ``456k``, ``7.5``); with ``decimals``, that many decimals after a suffix (``1.23M``)
    and none without one (``456``)."""
    spec, small = (".3g", ".3g") if decimals is None else (f".{decimals}f", ".0f")
    for scale, suffix in _PREFIXES:
        if x >= scale:
            return f"{x / scale:{spec}}{suffix}"
    return f"{x:{small}}"


def mk(x: float) -> str:
    """Millions with two decimals (``1.23M``), else whole thousands (``456k``)."""
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.0f}k"


def thousands(x: float | None) -> str:
    """Thousands with one decimal (``12.3k``), else a whole number (``456``); ``—`` for None."""
    if x is None:
        return "—"
    return f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}"


def fmt(x: float | None, spec: str = ".0f", scale: float = 1.0, missing: str = "—") -> str:
    """``format(x * scale, spec)``, or ``missing`` for a figure that is not there (None)."""
    return missing if x is None else format(x * scale, spec)


# --------------------------------------------------------------------------- timing


def timed(fn: Callable[[], Any], *, collect: bool = False) -> float:
    """Seconds of one call of ``fn``, blocked until its result is ready (``collect``: a
    ``gc.collect()`` first, outside the timing)."""
    import jax

    if collect:
        gc.collect()
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t0


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds of ``repeats`` calls of ``fn`` (each blocked until ready) after one
    warm-up call."""
    from jaxsampler.cli.bench import time_calls

    fn()
    return statistics.median(time_calls(fn, repeats))


class RoundTimer:
    """A call timed in rounds. Constructing it makes the first call (trace, compile and one
    run: ``compile_s``); :meth:`round` then times ``inner`` calls, each blocked until its
    result is ready, keeping every time (``times``) and each round's median (``round_s``)."""

    def __init__(self, call: Callable[[], Any]):
        self.call = call
        self.compile_s = timed(call)
        self.times: list[float] = []
        self.round_s: list[float] = []

    def round(self, inner: int) -> float:
        """Times ``inner`` calls; returns their median."""
        from jaxsampler.cli.bench import time_calls

        times = time_calls(self.call, inner)
        self.times.extend(times)
        self.round_s.append(statistics.median(times))
        return self.round_s[-1]


def rotated(items: Sequence[T], r: int) -> list[T]:
    """The order of round ``r``: ``items`` rotated by ``r``, so each leads in turn."""
    k = r % len(items)
    return list(items[k:]) + list(items[:k])


def alternated(items: Sequence[T], r: int) -> list[T]:
    """The order of round ``r``: ``items`` in even rounds, reversed in odd ones."""
    return list(items) if r % 2 == 0 else list(items)[::-1]


def paired_ratio(xs: Iterable[float], ys: Iterable[float]) -> float:
    """Median over rounds of ``x / y``, the two figures of the same round: noise that hits a
    whole round cancels, and the median drops rounds where it hit one side only."""
    return statistics.median(x / y for x, y in zip(xs, ys, strict=True))


def median_min_max(values: Sequence[float]) -> dict[str, float]:
    """``{"median", "min", "max"}`` of per-round figures."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


# --------------------------------------------------------------------------- command line


@dataclasses.dataclass(frozen=True)
class Sizes:
    """A script's defaults for a full run and for ``--quick`` (a smoke test of the same code
    at tiny sizes). :meth:`apply` gives every option left unset on the command line (None)
    the chosen set's value."""

    full: Mapping[str, Any]
    quick: Mapping[str, Any]

    def of(self, quick: bool) -> Mapping[str, Any]:
        return self.quick if quick else self.full

    def apply(self, args: argparse.Namespace) -> argparse.Namespace:
        for k, v in self.of(args.quick).items():
            if getattr(args, k) is None:
                setattr(args, k, v)
        return args


def add_quick_out(
    p: argparse.ArgumentParser,
    name: str,
    *,
    out: str = "--out",
    quick: str = "tiny smoke run; prints",
) -> None:
    """``--quick`` and the output folder (``--out``, or ``out``): a full run writes
    ``<name>.json`` / ``.md`` to :data:`RESULTS_DIR` unless told where; a quick one only
    prints unless told where (:func:`results_dir`)."""
    p.add_argument("--quick", action="store_true", help=f"{quick}, writes only with {out}")
    p.add_argument(out, type=Path, help=f"where to write {name}.json/.md (default {RESULTS_DIR})")


def results_dir(out: Path | None, quick: bool) -> Path | None:
    """``out`` if given, else :data:`RESULTS_DIR` for a full run and nowhere (None) for
    ``--quick``."""
    if out is not None:
        return out
    return None if quick else RESULTS_DIR


# --------------------------------------------------------------------------- records


def now() -> str:
    """The UTC date and time, to the second (ISO 8601)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def command(script: str, argv: Sequence[str] | None = None) -> str:
    """The command line that reproduces this run: ``python -m benchmarks.<script>`` and
    ``argv`` (default: this process's arguments)."""
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python", "-m", f"benchmarks.{script}", *args])


def stamp(benchmark: str, script: str, argv: Sequence[str] | None = None) -> dict[str, str]:
    """The first fields of a result record: ``benchmark``, ``date`` and ``command``."""
    return {"benchmark": benchmark, "date": now(), "command": command(script, argv)}


def git_state(include_untracked: bool = False) -> dict[str, Any]:
    """HEAD commit and the files changed in the working tree (the code that was measured)."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()

    status = ["status", "--porcelain"] + ([] if include_untracked else ["-uno"])
    try:
        return {"commit": git("rev-parse", "HEAD"), "changed": git(*status).splitlines()}
    except (OSError, subprocess.SubprocessError) as e:
        return {"error": str(e)}


def machine() -> dict[str, Any]:
    """The machine a result was measured on: CPU model and count, OS, Python."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "os": platform.platform(),
        "python": platform.python_version(),
    }


def measured_at() -> dict[str, Any]:
    """Where and when a result was measured: ``commit`` (and the working-tree files changed
    from it), ``date``, ``machine`` and ``load`` (the 1/5/15-minute load averages when the
    result is written, which cover the run's last minutes)."""
    return {
        **git_state(),
        "date": now(),
        "machine": machine(),
        "load": [round(x, 2) for x in os.getloadavg()],
    }


def versions(packages: Iterable[str], missing: str | None = "not installed") -> dict[str, str]:
    """Installed versions of ``packages``; one that is missing says ``missing`` (None: left
    out)."""
    from importlib import metadata

    out = {}
    for pkg in packages:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            if missing is not None:
                out[pkg] = missing
    return out


# --------------------------------------------------------------------------- files


def log(msg: str) -> None:
    """A timestamped progress line on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def module_at(ref: str, path: str, name: str) -> Any:
    """The module ``path`` (a file of this repository) as it was at commit ``ref``, loaded
    under ``name`` (registered in ``sys.modules``: dataclasses look their module up), or
    ``None`` with a logged reason where git cannot show it: a baseline run side by side."""
    import types

    try:
        src = subprocess.run(
            ["git", "show", f"{ref}:{path}"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        log(f"no {path} at {ref} ({e}); skipping its baseline")
        return None
    mod = types.ModuleType(name)
    sys.modules[name] = mod
    exec(compile(src, f"{ref}:{path}", "exec"), mod.__dict__)
    return mod


def write_results(
    results: dict[str, Any],
    markdown: str,
    out_dir: Path,
    name: str,
    *,
    plot: Callable[[dict[str, Any], Path], None] | None = None,
    indent: int = 1,
    default: Callable[[Any], Any] | None = None,
) -> None:
    """Writes ``<name>.json`` (the raw results, with a ``measured_at`` record from
    :func:`measured_at` unless they have one; ``indent`` and ``default`` as for
    :func:`json.dumps`), ``<name>.md`` (the tables) and, given ``plot(results, path)``,
    ``<name>.png`` to ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {**results, "measured_at": results.get("measured_at") or measured_at()}
    paths = [out_dir / f"{name}.json", out_dir / f"{name}.md"]
    paths[0].write_text(json.dumps(results, indent=indent, default=default) + "\n")
    paths[1].write_text(markdown)
    if plot is not None:
        paths.append(out_dir / f"{name}.png")
        plot(results, paths[-1])
    log("wrote " + ", ".join(map(str, paths[:-1])) + f" and {paths[-1]}")


def finish(
    results: dict[str, Any], markdown: str, name: str, out_dir: Path | None, **write: Any
) -> None:
    """Prints the tables; writes the result files (:func:`write_results`) to ``out_dir``
    unless it is None."""
    print(markdown)
    if out_dir is not None:
        write_results(results, markdown, out_dir, name, **write)


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
