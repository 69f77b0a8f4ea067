"""A retried numbered ``get_action`` rejoins the wait of the first request when that one's
connection was cut while it waited (issue 32, retries): the retry is answered with the
action once the sampler answers (no 503 loop, no abandoned episode), and the sampler saw
the step once. Tested with raw requests and with ``PolicyClient(retries=1)`` behind a
loopback proxy that cuts the connection mid-wait (with one retry and no rejoin, the
retry's 503 would be the client's error)."""

from __future__ import annotations

import socket
import threading

from jaxsampler.episodes.codec import unpackb
from jaxsampler.serving import PolicyClient
from tests.fakes import answer, wait_finished
from tests.serving.proxy import LoopbackProxy
from tests.serving.test_retries import _read_message, drop_while_waiting, o, raw

BOUND_STEPS = 4000  # bounded polling loops (x 5 ms)


def wait_until(cond) -> None:
    for _ in range(BOUND_STEPS):
        if cond():
            return
        threading.Event().wait(0.005)
    raise AssertionError("condition not reached")


def rejoined(server, eid: str) -> bool:
    """A live connection waits for ``eid``'s action, and no closed one does."""
    live = [c for c in server._conns if c.waiting is not None and c.waiting[0] == eid]
    return bool(live) and not server._lingering


def test_a_retry_rejoins_the_wait_of_a_cut_get_action_and_gets_its_action(served):
    server, loop, holds = served
    assert raw(server, "/start_episode", {"episode_id": "r", "seq": 0})[0] == 200
    holds.add("r")
    msg = {"episode_id": "r", "observation": o(4), "seq": 1}
    drop_while_waiting(server, loop, msg)
    assert server._lingering  # the first request still waits, on a closed connection
    got: list = []
    retry = threading.Thread(target=lambda: got.append(raw(server, "/get_action", msg)))
    retry.start()
    wait_until(lambda: rejoined(server, "r"))
    assert not got  # it waits for the sampler (held), instead of getting a 503
    holds.discard("r")
    retry.join(30)
    assert got and got[0][0] == 200 and unpackb(got[0][1])["action"] == answer(o(4))
    # The answer was recorded for the number: a third copy is a replay, not a new step.
    status, data = raw(server, "/get_action", msg)
    assert status == 200 and unpackb(data)["action"] == answer(o(4))
    assert raw(server, "/end_episode", {"episode_id": "r", "observation": o(5), "seq": 2})[0] == 200
    wait_finished(server.env, ["r"])
    assert [float(s[0]["default_agent"][0]) for s in loop.steps["r"]] == [4.0, 5.0]
    assert server.env.stats["abandoned"] == 0


def test_a_different_request_under_the_waiting_number_does_not_rejoin(served):
    server, loop, holds = served
    assert raw(server, "/start_episode", {"episode_id": "x", "seq": 0})[0] == 200
    holds.add("x")
    drop_while_waiting(server, loop, {"episode_id": "x", "observation": o(4), "seq": 1})
    other = {"episode_id": "x", "observation": o(9), "seq": 1}
    assert raw(server, "/get_action", other)[0] == 409  # SequenceError: not the same request
    assert server._lingering  # the first one still waits
    holds.discard("x")
    wait_until(lambda: not server._lingering)


class CuttingProxy(LoopbackProxy):
    """Forwards requests; the first ``POST /get_action`` is sent on, then its upstream
    connection is closed, ``cut`` waits until the server noticed, and the client's
    connection is closed too (a connection cut mid-wait, seen by both ends)."""

    def __init__(self, address: str, cut):
        self.cut = cut
        self.pending_cut = 1
        self.get_actions = 0
        super().__init__(address)

    def _serve(self, client: socket.socket) -> None:
        up = socket.create_connection(self.upstream)
        cbuf, ubuf = bytearray(), bytearray()
        try:
            while (req := _read_message(client, cbuf)) is not None:
                is_get = req.startswith(b"POST /get_action")
                self.get_actions += is_get
                up.sendall(req)
                if is_get and self.pending_cut:
                    self.pending_cut -= 1
                    up.close()
                    self.cut()
                    return
                resp = _read_message(up, ubuf)
                if resp is None:
                    return
                client.sendall(resp)
        except OSError:
            return
        finally:
            client.close()
            up.close()

    def close(self) -> None:
        self.lsock.close()


def test_policy_client_retries_a_cut_get_action_into_the_same_wait(served):
    server, loop, holds = served
    holds.add("p")

    def cut() -> None:  # the server holds the step, and has seen the close
        wait_until(lambda: "p" in loop.held and server._lingering)

    proxy = CuttingProxy(server.address, cut)
    client = PolicyClient(proxy.address, retries=1, backoff_s=0.0)
    try:
        assert client.start_episode("p") == "p"
        got: list = []
        th = threading.Thread(target=lambda: got.append(client.get_action("p", o(2))))
        th.start()
        wait_until(lambda: proxy.get_actions == 2 and rejoined(server, "p"))
        holds.discard("p")
        th.join(30)
        assert got == [answer(o(2))]
        client.end_episode("p", o(3))
        wait_finished(server.env, ["p"])
        steps = loop.steps["p"]
        assert [float(s[0]["default_agent"][0]) for s in steps] == [2.0, 3.0]
        assert server.env.stats["abandoned"] == 0
    finally:
        client.close()
        proxy.close()
