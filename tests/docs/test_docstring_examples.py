"""The ``>>>`` examples in the package's docstrings (shown in the API reference) run.

Every module of the package is searched except the command line (its examples are shell
commands) and the RLlib integration (it imports RLlib; run with the integration tests).
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import jaxsampler

SKIP = ("jaxsampler.cli", "jaxsampler.integrations.rllib")


def _modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(jaxsampler.__path__, "jaxsampler."):
        if not info.name.startswith(SKIP):
            names.append(info.name)
    return sorted(names)


def _examples() -> list:
    finder = doctest.DocTestFinder(exclude_empty=True)
    params = []
    for name in _modules():
        try:
            module = importlib.import_module(name)
        except ImportError:  # an optional extra that is not installed
            continue
        for test in finder.find(module):
            if test.examples and test.name.startswith(name):
                params.append(pytest.param(test, id=test.name))
    return params


EXAMPLES = _examples()


def test_there_are_examples() -> None:
    """The finder reaches the package (a broken walk would pass vacuously)."""
    assert any("DomainRandomization" in p.id for p in EXAMPLES)


@pytest.mark.parametrize("test", EXAMPLES)
def test_docstring_example_runs(test: doctest.DocTest) -> None:
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    failures: list[str] = []
    runner.run(test, out=failures.append)
    assert runner.failures == 0, "".join(failures)
