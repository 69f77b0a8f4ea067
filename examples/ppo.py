"""PPO in the PureJaxRL style on jaxsampler's rollout: one jitted function per training run.

The whole iteration — ``make_rollout`` rollout, GAE with correct truncation bootstraps
(:func:`jaxsampler.compute_gae`), minibatch epochs with optax — runs inside one
``jax.jit`` (a ``lax.scan`` over updates).

    python -m examples.ppo --env CartPole-v1 --seeds 3                 # ~500k steps
    python -m examples.ppo --env Pendulum-v1 --seeds 3                 # ~1M steps
    python -m examples.ppo --env CartPole-v1 --sampler handwritten    # baseline loop
    python -m examples.ppo --env Breakout-MinAtar --seeds 2            # CNN policy, ~1M steps

``--sampler handwritten`` swaps the sampler for a plain gymnax ``vmap`` + ``lax.scan``
loop (gymnax's own same-step auto-reset, as in PureJaxRL) with the same network,
algorithm and hyperparameters, to compare wall-clock time and env steps/s.

Checkpoint and resume::

    python -m examples.ppo --env Pendulum-v1 --checkpoint-dir runs/pendulum   # interrupted...
    python -m examples.ppo --env Pendulum-v1 --checkpoint-dir runs/pendulum   # ...resumes

With ``--checkpoint-dir`` (or ``--checkpoint-every N``) training runs in jitted chunks of
``N`` updates (default: a tenth of the run), the same ``update`` scanned ``N`` times, and
after each chunk the whole training state of every seed (params, optimizer state, the
rollout state with its RNG keys, running episode returns, per-update metrics so far) is
written with ``js.checkpoint`` (newest two kept). Rerunning the same command resumes from
the newest checkpoint; the resumed run's per-update metrics equal an uninterrupted one's
bit for bit, and a checkpoint of other options is refused, naming the fields that differ.
The chunks run the single jit's program (see :func:`chunk_update`), so a chunked run also
equals the default single-jit run bit for bit (measured at the full default sizes:
CartPole with both samplers, Pendulum with jaxsampler's; curves and final params).
``--stop-after K`` exits after the chunk holding update ``K`` (an interruption, for tests).

``--log-dir DIR`` (``--logger jsonl|tensorboard|wandb``) writes one line per update
(episode return, losses; env steps/s per chunk); a progress bar over env steps shows
unless ``--quiet`` or stderr is not a terminal.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxsampler as js
from jaxsampler.policies.mlp import log_prob

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    env_id: str = "CartPole-v1"
    num_envs: int = 4
    rollout_length: int = 128
    total_timesteps: int = 500_000
    update_epochs: int = 4
    num_minibatches: int = 4
    lr: float = 2.5e-4
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    hidden_sizes: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    policy: str = "mlp"  # or "cnn" (js.CNNPolicy: one conv layer, then hidden_sizes)
    sampler: str = "jaxsampler"  # or "handwritten"

    @property
    def num_updates(self) -> int:
        return max(1, self.total_timesteps // (self.num_envs * self.rollout_length))


#: Per-env defaults (PureJaxRL's CartPole settings; a common PPO setting for Pendulum;
#: for Breakout-MinAtar the PureJaxRL-derived MinAtar PPO settings -- 128-step rollouts,
#: lr 3e-4 without annealing, 3 epochs, gamma 0.99, lambda 0.95, clip 0.2, entropy 0.01 --
#: with 16 envs instead of thousands, to fit 2 CPU cores, and MinAtar's reference-sized
#: network: one 3x3 conv with 16 channels, a 128-unit ReLU layer).
DEFAULTS = {
    "CartPole-v1": PPOConfig(),
    "Pendulum-v1": PPOConfig(
        env_id="Pendulum-v1",
        num_envs=8,
        rollout_length=256,
        total_timesteps=1_000_000,
        update_epochs=10,
        num_minibatches=32,
        lr=1e-3,
        gamma=0.9,
        gae_lambda=0.95,
        ent_coef=0.0,
        anneal_lr=True,
    ),
    "Breakout-MinAtar": PPOConfig(
        env_id="gymnax:Breakout-MinAtar",
        num_envs=16,
        rollout_length=128,
        total_timesteps=1_000_000,
        update_epochs=3,
        num_minibatches=4,
        lr=3e-4,
        anneal_lr=False,
        hidden_sizes=(128,),
        activation="relu",
        policy="cnn",
    ),
}

#: The networks PPO trains here (same ``forward`` / ``log_prob`` interface).
ActorCritic = js.MLPPolicy | js.CNNPolicy

#: The policy class of each ``PPOConfig.policy``.
POLICIES = {"mlp": js.MLPPolicy, "cnn": js.CNNPolicy}


def make_policy(cfg: PPOConfig, env: js.Env) -> ActorCritic:
    """The network of ``cfg`` for ``env`` (``cfg.policy``: ``"mlp"`` or ``"cnn"``).

    Raises:
        ValueError: an unknown ``cfg.policy``.
    """
    if cfg.policy not in POLICIES:
        raise ValueError(f"policy must be one of {sorted(POLICIES)}, got {cfg.policy!r}")
    return POLICIES[cfg.policy](
        env.observation_space,
        env.action_space,
        hidden_sizes=cfg.hidden_sizes,
        activation=cfg.activation,
    )


# ----------------------------------------------------------------------------- samplers


def ppo_batch(cfg: PPOConfig, policy: ActorCritic, params, traj, state) -> dict:
    """The learner's batch of one rollout call: what the policy saw (transformed, if the
    rollout has transforms), its outputs, GAE advantages and value targets on
    ``traj.rewards`` (bootstrapped from the observation the next call starts from), and
    the acting mask."""
    _, last_value, _ = policy.forward(params, state.obs)
    adv = js.compute_gae(traj, last_value, cfg.gamma, cfg.gae_lambda)
    return {
        "obs": traj.obs[:-1],
        "actions": traj.actions,
        "logp": traj.extras["action_logp"],
        "values": traj.extras["vf_preds"],
        "advantages": adv.advantages,
        "targets": adv.value_targets,
        "mask": traj.acting,
    }


def jaxsampler_sampler(cfg: PPOConfig, env: js.Env, policy: ActorCritic):
    """``(init(key), rollout(params, state) -> (state, batch))`` over jaxsampler."""
    rollout = js.make_rollout(env, policy, cfg.num_envs, cfg.rollout_length)
    init = rollout.init  # the state initialiser of the same sizes

    def run(params, state):
        state, traj = rollout(params, state)
        batch = ppo_batch(cfg, policy, params, traj, state)
        batch["rewards"] = traj.rewards
        batch["done"] = traj.terminated | traj.truncated
        return state, batch

    return init, run


def handwritten_sampler(cfg: PPOConfig, env: js.Env, policy: ActorCritic):
    """The PureJaxRL shape: ``vmap`` of gymnax's auto-resetting ``step`` inside ``lax.scan``."""
    import gymnax

    genv, gparams = gymnax.make(cfg.env_id.removeprefix("gymnax:"))
    E, T = cfg.num_envs, cfg.rollout_length

    def init(key):
        k_reset, k_loop = jax.random.split(key)
        obs, st = jax.vmap(genv.reset, in_axes=(0, None))(jax.random.split(k_reset, E), gparams)
        return (obs, st, k_loop)

    def run(params, carry):
        def body(c, _):
            obs, st, key = c
            key, k_act, k_step = jax.random.split(key, 3)
            dist, value, log_std = policy.forward(params, obs)
            if log_std is None:
                action = jax.random.categorical(k_act, dist)
            else:
                action = dist + jnp.exp(log_std) * jax.random.normal(k_act, dist.shape)
            logp = log_prob(policy.action_space, dist, log_std, action)
            obs2, st, r, term, trunc, _ = jax.vmap(genv.step, in_axes=(0, 0, 0, None))(
                jax.random.split(k_step, E), st, action, gparams
            )
            return (obs2, st, key), (obs, action, r, term, trunc, logp, value)

        carry, (obs, actions, rewards, term, trunc, logp, values) = jax.lax.scan(
            body, carry, None, T
        )
        _, last_value, _ = policy.forward(params, carry[0])
        add_agent = lambda x: x[:, :, None]
        adv = js.postprocessing.gae(
            add_agent(rewards),
            add_agent(values),
            add_agent(term),
            add_agent(trunc),
            jnp.ones((T, E, 1), bool),
            jnp.zeros((T, E), bool),
            last_value[:, None],
            cfg.gamma,
            cfg.gae_lambda,
        )
        batch = {
            "obs": obs[:, :, None],
            "actions": add_agent(actions),
            "logp": add_agent(logp),
            "values": add_agent(values),
            "advantages": adv.advantages,
            "targets": adv.value_targets,
            "mask": jnp.ones((T, E, 1), bool),
            "rewards": add_agent(rewards),
            "done": add_agent(term | trunc),
        }
        return carry, batch

    return init, run


