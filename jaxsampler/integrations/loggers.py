"""Ready loggers: JSON lines, TensorBoard and Weights & Biases, as sampler callbacks.

Every logger is a :class:`~jaxsampler.sampling.callbacks.SamplerCallback`: pass it to a
sampler (``js.Sampler(..., callbacks=[logger])``) and each ``sample()`` /
``sample_batch()`` call writes the call's report (:meth:`SampleReport.scalars`: episode
return / length / count, env steps/s, rollout and conversion seconds, XLA compile events,
running totals) at ``step = report.step`` (env steps sampled so far). Anything else a
training loop measures (losses, learning rate) goes through :meth:`Logger.log` with the
step of the caller's choosing. All loggers run on the host, outside jitted code.

* :class:`JsonlLogger`: one JSON object per line, no extra dependency.
* :class:`TensorBoardLogger`: tensorboardX event files
  (``pip install -e ".[tensorboard]"``).
* :class:`WandbLogger`: a W&B run (the ``wandb`` extra: ``pip install -e ".[wandb]"``).
* :class:`MultiLogger` fans out to several; :class:`NullLogger` drops everything;
  :func:`make_logger` builds one from a command-line choice
  (:func:`add_arguments` / :func:`from_arguments`: a script's ``--log-dir``,
  ``--logger``, ``--quiet`` flags); :func:`log_history` writes the per-update metrics a
  jitted ``lax.scan`` training loop returns.

On a sampler whose mesh spans processes, each process's report covers its own envs:
give the logger to process 0's sampler only (or log ``sampler.global_metrics()``
yourself) so one run has one writer.

A call that compiled (``report.num_compiles > 0``) is also noted as a *compile event*:
kept in :attr:`Logger.compile_events` and written by each logger in its own way (a
``"compile"`` field of the JSON line, a TensorBoard text entry, a W&B console line).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import numbers
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from jaxsampler.sampling.callbacks import SampleReport

__all__ = [
    "JSONL_FILENAME",
    "LOGGER_KINDS",
    "CompileEvent",
    "JsonlLogger",
    "Logger",
    "MultiLogger",
    "NullLogger",
    "TensorBoardLogger",
    "WandbLogger",
    "check_scalars",
    "add_arguments",
    "from_arguments",
    "log_history",
    "make_logger",
    "read_jsonl",
]

#: the kinds :func:`make_logger` builds (the examples' ``--logger`` choices)
LOGGER_KINDS = ("jsonl", "tensorboard", "wandb", "none")

#: the file :func:`make_logger` writes JSON lines to inside ``log_dir``
JSONL_FILENAME = "metrics.jsonl"


def _dtype_kind(value: Any) -> str:
    return str(getattr(getattr(value, "dtype", None), "kind", ""))


def _as_float(key: str, value: Any) -> float:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Real):
        return float(value)
    # numpy / jax scalars and 0-d arrays
    if getattr(value, "ndim", None) == 0 and _dtype_kind(value) in ("b", "i", "u", "f"):
        return float(value)
    raise TypeError(
        f"scalar {key!r} must be a real number (int, float, or a 0-d numeric array), got "
        f"{type(value).__name__}: {value!r:.80}"
    )


def check_scalars(scalars: Mapping[str, Any], step: Any) -> tuple[dict[str, float], int]:
    """Validates a ``log()`` call: string keys, real-number values, an integer step.

    Returns:
        ``(scalars as python floats, step as python int)``.

    Raises:
        TypeError: a key that is not a string, a value that is not a real number (naming
            the key), or a step that is not an integer.
        ValueError: a negative step.
    """
    if not isinstance(scalars, Mapping):
        raise TypeError(f"scalars must be a mapping name -> number, got {type(scalars).__name__}")
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        if getattr(step, "ndim", None) == 0 and _dtype_kind(step) in ("i", "u"):
            step = int(step)
        else:
            raise TypeError(f"step must be an integer, got {type(step).__name__}: {step!r:.80}")
    step = int(step)
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    out: dict[str, float] = {}
    for k, v in scalars.items():
        if not isinstance(k, str):
            raise TypeError(f"scalar names must be strings, got {type(k).__name__}: {k!r}")
        out[k] = _as_float(k, v)
    return out, step


@dataclasses.dataclass(frozen=True)
class CompileEvent:
    """A sampler call that compiled: at ``step``, ``num_compiles`` XLA compilations
    taking ``compile_s`` seconds."""

    step: int
    num_compiles: int
    compile_s: float

    def describe(self) -> str:
        """A one-line note (what the loggers write)."""
        return (
            f"{self.num_compiles} XLA compilation(s), {self.compile_s:.3f} s, "
            f"at env step {self.step}"
        )


class Logger:
    """Base of the loggers: a sampler callback plus :meth:`log` for anything else.

    Subclasses implement :meth:`_write` (and :meth:`_close`, :meth:`_note_compile` where
    they hold resources or note compile events their own way). Calls are serialized by
    a lock, so a sampler's callback and a training loop's ``log`` may come from
    different threads. A logger is a context manager (``with JsonlLogger(p) as log:``)
    and closes once; logging to a closed logger raises ``ValueError``.

    Attributes:
        compile_events: the :class:`CompileEvent` of every reported call that compiled.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closed = False
        self.compile_events: list[CompileEvent] = []

    # -------------------------------------------------------------- public API

    def on_sample_end(self, report: SampleReport) -> None:
        """Writes ``report.scalars()`` at ``step=report.step`` (the sampler callback),
        and notes a compile event when the call compiled."""
        scalars = report.scalars()
        event = None
        if report.num_compiles > 0:
            event = CompileEvent(report.step, report.num_compiles, report.compile_s)
        with self._lock:
            self._check_open()
            clean, step = check_scalars(scalars, report.step)
            self._write(clean, step, event)
            if event is not None:
                self.compile_events.append(event)
                self._note_compile(event)

    def log(self, scalars: Mapping[str, Any], step: int) -> None:
        """Writes ``scalars`` (name -> real number: python, numpy or 0-d jax scalars) at
        ``step``, e.g. a training update's losses.

        Raises:
            TypeError: a value that is not a real number (the message names its key),
                a non-string key, a non-integer step.
            ValueError: the logger is closed, or a negative step.
        """
        clean, step = check_scalars(scalars, step)
        with self._lock:
            self._check_open()
            self._write(clean, step, None)

    def flush(self) -> None:
        """Pushes buffered output to its destination (loggers flush on close anyway)."""

    def close(self) -> None:
        """Flushes and releases the logger's resources (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called (writes then raise ``ValueError``)."""
        return self._closed

    def __enter__(self) -> Logger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------- to override

    def _write(self, scalars: dict[str, float], step: int, event: CompileEvent | None) -> None:
        raise NotImplementedError

    def _note_compile(self, event: CompileEvent) -> None:
        """Called (under the lock) after ``_write`` for a call that compiled."""

    def _close(self) -> None:
        pass

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"{type(self).__name__} is closed")


