"""Multi-agent serving end to end: remote PolicyClients -> PolicyServer over an
ExternalMultiAgentEnv -> HostSampler -> MultiAgentEpisodes.

Each client runs scripted episodes in which agents act out of lockstep, join late and
finish at different times (``multiagent_done_dict``); observations identify (client,
episode, step, agent). The sampler's episode chunks, stitched per agent, must hold every
step exactly once: per agent the observations in order, the actions the client received
(or logged), the rewards summed between the agent's observations, and its final
terminated / truncated flags. Bad input (unknown agent, a done agent observing again,
wrong shapes, actions for the wrong agents) gets the right error while other clients'
episodes go on untouched.
"""

from __future__ import annotations

import threading
from collections import defaultdict

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.host_envs.external import (
    EpisodeStateError,
    ExternalMultiAgentEnv,
    InvalidDataError,
    UnknownEpisodeError,
)
from jaxsampler.serving.client import PolicyClient
from jaxsampler.serving.server import PolicyServer
from jaxsampler.spaces import Box, Discrete

AGENTS = ("a", "b", "c")
OBS, ACT = Box(-1e6, 1e6, (4,), np.float32), Discrete(3)
CLIENTS, EPISODES = 4, 2


def obs_of(cid: int, ep: int, k: int, agent: str) -> np.ndarray:
    return np.array([cid, ep, k, AGENTS.index(agent)], np.float32)


def reward_of(cid: int, ep: int, k: int, agent: str) -> float:
    return float(100 * cid + 10 * ep + k) + 0.25 * AGENTS.index(agent)


class Served:
    """Server + a HostSampler thread collecting every ``sample()`` chunk."""

    def __init__(self) -> None:
        env = ExternalMultiAgentEnv(
            OBS, ACT, agent_ids=AGENTS, max_wait_s=0.003, episode_timeout_s=60.0
        )
        self.server = PolicyServer(env, port=0)
        policy = js.MLPPolicy(OBS, ACT, hidden_sizes=(4,))
        self.params = policy.init(jax.random.PRNGKey(0))
        self.sampler = js.sampling.HostSampler(
            self.server, policy, seed=0, timeout_s=0.1, batch_sizes=(16,)
        )
        self.chunks: list = []
        self.calls = 0
        self.errors: list = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                self.chunks.extend(self.sampler.sample(self.params, num_timesteps=8))
                self.calls += 1
            except Exception as e:  # surfaced by the test
                self.errors.append(e)
                return

    def wait_finished(self, eids: list[str], timeout: float = 30.0) -> None:
        env = self.server.env
        ev = threading.Event()
        for _ in range(int(timeout / 0.01)):
            if all(env.episode_status(e) in ("completed", "abandoned") for e in eids):
                break
            ev.wait(0.01)
        else:
            raise AssertionError("episodes not finished in time")
        # The final steps were polled; the sampler call holding them returns within its
        # timeout_s: wait for two more calls to complete.
        calls = self.calls
        for _ in range(int(timeout / 0.01)):
            if self.calls >= calls + 2 or self.errors:
                return
            ev.wait(0.01)
        raise AssertionError("the sampler made no progress")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.server.close()
        assert not self.thread.is_alive()


def new_agent_log() -> dict:
    return {"obs": [], "actions": [], "rewards": [], "pending": None, "done": None}


def run_episode(client: PolicyClient, cid: int, ep: int, log: dict) -> str:
    """One scripted episode; records per agent what the sampler must hold.

    Agent ``a`` observes every step; ``b`` observes at even steps and is marked done
    after step 2 (its final observation comes at step 3); ``c`` joins at step 1 and
    observes every step. Every observing, not-done agent gets a reward after each step,
    and so does ``b`` while it waits between its observations. Episodes of odd clients
    end truncated. Step 1 of client 0 is an off-policy ``log_action``."""
    eid = client.start_episode(None)
    length = 4 + (cid + ep) % 3
    truncated = cid % 2 == 1
    agents = {a: new_agent_log() for a in AGENTS}
    done: set[str] = set()
    live: set[str] = set()
    for k in range(length):
        seen = ["a"]
        if k % 2 == 0 and "b" not in done:
            seen.append("b")
        if k == 3 and "b" in done:
            seen.append("b")  # b's final observation
        if k >= 1:
            seen.append("c")
        obs = {a: obs_of(cid, ep, k, a) for a in seen}
        for a in seen:
            ag = agents[a]
            if ag["pending"] is not None:  # the previous step of this agent completes
                ag["rewards"].append(ag["pending"])
            ag["obs"].append(obs[a])
            live.add(a)
        final_b = k == 3 and "b" in done
        if final_b:
            agents["b"]["done"] = "terminated"
            agents["b"]["pending"] = None
            live.discard("b")
        acting = [a for a in seen if not (a == "b" and final_b)]
        if cid == 0 and k == 1:
            actions = {a: (k + AGENTS.index(a)) % 3 for a in acting}
            client.log_action(eid, obs, actions)
        else:
            actions = client.get_action(eid, obs)
            assert set(actions) == set(acting), (actions, acting)
        for a in acting:
            agents[a]["actions"].append(int(actions[a]))
            agents[a]["pending"] = 0.0
        rewards = {a: reward_of(cid, ep, k, a) for a in sorted(live)}
        dones = {"b": True} if k == 2 and "b" in live else None
        client.log_returns(eid, rewards, multiagent_done_dict=dones)
        for a, r in rewards.items():
            agents[a]["pending"] += r
        if dones:
            done.add("b")
    final = {a: obs_of(cid, ep, length, a) for a in sorted(live)}
    client.end_episode(eid, final, truncated=truncated)
    for a in live:
        ag = agents[a]
        ag["rewards"].append(ag["pending"])
        ag["obs"].append(final[a])
        ag["done"] = "truncated" if truncated else "terminated"
    log[(cid, ep)] = {a: ag for a, ag in agents.items() if ag["obs"]}
    return eid


