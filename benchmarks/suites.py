"""Sampling throughput per env suite: jaxsampler against a hand-written loop of the SAME env.

For one env of each suite (gymnax, brax, jumanji, pgx, jaxmarl), two implementations run
side by side in one process, with the same policy and the same parameters:

* ``jaxsampler``: ``js.jit_rollout(js.make_rollout(js.make("<suite>:<id>"), policy, E, T))``,
  the jitted ``lax.scan`` into preallocated, donated ``[T, E, A]`` buffers, next-step
  auto-reset (the step after an episode end resets and takes no action).
* ``handwritten``: what a user writes against the suite's own API: ``jax.vmap`` of its
  reset/step over ``E`` envs inside one jitted ``lax.scan`` of ``T`` steps, a same-step
  auto-reset (the suite's own, as gymnax and JaxMARL ``step`` do, or a ``jnp.where`` of a
  fresh reset where the suite's step does not reset), keys split per env per step, the
  same policy applied to the suite's own observation, and the transitions (obs, action,
  reward, terminated, truncated, logp, value) stacked as the scan's output.

The policy is jaxsampler's ``MLPPolicy`` (64x64 tanh actor-critic, categorical or
Gaussian head, masked logits where the observation carries an action mask), built for
the adapter's spaces and called on both sides as a plain function of ``(params, obs,
key)``, so the network, the sampling and the parameters are identical.

**Agent-steps** are (env, agent) pairs whose action was applied in a step: acting agents
only. jaxsampler counts them from ``traj.acting`` (reset steps count none); the
hand-written loops count what they applied (every env step is an action for each of its
acting agents: 1 for gymnax/brax/jumanji, the player to move for pgx's two-player
games, 3 for JaxMARL's simple spread).

Measurement, as ``benchmarks/throughput.py`` (the loops' carry and transitions are
:mod:`benchmarks.baselines`'): each side is compiled first (compile time
reported apart), then ``--repeats`` rounds; in each round each side times enough calls to
take ~0.2 s, at least 3 (the same number of calls for both), the order alternating between rounds.
A figure is the median over all timed calls; a ratio is the median over rounds of the
within-round ratio. Every timed call blocks on its result before the clock is read.

Usage::

    python -m benchmarks.suites              # full run (~5-10 min on 2 cores), writes results/
    python -m benchmarks.suites --quick      # smoke test (E=8, T=8, 1 round), prints only
    python -m benchmarks.suites --suites gymnax pgx --widths 64 --repeats 3
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxsampler as js
from benchmarks import harness
from benchmarks.baselines import HandCarry, HandTransition
from jaxsampler.cli.bench import environment_info
from jaxsampler.envs.base import Env
from jaxsampler.policies import MLPPolicy, Policy
from jaxsampler.transforms.flatten import FlattenObservation

DEFAULT_WIDTHS = (64, 512)
SIZES = harness.Sizes(
    full={
        "widths": list(DEFAULT_WIDTHS),
        "rollout_length": 128,
        "repeats": 5,
        "target_s": 0.2,
        "min_calls": 3,
    },
    quick={"widths": [8], "rollout_length": 8, "repeats": 1, "target_s": 0.0, "min_calls": 1},
)
#: Packages whose versions are recorded with the results.
VERSIONS = ("gymnax", "brax", "mujoco", "jumanji", "pgx", "jaxmarl")

#: ``(run(params, carry) -> (carry, transitions), carry, agent-steps per call)``.
Baseline = tuple[Callable[[Any, Any], tuple[Any, Any]], Any, int]


def where_reset(done: jax.Array, fresh: Any, current: Any) -> Any:
    """Leaf-wise ``where(done[e], fresh, current)`` for leaves ``[E, ...]``."""

    def sel(a: jax.Array, b: jax.Array) -> jax.Array:
        return jnp.where(done.reshape(done.shape + (1,) * (a.ndim - 1)), a, b)

    return jax.tree.map(sel, fresh, current)


def act(policy: Policy, params: Any, obs: Any, key: jax.Array) -> tuple[Any, Any, Any]:
    """``(action, logp, value)`` of the shared policy at ``obs`` (leaves ``[E, A, ...]``)."""
    action, extras, _ = policy(params, obs, key, policy.initial_state(()))
    return action, extras["action_logp"], extras["vf_preds"]


# --------------------------------------------------------------------------- baselines


def gymnax_baseline(
    env: Env, policy: Policy, num_envs: int, rollout_length: int, seed: int
) -> Baseline:
    """``vmap(gymnax env.step)`` (gymnax auto-resets inside ``step``) + the policy."""
    genv, gparams = env.env, env.params  # type: ignore[attr-defined]
    E = num_envs

    def run(params: Any, carry: HandCarry) -> tuple[HandCarry, HandTransition]:
        def step(c: HandCarry, _: Any) -> tuple[HandCarry, HandTransition]:
            key, k_act, k_step = jax.random.split(c.key, 3)
            action, logp, value = act(policy, params, c.obs, k_act)
            obs, state, reward, terminated, truncated, _ = jax.vmap(
                genv.step, in_axes=(0, 0, 0, None)
            )(jax.random.split(k_step, E), c.env_state, action[:, 0], gparams)
            tr = HandTransition(c.obs, action, reward, terminated, truncated, logp, value)
            return HandCarry(state, obs[:, None], key), tr

        return jax.lax.scan(step, carry, None, rollout_length)

    key, k = jax.random.split(jax.random.PRNGKey(seed))
    obs, state = jax.vmap(genv.reset, in_axes=(0, None))(jax.random.split(k, E), gparams)
    return jax.jit(run), HandCarry(state, obs[:, None], key), E * rollout_length


def jaxmarl_baseline(
    env: Env, policy: Policy, num_envs: int, rollout_length: int, seed: int
) -> Baseline:
    """``vmap(JaxMARL env.step)`` (it auto-resets inside ``step``) + the policy over the
    agents' observations stacked on an agent axis."""
    menv = env.env  # type: ignore[attr-defined]
    agents = tuple(menv.agents)
    E, A = num_envs, len(agents)

    def stack(d: dict[str, jax.Array]) -> jax.Array:
        return jnp.stack([d[a] for a in agents], axis=1)

    def run(params: Any, carry: HandCarry) -> tuple[HandCarry, HandTransition]:
        def step(c: HandCarry, _: Any) -> tuple[HandCarry, HandTransition]:
            key, k_act, k_step = jax.random.split(c.key, 3)
            action, logp, value = act(policy, params, c.obs, k_act)
            actions = {a: action[:, i] for i, a in enumerate(agents)}
            obs, state, reward, done, _ = jax.vmap(menv.step)(
                jax.random.split(k_step, E), c.env_state, actions
            )
            terminated = stack(done)
            tr = HandTransition(
                c.obs, action, stack(reward), terminated, jnp.zeros_like(terminated), logp, value
            )
            return HandCarry(state, stack(obs), key), tr

        return jax.lax.scan(step, carry, None, rollout_length)

    key, k = jax.random.split(jax.random.PRNGKey(seed))
    obs, state = jax.vmap(menv.reset)(jax.random.split(k, E))
    return jax.jit(run), HandCarry(state, stack(obs), key), E * rollout_length * A


