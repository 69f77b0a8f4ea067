"""The simulated clients of the serving benchmarks (``serving.py``, ``serving_stacks.py``).

A client is a thread running CartPole-shaped episodes against an ExternalEnv or a
``PolicyClient``: ``start_episode``, then per step one blocking ``get_action`` (timed) and one
``log_returns``, then ``end_episode``. A phase (:func:`run_phase`) runs some clients for a
warm-up and a timed window and measures the window: actions/s, the latencies of every
``get_action`` that returned in it, CPU time, errors. Phases run in this process
(:func:`run_phase_here`) or dealt over client processes (:class:`WorkerPool`: each one is
``python -m benchmarks.serving_client ADDRESS``, taking phase commands as JSON lines on
stdin). :func:`keep_round` files a timed phase's result. :class:`Phases` holds the settings
the serving benchmarks share, :func:`add_arguments` their command-line options and
:func:`sizes` their defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from benchmarks import harness

JOIN_TIMEOUT_S = 15.0
#: Sizes both serving benchmarks share (each adds its rounds, duration and what it compares).
FULL = {"clients": [1, 8, 64], "warmup": 0.5, "episode_len": 50, "sample_timesteps": 4096}
QUICK = {
    "clients": [1, 8, 64],
    "rounds": 1,
    "warmup": 0.2,
    "episode_len": 50,
    "sample_timesteps": 256,
}


def sizes(full: dict[str, Any], quick: dict[str, Any]) -> harness.Sizes:
    """The shared sizes with a benchmark's own (``rounds``, ``duration``, ...)."""
    return harness.Sizes({**FULL, **full}, {**QUICK, **quick})


def add_arguments(p: argparse.ArgumentParser, name: str, sizes: harness.Sizes) -> None:
    """The options of a serving benchmark's phases (defaults: ``sizes``), ``--quick`` and
    ``--out``."""
    full = sizes.full
    p.add_argument(
        "--clients",
        type=int,
        nargs="+",
        help=f"concurrent client counts (default {' '.join(map(str, full['clients']))})",
    )
    p.add_argument(
        "--rounds",
        type=int,
        help=f"rounds; each runs every client count once (default {full['rounds']})",
    )
    p.add_argument(
        "--duration",
        type=float,
        help=f"timed seconds per cell and round (default {full['duration']})",
    )
    p.add_argument(
        "--warmup",
        type=float,
        help=f"untimed seconds before each timed window (default {full['warmup']})",
    )
    p.add_argument(
        "--episode-len", type=int, help=f"steps per client episode (default {full['episode_len']})"
    )
    p.add_argument(
        "--sample-timesteps",
        type=int,
        help=f"num_timesteps of each sample_batch call (default {full['sample_timesteps']})",
    )
    p.add_argument(
        "--max-wait-ms", type=float, default=2.0, help="ExternalEnv batching wait (default 2 ms)"
    )
    p.add_argument(
        "--client-procs",
        type=int,
        default=4,
        help="client processes the HTTP clients are dealt over (default 4)",
    )
    p.add_argument("--seed", type=int, default=0)
    harness.add_quick_out(p, name)


# --------------------------------------------------------------------------- clients


def client_observations(client: int, episode_len: int, seed: int) -> np.ndarray:
    """``[episode_len + 1, 4]`` float32 CartPole-range observations of one client (fixed per
    client)."""
    rng = np.random.default_rng([seed, client])
    scale = np.array([1.0, 0.5, 0.1, 0.5], np.float32)
    return np.clip(rng.standard_normal((episode_len + 1, 4)) * scale, -2.0, 2.0).astype(np.float32)


def client_thread(
    factory: Callable[[], Any],
    obs: np.ndarray,
    stop: threading.Event,
    rec: list,
    errors: list,
    cpu: list,
) -> None:
    """Episode loop of one simulator: ``start_episode``, then per step ``get_action`` (timed)
    and ``log_returns``; ``end_episode`` at the end (truncated when stopped mid-episode).
    Appends ``(t_returned, latency_s)`` of every ``get_action`` to ``rec`` and the thread's
    CPU time to ``cpu``."""
    client = None
    cpu0 = time.thread_time()
    try:
        client = factory()
        episode_len = len(obs) - 1
        clock = time.perf_counter
        while not stop.is_set():
            eid = client.start_episode()
            t = 0
            while t < episode_len and not stop.is_set():
                t0 = clock()
                client.get_action(eid, obs[t])
                t1 = clock()
                rec.append((t1, t1 - t0))
                client.log_returns(eid, 1.0)
                t += 1
            client.end_episode(eid, obs[t], truncated=t < episode_len)
    except Exception as e:
        errors.append(f"{type(e).__name__}: {e}")
    finally:
        close = getattr(client, "close", None)
        if close is not None and not hasattr(client, "poll"):  # a PolicyClient, not the shared env
            close()
        cpu.append(time.thread_time() - cpu0)


