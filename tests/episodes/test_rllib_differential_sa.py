"""jaxsampler's ``InfiniteLookbackBuffer`` / ``SingleAgentEpisode`` against RLlib 2.60's
own, on the same random calls.

Random programs (``tests/sa_differential.py``: buffers with and without lookback and
spaces, ``get`` with every index kind, ``fill``, ``one_hot_discrete``, ``set``,
``append``/``extend``/``pop``; episodes built empty or from lists, stepped, numpy'ized,
read, written, ``cut``, sliced and concatenated) run on both implementations; every
result must be equal (values, dtypes, container types; an error on one side only is a
difference), except where a call falls under one of the RLlib bugs noted as "RLlib
deviation" in ``jaxsampler.episodes.lookback`` and ``single_agent``. The unit tests below
pin each behaviour fixed to RLlib's, one by one, against RLlib itself.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxsampler.episodes.lookback import InfiniteLookbackBuffer
from tests.ma_differential import normalize
from tests.sa_differential import OurClasses, Program, call

rllib_buffer = pytest.importorskip(
    "ray.rllib.env.utils.infinite_lookback_buffer",
    reason="ray[rllib] is not installed (pip install -e '.[rllib]'): no RLlib to compare with",
)
warnings.filterwarnings("ignore", module="ray")
import gymnasium as gym  # noqa: E402  (after the skip: gymnasium comes with ray here)

RLlibBuffer = rllib_buffer.InfiniteLookbackBuffer


class _RLlib:
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    InfiniteLookbackBuffer = RLlibBuffer


RLLIB, OURS = _RLlib(), OurClasses()


def _report(p: Program) -> str:
    return "\n".join(f"{lbl}\n  rllib: {r}\n  ours:  {g}" for lbl, r, g in p.mismatches[:3])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_random_buffer_programs_give_rllibs_results(seed):
    p = Program(seed, RLLIB, OURS).run_buffer()
    assert p.counts["calls"] > 0
    assert not p.mismatches, _report(p)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_random_episode_programs_give_rllibs_results(seed):
    p = Program(seed, RLLIB, OURS).run_episode()
    assert p.counts["calls"] > 0
    assert not p.mismatches, _report(p)


# -- the behaviours fixed to RLlib's, one by one ----------------------------------------


def both(data, lookback=0, space=None, finalize=False):
    """The same buffer, RLlib's and ours."""
    out = []
    for cls in (RLlibBuffer, InfiniteLookbackBuffer):
        sp = None if space is None else space()
        b = cls(list(data), lookback, sp)
        if finalize:
            b.finalize()
        out.append(b)
    return out


def same(f, ref, got):
    r, g = call(lambda: f(ref)), call(lambda: f(got))
    assert (r[0] == "raise") == (g[0] == "raise"), (r, g)
    if r[0] == "ok":
        assert normalize(r[1]) == normalize(g[1]), (r, g)
    return g[1]


@pytest.mark.parametrize("finalize", [False, True])
@pytest.mark.parametrize(
    "index, want",
    [
        (slice(5, None), [-9, -9]),  # start past the end: |start - stop| fills
        (slice(4, 3), [-9]),  # a reversed range past the end, too
        (slice(-5, -7), [-9, -9]),  # and before the data
        (slice(1, -5), [-9]),  # stop before the data, start inside: -stop - 1 fills
        (slice(-10, 10), [-9] * 7 + [10, 11, 12]),  # start before: the left side only
    ],
)
def test_slices_outside_the_data_fill_as_rllib(index, want, finalize):
    ref, got = both([10, 11, 12], finalize=finalize)
    out = same(lambda b: b.get(index, fill=-9), ref, got)
    assert np.asarray(out).tolist() == want


