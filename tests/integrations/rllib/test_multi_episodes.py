"""rllib_multi_agent_episodes / chunk_stats against today's conversion (to_rllib) and an
independent reference: every RLlib getter, every field and every buffer of the episodes
built from the chunks' columns equals to_rllib's, over several calls with continuation
chunks (simultaneous and turn-based envs), also after later calls ran; and the
multi-agent runner's metrics equal a plain re-computation from its episodes."""

from __future__ import annotations

import copy
from collections import defaultdict

import numpy as np
import pytest

pytest.importorskip("ray.rllib", reason="needs ray[rllib] (the rllib extra)")
pytest.importorskip("torch", reason="needs torch (the rllib extra)")

from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode as RlMultiAgentEpisode

import jaxsampler as js
from jaxsampler.integrations.rllib import JaxMultiAgentEnvRunner, to_rllib
from jaxsampler.integrations.rllib.multi_episodes import (
    chunk_stats,
    rllib_multi_agent_episodes,
)
from tests.integrations.rllib.rl_compare import (
    assert_rl_ma_equal,
    assert_rl_sa_equal,
    same,
)

ENVS = ["TicTacToe-v0", "Spread-v0", "Goals-v0"]


def buffer_fields(buf):
    return {k: v for k, v in vars(buf).items()}


def assert_fields_equal(new, old):
    """The fields RLlib's getters and get_state() do not show: buffer internals (space
    struct, finalized, lookback), the lookback length, the default factories."""
    assert new._len_lookback_buffers == old._len_lookback_buffers
    assert new.agent_to_module_mapping_fn is old.agent_to_module_mapping_fn
    assert new.observation_space == old.observation_space and new.action_space == old.action_space
    for name in (
        "agent_t_started",
        "env_t_to_agent_t",
        "_hanging_extra_model_outputs_end",
        "_hanging_rewards_end",
        "_hanging_rewards_begin",
    ):
        a, b = getattr(new, name), getattr(old, name)
        assert type(a) is type(b) and getattr(a, "default_factory", 0) is getattr(
            b, "default_factory", 0
        ), name
    for aid in old.env_t_to_agent_t:
        same(buffer_fields(new.env_t_to_agent_t[aid]), buffer_fields(old.env_t_to_agent_t[aid]))
    assert list(new.agent_episodes) == list(old.agent_episodes)
    for aid, sa in old.agent_episodes.items():
        nsa = new.agent_episodes[aid]
        assert_rl_sa_equal(nsa, sa)
        assert (nsa._start_time, nsa._last_step_time) == (sa._start_time, sa._last_step_time)
        assert nsa.custom_data == sa.custom_data and nsa.custom_data is not sa.custom_data
        bufs = ("observations", "infos", "actions", "rewards")
        for col in bufs:
            same(buffer_fields(getattr(nsa, col)), buffer_fields(getattr(sa, col)))
        assert list(nsa.extra_model_outputs) == list(sa.extra_model_outputs)
        for k, b in sa.extra_model_outputs.items():
            same(buffer_fields(nsa.extra_model_outputs[k]), buffer_fields(b))


def sampler(env_id, seed=0):
    env = js.make(env_id)
    policy = js.RandomPolicy(env.observation_space, env.action_space)
    length = 3 if env_id == "TicTacToe-v0" else 7  # random TicTacToe games end early
    return js.Sampler(
        env, policy, num_envs=3, rollout_length=length, seed=seed, episode_lookback_horizon=2
    )


@pytest.mark.parametrize("env_id", ENVS)
def test_columns_path_equals_to_rllib_over_calls(env_id):
    s = sampler(env_id)
    pairs, snapshots = [], []
    for _ in range(4):
        chunks = s.sample(())
        new, old = rllib_multi_agent_episodes(chunks), to_rllib(chunks)
        assert len(new) == len(old) == len(chunks)
        for a, b in zip(new, old, strict=True):
            assert type(a) is RlMultiAgentEpisode
            assert_rl_ma_equal(a, b)
            assert_fields_equal(a, b)
        pairs += zip(new, old, strict=True)
        snapshots += copy.deepcopy(old)
    assert any(b.env_t_started > 0 for b, _ in pairs)  # continuation chunks were compared
    assert any(b._len_lookback_buffers > 0 for b, _ in pairs)
    # Later calls changed nothing the earlier episodes hold (no aliasing of carried data).
    for (a, b), snap in zip(pairs, snapshots, strict=True):
        assert_rl_ma_equal(a, snap)
        assert_rl_ma_equal(a, b)


def test_arrays_are_shared_and_lists_copied():
    chunks = sampler("Spread-v0").sample(())
    for ep, rl in zip(chunks, rllib_multi_agent_episodes(chunks), strict=True):
        for aid, sa in ep.agent_episodes.items():
            rsa = rl.agent_episodes[aid]
            assert rsa.observations.data is sa.observations.data  # a view, not a copy
            assert rsa.actions.data is sa.actions.data
            if isinstance(sa.infos.data, list):
                assert rsa.infos.data == sa.infos.data and rsa.infos.data is not sa.infos.data
        for aid, m in ep.env_t_to_agent_t.items():
            assert rl.env_t_to_agent_t[aid].data == m.data
            assert rl.env_t_to_agent_t[aid].data is not m.data


