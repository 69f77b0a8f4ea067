"""Running time: a clock that stops while the process does not run.

An idle client should be blamed only for time in which the server could have heard from it.
When the whole process stops (``SIGSTOP``, a paused VM, a long stop-the-world pause), the
monotonic clock keeps going, so every idle timer would expire at once on resume, for clients
whose next request sits unread in a socket buffer. :class:`RunningClock` tells the two apart:
it is *ticked* often (every ``max_gap_s / 10`` by a daemon heartbeat thread, see
:func:`process_clock`, and by whoever reads it for a deadline sweep), and a gap between two
ticks longer than ``max_gap_s`` means that no thread of the process ran: only ``max_gap_s``
of it counts, the rest is a *pause*. :meth:`RunningClock.now` is the monotonic time minus the
pauses detected, and it never runs more than ``max_gap_s`` ahead of the last tick (a pause
still unnoticed when it is read is not counted either).

Its values are seconds on the scale of :func:`time.monotonic` (equal to it until the first
pause), so one may compare them with each other only (deadlines, idle times), never mix them
with raw monotonic readings.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

__all__ = ["RunningClock", "process_clock"]

#: the default longest gap between ticks that still counts as running
DEFAULT_MAX_GAP_S = 1.0


class RunningClock:
    """Seconds of time the process was running (see the module docstring).

    Args:
        max_gap_s: the longest gap between two ticks that counts in full; the excess of a
            longer gap is a pause. The ticks must come more often than this while the
            process runs (the heartbeat of :func:`process_clock` ticks ten times as often).
        raw: the underlying monotonic clock (a fake one in tests).

    Thread-safe.

    Raises:
        ValueError: ``max_gap_s`` is not positive.
    """

    def __init__(
        self, max_gap_s: float = DEFAULT_MAX_GAP_S, raw: Callable[[], float] = time.monotonic
    ):
        if not max_gap_s > 0:
            raise ValueError(f"max_gap_s must be > 0, got {max_gap_s!r}")
        self.max_gap_s = float(max_gap_s)
        self._raw = raw
        self._lock = threading.Lock()
        self._last_raw = raw()  # the raw time of the last tick
        self._running = self._last_raw  # the running time of the last tick
        self._resumed_at = -float("inf")  # the running time when the last pause was seen
        #: the pauses detected so far, in seconds (only ever grows)
        self.paused_s = 0.0
        #: how many pauses were detected
        self.pauses = 0

    def tick(self) -> float:
        """Records that the process runs now; returns the pause detected since the previous
        tick (0.0 when none)."""
        with self._lock:
            t = self._raw()
            if t < self._last_raw:  # not monotonic after all: wait until it catches up
                return 0.0
            gap = t - self._last_raw
            counted = min(gap, self.max_gap_s)
            self._last_raw, self._running = t, self._running + counted
            pause = gap - counted
            if pause > 0:
                self.paused_s += pause
                self.pauses += 1
                self._resumed_at = self._running
            return pause

    def now(self) -> float:
        """The running time now: monotonic time minus detected pauses, at most
        ``max_gap_s`` past the last tick (non-decreasing)."""
        with self._lock:
            ahead = min(max(0.0, self._raw() - self._last_raw), self.max_gap_s)
            return self._running + ahead

    def steady_for(self) -> float:
        """Running seconds since the last detected pause ended (``inf`` before any)."""
        return self.now() - self._resumed_at


_HEARTBEAT_PER_GAP = 10  # heartbeat ticks per max_gap_s
_process: tuple[int, RunningClock] | None = None
_process_lock = threading.Lock()


def process_clock() -> RunningClock:
    """This process's shared :class:`RunningClock` (``max_gap_s`` 1 s), ticked by a daemon
    heartbeat thread ten times a second, started on first use (again in a forked child)."""
    global _process
    with _process_lock:
        pid = os.getpid()
        if _process is None or _process[0] != pid:
            clock = RunningClock()
            _process = (pid, clock)
            beat = clock.max_gap_s / _HEARTBEAT_PER_GAP
            threading.Thread(
                target=_heartbeat, args=(clock, beat), name="RunningClock-heartbeat", daemon=True
            ).start()
        return _process[1]


def _heartbeat(clock: RunningClock, interval: float) -> None:
    while True:
        time.sleep(interval)
        clock.tick()
