"""ExternalEnv / ExternalMultiAgentEnv: simulator threads drive, a poll loop answers.

The test's "sampler" is a plain poll/send_actions loop answering with a deterministic
function of the observation (no jax), recording everything ``poll`` delivered; the
simulator threads record what they logged. Both records must match step for step.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from jaxsampler import spaces
from jaxsampler.constants import ALL_AGENTS
from jaxsampler.envs.base import DEFAULT_AGENT_ID as AGENT
from jaxsampler.host_envs.base import HostEnv
from jaxsampler.host_envs.external import (
    CLIENT_POLICY_INFO,
    CapacityError,
    EnvClosedError,
    EpisodeStateError,
    ExternalEnv,
    ExternalMultiAgentEnv,
    InvalidDataError,
    UnknownEpisodeError,
)
from tests.fakes import (
    ACT,
    OBS,
    PollLoop,
    answer,
    check_exactly_once,
    run_clients,
    simulate,
    wait_finished,
)


def test_many_threads_exactly_once_and_batched():
    env = ExternalEnv(OBS, ACT, max_wait_s=0.005)
    assert isinstance(env, HostEnv) and env.agent_ids == (AGENT,)
    loop = PollLoop(env)
    try:
        logs = run_clients(16, lambda cid: simulate(env, cid))
        wait_finished(env, [e for log in logs.values() for e in log])
    finally:
        loop.close()
    n = check_exactly_once(loop, logs)
    assert n == 16 * 3 * 7
    assert sum(loop.poll_sizes) == n == env.stats["steps_delivered"]
    assert max(loop.poll_sizes) > 1, "concurrent get_action calls were never batched"
    assert any(s[-1] is not None for steps in loop.steps.values() for s in steps)
    assert env.running_episodes() == [] and env.stats["dropped_actions"] == 0
    env.close()


def test_protocol_sequence_like_rllib():
    """The reference's ExternalEnv example (section 5.2), our infos not sticky."""
    env = ExternalEnv(spaces.Discrete(100), spaces.Discrete(2))
    got = {}

    def sim():
        eid = env.start_episode(episode_id="e1")
        got["a"] = env.get_action(eid, 10)
        env.log_returns(eid, 1.0, {"x": 1})
        env.log_returns(eid, 2.0)
        env.log_action(eid, 11, 1)
        env.log_returns(eid, 5.0)
        env.end_episode(eid, 12)

    t = threading.Thread(target=sim)
    t.start()
    r0 = env.poll()
    assert (
        r0.obs == {"e1": {AGENT: 10}}
        and r0.rewards == {"e1": {AGENT: 0.0}}
        and r0.off_policy_actions == {}
    )
    assert r0.terminateds == {"e1": {AGENT: False, ALL_AGENTS: False}}
    env.send_actions({"e1": {AGENT: np.int32(1)}})
    r1 = env.poll()
    assert r1.obs == {"e1": {AGENT: 11}} and r1.rewards == {"e1": {AGENT: 3.0}}
    assert r1.infos == {"e1": {AGENT: {"x": 1}}} and r1.off_policy_actions == {"e1": {AGENT: 1}}
    env.send_actions({"e1": {AGENT: 0}})
    r2 = env.poll()
    assert (
        r2.obs == {"e1": {AGENT: 12}}
        and r2.rewards == {"e1": {AGENT: 5.0}}
        and r2.infos == {"e1": {AGENT: {}}}
    )
    assert (
        r2.terminateds == {"e1": {AGENT: True, ALL_AGENTS: True}}
        and r2.truncateds["e1"][ALL_AGENTS] is False
    )
    t.join(timeout=10)
    assert got["a"] == 1
    assert env.episode_status("e1") == "completed"
    with pytest.raises(EpisodeStateError, match="already completed"):
        env.get_action("e1", 13)
    with pytest.raises(EpisodeStateError, match="already completed"):
        env.start_episode("e1")
    with pytest.raises(UnknownEpisodeError, match="not found"):
        env.get_action("nope", 1)
    assert env.poll(timeout=0.01).obs == {}
    env.close()


