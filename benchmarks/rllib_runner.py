"""JaxMultiAgentEnvRunner vs RLlib's MultiAgentEnvRunner: env steps/s on Spread(8), side by side.

Same process, same ``PPOConfig`` (RLlib's default PPO module, 256x256, one module ``p0``
shared by all 8 agents), ``num_envs_per_env_runner`` envs per runner (default 1024):

* **jax**: ``JaxMultiAgentEnvRunner.sample(num_timesteps=E * T)`` on the pure-JAX
  ``Spread-v0`` (n=8), time split into rollout (device scan + host copy), jaxsampler
  episodes, RLlib episodes (built from the chunks' columns) and bookkeeping;
* **jax, before**: the same runner with the conversion and bookkeeping it had before
  (``to_rllib`` of the chunks, RLlib's ``get_return()`` per agent) - the change measured;
* **rllib**: RLlib 2.60's own ``MultiAgentEnvRunner`` with a gymnasium-vectorized
  :class:`NumpySpread` (a NumPy re-implementation of ``Spread-v0``: same dynamics, reward,
  observation layout and 25-step truncation; ``tests/envs/test_spread.py`` holds the same
  NumPy reference). RLlib steps every env and agent in Python, so it samples fewer steps
  per call (``--rllib-steps`` vector steps); throughput is env steps per second of
  ``sample()`` either way.

The runners are called in alternating order, round after round, after untimed warm-up
calls (compilation, torch's first calls); reported: medians over rounds and the paired
ratio. torch runs with one intra-op thread. The floor of the RLlib-object conversion is
measured too: per multi-agent chunk, bare creation of the same RLlib objects
(``__new__`` and attribute stores only) and RLlib's own ``MultiAgentEpisode.from_state``.

Usage::

    python -m benchmarks.rllib_runner                    # 1024 envs, writes results
    python -m benchmarks.rllib_runner --quick            # tiny smoke run, prints
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import time
import warnings
from collections import defaultdict
from typing import Any

import numpy as np

from benchmarks import harness

NAME = "rllib_runner"
SIZES = harness.Sizes(
    full={"envs": 1024, "fragment": 128, "rllib_steps": 4, "rounds": 3, "agents": 8},
    quick={"envs": 8, "fragment": 8, "rllib_steps": 2, "rounds": 1, "agents": 3},
)


def _quiet() -> None:
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def numpy_spread_cls() -> type:
    """:class:`NumpySpread`, an RLlib ``MultiAgentEnv`` (defined lazily: RLlib imports)."""
    import gymnasium as gym
    from ray.rllib.env.multi_agent_env import MultiAgentEnv

    push = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]], np.float32)

    class NumpySpread(MultiAgentEnv):
        """``Spread-v0`` in NumPy for RLlib's runner: ``n`` agents push (5 discrete
        actions) damped particles; shared reward minus the sum over landmarks of the
        closest agent's distance, minus 1 per overlapping pair; truncated at 25 steps.
        Agent ``i`` observes its velocity, its position, the landmarks and the other
        agents relative to it (float32)."""

        def __init__(self, config: dict | None = None):
            super().__init__()
            self.n = int((config or {}).get("n", 3))
            self.agents = self.possible_agents = [f"agent_{i}" for i in range(self.n)]
            dim = 4 + 2 * self.n + 2 * (self.n - 1)
            obs = gym.spaces.Box(-np.inf, np.inf, (dim,), np.float32)
            self.observation_spaces = {a: obs for a in self.agents}
            self.action_spaces = {a: gym.spaces.Discrete(5) for a in self.agents}
            self._rng = np.random.default_rng()
            self._other = np.array(
                [[j for j in range(self.n) if j != i] for i in range(self.n)], np.intp
            ).reshape(self.n, self.n - 1)

        def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
            if seed is not None:
                self._rng = np.random.default_rng(seed)
            self.pos = self._rng.uniform(-1, 1, (self.n, 2)).astype(np.float32)
            self.land = self._rng.uniform(-1, 1, (self.n, 2)).astype(np.float32)
            self.vel = np.zeros((self.n, 2), np.float32)
            self.time = 0
            return self._obs(), {a: {} for a in self.agents}

        def _obs(self) -> dict[str, np.ndarray]:
            pos, n = self.pos, self.n
            rel_land = (self.land[None] - pos[:, None]).reshape(n, -1)
            rel_other = (pos[self._other] - pos[:, None]).reshape(n, -1)
            rows = np.concatenate([self.vel, pos, rel_land, rel_other], axis=1)
            return {a: rows[i] for i, a in enumerate(self.agents)}

        def step(self, action_dict: dict[str, Any]) -> Any:
            act = np.array([action_dict[a] for a in self.agents])
            self.vel = (self.vel * 0.75 + push[act] * 0.5).astype(np.float32)
            self.pos = (self.pos + self.vel * 0.1).astype(np.float32)
            self.time += 1
            d = np.linalg.norm(self.land[:, None] - self.pos[None], axis=-1)
            gap = np.linalg.norm(self.pos[:, None] - self.pos[None], axis=-1)
            pairs = np.triu(gap < 0.3, k=1).sum()
            r = float(-d.min(axis=1).sum() - pairs)
            trunc = self.time >= 25
            obs = self._obs()
            rewards = {a: r for a in self.agents}
            terms = {a: False for a in self.agents}
            terms["__all__"] = False
            truncs = {a: trunc for a in self.agents}
            truncs["__all__"] = trunc
            return obs, rewards, terms, truncs, {a: {} for a in self.agents}

    return NumpySpread


def make_config(runner: str, num_envs: int, fragment: int, agents: int) -> Any:
    """The shared PPOConfig; the env and ``env_runner_cls`` differ between the runners."""
    from ray.rllib.algorithms.ppo import PPOConfig

    cfg = (
        PPOConfig()
        .multi_agent(policies={"p0"}, policy_mapping_fn=lambda aid, episode, **kw: "p0")
        .env_runners(
            num_env_runners=0, num_envs_per_env_runner=num_envs, rollout_fragment_length=fragment
        )
        .debugging(seed=0)
    )
    if runner == "rllib":
        from ray.tune.registry import register_env

        cls = numpy_spread_cls()
        register_env("NumpySpread", lambda c: cls(c))
        return cfg.environment("NumpySpread", env_config={"n": agents})
    from jaxsampler.integrations.rllib import JaxMultiAgentEnvRunner

    return cfg.environment("Spread-v0", env_config={"n": agents}).env_runners(
        env_runner_cls=JaxMultiAgentEnvRunner
    )


def before_runner(config: Any) -> Any:
    """The multi-agent runner with its pre-change host side: ``to_rllib`` of the chunks and
    per-agent ``get_return()`` bookkeeping (kept here as the measured baseline)."""
    from jaxsampler.integrations.rllib import JaxMultiAgentEnvRunner, to_rllib

    class Before(JaxMultiAgentEnvRunner):
        def _to_rllib(self, episodes: list[Any]) -> list[Any]:
            return list(to_rllib(episodes))

        def _bookkeep(self, episodes: list[Any], steps: int, wall_s: float) -> None:
            agent_steps: dict[str, int] = defaultdict(int)
            for ep in episodes:  # the old per-chunk, per-agent getter pass
                for aid, sa in ep.agent_episodes.items():
                    float(sa.get_return())
                    agent_steps[aid] += len(sa)
            self.metrics.log_value("num_env_steps_sampled", steps, reduce="sum")

    return Before(config=config)


def floor_per_chunk(episodes: list[Any], limit: int = 300) -> dict[str, float]:
    """Seconds per multi-agent chunk: RLlib's ``from_state`` and bare object creation."""
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode
    from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer

    eps = episodes[:limit]
    states = [e.get_state() for e in eps]
    t0 = time.perf_counter()
    for s in states:
        MultiAgentEpisode.from_state(s)
    from_state = (time.perf_counter() - t0) / len(eps)

    def bare() -> None:
        new_ma, new_sa, new_b = (
            MultiAgentEpisode.__new__,
            SingleAgentEpisode.__new__,
            InfiniteLookbackBuffer.__new__,
        )
        for e in eps:
            m: Any = new_ma(MultiAgentEpisode)
            m.id_ = m.env_t = m.env_t_started = m.is_terminated = m.is_truncated = 0
            m.agent_episodes = {}
            for aid, sa in e.agent_episodes.items():
                x: Any = new_sa(SingleAgentEpisode)
                for name in ("observations", "infos", "actions", "rewards"):
                    b: Any = new_b(InfiniteLookbackBuffer)
                    b.data = b.finalized = b.lookback = b._space = b._space_struct = 0
                    setattr(x, name, b)
                x.extra_model_outputs = {}
                for k in sa.extra_model_outputs:
                    b = new_b(InfiniteLookbackBuffer)
                    b.data = b.finalized = b.lookback = b._space = b._space_struct = 0
                    x.extra_model_outputs[k] = b
                x.id_ = x.agent_id = x.module_id = x.t = x.t_started = 0
                m.agent_episodes[aid] = x

    t0 = time.perf_counter()
    bare()
    return {"from_state_s": from_state, "bare_objects_s": (time.perf_counter() - t0) / len(eps)}


