"""The loops ``jaxsampler bench`` measures jaxsampler against, written the way users write them.

* :func:`make_hand_rollout`: the hand-written JAX loop, PureJaxRL style: ``jax.vmap`` of
  the env's own ``reset`` / ``step`` over the env axis and a jitted ``lax.scan`` that runs
  the policy network and the envs and stacks one :class:`HandTransition` per step. The
  network is written out as matmuls over the policy's parameter tree (the params
  jaxsampler's ``MLPPolicy`` uses, read by layer name), so it is the same function of the
  same weights without going through jaxsampler's policy code. It draws its keys in
  jaxsampler's order and resets an env on the step after its episode ends (an action
  nobody takes, as jaxsampler does), so from the same seed it produces the same
  observations, actions and rewards: a timing ratio then compares the same work.
* :func:`make_gym_loop`: a Python loop over Gymnasium's ``SyncVectorEnv`` of the same env
  id, with the same MLP weights evaluated in numpy (or random actions), the host-stepped
  way; its own random stream, so the same kind of work rather than the same trajectory.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsampler.envs.base import Env
from jaxsampler.spaces import Box, Discrete

__all__ = [
    "GymLoop",
    "HandCarry",
    "HandRollout",
    "HandTransition",
    "gym_id",
    "hand_unsupported",
    "make_gym_loop",
    "make_hand_rollout",
]


@struct.dataclass
class HandCarry:
    """The hand-written loop's scan carry (leaves ``[E, ...]``).

    Attributes:
        env_state: the env's own state.
        obs: the next observation, ``[E, A, *obs_shape]``.
        done: ``bool[E]``, the env's episode ended at the last step (it resets next step).
        key: the PRNG key the next step splits.
    """

    env_state: Any
    obs: jax.Array
    done: jax.Array
    key: jax.Array


@struct.dataclass
class HandTransition:
    """What the hand-written loop stores per step (stacked by ``lax.scan``: ``[T, E, A]``).

    ``logp`` and ``value`` are zeros of ``float32[E, A]`` for the random policy.
    """

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    logp: jax.Array
    value: jax.Array


@dataclasses.dataclass(frozen=True)
class HandRollout:
    """A jitted hand-written rollout: ``init(key) -> carry`` and
    ``run(params, carry) -> (carry, transitions)`` (``T`` steps)."""

    init: Callable[[jax.Array], HandCarry]
    run: Callable[[Any, HandCarry], tuple[HandCarry, HandTransition]]


def hand_unsupported(env: Env, policy: str) -> str | None:
    """Why the hand-written loop cannot run ``env`` with ``policy`` (``None``: it can).

    It covers what a short user script does: ``Box`` observations (any shape, flattened)
    and, for the MLP, ``Discrete`` or float ``Box`` actions; any action space for random
    actions, except an env with agent groups of different action spaces (the hand loop
    would draw from the carrier space).
    """
    obs = env.observation_space
    if not isinstance(obs, Box):
        return f"the hand-written loop takes Box observations, this env has {obs!r}"
    bound = getattr(env, "max_acting", None)
    if bound is not None and bound < env.num_agents:
        return (
            f"a turn-based env (max_acting={bound}): jaxsampler runs the policy on the "
            "acting agents' rows only, so the two loops would neither do the same work nor make "
            "the same trajectory"
        )
    layout = getattr(env, "agent_layout", None)
    if policy == "random" and layout is not None and not layout.identity:
        return (
            "agent groups: jaxsampler draws each group's random actions from its own action "
            f"space, the hand-written loop from the carrier {env.action_space!r}"
        )
    act = env.action_space
    if policy == "mlp" and not (
        isinstance(act, Discrete)
        or (isinstance(act, Box) and np.issubdtype(act.dtype, np.floating))
    ):
        return f"the hand-written MLP takes Discrete or float Box actions, this env has {act!r}"
    return None


def _dense(layer: Any, x: jax.Array) -> jax.Array:
    return x @ layer["kernel"] + layer["bias"]


def _mlp(layers: Any, x: jax.Array, prefix: str, depth: int) -> jax.Array:
    for i in range(depth):
        x = jnp.tanh(_dense(layers[f"{prefix}_{i}"], x))
    return x


def _depth(layers: Any) -> int:
    return sum(1 for name in layers if name.startswith("actor_") and name != "actor_out")


def _mlp_act(
    env: Env, params: Any, obs: jax.Array, key: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(action [E, A, ...], logp float32[E, A], value float32[E, A])`` of the tanh MLP."""
    layers = params["params"]
    depth = _depth(layers)
    batch = obs.shape[:2]
    x = obs.reshape(batch[0] * batch[1], -1).astype(jnp.float32)
    out = _dense(layers["actor_out"], _mlp(layers, x, "actor", depth)).reshape(batch + (-1,))
    value = _dense(layers["critic_out"], _mlp(layers, x, "critic", depth))[:, 0].reshape(batch)
    space = env.action_space
    if isinstance(space, Discrete):
        action = jax.random.categorical(key, out)
        logp = jnp.take_along_axis(jax.nn.log_softmax(out), action[..., None], -1)[..., 0]
        return (action + space.start).astype(space.dtype), logp, value
    log_std = layers["log_std"]
    eps = jax.random.normal(key, out.shape, out.dtype)
    logp = jnp.sum(-0.5 * eps**2 - log_std - 0.5 * math.log(2 * math.pi), axis=-1)
    action = (out + jnp.exp(log_std) * eps).reshape(batch + space.shape).astype(space.dtype)
    return action, logp, value


