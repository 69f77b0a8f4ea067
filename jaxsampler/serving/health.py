"""Liveness of the sampler behind a :class:`~jaxsampler.serving.server.PolicyServer`.

The server answers ``get_action`` only when a sampler polls it. :class:`SamplerHealth` keeps
what the server knows about that sampler: when it last polled (monotonic clock; a sampler
blocked inside ``poll`` counts as polling), and whether somebody reported it dead
(:meth:`SamplerHealth.fail`). From these it derives one of three states:

- ``"ok"``: the sampler is polling, or last did so less than ``timeout_s`` ago;
- ``"stalled"``: no poll for ``timeout_s`` or longer (measured from the server's start
  before the first poll). A stall ends by itself when polling resumes;
- ``"failed"``: :meth:`SamplerHealth.fail` was called. A failure is final.

The server turns the last two into 503 answers (error name ``ServerUnavailableError``, see
:mod:`~jaxsampler.serving.protocol`) that carry :meth:`SamplerHealth.problem`'s sentence,
and ``GET /health`` reports :meth:`SamplerHealth.report`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["SamplerHealth", "describe_failure"]


def describe_failure(failure: BaseException | str) -> str:
    """The reason text of a failure: an exception's ``repr`` (its class and message), or
    the string itself."""
    if isinstance(failure, BaseException):
        return repr(failure)
    if isinstance(failure, str) and failure:
        return failure
    raise TypeError(f"failure must be an exception or a non-empty str, got {failure!r}")


class SamplerHealth:
    """What the server knows about its sampler (thread-safe; see the module docstring).

    Args:
        timeout_s: how long without a poll makes the sampler stalled; ``None``: never.
        clock: the monotonic clock (seconds) used for every time measurement.

    Raises:
        ValueError: ``timeout_s`` is not positive.
    """

    def __init__(self, timeout_s: float | None, clock: Callable[[], float] = time.monotonic):
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"sampler_timeout_s must be > 0 or None, got {timeout_s!r}")
        self.timeout_s = None if timeout_s is None else float(timeout_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._started = clock()
        self._last_poll: float | None = None  # when the last poll began or ended
        self._in_poll = 0  # polls under way (a sampler blocked in poll is alive)
        self._polls = 0
        #: why the sampler failed (``None``: it did not)
        self.failure: str | None = None

    def poll_started(self) -> None:
        """The sampler entered ``poll``."""
        with self._lock:
            self._in_poll += 1
            self._polls += 1
            self._last_poll = self._clock()

    def poll_ended(self) -> None:
        """The sampler left ``poll`` (normally or not)."""
        with self._lock:
            self._in_poll -= 1
            self._last_poll = self._clock()

    def fail(self, failure: BaseException | str) -> bool:
        """Records that the sampler died; returns whether this was the first report (later
        reports keep the first reason)."""
        reason = describe_failure(failure)
        with self._lock:
            if self.failure is not None:
                return False
            self.failure = reason
            return True

    def since_last_poll(self, now: float | None = None) -> float:
        """Seconds since the sampler last polled (since the server started before the first
        poll; 0 while a poll is under way)."""
        now = self._clock() if now is None else now
        if self._in_poll:
            return 0.0
        last = self._started if self._last_poll is None else self._last_poll
        return max(0.0, now - last)

    def status(self, now: float | None = None) -> str:
        """``"ok"``, ``"stalled"`` or ``"failed"`` (see the module docstring)."""
        if self.failure is not None:
            return "failed"
        if self.timeout_s is not None and self.since_last_poll(now) >= self.timeout_s:
            return "stalled"
        return "ok"

    def problem(self, now: float | None = None) -> str | None:
        """Why the sampler cannot serve now, as a sentence for a 503 answer; ``None`` when it
        can."""
        if self.failure is not None:
            return f"the sampler failed: {self.failure}"
        if self.timeout_s is None:
            return None
        idle = self.since_last_poll(now)
        if idle < self.timeout_s:
            return None
        if self._last_poll is None:
            return (
                f"the sampler has not polled since the server started {idle:.1f} s ago "
                f"(sampler_timeout_s={self.timeout_s:g})"
            )
        return f"the sampler has not polled for {idle:.1f} s (sampler_timeout_s={self.timeout_s:g})"

    def report(self, now: float | None = None) -> dict[str, Any]:
        """The ``GET /health`` body: ``status``, ``since_last_poll_s``, ``reason`` (``None``
        when ok), ``sampler_timeout_s``, ``polls`` (how many polls began) and ``polling``
        (whether one is under way)."""
        now = self._clock() if now is None else now
        return {
            "status": self.status(now),
            "since_last_poll_s": round(self.since_last_poll(now), 3),
            "reason": self.problem(now),
            "sampler_timeout_s": self.timeout_s,
            "polls": self._polls,
            "polling": self._in_poll > 0,
        }
