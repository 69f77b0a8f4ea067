"""ExternalEnv under hostile or careless clients: every resource is bounded.

Owners and per-owner quotas, the episode lease (``episode_timeout_s``), id limits,
never-used episodes, reward sums within float32 range, no per-episode state after an
episode ends (table sizes and ``tracemalloc`` over many thousands of episodes), and
multi-agent input that must be refused without touching any episode.

Everything runs in one thread: ``submit(..., want_action=True)`` is a ``get_action``
that does not block (what the policy server calls), answered by ``poll`` /
``send_actions`` in the test.
"""

from __future__ import annotations

import re
import threading
import tracemalloc

import numpy as np
import pytest

from jaxsampler import spaces
from jaxsampler.constants import ALL_AGENTS, DEFAULT_AGENT_ID
from jaxsampler.host_envs import external
from jaxsampler.host_envs.external import (
    MAX_REWARD,
    CapacityError,
    EpisodeStateError,
    ExternalEnv,
    ExternalMultiAgentEnv,
    InvalidDataError,
    UnknownEpisodeError,
)
from jaxsampler.host_envs.external.clock import RunningClock

OBS = spaces.Box(-1e6, 1e6, (2,))
ACT = spaces.Discrete(3)
A = DEFAULT_AGENT_ID
EMPTY_TABLES = {"episodes": 0, "owners": 0, "ready": 0, "idle": 0, "offp_in_flight": 0}


def o(x: float) -> np.ndarray:
    return np.full(2, x, np.float32)


def drain(env) -> list:
    """Polls until nothing is ready, answering every step; returns the poll results."""
    out = []
    while True:
        r = env.poll(timeout=0)
        if not r.obs:
            return out
        out.append(r)
        env.send_actions(
            {
                eid: {a: 0 for a in obs if not r.terminateds[eid].get(a)}
                for eid, obs in r.obs.items()
                if not (r.terminateds[eid][ALL_AGENTS] or r.truncateds[eid][ALL_AGENTS])
            }
        )


def error_of(fn) -> Exception:
    try:
        fn()
    except Exception as e:
        return e
    raise AssertionError("nothing raised")


# -- options and defaults ----------------------------------------------------------------


