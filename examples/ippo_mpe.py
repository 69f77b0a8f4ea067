"""IPPO on JaxMARL's MPE simple spread, collected by jaxsampler or by a hand-written JaxMARL loop.

IPPO as JaxMARL's ``baselines/IPPO/ippo_ff_mpe.py`` runs it: one actor-critic MLP shared by
the three agents (separate 64-64 tanh actor and critic), PPO with clipping and GAE, the
hyperparameters of JaxMARL's ``config/ippo_ff_mpe.yaml`` (:data:`JAXMARL_CONFIG`). The
whole training is one ``jax.jit`` (a ``lax.scan`` over updates, PureJaxRL style); the
learner is ``examples/ppo.py``'s (loss, optimizer, minibatch epochs, episode returns).
Only the collection differs:

* ``--sampler jaxsampler``: ``js.make_rollout`` on ``js.make("jaxmarl:MPE_simple_spread_v3")``,
  GAE with :func:`jaxsampler.compute_gae`;
* ``--sampler hand``: a plain JaxMARL loop, ``vmap`` of JaxMARL's own ``env.reset`` /
  ``env.step`` over the envs inside a ``lax.scan``, agents as JaxMARL's dict, JaxMARL's
  same-step auto-reset (:func:`jaxmarl_sampler`).

``--compare`` trains both, seeds interleaved, and writes
``benchmarks/results/ippo_mpe.{json,md,png}``.

    python -m examples.ippo_mpe --compare --seeds 3          # 3M env steps per run, ~10 min
    python -m examples.ippo_mpe --sampler hand --seeds 1

The metric is JaxMARL's: an episode's return summed over the agents (JaxMARL's
``MPELogWrapper`` logs each agent's return times the number of agents; the agents' mean
of that is the sum), averaged over the episodes that end in an update.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxsampler as js
from benchmarks import harness
from examples import ppo
from jaxsampler.policies.mlp import log_prob

#: The JaxMARL env id.
ENV_ID = "MPE_simple_spread_v3"

#: JaxMARL's IPPO-FF MPE settings (FLAIROx/JaxMARL ``baselines/IPPO/config/ippo_ff_mpe.yaml``:
#: LR 2.5e-4 annealed, 16 envs x 128 steps, 1e7 timesteps, 4 epochs of 4 minibatches,
#: gamma 0.99, lambda 0.95, clip 0.2, entropy 0.01, value 0.5, grad norm 0.5, tanh 64-64).
JAXMARL_CONFIG = ppo.PPOConfig(
    env_id=f"jaxmarl:{ENV_ID}",
    num_envs=16,
    rollout_length=128,
    total_timesteps=10_000_000,
    update_epochs=4,
    num_minibatches=4,
    lr=2.5e-4,
    anneal_lr=True,
    gamma=0.99,
    gae_lambda=0.95,
    clip_eps=0.2,
    ent_coef=0.01,
    vf_coef=0.5,
    max_grad_norm=0.5,
    hidden_sizes=(64, 64),
    activation="tanh",
)

#: Env steps of the full run here: JaxMARL's 1e7 do not fit 6 runs on 2 shared cores.
FULL_TIMESTEPS = 3_000_000

SAMPLERS = ("jaxsampler", "hand")


# ----------------------------------------------------------------------------- samplers


def jaxmarl_sampler(cfg: ppo.PPOConfig, env: js.Env, policy: ppo.ActorCritic):
    """``(init(key), run(params, carry) -> (carry, batch))``: a hand-written JaxMARL loop.

    ``jaxmarl.make`` builds the env; ``vmap`` of its ``reset`` and ``step`` (which resets an
    ended episode in the same step) runs over ``cfg.num_envs`` envs inside a ``lax.scan`` of
    ``cfg.rollout_length`` steps. Observations, actions and rewards stay JaxMARL dicts at
    the env boundary and are stacked on an agent axis for the shared network. Each step
    splits its key four ways (next, actions, env steps, unused), the split jaxsampler's
    rollout makes, and ``init`` splits ``(loop key, reset key)`` as jaxsampler's does: on the
    same key both samplers draw the same first episode. The batch has the leaves
    ``[T, E, A, ...]`` of :func:`examples.ppo.jaxsampler_sampler`'s (every row acts)."""
    import jaxmarl

    menv = jaxmarl.make(cfg.env_id.removeprefix("jaxmarl:"))
    agents = tuple(menv.agents)
    E, T = cfg.num_envs, cfg.rollout_length

    def stack(d: dict) -> jax.Array:  # {agent: [E, ...]} -> [E, A, ...]
        return jnp.stack([d[a] for a in agents], axis=1)

    def init(key: jax.Array) -> tuple:
        k_loop, k_reset = jax.random.split(key)
        obs, st = jax.vmap(menv.reset)(jax.random.split(k_reset, E))
        return (obs, st, k_loop)

    def run(params: Any, carry: tuple) -> tuple[tuple, dict]:
        def body(c: tuple, _: None) -> tuple[tuple, tuple]:
            obs_d, st, key = c
            key, k_act, k_step, _ = jax.random.split(key, 4)
            obs = stack(obs_d)
            logits, value, _ = policy.forward(params, obs)
            action = jax.random.categorical(k_act, logits).astype(jnp.int32)
            logp = log_prob(policy.action_space, logits, None, action)
            act_d = {a: action[:, i] for i, a in enumerate(agents)}
            obs2, st, r, done, _ = jax.vmap(menv.step)(jax.random.split(k_step, E), st, act_d)
            out = (obs, action, stack(r).astype(jnp.float32), stack(done), logp, value)
            return (obs2, st, key), out

        carry, (obs, actions, rewards, done, logp, values) = jax.lax.scan(body, carry, None, T)
        _, last_value, _ = policy.forward(params, stack(carry[0]))
        every = jnp.ones(rewards.shape, bool)
        adv = js.postprocessing.gae(
            rewards,
            values,
            done,  # JaxMARL's done (its 25-step limit too) ends the return: no bootstrap
            jnp.zeros_like(done),
            every,
            jnp.zeros((T, E), bool),
            last_value,
            cfg.gamma,
            cfg.gae_lambda,
        )
        batch = {
            "obs": obs,
            "actions": actions,
            "logp": logp,
            "values": values,
            "advantages": adv.advantages,
            "targets": adv.value_targets,
            "mask": every,
            "rewards": rewards,
            "done": done,
        }
        return carry, batch

    return init, run


