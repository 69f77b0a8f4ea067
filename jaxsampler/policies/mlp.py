"""Flax actor-critic policies: MLP (discrete or continuous actions) and a recurrent GRU.

Both return ``extras = {"action_dist_inputs": float32[..., k], "action_logp": float32[...],
"vf_preds": float32[...]}`` (RLlib's column names, the ones its losses read) with the leading
batch dims of the observation, and implement ``log_prob(params, obs, action, policy_state)``
(the log-probability of a given action, :meth:`jaxsampler.policies.base.Policy.log_prob`).

``action_dist_inputs`` has RLlib's layout: for ``Discrete(n)`` the ``n`` logits (what
``TorchCategorical.from_logits`` takes), for a ``Box`` of ``d`` elements
``concat(mean, log_std)``, ``2 * d`` values (what ``TorchDiagGaussian.from_logits`` splits
in two halves), the state-independent ``log_std`` repeated at every step.

* ``Discrete(n)`` actions: categorical over ``n`` logits.
* ``Box`` actions: diagonal Gaussian with a state-independent, learned ``log_std``. The
  sampled action is stored unclipped (so ``action_logp`` is its exact log-density); envs
  clip to their bounds, as Gymnasium's continuous envs do.

Observations must be a ``Box`` (flattened after the batch dims) or ``Discrete``
(one-hot encoded), or a *masked observation* with ``Discrete`` actions:
``Dict(observations=<Box or Discrete>, action_mask=Box((n,)))`` (bool, or 0/1 int/float;
see :mod:`jaxsampler.transforms.mask`). Then the network reads ``"observations"`` only,
and the logits of illegal actions (mask entry 0) are replaced by :data:`MASKED_LOGIT`
before sampling, before the argmax (``explore=False``) and in ``log_prob``, so every
sampled or greedy action is legal and ``action_logp`` is the masked distribution's.
``action_dist_inputs`` (and ``forward``'s logits) are the *masked* logits, as RLlib's
action-masking module hands them to its loss, so a learner that rebuilds the
distribution from them gets the masked one. An all-zero mask (no legal action) masks
nothing: that agent acts from the unmasked logits (NaN-free; it happens for agents that
do not act, e.g. on a full TicTacToe board, whose actions are ignored; for an acting
agent it is an env bug that ``check_env`` reports).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxsampler import vector
from jaxsampler.policies.base import NoState, Policy, batch_dims
from jaxsampler.policies.rows import extra_budgets, rows_pass
from jaxsampler.spaces import Box, Discrete, Space
from jaxsampler.transforms.mask import MASK_KEY, OBS_KEY, legal_actions, split_masked_space

__all__ = ["MLPPolicy", "RecurrentPolicy", "ActorCriticMLP", "action_dim", "mask_logits"]

#: What an illegal action's logit becomes. ``exp(-1e9 - max)`` is exactly 0 in float32,
#: so the action has probability 0, never wins the argmax nor the Gumbel-max sampling
#: (noise stays within about [-5, 17]), and the legal actions' log-probabilities are
#: bit-identical to a softmax over the legal ones only (the same as RLlib's
#: ``logits + clamp(log(mask), FLOAT_MIN)``). Unlike ``finfo(float32).min`` it stays
#: finite under a learner's further arithmetic (a temperature, a difference of logits,
#: a sum), where ``finfo.min`` overflows to ``-inf`` and ``0 * -inf`` turns an entropy
#: or KL term into NaN.
MASKED_LOGIT = -1e9

_ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu, "gelu": nn.gelu, "silu": nn.silu}


def action_dim(space: Space) -> int:
    """Number of network outputs the action head needs (logits or Gaussian means)."""
    if isinstance(space, Discrete):
        return space.n
    if isinstance(space, Box) and np.issubdtype(space.dtype, np.floating):
        return int(np.prod(space.shape, dtype=np.int64))
    raise TypeError(
        f"actor-critic policies support Discrete or float Box action spaces, got {space!r}"
    )


def _network_space(space: Space, action_space: Space) -> Space:
    """The space the network reads: ``space``, or the ``"observations"`` of a masked one.

    Raises:
        TypeError: neither a Box / Discrete nor a masked observation of one, or a mask
            with an action space other than ``Discrete``.
        ValueError: a malformed masked observation space (the message names it).
    """
    split = split_masked_space(space, action_space)
    if split is not None:
        if not isinstance(action_space, Discrete):
            raise TypeError(
                f"actor-critic policies mask Discrete actions only, got {action_space!r} "
                f"with the masked observation space {space!r}"
            )
        space = split[0]
    if not isinstance(space, (Box, Discrete)):
        raise TypeError(
            "actor-critic policies need a Box or Discrete observation space, or a masked "
            f"Dict({OBS_KEY!r}: Box or Discrete, {MASK_KEY!r}: Box((n,))), got {space!r}"
        )
    return space


def mask_logits(logits: jax.Array, mask: jax.Array | None) -> jax.Array:
    """``logits`` (``[..., n]``) with the entries where ``mask`` (``[..., n]``, bool or
    0/1) is 0 replaced by :data:`MASKED_LOGIT`; a row with no legal entry is left as it
    is (masks nothing). ``mask=None``: unchanged. Pure; safe under jit and vmap."""
    if mask is None:
        return logits
    legal = legal_actions(mask)
    keep = legal | ~jnp.any(legal, axis=-1, keepdims=True)
    return jnp.where(keep, logits, jnp.asarray(MASKED_LOGIT, logits.dtype))


def _split_obs(obs: Any, space: Space, action_space: Space) -> tuple[Any, jax.Array | None]:
    """``(network input, mask or None)`` of a batch of observations of ``space``."""
    if split_masked_space(space, action_space) is None:
        return obs, None
    return obs[OBS_KEY], obs[MASK_KEY]


def _flatten_obs(obs: jax.Array, space: Space) -> jax.Array:
    """``[*batch, *obs_shape]`` -> ``float32[*batch, features]``."""
    if isinstance(space, Discrete):
        return jax.nn.one_hot(obs - space.start, space.n, dtype=jnp.float32)
    batch = obs.shape[: obs.ndim - len(space.shape)]
    return obs.reshape(batch + (-1,)).astype(jnp.float32)


def _mlp(x: jax.Array, sizes: Sequence[int], act: Any, prefix: str) -> jax.Array:
    for i, h in enumerate(sizes):
        x = act(
            nn.Dense(h, kernel_init=nn.initializers.orthogonal(math.sqrt(2)), name=f"{prefix}_{i}")(
                x
            )
        )
    return x


def actor_critic_heads(
    module: Any, x: jax.Array, act: Any
) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """The actor and critic MLPs of ``module`` (fields ``num_outputs``, ``hidden_sizes``,
    ``continuous``) on features ``x`` ``[B, F]``: ``(dist_inputs [B, k], value [B], log_std
    [k] or None)``. Call from the module's ``nn.compact`` method (the layers are its own:
    ``actor_*``, ``actor_out``, ``critic_*``, ``critic_out``, ``log_std``)."""
    a = _mlp(x, module.hidden_sizes, act, "actor")
    out = nn.Dense(
        module.num_outputs, kernel_init=nn.initializers.orthogonal(0.01), name="actor_out"
    )(a)
    c = _mlp(x, module.hidden_sizes, act, "critic")
    value = nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0), name="critic_out")(c)[..., 0]
    log_std = (
        module.param("log_std", nn.initializers.zeros, (module.num_outputs,))
        if module.continuous
        else None
    )
    return out, value, log_std


class ActorCriticMLP(nn.Module):
    """Separate actor and critic MLPs (the PureJaxRL layout). ``x``: ``float32[B, F]``.

    Returns ``(dist_inputs float32[B, k], value float32[B], log_std float32[k] or None)``.
    """

    num_outputs: int
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"
    continuous: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array | None]:
        return actor_critic_heads(self, x, _ACTIVATIONS[self.activation])


def _act(
    space: Space,
    dist_inputs: jax.Array,
    value: jax.Array,
    log_std: jax.Array | None,
    key: jax.Array,
    explore: bool,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """``(action, extras)`` of an actor-critic's outputs: the sampled (or greedy) action
    and the extras every policy here returns (see the module docstring)."""
    action, logp = _sample_action(space, dist_inputs, log_std, key, explore)
    extras = {
        "action_dist_inputs": rllib_dist_inputs(dist_inputs, log_std),
        "action_logp": logp,
        "vf_preds": value,
    }
    return action, extras


def _sample_action(
    space: Space, dist_inputs: jax.Array, log_std: jax.Array | None, key: jax.Array, explore: bool
) -> tuple[jax.Array, jax.Array]:
    """Samples from the action distribution; returns ``(action, logp)``."""
    if isinstance(space, Discrete):
        logits = dist_inputs
        action = jax.random.categorical(key, logits) if explore else jnp.argmax(logits, -1)
        logp_all = jax.nn.log_softmax(logits)
        logp = jnp.take_along_axis(logp_all, action[..., None], -1)[..., 0]
        return (action + space.start).astype(space.dtype), logp
    if log_std is None:
        raise ValueError(f"sampling from {space!r} needs a log_std (continuous actions)")
    mean = dist_inputs
    std = jnp.exp(log_std)
    eps = jax.random.normal(key, mean.shape, mean.dtype) if explore else jnp.zeros_like(mean)
    flat = mean + std * eps
    logp = jnp.sum(-0.5 * eps**2 - log_std - 0.5 * math.log(2 * math.pi), axis=-1)
    action = flat.reshape(flat.shape[:-1] + space.shape).astype(space.dtype)
    return action, logp


def rllib_dist_inputs(dist_inputs: jax.Array, log_std: jax.Array | None) -> jax.Array:
    """RLlib's ``action_dist_inputs``: the logits, or ``concat(mean, log_std)`` (``log_std``
    broadcast to the batch) for a diagonal Gaussian. Pure."""
    if log_std is None:
        return dist_inputs
    return jnp.concatenate(
        [dist_inputs, jnp.broadcast_to(log_std, dist_inputs.shape).astype(dist_inputs.dtype)], -1
    )


def log_prob(
    space: Space, dist_inputs: jax.Array, log_std: jax.Array | None, action: jax.Array
) -> jax.Array:
    """Log-probability of ``action`` under the policy's distribution (for learners)."""
    if isinstance(space, Discrete):
        logp_all = jax.nn.log_softmax(dist_inputs)
        idx = (action - space.start).astype(jnp.int32)
        return jnp.take_along_axis(logp_all, idx[..., None], -1)[..., 0]
    if log_std is None:
        raise ValueError(f"the log-probability under {space!r} needs a log_std")
    flat = action.reshape(action.shape[: action.ndim - len(space.shape)] + (-1,))
    z = (flat - dist_inputs) / jnp.exp(log_std)
    return jnp.sum(-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi), axis=-1)