# ----------------------------------------------------------------------------- PPO


def make_loss(cfg: PPOConfig, policy: ActorCritic, with_aux: bool = False):
    """The clipped PPO loss over a minibatch dict (``obs``, ``actions``, ``logp``, ``values``,
    ``advantages``, ``targets``, ``mask``); rows where ``mask`` is False do not count.

    ``with_aux``: return ``(loss, {"pg_loss", "vf_loss", "entropy", "approx_kl"})`` (scalars)
    instead of the loss alone (for ``jax.value_and_grad(..., has_aux=True)``)."""

    def loss_fn(params, mb):
        dist, value, log_std = policy.forward(params, mb["obs"])
        logp = log_prob(policy.action_space, dist, log_std, mb["actions"])
        w = mb["mask"].astype(jnp.float32)
        n = jnp.maximum(w.sum(), 1.0)
        mean = lambda x: (x * w).sum() / n
        ratio = jnp.exp(logp - mb["logp"])
        adv = mb["advantages"]
        a_mean = mean(adv)
        adv = (adv - a_mean) / (jnp.sqrt(mean((adv - a_mean) ** 2)) + 1e-8)
        pg = -mean(
            jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps) * adv)
        )
        v_clipped = mb["values"] + jnp.clip(value - mb["values"], -cfg.clip_eps, cfg.clip_eps)
        vf = 0.5 * mean(jnp.maximum((value - mb["targets"]) ** 2, (v_clipped - mb["targets"]) ** 2))
        if log_std is None:
            probs = jax.nn.softmax(dist)
            entropy = mean(-(probs * jax.nn.log_softmax(dist)).sum(-1))
        else:
            entropy = jnp.sum(log_std + 0.5 * jnp.log(2 * jnp.pi * jnp.e))
        loss = pg + cfg.vf_coef * vf - cfg.ent_coef * entropy
        if not with_aux:
            return loss
        aux = {
            "pg_loss": pg,
            "vf_loss": vf,
            "entropy": entropy,
            "approx_kl": mean(-(logp - mb["logp"])),
        }
        return loss, aux

    return loss_fn


