"""What the off-policy examples (:mod:`examples.dqn`, :mod:`examples.sac`) share: episode
returns counted inside the jit, progress lines printed from inside it, training several
seeds with one compiled function, greedy evaluation and the result files.

Nothing here is specific to an algorithm; the examples own their losses and networks.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

import jaxsampler as js
from benchmarks import harness

__all__ = [
    "IterationSizes",
    "LogWindow",
    "episode_returns",
    "curve",
    "log_window",
    "report_every",
    "advance",
    "learn_if",
    "scan_train",
    "train_seeds",
    "evaluate",
    "record",
    "machine",
]


class IterationSizes:
    """The iteration arithmetic of an example's config (``num_envs``, ``rollout_length``,
    ``total_timesteps`` fields): a base of its frozen dataclass."""

    num_envs: int
    rollout_length: int
    total_timesteps: int

    @property
    def steps_per_iteration(self) -> int:
        return self.num_envs * self.rollout_length

    @property
    def num_iterations(self) -> int:
        return max(1, self.total_timesteps // self.steps_per_iteration)


def scan_train(iteration: Callable, init: Callable, num_iterations: int) -> Callable:
    """``train(key) -> (final state, metrics [num_iterations])``: ``num_iterations`` steps
    of ``iteration(state, i) -> (state, metrics)`` from ``init(key)`` in one ``lax.scan``;
    pure, jit it."""

    def train(key):
        return jax.lax.scan(iteration, init(key), jnp.arange(num_iterations))

    return train


@struct.dataclass
class LogWindow:
    """Sums over the iterations since the last progress line (``float32[]`` each)."""

    return_sum: jax.Array
    episodes: jax.Array
    loss_sum: jax.Array
    updates: jax.Array


def log_window() -> LogWindow:
    """An empty :class:`LogWindow`."""
    z = jnp.zeros((), jnp.float32)
    return LogWindow(z, z, z, z)


def episode_returns(
    traj: js.Trajectory, running: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Returns of the episodes a rollout call finished, for a single-agent env.

    Args:
        traj: the call's trajectory (``rewards`` ``float32[T, E, 1]``).
        running: ``float32[E]``, each env's return so far in its current episode.

    Returns:
        ``(running, return_sum, episodes)``: the updated running returns and the sum and
        count (``float32[]``) of the returns of the episodes that ended in this call.
        Pure; jit-safe.
    """

    def step(run, x):
        r, done = x
        run = run + r
        return jnp.where(done, 0.0, run), (jnp.where(done, run, 0.0), done)

    done = (traj.terminated | traj.truncated).any(-1)
    running, (rets, ends) = jax.lax.scan(step, running, (traj.rewards.sum(-1), done))
    return running, rets.sum(), ends.sum().astype(jnp.float32)


def report_every(
    every: int, iteration: jax.Array, env_steps: jax.Array, window: LogWindow
) -> LogWindow:
    """Prints a progress line from inside the jit every ``every`` iterations (env steps, the
    window's mean training return and loss) and starts a new window; otherwise returns
    ``window`` unchanged. ``every <= 0``: never prints."""
    if every <= 0:
        return window

    def show(it, steps, ret_sum, eps, loss_sum, updates):
        ret = f"{ret_sum / eps:8.1f}" if eps > 0 else "     n/a"
        loss = f"{loss_sum / updates:.4f}" if updates > 0 else "n/a"
        print(
            f"  iter {int(it) + 1:6d}  env steps {int(steps):9,d}  train return {ret}  loss {loss}",
            flush=True,
        )

    now = (iteration + 1) % every == 0

    def emit():
        jax.debug.callback(
            show,
            iteration,
            env_steps,
            window.return_sum,
            window.episodes,
            window.loss_sum,
            window.updates,
        )

    jax.lax.cond(now, emit, lambda: None)
    return jax.tree.map(lambda x: jnp.where(now, jnp.zeros_like(x), x), window)


def advance(
    window: LogWindow,
    every: int,
    iteration: jax.Array,
    env_steps: jax.Array,
    return_sum: jax.Array,
    episodes: jax.Array,
    loss: jax.Array,
    learnt: jax.Array,
) -> LogWindow:
    """``window`` with one iteration's figures added (its episodes' ``return_sum`` and count,
    its mean ``loss`` where it ``learnt``), then :func:`report_every`."""
    w = window
    n_up = jnp.where(learnt, 1.0, 0.0)
    w = LogWindow(w.return_sum + return_sum, w.episodes + episodes, w.loss_sum + loss * n_up,
                  w.updates + n_up)  # fmt: skip
    return report_every(every, iteration, env_steps, w)


def learn_if(
    ready: jax.Array, update: Callable, carry: Any, key: jax.Array, num_updates: int
) -> tuple[Any, jax.Array]:
    """``num_updates`` learner steps ``update(carry, key) -> (carry, loss)`` in a
    ``lax.scan`` when ``ready`` (``bool[]``), else ``carry`` unchanged.

    Returns:
        ``(carry, mean loss)`` (``0.0`` when not ready). Pure; jit-safe.
    """
    keys = jax.random.split(key, num_updates)
    carry, losses = jax.lax.cond(
        ready,
        lambda: jax.lax.scan(update, carry, keys),
        lambda: (carry, jnp.zeros((num_updates,), jnp.float32)),
    )
    return carry, losses.mean()


