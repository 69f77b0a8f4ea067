"""Spaces: sampling, membership, hashing, conversions and constructor errors.

Membership of samples is checked twice: with ``space.contains`` and with an independent
numpy comparison against the stored bounds, so a wrong ``contains`` cannot hide a wrong
``sample``. Range coverage uses sample sizes whose failure probability is negligible
(stated next to each check). Conversions are compared against spaces built directly
with gymnasium / gymnax, not only round-tripped through our own code.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxsampler import spaces as S

gs = pytest.importorskip("gymnasium.spaces")
gx = pytest.importorskip("gymnax.environments.spaces")

KEY = jax.random.key(0)
F32_MAX = float(np.finfo(np.float32).max)


N = 1000  # the batch every coverage check draws


# Spaces are hashable, so they go to jit as static arguments: one compile per
# (space, batch shape) instead of one per eager op.
@functools.partial(jax.jit, static_argnums=(0, 2))
def _draw(space, key, batch_shape):
    """``(sample(key), contains(it), sample_batch(key, batch_shape), all contained)``."""
    one = space.sample(key)
    batch = space.sample_batch(key, batch_shape)
    n = int(np.prod(batch_shape))
    flat = jax.tree.map(lambda a: a.reshape((n,) + a.shape[len(batch_shape) :]), batch)
    return one, space.contains(one), batch, jnp.all(jax.vmap(space.contains)(flat))


@functools.partial(jax.jit, static_argnums=0)
def _contains(space, x):
    return space.contains(x)


def _batch(space, batch_shape=(N,)):
    one, one_in, batch, all_in = _draw(space, KEY, batch_shape)
    assert bool(one_in) and bool(all_in)
    return batch


def _np_inside(space: S.Box, x) -> bool:
    """Independent membership test for a Box (numpy, no jaxsampler code)."""
    x = np.asarray(x)
    return bool(np.all(x >= space.low) & np.all(x <= space.high))


# --------------------------------------------------------------------------- Box


BOXES = {
    "bounded": S.Box(-2.0, 6.0, (3,)),
    "per_element": S.Box(np.array([-1.0, 0.0, 10.0]), np.array([1.0, 0.5, 11.0])),
    "unbounded": S.Box(-np.inf, np.inf, (4,)),
    "low_only": S.Box(1.5, np.inf, (4,)),
    "high_only": S.Box(-np.inf, -3.0, (4,)),
    "mixed": S.Box(np.array([0.0, -np.inf, -np.inf, 2.0]), np.array([1.0, 5.0, np.inf, np.inf])),
    "int": S.Box(-3, 3, (2,), np.int32),
    "degenerate": S.Box(2.0, 2.0, (2,)),
}


@pytest.mark.parametrize("name", sorted(BOXES))
def test_box_sample_in_space(name):
    space = BOXES[name]
    one, one_in, xs, all_in = _draw(space, KEY, (N,))
    assert one.shape == space.shape and one.dtype == space.dtype
    assert bool(one_in) and _np_inside(space, one)
    assert xs.shape == (N,) + space.shape and xs.dtype == space.dtype
    assert bool(all_in) and _np_inside(space, xs)
    assert np.all(np.isfinite(np.asarray(xs, np.float64)))


def test_box_sample_batch_multi_dim_batch():
    space = BOXES["mixed"]
    one, _, xs, all_in = _draw(space, KEY, (5, 7))
    assert xs.shape == (5, 7, 4) and xs.dtype == np.float32
    assert bool(all_in) and _np_inside(space, xs)
    # 35 distinct draws, not one draw broadcast.
    assert np.unique(np.asarray(xs)[..., 0]).size == 35


def test_box_uniform_covers_range():
    x = np.asarray(_batch(BOXES["bounded"]), np.float64).ravel()
    # Uniform(-2, 6): mean 2, sd 8/sqrt(12) ~ 2.31; sd of the mean over 3000 draws ~ 0.042.
    assert abs(x.mean() - 2.0) < 0.2
    assert abs(x.std() - 8 / np.sqrt(12)) < 0.1
    assert x.min() < -1.9 and x.max() > 5.9
    # Each quarter of the interval gets about a quarter of the samples.
    counts = np.histogram(x, bins=4, range=(-2, 6))[0]
    assert np.all(np.abs(counts / x.size - 0.25) < 0.03)


def test_box_per_element_bounds_are_respected_and_covered():
    space = BOXES["per_element"]
    x = np.asarray(_batch(space))
    for i in range(3):
        lo, hi = space.low[i], space.high[i]
        assert x[:, i].min() >= lo and x[:, i].max() <= hi
        assert x[:, i].min() < lo + 0.05 * (hi - lo) and x[:, i].max() > hi - 0.05 * (hi - lo)


def test_box_unbounded_and_half_bounded_spread():
    x = np.asarray(_batch(BOXES["unbounded"]))
    assert (x > 0).mean() > 0.3 and (x < 0).mean() > 0.3  # both signs
    lo = np.asarray(_batch(BOXES["low_only"]))
    assert lo.min() >= 1.5 and np.unique(lo).size > 100  # not stuck at the bound
    hi = np.asarray(_batch(BOXES["high_only"]))
    assert hi.max() <= -3.0 and np.unique(hi).size > 100
    mixed = np.asarray(_batch(BOXES["mixed"]))
    assert mixed[:, 0].min() >= 0 and mixed[:, 0].max() <= 1
    assert mixed[:, 1].max() <= 5 and mixed[:, 3].min() >= 2
    assert (mixed[:, 2] < 0).any() and (mixed[:, 2] > 0).any()


def test_box_int_covers_all_values():
    x = np.asarray(_batch(BOXES["int"]))
    assert x.dtype == np.int32
    # P(a given value of 7 is missing among 2000 draws) ~ (6/7)^2000: negligible.
    assert set(np.unique(x).tolist()) == set(range(-3, 4))


def test_box_degenerate_samples_the_point():
    assert np.all(np.asarray(_batch(BOXES["degenerate"])) == 2.0)


@pytest.mark.parametrize(
    "low,high,dtype",
    [(0, 255, np.uint8), (-128, 127, np.int8), (0, np.iinfo(np.int32).max, np.int32)],
    ids=["uint8", "int8", "int32"],
)
def test_box_int_full_dtype_range_is_sampled(low, high, dtype):
    space = S.Box(low, high, (), dtype)
    x = np.asarray(_draw(space, KEY, (2000,))[2], np.float64)
    assert _np_inside(space, x)
    # Uniform over the whole dtype range: the sample mean is near the midpoint.
    mid, width = (float(low) + float(high)) / 2, float(high) - float(low)
    assert abs(x.mean() - mid) < 0.05 * width


@pytest.mark.parametrize("which", ["f32_max", "gymnax_cartpole_obs"])
def test_box_sample_with_float32_extreme_bounds(which):
    if which == "f32_max":
        space = S.Box(-F32_MAX, F32_MAX, ())
    else:
        import gymnax

        env, params = gymnax.make("CartPole-v1")
        space = S.from_gymnax_space(env.observation_space(params))
    x = np.asarray(_draw(space, KEY, (64,))[2])
    assert np.all(np.isfinite(x))
    assert _np_inside(space, x)


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
def test_box_int_infinite_bound():
    try:
        space = S.Box(0, np.inf, (3,), np.int32)
    except ValueError:
        return  # rejecting infinite integer bounds is also acceptable
    assert np.all(space.high >= space.low)
    assert bool(space.contains(np.array([0, 1, 1000], np.int32)))


def test_box_contains_rejects():
    space = S.Box(-1.0, 1.0, (2,))
    assert bool(space.contains(np.array([0.0, 1.0], np.float32)))
    assert not bool(space.contains(np.array([0.0, 1.01], np.float32)))
    assert not bool(space.contains(np.array([-1.01, 0.0], np.float32)))
    assert not bool(space.contains(np.array([0.0, np.nan], np.float32)))
    assert not bool(space.contains(np.zeros((3,), np.float32)))  # wrong shape
    assert not bool(space.contains(np.zeros((1, 2), np.float32)))  # no broadcasting
    assert not bool(space.contains(np.float32(0.0)))
    half = BOXES["low_only"]
    assert bool(half.contains(np.full((4,), 1e30, np.float32)))
    assert not bool(half.contains(np.full((4,), 1.4, np.float32)))


def test_box_repr_and_bounds_are_read_only():
    space = S.Box(0.0, 1.0, (2,))
    assert repr(space) == "Box(0.0, 1.0, (2,), float32)"
    with pytest.raises(ValueError):
        space.low[0] = 5.0
    assert space.low.dtype == np.float32 and space.is_bounded
    assert not BOXES["low_only"].is_bounded


# --------------------------------------------------------------------------- discrete


def test_discrete_sample_covers_range_with_start():
    space = S.Discrete(3, start=2)
    one, one_in, xs, all_in = _draw(space, KEY, (N,))
    assert one.shape == () and one.dtype == np.int32 and bool(one_in)
    x = np.asarray(xs)
    assert x.dtype == np.int32 and x.shape == (N,) and bool(all_in)
    assert set(np.unique(x).tolist()) == {2, 3, 4}
    # Roughly uniform: each value ~333 +- 15 (sd); 5 sd band.
    counts = np.bincount(x - 2, minlength=3)
    assert np.all(np.abs(counts - N / 3) < 75)


def test_discrete_contains():
    space = S.Discrete(3, start=2)
    for v, ok in [(1, False), (2, True), (4, True), (5, False)]:
        assert bool(space.contains(np.int32(v))) is ok, v
    assert not bool(space.contains(np.float32(3.0)))  # non-integer dtype
    assert not bool(space.contains(np.array(3.0)))
    assert not bool(space.contains(np.array([3], np.int32)))  # wrong shape
    assert not bool(space.contains(np.bool_(True)))


def test_multidiscrete_sample_and_contains():
    space = S.MultiDiscrete([2, 3, 5])
    one, one_in, xs, all_in = _draw(space, KEY, (N,))
    assert one.shape == (3,) and bool(one_in) and bool(all_in)
    xs = np.asarray(xs)
    assert xs.shape == (N, 3) and xs.dtype == np.int32
    for i, n in enumerate([2, 3, 5]):
        # P(some value of 5 missing in 1000 draws) < 5 * 0.8^1000: negligible.
        assert set(np.unique(xs[:, i]).tolist()) == set(range(n))
    assert not bool(space.contains(np.array([1, 2, 5], np.int32)))  # out of range
    assert not bool(space.contains(np.array([-1, 0, 0], np.int32)))
    assert not bool(space.contains(np.array([1.0, 2.0, 4.0], np.float32)))  # float dtype
    assert not bool(space.contains(np.array([1, 2], np.int32)))  # wrong shape


# --------------------------------------------------------------------------- composite


DICT = S.Dict(
    pos=S.Box(-1.0, 1.0, (2,)),
    mode=S.Discrete(4),
    sub=S.Tuple([S.MultiDiscrete([3, 2]), S.Box(0, 5, (), np.int32)]),
)


def test_dict_and_tuple_sample_in_space():
    x, x_in, xs, all_in = _draw(DICT, KEY, (4, 3))
    assert set(x) == {"mode", "pos", "sub"}
    assert list(DICT.spaces) == ["mode", "pos", "sub"]  # sorted keys
    assert x["pos"].shape == (2,) and x["pos"].dtype == np.float32
    assert x["mode"].shape == () and x["mode"].dtype == np.int32
    assert isinstance(x["sub"], tuple) and x["sub"][0].shape == (2,)
    assert bool(x_in) and bool(_contains(DICT["pos"], x["pos"]))
    assert xs["pos"].shape == (4, 3, 2) and xs["sub"][1].shape == (4, 3)
    assert bool(all_in)
    # Independent check of the sub-space samples.
    assert np.all(np.abs(np.asarray(xs["pos"])) <= 1)
    assert np.all((np.asarray(xs["mode"]) >= 0) & (np.asarray(xs["mode"]) < 4))


def test_sub_spaces_get_independent_keys():
    box = S.Box(0.0, 1.0, (8,))
    space = S.Tuple([S.Dict(a=box, b=box), box])
    (d, t1) = jax.jit(space.sample)(KEY)
    draws = [np.asarray(d["a"]), np.asarray(d["b"]), np.asarray(t1)]
    assert all(not np.array_equal(draws[i], draws[j]) for i in range(3) for j in range(i))


def test_composite_contains_rejects():
    x = _draw(DICT, KEY, (4, 3))[0]
    assert not bool(_contains(DICT, {k: v for k, v in x.items() if k != "mode"}))  # missing key
    assert not bool(_contains(DICT, {**x, "extra": jnp.int32(0)}))
    assert not bool(_contains(DICT, {**x, "mode": jnp.int32(4)}))  # out of range
    assert not bool(_contains(DICT, {**x, "pos": jnp.zeros((3,))}))  # wrong shape
    assert not bool(_contains(DICT, [x["mode"], x["pos"], x["sub"]]))  # not a mapping
    tup = DICT["sub"]
    assert bool(_contains(tup, list(x["sub"])))
    assert not bool(_contains(tup, x["sub"][:1]))
    assert not bool(_contains(tup, (x["sub"][0], jnp.int32(6))))
    assert len(tup) == 2 and tup[0] == S.MultiDiscrete([3, 2])


def test_zeros():
    z = DICT.zeros()
    assert z["pos"].shape == (2,) and z["pos"].dtype == np.float32
    assert z["sub"][0].dtype == np.int32
    assert S.Discrete(3).zeros().shape == ()


# --------------------------------------------------------------------------- jit / vmap


@pytest.mark.parametrize(
    "space", [BOXES["mixed"], S.Discrete(5, start=1), DICT], ids=["box", "discrete", "dict"]
)
def test_sample_under_jit_and_vmap(space):
    eager = space.sample(KEY)
    jitted = jax.jit(space.sample)(KEY)
    chex_equal = jax.tree.map(
        lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), eager, jitted
    )
    assert all(jax.tree.leaves(chex_equal))
    keys = jax.random.split(KEY, 6)
    batch, inside = jax.jit(
        lambda k: (jax.vmap(space.sample)(k), jax.vmap(space.contains)(jax.vmap(space.sample)(k)))
    )(keys)
    assert inside.shape == (6,) and bool(jnp.all(inside))
    one = space.sample(keys[5])  # vmapped draws equal the per-key draws
    same = jax.tree.map(lambda b, o: np.array_equal(np.asarray(b)[5], np.asarray(o)), batch, one)
    assert all(jax.tree.leaves(same))
    assert not all(jax.tree.leaves(jax.tree.map(lambda b: np.array_equal(b[0], b[5]), batch)))


# --------------------------------------------------------------------------- hashing


def test_equality_and_hash():
    a = S.Box(0.0, 1.0, (2,))
    b = S.Box(np.zeros(2), np.ones(2))
    assert a == b and hash(a) == hash(b)
    assert a != S.Box(0.0, 2.0, (2,))
    assert a != S.Box(0.0, 1.0, (3,))
    assert a != S.Box(0, 1, (2,), np.int32)
    assert S.Discrete(3) == S.Discrete(3) and hash(S.Discrete(3)) == hash(S.Discrete(3))
    assert S.Discrete(3) != S.Discrete(3, start=1) and S.Discrete(3) != S.Discrete(4)
    assert S.Discrete(2) != S.MultiDiscrete([2])
    assert S.MultiDiscrete([2, 3]) == S.MultiDiscrete(np.array([2, 3]))
    assert S.MultiDiscrete([2, 3]) != S.MultiDiscrete([3, 2])
    d1 = S.Dict(a=S.Discrete(2), b=a)
    d2 = S.Dict({"b": b, "a": S.Discrete(2)})
    assert d1 == d2 and hash(d1) == hash(d2)
    assert d1 != S.Dict(a=S.Discrete(3), b=a)
    assert S.Tuple([a, S.Discrete(2)]) == S.Tuple((b, S.Discrete(2)))
    assert S.Tuple([a, S.Discrete(2)]) != S.Tuple([S.Discrete(2), a])
    table = {a: "box", S.Discrete(3): "d3", d1: "dict"}
    assert table[b] == "box" and table[S.Discrete(3)] == "d3" and table[d2] == "dict"
    assert S.Discrete(4) not in table


def test_space_as_static_jit_arg_does_not_retrace():
    traces = []

    @functools.partial(jax.jit, static_argnums=0)
    def draw(space, key):
        traces.append(space)
        return space.sample(key)

    for _ in range(3):
        draw(S.Box(0.0, 1.0, (2,)), KEY)  # a fresh, equal space each call
        draw(S.Box(np.zeros(2), np.ones(2)), jax.random.key(1))
    assert len(traces) == 1
    draw(S.Box(0.0, 2.0, (2,)), KEY)  # different bounds: a new trace
    assert len(traces) == 2
    draw(S.Dict(a=S.Discrete(2)), KEY)
    draw(S.Dict({"a": S.Discrete(2)}), KEY)
    assert len(traces) == 3


# --------------------------------------------------------------------------- conversions


GYM_PAIRS = [
    (S.Box(-1.0, 2.0, (3,)), gs.Box(-1.0, 2.0, (3,), np.float32)),
    (
        S.Box(np.array([0.0, -np.inf]), np.array([1.0, np.inf])),
        gs.Box(np.array([0.0, -np.inf], np.float32), np.array([1.0, np.inf], np.float32)),
    ),
    (S.Box(0, 255, (2, 2), np.uint8), gs.Box(0, 255, (2, 2), np.uint8)),
    (S.Discrete(3, start=2), gs.Discrete(3, start=2)),
    (S.MultiDiscrete([2, 4]), gs.MultiDiscrete([2, 4])),
    (
        S.Dict(a=S.Discrete(2), b=S.Tuple([S.Box(0.0, 1.0, (2,)), S.Dict(c=S.Discrete(5))])),
        gs.Dict(
            {
                "a": gs.Discrete(2),
                "b": gs.Tuple([gs.Box(0.0, 1.0, (2,), np.float32), gs.Dict({"c": gs.Discrete(5)})]),
            }
        ),
    ),
]


@pytest.mark.parametrize(
    "ours,theirs",
    GYM_PAIRS,
    ids=["box", "box_inf", "box_uint8", "discrete", "multidiscrete", "nested"],
)
def test_gymnasium_round_trip(ours, theirs):
    assert ours.to_gymnasium() == theirs
    assert S.from_gymnasium_space(theirs) == ours
    assert S.convert_space(theirs) == ours
    assert S.from_gymnasium_space(ours.to_gymnasium()) == ours


def test_gymnasium_box_details():
    g = S.Box(np.array([0.0, -np.inf]), np.array([1.0, np.inf])).to_gymnasium()
    assert g.dtype == np.float32 and g.shape == (2,)
    np.testing.assert_array_equal(g.low, [0.0, -np.inf])
    np.testing.assert_array_equal(g.high, [1.0, np.inf])
    d = S.Discrete(3, start=-1).to_gymnasium()
    assert d.n == 3 and d.start == -1


def test_from_gymnasium_errors():
    with pytest.raises(ValueError, match="start"):
        S.from_gymnasium_space(gs.MultiDiscrete([2, 3], start=[1, 0]))
    with pytest.raises(TypeError, match="Text"):
        S.from_gymnasium_space(gs.Text(5))


GYMNAX_PAIRS = [
    (gx.Discrete(4), S.Discrete(4)),
    (gx.Box(0.0, 1.0, (2, 3)), S.Box(0.0, 1.0, (2, 3))),
    (
        gx.Box(jnp.array([-1.0, -2.0]), jnp.array([1.0, 2.0]), (2,), jnp.float32),
        S.Box(np.array([-1.0, -2.0]), np.array([1.0, 2.0])),
    ),
    (gx.Box(0, 10, (3,), jnp.int32), S.Box(0, 10, (3,), np.int32)),
    (
        gx.Dict({"x": gx.Discrete(2), "y": gx.Tuple([gx.Box(-1.0, 1.0, (1,)), gx.Discrete(3)])}),
        S.Dict(x=S.Discrete(2), y=S.Tuple([S.Box(-1.0, 1.0, (1,)), S.Discrete(3)])),
    ),
]


@pytest.mark.parametrize(
    "theirs,ours", GYMNAX_PAIRS, ids=["discrete", "box", "box_array", "box_int", "nested"]
)
def test_from_gymnax(theirs, ours):
    assert S.from_gymnax_space(theirs) == ours
    assert S.convert_space(theirs) == ours
    # Independent route: gymnax's own conversion to gymnasium, then ours from gymnasium.
    assert S.from_gymnasium_space(gx.gymnax_space_to_gym_space(theirs)) == ours


def test_convert_space_identity_and_errors():
    space = S.Discrete(2)
    assert S.convert_space(space) is space
    with pytest.raises(TypeError, match="cannot convert"):
        S.convert_space(object())
    with pytest.raises(TypeError):
        S.from_gymnax_space(gs.Discrete(2))


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "build,exc",
    [
        (lambda: S.Discrete(0), ValueError),
        (lambda: S.Discrete(-2), ValueError),
        (lambda: S.Box(1.0, 0.0, (2,)), ValueError),
        (lambda: S.Box(np.array([0.0, 2.0]), np.array([1.0, 1.0])), ValueError),
        (lambda: S.Box(np.zeros(2), np.ones(3)), ValueError),
        (lambda: S.Box(np.zeros(2), 1.0, (3,)), ValueError),
        (lambda: S.MultiDiscrete([]), ValueError),
        (lambda: S.MultiDiscrete([2, 0]), ValueError),
        (lambda: S.Dict(a=S.Discrete(2), b=3), TypeError),
        (lambda: S.Dict({"a": gs.Discrete(2)}), TypeError),
        (lambda: S.Tuple([S.Discrete(2), "x"]), TypeError),
    ],
    ids=[
        "n0",
        "n_neg",
        "low_gt_high",
        "low_gt_high_elem",
        "shape_mismatch",
        "shape_arg",
        "md_empty",
        "md_zero",
        "dict_int",
        "dict_gym",
        "tuple_str",
    ],
)
def test_constructor_errors(build, exc):
    with pytest.raises(exc):
        build()


# --------------------------------------------------------------------------- property


# No subnormal bounds: XLA's CPU backend flushes subnormals to zero, so a box whose bound is
# 2.65e-43 samples 0.0 there (outside it) whatever the sampler does.
_BOUND = st.floats(-1e6, 1e6, allow_nan=False, allow_subnormal=False, width=32)


@st.composite
def _boxes(draw):
    # One element shape: eager ops compile once per shape, and the bounds are what vary.
    shape, n = (2, 3), 6
    if draw(st.booleans()):  # integer box with finite bounds
        a = np.array(draw(st.lists(st.integers(-1000, 1000), min_size=n, max_size=n)))
        b = np.array(draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n)))
        return S.Box(a.reshape(shape), (a + b).reshape(shape), shape, np.int32)
    a = np.array(draw(st.lists(_BOUND, min_size=n, max_size=n)), np.float32)
    w = np.array(
        draw(st.lists(st.floats(0, 1e6, allow_subnormal=False, width=32), min_size=n, max_size=n)),
        np.float32,
    )
    kind = np.array(
        draw(st.lists(st.sampled_from(["both", "lo", "hi", "none"]), min_size=n, max_size=n))
    )
    low = np.where((kind == "both") | (kind == "lo"), a, -np.inf)
    high = np.where((kind == "both") | (kind == "hi"), a.astype(np.float64) + w, np.inf)
    return S.Box(low.reshape(shape), high.reshape(shape), shape, np.float32)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(space=_boxes(), seed=st.integers(0, 2**31 - 1))
def test_box_samples_always_contained(space, seed):
    key = jax.random.key(seed)
    xs = space.sample_batch(key, (16,))
    assert xs.shape == (16,) + space.shape and xs.dtype == space.dtype
    assert _np_inside(space, xs)
    assert np.all(np.isfinite(np.asarray(xs, np.float64)))
    assert bool(jnp.all(jax.vmap(space.contains)(xs)))
    assert bool(space.contains(space.sample(key)))


# -- host-side validation: check_value / ValueChecker --------------------------------------


class _Bad(ValueError):
    pass


def test_check_value_casts_within_a_kind_and_names_the_problem():
    box = S.Box(-1.0, 1.0, (2,))
    got = S.check_value([0.5, 2.0], box, "obs")  # bounds are not enforced (as in Gymnasium)
    assert got.dtype == np.float32 and got.tolist() == [0.5, 2.0]
    with pytest.raises(
        ValueError, match=r"obs shape \(3,\) does not match .*expected shape \(2,\)"
    ):
        S.check_value(np.zeros(3), box, "obs")
    with pytest.raises(_Bad, match="obs: dtype complex128 cannot be cast to float32"):
        S.check_value(np.zeros(2, complex), box, "obs", error=_Bad)
    with pytest.raises(ValueError, match="float64 cannot be cast to int32"):
        S.check_value(1.5, S.Discrete(3), "act")
    assert S.check_value(np.int64(2), S.Discrete(3), "act").dtype == np.int32
    with pytest.raises(ValueError, match=r"act: 3 outside Discrete\(3"):
        S.check_value(3, S.Discrete(3), "act")
    with pytest.raises(ValueError, match="outside MultiDiscrete"):
        S.check_value([1, 5], S.MultiDiscrete([2, 5]), "act")
    with pytest.raises(ValueError, match="contains NaN"):
        S.check_value([np.nan, 0.0], box, "obs")
    with pytest.raises(ValueError, match="infinite value"):
        S.check_value([np.inf, 0.0], box, "obs")


def test_check_value_walks_dicts_and_tuples():
    space = S.Dict({"a": S.Discrete(2), "b": S.Tuple([S.Box(0.0, 1.0, (1,)), S.Discrete(4)])})
    got = S.check_value({"a": 1, "b": ([0.5], 3)}, space, "obs")
    assert got["a"] == 1 and isinstance(got["b"], tuple) and got["b"][0].dtype == np.float32
    with pytest.raises(ValueError, match=r"obs: expected a dict with keys \['a', 'b'\]"):
        S.check_value({"a": 1}, space, "obs")
    with pytest.raises(ValueError, match=r"obs\['b'\]: expected a sequence of 2 items"):
        S.check_value({"a": 1, "b": [0.5]}, space, "obs")
    with pytest.raises(ValueError, match=r"obs\['b'\]\[1\]: 9 outside Discrete"):
        S.check_value({"a": 1, "b": ([0.5], 9)}, space, "obs")


def test_without_values_only_structure_shapes_and_dtypes_are_checked():
    box = S.Box(-1.0, 1.0, (2,))
    x = np.array([np.nan, 5.0], np.float32)
    assert S.check_value(x, box, "obs", values=False) is x  # no copy, no value check
    assert S.check_value(7, S.Discrete(3), "act", values=False) == 7
    with pytest.raises(ValueError, match="shape"):
        S.check_value(np.zeros(3), box, "obs", values=False)


@pytest.mark.parametrize("values", [True, False])
def test_value_checker_agrees_with_check_value(values):
    spaces = [
        S.Box(-1.0, 1.0, (3,)),
        S.Box(np.array([-1.0, -np.inf]), np.array([1.0, np.inf])),
        S.Box(-np.inf, np.inf, (2,)),
        S.Box(0, 5, (2,), np.int32),
        S.Discrete(3),
    ]
    candidates = [
        np.zeros(3, np.float32),
        np.array([0.0, np.inf, 0.0], np.float32),
        np.array([np.nan, 0.0], np.float32),
        np.array([0.0, -np.inf], np.float32),
        np.array([np.inf, 0.0], np.float32),
        np.zeros(2, np.float64),
        np.array([1, 2], np.int32),
        np.int64(2),
        5,
        [0.0, 1.0],
    ]
    for space in spaces:
        check = S.ValueChecker(space, values=values, error=_Bad)
        for x in candidates:
            try:
                want = S.check_value(x, space, "v['k']", values=values, error=_Bad)
            except _Bad as e:
                with pytest.raises(_Bad) as info:
                    check(x, "v", "k")
                assert str(info.value) == str(e)
                continue
            got = check(x, "v", "k")
            np.testing.assert_array_equal(got, want)
            assert np.asarray(got).dtype == np.asarray(want).dtype
            if values and isinstance(x, np.ndarray):
                assert got is not x  # the caller's buffer is never kept


def test_integers_that_do_not_fit_the_dtype_are_refused_not_wrapped():
    """astype would wrap 2**32 + 1 to 1 in int32; a client's action or observation must be
    refused instead (found by a review: the policy server accepted it as action 1)."""
    from jaxsampler.spaces import Box, Discrete, check_value

    for x in (2**32 + 1, -(2**32) + 1, 2**64 - 1, np.int64(2**40)):
        with pytest.raises(ValueError, match="does not fit int32"):
            check_value(x, Discrete(2), "action")
    with pytest.raises(ValueError, match="does not fit"):
        check_value(np.array([2**31, 0], np.int64), Box(0, 10, (2,), np.int32), "obs")
    assert check_value(np.int64(1), Discrete(2), "action") == 1
    np.testing.assert_array_equal(
        check_value(np.array([3, 4], np.int64), Box(0, 10, (2,), np.int32), "obs"), [3, 4]
    )


def test_bool_box_samples_both_values_within_its_bounds():
    import jax
    import numpy as np

    from jaxsampler.spaces import Box

    space = Box(np.array([0, 0, 1]), np.array([1, 0, 1]), (3,), np.bool_)
    x = np.asarray(space.sample_batch(jax.random.PRNGKey(0), (2000,)))
    assert x.dtype == np.bool_
    assert 0.45 < x[:, 0].mean() < 0.55  # free entry: a fair coin
    assert not x[:, 1].any() and x[:, 2].all()  # pinned by the bounds
    assert bool(space.contains(space.sample(jax.random.PRNGKey(1))))
