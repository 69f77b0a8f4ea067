"""Multi-agent conversion over several host threads: agent steps per env shard, pooled
row gathers and field reorders.

The reference is the same sampler on one host thread (the serial path), fed the same
params: every batch and every episode bit-identical over calls that leave agent steps
hanging across calls (ChaosEnv: agents out of lockstep), with the size thresholds below
which the work stays on one thread set to zero so tiny shapes take the threaded path.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.envs.spread import Spread
from jaxsampler.sampling import DeviceSampler
from jaxsampler.sampling.device import agent_steps as agent_steps_module
from jaxsampler.sampling.device import multi, multi_calls, parallel
from jaxsampler.sampling.device.agent_steps import agent_steps, agent_steps_sharded
from jaxsampler.sampling.device.parallel import HostPool
from tests.fakes import ChaosEnv
from tests.sampling.device.test_overlap import CALLS, assert_batches_equal, assert_episodes_equal

E, T = 5, 6


@pytest.fixture
def no_thresholds(monkeypatch: Any) -> None:
    monkeypatch.setattr(agent_steps_module, "MIN_SHARD_SLOTS", 0)
    monkeypatch.setattr(parallel, "MIN_SPLIT_BYTES", 0)
    monkeypatch.setattr(multi_calls, "MIN_SPLIT_BYTES", 0)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("env_name", ["chaos", "spread"])
def test_threaded_conversion_is_bit_identical_to_one_thread(
    no_thresholds: None, threads: int, env_name: str
) -> None:
    env = ChaosEnv() if env_name == "chaos" else Spread(3)
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    params = pol.init(jax.random.PRNGKey(0))

    def make(k: int) -> DeviceSampler:
        return DeviceSampler(
            env, pol, num_envs=E, rollout_length=T, seed=2, host_threads=k, overlap=False
        )

    fast, slow = make(threads), make(1)
    hanging = 0
    for kind, kw in CALLS + CALLS:
        a, b = getattr(fast, kind)(params, **kw), getattr(slow, kind)(params, **kw)
        if kind == "sample":
            assert_episodes_equal(a, b)
        else:
            assert_batches_equal(a, b)
        hanging += int(slow._convert._carry.pend.sum())
    if env_name == "chaos":
        assert hanging > 0  # steps carried across calls took the sharded path too


def test_sharded_agent_steps_equal_the_whole_call(no_thresholds: None) -> None:
    # Directly on one call's columns and carry, for every shard count up to E.
    env = ChaosEnv()
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    s = DeviceSampler(env, pol, num_envs=E, rollout_length=T, seed=5, host_threads=1)
    params = pol.init(jax.random.PRNGKey(1))
    seen = []
    real = multi.agent_steps_sharded

    def spy(call: Any, old: Any, step0: Any, nxt: Any) -> Any:
        seen.append((call, old, step0, nxt))
        return real(call, old, step0, nxt)

    multi.agent_steps_sharded = spy  # (restored below)
    try:
        for _ in range(3):
            s.sample_batch(params)
    finally:
        multi.agent_steps_sharded = real
    assert len(seen) == 3
    for call, old, step0, nxt in seen:
        want, want_carry = agent_steps(call, old, step0, nxt)
        for k in range(2, E + 1):
            got, got_carry = agent_steps_sharded(call, old, step0, nxt, HostPool(k))
            for name in vars(want):
                np.testing.assert_array_equal(getattr(got, name), getattr(want, name), name)
            for name in vars(want_carry):
                for u, v in zip(
                    jax.tree.leaves(getattr(got_carry, name)),
                    jax.tree.leaves(getattr(want_carry, name)),
                    strict=True,
                ):
                    np.testing.assert_array_equal(u, v, name)


def test_default_host_threads_by_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    """``host_threads=None``: one thread per local CPU device; on GPU / TPU devices
    ``ACCELERATOR_HOST_THREADS`` (or one per device, if more); never above the cores."""
    from types import SimpleNamespace

    from jaxsampler.sampling.device import setup

    def mesh(platform: str, n: int) -> Any:
        return SimpleNamespace(local_devices=[SimpleNamespace(platform=platform)] * n)

    monkeypatch.setattr(setup, "cores", lambda: 16)
    assert setup.default_host_threads(mesh("cpu", 1)) == 1
    assert setup.default_host_threads(mesh("cpu", 4)) == 4
    assert setup.default_host_threads(mesh("gpu", 1)) == setup.ACCELERATOR_HOST_THREADS == 8
    assert setup.default_host_threads(mesh("tpu", 12)) == 12
    monkeypatch.setattr(setup, "cores", lambda: 2)
    assert setup.default_host_threads(mesh("gpu", 1)) == 2
    assert setup.default_host_threads(mesh("cpu", 4)) == 2
    # no mesh: the default device, and what the sampler gets
    cpu = jax.local_devices()[0].platform == "cpu"
    assert setup.default_host_threads(None) == (1 if cpu else 2)
    env = Spread(2)
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    s = DeviceSampler(env, pol, num_envs=2, rollout_length=2, seed=0)
    assert s._pool.threads == (1 if cpu else 2)