#: The sampler factory of each ``--sampler``.
SAMPLER_FACTORIES = {"jaxsampler": ppo.jaxsampler_sampler, "hand": jaxmarl_sampler}


def make_train(cfg: ppo.PPOConfig, sampler: str):
    """``train(key) -> metrics`` (leaves ``[num_updates]``) of IPPO with ``sampler``'s
    collection: the same learner (:func:`examples.ppo.make_train`) for both. Pure; jit it."""
    return ppo.make_train(cfg, sampler=SAMPLER_FACTORIES[sampler])


# ----------------------------------------------------------------------------- runs


def final_return(ret_sum: np.ndarray, eps: np.ndarray) -> float:
    """Mean return of the episodes that end in the last 5% of updates (at least one)."""
    tail = max(1, len(ret_sum) // 20)
    return float(ret_sum[-tail:].sum() / max(eps[-tail:].sum(), 1))


def first_return(ret_sum: np.ndarray, eps: np.ndarray) -> float:
    """Mean return of the episodes that end in the first 5% of updates (at least one)."""
    head = max(1, len(ret_sum) // 20)
    return float(ret_sum[:head].sum() / max(eps[:head].sum(), 1))


def train_all(
    cfg: ppo.PPOConfig, samplers: tuple[str, ...], seeds: int, seed: int
) -> dict[str, Any]:
    """Compiles each sampler's training once, then trains ``seeds`` seeds (keys split from
    ``seed``, the same keys for every sampler), the samplers interleaved within each seed
    (their order alternating from seed to seed). Returns ``{"compile_s": {sampler: s},
    "runs": [...]}``, one run per seed and sampler with its wall time, final return and
    per-update curve (``None`` where no episode ended)."""
    keys = jax.random.split(jax.random.PRNGKey(seed), seeds)
    compiled, compile_s = {}, {}
    for name in samplers:
        t0 = time.perf_counter()
        compiled[name] = jax.jit(make_train(cfg, name)).lower(keys[0]).compile()
        compile_s[name] = time.perf_counter() - t0
        harness.log(f"{name}: compiled in {compile_s[name]:.1f} s")
    runs = []
    for i, k in enumerate(keys):
        for name in harness.alternated(samplers, i):
            t0 = time.perf_counter()
            metrics = jax.block_until_ready(compiled[name](k))
            wall = time.perf_counter() - t0
            ret_sum, eps = np.asarray(metrics["return_sum"]), np.asarray(metrics["episodes"])
            curve = np.where(eps > 0, ret_sum / np.maximum(eps, 1), np.nan)
            runs.append(
                {
                    "sampler": name,
                    "seed": i,
                    "wall_s": wall,
                    "env_steps_per_s": cfg.num_updates * cfg.num_envs * cfg.rollout_length / wall,
                    "first_return": first_return(ret_sum, eps),
                    "final_return": final_return(ret_sum, eps),
                    "episodes": int(eps.sum()),
                    "curve": [None if np.isnan(v) else float(v) for v in curve],
                }
            )
            harness.log(
                f"{name} seed {i}: {wall:.1f} s, final return {runs[-1]['final_return']:.2f}"
            )
    return {"compile_s": compile_s, "runs": runs}


def summarize(cfg: ppo.PPOConfig, out: dict[str, Any]) -> dict[str, Any]:
    """Per sampler: the final returns' mean and range, the median wall time; the paired
    (same seed) wall-time ratio jaxsampler / hand, median over seeds (when both ran)."""
    runs = out["runs"]
    by = {(r["sampler"], r["seed"]): r for r in runs}
    samplers = sorted({r["sampler"] for r in runs}, key=SAMPLERS.index)
    seeds = sorted({r["seed"] for r in runs})
    s: dict[str, Any] = {}
    for name in samplers:
        finals = [by[name, i]["final_return"] for i in seeds]
        s[name] = {
            "final_return_mean": float(np.mean(finals)),
            "final_return_min": min(finals),
            "final_return_max": max(finals),
            "wall_s_median": statistics.median(by[name, i]["wall_s"] for i in seeds),
        }
    if len(samplers) == 2:
        s["wall_ratio_jaxsampler_over_hand"] = harness.paired_ratio(
            [by["jaxsampler", i]["wall_s"] for i in seeds], [by["hand", i]["wall_s"] for i in seeds]
        )
    return s


#: What JaxMARL publishes for this run, as found (see the module docstring of the result).
JAXMARL_PUBLISHED = {
    "value": None,
    "note": (
        "no numeric IPPO return for MPE_simple_spread_v3 found: JaxMARL's paper "
        "(Rutherford et al., 'JaxMARL: Multi-Agent RL Environments and Algorithms in JAX', "
        "arXiv 2311.10090) shows MPE results as learning-curve figures only, and the "
        "repository's baselines/IPPO (ippo_ff_mpe.py, config/ippo_ff_mpe.yaml: 1e7 timesteps) "
        "logs returns to wandb and saves a plot (ippo_ff_MPE_simple_spread_v3.png) without a "
        "stated number. The reference here is JaxMARL's own recipe run by hand: the "
        "hand-written JaxMARL loop with that config"
    ),
    "config_source": "FLAIROx/JaxMARL baselines/IPPO/config/ippo_ff_mpe.yaml",
}


def markdown(res: dict[str, Any]) -> str:
    """The result tables: per seed and sampler, then the summary."""
    cfg, s = res["config"], res["summary"]
    steps = res["env_steps_per_seed"]
    lines = [
        f"# IPPO on JaxMARL {ENV_ID}: jaxsampler vs a hand-written JaxMARL loop\n",
        f"Measured {res['date']} on {res['machine']['cpus']} shared CPU cores "
        f"({res['machine']['cpu']}), jax {res['versions'].get('jax')}, "
        f"jaxmarl {res['versions'].get('jaxmarl')}. Command: `{res['command']}`.\n",
        f"JaxMARL's IPPO-FF MPE config ({JAXMARL_PUBLISHED['config_source']}): "
        f"{cfg['num_envs']} envs x {cfg['rollout_length']} steps, lr {cfg['lr']} annealed, "
        f"{cfg['update_epochs']} epochs x {cfg['num_minibatches']} minibatches, "
        f"{steps:,} env steps per run here (JaxMARL's config: "
        f"{JAXMARL_CONFIG.total_timesteps:,}; fewer to fit 6 runs on 2 shared cores).\n",
        "Return: an episode's return summed over the 3 agents (JaxMARL's "
        "`returned_episode_returns`), final = mean over the episodes ending in the last 5% "
        "of updates (first: the first 5%). Published JaxMARL value: none found as a number "
        f"({JAXMARL_PUBLISHED['note']}).\n",
        "| seed | sampler | first return | final return | JaxMARL published | wall s "
        "| env steps/s |",
        "|---:|---|---:|---:|---|---:|---:|",
    ]
    for r in sorted(res["runs"], key=lambda r: (r["seed"], SAMPLERS.index(r["sampler"]))):
        lines.append(
            f"| {r['seed']} | {r['sampler']} | {r['first_return']:.2f} | "
            f"{r['final_return']:.2f} | — (none found) | "
            f"{r['wall_s']:.1f} | {harness.thousands(r['env_steps_per_s'])} |"
        )
    lines += ["", "| sampler | compile s | mean final return (min, max) | median wall s |"]
    lines.append("|---|---:|---:|---:|")
    for name in SAMPLERS:
        if name in s:
            lines.append(
                f"| {name} | {res['compile_s'][name]:.1f} | {s[name]['final_return_mean']:.2f} "
                f"({s[name]['final_return_min']:.2f}, {s[name]['final_return_max']:.2f}) | "
                f"{s[name]['wall_s_median']:.1f} |"
            )
    if "wall_ratio_jaxsampler_over_hand" in s:
        lines.append(
            f"\nWall time jaxsampler / hand (paired per seed, median): "
            f"**{s['wall_ratio_jaxsampler_over_hand']:.3f}**.\n"
        )
    lines.append(
        "An MPE episode is 26 transitions (JaxMARL ends it when its step counter, read "
        "before the step increments it, reaches max_steps=25). jaxsampler's rollout spends "
        "one more slot per episode on the reset (next-step auto-reset: nobody acts, masked "
        "out of the loss), so of the env steps counted here 26 in 27 are transitions the "
        "learner trains on; JaxMARL's loop resets in the same step and trains on all.\n"
    )
    lines.append("![Learning curves of both samplers, 3 seeds each](ippo_mpe.png)\n")
    return "\n".join(lines) + "\n"


def plot(res: dict[str, Any], path: Path) -> None:
    """Learning curves: return vs env steps, one line per seed and sampler (a 10-update
    moving average over the updates in which an episode ended)."""
    from matplotlib.ticker import FuncFormatter

    plt = harness.pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    per_update = res["config"]["num_envs"] * res["config"]["rollout_length"]
    colors = {"jaxsampler": "tab:blue", "hand": "tab:orange"}
    styles = ["-", "--", ":"]
    for r in res["runs"]:
        c = np.array([np.nan if v is None else v for v in r["curve"]], float)
        ok = np.isfinite(c)
        x = (np.flatnonzero(ok) + 1) * per_update
        y = np.convolve(c[ok], np.ones(10) / 10, mode="valid") if ok.sum() >= 10 else c[ok]
        ax.plot(
            x[len(x) - len(y) :],
            y,
            color=colors[r["sampler"]],
            ls=styles[r["seed"] % len(styles)],
            lw=1.2,
            label=f"{r['sampler']} seed {r['seed']}",
        )
    ax.set_xlabel("env steps (per run; 16 envs x 128 steps per update)")
    ax.set_ylabel("episode return, summed over the 3 agents (10-update mean)")
    ax.set_title(
        f"IPPO on JaxMARL {ENV_ID}: jaxsampler vs hand-written JaxMARL loop\n"
        f"(JaxMARL's IPPO-FF config; measured on a {res['machine']['cpus']}-core shared CPU)"
    )
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sampler", choices=SAMPLERS, default="jaxsampler")
    p.add_argument("--compare", action="store_true", help="both samplers, seeds interleaved")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--total-timesteps", type=int, default=None)
    p.add_argument("--num-envs", type=int, default=None)
    p.add_argument("--rollout-length", type=int, default=None)
    harness.add_quick_out(p, "ippo_mpe")
    args = p.parse_args(argv)
    total = args.total_timesteps
    if total is None:
        total = 4 * 4 * 32 if args.quick else FULL_TIMESTEPS
    cfg = dataclasses.replace(JAXMARL_CONFIG, total_timesteps=total)
    if args.quick:
        cfg = dataclasses.replace(cfg, num_envs=4, rollout_length=32)
    for field in ("num_envs", "rollout_length"):
        if getattr(args, field) is not None:
            cfg = dataclasses.replace(cfg, **{field: getattr(args, field)})
    samplers = SAMPLERS if args.compare else (args.sampler,)
    out = train_all(cfg, samplers, args.seeds, args.seed)
    res: dict[str, Any] = {
        "benchmark": f"IPPO on JaxMARL {ENV_ID}, jaxsampler vs a hand-written JaxMARL loop",
        "date": harness.now(),
        "command": " ".join(["python", "-m", "examples.ippo_mpe", *(argv or sys.argv[1:])]),
        **harness.git_state(),
        "machine": harness.machine(),
        "versions": harness.versions(["jax", "jaxlib", "jaxmarl", "flax", "optax"]),
        "config": dataclasses.asdict(cfg),
        "jaxmarl_config": dataclasses.asdict(JAXMARL_CONFIG),
        "jaxmarl_published": JAXMARL_PUBLISHED,
        "metric": "episode return summed over the agents (JaxMARL's returned_episode_returns)",
        "seeds": args.seeds,
        "env_steps_per_seed": cfg.num_updates * cfg.num_envs * cfg.rollout_length,
        **out,
    }
    res["summary"] = summarize(cfg, out)
    harness.finish(
        res, markdown(res), "ippo_mpe", harness.results_dir(args.out, args.quick), plot=plot
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
