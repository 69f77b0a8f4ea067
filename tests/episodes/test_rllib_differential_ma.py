"""jaxsampler's ``MultiAgentEpisode`` against RLlib 2.60's own, on the same random calls.

Random programs (``tests/ma_differential.py``: joins with rewards before the first
observation, hanging agents, agents terminated without a final observation, truncation,
``__all__``, ``cut`` with lookback, numpy'ization, getters with env steps and agent steps,
int/list/slice indices, ``neg_index_as_lookback``, ``fill``, ``return_list``, agent
subsets) run on both classes; every result must be equal, except where a call falls under
one of the RLlib bugs noted as "RLlib deviation (n)" in ``jaxsampler/episodes/``.
The unit tests below pin each behaviour fixed to RLlib's, one by one.
"""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from jaxsampler.episodes.multi_agent import MultiAgentEpisode
from tests.ma_differential import Program, normalize

rllib_ma = pytest.importorskip(
    "ray.rllib.env.multi_agent_episode",
    reason="ray[rllib] is not installed (pip install -e '.[rllib]'): no RLlib to compare with",
)
warnings.filterwarnings("ignore", module="ray")
RLlibEpisode = rllib_ma.MultiAgentEpisode


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
@example(seed=3271972174)  # cut(3) of a cut chunk whose hanging agent observed 2 steps back
def test_random_programs_give_rllibs_results(seed):
    p = Program(seed, RLlibEpisode, MultiAgentEpisode).run()
    assert p.counts["calls"] > 10
    assert not p.mismatches, "\n".join(
        f"{lbl}\n  rllib: {r}\n  ours:  {g}" for lbl, r, g in p.mismatches[:3]
    )


def both(build):
    """``build(cls)`` for RLlib's class and ours."""
    return build(RLlibEpisode), build(MultiAgentEpisode)


def same(f, ref, got):
    assert normalize(f(ref)) == normalize(f(got))


def test_rewards_before_the_first_observation_as_rllibs_list_constructor():
    """An agent named in agent_episode_ids gets the rewards it received before its first
    observation added to its first step's reward (0.5 + 1.0 = 1.5); others' are dropped."""

    def build(cls, ids):
        return cls(
            observations=[{"a": 0}, {"a": 1, "b": 10}, {"a": 2, "b": 11}],
            actions=[{"a": 0}, {"a": 1, "b": 5}],
            rewards=[{"a": 1.0, "b": 0.5}, {"a": 1.0, "b": 1.0}],
            len_lookback_buffer=0,
            agent_episode_ids=ids,
        )

    for ids in (None, {"a": "x", "b": "y"}):
        ref, got = both(lambda cls, ids=ids: build(cls, ids))
        same(lambda ep: {a: list(s.rewards.data) for a, s in ep.agent_episodes.items()}, ref, got)
        same(lambda ep: ep.get_return(include_hanging_rewards=True), ref, got)
        same(lambda ep: dict(ep._hanging_rewards_begin), ref, got)
    assert list(got.agent_episodes["b"].rewards.data) == [1.5]


def test_an_agent_terminated_without_observation_is_at_no_env_step():
    """RLlib re-records the agent's last observation as its final one and does not map it
    to the env step where the agent terminated (positive env-step indices leave it out)."""

    def build(cls):
        ep = cls()
        ep.add_env_reset(observations={"a": 0, "b": 100})
        ep.add_env_step({"a": 1, "b": 101}, {"a": 0, "b": 10}, {"a": 1.0, "b": 1.0})
        ep.add_env_step({"a": 2}, {"a": 1, "b": 11}, {"a": 1.0, "b": 2.0}, terminateds={"b": True})
        return ep

    ref, got = both(build)
    assert got.get_observations(2) == {"a": 2}
    for f in (
        lambda ep: ep.get_observations(2),
        lambda ep: ep.get_observations(2, fill=-1),
        lambda ep: ep.get_infos(2, fill=-1),
        lambda ep: ep.get_actions(1),
        lambda ep: ep.get_rewards(),
        lambda ep: ep.get_observations(env_steps=False),
        lambda ep: ep.get_terminateds(),
        lambda ep: ep.get_agents_to_act(),
    ):
        same(f, ref, got)
    # (bug 9: RLlib's map of b is one entry too long; get_observations(-1) shows b there)
    assert got.env_t_to_agent_t["b"].data == [0, 1, "S"]
    assert len(ref.env_t_to_agent_t["b"].data) == 4


