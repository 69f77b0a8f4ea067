"""The host side against the bare rollout: the cells of issue 28's targets, in one process.

Every cell runs ``T`` steps per call (default 128). Its sides run back to back in each
round, in a rotating order (:func:`benchmarks.harness.rotated`), on the same env, policy
and shapes:

* ``rollout``: the bare rollout, ``js.jit_rollout(js.make_rollout(...))`` with its
  buffers passed back, timed up to ``jax.block_until_ready`` (the device's compute) and
  then its one ``jax.device_get`` of the trajectory (the host copy);
* ``sample_batch``: ``DeviceSampler.sample_batch(params)`` end to end;
* ``sample``: ``DeviceSampler.sample(params)`` end to end (the episodes, lazily built or not);
* ``sample+read``: ``sample()`` and then every episode read once: ``get_observations()``,
  ``get_actions()`` and ``get_rewards()`` of each single-agent episode, and of every agent
  episode (``ep.agent_episodes.values()``) of each multi-agent one.

Cells: CartPole-v1 1024 envs, random and 64x64 MLP; Spread(8) 64 envs MLP and 1024 envs
random (all four sides); ``gymnax:Breakout-MinAtar`` 1024 envs random (rollout and
``sample_batch``, plus the batch's bytes and the peak host allocation during one call,
measured by ``tracemalloc`` -- numpy reports its buffers to it -- over those bytes); and,
in a subprocess with ``--xla_force_host_platform_device_count=2``, ``sample_batch()`` at
``devices=1`` and ``devices=2`` with the bare rollout on one and on two devices (CartPole-v1
1024 envs MLP, Spread(8) 1024 envs random; the same total envs on both).

Figures: medians over rounds; a ratio is the median of the within-round ratios (noise from
other processes hits the sides of a round alike). The time split of a side is rollout
(device compute) / host copy / conversion (the rest: side time minus the round's bare
rollout). Results: ``results/host_side.{json,md,png}``; ``--before PATH`` (an earlier
run's JSON) adds its figures to the table and draws them next to this run's in the plot.

Floors (:mod:`benchmarks.host_floors`; ``--floor-repeats``, 0 for none; ``--floor-idle``
seconds before each cold copy, 0 for none): after its rounds,
each cell measures the least its calls could cost here -- the batch's (and the trajectory's)
bytes written once into fresh memory, one object per episode (a minimal slotted one, and
RLlib's own empty episodes) -- as a ratio to the bare rollout next to the measured one
(``row["floors"]``, and a Floors table with how close each unmet target is to its floor).

Gather floor (``--gather-repeats``, 0 for none): after its rounds, a multi-agent
``sample_batch`` cell times the numpy data movement its batch needs, alone, on the
sampler's last host trajectory: one row per (env, agent, step) in env, agent, step order
(the batch's locality), its observation row gathered from the time-major buffer into fresh
memory (a ``"clip"`` ``np.take`` into the output), its action gathered likewise, its
reward gathered and cast to ``float32``, its ``terminateds`` / ``truncateds`` gathered, its
``t`` and ``agent_index`` written as ``int64``, and one shared id string per (env, agent)
broadcast to its rows (``np.repeat`` of an object array) -- nothing decided about which rows
exist or in which episode they sit (``row["gather_floor"]``, the minimum over repeats).

GC thresholds (``--gc-rounds``, 0 for none): every ``sample+read`` cell also runs that
side in a steady loop (no ``gc.collect()`` forced between calls) with Python's default GC
thresholds and with the first generation's raised to 100,000 in turn (``row["gc_tuning"]``):
what a user's process can buy with one ``gc.set_threshold`` (jaxsampler never changes it).

Options the code under test may or may not have are passed through and dropped, with a
note in the results, where this checkout does not take them: ``--prefetch`` (the
sampler's ``prefetch=True``), ``--sampler-kwargs JSON`` (every ``DeviceSampler``),
``--minatar-make-kwargs JSON`` (``js.make("gymnax:Breakout-MinAtar", **kw)``, e.g. a
compact observation dtype) and ``--minatar-sampler-kwargs JSON``.

    python -m benchmarks.host_side                       # full run (~3-6 min), writes results/
    python -m benchmarks.host_side --quick               # smoke run (tiny sizes), prints only
    python -m benchmarks.host_side --before benchmarks/results/host_side_before.json --prefetch
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness, host_floors
from benchmarks.harness import log
from benchmarks.host_floors import batch_bytes

NAME = "host_side"
MINATAR = "gymnax:Breakout-MinAtar"
MARK = "@@host_side@@ "
SIDES = ("rollout", "sample_batch", "sample", "sample+read")
CONVERTING = SIDES[1:]
DEVICE_SIDES = ("rollout_1d", "rollout_2d", "sample_batch_1d", "sample_batch_2d")
MiB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Cell:
    """One measured configuration: env (``CartPole-v1``, ``Spread`` with ``agents``, or
    ``MinAtar``), envs per call, policy (``random`` / ``mlp``) and the sides it times."""

    env: str
    num_envs: int
    policy: str
    sides: tuple[str, ...] = SIDES
    agents: int = 1

    @property
    def key(self) -> str:
        name = self.env if self.agents == 1 else f"{self.env}({self.agents})"
        return f"{name} {self.num_envs} {self.policy}"


def cells(quick: bool) -> tuple[list[Cell], list[Cell]]:
    """The in-process cells and the 2-device cells, full or ``--quick`` sizes."""
    w, small = (16, 8) if quick else (1024, 64)
    main = [
        Cell("CartPole-v1", w, "random"),
        Cell("CartPole-v1", w, "mlp"),
        Cell("Spread", small, "mlp", agents=8),
        Cell("Spread", w, "random", agents=8),
        Cell("Breakout-MinAtar", w, "random", sides=("rollout", "sample_batch")),
    ]
    devices = [
        Cell("CartPole-v1", w, "mlp", sides=DEVICE_SIDES),
        Cell("Spread", w, "random", sides=DEVICE_SIDES, agents=8),
    ]
    return main, devices


#: (label, cell key, side or figure, today as the issue states it, operator, goal)
TARGETS: tuple[tuple[str, str, str, str, str, float], ...] = (
    ("CartPole 1024, random: `sample_batch()` / rollout",
     "CartPole-v1 1024 random", "sample_batch", "1.9–2.1", "<=", 1.2),
    ("CartPole 1024, random: sample + read / rollout",
     "CartPole-v1 1024 random", "sample+read", "10–12", "<=", 2.0),
    ("CartPole 1024, MLP: sample + read / rollout",
     "CartPole-v1 1024 mlp", "sample+read", "3.9", "<=", 1.3),
    ("Spread(8) 1024, random: `sample_batch()` / rollout",
     "Spread(8) 1024 random", "sample_batch", "1.6–2.3", "<=", 1.3),
    ("Spread(8) 64 MLP: sample + read / rollout",
     "Spread(8) 64 mlp", "sample+read", "4.9", "<=", 2.0),
    ("Spread(8) 1024 random: sample + read / rollout",
     "Spread(8) 1024 random", "sample+read", "11", "<=", 2.0),
    ("Breakout-MinAtar 1024 random: `sample_batch()` / rollout",
     "Breakout-MinAtar 1024 random", "sample_batch", "3.6–5.4", "<=", 1.5),
    ("Breakout-MinAtar 1024 random: bytes of the batch (MiB)",
     "Breakout-MinAtar 1024 random", "batch_mib", "367", "<=", 110.0),
    ("Breakout-MinAtar 1024 random: peak allocation / batch bytes",
     "Breakout-MinAtar 1024 random", "peak_over_bytes", "1.6", "<=", 1.5),
    ("CartPole 1024 MLP: `sample_batch()` 2 CPU devices / 1",
     "devices CartPole-v1 1024 mlp", "speedup_sample_batch", "1.14–1.18", ">=", 1.6),
    ("Spread(8) 1024 random: `sample_batch()` 2 CPU devices / 1",
     "devices Spread(8) 1024 random", "speedup_sample_batch", "1.14–1.18", ">=", 1.6),
)  # fmt: skip


# --------------------------------------------------------------------------- building


def accepted(fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> tuple[dict, dict]:
    """``kwargs`` split into those ``fn`` takes and those it does not (by its signature)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(kwargs), {}
    ok = {k: v for k, v in kwargs.items() if k in params}
    return ok, {k: v for k, v in kwargs.items() if k not in params}


