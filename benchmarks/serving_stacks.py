"""Serving stacks: the policy server's hand-written HTTP layer vs well-kept server libraries.

The question (an issue): should :class:`~jaxsampler.serving.server.PolicyServer` move from
its hand-written HTTP/1.1 layer (asyncio protocol + httptools) to a maintained server that
ships header/body limits, read timeouts and flow control, unless the measured cost is large?

Stacks, all on the standard asyncio event loop in a daemon thread of the server process:

* ``current``: :class:`~jaxsampler.serving.server.PolicyServer` as it is;
* ``aiohttp``: an ``aiohttp.web.Application`` (one catch-all route) run with
  ``AppRunner`` / ``TCPSite`` on its own loop: ``client_max_size`` = the current
  ``max_body_bytes`` (413 past it), ``keepalive_timeout`` = the current 120 s,
  ``handler_cancellation=True`` (a client that disconnects while its ``get_action`` waits
  cancels the handler, which abandons the episode, as the current layer does);
* ``uvicorn``: a bare ASGI app under ``uvicorn.Server`` (``http="httptools"``, the same
  llhttp parser as the current layer, ``loop="asyncio"``, no lifespan, no access log),
  the 413 check done by the app (uvicorn has no body limit).

The candidates implement the hot endpoints with the same URLs, msgpack bodies
(:func:`jaxsampler.episodes.codec.packb` / ``unpackb(objects=False)``), deferred ``returns``
field and error mapping (:data:`jaxsampler.serving.protocol.STATUS_OF_ERROR`, JSON error
bodies), so the unchanged :class:`~jaxsampler.serving.client.PolicyClient` talks to all
three: ``POST /get_action`` queues the observation into the ExternalEnv with
``env.submit(..., on_answer=...)`` and awaits an asyncio Future; the sampler's answers of a
whole batch wake the loop once (``call_soon_threadsafe``, the current layer's scheme), and
the loop resolves the futures. ``/start_episode``, ``/log_returns`` and ``/end_episode``
call the env directly. A per-request ``call_later`` times out a ``get_action`` after the
env's ``action_timeout_s`` (504). Not ported (not on the hot path): ``/log_action`` under
back pressure, ``/batch``, ``GET /weights`` and ``/info``.

All stacks serve the same :class:`~jaxsampler.host_envs.external.ExternalEnv`, sampled by
one :class:`~jaxsampler.sampling.host.HostSampler` thread (``sample_batch`` in a loop, the
jitted policy compiled for every padded batch size before timing): only the HTTP layer
differs. The harness is ``benchmarks/serving.py``'s (imported, not copied: its sampler side,
:mod:`benchmarks.serving_client`'s clients): client threads
in ``--client-procs`` other processes, each with its own ``PolicyClient``, running
CartPole-shaped episodes (one ``get_action`` + a deferred ``log_returns`` per step).
Every round runs every client count (rotating order) and, per client count, one phase on
each stack back to back (rotating stack order), so the candidate / current ratios are
taken within a round, seconds apart. Reported per (stack, clients): total actions/s
(median over rounds, min-max), p50 / p99 ``get_action`` latency in the client (all rounds
pooled), CPU µs per action of the stack's event-loop thread (the HTTP layer's own work:
parsing, dispatch, env calls, answers; the sampler thread is the same for all), of the
server process and of the client processes; per candidate: median [min-max] over rounds of
the within-round ratios candidate / current of each. The verdict applies a threshold fixed
in advance (:data:`THRESHOLD_ACTIONS`, :data:`THRESHOLD_P50`) to those ratios.

Usage::

    python -m benchmarks.serving_stacks          # full run (~7 min), results/serving_stacks.*
    python -m benchmarks.serving_stacks --quick  # smoke run (~30 s), prints only
    python -m benchmarks.serving_stacks --stacks current aiohttp --rounds 7
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness, serving, serving_client
from benchmarks.harness import fmt, log, thousands
from benchmarks.serving_client import Phases, keep_round, percentiles_ms
from jaxsampler.cli.bench import environment_info

STACKS = ("current", "aiohttp", "aiohttp-lowlevel", "uvicorn")
LABELS = {
    "current": "current (PolicyServer: asyncio protocol + httptools)",
    "aiohttp": "aiohttp (web.Application, AppRunner + TCPSite)",
    "aiohttp-lowlevel": "aiohttp low-level (web.Server, ServerRunner + TCPSite)",
    "uvicorn": "uvicorn (ASGI app, httptools, asyncio loop)",
}
#: "the cost is large": fewer actions/s or a higher p50 than this, at any client count
#: (median of the within-round ratios candidate / current).
THRESHOLD_ACTIONS = 0.85
THRESHOLD_P50 = 1.25
SIZES = serving_client.sizes(
    full={"rounds": 10, "duration": 1.0, "stacks": list(STACKS)},
    quick={"duration": 0.4, "stacks": list(STACKS)},
)
MAX_BODY_BYTES = 8 << 20  # PolicyServer's default max_body_bytes
KEEPALIVE_S = 120.0  # PolicyServer's default keepalive_timeout_s
JSON_TYPE = "application/json"
#: What each stack ships against hostile or broken clients, read from the installed sources
#: (aiohttp 3.14, uvicorn 0.54) and from jaxsampler/serving/server.py at the measured commit.
FEATURES_MD = """\
| | current (PolicyServer) | aiohttp | uvicorn |
|---|---|---|---|
| body limit | `max_body_bytes`: 413 from `Content-Length`, body not read | `client_max_size`: 413 \
once the read passes it | none: the app must check (this benchmark's app does) |
| header limits | none of its own | `max_line_size` / `max_field_size` 8190 B, `max_headers` \
128 | h11 only: `h11_max_incomplete_event_size` 16 KiB; none with httptools |
| slow headers (slow-loris) | idle sweep after `keepalive_timeout_s`, reset by every byte \
received | `keepalive_timeout` runs from connect / last answer and is not reset by bytes of an \
incomplete request: a deadline for the headers (not for a slow body) | `timeout_keep_alive` \
starts only after an answer and any byte cancels it: none |
| read flow control | none: bodies under the limit are buffered, pipelined requests \
queue unbounded | `read_bufsize` 64 KiB: \
`pause_reading` | 64 KiB high-water mark: `pause_reading` |
| write flow control | none | `drain` on `pause_writing` | waits on `pause_writing` |
| fd exhaustion / too many connections | asyncio accept: EMFILE logged, accepting paused \
1 s | the same (asyncio) | the same, plus `limit_concurrency`: 503 past N connections |
| TLS | no | `ssl_context` on `TCPSite` | `ssl_certfile` / `ssl_keyfile` |
| client gone during `get_action` | seen at once, episode abandoned | \
`handler_cancellation=True`: the handler is cancelled (abandons the episode here) | the app \
must watch `receive()` for `http.disconnect` (not done here) |
"""


# --------------------------------------------------------------------------- the endpoints


class _BadRequest(ValueError):
    """A malformed body (400, like any ValueError)."""


def _field(msg: dict, name: str, kind: type | None = None, optional: bool = False) -> Any:
    if name not in msg:
        if optional:
            return None
        raise _BadRequest(f"missing field {name!r}")
    v = msg[name]
    if kind is not None and not isinstance(v, kind) and not (optional and v is None):
        raise _BadRequest(f"field {name!r} must be {kind.__name__}, got {type(v).__name__}")
    return v


class Endpoints:
    """The policy server's hot endpoints over an ExternalEnv, for any asyncio server.

    ``await handle(method, path, body)`` -> ``(status, body, content type)``; runs in the
    server's event-loop thread (``loop``, bound on the first request).
    """

    def __init__(self, env: Any):
        from jaxsampler.constants import DEFAULT_AGENT_ID
        from jaxsampler.episodes.codec import packb, unpackb
        from jaxsampler.serving.protocol import CONTENT_TYPE, ERRORS_BY_NAME, STATUS_OF_ERROR

        self.env, self.agent = env, DEFAULT_AGENT_ID
        self.packb, self.unpackb = packb, unpackb
        self.content_type, self.status_of, self.known = (
            CONTENT_TYPE,
            STATUS_OF_ERROR,
            ERRORS_BY_NAME,
        )
        self.loop: asyncio.AbstractEventLoop | None = None
        self._answered: deque[asyncio.Future] = deque()  # futures of answered get_actions
        self._wake_pending = False

    def error(self, e: BaseException) -> tuple[int, bytes, str]:
        for cls, status in self.status_of:
            if isinstance(e, cls):
                name = type(e).__name__
                if status == 400 and name not in self.known:
                    name = "InvalidDataError"
                break
        else:
            status, name = 500, type(e).__name__
        body = json.dumps({"error": name, "message": str(e)}).encode()
        return status, body, JSON_TYPE

    @staticmethod
    def refuse(status: int, name: str, message: str) -> tuple[int, bytes, str]:
        return status, json.dumps({"error": name, "message": message}).encode(), JSON_TYPE

    async def handle(self, method: str, path: str, body: bytes) -> tuple[int, bytes, str]:
        command = path.lstrip("/")
        if command not in ("get_action", "start_episode", "log_returns", "end_episode"):
            return self.refuse(404, "NotFound", f"unknown path {path}")
        if method != "POST":
            return self.refuse(405, "MethodNotAllowed", f"{path} needs POST")
        try:
            msg = self.unpackb(body, objects=False)
            if not isinstance(msg, dict):
                raise _BadRequest(f"body must be a msgpack map, got {type(msg).__name__}")
            if "returns" in msg:  # log_returns deferred by the client: first, in order
                for i, r in enumerate(_field(msg, "returns", list)):
                    if not isinstance(r, dict):
                        raise _BadRequest(f"returns[{i}] must be a map")
                    try:
                        self.run("log_returns", r)
                    except Exception as e:
                        e.args = (f"deferred log_returns (returns[{i}]): {e}", *e.args[1:])
                        raise
            if command == "get_action":
                result = await self.get_action(
                    _field(msg, "episode_id", str), _field(msg, "observation")
                )
            else:
                result = self.run(command, msg)
        except Exception as e:
            return self.error(e)
        return 200, self.packb(result), self.content_type

    def run(self, command: str, msg: dict) -> dict:
        env, agent = self.env, self.agent
        if command == "start_episode":
            eid = env.start_episode(
                _field(msg, "episode_id", str, optional=True),
                _field(msg, "training_enabled", bool, optional=True) is not False,
            )
            return {"episode_id": eid}
        eid = _field(msg, "episode_id", str)
        if command == "log_returns":
            info = _field(msg, "info", dict, optional=True)
            env.log_agent_returns(
                eid, {agent: _field(msg, "reward")}, None if info is None else {agent: info}, None
            )
        else:  # end_episode
            env.end_agent_episode(
                eid,
                {agent: _field(msg, "observation")},
                bool(_field(msg, "truncated", bool, optional=True)),
            )
        return {}

    async def get_action(self, eid: str, obs: Any) -> dict:
        loop = self.loop
        if loop is None:
            loop = self.loop = asyncio.get_running_loop()
        fut = loop.create_future()
        answered = self._answered

        def on_answer() -> None:  # the sampler thread (or whoever ends the wait), env lock held
            answered.append(fut)
            if not self._wake_pending:  # one wake-up of the loop per answered batch
                self._wake_pending = True
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to answer
                    loop.call_soon_threadsafe(self._deliver)

        env = self.env
        waiter = env.submit(eid, {self.agent: obs}, None, None, True, on_answer=on_answer)
        timed_out = []

        def expire() -> None:
            if env.expire_waiter(eid, waiter, f"get_action timed out after {timeout} s"):
                timed_out.append(True)

        timeout = env.action_timeout_s
        timer = loop.call_later(timeout, expire)
        try:
            await fut
        except asyncio.CancelledError:  # the client went away while waiting
            if not env.expire_waiter(eid, waiter, "client disconnected") and waiter.error is None:
                env.abandon_episode(eid, "client disconnected before receiving its action")
            raise
        finally:
            timer.cancel()
        if timed_out:
            raise TimeoutError(f"episode {eid}: no action within {timeout} s; episode abandoned")
        if waiter.error is not None:
            raise waiter.error
        return {"action": waiter.value[self.agent]}

    def _deliver(self) -> None:
        self._wake_pending = False
        answered = self._answered
        while answered:
            fut = answered.popleft()
            if not fut.done():  # a cancelled handler's future is done already
                fut.set_result(None)


# --------------------------------------------------------------------------- the candidates


class _ThreadedServer:
    """Common part: a daemon thread serving ``Endpoints(env)``; ``address``, ``close``."""

    address: str

    def _start(self, target: Any, name: str) -> None:
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=target, name=name, daemon=True)
        self.thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        raise NotImplementedError


class AiohttpServer(_ThreadedServer):
    """The endpoints as an ``aiohttp.web.Application`` (one catch-all route) on its own loop
    in a daemon thread; ``lowlevel``: aiohttp's low-level ``web.Server(handler)`` instead (no
    application, router or middlewares; the same protocol, parser and request objects)."""

    def __init__(
        self,
        env: Any,
        host: str = "127.0.0.1",
        lowlevel: bool = False,
        keepalive_s: float = KEEPALIVE_S,
    ):
        from aiohttp import web

        self.endpoints = Endpoints(env)
        self.loop = asyncio.new_event_loop()
        endpoints, content_length_max = self.endpoints, MAX_BODY_BYTES

        async def handler(request: web.BaseRequest) -> web.Response:
            if (request.content_length or 0) > content_length_max:  # before reading it
                status, body, ctype = endpoints.refuse(
                    413, "PayloadTooLarge", f"body exceeds {content_length_max} bytes"
                )
                return web.Response(status=status, body=body, content_type=ctype)
            status, body, ctype = await endpoints.handle(
                request.method, request.path, await request.read()
            )
            return web.Response(status=status, body=body, content_type=ctype)

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            try:
                opts = {
                    "access_log": None,
                    "keepalive_timeout": keepalive_s,
                    "handler_cancellation": True,
                }
                runner: web.BaseRunner
                if lowlevel:
                    loop = self.loop

                    def request(*args: Any) -> web.BaseRequest:
                        return web.BaseRequest(*args, loop, client_max_size=MAX_BODY_BYTES)

                    server = web.Server(handler, request_factory=request, loop=loop, **opts)
                    runner = web.ServerRunner(server, handle_signals=False)
                else:
                    app = web.Application(client_max_size=MAX_BODY_BYTES)
                    app.router.add_route("*", "/{tail:.*}", handler)
                    runner = web.AppRunner(app, handle_signals=False, **opts)
                self.loop.run_until_complete(runner.setup())
                site = web.TCPSite(runner, host, 0, backlog=1024, reuse_address=True)
                self.loop.run_until_complete(site.start())
                h, p = runner.addresses[0][:2]
                self.address = f"http://{h}:{p}"
            except BaseException as e:
                self._error = e
                self._ready.set()
                return
            self._ready.set()
            self.loop.run_forever()
            self.loop.run_until_complete(runner.cleanup())
            self.loop.close()

        self._start(run, "aiohttp-server")

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class UvicornServer(_ThreadedServer):
    """The endpoints as a bare ASGI app under ``uvicorn.Server`` in a daemon thread."""

    def __init__(self, env: Any, host: str = "127.0.0.1", keepalive_s: float = KEEPALIVE_S):
        import uvicorn

        self.endpoints = endpoints = Endpoints(env)

        async def app(scope: dict, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return
            length = 0
            for k, v in scope["headers"]:
                if k == b"content-length":
                    length = int(v)
            if length > MAX_BODY_BYTES:  # uvicorn has no body limit: the app checks
                status, body, ctype = endpoints.refuse(
                    413, "PayloadTooLarge", f"body exceeds {MAX_BODY_BYTES} bytes"
                )
            else:
                chunks, more = [], True
                while more:
                    m = await receive()
                    if m["type"] == "http.disconnect":
                        return
                    chunks.append(m.get("body", b""))
                    more = m.get("more_body", False)
                status, body, ctype = await endpoints.handle(
                    scope["method"], scope["path"], b"".join(chunks)
                )
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [
                        (b"content-type", ctype.encode()),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})

        # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say they are TCP
        # (with proto 0, uvicorn's two writes per answer meet Nagle + delayed ACK: 40 ms).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        h, p = sock.getsockname()[:2]
        self.address = f"http://{h}:{p}"
        config = uvicorn.Config(
            app,
            loop="asyncio",
            http="httptools",
            lifespan="off",
            access_log=False,
            log_level="warning",
            timeout_keep_alive=keepalive_s,  # type: ignore[arg-type]  (a float works)
            backlog=1024,
        )
        self.server = uvicorn.Server(config)

        def run() -> None:
            try:
                self.server.run(sockets=[sock])
            except BaseException as e:
                self._error = e
                self._ready.set()

        self._start_uvicorn(run)

    def _start_uvicorn(self, run: Any) -> None:
        self._ready = threading.Event()
        self._error = None
        self.thread = threading.Thread(target=run, name="uvicorn-server", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and self._error is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


# --------------------------------------------------------------------------- probes


def _make_server(stack: str, env: Any, keepalive_s: float = KEEPALIVE_S) -> Any:
    if stack == "current":
        from jaxsampler.serving.server import PolicyServer

        return PolicyServer(env, keepalive_timeout_s=keepalive_s)
    if stack == "uvicorn":
        return UvicornServer(env, keepalive_s=keepalive_s)
    return AiohttpServer(env, lowlevel=stack == "aiohttp-lowlevel", keepalive_s=keepalive_s)


def _connect(address: str, timeout: float) -> socket.socket:
    host, port = address.rsplit("/", 1)[-1].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    return sock


def _trickle(address: str, limit_s: float) -> str:
    """Sends the headers of a request one byte every 0.2 s (slow-loris); what the server did."""
    msg = b"POST /get_action HTTP/1.1\r\nHost: probe\r\nX-Slow: " + b"a" * 200
    sock = _connect(address, 0.2)
    t0 = time.monotonic()
    try:
        for i in range(len(msg)):
            if time.monotonic() - t0 > limit_s:
                return f"open after {limit_s:.0f} s"
            with contextlib.suppress(TimeoutError):
                sock.send(msg[i : i + 1])
                data = sock.recv(100)
                return f"closed after {time.monotonic() - t0:.1f} s" if not data else "answered"
        return "headers sent in full"
    except OSError as e:
        return f"{type(e).__name__} after {time.monotonic() - t0:.1f} s"
    finally:
        sock.close()


def _idle(address: str, limit_s: float) -> str:
    """Connects and sends nothing; what the server did."""
    sock = _connect(address, limit_s)
    t0 = time.monotonic()
    try:
        data = sock.recv(100)
        return f"closed after {time.monotonic() - t0:.1f} s" if not data else "answered"
    except TimeoutError:
        return f"open after {limit_s:.0f} s"
    except OSError as e:
        return f"{type(e).__name__} after {time.monotonic() - t0:.1f} s"
    finally:
        sock.close()


def _oversized(address: str) -> str:
    """A ``start_episode`` whose body is over the 8 MiB limit, through PolicyClient."""
    from jaxsampler.serving.client import PolicyClient

    client = PolicyClient(address, timeout=10)
    try:
        client.start_episode(episode_id="x" * (MAX_BODY_BYTES + 1024))
        return "accepted"
    except Exception as e:
        return type(e).__name__ + (f" {e.status}" if hasattr(e, "status") else "")
    finally:
        client.close()


def _gone_while_waiting(address: str, env: Any) -> str:
    """A client sends ``get_action`` and disconnects before any answer (nobody samples
    here); the episode's status afterwards (``finishing``: abandoned, ends as truncated)."""
    from jaxsampler.episodes.codec import packb
    from jaxsampler.serving.client import PolicyClient

    client = PolicyClient(address, timeout=10)
    eid = client.start_episode()
    client.close()
    body = packb({"episode_id": eid, "observation": [0.0, 0.0, 0.0, 0.0]})
    sock = _connect(address, 5)
    head = f"POST /get_action HTTP/1.1\r\nHost: probe\r\nContent-Length: {len(body)}\r\n\r\n"
    sock.sendall(head.encode() + body)
    time.sleep(0.3)
    sock.close()
    time.sleep(0.5)
    return str(env.episode_status(eid))


