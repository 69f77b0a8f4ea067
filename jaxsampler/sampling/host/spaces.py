"""Host envs whose agents have their own spaces: which spaces each policy serves.

A host-stepped multi-agent env may give every agent its own observation and action space
(``observation_spaces`` / ``action_spaces``, :func:`~jaxsampler.host_envs.base.agent_spaces`),
as RLlib's ``MultiAgentEnv`` and PettingZoo's parallel envs may: predators and prey, a
speaker and a listener. The host sampler stacks one policy's agents into one batch per
call, so no padding is needed: each policy serves agents whose spaces one policy can
serve (:func:`~jaxsampler.spaces.share_one_space`: one shape and dtype), and is built for
them. Transforms are bound to one space and are refused for such envs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxsampler.policies.base import Policy
from jaxsampler.policies.multi import MultiAgentPolicy
from jaxsampler.rollout.scan import check_policy_fits
from jaxsampler.spaces import share_one_space

__all__ = ["PolicySpaces", "policy_spaces"]

#: policy id -> ``(observation space, action space)`` of the agents it serves
PolicySpaces = dict[Any, tuple[Any, Any]]


def policy_spaces(
    policy: Policy,
    agent_ids: tuple[Any, ...],
    observation_spaces: Mapping[Any, Any],
    action_spaces: Mapping[Any, Any],
    transforms: Any,
) -> PolicySpaces:
    """Checks a :class:`~jaxsampler.MultiAgentPolicy` policy by policy against its
    agents' spaces and returns the spaces each of its policies serves (its first agent's).

    Args:
        policy: what the sampler was given; it must be a ``MultiAgentPolicy`` over
            ``agent_ids``.
        agent_ids: the env's agent ids.
        observation_spaces, action_spaces: ``agent id -> space`` (what the policies see:
            the env's own spaces, or one space after the sampler's transforms).
        transforms: the sampler's ``transforms`` argument where the agents' spaces
            differ (it must then be empty); ``None`` otherwise.

    Raises:
        ValueError: transforms given; a policy that is not a ``MultiAgentPolicy`` or was
            built for other agent ids; a policy mapped to agents that one policy cannot
            serve (other shapes or dtypes; the agents and their spaces are named); a
            policy built for other spaces than its agents'.
    """
    if transforms:
        raise ValueError(
            "transforms= bind to one observation and action space, and this env's agents "
            f"have their own ({_describe(observation_spaces, action_spaces)}): drop the "
            "transforms, or transform inside the env"
        )
    if not isinstance(policy, MultiAgentPolicy):
        raise ValueError(
            "this env's agents have their own spaces "
            f"({_describe(observation_spaces, action_spaces)}): one {type(policy).__name__} "
            "cannot serve them all; pass js.MultiAgentPolicy(env, {policy_id: policy}, "
            "policy_mapping_fn) with one policy per set of agents that share spaces"
        )
    if tuple(policy.agent_ids) != tuple(agent_ids):
        raise ValueError(
            f"mismatched agent ids: the host env has {tuple(agent_ids)}, policy "
            f"MultiAgentPolicy was built for {tuple(policy.agent_ids)}"
        )
    out: PolicySpaces = {}
    for pid, p in zip(policy.policy_ids, policy.policies):
        agents = [a for a, q in zip(policy.agent_ids, policy.agent_policy) if q == pid]
        obs = {a: observation_spaces[a] for a in agents}
        act = {a: action_spaces[a] for a in agents}
        if not (share_one_space(obs.values()) and share_one_space(act.values())):
            raise ValueError(
                f"policy {pid!r} is mapped to agents of different spaces "
                f"({_describe(obs, act)}): map agents with different spaces to different "
                "policies"
            )
        spaces = (obs[agents[0]], act[agents[0]])
        own_agents = getattr(p, "agent_ids", None)
        label = f"agents {tuple(agents)} of the host env (policy {pid!r})"
        check_policy_fits(p, tuple(own_agents or agents), spaces[0], spaces[1], label)
        out[pid] = spaces
    return out


def _describe(observation_spaces: Mapping[Any, Any], action_spaces: Mapping[Any, Any]) -> str:
    return "; ".join(
        f"{a!r}: {observation_spaces[a]!r} -> {action_spaces[a]!r}" for a in observation_spaces
    )
