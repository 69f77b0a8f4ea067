"""Policy serving: ``get_action`` throughput and latency with 1-64 concurrent clients.

A simulator-driven setup (issue 5, "Performance"): client threads
(:mod:`benchmarks.serving_client`) run episodes against
a CartPole-shaped env (``obs`` float32 ``(4,)``, ``Discrete(2)`` actions, episodes of
``--episode-len`` steps), each step one blocking ``get_action`` plus one ``log_returns``,
then ``end_episode``. The serving side is one :class:`~jaxsampler.sampling.host.HostSampler`
(64x64 tanh ``MLPPolicy``) in its own thread that calls ``sample_batch(params,
num_timesteps=--sample-timesteps)`` over and over, so pending ``get_action`` calls are
answered by one jitted, batched policy call per poll. Modes:

* ``inprocess``: threads call :class:`~jaxsampler.host_envs.external.ExternalEnv` directly;
* ``bare``: the floor of any Python-threads batching server, side by side with
  ``inprocess``: the same client threads call :class:`BareEnv` (ExternalEnv's four
  methods, same signatures, doing the bare minimum: one lock + condition, a list of
  ``(obs, slot)`` requests, a pre-acquired per-call gate; no validation, episodes or
  batches), and one server thread with the same batching rule (a first request, then up
  to ``max_wait_s`` more unless every running episode waits) stacks the whole queue into
  the same zero-padded buckets and calls the same jitted policy function as HostSampler
  (same policy, params and buckets, compiled before timing). What is left is thread
  wake-ups and the GIL, so in-process / bare shows how close jaxsampler gets to the floor;
* ``http``: a :class:`~jaxsampler.serving.server.PolicyServer` on loopback, clients are
  threads of other processes (dealt over ``--client-procs`` processes, default 4, as
  simulators usually run in their own processes; one process of 64 threads is itself
  GIL-bound), each with its own remote-mode
  :class:`~jaxsampler.serving.server.PolicyClient` (one keep-alive connection);
* ``http-inproc``: the same, but the client threads run in the server's process (they
  share its GIL: the difference to ``http`` is what the GIL costs).

Per mode the sampler, the server and the jitted policy (every padded batch size,
compiled before timing) are set up once; then ``--rounds`` rounds each run every client
count once, in a rotating order, as a phase: start the threads, ``--warmup`` s untimed,
``--duration`` s timed, stop (each client ends its current episode as truncated) and
join. Reported per (mode, clients):

* total actions/s = ``get_action`` calls that returned inside the timed window / its
  length (median over rounds, with min-max), and per client (total / clients);
* p50 / p99 latency of ``get_action`` measured in the client (all rounds pooled);
* mean batch size per policy call, policy calls/s, and where the sampler thread's time
  goes (waiting in ``poll``, the jitted call blocked until ready, ``send_actions``, the
  rest: HostSampler's Python bookkeeping and batch building), from a thin instrumenting
  wrapper around the env and the jitted policy functions;
* CPU time of the process(es) in the window, in cores;
* speedup = median over rounds of the within-round ratio ``actions/s(N) / actions/s(1)``
  (issue target: 64 clients >= 10x one client);
* in-process vs the bare floor (``results["vs_bare"]``): in-process actions/s over bare
  actions/s per client count (ratio of the medians over rounds: the modes run one after
  the other), next to both modes' speedups.

Usage::

    python -m benchmarks.serving          # full run (~1.5-2 min), writes results/serving.{json,md}
    python -m benchmarks.serving --quick           # smoke test (tiny phases), prints only
    python -m benchmarks.serving --modes inprocess --clients 1 64 --rounds 5
    python -m benchmarks.serving --out /tmp/serving
"""

from __future__ import annotations

import _thread
import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from benchmarks import harness, serving_client
from benchmarks.harness import fmt, log, thousands
from benchmarks.serving_client import JOIN_TIMEOUT_S, Phases, keep_round, percentiles_ms
from jaxsampler.cli.bench import compile_count, environment_info

HIDDEN = (64, 64)
MODES = ("inprocess", "bare", "http", "http-inproc")
#: the same with a write-ahead journal (``ExternalEnv(journal=StepJournal(path,
#: fsync=JOURNAL_GROUP_COMMIT))``; in-process with ``defer_returns=True``, and without it in
#: ``inprocess-journal-strict``); run by :mod:`benchmarks.serving_journal`
JOURNAL_MODES = ("inprocess-journal", "inprocess-journal-strict", "http-journal")
#: the journals' fsync policy: at a commit once 20 ms or 1,000 entries are unsynced
JOURNAL_GROUP_COMMIT = {"records": 1000, "seconds": 0.02}
LABELS = {
    "inprocess-journal": "in-process, write-ahead journal",
    "inprocess-journal-strict": "in-process, write-ahead journal, a write per log_returns",
    "http-journal": "HTTP, clients in other processes, write-ahead journal",
    "inprocess": "in-process (ExternalEnv)",
    "bare": "bare floor (lock + list + the same jitted policy)",
    "http": "HTTP, clients in other processes",
    "http-inproc": "HTTP, clients in the server process",
}
SIZES = serving_client.sizes(
    full={"rounds": 3, "duration": 1.5, "modes": list(MODES)},
    quick={"duration": 0.3, "modes": list(MODES)},
)