def make_env(cell: Cell, make_kwargs: Mapping[str, Any], notes: list[str]) -> Any:
    """The cell's env; MinAtar with ``make_kwargs`` if the adapter takes them (else a note)."""
    import jaxsampler as js
    from jaxsampler.envs.spread import Spread

    if cell.env == "Spread":
        return Spread(cell.agents)
    if cell.env == "CartPole-v1":
        return js.make("CartPole-v1")
    if make_kwargs:
        try:
            return js.make(MINATAR, **make_kwargs)
        except TypeError as e:
            notes.append(f"js.make({MINATAR!r}, **{dict(make_kwargs)}) not accepted ({e})")
    return js.make(MINATAR)


def make_sampler(
    env: Any, pol: Any, cell: Cell, T: int, kw: Mapping[str, Any], notes: list[str]
) -> Any:
    """A ``DeviceSampler`` of the cell with the options of ``kw`` that it takes (a note
    for each one dropped)."""
    from jaxsampler.sampling import DeviceSampler

    ok, dropped = accepted(DeviceSampler.__init__, kw)
    for k, v in dropped.items():
        note = f"DeviceSampler does not take {k}={v!r} in this checkout: dropped"
        if note not in notes:
            notes.append(note)
    return DeviceSampler(env, pol, num_envs=cell.num_envs, rollout_length=T, seed=0, **ok)


