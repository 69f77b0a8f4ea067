"""The hand-written loops jaxsampler is measured against, written as a user would.

* :func:`gymnax_cartpole`: PureJaxRL style, ``jax.vmap`` over gymnax's ``CartPole-v1``
  (same-step auto-reset) and the 64x64 tanh actor-critic (:class:`HandActorCritic`, the
  parameter tree of jaxsampler's ``ActorCriticMLP``: :func:`policy_params`) in one jitted
  ``lax.scan`` (``throughput.py``, ``scaling.py``);
* :func:`spread`: the same over jaxsampler's ``Spread`` with a ``jnp.where`` same-step
  auto-reset, the policy being ``MLPPolicy.forward`` (``multiagent.py``);
* host loops (:func:`make_host_loop`): a Python loop over Gymnasium's ``SyncVectorEnv``,
  ``make_vec`` or EnvPool with the same MLP in numpy or jitted (``throughput.py``).

Every JAX loop carries a :class:`HandCarry` and stacks a :class:`HandTransition` per step
(``suites.py``'s per-suite loops too).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from typing import Any, cast

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

import jaxsampler as js
from jaxsampler.envs.spread import Spread

ENV_ID = "CartPole-v1"
#: The host loops :func:`make_host_loop` builds.
HOST_LOOPS = ("sync_vector_env", "make_vec", "envpool")


@flax.struct.dataclass
class HandCarry:
    """The hand-written loops' scan carry."""

    env_state: Any  # the suite's own state, leaves [E, ...]
    obs: Any  # the policy's input (leaves [E, ...] or [E, A, ...])
    key: jax.Array
    extra: Any = None  # loop-specific (e.g. a step counter for a time limit)


@flax.struct.dataclass
class HandTransition:
    """What the hand-written loops store per step (leaves ``[T, E, ...]``, same dtypes as
    jaxsampler's trajectory)."""

    obs: Any
    action: Any
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    logp: jax.Array
    value: jax.Array


# --------------------------------------------------------------------------- the policy


class HandActorCritic(nn.Module):
    """The 64x64 tanh actor-critic, by hand: ``float32[E, 4] -> (logits[E, n], value[E])``.

    Same parameter names and initializers as ``jaxsampler.policies.ActorCriticMLP``, so
    the two share one parameter tree.
    """

    num_actions: int

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        ortho = nn.initializers.orthogonal
        a = nn.tanh(nn.Dense(64, kernel_init=ortho(math.sqrt(2)), name="actor_0")(x))
        a = nn.tanh(nn.Dense(64, kernel_init=ortho(math.sqrt(2)), name="actor_1")(a))
        logits = nn.Dense(self.num_actions, kernel_init=ortho(0.01), name="actor_out")(a)
        c = nn.tanh(nn.Dense(64, kernel_init=ortho(math.sqrt(2)), name="critic_0")(x))
        c = nn.tanh(nn.Dense(64, kernel_init=ortho(math.sqrt(2)), name="critic_1")(c))
        value = nn.Dense(1, kernel_init=ortho(1.0), name="critic_out")(c)[:, 0]
        return logits, value


def policy_params(seed: int = 0) -> Any:
    """The parameters ``measure_rollout(seed=seed)`` uses (same key, same module)."""
    env = js.make(ENV_ID)
    policy = js.MLPPolicy(env.observation_space, env.action_space, (64, 64))
    params = policy.init(jax.random.PRNGKey(seed))
    hand = HandActorCritic(cast(Any, env.action_space).n).init(
        jax.random.PRNGKey(seed), jnp.zeros((1, 4), jnp.float32)
    )
    hand_layout: Any = jax.tree.structure(hand)
    if hand_layout != jax.tree.structure(params):
        raise AssertionError(
            "HandActorCritic and jaxsampler's ActorCriticMLP have different layouts"
        )
    return params


def sample_jax(params: Any, obs: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array, Any]:
    """``(action int32[E], logp float32[E], value float32[E])`` for ``obs float32[E, 4]``."""
    logits, value = HandActorCritic(2).apply(params, obs)
    action = jax.random.categorical(key, logits)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], 1)[:, 0]
    return action.astype(jnp.int32), logp, value