def policy_input(env: Env, obs: Any, mask: jax.Array | None) -> Any:
    """The policy's input from a suite's own observation (leaves ``[E, A, ...]``): the
    observation, or a masked ``Dict(observations, action_mask)`` where the adapter's
    observation space is one (so the policy is the same network on both sides)."""
    space = env.observation_space
    if mask is not None and isinstance(space, js.spaces.Dict) and "action_mask" in space.spaces:
        return {"observations": obs, "action_mask": mask}
    return obs


def pgx_baseline(
    env: Env, policy: Policy, num_envs: int, rollout_length: int, seed: int
) -> Baseline:
    """``vmap(pgx init/step)``: the player to move observes (``state.observation``,
    ``legal_action_mask``) and acts; a ``where`` of a fresh ``init`` on termination or
    truncation (pgx's step does not reset). One agent-step per env step."""
    penv = env.env  # type: ignore[attr-defined]
    E = num_envs

    def observe(s: Any) -> Any:
        return policy_input(env, s.observation[:, None], s.legal_action_mask[:, None])

    def run(params: Any, carry: HandCarry) -> tuple[HandCarry, HandTransition]:
        def step(c: HandCarry, _: Any) -> tuple[HandCarry, HandTransition]:
            key, k_act, k_step, k_reset = jax.random.split(c.key, 4)
            action, logp, value = act(policy, params, c.obs, k_act)
            s = jax.vmap(penv.step)(c.env_state, action[:, 0], jax.random.split(k_step, E))
            fresh = jax.vmap(penv.init)(jax.random.split(k_reset, E))
            nxt = where_reset(s.terminated | s.truncated, fresh, s)
            tr = HandTransition(c.obs, action, s.rewards, s.terminated, s.truncated, logp, value)
            return HandCarry(nxt, observe(nxt), key), tr

        return jax.lax.scan(step, carry, None, rollout_length)

    key, k = jax.random.split(jax.random.PRNGKey(seed))
    state = jax.vmap(penv.init)(jax.random.split(k, E))
    return jax.jit(run), HandCarry(state, observe(state), key), E * rollout_length


