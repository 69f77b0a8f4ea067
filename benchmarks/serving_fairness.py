"""Policy serving fairness: a normal client's small ``/batch`` while others flood big ones.

The finding: four connections flooding ``/batch`` with thousands of commands each starved a
normal client's 8-command ``/batch`` (1.7 s instead of 17 ms), because ``/batch`` ran whole
on a 4-thread pool in FIFO order. The server now runs ``/batch`` work in slices,
round-robin across connections.

Setup: a :class:`~jaxsampler.serving.server.PolicyServer` in a subprocess (so the code under
test is whatever ``PYTHONPATH`` holds: ``--before`` is the old tree, ``--after`` this one)
with an ExternalEnv (``obs`` float32 ``(4,)``, ``Discrete(2)``) and a thread that keeps
polling (the logged steps are consumed; the env's default back pressure). This process is
the client side, over loopback with keep-alive ``http.client`` connections: ``--flooders``
threads each send ``/batch`` requests of ``--big`` ``--flood-command`` commands
(``log_returns`` by default: cheap commands, so the batches keep the server's worker
threads busy rather than waiting on back pressure) back to back; after a ``--warmup``, a
normal client sends ``--samples`` ``/batch`` requests of ``--small`` ``log_action``
commands, one every ``--gap`` s, timing each round trip. The same normal client also runs
with no flood (``alone``). Each repeat runs ``before`` and ``after`` side by side (one
after the other, alternating which goes first). Reported per tree and mode: the median
over repeats of each run's median latency, and the 90th percentile and maximum of all
samples pooled (starvation shows in the tail); the slowdown flood / alone, and before /
after under flood.

Usage::

    python -m benchmarks.serving_fairness --before ../main   # writes results/serving_fairness.*
    python -m benchmarks.serving_fairness --before ../main --quick   # tiny run, prints only
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import harness
from benchmarks.harness import log
from jaxsampler.cli.bench import environment_info
from jaxsampler.episodes.codec import packb, unpackb

HERE = str(harness.ROOT)

SERVER = """
import sys, threading, time
from jaxsampler.host_envs.external import ExternalEnv
from jaxsampler.serving.server import PolicyServer
from jaxsampler.spaces import Box, Discrete

sampler_s = float(sys.argv[1])
env = ExternalEnv(Box(-1e6, 1e6, (4,)), Discrete(2))  # default back pressure
server = PolicyServer(env)
stop = threading.Event()

def drain():  # the sampler: consumes every logged step, taking sampler_s per poll
    while not stop.is_set():
        r = server.poll(timeout=0.05)
        if r.obs and sampler_s:
            time.sleep(sampler_s)  # a policy call
        server.send_actions({})