def run_phase(
    factory: Callable[[], Any],
    clients: int,
    warmup_s: float,
    duration_s: float,
    episode_len: int,
    seed: int,
    mark: Callable[[str], None] | None = None,
    first_client: int = 0,
) -> dict[str, Any]:
    """Runs ``clients`` client threads for ``warmup_s + duration_s`` and measures the window.

    ``mark("start")`` / ``mark("end")`` are called at the window's edges (server-side
    counters are read there). Returns actions/s, per-client counts, the raw latencies (s)
    of the window, the process CPU time in cores, errors and hung threads.
    """
    stop = threading.Event()
    recs: list[list] = [[] for _ in range(clients)]
    errors: list[str] = []
    cpu: list[float] = []
    threads = [
        threading.Thread(
            target=client_thread,
            name=f"client-{i}",
            daemon=True,
            args=(
                factory,
                client_observations(first_client + i, episode_len, seed),
                stop,
                recs[i],
                errors,
                cpu,
            ),
        )
        for i in range(clients)
    ]
    for th in threads:
        th.start()
    time.sleep(warmup_s)
    if mark:
        mark("start")
    t0, c0 = time.perf_counter(), time.process_time()
    time.sleep(duration_s)
    t1, c1 = time.perf_counter(), time.process_time()
    if mark:
        mark("end")
    stop.set()
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    for th in threads:
        th.join(max(0.0, deadline - time.monotonic()))
    hung = sum(th.is_alive() for th in threads)
    per_client = [sum(1 for td, _ in r if t0 <= td < t1) for r in recs]
    lat = [lat for r in recs for td, lat in r if t0 <= td < t1]
    wall = t1 - t0
    return {
        "clients": clients,
        "window_s": wall,
        "actions": len(lat),
        "actions_per_s": len(lat) / wall,
        "per_client_actions": per_client,
        "latencies_s": lat,
        "cpu_cores": (c1 - c0) / wall,
        "client_cpu_us_per_action": 1e6 * sum(cpu) / max(1, sum(len(r) for r in recs)),
        "errors": errors[:5],
        "num_errors": len(errors),
        "hung_threads": hung,
    }


def worker(address: str) -> None:
    """A client process: runs phases of PolicyClient threads on command (JSON lines on stdin)."""
    from jaxsampler.serving.client import PolicyClient

    def say(msg: dict) -> None:
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()

    say({"event": "ready"})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("quit"):
            break
        res = run_phase(
            lambda: PolicyClient(address), **cmd, mark=lambda what: say({"event": what})
        )
        say({"event": "result", "result": res})


# --------------------------------------------------------------------------- processes


