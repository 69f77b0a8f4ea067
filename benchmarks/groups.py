"""What agent groups cost on the host, against padding by hand, side by side.

An env with agent groups (:mod:`jaxsampler.envs.groups`) runs its rollout in carrier
spaces, the same arrays a user who pads every agent to one space by hand gets; the
difference is on the host, where every agent's data is handed out in its own spaces. This
script times, in rotating rounds within one process (medians, paired ratios):

* ``rollout``: the bare jitted rollout plus its host copy (the baseline of every ratio);
* ``batch (groups)`` / ``batch (padded)``: ``sample_batch()`` with each policy's rows
  unpacked to its group's spaces, and the same sampler with the unpacking switched off
  (carrier rows: what padding by hand gives);
* ``sample+read (groups)`` / ``sample+read (padded)``: ``sample()`` and every agent
  episode's observations, actions and rewards read once.

Each policy is a random policy over its group's own spaces (one per group, through
``MultiAgentPolicy``). The table also gives the bytes of one call's observations in
carrier rows and in the agents' own spaces.

Usage::

    python -m benchmarks.groups             # writes results/groups.{json,md}
    python -m benchmarks.groups --quick     # smoke test, prints only
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

import jaxsampler as js
from benchmarks import harness
from benchmarks.host_side import bare_rollout, run_rounds, sample_and_read, summarize
from jaxsampler.sampling.device import grouped as grouped_module

NAME = "groups"
SIZES = harness.Sizes(
    full={"num_envs": 1024, "rollout_length": 128, "rounds": 7},
    quick={"num_envs": 8, "rollout_length": 8, "rounds": 2},
)
#: (env id, make kwargs) measured
ENVS = (("PredatorPrey-v0", {"n_predators": 6}), ("jaxmarl:MPE_simple_tag_v3", {}))


def group_policy(env: Any) -> tuple[Any, Any]:
    """One random policy per agent group, each over its group's own spaces."""
    layout = env.agent_layout
    policies = {g.name: js.RandomPolicy(g.observation_space, g.action_space) for g in layout.groups}
    pol = js.policies.MultiAgentPolicy(
        env, policies, policy_mapping_fn=lambda aid: layout.group_of(aid).name
    )
    return pol, pol.init(jax.random.PRNGKey(0))


@contextlib.contextmanager
def padded() -> Any:
    """Samplers built inside hand out carrier rows (no unpacking), as hand padding does."""
    old = grouped_module.grouped_output
    grouped_module.grouped_output = lambda *args: None
    try:
        yield
    finally:
        grouped_module.grouped_output = old


def short(space: Any) -> str:
    """``Box(4,) float32`` / ``Discrete(5)``: a space without its bounds."""
    if isinstance(space, js.spaces.Box):
        return f"Box{tuple(space.shape)} {space.dtype.name}"
    return repr(space)


def obs_bytes(env: Any, num_envs: int, T: int) -> dict[str, int]:
    """Bytes of one call's observations: carrier rows, and each agent in its own space."""
    layout = env.agent_layout
    carrier = layout.observation_space
    per_step = carrier.dtype.itemsize * int(np.prod(carrier.shape)) * layout.num_agents
    own = sum(s.dtype.itemsize * int(np.prod(s.shape)) for s in layout.observation_spaces.values())
    return {"carrier": per_step * num_envs * T, "own": own * num_envs * T}


