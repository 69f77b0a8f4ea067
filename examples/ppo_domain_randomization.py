"""PPO on CartPole-v1 with domain randomization, evaluated on held-out physics.

Three PPO runs per seed, same algorithm and hyperparameters (``examples/ppo.py``'s, whose
pieces this file imports): two with
:class:`~jaxsampler.transforms.params.DomainRandomization` drawing, at every reset of every
env and inside the jitted training loop, a pole half-length and a cart mass (``randomized``:
uniform in ``[0.25, 0.75]`` m and ``[0.5, 2.0]`` kg; ``randomized_wide``: log-uniform in
``[0.1, 2.0]`` m and ``[0.25, 5.0]`` kg), and one on the default physics (half-length
0.5 m, cart 1 kg). Each policy is then evaluated greedily on a grid of held-out pole
lengths and cart masses (outside and between the training ones), each evaluation
episode with its own params (per-episode ``env_params``).

    python -m examples.ppo_domain_randomization             # 3 seeds x 500k steps per variant
    python -m examples.ppo_domain_randomization --quick     # tiny sizes (the test)

Writes ``benchmarks/results/ppo_domain_randomization.{json,md,png}`` (``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxsampler as js
from examples import ppo
from jaxsampler.transforms.params import DomainRandomization

PPOConfig = ppo.PPOConfig
make_epochs, make_loss, make_optimizer = ppo.make_epochs, ppo.make_loss, ppo.make_optimizer

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
NAME = "ppo_domain_randomization"


@dataclasses.dataclass(frozen=True)
class Ranges:
    """What a randomized run draws per episode: pole half-length (m) and cart mass (kg)
    in ``[lo, hi]``, uniformly or log-uniformly."""

    length: tuple[float, float]
    masscart: tuple[float, float]
    log: bool = False

    def describe(self) -> str:
        kind = "logU" if self.log else "U"
        return f"half-length {kind}{self.length} m, cart {kind}{self.masscart} kg"

    def contains(self, length: float, masscart: float) -> bool:
        lo_l, hi_l = self.length
        lo_m, hi_m = self.masscart
        return lo_l <= length <= hi_l and lo_m <= masscart <= hi_m


#: The training physics of each variant (``None``: CartPole's defaults, 0.5 m and 1 kg).
VARIANTS: dict[str, Ranges | None] = {
    "randomized": Ranges(length=(0.25, 0.75), masscart=(0.5, 2.0)),
    "randomized_wide": Ranges(length=(0.1, 2.0), masscart=(0.25, 5.0), log=True),
    "default": None,
}
DEFAULT_PHYSICS = "default physics (half-length 0.5 m, cart 1 kg)"
#: Held-out evaluation grid (pole half-length m x cart mass kg).
EVAL_LENGTHS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.6, 0.7, 1.0, 1.5, 2.0, 3.0)
EVAL_MASSCARTS = (0.25, 0.75, 1.5, 3.0, 5.0)


def make_sample_params(ranges: Ranges):
    """``sample_params(key, base) -> params`` for one env: ``base`` with a new pole
    half-length and cart mass drawn from ``ranges`` (the DomainRandomization function)."""

    def draw(key: jax.Array, lo_hi: tuple[float, float]) -> jax.Array:
        lo, hi = lo_hi
        if ranges.log:
            return jnp.exp(jax.random.uniform(key, (), minval=np.log(lo), maxval=np.log(hi)))
        return jax.random.uniform(key, (), minval=lo, maxval=hi)

    def sample_params(key: jax.Array, base: Any) -> Any:
        k_len, k_mass = jax.random.split(key)
        return dataclasses.replace(
            base, length=draw(k_len, ranges.length), masscart=draw(k_mass, ranges.masscart)
        )

    return sample_params


def make_policy(cfg: PPOConfig, env: js.Env) -> js.MLPPolicy:
    return js.MLPPolicy(env.observation_space, env.action_space, cfg.hidden_sizes, cfg.activation)


def make_train(cfg: PPOConfig, ranges: Ranges | None):
    """``train(key) -> (policy params, metrics)``: PPO (``examples/ppo.py``'s loss, optimizer
    and minibatch epochs) on a rollout with domain randomization over ``ranges`` (``None``:
    the default physics). Pure."""
    env = js.make(cfg.env_id)
    policy = make_policy(cfg, env)
    randomize = ranges is not None
    transforms = (DomainRandomization(make_sample_params(ranges)),) if randomize else ()
    rollout = js.make_rollout(env, policy, cfg.num_envs, cfg.rollout_length, transforms=transforms)
    tx = make_optimizer(cfg)
    epochs = make_epochs(cfg, make_loss(cfg, policy), tx)
    batch_size = cfg.num_envs * cfg.rollout_length

    def train(key: jax.Array) -> tuple[Any, dict[str, jax.Array]]:
        k_init, k_state, k_loop = jax.random.split(key, 3)
        params = policy.init(k_init)
        opt_state = tx.init(params)
        state = rollout.init(k_state)

        def update(carry, _):
            params, opt_state, state, running, key = carry
            state, traj = rollout(params, state)
            batch = ppo.ppo_batch(cfg, policy, params, traj, state)
            flat = jax.tree.map(
                lambda x: x.reshape((batch_size * x.shape[2],) + x.shape[3:]), batch
            )
            key, k_epochs = jax.random.split(key)
            params, opt_state = epochs(params, opt_state, flat, k_epochs)

            # Returns of the episodes completed in this rollout (running sums per env).
            def step(run, x):
                r, done, m = x
                run = run + (r * m).sum(-1)
                return jnp.where(done, 0.0, run), (jnp.where(done, run, 0.0), done)

            done = (traj.terminated | traj.truncated).any(-1)
            running, (rets, dones) = jax.lax.scan(step, running, (traj.rewards, done, traj.acting))
            metrics = {"return_sum": rets.sum(), "episodes": dones.sum()}
            if randomize:  # the physics the episodes ran with (recorded per step)
                metrics["length_mean"] = traj.env_params.length.mean()
                metrics["masscart_mean"] = traj.env_params.masscart.mean()
            return (params, opt_state, state, running, key), metrics

        running = jnp.zeros((cfg.num_envs,), jnp.float32)
        carry = (params, opt_state, state, running, k_loop)
        (params, *_), metrics = jax.lax.scan(update, carry, None, cfg.num_updates)
        return params, metrics

    return train


# ----------------------------------------------------------------------------- evaluation


def eval_grid(lengths: tuple[float, ...], masses: tuple[float, ...], per_cell: int) -> Any:
    """CartPole params with a leading ``[len(lengths) * len(masses) * per_cell]`` axis on
    ``length`` and ``masscart`` (cell-major: length, then mass, then repeat)."""
    length, mass = np.meshgrid(np.asarray(lengths), np.asarray(masses), indexing="ij")
    length = np.repeat(length.reshape(-1), per_cell).astype(np.float32)
    mass = np.repeat(mass.reshape(-1), per_cell).astype(np.float32)
    return dataclasses.replace(
        js.make("CartPole-v1").default_params,
        length=jnp.asarray(length),
        masscart=jnp.asarray(mass),
    )


def evaluate_episodes(
    env: js.Env, policy: js.MLPPolicy, params: Any, env_params: Any, num_episodes: int, key: Any
) -> tuple[np.ndarray, np.ndarray]:
    """Returns and lengths of ``num_episodes`` greedy episodes, episode ``i`` with the
    params of index ``i`` of ``env_params`` (leaves ``[num_episodes]``):
    :func:`jaxsampler.evaluate`, which runs each episode to its end (no bias towards short
    episodes)."""
    res = js.evaluate(
        env, policy, params, num_episodes, key, deterministic=True, env_params=env_params
    )
    return res.returns, res.lengths


# ----------------------------------------------------------------------------- the experiment


def run_experiment(
    cfg: PPOConfig,
    seeds: int,
    seed: int,
    lengths: tuple[float, ...],
    masses: tuple[float, ...],
    per_cell: int,
    bar: Any = None,
) -> dict[str, Any]:
    """Trains and evaluates every variant; ``bar`` (a :class:`jaxsampler.integrations.progress.Bar`)
    advances by each seed's training env steps."""
    env = js.make(cfg.env_id)
    policy = make_policy(cfg, env)
    grid = eval_grid(lengths, masses, per_cell)
    n_eval = len(lengths) * len(masses) * per_cell
    keys = jax.random.split(jax.random.PRNGKey(seed), seeds)
    steps = cfg.num_updates * cfg.num_envs * cfg.rollout_length  # per seed
    variants: dict[str, Any] = {}
    for name, ranges in VARIANTS.items():
        randomize = ranges is not None
        outs, compile_s, wall_s = ppo.train_seeds(
            lambda ranges=ranges: make_train(cfg, ranges),
            keys,
            None if bar is None else lambda _i, _t, name=name: bar.update(steps, variant=name),
        )
        per_seed: list[dict[str, Any]] = []
        for s, (params, metrics) in enumerate(outs):
            metrics = jax.device_get(metrics)
            ret_sum, eps = np.asarray(metrics["return_sum"]), np.asarray(metrics["episodes"])
            tail = max(1, cfg.num_updates // 20)
            final = float(ret_sum[-tail:].sum() / max(eps[-tail:].sum(), 1))
            curve = np.where(eps > 0, ret_sum / np.maximum(eps, 1), np.nan)
            eval_key = jax.random.fold_in(jax.random.PRNGKey(seed + 1000), s)
            returns, ep_lengths = evaluate_episodes(env, policy, params, grid, n_eval, eval_key)
            cells = returns.reshape(len(lengths), len(masses), per_cell)
            row: dict[str, Any] = {
                "seed_index": s,
                "final_train_return": final,
                "learning_curve": [None if np.isnan(v) else float(v) for v in curve],
                "eval_mean_return": float(returns.mean()),
                "eval_return_grid": cells.mean(-1).tolist(),  # [length][masscart]
                "eval_mean_length": float(ep_lengths.mean()),
            }
            if randomize:
                row["train_length_mean"] = float(np.mean(metrics["length_mean"]))
                row["train_masscart_mean"] = float(np.mean(metrics["masscart_mean"]))
            per_seed.append(row)
        grid_mean = np.mean([r["eval_return_grid"] for r in per_seed], axis=0)
        variants[name] = {
            "domain_randomization": randomize,
            "train_physics": ranges.describe() if ranges else DEFAULT_PHYSICS,
            "train_length_range_m": list(ranges.length) if ranges else [0.5, 0.5],
            "train_masscart_range_kg": list(ranges.masscart) if ranges else [1.0, 1.0],
            "train_log_uniform": bool(ranges and ranges.log),
            "compile_s": compile_s,
            "train_wall_s": wall_s,
            "env_steps_per_s": cfg.num_updates * cfg.num_envs * cfg.rollout_length * seeds / wall_s,
            "per_seed": per_seed,
            "eval_return_grid_mean_over_seeds": grid_mean.tolist(),
            "eval_mean_return": float(grid_mean.mean()),
        }
    return {
        "what": (
            "PPO on CartPole-v1 (examples/ppo.py's hyperparameters), trained with domain "
            "randomization of the pole half-length and cart mass, drawn per episode "
            + "; ".join(f"{n}: {r.describe()}" for n, r in VARIANTS.items() if r)
            + "; or on the default physics ('default'); each evaluated greedily on a "
            "held-out grid of half-lengths x cart masses, one episode per (params, repeat)"
        ),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{os.cpu_count()}-core {platform.machine()} CPU, shared with other jobs",
        "jax": jax.__version__,
        "config": dataclasses.asdict(cfg),
        "seeds": seeds,
        "env_steps_per_seed": cfg.num_updates * cfg.num_envs * cfg.rollout_length,
        "eval_lengths_m": list(lengths),
        "eval_masscarts_kg": list(masses),
        "eval_episodes_per_cell": per_cell,
        "eval_episodes_per_policy": n_eval,
        "variants": variants,
    }


def log_curves(logger: js.integrations.loggers.Logger, res: dict[str, Any]) -> int:
    """Writes the training curves to ``logger``, one line per update (step: env steps per
    seed): ``<variant>/seed<i>/train_return`` and its mean over seeds
    ``<variant>/train_return`` (left out where no episode finished); the last line adds
    each variant's ``compile_s``, ``env_steps_per_s`` and held-out ``eval_mean_return``."""
    history: dict[str, Any] = {}
    final: dict[str, float] = {}
    cfg = res["config"]
    for name, v in res["variants"].items():
        curves = np.asarray([r["learning_curve"] for r in v["per_seed"]], dtype=float)
        for i, c in enumerate(curves):
            history[f"{name}/seed{i}/train_return"] = c
        done = np.isfinite(curves)
        history[f"{name}/train_return"] = np.where(
            done.any(0), np.where(done, curves, 0).sum(0) / np.maximum(done.sum(0), 1), np.nan
        )
        final[f"{name}/compile_s"] = v["compile_s"]
        final[f"{name}/env_steps_per_s"] = v["env_steps_per_s"]
        final[f"{name}/eval_mean_return"] = v["eval_mean_return"]
    return js.integrations.loggers.log_history(
        logger, history, steps_per_update=cfg["num_envs"] * cfg["rollout_length"], final=final
    )


def write_markdown(res: dict[str, Any], path: Path) -> None:
    lengths, masses = res["eval_lengths_m"], res["eval_masscarts_kg"]
    v = res["variants"]
    lines = [
        "# PPO with domain randomization on CartPole-v1 (examples/ppo_domain_randomization.py)",
        "",
        f"{res['date']} · {res['seeds']} seeds per variant · "
        f"{res['env_steps_per_seed']:,} env steps per seed · {res['machine']}, jax {res['jax']}",
        "",
        res["what"] + ". Return = undiscounted episode return of the greedy policy (max 500); "
        f"{res['eval_episodes_per_cell']} episodes per grid cell and seed "
        f"({res['eval_episodes_per_policy']} per policy), each with its own params.",
        "",
        "| variant | training physics | final training return per seed "
        "| held-out mean return per seed | held-out mean | train wall s | env steps/s |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for name, r in v.items():
        lines.append(
            f"| {name} | {r['train_physics']} | "
            + ", ".join(f"{s['final_train_return']:.1f}" for s in r["per_seed"])
            + " | "
            + ", ".join(f"{s['eval_mean_return']:.1f}" for s in r["per_seed"])
            + f" | {r['eval_mean_return']:.1f} | {r['train_wall_s']:.1f} "
            f"| {r['env_steps_per_s']:,.0f} |"
        )
    for name, r in v.items():
        g = np.asarray(r["eval_return_grid_mean_over_seeds"])
        lo_l, hi_l = r["train_length_range_m"]
        lo_m, hi_m = r["train_masscart_range_kg"]
        lines += [
            "",
            f"## Held-out return of the {name} policy, mean over seeds",
            "",
            "Rows: pole half-length (m); columns: cart mass (kg); * = inside its training physics.",
            "",
            "| half-length \\ masscart | " + " | ".join(f"{m:g}" for m in masses) + " |",
            "|---:|" + "---:|" * len(masses),
        ]
        for i, length in enumerate(lengths):
            cells = [
                f"{g[i, j]:.1f}" + ("*" if lo_l <= length <= hi_l and lo_m <= m <= hi_m else "")
                for j, m in enumerate(masses)
            ]
            lines.append(f"| {length:g} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Plot: `{NAME}.png` (held-out return vs pole half-length, mean over the cart masses "
        "and seeds; bands: min-max over seeds; shaded spans: the training half-lengths).",
        "",
    ]
    path.write_text("\n".join(lines))


COLORS = {"randomized": "tab:green", "randomized_wide": "tab:orange", "default": "tab:blue"}


def write_plot(res: dict[str, Any], path: Path) -> None:
    plt = ppo.pyplot()
    lengths = np.asarray(res["eval_lengths_m"])
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for name, r in res["variants"].items():
        color = COLORS.get(name, "tab:gray")
        if r["domain_randomization"]:
            ax.axvspan(*r["train_length_range_m"], color=color, alpha=0.08)
        per_seed = np.asarray([np.asarray(s["eval_return_grid"]).mean(-1) for s in r["per_seed"]])
        ax.plot(lengths, per_seed.mean(0), "o-", color=color, label=f"{name}: {r['train_physics']}")
        if len(per_seed) > 1:
            ax.fill_between(lengths, per_seed.min(0), per_seed.max(0), color=color, alpha=0.2)
    ax.set_xscale("log")
    ax.set_xticks(lengths)
    ax.set_xticklabels([f"{x:g}" for x in lengths], fontsize=8)
    ax.minorticks_off()
    ax.set_xlabel("held-out pole half-length (m, log scale)")
    ax.set_ylabel("greedy episode return (steps balanced, max 500)")
    ax.set_ylim(0, 530)
    masses = ", ".join(f"{m:g}" for m in res["eval_masscarts_kg"])
    ax.set_title(
        "PPO on CartPole-v1 with/without domain randomization: greedy return on held-out\n"
        f"pole lengths, mean over cart masses {{{masses}}} kg ({res['eval_episodes_per_cell']} "
        f"episodes each) and {res['seeds']} seeds (band: min-max over seeds);\n"
        f"{res['env_steps_per_seed']:,} training steps per seed; {res['machine']}",
        fontsize=8.5,
    )
    ax.legend(fontsize=7.5, loc="lower center")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--total-timesteps", type=int, default=None)
    p.add_argument("--out", type=Path, default=RESULTS, help="directory of the result files")
    p.add_argument(
        "--replot", type=Path, default=None, help="only redraw the MD and PNG from this JSON"
    )
    js.integrations.loggers.add_arguments(p)  # --log-dir, --logger, --quiet
    args = p.parse_args(argv)
    if args.replot is not None:
        res = json.loads(args.replot.read_text())
        write_markdown(res, args.out / f"{NAME}.md")
        write_plot(res, args.out / f"{NAME}.png")
        return 0
    cfg = PPOConfig()  # examples/ppo.py's CartPole settings
    lengths, masses, per_cell, seeds = EVAL_LENGTHS, EVAL_MASSCARTS, 8, 3
    if args.quick:
        cfg = dataclasses.replace(cfg, num_envs=2, rollout_length=32, total_timesteps=256)
        lengths, masses, per_cell, seeds = (0.1, 0.5, 2.0), (0.5, 3.0), 2, 2
    if args.total_timesteps is not None:
        cfg = dataclasses.replace(cfg, total_timesteps=args.total_timesteps)
    seeds = args.seeds if args.seeds is not None else seeds
    logger = js.integrations.loggers.from_arguments(args)
    total = len(VARIANTS) * seeds * cfg.num_updates * cfg.num_envs * cfg.rollout_length
    with logger, js.integrations.progress.progress(total, desc=NAME, quiet=args.quiet) as bar:
        res = run_experiment(cfg, seeds, args.seed, lengths, masses, per_cell, bar)
        log_curves(logger, res)
    res["quick"] = bool(args.quick)
    args.out.mkdir(parents=True, exist_ok=True)
    ppo.write_json(args.out / f"{NAME}.json", res)
    write_markdown(res, args.out / f"{NAME}.md")
    write_plot(res, args.out / f"{NAME}.png")
    for name, r in res["variants"].items():
        print(
            f"{name}: train {r['train_wall_s']:.1f} s ({r['env_steps_per_s']:,.0f} steps/s), "
            "final train return "
            + ", ".join(f"{s['final_train_return']:.1f}" for s in r["per_seed"])
            + f"; held-out mean return {r['eval_mean_return']:.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
