"""to_rllib / from_rllib against RLlib 2.60 itself: exact, identity round trips.

Episodes come from real sampler output (two ``sample()`` calls, so continuation chunks with
lookback are covered) and from hand-built episodes. Equality is judged by RLlib's own
getters and ``get_state()`` on the RLlib side, by jaxsampler's ``get_state()`` on ours.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

pytest.importorskip("ray.rllib", reason="the RLlib conversions need ray[rllib] (the rllib extra)")
pytest.importorskip("torch", reason="jaxsampler.integrations.rllib needs torch (the rllib extra)")

import gymnasium as gym
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode as RlMultiAgentEpisode
from ray.rllib.env.single_agent_episode import (
    SingleAgentEpisode as RlSingleAgentEpisode,
)
from ray.rllib.env.utils.infinite_lookback_buffer import (
    InfiniteLookbackBuffer as RlBuffer,
)
from ray.rllib.policy.sample_batch import MultiAgentBatch as RlMultiAgentBatch
from ray.rllib.policy.sample_batch import SampleBatch as RlSampleBatch
from ray.rllib.policy.sample_batch import concat_samples

import jaxsampler as js
from jaxsampler.episodes.multi_agent import MultiAgentEpisode as JsMultiAgentEpisode
from jaxsampler.integrations.rllib import from_rllib, to_rllib
from tests.integrations.rllib.rl_compare import (
    assert_rl_ma_equal,
    assert_rl_sa_equal,
    same,
)

# -------------------------------------------------------------------- comparison helpers


def assert_js_sa_equal(a: js.SingleAgentEpisode, b: js.SingleAgentEpisode) -> None:
    assert type(a) is type(b) is js.SingleAgentEpisode
    same(a.get_state(), b.get_state())
    same(a.get_data_dict(), b.get_data_dict())
    assert len(a) == len(b)


# -------------------------------------------------------------------- sampler output


def sample_twice(env_id, num_envs=3, rollout_length=9, horizon=2, seed=0):
    env = js.make(env_id)
    pol = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(4,))
    params = pol.init(jax.random.PRNGKey(seed))
    s = js.Sampler(
        env,
        pol,
        num_envs=num_envs,
        rollout_length=rollout_length,
        seed=seed,
        episode_lookback_horizon=horizon,
    )
    return s.sample(params) + s.sample(params)


@pytest.fixture(scope="module", params=["CartPole-v1", "Pendulum-v1"])
def sa_episodes(request):
    eps = sample_twice(request.param)
    assert any(e.t_started > 0 and e.observations.lookback > 0 for e in eps)  # continuations
    assert any(e.is_done for e in eps) or request.param == "Pendulum-v1"
    return eps


def test_single_agent_round_trip_js_rllib_js(sa_episodes):
    rl = to_rllib(sa_episodes)
    assert isinstance(rl, list) and len(rl) == len(sa_episodes)
    for js_ep, rl_ep in zip(sa_episodes, rl, strict=True):
        assert type(rl_ep) is RlSingleAgentEpisode
        rl_ep.validate()
        # the RLlib episode reads as the jaxsampler one, lookback included
        same(rl_ep.get_observations(), js_ep.get_observations())
        same(rl_ep.get_actions(), js_ep.get_actions())
        same(rl_ep.get_rewards(), js_ep.get_rewards())
        same(rl_ep.get_infos(), js_ep.get_infos())
        assert rl_ep.observations.lookback == js_ep.observations.lookback
        assert rl_ep.get_observations(-1, neg_index_as_lookback=True).shape == (
            js_ep.observation_space.shape
        )
        assert rl_ep.observation_space == js_ep.observation_space.to_gymnasium()
        assert isinstance(rl_ep.action_space, gym.spaces.Space)
        assert (len(rl_ep), rl_ep.t_started, rl_ep.id_) == (len(js_ep), js_ep.t_started, js_ep.id_)
        assert (rl_ep.is_terminated, rl_ep.is_truncated) == (
            js_ep.is_terminated,
            js_ep.is_truncated,
        )
    back = from_rllib(rl)
    for a, b in zip(sa_episodes, back, strict=True):
        assert_js_sa_equal(a, b)


def test_single_agent_round_trip_rllib_js_rllib(sa_episodes):
    rl = to_rllib(sa_episodes)
    again = to_rllib(from_rllib(rl))
    for a, b in zip(rl, again, strict=True):
        assert_rl_sa_equal(a, b)


def test_fast_path_builds_what_rllibs_constructor_builds(sa_episodes):
    """to_rllib skips RLlib's constructor (re-validation, struct recomputation); the object
    must be the one the constructor makes from the same buffers, slot by slot."""
    for js_ep, rl_ep in zip(sa_episodes, to_rllib(sa_episodes), strict=True):

        def buf(b, space=None):
            return RlBuffer(b.data, b.lookback, space)

        obs_space = js_ep.observation_space.to_gymnasium()
        act_space = js_ep.action_space.to_gymnasium()
        ref = RlSingleAgentEpisode(
            js_ep.id_,
            observations=buf(js_ep.observations),
            observation_space=obs_space,
            infos=buf(js_ep.infos),
            actions=buf(js_ep.actions),
            action_space=act_space,
            rewards=buf(js_ep.rewards, gym.spaces.Box(float("-inf"), float("inf"), (), np.float32)),
            terminated=js_ep.is_terminated,
            truncated=js_ep.is_truncated,
            extra_model_outputs={k: buf(v) for k, v in js_ep.extra_model_outputs.items()},
            t_started=js_ep.t_started,
        )
        for slot in RlSingleAgentEpisode.__slots__:
            x, y = getattr(ref, slot), getattr(rl_ep, slot)
            if slot == "extra_model_outputs":
                assert list(x) == list(y) and all(x[k] == y[k] for k in x)
            else:
                assert x == y, slot
        assert_rl_sa_equal(ref, rl_ep)


def test_converted_arrays_are_shared_and_lists_copied(sa_episodes):
    js_ep = sa_episodes[-1]
    rl_ep = to_rllib(js_ep)
    assert rl_ep.observations.data is js_ep.observations.data  # no copy per episode
    assert rl_ep.infos.data == js_ep.infos.data and rl_ep.infos.data is not js_ep.infos.data


# -------------------------------------------------------------------- hand-built episodes


def hand_built_episodes():
    """List-mode, numpy'ized, empty, with custom data, Dict observations, gymnasium spaces."""
    box = js.spaces.Box(-1.0, 1.0, (2,))
    a = js.SingleAgentEpisode(observation_space=box, action_space=js.spaces.Discrete(3))
    a.add_env_reset(np.zeros(2, np.float32), {"r": 0})
    for t in range(4):
        a.add_env_step(
            np.full(2, t / 10, np.float32),
            t % 3,
            float(t),
            {"i": t},
            extra_model_outputs={"action_logp": np.float32(-t)},
        )
    a.custom_data["k"] = [1, 2]
    b = a.cut(len_lookback_buffer=2)
    b.add_env_step(
        np.ones(2, np.float32), 1, 0.5, extra_model_outputs={"action_logp": 0.0}, terminated=True
    )
    numpy_a = js.SingleAgentEpisode.from_state(a.get_state()).to_numpy()
    d = js.spaces.Dict(pos=js.spaces.Box(0.0, 1.0, (3,)), flag=js.spaces.Discrete(2))
    c = js.SingleAgentEpisode(observation_space=d, action_space=js.spaces.Box(-2.0, 2.0, (1,)))
    c.add_env_reset({"flag": np.int32(0), "pos": np.zeros(3, np.float32)})
    c.add_env_step(
        {"flag": np.int32(1), "pos": np.ones(3, np.float32)},
        np.ones(1, np.float32),
        1.0,
        truncated=True,
    )
    c.to_numpy()
    empty = js.SingleAgentEpisode(id_="empty")
    return [a, b, numpy_a, c, empty]


