"""One sampler family: ``js.Sampler(...)`` builds the member that fits the env, and every
member is a ``js.Sampler``."""

from __future__ import annotations

import abc
import inspect

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.sampling import DeviceSampler, HostSampler


@pytest.fixture(scope="module")
def cartpole_policy():
    env = js.make("CartPole-v1")
    return js.RandomPolicy(env.observation_space, env.action_space)


def test_device_env_builds_a_device_sampler(cartpole_policy):
    s = js.Sampler("CartPole-v1", cartpole_policy, num_envs=2, rollout_length=4)
    assert type(s) is DeviceSampler and isinstance(s, js.Sampler)
    assert sum(len(e) for e in s.sample(None)) == s.metrics.num_env_steps_sampled > 0


def test_gym_id_builds_a_host_sampler_that_is_a_sampler(cartpole_policy):
    with js.Sampler("gym:CartPole-v1", cartpole_policy, num_envs=2, rollout_length=4) as s:
        assert type(s) is HostSampler and isinstance(s, js.Sampler)
        assert s.host_env.num_envs == 2
        episodes = s.sample(None)
        assert sum(len(e) for e in episodes) == s.metrics.num_env_steps_sampled == 8


def test_make_gym_id_gives_the_host_env_the_sampler_uses(cartpole_policy):
    """``js.make("gym:<id>")`` and ``js.Sampler("gym:<id>")`` build the same envs: same seed,
    same episodes."""
    host = js.make("gym:CartPole-v1", num_envs=2, seed=7)
    assert isinstance(host, js.host_envs.HostEnv)
    with (
        js.Sampler(host, cartpole_policy, rollout_length=6, seed=7) as a,
        js.Sampler("gym:CartPole-v1", cartpole_policy, num_envs=2, rollout_length=6, seed=7) as b,
    ):
        ea, eb = a.sample(None), b.sample(None)
        assert [e.id_ for e in ea] == [e.id_ for e in eb]
        for x, y in zip(ea, eb, strict=True):
            np.testing.assert_array_equal(x.get_observations(), y.get_observations())
            np.testing.assert_array_equal(x.get_actions(), y.get_actions())


def test_constructing_a_member_directly_still_works(cartpole_policy):
    env = js.make("CartPole-v1")
    s = DeviceSampler(env, cartpole_policy, num_envs=3, rollout_length=2, seed=1)
    assert isinstance(s, js.Sampler) and s.num_envs == 3


def test_bad_arguments_name_the_problem(cartpole_policy):
    with pytest.raises(TypeError, match="Sampler"):
        js.Sampler()
    with pytest.raises(TypeError, match="Sampler"):
        js.Sampler("CartPole-v1", cartpole_policy, 1, 2, 3, 4)
    with pytest.raises(ValueError, match="env_params are for pure-JAX envs"):
        js.Sampler("gym:CartPole-v1", cartpole_policy, env_params=object())
    host = js.make("gym:CartPole-v1", num_envs=2)
    with pytest.raises(ValueError, match="num_envs=3 but the host env has 2 sub-envs"):
        js.Sampler(host, cartpole_policy, num_envs=3)
    host.close()


def test_a_member_must_implement_the_whole_interface():
    class Half(js.Sampler):
        def sample(self, params, num_timesteps=None, num_episodes=None, force_reset=False):
            return []

    with pytest.raises(TypeError, match="abstract"):
        Half()


def test_a_wrapped_gymnasium_vector_env_is_a_vector_env(cartpole_policy):
    gym = pytest.importorskip("gymnasium")
    from gymnasium.wrappers.vector import RecordEpisodeStatistics

    vec = RecordEpisodeStatistics(
        gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync")
    )
    with js.Sampler(vec, cartpole_policy, rollout_length=4) as s:
        assert s.host_env.num_envs == 3
        assert s.sample(None) and s.metrics.num_env_steps_sampled == 12


