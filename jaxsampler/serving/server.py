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
400 malformed body / bad data (wrong shape, unknown agent, missing field), 404 unknown
episode or path, 405 wrong method, 409 wrong episode state (already started, completed,
abandoned, a get_action still waiting), 411 no ``Content-Length``, 413 body over
``max_body_bytes`` (the connection is closed without reading it), 503 capacity or closed,
504 no action within the env's ``action_timeout_s``, 500 anything unexpected. The server
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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

import httptools

from jaxsampler.codec import packb, unpackb
from jaxsampler.constants import DEFAULT_AGENT_ID
from jaxsampler.host_envs import external as ext
from jaxsampler.host_envs.base import HostEnv, MultiEnvDict, PollResult
from jaxsampler.serving.protocol import (
    BATCHABLE_COMMANDS,
    COMMANDS,
    CONTENT_TYPE,
    ERRORS_BY_NAME,
    PROTOCOL_VERSION,
    STATUS_OF_ERROR,
    PolicyServerError,
)

__all__ = ["PolicyServer", "PolicyServerError", "PROTOCOL_VERSION"]

_log = logging.getLogger(__name__)


class _BadRequest(ValueError):
    pass


def _status_of(e: BaseException) -> tuple[int, str]:
    """HTTP status and error name of an exception raised while serving a command."""
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


_REASONS = {s.value: s.phrase for s in HTTPStatus}
_SERVER = f"jaxsampler-policy-server/{PROTOCOL_VERSION}"


class _Request:
    """One parsed HTTP request (httptools callbacks fill it)."""

    __slots__ = (
        "url",
        "body",
        "size",
        "content_length",
        "chunked",
        "if_none_match",
        "error",
        "keep_alive",
        "method",
    )

    def __init__(self) -> None:
        self.url = b""
        self.body: list[bytes] = []
        self.size = 0
        self.content_length: int | None = None
        self.chunked = False
        self.if_none_match = b""
        self.error: tuple[int, str, str] | None = (
            None  # found while parsing: answered, then the connection closes
        )
        self.keep_alive = True
        self.method = b""


class _Connection(asyncio.Protocol):
    """One client connection, served in the event-loop thread. Requests on it are answered
    in order, one at a time (a ``get_action`` holds the connection until its answer)."""

    def __init__(self, ps: PolicyServer):
        self.ps = ps
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.req: _Request | None = None
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

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.ps._conns.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.ps._conns.discard(self)
        if self.waiting is not None:  # the client went away while its get_action waited
            eid, waiter = self.waiting
            self.ps.env.expire_waiter(eid, waiter, "client disconnected")

    def data_received(self, data: bytes) -> None:
        if self.closing or self.broken:
            return  # after an error answer: the rest is dropped until the peer closes
        self.last_activity = time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._unparsable(
                (400, "InvalidDataError", "protocol upgrades are not supported"), upgrade=True
            )
        except httptools.HttpParserError as e:
            self._unparsable((400, "InvalidDataError", f"malformed HTTP request: {e}"))
        self._next()

    def _unparsable(self, error: tuple[int, str, str], upgrade: bool = False) -> None:
        """Parsing stopped: the requests parsed before are still answered, in order (they may
        sit in the same read), then ``error`` (unless one of them closes the connection),
        then the connection closes."""
        self.broken, self.req = True, None
        last = self.queue[-1] if upgrade and self.queue else None
        if last is not None and last.error is None:  # the request asking for the upgrade
            last.error = error
        else:
            req = _Request()
            req.error = error
            self.queue.append(req)

    def eof_received(self) -> bool | None:
        return None  # close our side too

    # -- httptools callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.req = _Request()

    def _req(self) -> _Request:
        """The request being parsed (httptools calls back only inside a message)."""
        req = self.req
        assert req is not None
        return req

    def on_url(self, url: bytes) -> None:
        self._req().url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        req = self._req()
        if name == b"content-length":
            try:
                req.content_length = int(value)
            except ValueError:
                req.error = req.error or (
                    400,
                    "InvalidDataError",
                    f"bad Content-Length {value.decode(errors='replace')!r}",
                )
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            req.chunked = True
        elif name == b"if-none-match":
            req.if_none_match = value

    def on_headers_complete(self) -> None:
        req, ps = self._req(), self.ps
        req.method = self.parser.get_method()
        req.keep_alive = self.parser.should_keep_alive()
        if req.error:
            return
        if req.content_length is not None and req.content_length > ps.max_body_bytes:  # any method
            req.error = (
                413,
                "PayloadTooLarge",
                f"body of {req.content_length} bytes exceeds max_body_bytes={ps.max_body_bytes}",
            )
        elif req.method == b"POST" and (req.content_length is None or req.chunked):
            req.error = (
                411,
                "LengthRequired",
                "Content-Length header required (no chunked bodies)",
            )
        if req.error:  # answer now, without waiting for (or reading) the body
            self.queue.append(req)
            self.req = None

    def on_body(self, body: bytes) -> None:
        req = self.req
        if req is not None and req.method == b"POST":  # other methods take no body: not kept
            req.body.append(body)
            req.size += len(body)

    def on_message_complete(self) -> None:
        if self.req is not None:
            self.queue.append(self.req)
            self.req = None

    # -- answering -------------------------------------------------------------------------

    def _next(self) -> None:
        while not self.busy and self.queue and not self.closing:
            req = self.queue.popleft()
            if req.error is not None:
                self._fail(*req.error)
                return
            self.current = req
            try:
                self.ps._dispatch(self, req)
            except Exception as e:
                self.busy = False
                self.exception(e)

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
            self.closing = True
            # Half-close and drop what the client still sends (an oversized body, say), so
            # it reads the answer before the connection goes (no reset); then close.
            if self.transport.can_write_eof():
                self.transport.write_eof()
                self.ps._loop.call_later(2.0, self.transport.close)
            else:
                self.transport.close()

    def error(self, status: int, name: str, message: str, close: bool = False) -> None:
        self.respond(
            status,
            json.dumps({"error": name, "message": message}).encode(),
            "application/json",
            close=close,
        )

    def _fail(self, status: int, name: str, message: str) -> None:
        self.error(status, name, message, close=True)

    def exception(self, e: BaseException) -> None:
        status, name = _status_of(e)
        self.error(status, name, str(e) if status != 500 else f"internal error: {e}")

    def done(self) -> None:
        """The current request is answered: serve the next one queued on this connection."""
        self.busy = False
        self._next()


