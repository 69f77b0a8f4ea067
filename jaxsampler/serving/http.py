"""The policy server's HTTP/1.1 connections: parsing, limits, pipelining, deadlines, answers.

A :class:`Connection` is one client connection, served in the event-loop thread of its
:class:`~jaxsampler.serving.listener.HTTPServer` (which accepts them). Requests are parsed
by ``httptools`` (llhttp, Node.js's parser) and answered in order, one at a time, by the
server's ``_dispatch`` (the policy server's: :class:`~jaxsampler.serving.server.PolicyServer`).
This layer knows nothing of what a request means; it speaks the protocol's headers
(``Authorization``, ``X-Client-Id``), content type and JSON error body
(:mod:`jaxsampler.serving.protocol`).

Limits and flow control
-----------------------
Every limit is a field of :class:`Limits` (a :class:`~jaxsampler.serving.server.PolicyServer`
keyword option with a safe default); a request over one costs the server O(its size) memory
and time and gets a 4xx with the JSON error body: URLs over ``max_url_bytes`` get 414, more
than ``max_headers`` headers or ``max_header_bytes`` of them 431 (both answered, then the
connection closes), bodies over ``max_body_bytes`` 413 (not read), and a request whose last
byte has not arrived ``request_timeout_s`` after its first 408 (then the connection closes:
slow senders cannot hold a connection by trickling bytes). A connection stops being read
while ``max_pipelined`` requests or ``max_pipelined_bytes`` wait unanswered on it, or while
its answers are not read (the transport's write buffer is full), and is read again once they
drain: what one connection holds is bounded by about ``max_pipelined_bytes +
max_body_bytes`` plus one answer. Idle keep-alive connections close ``keepalive_timeout_s``
after their last complete request or answer (bytes that start no request do not count); so
does a connection whose peer reads none of its answers for that long. ``max_connections``:
see :mod:`~jaxsampler.serving.listener`.

Errors found while reading a request (400 on the HTTP level, 401, 408, 411, 413 on the body
size, 414, 431) close the connection after the answer; the server keeps serving after every
error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Protocol

import httptools

from jaxsampler.serving.protocol import (
    AUTH_SCHEME,
    CLIENT_ID_HEADER,
    CLIENT_ID_PATTERN,
    CONTENT_TYPE,
    EPOCH_HEADER,
    ERRORS_BY_NAME,
    PROTOCOL_VERSION,
    STATUS_OF_ERROR,
)


class ConnectionOwner(Protocol):
    """What a :class:`Connection` needs of the server that accepted it
    (:class:`~jaxsampler.serving.listener.HTTPServer` is the one implementation). Declared
    here, so the connection layer does not import the listener that imports it."""

    @property
    def limits(self) -> Limits:
        """The server's request limits."""
        ...

    @property
    def answer_headers(self) -> str:
        """Header lines (each ending in CRLF) sent with every answer (the server's epoch)."""
        ...

    @property
    def _conns(self) -> set[Connection]: ...

    @property
    def _live(self) -> set[Connection]: ...

    @property
    def _loop(self) -> asyncio.AbstractEventLoop: ...

    def _authorized(self, auth: list[bytes]) -> bool: ...

    def _dispatch(self, conn: Connection, req: Request) -> None: ...


__all__ = ["LINGER_S", "BadRequest", "Connection", "HTTPError", "Limits", "Request", "status_of"]

# The policy server's one logger (its name predates this module).
_log = logging.getLogger("jaxsampler.serving.server")

_CLIENT_ID = re.compile(CLIENT_ID_PATTERN.encode())
_CLIENT_ID_NAME = CLIENT_ID_HEADER.lower().encode()
_EPOCH_NAME = EPOCH_HEADER.lower().encode()
_FEED_SLICE = 16 << 10  # bytes fed to the parser at a time (bounds what one feed can queue)
#: after an answer that closes: how long the peer may still send (see Connection.respond)
LINGER_S = 2.0


class BadRequest(ValueError):
    """A malformed request (400 ``InvalidDataError``)."""


class HTTPError(Exception):
    """A request refused with a specific HTTP status and error name."""

    def __init__(self, status: int, name: str, message: str):
        super().__init__(message)
        self.status, self.name = status, name


