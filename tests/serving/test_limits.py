"""PolicyServer limits: what a hostile or broken peer can make the server hold.

Each test is a reproducer of a finding against the earlier server: URLs and headers
without a size limit, requests pipelined behind a waiting ``get_action`` buffered without
limit, slow senders keeping a connection forever (slow-loris), unbounded ``/batch`` item
counts and episode ids, no connection cap. Loopback only; every wait is bounded.
"""

from __future__ import annotations

import select
import threading
import time

import numpy as np
import pytest

from jaxsampler.envs.base import DEFAULT_AGENT_ID as AGENT
from jaxsampler.episodes.codec import unpackb
from jaxsampler.host_envs.external import CapacityError, ExternalEnv, InvalidDataError
from jaxsampler.serving.client import PolicyClient
from jaxsampler.serving.server import PROTOCOL_VERSION, PolicyServer
from tests.fakes import ACT, OBS, PollLoop, answer
from tests.serving.test_http_edges import (
    OB,
    Responses,
    connect,
    get,
    json_error,
    post,
    until,
)


def only_conn(server: PolicyServer):
    """The server side of the one open connection."""
    until(lambda: len(server._conns) == 1)
    return next(iter(server._conns))


# -- request size ------------------------------------------------------------------------------


def test_url_over_the_limit_gets_414_and_at_the_limit_is_served():
    with PolicyServer(ExternalEnv(OBS, ACT), max_url_bytes=100) as server:
        with connect(server) as sock:
            url = "/info?" + "a" * (100 - len("/info?"))  # exactly 100 bytes: served
            sock.sendall(get(url))
            (r,) = Responses(sock).read(1)
            assert r["status"] == 200 and unpackb(r["body"])["protocol"] == PROTOCOL_VERSION
        with connect(server) as sock:
            sock.sendall(get("/info?" + "a" * 95))  # 101 bytes
            rs = Responses(sock)
            (r,) = rs.read(1)
            assert "max_url_bytes=100" in json_error(r, 414)["message"] and rs.closed()


def test_huge_url_in_small_pieces_is_refused_once_over_the_limit():
    """The old server rebuilt the URL with ``+=`` for every fragment and answered a 16 MiB
    URL with 200; now the parts stop growing at the limit and the request gets 414."""
    server = PolicyServer(ExternalEnv(OBS, ACT), max_url_bytes=2048)
    with server, connect(server) as sock:
        sock.sendall(b"GET /info?")
        conn = only_conn(server)
        for _ in range(8):  # fragments arrive in separate reads
            sock.sendall(b"a" * 1000)
            time.sleep(0.01)
        rs = Responses(sock)
        (r,) = rs.read(1)
        assert json_error(r, 414)["error"] == "URITooLong" and rs.closed()
        assert conn.req is None and conn.broken  # parsing stopped, the parts were dropped


@pytest.mark.parametrize(
    "extra, what",
    [
        (b"".join(b"X-H%d: v\r\n" % i for i in range(65)), "count"),
        (b"X-Big: " + b"v" * 17000 + b"\r\n", "bytes"),
        (b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 600) for i in range(30)), "bytes in all"),
    ],
)
def test_too_many_or_too_large_headers_get_431(extra, what):
    with PolicyServer(ExternalEnv(OBS, ACT)) as server:  # defaults: 64 headers, 16 KiB
        with connect(server) as sock:
            sock.sendall(get("/info", extra=extra))
            rs = Responses(sock)
            (r,) = rs.read(1)
            assert "max_header" in json_error(r, 431)["message"], what
            assert rs.closed()
        with connect(server) as sock:  # 64 small headers are fine
            sock.sendall(get("/info", extra=b"".join(b"X-H%d: v\r\n" % i for i in range(63))))
            assert Responses(sock).read(1)[0]["status"] == 200


