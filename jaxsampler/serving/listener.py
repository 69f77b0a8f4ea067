"""The policy server's event loop: :class:`HTTPServer` listens, accepts, evicts and ticks.

One asyncio event loop in a daemon thread serves every connection (no thread per
connection: the sampler's thread does not compete with dozens of handler threads for the
GIL); each accepted socket becomes a :class:`~jaxsampler.serving.http.Connection` (after a
TLS handshake with an ``ssl_context``), and a periodic tick lets every connection check its
deadlines. A subclass answers the requests (:meth:`HTTPServer._dispatch`): the policy
server, :class:`~jaxsampler.serving.server.PolicyServer`.

Connections: at most ``max_connections`` are served; beyond that the oldest idle
keep-alive connection is closed to make room, or, with none idle, the newcomer gets 503 and
is closed. When the process runs out of file descriptors, ``accept`` is retried after
closing idle connections (oldest first), with one log line per 10 s that counts the
failures, and serving recovers by itself.

Clocks: the tick also ticks the server's
:class:`~jaxsampler.host_envs.external.clock.RunningClock`; when it sees that the whole
process did not run for a while (``SIGSTOP``, a paused VM), every connection's deadlines move
on by that pause (:func:`shift_deadlines`), so nobody is timed out for time in which the
server could not read. With a ``client_gone_grace_s``, :class:`ClientPresence` notices a
client (``X-Client-Id``) whose last connection its peer closed and that did not come back
within the grace: :meth:`HTTPServer._client_gone` is told.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import heapq
import logging
import socket
import ssl
import threading
import time
from typing import Any, TypeVar

from jaxsampler.host_envs.external.clock import RunningClock, process_clock
from jaxsampler.serving.http import LINGER_S, Connection, Limits, Request

__all__ = ["ClientPresence", "HTTPServer", "listen", "shift_deadlines"]

# The policy server's one logger (its name predates this module).
_log = logging.getLogger("jaxsampler.serving.server")

_ACCEPT_BATCH = 64  # connections accepted per readiness event of the listening socket
_ACCEPT_LOG_INTERVAL_S = 10.0  # at most one log line per this long about failing accepts
_ACCEPT_RETRY_S = (0.05, 0.5)  # retry delay after a failed accept: freed something / not
_EVICT_ON_EMFILE = 4  # idle connections closed per failed accept
#: clients (X-Client-Id values) tracked per connection; more are not (a bound on memory)
_CLIENTS_PER_CONNECTION = 64
_DESCRIPTOR_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

_S = TypeVar("_S", bound="HTTPServer")


class HTTPServer:
    """Serves HTTP/1.1 on ``host:port`` from an asyncio event loop in a daemon thread (see
    the module docstring); a subclass answers the requests (:meth:`_dispatch`).

    The constructor binds the listening socket (raising ``OSError`` if it cannot); the
    subclass's constructor calls :meth:`_serve` once it is ready, which starts the loop.
    Use as a context manager or call :meth:`close`.

    Args:
        host / port: the address to bind (port 0: a free one, see :attr:`address`).
        limits: what one request and one connection may cost.
        ssl_context: a server-side :class:`ssl.SSLContext`: serve HTTPS.
        tick_s: how often connections check their deadlines (:meth:`Connection.check_timeouts`).
        name: the loop thread's name.
        clock: the running clock whose detected pauses move deadlines on (see the module
            docstring); default the process's.
        client_gone_grace_s: how long a client whose peer closed its last connection may
            take to come back before :meth:`_client_gone` is called for it; ``None``: never.
    """

    #: what the accepted connections are (a subclass may extend :class:`Connection`)
    _connection_class: type[Connection] = Connection
    #: header lines (each ending in CRLF) sent with every answer; a subclass sets its own
    answer_headers = ""

    def __init__(
        self,
        host: str,
        port: int,
        limits: Limits,
        *,
        ssl_context: ssl.SSLContext | None = None,
        tick_s: float = 1.0,
        name: str = "HTTPServer",
        clock: RunningClock | None = None,
        client_gone_grace_s: float | None = None,
    ):
        if client_gone_grace_s is not None and not client_gone_grace_s >= 0:
            raise ValueError(
                f"client_gone_grace_s must be >= 0 or None, got {client_gone_grace_s!r}"
            )
        self.limits = limits
        self._lsock = listen(host, port)  # first: nothing to clean up if it cannot bind
        self._ssl = ssl_context
        self._tick_s = tick_s
        self._name = name
        self._conns: set[Connection] = set()  # open connections, closing ones included
        #: closed connections whose deadlines still run (a policy server's numbered
        #: get_action that waits on for its client's retry)
        self._lingering: set[Connection] = set()
        self._live: set[Connection] = set()  # ... not closing: what max_connections counts
        self._handshaking = 0  # accepted sockets not yet connections (TLS handshakes)
        self._tasks: set[asyncio.Task] = set()
        self._accept_failures = 0  # since the last log line about them
        self._accept_log_at = 0.0  # when the next such line may be written
        self._closed = False
        self._sockname = self._lsock.getsockname()
        #: the running clock (pauses of the process move deadlines on)
        self.clock = process_clock() if clock is None else clock
        self._paused_seen = self.clock.paused_s  # pauses whose deadlines were moved already
        #: which clients are connected (``None`` without ``client_gone_grace_s``)
        self.presence = None if client_gone_grace_s is None else ClientPresence(client_gone_grace_s)
        self._clients_of: dict[Connection, set[str | None]] = {}  # connection -> its clients

    def _serve(self) -> None:
        """Starts the event loop in its thread; returns once it accepts connections."""
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.add_reader(self._lsock.fileno(), self._accept)
            self._loop.call_later(self._tick_s, self._tick)
            ready.set()
            self._loop.run_forever()
            self._loop.remove_reader(self._lsock.fileno())
            self._lsock.close()
            for c in list(self._conns):
                if c.transport is not None:
                    c.transport.close()
            self._loop.run_until_complete(asyncio.sleep(0.05))  # flush the last answers
            for t in list(self._tasks):
                t.cancel()
            self._loop.close()

        self._thread = threading.Thread(target=run, name=self._name, daemon=True)
        self._thread.start()
        ready.wait()

    def _stop(self) -> None:
        """Stops the event loop (its thread then closes the listening socket and every
        connection) and waits for its thread."""
        # Also when the loop thread has not reached run_forever yet: it stops on its first
        # turn. A RuntimeError means the loop is closed already.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    @property
    def address(self) -> str:
        """``"http://host:port"`` (``https`` with an ``ssl_context``)."""
        host, port = self._sockname[:2]
        if ":" in host:
            host = f"[{host}]"
        return f"{'https' if self._ssl is not None else 'http'}://{host}:{port}"

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """Stops serving and drops open connections. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop()

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- what a subclass decides (event-loop thread) ---------------------------------------

    def _dispatch(self, conn: Connection, req: Request) -> None:
        """Answers ``req`` (``conn.respond`` / ``conn.error`` / ``conn.exception``), or marks
        ``conn.busy`` and calls ``conn.done()`` once it has answered (later, or from another
        thread with :meth:`Connection.done_threadsafe`). An exception it raises is answered
        with :meth:`Connection.exception`."""
        raise NotImplementedError

    def _authorized(self, auth: list[bytes]) -> bool:
        """Whether a request with these ``Authorization`` values may be served (else 401 and
        the connection closes). Default: every request."""
        return True

    def _client_gone(self, client_id: str | None) -> None:
        """The client ``client_id`` (``None``: the anonymous ones, together) closed its last
        connection ``client_gone_grace_s`` ago and did not come back. Default: nothing."""

    # -- client presence (event-loop thread; the connections report) ------------------------

    def _client_seen(self, conn: Connection, client_id: str | None) -> None:
        """An accepted request of ``client_id`` arrived on ``conn``: the client is present
        while ``conn`` is open (the first 64 clients of a connection are tracked)."""
        if self.presence is None:
            return
        clients = self._clients_of.setdefault(conn, set())
        if client_id not in clients and len(clients) < _CLIENTS_PER_CONNECTION:
            clients.add(client_id)
            self.presence.opened(client_id)

    def _connection_closed(self, conn: Connection, by_peer: bool) -> None:
        """``conn`` closed; ``by_peer``: the client closed it (or it broke), not the server."""
        clients = self._clients_of.pop(conn, ())
        if self.presence is not None:
            now = self.clock.now()
            for client_id in clients:
                self.presence.closed(client_id, now, by_peer and not self._closed)

    # -- connections (event-loop thread) ---------------------------------------------------

    def _accept(self) -> None:
        """The listening socket is readable: accepts what waits (a batch at a time)."""
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, _ = self._lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as e:
                self._accept_failed(e)
                return
            self._admit(sock)

    def _accept_failed(self, e: OSError) -> None:
        """``accept`` failed (out of descriptors, most likely): closes idle connections to
        make room, pauses accepting briefly, and logs one line per interval (no spinning,
        no log flood); accepting resumes by itself."""
        self._accept_failures += 1
        now = time.monotonic()
        freed = self._evict(_EVICT_ON_EMFILE) if e.errno in _DESCRIPTOR_ERRNOS else 0
        if now >= self._accept_log_at:
            _log.warning(
                "policy server: accept() failed %d time(s) in the last %.0f s (%s); "
                "closed %d idle connection(s) to make room; %d open",
                self._accept_failures,
                _ACCEPT_LOG_INTERVAL_S,
                e.strerror or e,
                freed,
                len(self._conns),
            )
            self._accept_failures, self._accept_log_at = 0, now + _ACCEPT_LOG_INTERVAL_S
        fd = self._lsock.fileno()
        self._loop.remove_reader(fd)
        delay = _ACCEPT_RETRY_S[0] if freed else _ACCEPT_RETRY_S[1]
        self._loop.call_later(delay, self._resume_accepting)

    def _resume_accepting(self) -> None:
        if not self._closed and self._lsock.fileno() >= 0:
            self._loop.add_reader(self._lsock.fileno(), self._accept)

    def _evict(self, n: int, lingering_too: bool = True) -> int:
        """Closes up to ``n`` connections nobody waits on: ones lingering after a closing
        answer first (unless not ``lingering_too``), then idle keep-alive ones, oldest first.
        Returns how many."""
        lingering = [
            c
            for c in self._conns
            if c.closing and c.transport is not None and not c.transport.is_closing()
        ]
        idle = heapq.nsmallest(
            n,
            (c for c in self._live if c.idle and c.transport is not None),
            key=lambda c: c.last_activity,
        )
        victims = ((lingering if lingering_too else []) + idle)[:n]
        for c in victims:
            assert c.transport is not None
            if c.closing:  # its answer is out: no need to let the peer read it first
                c.transport.abort()
            else:
                c.close_soon()
                c.transport.close()
        return len(victims)

    def _admit(self, sock: socket.socket) -> None:
        """Wraps an accepted socket into a :class:`Connection` (TLS handshake first)."""
        if self._closed:
            sock.close()
            return
        sock.setblocking(False)
        refuse = len(self._live) + self._handshaking >= self.limits.max_connections
        if refuse and self._evict(1, lingering_too=False):  # lingering ones do not count
            refuse = False
        self._handshaking += 1
        task = self._loop.create_task(self._wrap(sock, refuse))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _wrap(self, sock: socket.socket, refuse: bool) -> None:
        kw: dict[str, Any] = {}
        if self._ssl is not None:
            kw = {
                "ssl": self._ssl,
                "ssl_handshake_timeout": self.limits.request_timeout_s,
                "ssl_shutdown_timeout": LINGER_S,  # not 30 s: a closed connection's descriptor
            }
        try:
            await self._loop.connect_accepted_socket(
                lambda: self._connection_class(self, refuse), sock, **kw
            )
        except (OSError, asyncio.TimeoutError, ssl.SSLError) as e:  # a failed TLS handshake
            _log.debug("policy server: connection setup failed: %s", e)
            sock.close()
        finally:
            self._handshaking -= 1

    def _tick(self) -> None:
        """Periodic: deadlines move on by a detected pause of the process, then every
        connection checks its deadlines (slow requests, idle keep-alive and stalled
        connections; see :meth:`Connection.check_timeouts`); clients gone for the grace
        are reported (:meth:`_client_gone`)."""
        self.clock.tick()
        pause = self.clock.paused_s - self._paused_seen
        if pause > 0:
            self._paused_seen += pause
            for c in list(self._conns) + list(self._lingering):
                shift_deadlines(c, pause)
        now = time.monotonic()
        for c in list(self._conns) + list(self._lingering):
            c.check_timeouts(now)
        if self.presence is not None and not self._closed:
            for client_id in self.presence.gone(self.clock.now()):
                try:
                    self._client_gone(client_id)
                except Exception:
                    _log.exception("policy server: ending the episodes of a gone client failed")
        if not self._closed:
            self._loop.call_later(self._tick_s, self._tick)


