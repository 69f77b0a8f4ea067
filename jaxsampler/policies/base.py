"""The policy protocol, and the uniform random policy.

A policy is static configuration (frozen, hashable) plus pure functions::

    init(key) -> params
    initial_state(batch_shape) -> policy_state          # leaves [*batch_shape, ...]
    __call__(params, obs, key, policy_state) -> (action, extras, policy_state)

``obs`` leaves have leading batch dims ``[E, A]`` (any leading dims must work), the
action leaves ``[E, A, *action_space.shape]``. ``extras`` is a dict of per-step outputs
with leading ``[E, A]`` (RLlib's ``extra_model_outputs``: ``action_logp``, ``vf_preds``,
``action_dist_inputs``, ...); its structure must not depend on the input values. Stateless
policies return an empty :class:`NoState`. The rollout resets the state of an env to
``initial_state`` at the first step of every episode.

Optional: ``log_prob(params, obs, action, policy_state) -> logp`` (``float32[E, A]``), the
log-probability (density, for continuous actions) of a *given* action under the policy at
``obs`` and the state *before* the step. The host sampler uses it for actions the env
took itself (off-policy steps), whose ``action_logp`` must be that of the recorded
action, not of the policy's own sample. :attr:`Policy.has_log_prob` says whether a
policy implements it; the base class raises ``NotImplementedError``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsampler.spaces import Discrete, MultiDiscrete, Space
from jaxsampler.transforms.mask import MASK_KEY, legal_actions, split_masked_space

__all__ = ["Policy", "NoState", "RandomPolicy"]


@struct.dataclass
class NoState:
    """The (leafless) state of a stateless policy."""


class Policy:
    """Base class; subclasses are frozen dataclasses with these two space fields."""

    observation_space: Space
    action_space: Space

    def init(self, key: jax.Array) -> Any:
        """Returns freshly initialised params (a pytree)."""
        raise NotImplementedError

    def initial_state(self, batch_shape: tuple[int, ...]) -> Any:
        """The recurrent state at an episode start, leaves ``[*batch_shape, ...]``."""
        return NoState()

    def __call__(
        self, params: Any, obs: Any, key: jax.Array, policy_state: Any
    ) -> tuple[Any, dict[str, jax.Array], Any]:
        raise NotImplementedError

    def log_prob(self, params: Any, obs: Any, action: Any, policy_state: Any) -> jax.Array:
        """Log-probability of ``action`` at ``obs`` (optional; see the module docstring).

        Args:
            params: the policy's params.
            obs: observations, leaves ``[*batch, ...]``.
            action: actions, leaves ``[*batch, *action_space.shape]``.
            policy_state: the recurrent state before the step, leaves ``[*batch, ...]``.

        Returns:
            ``float32[*batch]``. Pure: safe under ``jit`` and ``vmap``.

        Raises:
            NotImplementedError: the policy cannot evaluate given actions
                (:attr:`has_log_prob` is ``False``).
        """
        raise NotImplementedError(
            f"{type(self).__name__} does not implement log_prob (the log-probability of a "
            "given action); has_log_prob is False"
        )

    @property
    def has_log_prob(self) -> bool:
        """Whether :meth:`log_prob` is implemented (a subclass overrides it)."""
        return type(self).log_prob is not Policy.log_prob

    def act_on_rows(
        self,
        params: Any,
        obs: Any,
        key: jax.Array,
        policy_state: Any,
        rows: jax.Array,
        *,
        value_rows: jax.Array | None = None,
    ) -> tuple[Any, dict[str, jax.Array], Any]:
        """``__call__`` with the network evaluated on some agent rows only (optional).

        The rollout calls it for envs that declare ``max_acting`` (turn-based games): the
        network runs on the ``E x k`` rows of the agents that act, not on all ``E x A``.

        Args:
            params, obs, key, policy_state: as for ``__call__`` (``obs`` leaves
                ``[E, A, ...]``).
            rows: ``int32[E, k]``, the agent indices to evaluate per env
                (:func:`jaxsampler.vector.acting_rows`).
            value_rows: ``bool[E, A]``, the agents whose value estimate is read (the
                rollout passes the acting agents and every agent of a resetting env), or
                ``None``: every agent's. Passed only to a policy whose
                :attr:`values_on_rows` is True.

        Returns:
            ``(action, extras, policy_state)`` shaped as ``__call__``'s (``[E, A, ...]``).
            For the agents in ``rows``, the network's outputs are ``__call__``'s (to float
            rounding: XLA may round a matmul over fewer rows differently) and the
            actions are drawn from the same distributions (a policy may spend its random
            bits on these rows only, so sampled actions need not be ``__call__``'s own
            draws). The other agents' actions and extras may be placeholders (they do not
            act), except a value estimate (``vf_preds``), which must be given for every
            agent in ``value_rows`` (every agent when it is ``None``): at a reset step
            nobody acts, and GAE bootstraps each truncated agent from its final
            observation's value. Outside ``value_rows`` it may be a placeholder (0).

        Raises:
            NotImplementedError: the policy cannot (:attr:`acts_on_rows` is ``False``).
        """
        raise NotImplementedError(f"{type(self).__name__} cannot act on a subset of rows")

    @property
    def acts_on_rows(self) -> bool:
        """Whether :meth:`act_on_rows` is implemented (a subclass overrides it)."""
        return type(self).act_on_rows is not Policy.act_on_rows

    @property
    def values_on_rows(self) -> bool:
        """Whether :meth:`act_on_rows` accepts ``value_rows`` (False unless a subclass
        says so: an override written for ``rows`` alone is called without it)."""
        return False


@dataclasses.dataclass(frozen=True)
class RandomPolicy(Policy):
    """Uniformly random actions from ``action_space``; no params, no extras.

    With a masked observation space (``Dict(observations=..., action_mask=...)``, see
    :mod:`jaxsampler.transforms.mask`) and ``Discrete`` or ``MultiDiscrete`` actions,
    the actions are uniform over the legal ones (for ``MultiDiscrete``, each dimension
    over its own legal values); a mask (or a dimension's part of it) with no legal entry
    masks nothing there (uniform over all). Without a mask, the draws are exactly those
    of ``action_space.sample_batch``.

    Raises:
        ValueError, TypeError: a malformed masked observation space, or a mask with
            actions that cannot be masked (the message names the spaces).
    """

    observation_space: Space
    action_space: Space

    def __post_init__(self) -> None:
        split_masked_space(self.observation_space, self.action_space, other_keys=True)

    def init(self, key: jax.Array) -> Any:
        """No params: ``()`` (``key`` is unused)."""
        return ()

    def __call__(
        self, params: Any, obs: Any, key: jax.Array, policy_state: Any
    ) -> tuple[Any, dict[str, jax.Array], Any]:
        batch = batch_dims(obs, self.observation_space)
        masked = split_masked_space(self.observation_space, self.action_space, other_keys=True)
        if masked is None:
            return self.action_space.sample_batch(key, batch), {}, policy_state
        return _sample_legal(self.action_space, obs[MASK_KEY], key), {}, policy_state


def _sample_legal(space: Space, mask: jax.Array, key: jax.Array) -> jax.Array:
    """Uniform legal actions: ``mask`` ``[*batch, n]`` -> ``[*batch, *space.shape]``."""
    legal = legal_actions(mask)
    if isinstance(space, Discrete):
        sizes = [space.n]
    else:
        assert isinstance(space, MultiDiscrete)
        sizes = [int(n) for n in np.asarray(space.nvec).reshape(-1)]
    width = max(sizes)
    ends = np.cumsum(sizes)
    # [*batch, d, width]: each dimension's segment of the mask, padded with illegal slots.
    rows = []
    for start, size in zip(ends - np.asarray(sizes), sizes):
        seg = legal[..., int(start) : int(start) + size]
        seg = seg | ~jnp.any(seg, axis=-1, keepdims=True)  # no legal value: all of them
        rows.append(jnp.pad(seg, [(0, 0)] * (seg.ndim - 1) + [(0, width - size)]))
    table = jnp.stack(rows, axis=-2)
    logits = jnp.where(table, 0.0, -jnp.inf).astype(jnp.float32)
    choice = jax.random.categorical(key, logits, axis=-1)  # [*batch, d]
    if isinstance(space, Discrete):
        return (choice[..., 0] + space.start).astype(space.dtype)
    return choice.reshape(choice.shape[:-1] + space.shape).astype(space.dtype)


def batch_dims(obs: Any, space: Space) -> tuple[int, ...]:
    """The leading batch dims of ``obs`` (a batched element of ``space``)."""
    leaf_shape = jax.tree.leaves(space.zeros())[0].shape
    shape = jax.tree.leaves(obs)[0].shape
    return tuple(shape[: len(shape) - len(leaf_shape)])
