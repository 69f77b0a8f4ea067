"""The one interface of every host-stepped env: ``poll(timeout)`` / ``send_actions()``.

Envs that are not pure JAX (Gymnasium envs, dict-API multi-agent envs, an
``ExternalEnv`` driven by a simulator thread, the HTTP policy server) are all converted
to :class:`HostEnv`; the collector and the host sampler consume only this interface
(RLlib's ``BaseEnv`` / async vector env idea, and EnvPool's ``send``/``recv`` by env id).

Nested dicts ``env_id -> agent_id -> value`` (:data:`MultiEnvDict`) carry the data of
the sub-envs that are *ready*; sub-envs need not be in lockstep and a poll may return
any subset of them: at least one, unless its ``timeout`` ran out, the env was closed, or
every sub-env is finished (bounded sources such as replayed logs).

Protocol, per sub-env ``env_id``:

* an ``env_id`` that has no running episode starts one at its next poll: ``obs`` has the
  first observations of the agents that act first (``rewards`` of those agents may be
  present and are rewards received before acting: they belong to no step);
* afterwards each poll of ``env_id`` delivers one env step: ``obs`` of the agents that
  must act next (agents may be absent: they wait), ``rewards`` of any agent (summed by
  the collector into the agent's pending step), per-agent ``terminateds`` /
  ``truncateds`` and the episode-wide ``"__all__"`` key
  (:data:`jaxsampler.constants.ALL_AGENTS`) in both; the final observations
  of agents that finish come in ``obs`` with their done flag (and need no action);
* ``off_policy_actions[env_id][agent_id]`` is an action the env took itself (e.g.
  ``ExternalEnv.log_action``); the sampler records it instead of the policy's;
* ``send_actions({env_id: {agent_id: action}})`` answers exactly the agents of the last
  poll that have an observation and are not done; an env whose ``"__all__"`` flag was set
  resets itself and its next poll is the new episode's first observations (next-step
  auto-reset, the same contract as the device rollout).

A sub-env that fails mid-episode (an exception, a hang; see
:mod:`jaxsampler.host_envs.failures`) and is restarted or dropped ends its running
episode with an ordinary poll: every live agent gets its last good observation again,
reward ``0.0``, ``truncated`` (and ``"__all__"``) set, and the error as a string in
``infos[env_id][agent_id]["env_error"]``. Samplers need no special case for it.
"""

from __future__ import annotations

import abc
from typing import Any, NamedTuple

from jaxsampler.spaces import share_one_space

__all__ = [
    "REQUIRED_MEMBERS",
    "HostEnv",
    "MultiEnvDict",
    "PollResult",
    "agent_spaces",
    "check_host_env",
    "shared_and_own",
]

#: ``{env_id: {agent_id: value}}``
MultiEnvDict = dict[Any, dict[Any, Any]]

#: What every host env must provide (the samplers call or read each of them).
REQUIRED_MEMBERS = (
    "poll",
    "send_actions",
    "close",
    "observation_space",
    "action_space",
    "agent_ids",
    "num_envs",
)


class PollResult(NamedTuple):
    """What :meth:`HostEnv.poll` returns (all :data:`MultiEnvDict`)."""

    obs: MultiEnvDict
    rewards: MultiEnvDict
    terminateds: MultiEnvDict
    truncateds: MultiEnvDict
    infos: MultiEnvDict
    off_policy_actions: MultiEnvDict


