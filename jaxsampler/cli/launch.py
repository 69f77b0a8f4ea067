"""``python -m jaxsampler.cli.launch -n N script.py [args...]``: N local processes of one program,
joined by :func:`jaxsampler.rollout.distributed.initialize`.

Each process ``i`` gets the variables :func:`~jaxsampler.rollout.distributed.initialize` reads
(``JAXSAMPLER_COORDINATOR=127.0.0.1:PORT``, ``JAXSAMPLER_NUM_PROCESSES=N``,
``JAXSAMPLER_PROCESS_ID=i``, and ``JAXSAMPLER_TIMEOUT`` with ``--timeout``) and ``XLA_FLAGS``
asking for ``--devices-per-process`` CPU devices. Their output is streamed line by line,
prefixed ``[i]`` (stdout to stdout, stderr to stderr). The launcher:

- returns ``0`` when every process exits ``0``;
- otherwise returns the exit code of the process that failed first (a process killed by
  signal ``s`` counts as ``128 + s``, as a shell reports it); when a process fails, the others
  get ``--grace`` seconds to finish (a survivor's own error message is usually the informative
  one), then ``SIGTERM``, then ``SIGKILL`` two seconds later;
- on Ctrl-C (or ``SIGTERM``) stops every process the same way and returns ``130`` (``143``);
- with ``--wall-timeout S``, stops everything after S seconds and returns ``124``.

Which failure is "first": processes that end after the first failure the launcher observes never
change the job's code, whether the launcher stopped them or they failed because a peer vanished
(a collective whose peer is gone fails with a connection reset, and that process exits ``1``,
two seconds late, so that the peer which vanished is observed ending first even under load).
Exits are observed in the order the OS reports them: on Linux (5.3+) through one pidfd per
process in an epoll set, whose ready list keeps the order the processes ended even when several
ended between two looks; elsewhere by looking at every process each 10 ms, and processes found
ended in the same look come in process order. Of several processes observed ending together,
the job takes the earliest that exited with a nonzero code of its own, and a signal's
``128 + s`` only when each of them was killed by a signal.

Every process runs in its own process group (what it starts itself is stopped with it) and,
on Linux, dies with the launcher even if the launcher is killed outright.

From Python: :func:`launch` (``launch(["script.py", "--flag"], n=2)``, or ``["-m",
"package.module", ...]``) returns the exit code the command line would.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, Protocol

from jaxsampler.cli.args import (
    OneLineParser,
    nonnegative_float,
    port,
    positive_float,
    positive_int,
)
from jaxsampler.rollout.distributed import (
    ENV_COORDINATOR,
    ENV_NUM_PROCESSES,
    ENV_PROCESS_ID,
    ENV_TIMEOUT,
)

__all__ = ["launch", "main"]

#: Seconds the other processes get to finish after one fails, before they are stopped.
DEFAULT_GRACE_S = 5.0
#: Seconds between ``SIGTERM`` and ``SIGKILL`` when processes are stopped.
KILL_AFTER_S = 2.0
#: Seconds between looks at the processes where the OS cannot report exits in order (no pidfd).
POLL_S = 0.01

_DEVICE_FLAG = "--xla_force_host_platform_device_count"
_PR_SET_PDEATHSIG = 1
# The processes import the same jaxsampler as the launcher (a source checkout included): the
# folder that holds the ``jaxsampler`` package (this file is jaxsampler/cli/launch.py).
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _xla_flags(current: str, devices: int) -> str:
    kept = [f for f in current.split() if not f.startswith(_DEVICE_FLAG)]
    return " ".join([*kept, f"{_DEVICE_FLAG}={devices}"])


def _child_setup(core: int | None) -> Callable[[], None]:
    """Runs in each child between fork and exec: die with the launcher (Linux), pin to a
    core when asked."""

    def setup() -> None:
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            except (OSError, AttributeError):  # pragma: no cover - no prctl: no safety net
                pass
        if core is not None:
            os.sched_setaffinity(0, {core})

    return setup


def _command(argv: Sequence[str]) -> list[str]:
    if not argv:
        raise ValueError("nothing to launch: give a script (script.py [args...]) or -m module")
    first = argv[0]
    if first in ("-m", "-c"):
        if len(argv) < 2:
            raise ValueError(f"{first} needs a {'module' if first == '-m' else 'program'}")
        return [sys.executable, *argv]
    if first.startswith("-"):
        raise ValueError(f"unknown option {first!r} before the script (see --help)")
    return [sys.executable, *argv]


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class _Pump(threading.Thread):
    """Copies one child pipe to ``out`` line by line, each line prefixed."""

    def __init__(self, pipe: IO[bytes], out: IO[str], prefix: str, lock: threading.Lock):
        super().__init__(daemon=True)
        self.pipe, self.out, self.prefix, self.lock = pipe, out, prefix, lock

    def run(self) -> None:
        for raw in iter(self.pipe.readline, b""):
            line = raw.decode("utf-8", "replace")
            if not line.endswith("\n"):
                line += "\n"
            with self.lock:
                try:
                    self.out.write(self.prefix + line)
                    self.out.flush()
                except (OSError, ValueError):  # our own output closed: keep draining
                    pass
        self.pipe.close()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)


def _stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every running process group, SIGKILL what is left after KILL_AFTER_S; reaps
    them all."""
    for p in procs:
        if p.poll() is None:
            _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + KILL_AFTER_S
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.poll() is None:
            _signal_group(p, signal.SIGKILL)
        p.wait()
    for p in procs:  # whatever the children left in their groups
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)


