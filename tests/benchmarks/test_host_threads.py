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
    (cell,) = res["cells"]
    assert cell["width"] == 64 and cell["rollout_length"] == 8
    names = {"rollout", "sample_batch 1", "sample_batch 2", "conversion 1", "conversion 2"}
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
    md = (tmp_path / "host_threads.md").read_text()
    assert "| 64 x 8 | conversion 2 |" in md


def test_conversion_side_converts_the_same_call_each_time():
    import jaxsampler as js

    env = js.make("CartPole-v1")
    pol, params = hs.make_policy(env, "random")
    s = hs.make_sampler(env, pol, hs.Cell("CartPole-v1", 8, "random"), 6, {}, [])
    want = s.sample_batch(params)["default_policy"]
    before = s._convert.get_state()
    run = ht._conversion(s, 2)
    got = []
    real = s._convert.batch

    def keep(*args):
        out = real(*args)
        got.append(out[0]["default_policy"])
        return out

    s._convert.batch = keep
    for _ in range(2):
        assert run() > 0
    for b in got:  # the same rows as the call itself returned
        for k in ("obs", "actions", "rewards", "t"):
            np.testing.assert_array_equal(b[k], want[k])
    after = s._convert.get_state()
    assert after.keys() == before.keys()
    for k in before:
        np.testing.assert_array_equal(np.asarray(after[k]), np.asarray(before[k]))
