"""Served multi-agent envs whose agents have their own spaces.

An ``ExternalMultiAgentEnv`` built with dicts ``agent id -> space``: two hunters observe
``float32[4]`` and pick one of 5 moves, a runner observes ``float32[6]`` and moves by
``float32[2]``. Remote ``PolicyClient``\\ s play episodes over HTTP and record what they
sent and received; the ``HostSampler`` behind the ``PolicyServer`` runs one policy per set
of agents that share spaces, and its episodes must hold, per agent and in its own space,
exactly the clients' record. Each agent's data is checked against its own space (a
runner's observation in a hunter's shape is refused), the server's ``/info`` names the
spaces, local inference is refused with the reason, and a journaled env's crash
recovery gives every recovered agent its own space.
"""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.episodes import MultiAgentEpisode
from jaxsampler.host_envs.external import ExternalMultiAgentEnv, InvalidDataError
from jaxsampler.offline import StepJournal, read_records, recover
from jaxsampler.policies import MLPPolicy, MultiAgentPolicy
from jaxsampler.serving.client import PolicyClient
from jaxsampler.serving.server import PolicyServer
from jaxsampler.spaces import Box, Discrete

HUNTERS = ("hunter_0", "hunter_1")
AGENTS = (*HUNTERS, "runner")
H_OBS, H_ACT = Box(-1e4, 1e4, (4,), np.float32), Discrete(5)
R_OBS, R_ACT = Box(-1e4, 1e4, (6,), np.float32), Box(-1, 1, (2,), np.float32)
OBS = {"hunter_0": H_OBS, "hunter_1": H_OBS, "runner": R_OBS}
ACT = {"hunter_0": H_ACT, "hunter_1": H_ACT, "runner": R_ACT}
STEPS = 4


def env_of(journal=None) -> ExternalMultiAgentEnv:
    return ExternalMultiAgentEnv(
        OBS, ACT, agent_ids=AGENTS, max_wait_s=0.002, episode_timeout_s=60.0, journal=journal
    )


def obs_of(cid: int, k: int, agent: str) -> np.ndarray:
    """Agent ``agent``'s observation at step ``k`` of client ``cid``, in its own shape."""
    n = 6 if agent == "runner" else 4
    return np.array([cid, k, AGENTS.index(agent)] + [0.5] * (n - 3), np.float32)


def policy_of(env) -> MultiAgentPolicy:
    return MultiAgentPolicy(
        env,
        {"hunter": MLPPolicy(H_OBS, H_ACT, (4,)), "runner": MLPPolicy(R_OBS, R_ACT, (4,))},
        lambda a: "runner" if a == "runner" else "hunter",
    )


def play(client, cid: int, record: dict) -> None:
    """One episode of ``STEPS`` steps, every agent observing and acting at each."""
    eid = client.start_episode()
    for k in range(STEPS):
        obs = {a: obs_of(cid, k, a) for a in AGENTS}
        actions = client.get_action(eid, obs)
        record[cid].append((obs, actions))
        client.log_returns(eid, {a: float(k) for a in AGENTS})
    client.end_episode(eid, {a: obs_of(cid, STEPS, a) for a in AGENTS})