def test_a_header_that_never_ends_is_refused_without_being_buffered():
    """httptools keeps a header's bytes until the header is complete; the server counts raw
    head bytes too, so an endless header is refused while it is still arriving."""
    server = PolicyServer(ExternalEnv(OBS, ACT), max_header_bytes=4096)
    with server, connect(server) as sock:
        sock.sendall(b"GET /info HTTP/1.1\r\nX-Endless: ")
        conn = only_conn(server)
        rs = Responses(sock)
        sent = 0
        while sent < (1 << 20):
            sock.sendall(b"v" * 4096)
            sent += 4096
            if conn.broken:
                break
            time.sleep(0.002)
        assert conn.broken and sent < (1 << 20)
        (r,) = rs.read(1)
        assert json_error(r, 431)["error"] == "HeadersTooLarge"


def test_long_episode_ids_get_400():
    env = ExternalEnv(OBS, ACT)
    with PolicyServer(env, max_episode_id_len=16) as server, PolicyClient(server.address) as c:
        with pytest.raises(InvalidDataError, match="max_episode_id_len=16"):
            c.start_episode("e" * 17)
        assert c.start_episode("e" * 16) == "e" * 16
        with pytest.raises(InvalidDataError, match="max_episode_id_len"):
            c.get_action("e" * 1000, OB[1])
        assert env.running_episodes() == ["e" * 16]


def test_batch_with_too_many_commands_gets_413_and_nothing_runs():
    env = ExternalEnv(OBS, ACT)
    with PolicyServer(env, max_batch_commands=8) as server:
        cmds = [{"command": "start_episode", "episode_id": f"b{i}"} for i in range(9)]
        with connect(server) as sock:
            sock.sendall(post("/batch", {"commands": cmds}))
            r = Responses(sock).read(1)[0]
            assert "max_batch_commands=8" in json_error(r, 413)["message"]
            returns = [{"episode_id": "b0", "reward": 1.0}] * 9
            sock.sendall(post("/start_episode", {"episode_id": "x", "returns": returns}))
            r = Responses(sock).read(1)[0]
            assert json_error(r, 413)["error"] == "PayloadTooLarge"
            sock.sendall(post("/batch", {"commands": cmds[:8]}))  # at the limit: runs
            r = Responses(sock).read(1)[0]
            assert r["status"] == 200 and unpackb(r["body"]) == {"done": 8, "errors": []}
        assert sorted(env.running_episodes()) == [f"b{i}" for i in range(8)]


def test_client_splits_deferred_returns_into_batches_the_server_accepts():
    env = ExternalEnv(OBS, ACT, max_wait_s=0.0)
    with PolicyServer(env, max_batch_commands=8) as server:
        loop = PollLoop(server)
        try:
            c = PolicyClient(server.address, max_batch_commands=8)
            eid = c.start_episode()
            c.get_action(eid, OB[0])
            for _ in range(20):  # more than one request may carry
                c.log_returns(eid, 0.5)
            c.end_episode(eid, OB[1])
            c.close()
            until(lambda: env.episode_status(eid) == "completed")
        finally:
            loop.close()
    assert [s[1][AGENT] for s in loop.steps[eid]] == [0.0, 10.0]


def test_array_budget_follows_the_spaces_and_big_observations_are_refused():
    env = ExternalEnv(OBS, ACT)
    with PolicyServer(env, max_body_bytes=1 << 20) as server:
        assert server.max_array_bytes == 64 << 10  # OBS: 3 items -> the 64 KiB floor
        with PolicyClient(server.address) as c:
            eid = c.start_episode()
            with pytest.raises(InvalidDataError):  # 400, the episode goes on
                c.get_action(eid, np.zeros(100_000, np.float32))
            assert env.episode_status(eid) == "running"
    big = ExternalEnv(type(OBS)(-1, 1, (128, 128)), ACT)
    with PolicyServer(big) as server:
        assert server.max_array_bytes == 128 * 128 * 8
        # The limit is per array: a /batch of many observations (a local-inference client's
        # steps, 1.3 MB of arrays in all) is not refused for their sum.
        with PolicyClient(server.address) as c:
            eid = c.start_episode()
            obs = np.zeros((128, 128), np.float32)
            out = c._post(
                "batch",
                {
                    "commands": [
                        {
                            "command": "log_action",
                            "episode_id": eid,
                            "observation": obs,
                            "action": 0,
                        }
                        for _ in range(20)
                    ]
                },
            )
            assert out == {"done": 20, "errors": []}


