"""What external envs accept from their callers: options, rewards, flags and agent dicts.

Every check raises :class:`~jaxsampler.host_envs.external.errors.InvalidDataError` (the
options: ``ValueError``) before anything changes, quoting what was sent in bounded form;
none needs the env's lock (they read only what is fixed at construction).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any, NoReturn

import numpy as np

from jaxsampler.constants import ALL_AGENTS
from jaxsampler.host_envs.base import shared_and_own
from jaxsampler.host_envs.external.errors import InvalidDataError, _short
from jaxsampler.spaces import Space, ValueChecker

__all__ = ["MAX_REWARD", "AgentChecks", "agent_space_table", "check_reward"]

#: Largest reward magnitude: rewards end in float32 columns, where larger values are inf.
MAX_REWARD = float(np.finfo(np.float32).max)


def check_reward(r: Any, agent: Any) -> float:
    """``r`` as a float; :class:`InvalidDataError` unless it is a real number (not a
    string) that is finite and within float32 range (``abs(r) <= MAX_REWARD``)."""
    if type(r) is float:  # the common case, first
        v = r
    else:
        try:
            if isinstance(r, (str, bytes, bytearray)):
                raise TypeError
            v = float(r)
        except (TypeError, ValueError, OverflowError):
            raise InvalidDataError(
                f"reward[{_short(agent)}]: reward must be a number, got {_short(r)}"
            ) from None
    if not abs(v) <= MAX_REWARD:  # also catches NaN
        raise InvalidDataError(
            f"reward[{_short(agent)}]: reward must be finite and within float32 range "
            f"(abs <= {MAX_REWARD:.4g}), got {v}"
        )
    return v


def _check_flag(d: Any, what: str, agent: Any) -> bool:
    if not isinstance(d, (bool, np.bool_)):
        raise InvalidDataError(f"{what}[{_short(agent)}] must be a bool, got {_short(d)}")
    return bool(d)


def _check_option(
    name: str, value: Any, low: float, *, strict: bool = False, integer: bool = False
) -> None:
    ok_type = isinstance(value, numbers.Integral if integer else numbers.Real)
    if (
        isinstance(value, bool)
        or not ok_type
        or not math.isfinite(value)
        or value < low
        or (strict and value == low)
    ):
        kind = "an int" if integer else "a finite number"
        rel = ">" if strict else ">="
        raise ValueError(f"{name} must be {kind} {rel} {low}, got {value!r}")


def _checkers(spaces: Mapping[Any, Space], agent_ids: tuple) -> dict[Any, ValueChecker]:
    """Agent id -> the check of its space (agents of one space share one checker)."""
    made: dict[int, ValueChecker] = {}
    out = {}
    for a in agent_ids:
        space = spaces[a]
        if id(space) not in made:
            made[id(space)] = ValueChecker(space, error=InvalidDataError)
        out[a] = made[id(space)]
    return out


def agent_space_table(
    given: Space | Mapping[Any, Space], agent_ids: tuple, what: str, multi_agent: bool
) -> tuple[Space | None, dict[Any, Space] | None, dict[Any, Space]]:
    """``(shared space, own spaces, agent id -> space)`` of an env's ``what`` argument:
    one space for every agent (``(space, None, ...)``), or, for a multi-agent env, a dict
    ``agent id -> space``: equal spaces count as one; spaces that differ are kept as the
    agents' own, with the first agent's as the shared one where one policy can serve them
    all (only Box bounds differ) and ``None`` where it cannot.

    Raises:
        ValueError: a dict whose keys are not exactly ``agent_ids``.
        TypeError: a dict for a single-agent env, or a dict value that is not a
            jaxsampler space.
    """
    if not isinstance(given, Mapping):
        return given, None, dict.fromkeys(agent_ids, given)
    if not multi_agent:
        raise TypeError(
            f"a single-agent external env takes one {what}, not a dict agent id -> space "
            "(dicts are for ExternalMultiAgentEnv)"
        )
    if set(given) != set(agent_ids):
        raise ValueError(
            f"{what} as a dict must name every agent of agent_ids {list(agent_ids)} once, "
            f"got keys {list(given)}"
        )
    table = {a: given[a] for a in agent_ids}
    for a, space in table.items():
        if not isinstance(space, Space):
            raise TypeError(f"{what}[{a!r}] must be a jaxsampler space, got {type(space).__name__}")
    return (*shared_and_own(table), table)


class AgentChecks:
    """Checks of the agent dicts an env's callers send (observations, actions, rewards,
    infos, done flags) against its agents and spaces; observations and actions come back
    cast to their space's dtype."""

    def __init__(
        self,
        observation_spaces: Mapping[Any, Space],
        action_spaces: Mapping[Any, Space],
        agent_ids: tuple,
    ):
        self._obs_checks = _checkers(observation_spaces, agent_ids)
        self._act_checks = _checkers(action_spaces, agent_ids)
        self.agent_ids = agent_ids
        self.agent_set = frozenset(agent_ids)

    def agent(self, agent: Any) -> Any:
        """``agent``, if it is one of the env's agents."""
        if agent not in self.agent_set:
            raise InvalidDataError(
                f"unknown agent id {_short(agent)}; expected one of {list(self.agent_ids)}"
            )
        return agent

    def too_many(self, d: Mapping, what: str) -> NoReturn:
        """Refuses a dict with more entries than there are agents."""
        raise InvalidDataError(
            f"{what} has {len(d)} entries; there are only {len(self.agent_ids)} agents "
            f"{list(self.agent_ids)}"
        )

    def obs(self, obs: Any, allow_empty: bool = False) -> dict:
        """An observation dict ``agent -> obs`` (non-empty unless ``allow_empty``)."""
        if not isinstance(obs, Mapping) or not (obs or allow_empty):
            raise InvalidDataError(
                f"observations must be a non-empty dict agent -> obs, got {_short(obs)}"
            )
        checks, ids = self._obs_checks, self.agent_set
        if len(obs) > len(ids):
            self.too_many(obs, "observations")
        return {
            a: checks[a if a in ids else self.agent(a)](o, "observation", a) for a, o in obs.items()
        }

    def actions(self, actions: Any, agents: list) -> dict:
        """An action dict with exactly the acting ``agents``."""
        if (
            not isinstance(actions, Mapping)
            or len(actions) != len(agents)
            or set(actions) != set(agents)
        ):
            raise InvalidDataError(
                f"actions must be a dict with the acting agents {agents}, got {_short(actions)}"
            )
        checks = self._act_checks
        return {a: checks[a](x, "action", a) for a, x in actions.items()}

    def infos(self, infos: Any) -> None:
        """An info dict ``agent -> dict``."""
        if not isinstance(infos, Mapping):
            raise InvalidDataError(f"infos must be a dict agent -> dict, got {_short(infos)}")
        if len(infos) > len(self.agent_ids):
            self.too_many(infos, "infos")
        for a, i in infos.items():
            self.agent(a)
            if not isinstance(i, Mapping):
                raise InvalidDataError(
                    f"infos[{_short(a)}] must be a dict, got {_short(i)} (infos must be a "
                    "dict agent -> dict)"
                )

    def dones(self, dones: Any) -> set:
        """The agents a ``multiagent_done_dict`` marks done (``"__all__"`` is ignored)."""
        if not isinstance(dones, Mapping):
            raise InvalidDataError(
                f"multiagent_done_dict must be a dict agent -> bool, got {_short(dones)}"
            )
        if len(dones) > len(self.agent_ids) + 1:
            self.too_many(dones, "multiagent_done_dict")
        newly_done = set()
        for a, d in dones.items():
            if a != ALL_AGENTS:
                self.agent(a)
            if _check_flag(d, "multiagent_done_dict", a) and a != ALL_AGENTS:
                newly_done.add(a)
        return newly_done

    def returns(self, rewards: Any, infos: Any, dones: Any) -> tuple[dict[Any, float], set | None]:
        """The arguments of ``log_returns``: the checked rewards ``agent -> float`` and the
        agents marked done (``None`` without ``dones``)."""
        ids = self.agent_set
        if not isinstance(rewards, Mapping):
            raise InvalidDataError(f"rewards must be a dict agent -> reward, got {_short(rewards)}")
        if len(rewards) > len(ids):
            self.too_many(rewards, "rewards")
        checked = {
            (a if a in ids else self.agent(a)): check_reward(r, a) for a, r in rewards.items()
        }
        if infos is not None:
            self.infos(infos)
        newly_done = None if dones is None else self.dones(dones)
        return checked, newly_done
