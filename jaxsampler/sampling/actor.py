"""Collection that overlaps the learner: :class:`AsyncActor`, the actor of an actor/learner
pipeline.

A synchronous loop samples, then learns, then samples again: each iteration costs
``sample + learn``. An :class:`AsyncActor` calls the sample function in a background
thread, so batch ``k + 1`` is sampled while the learner updates on batch ``k``, and an
iteration costs about ``max(sample, learn)``:

.. code-block:: python

    actor = js.sampling.AsyncActor(lambda p: sampler.sample_batch(p), params)
    with actor:
        for _ in range(iterations):
            sample = actor.get()                  # waits only if the actor is behind
            params = learn(params, sample.data)   # sample.version: the params it used
            actor.update(params)                  # the actor's next call uses these

Overlap needs both sides to leave the GIL: a jitted update and a jitted rollout run in
XLA without it, and a host sampler's env steps and numpy work release it for much of their
time (``benchmarks/async_overlap.py`` measures how much overlap each setting gets).

**Where it runs.** With ``actor_device``, the params the actor uses are copied there at
each :meth:`AsyncActor.update` (the copy runs asynchronously, while the learner goes
on); with ``learner_device``, each sample is copied there before it is queued. With a
sampler placed on its own device (``Sampler(..., devices=[actor_device])``) and the
learner's jit on another, actor and learner run side by side on separate devices (the
"Sebulba" layout); with host envs they share the host's cores.

**Staleness.** Each sample carries the version of the params it was sampled with (0 for
the first params, then one more per :meth:`~AsyncActor.update`). The actor reads the
newest params at the start of each call, and runs at most ``max_queue`` samples ahead
of the learner, so for a learner that updates once per sample, a sample is at most
``max_queue + 1`` versions old when the learner gets it; off-policy corrections
(V-trace, :mod:`jaxsampler.offpolicy`) use the sample's own action log-probabilities.

**Back-pressure and shutdown.** The queue holds ``max_queue`` samples: a full queue
blocks the actor (no unbounded memory). :meth:`~AsyncActor.close` (or leaving the
``with`` block) stops the actor after its current call and joins its thread. An exception
in the sample function stops the actor, and the learner's next :meth:`~AsyncActor.get`
raises it (the actor's traceback attached); a learner never waits on a dead actor.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import jax

__all__ = ["ActorSample", "AsyncActor"]

#: how often a blocked actor or learner looks whether the other side stopped
_TICK_S = 0.05


@dataclasses.dataclass(frozen=True)
class ActorSample:
    """One output of the actor.

    Attributes:
        data: what the sample function returned (on ``learner_device`` when given).
        version: the version of the params it was sampled with (see
            :meth:`AsyncActor.update`).
        index: its position among the actor's outputs (0, 1, 2, ...).
        sample_s: seconds the sample function took.
    """

    data: Any
    version: int
    index: int
    sample_s: float


class _Failed:
    """The queue's last item after the sample function raised."""

    def __init__(self, error: BaseException):
        self.error = error


