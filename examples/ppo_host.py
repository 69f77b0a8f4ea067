"""PPO with the learner on the host side, fed by ``Sampler.sample_batch()``.

For users whose learner is not inside the jit: each iteration asks the sampler for a
``MultiAgentBatch`` (numpy, RLlib column names), computes GAE on it and runs jitted
minibatch updates. The batch's ``new_obs`` column (derived from jaxsampler's single
observation track) gives the bootstrap value at truncations and at the chunk's cut;
``terminateds`` stops it.

    python -m examples.ppo_host [--total-timesteps 500000] [--seed 0]

The pieces of that loop (:func:`add_arguments`, :func:`make_sampler`, :func:`make_learner`,
:func:`learn`) also drive ``ppo_multiagent.py`` (one learner per policy) and
``selfplay_pgx.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxsampler as js
from examples import ppo


def batch_gae(rewards, values, next_values, terminateds, ends, gamma, lam):
    """GAE over a flat batch whose rows run episode by episode.

    ``ends[i]`` marks the last row of an episode chunk (episode end or cut), where the
    recursion stops; ``next_values`` (the value of ``new_obs``) bootstraps there unless
    ``terminateds[i]``. Jittable.
    """

    def step(next_adv, x):
        r, v, nv, term, end = x
        delta = r + gamma * (1.0 - term) * nv - v
        adv = delta + gamma * lam * (1.0 - end) * next_adv
        return adv, adv

    xs = (rewards, values, next_values, terminateds.astype(jnp.float32), ends.astype(jnp.float32))
    _, adv = jax.lax.scan(step, jnp.zeros((), jnp.float32), xs, reverse=True)
    return adv


def make_data(cfg, policy):
    """``data(params, batch)``: the learner's columns of a :func:`padded_batch`, with GAE
    advantages and value targets (bootstrapping from the value of ``new_obs``). Jittable."""

    def data(params, batch):
        _, nv, _ = policy.forward(params, batch["new_obs"])
        adv = batch_gae(
            batch["rewards"],
            batch["vf_preds"],
            nv,
            batch["terminateds"],
            batch["ends"],
            cfg.gamma,
            cfg.gae_lambda,
        )
        return {
            "obs": batch["obs"],
            "actions": batch["actions"],
            "logp": batch["action_logp"],
            "values": batch["vf_preds"],
            "advantages": adv,
            "targets": adv + batch["vf_preds"],
            "mask": batch["mask"],
        }

    return data


def make_update(cfg, policy, epochs):
    """``update(params, opt_state, batch, key)``: GAE over a :func:`padded_batch` (bootstrapping
    from the value of ``new_obs``) and the minibatch epochs. Jitted."""
    data = make_data(cfg, policy)

    @jax.jit
    def update(params, opt_state, batch, key):
        return epochs(params, opt_state, data(params, batch), key)

    return update


def make_batch_loss(cfg, policy):
    """``batch_loss(params, batch) -> float32[]``: the PPO loss of ``params`` on a whole
    :func:`padded_batch` (what the logs show before and after each update; the update
    itself does not use it). Jitted."""
    data, loss_fn = make_data(cfg, policy), ppo.make_loss(cfg, policy)
    return jax.jit(lambda params, batch: loss_fn(params, data(params, batch)))


def padded_batch(sb, size: int) -> dict[str, np.ndarray]:
    """The columns ``update`` needs from a ``SampleBatch`` whose rows run episode by episode,
    plus ``ends`` (last row of each ``eps_id`` run) and ``mask``, zero-padded to ``size``
    rows (padded rows: ``mask`` False, ``ends`` True) so ``update`` compiles once."""
    n = sb.count
    ids = sb["eps_id"]
    ends = np.ones(n, bool)
    ends[:-1] = ids[1:] != ids[:-1]
    batch = {
        k: sb[k]
        for k in ("obs", "new_obs", "actions", "rewards", "terminateds", "action_logp", "vf_preds")
    }
    batch["ends"], batch["mask"] = ends, np.ones(n, bool)
    batch = {
        k: np.concatenate([v, np.zeros((size - n,) + v.shape[1:], v.dtype)])
        for k, v in batch.items()
    }
    batch["ends"][n:] = True
    return batch


def add_arguments(
    p: argparse.ArgumentParser, total_timesteps: int, num_envs: int, total_help: str | None = None
) -> None:
    """The options of a host learner: sizes, seed, ``--json`` and the logger's."""
    p.add_argument("--total-timesteps", type=int, default=total_timesteps, help=total_help)
    p.add_argument("--num-envs", type=int, default=num_envs)
    p.add_argument("--rollout-length", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    js.integrations.loggers.add_arguments(p)  # --log-dir, --logger, --quiet


def make_sampler(
    env: js.Env,
    policy: Any,
    cfg: ppo.PPOConfig,
    seed: int,
    logger: js.integrations.loggers.Logger,
    bar: js.integrations.progress.Bar,
) -> js.Sampler:
    """The learner's sampler: it logs each call's report (returns, env steps/s, compile
    events) and advances the bar by its env steps."""
    return js.Sampler(
        env,
        policy,
        num_envs=cfg.num_envs,
        rollout_length=cfg.rollout_length,
        seed=seed,
        callbacks=[logger, js.integrations.progress.ProgressCallback(bar)],
    )


def make_learner(
    cfg: ppo.PPOConfig, policy: js.MLPPolicy, logging: bool = False
) -> tuple[Any, Callable, Callable | None]:
    """``(tx, update, batch_loss)`` of a PPO learner of ``policy``: ``ppo.py``'s optimizer,
    :func:`make_update` over its minibatch epochs, and :func:`make_batch_loss` if
    ``logging`` (else None)."""
    tx = ppo.make_optimizer(cfg)
    update = make_update(cfg, policy, ppo.make_epochs(cfg, ppo.make_loss(cfg, policy), tx))
    return tx, update, make_batch_loss(cfg, policy) if logging else None


def learn(
    update: Callable,
    batch_loss: Callable | None,
    params: Any,
    opt_state: Any,
    sb: Any,
    size: int,
    key: jax.Array,
) -> tuple[Any, Any, dict[str, Any]]:
    """One update on a ``SampleBatch`` (padded to ``size`` rows): the new ``(params,
    opt_state)`` and, with a ``batch_loss``, the loss before and after it
    (``{"loss_before", "loss_after"}``; else ``{}``)."""
    batch = padded_batch(sb, size)
    losses = {} if batch_loss is None else {"loss_before": batch_loss(params, batch)}
    params, opt_state = update(params, opt_state, batch, key)
    if batch_loss is not None:
        losses["loss_after"] = batch_loss(params, batch)
    return params, opt_state, losses


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(p, total_timesteps=500_000, num_envs=4)
    args = p.parse_args(argv)
    cfg = dataclasses.replace(
        ppo.DEFAULTS["CartPole-v1"],
        total_timesteps=args.total_timesteps,
        num_envs=args.num_envs,
        rollout_length=args.rollout_length,
    )
    env = js.make(cfg.env_id)
    policy = js.MLPPolicy(env.observation_space, env.action_space, cfg.hidden_sizes, cfg.activation)
    logger = js.integrations.loggers.from_arguments(args)
    bar = js.integrations.progress.Bar(cfg.total_timesteps, desc="ppo_host", quiet=args.quiet)
    sampler = make_sampler(env, policy, cfg, args.seed, logger, bar)
    params = policy.init(jax.random.PRNGKey(args.seed))
    logging = not isinstance(logger, js.integrations.loggers.NullLogger)
    tx, update, batch_loss = make_learner(cfg, policy, logging)
    opt_state = tx.init(params)

    # Batches vary in length (reset steps are not rows): pad to the fixed device batch size
    # so `update` compiles once; padded rows get mask False.
    size = cfg.num_envs * cfg.rollout_length
    key = jax.random.PRNGKey(args.seed + 1)
    returns, steps, t0 = [], 0, time.perf_counter()
    with logger, bar:
        while steps < cfg.total_timesteps:
            mab = sampler.sample_batch(params)
            sb = mab["default_policy"]
            key, k = jax.random.split(key)
            params, opt_state, losses = learn(update, batch_loss, params, opt_state, sb, size, k)
            steps += sb.count
            if sampler.metrics.num_episodes_completed:
                returns.append(sampler.metrics.episode_return_mean)
            if logging:
                scalars = {f"train/{name}": v for name, v in losses.items()}
                logger.log({**scalars, "train/rows": sb.count}, step=sampler.totals.env_steps)
    wall = time.perf_counter() - t0
    final = float(np.mean(returns[-max(1, len(returns) // 20) :])) if returns else float("nan")
    print(
        f"{cfg.env_id} [host learner, sample_batch()] {steps:,} steps in {wall:.1f} s "
        f"({steps / wall:,.0f} env steps/s); final mean return {final:.1f}"
    )
    if args.json:
        ppo.write_json(
            args.json,
            {
                "env_steps": steps,
                "wall_s": wall,
                "env_steps_per_s": steps / wall,
                "final_mean_return": final,
                "returns": returns,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
