"""A Flax actor-critic policy with a small convolutional torso, for grid observations.

:class:`CNNPolicy` follows the same protocol and conventions as
:class:`~jaxsampler.policies.mlp.MLPPolicy` (``init`` / ``forward`` / ``__call__`` /
``log_prob``; ``extras = {"action_dist_inputs", "action_logp", "vf_preds"}`` with RLlib's
layout), so a learner written for the MLP takes it unchanged. Only the network differs:

    obs [*batch, H, W, C] -> Conv(features, kernel x kernel, stride 1, VALID) -> activation
        -> flatten -> actor MLP (hidden_sizes) -> logits / Gaussian means
                   -> critic MLP (hidden_sizes) -> value

The convolution is shared by actor and critic; each has its own dense layers. The defaults
(one 3x3 convolution with 16 channels, one dense layer of 128 units, ReLU) are the size of
the network MinAtar's authors used for their DQN baselines on the ``[10, 10, C]`` grids.

Observations must be a ``Box`` of rank 3 (``[H, W, C]``, channels last; any numeric dtype,
cast to float32), or a masked ``Dict(observations=Box([H, W, C]), action_mask=Box((n,)))``
with ``Discrete`` actions (see :mod:`jaxsampler.transforms.mask`): the illegal logits are
replaced by :data:`~jaxsampler.policies.mlp.MASKED_LOGIT` exactly as for the MLP. Actions:
``Discrete(n)`` (categorical) or a float ``Box`` (diagonal Gaussian, state-independent
learned ``log_std``, stored unclipped).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxsampler.policies.mlp import (
    _ACTIVATIONS,
    FeedForwardActorCritic,
    _network_space,
    _split_obs,
    action_dim,
    actor_critic_heads,
    mask_logits,
)
from jaxsampler.spaces import Box, Space

__all__ = ["CNNPolicy", "ActorCriticCNN"]


class ActorCriticCNN(nn.Module):
    """Shared conv torso, separate actor and critic MLPs. ``x``: ``float32[B, H, W, C]``.

    Returns ``(dist_inputs float32[B, k], value float32[B], log_std float32[k] or None)``.
    """

    num_outputs: int
    conv_features: int = 16
    kernel_size: int = 3
    hidden_sizes: tuple[int, ...] = (128,)
    activation: str = "relu"
    continuous: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array | None]:
        act = _ACTIVATIONS[self.activation]
        k = self.kernel_size
        x = nn.Conv(
            self.conv_features,
            (k, k),
            padding="VALID",
            kernel_init=nn.initializers.orthogonal(math.sqrt(2)),
            name="conv",
        )(x)
        x = act(x).reshape(x.shape[0], -1)
        return actor_critic_heads(self, x, act)


@dataclasses.dataclass(frozen=True)
class CNNPolicy(FeedForwardActorCritic):
    """Convolutional actor-critic policy for ``[H, W, C]`` grid observations.

    Args:
        observation_space: one agent's observation space: a rank-3 ``Box`` ``[H, W, C]``,
            or a masked ``Dict(observations=..., action_mask=...)`` of one with Discrete
            actions.
        action_space: Discrete or float Box.
        conv_features: output channels of the convolution.
        kernel_size: its square kernel's side (VALID padding, stride 1), at most ``H``
            and ``W``.
        hidden_sizes: widths of the actor's and critic's dense hidden layers.
        activation: ``"tanh"``, ``"relu"``, ``"gelu"`` or ``"silu"``.
        explore: sample actions (True) or act greedily (argmax / mean).

    Raises:
        TypeError: an observation space that is not a rank-3 Box (or a masked one), a
            mask with non-Discrete actions, or an unsupported action space.
        ValueError: a bad activation, a kernel larger than the grid, or non-positive sizes.
    """

    observation_space: Space
    action_space: Space
    conv_features: int = 16
    kernel_size: int = 3
    hidden_sizes: tuple[int, ...] = (128,)
    activation: str = "relu"
    explore: bool = True

    def __post_init__(self) -> None:
        space = _network_space(self.observation_space, self.action_space)
        if not isinstance(space, Box) or len(space.shape) != 3:
            raise TypeError(
                "CNNPolicy needs a Box observation space of rank 3 ([H, W, C], channels "
                f"last), or a masked one, got {space!r}"
            )
        action_dim(self.action_space)
        if self.activation not in _ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {sorted(_ACTIVATIONS)}, got {self.activation!r}"
            )
        object.__setattr__(self, "hidden_sizes", tuple(int(h) for h in self.hidden_sizes))
        sizes = (self.conv_features, self.kernel_size, *self.hidden_sizes)
        if min(sizes) < 1:
            raise ValueError(
                "conv_features, kernel_size and hidden_sizes must be >= 1, got "
                f"{self.conv_features}, {self.kernel_size}, {self.hidden_sizes}"
            )
        h, w, _ = space.shape
        if self.kernel_size > min(h, w):
            raise ValueError(
                f"kernel_size {self.kernel_size} is larger than the {h}x{w} observation grid"
            )

    @property
    def network_space(self) -> Space:
        """The observation space the network reads (``"observations"`` of a masked one)."""
        return _network_space(self.observation_space, self.action_space)

    @property
    def module(self) -> ActorCriticCNN:
        """The flax :class:`ActorCriticCNN` the params belong to, built from this policy's
        fields (cheap; holds no params)."""
        return ActorCriticCNN(
            action_dim(self.action_space),
            self.conv_features,
            self.kernel_size,
            self.hidden_sizes,
            self.activation,
            isinstance(self.action_space, Box),
        )

    def init(self, key: jax.Array) -> Any:
        """Fresh params of :attr:`module`, initialised on one zero ``[1, H, W, C]`` observation.
        Pure."""
        space = self.network_space
        return self.module.init(key, jnp.zeros((1, *space.shape), jnp.float32))

    def forward(self, params: Any, obs: Any) -> tuple[jax.Array, jax.Array, jax.Array | None]:
        """``(dist_inputs float32[*batch, k], value float32[*batch], log_std float32[k] or
        None)`` for observations ``[*batch, H, W, C]``; with a masked observation space the
        logits are masked (:func:`~jaxsampler.policies.mlp.mask_logits`). Pure."""
        obs, mask = _split_obs(obs, self.observation_space, self.action_space)
        grid = self.network_space.shape
        batch = obs.shape[: obs.ndim - 3]
        x = obs.reshape((-1, *grid)).astype(jnp.float32)  # conv wants exactly one batch dim
        outputs: Any = self.module.apply(params, x)
        out, value, log_std = outputs
        out = mask_logits(out.reshape(batch + out.shape[-1:]), mask)
        return out, value.reshape(batch), log_std
