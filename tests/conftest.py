import os

# Two XLA CPU devices for every test process (set before JAX starts), so tests of the
# sharded paths run in-process; everything else runs on the first device as before.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
    ).strip()

import jax
import pytest

from tests.fakes import FakeEnv


@pytest.fixture(scope="session")
def fake_env():
    return FakeEnv()


@pytest.fixture(scope="session")
def key():
    return jax.random.PRNGKey(0)


@pytest.fixture
def served():
    """A PolicyServer (4 KB body limit) answered by a test PollLoop; ``holds``: episode ids
    whose answers the loop holds back while they run. Yields ``(server, loop, holds)``."""
    from jaxsampler.host_envs.external import ExternalEnv
    from jaxsampler.serving.server import PolicyServer
    from tests.fakes import ACT, OBS, PollLoop

    env = ExternalEnv(OBS, ACT, max_wait_s=0.005, episode_timeout_s=30.0)
    server = PolicyServer(env, port=0, max_body_bytes=4096)
    holds: set = set()
    loop = PollLoop(server, hold=lambda eid: eid in holds and env.episode_status(eid) == "running")
    yield server, loop, holds
    loop.close()
    server.close()