def make_hand_rollout(env: Env, policy: str, num_envs: int, rollout_length: int) -> HandRollout:
    """The hand-written ``vmap`` + ``lax.scan`` rollout of ``env`` (see the module docstring).

    Args:
        env: a pure-JAX env (:func:`hand_unsupported` says ``None`` for it).
        policy: ``"mlp"`` (params: an ``MLPPolicy`` tree with tanh layers) or
            ``"random"`` (params unused: ``action_space.sample_batch``).
        num_envs: ``E``.
        rollout_length: ``T``, steps per ``run`` call.

    Returns:
        A :class:`HandRollout`; ``init(key)`` resets the envs as jaxsampler's
        ``rollout.init(key)`` does, and ``run`` is jitted.
    """
    E, T, A = num_envs, rollout_length, env.num_agents
    env_params = env.default_params
    vreset = jax.vmap(env.reset, in_axes=(0, None))
    vstep = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def init(key: jax.Array) -> HandCarry:
        key, reset_key = jax.random.split(key)
        env_state, ts = vreset(jax.random.split(reset_key, E), env_params)
        return HandCarry(env_state, ts.obs, jnp.zeros((E,), jnp.bool_), key)

    def act(params: Any, obs: jax.Array, key: jax.Array) -> tuple[jax.Array, Any, Any]:
        if policy == "mlp":
            return _mlp_act(env, params, obs, key)
        zeros = jnp.zeros((E, A), jnp.float32)
        return env.action_space.sample_batch(key, (E, A)), zeros, zeros

    def step(params: Any, carry: HandCarry, _: Any) -> tuple[HandCarry, HandTransition]:
        key, k_pol, k_step, k_reset = jax.random.split(carry.key, 4)
        action, logp, value = act(params, carry.obs, k_pol)
        stepped = vstep(jax.random.split(k_step, E), carry.env_state, action, env_params)
        fresh = vreset(jax.random.split(k_reset, E), env_params)

        def pick(new: jax.Array, old: jax.Array) -> jax.Array:
            return jnp.where(carry.done.reshape((E,) + (1,) * (new.ndim - 1)), new, old)

        env_state, ts = jax.tree.map(pick, fresh, stepped)
        done = jnp.all(ts.terminated | ts.truncated, axis=-1)
        out = HandTransition(carry.obs, action, ts.reward, ts.terminated, ts.truncated, logp, value)
        return HandCarry(env_state, ts.obs, done, key), out

    @jax.jit
    def run(params: Any, carry: HandCarry) -> tuple[HandCarry, HandTransition]:
        return jax.lax.scan(lambda c, x: step(params, c, x), carry, None, length=T)

    return HandRollout(init=jax.jit(init), run=run)


