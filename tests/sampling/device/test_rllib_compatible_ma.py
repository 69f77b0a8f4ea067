"""``rllib_compatible=True``: the samplers' per-agent done flags equal those of RLlib 2.60's
own ``MultiAgentEpisode``, built by replaying the same device buffers env step by env step
with ``add_env_reset`` / ``add_env_step`` (the env's per-agent flags plus ``"__all__"``),
for ``sample()`` and ``sample_batch()``. The default keeps each agent's own flags.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import jaxsampler as js
from tests.fakes import ChaosEnv, CountingPolicy, TurnEnv
from tests.sampling.device.test_multi_agent import SEED, E, T, device_calls

rllib_episode = pytest.importorskip(
    "ray.rllib.env.multi_agent_episode",
    reason="ray[rllib] is not installed (pip install -e '.[rllib]')",
)


def rllib_finished_episodes(calls, env) -> list[tuple[int, object]]:
    """Finished episodes of RLlib's MultiAgentEpisode replayed over the calls' buffers, in
    the sampler's order (env by env, then in time), as (env, episode)."""
    ids, A = env.agent_ids, env.num_agents
    running: dict = {}
    done: dict[int, set] = {}
    out = []
    for traj, next_acting, next_reset in calls:
        acting = np.concatenate([traj.acting, next_acting[None]], axis=0)
        is_reset = np.concatenate([traj.is_reset, next_reset[None]], axis=0)
        finished = []
        for t in range(T):
            for e in range(E):
                if traj.is_reset[t, e]:
                    continue
                obs = traj.obs[:, e]
                if e not in running:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        ep = rllib_episode.MultiAgentEpisode()
                    ep.add_env_reset(
                        observations={ids[a]: obs[t, a] for a in range(A) if acting[t, e, a]}
                    )
                    running[e], done[e] = ep, set()
                ep = running[e]
                flags = traj.terminated[t, e] | traj.truncated[t, e]
                newly = [a for a in range(A) if flags[a] and ids[a] not in done[e]]
                all_done = bool(flags.all())
                any_trunc = bool(traj.truncated[t, e].any())
                ep.add_env_step(
                    {
                        ids[a]: obs[t + 1, a]
                        for a in range(A)
                        if a in newly
                        or (
                            not is_reset[t + 1, e] and acting[t + 1, e, a] and ids[a] not in done[e]
                        )
                    },
                    {ids[a]: traj.actions[t, e, a] for a in range(A) if acting[t, e, a]},
                    {
                        ids[a]: float(traj.rewards[t, e, a])
                        for a in range(A)
                        if ids[a] not in done[e]
                    },
                    terminateds={
                        **{ids[a]: True for a in newly if traj.terminated[t, e, a]},
                        "__all__": all_done and not any_trunc,
                    },
                    truncateds={
                        **{
                            ids[a]: True
                            for a in newly
                            if traj.truncated[t, e, a] and not traj.terminated[t, e, a]
                        },
                        "__all__": all_done and any_trunc,
                    },
                )
                done[e] |= {ids[a] for a in newly}
                if all_done:
                    assert ep.is_done
                    finished.append((e, t, ep))
                    del running[e]
        finished.sort(key=lambda x: x[:2])
        out += [(e, ep) for e, _, ep in finished]
    return out


def flags(ep) -> dict:
    return {
        a: (bool(sa.is_terminated), bool(sa.is_truncated)) for a, sa in ep.agent_episodes.items()
    }


@pytest.mark.parametrize("env_id", ["turns", "TicTacToe-v0", "chaos"])
def test_rllib_compatible_flags_equal_rllibs_own_episodes(env_id):
    env = {"turns": TurnEnv(length=5), "chaos": ChaosEnv(p_done=0.0)}.get(env_id) or js.make(env_id)
    if env_id == "TicTacToe-v0":
        policy = js.RandomPolicy(env.observation_space, env.action_space)
    else:
        policy = CountingPolicy(env.observation_space, env.action_space)
    n_calls = 6
    want = rllib_finished_episodes(device_calls(env, policy, (), n_calls), env)
    kw = dict(num_envs=E, rollout_length=T, seed=SEED)
    compat = js.Sampler(env, policy, rllib_compatible=True, **kw)
    default = js.Sampler(env, policy, **kw)
    got, own = [], []
    for _ in range(n_calls):
        got += [ep for ep in compat.sample(()) if ep.is_done]
        own += [ep for ep in default.sample(()) if ep.is_done]
    assert len(got) == len(want) >= 3
    differs = 0
    for g, o, (_, w) in zip(got, own, want, strict=True):
        # (a finished chunk holds the agents that stepped in it; RLlib's whole episode may
        # hold more, done in earlier chunks)
        wf = {a: f for a, f in flags(w).items() if a in g.agent_episodes}
        assert flags(g) == wf
        assert (g.is_terminated, g.is_truncated) == (w.is_terminated, w.is_truncated)
        differs += flags(o) != flags(g)
    if env_id == "chaos":  # (episodes truncated at the time limit: RLlib marks every
        assert differs > 0  # agent of the last step terminated too)


@pytest.mark.parametrize("env_id", ["turns", "chaos"])
def test_rllib_compatible_sample_batch_rows_equal_the_episodes(env_id):
    env = TurnEnv(length=5) if env_id == "turns" else ChaosEnv(p_done=0.0)
    policy = CountingPolicy(env.observation_space, env.action_space)
    kw = dict(num_envs=E, rollout_length=T, seed=SEED, rllib_compatible=True)
    s_eps, s_bat = js.Sampler(env, policy, **kw), js.Sampler(env, policy, **kw)
    for _ in range(4):
        episodes = s_eps.sample(())
        batch = s_bat.sample_batch(())["default_policy"]
        rows = [
            (sa.get_sample_batch()["terminateds"], sa.get_sample_batch()["truncateds"])
            for ep in episodes
            for _, sa in sorted(ep.agent_episodes.items())
        ]
        term = np.concatenate([r[0] for r in rows]) if rows else np.zeros(0, bool)
        trunc = np.concatenate([r[1] for r in rows]) if rows else np.zeros(0, bool)
        np.testing.assert_array_equal(np.asarray(batch["terminateds"]), term)
        np.testing.assert_array_equal(np.asarray(batch["truncateds"]), trunc)
