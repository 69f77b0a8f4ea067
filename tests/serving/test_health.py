"""Liveness between a PolicyServer and its sampler (issue 32, item 3): a sampler that died or
stopped polling turns requests into 503 ``ServerUnavailableError`` with the reason, at once,
instead of a silent wait until ``action_timeout_s``; ``GET /health`` reports the state."""

from __future__ import annotations

import http.client
import json
import threading
import time

import numpy as np
import pytest

from jaxsampler.host_envs.external import EpisodeStateError, ExternalEnv
from jaxsampler.serving import PolicyClient, PolicyServer, ServerUnavailableError
from jaxsampler.serving.protocol import PolicyServerError
from tests.fakes import ACT, OBS, answer

#: long enough that a test finishing well within it did not wait for it
ACTION_TIMEOUT_S = 60.0
OBS0 = np.zeros(3, np.float32)


class Sampler:
    """A sampler thread over ``server`` that answers every step; it can be paused (stops
    polling) and made to die (raises inside :meth:`PolicyServer.sampler_alive`)."""

    def __init__(self, server: PolicyServer):
        self.server = server
        self.running = threading.Event()
        self.running.set()
        self.parked = threading.Event()  # paused, between two polls
        self.die = threading.Event()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with self.server.sampler_alive():
                while not self.stop.is_set():
                    if not self.running.is_set():
                        self.parked.set()
                        self.running.wait()
                        self.parked.clear()
                    r = self.server.poll(timeout=0.02)
                    if r.obs and self.die.is_set():
                        raise OSError(28, "No space left on device")  # as a full disk would
                    acts = {e: {a: answer(o) for a, o in obs.items()} for e, obs in r.obs.items()}
                    self.server.send_actions(acts)
        except OSError as e:
            self.error = e

    def pause(self) -> None:
        """Stops polling; returns once the sampler is parked between two polls."""
        self.running.clear()
        assert self.parked.wait(5)

    def close(self) -> None:
        self.stop.set()
        self.running.set()
        self.thread.join(5)


@pytest.fixture
def sampled(request):
    """``(server, sampler, client)``; ``sampler_timeout_s`` 1 s unless parametrized (a
    shorter one could see a stall in a load spike of a busy test machine)."""
    timeout = getattr(request, "param", 1.0)
    env = ExternalEnv(OBS, ACT, max_wait_s=0.0, action_timeout_s=ACTION_TIMEOUT_S)
    server = PolicyServer(env, sampler_timeout_s=timeout)
    sampler = Sampler(server)
    client = PolicyClient(server.address)
    yield server, sampler, client
    client.close()
    sampler.close()
    server.close()


def raw_get(server: PolicyServer, path: str, headers: dict | None = None):
    host, port = server.address[len("http://") :].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type"), resp.read()
    finally:
        conn.close()


def wait_for(predicate, what: str, limit_s: float = 60.0) -> None:
    """Waits for ``predicate()``; ``limit_s`` is a hang guard only."""
    end = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < end, f"not within {limit_s} s: {what}"
        time.sleep(0.02)


@pytest.mark.parametrize("sampled", [None], indirect=True)  # a load spike is no stall here
def test_sampler_death_answers_waiting_get_action_with_503_and_refuses_new_requests(sampled):
    server, sampler, client = sampled
    eid = client.start_episode()
    assert client.get_action(eid, OBS0) == answer(OBS0)  # served normally first
    status, ctype, body = raw_get(server, "/health")
    assert (status, ctype, json.loads(body)["status"]) == (200, "application/json", "ok")

    sampler.die.set()
    with pytest.raises(ServerUnavailableError) as info:
        client.get_action(eid, OBS0 + 1)  # waits for the sampler, which dies on this step
    # Answered at the death, not at the action timeout: the answer carries the death's reason.
    assert info.value.status == 503
    assert "No space left on device" in info.value.reason and "OSError" in info.value.reason
    assert isinstance(info.value, PolicyServerError)
    sampler.thread.join(5)
    assert isinstance(sampler.error, OSError)  # sampler_alive re-raised it

    # Every request now gets the failure at once, whatever the command.
    with pytest.raises(ServerUnavailableError, match="No space left"):
        client.start_episode()
    with pytest.raises(ServerUnavailableError, match="No space left"):
        client.end_episode(eid, OBS0)
    with pytest.raises(ServerUnavailableError, match="No space left"):
        client.log_action(eid, OBS0, 1)
    status, ctype, body = raw_get(server, "/health")
    report = json.loads(body)
    assert (status, ctype, report["status"]) == (503, "application/json", "failed")
    assert "No space left on device" in report["reason"]
    got = client.health()  # (the clock moved on since the raw GET)
    assert {**got, "since_last_poll_s": None} == {**report, "since_last_poll_s": None}
    assert client.server_info()["protocol"]  # what needs no sampler is still served


