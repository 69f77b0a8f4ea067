"""CartPole-v1 sampling throughput: jaxsampler against hand-written and host-loop baselines.

Every implementation drives CartPole-v1 with the same 64x64 tanh actor-critic MLP (same
weights), samples a categorical action and also computes its log-probability and the
value estimate, and stores (obs, action, reward, terminated, truncated, logp, value)
each step. Implementations, per width ``W`` (number of parallel envs):

* ``jaxsampler``: :func:`jaxsampler.cli.bench.measure_rollout` (jitted ``lax.scan``, donated
  buffers, next-step auto-reset: the step after an episode end is a reset step with no
  action, so ``actions_per_s`` < ``env_steps_per_s``).
* ``handwritten``: a PureJaxRL-style loop (:func:`benchmarks.baselines.gymnax_cartpole`):
  ``jax.vmap`` over gymnax ``CartPole-v1`` (same-step auto-reset, so every step is an
  action) and a flax MLP in one jitted ``lax.scan`` that stacks the transitions; keys
  split per env per step.
* ``forward_only``: the jaxsampler policy alone (MLP + sampling over ``[W]`` obs) scanned
  ``T`` times with no env: the ceiling for a rollout of that policy.
* ``sync_vector_env``: Gymnasium ``SyncVectorEnv`` + the MLP in numpy, a Python loop (the
  host loops are :mod:`benchmarks.baselines`' too).
* ``make_vec``: Gymnasium's numpy-vectorized CartPole + the jitted MLP once per step.
* ``envpool``: EnvPool (if installed) + the MLP in numpy.
* ``jaxsampler_2dev``: jaxsampler over 2 forced CPU devices, in a subprocess (only if
  ``measure_rollout`` takes ``num_devices``).

The JAX implementations (and the host loops) are measured round-robin at each width, in
a rotating order, so machine noise hits them alike and the ratios are side by side.
Figures are medians over repeats after a warm-up; compile time is reported separately.

Usage::

    python -m benchmarks.throughput                 # full run, writes benchmarks/results/
    python -m benchmarks.throughput --quick         # smoke test, prints the table only
    python -m benchmarks.throughput --widths 1 64 4096 --repeats 3
"""

from __future__ import annotations

import os

# Before numpy is imported anywhere: one BLAS thread for the numpy baselines, so they do
# not fight the JAX thread pool (or each other) for the cores. Recorded in the results.
os.environ["OPENBLAS_NUM_THREADS"] = "1"

import argparse
import inspect
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp

import jaxsampler as js
from benchmarks import harness
from benchmarks.baselines import (
    ENV_ID,
    HOST_LOOPS,
    envpool_status,
    gymnax_cartpole,
    make_host_loop,
    policy_params,
)
from jaxsampler.cli.bench import environment_info, measure_rollout, time_calls
from jaxsampler.envs.base import Env

DEFAULT_WIDTHS = (1, 8, 64, 256, 1024, 4096, 16384)
SIZES = harness.Sizes(
    full={
        "widths": list(DEFAULT_WIDTHS),
        "rollout_length": 128,
        "repeats": 5,
        "host_max_width": 1024,
        "host_target_s": 1.5,
    },
    quick={
        "widths": [1, 8],
        "rollout_length": 8,
        "repeats": 1,
        "host_max_width": 8,
        "host_target_s": 0.05,
    },
)
LABELS = {
    "jaxsampler": "jaxsampler (measure_rollout)",
    "handwritten": "hand-written vmap(gymnax) + scan",
    "forward_only": "policy forward only (no env)",
    "sync_vector_env": "Gymnasium SyncVectorEnv + numpy MLP",
    "make_vec": "Gymnasium make_vec (numpy CartPole) + jitted MLP",
    "envpool": "EnvPool + numpy MLP",
    "jaxsampler_2dev": "jaxsampler, 2 CPU devices (subprocess)",
}
JAX_IMPLS = ("jaxsampler", "handwritten", "forward_only")
HOST_IMPLS = HOST_LOOPS
#: Packages whose versions are recorded with the results.
VERSIONS = ("gymnax", "gymnasium", "envpool")


# --------------------------------------------------------------------------- JAX loops


