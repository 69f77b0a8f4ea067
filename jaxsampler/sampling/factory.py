"""Which member of the sampler family ``js.Sampler(env, ...)`` builds, decided once from the env."""

from __future__ import annotations

import inspect
import sys
from typing import TYPE_CHECKING, Any

from jaxsampler.envs.base import Env
from jaxsampler.host_envs import GymnasiumHostEnv, GymnasiumVectorHostEnv, HostEnv, make_gym
from jaxsampler.host_envs.base import check_host_env

if TYPE_CHECKING:  # base imports this module when a Sampler is built
    from jaxsampler.sampling.base import Sampler

__all__ = ["as_host_env", "build_sampler"]

_SIGNATURE = inspect.Signature(
    [
        inspect.Parameter("env", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("policy", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("num_envs", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
        inspect.Parameter("rollout_length", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=128),
        inspect.Parameter("seed", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=0),
        inspect.Parameter("transforms", inspect.Parameter.KEYWORD_ONLY, default=None),
        inspect.Parameter("explore", inspect.Parameter.KEYWORD_ONLY, default=True),
        inspect.Parameter("devices", inspect.Parameter.KEYWORD_ONLY, default=None),
        inspect.Parameter("mesh", inspect.Parameter.KEYWORD_ONLY, default=None),
        inspect.Parameter("options", inspect.Parameter.VAR_KEYWORD),
    ]
)


def _is_gymnasium_vector_env(env: Any) -> bool:
    """A Gymnasium vector env, wrapped or not (Gymnasium itself stays an optional import)."""
    gymnasium = sys.modules.get("gymnasium")
    return gymnasium is not None and isinstance(env, gymnasium.vector.VectorEnv)


def as_host_env(env: Any, num_envs: int | None, seed: int) -> HostEnv | None:
    """``env`` as a :class:`HostEnv` if it is host-stepped (a HostEnv, a Gymnasium env or
    vector env, a list of envs or factories, or ``"gym:<id>"``), else ``None``.

    Raises:
        TypeError: ``env`` looks like a host env (it has ``poll`` or ``send_actions``) but
            is not a complete :class:`HostEnv`; the message names what it lacks.
    """
    if isinstance(env, HostEnv) or hasattr(env, "poll") or hasattr(env, "send_actions"):
        return check_host_env(env)
    if _is_gymnasium_vector_env(env):
        return GymnasiumVectorHostEnv(env, seed=seed)
    if isinstance(env, str) and env.startswith("gym:"):
        return make_gym(env[len("gym:") :], num_envs, seed=seed)
    if isinstance(env, (list, tuple)) or (
        not isinstance(env, (Env, str))
        and hasattr(env, "step")
        and hasattr(env, "reset")
        and type(env).__module__.split(".")[0] not in ("jaxsampler", "gymnax")
    ):
        return GymnasiumHostEnv(env if isinstance(env, (list, tuple)) else [env], seed=seed)
    return None


def build_sampler(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Sampler:
    """``Sampler(*args, **kwargs)``: the member that fits the env, built. A host env that
    this function made itself (from ``"gym:<id>"``, Gymnasium envs or factories) is closed
    again if the sampler cannot be built, so no sub-env process or thread is left behind."""
    from jaxsampler.sampling.device import DeviceSampler
    from jaxsampler.sampling.host import HostSampler

    try:
        bound = _SIGNATURE.bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"Sampler{_SIGNATURE}: {e}") from None
    a = bound.arguments
    options = dict(a.get("options", {}))
    seed = a.get("seed", 0)
    num_envs = a.get("num_envs")
    options["transforms"] = a.get("transforms")
    options["explore"] = a.get("explore", True)
    devices, mesh = a.get("devices"), a.get("mesh")
    host = as_host_env(a["env"], num_envs, seed)
    if host is None:
        options["devices"], options["mesh"] = devices, mesh
        if num_envs is not None:
            options["num_envs"] = num_envs
        options.setdefault("rollout_length", a.get("rollout_length", 128))
        return DeviceSampler(a["env"], a["policy"], seed=seed, **options)
    made_here = host is not a["env"]
    try:
        if devices is not None or mesh is not None:
            raise ValueError(
                f"devices= / mesh= split the env axis of a pure-JAX env over devices; "
                f"{type(host).__name__} steps its envs on the host (its policy runs on the "
                "default device): drop devices= / mesh=, or use a pure-JAX env (a "
                "jaxsampler Env or a registered id such as 'CartPole-v1')"
            )
        if options.pop("env_params", None) is not None:
            raise ValueError(
                "env_params are for pure-JAX envs; configure a host-stepped env directly"
            )
        if num_envs is not None and host.num_envs != num_envs:
            raise ValueError(f"num_envs={num_envs} but the host env has {host.num_envs} sub-envs")
        rollout_length = a.get("rollout_length", 128)
        return HostSampler(host, a["policy"], seed=seed, rollout_length=rollout_length, **options)
    except BaseException:
        if made_here:
            host.close()
        raise