def jumanji_baseline(
    env: Env, policy: Policy, num_envs: int, rollout_length: int, seed: int
) -> Baseline:
    """``vmap(jumanji reset/step)`` with a ``where`` of a fresh reset when
    ``timestep.last()`` (what jumanji's auto-reset wrapper does); terminated where the
    discount is 0, truncated where an episode ends with a non-zero discount."""
    jenv = env.env  # type: ignore[attr-defined]
    E = num_envs
    to_obs = _jumanji_observer(env)

    def run(params: Any, carry: HandCarry) -> tuple[HandCarry, HandTransition]:
        def step(c: HandCarry, _: Any) -> tuple[HandCarry, HandTransition]:
            key, k_act, k_reset = jax.random.split(c.key, 3)
            action, logp, value = act(policy, params, c.obs, k_act)
            state, ts = jax.vmap(jenv.step)(c.env_state, action[:, 0])
            done = ts.last()
            fresh_state, fresh_ts = jax.vmap(jenv.reset)(jax.random.split(k_reset, E))
            state = where_reset(done, fresh_state, state)
            obs = where_reset(done, fresh_ts.observation, ts.observation)
            ended = ts.discount == 0
            tr = HandTransition(c.obs, action, ts.reward, done & ended, done & ~ended, logp, value)
            return HandCarry(state, to_obs(obs), key), tr

        return jax.lax.scan(step, carry, None, rollout_length)

    key, k = jax.random.split(jax.random.PRNGKey(seed))
    state, ts = jax.vmap(jenv.reset)(jax.random.split(k, E))
    return jax.jit(run), HandCarry(state, to_obs(ts.observation), key), E * rollout_length


def _jumanji_observer(env: Env) -> Callable[[Any], Any]:
    """Jumanji ``Observation`` (leaves ``[E, ...]``) -> the policy input ``[E, 1, ...]``:
    what ``FlattenObservation`` makes of the adapter's masked Dict, written by hand: the
    fields other than the mask (here Game2048's ``board``) as one float32 vector, next to
    the action mask."""

    def to_obs(o: Any) -> Any:
        flat = jnp.reshape(o.board, (o.board.shape[0], 1, -1)).astype(jnp.float32)
        return {"observations": flat, "action_mask": o.action_mask[:, None]}

    return to_obs