def test_fill_only_slices_keep_the_spaces_dtype():
    """A numpy'ized float64 column padded with nothing but fill items gives the fill
    batch itself (the space's float32), as RLlib does; with data in it, the result is
    the concatenation (float64)."""
    box = lambda: gym.spaces.Box(-np.inf, np.inf, (), np.float32)
    ref, got = both([0.5, 1.5, 2.5], space=box, finalize=True)
    out = same(lambda b: b.get(slice(5, 7), fill=0.0), ref, got)
    assert out.dtype == np.float32
    out = same(lambda b: b.get(slice(2, 5), fill=0.0), ref, got)
    assert out.dtype == np.float64 and out.tolist() == [2.5, 0.0, 0.0]


@pytest.mark.parametrize("finalize", [False, True])
def test_one_hot_fill_items_hold_the_fill_value(finalize):
    """``fill`` with ``one_hot_discrete``: RLlib's dummy is ``fill`` in every slot (so
    ``fill=0`` is "zero-hot"), not always zeros."""
    ref, got = both([0, 1, 2], lookback=1, space=lambda: gym.spaces.Discrete(3), finalize=finalize)
    out = same(
        lambda b: b.get(-3, neg_index_as_lookback=True, fill=-1, one_hot_discrete=True), ref, got
    )
    assert out.tolist() == [-1.0, -1.0, -1.0]
    same(lambda b: b.get([5, 0], fill=-1, one_hot_discrete=True), ref, got)
    same(
        lambda b: b.get(slice(-3, 1), neg_index_as_lookback=True, fill=0, one_hot_discrete=True),
        ref,
        got,
    )


@pytest.mark.parametrize("finalize", [False, True])
def test_one_hot_without_a_space_fails_only_where_data_is_converted(finalize):
    ref, got = both([0, 1, 2], finalize=finalize)
    assert same(lambda b: b.get(7, fill=-1, one_hot_discrete=True), ref, got) == -1
    assert np.asarray(
        same(lambda b: b.get(slice(5, 7), fill=-1, one_hot_discrete=True), ref, got)
    ).tolist() == [-1, -1]
    with pytest.raises(IndexError):  # (out of range first, before any conversion)
        got.get(7, one_hot_discrete=True)
    same(lambda b: b.get(7, one_hot_discrete=True), ref, got)
    with pytest.raises(ValueError, match="space"):
        got.get(0, one_hot_discrete=True)
    same(lambda b: b.get(0, one_hot_discrete=True), ref, got)
    same(lambda b: b.get(one_hot_discrete=True), ref, got)


def test_one_hot_without_a_space_on_an_empty_range_that_rllib_converts():
    ref, got = both([])
    same(lambda b: b.get(slice(-2, 1), fill=-9, one_hot_discrete=True), ref, got)
    with pytest.raises(ValueError):
        got.get(slice(-2, 1), fill=-9, one_hot_discrete=True)


@pytest.mark.parametrize("finalize", [False, True])
def test_set_clips_slices_like_get(finalize):
    ref, got = both(list(range(10)), finalize=finalize)
    new = list(range(100, 107))
    for b in (ref, got):
        b.set(np.array(new) if finalize else list(new), at_indices=slice(-13, 7))
    assert np.asarray(got.data).tolist() == new + [7, 8, 9]
    same(lambda b: b.data, ref, got)
    with pytest.raises(IndexError):  # the clipped slice holds 7 items, not 8
        got.set(np.arange(8) if finalize else list(range(8)), at_indices=slice(-13, 7))


def test_set_with_list_indices_takes_a_list_of_items_when_numpyized():
    ref, got = both([0, 1, 2, 3], lookback=1, finalize=True)
    for b in (ref, got):
        b.set([70, 80], at_indices=[0, -1])
    assert got.data.tolist() == [0, 70, 2, 80]
    same(lambda b: b.data, ref, got)
    with pytest.raises(IndexError):  # fewer items than indices
        got.set([5], at_indices=[0, 1])


def test_numpyized_list_indices_broadcast_a_scalar_fill_to_the_items_shape():
    ref, got = both([np.array([1.0, -1.0], np.float32), np.array([2.0, -2.0], np.float32)])
    for b in (ref, got):
        b.finalize()
    out = same(lambda b: b.get([0, 5], fill=-9), ref, got)
    assert out.tolist() == [[1.0, -1.0], [-9.0, -9.0]] and out.dtype == np.float32
