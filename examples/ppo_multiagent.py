"""Two PPO policies on the cooperative multi-agent Spread env, each learning from its own
``policy_batches``.

Agents with an even index (``agent_0``, ``agent_2``, ...) are controlled by policy
``"even"``, the others by ``"odd"`` (``js.policies.MultiAgentPolicy`` evaluates both inside
the one jitted
rollout step, each on its own agents). Every iteration ``Sampler.sample_batch()``
returns a ``MultiAgentBatch``; each policy computes GAE over its own ``SampleBatch``
(rows run agent-episode by agent-episode, ``eps_id`` is per agent) and takes PPO steps
with its own optimizer. Learning shows as the mean per-agent episode return rising from
the random policies' level.

    python examples/ppo_multiagent.py [--total-timesteps 400000] [--seed 0]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

import jaxsampler as js


def _load(name: str):
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"jaxsampler_example_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


ppo = _load("ppo")
ppo_host = _load("ppo_host")


def policy_of(agent_id: str, episode: Any = None, **kwargs: Any) -> str:
    """RLlib's mapping-function signature; called once per agent (``episode=None``)."""
    return "even" if int(agent_id.rsplit("_", 1)[1]) % 2 == 0 else "odd"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--total-timesteps", type=int, default=400_000, help="env steps")
    p.add_argument("--agents", type=int, default=2, help="Spread agents (>= 2)")
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--rollout-length", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    js.integrations.loggers.add_arguments(p)  # --log-dir, --logger, --quiet
    args = p.parse_args(argv)
    env = js.make("Spread-v0", n=args.agents)
    cfg = dataclasses.replace(
        ppo.DEFAULTS["CartPole-v1"],
        env_id="Spread-v0",
        num_envs=args.num_envs,
        rollout_length=args.rollout_length,
        total_timesteps=args.total_timesteps,
        lr=1e-3,
        ent_coef=0.01,
        gamma=0.95,
    )
    mlp = js.MLPPolicy(env.observation_space, env.action_space, cfg.hidden_sizes, cfg.activation)
    policy = js.policies.MultiAgentPolicy(env, {"even": mlp, "odd": mlp}, policy_of)
    logger = js.integrations.loggers.from_arguments(args)
    bar = js.integrations.progress.Bar(cfg.total_timesteps, desc="ppo_multiagent", quiet=args.quiet)
    # the sampler logs each call's report (returns, env steps/s, compile events) and
    # advances the bar by its env steps
    sampler = js.Sampler(
        env,
        policy,
        num_envs=cfg.num_envs,
        rollout_length=cfg.rollout_length,
        seed=args.seed,
        callbacks=[logger, js.integrations.progress.ProgressCallback(bar)],
    )
    params = policy.init(jax.random.PRNGKey(args.seed))
    tx = ppo.make_optimizer(cfg)
    opt_states = {pid: tx.init(params[pid]) for pid in policy.policy_ids}
    epochs = ppo.make_epochs(cfg, ppo.make_loss(cfg, mlp), tx)

    update = ppo_host.make_update(cfg, mlp, epochs)
    logging = not isinstance(logger, js.integrations.loggers.NullLogger)
    batch_loss = ppo_host.make_batch_loss(cfg, mlp) if logging else None

    # Rows per policy vary (agent steps complete across calls): pad to the most one call
    # can hold, so `update` compiles once; padded rows are masked out.
    size = cfg.num_envs * cfg.rollout_length * ((args.agents + 1) // 2)
    key = jax.random.PRNGKey(args.seed + 1)
    curve, steps, agent_steps, t0 = [], 0, 0, time.perf_counter()
    with logger, bar:
        while steps < cfg.total_timesteps:
            mab = sampler.sample_batch(params)
            scalars = {}
            for pid in policy.policy_ids:
                key, k = jax.random.split(key)
                batch = ppo_host.padded_batch(mab[pid], size)
                if batch_loss is not None:
                    scalars[f"train/{pid}/loss_before"] = batch_loss(params[pid], batch)
                params[pid], opt_states[pid] = update(params[pid], opt_states[pid], batch, k)
                if batch_loss is not None:
                    scalars[f"train/{pid}/loss_after"] = batch_loss(params[pid], batch)
                    scalars[f"train/{pid}/agent_steps"] = mab[pid].count
            steps += mab.env_steps()
            agent_steps += mab.agent_steps()
            m = sampler.metrics
            if m.num_episodes_completed:
                curve.append((steps, m.episode_return_mean / env.num_agents))
                scalars["train/return_per_agent"] = m.episode_return_mean / env.num_agents
            if logging:
                logger.log(scalars, step=sampler.totals.env_steps)
    wall = time.perf_counter() - t0
    k = max(1, len(curve) // 10)
    first, last = (
        float(np.mean([r for _, r in curve[:k]])),
        float(np.mean([r for _, r in curve[-k:]])),
    )
    print(
        f"Spread-v0 ({args.agents} agents, 2 policies) {steps:,} env steps / "
        f"{agent_steps:,} agent steps in {wall:.1f} s ({agent_steps / wall:,.0f} agent steps/s); "
        f"mean per-agent return {first:.1f} -> {last:.1f}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "agents": args.agents,
                    "env_steps": steps,
                    "agent_steps": agent_steps,
                    "wall_s": wall,
                    "agent_steps_per_s": agent_steps / wall,
                    "first_return_per_agent": first,
                    "final_return_per_agent": last,
                    "curve": curve,
                },
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