def probe_stacks(stacks: Sequence[str], keepalive_s: float = 1.0, limit_s: float = 3.0) -> dict:
    """Checks the "what each stack ships" table: each stack with a ``keepalive_s`` idle
    timeout (no sampler), probed with trickled headers, an idle connection, an oversized
    body and a client that disconnects while its ``get_action`` waits."""
    import jaxsampler as js
    from jaxsampler.host_envs.external import ExternalEnv

    cartpole = js.make("CartPole-v1")
    out = {}
    for s in stacks:
        env = ExternalEnv(cartpole.observation_space, cartpole.action_space)
        server = _make_server(s, env, keepalive_s)
        try:
            out[s] = {
                "trickled_headers": _trickle(server.address, limit_s),
                "idle_connection": _idle(server.address, limit_s),
                "oversized_body": _oversized(server.address),
                "client_gone_while_waiting": _gone_while_waiting(server.address, env),
            }
        finally:
            server.close()
            env.close()
        log(f"  probe {s}: {out[s]}")
    return {"keepalive_s": keepalive_s, "limit_s": limit_s, "stacks": out}


# --------------------------------------------------------------------------- driver


def port_extras_us(n: int = 20000) -> dict[str, float]:
    """CPU µs of what the candidates' port adds per ``get_action`` beyond the current
    layer's work (a Future, a ``call_later`` timeout, one wake of the awaiting coroutine),
    timed alone on a fresh loop: the part of their extra loop CPU that is this benchmark's
    doing rather than the library's."""

    async def run() -> dict[str, float]:
        loop = asyncio.get_running_loop()

        def noop() -> None:
            pass

        t = time.thread_time()
        for _ in range(n):
            fut = loop.create_future()
            timer = loop.call_later(300.0, noop)
            loop.call_soon(fut.set_result, None)
            await fut
            timer.cancel()
        with_timer = (time.thread_time() - t) / n * 1e6
        t = time.thread_time()
        for _ in range(n):
            fut = loop.create_future()
            loop.call_soon(fut.set_result, None)
            await fut
        return {"future_timer_wake": with_timer, "future_wake": (time.thread_time() - t) / n * 1e6}

    return asyncio.run(run())


