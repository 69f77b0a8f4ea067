"""Env registry: a dict from id to factory, plus ``make(name, **kwargs)``.

Ids of the form ``"gymnax:<gymnax id>"`` build the gymnax env of that id and wrap it
with :class:`jaxsampler.envs.adapters.gymnax.GymnaxEnv`.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from typing import Any

from jaxsampler.env import Env

__all__ = ["REGISTRY", "make", "register", "registered_ids"]


def _lazy(path: str) -> Callable[..., Env]:
    module, attr = path.split(":")

    def factory(**kwargs: Any) -> Env:
        return getattr(importlib.import_module(module), attr)(**kwargs)

    factory.__qualname__ = f"factory[{path}]"
    return factory


#: Built-in env ids and their factories (keyword arguments go to the env's constructor).
REGISTRY: dict[str, Callable[..., Env]] = {
    "CartPole-v1": _lazy("jaxsampler.envs.cartpole:CartPole"),
    "Pendulum-v1": _lazy("jaxsampler.envs.pendulum:Pendulum"),
    "MountainCar-v0": _lazy("jaxsampler.envs.mountain_car:MountainCar"),
    "MountainCarContinuous-v0": _lazy("jaxsampler.envs.mountain_car_continuous:MountainCarContinuous"),
    "Acrobot-v1": _lazy("jaxsampler.envs.acrobot:Acrobot"),
    # Multi-agent (agent axis A = n): cooperative particle spread, all agents act each step.
    "Spread-v0": _lazy("jaxsampler.envs.spread:Spread"),
    # Multi-agent, turn-based (A = 2): exactly one agent acts per step, the acting mask alternates.
    "TicTacToe-v0": _lazy("jaxsampler.envs.tictactoe:TicTacToe"),
    # Multi-agent (A = n): each agent terminates on its own when it reaches its goal; the rest go on.
    "Goals-v0": _lazy("jaxsampler.envs.goals:Goals"),
}


def register(env_id: str, factory: Callable[..., Env], *, overwrite: bool = False) -> None:
    """Adds ``env_id`` to the registry. Raises ``ValueError`` if it exists (unless ``overwrite``)."""
    if env_id in REGISTRY and not overwrite:
        raise ValueError(f"env id {env_id!r} is already registered")
    if env_id.startswith("gymnax:"):
        raise ValueError("ids starting with 'gymnax:' are reserved for the gymnax adapter")
    REGISTRY[env_id] = factory


def registered_ids() -> list[str]:
    """The built-in and user-registered env ids (gymnax ids not included)."""
    return sorted(REGISTRY)


def make(name: str, **kwargs: Any) -> Env:
    """Builds the env registered as ``name``.

    Args:
        name: a registered id (``registered_ids()``), or ``"gymnax:<id>"`` for any gymnax
            env (``gymnax.registered_envs``).
        **kwargs: passed to the env's constructor (for gymnax ids: to ``gymnax.make``).

    Raises:
        ValueError: unknown id; the message lists close matches.
    """
    if not isinstance(name, str):
        raise TypeError(f"make: env id must be a str, got {type(name).__name__}")
    if name.startswith("gymnax:"):
        from jaxsampler.envs.adapters.gymnax import make_gymnax

        return make_gymnax(name[len("gymnax:"):], **kwargs)
    if name not in REGISTRY:
        close = difflib.get_close_matches(name, list(REGISTRY), n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(
            f"unknown env id {name!r}.{hint} Registered: {', '.join(registered_ids())}; "
            "gymnax envs via 'gymnax:<id>'."
        )
    return REGISTRY[name](**kwargs)
