"""Policies on agent groups: which group a policy plays, and merging several policies' extras.

An env with agent groups (:attr:`jaxsampler.envs.Env.agent_layout`) carries every agent's
observation and action in *carrier* spaces on one agent axis. A policy of a
:class:`~jaxsampler.policies.MultiAgentPolicy` either plays one group, built for that
group's own spaces (its rows are unpacked before it runs and its actions packed after), or
plays padded carrier rows, built for the carrier spaces (any agents, any groups). The
helpers here decide which, check it, and merge the extras of policies whose outputs differ
in width (``Discrete(5)`` and ``Discrete(9)`` logits): every extra is zero-padded in its
trailing dims to the widest, and the true widths are reported for the host to cut back
(:func:`unpad_extra`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxsampler.envs.groups import GroupLayout
from jaxsampler.policies.base import Policy
from jaxsampler.spaces import Space, compatible
from jaxsampler.transforms.base import Pipeline

__all__ = [
    "check_group_transforms",
    "extra_shapes_of",
    "group_of_policies",
    "merge_extras",
    "pack_group_action",
    "unpad_extra",
]


def _fits(policy: Policy, observation_space: Space, action_space: Space) -> bool:
    return compatible(policy.observation_space, observation_space) and compatible(
        policy.action_space, action_space
    )


def _equal(a: Space, b: Space) -> bool:
    return a == b


def group_of_policies(
    layout: GroupLayout,
    policies: Mapping[str, Policy],
    agent_ids: Sequence[str],
    mapping: Sequence[str],
) -> dict[str, str | None]:
    """Which group each mapped policy plays: ``policy_id -> group name``, or ``None`` for a
    policy built for the carrier spaces (it plays padded rows of any agents).

    A policy whose agents all lie in one group plays it when it is built for that group's
    spaces (bounds of a ``Box`` may differ, as everywhere), else the carrier rows when it is
    built for the carrier spaces.

    Args:
        layout: the env's agent groups.
        policies: ``policy_id -> Policy``.
        agent_ids: the env's agents, in agent-axis order.
        mapping: the policy id of every agent (``agent_ids``' order).

    Raises:
        ValueError: a policy whose agents span several groups but is not built for the
            carrier spaces (the policy, its agents and their groups named), or one built
            neither for its group's spaces nor for the carrier's (the group, the agents and
            the spaces of both sides named).
    """
    carrier = (layout.observation_space, layout.action_space)
    out: dict[str, str | None] = {}
    for pid, policy in policies.items():
        agents = [a for a, p in zip(agent_ids, mapping) if p == pid]
        if not agents:
            continue
        by_group: dict[str, list[str]] = {}
        for a in agents:
            by_group.setdefault(layout.group_of(a).name, []).append(a)
        on_carrier = _fits(policy, *carrier)
        if len(by_group) > 1:
            if on_carrier:
                out[pid] = None
                continue
            raise ValueError(
                f"policy {pid!r} plays agents of several agent groups ({by_group}); a policy's "
                "agents must lie in one group (map each group to its own policy), unless the "
                "policy is built for the carrier spaces (observation "
                f"{carrier[0]!r}, action {carrier[1]!r}) to play padded rows"
            )
        (name,) = by_group
        group = layout.group(name)
        if _fits(policy, group.observation_space, group.action_space):
            out[pid] = name
        elif on_carrier:
            out[pid] = None
        else:
            raise ValueError(
                f"policy {pid!r} plays agents {agents} of agent group {name!r}, whose spaces "
                f"are observation {group.observation_space!r}, action "
                f"{group.action_space!r}; the policy was built for observation "
                f"{policy.observation_space!r}, action {policy.action_space!r} (build it for "
                "the group's spaces, or for the carrier spaces to play padded rows)"
            )
    return out


def check_group_transforms(env_name: str, layout: GroupLayout, pipe: Pipeline) -> None:
    """Refuses transforms that change the carrier spaces of an env with agent groups.

    Agents' rows are unpacked to their groups' spaces from the carrier layout, which a
    stacked, masked or reshaped observation no longer has; an action space rescaled to the
    carrier's bounds (the widest over the groups) would misplace every narrower group's
    actions. Observation transforms that keep the shape and dtype (normalization: bounds
    may change) and action transforms that keep the action space exactly pass.

    Raises:
        ValueError: the transforms change either space; the transforms and spaces are named.
    """
    names = [type(t).__name__ for t in pipe.transforms]
    for what, carrier, after, same in (
        ("observation", layout.observation_space, pipe.observation_space, compatible),
        ("action", layout.action_space, pipe.action_space, _equal),
    ):
        if not same(after, carrier):
            raise ValueError(
                f"env {env_name} has agent groups, whose rows are packed in the carrier "
                f"{what} space {carrier!r}; its transforms {names} change it to {after!r}. "
                "With agent groups only transforms that keep the observation and action "
                "spaces are supported (do the rest inside the env, per group)"
            )
    if pipe.observation_space != layout.observation_space:
        # values changed (normalized): a group held in another dtype than the carrier's
        # would get them cast back to its own (an int group's normalized values truncated)
        dtype = layout.observation_space.dtype
        other = [g.name for g in layout.groups if g.observation_space.dtype != dtype]
        if other:
            raise ValueError(
                f"env {env_name} has agent groups {other} whose observations are "
                f"{[str(layout.group(n).observation_space.dtype) for n in other]}, not the "
                f"carrier's {dtype}; its transforms {names} change "
                "the observation values, which would be cast back to those dtypes on "
                "unpacking: normalize inside the env, per group"
            )


def pack_group_action(layout: GroupLayout, group: str, policy_id: str, action: Any) -> Any:
    """Policy ``policy_id``'s actions ``[E, A_p, *group action shape]`` as carrier actions.

    Raises:
        ValueError: the actions do not have the group's action shape (trace time).
    """
    space = layout.group(group).action_space
    shape = tuple(np.shape(action))
    if len(shape) < 2 or shape[2:] != tuple(space.shape):
        raise ValueError(
            f"policy {policy_id!r} (agent group {group!r}, action space {space!r}) returned "
            f"actions of shape {shape}; expected [E, A_p, *{tuple(space.shape)}]"
        )
    return layout.pack_action(group, action)


def merge_extras(
    extras: Sequence[Mapping[str, Any]],
    batches: Sequence[tuple[int, int]],
    policy_ids: Sequence[str],
) -> list[dict[str, Any]]:
    """Every policy's extras made concatenable along the agent axis.

    Each gets the union of keys (a key a policy lacks is zeros for its agents), and every
    leaf is zero-padded in its trailing dims (beyond ``[E, A_p]``) to the widest any policy
    gives, in the dtype they promote to.

    Args:
        extras: each policy's extras, leaves ``[E, A_p, ...]``.
        batches: each policy's ``(E, A_p)``.
        policy_ids: the policies, for error messages.

    Raises:
        ValueError: policies give a key in different pytree structures or trailing ranks
            (trace time; the key, policies and shapes named).
    """
    keys = sorted({k for x in extras for k in x})
    out: list[dict[str, Any]] = [{} for _ in extras]
    for k in keys:
        having = [i for i, x in enumerate(extras) if k in x]
        trees = [extras[i][k] for i in having]
        treedef: Any = jax.tree.structure(trees[0])  # PyTreeDef: untyped for mypy
        for i, t in zip(having, trees):
            if jax.tree.structure(t) != treedef:
                raise ValueError(
                    f"extra {k!r}: policy {policy_ids[i]!r} gives structure "
                    f"{jax.tree.structure(t)}, policy {policy_ids[having[0]]!r} {treedef}"
                )
        columns = list(zip(*(jax.tree.leaves(t) for t in trees)))  # per leaf, per policy
        targets = [_target(k, col, [policy_ids[i] for i in having]) for col in columns]
        for i, batch in enumerate(batches):
            if i in having:
                leaves = jax.tree.leaves(extras[i][k])
                filled = [_pad(x, s, d) for x, (s, d) in zip(leaves, targets)]
            else:
                filled = [jnp.zeros(batch + s, d) for s, d in targets]
            out[i][k] = jax.tree.unflatten(treedef, filled)
    return out


def _target(key: str, leaves: Sequence[Any], pids: Sequence[str]) -> tuple[tuple[int, ...], Any]:
    """The widest trailing shape of one extra's leaf over the policies, and the dtype."""
    trailing = [tuple(np.shape(x))[2:] for x in leaves]
    if len({len(t) for t in trailing}) > 1:
        raise ValueError(
            f"extra {key!r} has trailing shapes of different ranks across policies: "
            + ", ".join(f"{p}: {t}" for p, t in zip(pids, trailing))
        )
    shape = tuple(int(n) for n in np.max(np.array(trailing, np.int64).reshape(len(leaves), -1), 0))
    return shape, jnp.result_type(*leaves)


def _pad(x: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    x = jnp.asarray(x).astype(dtype)
    widths = [(0, 0), (0, 0)] + [(0, t - s) for s, t in zip(x.shape[2:], shape)]
    return x if all(w == (0, 0) for w in widths) else jnp.pad(x, widths)


def extra_shapes_of(policy: Policy, num_agents: int) -> dict[str, Any]:
    """``{extra key: trailing shape}`` of ``policy``'s extras beyond ``[E, A_p]`` (a tuple,
    or a pytree of tuples for a pytree extra), from one abstract trace of its step
    (``jax.eval_shape``: nothing runs) on ``num_agents`` agents."""
    key = jax.random.PRNGKey(0)
    batch = (1, num_agents)
    obs = jax.tree.map(
        lambda z: jax.ShapeDtypeStruct(batch + np.shape(z), np.asarray(z).dtype),
        policy.observation_space.zeros(),
    )
    params = jax.eval_shape(policy.init, key)
    state = jax.eval_shape(lambda: policy.initial_state(batch))
    _, extras, _ = jax.eval_shape(policy, params, obs, key, state)
    return {k: jax.tree.map(lambda x: tuple(x.shape[2:]), v) for k, v in extras.items()}


def unpad_extra(value: Any, shape: tuple[int, ...]) -> Any:
    """``value`` (leaves ``[..., *padded]``) cut back to its true trailing ``shape``.

    For an agent's extra from a :class:`~jaxsampler.policies.MultiAgentPolicy` whose
    policies give it in different widths: ``shape`` is that agent's entry of
    :attr:`~jaxsampler.policies.MultiAgentPolicy.agent_extra_shapes`. Works on numpy and
    jax arrays (a view, no copy, on numpy).
    """
    x = value
    lead = np.ndim(x) - len(shape)
    if lead < 0:
        raise ValueError(f"extra of shape {np.shape(x)} has fewer dims than its shape {shape}")
    return x[(slice(None),) * lead + tuple(slice(0, n) for n in shape)]
