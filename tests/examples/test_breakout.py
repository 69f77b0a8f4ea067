"""examples.ppo on Breakout-MinAtar (CNN policy): a quick run with each sampler."""

from __future__ import annotations

import json

import numpy as np
import pytest

from examples import ppo


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["jaxsampler", "handwritten"])
def test_ppo_breakout_quick(sampler, tmp_path):
    pytest.importorskip("gymnax", reason="Breakout-MinAtar comes from gymnax")
    out = tmp_path / "ppo.json"
    args = ["--env", "Breakout-MinAtar", "--sampler", sampler, "--seeds", "1"]
    args += ["--total-timesteps", "128", "--num-envs", "2", "--rollout-length", "32"]
    assert ppo.main([*args, "--quiet", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["config"]["policy"] == "cnn" and res["env_steps_per_seed"] == 128
    assert np.isfinite(res["metrics_per_seed"]["return_sum"]).all()