def test_hand_built_round_trips():
    eps = hand_built_episodes()
    rl = to_rllib(tuple(eps))
    assert rl[0].custom_data == {"k": [1, 2]} and rl[0].get_duration_s() == eps[0].get_duration_s()
    assert rl[1].get_actions(-1, neg_index_as_lookback=True) == eps[1].get_actions(
        -1, neg_index_as_lookback=True
    )
    assert rl[3].get_observations(-1)["pos"].tolist() == [1.0, 1.0, 1.0]
    for a, b in zip(eps, from_rllib(rl), strict=True):
        assert_js_sa_equal(a, b)
    for a, b in zip(rl, to_rllib(from_rllib(rl)), strict=True):
        assert_rl_sa_equal(a, b)


def test_rllib_built_episodes_round_trip():
    """Episodes stepped by RLlib itself (gymnasium spaces, list and numpy'ized mode)."""
    obs_space, act_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32), gym.spaces.Discrete(4)
    ep = RlSingleAgentEpisode(observation_space=obs_space, action_space=act_space)
    ep.add_env_reset(np.zeros(2, np.float32), infos={"a": 1})
    for t in range(5):
        ep.add_env_step(
            np.full(2, t, np.float32), t % 4, 1.0 + t, extra_model_outputs={"vf_preds": float(t)}
        )
    cut = ep.cut(len_lookback_buffer=3)
    cut.add_env_step(
        np.zeros(2, np.float32), 0, 0.0, extra_model_outputs={"vf_preds": 0.0}, terminated=True
    )
    ep.to_numpy()
    cut.to_numpy()
    for rl_ep in (ep, cut):
        back = from_rllib(rl_ep)
        assert back.observation_space == js.spaces.from_gymnasium_space(obs_space)
        assert_rl_sa_equal(rl_ep, to_rllib(back))
        assert_js_sa_equal(back, from_rllib(to_rllib(back)))


