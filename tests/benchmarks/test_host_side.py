"""``python -m benchmarks.host_side --quick`` runs tiny and writes the promised JSON, Markdown and
plot; its bookkeeping (paired ratios, the time split, batch bytes with views counted once, the
targets, the kwargs a checkout does not take) is checked by hand; the GPU script's host-side
part runs on CPU at tiny sizes and skips what does not fit with the reason. No timing
assertions."""

from __future__ import annotations

import argparse
import json
import statistics
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks import gpu
from benchmarks import host_floors as hf
from benchmarks import host_side as hs


def test_quick_writes_the_schema(tmp_path):
    pytest.importorskip("gymnax", reason="the MinAtar cell is a gymnax env")
    hs.main(["--quick", "--cells", "CartPole-v1 16 mlp", "Breakout", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "host_side.json").read_text())
    assert res["config"]["rollout_length"] == 8 and res["config"]["quick"]
    cart, minatar = res["cells"]
    assert cart["cell"] == "CartPole-v1 16 mlp" and minatar["cell"] == "Breakout-MinAtar 16 random"
    assert set(cart["sides"]) == {"rollout", "sample_batch", "sample", "sample+read"}
    for side in ("sample_batch", "sample", "sample+read"):
        s, ts, base = cart["sides"][side], cart["times_s"][side], cart["times_s"]["rollout"]
        assert len(ts) == len(base) == 2
        assert s["ratio"] == pytest.approx(
            statistics.median(a / b for a, b in zip(ts, base, strict=True))
        )
        assert s["conversion_s"] == pytest.approx(
            statistics.median(a - b for a, b in zip(ts, base, strict=True))
        )
    compute, copy = cart["split_s"]["rollout_compute"], cart["split_s"]["rollout_copy"]
    assert all(
        c + p <= t for c, p, t in zip(compute, copy, cart["times_s"]["rollout"], strict=True)
    )
    mem = minatar["memory"]
    # 16 envs x 8 steps of 10x10x4 float32 frames: at least ~100 rows of obs.
    # (one float32 observation copy: new_obs is built on first read, not held)
    assert mem["nbytes_bytes"] >= mem["held_bytes"] > 100 * 400 * 4
    assert mem["peak_bytes"] > 0 and mem["obs_dtype"] == "float32"
    assert mem["peak_over_bytes"] == pytest.approx(mem["peak_bytes"] / mem["held_bytes"])
    (dev,) = res["devices"]["cells"]
    assert res["devices"]["device_count"] == 2 and dev["cell"] == "devices CartPole-v1 16 mlp"
    assert dev["speedup_sample_batch"] == pytest.approx(
        statistics.median(
            a / b
            for a, b in zip(
                dev["times_s"]["sample_batch_1d"], dev["times_s"]["sample_batch_2d"], strict=True
            )
        )
    )
    assert {t["figure"] for t in res["targets"]} >= {"sample_batch", "speedup_sample_batch"}
    assert all(t["value"] is None for t in res["targets"])  # quick cells are not the targets'
    md = (tmp_path / "host_side.md").read_text()
    assert "| CartPole-v1 16 mlp | sample+read |" in md and "2 devices / 1" in md
    # Floors: the memory one copies about as many bytes as the MinAtar batch holds (another
    # call's batch: the same columns, per-episode ones aside); the object one counts at least
    # one episode per env.
    assert set(cart["floors"]) == {"rollout", "sample_batch", "sample+read"}
    assert set(minatar["floors"]) == {"rollout", "sample_batch"}
    assert minatar["floors"]["sample_batch"]["bytes"] == pytest.approx(mem["held_bytes"], rel=0.05)
    objs = cart["floors"]["sample+read"]
    assert objs["episodes"] >= 16 and objs["objects"] == objs["episodes"]
    assert objs["measured_ratio"] == cart["sides"]["sample+read"]["ratio"]
    base = cart["sides"]["rollout"]["median_s"]
    assert objs["floor_ratio"] == pytest.approx((base + objs["minimal_read_ms"] / 1e3) / base)
    assert "## Floors" in md and "| CartPole-v1 16 mlp | sample_batch |" in md.split("## Floors")[1]
    assert (tmp_path / "host_side.png").stat().st_size > 0
    # A second run drawn against the first as "before".
    hs.plot(res, tmp_path / "both.png", before=res)
    assert (tmp_path / "both.png").stat().st_size > 0


