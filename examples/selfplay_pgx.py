"""Self-play PPO on pgx's tic-tac-toe against an opponent pool, then against a uniformly
random legal player.

``js.make("pgx:tic_tac_toe")`` puts pgx's two players on the agent axis with masked
observations (the legal moves), so the policy only ever plays legal moves. pgx rewards
both players at the end of a game; the loser's -1 arrives while it waits for its turn and
is credited to its last move (a hanging reward). The PPO update (GAE over agent-episodes,
clipped minibatch epochs) is the one of ``ppo_multiagent.py`` / ``ppo_host.py``.

Two ways to pick the opponent (``--opponent``):

* ``pool`` (default): ``agent_0`` is the learner and ``agent_1`` an
  :class:`~jaxsampler.policies.OpponentPool` through the policy mapping: each game it is
  the random legal player (probability ``--p-random``) or one of the last ``--pool-size``
  frozen snapshots of the learner (one is pushed every ``--snapshot-every`` iterations).
  pgx draws who moves first, so the learner trains in both seats; only its own moves
  are trained on.
* ``shared``: both agents map to one policy, trained on the moves of both sides. It
  drifts towards play that draws against itself and is no better against weak players.

Every ``--eval-every`` iterations the greedy policy plays ``--eval-games`` games as
``agent_0`` against a uniformly random legal player (pgx picks who moves first at random);
the win / draw / loss rates are reported for the games it moved first and second.

    python -m examples.selfplay_pgx [--env pgx:connect_four] [--seeds 0 1 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxsampler as js
from benchmarks import harness
from examples import ppo, ppo_host


def shared(agent_id: str, episode: Any = None, **kwargs: Any) -> str:
    """Both players map to the one self-play policy."""
    return "shared"


def learner_vs_pool(agent_id: str, episode: Any = None, **kwargs: Any) -> str:
    """``agent_0`` learns; ``agent_1`` plays the opponent pool."""
    return "learner" if agent_id == "agent_0" else "opponent"


def padded_batch(sb: Any, size: int) -> dict[str, Any]:
    """``ppo_host.padded_batch`` for masked (dict) observations: each observation leaf is
    padded on its own, the other columns as there."""
    n = sb.count
    if n > size:
        raise ValueError(f"{n} agent steps do not fit the padded batch of {size} rows")

    class _Plain:
        count = n

        def __getitem__(self, k: str) -> np.ndarray:
            return np.zeros(n, np.float32) if k in ("obs", "new_obs") else sb[k]

    batch = ppo_host.padded_batch(_Plain(), size)

    def pad(x: np.ndarray) -> np.ndarray:
        return np.concatenate([x, np.zeros((size - n,) + x.shape[1:], x.dtype)])

    batch["obs"] = jax.tree.map(pad, sb["obs"])
    batch["new_obs"] = jax.tree.map(pad, sb["new_obs"])
    return batch


def make_evaluate(env: js.Env, mlp: js.MLPPolicy, num_games: int, steps: int = 9):
    """``evaluate(params, key) -> (first_mover int32[G], reward0 float32[G])``: ``num_games``
    games of the greedy policy (``agent_0``) against a uniformly random legal player
    (``agent_1``), driven through the adapter's own ``reset``/``step`` for ``steps`` moves
    (the longest game: 9 in tic-tac-toe). Jitted."""

    def one_game(params: Any, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        key, k0 = jax.random.split(key)
        state, ts = env.reset(k0)
        first = jnp.argmax(ts.acting).astype(jnp.int32)

        def move(carry, k):
            state, ts, total = carry
            k_rand, k_step = jax.random.split(k)
            obs = ts.obs
            logits, _, _ = mlp.forward(params, jax.tree.map(lambda x: x[0], obs))
            greedy = jnp.argmax(logits).astype(jnp.int32)
            legal = obs["action_mask"][1]
            rand = jax.random.categorical(k_rand, jnp.where(legal, 0.0, -jnp.inf))
            action = jnp.stack([greedy, rand.astype(jnp.int32)])
            done = jnp.all(ts.terminated | ts.truncated)
            state2, ts2 = env.step(k_step, state, action)
            keep = lambda a, b: jax.tree.map(lambda x, y: jnp.where(done, x, y), a, b)
            total = total + jnp.where(done, 0.0, ts2.reward[0])
            return (keep(state, state2), keep(ts, ts2), total), None

        (_, _, total), _ = jax.lax.scan(
            move, (state, ts, jnp.zeros((), jnp.float32)), jax.random.split(key, steps)
        )
        return first, total

    @jax.jit
    def evaluate(params: Any, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        return jax.vmap(one_game, in_axes=(None, 0))(params, jax.random.split(key, num_games))

    return evaluate


def rates(first: np.ndarray, reward0: np.ndarray) -> dict[str, dict[str, float]]:
    """Win / draw / loss rates of ``agent_0``: overall, moving first, moving second."""
    out = {}
    for name, sel in (
        ("overall", np.ones_like(first, bool)),
        ("first", first == 0),
        ("second", first == 1),
    ):
        r = reward0[sel]
        out[name] = {
            "games": int(sel.sum()),
            "win": float(np.mean(r > 0)),
            "draw": float(np.mean(r == 0)),
            "loss": float(np.mean(r < 0)),
        }
    return out


#: The games this example plays: the most moves a game lasts (the evaluation's scan length).
MAX_MOVES = {"pgx:tic_tac_toe": 9, "pgx:connect_four": 42}


def train(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """One training run of ``args.env`` with ``seed``: the run's results (see :func:`main`)."""
    env = js.make(args.env)
    cfg = dataclasses.replace(
        ppo.DEFAULTS["CartPole-v1"],
        env_id=args.env,
        num_envs=args.num_envs,
        rollout_length=args.rollout_length,
        total_timesteps=args.total_timesteps,
        lr=1e-3,
        ent_coef=0.01,
        gamma=0.99,
        hidden_sizes=(128, 128),
        activation="relu",
    )
    mlp = js.MLPPolicy(env.observation_space, env.action_space, cfg.hidden_sizes, cfg.activation)
    if args.opponent == "pool":
        pool = js.policies.OpponentPool(mlp, size=args.pool_size, p_random=args.p_random)
        policy = js.policies.MultiAgentPolicy(
            env, {"learner": mlp, "opponent": pool}, learner_vs_pool
        )
        trained = "learner"
    else:
        policy = js.policies.MultiAgentPolicy(env, {"shared": mlp}, shared)
        trained = "shared"
    sampler = js.Sampler(
        env, policy, num_envs=cfg.num_envs, rollout_length=cfg.rollout_length, seed=seed
    )
    params = policy.init(jax.random.PRNGKey(seed))
    if args.opponent == "pool":  # the pool starts with the learner's initial params
        params["opponent"] = pool.seeded(params["learner"])
        push = jax.jit(pool.push)
    tx, update, _ = ppo_host.make_learner(cfg, mlp)
    opt_state = tx.init(params[trained])
    evaluate = make_evaluate(env, mlp, args.eval_games, MAX_MOVES[args.env])
    # One mover per env step, plus the moves a call completes from the previous one.
    size = cfg.num_envs * (cfg.rollout_length + 1)
    key = jax.random.PRNGKey(seed + 1)
    eval_key = jax.random.PRNGKey(seed + 2)

    def evaluate_now(steps: int) -> dict[str, Any]:
        first, r0 = jax.device_get(evaluate(params[trained], eval_key))
        return {"env_steps": steps, **rates(np.asarray(first), np.asarray(r0))}

    curve = [evaluate_now(0)]
    steps, it, t0 = 0, 0, time.perf_counter()
    while steps < cfg.total_timesteps:
        mab = sampler.sample_batch(params)
        key, k = jax.random.split(key)
        batch = padded_batch(mab[trained], size)
        params[trained], opt_state = update(params[trained], opt_state, batch, k)
        steps += mab.env_steps()
        it += 1
        if args.opponent == "pool" and it % args.snapshot_every == 0:
            params["opponent"] = push(params["opponent"], params[trained])
        if it % args.eval_every == 0 or steps >= cfg.total_timesteps:
            curve.append(evaluate_now(steps))
            o = curve[-1]["overall"]
            print(
                f"seed {seed} {steps:>9,} moves  {time.perf_counter() - t0:6.1f} s  vs random: "
                f"win {o['win']:.3f} draw {o['draw']:.3f} loss {o['loss']:.3f}",
                flush=True,
            )
    wall = time.perf_counter() - t0
    for side in ("overall", "first", "second"):
        r = curve[-1][side]
        print(
            f"seed {seed} {side:>7} ({r['games']} games): win {r['win']:.3f}  "
            f"draw {r['draw']:.3f}  loss {r['loss']:.3f}"
        )
    print(f"seed {seed}: {steps:,} moves in {wall:.1f} s ({steps / wall:,.0f} moves/s)")
    config = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "sampler"}
    return {"seed": seed, "config": config, "env_steps": steps, "wall_s": wall, "curve": curve}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", choices=sorted(MAX_MOVES), default="pgx:tic_tac_toe")
    p.add_argument("--total-timesteps", type=int, default=3_000_000, help="env steps (moves)")
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--rollout-length", type=int, default=32)
    p.add_argument("--eval-every", type=int, default=100, help="iterations between evals")
    p.add_argument("--eval-games", type=int, default=2000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--opponent", choices=("pool", "shared"), default="pool")
    p.add_argument("--pool-size", type=int, default=8, help="snapshot slots (pool)")
    p.add_argument("--p-random", type=float, default=0.5, help="random player's share (pool)")
    p.add_argument("--snapshot-every", type=int, default=20, help="iterations (pool)")
    p.add_argument("--json", type=Path, default=None, help="also writes .md and .png next to it")
    p.add_argument("--quick", action="store_true", help="a tiny run (smoke test)")
    args = p.parse_args(argv)
    if args.quick:
        args.total_timesteps, args.num_envs, args.rollout_length = 2_000, 8, 16
        args.eval_every, args.eval_games = 4, 64
    runs = [train(args, seed) for seed in args.seeds]
    if args.json:
        pool = {"size": args.pool_size, "p_random": args.p_random}
        pool["snapshot_every"] = args.snapshot_every
        first = runs[0]
        ppo.write_json(
            args.json,
            {
                "env": args.env,
                "config": first["config"],
                "opponent": args.opponent,
                "pool": pool if args.opponent == "pool" else None,
                "eval_games": args.eval_games,
                "eval_every": args.eval_every,
                "measured_at": harness.measured_at(),
                # The first seed's run (its curve is the plot's); every seed's in "runs".
                "seed": first["seed"],
                "env_steps": first["env_steps"],
                "wall_s": first["wall_s"],
                "final": first["curve"][-1],
                "curve": first["curve"],
                "runs": [
                    {k: r[k] for k in ("seed", "env_steps", "wall_s")} | {"final": r["curve"][-1]}
                    for r in runs
                ],
            },
        )
        write_report(args.json, json.loads(args.json.read_text()))
    return 0


def _opponent(res: dict[str, Any]) -> str:
    """How the run picked the learner's opponent, in words."""
    pool = res.get("pool")
    if res.get("opponent", "shared") == "shared" or not pool:
        return "one shared policy plays both sides"
    return (
        f"agent_0 learns against an opponent pool: the random legal player with probability "
        f"{pool['p_random']}, else one of the last {pool['size']} snapshots of the learner, "
        f"one pushed every {pool['snapshot_every']} iterations"
    )


def write_report(path: Path, res: dict[str, Any]) -> None:
    """``<path>.md`` (each seed's final rates, the first seed's curve as a table) and
    ``<path>.png`` (the first seed's win and loss rates vs training moves) next to the JSON
    results."""
    game = res["env"].split(":")[-1].replace("_", "-")
    runs = res.get("runs") or [{k: res[k] for k in ("seed", "env_steps", "wall_s", "final")}]
    lines = [
        f"# Self-play PPO on pgx {game} vs a uniformly random legal player",
        "",
        f"{res['env_steps']:,} training moves per seed (env steps, both sides; "
        f"{_opponent(res)}), on a shared 2-core CPU; greedy policy, {res['eval_games']} "
        "evaluation games per seed (pgx draws who moves first).",
        "",
        "| seed | moved | games | win | draw | loss | train wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        for side in ("overall", "first", "second"):
            r = run["final"][side]
            lines.append(
                f"| {run['seed']} | {side} | {r['games']} | {r['win']:.3f} | {r['draw']:.3f} "
                f"| {r['loss']:.3f} | {run['wall_s']:.0f} |"
            )
    cfg = res["config"]
    lines += [
        "",
        f"Seed {res['seed']}, evaluated every {res.get('eval_every', 100)} iterations "
        f"({cfg['num_envs']} envs x {cfg['rollout_length']} steps each):",
        "",
        "| training moves | win | draw | loss |",
        "|---|---|---|---|",
    ]
    for c in res["curve"]:
        o = c["overall"]
        lines.append(f"| {c['env_steps']:,} | {o['win']:.3f} | {o['draw']:.3f} | {o['loss']:.3f} |")
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    try:
        plt = ppo.pyplot()
    except ImportError:
        return
    from matplotlib.ticker import FuncFormatter

    x = [c["env_steps"] for c in res["curve"]]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for side, style in (("overall", "-"), ("first", "--"), ("second", ":")):
        ax.plot(x, [c[side]["win"] for c in res["curve"]], style, label=f"win rate ({side})")
    ax.plot(x, [c["overall"]["loss"] for c in res["curve"]], "-", label="loss rate (overall)")
    ax.set_xlabel("training moves (env steps, both sides)")
    ax.set_ylabel("rate vs random legal player")
    ax.set_ylim(0, 1)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    how = "opponent pool" if res.get("opponent") == "pool" else "shared self-play"
    ax.set_title(
        f"Self-play PPO ({how}), pgx {game}, seed {res['seed']}: greedy policy vs random "
        "(2-core CPU)",
        fontsize=8,
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