class FeedForwardActorCritic(Policy):
    """What the stateless actor-critics (:class:`MLPPolicy`, ``CNNPolicy``) share: acting
    and log-probabilities on top of their ``forward(params, obs) -> (dist_inputs, value,
    log_std)``. Subclasses define ``forward``, ``action_space`` and ``explore``."""

    #: Sample (True) or act greedily (False); a field of each subclass (not of this base).
    explore: bool

    def forward(self, params: Any, obs: Any) -> tuple[jax.Array, jax.Array, jax.Array | None]:
        """The network's outputs for observations with leaves ``[*batch, ...]`` (subclasses
        implement it).

        Returns:
            ``(dist_inputs, value, log_std)``: ``float32[*batch, k]`` (logits, masked with a
            masked observation space, or Gaussian means), ``float32[*batch]``, and the
            state-independent ``float32[k]`` (``None`` for discrete actions). Pure.
        """
        raise NotImplementedError

    def __call__(
        self, params: Any, obs: Any, key: jax.Array, policy_state: Any
    ) -> tuple[Any, dict[str, jax.Array], Any]:
        dist_inputs, value, log_std = self.forward(params, obs)
        action, extras = _act(self.action_space, dist_inputs, value, log_std, key, self.explore)
        return action, extras, policy_state

    @property
    def acts_on_rows(self) -> bool:
        """True unless a subclass changes how it acts (overrides ``__call__`` or
        :meth:`act_on_rows` no longer matches it): then the rollout calls ``__call__``."""
        cls = type(self)
        return (
            cls.__call__ is FeedForwardActorCritic.__call__
            and cls.act_on_rows is FeedForwardActorCritic.act_on_rows
        )

    @property
    def values_on_rows(self) -> bool:
        """:meth:`act_on_rows` takes ``value_rows`` whenever it runs (:attr:`acts_on_rows`)."""
        return self.acts_on_rows

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
        """``__call__`` with the actor on the agent rows ``rows`` only (``int32[E, k]``;
        see :meth:`Policy.act_on_rows`): the actor runs on those rows and the actions are
        drawn for them alone, then put back in place (the other agents get zero actions,
        ``action_dist_inputs`` and ``action_logp``). The random draws are for ``[E, k]``,
        not ``[E, A]`` (drawing for every agent costs as much as the network here), so a
        sampling policy's actions are other draws from the same distributions than
        ``__call__``'s; a greedy one's are the same.

        ``vf_preds``: with ``value_rows=None`` the critic runs on every row, as in
        ``__call__`` (a second pass, XLA dropping its actor). With a ``bool[E, A]`` mask
        (the rollout passes the acting agents and every agent of a resetting env, the
        rows GAE and n-step returns read) the actor runs on the acting rows and the critic
        on those and the masked others, within the smallest budget of rows they fit
        (:func:`~jaxsampler.policies.rows.rows_pass`); the other rows get 0. Pure.
        """
        E, num_agents = batch_dims(obs, self.observation_space)[:2]
        if value_rows is None:
            _, value, _ = self.forward(params, obs)
            dist_inputs, _, log_std = self.forward(params, vector.gather_agents(obs, rows))
        else:
            stds: list[jax.Array | None] = []  # log_std is a param, not a row output

            def net(x: Any) -> tuple[jax.Array, jax.Array]:
                d, v, s = self.forward(params, x)
                stds.append(s)
                return d, v

            budget = extra_budgets(E, num_agents, rows.shape[-1])
            dist_inputs, value = rows_pass(net, obs, rows, value_rows, budget)
            log_std = stds[0]  # from the actor's call (a fallback pass traces its own)
        placeholder = jnp.zeros(dist_inputs.shape[:2], value.dtype)
        action, extras = _act(
            self.action_space, dist_inputs, placeholder, log_std, key, self.explore
        )
        action, extras = vector.scatter_agents((action, extras), rows, num_agents)
        extras["vf_preds"] = value
        return action, extras, policy_state

    def log_prob(self, params: Any, obs: Any, action: jax.Array, policy_state: Any) -> Any:
        """Log-probability of ``action`` (``[*batch, *action_space.shape]``) at ``obs``
        (leaves ``[*batch, ...]``), under the masked distribution if the observation
        carries a mask: ``float32[*batch]``; ``policy_state`` is unused. Pure."""
        dist_inputs, _, log_std = self.forward(params, obs)
        return log_prob(self.action_space, dist_inputs, log_std, action)


