"""``python -m benchmarks.groups --quick`` runs tiny and writes its JSON and Markdown; its
padded side really hands out carrier rows."""

from __future__ import annotations

import json

import numpy as np

import jaxsampler as js
from benchmarks import groups


def test_quick_writes_both_envs(tmp_path):
    assert groups.main(["--quick", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "groups.json").read_text())
    assert [r["env"] for r in res["results"]] == [e for e, _ in groups.ENVS]
    for r in res["results"]:
        for side in ("batch (groups)", "sample+read (padded)"):
            assert r["sides"][side]["ratio"] > 0
        assert r["obs_bytes"]["carrier"] >= r["obs_bytes"]["own"] > 0
    assert "groups / padded" in (tmp_path / "groups.md").read_text()


def test_the_padded_side_hands_out_carrier_rows():
    env = js.make("PredatorPrey-v0")
    pol, params = groups.group_policy(env)
    with groups.padded():
        hand = js.Sampler(env, pol, num_envs=2, rollout_length=4, seed=0)
    own = js.Sampler(env, pol, num_envs=2, rollout_length=4, seed=0)
    width = env.observation_space.shape
    got, want = own.sample_batch(params), hand.sample_batch(params)
    assert want["predator"]["obs"].shape[1:] == width
    assert got["predator"]["obs"].shape[1:] == (4,)
    np.testing.assert_array_equal(got["predator"]["obs"], want["predator"]["obs"][:, :4])


def test_ppo_groups_quick_writes_runs_table_and_plot(tmp_path):
    from benchmarks import ppo_groups

    assert ppo_groups.main(["--quick", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "ppo_groups.json").read_text())
    assert [r["train"] for r in res["runs"]] == list(ppo_groups.MODES)
    assert "who learns" in (tmp_path / "ppo_groups.md").read_text()
    assert (tmp_path / "ppo_groups.png").stat().st_size > 0
