"""Soak: long runs of the samplers and of the serving path; memory, recompilation and step
accounting must stay flat.

Part (a), sampler soak. Four samplers, each with a tiny ``MLPPolicy`` (8 hidden units):

* ``device``: ``js.Sampler`` (a :class:`~jaxsampler.sampling.device.DeviceSampler`) on the
  built-in ``CartPole-v1``;
* ``device-ma``: the same on ``Goals-v0`` (3 agents finishing at different times);
* ``host``: a :class:`~jaxsampler.sampling.host.HostSampler` over Gymnasium ``CartPole-v1``
  (``"gym:"`` envs, wrapped to count their own ``step`` calls);
* ``host-ma``: a HostSampler over :class:`~jaxsampler.host_envs.MultiAgentDictEnv` of a
  small dict env (:class:`RelayEnv`: agents join late, act out of lockstep and finish at
  different times; it counts its own steps).

Each runs ``--calls`` consecutive ``sample()`` calls, then (``force_reset=True`` once, so
both phases start from fresh episodes) ``--calls`` ``sample_batch()`` calls. Every
``--every`` calls, after ``gc.collect()``, it records the process's resident memory
(psutil, else ``/proc/self/statm``) and the device's ``bytes_in_use`` (``jax``
``memory_stats()``; ``None`` on CPU, reported "n/a"). Reported per phase:

* memory slope: least-squares fit of the samples after the first 20% of calls (warm-up:
  allocator pools, caches), in bytes per call, and the growth over that window (the fit's
  slope times the window length, and last minus first sample). Verdict ``flat`` when the
  fitted growth over the window is under ``--max-growth-mib`` (default 8 MiB) *and* the
  slope is under ``--max-slope`` bytes/call (default 2048): a real leak of one buffer,
  episode or batch per call is far above both; the run's own bookkeeping (sets of episode
  ids, see ``tracker_bytes``) is part of what is measured and is reported;
* recompilations: :func:`jaxsampler.cli.bench.compile_count` after the first call of the phase
  minus before it; must be 0;
* step accounting, per call and in total:
  - returned env steps (sum of chunk lengths, or ``MultiAgentBatch.env_steps()``) equal
    the sampler's ``metrics.num_env_steps_sampled`` and are ``>= num_timesteps``
    requested (samplers finish whole rollout calls / polls), and agent steps (sum of
    per-agent lengths or batch rows) equal ``metrics.num_agent_steps_sampled``;
  - an independent reference: host envs count their own ``step`` calls, which must equal
    the returned env steps per call; a device rollout runs ``num_envs * rollout_length``
    env steps per call, which must equal returned steps plus reset steps, where each
    finished episode is followed by one reset step (at most ``num_envs`` of them still
    pending at the end of the run);
  - continuity: every episode id's chunks / rows follow on without a gap or a repeat
    (``sample()``: each chunk's ``t_started`` / ``env_t_started`` is the previous chunk's
    ``t``; ``sample_batch()``: each ``eps_id``'s rows have ``t`` = next expected, next+1,
    ...), and a finished episode id never appears again.

Part (b), serving soak. A :class:`~jaxsampler.serving.server.PolicyServer` over an
:class:`~jaxsampler.host_envs.external.ExternalEnv` (CartPole-shaped spaces), sampled by a
HostSampler thread calling ``sample_batch(num_timesteps=--sample-timesteps)`` in a loop.
``--clients`` client threads (one remote-mode :class:`~jaxsampler.serving.client.
PolicyClient` each) dealt over ``--client-procs`` processes (this module with
``--serving-worker``) run short episodes (5-40 steps; every 7th step is a ``log_action``,
the rest ``get_action``; a ``log_returns`` after each) until ``--serving-steps`` steps in
total. Observations carry ``(client, episode, t)``, so the server side counts every step
it sampled per (client, episode, t) in a preallocated array; reported: steps/s, server
RSS sampled every 0.5 s with its slope (bytes per step, fit over the last 80% of the
run), and "nothing lost": every step the clients sent appears exactly once in the
sampled batches (per episode, both sides' counts compared), client errors (must be 0).

Usage::

    python -m benchmarks.soak          # full run (~9 min on a busy 2-core machine), writes results/
    python -m benchmarks.soak --quick        # < 60 s smoke run, prints only (writes with --out)
    python -m benchmarks.soak --parts samplers --calls 200
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from benchmarks import harness
from benchmarks.harness import log
from jaxsampler.cli.bench import compile_count, environment_info

HIDDEN = (8,)
SAMPLERS = ("device", "device-ma", "host", "host-ma")
PARTS = ("samplers", "serving")
SIZES = harness.Sizes(
    full={"calls": 1000, "every": 20, "serving_steps": 200_000, "clients": 64, "client_procs": 4},
    quick={"calls": 10, "every": 3, "serving_steps": 1_500, "clients": 8, "client_procs": 1},
)
WARMUP_FRACTION = 0.2
MAX_EPISODES_PER_CLIENT = 4096
MAX_EPISODE_LEN = 40


# --------------------------------------------------------------------------- memory


def rss_bytes() -> int:
    """Resident set size of this process, in bytes (psutil if installed, else Linux's
    ``/proc/self/statm``)."""
    try:
        import psutil
    except ImportError:
        import os

        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return int(psutil.Process().memory_info().rss)


def device_bytes() -> int | None:
    """Bytes in use on the default device, or ``None`` where JAX does not report it (CPU)."""
    import jax

    stats = jax.devices()[0].memory_stats()
    if not stats or "bytes_in_use" not in stats:
        return None
    return int(stats["bytes_in_use"])


def fit_slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of ``ys`` over ``xs`` (``None`` with fewer than 2 points)."""
    if len(xs) < 2 or len(set(xs)) < 2:
        return None
    return float(np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)[0])


