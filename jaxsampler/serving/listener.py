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

from jaxsampler.serving.http import LINGER_S, Connection, Limits, Request

__all__ = ["HTTPServer", "listen"]

# The policy server's one logger (its name predates this module).
_log = logging.getLogger("jaxsampler.serving.server")

_ACCEPT_BATCH = 64  # connections accepted per readiness event of the listening socket
_ACCEPT_LOG_INTERVAL_S = 10.0  # at most one log line per this long about failing accepts
_ACCEPT_RETRY_S = (0.05, 0.5)  # retry delay after a failed accept: freed something / not
_EVICT_ON_EMFILE = 4  # idle connections closed per failed accept
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
    """

    #: what the accepted connections are (a subclass may extend :class:`Connection`)
    _connection_class: type[Connection] = Connection

    def __init__(
        self,
        host: str,
        port: int,
        limits: Limits,
        *,
        ssl_context: ssl.SSLContext | None = None,
        tick_s: float = 1.0,
        name: str = "HTTPServer",
    ):
        self.limits = limits
        self._lsock = listen(host, port)  # first: nothing to clean up if it cannot bind
        self._ssl = ssl_context
        self._tick_s = tick_s
        self._name = name
        self._conns: set[Connection] = set()  # open connections, closing ones included
        self._live: set[Connection] = set()  # ... not closing: what max_connections counts
        self._handshaking = 0  # accepted sockets not yet connections (TLS handshakes)
        self._tasks: set[asyncio.Task] = set()
        self._accept_failures = 0  # since the last log line about them
        self._accept_log_at = 0.0  # when the next such line may be written
        self._closed = False
        self._sockname = self._lsock.getsockname()

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
        """Periodic: every connection checks its deadlines (slow requests, idle keep-alive
        and stalled connections; see :meth:`Connection.check_timeouts`)."""
        now = time.monotonic()
        for c in list(self._conns):
            c.check_timeouts(now)
        if not self._closed:
            self._loop.call_later(self._tick_s, self._tick)


def listen(host: str, port: int) -> socket.socket:
    """A non-blocking listening TCP socket on ``host:port`` (raises OSError if it cannot bind)."""
    family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.create_server((host, port), family=family, backlog=1024)
    sock.setblocking(False)
    return sock