def brax_baseline(
    env: Env, policy: Policy, num_envs: int, rollout_length: int, seed: int
) -> Baseline:
    """``vmap(brax env.reset/env.step)`` (no brax wrappers), a step counter for the time
    limit the adapter applies, and a ``where`` of a fresh reset on ``done`` or the limit;
    actions clipped to the action bounds as the adapter does."""
    benv = env.env  # type: ignore[attr-defined]
    limit = int(_episode_length(env))
    low = jnp.asarray(env.action_space.low)  # type: ignore[attr-defined]
    high = jnp.asarray(env.action_space.high)  # type: ignore[attr-defined]
    E = num_envs

    def run(params: Any, carry: HandCarry) -> tuple[HandCarry, HandTransition]:
        def step(c: HandCarry, _: Any) -> tuple[HandCarry, HandTransition]:
            key, k_act, k_reset = jax.random.split(c.key, 3)
            action, logp, value = act(policy, params, c.obs, k_act)
            s = jax.vmap(benv.step)(c.env_state, jnp.clip(action[:, 0], low, high))
            t = c.extra + 1
            terminated = s.done > 0
            truncated = (t >= limit) & ~terminated
            done = terminated | truncated
            fresh = jax.vmap(benv.reset)(jax.random.split(k_reset, E))
            s = where_reset(done, fresh, s)
            t = jnp.where(done, 0, t)
            tr = HandTransition(c.obs, action, s.reward, terminated, truncated, logp, value)
            return HandCarry(s, s.obs[:, None], key, t), tr

        return jax.lax.scan(step, carry, None, rollout_length)

    key, k = jax.random.split(jax.random.PRNGKey(seed))
    state = jax.vmap(benv.reset)(jax.random.split(k, E))
    carry = HandCarry(state, state.obs[:, None], key, jnp.zeros(E, jnp.int32))
    return jax.jit(run), carry, E * rollout_length


def _episode_length(env: Env) -> int:
    """The adapter's time limit (its params' ``episode_length`` or ``max_steps_in_episode``)."""
    for name in ("episode_length", "max_steps_in_episode"):
        if hasattr(env.default_params, name):
            return int(getattr(env.default_params, name))
    raise AttributeError(f"cannot find the time limit in {env.default_params!r}")


@dataclasses.dataclass(frozen=True)
class Suite:
    """One row of the table: a ``js.make`` id and its hand-written baseline.

    ``baseline(env, policy, E, T, seed)`` gets the adapter (for the wrapped suite env
    and its params only) and returns ``(jitted run, carry, agent-steps per call)``.
    """

    name: str
    module: str  # the suite's package: missing -> the row is skipped with the reason
    env_id: str
    baseline: Callable[[Env, Policy, int, int, int], Baseline]
    agent_steps: str  # what one agent-step is here (for the table's notes)
    make_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Transforms on jaxsampler's side (the baseline does the same work by hand), e.g.
    #: flattening a structured observation into the policy's input.
    transforms: tuple[Any, ...] = ()


SUITES: dict[str, Suite] = {
    s.name: s
    for s in (
        Suite(
            "gymnax",
            "gymnax",
            "gymnax:Breakout-MinAtar",
            gymnax_baseline,
            "1 agent: every env step of the hand-written loop; jaxsampler's non-reset steps",
        ),
        Suite(
            "brax",
            "brax",
            "brax:inverted_pendulum",
            brax_baseline,
            "1 agent: every env step of the hand-written loop; jaxsampler's non-reset steps",
        ),
        Suite(
            "jumanji",
            "jumanji",
            # Game2048: a Dict observation (board + action mask) that FlattenObservation
            # turns into the policy's masked input. (Snake's step counter is a
            # Discrete(4000) field: a 4000-wide one-hot input, not a fair policy.)
            "jumanji:Game2048-v1",
            jumanji_baseline,
            "1 agent: every env step of the hand-written loop; jaxsampler's non-reset steps",
            transforms=(FlattenObservation(),),
        ),
        Suite(
            "pgx",
            "pgx",
            "pgx:tic_tac_toe",
            pgx_baseline,
            "2 players, 1 moves per step: one agent-step per env step (the player to move); "
            "jaxsampler's agent axis is 2 wide, its acting fraction at most 1/2",
        ),
        Suite(
            "pgx_connect_four",
            "pgx",
            "pgx:connect_four",
            pgx_baseline,
            "2 players, 1 moves per step, as tic-tac-toe; longer games (7 to 42 moves), so "
            "fewer reset steps",
        ),
        Suite(
            "jaxmarl",
            "jaxmarl",
            "jaxmarl:MPE_simple_spread_v3",
            jaxmarl_baseline,
            "3 agents act in every step (no agent is done before the episode ends)",
        ),
    )
}


