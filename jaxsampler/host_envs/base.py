"""The one interface of every host-stepped env: ``poll()`` / ``send_actions()``.

Envs that are not pure JAX (Gymnasium envs, dict-API multi-agent envs, an
``ExternalEnv`` driven by a simulator thread, the HTTP policy server) are all converted
to :class:`HostEnv`; the collector and the host sampler consume only this interface
(RLlib's ``BaseEnv`` / async vector env idea, and EnvPool's ``send``/``recv`` by env id).

Nested dicts ``env_id -> agent_id -> value`` (:data:`MultiEnvDict`) carry the data of
the sub-envs that are *ready*; sub-envs need not be in lockstep and a poll may return
any subset of them (but at least one, unless every sub-env is finished, which only
bounded sources such as replayed logs do).

Protocol, per sub-env ``env_id``:

* an ``env_id`` that has no running episode starts one at its next poll: ``obs`` has the
  first observations of the agents that act first (``rewards`` of those agents may be
  present and are rewards received before acting: they belong to no step);
* afterwards each poll of ``env_id`` delivers one env step: ``obs`` of the agents that
  must act next (agents may be absent: they wait), ``rewards`` of any agent (summed by
  the collector into the agent's pending step), per-agent ``terminateds`` /
  ``truncateds`` and the episode-wide ``"__all__"`` key in both; the final observations
  of agents that finish come in ``obs`` with their done flag (and need no action);
* ``off_policy_actions[env_id][agent_id]`` is an action the env took itself (e.g.
  ``ExternalEnv.log_action``); the sampler records it instead of the policy's;
* ``send_actions({env_id: {agent_id: action}})`` answers exactly the agents of the last
  poll that have an observation and are not done; an env whose ``"__all__"`` flag was set
  resets itself and its next poll is the new episode's first observations (next-step
  auto-reset, the same contract as the device rollout).
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["HostEnv", "MultiEnvDict", "PollResult"]

#: ``{env_id: {agent_id: value}}``
MultiEnvDict = dict[Any, dict[Any, Any]]


class PollResult(NamedTuple):
    """What :meth:`HostEnv.poll` returns (all :data:`MultiEnvDict`)."""

    obs: MultiEnvDict
    rewards: MultiEnvDict
    terminateds: MultiEnvDict
    truncateds: MultiEnvDict
    infos: MultiEnvDict
    off_policy_actions: MultiEnvDict


class HostEnv:
    """Base class of host-stepped (vector) envs; see the module docstring.

    Attributes:
        observation_space / action_space: one agent's spaces (jaxsampler spaces); agents
            share them (as on the device agent axis).
        agent_ids: the possible agent ids, in a fixed order (the agent index).
        num_envs: number of sub-envs (``env_id`` values are ``0 .. num_envs - 1`` unless
            the env says otherwise, e.g. episode ids of external envs).
    """

    observation_space: Any
    action_space: Any
    agent_ids: tuple[Any, ...]
    num_envs: int

    def poll(self) -> PollResult:
        raise NotImplementedError

    def send_actions(self, actions: MultiEnvDict) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Releases resources (processes, threads, sockets). Idempotent."""
