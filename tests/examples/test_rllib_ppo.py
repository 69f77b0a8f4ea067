"""examples.rllib_ppo in --quick mode: two tiny PPO iterations with each runner (the
learning result, return >= 450, is in benchmarks/results/rllib_ppo.md)."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("ray.rllib", reason="examples/rllib_ppo.py needs ray[rllib] (the rllib extra)")
pytest.importorskip("torch", reason="examples/rllib_ppo.py needs torch (the rllib extra)")


def test_rllib_ppo_example_quick_runs_both_runners(tmp_path):
    from examples import rllib_ppo as example

    out = tmp_path / "curves"
    runs = example.main(["--quick", "--runner", "both", "--out", str(out)])
    assert [r["runner"] for r in runs] == ["jax", "rllib"]
    for run in runs:
        curve = run["curve"]
        assert [p["iteration"] for p in curve] == [1, 2]
        steps = [p["env_steps"] for p in curve]
        assert steps[0] >= 128 and steps[1] >= steps[0] + 128  # train batch 128 per iteration
        assert all(math.isfinite(p["episode_return_mean"]) for p in curve)
    saved = json.loads((tmp_path / "curves.json").read_text())
    assert [r["runner"] for r in saved["runs"]] == ["jax", "rllib"]
    assert "| jax |" in (tmp_path / "curves.md").read_text()