def test_bad_input_names_the_item():
    chunks = sampler("Spread-v0").sample(())
    with pytest.raises(TypeError, match="item 1 is a str"):
        rllib_multi_agent_episodes([chunks[0], "not an episode"])


def test_chunk_stats_match_getters():
    chunks = to_rllib(sampler("TicTacToe-v0").sample(()) + sampler("TicTacToe-v0", 1).sample(()))
    agents = ["agent_0", "agent_1"]
    st = chunk_stats(chunks, agents)
    for m, ep in enumerate(chunks):
        assert st.length[m] == len(ep)
        for a, aid in enumerate(agents):
            sa = ep.agent_episodes.get(aid)
            assert st.present[m, a] == (sa is not None)
            if sa is not None:
                np.testing.assert_allclose(st.returns[m, a], sa.get_return(), rtol=1e-6)
                assert st.steps[m, a] == len(sa)
            else:
                assert st.returns[m, a] == 0 and st.steps[m, a] == 0
    with pytest.raises(ValueError, match="agent_1"):
        chunk_stats(chunks, ["agent_0"])


# ----------------------------------------------------------------------------- runner

MAPPING = {"agent_0": "p0", "agent_1": "p1", "agent_2": "p1"}


def runner(env_id):
    mapping = MAPPING if env_id == "Spread-v0" else {"agent_0": "p0", "agent_1": "p1"}
    cfg = (
        PPOConfig()
        .environment(env_id)
        .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=lambda aid, ep, **kw: mapping[aid])
        .env_runners(
            env_runner_cls=JaxMultiAgentEnvRunner,
            num_env_runners=0,
            num_envs_per_env_runner=3,
            rollout_fragment_length=8,
        )
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[8]))
        .debugging(seed=0)
    )
    return JaxMultiAgentEnvRunner(config=cfg), mapping


def peek(stat):
    return stat.peek() if hasattr(stat, "peek") else stat


def drop_step_times(ep):
    for e in (ep, *ep.agent_episodes.values()):
        e._start_time = e._last_step_time = None


def reference_metrics(calls, mapping):
    """Finished episodes' length, return and per-agent / per-module returns and steps,
    summed over their chunks with RLlib's own getters."""
    sums = defaultdict(lambda: [0, 0.0, defaultdict(float), defaultdict(int)])
    done = []
    for episodes in calls:
        for ep in episodes:
            s = sums[ep.id_]
            s[0] += len(ep)
            for aid, sa in ep.agent_episodes.items():
                s[1] += float(sa.get_return())
                s[2][aid] += float(sa.get_return())
                s[3][aid] += len(sa)
            if ep.is_done:
                done.append(sums.pop(ep.id_))
    return done


@pytest.mark.parametrize("env_id", ["Spread-v0", "TicTacToe-v0"])
def test_runner_episodes_and_metrics(env_id, monkeypatch):
    r, mapping = runner(env_id)
    ref, _ = runner(env_id)
    # the reference runner converts with to_rllib (today's conversion, same seeds)
    monkeypatch.setattr(ref, "_to_rllib", to_rllib)
    try:
        calls = []
        for i in range(4):
            kw = dict(num_timesteps=30, random_actions=i == 2)
            new, old = r.sample(**kw), ref.sample(**kw)
            assert len(new) == len(old)
            for a, b in zip(new, old, strict=True):
                drop_step_times(a)  # wall-clock times of two runners differ
                drop_step_times(b)
                assert_rl_ma_equal(a, b)
            calls.append(new)
        done = reference_metrics(calls, mapping)
        assert done
        m = r.get_metrics()
        lengths = [d[0] for d in done]
        returns = [d[1] for d in done]
        np.testing.assert_allclose(peek(m["episode_len_mean"]), np.mean(lengths))
        np.testing.assert_allclose(peek(m["episode_return_mean"]), np.mean(returns), rtol=1e-5)
        np.testing.assert_allclose(peek(m["episode_return_min"]), np.min(returns), rtol=1e-5)
        np.testing.assert_allclose(peek(m["episode_return_max"]), np.max(returns), rtol=1e-5)
        for aid in mapping:
            per = [d[2][aid] for d in done if aid in d[2]]
            np.testing.assert_allclose(
                peek(m["agent_episode_returns_mean"][aid]), np.mean(per), rtol=1e-5
            )
            steps = [d[3][aid] for d in done if aid in d[3]]
            np.testing.assert_allclose(peek(m["agent_steps"][aid]), np.mean(steps))
        for mid in set(mapping.values()):
            per = [
                sum(r for a, r in d[2].items() if mapping[a] == mid)
                for d in done
                if any(mapping[a] == mid for a in d[2])
            ]
            np.testing.assert_allclose(
                peek(m["module_episode_returns_mean"][mid]), np.mean(per), rtol=1e-5
            )
        sampled = sum(
            len(sa)
            for eps in calls
            for ep in eps
            for sa in ep.agent_episodes.values()
            if sa.agent_id == "agent_0"
        )
        assert peek(m["num_agent_steps_sampled_lifetime"]["agent_0"]) == sampled
    finally:
        r.stop()
        ref.stop()
