"""Mirror RLlib's default DQN torch RLModule as a jaxsampler policy.

:func:`dqn_policy_from_rl_module` (also reached through
:func:`~jaxsampler.integrations.rllib.module.policy_from_rl_module`) reads an RLlib 2.60
``DefaultDQNTorchRLModule`` (what ``DQNConfig().rl_module(model_config=...)`` builds for a
1-D ``Box`` observation space and ``Discrete`` actions) and returns an equivalent
:class:`DQNModulePolicy` plus its params: the same MLP encoder (``fcnet_hiddens``,
``fcnet_activation``, ``fcnet_use_layernorm``), the same advantage head ``af`` and, with
``dueling=True`` (RLlib's default), value head ``vf`` (``head_fcnet_hiddens``,
``head_fcnet_activation``), combined as RLlib does:
``Q = V + A - mean(A)`` (the mean over actions whose advantage is not ``-inf``).

Acting is RLlib's: ``forward_inference`` takes the argmax of Q; ``forward_exploration`` is
epsilon-greedy, each row drawing ``u ~ U[0, 1)`` and taking a uniformly random action
(among the actions whose Q-value is neither ``0`` nor ``-inf``, RLlib's action-mask rule)
when ``u < epsilon``, else the argmax. RLlib computes epsilon from the module's schedule
(``config.training(epsilon=[(t0, e0), (t1, e1), ...])``: linear in between, the last
value after the last point; or a constant) at the lifetime env step ``t`` its env runner
passes. Here epsilon is data: ``params["epsilon"]`` (``float32[]``), set for a timestep by
:meth:`DQNModulePolicy.at_timestep`, so a new epsilon never retraces a jitted rollout.

Not mirrored (refused with a ``TypeError`` naming what is): distributional Q
(``num_atoms > 1``), LSTM / CNN encoders, non-Discrete actions, subclasses that override
the forward passes. RLlib 2.60's new-stack DQN module has no noisy layers to mirror
(``noisy`` is an old-stack option).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
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

__all__ = ["DQNModulePolicy", "dqn_policy_from_rl_module", "epsilon_at"]

#: An epsilon schedule: ``((timestep, value), ...)`` (one point: a constant).
Schedule = tuple[tuple[int, float], ...]


def epsilon_at(schedule: Schedule, timestep: int) -> float:
    """RLlib's scheduled value at ``timestep``: linear between consecutive points
    ``(t_i, v_i)`` for ``t_i <= timestep < t_{i+1}``, else the last point's value."""
    for (t0, v0), (t1, v1) in zip(schedule[:-1], schedule[1:]):
        if t0 <= timestep < t1:
            return v0 + (timestep - t0) / (t1 - t0) * (v1 - v0)
    return schedule[-1][1]


