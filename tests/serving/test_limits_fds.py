"""PolicyServer out of file descriptors (``RLIMIT_NOFILE``), in a subprocess.

The reproducer: at a low descriptor limit, idle keep-alive sockets blocked new clients
for good and asyncio logged thousands of ``accept()`` tracebacks. Now a failing accept
closes idle connections (oldest first) to make room, logs one line per interval and
serving recovers by itself.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from jaxsampler.serving.client import PolicyClient
from jaxsampler.serving.server import PROTOCOL_VERSION

SERVER = textwrap.dedent(
    """
    import logging, os, resource, sys
    from jaxsampler.host_envs.external import ExternalEnv
    from jaxsampler.serving.server import PolicyServer
    from jaxsampler.spaces import Box, Discrete

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="LOG %(name)s %(message)s")
    server = PolicyServer(ExternalEnv(Box(-1, 1, (3,)), Discrete(2)))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 6, hard))  # room for ~6 connections
    print(server.address, flush=True)
    sys.stdin.readline()  # until the test is done
    server.close()
    """
)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd (Linux)")
def test_out_of_descriptors_closes_idle_connections_and_recovers():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    idle: list[socket.socket] = []
    try:
        address = proc.stdout.readline().strip()
        assert address.startswith("http://"), proc.stderr.read()
        host, port = address[len("http://") :].rsplit(":", 1)
        for _ in range(20):  # far more idle connections than the server has descriptors for
            idle.append(socket.create_connection((host, int(port)), timeout=5))
        # The listen backlog is first in, first out: the server accepts (or fails to accept)
        # every idle connection above before each new client's.
        for _ in range(3):  # new clients get in: idle connections make room
            with PolicyClient(address, timeout=10.0) as c:
                assert c.server_info()["protocol"] == PROTOCOL_VERSION
        closed = 0
        for s in idle:  # the server closed idle ones, oldest first
            s.settimeout(0.01)
            with contextlib.suppress(TimeoutError, ConnectionResetError):
                closed += s.recv(1) == b""
        assert closed >= 3
        for s in idle:
            s.close()
        idle.clear()
        with PolicyClient(address, timeout=10.0) as c:  # and it keeps serving
            assert c.server_info()["protocol"] == PROTOCOL_VERSION
    finally:
        for s in idle:
            s.close()
        out, err = proc.communicate("\n", timeout=30)
    assert proc.returncode == 0, err
    lines = [line for line in err.splitlines() if "accept" in line]
    assert 1 <= len(lines) <= 2, err  # one line per 10 s, not one per failed accept
    assert "closed" in lines[0] and "Traceback" not in err, err