def test_bad_input_is_local_to_the_caller():
    env = ExternalEnv(OBS, ACT, max_concurrent_episodes=3)
    loop = PollLoop(env)
    try:
        ok = env.start_episode("ok")
        with pytest.raises(EpisodeStateError, match="already been started"):
            env.start_episode("ok")
        with pytest.raises(InvalidDataError, match=r"expected shape \(3,\)"):
            env.get_action(ok, np.zeros(4, np.float32))
        with pytest.raises(InvalidDataError, match="cannot be cast"):
            env.get_action(ok, np.array(["a", "b", "c"]))
        with pytest.raises(InvalidDataError, match="Discrete"):
            env.log_action(ok, np.zeros(3, np.float32), 97)
        with pytest.raises(InvalidDataError, match="reward"):
            env.log_returns(ok, "lots")
        with pytest.raises(UnknownEpisodeError):
            env.log_returns("missing", 1.0)
        env.start_episode("b")
        env.start_episode("c")
        with pytest.raises(CapacityError):
            env.start_episode("d")
        # After all those errors, the episode still works, float64 obs are cast.
        obs = np.array([1.0, 2.0, 3.0])
        assert env.get_action(ok, obs) == answer(obs)
        env.end_episode(ok, obs)
        with pytest.raises(EpisodeStateError, match="already completed"):
            env.get_action(ok, obs)
        wait_finished(env, [ok])
    finally:
        loop.close()
    assert [s[0][AGENT].dtype for s in loop.steps["ok"]] == [np.float32, np.float32]
    assert len(loop.steps["ok"]) == 2 and loop.steps["ok"][1][2][ALL_AGENTS]
    env.close()


def test_timeout_abandons_only_that_episode():
    env = ExternalEnv(OBS, ACT, action_timeout_s=0.2)
    slow, fast = env.start_episode("slow"), env.start_episode("fast")
    # Nobody polls: the request is never delivered, so it becomes the final observation.
    with pytest.raises(TimeoutError):
        env.get_action(slow, np.ones(3, np.float32))
    assert env.episode_status(slow) == "finishing"
    with pytest.raises(EpisodeStateError, match="abandoned"):
        env.get_action(slow, np.ones(3, np.float32))
    loop = PollLoop(env)
    try:
        obs = np.zeros(3, np.float32)
        assert env.get_action(fast, obs) == answer(obs)
        env.end_episode(fast, obs)
        wait_finished(env, [fast, slow])
    finally:
        loop.close()
    (s,) = loop.steps[slow]
    assert (
        s[3] == {AGENT: True, ALL_AGENTS: True}
        and s[2][ALL_AGENTS] is False
        and s[4][AGENT]["abandoned"] is True
    )
    np.testing.assert_array_equal(s[0][AGENT], np.ones(3))
    assert len(loop.steps[fast]) == 2 and env.episode_status(slow) == "abandoned"
    env.close()


def test_abandon_after_delivery_repeats_last_obs_and_drops_late_answer():
    env = ExternalEnv(OBS, ACT)
    held = {"e"}
    loop = PollLoop(env, hold=lambda eid: eid in held)
    result = {}

    def sim():
        eid = env.start_episode("e")
        try:
            env.get_action(eid, np.full(3, 2.0, np.float32))
        except EpisodeStateError as e:
            result["error"] = e

    t = threading.Thread(target=sim)
    t.start()
    while "e" not in loop.held:  # delivered, answer held back
        threading.Event().wait(0.001)
    env.abandon_episode("e", "test")
    t.join(timeout=10)
    held.clear()  # the late answer goes out and is dropped
    wait_finished(env, ["e"])
    loop.close()
    assert "abandoned" in str(result["error"])
    first, last = loop.steps["e"]
    np.testing.assert_array_equal(last[0][AGENT], first[0][AGENT])
    assert last[3][ALL_AGENTS] and last[4][AGENT] == {"abandoned": True}
    assert env.episode_status("e") == "abandoned"
    env.close()


def test_idle_episode_times_out():
    env = ExternalEnv(OBS, ACT, episode_timeout_s=0.05)
    loop = PollLoop(env)
    try:
        eid = env.start_episode()
        env.get_action(eid, np.zeros(3, np.float32))
        wait_finished(env, [eid])
    finally:
        loop.close()
    assert env.episode_status(eid) == "abandoned"
    assert loop.steps[eid][-1][3][ALL_AGENTS] and loop.steps[eid][-1][4][AGENT]["abandoned"]
    env.close()