def growth(
    xs: Sequence[float], ys: Sequence[float | None], skip_fraction: float = WARMUP_FRACTION
) -> dict[str, Any]:
    """Slope and growth of ``ys`` over ``xs`` after the first ``skip_fraction`` of the
    x range (warm-up): ``slope`` (per unit of x), ``fitted`` (slope times the window
    length), ``last_minus_first`` and the window bounds. ``None`` values: not measured."""
    if not xs or any(y is None for y in ys):
        return {"slope": None, "fitted": None, "last_minus_first": None, "window": None}
    lo = xs[0] + skip_fraction * (xs[-1] - xs[0])
    pts = [(x, y) for x, y in zip(xs, ys, strict=True) if x >= lo]
    wx, wy = [p[0] for p in pts], [float(p[1]) for p in pts]  # type: ignore[arg-type]
    s = fit_slope(wx, wy)
    return {
        "slope": s,
        "fitted": None if s is None else s * (wx[-1] - wx[0]),
        "last_minus_first": wy[-1] - wy[0] if wy else None,
        "window": [wx[0], wx[-1]] if wx else None,
    }


# --------------------------------------------------------------------------- step ledger


class AccountingError(AssertionError):
    """The samplers returned a step twice, lost one, or miscounted."""


class Ledger:
    """Checks that every episode's steps come back exactly once across calls.

    ``next_t[id]`` is where the episode's next chunk / row must start (ongoing episodes
    only, so it stays small). Finished ids may never come back: their hashes go into a
    preallocated array (written in full at construction, so the bookkeeping adds nothing
    to the resident memory the soak measures) and every call's ids are checked against it
    in :meth:`end_call`."""

    def __init__(self, max_ids: int = 1 << 18) -> None:
        self.next_t: dict[str, int] = {}
        self._done = np.full(max_ids, -1, np.int64)
        self._n = 0
        self._seen: list[int] = []  # hashes of the ids seen in this call
        self._done_now: set[str] = set()  # ids finished in this call
        self.episodes_finished = 0

    def chunk(self, eid: str, t_started: int, t: int, done: bool) -> None:
        """One ``sample()`` chunk of episode ``eid`` covering steps ``[t_started, t)``."""
        self._check_new(eid)
        want = self.next_t.get(eid, 0)
        if t_started != want:
            raise AccountingError(f"episode {eid}: chunk starts at {t_started}, expected {want}")
        if t < t_started:
            raise AccountingError(f"episode {eid}: chunk ends at {t} < start {t_started}")
        self._advance(eid, t, done)

    def rows(self, eid: str, ts: np.ndarray, done: bool) -> None:
        """``sample_batch()`` rows of (agent) episode ``eid`` with timesteps ``ts``."""
        self._check_new(eid)
        want = self.next_t.get(eid, 0)
        expected = np.arange(want, want + len(ts))
        if not np.array_equal(np.asarray(ts), expected):
            raise AccountingError(
                f"episode {eid}: rows have t={np.asarray(ts).tolist()[:8]}..., expected "
                f"{want}..{want + len(ts) - 1}"
            )
        self._advance(eid, want + len(ts), done)

    def _check_new(self, eid: str) -> None:
        if eid in self._done_now:
            raise AccountingError(f"episode {eid} came back after it finished (same call)")
        self._seen.append(hash(eid))

    def _advance(self, eid: str, t: int, done: bool) -> None:
        if done:
            self.next_t.pop(eid, None)
            self._done_now.add(eid)
            self.episodes_finished += 1
        else:
            self.next_t[eid] = t

    def end_call(self) -> None:
        """Checks this call's ids against the ids finished in earlier calls, then files the
        ids that finished in this one."""
        seen = np.fromiter(self._seen, np.int64, len(self._seen))
        back = np.isin(seen, self._done[: self._n])
        if back.any():
            raise AccountingError(f"{int(back.sum())} finished episode id(s) came back")
        new = np.fromiter((hash(e) for e in self._done_now), np.int64, len(self._done_now))
        if self._n + len(new) > len(self._done):
            raise AccountingError(f"more than {len(self._done)} finished ids: raise max_ids")
        self._done[self._n : self._n + len(new)] = new
        self._n += len(new)
        self._seen, self._done_now = [], set()

    def size_bytes(self) -> int:
        """Memory of the bookkeeping (the preallocated array plus the ongoing episodes)."""
        return self._done.nbytes + sys.getsizeof(self.next_t) + 100 * len(self.next_t)


def account_episodes(ledger: Ledger, episodes: list, multi_agent: bool) -> tuple[int, int]:
    """Feeds ``sample()``'s chunks to ``ledger``; returns (env steps, agent steps)."""
    env_steps = agent_steps = 0
    for ep in episodes:
        if multi_agent:
            ledger.chunk(ep.id_, ep.env_t_started, ep.env_t, ep.is_done)
            env_steps += ep.env_t - ep.env_t_started
            agent_steps += ep.agent_steps()
        else:
            ledger.chunk(ep.id_, ep.t_started, ep.t, ep.is_done)
            env_steps += ep.t - ep.t_started
            agent_steps += ep.t - ep.t_started
    return env_steps, agent_steps


