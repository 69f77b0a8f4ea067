"""The single-agent batch's time-major path (one chunk gathered in place) against the
general env-major path, call after call: the same rows, dtypes, metrics and carried
state; the deferred ``eps_id`` column; ``segment_sums`` against a loop."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.episodes.batch import Deferred
from jaxsampler.sampling.device import single_rows
from jaxsampler.sampling.device.columns import (
    FoundSegments,
    _env_major,
    find_segments,
    segment_sums,
)
from tests.fakes import FakeEnv

COLUMNS = ("obs", "new_obs", "actions", "rewards", "terminateds", "truncateds", "t", "eps_id")


def _sampler(
    policy: str, horizon: int, rollout_length: int = 5, **options: object
) -> tuple[js.Sampler, object]:
    env = FakeEnv()
    if policy == "random":
        pol = js.RandomPolicy(env.observation_space, env.action_space)
    else:
        pol = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(4,))
    params = pol.init(jax.random.PRNGKey(0))
    s = js.Sampler(
        env,
        pol,
        num_envs=3,
        rollout_length=rollout_length,
        seed=5,
        episode_lookback_horizon=horizon,
        **options,
    )
    return s, params


def _run(s: js.Sampler, params: object) -> list:
    """Batches and episodes of a fixed call sequence (episodes between batches read the
    head the batches carried)."""
    out = []
    for call in range(5):
        if call == 2:
            out.append(("episodes", s.sample(params)))
        else:
            b = s.sample_batch(params)["default_policy"]
            out.append(("batch", {k: b[k] for k in list(b.keys())}))
        out.append(("metrics", s.metrics.as_dict()))
    out.append(("state", s._convert.get_state()))
    return out


def _assert_same(a: object, b: object, where: str) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, js.SingleAgentEpisode):
        _assert_same(a.get_state(), b.get_state(), where)
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype, where
        np.testing.assert_array_equal(a, b, err_msg=where)
    elif hasattr(a, "__dataclass_fields__"):
        for k in a.__dataclass_fields__:
            _assert_same(getattr(a, k), getattr(b, k), f"{where}.{k}")
    else:
        assert a == b, where


@pytest.mark.parametrize(
    "policy, horizon, rollout_length",
    [("random", 0, 5), ("random", 1, 5), ("mlp", 3, 5), ("random", 5, 5), ("random", 7, 5)],
)
def test_time_major_batches_equal_the_env_major_path(monkeypatch, policy, horizon, rollout_length):
    s, params = _sampler(policy, horizon, rollout_length)
    taken = []
    real = single_rows.applies

    def spy(*args):
        taken.append(real(*args))
        return taken[-1]

    monkeypatch.setattr(single_rows, "applies", spy)
    fast = _run(s, params)
    assert any(taken) == (rollout_length >= horizon)
    monkeypatch.setattr(single_rows, "applies", lambda *args: False)
    s2, _ = _sampler(policy, horizon, rollout_length)
    general = _run(s2, params)
    for (kind, a), (_, b) in zip(fast, general, strict=True):
        _assert_same(a, b, kind)
    batch = fast[0][1]
    assert set(COLUMNS) <= set(batch) and batch["eps_id"].dtype == object
    if policy == "mlp":
        assert {"action_logp", "vf_preds"} & set(batch)


def test_eps_id_is_built_on_first_read_with_the_ids_of_its_call():
    s, params = _sampler("random", 1)
    ref, _ = _sampler("random", 1)
    b = s.sample_batch(params)["default_policy"]
    assert type(dict.__getitem__(b, "eps_id")) is Deferred  # not built yet
    s.sample_batch(params, force_reset=True)  # a reset moves the sampler's ids on
    eps = ref.sample(params)
    expected = np.concatenate([[e.id_] * len(e) for e in eps])
    np.testing.assert_array_equal(b["eps_id"], expected)
    assert b["eps_id"].dtype == object and len(set(map(id, b["eps_id"]))) == len(eps)


def test_the_general_path_serves_calls_the_time_major_one_does_not():
    s, params = _sampler("random", 1)
    chunk_calls = []
    real = single_rows.applies
    s.sample_batch(params)
    chunks = s.last_chunks
    chunk_calls.append(real(chunks, None, 1))
    chunk_calls.append(real(chunks, 3, 1))  # num_episodes: general
    chunk_calls.append(real(chunks + chunks, None, 1))  # two chunks: general
    chunk_calls.append(real(chunks, None, 6))  # horizon beyond the chunk: general
    assert chunk_calls == [True, False, False, False]


@pytest.mark.parametrize("seed", range(4))
def test_segment_sums_match_a_loop(seed):
    rng = np.random.default_rng(seed)
    values = rng.normal(size=(6, 11)).astype(np.float32)
    flat = values.reshape(-1)
    # random non-overlapping runs, the last one reaching the end on even seeds
    cuts = np.sort(rng.choice(np.arange(1, flat.size), size=14, replace=False))
    bounds = np.concatenate([[0], cuts, [flat.size]])
    starts, stops = bounds[:-1:2], bounds[1::2]
    if seed % 2:
        stops = stops.copy()
        stops[-1] -= 1
    lens = stops - starts
    keep = lens > 0
    starts, lens = starts[keep], lens[keep]
    got = segment_sums(values, starts, lens)
    want = [flat[a : a + n].astype(np.float64).sum() for a, n in zip(starts, lens, strict=True)]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert segment_sums(values, starts[:0], lens[:0]).shape == (0,)


@pytest.mark.parametrize("shape", [(5, 4, 1, 3), (5, 4, 1, 2, 3), (5, 4, 1), (5, 4, 1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.int64, bool])
def test_env_major_columns_equal_a_plain_transpose(shape, dtype):
    """Items of several values are moved as opaque units: the values must not change."""
    rng = np.random.default_rng(len(shape))
    x = (rng.random(shape) * 10).astype(dtype)
    parts = [x[:3, :, 0], x[2:, :, 0]]  # strided views, as the buffers' agent 0
    head = (rng.random((4, 2) + shape[3:]) * 10).astype(dtype)
    got = _env_major(parts, head, 2)
    want = np.concatenate([head] + [p.swapaxes(0, 1) for p in parts], axis=1)
    assert got.dtype == want.dtype and got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)
    zeros = _env_major(parts, None, 2)
    np.testing.assert_array_equal(zeros[:, :2], np.zeros_like(head))
    np.testing.assert_array_equal(zeros[:, 2:], want[:, 2:])


def test_env_major_falls_back_where_an_input_is_not_viewable_as_units():
    rng = np.random.default_rng(0)
    x = rng.random((5, 4, 1, 3)).astype(np.float32)
    head = rng.random((4, 2, 6)).astype(np.float32)[:, :, ::2]  # strided trailing axis
    got = _env_major([x[:, :, 0]], head, 2)
    np.testing.assert_array_equal(got, np.concatenate([head, x[:, :, 0].swapaxes(0, 1)], 1))
    assert _env_major([np.zeros((0, 4, 3), np.float32)], None, 1).shape == (4, 1, 3)


def test_writing_to_a_time_major_batch_changes_no_later_call():
    """The batch's columns are gathered copies: writes to them (new_obs built first, which
    makes obs writable) leave the carried head and every later call's data alone."""
    s, params = _sampler("mlp", 2)
    twin, _ = _sampler("mlp", 2)
    b = s.sample_batch(params)["default_policy"]
    twin.sample_batch(params)
    b["new_obs"]  # builds new_obs: obs becomes writable
    for k in ("obs", "new_obs", "actions", "rewards", "terminateds", "truncateds", "t"):
        b[k][...] = 7
    for _ in range(2):
        got = s.sample_batch(params)["default_policy"]
        want = twin.sample_batch(params)["default_policy"]
        for k in COLUMNS:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    got_eps, want_eps = s.sample(params), twin.sample(params)
    for x, y in zip(got_eps, want_eps, strict=True):
        _assert_same(x.get_state(), y.get_state(), "episode")