def make_policy(env: Any, name: str) -> tuple[Any, Any]:
    """A random or 64x64 tanh MLP policy for ``env`` and its params (``PRNGKey(0)``)."""
    import jax

    import jaxsampler as js

    if name == "random":
        # each agent group from its own action space (older checkouts: one space)
        by_group = getattr(js.policies, "random_policy", None)
        pol: Any = (
            by_group(env) if by_group else js.RandomPolicy(env.observation_space, env.action_space)
        )
    else:
        pol = js.MLPPolicy(env.observation_space, env.action_space, (64, 64))
    return pol, pol.init(jax.random.PRNGKey(0))


def bare_rollout(env: Any, pol: Any, params: Any, num_envs: int, T: int, mesh: Any = None):
    """The bare rollout as a callable returning ``(compute_s, copy_s, host trajectory)``."""
    import jax

    import jaxsampler as js

    rollout = js.jit_rollout(js.make_rollout(env, pol, num_envs, T, mesh=mesh))
    box: dict[str, Any] = {
        "state": js.init_rollout_state(env, pol, num_envs, jax.random.PRNGKey(1), mesh=mesh),
        "buffers": None,
    }

    def run() -> tuple[float, float, Any]:
        t0 = time.perf_counter()
        box["state"], traj = rollout(params, box["state"], box["buffers"])
        jax.block_until_ready(traj)
        t1 = time.perf_counter()
        host = jax.device_get(traj)
        t2 = time.perf_counter()
        box["buffers"] = traj
        return t1 - t0, t2 - t1, host

    return run


def read_all(episodes: Sequence[Any]) -> int:
    """Reads every episode's observations, actions and rewards once (every agent episode of
    a multi-agent one); returns the number of episodes read."""
    n = 0
    for ep in episodes:
        for sa in ep.agent_episodes.values() if hasattr(ep, "agent_episodes") else (ep,):
            sa.get_observations(), sa.get_actions(), sa.get_rewards()
            n += 1
    return n


def sample_and_read(sampler: Any, params: Any) -> list[Any]:
    """``sampler.sample(params)`` with every episode read once (:func:`read_all`); the
    episodes are returned so that freeing them falls outside the timing."""
    episodes = sampler.sample(params)
    read_all(episodes)
    return episodes


# --------------------------------------------------------------------------- measuring


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def run_rounds(
    sides: Mapping[str, Callable[[], Any]], rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """One warm-up call per side, then ``rounds`` rounds in rotating order. A side returns
    either its result or ``(compute_s, copy_s, result)`` (a bare rollout). Returns the
    per-round seconds per side and the compute/copy seconds of the rollout sides. Results
    are dropped after the timing (their deallocation is not timed)."""
    for fn in sides.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in sides}
    split: dict[str, list[float]] = {}
    names = list(sides)
    for r in range(rounds):
        for name in harness.rotated(names, r):
            gc.collect()
            dt, out = _timed(sides[name])
            times[name].append(dt)
            if name.startswith("rollout"):
                split.setdefault(f"{name}_compute", []).append(out[0])
                split.setdefault(f"{name}_copy", []).append(out[1])
            del out
    return times, split


def summarize(
    times: Mapping[str, list[float]], split: Mapping[str, list[float]], base: str = "rollout"
) -> dict[str, Any]:
    """Per side: median seconds and, against the round's ``base`` rollout, the paired ratio
    and the split (rollout compute / host copy / conversion, medians in seconds; the
    rollout share of the bare rollout as a fraction)."""
    rollout = times[base]
    compute, copy = split[f"{base}_compute"], split[f"{base}_copy"]
    frac = statistics.median(c / (c + p) for c, p in zip(compute, copy, strict=True))
    out: dict[str, Any] = {}
    for side, ts in times.items():
        if side.startswith("rollout"):
            continue
        out[side] = {
            "median_s": statistics.median(ts),
            "ratio": harness.paired_ratio(ts, rollout),
            "rollout_s": statistics.median(compute),
            "copy_s": statistics.median(copy),
            "conversion_s": statistics.median(t - r for t, r in zip(ts, rollout, strict=True)),
            "rollout_fraction": frac,
        }
    out["rollout"] = {
        "median_s": statistics.median(rollout),
        "compute_s": statistics.median(compute),
        "copy_s": statistics.median(copy),
        "rollout_fraction": frac,
    }
    return out


def peak_allocation(call: Callable[[], Any]) -> tuple[int, Any]:
    """Peak bytes traced by ``tracemalloc`` during ``call()`` above what was traced before
    it, and its result."""
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        out = call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - before, out


