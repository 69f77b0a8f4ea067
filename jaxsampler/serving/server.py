"""HTTP policy serving: :class:`PolicyServer` (the client is :mod:`jaxsampler.serving.client`).

The server owns an :class:`~jaxsampler.host_envs.external.ExternalEnv` (or the multi-agent
variant) and is itself a :class:`~jaxsampler.host_envs.base.HostEnv` (``poll`` /
``send_actions`` go to that env), so any host sampler can sample from it: experience of
remote clients ends up in the sampler's episodes and batches.

The stack: HTTP/1.1 with keep-alive, parsed by ``httptools`` (llhttp, Node.js's parser)
on both ends. The server is one asyncio event loop in a daemon thread serving every
connection: a ``get_action`` is queued into the env without blocking anything, and the
sampler's answers for a whole batch wake the loop once (no thread per connection, so
the sampler's thread does not compete with dozens of handler threads for the GIL). Calls
that may block (``log_action`` under back pressure, ``/batch``) run on a small worker
pool. The client keeps one socket per thread.

Protocol (version 2)
--------------------
Bodies are msgpack (``Content-Type: application/msgpack``) encoded with
:func:`jaxsampler.offline.packb`: numpy arrays travel as raw bytes plus dtype and
shape (msgpack ext type 1), numpy scalars as type 2, tuples as type 3. Plain lists and
numbers work too; the server validates every observation / action against the env's
spaces and casts it to the space's dtype.

====================  ===================================================  ==================
endpoint              request body                                         200 response body
====================  ===================================================  ==================
POST /start_episode   ``{episode_id: str|nil, training_enabled: bool}``    ``{episode_id}``
POST /get_action      ``{episode_id, observation}``                        ``{action}``
POST /log_action      ``{episode_id, observation, action, info?}``         ``{}``
POST /log_returns     ``{episode_id, reward, info?, done?}``               ``{}``
POST /end_episode     ``{episode_id, observation, truncated?: bool}``      ``{}``
POST /batch           ``{commands: [{command: <name>, ...fields}, ...]}``  ``{done: n, errors}``
GET  /weights         header ``If-None-Match: "<version>"`` optional       ``{version, params}``
GET  /info            --                                                   ``{protocol,
                                                                           multi_agent,
                                                                           agent_ids,
                                                                           weights_version,
                                                                           observation_space,
                                                                           action_space}``
====================  ===================================================  ==================

Any POST body may carry ``returns: [{episode_id, reward, info?, done?}, ...]``: those
``log_returns`` calls run first, in order; if one fails, the command is not run and its
error is the answer (message prefixed ``deferred log_returns``). This is how a remote
:class:`~jaxsampler.serving.client.PolicyClient` sends ``log_returns`` without a round
trip of its own (version 2; version 1 had no such field).

Multi-agent envs take dicts ``agent -> value`` for ``observation``, ``action``,
``reward``, ``info`` and ``done`` (``multiagent_done_dict``). ``/batch`` runs the
non-blocking commands (not ``get_action``) in order; a refused command does not stop the
others and is reported in ``errors`` (``[{index, status, error, message}]``); it is how
local-inference clients ship experience. ``/weights`` answers ``304`` when the
client's version is current and ``404`` before :meth:`PolicyServer.set_weights`.

Errors have a JSON body ``{"error": <exception name>, "message": str}``:
400 malformed body / bad data (wrong shape, unknown agent, missing field, episode id too
long, bad ``X-Client-Id``), 401 no or wrong token (with ``WWW-Authenticate: Bearer``), 404
unknown episode (or another client's) or path, 405 wrong method, 408 request not received
within ``request_timeout_s``, 409 wrong episode state (already started, completed,
abandoned, a get_action still waiting), 411 no ``Content-Length``, 413 body over
``max_body_bytes`` (the connection is closed without reading it) or too many commands, 414
URL too long, 431 too many or too large headers, 503 capacity (connections, episodes, the
client's quota) or closed, 504 no action within the env's ``action_timeout_s``, 500
anything unexpected. Errors found while reading a request (400 on the HTTP level, 401, 408,
411, 413 on the body size, 414, 431) close the connection after the answer; the server
keeps serving after every error.

A client that disconnects while its ``get_action`` waits is noticed at once (the event
loop sees the connection close): its episode is abandoned and ends as truncated (see
:mod:`~jaxsampler.host_envs.external`); other episodes are untouched. A client that
vanishes between calls is caught by the env's ``episode_timeout_s``.

Local inference: ``PolicyClient(inference_mode="local", policy=...)`` pulls the params
every ``update_interval`` seconds, computes actions with one jitted call per
``get_action`` and ships each step as ``log_action`` with ``info[CLIENT_POLICY_INFO] =
{"weights_version", "extra_model_outputs"}`` (batched in the background through
``/batch``): the server's sampler records the client's action (``off_policy_actions``)
with the behaviour policy's version and logp.

Limits and flow control
-----------------------
Every limit is a :class:`PolicyServer` keyword option with a safe default; a request over one
costs the server O(its size) memory and time and gets a 4xx with the JSON error body: URLs over
``max_url_bytes`` get 414, more than ``max_headers`` headers or ``max_header_bytes`` of them 431
(both answered, then the connection closes), bodies over ``max_body_bytes`` 413 (not read),
more than ``max_batch_commands`` commands (or deferred ``returns``) in one body 413, episode ids
longer than ``max_episode_id_len`` 400, and a request whose last byte has not arrived
``request_timeout_s`` after its first 408 (then the connection closes: slow senders cannot
hold a connection by trickling bytes). A connection stops being read while ``max_pipelined``
requests or ``max_pipelined_bytes`` wait unanswered on it, or while its answers are not read
(the transport's write buffer is full), and is read again once they drain: what one
connection holds is bounded by about ``max_pipelined_bytes + max_body_bytes`` plus one
answer. Idle keep-alive connections close ``keepalive_timeout_s`` after their last complete
request or answer (bytes that start no request do not count). At most
``max_connections`` connections are served: beyond that the oldest idle keep-alive connection
is closed to make room, or, with none idle, the newcomer gets 503 and is closed. When the
process runs out of file descriptors, ``accept`` is retried after closing idle connections
(oldest first), with one log line per 10 s that counts the failures, and serving recovers by
itself. A small ``/batch`` (up to 8 KiB, 32 commands) runs at once on the event loop like a
single command; a bigger one runs on a two-thread pool in slices of 32 commands, round-robin
across connections, so a caller shipping huge batches delays others by about one slice each;
a batch whose command must wait for room (the env's back pressure) waits on the blocking
pool, not on the batch pool.

Security
--------
Threat model. The server binds loopback by default. Without a ``token`` any local user (any
process that can reach the port) can act as a client: start episodes, inject experience,
read ``/weights`` and ``/info``. With ``token`` every request must carry ``Authorization:
Bearer <token>`` (compared in constant time) or gets 401 and the connection closes; without
TLS the token and all data cross the network in clear, so anything beyond loopback should
use ``token`` and ``ssl_context`` together (the client: an ``https://`` address). Clients
name themselves with an ``X-Client-Id`` header (random per :class:`PolicyClient`): the
server runs each call as that owner, so a client cannot see or touch another client's
episodes (404, as if unknown), and the env's per-owner quota
(``max_episodes_per_owner``) applies; requests without the header share one anonymous
owner (so header-less clients can touch each other's episodes). Client ids are
self-asserted, not credentials: they keep well-behaved clients apart (a bug in one cannot
end another's episodes, and another's episode ids are useless without its client id), but a
hostile token holder can claim any id it has seen, and can rotate ids to get around the
per-owner quota; then only ``max_concurrent_episodes`` and ``episode_timeout_s`` bound it
(an episode it keeps alive with calls is not reaped). Ids of episodes started without one
are made by the env (``uuid4``, from ``os.urandom``). An authenticated but hostile client can
still use its share of the server: it is bounded by the limits above (memory and time per
request and per connection, connection count), the env's quotas and timeouts
(``max_concurrent_episodes``, ``max_episodes_per_owner``, ``episode_timeout_s``,
``max_queued_steps``), and what its data does to training (it can send any in-space
observations, rewards and actions). Bodies over 64 KiB are decoded on a worker thread, so
one big request slows, but does not stop, the others; a body of plain msgpack numbers
decodes to about 8x its size in Python objects (``max_body_bytes`` bounds it).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import heapq
import hmac
import inspect
import json
import logging
import re
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

import httptools
import numpy as np

from jaxsampler import spaces as sp
from jaxsampler.constants import DEFAULT_AGENT_ID
from jaxsampler.episodes.codec import packb, unpackb
from jaxsampler.host_envs import external as ext
from jaxsampler.host_envs.base import HostEnv, MultiEnvDict, PollResult
from jaxsampler.serving.protocol import (
    AUTH_SCHEME,
    BATCHABLE_COMMANDS,
    CLIENT_ID_HEADER,
    CLIENT_ID_PATTERN,
    COMMANDS,
    CONTENT_TYPE,
    ERRORS_BY_NAME,
    PROTOCOL_VERSION,
    STATUS_OF_ERROR,
    PolicyServerError,
)

__all__ = ["PolicyServer", "PolicyServerError", "PROTOCOL_VERSION"]

_log = logging.getLogger(__name__)

#: Requests without an ``X-Client-Id`` run as this owner (never as ``None``, which the env
#: lets touch every episode: that is for in-process callers only).
ANONYMOUS_OWNER = "anonymous"
_CLIENT_ID = re.compile(CLIENT_ID_PATTERN.encode())
_CLIENT_ID_NAME = CLIENT_ID_HEADER.lower().encode()
_FEED_SLICE = 16 << 10  # bytes fed to the parser at a time (bounds what one feed can queue)
_LINGER_S = 2.0  # after an answer that closes: how long the peer may still send (see respond)
_ACCEPT_BATCH = 64  # connections accepted per readiness event of the listening socket
_ACCEPT_LOG_INTERVAL_S = 10.0  # at most one log line per this long about failing accepts
_ACCEPT_RETRY_S = (0.05, 0.5)  # retry delay after a failed accept: freed something / not
_EVICT_ON_EMFILE = 4  # idle connections closed per failed accept
_BATCH_WORKERS = 2  # threads running /batch slices (pure Python under the GIL: few suffice)
_BATCH_SLICE = 32  # commands run per slice before other connections' batches get a turn
#: request bodies larger than this are decoded on a worker thread, not on the event loop
_INLINE_DECODE_BYTES = 64 << 10
_INLINE_BATCH_BYTES = 8 << 10  # /batch bodies up to this size start on the event loop
_DESCRIPTOR_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class _BadRequest(ValueError):
    pass


class _HTTPError(Exception):
    """A request refused with a specific HTTP status and error name."""

    def __init__(self, status: int, name: str, message: str):
        super().__init__(message)
        self.status, self.name = status, name


def _status_of(e: BaseException) -> tuple[int, str]:
    """HTTP status and error name of an exception raised while serving a command."""
    if isinstance(e, _HTTPError):
        return e.status, e.name
    for cls, status in STATUS_OF_ERROR:
        if isinstance(e, cls):
            name = type(e).__name__
            return status, name if name in ERRORS_BY_NAME or status != 400 else "InvalidDataError"
    _log.error("policy server: unexpected error", exc_info=e)
    return 500, type(e).__name__


def _field(msg: Mapping, name: str, kind: Any = None, optional: bool = False) -> Any:
    if name not in msg:
        if optional:
            return None
        raise _BadRequest(f"missing field {name!r}")
    v = msg[name]
    if kind is not None and not isinstance(v, kind) and not (optional and v is None):
        raise _BadRequest(
            f"field {name!r} must be {getattr(kind, '__name__', kind)}, got {type(v).__name__}"
        )
    return v


def _space_nbytes(space: Any) -> int:
    """Bytes of the largest single array a value of ``space`` holds (its biggest leaf)."""
    if isinstance(space, sp.Dict):
        return max((_space_nbytes(s) for s in space.spaces.values()), default=0)
    if isinstance(space, sp.Tuple):
        return max((_space_nbytes(s) for s in space.spaces), default=0)
    shape = getattr(space, "shape", None) or ()
    dtype = np.dtype(getattr(space, "dtype", None) or np.float64)
    # Clients may send any numeric dtype (the server casts): allow 8-byte items.
    return int(np.prod(shape, dtype=np.int64)) * max(8, dtype.itemsize)


@dataclass(frozen=True)
class _Limits:
    """What one request and one connection may cost (see :class:`PolicyServer`)."""

    max_body_bytes: int
    max_url_bytes: int
    max_header_bytes: int
    max_headers: int
    max_episode_id_len: int
    max_batch_commands: int
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


class _Request:
    """One parsed HTTP request (httptools callbacks fill it)."""

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
        self.error: tuple[int, str, str] | None = (
            None  # found while parsing: answered, then the connection closes
        )
        self.keep_alive = True
        self.method = b""

    def refuse(self, status: int, name: str, message: str) -> None:
        """Records the first problem found; the request is answered with it."""
        if self.error is None:
            self.error = (status, name, message)


class _Connection(asyncio.Protocol):
    """One client connection, served in the event-loop thread. Requests on it are answered
    in order, one at a time (a ``get_action`` holds the connection until its answer).

    Flow control: reading pauses while too much waits unanswered (:meth:`_congested`) or
    while the peer does not read its answers (``pause_writing``), and resumes when both
    drained; bytes read past the point where it paused wait in ``stash``."""

    def __init__(self, ps: PolicyServer, refuse: bool = False):
        self.ps = ps
        self.limits = ps.limits
        self.refuse = refuse  # over max_connections: answered with 503, then closed
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.req: _Request | None = None  # the request being parsed
        self.queue: deque[_Request] = deque()
        self.busy = False  # a request is being answered
        self.waiting: tuple[str, ext.Waiter] | None = (
            None  # (episode id, waiter) of a pending get_action
        )
        self.closing = False
        self.broken = False  # the request stream could not be parsed further: the rest is dropped
        self.timed_out = False  # the pending get_action ran out of time
        self.deadline = 0.0  # when the pending get_action times out
        self.current: _Request | None = None  # the request being answered
        self.last_activity = time.monotonic()
        self.read_paused = False  # by flow control (not by the peer)
        self.write_paused_since: float | None = None  # the peer does not read its answers
        self.stash = b""  # read while pausing: parsed when reading resumes

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.ps._conns.add(self)
        self.ps._live.add(self)
        if self.refuse:
            n = self.limits.max_connections
            self.error(503, "CapacityError", f"{n} connections are open (max_connections)", True)

    def connection_lost(self, exc: Exception | None) -> None:
        self.close_soon()
        self.stash = b""
        self.ps._conns.discard(self)
        if self.waiting is not None:  # the client went away while its get_action waited
            eid, waiter = self.waiting
            self.ps.env.expire_waiter(eid, waiter, "client disconnected")

    def data_received(self, data: bytes) -> None:
        if self.closing or self.broken:
            return  # after an error answer: the rest is dropped until the peer closes
        # last_activity moves with whole requests and answers only: bytes that start no
        # request (blank lines, say) do not keep an idle connection open.
        if self.read_paused or self.stash:  # arrived while pausing (TLS buffers): keep order
            self.stash += data
            return
        self._feed(data)

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def pause_writing(self) -> None:
        self.write_paused_since = time.monotonic()

    def resume_writing(self) -> None:
        self.write_paused_since = None
        self.ps._loop.call_soon(self._next)

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
            self.ps._loop.call_soon(self._resume_reading)  # not from inside _next

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
            req = _Request()
            req.error = error
            self.queue.append(req)

    def check_timeouts(self, now: float) -> None:
        """Called by the server's periodic tick: a request that takes longer than
        ``request_timeout_s`` to arrive gets 408; idle or stalled connections close."""
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
        self.ps._live.discard(self)

    @property
    def idle(self) -> bool:
        """Between requests: nothing queued, parsed in part or being answered."""
        return not (self.busy or self.queue or self.req is not None or self.stash)

    # -- httptools callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.req = _Request()

    def _req(self) -> _Request:
        """The request being parsed (httptools calls back only inside a message)."""
        req = self.req
        assert req is not None
        return req

    def on_url(self, url: bytes) -> None:
        req = self._req()
        req.url_size += len(url)
        if req.url_size > self.limits.max_url_bytes:
            req.refuse(414, "URITooLong", f"URL over max_url_bytes={self.limits.max_url_bytes}")
            raise _BadRequest("URL too long")  # stops the parser: see _parse
        req.url.append(url)

    def on_header(self, name: bytes, value: bytes) -> None:
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
            raise _BadRequest("headers too large")  # stops the parser: see _parse
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

    def on_headers_complete(self) -> None:
        req, ps = self._req(), self.ps
        req.headers_done = True
        req.method = self.parser.get_method()
        req.keep_alive = self.parser.should_keep_alive()
        if req.error is None and not ps._authorized(req.auth):
            req.refuse(401, "Unauthorized", f"{AUTH_SCHEME} token required")
        if req.error is None:
            req.error = self._body_error(req)
        if req.error:  # answer now, without waiting for (or reading) the body
            self.queue.append(req)
            self.req = None
            self.broken = True  # nothing after it is parsed: the answer closes the connection

    def _body_error(self, req: _Request) -> tuple[int, str, str] | None:
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
        req = self.req
        if req is not None and req.method == b"POST":  # other methods take no body: not kept
            req.body.append(body)
            req.size += len(body)

    def on_message_complete(self) -> None:
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
                self.ps._dispatch(self, req)
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
        if self.closing or self.transport is None:
            return
        close = close or (self.current is not None and not self.current.keep_alive)
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\nServer: {_SERVER}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n{extra}"
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
                self.ps._loop.call_later(_LINGER_S, self.transport.close)
            else:
                self.transport.close()

    def error(
        self, status: int, name: str, message: str, close: bool = False, extra: str = ""
    ) -> None:
        self.respond(
            status,
            json.dumps({"error": name, "message": message}).encode(),
            "application/json",
            extra=extra,
            close=close,
        )

    def exception(self, e: BaseException) -> None:
        status, name = _status_of(e)
        self.error(status, name, str(e) if status != 500 else f"internal error: {e}")

    def done(self) -> None:
        """The current request is answered: serve the next one queued on this connection."""
        self.busy = False
        self._next()


class _BatchJob:
    """One ``/batch`` request: decoded, then run :data:`_BATCH_SLICE` commands at a time by
    :class:`_FairBatches`, so big batches of one connection interleave with everybody else's."""

    __slots__ = ("ps", "conn", "body", "owner", "commands", "next", "errors", "result")

    def __init__(self, ps: PolicyServer, conn: _Connection, body: bytes, owner: str | None):
        self.ps, self.conn, self.body, self.owner = ps, conn, body, owner
        self.commands: list | None = None
        self.next = 0
        self.errors: list[dict] = []
        self.result: Any = None  # the answer: a dict, or the exception that fails the request

    def step(self) -> bool:
        """Runs the next slice (the first one decodes first); returns whether the job is
        finished.
        Raises :class:`~jaxsampler.host_envs.external.WouldBlockError` when a command must
        wait for room (back pressure): the rest then runs with :meth:`run_blocking`."""
        if self.commands is None:
            try:
                msg = self.ps._decode(self.body)
                self.body = b""
                if "returns" in msg:
                    self.ps._returns(_field(msg, "returns", list), self.owner)
                commands = _field(msg, "commands", list)
                self.ps._check_count("commands", commands)
            except Exception as e:
                self.result = e
                return True
            self.commands = commands
        end = min(len(self.commands), self.next + _BATCH_SLICE)
        while self.next < end:
            self._run_one(block=False)
        return self.next >= len(self.commands) and self._finish()

    def run_blocking(self) -> None:
        """The rest of the batch, waiting for room where needed (a worker of the blocking pool)."""
        assert self.commands is not None
        try:
            while self.next < len(self.commands):
                self._run_one(block=True)
            self._finish()
        except Exception as e:  # pragma: no cover - _run_one records command errors itself
            self.result = e
        self.answer()

    def _run_one(self, block: bool) -> None:
        assert self.commands is not None
        i, c = self.next, self.commands[self.next]
        try:
            if not isinstance(c, dict):
                raise _BadRequest(f"command {i} must be a map")
            name = _field(c, "command", str)
            if name not in BATCHABLE_COMMANDS:
                raise _BadRequest(
                    f"command {name!r} cannot be batched (allowed: {list(BATCHABLE_COMMANDS)})"
                )
            self.ps._run(name, c, self.owner, block=block)
        except ext.WouldBlockError:
            raise  # not this command's error: it runs again, blocking
        except Exception as e:  # a refused command does not stop the others
            status, name = _status_of(e)
            self.errors.append({"index": i, "status": status, "error": name, "message": str(e)})
        self.next += 1

    def _finish(self) -> bool:
        assert self.commands is not None
        self.result = {"done": len(self.commands) - len(self.errors), "errors": self.errors}
        return True

    def answer(self) -> None:
        """Sends the result from the event-loop thread (callable from any thread)."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to answer
            self.ps._loop.call_soon_threadsafe(self._answer)

    def _answer(self) -> None:
        self.respond()
        self.conn.done()

    def respond(self) -> None:
        """Sends the result (event-loop thread)."""
        conn, result = self.conn, self.result
        if isinstance(result, BaseException):
            conn.exception(result)
        else:
            try:
                data = packb(result)
            except Exception as e:
                conn.exception(e)
            else:
                conn.respond(200, data)


class _FairBatches:
    """Runs :class:`_BatchJob` slices on a few threads, round-robin over the jobs (each
    connection has at most one), so a connection flooding big batches delays another one's
    small batch by about one slice per busy connection instead of whole batches."""

    def __init__(self, blocking: ThreadPoolExecutor):
        self._pool = ThreadPoolExecutor(_BATCH_WORKERS, thread_name_prefix="PolicyServer-batch")
        self._blocking = blocking
        self._ready: deque[_BatchJob] = deque()
        self._lock = threading.Lock()

    def submit(self, job: _BatchJob) -> None:
        with self._lock:
            self._ready.append(job)
        self._pool.submit(self._run_slice)  # one task per queued job: it runs whichever is first

    def _run_slice(self) -> None:
        with self._lock:
            job = self._ready.popleft()
        while True:
            try:
                finished = job.step()
            except ext.WouldBlockError:  # back pressure: wait for room off this pool
                self._blocking.submit(job.run_blocking)
                return
            except Exception as e:  # pragma: no cover - step() records command errors itself
                job.result, finished = e, True
            if finished:
                job.answer()
                return
            with self._lock:
                if not self._ready:
                    continue  # nobody else waits: no hand-over to another thread
            self.submit(job)  # to the back: the other connections' jobs go first
            return

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class PolicyServer(HostEnv):
    """Serves an external env over HTTP on ``host:port`` (see the module docstring).

    Args:
        env: the :class:`ExternalEnv` / :class:`ExternalMultiAgentEnv` requests go to; the
            server owns it (``close`` closes it). Its ``episode_timeout_s`` (600 s by
            default) ends the episodes of clients that vanished.
        host: interface to bind, loopback by default.
        port: TCP port; 0 picks a free one (see :attr:`address`).
        max_body_bytes: larger request bodies are refused with 413 (not read).
        keepalive_timeout_s: idle keep-alive connections are closed after this long; so is a
            connection whose peer reads none of its answers for this long.
        max_url_bytes: longer URLs get 414.
        max_header_bytes: request headers over this many bytes in all get 431.
        max_headers: more request headers than this get 431.
        max_episode_id_len: longer episode ids get 400.
        max_batch_commands: a body with more ``/batch`` commands or deferred ``returns``
            gets 413.
        max_array_bytes: the largest array a request body may hold, in bytes; default: the
            largest array of the env's observation / action spaces (8 bytes an item) or
            64 KiB, whichever is larger. The decoder refuses a larger array (400) before
            allocating it.
        max_pipelined: a connection is not read while this many requests wait on it.
        max_pipelined_bytes: ... or while this many body bytes wait on it.
        max_connections: connections served at once; a newcomer beyond it closes the
            oldest idle keep-alive connection, or with none idle gets 503.
        request_timeout_s: a request must arrive in full (first byte to last) within this
            long, else 408 and the connection closes (slow senders).
        token: when set, every request needs ``Authorization: Bearer <token>``, else 401.
        ssl_context: a server-side :class:`ssl.SSLContext` (with its certificate loaded):
            serve HTTPS (:attr:`address` is then ``https://...``).

    The server runs in a daemon thread (an asyncio event loop) from construction on. Use as
    a context manager or call :meth:`close`.

    Raises:
        OSError: the address cannot be bound (e.g. the port is in use).
        ValueError: a limit is not positive.
        TypeError: ``env`` is not an external env, or ``ssl_context`` / ``token`` have the
            wrong type.
    """

    def __init__(
        self,
        env: ext.ExternalEnvBase,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_body_bytes: int = 8 << 20,
        keepalive_timeout_s: float = 120.0,
        max_url_bytes: int = 2048,
        max_header_bytes: int = 16 << 10,
        max_headers: int = 64,
        max_episode_id_len: int = 128,
        max_batch_commands: int = 4096,
        max_array_bytes: int | None = None,
        max_pipelined: int = 16,
        max_pipelined_bytes: int = 1 << 20,
        max_connections: int = 1024,
        request_timeout_s: float = 10.0,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ):
        if not isinstance(env, ext.ExternalEnvBase):
            raise TypeError(
                "PolicyServer needs an ExternalEnv or ExternalMultiAgentEnv, got "
                f"{type(env).__name__}"
            )
        if token is not None and (not isinstance(token, str) or not token.isprintable()):
            raise TypeError("token must be a non-empty printable str or None")
        if token == "":
            raise ValueError("token must not be empty (None: no token)")
        if ssl_context is not None and not isinstance(ssl_context, ssl.SSLContext):
            raise TypeError(f"ssl_context must be an ssl.SSLContext, got {type(ssl_context)}")
        self.limits = _Limits(
            max_body_bytes=int(max_body_bytes),
            max_url_bytes=int(max_url_bytes),
            max_header_bytes=int(max_header_bytes),
            max_headers=int(max_headers),
            max_episode_id_len=int(max_episode_id_len),
            max_batch_commands=int(max_batch_commands),
            max_pipelined=int(max_pipelined),
            max_pipelined_bytes=int(max_pipelined_bytes),
            max_connections=int(max_connections),
            request_timeout_s=float(request_timeout_s),
            keepalive_timeout_s=float(keepalive_timeout_s),
        )
        self._lsock = _listen(host, port)  # first: nothing to clean up if it cannot bind
        self.env = env
        # The env's spaces, agents and capacity are fixed at its construction.
        self.observation_space, self.action_space = env.observation_space, env.action_space
        self.agent_ids, self.num_envs = env.agent_ids, env.num_envs
        self.abandons_episodes = env.abandons_episodes
        self.max_body_bytes, self.keepalive_timeout_s = (
            self.limits.max_body_bytes,
            self.limits.keepalive_timeout_s,
        )
        if max_array_bytes is None:
            spaces = (env.observation_space, env.action_space)
            max_array_bytes = max(64 << 10, *(_space_nbytes(s) for s in spaces))
        elif max_array_bytes <= 0:
            raise ValueError(f"max_array_bytes must be > 0, got {max_array_bytes}")
        self.max_array_bytes = int(max_array_bytes)
        # Owners need an env that knows them; None would let a call touch any episode.
        self._owned = "owner" in inspect.signature(env.start_episode).parameters
        self._token = None if token is None else f"{AUTH_SCHEME} {token}".encode()
        self._ssl = ssl_context
        self._weights: tuple[int, bytes | None] = (0, None)
        self._conns: set[_Connection] = set()  # open connections, closing ones included
        self._live: set[_Connection] = set()  # ... not closing: what max_connections counts
        self._handshaking = 0  # accepted sockets not yet connections (TLS handshakes)
        self._tasks: set[asyncio.Task] = set()
        self._accept_failures = 0  # since the last log line about them
        self._accept_log_at = 0.0  # when the next such line may be written
        self._closed = False
        self._answers: deque[list] = (
            deque()
        )  # [connection, episode id, waiter] of answered get_actions
        self._wake_pending = False
        self._tick_s = min(
            1.0, max(0.01, env.action_timeout_s / 10)
        )  # get_action timeouts: +10% at most
        self._executor = ThreadPoolExecutor(
            max_workers=4, thread_name_prefix="PolicyServer-blocking"
        )
        self._batches = _FairBatches(self._executor)
        self._sockname = self._lsock.getsockname()
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

        self._thread = threading.Thread(target=run, name="PolicyServer", daemon=True)
        self._thread.start()
        ready.wait()

    # -- HostEnv (delegated) -------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> PollResult:
        return self.env.poll(timeout)

    def send_actions(self, actions: MultiEnvDict) -> None:
        self.env.send_actions(actions)

    # -- server ----------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """``"http://host:port"`` (``https`` with an ``ssl_context``)."""
        host, port = self._sockname[:2]
        if ":" in host:
            host = f"[{host}]"
        return f"{'https' if self._ssl is not None else 'http'}://{host}:{port}"

    def set_weights(self, params: Any) -> int:
        """Publishes policy params (any pytree of arrays) for local-inference clients;
        returns the new weights version (1, 2, ...)."""
        import jax

        data_version = self._weights[0] + 1
        data = packb({"version": data_version, "params": jax.device_get(params)})
        self._weights = (data_version, data)
        return data_version

    @property
    def weights_version(self) -> int:
        return self._weights[0]

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stops serving, drops open connections and closes the env. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.env.close()  # fails every waiting get_action: their answers are sent first
        # Also when the loop thread has not reached run_forever yet: it stops on its first
        # turn. A RuntimeError means the loop is closed already.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._batches.shutdown()
        self._executor.shutdown(wait=False)

    def __enter__(self) -> PolicyServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

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
        """Wraps an accepted socket into a :class:`_Connection` (TLS handshake first)."""
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
                "ssl_shutdown_timeout": _LINGER_S,  # not 30 s: a closed connection's descriptor
            }
        try:
            await self._loop.connect_accepted_socket(lambda: _Connection(self, refuse), sock, **kw)
        except (OSError, asyncio.TimeoutError, ssl.SSLError) as e:  # a failed TLS handshake
            _log.debug("policy server: connection setup failed: %s", e)
            sock.close()
        finally:
            self._handshaking -= 1

    def _authorized(self, auth: list[bytes]) -> bool:
        """Whether a request with these ``Authorization`` values may be served."""
        if self._token is None:
            return True
        return len(auth) == 1 and hmac.compare_digest(auth[0], self._token)

    # -- requests (event-loop thread) --------------------------------------------------------

    def _tick(self) -> None:
        """Periodic: times out waiting ``get_action`` calls (one sweep instead of a timer per
        call), slow requests, idle keep-alive and stalled connections."""
        now = time.monotonic()
        timeout = self.env.action_timeout_s
        for c in list(self._conns):
            if c.waiting is not None and now >= c.deadline:
                self._expire(c, c.waiting[0], timeout)
            else:
                c.check_timeouts(now)
        if not self._closed:
            self._loop.call_later(self._tick_s, self._tick)

    def _owner(self, req: _Request) -> str:
        return ANONYMOUS_OWNER if req.client_id is None else req.client_id

    def _dispatch(self, conn: _Connection, req: _Request) -> None:
        url = b"".join(req.url)
        try:
            path = urlsplit(url.decode("latin-1")).path
        except ValueError as e:  # e.g. "http://[": llhttp lets it through
            conn.error(
                400, "InvalidDataError", f"malformed URL {url[:100].decode('latin-1')!r}: {e}"
            )
            return
        command = path.lstrip("/")
        if req.method == b"GET":
            self._get(conn, req, path)
            return
        if req.method != b"POST":
            conn.error(
                405, "MethodNotAllowed", f"{req.method.decode(errors='replace')} is not supported"
            )
            return
        if command not in COMMANDS and command != "batch":
            conn.error(404, "NotFound", f"unknown path {path}")
            return
        owner = self._owner(req)
        body = b"".join(req.body)
        if command == "batch":
            self._batch(conn, _BatchJob(self, conn, body, owner))
            return
        if len(body) > _INLINE_DECODE_BYTES:
            # Decoding a big body (plain lists: a Python walk over every item) would stall
            # every connection: decode it on a worker, then carry on here.
            conn.busy = True

            def decoded(fut: Any) -> None:
                conn.busy = False
                e = fut.exception()
                if e is not None:
                    conn.exception(e)
                else:
                    self._command(conn, command, fut.result(), owner)
                if not conn.busy:
                    conn.done()

            self._loop.run_in_executor(self._executor, self._decode, body).add_done_callback(
                decoded
            )
            return
        try:
            msg = self._decode(body)
        except Exception as e:
            conn.exception(e)
            return
        self._command(conn, command, msg, owner)

    def _command(self, conn: _Connection, command: str, msg: dict, owner: Any) -> None:
        """Runs one decoded command (not ``/batch``) and answers it, or leaves it waiting
        (``get_action``, back pressure) with the connection marked busy."""
        try:
            if "returns" in msg:  # log_returns calls deferred by the client: first, in order
                self._returns(_field(msg, "returns", list), owner)
            if command == "get_action":
                self._start_get_action(
                    conn, self._episode_id(msg), _field(msg, "observation"), owner
                )
                return
            try:
                result = self._run(command, msg, owner, block=False)
            except ext.WouldBlockError:  # back pressure: wait for room off the event loop
                self._in_executor(conn, self._run, command, msg, owner)
                return
        except Exception as e:
            conn.exception(e)
            return
        conn.respond(200, packb(result))

    def _batch(self, conn: _Connection, job: _BatchJob) -> None:
        """A small ``/batch`` (one slice) runs here at once, like a single command: no thread
        hand-over, which costs GIL switches when the process is busy. Bigger ones go to the
        batch pool, a slice at a time; one that must wait for room to the blocking pool."""
        if len(job.body) <= _INLINE_BATCH_BYTES:
            try:
                finished = job.step()
            except ext.WouldBlockError:
                conn.busy = True
                self._executor.submit(job.run_blocking)
                return
            if finished:
                job.respond()
                return
        conn.busy = True
        self._batches.submit(job)

    def _decode(self, body: bytes) -> dict:
        msg = unpackb(body, objects=False, max_bytes_per_array=self.max_array_bytes)
        if not isinstance(msg, dict):
            raise _BadRequest(f"body must be a msgpack map, got {type(msg).__name__}")
        return msg

    def _check_count(self, name: str, items: list) -> None:
        limit = self.limits.max_batch_commands
        if len(items) > limit:
            raise _HTTPError(
                413,
                "PayloadTooLarge",
                f"{len(items)} {name} in one request exceed max_batch_commands={limit}",
            )

    def _get(self, conn: _Connection, req: _Request, path: str) -> None:
        if path == "/weights":
            version, data = self._weights
            etag = f'ETag: "{version}"\r\n'
            if data is None:
                conn.error(404, "NoWeights", "no policy weights yet (PolicyServer.set_weights)")
            elif req.if_none_match.decode("latin-1").strip('"') == str(version):
                conn.respond(304, b"", extra=etag)
            else:
                conn.respond(200, data, extra=etag)
        elif path == "/info":
            env = self.env
            info = {
                "protocol": PROTOCOL_VERSION,
                "multi_agent": env.multi_agent,
                "agent_ids": list(env.agent_ids),
                "weights_version": self._weights[0],
                "observation_space": env.observation_space,
                "action_space": env.action_space,
            }
            conn.respond(200, packb(info))
        elif path.lstrip("/") in COMMANDS or path == "/batch":
            conn.error(405, "MethodNotAllowed", f"{path} needs POST")
        else:
            conn.error(404, "NotFound", f"unknown path {path}")

    def _in_executor(self, conn: _Connection, fn: Callable, *args: Any) -> None:
        """Runs a call that may block (back pressure) on a worker thread; answers when done."""
        conn.busy = True

        def finished(fut: Any) -> None:
            e = fut.exception()
            if e is not None:
                conn.exception(e)
            else:
                conn.respond(200, packb(fut.result()))
            conn.done()

        self._loop.run_in_executor(self._executor, fn, *args).add_done_callback(finished)

    def _start_get_action(self, conn: _Connection, eid: str, obs: Any, owner: str) -> None:
        entry: list = [conn, eid, None]  # the waiter is filled in below

        def answered() -> None:  # sampler thread (or whoever ends the wait), under the env lock
            self._answers.append(entry)
            if not self._wake_pending:
                self._wake_pending = True
                # A RuntimeError means the loop is closed: nobody to answer any more.
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self._deliver_answers)

        waiter = self.env.submit(
            eid, self._agents(obs), None, None, True, on_answer=answered, **self._as(owner)
        )
        assert waiter is not None  # a request that wants an action always has a waiter
        # Still in the loop thread: answered()'s delivery runs after this, with the entry complete.
        entry[2] = waiter
        conn.busy, conn.waiting = True, (eid, waiter)
        conn.deadline = time.monotonic() + self.env.action_timeout_s  # checked by _tick

    def _expire(self, conn: _Connection, eid: str, timeout: float) -> None:
        if conn.waiting is not None and conn.waiting[0] == eid:
            # False when the answer came first (its delivery is queued): then it is delivered
            conn.timed_out = self.env.expire_waiter(
                eid, conn.waiting[1], f"get_action timed out after {timeout} s"
            )

    def _deliver_answers(self) -> None:
        self._wake_pending = False
        answers = self._answers
        while answers:
            conn, eid, waiter = answers.popleft()
            if conn.waiting is None or conn.waiting[1] is not waiter:
                continue
            conn.waiting = None
            try:
                if conn.closing:  # the action never reaches the client
                    if waiter.error is None:
                        self.env.abandon_episode(
                            eid, "client disconnected before receiving its action"
                        )
                elif conn.timed_out:
                    conn.timed_out = False
                    conn.exception(
                        TimeoutError(
                            f"episode {eid}: no action within {self.env.action_timeout_s} s; "
                            "episode abandoned"
                        )
                    )
                elif waiter.error is not None:
                    conn.exception(waiter.error)
                else:
                    out = waiter.value
                    conn.respond(
                        200,
                        packb({"action": out if self.env.multi_agent else out[DEFAULT_AGENT_ID]}),
                    )
            except Exception as e:
                conn.exception(e)
            conn.done()

    def _returns(self, returns: list, owner: str | None) -> None:
        self._check_count("deferred returns", returns)
        for i, r in enumerate(returns):
            if not isinstance(r, dict):
                raise _BadRequest(f"returns[{i}] must be a map")
            try:
                self._run("log_returns", r, owner)
            except Exception as e:
                e.args = (f"deferred log_returns (returns[{i}]): {e}", *e.args[1:])
                raise

    # -- command execution ---------------------------------------------------------------------

    def _agents(self, x: Any) -> Any:
        return x if self.env.multi_agent else {DEFAULT_AGENT_ID: x}

    def _as(self, owner: str | None) -> dict[str, Any]:
        """The ``owner`` keyword for env calls (none with an env that has no owners)."""
        return {"owner": owner} if self._owned else {}

    def _episode_id(self, msg: Mapping, optional: bool = False) -> Any:
        eid = _field(msg, "episode_id", str, optional=optional)
        if eid is not None and len(eid) > self.limits.max_episode_id_len:
            raise _BadRequest(
                f"episode_id of {len(eid)} characters exceeds "
                f"max_episode_id_len={self.limits.max_episode_id_len}"
            )
        return eid

    def _run(self, command: str, msg: Mapping, owner: str | None, block: bool = True) -> dict:
        env, own = self.env, self._as(owner)
        if command == "start_episode":
            eid = env.start_episode(
                self._episode_id(msg, optional=True),
                bool(_field(msg, "training_enabled", bool, optional=True) is not False),
                **own,
            )
            return {"episode_id": eid}
        eid = self._episode_id(msg)
        if command == "log_action":
            info = _field(msg, "info", dict, optional=True)
            env.submit(
                eid,
                self._agents(_field(msg, "observation")),
                self._agents(_field(msg, "action")),
                None if info is None else self._agents(info),
                False,
                block=block,
                **own,
            )
        elif command == "log_returns":
            info = _field(msg, "info", dict, optional=True)
            reward = _field(msg, "reward")
            done = _field(msg, "done", dict, optional=True)
            if env.multi_agent:
                env.log_agent_returns(eid, reward, info, done, **own)
            else:
                env.log_agent_returns(
                    eid,
                    {DEFAULT_AGENT_ID: reward},
                    None if info is None else {DEFAULT_AGENT_ID: info},
                    None,
                    **own,
                )
        elif command == "end_episode":
            env.end_agent_episode(
                eid,
                self._agents(_field(msg, "observation")),
                bool(_field(msg, "truncated", bool, optional=True)),
                **own,
            )
        elif command == "get_action":
            raise _BadRequest("get_action is not allowed here")
        return {}


def _listen(host: str, port: int) -> socket.socket:
    """A non-blocking listening TCP socket on ``host:port`` (raises OSError if it cannot bind)."""
    family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.create_server((host, port), family=family, backlog=1024)
    sock.setblocking(False)
    return sock