def test_defaults_are_bounded():
    env = ExternalEnv(OBS, ACT)
    assert env.episode_timeout_s == 600.0
    assert env.max_episodes_per_owner == 1024 and env.max_episode_id_len == 128
    assert ExternalEnv(OBS, ACT, episode_timeout_s=None).episode_timeout_s is None
    env.close()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_episodes_per_owner": 0},
        {"max_episode_id_len": 0},
        {"max_concurrent_episodes": 1.5},
        {"episode_timeout_s": 0},
        {"episode_timeout_s": float("nan")},
        {"max_wait_s": -1},
        {"max_finished_ids": True},
    ],
)
def test_bad_options_are_refused(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        ExternalEnv(OBS, ACT, **kwargs)


# -- owners --------------------------------------------------------------------------------


def test_owners_cannot_see_each_others_episodes():
    env = ExternalEnv(OBS, ACT)
    blank = ExternalEnv(OBS, ACT)  # where "x" is truly unknown
    env.start_episode("x", owner="A")
    waiter = env.submit("x", {A: o(1)}, None, None, True, owner="A")
    calls = {
        "submit": lambda e: e.submit("x", {A: o(2)}, {A: 0}, None, False, owner="B"),
        "log_returns": lambda e: e.log_agent_returns("x", {A: 1.0}, None, None, owner="B"),
        "end": lambda e: e.end_agent_episode("x", {A: o(2)}, False, owner="B"),
        "abandon": lambda e: e.abandon_episode("x", "gone", owner="B"),
    }
    for name, call in calls.items():
        theirs, unknown = error_of(lambda c=call: c(env)), error_of(lambda c=call: c(blank))
        assert type(theirs) is type(unknown) is UnknownEpisodeError, name
        assert str(theirs) == str(unknown) == "Episode x not found.", name
    with pytest.raises(UnknownEpisodeError, match="not found"):
        env.expire_waiter("x", waiter, "gone", owner="B")
    assert not waiter.done and env.episode_status("x") == "running"
    # The owner, and in-process callers (owner=None), may use it.
    (r,) = drain(env)
    assert r.obs["x"][A].tolist() == [1, 1] and waiter.done and waiter.value == {A: 0}
    env.log_agent_returns("x", {A: 2.0}, None, None)  # owner=None
    env.end_agent_episode("x", {A: o(3)}, False, owner="A")
    (r,) = drain(env)
    assert r.rewards["x"] == {A: 2.0} and r.terminateds["x"][ALL_AGENTS]
    # Finished: the owner learns it completed, another owner still sees nothing.
    with pytest.raises(EpisodeStateError, match="already completed"):
        env.log_agent_returns("x", {A: 1.0}, None, None, owner="A")
    with pytest.raises(UnknownEpisodeError, match="not found"):
        env.log_agent_returns("x", {A: 1.0}, None, None, owner="B")
    with pytest.raises(UnknownEpisodeError, match="not found"):
        env.abandon_episode("x", owner="B")
    assert env.abandon_episode("x", owner="A") is False  # own finished episode: no-op
    assert env.abandon_episode("never", "gone") is False  # owner=None: unknown is a no-op
    # An episode started without owner is anyone's.
    env.start_episode("shared")
    env.log_agent_returns("shared", {A: 1.0}, None, None, owner="B")
    assert env.abandon_episode("shared", owner="C") is True
    env.close()
    blank.close()


def test_per_owner_quota_and_abandon_owner():
    env = ExternalEnv(OBS, ACT, max_episodes_per_owner=2, max_concurrent_episodes=5)
    a1, a2 = env.start_episode(owner="A"), env.start_episode(owner="A")
    with pytest.raises(CapacityError, match="max_episodes_per_owner=2"):
        env.start_episode(owner="A")
    b1 = env.start_episode(owner="B")
    env.start_episode(owner="B")
    env.start_episode()  # no owner: no quota
    with pytest.raises(CapacityError, match="max_concurrent_episodes=5"):
        env.start_episode(owner="C")
    # A's first episode ends (and is polled): A may start another one.
    env.submit(a1, {A: o(1)}, {A: 1}, None, False, owner="A")
    env.end_agent_episode(a1, {A: o(2)}, False, owner="A")
    drain(env)
    a3 = env.start_episode(owner="A")
    # A client that went away: all its running episodes end, blocked calls raise.
    w = env.submit(a3, {A: o(3)}, None, None, True, owner="A")
    assert env.abandon_owner("A", "client gone") == 2  # a2 (never used) and a3
    assert w.done and isinstance(w.error, EpisodeStateError) and "client gone" in str(w.error)
    assert env.episode_status(a2) == "abandoned"  # never used: gone at once
    (r,) = drain(env)
    assert set(r.obs) == {a3} and r.truncateds[a3] == {A: True, ALL_AGENTS: True}
    assert r.infos[a3][A]["abandoned"] is True
    assert env.abandon_owner("A") == 0 and env.abandon_owner("nobody") == 0
    assert env.episode_status(b1) == "running"  # B untouched
    assert env.table_sizes()["owners"] == 1  # only B holds episodes
    with pytest.raises(ValueError, match="owner"):
        env.abandon_owner(None)  # type: ignore[arg-type]
    env.close()


class FakeClock:
    """Stands in for the ``time`` module inside the env: leases expire when the test says
    so, without sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(external.env, "time", fake)
    # Idle times and deadlines run on the env's RunningClock: one over the fake time that
    # never sees a pause (the jumps below are time the process ran).
    monkeypatch.setattr(
        external.episodes, "process_clock", lambda: RunningClock(float("inf"), fake.monotonic)
    )
    return fake


def test_vanished_clients_lease_frees_capacity_without_a_poller(clock):
    """The lock-out: episodes started and never used (or a client that died) free their
    slots after ``episode_timeout_s``; a refused start sweeps them, no poll needed."""
    env = ExternalEnv(OBS, ACT, max_concurrent_episodes=3, episode_timeout_s=10.0)
    silent = [env.start_episode(owner="gone") for _ in range(2)]
    used = env.start_episode(owner="gone")
    env.submit(used, {A: o(1)}, {A: 0}, None, False)
    clock.now += 9.9
    with pytest.raises(CapacityError, match="max_concurrent_episodes=3"):
        env.start_episode(owner="new")  # the lease has not run out yet
    clock.now += 1.2
    new = env.start_episode(owner="new")
    assert [env.episode_status(e) for e in silent] == ["abandoned"] * 2
    assert env.episode_status(new) == "running"
    # The used one ends truncated at the next polls: its step, then the final one.
    results = drain(env)
    steps = [r for r in results if used in r.obs]
    assert len(steps) == 2 and steps[-1].truncateds[used][ALL_AGENTS]
    assert steps[-1].infos[used][A]["abandoned"] is True
    assert env.episode_status(used) == "abandoned"
    env.close()


def test_the_lease_restarts_when_a_get_action_is_answered(clock):
    env = ExternalEnv(OBS, ACT, episode_timeout_s=10.0, max_wait_s=0.0)
    eid = env.start_episode()
    w = env.submit(eid, {A: o(1)}, None, None, True)
    assert list(env.poll(timeout=0).obs) == [eid]
    clock.now += 60.0  # the sampler took a minute; a waiting caller is never expired
    env.poll(timeout=0)
    assert env.episode_status(eid) == "running"
    env.send_actions({eid: {A: 1}})  # the client's 10 s start now
    assert w.value == {A: 1}
    clock.now += 9.0
    env.poll(timeout=0)
    assert env.episode_status(eid) == "running"
    clock.now += 2.0
    r = env.poll(timeout=0)  # 11 s without a call: abandoned, last observation repeated
    assert r.truncateds[eid][ALL_AGENTS] and r.obs[eid][A].tolist() == [1.0, 1.0]
    assert env.episode_status(eid) == "abandoned"
    env.close()


# -- never-used episodes and poll --------------------------------------------------------


def test_a_never_used_episode_does_not_hold_up_poll():
    env = ExternalEnv(OBS, ACT, max_wait_s=600.0)  # a wait would be unmistakable
    env.start_episode("unused")
    env.start_episode("used")
    assert env.table_sizes()["idle"] == 0
    w = env.submit("used", {A: o(1)}, None, None, True)
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("r", env.poll(timeout=600.0)))
    t.start()
    t.join(timeout=30)
    if t.is_alive():
        env.close()
        t.join(timeout=10)
        raise AssertionError("poll waited for the never-used episode")
    assert list(out["r"].obs) == ["used"]
    env.send_actions({"used": {A: 2}})
    assert w.value == {A: 2}
    # An episode that did send a request is waited for (batching): it is idle now.
    assert env.table_sizes()["idle"] == 1
    assert env.episode_status("unused") == "running"  # still counts, until its lease ends
    env.close()


# -- ids ------------------------------------------------------------------------------------


def test_episode_id_limits():
    env = ExternalEnv(OBS, ACT)
    assert env.start_episode("x" * 128) == "x" * 128
    with pytest.raises(InvalidDataError, match=r"129 characters.*max_episode_id_len"):
        env.start_episode("y" * 129)
    for bad in ("", 7, None.__class__):
        with pytest.raises(InvalidDataError, match="non-empty str"):
            env.start_episode(bad)  # type: ignore[arg-type]
    huge = "z" * 1_000_000
    e = error_of(lambda: env.log_returns(huge, 1.0))
    assert isinstance(e, UnknownEpisodeError) and len(str(e)) < 200
    assert env.episode_status(huge) == "unknown"
    assert env.start_episode("\ud800") == "\ud800"  # any str, even one utf-8 cannot encode
    ids = {env.start_episode() for _ in range(500)}
    assert len(ids) == 500 and all(re.fullmatch("[0-9a-f]{32}", i) for i in ids)
    env.close()


# -- rewards ----------------------------------------------------------------------------------


def test_reward_values_and_sums_stay_in_float32_range():
    env = ExternalEnv(OBS, ACT)
    eid = env.start_episode()
    env.log_action(eid, o(0), 0)
    env.log_returns(eid, 3e38)
    for bad, match in (
        (3e38, "would sum to 6e\\+38"),  # the sum overflows float32
        (1e39, "float32 range"),
        (1e308, "float32 range"),
        (float("nan"), "float32 range"),
        (np.float64(-np.inf), "float32 range"),
        (10**400, "must be a number"),
        ("1.0", "must be a number"),
        (None, "must be a number"),
    ):
        with pytest.raises(InvalidDataError, match=match):
            env.log_returns(eid, bad)
    env.log_returns(eid, 4e37)  # still within range: accepted
    env.log_action(eid, o(1), 0)
    env.log_returns(eid, -MAX_REWARD)  # a new step: a new sum
    with pytest.raises(InvalidDataError, match="outside float32 range"):
        env.log_returns(eid, -1e38)
    env.end_episode(eid, o(2))
    rewards = [r.rewards[eid][A] for r in drain(env)]
    assert rewards == [0.0, 3e38 + 4e37, -MAX_REWARD]
    assert np.isfinite(np.asarray(rewards, np.float32)).all()

    ma = ExternalMultiAgentEnv(OBS, ACT, agent_ids=("a", "b"))
    eid = ma.start_episode()
    ma.log_action(eid, {"a": o(0), "b": o(0)}, {"a": 0, "b": 0})
    ma.log_returns(eid, {"a": 1.0, "b": 3e38})
    with pytest.raises(InvalidDataError, match=r"reward\['b'\]"):
        ma.log_returns(eid, {"a": 2.0, "b": 3e38})  # b overflows: a's 2.0 is not added
    ma.end_episode(eid, {"a": o(1), "b": o(1)})
    assert drain(ma)[-1].rewards[eid] == {"a": 1.0, "b": 3e38}
    ma.close()
    env.close()


# -- no state left behind --------------------------------------------------------------------


def run_episodes(env, n: int, offset: int = 0) -> None:
    """``n`` tiny episodes of four kinds (logged, asked, abandoned after use, never
    used), several owners, polled as they go."""
    for i in range(offset, offset + n):
        owner = None if i % 5 == 0 else f"client{i % 3}"
        eid = env.start_episode(f"ep{i}", owner=owner)
        kind = i % 4
        if kind == 0:
            env.submit(eid, {A: o(i)}, {A: 1}, None, False, owner=owner)
            env.log_agent_returns(eid, {A: 1.0}, {A: {"i": i}}, None, owner=owner)
            env.end_agent_episode(eid, {A: o(i + 1)}, i % 8 == 0, owner=owner)
        elif kind == 1:
            w = env.submit(eid, {A: o(i)}, None, None, True, owner=owner)
            drain(env)
            assert w.done
            env.end_agent_episode(eid, {A: o(i + 1)}, False, owner=owner)
        elif kind == 2:
            env.submit(eid, {A: o(i)}, {A: 1}, None, False, owner=owner)
            env.abandon_episode(eid, "test", owner=owner)
        elif owner is not None:
            env.abandon_owner(owner)  # abandons this never-used one (and the owner's others)
        else:
            env.abandon_episode(eid)
        if i % 16 == 15:
            drain(env)
    drain(env)


def test_internal_tables_return_to_empty_after_thousands_of_episodes():
    env = ExternalEnv(OBS, ACT, max_finished_ids=300, max_wait_s=0.0)
    run_episodes(env, 4000)
    assert env.table_sizes() == {**EMPTY_TABLES, "finished": 300}
    assert env.open_episodes == 0 and env.running_episodes() == []
    assert env.stats["steps_delivered"] == 1000 * (2 + 2 + 2) and env.stats["dropped_actions"] == 0
    # The newest finished ids are remembered, the oldest forgotten.
    assert env.episode_status("ep3999") == "abandoned" and env.episode_status("ep0") == "unknown"
    assert env.episode_status("ep3997") == "completed"
    env.close()


def test_memory_does_not_grow_with_the_number_of_episodes():
    env = ExternalEnv(OBS, ACT, max_finished_ids=200, max_wait_s=0.0)
    tracemalloc.start()
    try:
        # Fill the finished memory (from here on its size is fixed) while tracing, so
        # that every entry it drops later was traced when allocated.
        run_episodes(env, 1000)
        before = tracemalloc.get_traced_memory()[0]
        run_episodes(env, 20_000, offset=1000)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert env.table_sizes() == {**EMPTY_TABLES, "finished": 200}
    # A leak of even 8 bytes per episode would be 160 kB here.
    assert grown < 64 * 1024, grown
    env.close()


# -- multi-agent hostile input ------------------------------------------------------------------

AGENTS = ("a", "b", "c")


def ma_scenario(hostile: list | None) -> list:
    """Two episodes, x and y, in lockstep; agent b of x finishes early, c observes only
    later. ``hostile``: calls made against x midway, each must raise InvalidDataError.
    Returns everything the polls delivered."""
    env = ExternalMultiAgentEnv(OBS, ACT, agent_ids=AGENTS, max_wait_s=0.0)
    delivered = []
    for eid in ("x", "y"):
        env.start_episode(eid)
        env.log_action(eid, {"a": o(1), "b": o(2)}, {"a": 0, "b": 1})
        env.log_returns(eid, {"a": 1.0, "b": 0.5}, {"a": {"k": 1}})
    env.log_returns("x", {"b": 2.0}, None, {"b": True})
    env.log_action("x", {"a": o(3), "b": o(4)}, {"a": 2})  # b's final observation
    delivered += drain(env)
    env.log_returns("x", {"a": 0.25})
    env.log_returns("y", {"a": 0.75})
    before = env.table_sizes()
    for call, match in hostile or ():
        with pytest.raises(InvalidDataError, match=match):
            call(env)
        assert env.table_sizes() == before
    env.log_action("x", {"a": o(5), "c": o(6)}, {"a": 0, "c": 1})
    env.log_returns("x", {"a": 1.0, "c": 3.0})
    env.end_episode("x", {"a": o(7)})
    env.end_episode("y", {"a": o(7), "b": o(8)}, truncated=True)  # b acted: it needs one too
    delivered += drain(env)
    assert env.table_sizes() == {**EMPTY_TABLES, "finished": 2}
    env.close()
    return [
        (
            {e: {a: v.tolist() for a, v in obs.items()} for e, obs in r.obs.items()},
            r.rewards,
            r.terminateds,
            r.truncateds,
            r.infos,
            r.off_policy_actions,
        )
        for r in delivered
    ]


HUGE = {f"agent{i}": o(0) for i in range(10_000)}
HOSTILE = [
    (lambda e: e.submit("x", {"zz": o(0)}, None, None, True), "unknown agent id 'zz'"),
    (lambda e: e.log_action("x", {"a": o(0), "zz": o(0)}, {"a": 0, "zz": 0}), "unknown agent"),
    (lambda e: e.log_action("x", {"a": o(0), "b": o(0)}, {"a": 0, "b": 0}), "are done"),
    (lambda e: e.end_episode("x", {"b": o(0)}), "are done"),
    (lambda e: e.log_action("x", {"a": o(0)}, {"a": 0, "c": 1}), "acting agents"),
    (lambda e: e.log_returns("x", {"a": 1.0}, None, {"zz": True}), "unknown agent"),
    (lambda e: e.log_returns("x", {"a": 1.0}, None, {"a": "yes"}), "must be a bool"),
    (lambda e: e.log_returns("x", {"a": 1.0}, None, {"a": np.ones(2)}), "must be a bool"),
    (lambda e: e.log_returns("x", {"c": 1.0}), "not observed yet"),
    (lambda e: e.log_returns("x", {"a": 1.0}, None, {"c": True}), "not observed yet"),
    (lambda e: e.log_returns("x", {"a": float("nan")}), "float32 range"),
    (lambda e: e.log_returns("x", {"a": 1.0, "zz" * 10_000: 1.0}), "unknown agent"),
    (lambda e: e.log_action("x", [o(0)], {"a": 0}), "must be a non-empty dict"),
    (lambda e: e.log_action("x", {}, {}), "must be a non-empty dict"),
    (lambda e: e.log_action("x", {"a": o(0)}, 0), "actions must be a dict"),
    (lambda e: e.log_action("x", {"a": o(0)}, {"a": 0}, info=["i"]), "info must be a dict"),
    (lambda e: e.log_returns("x", 1.0), "rewards must be a dict"),
    (lambda e: e.log_returns("x", {"a": 1.0}, ["info"]), "infos must be a dict"),
    (lambda e: e.log_returns("x", {"a": 1.0}, {"a": 5}), r"infos\['a'\] must be a dict"),
    (lambda e: e.log_returns("x", {"a": 1.0}, None, [True]), "done_dict must be a dict"),
    (lambda e: e.end_episode("x", "obs"), "must be a non-empty dict"),
    (lambda e: e.submit("x", HUGE, None, None, True), "10000 entries; there are only 3"),
    (lambda e: e.log_returns("x", dict.fromkeys(HUGE, 1.0)), "10000 entries"),
    (lambda e: e.log_returns("x", {}, dict.fromkeys(HUGE, {})), "10000 entries"),
    (lambda e: e.log_returns("x", {}, None, dict.fromkeys(HUGE, True)), "10000 entries"),
    (lambda e: e.log_action("x", {"a": o(0)}, {"a": 0, **dict.fromkeys(HUGE, 0)}), "acting"),
]


def test_multi_agent_hostile_input_is_refused_and_changes_nothing():
    reference = ma_scenario(None)
    assert ma_scenario(HOSTILE) == reference
    # The reference itself is what the calls mean: spot checks.
    x_final = [r for r in reference if "x" in r[0] and r[2]["x"][ALL_AGENTS]]
    ((obs, rew, term, trunc, _, _),) = x_final
    assert obs["x"] == {"a": [7.0, 7.0]} and rew["x"] == {"a": 1.0, "c": 3.0}
    y_final = [r for r in reference if "y" in r[0] and r[3]["y"][ALL_AGENTS]]
    assert y_final[0][1]["y"] == {"a": 1.0 + 0.75, "b": 0.5}  # y's own rewards only


def test_hostile_error_messages_stay_short():
    env = ExternalMultiAgentEnv(OBS, ACT, agent_ids=AGENTS)
    env.start_episode("x")
    for call in (
        lambda: env.log_returns("x", {"q" * 100_000: 1.0}),
        lambda: env.log_action("x", {"q" * 100_000: o(0)}, {}),
        lambda: env.log_returns("x", {"a": "9" * 100_000}),
    ):
        e = error_of(call)
        assert isinstance(e, InvalidDataError) and len(str(e)) < 300, str(e)[:300]
    env.close()


def test_abandoned_multi_agent_episode_repeats_only_agents_still_in_it():
    env = ExternalMultiAgentEnv(OBS, ACT, agent_ids=AGENTS, max_wait_s=0.0)
    env.start_episode("x")
    env.log_action("x", {"a": o(1), "b": o(2)}, {"a": 0, "b": 0})
    env.log_returns("x", {"a": 1.0, "b": 2.0}, None, {"b": True})
    env.log_action("x", {"a": o(3), "b": o(4)}, {"a": 1})  # b's final observation
    drain(env)
    env.log_returns("x", {"a": 5.0})
    env.abandon_episode("x", "gone")
    (r,) = drain(env)
    assert list(r.obs["x"]) == ["a"]  # b finished: it does not observe again
    assert r.obs["x"]["a"].tolist() == [3.0, 3.0] and r.rewards["x"] == {"a": 5.0}
    assert r.terminateds["x"] == {"a": False, ALL_AGENTS: False}
    assert r.truncateds["x"] == {"a": True, ALL_AGENTS: True}
    assert r.infos["x"]["a"]["abandoned"] is True
    # Truncating an episode in the step an agent terminates: that agent is not truncated.
    env.start_episode("y")
    env.log_action("y", {"a": o(1), "b": o(2)}, {"a": 0, "b": 0})
    env.log_returns("y", {"b": 1.0}, None, {"b": True})
    env.end_episode("y", {"a": o(3), "b": o(4)}, truncated=True)
    r = drain(env)[-1]
    assert r.terminateds["y"] == {"a": False, "b": True, ALL_AGENTS: False}
    assert r.truncateds["y"] == {"a": True, "b": False, ALL_AGENTS: True}
    env.close()
