"""Progress bars for training loops and benchmarks (a thin layer over tqdm).

:func:`progress` opens a bar showing the count, its rate (steps/s) and the ETA; it is
quiet (prints nothing) when asked, and by default when its stream is not a terminal or
the environment variable ``CI`` or ``JAXSAMPLER_QUIET`` is set, so logs of batch jobs
and CI runs carry no carriage-return noise. :class:`ProgressCallback` advances a bar by
each sampler call's env steps (a :class:`~jaxsampler.sampling.callbacks.SamplerCallback`)::

    with progress(total_steps, desc="ppo") as bar:
        sampler = js.Sampler(env, policy, ..., callbacks=[ProgressCallback(bar)])
        while bar.n < total_steps:
            sampler.sample(params)

Everything here runs on the host, outside jitted code.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from jaxsampler.sampling.callbacks import SampleReport

__all__ = ["Bar", "ProgressCallback", "is_quiet", "progress"]

#: environment variables whose presence (any value but "", "0", "false", "no") means quiet
QUIET_ENV_VARS = ("CI", "JAXSAMPLER_QUIET")


def _env_flag(name: str) -> bool:
    value = os.environ.get(name)
    return value is not None and value.strip().lower() not in ("", "0", "false", "no")


def is_quiet(quiet: bool | None = None, file: IO[str] | None = None) -> bool:
    """Whether a bar on ``file`` (default ``sys.stderr``) prints nothing.

    ``quiet=True`` / ``False`` decide; ``None`` means automatic: quiet when the stream
    is not a terminal, or ``CI`` / ``JAXSAMPLER_QUIET`` is set in the environment.
    """
    if quiet is not None:
        return bool(quiet)
    if any(_env_flag(v) for v in QUIET_ENV_VARS):
        return True
    stream = sys.stderr if file is None else file
    isatty = getattr(stream, "isatty", None)
    try:
        return not (isatty is not None and isatty())
    except (ValueError, OSError):  # a closed stream
        return True


class Bar:
    """A progress bar (or, when quiet, a silent counter with the same interface).

    Attributes:
        n: the count so far (kept when quiet too).
        total: the count at which the bar is full (``None``: unknown, no ETA).
        quiet: whether the bar prints nothing.
    """

    def __init__(
        self,
        total: int | float | None,
        *,
        desc: str | None = None,
        unit: str = "step",
        quiet: bool | None = None,
        file: IO[str] | None = None,
        initial: int | float = 0,
        **tqdm_kwargs: Any,
    ) -> None:
        if total is not None and (not isinstance(total, (int, float)) or total < 0):
            raise ValueError(f"total must be a number >= 0 or None, got {total!r}")
        self.total = total
        self.n: int | float = initial
        self.quiet = is_quiet(quiet, file)
        self._tqdm: Any = None
        self._postfix: dict[str, Any] = {}
        if not self.quiet:
            from tqdm import tqdm

            self._tqdm = tqdm(
                total=total,
                desc=desc,
                unit=unit,
                # 1.2M steps for big counts; exact integers for small ones
                unit_scale=total is None or total >= 10_000,
                dynamic_ncols=True,
                file=sys.stderr if file is None else file,
                initial=initial,
                **tqdm_kwargs,
            )

    def update(self, n: int | float = 1, **postfix: Any) -> None:
        """Advances the count by ``n`` and shows ``postfix`` (``name=value``; floats
        printed with 4 significant digits; a NaN keeps the previous value) after the rate."""
        self.n += n
        if self._tqdm is None:
            return
        shown = {k: _fmt(v) for k, v in postfix.items() if not _is_nan(v)}
        if shown:  # a NaN keeps the value shown last
            self._postfix.update(shown)
            self._tqdm.set_postfix(self._postfix, refresh=False)
        self._tqdm.update(n)

    def write(self, msg: str) -> None:
        """Prints a line above the bar (nothing when quiet)."""
        if self._tqdm is not None:
            self._tqdm.write(msg, file=self._tqdm.fp)

    def close(self) -> None:
        """Draws the final state and releases the line (idempotent)."""
        if self._tqdm is not None:
            self._tqdm.close()
            self._tqdm = None

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return f"{v:.4g}"
    return v


@contextmanager
def progress(
    total: int | float | None,
    *,
    desc: str | None = None,
    unit: str = "step",
    quiet: bool | None = None,
    file: IO[str] | None = None,
    **tqdm_kwargs: Any,
) -> Iterator[Bar]:
    """A :class:`Bar` that closes when the block ends.

    Args:
        total: the count at which the work is done (e.g. env steps); ``None`` if unknown.
        desc: a label shown before the bar.
        unit: what is counted (the rate reads ``<unit>/s``).
        quiet: ``True`` prints nothing, ``False`` always draws, ``None`` (default) is
            automatic (see :func:`is_quiet`).
        file: the stream (default ``sys.stderr``).
        **tqdm_kwargs: passed to ``tqdm`` (e.g. ``mininterval=``).
    """
    bar = Bar(total, desc=desc, unit=unit, quiet=quiet, file=file, **tqdm_kwargs)
    try:
        yield bar
    finally:
        bar.close()


class ProgressCallback:
    """A sampler callback that advances ``bar`` by each call's env steps, showing the
    call's mean episode return (``return=``) and, on calls that compiled, the compile
    seconds (``compile_s=``).

    Args:
        bar: a :class:`Bar` (from :func:`progress`).
        count: ``"env_steps"`` (default) or ``"agent_steps"``: what one unit is.
    """

    def __init__(self, bar: Bar, count: str = "env_steps") -> None:
        if count not in ("env_steps", "agent_steps"):
            raise ValueError(f"count must be 'env_steps' or 'agent_steps', got {count!r}")
        self.bar = bar
        self.count = count

    def on_sample_end(self, report: SampleReport) -> None:
        """Advances the bar by the call's env (or agent) steps and shows the call's mean
        episode return (a call that finished no episode keeps the value shown last) and, if
        the call compiled, its compile seconds."""
        m = report.metrics
        n = m.num_env_steps_sampled if self.count == "env_steps" else m.num_agent_steps_sampled
        postfix: dict[str, Any] = {"return": float(m.episode_return_mean)}
        if report.num_compiles:
            postfix["compile_s"] = report.compile_s
        self.bar.update(n, **postfix)