def account_batch(ledger: Ledger, batch: Any) -> tuple[int, int]:
    """Feeds ``sample_batch()``'s rows to ``ledger`` (per ``eps_id``, in row order);
    returns (env steps, agent steps). An agent episode is done at a row with its
    ``terminateds`` or ``truncateds`` flag."""
    agent_steps = 0
    for sb in batch.policy_batches.values():
        n = len(sb["t"])
        agent_steps += n
        if n == 0:
            continue
        eids = np.asarray(sb["eps_id"])
        ts = np.asarray(sb["t"])
        done = np.asarray(sb["terminateds"]) | np.asarray(sb["truncateds"])
        # Rows come episode by episode, agent by agent: split at id changes.
        cuts = np.flatnonzero(eids[1:] != eids[:-1]) + 1
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, n], strict=True):
            ledger.rows(str(eids[lo]), ts[lo:hi], bool(done[hi - 1]))
    return int(batch.env_steps()), agent_steps


# --------------------------------------------------------------------------- envs


class StepCounter:
    """Counts ``step`` calls of a wrapped env (Gymnasium or dict API): the independent
    reference for host-env step accounting (shared by every sub-env of a sampler)."""

    def __init__(self) -> None:
        self.steps = 0


def counting_gym_cartpole(counter: StepCounter) -> Callable[[], Any]:
    """A factory of Gymnasium ``CartPole-v1`` envs whose ``step`` calls ``counter`` counts."""
    import gymnasium as gym

    class Counted(gym.Wrapper):
        def step(self, action: Any) -> Any:
            counter.steps += 1
            return self.env.step(action)

    return lambda: Counted(gym.make("CartPole-v1"))


class RelayEnv:
    """A dict-API multi-agent env (RLlib's): ``a`` observes every step, ``b`` joins at step
    1 and observes at odd steps, ``c`` joins at step 2 and finishes (terminated) at step 5
    when the episode lasts that long; episodes last 4-12 steps (seeded) and end truncated
    or terminated alternately. Counts its own ``step`` calls in ``counter``."""

    possible_agents = ("a", "b", "c")

    def __init__(self, counter: StepCounter):
        import gymnasium as gym

        self.observation_space = gym.spaces.Box(-1e3, 1e3, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.counter, self.k, self.rng = counter, 0, np.random.default_rng(0)

    def _obs(self, agent: str) -> np.ndarray:
        return np.array([self.k, self.t, self.possible_agents.index(agent)], np.float32)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[dict, dict]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.k += 1
        self.t, self.length, self.live = 0, int(self.rng.integers(4, 13)), {"a"}
        return {"a": self._obs("a")}, {}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        self.counter.steps += 1
        rewards = {a: 1.0 for a in self.live}
        self.t += 1
        t = self.t
        if t == 1:
            self.live.add("b")
        if t == 2:
            self.live.add("c")
        seen = {a for a in self.live if a == "a" or (a == "b" and t % 2 == 1) or a == "c"}
        terms: dict[str, bool] = {"__all__": False}
        truncs: dict[str, bool] = {"__all__": False}
        if t == 5 and "c" in self.live:
            terms["c"] = True
        if t >= self.length:
            seen |= self.live
            flags = terms if self.k % 2 else truncs
            flags.update(dict.fromkeys(self.live, True))
            flags["__all__"] = True
        self.live -= {a for a in self.live if terms.get(a) or truncs.get(a)}
        return {a: self._obs(a) for a in seen}, rewards, terms, truncs, {}


# --------------------------------------------------------------------------- sampler soak


def make_sampler(kind: str, seed: int = 0) -> tuple[Any, Any, StepCounter | None, dict]:
    """``(sampler, params, step counter or None, config)`` for one of :data:`SAMPLERS`."""
    import jax

    import jaxsampler as js

    key = jax.random.PRNGKey(seed)
    if kind in ("device", "device-ma"):
        env = js.make("CartPole-v1" if kind == "device" else "Goals-v0")
        policy = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=HIDDEN)
        num_envs, length = 4, 32
        sampler = js.Sampler(env, policy, num_envs=num_envs, rollout_length=length, seed=seed)
        cfg = {
            "env": "CartPole-v1" if kind == "device" else "Goals-v0 (3 agents)",
            "num_envs": num_envs,
            "rollout_length": length,
            "num_timesteps": num_envs * length // 2,  # one rollout call per sample call
        }
        return sampler, policy.init(key), None, cfg
    counter = StepCounter()
    num_envs = 4
    if kind == "host":
        host_env = js.host_envs.GymnasiumHostEnv(counting_gym_cartpole(counter), num_envs=num_envs)
        label = "gymnasium CartPole-v1"
    else:
        host_env = js.host_envs.MultiAgentDictEnv(lambda: RelayEnv(counter), num_envs=num_envs)
        label = "MultiAgentDictEnv(RelayEnv, 3 agents)"
    policy = js.MLPPolicy(host_env.observation_space, host_env.action_space, hidden_sizes=HIDDEN)
    sampler = js.sampling.HostSampler(host_env, policy, seed=seed)
    params = policy.init(key)
    cfg = {
        "env": label,
        "num_envs": num_envs,
        "num_timesteps": 4 * num_envs,
        "padded_batch_sizes": list(sampler.batch_sizes),
        "warm_up_compiles": warm_policy_fns(sampler, policy, params),
    }
    return sampler, params, counter, cfg