def test_served_agents_act_and_are_recorded_in_their_own_spaces():
    env = env_of()
    server = PolicyServer(env, port=0)
    policy = policy_of(server)
    params = policy.init(jax.random.PRNGKey(0))
    sampler = js.sampling.HostSampler(server, policy, seed=0, timeout_s=0.05)
    chunks: list = []
    stop = threading.Event()

    def sample_loop():
        while not stop.is_set():
            chunks.extend(sampler.sample(params, num_timesteps=4))

    thread = threading.Thread(target=sample_loop, daemon=True)
    thread.start()
    try:
        record: dict = {0: [], 1: []}
        clients = [PolicyClient(server.address) for _ in record]
        info = clients[0].server_info()
        assert info["observation_space"] is None and info["observation_spaces"]["runner"] == R_OBS
        assert info["action_spaces"]["hunter_1"] == H_ACT
        players = [
            threading.Thread(target=play, args=(c, cid, record)) for cid, c in enumerate(clients)
        ]
        for t in players:
            t.start()
        for t in players:
            t.join(30)
        # each agent's data is checked against its own space
        eid = clients[0].start_episode()
        bad = {**{h: obs_of(0, 0, h) for h in HUNTERS}, "runner": obs_of(0, 0, "hunter_0")}
        with pytest.raises(InvalidDataError, match="runner"):
            clients[0].get_action(eid, bad)
        with pytest.raises(ValueError, match="own spaces.*inference_mode='remote'"):
            PolicyClient(server.address, inference_mode="local", policy=policy.policies[0])
        for _ in range(300):  # until the sampler emitted both episodes' ends
            if sum(c.is_done for c in chunks) >= 2:
                break
            threading.Event().wait(0.02)
    finally:
        stop.set()
        thread.join(10)
        server.close()
    for steps in record.values():
        assert len(steps) == STEPS
        for _obs, actions in steps:  # every action arrived in its agent's own space
            for h in HUNTERS:
                assert isinstance(actions[h], (int, np.integer)) and 0 <= actions[h] < 5
            assert np.asarray(actions["runner"]).shape == (2,)
    done = {c.id_ for c in chunks if c.is_done}
    assert len(done) == 2
    for eid in done:  # the episode's chunks (cut at sample() calls), joined per agent
        parts = [c for c in chunks if c.id_ == eid]
        cid = int(parts[0].agent_episodes["runner"].get_observations(0)[0])
        for a in AGENTS:
            sas = [p.agent_episodes[a] for p in parts if a in p.agent_episodes]
            assert all(sa.observation_space == OBS[a] for sa in sas)
            assert all(sa.action_space == ACT[a] for sa in sas)
            obs = np.concatenate(
                [sas[0].get_observations()] + [sa.get_observations()[1:] for sa in sas[1:]]
            )
            want_obs = [o[a] for o, _ in record[cid]] + [obs_of(cid, STEPS, a)]
            np.testing.assert_array_equal(obs, np.stack(want_obs))
            got = np.concatenate([np.asarray(sa.get_actions()) for sa in sas])
            want = np.stack([np.asarray(act[a]) for _, act in record[cid]])
            np.testing.assert_array_equal(got, want)
            if a == "runner":
                assert got.dtype == np.float32
            else:
                assert np.issubdtype(got.dtype, np.integer)
            rewards = np.concatenate([sa.get_rewards() for sa in sas])
            np.testing.assert_array_equal(rewards, np.arange(STEPS, dtype=np.float32))


def test_spaces_given_per_agent_are_checked():
    env = env_of()
    assert env.observation_space is None and env.observation_spaces == OBS
    assert js.host_envs.agent_spaces(env) == (OBS, ACT)
    shared = ExternalMultiAgentEnv(
        dict.fromkeys(AGENTS, H_OBS), dict.fromkeys(AGENTS, H_ACT), agent_ids=AGENTS
    )
    assert shared.observation_space == H_OBS and shared.observation_spaces is None
    with pytest.raises(ValueError, match="every agent of agent_ids"):
        ExternalMultiAgentEnv({"hunter_0": H_OBS}, H_ACT, agent_ids=AGENTS)
    with pytest.raises(TypeError, match="single-agent external env takes one"):
        js.host_envs.ExternalEnv(OBS, H_ACT)
    eid = env.start_episode()
    with pytest.raises(InvalidDataError, match="hunter_0"):  # a runner's shape for a hunter
        env.submit(eid, {"hunter_0": obs_of(0, 0, "runner")}, None, None, True)


def test_recovered_agents_keep_their_own_spaces(tmp_path):
    journal, log = tmp_path / "j", tmp_path / "log"
    env = env_of(StepJournal(journal))
    eid = env.start_episode("e0")
    for k in range(2):  # two steps the client logged itself, then the crash
        obs = {a: obs_of(0, k, a) for a in AGENTS}
        acts = {h: k % 5 for h in HUNTERS} | {"runner": np.full(2, 0.25 * k, np.float32)}
        env.log_action(eid, obs, acts)
        env.log_returns(eid, {a: 1.0 for a in AGENTS})
    env.journal.commit()
    report = recover(journal, log, env_of())
    assert report.recovered_steps == 2 * len(AGENTS)
    (rec,) = list(read_records(log))
    assert isinstance(rec, MultiAgentEpisode)
    for a in AGENTS:
        sa = rec.agent_episodes[a]
        assert sa.observation_space == OBS[a] and sa.action_space == ACT[a]
        assert sa.get_observations().shape[1:] == OBS[a].shape
    np.testing.assert_array_equal(
        rec.agent_episodes["runner"].get_actions(), [[0.0, 0.0], [0.25, 0.25]]
    )
