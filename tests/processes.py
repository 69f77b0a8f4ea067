"""Running a test script as N cooperating processes on 127.0.0.1 (``jax.distributed``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from jaxsampler.rollout.distributed import ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID

ROOT = Path(__file__).resolve().parents[1]


#: What process 0 prints (then it crashes) when its coordinator port was taken between
#: :func:`free_port` and its own bind: under pytest-xdist another worker's test may take it.
PORT_TAKEN = "Failed to add port to server"


def free_port() -> int:
    """A port free now on 127.0.0.1 (closed again: another process may take it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn_processes(
    script: str, n: int = 2, devices: int = 1, extra_env: dict[str, str] | None = None
) -> list[subprocess.Popen[str]]:
    """Starts ``n`` processes of ``python -c script``, each with ``devices`` CPU devices and
    the ``JAXSAMPLER_*`` variables that :func:`jaxsampler.rollout.distributed.initialize` reads."""
    port = free_port()
    procs = []
    for i in range(n):
        env = dict(
            os.environ,
            XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
            PYTHONPATH=str(ROOT),
            **{
                ENV_COORDINATOR: f"127.0.0.1:{port}",
                ENV_NUM_PROCESSES: str(n),
                ENV_PROCESS_ID: str(i),
            },
            **(extra_env or {}),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", script],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def run_processes(
    script: str, marker: str, n: int = 2, devices: int = 1, timeout: int = 300
) -> list[str]:
    """Runs ``script`` as ``n`` processes; asserts each exits 0 and prints ``marker``.
    Returns their stdouts, by process index. Every process is killed on timeout. A run
    whose coordinator port was taken meanwhile (:data:`PORT_TAKEN`) is started again once,
    on a new port."""
    for attempt in range(2):
        procs = spawn_processes(script, n, devices)
        outs: list[tuple[str, str]] = []
        try:
            for p in procs:
                outs.append(p.communicate(timeout=timeout))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
        if attempt == 0 and procs[0].returncode != 0 and PORT_TAKEN in outs[0][1]:
            continue
        break
    for i, (p, (out, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, f"process {i} exited {p.returncode}:\n{err[-4000:]}"
        assert marker in out, f"process {i}:\n{out[-2000:]}"
    return [o for o, _ in outs]