@dataclasses.dataclass(frozen=True)
class MLPPolicy(FeedForwardActorCritic):
    """Feed-forward actor-critic policy.

    Args:
        observation_space: one agent's observation space: Box or Discrete, or a masked
            ``Dict(observations=..., action_mask=...)`` with Discrete actions (see the
            module docstring).
        action_space: Discrete or float Box.
        hidden_sizes: widths of the actor's and critic's hidden layers.
        activation: ``"tanh"``, ``"relu"``, ``"gelu"`` or ``"silu"``.
        explore: sample actions (True) or act greedily (argmax / mean).
    """

    observation_space: Space
    action_space: Space
    hidden_sizes: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    explore: bool = True

    def __post_init__(self) -> None:
        _network_space(self.observation_space, self.action_space)
        action_dim(self.action_space)
        if self.activation not in _ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {sorted(_ACTIVATIONS)}, got {self.activation!r}"
            )
        object.__setattr__(self, "hidden_sizes", tuple(int(h) for h in self.hidden_sizes))

    @property
    def module(self) -> ActorCriticMLP:
        """The flax :class:`ActorCriticMLP` the params belong to, built from this policy's
        fields (cheap; holds no params)."""
        return ActorCriticMLP(
            action_dim(self.action_space),
            self.hidden_sizes,
            self.activation,
            isinstance(self.action_space, Box),
        )

    @property
    def network_space(self) -> Space:
        """The observation space the network reads (``"observations"`` of a masked one)."""
        return _network_space(self.observation_space, self.action_space)

    def init(self, key: jax.Array) -> Any:
        """Fresh params of :attr:`module`, initialised on one zero observation (flattened, or
        one-hot for ``Discrete``). Pure."""
        space = self.network_space
        return self.module.init(key, _flatten_obs(space.zeros()[None], space))

    def forward(self, params: Any, obs: Any) -> tuple[jax.Array, jax.Array, jax.Array | None]:
        """``(dist_inputs, value, log_std)`` for a batch of observations (for learners);
        with a masked observation space the logits are masked (:func:`mask_logits`)."""
        obs, mask = _split_obs(obs, self.observation_space, self.action_space)
        x = _flatten_obs(obs, self.network_space)
        batch = x.shape[:-1]
        # One 2-D matmul per layer: XLA's CPU dot is fastest on [rows, features].
        outputs: Any = self.module.apply(params, x.reshape(-1, x.shape[-1]))
        out, value, log_std = outputs
        out = mask_logits(out.reshape(batch + out.shape[-1:]), mask)
        return out, value.reshape(batch), log_std


