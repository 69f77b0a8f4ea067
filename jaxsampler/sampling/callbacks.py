"""What a sampler reports after each call, and the callback protocol that receives it.

Every sampler calls ``callback.on_sample_end(report)`` for each of its callbacks at the
end of each ``sample()`` / ``sample_batch()`` call, on the host, after the call's
episodes or batch are built (so outside any jitted code: a logger may block, write
files, talk to a server). The report is a :class:`SampleReport`: the call's
:class:`~jaxsampler.sampling.metrics.SamplerMetrics`, the sampler's running totals, wall
times (rollout and conversion) and the XLA compilation the call triggered. Loggers
(:mod:`jaxsampler.integrations.loggers`: JSON lines, TensorBoard, W&B) implement the
protocol; so can
any object with an ``on_sample_end`` method.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "CompileClock",
    "SampleReport",
    "SamplerCallback",
    "SamplerTotals",
    "check_callbacks",
    "compile_clock",
]


@dataclasses.dataclass
class SamplerTotals:
    """A sampler's running totals since it was built (this process's envs): saved and
    restored with the sampler, so a resumed run's logged step axis continues."""

    calls: int = 0
    env_steps: int = 0
    agent_steps: int = 0
    episodes: int = 0
    rollout_calls: int = 0


@dataclasses.dataclass(frozen=True)
class SampleReport:
    """One ``sample()`` / ``sample_batch()`` call, as a sampler reports it to its callbacks.

    Attributes:
        metrics: the call's :class:`~jaxsampler.sampling.metrics.SamplerMetrics`.
        totals: the sampler's :class:`SamplerTotals` after the call (a copy).
        rollout_s: wall time of the env stepping (device rollouts and host copy, or the
            host env's polls and policy calls).
        convert_s: wall time of building the episodes or the batch.
        compile_s: seconds XLA spent compiling during the call (in this process; 0 in
            steady state).
        num_compiles: XLA compilations during the call.
        kind: ``"sample"`` or ``"sample_batch"``.
    """

    metrics: Any
    totals: SamplerTotals
    rollout_s: float
    convert_s: float
    compile_s: float = 0.0
    num_compiles: int = 0
    kind: str = "sample"

    @property
    def step(self) -> int:
        """The x axis loggers use: env steps sampled so far (``totals.env_steps``)."""
        return self.totals.env_steps

    @property
    def env_steps_per_s(self) -> float:
        """The call's env steps per second of wall time (rollout plus conversion)."""
        wall = self.rollout_s + self.convert_s
        return self.metrics.num_env_steps_sampled / wall if wall > 0 else math.nan

    def scalars(self, prefix: str = "sampler/") -> dict[str, float]:
        """The report as flat ``name -> number`` scalars (what loggers write); NaN
        episode statistics (no episode finished in the call) are left out."""
        out: dict[str, float] = {}
        for k, v in self.metrics.as_dict().items():
            if isinstance(v, float) and math.isnan(v):
                continue
            out[prefix + k] = float(v)
        for k, v in dataclasses.asdict(self.totals).items():
            out[f"{prefix}total_{k}"] = float(v)
        out[prefix + "env_steps_per_s"] = self.env_steps_per_s
        out[prefix + "rollout_s"] = self.rollout_s
        out[prefix + "convert_s"] = self.convert_s
        out[prefix + "compile_s"] = self.compile_s
        out[prefix + "num_compiles"] = float(self.num_compiles)
        return {k: v for k, v in out.items() if not math.isnan(v)}


@runtime_checkable
class SamplerCallback(Protocol):
    """Anything with ``on_sample_end(report)``: called after every sampler call."""

    def on_sample_end(self, report: SampleReport) -> None:
        """Receives the report of the call that just ended (on the host, outside jit)."""


class CompileClock:
    """Process-wide count and seconds of XLA compilations (from ``jax.monitoring``'s
    backend-compile events), read before and after a call to attribute compilation."""

    _EVENT = "/jax/core/compile/backend_compile_duration"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds = 0.0
        self.count = 0
        self._installed = False

    def install(self) -> None:
        """Registers the listener (once)."""
        with self._lock:
            if self._installed:
                return
            import jax.monitoring

            jax.monitoring.register_event_duration_secs_listener(self._listen)
            self._installed = True

    def _listen(self, event: str, duration_secs: float, **_: str | int) -> None:
        if event == self._EVENT:
            with self._lock:
                self.seconds += float(duration_secs)
                self.count += 1

    def read(self) -> tuple[int, float]:
        """``(count, seconds)`` so far."""
        self.install()
        with self._lock:
            return self.count, self.seconds


#: the process's compile clock (samplers read it around each call)
compile_clock = CompileClock()


def check_callbacks(callbacks: Any) -> list[SamplerCallback]:
    """Validates ``callbacks=`` (``None``, one callback or a sequence of them)."""
    if callbacks is None:
        return []
    if isinstance(callbacks, SamplerCallback):
        return [callbacks]
    if not isinstance(callbacks, (list, tuple)):
        raise TypeError(
            "callbacks= takes an object with on_sample_end(report) or a list of them, got "
            f"{type(callbacks).__name__}"
        )
    for cb in callbacks:
        if not isinstance(cb, SamplerCallback):
            raise TypeError(
                f"callback {cb!r} has no on_sample_end(report) method (see "
                "jaxsampler.sampling.callbacks.SamplerCallback)"
            )
    return list(callbacks)