def soak_phase(
    kind: str,
    method: str,
    sampler: Any,
    params: Any,
    counter: StepCounter | None,
    cfg: dict,
    calls: int,
    every: int,
) -> dict[str, Any]:
    """``calls`` consecutive ``sample()`` / ``sample_batch()`` calls with memory samples,
    compile counts and step accounting (see the module docstring)."""
    multi_agent = kind.endswith("-ma")
    ledger = Ledger()
    fn = sampler.sample if method == "sample" else sampler.sample_batch
    want = cfg["num_timesteps"]
    mem_calls: list[int] = []
    rss: list[int] = []
    dev: list[int | None] = []
    env_total = agent_total = ref_total = 0
    mismatches: list[str] = []
    compiles_before = compile_count()
    compiles_after_first = None
    compile_calls: list[int] = []  # calls (after the first) during which something compiled
    env_episodes = 0
    t0 = t1 = time.perf_counter()
    for i in range(calls):
        before = counter.steps if counter is not None else 0
        c0 = compile_count()
        out = fn(params, num_timesteps=want, force_reset=(i == 0))
        if i == 0:
            compiles_after_first = compile_count()
            t1 = time.perf_counter()
        elif compile_count() != c0:
            compile_calls.append(i)
        m = sampler.metrics
        env_episodes += m.num_episodes_completed
        try:
            if method == "sample":
                env_steps, agent_steps = account_episodes(ledger, out, multi_agent)
            else:
                env_steps, agent_steps = account_batch(ledger, out)
            ledger.end_call()
        except AccountingError as e:  # the ledger is inconsistent from here: stop the phase
            mismatches.append(f"call {i}: {e}")
            calls = i + 1
            break
        ref = counter.steps - before if counter is not None else env_steps
        for name, got, exp in (
            ("env steps vs metrics", env_steps, m.num_env_steps_sampled),
            ("agent steps vs metrics", agent_steps, m.num_agent_steps_sampled),
            ("env steps vs the env's own count", env_steps, ref),
        ):
            if got != exp and len(mismatches) < 10:
                mismatches.append(f"call {i}: {name}: {got} != {exp}")
        if env_steps < want and len(mismatches) < 10:
            mismatches.append(f"call {i}: {env_steps} env steps < {want} requested")
        env_total += env_steps
        agent_total += agent_steps
        ref_total += ref
        del out
        if (i + 1) % every == 0 or i == 0:
            gc.collect()
            mem_calls.append(i + 1)
            rss.append(rss_bytes())
            dev.append(device_bytes())
    wall = time.perf_counter() - t0
    steady = time.perf_counter() - t1
    recompiles = compile_count() - (compiles_after_first or compiles_before)
    device_steps = None
    reset_gap = None
    if counter is None:  # device: E * T env steps per rollout call, reset steps included
        device_steps = sampler._soak_rollouts * cfg["num_envs"] * cfg["rollout_length"]
        resets = device_steps - env_total
        reset_gap = env_episodes - resets  # resets still pending at the end
        if not 0 <= reset_gap <= cfg["num_envs"] and len(mismatches) < 10:
            mismatches.append(
                f"device steps {device_steps} - returned {env_total} = {resets} reset steps, "
                f"but {env_episodes} episodes finished (expected 0..num_envs more)"
            )
    rss_g = growth(mem_calls, rss)
    dev_g = growth(mem_calls, dev)
    return {
        "sampler": kind,
        "method": method,
        "config": cfg,
        "calls": calls,
        "wall_s": wall,
        "calls_per_s": (calls - 1) / steady if calls > 1 else None,
        "memory_calls": mem_calls,
        "rss_bytes": rss,
        "device_bytes_in_use": dev,
        "rss_growth": rss_g,
        "device_growth": dev_g,
        "compiles_first_call": (compiles_after_first or 0) - compiles_before,
        "recompiles_after_first_call": recompiles,
        "calls_that_compiled": compile_calls,
        "padded_batch_sizes": list(getattr(sampler, "batch_sizes", ()) or ()) or None,
        "jit_cache_sizes": jit_cache_sizes(sampler),
        "env_steps_returned": env_total,
        "agent_steps_returned": agent_total,
        "env_steps_reference": device_steps if counter is None else ref_total,
        "episodes_finished": env_episodes,
        "agent_episodes_finished": ledger.episodes_finished,
        "resets_pending_at_end": reset_gap,
        "requested_per_call": want,
        "accounting_errors": mismatches,
        "tracker_bytes": ledger.size_bytes(),
    }


def jit_cache_sizes(sampler: Any) -> dict[str, int] | None:
    """Compiled variants of a host sampler's jitted policy functions (one per padded batch
    size used, at most), or ``None`` for other samplers."""
    fns = getattr(sampler, "policy_fns", None)
    if not fns:
        return None
    return {str(pid): int(fn._cache_size()) for pid, fn in fns.items()}


def warm_policy_fns(sampler: Any, policy: Any, params: Any) -> int:
    """Compiles a host sampler's jitted policy call (and its off-policy logp call, if any)
    for every padded batch size before the
    soak (the sampler compiles each size on its first use, which would otherwise happen at
    some later call); returns how many compiled. Stateless policies only (the state passed
    is the policy's ``initial_state((1, 1))``, as the sampler passes it)."""
    import jax

    before = compile_count()
    space = sampler.host_env.observation_space
    act_space = sampler.host_env.action_space
    for pid, fn in sampler.policy_fns.items():
        logp_fn = getattr(sampler, "logp_fns", {}).get(pid)  # off-policy rows' logp
        for b in sampler.batch_sizes:
            obs = np.zeros((b, 1, *space.shape), space.dtype)
            state = policy.initial_state((1, 1))
            jax.block_until_ready(fn(params, obs, jax.random.PRNGKey(0), state))
            if logp_fn is not None:
                act = np.zeros((b, 1, *act_space.shape), act_space.dtype)
                jax.block_until_ready(logp_fn(params, obs, act, state))
    return compile_count() - before


def count_rollouts(sampler: Any) -> None:
    """Counts the device sampler's rollout chunks (``_dispatch``) in
    ``sampler._soak_rollouts``: the device-side reference of the step accounting."""
    inner = sampler._dispatch
    sampler._soak_rollouts = 0

    def dispatch(params: Any, topup: bool) -> Any:
        sampler._soak_rollouts += 1
        return inner(params, topup)

    sampler._dispatch = dispatch