def test_envs_the_factory_made_are_closed_when_the_sampler_cannot_be_built(monkeypatch):
    """A failed construction leaves no sub-env open; an env the caller built stays theirs."""
    from jaxsampler.host_envs import GymnasiumHostEnv

    closed = []
    monkeypatch.setattr(GymnasiumHostEnv, "close", lambda self: closed.append(self))
    wrong = js.RandomPolicy(js.spaces.Box(-1, 1, (5,), np.float32), js.spaces.Discrete(2))
    with pytest.raises(ValueError, match="mismatched observation space"):
        js.Sampler("gym:CartPole-v1", wrong, num_envs=2)
    assert len(closed) == 1
    env = js.make("CartPole-v1")
    policy = js.RandomPolicy(env.observation_space, env.action_space)
    with pytest.raises(ValueError, match="env_params"):
        js.Sampler("gym:CartPole-v1", policy, env_params={"x": 1})
    assert len(closed) == 2
    mine = GymnasiumHostEnv("CartPole-v1", 2)
    with pytest.raises(ValueError, match="num_envs=3"):
        js.Sampler(mine, policy, num_envs=3)
    assert len(closed) == 2  # not closed: the caller made it


def test_lookback_accepts_numpy_ints(cartpole_policy):
    s = js.Sampler("CartPole-v1", cartpole_policy, 2, 4, episode_lookback_horizon=np.int64(2))
    assert s.sample(None)
    with pytest.raises(ValueError, match="episode_lookback_horizon must be an int >= 0"):
        js.Sampler("CartPole-v1", cartpole_policy, 2, 4, episode_lookback_horizon=-1)


def test_every_member_says_how_many_envs_it_steps(cartpole_policy):
    assert js.Sampler("CartPole-v1", cartpole_policy, num_envs=3).num_envs == 3
    with js.Sampler("gym:CartPole-v1", cartpole_policy, num_envs=2) as s:
        assert s.num_envs == 2


def test_sampled_multi_agent_episodes_pickle():
    """The samplers' static agent -> module mapping is a picklable object, not a lambda."""
    import pickle

    env = js.make("TicTacToe-v0")
    mlp = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    policy = js.policies.MultiAgentPolicy(
        env, {"x": mlp, "o": mlp}, policy_mapping_fn=lambda a: "x" if a == "agent_0" else "o"
    )
    params = policy.init(jax.random.PRNGKey(0))
    for ep in js.Sampler(env, policy, num_envs=2, rollout_length=12).sample(params):
        back = pickle.loads(pickle.dumps(ep))
        assert back.id_ == ep.id_ and back.module_for("agent_1") == "o"
        for aid, sa in ep.agent_episodes.items():
            np.testing.assert_array_equal(back.agent_episodes[aid].get_actions(), sa.get_actions())


def test_the_signatures_are_the_real_parameters():
    """``inspect.signature`` shows the family's parameters on ``js.Sampler`` and each
    member's own on the member (no metaclass ``__call__`` hides them)."""
    P = inspect.Parameter
    family = inspect.signature(js.Sampler).parameters
    assert [(n, p.kind) for n, p in family.items()] == [
        ("env", P.POSITIONAL_OR_KEYWORD),
        ("policy", P.POSITIONAL_OR_KEYWORD),
        ("num_envs", P.POSITIONAL_OR_KEYWORD),
        ("rollout_length", P.POSITIONAL_OR_KEYWORD),
        ("seed", P.POSITIONAL_OR_KEYWORD),
        ("transforms", P.KEYWORD_ONLY),
        ("explore", P.KEYWORD_ONLY),
        ("devices", P.KEYWORD_ONLY),
        ("mesh", P.KEYWORD_ONLY),
        ("options", P.VAR_KEYWORD),
    ]
    assert [family[n].default for n in ("num_envs", "rollout_length", "seed", "explore")] == [
        None,
        128,
        0,
        True,
    ]
    device = inspect.signature(DeviceSampler).parameters
    host = inspect.signature(HostSampler).parameters
    for member in (device, host):  # js.Sampler(...) hands its arguments on unchanged
        assert list(member)[:5] == ["env", "policy", "num_envs", "rollout_length", "seed"]
        assert {"transforms", "explore", "devices", "mesh", "env_params", "callbacks"} <= set(
            member
        )
        assert not any(p.kind is P.VAR_KEYWORD for p in member.values())
    assert {"topup_length", "episode_factory", "reset_pool"} <= set(device) - set(host)
    assert {"batch_sizes", "timeout_s", "mark_off_policy"} <= set(host) - set(device)
    assert "feed" not in host  # one feed per kind of env, no option
    assert type(js.Sampler) is abc.ABCMeta  # no metaclass of its own


