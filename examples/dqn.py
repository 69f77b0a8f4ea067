"""Double DQN with n-step targets on CartPole-v1: the whole training run in one ``jax.jit``.

Each iteration of a ``lax.scan``:

1. a ``make_rollout`` call of ``rollout_length`` steps in ``num_envs`` envs with an
   epsilon-greedy Q policy (:class:`QPolicy`; epsilon is a *param*, so the schedule never
   recompiles);
2. n-step targets inside the call (:func:`jaxsampler.offpolicy.n_step_targets`: no
   bootstrap after a termination, the real final observation after a truncation at the
   500-step limit, the observation the next call starts from at the cut), stored with
   the transitions in a flashbax item buffer (:func:`jaxsampler.offpolicy.make_transition_buffer`);
3. ``updates_per_iteration`` Double-DQN steps (online argmax, target-network value, Huber
   loss, adam with a linearly decaying learning rate) on uniformly sampled batches,
   weighted by ``valid`` (reset steps are stored but do not count), and a Polyak update
   of the target network.

    python -m examples.dqn                 # 3 seeds, writes benchmarks/results/dqn_cartpole.*
    python -m examples.dqn --quick         # tiny smoke run (CI); writes only with --out
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

import jaxsampler as js
from benchmarks import harness
from examples import offpolicy_common as common
from jaxsampler import offpolicy
from jaxsampler.spaces import Discrete, Space


@dataclasses.dataclass(frozen=True)
class DQNConfig(common.IterationSizes):
    env_id: str = "CartPole-v1"
    num_envs: int = 8
    rollout_length: int = 16
    total_timesteps: int = 400_000
    updates_per_iteration: int = 32
    batch_size: int = 256
    buffer_size: int = 50_000
    learning_starts: int = 5_000
    lr: float = 5e-4
    lr_end: float = 0.0
    gamma: float = 0.99
    n_step: int = 3
    tau: float = 0.005
    epsilon_start: float = 1.0
    epsilon_end: float = 0.02
    exploration_fraction: float = 0.25
    max_grad_norm: float = 10.0
    hidden_sizes: tuple[int, ...] = (128, 128)
    eval_episodes: int = 20
    log_every: int = 250


#: ``--quick`` (CI): the same code at tiny sizes, seconds after compiling.
QUICK = dict(rollout_length=4, total_timesteps=2_048, updates_per_iteration=4, batch_size=32,
             buffer_size=2_048, learning_starts=256, hidden_sizes=(32, 32), eval_episodes=2,
             log_every=16)  # fmt: skip


class QNetwork(nn.Module):
    """A ReLU MLP from flat observations ``float32[B, F]`` to ``float32[B, num_actions]``."""

    num_actions: int
    hidden_sizes: Sequence[int]

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for h in self.hidden_sizes:
            x = nn.relu(nn.Dense(h)(x))
        return nn.Dense(self.num_actions)(x)


@dataclasses.dataclass(frozen=True)
class QPolicy(js.Policy):
    """Epsilon-greedy over a Q network, for ``Discrete`` actions and ``Box`` observations.

    Params: ``{"q": network params, "epsilon": float32[]}`` (the exploration rate is a
    runtime value, not configuration). ``explore=False`` (``js.policies.greedy``, what
    ``js.evaluate`` uses) always takes the argmax. Extras: none.
    """

    observation_space: Space
    action_space: Space
    hidden_sizes: tuple[int, ...] = (64, 64)
    explore: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.action_space, Discrete):
            raise TypeError(f"QPolicy needs Discrete actions, got {self.action_space!r}")

    @property
    def network(self) -> QNetwork:
        return QNetwork(self.action_space.n, self.hidden_sizes)  # type: ignore[attr-defined]

    def init(self, key: jax.Array) -> Any:
        x = jnp.zeros((1, int(np.prod(self.observation_space.shape))), jnp.float32)
        return {"q": self.network.init(key, x), "epsilon": jnp.ones((), jnp.float32)}

    def q_values(self, q_params: Any, obs: jax.Array) -> jax.Array:
        """``float32[*batch, n]`` for observations ``[*batch, *obs_shape]``."""
        batch = obs.shape[: obs.ndim - len(self.observation_space.shape)]
        x = obs.reshape((-1, int(np.prod(self.observation_space.shape)))).astype(jnp.float32)
        q: Any = self.network.apply(q_params, x)
        return q.reshape(batch + (q.shape[-1],))

    def __call__(self, params, obs, key, policy_state):
        q = self.q_values(params["q"], obs)
        action = jnp.argmax(q, -1)
        if self.explore:
            k_coin, k_act = jax.random.split(key)
            explore = jax.random.uniform(k_coin, action.shape) < params["epsilon"]
            random = jax.random.randint(k_act, action.shape, 0, q.shape[-1])
            action = jnp.where(explore, random, action)
        space: Any = self.action_space
        return (action + space.start).astype(space.dtype), {}, policy_state


def with_n_step(traj: js.Trajectory, n: int, gamma: float) -> js.Trajectory:
    """``traj`` with its n-step target parts in the extras (``float32[T, E, A]``
    ``n_step_reward`` and ``n_step_discount``, and ``n_step_obs``: the observation to
    bootstrap from, ``[T, E, A, ...]``), so the transition buffer stores them per step."""
    t = offpolicy.n_step_targets(
        traj.rewards, traj.terminated, traj.truncated, traj.acting, traj.is_reset, n, gamma
    )
    idx = t.bootstrap_index.reshape(t.bootstrap_index.shape + (1,) * (traj.obs.ndim - 3))
    idx = jnp.broadcast_to(idx, t.bootstrap_index.shape + traj.obs.shape[3:])
    extras = {
        **traj.extras,
        "n_step_reward": t.reward_sum,
        "n_step_discount": t.discount,
        "n_step_obs": jnp.take_along_axis(traj.obs, idx, axis=0),
    }
    return traj.replace(extras=extras)


def td_targets(
    policy: QPolicy, online: Any, target: Any, batch: offpolicy.ReplayTransition
) -> jax.Array:
    """Double-DQN n-step targets ``R + D * Q_target(s', argmax_a Q_online(s', a))`` of a
    sampled batch (``float32[S]``), ``R``, ``D`` and ``s'`` from :func:`with_n_step`."""
    s_next = batch.extras["n_step_obs"]
    a_star = jnp.argmax(policy.q_values(online, s_next), -1)
    q_next = jnp.take_along_axis(policy.q_values(target, s_next), a_star[..., None], -1)[..., 0]
    return batch.extras["n_step_reward"] + batch.extras["n_step_discount"] * q_next