# -- flow control --------------------------------------------------------------------------------


def test_requests_pipelined_behind_a_waiting_get_action_stop_the_reading():
    """The reproducer sent 48 MB behind a get_action the sampler held: the server buffered all
    of it. Now it stops reading at max_pipelined requests / max_pipelined_bytes, the rest
    waits in the kernel (the sender blocks), and everything is answered, in order, once the
    get_action is."""
    env = ExternalEnv(OBS, ACT, max_wait_s=0.0)
    holds = {"h"}
    with PolicyServer(env, max_pipelined=4, max_pipelined_bytes=64 << 10) as server:
        loop = PollLoop(server, hold=lambda eid: eid in holds)
        try:
            env.start_episode("h")
            n, payload = 400, np.zeros(10_000, np.float32)  # 40 KB bodies, 16 MB in all
            reqs = [post("/get_action", {"episode_id": "h", "observation": OB[1]})] + [
                post("/start_episode", {"episode_id": f"q{i}", "pad": payload}) for i in range(n)
            ]
            with connect(server, timeout=10.0) as sock:
                sender = threading.Thread(target=sock.sendall, args=(b"".join(reqs),))
                sender.start()
                conn = only_conn(server)
                until(lambda: conn.read_paused)
                time.sleep(0.2)  # the sender keeps trying: nothing more is read
                assert conn.read_paused and sender.is_alive()
                queued = sum(r.size for r in conn.queue) + (conn.req.size if conn.req else 0)
                # Checked between 16 KiB slices of what was read: at most one slice more.
                assert len(conn.queue) <= 4 and queued <= (64 << 10) + (16 << 10) + 40_100
                holds.clear()
                rs = Responses(sock).read(n + 1)
                sender.join(10)
                assert not sender.is_alive()
        finally:
            loop.close()
    assert [r["status"] for r in rs] == [200] * (n + 1)
    assert int(unpackb(rs[0]["body"])["action"]) == answer(OB[1])
    assert [unpackb(r["body"])["episode_id"] for r in rs[1:]] == [f"q{i}" for i in range(n)]


def test_a_peer_that_reads_no_answers_is_not_buffered_for():
    """Pipelined GETs of a big /weights without reading the answers: the server stops
    answering (and reading) once its write buffer is full, instead of queueing copies."""
    env = ExternalEnv(OBS, ACT)
    with PolicyServer(env, keepalive_timeout_s=30.0) as server:
        server.set_weights({"w": np.zeros(1 << 18, np.float32)})  # a 1 MiB answer
        with connect(server, timeout=10.0) as sock:
            sock.sendall(get("/weights") * 64)
            conn = only_conn(server)
            until(lambda: conn.write_paused_since is not None)
            time.sleep(0.2)
            assert conn.transport.get_write_buffer_size() < 3 << 20  # about one answer, not 64
            assert len(conn.queue) > 0  # the rest waits, unanswered
            rs = Responses(sock)
            got = rs.read(64)  # reading drains it: everything is answered
            assert all(r["status"] == 200 for r in got)