# --------------------------------------------------------------------------- Gymnasium


def gym_id(env_id: str) -> tuple[str | None, str]:
    """``(the Gymnasium id of env_id or None, why not)``: the id itself (or the part after
    ``gymnax:``) when Gymnasium is installed and registers it."""
    if importlib.util.find_spec("gymnasium") is None:
        return None, "gymnasium is not installed (pip install gymnasium)"
    import gymnasium

    name = env_id.split(":", 1)[1] if env_id.startswith("gymnax:") else env_id
    if name not in gymnasium.envs.registry:
        return None, f"Gymnasium has no env {name!r}"
    return name, ""


@dataclasses.dataclass
class GymLoop:
    """A Gymnasium ``SyncVectorEnv`` stepped by a Python loop; :meth:`call` runs ``steps``
    steps and returns the number of actions taken (steps of envs that were not resetting)."""

    envs: Any
    steps: int
    act: Callable[[np.ndarray], np.ndarray]
    obs: np.ndarray
    resetting: np.ndarray

    def call(self) -> int:
        acted = 0
        for _ in range(self.steps):
            acted += int(np.sum(~self.resetting))
            self.obs, _, terminated, truncated, _ = self.envs.step(self.act(self.obs))
            self.resetting = np.logical_or(terminated, truncated)
        return acted

    def close(self) -> None:
        self.envs.close()


def _numpy_mlp(params: Any, space: Any, seed: int) -> Callable[[np.ndarray], np.ndarray]:
    """The tanh MLP of ``params`` in numpy, sampling with numpy's generator."""
    layers = {k: jax.tree.map(np.asarray, v) for k, v in jax.device_get(params["params"]).items()}
    depth = _depth(layers)
    rng = np.random.default_rng(seed)

    def dense(name: str, x: np.ndarray) -> np.ndarray:
        return x @ layers[name]["kernel"] + layers[name]["bias"]

    def act(obs: np.ndarray) -> np.ndarray:
        a = obs.reshape(obs.shape[0], -1).astype(np.float32)
        for i in range(depth):
            a = np.tanh(dense(f"actor_{i}", a))
        out = dense("actor_out", a)
        if isinstance(space, Discrete):
            gumbel = -np.log(-np.log(rng.uniform(size=out.shape)))
            return np.argmax(out + gumbel, axis=-1) + space.start
        std = np.exp(layers["log_std"])
        sample = out + std * rng.standard_normal(out.shape).astype(np.float32)
        return sample.reshape((obs.shape[0],) + space.shape)

    return act


def make_gym_loop(
    name: str, num_envs: int, steps: int, env: Env, policy: str, params: Any, seed: int
) -> GymLoop:
    """A :class:`GymLoop` of ``num_envs`` copies of Gymnasium's ``name`` (``gymnasium.make``
    defaults, next-step auto-reset), reset with ``seed``, acting with the MLP of ``params``
    in numpy (``policy="mlp"``) or the vector action space's samples (``"random"``)."""
    import gymnasium

    envs = gymnasium.vector.SyncVectorEnv([lambda: gymnasium.make(name)] * num_envs)
    obs: np.ndarray = envs.reset(seed=seed)[0]
    if policy == "mlp":
        act = _numpy_mlp(params, env.action_space, seed)
    else:
        envs.action_space.seed(seed)
        act = lambda _obs: envs.action_space.sample()
    return GymLoop(envs, steps, act, obs, np.zeros((num_envs,), bool))


def time_gym_call(loop: GymLoop) -> tuple[float, int]:
    """``(seconds, actions)`` of one :meth:`GymLoop.call`."""
    t0 = time.perf_counter()
    acted = loop.call()
    return time.perf_counter() - t0, acted