class _Interrupted(Exception):
    def __init__(self, code: int):
        self.code = code


def launch(
    argv: Sequence[str],
    n: int = 2,
    *,
    devices_per_process: int = 1,
    port: int | None = None,
    timeout: float | None = None,
    pin: bool = False,
    grace_s: float = DEFAULT_GRACE_S,
    wall_timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
) -> int:
    """Runs ``argv`` as ``n`` local processes of one ``jax.distributed`` job.

    Args:
        argv: what to run with this Python: ``["script.py", *args]``, ``["-m", "module",
            *args]`` or ``["-c", "code", *args]``.
        n: how many processes (``>= 1``).
        devices_per_process: CPU devices of each process (``XLA_FLAGS``; other platforms
            ignore it).
        port: the coordinator's port on 127.0.0.1 (default: a free one).
        timeout: seconds :func:`jaxsampler.rollout.distributed.initialize` waits for the others
            to join (``JAXSAMPLER_TIMEOUT``; default: its own, 60).
        pin: pin process ``i`` to the ``i``-th CPU core this launcher may use (modulo their
            number), Linux only.
        grace_s: seconds the others get to finish after one process fails.
        wall_timeout: stop everything after this many seconds (exit code 124).
        env: the environment of the processes (default: this one's), before the variables
            above are added.
        stdout: where prefixed standard output goes (default ``sys.stdout``).
        stderr: where prefixed standard error goes (default ``sys.stderr``).

    Returns:
        0 if every process exited 0; else the exit code of the process that failed first
        (``128 + signal`` for a process killed by a signal; the module docstring says how
        "first" is decided), 130 on Ctrl-C, 143 on SIGTERM, 124 on ``wall_timeout``.

    Raises:
        ValueError: bad ``n``, ``devices_per_process``, ``port``, timeouts or ``argv``.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n (the number of processes) must be an int >= 1, got {n!r}")
    if isinstance(devices_per_process, bool) or not isinstance(devices_per_process, int):
        raise ValueError(f"devices_per_process must be an int >= 1, got {devices_per_process!r}")
    if devices_per_process < 1:
        raise ValueError(f"devices_per_process must be an int >= 1, got {devices_per_process!r}")
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"port must be in 1..65535, got {port}")
    for name, value in (("timeout", timeout), ("wall_timeout", wall_timeout)):
        if value is not None and not value > 0:
            raise ValueError(f"{name} must be > 0 seconds, got {value}")
    if not grace_s >= 0:
        raise ValueError(f"grace_s must be >= 0 seconds, got {grace_s}")
    cmd = _command(argv)
    cores: list[int] = []
    if pin:
        if not hasattr(os, "sched_setaffinity"):
            raise ValueError("pin=True needs os.sched_setaffinity (Linux)")
        cores = sorted(os.sched_getaffinity(0))
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    base = dict(os.environ if env is None else env)
    address = f"127.0.0.1:{port if port is not None else _free_port()}"

    procs: list[subprocess.Popen[bytes]] = []
    pumps: list[_Pump] = []
    lock = threading.Lock()
    previous: dict[int, Any] = {}

    def on_signal(signum: int, _frame: Any) -> None:
        raise _Interrupted(128 + signum)

    watch = _exit_watch()
    if threading.current_thread() is threading.main_thread():
        previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, on_signal)
    code = 0
    try:
        for i in range(n):
            child_env = dict(base)
            child_env.update(
                {
                    ENV_COORDINATOR: address,
                    ENV_NUM_PROCESSES: str(n),
                    ENV_PROCESS_ID: str(i),
                    "XLA_FLAGS": _xla_flags(base.get("XLA_FLAGS", ""), devices_per_process),
                    "PYTHONUNBUFFERED": "1",
                    "PYTHONPATH": os.pathsep.join(
                        [_PACKAGE_ROOT, *filter(None, [base.get("PYTHONPATH")])]
                    ),
                }
            )
            if timeout is not None:
                child_env[ENV_TIMEOUT] = repr(float(timeout))
            p = subprocess.Popen(
                cmd,
                env=child_env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=_child_setup(cores[i % len(cores)] if cores else None),
            )
            procs.append(p)
            watch.add(i, p)
            assert p.stdout is not None and p.stderr is not None
            for pipe, sink in ((p.stdout, out), (p.stderr, err)):
                pump = _Pump(pipe, sink, f"[{i}] ", lock)
                pump.start()
                pumps.append(pump)
        code = _supervise(watch, n, grace_s, wall_timeout, err, lock)
    except KeyboardInterrupt:
        code = 130
    except _Interrupted as e:
        code = e.code
    finally:
        watch.close()
        _stop(procs)
        for t in pumps:
            if t.ident is not None:  # started (an interrupt may land in between)
                t.join(timeout=5.0)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return code


class _ExitWatch(Protocol):
    """Observes the launched processes end, in the order they ended where the OS tells it."""

    def add(self, i: int, proc: subprocess.Popen[bytes]) -> None:
        """Watches ``proc`` (process ``i``) from now on."""

    def wait(self, timeout: float) -> list[tuple[int, int]]:
        """The processes that ended since the last call, ``(i, returncode)`` earliest first,
        each reaped; waits up to ``timeout`` seconds for one, ``[]`` if none did."""

    def close(self) -> None:
        """Releases what the watch holds (the processes are left alone)."""


class _PidfdWatch:
    """Linux 5.3+: one pidfd per process in an epoll set. The kernel makes a pidfd readable when
    it tells the parent that the process ended, and epoll returns ready descriptors in the order
    they became ready, so processes that ended between two looks still come back in exit order."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._watched: dict[int, tuple[int, subprocess.Popen[bytes]]] = {}

    def add(self, i: int, proc: subprocess.Popen[bytes]) -> None:
        fd = os.pidfd_open(proc.pid)  # the child is not reaped yet: the pid is still proc's
        self._watched[fd] = (i, proc)
        self._epoll.register(fd, select.EPOLLIN)

    def wait(self, timeout: float) -> list[tuple[int, int]]:
        ended = []
        for fd, _ in self._epoll.poll(timeout):
            i, proc = self._watched.pop(fd)
            self._epoll.unregister(fd)
            os.close(fd)
            ended.append((i, proc.wait()))
        return ended

    def close(self) -> None:
        for fd in self._watched:
            os.close(fd)
        self._watched.clear()
        self._epoll.close()


