import os
import sys

# Two XLA CPU devices for every test process (set before JAX starts), so tests of the
# sharded paths run in-process; everything else runs on the first device as before.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
    ).strip()
# The quick tier is compile-bound (tiny shapes, many programs): there XLA's CPU backend
# compiles without its expensive LLVM passes, which took tests/transforms from 73 s to 57 s
# on two idle cores. Programs run slower, which tiny shapes do not notice; results may round
# differently, so a test that compares against arrays recorded under XLA's defaults reruns
# itself with them (tests/full_opt.py). A run that selects integration tests (`-m`), and
# JAXSAMPLER_TEST_FULL_OPT=1, keep XLA's defaults; xdist workers inherit the decision.
if not all(
    "not integration" in expr
    for flag, expr in zip(sys.argv, sys.argv[1:], strict=False)
    if flag == "-m"
):  # the controller decides; its xdist workers (started without -m) inherit this
    os.environ["JAXSAMPLER_TEST_FULL_OPT"] = "1"
if os.environ.get("JAXSAMPLER_TEST_FULL_OPT") != "1" and "optimization_level" not in (
    os.environ.get("XLA_FLAGS", "")
):
    os.environ["XLA_FLAGS"] += (
        " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    )

from pathlib import Path

import jax
import pytest

from tests import skips, tiers
from tests.fakes import FakeEnv

# tests/test_tiers.py runs small inner pytest sessions.
pytest_plugins = ["pytester"]


def pytest_configure(config: pytest.Config) -> None:
    skips.install(config)


def _mark_matcher(config: pytest.Config):
    """Whether ``-m`` selects a test with the given marker names; ``None`` without ``-m``."""
    markexpr = config.getoption("markexpr", "") or ""
    if not markexpr.strip():
        return None
    from _pytest.mark.expression import Expression  # pytest's own parser of -m

    expr = Expression.compile(markexpr)
    return lambda names: expr.evaluate(lambda name, /, **kwargs: name in names)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Files of integration tests are not even imported when ``-m`` leaves them out."""
    try:
        rel = collection_path.relative_to(config.rootpath).as_posix()
    except ValueError:
        return None
    if tiers.is_integration_file(rel) and not tiers.selects_integration(_mark_matcher(config)):
        return True
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m deselection
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the integration tests (tests/tiers.py lists them)."""
    for item in items:
        if tiers.integration_reason(item.nodeid, (m.name for m in item.iter_markers())):
            item.add_marker(pytest.mark.integration)


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


@pytest.fixture(scope="module", autouse=True)
def _no_ray_cluster_left_running():
    """Each test module leaves no Ray cluster behind. RLlib starts one on its own when an
    algorithm is built; one left running forwards its raylet's log lines (a full-disk
    warning, say) to this process's stderr at any later time, into another test's captured
    output (the quiet CLI test's empty stderr)."""
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
