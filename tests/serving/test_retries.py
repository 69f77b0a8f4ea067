"""Safe retries (issue 32, item 5): per-episode sequence numbers and ``PolicyClient(retries=)``.

A loopback proxy between client and server forwards requests and can lose the server's
answers (it reads the answer, then closes the client's connection without sending it): the
server ran the command, the client got nothing. Every test checks what the sampler (the
test's poll loop) got: each step and each reward exactly once.
"""

from __future__ import annotations

import json
import socket
import threading

import numpy as np
import pytest

from jaxsampler.envs.base import DEFAULT_AGENT_ID as AGENT
from jaxsampler.episodes.codec import packb, unpackb
from jaxsampler.host_envs.external import EpisodeStateError, InvalidDataError
from jaxsampler.serving import (
    PolicyClient,
    SequenceError,
    ServerUnavailableError,
)
from tests.fakes import answer, http_request, wait_finished
from tests.serving.proxy import LoopbackProxy


def o(x: float) -> np.ndarray:
    return np.full(3, x, np.float32)


def _read_message(sock: socket.socket, buf: bytearray) -> bytes | None:
    """One HTTP message (head and Content-Length body) from ``sock``; None at EOF."""
    while b"\r\n\r\n" not in buf:
        data = sock.recv(1 << 16)
        if not data:
            return None
        buf += data
    end = buf.index(b"\r\n\r\n") + 4
    length = 0
    for line in bytes(buf[:end]).split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    while len(buf) < end + length:
        data = sock.recv(1 << 16)
        if not data:
            return None
        buf += data
    msg = bytes(buf[: end + length])
    del buf[: end + length]
    return msg


class LosingProxy(LoopbackProxy):
    """Forwards each request to the server; while ``lose`` > 0, a request whose path starts
    with ``lose_path`` has its answer read and dropped (``lost``), and the client's
    connection closed. Counts requests by request line (``seen``)."""

    def __init__(self, address: str, lose: int = 0, lose_path: bytes = b"POST /"):
        self.lose, self.lose_path = lose, lose_path
        self.lost: list[bytes] = []
        self.seen: list[bytes] = []
        self.lock = threading.Lock()
        super().__init__(address)

    def _serve(self, client: socket.socket) -> None:
        up = socket.create_connection(self.upstream)
        cbuf, ubuf = bytearray(), bytearray()
        try:
            while (req := _read_message(client, cbuf)) is not None:
                line = req.split(b"\r\n", 1)[0]
                with self.lock:
                    self.seen.append(line)
                    lose = self.lose > 0 and line.startswith(self.lose_path)
                    if lose:
                        self.lose -= 1
                up.sendall(req)
                resp = _read_message(up, ubuf)
                if resp is None:
                    return
                if lose:
                    self.lost.append(resp)
                    return  # the answer never reaches the client
                client.sendall(resp)
        except OSError:
            return
        finally:
            client.close()
            up.close()

    def count(self, prefix: bytes) -> int:
        with self.lock:
            return sum(line.startswith(prefix) for line in self.seen)

    def close(self) -> None:
        self.lsock.close()


def body_of(http_message: bytes) -> bytes:
    return http_message.split(b"\r\n\r\n", 1)[1]


def rewards_of(loop, eid: str) -> list[float]:
    return [float(step[1][AGENT]) for step in loop.steps[eid]]


def test_a_lost_answer_is_retried_and_the_step_applied_once(served):
    """get_action's answer (carrying a deferred reward) is lost once: the retry gets the
    same answer again, replayed; the sampler saw the step and the reward once."""
    server, loop, _ = served
    proxy = LosingProxy(server.address)
    c = PolicyClient(proxy.address, backoff_s=0.01)
    eid = c.start_episode()
    assert c.get_action(eid, o(1)) == answer(o(1))
    c.log_returns(eid, 1.5)
    proxy.lose, proxy.lose_path = 1, b"POST /get_action"
    action = c.get_action(eid, o(2))
    assert action == answer(o(2))
    (lost,) = proxy.lost
    assert unpackb(body_of(lost))["action"] == action  # the replay equals the first answer
    assert proxy.count(b"POST /get_action") == 3  # the first, the lost one, its retry
    c.end_episode(eid, o(3))
    wait_finished(server.env, [eid])
    assert [float(s[0][AGENT][0]) for s in loop.steps[eid]] == [1.0, 2.0, 3.0]
    assert rewards_of(loop, eid) == [0.0, 1.5, 0.0]
    c.close()
    proxy.close()


