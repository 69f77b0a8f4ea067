"""The MinAtar part of the gymnax ``check_env`` sweep (see
tests/envs/adapters/test_gymnax_suite.py).

A file of its own so that the test workers (pytest-xdist, whole files per worker) split
the sweep: each MinAtar env takes several seconds to compile.
"""

from __future__ import annotations

import pytest

from tests.envs.adapters.test_gymnax_suite import MINATAR, assert_outcome


@pytest.mark.slow
@pytest.mark.parametrize("env_id", MINATAR)
def test_check_env_outcome_minatar(env_id):
    assert_outcome(env_id)
