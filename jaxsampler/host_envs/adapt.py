"""Which env objects are host-stepped, and the :class:`HostEnv` each one becomes: one place
that knows, so the samplers need not (``js.Sampler`` asks it which member to build)."""

from __future__ import annotations

import sys
from typing import Any

from jaxsampler.envs import registry
from jaxsampler.envs.base import Env
from jaxsampler.host_envs.base import HostEnv, check_host_env
from jaxsampler.host_envs.gymnasium_envs import GymnasiumHostEnv
from jaxsampler.host_envs.gymnasium_vector import GymnasiumVectorHostEnv

__all__ = ["as_host_env", "is_host_stepped"]

#: Modules whose env objects are never Gymnasium envs, whatever methods they have.
_PURE_JAX_MODULES = ("jaxsampler", "gymnax")


def _is_gymnasium_vector_env(env: Any) -> bool:
    """A Gymnasium vector env, wrapped or not (Gymnasium itself stays an optional import)."""
    gymnasium = sys.modules.get("gymnasium")
    return gymnasium is not None and isinstance(env, gymnasium.vector.VectorEnv)


def _kind(env: Any) -> str | None:
    """``"host"``, ``"vector"``, ``"kind_id"`` (an id of a kind the registry resolves to a
    host env, such as ``"gym:<id>"``), ``"gymnasium"`` (one env, or a list of envs or
    factories), or ``None``: not host-stepped."""
    if isinstance(env, HostEnv) or hasattr(env, "poll") or hasattr(env, "send_actions"):
        return "host"
    if _is_gymnasium_vector_env(env):
        return "vector"
    if isinstance(env, str) and ":" in env and env.partition(":")[0] in registry.KINDS:
        return "kind_id"
    if isinstance(env, (list, tuple)) or (
        not isinstance(env, (Env, str))
        and hasattr(env, "step")
        and hasattr(env, "reset")
        and type(env).__module__.split(".")[0] not in _PURE_JAX_MODULES
    ):
        return "gymnasium"
    return None


def is_host_stepped(env: Any) -> bool:
    """Whether ``env`` is stepped on the host: a :class:`HostEnv` (or anything with
    ``poll`` / ``send_actions``), a Gymnasium env or vector env, a list of Gymnasium envs
    or factories, or a ``"gym:<id>"`` string. Builds nothing."""
    return _kind(env) is not None


def as_host_env(env: Any, num_envs: int | None, seed: int) -> HostEnv | None:
    """``env`` as a :class:`HostEnv` if it is host-stepped (:func:`is_host_stepped`), else
    ``None``. A HostEnv is returned itself; Gymnasium envs, vector envs, lists and
    ``"gym:<id>"`` (built by the registry's kind, :func:`~jaxsampler.host_envs.make_gym`,
    with ``num_envs``) are wrapped in a new host env seeded with ``seed``, which the caller
    then owns and closes.

    Raises:
        TypeError: ``env`` looks like a host env (it has ``poll`` or ``send_actions``) but
            is not a complete :class:`HostEnv`; the message names what it lacks.
    """
    kind = _kind(env)
    if kind == "host":
        return check_host_env(env)
    if kind == "vector":
        return GymnasiumVectorHostEnv(env, seed=seed)
    if kind == "kind_id":
        return registry.make(env, num_envs=num_envs, seed=seed)
    if kind == "gymnasium":
        return GymnasiumHostEnv(env if isinstance(env, (list, tuple)) else [env], seed=seed)
    return None
