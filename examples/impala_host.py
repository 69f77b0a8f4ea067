"""IMPALA-style training on host envs, with collection overlapping the learner.

Gymnasium's CartPole-v1 (host-stepped, through ``js.Sampler("gym:CartPole-v1", ...)``) is
sampled by a :class:`~jaxsampler.sampling.AsyncActor` in a background thread while the
learner updates on the previous batch; every batch carries the version of the params that
sampled it, and the learner corrects for the lag with V-trace (IMPALA, Espeholt et al.
2018) computed over the batch's rows: importance ratios from the batch's ``action_logp``
(the behaviour policy) and the learner's current policy, value targets ``vs`` and
policy-gradient advantages, with the boundary rules of ``js.compute_gae`` (no bootstrap
after termination, the real final observation's value after truncation and at a cut).
The update is a few epochs of minibatch steps on those targets with a clipped surrogate
(ratios against the policy at the update's start), the APPO flavour of IMPALA.

    python -m examples.impala_host                      # overlapped (AsyncActor)
    python -m examples.impala_host --mode sync          # sample, then learn
    python -m examples.impala_host --compare --seeds 3  # both, side by side: the results

``--compare`` trains with both loops (same seeds, steps and settings) and writes the final
greedy evaluation returns, wall times and training curves to
``benchmarks/results/impala_host.{json,md}`` (plotted by ``python -m benchmarks.plot_offpolicy``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxsampler as js
from benchmarks import harness
from examples import ppo, ppo_host
from jaxsampler.policies.mlp import log_prob
from jaxsampler.sampling import AsyncActor

#: The settings: PureJaxRL's CartPole PPO numbers (``ppo.DEFAULTS``) on 8 host envs.
CONFIG = dataclasses.replace(
    ppo.DEFAULTS["CartPole-v1"], num_envs=8, rollout_length=64, total_timesteps=500_000
)
#: A point of a run's ``train_return_curve`` every this many updates.
CURVE_EVERY = 20


def batch_vtrace(rewards, values, next_values, terminateds, ends, log_rhos, gamma, lam):
    """V-trace over a flat batch whose rows run episode chunk by chunk, in time order.

    ``values`` / ``next_values``: the learner's values of ``obs`` and ``new_obs``;
    ``log_rhos``: target minus behaviour log-probability of each row's action; ``ends[i]``
    marks the last row of a chunk (episode end or cut), where the trace stops and
    ``next_values`` bootstraps, unless ``terminateds[i]``. With ``rho = exp(log_rhos)``,
    ``c = lam * min(1, rho)`` and ``d = gamma * (1 - terminated)``:
    ``vs - V = min(1, rho) * (r + d V' - V) + d c (vs' - V')`` and
    ``pg_advantage = min(1, rho) * (r + d (lam vs' + (1 - lam) V') - V)``, where
    ``vs' = V'`` at a chunk's end. Returns ``(vs, pg_advantages)``. Jittable.
    """
    rho = jnp.exp(log_rhos)
    rho_c = jnp.minimum(1.0, rho)
    c = lam * jnp.minimum(1.0, rho)
    d = gamma * (1.0 - terminateds.astype(jnp.float32))
    end = ends.astype(jnp.float32)
    delta = rho_c * (rewards + d * next_values - values)

    def step(carry, x):
        acc_next, vs_next_row = carry
        delta_t, d_t, c_t, end_t, v_t, nv_t, r_t, rho_t = x
        acc = delta_t + d_t * c_t * (1.0 - end_t) * acc_next
        vs = v_t + acc
        vs_next = end_t * nv_t + (1.0 - end_t) * vs_next_row
        q = r_t + d_t * (lam * vs_next + (1.0 - lam) * nv_t)
        return (acc, vs), (vs, jnp.minimum(1.0, rho_t) * (q - v_t))

    xs = (delta, d, c, end, values, next_values, rewards, rho)
    init = (jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))
    _, (vs, pg) = jax.lax.scan(step, init, xs, reverse=True)
    return vs, pg


def make_update(cfg: ppo.PPOConfig, policy: js.MLPPolicy, tx: Any) -> Any:
    """``update(params, opt_state, batch, key)``: V-trace targets of a
    :func:`~examples.ppo_host.padded_batch` under ``params``, then ``ppo.py``'s minibatch
    epochs on them. Jitted."""
    epochs = ppo.make_epochs(cfg, ppo.make_loss(cfg, policy), tx)

    @jax.jit
    def update(params, opt_state, batch, key):
        dist, values, log_std = policy.forward(params, batch["obs"])
        _, next_values, _ = policy.forward(params, batch["new_obs"])
        logp = log_prob(policy.action_space, dist, log_std, batch["actions"])
        vs, pg = batch_vtrace(
            batch["rewards"],
            values,
            next_values,
            batch["terminateds"],
            batch["ends"],
            logp - batch["action_logp"],
            cfg.gamma,
            cfg.gae_lambda,
        )
        data = {
            "obs": batch["obs"],
            "actions": batch["actions"],
            "logp": logp,
            "values": values,
            "advantages": pg,
            "targets": vs,
            "mask": batch["mask"],
        }
        return epochs(params, opt_state, jax.lax.stop_gradient(data), key)

    return update


def train(cfg: ppo.PPOConfig, seed: int, mode: str, quiet: bool = False) -> dict[str, Any]:
    """Trains with the ``"async"`` (AsyncActor) or ``"sync"`` loop; returns the run's
    figures (greedy evaluation over 20 episodes of the pure-JAX CartPole-v1, whose dynamics
    are Gymnasium's)."""
    env = js.make("CartPole-v1")
    policy = js.MLPPolicy(env.observation_space, env.action_space, cfg.hidden_sizes, cfg.activation)
    sampler = js.Sampler(
        "gym:CartPole-v1",
        policy,
        num_envs=cfg.num_envs,
        rollout_length=cfg.rollout_length,
        seed=seed,
    )
    tx = ppo.make_optimizer(cfg)
    update = make_update(cfg, policy, tx)
    params = policy.init(jax.random.PRNGKey(seed))
    opt_state, key = tx.init(params), jax.random.PRNGKey(seed + 1)
    size = cfg.num_envs * cfg.rollout_length

    def sample(p: Any) -> tuple[Any, float, int]:  # runs in the actor's thread in "async"
        rows = sampler.sample_batch(p)["default_policy"]
        return rows, sampler.metrics.episode_return_mean, sampler.metrics.num_episodes_completed

    returns, lags, steps, updates = [], [], 0, 0
    curve: list[list[float]] = []  # [env steps, mean return of the last 20 episodes]
    actor = AsyncActor(sample, params, max_queue=1) if mode == "async" else None
    t0 = time.perf_counter()
    try:
        while steps < cfg.total_timesteps:
            if actor is None:
                (rows, ret, done), lag = sample(params), 0
            else:
                got = actor.get(timeout=600)
                (rows, ret, done), lag = got.data, actor.version - got.version
            key, k = jax.random.split(key)
            params, opt_state = update(params, opt_state, ppo_host.padded_batch(rows, size), k)
            if actor is not None:
                actor.update(params)
            steps, updates = steps + rows.count, updates + 1
            lags.append(lag)
            if done:
                returns.append(ret)
            if updates % CURVE_EVERY == 0 and returns:
                curve.append([steps, float(np.mean(returns[-20:]))])
            if not quiet and updates % 100 == 0:
                recent = np.mean(returns[-20:]) if returns else float("nan")
                print(f"  [{mode} seed {seed}] {steps:>8,} steps, mean return {recent:.1f}")
    finally:
        if actor is not None:
            actor.close()
        sampler.close()
    wall = time.perf_counter() - t0
    ev = js.evaluate(env, policy, params, 20, jax.random.PRNGKey(seed + 2))
    return {
        "mode": mode,
        "seed": seed,
        "env_steps": steps,
        "updates": updates,
        "wall_s": wall,
        "env_steps_per_s": steps / wall,
        "eval_return_mean": float(np.mean(ev.returns)),
        "train_return_last": float(np.mean(returns[-20:])) if returns else float("nan"),
        "mean_policy_lag": float(np.mean(lags)),
        "train_return_curve": curve,
    }


def markdown(res: dict[str, Any]) -> str:
    md = (
        f"# {res['benchmark']}\n\n{res['date']} · `{res['command']}` · commit "
        f"{res['git']['commit'][:10]} · {res['cpus']} CPUs · load {res['load'][0]:.1f}\n\n"
        "IMPALA-style V-trace (APPO flavour: clipped surrogate over 4 epochs) on Gymnasium's"
        f" CartPole-v1 through the host sampler, {res['config']['num_envs']} envs x"
        f" {res['config']['rollout_length']} steps per batch, {res['config']['total_timesteps']:,}"
        " env steps per run. *async*: sampling in an `AsyncActor` thread while the learner"
        " updates; *sync*: sample, then learn. Evaluation: mean greedy return over 20 episodes"
        " of the pure-JAX CartPole-v1 (Gymnasium's dynamics); lag: the learner's params"
        " version minus the batch's, averaged.\n\n"
        "| mode | seed | eval return | wall s | env steps/s | mean lag |\n"
        "|---|---:|---:|---:|---:|---:|\n"
    )
    for r in res["runs"]:
        md += (
            f"| {r['mode']} | {r['seed']} | {r['eval_return_mean']:.1f} | {r['wall_s']:.1f} | "
            f"{r['env_steps_per_s']:,.0f} | {r['mean_policy_lag']:.2f} |\n"
        )
    s = res["summary"]
    md += (
        f"\nWall time, async / sync (median over seeds of the paired ratio): "
        f"**{s['wall_ratio']:.2f}** ({s['speedup']:.2f}x faster); runs reaching 475: async "
        f"{s['async_solved']}/{s['seeds']}, sync {s['sync_solved']}/{s['seeds']}. Learning "
        "curves: `impala_host.png` (`python -m benchmarks.plot_offpolicy`).\n"
    )
    return md


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["async", "sync"], default="async")
    p.add_argument("--compare", action="store_true", help="both loops; writes the results")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--total-timesteps", type=int, default=CONFIG.total_timesteps)
    p.add_argument("--quick", action="store_true", help="a tiny run (CI): prints only")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    cfg = dataclasses.replace(CONFIG, total_timesteps=args.total_timesteps)
    if args.quick:
        cfg = dataclasses.replace(cfg, total_timesteps=2 * cfg.num_envs * cfg.rollout_length)
    seeds = range(args.seed, args.seed + args.seeds)
    modes = ["async", "sync"] if args.compare else [args.mode]
    runs = []
    for seed in seeds:
        for mode in harness.alternated(modes, seed):
            run = train(cfg, seed, mode, args.quiet)
            print(
                f"{mode} seed {seed}: eval return {run['eval_return_mean']:.1f}, "
                f"{run['env_steps']:,} steps in {run['wall_s']:.1f} s, mean lag "
                f"{run['mean_policy_lag']:.2f}"
            )
            runs.append(run)
    if args.compare:
        by = {(r["mode"], r["seed"]): r for r in runs}
        ratios = [by["async", s]["wall_s"] / by["sync", s]["wall_s"] for s in seeds]
        wall_ratio = float(np.median(ratios))
        res: dict[str, Any] = harness.stamp("IMPALA on host envs, overlapped", "impala_host")
        res |= {
            "command": " ".join(["python -m examples.impala_host", *(argv or sys.argv[1:])]),
            "git": harness.git_state(),
            "cpus": os.cpu_count(),
            "load": os.getloadavg(),
            "config": dataclasses.asdict(cfg),
            "runs": runs,
            "summary": {
                "seeds": len(seeds),
                "wall_ratio": wall_ratio,
                "speedup": 1.0 / wall_ratio,
                "async_solved": sum(by["async", s]["eval_return_mean"] >= 475 for s in seeds),
                "sync_solved": sum(by["sync", s]["eval_return_mean"] >= 475 for s in seeds),
            },
        }
        out = None if args.quick else harness.RESULTS_DIR
        harness.finish(res, markdown(res), "impala_host", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