def bench_handoff(envs: int, fragment: int, agents: int, repeats: int = 5) -> dict[str, Any]:
    """Seconds to hand a Spread ``envs x fragment`` batch to a torch learner on CPU:
    RLlib's TorchLearner conversion of our batch as sampled (zero copy) vs with one copy
    of every numeric column first (a layout RLlib must copy, or a host round trip); and a
    JAX array of the observations' size to torch by DLPack vs ``np.array`` + from_numpy."""
    import types

    import jax
    import jax.numpy as jnp
    import torch
    from ray.rllib.core.learner.torch.torch_learner import TorchLearner
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    import jaxsampler as js
    from jaxsampler.integrations.rllib import to_rllib
    from jaxsampler.integrations.rllib.torch_handoff import learner_copies

    env = js.make("Spread-v0", n=agents)
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    s = js.Sampler(env, pol, num_envs=envs, rollout_length=fragment, seed=0)
    full = to_rllib(s.sample_batch(()))
    # The array columns alone: RLlib's conversion also walks every item of the infos list
    # (one dict per row) and leaves it as is; that walk is timed separately.
    batch = MultiAgentBatch(
        {
            pid: SampleBatch(
                {k: v for k, v in cols.items() if isinstance(v, np.ndarray) and v.dtype != object}
            )
            for pid, cols in full.policy_batches.items()
        },
        full.count,
    )
    me = types.SimpleNamespace(_device=torch.device("cpu"))
    convert = lambda b: TorchLearner._convert_batch_type(me, b)

    def copied() -> Any:
        return MultiAgentBatch(
            {
                pid: SampleBatch({k: v.copy() for k, v in cols.items()})
                for pid, cols in batch.policy_batches.items()
            },
            batch.count,
        )

    nbytes = sum(v.nbytes for cols in batch.policy_batches.values() for v in cols.values())
    obs = batch.policy_batches[next(iter(batch.policy_batches))]["obs"]
    x = jax.block_until_ready(jnp.ones(obs.shape, obs.dtype))
    return {
        "batch_mib": nbytes / 2**20,
        "learner_copies": learner_copies(full),
        "zero_copy_s": harness.median_time(lambda: convert(batch), repeats),
        "one_copy_s": harness.median_time(lambda: convert(copied()), repeats),
        "full_batch_with_infos_s": harness.median_time(lambda: convert(full), 1),
        "rows": int(sum(len(c) for c in full.policy_batches.values())),
        "jax_obs_mib": x.nbytes / 2**20,
        "jax_dlpack_s": harness.median_time(lambda: torch.from_dlpack(x), repeats),
        "jax_host_round_trip_s": harness.median_time(
            lambda: torch.from_numpy(np.array(x)), repeats
        ),
    }


