"""``python -m benchmarks.scaling`` and ``python -m benchmarks.gpu`` run tiny (so CI exercises both
scripts, the 2-process ``jax.distributed`` worker included) and write the promised JSON;
their bookkeeping (throughput of a round, speedups, series stops) is checked by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import gpu
from benchmarks import scaling as sc

ROOT = Path(__file__).resolve().parents[2]


def run_script(module: str, *args: str, timeout: int = 600) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_scaling_quick_writes_the_schema(tmp_path):
    run_script(
        "benchmarks.scaling", "--quick", "--widths", "8", "--groups", "1p1d", "2p1d",
        "--out", str(tmp_path),
    )  # fmt: skip
    res = json.loads((tmp_path / "scaling.json").read_text())
    assert res["benchmark"] == "scaling"
    assert res["config"]["widths_per_unit"] == [8]
    rows = res["rows"]
    assert {"rollout_1p1d", "hand_1p", "rollout_2p1d"} <= set(rows)
    for row, cell in ((r, c) for r, by_w in rows.items() for c in by_w.values()):
        assert cell["actions_per_s"] > 0, row
        assert cell["efficiency"] == pytest.approx(cell["speedup"] / cell["n"])
    assert rows["rollout_1p1d"]["8"]["speedup"] == 1.0
    assert rows["rollout_2p1d"]["8"]["n"] == 2
    # The distributed rollout steps 2 x 8 envs x 8 steps per call; each process reports
    # the global count of acting steps (most steps act; reset steps do not).
    rnd = res["raw"]["rollout_2p1d"]["8"][0]
    assert rnd["steps"] == [2 * 8 * 8] * 2 and rnd["acted"][0] == rnd["acted"][1]
    assert 0.5 * 128 < rnd["acted"][0] <= 128
    # The sampler row runs or says why not (Sampler(devices=) is new).
    assert "sampler_1d" in rows or "devices" in res["skipped"]["sampler_1d"]
    assert (tmp_path / "scaling.png").stat().st_size > 0
    md = (tmp_path / "scaling.md").read_text()
    assert "| jaxsampler rollout, 1 process x 1 device | 1 |" in md


def test_scaling_throughput_and_speedup_by_hand():
    one = {"times_s": [[0.1, 0.3, 0.2]], "acted": [100], "steps": [100]}
    dist = {"times_s": [[0.2, 0.2], [0.25, 0.25]], "acted": [200, 200], "steps": [200, 200]}
    indep = {"times_s": [[0.1], [0.2]], "acted": [100, 100], "steps": [100, 100]}
    assert sc._throughput(one, False) == pytest.approx(100 / 0.2)
    assert sc._throughput(dist, True) == pytest.approx(200 / 0.25)  # the slower process
    assert sc._throughput(indep, False) == pytest.approx(100 / 0.1 + 100 / 0.2)
    raw = {"rollout_1p1d": {"8": [one, one]}, "rollout_2p1d": {"8": [dist, dist]}}
    out = sc.summarize(raw, distributed={"rollout_2p1d"})
    assert out["rollout_2p1d"]["8"]["speedup"] == pytest.approx(800 / 500)
    assert out["rollout_2p1d"]["8"]["efficiency"] == pytest.approx(0.8)
    targets = sc.check_targets({"rollout_2p1d": {"1024": {"speedup": 1.75}}}, [1024])
    assert targets == [
        {
            "target": "2 processes >= 1.7x one process at W=1024",
            "row": "rollout_2p1d",
            "width": 1024,
            "goal": 1.7,
            "speedup": 1.75,
            "met": True,
        }
    ]


def test_scaling_rejects_bad_sizes():
    with pytest.raises(SystemExit):
        sc.parse_args(["--widths", "0"])


def test_gpu_quick_writes_the_schema(tmp_path):
    run_script("benchmarks.gpu", "--quick", "--max-width", "64", "--out", str(tmp_path))
    res = json.loads((tmp_path / "gpu.json").read_text())
    assert res["benchmark"] == "gpu"
    assert set(res["envs"]) == {"CartPole-v1", "Breakout-MinAtar", "Spread-8"}
    assert res["device"]["jax_devices"] and res["environment"]["jax"]
    for label, series in res["envs"].items():
        assert series["stopped"] is None, label
        (row,) = series["rows"]
        assert row["width"] == 64 and row["rollout_length"] == 8
        assert row["actions_per_s"] > 0 and 0.5 < row["acting_fraction"] <= 1
    assert res["envs"]["Spread-8"]["rows"][0]["num_agents"] == 8
    assert "| Breakout-MinAtar | 64 | 8 | 1 |" in (tmp_path / "gpu.md").read_text()


def test_gpu_series_stops_at_oom_and_at_the_budget(monkeypatch):
    assert gpu.widths_up_to(1 << 20) == [1024 * 4**k for k in range(6)]
    args = SimpleNamespace(
        max_width=16384, min_width=1024, rollout_cap=128, min_rollout_length=4,
        max_buffer_gb=24.0, repeats=1, min_time_s=0.0,
    )  # fmt: skip
    seen = []

    def fake_measure(env, width, T, repeats, min_time_s):
        seen.append(width)
        if width == 4096:
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate")
        return {"width": width, "actions_per_s": 1.0, "compile_s": 0.0}

    monkeypatch.setattr(gpu, "measure", fake_measure)
    res = gpu.run_env("CartPole-v1", args, deadline=float("inf"))
    assert seen == [1024, 4096] and [r["width"] for r in res["rows"]] == [1024]
    assert res["stopped"].startswith("out of memory at W=4096")
    res = gpu.run_env("CartPole-v1", args, deadline=0.0)
    assert res["rows"] == [] and res["stopped"].startswith("time budget")

    def broken(*a):
        raise RuntimeError("some other failure")

    monkeypatch.setattr(gpu, "measure", broken)
    with pytest.raises(RuntimeError, match="some other failure"):
        gpu.run_env("CartPole-v1", args, deadline=float("inf"))


def test_gpu_shortens_T_to_fit_the_buffer():
    env = SimpleNamespace(observation_space=SimpleNamespace(shape=(10, 10, 4)), num_agents=1)
    # Breakout at 1M envs: 32 steps would need ~54 GB; 8 steps fit in 24 GB.
    assert gpu.buffer_bytes(env, 1 << 20, 32) > 24e9 > gpu.buffer_bytes(env, 1 << 20, 8)
