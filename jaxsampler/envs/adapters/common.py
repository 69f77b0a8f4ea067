"""What every suite adapter shares: importing the suite, unknown ids, wrong objects, identity.

Each adapter (``gymnax``, ``brax``, ``jumanji``, ``pgx``, ``jaxmarl``) wraps one env object
of its suite and is reached two ways: ``js.from_<suite>(env)`` and
``js.make("<suite>:<id>")``. The three kinds of bad input get the same errors everywhere:

* the suite's package is not installed: :func:`import_suite` raises ``ImportError``
  with the exact ``pip install -e ".[<extra>]"`` command;
* an id the suite does not know: :func:`unknown_id` builds a ``ValueError`` naming close
  matches and listing the suite's ids;
* an object that is not an env of the suite: :func:`wrong_suite` builds a ``TypeError``
  naming what the adapter expected and what it got.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Iterable
from types import ModuleType
from typing import Any, ClassVar

from jaxsampler.envs.base import Env
from jaxsampler.spaces import Space

__all__ = ["SuiteEnv", "import_suite", "unknown_id", "wrong_suite"]


def import_suite(module: str, extra: str) -> ModuleType:
    """``importlib.import_module(module)``, or an ``ImportError`` saying how to install it.

    Args:
        module: the suite's import name (``"brax"``, ``"jumanji"``, ...).
        extra: the jaxsampler extra that installs it (``pip install -e ".[extra]"``).
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"{module} is not installed; the {extra} adapter needs it: "
            f'pip install -e ".[{extra}]"  (or pip install "jaxsampler[{extra}]")'
        ) from e


def unknown_id(suite: str, env_id: str, ids: Iterable[str]) -> ValueError:
    """The ``ValueError`` of ``js.make("<suite>:<env_id>")`` for an id the suite lacks:
    close matches first, then every id the suite registers."""
    ids = sorted(ids)
    close = difflib.get_close_matches(env_id, ids, n=3)
    hint = f" Did you mean {', '.join(repr(f'{suite}:{c}') for c in close)}?" if close else ""
    return ValueError(
        f"unknown {suite} env id {env_id!r}.{hint} {suite} registers: {', '.join(ids)}"
    )


def wrong_suite(adapter: str, expected: str, got: Any) -> TypeError:
    """The ``TypeError`` of ``js.<adapter>(obj)`` for an object of another kind."""
    kind = type(got)
    return TypeError(
        f"{adapter} expected {expected}, got {kind.__module__}.{kind.__qualname__}"
        + (" (a jaxsampler env needs no adapter)" if isinstance(got, Env) else "")
    )


@dataclasses.dataclass(frozen=True, eq=False)
class SuiteEnv(Env):
    """Base of the adapters: a wrapped suite env, its params and a display name.

    Envs are static configuration (jit caches key on them), so an adapter hashes and
    compares by the *identity* of the wrapped env and params and by the *value* of every
    other field (the display name, a subclass's options such as ``masked_obs``): two
    adapters of the same objects and options share compiled code, adapters that differ in
    an option never do, and nothing ever hashes a suite's env by value.

    Subclasses whose spaces are fixed at construction store them with
    :meth:`_set_spaces`; the others override ``observation_space`` / ``action_space``.

    Args:
        env: the suite's env object.
        params: the adapter's (or the suite's) params; subclasses fill in a default.
        env_id: a display name (``name`` is ``"<suite>:<env_id>"``).
    """

    env: Any
    params: Any = None
    env_id: str | None = None

    #: The ``js.make`` prefix of the suite (``"brax"`` -> ids ``"brax:<name>"``).
    suite: ClassVar[str] = ""

    def _identity(self) -> tuple[Any, ...]:
        """What hash and eq compare: ``env`` and ``params`` by ``id``, the rest by value."""
        return tuple(
            id(v) if f.name in ("env", "params") else v
            for f in dataclasses.fields(self)
            for v in (getattr(self, f.name),)
        )

    def __hash__(self) -> int:
        return hash((type(self), self._identity()))

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._identity() == self._identity()

    def _set_spaces(self, observation: Space, action: Space) -> None:
        """Stores the spaces :attr:`observation_space` / :attr:`action_space` return
        (call from ``__post_init__``; the dataclass is frozen)."""
        object.__setattr__(self, "_spaces", (observation, action))

    @property
    def observation_space(self) -> Space:
        """The per-agent observation space stored by :meth:`_set_spaces`."""
        space: Space = self.__dict__["_spaces"][0]
        return space

    @property
    def action_space(self) -> Space:
        """The per-agent action space stored by :meth:`_set_spaces`."""
        space: Space = self.__dict__["_spaces"][1]
        return space

    @property
    def name(self) -> str:
        """``"<suite>:<env_id>"``, or the wrapped env's class name in place of ``env_id`` when
        none was given."""
        return f"{self.suite}:{self.env_id or type(self.env).__name__}"

    @property
    def default_params(self) -> Any:
        """The adapter's ``params`` (subclasses fill in a default at construction)."""
        return self.params