# --------------------------------------------------------------------------- serving side


class _Stopped(Exception):
    """Raised from the instrumented ``poll`` to end the sampler thread."""


def _make_instrumented_env() -> type:
    from jaxsampler.host_envs.base import HostEnv

    class InstrumentedEnv(HostEnv):
        """Delegates to ``inner``; counts polls, rows, sends and the time spent in each.
        ``poll`` hides empty (timed-out) polls and raises :class:`_Stopped` once ``stop`` is
        set (so it ignores the sampler's ``timeout``)."""

        def __init__(self, inner: Any, stop: threading.Event, stats: dict[str, float]):
            self.inner, self.stop, self.stats = inner, stop, stats
            self.observation_space, self.action_space = inner.observation_space, inner.action_space
            self.agent_ids, self.num_envs = tuple(inner.agent_ids), inner.num_envs

        def poll(self, timeout: float | None = None) -> Any:
            s, clock = self.stats, time.perf_counter
            while True:
                t = clock()
                res = self.inner.poll(timeout=0.05)
                s["last_poll_end"] = now = clock()
                s["poll_s"] += now - t
                s["sampler_cpu"] = time.thread_time()
                if res.obs or res.rewards:
                    s["polls"] += 1
                    s["poll_rows"] += len(res.obs)
                    return res
                if self.stop.is_set():
                    raise _Stopped

        def send_actions(self, actions: Any) -> None:
            t = time.perf_counter()
            self.inner.send_actions(actions)
            self.stats["send_s"] += time.perf_counter() - t
            self.stats["sends"] += 1
            self.stats["actions_sent"] += len(actions)

        def close(self) -> None:
            self.inner.close()

    return InstrumentedEnv


def _buckets(max_batch: int) -> list[int]:
    """Padded batch sizes 1, 2, 4, ... below ``max_batch``, then ``max_batch``."""
    buckets, b = [], 1
    while b < max_batch:
        buckets.append(b)
        b *= 2
    return buckets + [max_batch]


STAT_KEYS = (
    "polls",
    "poll_rows",
    "poll_s",
    "sends",
    "actions_sent",
    "send_s",
    "policy_calls",
    "policy_rows_padded",
    "policy_s",
    "policy_cpu_s",
    "sample_batch_calls",
    "batch_build_s",
    "sampler_cpu",
)