def gather_floor(traj: Any, repeats: int) -> dict[str, Any]:
    """The least data movement of a multi-agent batch of ``traj`` (a host trajectory
    ``[T(+1), E, A, ...]``), timed alone: see the module docstring. Returns the minimum
    seconds over ``repeats`` and the bytes written."""
    import numpy as np

    obs, acts = np.asarray(traj.obs), np.asarray(traj.actions)
    rew, term, trunc = (np.asarray(x) for x in (traj.rewards, traj.terminated, traj.truncated))
    T, E, A = rew.shape
    e, a, t = (x.reshape(-1) for x in np.meshgrid(np.arange(E), np.arange(A), np.arange(T),
                                                  indexing="ij"))  # fmt: skip
    at = (t * E + e) * A + a  # the row's place in [T, E, A] (the obs buffer's first T slots)
    runs = np.array([f"run{i:08x}" for i in range(E * A)], dtype=object)
    flat_obs = obs.reshape((-1,) + obs.shape[3:])
    flat_act = acts.reshape((-1,) + acts.shape[3:])

    def once() -> tuple[float, int]:
        t0 = time.perf_counter()
        cols = [
            np.take(flat_obs, at, axis=0, mode="clip",
                    out=np.empty((len(at),) + flat_obs.shape[1:], flat_obs.dtype)),
            np.take(flat_act, at, axis=0, mode="clip",
                    out=np.empty((len(at),) + flat_act.shape[1:], flat_act.dtype)),
            np.take(rew.reshape(-1), at).astype(np.float32),
            np.take(term.reshape(-1), at),
            np.take(trunc.reshape(-1), at),
            t.astype(np.int64),
            a.astype(np.int64),
            np.repeat(runs, T),
        ]  # fmt: skip
        dt = time.perf_counter() - t0
        return dt, sum(c.nbytes for c in cols)

    got = [once() for _ in range(repeats)]
    return {"seconds": min(s for s, _ in got), "bytes": got[0][1], "rows": len(at),
            "repeats": repeats}  # fmt: skip


def measure_cell(cell: Cell, T: int, rounds: int, opts: argparse.Namespace, notes: list[str]):
    """One in-process cell: its sides in rounds; MinAtar adds the batch's bytes and peak."""
    is_minatar = cell.env == "Breakout-MinAtar"
    env = make_env(cell, opts.minatar_make_kwargs if is_minatar else {}, notes)
    pol, params = make_policy(env, cell.policy)
    kw = {**opts.sampler_kwargs, **(opts.minatar_sampler_kwargs if is_minatar else {})}
    sampler = make_sampler(env, pol, cell, T, kw, notes)
    every: dict[str, Callable[[], Any]] = {
        "rollout": bare_rollout(env, pol, params, cell.num_envs, T),
        "sample_batch": lambda: sampler.sample_batch(params),
        "sample": lambda: sampler.sample(params),
        "sample+read": lambda: sample_and_read(sampler, params),
    }
    t0 = time.perf_counter()
    times, split = run_rounds({k: every[k] for k in cell.sides}, rounds)
    row: dict[str, Any] = {
        "cell": cell.key,
        **dataclasses.asdict(cell),
        "rollout_length": T,
        "rounds": rounds,
        "times_s": times,
        "split_s": split,
        "sides": summarize(times, split),
    }
    if opts.floor_repeats:
        row["floors"] = host_floors.measure(
            cell.sides, row["sides"], every["rollout"], sampler, params, opts.floor_repeats,
            opts.floor_idle,
        )  # fmt: skip
    if cell.agents > 1 and "sample_batch" in cell.sides and opts.gather_repeats:
        sampler.sample_batch(params)  # (its last trajectory: one chunk of this cell's shape)
        gc.collect()
        row["gather_floor"] = gather_floor(sampler.last_chunks[-1], opts.gather_repeats)
    if is_minatar:
        row["memory"] = minatar_memory(sampler, params, opts.memory_calls)
    if "sample+read" in cell.sides and opts.gc_rounds:
        row["gc_tuning"] = gc_tuning(lambda: sample_and_read(sampler, params), opts.gc_rounds)
    row["wall_s"] = time.perf_counter() - t0
    return row


#: the raised first-generation threshold :func:`gc_tuning` compares with Python's default
GC_TUNED = 100_000


def gc_tuning(call: Callable[[], Any], rounds: int) -> dict[str, Any]:
    """``call()`` in a steady loop (no ``gc.collect()`` forced, the previous result alive
    until the next is made), with Python's default GC thresholds and with the first
    generation's raised to :data:`GC_TUNED` (a setting of the user's process, which
    jaxsampler never changes), alternating; medians (ms) and the paired ratio."""
    default = gc.get_threshold()
    times: dict[str, list[float]] = {"default": [], "tuned": []}
    keep = call()
    try:
        for r in range(rounds):
            for name in harness.rotated(list(times), r):
                gc.set_threshold(GC_TUNED, *default[1:]) if name == "tuned" else None
                dt, out = _timed(call)
                gc.set_threshold(*default)
                times[name].append(dt)
                keep = out
    finally:
        gc.set_threshold(*default)
    del keep
    return {
        "threshold0": GC_TUNED,
        "default_ms": statistics.median(times["default"]) * 1e3,
        "tuned_ms": statistics.median(times["tuned"]) * 1e3,
        "speedup": harness.paired_ratio(times["default"], times["tuned"]),
    }