def _schedule(value: Any) -> Schedule:
    """``model_config["epsilon"]`` (a number or ``[(t, v), ...]``) as a :data:`Schedule`."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return ((0, float(value)),)
    if isinstance(value, Sequence) and value:
        points = tuple((int(t), float(v)) for t, v in value)
        if [t for t, _ in points] != sorted(t for t, _ in points):
            raise ValueError(f"the epsilon schedule's timesteps are not sorted: {value!r}")
        return points
    raise ValueError(f"epsilon must be a number or a list of (timestep, value), got {value!r}")


@dataclasses.dataclass(frozen=True)
class DQNModulePolicy(Policy):
    """A jaxsampler policy equal to an RLlib default DQN torch RLModule.

    Build it with :func:`dqn_policy_from_rl_module` (or ``policy_from_rl_module``); the
    fields describe the module's layers (static, hashable).

    ``__call__(params, obs, key, policy_state) -> (action, extras, policy_state)``: the
    argmax of the module's Q-values (``explore=False``, RLlib's ``forward_inference``) or
    epsilon-greedy with ``epsilon = params["epsilon"]`` (``explore=True``,
    ``forward_exploration``). Extras: ``qf_preds`` (``float32[*batch, n]``). Pure: safe
    under ``jit`` and ``vmap``; stateless (``policy_state`` passes through).

    Attributes:
        observation_space: the observation space (1-D Box, or a space whose one-hot /
            flattened size is the encoder's input size).
        action_space: ``Discrete``.
        encoder: layers of the encoder.
        af_head: layers of the advantage (dueling) or Q head.
        vf_head: layers of the value head (dueling), else ``None``.
        epsilon_schedule: the module's epsilon schedule (:func:`epsilon_at`).
        explore: epsilon-greedy (True) or greedy (False).
        matmul_precision: ``jax.lax.Precision`` name for the dense layers (``None``:
            JAX's default; ``"highest"`` matches torch's float32 on GPUs and TPUs).
    """

    observation_space: Space
    action_space: Space
    encoder: tuple[Layer, ...]
    af_head: tuple[Layer, ...]
    vf_head: tuple[Layer, ...] | None
    epsilon_schedule: Schedule = ((0, 0.0),)
    explore: bool = True
    matmul_precision: str | None = None

    @property
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """State key -> shape of every module weight the policy reads."""
        return layer_shapes(self.encoder + self.af_head + (self.vf_head or ()))

    def extra_params(self) -> dict[str, np.ndarray]:
        """``{"epsilon": float32[]}``: the schedule's value at timestep 0."""
        return {"epsilon": np.asarray(epsilon_at(self.epsilon_schedule, 0), np.float32)}

    def epsilon_at(self, timestep: int) -> float:
        """RLlib's epsilon at lifetime env step ``timestep`` (the module's schedule)."""
        return epsilon_at(self.epsilon_schedule, int(timestep))

    def at_timestep(self, params: dict[str, Any], timestep: int) -> dict[str, Any]:
        """``params`` with ``"epsilon"`` set to RLlib's epsilon at ``timestep`` (a new
        ``float32[]`` leaf of the same shape and dtype: a jitted caller is not retraced)."""
        return {**params, "epsilon": np.asarray(self.epsilon_at(timestep), np.float32)}

    def with_epsilon(self, params: dict[str, Any], epsilon: float) -> dict[str, Any]:
        """``params`` with ``"epsilon"`` set to ``epsilon`` (float32, no retrace)."""
        return {**params, "epsilon": np.asarray(epsilon, np.float32)}

    def init(self, key: jax.Array) -> dict[str, jax.Array]:
        """Random params of the right structure (for tests; real ones come from the module)."""
        params = random_params(key, self.param_shapes)
        params.update({k: jnp.asarray(v) for k, v in self.extra_params().items()})
        return params

    def q_values(self, params: Mapping[str, jax.Array], obs: Any) -> jax.Array:
        """The module's ``qf_preds`` (``compute_q_values``) for ``obs`` (leaves
        ``[*batch, *obs_shape]``): ``float32[*batch, n]``. Pure."""
        x, batch = features(self.observation_space, obs)
        q = self._q(params, x)
        return q.reshape(batch + q.shape[-1:])

    def _q(self, params: Mapping[str, jax.Array], x: jax.Array) -> jax.Array:
        emb = run_layers(self.encoder, params, x, self.matmul_precision)
        adv = run_layers(self.af_head, params, emb, self.matmul_precision)
        if self.vf_head is None:
            return adv
        value = run_layers(self.vf_head, params, emb, self.matmul_precision)
        # RLlib centres the advantages on their mean over the actions that are not -inf
        # (masked actions); such an action's Q-value stays -inf.
        kept = adv != -jnp.inf
        mean = jnp.sum(jnp.where(kept, adv, 0.0), -1, keepdims=True) / jnp.sum(
            kept, -1, keepdims=True
        )
        return adv - mean + value

    def __call__(
        self, params: Any, obs: Any, key: jax.Array, policy_state: Any
    ) -> tuple[Any, dict[str, jax.Array], Any]:
        x, batch = features(self.observation_space, obs)
        q = self._q(params, x)
        action = jnp.argmax(q, axis=-1)
        if self.explore:
            key_u, key_a = jax.random.split(key)
            # RLlib draws random actions among those whose Q-value is neither 0 nor -inf
            # (its action-mask rule); a row with none left draws among all actions.
            allowed = jnp.nan_to_num(q, neginf=0.0) != 0.0
            allowed = jnp.where(jnp.any(allowed, -1, keepdims=True), allowed, True)
            random = jax.random.categorical(key_a, jnp.where(allowed, 0.0, -jnp.inf))
            u = jax.random.uniform(key_u, action.shape, jnp.float32)
            action = jnp.where(u < params["epsilon"], random, action)
        space = self.action_space
        assert isinstance(space, Discrete)
        action = (action + space.start).astype(space.dtype).reshape(batch)
        return action, {"qf_preds": q.reshape(batch + q.shape[-1:])}, policy_state


_OVERRIDABLE = (
    "_forward_inference",
    "_forward_exploration",
    "_forward_train",
    "_qf_forward_helper",
    "compute_q_values",
    "compute_advantage_distribution",
)


def dqn_policy_from_rl_module(
    module: Any,
    *,
    explore: bool = True,
    observation_space: Space | None = None,
    matmul_precision: str | None = None,
) -> tuple[DQNModulePolicy, dict[str, Any]]:
    """An equivalent jaxsampler policy for RLlib's default DQN torch RLModule, and its params.

    Args:
        module: a built ``DefaultDQNTorchRLModule`` (inference-only, as RLlib's env
            runners hold it, or the learner's: target networks are not read).
        explore: epsilon-greedy (``forward_exploration``) or greedy (``forward_inference``).
        observation_space: the env's observation space when it differs from the module's
            (Discrete is one-hot encoded, Box flattened). Default: the module's.
        matmul_precision: ``None``, ``"default"``, ``"high"`` or ``"highest"``.

    Returns:
        ``(policy, params)``: a :class:`DQNModulePolicy` and params holding the module's
        weights and ``"epsilon"`` at timestep 0 (see :meth:`DQNModulePolicy.at_timestep`).

    Raises:
        TypeError: a DQN module variant that is not mirrored (distributional Q, an LSTM or
            CNN encoder, non-Discrete actions, a subclass overriding a forward pass); the
            message names what is supported.
        ValueError: ``observation_space`` does not fit the encoder, or a malformed epsilon
            schedule.
    """
    from ray.rllib.algorithms.dqn.torch.default_dqn_torch_rl_module import (
        DefaultDQNTorchRLModule,
    )
    from ray.rllib.core.models.torch.heads import TorchMLPHead

    if not isinstance(module, DefaultDQNTorchRLModule):
        raise _unsupported(f"got a {type(module).__name__}, not a DefaultDQNTorchRLModule")
    for method in _OVERRIDABLE:
        if getattr(type(module), method) is not getattr(DefaultDQNTorchRLModule, method):
            raise _unsupported(f"{type(module).__name__} overrides {method}")
    if int(module.num_atoms) != 1:
        raise _unsupported(
            f"a distributional DQN module (num_atoms={module.num_atoms}); use num_atoms=1"
        )
    action_space = convert_space(module.action_space)
    if not isinstance(action_space, Discrete):
        raise _unsupported(f"DQN with the action space {module.action_space}")
    obs_space = observation_space or convert_space(module.observation_space)
    if not isinstance(obs_space, (Box, Discrete)):
        raise _unsupported(f"the observation space {obs_space!r}")

    encoder = _mlp_encoder(module.encoder, "encoder")
    heads: dict[str, tuple[Layer, ...] | None] = {"af": None, "vf": None}
    for name in ("af", "vf") if module.uses_dueling else ("af",):
        head = getattr(module, name)
        if type(head) is not TorchMLPHead or head.clip_log_std:
            raise _unsupported(f"module.{name} is a {type(head).__name__}")
        heads[name] = _sequential_layers(head.net, f"{name}.net")
    af_head = heads["af"]
    assert af_head is not None
    if _out_dim(af_head) != action_space.n:
        raise _unsupported(f"an advantage head with {_out_dim(af_head)} outputs")
    if heads["vf"] is not None and _out_dim(heads["vf"]) != 1:
        raise _unsupported("a value head with more than one output")

    model_config: Any = module.model_config  # a dict once the module is built
    if not isinstance(model_config, Mapping) or "epsilon" not in model_config:
        raise _unsupported("a DQN module without an epsilon schedule in its model_config")
    check_input_dim(obs_space, encoder)
    policy = DQNModulePolicy(
        observation_space=obs_space,
        action_space=action_space,
        encoder=encoder,
        af_head=af_head,
        vf_head=heads["vf"],
        epsilon_schedule=_schedule(model_config["epsilon"]),
        explore=bool(explore),
        matmul_precision=matmul_precision,
    )
    return policy, params_from_module_state(policy, module.get_state())
