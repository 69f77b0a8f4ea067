"""The policy server's wire protocol, shared by :mod:`~jaxsampler.serving.server` and
:mod:`~jaxsampler.serving.client`: version, content type, command names, headers, the
table that maps env exceptions to HTTP statuses and back, and (below) the endpoints.

Protocol (version 2)
--------------------
HTTP/1.1 with keep-alive, parsed by ``httptools`` (llhttp, Node.js's parser) on both ends
(the client keeps one socket per thread). Bodies are msgpack (``Content-Type:
application/msgpack``) encoded with :func:`jaxsampler.episodes.codec.packb`: numpy arrays
travel as raw bytes plus dtype and shape (msgpack ext type 1), numpy scalars as type 2,
tuples as type 3. Plain lists and numbers work too; the server validates every observation
/ action against the env's spaces and casts it to the space's dtype.

====================  ===================================================  ==================
endpoint              request body                                         200 response body
====================  ===================================================  ==================
POST /start_episode   ``{episode_id: str|nil, training_enabled: bool,      ``{episode_id}``
                      allow_reuse?, seq?: 0, nonce?}``
POST /get_action      ``{episode_id, observation, seq?}``                  ``{action}``
POST /log_action      ``{episode_id, observation, action, info?, seq?}``   ``{}``
POST /log_returns     ``{episode_id, reward, info?, done?, seq?}``         ``{}``
POST /end_episode     ``{episode_id, observation, truncated?, seq?}``      ``{}``
POST /batch           ``{commands: [{command: <name>, ...fields}, ...]}``  ``{done: n, errors}``
GET  /weights         header ``If-None-Match: "<version>"`` optional       ``{version, params}``
GET  /info            --                                                   ``{protocol,
                                                                           multi_agent,
                                                                           agent_ids,
                                                                           weights_version,
                                                                           observation_space,
                                                                           action_space,
                                                                           observation_spaces,
                                                                           action_spaces}``
GET  /health          --                                                   JSON ``{status,
                                                                           since_last_poll_s,
                                                                           reason, ...}``
====================  ===================================================  ==================

``/info``'s ``observation_spaces`` / ``action_spaces`` are ``agent id -> space`` for a
multi-agent env whose agents have their own spaces (its ``observation_space`` /
``action_space`` are then null), else null.

Any POST body may carry ``returns: [{episode_id, reward, info?, done?}, ...]``: those
``log_returns`` calls run first, in order; if one fails, the command is not run and its
error is the answer (message prefixed ``deferred log_returns``). This is how a remote
:class:`~jaxsampler.serving.client.PolicyClient` sends ``log_returns`` without a round
trip of its own (version 2; version 1 had no such field).

Restarts and retries. Every answer (errors, ``/health`` and ``/info`` included) carries
``X-Server-Epoch: <16 hex digits>``, drawn at random by each
:class:`~jaxsampler.serving.server.PolicyServer`. A request may send back the epoch it
believes in; one that names episodes (any command but a ``start_episode`` without
``returns``, and every ``/batch``) with another epoch gets 410
:class:`ServerRestartedError`: the server restarted and those episodes are gone. So does a
command naming an id the env's journal knows from an earlier run (without a journal an
unknown id is 404). ``start_episode`` takes ``allow_reuse: true`` to start an id that
finished in this run again (never one a journal knows). Any command of an episode may
carry ``seq`` (``start_episode``: 0 and an ``episode_id``; then 1, 2, ... per episode; a
number is used up by a success only): a repeat of the last successful number with the same
bytes gets the recorded answer again without running anything, the number running now 503
``RequestInProgress``, and a gap, an older number or a used one with other bytes 409
:class:`SequenceError` (see :mod:`~jaxsampler.serving.sequence`). Commands without ``seq``
run as always. A request whose connection closed before it ran is dropped (pipelined ones,
big bodies decoded on a worker, a ``/batch`` before its first slice); not covered: a
``log_action`` already waiting for room (it runs once there is room; its answer is
recorded for a retry), and a ``get_action`` whose connection closes while it waits (a
numbered one keeps waiting and its answer is recorded for the retry, which rejoins the
wait; an unnumbered one abandons its episode, as before).

Multi-agent envs take dicts ``agent -> value`` for ``observation``, ``action``,
``reward``, ``info`` and ``done`` (``multiagent_done_dict``). ``/batch`` runs the
non-blocking commands (:data:`BATCHABLE_COMMANDS`: not ``get_action``) in order; a refused
command does not stop the others and is reported in ``errors`` (``[{index, status, error,
message}]``); it is how local-inference clients ship experience (see
:mod:`~jaxsampler.serving.batching` for how the server schedules it). ``/weights`` answers
``304`` when the client's version is current and ``404`` before
:meth:`~jaxsampler.serving.server.PolicyServer.set_weights`. ``/health`` reports the
sampler behind the server (``"ok"``, ``"stalled"``: no poll for ``sampler_timeout_s``, or
``"failed"``) as JSON, 200 when ok and 503 otherwise; it never waits for the sampler and,
like every path, needs the token when the server has one.

Errors have a JSON body ``{"error": <exception name>, "message": str}``:
400 malformed body / bad data (wrong shape, unknown agent, missing field, episode id too
long, bad ``X-Client-Id``), 401 no or wrong token (with ``WWW-Authenticate: Bearer``), 404
unknown episode (or another client's) or path, 405 wrong method, 408 request not received
within ``request_timeout_s``, 409 wrong episode state (already started, completed,
abandoned, a get_action still waiting; error ``EpisodeStateError``) or a bad ``seq``
(``SequenceError``), 410 an episode of an earlier server run (``ServerRestartedError``),
411 no ``Content-Length``, 413 body over
``max_body_bytes`` (the connection is closed without reading it) or too many commands
(``max_batch_commands``, also for deferred ``returns``), 414 URL too long, 431 too many or
too large headers, 503 capacity (connections, episodes, the client's quota) or closed, or
the sampler stalled or failed (error ``ServerUnavailableError``, its message the reason;
the client raises :class:`ServerUnavailableError`) or a numbered request still running
(``RequestInProgress``: retry), 504
no action within the env's ``action_timeout_s``, 500 anything unexpected. The limits behind
them are :class:`~jaxsampler.serving.server.PolicyServer` options (see
:mod:`~jaxsampler.serving.http` for the connection-level ones); errors found while reading
a request close the connection after the answer, and the server keeps serving after every
error.

Local inference: ``PolicyClient(inference_mode="local", policy=...)`` pulls the params
every ``update_interval`` seconds, computes actions with one jitted call per
``get_action`` and ships each step as ``log_action`` with ``info[CLIENT_POLICY_INFO] =
{"weights_version", "extra_model_outputs"}`` (batched in the background through
``/batch``): the server's sampler records the client's action (``off_policy_actions``)
with the behaviour policy's version and logp.

Security
--------
Threat model. The server binds loopback by default. Without a ``token`` any local user (any
process that can reach the port) can act as a client: start episodes, inject experience,
read ``/weights`` and ``/info``. With ``token`` every request must carry ``Authorization:
Bearer <token>`` (compared in constant time) or gets 401 and the connection closes; without
TLS the token and all data cross the network in clear, so anything beyond loopback should
use ``token`` and ``ssl_context`` together (the client: an ``https://`` address). Clients
name themselves with an ``X-Client-Id`` header (random per
:class:`~jaxsampler.serving.client.PolicyClient`): the server runs each call as that owner,
so a client cannot see or touch another client's episodes (404, as if unknown), and the
env's per-owner quota (``max_episodes_per_owner``) applies; requests without the header
share one anonymous owner (so header-less clients can touch each other's episodes). Client
ids are self-asserted, not credentials: they keep well-behaved clients apart (a bug in one
cannot end another's episodes, and another's episode ids are useless without its client
id), but a hostile token holder can claim any id it has seen, and can rotate ids to get
around the per-owner quota; then only ``max_concurrent_episodes`` and
``episode_timeout_s`` bound it (an episode it keeps alive with calls is not reaped). Ids of
episodes started without one are made by the env (``uuid4``, from ``os.urandom``). An
authenticated but hostile client can still use its share of the server: it is bounded by
the limits (memory and time per request and per connection, connection count; see
:mod:`~jaxsampler.serving.http`), the env's quotas and timeouts
(``max_concurrent_episodes``, ``max_episodes_per_owner``, ``episode_timeout_s``,
``max_queued_steps``), and what its data does to training (it can send any in-space
observations, rewards and actions). Bodies over 64 KiB are decoded on a worker thread, so
one big request slows, but does not stop, the others; a body of plain msgpack numbers
decodes to about 8x its size in Python objects (``max_body_bytes`` bounds it).
"""