class NumpyActorCritic:
    """The same MLP in numpy (weights copied from the flax params), sampling in numpy."""

    def __init__(self, params: Any, seed: int = 0):
        p = jax.device_get(params["params"])
        self.w = {
            k: (np.asarray(v["kernel"], np.float32), np.asarray(v["bias"], np.float32))
            for k, v in p.items()
        }
        self.rng = np.random.default_rng(seed)

    def _mlp(self, x: np.ndarray, prefix: str) -> np.ndarray:
        for i in range(2):
            k, b = self.w[f"{prefix}_{i}"]
            x = np.tanh(x @ k + b)
        k, b = self.w[f"{prefix}_out"]
        return x @ k + b

    def __call__(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        obs = np.asarray(obs, np.float32)
        logits = self._mlp(obs, "actor")
        value = self._mlp(obs, "critic")[:, 0]
        z = logits - logits.max(1, keepdims=True)
        logp_all = z - np.log(np.exp(z).sum(1, keepdims=True))
        u = self.rng.random((obs.shape[0], 1), dtype=np.float32)
        action = (np.cumsum(np.exp(logp_all), 1)[:, :-1] < u).sum(1)
        logp = np.take_along_axis(logp_all, action[:, None], 1)[:, 0]
        return action, logp, value


# --------------------------------------------------------------------------- JAX loops


def gymnax_cartpole(
    num_envs: int, rollout_length: int, seed: int = 0
) -> tuple[Callable, HandCarry]:
    """PureJaxRL-style sampler: returns ``(jitted run(params, carry), initial carry)``.

    ``run`` scans ``T`` steps of ``vmap(gymnax step)`` + MLP and returns the new carry and
    the stacked ``HandTransition`` (``[T, E]`` leaves, obs ``[T, E, 4]``).
    """
    import gymnax

    env, env_params = gymnax.make(ENV_ID)

    def run(params: Any, carry: HandCarry) -> tuple[HandCarry, HandTransition]:
        def step(c: HandCarry, _: Any) -> tuple[HandCarry, HandTransition]:
            key, k_act, k_step = jax.random.split(c.key, 3)
            action, logp, value = sample_jax(params, c.obs, k_act)
            step_keys = jax.random.split(k_step, num_envs)
            obs, env_state, reward, terminated, truncated, _ = jax.vmap(
                env.step, in_axes=(0, 0, 0, None)
            )(step_keys, c.env_state, action, env_params)
            return HandCarry(env_state, obs, key), HandTransition(
                c.obs, action, reward, terminated, truncated, logp, value
            )

        return jax.lax.scan(step, carry, None, rollout_length)

    key, reset_key = jax.random.split(jax.random.PRNGKey(seed))
    obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(reset_key, num_envs), env_params
    )
    return jax.jit(run), HandCarry(env_state, obs, key)


def spread(
    env: Spread, policy: js.MLPPolicy, num_envs: int, rollout_length: int, seed: int = 0
) -> tuple[Callable, HandCarry]:
    """PureJaxRL-style sampler over ``Spread``: returns ``(jitted run(params, carry), carry)``.

    One env's step computes the step and a reset and keeps the reset (state and first
    observation) where every agent is done: gymnax's same-step auto-reset, so every step
    is an action (and the final observation of an episode is not kept, as in PureJaxRL).
    The carry (``env_state`` leaves ``[E, ...]``, ``obs`` float32 ``[E, A, obs_dim]``) is
    donated; the transitions are ``[T, E, A]`` (obs ``[T, E, A, obs_dim]``).
    """
    env_params = env.default_params
    space = env.action_space

    def env_step(key: jax.Array, state: Any, action: jax.Array) -> tuple[Any, jax.Array, Any]:
        k_step, k_reset = jax.random.split(key)
        st, ts = env.step(k_step, state, action, env_params)
        rs, rts = env.reset(k_reset, env_params)
        done = jnp.all(ts.terminated | ts.truncated)
        state = jax.tree.map(lambda r, s: jnp.where(done, r, s), rs, st)
        return state, jnp.where(done, rts.obs, ts.obs), ts

    v_step = jax.vmap(env_step)

    def run(params: Any, carry: HandCarry) -> tuple[HandCarry, HandTransition]:
        def step(c: HandCarry, _: Any) -> tuple[HandCarry, HandTransition]:
            key, k_act, k_env = jax.random.split(c.key, 3)
            logits, value, _ = policy.forward(params, c.obs)  # [E, A, 5], [E, A]
            action = jax.random.categorical(k_act, logits).astype(space.dtype)
            logp = jnp.take_along_axis(jax.nn.log_softmax(logits), action[..., None], -1)[..., 0]
            state, obs, ts = v_step(jax.random.split(k_env, num_envs), c.env_state, action)
            tr = HandTransition(c.obs, action, ts.reward, ts.terminated, ts.truncated, logp, value)
            return HandCarry(state, obs, key), tr

        return jax.lax.scan(step, carry, None, rollout_length)

    key, reset_key = jax.random.split(jax.random.PRNGKey(seed))
    state, ts = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(reset_key, num_envs), env_params
    )
    return jax.jit(run, donate_argnums=1), HandCarry(state, ts.obs, key)