def make_forward_only(num_envs: int, rollout_length: int, seed: int = 0) -> tuple[Callable, Any]:
    """jaxsampler's ``MLPPolicy`` over ``obs[W, 1, 4]`` scanned ``T`` times, no env.

    The next obs depends on the sampled action (a cheap nudge), so XLA cannot hoist the
    forward pass out of the loop. Returns ``(jitted run(params, carry), carry)``.
    """
    env = cast(Env, js.make(ENV_ID))
    policy = js.MLPPolicy(env.observation_space, env.action_space, (64, 64))
    pstate = policy.initial_state((num_envs, env.num_agents))

    def run(params: Any, carry: tuple[jax.Array, jax.Array]) -> Any:
        def step(c: tuple[jax.Array, jax.Array], _: Any) -> Any:
            obs, key = c
            key, k = jax.random.split(key)
            action, extras, _ = policy(params, obs, k, pstate)
            obs = obs * 0.99 + 0.01 * action[..., None].astype(jnp.float32)
            return (obs, key), (action, extras["action_logp"], extras["vf_preds"])

        return jax.lax.scan(step, carry, None, rollout_length)

    key = jax.random.PRNGKey(seed)
    obs = jax.random.uniform(key, (num_envs, env.num_agents, 4), jnp.float32, -0.05, 0.05)
    return jax.jit(run), (obs, jax.random.fold_in(key, 1))


def jax_timer(run: Callable, carry: Any, params: Any) -> harness.RoundTimer:
    """Compiles a ``run(params, carry)`` once (carrying its carry from call to call), then
    times ``inner`` calls per round."""
    box = {"carry": carry}

    def call() -> Any:
        box["carry"], out = run(params, box["carry"])
        return out

    return harness.RoundTimer(call)


# --------------------------------------------------------------------------- the sweep


def _summary(
    times: Sequence[float],
    round_s: Sequence[float],
    steps_per_call: int,
    acting_fraction: float = 1.0,
) -> dict[str, Any]:
    """Throughput from all timed calls; ``round_*`` lists keep each round's own figure."""
    med = statistics.median(times)
    return {
        "median_s": med,
        "times_s": list(times),
        "env_steps_per_s": steps_per_call / med,
        "actions_per_s": steps_per_call * acting_fraction / med,
        "acting_fraction": acting_fraction,
        "round_env_steps_per_s": [steps_per_call / t for t in round_s],
        "round_actions_per_s": [steps_per_call * acting_fraction / t for t in round_s],
    }


def _steady_times(res: dict[str, Any]) -> list[float]:
    """``measure_rollout``'s timed calls less the first (an extra warm-up call).

    ``jit_rollout`` allocates the buffers of the first call separately, so the rollout
    compiles once; the first timed call is still dropped as a warm-up and any excess it
    shows over the steady state is counted as compile time.
    """
    return res["times_s"][1:]


def _compile_total(res: dict[str, Any]) -> float:
    """``compile_s`` plus the first timed call's excess over the steady state."""
    return res["compile_s"] + max(0.0, res["times_s"][0] - statistics.median(_steady_times(res)))