def measure(env_id: str, kwargs: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    env = js.make(env_id, **kwargs)
    pol, params = group_policy(env)
    E, T = args.num_envs, args.rollout_length

    def sampler() -> Any:
        return js.Sampler(env, pol, num_envs=E, rollout_length=T, seed=0)

    grouped = sampler()
    with padded():
        hand = sampler()
    sides = {
        "rollout": bare_rollout(env, pol, params, E, T),
        "batch (groups)": lambda: grouped.sample_batch(params),
        "batch (padded)": lambda: hand.sample_batch(params),
        "sample+read (groups)": lambda: sample_and_read(grouped, params),
        "sample+read (padded)": lambda: sample_and_read(hand, params),
    }
    times, split = run_rounds(sides, args.rounds)
    out = summarize(times, split)
    for what in ("batch", "sample+read"):
        out[f"{what}: groups / padded"] = harness.paired_ratio(
            times[f"{what} (groups)"], times[f"{what} (padded)"]
        )
    layout = env.agent_layout
    return {
        "env": env_id,
        "make_kwargs": kwargs,
        "groups": {
            g.name: {
                "agents": len(g.agent_ids),
                "observation_space": short(g.observation_space),
                "action_space": short(g.action_space),
            }
            for g in layout.groups
        },
        "carrier": {
            "observation_space": short(layout.observation_space),
            "action_space": short(layout.action_space),
        },
        "obs_bytes": obs_bytes(env, E, T),
        "sides": out,
    }


def markdown(res: dict[str, Any]) -> str:
    a = res["args"]
    lines = [
        "# Agent groups on the host: each agent's own spaces vs padding by hand",
        "",
        f"{res['stamp']['date']} · `{res['stamp']['command']}` · {a['num_envs']} envs x "
        f"{a['rollout_length']} steps, {a['rounds']} rotating rounds · "
        f"{os.cpu_count()} CPUs, jax {jax.__version__} ({jax.default_backend()})",
        "",
        "Ratios: median over rounds of the side's seconds over the same round's bare rollout "
        "(+ host copy); `groups / padded`: the same for the two samplers, paired by round. "
        "Padded: the same sampler handing out carrier rows (what padding every agent to one "
        "space by hand gives).",
        "",
        "| env | groups (agents: obs, action) | carrier obs | obs MB carrier / own "
        "| batch: groups | padded | groups / padded "
        "| sample+read: groups | padded | groups / padded |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["results"]:
        s = r["sides"]
        groups = "; ".join(
            f"{name} ({g['agents']}: {g['observation_space']}, {g['action_space']})"
            for name, g in r["groups"].items()
        )
        mb = r["obs_bytes"]
        lines.append(
            f"| `{r['env']}` | {groups} | {r['carrier']['observation_space']} "
            f"| {mb['carrier'] / 1e6:.1f} / {mb['own'] / 1e6:.1f} "
            f"| {s['batch (groups)']['ratio']:.2f} | {s['batch (padded)']['ratio']:.2f} "
            f"| **{s['batch: groups / padded']:.2f}** "
            f"| {s['sample+read (groups)']['ratio']:.2f} "
            f"| {s['sample+read (padded)']['ratio']:.2f} "
            f"| **{s['sample+read: groups / padded']:.2f}** |"
        )
    lines += [
        "",
        "The rollout is the same program on both sides (carrier spaces); only the host "
        "output differs. Batches unpack each policy's rows as views (a slice of the "
        "carrier's columns); `sample()` hands out each episode as a copy in its agents' own "
        "spaces, one more object per agent episode (a finished chunk's copy stays lazy: it "
        "unpacks what it builds and reads).",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-envs", type=int)
    p.add_argument("--rollout-length", type=int)
    p.add_argument("--rounds", type=int)
    harness.add_quick_out(p, NAME)
    args = SIZES.apply(p.parse_args(argv))
    results = []
    for env_id, kwargs in ENVS:
        harness.log(f"{env_id} {kwargs}")
        results.append(measure(env_id, kwargs, args))
    res = {
        "stamp": harness.stamp(NAME, "groups", argv),
        "args": {k: getattr(args, k) for k in ("num_envs", "rollout_length", "rounds")},
        "versions": harness.versions(["jax", "numpy", "jaxmarl"]),
        "results": results,
    }
    harness.finish(res, markdown(res), NAME, harness.results_dir(args.out, args.quick))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
