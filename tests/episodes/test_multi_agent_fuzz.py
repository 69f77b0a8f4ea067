"""Property tests: random multi-agent episode operations vs a plain Python model.

The multi-agent version of ``tests/episodes/test_single_agent_model.py``. Hypothesis draws
sequences of
env steps in which agents join late, observe out of lockstep, hang (acted, no next
observation yet: their rewards are summed until it comes), terminate or get truncated
with their next observation, terminate while hanging (the last observation is repeated,
RLlib's rule), and of ``cut(n)`` calls. The env contract the generator keeps (RLlib's):
an agent that receives an observation acts at the next env step, rewards go to agents
that acted at this step or are hanging, and a done agent gets nothing more.

The model keeps the whole episode as plain lists per agent (every observation with the
env step it came at, every action, every summed reward) and answers, for the current
chunk, with RLlib's rules written out directly: per-agent steps of the chunk, env-step
getters by index (with ``neg_index_as_lookback`` into the chunk's lookback, whose size
``cut(n)`` raises for every hanging agent to its latest observation at least ``n`` env
steps back, as RLlib's does, and which cannot reach past the previous chunk's own
lookback), agents to act, returns, done flags. At the end the chunks concatenated back
(``concat_episode``) equal the never-cut episode.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from jaxsampler.episodes import MultiAgentEpisode

AGENTS = ("a0", "a1", "a2")


class AgentModel:
    def __init__(self) -> None:
        self.obs: list[int] = []  # every observation of the agent
        self.obs_env_t: list[int] = []  # the env step each observation came at
        self.actions: list[int] = []  # action k was taken on observation k
        self.rewards: list[float] = []  # summed reward of agent step k (completed steps)
        self.hanging_reward = 0.0
        self.terminated = self.truncated = False

    @property
    def state(self) -> str:
        if not self.obs:
            return "absent"
        if self.terminated or self.truncated:
            return "done"
        return "hanging" if len(self.actions) == len(self.obs) else "ready"


class Model:
    """The whole episode in plain lists, plus the current chunk's start and lookback."""

    def __init__(self) -> None:
        self.agents = {a: AgentModel() for a in AGENTS}
        self.env_t = 0
        self.env_t_started, self.lookback = 0, 0
        self.chunk_agents: set[str] = set()
        self.agent_t_started: dict[str, int] = {}
        self.known_before: set[str] = set()  # agents with an observation before the last step
        self.joined_now = False  # an agent joined in the last step (the episode goes on)

    def join(self, a: str, obs: int) -> None:
        m = self.agents[a]
        m.obs.append(obs)
        m.obs_env_t.append(self.env_t)
        self.chunk_agents.add(a)
        self.agent_t_started.setdefault(a, 0)

    @property
    def is_done(self) -> bool:
        # RLlib's rule: every agent known *before* the last step is done after it (an
        # agent joining in that step does not keep the episode going)
        joined = [m for a, m in self.agents.items() if a in self.known_before]
        return bool(joined) and not self.joined_now and all(m.state == "done" for m in joined)

    def cut(self, n: int) -> None:
        # RLlib's rule: a hanging agent's latest observation at least max(n, 1) env steps
        # back (counting the current one as 1) and still in the chunk's maps sets the
        # lookback; one nearer the end does not count (RLlib deviation 4 aside: n == 0
        # searches as 1 does)
        need = n
        first = self.env_t_started - self.lookback
        for m in self.agents.values():
            if m.state == "hanging":
                old = [E for E in m.obs_env_t if first <= E <= self.env_t + 1 - max(n, 1)]
                if old:
                    need = max(need, self.env_t - old[-1])
        self.lookback = min(need, self.env_t - first)
        self.env_t_started = self.env_t
        self.chunk_agents = {a for a, m in self.agents.items() if m.state in ("ready", "hanging")}
        # completed steps so far (a hanging agent's step completes in the new chunk)
        self.agent_t_started = {a: len(self.agents[a].rewards) for a in self.chunk_agents}

    # -- answers --------------------------------------------------------------------------

    def agent_steps(self, a: str) -> tuple[int, list, list, list]:
        m, t0 = self.agents[a], self.agent_t_started[a]
        t = len(m.rewards)
        return t0, m.obs[t0 : t + 1], m.actions[t0:t], m.rewards[t0:t]

    def obs_at(self, E: int) -> dict:
        out = {}
        for a in self.chunk_agents:
            m = self.agents[a]
            if E in m.obs_env_t:
                out[a] = m.obs[m.obs_env_t.index(E)]
        return out

    def act_at(self, E: int) -> dict:
        out = {}
        for a in self.chunk_agents:
            m = self.agents[a]
            if E in m.obs_env_t:
                k = m.obs_env_t.index(E)
                if k < len(m.actions):
                    out[a] = m.actions[k]
        return out

    def reward_at(self, E: int) -> dict:
        out = {}
        for a in self.chunk_agents:
            m = self.agents[a]
            if E in m.obs_env_t:
                k = m.obs_env_t.index(E)
                if k < len(m.rewards):
                    out[a] = m.rewards[k]
                elif k < len(m.actions):
                    out[a] = m.hanging_reward
        return out

    def env_step(self, i: int, nial: bool, per_obs: bool) -> int | None:
        """The absolute env step of env-step index ``i`` in the current chunk (observations:
        ``len + 1`` items, actions / rewards: ``len``), ``None`` when out of range."""
        n_items = self.env_t - self.env_t_started + self.lookback + (1 if per_obs else 0)
        pos = self.lookback + i if (i >= 0 or nial) else n_items + i
        if not 0 <= pos < n_items:
            return None
        return self.env_t_started - self.lookback + pos


