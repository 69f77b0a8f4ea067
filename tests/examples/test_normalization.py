"""Smoke test of ``python -m examples.ppo_normalization --quick``: both variants run on the
same seeds and the outputs have the documented structure (learning results:
benchmarks/results/ppo_normalization.md)."""

from __future__ import annotations

import json

import numpy as np

from examples import ppo_normalization as ex


def test_quick_run_writes_both_curves(tmp_path):
    assert ex.main(["--quick", "--seeds", "2", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "ppo_normalization.json").read_text())
    assert res["seeds"] == 2 and set(res["variants"]) == {"normalized", "raw"}
    cfg = res["config"]
    updates = res["env_steps_per_seed"] // res["env_steps_per_update"]
    assert res["env_steps_per_update"] == cfg["num_envs"] * cfg["rollout_length"]
    assert res["variants"]["raw"]["transforms"] == []
    names = [t.split("(")[0] for t in res["variants"]["normalized"]["transforms"]]
    assert names == ["NormalizeObservation", "NormalizeReward"]
    for v in res["variants"].values():
        curve = np.asarray(v["learning_curve_per_seed"], dtype=float)  # None: no episode ended
        assert curve.shape == (2, updates)
        done = np.isfinite(curve)
        # Pendulum episodes are 200 steps (+1 reset step): with 2 envs x 100 steps per
        # update (100 time steps) they end at t = 199, 400, 601: updates 2, 5 and 7.
        np.testing.assert_array_equal(done, np.tile([0, 1, 0, 0, 1, 0, 1], (2, 1)).astype(bool))
        # Raw Pendulum returns: every reward is in [-16.3, 0], so a 200-step return is too.
        assert ((curve[done] < 0) & (curve[done] >= -16.3 * 200)).all()
        # Final return: the episodes of the last 5% of updates (here the last one).
        np.testing.assert_allclose(v["final_mean_return_per_seed"], curve[:, -1], rtol=1e-6)
        assert set(v["steps_to_threshold_per_seed"]) == {"-500.0", "-250.0"}
        assert v["wall_s"] > 0
    md = (tmp_path / "ppo_normalization.md").read_text()
    assert "| normalized |" in md and "| raw |" in md
    assert (tmp_path / "ppo_normalization.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
