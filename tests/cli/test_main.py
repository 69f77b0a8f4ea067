"""The `jaxsampler` command (run in-process with tiny sizes)."""

import importlib
import importlib.util
import json

import pytest

from jaxsampler import cli
from jaxsampler.cli import report
from jaxsampler.envs.registry import SUITES, registered_ids

TINY = ["--rollout-length", "4", "--repeats", "1", "--devices", "1", "--hidden", "8"]


def test_bench_prints_a_table_a_legend_and_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = cli.main(["bench", "--widths", "1,4", *TINY, "--json", str(out)])
    assert rc == 0
    captured = capsys.readouterr()
    table = captured.out.split("\n\n")[0].splitlines()
    assert table[0].split() == [
        "width", "devices", "actions/s", "env", "steps/s", "compile", "s", "steps/call",
        "vs", "hand-written", "vs", "SyncVectorEnv",
    ]  # fmt: skip
    assert [line.split()[0] for line in table[2:]] == ["1", "4"]
    for words in ("actions/s: agent actions", "env steps/s:", "compile s:", "vs hand-written:"):
        assert words in captured.out.replace("\n", " ")
    assert "machine load before the run:" in captured.out
    assert "[1/2] width 1" in captured.err and "[2/2] width 4" in captured.err  # progress
    data = json.loads(out.read_text())
    rows = data["results"]
    assert [r["num_envs"] for r in rows] == [1, 4]
    for r in rows:
        assert r["env_id"] == "CartPole-v1" and r["rollout_length"] == 4
        assert r["env_steps_per_s"] > 0 and r["actions_per_s"] > 0 and r["compile_s"] > 0
        assert r["env_steps_per_s"] == pytest.approx(r["num_envs"] * 4 / r["median_s"])
        assert r["vs_hand_written"] == pytest.approx(r["hand_median_s"] / r["median_s"])
        assert r["gym_id"] == "CartPole-v1" and r["gym_steps_per_call"] == 4
    assert data["environment"]["jax"] and data["environment"]["device_count"] >= 1
    assert data["load"]["cpu_count"] >= 1 and isinstance(data["load"]["busy"], bool)
    assert data["baselines"] == {"hand_written": "ran", "sync_vector_env": "ran"}


def test_bench_without_baselines_and_with_options_only(capsys):
    assert cli.main(["--widths", "2", "--no-baseline", *TINY]) == 0  # no subcommand: bench
    out = capsys.readouterr().out
    assert "vs hand-written" not in out.splitlines()[0]
    assert "vs hand-written: not run (--no-baseline)" in out


def test_bench_says_why_gymnasium_did_not_run(capsys):
    rc = cli.main(["bench", "--env", "Spread-v0", "--widths", "2", *TINY])
    assert rc == 0
    out = capsys.readouterr().out
    assert "vs hand-written" in out.splitlines()[0]
    assert "SyncVectorEnv" not in out.splitlines()[0]
    assert "vs SyncVectorEnv: not run (Gymnasium has no env 'Spread-v0')" in out


def test_bench_other_env_and_random_policy(capsys):
    rc = cli.main(["bench", "--env", "Pendulum-v1", "--policy", "random", "--widths", "2", *TINY])
    assert rc == 0
    captured = capsys.readouterr()
    assert "Pendulum-v1" in captured.err
    assert "vs SyncVectorEnv" in captured.out.splitlines()[0]


def test_gymnasium_is_timed_at_affordable_widths_only():
    assert report.gym_steps(1, 128) == 128
    assert report.gym_steps(64, 128) == 128
    assert report.gym_steps(256, 128) == report.GYM_MAX_STEPS // 256
    assert report.gym_steps(report.GYM_MAX_WIDTH + 1, 128) == 0
    assert report.gym_steps(report.GYM_MAX_WIDTH, 1) == 1


@pytest.mark.parametrize("busy", [True, False])
def test_the_load_line_warns_when_half_the_cores_are_busy(busy):
    info = {"loadavg": [3.0 if busy else 0.5, 2.0, 1.0], "cpu_count": 4, "busy": busy}
    text = report.load_line(info).replace("\n", " ")
    assert "on 4 cores" in text
    assert ("WARNING" in text and "trust the 'vs' ratios" in text) is busy


def test_load_info_compares_the_load_with_the_cores():
    info = report.load_info()
    assert info["cpu_count"] >= 1
    if info["loadavg"] is not None:
        assert info["busy"] == (info["loadavg"][0] > info["cpu_count"] / 2)


def test_envs_lists_builtin_ids_and_suite_prefixes(capsys):
    assert cli.main(["envs"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for env_id in registered_ids():
        assert f"  {env_id}" in lines
    for prefix, package in [*((s, s) for s in SUITES), ("gym", "gymnasium")]:
        (line,) = [ln for ln in lines if ln.startswith(f"  {prefix}:")]
        installed = importlib.util.find_spec(package) is not None
        assert ("not installed" not in line) is installed and "installed" in line
        assert f"e.g. {prefix}:{report.SUITE_EXAMPLES[prefix]}" in line
    assert "host-stepped" in [ln for ln in lines if ln.startswith("  gym:")][0]


def test_the_suite_example_ids_resolve():
    import jaxsampler as js

    env = js.make(f"gymnax:{report.SUITE_EXAMPLES['gymnax']}")  # the one suite always installed
    assert env.num_agents == 1


def test_help_says_what_the_tool_does(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "The ``jaxsampler`` command" not in text
    assert "Measures how fast jaxsampler samples" in text
    for command in ("bench", "check", "envs"):
        assert f"    {command} " in text
    _, subs = importlib.import_module("jaxsampler.cli.main")._parsers()
    for name, parser in subs.items():
        for action in parser._actions:
            if action.option_strings and action.nargs != 0 and action.dest != "frame":
                assert "default" in action.help, (name, action.dest)


def test_check_command(capsys, tmp_path):
    frame = tmp_path / "f.png"
    rc = cli.main(["check", "CartPole-v1", "--frame", str(frame)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "first frame" in out