def measure_width(
    width: int,
    rollout_length: int,
    repeats: int,
    params: Any,
    *,
    host: Sequence[str] = HOST_IMPLS,
    host_target_s: float = 1.5,
    jax_target_s: float = 0.3,
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """All implementations at one width, measured round-robin (``repeats`` rounds).

    Each round calls ``measure_rollout`` once (it compiles anew, untimed, then times
    ``inner`` calls), times ``inner`` calls of the hand-written and forward-only loops and
    one run of each host loop; the order rotates from round to round.
    """
    W, T = width, rollout_length
    hand = jax_timer(*gymnax_cartpole(W, T, seed), params)
    fwd = jax_timer(*make_forward_only(W, T, seed), params)
    warm = min(time_calls(hand.call, 2))
    inner = max(1, min(50, math.ceil(jax_target_s / warm)))
    loops, host_steps, host_compile = {}, {}, {}
    for kind in host:
        loop, host_compile[kind] = make_host_loop(kind, W, params, T, seed)
        loop.run(8)  # warm-up
        n, probe = 8, loop.run(8)
        while probe["seconds"] < 0.05 * host_target_s:  # per-step cost estimate
            n *= 2
            probe = loop.run(n)
        host_steps[kind] = max(8, min(500_000, round(host_target_s * n / probe["seconds"])))
        loops[kind] = loop
    js_rounds: list[dict[str, Any]] = []

    def one(name: str) -> None:
        if name == "jaxsampler":
            # One extra call: see _steady_times.
            js_rounds.append(measure_rollout(ENV_ID, W, T, repeats=inner + 1, seed=seed))
        elif name == "handwritten":
            hand.round(inner)
        elif name == "forward_only":
            fwd.round(inner)
        else:
            loops[name].runs.append(loops[name].run(host_steps[name]))

    order = list(JAX_IMPLS) + list(host)
    for r in range(repeats):
        for name in harness.rotated(order, r):
            one(name)
    js_times = [t for res in js_rounds for t in _steady_times(res)]
    out = {
        "jaxsampler": {
            **_summary(
                js_times,
                [statistics.median(_steady_times(res)) for res in js_rounds],
                W * T,
                statistics.median(res["acting_fraction"] for res in js_rounds),
            ),
            "compile_s": statistics.median(_compile_total(res) for res in js_rounds),
            "compile_s_reported": [res["compile_s"] for res in js_rounds],
            "first_timed_call_s": [res["times_s"][0] for res in js_rounds],
            "rounds": [
                {k: res[k] for k in ("median_s", "env_steps_per_s", "actions_per_s")}
                for res in js_rounds
            ],
        },
        "handwritten": {**_summary(hand.times, hand.round_s, W * T), "compile_s": hand.compile_s},
        "forward_only": {**_summary(fwd.times, fwd.round_s, W * T), "compile_s": fwd.compile_s},
    }
    for name in ("jaxsampler", "handwritten", "forward_only"):
        out[name].update(calls_per_round=inner, rounds_n=repeats)
    for kind, loop in loops.items():
        secs = [r["seconds"] for r in loop.runs]
        steps_s = [r["steps"] / r["seconds"] for r in loop.runs]
        acts_s = [r["actions"] / r["seconds"] for r in loop.runs]
        out[kind] = {
            "median_s": statistics.median(secs),
            "env_steps_per_s": statistics.median(steps_s),
            "actions_per_s": statistics.median(acts_s),
            "round_env_steps_per_s": steps_s,
            "round_actions_per_s": acts_s,
            "acting_fraction": statistics.median(r["actions"] / r["steps"] for r in loop.runs),
            "steps_per_run": host_steps[kind],
            "runs": loop.runs,
        }
        if host_compile[kind] is not None:
            out[kind]["compile_s"] = host_compile[kind]
        loop.env.close()
    return out


def _supports_num_devices() -> bool:
    return "num_devices" in inspect.signature(measure_rollout).parameters


def measure_multi_device(
    widths: Sequence[int], rollout_length: int, repeats: int, devices: int = 2
) -> dict[str, Any]:
    """jaxsampler on ``devices`` forced CPU devices, in a subprocess (XLA_FLAGS must be set
    before jax is imported). Interleaves ``num_devices=1`` and ``=devices`` there."""
    if not _supports_num_devices():
        return {
            "status": "skipped: jaxsampler.cli.bench.measure_rollout has no num_devices parameter"
        }
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}"
    ).strip()
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.throughput",
        "--devices-worker",
        str(devices),
        "--rollout-length",
        str(rollout_length),
        "--repeats",
        str(repeats),
        "--widths",
        *map(str, widths),
    ]
    proc = subprocess.run(
        cmd, cwd=harness.ROOT, env=env, capture_output=True, text=True, timeout=1800
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT_JSON:")]
    if proc.returncode != 0 or not lines:
        return {"status": f"failed (rc={proc.returncode}): {proc.stderr.strip()[-2000:]}"}
    return {
        "status": "ok",
        "XLA_FLAGS": env["XLA_FLAGS"],
        **json.loads(lines[-1][len("RESULT_JSON:") :]),
    }


def _devices_worker(widths: Sequence[int], rollout_length: int, repeats: int, devices: int) -> None:
    by_width: dict[str, Any] = {}
    for w in widths:
        if w % devices:
            by_width[str(w)] = {"status": f"skipped: width not divisible by {devices} devices"}
            continue
        rounds: dict[int, list[dict[str, Any]]] = {1: [], devices: []}
        inner = 3
        for r in range(repeats):
            for n in (1, devices) if r % 2 == 0 else (devices, 1):
                # One extra call: see _steady_times.
                rounds[n].append(
                    measure_rollout(ENV_ID, w, rollout_length, repeats=inner + 1, num_devices=n)
                )
            inner = max(
                1, min(50, math.ceil(0.3 / statistics.median(_steady_times(rounds[1][-1]))))
            )
        row = {}
        for n, res in rounds.items():
            row[f"{n}dev"] = {
                **_summary(
                    [t for x in res for t in _steady_times(x)],
                    [statistics.median(_steady_times(x)) for x in res],
                    w * rollout_length,
                    statistics.median(x["acting_fraction"] for x in res),
                ),
                "compile_s": statistics.median(_compile_total(x) for x in res),
            }
        by_width[str(w)] = row
    out = {
        "device_count": jax.device_count(),
        "devices": [str(d) for d in jax.devices()],
        "by_width": by_width,
    }
    print("RESULT_JSON:" + json.dumps(out), flush=True)


def run_benchmark(
    widths: Sequence[int] = DEFAULT_WIDTHS,
    rollout_length: int = 128,
    repeats: int = 5,
    *,
    host_max_width: int = 1024,
    host_target_s: float = 1.5,
    big_width: int = 4096,
    big_repeats: int | None = None,
    multi_device: bool = True,
    multi_device_repeats: int = 5,
    seed: int = 0,
    progress: Callable[[str], None] | None = harness.log,
) -> dict[str, Any]:
    """Runs every implementation at every width; returns the full results dict.

    ``big_repeats`` (default ``repeats``) applies to widths ``>= big_width``; host loops
    run only at widths ``<= host_max_width``; the 2-device subprocess (if ``multi_device``
    and ``measure_rollout`` takes ``num_devices``) runs ``min(repeats,
    multi_device_repeats)`` rounds.
    """
    started = time.perf_counter()
    params = policy_params(seed)
    ep = envpool_status()
    host = [k for k in HOST_IMPLS if not (k == "envpool" and ep)]
    by_width: dict[str, Any] = {}
    for i, w in enumerate(widths):
        reps = big_repeats if (big_repeats and w >= big_width) else repeats
        hw = host if w <= host_max_width else []
        if progress:
            progress(
                f"[{i + 1}/{len(widths)}] width {w}: {reps} rounds of "
                f"{', '.join(list(JAX_IMPLS) + hw)}"
            )
        by_width[str(w)] = measure_width(
            w, rollout_length, reps, params, host=hw, host_target_s=host_target_s, seed=seed
        )
    if progress and multi_device:
        progress(
            "jaxsampler on 2 CPU devices (subprocess) ..."
            if _supports_num_devices()
            else "skipping 2-device column: measure_rollout has no num_devices parameter"
        )
    multi = (
        measure_multi_device(widths, rollout_length, min(repeats, multi_device_repeats))
        if multi_device
        else {"status": "skipped: disabled"}
    )
    return {
        **harness.stamp(
            "CartPole-v1 sampling throughput, 64x64 tanh actor-critic MLP", "throughput"
        ),
        "config": {
            "env_id": ENV_ID,
            "widths": list(widths),
            "rollout_length": rollout_length,
            "repeats": repeats,
            "big_width": big_width,
            "big_repeats": big_repeats or repeats,
            "host_max_width": host_max_width,
            "host_target_s": host_target_s,
            "seed": seed,
            "multi_device_repeats": min(repeats, multi_device_repeats) if multi_device else 0,
            "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS"),
        },
        "environment": {**environment_info(), **harness.versions(VERSIONS)},
        "labels": LABELS,
        "envpool_status": ep or "ok",
        "by_width": by_width,
        "jaxsampler_2dev": multi,
        "ratios": ratios(by_width, multi),
        "wall_s": time.perf_counter() - started,
    }