def test_cached_row_offsets_equal_a_fresh_arange_and_cannot_be_written():
    for n, step in [(0, 3), (5, 3), (5000, 3), (7, 3), (4, 1)]:
        got = single_rows.steps(n, step)
        np.testing.assert_array_equal(got, np.arange(0, n * step, step))
        assert got.dtype == np.int64 and not got.flags.writeable
    (t,) = single_rows.expand_runs(np.array([2, 3, 1]), [(np.array([4, 0, 5]), 1)])
    # segment i's rows count up from its first value (t0 [4, -2, 0] less the first rows)
    np.testing.assert_array_equal(t, np.array([4, -2, 0]).repeat([2, 3, 1]) + np.arange(6))
    assert t.flags.writeable and t.dtype == np.int64


def test_env_major_casts_inputs_of_another_dtype_value_by_value():
    # A part or head of another dtype than the first part's is cast (as numpy assignment
    # casts), never reinterpreted byte by byte as an opaque unit.
    x = np.arange(5 * 4 * 3, dtype=np.float32).reshape(5, 4, 3)
    y = np.arange(2 * 4 * 3, dtype=np.int32).reshape(2, 4, 3)
    head = np.full((4, 1, 3), 7, np.int64)
    got = _env_major([x, y], head, 1)
    want = np.concatenate([head, x.swapaxes(0, 1), y.swapaxes(0, 1)], axis=1).astype(np.float32)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("policy", ["random", "mlp"])
