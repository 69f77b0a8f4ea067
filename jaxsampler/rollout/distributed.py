"""Many processes as one sampler: JAX's own multi-controller runtime (``jax.distributed``).

Each process runs the same program. After :func:`initialize`, ``jax.devices()`` lists every
process's devices, a mesh over them (:func:`jaxsampler.rollout.placement.env_mesh`) spans all
processes, and a rollout on that mesh steps each process's envs on its own devices, with
reductions over envs as cross-process collectives. On CPU the collectives go through gloo
(TCP), so tests and a laptop run several processes on 127.0.0.1.

``python -m jaxsampler.cli.launch -n 2 script.py`` starts the processes with the variables
below set; ``initialize()`` without arguments reads them.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from typing import Any

import jax
import numpy as np

__all__ = [
    "DEFAULT_HEARTBEAT_TIMEOUT_S",
    "DEFAULT_TIMEOUT_S",
    "ENV_COORDINATOR",
    "ENV_HEARTBEAT_TIMEOUT",
    "ENV_NUM_PROCESSES",
    "ENV_PROCESS_ID",
    "ENV_TIMEOUT",
    "initialize",
    "is_initialized",
    "process_allgather",
    "process_sum",
]

#: ``host:port`` of process 0's coordinator.
ENV_COORDINATOR = "JAXSAMPLER_COORDINATOR"
#: How many processes take part.
ENV_NUM_PROCESSES = "JAXSAMPLER_NUM_PROCESSES"
#: This process's index, ``0 .. n-1``.
ENV_PROCESS_ID = "JAXSAMPLER_PROCESS_ID"
#: Seconds to wait for the others to join (``timeout_s`` of :func:`initialize`).
ENV_TIMEOUT = "JAXSAMPLER_TIMEOUT"
#: Seconds without a heartbeat after which a process counts as dead (``heartbeat_timeout_s``).
ENV_HEARTBEAT_TIMEOUT = "JAXSAMPLER_HEARTBEAT_TIMEOUT"

#: Default of ``timeout_s``.
DEFAULT_TIMEOUT_S = 60.0
#: Default of ``heartbeat_timeout_s`` (JAX's own default is 100 s).
DEFAULT_HEARTBEAT_TIMEOUT_S = 10.0
# JAX aborts the process itself when its own connect deadline passes; ours comes first so the
# caller gets a TimeoutError it can read.
_JAX_DEADLINE_MARGIN_S = 60
#: Seconds a process whose collective failed because a peer vanished waits before it exits, so
#: that the peer which caused it (already exiting: its connections closed) ends first and a
#: launcher watching exit order reports the peer's status rather than this consequence.
PEER_GONE_EXIT_DELAY_S = 2.0

_initialized = False
_joined_with: tuple[str, int, int] | None = None
_failed_with: str | None = None
_exit_requested: Any = None


def is_initialized() -> bool:
    """Whether :func:`initialize` joined this process to others (more than one process)."""
    return _initialized


def _env_number(name: str, kind: type, env: Any) -> Any:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(
            f"{name}={raw!r} is not a{'n int' if kind is int else ' number'}"
        ) from None


def _check_address(address: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(
            f"coordinator_address={address!r} is not 'host:port' (e.g. '127.0.0.1:12345', "
            "process 0's address and a free port)"
        )


def _check_seconds(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
    return float(value)


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    timeout_s: float | None = None,
    heartbeat_timeout_s: float | None = None,
    fail_fast: bool = True,
) -> None:
    """Joins this process to the others (``jax.distributed.initialize``), CPU collectives
    through gloo.

    Arguments default to the ``JAXSAMPLER_*`` variables that ``python -m jaxsampler.cli.launch``
    sets; with none set and none given it does nothing (one process), as it does for
    ``num_processes=1``. Call it before anything else touches JAX devices. Calling it again
    with the same arguments does nothing.

    Failure behaviour, so that a broken job stops instead of hanging:

    - the coordinator (or, on process 0, a peer) does not answer within ``timeout_s``:
      ``TimeoutError`` naming the address and the timeout. The process cannot retry (JAX's
      client keeps waiting in the background and aborts the process
      ``timeout_s + 60`` s later): let the error end it.
    - a peer dies mid-run: a collective on the survivors fails at once when the peer's TCP
      connections close (gloo: ``Connection closed by peer``), and when a peer stops sending
      heartbeats for ``heartbeat_timeout_s`` (its host vanished) JAX's coordination service
      terminates every process itself.
    - a process of a joined job ends on an uncaught exception (the failed collective's
      included): its traceback and a line naming the process are printed and it exits at once
      with status 1 (130 for Ctrl-C), except that one whose collective failed because a peer
      vanished first waits ``PEER_GONE_EXIT_DELAY_S`` (2 s), so that the peer which caused it
      ends first and the launcher reports the peer's status; one that calls ``sys.exit(code)``
      with a nonzero code exits at once with that code. Without this, JAX's exit-time shutdown
      barrier waits for peers that are gone or still running (up to ``timeout_s``) and then
      aborts the process (status 134, the real status lost). A process that returns normally
      (status 0) still meets the others at that barrier. This sets ``sys.excepthook`` and wraps
      ``sys.exit`` in the joined process; ``fail_fast=False`` leaves both alone (and JAX's
      barrier behaviour as it is).

    Args:
        coordinator_address: ``host:port`` of process 0 (``JAXSAMPLER_COORDINATOR``).
        num_processes: how many processes take part (``JAXSAMPLER_NUM_PROCESSES``).
        process_id: this process's index, ``0 .. num_processes - 1``
            (``JAXSAMPLER_PROCESS_ID``).
        timeout_s: seconds to wait for every process to join (``JAXSAMPLER_TIMEOUT``,
            default 60); also how long a finished process waits at exit for the others.
        heartbeat_timeout_s: seconds without a heartbeat after which a process counts as
            dead and the whole job is stopped (``JAXSAMPLER_HEARTBEAT_TIMEOUT``, default 10;
            JAX's own default is 100). Heartbeats come from a background thread, so long
            compilations do not miss them.
        fail_fast: end the process at once on an uncaught exception or a nonzero
            ``sys.exit`` (above); default True.

    Raises:
        ValueError: arguments (or variables) missing, malformed or out of range.
        TimeoutError: the coordinator or a peer did not answer within ``timeout_s``.
        RuntimeError: called again with different arguments, after an earlier attempt
            timed out, or after JAX's backend started (``jax.devices()`` or any computation
            ran first).
    """
    global _initialized, _joined_with, _failed_with
    env = os.environ
    coordinator_address = coordinator_address or env.get(ENV_COORDINATOR) or None
    if num_processes is None:
        num_processes = _env_number(ENV_NUM_PROCESSES, int, env)
    if process_id is None:
        process_id = _env_number(ENV_PROCESS_ID, int, env)
    if timeout_s is None:
        timeout_s = _env_number(ENV_TIMEOUT, float, env) or DEFAULT_TIMEOUT_S
    if heartbeat_timeout_s is None:
        heartbeat_timeout_s = (
            _env_number(ENV_HEARTBEAT_TIMEOUT, float, env) or DEFAULT_HEARTBEAT_TIMEOUT_S
        )
    timeout_s = _check_seconds("timeout_s", timeout_s)
    heartbeat_timeout_s = _check_seconds("heartbeat_timeout_s", heartbeat_timeout_s)
    if coordinator_address is None and num_processes is None and process_id is None:
        return
    missing = [
        f"{name} ({var})"
        for name, var, value in (
            ("coordinator_address", ENV_COORDINATOR, coordinator_address),
            ("num_processes", ENV_NUM_PROCESSES, num_processes),
            ("process_id", ENV_PROCESS_ID, process_id),
        )
        if value is None
    ]
    if missing:
        raise ValueError(
            f"initialize needs all of coordinator_address, num_processes and process_id; "
            f"missing: {', '.join(missing)} (python -m jaxsampler.cli.launch sets them all)"
        )
    assert coordinator_address is not None and num_processes is not None
    assert process_id is not None
    for name, value in (("num_processes", num_processes), ("process_id", process_id)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{name} must be an int, got {value!r}")
    num_processes, process_id = int(num_processes), int(process_id)
    if num_processes < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}")
    if not 0 <= process_id < num_processes:
        raise ValueError(f"process_id={process_id} is not in 0..{num_processes - 1}")
    _check_address(coordinator_address)
    args = (coordinator_address, num_processes, process_id)
    if _failed_with is not None:
        raise RuntimeError(
            f"an earlier initialize failed ({_failed_with}); JAX cannot join again in this "
            "process: start a fresh one"
        )
    if _joined_with is not None:
        if args == _joined_with:
            return
        raise RuntimeError(
            "initialize was already called with coordinator_address={!r}, num_processes={}, "
            "process_id={}; it cannot join again with coordinator_address={!r}, "
            "num_processes={}, process_id={} (one job per process)".format(*_joined_with, *args)
        )
    if num_processes == 1:
        _joined_with = args
        return
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        raise RuntimeError(
            "initialize must run before anything touches JAX devices (jax.devices(), an array, "
            "a computation): call it first thing in the program"
        )
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    _join(args, timeout_s, heartbeat_timeout_s)
    _joined_with = args
    _initialized = True
    if fail_fast:
        _install_fail_fast(process_id, num_processes)


def _join(args: tuple[str, int, int], timeout_s: float, heartbeat_timeout_s: float) -> None:
    """``jax.distributed.initialize`` with a deadline: its connect blocks in C++ (and aborts
    the process at JAX's own deadline), so it runs in a thread this one waits for."""
    global _failed_with
    address, n, pid = args
    errors: list[BaseException] = []

    def connect() -> None:
        try:
            jax.distributed.initialize(
                address,
                num_processes=n,
                process_id=pid,
                initialization_timeout=int(timeout_s) + _JAX_DEADLINE_MARGIN_S,
                heartbeat_timeout_seconds=max(1, round(heartbeat_timeout_s)),
                shutdown_timeout_seconds=max(1, round(timeout_s)),
            )
        except BaseException as e:  # handed to the caller's thread
            errors.append(e)

    worker = threading.Thread(target=connect, name="jaxsampler-distributed-join", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        who = (
            f"process 0 (the coordinator, on {address}) waited for all {n} processes"
            if pid == 0
            else f"process {pid} of {n} got no answer from the coordinator at {address}"
        )
        _failed_with = f"timed out after {timeout_s:g} s"
        check = "the other processes run" if pid == 0 else "process 0 runs"
        raise TimeoutError(
            f"jaxsampler.rollout.distributed.initialize: {who} for {timeout_s:g} s (timeout_s / "
            f"{ENV_TIMEOUT}). Check that {check}, that every process got the same address "
            f"and num_processes={n}, and that the port is reachable"
        )
    if errors:
        _failed_with = f"{type(errors[0]).__name__}: {errors[0]}"
        raise RuntimeError(
            f"jaxsampler.rollout.distributed.initialize: process {pid} of {n} could not join the "
            f"coordinator at {address}: {errors[0]}"
        ) from errors[0]


def _install_fail_fast(process_id: int, num_processes: int) -> None:
    """A process of a joined job that fails (an uncaught exception, or ``sys.exit`` with a
    nonzero status) ends at once, rather than in JAX's exit-time shutdown barrier, which waits
    for peers that are gone or still running (``timeout_s``) and then aborts the process
    (status 134, the real one lost)."""
    global _exit_requested
    who = f"jaxsampler.rollout.distributed: process {process_id} of {num_processes}"
    previous_hook = sys.excepthook
    original_exit = sys.exit

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        try:
            previous_hook(kind, value, tb)
            text = str(value)
            cause = (
                " A peer process died or closed its connection (a collective failed)."
                if "Gloo" in text or "Connection closed by peer" in text
                else ""
            )
            sys.stderr.write(
                f"{who} stopped on an uncaught {kind.__name__}.{cause} Exiting now without "
                "waiting for the other processes.\n"
            )
            sys.stdout.flush()
            sys.stderr.flush()
            if cause:
                # The peer closed its connections on its way out; its exit is reported to the
                # launcher a moment later (under load, after ours could be). Let it end first.
                time.sleep(PEER_GONE_EXIT_DELAY_S)
        finally:
            os._exit(130 if issubclass(kind, KeyboardInterrupt) else 1)

    def recording_exit(status: Any = None) -> Any:
        global _exit_requested
        _exit_requested = status
        return original_exit(status)

    def at_exit() -> None:  # registered after JAX's own clean-up, so it runs before it
        status = _exit_requested
        if status is None or status == 0:
            return
        code = status if isinstance(status, int) and not isinstance(status, bool) else 1
        sys.stderr.write(f"{who} exits with status {code}; not waiting for the other processes.\n")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    sys.excepthook = hook
    sys.exit = recording_exit
    atexit.register(at_exit)


def process_allgather(tree: Any) -> Any:
    """Every process's ``tree`` (host values of the same structure and shapes), stacked on a
    new leading axis ``[num_processes, ...]``, on every process."""
    if jax.process_count() == 1:
        return jax.tree.map(lambda x: np.asarray(x)[None], tree)
    from jax.experimental import multihost_utils

    return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree, tiled=False))


def process_sum(tree: Any) -> Any:
    """The sum over processes of ``tree`` (host values), on every process."""
    return jax.tree.map(lambda x: x.sum(axis=0), process_allgather(tree))
