"""SAC on Pendulum-v1: the whole training run in one ``jax.jit``.

Each iteration of a ``lax.scan``:

1. a ``make_rollout`` call of ``rollout_length`` steps in ``num_envs`` envs with a
   tanh-squashed Gaussian actor (:class:`SquashedGaussianPolicy`);
2. its transitions added to a flashbax item buffer
   (:func:`jaxsampler.offpolicy.make_transition_buffer`): at the 200-step time limit
   ``next_obs`` is the real final observation and the step is ``truncated``, not
   ``terminated``, so the critic bootstraps there (Pendulum never terminates);
3. ``updates_per_iteration`` SAC updates (Haarnoja et al. 2018, with the learnt
   temperature): twin critics against ``r + gamma (1 - terminated) (min Q_target(s', a')
   - alpha log pi(a'|s'))``, the actor on ``alpha log pi(a|s) - min Q(s, a)``, the
   temperature towards entropy ``-action_dim``; Polyak-averaged target critics; adam.

    python -m examples.sac                 # 3 seeds, writes benchmarks/results/sac_pendulum.*
    python -m examples.sac --quick         # tiny smoke run (CI); writes only with --out
"""

from __future__ import annotations

import argparse
import dataclasses
import math
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
from jaxsampler.spaces import Box, Space

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


@dataclasses.dataclass(frozen=True)
class SACConfig(common.IterationSizes):
    env_id: str = "Pendulum-v1"
    num_envs: int = 8
    rollout_length: int = 8
    total_timesteps: int = 40_000
    updates_per_iteration: int = 64
    batch_size: int = 256
    buffer_size: int = 100_000
    learning_starts: int = 2_048
    actor_lr: float = 1e-3
    critic_lr: float = 1e-3
    alpha_lr: float = 1e-3
    gamma: float = 0.99
    tau: float = 0.005
    hidden_sizes: tuple[int, ...] = (128, 128)
    eval_episodes: int = 20
    log_every: int = 50


#: ``--quick`` (CI): the same code at tiny sizes, seconds after compiling.
QUICK = dict(num_envs=4, total_timesteps=1_024, updates_per_iteration=4, batch_size=32,
             learning_starts=256, buffer_size=1_024, hidden_sizes=(32, 32), eval_episodes=2,
             log_every=8)  # fmt: skip


class MLP(nn.Module):
    sizes: Sequence[int]
    out: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for h in self.sizes:
            x = nn.relu(nn.Dense(h)(x))
        return nn.Dense(self.out)(x)


class TwinQ(nn.Module):
    """Two Q networks on ``concat(obs, action)``: ``(q1, q2)``, each ``float32[B]``."""

    hidden_sizes: Sequence[int]

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = jnp.concatenate([obs, action], -1)
        q1 = MLP(self.hidden_sizes, 1, name="q1")(x)[..., 0]
        return q1, MLP(self.hidden_sizes, 1, name="q2")(x)[..., 0]


def squash_log_std(raw: jax.Array) -> jax.Array:
    """Maps the network's output smoothly into ``[LOG_STD_MIN, LOG_STD_MAX]``."""
    return LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (jnp.tanh(raw) + 1.0)


