"""Legal-action masks: the masked-observation convention, and :class:`ActionMaskFromInfo`.

The convention (RLlib's action-masking example module uses the same two keys): a
*masked observation* is a ``Dict`` with

* ``"observations"``: the observation itself (``Box`` or ``Discrete``);
* ``"action_mask"``: a ``Box`` of shape ``(n,)`` for ``Discrete(n)`` actions (for
  ``MultiDiscrete(nvec)``: ``(sum(nvec),)``, the per-dimension masks concatenated),
  dtype ``bool`` or 0/1 ``int`` / ``float``. A nonzero entry marks a legal action.

Policies (``MLPPolicy``, ``RecurrentPolicy``, ``RandomPolicy``, and ``MultiAgentPolicy``
of them) built for such a space read the network input from ``"observations"`` and act
only on legal actions. An env publishes the mask either in its observation (e.g.
``js.make("TicTacToe-v0", masked_obs=True)``) or in its step ``info``; for the latter,
:class:`ActionMaskFromInfo` builds the masked observation inside the rollout.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxsampler.constants import MASK_KEY, OBS_KEY
from jaxsampler.spaces import Box, Dict, Discrete, MultiDiscrete, Space
from jaxsampler.transforms.base import (
    Context,
    Observed,
    Spaces,
    StageState,
    Transform,
    TransformSpaceError,
)

__all__ = [
    "ActionMaskFromInfo",
    "MASK_KEY",
    "OBS_KEY",
    "legal_actions",
    "lookup_info",
    "mask_size",
    "masked_space",
    "split_masked_space",
]


def mask_size(action_space: Space) -> int:
    """Length of the legal-action mask of ``action_space``: ``n`` for ``Discrete(n)``,
    ``sum(nvec)`` for ``MultiDiscrete(nvec)``.

    Raises:
        TypeError: any other action space (a mask needs finitely many discrete actions).
    """
    if isinstance(action_space, Discrete):
        return action_space.n
    if isinstance(action_space, MultiDiscrete):
        return int(np.sum(action_space.nvec, dtype=np.int64))
    raise TypeError(f"action masks need Discrete or MultiDiscrete actions, got {action_space!r}")


def masked_space(observation_space: Space, action_space: Space) -> Dict:
    """The masked observation space ``Dict(observations=..., action_mask=Box(bool, (n,)))``
    for ``action_space`` (see :func:`mask_size`)."""
    n = mask_size(action_space)
    return Dict({OBS_KEY: observation_space, MASK_KEY: Box(0, 1, (n,), np.bool_)})


def split_masked_space(
    space: Space, action_space: Space, *, other_keys: bool = False
) -> tuple[Space, Box] | None:
    """``(observation space, mask space)`` of a masked observation space, or ``None`` if
    ``space`` is not one (not a ``Dict`` with an ``"action_mask"`` entry).

    Raises:
        ValueError: a ``Dict`` with an ``"action_mask"`` entry but other keys than
            ``"observations"`` and ``"action_mask"``, or a mask that is not a ``Box`` of
            shape ``(mask_size(action_space),)`` (the message names both spaces).
        TypeError: a mask with an action space that cannot be masked (continuous).

    ``other_keys=True`` (for policies that read only the mask, e.g. ``RandomPolicy``)
    accepts any other entries; the first element is then the space itself.
    """
    if not isinstance(space, Dict) or MASK_KEY not in space.spaces:
        return None
    if not other_keys and set(space.spaces) != {OBS_KEY, MASK_KEY}:
        raise ValueError(
            f"a masked observation space is Dict({OBS_KEY!r}: ..., {MASK_KEY!r}: ...), got "
            f"{space!r} (keys {sorted(space.spaces)}); flatten the other entries into "
            f"{OBS_KEY!r} (e.g. FlattenObservation)"
        )
    n = mask_size(action_space)
    mask = space.spaces[MASK_KEY]
    if not isinstance(mask, Box) or mask.shape != (n,):
        raise ValueError(
            f"the {MASK_KEY!r} entry must be a Box of shape ({n},) for {action_space!r}, got "
            f"{mask!r}"
        )
    if not (mask.dtype == np.bool_ or np.issubdtype(mask.dtype, np.number)):
        raise ValueError(f"the {MASK_KEY!r} entry must be bool, int or float, got {mask!r}")
    return space.spaces.get(OBS_KEY, space), mask


def legal_actions(mask: jax.Array) -> jax.Array:
    """``bool[..., n]``: the nonzero entries of a mask (bool, int or float). Pure."""
    mask = jnp.asarray(mask)
    return mask if mask.dtype == jnp.bool_ else mask != 0


def lookup_info(info: Any, path: str) -> Any:
    """``info`` at a dotted ``path`` (attributes of dataclasses, keys of dicts).

    Raises:
        KeyError: no entry there (the missing part is the key).
    """
    node = info
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif not isinstance(node, dict) and hasattr(node, part):
            node = getattr(node, part)
        else:
            raise KeyError(part)
    return node


def _describe(tree: Any) -> str:
    if tree is None:
        return "None"
    return str(jax.tree.map(lambda x: f"{jnp.result_type(x)}{list(np.shape(x))}", tree))


@dataclasses.dataclass(frozen=True)
class ActionMaskFromInfo(Transform):
    """Builds the masked observation ``{"observations": obs, "action_mask": info[path]}``
    from a mask the env publishes in its step ``info``.

    In the device rollout ``Observed.info`` is the info of the step that produced the
    observation (the reset's on a first observation), leaves ``[E, ...]``; the mask at
    ``path`` must be ``[E, A, n]`` (one row per agent, e.g. TicTacToe's
    ``TicTacToeInfo.action_mask: bool[2, 9]`` per env) or, for a single-agent env,
    ``[E, n]``. It is handed on as ``bool`` (nonzero = legal). The observation itself
    passes unchanged; put this transform *after* transforms that change observations
    and cannot handle a ``Dict`` (e.g. ``FrameStack``), before those that skip masks.

    Args:
        path: where the mask sits in ``info``: an attribute / key name, dotted for
            nested ones (``"masks.legal"``).
        obs_key: the key of the observation in the output ``Dict``. Policies read
            ``"observations"`` (the default); change it only for your own consumers.

    Raises:
        TransformSpaceError: (pipeline build) the action space cannot be masked
            (not ``Discrete`` / ``MultiDiscrete``), or the observation is already masked.
        ValueError: (trace time, the first time the rollout is traced) no ``info``
            (a host env's poll), no entry at ``path`` (the message shows the info's
            structure), or a mask whose shape is not ``[E, A, n]`` / ``[E, n]``.
    """

    path: str = MASK_KEY
    obs_key: str = OBS_KEY

    changes_obs = True

    def check(self, spaces: Spaces) -> None:
        """Raises :class:`TransformSpaceError` for actions that cannot be masked (not
        ``Discrete`` / ``MultiDiscrete``), an observation that already has an
        ``action_mask``, or an empty ``path``."""
        try:
            mask_size(spaces.action)
        except TypeError as e:
            raise TransformSpaceError(f"ActionMaskFromInfo: {e}") from None
        if isinstance(spaces.obs, Dict) and MASK_KEY in spaces.obs.spaces:
            raise TransformSpaceError(
                f"ActionMaskFromInfo: the observation {spaces.obs!r} already has an "
                f"{MASK_KEY!r} entry"
            )
        if not self.path or not isinstance(self.path, str):
            raise TransformSpaceError(
                f"ActionMaskFromInfo: path must be a non-empty string, got {self.path!r}"
            )

    def observation_space(self, spaces: Spaces) -> Space:
        """``Dict({obs_key: <the input observation>, "action_mask": Box(0, 1, (n,), bool)})``,
        ``n`` the mask size of the action space."""
        n = mask_size(spaces.action)
        return Dict({self.obs_key: spaces.obs, MASK_KEY: Box(0, 1, (n,), np.bool_)})

    def observe(
        self, spaces: Spaces, state: StageState, step: Observed, ctx: Context
    ) -> tuple[StageState, Observed]:
        """``step.obs`` wrapped with the ``bool[E, A, n]`` mask found at ``path`` in
        ``step.info``. Stateless; pure, jittable (a missing or misshapen mask raises
        ``ValueError`` at trace time)."""
        mask = self._mask(spaces, step)
        obs = {self.obs_key: step.obs, MASK_KEY: mask}
        return state, dataclasses.replace(step, obs=obs)

    def _mask(self, spaces: Spaces, step: Observed) -> jax.Array:
        """The ``bool[E, A, n]`` mask of ``step`` (checked while tracing)."""
        if step.info is None:
            raise ValueError(
                f"ActionMaskFromInfo(path={self.path!r}) needs the env's step info, but this "
                "sampler passes none (host envs report no device info): publish the mask in "
                f"the observation instead, as Dict({OBS_KEY!r}: ..., {MASK_KEY!r}: ...)"
            )
        try:
            mask = lookup_info(step.info, self.path)
        except KeyError:
            raise ValueError(
                f"ActionMaskFromInfo: the env's info has no entry {self.path!r}; its info is "
                f"{_describe(step.info)} (leaves [envs, ...])"
            ) from None
        mask = jnp.asarray(mask)
        batch = tuple(step.terminated.shape)  # (E, A)
        n = mask_size(spaces.action)
        if batch[1] == 1 and tuple(mask.shape) == (batch[0], n):
            mask = mask[:, None]
        if tuple(mask.shape) != batch + (n,):
            want = f"{list(batch + (n,))}" + (f" or {[batch[0], n]}" if batch[1] == 1 else "")
            raise ValueError(
                f"ActionMaskFromInfo: info entry {self.path!r} has shape {list(mask.shape)}, "
                f"expected {want} (envs, agents, mask of {spaces.action!r})"
            )
        return legal_actions(mask)
