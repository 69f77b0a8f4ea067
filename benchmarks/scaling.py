"""Scaling on one machine: actions/s of the CartPole rollout on 1-2 devices and 1-2 processes.

Every row runs CartPole-v1 with the 64x64 tanh actor-critic ``MLPPolicy`` (the policy of
``throughput.py``) for ``T`` steps per call. ``W`` is the width **per process or per
device** (the unit that is multiplied): the 2-device and 2-process rows step ``2 W`` envs
in all, so a perfect row does twice the single row's actions/s and ``efficiency =
actions/s / (N x single)`` is 1.

Rows (``N`` = devices x processes):

* ``rollout_1p1d``: ``jit_rollout(make_rollout(env, policy, W, T))``, one process with one
  XLA CPU device: the single for every jaxsampler row.
* ``rollout_1p2d``: the same over ``mesh=2`` (``2 W`` envs), one process with two forced
  XLA CPU devices (``--xla_force_host_platform_device_count=2``).
* ``rollout_2p1d`` / ``rollout_2p1d_pinned``: two ``jax.distributed`` processes on
  127.0.0.1 (``jaxsampler.rollout.distributed.initialize()``, gloo), one CPU device each, one
  rollout over the global mesh (``2 W`` envs, each process stepping its ``W``), called in
  lockstep; ``_pinned``: each process bound to its own core (``os.sched_setaffinity``
  before JAX starts).
* ``rollout_2x_pinned``: two pinned processes each running its own 1-device rollout,
  no communication: the ceiling the distributed rows could reach.
* ``hand_1p`` / ``hand_2x_pinned``: the hand-written PureJaxRL loop of ``throughput.py``
  (:func:`benchmarks.baselines.gymnax_cartpole`: ``vmap`` over gymnax CartPole + the same
  MLP in one jitted scan), in
  one process, and in two pinned processes with no communication (the issue's
  "hand-written 2 pinned processes" reference).
* ``sampler_1d`` / ``sampler_2d``: end to end, ``js.Sampler(env, policy,
  num_envs=W x d, rollout_length=T, devices=d).sample_batch(params)`` (conversion to a
  ``MultiAgentBatch`` included); skipped, with the reason, if ``Sampler`` does not take
  ``devices=``.

Method: each configuration is a group of worker processes (this module with ``--worker``)
started once; each compiles its rows, reports one call's time, and then times rounds on
the parent's command. Rounds go through every row in a rotating order, so every row sees
the same machine noise; a row's figure is the median over rounds of its median call time
within a round, and a speedup is the median over rounds of the within-round ratio to the
single. Both processes of a 2-process row run a round at the same time (a distributed
rollout needs both; independent ones compete for the cores as they would in use).
jaxsampler actions/s counts acting steps only (the step after an episode end is a reset
step with no action); the hand-written loop resets within the step, so all its steps are
actions; the sampler counts the env steps in the batch.

Usage::

    python -m benchmarks.scaling                  # full run (~5 min on 2 cores), writes results/
    python -m benchmarks.scaling --quick          # smoke test (W=16, T=8), prints only
    python -m benchmarks.scaling --quick --out /tmp/sc   # ... and writes json/md/png there
    python -m benchmarks.scaling --widths 1024 --repeats 9 --no-sampler
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

# The parent process never imports JAX (the harness does not either): workers pin
# themselves to a core before JAX starts (XLA sizes its thread pool from the cores it may use).
from benchmarks import harness

MARK = "@@scaling "
ENV_ID = "CartPole-v1"
DEFAULT_WIDTHS = (1024, 16384)
SIZES = harness.Sizes(
    full={"widths": list(DEFAULT_WIDTHS), "rollout_length": 128, "repeats": 7, "target_s": 0.3},
    quick={"widths": [16], "rollout_length": 8, "repeats": 2, "target_s": 0.02},
)

LABELS = {
    "rollout_1p1d": "jaxsampler rollout, 1 process x 1 device",
    "rollout_1p2d": "jaxsampler rollout, 1 process x 2 devices (mesh=2)",
    "rollout_2p1d": "jaxsampler rollout, 2 processes x 1 device (jax.distributed)",
    "rollout_2p1d_pinned": "jaxsampler rollout, 2 processes x 1 device, pinned",
    "rollout_2x_pinned": "jaxsampler rollout, 2 independent pinned processes",
    "hand_1p": "hand-written vmap+scan, 1 process",
    "hand_2x_pinned": "hand-written vmap+scan, 2 independent pinned processes",
    "sampler_1d": "Sampler.sample_batch, devices=1",
    "sampler_2d": "Sampler.sample_batch, devices=2",
}
#: row -> (the single it is compared with, N)
BASELINE = {
    "rollout_1p1d": ("rollout_1p1d", 1),
    "rollout_1p2d": ("rollout_1p1d", 2),
    "rollout_2p1d": ("rollout_1p1d", 2),
    "rollout_2p1d_pinned": ("rollout_1p1d", 2),
    "rollout_2x_pinned": ("rollout_1p1d", 2),
    "hand_1p": ("hand_1p", 1),
    "hand_2x_pinned": ("hand_1p", 2),
    "sampler_1d": ("sampler_1d", 1),
    "sampler_2d": ("sampler_1d", 2),
}
TARGETS = (
    ("rollout_2p1d", 1024, 1.7, "2 processes >= 1.7x one process at W=1024"),
    ("rollout_2p1d_pinned", 1024, 1.7, "2 pinned processes >= 1.7x one process at W=1024"),
    ("sampler_2d", None, 1.6, "Sampler.sample_batch on 2 devices >= 1.6x one device"),
)


@dataclass(frozen=True)
class Group:
    """Worker processes started together: ``processes`` copies of one worker."""

    name: str
    rows: tuple[str, ...]
    processes: int = 1
    devices: int = 1
    distributed: bool = False
    pinned: bool = False


def groups(sampler: bool) -> list[Group]:
    """The configurations, each a group of workers (rows that share a process layout)."""
    one = ("rollout_1p1d", "hand_1p") + (("sampler_1d",) if sampler else ())
    two = ("rollout_1p2d",) + (("sampler_2d",) if sampler else ())
    return [
        Group("1p1d", one),
        Group("1p2d", two, devices=2),
        Group("2p1d", ("rollout_2p1d",), processes=2, distributed=True),
        Group("2p1d_pinned", ("rollout_2p1d_pinned",), processes=2, distributed=True, pinned=True),
        Group("2x_pinned", ("rollout_2x_pinned", "hand_2x_pinned"), processes=2, pinned=True),
    ]


# --------------------------------------------------------------------------- worker side


def _send(msg: dict[str, Any]) -> None:
    print(MARK + json.dumps(msg), flush=True)


class _Row:
    """One measurable thing in a worker: ``call()`` runs one timed call."""

    def __init__(self, call: Any, steps: int, acted: Any):
        self.call, self.steps, self.acted = call, steps, acted


def _rollout_row(width: int, T: int, mesh: Any) -> _Row:
    import jax

    import jaxsampler as js
    from jaxsampler.rollout import placement

    env: Any = js.make(ENV_ID)
    policy = js.MLPPolicy(env.observation_space, env.action_space, (64, 64))
    params = policy.init(jax.random.PRNGKey(0))
    rollout = js.jit_rollout(js.make_rollout(env, policy, width, T, mesh=mesh))
    box: dict[str, Any] = {"state": rollout.init(jax.random.PRNGKey(1))}
    box["state"], box["traj"] = rollout(params, box["state"])
    jax.block_until_ready(box["traj"])
    count = jax.jit(lambda acting: acting.sum())

    def call() -> Any:
        box["state"], box["traj"] = rollout(params, box["state"], box["traj"])
        return box["traj"]

    def acted() -> int:
        return int(placement.to_host(count(box["traj"].acting)))

    return _Row(call, width * T, acted)


def _hand_row(width: int, T: int) -> _Row:
    import jax

    from benchmarks.baselines import gymnax_cartpole, policy_params  # throughput.py's loop

    run, carry = gymnax_cartpole(width, T)
    params = policy_params()
    box: dict[str, Any] = {"carry": carry}
    box["carry"], out = run(params, box["carry"])
    jax.block_until_ready(out)

    def call() -> Any:
        box["carry"], out = run(params, box["carry"])
        return out

    return _Row(call, width * T, lambda: width * T)


def _sampler_row(width: int, T: int, devices: int) -> _Row:
    import jax

    import jaxsampler as js

    env = js.make(ENV_ID)
    policy = js.MLPPolicy(env.observation_space, env.action_space, (64, 64))
    params = policy.init(jax.random.PRNGKey(0))
    make_sampler: Any = js.Sampler  # devices= is new: checked by calling it
    sampler = make_sampler(env, policy, num_envs=width, rollout_length=T, devices=devices)
    box: dict[str, Any] = {"batch": sampler.sample_batch(params)}

    def call() -> Any:
        box["batch"] = sampler.sample_batch(params)
        return None

    return _Row(call, width * T, lambda: int(box["batch"].env_steps()))


def _build(row: str, width: int, T: int, devices: int) -> _Row:
    if row in ("rollout_1p1d", "rollout_2x_pinned"):
        return _rollout_row(width, T, None)
    if row == "rollout_1p2d":
        return _rollout_row(2 * width, T, 2)
    if row in ("rollout_2p1d", "rollout_2p1d_pinned"):
        import jax

        return _rollout_row(width * jax.process_count(), T, jax.device_count())
    if row in ("hand_1p", "hand_2x_pinned"):
        return _hand_row(width, T)
    if row in ("sampler_1d", "sampler_2d"):
        return _sampler_row(width * devices, T, devices)
    raise ValueError(f"unknown row {row!r}; rows: {', '.join(LABELS)}")


def worker(rows: Sequence[str], widths: Sequence[int], T: int, pin: int | None) -> None:
    """A worker process: builds its rows, reports, then answers round commands on stdin."""
    if pin is not None:
        os.sched_setaffinity(0, {pin})
    import jax

    import jaxsampler.rollout.distributed
    from jaxsampler.cli.bench import environment_info

    jaxsampler.rollout.distributed.initialize()
    built: dict[str, _Row] = {}
    skipped: dict[str, str] = {}
    first: dict[str, float] = {}
    for row in rows:
        for w in widths:
            key = f"{row}@{w}"
            try:
                t0 = time.perf_counter()
                built[key] = _build(row, w, T, jax.local_device_count())
                compile_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                jax.block_until_ready(built[key].call())
                first[key] = time.perf_counter() - t0
                _send({"event": "built", "key": key, "compile_s": compile_s})
            except TypeError as e:
                if not row.startswith("sampler"):
                    raise
                skipped[row] = f"js.Sampler(..., devices=) is not accepted yet: {e}"
                break
    _send(
        {
            "event": "ready",
            "call_s": first,
            "skipped": skipped,
            "env": environment_info(),
            "process_index": jax.process_index(),
        }
    )
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        r = built[cmd["key"]]
        times = []
        for _ in range(int(cmd["inner"])):
            t0 = time.perf_counter()
            jax.block_until_ready(r.call())
            times.append(time.perf_counter() - t0)
        _send({"event": "round", "times": times, "steps": r.steps, "acted": r.acted()})


# --------------------------------------------------------------------------- parent side


class Proc:
    """One worker process: JSON commands on stdin, marked JSON lines back on stdout."""

    def __init__(self, group: Group, index: int, args: argparse.Namespace, env: dict[str, str]):
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.scaling",
            "--worker",
            ",".join(group.rows),
            "--widths",
            *map(str, args.widths),
            "--rollout-length",
            str(args.rollout_length),
        ]
        if group.pinned:
            cmd += ["--pin", str(index % (os.cpu_count() or 1))]
        self.log: IO[str] = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed by close())
        self.p = subprocess.Popen(
            cmd,
            cwd=harness.ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        self.name = f"{group.name}[{index}]"

    def recv(self, timeout: float) -> dict[str, Any]:
        assert self.p.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.p.stdout.readline()
            if not line:
                self.log.seek(0)
                raise RuntimeError(
                    f"worker {self.name} exited {self.p.wait()}:\n{self.log.read()[-4000:]}"
                )
            if line.startswith(MARK):
                msg: dict[str, Any] = json.loads(line[len(MARK) :])
                if msg["event"] != "built":
                    return msg
                harness.log(f"  {self.name} built {msg['key']} in {msg['compile_s']:.1f} s")
        raise TimeoutError(f"worker {self.name} did not answer within {timeout:.0f} s")

    def send(self, msg: dict[str, Any]) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(json.dumps(msg) + "\n")
        self.p.stdin.flush()

    def quit(self) -> None:
        if self.p.poll() is None:
            with contextlib.suppress(OSError):
                self.send({"op": "quit"})

    def close(self) -> None:
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.log.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_group(group: Group, args: argparse.Namespace) -> list[Proc]:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("JAXSAMPLER_") and k not in ("XLA_FLAGS", "JAX_PLATFORMS")
    }
    base.update(
        PYTHONPATH=str(harness.ROOT),
        JAX_PLATFORMS="cpu",
        OPENBLAS_NUM_THREADS="1",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={group.devices}",
    )
    port = _free_port()
    procs = []
    for i in range(group.processes):
        env = dict(base)
        if group.distributed:
            env.update(
                JAXSAMPLER_COORDINATOR=f"127.0.0.1:{port}",
                JAXSAMPLER_NUM_PROCESSES=str(group.processes),
                JAXSAMPLER_PROCESS_ID=str(i),
            )
        procs.append(Proc(group, i, args, env))
    return procs


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Starts every group, times ``args.repeats`` rounds of every row, returns the results."""
    t_start = time.perf_counter()
    started: list[tuple[Group, list[Proc]]] = []
    ready: dict[str, list[dict[str, Any]]] = {}
    try:
        chosen = [g for g in groups(args.sampler) if args.groups is None or g.name in args.groups]
        for g in chosen:  # all at once: their imports and compiles overlap
            harness.log(f"starting {g.name}: {g.processes} process(es) x {g.devices} device(s)")
            started.append((g, start_group(g, args)))
        for g, procs in started:
            ready[g.name] = [p.recv(args.worker_timeout) for p in procs]
        skipped: dict[str, str] = {}
        for msgs in ready.values():
            for m in msgs:
                skipped.update(m["skipped"])
        for row, why in skipped.items():
            harness.log(f"skipping {row}: {why}")
        cells = [
            (g, procs, row, w)
            for g, procs in started
            for row in g.rows
            if row not in skipped
            for w in args.widths
        ]
        inner = {}
        for g, _, row, w in cells:
            call_s = max(m["call_s"][f"{row}@{w}"] for m in ready[g.name])
            inner[row, w] = max(1, math.ceil(args.target_s / max(call_s, 1e-6)))
        raw: dict[str, dict[str, list[Any]]] = {}
        for r in range(args.repeats):
            harness.log(f"round {r + 1}/{args.repeats}")
            for _, procs, row, w in harness.rotated(cells, r):
                key = f"{row}@{w}"
                for p in procs:
                    p.send({"op": "round", "key": key, "inner": inner[row, w]})
                replies = [p.recv(args.worker_timeout) for p in procs]
                raw.setdefault(row, {}).setdefault(str(w), []).append(
                    {
                        "times_s": [m["times"] for m in replies],
                        "steps": [m["steps"] for m in replies],
                        "acted": [m["acted"] for m in replies],
                    }
                )
    finally:  # every process told first: a distributed one waits for its peer to leave
        every = [p for _, procs in started for p in procs]
        for p in every:
            p.quit()
        for p in every:
            p.close()
    rows = summarize(raw, distributed={r for g in groups(True) if g.distributed for r in g.rows})
    return {
        **harness.stamp("scaling", "scaling"),
        "note": args.note,
        "config": {
            "env_id": ENV_ID,
            "policy": "MLPPolicy (64, 64) tanh actor-critic",
            "widths_per_unit": list(args.widths),
            "rollout_length": args.rollout_length,
            "repeats": args.repeats,
            "target_s_per_round": args.target_s,
            "inner_calls": {f"{r}@{w}": n for (r, w), n in inner.items()},
            "width_note": "W is per process or per device: N-unit rows step N x W envs",
        },
        "labels": {r: LABELS[r] for r in raw},
        "skipped": skipped,
        "environment": {g: [m["env"] for m in msgs] for g, msgs in ready.items()},
        "rows": rows,
        "targets": check_targets(rows, args.widths),
        "raw": raw,
        "wall_s": time.perf_counter() - t_start,
    }


