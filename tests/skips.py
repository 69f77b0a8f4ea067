"""Skips must be reasoned: a run that skips a test for a reason not listed here fails.

A broken extra used to turn into silent ``importorskip`` skips; now every skip's reason (of a
test or of a whole file at collection) is checked against :data:`ALLOWED_SKIPS` at the end of
the session, on the xdist controller (which sees the workers' reports) or in the single process.
``JAXSAMPLER_ALLOW_SKIPS=1`` reports the unlisted skips without failing, for a developer on a
partial install. tests/conftest.py installs the hooks below.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import pytest

#: Substring of a skip reason -> why that skip is legitimate. Keep it short.
ALLOWED_SKIPS: dict[str, str] = {
    "MNISTBandit-bsuite left out": (
        "gymnax's MNIST bandit downloads MNIST when it is built; tests have no network"
    ),
}

#: Set to 1 to report unlisted skips without failing the run.
OPT_OUT_ENV = "JAXSAMPLER_ALLOW_SKIPS"

_SKIPS = pytest.StashKey[list[tuple[str, str]]]()


def skip_reason(longrepr: object) -> str:
    """The reason of a skipped report's ``longrepr`` (``(path, line, "Skipped: why")``)."""
    if isinstance(longrepr, (tuple, list)) and len(longrepr) == 3:
        reason = str(longrepr[2])
    else:
        reason = str(longrepr)
    return reason.removeprefix("Skipped: ")


def unlisted(skips: Sequence[tuple[str, str]], allowed: Mapping[str, str]) -> list[str]:
    """The ``"nodeid: reason"`` lines of the skips whose reason contains no allowed substring."""
    return [f"{nodeid}: {why}" for nodeid, why in skips if not any(a in why for a in allowed)]


def _on_controller(config: pytest.Config) -> bool:
    """Whether this process sees every report (not an xdist worker)."""
    return not hasattr(config, "workerinput")


def _record(config: pytest.Config, report: pytest.CollectReport | pytest.TestReport) -> None:
    """Keeps a skipped report's node id and reason (an xfail is not a skip)."""
    if report.skipped and not hasattr(report, "wasxfail") and _on_controller(config):
        config.stash.setdefault(_SKIPS, []).append((report.nodeid, skip_reason(report.longrepr)))


class SkipAllowlist:
    """The pytest plugin: records skips, fails the session on an unlisted one."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        _record(self.config, report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        _record(self.config, report)

    def _bad(self) -> list[str]:
        return unlisted(self.config.stash.get(_SKIPS, []), ALLOWED_SKIPS)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self._bad() and os.environ.get(OPT_OUT_ENV) != "1" and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        bad = self._bad()
        if not bad:
            return
        opted_out = os.environ.get(OPT_OUT_ENV) == "1"
        terminalreporter.section("skips not on the allowlist (tests/skips.py)", sep="=", red=True)
        for line in bad:
            terminalreporter.line(line)
        terminalreporter.line(
            f"{len(bad)} unlisted skip(s): "
            + (
                f"not failing the run ({OPT_OUT_ENV}=1)."
                if opted_out
                else "the run fails. Install the missing extra, fix the cause, or add the reason "
                f"to ALLOWED_SKIPS with why; on a partial install set {OPT_OUT_ENV}=1."
            )
        )


def install(config: pytest.Config) -> None:
    """Registers the allowlist plugin (from a conftest's ``pytest_configure``)."""
    config.pluginmanager.register(SkipAllowlist(config), "jaxsampler-skip-allowlist")