@pytest.mark.parametrize("sampled", [None], indirect=True)  # no stall: only fail() answers
def test_fail_wakes_a_waiting_get_action_and_keeps_the_first_reason(sampled):
    server, sampler, client = sampled
    eid = client.start_episode()
    sampler.pause()  # the sampler stops taking steps: get_action waits
    got: list = []

    def call() -> None:
        try:
            client.get_action(eid, OBS0)
        except Exception as e:
            got.append(e)

    caller = threading.Thread(target=call)
    caller.start()
    wait_for(lambda: any(c.waiting for c in list(server._conns)), "get_action waiting")
    assert not got and client.health()["status"] == "ok"
    server.fail("writer thread exited")
    server.fail(RuntimeError("a second report"))
    caller.join(ACTION_TIMEOUT_S)
    assert len(got) == 1 and isinstance(got[0], ServerUnavailableError)
    assert got[0].reason == "the sampler failed: writer thread exited"
    assert client.health()["reason"] == "the sampler failed: writer thread exited"


def test_stalled_sampler_gets_503_then_recovers(sampled):
    server, sampler, client = sampled
    eid = client.start_episode()
    assert client.get_action(eid, OBS0) == answer(OBS0)
    other = client.start_episode()

    sampler.pause()
    with pytest.raises(ServerUnavailableError, match="has not polled for") as info:
        client.get_action(eid, OBS0 + 1)  # waits, then is given up when the stall shows
    # Given up by the stall check (its reason), not by the action timeout.
    assert "sampler_timeout_s=1)" in info.value.reason
    assert server.env.episode_status(eid) == "finishing"  # abandoned, as on a timeout
    # New work is refused at once; closing out work already begun is accepted.
    with pytest.raises(ServerUnavailableError, match="has not polled for"):
        client.start_episode()
    client.log_returns(other, 1.0)
    client.flush()
    status, _, body = raw_get(server, "/health")
    report = json.loads(body)
    assert status == 503 and report["status"] == "stalled"
    assert report["since_last_poll_s"] >= 1.0 and "has not polled for" in report["reason"]

    sampler.running.set()  # polling resumes: served again
    wait_for(lambda: client.health()["status"] == "ok", "health ok after the stall")
    assert client.get_action(other, OBS0 + 2) == answer(OBS0 + 2)
    with pytest.raises(EpisodeStateError):  # the given-up episode stays ended
        client.get_action(eid, OBS0)
    fresh = client.start_episode()
    assert client.get_action(fresh, OBS0) == answer(OBS0)
    status, _, body = raw_get(server, "/health")
    assert status == 200 and json.loads(body)["reason"] is None


def test_no_sampler_yet_is_a_stall_from_the_start():
    env = ExternalEnv(OBS, ACT, action_timeout_s=ACTION_TIMEOUT_S)
    with PolicyServer(env, sampler_timeout_s=0.2) as server, PolicyClient(server.address) as c:
        wait_for(lambda: c.health()["status"] == "stalled", "stalled without a sampler")
        report = c.health()
        assert report["polls"] == 0 and "since the server started" in report["reason"]
        with pytest.raises(ServerUnavailableError, match="since the server started"):
            c.start_episode()
        status, _, body = raw_get(server, "/batch")  # GET of a command path: still 405
        assert status == 405


def test_batch_commands_get_503_after_a_failure(sampled):
    server, _, client = sampled
    eid = client.start_episode()
    server.fail(RuntimeError("sampler crashed"))
    host, port = server.address[len("http://") :].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    from jaxsampler.episodes.codec import packb, unpackb

    body = packb({"commands": [{"command": "log_returns", "episode_id": eid, "reward": 1.0}]})
    conn.request("POST", "/batch", body=body, headers={"Content-Type": "application/msgpack"})
    resp = conn.getresponse()
    result = unpackb(resp.read(), objects=False)
    conn.close()
    assert resp.status == 200 and result["done"] == 0
    [err] = result["errors"]
    assert err["status"] == 503 and err["error"] == "ServerUnavailableError"
    assert "RuntimeError('sampler crashed')" in err["message"]


def test_health_needs_the_token_like_every_path():
    env = ExternalEnv(OBS, ACT)
    with PolicyServer(env, token="s3cret", sampler_timeout_s=None) as server:
        status, _, _ = raw_get(server, "/health")
        assert status == 401
        status, _, body = raw_get(server, "/health", {"Authorization": "Bearer s3cret"})
        report = json.loads(body)
        assert status == 200 and report["status"] == "ok" and report["sampler_timeout_s"] is None
        with PolicyClient(server.address, token="s3cret") as c:
            assert c.health()["status"] == "ok"


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_sampler_timeout_must_be_positive(bad):
    env = ExternalEnv(OBS, ACT)
    with pytest.raises(ValueError, match="sampler_timeout_s"):
        PolicyServer(env, sampler_timeout_s=bad)
    env.close()