def _throughput(rnd: dict[str, Any], distributed: bool) -> float:
    """Actions/s of one round of one row (all its processes)."""
    per = [
        acted / statistics.median(times)
        for times, acted in zip(rnd["times_s"], rnd["acted"], strict=True)
    ]
    if distributed:  # one global rollout: every process's call covers all envs
        return rnd["acted"][0] / max(statistics.median(t) for t in rnd["times_s"])
    return sum(per)


def summarize(raw: dict[str, dict[str, list[Any]]], distributed: set[str]) -> dict[str, Any]:
    """Per row and width: median actions/s, speedup (median of within-round ratios to its
    single) and efficiency = speedup / N."""
    out: dict[str, Any] = {}
    for row, by_w in raw.items():
        base, n = BASELINE[row]
        for w, rounds in by_w.items():
            tp = [_throughput(r, row in distributed) for r in rounds]
            cell: dict[str, Any] = {
                "actions_per_s": statistics.median(tp),
                "actions_per_s_rounds": tp,
                "n": n,
                "baseline": base,
            }
            if base in raw and w in raw[base]:
                single = [_throughput(r, False) for r in raw[base][w]]
                cell["speedup"] = harness.paired_ratio(tp, single)
                cell["efficiency"] = cell["speedup"] / n
            out.setdefault(row, {})[w] = cell
    return out