# --------------------------------------------------------------------------- host loops


class HostLoop:
    """A Python loop over a Gymnasium-API vector env, storing transitions in numpy buffers.

    Counts actions as jaxsampler does: with next-step auto-reset the step after an
    episode end only resets (its action is ignored), so it is a step but not an action.
    """

    def __init__(
        self, vec_env: Any, act: Callable, num_envs: int, buffer_len: int, seed: int | None
    ):
        self.env, self.act, self.W = vec_env, act, num_envs
        with warnings.catch_warnings():  # EnvPool's Box bounds are float64; Gymnasium warns
            warnings.filterwarnings("ignore", message=".*precision lowered", category=UserWarning)
            self.obs, _ = vec_env.reset() if seed is None else vec_env.reset(seed=seed)
        self.prev_done = np.zeros(num_envs, bool)
        T = buffer_len
        self.buf = {
            "obs": np.zeros((T, num_envs, 4), np.float32),
            "action": np.zeros((T, num_envs), np.int32),
            "reward": np.zeros((T, num_envs), np.float32),
            "terminated": np.zeros((T, num_envs), bool),
            "truncated": np.zeros((T, num_envs), bool),
            "logp": np.zeros((T, num_envs), np.float32),
            "value": np.zeros((T, num_envs), np.float32),
        }
        self.runs: list[dict[str, float]] = []

    def run(self, num_steps: int) -> dict[str, float]:
        b, T, acted = self.buf, self.buf["obs"].shape[0], 0
        t0 = time.perf_counter()
        for i in range(num_steps):
            t = i % T
            action, logp, value = self.act(self.obs)
            b["obs"][t], b["action"][t], b["logp"][t], b["value"][t] = self.obs, action, logp, value
            self.obs, reward, term, trunc, _ = self.env.step(action)
            b["reward"][t], b["terminated"][t], b["truncated"][t] = reward, term, trunc
            acted += self.W - int(np.count_nonzero(self.prev_done))
            self.prev_done = np.logical_or(term, trunc)
        dt = time.perf_counter() - t0
        return {"seconds": dt, "steps": num_steps * self.W, "actions": acted}


def host_env(kind: str, num_envs: int, seed: int) -> Any:
    """The vector env of a host loop (``kind``: one of :data:`HOST_LOOPS`)."""
    import gymnasium as gym

    if kind == "sync_vector_env":
        return gym.vector.SyncVectorEnv([lambda: gym.make(ENV_ID) for _ in range(num_envs)])
    if kind == "make_vec":
        return gym.make_vec(ENV_ID, num_envs=num_envs, vectorization_mode="vector_entry_point")
    import envpool

    return envpool.make(ENV_ID, env_type="gymnasium", num_envs=num_envs, seed=seed)


def envpool_status() -> str | None:
    """``None`` if EnvPool imports, else why not (recorded in the results)."""
    try:
        import envpool  # noqa: F401
    except Exception as e:  # ImportError, or a broken binary wheel
        return f"not installable/importable here: {type(e).__name__}: {e}"
    return None


def make_host_loop(
    kind: str, num_envs: int, params: Any, buffer_len: int, seed: int
) -> tuple[HostLoop, float | None]:
    """Builds a host loop; returns it and the policy compile time (``make_vec`` only)."""
    vec_env = host_env(kind, num_envs, seed)
    compile_s = None
    if kind == "make_vec":

        def sample(p: Any, obs: jax.Array, key: jax.Array) -> tuple[jax.Array, ...]:
            key, k = jax.random.split(key)
            return (*sample_jax(p, obs, k), key)

        policy = jax.jit(sample)
        box = {"key": jax.random.PRNGKey(seed)}

        def act(obs: np.ndarray) -> tuple[np.ndarray, ...]:
            action, logp, value, box["key"] = policy(params, jax.device_put(obs), box["key"])
            return tuple(np.asarray(x) for x in (action, logp, value))

        t0 = time.perf_counter()
        jax.block_until_ready(policy(params, jnp.zeros((num_envs, 4), jnp.float32), box["key"]))
        compile_s = time.perf_counter() - t0
    else:
        act = NumpyActorCritic(params, seed)
    # EnvPool takes its seed in envpool.make and warns on reset(seed=...).
    reset_seed = None if kind == "envpool" else seed
    return HostLoop(vec_env, act, num_envs, buffer_len, reset_seed), compile_s
