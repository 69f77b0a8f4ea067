"""Every bad argument of `jaxsampler` and of the launcher ends in one line on stderr,
`<command>: error: ...`, and exit status 2: no usage block, no traceback."""

import os
import subprocess
import sys

import pytest

from jaxsampler import cli
from jaxsampler.cli import args as types
from jaxsampler.cli import launch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _one_line_error(capsys, run, prefix="jaxsampler: error: "):
    with pytest.raises(SystemExit) as e:
        run()
    assert e.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(prefix), lines[0]
    assert "Traceback" not in captured.err and captured.out == ""
    return lines[0]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["bench", "--devices", "0"], ["--devices", "'auto' or an integer >= 1", "'0'"]),
        (["bench", "--devices", "-2"], ["--devices", "'-2'"]),
        (["bench", "--devices", "abc"], ["--devices", "'abc'"]),
        (["bench", "--devices", "1.5"], ["--devices", "'1.5'"]),
        (["bench", "--hidden", "64,x"], ["--hidden", "comma-separated integers >= 1", "'64,x'"]),
        (["bench", "--hidden", "64,0"], ["--hidden", "'64,0'"]),
        (["bench", "--hidden", ""], ["--hidden"]),
        (["bench", "--rollout-length", "0"], ["--rollout-length", ">= 1"]),
        (["bench", "--rollout-length", "x"], ["--rollout-length"]),
        (["bench", "--repeats", "-1"], ["--repeats", ">= 1"]),
        (["bench", "--widths", "0"], ["--widths", "'0'"]),
        (["bench", "--widths", "a,b"], ["--widths"]),
        (["bench", "--widths", ""], ["--widths"]),
        (["bench", "--seed", "-1"], ["--seed", "from 0 to"]),
        (["bench", "--seed", str(2**32)], ["--seed"]),
        (["bench", "--policy", "gru"], ["--policy", "invalid choice"]),
        (["bench", "--frobnicate"], ["unrecognized arguments: --frobnicate"]),
        (["--hidden", "64,x"], ["--hidden"]),  # options alone: bench
        (["bnech"], ["unknown command 'bnech'", "did you mean 'bench'"]),
        (["check"], ["check", "required", "env"]),
        (["check", "CartPole-v1", "--frame", "a.png", "--no-frame"], ["not allowed with"]),
        (["envs", "extra"], ["unrecognized arguments: extra"]),
    ],
)
def test_bad_arguments_end_in_one_line(argv, words, capsys):
    line = _one_line_error(capsys, lambda: cli.main(argv))
    for w in words:
        assert w in line


@pytest.mark.parametrize(
    "argv, words",
    [
        (
            ["bench", "--env", "CartPol-v1", "--devices", "1"],
            ["unknown env id 'CartPol-v1'", "did you mean 'CartPole-v1'", "jaxsampler envs"],
        ),
        (["bench", "--env", "cartpole", "--devices", "1"], ["did you mean 'CartPole-v1'"]),
        (["check", "NoSuchEnv-v0"], ["unknown env id 'NoSuchEnv-v0'", "jaxsampler envs"]),
        (
            ["bench", "--env", "gymnax:Breakout-Minatar", "--devices", "1"],
            ["unknown gymnax env id", "'gymnax:Breakout-MinAtar'", "jaxsampler envs"],
        ),
        (["bench", "--env", "gym:CartPole-v1", "--devices", "1"], ["host-stepped env"]),
        (["check", "gym:CartPole-v1"], ["host-stepped env", "not a pure-JAX env"]),
        (["check", "CartPole-v1", "--frame", "frame.txt"], ["--frame", ".txt"]),
    ],
)
def test_bad_env_ids_and_paths_end_in_one_line(argv, words, capsys):
    line = _one_line_error(capsys, lambda: cli.main(argv))
    for w in words:
        assert w in line


def test_bad_json_paths_fail_before_any_timing(tmp_path, capsys):
    missing = str(tmp_path / "no" / "such" / "folder" / "out.json")
    line = _one_line_error(capsys, lambda: cli.main(["bench", "--json", missing]))
    assert "--json" in line and "does not exist" in line
    line = _one_line_error(capsys, lambda: cli.main(["bench", "--json", str(tmp_path)]))
    assert "--json" in line and "folder" in line


@pytest.mark.parametrize(
    "argv, words",
    [
        (["-n", "0", "x.py"], ["--num-processes", ">= 1"]),
        (["-n", "two", "x.py"], ["--num-processes"]),
        (["--devices-per-process", "0", "x.py"], ["--devices-per-process"]),
        (["--port", "0", "x.py"], ["--port", "1 to 65535"]),
        (["--port", "70000", "x.py"], ["--port"]),
        (["--timeout", "0", "x.py"], ["--timeout", "> 0"]),
        (["--timeout", "nan", "x.py"], ["--timeout"]),
        (["--grace", "-1", "x.py"], ["--grace", ">= 0"]),
        (["--wall-timeout", "-5", "x.py"], ["--wall-timeout"]),
        ([], ["give a script"]),
        (["-m"], ["-m needs"]),
    ],
)
def test_bad_launcher_arguments_end_in_one_line(argv, words, capsys):
    line = _one_line_error(
        capsys, lambda: launch.main(argv), prefix="python -m jaxsampler.cli.launch: error: "
    )
    for w in words:
        assert w in line


@pytest.mark.parametrize("argv", [["bench", "--devices", "abc"], ["bench", "--hidden", "64,x"]])
def test_the_command_line_prints_no_traceback(argv):
    """The issue's two tracebacks, through a real process."""
    proc = subprocess.run(
        [sys.executable, "-m", "jaxsampler.cli", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("jaxsampler: error: ")
    assert "Traceback" not in proc.stderr


def test_types_accept_good_values():
    assert types.devices("auto") == "auto" and types.devices("AUTO") == "auto"
    assert types.devices("3") == "3"
    assert types.hidden_sizes("64, 32") == (64, 32)
    assert types.widths("1,64") == [1, 64]
    assert types.positive_int("7") == 7 and types.seed("0") == 0
    assert types.port("65535") == 65535
    assert types.positive_float("inf") == float("inf") and types.nonnegative_float("0") == 0.0