def minatar_memory(sampler: Any, params: Any, calls: int) -> dict[str, Any]:
    """Bytes of ``sample_batch()``'s batch and the peak host allocation of ``calls`` calls
    (untimed, under ``tracemalloc``); the ratio uses the median peak and the held bytes."""
    peaks, sizes = [], {}
    for _ in range(calls):
        peak, batch = peak_allocation(lambda: sampler.sample_batch(params))
        peaks.append(peak)
        sizes = batch_bytes(batch)
        obs = batch.policy_batches[next(iter(batch.policy_batches))]["obs"]
        del batch
    peak = statistics.median(peaks)
    return {
        "peaks_bytes": peaks,
        "peak_bytes": peak,
        **{f"{k}_bytes": v for k, v in sizes.items()},
        "batch_mib": sizes["held"] / MiB,
        "nbytes_mib": sizes["nbytes"] / MiB,
        "peak_over_bytes": peak / max(sizes["held"], 1),
        "peak_over_nbytes": peak / max(sizes["nbytes"], 1),
        "obs_dtype": str(obs.dtype),
    }


# --------------------------------------------------------------------------- devices


def devices_worker(config: Mapping[str, Any]) -> dict[str, Any]:
    """In a 2-device process: per cell, the bare rollout on 1 and 2 devices and
    ``sample_batch()`` at ``devices=1`` / ``devices=2``, in rounds."""
    import jax

    from jaxsampler.sampling import DeviceSampler

    opts = argparse.Namespace(**config["opts"])
    notes: list[str] = []
    out: dict[str, Any] = {"device_count": jax.device_count(), "cells": [], "skipped": {}}
    if "devices" not in inspect.signature(DeviceSampler.__init__).parameters:
        out["skipped"]["all"] = "DeviceSampler does not take devices= in this checkout"
        return out
    for raw in config["cells"]:
        cell = Cell(**{**raw, "sides": tuple(raw["sides"])})
        T, rounds = config["rollout_length"], config["rounds"]
        env = make_env(cell, {}, notes)
        pol, params = make_policy(env, cell.policy)
        s1 = make_sampler(env, pol, cell, T, {**opts.sampler_kwargs, "devices": 1}, notes)
        s2 = make_sampler(env, pol, cell, T, {**opts.sampler_kwargs, "devices": 2}, notes)
        sides = {
            "rollout_1d": bare_rollout(env, pol, params, cell.num_envs, T),
            "rollout_2d": bare_rollout(env, pol, params, cell.num_envs, T, mesh=2),
            "sample_batch_1d": lambda s=s1, p=params: s.sample_batch(p),
            "sample_batch_2d": lambda s=s2, p=params: s.sample_batch(p),
        }
        t0 = time.perf_counter()
        times, split = run_rounds(sides, rounds)
        one, two = (
            summarize({k: times[k] for k in (f"rollout_{d}", f"sample_batch_{d}")}, split,
                      f"rollout_{d}")[f"sample_batch_{d}"]
            for d in ("1d", "2d")
        )  # fmt: skip
        out["cells"].append(
            {
                "cell": f"devices {cell.key}",
                **dataclasses.asdict(cell),
                "rollout_length": T,
                "rounds": rounds,
                "times_s": times,
                "split_s": split,
                "sides": {"sample_batch_1d": one, "sample_batch_2d": two},
                "speedup_sample_batch": harness.paired_ratio(
                    times["sample_batch_1d"], times["sample_batch_2d"]
                ),
                "speedup_rollout": harness.paired_ratio(times["rollout_1d"], times["rollout_2d"]),
                "wall_s": time.perf_counter() - t0,
            }
        )
    out["notes"] = notes
    return out


def run_devices(devs: Sequence[Cell], T: int, rounds: int, opts: argparse.Namespace) -> dict:
    """Runs :func:`devices_worker` in a subprocess with two XLA CPU devices."""
    config = {
        "cells": [dataclasses.asdict(c) for c in devs],
        "rollout_length": T,
        "rounds": rounds,
        "opts": {k: vars(opts)[k] for k in ("sampler_kwargs",)},
    }
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.host_side", "--devices-worker", json.dumps(config)],
        cwd=harness.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"the 2-device worker failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    return json.loads(lines[-1][len(MARK) :])


# --------------------------------------------------------------------------- targets, tables


