"""HTTP policy serving: :class:`PolicyServer` (the client is :mod:`jaxsampler.hostenv.client`).

The server owns an :class:`~jaxsampler.hostenv.external.ExternalEnv` (or the multi-agent
variant) and is itself a :class:`~jaxsampler.hostenv.base.HostEnv` (``poll`` /
``send_actions`` go to that env), so any host sampler can sample from it: experience of
remote clients ends up in the sampler's episodes and batches. The stack is the Python
standard library (``http.server.ThreadingHTTPServer``, ``http.client``): HTTP/1.1 with
keep-alive, one server thread per connection.

Protocol (version 1)
--------------------
Bodies are msgpack (``Content-Type: application/msgpack``) encoded with
:func:`jaxsampler.hostenv.offline.packb`: numpy arrays travel as raw bytes plus dtype and
shape (msgpack ext type 1), numpy scalars as type 2, tuples as type 3. Plain lists and
numbers work too; the server validates every observation / action against the env's
spaces and casts it to the space's dtype.

====================  ==========================================================  =====================
endpoint              request body                                                 200 response body
====================  ==========================================================  =====================
POST /start_episode   ``{episode_id: str|nil, training_enabled: bool}``              ``{episode_id}``
POST /get_action      ``{episode_id, observation}``                                  ``{action}``
POST /log_action      ``{episode_id, observation, action, info?}``                   ``{}``
POST /log_returns     ``{episode_id, reward, info?, done?}``                         ``{}``
POST /end_episode     ``{episode_id, observation, truncated?: bool}``                ``{}``
POST /batch           ``{commands: [{command: <name above>, ...fields}, ...]}``      ``{done: n, errors}``
GET  /weights         header ``If-None-Match: "<version>"`` optional                 ``{version, params}``
GET  /info            --                                                             ``{protocol, multi_agent,
                                                                                     agent_ids, weights_version,
                                                                                     observation_space,
                                                                                     action_space}``
====================  ==========================================================  =====================

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

A client that disconnects while its ``get_action`` waits is noticed (the handler peeks at
its socket while waiting): its episode is abandoned and ends as truncated (see
:mod:`~jaxsampler.hostenv.external`); other episodes are untouched. A client that
vanishes between calls is caught by the env's ``episode_timeout_s``.

Local inference: ``PolicyClient(inference_mode="local", policy=...)`` pulls the params
every ``update_interval`` seconds, computes actions with one jitted call per
``get_action`` and ships each step as ``log_action`` with ``info[CLIENT_POLICY_INFO] =
{"weights_version", "extra_model_outputs"}`` (batched in the background through
``/batch``): the server's sampler records the client's action (``off_policy_actions``)
with the behaviour policy's version and logp.
"""

from __future__ import annotations

import json
import logging
import select
import socket
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from jaxsampler.env import DEFAULT_AGENT_ID
from jaxsampler.hostenv import external as ext
from jaxsampler.hostenv.base import HostEnv, MultiEnvDict, PollResult
from jaxsampler.hostenv.offline import packb, unpackb

__all__ = ["PolicyServer", "PolicyServerError", "PROTOCOL_VERSION"]

PROTOCOL_VERSION = 1
_log = logging.getLogger(__name__)
_MSGPACK = "application/msgpack"
_COMMANDS = ("start_episode", "get_action", "log_action", "log_returns", "end_episode")
_BATCHABLE = ("start_episode", "log_action", "log_returns", "end_episode")


