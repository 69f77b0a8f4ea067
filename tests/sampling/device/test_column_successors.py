"""Open multi-agent chunks whose ``cut`` successor comes straight from the call's columns.

The reference is the pre-change path, forced on a twin sampler (same env, policy and
seed): every open chunk built now, step by step (``_fill``), and its successor cut from
it (``_successor``). Over several calls, on lockstep agents (Spread, and Spread with
per-agent and shared infos), on agents finishing at different times (Goals) and on
agents out of lockstep with hanging steps (ChaosEnv), with lookback horizons 0 to 3:

* every returned chunk and every successor the sampler carries has exactly the
  reference's state (ids, maps, lookbacks, columns, dtypes, spaces, flags);
* on Spread most open chunks take the new path (lazy chunk, successor from columns);
* a lazy open chunk read only after the next call equals one read at once;
* a checkpoint taken between calls resumes to the same chunks.

Chunks that continue such a successor are view episodes with the successor's lookback in
front (``ContinuedChunks``); their reference is the same sampler extending the successor
step by step (``_continue_views = False``): the same state, maps and getters (lookback
getters included), most of Spread's continued chunks view-built, and writes to one
(``set_observations``, ``add_env_step``) change no other episode and not the next call.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.envs.spread import Spread
from jaxsampler.episodes.lookback import InfiniteLookbackBuffer
from jaxsampler.episodes.multi_agent import MultiAgentEpisode
from jaxsampler.spaces import Box, Dict
from tests.fakes import ChaosEnv, CountingPolicy
from tests.sampling.device.test_columnar_ma import _assert_same_state, _state

E, T, SEED = 3, 7, 4


@dataclasses.dataclass(frozen=True)
class InfoSpread(Spread):
    """Spread with infos: a per-agent leaf (positions) and a shared one (the time)."""

    def info(self, state, params):
        return {"pos": state.pos, "time": state.time}


@dataclasses.dataclass(frozen=True)
class DictSpread(Spread):
    """Spread with dict observations: the flat one and its first two entries."""

    @property
    def observation_space(self):
        flat = super().observation_space
        return Dict(a=flat, b=Box(-np.inf, np.inf, (2,), np.float32))

    def agent_obs(self, agent_id, own, state, params):
        obs = super().agent_obs(agent_id, own, state, params)
        return {"a": obs, "b": obs[:2]}


def _env(name: str):
    return {
        "spread": lambda: Spread(3),
        "info_spread": lambda: InfoSpread(2),
        "dict_spread": lambda: DictSpread(2),
        "goals": lambda: js.make("Goals-v0"),
        "chaos": ChaosEnv,
    }[name]()


def _sampler(env, horizon: int, old: bool = False):
    policy = CountingPolicy(env.observation_space, env.action_space)
    s = js.Sampler(
        env, policy, num_envs=E, rollout_length=T, seed=SEED, episode_lookback_horizon=horizon
    )
    if old:  # the pre-change path: no successor from columns, every open chunk built now
        s._convert._column_successors = lambda ctx, keys: {}
    return s


def _strict(a, b, where=""):
    """:func:`_assert_same_state`, lookback buffers also by space and borrowing."""
    if isinstance(b, InfiniteLookbackBuffer):
        assert isinstance(a, InfiniteLookbackBuffer), where
        assert a.space == b.space and a.borrowed == b.borrowed, where
    _assert_same_state(a, b, where)


def _same_chunk(
    got: MultiAgentEpisode, want: MultiAgentEpisode, where: str, strict: bool = True
) -> None:
    g, w = _state(got), _state(want)
    _assert_same_state(g, w, where)
    if not strict:
        return
    for aid, sa in want.agent_episodes.items():
        ga = got.agent_episodes[aid]
        for name in ("observations", "infos", "actions", "rewards"):
            _strict(getattr(ga, name), getattr(sa, name), f"{where} {aid} {name}")
        for k, buf in sa.extra_model_outputs.items():
            _strict(ga.extra_model_outputs[k], buf, f"{where} {aid} {k}")


def _same_successors(new, old, where: str, strict: bool = True) -> None:
    a, b = new._convert._open, old._convert._open
    assert list(a) == list(b), where
    for e in b:
        _same_chunk(a[e], b[e], f"{where} successor of env {e}", strict)
        assert list(a[e].agent_episodes) == list(b[e].agent_episodes), where
        assert list(a[e]._agent_episode_ids) == list(b[e]._agent_episode_ids), where


@pytest.mark.parametrize(
    ("name", "horizon"),
    [("spread", 1), ("spread", 3), ("info_spread", 2), ("goals", 0), ("chaos", 2)],
)
def test_chunks_and_successors_equal_the_built_chunks_cut(name, horizon):
    env = _env(name)
    new, old = _sampler(env, horizon), _sampler(env, horizon, old=True)
    n_open = n_fast = 0
    for c in range(6):
        got, want = new.sample(()), old.sample(())
        assert len(got) == len(want)
        fast = [not ep.is_done and "_lazy" in ep.__dict__ for ep in got]
        n_open += sum(not ep.is_done for ep in got)
        n_fast += sum(fast)
        assert not any(not ep.is_done and "_lazy" in ep.__dict__ for ep in want)
        # successors before and after the chunks are built (building one must not touch them)
        _same_successors(new, old, f"call {c}")
        for j, (g, w) in enumerate(zip(got, want, strict=True)):
            _same_chunk(g, w, f"call {c} chunk {j}")
        _same_successors(new, old, f"call {c}, chunks read")
        assert new._convert._plain.sum() == sum(fast)
    if name in ("spread", "info_spread"):  # lockstep: nearly every open chunk is fast
        assert n_fast >= 0.8 * n_open, (n_fast, n_open)
    if name == "goals":
        assert n_fast > 0


def test_an_open_chunk_read_after_the_next_call_equals_one_read_at_once():
    env = Spread(3)
    now, late = _sampler(env, 2), _sampler(env, 2)
    pending: list[MultiAgentEpisode] = []
    previous: list[MultiAgentEpisode] = []
    lazy = 0
    for c in range(5):
        read = now.sample(())
        for ep in read:
            ep.get_state()  # built at once
        for j, (p, w) in enumerate(zip(pending, previous, strict=True)):
            _same_chunk(p, w, f"call {c - 1} chunk {j}, read late")
        pending, previous = late.sample(()), read
        lazy += sum("_lazy" in ep.__dict__ and not ep.is_done for ep in pending)
    assert lazy > 0


def test_a_checkpoint_between_calls_resumes_to_the_same_chunks(tmp_path):
    env = Spread(3)
    a = _sampler(env, 2)
    for _ in range(2):
        a.sample(())
    a.save(tmp_path / "ckpt")
    b = _sampler(env, 2)
    b.load(tmp_path / "ckpt")
    # (the restored converter cuts its first chunks from the built chunks: the same state;
    # restored buffers own their data, so they are compared without the borrowing flag)
    assert not b._convert._plain.any() and a._convert._plain.any()
    for c in range(3):
        got, want = b.sample(()), a.sample(())
        for j, (g, w) in enumerate(zip(got, want, strict=True)):
            _same_chunk(g, w, f"call {c} chunk {j}", strict=c > 0)
        _same_successors(b, a, f"call {c}", strict=c > 0)


def test_lazy_open_chunks_hold_nothing_the_next_call_changes():
    # The lazy chunk's build reads the call's columns and carry and extends the successor
    # it continues; the next call reads only the new successors.
    env = Spread(3)
    s = _sampler(env, 1)
    s.sample(())
    first = s.sample(())
    lazy = [ep for ep in first if "_lazy" in ep.__dict__ and not ep.is_done]
    assert lazy and any(ep.env_t_started > 0 for ep in lazy)  # continued ones among them
    keys = [ep.__dict__["_lazy"][1] for ep in lazy]
    assert all(k.succ is None or k.succ is not s._convert._open.get(k.e) for k in keys)
    carry = s._convert._carry
    s.sample(())
    assert s._convert._carry is not carry


def _continued_sampler(env, horizon: int, views: bool):
    s = _sampler(env, horizon)
    s._convert._continue_views = views
    return s


def _lookback_reads(sa):
    """Getters over and into the lookback (where the episode has steps enough)."""
    out = [sa.get_observations(), sa.get_actions(), sa.get_rewards(), sa.get_infos()]
    out += [sa.get_observations(-1), sa.get_observations(-2)]
    lb = sa.observations.lookback
    out.append(sa.get_observations(slice(-3, None), neg_index_as_lookback=True, fill=0.0))
    if lb:
        out.append(sa.get_observations(-1, neg_index_as_lookback=True))
        out.append(sa.get_actions(-1, neg_index_as_lookback=True))
        out.append(sa.get_rewards(-1, neg_index_as_lookback=True))
        out.append(sa.get_infos(-1, neg_index_as_lookback=True))
    out.append(sa.get_actions(slice(-2, None), neg_index_as_lookback=True, fill=0))
    for k in sa.extra_model_outputs:
        out.append(sa.get_extra_model_outputs(k))
        if lb:
            out.append(sa.get_extra_model_outputs(k, -1, neg_index_as_lookback=True))
    return out


def _is_view_built(ep) -> bool:
    return all(sa._view is not None for sa in ep.agent_episodes.values())


@pytest.mark.parametrize(
    ("name", "horizon"),
    [
        ("spread", 1),
        ("spread", 3),
        ("info_spread", 2),
        ("dict_spread", 2),
        ("goals", 0),
        ("goals", 2),
        ("chaos", 2),
    ],
)
def test_continued_chunks_as_views_equal_the_extended_successors(name, horizon):
    # The reference: the same sampler with continued chunks built by extending their
    # successor step by step (the pre-change path).
    env = _env(name)
    new, old = _continued_sampler(env, horizon, True), _continued_sampler(env, horizon, False)
    n_cont = n_agents = n_view = 0
    for c in range(6):
        got, want = new.sample(()), old.sample(())
        assert len(got) == len(want)
        for j, (g, w) in enumerate(zip(got, want, strict=True)):
            where = f"call {c} chunk {j}"
            if g.env_t_started > 0 and (g.is_done or "_lazy" in g.__dict__):
                n_cont += 1
                # getters first (the fast paths, before the columns are built)
                for aid, sa in w.agent_episodes.items():
                    ga = g.agent_episodes[aid]
                    n_agents += 1
                    n_view += ga._view is not None
                    for x, y in zip(_lookback_reads(ga), _lookback_reads(sa), strict=True):
                        _assert_same_state(x, y, f"{where} {aid} getters")
            _same_chunk(g, w, where)
            assert g.env_t_to_agent_t.keys() == w.env_t_to_agent_t.keys(), where
            for aid, m in w.env_t_to_agent_t.items():
                _strict(g.env_t_to_agent_t[aid], m, f"{where} map {aid}")
                assert g.env_t_to_agent_t[aid].borrowed == m.borrowed, where
        _same_successors(new, old, f"call {c}")
    assert n_cont > 0
    if "spread" in name:  # lockstep: nearly every continued chunk's agents
        assert n_view >= 0.8 * n_agents, (n_view, n_agents)


def test_most_continued_spread_chunks_are_view_built():
    env = Spread(3)
    s = _continued_sampler(env, 2, True)
    n_cont = n_view = 0
    for _ in range(5):
        for ep in s.sample(()):
            if ep.env_t_started > 0 and (ep.is_done or "_lazy" in ep.__dict__):
                n_cont += 1
                n_view += _is_view_built(ep)
    assert n_cont > 0 and n_view >= 0.8 * n_cont, (n_view, n_cont)


def test_writing_to_a_continued_view_chunk_changes_no_other_episode():
    env = Spread(3)
    a, b = _continued_sampler(env, 2, True), _continued_sampler(env, 2, True)
    for _ in range(2):
        a.sample(()), b.sample(())
    got, ref = a.sample(()), b.sample(())
    cont = [j for j, ep in enumerate(got) if ep.env_t_started > 0 and _is_view_built(ep)]
    opened = [j for j in cont if not got[j].is_done]
    assert len(cont) >= 2 and opened
    j, k = cont[0], opened[-1]
    assert j != k
    # set_observations on one chunk, into the lookback too
    ep = got[j]
    aid = next(iter(ep.agent_episodes))
    sa = ep.agent_episodes[aid]
    assert sa.observations.lookback > 0
    before = sa.get_observations(-1, neg_index_as_lookback=True).copy()
    new_obs = np.full_like(sa.get_observations(0), 7.0)
    ep.set_observations(new_data={aid: new_obs}, at_indices=0)
    sa.observations.set(new_obs * 2, at_indices=-1, neg_index_as_lookback=True)
    np.testing.assert_array_equal(sa.get_observations(0), new_obs)
    np.testing.assert_array_equal(sa.get_observations(-1, neg_index_as_lookback=True), new_obs * 2)
    assert not np.array_equal(before, new_obs * 2)
    # add_env_step on an open one
    op = got[k]
    aids = list(op.agent_episodes)
    act = {x: op.agent_episodes[x].get_actions(-1) for x in aids}
    obs = {x: np.full_like(op.agent_episodes[x].get_observations(-1), 5.0) for x in aids}
    op.add_env_step(obs, act, {x: 1.0 for x in aids})
    for x in aids:
        np.testing.assert_array_equal(op.agent_episodes[x].get_observations(-1), obs[x])
    assert op.env_t == ref[k].env_t + 1
    # the other chunks, and the written chunk's other agents, are as the twin's
    for i in range(len(got)):
        if i not in (j, k):
            _same_chunk(got[i], ref[i], f"chunk {i}")
    for other in ep.agent_episodes:
        if other != aid:
            _assert_same_state(
                ep.agent_episodes[other].get_state(), ref[j].agent_episodes[other].get_state()
            )
    # the next call is as the twin's
    for i, (g, w) in enumerate(zip(a.sample(()), b.sample(()), strict=True)):
        _same_chunk(g, w, f"next call chunk {i}")
    _same_successors(a, b, "next call")


@pytest.mark.parametrize(
    ("name", "horizon"),
    [("spread", 1), ("info_spread", 2), ("dict_spread", 2), ("goals", 2)],
)
def test_continued_chunks_read_untouched_successors_like_built_ones(name, horizon, monkeypatch):
    # A continued chunk reads the lookback rows of a successor whose agents' columns are
    # still unbuilt straight from the views those successors share, and those of a built
    # successor from its buffers: untouched, every other one built, all built; the
    # reference extends each successor step by step.
    from jaxsampler.sampling.device import successors

    seen = {"views": 0, "buffers": 0}
    real = successors._view_sources

    def spy(olds):
        pv, keys, src = real(olds)
        seen["views"] += int(pv.sum())
        seen["buffers"] += int((~pv).sum())
        return pv, keys, src

    monkeypatch.setattr(successors, "_view_sources", spy)
    env = _env(name)
    ref = _continued_sampler(env, horizon, False)
    runs = {mode: _continued_sampler(env, horizon, True) for mode in ("none", "half", "all")}
    counts = {}
    for c in range(5):
        want = ref.sample(())
        for mode, s in runs.items():
            before = dict(seen)
            got = s.sample(())
            for j, (g, w) in enumerate(zip(got, want, strict=True)):
                _same_chunk(g, w, f"{mode}: call {c} chunk {j}")
            used = {k: seen[k] - before[k] for k in seen}
            counts[mode] = {k: counts.get(mode, {}).get(k, 0) + used[k] for k in used}
            opened = list(s._convert._open.values())
            for ep in {"none": [], "half": opened[::2], "all": opened}[mode]:
                for sa in ep.agent_episodes.values():
                    assert sa.observations is not None and sa.actions is not None  # (builds)
    assert counts["none"]["views"] > 0 and counts["none"]["buffers"] == 0, counts
    assert counts["half"]["views"] > 0 and counts["half"]["buffers"] > 0, counts
    assert counts["all"]["views"] == 0 and counts["all"]["buffers"] > 0, counts
