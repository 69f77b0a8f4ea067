"""The wire codec: exact round trips, and bounded, crash-free decoding of hostile input."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import tracemalloc
from collections import defaultdict
from pathlib import Path

import jax
import jax.numpy as jnp
import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxsampler import spaces as sp
from jaxsampler.episodes.codec import (
    MAX_DEPTH,
    DecodeError,
    TruncatedDataError,
    packb,
    scan,
    unpackb,
    unpacker,
)
from tests.test_offline import assert_same, fixture_episode, hand_made_batches

ROOT = str(Path(__file__).resolve().parents[2])
Ext = msgpack.ExtType


def ext_nest(levels: int) -> bytes:
    """1-tuples nested ``levels`` deep (an ext value and an array each: 2 levels), about
    4.5 bytes a level."""
    doc = msgpack.packb([])
    for _ in range(levels):
        doc = msgpack.packb(Ext(3, b"\x91" + doc))
    return doc


def box_body(shape) -> bytes:
    """A 60-odd-byte document naming a Box of ``shape``: decoding it must not build it."""
    return msgpack.packb({"space": Ext(5, msgpack.packb(["Box", 0.0, 1.0, list(shape), "<f4"]))})


def array_doc(dtype, shape, raw: bytes, code: int = 1) -> bytes:
    return msgpack.packb(Ext(code, msgpack.packb([dtype, list(shape), raw])))


def peak_bytes(fn) -> int:
    """Peak traced allocation while ``fn`` runs (numpy reports its buffers too)."""
    tracemalloc.start()
    try:
        fn()
    except ValueError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


# -- findings: regression tests ---------------------------------------------------------


def test_deep_ext_nesting_does_not_kill_the_process(tmp_path):
    """Before: ~300 nested ext values (1.1 KB) ran the C stack out (SIGSEGV), through
    unpackb and through read_batches on a 1.2 KB version-1 log. Run in a subprocess so a
    regression fails this test instead of killing the test run."""
    deep = ext_nest(300)
    assert len(deep) < 1500
    doc, log = tmp_path / "deep.msgpack", tmp_path / "deep_log.msgpack"
    doc.write_bytes(deep)
    header = msgpack.packb({"format": "jaxsampler.offline", "version": 1})
    log.write_bytes(header + deep)
    code = textwrap.dedent(f"""
        import sys
        from jaxsampler.episodes.codec import unpackb
        from jaxsampler.offline import read_batches, CorruptLogError
        for objects in (True, False):
            try:
                unpackb(open({str(doc)!r}, "rb").read(), objects=objects)
            except ValueError as e:
                print("unpackb:", type(e).__name__, e)
        try:
            list(read_batches({str(log)!r}))
        except CorruptLogError as e:
            print("read_batches:", type(e).__name__, e)
    """)
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    lines = r.stdout.splitlines()
    assert len(lines) == 3, r.stdout
    assert all("deeper than 64 levels" in line for line in lines), r.stdout
    assert lines[2].startswith("read_batches: CorruptLogError") and str(log) in lines[2]


@pytest.mark.parametrize("levels", [MAX_DEPTH - 1, MAX_DEPTH, 2000])
def test_depth_limit_counts_containers_and_ext_payloads(levels):
    lists = b"\x91" * levels + b"\x90"  # levels + 1 nested arrays
    tuples = ext_nest((levels + 1) // 2)  # ext value + array per level, + the innermost []
    for doc, depth in ((lists, levels + 1), (tuples, 2 * ((levels + 1) // 2) + 1)):
        if depth <= MAX_DEPTH:
            assert unpackb(doc) is not None
        else:
            with pytest.raises(DecodeError, match=f"deeper than {MAX_DEPTH} levels"):
                unpackb(doc)
    if levels + 1 <= MAX_DEPTH:
        assert unpackb(lists) is not None
    else:
        with pytest.raises(DecodeError, match=f"deeper than {MAX_DEPTH} levels"):
            unpackb(lists)
    with pytest.raises(DecodeError, match="deeper than 3 levels"):
        unpackb(b"\x91\x91\x91\x90", max_depth=3)
    # an ext value and its payload's containers add up
    inner = msgpack.packb([[[1]]])  # 3 levels
    wrapped = msgpack.packb([Ext(3, inner)])  # + array + ext = 5 levels
    assert unpackb(wrapped, max_depth=5) == [([[1]],)]
    with pytest.raises(DecodeError, match="deeper than 4"):
        unpackb(wrapped, max_depth=4)


def test_requests_refuse_spaces_and_objects_before_building_them():
    """Before: a 67-byte request naming a Box of shape [N, M] allocated its bounds
    (~206 MB); unpackb(objects=False) must refuse spaces and host objects outright."""
    body = box_body((5000, 5000))
    assert len(body) < 80
    peak = peak_bytes(lambda: unpackb(body, objects=False))
    with pytest.raises(DecodeError, match="refusing a space"):
        unpackb(body, objects=False)
    assert peak < 1 << 20, peak
    batch = packb({"b": hand_made_batches()[0]})
    with pytest.raises(DecodeError, match="refusing a host object"):
        unpackb(batch, objects=False)
    with pytest.raises(DecodeError, match="refusing a host object"):
        unpackb(packb({1, 2}), objects=False)
    # where spaces are allowed, a huge one is still refused before it is built
    peak = peak_bytes(lambda: unpackb(body))
    with pytest.raises(DecodeError, match="more than 16777216 elements"):
        unpackb(body)
    assert peak < 1 << 20, peak
    assert unpackb(box_body((2, 3)))["space"] == sp.Box(0.0, 1.0, (2, 3))
    # what a client reading the server's /info uses: spaces yes, host objects no
    info = packb({"observation_space": sp.Box(-1.0, 1.0, (3,)), "agent_ids": ("a",)})
    assert unpackb(info, objects=False, spaces=True)["observation_space"] == sp.Box(-1.0, 1.0, (3,))
    with pytest.raises(DecodeError, match="refusing a host object"):
        unpackb(packb({"b": hand_made_batches()[0]}), objects=False, spaces=True)
    with pytest.raises(DecodeError, match="refusing a space"):
        unpackb(info, spaces=False)


@pytest.mark.parametrize(
    "dtype, shape, raw, match",
    [
        ("<f4", [3], b"\0" * 8, "need 12 bytes, the data has 8"),
        ("<f4", [2**40, 2**40], b"\0" * 8, "need"),
        ("<f4", [-1, -8], b"\0" * 32, r"ints in \[0, 2\*\*62\)"),
        ("<f4", [2**63], b"", r"ints in \[0, 2\*\*62\)"),
        ("<f4", [0, 2**61, 2**61], b"", "array is too big"),
        ("<f4", [1] * 33, b"\0" * 4, "at most 32"),
        ("<f4", "abc", b"", "shape must be a list"),
        ("<f4", [True], b"\0" * 4, "ints in"),
        ("|O8", [1], b"\0" * 8, "bad dtype|refusing"),
        ("|V8", [1], b"\0" * 8, "refusing numpy dtype"),
        ("i4,i4", [1], b"\0" * 8, "bad dtype"),
        ("(1000000000,)i4", [1], b"\0" * 4, "bad dtype"),
        ("<U0", [5], b"", "refusing numpy dtype"),
        (7, [1], b"\0", "bad dtype"),
        ("<f4", [1], "text", "data must be bytes"),
    ],
)
def test_array_byte_counts_are_checked_before_allocating(dtype, shape, raw, match):
    doc = array_doc(dtype, shape, raw) if not isinstance(shape, str) else None
    if doc is None:
        doc = msgpack.packb(Ext(1, msgpack.packb([dtype, shape, raw])))
    peak = peak_bytes(lambda: unpackb(doc))
    with pytest.raises(DecodeError, match=match):
        unpackb(doc)
    assert peak < 1 << 20, peak


def test_other_malformed_ext_payloads_are_value_errors():
    cases = [
        array_doc("<f4", [2], b"\0" * 8, code=2),  # a scalar must be 0-d
        msgpack.packb(Ext(4, msgpack.packb([[3], [1, 2]]))),  # object array: 3 != 2 items
        msgpack.packb(Ext(4, msgpack.packb([[2**40], []]))),
        msgpack.packb(Ext(3, msgpack.packb({"a": 1}))),  # a tuple payload must be a list
        msgpack.packb(Ext(6, msgpack.packb(["defaultdict", ["eval", {}]]))),  # unknown factory
        msgpack.packb(Ext(6, msgpack.packb(["SampleBatch", 3]))),
        msgpack.packb(Ext(6, msgpack.packb(["nope", None]))),
        msgpack.packb(Ext(6, msgpack.packb(["set", [[1]]]))),  # unhashable items
        msgpack.packb(Ext(5, msgpack.packb(["Box", 0.0, 1.0, [2], "|O"]))),
        msgpack.packb(Ext(5, msgpack.packb(["Box", "a", 1.0, [2], "<f4"]))),
        msgpack.packb(Ext(5, msgpack.packb(["Discrete", 2.5, 0, "<i4"]))),
        msgpack.packb(Ext(5, msgpack.packb(["Dict", {"a": 1}]))),
        msgpack.packb(Ext(5, msgpack.packb(["Tuple", [1]]))),
        msgpack.packb(Ext(5, msgpack.packb(["Shell"]))),
        msgpack.packb(Ext(5, b"")),  # an empty payload
        msgpack.packb(Ext(3, msgpack.packb([1]) + b"\x01")),  # a payload with extra bytes
        b"\xd6\xff\0\0\0\0",  # msgpack's timestamp (ext type -1): not ours
        msgpack.packb(Ext(42, b"")),
        msgpack.packb([1, 2])[:-1],  # truncated
        msgpack.packb([1]) + b"\x01",  # extra bytes after the document
        b"\xc1",  # the byte msgpack never uses
        b"\xdd\xff\xff\xff\xff",  # an array of 2**32 - 1 items in 5 bytes
        b"\xdb\xff\xff\xff\xff",  # a 4 GB string in 5 bytes
        b"",
    ]
    for doc in cases:
        with pytest.raises(ValueError) as info:
            unpackb(doc)
        assert isinstance(info.value, DecodeError), (doc, info.value)


def test_array_budget():
    doc = packb({"a": np.zeros(100, np.float32), "b": np.zeros(100, np.uint8)})
    assert unpackb(doc, max_array_bytes=500)["a"].shape == (100,)
    with pytest.raises(DecodeError, match="max_array_bytes"):
        unpackb(doc, max_array_bytes=499)


def test_per_array_limit_caps_each_array_not_their_sum():
    doc = packb([np.zeros(100, np.float32)] * 50)  # 50 arrays of 400 bytes: 20 kB in all
    assert len(unpackb(doc, max_bytes_per_array=400)) == 50
    with pytest.raises(DecodeError, match="max_bytes_per_array"):
        unpackb(doc, max_bytes_per_array=399)


# -- scanning: agrees with msgpack's own parser ------------------------------------------

plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=40)
    | st.binary(max_size=300),
    lambda children: (
        st.lists(children, max_size=20) | st.dictionaries(st.text(max_size=5), children, max_size=8)
    ),
    max_leaves=25,
)


def depth_of(x) -> int:
    if isinstance(x, list):
        return 1 + max(map(depth_of, x), default=0)
    if isinstance(x, dict):
        return 1 + max(map(depth_of, x.values()), default=0)
    return 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plain, plain)
def test_scan_finds_the_end_msgpack_finds(a, b):
    da, db = msgpack.packb(a), msgpack.packb(b)
    reference = msgpack.Unpacker(io.BytesIO(da + db), raw=False, strict_map_key=False)
    reference.unpack()
    assert scan(da + db) == reference.tell() == len(da)
    assert scan(da + db, len(da)) == len(da) + len(db)
    depth = depth_of(a)
    assert unpackb(da, max_depth=max(depth, 1)) == a
    if depth:
        with pytest.raises(DecodeError, match="deeper"):
            scan(da, max_depth=depth - 1)
    for cut in {0, len(da) // 2, len(da) - 1} - {len(da)}:
        with pytest.raises(TruncatedDataError):
            scan(da[:cut])


# -- fuzz: hostile bytes are a value or a DecodeError, in bounded memory ----------------


def corpus():
    values = [*hand_made_batches(), fixture_episode(), {"obs": np.ones((3, 2)), "k": (1, "x")}]
    values.append({"space": sp.Dict({"a": sp.Box(-1.0, 1.0, (3,)), "b": sp.Discrete(4)})})
    return [packb(v) for v in values]


DOCS = corpus()


def decode_bounded(doc: bytes, objects: bool) -> None:
    tracemalloc.start()
    try:
        unpackb(doc, objects=objects)
    except ValueError as e:
        assert isinstance(e, DecodeError), repr(e)
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < 200 * len(doc) + (1 << 20), (peak, len(doc))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(range(len(DOCS))),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=4),
    st.booleans(),
)
def test_mutated_documents_decode_or_raise_decode_error(which, flips, objects):
    doc = bytearray(DOCS[which])
    for at, xor in flips:
        doc[at % len(doc)] ^= xor
    decode_bounded(bytes(doc), objects)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.booleans())
def test_random_bytes_decode_or_raise_decode_error(data, objects):
    decode_bounded(data, objects)


# -- round trips -------------------------------------------------------------------------


def test_everything_encodable_round_trips_exactly():
    values = [
        *hand_made_batches(),
        fixture_episode(),
        {(1, "a"): [1, 2.5, None, True, "s", b"b"], 3: {"x": ()}},
        defaultdict(list, {"a": [1]}),
        {1, 2, 3},
        [np.float16(1.5), np.int8(-3), np.uint64(2**64 - 1), np.bool_(True), np.complex64(1j)],
        np.array(["a", "bc"]),
        np.array([b"x", b"yz"]),
        np.arange(6, dtype=np.float64).reshape(2, 3).T,  # not C-contiguous
        np.zeros((0, 3), np.int32),
        np.array(["2024-01-01"], dtype="M8[ns]"),
        np.array([1, 2], dtype="m8[s]"),
        np.array([1.0, 2.0], dtype=np.longdouble),
        np.array([[None, {"a": 1}], [[1, 2], (3,)]], dtype=object),
        jnp.arange(4, dtype=jnp.int32),
        sp.Box(-np.inf, np.inf, (2, 2), np.float32),
        sp.Box(0, 10, (3,), np.int64),
        sp.Discrete(5, start=-2),
        sp.MultiDiscrete(np.array([2, 3])),
        sp.Tuple([sp.Discrete(2), sp.Dict({"a": sp.Box(0.0, 1.0, (1,))})]),
    ]
    for v in values:
        back = unpackb(packb(v))
        if isinstance(v, sp.Space):
            assert back == v and type(back) is type(v)
        elif isinstance(v, jax.Array):
            assert_same(np.asarray(v), back)
        else:
            assert_same(v, back)
    assert unpackb(packb({"obs": np.ones(3)}), objects=False)["obs"].tolist() == [1.0] * 3


def test_encoder_output_is_unchanged(tmp_path):
    """The version-1 fixture was written by the codec before these changes: re-encoding
    what it decodes must give the same bytes (servers and old logs interoperate)."""
    with open(os.path.join(ROOT, "tests", "data", "offline_v1.msgpack"), "rb") as f:
        data = f.read()
    pos, docs = 0, []
    while pos < len(data):
        end = scan(data, pos)
        docs.append(data[pos:end])
        pos = end
    assert len(docs) == 6  # the header and five records
    for doc in docs:
        assert packb(unpackb(doc)) == doc


def test_unpacker_streams_documents_with_offsets():
    docs = [packb(x) for x in (1, {"a": np.zeros(50000)}, "end")]
    stream = unpacker(io.BytesIO(b"".join(docs)))
    out = []
    for x in stream:
        out.append(x)
    assert out[0] == 1 and out[2] == "end" and out[1]["a"].shape == (50000,)
    assert stream.offset == sum(map(len, docs))
    cut = unpacker(io.BytesIO(b"".join(docs)[:-2]))
    assert next(cut) == 1
    next(cut)
    with pytest.raises(TruncatedDataError, match=f"at byte {len(docs[0]) + len(docs[1])}"):
        next(cut)
    with pytest.raises(DecodeError, match="refusing a space"):
        next(unpacker(io.BytesIO(packb(sp.Discrete(2))), objects=False))


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["<f4", "<i8", "|u1", "|b1", "<U3", "|S2", "<c8", "<M8[s]", "|O", "<V4"]),
    st.lists(st.integers(-(2**63), 2**64 - 1) | st.integers(0, 6), max_size=4),
    st.integers(0, 64),
    st.sampled_from([1, 2]),
    st.booleans(),
)
def test_hostile_array_declarations(dtype, shape, nbytes, code, request_side):
    """Any declared dtype/shape against any byte count: the exact array, or DecodeError,
    and never more memory than the input justifies."""
    doc = array_doc(dtype, shape, bytes(nbytes), code=code)
    decode_bounded(doc, objects=not request_side)
    try:
        out = unpackb(doc, objects=not request_side)
    except DecodeError:
        return
    if code == 2 and np.dtype(dtype).kind in "US":
        # a fixed-width string scalar keeps its value, not its width (numpy's str_ /
        # bytes_ drop trailing NULs), so compare with numpy's own scalar of those bytes
        ref = np.frombuffer(bytes(nbytes), np.dtype(dtype)).reshape(shape)[()]
        assert out == ref and type(out) is type(ref)
        return
    a = np.asarray(out)
    assert a.nbytes == nbytes and a.dtype == np.dtype(dtype) and list(a.shape) == shape
    assert code == 1 or shape == []


_ARRAYS = [
    np.float32(1.5),
    np.int64(3),
    np.bool_(True),
    np.str_("xy"),
    np.str_(""),  # (its own dtype is <U0, which the decoder refuses: encoded as <U1)
    np.bytes_(b""),
    np.datetime64("2020-01-01"),
    np.zeros(()),
    np.arange(7, dtype=np.int8),
    np.zeros((3, 300), np.float32),
    np.zeros((2, 3, 4), ">f8")[:, ::2],  # big-endian, not contiguous
    np.zeros((0, 5)),
    np.array(["ab", "c"]),
    np.zeros(255, np.uint8),  # bin8 / bin16 / bin32 boundaries
    np.zeros(256, np.uint8),
    np.zeros(65535, np.uint8),
    np.zeros(65536, np.uint8),
]


@pytest.mark.parametrize("a", _ARRAYS, ids=lambda a: f"{np.asarray(a).dtype}{np.shape(a)}")
def test_array_encoding_is_msgpacks_own_byte_for_byte(a):
    # The reference: the payload written by msgpack itself ([dtype str, shape, C-order
    # bytes]) inside the ext type; the codec's cached-head path must give the same bytes.
    arr = np.asarray(a)
    payload = msgpack.packb(
        [arr.dtype.str, list(arr.shape), np.ascontiguousarray(arr).tobytes()], use_bin_type=True
    )
    code = 2 if isinstance(a, np.generic) else 1
    want = msgpack.packb(msgpack.ExtType(code, payload), use_bin_type=True)
    assert packb(a) == want
    assert packb(a) == want  # (second time: from the cached head)
    back = unpackb(packb(a))
    np.testing.assert_array_equal(back, arr)
    assert np.asarray(back).dtype == arr.dtype


def test_array_heads_cache_is_bounded_and_stays_right():
    from jaxsampler.episodes import codec

    for n in range(codec._MAX_HEADS + 10):
        x = np.zeros((1, n % 3000 + 1, n // 3000 + 1), np.uint8)
        assert np.array_equal(unpackb(packb(x)), x)
    assert len(codec._HEADS) <= codec._MAX_HEADS