# --------------------------------------------------------------------------- timing


class Timed:
    """A compiled ``call() -> (output, agent-steps)`` and its timings."""

    def __init__(self, call: Callable[[], Any], count: Callable[[Any], int]):
        self.call, self.count = call, count
        self.compile_s = harness.timed(call)
        self.times: list[float] = []
        self.steps: list[int] = []
        self.round_rate: list[float] = []  # agent-steps/s of each round (medians)
        self.round_s: list[float] = []  # median seconds per call of each round

    def round(self, calls: int) -> None:
        times, steps = [], []
        for _ in range(calls):
            t0 = time.perf_counter()
            out = jax.block_until_ready(self.call())
            times.append(time.perf_counter() - t0)
            steps.append(self.count(out))  # outside the timing
        self.times += times
        self.steps += steps
        self.round_rate.append(statistics.median(steps) / statistics.median(times))
        self.round_s.append(statistics.median(times))

    def summary(self, env_steps: int) -> dict[str, Any]:
        med = statistics.median(self.times)
        return {
            "compile_s": self.compile_s,
            "median_s": med,
            "agent_steps_per_call": statistics.median(self.steps),
            "agent_steps_per_s": statistics.median(self.steps) / med,
            "env_steps_per_s": env_steps / med,
            "round_agent_steps_per_s": self.round_rate,
            "round_median_s": self.round_s,
            "times_s": self.times,
        }


def jaxsampler_side(
    env: Env, policy: Policy, params: Any, E: int, T: int, seed: int, transforms: tuple = ()
) -> Timed:
    """``jit_rollout(make_rollout(...))``, passing each call's buffers to the next."""
    rollout = js.jit_rollout(js.make_rollout(env, policy, E, T, transforms=transforms))
    box: dict[str, Any] = {"state": rollout.init(jax.random.PRNGKey(seed)), "traj": None}

    def call() -> Any:
        box["state"], box["traj"] = rollout(params, box["state"], box["traj"])
        return box["traj"]

    return Timed(call, lambda traj: int(np.asarray(traj.acting).sum()))


def handwritten_side(
    suite: Suite, env: Env, policy: Policy, params: Any, E: int, T: int, seed: int
) -> Timed:
    run, carry, per_call = suite.baseline(env, policy, E, T, seed)
    box = {"carry": carry}

    def call() -> Any:
        box["carry"], out = run(params, box["carry"])
        return out

    return Timed(call, lambda _: per_call)