def check_targets(rows: dict[str, Any], widths: Sequence[int]) -> list[dict[str, Any]]:
    out = []
    for row, w, goal, text in TARGETS:
        for width in [w] if w is not None else widths:
            cell = rows.get(row, {}).get(str(width))
            if cell is None or "speedup" not in cell:
                continue
            out.append(
                {
                    "target": text,
                    "row": row,
                    "width": width,
                    "goal": goal,
                    "speedup": cell["speedup"],
                    "met": cell["speedup"] >= goal,
                }
            )
    return out


# --------------------------------------------------------------------------- reports


def markdown(res: dict[str, Any]) -> str:
    cfg = res["config"]
    widths = [str(w) for w in cfg["widths_per_unit"]]
    env0 = next(iter(res["environment"].values()))[0]
    lines = [
        "# Scaling: CartPole-v1 + 64x64 MLP rollout on 1-2 devices and 1-2 processes",
        "",
        f"{res['date']}, `{res['command']}`. T = {cfg['rollout_length']}, {cfg['repeats']} "
        f"rounds, jax {env0['jax']}, {env0['cpu_count']} CPU cores ({env0['processor']}). "
        "W is per process or per device: the 2-unit rows step 2 W envs. Speedup = median over "
        "rounds of the within-round ratio to the row's single; efficiency = speedup / N."
        + (f" {res['note']}" if res.get("note") else ""),
        "",
        "| row | N | " + " | ".join(f"W={w}: actions/s | speedup | eff." for w in widths) + " |",
        "|---|---|" + "---|---|---|" * len(widths),
    ]
    for row, by_w in res["rows"].items():
        cells = []
        for w in widths:
            c = by_w.get(w)
            if c is None:
                cells += ["-", "-", "-"]
                continue
            cells += [
                harness.si(c["actions_per_s"], 2),
                f"{c['speedup']:.2f}x" if "speedup" in c else "-",
                f"{c['efficiency']:.0%}" if "efficiency" in c else "-",
            ]
        n = next(iter(by_w.values()))["n"]
        lines.append(f"| {res['labels'][row]} | {n} | " + " | ".join(cells) + " |")
    if res["skipped"]:
        lines += ["", "Skipped:", ""]
        lines += [f"- `{row}`: {why}" for row, why in res["skipped"].items()]
    if res["targets"]:
        lines += ["", "| target | W | speedup | met |", "|---|---|---|---|"]
        for t in res["targets"]:
            met = "yes" if t["met"] else "no"
            lines.append(f"| {t['target']} | {t['width']} | {t['speedup']:.2f}x | {met} |")
    lines.append("")
    return "\n".join(lines)


