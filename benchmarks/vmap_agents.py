"""Does lifting per-agent logic with ``vector.vmap_agents`` cost anything? Spread, 8 agents.

``Spread`` is written on :class:`jaxsampler.envs.base.MultiAgentEnv`: each agent's
observation (and reward, flags) is a one-agent function lifted onto the agent axis with
``jax.vmap`` over ``jnp.arange(num_agents)``. ``WholeArraySpread`` below is the same env
hand-written as whole-array code over ``[N, ...]`` (the form Spread had before: one
gather of the other agents' positions for all agents at once). Both produce
bit-identical outputs (checked here before timing).

Two measurements per width (1024 and 4096 envs, ``T = 128``), each side by side:

* **env**: one jitted ``lax.scan`` of ``T`` vectorized ``env.step`` calls with random
  actions (the env alone: where a per-agent vmap would show);
* **rollout**: ``js.jit_rollout(js.make_rollout(env, RandomPolicy, W, T))`` with donated
  buffers (what users run: env + auto-reset + buffer writes).

The two envs alternate call by call (the order flips every round); the reported ratio
``MultiAgentEnv / whole-array`` is the median over rounds of the within-round ratio, so
load from other processes hits both alike. Compile time (first call) is reported apart.

Usage::

    python -m benchmarks.vmap_agents              # writes results/vmap_agents.{json,md}
    python -m benchmarks.vmap_agents --quick      # smoke test, prints only
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

import jaxsampler as js
from benchmarks import harness
from benchmarks.harness import timed
from jaxsampler import vector
from jaxsampler.envs.spread import _PUSH, Spread, SpreadParams, SpreadState
from jaxsampler.types import NoInfo, TimeStep

LOAD_BEFORE = os.getloadavg()[0]  # other processes on the machine: the spread of the ratios


@dataclasses.dataclass(frozen=True)
class WholeArraySpread(js.Env):
    """Spread's ``reset``/``step`` written by hand over the whole agent axis."""

    n: int = 8
    num_agents: ClassVar[int] = 8

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_agents", self.n)

    @property
    def default_params(self) -> SpreadParams:
        return SpreadParams()

    @property
    def observation_space(self) -> js.spaces.Box:
        return Spread(self.n).observation_space

    @property
    def action_space(self) -> js.spaces.Discrete:
        return Spread(self.n).action_space

    def _obs(self, s: SpreadState) -> jax.Array:
        n = self.n
        rel_land = s.landmarks[None, :, :] - s.pos[:, None, :]
        rel_agents = s.pos[None, :, :] - s.pos[:, None, :]
        others = np.array([[j for j in range(n) if j != i] for i in range(n)], np.int32)
        rel_others = jnp.take_along_axis(rel_agents, others.reshape(n, n - 1)[:, :, None], 1)
        parts = [s.vel, s.pos, rel_land.reshape(n, -1), rel_others.reshape(n, -1)]
        return jnp.concatenate(parts, axis=-1).astype(jnp.float32)

    def _ts(self, s: SpreadState, reward: jax.Array, truncated: jax.Array) -> TimeStep:
        n = self.n
        return TimeStep(
            obs=self._obs(s),
            reward=jnp.broadcast_to(reward, (n,)).astype(jnp.float32),
            terminated=jnp.zeros((n,), jnp.bool_),
            truncated=jnp.broadcast_to(truncated, (n,)),
            acting=jnp.ones((n,), jnp.bool_),
            info=NoInfo(),
        )

    def reset(self, key: jax.Array, params: Any = None) -> tuple[SpreadState, TimeStep]:
        k_pos, k_land = jax.random.split(key)
        pos = jax.random.uniform(k_pos, (self.n, 2), jnp.float32, -1.0, 1.0)
        landmarks = jax.random.uniform(k_land, (self.n, 2), jnp.float32, -1.0, 1.0)
        zeros = jnp.zeros((self.n, 2), jnp.float32)
        s = SpreadState(pos, zeros, landmarks, jnp.zeros((), jnp.int32))
        return s, self._ts(s, jnp.zeros((), jnp.float32), jnp.asarray(False))

    def step(
        self, key: jax.Array, state: SpreadState, action: Any, params: Any = None
    ) -> tuple[SpreadState, TimeStep]:
        params = self.default_params if params is None else params
        push = jnp.asarray(_PUSH)[action]
        vel = state.vel * (1.0 - params.damping) + push * params.accel * params.dt
        pos = state.pos + vel * params.dt
        s = SpreadState(
            pos.astype(jnp.float32), vel.astype(jnp.float32), state.landmarks, state.time + 1
        )
        dist = jnp.linalg.norm(s.landmarks[:, None, :] - s.pos[None, :, :], axis=-1)
        coverage = -jnp.sum(jnp.min(dist, axis=1))
        gap = jnp.linalg.norm(s.pos[:, None, :] - s.pos[None, :, :], axis=-1)
        pairs = jnp.sum(jnp.triu(gap < 2 * params.agent_radius, k=1))
        reward = coverage - params.collision_penalty * pairs
        return s, self._ts(s, reward, s.time >= params.max_steps_in_episode)


