"""PolicyServer / PolicyClient at the HTTP edges.

Pipelining, ``Connection: close`` and HTTP/1.0, chunked / malformed / oversized requests,
get_action timeouts and shutdown, keep-alive reaping, ``log_action`` back pressure and the
deferred ``returns`` of protocol version 2. Loopback only; every wait is bounded (raw
sockets have a timeout, threads are joined with one).
"""

from __future__ import annotations

import asyncio
import gc
import json
import select
import socket
import threading
import time
import warnings

import httptools
import numpy as np
import pytest

from jaxsampler.constants import ALL_AGENTS
from jaxsampler.envs.base import DEFAULT_AGENT_ID as AGENT
from jaxsampler.episodes.codec import packb, unpackb
from jaxsampler.host_envs.external import (
    EnvClosedError,
    EpisodeStateError,
    ExternalEnv,
    ExternalMultiAgentEnv,
)
from jaxsampler.serving.client import PolicyClient
from jaxsampler.serving.server import PROTOCOL_VERSION, PolicyServer, PolicyServerError
from tests.fakes import ACT, OBS, PollLoop, answer, wait_finished

MP = "application/msgpack"


# -- helpers ---------------------------------------------------------------------------------


def connect(server: PolicyServer, timeout: float = 5.0) -> socket.socket:
    host, port = server.address[len("http://") :].rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout)


def post(path: str, msg: dict, version: str = "1.1", extra: bytes = b"") -> bytes:
    body = packb(msg)
    return (
        (
            f"POST {path} HTTP/{version}\r\nHost: t\r\nContent-Type: {MP}\r\n"
            f"Content-Length: {len(body)}\r\n"
        ).encode()
        + extra
        + b"\r\n"
        + body
    )


def get(path: str, version: str = "1.1", extra: bytes = b"") -> bytes:
    return f"GET {path} HTTP/{version}\r\nHost: t\r\n".encode() + extra + b"\r\n"


class Responses:
    """HTTP responses read off a raw socket with httptools (several may come in one read)."""

    def __init__(self, sock: socket.socket):
        self.sock, self.done, self.cur = sock, [], None
        self.parser = httptools.HttpResponseParser(self)

    def on_message_begin(self) -> None:
        self.cur = {"headers": {}, "body": b""}

    def on_header(self, name: bytes, value: bytes) -> None:
        self.cur["headers"][name.decode().lower()] = value.decode()

    def on_headers_complete(self) -> None:
        self.cur["status"] = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.cur["body"] += body

    def on_message_complete(self) -> None:
        self.done.append(self.cur)

    def read(self, n: int) -> list[dict]:
        """The next ``n`` responses (the socket's timeout bounds the wait)."""
        while len(self.done) < n:
            data = self.sock.recv(1 << 16)
            assert data, f"connection closed after {len(self.done)} of {n} responses"
            self.parser.feed_data(data)
        out, self.done = self.done[:n], self.done[n:]
        return out

    def closed(self) -> bool:
        """True when the server closed the connection with nothing more to read."""
        try:
            return self.sock.recv(1 << 16) == b"" and not self.done
        except ConnectionResetError:
            return not self.done


def json_error(resp: dict, status: int) -> dict:
    assert resp["status"] == status and resp["headers"]["content-type"] == "application/json", resp
    err = json.loads(resp["body"])
    assert err["error"] and err["message"]
    return err


def capture(fn, *args):
    """``fn(*args)``, or the exception it raised."""
    try:
        return fn(*args)
    except Exception as e:
        return e