class HostEnv(abc.ABC):
    """Base class of host-stepped (vector) envs; see the module docstring.

    Subclasses implement :meth:`poll` and :meth:`send_actions` and set the four attributes
    below (class attributes or in ``__init__``); :meth:`close`, :meth:`reset` and
    :attr:`closed` have documented defaults. :func:`check_host_env` names whatever is
    missing; the samplers call it at construction.

    Attributes:
        observation_space / action_space: one agent's spaces (jaxsampler spaces) that
            one policy can serve every agent with (where only Box bounds differ between
            agents, the first agent's); ``None`` when the agents' shapes or dtypes
            differ.
        observation_spaces / action_spaces: ``agent id -> space`` (RLlib's
            ``MultiAgentEnv`` attributes of the same names) for an env whose agents have
            their own spaces (predators and prey, PettingZoo's MPE tag); ``None``
            (the default) when :attr:`observation_space` / :attr:`action_space` are
            every agent's. :func:`agent_spaces` reads either form.
        agent_ids: the possible agent ids, in a fixed order (the agent index).
        num_envs: number of sub-envs (``env_id`` values are ``0 .. num_envs - 1`` unless
            the env says otherwise, e.g. episode ids of external envs); for envs whose
            sub-envs come and go, an upper bound on how many run at once.
        resettable: whether :meth:`reset` is implemented; a subclass that overrides
            :meth:`reset` gets ``True`` unless it sets the attribute itself.
        abandons_episodes: whether the env may end an episode as truncated because its
            client went away (final info ``{"abandoned": True}``); samplers then add an
            ``abandoned`` column to their batches. External envs and policy servers do.
    """

    observation_space: Any
    action_space: Any
    agent_ids: tuple[Any, ...]
    num_envs: int
    observation_spaces: dict[Any, Any] | None = None
    action_spaces: dict[Any, Any] | None = None
    resettable: bool = False
    abandons_episodes: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Decided once per class, so the samplers never probe an instance for reset(): the
        # nearest class in the MRO that sets ``resettable`` or defines ``reset`` decides
        # (a reset() inherited from a mixin counts).
        for klass in cls.__mro__:
            if "resettable" in vars(klass):
                cls.resettable = bool(vars(klass)["resettable"])
                break
            if "reset" in vars(klass):
                cls.resettable = True
                break

    @abc.abstractmethod
    def poll(self, timeout: float | None = None) -> PollResult:
        """The data of the sub-envs that are ready (see the module docstring).

        Args:
            timeout: wait at most about this many seconds for a sub-env to become ready
                (``None``: as long as the env needs). Envs that are always ready (lockstep
                envs) ignore it; envs that wait for outside callers return empty dicts
                when it runs out.
        """

    @abc.abstractmethod
    def send_actions(self, actions: MultiEnvDict) -> None:
        """Answers the agents of the last poll: ``{env_id: {agent_id: action}}``."""

    def close(self) -> None:
        """Releases resources (processes, threads, sockets). Idempotent. Default: nothing."""
        return None

    def reset(self) -> None:
        """Discards every running episode: every sub-env starts a new one at the next poll.

        Optional: overriding it makes :attr:`resettable` ``True``. The default
        raises, because an env whose episodes are driven from outside (external and served
        envs) cannot discard them.

        Raises:
            NotImplementedError: the env cannot reset (:attr:`resettable` is ``False``).
        """
        raise NotImplementedError(
            f"{type(self).__name__} has no reset(): its running episodes cannot be discarded"
        )

    @property
    def closed(self) -> bool:
        """``True`` once the env delivers nothing more (the sampler then ends its call).
        Default: ``False`` (the env does not say)."""
        return False


def agent_spaces(env: Any) -> tuple[dict[Any, Any], dict[Any, Any]]:
    """Each agent's ``(observation space, action space)`` of a host env, as two dicts
    keyed by agent id (in ``env.agent_ids`` order): its ``observation_spaces`` /
    ``action_spaces`` where it sets them, else its one shared space for every agent.

    Raises:
        ValueError: the env gives neither form for some agent, or its per-agent dict
            lacks one of its agent ids.
    """
    out = []
    for what in ("observation", "action"):
        per_agent = getattr(env, f"{what}_spaces", None)
        shared = getattr(env, f"{what}_space", None)
        spaces = {}
        for aid in env.agent_ids:
            space = per_agent.get(aid) if per_agent is not None else shared
            if space is None:
                raise ValueError(
                    f"{type(env).__name__} gives no {what} space for agent {aid!r}: set "
                    f"{what}_space (shared) or {what}_spaces (agent id -> space)"
                )
            spaces[aid] = space
        out.append(spaces)
    return out[0], out[1]


def shared_and_own(table: dict[Any, Any]) -> tuple[Any, dict[Any, Any] | None]:
    """A host env's ``(shared space, own spaces)`` from ``agent id -> space``: ``(space,
    None)`` when every agent has the same space; else the table as the agents' own, with
    the first agent's space as the shared one where one policy can serve them all (only
    Box bounds differ: :func:`~jaxsampler.spaces.share_one_space`) and ``None`` where it
    cannot."""
    first, *rest = table.values()
    if all(space == first for space in rest):
        return first, None
    return (first if share_one_space(table.values()) else None), table


def check_host_env(env: object) -> HostEnv:
    """``env`` if it is a complete :class:`HostEnv`.

    Raises:
        TypeError: ``env`` lacks members of :data:`REQUIRED_MEMBERS` (all of them are
            named), or has them all but does not subclass :class:`HostEnv`.
    """
    missing = [name for name in REQUIRED_MEMBERS if not hasattr(env, name)]
    kind = type(env).__name__
    if missing:
        raise TypeError(
            f"{kind} is not a complete host env: it lacks {', '.join(missing)} "
            "(see jaxsampler.host_envs.HostEnv)"
        )
    if not isinstance(env, HostEnv):
        raise TypeError(
            f"{kind} has the host-env members but is not a jaxsampler.host_envs.HostEnv: "
            "subclass HostEnv (it supplies close(), reset() and closed defaults)"
        )
    return env
