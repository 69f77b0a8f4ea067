"""The pieces :class:`~jaxsampler.integrations.rllib.env_runner.JaxEnvRunner` is built from.

* :func:`resolve_env`: ``config.env`` -> a pure-JAX env, or a Gymnasium env factory for
  the host sampler, with the Gymnasium spaces RLlib builds its module from;
* :func:`action_transform`, :class:`ActionToEnv` (pure-JAX env wrapper) and
  :class:`UnsquashActions` (Gymnasium wrapper): RLlib's module-to-env action
  normalization / clipping, applied inside the env step so the episode keeps the raw
  action;
* :class:`RunnerPolicy`: the mirrored module's explore / greedy forward and uniform random
  actions in one jitted policy, the mode chosen by a params leaf (no retrace between
  modes), plus RLlib's ``weights_seq_no`` extra;
* :func:`construction_error_spaces` / :func:`raise_remote_construction_error`: a remote
  runner's construction error carried to ``build_algo()`` in the driver;
* :func:`topup_length`: the length of the short chunks that top a ``num_timesteps`` call
  up after its first full chunk (``DeviceSampler(topup_length=...)``), so it overshoots by
  a top-up at most.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

import jaxsampler as js
from jaxsampler.envs.base import Env
from jaxsampler.policies.base import Policy, batch_dims
from jaxsampler.spaces import Box, Space

__all__ = [
    "ActionToEnv",
    "ResolvedEnv",
    "RunnerPolicy",
    "UnsquashActions",
    "action_transform",
    "check_connectors",
    "construction_error_spaces",
    "raise_remote_construction_error",
    "resolve_env",
    "topup_length",
]

_SUPPORTED_ENVS = (
    "a jaxsampler id (js.envs.registered_ids()), a suite id ('gymnax:<id>', 'brax:<name>', "
    "'jumanji:<id>', 'pgx:<id>', 'jaxmarl:<id>'), 'gym:<Gymnasium id>', a Gymnasium "
    "id, an env registered with ray.tune.register_env, a jaxsampler Env instance, or a "
    "callable returning a jaxsampler Env or a Gymnasium env"
)


# ----------------------------------------------------------------------------- config


def check_connectors(config: Any) -> None:
    """Refuses custom env-to-module / module-to-env connectors (they run per step in
    torch on the host; the runner's steps run inside a jitted rollout)."""
    for attr, what in (
        ("_env_to_module_connector", "env_to_module_connector"),
        ("_module_to_env_connector", "module_to_env_connector"),
    ):
        if getattr(config, attr, None) is not None:
            raise ValueError(
                f"JaxEnvRunner does not run custom connectors (config.env_runners({what}=...)): "
                "its env steps and policy run inside one jitted rollout. Drop the connector, "
                "put the transform into a jaxsampler env wrapper, or use RLlib's "
                "SingleAgentEnvRunner"
            )
    for attr in (
        "add_default_connectors_to_env_to_module_pipeline",
        "add_default_connectors_to_module_to_env_pipeline",
    ):
        if getattr(config, attr, True) is False:
            raise ValueError(
                f"JaxEnvRunner needs RLlib's default connector pipelines ({attr}=False given)"
            )


@dataclasses.dataclass
class ResolvedEnv:
    """What :func:`resolve_env` found: a pure-JAX ``env`` (``host_factory`` None) or a
    Gymnasium ``host_factory`` (``env`` is the id or callable), and the Gymnasium spaces."""

    env: Any
    host_factory: Callable[[], Any] | None
    observation_space: Any
    action_space: Any


def resolve_env(
    config: Any, worker_index: int | None, num_workers: int | None, *, multi_agent: bool = False
) -> ResolvedEnv:
    """``config.env`` (+ ``config.env_config``) -> :class:`ResolvedEnv`.

    Raises:
        ValueError: no env, an unknown id, or a multi-agent env (the message names
            :class:`~jaxsampler.integrations.rllib.env_runner.JaxMultiAgentEnvRunner`).
        TypeError: an env of a kind the runner cannot drive; the message lists the
            supported kinds.
    """
    from ray.rllib.env.env_context import EnvContext
    from ray.tune.registry import ENV_CREATOR, _global_registry

    spec = config.env
    env_config = dict(config.env_config or {})
    if spec is None or (isinstance(spec, str) and not spec):
        raise ValueError(f"config.env is not set; JaxEnvRunner takes {_SUPPORTED_ENVS}")

    def context() -> Any:
        return EnvContext(env_config, worker_index=worker_index or 0, num_workers=num_workers)

    def device(env: Env) -> ResolvedEnv:
        return _device(env, multi_agent)

    def host(factory: Callable[[], Any]) -> ResolvedEnv:
        if multi_agent:
            raise TypeError(
                f"JaxMultiAgentEnvRunner samples pure-JAX multi-agent envs (e.g. 'Spread-v0', "
                f"'TicTacToe-v0', 'Goals-v0', js.envs.from_jaxmarl(...)); "
                f"{spec!r} is a host-stepped "
                "env: use RLlib's MultiAgentEnvRunner for it"
            )
        return _host(factory)

    if isinstance(spec, Env):
        return device(spec)
    if isinstance(spec, str):
        if spec.startswith("gym:"):
            gym_id = spec[len("gym:") :]
            return host(lambda: gym.make(gym_id, **env_config))
        if _global_registry.contains(ENV_CREATOR, spec):
            creator = _global_registry.get(ENV_CREATOR, spec)
            return _from_callable(lambda: creator(context()), spec, device, host)
        if _is_suite_id(spec) or spec in js.envs.registered_ids():
            env = js.make(spec, **env_config)
            if not isinstance(env, Env):
                raise TypeError(f"{spec!r} did not build a pure-JAX env ({type(env).__name__})")
            return device(env)
        if spec in gym.envs.registry:
            return host(lambda: gym.make(spec, **env_config))
        raise ValueError(f"unknown env id {spec!r}; JaxEnvRunner takes {_SUPPORTED_ENVS}")
    if callable(spec):
        return _from_callable(lambda: spec(context()), spec, device, host)
    raise TypeError(f"config.env={spec!r} is not supported; JaxEnvRunner takes {_SUPPORTED_ENVS}")


def _is_suite_id(spec: str) -> bool:
    """Whether ``spec`` names an env of a JAX suite (``"<suite>:<id>"``, any suite
    :func:`jaxsampler.make` knows: gymnax, brax, jumanji, pgx, jaxmarl)."""
    from jaxsampler.envs.registry import SUITES

    suite, sep, _ = spec.partition(":")
    return bool(sep) and suite in SUITES


def _device(env: Env, multi_agent: bool) -> ResolvedEnv:
    if env.num_agents != 1 and not multi_agent:
        raise ValueError(
            f"{env.name} has {env.num_agents} agents; JaxEnvRunner is single-agent: use "
            "config.multi_agent(...) with env_runner_cls=JaxMultiAgentEnvRunner"
        )
    return ResolvedEnv(
        env, None, env.observation_space.to_gymnasium(), env.action_space.to_gymnasium()
    )


def _host(factory: Callable[[], Any]) -> ResolvedEnv:
    probe = factory()
    try:
        if not isinstance(probe, gym.Env):
            raise TypeError(
                f"the env factory returned {type(probe).__name__}; JaxEnvRunner takes "
                f"{_SUPPORTED_ENVS}"
            )
        obs, act = probe.observation_space, probe.action_space
    finally:
        close = getattr(probe, "close", None)
        if close is not None:
            close()
    return ResolvedEnv(factory, factory, obs, act)


def _from_callable(
    factory: Callable[[], Any],
    spec: Any,
    device: Callable[[Env], ResolvedEnv],
    host: Callable[[Callable[[], Any]], ResolvedEnv],
) -> ResolvedEnv:
    probe = factory()
    if isinstance(probe, Env):
        return device(probe)
    if isinstance(probe, gym.Env):
        probe.close()
        return host(factory)
    raise TypeError(
        f"config.env={spec!r} built a {type(probe).__name__}; JaxEnvRunner takes {_SUPPORTED_ENVS}"
    )


#: the key of the spaces dict that a remote runner whose construction failed returns
_CONSTRUCTION_ERROR = "__jaxsampler_runner_construction_error__"


def construction_error_spaces(error: Exception) -> dict[str, Any]:
    """What a remote runner (a Ray actor) whose construction raised ``error`` returns from
    ``get_spaces()``, so that the error reaches ``build_algo()`` in the driver.

    RLlib (``restart_failed_env_runners``, on by default) logs a remote runner's
    construction error, takes the actor out of service and then fails on its own with
    ``IndexError: list index out of range`` when it asks the first remote runner for the
    spaces. A runner that stays up and answers with its error instead gets it to the
    driver: RLlib passes the remote runner's spaces to the driver's local runner, whose
    construction raises it (:func:`raise_remote_construction_error`)."""
    return {_CONSTRUCTION_ERROR: error}


def raise_remote_construction_error(spaces: Any) -> None:
    """Raises the error in ``spaces`` if a remote runner sent one
    (:func:`construction_error_spaces`); else does nothing."""
    if isinstance(spaces, dict) and _CONSTRUCTION_ERROR in spaces:
        raise spaces[_CONSTRUCTION_ERROR]


def topup_length(fragment: int) -> int:
    """Steps per env of a top-up chunk: 1/16 of the fragment (at least 1)."""
    return max(1, int(math.ceil(fragment / 16)))


# ----------------------------------------------------------------------------- actions


def action_transform(space: Any, normalize_actions: bool, clip_actions: bool) -> str:
    """RLlib's module-to-env rule for one (Gymnasium) action space: ``"unsquash"``
    (normalize, bounded float Box), ``"clip"`` (clip_actions without normalize, Box) or
    ``"none"``."""
    if not isinstance(space, gym.spaces.Box):
        return "none"
    if normalize_actions:
        bounded = bool(np.all(space.bounded_below) and np.all(space.bounded_above))
        if bounded and np.issubdtype(space.dtype, np.floating):
            return "unsquash"
        return "none"
    return "clip" if clip_actions else "none"


def _apply(xp: Any, action: Any, low: Any, high: Any, transform: str) -> Any:
    if transform == "unsquash":
        action = low + (action + 1.0) * (high - low) / 2.0
        return xp.clip(action, low, high)
    if transform == "clip":
        return xp.clip(action, low, high)
    return action


@dataclasses.dataclass(frozen=True)
class ActionToEnv(Env):
    """A pure-JAX single-agent env that unsquashes or clips its actions (RLlib's
    ``NormalizeAndClipActions``) before stepping ``inner``; everything else is ``inner``'s.

    Args:
        inner: the single-agent env (Box actions).
        transform: ``"unsquash"`` or ``"clip"`` (:func:`action_transform`).
    """

    inner: Env
    transform: str

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def agent_ids(self) -> tuple[str, ...]:
        return self.inner.agent_ids

    @property
    def default_params(self) -> Any:
        return self.inner.default_params

    @property
    def observation_space(self) -> Space:
        return self.inner.observation_space

    @property
    def action_space(self) -> Space:
        return self.inner.action_space

    def reset(self, key: jax.Array, params: Any = None) -> Any:
        return self.inner.reset(key, params)

    def step(self, key: jax.Array, state: Any, action: Any, params: Any = None) -> Any:
        space = self.inner.action_space
        assert isinstance(space, Box)
        low = jnp.asarray(space.low, space.dtype)
        high = jnp.asarray(space.high, space.dtype)
        return self.inner.step(key, state, _apply(jnp, action, low, high, self.transform), params)


class UnsquashActions(gym.ActionWrapper):
    """:class:`ActionToEnv` for a Gymnasium env (the host sampler's envs)."""

    def __init__(self, env: Any, transform: str):
        super().__init__(env)
        self._transform = transform

    def action(self, action: Any) -> Any:
        space = self.env.action_space
        assert isinstance(space, gym.spaces.Box)
        return _apply(np, np.asarray(action), space.low, space.high, self._transform)


# ----------------------------------------------------------------------------- policy


class TraceCounter:
    """Counts traces of a policy (incremented at trace time only)."""

    def __init__(self) -> None:
        self.count = 0


@dataclasses.dataclass(frozen=True)
class RunnerPolicy(Policy):
    """The runner's sampling policy: explore / greedy / uniform random in one function.

    Params are ``{"module": mirrored params, "mode": int32 (0 explore, 1 greedy,
    2 random), "seq": int32 weights_seq_no}`` (:meth:`call_params`); the mode is data,
    so switching it recompiles nothing. Extras are ``keep_extras`` of the mirrored
    policy's and ``weights_seq_no``; random steps get zeros for the former.

    Args:
        observation_space, action_space: the env's (jaxsampler) spaces.
        explore_policy, greedy_policy: the mirrored policy with explore on and off.
        random_low: for ``"unsquash"`` actions, random actions are uniform in
            ``[random_low, 1]`` (the module's range); ``None``: uniform in the space.
        keep_extras: extras of the mirrored policy to keep (RLlib's columns).
    """

    observation_space: Space
    action_space: Space
    explore_policy: Any
    greedy_policy: Any
    random_low: float | None
    keep_extras: tuple[str, ...]
    traces: TraceCounter = dataclasses.field(
        default_factory=TraceCounter, compare=False, hash=False, repr=False
    )

    @property
    def agent_policy(self) -> tuple[str, ...] | None:
        """Policy id of every agent-axis slot (the mirrored multi-agent policy's), or
        ``None`` for a single policy; the sampler labels agent episodes with it."""
        return getattr(self.explore_policy, "agent_policy", None)

    @property
    def policy_ids(self) -> tuple[str, ...] | None:
        """The mirrored multi-agent policy's ids, or ``None`` for a single policy."""
        return getattr(self.explore_policy, "policy_ids", None)

    @property
    def policy_groups(self) -> tuple[str | None, ...] | None:
        """The mirrored multi-agent policy's agent group per policy (``None`` entries: the
        carrier spaces), or ``None`` for a single policy."""
        return getattr(self.explore_policy, "policy_groups", None)

    @property
    def extra_shapes(self) -> Any:
        """The mirrored multi-agent policy's padded extras' own shapes (agent groups), or
        ``None``; the sampler cuts each policy's extras back to them."""
        return getattr(self.explore_policy, "extra_shapes", None)

    @staticmethod
    def call_params(params: Any, mode: int, seq: int) -> dict[str, Any]:
        """The params one jitted call takes: the module's weights, the explore mode and the
        call's sequence number (both int32, so changing them never recompiles)."""
        return {"module": params, "mode": np.int32(mode), "seq": np.int32(seq)}

    def init(self, key: jax.Array) -> Any:
        raise NotImplementedError("RunnerPolicy's params come from the RLModule")

    def initial_state(self, batch_shape: tuple[int, ...]) -> Any:
        return self.explore_policy.initial_state(batch_shape)

    def __call__(
        self, params: Any, obs: Any, key: jax.Array, policy_state: Any
    ) -> tuple[Any, dict[str, jax.Array], Any]:
        self.traces.count += 1
        batch = batch_dims(obs, self.observation_space)
        module_params = params["module"]

        def run(policy: Any) -> tuple[Any, dict[str, jax.Array]]:
            action, extras, _ = policy(module_params, obs, key, policy_state)
            return action, {k: extras[k] for k in self.keep_extras if k in extras}

        shapes = jax.eval_shape(lambda: run(self.explore_policy))

        def explore() -> Any:
            return run(self.explore_policy)

        def greedy() -> Any:
            return run(self.greedy_policy)

        def random() -> Any:
            space = self.action_space
            layout = getattr(self.explore_policy, "layout", None)
            if layout is not None:  # agent groups: each group's actions from its own space
                action = layout.sample_actions(key, batch[:-1])
            elif self.random_low is not None and isinstance(space, Box):
                action = jax.random.uniform(
                    key, batch + space.shape, jnp.float32, self.random_low, 1.0
                )
            else:
                action = space.sample_batch(key, batch)
            action = jnp.asarray(action).astype(shapes[0].dtype)
            zeros = {k: jnp.zeros(v.shape, v.dtype) for k, v in shapes[1].items()}
            return action, zeros

        action, extras = jax.lax.switch(params["mode"], (explore, greedy, random))
        extras = dict(extras)
        extras["weights_seq_no"] = jnp.broadcast_to(params["seq"], batch)
        # the mirrored MLP is stateless: its (empty) state passes through
        return action, extras, policy_state
