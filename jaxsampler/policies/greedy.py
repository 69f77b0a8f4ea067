"""Greedy (non-exploring) copies of policies: ``greedy(policy)`` acts by argmax / mean."""

from __future__ import annotations

import copy
import dataclasses

from jaxsampler.policies.base import Policy
from jaxsampler.policies.multi import MultiAgentPolicy

__all__ = ["greedy", "can_act_greedily"]


def can_act_greedily(policy: Policy) -> bool:
    """Whether :func:`greedy` can make ``policy`` act greedily."""
    if isinstance(policy, MultiAgentPolicy):
        return all(can_act_greedily(p) for p in policy.policies)
    return dataclasses.is_dataclass(policy) and any(
        f.name == "explore" for f in dataclasses.fields(policy)
    )


def greedy(policy: Policy) -> Policy:
    """The same policy acting greedily: its ``explore`` switch off (``MLPPolicy``,
    ``RecurrentPolicy``: argmax of the logits, the Gaussian's mean); for a
    :class:`MultiAgentPolicy`, each of its policies. Params and state are unchanged, so
    the greedy copy takes the same params. ``action_logp`` is then the log-probability of
    the greedy action under the (exploring) distribution.

    Raises:
        TypeError: the policy has no ``explore`` switch (e.g. ``RandomPolicy``); the
            message names it.
    """
    if isinstance(policy, MultiAgentPolicy):
        out = copy.copy(policy)
        object.__setattr__(out, "policies", tuple(greedy(p) for p in policy.policies))
        return out
    if not can_act_greedily(policy):
        raise TypeError(
            f"{type(policy).__name__} has no explore switch, so it cannot act greedily; "
            "policies with one: MLPPolicy, RecurrentPolicy (explore=False), and "
            "MultiAgentPolicy of such policies"
        )
    if not policy.explore:  # type: ignore[attr-defined]
        return policy
    return dataclasses.replace(policy, explore=False)  # type: ignore[type-var]