def _ratios(a: list[dict], b: list[dict], key: str) -> dict[str, float] | None:
    """Median / min / max over rounds of ``a[r][key] / b[r][key]`` (same round)."""
    vals = [x[key] / y[key] for x, y in zip(a, b, strict=True) if x.get(key) and y.get(key)]
    if not vals:
        return None
    return {**harness.median_min_max(vals), "n": len(vals)}


def run_benchmark(stacks: Sequence[str], ph: Phases) -> dict[str, Any]:
    started = time.perf_counter()
    clients = ph.clients
    stacks = ["current"] + [s for s in stacks if s != "current"]
    log(f"setting up the sampler and {stacks} ...")
    side = serving.ServingSide(True, max(clients), ph.max_wait_s, ph.sample_timesteps, ph.seed)
    servers: dict[str, Any] = {"current": side.server}
    pools: dict[str, Any] = {}
    raw: dict[str, dict[int, list[dict]]] = {s: {n: [] for n in clients} for s in stacks}
    lat: dict[str, dict[int, list[float]]] = {s: {n: [] for n in clients} for s in stacks}
    try:
        for s in stacks[1:]:
            if s == "uvicorn":
                servers[s] = UvicornServer(side.env)
            else:
                servers[s] = AiohttpServer(side.env, lowlevel=s == "aiohttp-lowlevel")
        for s in stacks:
            pools[s] = serving_client.WorkerPool(servers[s].address, ph.client_procs)
        # CPU time of each stack's event-loop thread: the HTTP layer's own work (parse,
        # dispatch, env calls, answer), apart from the sampler thread the stacks share.
        threads = {t.name: t for t in threading.enumerate()}
        clocks = {
            s: time.pthread_getcpuclockid(
                (threads["PolicyServer"] if s == "current" else servers[s].thread).ident
            )
            for s in stacks
        }
        plain_snapshot = side.snapshot
        side.snapshot = lambda: (
            plain_snapshot()
            | {  # type: ignore[method-assign]
                "loop_cpu": {s: time.clock_gettime(c) for s, c in clocks.items()}
            }
        )
        setup_s = time.perf_counter() - started

        def phase(stack: str, cmd: dict) -> dict:
            res, a, b = pools[stack].run_phase(side, cmd)
            res["server"] = serving.server_window(a, b)
            sent = res["server"]["counts"]["actions_sent"]
            res["loop_cpu_us_per_action"] = (
                1e6 * (b["loop_cpu"][stack] - a["loop_cpu"][stack]) / sent if sent else None
            )
            res["loadavg_1min"] = os.getloadavg()[0]  # the other engineers' load: noise
            return res

        for s in stacks:  # connections, episodes, any lazy set-up of the stack
            for cmd in ph.warm_ups():
                phase(s, cmd)
        for r in range(ph.rounds):
            order = harness.rotated(clients, r)
            for i, n in enumerate(order):
                for s in harness.rotated(stacks, r * len(order) + i):
                    if side.error is not None:
                        raise RuntimeError(f"sampler thread failed: {side.error}")
                    res = keep_round(phase(s, ph.command(n)), raw[s][n], lat[s][n])
                    res["round"] = r
                    log(
                        f"  round {r + 1}/{ph.rounds} {n:3d} clients {s:8s} "
                        f"{res['actions_per_s']:8.0f} actions/s  p50 {res['p50_ms'] or 0:6.2f} ms"
                        f"  batch {res['server']['mean_batch'] or 0:5.1f}  errors "
                        f"{res['num_errors']}"
                    )
    finally:
        for pool in pools.values():
            pool.close()
        for s, server in servers.items():
            if s != "current":
                server.close()
        side.close()

    results_stacks = {}
    for s in stacks:
        cells = {}
        for n in clients:
            rs = raw[s][n]
            if not rs:
                continue
            aps = [r["actions_per_s"] for r in rs]
            p50, p99 = percentiles_ms(lat[s][n])
            cells[str(n)] = {
                "clients": n,
                "actions_per_s": statistics.median(aps),
                "actions_per_s_min": min(aps),
                "actions_per_s_max": max(aps),
                "p50_ms": p50,
                "p99_ms": p99,
                "p50_ms_rounds": [r["p50_ms"] for r in rs],
                "latency_samples": len(lat[s][n]),
                "mean_batch": statistics.median(r["server"]["mean_batch"] or 0 for r in rs),
                "server_cpu_cores": statistics.median(r["server"]["process_cpu_cores"] for r in rs),
                "server_cpu_us_per_action": statistics.median(
                    1e6 * r["server"]["process_cpu_cores"] / r["actions_per_s"]
                    for r in rs
                    if r["actions_per_s"]
                ),
                "client_cpu_us_per_action": statistics.median(
                    1e6 * r["cpu_cores"] / r["actions_per_s"] for r in rs if r["actions_per_s"]
                ),
                "loop_cpu_us_per_action": statistics.median(
                    r["loop_cpu_us_per_action"] for r in rs if r["loop_cpu_us_per_action"]
                ),
                "loadavg_1min": [r["loadavg_1min"] for r in rs],
                "num_errors": sum(r["num_errors"] for r in rs),
                "hung_threads": sum(r["hung_threads"] for r in rs),
                "errors": [e for r in rs for e in r["errors"]][:5],
                "rounds": rs,
            }
        results_stacks[s] = {"stack": s, "label": LABELS[s], "cells": cells}
    vs_current: dict[str, Any] = {}
    for s in stacks[1:]:
        vs_current[s] = {
            str(n): {
                "actions_per_s": _ratios(raw[s][n], raw["current"][n], "actions_per_s"),
                "p50": _ratios(raw[s][n], raw["current"][n], "p50_ms"),
                "p99": _ratios(raw[s][n], raw["current"][n], "p99_ms"),
                "server_cpu_per_action": _server_cpu_ratio(raw[s][n], raw["current"][n]),
                "loop_cpu_per_action": _ratios(
                    raw[s][n], raw["current"][n], "loop_cpu_us_per_action"
                ),
            }
            for n in clients
        }
    versions = harness.versions(("aiohttp", "uvicorn", "httptools", "msgpack"), missing=None)
    return {
        **harness.stamp(
            "Serving stacks: PolicyServer's HTTP layer vs aiohttp / uvicorn, side by side",
            "serving_stacks",
        ),
        "config": {
            "stacks": stacks,
            "clients": clients,
            "rounds": ph.rounds,
            "warmup_s": ph.warmup_s,
            "duration_s": ph.duration_s,
            "episode_len": ph.episode_len,
            "sample_timesteps": ph.sample_timesteps,
            "max_wait_s": ph.max_wait_s,
            "client_procs": ph.client_procs,
            "seed": ph.seed,
            "hidden": list(serving.HIDDEN),
            "switch_interval_s": sys.getswitchinterval(),
            "max_body_bytes": MAX_BODY_BYTES,
            "keepalive_s": KEEPALIVE_S,
        },
        "threshold": {
            "actions_per_s_ratio_below": THRESHOLD_ACTIONS,
            "p50_ratio_above": THRESHOLD_P50,
            "rule": "the cost is large if, at any client count, the median within-round ratio "
            f"candidate / current of actions/s is below {THRESHOLD_ACTIONS} or that of p50 "
            f"latency is above {THRESHOLD_P50}",
        },
        "setup_s": setup_s,
        "wall_s": time.perf_counter() - started,
        "sampler_error": side.error,
        "recompiles_while_timing": side.recompiles(),
        "environment": environment_info() | {"packages": versions},
        "git": harness.git_state(),
        "stacks": results_stacks,
        "vs_current": vs_current,
        "verdicts": {s: verdict(vs_current[s]) for s in stacks[1:]},
        "noise": noise(raw),
        "port_extras_us": port_extras_us(),
        "probes": probe_stacks(stacks),
    }