class NullLogger(Logger):
    """Validates and drops everything (``--logger none``); still records compile events."""

    def _write(self, scalars: dict[str, float], step: int, event: CompileEvent | None) -> None:
        pass


def _json_value(v: float) -> float | None:
    return v if math.isfinite(v) else None


class JsonlLogger(Logger):
    """JSON lines: ``{"step": ..., "time": ..., <name>: <value>, ...}`` per call.

    ``time`` is the wall clock (``time.time()``, seconds since the epoch). Non-finite
    values (NaN, ±inf: JSON has no such numbers) are written as ``null``. A call that
    compiled adds ``"compile": {"num_compiles": n, "compile_s": s}`` to its line. The
    file is opened for appending (a resumed run continues it) and every line is flushed
    when written, so a crash loses nothing already logged; read it back with
    :func:`read_jsonl`.

    Args:
        path: the file (its parent directories are created).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = Path(path)
        if self.path.is_dir():
            raise IsADirectoryError(f"JsonlLogger needs a file path, {self.path} is a directory")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def _write(self, scalars: dict[str, float], step: int, event: CompileEvent | None) -> None:
        for reserved in ("step", "time", "compile"):
            if reserved in scalars:
                raise ValueError(f"scalar name {reserved!r} is reserved by JsonlLogger")
        record: dict[str, Any] = {"step": step, "time": time.time()}
        record.update({k: _json_value(v) for k, v in scalars.items()})
        if event is not None:
            record["compile"] = {"num_compiles": event.num_compiles, "compile_s": event.compile_s}
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()

    def flush(self) -> None:
        with self._lock:
            if not self._closed:
                self._file.flush()

    def _close(self) -> None:
        self._file.close()


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a :class:`JsonlLogger` file, in order (``null`` becomes NaN)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                out.append({k: (math.nan if v is None else v) for k, v in rec.items()})
    return out


class TensorBoardLogger(Logger):
    """TensorBoard event files through tensorboardX's ``SummaryWriter``.

    Every scalar becomes a TensorBoard scalar of its name (``sampler/episode_return_mean``
    ...) at the given step; compile events become text entries under ``sampler/compile``.
    The writer is flushed after each call, so a running TensorBoard sees every point.

    Args:
        logdir: the run's directory (created).
        **writer_kwargs: passed to ``tensorboardX.SummaryWriter``.

    Raises:
        ImportError: tensorboardX is not installed (the message gives the command).
    """

    def __init__(self, logdir: str | os.PathLike[str], **writer_kwargs: Any) -> None:
        try:
            from tensorboardX import SummaryWriter
        except ImportError as e:
            raise ImportError(
                'TensorBoardLogger needs tensorboardX: pip install -e ".[tensorboard]"'
            ) from e
        super().__init__()
        self.logdir = Path(logdir)
        self.writer = SummaryWriter(logdir=str(self.logdir), **writer_kwargs)

    def _write(self, scalars: dict[str, float], step: int, event: CompileEvent | None) -> None:
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, global_step=step)
        if event is None:
            self.writer.flush()

    def _note_compile(self, event: CompileEvent) -> None:
        self.writer.add_text("sampler/compile", event.describe(), global_step=event.step)
        self.writer.flush()

    def flush(self) -> None:
        with self._lock:
            if not self._closed:
                self.writer.flush()

    def _close(self) -> None:
        self.writer.close()


class WandbLogger(Logger):
    """A Weights & Biases run.

    Logs to ``run`` if given, else to the active ``wandb.run`` if there is one, else to a
    run this logger starts with ``wandb.init(project=project, **init_kwargs)`` (and
    finishes on :meth:`close`; a run it did not start is left open). Compile events are
    printed to the W&B console (``wandb.termlog``).

    Args:
        project: the W&B project of a run this logger starts.
        run: an existing W&B run object to log to.
        **init_kwargs: passed to ``wandb.init`` (``dir=``, ``name=``, ``config=``,
            ``mode="offline"`` ...).

    Raises:
        ImportError: wandb is not installed (the message gives the command; jaxsampler
            does not depend on it).
    """

    def __init__(self, project: str | None = None, run: Any = None, **init_kwargs: Any) -> None:
        try:
            import wandb
        except ImportError as e:
            raise ImportError('WandbLogger needs wandb: pip install -e ".[wandb]"') from e
        super().__init__()
        self._wandb = wandb
        self._owns_run = False
        if run is None:
            run = getattr(wandb, "run", None)
        if run is None:
            if project is not None:
                init_kwargs["project"] = project
            run = wandb.init(**init_kwargs)
            self._owns_run = True
        self.run = run

    def _write(self, scalars: dict[str, float], step: int, event: CompileEvent | None) -> None:
        self.run.log(dict(scalars), step=step)

    def _note_compile(self, event: CompileEvent) -> None:
        termlog = getattr(self._wandb, "termlog", None)
        if termlog is not None:
            termlog(f"jaxsampler: {event.describe()}")

    def _close(self) -> None:
        if self._owns_run:
            self.run.finish()


class MultiLogger(Logger):
    """Fans every call out to several loggers (each notes compile events its own way);
    closing it closes them all."""

    def __init__(self, *loggers: Logger) -> None:
        super().__init__()
        for lg in loggers:
            if not isinstance(lg, Logger):
                raise TypeError(f"MultiLogger takes Logger instances, got {type(lg).__name__}")
        self.loggers = list(loggers)

    def on_sample_end(self, report: SampleReport) -> None:
        with self._lock:
            self._check_open()
        if report.num_compiles > 0:
            self.compile_events.append(
                CompileEvent(report.step, report.num_compiles, report.compile_s)
            )
        for lg in self.loggers:
            lg.on_sample_end(report)

    def log(self, scalars: Mapping[str, Any], step: int) -> None:
        clean, step = check_scalars(scalars, step)
        with self._lock:
            self._check_open()
        for lg in self.loggers:
            lg.log(clean, step)

    def flush(self) -> None:
        for lg in self.loggers:
            lg.flush()

    def _close(self) -> None:
        for lg in self.loggers:
            lg.close()


def make_logger(kind: str, log_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> Logger:
    """The logger a command-line ``--logger KIND --log-dir DIR`` asks for.

    Args:
        kind: ``"jsonl"`` (``DIR/metrics.jsonl``), ``"tensorboard"`` (event files in
            ``DIR``), ``"wandb"`` (a W&B run, its files in ``DIR`` if given) or
            ``"none"`` (a :class:`NullLogger`).
        log_dir: the run's directory (needed by ``jsonl`` and ``tensorboard``).
        **kwargs: passed to the logger's constructor (e.g. ``project=`` for W&B).

    Raises:
        ValueError: an unknown kind, or no ``log_dir`` for a kind that needs one.
        ImportError: the kind's package is not installed.
    """
    if kind not in LOGGER_KINDS:
        raise ValueError(f"logger kind must be one of {', '.join(LOGGER_KINDS)}; got {kind!r}")
    if kind == "none":
        return NullLogger()
    if kind == "wandb":
        if log_dir is not None:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            kwargs.setdefault("dir", str(log_dir))
        return WandbLogger(**kwargs)
    if log_dir is None:
        raise ValueError(f"the {kind!r} logger needs a log directory (--log-dir)")
    if kind == "jsonl":
        return JsonlLogger(Path(log_dir) / JSONL_FILENAME, **kwargs)
    return TensorBoardLogger(log_dir, **kwargs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds a training script's logging flags: ``--log-dir DIR``, ``--logger KIND``
    (default ``jsonl`` when ``--log-dir`` is given, else ``none``) and ``--quiet`` (no
    progress bar; see :func:`jaxsampler.integrations.progress.is_quiet`). Read them back with
    :func:`from_arguments`."""
    g = parser.add_argument_group("logging")
    g.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help=f"write per-update scalars here ({JSONL_FILENAME} with --logger jsonl)",
    )
    g.add_argument(
        "--logger",
        choices=LOGGER_KINDS,
        default=None,
        help="where scalars go (default: jsonl if --log-dir is given, else none)",
    )
    g.add_argument(
        "--quiet",
        action="store_true",
        default=None,
        help="no progress bar (also off when stderr is not a terminal, or CI / "
        "JAXSAMPLER_QUIET is set)",
    )


