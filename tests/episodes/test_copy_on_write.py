"""Borrowed lookback buffers (the samplers' views of shared columns) copy on first write."""

from __future__ import annotations

import numpy as np
import pytest

from jaxsampler.episodes import InfiniteLookbackBuffer, SingleAgentEpisode


def test_a_borrowed_buffer_copies_before_its_first_write_only():
    base = np.arange(12, dtype=np.float32).reshape(6, 2)
    buf = InfiniteLookbackBuffer.trusted(base[1:5], 1)
    assert buf.borrowed
    early = buf.get()
    buf.set(np.full((2,), -1.0, np.float32), at_indices=0)
    np.testing.assert_array_equal(base, np.arange(12).reshape(6, 2))  # the shared data
    np.testing.assert_array_equal(early, base[2:5])  # an array read before
    np.testing.assert_array_equal(buf.get(0), [-1.0, -1.0])
    assert not buf.borrowed
    owned = buf.data
    buf.set(np.full((2,), -2.0, np.float32), at_indices=1)  # owned now: in place
    assert buf.data is owned and buf.get(1).tolist() == [-2.0, -2.0]


def test_an_unborrowed_buffer_writes_in_place_as_rllib_does():
    base = np.zeros((3, 2), np.float32)
    buf = InfiniteLookbackBuffer(base, 0)
    assert not buf.borrowed
    buf.set(np.ones(2, np.float32), at_indices=0)
    np.testing.assert_array_equal(base[0], [1.0, 1.0])
    assert not InfiniteLookbackBuffer.trusted(base, 0, borrowed=False).borrowed


def test_a_borrowed_struct_copies_every_leaf_and_failed_checks_copy_nothing():
    base = {"a": np.zeros((3, 2), np.float32), "b": np.zeros(3, np.int64)}
    buf = InfiniteLookbackBuffer.trusted({k: v[:] for k, v in base.items()}, 0)
    with pytest.raises(IndexError):
        buf.set({"a": np.ones((1, 2), np.float32), "b": np.ones(1, np.int64)})
    assert buf.borrowed  # nothing written, nothing copied
    buf.set({"a": np.ones(2, np.float32), "b": np.int64(5)}, at_indices=2)
    assert base["a"].sum() == 0 and base["b"].sum() == 0
    assert buf.get(2)["b"] == 5 and buf.get(2)["a"].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("op", ["append", "extend", "pop"])
def test_append_extend_pop_build_new_arrays_and_end_borrowing(op):
    base = np.arange(4, dtype=np.int64)
    buf = InfiniteLookbackBuffer.trusted(base[:3], 0)
    {"append": lambda: buf.append(9), "extend": lambda: buf.extend([8, 9]), "pop": buf.pop}[op]()
    assert not buf.borrowed
    buf.set(np.int64(-1), at_indices=0)
    np.testing.assert_array_equal(base, [0, 1, 2, 3])


def test_cut_and_slice_successors_borrow_their_source_episodes_data():
    ep = SingleAgentEpisode(
        observations=np.arange(10, dtype=np.float32).reshape(5, 2),
        actions=np.arange(4),
        rewards=np.ones(4, np.float32),
        len_lookback_buffer=0,
    )
    before = np.array(ep.observations.data)
    succ = ep.cut(len_lookback_buffer=2)
    succ.set_observations(
        new_data=np.full((2,), -3.0, np.float32), at_indices=-1, neg_index_as_lookback=True
    )
    part = ep[1:3]
    part.set_actions(new_data=np.array([7, 7]))
    np.testing.assert_array_equal(ep.observations.data, before)
    np.testing.assert_array_equal(ep.get_actions(), [0, 1, 2, 3])
    assert succ.get_observations(-1, neg_index_as_lookback=True).tolist() == [-3.0, -3.0]
    assert part.get_actions().tolist() == [7, 7]