def test_agent_t_started_and_agent_step_getters_leave_out_agents_without_data():
    def build(cls):
        ep = cls()
        ep.add_env_reset(observations={"a": 0, "b": 100})
        ep.add_env_step({"a": 1}, {"a": 0, "b": 10}, {"a": 1.0})  # b hangs: not started
        return ep

    ref, got = both(build)
    assert dict(got.agent_t_started) == {"a": 0}
    same(lambda ep: dict(ep.agent_t_started), ref, got)  # (before any getter: RLlib's
    # getters add keys to its defaultdict)
    for f in (
        lambda ep: ep.get_rewards(env_steps=False),
        lambda ep: ep.get_actions(slice(0, 1), env_steps=False, agent_ids="a"),
        lambda ep: ep.get_infos(slice(1, 1), env_steps=False),
        lambda ep: ep.get_observations([0, 1], return_list=True),
        lambda ep: ep.get_observations(0, agent_ids=[]),
    ):
        same(f, ref, got)
    assert got.get_rewards(env_steps=False) == {"a": [1.0]}


def test_episode_end_and_flags_follow_rllibs_add_env_step():
    """Every known agent done (by its own flags, truncated ones included) ends the episode
    terminated, and the episode's flags are OR'ed into each agent stepped there."""
    for term, trunc in (
        ({"a": True}, {"b": True, "__all__": True}),
        ({}, {"a": True, "b": True}),
        ({"__all__": False}, {"a": True, "__all__": True}),
    ):

        def build(cls, term=term, trunc=trunc):
            ep = cls()
            ep.add_env_reset(observations={"a": 0, "b": 100, "c": 200})
            ep.add_env_step(
                {"a": 1, "b": 101},
                {"a": 0, "b": 10, "c": 20},
                {"a": 1.0, "b": 1.0, "c": 0.0},
                terminateds={"c": True},
            )
            ep.add_env_step(
                {"a": 2, "b": 102},
                {"a": 1, "b": 11},
                {"a": 1.0, "b": 1.0},
                terminateds=dict(term),
                truncateds=dict(trunc),
            )
            return ep

        ref, got = both(build)
        same(lambda ep: (ep.is_terminated, ep.is_truncated), ref, got)
        same(
            lambda ep: {a: (s.is_terminated, s.is_truncated) for a, s in ep.agent_episodes.items()},
            ref,
            got,
        )


def test_a_done_agents_rewards_before_joining_are_dropped():
    def build(cls):
        ep = cls()
        ep.add_env_reset(observations={"a": 0})
        ep.add_env_step({"a": 1}, {"a": 0}, {"a": 1.0, "b": 0.5})
        ep.add_env_step({"a": 2, "b": 10}, {"a": 1}, {"a": 1.0})
        ep.add_env_step(
            {"a": 3, "b": 11}, {"a": 2, "b": 5}, {"a": 1.0, "b": 1.0}, terminateds={"__all__": True}
        )
        return ep

    ref, got = both(build)
    same(lambda ep: ep.get_return(include_hanging_rewards=True), ref, got)
    assert got.get_return(include_hanging_rewards=True) == pytest.approx(4.0)
    assert np.isclose(got.get_return(), 4.0)


def _hanging_chunk(cls, seen, cut_first):
    """A chunk where agent "b" acts every env step and "h" observes at the env steps that
    ``seen`` marks (and hangs at the others, the last one included); ``cut_first``: it is
    the successor of a ``cut(1)`` two env steps in, so lookback data precede it."""
    ep = cls()
    ep.add_env_reset(observations={"b": 0, "h": 100})
    hanging = False
    for t, obs_h in enumerate(seen, 1):
        obs, act, rew = {"b": t}, {"b": 10 + t}, {"b": 1.0}
        if not hanging:
            act["h"] = 110 + t
        if obs_h:
            obs["h"], rew["h"] = 100 + t, 0.5
        ep.add_env_step(obs, act, rew, infos={"h": {"t": t}} if obs_h else {})
        hanging = not obs_h
        if cut_first and t == 2:
            ep = ep.cut(1)
    return ep


