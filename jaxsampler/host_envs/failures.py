"""What host envs do when one of their sub-envs fails or hangs (RLlib's
``restart_failed_sub_environments``, made configurable).

A *failure* of a sub-env is an exception raised by its ``reset`` / ``step`` (or by its
factory while it is rebuilt), a call that does not return within ``step_timeout_s``,
or, with ``check_observations``, an observation that does not fit the observation space
(wrong shape or dtype kind, NaN, an infinity where the space is bounded). Adapter checks
of the *structure* of what an env returns (unknown agent ids, a malformed step tuple)
are not failures: they are bugs that would repeat at every step, and raise as before.

What happens then is :attr:`FailureHandling.on_env_error`:

* ``"raise"`` (default, as RLlib's ``restart_failed_sub_environments=False``): a
  :class:`HostEnvError` naming the sub-env, the method and the original error (chained
  as ``__cause__``). Ending episodes early and rebuilding envs changes the data, so it
  is opt-in: by default a failing env is treated as a bug to fix;
* ``"restart"``: the sub-env's running episode ends *truncated* (see
  :func:`truncated_end`), the env object is closed (errors ignored) and rebuilt from its
  factory, and reset with a fresh seed (:func:`restart_seed`) at the next poll (a failed
  reset is retried on a rebuilt env within the same poll). At most
  ``max_env_restarts`` failures of one sub-env in a row, then :class:`HostEnvError`.
  Env *objects* cannot be rebuilt: asking for ``"restart"`` with them is refused at
  construction (a reset alone would reuse an object in an unknown, maybe hung, state);
* ``"drop"``: the episode ends the same way and the sub-env is never stepped again; its
  ``env_id`` stays reserved (``num_envs`` does not shrink, ids of the others do not
  move). When every sub-env is dropped, the env reports ``closed`` (the sampler's call
  returns what it has) and its next poll raises :class:`HostEnvError`.

Nothing of the other sub-envs is lost or changed: their steps of the same poll are
delivered as usual.

A call that timed out cannot be stopped: Python cannot kill a thread. The thread is
abandoned (a daemon thread, so it never blocks interpreter exit), the env object it
holds is never touched again, and at most ``max_abandoned_threads`` such threads may be
alive at once (then :class:`HostEnvError`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import queue
import threading
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from jaxsampler.constants import ALL_AGENTS

__all__ = [
    "ENV_ERROR_KEY",
    "EnvFailureStats",
    "FailureHandling",
    "HostEnvError",
    "OnEnvError",
    "Outcome",
    "SubEnvFailures",
    "WHOLE_ENV",
    "Worker",
    "close_quietly",
    "describe_error",
    "restart_seed",
    "run_calls",
    "truncated_end",
]

#: What a host env does when a sub-env fails.
OnEnvError = Literal["raise", "restart", "drop"]

#: The info key of a failed episode's last step: ``"<ExceptionType>: <message>"``.
ENV_ERROR_KEY = "env_error"


class HostEnvError(RuntimeError):
    """A sub-env of a host env failed and the env was told to raise (or gave up).

    Attributes:
        env_index: the failed sub-env (``None``: the whole env, e.g. a vector env).
        method: what failed: ``"reset"``, ``"step"``, ``"make"`` (the factory),
            ``"close"``, or ``"poll"`` (nothing left to step).
    """

    def __init__(self, message: str, *, env_index: int | None = None, method: str = "step"):
        super().__init__(message)
        self.env_index = env_index
        self.method = method


def describe_error(exc: BaseException) -> str:
    """``"RuntimeError: boom"``: the string recorded in a failed step's info."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def restart_seed(seed: int | None, env_index: int, restart: int) -> int | None:
    """The reset seed of sub-env ``env_index`` after its ``restart``-th restart.

    Deterministic for a given ``seed`` (runs repeat bit for bit) and distinct from the
    first seeds ``seed + i`` in practice (drawn from a ``numpy.random.SeedSequence``);
    ``None`` stays ``None`` (unseeded runs stay unseeded). ``env_index=-1`` stands for
    a whole vector env.
    """
    if seed is None:
        return None
    entropy = [int(seed) % 2**63, int(env_index) + 1, int(restart)]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint32)[0])


