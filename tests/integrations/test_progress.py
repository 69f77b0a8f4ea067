"""jaxsampler.integrations.progress: quiet rules, what a drawn bar shows, the sampler callback."""

from __future__ import annotations

import io

import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.integrations.progress import Bar, ProgressCallback, is_quiet, progress
from tests.fakes import FakeEnv


class TTY(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self):
        return True


@pytest.fixture
def no_quiet_env(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("JAXSAMPLER_QUIET", raising=False)


def test_quiet_prints_nothing_but_still_counts(capsys, no_quiet_env):
    tty = TTY()
    with progress(100, desc="train", quiet=True, file=tty) as bar:
        bar.update(30, loss=0.5)
        bar.update(20)
        bar.write("a line")
        assert bar.n == 50 and bar.quiet
    assert tty.getvalue() == ""
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_auto_quiet_when_not_a_tty_or_in_ci(capsys, monkeypatch, no_quiet_env):
    # pytest's captured stderr is not a terminal: automatic means quiet
    assert is_quiet(None) and is_quiet(None, io.StringIO())
    with progress(10) as bar:
        bar.update(10)
    assert capsys.readouterr().err == ""
    assert not is_quiet(None, TTY())
    for var in ("CI", "JAXSAMPLER_QUIET"):
        monkeypatch.setenv(var, "1")
        assert is_quiet(None, TTY())
        monkeypatch.setenv(var, "0")  # explicitly off
        assert not is_quiet(None, TTY())
        monkeypatch.delenv(var)
    monkeypatch.setenv("CI", "true")
    tty = TTY()
    with progress(10, file=tty) as bar:
        bar.update(5)
    assert tty.getvalue() == "" and bar.n == 5
    assert not is_quiet(False, io.StringIO())  # quiet=False forces a bar


def test_drawn_bar_shows_counts_rate_and_postfix(no_quiet_env):
    buf = io.StringIO()
    with progress(10, desc="ppo", quiet=False, file=buf, mininterval=0, miniters=1) as bar:
        bar.update(3, ret=12.3456789)
        bar.update(4, ret=float("nan"))  # NaN keeps the shown value
        bar.write("note")
    text = buf.getvalue()
    assert "ppo" in text and "3/10" in text and "7/10" in text
    assert "step/s" in text and "ret=12.35" in text
    assert "note" in text
    last = text.rstrip().rsplit("\r", 1)[-1]
    assert "7/10" in last and "ret=12.35" in last and "nan" not in last.lower()
    buf = io.StringIO()
    with progress(2_000_000, unit="env step", quiet=False, file=buf) as bar:
        bar.update(1_500_000)
    assert "1.50M/2.00M" in buf.getvalue() and "env step/s" in buf.getvalue()


def test_bar_rejects_a_bad_total():
    with pytest.raises(ValueError, match="total"):
        Bar(-1, quiet=True)
    with pytest.raises(ValueError, match="total"):
        Bar("10", quiet=True)


class Recorder:
    def __init__(self):
        self.steps = []

    def on_sample_end(self, report):
        self.steps.append(report.metrics.num_env_steps_sampled)


def test_callback_advances_by_each_calls_env_steps(no_quiet_env):
    env = FakeEnv()  # episodes end within 5 steps: every call completes some
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    buf = io.StringIO()
    rec = Recorder()
    with progress(3 * 2 * 7, quiet=False, file=buf, mininterval=0, miniters=1) as bar:
        cb = ProgressCallback(bar)
        sampler = js.Sampler(env, pol, num_envs=2, rollout_length=7, seed=0, callbacks=[rec, cb])
        seen = []
        for _ in range(3):
            sampler.sample(())
            seen.append(bar.n)
            assert bar.n == sampler.totals.env_steps
            ret = sampler.metrics.episode_return_mean
            assert f"return={ret:.4g}" in buf.getvalue().rsplit("\r", 1)[-1]
    assert seen == list(np.cumsum(rec.steps)) and 0 < seen[0] < seen[1] < seen[2]
    assert f"{seen[-1]}/42" in buf.getvalue()
    with pytest.raises(ValueError, match="count"):
        ProgressCallback(bar, count="episodes")


BENCH = ["bench", "--widths", "1,2", "--rollout-length", "3", "--repeats", "2", "--devices", "1"]


def test_bench_quiet_prints_only_the_table(capsys):
    from jaxsampler import cli

    assert cli.main([*BENCH, "--quiet"]) == 0
    out = capsys.readouterr()
    assert out.err == "" and "actions/s" in out.out


def test_bench_draws_a_bar_on_a_terminal(monkeypatch, capsys, no_quiet_env):
    from jaxsampler import cli

    tty = TTY()
    monkeypatch.setattr("sys.stderr", tty)
    assert cli.main(BENCH) == 0
    err = tty.getvalue()
    # 2 widths x (1 compiling + 2 timed calls), counted as they complete
    assert "bench" in err and "6/6" in err and "call/s" in err and "width=2" in err
    assert "[2/2] width 2" in err  # the per-width lines are written above the bar
    assert "actions/s" in capsys.readouterr().out