def env_steps(episodes: list[Any]) -> int:
    return sum(len(e) for e in episodes)


def run(args: argparse.Namespace) -> dict[str, Any]:
    _quiet()
    import torch
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner

    from jaxsampler.integrations.rllib import JaxMultiAgentEnvRunner

    torch.set_num_threads(1)
    E, T = args.envs, args.fragment
    jax_cfg = make_config("jax", E, T, args.agents)
    runners = {
        "jax": JaxMultiAgentEnvRunner(config=jax_cfg),
        "jax_before": before_runner(jax_cfg),
        "rllib": MultiAgentEnvRunner(config=make_config("rllib", E, T, args.agents)),
    }
    steps = {"jax": E * T, "jax_before": E * T, "rllib": E * args.rllib_steps}
    for name, r in runners.items():  # warm-up: compile, first torch calls
        harness.log(f"warm-up {name}")
        r.sample(num_timesteps=steps[name])
        r.sample(num_timesteps=steps[name])
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in runners}
    last: list[Any] = []
    for rnd in range(args.rounds):
        for name in harness.alternated(list(runners), rnd):
            r = runners[name]
            t0 = time.perf_counter()
            eps = r.sample(num_timesteps=steps[name])
            wall = time.perf_counter() - t0
            row = {"wall_s": wall, "env_steps": env_steps(eps), "episodes": len(eps)}
            row["env_steps_per_s"] = row["env_steps"] / wall
            if name.startswith("jax"):
                row.update(r.last_sample_timing)
            if name == "jax":
                last = eps
            rows[name].append(row)
            harness.log(f"round {rnd} {name}: {wall:.3f}s {row['env_steps_per_s']:.0f} steps/s")
    med = {
        name: {k: statistics.median(row[k] for row in rs) for k in rs[0]}
        for name, rs in rows.items()
    }
    floor = floor_per_chunk(last)
    handoff = bench_handoff(E, T, args.agents)
    chunks = med["jax"]["episodes"]
    return {
        **harness.stamp(NAME, NAME),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "versions": harness.versions(["jax", "ray", "torch", "numpy"]),
        "git": harness.git_state(),
        "config": vars(args) | {"out": str(args.out) if args.out else None},
        "rounds": rows,
        "median": med,
        "speedup_vs_rllib": harness.paired_ratio(
            [r["env_steps_per_s"] for r in rows["jax"]],
            [r["env_steps_per_s"] for r in rows["rllib"]],
        ),
        "speedup_vs_before": harness.paired_ratio(
            [r["wall_s"] for r in rows["jax_before"]], [r["wall_s"] for r in rows["jax"]]
        ),
        "handoff": handoff,
        "floor_per_chunk": floor
        | {
            "ours_to_rllib_s": med["jax"]["to_rllib_s"] / chunks,
            "agents_per_chunk": args.agents,
        },
    }