def measure_suite(
    suite: Suite,
    widths: Sequence[int],
    T: int,
    repeats: int,
    target_s: float,
    seed: int,
    min_calls: int = 3,
) -> dict[str, Any]:
    """Both sides of one suite at each width, interleaved round by round."""
    env = js.make(suite.env_id, **suite.make_kwargs)
    if not isinstance(env, Env):
        raise TypeError(f"{suite.env_id} is not a JAX env")
    pipe = js.rollout.pipeline_of(env, suite.transforms)
    policy = MLPPolicy(pipe.observation_space, pipe.action_space, (64, 64))
    params = policy.init(jax.random.PRNGKey(seed))
    out: dict[str, Any] = {
        "env": env.name,
        "num_agents": env.num_agents,
        "observation_space": repr(env.observation_space),
        "action_space": repr(env.action_space),
        "agent_steps": suite.agent_steps,
        "by_width": {},
    }
    for E in widths:
        sides = {
            "jaxsampler": jaxsampler_side(env, policy, params, E, T, seed, suite.transforms),
            "handwritten": handwritten_side(suite, env, policy, params, E, T, seed),
        }
        probe = min(t for s in sides.values() for t in _probe(s))
        calls = max(min_calls, min(50, math.ceil(target_s / probe)))
        for r in range(repeats):
            for name in harness.alternated(list(sides), r):
                sides[name].round(calls)
        row: dict[str, Any] = {name: s.summary(E * T) for name, s in sides.items()}
        row["calls_per_round"] = calls
        row["ratio"] = harness.paired_ratio(
            row["jaxsampler"]["round_agent_steps_per_s"],
            row["handwritten"]["round_agent_steps_per_s"],
        )
        row["acting_fraction"] = row["jaxsampler"]["agent_steps_per_call"] / (
            E * T * env.num_agents
        )
        # Both sides run E x T env steps per call: the ratio splits into the time per env
        # step (hand-written over jaxsampler) and the agent-steps each side gets from them
        # (the reset steps that take no action, in jaxsampler's next-step auto-reset).
        row["env_step_ratio"] = harness.paired_ratio(
            row["handwritten"]["round_median_s"], row["jaxsampler"]["round_median_s"]
        )
        row["floor"] = (
            row["jaxsampler"]["agent_steps_per_call"] / row["handwritten"]["agent_steps_per_call"]
        )
        out["by_width"][str(E)] = row
        js_rate, hand_rate = (row[k]["agent_steps_per_s"] for k in ("jaxsampler", "handwritten"))
        harness.log(
            f"  {suite.name} E={E}: jaxsampler {harness.si(js_rate)}, "
            f"hand-written {harness.si(hand_rate)} agent-steps/s, ratio {row['ratio']:.2f}"
        )
    return out


def _probe(side: Timed) -> list[float]:
    """Two untimed-for-the-record warm-up calls: their durations size the rounds."""
    return [harness.timed(side.call) for _ in range(2)]


def skip_reason(suite: Suite) -> str | None:
    """Why ``suite`` cannot run here (its package missing), else ``None``."""
    if importlib.util.find_spec(suite.module) is None:
        return f"package {suite.module!r} is not installed (pip install -e '.[{suite.name}]')"
    return None


def run_benchmark(
    suites: Sequence[str],
    widths: Sequence[int] = DEFAULT_WIDTHS,
    rollout_length: int = 128,
    repeats: int = 5,
    target_s: float = 0.2,
    seed: int = 0,
    min_calls: int = 3,
) -> dict[str, Any]:
    """Every requested suite at every width; a suite that cannot run is recorded as
    skipped with its reason (printed too)."""
    started = time.perf_counter()
    results: dict[str, Any] = {}
    for name in suites:
        suite = SUITES[name]
        reason = skip_reason(suite)
        if reason is None:
            harness.log(f"{name}: {suite.env_id}, widths {list(widths)}, T={rollout_length}")
            try:
                results[name] = {
                    "status": "ok",
                    **measure_suite(
                        suite, widths, rollout_length, repeats, target_s, seed, min_calls
                    ),
                }
                continue
            except NotImplementedError:
                reason = "its jaxsampler adapter is not implemented in this checkout"
            except Exception as e:  # recorded, so one broken suite does not lose the rest
                traceback.print_exc()
                reason = f"failed: {type(e).__name__}: {e}"
        print(f"skipping {name}: {reason}", file=sys.stderr, flush=True)
        results[name] = {"status": f"skipped: {reason}", "env": suite.env_id}
    return {
        **harness.stamp(
            "Sampling throughput per env suite: jaxsampler vs a hand-written "
            "vmap + lax.scan of the same env, same 64x64 MLP policy",
            "suites",
        ),
        "config": {
            "suites": list(suites),
            "widths": list(widths),
            "rollout_length": rollout_length,
            "repeats": repeats,
            "target_s_per_round": target_s,
            "min_calls_per_round": min_calls,
            "seed": seed,
            "policy": "MLPPolicy (64, 64) tanh actor-critic",
        },
        "environment": {**environment_info(), **harness.versions(VERSIONS)},
        "git": harness.git_state(),
        "suites": results,
        "wall_s": time.perf_counter() - started,
    }


