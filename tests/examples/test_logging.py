"""The example trainers' --log-dir: one JSON line per update, holding what the example
itself reports (its own JSON output is the reference)."""

from __future__ import annotations

import json
import math

import pytest

from examples import ppo_distributed, ppo_domain_randomization, ppo_host, ppo_normalization
from jaxsampler.integrations.loggers import read_jsonl


def test_ppo_host_logs_every_sampler_call_and_update(tmp_path, capsys):
    out, logs = tmp_path / "host.json", tmp_path / "logs"
    argv = ["--total-timesteps", "300", "--num-envs", "2", "--rollout-length", "32"]
    assert ppo_host.main([*argv, "--json", str(out), "--log-dir", str(logs), "--quiet"]) == 0
    assert capsys.readouterr().err == ""  # --quiet: no bar
    res = json.loads(out.read_text())
    lines = read_jsonl(logs / "metrics.jsonl")
    sampler = [x for x in lines if "sampler/num_env_steps_sampled" in x]
    train = [x for x in lines if "train/loss_after" in x]
    # one sampler line (the callback) and one training line per update, in that order
    assert len(sampler) == len(train) == len(lines) / 2 and len(sampler) >= 5
    assert lines[::2] == sampler and lines[1::2] == train
    for s, t in zip(sampler, train, strict=True):
        assert s["step"] == t["step"] and s["sampler/total_env_steps"] == s["step"]
        assert s["sampler/env_steps_per_s"] > 0 and s["sampler/rollout_s"] > 0
        assert math.isfinite(t["train/loss_before"]) and math.isfinite(t["train/loss_after"])
        assert 0 < t["train/rows"] <= s["sampler/num_env_steps_sampled"]
    assert sum(t["train/rows"] for t in train) == res["env_steps"]  # the loop's own count
    steps = [s["step"] for s in sampler]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    # the example's returns: those of the calls that completed episodes
    logged = [
        s["sampler/episode_return_mean"] for s in sampler if "sampler/episode_return_mean" in s
    ]
    assert logged == res["returns"] and len(logged) > 0
    assert sampler[0]["sampler/num_compiles"] > 0 and "compile" in sampler[0]
    assert all(s["sampler/num_compiles"] == 0 for s in sampler[1:])


def test_scan_trainers_log_their_curves_one_line_per_update(tmp_path):
    """ppo_normalization / ppo_domain_randomization train in one jitted scan and log the
    returned curves afterwards (their runs are tested in test_example_*.py): here on
    result dicts of their documented shape."""
    from jaxsampler.integrations.loggers import JsonlLogger

    curves = [[None, -900.0, None, -700.0], [-1000.0, None, None, -600.0]]
    norm = {
        "env_steps_per_update": 200,
        "env_steps_per_seed": 800,
        "seeds": 2,
        "variants": {
            name: {
                "learning_curve_per_seed": curves,
                "final_mean_return_per_seed": [-700.0, -600.0],
                "compile_s": 3.0,
                "wall_s": 2.0,
            }
            for name in ("normalized", "raw")
        },
    }
    with JsonlLogger(tmp_path / "n.jsonl") as lg:
        assert ppo_normalization.log_curves(lg, norm) == 4
    lines = read_jsonl(tmp_path / "n.jsonl")
    assert [x["step"] for x in lines] == [200, 400, 600, 800]
    assert [x.get("raw/seed0/episode_return_mean") for x in lines] == [None, -900, None, -700]
    # the mean over the seeds whose episodes ended in that update; none: left out
    assert [x.get("normalized/episode_return_mean") for x in lines] == [-1000, -900, None, -650]
    assert lines[-1]["raw/env_steps_per_s"] == 800 * 2 / 2.0
    assert lines[-1]["raw/final_mean_return"] == -650 and "raw/compile_s" not in lines[0]

    dr = {
        "config": {"num_envs": 2, "rollout_length": 32},
        "variants": {
            name: {
                "per_seed": [{"learning_curve": c} for c in ([1.0, None], [3.0, 5.0])],
                "compile_s": 1.0,
                "env_steps_per_s": 10.0,
                "eval_mean_return": 7.0,
            }
            for name in ("randomized", "default")
        },
    }
    with JsonlLogger(tmp_path / "d.jsonl") as lg:
        assert ppo_domain_randomization.log_curves(lg, dr) == 2
    lines = read_jsonl(tmp_path / "d.jsonl")
    assert [x["step"] for x in lines] == [64, 128]
    assert [x["default/train_return"] for x in lines] == [2.0, 5.0]
    assert "randomized/seed0/train_return" not in lines[1]
    assert lines[1]["randomized/eval_mean_return"] == 7.0


def test_ppo_distributed_logs_the_global_figures_per_update(tmp_path):
    out, logs = tmp_path / "run.json", tmp_path / "logs"
    assert (
        ppo_distributed.main(["--quick", "--out", str(out), "--log-dir", str(logs), "--quiet"]) == 0
    )
    res = json.loads(out.read_text())
    lines = read_jsonl(logs / "metrics.jsonl")
    per_update, n = res["env_steps_per_update"], len(res["learning_curve"])
    # one line per update, then the run's summary at the last step
    assert len(lines) == n + 1
    assert [x["step"] for x in lines] == [(u + 1) * per_update for u in range(n)] + [
        res["env_steps"]
    ]
    assert [x["train/episodes"] for x in lines[:n]] == res["episodes_per_update"]
    for x, ret in zip(lines[:n], res["learning_curve"], strict=True):
        if ret is None:
            assert "train/episode_return_mean" not in x
        else:
            assert x["train/episode_return_mean"] == pytest.approx(ret, rel=1e-6)
        assert x["train/env_steps_per_s"] > 0
    assert lines[-1]["compile_s"] == res["compile_s"]