def status_of(e: BaseException) -> tuple[int, str]:
    """HTTP status and error name of an exception raised while serving a command."""
    if isinstance(e, HTTPError):
        return e.status, e.name
    for cls, status in STATUS_OF_ERROR:
        if isinstance(e, cls):
            name = type(e).__name__
            return status, name if name in ERRORS_BY_NAME or status != 400 else "InvalidDataError"
    _log.error("policy server: unexpected error", exc_info=e)
    return 500, type(e).__name__


@dataclass(frozen=True)
class Limits:
    """What one request and one connection may cost (see the module docstring); every
    field must be positive."""

    max_body_bytes: int
    max_url_bytes: int
    max_header_bytes: int
    max_headers: int
    max_pipelined: int
    max_pipelined_bytes: int
    max_connections: int
    request_timeout_s: float
    keepalive_timeout_s: float

    def __post_init__(self) -> None:
        for name, v in vars(self).items():
            if not v > 0:
                raise ValueError(f"{name} must be > 0, got {v!r}")


_REASONS = {s.value: s.phrase for s in HTTPStatus}
_SERVER = f"jaxsampler-policy-server/{PROTOCOL_VERSION}"
_WWW_AUTHENTICATE = f'WWW-Authenticate: {AUTH_SCHEME} realm="jaxsampler"\r\n'


class Request:
    """One HTTP request as parsed so far (the httptools callbacks of its
    :class:`Connection` fill it)."""

    __slots__ = (
        "url",
        "url_size",
        "head_size",
        "headers",
        "head_raw",
        "headers_done",
        "started",
        "body",
        "size",
        "content_length",
        "chunked",
        "if_none_match",
        "auth",
        "client_id",
        "epoch",
        "error",
        "keep_alive",
        "method",
    )

    def __init__(self) -> None:
        self.url: list[bytes] = []  # fragments as the parser hands them over (joined once)
        self.url_size = 0
        self.head_size = 0  # bytes of the header lines seen so far
        self.headers = 0
        self.head_raw = 0  # bytes fed while this request's head was incomplete (see _parse)
        self.headers_done = False
        self.started = time.monotonic()  # its first byte (request_timeout_s counts from here)
        self.body: list[bytes] = []
        self.size = 0
        self.content_length: int | None = None
        self.chunked = False
        self.if_none_match = b""
        self.auth: list[bytes] = []  # Authorization header values
        self.client_id: str | None = None
        self.epoch: bytes | None = None  # the server run the client last heard from
        self.error: tuple[int, str, str] | None = (
            None  # found while parsing: answered, then the connection closes
        )
        self.keep_alive = True
        self.method = b""

    def refuse(self, status: int, name: str, message: str) -> None:
        """Records the first problem found; the request is answered with it."""
        if self.error is None:
            self.error = (status, name, message)