def verdict(phase: dict, max_growth: float, max_slope: float) -> str:
    """``"flat"`` / ``"GROWS"`` by the thresholds (module docstring); ``"too short"``
    below 100 calls (quick runs: the warm-up dominates)."""
    if phase["calls"] < 100:
        return "too short"
    g = phase["rss_growth"]
    ok = (
        g["fitted"] is not None
        and g["fitted"] < max_growth
        and g["slope"] is not None
        and g["slope"] < max_slope
    )
    d = phase["device_growth"]
    if d["fitted"] is not None:
        ok = ok and d["fitted"] < max_growth and d["slope"] < max_slope
    return "flat" if ok else "GROWS"


def run_sampler_soak(
    kinds: Sequence[str], calls: int, every: int, max_growth: float, max_slope: float
) -> list[dict]:
    phases = []
    for kind in kinds:
        log(f"sampler soak {kind}: {calls} sample() then {calls} sample_batch() calls")
        sampler, params, counter, cfg = make_sampler(kind)
        if counter is None:
            count_rollouts(sampler)
        for method in ("sample", "sample_batch"):
            if counter is None:
                sampler._soak_rollouts = 0
            ph = soak_phase(kind, method, sampler, params, counter, cfg, calls, every)
            ph["verdict"] = verdict(ph, max_growth, max_slope)
            g = ph["rss_growth"]
            log(
                f"  {method}: {_f(ph['calls_per_s'])} calls/s, RSS slope "
                f"{_f(g['slope'], '.0f')} B/call ({ph['verdict']}), recompiles "
                f"{ph['recompiles_after_first_call']}, accounting errors "
                f"{len(ph['accounting_errors'])}"
            )
            phases.append(ph)
        sampler.close()
        del sampler
        gc.collect()
    return phases


# --------------------------------------------------------------------------- serving soak


def episode_lengths(client: int, n: int, seed: int) -> list[int]:
    """The fixed episode lengths (5..40 steps) of one client."""
    rng = np.random.default_rng([seed, client])
    return [int(x) for x in rng.integers(5, MAX_EPISODE_LEN + 1, n)]


def serving_client(
    address: str, client: int, steps: int, seed: int, errors: list, sent: dict
) -> None:
    """One simulated client: its own PolicyClient; episodes until ``steps`` steps are sent.
    Records per episode index the steps it sent (``sent[(client, ep)] = n``)."""
    from jaxsampler.serving.client import PolicyClient

    c = PolicyClient(address)
    total = 0
    lengths = episode_lengths(client, MAX_EPISODES_PER_CLIENT, seed)
    try:
        for ep, n in enumerate(lengths):
            if total >= steps:
                break
            eid = c.start_episode(None)
            obs = np.zeros(4, np.float32)
            obs[0], obs[1] = client, ep
            for t in range(n):
                obs[2] = t
                if t % 7 == 6:
                    c.log_action(eid, obs, t % 2)
                else:
                    c.get_action(eid, obs)
                c.log_returns(eid, 1.0)
            obs[2] = n
            c.end_episode(eid, obs)
            sent[(client, ep)] = n
            total += n
        c.close()
    except Exception as e:  # reported, not raised: the soak counts errors
        errors.append(f"client {client}: {type(e).__name__}: {e}")


def run_clients(
    address: str, clients: Sequence[int], steps: int, seed: int
) -> tuple[dict, list, float]:
    """Runs ``clients`` (ids) as threads of this process; returns (sent, errors, wall s)."""
    errors: list[str] = []
    sent: dict = {}
    threads = [
        threading.Thread(target=serving_client, args=(address, c, steps, seed, errors, sent))
        for c in clients
    ]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return sent, errors, time.perf_counter() - t0


def _worker(address: str, first: int, count: int, steps: int, seed: int) -> None:
    """``--serving-worker``: runs clients ``first .. first+count-1``; prints one JSON line."""
    sent, errors, wall = run_clients(address, range(first, first + count), steps, seed)
    out = {"sent": [[c, e, n] for (c, e), n in sent.items()], "errors": errors, "wall_s": wall}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


class ServingSide:
    """The server process's side: PolicyServer + HostSampler thread + counters."""

    def __init__(
        self, clients: int, sample_timesteps: int, seed: int, max_finished_ids: int | None = None
    ):
        import jax

        import jaxsampler as js
        from jaxsampler.spaces import Box, Discrete

        obs_space, act_space = Box(-1e6, 1e6, (4,), np.float32), Discrete(2)
        kw = {} if max_finished_ids is None else {"max_finished_ids": max_finished_ids}
        # Each client runs one episode at a time: capacity 4x the clients keeps the
        # sampler's per-env rank table small (2x the capacity), so its cap is reached early
        # and what grows after that is a leak, not a table filling up.
        env = js.host_envs.ExternalEnv(
            obs_space,
            act_space,
            episode_timeout_s=60.0,
            max_concurrent_episodes=max(4 * clients, 16),
            **kw,
        )
        self.server = js.serving.PolicyServer(env, port=0)
        policy = js.MLPPolicy(obs_space, act_space, hidden_sizes=HIDDEN)
        self.params = policy.init(jax.random.PRNGKey(seed))
        buckets = tuple(b for b in (1, 2, 4, 8, 16, 32, 64, 128) if b <= max(2 * clients, 2))
        self.sampler = js.sampling.HostSampler(
            self.server, policy, seed=seed, timeout_s=0.25, batch_sizes=buckets
        )
        self.warm_up_compiles = warm_policy_fns(self.sampler, policy, self.params)
        self.sample_timesteps = sample_timesteps
        # counts[client, episode, t]: how often the sampler returned that step
        self.counts = np.zeros((clients, MAX_EPISODES_PER_CLIENT, MAX_EPISODE_LEN), np.uint16)
        self.bad_rows = 0
        self.rows = 0
        self.terminated_rows = 0
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="soak-sampler", daemon=True)
        self.mem: list[tuple[float, int, int]] = []  # (time s, rows so far, rss)

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.compiles0 = compile_count()
        self.thread.start()
        self.mem_thread = threading.Thread(target=self._watch, name="soak-rss", daemon=True)
        self.mem_thread.start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                b = self.sampler.sample_batch(self.params, num_timesteps=self.sample_timesteps)
            except Exception as e:
                self.errors.append(f"sampler: {type(e).__name__}: {e}")
                return
            for sb in b.policy_batches.values():
                if len(sb["t"]) == 0:
                    continue
                key = np.asarray(sb["obs"])[:, :3].astype(np.int64)
                c, e, t = key[:, 0], key[:, 1], key[:, 2]
                ok = (
                    (c >= 0)
                    & (c < self.counts.shape[0])
                    & (e >= 0)
                    & (e < self.counts.shape[1])
                    & (t >= 0)
                    & (t < self.counts.shape[2])
                )
                self.bad_rows += int((~ok).sum())
                np.add.at(self.counts, (c[ok], e[ok], t[ok]), 1)
                self.rows += len(key)
                self.terminated_rows += int(np.asarray(sb["terminateds"]).sum())

    def _watch(self) -> None:
        while not self.stop.is_set():
            self.mem.append((time.perf_counter() - self.t0, self.rows, rss_bytes()))
            self.stop.wait(0.5)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        self.mem_thread.join(5)
        self.server.close()


