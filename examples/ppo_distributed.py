"""PPO over many processes (``jax.distributed``): one global batch, gradients all-reduced.

Every process runs this same file. After :func:`jaxsampler.rollout.distributed.initialize` the mesh
:func:`jaxsampler.rollout.placement.env_mesh` spans every process's devices, and the rollout
(``js.make_rollout(..., mesh=mesh)``) steps the global env axis split over them: each
process steps its own contiguous slice of envs on its own devices.

The PPO update (GAE, ``update_epochs`` x ``num_minibatches`` Adam steps; the loss and the
optimizer of ``examples/ppo.py``) is one ``jax.jit`` over *global* arrays, with the
rollout inside it:

* the batch stays sharded over the env axis, where the rollout wrote it (no batch data
  moves between devices or processes);
* params, optimizer state and the PRNG key are replicated: every process holds the same
  copy;
* the loss is the mean over the whole global minibatch, so XLA (GSPMD) partitions it into
  per-device partial sums and inserts an **all-reduce** of the gradient (and of the
  minibatch's advantage mean and spread) across every device of every process. On CPU it
  runs over gloo. The compiled update's HLO is checked for it (``hlo_all_reduces`` in
  the output).

Minibatches are *stratified by env*: each epoch draws, from the replicated key, one
random permutation of the ``T`` time steps of every env (``argsort`` of
``uniform(key, (E, T))`` over time); minibatch ``m`` holds the permuted steps
``m*T/M .. (m+1)*T/M - 1`` of **every** env. Every process draws the same permutations
(same key, the global shape), each gathers only within its own envs, and the draw does not
depend on how many devices or processes there are: a run on 1 process x 2 devices computes
the same thing as one on 2 processes x 1 device, and a 1-device run the same up to float
rounding. (``examples/ppo.py`` shuffles all rows globally instead, which would move rows
between processes.)

Episode returns are counted per env inside the jit; each process reads its own envs'
(:func:`jaxsampler.rollout.placement.to_host`) and the global figures are their sum over
processes (:func:`jaxsampler.rollout.distributed.process_sum`).

    python -m jaxsampler.cli.launch -n 2 -m examples.ppo_distributed   # 2 local processes
    python -m examples.ppo_distributed                               # 1 process, unchanged
    python -m examples.ppo_distributed --quick                       # smoke test (tiny)

Without the launcher, start each process with ``JAXSAMPLER_COORDINATOR=127.0.0.1:PORT``,
``JAXSAMPLER_NUM_PROCESSES=n`` and ``JAXSAMPLER_PROCESS_ID=i`` set (and, on CPU, as many
devices per process as wanted with ``XLA_FLAGS=--xla_force_host_platform_device_count=k``).
``--report A.json B.json ...`` writes the side-by-side comparison of such runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxsampler as js
from examples import ppo
from jaxsampler.rollout import distributed, placement

RESULTS = ppo.RESULTS

#: examples/ppo.py's CartPole settings (PureJaxRL's) with a larger global batch: 32 envs
#: (divisible by 1, 2, 4, 8, 16 or 32 devices) x 128 steps, so the fixed cost of the
#: per-minibatch all-reduces is spread over more env steps; learning rate 5e-4 (2.5e-4
#: learns too slowly with 4x fewer updates); 1M env steps (244 updates).
CONFIG = dataclasses.replace(
    ppo.DEFAULTS["CartPole-v1"], num_envs=32, lr=5e-4, total_timesteps=1_000_000
)
#: ``--quick``: a few tiny updates.
QUICK = dataclasses.replace(
    CONFIG,
    num_envs=4,
    rollout_length=16,
    total_timesteps=4 * 16 * 3,
    update_epochs=2,
    num_minibatches=2,
    hidden_sizes=(16, 16),
)
#: Returns whose first crossing (10-update moving average) is reported, in env steps.
THRESHOLDS = (450.0, 475.0)


@flax.struct.dataclass
class Carry:
    """What one update hands the next (all global arrays)."""

    params: Any  # replicated
    opt_state: Any  # replicated
    state: js.RolloutState  # env axis split over the mesh
    running: jax.Array  # float32[E]: return so far of each env's current episode (split)
    key: jax.Array  # replicated


@flax.struct.dataclass
class Stats:
    """One update's episode figures: per env (split like the envs) and global totals
    (computed by the jit as reductions over the global env axis: replicated)."""

    return_sum: jax.Array  # float32[E]: sum of the returns of episodes that ended, per env
    episodes: jax.Array  # int32[E]: episodes that ended, per env
    total_return_sum: jax.Array  # float32[]
    total_episodes: jax.Array  # int32[]


@dataclasses.dataclass(frozen=True)
class Trainer:
    """The pieces of one distributed PPO run, built by :func:`make_trainer`.

    Attributes:
        cfg: the PPO config (``num_envs`` global).
        mesh: the mesh the env axis is split over.
        policy: the MLP actor-critic.
        init: ``key -> Carry`` (jitted; every process calls it with the same key).
        update: ``Carry -> (Carry, Stats, Trajectory)``: one rollout and one PPO update
            (jitted; every process calls it in lockstep). The trajectory is the rollout's,
            env axis split over the mesh.
    """

    cfg: Any
    mesh: Mesh
    policy: js.MLPPolicy
    init: Callable[[jax.Array], Carry]
    update: Callable[[Carry], tuple[Carry, Stats, js.Trajectory]]


def check_config(cfg: Any, mesh: Mesh) -> None:
    """Raises ``ValueError`` naming the problem if ``cfg`` cannot run on ``mesh``."""
    placement.check_divisible(cfg.num_envs, mesh)
    if cfg.rollout_length % cfg.num_minibatches:
        raise ValueError(
            f"rollout_length={cfg.rollout_length} is not divisible by num_minibatches="
            f"{cfg.num_minibatches}: each minibatch takes rollout_length / num_minibatches "
            "steps of every env"
        )


def episode_stats(
    running: jax.Array, rewards: jax.Array, done: jax.Array, mask: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-env returns of the episodes that end in one rollout.

    Args:
        running: float32[E], each env's return so far.
        rewards, done, mask: ``[T, E, A]`` (``done``: terminated or truncated).

    Returns:
        ``(running, return_sum[E], episodes[E])``. Jittable.
    """

    def step(run: jax.Array, x: tuple[jax.Array, ...]) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        r, d, m = x
        run = run + (r * m).sum(-1)
        end = d.any(-1)
        return jnp.where(end, 0.0, run), (jnp.where(end, run, 0.0), end)

    running, (rets, ends) = jax.lax.scan(step, running, (rewards, done, mask))
    return running, rets.sum(0), ends.sum(0).astype(jnp.int32)


