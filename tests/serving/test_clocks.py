"""Clocks that blame the right party (issue 32, item 6).

* :class:`RunningClock` counts only time in which the process ran: a gap between ticks beyond
  ``max_gap_s`` is a pause (fake monotonic clock, no sleeping).
* The external env's reaper measures idle time on it, and after a pause waits until the
  process ran a while (requests that arrived meanwhile are read first); a client that is
  truly silent is still reaped. The same sequence on a clock that sees no pauses (the
  behaviour before) abandons the episode: the reference that the test would fail without
  the fix.
* A real ``SIGSTOP`` / ``SIGCONT`` of a server process (loopback, a few seconds, short
  ``episode_timeout_s``): the clients whose requests waited in socket buffers get their
  actions, a silent client's episode is still abandoned.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from jaxsampler.constants import DEFAULT_AGENT_ID
from jaxsampler.host_envs.external import EpisodeStateError, ExternalEnv
from jaxsampler.host_envs.external.clock import RunningClock, process_clock
from jaxsampler.serving.client import PolicyClient
from jaxsampler.serving.listener import ClientPresence, shift_deadlines
from tests.fakes import ACT, OBS, answer

A = DEFAULT_AGENT_ID
ROOT = Path(__file__).resolve().parents[2]


class Fake:
    """A monotonic clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def o(x: float) -> np.ndarray:
    return np.full(3, x, np.float32)


# -- RunningClock ------------------------------------------------------------------------


def test_running_clock_counts_gaps_up_to_max_gap_and_no_more():
    raw = Fake()
    clock = RunningClock(1.0, raw)
    start = clock.now()
    assert start == raw.t
    for _ in range(10):  # a running process: ticks 0.5 s apart, nothing is a pause
        raw.t += 0.5
        assert clock.tick() == 0.0
    assert clock.now() == pytest.approx(start + 5.0)
    assert clock.paused_s == 0.0 and clock.steady_for() == float("inf")
    raw.t += 20.0  # stopped for 20 s: before the next tick, at most max_gap_s shows
    assert clock.now() == pytest.approx(start + 6.0)
    assert clock.tick() == pytest.approx(19.0)
    assert clock.now() == pytest.approx(start + 6.0)  # no jump back or forward at the tick
    assert clock.paused_s == pytest.approx(19.0) and clock.pauses == 1
    assert clock.steady_for() == pytest.approx(0.0)
    raw.t += 0.25
    assert clock.now() == pytest.approx(start + 6.25)
    assert clock.steady_for() == pytest.approx(0.25)
    raw.t -= 5.0  # a raw clock that went back (a monotonic one cannot): ignored
    assert clock.tick() == 0.0 and clock.now() == pytest.approx(start + 6.0)
    raw.t += 5.5
    assert clock.tick() == 0.0 and clock.now() == pytest.approx(start + 6.75)
    with pytest.raises(ValueError, match="max_gap_s"):
        RunningClock(0.0)


def test_process_clock_is_shared_and_ticked_by_its_heartbeat():
    clock = process_clock()
    assert process_clock() is clock
    names = {t.name for t in threading.enumerate()}
    assert "RunningClock-heartbeat" in names
    a = clock.now()
    threading.Event().wait(0.3)  # three heartbeats
    assert clock.now() > a


# -- the reaper --------------------------------------------------------------------------


def _env(clock: RunningClock) -> ExternalEnv:
    return ExternalEnv(OBS, ACT, episode_timeout_s=5.0, max_wait_s=0.0, clock=clock)


def _run(raw: Fake, clock: RunningClock, env: ExternalEnv, seconds: float) -> None:
    """The process runs for ``seconds``: ticks every 0.5 s, the sampler polls."""
    for _ in range(int(seconds / 0.5)):
        raw.t += 0.5
        clock.tick()
        env.poll(timeout=0)


def _answered_episode(env: ExternalEnv) -> str:
    eid = env.start_episode()
    w = env.submit(eid, {A: o(1)}, None, None, True)
    r = env.poll(timeout=0)
    env.send_actions({e: {A: answer(x[A])} for e, x in r.obs.items()})
    assert w is not None and w.value == {A: answer(o(1))}
    return eid