def noise(raw: dict[str, dict[int, list[dict]]]) -> dict[str, Any]:
    """The machine's load average over the phases, and the current stack's own spread of
    actions/s over rounds (max / min) per client count."""
    loads = [r["loadavg_1min"] for cells in raw.values() for rs in cells.values() for r in rs]
    spread = {}
    for n, rs in raw["current"].items():
        aps = [r["actions_per_s"] for r in rs if r["actions_per_s"]]
        if aps:
            spread[str(n)] = max(aps) / min(aps)
    return {
        "loadavg_1min": {
            "min": min(loads, default=None),
            "median": statistics.median(loads) if loads else None,
            "max": max(loads, default=None),
        },
        "current_actions_per_s_max_over_min": spread,
    }


def summary(res: dict[str, Any]) -> str:
    """The verdict paragraph, written from the numbers."""
    vs, verdicts = res["vs_current"], res["verdicts"]
    if not vs:
        return "Only the current stack ran: nothing to compare."

    def worst(s: str) -> float:
        return min(
            (c["actions_per_s"]["median"] for c in vs[s].values() if c["actions_per_s"]),
            default=0.0,
        )

    def span(s: str, key: str) -> str:
        vals = [c[key]["median"] for c in vs[s].values() if c[key]]
        return f"{min(vals):.2f}–{max(vals):.2f}x" if vals else "—"

    best = max(vs, key=worst)
    ok = [s for s in vs if not verdicts[s]["large"]]
    counts = ", ".join(vs[best])
    figures = (
        f"{best} gives {span(best, 'actions_per_s')} the current actions/s, "
        f"{span(best, 'p50')} its p50 latency, {span(best, 'loop_cpu_per_action')} its "
        f"event-loop CPU per action and {span(best, 'server_cpu_per_action')} its "
        f"server-process CPU per action (medians of within-round ratios at {counts} clients)"
    )
    others = [
        f"{s}: {span(s, 'actions_per_s')} actions/s, {span(s, 'p50')} p50, "
        f"{span(s, 'loop_cpu_per_action')} loop CPU/action"
        for s in vs
        if s != best
    ]
    if ok:
        head = f"Move: {', '.join(ok)} stay within the threshold. Of the candidates, {figures}."
    else:
        head = (
            "Do not move: every candidate's cost is large by the threshold at some client "
            f"count. The cheapest, {figures}."
        )
    head += f" Others: {'; '.join(others)}." if others else ""
    if not ok:
        head += (
            " Take the protections the current layer lacks (see what each stack ships) into "
            "it instead, and rerun this script once they land: it measures whatever "
            "PolicyServer is in the tree."
        )
    return head


