"""Smoke test of ``python -m examples.selfplay_pgx --quick``: self-play PPO runs on pgx
tic-tac-toe and writes its results (learning results: benchmarks/results/selfplay_pgx.md)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pgx", reason="pgx is not installed (pip install -e '.[pgx]')")


@pytest.mark.slow  # ~50 s on the shared 2-core machine (mostly compiles)
def test_quick_run_writes_rates(tmp_path):
    from examples import selfplay_pgx as ex

    out = tmp_path / "selfplay_pgx.json"
    assert ex.main(["--quick", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["env_steps"] >= 2_000 and len(res["curve"]) >= 2
    for side in ("overall", "first", "second"):
        r = res["final"][side]
        assert r["win"] + r["draw"] + r["loss"] == pytest.approx(1.0)
    assert res["final"]["first"]["games"] + res["final"]["second"]["games"] == 64
    assert res["opponent"] == "pool" and res["pool"]["size"] == 8
    assert [r["seed"] for r in res["runs"]] == [0] and res["runs"][0]["final"] == res["final"]
    assert res["measured_at"]["commit"]
    assert "| 0 | overall | 64 |" in out.with_suffix(".md").read_text()


def test_rates_split_by_first_mover():
    import numpy as np

    from examples import selfplay_pgx as ex

    r = ex.rates(np.array([0, 0, 1, 1]), np.array([1.0, 0.0, -1.0, 1.0], np.float32))
    assert r["first"] == {"games": 2, "win": 0.5, "draw": 0.5, "loss": 0.0}
    assert r["second"] == {"games": 2, "win": 0.5, "draw": 0.0, "loss": 0.5}