def shift_deadlines(conn: Connection, pause: float) -> None:
    """Moves ``conn``'s deadlines (idle keep-alive, request arrival, unread answers) ``pause``
    seconds on, and those of a subclass with a ``shift_deadlines(pause)`` method: the process
    did not run for that long, so none of it counts against the peer."""
    conn.last_activity += pause
    if conn.req is not None:
        conn.req.started += pause
    if conn.write_paused_since is not None:
        conn.write_paused_since += pause
    more = getattr(conn, "shift_deadlines", None)
    if more is not None:
        more(pause)


class ClientPresence:
    """Which clients have a connection open, and which are gone: the peer closed their last
    connection ``grace_s`` ago or more, and none opened since. A client is an ``X-Client-Id``
    (``None`` stands for every anonymous request: one client, present while any anonymous
    connection is open). Times are running time (the caller's clock).

    Raises:
        ValueError: ``grace_s`` is negative.
    """

    def __init__(self, grace_s: float):
        if not grace_s >= 0:
            raise ValueError(f"grace_s must be >= 0, got {grace_s!r}")
        self.grace_s = float(grace_s)
        self._open: dict[str | None, int] = {}  # client -> its open connections
        self._left: dict[str | None, float] = {}  # client -> when its peer closed the last one

    def opened(self, client: str | None) -> None:
        """A connection of ``client`` counts (its first accepted request arrived)."""
        self._open[client] = self._open.get(client, 0) + 1
        self._left.pop(client, None)

    def closed(self, client: str | None, now: float, by_peer: bool) -> None:
        """A connection of ``client`` closed at ``now``; its grace starts if it was the last
        one and ``by_peer`` (a connection the server closed, say an idle keep-alive one, says
        nothing about the client)."""
        n = self._open.get(client, 0) - 1
        if n > 0:
            self._open[client] = n
            return
        self._open.pop(client, None)
        if by_peer:
            self._left[client] = now

    def connected(self, client: str | None) -> bool:
        """Whether ``client`` has a connection open."""
        return client in self._open

    def gone(self, now: float) -> list[str | None]:
        """The clients whose grace ran out by ``now``, oldest first; each is reported once."""
        due = [c for c, t in self._left.items() if now - t >= self.grace_s]
        for c in due:
            del self._left[c]
        return due


def listen(host: str, port: int) -> socket.socket:
    """A non-blocking listening TCP socket on ``host:port`` (raises OSError if it cannot bind)."""
    family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.create_server((host, port), family=family, backlog=1024)
    sock.setblocking(False)
    return sock
