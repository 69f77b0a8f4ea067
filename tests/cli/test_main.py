"""The `jaxsampler` command (run in-process with tiny sizes)."""

import json

import pytest

from jaxsampler import cli


def test_bench_prints_a_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = cli.main(
        [
            "bench",
            "--widths",
            "1,2",
            "--rollout-length",
            "4",
            "--repeats",
            "1",
            "--devices",
            "1",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    captured = capsys.readouterr()
    assert "actions/s" in captured.out and "compile s" in captured.out
    assert "[1/2] width 1" in captured.err and "[2/2] width 2" in captured.err  # progress
    data = json.loads(out.read_text())
    rows = data["results"]
    assert [r["num_envs"] for r in rows] == [1, 2]
    for r in rows:
        assert r["env_id"] == "CartPole-v1" and r["rollout_length"] == 4
        assert r["env_steps_per_s"] > 0 and r["actions_per_s"] > 0 and r["compile_s"] > 0
        assert r["env_steps_per_s"] == pytest.approx(r["num_envs"] * 4 / r["median_s"])
    assert data["environment"]["jax"] and data["environment"]["device_count"] >= 1


def test_bench_other_env_and_random_policy(capsys):
    rc = cli.main(
        [
            "bench",
            "--env",
            "Pendulum-v1",
            "--policy",
            "random",
            "--widths",
            "2",
            "--rollout-length",
            "3",
            "--repeats",
            "1",
            "--devices",
            "1",
        ]
    )
    assert rc == 0
    assert "Pendulum-v1" in capsys.readouterr().err


@pytest.mark.parametrize("widths", ["0", "a,b", ""])
def test_bad_widths_are_rejected(widths, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--widths", widths])
    assert e.value.code == 2
    assert "widths" in capsys.readouterr().err


def test_check_and_envs_commands(capsys):
    assert cli.main(["envs"]) == 0
    assert "CartPole-v1" in capsys.readouterr().out
    assert cli.main(["check", "NoSuchEnv-v0"]) == 2
    assert "unknown env id" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["check", "bench"])
def test_host_stepped_env_is_refused_with_a_clear_error(command, capsys):
    argv = ["check", "gym:CartPole-v1"] if command == "check" else ["bench", "--env"]
    if command == "bench":
        argv += ["gym:CartPole-v1", "--widths", "1", "--devices", "1"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "host-stepped env" in err and "not a pure-JAX env" in err