def _gym_envs(n):
    gym = pytest.importorskip("gymnasium")
    return [gym.make("CartPole-v1") for _ in range(n)]


def _env_kinds():
    """``(label, make env, member)`` for every kind of env the tests sample from."""
    gym_id = "gym:CartPole-v1"
    return [
        ("Env", lambda: js.make("CartPole-v1"), DeviceSampler),
        ("registered id", lambda: "CartPole-v1", DeviceSampler),
        ("suite id", lambda: "gymnax:CartPole-v1", DeviceSampler),
        ("HostEnv", lambda: js.make(gym_id, num_envs=2), HostSampler),
        ("gym: id", lambda: gym_id, HostSampler),
        ("Gymnasium env", lambda: _gym_envs(1)[0], HostSampler),
        ("list of Gymnasium envs", lambda: _gym_envs(2), HostSampler),
        ("list of factories", lambda: [lambda: _gym_envs(1)[0]] * 2, HostSampler),
        (
            "Gymnasium vector env",
            lambda: pytest.importorskip("gymnasium").make_vec(
                "CartPole-v1", num_envs=2, vectorization_mode="sync"
            ),
            HostSampler,
        ),
    ]


@pytest.mark.parametrize("label", [k[0] for k in _env_kinds()])
def test_every_env_kind_gets_its_member(label, cartpole_policy):
    """Exactly one member accepts each kind of env, and ``js.Sampler`` builds it: an
    instance of that member and of ``js.Sampler``."""
    ((_, make, member),) = [k for k in _env_kinds() if k[0] == label]
    env = make()
    assert [m for m in (DeviceSampler, HostSampler) if m.accepts(env)] == [member]
    assert not js.Sampler.accepts(env)  # the base builds no sampler itself
    s = js.Sampler(env, cartpole_policy, rollout_length=4)
    try:
        assert type(s) is member and isinstance(s, js.Sampler)
        assert s.sample(None) and s.metrics.num_env_steps_sampled > 0
    finally:
        s.close()


def test_multi_agent_env_kinds_get_their_member():
    env = js.make("TicTacToe-v0")
    policy = js.RandomPolicy(env.observation_space, env.action_space)
    assert type(js.Sampler(env, policy, num_envs=2, rollout_length=4)) is DeviceSampler
    ext = js.host_envs.ExternalMultiAgentEnv(
        env.observation_space, env.action_space, agent_ids=("a", "b")
    )
    with js.Sampler(ext, policy, timeout_s=0.1) as s:
        assert type(s) is HostSampler and isinstance(s, js.Sampler) and s.multi_agent


def test_host_envs_refuse_the_device_options_and_close_what_was_made_for_them(
    cartpole_policy, monkeypatch
):
    from jaxsampler.host_envs import GymnasiumHostEnv

    closed = []
    monkeypatch.setattr(GymnasiumHostEnv, "close", lambda self: closed.append(self))
    for option in ({"devices": 1}, {"mesh": object()}):
        with pytest.raises(ValueError, match="devices= / mesh= split the env axis"):
            js.Sampler("gym:CartPole-v1", cartpole_policy, num_envs=2, **option)
    assert len(closed) == 2
    mine = GymnasiumHostEnv("CartPole-v1", 2)
    with pytest.raises(ValueError, match="drop devices= / mesh="):
        HostSampler(mine, cartpole_policy, devices=1)
    assert len(closed) == 2  # the caller's env stays open


def test_host_sampler_builds_the_host_env_itself(cartpole_policy):
    """``HostSampler`` takes what ``js.Sampler`` hands it: a ``"gym:<id>"`` with its
    ``num_envs``, positionally as on the family."""
    with HostSampler("gym:CartPole-v1", cartpole_policy, 3, 5, 7) as s:
        assert (s.host_env.num_envs, s.rollout_length) == (3, 5)
        assert s.sample(None) and s.metrics.num_env_steps_sampled == 15
    with pytest.raises(TypeError, match="not a complete host env"):
        HostSampler(js.make("CartPole-v1"), cartpole_policy)