# -------------------------------------------------------------------- batches


def test_batches_convert_and_concat_in_rllib(sa_episodes):
    js_batches = [e.get_sample_batch() for e in sa_episodes[:3]]
    rl_batches = to_rllib(js_batches)
    assert all(type(b) is RlSampleBatch for b in rl_batches)
    cat = concat_samples(rl_batches)
    assert len(cat) == sum(len(b) for b in js_batches)
    same(dict(cat)["obs"], np.concatenate([b["obs"] for b in js_batches]))
    ma = js.episodes.batch.MultiAgentBatch({"p0": js_batches[0], "p1": js_batches[1]}, 7)
    rl_ma = to_rllib(ma)
    assert type(rl_ma) is RlMultiAgentBatch and rl_ma.env_steps() == 7
    assert rl_ma.agent_steps() == len(js_batches[0]) + len(js_batches[1])
    cat_ma = concat_samples([rl_ma, to_rllib(ma)])
    assert cat_ma.env_steps() == 14
    RlMultiAgentBatch({"p": to_rllib(js_batches[2])}, 3)  # RLlib's isinstance check passes
    for x in (js_batches[0], ma):
        y = from_rllib(to_rllib(x))
        assert type(y) is type(x)
        if isinstance(x, js.episodes.batch.MultiAgentBatch):
            assert y.count == x.count and list(y.policy_batches) == list(x.policy_batches)
            pairs = [(x[k], y[k]) for k in x.policy_batches]
        else:
            pairs = [(x, y)]
        for p, q in pairs:
            same(dict(p), dict(q))
            assert (p.count, p.time_major, p.max_seq_len, p.zero_padded) == (
                q.count,
                q.time_major,
                q.max_seq_len,
                q.zero_padded,
            )


# -------------------------------------------------------------------- bad input