def until(cond, timeout: float = 30.0) -> None:
    """Waits for ``cond()``; ``timeout`` is a hang guard only (generous: the suite runs on
    pytest-xdist workers that share the cores, and a 5 s guard failed on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def poll_until(server: PolicyServer, eids: set, timeout: float = 30.0) -> None:
    """Polls (as a sampler would) until every episode in ``eids`` delivered a request."""
    seen: set = set()
    deadline = time.monotonic() + timeout
    while not eids <= seen:
        assert time.monotonic() < deadline, f"requests of {eids - seen} not polled in time"
        seen |= set(server.poll(timeout=0.05).obs)


OB = [np.full(3, float(i), np.float32) for i in range(5)]


# -- framing ---------------------------------------------------------------------------------


def test_pipelined_requests_are_answered_in_order(served):
    server, loop, _ = served
    with connect(server) as sock:
        sock.sendall(
            post("/start_episode", {"episode_id": "p"})
            + post("/get_action", {"episode_id": "p", "observation": OB[1]})
            + get("/info")
            + post("/start_episode", {"episode_id": "p"})
            + get("/nowhere")
            + post("/end_episode", {"episode_id": "p", "observation": OB[2]})
        )
        r = Responses(sock).read(6)
    assert [x["status"] for x in r] == [200, 200, 200, 409, 404, 200]
    assert unpackb(r[0]["body"]) == {"episode_id": "p"}
    assert int(unpackb(r[1]["body"])["action"]) == answer(OB[1])
    assert unpackb(r[2]["body"])["protocol"] == PROTOCOL_VERSION
    assert "already been started" in json_error(r[3], 409)["message"]
    json_error(r[4], 404)
    wait_finished(server.env, ["p"])
    assert len(loop.steps["p"]) == 2


def test_request_pipelined_behind_a_waiting_get_action_waits_its_turn(served):
    server, loop, holds = served
    holds.add("h")
    server.env.start_episode("h")
    with connect(server) as sock:
        sock.sendall(post("/get_action", {"episode_id": "h", "observation": OB[1]}) + get("/info"))
        until(lambda: "h" in loop.held)  # the sampler has the request; its answer is held back
        assert select.select([sock], [], [], 0.2)[0] == []  # /info is not answered before it
        holds.discard("h")
        r = Responses(sock).read(2)
    assert [x["status"] for x in r] == [200, 200]
    assert int(unpackb(r[0]["body"])["action"]) == answer(OB[1]) and "protocol" in unpackb(
        r[1]["body"]
    )


def test_connection_close_and_http10_are_answered_then_closed(served):
    server, *_ = served
    for data in (
        get("/info", version="1.0"),
        get("/info", extra=b"Connection: close\r\n") + get("/info"),  # the second is not answered
        post("/start_episode", {"episode_id": "c10"}, version="1.0"),
    ):
        with connect(server) as sock:
            sock.sendall(data)
            rs = Responses(sock)
            (r,) = rs.read(1)
            assert r["status"] == 200 and r["headers"]["connection"] == "close"
            assert rs.closed()
    assert server.env.episode_status("c10") == "running"


def test_missing_length_and_chunked_bodies_get_411_and_serving_goes_on(served):
    server, *_ = served
    for data in (
        b"POST /start_episode HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\n",
        b"POST /start_episode HTTP/1.1\r\nHost: t\r\n\r\n",
    ):
        with connect(server) as sock:
            sock.sendall(data)
            rs = Responses(sock)
            (r,) = rs.read(1)
            assert "Content-Length" in json_error(r, 411)["message"]
            assert rs.closed()
    with PolicyClient(server.address) as c:
        eid = c.start_episode()
        assert c.get_action(eid, OB[1]) == answer(OB[1])


@pytest.mark.parametrize(
    "data",
    [
        b"GARBAGE\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS ClientHello
        b"GET /info HTTP/1.1\r\nHost t\r\n\r\n",  # a header without a colon
        b"GET /info HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    ],
)
def test_malformed_request_gets_400_json_and_the_connection_closes(served, data):
    server, *_ = served
    with connect(server) as sock:
        sock.sendall(data)
        rs = Responses(sock)
        (r,) = rs.read(1)
        assert json_error(r, 400)["error"] == "InvalidDataError"
        assert r["headers"]["connection"] == "close" and rs.closed()
    with PolicyClient(server.address) as c:
        assert c.server_info()["protocol"] == PROTOCOL_VERSION


def test_requests_before_a_malformed_one_are_answered_first(served):
    server, *_ = served
    with connect(server) as sock:
        sock.sendall(
            get("/info") + post("/start_episode", {"episode_id": "m"}) + b"GARBAGE\r\n\r\n"
        )
        rs = Responses(sock)
        r = rs.read(3)
        assert [x["status"] for x in r] == [200, 200, 400] and rs.closed()
    assert server.env.episode_status("m") == "running"


def test_unparsable_url_gets_400_and_does_not_stall_other_answers():
    """A bad URL pipelined behind a get_action is dispatched while the loop delivers a batch
    of answers: it gets its 400, and the other connection's answer is not held up."""
    env = ExternalEnv(OBS, ACT, max_wait_s=0.0)
    with PolicyServer(env) as server:
        env.start_episode("a")
        env.start_episode("b")
        with connect(server, timeout=3.0) as sa, connect(server, timeout=3.0) as sb:
            sa.sendall(
                post("/get_action", {"episode_id": "a", "observation": OB[1]})
                + b"GET http://[ HTTP/1.1\r\nHost: t\r\n\r\n"
                + get("/info")
            )
            sb.sendall(post("/get_action", {"episode_id": "b", "observation": OB[2]}))
            poll_until(server, {"a", "b"})
            server.send_actions({"a": {AGENT: 1}, "b": {AGENT: 2}})  # a's answer is delivered first
            ra, (rb,) = Responses(sa).read(3), Responses(sb).read(1)
    assert [x["status"] for x in ra] == [200, 400, 200]
    assert int(unpackb(ra[0]["body"])["action"]) == 1 and "URL" in json_error(ra[1], 400)["message"]
    assert rb["status"] == 200 and int(unpackb(rb["body"])["action"]) == 2


