"""HTTP policy client: :class:`PolicyClient` (the wire protocol and its endpoints are in
:mod:`jaxsampler.serving.protocol`).

``remote`` inference mode sends every call to the server, whose sampler computes the
actions; ``local`` mode pulls the policy weights every ``update_interval`` seconds,
computes actions in the client with one jitted call and ships experience back in the
background through ``/batch``.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import ssl
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode, urlsplit

import numpy as np

from jaxsampler.constants import DEFAULT_AGENT_ID
from jaxsampler.episodes.codec import packb, unpackb
from jaxsampler.episodes.ids import random_episode_id
from jaxsampler.host_envs import external as ext
from jaxsampler.serving.protocol import (
    AUTH_SCHEME,
    CLIENT_ID_HEADER,
    CLIENT_ID_PATTERN,
    CONTENT_TYPE,
    EPOCH_HEADER,
    ERRORS_BY_NAME,
    PolicyServerError,
    SequenceError,
    ServerRestartedError,
    ServerUnavailableError,
)
from jaxsampler.serving.transport import (
    Connection,
    EpisodeNumbers,
    NotSent,
    StaleConnection,
    backoff_delays,
)
from jaxsampler.spaces import check_value

__all__ = ["PolicyClient"]

#: Deferred ``log_returns`` a request carries at most (more are flushed through /batch).
_MAX_CARRIED_RETURNS = 32
#: statuses only a check before any command gives (deferred returns did not run)
_REFUSED_BEFORE_COMMANDS = frozenset({401, 405, 408, 411, 413, 414, 431})
#: error names the server gives before a request's deferred returns run (its seq check)
_NAMED_BEFORE_COMMANDS = frozenset({SequenceError.__name__, "RequestInProgress", "NotFound"})
_EPOCH = EPOCH_HEADER.lower()
#: how the server names a deferred log_returns that failed
_RETURNS_INDEX = re.compile(r"deferred log_returns \(returns\[(\d+)\]\)")


def _returns_run(status: int, body: bytes, carried: int) -> tuple[int, int]:
    """What the server did with the ``carried`` deferred ``log_returns`` of a request it
    answered with the error ``status`` / ``body``: ``(ran, refused)``, the first ``ran`` of
    them ran, the next ``refused`` (0 or 1) it refused for its content, the rest did not run.

    The server runs a request's deferred returns in order before its command: an error that
    names ``returns[i]`` ran the ones before it (and refused that one unless the server
    could not serve at all, a 5xx); an error from a check before any command runs (the
    token, the path or method, a limit of the request, ``max_connections``) ran none; any
    other error is the command's own, after all of them ran."""
    try:
        err = json.loads(body.decode())
        name, message = str(err.get("error", "")), str(err.get("message", ""))
    except (ValueError, UnicodeDecodeError, AttributeError):
        name, message = "", ""
    named = _RETURNS_INDEX.search(message)
    if named is not None and int(named[1]) < carried:
        i = int(named[1])
        return i, 0 if status >= 500 else 1
    if (
        status in _REFUSED_BEFORE_COMMANDS
        or name in _NAMED_BEFORE_COMMANDS
        or (status == 503 and "max_connections" in message)
    ):
        return 0, 0
    return carried, 0


def _no_answer(e: BaseException) -> bool:
    """Whether a request failed for want of an answer (a retry may get one)."""
    return isinstance(e, (ConnectionError, TimeoutError))


def _message(data: bytes) -> str:
    """The ``message`` of a JSON error body (or its start)."""
    try:
        return str(json.loads(data.decode()).get("message", ""))
    except (ValueError, UnicodeDecodeError, AttributeError):
        return data[:200].decode(errors="replace")


def _remove(returns: list, drop: list) -> None:
    """Removes the messages of ``drop`` (those very objects) from ``returns``, in place."""
    gone = {id(m) for m in drop}
    returns[:] = [m for m in returns if id(m) not in gone]