@struct.dataclass
class TrainState:
    online: Any
    target: Any
    opt_state: Any
    rollout: js.RolloutState
    buffer: Any
    running: jax.Array
    key: jax.Array
    window: common.LogWindow


@dataclasses.dataclass(frozen=True)
class Parts:
    """The pieces of a run: ``init(key) -> TrainState``, ``iteration(state, i) -> (state,
    metrics)`` (a ``lax.scan`` body), the policy, the env, the replay buffer, and the
    learner's parts that a loop collecting its own way reuses
    (``benchmarks/offpolicy_baselines.py``): ``update((online, target, opt_state, buffer), key)
    -> (carry, loss)`` (one Double-DQN step on a sampled batch), the optimizer ``tx`` and
    ``epsilon(env_steps) -> float32[]`` (the exploration schedule); and ``collect(params,
    rollout_state) -> (rollout_state, trajectory with n-step extras)``, what ``iteration``
    adds to the buffer."""

    init: Any
    iteration: Any
    policy: QPolicy
    env: js.Env
    replay: offpolicy.TransitionReplay
    update: Any
    tx: Any
    epsilon: Any
    collect: Any


def make_parts(cfg: DQNConfig) -> Parts:
    env = js.make(cfg.env_id)
    policy = QPolicy(env.observation_space, env.action_space, cfg.hidden_sizes)
    rollout = js.make_rollout(env, policy, cfg.num_envs, cfg.rollout_length)

    def collect(params, state):
        state, traj = rollout(params, state)
        return state, with_n_step(traj, cfg.n_step, cfg.gamma)

    spec = jax.eval_shape(
        collect, policy.init(jax.random.PRNGKey(0)), rollout.init(jax.random.PRNGKey(0))
    )[1]
    replay = offpolicy.make_transition_buffer(spec, cfg.buffer_size, cfg.batch_size, cfg.batch_size)
    total_updates = cfg.num_iterations * cfg.updates_per_iteration
    tx = optax.chain(
        optax.clip_by_global_norm(cfg.max_grad_norm),
        optax.adam(optax.linear_schedule(cfg.lr, cfg.lr_end, total_updates)),
    )

    def epsilon(steps: jax.Array) -> jax.Array:
        frac = jnp.clip(steps / (cfg.exploration_fraction * cfg.total_timesteps), 0.0, 1.0)
        return (cfg.epsilon_start + frac * (cfg.epsilon_end - cfg.epsilon_start)).astype(
            jnp.float32
        )

    def loss_fn(online, target, batch):
        y = jax.lax.stop_gradient(td_targets(policy, online, target, batch))
        q = policy.q_values(online, batch.obs)
        q_a = jnp.take_along_axis(q, batch.action[..., None].astype(jnp.int32), -1)[..., 0]
        w = batch.valid.astype(jnp.float32)
        return (optax.huber_loss(q_a, y) * w).sum() / jnp.maximum(w.sum(), 1.0)

    def update(carry, key):
        online, target, opt_state, buf = carry
        batch = replay.sample(buf, key)
        loss, grads = jax.value_and_grad(loss_fn)(online, target, batch)
        updates, opt_state = tx.update(grads, opt_state, online)
        online = optax.apply_updates(online, updates)
        target = optax.incremental_update(online, target, cfg.tau)
        return (online, target, opt_state, buf), loss

    def init(key):
        k_net, k_env, k_loop = jax.random.split(key, 3)
        online = policy.init(k_net)["q"]
        return TrainState(
            online=online,
            target=online,
            opt_state=tx.init(online),
            rollout=rollout.init(k_env),
            buffer=replay.init(),
            running=jnp.zeros((cfg.num_envs,), jnp.float32),
            key=k_loop,
            window=common.log_window(),
        )

    def iteration(ts: TrainState, i):
        steps = (i + 1) * cfg.steps_per_iteration
        eps = epsilon(i * cfg.steps_per_iteration)
        rstate, traj = collect({"q": ts.online, "epsilon": eps}, ts.rollout)
        buf = replay.add(ts.buffer, traj)
        running, ret_sum, episodes = common.episode_returns(traj, ts.running)
        key, k_up = jax.random.split(ts.key)
        learn = (steps >= cfg.learning_starts) & replay.can_sample(buf)
        carry = (ts.online, ts.target, ts.opt_state, buf)
        (online, target, opt_state, _), loss = common.learn_if(
            learn, update, carry, k_up, cfg.updates_per_iteration
        )
        window = common.advance(ts.window, cfg.log_every, i, steps, ret_sum, episodes, loss, learn)
        ts = TrainState(online, target, opt_state, rstate, buf, running, key, window)
        return ts, {"return_sum": ret_sum, "episodes": episodes, "loss": loss, "epsilon": eps}

    return Parts(init, iteration, policy, env, replay, update, tx, epsilon, collect)