@pytest.mark.parametrize("sees_pauses", [True, False])
def test_a_pause_is_not_held_against_a_client_whose_request_waits(sees_pauses):
    """The client was answered, thought for 4 s, and sent its next request just as the
    process stopped for 20 s (the request sits in a socket buffer). On resume, the sampler's
    poll runs first; the request is read only after it. With a clock that sees the pause,
    the reaper waits until the process ran again a while, so the request counts; without
    (the behaviour before), the episode is abandoned with its request unread."""
    raw = Fake()
    clock = RunningClock(1.0 if sees_pauses else float("inf"), raw)
    env = _env(clock)
    eid = _answered_episode(env)
    _run(raw, clock, env, 4.0)
    raw.t += 20.0  # SIGSTOP ... SIGCONT
    env.poll(timeout=0)  # the sampler thread runs first: it ticks and would sweep
    status = env.episode_status(eid)
    if not sees_pauses:
        assert status in ("finishing", "abandoned")  # the old behaviour
        env.close()
        return
    assert status == "running"
    w = env.submit(eid, {A: o(2)}, None, None, True)  # the event loop reads the request
    assert w is not None
    r = env.poll(timeout=0)
    assert list(r.obs) == [eid] and not r.truncateds[eid]["__all__"]
    env.send_actions({eid: {A: answer(o(2))}})
    assert w.value == {A: answer(o(2))}
    _run(raw, clock, env, 4.0)  # answered: a fresh 5 s
    assert env.episode_status(eid) == "running"
    env.close()


def test_a_truly_silent_client_is_still_reaped_after_a_pause():
    raw = Fake()
    clock = RunningClock(1.0, raw)
    env = _env(clock)
    silent, talking = _answered_episode(env), _answered_episode(env)
    _run(raw, clock, env, 2.0)
    raw.t += 100.0  # a long pause: none of it counts
    env.poll(timeout=0)
    assert env.episode_status(silent) == "running"
    # The process runs again; "talking" sends a request every 2 s, "silent" never does.
    for step in range(3):
        w = env.submit(talking, {A: o(3 + step)}, None, None, True)
        r = env.poll(timeout=0)
        env.send_actions({e: {A: answer(x[A])} for e, x in r.obs.items() if e == talking})
        assert w is not None and w.value is not None
        _run(raw, clock, env, 2.0)
    # 2 s before the pause + 1 s of the gap + 6 s after it > 5 s: reaped, truncated
    assert env.episode_status(silent) in ("finishing", "abandoned")
    assert env.episode_status(talking) == "running"
    assert env.stats["abandoned"] == 1
    env.close()


def test_an_in_process_get_action_deadline_skips_a_pause():
    """``action_timeout_s`` of an in-process get_action counts running time too."""
    raw = Fake()
    clock = RunningClock(1.0, raw)
    env = ExternalEnv(OBS, ACT, action_timeout_s=0.5, episode_timeout_s=None, clock=clock)
    eid = env.start_episode()
    got: list = []
    t = threading.Thread(target=lambda: got.append(env.get_action(eid, o(1))))
    t.start()
    r = None
    for _ in range(200):  # wait (bounded) until the request is ready, then pause 60 s
        r = env.poll(timeout=0.05)
        if r.obs:
            break
    assert r is not None and list(r.obs) == [eid]
    raw.t += 60.0
    clock.tick()
    env.send_actions({eid: {A: 7}})
    t.join(timeout=10)
    assert got == [7]
    env.close()


# -- connection deadlines and presence -----------------------------------------------------


class _Conn:
    def __init__(self) -> None:
        self.last_activity, self.write_paused_since, self.deadline = 10.0, 11.0, 12.0
        self.req = type("R", (), {"started": 13.0})()

    def shift_deadlines(self, pause: float) -> None:
        self.deadline += pause


def test_shift_deadlines_moves_every_connection_clock():
    c = _Conn()
    shift_deadlines(c, 5.0)  # type: ignore[arg-type]
    assert (c.last_activity, c.write_paused_since, c.deadline, c.req.started) == (
        15.0,
        16.0,
        17.0,
        18.0,
    )