def truncated_end(last_obs: dict[Any, Any], error: str) -> tuple[dict, dict, dict, dict, dict]:
    """The step that ends a failed sub-env's running episode: ``(obs, rewards,
    terminateds, truncateds, infos)`` for one ``env_id``.

    The env produced no next observation, so every agent of the episode gets its *last
    good* observation again as its final one, reward ``0.0`` and ``truncated=True``
    (``"__all__"`` too: the episode may be bootstrapped, nothing terminated it), and
    ``info[ENV_ERROR_KEY] = error``. The action sent for that observation was never
    carried out (or its effect is unknown): learners that must not see this placeholder
    transition drop the rows whose info has :data:`ENV_ERROR_KEY`.
    """
    agents = list(last_obs)
    return (
        dict(last_obs),
        dict.fromkeys(agents, 0.0),
        {**dict.fromkeys(agents, False), ALL_AGENTS: False},
        {**dict.fromkeys(agents, True), ALL_AGENTS: True},
        {a: {ENV_ERROR_KEY: error} for a in agents},
    )


@dataclasses.dataclass(frozen=True)
class FailureHandling:
    """The failure options of a host env (validated once, at construction).

    Attributes:
        on_env_error: ``"raise"``, ``"restart"`` or ``"drop"`` (module docstring).
        max_env_restarts: failures of one sub-env *in a row* (no successful step between
            them) that are tolerated; the next one raises :class:`HostEnvError`. A flaky
            env that fails now and then keeps running; a permanently broken one (fails at
            reset or at its first step) stops the sampler instead of looping.
        step_timeout_s: a ``reset`` / ``step`` (or rebuild) that takes longer fails with
            ``TimeoutError("step timed out after X s")``; ``None``: wait forever.
        max_abandoned_threads: timed-out calls whose threads may still be alive at once.
        check_observations: observations that do not fit the observation space are
            failures (otherwise they pass to the sampler, whose shape check raises a
            ``ValueError`` and which records NaNs as they come).
    """

    on_env_error: OnEnvError = "raise"
    max_env_restarts: int = 3
    step_timeout_s: float | None = None
    max_abandoned_threads: int = 8
    check_observations: bool = False

    def __post_init__(self) -> None:
        if self.on_env_error not in ("raise", "restart", "drop"):
            raise ValueError(
                f"on_env_error must be 'raise', 'restart' or 'drop', got {self.on_env_error!r}"
            )
        for name in ("max_env_restarts", "max_abandoned_threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        t = self.step_timeout_s
        if t is not None and (
            isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < float("inf")
        ):
            raise ValueError(f"step_timeout_s must be a finite number > 0 or None, got {t!r}")


@dataclasses.dataclass
class EnvFailureStats:
    """Counts of a host env's sub-env failures (its ``failure_stats`` attribute).

    Attributes:
        failures: failures of any kind (exceptions, timeouts, bad observations).
        timeouts: the failures that were timeouts.
        restarts: sub-envs rebuilt from their factory (attempts, failed ones included).
        dropped: ``env_id`` values removed for good (``on_env_error="drop"``).
        abandoned: hung calls whose threads were abandoned.
        by_env: ``env_id`` -> failures of that sub-env (``-1``: the whole vector env).
        last_error: the most recent failure, ``"env <i> <method>: <Type>: <message>"``.
    """

    failures: int = 0
    timeouts: int = 0
    restarts: int = 0
    dropped: list[int] = dataclasses.field(default_factory=list)
    abandoned: int = 0
    by_env: dict[int, int] = dataclasses.field(default_factory=dict)
    last_error: str | None = None

    def record(self, env_index: int, method: str, exc: BaseException) -> None:
        """Counts one failure."""
        self.failures += 1
        self.timeouts += isinstance(exc, TimeoutError)
        self.by_env[env_index] = self.by_env.get(env_index, 0) + 1
        self.last_error = f"env {env_index} {method}: {describe_error(exc)}"


class Worker:
    """A daemon thread that runs the calls of one env object, each with a time limit.

    One thread per env object: an env never sees two threads (some simulators are
    thread-affine), and a hung call blocks only its own worker, which is then
    :meth:`abandon`-ed: it exits by itself if the call ever returns, and it never runs
    another call. Daemon threads never block interpreter exit.
    """

    def __init__(self, name: str):
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            item = self._inbox.get()
            if item is None:
                return
            fn, fut = item
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as exc:  # handed to the caller, who decides
                    fut.set_exception(exc)

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Queues ``fn()``; its future holds the result or the exception."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put((fn, fut))
        return fut

    def stop(self) -> None:
        """Lets the thread exit after its current call (if any)."""
        self._inbox.put(None)

    abandon = stop


#: One call's outcome: ``(result, error, hung)``; ``error`` is ``None`` on success.
Outcome = tuple[Any, "BaseException | None", bool]


def run_calls(
    calls: dict[int, Callable[[], Any]],
    *,
    pool: concurrent.futures.Executor | None = None,
    worker: Callable[[int], Worker] | None = None,
    timeout_s: float | None = None,
    what: dict[int, str] | None = None,
) -> dict[int, Outcome]:
    """Runs one call per sub-env and returns each outcome instead of raising.

    Args:
        calls: ``env_id`` -> the call (touching only that sub-env's env object).
        pool: run the calls on this executor (no time limit); ``None``: one after the
            other in the calling thread.
        worker: with ``timeout_s``: ``env_id`` -> the :class:`Worker` that runs its calls
            (all calls start at once, so one deadline serves them all).
        timeout_s: a call not done after this many seconds is *hung*: its outcome is a
            ``TimeoutError("<what> timed out after X s")`` with ``hung=True``; the caller
            must abandon its worker.
        what: ``env_id`` -> the method's name for the timeout message (default "step").

    ``Exception`` subclasses become outcomes; ``KeyboardInterrupt`` and the like propagate.
    """
    out: dict[int, Outcome] = {}
    if timeout_s is None or worker is None:
        if pool is None:
            for i, call in calls.items():
                try:
                    out[i] = (call(), None, False)
                except Exception as exc:
                    out[i] = (None, exc, False)
            return out
        futures = {i: pool.submit(call) for i, call in calls.items()}
        concurrent.futures.wait(list(futures.values()))
    else:
        futures = {i: worker(i).submit(call) for i, call in calls.items()}
        concurrent.futures.wait(list(futures.values()), timeout=timeout_s)
    for i, fut in futures.items():
        if not fut.done():
            name = (what or {}).get(i, "step")
            out[i] = (None, TimeoutError(f"{name} timed out after {timeout_s:g} s"), True)
            continue
        error = fut.exception()
        if error is not None and not isinstance(error, Exception):
            raise error
        out[i] = (None, error, False) if error is not None else (fut.result(), None, False)
    return out


def close_quietly(env: Any, **kwargs: Any) -> None:
    """``env.close(**kwargs)`` if it has one; any error is ignored (the env failed
    already)."""
    close = getattr(env, "close", None)
    if close is None:
        return
    with contextlib.suppress(Exception):  # a failed env's close may fail too: nothing to do
        close(**kwargs)


#: The ``env_index`` under which a whole (vector) env's failures are counted.
WHOLE_ENV = -1


class SubEnvFailures:
    """One host env's failure bookkeeping: counts, limits, worker threads.

    The adapters call :meth:`fail` for every failure of sub-env ``i`` (``WHOLE_ENV``:
    the whole env); it raises :class:`HostEnvError` when told to (``"raise"``) or when a
    limit is exceeded, and otherwise returns: the caller then restarts or drops.

    Args:
        handling: the validated options.
    """

    def __init__(self, handling: FailureHandling):
        self.handling = handling
        self.stats = EnvFailureStats()
        #: why the env cannot go on (a call is still pending inside it), else ``None``
        self.broken: str | None = None
        self._in_a_row: dict[int, int] = {}
        self._restarts: dict[int, int] = {}
        self._workers: dict[int, Worker] = {}
        self._abandoned: list[threading.Thread] = []

    @staticmethod
    def name(i: int) -> str:
        """How messages name sub-env ``i`` (or the whole vector env)."""
        return "the vector env" if i == WHOLE_ENV else f"sub-env {i}"

    def good_step(self, i: int) -> None:
        """Sub-env ``i`` stepped fine: its failures in a row start again from 0."""
        self._in_a_row[i] = 0

    def next_restart_seed(self, seed: int | None, i: int) -> int | None:
        """Counts a restart of sub-env ``i``; its reset seed (:func:`restart_seed`)."""
        n = self._restarts[i] = self._restarts.get(i, 0) + 1
        self.stats.restarts += 1
        return restart_seed(seed, i, n)

    def worker(self, i: int) -> Worker:
        """Sub-env ``i``'s worker thread (started on first use)."""
        w = self._workers.get(i)
        if w is None:
            w = self._workers[i] = Worker(f"jaxsampler-env-{i}")
        return w

    def abandoned_threads(self) -> list[threading.Thread]:
        """The abandoned (hung) worker threads still alive."""
        self._abandoned = [t for t in self._abandoned if t.is_alive()]
        return list(self._abandoned)

    def fail(self, i: int, method: str, exc: BaseException, hung: bool, pending: bool) -> None:
        """Counts a failure of ``i``'s ``method``; abandons its worker if ``hung``.

        Args:
            pending: the failed call may still be running inside the env object (a
                timeout), so in ``"raise"`` mode the env must not be used again.

        Raises:
            HostEnvError: ``on_env_error="raise"``; more than ``max_abandoned_threads``
                hung threads alive; more than ``max_env_restarts`` failures in a row
                (``"restart"``). The original error is chained.
        """
        fh, who = self.handling, self.name(i)
        self.stats.record(i, method, exc)
        n = self._in_a_row[i] = self._in_a_row.get(i, 0) + 1
        index = None if i == WHOLE_ENV else i
        if hung:
            w = self._workers.pop(i, None)
            if w is not None:
                w.abandon()
                self._abandoned.append(w.thread)
                self.stats.abandoned += 1
        if fh.on_env_error == "raise":
            if hung or pending:
                self.broken = (
                    f"{who} timed out in {method}() (on_env_error='raise') and cannot be used "
                    "again; close this env"
                )
            raise HostEnvError(
                f"{who} failed in {method}(): {describe_error(exc)}", env_index=index, method=method
            ) from exc
        alive = len(self.abandoned_threads())
        if alive > fh.max_abandoned_threads:
            raise HostEnvError(
                f"{alive} hung env calls are still running on abandoned threads "
                f"(max_abandoned_threads={fh.max_abandoned_threads}); the last one: {who} "
                f"{method}()",
                env_index=index,
                method=method,
            ) from exc
        if fh.on_env_error == "restart" and n > fh.max_env_restarts:
            raise HostEnvError(
                f"{who} failed {n} times in a row without a good step "
                f"(max_env_restarts={fh.max_env_restarts}); the last failure, in {method}(): "
                f"{describe_error(exc)}",
                env_index=index,
                method=method,
            ) from exc
        if fh.on_env_error == "drop":
            self.stats.dropped.append(i)

    def stop(self) -> None:
        """Lets every (not abandoned) worker thread exit."""
        for w in self._workers.values():
            w.stop()
        self._workers.clear()