def stratified_minibatches(batch: dict, key: jax.Array, num_minibatches: int) -> dict:
    """``[T, E, ...]`` leaves -> ``[M, E * T/M * ..., ...]`` rows: minibatch ``m`` holds the
    steps ``perm_e[m*T/M:(m+1)*T/M]`` of every env ``e``, ``perm_e`` a random permutation of
    ``0..T-1`` per env drawn from ``key`` (the same draw on any device count). Rows are
    env-major, so a split env axis stays split (each device gathers within its envs)."""
    T, E = batch["mask"].shape[:2]
    perm = jnp.argsort(jax.random.uniform(key, (E, T)), axis=1)  # [E, T]

    def leaf(x: jax.Array) -> jax.Array:
        xe = jnp.moveaxis(x, 1, 0)  # [E, T, ...]
        idx = perm.reshape(perm.shape + (1,) * (xe.ndim - 2))
        xe = jnp.take_along_axis(xe, idx, axis=1)
        xe = xe.reshape((E, num_minibatches, T // num_minibatches) + xe.shape[2:])
        xe = jnp.moveaxis(xe, 1, 0)  # [M, E, T/M, ...]
        # rows: [M, E*T/M*A, ...] (the agent axis folded in too, as examples/ppo.py does)
        return xe.reshape((num_minibatches, -1) + x.shape[3:])

    return jax.tree.map(leaf, batch)


def make_trainer(cfg: Any, mesh: Mesh) -> Trainer:
    """Builds the jitted ``init`` and ``update`` of distributed PPO on ``mesh``.

    Raises:
        ValueError: ``cfg.num_envs`` not divisible by the mesh's device count (the nearest
            valid counts named) or ``rollout_length`` not divisible by ``num_minibatches``.
    """
    check_config(cfg, mesh)
    env = cast(js.Env, js.make(cfg.env_id))  # a device env (the registry also makes host ones)
    policy = js.MLPPolicy(env.observation_space, env.action_space, cfg.hidden_sizes, cfg.activation)
    rollout = js.make_rollout(env, policy, cfg.num_envs, cfg.rollout_length, mesh=mesh)
    tx = ppo.make_optimizer(cfg)
    loss_fn = ppo.make_loss(cfg, policy)
    replicated = NamedSharding(mesh, P())
    split = NamedSharding(mesh, P(placement.AXIS))
    # minibatch rows [M, rows, ...]: the row axis (env-major) split over the mesh
    rows = NamedSharding(mesh, P(None, placement.AXIS))

    def rep(tree: Any) -> Any:
        return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, replicated), tree)

    @jax.jit
    def init_rest(key: jax.Array) -> tuple[Any, Any, jax.Array, jax.Array]:
        k_init, k_loop = jax.random.split(key)
        params = policy.init(k_init)
        return (
            rep(params),
            rep(tx.init(params)),
            jax.lax.with_sharding_constraint(jnp.zeros((cfg.num_envs,), jnp.float32), split),
            rep(k_loop),
        )

    def init(key: jax.Array) -> Carry:
        k_rest, k_sampler = jax.random.split(key)
        params, opt_state, running, k_loop = init_rest(k_rest)
        return Carry(params, opt_state, rollout.init(k_sampler), running, k_loop)

    def epochs(params: Any, opt_state: Any, batch: dict, key: jax.Array) -> tuple[Any, Any]:
        def epoch(c: tuple[Any, Any], k: jax.Array) -> tuple[tuple[Any, Any], None]:
            mbs = jax.lax.with_sharding_constraint(
                stratified_minibatches(batch, k, cfg.num_minibatches),
                jax.tree.map(lambda _: rows, batch),
            )

            def minibatch(c: tuple[Any, Any], mb: dict) -> tuple[tuple[Any, Any], None]:
                params, opt_state = c
                # grad of the global mean: partial sums per device + an all-reduce
                grads = jax.grad(loss_fn)(params, mb)
                updates, opt_state = tx.update(grads, opt_state, params)
                return (rep(optax.apply_updates(params, updates)), rep(opt_state)), None

            return jax.lax.scan(minibatch, c, mbs)[0], None

        keys = jax.random.split(key, cfg.update_epochs)
        out: tuple[Any, Any] = jax.lax.scan(epoch, (params, opt_state), keys)[0]
        return out

    @jax.jit
    def update(c: Carry) -> tuple[Carry, Stats, js.Trajectory]:
        state, traj = rollout(c.params, c.state)
        batch = ppo.ppo_batch(cfg, policy, c.params, traj, state)
        done = traj.terminated | traj.truncated
        running, ret_sum, eps = episode_stats(c.running, traj.rewards, done, traj.acting)
        key, k_epochs = jax.random.split(c.key)
        params, opt_state = epochs(c.params, c.opt_state, batch, k_epochs)
        stats = Stats(
            jax.lax.with_sharding_constraint(ret_sum, split),
            jax.lax.with_sharding_constraint(eps, split),
            rep(ret_sum.sum()),
            rep(eps.sum()),
        )
        running = jax.lax.with_sharding_constraint(running, split)
        return Carry(params, opt_state, state, running, rep(key)), stats, traj

    return Trainer(cfg, mesh, policy, init, update)


