"""The policy server's wire protocol, shared by :mod:`~jaxsampler.serving.server` and
:mod:`~jaxsampler.serving.client`: version, content type, command names, and the table
that maps env exceptions to HTTP statuses and back (the endpoints and bodies are
documented in :mod:`jaxsampler.serving.server`)."""

from __future__ import annotations

from jaxsampler.host_envs import external as ext

__all__ = [
    "AUTH_SCHEME",
    "BATCHABLE_COMMANDS",
    "CLIENT_ID_HEADER",
    "CLIENT_ID_PATTERN",
    "COMMANDS",
    "CONTENT_TYPE",
    "ERRORS_BY_NAME",
    "PROTOCOL_VERSION",
    "STATUS_OF_ERROR",
    "PolicyServerError",
]

PROTOCOL_VERSION = 2
#: Bodies are msgpack, encoded with :func:`jaxsampler.episodes.codec.packb`.
CONTENT_TYPE = "application/msgpack"
COMMANDS = ("start_episode", "get_action", "log_action", "log_returns", "end_episode")
#: The commands ``/batch`` runs (every command that never waits for the sampler).
BATCHABLE_COMMANDS = ("start_episode", "log_action", "log_returns", "end_episode")
#: Request header naming the client (random per :class:`~jaxsampler.serving.client.PolicyClient`):
#: the server runs its calls as that owner, so one client cannot touch another's episodes.
CLIENT_ID_HEADER = "X-Client-Id"
#: What a client id may look like (PolicyClient sends 32 hex digits).
CLIENT_ID_PATTERN = r"[A-Za-z0-9._~-]{1,64}"
#: ``Authorization: Bearer <token>`` when the server has a token.
AUTH_SCHEME = "Bearer"


class PolicyServerError(RuntimeError):
    """An HTTP error from the server that maps to no env exception."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


#: ``(exception class, HTTP status)``, most specific first; the server answers the first match.
STATUS_OF_ERROR: list[tuple[type, int]] = [
    (ext.UnknownEpisodeError, 404),
    (ext.EpisodeStateError, 409),
    (ext.CapacityError, 503),
    (ext.EnvClosedError, 503),
    (TimeoutError, 504),
    (ValueError, 400),  # InvalidDataError, bad requests, malformed msgpack
]
#: Error names the server sends back that the client raises as the same exception class.
ERRORS_BY_NAME: dict[str, type[Exception]] = {
    c.__name__: c
    for c in (
        ext.UnknownEpisodeError,
        ext.EpisodeStateError,
        ext.InvalidDataError,
        ext.CapacityError,
        ext.EnvClosedError,
        TimeoutError,
    )
}