def paired_ratio(a: dict[str, Any], b: dict[str, Any], key: str = "actions_per_s") -> float:
    """Median over rounds of ``a``'s figure over ``b``'s in the same round.

    Both ran in every round, one after the other, so noise that hits a whole round
    cancels out; the median then discards rounds where it hit only one of them.
    """
    return harness.paired_ratio(a[f"round_{key}"], b[f"round_{key}"])


def ratios(
    by_width: dict[str, Any], multi: dict[str, Any] | None = None
) -> dict[str, dict[str, float]]:
    """Side-by-side ratios per width (:func:`paired_ratio` over the rounds).

    ``jaxsampler/<x>``: actions/s over actions/s. ``rollout/forward_only``: jaxsampler env
    steps/s over forward-only steps/s (same ``W*T`` policy calls per rollout call).
    ``2dev/1dev``: from the subprocess, where both were interleaved.
    """
    out: dict[str, dict[str, float]] = {}
    for w, row in by_width.items():
        for other in ("handwritten", "sync_vector_env", "make_vec", "envpool"):
            if other in row:
                out.setdefault(f"jaxsampler/{other}", {})[w] = paired_ratio(
                    row["jaxsampler"], row[other]
                )
        out.setdefault("rollout/forward_only", {})[w] = paired_ratio(
            row["jaxsampler"], row["forward_only"], "env_steps_per_s"
        )
    for w, row in (multi or {}).get("by_width", {}).items():
        if "2dev" in row:
            out.setdefault("2dev/1dev", {})[w] = paired_ratio(row["2dev"], row["1dev"])
    return out