class ServingSide:
    """ExternalEnv (+ PolicyServer for HTTP) + HostSampler in a daemon thread, instrumented.

    Args:
        http: serve over HTTP on loopback.
        max_batch: largest padded batch size (buckets 1, 2, 4, ... up to it).
        max_wait_s: the ExternalEnv's batching wait.
        sample_timesteps: ``num_timesteps`` of each ``sample_batch`` call of the loop.
    """

    def __init__(
        self,
        http: bool,
        max_batch: int,
        max_wait_s: float,
        sample_timesteps: int,
        seed: int,
        journal: bool = False,
        defer_returns: bool = False,
    ):
        import tempfile

        import jax

        import jaxsampler as js
        from jaxsampler.host_envs.external import ExternalEnv
        from jaxsampler.sampling.host import HostSampler

        cartpole = js.make("CartPole-v1")
        self.journal = None
        if journal:
            from jaxsampler.offline import GroupCommit, StepJournal

            self._journal_dir = tempfile.TemporaryDirectory(prefix="serving-journal-")
            self.journal = StepJournal(
                f"{self._journal_dir.name}/steps.journal",
                fsync=GroupCommit(**JOURNAL_GROUP_COMMIT),
            )
        self.env = ExternalEnv(
            cartpole.observation_space,
            cartpole.action_space,
            max_wait_s=max_wait_s,
            journal=self.journal,
            defer_returns=defer_returns,
        )
        self.server = None
        if http:
            from jaxsampler.serving.server import PolicyServer

            self.server = PolicyServer(self.env)
        self.policy = js.MLPPolicy(cartpole.observation_space, cartpole.action_space, HIDDEN)
        self.params = self.policy.init(jax.random.PRNGKey(seed))
        self.stop = threading.Event()
        self.stats: dict[str, float] = dict.fromkeys(STAT_KEYS, 0.0) | {"last_poll_end": 0.0}
        wrapped = _make_instrumented_env()(self.server or self.env, self.stop, self.stats)
        self.sampler = HostSampler(wrapped, self.policy, seed=seed, batch_sizes=_buckets(max_batch))
        self.sample_timesteps = sample_timesteps
        self.compile_s, self.compiles_at_start = self._compile_and_instrument()
        self.error: str | None = None
        self.thread = threading.Thread(target=self._loop, name="HostSampler-loop", daemon=True)
        self.thread.start()

    def _compile_and_instrument(self) -> tuple[float | None, int | None]:
        """Compiles the jitted policy function for every bucket (before any timing) and wraps
        it to count calls and time them blocked until ready."""
        import jax

        fns = getattr(self.sampler, "policy_fns", None)
        if not isinstance(fns, dict):
            return None, None  # HostSampler internals changed: warm-up phases compile instead
        state = jax.device_get(self.policy.initial_state((1, 1)))
        key = jax.random.PRNGKey(0)
        t0 = time.perf_counter()
        for fn in fns.values():
            for b in self.sampler.batch_sizes:
                jax.block_until_ready(fn(self.params, np.zeros((b, 1, 4), np.float32), key, state))
        compile_s = time.perf_counter() - t0
        compiles = compile_count()
        self._raw_fns = dict(fns)
        stats = self.stats

        def timed(fn: Callable) -> Callable:
            def call(params: Any, obs: Any, key: Any, state: Any) -> Any:
                t, c = time.perf_counter(), time.thread_time()
                out = jax.block_until_ready(fn(params, obs, key, state))
                stats["policy_s"] += time.perf_counter() - t
                stats["policy_cpu_s"] += time.thread_time() - c
                stats["policy_calls"] += 1
                stats["policy_rows_padded"] += jax.tree.leaves(obs)[0].shape[0]
                return out

            return call

        for pid, fn in fns.items():
            fns[pid] = timed(fn)
        return compile_s, compiles

    def recompiles(self) -> int | None:
        """XLA compilations in this process since the pre-compilation (0 = nothing compiled
        while timing)."""
        return None if self.compiles_at_start is None else compile_count() - self.compiles_at_start

    def _loop(self) -> None:
        s = self.stats
        try:
            while not self.stop.is_set():
                self.sampler.sample_batch(self.params, num_timesteps=self.sample_timesteps)
                s["batch_build_s"] += time.perf_counter() - s["last_poll_end"]
                s["sample_batch_calls"] += 1
        except _Stopped:
            pass
        except Exception as e:
            self.error = f"{type(e).__name__}: {e}"
            log(f"sampler thread failed: {self.error}")

    def snapshot(self) -> dict[str, float]:
        return {k: self.stats[k] for k in STAT_KEYS} | {
            "t": time.perf_counter(),
            "cpu": time.process_time(),
        }

    def client_factory(self) -> Callable[[], Any]:
        if self.server is None:
            return lambda: self.env
        from jaxsampler.serving.client import PolicyClient

        address = self.server.address
        return lambda: PolicyClient(address)

    def close(self) -> None:
        self.stop.set()
        (self.server or self.env).close()
        self.thread.join(JOIN_TIMEOUT_S)
        if self.thread.is_alive():
            self.error = (self.error or "") + " sampler thread did not stop"
        if self.journal is not None:
            self.journal_bytes = os.path.getsize(self.journal.path)
            self.journal.close()
            self._journal_dir.cleanup()