def test_slow_loris_gets_408_and_is_closed():
    env = ExternalEnv(OBS, ACT, action_timeout_s=1.0)  # ticks every 0.1 s
    with PolicyServer(env, request_timeout_s=0.3) as server:
        with connect(server) as sock:
            head = get("/info", extra=b"X-Slow: " + b"v" * 40 + b"\r\n")
            rs = Responses(sock)
            # One byte at a time, each once the server has answered nothing for 50 ms: never
            # idle, and (at about 5 s for the whole head) never complete before the 408 comes.
            for i in range(len(head)):
                try:
                    sock.sendall(head[i : i + 1])
                except OSError:
                    break
                if select.select([sock], [], [], 0.05)[0]:  # the answer (or the close) is here
                    break
            (r,) = rs.read(1)
            assert "request_timeout_s=0.3" in json_error(r, 408)["message"] and rs.closed()
        with connect(server) as sock:  # a slow body too
            data = post("/start_episode", {"episode_id": "slow"})
            sock.sendall(data[:-2])
            rs = Responses(sock)
            (r,) = rs.read(1)
            assert json_error(r, 408)["error"] == "RequestTimeout" and rs.closed()
        assert env.episode_status("slow") == "unknown"
        with PolicyClient(server.address) as c:  # a normal client is unaffected
            assert c.server_info()["protocol"] == PROTOCOL_VERSION


def test_blank_lines_do_not_keep_an_idle_connection_open():
    """llhttp skips CRLFs between requests: trickling them started no request (so no 408)
    but reset the idle clock, keeping the connection forever."""
    env = ExternalEnv(OBS, ACT, action_timeout_s=1.0)  # ticks every 0.1 s
    # the request timeout is far beyond the guard: only the 0.3 s idle close can end it
    idle_only = PolicyServer(env, keepalive_timeout_s=0.3, request_timeout_s=120.0)
    with idle_only as server, connect(server) as sock:
        closed = False
        for _ in range(600):  # a hang guard only (about 30 s): the server closes it well before
            try:
                sock.sendall(b"\r\n")
            except OSError:
                closed = True
                break
            try:
                closed = bool(select.select([sock], [], [], 0.05)[0]) and sock.recv(1) == b""
            except ConnectionResetError:  # closed with our CRLFs unread: the kernel sends RST
                closed = True
            if closed:
                break
        assert closed


def test_slow_request_behind_a_waiting_get_action_is_answered_in_order():
    env = ExternalEnv(OBS, ACT, max_wait_s=0.0, action_timeout_s=1.0)
    holds = {"h"}
    with PolicyServer(env, request_timeout_s=0.3) as server:
        loop = PollLoop(server, hold=lambda eid: eid in holds)
        try:
            env.start_episode("h")
            with connect(server) as sock:
                sock.sendall(
                    post("/get_action", {"episode_id": "h", "observation": OB[1]}) + b"GET /in"
                )
                conn = only_conn(server)
                until(lambda: conn.broken)  # the partial request timed out ...
                holds.clear()  # ... but the get_action before it is answered first
                r = Responses(sock).read(2)
                assert r[0]["status"] == 200 and json_error(r[1], 408)
        finally:
            loop.close()


# -- connections ---------------------------------------------------------------------------------


def test_max_connections_refuses_with_503_when_nobody_is_idle_else_closes_the_oldest_idle():
    env = ExternalEnv(OBS, ACT)
    server = PolicyServer(env, max_connections=2)
    with server, connect(server) as a, connect(server) as b:
        a.sendall(b"GET /in")  # mid-request: not idle
        b.sendall(b"GET /in")
        until(lambda: len(server._conns) == 2 and all(c.req for c in server._conns))
        with connect(server) as c:
            rs = Responses(c)
            (r,) = rs.read(1)
            assert "max_connections" in json_error(r, 503)["message"] and rs.closed()
        client = PolicyClient(server.address)
        with client, pytest.raises(CapacityError, match="max_connections"):
            client.server_info()  # the client sees the 503 too
        a.sendall(b"fo HTTP/1.1\r\nHost: t\r\n\r\n")  # both finish their requests:
        b.sendall(b"fo HTTP/1.1\r\nHost: t\r\n\r\n")  # now idle keep-alive connections
        assert Responses(a).read(1)[0]["status"] == 200
        assert Responses(b).read(1)[0]["status"] == 200
        with PolicyClient(server.address) as client:  # closes the oldest idle one (a)
            assert client.server_info()["protocol"] == PROTOCOL_VERSION
            assert Responses(a).closed()
            b.sendall(get("/info"))
            assert Responses(b).read(1)[0]["status"] == 200