# --------------------------------------------------------------------------- reporting


def markdown_table(results: dict[str, Any]) -> str:
    """One row per (suite, width): agent-steps/s of both sides, the ratio, compile times."""
    cfg, env = results["config"], results["environment"]
    md = f"# {results['benchmark']}\n\n"
    md += (
        f"{results['date']} · `{results['command']}` · T={cfg['rollout_length']} · "
        f"{cfg['repeats']} interleaved rounds · {env['cpu_count']} CPUs, jax {env['jax']} "
        f"({env['backend']}) · total {results['wall_s']:.0f} s\n\n"
    )
    md += (
        "| suite | env | A | E | jaxsampler agent-steps/s | hand-written agent-steps/s "
        "| **ratio** | per env step | floor | acting fraction | compile s (js / hand) |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    notes = []
    for name, rec in results["suites"].items():
        if rec["status"] != "ok":
            md += f"| {name} | `{rec['env']}` | | | {rec['status']} | | | | | | |\n"
            continue
        notes.append(f"- **{name}** (`{rec['env']}`): {rec['agent_steps']}")
        for E, row in rec["by_width"].items():
            j, h = row["jaxsampler"], row["handwritten"]
            md += (
                f"| {name} | `{rec['env']}` | {rec['num_agents']} | {E} "
                f"| {harness.si(j['agent_steps_per_s'])} | {harness.si(h['agent_steps_per_s'])} "
                f"| **{row['ratio']:.2f}** | {_opt(row, 'env_step_ratio')} "
                f"| {_opt(row, 'floor')} | {row['acting_fraction']:.3f} "
                f"| {j['compile_s']:.1f} / {h['compile_s']:.1f} |\n"
            )
    md += (
        "\nAgent-steps: (env, agent) pairs whose action was applied. jaxsampler resets on "
        "the step after an episode ends and that step takes no action (its acting fraction "
        "is below 1 by the share of reset steps, and by the agents not to move in turn-based "
        "games); the hand-written loops reset within the step. Ratio: jaxsampler over "
        "hand-written agent-steps/s, the median over rounds of the within-round ratio. "
        "Per env step: hand-written over jaxsampler seconds per call (both run E x T env "
        "steps), the median over rounds. Floor: jaxsampler's agent-steps per call over "
        "the hand-written loop's, the ratio at equal time per env step (below 1 by "
        "jaxsampler's reset steps, which take no action: RLlib's episode semantics, one "
        "observation track with every final observation kept). Ratio = per env step x "
        "floor, up to the medians.\n\n" + "\n".join(notes) + "\n"
    )
    return md


def _opt(row: dict[str, Any], name: str) -> str:
    """A figure of a row to two decimals, or ``—`` in results recorded before it existed."""
    return f"{row[name]:.2f}" if name in row else "—"


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suites", nargs="+", choices=list(SUITES), help="default: all")
    p.add_argument("--widths", type=int, nargs="+", help="env counts E (default 64 512)")
    p.add_argument("--rollout-length", type=int, help="T, steps per call (default 128)")
    p.add_argument("--repeats", type=int, help="interleaved rounds (default 5)")
    p.add_argument("--target-s", type=float, help="seconds per side per round (default 0.2)")
    p.add_argument("--min-calls", type=int, help="least calls per side per round (default 3)")
    p.add_argument("--seed", type=int, default=0)
    harness.add_quick_out(p, "suites", out="--output-dir", quick="smoke run")
    args = SIZES.apply(p.parse_args(argv))
    results = run_benchmark(
        args.suites or list(SUITES),
        args.widths,
        args.rollout_length,
        args.repeats,
        args.target_s,
        args.seed,
        args.min_calls,
    )
    harness.finish(
        results,
        markdown_table(results),
        "suites",
        harness.results_dir(args.output_dir, args.quick),
    )


if __name__ == "__main__":
    main()