def test_calls_split_over_threads_equal_one_thread(monkeypatch, threads, policy):
    """With every call split (threshold 0), env shards search the segments and ranges of
    whole segments fill the rows: the same batches, episodes, metrics and carried state
    as one thread, call after call."""
    monkeypatch.setattr(single_rows, "MIN_SHARD_SLOTS", 0)
    joins, ranges = [], []
    real_join, real_ranges = single_rows.FoundSegments.join, single_rows._segment_ranges

    def spy_join(parts, env0):
        joins.append(len(parts))
        return real_join(parts, env0)

    def spy_ranges(*args):
        ranges.append(len(real_ranges(*args)))
        return real_ranges(*args)

    monkeypatch.setattr(single_rows.FoundSegments, "join", staticmethod(spy_join))
    monkeypatch.setattr(single_rows, "_segment_ranges", spy_ranges)
    split, params = _sampler(policy, 1, host_threads=threads)
    one, _ = _sampler(policy, 1, host_threads=1)
    got = _run(split, params)
    assert joins and min(joins) == threads  # (3 envs: one shard per thread)
    assert max(ranges) > 1  # rows filled in several ranges
    for (kind, a), (_, b) in zip(got, _run(one, params), strict=True):
        _assert_same(a, b, kind)


@pytest.mark.parametrize("seed", range(6))
def test_segments_joined_from_env_shards_equal_one_search(seed):
    """``FoundSegments.join`` of shard-by-shard searches against one search over every
    env: random resets and done flags, carried step / count / partial returns."""
    rng = np.random.default_rng(seed)
    E, T = 7, 9
    is_reset = rng.random((E, T)) < 0.15
    # an episode ends at the live step before a reset, or at the call's last step
    done = np.zeros((E, T), bool)
    done[:, :-1] = is_reset[:, 1:] & ~is_reset[:, :-1]
    done[:, -1] = (rng.random(E) < 0.4) & ~is_reset[:, -1]
    term = done & (rng.random((E, T)) < 0.5)
    trunc = done & ~term
    rewards = rng.normal(size=(E, T)).astype(np.float32)
    step0 = rng.integers(0, 4, E) * ~is_reset[:, 0]
    count0 = rng.integers(0, 5, E)
    partial = np.where(step0 > 0, rng.normal(size=E), 0.0)

    def search(e0, e1):
        return find_segments(
            is_reset[e0:e1],
            term[e0:e1],
            trunc[e0:e1],
            rewards[e0:e1],
            horizon=0,
            step0=step0[e0:e1],
            count0=count0[e0:e1],
            fresh=True,
            partial_return=partial[e0:e1],
            num_episodes=None,
        )

    whole = search(0, E)
    cuts = sorted(rng.choice(np.arange(1, E), size=1 + seed % 3, replace=False))
    bounds = [0, *cuts, E]
    joined = FoundSegments.join(
        [search(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)], bounds[:-1]
    )
    _assert_same(joined.seg, whole.seg, "seg")
    _assert_same(joined.returns, whole.returns, "returns")
    _assert_same(joined.carried, whole.carried, "carried")
    assert joined.n_live == whole.n_live
    assert joined.metrics().as_dict() == whole.metrics().as_dict()
    assert 0 < len(whole.returns) < len(whole.seg)  # finished and ongoing segments both


@pytest.mark.parametrize("parts", [1, 2, 3, 8])
def test_segment_ranges_cover_every_segment_in_balanced_runs(parts):
    lens = np.array([5, 1, 1, 9, 2, 2, 2, 30, 1, 4])
    n = int(lens.sum())
    got = single_rows._segment_ranges(lens, n, parts)
    assert got[0][0] == 0 and got[-1][1] == len(lens)
    assert all(b > a for a, b in got) and all(
        x[1] == y[0] for x, y in zip(got[:-1], got[1:], strict=True)
    )
    assert len(got) <= parts and (len(got) > 1) == (parts > 1)
    if parts == 2:  # the cut falls where the rows pass half of the total (57 rows)
        assert got == [(0, 7), (7, 10)]


@pytest.mark.parametrize(
    "num_envs, rollout_length, threads",
    [(1, 5, 2), (2, 3, 3), (5, 4, 2), (7, 6, 3), (4, 1, 4)],
)
def test_split_calls_with_a_reward_transform_equal_one_thread(
    monkeypatch, num_envs, rollout_length, threads
):
    """Shards of one env, more threads than envs, one-step calls, and scaled rewards (the
    segments' returns then come from the raw rewards): batches, metrics and carried state
    as one thread gives them."""
    monkeypatch.setattr(single_rows, "MIN_SHARD_SLOTS", 0)
    env = FakeEnv()
    pol = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(4,))
    params = pol.init(jax.random.PRNGKey(1))

    def make(k):
        return js.Sampler(
            env,
            pol,
            num_envs=num_envs,
            rollout_length=rollout_length,
            seed=3,
            transforms=[js.transforms.ScaleReward(0.5)],
            host_threads=k,
        )

    split, one = make(threads), make(1)
    for _ in range(4):
        a = split.sample_batch(params)["default_policy"]
        b = one.sample_batch(params)["default_policy"]
        _assert_same({k: a[k] for k in COLUMNS}, {k: b[k] for k in COLUMNS}, "batch")
        assert split.metrics.as_dict() == one.metrics.as_dict()
    _assert_same(split._convert.get_state(), one._convert.get_state(), "state")
