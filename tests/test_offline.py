"""Offline logs: batches and episodes round-trip exactly (types, dtypes, shapes, infos)."""

from __future__ import annotations

import gzip
import os
import random
import shutil
import struct
import warnings
import zlib

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler import spaces as sp
from jaxsampler.episodes.lookback import InfiniteLookbackBuffer
from jaxsampler.episodes.multi_agent import default_agent_to_module_mapping_fn
from jaxsampler.episodes.single_agent import SingleAgentEpisode
from jaxsampler.offline import (
    CorruptLogError,
    OfflineWriter,
    TornTailWarning,
    TruncatedLogWarning,
    read_batches,
    read_episodes,
    read_records,
    repair_log,
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
            for i, (x, y) in enumerate(zip(a.ravel(), b.ravel(), strict=True)):
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
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
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


def fixture_episode():
    """The episode in tests/data/offline_v1.msgpack{,.gz} (after hand_made_batches())."""
    return js.SingleAgentEpisode(
        "ep-v1",
        observations=[
            np.array([0.0, 1.0], np.float32),
            np.array([1.0, 2.0], np.float32),
            np.array([2.0, 3.0], np.float32),
        ],
        actions=[np.int64(1), np.int64(0)],
        rewards=[1.0, 0.5],
        infos=[{}, {"a": (1, "x")}, {"s": {1, 2}}],
        observation_space=sp.Box(-5.0, 5.0, (2,)),
        action_space=sp.Discrete(2),
        extra_model_outputs={"logp": [np.float32(-0.1), np.float32(-0.2)]},
        terminated=True,
        len_lookback_buffer=0,
    )


DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


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
    for a, b in zip(batches, back, strict=True):
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
    for a, b in zip(episodes, back, strict=True):
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


# -- version 1 ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["offline_v1.msgpack", "offline_v1.msgpack.gz"])
def test_version_1_logs_stay_readable_and_appendable(tmp_path, name):
    """The fixtures were written by the version-1 writer (before framing and checksums)."""
    expected = [*hand_made_batches(), fixture_episode()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = list(read_records(os.path.join(DATA, name)))
    assert len(back) == len(expected)
    for a, b in zip(expected, back, strict=True):
        assert_same(a, b)
    copy = str(tmp_path / name)
    shutil.copy(os.path.join(DATA, name), copy)
    write_batches(copy, hand_made_batches()[:1], append=True)  # stays version 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = list(read_records(copy))
    assert len(back) == len(expected) + 1
    assert_same(back[-1], hand_made_batches()[0])


# -- version 2: corruption is detected -------------------------------------------------


def small_log(path):
    records = [*hand_made_batches()[:2], fixture_episode()]
    with OfflineWriter(str(path)) as w:
        for r in records:
            w.write(r)
    return records, path.read_bytes()


def frame_starts(data: bytes) -> list[int]:
    """Offsets of the frames, found by following the headers (format v2: 21-byte head)."""
    pos, starts = len(js.offline.frames._HEADERS[2]), []
    while pos < len(data):
        starts.append(pos)
        pos += 21 + struct.unpack_from("<Q", data, pos + 5)[0]
    return starts


def outcome(path):
    """('ok', records) | ('cut', records) | ('corrupt', error); any other exception fails."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            records = list(read_records(str(path)))
        except CorruptLogError as e:
            return "corrupt", e
    kinds = {w.category for w in caught}
    assert kinds <= {TruncatedLogWarning}, kinds
    return ("cut" if kinds else "ok"), records


def assert_prefix(records, original):
    assert len(records) <= len(original)
    for a, b in zip(original[: len(records)], records, strict=True):
        assert_same(a, b)


def test_every_single_byte_flip_is_a_corrupt_log_error(tmp_path):
    """Before: of all single-byte flips of a log, 18% raised KeyError/TypeError and 21%
    were read silently with changed data. Now every flip is a CorruptLogError."""
    path = tmp_path / "log.msgpack"
    original, data = small_log(path)
    rng = random.Random(0)
    bad = tmp_path / "bad.msgpack"
    for i in range(len(data)):
        flipped = bytearray(data)
        flipped[i] ^= rng.randrange(1, 256)
        bad.write_bytes(bytes(flipped))
        kind, result = outcome(bad)
        assert kind == "corrupt", (i, kind)
        assert result.path == str(bad) and str(bad) in str(result)
        assert f"at byte {result.offset}:" in str(result) and 0 <= result.offset <= i


def test_truncation_at_every_length_warns_or_errors_and_keeps_a_prefix(tmp_path):
    path = tmp_path / "log.msgpack"
    original, data = small_log(path)
    bad = tmp_path / "cut.msgpack"
    starts = frame_starts(data)
    for n in range(len(data)):
        bad.write_bytes(data[:n])
        kind, result = outcome(bad)
        if n < len(js.offline.frames._HEADERS[2]):
            assert kind == "corrupt", n
            continue
        assert kind == "cut", (n, kind, result)
        assert len(result) == sum(1 for s in starts[1:] if s <= n)  # every intact record
        assert_prefix(result, original)
    bad.write_bytes(data)
    kind, result = outcome(bad)
    assert kind == "ok"
    assert_prefix(result, original) or len(result) == len(original)
    assert len(result) == len(original)


def test_truncated_last_record_warns_and_yields_the_intact_ones(tmp_path):
    path = tmp_path / "log.msgpack"
    original, data = small_log(path)
    last = frame_starts(data)[-2]  # the last record (the end frame follows it)
    path.write_bytes(data[: last + 30])
    with pytest.warns(TruncatedLogWarning, match=f"at byte {last}: the last record declares"):
        back = list(read_records(str(path)))
    assert len(back) == len(original) - 1
    assert_prefix(back, original)


def test_garbage_after_the_last_record_is_an_error(tmp_path):
    path = tmp_path / "log.msgpack"
    original, data = small_log(path)
    for garbage in (b"x", b"\x00" * 40, b"hello world, not a record"):
        path.write_bytes(data + garbage)
        with pytest.raises(CorruptLogError, match=f"at byte {len(data)}: "):
            list(read_records(str(path)))


def mutate(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        op, at = rng.randrange(3), rng.randrange(len(out) + 1)
        if op == 0 and at < len(out):
            out[at] ^= rng.randrange(1, 256)
        elif op == 1:
            out[at:at] = rng.randbytes(rng.randint(1, 8))
        else:
            del out[at : at + rng.randint(1, 30)]
    return bytes(out)


def test_fuzz_flips_inserts_and_cuts(tmp_path):
    """Whatever the damage: the exact records, or CorruptLogError, or the truncation
    warning with an exact prefix; never another exception, never changed data."""
    path = tmp_path / "log.msgpack"
    original, data = small_log(path)
    rng = random.Random(1234)
    bad = tmp_path / "bad.msgpack"
    seen = set()
    for _ in range(400):
        mutated = mutate(data, rng) if rng.random() < 0.8 else data[: rng.randrange(len(data))]
        bad.write_bytes(mutated)
        kind, result = outcome(bad)
        seen.add(kind)
        if kind == "ok":
            assert mutated == data or len(result) == len(original)
            assert_prefix(result, original)
        elif kind == "cut":
            assert_prefix(result, original)
    assert seen >= {"corrupt", "cut"}


# -- appending after a crash -------------------------------------------------------------


def test_append_after_a_crash_cuts_only_the_torn_tail(tmp_path):
    """Before: appending after a writer crash made the whole tail unreadable."""
    path = tmp_path / "log.msgpack"
    original, data = small_log(path)
    starts = frame_starts(data)
    extra = hand_made_batches()[3]
    for torn_at in (starts[-2] + 5, starts[-2] + 25, starts[-1] - 1):
        torn = data[:torn_at]
        path.write_bytes(torn)
        with pytest.warns(TornTailWarning, match=f"removed {torn_at - starts[-2]} bytes"):
            write_batches(str(path), [extra], append=True)
        # the crashed session is reported where it ended, though a later one follows
        unclosed = f"start at byte {starts[0]} ended without its end frame at byte {starts[-2]}"
        with pytest.warns(TruncatedLogWarning, match=unclosed):
            back = list(read_records(str(path)))
        assert len(back) == len(original)  # the torn record is gone, the new one is there
        assert_prefix(back[:-1], original[:-1])
        assert_same(back[-1], extra)
    # a crash at a record boundary (no end frame), and a zero-filled tail (delayed
    # allocation after a power cut): nothing intact is lost
    for tail in (b"", b"\x00" * 100):
        path.write_bytes(data[: starts[-1]] + tail)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            write_batches(str(path), [extra], append=True)
        assert [w.category for w in caught] == ([TornTailWarning] if tail else [])
        unclosed = f"start at byte {starts[0]} ended without its end frame at byte {starts[-1]}"
        with pytest.warns(TruncatedLogWarning, match=unclosed):
            back = list(read_records(str(path)))
        assert len(back) == len(original) + 1
        assert_prefix(back[:-1], original)


def test_append_never_damages_earlier_records(tmp_path):
    path = tmp_path / "log.msgpack"
    original, data = small_log(path)
    starts = frame_starts(data)
    damaged = bytearray(data)
    damaged[starts[1] + 8] ^= 0xFF  # the second record's length: intact frames follow
    path.write_bytes(bytes(damaged))
    with pytest.raises(CorruptLogError, match="run repair_log first"):
        OfflineWriter(str(path), append=True)
    assert path.read_bytes() == bytes(damaged)
    # damage inside a middle payload is not looked for (only headers and the last
    # payload are checked, so opening stays cheap): appending leaves every byte before it
    damaged = bytearray(data)
    damaged[starts[1] + 30] ^= 0xFF
    path.write_bytes(bytes(damaged))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_batches(str(path), hand_made_batches()[:1], append=True)
    assert path.read_bytes().startswith(bytes(damaged))
    report = repair_log(str(path))
    assert report.dropped == ((starts[1], starts[2] - starts[1]),) and report.records == 3


# -- gzip ----------------------------------------------------------------------------------


def test_truncated_or_damaged_gzip_is_a_warning_or_an_error(tmp_path):
    path = tmp_path / "log.msgpack.gz"
    original = [*hand_made_batches(), fixture_episode()]
    write_batches(str(path), original[:4])
    data = path.read_bytes()
    bad = tmp_path / "bad.msgpack.gz"
    for n in range(0, len(data), 7):
        bad.write_bytes(data[:n])
        kind, result = outcome(bad)
        assert kind in ("cut", "corrupt"), n
        if kind == "cut":
            assert_prefix(result, original)
    for i in range(10, len(data), 11):
        flipped = bytearray(data)
        flipped[i] ^= 0x55
        bad.write_bytes(bytes(flipped))
        kind, result = outcome(bad)
        if kind == "ok":  # the gzip header's file name or time: the data is intact
            assert len(result) == 4
        if kind != "corrupt":
            assert_prefix(result, original)
    bad.write_bytes(data[: len(data) - 20])
    with pytest.raises(CorruptLogError, match="run repair_log first"):
        OfflineWriter(str(bad), append=True)
    write_batches(str(path), original[:1], append=True)  # a sound .gz appends fine
    assert len(list(read_records(str(path)))) == 5


# -- repair --------------------------------------------------------------------------------


def test_repair_keeps_every_intact_record(tmp_path):
    path = tmp_path / "log.msgpack"
    original, data = small_log(path)
    starts = frame_starts(data)
    damaged = bytearray(data)
    damaged[starts[1] + 40] ^= 0x01  # the second record
    path.write_bytes(bytes(damaged) + b"junk")
    report = repair_log(str(path), str(tmp_path / "fixed.msgpack"))
    assert report.records == len(original) - 1 and report.version == 2
    assert report.dropped == ((starts[1], starts[2] - starts[1]), (len(data), 4))
    assert report.bytes_dropped == starts[2] - starts[1] + 4 and not report.clean
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = list(read_records(str(tmp_path / "fixed.msgpack")))
    assert len(back) == 2
    assert_same(back[0], original[0])
    assert_same(back[1], original[2])
    assert path.read_bytes() == bytes(damaged) + b"junk"  # out_path given: input untouched
    # in place (the file keeps its mode); a clean log is left alone
    os.chmod(path, 0o640)
    report = repair_log(str(path))
    assert os.stat(path).st_mode & 0o777 == 0o640
    assert report.out_path == str(path) and len(list(read_records(str(path)))) == 2
    before = os.stat(path).st_mtime_ns, path.read_bytes()
    report = repair_log(str(path))
    assert report.clean and report.records == 2
    assert (os.stat(path).st_mtime_ns, path.read_bytes()) == before


def test_repair_converts_version_1_and_cut_logs(tmp_path):
    out = str(tmp_path / "v2.msgpack.gz")
    report = repair_log(os.path.join(DATA, "offline_v1.msgpack"), out)
    assert report.version == 1 and report.records == 5 and not report.dropped
    back = list(read_records(out))
    for a, b in zip([*hand_made_batches(), fixture_episode()], back, strict=True):
        assert_same(a, b)
    with open(out, "rb") as f:
        data = f.read()
    gz = gzip.decompress(data)
    assert gz.startswith(js.offline.frames._HEADERS[2])
    # a cut gzip log
    cut = tmp_path / "cut.msgpack.gz"
    cut.write_bytes(data[: len(data) // 2])
    report = repair_log(str(cut), str(tmp_path / "fixed.msgpack"))
    assert report.truncated and report.records < 5
    assert_prefix(list(read_records(str(tmp_path / "fixed.msgpack"))), back)


def test_error_names_file_and_offset_and_crc_is_crc32(tmp_path):
    path = tmp_path / "log.msgpack"
    original, data = small_log(path)
    start = frame_starts(data)[0]
    length = struct.unpack_from("<Q", data, start + 5)[0]
    payload = data[start + 21 : start + 21 + length]
    assert struct.unpack_from("<I", data, start + 13)[0] == zlib.crc32(payload)
    assert data[start : start + 4] == b"\xc1JSL"
    assert js.offline.VERSION == 2


def test_version_1_damage_is_never_a_key_or_type_error(tmp_path):
    """Before: 18% of single-byte flips of a log raised KeyError/TypeError. Version 1 has
    no checksums, so a flip may still change data unnoticed, but every failure is a
    CorruptLogError (or the truncation warning)."""
    with open(os.path.join(DATA, "offline_v1.msgpack"), "rb") as f:
        data = f.read()
    rng = random.Random(5)
    bad = tmp_path / "bad.msgpack"
    kinds = set()
    for i in range(0, len(data), 2):
        flipped = bytearray(data)
        flipped[i] ^= rng.randrange(1, 256)
        bad.write_bytes(bytes(flipped))
        kinds.add(outcome(bad)[0])  # anything but CorruptLogError propagates and fails
    assert "corrupt" in kinds


def test_a_damaged_version_1_log_is_refused_for_append_not_cut(tmp_path):
    """Version 1 has no framing: one flipped header byte of its first record declares a
    length past the end of the file, which looked like a torn tail, and appending cut the
    intact records behind it (found by a review). Now appending refuses, byte for byte."""
    from jaxsampler.episodes.codec import packb

    path = tmp_path / "v1.msgpack"
    recs = [js.SampleBatch({"obs": np.full(4, i, np.float32)}) for i in range(3)]
    from jaxsampler import offline

    head = offline.frames._HEADERS[1]
    data = bytearray(head + b"".join(packb(r) for r in recs))
    data[len(head)] = 0xC8  # the first record's ext8 marker -> ext16: its length runs past EOF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError, match="run repair_log first"):
        OfflineWriter(str(path), append=True)
    assert path.read_bytes() == bytes(data)
