"""PPO with one policy per agent group on PredatorPrey-v0: predators and prey with their
own observation and action spaces, each group's policy learning from its own batch.

The env declares two agent groups (``js.envs.PredatorPrey``): predators see 4 numbers and
pick one of 5 moves, the faster prey sees ``2 + 2 * n_predators`` numbers and picks one of
9. ``js.policies.MultiAgentPolicy`` maps each group to an MLP built for that group's own
spaces; ``Sampler.sample_batch()`` hands each policy its rows in those spaces. ``--train``
picks who learns: the predators against a uniformly random prey (the default: the capture
rate rises), the prey against random predators (the capture rate falls), or both.

    python -m examples.ppo_groups [--train predator|prey|both] [--total-timesteps 1000000]

The learner is ``ppo_host.py``'s, one per learning group.
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


def group_of(agent_id: str, episode: Any = None, **kwargs: Any) -> str:
    """RLlib's mapping-function signature: ``predator_1 -> "predator"``."""
    return agent_id.rsplit("_", 1)[0]


def capture_stats(prey: Any) -> tuple[int, int, float]:
    """``(episodes ended, captures, prey reward)`` in the prey's batch rows: each episode
    ends on one prey row, terminated on a capture and truncated at the time limit."""
    term = np.asarray(prey["terminateds"], bool)
    ended = term | np.asarray(prey["truncateds"], bool)
    return int(ended.sum()), int(term.sum()), float(np.sum(prey["rewards"]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train", choices=("predator", "prey", "both"), default="predator")
    p.add_argument("--predators", type=int, default=2)
    ppo_host.add_arguments(p, total_timesteps=1_000_000, num_envs=16, total_help="env steps")
    args = p.parse_args(argv)
    env = js.make("PredatorPrey-v0", n_predators=args.predators)
    cfg = dataclasses.replace(
        ppo.DEFAULTS["CartPole-v1"],
        env_id="PredatorPrey-v0",
        num_envs=args.num_envs,
        rollout_length=args.rollout_length,
        total_timesteps=args.total_timesteps,
        lr=1e-3,
        ent_coef=0.01,
        gamma=0.97,
    )
    learning = ("predator", "prey") if args.train == "both" else (args.train,)
    policies: dict[str, Any] = {}
    for g in env.agent_layout.groups:
        if g.name in learning:
            policies[g.name] = js.MLPPolicy(
                g.observation_space, g.action_space, cfg.hidden_sizes, cfg.activation
            )
        else:
            policies[g.name] = js.RandomPolicy(g.observation_space, g.action_space)
    policy = js.policies.MultiAgentPolicy(env, policies, group_of)
    logger = js.integrations.loggers.from_arguments(args)
    bar = js.integrations.progress.Bar(cfg.total_timesteps, desc="ppo_groups", quiet=args.quiet)
    sampler = ppo_host.make_sampler(env, policy, cfg, args.seed, logger, bar)
    params = policy.init(jax.random.PRNGKey(args.seed))
    logging = not isinstance(logger, js.integrations.loggers.NullLogger)
    learners = {pid: ppo_host.make_learner(cfg, policies[pid], logging) for pid in learning}
    opt_states = {pid: learners[pid][0].init(params[pid]) for pid in learning}
    # Rows per policy vary (resets take no step): pad to the most one call can hold.
    sizes = {
        g.name: cfg.num_envs * cfg.rollout_length * len(g.agent_ids)
        for g in env.agent_layout.groups
    }
    key = jax.random.PRNGKey(args.seed + 1)
    curve: list[tuple[int, float, float]] = []  # (env steps, capture rate, prey return)
    steps, t0 = 0, time.perf_counter()
    with logger, bar:
        while steps < cfg.total_timesteps:
            mab = sampler.sample_batch(params)
            scalars: dict[str, Any] = {}
            for pid in learning:
                _, update, batch_loss = learners[pid]
                key, k = jax.random.split(key)
                params[pid], opt_states[pid], losses = ppo_host.learn(
                    update, batch_loss, params[pid], opt_states[pid], mab[pid], sizes[pid], k
                )
                scalars.update({f"train/{pid}/{name}": v for name, v in losses.items()})
            steps += mab.env_steps()
            ended, captured, prey_reward = capture_stats(mab["prey"])
            if ended:
                curve.append((steps, captured / ended, prey_reward / ended))
                scalars["train/capture_rate"] = captured / ended
            if logging:
                logger.log(scalars, step=sampler.totals.env_steps)
    wall = time.perf_counter() - t0
    k = max(1, len(curve) // 10)
    first = float(np.mean([c for _, c, _ in curve[:k]])) if curve else float("nan")
    last = float(np.mean([c for _, c, _ in curve[-k:]])) if curve else float("nan")
    print(
        f"PredatorPrey-v0 ({args.predators} predators, training {args.train}) {steps:,} env "
        f"steps in {wall:.1f} s; capture rate {first:.2f} -> {last:.2f}"
    )
    if args.json:
        ppo.write_json(
            args.json,
            {
                "train": args.train,
                "predators": args.predators,
                "env_steps": steps,
                "wall_s": wall,
                "first_capture_rate": first,
                "final_capture_rate": last,
                "curve": curve,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
