"""The HostEnv protocol: declared members, checked at sampler construction; the optional
``reset()`` and ``closed``; one ``poll(timeout=...)`` signature for every host env."""

from __future__ import annotations

import numpy as np
import pytest

import jaxsampler as js
from jaxsampler import spaces
from jaxsampler.constants import ALL_AGENTS, DEFAULT_AGENT_ID
from jaxsampler.host_envs import ExternalEnv, GymnasiumHostEnv, HostEnv, PollResult
from jaxsampler.host_envs.base import REQUIRED_MEMBERS, check_host_env
from jaxsampler.sampling import HostSampler

A = DEFAULT_AGENT_ID
OBS, ACT = spaces.Box(-10.0, 10.0, (2,)), spaces.Discrete(3)
POLICY = js.RandomPolicy(OBS, ACT)


class PollsOnly:
    """Looks like a host env (it polls) but has nothing else."""

    def poll(self, timeout=None):
        raise AssertionError("never polled: construction must fail first")


class Counter(HostEnv):
    """One sub-env whose episodes last 3 steps; records the timeouts it was polled with."""

    observation_space, action_space, agent_ids, num_envs = OBS, ACT, (A,), 1

    def __init__(self) -> None:
        self.t: int | None = None
        self.timeouts: list[float | None] = []

    def poll(self, timeout: float | None = None) -> PollResult:
        self.timeouts.append(timeout)
        if self.t is None:
            self.t = 0
            return PollResult({0: {A: np.zeros(2, np.float32)}}, {}, {}, {}, {}, {})
        self.t += 1
        done = self.t >= 3
        obs = {0: {A: np.full(2, self.t, np.float32)}}
        flags = {0: {A: done, ALL_AGENTS: done}}
        res = PollResult(obs, {0: {A: 1.0}}, flags, {0: {A: False, ALL_AGENTS: False}}, {}, {})
        if done:
            self.t = None
        return res

    def send_actions(self, actions) -> None:
        assert set(actions) == {0}


class NoAgents(HostEnv):
    """A subclass that forgot two of the declared attributes."""

    observation_space, action_space = OBS, ACT

    def poll(self, timeout: float | None = None) -> PollResult:
        raise AssertionError("never polled: construction must fail first")

    def send_actions(self, actions) -> None:
        raise AssertionError("never called")


@pytest.mark.parametrize("build", [js.Sampler, HostSampler])
def test_an_incomplete_host_env_fails_at_construction_naming_what_it_lacks(build):
    with pytest.raises(TypeError) as info:
        build(PollsOnly(), POLICY)
    msg = str(info.value)
    for name in set(REQUIRED_MEMBERS) - {"poll"}:
        assert name in msg, name
    assert "PollsOnly" in msg and "lacks poll" not in msg


@pytest.mark.parametrize("build", [js.Sampler, HostSampler])
def test_a_subclass_without_its_declared_attributes_fails_at_construction(build):
    with pytest.raises(TypeError, match="lacks agent_ids, num_envs"):
        build(NoAgents(), POLICY)


def test_a_complete_duck_typed_env_must_subclass_host_env():
    class Duck(PollsOnly):
        observation_space, action_space, agent_ids, num_envs = OBS, ACT, (A,), 1

        def send_actions(self, actions):
            pass

        def close(self):
            pass

    with pytest.raises(TypeError, match="subclass HostEnv"):
        js.Sampler(Duck(), POLICY)
    env = Counter()
    assert check_host_env(env) is env


def test_abstract_methods_are_enforced():
    class NoSend(HostEnv):
        def poll(self, timeout=None):
            return PollResult({}, {}, {}, {}, {}, {})

    with pytest.raises(TypeError, match="send_actions"):
        NoSend()