def markdown(res: dict[str, Any]) -> str:
    med, c = res["median"], res["config"]
    ms = lambda x: f"{x * 1e3:.0f}"
    us = lambda x: f"{x * 1e6:.1f}"
    ms2 = lambda x: f"{x * 1e3:.2f}"
    out = [
        f"# JaxMultiAgentEnvRunner vs RLlib's MultiAgentEnvRunner: Spread({c['agents']}), "
        f"{c['envs']} envs\n",
        f"{res['date']}, `{res['command']}`; medians of {c['rounds']} alternating rounds, one "
        "process, torch 1 thread, RLlib's default PPO module (one module for all agents).\n",
        "| runner | env steps / call | wall ms | env steps/s | rollout ms | jaxsampler "
        "episodes ms | RLlib episodes ms | bookkeeping ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in ("rllib", "jax_before", "jax"):
        m = med[name]
        split = (
            [
                ms(m["rollout_s"]),
                ms(m["to_episodes_s"]),
                ms(m["to_rllib_s"]),
                ms(m["bookkeeping_s"]),
            ]
            if name != "rllib"
            else ["—"] * 4
        )
        out.append(
            f"| {name} | {m['env_steps']:.0f} | {ms(m['wall_s'])} | {m['env_steps_per_s']:.0f} | "
            + " | ".join(split)
            + " |"
        )
    f, h = res["floor_per_chunk"], res["handoff"]
    out += [
        "",
        f"**Speed-up vs RLlib's runner** (env steps/s, paired median): "
        f"**{res['speedup_vs_rllib']:.1f}x** (target >= 15x). Against the pre-change host "
        f"side of the same runner: {res['speedup_vs_before']:.2f}x per call.",
        "",
        f"RLlib's runner samples `{c['rllib_steps']}` vector steps per call (it steps "
        "every env and agent in Python); per-env-step throughput is compared.",
        "",
        f"Floor of the RLlib-object conversion, per multi-agent chunk ({f['agents_per_chunk']} "
        f"agents): ours {us(f['ours_to_rllib_s'])} us; bare creation of the same RLlib objects "
        f"(`__new__` + attribute stores) {us(f['bare_objects_s'])} us; RLlib's own "
        f"`MultiAgentEpisode.from_state` {us(f['from_state_s'])} us.",
        "",
        "## Hand-off to a torch learner on CPU (item 7)",
        "",
        "| path | ms |",
        "|---|---:|",
        f"| RLlib TorchLearner conversion of our Spread batch's {h['batch_mib']:.0f} MiB of "
        f"array columns, as sampled (zero copy; columns it would copy: "
        f"{h['learner_copies'] or 'none'}) | {ms2(h['zero_copy_s'])} |",
        f"| the same after one copy of every array column | {ms2(h['one_copy_s'])} |",
        f"| the whole batch, infos list ({h['rows']} dicts) included: RLlib walks every "
        f"item | {ms2(h['full_batch_with_infos_s'])} |",
        f"| {h['jax_obs_mib']:.0f} MiB JAX array to torch by DLPack | {ms2(h['jax_dlpack_s'])} |",
        f"| the same by `np.array` + `torch.from_numpy` (host round trip) | "
        f"{ms2(h['jax_host_round_trip_s'])} |",
        "",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", type=int)
    p.add_argument("--fragment", type=int)
    p.add_argument("--rllib-steps", type=int, dest="rllib_steps")
    p.add_argument("--rounds", type=int)
    p.add_argument("--agents", type=int)
    p.add_argument(
        "--handoff-only",
        action="store_true",
        help="re-measure only the torch hand-off into the existing results JSON",
    )
    harness.add_quick_out(p, NAME)
    args = SIZES.apply(p.parse_args(argv))
    if args.handoff_only:
        _quiet()
        path = (args.out or harness.RESULTS_DIR) / f"{NAME}.json"
        res = json.loads(path.read_text())
        res["handoff"] = bench_handoff(args.envs, args.fragment, args.agents)
        res["handoff_command"] = harness.command(NAME)
    else:
        res = run(args)
    harness.finish(res, markdown(res), NAME, harness.results_dir(args.out, args.quick))


if __name__ == "__main__":
    main()
