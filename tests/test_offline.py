"""Offline logs: batches and episodes round-trip exactly (types, dtypes, shapes, infos)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.episodes.lookback import InfiniteLookbackBuffer
from jaxsampler.episodes.multi_agent import default_agent_to_module_mapping_fn
from jaxsampler.episodes.single_agent import SingleAgentEpisode
from jaxsampler.offline import (
    OfflineWriter,
    read_batches,
    read_episodes,
    read_records,
    write_batches,
    write_episodes,
)
from tests.fakes import CountingPolicy, TurnEnv


def assert_same(a, b, path="root"):
    """Exact structural equality: types, dtypes, shapes, values (NaN == NaN)."""
    assert type(a) is type(b), (path, type(a), type(b))
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, (path, a.dtype, b.dtype, a.shape, b.shape)
        if a.dtype.kind == "O":
            for i, (x, y) in enumerate(zip(a.ravel(), b.ravel())):
                assert_same(x, y, f"{path}[{i}]")
        else:
            np.testing.assert_array_equal(a, b, err_msg=path)
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and (a == b or (a != a and b != b)), path
    elif isinstance(a, (js.SampleBatch,)):
        assert_same(dict(a), dict(b), path)
        for attr in (
            "count",
            "time_major",
            "max_seq_len",
            "zero_padded",
            "is_training",
            "num_grad_updates",
        ):
            assert getattr(a, attr) == getattr(b, attr), (path, attr)
    elif isinstance(a, js.MultiAgentBatch):
        assert a.count == b.count
        assert_same(a.policy_batches, b.policy_batches, path)
    elif isinstance(a, dict):
        assert list(a) == list(b), (path, list(a), list(b))
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
        if hasattr(a, "default_factory"):
            assert a.default_factory is b.default_factory
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, (SingleAgentEpisode, InfiniteLookbackBuffer)):
        assert_same(a.get_state(), b.get_state(), path)
    elif isinstance(a, js.MultiAgentEpisode):
        sa, sb = dict(a.__dict__), dict(b.__dict__)
        sa.pop("agent_to_module_mapping_fn")  # not stored (a function): the default is used
        assert sb.pop("agent_to_module_mapping_fn") is default_agent_to_module_mapping_fn
        assert_same(sa, sb, path)
    elif isinstance(a, float) and a != a:
        assert b != b, path
    else:
        assert a == b, (path, a, b)


def hand_made_batches():
    sb = js.SampleBatch(
        obs=np.arange(12, dtype=np.float32).reshape(4, 3),
        actions=np.array([0, 1, 2, 1], np.int64),
        rewards=np.array([0.5, np.nan, -0.0, 1e30], np.float32),
        terminateds=np.array([False, False, False, True]),
        truncateds=np.zeros(4, bool),
        eps_id=np.array(["a", "a", "b", "b"]),
        infos=[{"x": 1}, {}, {"nested": {"y": (1, 2)}}, {"arr": np.ones(2, np.int8)}],
        state_in_0=np.zeros((2, 5), np.float16),
        seq_lens=np.array([2, 2], np.int32),
        extra={"a": np.zeros((4, 2, 2), np.uint8), "b": np.full(4, np.int16(-3))},
        _time_major=False,
        _max_seq_len=2,
        _zero_padded=True,
        _is_training=True,
        _num_grad_updates=3.5,
    )
    obj = js.SampleBatch(obs=np.ones((2, 1)), infos=np.array([{"k": [1, 2]}, None], dtype=object))
    ma = js.MultiAgentBatch(
        {"p0": sb.copy(), "p1": js.SampleBatch(obs=np.zeros((0, 3), np.float32))}, 7
    )
    return [sb, obj, ma, js.SampleBatch()]


@pytest.mark.parametrize("suffix", [".msgpack", ".msgpack.gz"])
def test_batches_round_trip(tmp_path, suffix):
    batches = hand_made_batches()
    sampler = js.Sampler(
        "CartPole-v1",
        js.RandomPolicy(
            js.make("CartPole-v1").observation_space, js.make("CartPole-v1").action_space
        ),
        num_envs=2,
        rollout_length=16,
    )
    batches.append(sampler.sample_batch((), num_timesteps=32))
    path = str(tmp_path / ("log" + suffix))
    assert write_batches(path, batches) == len(batches)
    back = list(read_batches(path))
    assert len(back) == len(batches)
    for a, b in zip(batches, back):
        assert_same(a, b)
    # appending keeps the header and adds records
    write_batches(path, batches[:1], append=True)
    assert len(list(read_batches(path))) == len(batches) + 1


def test_episodes_round_trip(tmp_path):
    env = js.make("CartPole-v1")
    sa = js.Sampler(
        env, js.RandomPolicy(env.observation_space, env.action_space), num_envs=2, rollout_length=16
    ).sample((), num_timesteps=40)
    turn = TurnEnv()
    policy = CountingPolicy(turn.observation_space, turn.action_space)
    ma = js.Sampler(turn, policy, num_envs=2, rollout_length=5).sample(
        policy.init(jax.random.PRNGKey(0)), num_timesteps=10
    )
    episodes = list(sa) + list(ma)
    assert any(isinstance(e, js.MultiAgentEpisode) for e in episodes)
    path = str(tmp_path / "eps.msgpack")
    write_episodes(path, episodes)
    back = list(read_episodes(path))
    assert len(back) == len(episodes)
    for a, b in zip(episodes, back):
        assert_same(a, b)
        assert a.get_return() == b.get_return() and len(a) == len(b)
    # mixed files: readers pick their kind
    with OfflineWriter(path) as w:
        w.write(episodes[0])
        w.write(hand_made_batches()[0])
    assert [type(r).__name__ for r in read_records(path)] == ["SingleAgentEpisode", "SampleBatch"]
    assert len(list(read_batches(path))) == 1 and len(list(read_episodes(path))) == 1


def test_bad_files_and_records(tmp_path):
    p = tmp_path / "x.msgpack"
    p.write_bytes(b"\x81\xa1a\x01")  # a msgpack map, not our header
    with pytest.raises(ValueError, match="not a jaxsampler offline log"):
        list(read_records(str(p)))
    with pytest.raises(TypeError):
        write_batches(str(p), [{"obs": 1}])
    with pytest.raises(TypeError):
        OfflineWriter(str(p)).write(object())