def test_reset_is_optional_and_resettable_says_whether_it_exists():
    class WithReset(Counter):
        def reset(self) -> None:
            self.t = None

    assert not Counter.resettable and WithReset.resettable
    assert GymnasiumHostEnv.resettable and not ExternalEnv.resettable
    with pytest.raises(NotImplementedError, match="Counter has no reset"):
        Counter().reset()
    # The sampler skips the reset of num_episodes calls for an env without one ...
    s = HostSampler(Counter(), POLICY)
    assert len(s.sample((), num_episodes=2)) == 2
    with pytest.raises(NotImplementedError, match="no reset"):  # ... and says so when asked
        s.reset()
    # ... and resets an env that has one.
    env = WithReset()
    s = HostSampler(env, POLICY)
    s.sample((), num_timesteps=2)
    assert env.t == 2
    eps = s.sample((), num_episodes=1)
    assert [len(e) for e in eps] == [3] and eps[0].t_started == 0


def test_a_reset_inherited_from_a_mixin_counts():
    """``resettable`` follows the MRO: a reset() from a mixin makes the env resettable, and
    ``num_episodes`` then really resets it (fresh episodes from t=0)."""

    class ResetMixin:
        resets = 0

        def reset(self) -> None:
            type(self).resets += 1
            self.t = None

    class Mixed(ResetMixin, Counter):
        pass

    class Opted(Mixed):
        resettable = False  # an explicit choice wins over an inherited reset()

    assert Mixed.resettable and not Opted.resettable and not Counter.resettable
    env = Mixed()
    s = HostSampler(env, POLICY)
    s.sample((), num_timesteps=2)
    before = Mixed.resets
    eps = s.sample((), num_episodes=1)
    assert Mixed.resets == before + 1 and [e.t_started for e in eps] == [0]


def test_poll_gets_the_call_deadline_as_timeout_only_when_there_is_one():
    env = Counter()
    HostSampler(env, POLICY).sample((), num_timesteps=4)
    assert env.timeouts and all(t is None for t in env.timeouts)
    env = Counter()
    HostSampler(env, POLICY, timeout_s=30.0).sample((), num_timesteps=4)
    assert env.timeouts and all(t is not None and 0.0 <= t <= 30.0 for t in env.timeouts)


def test_closed_defaults_to_false_and_ends_a_call_when_set():
    class Closing(Counter):
        polls = 0

        @property
        def closed(self) -> bool:
            return self.polls >= 2

        def poll(self, timeout: float | None = None) -> PollResult:
            self.polls += 1
            return super().poll(timeout)

    assert Counter().closed is False
    env = Closing()
    s = HostSampler(env, POLICY, rollout_length=50)
    s.sample(())
    assert env.polls == 2 and s.metrics.num_env_steps_sampled == 1


def test_feed_is_picked_once_from_the_agent_count():
    """Tracks for one agent (plain SingleAgentEpisode objects), the collector for more;
    there is no option to pick another."""

    class Two(Counter):
        agent_ids = ("a", "b")

    s = HostSampler(Counter(), POLICY)
    assert type(s.feed).__name__ == "TrackFeed"
    eps = s.sample((), num_timesteps=3)
    assert [type(e) for e in eps] == [js.SingleAgentEpisode]
    assert (eps[0].agent_id, eps[0].module_id, eps[0].multi_agent_episode_id) == (None,) * 3
    assert type(HostSampler(Two(), POLICY).feed).__name__ == "CollectorFeed"
    with pytest.raises(TypeError, match="feed"):
        HostSampler(Counter(), POLICY, feed="collector")


def test_each_feed_refuses_the_other_kind_of_env():
    from jaxsampler.sampling.host.feeds import CollectorFeed
    from jaxsampler.sampling.host.track import TrackFeed

    class Two(Counter):
        agent_ids = ("a", "b")

    with pytest.raises(ValueError, match="single-agent"):
        TrackFeed(HostSampler(Two(), POLICY)._books)
    with pytest.raises(ValueError, match="multi-agent"):
        CollectorFeed(HostSampler(Counter(), POLICY)._books)
