"""The whole-call passes of :func:`agent_steps` hold slot positions and counts in the
narrowest int dtype that fits the call (``int16`` for calls of up to 32,765 steps).

References: the dtype bounds against ``np.iinfo``; the steps and carry of real calls
(ChaosEnv: agents out of lockstep, steps hanging across calls; Spread) computed with the
positions forced to ``int32`` and ``int64`` equal, field by field and dtype by dtype, those
of the narrow default, which ``test_multi_agent.py`` checks against a reference loop.
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
from jaxsampler.sampling.device import multi
from jaxsampler.sampling.device.agent_steps import _index_dtype, agent_steps
from tests.fakes import ChaosEnv


def test_index_dtype_is_the_narrowest_that_holds_the_largest_value() -> None:
    i16, i32 = np.iinfo(np.int16).max, np.iinfo(np.int32).max
    assert _index_dtype(0) is np.int16
    assert _index_dtype(i16) is np.int16
    assert _index_dtype(i16 + 1) is np.int32
    assert _index_dtype(i32) is np.int32
    assert _index_dtype(i32 + 1) is np.int64


def _calls(monkeypatch: Any, env: Any, T: int) -> list[tuple[Any, ...]]:
    """The arguments of every ``agent_steps_sharded`` call of a few sampler calls."""
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    params = pol.init(jax.random.PRNGKey(3))
    s = DeviceSampler(env, pol, num_envs=4, rollout_length=T, seed=1, host_threads=1)
    seen: list[tuple[Any, ...]] = []
    real = multi.agent_steps_sharded

    def spy(call: Any, old: Any, step0: Any, nxt: Any) -> Any:
        seen.append((call, old, step0, nxt))
        return real(call, old, step0, nxt)

    with monkeypatch.context() as m:
        m.setattr(multi, "agent_steps_sharded", spy)
        for k in range(6):
            (s.sample if k % 2 else s.sample_batch)(params)
    return seen


@pytest.mark.parametrize("wide", [np.int32, np.int64])
@pytest.mark.parametrize("env_name", ["chaos", "spread"])
def test_wider_positions_give_the_same_steps_and_carry(
    monkeypatch: Any, wide: type, env_name: str
) -> None:
    env = ChaosEnv() if env_name == "chaos" else Spread(3)
    calls = _calls(monkeypatch, env, T=5)
    hanging = 0
    for args in calls:
        want, want_carry = agent_steps(*args)
        with monkeypatch.context() as m:
            m.setattr(agent_steps_module, "_index_dtype", lambda largest: wide)
            got, got_carry = agent_steps(*args)
        for name in vars(want):
            g, w = getattr(got, name), getattr(want, name)
            assert g.dtype == w.dtype, name
            np.testing.assert_array_equal(g, w, name)
        for name in vars(want_carry):
            for u, v in zip(
                jax.tree.leaves(getattr(got_carry, name)),
                jax.tree.leaves(getattr(want_carry, name)),
                strict=True,
            ):
                assert np.asarray(u).dtype == np.asarray(v).dtype, name
                np.testing.assert_array_equal(u, v, name)
        hanging += int(args[1].pend.sum())
        assert len(want.env) > 0
    if env_name == "chaos":
        assert hanging > 0  # calls that start with carried steps were compared too