# --------------------------------------------------------------------------- reporting


def _note(text: str, limit: int = 160) -> str:
    """A status message fit for one Markdown table cell."""
    text = " ".join(text.split()).replace("|", "/")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def series(
    results: dict[str, Any], key: str = "actions_per_s"
) -> dict[str, tuple[list[int], list[float]]]:
    """``{implementation: (widths, values)}`` for plotting; skips widths not measured."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for w, row in results["by_width"].items():
        for name, rec in row.items():
            out.setdefault(name, ([], []))
            out[name][0].append(int(w))
            out[name][1].append(rec[key])
    multi = results.get("jaxsampler_2dev", {})
    for w, row in multi.get("by_width", {}).items():
        if "2dev" in row:
            out.setdefault("jaxsampler_2dev", ([], []))
            out["jaxsampler_2dev"][0].append(int(w))
            out["jaxsampler_2dev"][1].append(row["2dev"][key])
    return out


def _acting_fraction(results: dict[str, Any], widths: Sequence[Any]) -> float:
    return statistics.median(
        results["by_width"][w]["jaxsampler"]["acting_fraction"] for w in widths
    )


def markdown_table(results: dict[str, Any]) -> str:
    """The results as Markdown: throughput, ratios and compile times per width."""
    widths = [str(w) for w in results["config"]["widths"]]
    head = (
        "| | " + " | ".join(f"W={w}" for w in widths) + " |\n|---|" + "---:|" * len(widths) + "\n"
    )

    def row(label: str, cells: list[str]) -> str:
        return f"| {label} | " + " | ".join(cells) + " |\n"

    def impl_rows(key: str) -> str:
        s = ""
        for name in ("jaxsampler", "handwritten", "forward_only", *HOST_IMPLS):
            recs = [results["by_width"][w].get(name) for w in widths]
            if name == "envpool" and results["envpool_status"] != "ok":
                s += row(
                    LABELS[name], [_note(results["envpool_status"])] + [""] * (len(widths) - 1)
                )
                continue
            s += row(LABELS[name], [harness.si(r[key]) if r else "—" for r in recs])
        multi = results["jaxsampler_2dev"]
        if multi.get("status") == "ok":
            cells = []
            for w in widths:
                rec = multi["by_width"].get(w, {})
                cells.append(harness.si(rec["2dev"][key]) if "2dev" in rec else "—")
            s += row(LABELS["jaxsampler_2dev"], cells)
        else:
            s += row(LABELS["jaxsampler_2dev"], [_note(multi["status"])] + [""] * (len(widths) - 1))
        return s

    cfg = results["config"]
    md = f"# {results['benchmark']}\n\n"
    md += (
        f"{results['date']} · `{results['command']}` · T={cfg['rollout_length']} · "
        f"{cfg['repeats']} rounds (widths ≥ {cfg['big_width']}: {cfg['big_repeats']}; "
        f"2-device subprocess: {cfg['multi_device_repeats']}) · "
        f"OPENBLAS_NUM_THREADS={cfg['OPENBLAS_NUM_THREADS']} · "
        f"{results['environment']['cpu_count']} CPUs, jax {results['environment']['jax']} "
        f"({results['environment']['backend']}) · total {results['wall_s']:.0f} s\n\n"
    )
    md += "## Actions per second (median)\n\n" + head + impl_rows("actions_per_s")
    rat = results["ratios"]
    for name, label in (
        ("handwritten", "jaxsampler / hand-written"),
        ("sync_vector_env", "jaxsampler / SyncVectorEnv"),
        ("make_vec", "jaxsampler / make_vec"),
        ("envpool", "jaxsampler / EnvPool"),
    ):
        if f"jaxsampler/{name}" in rat:
            md += row(
                f"**{label}**",
                [
                    f"{rat[f'jaxsampler/{name}'][w]:.2f}" if w in rat[f"jaxsampler/{name}"] else "—"
                    for w in widths
                ],
            )
    md += row(
        "**rollout / forward-only** (env steps/s)",
        [f"{rat['rollout/forward_only'][w]:.2f}" for w in widths],
    )
    if "2dev/1dev" in rat:
        md += row(
            "**2 devices / 1 device** (subprocess)",
            [f"{rat['2dev/1dev'][w]:.2f}" if w in rat["2dev/1dev"] else "—" for w in widths],
        )
    md += (
        "\n## Env steps per second (median; reset steps included)\n\n"
        + head
        + impl_rows("env_steps_per_s")
    )
    md += "\n## Compile time, seconds (first call: trace + compile + one run)\n\n" + head
    for name in ("jaxsampler", "handwritten", "forward_only", "make_vec"):
        recs = [results["by_width"][w].get(name) for w in widths]
        label = LABELS[name] + (" (policy only)" if name == "make_vec" else "")
        md += row(label, [f"{r['compile_s']:.2f}" if r and "compile_s" in r else "—" for r in recs])
    md += "\n## Host-loop steps per timed run\n\n" + head
    for name in HOST_IMPLS:
        recs = [results["by_width"][w].get(name) for w in widths]
        if any(recs):
            md += row(LABELS[name], [str(r["steps_per_run"]) if r else "—" for r in recs])
    md += (
        "\nNotes: jaxsampler auto-resets on the next step, so its actions/s exclude reset steps "
        "(acting fraction ≈ "
        f"{_acting_fraction(results, widths):.3f}); "
        "the host loops (Gymnasium, EnvPool) also reset on the next step and are counted the same "
        "way; "
        "gymnax resets within the step, so every hand-written step is an action. Ratios compare "
        "runs "
        "interleaved round by round in one process: each is the median over rounds of the "
        "within-round ratio. Host loops run at widths ≤ "
        f"{cfg['host_max_width']} only (—).\n"
    )
    return md


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--widths",
        type=int,
        nargs="+",
        help=f"env counts (default {' '.join(map(str, DEFAULT_WIDTHS))})",
    )
    p.add_argument("--rollout-length", type=int, help="T, steps per rollout call (default 128)")
    p.add_argument("--repeats", type=int, help="rounds per width; figures are medians (default 5)")
    p.add_argument("--big-width", type=int, default=4096, help="widths >= this use --big-repeats")
    p.add_argument(
        "--big-repeats", type=int, help="rounds for widths >= --big-width (default --repeats)"
    )
    p.add_argument(
        "--host-max-width",
        type=int,
        help="largest width for the host-loop baselines (default 1024)",
    )
    p.add_argument(
        "--host-target-s", type=float, help="seconds per timed host-loop run (default 1.5)"
    )
    p.add_argument(
        "--no-multi-device", action="store_true", help="skip the 2-CPU-device subprocess"
    )
    p.add_argument(
        "--multi-device-repeats",
        type=int,
        default=5,
        help="max rounds in the 2-device subprocess (default 5)",
    )
    p.add_argument("--seed", type=int, default=0)
    harness.add_quick_out(p, "throughput", out="--output-dir")
    p.add_argument("--devices-worker", type=int, help=argparse.SUPPRESS)
    args = SIZES.apply(p.parse_args(argv))
    if args.devices_worker:
        _devices_worker(args.widths, args.rollout_length, args.repeats, args.devices_worker)
        return
    results = run_benchmark(
        args.widths,
        args.rollout_length,
        args.repeats,
        host_max_width=args.host_max_width,
        host_target_s=args.host_target_s,
        big_width=args.big_width,
        big_repeats=args.big_repeats,
        multi_device=not args.no_multi_device,
        multi_device_repeats=args.multi_device_repeats,
        seed=args.seed,
    )
    harness.finish(
        results,
        markdown_table(results),
        "throughput",
        harness.results_dir(args.output_dir, args.quick),
    )


if __name__ == "__main__":
    main()