threading.Thread(target=drain, daemon=True).start()
print(server.address, flush=True)
sys.stdin.readline()
stop.set()
server.close()
"""


def batch_body(eid: str, n: int, command: str = "log_action") -> bytes:
    """A ``/batch`` body of ``n`` commands on episode ``eid``."""
    if command == "log_returns":
        cmd = {"command": "log_returns", "episode_id": eid, "reward": 1.0}
    else:
        cmd = {"command": "log_action", "episode_id": eid, "observation": np.zeros(4, np.float32)}
        cmd["action"] = 0
    return packb({"commands": [cmd] * n})


def post(conn: http.client.HTTPConnection, path: str, body: bytes) -> dict:
    conn.request("POST", path, body, {"Content-Type": "application/msgpack"})
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200:
        raise RuntimeError(f"{path}: HTTP {resp.status}: {data[:200]!r}")
    return unpackb(data)


def start_episode(conn: http.client.HTTPConnection, eid: str) -> None:
    post(conn, "/start_episode", packb({"episode_id": eid}))


def run_once(tree: str, args: argparse.Namespace, flood: bool) -> dict[str, Any]:
    """One server process from ``tree``; returns the normal client's latencies (s)."""
    env = {**os.environ, "PYTHONPATH": tree}
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(args.sampler_ms / 1e3)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        cwd=tree,  # `python -c` puts the working directory first on sys.path
        text=True,
    )
    try:
        address = proc.stdout.readline().strip()  # type: ignore[union-attr]
        host, port = address[len("http://") :].rsplit(":", 1)

        def connect() -> http.client.HTTPConnection:
            return http.client.HTTPConnection(host, int(port), timeout=120)

        stop = threading.Event()
        flood_batches = [0] * args.flooders

        def flooder(i: int) -> None:
            conn = connect()
            start_episode(conn, f"flood{i}")
            body = batch_body(f"flood{i}", args.big, args.flood_command)
            while not stop.is_set():
                post(conn, "/batch", body)
                flood_batches[i] += 1
            conn.close()

        threads = [threading.Thread(target=flooder, args=(i,)) for i in range(args.flooders)]
        t_flood = time.perf_counter()
        if flood:
            for t in threads:
                t.start()
        normal = connect()
        start_episode(normal, "normal")
        body = batch_body("normal", args.small)
        post(normal, "/batch", body)  # warm
        time.sleep(args.warmup)
        lat = []
        for _ in range(args.samples):
            t0 = time.perf_counter()
            res = post(normal, "/batch", body)
            lat.append(time.perf_counter() - t0)
            assert res["done"] == args.small, res
            time.sleep(args.gap)
        stop.set()
        window_s = time.perf_counter() - t_flood
        for t in threads:
            if t.is_alive():
                t.join(120)
        normal.close()
        return {
            "latencies_s": lat,
            "median_s": statistics.median(lat),
            "flood_batches": sum(flood_batches),
            "flood_batches_per_s": sum(flood_batches) / window_s,
        }
    finally:
        proc.communicate("\n", timeout=60)


def fmt_ms(s: float) -> str:
    return f"{s * 1e3:.1f}"


#: name -> (what it shows, settings). ``cheap``: the flood is CPU-bound (cheap commands,
#: no back pressure): every server is limited by the GIL it shares with its sampler.
#: ``backpressure``: the flood logs steps faster than the sampler (2 ms a poll) takes them,
#: so the env's back pressure makes flooding commands wait; the old server waited on its
#: 4 worker threads, which the normal client's batch then queued behind (8 flooding
#: connections: with exactly 4 a thread is often free between one flood batch and the next).
SCENARIOS: dict[str, dict[str, Any]] = {
    "cheap": {"flood_command": "log_returns", "big": 4096, "sampler_ms": 0.0, "samples": 60},
    "backpressure": {
        "flood_command": "log_action",
        "big": 512,
        "sampler_ms": 2.0,
        "samples": 20,
        "flooders": 8,
    },
}