def test_close_fails_blocked_callers():
    env = ExternalEnv(OBS, ACT)
    eid = env.start_episode()
    errors = []

    def sim():
        try:
            env.get_action(eid, np.zeros(3, np.float32))
        except EnvClosedError as e:
            errors.append(e)

    t = threading.Thread(target=sim)
    t.start()
    r = env.poll()
    assert eid in r.obs
    env.close()
    t.join(timeout=10)
    assert len(errors) == 1
    assert env.poll().obs == {}
    with pytest.raises(EnvClosedError):
        env.start_episode()


def test_log_action_extra_info_and_training_disabled():
    env = ExternalEnv(OBS, ACT)
    eid = env.start_episode(training_enabled=False)
    env.log_action(eid, np.zeros(3), 5, info={CLIENT_POLICY_INFO: {"weights_version": 3}})
    r = env.poll()
    assert r.off_policy_actions == {eid: {AGENT: 5}}
    assert r.infos[eid][AGENT] == {
        CLIENT_POLICY_INFO: {"weights_version": 3},
        "training_enabled": False,
    }
    env.close()


def test_multi_agent():
    agents = ("a", "b", "c")
    env = ExternalMultiAgentEnv(OBS, ACT, agent_ids=agents, max_wait_s=0.005)
    loop = PollLoop(env)

    def sim(cid):
        out = {}
        for e in range(3):
            eid = env.start_episode()
            o = lambda a, t, e=e: np.array([cid, e * 10 + agents.index(a), t], np.float32)
            acts = env.get_action(eid, {"a": o("a", 0), "b": o("b", 0)})
            assert acts == {"a": answer(o("a", 0)), "b": answer(o("b", 0))}
            with pytest.raises(InvalidDataError, match="not observed yet"):
                env.log_returns(eid, {"a": 1.0, "c": 2.0})  # c's reward would fit no step
            env.log_returns(eid, {"a": 1.0, "b": 2.0}, {"a": {"k": 1}})
            env.log_returns(eid, {"a": 1.0}, None, {"b": True})
            acts = env.get_action(eid, {"a": o("a", 1), "b": o("b", 1), "c": o("c", 1)})
            assert acts == {"a": answer(o("a", 1)), "c": answer(o("c", 1))}  # b is done
            with pytest.raises(InvalidDataError, match="done"):
                env.get_action(eid, {"b": o("b", 2)})
            env.log_action(eid, {"c": o("c", 2)}, {"c": 4})
            env.log_returns(eid, {"a": 0.5, "c": 1.5})
            env.end_episode(eid, {"a": o("a", 3), "c": o("c", 3)})
            out[eid] = cid
        return out

    try:
        logs = run_clients(8, sim)
        wait_finished(env, [e for log in logs.values() for e in log])
    finally:
        loop.close()
    eids = {e for log in logs.values() for e in log}
    assert set(loop.steps) == eids and len(eids) == 24
    for eid in eids:
        s0, s1, s2, s3 = loop.steps[eid]
        assert set(s0[0]) == {"a", "b"} and s0[1] == {"a": 0.0, "b": 0.0}
        assert set(s1[0]) == {"a", "b", "c"} and s1[1] == {"a": 2.0, "b": 2.0, "c": 0.0}
        assert s1[2] == {"a": False, "b": True, "c": False, ALL_AGENTS: False}
        assert s1[4] == {"a": {"k": 1}, "b": {}, "c": {}}
        assert set(s2[0]) == {"c"} and s2[5] == {"c": 4} and s2[1] == {"c": 0.0}
        assert s3[1] == {"a": 0.5, "c": 1.5} and s3[2] == {"a": True, "c": True, ALL_AGENTS: True}
    env.close()


def test_subclass_run_loop():
    class Sim(ExternalEnv):
        def run(self):
            eid = self.start_episode("run")
            obs = np.array([1, 1, 1], np.float32)
            self.log_returns(eid, 0.0)
            self.end_episode(eid, obs * self.get_action(eid, obs))

    env = Sim(OBS, ACT)
    loop = PollLoop(env)
    try:
        thread = env.start()
        assert env.start() is thread
        thread.join(timeout=10)
        wait_finished(env, ["run"])
    finally:
        loop.close()
    np.testing.assert_array_equal(loop.steps["run"][1][0][AGENT], np.full(3, answer(np.ones(3))))
    env.close()