def plot(res: dict[str, Any], path: Path) -> None:
    """Grouped bars: actions/s per row, one bar per width, efficiency written on each."""
    plt = harness.pyplot()
    from matplotlib.ticker import FuncFormatter

    rows = list(res["rows"])
    widths = [str(w) for w in res["config"]["widths_per_unit"]]
    fig, ax = plt.subplots(figsize=(12, 6.5))
    bw = 0.8 / len(widths)
    for j, w in enumerate(widths):
        xs, ys, effs = [], [], []
        for i, row in enumerate(rows):
            c = res["rows"][row].get(w)
            if c is not None:
                xs.append(i + (j - (len(widths) - 1) / 2) * bw)
                ys.append(c["actions_per_s"] / 1e6)
                effs.append(c.get("efficiency"))
        bars = ax.bar(xs, ys, bw, label=f"W = {w} per process / device")
        for b, e in zip(bars, effs, strict=True):
            if e is not None and e != 1.0:
                ax.annotate(
                    f"{e:.0%}",
                    (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=8,
                )
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(
        [textwrap.fill(res["labels"][r], 22) for r in rows],
        fontsize=7,
        rotation=30,
        ha="right",
        rotation_mode="anchor",
    )
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_ylabel("actions per second (millions)")
    ax.set_xlabel("configuration (labels on bars: efficiency = actions/s / (N x single))")
    env0 = next(iter(res["environment"].values()))[0]
    ax.set_title(
        f"CartPole-v1 + 64x64 MLP, T={res['config']['rollout_length']}: scaling over devices "
        f"and processes\n{env0['cpu_count']}-core CPU ({env0['processor']}), jax "
        f"{env0['jax']}, {res['date'][:10]}"
    )
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--widths", type=int, nargs="+", help="W per unit (default 1024 16384)")
    ap.add_argument("--rollout-length", type=int, help="T (default 128)")
    ap.add_argument("--repeats", type=int, help="rounds (default 7)")
    ap.add_argument("--target-s", type=float, help="seconds per row per round (default 0.3)")
    ap.add_argument("--no-sampler", dest="sampler", action="store_false")
    ap.add_argument(
        "--groups",
        nargs="+",
        default=None,
        choices=[g.name for g in groups(True)],
        help="run only these configurations (default: all)",
    )
    harness.add_quick_out(ap, "scaling", quick="tiny smoke test; prints")
    ap.add_argument("--note", default="", help="free text recorded with the results")
    ap.add_argument("--worker-timeout", type=float, default=600.0)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--pin", type=int, default=None, help=argparse.SUPPRESS)
    args = SIZES.apply(ap.parse_args(argv))  # --quick: the quick values, unless given
    if any(w < 1 for w in args.widths) or args.rollout_length < 1 or args.repeats < 1:
        ap.error("--widths, --rollout-length and --repeats must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker is not None:
        worker(args.worker.split(","), args.widths, args.rollout_length, args.pin)
        return
    res = run_benchmark(args)
    harness.finish(
        res, markdown(res), "scaling", harness.results_dir(args.out, args.quick), plot=plot
    )


if __name__ == "__main__":
    main()