def test_oversized_body_gets_413_without_being_read(served):
    server, *_ = served
    big = b"\0" * (4 << 20)  # far more than the socket buffers: the server must drain, not read it
    with connect(server) as sock:
        sock.sendall(
            (
                f"POST /log_action HTTP/1.1\r\nHost: t\r\nContent-Type: {MP}\r\n"
                f"Content-Length: {len(big)}\r\n\r\n"
            ).encode()
            + big
        )
        rs = Responses(sock)
        (r,) = rs.read(1)
        assert "max_body_bytes" in json_error(r, 413)["message"]
        assert r["headers"]["connection"] == "close" and rs.closed()
    with PolicyClient(server.address) as c:
        eid = c.start_episode()
        with pytest.raises(PolicyServerError) as e:
            c.get_action(eid, np.zeros(1 << 20, np.float32))  # a 4 MB body from the client itself
        assert e.value.status == 413
        assert c.get_action(eid, OB[1]) == answer(
            OB[1]
        )  # the same client goes on, on a new connection


def test_any_request_body_over_max_body_bytes_gets_413(served):
    """A GET with a huge body is refused too: it is not buffered in the server's memory."""
    server, *_ = served
    with connect(server) as sock:
        sock.sendall(
            get("/info", extra=f"Content-Length: {4 << 20}\r\n".encode()) + b"\0" * (4 << 20)
        )
        rs = Responses(sock)
        (r,) = rs.read(1)
        assert "max_body_bytes" in json_error(r, 413)["message"] and rs.closed()


# -- waiting, timeouts, shutdown -------------------------------------------------------------


def test_unanswered_get_action_gets_504_and_only_its_episode_is_abandoned():
    env = ExternalEnv(OBS, ACT, max_wait_s=0.002, action_timeout_s=0.3)
    holds = {"slow"}
    with PolicyServer(env) as server:
        loop = PollLoop(server, hold=lambda eid: eid in holds)
        try:
            slow, fast = PolicyClient(server.address), PolicyClient(server.address)
            slow.start_episode("slow")
            fast.start_episode("fast")
            done = threading.Event()
            fast_actions: list = []

            def step_fast():  # keeps stepping while "slow" waits
                t = 0
                while not done.is_set() and t < 1000:
                    fast_actions.append(
                        fast.get_action("fast", np.array([t, 0, 0], np.float32))
                        == answer([t, 0, 0])
                    )
                    t += 1

            th = threading.Thread(target=step_fast)
            th.start()
            with pytest.raises(TimeoutError, match="abandoned"):  # the action timeout's answer
                slow.get_action("slow", OB[1])
            done.set()
            th.join(5)
            assert not th.is_alive() and len(fast_actions) > 1 and all(fast_actions)
            with pytest.raises(EpisodeStateError, match="abandoned"):
                slow.get_action("slow", OB[1])
            holds.clear()  # the late answer frees the step; the episode's truncated end follows
            fast.end_episode("fast", OB[2])
            wait_finished(env, ["slow", "fast"])
            slow.close()
            fast.close()
        finally:
            loop.close()
    assert env.episode_status("slow") == "abandoned" and env.episode_status("fast") == "completed"
    last = loop.steps["slow"][-1]
    assert last[3][ALL_AGENTS] and last[4][AGENT] == {"abandoned": True}


