"""``python -m benchmarks.host_threads --quick`` runs tiny and writes its JSON and Markdown;
the ratios are the paired medians of the recorded rounds; the conversion side converts the
same call on every repeat. No timing assertions."""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest

from benchmarks import host_side as hs
from benchmarks import host_threads as ht


def test_quick_writes_the_schema(tmp_path):
    ht.main(["--quick", "--threads", "1", "2", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "host_threads.json").read_text())
    assert res["config"]["threads"] == [1, 2] and res["config"]["quick"]
    cart, spread = res["cells"]
    assert (cart["cell"], cart["width"], cart["rollout_length"]) == ("CartPole-v1 64 random", 64, 8)
    assert (spread["cell"], spread["rollout_length"]) == ("Spread(2) 8 random", 4)
    names = {"rollout", "sample_batch 1", "sample_batch 2", "conversion 1", "conversion 2"}
    for cell in res["cells"]:
        _check_cell(cell, names)
    md = (tmp_path / "host_threads.md").read_text()
    assert "| CartPole-v1 | 64 x 8 | conversion 2 |" in md and "| Spread(2) | 8 x 4 |" in md


def _check_cell(cell, names):
    assert set(cell["sides"]) == names
    t = cell["times_s"]
    for name in names - {"rollout"}:
        s, kind = cell["sides"][name], name.split()[0]
        assert len(t[name]) == 2 and s["min_s"] <= s["median_s"] <= s["max_s"]
        want = statistics.median(a / b for a, b in zip(t[name], t[f"{kind} 1"], strict=True))
        assert s["vs_one_thread"] == pytest.approx(want)
        if kind == "sample_batch":
            want = statistics.median(a / b for a, b in zip(t[name], t["rollout"], strict=True))
            assert s["vs_rollout"] == pytest.approx(want)


def test_bad_cells_are_refused():
    assert ht.parse_cell("Spread8:1024:128")[0].agents == 8
    for bad in ("CartPole-v1:0:8", "Pong:64:8", "Spread:64:8", "CartPole-v1:64"):
        with pytest.raises(ValueError, match="ENV:W:T"):
            ht.parse_cell(bad)


def test_conversion_side_converts_the_same_call_each_time_and_leaves_the_sampler_alone():
    import copy

    import jaxsampler as js

    env = js.make("CartPole-v1")
    pol, params = hs.make_policy(env, "random")

    def make():
        return hs.make_sampler(env, pol, hs.Cell("CartPole-v1", 8, "random"), 6, {}, [])

    s, twin = make(), make()
    twin.sample_batch(params)
    before = copy.deepcopy(s._convert.get_state())
    want = s.sample_batch(params)["default_policy"]
    run = ht._conversion(s, 2, before)
    got = []
    real = s._convert.batch

    def keep(*args):
        out = real(*args)
        got.append((out[0]["default_policy"], out[1].as_dict()))
        return out

    s._convert.batch = keep
    for _ in range(2):
        assert run() > 0
        s.sample_batch(params)  # the sampler's own calls in between
        twin.sample_batch(params)
    conversions = got[0::2]  # (got[1::2]: the sampler's own calls)
    assert len(conversions) == 2
    for b, metrics in conversions:  # the first call again, rows and metrics
        assert metrics == conversions[0][1]
        for k in ("obs", "actions", "rewards", "t", "eps_id"):
            np.testing.assert_array_equal(b[k], want[k])
    s._convert.batch = real
    a, b = s.sample_batch(params)["default_policy"], twin.sample_batch(params)["default_policy"]
    for k in ("obs", "actions", "rewards", "t", "eps_id"):  # the sampler went on unharmed
        np.testing.assert_array_equal(a[k], b[k])
    assert s.metrics.as_dict() == twin.metrics.as_dict()
