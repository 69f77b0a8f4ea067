"""check_env: passes on good envs, names each kind of violation on broken ones."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import jaxsampler as js
from jaxsampler.spaces import Box
from tests.fakes import ChaosEnv, FakeEnv, FakeParams


@pytest.mark.parametrize("env_id", ["CartPole-v1", "gymnax:Acrobot-v1"])
def test_good_envs_pass(env_id):
    report = js.check_env(js.make(env_id), num_envs=4)
    assert report.ok, str(report)
    assert {"jit and determinism", "TimeStep layout", "observations in space", "time limit"} <= set(
        report.checks_run
    )


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
        pick = lambda a, b: jnp.where(done, a, b)
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
    with pytest.raises(js.rollout.EnvCheckError, match="problem"):
        js.check_env(env, num_envs=8, raise_on_error=True)


def test_not_an_env():
    report = js.check_env(object())
    assert not report.ok and "not a jaxsampler Env" in report.problems[0]


class Unhashable(FakeEnv):
    __hash__ = None  # a mutable env: check_env and the rollouts cache compiled code per env


def test_unhashable_env():
    report = js.check_env(Unhashable())
    assert not report.ok and "not hashable" in report.problems[0]


# --- the multi-agent contract ---------------------------------------------------------


@pytest.mark.parametrize(
    "env, num_envs",
    [
        (js.make("Spread-v0"), 4),
        (js.make("TicTacToe-v0"), 8),
        (js.make("Goals-v0", n=2), 8),
        (ChaosEnv(), 8),
    ],
    ids=["Spread-v0", "TicTacToe-v0", "Goals-v0", "ChaosEnv"],
)
def test_multi_agent_envs_pass(env, num_envs):
    # The same sizes as the envs' own check_env tests: one compiled runner in a full run.
    report = js.check_env(env, num_envs=num_envs)
    assert report.ok, str(report)
    assert {"reset TimeStep", "done agents (sticky flags, acting, reward)", "time limit"} <= set(
        report.checks_run
    )


@struct.dataclass
class BugParams:
    bug: int = 0  # which bug BuggyChaos injects (0: none); traced, so one compile serves all
    max_steps_in_episode: int = 9


@dataclasses.dataclass(frozen=True)
class BuggyChaos(ChaosEnv):
    """ChaosEnv (agents finish at random times, out of lockstep) with one bug switched on
    by ``params.bug``: 1 flags not sticky, 2 done agents act, 3 done agents are rewarded,
    4 only agent 0 is truncated at the time limit, 5 nobody acts at reset, 6 reset reports
    agent 2 terminated with reward 1."""

    @property
    def default_params(self):
        return BugParams()

    def reset(self, key, params=None):
        params = self.default_params if params is None else params
        state, ts = super().reset(key, params)
        agent_2 = (jnp.arange(3) == 2) & (params.bug == 6)
        return state, ts.replace(
            acting=ts.acting & (params.bug != 5),
            terminated=ts.terminated | agent_2,
            reward=jnp.where(agent_2, 1.0, ts.reward).astype(jnp.float32),
        )

    def step(self, key, state, action, params=None):
        params = self.default_params if params is None else params
        new_state, ts = super().step(key, state, action, params)
        bug, was_done = params.bug, state.done
        done = ts.terminated | ts.truncated
        return new_state, ts.replace(
            terminated=jnp.where(bug == 1, ts.terminated & ~was_done, ts.terminated),  # only once
            truncated=jnp.where(bug == 4, ts.truncated & (jnp.arange(3) == 0), ts.truncated),
            acting=jnp.where(bug == 2, ts.acting | done, ts.acting),
            reward=jnp.where((bug == 3) & was_done, 1.0, ts.reward).astype(jnp.float32),
        )


def test_buggy_chaos_without_a_bug_passes():
    report = js.check_env(BuggyChaos(), BugParams(bug=0), num_envs=8)
    assert report.ok, str(report)


@pytest.mark.parametrize(
    "bug, needle",
    [
        (
            1,
            r"done flags are not sticky: agent \d of env \d+ was done at step \d+ "
            r"but reports neither",
        ),
        (2, r"done agent still acting: agent \d of env \d+ is done at step \d+"),
        (
            3,
            r"done agent still rewarded: agent \d of env \d+ was done at step \d+ "
            r"but gets reward 1.0",
        ),
        (4, r"time limit did not fire for agent [12]: env \d+ is still running after 7 steps"),
        (5, r"nobody acts at reset in env 0"),
        (6, r"reset reports agent 2 of env 0 as terminated or truncated"),
        (6, r"reset gives agent 2 of env 0 reward 1.0"),
    ],
    ids=[
        "not-sticky",
        "done-acting",
        "done-rewarded",
        "partial-time-limit",
        "nobody-at-reset",
        "reset-flags",
        "reset-reward",
    ],
)
def test_multi_agent_violations_are_reported(bug, needle):
    report = js.check_env(BuggyChaos(), BugParams(bug=bug), num_envs=8)
    assert any(re.search(needle, p) for p in report.problems), str(report)
    with pytest.raises(js.rollout.EnvCheckError, match=needle):  # cached: no second compile
        js.check_env(BuggyChaos(), BugParams(bug=bug), num_envs=8, raise_on_error=True)


# --- false positives fixed for gymnax's bsuite envs, real defects still caught ----------


@dataclasses.dataclass(frozen=True)
class EndsAtLimit(FakeEnv):
    """Every episode terminates at time == max_steps_in_episode (DeepSea-like): at the
    default limit terminated and truncated are both True, yet they are distinct."""

    @property
    def default_params(self):
        return FakeParams(term_len=9, max_steps_in_episode=9)

    def step_env(self, key, state, action, params):
        obs, state, reward, _, info = super().step_env(key, state, action, params)
        time = state.time + 1
        return obs, state, reward, time == params.term_len, info


@dataclasses.dataclass(frozen=True)
class EndsAtLimitMerged(EndsAtLimit):
    def step(self, key, state, action, params=None):
        state, ts = super().step(key, state, action, params)
        done = ts.terminated | ts.truncated
        return state, ts.replace(terminated=done, truncated=done)


@dataclasses.dataclass(frozen=True)
class ConstantObsBandit(FakeEnv):
    """One-step episodes with one constant observation (SimpleBandit-like)."""

    def reset_env(self, key, params):
        obs, state = super().reset_env(key, params)
        return jnp.ones((2,), jnp.float32), state

    def step_env(self, key, state, action, params):
        _, state, reward, _, info = super().step_env(key, state, action, params)
        return jnp.ones((2,), jnp.float32), state, reward, jnp.bool_(True), info


@pytest.mark.parametrize(
    "env", [EndsAtLimit(), ConstantObsBandit()], ids=lambda e: type(e).__name__
)
def test_fixed_length_and_constant_obs_envs_pass(env):
    report = js.check_env(env, num_envs=4)
    assert report.ok, str(report)


@pytest.mark.parametrize(
    "env, needle",
    [
        (EndsAtLimitMerged(), "terminated mirrors truncated"),
        (SelfResetting(), "reset itself"),
    ],
    ids=lambda x: type(x).__name__ if not isinstance(x, str) else "",
)
def test_real_defects_still_caught_in_those_shapes(env, needle):
    report = js.check_env(env, num_envs=4)
    assert any(needle in p for p in report.problems), str(report)