def test_batch_bytes_counts_views_once_and_object_arrays_as_pointers():
    obs = np.zeros((5, 3), np.float32)
    track = np.zeros((6, 3), np.uint8)
    batch = SimpleNamespace(
        policy_batches={
            "p": {
                "obs": track[:-1],
                "new_obs": track[1:],  # a view of the same track
                "eps_id": np.array(["a"] * 5, dtype=object),
                "x": obs,
                "infos": [{"k": obs}],  # the same array again
            }
        }
    )
    got = hs.batch_bytes(batch)
    assert got["nbytes"] == 15 + 15 + 5 * 8 + 60 + 60
    assert got["held"] == 18 + 5 * 8 + 60


def test_read_all_reads_every_agent_episode():
    calls = []

    class Ep:
        def get_observations(self):
            calls.append("o")

        def get_actions(self):
            calls.append("a")

        def get_rewards(self):
            calls.append("r")

    multi = SimpleNamespace(agent_episodes={"a0": Ep(), "a1": Ep()})
    assert hs.read_all([Ep(), multi]) == 3
    assert calls == ["o", "a", "r"] * 3


def test_summarize_and_targets_by_hand():
    times = {"rollout": [1.0, 2.0, 1.0], "sample_batch": [2.0, 3.0, 1.5]}
    split = {"rollout_compute": [0.75, 1.5, 0.5], "rollout_copy": [0.25, 0.5, 0.5]}
    out = hs.summarize(times, split)
    sb = out["sample_batch"]
    assert sb["ratio"] == pytest.approx(1.5)  # median of 2, 1.5, 1.5
    # side - rollout per round: 1.0, 1.0, 0.5; compute share: 0.75, 0.75, 0.5.
    assert sb["conversion_s"] == pytest.approx(1.0) and sb["rollout_fraction"] == 0.75
    assert out["rollout"]["compute_s"] == 0.75 and out["rollout"]["copy_s"] == 0.5
    res = {
        "cells": [
            {"cell": "CartPole-v1 1024 random", "sides": {"sample_batch": {"ratio": 1.1}}},
            {"cell": "Breakout-MinAtar 1024 random", "sides": {}, "memory": {"batch_mib": 120}},
        ],
        "devices": {"cells": [{"cell": "devices Spread(8) 1024 random", "sides": {},
                               "speedup_sample_batch": 1.7}]},
    }  # fmt: skip
    got = {(t["cell"], t["figure"]): t for t in hs.check_targets(res)}
    assert got[("CartPole-v1 1024 random", "sample_batch")]["met"] is True
    assert got[("Breakout-MinAtar 1024 random", "batch_mib")]["met"] is False
    assert got[("devices Spread(8) 1024 random", "speedup_sample_batch")]["met"] is True
    assert got[("CartPole-v1 1024 random", "sample+read")]["value"] is None
    bars = hs.bars({"cells": [{"cell": "c", "sides": out}]})
    assert bars == {"c: sample_batch": (0.75, 0.25, 0.5, 2000.0)}


def test_options_a_checkout_lacks_are_dropped_with_a_note():
    def f(a, *, prefetch=False):
        return a

    assert hs.accepted(f, {"prefetch": True, "compact": 1}) == ({"prefetch": True}, {"compact": 1})
    args = hs.parse_args(["--quick", "--prefetch", "--sampler-kwargs", '{"x": 1}'])
    assert args.sampler_kwargs == {"x": 1, "prefetch": True} and args.rollout_length == 8
    with pytest.raises(SystemExit):
        hs.parse_args(["--sampler-kwargs", "[1]"])
    with pytest.raises(SystemExit):
        hs.parse_args(["--rounds", "0"])


