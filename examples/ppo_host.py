"""PPO with the learner on the host side, fed by ``Sampler.sample_batch()``.

For users whose learner is not inside the jit: each iteration asks the sampler for a
``MultiAgentBatch`` (numpy, RLlib column names), computes GAE on it and runs jitted
minibatch updates. The batch's ``new_obs`` column (derived from jaxsampler's single
observation track) gives the bootstrap value at truncations and at the chunk's cut;
``terminateds`` stops it.

    python examples/ppo_host.py [--total-timesteps 500000] [--seed 0]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jaxsampler as js


def _load_ppo():
    path = Path(__file__).with_name("ppo.py")
    spec = importlib.util.spec_from_file_location("jaxsampler_example_ppo", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


ppo = _load_ppo()


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--total-timesteps", type=int, default=500_000)
    p.add_argument("--num-envs", type=int, default=4)
    p.add_argument("--rollout-length", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    js.integrations.loggers.add_arguments(p)  # --log-dir, --logger, --quiet
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
    # the sampler logs each call's report (returns, env steps/s, compile events) and
    # advances the bar by its env steps
    sampler = js.Sampler(
        env,
        policy,
        num_envs=cfg.num_envs,
        rollout_length=cfg.rollout_length,
        seed=args.seed,
        callbacks=[logger, js.integrations.progress.ProgressCallback(bar)],
    )
    params = policy.init(jax.random.PRNGKey(args.seed))
    tx = ppo.make_optimizer(cfg)
    opt_state = tx.init(params)
    epochs = ppo.make_epochs(cfg, ppo.make_loss(cfg, policy), tx)

    update = make_update(cfg, policy, epochs)
    batch_loss = (
        None
        if isinstance(logger, js.integrations.loggers.NullLogger)
        else make_batch_loss(cfg, policy)
    )

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
            batch = padded_batch(sb, size)
            before = None if batch_loss is None else batch_loss(params, batch)
            params, opt_state = update(params, opt_state, batch, k)
            steps += sb.count
            if sampler.metrics.num_episodes_completed:
                returns.append(sampler.metrics.episode_return_mean)
            if batch_loss is not None:
                logger.log(
                    {
                        "train/loss_before": before,
                        "train/loss_after": batch_loss(params, batch),
                        "train/rows": sb.count,
                    },
                    step=sampler.totals.env_steps,
                )
    wall = time.perf_counter() - t0
    final = float(np.mean(returns[-max(1, len(returns) // 20) :])) if returns else float("nan")
    print(
        f"{cfg.env_id} [host learner, sample_batch()] {steps:,} steps in {wall:.1f} s "
        f"({steps / wall:,.0f} env steps/s); final mean return {final:.1f}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "env_steps": steps,
                    "wall_s": wall,
                    "env_steps_per_s": steps / wall,
                    "final_mean_return": final,
                    "returns": returns,
                },
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