def _server_cpu_ratio(a: list[dict], b: list[dict]) -> dict[str, float] | None:
    def per_action(r: dict) -> float | None:
        aps = r["actions_per_s"]
        return r["server"]["process_cpu_cores"] / aps if aps else None

    vals = [
        per_action(x) / per_action(y)
        for x, y in zip(a, b, strict=True)
        if per_action(x) and per_action(y)  # type: ignore[operator]
    ]
    if not vals:
        return None
    return {**harness.median_min_max(vals), "n": len(vals)}


def _clients(n: str | int) -> str:
    return f"{n} client" + ("" if str(n) == "1" else "s")


def verdict(vs: dict[str, Any]) -> dict[str, Any]:
    """Applies the threshold to one candidate's within-round ratios."""
    over = []
    for n, c in vs.items():
        a, p = c["actions_per_s"], c["p50"]
        if a is not None and a["median"] < THRESHOLD_ACTIONS:
            over.append(f"{_clients(n)}: actions/s x{a['median']:.2f}")
        if p is not None and p["median"] > THRESHOLD_P50:
            over.append(f"{_clients(n)}: p50 x{p['median']:.2f}")
    return {"large": bool(over), "over_threshold": over}


# --------------------------------------------------------------------------- report


def _ratio(r: dict | None, fmt: str = ".2f") -> str:
    if r is None:
        return "—"
    return f"**{r['median']:{fmt}}** [{r['min']:{fmt}}–{r['max']:{fmt}}]"


