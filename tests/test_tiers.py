"""The skip allowlist (tests/skips.py), on small inner pytest sessions, and the tier lists
(tests/tiers.py) that tests/conftest.py marks the integration tests with."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import skips, tiers

ROOT = Path(__file__).resolve().parents[1]

CONFTEST = """
from tests.skips import install


def pytest_configure(config):
    install(config)
"""

TESTS = """
import pytest


def test_passes():
    pass


def test_skips():
    pytest.skip({reason!r})


@pytest.mark.xfail(reason="an expected failure is not a skip")
def test_xfails():
    raise AssertionError
"""


def inner(pytester: pytest.Pytester, reason: str) -> None:
    """An inner session: one passing test, one skipping with ``reason``, one xfail."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_inner=TESTS.format(reason=reason))


@pytest.fixture(autouse=True)
def no_opt_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(skips.OPT_OUT_ENV, raising=False)


def test_an_unlisted_skip_fails_the_session_and_is_named(pytester):
    inner(pytester, "the frobnicator is not installed")
    res = pytester.runpytest()
    res.assert_outcomes(passed=1, skipped=1, xfailed=1)
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    res.stdout.fnmatch_lines(
        [
            "*skips not on the allowlist*",
            "test_inner.py::test_skips: the frobnicator is not installed",
            f"1 unlisted skip(s): the run fails.*{skips.OPT_OUT_ENV}=1*",
        ]
    )


def test_a_listed_skip_passes(pytester):
    inner(pytester, "MNISTBandit-bsuite left out: downloads the MNIST data set")
    res = pytester.runpytest()
    res.assert_outcomes(passed=1, skipped=1, xfailed=1)
    assert res.ret == pytest.ExitCode.OK
    assert "not on the allowlist" not in res.stdout.str()


def test_the_opt_out_reports_without_failing(pytester, monkeypatch):
    monkeypatch.setenv(skips.OPT_OUT_ENV, "1")
    inner(pytester, "the frobnicator is not installed")
    res = pytester.runpytest()
    assert res.ret == pytest.ExitCode.OK
    res.stdout.fnmatch_lines(
        ["*the frobnicator*", f"*not failing the run ({skips.OPT_OUT_ENV}=1)*"]
    )


def test_a_failing_run_keeps_its_exit_code(pytester):
    inner(pytester, "the frobnicator is not installed")
    pytester.makepyfile(test_fails="def test_fails():\n    assert 1 == 2\n")
    res = pytester.runpytest()
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    res.stdout.fnmatch_lines(["test_inner.py::test_skips: the frobnicator is not installed"])


def test_a_skipped_module_under_xdist_workers_fails_the_session(pytester, monkeypatch):
    """The controller sees the workers' reports: a skip inside a test and a whole file
    skipped at collection (a missing package's importorskip)."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("PYTEST_PLUGINS", raising=False)  # the inner session loads only its own
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    inner(pytester, "the frobnicator is not installed")
    pytester.makepyfile(
        test_module='import pytest\n\npytest.importorskip("no_such_package_xyz")\n\n\n'
        "def test_never():\n    pass\n"
    )
    res = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    out = res.stdout.str()
    assert "test_inner.py::test_skips: the frobnicator is not installed" in out
    assert re.search(r"test_module\.py: could not import 'no_such_package_xyz'", out), out
    assert "2 unlisted skip(s)" in out


def test_skip_reason_reads_both_report_forms():
    assert skips.skip_reason(("f.py", 3, "Skipped: why")) == "why"
    assert skips.skip_reason(["f.py", 3, "Skipped: why"]) == "why"  # as xdist sends it
    assert skips.unlisted([("a", "x left out"), ("b", "y")], {"left out": "ok"}) == ["b: y"]


def test_integration_reasons_by_path_name_and_marker():
    assert "RLlib" in tiers.integration_reason("tests/integrations/rllib/test_convert.py::t", ())
    name = "tests/integrations/test_loggers.py::test_real_wandb_offline"
    assert "W&B" in tiers.integration_reason(name, ())
    assert "W&B" in tiers.integration_reason(name + "[p0]", ())  # parametrized ids too
    assert tiers.integration_reason("tests/integrations/test_loggers.py::test_other", ()) is None
    assert "slow" in tiers.integration_reason("tests/test_spaces.py::test_x", ("slow",))
    assert tiers.integration_reason("tests/test_spaces.py::test_x", ("parametrize",)) is None
    moved = "tests/test_package.py::test_moved_module_paths_import_with_a_deprecation_warning"
    assert "RLlib" in tiers.integration_reason(
        moved + "[jaxsampler.rllib.convert-jaxsampler.integrations.rllib.convert-to_rllib]", ()
    )
    assert tiers.integration_reason(moved + "[jaxsampler.codec-x-y]", ()) is None  # one case only
    assert tiers.is_integration_file("tests/envs/adapters/test_brax.py")
    assert not tiers.is_integration_file("tests/envs/adapters/test_gymnax.py")


def test_every_listed_path_and_test_exists():
    """A renamed file or test must not drop silently into the quick tier."""
    for where in tiers.INTEGRATION_PATHS:
        assert (ROOT / where).exists(), where
    for nodeid in tiers.INTEGRATION_TESTS:
        path, name = nodeid.split("::")
        assert f"def {name.split('[')[0]}(" in (ROOT / path).read_text(), nodeid


@pytest.mark.parametrize(
    "markexpr, collects",
    [
        ("not integration", False),
        ("integration", True),
        ("slow", True),
        ("not slow", True),
        ("not integration and not slow", False),
    ],
)
def test_integration_files_are_collected_only_when_selectable(markexpr, collects):
    from _pytest.mark.expression import Expression

    expr = Expression.compile(markexpr)
    matches = lambda names: expr.evaluate(lambda name, /, **kwargs: name in names)
    assert tiers.selects_integration(matches) is collects
    assert tiers.selects_integration(None)  # no -m: everything