class _GRUActorCritic(nn.Module):
    num_outputs: int
    hidden_size: int
    continuous: bool

    @nn.compact
    def __call__(
        self, carry: jax.Array, x: jax.Array
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array | None]]:
        x = nn.tanh(nn.Dense(self.hidden_size, name="embed")(x))
        carry, h = nn.GRUCell(self.hidden_size, name="gru")(carry, x)
        out = nn.Dense(
            self.num_outputs, kernel_init=nn.initializers.orthogonal(0.01), name="actor_out"
        )(h)
        value = nn.Dense(1, name="critic_out")(h)[..., 0]
        log_std = (
            self.param("log_std", nn.initializers.zeros, (self.num_outputs,))
            if self.continuous
            else None
        )
        return carry, (out, value, log_std)


@dataclasses.dataclass(frozen=True)
class RecurrentPolicy(Policy):
    """Actor-critic with a GRU core; the state is the GRU carry ``float32[*batch, hidden]``.

    The rollout resets the carry to zeros at the first step of every episode and carries
    it across steps and across rollout calls (``RolloutState.policy_state``). Takes
    masked observations like :class:`MLPPolicy` (the GRU reads ``"observations"``).
    """

    observation_space: Space
    action_space: Space
    hidden_size: int = 64
    explore: bool = True

    def __post_init__(self) -> None:
        _network_space(self.observation_space, self.action_space)
        action_dim(self.action_space)

    @property
    def network_space(self) -> Space:
        """The observation space the GRU reads (``"observations"`` of a masked one)."""
        return _network_space(self.observation_space, self.action_space)

    def _apply(
        self, params: Any, obs: Any, policy_state: jax.Array
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array | None]]:
        """``(carry, (masked dist_inputs, value, log_std))`` of one step."""
        obs, mask = _split_obs(obs, self.observation_space, self.action_space)
        outputs: Any = self.module.apply(
            params, policy_state, _flatten_obs(obs, self.network_space)
        )
        carry, (dist_inputs, value, log_std) = outputs
        return carry, (mask_logits(dist_inputs, mask), value, log_std)

    @property
    def module(self) -> _GRUActorCritic:
        """The flax GRU actor-critic (embedding, ``GRUCell``, actor and critic heads) the params
        belong to, built from this policy's fields."""
        return _GRUActorCritic(
            action_dim(self.action_space), self.hidden_size, isinstance(self.action_space, Box)
        )

    def init(self, key: jax.Array) -> Any:
        """Fresh params of :attr:`module`, initialised on one zero observation and a zero
        carry. Pure."""
        space = self.network_space
        x = _flatten_obs(space.zeros()[None], space)
        return self.module.init(key, self.initial_state((1,)), x)

    def initial_state(self, batch_shape: tuple[int, ...]) -> jax.Array:
        """The GRU carry at an episode start: ``float32[*batch_shape, hidden_size]`` zeros."""
        return jnp.zeros(tuple(batch_shape) + (self.hidden_size,), jnp.float32)

    def __call__(
        self, params: Any, obs: Any, key: jax.Array, policy_state: jax.Array
    ) -> tuple[Any, dict[str, jax.Array], Any]:
        carry, (dist_inputs, value, log_std) = self._apply(params, obs, policy_state)
        action, extras = _act(self.action_space, dist_inputs, value, log_std, key, self.explore)
        return action, extras, carry

    def log_prob(self, params: Any, obs: Any, action: jax.Array, policy_state: jax.Array) -> Any:
        """Log-probability of ``action`` at ``obs`` given the GRU carry *before* the step
        (``policy_state``, ``float32[*batch, hidden]``), under the masked distribution if
        the observation carries a mask: ``float32[*batch]``. Pure."""
        _, (dist_inputs, _, log_std) = self._apply(params, obs, policy_state)
        return log_prob(self.action_space, dist_inputs, log_std, action)


# Re-exported for convenience.
__all__ += ["MASKED_LOGIT", "NoState", "batch_dims", "log_prob", "rllib_dist_inputs"]
