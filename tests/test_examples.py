"""Smoke tests: each example runs a few iterations at tiny sizes (no learning threshold here;
learning results are in benchmarks/results/ppo.md)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("env_id, sampler", [("CartPole-v1", "jaxsampler"), ("CartPole-v1", "handwritten"),
                                             ("Pendulum-v1", "jaxsampler")])
def test_ppo_example_runs(env_id, sampler, tmp_path):
    ppo = load("ppo")
    out = tmp_path / "ppo.json"
    rc = ppo.main(["--env", env_id, "--sampler", sampler, "--seeds", "2", "--total-timesteps", "512",
                   "--num-envs", "2", "--rollout-length", "64", "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["seeds"] == 2 and res["env_steps_per_seed"] == 512
    curve = np.asarray(res["learning_curve_per_seed"])
    assert curve.shape == (2, 4) and np.all(np.isfinite(curve))
    assert res["env_steps_per_s"] > 0