def figure(results: Mapping[str, Any], cell: str, what: str) -> float | None:
    """A figure of a run by cell key and side (its ratio) or named figure; None if absent."""
    for row in [*results.get("cells", []), *results.get("devices", {}).get("cells", [])]:
        if row["cell"] != cell:
            continue
        if what in row.get("sides", {}):
            return row["sides"][what]["ratio"]
        if what in row.get("memory", {}):
            return row["memory"][what]
        return row.get(what)
    return None


def check_targets(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each target of :data:`TARGETS` with this run's figure and whether it is met."""
    out = []
    for label, cell, what, today, op, goal in TARGETS:
        value = figure(results, cell, what)
        met = None if value is None else (value <= goal if op == "<=" else value >= goal)
        out.append({"label": label, "cell": cell, "figure": what, "today": today,
                    "op": op, "goal": goal, "value": value, "met": met})  # fmt: skip
    return out


def ratios_line(row: Mapping[str, Any]) -> str:
    """``side 1.23x, ...``: a row's ratios to the bare rollout, for the progress log."""
    return ", ".join(f"{k} {s['ratio']:.2f}x" for k, s in row["sides"].items() if "ratio" in s)


def _f(x: float | None, unit: str = "") -> str:
    return "—" if x is None else f"{x:.2f}{unit}"


def markdown(res: Mapping[str, Any], before: Mapping[str, Any] | None) -> str:
    """The targets table (cell, today, target, [before,] measured, met) and the split table."""
    env = res["environment"]
    lines = [
        "# Host side vs the bare rollout (issue 28 targets)",
        "",
        f"{res['date']} · `{res['command']}` · T={res['config']['rollout_length']} · "
        f"jax {env['jax']} ({env['backend']}, {env['cpu_count']} CPUs) · "
        f"commit {res['git'].get('commit', '?')[:10]} · wall {res['wall_s']:.0f} s",
        "",
        "Ratios: medians over rounds of the within-round ratio to the bare rollout (jitted "
        "rollout + one `jax.device_get`); 2 devices / 1: time(devices=1) / time(devices=2). "
        "Batch bytes: the memory the batch's arrays span (views counted once).",
    ]
    if res.get("notes"):
        lines += ["", "Notes: " + "; ".join(res["notes"])]
    head = "| cell | today | target |" + (" before |" if before else "") + " measured | met |"
    lines += ["", head, "|---|---:|---:|" + ("---:|" if before else "") + "---:|:-:|"]
    for t in res["targets"]:
        prior = _f(figure(before, t["cell"], t["figure"])) if before else None
        mark = "—" if t["met"] is None else "✓" if t["met"] else "✗"
        lines.append(
            f"| {t['label']} | {t['today']} | {t['op'].replace('<=', '≤').replace('>=', '≥')} "
            f"{t['goal']:g} |" + (f" {prior} |" if before else "") + f" {_f(t['value'])} | {mark} |"
        )
    lines += [
        "",
        "Time split (ms, medians): rollout = the device's compute, copy = `jax.device_get`, "
        "conversion = side − bare rollout of the same round.",
        "",
        "| cell | side | ms | / rollout | rollout | copy | conversion |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in [*res["cells"], *res.get("devices", {}).get("cells", [])]:
        for side, s in row["sides"].items():
            lines.append(
                f"| {row['cell']} | {side} | {s['median_s'] * 1e3:.1f} | "
                + (f"{s['ratio']:.2f} | " if "ratio" in s else "1 | ")
                + f"{s.get('rollout_s', s.get('compute_s', 0)) * 1e3:.1f} | "
                f"{s['copy_s'] * 1e3:.1f} | {s.get('conversion_s', 0.0) * 1e3:.1f} |"
            )
    for row in res["cells"]:
        if "memory" in row:
            m = row["memory"]
            lines += [
                "",
                f"{row['cell']}: batch {m['batch_mib']:.0f} MiB held ({m['nbytes_mib']:.0f} MiB "
                f"as the sum of `nbytes`), obs {m['obs_dtype']}; peak host allocation during "
                f"`sample_batch()` {m['peak_bytes'] / MiB:.0f} MiB = {m['peak_over_bytes']:.2f}x "
                f"held ({m['peak_over_nbytes']:.2f}x nbytes).",
            ]
    for row in res["cells"]:
        if "gc_tuning" in row:
            g = row["gc_tuning"]
            lines.append(
                f"\n{row['cell']}: sample + read in a steady loop (no collection forced "
                f"between calls) {g['default_ms']:.1f} ms with Python's default GC thresholds, "
                f"{g['tuned_ms']:.1f} ms with `gc.set_threshold({g['threshold0']:,})` in the "
                f"user's process ({g['speedup']:.2f}x, paired)."
            )
    for row in res["cells"]:
        if "gather_floor" in row:
            g, side = row["gather_floor"], row["sides"]["sample_batch"]
            rollout = side["rollout_s"] + side["copy_s"]
            lines.append(
                f"\n{row['cell']}: the batch's data movement alone (gather floor: {g['rows']:,} "
                f"rows, {g['bytes'] / MiB:.0f} MiB written) {g['seconds'] * 1e3:.1f} ms = "
                f"(rollout + it) / rollout {(rollout + g['seconds']) / rollout:.2f}; "
                f"`sample_batch()` measured {side['ratio']:.2f}, its conversion "
                f"{side['conversion_s'] * 1e3:.1f} ms = {side['conversion_s'] / g['seconds']:.1f}x "
                "the floor."
            )
    for row in res.get("devices", {}).get("cells", []):
        lines.append(
            f"\n{row['cell']}: `sample_batch()` 2 devices / 1: {row['speedup_sample_batch']:.2f}x; "
            f"bare rollout 2 devices / 1: {row['speedup_rollout']:.2f}x."
        )
    for why in res.get("devices", {}).get("skipped", {}).values():
        lines.append(f"\n2-device cells skipped: {why}")
    lines += host_floors.markdown_lines(res)
    lines.append("")
    return "\n".join(lines)


def bars(results: Mapping[str, Any]) -> dict[str, tuple[float, float, float, float]]:
    """Per (cell, side): (rollout, copy, conversion) in units of the bare rollout, and ms."""
    out = {}
    for row in [*results.get("cells", []), *results.get("devices", {}).get("cells", [])]:
        for side, s in row["sides"].items():
            if "ratio" not in s:
                continue
            frac = s["rollout_fraction"]
            out[f"{row['cell']}: {side}"] = (
                frac, 1 - frac, max(s["ratio"] - 1, 0.0), s["median_s"] * 1e3
            )  # fmt: skip
    return out


def plot(res: dict[str, Any], path: Path, before: Mapping[str, Any] | None = None) -> None:
    """Horizontal stacked bars: rollout / copy / conversion per cell and side, in units of
    the bare rollout of the same round, "before" (hatched) next to this run."""
    plt = harness.pyplot()
    runs = [("before", bars(before)), ("after", bars(res))] if before else [("this run", bars(res))]
    labels = list(dict.fromkeys(k for _, b in runs for k in b))
    h = 0.8 / len(runs)
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(labels) * len(runs) + 1.8))
    colors = ("#4c72b0", "#dd8452", "#c44e52")
    for j, (name, b) in enumerate(runs):
        for i, label in enumerate(labels):
            if label not in b:
                continue
            y = i + (j - (len(runs) - 1) / 2) * h
            left = 0.0
            for k, part in enumerate(b[label][:3]):
                ax.barh(y, part, h * 0.95, left=left, color=colors[k],
                        hatch="//" if name == "before" else None, edgecolor="white")  # fmt: skip
                left += part
            ax.text(left, y, f" {b[label][3]:.0f} ms ({name})", va="center", fontsize=7)
    goals = {f"{c}: {f}": g for _, c, f, _, op, g in TARGETS if op == "<=" and f in CONVERTING}
    for i, label in enumerate(labels):
        if label in goals:
            ax.plot([goals[label]] * 2, [i - 0.45, i + 0.45], color="black", lw=1.5)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    widest = max(sum(v[:3]) for _, b in runs for v in b.values())
    ax.set_xlim(0, widest * 1.2)
    ax.set_xlabel("time per call, in units of the bare rollout (rollout + host copy = 1)")
    ax.set_ylabel("cell: side")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors]
    handles.append(plt.Line2D([0], [0], color="black", lw=1.5))
    names = ["rollout (device compute)", "host copy (device_get)", "conversion (the rest)"]
    names.append("target (issue 28)")
    if before:
        handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="gray", hatch="//"))
        names.append("before")
    ax.legend(handles, names, loc="lower right", fontsize=8)
    env = res["environment"]
    ax.set_title(
        f"Host side vs the bare rollout, T={res['config']['rollout_length']}: time split per "
        f"call (medians of rounds)\n{env['backend']} backend, {env['cpu_count']} CPU cores, "
        f"jax {env['jax']}",
        fontsize=10,
    )
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- command line