# -- the operation sequences ---------------------------------------------------------------

step_plan = st.fixed_dictionaries(
    {
        # per agent: what it does at this step, read according to its state
        "choice": st.tuples(*[st.integers(0, 9) for _ in AGENTS]),
        "reward": st.tuples(*[st.integers(-3, 3) for _ in AGENTS]),
    }
)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("step"), step_plan),
        st.tuples(st.just("step"), step_plan),
        st.tuples(st.just("cut"), st.integers(0, 3)),
        st.tuples(st.just("get")),
    ),
    max_size=30,
)


def apply_step(ep_list: list, model: Model, plan: dict, counter: list) -> bool:
    """Builds one ``add_env_step`` from ``plan`` for the model's agent states, applies it to
    every episode in ``ep_list`` and to the model. Returns False when nothing can happen."""
    obs, actions, rewards, terms, truncs = {}, {}, {}, {}, {}
    finish_hanging = []
    model.env_t += 1
    model.known_before = {a for a, m in model.agents.items() if m.obs}
    for a, c, r in zip(AGENTS, plan["choice"], plan["reward"], strict=True):
        m = model.agents[a]
        counter[0] += 1
        o = 1000 * AGENTS.index(a) + counter[0]
        state = m.state
        if state == "absent":
            if c < 4:
                obs[a] = o
        elif state == "ready":  # must act now
            actions[a] = counter[0] % 5
            rewards[a] = float(r)
            if c < 5:
                obs[a] = o
                if c == 0:
                    terms[a] = True
                elif c == 1:
                    truncs[a] = True
        elif state == "hanging":
            rewards[a] = float(r)
            if c < 4:
                obs[a] = o
                if c == 0:
                    terms[a] = True
                elif c == 1:
                    truncs[a] = True
            elif c == 9:
                terms[a] = True
                finish_hanging.append(a)
                event("hanging agent terminated without an observation")
    for ep in ep_list:
        ep.add_env_step(obs, actions, rewards, terminateds=terms, truncateds=truncs)
    joined = []
    was_done = {a for a, m in model.agents.items() if m.state == "done"}
    for a in AGENTS:
        m = model.agents[a]
        state = m.state
        if state == "absent" and a in obs:
            model.join(a, obs[a])
            joined.append(a)
            continue
        if state == "ready":
            m.actions.append(actions[a])
            m.hanging_reward = rewards[a]
        elif state == "hanging":
            m.hanging_reward += rewards[a]
        else:
            continue
        if a in obs or a in finish_hanging:
            m.rewards.append(m.hanging_reward)
            m.hanging_reward = 0.0
            m.obs.append(obs[a] if a in obs else m.obs[-1])
            # a re-recorded final observation (terminated without one) has no env step
            m.obs_env_t.append(model.env_t if a in obs else -1)
            m.terminated, m.truncated = a in terms, a in truncs
    model.joined_now = bool(joined)
    if model.is_done:  # RLlib: the episode's terminated flag goes to every agent stepped
        stepped = set(obs) | set(actions) | set(rewards) | set(terms) | set(truncs)
        for a in stepped - was_done:
            model.agents[a].terminated = True
    return True