class AsyncActor:
    """Runs ``sample(params)`` over and over in a background thread, with the newest params,
    and hands its outputs to the learner through a bounded queue (see the module
    docstring). Starts at once; use as a context manager or call :meth:`close`.

    Args:
        sample: the sample function, called with the params (e.g.
            ``lambda p: sampler.sample_batch(p)``); it runs only in the actor's thread, so a
            sampler it uses must not be used elsewhere meanwhile.
        params: the first params (version 0).
        max_queue: samples the actor may hold ready ahead of the learner (>= 1).
        actor_device: a device to copy the params to before the actor uses them
            (``None``: as given).
        learner_device: a device to copy each sample to before it is queued (``None``:
            where the sample function left it).
        name: the thread's name.

    Attributes:
        stats: counters: ``samples`` produced, ``actor_blocked_s`` (time the actor waited
            on a full queue), ``learner_waited_s`` (time :meth:`get` waited for a sample).

    Raises:
        ValueError: ``max_queue`` < 1. TypeError: ``sample`` is not callable.
    """

    def __init__(
        self,
        sample: Callable[[Any], Any],
        params: Any,
        *,
        max_queue: int = 1,
        actor_device: Any = None,
        learner_device: Any = None,
        name: str = "jaxsampler-actor",
    ):
        if not callable(sample):
            raise TypeError(f"sample must be callable, got {type(sample).__name__}")
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
            raise ValueError(f"max_queue must be an int >= 1, got {max_queue!r}")
        self._sample = sample
        self._actor_device, self._learner_device = actor_device, learner_device
        self._lock = threading.Lock()
        self._params, self._version = self._place(params), 0
        self._queue: queue.Queue[ActorSample | _Failed] = queue.Queue(max_queue)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self.stats = {"samples": 0, "actor_blocked_s": 0.0, "learner_waited_s": 0.0}
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # -- the learner's side ----------------------------------------------------------------

    @property
    def version(self) -> int:
        """The version of the newest params (0, then one more per :meth:`update`)."""
        return self._version

    @property
    def alive(self) -> bool:
        """Whether the actor thread still runs."""
        return self._thread.is_alive()

    def update(self, params: Any) -> int:
        """Gives the actor new params (copied to ``actor_device`` first); its next sample
        call uses them. Returns their version.

        Raises:
            RuntimeError: the actor was closed.
        """
        if self._stop.is_set():
            raise RuntimeError("update() on a closed AsyncActor")
        placed = self._place(params)
        with self._lock:
            self._params, self._version = placed, self._version + 1
            return self._version

    def get(self, timeout: float | None = None) -> ActorSample:
        """The next sample, in order; waits for it when the actor is behind.

        Raises:
            BaseException: what the sample function raised (the actor stopped then; every
                later call raises it again).
            TimeoutError: no sample within ``timeout`` seconds.
            RuntimeError: the actor was closed.
        """
        end = None if timeout is None else time.monotonic() + timeout
        t0 = time.perf_counter()
        try:
            while True:
                if self._stop.is_set():
                    raise RuntimeError("get() on a closed AsyncActor")
                left = None if end is None else end - time.monotonic()
                item = self._next(_TICK_S if left is None else min(_TICK_S, left))
                if isinstance(item, _Failed):
                    raise item.error
                if item is not None:
                    return item
                if self._error is not None:  # its failure item was taken already
                    raise self._error
                if left is not None and left <= 0:
                    raise TimeoutError(
                        f"no sample from the actor within {timeout} s (it is "
                        + ("running" if self.alive else "not running")
                        + ")"
                    )
        finally:
            self.stats["learner_waited_s"] += time.perf_counter() - t0

    def _next(self, wait: float) -> ActorSample | _Failed | None:
        """The next queued item, waiting up to ``wait`` seconds (none: only what is there)."""
        try:
            return self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
        except queue.Empty:
            return None

    def __iter__(self) -> Iterator[ActorSample]:
        """:meth:`get`, over and over."""
        while True:
            yield self.get()

    def close(self, timeout: float = 60.0) -> None:
        """Stops the actor after its current sample call and joins its thread (up to
        ``timeout`` seconds: a call still running then is left to finish in its daemon
        thread, with a ``RuntimeWarning``). Queued samples are dropped. Idempotent."""
        self._stop.set()
        while True:  # make room, so that a blocked put sees the stop
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout)
        if self._thread.is_alive():
            warnings.warn(
                f"the actor thread is still inside a sample call after {timeout} s; it stops "
                "when that call returns",
                RuntimeWarning,
                stacklevel=2,
            )

    def __enter__(self) -> AsyncActor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the actor's side ------------------------------------------------------------------

    def _place(self, params: Any) -> Any:
        if self._actor_device is None:
            return params
        return jax.device_put(params, self._actor_device)

    def _run(self) -> None:
        index = 0
        while not self._stop.is_set():
            with self._lock:
                params, version = self._params, self._version
            t0 = time.perf_counter()
            try:
                data = self._sample(params)
                if self._learner_device is not None:
                    data = jax.device_put(data, self._learner_device)
            except BaseException as e:  # the learner re-raises it (see get)
                self._error = e
                self._put(_Failed(e))
                return
            item = ActorSample(data, version, index, time.perf_counter() - t0)
            self.stats["samples"] = index = index + 1  # produced (maybe not yet queued)
            self._put(item)

    def _put(self, item: ActorSample | _Failed) -> None:
        """Queues ``item``, waiting while the queue is full, unless the actor is stopped."""
        t0 = time.perf_counter()
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_TICK_S)
                break
            except queue.Full:
                continue
        self.stats["actor_blocked_s"] += time.perf_counter() - t0