def make_train(cfg: DQNConfig):
    """``train(key) -> (final TrainState, metrics [num_iterations])``, pure; jit it."""
    parts = make_parts(cfg)
    return common.scan_train(parts.iteration, parts.init, cfg.num_iterations)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--total-timesteps", type=int, default=None)
    p.add_argument("--n-step", type=int, default=None)
    harness.add_quick_out(p, "dqn_cartpole")
    args = p.parse_args(argv)
    cfg = DQNConfig(**(QUICK if args.quick else {}))
    if args.total_timesteps is not None:
        cfg = dataclasses.replace(cfg, total_timesteps=args.total_timesteps)
    if args.n_step is not None:
        cfg = dataclasses.replace(cfg, n_step=args.n_step)
    res = common.train_and_record(
        "dqn_cartpole",
        "dqn",
        cfg,
        make_parts(cfg),
        args.seeds,
        lambda ts: {"q": ts.online, "epsilon": 0.0},
        "mean greedy evaluation return >= 475",
        notes(cfg),
        harness.results_dir(args.out, args.quick),
    )
    res_ok = all(m >= 475 for m in res["eval_mean_return_per_seed"])
    print(f"target (>= 475) reached by every seed: {res_ok}")
    return 0


def notes(cfg: DQNConfig) -> str:
    return (
        f"Double DQN, {cfg.n_step}-step targets (cut at each rollout call's end), "
        f"{cfg.num_envs} envs x {cfg.rollout_length} steps per iteration, "
        f"{cfg.updates_per_iteration} updates of batch {cfg.batch_size} per iteration, "
        f"flashbax item buffer of {cfg.buffer_size:,} transitions (learning from "
        f"{cfg.learning_starts:,} steps), adam lr {cfg.lr} -> {cfg.lr_end} (linear), "
        f"gamma {cfg.gamma}, Polyak tau {cfg.tau}, Huber loss, grad-norm clip "
        f"{cfg.max_grad_norm}, epsilon {cfg.epsilon_start} -> {cfg.epsilon_end} over the first "
        f"{cfg.exploration_fraction:.0%} of steps, ReLU MLP {cfg.hidden_sizes}. Train curve "
        f"(JSON): mean return of the episodes ended in each {cfg.log_every} iterations."
    )


if __name__ == "__main__":
    sys.exit(main())
