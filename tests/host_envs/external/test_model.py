"""ExternalMultiAgentEnv against a plain Python model of what the poller must receive.

Hypothesis draws short random sequences of simulator calls (start / log_action /
get_action / log_returns with done dicts / end_episode / abandon) on a few episodes,
interleaved with polls; invalid calls (unknown agents, done agents, rewards before an
agent's first observation, overflowing reward sums, calls on finished episodes) are
drawn too. ``get_action`` is issued as ``submit(..., want_action=True)`` (what the
policy server does), so one thread drives everything: a poll op polls once and answers
every delivered step at once, as a sampler would.

The model says, per call, which exception (if any) the env must raise, and per episode
the exact steps a poll must deliver: observations, summed rewards, infos, per-agent and
``"__all__"`` terminated / truncated flags, off-policy actions; every step exactly once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxsampler import spaces
from jaxsampler.constants import ALL_AGENTS
from jaxsampler.host_envs.external import (
    EpisodeStateError,
    ExternalMultiAgentEnv,
    InvalidDataError,
    UnknownEpisodeError,
)

AGENTS = ("a", "b", "c")
BAD_AGENT = "zz"
N_ACT = 5
N_SLOTS = 3  # episodes running at once; a slot starts a new episode once its last ended


def policy(obs: np.ndarray) -> int:
    return int(obs[0]) % N_ACT


@dataclass
class Step:
    """One step as the model expects a poll to deliver it."""

    obs: dict
    rewards: dict
    infos: dict
    term: dict  # per observing agent
    all_term: bool = False
    all_trunc: bool = False
    offp: dict | None = None
    waiter: Any = None
    final: bool = False


@dataclass
class Ep:
    training: bool
    owner: str | None = None  # episodes of an owner are invisible to other owners
    state: str = "running"  # running / closed (ended or abandoned, final queued) / gone
    kind: str = ""  # "completed" / "abandoned" once closed
    queue: deque = field(default_factory=deque)
    seen: set = field(default_factory=set)
    done: set = field(default_factory=set)
    newly_done: set = field(default_factory=set)
    reward: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    last_obs: dict | None = None
    agent_obs: dict = field(default_factory=dict)  # each agent's latest observation
    waiter: Any = None  # a get_action request not yet answered


class Model:
    def __init__(self) -> None:
        self.eps: dict[str, Ep] = {}
        self.counter = 0

    def state_error(self, eid: str, caller: str | None) -> type | None:
        ep = self.eps.get(eid)
        if ep is None or not visible(ep, caller):
            return UnknownEpisodeError
        if ep.state != "running" or ep.waiter is not None:
            return EpisodeStateError
        return None

    def make_item(self, ep: Ep, obs: dict) -> Step:
        rewards = dict.fromkeys(obs, 0.0)
        rewards.update(ep.reward)
        ep.reward = {}
        infos = {a: ep.info.pop(a, {}) for a in obs}
        if not ep.training:
            infos = {a: {**i, "training_enabled": False} for a, i in infos.items()}
        term = {a: a in ep.newly_done for a in obs}
        ep.done |= ep.newly_done
        ep.newly_done = set()
        ep.seen |= set(obs)
        ep.last_obs = obs
        ep.agent_obs.update(obs)
        return Step(obs, rewards, infos, term)

    @staticmethod
    def waiting(ep: Ep, obs: dict) -> dict:
        """Agents that observed, are not done and have no observation in ``obs``: each
        acted and waits for its next one (a truncated end must give it)."""
        return {
            a: ep.agent_obs[a]
            for a in AGENTS
            if a in ep.agent_obs and a not in ep.done and a not in obs
        }

    def abandon(self, ep: Ep) -> None:
        if ep.waiter is not None:  # the unpolled request becomes the final observation
            step = ep.queue[-1]
            step.waiter, step.all_trunc, step.final = None, True, True
            for a, o in self.waiting(ep, step.obs).items():  # agents waiting since earlier
                step.obs[a], step.term[a] = o, False
                step.rewards.setdefault(a, 0.0)
                info = ep.info.pop(a, {})
                step.infos[a] = info if ep.training else {**info, "training_enabled": False}
            step.infos = {a: {**i, "abandoned": True} for a, i in step.infos.items()}
            ep.waiter = None
        elif ep.last_obs is not None:  # repeat the latest observation of agents not done
            obs = self.waiting(ep, {})
            step = self.make_item(ep, obs)
            step.all_trunc, step.final = True, True
            step.term = dict.fromkeys(obs, False)
            step.infos = {a: {**i, "abandoned": True} for a, i in step.infos.items()}
            ep.queue.append(step)
        else:  # never used: the sampler never hears of it
            ep.state, ep.kind = "gone", "abandoned"
            return
        ep.state, ep.kind = "closed", "abandoned"


def visible(ep: Ep, caller: str | None) -> bool:
    return caller is None or ep.owner is None or ep.owner == caller


# -- operations ----------------------------------------------------------------------------

_good_agents = st.lists(st.sampled_from(AGENTS), min_size=1, max_size=3, unique=True)
_any_agents = st.lists(st.sampled_from((*AGENTS, BAD_AGENT)), max_size=4, unique=True)
agent_sets = st.sampled_from((_good_agents,) * 3 + (_any_agents,)).flatmap(lambda s: s)
slots = st.integers(0, N_SLOTS - 1)
reward_values = st.sampled_from((1.0, -2.5, 4.0, 3e38, 3e38, -3e38, float("nan")))

poll_op = st.tuples(st.just("poll"))
log_action_op = st.tuples(
    st.just("log_action"), slots, agent_sets, st.integers(0, 4).map(lambda i: i == 0)
)
get_action_op = st.tuples(st.just("get_action"), slots, agent_sets)
log_returns_op = st.tuples(
    st.just("log_returns"),
    slots,
    st.lists(  # several calls in a row: sums of large rewards can overflow
        st.one_of(
            st.dictionaries(st.sampled_from(AGENTS), reward_values, min_size=1, max_size=2),
            st.dictionaries(st.sampled_from((*AGENTS, BAD_AGENT)), reward_values, max_size=4),
        ),
        min_size=1,
        max_size=3,
    ),
    st.lists(st.sampled_from(AGENTS), max_size=2, unique=True),
    st.one_of(
        st.lists(st.sampled_from(AGENTS), max_size=1),
        st.lists(st.sampled_from((*AGENTS, BAD_AGENT)), max_size=2, unique=True),
    ),
)
end_op = st.tuples(st.just("end"), slots, agent_sets, st.booleans())
start_op = st.tuples(
    st.just("start"), slots, st.booleans(), st.integers(0, 3).map(lambda i: i == 0)
)
abandon_op = st.tuples(st.just("abandon"), slots)
# Weighted: steps and polls are common, episode ends and (re)starts rarer.
_WEIGHTED = (poll_op,) * 3 + (log_action_op,) * 3 + (get_action_op,) * 2 + (log_returns_op,) * 3
# Each call is made by an owner (what the policy server passes) or by no one (in-process).
callers = st.sampled_from((None, None, "A", "B"))
ops = st.tuples(
    st.sampled_from(_WEIGHTED + (end_op, start_op, abandon_op)).flatmap(lambda op: op), callers
)


def expect_raises(kind: type | None, fn) -> Any:
    if kind is None:
        return fn()
    try:
        fn()
    except kind:
        return None
    except Exception as e:  # the wrong error
        raise AssertionError(f"expected {kind.__name__}, got {type(e).__name__}: {e}") from e
    raise AssertionError(f"expected {kind.__name__}, nothing raised")


class Driver:
    def __init__(self) -> None:
        self.env = ExternalMultiAgentEnv(
            spaces.Box(-1e6, 1e6, (1,)),
            spaces.Discrete(N_ACT),
            agent_ids=AGENTS,
            max_wait_s=0.0,
            episode_timeout_s=None,
        )
        self.m = Model()
        self.delivered = 0
        self.caller: str | None = None
        self.slots = [f"s{i}g0" for i in range(N_SLOTS)]
        self.generation = [0] * N_SLOTS
        for eid in self.slots:
            self.start(eid, True)

    def obs_for(self, agents: list) -> dict:
        out = {}
        for a in agents:
            self.m.counter += 1
            out[a] = np.array([self.m.counter], np.float32)
        return out

    # -- simulator calls ---------------------------------------------------------------

    def start(self, eid: str, training: bool) -> None:
        err = EpisodeStateError if eid in self.m.eps else None
        expect_raises(err, lambda: self.env.start_episode(eid, training, owner=self.caller))
        if err is None:
            self.m.eps[eid] = Ep(training, self.caller)

    def submit(self, eid: str, agents: list, want_action: bool, bad_actions: bool) -> None:
        m, env = self.m, self.env
        obs = self.obs_for(agents)
        ep = m.eps.get(eid)
        caller = self.caller
        bad_obs = not agents or BAD_AGENT in agents
        err = InvalidDataError if bad_obs else m.state_error(eid, caller)
        acting = [a for a in agents if ep is None or a not in ep.newly_done]
        if err is None:
            assert ep is not None
            if set(agents) & ep.done or ep.newly_done - set(agents):
                err = InvalidDataError
            elif not want_action and bad_actions:
                err = InvalidDataError  # an action for an agent that does not act
        action = None
        if not want_action:
            action = {a: policy(obs[a]) for a in acting}
            if bad_actions:
                action[BAD_AGENT] = 0
        result: dict = {}
        expect_raises(
            err,
            lambda: result.setdefault(
                "w", env.submit(eid, obs, action, None, want_action=want_action, owner=caller)
            ),
        )
        if err is None:
            assert ep is not None
            step = m.make_item(ep, obs)
            step.offp = action
            if want_action:
                step.waiter = ep.waiter = result["w"]
                assert step.waiter is not None and not step.waiter.done
            ep.queue.append(step)

    def log_returns(self, eid: str, rewards: dict, info_agents: list, dones: list) -> None:
        m = self.m
        bad_value = any(not abs(r) <= 3.5e38 for r in rewards.values())
        err = (
            InvalidDataError
            if BAD_AGENT in rewards or BAD_AGENT in dones or bad_value
            else m.state_error(eid, self.caller)
        )
        ep = m.eps.get(eid)
        if err is None:
            assert ep is not None
            touched = {*rewards, *info_agents, *dones}
            if touched & ep.done:
                err = EpisodeStateError
            elif ({*rewards} | set(dones)) - ep.seen:
                err = InvalidDataError  # before the agent's first observation
            elif any(not abs(ep.reward.get(a, 0.0) + r) <= 3.4e38 for a, r in rewards.items()):
                err = InvalidDataError  # the summed reward would overflow float32
        infos = {a: {"n": i} for i, a in enumerate(info_agents)} or None
        done_dict = dict.fromkeys(dones, True) or None
        if self.caller is None:  # the public method
            call = lambda: self.env.log_returns(eid, rewards, infos, done_dict)
        else:  # what the policy server calls
            call = lambda: self.env.log_agent_returns(
                eid, rewards, infos, done_dict, owner=self.caller
            )
        expect_raises(err, call)
        if err is None:
            assert ep is not None
            for a, r in rewards.items():
                ep.reward[a] = ep.reward.get(a, 0.0) + r
            ep.info.update(infos or {})
            ep.newly_done |= set(dones)

    def end(self, eid: str, agents: list, truncated: bool) -> None:
        m = self.m
        obs = self.obs_for(agents)
        err = InvalidDataError if BAD_AGENT in agents else m.state_error(eid, self.caller)
        ep = m.eps.get(eid)
        if err is None and set(agents) & ep.done:  # type: ignore[union-attr]
            err = InvalidDataError
        if err is None and truncated and m.waiting(ep, obs):  # type: ignore[arg-type]
            err = InvalidDataError  # a waiting agent's final observation is missing
        if self.caller is None:
            call = lambda: self.env.end_episode(eid, obs, truncated=truncated)
        else:
            call = lambda: self.env.end_agent_episode(eid, obs, truncated, owner=self.caller)
        expect_raises(err, call)
        if err is None:
            assert ep is not None
            step = m.make_item(ep, obs)
            step.final = True
            if truncated:
                step.all_trunc = True
            else:
                step.all_term = True
                step.term = dict.fromkeys(obs, True)
            ep.queue.append(step)
            ep.state, ep.kind = "closed", "completed"

    def abandon(self, eid: str) -> None:
        ep = self.m.eps.get(eid)
        waiter = None if ep is None else ep.waiter
        running = ep is not None and ep.state == "running"
        if (ep is None and self.caller is not None) or (
            ep is not None and not visible(ep, self.caller)
        ):  # unknown to this owner
            expect_raises(
                UnknownEpisodeError, lambda: self.env.abandon_episode(eid, "test", self.caller)
            )
            return
        assert self.env.abandon_episode(eid, "test", self.caller) is running
        if running:
            assert ep is not None
            self.m.abandon(ep)
            if waiter is not None:
                assert waiter.done and isinstance(waiter.error, EpisodeStateError)

    # -- sampler side ------------------------------------------------------------------

    def poll(self) -> None:
        m, env = self.m, self.env
        r = env.poll(timeout=0)
        expected = {eid: ep for eid, ep in m.eps.items() if ep.queue}
        assert set(r.obs) == set(expected), (set(r.obs), set(expected))
        answers = {}
        waiters = []
        for eid, ep in expected.items():
            step = ep.queue.popleft()
            self.delivered += 1
            assert set(r.obs[eid]) == set(step.obs)
            for a, o in step.obs.items():
                np.testing.assert_array_equal(r.obs[eid][a], o)
            assert r.rewards[eid] == step.rewards
            assert r.infos[eid] == step.infos
            assert r.terminateds[eid] == {**step.term, ALL_AGENTS: step.all_term}
            trunc = {a: step.all_trunc and not t for a, t in step.term.items()}
            assert r.truncateds[eid] == {**trunc, ALL_AGENTS: step.all_trunc}
            assert r.off_policy_actions.get(eid) == step.offp
            if step.final:
                ep.state = "gone"
                continue
            acting = [a for a, t in step.term.items() if not t]
            if not acting:  # nothing to answer: a get_action gets {} at once
                if step.waiter is not None:
                    assert step.waiter.done and step.waiter.value == {}
                    ep.waiter = None
                continue
            answers[eid] = {a: policy(r.obs[eid][a]) for a in acting}
            if step.waiter is not None:
                waiters.append((ep, step.waiter, answers[eid]))
        env.send_actions(answers)
        for ep, w, acts in waiters:
            assert w.done and w.error is None and w.value == acts
            ep.waiter = None

    def check_status(self) -> None:
        for eid in self.m.eps:
            ep = self.m.eps.get(eid)
            want = (
                "unknown"
                if ep is None
                else {"running": "running", "closed": "finishing", "gone": ep.kind}[ep.state]
            )
            assert self.env.episode_status(eid) == want, eid

    def run(self, op_and_caller: tuple) -> None:
        op, self.caller = op_and_caller
        name, *args = op
        if args:
            slot, args[0] = args[0], self.slots[args[0]]
        if name == "start":
            eid, training, reuse = args
            if not reuse and self.m.eps[eid].state != "running":  # the slot's next episode
                self.generation[slot] += 1
                eid = self.slots[slot] = f"s{slot}g{self.generation[slot]}"
            self.start(eid, training)
        elif name == "log_action":
            self.submit(args[0], args[1], False, args[2])
        elif name == "get_action":
            self.submit(args[0], args[1], True, False)
        elif name == "log_returns":
            eid, calls, info_agents, dones = args
            ep = self.m.eps.get(eid)
            if ep is not None and ep.seen and calls[0] and set(calls[0]) <= set(AGENTS):
                # mostly rewards for agents that did observe (else most calls would fail)
                calls = [{a: r for a, r in c.items() if a in ep.seen} or c for c in calls]
            for i, rewards in enumerate(calls):
                last = i == len(calls) - 1
                self.log_returns(eid, rewards, info_agents if last else [], dones if last else [])
        elif name == "end":
            self.end(*args)
        elif name == "abandon":
            self.abandon(*args)
        else:
            self.poll()
        self.check_status()


@settings(max_examples=50, deadline=None)
@given(st.lists(ops, min_size=20, max_size=45))
def test_external_multi_agent_env_matches_model(sequence):
    d = Driver()
    for op in sequence:
        d.run(op)
    # Wind down: abandon what runs, drain every queued step, leave no state behind.
    d.caller = None
    for eid in d.slots:
        d.abandon(eid)
    while any(ep.queue for ep in d.m.eps.values()):
        d.poll()
    d.check_status()
    assert d.env.poll(timeout=0).obs == {}
    sizes = d.env.table_sizes()
    assert sizes["finished"] == len(d.m.eps)
    assert {k: v for k, v in sizes.items() if k != "finished"} == dict.fromkeys(
        ("episodes", "owners", "ready", "idle", "offp_in_flight"), 0
    )
    d.env.close()