def make_optimizer(cfg: PPOConfig) -> optax.GradientTransformation:
    """Adam with global-norm clipping; the learning rate anneals linearly over the updates."""

    def schedule(count):
        frac = 1.0 - (count // (cfg.num_minibatches * cfg.update_epochs)) / cfg.num_updates
        return cfg.lr * frac

    return optax.chain(
        optax.clip_by_global_norm(cfg.max_grad_norm),
        optax.adam(schedule if cfg.anneal_lr else cfg.lr, eps=1e-5),
    )


def make_epochs(
    cfg: PPOConfig, loss_fn: Any, tx: optax.GradientTransformation, with_stats: bool = False
):
    """``epochs(params, opt_state, data, key)``: ``update_epochs`` passes over ``data`` (rows on
    axis 0), each in ``num_minibatches`` shuffled minibatches. Jittable.

    ``with_stats``: ``loss_fn`` returns ``(loss, aux)`` (``make_loss(..., with_aux=True)``) and
    ``epochs`` returns ``(params, opt_state, stats)``, ``stats`` the loss and the aux scalars
    averaged over all minibatches of all epochs."""

    def epochs(params, opt_state, data, key):
        def epoch(c, k):
            # argsort of uniforms: a permutation that avoided an XLA CPU hang seen with
            # jax.random.permutation in vmapped training graphs.
            perm = jnp.argsort(jax.random.uniform(k, (data["mask"].shape[0],)))
            mbs = jax.tree.map(
                lambda x: x[perm].reshape((cfg.num_minibatches, -1) + x.shape[1:]), data
            )

            def minibatch(c, mb):
                params, opt_state = c
                if with_stats:
                    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, mb)
                    stats = {"loss": loss, **aux}
                else:
                    grads, stats = jax.grad(loss_fn)(params, mb), None
                updates, opt_state = tx.update(grads, opt_state, params)
                return (optax.apply_updates(params, updates), opt_state), stats

            return jax.lax.scan(minibatch, c, mbs)

        (params, opt_state), stats = jax.lax.scan(
            epoch, (params, opt_state), jax.random.split(key, cfg.update_epochs)
        )
        if not with_stats:
            return params, opt_state
        return params, opt_state, jax.tree.map(jnp.mean, stats)

    return epochs


@dataclasses.dataclass(frozen=True)
class TrainParts:
    """The pieces of one training run (all pure and jittable).

    Attributes:
        init: ``init(key) -> carry``; the carry is ``(params, opt_state, sampler_state,
            running_returns float32[num_envs], key)``: everything that determines the rest
            of the run.
        update: ``update(carry, None) -> (carry, metrics)``, one PPO update (a rollout, GAE,
            the epochs), the body of a ``lax.scan``. ``metrics``: float32 scalars
            ``return_sum`` and ``episodes`` (of the episodes completed in this update's
            rollout) and, with ``with_stats``, the losses averaged over the minibatches.
        policy: the network (``policy.forward(carry[0], obs)``).
        env: the environment.
    """

    init: Any
    update: Any
    policy: ActorCritic
    env: js.Env


