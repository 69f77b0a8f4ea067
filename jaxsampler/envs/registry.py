"""Env registry: a dict from id to factory, plus ``make(name, **kwargs)``.

The kinds of id it resolves:

- a registered id (:data:`REGISTRY`): the built-in pure-JAX envs and the user's own;
- ``"<suite>:<id>"``: an env of a JAX env suite wrapped by that suite's adapter
  (:data:`SUITES`: ``gymnax``, ``brax``, ``jumanji``, ``pgx``, ``jaxmarl``; each but gymnax
  is an optional extra, e.g. ``pip install -e ".[brax]"``);
- ``"<kind>:<id>"`` for a kind a higher layer adds with :func:`register_kind`:
  :mod:`jaxsampler.host_envs` adds ``"gym"`` (host-stepped Gymnasium envs, the same ones
  ``js.Sampler("gym:<id>")`` samples from). The registry itself never imports a higher layer.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from typing import Any

from jaxsampler.envs.base import Env

__all__ = [
    "KINDS",
    "REGISTRY",
    "SUITES",
    "make",
    "make_jax_env",
    "register",
    "register_kind",
    "registered_ids",
]


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
    "MountainCarContinuous-v0": _lazy(
        "jaxsampler.envs.mountain_car_continuous:MountainCarContinuous"
    ),
    "Acrobot-v1": _lazy("jaxsampler.envs.acrobot:Acrobot"),
    # A new random maze per episode: an expensive reset (search + BFS) and a cheap step.
    "ProcMaze-v0": _lazy("jaxsampler.envs.procmaze:ProcMaze"),
    # Multi-agent (agent axis A = n): cooperative particle spread, all agents act each step.
    "Spread-v0": _lazy("jaxsampler.envs.spread:Spread"),
    # Multi-agent, turn-based (A = 2): exactly one agent acts per step, the acting mask alternates.
    "TicTacToe-v0": _lazy("jaxsampler.envs.tictactoe:TicTacToe"),
    # Multi-agent (A = n): each agent terminates on its own at its goal; the rest go on.
    "Goals-v0": _lazy("jaxsampler.envs.goals:Goals"),
    # Multi-agent with two agent groups of their own spaces (A = n_predators + 1): predators
    # (Discrete(5), 4 observed values) chase a faster prey (Discrete(9), 2 + 2n values).
    "PredatorPrey-v0": _lazy("jaxsampler.envs.predator_prey:PredatorPrey"),
}


#: ``js.make("<suite>:<id>")`` prefixes and the adapter's ``make_<suite>(id, **kwargs)``
#: (imported on first use, so a suite that is not installed costs nothing until named).
SUITES: dict[str, str] = {
    "gymnax": "jaxsampler.envs.adapters.gymnax:make_gymnax",
    "brax": "jaxsampler.envs.adapters.brax:make_brax",
    "jumanji": "jaxsampler.envs.adapters.jumanji:make_jumanji",
    "pgx": "jaxsampler.envs.adapters.pgx:make_pgx",
    "jaxmarl": "jaxsampler.envs.adapters.jaxmarl:make_jaxmarl",
}

#: ``"<kind>:<id>"`` prefixes that higher layers add (:func:`register_kind`), each with its
#: ``factory(id, **kwargs)``: ``"gym"`` once :mod:`jaxsampler.host_envs` is imported (which
#: ``import jaxsampler`` does).
KINDS: dict[str, Callable[..., Any]] = {}

#: Prefixes no registered id may start with (``"gym:"`` before its kind is added, too).
_RESERVED = tuple(f"{suite}:" for suite in SUITES) + ("gym:",)


def register_kind(prefix: str, factory: Callable[..., Any]) -> None:
    """Lets :func:`make` resolve ``"<prefix>:<id>"`` with ``factory(id, **kwargs)``.

    For env kinds that live above the envs row (host-stepped envs), so the registry names
    every env without importing them.

    Raises:
        ValueError: ``prefix`` is a suite's, or contains ``":"``.
    """
    if prefix in SUITES or ":" in prefix:
        raise ValueError(f"env kind prefix {prefix!r}: a suite's prefix or contains ':'")
    KINDS[prefix] = factory


def register(env_id: str, factory: Callable[..., Env], *, overwrite: bool = False) -> None:
    """Adds ``env_id`` to the registry.

    Raises:
        ValueError: ``env_id`` exists (unless ``overwrite``) or has a reserved prefix.
    """
    if env_id in REGISTRY and not overwrite:
        raise ValueError(f"env id {env_id!r} is already registered")
    if env_id.startswith(_RESERVED):
        raise ValueError(
            f"env id {env_id!r}: ids starting with {', '.join(map(repr, _RESERVED))} are "
            "reserved for the env-suite and Gymnasium adapters"
        )
    REGISTRY[env_id] = factory


def registered_ids() -> list[str]:
    """The built-in and user-registered env ids (gymnax ids not included)."""
    return sorted(REGISTRY)


def make(name: str, **kwargs: Any) -> Any:
    """Builds the env registered as ``name``.

    Args:
        name: a registered id (``registered_ids()``); ``"<suite>:<id>"`` for an env of a
            JAX suite: ``"gymnax:<id>"`` (``gymnax.registered_envs``), ``"brax:<name>"``,
            ``"jumanji:<id>"``, ``"pgx:<id>"``, ``"jaxmarl:<id>"``; or ``"gym:<id>"`` for a
            Gymnasium env, stepped on the host (a kind :mod:`jaxsampler.host_envs` adds).
        **kwargs: passed to the env's constructor (for suite ids: to the suite's adapter
            ``make_<suite>``, e.g. :func:`jaxsampler.envs.adapters.gymnax.make_gymnax`; for
            Gymnasium ids: ``num_envs`` (default 1), ``seed``, ``num_threads`` and the
            failure options ``on_env_error``, ``max_env_restarts``, ``step_timeout_s``,
            ``max_abandoned_threads``, ``check_observations`` go to
            :class:`~jaxsampler.host_envs.GymnasiumHostEnv`, the rest to ``gymnasium.make``).

    Returns:
        An :class:`~jaxsampler.envs.base.Env`, or for ``"gym:<id>"`` a
        :class:`~jaxsampler.host_envs.HostEnv`.

    Raises:
        ValueError: unknown id; the message lists close matches (for suite ids: the
            suite's ids).
        ImportError: a suite id whose package is not installed; the message gives the
            ``pip install -e ".[<suite>]"`` command.
    """
    if not isinstance(name, str):
        raise TypeError(f"make: env id must be a str, got {type(name).__name__}")
    suite, sep, suite_id = name.partition(":")
    if sep and suite in SUITES:
        module, attr = SUITES[suite].split(":")
        return getattr(importlib.import_module(module), attr)(suite_id, **kwargs)
    if sep and suite in KINDS:
        return KINDS[suite](suite_id, **kwargs)
    if name not in REGISTRY:
        close = difflib.get_close_matches(name, list(REGISTRY), n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(
            f"unknown env id {name!r}.{hint} Registered: {', '.join(registered_ids())}; "
            f"suite envs via {', '.join(repr(f'{s}:<id>') for s in SUITES)}, Gymnasium envs "
            "via 'gym:<id>'."
        )
    return REGISTRY[name](**kwargs)


def make_jax_env(name: str, **kwargs: Any) -> Env:
    """:func:`make`, for callers that need a pure-JAX env (rollouts, benchmarks, checks).

    Raises:
        TypeError: ``name`` builds a host-stepped env (``"gym:<id>"``), which only
            ``js.Sampler`` can drive; the message says so.
        ValueError: unknown id, as :func:`make`.
    """
    env = make(name, **kwargs)
    if not isinstance(env, Env):
        raise TypeError(
            f"{name!r} is a host-stepped env ({type(env).__name__}), not a pure-JAX env: "
            "use a built-in or suite id ('gymnax:<id>', 'brax:<name>', ...) here; js.Sampler "
            "samples 'gym:<id>' envs"
        )
    return env