def run_serving_soak(
    steps: int,
    clients: int,
    procs: int,
    sample_timesteps: int,
    seed: int,
    max_finished_ids: int | None = None,
) -> dict[str, Any]:
    """Part (b): see the module docstring."""
    per_client = -(-steps // clients)
    log(f"serving soak: {clients} clients over {procs} process(es), >= {steps} steps")
    side = ServingSide(clients, sample_timesteps, seed, max_finished_ids)
    address = side.server.address
    side.start()
    shares = [clients // procs + (i < clients % procs) for i in range(procs)]
    workers = []
    first = 0
    for k in shares:
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.soak",
            "--serving-worker",
            address,
            str(first),
            str(k),
            str(per_client),
            str(seed),
        ]
        workers.append(subprocess.Popen(cmd, cwd=harness.ROOT, stdout=subprocess.PIPE, text=True))
        first += k
    sent: dict[tuple[int, int], int] = {}
    errors: list[str] = []
    worker_walls: list[float] = []
    for w in workers:
        out, _ = w.communicate(timeout=1800)
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if w.returncode != 0 or not lines:
            errors.append(f"client process exited with {w.returncode}")
            continue
        res = json.loads(lines[-1])
        worker_walls.append(res["wall_s"])
        sent.update({(c, e): n for c, e, n in res["sent"]})
        errors.extend(res["errors"])
    clients_done = time.perf_counter() - side.t0
    sent_steps = sum(sent.values())
    deadline = time.monotonic() + 30
    while side.rows < sent_steps and time.monotonic() < deadline:  # drain
        time.sleep(0.05)
    wall = time.perf_counter() - side.t0
    side.close()
    expected = np.zeros_like(side.counts)
    for (c, e), n in sent.items():
        expected[c, e, :n] = 1
    diff = side.counts.astype(np.int64) - expected
    lost = int((diff < 0).sum())
    dup = int(diff[diff > 0].sum())
    per_episode_mismatch = int(
        (side.counts.sum(axis=2).astype(np.int64) != expected.sum(axis=2)).sum()
    )
    ts = [m[0] for m in side.mem]
    step_x = [float(m[1]) for m in side.mem]
    rss = [m[2] for m in side.mem]
    return {
        "clients": clients,
        "client_processes": procs,
        "steps_target": steps,
        "steps_sent": sent_steps,
        "episodes_sent": len(sent),
        "steps_sampled": side.rows,
        "terminated_rows": side.terminated_rows,
        "lost_steps": lost,
        "duplicated_steps": dup,
        "episodes_with_count_mismatch": per_episode_mismatch,
        "rows_outside_any_episode": side.bad_rows,
        "client_errors": errors[:20],
        "client_error_count": len(errors),
        "sampler_errors": side.errors,
        "warm_up_compiles": side.warm_up_compiles,
        "compiles_during_run": compile_count() - side.compiles0,
        "padded_batch_sizes": list(side.sampler.batch_sizes),
        "jit_cache_sizes": jit_cache_sizes(side.sampler),
        "clients_wall_s": clients_done,
        "wall_s": wall,
        "client_threads_wall_s": max(worker_walls, default=None),
        "steps_per_s": sent_steps / max(worker_walls) if worker_walls else None,
        "rss_samples": [[round(t, 2), int(x), r] for t, x, r in zip(ts, step_x, rss, strict=True)],
        "rss_growth_per_step": growth(step_x, rss),
        "rss_growth_per_s": growth(ts, rss),
        "env_stats": dict(side.server.env.stats),
    }


# --------------------------------------------------------------------------- report


def _f(x: float | None, spec: str = ".0f", scale: float = 1.0) -> str:
    return harness.fmt(x, spec, scale, missing="n/a")


def _mib(x: float | None) -> str:
    return _f(x, ".2f", 1 / 2**20)


def _where(p: dict) -> str:
    calls = p["calls_that_compiled"]
    return f" (in calls {', '.join(map(str, calls))})" if calls else ""


def _cap_check(results: dict[str, Any]) -> list[str]:
    """Lines on a second serving run with a small ``max_finished_ids`` (if recorded under
    ``"serving_small_finished_cap"``)."""
    c = results.get("serving_small_finished_cap")
    if not c:
        return []
    g = c["serving"]["rss_growth_per_step"]
    return [
        "",
        f"Second run, `{c['command']}` ({c['date']}): server RSS slope "
        f"{_f(g['slope'], '.2f')} B/step ({_mib(g['fitted'])} MiB over the window), "
        f"{c['serving']['lost_steps']} lost / {c['serving']['duplicated_steps']} duplicated "
        f"steps, {_f(c['serving']['steps_per_s'])} steps/s. {c.get('note', '')}",
    ]


def _serving_verdict(s: dict, cfg: dict) -> str:
    fitted = s["rss_growth_per_step"]["fitted"]
    if fitted is None:
        return "n/a"
    return "flat" if fitted < cfg["max_growth_mib"] * 2**20 else "GROWS"


def markdown(results: dict[str, Any]) -> str:
    cfg, env = results["config"], results["environment"]
    lines = [
        "# Soak: long runs, memory and recompilation flat",
        "",
        f"{results['date']} · `{results['command']}` · jax {env['jax']} ({env['backend']}, "
        f"{len(env['devices'])} device(s)) · {env['cpu_count']} CPUs · Python {env['python']} · "
        f"MLPPolicy {HIDDEN} · wall {results['wall_s']:.0f} s",
        "",
    ]
    phases = results.get("samplers") or []
    if phases:
        lines += [
            "## Sampler soak",
            "",
            f"{cfg['calls']} consecutive calls per method (`sample()`, then `sample_batch()` "
            "from fresh episodes); memory sampled every "
            f"{cfg['every']} calls after `gc.collect()`. Slope = least-squares fit over the "
            f"calls after the first {WARMUP_FRACTION:.0%} (warm-up), growth = slope x that "
            "window. Verdict `flat`: fitted growth < "
            f"{cfg['max_growth_mib']} MiB and slope < {cfg['max_slope']:.0f} B/call (RSS and, "
            "where reported, device memory). Device memory: `bytes_in_use` of "
            "`memory_stats()`, n/a on CPU. Recompiles counted by "
            "`jaxsampler.cli.bench.compile_count()` after the first call (host samplers: their "
            "jitted policy call is compiled for every padded batch size before the first "
            "call, as it would be on each size's first use; the compiled variants stay at "
            "most one per size). calls/s: steady state, first call excluded.",
            "",
            "| sampler | env | method | calls/s | RSS start MiB | RSS slope B/call | "
            "RSS growth MiB (fit / last-first) | device slope B/call | verdict | "
            "compiles 1st call | recompiles after | env steps returned | reference | "
            "agent steps | episodes finished | accounting errors |",
            "|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for p in phases:
            g, d = p["rss_growth"], p["device_growth"]
            lines.append(
                f"| {p['sampler']} | {p['config']['env']} | `{p['method']}` | "
                f"{_f(p['calls_per_s'])} | {_mib(p['rss_bytes'][0])} | {_f(g['slope'])} | "
                f"{_mib(g['fitted'])} / {_mib(g['last_minus_first'])} | {_f(d['slope'])} | "
                f"**{p['verdict']}** | {p['compiles_first_call']} | "
                f"**{p['recompiles_after_first_call']}**{_where(p)} | {p['env_steps_returned']} | "
                f"{p['env_steps_reference']} | {p['agent_steps_returned']} | "
                f"{p['episodes_finished']} | **{len(p['accounting_errors'])}** |"
            )
        lines += [
            "",
            "Step accounting, per call: env steps returned = `metrics.num_env_steps_sampled` "
            ">= `num_timesteps` requested, agent steps = `metrics.num_agent_steps_sampled`, "
            "and for host envs = the env's own `step` count; every episode id's chunks / rows "
            "continue without gap or repeat and finished ids never come back. Reference "
            "column: host envs, their own step count (must equal env steps returned); device, "
            "rollout calls x num_envs x rollout_length, which must equal env steps returned + "
            "one reset step per finished episode (0..num_envs resets still pending at the "
            "end). The ledger that checks this keeps finished ids' hashes in an array "
            f"preallocated and written at the start of each phase "
            f"({phases[0]['tracker_bytes'] / 2**20:.1f} MiB), so it adds no growth to the "
            "measured RSS.",
            "",
        ]
        errs = [e for p in phases for e in p["accounting_errors"]]
        if errs:
            lines += ["Accounting errors:", ""] + [f"- {e}" for e in errs] + [""]
    s = results.get("serving")
    if s:
        g, gt = s["rss_growth_per_step"], s["rss_growth_per_s"]
        lines += [
            "## Serving soak",
            "",
            f"PolicyServer over ExternalEnv (obs float32 (4,), Discrete(2)), HostSampler thread "
            f"looping `sample_batch(num_timesteps={cfg['sample_timesteps']})`; {s['clients']} "
            f"clients (one remote-mode PolicyClient each) in {s['client_processes']} "
            "process(es), episodes of 5-40 steps (every 7th step `log_action`, the others "
            "`get_action`, each followed by `log_returns`). Server RSS sampled every 0.5 s; "
            "slope fit over the last 80% of the run.",
            "",
            "| quantity | value |",
            "|---|---:|",
            f"| steps sent by clients | {s['steps_sent']} ({s['episodes_sent']} episodes) |",
            f"| steps in sampled batches | {s['steps_sampled']} |",
            f"| lost / duplicated steps | **{s['lost_steps']} / {s['duplicated_steps']}** |",
            "| episodes whose per-episode counts differ | "
            f"**{s['episodes_with_count_mismatch']}** |",
            f"| client errors / sampler errors | **{s['client_error_count']} / "
            f"{len(s['sampler_errors'])}** |",
            f"| compiles during the run (after warming every padded batch size "
            f"{s['padded_batch_sizes']}) | **{s['compiles_during_run']}** |",
            f"| steps/s (client threads' wall time {_f(s['client_threads_wall_s'], '.1f')} s; "
            f"with process start-up {s['clients_wall_s']:.1f} s) | **{_f(s['steps_per_s'])}** |",
            f"| server RSS first / last sample, MiB | {_mib(s['rss_samples'][0][2])} / "
            f"{_mib(s['rss_samples'][-1][2])} |"
            if s["rss_samples"]
            else "| server RSS | n/a |",
            f"| server RSS slope, B/step (growth over window, MiB) | {_f(g['slope'], '.2f')} "
            f"({_mib(g['fitted'])}) |",
            f"| server RSS slope, KiB/s | {_f(gt['slope'], '.1f', 1 / 1024)} |",
            f"| verdict (fitted growth over the window < {cfg['max_growth_mib']} MiB) | "
            f"**{_serving_verdict(s, cfg)}** |",
            "",
            "The ExternalEnv remembers the ids of finished episodes (for its 'already "
            "completed' errors) up to `max_finished_ids` (default 100,000), so its memory "
            "grows with the episodes served until that cap and then stays flat; "
            "`--max-finished-ids` sets a smaller cap to tell that growth from a leak.",
            *_cap_check(results),
            "",
        ]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    out: dict[str, Any] = {
        **harness.stamp(
            "Soak: samplers and serving over long runs (memory, recompiles, steps)",
            "soak",
            args.argv,
        ),
        "config": {
            "calls": args.calls,
            "every": args.every,
            "samplers": list(args.samplers),
            "max_growth_mib": args.max_growth_mib,
            "max_slope": args.max_slope,
            "serving_steps": args.serving_steps,
            "clients": args.clients,
            "client_procs": args.client_procs,
            "sample_timesteps": args.sample_timesteps,
            "max_finished_ids": args.max_finished_ids,
            "seed": args.seed,
            "policy": f"MLPPolicy {HIDDEN}",
        },
        "environment": environment_info(),
        "git": harness.git_state(include_untracked=True),
    }
    compile_count()  # start listening before anything compiles
    if "samplers" in args.parts:
        out["samplers"] = run_sampler_soak(
            args.samplers, args.calls, args.every, args.max_growth_mib * 2**20, args.max_slope
        )
    if "serving" in args.parts:
        out["serving"] = run_serving_soak(
            args.serving_steps,
            args.clients,
            args.client_procs,
            args.sample_timesteps,
            args.seed,
            args.max_finished_ids,
        )
    out["wall_s"] = time.perf_counter() - started
    return out


def failures(results: dict[str, Any]) -> list[str]:
    """What the soak found wrong (empty when everything held)."""
    bad = []
    for p in results.get("samplers") or []:
        tag = f"{p['sampler']}/{p['method']}"
        if p["recompiles_after_first_call"]:
            bad.append(f"{tag}: {p['recompiles_after_first_call']} recompiles after call 0")
        sizes = p["padded_batch_sizes"]
        if sizes is not None and max(p["jit_cache_sizes"].values()) > len(sizes):
            # host samplers compile each padded batch size once, never again
            bad.append(f"{tag}: more compiled variants than batch sizes {p['jit_cache_sizes']}")
        bad += [f"{tag}: {e}" for e in p["accounting_errors"]]
        if p["verdict"] == "GROWS":
            bad.append(f"{tag}: memory grows ({p['rss_growth']})")
    s = results.get("serving")
    if s:
        for k in (
            "lost_steps",
            "duplicated_steps",
            "client_error_count",
            "rows_outside_any_episode",
        ):
            if s[k]:
                bad.append(f"serving: {k} = {s[k]}")
        if s["compiles_during_run"]:
            bad.append(f"serving: {s['compiles_during_run']} compiles during the run")
        if s["sampler_errors"]:
            bad.append(f"serving: sampler errors {s['sampler_errors']}")
        if s["steps_sent"] < s["steps_target"]:
            bad.append(f"serving: only {s['steps_sent']} of {s['steps_target']} steps sent")
    return bad


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--samplers", nargs="+", choices=SAMPLERS, default=list(SAMPLERS))
    p.add_argument("--calls", type=int, help="calls per method and sampler (default 1000)")
    p.add_argument("--every", type=int, help="memory sample every N calls (default 20)")
    p.add_argument("--max-growth-mib", type=float, default=8.0, help="verdict threshold")
    p.add_argument("--max-slope", type=float, default=2048.0, help="verdict threshold, B/call")
    p.add_argument("--serving-steps", type=int, help="serving soak steps (default 200000)")
    p.add_argument("--clients", type=int, help="serving soak clients (default 64)")
    p.add_argument("--client-procs", type=int, help="client processes (default 4)")
    p.add_argument("--sample-timesteps", type=int, default=2048)
    p.add_argument(
        "--max-finished-ids",
        type=int,
        help="serving: the ExternalEnv's max_finished_ids (default: the env's, 100000)",
    )
    p.add_argument("--seed", type=int, default=0)
    harness.add_quick_out(p, "soak", quick="< 60 s smoke run; prints")
    p.add_argument("--serving-worker", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.serving_worker:
        address, first, count, steps, seed = args.serving_worker
        _worker(address, int(first), int(count), int(steps), int(seed))
        return 0
    SIZES.apply(args)
    results = run(args)
    results["failures"] = failures(results)
    harness.finish(results, markdown(results), "soak", harness.results_dir(args.out, args.quick))
    for f in results["failures"]:
        log(f"FAILED: {f}")
    return 1 if results["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