class PolicyServer(HostEnv):
    """Serves an external env over HTTP on ``host:port`` (see the module docstring).

    Args:
        env: the :class:`ExternalEnv` / :class:`ExternalMultiAgentEnv` requests go to; the
            server owns it (``close`` closes it). Give it an ``episode_timeout_s`` so
            episodes of vanished clients end.
        host: interface to bind, loopback by default.
        port: TCP port; 0 picks a free one (see :attr:`address`).
        max_body_bytes: larger request bodies are refused with 413.
        keepalive_timeout_s: idle keep-alive connections are closed after this long.

    The server runs in a daemon thread (an asyncio event loop) from construction on. Use as
    a context manager or call :meth:`close`.

    Raises:
        OSError: the address cannot be bound (e.g. the port is in use).
    """

    def __init__(
        self,
        env: ext.ExternalEnvBase,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_body_bytes: int = 8 << 20,
        keepalive_timeout_s: float = 120.0,
    ):
        if not isinstance(env, ext.ExternalEnvBase):
            raise TypeError(
                "PolicyServer needs an ExternalEnv or ExternalMultiAgentEnv, got "
                f"{type(env).__name__}"
            )
        self.env = env
        # The env's spaces, agents and capacity are fixed at its construction.
        self.observation_space, self.action_space = env.observation_space, env.action_space
        self.agent_ids, self.num_envs = env.agent_ids, env.num_envs
        self.max_body_bytes, self.keepalive_timeout_s = (
            int(max_body_bytes),
            float(keepalive_timeout_s),
        )
        self._weights: tuple[int, bytes | None] = (0, None)
        self._conns: set[_Connection] = set()
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
        self._loop = asyncio.new_event_loop()
        started: dict[str, Any] = {}
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                server = self._loop.run_until_complete(
                    self._loop.create_server(
                        lambda: _Connection(self), host, port, backlog=1024, reuse_address=True
                    )
                )
            except BaseException as e:
                started["error"] = e
                self._loop.close()
                ready.set()
                return
            started["server"] = server
            ready.set()
            self._loop.call_later(self._tick_s, self._tick)
            self._loop.run_forever()
            server.close()
            for c in list(self._conns):
                if c.transport is not None:
                    c.transport.close()
            self._loop.run_until_complete(asyncio.sleep(0.05))  # flush the last answers
            self._loop.close()

        self._thread = threading.Thread(target=run, name="PolicyServer", daemon=True)
        self._thread.start()
        ready.wait()
        if "error" in started:
            self._executor.shutdown(wait=False)
            raise started["error"]
        self._server = started["server"]
        self._sockname = self._server.sockets[0].getsockname()

    # -- HostEnv (delegated) -------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> PollResult:
        return self.env.poll(timeout)

    def send_actions(self, actions: MultiEnvDict) -> None:
        self.env.send_actions(actions)

    # -- server ----------------------------------------------------------------------------

    @property
    def address(self) -> str:
        host, port = self._sockname[:2]
        return f"http://{host}:{port}"

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
        self._executor.shutdown(wait=False)

    def __enter__(self) -> PolicyServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- requests (event-loop thread) --------------------------------------------------------

    def _tick(self) -> None:
        """Periodic: times out waiting ``get_action`` calls (one sweep instead of a timer per
        call) and closes idle keep-alive connections."""
        now = time.monotonic()
        timeout = self.env.action_timeout_s
        for c in list(self._conns):
            if c.waiting is not None and now >= c.deadline:
                self._expire(c, c.waiting[0], timeout)
            elif (
                not c.busy
                and not c.queue
                and c.last_activity < now - self.keepalive_timeout_s
                and c.transport is not None
            ):
                c.transport.close()
        if not self._closed:
            self._loop.call_later(self._tick_s, self._tick)

    def _dispatch(self, conn: _Connection, req: _Request) -> None:
        try:
            path = urlsplit(req.url.decode("latin-1")).path
        except ValueError as e:  # e.g. "http://[": llhttp lets it through
            conn.error(
                400, "InvalidDataError", f"malformed URL {req.url[:100].decode('latin-1')!r}: {e}"
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
        try:
            msg = unpackb(b"".join(req.body), objects=False)
            if not isinstance(msg, dict):
                raise _BadRequest(f"body must be a msgpack map, got {type(msg).__name__}")
            if "returns" in msg:  # log_returns calls deferred by the client: first, in order
                self._returns(_field(msg, "returns", list))
            if command == "get_action":
                self._start_get_action(
                    conn, _field(msg, "episode_id", str), _field(msg, "observation")
                )
                return
            if command == "batch":
                self._in_executor(conn, self._batch, msg)
                return
            try:
                result = self._run(command, msg, block=False)
            except ext.WouldBlockError:  # back pressure: wait for room off the event loop
                self._in_executor(conn, self._run, command, msg)
                return
        except Exception as e:
            conn.exception(e)
            return
        conn.respond(200, packb(result))

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

    def _in_executor(self, conn: _Connection, fn: Any, *args: Any) -> None:
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

    def _start_get_action(self, conn: _Connection, eid: str, obs: Any) -> None:
        entry: list = [conn, eid, None]  # the waiter is filled in below

        def answered() -> None:  # sampler thread (or whoever ends the wait), under the env lock
            self._answers.append(entry)
            if not self._wake_pending:
                self._wake_pending = True
                # A RuntimeError means the loop is closed: nobody to answer any more.
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self._deliver_answers)

        waiter = self.env.submit(eid, self._agents(obs), None, None, True, on_answer=answered)
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

    def _returns(self, returns: list) -> None:
        for i, r in enumerate(returns):
            if not isinstance(r, dict):
                raise _BadRequest(f"returns[{i}] must be a map")
            try:
                self._run("log_returns", r)
            except Exception as e:
                e.args = (f"deferred log_returns (returns[{i}]): {e}", *e.args[1:])
                raise

    def _batch(self, msg: dict) -> dict:
        commands = _field(msg, "commands", list)
        errors = []
        for i, c in enumerate(commands):  # a refused command does not stop the others
            try:
                if not isinstance(c, dict):
                    raise _BadRequest(f"command {i} must be a map")
                name = _field(c, "command", str)
                if name not in BATCHABLE_COMMANDS:
                    raise _BadRequest(
                        f"command {name!r} cannot be batched (allowed: {list(BATCHABLE_COMMANDS)})"
                    )
                self._run(name, c)
            except Exception as e:
                status, name = _status_of(e)
                errors.append({"index": i, "status": status, "error": name, "message": str(e)})
        return {"done": len(commands) - len(errors), "errors": errors}

    # -- command execution ---------------------------------------------------------------------

    def _agents(self, x: Any) -> Any:
        return x if self.env.multi_agent else {DEFAULT_AGENT_ID: x}

    def _run(self, command: str, msg: Mapping, block: bool = True) -> dict:
        env = self.env
        if command == "start_episode":
            eid = env.start_episode(
                _field(msg, "episode_id", str, optional=True),
                bool(_field(msg, "training_enabled", bool, optional=True) is not False),
            )
            return {"episode_id": eid}
        eid = _field(msg, "episode_id", str)
        if command == "log_action":
            info = _field(msg, "info", dict, optional=True)
            env.submit(
                eid,
                self._agents(_field(msg, "observation")),
                self._agents(_field(msg, "action")),
                None if info is None else self._agents(info),
                False,
                block=block,
            )
        elif command == "log_returns":
            info = _field(msg, "info", dict, optional=True)
            reward = _field(msg, "reward")
            done = _field(msg, "done", dict, optional=True)
            if env.multi_agent:
                env.log_agent_returns(eid, reward, info, done)
            else:
                env.log_agent_returns(
                    eid,
                    {DEFAULT_AGENT_ID: reward},
                    None if info is None else {DEFAULT_AGENT_ID: info},
                    None,
                )
        elif command == "end_episode":
            env.end_agent_episode(
                eid,
                self._agents(_field(msg, "observation")),
                bool(_field(msg, "truncated", bool, optional=True)),
            )
        elif command == "get_action":
            raise _BadRequest("get_action is not allowed here")
        return {}
