"""A policy-server connection (:class:`PolicyConnection`): an HTTP connection
(:mod:`~jaxsampler.serving.http`) that may hold one ``get_action`` waiting for the sampler,
reports how its clients come and go, and records the answers of numbered requests for
retries (:mod:`~jaxsampler.serving.sequence`). The server that uses it is
:class:`~jaxsampler.serving.server.PolicyServer`."""

from __future__ import annotations

from typing import Any

from jaxsampler.host_envs import external as ext
from jaxsampler.serving.http import Connection, HTTPError
from jaxsampler.serving.protocol import CONTENT_TYPE, ServerUnavailableError
from jaxsampler.serving.sequence import Answer

__all__ = ["PolicyConnection", "unavailable"]


def unavailable(reason: str) -> HTTPError:
    """The 503 answer for a sampler that cannot serve (``reason``: why)."""
    return HTTPError(503, ServerUnavailableError.__name__, reason)


class PolicyConnection(Connection):
    """A policy-server connection: it may hold one ``get_action`` waiting for the sampler.
    It reports its clients and how it closed (``client_gone_grace_s``)."""

    #: the :class:`~jaxsampler.serving.server.PolicyServer` (not imported: it imports this)
    server: Any

    def __init__(self, server: Any, refuse: bool = False):
        super().__init__(server, refuse)
        self.waiting: tuple[str, ext.Waiter] | None = (
            None  # (episode id, waiter) of a pending get_action
        )
        #: why the pending get_action was given up (its answer), once it was
        self.expired: BaseException | None = None
        self.deadline = 0.0  # when the pending get_action times out
        self.peer_closed = False  # the peer closed its side (EOF) or the connection broke
        #: ``(episode key, seq, command)`` of the numbered request being answered: its
        #: answer is recorded for retries (see :mod:`~jaxsampler.serving.sequence`)
        self.ticket: tuple[tuple[str, str], int, str] | None = None
        #: the ``[connection, episode id, waiter]`` its pending get_action's answer is
        #: delivered by (a retry that rejoins the wait points it at its own connection)
        self.entry: list | None = None

    def respond(
        self,
        status: int,
        body: bytes,
        content_type: str = CONTENT_TYPE,
        extra: str = "",
        close: bool = False,
    ) -> None:
        """As :meth:`Connection.respond`; a numbered request's success is recorded first
        (a retry gets it again, even when this connection is gone), its failure frees its
        number."""
        self.end_ticket(status, body, content_type)
        super().respond(status, body, content_type, extra, close)

    def end_ticket(self, status: int, body: bytes = b"", content_type: str = "") -> None:
        """Ends the numbered request being answered with this answer (see :attr:`ticket`)."""
        ticket, self.ticket = self.ticket, None
        if ticket is None:
            return
        key, seq, command = ticket
        book = self.server._sequences
        if 200 <= status < 300:
            book.succeeded(key, seq, Answer(status, body, content_type))
            if command == "end_episode":
                book.ended(key)
        else:
            book.failed(key, seq)

    def on_message_complete(self) -> None:
        """As :meth:`Connection.on_message_complete`; an accepted request's client counts as
        present while this connection is open."""
        req = self.req
        if req is not None and req.error is None:
            self.server._client_seen(self, req.client_id)
        super().on_message_complete()

    def eof_received(self) -> bool | None:
        """The peer closed its side: the client went away (unless the server closed first)."""
        self.peer_closed = True
        return super().eof_received()

    def shift_deadlines(self, pause: float) -> None:
        """The process did not run for ``pause`` s: the pending get_action's deadline moves on
        (see :func:`~jaxsampler.serving.listener.shift_deadlines`)."""
        self.deadline += pause

    def connection_lost(self, exc: Exception | None) -> None:
        """The connection closed: a ``get_action`` still waiting on it gives up (its episode
        is abandoned), unless it is numbered (``seq``): a client that numbers its requests
        retries, so the wait goes on and its answer is recorded for the retry (a client
        that never comes back loses the episode after ``client_gone_grace_s``). A client
        whose last connection its peer closed gets ``client_gone_grace_s`` to come back."""
        by_peer = not self.closing and (self.peer_closed or exc is not None)
        super().connection_lost(exc)
        self.server._connection_closed(self, by_peer)
        if self.waiting is not None and self.ticket is None:  # gone, and will not retry
            eid, waiter = self.waiting
            self.server.env.expire_waiter(eid, waiter, "client disconnected")
        elif self.waiting is not None:  # its timeout and stall checks still run
            self.server._lingering.add(self)

    def check_timeouts(self, now: float) -> None:
        """A waiting ``get_action`` past its deadline times out, and one whose sampler stalled
        or failed is given up with 503 (one sweep instead of a timer per call); else the
        HTTP deadlines (:meth:`Connection.check_timeouts`)."""
        lingering = self in self.server._lingering  # closed: only its wait is checked
        if lingering and self.waiting is None:
            self.server._lingering.discard(self)
            return
        problem = None if self.waiting is None else self.server.health.problem()
        if self.waiting is not None and problem is not None:
            self.server._expire(self, self.waiting[0], unavailable(problem))
        elif self.waiting is not None and now >= self.deadline:
            timeout, eid = self.server.env.action_timeout_s, self.waiting[0]
            self.server._expire(
                self,
                eid,
                TimeoutError(f"episode {eid}: no action within {timeout} s; episode abandoned"),
            )
        elif not lingering:
            super().check_timeouts(now)

    def exception(self, e: BaseException) -> None:
        """As :meth:`Connection.exception`, but the env's "closed" error after a reported
        sampler failure answers with that failure (503 with its reason)."""
        super().exception(self.server._explain(e))