class _PollWatch:
    """Anywhere else: looks at every running process each ``POLL_S`` seconds. Processes found
    ended in the same look come in process order (the OS does not say which ended first)."""

    def __init__(self, interval: float = POLL_S) -> None:
        self._interval = interval
        self._running: list[tuple[int, subprocess.Popen[bytes]]] = []

    def add(self, i: int, proc: subprocess.Popen[bytes]) -> None:
        self._running.append((i, proc))

    def wait(self, timeout: float) -> list[tuple[int, int]]:
        deadline = time.monotonic() + timeout
        while True:
            looked = [(i, p, p.poll()) for i, p in self._running]
            ended = [(i, code) for i, _, code in looked if code is not None]
            if ended:
                self._running = [(i, p) for i, p, code in looked if code is None]
                return ended
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            time.sleep(min(self._interval, left))

    def close(self) -> None:
        self._running.clear()


def _exit_watch() -> _ExitWatch:
    """The pidfd watch where this OS has pidfds and epoll, else the polling one."""
    if hasattr(os, "pidfd_open") and hasattr(select, "epoll"):
        try:
            os.close(os.pidfd_open(os.getpid()))
        except OSError:  # an older kernel (ENOSYS) or a sandbox that forbids the call
            return _PollWatch()
        return _PidfdWatch()
    return _PollWatch()