def _attach_returns(e: BaseException, returns: list) -> None:
    """Sets ``e.deferred_returns`` (see :class:`PolicyClient`), where ``e`` takes attributes."""
    with contextlib.suppress(AttributeError, TypeError):
        e.deferred_returns = list(returns)  # type: ignore[attr-defined]


class PolicyClient:
    """Talks to a :class:`PolicyServer`: the five ExternalEnv calls over HTTP.

    Args:
        address: the server's ``"http://host:port"`` (``"https://host:port"`` for a server
            with an ``ssl_context``).
        inference_mode: ``"remote"`` (the server's sampler computes every action, one
            round trip per call) or ``"local"`` (actions come from ``policy`` here, with
            params pulled from the server; experience is sent back in the background).
        policy: a :class:`~jaxsampler.policies.base.Policy` (local mode only).
        update_interval: local mode: pull new params when at least this many seconds
            passed since the last pull (checked at every call).
        timeout: socket timeout of one request, in seconds.
        seed: local mode PRNG seed.
        flush_interval: local mode: experience is sent at least this often.
        max_batch_commands: a ``/batch`` request (local mode's experience, remote mode's
            flushed ``log_returns``) carries at most this many commands; keep it at or below
            the server's ``max_batch_commands`` (4096 by default).
        defer_returns: remote mode: ``log_returns`` does not make its own round trip; its
            reward travels with the thread's next request (``get_action``, ``end_episode``,
            ...), which the server runs before it (one round trip per step instead of two).
            A server-side error of a deferred call (say, an unknown episode) is raised by
            that next call, which is then not run. :meth:`flush` / :meth:`close` send what
            is left. Deferred returns stay pending until the server ran them: a call that
            fails before they ran (no answer at all, or an error answer from a check before
            any command, or a 5xx naming them) leaves them pending for this thread's next
            request, and its exception lists them in ``deferred_returns`` (the
            ``log_returns`` messages, in order, that the server did not run; one it refused
            for its content, named in the error, is first there and no longer pending).
            Caveat: after a call with no answer the server may have run them already (it
            read the request, then the connection broke): the next request then carries
            them again.
        token: sent as ``Authorization: Bearer <token>`` with every request (servers with a
            ``token`` refuse requests without it: :class:`PolicyServerError` 401).
        ssl_context: client-side :class:`ssl.SSLContext` for ``https://`` addresses; default
            :func:`ssl.create_default_context` (system CAs, host name checked). Pass a
            context that trusts the server's certificate for a self-signed one.
        client_id: this client's id, sent as ``X-Client-Id`` with every request: the server
            runs its calls as that owner (other clients' episodes are unknown to it);
            default a random one (:attr:`client_id`). Several clients may share an id to
            act on the same episodes (say, a simulator that restarted).
        retries: how often a request is sent again, after ``backoff_s``, twice that, four
            times ..., when it got no answer (connection refused, reset or closed before
            the answer, a timeout) or a 503 (the server's capacity, a stalled sampler, a
            retry of a request still running). Never after a 4xx or another 5xx. A retry is
            safe: the episode commands of episodes this client started carry a per-episode
            number (``seq``; ``start_episode`` sends a client-made id with number 0), so
            the server runs each once and answers a repeat with the first answer; each
            ``/batch`` (local mode's experience, :meth:`flush`) carries a request id that
            the server runs once in the same way; commands of episodes started elsewhere
            have no number and are sent again only when they cannot have arrived (no
            connection) or after a 503. After the last try the error is what it would have
            been without retries
            (``ConnectionError``, :class:`ServerUnavailableError`, ...). ``0``: no retries
            and no numbers (the requests of earlier versions). Caveat: after a call that
            got no answer even from its last try, whether it ran is unknown; if it did,
            the episode's next command gets :class:`SequenceError` (its number is taken).
        backoff_s: the first wait before a retry, in seconds.

    Restarts: every answer names the server's run (``X-Server-Epoch``); the client sends the
    run an episode started in with each of its commands. A server that restarted since
    (a new :class:`PolicyServer`) refuses them with 410 and the client raises
    :class:`ServerRestartedError` (also for deferred ``log_returns`` of such episodes, listed
    in its ``deferred_returns`` and dropped); calls that name nothing from before (a new
    ``start_episode``, :meth:`health`, :meth:`server_info`) just work and the client takes
    the new run as current. Episodes it did not start (another client's ids) are not
    tracked: after a restart they get the server's 404, or 410 when its journal knows them.

    Thread-safe: each thread uses its own keep-alive connection. In local mode, errors of
    the background sender (e.g. the server refused a step) are raised by the next call.
    """

    def __init__(
        self,
        address: str,
        inference_mode: str = "remote",
        *,
        policy: Any = None,
        update_interval: float = 10.0,
        timeout: float = 600.0,
        seed: int = 0,
        flush_interval: float = 0.05,
        max_batch_commands: int = 512,
        defer_returns: bool = True,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        client_id: str | None = None,
        retries: int = 3,
        backoff_s: float = 0.05,
    ):
        parts = urlsplit(address)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
            raise ValueError(
                f"address must look like 'http://host:port' or 'https://host:port', got {address!r}"
            )
        if inference_mode not in ("remote", "local"):
            raise ValueError(f"inference_mode must be 'remote' or 'local', got {inference_mode!r}")
        if ssl_context is not None and parts.scheme != "https":
            raise ValueError(f"ssl_context needs an 'https://' address, got {address!r}")
        if token is not None and (not isinstance(token, str) or not token.isprintable()):
            raise ValueError("token must be a non-empty printable str or None")
        if token == "":
            raise ValueError("token must not be empty (None: no token)")
        if client_id is None:
            client_id = secrets.token_hex(16)
        elif not isinstance(client_id, str) or not re.fullmatch(CLIENT_ID_PATTERN, client_id):
            raise ValueError(f"client_id must match {CLIENT_ID_PATTERN}, got {client_id!r}")
        if int(max_batch_commands) < 1:
            raise ValueError(f"max_batch_commands must be >= 1, got {max_batch_commands}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {retries!r}")
        if not backoff_s >= 0:
            raise ValueError(f"backoff_s must be >= 0, got {backoff_s!r}")
        self.retries, self.backoff_s = retries, float(backoff_s)
        #: the server run (``X-Server-Epoch``) this client heard from last (None: not yet)
        self.server_epoch: str | None = None
        self._numbers = EpisodeNumbers()
        self.address, self.inference_mode = address, inference_mode
        self.defer_returns = bool(defer_returns)
        #: sent as ``X-Client-Id``: the owner of the episodes this client starts
        self.client_id = client_id
        self._host, self._port, self._timeout = parts.hostname, parts.port, timeout
        if parts.scheme == "https" and ssl_context is None:
            ssl_context = ssl.create_default_context()
        self._ssl = ssl_context
        self._fixed_headers = f"{CLIENT_ID_HEADER}: {client_id}\r\n" + (
            "" if token is None else f"Authorization: {AUTH_SCHEME} {token}\r\n"
        )
        self._max_batch = int(max_batch_commands)
        self._tls = threading.local()
        self._closed = False
        if inference_mode == "local":
            if policy is None:
                raise ValueError("inference_mode='local' needs a policy")
            self._init_local(policy, update_interval, seed, flush_interval)

    # -- transport ---------------------------------------------------------------------

    def _conn(self) -> Connection:
        c = getattr(self._tls, "conn", None)
        if c is None:
            c = self._tls.conn = Connection(self._host, self._port, self._timeout, self._ssl)
        return c

    def _request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict | None = None,
        epoch: str | None = None,
    ) -> tuple[int, dict, bytes]:
        """One round trip on this thread's keep-alive connection: ``(status, headers, body)``
        (header names lower-case); ``epoch``: the server run the request is meant for.
        Raises :class:`NotSent` when no connection could be opened, ``ConnectionError``
        when the answer did not come."""
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self._host}:{self._port}\r\n{self._fixed_headers}"
        )
        if body is not None:
            head += f"Content-Type: {CONTENT_TYPE}\r\nContent-Length: {len(body)}\r\n"
        if epoch is not None:
            head += f"{EPOCH_HEADER}: {epoch}\r\n"
        for k, v in (headers or {}).items():
            head += f"{k}: {v}\r\n"
        data = head.encode("latin-1") + b"\r\n" + (body or b"")
        for attempt in (0, 1):
            conn = self._conn()
            reused = conn.used
            try:
                answer = conn.round_trip(data)
            except StaleConnection as e:
                conn.close()
                if (
                    reused and attempt == 0
                ):  # the server closed an idle keep-alive connection: retry once
                    continue
                raise ConnectionError(f"policy server {self.address}: {e}") from None
            except NotSent as e:
                conn.close()
                raise NotSent(f"policy server {self.address}: {e}") from e
            except OSError as e:
                conn.close()
                raise ConnectionError(f"policy server {self.address}: {e}") from e
            got = answer[1].get(_EPOCH)
            if got is not None and got != self.server_epoch:
                self.server_epoch = got  # the first one, or the server restarted
            return answer
        raise AssertionError("unreachable")

    def _get(self, path: str, headers: dict | None = None, ok: tuple = (200,)) -> tuple:
        """A ``GET`` (safe to repeat): retried on no answer, and on a 503 unless ``ok``
        has it (``/health`` reports with it); raises for a status not in ``ok`` (but 304)."""
        delays = backoff_delays(self.retries, self.backoff_s)
        for attempt in range(len(delays) + 1):
            try:
                status, hdrs, data = self._request("GET", path, headers=headers)
            except ConnectionError:
                if attempt == len(delays):
                    raise
                time.sleep(delays[attempt])
                continue
            if status == 503 and 503 not in ok and attempt < len(delays):
                time.sleep(delays[attempt])
                continue
            if status not in ok and status != 304:
                self._raise(status, data)
            return status, hdrs, data
        raise AssertionError("unreachable")

    def _raise(self, status: int, data: bytes) -> None:
        try:
            err = json.loads(data.decode())
            name, message = err.get("error", ""), err.get("message", "")
        except (ValueError, UnicodeDecodeError):
            name, message = "", data[:200].decode(errors="replace")
        if name == ServerUnavailableError.__name__:
            raise ServerUnavailableError(message)
        if name == ServerRestartedError.__name__:
            raise ServerRestartedError(message)
        if name == SequenceError.__name__:
            raise SequenceError(
                f"{message} (PolicyClient.resync(episode_id) continues from the server's number)"
            )
        cls = ERRORS_BY_NAME.get(name)
        if cls is not None:
            raise cls(f"server: {message}")
        raise PolicyServerError(status, f"{name}: {message}" if name else message)

    def _post(self, command: str, payload: dict, episode_id: Any = None) -> dict:
        """Sends a command (with this thread's deferred returns) and returns its answer,
        retrying as :class:`PolicyClient` says; ``episode_id``: the episode it names, whose
        number and server run go with it when this client started it. A ``/batch`` gets a
        fresh request id (``?id=``; with ``retries``), kept by its retries: the server runs
        it once."""
        deferred = getattr(self._tls, "returns", None) if command != "batch" else None
        if deferred and len(deferred) > min(_MAX_CARRIED_RETURNS, self._max_batch):
            # Many: they go on their own first (/batch), which the server runs in slices
            # rather than at once before this request.
            self.flush()
            deferred = None
        self._drop_stale_returns(deferred)
        epoch, seq = self._numbers.get(episode_id)
        if seq is not None:
            payload = {**payload, "seq": seq}
        path = "/" + command
        if command == "batch" and self.retries:
            path += f"?id={secrets.token_hex(12)}"
        # the server runs it once, however often it is sent
        numbered = "seq" in payload or path != "/" + command
        sent = epoch if epoch is not None else self.server_epoch
        delays = backoff_delays(self.retries, self.backoff_s)
        for attempt in range(len(delays) + 1):
            # This thread's log_returns calls travel with its next request; they leave the
            # pending list only once the server ran (or refused) them (see defer_returns).
            # Unchanged, a retry sends the same bytes: the server knows it by them.
            carried = list(deferred) if deferred else []
            body = packb({**payload, "returns": carried} if carried else payload)
            last = attempt == len(delays)
            try:
                status, headers, data = self._request("POST", path, body, epoch=sent)
            except Exception as e:  # no answer: whether the server ran them is unknown
                if not last and (isinstance(e, NotSent) or (numbered and _no_answer(e))):
                    time.sleep(delays[attempt])
                    continue
                _attach_returns(e, carried)
                raise
            if status // 100 == 2:
                break
            restarted = sent is not None and headers.get(_EPOCH, sent) != sent
            if restarted and status == 410:  # refused before anything ran: a new server run
                stale = self._stale(carried)
                if deferred:
                    _remove(deferred, stale)
                gone = ServerRestartedError(_message(data))
                _attach_returns(gone, stale)
                raise gone
            ran, refused = _returns_run(status, data, len(carried))
            if deferred:
                del deferred[: ran + refused]
            if status == 503 and not last:
                time.sleep(delays[attempt])
                continue
            try:
                self._raise(status, data)
            except Exception as e:
                _attach_returns(e, carried[ran:])
                raise
        if deferred:
            del deferred[: len(carried)]  # the server ran them before the command itself
        if seq is not None:
            self._numbers.advance(episode_id, seq)
        return unpackb(data, objects=False)

    def _stale(self, returns: list) -> list:
        """The deferred returns of episodes this client started in an earlier server run."""
        current = self.server_epoch
        out = []
        for m in returns:
            epoch, _ = self._numbers.get(m.get("episode_id"))
            if epoch is not None and epoch != current:
                out.append(m)
        return out

    def _drop_stale_returns(self, deferred: list | None) -> None:
        """Raises :class:`ServerRestartedError` (nothing sent) when this thread holds deferred
        returns of episodes the server lost when it restarted; they are dropped."""
        if not deferred or self.server_epoch is None:
            return
        stale = self._stale(deferred)
        if stale:
            _remove(deferred, stale)
            e = ServerRestartedError(
                f"{len(stale)} deferred log_returns name episodes of a server run before "
                "its restart; they were dropped (start new episodes)"
            )
            _attach_returns(e, stale)
            raise e

    def resync(self, episode_id: str) -> dict:
        """Continues the numbering of ``episode_id`` from the server's, after a
        :class:`SequenceError` (or for an episode another client of this ``client_id``
        started): later commands carry the number the server expects.

        Returns the server's report ``{"episode_id", "last", "next"}`` (``last``: the last
        number it ran for this client, ``None`` when none; ``next``: the number this client
        sends next) and ``"unanswered_ran"``: whether the server ran this client's call
        that got no answer (``ConnectionError`` after the last retry): that call's number
        is then ``last``, so it took effect and must not be repeated; ``False`` means it
        did not run (repeat it if it matters). Resyncing is safe as far as the server is
        concerned (nothing runs twice); it is up to the caller to reconcile its own state
        with ``unanswered_ran``.

        Raises:
            ValueError: local inference or ``retries=0`` (no numbers to resync).
            UnknownEpisodeError / ServerRestartedError: the episode is not running on
                this server run (start a new one).
            PolicyServerError: 503 ``RequestInProgress`` after the retries (a numbered
                command of it still runs; resync once it finished).
        """
        if self.inference_mode == "local" or not self.retries:
            raise ValueError("resync needs remote inference with retries (numbered commands)")
        _, _, data = self._get("/sequence?" + urlencode({"episode_id": episode_id}))
        report = unpackb(data, objects=False)
        _, mine = self._numbers.get(episode_id)
        last = report["last"]
        report["unanswered_ran"] = last is not None and mine is not None and last >= mine
        report["next"] = 1 if report["next"] is None else report["next"]
        self._numbers.adopt(episode_id, self.server_epoch, report["next"])
        return report

    # -- the five calls ------------------------------------------------------------------

    def start_episode(
        self,
        episode_id: str | None = None,
        training_enabled: bool = True,
        *,
        allow_reuse: bool = False,
    ) -> str:
        """Starts an episode on the server; returns its id (without ``episode_id``, a fresh
        random one made here, so that a retried start is recognised).

        ``allow_reuse``: start ``episode_id`` again although an episode of that id finished
        on this server run (refused otherwise, :class:`EpisodeStateError`). Ids a server's
        journal knows from an earlier run are refused either way (recovery finds steps by
        id)."""
        if self.inference_mode == "local":
            return self._local_start(episode_id, training_enabled)
        msg: dict[str, Any] = {"episode_id": episode_id, "training_enabled": training_enabled}
        if self.retries:  # numbered: a retried start is recognised by its id and nonce
            msg["episode_id"] = random_episode_id() if episode_id is None else episode_id
            msg["seq"], msg["nonce"] = 0, secrets.token_hex(8)
        if allow_reuse:
            msg["allow_reuse"] = True
        eid = self._post("start_episode", msg)["episode_id"]
        self._numbers.started(eid, self.server_epoch, numbered=bool(self.retries))
        return eid

    def get_action(self, episode_id: str, observation: Any) -> Any:
        """The action for ``observation`` (a dict per agent for multi-agent servers)."""
        if self.inference_mode == "local":
            return self._local_act(episode_id, observation)
        return self._post(
            "get_action", {"episode_id": episode_id, "observation": observation}, episode_id
        )["action"]

    def log_action(
        self, episode_id: str, observation: Any, action: Any, info: dict | None = None
    ) -> None:
        """Logs an off-policy step (an action the simulator chose). ``info`` is added to the
        step's info; ``info={"action_logp": x}`` gives the logp of ``action`` under the
        behaviour policy, which the server's sampler records instead of computing it (for
        multi-agent servers, ``info`` is ``{agent: dict}``)."""
        msg = {"episode_id": episode_id, "observation": observation, "action": action}
        if info is not None:
            msg["info"] = info
        self._send("log_action", msg)

    def log_returns(
        self,
        episode_id: str,
        reward: Any,
        info: dict | None = None,
        multiagent_done_dict: dict | None = None,
    ) -> None:
        """Adds reward(s) to the previous step."""
        msg = {"episode_id": episode_id, "reward": reward, "info": info}
        if multiagent_done_dict:
            msg["done"] = multiagent_done_dict
        if self.inference_mode == "remote" and self.defer_returns:
            # What can be checked here fails here (the env's own reward check); the rest
            # at the next call.
            for a, r in (
                reward.items() if isinstance(reward, Mapping) else ((DEFAULT_AGENT_ID, reward),)
            ):
                ext.check_reward(r, a)
            if info is not None and not isinstance(info, Mapping):
                raise ext.InvalidDataError(f"info must be a dict, got {type(info).__name__}")
            returns = getattr(self._tls, "returns", None)
            if returns is None:
                returns = self._tls.returns = []
            returns.append(msg)
            return
        self._send("log_returns", msg)

    def end_episode(self, episode_id: str, observation: Any, truncated: bool = False) -> None:
        """Ends the episode with its final observation."""
        self._send(
            "end_episode",
            {"episode_id": episode_id, "observation": observation, "truncated": truncated},
        )
        if self.inference_mode == "local":
            self._states.pop(episode_id, None)
            self._episodes.discard(episode_id)
        else:
            self._numbers.forget(episode_id)

    def _send(self, command: str, msg: dict) -> None:
        if self.inference_mode == "local":
            if msg["episode_id"] not in self._episodes:
                raise ext.UnknownEpisodeError(
                    f"Episode {msg['episode_id']} not found (not started by this client)."
                )
            self._enqueue({"command": command, **msg})
        else:
            self._post(command, msg, msg["episode_id"])

    # -- local inference -----------------------------------------------------------------

    def _init_local(
        self, policy: Any, update_interval: float, seed: int, flush_interval: float
    ) -> None:
        import jax

        info = self.server_info()
        self._multi_agent = bool(info["multi_agent"])
        own = info.get("observation_spaces") or info.get("action_spaces")
        if own or getattr(policy, "observation_space", None) is None:
            raise ValueError(
                "inference_mode='local' runs one policy on one observation space; "
                + (
                    "the server's agents have their own spaces"
                    if own
                    else f"{type(policy).__name__} has none"
                )
                + ": use inference_mode='remote' (the server's sampler runs a policy per "
                "set of agents that share spaces)"
            )
        self.policy, self.update_interval = policy, float(update_interval)
        self._params: Any = None
        self.weights_version = 0
        self._last_pull = -float("inf")
        self._key = jax.random.PRNGKey(seed)
        self._episodes: set[str] = set()
        self._states: dict[str, dict] = {}
        self._act_lock = threading.Lock()

        def step(params, obs, key, state):
            key, sub = jax.random.split(key)
            action, extras, state = policy(params, obs, sub, state)
            return action, extras, state, key

        self._step = jax.jit(step)
        self._out: list[dict] = []
        self._out_cv = threading.Condition()
        self._sending = False
        self._send_error: Exception | None = None
        self._flush_interval = float(flush_interval)
        self._sender = threading.Thread(
            target=self._sender_loop, name="PolicyClient.sender", daemon=True
        )
        self._sender.start()

    def server_info(self) -> dict:
        """The server's ``/info``: protocol version, spaces, agent ids, weights version."""
        _, _, data = self._get("/info")
        return unpackb(data, objects=False, spaces=True)

    def health(self) -> dict:
        """The server's ``GET /health``: its sampler's ``status`` (``"ok"``, ``"stalled"`` or
        ``"failed"``), ``since_last_poll_s``, ``reason`` and more (see
        :meth:`~jaxsampler.serving.server.PolicyServer.health_report`). A stalled or failed
        sampler is reported here, not raised."""
        status, _, data = self._get("/health", ok=(200, 503))
        try:
            report = json.loads(data.decode())
        except (ValueError, UnicodeDecodeError):
            report = None
        if not isinstance(report, dict) or "status" not in report:
            # a 503 from elsewhere (e.g. over max_connections) is no health report
            self._raise(status, data)
        return report

    def update_policy_weights(self) -> bool:
        """Pulls params from the server (local mode); returns whether they changed."""
        import jax

        headers = {"If-None-Match": f'"{self.weights_version}"'} if self._params is not None else {}
        status, _, data = self._get("/weights", headers=headers)
        self._last_pull = time.monotonic()
        if status == 304:
            return False
        msg = unpackb(data, objects=False)
        self._params = jax.device_put(msg["params"])
        self.weights_version = int(msg["version"])
        return True

    def _local_start(self, episode_id: str | None, training_enabled: bool) -> str:
        eid = random_episode_id() if episode_id is None else episode_id
        if eid in self._episodes:
            raise ext.EpisodeStateError(f"Episode {eid} has already been started.")
        self._enqueue(
            {"command": "start_episode", "episode_id": eid, "training_enabled": training_enabled}
        )
        self._episodes.add(eid)
        self._states[eid] = {}
        return eid

    def _local_act(self, episode_id: str, observation: Any) -> Any:
        import jax

        if episode_id not in self._episodes:
            raise ext.UnknownEpisodeError(
                f"Episode {episode_id} not found (not started by this client)."
            )
        self._raise_sender_error()
        obs = observation if self._multi_agent else {DEFAULT_AGENT_ID: observation}
        if not isinstance(obs, Mapping) or not obs:
            raise ext.InvalidDataError(
                f"observation must be a non-empty dict agent -> obs, got {type(obs).__name__}"
            )
        space = self.policy.observation_space
        obs = {
            a: check_value(o, space, f"observation[{a!r}]", error=ext.InvalidDataError)
            for a, o in obs.items()
        }
        agents = list(obs)
        with self._act_lock:
            if self._params is None or time.monotonic() - self._last_pull >= self.update_interval:
                self.update_policy_weights()
            states = self._states[episode_id]
            state = jax.tree.map(
                lambda *xs: np.concatenate(xs, axis=1),
                *[states.get(a) or self.policy.initial_state((1, 1)) for a in agents],
            )
            batch = jax.tree.map(lambda *xs: np.stack(xs)[None], *[obs[a] for a in agents])
            action, extras, state, self._key = self._step(self._params, batch, self._key, state)
            action, extras, state = jax.device_get((action, extras, state))
            version = self.weights_version
        for i, a in enumerate(agents):
            states[a] = jax.tree.map(lambda x, i=i: x[:, i : i + 1], state)
        acts = {a: jax.tree.map(lambda x, i=i: x[0, i], action) for i, a in enumerate(agents)}
        infos = {
            a: {
                ext.CLIENT_POLICY_INFO: {
                    "weights_version": version,
                    "extra_model_outputs": {k: v[0, i] for k, v in extras.items()},
                }
            }
            for i, a in enumerate(agents)
        }
        self._enqueue(
            {
                "command": "log_action",
                "episode_id": episode_id,
                "observation": obs if self._multi_agent else obs[DEFAULT_AGENT_ID],
                "action": acts if self._multi_agent else acts[DEFAULT_AGENT_ID],
                "info": infos if self._multi_agent else infos[DEFAULT_AGENT_ID],
            }
        )
        return acts if self._multi_agent else acts[DEFAULT_AGENT_ID]

    def _enqueue(self, cmd: dict) -> None:
        self._raise_sender_error()
        if self._closed:
            raise ext.EnvClosedError("PolicyClient was closed")
        with self._out_cv:
            self._out.append(cmd)
            if len(self._out) >= self._max_batch:
                self._out_cv.notify_all()

    def _sender_loop(self) -> None:
        while True:
            with self._out_cv:
                if not self._out and not self._closed:
                    self._out_cv.wait(self._flush_interval)
                if not self._out and self._closed:
                    return
                batch, self._out = self._out[: self._max_batch], self._out[self._max_batch :]
                self._sending = bool(batch)
            if batch:
                try:
                    errors = self._post("batch", {"commands": batch})["errors"]
                    if errors:
                        first = errors[0]
                        self._raise(first["status"], json.dumps(first).encode())
                except Exception as e:
                    if self._send_error is None:
                        self._send_error = e
            with self._out_cv:
                self._sending = False
                self._out_cv.notify_all()

    def _raise_sender_error(self) -> None:
        if self.inference_mode == "local" and self._send_error is not None:
            e, self._send_error = self._send_error, None
            raise e

    def flush(self) -> None:
        """Sends what this client holds back: remote mode, this thread's deferred
        ``log_returns`` (one ``/batch`` request); local mode, blocks until queued experience
        reached the server. Raises the server's error, if any."""
        if self.inference_mode != "local":
            returns = getattr(self._tls, "returns", None)
            self._drop_stale_returns(returns)
            while returns:  # at most max_batch_commands a request (servers cap it)
                chunk = returns[: self._max_batch]
                try:
                    answer = self._post(
                        "batch", {"commands": [{"command": "log_returns", **m} for m in chunk]}
                    )
                except Exception as e:  # not run (or unknown): they stay pending
                    _attach_returns(e, chunk)
                    raise
                del returns[: len(chunk)]  # run, or refused one by one (errors)
                errors = answer["errors"]
                if errors:
                    try:
                        self._raise(errors[0]["status"], json.dumps(errors[0]).encode())
                    except Exception as e:
                        _attach_returns(e, [chunk[x["index"]] for x in errors])
                        raise
            return
        with self._out_cv:
            self._out_cv.notify_all()
            while self._out or self._sending:
                self._out_cv.wait(0.5)
        self._raise_sender_error()

    def close(self) -> None:
        """Flushes (see :meth:`flush`) and closes this thread's connection. Idempotent."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            if self.inference_mode == "local":
                with self._out_cv:
                    self._out_cv.notify_all()
                self._sender.join(timeout=5)
            c = getattr(self._tls, "conn", None)
            if c is not None:
                c.close()
                self._tls.conn = None

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
