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

    python -m examples.ppo_multiagent [--total-timesteps 400000] [--seed 0]

The loop is ``ppo_host.py``'s (its sampler, learner and update step), one learner per
policy.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any

import jax
import numpy as np

import jaxsampler as js
from examples import ppo, ppo_host


def policy_of(agent_id: str, episode: Any = None, **kwargs: Any) -> str:
    """RLlib's mapping-function signature; called once per agent (``episode=None``)."""
    return "even" if int(agent_id.rsplit("_", 1)[1]) % 2 == 0 else "odd"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, default=2, help="Spread agents (>= 2)")
    ppo_host.add_arguments(p, total_timesteps=400_000, num_envs=16, total_help="env steps")
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
    sampler = ppo_host.make_sampler(env, policy, cfg, args.seed, logger, bar)
    params = policy.init(jax.random.PRNGKey(args.seed))
    logging = not isinstance(logger, js.integrations.loggers.NullLogger)
    tx, update, batch_loss = ppo_host.make_learner(cfg, mlp, logging)
    opt_states = {pid: tx.init(params[pid]) for pid in policy.policy_ids}

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
                params[pid], opt_states[pid], losses = ppo_host.learn(
                    update, batch_loss, params[pid], opt_states[pid], mab[pid], size, k
                )
                if logging:
                    scalars.update({f"train/{pid}/{name}": v for name, v in losses.items()})
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
        ppo.write_json(
            args.json,
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
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