@pytest.mark.parametrize("bad", [3, "episode", {"obs": [1]}, np.zeros(3), None])
def test_unsupported_objects_raise_type_error_naming_them(bad):
    with pytest.raises(TypeError, match=type(bad).__name__) as info:
        to_rllib(bad)
    assert "supported" in str(info.value) and "SingleAgentEpisode" in str(info.value)
    with pytest.raises(TypeError, match=type(bad).__name__):
        from_rllib(bad)
    with pytest.raises(TypeError, match=type(bad).__name__):
        to_rllib([hand_built_episodes()[0], bad])


def test_objects_already_on_the_target_side_pass_through():
    rl = RlSingleAgentEpisode()
    assert to_rllib(rl) is rl
    ep = js.SingleAgentEpisode()
    assert from_rllib(ep) is ep
    assert to_rllib([ep, rl])[1] is rl


# -------------------------------------------------------------------- multi-agent


def js_ma_state(ep):
    """Every field of a jaxsampler MultiAgentEpisode, agent episodes and maps by state."""
    state = dict(vars(ep))
    state["agent_episodes"] = {a: sa.get_state() for a, sa in ep.agent_episodes.items()}
    state["env_t_to_agent_t"] = {a: m.get_state() for a, m in ep.env_t_to_agent_t.items()}
    # The one field RLlib's class cannot hold: ids named for agents with no episode yet.
    # (Its key order follows agent_episodes after a round trip.)
    ids = ep._agent_episode_ids
    state["_agent_episode_ids"] = {a: ids[a] for a in ep.agent_episodes if a in ids}
    return state


def assert_js_ma_equal(a, b):
    assert type(a) is type(b) is JsMultiAgentEpisode
    same(js_ma_state(a), js_ma_state(b))


def ma_sample_twice(env_id, seed=0):
    env = js.make(env_id)
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    length = 3 if env_id == "TicTacToe-v0" else 7  # random TicTacToe games end early
    s = js.Sampler(
        env, pol, num_envs=3, rollout_length=length, seed=seed, episode_lookback_horizon=2
    )
    return s.sample(()) + s.sample(())


@pytest.fixture(scope="module", params=["TicTacToe-v0", "Goals-v0", "Spread-v0"])
def ma_episodes(request):
    eps = ma_sample_twice(request.param)
    assert any(e.env_t_started > 0 for e in eps)  # continuation chunks
    return eps


def test_multi_agent_round_trip_js_rllib_js(ma_episodes):
    rl = to_rllib(ma_episodes)
    for js_ep, rl_ep in zip(ma_episodes, rl, strict=True):
        assert type(rl_ep) is RlMultiAgentEpisode
        rl_ep.validate()
        assert rl_ep.agent_ids == js_ep.agent_ids and len(rl_ep) == len(js_ep)
        assert rl_ep.env_t_to_agent_t.keys() == js_ep.env_t_to_agent_t.keys()
        for aid, sa in rl_ep.agent_episodes.items():
            assert type(sa) is RlSingleAgentEpisode and sa.multi_agent_episode_id == rl_ep.id_
            assert rl_ep.observation_space[aid] == js_ep.observation_space[aid].to_gymnasium()
            assert sa.module_id == js_ep.agent_episodes[aid].module_id
            same(sa.get_observations(), js_ep.agent_episodes[aid].get_observations())
        assert dict(rl_ep._hanging_actions_end) == dict(js_ep._hanging_actions_end)
    for a, b in zip(ma_episodes, from_rllib(rl), strict=True):
        assert_js_ma_equal(a, b)


def test_multi_agent_round_trip_rllib_js_rllib(ma_episodes):
    rl = to_rllib(ma_episodes)
    for a, b in zip(rl, to_rllib(from_rllib(rl)), strict=True):
        assert_rl_ma_equal(a, b)


