"""The pieces both RLlib module mirrors share (PPO in :mod:`.module`, DQN in
:mod:`.dqn_module`): torch ``nn.Sequential`` layers read as hashable specs, applied to
arrays with torch-layout weights, their shapes, and a module state turned into params."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxsampler.spaces import Box, Discrete, Space

_SUPPORTED = (
    "RLlib's default PPO torch RLModule (DefaultPPOTorchRLModule, new API stack) with an MLP "
    "encoder (1-D Box observations; fcnet_hiddens, fcnet_activation, fcnet_use_layernorm, "
    "vf_share_layers), MLP pi/vf heads (head_fcnet_hiddens, head_fcnet_activation, "
    "head_fcnet_use_layernorm) and Discrete (TorchCategorical) or float Box "
    "(TorchDiagGaussian, free_log_std False or True) actions; and RLlib's default DQN torch "
    "RLModule (DefaultDQNTorchRLModule) with an MLP encoder, MLP advantage/value heads "
    "(dueling on or off), num_atoms=1 (no distributional Q) and Discrete actions"
)

# torch activation class name -> jax function
_ACTIVATIONS: dict[str, Any] = {
    "Tanh": jnp.tanh,
    "ReLU": jax.nn.relu,
    "SiLU": jax.nn.silu,
    "Sigmoid": jax.nn.sigmoid,
    "ELU": jax.nn.elu,
    "GELU": lambda x: jax.nn.gelu(x, approximate=False),
    "Identity": lambda x: x,
}

# A layer of a mirrored ``nn.Sequential``, hashable:
#   ("dense", weight_key, bias_key or "", in_dim, out_dim)
#   ("layernorm", weight_key, bias_key, dim, eps)
#   ("act", torch class name)
Layer = tuple[Any, ...]


def features(space: Space, obs: Any) -> tuple[jax.Array, tuple[int, ...]]:
    """An MLP encoder's input: ``obs`` (``[*batch, *obs_shape]``) one-hot encoded
    (Discrete) or flattened (Box) to ``float32[rows, features]``, and ``batch``. Pure."""
    if isinstance(space, Discrete):
        x = jax.nn.one_hot(obs - space.start, space.n, dtype=jnp.float32)
    elif isinstance(space, Box):
        batch = obs.shape[: obs.ndim - len(space.shape)]
        x = obs.reshape(batch + (-1,)).astype(jnp.float32)
    else:  # pragma: no cover - refused at construction
        raise TypeError(f"unsupported observation space {space!r}")
    batch = x.shape[:-1]
    # One 2-D matmul per layer: XLA's CPU dot is fastest on [rows, features].
    return x.reshape(-1, x.shape[-1]), batch


def run_layers(
    layers: tuple[Layer, ...],
    params: Mapping[str, jax.Array],
    x: jax.Array,
    precision: str | None = None,
) -> jax.Array:
    """Applies mirrored torch layers (dense, layernorm, activation specs) to ``x``
    (``float32[rows, in]``) with torch-layout weights from ``params``. Pure."""
    for layer in layers:
        kind = layer[0]
        if kind == "dense":
            _, w, b, _, _ = layer
            x = jnp.matmul(x, params[w].T, precision=precision)
            if b:
                x = x + params[b]
        elif kind == "layernorm":
            _, w, b, _, eps = layer
            mean = jnp.mean(x, axis=-1, keepdims=True)
            var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
            x = (x - mean) / jnp.sqrt(var + eps) * params[w] + params[b]
        else:
            x = _ACTIVATIONS[layer[1]](x)
    return x


def check_input_dim(obs_space: Space, encoder: tuple[Layer, ...]) -> None:
    """Raises ``ValueError`` unless ``obs_space`` has as many features (one-hot for
    ``Discrete``) as the first dense layer of ``encoder`` takes."""
    in_dim = next(layer[3] for layer in encoder if layer[0] == "dense")
    size = obs_space.n if isinstance(obs_space, Discrete) else int(np.prod(obs_space.shape))
    if size != in_dim:
        raise ValueError(
            f"policy_from_rl_module: the observation space {obs_space!r} has {size} "
            f"features but the module's encoder takes {in_dim}"
        )


def layer_shapes(layers: Iterable[Layer]) -> dict[str, tuple[int, ...]]:
    """State key -> shape of the weights of mirrored ``layers`` (dense and layernorm)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for layer in layers:
        if layer[0] == "dense":
            _, w, b, d_in, d_out = layer
            shapes[w] = (d_out, d_in)
            if b:
                shapes[b] = (d_out,)
        elif layer[0] == "layernorm":
            _, w, b, dim, _ = layer
            shapes[w] = (dim,)
            shapes[b] = (dim,)
    return shapes


def random_params(key: jax.Array, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, jax.Array]:
    """Normal(0, 0.1) float32 params of ``shapes`` (state key -> shape), for tests."""
    keys = jax.random.split(key, len(shapes))
    return {
        name: 0.1 * jax.random.normal(k, shape, jnp.float32)
        for k, (name, shape) in zip(keys, sorted(shapes.items()), strict=True)
    }


