"""HTTP policy serving: :class:`PolicyServer` (the client is :mod:`jaxsampler.serving.client`).

The server owns an :class:`~jaxsampler.host_envs.external.ExternalEnv` (or the multi-agent
variant) and is itself a :class:`~jaxsampler.host_envs.base.HostEnv` (``poll`` /
``send_actions`` go to that env), so any host sampler can sample from it: experience of
remote clients ends up in the sampler's episodes and batches. The endpoints, bodies, error
statuses and the security model are the wire protocol's: :mod:`jaxsampler.serving.protocol`.

The rooms: :mod:`~jaxsampler.serving.listener` (the event loop in its daemon thread,
accepting connections) and :mod:`~jaxsampler.serving.http` (one connection: HTTP/1.1
parsing, limits, pipelining, deadlines) carry requests; this module turns them into env
calls; :mod:`~jaxsampler.serving.batching` runs ``/batch`` requests fairly across
connections. A ``get_action`` is queued into the env without blocking anything, and the
sampler's answers for a whole batch wake the event loop once. Calls that may block
(``log_action`` under back pressure) and the decoding of bodies over 64 KiB run on a small
worker pool. Requests run as their client (the ``X-Client-Id`` header; without one as
:data:`ANONYMOUS_OWNER`), so a client cannot see or touch another client's episodes.

A client that disconnects while its ``get_action`` waits is noticed at once (the event
loop sees the connection close): its episode is abandoned and ends as truncated (see
:mod:`~jaxsampler.host_envs.external`); other episodes are untouched. A numbered
``get_action`` (``seq``, as :class:`~jaxsampler.serving.PolicyClient` sends) keeps waiting
instead, and its answer is recorded, so the client's retry gets it (a dropped connection
costs no episode); a client that does not come back loses the episode after
``client_gone_grace_s``. A client that
vanishes between calls (its connection closed) loses its episodes after
``client_gone_grace_s``; one that goes silent with its connection open, after the env's
``episode_timeout_s``. Deadlines do not count time in which the server's process itself did
not run (see :mod:`~jaxsampler.serving.listener`).
"""

from __future__ import annotations

import contextlib
import hmac
import inspect
import json
import secrets
import ssl
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

import numpy as np

from jaxsampler import spaces as sp
from jaxsampler.constants import DEFAULT_AGENT_ID
from jaxsampler.episodes.codec import packb, unpackb
from jaxsampler.host_envs import external as ext
from jaxsampler.host_envs.base import HostEnv, MultiEnvDict, PollResult, agent_spaces
from jaxsampler.serving.batching import FairBatches
from jaxsampler.serving.commands import _Commands, _field, _restarted
from jaxsampler.serving.health import SamplerHealth
from jaxsampler.serving.http import BadRequest, Connection, HTTPError, Limits, Request
from jaxsampler.serving.listener import HTTPServer
from jaxsampler.serving.protocol import (
    AUTH_SCHEME,
    BATCHABLE_COMMANDS,
    COMMANDS,
    CONTENT_TYPE,
    EPOCH_HEADER,
    PROTOCOL_VERSION,
    PolicyServerError,
    SequenceError,
    ServerUnavailableError,
)
from jaxsampler.serving.sequence import (
    Answer,
    BatchIds,
    RequestInProgress,
    Sequences,
    fingerprint,
)
from jaxsampler.serving.server_connection import PolicyConnection as _Connection
from jaxsampler.serving.server_connection import unavailable as _unavailable

__all__ = ["PolicyServer", "PolicyServerError", "PROTOCOL_VERSION"]

#: Requests without an ``X-Client-Id`` run as this owner (never as ``None``, which the env
#: lets touch every episode: that is for in-process callers only).
ANONYMOUS_OWNER = "anonymous"
#: request bodies larger than this are decoded on a worker thread, not on the event loop
_INLINE_DECODE_BYTES = 64 << 10
#: commands refused while the sampler is stalled (they would wait for it, or start new
#: work for it); after a failure every command is refused
_NEED_SAMPLER = frozenset({"start_episode", "get_action"})
_UNAVAILABLE = ServerUnavailableError.__name__
_RUNNING = ("running", "finishing")  # episode states that keep a sequence record
_STALE = (
    "the server restarted since this client last heard from it: the episodes of its "
    "earlier run are gone; start new episodes"
)


