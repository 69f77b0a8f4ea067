"""``python -m benchmarks.acting_budgets --quick`` builds the three sides (jaxsampler with its
budgets, jaxsampler with the base commit's one budget, the hand-written loop) on both pgx
games and writes the promised JSON and Markdown; its ratios are checked from the raw round
times. No timing assertions."""

from __future__ import annotations

import json
import statistics

import pytest


def test_quick_writes_the_schema_and_patches_only_while_building(tmp_path):
    pytest.importorskip("pgx", reason="the benchmark's games are pgx's")
    import jaxsampler.policies.mlp as mlp
    from benchmarks import acting_budgets

    before = mlp.rows_pass, mlp.extra_budgets
    acting_budgets.main(["--quick", "--out", str(tmp_path)])
    assert (mlp.rows_pass, mlp.extra_budgets) == before  # the base module was put back
    res = json.loads((tmp_path / "acting_budgets.json").read_text())
    assert res["config"]["base"] == "4f900ed" and res["config"]["widths"] == [8]
    for game in ("pgx", "pgx_connect_four"):
        row = res["games"][game]["8"]
        hand = row["hand-written"]["round_median_s"]
        for side in ("budgets", "one budget"):
            s = row[side]
            assert len(s["round_median_s"]) == res["config"]["repeats"]
            per_step = [h / t for h, t in zip(hand, s["round_median_s"], strict=True)]
            assert s["per_env_step"] == pytest.approx(statistics.median(per_step))
        pairs = zip(
            row["one budget"]["round_median_s"], row["budgets"]["round_median_s"], strict=True
        )
        assert row["budgets_over_one"] == pytest.approx(statistics.median(o / b for o, b in pairs))
    md = (tmp_path / "acting_budgets.md").read_text()
    assert "| `pgx:connect_four` | 8 |" in md and "base `4f900ed`" in md