def flat_params(params: Any) -> np.ndarray:
    """This process's copy of the (replicated) params as one float32 vector."""
    leaves = jax.tree.leaves(placement.to_host(params))
    return np.concatenate([np.asarray(x, np.float32).reshape(-1) for x in leaves])


def check_replicas(params: Any) -> None:
    """Raises ``RuntimeError`` unless every process holds bit-identical params (one
    ``process_allgather`` of the flattened params)."""
    every = distributed.process_allgather(flat_params(params))  # [processes, n]
    differ = [i for i in range(len(every)) if not np.array_equal(every[i], every[0])]
    if differ:
        raise RuntimeError(f"the params of processes {differ} differ from process 0's")


def count_all_reduces(trainer: Trainer, carry: Carry) -> int:
    """How many all-reduce ops the compiled update holds (0 on one device)."""
    hlo = trainer.update.lower(carry).compile().as_text()  # type: ignore[attr-defined]
    return hlo.count(" all-reduce(") + hlo.count(" all-reduce-start(")


def train(
    cfg: Any,
    mesh: Mesh,
    seed: int = 0,
    on_update: Callable[[int, Carry, Stats, js.Trajectory], None] | None = None,
    verify_replicas: bool = False,
    log: Callable[[str], None] | None = None,
    logger: js.integrations.loggers.Logger | None = None,
    bar: js.integrations.progress.Bar | None = None,
) -> dict[str, Any]:
    """Trains ``cfg.num_updates`` updates on ``mesh``; every process calls it in lockstep.

    Args:
        on_update: called after each update with ``(i, carry, stats, traj)`` (global
            arrays).
        verify_replicas: after each update, check that every process holds the same
            params (:func:`check_replicas`).
        log: where progress lines go (``None``: nowhere).
        logger: gets each update's global figures at step = global env steps so far
            (``train/episode_return_mean`` where episodes ended, ``train/episodes``,
            ``train/env_steps_per_s`` of the update); give it on one process only.
        bar: a progress bar advanced by each update's global env steps.

    Returns:
        The run's figures (the same on every process): per-update global return sums and
        episode counts, the learning curve, the final return, timings.
    """
    trainer = make_trainer(cfg, mesh)
    t0 = time.perf_counter()
    carry = trainer.init(jax.random.PRNGKey(seed))
    all_reduces = count_all_reduces(trainer, carry)
    jax.block_until_ready(trainer.update(carry))  # compile (the result is discarded)
    compile_s = time.perf_counter() - t0
    n = cfg.num_updates
    local_sums = np.zeros((n, 2), np.float64)  # this process's [return sum, episodes]
    per_update = cfg.num_envs * cfg.rollout_length
    t0 = t_prev = time.perf_counter()
    for i in range(n):
        carry, stats, traj = trainer.update(carry)
        if on_update is not None:
            on_update(i, carry, stats, traj)
        if verify_replicas:
            check_replicas(carry.params)
        mine = placement.to_host((stats.return_sum, stats.episodes))  # this process's envs
        local_sums[i] = mine[0].sum(), mine[1].sum()
        if logger is not None or bar is not None:
            # the global figures (replicated: every process holds them)
            g_ret, g_eps = placement.to_host((stats.total_return_sum, stats.total_episodes))
            t_now = time.perf_counter()
            scalars = {
                "train/episodes": g_eps,
                "train/env_steps_per_s": per_update / (t_now - t_prev),
            }
            if g_eps > 0:
                scalars["train/episode_return_mean"] = g_ret / g_eps
            t_prev = t_now
            if logger is not None:
                logger.log(scalars, step=(i + 1) * per_update)
            if bar is not None:
                bar.update(per_update, ret=scalars.get("train/episode_return_mean", np.nan))
        if log is not None and (i + 1) % max(1, n // 10) == 0:
            done = local_sums[max(0, i - n // 20) : i + 1]
            mean = f"{done[:, 0].sum() / done[:, 1].sum():.1f}" if done[:, 1].sum() else "-"
            log(f"update {i + 1}/{n}: mean return of this process's recent episodes {mean}")
    jax.block_until_ready(carry)
    wall_s = time.perf_counter() - t0
    totals = distributed.process_sum(local_sums)  # [n, 2], every process's envs
    ret_sum, eps = totals[:, 0], totals[:, 1]
    tail = max(1, n // 20)
    curve = np.where(eps > 0, ret_sum / np.maximum(eps, 1), np.nan)
    steps = n * per_update
    return {
        "config": dataclasses.asdict(cfg),
        "seed": seed,
        "processes": jax.process_count(),
        "devices": int(mesh.devices.size),
        "devices_per_process": int(mesh.devices.size) // jax.process_count(),  # in the mesh
        "local_envs": cfg.num_envs // jax.process_count(),
        "env_steps": steps,
        "env_steps_per_update": per_update,
        "hlo_all_reduces": all_reduces,
        "compile_s": compile_s,
        "wall_s": wall_s,
        "env_steps_per_s": steps / wall_s,
        "final_mean_return": float(ret_sum[-tail:].sum() / max(eps[-tail:].sum(), 1)),
        "steps_to_threshold": {str(t): ppo.steps_to(curve, t, per_update) for t in THRESHOLDS},
        "episodes_per_update": eps.astype(int).tolist(),
        "learning_curve": [None if np.isnan(v) else float(v) for v in curve],
    }


# ----------------------------------------------------------------------------- report


def run_name(res: dict[str, Any]) -> str:
    p, d = res["processes"], res["devices_per_process"]
    return f"{p} process{'es' if p > 1 else ''} x {d} device{'s' if d > 1 else ''}"


def group(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Runs by placement (:func:`run_name`), each placement's runs by seed."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        out.setdefault(run_name(r), []).append(r)
    return {k: sorted(v, key=lambda r: r["seed"]) for k, v in out.items()}


def same_computation(groups: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """For each pair of placements with the same device count and seed: the largest
    difference of their learning curves and whether their episode counts agree."""
    names = list(groups)
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            for ra in groups[a]:
                for rb in groups[b]:
                    if ra["seed"] != rb["seed"] or ra["devices"] != rb["devices"]:
                        continue
                    ca = np.asarray(ra["learning_curve"], dtype=float)
                    cb = np.asarray(rb["learning_curve"], dtype=float)
                    out.append(
                        {
                            "placements": [a, b],
                            "seed": ra["seed"],
                            "max_abs_curve_difference": float(np.nanmax(np.abs(ca - cb))),
                            "episode_counts_equal": ra["episodes_per_update"]
                            == rb["episodes_per_update"],
                        }
                    )
    return out


def markdown(runs: list[dict[str, Any]], note: str) -> str:
    groups = group(runs)
    cfg = runs[0]["config"]
    when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    lines = [
        "# Distributed PPO (examples/ppo_distributed.py)",
        "",
        f"{when} · {cfg['env_id']}, {runs[0]['env_steps']:,} env steps per run · "
        f"jax {jax.__version__}, 2-core CPU (shared), gloo collectives · {note}",
        "",
        f"The same global computation on different placements: {cfg['num_envs']} envs x "
        f"{cfg['rollout_length']} steps per update, {cfg['update_epochs']} epochs x "
        f"{cfg['num_minibatches']} minibatches (stratified by env), lr {cfg['lr']} "
        f"(annealed), MLP {tuple(cfg['hidden_sizes'])} {cfg['activation']}. Params and "
        "optimizer state replicated, the batch split over the env axis; the gradient "
        "all-reduce is inserted by XLA (`all-reduce ops in HLO`: collective ops in the "
        "compiled update, 3 of them run once per minibatch).",
        "",
        "| placement | local envs | seeds | final return per seed | steps to 450 per seed | "
        "steps to 475 per seed | all-reduce ops in HLO | train wall s (median) | "
        "env steps/s (median) | compile s (median) |",
        "|---|---:|---|---|---|---|---:|---:|---:|---:|",
    ]
    fmt = lambda s: "never" if s is None else f"{s:,}"
    for name, rs in groups.items():
        lines.append(
            f"| {name} | {rs[0]['local_envs']} | {', '.join(str(r['seed']) for r in rs)} | "
            + ", ".join(f"{r['final_mean_return']:.1f}" for r in rs)
            + " | "
            + ", ".join(fmt(r["steps_to_threshold"]["450.0"]) for r in rs)
            + " | "
            + ", ".join(fmt(r["steps_to_threshold"]["475.0"]) for r in rs)
            + f" | {rs[0]['hlo_all_reduces']} | {np.median([r['wall_s'] for r in rs]):.1f} | "
            f"{np.median([r['env_steps_per_s'] for r in rs]):,.0f} | "
            f"{np.median([r['compile_s'] for r in rs]):.1f} |"
        )
    lines += [
        "",
        "Final return = mean return of the episodes completed in the last 5% of updates, "
        "over all processes' envs. Steps to a threshold = env steps until the 10-update "
        "moving average of the global training return first reaches it. Curves: "
        "`ppo_distributed.png` (10-update moving averages).",
    ]
    same = same_computation(groups)
    if same:
        lines += ["", "Same device count, same seed (the same global computation):", ""]
        for s in same:
            lines.append(
                f"- {s['placements'][0]} vs {s['placements'][1]}, seed {s['seed']}: learning "
                f"curves differ by at most {s['max_abs_curve_difference']:.2g}, episode "
                f"counts {'identical' if s['episode_counts_equal'] else 'differ'} in every "
                "update."
            )
    return "\n".join(lines) + "\n"


def moving_average(curve: np.ndarray, n: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """``(indices, averages)``: the mean of the last ``n`` finite values at each finite
    value of ``curve``."""
    idx = np.flatnonzero(np.isfinite(curve))
    vals = curve[idx]
    avg = np.array([vals[max(0, i - n + 1) : i + 1].mean() for i in range(len(vals))])
    return idx, avg


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    plt = ppo.pyplot()

    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    styles = [("tab:blue", "-"), ("tab:red", "--"), ("tab:green", ":"), ("tab:purple", "-.")]
    for (name, rs), (color, ls) in zip(group(runs).items(), styles, strict=False):
        for j, r in enumerate(rs):
            idx, avg = moving_average(np.asarray(r["learning_curve"], dtype=float))
            x = (idx + 1) * r["env_steps_per_update"]
            seeds = ", ".join(str(q["seed"]) for q in rs)
            label = f"{name} (seed{'s' if len(rs) > 1 else ''} {seeds})" if j == 0 else None
            lw = 2.0 if ls == ":" else 1.1  # dotted on top of an identical curve stays visible
            ax.plot(x, avg, ls, color=color, lw=lw, alpha=0.85, label=label)
    ax.axhline(450, color="grey", lw=0.8, alpha=0.6)
    ax.set_xlabel("env steps (global, all processes)")
    ax.set_ylabel("training episode return (10-update moving average)")
    cfg = runs[0]["config"]
    ax.set_title(
        f"Distributed PPO on {cfg['env_id']}, {cfg['num_envs']} global envs: the same run on "
        "processes or devices\njaxsampler rollout on a jax.distributed mesh, 2-core CPU",
        fontsize=10,
    )
    ppo.save_curves(fig, ax, path)


def report(paths: list[Path], out_dir: Path, note: str) -> None:
    """Writes ``ppo_distributed.{json,md,png}`` in ``out_dir`` from run JSONs (any number
    of placements and seeds)."""
    runs = [json.loads(p.read_text()) for p in paths]
    out_dir.mkdir(parents=True, exist_ok=True)
    groups = group(runs)
    ppo.write_json(
        out_dir / "ppo_distributed.json",
        {"note": note, "runs": groups, "same_computation": same_computation(groups)},
    )
    (out_dir / "ppo_distributed.md").write_text(markdown(runs, note))
    plot(runs, out_dir / "ppo_distributed.png")


# ----------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="CartPole-v1", choices=sorted(ppo.DEFAULTS))
    p.add_argument("--num-envs", type=int, default=None, help="global env count")
    p.add_argument("--iterations", type=int, default=None, help="PPO updates")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a few tiny updates (smoke test)")
    p.add_argument(
        "--check-replicas",
        action="store_true",
        help="after each update, check that every process holds the same params",
    )
    p.add_argument("--out", type=Path, default=None, help="write the run as JSON here")
    p.add_argument(
        "--report",
        type=Path,
        nargs="+",
        default=None,
        metavar="RUN_JSON",
        help="write benchmarks/results/ppo_distributed.{json,md,png} from runs",
    )
    p.add_argument("--note", default="", help="measurement conditions for --report")
    js.integrations.loggers.add_arguments(p)  # --log-dir, --logger, --quiet (process 0 logs)
    args = p.parse_args(argv)
    if args.report:
        report(args.report, RESULTS, args.note)
        return 0
    distributed.initialize()  # no-op without the JAXSAMPLER_* variables: one process
    if args.quick:
        cfg = QUICK
    elif args.env == "CartPole-v1":
        cfg = CONFIG
    else:
        cfg = dataclasses.replace(ppo.DEFAULTS[args.env], num_envs=32)
    if args.num_envs is not None:
        cfg = dataclasses.replace(cfg, num_envs=args.num_envs)
    if args.iterations is not None:
        if args.iterations < 1:
            p.error(f"--iterations must be >= 1, got {args.iterations}")
        cfg = dataclasses.replace(
            cfg, total_timesteps=args.iterations * cfg.num_envs * cfg.rollout_length
        )
    mesh = placement.env_mesh()
    lead = jax.process_index() == 0
    try:
        check_config(cfg, mesh)
    except ValueError as e:
        p.error(str(e))
    # process 0 logs the global figures and draws the bar
    logger = (
        js.integrations.loggers.from_arguments(args)
        if lead
        else js.integrations.loggers.NullLogger()
    )
    bar = js.integrations.progress.Bar(
        cfg.num_updates * cfg.num_envs * cfg.rollout_length,
        desc="ppo_distributed",
        quiet=args.quiet if lead else True,
    )

    def log(line: str) -> None:
        if bar.quiet:
            print(line, flush=True)
        else:
            bar.write(line)

    with logger, bar:
        res = train(
            cfg,
            mesh,
            args.seed,
            verify_replicas=args.check_replicas,
            log=log if lead else None,
            logger=logger,
            bar=bar,
        )
        logger.log(
            {"compile_s": res["compile_s"], "env_steps_per_s": res["env_steps_per_s"]},
            step=res["env_steps"],
        )
    if lead:
        print(
            f"{cfg.env_id} on {run_name(res)} ({cfg.num_envs} global envs, {res['local_envs']} "
            f"per process): {res['env_steps']:,} steps, compile {res['compile_s']:.1f} s, train "
            f"{res['wall_s']:.1f} s ({res['env_steps_per_s']:,.0f} env steps/s), "
            f"{res['hlo_all_reduces']} all-reduce ops in the update; final mean return "
            f"{res['final_mean_return']:.1f}",
            flush=True,
        )
        if args.out:
            ppo.write_json(args.out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