def _first_failure(ended: Sequence[tuple[int, int]]) -> tuple[int, int] | None:
    """Of processes observed ending together, ``(i, returncode)`` earliest first, the failure
    that is the job's: the earliest with a nonzero code of its own, else the earliest killed by
    a signal (negative ``returncode``); ``None`` when every one exited 0."""
    own = [(i, code) for i, code in ended if code > 0]
    signalled = [(i, code) for i, code in ended if code < 0]
    if own:
        return own[0]
    return signalled[0] if signalled else None


def _supervise(
    watch: _ExitWatch,
    n: int,
    grace_s: float,
    wall_timeout: float | None,
    err: IO[str],
    lock: threading.Lock,
) -> int:
    """Waits for the ``n`` processes of ``watch``; returns the job's exit code. The first
    observed failure (:func:`_first_failure` of the first look that finds one) is the job's;
    the others then get ``grace_s`` seconds to end."""
    start = time.monotonic()
    first_failure: int | None = None
    stop_at: float | None = None
    remaining = n
    while remaining:
        now = time.monotonic()
        if stop_at is not None and now >= stop_at:
            assert first_failure is not None
            return first_failure
        if wall_timeout is not None and now - start >= wall_timeout:
            _note(err, lock, f"wall timeout of {wall_timeout:g} s reached; stopping every process")
            return 124
        # Wake for whichever deadline comes first (at least every half second).
        timeout = 0.5
        if stop_at is not None:
            timeout = min(timeout, stop_at - now)
        if wall_timeout is not None:
            timeout = min(timeout, start + wall_timeout - now)
        ended = watch.wait(max(0.0, timeout))
        remaining -= len(ended)
        failure = _first_failure(ended) if first_failure is None else None
        if failure is not None:
            i, code = failure
            first_failure = _exit_code(code)
            stop_at = time.monotonic() + grace_s
            _note(err, lock, f"process {i} exited {first_failure}; stopping the others")
    return first_failure or 0