def test_client_presence_grace():
    p = ClientPresence(10.0)
    p.opened("a")
    p.opened("a")  # two connections
    p.opened(None)
    p.closed("a", 0.0, by_peer=True)
    assert p.connected("a") and p.gone(100.0) == []
    p.closed("a", 1.0, by_peer=True)  # the last one: the grace starts
    assert not p.connected("a")
    assert p.gone(10.9) == [] and p.gone(11.0) == ["a"] and p.gone(50.0) == []  # once
    p.closed(None, 2.0, by_peer=False)  # the server closed it: says nothing of the client
    assert p.gone(100.0) == []
    p.opened("b")
    p.closed("b", 3.0, by_peer=True)
    p.opened("b")  # came back in time
    assert p.gone(100.0) == []
    with pytest.raises(ValueError, match="grace_s"):
        ClientPresence(-1.0)


# -- a real SIGSTOP ----------------------------------------------------------------------

_SERVER = """
import sys, threading
from jaxsampler.host_envs.external import ExternalEnv
from jaxsampler.serving.server import PolicyServer
from tests.fakes import ACT, OBS, PollLoop
env = ExternalEnv(OBS, ACT, max_wait_s=0.0, episode_timeout_s=2.0, action_timeout_s=2.0)
server = PolicyServer(env, port=0, sampler_timeout_s=None)
loop = PollLoop(server)
print(server.address, flush=True)
for line in sys.stdin:  # "<episode id>": its status; the test closes stdin at the end
    print(env.episode_status(line.strip()), flush=True)
loop.close()
server.close()
"""


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP")
def test_a_stopped_server_keeps_the_episodes_of_waiting_clients():
    """A server process stopped for 4 s (twice ``episode_timeout_s`` and
    ``action_timeout_s``): the two clients that sent a ``get_action`` meanwhile get their
    actions and keep their episodes; a client that went silent before the stop loses its
    episode once the process ran ``episode_timeout_s`` (+ 2 s settling) again."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().strip()
        assert address.startswith("http://127.0.0.1:"), address
        clients = [PolicyClient(address, timeout=30) for _ in range(3)]
        eids = [c.start_episode() for c in clients]
        for c, e in zip(clients, eids, strict=True):
            assert c.get_action(e, o(1)) == answer(o(1))
        proc.send_signal(signal.SIGSTOP)
        results: dict = {}

        def ask(i: int) -> None:
            try:
                results[i] = clients[i].get_action(eids[i], o(2))
            except Exception as e:  # pragma: no cover - reported by the assertion below
                results[i] = e

        threads = [threading.Thread(target=ask, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        time.sleep(4.0)  # the requests sit in the stopped server's socket buffers
        proc.send_signal(signal.SIGCONT)
        for t in threads:
            t.join(timeout=20)
        assert results == {0: answer(o(2)), 1: answer(o(2))}
        for i in (0, 1):  # still running: the next calls are answered
            assert clients[i].get_action(eids[i], o(3)) == answer(o(3))

        # Client 2 stayed silent: abandoned after 2 s + 2 s of running time (bounded wait).
        def status(eid: str) -> str:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(eid + "\n")
            proc.stdin.flush()
            return proc.stdout.readline().strip()

        assert status(eids[2]) == "running"  # the stop did not count against it either
        for _ in range(20):  # bounded: 2 s + 2 s settling + a sweep are due well before
            time.sleep(0.5)
            for i in (0, 1):  # the talking ones keep their episodes alive
                assert clients[i].get_action(eids[i], o(4)) == answer(o(4))
            if status(eids[2]) != "running":
                break
        assert status(eids[2]) in ("finishing", "abandoned")
        assert [status(e) for e in eids[:2]] == ["running", "running"]
        with pytest.raises(EpisodeStateError, match="abandoned"):
            clients[2].get_action(eids[2], o(5))
        for c in clients:
            c.close()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            if proc.stdin is not None:
                proc.stdin.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