def test_answer_racing_the_timeout_is_delivered():
    """The sampler's answer lands in the same loop turn as the get_action timer: the client
    gets its action, not a 504 for an episode that was never abandoned."""
    env = ExternalEnv(OBS, ACT, max_wait_s=0.0)
    with PolicyServer(env) as server:
        client = PolicyClient(server.address)
        eid = client.start_episode()
        out: dict = {}
        th = threading.Thread(target=lambda: out.update(r=capture(client.get_action, eid, OB[1])))
        th.start()
        poll_until(server, {eid})

        def race():  # in the event loop: the answer arrives, then the timer fires
            server.send_actions({eid: {AGENT: 5}})
            conn = next(c for c in server._conns if c.waiting is not None)
            server._expire(conn, eid, env.action_timeout_s)

        server._loop.call_soon_threadsafe(race)
        th.join(5)
        assert not th.is_alive() and out == {"r": 5}
        assert env.episode_status(eid) == "running"
        client.close()


def test_close_while_get_action_waits_fails_the_call_without_hanging():
    env = ExternalEnv(OBS, ACT)
    server = PolicyServer(env)
    client = PolicyClient(server.address, timeout=10.0)
    eid = client.start_episode()
    out: dict = {}
    th = threading.Thread(target=lambda: out.update(r=capture(client.get_action, eid, OB[1])))
    th.start()
    poll_until(server, {eid})  # delivered to the "sampler", never answered
    closer = threading.Thread(target=server.close)
    closer.start()
    closer.join(60)  # a hang guard only
    assert not closer.is_alive(), "close() hangs while a get_action waits"
    th.join(60)
    assert not th.is_alive()
    assert isinstance(out["r"], (EnvClosedError, ConnectionError)), out
    with pytest.raises(ConnectionError):  # nobody listens any more
        client.server_info()
    client.close()


def test_close_right_after_start_stops_the_server(monkeypatch):
    """close() before the loop thread reached run_forever still stops it (no long join, no
    thread left serving the port)."""

    class LateLoop(asyncio.SelectorEventLoop):
        def run_forever(self):
            time.sleep(0.2)  # a loaded machine: the loop thread is slow to get going
            super().run_forever()

    monkeypatch.setattr(asyncio, "new_event_loop", LateLoop)
    server = PolicyServer(ExternalEnv(OBS, ACT))
    server.close()  # returns with the loop thread gone (not after a join that gave up)
    assert not server._thread.is_alive()
    with pytest.raises(OSError):
        connect(server, timeout=1.0)


