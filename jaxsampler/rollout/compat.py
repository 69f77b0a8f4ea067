"""Static checks that an env, a policy and their transforms fit together.

They run at build and trace time (shapes, dtypes, spaces), so a mismatch fails with a
message naming it instead of deep inside the scan. Nothing here touches array values.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxsampler.envs.base import Env
from jaxsampler.policies.base import Policy
from jaxsampler.policies.groups import check_group_transforms
from jaxsampler.spaces import Box, Discrete, MultiDiscrete, Space, compatible
from jaxsampler.transforms.base import Pipeline, Transform, build_pipeline

__all__ = [
    "Transforms",
    "check_sizes",
    "pipeline_of",
    "check_compatible",
    "check_policy_fits",
    "check_action",
]

#: What ``transforms=`` accepts: a :class:`~jaxsampler.transforms.Transform`, a sequence of
#: them (env side first), or an already bound :class:`~jaxsampler.transforms.Pipeline`.
Transforms = Transform | Pipeline | tuple[Transform, ...] | list[Transform] | None


def check_sizes(num_envs: Any, rollout_length: Any | None = None) -> None:
    """Checks the static sizes of a rollout.

    Args:
        num_envs: ``E``; must be a Python or NumPy int ``>= 1`` (not a bool).
        rollout_length: ``T``, the same rule; ``None`` skips it.

    Raises:
        ValueError: a size that is not such an int, naming it.
    """
    if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
        raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
    if rollout_length is not None and (
        isinstance(rollout_length, bool)
        or not isinstance(rollout_length, (int, np.integer))
        or rollout_length < 1
    ):
        raise ValueError(f"rollout_length must be an int >= 1, got {rollout_length!r}")


def pipeline_of(env: Env, transforms: Transforms = None) -> Pipeline:
    """``transforms`` bound to ``env``'s spaces (:func:`jaxsampler.transforms.build_pipeline`).

    Args:
        env: the env whose observation and action spaces the transforms start from.
        transforms: what ``transforms=`` accepts; a bound ``Pipeline`` is returned as is.

    Returns:
        The bound :class:`~jaxsampler.transforms.Pipeline` (empty for ``None``). Static:
        runs on the host at build time.
    """
    if isinstance(transforms, Pipeline):
        return transforms
    return build_pipeline(transforms, env.observation_space, env.action_space)


def check_compatible(env: Env, policy: Policy, transforms: Transforms = None) -> Pipeline:
    """Raises ``ValueError`` naming the mismatch if ``policy`` cannot drive ``env`` (through
    ``transforms``: the policy must fit the spaces the last transform hands on).

    Args:
        env: a jaxsampler :class:`~jaxsampler.envs.base.Env`.
        policy: the policy; its ``agent_ids``, ``observation_space`` and ``action_space``
            are compared where it has them.
        transforms: what ``transforms=`` accepts.

    Returns:
        The bound pipeline (:func:`pipeline_of`). Static: runs on the host.

    Raises:
        TypeError: ``env`` is not a jaxsampler ``Env``.
        ValueError: mismatched agent ids or spaces, naming both sides; transforms that change
            the spaces of an env with agent groups.
    """
    if not isinstance(env, Env):
        raise TypeError(
            f"env must be a jaxsampler Env, got {type(env).__name__} (wrap gymnax envs with "
            "js.envs.from_gymnax)"
        )
    pipe = pipeline_of(env, transforms)
    layout = env.agent_layout
    if layout is not None and pipe:
        check_group_transforms(env.name, layout, pipe)
    label = f"env {env.name}" + (" after its transforms" if pipe else "")
    check_policy_fits(policy, env.agent_ids, pipe.observation_space, pipe.action_space, label)
    return pipe


def check_policy_fits(
    policy: Policy,
    agent_ids: tuple[Any, ...],
    observation_space: Space,
    action_space: Space,
    env_label: str,
) -> None:
    """Raises ``ValueError`` naming the mismatch if ``policy`` was built for other agent ids
    or spaces than an env's (device or host: ``env_label`` names it in the message).

    Args:
        policy: the policy; attributes it lacks (``agent_ids``, spaces) are not compared.
        agent_ids: the env's agent ids, in order.
        observation_space, action_space: what the policy must be built for (after the
            env's transforms).
        env_label: names the env in the message, e.g. ``"env CartPole-v1"``.

    Raises:
        ValueError: the first mismatch (agent ids, then observation, then action space).
    """
    policy_agents = getattr(policy, "agent_ids", None)
    if policy_agents is not None and tuple(policy_agents) != tuple(agent_ids):
        raise ValueError(
            f"mismatched agent ids: {env_label} has {tuple(agent_ids)}, "
            f"policy {type(policy).__name__} was built for {tuple(policy_agents)}"
        )
    spaces = (("observation_space", observation_space), ("action_space", action_space))
    for what, env_space in spaces:
        pol_space = getattr(policy, what, None)
        if pol_space is None:
            continue
        if not compatible(env_space, pol_space):
            raise ValueError(
                f"mismatched {what.replace('_', ' ')}: {env_label} has {env_space!r}, "
                f"policy {type(policy).__name__} was built for {pol_space!r}"
            )


def check_action(space: Space, action: Any, batch_shape: tuple[int, ...]) -> None:
    """Static check (shapes, dtypes) of a batched action; raises naming the problem.

    Args:
        space: one agent's action space.
        action: action pytree with leading ``batch_shape`` (e.g. ``(E, A)``); tracers are fine.
        batch_shape: the expected leading dims.

    Jit-safe: reads only shapes and dtypes (runs at trace time under jit).

    Raises:
        TypeError: another pytree structure, or a dtype the space does not take (any
            integer dtype for discrete spaces and integer boxes, else exactly the space's).
        ValueError: another shape (no broadcasting).
    """
    expected = jax.tree.map(
        lambda z: jax.ShapeDtypeStruct(tuple(batch_shape) + z.shape, z.dtype), space.zeros()
    )
    got_def: Any = jax.tree.structure(action)  # PyTreeDef: untyped for mypy
    if got_def != jax.tree.structure(expected):
        raise TypeError(
            f"action has structure {got_def}, expected {jax.tree.structure(expected)} for {space!r}"
        )
    for exp, got in zip(jax.tree.leaves(expected), jax.tree.leaves(action)):
        got_shape, got_dtype = tuple(np.shape(got)), jnp.result_type(got)
        if got_shape != exp.shape:
            raise ValueError(
                f"action has shape {got_shape}, expected {exp.shape} "
                f"(batch {tuple(batch_shape)} + action space {space!r}); refusing to broadcast"
            )
        if isinstance(space, (Discrete, MultiDiscrete)) or (
            isinstance(space, Box) and np.issubdtype(space.dtype, np.integer)
        ):
            if not jnp.issubdtype(got_dtype, jnp.integer):
                raise TypeError(
                    f"action dtype {got_dtype} is not an integer dtype, as {space!r} requires"
                )
        elif got_dtype != exp.dtype:
            raise TypeError(
                f"action dtype {got_dtype} does not match {space!r} (expected {exp.dtype})"
            )