@pytest.mark.parametrize(
    "path", [b"POST /start_episode", b"POST /log_action", b"POST /end_episode"]
)
def test_every_numbered_command_is_applied_once(served, path):
    server, loop, _ = served
    proxy = LosingProxy(server.address, lose=1, lose_path=path)
    c = PolicyClient(proxy.address, backoff_s=0.01)
    eid = c.start_episode()
    c.log_action(eid, o(1), 5)
    c.log_returns(eid, 2.0)
    c.end_episode(eid, o(2))
    wait_finished(server.env, [eid])
    assert len(proxy.lost) == 1
    assert [s[5] for s in loop.steps[eid]] == [{AGENT: 5}, None]
    assert rewards_of(loop, eid) == [0.0, 2.0]
    assert server.env.stats["abandoned"] == 0
    c.close()
    proxy.close()


def test_retries_0_raises_at_once(served):
    server, loop, _ = served
    proxy = LosingProxy(server.address, lose=1, lose_path=b"POST /start_episode")
    c = PolicyClient(proxy.address, retries=0)
    with pytest.raises(ConnectionError):
        c.start_episode()
    assert proxy.count(b"POST /start_episode") == 1
    c.close()
    proxy.close()


def test_4xx_is_not_retried_and_503_is(served):
    server, loop, _ = served
    proxy = LosingProxy(server.address)
    c = PolicyClient(proxy.address, retries=2, backoff_s=0.01)
    eid = c.start_episode()
    with pytest.raises(InvalidDataError):
        c.get_action(eid, np.zeros(5, np.float32))
    assert proxy.count(b"POST /get_action") == 1
    assert c.get_action(eid, o(1)) == answer(o(1))  # the refused one used no number
    server.fail("the sampler died")
    with pytest.raises(ServerUnavailableError, match="the sampler died"):
        c.get_action(eid, o(2))
    assert proxy.count(b"POST /get_action") == 2 + 3  # 1 try and 2 retries
    c.close()
    proxy.close()


def test_a_connection_refused_is_retried_then_raised():
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nobody listens there now
    c = PolicyClient(f"http://127.0.0.1:{port}", retries=2, backoff_s=0.0)
    with pytest.raises(ConnectionError):
        c.start_episode()


def raw(server, path: str, msg: dict, client_id: str = "me") -> tuple[int, bytes]:
    status, _, data = http_request(server, "POST", path, packb(msg), {"X-Client-Id": client_id})
    return status, data


def test_a_gap_or_a_reused_number_is_a_sequence_error(served):
    server, loop, _ = served
    assert raw(server, "/start_episode", {"episode_id": "g", "seq": 0})[0] == 200
    status, data = raw(server, "/get_action", {"episode_id": "g", "observation": o(1), "seq": 2})
    assert status == 409 and json.loads(data)["error"] == "SequenceError"
    assert (
        raw(server, "/log_action", {"episode_id": "g", "observation": o(1), "action": 1, "seq": 1})[
            0
        ]
        == 200
    )
    status, data = raw(
        server, "/log_action", {"episode_id": "g", "observation": o(9), "action": 1, "seq": 1}
    )
    assert status == 409 and "another command" in json.loads(data)["message"]
    # the client raises it as SequenceError (here: its numbers made to skip one)
    c = PolicyClient(server.address)
    eid = c.start_episode()
    c._numbers.advance(eid, 1)
    with pytest.raises(SequenceError):
        c.get_action(eid, o(1))
    c.close()


def test_a_repeat_while_the_first_runs_gets_503_then_the_same_answer(served):
    server, loop, holds = served
    assert raw(server, "/start_episode", {"episode_id": "h", "seq": 0})[0] == 200
    holds.add("h")
    msg = {"episode_id": "h", "observation": o(4), "seq": 1}
    first: list = []
    t = threading.Thread(target=lambda: first.append(raw(server, "/get_action", msg)))
    t.start()
    for _ in range(2000):  # bounded: until the sampler holds the step
        if loop.held:
            break
        threading.Event().wait(0.005)
    status, data = raw(server, "/get_action", msg)
    assert status == 503 and json.loads(data)["error"] == "RequestInProgress"
    holds.discard("h")
    t.join(timeout=30)
    assert first[0][0] == 200
    assert raw(server, "/get_action", msg) == first[0]  # replayed
    assert raw(server, "/end_episode", {"episode_id": "h", "observation": o(5), "seq": 2})[0] == 200
    wait_finished(server.env, ["h"])
    assert len(loop.steps["h"]) == 2