class PolicyServerError(RuntimeError):
    """An HTTP error from the server that maps to no env exception."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class _BadRequest(ValueError):
    pass


_STATUS: list[tuple[type, int]] = [
    (ext.UnknownEpisodeError, 404),
    (ext.EpisodeStateError, 409),
    (ext.CapacityError, 503),
    (ext.EnvClosedError, 503),
    (TimeoutError, 504),
    (ValueError, 400),  # InvalidDataError, _BadRequest, malformed msgpack
]
_ERRORS = {c.__name__: c for c in (ext.UnknownEpisodeError, ext.EpisodeStateError, ext.InvalidDataError,
                                   ext.CapacityError, ext.EnvClosedError, TimeoutError)}


def _status_of(e: BaseException) -> tuple[int, str]:
    """HTTP status and error name of an exception raised while serving a command."""
    for cls, status in _STATUS:
        if isinstance(e, cls):
            name = type(e).__name__
            return status, name if name in _ERRORS or status != 400 else "InvalidDataError"
    _log.error("policy server: unexpected error", exc_info=e)
    return 500, type(e).__name__


def _field(msg: Mapping, name: str, kind: Any = None, optional: bool = False) -> Any:
    if name not in msg:
        if optional:
            return None
        raise _BadRequest(f"missing field {name!r}")
    v = msg[name]
    if kind is not None and not isinstance(v, kind) and not (optional and v is None):
        raise _BadRequest(f"field {name!r} must be {getattr(kind, '__name__', kind)}, got {type(v).__name__}")
    return v


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024  # the default (5) drops SYNs of concurrent clients: 1 s retries
    policy_server: PolicyServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = f"jaxsampler-policy-server/{PROTOCOL_VERSION}"
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.timeout = self.server.policy_server.keepalive_timeout_s
        self.connection.settimeout(self.timeout)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.policy_server._track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.policy_server._track(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        _log.debug("%s " + format, self.address_string(), *args)

    # -- responses ---------------------------------------------------------------------

    def _send(self, status: int, body: bytes, content_type: str, extra: dict | None = None, close: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        # Headers and body in one send (what end_headers + write would split in two).
        self._headers_buffer.extend((b"\r\n", body))
        self.flush_headers()

    def _error(self, status: int, error: str, message: str, close: bool = False) -> None:
        payload = {"error": error, "message": message}
        self._send(status, json.dumps(payload).encode(), "application/json", close=close)

    def _exception(self, e: BaseException) -> None:
        status, name = _status_of(e)
        self._error(status, name, str(e) if status != 500 else f"internal error: {e}")

    def _linger(self, n: int) -> None:
        """Reads and drops (a bounded part of) an unread body after answering, so closing the
        socket does not reset the connection before the client read the answer."""
        try:
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(1.0)
            left, deadline = min(n, 64 << 20), time.monotonic() + 2.0
            while left > 0 and time.monotonic() < deadline:
                chunk = self.rfile.read1(min(left, 1 << 16))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:
            pass

    def _client_gone(self) -> bool:
        """Whether the peer closed the connection (an HTTP/1.1 client sends nothing else
        while it waits for the answer), without consuming anything."""
        try:
            if hasattr(select, "poll"):  # no FD_SETSIZE limit, unlike select()
                p = select.poll()
                p.register(self.connection, select.POLLIN | select.POLLHUP)
                ready = bool(p.poll(0))
            else:
                ready = bool(select.select([self.connection], [], [], 0)[0])
            # Ready: recv returns at once (b"" = closed by the peer).
            return ready and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    # -- GET ---------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802
        ps = self.server.policy_server
        path = urlsplit(self.path).path
        if path == "/weights":
            version, data = ps._weights
            if data is None:
                self._error(404, "NoWeights", "no policy weights yet (PolicyServer.set_weights)")
            elif self.headers.get("If-None-Match", "").strip('"') == str(version):
                self._send(304, b"", _MSGPACK, {"ETag": f'"{version}"'})
            else:
                self._send(200, data, _MSGPACK, {"ETag": f'"{version}"'})
        elif path == "/info":
            env = ps.env
            info = {"protocol": PROTOCOL_VERSION, "multi_agent": env._multi_agent, "agent_ids": list(env.agent_ids),
                    "weights_version": ps._weights[0], "observation_space": env.observation_space,
                    "action_space": env.action_space}
            self._send(200, packb(info), _MSGPACK)
        elif path.lstrip("/") in _COMMANDS or path == "/batch":
            self._error(405, "MethodNotAllowed", f"{path} needs POST", close=False)
        else:
            self._error(404, "NotFound", f"unknown path {path}")

    # -- POST --------------------------------------------------------------------------

    def do_POST(self) -> None:  # noqa: N802
        ps = self.server.policy_server
        path = urlsplit(self.path).path
        length = self.headers.get("Content-Length")
        if length is None:
            self._error(411, "LengthRequired", "Content-Length header required (no chunked bodies)", close=True)
            return
        try:
            n = int(length)
            if n < 0:
                raise ValueError
        except ValueError:
            self._error(400, "InvalidDataError", f"bad Content-Length {length!r}", close=True)
            return
        if n > ps.max_body_bytes:
            self._error(413, "PayloadTooLarge", f"body of {n} bytes exceeds max_body_bytes={ps.max_body_bytes}",
                        close=True)
            self._linger(n)
            return
        body = self.rfile.read(n)
        if len(body) < n:  # the client went away mid-body
            self.close_connection = True
            return
        command = path.lstrip("/")
        if command not in _COMMANDS and command != "batch":
            self._error(404, "NotFound", f"unknown path {path}")
            return
        eid = None
        try:
            msg = unpackb(body, objects=False)
            if not isinstance(msg, dict):
                raise _BadRequest(f"body must be a msgpack map, got {type(msg).__name__}")
            if command == "batch":
                self._batch(ps, msg)
                return
            if command == "get_action":
                eid = _field(msg, "episode_id", str)
                result = ps._get_action(eid, _field(msg, "observation"), self._client_gone)
            else:
                result = ps._run(command, msg)
        except ConnectionAbortedError:
            self.close_connection = True
            return
        except Exception as e:  # noqa: BLE001 -- every error becomes an HTTP answer
            self._exception(e)
            return
        try:
            self._send(200, packb(result), _MSGPACK)
        except OSError:
            self.close_connection = True
            if eid is not None:  # the action never reached the client
                ps.env.abandon_episode(eid, "client disconnected before receiving its action")

    def _batch(self, ps: PolicyServer, msg: dict) -> None:
        commands = _field(msg, "commands", list)
        errors = []
        for i, c in enumerate(commands):  # a refused command does not stop the others
            try:
                if not isinstance(c, dict):
                    raise _BadRequest(f"command {i} must be a map")
                name = _field(c, "command", str)
                if name not in _BATCHABLE:
                    raise _BadRequest(f"command {name!r} cannot be batched (allowed: {list(_BATCHABLE)})")
                ps._run(name, c)
            except Exception as e:  # noqa: BLE001
                status, name = _status_of(e)
                errors.append({"index": i, "status": status, "error": name, "message": str(e)})
        self._send(200, packb({"done": len(commands) - len(errors), "errors": errors}), _MSGPACK)


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

    The HTTP server runs in daemon threads from construction on. Use as a context
    manager or call :meth:`close`.
    """

    def __init__(self, env: ext._ExternalBase, host: str = "127.0.0.1", port: int = 0, *,
                 max_body_bytes: int = 8 << 20, keepalive_timeout_s: float = 120.0):
        if not isinstance(env, ext._ExternalBase):
            raise TypeError(f"PolicyServer needs an ExternalEnv or ExternalMultiAgentEnv, got {type(env).__name__}")
        self.env = env
        self.max_body_bytes, self.keepalive_timeout_s = int(max_body_bytes), float(keepalive_timeout_s)
        self._weights: tuple[int, bytes | None] = (0, None)
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self._httpd = _HTTPServer((host, port), _Handler)
        self._httpd.policy_server = self
        self._closed = False
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="PolicyServer", daemon=True)
        self._thread.start()

    # -- HostEnv (delegated) -------------------------------------------------------------

    @property
    def observation_space(self) -> Any:  # type: ignore[override]
        return self.env.observation_space

    @property
    def action_space(self) -> Any:  # type: ignore[override]
        return self.env.action_space

    @property
    def agent_ids(self) -> tuple:  # type: ignore[override]
        return self.env.agent_ids

    @property
    def num_envs(self) -> int:  # type: ignore[override]
        return self.env.num_envs

    def poll(self, timeout: float | None = None) -> PollResult:
        return self.env.poll(timeout)

    def send_actions(self, actions: MultiEnvDict) -> None:
        self.env.send_actions(actions)

    # -- server ----------------------------------------------------------------------------

    @property
    def address(self) -> str:
        host, port = self._httpd.server_address[:2]
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
        self.env.close()
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._conns_lock:
            for c in list(self._conns):
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def __enter__(self) -> PolicyServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._conns_lock:
            (self._conns.add if add else self._conns.discard)(conn)

    # -- command execution (handler threads) -----------------------------------------------

    def _agents(self, x: Any) -> Any:
        return x if self.env._multi_agent else {DEFAULT_AGENT_ID: x}

    def _get_action(self, eid: str, obs: Any, cancelled: Any) -> dict:
        out = self.env._get_action(eid, self._agents(obs), cancelled=cancelled)
        return {"action": out if self.env._multi_agent else out[DEFAULT_AGENT_ID]}

    def _run(self, command: str, msg: Mapping) -> dict:
        env = self.env
        if command == "start_episode":
            eid = env.start_episode(_field(msg, "episode_id", str, optional=True),
                                    bool(_field(msg, "training_enabled", bool, optional=True) is not False))
            return {"episode_id": eid}
        eid = _field(msg, "episode_id", str)
        if command == "log_action":
            info = _field(msg, "info", dict, optional=True)
            env._submit(eid, self._agents(_field(msg, "observation")), self._agents(_field(msg, "action")),
                        None if info is None else self._agents(info), False)
        elif command == "log_returns":
            info = _field(msg, "info", dict, optional=True)
            reward = _field(msg, "reward")
            done = _field(msg, "done", dict, optional=True)
            if env._multi_agent:
                env._log_returns(eid, reward, info, done)
            else:
                env._log_returns(eid, {DEFAULT_AGENT_ID: reward}, None if info is None else {DEFAULT_AGENT_ID: info},
                                 None)
        elif command == "end_episode":
            env._end_episode(eid, self._agents(_field(msg, "observation")),
                             bool(_field(msg, "truncated", bool, optional=True)))
        elif command == "get_action":
            raise _BadRequest("get_action is not allowed here")
        return {}