def test_gpu_host_part_runs_tiny_on_cpu(tmp_path):
    gpu.main(["--quick", "--parts", "host", "--host-widths", "32", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "gpu.json").read_text())
    assert res["envs"] == {}
    (row,) = res["host_side"]["rows"]
    assert row["width"] == 32 and row["rollout_length"] == 1024 // 32
    assert set(row["sides"]) == {"rollout", "sample_batch", "sample_batch_1t", "sample+read"}
    assert row["sides"]["sample_batch"]["ratio"] > 0
    assert "## Host side" in (tmp_path / "gpu.md").read_text()


def test_gpu_host_series_skips_what_does_not_fit(monkeypatch):
    args = argparse.Namespace(
        host_widths=[1024, 4096, 1 << 30], host_max_steps=1 << 16, host_repeats=2,
        min_rollout_length=4, max_buffer_gb=24.0, sampler_kwargs={},
    )  # fmt: skip
    assert [gpu.host_rollout_length(w, args) for w in args.host_widths] == [64, 16, 4]
    seen = []

    def fake(width, T, args, sides, deadline):
        seen.append((width, list(sides)))
        return {"width": width, "rollout_length": T, "sides": {},
                "call_s": {"rollout": 1.0, "sample_batch": 2.0, "sample_batch_1t": 2.0,
                           "sample+read": 50.0}}  # fmt: skip

    monkeypatch.setattr(gpu, "measure_host", fake)
    monkeypatch.setattr(gpu.time, "perf_counter", lambda: 0.0)
    res = gpu.run_host(args, deadline=100.0)
    # 4096 is predicted 4x the 1024 figures: sample+read (200 s a call) does not fit in 100 s;
    # 2^30 envs x 4 steps is a ~220 GB trajectory: over --max-buffer-gb.
    assert seen == [
        (1024, list(gpu.HOST_SIDES)),
        (4096, ["rollout", "sample_batch", "sample_batch_1t"]),
    ]
    assert any("sample+read predicted" in why for why in res["skipped"])
    assert any(why.startswith(f"W={1 << 30}, T=4: trajectory") for why in res["skipped"])


def test_batch_bytes_skips_deferred_columns_without_building_them():
    from jaxsampler.episodes.batch import Deferred, MultiAgentBatch, SampleBatch

    def boom():
        raise AssertionError("a Deferred column was built")

    track = np.zeros((6, 4), np.float32)
    sb = SampleBatch({"obs": track[:-1], "new_obs": Deferred(boom), "infos": Deferred(boom),
                      "actions": np.zeros(5, np.int64)})  # fmt: skip
    batch = MultiAgentBatch({"p": sb}, env_steps=5)
    assert hs.batch_bytes(batch) == {"nbytes": 80 + 40, "held": 80 + 40}
    # Two spans: the track's rows and the actions; a view of the track merges into the first.
    sb2 = SampleBatch({"obs": track[:-1], "next": track[1:], "actions": np.zeros(5, np.int64)})
    assert sorted(hf.held_spans(sb2)) == [40, 96]