def test_observation_checks_and_buffer_reuse():
    """The fast check of exact-dtype arrays rejects what the slow one rejects, and a
    simulator may overwrite its observation buffer after a call."""
    bounded = ExternalEnv(spaces.Box(-1.0, 1.0, (3,)), ACT)
    mixed = ExternalEnv(
        spaces.Box(np.array([-1.0, -np.inf, -1.0]), np.array([1.0, np.inf, 1.0])), ACT
    )
    free = ExternalEnv(spaces.Box(-np.inf, np.inf, (3,)), ACT)
    for env, bad, ok in (
        (bounded, [np.array([0, np.inf, 0], np.float32), np.array([0, np.nan, 0], np.float32)], []),
        (
            mixed,
            [np.array([np.inf, 0, 0], np.float32), np.array([0, np.nan, 0], np.float32)],
            [np.array([0, -np.inf, 0], np.float32)],
        ),
        (
            free,
            [np.array([np.nan, 0, 0], np.float32)],
            [np.array([np.inf, -np.inf, 0], np.float32)],
        ),
    ):
        eid = env.start_episode()
        for x in bad:
            what = "NaN" if np.isnan(x).any() else "infinite"
            with pytest.raises(InvalidDataError, match=what):
                env.log_action(eid, x, 0)
            with pytest.raises(InvalidDataError, match=what):  # the slow path (float64) agrees
                env.log_action(eid, x.astype(np.float64), 0)
        for x in ok:
            env.log_action(eid, x, 0)
        got = env.poll(timeout=0).obs
        assert len(got) == len(ok) and all(np.array_equal(got[eid][AGENT], o) for o in ok)

    env = ExternalEnv(OBS, ACT)
    eid = env.start_episode()
    buf = np.zeros(3, np.float32)
    for t in range(3):
        buf[:] = t  # the simulator reuses one buffer
        env.log_action(eid, buf, t)
    buf[:] = 99
    got = [env.poll(timeout=0).obs[eid][AGENT] for _ in range(3)]
    assert [g.tolist() for g in got] == [[0.0] * 3, [1.0] * 3, [2.0] * 3]
    env.close()


def test_abandoning_a_silent_episode_does_not_slow_later_polls():
    """An episode abandoned before its first request leaves no trace: a poll whose every
    running episode has a request returns at once, not after max_wait_s."""
    env = ExternalEnv(OBS, ACT, max_wait_s=5.0)
    for _ in range(3):
        env.abandon_episode(env.start_episode())  # the client went away before any call
    eid = env.start_episode()
    t = threading.Thread(target=env.get_action, args=(eid, np.zeros(3, np.float32)))
    t.start()
    res = env.poll(timeout=10.0)
    assert list(res.obs) == [eid]
    assert not env._idle - set(env._episodes)
    env.send_actions({eid: {AGENT: 0}})
    t.join(timeout=5)
    assert not t.is_alive()
    env.close()


def test_back_pressure_waiters_are_not_idle_and_their_timeout_abandons():
    env = ExternalEnv(OBS, ACT, max_queued_steps=2, episode_timeout_s=0.2, action_timeout_s=5.0)
    eid = env.start_episode()
    out = {}

    def sim():
        try:
            for t in range(4):
                env.log_action(eid, np.full(3, t, np.float32), 0)
            out["ok"] = True
        except Exception as e:
            out["err"] = e

    th = threading.Thread(target=sim)
    th.start()
    threading.Event().wait(0.4)  # the sampler pauses longer than episode_timeout_s
    for _ in range(3):
        env.poll(timeout=0.5)
    th.join(timeout=5)
    assert out == {"ok": True} and env.episode_status(eid) == "running"
    env.close()

    env = ExternalEnv(OBS, ACT, max_queued_steps=1, action_timeout_s=0.2)
    eid = env.start_episode()
    env.log_action(eid, np.zeros(3, np.float32), 0)
    with pytest.raises(TimeoutError, match="abandoned"):
        env.log_action(eid, np.zeros(3, np.float32), 0)
    assert env.episode_status(eid) in ("finishing", "abandoned")
    env.close()