def env_scan(env: js.Env, num_envs: int, length: int) -> tuple[Callable[..., Any], Any]:
    """``(jitted run(carry) -> carry, carry)``: ``length`` vectorized steps, random actions."""
    params = env.default_params
    state, _ = vector.reset(env, jax.random.split(jax.random.PRNGKey(0), num_envs), params)

    def run(carry: tuple[Any, jax.Array, jax.Array]) -> tuple[Any, jax.Array, jax.Array]:
        def body(c: tuple[Any, jax.Array, jax.Array], _: None) -> tuple[Any, None]:
            s, key, acc = c
            key, k_act, k_step = jax.random.split(key, 3)
            action = jax.random.randint(k_act, (num_envs, env.num_agents), 0, 5)
            s, ts = vector.step(env, jax.random.split(k_step, num_envs), s, action, params)
            return (s, key, acc + ts.reward.sum() + ts.obs.sum()), None

        out, _ = jax.lax.scan(body, carry, None, length=length)
        return out

    return jax.jit(run), (state, jax.random.PRNGKey(1), jnp.zeros((), jnp.float32))


def rollout_runner(env: js.Env, num_envs: int, length: int) -> tuple[Callable[..., Any], Any]:
    """``(run(box) -> traj, box)``: the jitted rollout, buffers passed back (donated)."""
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    rollout = js.jit_rollout(js.make_rollout(env, pol, num_envs, length))
    box = {"state": rollout.init(jax.random.PRNGKey(2)), "traj": None}

    def run(b: dict[str, Any]) -> Any:
        b["state"], b["traj"] = rollout((), b["state"], b["traj"])
        return b["traj"]

    return run, box


