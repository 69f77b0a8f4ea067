"""check_env: passes on good envs, names each kind of violation on broken ones."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.spaces import Box
from tests.fakes import FakeEnv, FakeParams


@pytest.mark.parametrize("env_id", ["CartPole-v1", "gymnax:Acrobot-v1"])
def test_good_envs_pass(env_id):
    report = js.check_env(js.make(env_id), num_envs=4)
    assert report.ok, str(report)
    assert {"jit and determinism", "TimeStep layout", "observations in space", "time limit"} <= set(report.checks_run)


def test_fake_env_passes():
    report = js.check_env(FakeEnv(), num_envs=8)
    assert report.ok, str(report)


@dataclasses.dataclass(frozen=True)
class SelfResetting(FakeEnv):
    """Resets itself on the step that ends an episode (the final observation is lost)."""

    def step(self, key, state, action, params=None):
        params = self.default_params if params is None else params
        state, ts = super().step(key, state, action, params)
        done = ts.terminated[0] | ts.truncated[0]
        re_state, re_ts = self.reset(key, params)
        pick = lambda a, b: jnp.where(done, a, b)  # noqa: E731
        return jax.tree.map(pick, re_state, state), ts.replace(obs=pick(re_ts.obs, ts.obs))


@dataclasses.dataclass(frozen=True)
class MergedFlags(FakeEnv):
    def step(self, key, state, action, params=None):
        state, ts = super().step(key, state, action, params)
        done = ts.terminated | ts.truncated
        return state, ts.replace(terminated=done, truncated=done)


@dataclasses.dataclass(frozen=True)
class NoTimeLimit(FakeEnv):
    def step(self, key, state, action, params=None):
        state, ts = super().step(key, state, action, params)
        return state, ts.replace(truncated=jnp.zeros_like(ts.truncated))


@dataclasses.dataclass(frozen=True)
class EarlyTruncation(FakeEnv):
    def step(self, key, state, action, params=None):
        state, ts = super().step(key, state, action, params)
        return state, ts.replace(truncated=ts.truncated | (state.time == 2))


@dataclasses.dataclass(frozen=True)
class TightSpace(FakeEnv):
    @property
    def observation_space(self) -> Box:
        return Box(-np.inf, 2.5, (2,), np.float32)


@dataclasses.dataclass(frozen=True)
class ScalarReward(FakeEnv):
    def step(self, key, state, action, params=None):
        state, ts = super().step(key, state, action, params)
        return state, ts.replace(reward=ts.reward[0])


@dataclasses.dataclass(frozen=True)
class InfoMismatch(FakeEnv):
    def step(self, key, state, action, params=None):
        state, ts = super().step(key, state, action, params)
        return state, ts.replace(info={"x": jnp.zeros(())})


@dataclasses.dataclass(frozen=True)
class NaNObs(FakeEnv):
    @property
    def default_params(self):
        return FakeParams(nan_tag=0.0)


@dataclasses.dataclass(frozen=True)
class Untraceable(FakeEnv):
    def step(self, key, state, action, params=None):
        if state.time > 0:  # Python branch on a traced value
            pass
        return super().step(key, state, action, params)


@pytest.mark.parametrize(
    "env, needle",
    [
        (SelfResetting(), "reset itself"),
        (MergedFlags(), "terminated mirrors truncated"),
        (NoTimeLimit(), "time limit did not fire"),
        (EarlyTruncation(), "truncated fired at step 2"),
        (TightSpace(), "observation outside Box"),
        (ScalarReward(), "TimeStep.reward has shape ()"),
        (InfoMismatch(), "reset and step return different pytrees"),
        (NaNObs(), "non-finite observation"),
        (Untraceable(), "failed under jax.jit"),
    ],
    ids=lambda x: type(x).__name__ if not isinstance(x, str) else "",
)
def test_violations_are_reported_in_plain_words(env, needle):
    report = js.check_env(env, num_envs=8)
    assert not report.ok
    assert any(needle in p for p in report.problems), str(report)
    with pytest.raises(js.EnvCheckError, match="problem"):
        js.check_env(env, num_envs=8, raise_on_error=True)


def test_not_an_env():
    report = js.check_env(object())
    assert not report.ok and "not a jaxsampler Env" in report.problems[0]
