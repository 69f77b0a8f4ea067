"""examples/ppo.py --checkpoint-dir: an interrupted run resumed in a fresh process gives the
uninterrupted run's per-update metrics bit for bit; a checkpoint of another configuration is
refused with a message naming the differing fields; --log-dir writes one JSON line per
update across the interruption.

Every run is a fresh ``python -m examples.ppo`` process. They share a JAX persistent
compilation cache (in the test's tmp dir) only to save compile time: a cached executable is
the one the compiler would produce again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import jaxsampler as js

ROOT = Path(__file__).resolve().parents[2]
# 6 updates of 2 envs x 16 steps, in chunks of 2 updates.
TINY = ["--seeds", "2", "--num-envs", "2", "--rollout-length", "16", "--total-timesteps", "192"]


def ppo(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        JAX_COMPILATION_CACHE_DIR=str(tmp / "jax_cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    return subprocess.run(
        [sys.executable, "-m", "examples.ppo", *TINY, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stderr[-4000:]}"
    return proc.stdout


@pytest.mark.slow
def test_resumed_curve_equals_uninterrupted_and_other_config_is_refused(tmp_path: Path) -> None:
    ckdir = tmp_path / "ckpt"
    logs = ["--log-dir", str(tmp_path / "logs"), "--quiet"]
    ok(ppo(tmp_path, "--checkpoint-every", "2", "--json", str(tmp_path / "a.json")))
    a = json.loads((tmp_path / "a.json").read_text())

    # Interrupted after the chunk holding update 3 (updates 3-4), then resumed in a new process.
    out = ok(
        ppo(
            tmp_path,
            "--checkpoint-every",
            "2",
            "--checkpoint-dir",
            str(ckdir),
            "--stop-after",
            "3",
            *logs,
        )
    )
    assert "stopped after update 4 of 6" in out
    ckpts = js.rollout.checkpoint.Checkpoints(ckdir, max_to_keep=2)
    assert ckpts.steps() == [2, 4]  # max_to_keep=2: the one after update 2 is kept too
    assert js.rollout.checkpoint.read_meta(ckpts.path(4))["updates_done"] == 4
    # The checkpoint's metric history holds exactly the first 4 updates of run A.
    saved = js.rollout.checkpoint.restore(ckpts.path(4))["metrics"]
    for k, v in a["metrics_per_seed"].items():
        np.testing.assert_array_equal(np.asarray(saved[k])[:, :4], np.asarray(v, np.float32)[:, :4])
        assert not np.asarray(saved[k])[:, 4:].any()

    out = ok(
        ppo(
            tmp_path,
            "--checkpoint-every",
            "2",
            "--checkpoint-dir",
            str(ckdir),
            "--json",
            str(tmp_path / "b.json"),
            *logs,
        )
    )
    assert "resumed from update 4 of 6" in out
    b = json.loads((tmp_path / "b.json").read_text())
    assert b["resumed_from"] == 4 and b["updates_done"] == 6 and not b["stopped"]
    assert ckpts.steps() == [4, 6]

    metrics_a, metrics_b = a["metrics_per_seed"], b["metrics_per_seed"]
    assert set(metrics_a) >= {"return_sum", "episodes", "loss", "pg_loss", "vf_loss", "entropy"}
    assert set(metrics_a) == set(metrics_b)
    for k in metrics_a:
        ma, mb = np.asarray(metrics_a[k], np.float32), np.asarray(metrics_b[k], np.float32)
        assert ma.shape == (2, 6)
        # Bit for bit (JSON floats round-trip float32 values exactly).
        assert ma.tobytes() == mb.tobytes(), f"{k}: resumed {mb} != uninterrupted {ma}"
    # The comparison means something: episodes finish, the losses change every update,
    # and the two seeds differ.
    assert np.asarray(metrics_a["episodes"]).sum() > 0
    loss = np.asarray(metrics_a["loss"])
    assert (np.diff(loss, axis=1) != 0).all() and (loss[0] != loss[1]).all()
    assert a["learning_curve_per_seed"] == b["learning_curve_per_seed"]
    assert a["final_mean_return_per_seed"] == b["final_mean_return_per_seed"]

    # The log: one line per update at its env step, the first run's and the resumed one's;
    # the seeds' mean loss and return of each update; env steps/s at each chunk's end.
    lines = js.integrations.loggers.read_jsonl(
        tmp_path / "logs" / js.integrations.loggers.JSONL_FILENAME
    )
    assert [r["step"] for r in lines] == [32 * (u + 1) for u in range(6)]
    np.testing.assert_allclose([r["loss/total"] for r in lines], loss.mean(0), rtol=1e-6)
    ret_sum, eps = (np.asarray(metrics_a[k]) for k in ("return_sum", "episodes"))
    for u, r in enumerate(lines):
        finished = eps[:, u] > 0
        want = (ret_sum[finished, u] / eps[finished, u]).mean() if finished.any() else np.nan
        np.testing.assert_allclose(r.get("train/episode_return", np.nan), want, rtol=1e-6)
        assert ("perf/env_steps_per_s" in r) == (u % 2 == 1)

    # Another configuration (4 envs, chunks of 3) refuses the checkpoint, naming both fields,
    # and leaves it as it was.
    bad = ppo(
        tmp_path, "--checkpoint-every", "3", "--checkpoint-dir", str(ckdir), "--num-envs", "4"
    )
    assert bad.returncode == 2, bad.stderr[-4000:]
    assert "another configuration" in bad.stderr
    assert "num_envs: checkpoint 2, this one 4" in bad.stderr
    assert "checkpoint_every: checkpoint 2, this one 3" in bad.stderr
    assert ckpts.steps() == [4, 6]