class BareEnv:
    """The floor of a Python-threads batching server: ``ExternalEnv``'s four simulator
    methods (same signatures) doing the bare minimum. One lock + condition, a list of
    ``(obs, slot)`` requests; ``get_action`` appends under the lock, wakes the server only
    when it can act (the queue was empty, or every running episode now waits) and blocks
    on its slot's pre-acquired gate until the server releases it. No validation, no
    episodes (ids are counters, start/end only count running ones), no batches."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.queue: list[tuple[Any, list]] = []  # (obs, [gate, action])
        self.running = 0
        self.returns: dict[Any, float] = {}
        self.closed = False
        self._ids = 0

    def start_episode(self, episode_id: str | None = None, training_enabled: bool = True) -> Any:
        with self.lock:
            self.running += 1
            self._ids += 1
            return self._ids if episode_id is None else episode_id

    def get_action(self, episode_id: Any, observation: Any) -> Any:
        gate = _thread.allocate_lock()
        gate.acquire()
        slot = [gate, None]
        with self.lock:
            if self.closed:
                raise RuntimeError("BareEnv was closed")
            q = self.queue
            q.append((observation, slot))
            if len(q) == 1 or len(q) >= self.running:
                self.cond.notify()
        gate.acquire()
        return slot[1]

    def log_returns(self, episode_id: Any, reward: float, info: dict | None = None) -> None:
        with self.lock:
            self.returns[episode_id] = self.returns.get(episode_id, 0.0) + float(reward)

    def end_episode(self, episode_id: Any, observation: Any, truncated: bool = False) -> None:
        with self.lock:
            self.running -= 1
            self.returns.pop(episode_id, None)
            if self.queue and len(self.queue) >= self.running:  # the rest may all be waiting now
                self.cond.notify()

    def take(self, max_wait_s: float) -> list[tuple[Any, list]] | None:
        """Server side: blocks for a first request, then waits up to ``max_wait_s`` more unless
        every running episode is waiting (``ExternalEnv.poll``'s rule); returns the whole
        queue, or None once closed."""
        with self.lock:
            while not self.queue and not self.closed:
                self.cond.wait()
            if max_wait_s > 0:
                end = time.monotonic() + max_wait_s
                while len(self.queue) < self.running and not self.closed:
                    left = end - time.monotonic()
                    if left <= 0:
                        break
                    self.cond.wait(left)
            if self.closed:
                return None
            batch, self.queue = self.queue, []
            return batch

    def shutdown(self) -> None:
        """Wakes the server and answers every queued caller with None. (Not ``close``: the
        client threads close what has a ``close`` and no ``poll``.)"""
        with self.lock:
            self.closed = True
            for _, slot in self.queue:
                slot[0].release()
            self.queue = []
            self.cond.notify_all()


class BareSide:
    """The ``bare`` mode's serving side: :class:`BareEnv` + one server thread that stacks the
    whole queue into a zero-padded ``[bucket, 1, 4]`` float32 array, calls the same jitted
    policy function as :class:`ServingSide` (``HostSampler.policy_fns``; same policy, params,
    buckets), fetches the outputs with one ``jax.device_get`` and releases each caller's
    gate with its row's action. Instrumented like :class:`ServingSide` (same stat keys, the
    policy call timed blocked until ready), so the tables compare like with like.

    ``sampler`` is a :class:`~jaxsampler.sampling.host.HostSampler` over an unused
    ``ExternalEnv``, built only for its jitted policy function and ``batch_sizes``.
    """

    def __init__(self, max_batch: int, max_wait_s: float, seed: int):
        import jax

        import jaxsampler as js
        from jaxsampler.constants import DEFAULT_POLICY_ID
        from jaxsampler.host_envs.external import ExternalEnv
        from jaxsampler.sampling.host import HostSampler

        cartpole = js.make("CartPole-v1")
        self.policy = js.MLPPolicy(cartpole.observation_space, cartpole.action_space, HIDDEN)
        self.params = self.policy.init(jax.random.PRNGKey(seed))
        self.sampler = HostSampler(
            ExternalEnv(cartpole.observation_space, cartpole.action_space),
            self.policy,
            seed=seed,
            batch_sizes=_buckets(max_batch),
        )
        self.fn = self.sampler.policy_fns[DEFAULT_POLICY_ID]
        self.state = jax.device_get(self.policy.initial_state((1, 1)))
        self.key = jax.random.fold_in(
            jax.random.PRNGKey(seed), 0
        )  # HostSampler's key of its first policy
        self.env = BareEnv()
        self.max_wait_s = max_wait_s
        self.stats: dict[str, float] = dict.fromkeys(STAT_KEYS, 0.0)
        t0 = time.perf_counter()
        for b in self.sampler.batch_sizes:
            jax.block_until_ready(
                self.fn(self.params, np.zeros((b, 1, 4), np.float32), self.key, self.state)
            )
        self.compile_s = time.perf_counter() - t0
        self.compiles_at_start = compile_count()
        self.error: str | None = None
        self.thread = threading.Thread(target=self._loop, name="bare-server", daemon=True)
        self.thread.start()

    def recompiles(self) -> int | None:
        """XLA compilations in this process since the pre-compilation (0 = nothing compiled
        while timing)."""
        return compile_count() - self.compiles_at_start

    def _bucket(self, n: int) -> int:
        return next((b for b in self.sampler.batch_sizes if b >= n), self.sampler.batch_sizes[-1])

    def _loop(self) -> None:
        try:
            self._serve()
        except Exception as e:
            self.error = f"{type(e).__name__}: {e}"
            log(f"bare server thread failed: {self.error}")

    def _serve(self) -> None:
        import jax

        s, env, clock = self.stats, self.env, time.perf_counter
        fn, params, state, key, top = (
            self.fn,
            self.params,
            self.state,
            self.key,
            self.sampler.batch_sizes[-1],
        )
        while True:
            t = clock()
            batch = env.take(self.max_wait_s)
            now = clock()
            s["poll_s"] += now - t
            s["sampler_cpu"] = time.thread_time()
            if batch is None:
                return
            s["polls"] += 1
            s["poll_rows"] += len(batch)
            for lo in range(0, len(batch), top):
                rows = batch[lo : lo + top]
                n = len(rows)
                obs = np.zeros((self._bucket(n), 1, 4), np.float32)
                obs[:n, 0] = np.stack([o for o, _ in rows])
                t, c = clock(), time.thread_time()
                out = jax.block_until_ready(fn(params, obs, key, state))
                s["policy_s"] += clock() - t
                s["policy_cpu_s"] += time.thread_time() - c
                s["policy_calls"] += 1
                s["policy_rows_padded"] += len(obs)
                action, extras, new_state, key = out
                action, extras, new_state = jax.device_get(
                    (action, extras, new_state)
                )  # one transfer
                t = clock()
                for i, (_, slot) in enumerate(rows):
                    slot[1] = action[i, 0]
                    slot[0].release()
                s["send_s"] += clock() - t
                s["sends"] += 1
                s["actions_sent"] += n

    def snapshot(self) -> dict[str, float]:
        return {k: self.stats[k] for k in STAT_KEYS} | {
            "t": time.perf_counter(),
            "cpu": time.process_time(),
        }

    def client_factory(self) -> Callable[[], Any]:
        return lambda: self.env

    def close(self) -> None:
        self.env.shutdown()
        self.thread.join(JOIN_TIMEOUT_S)
        if self.thread.is_alive():
            self.error = (self.error or "") + " bare server thread did not stop"
        self.sampler.host_env.close()


def server_window(a: dict[str, float], b: dict[str, float]) -> dict[str, Any]:
    """Serving-side figures between two :meth:`ServingSide.snapshot` s."""
    d = {k: b[k] - a[k] for k in STAT_KEYS}
    wall = b["t"] - a["t"]
    calls = d["policy_calls"] or d["sends"]
    busy = d["policy_s"] + d["send_s"]
    rest = max(0.0, wall - d["poll_s"] - busy)
    return {
        "policy_calls_per_s": calls / wall,
        "mean_batch": d["actions_sent"] / calls if calls else None,
        "mean_padded_batch": d["policy_rows_padded"] / d["policy_calls"]
        if d["policy_calls"]
        else None,
        "mean_poll_rows": d["poll_rows"] / d["polls"] if d["polls"] else None,
        "share_poll": d["poll_s"] / wall,
        "share_policy": d["policy_s"] / wall,
        "share_send": d["send_s"] / wall,
        "share_rest": rest / wall,
        "share_batch_build": d["batch_build_s"] / wall,
        "policy_us_per_call": 1e6 * d["policy_s"] / d["policy_calls"]
        if d["policy_calls"]
        else None,
        "policy_cpu_us_per_call": 1e6 * d["policy_cpu_s"] / d["policy_calls"]
        if d["policy_calls"]
        else None,
        "sampler_cpu_share": d["sampler_cpu"] / wall,
        "sampler_cpu_us_per_action": 1e6 * d["sampler_cpu"] / d["actions_sent"]
        if d["actions_sent"]
        else None,
        "process_cpu_cores": (b["cpu"] - a["cpu"]) / wall,
        "counts": d,
    }


# --------------------------------------------------------------------------- driver


class ModeRun:
    """One mode set up (its side, warm-ups done), run round by round (:meth:`round`), then
    torn down and summarized (:meth:`finish`); :func:`measure_mode` runs one alone, and
    :func:`run_benchmark` with ``interleave=True`` runs the rounds of several modes in turn
    (side by side: a slow spell of a noisy machine hits every mode's rounds alike)."""

    def __init__(self, mode: str, ph: Phases):
        self.mode, self.ph = mode, ph
        clients = ph.clients
        t_setup = time.perf_counter()
        self.side: ServingSide | BareSide = (
            BareSide(max(clients), ph.max_wait_s, ph.seed)
            if mode == "bare"
            else ServingSide(
                not mode.startswith("inprocess"),
                max(clients),
                ph.max_wait_s,
                ph.sample_timesteps,
                ph.seed,
                journal="-journal" in mode,
                defer_returns=mode == "inprocess-journal",
            )
        )
        remote = mode in ("http", "http-journal")
        self.pool = (
            serving_client.WorkerPool(self.side.server.address, ph.client_procs)  # type: ignore[union-attr]
            if remote
            else None
        )
        self.setup_s = time.perf_counter() - t_setup
        self.raw: dict[int, list[dict]] = {n: [] for n in clients}
        self.lat: dict[int, list[float]] = {n: [] for n in clients}
        try:
            for cmd in ph.warm_ups():
                self._phase(cmd)
        except BaseException:
            self.finish()
            raise

    def _phase(self, cmd: dict) -> dict:
        run = serving_client.run_phase_here if self.pool is None else self.pool.run_phase
        res, a, b = run(self.side, cmd)
        res["server"] = server_window(a, b)
        return res

    def round(self, r: int) -> None:
        """Round ``r``: every client count once (rotating order)."""
        ph, side = self.ph, self.side
        for n in harness.rotated(ph.clients, r):
            if side.error is not None:  # nobody answers get_action any more: stop measuring
                break
            res = keep_round(self._phase(ph.command(n)), self.raw[n], self.lat[n])
            log(
                f"  {self.mode} round {r + 1}/{ph.rounds}: {n:3d} clients "
                f"{res['actions_per_s']:9.0f} actions/s, "
                f"batch {res['server']['mean_batch'] or 0:5.1f}, errors {res['num_errors']}"
            )

    def finish(self) -> dict[str, Any]:
        """Tears the side down; the mode's summary."""
        try:
            if self.pool is not None:
                self.pool.close()
        finally:
            self.pool = None
            self.side.close()
        return summarize_mode(
            self.mode, self.ph.clients, self.raw, self.lat, self.side, self.setup_s
        )


def measure_mode(mode: str, ph: Phases) -> dict[str, Any]:
    """Sets up one mode, runs ``ph.rounds`` rounds of every client count (rotating order),
    tears down."""
    run = ModeRun(mode, ph)
    try:
        for r in range(ph.rounds):
            if run.side.error is not None:
                break
            run.round(r)
    finally:
        summary = run.finish()
    return summary


def summarize_mode(
    mode: str,
    clients: Sequence[int],
    raw: dict[int, list[dict]],
    lat: dict[int, list[float]],
    side: ServingSide | BareSide,
    setup_s: float,
) -> dict[str, Any]:
    cells = {}
    remote = mode in ("http", "http-journal")  # clients in other processes
    for n in clients:
        rs = raw[n]
        if not rs:
            continue
        aps = [r["actions_per_s"] for r in rs]
        p50, p99 = percentiles_ms(lat[n])

        def med(key: str, rs: list[dict] = rs) -> float | None:
            vals = [r["server"][key] for r in rs if r["server"][key] is not None]
            return statistics.median(vals) if vals else None

        cells[str(n)] = {
            "clients": n,
            "actions_per_s": statistics.median(aps),
            "actions_per_s_min": min(aps),
            "actions_per_s_max": max(aps),
            "per_client_actions_per_s": statistics.median(aps) / n,
            "p50_ms": p50,
            "p99_ms": p99,
            "latency_samples": len(lat[n]),
            "mean_batch": med("mean_batch"),
            "mean_padded_batch": med("mean_padded_batch"),
            "policy_calls_per_s": med("policy_calls_per_s"),
            "policy_us_per_call": med("policy_us_per_call"),
            "policy_cpu_us_per_call": med("policy_cpu_us_per_call"),
            "sampler_cpu_share": med("sampler_cpu_share"),
            "sampler_cpu_us_per_action": med("sampler_cpu_us_per_action"),
            "client_cpu_us_per_action": statistics.median(
                r["client_cpu_us_per_action"] for r in rs
            ),
            "share_poll": med("share_poll"),
            "share_policy": med("share_policy"),
            "share_send": med("share_send"),
            "share_rest": med("share_rest"),
            "share_batch_build": med("share_batch_build"),
            "server_cpu_cores": med("process_cpu_cores"),
            "server_cpu_us_per_action": statistics.median(
                1e6 * r["server"]["process_cpu_cores"] / r["actions_per_s"]
                for r in rs
                if r["actions_per_s"]
            )
            if any(aps)
            else None,
            "client_process_cpu_us_per_action": statistics.median(
                1e6 * r["cpu_cores"] / r["actions_per_s"] for r in rs if r["actions_per_s"]
            )
            if any(aps) and remote
            else None,  # other modes: one process, counted as the server's
            "client_cpu_cores": statistics.median(r["cpu_cores"] for r in rs) if remote else None,
            "num_errors": sum(r["num_errors"] for r in rs),
            "hung_threads": sum(r["hung_threads"] for r in rs),
            "errors": [e for r in rs for e in r["errors"]][:5],
            "rounds": rs,
        }
    base = min(clients)
    speedup = {}
    for n in clients:
        if n != base:
            ratios = [
                a["actions_per_s"] / b["actions_per_s"]
                for a, b in zip(raw[n], raw[base], strict=True)
                if b["actions_per_s"]
            ]
            if ratios:
                speedup[str(n)] = {**harness.median_min_max(ratios), "vs_clients": base}
    return {
        "mode": mode,
        "label": LABELS[mode],
        "setup_s": setup_s,
        "compile_s": side.compile_s,
        "batch_sizes": list(side.sampler.batch_sizes),
        "recompiles_while_timing": side.recompiles(),
        "sampler_error": side.error,
        "cells": cells,
        "speedup": speedup,
    }


def vs_bare(modes: dict[str, Any]) -> dict[str, Any] | None:
    """In-process actions/s over the bare floor's, per client count (None unless both modes ran).

    The modes run one after the other, not within the same round, so this is the ratio of
    the two medians over rounds (not a median of within-round ratios)."""
    ip, bare = modes.get("inprocess"), modes.get("bare")
    if ip is None or bare is None:
        return None
    cells = {}
    for n, c in ip["cells"].items():
        b = bare["cells"].get(n)
        if b is not None and b["actions_per_s"]:
            cells[n] = {
                "clients": c["clients"],
                "inprocess_actions_per_s": c["actions_per_s"],
                "bare_actions_per_s": b["actions_per_s"],
                "ratio": c["actions_per_s"] / b["actions_per_s"],
            }
    return {
        "ratio": "inprocess / bare, ratio of the medians over rounds (the modes run separately)",
        "cells": cells,
        "inprocess_speedup": ip["speedup"],
        "bare_speedup": bare["speedup"],
    }


def run_benchmark(modes: Sequence[str], ph: Phases, interleave: bool = False) -> dict[str, Any]:
    """Measures ``modes`` one after the other, or (``interleave``) all set up at once with
    their rounds run in turn; the results as the JSON holds them."""
    started = time.perf_counter()
    results = {}
    if interleave:
        log(f"{', '.join(modes)}: set up, then their rounds in turn")
        runs = {}
        try:
            for mode in modes:
                runs[mode] = ModeRun(mode, ph)
            for r in range(ph.rounds):
                for run in runs.values():
                    run.round(r)
        finally:
            for mode, run in runs.items():
                results[mode] = run.finish()
    for mode in modes if not interleave else ():
        log(
            f"{LABELS[mode]}: clients {ph.clients}, {ph.rounds} rounds x {ph.duration_s} s "
            f"(+{ph.warmup_s} s warm-up)"
        )
        results[mode] = measure_mode(mode, ph)
    left = [
        t.name for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()
    ]
    return {
        **harness.stamp(
            "Policy serving: get_action actions/s and latency, in-process (vs a bare "
            "floor) and over HTTP",
            "serving",
        ),
        "config": {
            "env": "CartPole-v1 spaces (obs float32 (4,), Discrete(2)); fixed per-client "
            "observations",
            "policy": f"MLPPolicy {HIDDEN} tanh",
            "modes": list(modes),
            "clients": ph.clients,
            "rounds": ph.rounds,
            "warmup_s": ph.warmup_s,
            "duration_s": ph.duration_s,
            "episode_len": ph.episode_len,
            "sample_timesteps": ph.sample_timesteps,
            "max_wait_s": ph.max_wait_s,
            "seed": ph.seed,
            "http_client_processes": ph.client_procs,
            "switch_interval_s": sys.getswitchinterval(),
            "interleaved": interleave,
        },
        "environment": {**environment_info(), **harness.versions(["msgpack"])},
        "git": harness.git_state(include_untracked=True),
        "modes": results,
        "vs_bare": vs_bare(results),
        "threads_left_after_run": left,
        "wall_s": time.perf_counter() - started,
    }


# --------------------------------------------------------------------------- reporting


def markdown_vs_bare(vb: dict[str, Any] | None) -> str:
    """The "in-process vs the bare floor" table ('' unless both modes ran)."""
    if not vb or not vb["cells"]:
        return ""
    md = "\n### In-process vs the bare floor\n\n"
    md += (
        "The bare floor is the most any Python-threads server with this policy gets on this "
        "machine (thread "
        "wake-ups and the GIL bound it, not jaxsampler), so the 10x target is judged against it. "
        "In-process / "
        "bare is the ratio of the two medians over rounds (the modes run one after the other, so "
        "there is no "
        "within-round ratio); speedups as above.\n\n"
    )
    md += (
        "| clients | in-process actions/s | bare floor actions/s | in-process / bare | speedup "
        "in-process | "
        "speedup bare floor |\n|---:|---:|---:|---:|---:|---:|\n"
    )
    for n, c in vb["cells"].items():
        sp = [vb[k].get(n) for k in ("inprocess_speedup", "bare_speedup")]
        md += (
            f"| {c['clients']} | {thousands(c['inprocess_actions_per_s'])} | "
            f"{thousands(c['bare_actions_per_s'])} | "
            f"**{c['ratio']:.0%}** | "
            + " | ".join(f"{s['median']:.1f}x" if s else "—" for s in sp)
            + " |\n"
        )
    return md


def markdown_table(results: dict[str, Any]) -> str:
    cfg, env = results["config"], results["environment"]
    md = "# Policy serving: `get_action` throughput and latency\n\n"
    md += (
        f"{results['date']} · `{results['command']}` · jax {env['jax']} ({env['backend']}, "
        f"{env['device_count']} "
        f"device(s)) · {env['cpu_count']} CPUs · Python {env['python']} (switch interval "
        f"{cfg['switch_interval_s'] * 1e3:g} ms) · {cfg['policy']} · episodes of "
        f"{cfg['episode_len']} steps · "
        f"`sample_batch(num_timesteps={cfg['sample_timesteps']})` loop · "
        f"max_wait_s={cfg['max_wait_s']} · "
        f"{cfg['rounds']} rounds x {cfg['duration_s']} s per cell (+{cfg['warmup_s']} s warm-up) · "
        f"wall {results['wall_s']:.0f} s\n\n"
    )
    md += "## Throughput and latency\n\n"
    md += (
        "Total actions/s: median over rounds [min–max]; latency of `get_action` in the client, all "
        "rounds "
        "pooled; batch = actions per jitted policy call (padded size in brackets); CPU = process "
        "CPU time per "
        "wall second (server process / client processes, summed).\n\n"
    )
    md += (
        "| mode | clients | total actions/s | per client | p50 ms | p99 ms | batch | policy "
        "calls/s | "
        "CPU cores |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    for m in results["modes"].values():
        for c in m["cells"].values():
            cpu = fmt(c["server_cpu_cores"], ".2f")
            if c["client_cpu_cores"] is not None:
                cpu += f" / {c['client_cpu_cores']:.2f}"
            md += (
                f"| {m['label']} | {c['clients']} | **{thousands(c['actions_per_s'])}** "
                f"[{thousands(c['actions_per_s_min'])}–{thousands(c['actions_per_s_max'])}] | "
                f"{thousands(c['per_client_actions_per_s'])} | {fmt(c['p50_ms'], '.2f')} | "
                f"{fmt(c['p99_ms'], '.2f')} | "
                f"{fmt(c['mean_batch'], '.1f')} ({fmt(c['mean_padded_batch'], '.0f')}) | "
                f"{fmt(c['policy_calls_per_s'])} | {cpu} |\n"
            )
    md += (
        "\n## Speedup in total actions/s over 1 client "
        "(issue target: 64 clients ≥ 10x one client)\n\n"
    )
    counts = [n for n in cfg["clients"] if n != min(cfg["clients"])]
    md += (
        "| mode | "
        + " | ".join(f"{n} clients" for n in counts)
        + " |\n|---|"
        + "---:|" * len(counts)
        + "\n"
    )
    for m in results["modes"].values():
        cells = []
        for n in counts:
            s = m["speedup"].get(str(n))
            cells.append(f"**{s['median']:.1f}x** [{s['min']:.1f}–{s['max']:.1f}]" if s else "—")
        md += f"| {m['label']} | " + " | ".join(cells) + " |\n"
    md += (
        "\nMedian over rounds of the within-round ratio [min–max]; the client counts of a round "
        "run back to back "
        "against the same sampler.\n"
    )
    md += markdown_vs_bare(results.get("vs_bare"))
    md += "\n## Where the time goes (timed window, median over rounds)\n\n"
    md += (
        "Sampler thread, share of wall time: poll = blocked in `poll()` (waiting for requests, "
        "incl. the "
        "`max_wait_s` batching wait); policy = the jitted call until its result is ready; send = "
        "`send_actions` (wakes the callers); rest = HostSampler's Python work (validation, "
        "collector, per-row "
        "split of actions and extras, batch building at the end of each `sample_batch`: 'build' is "
        "the part "
        "after a call's last poll); for the bare floor, poll = waiting for requests, send = "
        "writing the "
        "actions and releasing the callers' gates, rest = stacking and padding the observations "
        "and `device_get`. "
        "Wall time the thread spends outside `poll` beyond its CPU time is mostly waiting for the "
        "GIL. CPU µs "
        "per action: sampler thread (`time.thread_time`), client threads, and the whole process "
        "(server "
        "process + client processes for the HTTP mode with clients in other processes).\n\n"
    )
    md += (
        "| mode | clients | poll | policy | send | rest | (build) | sampler CPU | policy µs/call "
        "wall (CPU) | "
        "sampler CPU µs/action | client CPU µs/action | process CPU µs/action |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    for m in results["modes"].values():
        for c in m["cells"].values():
            md += (
                f"| {m['label']} | {c['clients']} | {fmt(c['share_poll'], '.0%')} | "
                f"{fmt(c['share_policy'], '.0%')} | "
                f"{fmt(c['share_send'], '.0%')} | {fmt(c['share_rest'], '.0%')} | "
                f"{fmt(c['share_batch_build'], '.0%')} | "
                f"{fmt(c['sampler_cpu_share'], '.0%')} | {fmt(c['policy_us_per_call'])} "
                f"({fmt(c['policy_cpu_us_per_call'])}) | {fmt(c['sampler_cpu_us_per_action'])} | "
                f"{fmt(c['client_cpu_us_per_action'])} | {fmt(c['server_cpu_us_per_action'])}"
                + (
                    f" + {fmt(c['client_process_cpu_us_per_action'])}"
                    if c["client_process_cpu_us_per_action"] is not None
                    else ""
                )
                + " |\n"
            )
    md += (
        "\n## Setup\n\n| mode | setup s (incl. compile) | compile s (all buckets) | buckets "
        "| recompiles while timing | errors |\n"
    )
    md += "|---|---:|---:|---|---:|---|\n"
    for m in results["modes"].values():
        errs = sum(c["num_errors"] + c["hung_threads"] for c in m["cells"].values())
        note = m["sampler_error"] or (f"{errs} client errors / hung threads" if errs else "none")
        md += (
            f"| {m['label']} | {m['setup_s']:.1f} | {fmt(m['compile_s'], '.2f')} | "
            f"{m['batch_sizes']} | "
            f"{'—' if m['recompiles_while_timing'] is None else m['recompiles_while_timing']} | "
            f"{note} |\n"
        )
    if results["threads_left_after_run"]:
        md += f"\nThreads still alive after the run: {results['threads_left_after_run']}\n"
    return md


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--modes", nargs="+", choices=MODES + JOURNAL_MODES, help=f"default: {' '.join(MODES)}"
    )
    serving_client.add_arguments(p, "serving", SIZES)
    p.add_argument(
        "--switch-interval-ms",
        type=float,
        help="sys.setswitchinterval for the server and client processes (default: Python's, 5 ms)",
    )
    p.add_argument("--client-worker", help=argparse.SUPPRESS)  # serving_client's, by its old name
    args = p.parse_args(argv)
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1e3)
    if args.client_worker:
        serving_client.worker(args.client_worker)
        return
    SIZES.apply(args)
    results = run_benchmark(args.modes, Phases.from_args(args))
    harness.finish(
        results, markdown_table(results), "serving", harness.results_dir(args.out, args.quick)
    )


if __name__ == "__main__":
    main()