def make_parts(
    cfg: PPOConfig, with_stats: bool = False, sampler: Callable[..., Any] | None = None
) -> TrainParts:
    """The ``init`` and ``update`` functions :func:`make_train` scans (see :class:`TrainParts`).

    ``sampler``: a factory ``(cfg, env, policy) -> (init(key), run(params, state) -> (state,
    batch))`` used instead of the one ``cfg.sampler`` names (the batch as
    :func:`jaxsampler_sampler`'s, leaves ``[T, E, A, ...]``)."""
    env = js.make(cfg.env_id)
    policy = make_policy(cfg, env)
    if sampler is None:
        sampler = jaxsampler_sampler if cfg.sampler == "jaxsampler" else handwritten_sampler
    init_sampler, sample = sampler(cfg, env, policy)
    batch_size = cfg.num_envs * cfg.rollout_length
    tx = make_optimizer(cfg)
    epochs = make_epochs(cfg, make_loss(cfg, policy, with_aux=with_stats), tx, with_stats)

    def episode_returns(batch, running):
        """Completed-episode returns of this rollout (sum, count), with a running total per env."""

        def step(run, x):
            r, done, m = x
            run = run + (r * m).sum(-1)
            d = done.any(-1)
            return jnp.where(d, 0.0, run), (jnp.where(d, run, 0.0), d)

        running, (rets, dones) = jax.lax.scan(
            step, running, (batch["rewards"], batch["done"], batch["mask"])
        )
        return running, rets.sum(), dones.sum()

    def init(key):
        k_init, k_sampler, k_loop = jax.random.split(key, 3)
        params = policy.init(k_init)
        opt_state = tx.init(params)
        sstate = init_sampler(k_sampler)
        return (params, opt_state, sstate, jnp.zeros((cfg.num_envs,), jnp.float32), k_loop)

    def update(carry, _):
        params, opt_state, sstate, running, key = carry
        sstate, batch = sample(params, sstate)
        running, ret_sum, ret_count = episode_returns(batch, running)
        flat = jax.tree.map(lambda x: x.reshape((batch_size * x.shape[2],) + x.shape[3:]), batch)

        key, k_epochs = jax.random.split(key)
        metrics = {"return_sum": ret_sum, "episodes": ret_count}
        if with_stats:
            params, opt_state, stats = epochs(params, opt_state, flat, k_epochs)
            metrics.update(stats)
        else:
            params, opt_state = epochs(params, opt_state, flat, k_epochs)
        return (params, opt_state, sstate, running, key), metrics

    return TrainParts(init, update, policy, env)


def make_train(
    cfg: PPOConfig, return_params: bool = False, sampler: Callable[..., Any] | None = None
):
    """Returns ``train(key) -> metrics`` (``(metrics, final params)`` with ``return_params``):
    a pure function, jit it (see :func:`run`); ``metrics`` leaves are ``[num_updates]``.
    ``sampler``: as for :func:`make_parts`."""
    parts = make_parts(cfg, sampler=sampler)

    def train(key):
        carry, metrics = jax.lax.scan(parts.update, parts.init(key), None, cfg.num_updates)
        return (metrics, carry[0]) if return_params else metrics

    return train


