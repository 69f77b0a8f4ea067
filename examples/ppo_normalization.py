"""PPO with and without observation + reward normalization inside the compiled rollout.

The same PPO as ``examples/ppo.py`` (its loss, optimizer and minibatch epochs, imported
from there), the same seeds and hyperparameters, trained twice on each seed:

* ``normalized``: ``transforms=(NormalizeObservation(), NormalizeReward(gamma))`` in
  ``make_rollout``; the policy is built for the spaces the transforms hand on, the
  learner trains on what the policy saw (``traj.obs``, ``traj.rewards``: scaled rewards,
  so GAE targets and value bootstraps are in the scaled units), and the learning curve
  reports the env's own returns (``traj.raw_rewards``);
* ``raw``: no transforms.

The default is Pendulum-v1 with the common PPO discount ``gamma = 0.99``: raw returns
are in the hundreds, so the value function (clipped updates of 0.2 per step, as in most
PPO code) cannot follow them, while scaled returns are of order 1.

``--env brax:inverted_pendulum`` runs the same comparison on Brax's inverted pendulum
(MJX backend on the CPU, episodes of at most 1000 steps, reward 1 per step the pole stays
up, so 1000 is the best return), written as ``ppo_brax.*``.

    python -m examples.ppo_normalization                 # full run, writes benchmarks/results/
    python -m examples.ppo_normalization --env brax:inverted_pendulum   # -> ppo_brax.*
    python -m examples.ppo_normalization --quick         # smoke test (tiny), prints only
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxsampler as js
from examples import ppo
from jaxsampler.transforms import NormalizeObservation
from jaxsampler.transforms.reward import NormalizeReward

RESULTS = ppo.RESULTS

#: Pendulum-v1 with examples/ppo.py's Pendulum settings except the discount: 0.99 (the
#: common PPO default) instead of the 0.9 tuned there for raw rewards.
CONFIG = dataclasses.replace(ppo.DEFAULTS["Pendulum-v1"], gamma=0.99, total_timesteps=300_000)


#: Per env: (config, raw returns whose first crossing -- 10-update moving average -- is
#: reported in env steps, the stem of the result files).
ENVS: dict[str, tuple[Any, tuple[float, ...], str]] = {
    "Pendulum-v1": (CONFIG, (-500.0, -250.0), "ppo_normalization"),
    # Brax (the mjx backend, on CPU): the same PPO settings; returns count the steps the
    # pole stays up (at most the 1000-step episode limit).
    "brax:inverted_pendulum": (
        dataclasses.replace(CONFIG, env_id="brax:inverted_pendulum"),
        (500.0, 950.0),
        "ppo_brax",
    ),
}
THRESHOLDS = ENVS["Pendulum-v1"][1]


def thresholds_of(env_id: str) -> tuple[float, ...]:
    """The reported return thresholds of ``env_id`` (Pendulum's for an env not listed)."""
    return ENVS[env_id][1] if env_id in ENVS else THRESHOLDS


def stem_of(env_id: str) -> str:
    """The stem of ``env_id``'s result files."""
    return ENVS[env_id][2] if env_id in ENVS else "ppo_normalization"


def make_train(cfg: Any, normalize: bool):
    """``train(key) -> metrics`` (pure; jit it): PPO over jaxsampler's rollout, with or
    without ``(NormalizeObservation(), NormalizeReward(cfg.gamma))``."""
    env = js.make(cfg.env_id)
    transforms = (NormalizeObservation(), NormalizeReward(gamma=cfg.gamma)) if normalize else ()
    pipe = js.rollout.pipeline_of(env, transforms)
    policy = js.MLPPolicy(
        pipe.observation_space, pipe.action_space, cfg.hidden_sizes, cfg.activation
    )
    rollout = js.make_rollout(env, policy, cfg.num_envs, cfg.rollout_length, transforms=pipe)
    tx = ppo.make_optimizer(cfg)
    epochs = ppo.make_epochs(cfg, ppo.make_loss(cfg, policy), tx)
    batch_size = cfg.num_envs * cfg.rollout_length

    def sample(params, state):
        state, traj = rollout(params, state)
        # On what the policy saw: transformed observations and rewards (traj.rewards).
        batch = ppo.ppo_batch(cfg, policy, params, traj, state)
        raw = traj.rewards if traj.raw_rewards is None else traj.raw_rewards
        return state, batch, (raw, traj.terminated | traj.truncated, traj.acting)

    def episode_returns(running, raw, done, mask):
        """Raw returns of the episodes completed in this rollout (sum, count)."""

        def step(run, x):
            r, d, m = x
            run = run + (r * m).sum(-1)
            end = d.any(-1)
            return jnp.where(end, 0.0, run), (jnp.where(end, run, 0.0), end)

        running, (rets, ends) = jax.lax.scan(step, running, (raw, done, mask))
        return running, rets.sum(), ends.sum()

    def train(key):
        k_init, k_sampler, k_loop = jax.random.split(key, 3)
        params = policy.init(k_init)
        opt_state = tx.init(params)
        state = rollout.init(k_sampler)

        def update(carry, _):
            params, opt_state, state, running, key = carry
            state, batch, (raw, done, mask) = sample(params, state)
            running, ret_sum, ret_count = episode_returns(running, raw, done, mask)
            flat = jax.tree.map(
                lambda x: x.reshape((batch_size * x.shape[2],) + x.shape[3:]), batch
            )
            key, k_epochs = jax.random.split(key)
            params, opt_state = epochs(params, opt_state, flat, k_epochs)
            return (params, opt_state, state, running, key), {
                "return_sum": ret_sum,
                "episodes": ret_count,
            }

        carry = (params, opt_state, state, jnp.zeros((cfg.num_envs,), jnp.float32), k_loop)
        _, metrics = jax.lax.scan(update, carry, None, cfg.num_updates)
        return metrics

    return train


def run_variant(
    cfg: Any, normalize: bool, seeds: int, seed: int, bar: Any = None
) -> dict[str, Any]:
    """Trains ``seeds`` seeds one after the other with one compiled function (``bar``, a
    :class:`jaxsampler.integrations.progress.Bar`, advances by each seed's env steps)."""
    keys = jax.random.split(jax.random.PRNGKey(seed), seeds)  # the same keys for both variants
    steps = cfg.num_updates * cfg.num_envs * cfg.rollout_length
    per_seed, compile_s, wall_s = ppo.train_seeds(
        lambda: make_train(cfg, normalize),
        keys,
        None if bar is None else lambda _i, _t: bar.update(steps),
    )
    ret_sum = np.stack([np.asarray(m["return_sum"]) for m in per_seed])
    eps = np.stack([np.asarray(m["episodes"]) for m in per_seed])
    curve = np.where(eps > 0, ret_sum / np.maximum(eps, 1), np.nan)
    tail = max(1, cfg.num_updates // 20)  # the last 5% of updates
    n_tail = eps[:, -tail:].sum(1)
    final = np.where(n_tail > 0, ret_sum[:, -tail:].sum(1) / np.maximum(n_tail, 1), np.nan)
    return {
        "normalize": normalize,
        "transforms": (
            [repr(NormalizeObservation()), repr(NormalizeReward(gamma=cfg.gamma))]
            if normalize
            else []
        ),
        "compile_s": compile_s,
        "wall_s": wall_s,
        "final_mean_return_per_seed": [None if np.isnan(v) else float(v) for v in final],
        "steps_to_threshold_per_seed": {
            str(th): [ppo.steps_to(c, th, cfg.num_envs * cfg.rollout_length) for c in curve]
            for th in thresholds_of(cfg.env_id)
        },
        "learning_curve_per_seed": [
            [None if np.isnan(v) else float(v) for v in c] for c in curve.tolist()
        ],
    }


def run(cfg: Any, seeds: int = 3, seed: int = 0, bar: Any = None) -> dict[str, Any]:
    """Both variants on the same seeds; the result dict written to JSON."""
    steps_per_update = cfg.num_envs * cfg.rollout_length
    variants = {
        "normalized": run_variant(cfg, True, seeds, seed, bar),
        "raw": run_variant(cfg, False, seeds, seed, bar),
    }
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", "-m", "examples.ppo_normalization", *sys.argv[1:]]),
        "jax": jax.__version__,
        "config": dataclasses.asdict(cfg),
        "seeds": seeds,
        "seed": seed,
        "env_steps_per_seed": cfg.num_updates * steps_per_update,
        "env_steps_per_update": steps_per_update,
        "curve_metric": "mean raw return of the episodes completed in each update "
        "(traj.raw_rewards), None where none completed",
        "variants": variants,
    }


def log_curves(logger: js.integrations.loggers.Logger, res: dict[str, Any]) -> int:
    """Writes the learning curves to ``logger``, one line per update (step: env steps per
    seed): ``<variant>/seed<i>/episode_return_mean`` and the mean over seeds
    ``<variant>/episode_return_mean`` (left out of updates where no episode finished);
    the last line adds each variant's ``compile_s``, ``env_steps_per_s`` and
    ``final_mean_return``."""
    history: dict[str, Any] = {}
    final: dict[str, float] = {}
    for name, v in res["variants"].items():
        curves = np.asarray(v["learning_curve_per_seed"], dtype=float)  # None -> nan
        for i, c in enumerate(curves):
            history[f"{name}/seed{i}/episode_return_mean"] = c
        done = np.isfinite(curves)
        history[f"{name}/episode_return_mean"] = np.where(
            done.any(0), np.where(done, curves, 0).sum(0) / np.maximum(done.sum(0), 1), np.nan
        )
        final[f"{name}/compile_s"] = v["compile_s"]
        final[f"{name}/env_steps_per_s"] = res["env_steps_per_seed"] * res["seeds"] / v["wall_s"]
        finals = [r for r in v["final_mean_return_per_seed"] if r is not None]
        if finals:
            final[f"{name}/final_mean_return"] = float(np.mean(finals))
    return js.integrations.loggers.log_history(
        logger, history, steps_per_update=res["env_steps_per_update"], final=final
    )


def _summary(res: dict[str, Any]) -> dict[str, dict[str, float]]:
    out = {}
    for name, v in res["variants"].items():
        final = np.asarray(v["final_mean_return_per_seed"], dtype=float)  # None -> nan
        if np.isnan(final).all():
            out[name] = {"mean": np.nan, "min": np.nan, "max": np.nan}
        else:
            out[name] = {
                "mean": float(np.nanmean(final)),
                "min": float(np.nanmin(final)),
                "max": float(np.nanmax(final)),
            }
    return out


def markdown(res: dict[str, Any]) -> str:
    cfg = res["config"]
    s = _summary(res)
    lines = [
        "# PPO with and without normalization transforms (examples/ppo_normalization.py)",
        "",
        f"{res['date']} · {cfg['env_id']}, {res['seeds']} seeds (the same for both), "
        f"{res['env_steps_per_seed']:,} env steps per seed · jax {res['jax']}, 2-core CPU "
        f"(shared) · `python -m examples.ppo_normalization --env {cfg['env_id']}`",
        "",
        f"PPO of `examples/ppo.py` with its Pendulum-v1 settings except `gamma = {cfg['gamma']}`: "
        f"{cfg['num_envs']} envs x {cfg['rollout_length']} steps per update, "
        f"{cfg['update_epochs']} epochs x {cfg['num_minibatches']} minibatches, lr "
        f"{cfg['lr']} (annealed), GAE lambda {cfg['gae_lambda']}, clip {cfg['clip_eps']} "
        f"(policy and value), MLP {tuple(cfg['hidden_sizes'])} {cfg['activation']}. "
        "`normalized` trains on the transformed observations and rewards; every return "
        "below is the env's raw return (`traj.raw_rewards`).",
        "",
        "| variant | transforms | final return per seed | mean | "
        + " | ".join(f"steps to {th:g} per seed" for th in thresholds_of(cfg["env_id"]))
        + " | train wall s | compile s |",
        "|---|---|---|---:|" + "---|" * len(thresholds_of(cfg["env_id"])) + "---:|---:|",
    ]
    for name, v in res["variants"].items():
        tfs = ", ".join(f"`{t}`" for t in v["transforms"]) or "—"
        per_seed = ", ".join(
            "—" if r is None else f"{r:.1f}" for r in v["final_mean_return_per_seed"]
        )
        reach = " | ".join(
            ", ".join(
                "never" if n is None else f"{n:,}"
                for n in v["steps_to_threshold_per_seed"][str(th)]
            )
            for th in thresholds_of(cfg["env_id"])
        )
        lines.append(
            f"| {name} | {tfs} | {per_seed} | {s[name]['mean']:.1f} | {reach} | "
            f"{v['wall_s']:.1f} | {v['compile_s']:.1f} |"
        )
    lines += [
        "",
        "Final return = mean raw return of the episodes completed in the last 5% of updates. "
        "Steps to a threshold = env steps until the 10-update moving average of the raw "
        "training return first reaches it (`never`: not within the run). Curves: "
        f"`{stem_of(cfg['env_id'])}.png` (mean and min-max over seeds).",
    ]
    return "\n".join(lines) + "\n"


def plot(res: dict[str, Any], path: Path) -> None:
    plt = ppo.pyplot()

    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    per_update = res["env_steps_per_update"]
    colors = {"normalized": "tab:blue", "raw": "tab:red"}
    labels = {
        "normalized": "NormalizeObservation + NormalizeReward",
        "raw": "no transforms",
    }
    for name, v in res["variants"].items():
        c = np.asarray(v["learning_curve_per_seed"], dtype=float)
        x = (np.arange(c.shape[1]) + 1) * per_update
        ok = np.isfinite(c).all(0)
        mean, lo, hi = c.mean(0), c.min(0), c.max(0)
        ax.plot(x[ok], mean[ok], color=colors[name], label=f"{labels[name]} (mean)")
        ax.fill_between(x[ok], lo[ok], hi[ok], color=colors[name], alpha=0.2, label="min-max")
    ax.set_xlabel("env steps per seed")
    ax.set_ylabel("raw episode return (sum of env rewards)")
    cfg = res["config"]
    ax.set_title(
        f"PPO on {cfg['env_id']} (gamma {cfg['gamma']}), {res['seeds']} seeds: "
        "raw training return\njaxsampler rollout, 2-core CPU",
        fontsize=10,
    )
    ppo.save_curves(fig, ax, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="Pendulum-v1", choices=sorted(ENVS))
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--total-timesteps", type=int, default=None)
    p.add_argument("--quick", action="store_true", help="tiny run; prints, writes only --out")
    p.add_argument("--out", type=Path, default=None, help="directory for the results")
    js.integrations.loggers.add_arguments(p)  # --log-dir, --logger, --quiet
    args = p.parse_args(argv)
    cfg, _, stem = ENVS[args.env]
    if args.quick:
        cfg = dataclasses.replace(
            cfg,
            num_envs=2,
            rollout_length=100,
            total_timesteps=1400,
            update_epochs=1,
            num_minibatches=2,
        )
    if args.total_timesteps is not None:
        cfg = dataclasses.replace(cfg, total_timesteps=args.total_timesteps)
    logger = js.integrations.loggers.from_arguments(args)
    total = 2 * args.seeds * cfg.num_updates * cfg.num_envs * cfg.rollout_length
    with (
        logger,
        js.integrations.progress.progress(total, desc="ppo_normalization", quiet=args.quiet) as bar,
    ):
        res = run(cfg, args.seeds, args.seed, bar)
        log_curves(logger, res)
    md = markdown(res)
    print(md)
    out = args.out if args.out is not None else (None if args.quick else RESULTS)
    if out is not None:
        ppo.write_json(out / f"{stem}.json", res)
        (out / f"{stem}.md").write_text(md)
        plot(res, out / f"{stem}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
