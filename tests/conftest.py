import jax
import pytest

from tests.fakes import FakeEnv


@pytest.fixture(scope="session")
def fake_env():
    return FakeEnv()


@pytest.fixture(scope="session")
def key():
    return jax.random.PRNGKey(0)