def _seq_of(msg: Mapping) -> int | None:
    """The request's ``seq`` (None without one); 400 unless a non-negative int."""
    seq = msg.get("seq")
    if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int) or seq < 0):
        raise BadRequest(f"field 'seq' must be an int >= 0, got {seq!r}")
    return seq


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
class _Limits(Limits):
    """The HTTP layer's limits plus the policy server's own (see :class:`PolicyServer`)."""

    max_episode_id_len: int
    max_batch_commands: int


class PolicyServer(_Commands, HTTPServer, HostEnv):
    """Serves an external env over HTTP on ``host:port`` (see the module docstring and
    :mod:`~jaxsampler.serving.protocol`).

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
        sampler_timeout_s: the sampler counts as stalled once it has not called :meth:`poll`
            for this long (a sampler blocked inside ``poll`` is polling; before the first
            poll the clock runs from the server's start); ``None``: never. While stalled,
            ``start_episode`` and ``get_action``, and a ``log_action`` that would have to
            wait for room (back pressure), get 503 ``ServerUnavailableError`` at once with
            the reason; a ``get_action`` already waiting is answered so within about a tenth
            of this time (its episode is abandoned, as on a timeout). ``log_returns``,
            ``end_episode`` and a ``log_action`` with room are still accepted: they never
            wait for the sampler, and it takes them when it polls again, which ends the
            stall. A sampler loop that does other long work between polls (training, say)
            needs a larger value or ``None``.
        client_gone_grace_s: when the peer closes the last connection of a client (its
            ``X-Client-Id``) and no new request of it arrives within this long (10 s by
            default), its running episodes are abandoned (they end truncated, infos
            ``abandoned``); ``None``: never (then ``episode_timeout_s`` ends them).
            Connections the server closes (idle keep-alive ones, after an error answer) do
            not start the grace. Anonymous requests (no ``X-Client-Id``) are one client: its
            grace starts only when no anonymous connection is left.

    The sampler reports its own death with :meth:`fail` (or :meth:`sampler_alive` around its
    loop); then every request gets 503 with the failure until :meth:`close`. ``GET /health``
    reports the state (see :meth:`health_report`).

    The server runs in a daemon thread (an asyncio event loop) from construction on. Use as
    a context manager or call :meth:`close`.

    Raises:
        OSError: the address cannot be bound (e.g. the port is in use).
        ValueError: a limit is not positive.
        TypeError: ``env`` is not an external env, or ``ssl_context`` / ``token`` have the
            wrong type.
    """

    _connection_class = _Connection

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
        sampler_timeout_s: float | None = 30.0,
        client_gone_grace_s: float | None = 10.0,
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
        limits = _Limits(
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
        #: what the server knows about its sampler (see :mod:`~jaxsampler.serving.health`)
        self.health = SamplerHealth(sampler_timeout_s, env.clock.now)
        # get_action timeouts and stalls are noticed within +10%
        shortest = min(env.action_timeout_s, sampler_timeout_s or env.action_timeout_s)
        tick_s = min(1.0, max(0.01, shortest / 10))
        # Binds first: nothing to clean up if it cannot.
        super().__init__(
            host,
            port,
            limits,
            ssl_context=ssl_context,
            tick_s=tick_s,
            name="PolicyServer",
            clock=env.clock,
            client_gone_grace_s=client_gone_grace_s,
        )
        self.limits: _Limits = limits
        self.env = env
        # The env's spaces, agents and capacity are fixed at its construction.
        self.observation_space, self.action_space = env.observation_space, env.action_space
        # agent id -> space for agents with their own spaces (``None``: the shared ones)
        self.observation_spaces = getattr(env, "observation_spaces", None)
        self.action_spaces = getattr(env, "action_spaces", None)
        self.agent_ids, self.num_envs = env.agent_ids, env.num_envs
        self.abandons_episodes = env.abandons_episodes
        self.names_episodes = env.names_episodes  # a journal's env: ids shared with samplers
        self.max_body_bytes, self.keepalive_timeout_s = (
            self.limits.max_body_bytes,
            self.limits.keepalive_timeout_s,
        )
        if max_array_bytes is None:
            obs_spaces, act_spaces = agent_spaces(env)
            spaces = (*obs_spaces.values(), *act_spaces.values())
            max_array_bytes = max(64 << 10, *(_space_nbytes(s) for s in spaces))
        elif max_array_bytes <= 0:
            raise ValueError(f"max_array_bytes must be > 0, got {max_array_bytes}")
        self.max_array_bytes = int(max_array_bytes)
        # Owners need an env that knows them; None would let a call touch any episode.
        self._owned = "owner" in inspect.signature(env.start_episode).parameters
        self._token = None if token is None else f"{AUTH_SCHEME} {token}".encode()
        self._weights: tuple[int, bytes | None] = (0, None)
        self._answers: deque[list] = (
            deque()
        )  # [connection, episode id, waiter] of answered get_actions
        self._wake_pending = False
        self._executor = ThreadPoolExecutor(
            max_workers=4, thread_name_prefix="PolicyServer-blocking"
        )
        self._batches = FairBatches(self._executor, self._batch_commands, self._run_batched)
        #: this server run's id (16 random hex digits), sent with every answer as
        #: ``X-Server-Epoch``: a client that sees it change knows the server restarted
        self.epoch = secrets.token_hex(8)
        self.answer_headers = f"{EPOCH_HEADER}: {self.epoch}\r\n"
        self._epoch_bytes = self.epoch.encode()
        self._sequences = Sequences(lambda eid: env.episode_status(eid) in _RUNNING)
        self._batch_ids = BatchIds()
        self._serve()

    # -- HostEnv (delegated) -------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> PollResult:
        """The env's :meth:`~jaxsampler.host_envs.external.ExternalEnvBase.poll`; the time it
        runs counts as the sampler being alive (``sampler_timeout_s``)."""
        self.health.poll_started()
        try:
            return self.env.poll(timeout)
        finally:
            self.health.poll_ended()

    def send_actions(self, actions: MultiEnvDict) -> None:
        """The env's :meth:`~jaxsampler.host_envs.external.ExternalEnvBase.send_actions`."""
        self.env.send_actions(actions)

    # -- server ----------------------------------------------------------------------------

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
        """The version of the params last published (0: none yet)."""
        return self._weights[0]

    def fail(self, failure: BaseException | str) -> None:
        """Reports that the sampler died (its exception, or a sentence saying why), from any
        thread. From then on every request gets 503 ``ServerUnavailableError`` whose message
        carries the failure (an exception as its ``repr``), requests already waiting
        (``get_action``, ``log_action`` under back pressure) are answered so at once, and
        ``GET /health`` says ``"failed"``; the env is closed, so nothing more is queued for
        a sampler that will not come. The server stays failed until :meth:`close` (a new
        sampler needs a new server). Later calls keep the first reason."""
        if self.health.fail(failure):
            self.env.close()  # wakes every waiting caller: their answers carry the failure

    @contextlib.contextmanager
    def sampler_alive(self) -> Iterator[PolicyServer]:
        """Context manager for the sampler's loop: an exception escaping it (say, a full
        disk under the offline writer) is reported with :meth:`fail`, then re-raised, so
        clients get 503 with its reason instead of waiting for answers that never come::

            with server.sampler_alive():
                while not stop.is_set():
                    writer.write(sampler.sample())
        """
        try:
            yield self
        except BaseException as e:
            self.fail(e)
            raise

    def health_report(self) -> dict[str, Any]:
        """The sampler's state as ``GET /health`` reports it: ``status`` (``"ok"``,
        ``"stalled"`` or ``"failed"``), ``since_last_poll_s``, ``reason`` (the 503 message;
        ``None`` when ok), ``sampler_timeout_s``, ``polls`` and ``polling`` (see
        :meth:`~jaxsampler.serving.health.SamplerHealth.report`)."""
        return self.health.report()

    def _explain(self, e: BaseException) -> BaseException:
        """``e``, or after a reported failure the 503 carrying it instead of the env's
        "closed" error (which is how :meth:`fail` wakes waiting callers)."""
        if isinstance(e, ext.EnvClosedError) and self.health.failure is not None:
            problem = self.health.problem()
            assert problem is not None
            return _unavailable(problem)
        return e

    def _check_sampler(self, command: str) -> None:
        """Raises the 503 for ``command`` when the sampler cannot serve it (see
        ``sampler_timeout_s``)."""
        problem = self.health.problem()
        if problem is not None and (command in _NEED_SAMPLER or self.health.failure is not None):
            raise _unavailable(problem)

    def close(self) -> None:
        """Stops serving, drops open connections and closes the env. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.env.close()  # fails every waiting get_action: their answers are sent first
        self._stop()
        self._batches.shutdown()
        self._executor.shutdown(wait=False)

    # -- requests (event-loop thread) --------------------------------------------------------

    def _authorized(self, auth: list[bytes]) -> bool:
        """Whether a request with these ``Authorization`` values may be served."""
        if self._token is None:
            return True
        return len(auth) == 1 and hmac.compare_digest(auth[0], self._token)

    def _owner(self, req: Request) -> str:
        return ANONYMOUS_OWNER if req.client_id is None else req.client_id

    def _client_gone(self, client_id: str | None) -> None:
        """Abandons the running episodes of a client gone for ``client_gone_grace_s``."""
        owner = ANONYMOUS_OWNER if client_id is None else client_id
        if self._owned:
            self.env.abandon_owner(owner, "client gone: its connection closed")

    def _dispatch(self, conn: Connection, req: Request) -> None:
        """Answers one request (event-loop thread): ``GET /weights`` and ``/info``, a command,
        or ``/batch``; bodies over 64 KiB are decoded on a worker thread first."""
        url = b"".join(req.url)
        try:
            parts = urlsplit(url.decode("latin-1"))
            path = parts.path
        except ValueError as e:  # e.g. "http://[": llhttp lets it through
            conn.error(
                400, "InvalidDataError", f"malformed URL {url[:100].decode('latin-1')!r}: {e}"
            )
            return
        command = path.lstrip("/")
        if req.method == b"GET":
            self._get(conn, req, path, parts.query)
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
        stale = req.epoch is not None and req.epoch != self._epoch_bytes
        if command == "batch":
            try:
                if stale:
                    raise _restarted(_STALE)
                self._start_batch(conn, body, owner, parts.query)
            except Exception as e:
                conn.exception(e)
            return
        if len(body) > _INLINE_DECODE_BYTES:
            # Decoding a big body (plain lists: a Python walk over every item) would stall
            # every connection: decode it on a worker, then carry on here.
            conn.busy = True

            def decoded(fut: Any) -> None:
                conn.busy = False
                e = fut.exception()
                if conn.closing:
                    pass  # the client is gone: nobody would get the answer, so it does not run
                elif e is not None:
                    conn.exception(e)
                else:
                    self._command(conn, command, fut.result(), owner, body, stale)
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
        self._command(conn, command, msg, owner, body, stale)

    def _command(
        self, conn: Connection, command: str, msg: dict, owner: Any, body: bytes, stale: bool
    ) -> None:
        """Runs one decoded command (not ``/batch``) and answers it, or leaves it waiting
        (``get_action``, back pressure) with the connection marked busy. ``stale``: the
        request names an earlier server run (410 unless it names no episode); a numbered
        one (``seq``) may be a retry: see :meth:`_numbered`."""
        try:
            if stale and (command != "start_episode" or "returns" in msg):
                raise _restarted(_STALE)
            skip = self._numbered(cast(_Connection, conn), command, msg, owner, body)
            if skip is None:
                return  # a retry of a request that succeeded: its answer was sent again
            # One journal commit per request, before its answer: at the block's end, or for
            # a get_action the commit that precedes its action (see commits_deferred).
            with self.env.commits_deferred() as deferral:
                if "returns" in msg:  # log_returns deferred by the client: first, in order
                    self._returns(
                        _field(msg, "returns", list), owner, skip, cast(_Connection, conn)
                    )
                if command == "get_action":
                    self._start_get_action(
                        cast(_Connection, conn),
                        self._episode_id(msg),
                        _field(msg, "observation"),
                        owner,
                    )
                    deferral.covered = True
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

    def _numbered(
        self, conn: _Connection, command: str, msg: dict, owner: Any, body: bytes
    ) -> int | None:
        """Checks a numbered request (``seq``; see :mod:`~jaxsampler.serving.sequence`):
        answers a retry of one that succeeded with its recorded answer (returns None), or
        marks it running (the answer ends it) and returns how many of its deferred returns
        already ran (0 without ``seq``)."""
        seq = _seq_of(msg)
        if seq is None:
            return 0
        eid = self._episode_id(msg, optional=command == "start_episode")
        if eid is None:
            raise BadRequest("a start_episode with 'seq' needs an 'episode_id'")
        key = (owner, eid)
        if command == "start_episode" and self.env.episode_status(eid) not in _RUNNING:
            self._sequences.forget(key)  # an earlier episode of this id (allow_reuse)
        try:
            got = self._sequences.begin(key, seq, fingerprint(command, body))
        except SequenceError as e:
            if command == "start_episode":
                return 0  # another start of a running id: the env's own 409 says so
            raise HTTPError(409, SequenceError.__name__, e.reason) from None
        except RequestInProgress as e:
            if command == "get_action" and self._rejoin(conn, key, seq):
                return None  # it waits in the first one's place
            raise HTTPError(503, "RequestInProgress", str(e)) from None
        if isinstance(got, Answer):
            conn.respond(got.status, got.body, got.content_type)
            return None
        conn.ticket = (key, seq, command)
        return got

    def _rejoin(self, conn: _Connection, key: tuple, seq: int) -> bool:
        """A retried numbered ``get_action`` (same bytes) whose first request still waits on
        a connection that closed takes that wait over: its answer (or error, or timeout)
        goes to ``conn``; returns whether there was such a wait."""
        for c in self._lingering:
            old = cast(_Connection, c)
            if old.ticket is not None and old.ticket[:2] == (key, seq) and old.entry is not None:
                break
        else:
            return False
        self._lingering.discard(old)
        conn.ticket, conn.waiting, conn.entry = old.ticket, old.waiting, old.entry
        conn.expired, conn.deadline = old.expired, old.deadline
        old.ticket, old.waiting, old.entry, old.expired = None, None, None, None
        entry = conn.entry
        assert entry is not None
        entry[0] = conn
        conn.busy = True
        return True

    def _decode(self, body: bytes) -> dict:
        msg = unpackb(body, objects=False, max_bytes_per_array=self.max_array_bytes)
        if not isinstance(msg, dict):
            raise BadRequest(f"body must be a msgpack map, got {type(msg).__name__}")
        return msg

    def _check_count(self, name: str, items: list) -> None:
        limit = self.limits.max_batch_commands
        if len(items) > limit:
            raise HTTPError(
                413,
                "PayloadTooLarge",
                f"{len(items)} {name} in one request exceed max_batch_commands={limit}",
            )

    def _get(self, conn: Connection, req: Request, path: str, query: str = "") -> None:
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
                # agent id -> space where the agents have their own (then the two above
                # are None)
                "observation_spaces": getattr(env, "observation_spaces", None),
                "action_spaces": getattr(env, "action_spaces", None),
            }
            conn.respond(200, packb(info))
        elif path == "/sequence":
            try:
                conn.respond(200, packb(self._sequence_report(self._owner(req), query)))
            except Exception as e:
                conn.exception(e)
        elif path == "/health":  # answered here: never waits for the sampler
            report = self.health.report()
            body = json.dumps(report).encode()
            conn.respond(200 if report["status"] == "ok" else 503, body, "application/json")
        elif path.lstrip("/") in COMMANDS or path == "/batch":
            conn.error(405, "MethodNotAllowed", f"{path} needs POST")
        else:
            conn.error(404, "NotFound", f"unknown path {path}")

    def _in_executor(self, conn: Connection, fn: Callable, *args: Any) -> None:
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
        self._check_sampler("get_action")
        entry: list = [conn, eid, None]  # the waiter is filled in below

        def answered() -> None:  # whoever ends the wait: the sampler thread under the env
            # lock, or with a journal the thread that woke the answers after their commit
            self._answers.append(entry)
            if not self._wake_pending:
                self._wake_pending = True
                # A RuntimeError means the loop is closed: nobody to answer any more.
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self._deliver_answers)

        try:
            waiter = self.env.submit(
                eid, self._agents(obs), None, None, True, on_answer=answered, **self._as(owner)
            )
        except ext.UnknownEpisodeError as e:
            raise self._unknown(e, eid) from None
        assert waiter is not None  # a request that wants an action always has a waiter
        # Still in the loop thread: answered()'s delivery runs after this, with the entry complete.
        entry[2] = waiter
        conn.busy, conn.waiting, conn.entry = True, (eid, waiter), entry
        conn.deadline = time.monotonic() + self.env.action_timeout_s  # see check_timeouts

    def _expire(self, conn: _Connection, eid: str, error: BaseException) -> None:
        """Gives up ``conn``'s waiting ``get_action`` (its episode is abandoned); ``error``
        becomes its answer."""
        if conn.waiting is not None and conn.waiting[0] == eid:
            why = (
                f"get_action timed out after {self.env.action_timeout_s} s"
                if isinstance(error, TimeoutError)
                else f"get_action given up: {error}"
            )
            # False when the answer came first (its delivery is queued): then it is delivered
            if self.env.expire_waiter(eid, conn.waiting[1], why):
                conn.expired = error

    def _deliver_answers(self) -> None:
        self._wake_pending = False
        answers = self._answers
        while answers:
            conn, eid, waiter = answers.popleft()
            if conn.waiting is None or conn.waiting[1] is not waiter:
                continue
            conn.waiting = None
            self._lingering.discard(conn)
            try:
                if conn.closing and conn.ticket is not None and waiter.error is None:
                    conn.end_ticket(200, self._action_body(waiter.value), CONTENT_TYPE)
                elif conn.closing:  # the action never reaches the client, nor a retry
                    conn.end_ticket(499)
                    if waiter.error is None:
                        self.env.abandon_episode(
                            eid, "client disconnected before receiving its action"
                        )
                elif conn.expired is not None:
                    error, conn.expired = conn.expired, None
                    self.env.commit_journal()  # the error acknowledges the request's returns
                    conn.exception(error)
                elif waiter.error is not None:
                    self.env.commit_journal()
                    conn.exception(waiter.error)
                else:
                    conn.respond(200, self._action_body(waiter.value))
            except Exception as e:
                conn.exception(e)
            conn.done()

    def _action_body(self, actions: dict) -> bytes:
        """The body of a ``get_action`` answer."""
        return packb({"action": actions if self.env.multi_agent else actions[DEFAULT_AGENT_ID]})

    def _returns(
        self, returns: list, owner: str | None, skip: int = 0, conn: _Connection | None = None
    ) -> None:
        """Runs a request's deferred ``log_returns`` in order, but the first ``skip`` (a
        retry's that ran already); a numbered request (``conn.ticket``) records each run."""
        self._check_count("deferred returns", returns)
        ticket = None if conn is None else conn.ticket
        for i, r in enumerate(returns):
            if i < skip:
                continue
            if not isinstance(r, dict):
                raise BadRequest(f"returns[{i}] must be a map")
            try:
                self._run("log_returns", r, owner)
            except Exception as e:
                e.args = (f"deferred log_returns (returns[{i}]): {e}", *e.args[1:])
                raise
            if ticket is not None:
                self._sequences.returns_ran(ticket[0], ticket[1], i + 1)

    def _batch_commands(self, body: bytes, owner: str | None) -> list:
        """The commands of a ``/batch`` body, after its deferred ``returns`` ran (any thread)."""
        msg = self._decode(body)
        if "returns" in msg:
            self._returns(_field(msg, "returns", list), owner)
        commands = _field(msg, "commands", list)
        self._check_count("commands", commands)
        return commands

    def _run_batched(self, i: int, c: Any, owner: str | None, block: bool) -> None:
        """Runs command ``i`` of a ``/batch`` (any thread; see :class:`FairBatches`)."""
        if not isinstance(c, dict):
            raise BadRequest(f"command {i} must be a map")
        name = _field(c, "command", str)
        if name not in BATCHABLE_COMMANDS:
            raise BadRequest(
                f"command {name!r} cannot be batched (allowed: {list(BATCHABLE_COMMANDS)})"
            )
        self._run(name, c, owner, block=block)