def test_requests_without_seq_behave_as_before(served):
    server, loop, _ = served
    c = PolicyClient(server.address, retries=0)
    eid = c.start_episode()
    assert c.get_action(eid, o(1)) == answer(o(1))
    assert c.get_action(eid, o(2)) == answer(o(2))
    c.end_episode(eid, o(3))
    with pytest.raises(EpisodeStateError, match="already completed"):
        c.end_episode(eid, o(3))  # no replay without numbers
    c.close()


def drop_while_waiting(server, loop, msg: dict, client_id: str = "me") -> None:
    """Sends a get_action on a raw connection and closes it once the sampler holds the
    step (``loop=None``: once the server has the request), then waits until the server has
    seen the close (the answer has nowhere to go)."""
    host, port = server.address[len("http://") :].split(":")
    before = set(server._conns)
    sock = socket.create_connection((host, int(port)))
    body = packb(msg)
    sock.sendall(
        b"POST /get_action HTTP/1.1\r\nHost: x\r\nContent-Type: application/msgpack\r\n"
        + f"X-Client-Id: {client_id}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    for _ in range(2000):  # bounded: until the sampler holds the step / the env has it
        if loop is not None and msg["episode_id"] in loop.held:
            break
        if loop is None and msg["episode_id"] in server.env._ready:
            break
        threading.Event().wait(0.005)
    mine = set(server._conns) - before
    sock.close()
    for _ in range(2000):  # bounded: until the server has seen the close
        if not (mine & set(server._conns)):
            break
        threading.Event().wait(0.005)


def test_a_numbered_get_action_outlives_its_dropped_connection_and_the_retry_gets_it(served):
    """The connection breaks while the sampler holds the step: the episode is not
    abandoned, the answer is recorded, and the retry (same seq, same bytes) gets it; the
    sampler saw the step once."""
    server, loop, holds = served
    assert raw(server, "/start_episode", {"episode_id": "d", "seq": 0})[0] == 200
    holds.add("d")
    msg = {"episode_id": "d", "observation": o(4), "seq": 1}
    drop_while_waiting(server, loop, msg)
    holds.discard("d")
    for _ in range(2000):  # a retry while the first still waits gets 503: retry again
        status, data = raw(server, "/get_action", msg)
        if status != 503:
            break
        threading.Event().wait(0.005)
    assert status == 200 and unpackb(data)["action"] == answer(o(4))
    assert server.env.episode_status("d") == "running"
    assert raw(server, "/end_episode", {"episode_id": "d", "observation": o(5), "seq": 2})[0] == 200
    wait_finished(server.env, ["d"])
    assert [float(s[0][AGENT][0]) for s in loop.steps["d"]] == [4.0, 5.0]
    assert server.env.stats["abandoned"] == 0


def test_an_unnumbered_get_action_dropped_while_waiting_abandons_its_episode(served):
    server, loop, holds = served
    assert raw(server, "/start_episode", {"episode_id": "u"})[0] == 200
    holds.add("u")
    drop_while_waiting(server, loop, {"episode_id": "u", "observation": o(4)})
    holds.discard("u")
    wait_finished(server.env, ["u"])
    assert server.env.episode_status("u") == "abandoned"  # nobody could come back for it


def test_a_dropped_numbered_get_action_still_times_out_when_the_sampler_stalls():
    """Its wait outlives the connection, and so do its deadlines: a sampler that stops
    polling ends it (the episode ends; the retry gets the stall's 503), as for one whose
    connection stayed open."""
    from jaxsampler.host_envs.external import ExternalEnv
    from jaxsampler.serving.server import PolicyServer
    from tests.fakes import ACT, OBS

    env = ExternalEnv(OBS, ACT, max_wait_s=0.0, episode_timeout_s=60.0, action_timeout_s=30.0)
    server = PolicyServer(env, port=0, sampler_timeout_s=0.5, client_gone_grace_s=None)
    try:  # nobody polls: the sampler counts as stalled after 0.5 s
        assert raw(server, "/start_episode", {"episode_id": "n", "seq": 0}, "a")[0] == 200
        msg = {"episode_id": "n", "observation": o(1), "seq": 1}
        drop_while_waiting(server, None, msg, "a")
        for _ in range(3000):  # bounded wait for the stall to end it
            if env.episode_status("n") != "running":
                break
            threading.Event().wait(0.01)
        assert env.episode_status("n") in ("finishing", "abandoned")
        status, data = raw(server, "/get_action", msg, "a")
        assert status == 503 and json.loads(data)["error"] == "ServerUnavailableError"
        assert not server._lingering
    finally:
        server.close()