@pytest.mark.parametrize("cut_first", [False, True])
@pytest.mark.parametrize(
    "seen", [(0, 0, 1, 0), (1, 0, 0, 1, 0, 0), (1, 1, 0), (0, 1, 0), (1, 0, 1, 1, 0)]
)
def test_cut_raises_the_lookback_for_a_hanging_agent_as_rllibs(seen, cut_first):
    """A hanging agent's observation within the last ``lb - 1`` env steps does not stop
    ``cut(lb)`` from reaching back to an earlier one (the seed 3271972174 case): every
    requested lookback that the data holds gives RLlib's successor (lookback length,
    maps, per-agent lookback, getters)."""
    n_data = len(seen) - (1 if cut_first else 0)  # env steps in the maps, less one
    for lb in range(1, n_data + 1):  # (0: RLlib deviation 4; more: deviation 16)
        ref, got = both(lambda cls, lb=lb: _hanging_chunk(cls, seen, cut_first).cut(lb))
        assert got._len_lookback_buffers == ref._len_lookback_buffers, lb
        same(
            lambda ep: {a: (list(m.data), m.lookback) for a, m in ep.env_t_to_agent_t.items()},
            ref,
            got,
        )
        same(
            lambda ep: {
                a: (s.t_started, s.observations.lookback, s.rewards.lookback)
                for a, s in ep.agent_episodes.items()
            },
            ref,
            got,
        )
        for f in (
            lambda ep: ep.get_observations(slice(-3, None), env_steps=False),
            lambda ep: ep.get_infos(slice(-2, None), env_steps=False),
            lambda ep: ep.get_actions(slice(-2, None), env_steps=False, agent_ids="b"),
            lambda ep: ep.get_observations(-1, neg_index_as_lookback=True),
            lambda ep: dict(ep._hanging_actions_end),
        ):
            same(f, ref, got)


# ---------------------------------------------------------------------------------------
# The behaviours a differential battery reported as differences (issue 29 item 3) that are
# RLlib 2.60 bugs jaxsampler documents and does not copy: each test makes the same calls on
# both classes and pins the difference to exactly the documented bug.


def _hanging_at_cut(cls, lb):
    """``b`` hangs at the cut with 2.0 collected; the successor steps on, ``b`` completes."""
    ep = cls()
    ep.add_env_reset(observations={"a": 0, "b": 100})
    ep.add_env_step({"a": 1, "b": 101}, {"a": 0, "b": 10}, {"a": 1.0, "b": 1.0})
    ep.add_env_step({"a": 2}, {"a": 1, "b": 11}, {"a": 1.0, "b": 2.0})
    pred = ep
    succ = ep.cut(lb)
    steps = [
        ({"a": 3}, {"a": 2}, {"a": 1.0, "b": 0.5}),
        ({"a": 4, "b": 104}, {"a": 3}, {"a": 1.0, "b": 0.25}),
        ({"a": 5, "b": 105}, {"a": 4, "b": 12}, {"a": 1.0, "b": 1.0}),
    ]
    return pred, succ, steps