def test_idle_connection_is_reaped_busy_one_is_not_and_the_client_reconnects():
    env = ExternalEnv(OBS, ACT, max_wait_s=0.0)
    holds = {"busy"}
    with PolicyServer(env, keepalive_timeout_s=0.1) as server:
        loop = PollLoop(server, hold=lambda eid: eid in holds)
        try:
            busy, idle = PolicyClient(server.address), PolicyClient(server.address)
            busy.start_episode("busy")
            out: dict = {}
            th = threading.Thread(
                target=lambda: out.update(r=capture(busy.get_action, "busy", OB[1]))
            )
            th.start()
            until(lambda: "busy" in loop.held)
            eid = idle.start_episode()  # after busy's request: its connection is the younger one
            first = idle._tls.conn.sock
            # The reaper (once a second) closes the idle connection ...
            assert select.select([first], [], [], 3.0)[0] and first.recv(1, socket.MSG_PEEK) == b""
            # ... but not the one whose get_action waits, older as it is.
            holds.clear()
            th.join(5)
            assert not th.is_alive() and out == {"r": answer(OB[1])}
            # The next call retries once on a fresh connection, transparently.
            assert idle.get_action(eid, OB[2]) == answer(OB[2])
            assert idle._tls.conn.sock is not first
            idle.end_episode(eid, OB[3])
            busy.end_episode("busy", OB[3])
            wait_finished(env, [eid, "busy"])
            idle.close()
            busy.close()
        finally:
            loop.close()


def test_log_action_under_back_pressure_waits_off_the_event_loop():
    env = ExternalEnv(OBS, ACT, max_wait_s=0.0, max_queued_steps=1)
    with PolicyServer(env) as server:
        a, b = PolicyClient(server.address), PolicyClient(server.address)
        eid = a.start_episode()
        a.log_action(eid, OB[0], 1)  # room for one step: returns at once
        out: dict = {}
        th = threading.Thread(target=lambda: out.update(r=capture(a.log_action, eid, OB[1], 2)))
        th.start()
        until(lambda: env._episodes[eid].blocked == 1)  # waits for the poller to make room
        other = b.start_episode()  # meanwhile the event loop serves other connections
        assert b.server_info()["protocol"] == PROTOCOL_VERSION
        assert th.is_alive() and env._episodes[eid].blocked == 1  # (nothing polls yet)
        loop = PollLoop(server)
        try:
            th.join(5)
            assert not th.is_alive() and out == {"r": None}
            a.end_episode(eid, OB[2])
            b.end_episode(other, OB[2])
            wait_finished(env, [eid, other])
            a.close()
            b.close()
        finally:
            loop.close()
    assert [s[5] for s in loop.steps[eid]] == [{AGENT: 1}, {AGENT: 2}, None]


def test_log_action_back_pressure_times_out_with_504():
    env = ExternalEnv(OBS, ACT, max_queued_steps=1, action_timeout_s=0.3)
    with PolicyServer(env) as server:
        c = PolicyClient(server.address)
        eid = c.start_episode()
        c.log_action(eid, OB[0], 1)
        with pytest.raises(TimeoutError, match=r"not polled within 0\.3 s"):  # the timeout's answer
            c.log_action(eid, OB[1], 2)
        assert c.server_info()["protocol"] == PROTOCOL_VERSION  # the connection is still usable
        c.close()


# -- deferred log_returns (protocol v2 "returns") ---------------------------------------------


def test_deferred_returns_reach_the_right_steps(served):
    server, loop, _ = served
    c = PolicyClient(server.address)
    other = PolicyClient(server.address, client_id=c.client_id)  # same owner, own connection
    e1 = c.start_episode()
    c.get_action(e1, OB[0])
    c.log_returns(e1, 1.0)
    c.log_returns(e1, 2.0, {"k": 1})
    c.get_action(e1, OB[1])  # carries 3.0 (and the info) for the step before
    c.log_returns(e1, 4.0)
    c.end_episode(e1, OB[2])  # carries 4.0
    e2 = c.start_episode()
    c.get_action(e2, OB[0])
    c.log_returns(e2, 5.0)
    c.flush()  # sent now: another client ends the episode
    other.end_episode(e2, OB[1])
    e3 = c.start_episode()
    c.get_action(e3, OB[0])
    c.log_returns(e3, 6.0)
    c.close()  # flushes too
    other.end_episode(e3, OB[1])
    wait_finished(server.env, [e1, e2, e3])
    other.close()
    rewards = {e: [s[1][AGENT] for s in loop.steps[e]] for e in (e1, e2, e3)}
    assert rewards == {e1: [0.0, 3.0, 4.0], e2: [0.0, 5.0], e3: [0.0, 6.0]}
    assert loop.steps[e1][1][4] == {AGENT: {"k": 1}}