def check_identical(new: js.Env, old: js.Env, num_envs: int) -> None:
    """Both envs give the same rollout bit for bit (else the timing compares nothing)."""
    pol = js.RandomPolicy(new.observation_space, new.action_space)
    outs = []
    for env in (new, old):
        rollout = js.make_rollout(env, pol, num_envs, 40)
        outs.append(jax.jit(rollout)((), rollout.init(jax.random.PRNGKey(3))))
    for a, b in zip(jax.tree.leaves(outs[0]), jax.tree.leaves(outs[1]), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def measure(kind: str, width: int, length: int, rounds: int, n: int) -> dict[str, Any]:
    """One cell: both envs compiled, then ``rounds`` alternating timed calls each."""
    make = env_scan if kind == "env" else rollout_runner
    sides = {"vmap_agents": Spread(n), "whole_array": WholeArraySpread(n)}
    runners, carries, compile_s = {}, {}, {}

    def step(name: str) -> float:
        """Seconds of one call of ``name``'s runner (the env scan carries its carry on)."""
        fn, carry = runners[name], carries[name]
        if kind != "env":
            return timed(lambda: fn(carry))
        t0 = time.perf_counter()
        carries[name] = jax.block_until_ready(fn(carry))
        return time.perf_counter() - t0

    for name, env in sides.items():
        runners[name], carries[name] = make(env, width, length)
        compile_s[name] = step(name)
    times: dict[str, list[float]] = {name: [] for name in sides}
    ratios = []
    for r in range(rounds):
        this = {}
        for name in harness.alternated(list(sides), r):
            this[name] = step(name)
            times[name].append(this[name])
        ratios.append(this["vmap_agents"] / this["whole_array"])
    agent_steps = width * n * length
    return {
        "kind": kind,
        "num_envs": width,
        "num_agents": n,
        "rollout_length": length,
        "rounds": rounds,
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        **{f"{name}_median_s": statistics.median(ts) for name, ts in times.items()},
        **{
            f"{name}_agent_steps_per_s": agent_steps / statistics.median(ts)
            for name, ts in times.items()
        },
        **{f"{name}_compile_s": s for name, s in compile_s.items()},
    }


def markdown(rows: list[dict[str, Any]], info: dict[str, Any]) -> str:
    lines = [
        "# vmap_agents: per-agent logic lifted with `jax.vmap` vs whole-array code",
        "",
        f"Spread, {rows[0]['num_agents']} agents, T = {rows[0]['rollout_length']}, random "
        "actions; ratio = `MultiAgentEnv` (vmap over agent ids) / hand-written whole-array "
        "step, median over alternating rounds (< 1: the vmapped env is faster). "
        f"{info['when']}, jax {info['jax']}, backend {info['backend']} "
        f"x{info['device_count']}; 1-min load average {info['loadavg_1m_before']:.1f} before, "
        f"{info['loadavg_1m_after']:.1f} after (other processes share the cores: the "
        "min..max spread is theirs, the alternation keeps the median ratio fair).",
        "",
        "| measured | envs | ratio (median) | ratio min..max | vmap_agents agent-steps/s "
        "| whole-array agent-steps/s | compile s (vmap / whole) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['kind']} | {r['num_envs']} | {r['ratio_median']:.3f} | "
            f"{r['ratio_min']:.3f}..{r['ratio_max']:.3f} | "
            f"{r['vmap_agents_agent_steps_per_s']:,.0f} | "
            f"{r['whole_array_agent_steps_per_s']:,.0f} | "
            f"{r['vmap_agents_compile_s']:.2f} / {r['whole_array_compile_s']:.2f} |"
        )
    lines += [
        "",
        "env = a jitted `lax.scan` of vectorized `env.step` only; rollout = "
        "`js.jit_rollout(js.make_rollout(...))` with `RandomPolicy` and donated buffers. "
        "Both envs were checked bit-identical before timing.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--widths", default="1024,4096")
    p.add_argument("--agents", type=int, default=8)
    p.add_argument("--rollout-length", type=int, default=128)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--quick", action="store_true", help="tiny sizes, print only")
    p.add_argument("--out", type=Path, default=harness.RESULTS_DIR)
    args = p.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]
    length, rounds = args.rollout_length, args.rounds
    if args.quick:
        widths, length, rounds = [64], 16, 3
    check_identical(Spread(args.agents), WholeArraySpread(args.agents), 8)
    rows = []
    for kind in ("env", "rollout"):
        for w in widths:
            print(f"{kind} width {w} ...", file=sys.stderr, flush=True)
            rows.append(measure(kind, w, length, rounds, args.agents))
            print(f"  ratio {rows[-1]['ratio_median']:.3f}", file=sys.stderr, flush=True)
    info = {
        "when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device_count": jax.device_count(),
        "loadavg_1m_before": LOAD_BEFORE,
        "loadavg_1m_after": os.getloadavg()[0],
    }
    payload = {"results": rows, "environment": info, "argv": argv or sys.argv[1:]}
    out = None if args.quick else args.out
    harness.finish(payload, markdown(rows, info), "vmap_agents", out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