@pytest.mark.parametrize("lb", [1, 2])
def test_a_cut_successor_counts_hanging_rewards_once(lb):
    """RLlib deviation (5), issue item (a): after ``cut``, ``get_return(True)`` is what
    the whole episode received minus what the predecessor completed (an independent
    reference: the same steps on an uncut episode); RLlib's exceeds that by exactly the
    rewards hanging at the cut (its successor copies them into its begin cache while
    they also stay hanging) until the agent is done."""
    for cls in (RLlibEpisode, MultiAgentEpisode):
        pred, succ, steps = _hanging_at_cut(cls, lb)
        whole, _, _ = _hanging_at_cut(cls, lb)
        pred_done = pred.get_return()
        copied = sum(pred._hanging_rewards_end.values())
        assert copied == 2.0
        for obs, act, rew in [(None, None, None), *steps]:
            if obs is not None:
                succ.add_env_step(obs, act, rew)
                whole.add_env_step(obs, act, rew)
            expected = whole.get_return(include_hanging_rewards=True) - pred_done
            got = succ.get_return(include_hanging_rewards=True)
            if cls is MultiAgentEpisode:
                assert got == pytest.approx(expected)
            else:  # RLlib's double count
                assert got == pytest.approx(expected + copied)
            assert succ.get_return() == pytest.approx(whole.get_return() - pred_done)


def test_an_index_past_the_lookback_raises_as_rllibs_list_mode():
    """RLlib deviation (B1), issue item (b): ``get_observations(i,
    neg_index_as_lookback=True, env_steps=False)`` reaching past an agent's lookback
    raises ``IndexError`` as RLlib's list-mode buffers do; RLlib's numpy'ized buffers take
    a fast path that skips the range check and return an item from the end instead."""

    def build(cls, numpy):
        ep = cls()
        ep.add_env_reset(observations={"a": 0, "b": 100})
        ep.add_env_step({"a": 1, "b": 101}, {"a": 0, "b": 10}, {"a": 1.0, "b": 1.0})
        ep.add_env_step({"a": 2, "b": 102}, {"a": 1, "b": 11}, {"a": 1.0, "b": 1.0})
        ep = ep.cut(1)  # one lookback observation per agent
        ep.add_env_step({"a": 3, "b": 103}, {"a": 2, "b": 12}, {"a": 1.0, "b": 1.0})
        return ep.to_numpy() if numpy else ep

    past = lambda ep: ep.get_observations(-2, neg_index_as_lookback=True, env_steps=False)
    inside = lambda ep: ep.get_observations(-1, neg_index_as_lookback=True, env_steps=False)
    for numpy in (False, True):
        ref, got = both(lambda cls, numpy=numpy: build(cls, numpy))
        same(inside, ref, got)  # the lookback observation itself: equal
        with pytest.raises(IndexError):
            past(got)
    with pytest.raises(IndexError):  # RLlib's list mode: the same error
        past(build(RLlibEpisode, False))
    wrapped = past(build(RLlibEpisode, True))  # RLlib's numpy'ized fast path wraps around
    assert wrapped == {"a": 3, "b": 103}


