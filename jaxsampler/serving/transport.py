"""The policy client's transport: one keep-alive HTTP/1.1 connection per thread
(:class:`Connection`), and what makes a retry safe: the backoff between tries
(:func:`backoff_delays`) and, per episode this client started, the server run it belongs
to and the number of its next command (:class:`EpisodeNumbers`; the server side is
:mod:`~jaxsampler.serving.sequence`)."""

from __future__ import annotations

import socket
import ssl
import threading
from collections import OrderedDict

import httptools

__all__ = ["Connection", "EpisodeNumbers", "NotSent", "StaleConnection", "backoff_delays"]

#: episodes whose numbers a client keeps (oldest forgotten first: their calls then go
#: without ``seq``, as those of episodes started elsewhere)
MAX_NUMBERED_EPISODES = 16384


class NotSent(ConnectionError):
    """The request never left: no connection to the server could be opened (safe to retry,
    whatever the request)."""


class StaleConnection(ConnectionError):
    """The server closed the connection before answering (e.g. an idle keep-alive one)."""


class Connection:
    """A keep-alive HTTP/1.1 connection: writes a request, reads one response with
    httptools (llhttp). Used by one thread at a time."""

    def __init__(
        self, host: str, port: int, timeout: float, ssl_context: ssl.SSLContext | None = None
    ):
        self.host, self.port, self.timeout = host, port, timeout
        self.ssl_context = ssl_context
        self.sock: socket.socket | None = None
        self.used = False  # a request was answered on the current socket
        self._status = 0
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._complete = False
        self._name = b""

    def _open(self) -> socket.socket:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        except OSError as e:
            raise NotSent(f"cannot connect: {e}") from e
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.ssl_context is not None:
            try:
                sock = self.ssl_context.wrap_socket(sock, server_hostname=self.host)
            except BaseException:
                sock.close()
                raise
        self.sock, self.used = sock, False
        return sock

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        """httptools: one response header."""
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        """httptools: a piece of the response body."""
        self._body.append(body)

    def on_message_complete(self) -> None:
        """httptools: the response is complete."""
        self._complete = True

    def round_trip(self, request: bytes) -> tuple[int, dict, bytes]:
        """Sends ``request`` and reads its response: ``(status, headers, body)``."""
        sock = self.sock or self._open()
        try:
            sock.sendall(request)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLEOFError) as e:
            raise StaleConnection(str(e)) from None
        parser = httptools.HttpResponseParser(self)
        self._headers, self._body, self._complete = {}, [], False
        got = False
        while not self._complete:
            try:
                chunk = sock.recv(1 << 16)
            except (ConnectionResetError, ssl.SSLEOFError) as e:
                if got:
                    raise
                raise StaleConnection(str(e)) from None
            if not chunk:
                if got:
                    raise ConnectionError("the server closed the connection mid-answer")
                raise StaleConnection("the server closed the connection")
            got = True
            try:
                parser.feed_data(chunk)
            except httptools.HttpParserError as e:
                self.close()
                raise ConnectionError(f"malformed HTTP answer: {e}") from None
        status = parser.get_status_code()
        self.used = True
        if self._headers.get("connection", "").lower() == "close":
            self.close()
        return status, self._headers, b"".join(self._body)

    def close(self) -> None:
        """Closes the socket (the next request opens a new one)."""
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None


def backoff_delays(retries: int, backoff_s: float) -> list[float]:
    """The waits before each retry: ``backoff_s``, twice that, four times ... (``retries``
    of them)."""
    return [backoff_s * 2**i for i in range(retries)]


class EpisodeNumbers:
    """Per episode this client started: the server run (epoch) it lives in and the ``seq``
    of its next command (``start_episode`` is 0; a number is used up by a success only).
    Thread-safe; at most :data:`MAX_NUMBERED_EPISODES` episodes, oldest forgotten first."""

    def __init__(self) -> None:
        self._eps: OrderedDict[str, list] = OrderedDict()  # id -> [epoch, next seq]
        self._lock = threading.Lock()

    def started(self, eid: str, epoch: str | None, numbered: bool = True) -> None:
        """``eid`` started in the server run ``epoch``; its next command is number 1
        (``numbered=False``: its commands go without numbers)."""
        with self._lock:
            self._eps[eid] = [epoch, 1 if numbered else None]
            self._eps.move_to_end(eid)
            while len(self._eps) > MAX_NUMBERED_EPISODES:
                self._eps.popitem(last=False)

    def get(self, eid: object) -> tuple[str | None, int | None]:
        """``(epoch, next seq)`` of ``eid``; ``(None, None)`` for an episode not started here."""
        with self._lock:
            entry = self._eps.get(eid) if isinstance(eid, str) else None
            return (None, None) if entry is None else (entry[0], entry[1])

    def adopt(self, eid: str, epoch: str | None, seq: int) -> None:
        """``eid`` (in the server run ``epoch``) continues with number ``seq`` (a resync)."""
        self.started(eid, epoch)
        with self._lock:
            if eid in self._eps:
                self._eps[eid][1] = seq

    def advance(self, eid: str, seq: int) -> None:
        """Command ``seq`` of ``eid`` succeeded: the next one is ``seq + 1``."""
        with self._lock:
            entry = self._eps.get(eid)
            if entry is not None and entry[1] is not None and entry[1] == seq:
                entry[1] = seq + 1

    def forget(self, eid: str) -> None:
        """``eid`` ended: nothing more is numbered for it."""
        with self._lock:
            self._eps.pop(eid, None)
