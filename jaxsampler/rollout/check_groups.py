"""``check_env``'s checks of an env with agent groups (``env.agent_layout`` not None).

The rollout carries every agent's observation in the layout's carrier space: the agent's
own values, flattened, then zeros (:class:`~jaxsampler.envs.groups.GroupLayout`). The
carrier space is the element-wise union of the groups' spaces, so an observation can lie
in it and still be wrong for its own agent. These checks read each agent's carrier rows
back in its own group's space:

* the layout builds (groups valid, ``num_agents`` equal to the agents they list);
* every agent's unpacked observation lies in its group's observation space, after the
  reset and on every step of the run (a value that an integer space would truncate on
  unpacking counts as outside);
* the carrier padding after an agent's own values is zero.

Each problem names the group, the agent, the env and the step of the first violation.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxsampler.envs.base import Env
from jaxsampler.envs.groups import GroupLayout
from jaxsampler.spaces import Box

__all__ = ["group_layout_problems", "group_observation_problems"]


def group_layout_problems(env: Env) -> list[str]:
    """Why ``env.agent_layout`` cannot be built (empty when it can, or the env has none)."""
    try:
        env.agent_layout  # noqa: B018 (building it checks the groups)
    except (TypeError, ValueError, KeyError) as err:
        return [f"agent groups: {err}"]
    return []


def group_observation_problems(layout: GroupLayout, rec: dict[str, Any]) -> list[str]:
    """Problems of the carrier observations of a run.

    Args:
        layout: the env's agent layout.
        rec: the run's host records: ``first_obs`` (``[N, A, D]``, after the reset),
            ``obs`` (``[S, N, A, D]``, scan index ``t`` is step ``t + 1``) and ``alive``
            (``bool[S, N]``, the env's episode was still going).

    Returns:
        At most two problems per group (own space, padding), each about its first
        violation.
    """
    first = np.asarray(rec["first_obs"])[None]  # [1, N, A, D]: step 0
    steps = np.asarray(rec["obs"])
    obs = np.concatenate([first, steps])  # [1 + S, N, A, D], index = step
    live = np.concatenate([np.ones((1,) + steps.shape[1:2], bool), np.asarray(rec["alive"])])
    out = []
    for group in layout.groups:
        space = group.observation_space
        assert isinstance(space, Box)  # the layout refuses anything else
        size = int(np.prod(space.shape, dtype=np.int64))
        start, stop = layout.slots(group.name)
        rows = obs[:, :, start:stop]  # [1 + S, N, A_g, D]
        own = rows[..., :size]
        bad = _outside(space, own.reshape(own.shape[:3] + space.shape))
        if np.issubdtype(space.dtype, np.integer):  # unpacking would truncate a fraction
            bad |= (np.floor(own) != own).any(-1)
        out += _first(bad & live[..., None], layout, group.name, "outside", rows, size, space)
        pad = (rows[..., size:] != 0).any(-1)
        out += _first(pad & live[..., None], layout, group.name, "padding", rows, size, space)
    return out


def _outside(space: Box, x: np.ndarray) -> np.ndarray:
    """``bool[*batch]``: whether each element of ``x`` (``[*batch, *shape]``) is outside."""
    inside = (x >= space.low) & (x <= space.high)
    axes = tuple(range(x.ndim - len(space.shape), x.ndim))
    return np.asarray(~inside.all(axis=axes))


def _first(
    bad: np.ndarray,
    layout: GroupLayout,
    name: str,
    kind: str,
    rows: np.ndarray,
    size: int,
    space: Box,
) -> list[str]:
    """The problem of the first ``True`` of ``bad`` (``[step, env, agent in group]``)."""
    if not bad.any():
        return []
    t, e, k = (int(i) for i in np.argwhere(bad)[0])
    start, _ = layout.slots(name)
    agent = layout.agent_ids[start + k]
    at = "the reset" if t == 0 else f"step {t}"
    row = rows[t, e, k]
    if kind == "outside":
        return [
            f"agent {agent!r} (group {name!r}) of env {e} at {at}: observation "
            f"{row[:size].reshape(space.shape).tolist()} is outside its group's space {space!r}"
        ]
    return [
        f"agent {agent!r} (group {name!r}) of env {e} at {at}: the carrier padding after its "
        f"{size} observation values is not zero: {row[size:].tolist()}"
    ]


def random_actions(env: Any, key: jax.Array, batch_shape: tuple[int, ...]) -> jax.Array:
    """Uniform random actions ``[*batch_shape, A, ...]`` for ``env``: with agent groups,
    each group's from its own action space (:meth:`GroupLayout.sample_actions`), else from
    the env's one action space."""
    layout = env.agent_layout
    if layout is not None:
        return layout.sample_actions(key, batch_shape)
    return env.action_space.sample_batch(key, (*batch_shape, env.num_agents))