class Connection(asyncio.Protocol):
    """One client connection, served in the event-loop thread. Requests on it are answered
    in order, one at a time: the server's :meth:`HTTPServer._dispatch` marks the connection
    ``busy`` when it answers later (a ``get_action`` holds the connection until its answer)
    and calls :meth:`done` once it has.

    Flow control: reading pauses while too much waits unanswered (:meth:`_congested`) or
    while the peer does not read its answers (``pause_writing``), and resumes when both
    drained; bytes read past the point where it paused wait in ``stash``."""

    def __init__(self, server: ConnectionOwner, refuse: bool = False):
        self.server = server
        self.limits = server.limits
        self.refuse = refuse  # over max_connections: answered with 503, then closed
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.req: Request | None = None  # the request being parsed
        self.queue: deque[Request] = deque()
        self.busy = False  # a request is being answered
        self.closing = False
        self.broken = False  # the request stream could not be parsed further: the rest is dropped
        self.current: Request | None = None  # the request being answered
        self.last_activity = time.monotonic()
        self.read_paused = False  # by flow control (not by the peer)
        self.write_paused_since: float | None = None  # the peer does not read its answers
        self.stash = b""  # read while pausing: parsed when reading resumes

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Registers the connection with its server (or refuses it: over ``max_connections``)."""
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server._conns.add(self)
        self.server._live.add(self)
        if self.refuse:
            n = self.limits.max_connections
            self.error(503, "CapacityError", f"{n} connections are open (max_connections)", True)

    def connection_lost(self, exc: Exception | None) -> None:
        """The peer or the server closed the connection: nothing more is read or answered."""
        self.close_soon()
        self.stash = b""
        self.server._conns.discard(self)

    def data_received(self, data: bytes) -> None:
        """Parses what arrived, answering as it goes (or keeps it while reading pauses)."""
        if self.closing or self.broken:
            return  # after an error answer: the rest is dropped until the peer closes
        # last_activity moves with whole requests and answers only: bytes that start no
        # request (blank lines, say) do not keep an idle connection open.
        if self.read_paused or self.stash:  # arrived while pausing (TLS buffers): keep order
            self.stash += data
            return
        self._feed(data)

    def eof_received(self) -> bool | None:
        """The peer closed its side."""
        return None  # close our side too

    def pause_writing(self) -> None:
        """The peer does not read its answers: no more are sent until it does."""
        self.write_paused_since = time.monotonic()

    def resume_writing(self) -> None:
        """The peer read its answers: serving the queued requests resumes."""
        self.write_paused_since = None
        self.server._loop.call_soon(self._next)

    # -- reading and flow control ----------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        """Parses ``data`` a slice at a time, answering as it goes; stops (and keeps the
        rest) when the connection is congested."""
        view, pos = memoryview(data), 0
        while pos < len(view) and not (self.closing or self.broken):
            if self._congested():
                self.stash = bytes(view[pos:])
                self._pause_reading()
                break
            end = min(len(view), pos + _FEED_SLICE)
            self._parse(view[pos:end])
            pos = end
            self._next()
        self._next()

    def _parse(self, chunk: memoryview) -> None:
        head_before = self.req if self.req is not None and not self.req.headers_done else None
        try:
            self.parser.feed_data(chunk)
        except httptools.HttpParserUpgrade:
            self._unparsable(
                (400, "InvalidDataError", "protocol upgrades are not supported"), upgrade=True
            )
            return
        except httptools.HttpParserError as e:
            req = self.req
            if req is not None and req.error is not None:  # a callback refused (a limit)
                self._unparsable(req.error)
            else:
                self._unparsable((400, "InvalidDataError", f"malformed HTTP request: {e}"))
            return
        req = self.req
        if req is not None and not req.headers_done and req is head_before:
            # The whole slice went into a head that is still open: httptools buffers a header
            # until it is complete, so count raw bytes too (the callbacks see it only then).
            req.head_raw += len(chunk)
            limit = self.limits.max_url_bytes + self.limits.max_header_bytes
            if req.head_raw > limit:
                self._unparsable((431, "HeadersTooLarge", f"request head over {limit} bytes"))

    def _congested(self) -> bool:
        """Whether enough waits unanswered on this connection to stop reading it."""
        if len(self.queue) >= self.limits.max_pipelined:
            return True
        if not (self.busy or self.queue):
            return False  # nothing ahead: the request being read is the next one answered
        pending = sum(r.size + r.url_size for r in self.queue)
        if self.req is not None:
            pending += self.req.size + self.req.url_size
        return pending >= self.limits.max_pipelined_bytes

    def _pause_reading(self) -> None:
        if not self.read_paused and self.transport is not None:
            self.read_paused = True
            self.transport.pause_reading()

    def _maybe_resume_reading(self) -> None:
        if self.read_paused and not self.closing and not self._congested():
            self.read_paused = False
            self.server._loop.call_soon(self._resume_reading)  # not from inside _next

    def _resume_reading(self) -> None:
        if self.closing or self.read_paused or self.transport is None:
            return
        if self.req is not None:  # the pause was ours: the request's clock restarts
            self.req.started = time.monotonic()
        stash, self.stash = self.stash, b""
        if stash:
            self._feed(stash)
        if not self.read_paused and not self.closing:
            self.transport.resume_reading()

    def _unparsable(self, error: tuple[int, str, str], upgrade: bool = False) -> None:
        """Parsing stopped: the requests parsed before are still answered, in order (they may
        sit in the same read), then ``error`` (unless one of them closes the connection),
        then the connection closes."""
        self.broken, self.req, self.stash = True, None, b""
        last = self.queue[-1] if upgrade and self.queue else None
        if last is not None and last.error is None:  # the request asking for the upgrade
            last.error = error
        else:
            req = Request()
            req.error = error
            self.queue.append(req)

    def check_timeouts(self, now: float) -> None:
        """Called by the server's periodic tick (:meth:`HTTPServer._tick`): a request that
        takes longer than ``request_timeout_s`` to arrive gets 408; idle or stalled
        connections close."""
        lim = self.limits
        if self.transport is None or self.closing:
            return
        req = self.req
        if req is not None and not self.read_paused and now - req.started > lim.request_timeout_s:
            self._unparsable(
                (
                    408,
                    "RequestTimeout",
                    f"request not received within request_timeout_s={lim.request_timeout_s} s",
                )
            )
            self._next()
        elif (
            self.write_paused_since is not None
            and now - self.write_paused_since > lim.keepalive_timeout_s
        ):
            self.transport.abort()  # the peer reads none of its answers
        elif self.idle and self.last_activity < now - lim.keepalive_timeout_s:
            self.transport.close()

    def close_soon(self) -> None:
        """Marks the connection as closing: nothing more is read or answered, and it no
        longer counts against ``max_connections`` (it may linger a moment, see respond)."""
        self.closing = True
        self.server._live.discard(self)

    @property
    def idle(self) -> bool:
        """Between requests: nothing queued, parsed in part or being answered."""
        return not (self.busy or self.queue or self.req is not None or self.stash)

    # -- httptools callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        """A request starts."""
        self.req = Request()

    def _req(self) -> Request:
        """The request being parsed (httptools calls back only inside a message)."""
        req = self.req
        assert req is not None
        return req

    def on_url(self, url: bytes) -> None:
        """A piece of the URL (414 once it is over ``max_url_bytes``)."""
        req = self._req()
        req.url_size += len(url)
        if req.url_size > self.limits.max_url_bytes:
            req.refuse(414, "URITooLong", f"URL over max_url_bytes={self.limits.max_url_bytes}")
            raise BadRequest("URL too long")  # stops the parser: see _parse
        req.url.append(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        """One header (431 beyond ``max_headers`` / ``max_header_bytes``); keeps those the
        server reads: ``Content-Length``, ``Transfer-Encoding``, ``If-None-Match``,
        ``Authorization``, ``X-Client-Id`` and ``X-Server-Epoch``."""
        req, lim = self._req(), self.limits
        req.headers += 1
        req.head_size += len(name) + len(value) + 4  # "name: value\r\n"
        if req.headers > lim.max_headers or req.head_size > lim.max_header_bytes:
            req.refuse(
                431,
                "HeadersTooLarge",
                f"more than max_headers={lim.max_headers} headers or "
                f"max_header_bytes={lim.max_header_bytes} bytes of them",
            )
            raise BadRequest("headers too large")  # stops the parser: see _parse
        name = name.lower()
        if name == b"content-length":
            try:
                req.content_length = int(value)
            except ValueError:
                req.refuse(
                    400,
                    "InvalidDataError",
                    f"bad Content-Length {value[:40].decode(errors='replace')!r}",
                )
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            req.chunked = True
        elif name == b"if-none-match":
            req.if_none_match = value
        elif name == b"authorization":
            req.auth.append(value)
        elif name == _CLIENT_ID_NAME:
            if req.client_id is not None or not _CLIENT_ID.fullmatch(value):
                req.refuse(
                    400,
                    "InvalidDataError",
                    f"one {CLIENT_ID_HEADER} header matching {CLIENT_ID_PATTERN} expected, got "
                    f"{value[:80].decode(errors='replace')!r}",
                )
            req.client_id = value.decode("ascii", errors="replace")
        elif name == _EPOCH_NAME:
            req.epoch = value

    def on_headers_complete(self) -> None:
        """The head is complete: a request refused by its head (401, 411, 413, or a problem
        found while parsing) is answered now, without reading its body."""
        req, server = self._req(), self.server
        req.headers_done = True
        req.method = self.parser.get_method()
        req.keep_alive = self.parser.should_keep_alive()
        if req.error is None and not server._authorized(req.auth):
            req.refuse(401, "Unauthorized", f"{AUTH_SCHEME} token required")
        if req.error is None:
            req.error = self._body_error(req)
        if req.error:  # answer now, without waiting for (or reading) the body
            self.queue.append(req)
            self.req = None
            self.broken = True  # nothing after it is parsed: the answer closes the connection

    def _body_error(self, req: Request) -> tuple[int, str, str] | None:
        lim = self.limits
        if req.content_length is not None and req.content_length > lim.max_body_bytes:  # any
            return (
                413,
                "PayloadTooLarge",
                f"body of {req.content_length} bytes exceeds max_body_bytes={lim.max_body_bytes}",
            )
        if req.method == b"POST" and (req.content_length is None or req.chunked):
            return (411, "LengthRequired", "Content-Length header required (no chunked bodies)")
        return None

    def on_body(self, body: bytes) -> None:
        """A piece of the body (kept for POST requests only)."""
        req = self.req
        if req is not None and req.method == b"POST":  # other methods take no body: not kept
            req.body.append(body)
            req.size += len(body)

    def on_message_complete(self) -> None:
        """The request is complete: it waits in ``queue`` for its turn."""
        self.last_activity = time.monotonic()
        if self.req is not None:
            self.queue.append(self.req)
            self.req = None

    # -- answering -------------------------------------------------------------------------

    def _next(self) -> None:
        while not self.busy and self.queue and not self.closing and self.write_paused_since is None:
            req = self.queue.popleft()
            if req.error is not None:
                status, name, message = req.error
                extra = _WWW_AUTHENTICATE if status == 401 else ""
                self.error(status, name, message, close=True, extra=extra)
                return
            self.current = req
            try:
                self.server._dispatch(self, req)
            except Exception as e:
                self.busy = False
                self.exception(e)
        self._maybe_resume_reading()

    def respond(
        self,
        status: int,
        body: bytes,
        content_type: str = CONTENT_TYPE,
        extra: str = "",
        close: bool = False,
    ) -> None:
        """Sends an answer (nothing once the connection is closing); ``close``, or a request
        that did not ask for keep-alive, closes the connection after it."""
        if self.closing or self.transport is None:
            return
        close = close or (self.current is not None and not self.current.keep_alive)
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\nServer: {_SERVER}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            f"{self.server.answer_headers}{extra}"
        )
        if close:
            head += "Connection: close\r\n"
        self.transport.write(head.encode("latin-1") + b"\r\n" + body)
        self.last_activity = time.monotonic()
        if close:
            self.close_soon()
            # Half-close and drop what the client still sends (an oversized body, say), so
            # it reads the answer before the connection goes (no reset); then close.
            if self.transport.can_write_eof():
                self.transport.write_eof()
                self.server._loop.call_later(LINGER_S, self.transport.close)
            else:
                self.transport.close()

    def error(
        self, status: int, name: str, message: str, close: bool = False, extra: str = ""
    ) -> None:
        """Sends an error answer: the JSON body ``{"error": name, "message": message}``."""
        self.respond(
            status,
            json.dumps({"error": name, "message": message}).encode(),
            "application/json",
            extra=extra,
            close=close,
        )

    def exception(self, e: BaseException) -> None:
        """Sends the error answer for an exception raised while serving (see
        :func:`status_of`)."""
        status, name = status_of(e)
        self.error(status, name, str(e) if status != 500 else f"internal error: {e}")

    def done(self) -> None:
        """The current request is answered: serve the next one queued on this connection."""
        self.busy = False
        self._next()

    def done_threadsafe(self, respond: Callable[[], None]) -> None:
        """From any thread: ``respond()`` then :meth:`done`, in the event-loop thread (nothing
        happens once the loop is closed: nobody to answer)."""
        with contextlib.suppress(RuntimeError):
            self.server._loop.call_soon_threadsafe(self._respond_and_done, respond)

    def _respond_and_done(self, respond: Callable[[], None]) -> None:
        respond()
        self.done()