def curve(metrics: dict[str, Any], window: int) -> np.ndarray:
    """Mean training return per ``window`` iterations from per-iteration ``return_sum`` and
    ``episodes`` (NaN where no episode ended)."""
    r = np.asarray(metrics["return_sum"], np.float64)
    e = np.asarray(metrics["episodes"], np.float64)
    n = len(r) // window * window
    r, e = r[:n].reshape(-1, window).sum(1), e[:n].reshape(-1, window).sum(1)
    return np.where(e > 0, r / np.maximum(e, 1), np.nan)


def train_seeds(
    train: Callable[[jax.Array], Any], seeds: Sequence[int]
) -> tuple[list[Any], float, list[float]]:
    """Compiles ``train(key)`` once and trains each seed (``PRNGKey(seed)``) in turn.

    Returns:
        ``(outputs, compile_s, wall_s per seed)``; outputs are blocked on.
    """
    t0 = time.perf_counter()
    keys = [jax.random.PRNGKey(s) for s in seeds]
    compiled = jax.jit(train).lower(keys[0]).compile()
    compile_s = time.perf_counter() - t0
    outs, walls = [], []
    for s, k in zip(seeds, keys, strict=True):
        print(f"seed {s}:", flush=True)
        t0 = time.perf_counter()
        outs.append(jax.block_until_ready(compiled(k)))
        walls.append(time.perf_counter() - t0)
    return outs, compile_s, walls


def evaluate(env: js.Env, policy: js.Policy, params: Any, episodes: int, seed: int) -> np.ndarray:
    """Returns of ``episodes`` greedy episodes (``js.evaluate``, ``deterministic=True``)."""
    res = js.evaluate(env, policy, params, episodes, jax.random.PRNGKey(10_000 + seed))
    return np.asarray(res.returns, np.float64)


def train_and_record(
    name: str,
    script: str,
    cfg: Any,
    parts: Any,
    seeds: Sequence[int],
    greedy_params: Callable[[Any], Any],
    target: str,
    notes: str,
    out_dir: Path | None,
) -> dict[str, Any]:
    """What an off-policy example's ``main`` does after building its ``parts``: trains every
    seed (:func:`scan_train` of ``parts.iteration`` / ``parts.init``, :func:`train_seeds`),
    evaluates each seed's final greedy policy (``greedy_params(train_state)``, its params
    for ``parts.policy``) and writes the result (:func:`record`), which it returns.

    ``cfg`` is an :class:`IterationSizes` dataclass with ``eval_episodes`` and
    ``log_every``."""
    train = scan_train(parts.iteration, parts.init, cfg.num_iterations)
    outs, compile_s, walls = train_seeds(train, seeds)
    evals = [
        evaluate(parts.env, parts.policy, greedy_params(ts), cfg.eval_episodes, s)
        for s, (ts, _) in zip(seeds, outs, strict=True)
    ]
    return record(
        name,
        script,
        dataclasses.asdict(cfg),
        seeds,
        evals,
        [curve(m, max(1, cfg.log_every)) for _, m in outs],
        cfg.num_iterations * cfg.steps_per_iteration,
        compile_s,
        walls,
        target,
        notes,
        out_dir,
    )


def machine() -> str:
    """The machine, in words."""
    return f"{os.cpu_count()}-core {platform.machine()} CPU (shared with other jobs)"


def record(
    name: str,
    script: str,
    config: dict[str, Any],
    seeds: Sequence[int],
    eval_returns: Sequence[np.ndarray],
    curves: Sequence[np.ndarray],
    env_steps: int,
    compile_s: float,
    walls: Sequence[float],
    target: str,
    notes: str,
    out_dir: Path | None,
) -> dict[str, Any]:
    """Builds the result record (date, command, commit, machine, config, per-seed evaluation
    returns, train curves, timing), prints its Markdown and writes ``<name>.json`` /
    ``<name>.md`` into ``out_dir`` (unless None)."""
    means = [float(r.mean()) for r in eval_returns]
    res: dict[str, Any] = {
        "benchmark": name,
        "date": harness.now(),
        "command": " ".join(["python", "-m", f"examples.{script}", *sys.argv[1:]]),
        **harness.git_state(),
        "jax": jax.__version__,
        "machine": machine(),
        "config": config,
        "seeds": list(seeds),
        "env_steps_per_seed": env_steps,
        "eval_episodes": int(len(eval_returns[0])),
        "eval_mean_return_per_seed": means,
        "eval_std_return_per_seed": [float(r.std()) for r in eval_returns],
        "eval_returns_per_seed": [r.tolist() for r in eval_returns],
        "compile_s": compile_s,
        "wall_s_per_seed": list(walls),
        "env_steps_per_s_per_seed": [env_steps / w for w in walls],
        "train_return_curve_per_seed": [
            [None if not np.isfinite(v) else float(v) for v in c] for c in curves
        ],
        "target": target,
    }
    rows = [
        f"| {s} | {m:.1f} | {float(r.std()):.1f} | {float(r.min()):.1f} | {w:.1f} | "
        f"{env_steps / w:,.0f} |"
        for s, m, r, w in zip(seeds, means, eval_returns, walls, strict=True)
    ]
    md = "\n".join(
        [
            f"# {name} (`examples/{script}.py`)",
            "",
            f"{res['date']} · commit `{str(res.get('commit', '?'))[:10]}` · {res['machine']}, "
            f"jax {res['jax']} · `{res['command']}`",
            "",
            f"{env_steps:,} env steps per seed; compile {compile_s:.1f} s (once for all seeds). "
            f"Evaluation: {res['eval_episodes']} greedy episodes of the final params "
            f"(`js.evaluate`). Target: {target}.",
            "",
            "| seed | eval mean return | std | min | train wall s | env steps/s |",
            "|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
            notes,
            "",
        ]
    )
    harness.finish(res, md, name, out_dir)
    return res
