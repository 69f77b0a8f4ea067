"""The rest of the chaos faults (issue 32, item 7) on the journaled server of
``test_journal_crash``: a paused server and a killed client process, under load (loopback
only). Each run ends with a SIGKILL of the server and :func:`~jaxsampler.offline.recover`,
and the log must then hold every step a client got the action of exactly once (with that
action and its acknowledged reward), no step a live client was not told about, and no id
naming two episodes.

* A server process stopped (SIGSTOP) for twice ``episode_timeout_s`` and
  ``action_timeout_s`` while clients whose requests time out after 1 s keep retrying: the
  pause costs no episode and no error (the running clock does not count it; a retried
  step is run once), so no client is told anything before the final kill.
* A client process SIGKILLed in the middle of its episodes: after ``client_gone_grace_s``
  the server ends its open episode as abandoned (truncated), the sampler writes it out,
  and every step the dead client got an action for is in the log once.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from jaxsampler.host_envs.external import ExternalEnv
from jaxsampler.offline import read_records, recover
from tests.processes import ROOT
from tests.serving.test_journal_crash import ACT, OBS, Clients, check_log, start_server, wait_for

pytestmark = [
    pytest.mark.slow,  # processes, a pause of seconds: the integration tier
    pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP/SIGKILL (POSIX)"),
    pytest.mark.filterwarnings("ignore::jaxsampler.offline.TruncatedLogWarning"),
]

#: a simulator process: client ``argv[2]`` runs episodes of 40 steps against ``argv[1]``
#: and prints ``ep t action`` for each action it got; after step 15 of its second episode
#: it prints ``WAIT`` and waits (between two calls) for the test to kill it
CLIENT = """
import sys, time
import numpy as np
import jaxsampler as js
client, cid = js.serving.PolicyClient(sys.argv[1]), int(sys.argv[2])
for ep in range(2):
    eid = client.start_episode(f"c{cid}e{ep}")
    for t in range(40):
        action = client.get_action(eid, np.array([cid, ep, t], np.float32))
        print(ep, t, int(action), flush=True)
        client.log_returns(eid, float(t + 1))
        if (ep, t) == (1, 15):
            print("WAIT", flush=True)
            time.sleep(600)
    client.end_episode(eid, np.array([cid, ep, 99], np.float32))
"""


def read_lines(proc, n, timeout=60.0):
    """The first ``n`` lines ``proc`` prints, split (bounded: fails after ``timeout``)."""
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True)
    reader.start()
    return [lines.get(timeout=timeout).split() for _ in range(n)]


def kill_and_recover(proc, journal, log):
    """SIGKILLs the server and recovers what its sampler had not written."""
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    return recover(journal, log, ExternalEnv(OBS, ACT))


def stop_clients(clients):
    clients.stop.set()
    clients.up.set()
    for th in clients.threads:
        th.join(60)
    assert not any(th.is_alive() for th in clients.threads)


def abandoned(log):
    """Ids of the episodes in ``log`` that the server ended as abandoned."""
    return {
        rec.id_
        for rec in read_records(log)
        if rec.is_truncated and rec.get_infos(-1).get("abandoned", False)
    }


def test_a_paused_server_loses_no_step_and_abandons_nobody(tmp_path):
    journal, log = tmp_path / "steps.journal", tmp_path / "data.log"
    clients = Clients(4, timeout=1.0, retries=8, backoff_s=0.05)
    proc, clients.address = start_server(journal, log, EPISODE_TIMEOUT_S=2.0, ACTION_TIMEOUT_S=2.0)
    clients.up.set()
    for th in clients.threads:
        th.start()
    try:
        wait_for(clients, 200)
        proc.send_signal(signal.SIGSTOP)
        time.sleep(4.0)  # the fault: twice the env's timeouts, four times the clients'
        proc.send_signal(signal.SIGCONT)
        wait_for(clients, clients.count() + 200)
        with clients.lock:
            told = list(clients.errors)
        assert told == [], f"the pause was reported as a failure: {told[:3]}"
        clients.up.clear()
        report = kill_and_recover(proc, journal, log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        stop_clients(clients)
    check_log(log, clients)
    # the pause was nobody's silence: only the final kill ended episodes early
    assert abandoned(log) <= set(report.ended_by_crash)
    assert report.acknowledged_steps > 0


def test_a_killed_client_loses_no_answered_step_and_its_episode_ends(tmp_path):
    journal, log = tmp_path / "steps.journal", tmp_path / "data.log"
    clients = Clients(3)
    proc, clients.address = start_server(journal, log, GRACE_S=0.5)
    dead = subprocess.Popen(
        [sys.executable, "-c", CLIENT, clients.address, "9"],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu"),
    )
    clients.up.set()
    for th in clients.threads:
        th.start()
    try:
        got = read_lines(dead, 57)
        assert got[-1] == ["WAIT"], got[-3:]  # between two calls of episode c9e1
        got.pop()
        dead.send_signal(signal.SIGKILL)
        dead.wait(30)
        for _ in range(300):  # bounded (30 s): the grace is 0.5 s, a sample call 64 steps
            time.sleep(0.1)
            if "c9e1" in abandoned(log):
                break
        assert "c9e1" in abandoned(log)
        clients.up.clear()
        kill_and_recover(proc, journal, log)
    finally:
        if dead.poll() is None:
            dead.kill()
        if proc.poll() is None:
            proc.kill()
        stop_clients(clients)
    for ep, t, action in got:
        clients.acked[(9, int(ep), int(t))] = int(action)
    logged = check_log(log, clients, dead=(9,))
    assert {k for k in logged if k[0] == 9} == {(9, int(e), int(t)) for e, t, _ in got}
    assert abandoned(log) & {"c9e0", "c9e1"} == {"c9e1"}  # the first one it ended itself