def _unsupported(what: str) -> TypeError:
    return TypeError(f"policy_from_rl_module: {what}; supported: {_SUPPORTED}")


def _sequential_layers(net: Any, prefix: str) -> tuple[Layer, ...]:
    """The layers of a ``TorchMLP`` (``net.mlp``, an ``nn.Sequential``) as hashable specs."""
    import torch

    seq = getattr(net, "mlp", None)
    if not isinstance(seq, torch.nn.Sequential):
        raise _unsupported(f"{prefix} is not an RLlib TorchMLP (got {type(net).__name__})")
    layers: list[Layer] = []
    for i, layer in enumerate(seq):
        key = f"{prefix}.mlp.{i}"
        if isinstance(layer, torch.nn.Linear):
            bias = f"{key}.bias" if layer.bias is not None else ""
            layers.append(("dense", f"{key}.weight", bias, layer.in_features, layer.out_features))
        elif isinstance(layer, torch.nn.LayerNorm):
            if len(layer.normalized_shape) != 1 or not layer.elementwise_affine:
                raise _unsupported(f"{key}: a LayerNorm over more than the last axis")
            if layer.bias is None:
                raise _unsupported(f"{key}: a LayerNorm without bias")
            layers.append(
                (
                    "layernorm",
                    f"{key}.weight",
                    f"{key}.bias",
                    int(layer.normalized_shape[0]),
                    float(layer.eps),
                )
            )
        elif type(layer).__name__ in _ACTIVATIONS and type(layer).__module__.startswith("torch"):
            if isinstance(layer, torch.nn.ELU) and layer.alpha != 1.0:
                raise _unsupported(f"{key}: ELU with alpha != 1")
            if isinstance(layer, torch.nn.GELU) and layer.approximate != "none":
                raise _unsupported(f"{key}: GELU(approximate={layer.approximate!r})")
            layers.append(("act", type(layer).__name__))
        else:
            raise _unsupported(
                f"{key} is a {type(layer).__name__} (supported layers: Linear, LayerNorm, "
                f"activations {sorted(_ACTIVATIONS)})"
            )
    return tuple(layers)


def _mlp_encoder(encoder: Any, prefix: str) -> tuple[Layer, ...]:
    from ray.rllib.core.models.torch.encoder import TorchMLPEncoder

    if not isinstance(encoder, TorchMLPEncoder):
        raise _unsupported(
            f"the encoder {prefix} is a {type(encoder).__name__} (CNN, LSTM and other "
            "encoders are not mirrored; only TorchMLPEncoder)"
        )
    return _sequential_layers(encoder.net, f"{prefix}.net")


def _out_dim(layers: tuple[Layer, ...]) -> int:
    dims = [layer[4] for layer in layers if layer[0] == "dense"]
    if not dims:
        raise _unsupported("a head without a Linear layer")
    return int(dims[-1])


def params_from_module_state(policy: Any, state: Mapping[str, Any]) -> dict[str, Any]:
    """New params for ``policy`` from an RLlib module state (a weight sync).

    Use it on every ``EnvRunner.set_state`` instead of mirroring the module again: the
    returned params always have the same structure, shapes and dtype (``float32``), so a
    jitted rollout that takes the params as an argument is not traced again.

    Args:
        policy: a policy built by :func:`policy_from_rl_module` (PPO or DQN mirror).
        state: the module's state, ``module.get_state()`` (``inference_only`` or full): a
            mapping from state key to numpy array or torch tensor; also accepted: the
            ``{"default_policy": state}`` wrapping an env runner may receive. Keys the
            policy does not read (e.g. the value head's, for an inference-only policy, or
            torch buffers) are ignored.

    Returns:
        ``dict[str, jax.Array]``: state key -> ``float32`` array (torch's layout); for a
        DQN mirror also ``"epsilon"`` (``float32[]``, the schedule's value at timestep 0;
        :meth:`~jaxsampler.integrations.rllib.dqn_module.DQNModulePolicy.at_timestep`
        sets it for a later timestep).

    Raises:
        KeyError: ``state`` lacks a key the policy reads (the message lists them).
        ValueError: an entry's shape differs from the mirrored module's.
    """
    if "default_policy" in state and isinstance(state["default_policy"], Mapping):
        state = state["default_policy"]
    shapes = policy.param_shapes
    missing = sorted(k for k in shapes if k not in state)
    if missing:
        raise KeyError(
            f"params_from_module_state: the module state lacks {missing} (has "
            f"{sorted(state)[:8]}...); pass module.get_state() of the mirrored module"
        )
    host: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        value = state[name]
        if hasattr(value, "detach"):  # a torch tensor
            value = value.detach().cpu().numpy()
        arr = np.asarray(value, dtype=np.float32)
        if arr.shape != shape:
            raise ValueError(
                f"params_from_module_state: {name} has shape {arr.shape}, the mirrored "
                f"module's is {shape} (the module's architecture changed: mirror it again "
                "with policy_from_rl_module)"
            )
        host[name] = arr
    host.update(policy.extra_params())
    return jax.device_put(host)