class Worker:
    """A client process (``python -m benchmarks.serving_client ADDRESS``), driven over its
    stdin and stdout."""

    def __init__(self, address: str):
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.serving_client",
            address,
            "--switch-interval-ms",
            str(sys.getswitchinterval() * 1e3),
        ]
        self.proc = subprocess.Popen(
            cmd, cwd=harness.ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self._expect("ready")

    def _expect(self, event: str) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(
                    f"client worker exited (rc {self.proc.poll()}) while waiting for {event!r}"
                )
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue
            if msg.get("event") == event:
                return msg

    def send(self, cmd: dict) -> None:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        try:
            self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(JOIN_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


class WorkerPool:
    """Client processes: a phase's clients are dealt out over up to ``procs`` workers (each
    its own process, GIL and ``PolicyClient`` threads), which start together; the
    server-side window runs from the last worker's start to the first one's end."""

    def __init__(self, address: str, procs: int):
        self.workers = [Worker(address) for _ in range(procs)]

    def run_phase(self, side: Any, cmd: dict) -> tuple[dict, dict, dict]:
        """One phase (:meth:`Phases.command`) against ``side`` (its ``snapshot()`` read at the
        window's edges): ``(result, snapshot at the start, snapshot at the end)``."""
        n = cmd["clients"]
        used = self.workers[: min(n, len(self.workers))]
        shares = [n // len(used) + (i < n % len(used)) for i in range(len(used))]
        first = 0
        for w, k in zip(used, shares, strict=True):
            w.send({**cmd, "clients": k, "first_client": first})
            first += k
        for w in used:
            w._expect("start")
        a = side.snapshot()
        for w in used:
            w._expect("end")
        b = side.snapshot()
        return merge([w._expect("result")["result"] for w in used]), a, b

    def close(self) -> None:
        for w in self.workers:
            w.close()


def merge(results: list[dict]) -> dict:
    """One phase result from the workers' (their windows overlap up to the start skew)."""
    actions = sum(r["actions"] for r in results)
    return {
        "clients": sum(r["clients"] for r in results),
        "window_s": statistics.mean(r["window_s"] for r in results),
        "actions": actions,
        "actions_per_s": sum(r["actions_per_s"] for r in results),
        "per_client_actions": [c for r in results for c in r["per_client_actions"]],
        "latencies_s": [x for r in results for x in r["latencies_s"]],
        "cpu_cores": sum(r["cpu_cores"] for r in results),
        "client_cpu_us_per_action": sum(
            r["client_cpu_us_per_action"] * r["actions"] for r in results
        )
        / max(1, actions),
        "errors": [e for r in results for e in r["errors"]][:5],
        "num_errors": sum(r["num_errors"] for r in results),
        "hung_threads": sum(r["hung_threads"] for r in results),
        "processes": len(results),
    }


def percentiles_ms(lat: Sequence[float]) -> tuple[float | None, float | None]:
    """p50 and p99 of latencies in seconds, in ms (None, None without any)."""
    if not lat:
        return None, None
    p50, p99 = np.percentile(np.asarray(lat), [50, 99]) * 1e3
    return float(p50), float(p99)


@dataclasses.dataclass(frozen=True)
class Phases:
    """How a serving benchmark runs its phases: the client counts (sorted, each once), the
    rounds, a phase's warm-up and timed window, the clients' episodes, the sampler's
    ``sample_batch(num_timesteps=)`` and ``max_wait_s``, the seed and the client processes."""

    clients: Sequence[int]
    rounds: int
    warmup_s: float
    duration_s: float
    episode_len: int
    sample_timesteps: int
    max_wait_s: float
    seed: int
    client_procs: int = 4

    def __post_init__(self) -> None:
        object.__setattr__(self, "clients", sorted(set(self.clients)))

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Phases:
        """From the options of :func:`add_arguments` (after the sizes are applied)."""
        return cls(
            args.clients,
            args.rounds,
            args.warmup,
            args.duration,
            args.episode_len,
            args.sample_timesteps,
            args.max_wait_ms / 1e3,
            args.seed,
            args.client_procs,
        )

    def command(
        self, clients: int, warmup_s: float | None = None, duration_s: float | None = None
    ) -> dict[str, Any]:
        """A phase of ``clients`` clients, as :func:`run_phase_here` and
        :meth:`WorkerPool.run_phase` take it (default: the timed phases' warm-up and window)."""
        return {
            "clients": clients,
            "warmup_s": self.warmup_s if warmup_s is None else warmup_s,
            "duration_s": self.duration_s if duration_s is None else duration_s,
            "episode_len": self.episode_len,
            "seed": self.seed,
        }

    def warm_ups(self) -> list[dict[str, Any]]:
        """The untimed phases before the rounds (connections, episodes, any lazy set-up or
        compile): the most clients, then the fewest."""
        return [
            self.command(max(self.clients), 2 * self.warmup_s, self.duration_s / 2),
            self.command(min(self.clients), self.warmup_s, self.duration_s / 4),
        ]


def run_phase_here(side: Any, cmd: dict) -> tuple[dict, dict, dict]:
    """One phase (:meth:`Phases.command`) of client threads in this process against ``side``
    (its ``client_factory()``, and its ``snapshot()`` read at the window's edges): ``(result,
    snapshot at the start, snapshot at the end)``."""
    snaps: dict[str, dict] = {}
    res = run_phase(
        side.client_factory(), **cmd, mark=lambda what: snaps.__setitem__(what, side.snapshot())
    )
    return res, snaps["start"], snaps["end"]


def keep_round(res: dict, raw: list[dict], lat: list[float]) -> dict:
    """Files a timed phase's result: its latencies move to ``lat`` (pooled over rounds), its
    own p50 / p99 stay (``p50_ms``, ``p99_ms``), the result goes to ``raw``."""
    round_lat = res.pop("latencies_s")
    res["p50_ms"], res["p99_ms"] = percentiles_ms(round_lat)
    lat.extend(round_lat)
    raw.append(res)
    return res


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description="A client process of the serving benchmarks: phases of PolicyClient "
        "threads on command (JSON lines on stdin)."
    )
    p.add_argument("address", help="the PolicyServer's address (http://host:port)")
    p.add_argument("--switch-interval-ms", type=float, help="sys.setswitchinterval, in ms")
    args = p.parse_args(argv)
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1e3)
    worker(args.address)


if __name__ == "__main__":
    main()
