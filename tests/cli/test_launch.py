"""python -m jaxsampler.cli.launch / jaxsampler.cli.launch.launch: N local processes of one job."""

import io
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from jaxsampler.cli.launch import launch, main

JOB = textwrap.dedent(
    """
    import sys
    from jaxsampler.rollout import distributed
    distributed.initialize()
    import jax, numpy as np
    me = jax.process_index()
    total = distributed.process_sum({"x": np.array([me + 1.0])})["x"]
    print(f"rank {me} of {jax.process_count()} devices {jax.device_count()} sum {total[0]:g} "
          f"args {sys.argv[1:]}")
    """
)


def test_launch_runs_a_script_as_two_processes_of_one_job(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    out, err = io.StringIO(), io.StringIO()
    code = launch([str(script), "--flag", "x"], n=2, stdout=out, stderr=err)
    assert code == 0, err.getvalue()[-3000:]
    lines = out.getvalue().splitlines()
    for i in range(2):
        # 2 processes x 1 device (the launcher's XLA_FLAGS replace this process's 2 devices),
        # the sum over processes 1 + 2, the script's own arguments untouched.
        assert f"[{i}] rank {i} of 2 devices 2 sum 3 args ['--flag', 'x']" in lines, lines


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_failing_process_ends_the_job_with_its_code_and_leaves_no_process(tmp_path):
    (tmp_path / "fail.py").write_text(
        textwrap.dedent(
            """
            import os, sys, pathlib
            from jaxsampler.rollout import distributed
            distributed.initialize()
            import jax, numpy as np
            me = jax.process_index()
            pathlib.Path(sys.argv[1], f"pid{me}").write_text(str(os.getpid()))
            for step in range(10**9):  # process 0 keeps waiting on collectives
                distributed.process_sum(np.ones(2))
                if me == 1 and step == 3:
                    sys.exit(3)
            """
        )
    )
    err = io.StringIO()
    # A hang guard in CI rather than a speed assertion: the launcher must return at all
    # (without the fail-fast exit, process 1 would wait in JAX's shutdown barrier and abort).
    code = launch([str(tmp_path / "fail.py"), str(tmp_path)], n=2, stderr=err, stdout=err)
    assert code == 3, err.getvalue()[-3000:]
    text = err.getvalue()
    assert "[launch] process 1 exited 3; stopping the others" in text, text[-3000:]
    assert "process 1 of 2 exits with status 3; not waiting" in text, text[-3000:]
    pids = [int((tmp_path / f"pid{i}").read_text()) for i in range(2)]
    assert all(_gone(pid) for pid in pids)


def test_ctrl_c_stops_every_process(tmp_path):
    code = "import os, time; print(os.getpid(), flush=True); time.sleep(120)"
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxsampler.cli.launch", "-n", "2", "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        # A child of a non-interactive shell may inherit an ignored SIGINT: restore it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        pids = [int(proc.stdout.readline().split()[1]) for _ in range(2)]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    deadline = time.monotonic() + 10  # reaped by the launcher before it returned
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(p) for p in pids)


def test_module_form_and_help(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    help_text = capsys.readouterr().out
    for option in ("-n", "--devices-per-process", "--port", "--timeout", "--pin", "-m module"):
        assert option in help_text
    pkg = tmp_path / "pkg_launch_test"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "hello.py").write_text(
        "import os, sys; print('hello', os.environ['JAXSAMPLER_PROCESS_ID'], sys.argv[1:])"
    )
    out = io.StringIO()
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    assert launch(["-m", "pkg_launch_test.hello", "-v"], n=3, env=env, stdout=out) == 0
    assert sorted(out.getvalue().splitlines()) == [f"[{i}] hello {i} ['-v']" for i in range(3)]


@pytest.mark.parametrize(
    "argv, kwargs, match",
    [
        ([], {}, "nothing to launch"),
        (["x.py"], {"n": 0}, "n .* >= 1"),
        (["x.py"], {"devices_per_process": 0}, "devices_per_process"),
        (["x.py"], {"port": 70000}, "port"),
        (["x.py"], {"timeout": 0}, "timeout"),
        (["-m"], {}, "-m needs"),
    ],
)
def test_bad_arguments_are_named(argv, kwargs, match):
    with pytest.raises(ValueError, match=match):
        launch(argv, **kwargs)