def markdown_table(res: dict[str, Any]) -> str:
    cfg, env = res["config"], res["environment"]
    pk = env.get("packages", {})
    md = "# Serving stacks: the hand-written HTTP layer vs aiohttp / uvicorn\n\n"
    md += (
        f"{res['date']} · `{res['command']}` · jax {env['jax']} ({env['backend']}) · "
        f"{env['cpu_count']} CPUs · Python {env['python']} · "
        + " · ".join(f"{k} {v}" for k, v in pk.items())
        + f" · MLPPolicy {tuple(cfg['hidden'])} tanh · episodes of {cfg['episode_len']} steps · "
        f"`sample_batch(num_timesteps={cfg['sample_timesteps']})` loop · "
        f"max_wait_s={cfg['max_wait_s']} · clients in {cfg['client_procs']} other processes · "
        f"{cfg['rounds']} rounds x {cfg['duration_s']} s per cell (+{cfg['warmup_s']} s warm-up) "
        f"· wall {res['wall_s']:.0f} s · git {res['git'].get('commit', '')[:10]}\n\n"
    )
    md += (
        f"**Threshold, fixed before the run:** {res['threshold']['rule']}. Ratios are taken "
        "within a round (the stacks run back to back against the same sampler, seconds "
        "apart), then the median over rounds; the machine is a shared 2-core box, so min–max "
        "over rounds is the noise.\n\n"
    )
    md += "## Per stack\n\n"
    md += (
        "Total actions/s: median over rounds [min–max]; `get_action` latency in the client, "
        "all rounds pooled; batch = actions per jitted policy call; CPU µs per action: the "
        "server process (sampler + every server thread) and the client processes.\n\n"
    )
    md += (
        "| stack | clients | total actions/s | p50 ms | p99 ms | batch | HTTP loop CPU µs/action "
        "| server CPU µs/action | client CPU µs/action | errors |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    for s in res["stacks"].values():
        for c in s["cells"].values():
            md += (
                f"| {s['label']} | {c['clients']} | **{thousands(c['actions_per_s'])}** "
                f"[{thousands(c['actions_per_s_min'])}–{thousands(c['actions_per_s_max'])}] | "
                f"{fmt(c['p50_ms'], '.2f')} | {fmt(c['p99_ms'], '.2f')} | "
                f"{fmt(c['mean_batch'], '.1f')} | "
                f"{fmt(c['loop_cpu_us_per_action'], '.0f')} | "
                f"{fmt(c['server_cpu_us_per_action'], '.0f')} | "
                f"{fmt(c['client_cpu_us_per_action'], '.0f')} | "
                f"{c['num_errors'] + c['hung_threads']} |\n"
            )
    md += "\n## Candidate / current, within each round\n\n"
    md += (
        "Median over rounds [min–max] of the ratio candidate / current in the same round "
        "(actions/s: above 1 is faster; latency and CPU: below 1 is better).\n\n"
    )
    md += (
        "| candidate | clients | actions/s | p50 latency | p99 latency | HTTP loop CPU per action "
        "| server CPU per action |\n|---|---:|---:|---:|---:|---:|---:|\n"
    )
    for s, cells in res["vs_current"].items():
        for n, c in cells.items():
            md += (
                f"| {s} | {n} | {_ratio(c['actions_per_s'])} | {_ratio(c['p50'])} | "
                f"{_ratio(c['p99'])} | {_ratio(c['loop_cpu_per_action'])} | "
                f"{_ratio(c['server_cpu_per_action'])} |\n"
            )
    md += "\n## What each stack ships\n\n" + FEATURES_MD
    pr = res.get("probes")
    if pr:
        md += (
            f"\nProbed (each stack with a {pr['keepalive_s']:g} s keep-alive timeout, no "
            f"sampler; 'open' = still open after {pr['limit_s']:g} s): request headers sent "
            "one byte every 0.2 s; a connection that sends nothing; a 9 MiB `start_episode` "
            "through PolicyClient; a client that disconnects while its `get_action` waits "
            "(`finishing` = the episode was abandoned and ends as truncated).\n\n"
            "| stack | trickled headers | idle connection | oversized body | client gone while "
            "waiting |\n|---|---|---|---|---|\n"
        )
        for s, p in pr["stacks"].items():
            md += (
                f"| {s} | {p['trickled_headers']} | {p['idle_connection']} | "
                f"{p['oversized_body']} | {p['client_gone_while_waiting']} |\n"
            )
    md += "\n## Verdict (by the threshold)\n\n"
    for s, v in res["verdicts"].items():
        md += (
            f"* **{s}**: "
            + (
                "cost is large (" + "; ".join(v["over_threshold"]) + ")"
                if v["large"]
                else "cost is within the threshold at every client count"
            )
            + "\n"
        )
    md += "\n" + summary(res) + "\n"
    px = res["port_extras_us"]
    md += (
        f"\nOf the candidates' extra event-loop CPU per action, the port's own additions (a "
        f"Future, a timeout timer and one coroutine wake per `get_action`, timed alone) "
        f"account for {px['future_timer_wake']:.0f} µs ({px['future_wake']:.0f} µs without "
        "the timer); the rest is the library's per-request work.\n"
    )
    nz = res["noise"]
    la = nz["loadavg_1min"]
    md += "\n## Noise\n\n"
    md += (
        f"1-minute load average over the phases (other engineers' tests on the same 2 cores): "
        f"{fmt(la['min'], '.1f')} / {fmt(la['median'], '.1f')} / {fmt(la['max'], '.1f')} "
        "(min / median / max). The current stack's own actions/s, max / min over rounds: "
        + ", ".join(
            f"{v:.2f}x at {_clients(n)}"
            for n, v in nz["current_actions_per_s_max_over_min"].items()
        )
        + ". CPU per action is the figure least moved by other load (it counts CPU used, "
        "not the wall time spent waiting for a core); HTTP loop CPU = the CPU time of the "
        "stack's event-loop thread (parsing, dispatch, env calls, answers) per action the "
        "sampler sent in the window.\n"
    )
    errs = sum(
        c["num_errors"] + c["hung_threads"]
        for s in res["stacks"].values()
        for c in s["cells"].values()
    )
    md += (
        f"\nSetup {res['setup_s']:.1f} s (sampler, compile, servers, client processes); "
        f"recompiles while timing: {res['recompiles_while_timing']}; sampler error: "
        f"{res['sampler_error'] or 'none'}; client errors / hung threads: {errs}.\n"
    )
    return md


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stacks", nargs="+", choices=STACKS, help=f"default: {' '.join(STACKS)}")
    serving_client.add_arguments(p, "serving_stacks", SIZES)
    p.add_argument(
        "--rerender",
        type=Path,
        help="rewrite the verdicts and the Markdown from this results JSON (no measuring)",
    )
    args = p.parse_args(argv)
    if args.rerender:
        res = json.loads(args.rerender.read_text())
        res["verdicts"] = {s: verdict(v) for s, v in res["vs_current"].items()}
        out = args.out or args.rerender.parent
        harness.write_results(res, markdown_table(res), out, "serving_stacks")
        return
    SIZES.apply(args)
    res = run_benchmark(args.stacks, Phases.from_args(args))
    harness.finish(
        res, markdown_table(res), "serving_stacks", harness.results_dir(args.out, args.quick)
    )


if __name__ == "__main__":
    main()
