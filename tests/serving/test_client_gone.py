"""A client whose connection closes between calls loses its episodes after
``client_gone_grace_s`` (issue 32, item 6), with real :class:`PolicyClient` s over loopback.

Before, only a disconnect *during* ``get_action`` abandoned an episode; the rest waited for
``episode_timeout_s`` (here 60 s, far beyond every wait below).
"""

from __future__ import annotations

import http.client
import threading

import numpy as np
import pytest

from jaxsampler.constants import ALL_AGENTS
from jaxsampler.envs.base import DEFAULT_AGENT_ID as AGENT
from jaxsampler.episodes.codec import packb, unpackb
from jaxsampler.host_envs.external import ExternalEnv
from jaxsampler.serving.client import PolicyClient
from jaxsampler.serving.server import PolicyServer
from tests.fakes import ACT, OBS, PollLoop, answer


def o(x: float) -> np.ndarray:
    return np.full(3, x, np.float32)


def wait_until(cond, timeout: float = 15.0) -> None:
    ev = threading.Event()
    for _ in range(int(timeout / 0.02)):
        if cond():
            return
        ev.wait(0.02)
    raise AssertionError("condition not met in time")


@pytest.fixture
def served_grace(request):
    """A server with a 0.3 s grace (keep-alive: the indirect parameter, else 120 s)."""
    env = ExternalEnv(OBS, ACT, max_wait_s=0.0, episode_timeout_s=60.0)
    server = PolicyServer(
        env,
        port=0,
        client_gone_grace_s=0.3,
        keepalive_timeout_s=getattr(request, "param", 120.0),
    )
    loop = PollLoop(server)
    yield server, loop
    loop.close()
    server.close()


def finished(env, eid: str) -> bool:
    return env.episode_status(eid) in ("finishing", "abandoned")


def test_a_client_gone_between_calls_loses_its_episodes_after_the_grace(served_grace):
    server, loop = served_grace
    env = server.env
    gone = PolicyClient(server.address)
    used, unused = gone.start_episode(), gone.start_episode()
    assert gone.get_action(used, o(1)) == answer(o(1))
    # A client that closes and comes back within the grace keeps its episodes.
    back = PolicyClient(server.address)
    kept = back.start_episode()
    assert back.get_action(kept, o(2)) == answer(o(2))
    back.close()
    back = PolicyClient(server.address, client_id=back.client_id)
    assert back.get_action(kept, o(3)) == answer(o(3))  # a new connection, same client
    other = PolicyClient(server.address)  # never closes: untouched
    mine = other.start_episode()
    assert other.get_action(mine, o(4)) == answer(o(4))

    gone.close()  # between calls: nothing waits on its connection
    wait_until(lambda: env.episode_status(used) == "abandoned")
    assert env.episode_status(unused) == "abandoned"
    final = loop.steps[used][-1]  # (obs, rewards, term, trunc, infos, offp)
    assert final[3][ALL_AGENTS] and not final[2][ALL_AGENTS]
    assert final[4][AGENT]["abandoned"] is True
    np.testing.assert_array_equal(final[0][AGENT], o(1))  # the last observation, repeated
    assert env.episode_status(kept) == "running" and env.episode_status(mine) == "running"
    assert back.get_action(kept, o(5)) == answer(o(5))
    assert other.get_action(mine, o(6)) == answer(o(6))
    back.close()
    other.close()


@pytest.mark.parametrize("served_grace", [0.5], indirect=True)
def test_connections_the_server_closes_do_not_start_the_grace(served_grace):
    """An idle keep-alive connection closed by the server (``keepalive_timeout_s``) says
    nothing about its client: the episode stays until the client calls again."""
    server, _ = served_grace
    env = server.env
    c = PolicyClient(server.address)
    eid = c.start_episode()
    assert c.get_action(eid, o(1)) == answer(o(1))
    wait_until(lambda: not server._conns)  # closed by the server (0.5 s idle, 1 s ticks)
    threading.Event().wait(1.5)  # past the grace and at least one more tick
    assert env.episode_status(eid) == "running"
    assert c.get_action(eid, o(2)) == answer(o(2))  # the client reconnects and carries on
    c.close()


def _anonymous(server: PolicyServer) -> http.client.HTTPConnection:
    host, port = server.address[len("http://") :].split(":")
    return http.client.HTTPConnection(host, int(port), timeout=30)


def _call(conn: http.client.HTTPConnection, command: str, msg: dict) -> dict:
    conn.request("POST", "/" + command, body=packb(msg))  # keep-alive, no X-Client-Id
    resp = conn.getresponse()
    data = resp.read()
    assert resp.status == 200, data
    return unpackb(data, objects=False)


def test_anonymous_clients_are_one_client_gone_when_none_is_left(served_grace):
    server, _ = served_grace
    env = server.env
    a, b = _anonymous(server), _anonymous(server)
    eid = _call(a, "start_episode", {})["episode_id"]
    assert _call(a, "get_action", {"episode_id": eid, "observation": o(1)})["action"] == answer(
        o(1)
    )
    _call(b, "log_action", {"episode_id": eid, "observation": o(2), "action": 3})
    a.close()  # another anonymous connection is still open: nobody is gone
    threading.Event().wait(1.5)
    assert env.episode_status(eid) == "running"
    b.close()  # the last one
    wait_until(lambda: finished(env, eid))


def test_grace_none_keeps_the_old_behaviour():
    env = ExternalEnv(OBS, ACT, max_wait_s=0.0, episode_timeout_s=60.0)
    with PolicyServer(env, port=0, client_gone_grace_s=None) as server:
        loop = PollLoop(server)
        c = PolicyClient(server.address)
        eid = c.start_episode()
        assert c.get_action(eid, o(1)) == answer(o(1))
        c.close()
        threading.Event().wait(1.5)
        assert env.episode_status(eid) == "running"
        loop.close()
    with pytest.raises(ValueError, match="client_gone_grace_s"):
        PolicyServer(ExternalEnv(OBS, ACT), port=0, client_gone_grace_s=-1.0)


def test_a_numbered_get_action_whose_client_never_returns_ends_after_the_grace():
    """A numbered get_action keeps waiting when its connection drops (the client may
    retry); a client that never comes back loses the episode after the grace."""
    from tests.serving.test_retries import drop_while_waiting, raw

    env = ExternalEnv(OBS, ACT, max_wait_s=0.0, episode_timeout_s=60.0)
    server = PolicyServer(env, port=0, client_gone_grace_s=0.3)
    holds = {"n"}
    loop = PollLoop(server, hold=lambda eid: eid in holds and env.episode_status(eid) == "running")
    try:
        assert raw(server, "/start_episode", {"episode_id": "n", "seq": 0}, "c")[0] == 200
        drop_while_waiting(server, loop, {"episode_id": "n", "observation": o(4), "seq": 1}, "c")
        assert env.episode_status("n") == "running"  # the server saw the close: it waits on
        wait_until(lambda: env.episode_status("n") == "abandoned")
        final = loop.steps["n"][-1]
        assert final[4][AGENT]["abandoned"] is True
    finally:
        loop.close()
        server.close()
