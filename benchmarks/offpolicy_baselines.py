"""The off-policy examples written by hand, PureJaxRL / Stoix style (the baselines of
``benchmarks/offpolicy_hand.py``).

:func:`make_hand_dqn` and :func:`make_hand_sac` train what ``examples/dqn.py`` and
``examples/sac.py`` train (same env, network, hyperparameters, flashbax buffer and learner:
the examples' own ``update`` functions, imported), but collect by hand: ``jax.vmap`` of the
env's ``step`` over the envs in a ``lax.scan`` (:func:`hand_rollout`), a same-step
auto-reset that keeps each episode's real final observation for the bootstrap
(:func:`auto_reset_step`), n-step targets built with shifted arrays (:func:`n_step`) and
the transitions put together as the buffer's items (:func:`dqn_items`, :func:`sac_items`).
No jaxsampler rollout, trajectory or n-step helper is used on this side.

Differences that stay (the loops are what a user writes, not a replay of each other):
jaxsampler's rollout spends one masked reset step per episode (stored with ``valid =
False``), so for the same env steps it makes slightly fewer real transitions (one per
episode: under 1 % at CartPole's 500 and Pendulum's 200 steps); random streams differ.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

import jaxsampler as js
from examples import dqn, sac
from examples import offpolicy_common as common
from jaxsampler import offpolicy

# --------------------------------------------------------------------------- collection


@struct.dataclass
class HandEnvs:
    """The envs between iterations: states (leaves ``[E, ...]``), the observations the next
    actions see (``[E, 1, ...]``: the env's agent axis), each env's return so far in its
    episode (``float32[E]``) and the acting key."""

    state: Any
    obs: jax.Array
    running: jax.Array
    key: jax.Array


@struct.dataclass
class HandSteps:
    """One iteration's steps, leaves ``[T, E, ...]`` (agent axis dropped): ``next_obs`` is
    the observation after the action, at an episode's end its real final observation (the
    next ``obs`` is then the new episode's first); ``ended_return`` the return of the
    episode that ended at the step (0 elsewhere)."""

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    next_obs: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    ended_return: jax.Array


def auto_reset_step(env: js.Env, env_params: Any) -> Callable:
    """One env's step with a same-step auto-reset (gymnax style):
    ``step(key, state, action) -> (state, obs, final_obs, reward, terminated, truncated)``.

    The reset is computed every step and kept, leaf by leaf, where the episode ended; the
    step's own observation is returned as ``final_obs`` so a truncated step can bootstrap
    from it. Flags and reward are the single agent's (scalars). Pure; vmap it.
    """

    def step(key, state, action):
        k_step, k_reset = jax.random.split(key)
        state, ts = env.step(k_step, state, action, env_params)
        reset_state, reset_ts = env.reset(k_reset, env_params)
        done = ts.terminated[0] | ts.truncated[0]
        state = jax.tree.map(lambda r, s: jnp.where(done, r, s), reset_state, state)
        obs = jnp.where(done, reset_ts.obs, ts.obs)
        return state, obs, ts.obs, ts.reward[0], ts.terminated[0], ts.truncated[0]

    return step


def reset_envs(env: js.Env, env_params: Any, num_envs: int, key: jax.Array) -> HandEnvs:
    """``num_envs`` fresh envs; ``key`` is split into the reset keys and the acting key."""
    k_reset, k_act = jax.random.split(key)
    state, ts = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(k_reset, num_envs), env_params
    )
    return HandEnvs(state, ts.obs, jnp.zeros((num_envs,), jnp.float32), k_act)


def hand_rollout(
    env: js.Env, env_params: Any, num_envs: int, rollout_length: int, act: Callable
) -> Callable:
    """``run(params, envs) -> (envs, HandSteps)``: ``rollout_length`` steps of
    ``jax.vmap(auto_reset_step)`` in a ``lax.scan``, actions from
    ``act(params, obs [E, 1, ...], key) -> [E, 1, ...]``. Pure; jit-safe."""
    v_step = jax.vmap(auto_reset_step(env, env_params))

    def run(params: Any, envs: HandEnvs) -> tuple[HandEnvs, HandSteps]:
        def step(envs: HandEnvs, _: Any) -> tuple[HandEnvs, HandSteps]:
            key, k_act, k_env = jax.random.split(envs.key, 3)
            action = act(params, envs.obs, k_act)
            state, obs, final_obs, reward, term, trunc = v_step(
                jax.random.split(k_env, num_envs), envs.state, action
            )
            ret = envs.running + reward
            done = term | trunc
            out = HandSteps(envs.obs[:, 0], action[:, 0], reward, final_obs[:, 0], term, trunc,
                            jnp.where(done, ret, 0.0))  # fmt: skip
            return HandEnvs(state, obs, jnp.where(done, 0.0, ret), key), out

        return jax.lax.scan(step, envs, None, rollout_length)

    return run


# --------------------------------------------------------------------------- items


def n_step(
    reward: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    next_obs: jax.Array,
    n: int,
    gamma: float,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """n-step targets of a same-step-reset rollout, cut at its end.

    Step ``t`` sums ``gamma^k r_{t+k}`` until ``n`` rewards, the episode's end or the
    rollout's last step, whichever comes first; it bootstraps from the ``next_obs`` of that
    last step with discount ``gamma^k`` (``k`` rewards summed), or 0 after a termination.

    Args:
        reward: ``float32[T, E]``; terminated, truncated: ``bool[T, E]``.
        next_obs: ``[T, E, ...]``, the observation after each step (real final ones at ends).
        n: rewards per target (static int >= 1); gamma: discount.

    Returns:
        ``(reward_sum float32[T, E], discount float32[T, E], bootstrap_obs [T, E, ...])``.
        Pure; jit-safe.
    """
    T = reward.shape[0]
    t = jnp.arange(T).reshape((T,) + (1,) * (reward.ndim - 1))

    def ahead(x: jax.Array, k: int) -> jax.Array:  # x[t + k], the last step repeated past T
        return jnp.concatenate([x[k:], jnp.repeat(x[-1:], k, axis=0)], axis=0) if k else x

    total = jnp.zeros(reward.shape, jnp.float32)
    discount = jnp.zeros(reward.shape, jnp.float32)
    boot = next_obs
    alive = jnp.ones(reward.shape, bool)
    power = jnp.float32(1.0)
    for k in range(n):
        term, trunc = ahead(terminated, k), ahead(truncated, k)
        total = total + jnp.where(alive, power * ahead(reward, k), 0.0)
        power = power * gamma
        last = alive & (term | trunc | (t + k == T - 1) | (k == n - 1))
        discount = jnp.where(last, jnp.where(term, 0.0, power), discount)
        mask = last.reshape(last.shape + (1,) * (next_obs.ndim - last.ndim))
        boot = jnp.where(mask, ahead(next_obs, k), boot)
        alive = alive & ~last
    return total, discount, boot


def _rows(x: jax.Array) -> jax.Array:
    """``[T, E, ...]`` -> ``[E, T, ...]``: one buffer row per env."""
    return jnp.swapaxes(x, 0, 1)


def sac_items(steps: HandSteps) -> offpolicy.ReplayTransition:
    """The buffer items of one iteration (leaves ``[E, T, ...]``), every one valid."""
    return offpolicy.ReplayTransition(
        obs=_rows(steps.obs),
        action=_rows(steps.action),
        reward=_rows(steps.reward),
        next_obs=_rows(steps.next_obs),
        terminated=_rows(steps.terminated),
        truncated=_rows(steps.truncated),
        extras={},
        valid=jnp.ones(_rows(steps.reward).shape, bool),
    )


def dqn_items(steps: HandSteps, n: int, gamma: float) -> offpolicy.ReplayTransition:
    """:func:`sac_items` with the n-step target parts in the extras (the names
    ``examples/dqn.py``'s learner reads)."""
    total, discount, boot = n_step(
        steps.reward, steps.terminated, steps.truncated, steps.next_obs, n, gamma
    )
    extras = {"n_step_reward": total, "n_step_discount": discount, "n_step_obs": boot}
    return sac_items(steps).replace(extras=jax.tree.map(_rows, extras))


# --------------------------------------------------------------------------- training


@struct.dataclass
class HandState:
    """The hand-written loop's scan carry: the learner's carry (the example's ``update``
    carry without the buffer), the envs, the buffer, the update key, the log window."""

    learner: Any
    envs: HandEnvs
    buffer: Any
    key: jax.Array
    window: common.LogWindow


@dataclasses.dataclass(frozen=True)
class HandTrain:
    """``train(key) -> (HandState, metrics [num_iterations])`` (pure; jit it), its first
    state (``init(key)``), the rollout of one iteration (``run(params, envs)``), the item
    builder, the acting params ``run`` gets from a state at iteration ``i``
    (``acting(state, i)``) and the greedy params of a final state for the example's policy
    (``greedy(state)``)."""

    train: Callable
    init: Callable
    run: Callable
    items: Callable
    acting: Callable
    greedy: Callable


def _hand_train(
    cfg: Any,
    run: Callable,
    replay: offpolicy.TransitionReplay,
    update: Callable,
    acting_params: Callable,
    items: Callable,
    init: Callable,
) -> Callable:
    """The PureJaxRL-style loop both algorithms share: collect (``run``, a
    :func:`hand_rollout`), add, learn, log."""

    def iteration(hs: HandState, i: jax.Array) -> tuple[HandState, dict[str, jax.Array]]:
        steps = (i + 1) * cfg.steps_per_iteration
        envs, tr = run(acting_params(hs.learner, i), hs.envs)
        batch = items(tr)
        offpolicy.check_batch(batch, hs.buffer, rows_must_match=False)
        buf = replay.buffer.add(hs.buffer, batch)
        done = tr.terminated | tr.truncated
        ret_sum, episodes = tr.ended_return.sum(), done.sum().astype(jnp.float32)
        key, k_up = jax.random.split(hs.key)
        ready = (steps >= cfg.learning_starts) & replay.can_sample(buf)
        carry, loss = common.learn_if(
            ready, update, (*hs.learner, buf), k_up, cfg.updates_per_iteration
        )
        window = common.advance(hs.window, cfg.log_every, i, steps, ret_sum, episodes, loss, ready)
        hs = HandState(tuple(carry[:-1]), envs, buf, key, window)
        return hs, {"return_sum": ret_sum, "episodes": episodes, "loss": loss}

    return common.scan_train(iteration, init, cfg.num_iterations)


def make_hand_dqn(cfg: dqn.DQNConfig, parts: dqn.Parts | None = None) -> HandTrain:
    """``examples/dqn.py``'s Double DQN (its ``parts``: network, buffer, ``update``,
    optimizer, exploration schedule) with the collection written by hand."""
    parts = dqn.make_parts(cfg) if parts is None else parts
    space: Any = parts.env.action_space

    def act(params: Any, obs: jax.Array, key: jax.Array) -> jax.Array:
        online, eps = params
        greedy = jnp.argmax(parts.policy.q_values(online, obs), -1)
        k_coin, k_action = jax.random.split(key)
        random = jax.random.randint(k_action, greedy.shape, 0, space.n)
        pick = jnp.where(jax.random.uniform(k_coin, greedy.shape) < eps, random, greedy)
        return (pick + space.start).astype(space.dtype)

    def init(key: jax.Array) -> HandState:
        k_net, k_env, k_loop = jax.random.split(key, 3)  # the example's split
        online = parts.policy.init(k_net)["q"]
        envs = reset_envs(parts.env, parts.env.default_params, cfg.num_envs, k_env)
        learner = (online, online, parts.tx.init(online))
        return HandState(learner, envs, parts.replay.init(), k_loop, common.log_window())

    acting = lambda learner, i: (learner[0], parts.epsilon(i * cfg.steps_per_iteration))
    items = lambda tr: dqn_items(tr, cfg.n_step, cfg.gamma)
    run = hand_rollout(parts.env, parts.env.default_params, cfg.num_envs, cfg.rollout_length, act)
    train = _hand_train(cfg, run, parts.replay, parts.update, acting, items, init)
    greedy = lambda hs: {"q": hs.learner[0], "epsilon": 0.0}
    return HandTrain(train, init, run, items, lambda hs, i: acting(hs.learner, i), greedy)


def make_hand_sac(cfg: sac.SACConfig, parts: sac.Parts | None = None) -> HandTrain:
    """``examples/sac.py``'s SAC (its ``parts``: networks, buffer, ``update``) with the
    collection written by hand."""
    parts = sac.make_parts(cfg) if parts is None else parts
    shape = parts.env.action_space.shape

    def act(actor: Any, obs: jax.Array, key: jax.Array) -> jax.Array:
        flat, _ = parts.policy.sample(actor, obs, key)
        return flat.reshape(flat.shape[:-1] + shape)

    def init(key: jax.Array) -> HandState:
        _, _, k_env, k_loop = jax.random.split(key, 4)  # the example's split
        envs = reset_envs(parts.env, parts.env.default_params, cfg.num_envs, k_env)
        learner = parts.init_learner(key)
        return HandState(learner, envs, parts.replay.init(), k_loop, common.log_window())

    run = hand_rollout(parts.env, parts.env.default_params, cfg.num_envs, cfg.rollout_length, act)
    actor = lambda learner, i: learner[0].actor
    train = _hand_train(cfg, run, parts.replay, parts.update, actor, sac_items, init)
    greedy = lambda hs: hs.learner[0].actor
    return HandTrain(train, init, run, sac_items, lambda hs, i: actor(hs.learner, i), greedy)