def _json_kwargs(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; ``--quick`` fills unset sizes with the tiny ones."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rollout-length", type=int, help="T (default 128; quick 8)")
    p.add_argument("--rounds", type=int, help="rounds per cell (default 9; quick 2)")
    p.add_argument("--big-rounds", type=int, help="rounds of Spread(8) 1024 cells (default 5)")
    p.add_argument("--memory-calls", type=int, help="tracemalloc'd MinAtar calls (default 3)")
    p.add_argument("--floor-repeats", type=int, help="repeats per floor (default 5; 0: none)")
    p.add_argument("--floor-idle", type=float, help="s before a cold copy (default 3; quick 0)")
    p.add_argument("--parts", nargs="+", choices=("cells", "devices"), default=["cells", "devices"])
    p.add_argument("--cells", nargs="+", metavar="TEXT", help="only cells whose name has TEXT")
    p.add_argument("--gc-rounds", type=int, help="rounds of the GC-threshold comparison (0: none)")
    p.add_argument("--gather-repeats", type=int, help="gather floor repeats (default 5; 0: none)")
    p.add_argument("--before", type=Path, help="an earlier host_side.json to compare with")
    p.add_argument("--prefetch", action="store_true", help="DeviceSampler(prefetch=True)")
    p.add_argument("--sampler-kwargs", type=_json_kwargs, default={}, metavar="JSON")
    p.add_argument("--minatar-make-kwargs", type=_json_kwargs, default={}, metavar="JSON")
    p.add_argument("--minatar-sampler-kwargs", type=_json_kwargs, default={}, metavar="JSON")
    p.add_argument("--name", default=NAME, help=f"result file name (default {NAME})")
    p.add_argument("--replot", type=Path, metavar="JSON", help="rewrite .md/.png of a run's JSON")
    p.add_argument("--devices-worker", metavar="JSON", help=argparse.SUPPRESS)
    harness.add_quick_out(p, NAME)
    args = p.parse_args(argv)
    sizes = harness.Sizes(
        full={
            "rollout_length": 128,
            "rounds": 9,
            "big_rounds": 5,
            "memory_calls": 3,
            "floor_repeats": 5,
            "floor_idle": 3.0,
            "gc_rounds": 5,
            "gather_repeats": 5,
        },
        quick={
            "rollout_length": 8,
            "rounds": 2,
            "big_rounds": 2,
            "memory_calls": 1,
            "floor_repeats": 2,
            "floor_idle": 0.0,
            "gc_rounds": 2,
            "gather_repeats": 2,
        },
    )
    args = sizes.apply(args)
    for k in ("rollout_length", "rounds", "big_rounds", "memory_calls"):
        if getattr(args, k) < 1:
            p.error(f"--{k.replace('_', '-')} must be >= 1, got {getattr(args, k)}")
    for k in ("floor_repeats", "floor_idle", "gc_rounds", "gather_repeats"):
        if getattr(args, k) < 0:
            p.error(f"--{k.replace('_', '-')} must be >= 0, got {getattr(args, k)}")
    if args.prefetch:
        args.sampler_kwargs = {**args.sampler_kwargs, "prefetch": True}
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.devices_worker:
        print(MARK + json.dumps(devices_worker(json.loads(args.devices_worker))), flush=True)
        return 0
    before = json.loads(args.before.read_text()) if args.before else None
    if args.replot:
        res = json.loads(args.replot.read_text())
        out = args.out or args.replot.parent
        harness.finish(res, markdown(res, before), args.replot.stem, out,
                       plot=lambda r, path: plot(r, path, before))  # fmt: skip
        return 0
    from jaxsampler.cli.bench import environment_info

    started = time.perf_counter()
    main_cells, dev_cells = cells(args.quick)
    if args.cells:
        main_cells, dev_cells = ([c for c in cs if any(t in c.key for t in args.cells)]
                                 for cs in (main_cells, dev_cells))  # fmt: skip
    notes: list[str] = []
    rows = []
    for cell in main_cells if "cells" in args.parts else ():
        big = cell.env == "Spread" and cell.num_envs >= 1024
        log(f"{cell.key}: {', '.join(cell.sides)}")
        rounds = args.big_rounds if big else args.rounds
        rows.append(measure_cell(cell, args.rollout_length, rounds, args, notes))
        log("    " + ratios_line(rows[-1]))
        gc.collect()
    devices: dict[str, Any] = {}
    if "devices" in args.parts and dev_cells:
        log("2 devices vs 1 (subprocess): " + ", ".join(c.key for c in dev_cells))
        devices = run_devices(dev_cells, args.rollout_length, args.big_rounds, args)
        notes += [n for n in devices.pop("notes", []) if n not in notes]
    res: dict[str, Any] = {
        **harness.stamp("host side vs the bare rollout (issue 28)", NAME),
        "config": {
            "rollout_length": args.rollout_length,
            "rounds": args.rounds,
            "big_rounds": args.big_rounds,
            "memory_calls": args.memory_calls,
            "floor_repeats": args.floor_repeats,
            "floor_idle": args.floor_idle,
            "gather_repeats": args.gather_repeats,
            "parts": args.parts,
            "quick": args.quick,
            "sampler_kwargs": args.sampler_kwargs,
            "minatar_make_kwargs": args.minatar_make_kwargs,
            "minatar_sampler_kwargs": args.minatar_sampler_kwargs,
        },  # fmt: skip
        "environment": environment_info(),
        "git": harness.git_state(),
        "notes": notes,
        "cells": rows,
        "devices": devices,
    }
    res["targets"] = check_targets(res)
    res["wall_s"] = time.perf_counter() - started
    harness.finish(
        res,
        markdown(res, before),
        args.name,
        harness.results_dir(args.out, args.quick),
        plot=lambda r, path: plot(r, path, before),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