def run_scenario(
    trees: dict[str, str], args: argparse.Namespace
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Runs both trees ``args.repeats`` times, alone and under flood: (summary, raw runs)."""
    runs: dict[str, dict[str, list]] = {k: {"alone": [], "flood": []} for k in trees}
    for r in range(args.repeats):
        order = list(trees) if r % 2 == 0 else list(trees)[::-1]
        for name in order:
            for mode in ("alone", "flood"):
                res = run_once(trees[name], args, flood=mode == "flood")
                runs[name][mode].append(res)
                log(
                    f"{args.scenario} repeat {r} {name:6s} {mode:5s}: "
                    f"median {fmt_ms(res['median_s'])} ms"
                )
    summary: dict[str, Any] = {}
    for name in trees:
        summary[name] = {}
        for mode in ("alone", "flood"):
            pooled = [t for x in runs[name][mode] for t in x["latencies_s"]]
            summary[name][mode] = {
                "median_s": statistics.median(x["median_s"] for x in runs[name][mode]),
                "p90_s": float(np.percentile(pooled, 90)),
                "max_s": max(pooled),
                "flood_batches_per_s": statistics.median(
                    x["flood_batches_per_s"] for x in runs[name][mode]
                ),
            }
        summary[name]["slowdown"] = (
            summary[name]["flood"]["median_s"] / summary[name]["alone"]["median_s"]
        )
    summary["flood_before_over_after"] = {
        k: summary["before"]["flood"][k] / summary["after"]["flood"][k]
        for k in ("median_s", "p90_s", "max_s")
    }
    return summary, runs


def scenario_markdown(name: str, args: argparse.Namespace, summary: dict[str, Any]) -> list[str]:
    md = [
        f"## `{name}`: {args.flooders} connections flood `/batch` of {args.big} "
        f"`{args.flood_command}`; sampler {args.sampler_ms:g} ms a poll",
        "",
        f"Normal client: `/batch` of {args.small} `log_action`, {args.samples} samples a run, "
        f"{args.repeats} repeats.",
        "",
        "| server | mode | median ms | p90 ms | max ms | flood batches/s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for tree in ("before", "after"):
        for mode in ("alone", "flood"):
            s = summary[tree][mode]
            rate = f"{s['flood_batches_per_s']:.1f}" if mode == "flood" else "-"
            md.append(
                f"| {tree} | {mode} | **{fmt_ms(s['median_s'])}** | {fmt_ms(s['p90_s'])} | "
                f"{fmt_ms(s['max_s'])} | {rate} |"
            )
    r = summary["flood_before_over_after"]
    md += [
        "",
        "Slowdown under flood (median flood / median alone): "
        + ", ".join(f"{t} {summary[t]['slowdown']:.1f}x" for t in ("before", "after"))
        + f". Under flood, before / after: median **{r['median_s']:.1f}x**, "
        f"p90 **{r['p90_s']:.1f}x**, max **{r['max_s']:.1f}x**.",
        "",
    ]
    return md


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", required=True, help="source tree of the old server (PYTHONPATH)")
    p.add_argument("--after", default=HERE, help="source tree of the new server (this one)")
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    p.add_argument("--flooders", type=int, default=4, help="unless the scenario sets it")
    p.add_argument("--small", type=int, default=8, help="commands per normal /batch")
    p.add_argument("--gap", type=float, default=0.05, help="s between normal requests")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="1 repeat, 4 samples; prints only")
    p.add_argument("--out", type=Path, default=harness.RESULTS_DIR)
    args = p.parse_args()
    trees = {"before": args.before, "after": args.after}
    t_start = time.monotonic()
    date = harness.now()
    results: dict[str, Any] = {
        "date": date,
        "command": harness.command("serving_fairness"),
        "config": {k: str(v) for k, v in vars(args).items()},
        "environment": environment_info(),
        "git": harness.git_state(),
        "scenarios": {},
    }
    md_body: list[str] = []
    for name in args.scenarios:
        sargs = argparse.Namespace(**{**vars(args), "scenario": name, **SCENARIOS[name]})
        if args.quick:
            sargs.repeats, sargs.samples = 1, 4
        summary, runs = run_scenario(trees, sargs)
        results["scenarios"][name] = {"settings": SCENARIOS[name], "summary": summary, "runs": runs}
        md_body += scenario_markdown(name, sargs, summary)
    results["wall_s"] = time.monotonic() - t_start
    md = [
        "# Policy serving: /batch fairness under a flood",
        "",
        f"{date} · `{results['command']}` · {os.cpu_count()} CPUs · wall {results['wall_s']:.0f} s",
        "",
        "Round trip of a normal client's small `/batch` while other connections flood big "
        "ones, in ms: median = median over repeats of each run's median; p90 and max over "
        "all samples pooled. `before`: the server of `--before` (each `/batch` whole, FIFO on "
        "a 4-thread pool, waiting there under back pressure); `after`: small batches at once "
        "on the event loop, big ones in slices round-robin across connections, waits under "
        "back pressure moved off the batch pool.",
        "",
        *md_body,
    ]
    harness.finish(results, "\n".join(md), "serving_fairness", None if args.quick else args.out)


if __name__ == "__main__":
    main()
