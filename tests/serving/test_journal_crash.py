"""A policy server with a write-ahead journal, SIGKILLed twice under load (loopback only).

The server process runs ``PolicyServer(ExternalEnv(journal=StepJournal(j)))`` and a host
sampler that appends each ``sample(num_timesteps=64)`` call's episodes to an offline log,
so up to a call's worth of answered steps live only in its memory. Client threads drive
episodes over HTTP and record what was acknowledged: the observation and action of each
answered ``get_action``, and a reward once a later call that carried it succeeded. The
server is killed, :func:`~jaxsampler.offline.recover` runs, a new server continues on the
same journal and log, is killed again, and recovery runs again. The log must then hold
every acknowledged step exactly once with its action (and acknowledged reward), no step
twice, and no id naming two episodes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.host_envs.external import EnvClosedError, ExternalEnv, ExternalEnvError
from jaxsampler.offline import read_records, recover
from jaxsampler.spaces import Box, Discrete
from tests.processes import ROOT

OBS, ACT = Box(-1e6, 1e6, (3,), np.float32), Discrete(2)
#: what a client may be told when its server dies or refuses (every one a named error)
TOLD = (ConnectionError, OSError, js.serving.PolicyServerError, ExternalEnvError, EnvClosedError)

SERVER = """
import os, resource, signal, sys
import jax, numpy as np
import jaxsampler as js
from jaxsampler.host_envs.external import ExternalEnv
from jaxsampler.offline import OfflineWriter, StepJournal
from jaxsampler.spaces import Box, Discrete

OBS, ACT = Box(-1e6, 1e6, (3,), np.float32), Discrete(2)
if len(sys.argv) > 3:  # a disk that fills up: writes past this size fail with EFBIG
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[3]), int(sys.argv[3])))
opt = lambda name, default: float(os.environ.get(name, default))  # noqa: E731
env = ExternalEnv(
    OBS,
    ACT,
    max_wait_s=0.002,
    journal=StepJournal(sys.argv[1]),
    action_timeout_s=opt("ACTION_TIMEOUT_S", 300),
    episode_timeout_s=opt("EPISODE_TIMEOUT_S", 600),
)
server = js.serving.PolicyServer(env, port=0, client_gone_grace_s=opt("GRACE_S", 10))
policy = js.MLPPolicy(OBS, ACT, hidden_sizes=(4,))
params = policy.init(jax.random.PRNGKey(0))
sampler = js.sampling.HostSampler(server, policy, seed=0, timeout_s=0.05)
writer = OfflineWriter(sys.argv[2], append=True)
sampler.sample(params, num_timesteps=1)  # compiles before clients come
print("READY", server.address, flush=True)
try:
    every, calls = int(os.environ.get("CHECKPOINT_EVERY", "0")), 0
    with server.sampler_alive():  # a sampler that dies on a full disk says so to every client
        while True:
            for episode in sampler.sample(params, num_timesteps=64):
                writer.write(episode)
            calls += 1
            if every and calls % every == 0:  # the in-run checkpoint, once the output is in
                env.checkpoint_journal(writer)
except Exception as e:  # the server stays up, answering 503 with the reason, until killed
    print("sampler died:", repr(e), file=sys.stderr, flush=True)
    signal.pause()