def _note(err: IO[str], lock: threading.Lock, text: str) -> None:
    with lock:
        try:
            err.write(f"[launch] {text}\n")
            err.flush()
        except (OSError, ValueError):
            pass


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="python -m jaxsampler.cli.launch",
        description=(
            "Run a program as N local processes of one jax.distributed job.\n\n"
            "Each process gets JAXSAMPLER_COORDINATOR, JAXSAMPLER_NUM_PROCESSES and\n"
            "JAXSAMPLER_PROCESS_ID (read by jaxsampler.rollout.distributed.initialize()) and\n"
            "XLA_FLAGS for its CPU devices; its output lines are prefixed [i].\n\n"
            "The exit code is 0 when every process exits 0, else that of the process that\n"
            "failed first (128+s for one killed by signal s): processes that fail after it\n"
            "(stopped, or exiting 1 because a peer vanished) do not change it, and of\n"
            "processes seen ending together the earliest with a code of its own (not a\n"
            "signal's) wins. When one process fails, the others get --grace seconds, then\n"
            "are stopped. Ctrl-C stops them all (130); --wall-timeout exits 124."
        ),
        epilog=(
            "examples:\n"
            "  python -m jaxsampler.cli.launch -n 2 examples/ppo_distributed.py\n"
            "  python -m jaxsampler.cli.launch -n 2 --devices-per-process 2 --pin -m mypkg.train "
            "--steps 10"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-n", "--num-processes", type=positive_int, default=2, help="processes, >= 1 (default 2)"
    )
    p.add_argument(
        "--devices-per-process",
        type=positive_int,
        default=1,
        metavar="K",
        help="CPU devices per process, >= 1 (XLA_FLAGS; default 1)",
    )
    p.add_argument(
        "--port",
        type=port,
        default=None,
        help="coordinator port on 127.0.0.1, 1..65535 (default: a free one)",
    )
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=None,
        metavar="S",
        help=(
            "seconds the processes wait for each other to join (and, at the end, to finish); "
            "JAXSAMPLER_TIMEOUT, default: initialize()'s 60"
        ),
    )
    p.add_argument(
        "--pin", action="store_true", help="pin process i to CPU core i (Linux, modulo cores)"
    )
    p.add_argument(
        "--grace",
        type=nonnegative_float,
        default=DEFAULT_GRACE_S,
        metavar="S",
        help=f"seconds (>= 0) the others get after one fails (default {DEFAULT_GRACE_S:g})",
    )
    p.add_argument(
        "--wall-timeout",
        type=positive_float,
        default=None,
        metavar="S",
        help="stop everything after S seconds (> 0), exit 124 (default: no limit)",
    )
    p.add_argument(
        "program",
        nargs="?",
        metavar="script.py [args...] | -m module [args...]",
        help="what each process runs (its own options follow it untouched)",
    )
    return p


_VALUED = {
    "-n",
    "--num-processes",
    "--devices-per-process",
    "--port",
    "--timeout",
    "--grace",
    "--wall-timeout",
}


def _split(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """The launcher's own options, and the program (``script.py ...`` or ``-m module ...``):
    everything from the first token that is not a launcher option on belongs to the
    program, so its own flags pass through untouched."""
    argv = list(argv)
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            return argv[:i], argv[i + 1 :]
        if tok in ("-m", "-c"):
            return argv[:i], argv[i:]
        if not tok.startswith("-") or tok == "-":
            return argv[:i], argv[i:]
        i += 2 if tok in _VALUED else 1
    return argv, []


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit code."""
    parser = _parser()
    own, program = _split(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(own)
    if program[:1] in (["-m"], ["-c"]) and len(program) < 2:
        parser.error(f"{program[0]} needs an argument")
    if not program:
        parser.error("give a script (script.py [args...]) or -m module [args...]")
    try:
        return launch(
            program,
            args.num_processes,
            devices_per_process=args.devices_per_process,
            port=args.port,
            timeout=args.timeout,
            pin=args.pin,
            grace_s=args.grace,
            wall_timeout=args.wall_timeout,
        )
    except ValueError as e:
        parser.error(str(e))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
