"""Deferred rewards are kept until the server ran them (issue 32, item 5's last part).

``PolicyClient(defer_returns=True)`` sends a ``log_returns`` with the thread's next request.
Before, it forgot them once encoded, so a failed call lost them. Now a call that fails
before the server ran them (no answer; an error from a check before any command) keeps them
for the next request and lists them on the exception (``deferred_returns``); one that failed
after they ran (the command's own error) does not send them again. Every test checks the
rewards the sampler got for the episode: the sum logged, exactly once.
"""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from jaxsampler.envs.base import DEFAULT_AGENT_ID as AGENT
from jaxsampler.host_envs.external import InvalidDataError, UnknownEpisodeError
from jaxsampler.serving.client import PolicyClient, _returns_run
from jaxsampler.serving.server import PolicyServerError
from tests.fakes import answer, wait_finished
from tests.serving.proxy import LoopbackProxy


def o(x: float) -> np.ndarray:
    return np.full(3, x, np.float32)


class Proxy(LoopbackProxy):
    """A loopback TCP proxy in front of the server; while ``down``, every connection it
    accepts is closed as soon as its request arrives (nothing reaches the server)."""

    def __init__(self, address: str):
        self.down = False
        self.socks: list[socket.socket] = []
        super().__init__(address)

    def _accepted(self, client: socket.socket) -> None:
        self.socks.append(client)

    def _serve(self, client: socket.socket) -> None:
        upstream = None
        try:
            while True:
                data = client.recv(1 << 16)
                if not data or self.down:
                    return
                if upstream is None:
                    upstream = socket.create_connection(self.upstream)
                    self.socks.append(upstream)
                    threading.Thread(
                        target=self._back, args=(upstream, client), daemon=True
                    ).start()
                upstream.sendall(data)
        except OSError:
            return
        finally:
            client.close()
            if upstream is not None:
                upstream.close()

    @staticmethod
    def _back(upstream: socket.socket, client: socket.socket) -> None:
        try:
            while data := upstream.recv(1 << 16):
                client.sendall(data)
        except OSError:
            pass
        finally:
            client.close()

    def close(self) -> None:
        self.lsock.close()
        for s in self.socks:
            s.close()


def rewards_of(loop, eid: str) -> list[float]:
    """The reward of every step the sampler got for ``eid``."""
    return [float(step[1][AGENT]) for step in loop.steps[eid]]


def msg(eid: str, reward: float) -> dict:
    return {"episode_id": eid, "reward": reward, "info": None}


def test_a_request_refused_before_any_command_keeps_them(served):
    """413 (the body is over the server's 4 KB): nothing ran; the rewards travel with the
    next request."""
    server, loop, _ = served
    c = PolicyClient(server.address)
    eid = c.start_episode()
    assert c.get_action(eid, o(1)) == answer(o(1))
    c.log_returns(eid, 1.5)
    with pytest.raises(PolicyServerError) as info:
        c.get_action(eid, np.zeros(2000, np.float32))
    assert info.value.status == 413
    assert info.value.deferred_returns == [msg(eid, 1.5)]  # type: ignore[attr-defined]
    c.log_returns(eid, 2.0)
    assert c.get_action(eid, o(2)) == answer(o(2))
    c.end_episode(eid, o(3))
    wait_finished(server.env, [eid])
    assert rewards_of(loop, eid) == [0.0, 3.5, 0.0]
    c.close()


def test_a_broken_connection_keeps_them(served):
    """The connection closes before the request reaches the server (the client's one retry
    too): ConnectionError, the rewards stay pending, the next call delivers them once."""
    server, loop, _ = served
    proxy = Proxy(server.address)
    c = PolicyClient(proxy.address)
    eid = c.start_episode()
    assert c.get_action(eid, o(1)) == answer(o(1))
    c.log_returns(eid, 1.0)
    c.log_returns(eid, 0.25)
    proxy.down = True
    with pytest.raises(ConnectionError) as info:
        c.get_action(eid, o(2))
    assert info.value.deferred_returns == [msg(eid, 1.0), msg(eid, 0.25)]  # type: ignore[attr-defined]
    with pytest.raises(ConnectionError):  # flush fails too: still kept
        c.flush()
    proxy.down = False
    c.log_returns(eid, 2.0)
    assert c.get_action(eid, o(2)) == answer(o(2))
    c.log_returns(eid, 4.0)
    proxy.down = True
    with pytest.raises(ConnectionError) as info:
        c.flush()
    assert info.value.deferred_returns == [msg(eid, 4.0)]  # type: ignore[attr-defined]
    proxy.down = False
    c.flush()
    c.end_episode(eid, o(3))
    wait_finished(server.env, [eid])
    assert rewards_of(loop, eid) == [0.0, 3.25, 4.0]
    c.close()
    proxy.close()


def test_a_command_that_fails_after_they_ran_does_not_send_them_again(served):
    """400 for the get_action's observation: the rewards ran before it; sending them again
    would count them twice."""
    server, loop, _ = served
    c = PolicyClient(server.address)
    eid = c.start_episode()
    assert c.get_action(eid, o(1)) == answer(o(1))
    c.log_returns(eid, 1.0)
    with pytest.raises(InvalidDataError) as info:
        c.get_action(eid, np.zeros(5, np.float32))
    assert info.value.deferred_returns == []  # type: ignore[attr-defined]
    assert c.get_action(eid, o(2)) == answer(o(2))
    c.end_episode(eid, o(3))
    wait_finished(server.env, [eid])
    assert rewards_of(loop, eid) == [0.0, 1.0, 0.0]
    c.close()


def test_a_refused_reward_is_dropped_and_the_rest_kept(served):
    """The server refuses ``returns[0]`` (an unknown episode): that one is dropped (it
    would fail again), the next one stays pending, and the command did not run."""
    server, loop, _ = served
    c = PolicyClient(server.address)
    eid = c.start_episode()
    assert c.get_action(eid, o(1)) == answer(o(1))
    c.log_returns("nope", 1.0)
    c.log_returns(eid, 2.0)
    with pytest.raises(UnknownEpisodeError) as info:
        c.get_action(eid, o(2))
    assert info.value.deferred_returns == [msg("nope", 1.0), msg(eid, 2.0)]  # type: ignore[attr-defined]
    assert c.get_action(eid, o(2)) == answer(o(2))
    c.end_episode(eid, o(3))
    wait_finished(server.env, [eid])
    assert rewards_of(loop, eid) == [0.0, 2.0, 0.0]
    c.close()


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (401, b'{"error": "Unauthorized", "message": "token"}', (0, 0)),
        (404, b'{"error": "NotFound", "message": "unknown path /x"}', (0, 0)),
        (413, b'{"error": "PayloadTooLarge", "message": "body"}', (0, 0)),
        (
            503,
            b'{"error": "CapacityError", "message": "9 connections are open (max_connections)"}',
            (0, 0),
        ),
        (503, b'{"error": "CapacityError", "message": "episodes"}', (3, 0)),
        (
            404,
            b'{"error": "UnknownEpisodeError", "message": "deferred log_returns '
            b'(returns[1]): Episode x not found"}',
            (1, 1),
        ),
        (
            503,
            b'{"error": "ServerUnavailableError", "message": "deferred log_returns '
            b'(returns[2]): the sampler failed"}',
            (2, 0),
        ),
        (409, b'{"error": "EpisodeStateError", "message": "abandoned"}', (3, 0)),
        (500, b"not json", (3, 0)),
    ],
)
def test_returns_run_reads_the_error(status, body, expected):
    assert _returns_run(status, body, 3) == expected