def stitch(chunks: list) -> dict:
    """Per (client, episode, agent): the agent's timestep -> obs / action / reward, each
    counted, from every chunk (continuation chunks repeat the previous last observation
    at their first timestep: observations may come twice, actions and rewards never)."""
    out: dict = defaultdict(
        lambda: {"obs": {}, "act": defaultdict(list), "rew": defaultdict(list), "flags": set()}
    )
    for ch in chunks:
        for agent, sa in ch.agent_episodes.items():
            obs = np.asarray(sa.get_observations())
            assert len(obs) == len(sa) + 1
            cid, ep = int(obs[0][0]), int(obs[0][1])
            assert int(obs[0][3]) == AGENTS.index(agent)
            rec = out[(cid, ep, agent)]
            for i, o in enumerate(obs):
                t = sa.t_started + i
                if t in rec["obs"]:
                    np.testing.assert_array_equal(rec["obs"][t], o)
                rec["obs"][t] = o
            for i, (a, r) in enumerate(zip(sa.get_actions(), sa.get_rewards(), strict=True)):
                rec["act"][sa.t_started + i].append(int(a))
                rec["rew"][sa.t_started + i].append(float(r))
            if sa.is_terminated:
                rec["flags"].add("terminated")
            if sa.is_truncated:
                rec["flags"].add("truncated")
    return out


def check_exactly_once(chunks: list, log: dict) -> int:
    got = stitch(chunks)
    want_keys = {(c, e, a) for (c, e), agents in log.items() for a in agents}
    assert set(got) == want_keys, set(got) ^ want_keys
    n = 0
    for (cid, ep), agents in log.items():
        for agent, exp in agents.items():
            rec = got[(cid, ep, agent)]
            ts = sorted(rec["obs"])
            assert ts == list(range(len(exp["obs"]))), (cid, ep, agent, ts)
            np.testing.assert_array_equal(np.stack([rec["obs"][t] for t in ts]), exp["obs"])
            assert sorted(rec["act"]) == list(range(len(exp["actions"])))
            assert all(len(v) == 1 for v in rec["act"].values()), "an action came twice"
            assert all(len(v) == 1 for v in rec["rew"].values()), "a reward came twice"
            assert [rec["act"][t][0] for t in sorted(rec["act"])] == exp["actions"]
            assert [rec["rew"][t][0] for t in sorted(rec["rew"])] == pytest.approx(exp["rewards"])
            assert rec["flags"] == {exp["done"]}, (cid, ep, agent, rec["flags"])
            n += len(exp["actions"])
    return n


@pytest.fixture
def served():
    s = Served()
    yield s
    s.close()