def _summary(
    cfg: PPOConfig,
    seeds: int,
    ret_sum: np.ndarray,
    eps: np.ndarray,
    compile_s: float,
    wall_s: float,
    steps_run: int,
) -> dict[str, Any]:
    """The result dict of a run from its per-update metrics ``[seeds, num_updates]``."""
    # Mean return of the episodes completed in the last 5% of updates (at least 1 update).
    tail = max(1, cfg.num_updates // 20)
    final = ret_sum[:, -tail:].sum(1) / np.maximum(eps[:, -tail:].sum(1), 1)
    # Updates in which no episode finished have no mean return: None, not 0.
    curve = np.where(eps > 0, ret_sum / np.maximum(eps, 1), np.nan)
    steps = cfg.num_updates * cfg.num_envs * cfg.rollout_length
    return {
        "config": dataclasses.asdict(cfg),
        "seeds": seeds,
        "env_steps_per_seed": steps,
        "compile_s": compile_s,
        "wall_s": wall_s,
        "env_steps_per_s": steps_run / wall_s if wall_s > 0 else float("nan"),
        "final_mean_return_per_seed": final.tolist(),
        "learning_curve_per_seed": [
            [None if np.isnan(v) else v for v in c] for c in curve.tolist()
        ],
    }


def train_seeds(
    make: Callable[[], Callable[[jax.Array], Any]],
    keys: jax.Array,
    on_seed: Callable[[int, float], None] | None = None,
) -> tuple[list[Any], float, float]:
    """Builds a pure ``train(key)`` (``make()``) and compiles it once for ``keys[0]``, then
    trains every key one after the other: ``(outputs, compile_s, wall_s)``. ``compile_s``
    is building and compiling; ``on_seed(i, seconds)`` is called after each seed."""
    t0 = time.perf_counter()
    compiled = jax.jit(make()).lower(keys[0]).compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    outs = []
    for i, k in enumerate(keys):
        t1 = time.perf_counter()
        outs.append(jax.block_until_ready(compiled(k)))
        if on_seed is not None:
            on_seed(i, time.perf_counter() - t1)
    return outs, compile_s, time.perf_counter() - t0


def write_json(path: Path, res: dict[str, Any]) -> None:
    """Writes a result dict as indented JSON (its folder made if need be)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1) + "\n")


def steps_to(curve: np.ndarray, threshold: float, steps_per_update: int) -> int | None:
    """Env steps until the 10-update moving average of ``curve`` (updates without a
    finished episode skipped) first reaches ``threshold``; ``None`` if it never does."""
    seen: list[float] = []
    for i, v in enumerate(curve):
        if np.isfinite(v):
            seen.append(float(v))
            if len(seen) >= 10 and np.mean(seen[-10:]) >= threshold:
                return (i + 1) * steps_per_update
    return None


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_curves(fig: Any, ax: Any, path: Path) -> None:
    """Finishes a learning-curve plot (x: env steps in thousands, y: returns, a grid, the
    legend at the lower right) and writes it to ``path``."""
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1000:,.0f}k"))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    pyplot().close(fig)


def run(
    cfg: PPOConfig,
    seeds: int = 3,
    seed: int = 0,
    return_params: bool = False,
    on_seed: Any = None,
) -> dict[str, Any]:
    """Trains ``seeds`` seeds one after the other with one compiled function.

    (Seeds are not vmapped: with XLA 0.10 on CPU, a vmapped training graph occasionally
    deadlocked in the runtime at some small shapes.)

    Args:
        cfg: the PPO settings.
        seeds: how many seeds to train (keys split from ``seed``).
        seed: the root seed.
        return_params: also return each seed's trained network parameters.
        on_seed: called after each seed as ``on_seed(i, wall_s)`` (e.g. a progress bar).

    Returns:
        the result dict (JSON-serializable; ``metrics_per_seed``: name -> ``[seeds,
        num_updates]`` lists); with ``return_params`` also ``"final_params"``: the trained
        network parameters of each seed (a list of pytrees, for ``policy.forward``) — not
        JSON-serializable.
    """
    keys = jax.random.split(jax.random.PRNGKey(seed), seeds)
    outs, compile_s, wall_s = train_seeds(lambda: make_train(cfg, return_params), keys, on_seed)
    per_seed = [o[0] for o in outs] if return_params else outs
    metrics = jax.tree.map(lambda *xs: np.stack(xs), *per_seed)
    ret_sum, eps = np.asarray(metrics["return_sum"]), np.asarray(metrics["episodes"])
    steps = cfg.num_updates * cfg.num_envs * cfg.rollout_length
    res = _summary(cfg, seeds, ret_sum, eps, compile_s, wall_s, steps * seeds)
    res["metrics_per_seed"] = {k: np.asarray(v).tolist() for k, v in metrics.items()}
    if return_params:
        res["final_params"] = [o[1] for o in outs]
    return res


# ----------------------------------------------------------------------------- chunks + resume


def chunk_update(cfg: PPOConfig, parts: TrainParts) -> Any:
    """``parts.update`` for the chunks: the env's params enter it as compile-time constants.

    In :func:`make_train`'s single jit, the rollout state's env params are Python scalars
    that never change over the ``lax.scan``; XLA sinks such loop-invariant values into the
    loop as constants and folds them into the env's arithmetic. A chunk, whose carry
    arrives as arguments, would compute with them as runtime values instead: the same
    numbers but other rounding (measured: CartPole's curves part after ~14 updates). Using
    the env's default params (what ``init`` put there) as constants inside the update gives
    the chunks the single jit's program; the carry keeps its env-params leaves as they are.
    The handwritten sampler closes over gymnax's params already.
    """
    if cfg.sampler != "jaxsampler":
        return parts.update
    const = parts.env.default_params

    def update(carry, x):
        params, opt_state, sstate, running, key = carry
        carried = sstate.env_params
        carry = (params, opt_state, sstate.replace(env_params=const), running, key)
        (params, opt_state, sstate, running, key), metrics = parts.update(carry, x)
        return (params, opt_state, sstate.replace(env_params=carried), running, key), metrics

    return update


def _strong(tree: Any) -> Any:
    """``tree`` with no weakly-typed leaves (the env's Python-scalar params come out of
    ``init`` weakly typed; a restored checkpoint never is): the uninterrupted and the resumed
    run then call the very same compiled chunk."""
    return jax.tree.map(lambda x: jnp.asarray(x, dtype=x.dtype), tree)


def fingerprint(cfg: PPOConfig, seeds: int, seed: int, every: int) -> dict[str, Any]:
    """What a training checkpoint must agree on to be resumed (JSON values): the config,
    the seeds and the chunk length."""
    fp = json.loads(json.dumps(dataclasses.asdict(cfg)))  # tuples as JSON lists
    return {**fp, "seeds": seeds, "seed": seed, "checkpoint_every": every}


def run_chunked(
    cfg: PPOConfig,
    seeds: int = 3,
    seed: int = 0,
    *,
    every: int,
    checkpoint_dir: str | Path | None = None,
    stop_after: int | None = None,
    on_chunk: Any = None,
    return_params: bool = False,
) -> dict[str, Any]:
    """Trains like :func:`run`, in jitted chunks of ``every`` updates (the same ``update``
    scanned ``every`` times), checkpointing the whole training state after each chunk.

    The state saved with ``js.checkpoint`` (in a ``js.rollout.checkpoint.Checkpoints`` directory,
    step = updates done, newest two kept) is every seed's carry — network params, optimizer
    state, the rollout state with its RNG keys, the running episode returns, the loop key —
    and the per-update metrics so far; the run's :func:`fingerprint` is in its meta. If
    ``checkpoint_dir`` holds a checkpoint, training resumes from the newest one and the
    per-update metrics equal those of an uninterrupted run bit for bit (same compiled
    chunk, same inputs).

    Args:
        cfg, seeds, seed: as :func:`run`.
        every: updates per chunk (>= 1); the last chunk may be shorter.
        checkpoint_dir: where to checkpoint (``None``: chunks without checkpoints).
        stop_after: stop after the chunk that contains update ``stop_after`` (1-based),
            as if interrupted; ``res["stopped"]`` says whether it did.
        on_chunk: called after each chunk as ``on_chunk(done, metrics, wall_s)``: updates
            done so far (all seeds), this chunk's metrics (name -> ``[seeds, n]`` numpy),
            its wall time.
        return_params: as :func:`run`.

    Returns:
        :func:`run`'s result dict plus ``checkpoint_every``, ``updates_done``,
        ``resumed_from`` (updates done before this call), ``stopped`` and
        ``metrics_per_seed`` (name -> ``[seeds, updates_done]`` lists).

    Raises:
        js.rollout.checkpoint.CheckpointError: the checkpoint belongs to another configuration (the
            message names every differing field) or cannot be read.
    """
    if every < 1:
        raise ValueError(f"checkpoint every must be >= 1 update, got {every}")
    parts = make_parts(cfg, with_stats=True)
    update = chunk_update(cfg, parts)
    keys = jax.random.split(jax.random.PRNGKey(seed), seeds)
    init = jax.jit(lambda k: _strong(parts.init(k)))
    abstract_carry = jax.eval_shape(init, keys[0])
    _, abstract_metrics = jax.eval_shape(lambda c: jax.lax.scan(update, c, None, 1), abstract_carry)
    metrics = {k: np.zeros((seeds, cfg.num_updates), v.dtype) for k, v in abstract_metrics.items()}
    fp = fingerprint(cfg, seeds, seed, every)
    ckpts = None if checkpoint_dir is None else js.rollout.checkpoint.Checkpoints(checkpoint_dir, 2)
    latest = None if ckpts is None else ckpts.latest_step()
    done = 0
    if latest is not None:
        path = ckpts.path(latest)
        saved = js.rollout.checkpoint.read_meta(path).get("ppo")
        diff = js.rollout.checkpoint.fingerprint_mismatch(saved or {}, fp)
        if diff:
            raise js.rollout.checkpoint.CheckpointError(
                f"checkpoint {path} was written by a run with another configuration ({diff}); "
                "resume it with the same options, or use another --checkpoint-dir"
            )
        tree = js.rollout.checkpoint.restore(
            path, like={"carries": [abstract_carry] * seeds, "metrics": metrics}
        )
        carries, metrics = list(tree["carries"]), tree["metrics"]
        done = int(latest)
    resumed_from = done

    compile_s, wall_s, compiled = 0.0, 0.0, {}
    if done == 0:
        t0 = time.perf_counter()
        carries = [jax.block_until_ready(init(k)) for k in keys]
        compile_s += time.perf_counter() - t0  # init is tiny: count it as setup

    def should_stop() -> bool:
        return stop_after is not None and stop_after <= done < cfg.num_updates

    stopped = should_stop()
    while done < cfg.num_updates and not stopped:
        n = min(every, cfg.num_updates - done)
        if n not in compiled:
            t0 = time.perf_counter()
            compiled[n] = (
                jax.jit(lambda c, n=n: jax.lax.scan(update, c, None, n))
                .lower(abstract_carry)
                .compile()
            )
            compile_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        outs = [compiled[n](c) for c in carries]
        outs = jax.block_until_ready(outs)
        chunk_s = time.perf_counter() - t0
        wall_s += chunk_s
        carries = [c for c, _ in outs]
        chunk = {k: np.stack([np.asarray(m[k]) for _, m in outs]) for k in metrics}
        for k in metrics:
            metrics[k][:, done : done + n] = chunk[k]
        done += n
        if ckpts is not None:
            tree = {"carries": carries, "metrics": metrics}
            meta = {"ppo": fp, "updates_done": done}
            ckpts.save(done, lambda p, t=tree, m=meta: js.rollout.checkpoint.save(p, t, meta=m))
        if on_chunk is not None:
            on_chunk(done, chunk, chunk_s)
        stopped = should_stop()

    steps_here = (done - resumed_from) * cfg.num_envs * cfg.rollout_length * seeds
    res = _summary(
        cfg,
        seeds,
        metrics["return_sum"][:, :done],
        metrics["episodes"][:, :done],
        compile_s,
        wall_s,
        steps_here,
    )
    res.update(
        checkpoint_every=every,
        updates_done=done,
        resumed_from=resumed_from,
        stopped=stopped,
        metrics_per_seed={k: v[:, :done].tolist() for k, v in metrics.items()},
    )
    if return_params:
        res["final_params"] = [c[0] for c in carries]
    return res


# ----------------------------------------------------------------------------- logging

#: logged name of each per-update metric (means over the seeds)
LOSS_NAMES = {
    "loss": "loss/total",
    "pg_loss": "loss/policy",
    "vf_loss": "loss/value",
    "entropy": "loss/entropy",
    "approx_kl": "loss/approx_kl",
}


def update_scalars(metrics: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-update scalars to log from per-update metrics (name -> ``[seeds, n]``): the mean
    return of the episodes finished in the update (``train/episode_return``: mean over the
    seeds that finished one, NaN if none did; per seed as ``train/episode_return/seed<i>``),
    their count over all seeds, and the losses averaged over the seeds."""
    ret_sum = np.asarray(metrics["return_sum"], np.float64)
    eps = np.asarray(metrics["episodes"], np.float64)
    per_seed = np.where(eps > 0, ret_sum / np.maximum(eps, 1), np.nan)
    finished = np.isfinite(per_seed)
    mean = np.where(
        finished.any(0),
        np.where(finished, per_seed, 0).sum(0) / np.maximum(finished.sum(0), 1),
        np.nan,
    )
    out = {"train/episode_return": mean, "train/episodes": eps.sum(0)}
    if per_seed.shape[0] > 1:
        out.update({f"train/episode_return/seed{i}": c for i, c in enumerate(per_seed)})
    for k, name in LOSS_NAMES.items():
        if k in metrics:
            out[name] = np.asarray(metrics[k], np.float64).mean(0)
    return out


def _last_finite(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(x[-1]) if x.size else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="CartPole-v1", choices=sorted(DEFAULTS))
    p.add_argument("--sampler", default="jaxsampler", choices=["jaxsampler", "handwritten"])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--total-timesteps", type=int, default=None)
    p.add_argument("--num-envs", type=int, default=None)
    p.add_argument("--rollout-length", type=int, default=None)
    p.add_argument("--json", type=Path, default=None, help="write the result as JSON here")
    p.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        help="checkpoint the training state here after every chunk; rerunning the same "
        "command resumes from the newest checkpoint",
    )
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        help="updates per jitted chunk (default with --checkpoint-dir: ~1/10 of the run); "
        "without --checkpoint-dir: train in chunks without checkpoints",
    )
    p.add_argument(
        "--stop-after",
        type=int,
        default=None,
        metavar="K",
        help="exit after the chunk that contains update K (simulates an interruption)",
    )
    p.add_argument(
        "--video",
        type=Path,
        default=None,
        metavar="PATH",
        help="after training, record one greedy episode of the first seed's policy here "
        "(.mp4 or .gif; needs the video extra)",
    )
    js.integrations.loggers.add_arguments(p)  # --log-dir, --logger, --quiet
    args = p.parse_args(argv)
    if args.video is not None and args.video.suffix not in (".mp4", ".gif"):
        p.error(f"--video must end in .mp4 or .gif, got {str(args.video)!r}")
    if args.video is not None and not args.video.resolve().parent.is_dir():
        p.error(f"--video: the folder of {str(args.video)!r} does not exist")
    cfg = dataclasses.replace(DEFAULTS[args.env], sampler=args.sampler)
    for field, value in (
        ("total_timesteps", args.total_timesteps),
        ("num_envs", args.num_envs),
        ("rollout_length", args.rollout_length),
    ):
        if value is not None:
            cfg = dataclasses.replace(cfg, **{field: value})
    every = args.checkpoint_every
    if every is None and (args.checkpoint_dir is not None or args.stop_after is not None):
        every = max(1, cfg.num_updates // 10)
    if every is not None and every < 1:
        p.error(f"--checkpoint-every must be >= 1, got {every}")
    try:
        logger = js.integrations.loggers.from_arguments(args)
    except (ValueError, ImportError) as e:
        p.error(str(e))
    steps_per_update = cfg.num_envs * cfg.rollout_length
    steps_per_seed = cfg.num_updates * steps_per_update
    done_before = 0
    if every is not None and args.checkpoint_dir is not None and args.checkpoint_dir.is_dir():
        done_before = js.rollout.checkpoint.Checkpoints(args.checkpoint_dir, 2).latest_step() or 0
    video = args.video is not None
    desc = f"ppo {cfg.env_id}"
    with (
        logger,
        js.integrations.progress.progress(
            steps_per_seed * args.seeds,
            desc=desc,
            unit="step",
            quiet=args.quiet,
            initial=min(done_before, cfg.num_updates) * steps_per_update * args.seeds,
        ) as bar,
    ):
        if every is None:  # one jit for the whole run, as in PureJaxRL

            def on_seed(i: int, wall_s: float) -> None:
                bar.update(steps_per_seed, seed=i, env_steps_per_s=steps_per_seed / wall_s)

            res = run(cfg, args.seeds, args.seed, on_seed=on_seed, return_params=video)
            js.integrations.loggers.log_history(
                logger,
                update_scalars({k: np.asarray(v) for k, v in res["metrics_per_seed"].items()}),
                steps_per_update=steps_per_update,
                final={"perf/env_steps_per_s": res["env_steps_per_s"]},
            )
        else:

            def on_chunk(done: int, chunk: dict[str, np.ndarray], chunk_s: float) -> None:
                n = next(iter(chunk.values())).shape[1]
                sps = n * steps_per_update * args.seeds / chunk_s
                scalars = update_scalars(chunk)
                js.integrations.loggers.log_history(
                    logger,
                    scalars,
                    steps_per_update=steps_per_update,
                    start_step=(done - n) * steps_per_update,
                    final={"perf/env_steps_per_s": sps},
                )
                bar.update(
                    n * steps_per_update * args.seeds,
                    ret=_last_finite(scalars["train/episode_return"]),
                )

            try:
                res = run_chunked(
                    cfg,
                    args.seeds,
                    args.seed,
                    every=every,
                    checkpoint_dir=args.checkpoint_dir,
                    stop_after=args.stop_after,
                    on_chunk=on_chunk,
                    return_params=video,
                )
            except js.rollout.checkpoint.CheckpointError as e:
                bar.close()
                print(f"error: {e}", file=sys.stderr)
                return 2
    if every is not None:
        if res["stopped"]:
            print(
                f"stopped after update {res['updates_done']} of {cfg.num_updates}"
                + (
                    f"; checkpoint in {args.checkpoint_dir}: rerun without --stop-after to resume"
                    if args.checkpoint_dir is not None
                    else ""
                )
            )
            return 0
        if res["resumed_from"]:
            print(f"resumed from update {res['resumed_from']} of {cfg.num_updates}")
    print(
        f"{cfg.env_id} [{cfg.sampler}] {args.seeds} seeds x {res['env_steps_per_seed']:,} steps: "
        f"compile {res['compile_s']:.1f} s, train {res['wall_s']:.1f} s "
        f"({res['env_steps_per_s']:,.0f} env steps/s); final mean return per seed: "
        + ", ".join(f"{r:.1f}" for r in res["final_mean_return_per_seed"])
    )
    if args.video is not None:
        frames = record_trained(cfg, res["final_params"][0], args.video)
        print(f"video: {args.video} ({len(frames)} frames, one greedy episode of seed 0)")
        del res["final_params"]  # network weights: not for the JSON result
    elif "final_params" in res:
        del res["final_params"]
    if args.json:
        write_json(args.json, res)
    return 0


def record_trained(cfg: PPOConfig, params: Any, path: Path) -> np.ndarray:
    """One greedy episode of the trained policy ``params`` of ``cfg``, written to ``path``
    (``js.integrations.record_video``); returns its frames."""
    env = js.make(cfg.env_id)
    return js.integrations.record_video(env, make_policy(cfg, env), params, path, explore=False)


if __name__ == "__main__":
    sys.exit(main())
