"""A deferred SampleBatch column (built on first read) looks, to every reader, like the
column built up front."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

from jaxsampler.episodes.batch import Deferred, SampleBatch, concat_samples


def batches() -> tuple[SampleBatch, SampleBatch, list[int]]:
    """The same batch with its infos column deferred and built up front, and a list
    that counts the deferred column's builds."""
    calls: list[int] = []

    def infos() -> list[dict]:
        calls.append(1)
        return [{} for _ in range(4)]

    cols = {
        "obs": np.arange(8, dtype=np.float32).reshape(4, 2),
        "eps_id": np.array(["a", "a", "b", "b"], dtype=object),
        "terminateds": np.array([False, True, False, False]),
    }
    return (
        SampleBatch({**cols, "infos": Deferred(infos)}),
        SampleBatch({**cols, "infos": [{} for _ in range(4)]}),
        calls,
    )


READERS = {
    "getitem": lambda b: b["infos"],
    "get": lambda b: b.get("infos"),
    "items": lambda b: dict(b.items())["infos"],
    "values": lambda b: list(b.values())[-1],
    "dict": lambda b: dict(b)["infos"],
    "unpack": lambda b: {**b}["infos"],
    "copy": lambda b: b.copy()["infos"],
    "shallow copy": lambda b: b.copy(shallow=True)["infos"],
    "slice": lambda b: b[1:3]["infos"],
    "concat": lambda b: concat_samples([b, b])["infos"],
    "pickle": lambda b: dict.__getitem__(pickle.loads(pickle.dumps(b)), "infos"),
    "deepcopy": lambda b: dict.__getitem__(copy.deepcopy(b), "infos"),
    "pop": lambda b: b.pop("infos"),
    "rows": lambda b: [r["infos"] for r in b.rows()],
    "split": lambda b: [part["infos"] for part in b.split_by_episode()],
    "setdefault": lambda b: b.setdefault("infos", None),
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_read_path_gives_the_built_column(reader):
    lazy, eager, calls = batches()
    assert len(lazy) == len(eager) == 4 and sorted(lazy) == sorted(eager)
    assert not calls and "infos" in lazy  # a key like any other, not built yet
    got, want = READERS[reader](lazy), READERS[reader](eager)
    assert got == want and not isinstance(got, Deferred)
    assert len(calls) == 1  # built once
    if reader != "pop":
        assert dict.__getitem__(lazy, "infos") == dict.__getitem__(eager, "infos")


def test_deferred_batches_compare_equal_after_building_and_codec_round_trips():
    from jaxsampler.episodes import codec

    lazy, eager, _ = batches()
    assert (lazy["obs"] == eager["obs"]).all()
    again, _, _ = batches()
    assert again.keys() == lazy.keys()
    back = codec.unpackb(codec.packb(again))
    assert back["infos"] == [{}] * 4 and len(back) == 4
    np.testing.assert_array_equal(back["obs"], eager["obs"])