def as_list(x) -> list:
    return np.asarray(x).tolist() if isinstance(x, np.ndarray) else list(x)


def check(ep: MultiAgentEpisode, model: Model) -> None:
    assert len(ep) == model.env_t - model.env_t_started
    assert (ep.env_t, ep.env_t_started) == (model.env_t, model.env_t_started)
    assert set(ep.agent_episodes) == model.chunk_agents
    total_steps, ret = 0, 0.0
    for a in model.chunk_agents:
        sa, m = ep.agent_episodes[a], model.agents[a]
        t0, obs, acts, rews = model.agent_steps(a)
        assert (sa.t_started, len(sa)) == (t0, len(acts)), (a, sa.t_started, len(sa), t0)
        assert as_list(sa.get_observations()) == obs, a
        assert as_list(sa.get_actions()) == acts, a
        assert as_list(sa.get_rewards()) == rews, a
        assert (sa.is_terminated, sa.is_truncated) == (m.terminated, m.truncated), a
        total_steps += len(acts)
        ret += sum(rews)
    assert ep.agent_steps() == total_steps
    assert ep.get_return() == ret
    stepped = {a for a in model.chunk_agents if model.agents[a].obs_env_t[-1] == model.env_t}
    assert ep.get_agents_that_stepped() == stepped
    assert ep.get_agents_to_act() == {a for a in stepped if model.agents[a].state == "ready"}
    terms = ep.get_terminateds()
    assert {a: v for a, v in terms.items() if a != "__all__"} == {
        a: model.agents[a].terminated for a in model.chunk_agents
    }
    assert ep.is_done == model.is_done


def check_getter(ep: MultiAgentEpisode, model: Model, i: int, nial: bool) -> None:
    for what, per_obs, getter, want_fn in (
        ("obs", True, ep.get_observations, model.obs_at),
        ("act", False, ep.get_actions, model.act_at),
        ("rew", False, ep.get_rewards, model.reward_at),
    ):
        E = model.env_step(i, nial, per_obs)
        if E is None:  # outside the chunk and its lookback
            with pytest.raises(IndexError):
                getter(i, neg_index_as_lookback=nial)
            continue
        if model.env_t_started > E:
            event(f"{what} getter in the lookback")
        got = getter(i, neg_index_as_lookback=nial)
        got = {a: float(np.asarray(v)) for a, v in got.items()}
        want = {a: float(v) for a, v in want_fn(E).items()}
        assert got == want, (what, i, nial, E, got, want)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=st.sets(st.sampled_from(AGENTS), min_size=1), operations=ops)
def test_multi_agent_episode_matches_plain_model(first, operations):
    model = Model()
    full = MultiAgentEpisode("ma")  # never cut: the reference for concat
    ep = MultiAgentEpisode("ma")
    counter = [0]
    reset = {a: 1000 * AGENTS.index(a) for a in sorted(first)}
    for e in (full, ep):
        e.add_env_reset(observations=reset)
    for a in sorted(first):
        model.join(a, reset[a])
    chunks = [ep]
    for op in operations:
        if model.is_done:
            break
        if op[0] == "step":
            apply_step([full, ep], model, op[1], counter)
        elif op[0] == "cut":
            if any(m.state == "hanging" for m in model.agents.values()):
                event("cut with a hanging agent")
            ep = ep.cut(len_lookback_buffer=op[1])
            model.cut(op[1])
            chunks.append(ep)
        else:  # every env-step index of the chunk, lookback included
            n = len(ep) + model.lookback + 1
            for i in range(-n, n):
                for nial in (False, True):
                    check_getter(ep, model, i, nial)
        check(ep, model)
    # The chunks concatenated back give the never-cut episode.
    head = copy.deepcopy(chunks[0])
    for c in chunks[1:]:
        head.concat_episode(c)
    for a, sa in full.agent_episodes.items():
        h = head.agent_episodes[a]
        assert (h.t_started, h.t) == (sa.t_started, sa.t), a
        assert as_list(h.get_observations()) == as_list(sa.get_observations()), a
        assert as_list(h.get_actions()) == as_list(sa.get_actions()), a
        assert as_list(h.get_rewards()) == as_list(sa.get_rewards()), a
    assert set(head.agent_episodes) == set(full.agent_episodes)
    assert head.get_return() == full.get_return()
    assert head.env_t_to_agent_t.keys() == full.env_t_to_agent_t.keys()
