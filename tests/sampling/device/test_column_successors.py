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
"""

from __future__ import annotations

import dataclasses

import pytest

import jaxsampler as js
from jaxsampler.envs.spread import Spread
from jaxsampler.episodes.lookback import InfiniteLookbackBuffer
from jaxsampler.episodes.multi_agent import MultiAgentEpisode
from tests.fakes import ChaosEnv, CountingPolicy
from tests.sampling.device.test_columnar_ma import _assert_same_state, _state

E, T, SEED = 3, 7, 4


@dataclasses.dataclass(frozen=True)
class InfoSpread(Spread):
    """Spread with infos: a per-agent leaf (positions) and a shared one (the time)."""

    def info(self, state, params):
        return {"pos": state.pos, "time": state.time}


def _env(name: str):
    return {
        "spread": lambda: Spread(3),
        "info_spread": lambda: InfoSpread(2),
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
        for j, (g, w) in enumerate(zip(got, want)):
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
        for j, (p, w) in enumerate(zip(pending, previous)):
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
        for j, (g, w) in enumerate(zip(got, want)):
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
