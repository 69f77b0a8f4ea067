"""Running a test script on several XLA CPU devices (a subprocess: the device count is
fixed when JAX starts)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_on_devices(script: str, marker: str, devices: int = 2, timeout: int = 300) -> str:
    """Runs ``script`` with ``devices`` CPU devices; asserts it exits 0 and prints
    ``marker``. Returns its stdout."""
    env = dict(
        os.environ,
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        PYTHONPATH=str(ROOT),
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert marker in proc.stdout, proc.stdout[-2000:]
    return proc.stdout
