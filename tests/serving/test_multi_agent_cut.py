"""A multi-agent episode cut short (abandoned, or ended truncated) while an agent out of
lockstep waits for its next observation: every truncated agent gets a final observation,
as RLlib's ``MultiAgentEpisode`` requires (it raises for an agent that acted and was
truncated without one), and a client's truncated ``end_episode`` that leaves one out is
refused with the agents' names instead of breaking the sampler."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.host_envs.external import (
    EpisodeStateError,
    ExternalMultiAgentEnv,
    InvalidDataError,
)
from jaxsampler.serving import PolicyClient
from tests.serving.test_multi_agent import ACT, AGENTS, OBS, Served, obs_of, stitch


@pytest.fixture
def served():
    """The multi-agent server with a sampler thread (test_multi_agent's)."""
    s = Served()
    yield s
    s.close()


def sample_until_done(env, calls: int = 6) -> list:
    """Chunks of a host sampler over ``env`` until one ends its episode (at most ``calls``)."""
    policy = js.MLPPolicy(OBS, ACT, hidden_sizes=(4,))
    sampler = js.sampling.HostSampler(env, policy, seed=0, timeout_s=0.05)
    params = policy.init(jax.random.PRNGKey(0))
    chunks: list = []
    for _ in range(calls):
        chunks += [c for c in sampler.sample(params, num_timesteps=2) if len(c)]
        if any(c.is_done for c in chunks):
            break
    env.close()
    return chunks


def test_abandoned_episode_gives_the_waiting_agent_its_last_observation(served):
    with PolicyClient(served.server.address) as c:
        eid = c.start_episode(None)
        c.get_action(eid, {a: obs_of(8, 0, 0, a) for a in ("a", "b")})
        c.log_returns(eid, {"a": 1.0, "b": 2.0})
        c.get_action(eid, {"a": obs_of(8, 0, 1, "a")})  # b acted and waits
        c.log_returns(eid, {"a": 3.0})
    assert served.server.env.abandon_episode(eid)
    served.wait_finished([eid])
    served.close()
    assert not served.errors, served.errors
    got = {k[2]: v for k, v in stitch(served.chunks).items() if k[:2] == (8, 0)}
    a, b = got["a"], got["b"]
    np.testing.assert_array_equal(
        np.stack([a["obs"][t] for t in sorted(a["obs"])]),
        [obs_of(8, 0, 0, "a"), obs_of(8, 0, 1, "a"), obs_of(8, 0, 1, "a")],
    )
    assert [a["rew"][t][0] for t in sorted(a["rew"])] == [1.0, 3.0]
    # b's one action is closed by its own last observation, repeated; its reward kept.
    np.testing.assert_array_equal(
        np.stack([b["obs"][t] for t in sorted(b["obs"])]),
        [obs_of(8, 0, 0, "b"), obs_of(8, 0, 0, "b")],
    )
    assert [b["rew"][t][0] for t in sorted(b["rew"])] == [2.0]
    assert a["flags"] == b["flags"] == {"truncated"}


def test_an_unpolled_request_that_becomes_the_final_step_completes_the_waiting_agents():
    env = ExternalMultiAgentEnv(OBS, ACT, agent_ids=AGENTS)
    eid = env.start_episode()
    env.log_action(eid, {a: obs_of(9, 0, 0, a) for a in ("a", "b")}, {"a": 0, "b": 1})
    env.log_returns(eid, {"a": 1.0, "b": 2.0}, {"b": {"k": 7}})  # b's info: for its final step
    waiter = env.submit(eid, {"a": obs_of(9, 0, 1, "a")}, None, None, True)  # a get_action
    assert env.abandon_episode(eid)
    assert waiter is not None and isinstance(waiter.error, EpisodeStateError)
    (ep,) = sample_until_done(env)
    assert ep.is_truncated
    obs = {aid: np.asarray(sa.get_observations()) for aid, sa in ep.agent_episodes.items()}
    # The request's own observation of a is the final one; b gets its last one again.
    np.testing.assert_array_equal(obs["a"], [obs_of(9, 0, 0, "a"), obs_of(9, 0, 1, "a")])
    np.testing.assert_array_equal(obs["b"], [obs_of(9, 0, 0, "b"), obs_of(9, 0, 0, "b")])
    assert ep.agent_episodes["b"].get_infos(-1) == {"k": 7, "abandoned": True}
    assert [float(r) for r in ep.agent_episodes["b"].get_rewards()] == [2.0]


def test_truncated_end_without_a_waiting_agent_is_refused_and_changes_nothing():
    env = ExternalMultiAgentEnv(OBS, ACT, agent_ids=AGENTS)
    eid = env.start_episode()
    env.log_action(eid, {a: obs_of(9, 1, 0, a) for a in ("a", "b")}, {"a": 0, "b": 1})
    env.log_action(eid, {"a": obs_of(9, 1, 1, "a")}, {"a": 2})
    with pytest.raises(InvalidDataError, match=r"\['b'\].*truncated end_episode"):
        env.end_episode(eid, {"a": obs_of(9, 1, 2, "a")}, truncated=True)
    assert env.episode_status(eid) == "running"
    # Terminated without b's observation is RLlib's own case (b keeps its hanging action).
    env.end_episode(eid, {"a": obs_of(9, 1, 2, "a")})
    *_, ep = sample_until_done(env)
    assert ep.is_terminated and not ep.is_truncated
    assert ep.agent_episodes["a"].is_terminated


def test_a_journal_from_before_the_refusal_still_recovers(tmp_path, monkeypatch):
    """A journal written by an env that accepted a truncated end without a waiting agent's
    observation (as before the refusal) replays: recovery gives that agent its latest
    observation again, so its acknowledged step is stored, truncated."""
    from jaxsampler.episodes import MultiAgentEpisode
    from jaxsampler.offline import StepJournal, read_records, recover

    journal, log = tmp_path / "j", tmp_path / "log"
    with monkeypatch.context() as old:  # the env before the refusal: no agent counts as waiting
        old.setattr(ExternalMultiAgentEnv, "_waiting_agents", lambda self, ep, obs: {})
        env = ExternalMultiAgentEnv(OBS, ACT, agent_ids=AGENTS, journal=StepJournal(journal))
        eid = env.start_episode()
        env.log_action(eid, {a: obs_of(9, 2, 0, a) for a in ("a", "b")}, {"a": 0, "b": 1})
        env.log_action(eid, {"a": obs_of(9, 2, 1, "a")}, {"a": 2})
        env.end_episode(eid, {"a": obs_of(9, 2, 2, "a")}, truncated=True)  # accepted then
        env.close()
    report = recover(journal, log, ExternalMultiAgentEnv(OBS, ACT, agent_ids=AGENTS))
    (rec,) = read_records(log)
    assert isinstance(rec, MultiAgentEpisode) and rec.is_truncated
    obs = {a: np.asarray(sa.get_observations()) for a, sa in rec.agent_episodes.items()}
    np.testing.assert_array_equal(obs["b"], [obs_of(9, 2, 0, "b"), obs_of(9, 2, 0, "b")])
    np.testing.assert_array_equal(obs["a"][-1], obs_of(9, 2, 2, "a"))
    assert report.recovered_steps == 3  # a's two steps and b's one