def add_hanging_steps(ep, o):
    """Two env steps on a reset episode (RLlib's class or ours) in which ``a`` and then
    ``b`` act without an observation: ``b`` joins late, ``a`` hangs, rewards wait."""
    ep.add_env_step(
        observations={"b": o(1)},
        actions={"a": 1},
        rewards={"a": 0.5, "b": 0.25},
        extra_model_outputs={"a": {"action_logp": np.float32(-0.1)}},
    )
    ep.add_env_step(
        observations={"a": o(2)},
        actions={"b": 2},
        rewards={"a": 1.0, "b": 0.0},
        extra_model_outputs={"b": {"action_logp": np.float32(-0.2)}},
    )


def rllib_turn_episodes():
    """RLlib's own episodes, stepped turn by turn: hanging actions and rewards, a late
    joiner, a cut with lookback, an agent done before the others, list and numpy mode."""
    box = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
    spaces = {"a": box, "b": box}
    acts = {"a": gym.spaces.Discrete(3), "b": gym.spaces.Discrete(3)}
    ep = RlMultiAgentEpisode(
        observation_space=spaces,
        action_space=acts,
        agent_to_module_mapping_fn=lambda aid, episode: f"mod_{aid}",
    )
    o = lambda v: np.full(2, v, np.float32)
    ep.add_env_reset(observations={"a": o(0)}, infos={"a": {"i": 0}})
    add_hanging_steps(ep, o)
    ep.custom_data["note"] = "x"
    cut = ep.cut(len_lookback_buffer=2)
    cut.add_env_step(
        observations={"b": o(3)},
        actions={"a": 0},
        rewards={"a": 0.0, "b": 1.0},
        extra_model_outputs={"a": {"action_logp": np.float32(-0.3)}},
    )
    cut.add_env_step(
        observations={"a": o(4)},
        actions={"b": 1},
        rewards={"a": 2.0, "b": 0.0},
        terminateds={"b": True},
        extra_model_outputs={"b": {"action_logp": np.float32(-0.4)}},
    )
    numpy_ep = RlMultiAgentEpisode.from_state(ep.get_state()).to_numpy()
    return [ep, cut, numpy_ep]


def test_rllib_multi_agent_episodes_round_trip():
    for rl_ep in rllib_turn_episodes():
        js_ep = from_rllib(rl_ep)
        assert type(js_ep) is JsMultiAgentEpisode
        assert js_ep.observation_space["a"] == js.spaces.from_gymnasium_space(
            rl_ep.observation_space["a"]
        )
        assert js_ep.module_for("a") == "mod_a" and js_ep.custom_data == rl_ep.custom_data
        assert_rl_ma_equal(rl_ep, to_rllib(js_ep))
        assert_js_ma_equal(js_ep, from_rllib(to_rllib(js_ep)))


def test_default_module_mapping_maps_to_each_sides_default():
    rl = to_rllib(JsMultiAgentEpisode())
    assert rl.module_for("x") == "default_policy"
    assert from_rllib(RlMultiAgentEpisode()).module_for("y") == "default_policy"
    assert to_rllib(from_rllib(RlMultiAgentEpisode())).agent_to_module_mapping_fn is (
        RlMultiAgentEpisode().agent_to_module_mapping_fn
    )


# -------------------------------------------------------------------- RLlib's own state / pickle


def test_rllib_from_state_and_pickle_of_converted_episodes(sa_episodes, ma_episodes):
    """RLlib's from_state (its checkpoint path) and pickling (how RLlib ships episodes from
    env runners to learners) work on converted episodes and keep them equal."""
    import pickle

    for rl_ep in to_rllib(sa_episodes[-3:]):
        assert_rl_sa_equal(RlSingleAgentEpisode.from_state(rl_ep.get_state()), rl_ep)
        assert_rl_sa_equal(pickle.loads(pickle.dumps(rl_ep)), rl_ep)
    for rl_ep in to_rllib(ma_episodes[-2:]):
        assert_rl_ma_equal(RlMultiAgentEpisode.from_state(rl_ep.get_state()), rl_ep)
        assert_rl_ma_equal(pickle.loads(pickle.dumps(rl_ep)), rl_ep)


