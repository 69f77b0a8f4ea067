"""The HTTP layer on its own (:mod:`jaxsampler.serving.http`, :mod:`jaxsampler.serving.listener`):
a trivial server that echoes requests, independent of :class:`PolicyServer` and of any env.
Loopback only; every wait is bounded by the sockets' timeouts."""

from __future__ import annotations

import threading

import pytest

from jaxsampler.serving.http import Connection, Limits, Request
from jaxsampler.serving.listener import HTTPServer
from tests.serving.test_http_edges import Responses, connect, get, json_error, until

LIMITS = {
    "max_body_bytes": 1 << 10,
    "max_url_bytes": 256,
    "max_header_bytes": 4 << 10,
    "max_headers": 16,
    "max_pipelined": 4,
    "max_pipelined_bytes": 4 << 10,
    "max_connections": 8,
    "request_timeout_s": 10.0,
    "keepalive_timeout_s": 60.0,
}


class Echo(HTTPServer):
    """Answers ``METHOD URL BODY``; ``/later`` is answered from another thread once
    ``release`` is set, ``/boom`` raises."""

    def __init__(self, **limits: float):
        super().__init__("127.0.0.1", 0, Limits(**{**LIMITS, **limits}), tick_s=0.05, name="Echo")
        self.release = threading.Event()
        self._serve()

    def _dispatch(self, conn: Connection, req: Request) -> None:
        url = b"".join(req.url)
        if url == b"/boom":
            raise RuntimeError("boom")
        answer = req.method + b" " + url + b" " + b"".join(req.body)
        if url == b"/later":
            conn.busy = True

            def later() -> None:
                self.release.wait(10.0)  # hang guard
                conn.done_threadsafe(lambda: conn.respond(200, answer))

            threading.Thread(target=later, daemon=True).start()
            return
        conn.respond(200, answer)


def post(path: str, body: bytes) -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def test_pipelined_requests_are_answered_in_order_also_when_one_is_answered_later():
    with Echo() as server, connect(server) as sock:
        server.release.set()
        sock.sendall(get("/a") + post("/later", b"x") + post("/b", b"yz") + get("/c"))
        bodies = [r["body"] for r in Responses(sock).read(4)]
        assert bodies == [b"GET /a ", b"POST /later x", b"POST /b yz", b"GET /c "]


def test_a_failing_handler_gets_500_and_the_connection_keeps_serving(caplog):
    with Echo() as server, connect(server) as sock:
        sock.sendall(get("/boom") + get("/ok"))
        rs = Responses(sock)
        err, ok = rs.read(2)
        assert json_error(err, 500)["error"] == "RuntimeError"
        assert ok["status"] == 200 and ok["body"] == b"GET /ok "
        assert "unexpected error" in caplog.text


@pytest.mark.parametrize(
    "request_bytes, status",
    [
        (get("/" + "u" * 300), 414),  # URL over max_url_bytes
        (post("/p", b"b" * 2000), 413),  # body over max_body_bytes: refused unread
        (b"POST /p HTTP/1.1\r\nHost: t\r\n\r\n", 411),  # no Content-Length
        (b"NOT HTTP\r\n\r\n", 400),
    ],
)
def test_refused_requests_are_answered_then_the_connection_closes(request_bytes, status):
    with Echo() as server, connect(server) as sock:
        sock.sendall(request_bytes)
        rs = Responses(sock)
        (r,) = rs.read(1)
        json_error(r, status)
        assert r["headers"]["connection"] == "close" and rs.closed()


def test_beyond_max_connections_a_newcomer_closes_an_idle_one_or_gets_503():
    with Echo(max_connections=1) as server, connect(server) as idle:
        idle.sendall(get("/a"))
        Responses(idle).read(1)
        with connect(server) as newcomer:  # the idle one makes room
            assert Responses(idle).closed()
            newcomer.sendall(post("/later", b""))  # busy: it cannot be evicted
            until(lambda: any(c.busy for c in server._live))
            with connect(server) as third:
                rs = Responses(third)
                (r,) = rs.read(1)
                assert json_error(r, 503)["error"] == "CapacityError" and rs.closed()
            server.release.set()
            assert Responses(newcomer).read(1)[0]["body"] == b"POST /later "


def test_idle_keepalive_connections_close_and_closing_the_server_stops_it():
    with Echo(keepalive_timeout_s=0.2) as server, connect(server) as sock:
        sock.sendall(get("/a"))
        rs = Responses(sock)
        rs.read(1)
        assert rs.closed()  # the tick closed it once it was idle for 0.2 s
    assert server.closed and not server._thread.is_alive()
    with pytest.raises(OSError):
        connect(server, timeout=1.0)