"""


def start_server(journal, log, max_file_bytes=None, checkpoint_every=0, **options):
    """Starts :data:`SERVER` on ``journal`` and ``log``; ``options``: environment variables
    it reads (``ACTION_TIMEOUT_S``, ``EPISODE_TIMEOUT_S``, ``GRACE_S``)."""
    limit = [] if max_file_bytes is None else [str(max_file_bytes)]
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(journal), str(log), *limit],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(
            os.environ,
            PYTHONPATH=str(ROOT),
            JAX_PLATFORMS="cpu",
            CHECKPOINT_EVERY=str(checkpoint_every),
            **{k: str(v) for k, v in options.items()},
        ),
    )
    line = proc.stdout.readline()
    assert line.startswith("READY"), line
    return proc, line.split()[1]


class Clients:
    """Client threads that run episodes against whichever server is up."""

    def __init__(self, n, **client_options):
        self.client_options = client_options  # PolicyClient keywords
        self.lock = threading.Lock()
        self.acked: dict[tuple, int] = {}  # (cid, ep, t) -> action
        self.rewards: dict[tuple, float] = {}  # (cid, ep, t) -> acknowledged reward
        self.address = None
        self.up = threading.Event()
        self.stop = threading.Event()
        self.next_ep = [0] * n
        self.errors: list[tuple[int, BaseException]] = []  # (client, what it was told)
        self.at: list[tuple | None] = [None] * n  # the step each client's last call was for
        self.told: set[tuple] = set()  # the steps at which a client was told of a failure
        self.threads = [threading.Thread(target=self.run, args=(c,)) for c in range(n)]

    def run(self, cid):
        while not self.stop.is_set():
            self.up.wait()
            client = js.serving.PolicyClient(self.address, **self.client_options)
            try:
                while not self.stop.is_set():
                    self.episode(client, cid)
            except TOLD as e:
                with self.lock:
                    self.errors.append((cid, e))
                    if self.at[cid] is not None:
                        self.told.add(self.at[cid])
                time.sleep(0.05)  # the server died: wait for the next one
            finally:  # rewards still pending on a dead server are reported, not lost
                with contextlib.suppress(*TOLD):
                    client.close()

    def episode(self, client, cid):
        ep = self.next_ep[cid]
        self.next_ep[cid] += 1
        eid = client.start_episode(f"c{cid}e{ep}")
        unacked = None  # the step whose reward rides on the next call
        for t in range(40):
            self.at[cid] = (cid, ep, t)
            action = client.get_action(eid, np.array([cid, ep, t], np.float32))
            with self.lock:
                self.acked[(cid, ep, t)] = int(action)
                if unacked is not None:
                    self.rewards[unacked] = float(unacked[2] + 1)
            client.log_returns(eid, float(t + 1))
            unacked = (cid, ep, t)
            if self.stop.is_set():
                break
        client.end_episode(eid, np.array([cid, ep, 99], np.float32))
        with self.lock:
            self.rewards[unacked] = float(unacked[2] + 1)

    def count(self):
        with self.lock:
            return len(self.acked)


def wait_for(clients, n, timeout=60):
    end = time.monotonic() + timeout
    while clients.count() < n and time.monotonic() < end:
        time.sleep(0.02)
    assert clients.count() >= n


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (POSIX)")
@pytest.mark.filterwarnings("ignore::jaxsampler.offline.TruncatedLogWarning")
@pytest.mark.parametrize("checkpoint_every", [0, 2], ids=["no-checkpoints", "checkpoints"])
def test_answered_steps_survive_two_server_kills_exactly_once(tmp_path, checkpoint_every):
    """With in-run checkpoints (every 2 sample calls) the journal holds only what followed
    the last one, and recovery reads the log from where it ended then."""
    journal, log = tmp_path / "steps.journal", tmp_path / "data.log"
    clients = Clients(6)
    proc, clients.address = start_server(journal, log, checkpoint_every=checkpoint_every)
    clients.up.set()
    for th in clients.threads:
        th.start()
    reports = []
    try:
        for round_ in range(2):
            wait_for(clients, clients.count() + 300)
            clients.up.clear()
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            reports.append(recover(journal, log, ExternalEnv(OBS, ACT)))
            if round_ == 0:
                proc, clients.address = start_server(
                    journal, log, checkpoint_every=checkpoint_every
                )
                clients.up.set()
    finally:
        clients.stop.set()
        clients.up.set()
        if proc.poll() is None:
            proc.kill()
        for th in clients.threads:
            th.join(30)

    check_log(log, clients)
    # each recovery compacted the journal: the next one replays only the run after it
    assert [(r.sessions, r.compacted) for r in reports] == [(1, True), (1, True)]
    # the kills did catch answered, unwritten steps (one kill alone may land just after a write)
    assert sum(r.recovered_steps for r in reports) > 0
    if checkpoint_every:  # 300 steps are several sample calls of 64: a checkpoint came first
        assert all(r.log_read_from > 0 for r in reports), reports


def check_log(log, clients, dead=()):
    """Every acknowledged step in the log exactly once, with its action and reward; and
    no step in it that its client neither got the action of nor was told failed (but of
    the clients in ``dead``, killed: nobody is left to tell)."""
    logged: dict[tuple, list] = {}
    for rec in read_records(log):
        obs, acts, rews = rec.get_observations(), rec.get_actions(), rec.get_rewards()
        for i in range(len(rec)):
            key = tuple(int(v) for v in obs[i])
            assert rec.id_ == f"c{key[0]}e{key[1]}" and key[2] == rec.t_started + i
            logged.setdefault(key, []).append((int(acts[i]), float(rews[i])))
    doubled = {k: v for k, v in logged.items() if len(v) > 1}
    assert not doubled, f"steps stored twice: {list(doubled)[:5]}"
    missing = [k for k in clients.acked if k not in logged]
    assert not missing, f"{len(missing)} answered steps missing, e.g. {missing[:5]}"
    for key, action in clients.acked.items():
        assert logged[key][0][0] == action, key
    for key, reward in clients.rewards.items():
        assert logged[key][0][1] == reward, key
    silent = [k for k in logged if k not in clients.acked and k not in clients.told]
    silent = [k for k in silent if k[0] not in dead]
    assert not silent, f"{len(silent)} stored steps their client never heard of: {silent[:5]}"
    return logged


def run_until_every_client_is_told(clients, proc, fault=None, timeout=60):
    """Run the clients until each of them was refused at least once (or ``timeout``), with
    ``fault()`` called once 100 steps were acknowledged; then stop them and the server."""
    clients.up.set()
    for th in clients.threads:
        th.start()
    try:
        if fault is not None:
            wait_for(clients, 100)
            fault()
        end = time.monotonic() + timeout
        while len({c for c, _ in clients.errors}) < len(clients.threads):
            assert time.monotonic() < end, f"clients never told: {clients.errors[:3]}"
            time.sleep(0.05)
    finally:
        clients.stop.set()
        for th in clients.threads:
            th.join(30)
        proc.kill()
        proc.wait(30)
    return [str(e) for _, e in clients.errors]


@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="needs RLIMIT_FSIZE (POSIX)")
@pytest.mark.filterwarnings("ignore::jaxsampler.offline.TruncatedLogWarning")
def test_a_full_disk_is_refused_loudly_and_loses_no_answered_step(tmp_path):
    """The server's files may not grow past 48 KiB: the journal fills first, its failed
    write is cut back, the env closes and every client is told why (503 naming the
    journal's failure); nothing answered is lost once recovery runs with room again."""
    journal, log = tmp_path / "steps.journal", tmp_path / "data.log"
    clients = Clients(4)
    proc, clients.address = start_server(journal, log, max_file_bytes=48 << 10)
    why = run_until_every_client_is_told(clients, proc)
    assert clients.count() > 0
    assert all("journal failed" in w for w in why), why[:3]
    assert journal.stat().st_size <= 48 << 10
    report = recover(journal, log, ExternalEnv(OBS, ACT))
    check_log(log, clients)
    assert report.acknowledged_steps >= clients.count()


@pytest.mark.filterwarnings("ignore::jaxsampler.offline.TruncatedLogWarning")
def test_a_replaced_log_is_refused_loudly_and_the_journal_still_holds_every_step(tmp_path):
    """The sampler's log is deleted and its path made a directory under load: the writer's
    next write fails naming the replacement, the server answers every client 503 with it,
    and recovering the journal into a new log gives every answered step exactly once
    (the old log's rows went with the deleted file; the journal kept them)."""
    journal, log = tmp_path / "steps.journal", tmp_path / "data.log"
    clients = Clients(4)
    proc, clients.address = start_server(journal, log)

    def replace_log():
        log.unlink()
        log.mkdir()

    why = run_until_every_client_is_told(clients, proc, fault=replace_log)
    assert all("no longer names" in w or "replaced" in w for w in why), why[:3]
    assert log.is_dir()  # nothing wrote on into the unlinked file's name
    fresh = tmp_path / "recovered.log"
    report = recover(journal, fresh, ExternalEnv(OBS, ACT))
    check_log(fresh, clients)
    assert report.recovered_steps >= clients.count()