def test_deferred_returns_survive_a_request_that_cannot_be_encoded(served):
    server, loop, _ = served
    c = PolicyClient(server.address)
    eid = c.start_episode()
    c.get_action(eid, OB[0])
    c.log_returns(eid, 1.5)
    with pytest.raises(TypeError):  # fails in the client, before anything is sent
        c.get_action(eid, object())
    assert c.get_action(eid, OB[1]) == answer(OB[1])
    c.end_episode(eid, OB[2])
    wait_finished(server.env, [eid])
    c.close()
    assert [s[1][AGENT] for s in loop.steps[eid]] == [0.0, 1.5, 0.0]


def test_deferred_multi_agent_returns():
    env = ExternalMultiAgentEnv(OBS, ACT, agent_ids=("a", "b"), max_wait_s=0.002)
    o = {"a": OB[1], "b": OB[2]}
    with PolicyServer(env) as server:
        loop = PollLoop(server)
        try:
            c = PolicyClient(server.address)
            eid = c.start_episode()
            c.get_action(eid, o)
            c.log_returns(eid, {"a": 1.0, "b": 2.0})
            c.log_returns(eid, {"a": 0.5}, {"b": {"x": 1}})
            assert c.get_action(eid, o) == {"a": answer(o["a"]), "b": answer(o["b"])}
            c.log_returns(eid, {"b": 3.0}, multiagent_done_dict={"b": True})
            assert c.get_action(eid, o) == {"a": answer(o["a"])}  # b's final observation: no action
            c.log_returns(eid, {"a": 7.0})
            c.flush()
            c.end_episode(eid, {"a": o["a"]})
            wait_finished(env, [eid])
            c.close()
        finally:
            loop.close()
    s = loop.steps[eid]
    assert [x[1] for x in s] == [
        {"a": 0.0, "b": 0.0},
        {"a": 1.5, "b": 2.0},
        {"a": 0.0, "b": 3.0},
        {"a": 7.0},
    ]
    assert s[1][4] == {"a": {}, "b": {"x": 1}}
    assert s[2][2] == {"a": False, "b": True, ALL_AGENTS: False} and s[3][2] == {
        "a": True,
        ALL_AGENTS: True,
    }


# -- construction ------------------------------------------------------------------------------


def test_binding_a_port_in_use_raises_oserror():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        gc.collect()  # only what the failed constructor leaves behind is looked at below
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(OSError):
                PolicyServer(ExternalEnv(OBS, ACT), port=s.getsockname()[1])
            gc.collect()
        leaks = [
            w
            for w in caught
            if issubclass(w.category, ResourceWarning) and "event loop" in str(w.message)
        ]
        assert not leaks, leaks  # the failed constructor closed its event loop
    with PolicyServer(ExternalEnv(OBS, ACT)) as first:
        with pytest.raises(OSError):
            PolicyServer(ExternalEnv(OBS, ACT), port=int(first.address.rsplit(":", 1)[1]))
        with PolicyClient(first.address) as c:  # the first one still serves
            assert c.server_info()["protocol"] == PROTOCOL_VERSION


def test_an_answer_that_cannot_be_encoded_fails_only_its_call():
    """A 500 for the client whose action msgpack cannot encode; the other answers of the
    same batch still go out and the server keeps serving."""
    env = ExternalEnv(OBS, ACT, max_wait_s=0.5)
    server = PolicyServer(env)
    res = {}

    def client(name):
        c = PolicyClient(server.address, timeout=10.0)
        eid = c.start_episode(episode_id=name)
        try:
            res[name] = c.get_action(eid, np.zeros(3, np.float32))
        except PolicyServerError as e:
            res[name] = e.status
        c.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in ("a-bad", "b-good")]
    for t in threads:
        t.start()
    got = {}
    while len(got) < 2:
        got.update(server.poll(timeout=5.0).obs)
    server.send_actions({e: {AGENT: (object() if e == "a-bad" else 7)} for e in sorted(got)})
    for t in threads:
        t.join(timeout=10)
    assert res == {"a-bad": 500, "b-good": 7}
    server.close()
