"""``python -m jaxsampler.cli.launch -n N script.py [args...]``: N local processes of one program,
joined by :func:`jaxsampler.rollout.distributed.initialize`.

Each process ``i`` gets the variables :func:`~jaxsampler.rollout.distributed.initialize` reads
(``JAXSAMPLER_COORDINATOR=127.0.0.1:PORT``, ``JAXSAMPLER_NUM_PROCESSES=N``,
``JAXSAMPLER_PROCESS_ID=i``, and ``JAXSAMPLER_TIMEOUT`` with ``--timeout``) and ``XLA_FLAGS``
asking for ``--devices-per-process`` CPU devices. Their output is streamed line by line,
prefixed ``[i]`` (stdout to stdout, stderr to stderr). The launcher:

- returns ``0`` when every process exits ``0``;
- returns the first nonzero exit code otherwise (a process killed by signal ``s`` counts as
  ``128 + s``, as a shell reports it); when a process fails, the others get ``--grace``
  seconds to finish (a survivor's own error message is usually the informative one), then
  ``SIGTERM``, then ``SIGKILL`` two seconds later;
- on Ctrl-C (or ``SIGTERM``) stops every process the same way and returns ``130`` (``143``);
- with ``--wall-timeout S``, stops everything after S seconds and returns ``124``.

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
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

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
        0 if every process exited 0; else the first nonzero exit code (``128 + signal``
        for a process killed by a signal), 130 on Ctrl-C, 143 on SIGTERM, 124 on
        ``wall_timeout``.

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
            assert p.stdout is not None and p.stderr is not None
            for pipe, sink in ((p.stdout, out), (p.stderr, err)):
                pump = _Pump(pipe, sink, f"[{i}] ", lock)
                pump.start()
                pumps.append(pump)
        code = _supervise(procs, grace_s, wall_timeout, err, lock)
    except KeyboardInterrupt:
        code = 130
    except _Interrupted as e:
        code = e.code
    finally:
        _stop(procs)
        for t in pumps:
            if t.ident is not None:  # started (an interrupt may land in between)
                t.join(timeout=5.0)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return code


def _supervise(
    procs: Sequence[subprocess.Popen[bytes]],
    grace_s: float,
    wall_timeout: float | None,
    err: IO[str],
    lock: threading.Lock,
) -> int:
    """Waits for the processes; returns the job's exit code. After the first failure (in
    the order the processes ended, one waiting thread each) the others get ``grace_s``."""
    ended: queue.Queue[tuple[int, int]] = queue.Queue()

    def wait(i: int, p: subprocess.Popen[bytes]) -> None:
        ended.put((i, p.wait()))

    for i, p in enumerate(procs):
        threading.Thread(target=wait, args=(i, p), daemon=True).start()
    start = time.monotonic()
    first_failure: int | None = None
    stop_at: float | None = None
    remaining = len(procs)
    while remaining:
        try:
            i, c = ended.get(timeout=0.05)
        except queue.Empty:
            now = time.monotonic()
            if stop_at is not None and now >= stop_at:
                assert first_failure is not None
                return first_failure
            if wall_timeout is not None and now - start >= wall_timeout:
                _note(
                    err, lock, f"wall timeout of {wall_timeout:g} s reached; stopping every process"
                )
                return 124
            continue
        remaining -= 1
        if c != 0 and first_failure is None:
            first_failure = _exit_code(c)
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
    p = argparse.ArgumentParser(
        prog="python -m jaxsampler.cli.launch",
        description=(
            "Run a program as N local processes of one jax.distributed job.\n\n"
            "Each process gets JAXSAMPLER_COORDINATOR, JAXSAMPLER_NUM_PROCESSES and\n"
            "JAXSAMPLER_PROCESS_ID (read by jaxsampler.rollout.distributed.initialize()) and\n"
            "XLA_FLAGS for its CPU devices; its output lines are prefixed [i]. The exit\n"
            "code is the first nonzero one of any process; when one process fails, the\n"
            "others get --grace seconds, then are stopped. Ctrl-C stops them all."
        ),
        epilog=(
            "examples:\n"
            "  python -m jaxsampler.cli.launch -n 2 examples/ppo_distributed.py\n"
            "  python -m jaxsampler.cli.launch -n 2 --devices-per-process 2 --pin -m mypkg.train "
            "--steps 10"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-n", "--num-processes", type=int, default=2, help="processes (default 2)")
    p.add_argument(
        "--devices-per-process",
        type=int,
        default=1,
        metavar="K",
        help="CPU devices per process (XLA_FLAGS; default 1)",
    )
    p.add_argument(
        "--port", type=int, default=None, help="coordinator port on 127.0.0.1 (default: free)"
    )
    p.add_argument(
        "--timeout",
        type=float,
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
        type=float,
        default=DEFAULT_GRACE_S,
        metavar="S",
        help=f"seconds the others get after one fails (default {DEFAULT_GRACE_S:g})",
    )
    p.add_argument(
        "--wall-timeout",
        type=float,
        default=None,
        metavar="S",
        help="stop everything after S seconds, exit 124",
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