@pytest.mark.parametrize("hang", [False, True])
def test_an_agent_terminated_without_observation_is_mapped_as_rllibs_positive_indices(hang):
    """RLlib deviation (9), issue items (c) and (d): ``b`` acts and is terminated without
    a final observation (RLlib re-records its last one). RLlib maps that observation one
    entry past the end of ``b``'s env-step map, so its *negative* env-step indices are
    shifted by one for ``b`` (``get_observations(-1)`` / ``get_infos(-1)`` show ``b``,
    ``get_actions(-1)`` / ``get_extra_model_outputs(None, -1)`` / ``get_rewards(-1)`` leave
    out ``b``'s last action) while its *positive* indices are not. Ours: every index, negative
    or positive, gives what RLlib's positive index of the same env step gives."""

    def build(cls):
        ep = cls()
        ep.add_env_reset(observations={"a": 0, "b": 100}, infos={"b": {"r": 1}})
        x = {"a": {"vf": 0.1}, "b": {"vf": 0.2}}
        if hang:
            ep.add_env_step(
                {"a": 1}, {"a": 0, "b": 10}, {"a": 1.0, "b": 1.0}, extra_model_outputs=x
            )
            last = ({"a": 2}, {"a": 1}, {"a": 1.0, "b": 2.0}, {"a": {"vf": 0.3}})
        else:
            ep.add_env_step(
                {"a": 1, "b": 101}, {"a": 0, "b": 10}, {"a": 1.0, "b": 1.0}, extra_model_outputs=x
            )
            last = (
                {"a": 2},
                {"a": 1, "b": 11},
                {"a": 1.0, "b": 2.0},
                {"a": {"vf": 0.3}, "b": {"vf": 0.4}},
            )
        obs, act, rew, extras = last
        ep.add_env_step(obs, act, rew, terminateds={"b": True}, extra_model_outputs=extras)
        return ep

    ref, got = both(build)
    n = len(got)  # env steps; n + 1 observations
    getters = {
        "observations": (lambda ep, i: ep.get_observations(i), n + 1),
        "infos": (lambda ep, i: ep.get_infos(i), n + 1),
        "actions": (lambda ep, i: ep.get_actions(i), n),
        "rewards": (lambda ep, i: ep.get_rewards(i), n),
        "extras": (lambda ep, i: ep.get_extra_model_outputs(None, i), n),
    }
    for name, (f, size) in getters.items():
        for t in range(size):
            same(lambda ep, f=f, t=t: f(ep, t), ref, got)  # positive indices: RLlib's
            assert normalize(f(got, t - size)) == normalize(f(got, t)), (name, t)
        last_ref, last_got = f(ref, -1), f(got, -1)
        if name in ("observations", "infos"):  # RLlib: b's re-recorded observation at -1
            assert "b" in last_ref and "b" not in last_got
        elif not hang:  # RLlib: b's last action missing at -1 (it is at index n - 1)
            assert "b" not in last_ref and "b" in last_got and "b" in f(ref, n - 1)
    # the agent's own timeline is equal (RLlib's re-recorded observation and info included)
    for f in (
        lambda ep: ep.get_observations(env_steps=False),
        lambda ep: ep.get_infos(env_steps=False),
        lambda ep: ep.get_actions(env_steps=False),
        lambda ep: ep.get_rewards(env_steps=False),
    ):
        same(f, ref, got)


def test_numpyized_rewards_with_fill_keep_the_stored_dtype_whatever_comes_first():
    """RLlib deviation (14), issue item (e): ``c`` joins after env step 0, so its env-step
    rewards there are fill values. RLlib batches them in the *first* item's dtype: the
    reward space's float32 when a fill item comes first, the stored float64 when a reward
    does (the same items in another order). Ours: the stored dtype either way (RLlib's
    answer for the data-first order), float32 only when every item is a fill item (as
    RLlib); the values are RLlib's in every case."""
    box = gym.spaces.Box(-1, 1, (2,), np.float32)
    act = gym.spaces.Box(-1, 1, (1,), np.float32)

    def build(cls):
        ep = cls(observation_space={k: box for k in "ac"}, action_space={k: act for k in "ac"})
        o = lambda v: np.full(2, v, np.float32)
        a = np.zeros(1, np.float32)
        ep.add_env_reset(observations={"a": o(0)})
        ep.add_env_step({"a": o(1), "c": o(5)}, {"a": a}, {"a": 1.0})
        ep.add_env_step({"a": o(2), "c": o(6)}, {"a": a, "c": a}, {"a": 1.0, "c": 2.0})
        ep.add_env_step({"a": o(3), "c": o(7)}, {"a": a, "c": a}, {"a": 1.0, "c": 3.0})
        return ep.to_numpy()

    ref, got = both(build)
    stored = got.agent_episodes["c"].rewards.data.dtype
    assert stored == ref.agent_episodes["c"].rewards.data.dtype == np.float64
    for idx, data_first in (([0, -1], [-1, 0]), (slice(0, 3), [2, 1, 0])):
        r, g = ref.get_rewards(idx, fill=-9)["c"], got.get_rewards(idx, fill=-9)["c"]
        np.testing.assert_array_equal(g, r)
        assert r.dtype == np.float32 and g.dtype == stored  # RLlib: the fill item's dtype
        same(lambda ep, i=data_first: ep.get_rewards(i, fill=-9), ref, got)  # data first
    same(lambda ep: ep.get_rewards([0], fill=-9), ref, got)  # fill items only: float32
    assert got.get_rewards([0], fill=-9)["c"].dtype == np.float32