def from_arguments(args: argparse.Namespace, **kwargs: Any) -> Logger:
    """The logger the flags of :func:`add_arguments` ask for (``kwargs`` go to
    :func:`make_logger`).

    Raises:
        ValueError: ``--logger jsonl`` / ``tensorboard`` without ``--log-dir``.
    """
    kind = args.logger or ("jsonl" if args.log_dir is not None else "none")
    return make_logger(kind, args.log_dir, **kwargs)


def log_history(
    logger: Logger,
    history: Mapping[str, Any],
    *,
    steps_per_update: int,
    start_step: int = 0,
    final: Mapping[str, Any] | None = None,
) -> int:
    """Logs the per-update metrics of a training loop run as one jitted ``lax.scan``
    (which returns them stacked): one :meth:`Logger.log` call per update ``u``, at step
    ``start_step + (u + 1) * steps_per_update``, holding ``history[name][u]`` for every
    name whose value there is finite (an update without a finished episode has no mean
    return: it is left out of that line, not written as 0).

    Args:
        logger: where the lines go.
        history: name -> values ``[num_updates]`` (numpy or jax arrays, lists), all of
            one length.
        steps_per_update: env steps per update (e.g. ``num_envs * rollout_length``).
        start_step: the step before the first update.
        final: scalars added to the last update's line (e.g. throughput, final return).

    Returns:
        The number of lines written (``num_updates``).

    Raises:
        ValueError: histories of different lengths, or not one-dimensional.
    """
    import numpy as np

    cols = {k: np.asarray(v, dtype=np.float64) for k, v in history.items()}
    lengths = {k: v.shape for k, v in cols.items()}
    if any(len(shape) != 1 for shape in lengths.values()) or len(set(lengths.values())) > 1:
        raise ValueError(f"history needs 1-d values of one length, got shapes {lengths}")
    n = next(iter(lengths.values()))[0] if cols else 0
    for u in range(n):
        line = {k: float(v[u]) for k, v in cols.items() if np.isfinite(v[u])}
        if u == n - 1 and final:
            line.update(final)
        logger.log(line, step=start_step + (u + 1) * steps_per_update)
    return n