def test_limits_are_checked():
    for bad in ({"max_url_bytes": 0}, {"request_timeout_s": -1.0}, {"max_connections": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            PolicyServer(ExternalEnv(OBS, ACT), **bad)


# -- /batch fairness ------------------------------------------------------------------------------


def test_batches_waiting_under_back_pressure_do_not_hold_up_other_connections():
    """Six connections' /batch wait for room (no sampler polls yet): on the old server they
    sat on all four worker threads and a seventh connection's /batch queued behind them.
    Now it is answered while they wait, and theirs complete, exactly once, once polled."""
    env = ExternalEnv(OBS, ACT, max_wait_s=0.0, max_queued_steps=1)
    with PolicyServer(env) as server:
        socks = []
        try:
            for i in range(6):
                env.start_episode(f"f{i}")
                s = connect(server, timeout=10.0)
                cmds = [
                    {
                        "command": "log_action",
                        "episode_id": f"f{i}",
                        "observation": OB[t],
                        "action": t,
                    }
                    for t in range(5)
                ]
                s.sendall(post("/batch", {"commands": cmds}))
                socks.append(s)
            until(lambda: sum(c.busy for c in server._conns) == 6)
            env.start_episode("n")
            with connect(server) as sock:
                sock.sendall(post("/batch", {"commands": [
                    {"command": "log_returns", "episode_id": "n", "reward": 1.0}
                ] * 3}))  # fmt: skip
                (r,) = Responses(sock).read(1)
            assert unpackb(r["body"]) == {"done": 3, "errors": []}
            assert sum(c.busy for c in server._conns) == 6  # still waiting for room
            loop = PollLoop(server)
            try:
                for s in socks:
                    (r,) = Responses(s).read(1)
                    assert unpackb(r["body"]) == {"done": 5, "errors": []}
                until(lambda: all(len(loop.steps[f"f{i}"]) == 5 for i in range(6)))
            finally:
                loop.close()
        finally:
            for s in socks:
                s.close()
    for i in range(6):
        assert [s[5][AGENT] for s in loop.steps[f"f{i}"]] == list(range(5))


def test_big_bodies_are_decoded_off_the_event_loop_and_answered_in_order():
    """Bodies over 64 KiB are decoded on a worker thread (a review found an 8 MiB body of
    small ints stalled every connection for about a second while decoded on the event
    loop). Requests pipelined behind them are still answered in order, bad ones with 400."""
    big_obs = type(OBS)(-1, 1, (200, 200))  # 160 KB a float32 observation
    env = ExternalEnv(big_obs, ACT)
    with PolicyServer(env, max_body_bytes=4 << 20) as server:
        sock = connect(server)
        rs = Responses(sock)
        sock.sendall(post("/start_episode", {}))
        (r,) = rs.read(1)
        eid = unpackb(r["body"])["episode_id"]
        obs = np.zeros((200, 200), np.float32)
        sock.sendall(
            post("/log_action", {"episode_id": eid, "junk": list(range(100_000))})  # no obs
            + post("/log_action", {"episode_id": eid, "observation": obs, "action": 1})
            + post("/log_action", {"episode_id": eid, "observation": obs.tolist()[:3]})
            + get("/info")
        )
        out = rs.read(4)
        assert [r["status"] for r in out] == [400, 200, 400, 200]
        assert "observation" in json_error(out[0], 400)["message"]
        sock.close()
        poll = env.poll(1.0)
        np.testing.assert_array_equal(poll.obs[eid][AGENT], obs)
        assert poll.off_policy_actions[eid][AGENT] == 1
