"""Mirror RLlib's default PPO (and DQN) torch RLModule as a jaxsampler policy.

RLlib's default DQN torch module (``DefaultDQNTorchRLModule``) is mirrored by
:mod:`jaxsampler.integrations.rllib.dqn_module` (``policy_from_rl_module`` dispatches to
it): Q-values from the same encoder and dueling heads, greedy or RLlib's epsilon-greedy
exploration with epsilon as a param. The rest of this docstring is about PPO.

:func:`policy_from_rl_module` reads the structure of an RLlib 2.60
``DefaultPPOTorchRLModule`` (what ``PPOConfig().rl_module(model_config=DefaultModelConfig(...))``
builds for a 1-D ``Box`` observation space) and returns an equivalent
:class:`RLModulePolicy` plus its params: the same MLP encoder(s) (``fcnet_hiddens``,
``fcnet_activation``, ``fcnet_use_layernorm``, ``vf_share_layers`` on or off), the same pi and
vf heads (``head_fcnet_hiddens``, ``head_fcnet_activation``, ``head_fcnet_use_layernorm``) and
the same action distribution: ``TorchCategorical`` for ``Discrete`` actions,
``TorchDiagGaussian`` for ``Box`` actions, with the log-std from the pi head
(``free_log_std=False``) or a free parameter (``free_log_std=True``), clipped to
``[-log_std_clip_param, log_std_clip_param]`` as RLlib's pi head does.

:func:`params_from_module_state` turns the module's state (``module.get_state()``, what an
``EnvRunner.set_state`` receives under ``"rl_module"``) into new params for an already built
policy, with the same pytree structure, shapes and dtypes every time, so a jitted rollout is
not traced again.

The params are a flat ``dict`` from the module's state key (for example
``"encoder.actor_encoder.net.mlp.0.weight"``) to a ``float32`` array in torch's layout (dense
weights ``[out, in]``): a weight sync is one host-to-device copy per tensor.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxsampler.integrations.rllib._layers import (
    Layer,
    _mlp_encoder,
    _out_dim,
    _sequential_layers,
    _unsupported,
    check_input_dim,
    features,
    layer_shapes,
    params_from_module_state,
    random_params,
    run_layers,
)
from jaxsampler.policies.base import Policy
from jaxsampler.spaces import Box, Discrete, Space, convert_space

__all__ = ["RLModulePolicy", "policy_from_rl_module", "params_from_module_state"]


@dataclasses.dataclass(frozen=True)
class RLModulePolicy(Policy):
    """A jaxsampler policy equal to an RLlib default PPO torch RLModule.

    Build it with :func:`policy_from_rl_module`; the fields describe the module's layers
    (static, hashable) and are not meant to be filled in by hand.

    ``__call__(params, obs, key, policy_state) -> (action, extras, policy_state)`` computes
    the module's ``action_dist_inputs`` (what ``forward_inference`` /
    ``forward_exploration`` return), then, as RLlib's ``GetActions`` connector does, samples
    from the action distribution (``explore=True``; ``action_logp`` is the sample's
    log-probability) or takes its deterministic action (``explore=False``: argmax of the
    logits, or the Gaussian mean; ``action_logp`` is ``0.0``, the log-probability RLlib's
    ``TorchDeterministic`` reports). Extras: ``action_dist_inputs`` (``float32[*batch, n]``
    logits, or ``float32[*batch, 2 * dim]`` = concat(mean, log_std)), ``action_logp``
    (``float32[*batch]``) and, when the module has a value head (it is not
    ``inference_only``), ``vf_preds`` (``float32[*batch]``, ``compute_values``).
    Box actions are returned unclipped and unscaled, as RLlib's module samples them (RLlib's
    env runner then unsquashes/clips them for the env, per ``normalize_actions`` /
    ``clip_actions``).

    Attributes:
        observation_space: the observation space (1-D Box; or any space whose one-hot /
            flattened size is the encoder's input size).
        action_space: ``Discrete`` or float ``Box``.
        actor_encoder: layers of the actor (or shared) encoder.
        critic_encoder: layers of the separate critic encoder; ``None`` when the layers are
            shared (``vf_share_layers=True``) or the module has no value function.
        pi_head: layers of the pi head.
        vf_head: layers of the vf head; ``None`` for an ``inference_only`` module.
        free_log_std_key: state key of the free log-std parameter (``free_log_std=True``),
            else ``""``.
        log_std_clip: the clip of the Gaussian log-std (``None``: not clipped, for
            Discrete actions).
        explore: sample (True) or act deterministically (False).
        matmul_precision: ``jax.lax.Precision`` name for the dense layers (``None``: JAX's
            default). On GPUs and TPUs JAX's default float32 matmul may use TF32/bfloat16
            passes; ``"highest"`` matches torch's float32 CPU results to float32 tolerance.
    """

    observation_space: Space
    action_space: Space
    actor_encoder: tuple[Layer, ...]
    critic_encoder: tuple[Layer, ...] | None
    pi_head: tuple[Layer, ...]
    vf_head: tuple[Layer, ...] | None
    free_log_std_key: str = ""
    log_std_clip: float | None = None
    explore: bool = True
    matmul_precision: str | None = None

    @property
    def has_value(self) -> bool:
        """Whether the policy computes ``vf_preds`` (the module has a value head)."""
        return self.vf_head is not None

    def extra_params(self) -> dict[str, np.ndarray]:
        """Params that are not module weights: none for the PPO mirror."""
        return {}

    def at_timestep(self, params: dict[str, Any], timestep: int) -> dict[str, Any]:
        """``params`` for acting at RLlib's lifetime env step ``timestep``: unchanged (the
        PPO module's exploration does not depend on the timestep)."""
        return params

    @property
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """State key -> shape of every param the policy reads."""
        shapes = layer_shapes(
            layer
            for layers in (self.actor_encoder, self.critic_encoder, self.pi_head, self.vf_head)
            for layer in layers or ()
        )
        if self.free_log_std_key:
            shapes[self.free_log_std_key] = (_action_size(self.action_space),)
        return shapes

    def init(self, key: jax.Array) -> dict[str, jax.Array]:
        """Random params of the right structure (for tests; real ones come from the module)."""
        return random_params(key, self.param_shapes)

    def _features(self, obs: Any) -> tuple[jax.Array, tuple[int, ...]]:
        return features(self.observation_space, obs)

    def action_dist_inputs(self, params: Mapping[str, jax.Array], obs: Any) -> jax.Array:
        """The module's ``action_dist_inputs`` for ``obs`` (leaves ``[*batch, *obs_shape]``).

        Returns:
            ``float32[*batch, n]`` logits (Discrete) or ``float32[*batch, 2 * dim]``
            concat(mean, log_std) (Box). Pure: safe under ``jit`` and ``vmap``.
        """
        x, batch = self._features(obs)
        out = self._pi(params, self._run(self.actor_encoder, params, x))
        return out.reshape(batch + out.shape[-1:])

    def values(self, params: Mapping[str, jax.Array], obs: Any) -> jax.Array:
        """The module's ``compute_values`` for ``obs``: ``float32[*batch]``. Pure.

        Raises:
            ValueError: the module has no value head (``inference_only``).
        """
        if self.vf_head is None:
            raise ValueError(
                "this policy mirrors an inference-only RLModule (no value head): values "
                "are not available; mirror the learner's module (inference_only=False)"
            )
        x, batch = self._features(obs)
        emb = self._run(self.critic_encoder or self.actor_encoder, params, x)
        return self._run(self.vf_head, params, emb)[..., 0].reshape(batch)

    def _pi(self, params: Mapping[str, jax.Array], emb: jax.Array) -> jax.Array:
        out = self._run(self.pi_head, params, emb)
        if self.log_std_clip is None:
            return out
        if self.free_log_std_key:
            mean = out
            log_std = jnp.broadcast_to(params[self.free_log_std_key], mean.shape)
        else:
            mean, log_std = jnp.split(out, 2, axis=-1)
        log_std = jnp.clip(log_std, -self.log_std_clip, self.log_std_clip)
        return jnp.concatenate([mean, log_std], axis=-1)

    def __call__(
        self, params: Any, obs: Any, key: jax.Array, policy_state: Any
    ) -> tuple[Any, dict[str, jax.Array], Any]:
        x, batch = self._features(obs)
        actor = self._run(self.actor_encoder, params, x)
        dist_inputs = self._pi(params, actor)
        action, logp = self._sample(dist_inputs, key)
        extras = {
            "action_dist_inputs": dist_inputs.reshape(batch + dist_inputs.shape[-1:]),
            "action_logp": logp.reshape(batch),
        }
        if self.vf_head is not None:
            emb = (
                actor if self.critic_encoder is None else self._run(self.critic_encoder, params, x)
            )
            extras["vf_preds"] = self._run(self.vf_head, params, emb)[..., 0].reshape(batch)
        return action.reshape(batch + action.shape[1:]), extras, policy_state

    def _run(
        self, layers: tuple[Layer, ...], params: Mapping[str, jax.Array], x: jax.Array
    ) -> jax.Array:
        return run_layers(layers, params, x, self.matmul_precision)

    def _sample(self, dist_inputs: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        space = self.action_space
        zero = jnp.zeros(dist_inputs.shape[:-1], jnp.float32)
        if isinstance(space, Discrete):
            if self.explore:
                idx = jax.random.categorical(key, dist_inputs)
                logp = _categorical_logp(dist_inputs, idx)
            else:
                idx, logp = jnp.argmax(dist_inputs, -1), zero
            return (idx + space.start).astype(space.dtype), logp
        assert isinstance(space, Box)
        mean, log_std = jnp.split(dist_inputs, 2, axis=-1)
        if self.explore:
            flat = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape, mean.dtype)
            logp = _gaussian_logp(mean, log_std, flat)
        else:
            flat, logp = mean, zero
        return flat.reshape(flat.shape[:1] + space.shape).astype(space.dtype), logp

    def log_prob(self, params: Any, obs: Any, action: Any, policy_state: Any) -> jax.Array:
        """Log-probability (density for Box) of ``action`` at ``obs`` under the module's
        action distribution (what RLlib's ``action_dist_class.from_logits(...).logp`` gives):
        ``float32[*batch]``; ``policy_state`` is unused. Pure."""
        dist_inputs = self.action_dist_inputs(params, obs)
        space = self.action_space
        if isinstance(space, Discrete):
            return _categorical_logp(dist_inputs, (action - space.start).astype(jnp.int32))
        flat = action.reshape(action.shape[: action.ndim - len(space.shape)] + (-1,))
        mean, log_std = jnp.split(dist_inputs, 2, axis=-1)
        return _gaussian_logp(mean, log_std, flat.astype(jnp.float32))


def _categorical_logp(logits: jax.Array, idx: jax.Array) -> jax.Array:
    logp_all = jax.nn.log_softmax(logits)
    return jnp.take_along_axis(logp_all, idx[..., None].astype(jnp.int32), -1)[..., 0]


def _gaussian_logp(mean: jax.Array, log_std: jax.Array, x: jax.Array) -> jax.Array:
    # The operation order of torch's Normal(loc, exp(log_std)).log_prob, for equal rounding.
    scale = jnp.exp(log_std)
    per_dim = -jnp.square(x - mean) / (2 * jnp.square(scale)) - jnp.log(scale)
    return jnp.sum(per_dim - math.log(math.sqrt(2 * math.pi)), axis=-1)


def _action_size(space: Space) -> int:
    if isinstance(space, Discrete):
        return space.n
    return int(np.prod(space.shape, dtype=np.int64))


def policy_from_rl_module(
    module: Any,
    *,
    explore: bool = True,
    observation_space: Space | None = None,
    matmul_precision: str | None = None,
) -> tuple[RLModulePolicy, dict[str, jax.Array]]:
    """An equivalent jaxsampler policy for an RLlib default PPO or DQN torch RLModule, and
    its params.

    Args:
        module: a built ``DefaultPPOTorchRLModule`` (e.g.
            ``config.get_rl_module_spec(env=...).build()``, ``algo.get_module()``, an env
            runner's ``module``), or an ``RLModuleSpec`` (built here). An
            ``inference_only`` module (what RLlib's env runners hold) gives a policy without
            ``vf_preds``. A ``DefaultDQNTorchRLModule`` gives a
            :class:`~jaxsampler.integrations.rllib.dqn_module.DQNModulePolicy` (greedy or
            epsilon-greedy on the module's Q-values, see
            :func:`~jaxsampler.integrations.rllib.dqn_module.dqn_policy_from_rl_module`).
        explore: sample actions (``forward_exploration`` + sampling) or act
            deterministically (``forward_inference`` + the distribution's deterministic
            action), as RLlib's env runner does for ``explore=True`` / ``False``.
        observation_space: the env's observation space when it differs from the module's
            (e.g. ``Discrete`` observations one-hot encoded by a connector): Discrete is
            one-hot encoded, Box flattened; its size must equal the encoder's input size.
            Default: the module's ``observation_space``.
        matmul_precision: ``None`` (JAX's default), ``"default"``, ``"high"`` or
            ``"highest"`` (see :class:`RLModulePolicy`; use ``"highest"`` on a GPU or TPU for
            float32 agreement with torch).

    Returns:
        ``(policy, params)``: an :class:`RLModulePolicy` (a ``DQNModulePolicy`` for a DQN
        module) and params holding the module's current weights (see
        :func:`params_from_module_state`).

    Raises:
        TypeError: ``module`` is not RLlib's default PPO or DQN torch RLModule with an MLP
            encoder
            (a MultiRLModule, another algorithm's module, a custom module, a CNN or LSTM
            encoder, a non-torch module) or its spaces are not supported; the message names
            what is supported.
        ValueError: ``observation_space`` does not fit the encoder's input size, or an
            unknown ``matmul_precision``.
    """
    if matmul_precision not in (None, "default", "high", "highest"):
        raise ValueError(
            f"matmul_precision must be None, 'default', 'high' or 'highest', got "
            f"{matmul_precision!r}"
        )
    from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import (
        DefaultPPOTorchRLModule,
    )
    from ray.rllib.core.distribution.torch.torch_distribution import (
        TorchCategorical,
        TorchDiagGaussian,
    )
    from ray.rllib.core.models.torch.encoder import TorchActorCriticEncoder
    from ray.rllib.core.models.torch.heads import TorchFreeLogStdMLPHead, TorchMLPHead
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule, MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModule, RLModuleSpec

    if isinstance(module, MultiRLModuleSpec):
        raise _unsupported(
            "got a MultiRLModuleSpec; mirror each sub-module: "
            "policy_from_rl_module(spec.rl_module_specs[module_id])"
        )
    if isinstance(module, RLModuleSpec):
        module = module.build()
    if isinstance(module, MultiRLModule):
        raise _unsupported(
            "got a MultiRLModule; mirror each sub-module: policy_from_rl_module(multi_module["
            f"module_id]) for module_id in {sorted(module.keys())}"
        )
    if not isinstance(module, RLModule):
        raise _unsupported(f"got a {type(module).__name__}, not an RLlib RLModule")
    from ray.rllib.algorithms.dqn.torch.default_dqn_torch_rl_module import (
        DefaultDQNTorchRLModule,
    )

    if isinstance(module, DefaultDQNTorchRLModule):
        from jaxsampler.integrations.rllib.dqn_module import dqn_policy_from_rl_module

        return dqn_policy_from_rl_module(  # type: ignore[return-value]
            module,
            explore=explore,
            observation_space=observation_space,
            matmul_precision=matmul_precision,
        )
    if not isinstance(module, DefaultPPOTorchRLModule):
        raise _unsupported(
            f"got a {type(module).__name__} (framework {getattr(module, 'framework', None)!r})"
        )
    for method in (
        "_forward",
        "_forward_inference",
        "_forward_exploration",
        "_forward_train",
        "compute_values",
    ):
        if getattr(type(module), method) is not getattr(DefaultPPOTorchRLModule, method):
            raise _unsupported(f"{type(module).__name__} overrides {method}")

    action_space = convert_space(module.action_space)
    obs_space = observation_space or convert_space(module.observation_space)
    dist_cls = module.get_exploration_action_dist_cls()
    if dist_cls is not module.get_inference_action_dist_cls():
        raise _unsupported("exploration and inference action distributions differ")
    if isinstance(action_space, Discrete):
        if dist_cls is not TorchCategorical:
            raise _unsupported(f"Discrete actions with {dist_cls.__name__}")
    elif isinstance(action_space, Box) and np.issubdtype(action_space.dtype, np.floating):
        if dist_cls is not TorchDiagGaussian:
            raise _unsupported(f"Box actions with {dist_cls.__name__}")
    else:
        raise _unsupported(f"the action space {module.action_space}")
    if not isinstance(obs_space, (Box, Discrete)):
        raise _unsupported(f"the observation space {obs_space!r}")

    encoder = module.encoder
    if type(encoder) is not TorchActorCriticEncoder:
        raise _unsupported(
            f"module.encoder is a {type(encoder).__name__} (stateful/LSTM encoders are not "
            "mirrored)"
        )
    critic: tuple[Layer, ...] | None = None
    shared = bool(getattr(encoder.config, "shared", False))
    if shared:
        actor = _mlp_encoder(encoder.encoder, "encoder.encoder")
    else:
        actor = _mlp_encoder(encoder.actor_encoder, "encoder.actor_encoder")
        if getattr(encoder, "critic_encoder", None) is not None:
            critic = _mlp_encoder(encoder.critic_encoder, "encoder.critic_encoder")

    pi = module.pi
    free_log_std_key = ""
    if type(pi) is TorchFreeLogStdMLPHead:
        free_log_std_key = "pi.log_std"
    elif type(pi) is not TorchMLPHead:
        raise _unsupported(f"module.pi is a {type(pi).__name__}")
    pi_head = _sequential_layers(pi.net, "pi.net")
    log_std_clip: float | None = None
    if pi.clip_log_std:
        if not isinstance(action_space, Box):
            raise _unsupported("a clipped log-std head with Discrete actions")
        log_std_clip = float(pi.log_std_clip_param_const.reshape(-1)[0])
    elif isinstance(action_space, Box):
        raise _unsupported("a Gaussian pi head without log-std clipping")

    vf_head: tuple[Layer, ...] | None = None
    vf = getattr(module, "vf", None)
    if vf is not None:
        if type(vf) is not TorchMLPHead or vf.clip_log_std:
            raise _unsupported(f"module.vf is a {type(vf).__name__}")
        vf_head = _sequential_layers(vf.net, "vf.net")
        if _out_dim(vf_head) != 1:
            raise _unsupported("a value head with more than one output")
        if critic is None and not shared:
            raise _unsupported("a value head without a critic encoder")
    elif critic is not None:
        critic = None  # not used without a value head

    check_input_dim(obs_space, actor)
    n = _action_size(action_space)
    expected = n if isinstance(action_space, Discrete) or free_log_std_key else 2 * n
    if _out_dim(pi_head) != expected:
        raise _unsupported(f"a pi head with {_out_dim(pi_head)} outputs for {action_space!r}")

    policy = RLModulePolicy(
        observation_space=obs_space,
        action_space=action_space,
        actor_encoder=actor,
        critic_encoder=critic,
        pi_head=pi_head,
        vf_head=vf_head,
        free_log_std_key=free_log_std_key,
        log_std_clip=log_std_clip,
        explore=bool(explore),
        matmul_precision=matmul_precision,
    )
    return policy, params_from_module_state(policy, module.get_state())