def test_multi_agent_clients_exactly_once(served):
    log: dict = {}
    eids: list[str] = []
    errors: list = []

    def client(cid: int) -> None:
        try:
            with PolicyClient(served.server.address) as c:
                for ep in range(EPISODES):
                    eids.append(run_episode(c, cid, ep, log))
        except Exception as e:
            errors.append((cid, e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors, errors
    served.wait_finished(eids)
    served.close()
    assert not served.errors, served.errors
    n = check_exactly_once(served.chunks, log)
    assert n == sum(len(ag["actions"]) for agents in log.values() for ag in agents.values())
    assert len(eids) == len(set(eids)) == CLIENTS * EPISODES


def test_bad_input_gets_4xx_and_other_clients_lose_nothing(served):
    address = served.server.address
    log: dict = {}
    eids: list[str] = []
    good = PolicyClient(address)
    bad = PolicyClient(address, defer_returns=False)
    # A good client's episode runs around the bad client's errors.
    eids.append(run_episode(good, 0, 0, log))
    eid = bad.start_episode(None)
    o = {a: obs_of(9, 0, 0, a) for a in ("a", "b")}
    with pytest.raises(InvalidDataError, match="unknown agent"):
        bad.get_action(eid, {**o, "zz": obs_of(9, 0, 0, "a")})
    with pytest.raises(InvalidDataError, match="shape"):
        bad.get_action(eid, {"a": np.zeros(5, np.float32)})
    with pytest.raises(InvalidDataError):
        bad.get_action(eid, {})  # no observing agent
    with pytest.raises(InvalidDataError):
        bad.get_action(eid, [1, 2, 3])  # not a dict
    with pytest.raises(UnknownEpisodeError):
        bad.get_action("no-such-episode", o)
    acts = bad.get_action(eid, o)  # the episode survived every refusal above
    assert set(acts) == {"a", "b"}
    with pytest.raises(InvalidDataError, match="unknown agent"):
        bad.log_returns(eid, {"zz": 1.0})
    with pytest.raises(InvalidDataError, match="finite"):
        bad.log_returns(eid, {"a": float("nan")})
    with pytest.raises(InvalidDataError, match="unknown agent"):
        bad.log_returns(eid, {"a": 1.0}, multiagent_done_dict={"zz": True})
    bad.log_returns(eid, {"a": 1.0, "b": 2.0}, multiagent_done_dict={"b": True})
    with pytest.raises(InvalidDataError, match="final observations must be"):
        bad.get_action(eid, {"a": obs_of(9, 0, 1, "a")})  # b's final observation is missing
    with pytest.raises(InvalidDataError, match="acting agents"):
        bad.log_action(eid, {"a": obs_of(9, 0, 1, "a"), "b": obs_of(9, 0, 1, "b")}, {"b": 1})
    with pytest.raises(InvalidDataError):
        bad.log_action(
            eid, {"a": obs_of(9, 0, 1, "a"), "b": obs_of(9, 0, 1, "b")}, {"a": np.zeros(3)}
        )
    acts = bad.get_action(eid, {"a": obs_of(9, 0, 1, "a"), "b": obs_of(9, 0, 1, "b")})
    assert set(acts) == {"a"}  # b got its final observation: no action
    with pytest.raises(InvalidDataError, match="done and cannot observe again"):
        bad.get_action(eid, {"a": obs_of(9, 0, 2, "a"), "b": obs_of(9, 0, 2, "b")})
    with pytest.raises(EpisodeStateError, match="already done"):
        bad.log_returns(eid, {"b": 1.0})
    bad.log_returns(eid, {"a": 3.0})
    bad.end_episode(eid, {"a": obs_of(9, 0, 2, "a")})
    with pytest.raises(EpisodeStateError, match="completed"):
        bad.get_action(eid, {"a": obs_of(9, 0, 3, "a")})
    eids.append(eid)
    eids.append(run_episode(good, 0, 1, log))
    good.close()
    bad.close()
    served.wait_finished(eids)
    served.close()
    assert not served.errors, served.errors
    check_exactly_once([c for c in served.chunks if int(_first_obs(c)[0]) == 0], log)
    # The bad client's accepted steps are all there too, with their rewards.
    got = stitch([c for c in served.chunks if int(_first_obs(c)[0]) == 9])
    assert set(got) == {(9, 0, "a"), (9, 0, "b")}
    a, b = got[(9, 0, "a")], got[(9, 0, "b")]
    assert sorted(a["obs"]) == [0, 1, 2] and sorted(b["obs"]) == [0, 1]
    assert [a["rew"][t][0] for t in (0, 1)] == [1.0, 3.0]
    assert [b["rew"][t][0] for t in (0,)] == [2.0]
    assert a["flags"] == {"terminated"} and b["flags"] == {"terminated"}


def _first_obs(chunk) -> np.ndarray:
    sa = next(iter(chunk.agent_episodes.values()))
    return np.asarray(sa.get_observations(0))


def test_agent_done_in_a_truncated_final_step_follows_rllib_flags(served):
    with PolicyClient(served.server.address) as c:
        eid = c.start_episode(None)
        c.get_action(eid, {a: obs_of(7, 0, 0, a) for a in ("a", "b")})
        c.log_returns(eid, {"a": 1.0, "b": 2.0}, multiagent_done_dict={"b": True})
        c.end_episode(eid, {a: obs_of(7, 0, 1, a) for a in ("a", "b")}, truncated=True)
    served.wait_finished([eid])
    served.close()
    got = {}
    for ch in served.chunks:
        for agent, sa in ch.agent_episodes.items():
            if len(sa) and int(np.asarray(sa.get_observations(0))[0]) == 7:
                got[agent] = (sa.is_terminated, sa.is_truncated)
    assert got["a"] == (False, True)  # the episode was truncated
    # b terminated in that same final env step: the env reports it terminated only, and the
    # episode ORs the episode-level truncation into every agent of that step, as RLlib's
    # MultiAgentEpisode.add_env_step does.
    assert got["b"] == (True, True)