def test_copy_floor_and_object_counts_by_hand():
    got = hf.memory_floor([1000, 24], repeats=2)
    assert got["bytes"] == 1024 and got["spans"] == 2 and len(got["fresh_all_ms"]) == 2
    assert "cold_ms" not in got and len(hf.memory_floor([8], 1, idle_s=0.01)["cold_all_ms"]) == 1
    assert hf.memory_floor([], 1)["fresh_ms"] == 0.0
    multi = SimpleNamespace(agent_episodes={"a0": 1, "a1": 2, "a2": 3})
    counts = hf.count_episodes([object(), multi, multi])
    assert counts == {"episodes": 3, "multi": 2, "agent_episodes": 6}
    floor = hf.object_floor(counts, repeats=1)
    assert floor["objects"] == 9 and floor["minimal_ms"] >= 0 and floor["minimal_read_ms"] >= 0
    assert floor["minimal_read_steady_ms"] >= 0
    # the minimal episodes have the counts' shape, and reading them reads every agent's
    made = hf.minimal_episodes(counts)()
    assert len(made) == 3 and sorted(len(ep.agent_episodes) for ep in made[1:]) == [3, 3]
    assert len(made[0].get_observations()) == len(made[0].get_actions()) + 1
    assert hf.read_minimal(made) == made
    pytest.importorskip("ray.rllib")
    assert floor["rllib_ms"] > 0


def test_floors_table_and_closeness_sentences():
    assert hf.markdown_lines({"cells": [{"cell": "c", "sides": {}}]}) == []  # an older JSON
    floors = {
        "sample_batch": {"kind": "memory", "measured_ratio": 1.9, "floor_ratio": 1.5,
                         "reused_ratio": 1.1, "bytes": 3 << 20, "spans": 4, "fresh_ms": 5.0,
                         "reused_ms": 1.0, "cold_ratio": 1.8, "cold_ms": 40.0, "idle_s": 3.0,
                         "gap_s": 2.5},
        "sample+read": {"kind": "objects", "measured_ratio": 3.0, "floor_ratio": 1.25,
                        "rllib_ratio": 6.0, "episodes": 10, "multi": 0, "agent_episodes": 0,
                        "objects": 10, "minimal_ms": 1.0, "minimal_gc_off_ms": 0.5,
                        "minimal_read_ms": 2.5, "minimal_read_steady_ms": 3.0,
                        "rllib_ms": 20.0},
    }  # fmt: skip
    targets = [
        {"label": "A", "cell": "c", "figure": "sample_batch", "value": 1.9, "goal": 1.2,
         "met": False},
        {"label": "B", "cell": "c", "figure": "sample+read", "value": 3.0, "goal": 2.0,
         "met": False},
        {"label": "C", "cell": "c", "figure": "sample", "value": 3.0, "goal": 2.0, "met": False},
        {"label": "D", "cell": "c", "figure": "sample+read", "value": 1.0, "goal": 2.0,
         "met": True},
    ]  # fmt: skip
    md = "\n".join(hf.markdown_lines({"cells": [{"cell": "c", "floors": floors}],
                                      "targets": targets}))  # fmt: skip
    assert "| c | sample_batch | 1.90 | 1.50 (cold 1.80, reused 1.10) | 3.0 MiB in 4 arrays" in md
    assert "after 3 s idle 40.0 ms; the other sides of a round run 2.5 s" in md
    assert "| c | sample+read | 3.00 | 1.25 / 6.00 | 10 episodes: 10 slotted objects" in md
    assert (
        "(GC off 0.5 ms), made and read (three getters each) 2.5 ms after a forced "
        "collection, and in a steady loop 3.0 ms;" in md
    )
    # A: the floor (1.5) is above the target (1.2); 0.4 above the floor; 0.9 / 0.5 = 1.8x.
    assert "- A: measured 1.90, target 1.2, floor 1.50" in md
    assert "lies 0.30 below it" in md and "0.40 rollouts above" in md and "1.8x" in md
    assert "here 2.5 s) the floor is 1.80 and the target lies 0.60 below it" in md
    # B: the target is above the floor; 2.0 / 0.25 = 8x; RLlib's own episodes noted.
    assert "- B: measured 3.00, target 2, floor 1.25" in md and "is 0.75 above it" in md
    assert "8.0x" in md and "alone give 6.00: the target lies 4.00 below it" in md
    assert "- C:" not in md and "- D:" not in md  # no floor / met