@dataclasses.dataclass(frozen=True)
class SquashedGaussianPolicy(js.Policy):
    """``a = low + (tanh(u) + 1) (high - low) / 2``, ``u ~ N(mean(s), std(s))``, for a
    bounded float ``Box`` action space; ``explore=False`` acts with ``u = mean(s)``
    (``js.policies.greedy``, what ``js.evaluate`` uses). Params: the actor network's.
    Extras: none (SAC re-samples its actions when it learns)."""

    observation_space: Space
    action_space: Space
    hidden_sizes: tuple[int, ...] = (128, 128)
    explore: bool = True

    def __post_init__(self) -> None:
        space = self.action_space
        if not isinstance(space, Box) or not np.all(np.isfinite(space.low + space.high)):
            raise TypeError(f"SquashedGaussianPolicy needs a bounded Box, got {space!r}")

    @property
    def action_dim(self) -> int:
        return int(np.prod(self.action_space.shape))

    @property
    def network(self) -> MLP:
        return MLP(self.hidden_sizes, 2 * self.action_dim)

    def init(self, key: jax.Array) -> Any:
        return self.network.init(key, jnp.zeros((1, self.obs_dim), jnp.float32))

    @property
    def obs_dim(self) -> int:
        return int(np.prod(self.observation_space.shape))

    def flat_obs(self, obs: jax.Array) -> jax.Array:
        batch = obs.shape[: obs.ndim - len(self.observation_space.shape)]
        return obs.reshape(batch + (self.obs_dim,)).astype(jnp.float32)

    def scale(self) -> tuple[jax.Array, jax.Array]:
        """``(half range, centre)`` of the action space, flat ``float32[d]``."""
        box: Any = self.action_space
        low = np.asarray(box.low, np.float32).reshape(-1)
        high = np.asarray(box.high, np.float32).reshape(-1)
        return jnp.asarray((high - low) / 2), jnp.asarray((high + low) / 2)

    def dist(self, params: Any, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(mean, log_std)`` of ``u``, ``float32[*batch, d]`` each."""
        out: Any = self.network.apply(params, self.flat_obs(obs))
        mean, raw = jnp.split(out, 2, axis=-1)
        return mean, squash_log_std(raw)

    def sample(self, params: Any, obs: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """A sampled flat action ``float32[*batch, d]`` (in the env's bounds) and its
        log-density ``float32[*batch]`` (the tanh and the rescaling accounted for)."""
        mean, log_std = self.dist(params, obs)
        eps = jax.random.normal(key, mean.shape, mean.dtype)
        u = mean + jnp.exp(log_std) * eps
        half, centre = self.scale()
        # log(1 - tanh(u)^2) in a stable form: 2 (log 2 - u - softplus(-2u)).
        log_det = 2.0 * (math.log(2.0) - u - jax.nn.softplus(-2.0 * u)) + jnp.log(half)
        logp = jnp.sum(-0.5 * eps**2 - log_std - 0.5 * math.log(2 * math.pi) - log_det, -1)
        return centre + half * jnp.tanh(u), logp

    def __call__(self, params, obs, key, policy_state):
        if self.explore:
            flat, _ = self.sample(params, obs, key)
        else:
            half, centre = self.scale()
            flat = centre + half * jnp.tanh(self.dist(params, obs)[0])
        action = flat.reshape(flat.shape[:-1] + self.action_space.shape)
        return action.astype(self.action_space.dtype), {}, policy_state


@struct.dataclass
class Learner:
    """The learnt parameters: actor, critics, target critics and ``log_alpha``."""

    actor: Any
    critic: Any
    target: Any
    log_alpha: jax.Array


def critic_targets(
    policy: SquashedGaussianPolicy,
    critic: TwinQ,
    learner: Learner,
    batch: offpolicy.ReplayTransition,
    key: jax.Array,
    gamma: float,
) -> jax.Array:
    """Soft TD targets ``float32[S]`` of a sampled batch: ``r + gamma (1 - terminated)
    (min Q_target(s', a') - alpha log pi(a'|s'))``, ``a' ~ pi(.|s')`` drawn with ``key``
    (a truncated step bootstraps from its real final observation)."""
    a_next, logp_next = policy.sample(learner.actor, batch.next_obs, key)
    q1, q2 = critic.apply(learner.target, policy.flat_obs(batch.next_obs), a_next)
    soft = jnp.minimum(q1, q2) - jnp.exp(learner.log_alpha) * logp_next
    return batch.reward + gamma * (1.0 - batch.terminated.astype(jnp.float32)) * soft


@struct.dataclass
class TrainState:
    learner: Learner
    opt_states: Any
    rollout: js.RolloutState
    buffer: Any
    running: jax.Array
    key: jax.Array
    window: common.LogWindow


@dataclasses.dataclass(frozen=True)
class Parts:
    """``init(key) -> TrainState``, ``iteration(state, i) -> (state, metrics)`` (a
    ``lax.scan`` body), what they are built from, and the learner's parts that a loop
    collecting its own way reuses (``benchmarks/offpolicy_baselines.py``): ``init_learner(key)
    -> (Learner, optimizer states)`` (the key ``init`` splits for the networks) and
    ``update((learner, opt_states, buffer), key) -> (carry, loss)`` (one SAC step on a
    sampled batch); and ``collect(actor_params, rollout_state) -> (rollout_state,
    trajectory)`` (the rollout ``iteration`` adds to the buffer)."""

    init: Any
    iteration: Any
    policy: SquashedGaussianPolicy
    critic: TwinQ
    env: js.Env
    replay: offpolicy.TransitionReplay
    init_learner: Any
    update: Any
    collect: Any


def make_parts(cfg: SACConfig) -> Parts:
    env = js.make(cfg.env_id)
    policy = SquashedGaussianPolicy(env.observation_space, env.action_space, cfg.hidden_sizes)
    critic = TwinQ(cfg.hidden_sizes)
    rollout = js.make_rollout(env, policy, cfg.num_envs, cfg.rollout_length)
    k0 = jax.random.PRNGKey(0)
    spec = jax.eval_shape(rollout, policy.init(k0), rollout.init(k0))[1]
    replay = offpolicy.make_transition_buffer(spec, cfg.buffer_size, cfg.batch_size, cfg.batch_size)
    txs = {
        "actor": optax.adam(cfg.actor_lr),
        "critic": optax.adam(cfg.critic_lr),
        "alpha": optax.adam(cfg.alpha_lr),
    }
    target_entropy = -float(policy.action_dim)

    def weighted_mean(x, batch):
        w = batch.valid.astype(jnp.float32)
        return (x * w).sum() / jnp.maximum(w.sum(), 1.0)

    def critic_loss(params, learner, batch, key):
        y = jax.lax.stop_gradient(critic_targets(policy, critic, learner, batch, key, cfg.gamma))
        q1, q2 = critic.apply(params, policy.flat_obs(batch.obs), batch.action)
        return weighted_mean((q1 - y) ** 2 + (q2 - y) ** 2, batch)

    def actor_loss(params, learner, batch, key):
        action, logp = policy.sample(params, batch.obs, key)
        q1, q2 = critic.apply(learner.critic, policy.flat_obs(batch.obs), action)
        alpha = jnp.exp(learner.log_alpha)
        return weighted_mean(alpha * logp - jnp.minimum(q1, q2), batch), logp

    def alpha_loss(log_alpha, logp, batch):
        return weighted_mean(-log_alpha * jax.lax.stop_gradient(logp + target_entropy), batch)

    def step(tx, params, opt_state, grads):
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def update(carry, key):
        learner, opts, buf = carry
        k_sample, k_critic, k_actor = jax.random.split(key, 3)
        batch = replay.sample(buf, k_sample)
        batch = batch.replace(action=batch.action.reshape(batch.action.shape[:1] + (-1,)))
        loss, g = jax.value_and_grad(critic_loss)(learner.critic, learner, batch, k_critic)
        c, opt_c = step(txs["critic"], learner.critic, opts["critic"], g)
        learner = learner.replace(critic=c)
        (_, logp), g = jax.value_and_grad(actor_loss, has_aux=True)(
            learner.actor, learner, batch, k_actor
        )
        a, opt_a = step(txs["actor"], learner.actor, opts["actor"], g)
        g = jax.grad(alpha_loss)(learner.log_alpha, logp, batch)
        la, opt_al = step(txs["alpha"], learner.log_alpha, opts["alpha"], g)
        target = optax.incremental_update(c, learner.target, cfg.tau)
        learner = Learner(actor=a, critic=c, target=target, log_alpha=la)
        return (learner, {"actor": opt_a, "critic": opt_c, "alpha": opt_al}, buf), loss

    def init_learner(key):
        k_actor, k_critic, _, _ = jax.random.split(key, 4)
        obs = jnp.zeros((1, policy.obs_dim), jnp.float32)
        critic_params = critic.init(k_critic, obs, jnp.zeros((1, policy.action_dim)))
        learner = Learner(
            actor=policy.init(k_actor),
            critic=critic_params,
            target=critic_params,
            log_alpha=jnp.zeros((), jnp.float32),
        )
        opts = {
            "actor": txs["actor"].init(learner.actor),
            "critic": txs["critic"].init(learner.critic),
            "alpha": txs["alpha"].init(learner.log_alpha),
        }
        return learner, opts

    def init(key):
        _, _, k_env, k_loop = jax.random.split(key, 4)
        learner, opts = init_learner(key)
        return TrainState(
            learner=learner,
            opt_states=opts,
            rollout=rollout.init(k_env),
            buffer=replay.init(),
            running=jnp.zeros((cfg.num_envs,), jnp.float32),
            key=k_loop,
            window=common.log_window(),
        )

    def iteration(ts: TrainState, i):
        steps = (i + 1) * cfg.steps_per_iteration
        rstate, traj = rollout(ts.learner.actor, ts.rollout)
        buf = replay.add(ts.buffer, traj)
        running, ret_sum, episodes = common.episode_returns(traj, ts.running)
        key, k_up = jax.random.split(ts.key)
        learn = (steps >= cfg.learning_starts) & replay.can_sample(buf)
        carry = (ts.learner, ts.opt_states, buf)
        (learner, opts, _), loss = common.learn_if(
            learn, update, carry, k_up, cfg.updates_per_iteration
        )
        window = common.advance(ts.window, cfg.log_every, i, steps, ret_sum, episodes, loss, learn)
        ts = TrainState(learner, opts, rstate, buf, running, key, window)
        alpha = jnp.exp(learner.log_alpha)
        return ts, {"return_sum": ret_sum, "episodes": episodes, "loss": loss, "alpha": alpha}

    return Parts(init, iteration, policy, critic, env, replay, init_learner, update, rollout)


def make_train(cfg: SACConfig):
    """``train(key) -> (final TrainState, metrics [num_iterations])``, pure; jit it."""
    parts = make_parts(cfg)
    return common.scan_train(parts.iteration, parts.init, cfg.num_iterations)


def notes(cfg: SACConfig) -> str:
    return (
        f"SAC with a learnt temperature (target entropy -action_dim), {cfg.num_envs} envs x "
        f"{cfg.rollout_length} steps per iteration, {cfg.updates_per_iteration} updates of "
        f"batch {cfg.batch_size} per iteration, flashbax item buffer of {cfg.buffer_size:,} "
        f"transitions (learning from {cfg.learning_starts:,} steps), adam lr actor "
        f"{cfg.actor_lr} / critic {cfg.critic_lr} / alpha {cfg.alpha_lr}, gamma {cfg.gamma}, "
        f"Polyak tau {cfg.tau}, ReLU MLPs {cfg.hidden_sizes} (actor; each of the twin "
        f"critics). Train curve (JSON): mean return of the episodes ended in each "
        f"{cfg.log_every} iterations."
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--total-timesteps", type=int, default=None)
    harness.add_quick_out(p, "sac_pendulum")
    args = p.parse_args(argv)
    cfg = SACConfig(**(QUICK if args.quick else {}))
    if args.total_timesteps is not None:
        cfg = dataclasses.replace(cfg, total_timesteps=args.total_timesteps)
    res = common.train_and_record(
        "sac_pendulum",
        "sac",
        cfg,
        make_parts(cfg),
        args.seeds,
        lambda ts: ts.learner.actor,
        "mean greedy evaluation return > -250",
        notes(cfg),
        harness.results_dir(args.out, args.quick),
    )
    ok = all(m > -250 for m in res["eval_mean_return_per_seed"])
    print(f"target (> -250) reached by every seed: {ok}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
