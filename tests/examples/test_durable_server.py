"""examples.durable_server as an operator runs it: started, SIGKILLed under load, started
again (recovering at start), stopped with SIGTERM (recovering at stop); the log then holds
every answered step exactly once, and a third start finds nothing to recover."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.processes import ROOT
from tests.serving.test_journal_crash import Clients, check_log, wait_for


def start(directory):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "examples.durable_server",
            "--dir",
            str(directory),
            "--checkpoint-s",
            "0.05",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu"),
    )
    ready = json.loads(proc.stdout.readline())
    assert ready["event"] == "ready", ready
    return proc, ready


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (POSIX)")
@pytest.mark.filterwarnings("ignore::jaxsampler.offline.TruncatedLogWarning")
def test_kill_restart_and_stop_leave_every_answered_step_in_the_log_once(tmp_path):
    clients = Clients(4)
    proc, ready = start(tmp_path)
    assert ready["recovery"] == {}  # a first start: no journal yet
    clients.address = ready["address"]
    clients.up.set()
    for th in clients.threads:
        th.start()
    try:
        wait_for(clients, 200)
        clients.up.clear()
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        proc, ready = start(tmp_path)  # recovers what the kill left unstored, then serves
        assert ready["recovery"]["sessions"] == 1 and ready["recovery"]["compacted"]
        assert ready["recovery"]["log_read_from"] > 0  # from the last in-run checkpoint
        clients.address = ready["address"]
        clients.up.set()
        wait_for(clients, clients.count() + 200)
        clients.stop.set()
        for th in clients.threads:
            th.join(30)
        proc.send_signal(signal.SIGTERM)  # a clean stop stores everything before exiting
        out, _ = proc.communicate(timeout=60)
    finally:
        clients.stop.set()
        clients.up.set()
        if proc.poll() is None:
            proc.kill()
    stopped = json.loads(out.strip().splitlines()[-1])
    assert proc.returncode == 0 and stopped["failure"] is None, stopped
    assert stopped["recovery"]["sessions"] == 1
    check_log(tmp_path / "data.log", clients)
    proc, ready = start(tmp_path)  # nothing left: the stop recovered and compacted
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert (ready["recovery"]["sessions"], ready["recovery"]["recovered_steps"]) == (0, 0)
