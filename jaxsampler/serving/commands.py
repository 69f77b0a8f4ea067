"""The policy server's commands as the env runs them: :class:`_Commands`, the part of
:class:`~jaxsampler.serving.server.PolicyServer` that checks a command's fields and calls
the external env (start, log_action, log_returns, end), and the field and 410 helpers its
request handling shares."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs

from jaxsampler.constants import DEFAULT_AGENT_ID
from jaxsampler.host_envs import external as ext
from jaxsampler.serving.health import SamplerHealth
from jaxsampler.serving.http import BadRequest, HTTPError
from jaxsampler.serving.protocol import CONTENT_TYPE, SequenceError, ServerRestartedError
from jaxsampler.serving.sequence import Answer, BatchIds, RequestInProgress, fingerprint
from jaxsampler.serving.server_connection import unavailable as _unavailable


def _restarted(reason: str) -> HTTPError:
    """The 410 answer for a request that names something of an earlier server run."""
    return HTTPError(410, ServerRestartedError.__name__, reason)


_REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _batch_id(query: str) -> str | None:
    """The request id of a ``/batch`` (``?id=...``; 1-64 characters of ``A-Za-z0-9_-``), or
    ``None`` without one.

    Raises:
        BadRequest: a malformed or repeated id.
    """
    if not query:
        return None
    try:
        ids = parse_qs(query, keep_blank_values=True, max_num_fields=4).get("id")
    except ValueError as e:
        raise BadRequest(f"malformed query string: {e}") from None
    if ids is None:
        return None
    if len(ids) != 1 or not _REQUEST_ID.fullmatch(ids[0]):
        raise BadRequest("a /batch id must be one value of 1-64 characters A-Z a-z 0-9 _ -")
    return ids[0]


def _field(msg: Mapping, name: str, kind: Any = None, optional: bool = False) -> Any:
    if name not in msg:
        if optional:
            return None
        raise BadRequest(f"missing field {name!r}")
    v = msg[name]
    if kind is not None and not isinstance(v, kind) and not (optional and v is None):
        raise BadRequest(
            f"field {name!r} must be {getattr(kind, '__name__', kind)}, got {type(v).__name__}"
        )
    return v


class _Commands:
    """Runs one command against the env (a mixin of the policy server, whose env, limits,
    health and sampler checks it uses)."""

    env: Any
    limits: Any  # the server's limits (max_episode_id_len among them)
    health: SamplerHealth
    _owned: bool
    _batches: Any  # the server's FairBatches
    _batch_ids: BatchIds
    _sequences: Any  # the server's Sequences

    def _check_sampler(self, command: str) -> None:
        raise NotImplementedError

    def _explain(self, e: BaseException) -> BaseException:
        raise NotImplementedError

    def _start_batch(self, conn: Any, body: bytes, owner: Any, query: str) -> None:
        """Starts a ``/batch`` request; one with a request id (``POST /batch?id=...``) runs
        once: a retry of it (same id, same body) gets the first answer (see
        :class:`~jaxsampler.serving.sequence.BatchIds`).

        Raises:
            HTTPError: 503 ``RequestInProgress`` (the same batch runs now), 409
                :class:`SequenceError` (the id came with another body), 400 (a bad id).
        """
        rid = _batch_id(query)
        if rid is None:
            self._batches.start(conn, body, owner)
            return
        key, ids = (owner, rid), self._batch_ids
        try:
            got = ids.begin(key, fingerprint("batch", body))
        except RequestInProgress as e:
            raise HTTPError(503, "RequestInProgress", str(e)) from None
        except SequenceError as e:
            raise HTTPError(409, SequenceError.__name__, e.reason) from None
        if got is not None:
            conn.respond(got.status, got.body, got.content_type)
            return

        def record(data: bytes | None) -> None:
            if data is None:
                ids.failed(key)
            else:
                ids.succeeded(key, Answer(200, data, CONTENT_TYPE))

        self._batches.start(conn, body, owner, record)

    def _sequence_report(self, owner: Any, query: str) -> dict:
        """``GET /sequence?episode_id=...``: this client's sequence numbers of a running
        episode, ``{"episode_id", "last", "next"}`` (``last``: the last number the server
        ran, ``next``: the one it expects; both ``None`` when the client sent no numbered
        command for it: any number starts the record).

        Raises:
            HTTPError: 503 ``RequestInProgress`` while a numbered command of it runs (ask
                again once it finished), 404 / 410 for an episode that is not running
                (unknown, or of an earlier server run), 400 without one ``episode_id``.
        """
        try:
            ids = parse_qs(query, max_num_fields=4).get("episode_id")
        except ValueError as e:
            raise BadRequest(f"malformed query string: {e}") from None
        if ids is None or len(ids) != 1:
            raise BadRequest("GET /sequence needs one episode_id (?episode_id=...)")
        eid = self._episode_id({"episode_id": ids[0]})
        if self.env.episode_status(eid) not in ("running", "finishing"):
            raise self._unknown(ext.UnknownEpisodeError(f"Episode {eid} is not running."), eid)
        state = self._sequences.state((owner, eid))
        if state is not None and state[1] is not None:
            raise HTTPError(
                503, "RequestInProgress", f"seq {state[1]} of this episode is still running"
            )
        last = None if state is None else state[0]
        return {"episode_id": eid, "last": last, "next": None if last is None else last + 1}

    def _agents(self, x: Any) -> Any:
        return x if self.env.multi_agent else {DEFAULT_AGENT_ID: x}

    def _as(self, owner: str | None) -> dict[str, Any]:
        """The ``owner`` keyword for env calls (none with an env that has no owners)."""
        return {"owner": owner} if self._owned else {}

    def _episode_id(self, msg: Mapping, optional: bool = False) -> Any:
        eid = _field(msg, "episode_id", str, optional=optional)
        if eid is not None and len(eid) > self.limits.max_episode_id_len:
            raise BadRequest(
                f"episode_id of {len(eid)} characters exceeds "
                f"max_episode_id_len={self.limits.max_episode_id_len}"
            )
        return eid

    def _run(self, command: str, msg: Mapping, owner: str | None, block: bool = True) -> dict:
        self._check_sampler(command)
        try:
            return self._run_command(command, msg, owner, block)
        except ext.EnvClosedError as e:  # fail() closed the env meanwhile
            raise self._explain(e) from None
        except ext.UnknownEpisodeError as e:
            raise self._unknown(e, msg.get("episode_id")) from None

    def _unknown(self, e: ext.UnknownEpisodeError, eid: Any) -> BaseException:
        """``e``, or the 410 for an id the env's journal knows from an earlier run (an
        episode the restart ended, not a typo)."""
        journal = getattr(self.env, "journal", None)
        if journal is not None and isinstance(eid, str) and journal.known(eid):
            return _restarted(
                f"episode {eid} belongs to a run before this server restarted; start a new episode"
            )
        return e

    def _run_command(self, command: str, msg: Mapping, owner: str | None, block: bool) -> dict:
        env, own = self.env, self._as(owner)
        if command == "start_episode":
            if _field(msg, "allow_reuse", bool, optional=True):
                own["allow_reuse"] = True  # only when asked: subclasses may not take it
            eid = env.start_episode(
                self._episode_id(msg, optional=True),
                bool(_field(msg, "training_enabled", bool, optional=True) is not False),
                **own,
            )
            return {"episode_id": eid}
        eid = self._episode_id(msg)
        if command == "log_action":
            info = _field(msg, "info", dict, optional=True)
            problem = self.health.problem() if block else None
            try:  # a stalled sampler makes no room: 503 rather than a wait for it
                env.submit(
                    eid,
                    self._agents(_field(msg, "observation")),
                    self._agents(_field(msg, "action")),
                    None if info is None else self._agents(info),
                    False,
                    block=block and problem is None,
                    **own,
                )
            except ext.WouldBlockError:
                if problem is None:
                    raise
                raise _unavailable(problem) from None
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
            raise BadRequest("get_action is not allowed here")
        return {}