from __future__ import annotations

from jaxsampler.host_envs import external as ext

__all__ = [
    "AUTH_SCHEME",
    "BATCHABLE_COMMANDS",
    "CLIENT_ID_HEADER",
    "CLIENT_ID_PATTERN",
    "COMMANDS",
    "CONTENT_TYPE",
    "EPOCH_HEADER",
    "ERRORS_BY_NAME",
    "PROTOCOL_VERSION",
    "STATUS_OF_ERROR",
    "PolicyServerError",
    "SequenceError",
    "ServerRestartedError",
    "ServerUnavailableError",
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
#: Header naming the server's run (random per :class:`~jaxsampler.serving.server.PolicyServer`
#: instance): on every answer, and on requests, the run the client last heard from.
EPOCH_HEADER = "X-Server-Epoch"


class PolicyServerError(RuntimeError):
    """An HTTP error from the server that maps to no env exception."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class ServerUnavailableError(PolicyServerError):
    """503 from a server whose sampler cannot answer: it stopped polling for
    ``sampler_timeout_s`` or was reported failed. ``reason`` is the server's sentence
    (how long since the last poll, or the failure's ``repr``)."""

    def __init__(self, reason: str):
        super().__init__(503, f"{type(self).__name__}: {reason}")
        self.reason = reason


class ServerRestartedError(PolicyServerError):
    """410: the server restarted since the client last heard from it (its ``X-Server-Epoch``
    changed), so the episodes this call names are gone; or the episode id belongs to a run
    before the restart (the env's journal knows it). Recovery: start new episodes. The
    client has adopted the new epoch when it raises this, so :meth:`start_episode` works."""

    def __init__(self, message: str):
        super().__init__(410, f"{type(self).__name__}: {message}")
        self.reason = message


class SequenceError(PolicyServerError):
    """409: a command's ``seq`` does not follow the episode's last one (a gap, an old
    number), or a number already used came with a different command. It means two callers
    drive one episode, or a client bug; retrying does not help."""

    def __init__(self, message: str):
        super().__init__(409, f"{type(self).__name__}: {message}")
        self.reason = message


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
