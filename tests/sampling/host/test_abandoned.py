"""Abandoned episodes (an external env's client went away) are visible in the output.

The env ends such an episode truncated, with ``{"abandoned": True}`` in the info of its
final observation. Episode objects keep that info (``get_infos(-1)``); batch rows, which
hold no final observation, get the bool ``abandoned`` column: ``True`` on the last row of
an abandoned episode (of each of its agents), present by default whenever the env can
abandon episodes.
"""

from __future__ import annotations

import threading

import jax
import numpy as np

import jaxsampler as js
from jaxsampler import spaces
from jaxsampler.host_envs.external import ExternalEnv, ExternalMultiAgentEnv
from jaxsampler.sampling import HostSampler
from jaxsampler.sampling.host import abandons_episodes

OBS = spaces.Box(-1.0, 1.0, (2,))
ACT = spaces.Discrete(2)


def _params(policy):
    """Random params of the policy's shapes (its orthogonal initializers are slow)."""
    rng = np.random.default_rng(0)
    shapes = jax.eval_shape(policy.init, jax.random.key(0))
    return jax.tree.map(lambda x: rng.normal(0, 0.5, x.shape).astype(x.dtype), shapes)


def _obs(i: float) -> np.ndarray:
    return np.array([i / 10, 0.0], np.float32)


def _drive(env, sampler, sim, batches: bool):
    """Runs ``sim`` in a thread and samples (one env step per call) until a call after its
    end finds no step; returns every call's output."""
    done = threading.Event()

    def run():
        try:
            sim()
        finally:
            done.set()

    th = threading.Thread(target=run, daemon=True)
    th.start()
    params = _params(sampler.policy)
    out = []
    for _ in range(200):  # a bound, in case a step went missing
        finished = done.is_set()  # then every step is queued: a call without one ends it
        f = sampler.sample_batch if batches else sampler.sample
        out.append(f(params, num_timesteps=1))
        if finished and sampler.metrics.num_env_steps_sampled == 0:
            break
    th.join(5)
    env.close()
    return out


def _sim(env, agents=None):
    """Episode "kept" (2 steps, ended), "gone" (2 steps, abandoned after an answered
    get_action) and "logged" (1 logged step, abandoned before it was polled)."""
    wrap = (lambda x: x) if agents is None else (lambda x: dict.fromkeys(agents, x))

    def sim():
        e = env.start_episode("kept")
        env.get_action(e, wrap(_obs(1)))
        env.get_action(e, wrap(_obs(2)))
        env.end_episode(e, wrap(_obs(3)))
        e = env.start_episode("gone")
        env.get_action(e, wrap(_obs(4)))
        env.get_action(e, wrap(_obs(5)))
        env.abandon_episode(e)
        e = env.start_episode("logged")
        env.log_action(e, wrap(_obs(6)), wrap(1))
        env.abandon_episode(e)

    return sim


def _episode_of(first_obs: np.ndarray) -> str:
    return {0.1: "kept", 0.4: "gone", 0.6: "logged"}[round(float(first_obs[0]), 1)]


def test_batch_rows_mark_the_last_step_of_abandoned_episodes():
    env = ExternalEnv(OBS, ACT, max_wait_s=0.0)
    s = HostSampler(env, js.MLPPolicy(OBS, ACT, hidden_sizes=(4,)), timeout_s=0.5, batch_sizes=(2,))
    assert s.mark_abandoned and abandons_episodes(env)
    parts = [b["default_policy"] for b in _drive(env, s, _sim(env), True) if b.policy_batches]
    batch = js.episodes.concat_samples(parts)
    assert batch["abandoned"].dtype == bool
    rows: dict[str, list] = {}
    first: dict = {}
    for i, eid in enumerate(batch["eps_id"]):
        first.setdefault(eid, batch["obs"][i])
        rows.setdefault(_episode_of(first[eid]), []).append(i)
    marks = {k: batch["abandoned"][v].tolist() for k, v in rows.items()}
    assert marks == {"kept": [False, False], "gone": [False, True], "logged": [True]}
    for k, v in rows.items():
        assert batch["truncateds"][v[-1]] == (k != "kept")
        assert batch["terminateds"][v[-1]] == (k == "kept")


def test_episodes_keep_the_abandoned_info_on_their_final_observation():
    env = ExternalEnv(OBS, ACT, max_wait_s=0.0)
    s = HostSampler(env, js.MLPPolicy(OBS, ACT, hidden_sizes=(4,)), timeout_s=0.5, batch_sizes=(2,))
    chunks = [ep for eps in _drive(env, s, _sim(env), False) for ep in eps]
    first = {ep.id_: ep.get_observations(0) for ep in chunks if ep.t_started == 0}
    final = {_episode_of(first[ep.id_]): ep for ep in chunks if ep.is_done}
    assert set(final) == {"kept", "gone", "logged"}
    for name, ep in final.items():
        abandoned = name != "kept"
        assert ep.is_truncated == abandoned and ep.is_terminated != abandoned
        assert ep.get_infos(-1).get("abandoned", False) is abandoned


def test_multi_agent_rows_and_episodes_are_marked_per_agent():
    agents = ("a", "b")
    env = ExternalMultiAgentEnv(OBS, ACT, agent_ids=agents, max_wait_s=0.0)
    s = HostSampler(env, js.MLPPolicy(OBS, ACT, hidden_sizes=(4,)), timeout_s=0.5, batch_sizes=(2,))
    batch = js.episodes.concat_samples(
        [b["default_policy"] for b in _drive(env, s, _sim(env, agents), True) if b.policy_batches]
    )
    for agent in (0, 1):
        mine = np.flatnonzero(batch["agent_index"] == agent)
        by_ep: dict[str, list] = {}
        first: dict = {}
        for i in mine:
            eid = batch["eps_id"][i]
            first.setdefault(eid, batch["obs"][i])
            by_ep.setdefault(_episode_of(first[eid]), []).append(bool(batch["abandoned"][i]))
        assert by_ep == {"kept": [False, False], "gone": [False, True], "logged": [True]}


def test_the_column_follows_mark_abandoned():
    """Off for envs that cannot abandon episodes (no column); forced on or off by the
    argument."""
    from tests.sampling.host.test_bounded import FreshIds

    env = FreshIds(k=2)
    policy = js.MLPPolicy(OBS, ACT, hidden_sizes=(4,))
    params = _params(policy)
    assert not abandons_episodes(env)
    batch = HostSampler(env, policy, rollout_length=12, batch_sizes=(2,)).sample_batch(params)[
        "default_policy"
    ]
    assert "abandoned" not in batch
    env = FreshIds(k=2)
    batch = HostSampler(
        env, policy, rollout_length=12, batch_sizes=(2,), mark_abandoned=True
    ).sample_batch(params)
    sb = batch["default_policy"]
    # FreshIds marks its truncated endings abandoned: exactly those last rows are True.
    np.testing.assert_array_equal(sb["abandoned"], sb["truncateds"])
    assert sb["abandoned"].any()
    ext = ExternalEnv(OBS, ACT)
    assert not HostSampler(ext, policy, mark_abandoned=False).mark_abandoned
    ext.close()
