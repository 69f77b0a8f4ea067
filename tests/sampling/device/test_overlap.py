"""Overlap within a call, prefetch across calls (with ``weights_seq_no`` tags), the host
thread pool, and the shape check on the chunks entering conversion.

References: a sampler with ``overlap=False, host_threads=1`` (the pre-change call loop:
each chunk copied to the host before the next is dispatched, one thread) for bit
identity; for prefetch, a sampler without it fed the params that produced each call's
first chunk; ``np.take`` / ``jax.device_get`` for the parallel helpers.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.constants import DEFAULT_POLICY_ID
from jaxsampler.envs.spread import Spread
from jaxsampler.sampling import DeviceSampler
from jaxsampler.sampling.device.columns import build_columns, check_chunks
from jaxsampler.sampling.device.overlap import WEIGHTS_SEQ_NO, BufferRing, WeightsVersion
from jaxsampler.sampling.device.parallel import HostPool, parallel_take, shards_to_host
from tests.fakes import TurnEnv

E, T = 4, 8


def _cartpole(**kw: Any) -> tuple[DeviceSampler, Any]:
    env = js.make("CartPole-v1")
    pol = js.MLPPolicy(env.observation_space, env.action_space, (8,))
    return DeviceSampler(env, pol, num_envs=E, rollout_length=T, seed=3, **kw), pol


def _params(pol: Any, seed: int) -> Any:
    return pol.init(jax.random.PRNGKey(seed))


def assert_batches_equal(a: Any, b: Any, drop: tuple[str, ...] = ()) -> None:
    assert sorted(a.policy_batches) == sorted(b.policy_batches)
    for pid in a.policy_batches:
        x, y = a[pid], b[pid]
        keys = sorted(k for k in x if k not in drop)
        assert keys == sorted(k for k in y if k not in drop), pid
        for k in keys:
            for u, v in zip(jax.tree.leaves(x[k]), jax.tree.leaves(y[k]), strict=True):
                np.testing.assert_array_equal(np.asarray(u), np.asarray(v), err_msg=k)


def _record(ep: Any, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    if isinstance(ep, js.SingleAgentEpisode):
        return {
            "id": ep.id_,
            "t": (ep.t_started, ep.t, ep.observations.lookback),
            "flags": (ep.is_terminated, ep.is_truncated),
            "obs": ep.observations.data,
            "actions": ep.actions.data,
            "rewards": ep.rewards.data,
            "infos": ep.infos.data,
            "extras": {k: v.data for k, v in ep.extra_model_outputs.items() if k not in drop},
        }
    return {
        "id": ep.id_,
        "t": (ep.env_t_started, ep.env_t),
        "agents": {a: _record(sa, drop) for a, sa in sorted(ep.agent_episodes.items())},
    }


def assert_episodes_equal(a: list[Any], b: list[Any], drop: tuple[str, ...] = ()) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        ra, rb = _record(x, drop), _record(y, drop)
        assert jax.tree.structure(ra) == jax.tree.structure(rb)
        for u, v in zip(jax.tree.leaves(ra), jax.tree.leaves(rb), strict=True):
            np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


CALLS = [
    ("sample_batch", {}),
    ("sample_batch", {"num_timesteps": 3 * E * T}),
    ("sample", {"num_timesteps": 2 * E * T}),
    ("sample", {"num_episodes": 6}),
    ("sample_batch", {"num_episodes": 3}),
    ("sample", {}),
]


@pytest.mark.parametrize("extra", [{}, {"topup_length": 3}, {"devices": 2}])
def test_overlap_is_bit_identical_to_the_serial_loop(extra: dict[str, Any]) -> None:
    if "devices" in extra and jax.device_count() < 2:
        pytest.skip("needs 2 devices")
    fast, pol = _cartpole(**extra)
    slow, _ = _cartpole(overlap=False, host_threads=1, **extra)
    params = _params(pol, 0)
    for kind, kw in CALLS:
        a, b = getattr(fast, kind)(params, **kw), getattr(slow, kind)(params, **kw)
        assert fast.metrics.num_rollout_calls == slow.metrics.num_rollout_calls
        if kind == "sample":
            assert_episodes_equal(a, b)
        else:
            assert_batches_equal(a, b)
        assert WEIGHTS_SEQ_NO not in (a[next(iter(a.policy_batches))] if kind != "sample" else {})


def test_overlap_runs_several_chunks_per_call() -> None:
    s, pol = _cartpole()
    s.sample_batch(_params(pol, 0), num_timesteps=3 * E * T)
    assert s.metrics.num_rollout_calls >= 3


def test_multi_agent_overlap_and_prefetch_match_the_serial_loop() -> None:
    env = Spread(3)
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    params = pol.init(jax.random.PRNGKey(0))
    mk = lambda **kw: DeviceSampler(env, pol, num_envs=E, rollout_length=T, seed=1, **kw)
    fast, slow, pre = mk(), mk(overlap=False, host_threads=1), mk(prefetch=True)
    for kind, kw in CALLS:
        a, b, c = (getattr(s, kind)(params, **kw) for s in (fast, slow, pre))
        if kind == "sample":
            assert_episodes_equal(a, b)
            assert_episodes_equal(c, b, drop=(WEIGHTS_SEQ_NO,))
        else:
            assert_batches_equal(a, b)
            assert_batches_equal(c, b, drop=(WEIGHTS_SEQ_NO,))
            for sb in c.policy_batches.values():
                assert (sb[WEIGHTS_SEQ_NO] == 0).all()


def test_turn_based_prefetch_matches_the_serial_loop() -> None:
    # Agents that wait: which of them act on a call's last observation decides whether
    # their last steps complete or hang, and that must be read from the state at the
    # call's end, not from the state after the chunk prefetched for the next call (with
    # T odd, the prefetched chunk ends on the other agent's turn).
    env = TurnEnv(length=5)
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    params = pol.init(jax.random.PRNGKey(0))
    mk = lambda **kw: DeviceSampler(env, pol, num_envs=E, rollout_length=3, seed=1, **kw)
    slow, pre = mk(), mk(prefetch=True)
    for kind in ("sample_batch", "sample_batch", "sample", "sample", "sample_batch"):
        a, c = getattr(slow, kind)(params), getattr(pre, kind)(params)
        if kind == "sample":
            assert_episodes_equal(c, a, drop=(WEIGHTS_SEQ_NO,))
        else:
            assert_batches_equal(c, a, drop=(WEIGHTS_SEQ_NO,))


def test_prefetch_samples_come_from_the_previous_params_and_say_so() -> None:
    pre, pol = _cartpole(prefetch=True)
    ref, _ = _cartpole()
    ps = [_params(pol, i) for i in range(4)]
    # The prefetching sampler's call n runs with params n - 1 (call 0: its own).
    for n, p in enumerate(ps):
        got = pre.sample_batch(p)
        want = ref.sample_batch(ps[max(n - 1, 0)])
        assert_batches_equal(got, want, drop=(WEIGHTS_SEQ_NO,))
        tags = got[DEFAULT_POLICY_ID][WEIGHTS_SEQ_NO]
        assert tags.dtype == np.int64 and len(tags) == got.env_steps()
        assert pre.weights_seq_no == n
        np.testing.assert_array_equal(tags, max(n - 1, 0))
        # A learner at version n sees which rows are stale.
        assert (tags != pre.weights_seq_no).any() == (n >= 1)


def test_prefetch_tags_every_episode_step_and_mixes_versions_within_a_call() -> None:
    pre, pol = _cartpole(prefetch=True)
    p0, p1 = _params(pol, 0), _params(pol, 1)
    pre.sample(p0)
    eps = pre.sample(p1, num_timesteps=2 * E * T)  # chunk 0 prefetched (v0), then v1
    assert pre.metrics.num_rollout_calls >= 2
    seen = set()
    for ep in eps:
        tags = ep.get_extra_model_outputs(WEIGHTS_SEQ_NO)
        assert len(tags) == len(ep)
        seen |= set(np.asarray(tags).tolist())
    assert seen == {0, 1}
    batch = pre.sample_batch(p1, weights_seq_no=7)  # first chunk: v1, prefetched
    np.testing.assert_array_equal(batch[DEFAULT_POLICY_ID][WEIGHTS_SEQ_NO], 1)
    assert pre.weights_seq_no == 7


def test_prefetch_equals_serial_with_fixed_params_for_every_call_kind() -> None:
    pre, pol = _cartpole(prefetch=True, topup_length=3)
    ref, _ = _cartpole(topup_length=3)
    params = _params(pol, 0)
    for kind, kw in CALLS + [("sample", {"force_reset": True}), ("sample_batch", {})]:
        a, b = getattr(pre, kind)(params, **kw), getattr(ref, kind)(params, **kw)
        if kind == "sample":
            assert_episodes_equal(a, b, drop=(WEIGHTS_SEQ_NO,))
        else:
            assert_batches_equal(a, b, drop=(WEIGHTS_SEQ_NO,))


def test_reset_and_discard_return_to_the_state_before_the_prefetch() -> None:
    pre, pol = _cartpole(prefetch=True)
    ref, _ = _cartpole()
    p0, p1 = _params(pol, 0), _params(pol, 1)
    pre.sample_batch(p0), ref.sample_batch(p0)
    assert pre.discard_prefetch() and not pre.discard_prefetch()
    # Discarded: the next call runs with its own params, as without prefetch.
    assert_batches_equal(pre.sample_batch(p1), ref.sample_batch(p1), drop=(WEIGHTS_SEQ_NO,))
    pre.reset(), ref.reset()  # a prefetch was in flight: reset discards it first
    assert_batches_equal(pre.sample_batch(p0), ref.sample_batch(p0), drop=(WEIGHTS_SEQ_NO,))
    pre.close()
    assert pre._prefetched is None


def test_save_while_prefetching_resumes_exactly(tmp_path: Any) -> None:
    pre, pol = _cartpole(prefetch=True)
    ps = [_params(pol, i) for i in range(4)]
    pre.sample(ps[0])
    pre.sample(ps[1])  # a chunk for the next call is in flight
    pre.save(tmp_path / "ck")  # discards it
    back, _ = _cartpole(prefetch=True)
    back.load(tmp_path / "ck")
    for kind, p in [("sample", ps[2]), ("sample_batch", ps[3]), ("sample", ps[3])]:
        a, b = getattr(pre, kind)(p), getattr(back, kind)(p)
        if kind == "sample":
            assert_episodes_equal(a, b)
        else:
            assert_batches_equal(a, b)


def test_prefetch_checkpoint_does_not_load_into_a_sampler_without_tags(tmp_path: Any) -> None:
    pre, pol = _cartpole(prefetch=True)
    pre.sample(_params(pol, 0))
    pre.save(tmp_path / "ck")
    plain, _ = _cartpole()
    with pytest.raises(js.rollout.checkpoint.CheckpointError, match="tags"):
        plain.load(tmp_path / "ck")


def test_weights_version_counts_new_params_and_takes_given_numbers() -> None:
    v = WeightsVersion()
    a, b = {"w": np.zeros(2)}, {"w": np.ones(2)}
    assert [v.update(a), v.update(a), v.update(b), v.update(b, 10), v.update(a)] == [
        0,
        0,
        1,
        10,
        11,
    ]
    with pytest.raises(ValueError, match="weights_seq_no must be an int >= 0, got -1"):
        v.update(a, -1)


def test_buffer_ring_never_hands_out_the_newest_chunk() -> None:
    ring = BufferRing(2)
    x, y, z = object(), object(), object()
    assert ring.take() is None
    ring.put(x)  # type: ignore[arg-type]
    assert ring.take() is None  # x may still be pending
    ring.put(y)  # type: ignore[arg-type]
    assert ring.take() is x
    ring.put(z)  # type: ignore[arg-type]
    assert ring.take() is y
    with pytest.raises(ValueError, match="depth must be 1 or 2"):
        BufferRing(3)


def test_policy_extra_named_like_the_tag_is_refused() -> None:
    from jaxsampler.sampling.device.overlap import tag_chunk

    s, pol = _cartpole()
    s.sample(_params(pol, 0))
    chunk = s.last_chunks[0]
    tagged = tag_chunk(chunk, 5)
    assert (tagged.extras[WEIGHTS_SEQ_NO] == 5).all()
    with pytest.raises(ValueError, match="policy returns an extra named 'weights_seq_no'"):
        tag_chunk(tagged, 6)


# --------------------------------------------------------------------------- parallel


@pytest.mark.parametrize("threads", [1, 2])
def test_parallel_take_equals_np_take(threads: int) -> None:
    # One thread takes the checked "clip" gather into the output too (no temporary).
    pool = HostPool(threads)
    try:
        rng = np.random.default_rng(0)
        col = rng.normal(size=(5000, 700)).astype(np.float32)
        idx = rng.integers(0, len(col), 6000)  # 16.8 MB gathered: > MIN_SPLIT_BYTES
        idx[:3] = [-1, 0, 4999]
        np.testing.assert_array_equal(parallel_take(col, idx, pool), np.take(col, idx, axis=0))
        out = np.empty((len(idx), 700), np.float32)
        assert parallel_take(col, idx, pool, out=out) is out
        np.testing.assert_array_equal(out, col[idx])
        with pytest.raises(IndexError, match="index 5000 is out of bounds for 5000 rows"):
            parallel_take(col, np.r_[idx, 5000], pool)
    finally:
        pool.close()


@pytest.mark.skipif(jax.device_count() < 2, reason="needs 2 devices")
def test_shards_to_host_equals_device_get() -> None:
    from jaxsampler.rollout import placement

    mesh = placement.as_mesh(2)
    sh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, placement.AXIS))
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    x = jax.device_put(np.arange(3 * 4 * 5).reshape(3, 4, 5), sh)
    tree = {"x": x, "r": jax.device_put(np.arange(3.0), rep), "n": 1}
    pool = HostPool(2)
    try:
        got = shards_to_host(tree, pool)
    finally:
        pool.close()
    want = jax.device_get(tree)
    np.testing.assert_array_equal(got["x"], want["x"])
    np.testing.assert_array_equal(got["r"], want["r"])
    assert got["n"] == 1


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "field, bad, message",
    [
        ("actions", lambda x: x[:-1], r"chunk 1's actions has shape \(7, 4, 1\), expected"),
        ("is_reset", lambda x: x[:, :-1], r"chunk 1's is_reset has shape \(8, 3\)"),
        ("obs", lambda x: x[:-1], r"chunk 1's obs has shape \(8, 4, 1, 4\), expected .*9, 4"),
        ("rewards", lambda x: x[:, :2], "chunk 1 holds 2 envs, chunk 0 holds 4"),
        ("extras", lambda d: {k: v[:, :1] for k, v in d.items()}, r"chunk 1's extras\['"),
    ],
)
def test_malformed_chunks_raise_before_any_allocation(
    field: str, bad: Any, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    s, pol = _cartpole()
    s.sample(_params(pol, 0), num_timesteps=2 * E * T)
    good = s.last_chunks
    assert len(good) >= 2
    chunks = [good[0], dataclasses.replace(good[1], **{field: bad(getattr(good[1], field))})]
    allocated = []
    monkeypatch.setattr(np, "empty", lambda *a, **k: allocated.append(a))
    with pytest.raises(ValueError, match=message):
        build_columns(chunks, None, {}, 1, multi_agent=False)
    assert allocated == []
    check_chunks(good)  # the well-formed ones pass
    with pytest.raises(ValueError, match="at least one rollout chunk"):
        check_chunks([])