def test_rllib_from_state_of_a_jaxsampler_state_fails_and_the_converted_path_works():
    """jaxsampler's get_state() keeps its own format (jaxsampler space objects); RLlib's
    state is ``to_rllib(ep).get_state()``, and ``from_rllib`` brings RLlib's back."""
    ep = hand_built_episodes()[1]
    with pytest.raises((KeyError, TypeError, AttributeError)):
        RlSingleAgentEpisode.from_state(ep.get_state())
    rl_state = to_rllib(ep).get_state()
    assert_js_sa_equal(from_rllib(RlSingleAgentEpisode.from_state(rl_state)), ep)


def test_gc_is_restored_after_converting_lists():
    import gc

    eps = hand_built_episodes()
    assert gc.isenabled()
    from_rllib(to_rllib(eps))
    assert gc.isenabled()
    gc.disable()
    try:
        to_rllib(eps)
        assert not gc.isenabled()  # a caller's disabled collector stays disabled
    finally:
        gc.enable()
    with pytest.raises(TypeError):
        to_rllib([eps[0], object()])
    assert gc.isenabled()


def js_turn_episode():
    """A jaxsampler episode stepped by hand: a late joiner, hanging actions and rewards,
    custom data, a cut with lookback that keeps a hanging agent."""
    box = js.spaces.Box(-10.0, 10.0, (2,))
    ep = JsMultiAgentEpisode(
        observation_space={"a": box, "b": box},
        action_space={"a": js.spaces.Discrete(3), "b": js.spaces.Discrete(3)},
    )
    o = lambda v: np.full(2, v, np.float32)
    ep.add_env_reset(observations={"a": o(0)})
    add_hanging_steps(ep, o)
    ep.custom_data["k"] = 1
    return ep, ep.cut(len_lookback_buffer=1)


def test_hand_built_multi_agent_episodes_with_hanging_agents_round_trip():
    for ep in js_turn_episode():
        assert ep._hanging_actions_end  # "b" waits for its next observation
        rl = to_rllib(ep)
        assert rl._hanging_actions_end == ep._hanging_actions_end
        assert dict(rl._hanging_rewards_end) == dict(ep._hanging_rewards_end)
        assert rl.get_agents_to_act() == ep.get_agents_to_act()
        assert rl.custom_data == {"k": 1}
        assert_js_ma_equal(from_rllib(rl), ep)
        assert_rl_ma_equal(to_rllib(from_rllib(rl)), rl)


def test_spaces_without_an_equivalent_raise_type_error():
    ep = js.SingleAgentEpisode(observation_space=object())
    with pytest.raises(TypeError, match="cannot convert the space"):
        to_rllib(ep)
    rl = RlSingleAgentEpisode(observation_space=gym.spaces.MultiBinary(3))
    with pytest.raises(TypeError, match="MultiBinary"):
        from_rllib(rl)


def test_sampler_batches_concat_in_rllib():
    """``sample_batch()`` output (a jaxsampler MultiAgentBatch), converted, is what RLlib's
    MultiAgentBatch / concat_samples accept (they reject the unconverted one)."""
    env = js.make("CartPole-v1")
    pol = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(4,))
    s = js.Sampler(env, pol, num_envs=2, rollout_length=5, seed=0)
    params = pol.init(jax.random.PRNGKey(0))
    a, b = s.sample_batch(params), s.sample_batch(params)
    with pytest.raises(AssertionError):
        RlMultiAgentBatch({"default_policy": a["default_policy"]}, 5)
    cat = concat_samples(to_rllib([a, b]))
    assert type(cat) is RlMultiAgentBatch and cat.env_steps() == a.env_steps() + b.env_steps()
    for k in a["default_policy"]:
        if k != "infos":
            same(
                cat["default_policy"][k],
                np.concatenate([a["default_policy"][k], b["default_policy"][k]]),
                k,
            )
    back = from_rllib(to_rllib(a))
    assert type(back) is type(a) and back.env_steps() == a.env_steps()
    same(dict(back["default_policy"]), dict(a["default_policy"]))
