"""Tests that compare against arrays recorded under XLA's default optimization rerun
themselves with it when the quick tier compiles without (tests/conftest.py)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def fast_compile() -> bool:
    """Whether this process compiles with XLA's optimization turned down (conftest)."""
    return "xla_backend_optimization_level=0" in os.environ.get("XLA_FLAGS", "")


def rerun_with_full_optimization(nodeid: str) -> None:
    """Runs the test ``nodeid`` in a fresh pytest process with XLA's defaults (two CPU
    devices, as conftest gives); fails with its output unless it passes."""
    env = {**os.environ, "JAXSAMPLER_TEST_FULL_OPT": "1"}
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", nodeid]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{nodeid} with XLA's defaults:\n{proc.stdout[-4000:]}"
