"""The errors of external envs, raised in the simulator's (or the server's) thread, and the
bounded reprs their messages quote what a client sent with."""

from __future__ import annotations

import reprlib
from typing import Any

__all__ = [
    "CapacityError",
    "EnvClosedError",
    "EpisodeStateError",
    "ExternalEnvError",
    "InvalidDataError",
    "UnknownEpisodeError",
    "WouldBlockError",
]


class ExternalEnvError(ValueError):
    """Base of the errors raised in the simulator's thread (a ``ValueError``, as in RLlib)."""


class UnknownEpisodeError(ExternalEnvError):
    """The episode id was never started (or is too old to be remembered)."""


class EpisodeStateError(ExternalEnvError):
    """The call does not fit the episode's state: already started, already completed or
    abandoned, or another call of the same episode is still waiting."""


class InvalidDataError(ExternalEnvError):
    """An observation, action or reward does not match the spaces / expected types."""


class WouldBlockError(ExternalEnvError):
    """A non-blocking ``log_action`` found the episode's queue full (back pressure); the
    call changed nothing and may be retried where blocking is allowed."""


class CapacityError(ExternalEnvError):
    """``max_concurrent_episodes`` episodes are already running, or the caller's owner
    already runs ``max_episodes_per_owner``; the message names the bound."""


class EnvClosedError(RuntimeError):
    """The env was closed."""


# Bounded reprs for error messages: whatever a client sends (a megabyte string, a dict of
# 10,000 keys, deep nesting), the message stays short and costs little to build.
_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlevel = 60, 60, 3


def _short(x: Any) -> str:
    s = _REPR.repr(x)
    return s if len(s) <= 80 else s[:77] + "..."


def _short_id(eid: Any) -> str:
    return eid if isinstance(eid, str) and len(eid) <= 140 else _short(eid)


def _not_found(eid: Any) -> str:
    return f"Episode {_short_id(eid)} not found."
