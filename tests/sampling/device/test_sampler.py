"""Sampler.sample(): device buffers -> RLlib-style SingleAgentEpisodes."""

from __future__ import annotations

import contextlib
import itertools
import pickle
from collections import defaultdict
from collections.abc import Iterator

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js
from tests.fakes import FakeEnv, FakeParams, TurnEnv, expected_episode

E, T = 3, 7


def fake_sampler(seed=0, horizon=2, num_envs=E, rollout_length=T):
    env = FakeEnv()
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    return js.Sampler(
        env,
        pol,
        num_envs=num_envs,
        rollout_length=rollout_length,
        seed=seed,
        episode_lookback_horizon=horizon,
    )


def check_chunk(ep: js.SingleAgentEpisode, params=FakeParams()):
    """Closed-form checks of one FakeEnv chunk, lookback included."""
    lb = ep.observations.lookback
    obs = np.asarray(ep.observations.data)  # incl. lookback
    assert ep.is_numpy and ep.actions.lookback == lb == ep.rewards.lookback
    actions, rewards = np.asarray(ep.actions.data), np.asarray(ep.rewards.data)
    assert len(obs) == len(ep) + lb + 1 and len(actions) == len(ep) + lb
    np.testing.assert_array_equal(obs[:, 0], np.arange(ep.t_started - lb, ep.t + 1))
    tag = obs[-1, 1]
    assert np.all(obs[:, 1] == tag), "one episode, one tag (lookback and final obs included)"
    np.testing.assert_array_equal(rewards, actions.astype(np.float32))
    length, term, trunc = expected_episode(float(tag), params)
    done = ep.t == length
    assert ep.is_terminated == (done and term) and ep.is_truncated == (done and trunc)
    assert ep.is_done == done
    assert ep.t <= length


def test_chunks_follow_the_env_and_continue_across_calls():
    s = fake_sampler()
    by_id = defaultdict(list)
    sampled = 0
    for _ in range(5):
        eps = s.sample(())
        sampled += s.metrics.num_env_steps_sampled
        assert sum(len(e) for e in eps) == s.metrics.num_env_steps_sampled  # nothing dropped
        assert [e.is_done for e in eps] == sorted(
            [e.is_done for e in eps], reverse=True
        )  # done first
        for ep in eps:
            check_chunk(ep)
            by_id[ep.id_].append(ep)
    finished = 0
    for chunks in by_id.values():
        for prev, nxt in itertools.pairwise(chunks):
            assert not prev.is_done and nxt.t_started == prev.t  # RLlib cut() semantics
            lb = nxt.observations.lookback
            assert lb == min(2, len(prev) + prev.observations.lookback)
            np.testing.assert_array_equal(
                nxt.observations.data[: lb + 1], prev.observations.data[-lb - 1 :]
            )
            np.testing.assert_array_equal(
                nxt.actions.data[:lb], prev.actions.data[len(prev.actions.data) - lb :]
            )
        assert chunks[0].t_started == 0 and chunks[0].observations.lookback == 0
        finished += chunks[-1].is_done
    assert finished > 3 and any(len(c) > 1 for c in by_id.values())
    # Every device step is either a counted env step or a reset step (one per finished episode).
    assert (
        sampled + finished - E <= 5 * E * T <= sampled + finished
    )  # reset of the last ends may be pending


def test_every_sampled_step_appears_exactly_once():
    s = fake_sampler(seed=1)
    total_live, returned = 0, 0
    for _ in range(4):
        eps = s.sample(())
        returned += sum(len(e) for e in eps)
        total_live += s.metrics.num_env_steps_sampled
    # E * T device steps per call minus reset steps; cross-check with the episodes' own view.
    assert returned == total_live
    assert total_live < 4 * E * T


def test_metrics_match_the_episodes():
    s = fake_sampler(seed=2, horizon=1)
    full = defaultdict(lambda: [0.0, 0])
    for _ in range(6):
        eps = s.sample(())
        m = s.metrics
        done_returns, done_lens = [], []
        for ep in eps:
            full[ep.id_][0] += float(ep.get_return())
            full[ep.id_][1] += len(ep)
            if ep.is_done:
                done_returns.append(full[ep.id_][0])
                done_lens.append(full[ep.id_][1])
                assert full[ep.id_][1] == ep.t  # the whole episode was seen, chunk by chunk
        assert m.num_episodes_completed == len(done_returns)
        assert m.num_episodes_ongoing == sum(not e.is_done for e in eps)
        if done_returns:
            assert m.episode_return_mean == pytest.approx(np.mean(done_returns))
            assert m.episode_return_max == pytest.approx(np.max(done_returns))
            assert m.episode_len_min == np.min(done_lens) and m.episode_len_mean == pytest.approx(
                np.mean(done_lens)
            )
        else:
            assert np.isnan(m.episode_return_mean)


def test_deterministic_per_seed():
    a, b, c = fake_sampler(seed=3), fake_sampler(seed=3), fake_sampler(seed=4)
    for _ in range(2):
        ea, eb, ec = a.sample(()), b.sample(()), c.sample(())
        assert [e.id_ for e in ea] == [e.id_ for e in eb]
        for x, y in zip(ea, eb, strict=True):
            np.testing.assert_array_equal(x.observations.data, y.observations.data)
            np.testing.assert_array_equal(x.actions.data, y.actions.data)
    assert {e.id_ for e in ea}.isdisjoint({e.id_ for e in ec})


def test_num_timesteps_runs_whole_calls_until_reached():
    s = fake_sampler(seed=5)
    eps = s.sample((), num_timesteps=3 * E * T)
    assert s.metrics.num_rollout_calls >= 3
    assert s.metrics.num_env_steps_sampled >= 3 * E * T
    assert s.metrics.num_env_steps_sampled < (s.metrics.num_rollout_calls) * E * T
    assert sum(len(e) for e in eps) == s.metrics.num_env_steps_sampled
    # One chunk per episode per sample() call, even across several rollout calls.
    assert len({e.id_ for e in eps}) == len(eps)
    for ep in eps:
        check_chunk(ep)


def test_num_episodes_resets_and_returns_finished_episodes_only():
    s = fake_sampler(seed=6)
    s.sample(())
    eps = s.sample((), num_episodes=4)
    assert len(eps) >= 4 and all(e.is_done for e in eps)
    assert all(e.t_started == 0 and e.observations.lookback == 0 for e in eps)
    for ep in eps:
        check_chunk(ep)
    after = s.sample(())  # the next call starts from a fresh reset
    assert all(e.t_started == 0 for e in after)
    assert {e.id_ for e in after}.isdisjoint({e.id_ for e in eps})


def test_force_reset_discards_ongoing_episodes():
    s = fake_sampler(seed=7)
    first = s.sample(())
    ongoing = {e.id_ for e in first if not e.is_done}
    again = s.sample((), force_reset=True)
    assert ongoing and ongoing.isdisjoint({e.id_ for e in again})
    assert all(e.t_started == 0 for e in again)


def test_episodes_are_views_and_survive_later_calls():
    s = fake_sampler(seed=8)
    eps = s.sample(())
    snapshot = [e.observations.data.copy() for e in eps]
    assert all(e.observations.data.base is not None for e in eps)  # slices, not copies
    for _ in range(3):
        s.sample(())  # device buffers are donated and reused in place
    for e, snap in zip(eps, snapshot, strict=True):
        np.testing.assert_array_equal(e.observations.data, snap)


def test_extra_model_outputs_are_aligned_with_actions():
    env = js.make("CartPole-v1")
    pol = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    params = pol.init(jax.random.PRNGKey(0))
    s = js.Sampler(env, pol, num_envs=2, rollout_length=16, seed=0)
    for ep in s.sample(params) + s.sample(params):
        logp = ep.get_extra_model_outputs("action_logp")
        vf = ep.get_extra_model_outputs("vf_preds")
        assert logp.shape == vf.shape == (len(ep),)
        assert ep.extra_model_outputs["action_logp"].lookback == ep.actions.lookback
        # Replaying the policy on the stored observations gives the stored log-probs.
        dist, value, _ = pol.forward(params, jnp.asarray(ep.get_observations(slice(0, len(ep)))))
        ref = jax.nn.log_softmax(dist)[np.arange(len(ep)), ep.get_actions()]
        np.testing.assert_allclose(logp, ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(vf, value, rtol=1e-5, atol=1e-6)


def python_loop_reference(env, policy, params, num_envs, steps, seed):
    """Steps each env in a plain Python loop with the sampler's keys; returns per-env lists
    of episodes as (observations, actions, rewards, terminated, truncated)."""
    key = jax.random.split(jax.random.PRNGKey(seed))[1]  # Sampler.reset()
    key, reset_key = jax.random.split(key)  # init_rollout_state
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    states, obs = [], []
    for k in jax.random.split(reset_key, num_envs):
        st, ts = reset(k)
        states.append(st)
        obs.append(np.asarray(ts.obs))
    needs_reset = [False] * num_envs
    episodes = [
        [{"obs": [obs[e][0]], "act": [], "rew": [], "term": False, "trunc": False}]
        for e in range(num_envs)
    ]
    for _ in range(steps):
        key, k_pol, k_step, k_reset = jax.random.split(key, 4)
        step_keys, reset_keys = (
            jax.random.split(k_step, num_envs),
            jax.random.split(k_reset, num_envs),
        )
        actions, _, _ = policy(params, jnp.stack(obs), k_pol, js.policies.NoState())
        for e in range(num_envs):
            if needs_reset[e]:
                states[e], ts = reset(reset_keys[e])
                episodes[e].append(
                    {
                        "obs": [np.asarray(ts.obs)[0]],
                        "act": [],
                        "rew": [],
                        "term": False,
                        "trunc": False,
                    }
                )
                needs_reset[e] = False
            else:
                states[e], ts = step(step_keys[e], states[e], actions[e])
                ep = episodes[e][-1]
                ep["obs"].append(np.asarray(ts.obs)[0])
                ep["act"].append(np.asarray(actions[e])[0])
                ep["rew"].append(float(ts.reward[0]))
                ep["term"], ep["trunc"] = bool(ts.terminated[0]), bool(ts.truncated[0])
                needs_reset[e] = ep["term"] or ep["trunc"]
            obs[e] = np.asarray(ts.obs)
    return episodes


def test_round_trip_equals_a_python_loop_with_the_same_keys():
    env = js.make("CartPole-v1")
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    num_envs, T_, calls = 2, 20, 3
    s = js.Sampler(
        env, pol, num_envs=num_envs, rollout_length=T_, seed=11, episode_lookback_horizon=0
    )
    chunks = defaultdict(list)
    for _ in range(calls):
        for ep in s.sample(()):
            chunks[ep.id_].append(ep)
    ref = python_loop_reference(env, pol, (), num_envs, calls * T_, seed=11)
    ref_eps = [ep for per_env in ref for ep in per_env if ep["act"]]
    got = []
    for cs in chunks.values():
        obs = np.concatenate(
            [cs[0].get_observations()] + [c.get_observations()[1:] for c in cs[1:]]
        )
        got.append(
            (
                obs,
                np.concatenate([c.get_actions() for c in cs]),
                np.concatenate([c.get_rewards() for c in cs]),
                cs[-1].is_terminated,
                cs[-1].is_truncated,
            )
        )
    assert len(got) == len(ref_eps) > 2
    key = lambda g: (tuple(np.round(g[0][0], 6)), len(g[1]))
    got.sort(key=key)
    ref_sorted = sorted(
        [
            (
                np.stack(r["obs"]),
                np.array(r["act"]),
                np.array(r["rew"], np.float32),
                r["term"],
                r["trunc"],
            )
            for r in ref_eps
        ],
        key=key,
    )
    for g, r in zip(got, ref_sorted, strict=True):
        # Fused vmapped code vs one env at a time may differ in the last float32 bit.
        np.testing.assert_allclose(g[0], r[0], rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(g[1], r[1])
        np.testing.assert_array_equal(g[2], r[2])
        assert g[3] == r[3] and g[4] == r[4]


# ----------------------------------------------------------------------------- bad input


def test_bad_sample_arguments():
    s = fake_sampler()
    with pytest.raises(ValueError, match="not both"):
        s.sample((), num_timesteps=5, num_episodes=1)
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match="num_timesteps"):
            s.sample((), num_timesteps=bad)
        with pytest.raises(ValueError, match="num_episodes"):
            s.sample((), num_episodes=bad)


def test_bad_sampler_construction():
    env = FakeEnv()
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    with pytest.raises(ValueError, match="episode_lookback_horizon"):
        js.Sampler(env, pol, episode_lookback_horizon=-1)
    with pytest.raises(ValueError, match="num_envs"):
        js.Sampler(env, pol, num_envs=0)
    with pytest.raises(ValueError, match="unknown env id"):
        js.Sampler("NoSuchEnv-v9", pol)
    turn = TurnEnv()
    other = js.policies.MultiAgentPolicy(
        ("x", "y"), {"p": js.RandomPolicy(turn.observation_space, turn.action_space)}
    )
    with pytest.raises(ValueError, match="mismatched agent ids"):
        js.Sampler(turn, other)


# ----------------------------------------------------------------------------- sample_batch


def episodes_to_batch(eps):
    """The reference: RLlib's per-episode data dicts, concatenated, plus new_obs."""
    batches = []
    for ep in eps:
        b = ep.get_sample_batch()
        b = js.SampleBatch({**b, "new_obs": ep.get_observations(slice(1, None))})
        batches.append(b)
    return js.episodes.concat_samples(batches)


@pytest.mark.parametrize("policy", ["random", "mlp"])
def test_sample_batch_equals_the_batch_built_from_episodes(policy):
    env = FakeEnv() if policy == "random" else js.make("CartPole-v1")
    pol = (
        js.RandomPolicy(env.observation_space, env.action_space)
        if policy == "random"
        else js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    )
    params = pol.init(jax.random.PRNGKey(0))
    a = js.Sampler(env, pol, num_envs=3, rollout_length=9, seed=21, episode_lookback_horizon=2)
    b = js.Sampler(env, pol, num_envs=3, rollout_length=9, seed=21, episode_lookback_horizon=2)
    for call in range(4):
        kwargs = {"num_timesteps": 40} if call == 2 else {}
        eps = a.sample(params, **kwargs)
        mab = b.sample_batch(params, **kwargs)
        assert isinstance(mab, js.MultiAgentBatch) and list(mab.policy_batches) == [
            "default_policy"
        ]
        direct, ref = mab["default_policy"], episodes_to_batch(eps)
        assert (
            mab.env_steps()
            == mab.agent_steps()
            == direct.count
            == ref.count
            == b.metrics.num_env_steps_sampled
        )
        for col in (
            "obs",
            "new_obs",
            "actions",
            "rewards",
            "terminateds",
            "truncateds",
            "t",
            "eps_id",
        ):
            np.testing.assert_array_equal(direct[col], ref[col], err_msg=col)
            # eps_id: an object array of str (as episodes_to_batch gives), RLlib's is <U.
            kind = "O" if col == "eps_id" else ref[col].dtype.kind
            assert direct[col].dtype.kind == kind, col
        for col in set(eps[0].extra_model_outputs):
            np.testing.assert_array_equal(direct[col], ref[col], err_msg=col)
        np.testing.assert_array_equal(direct["agent_index"], 0)
        assert a.metrics.as_dict() == b.metrics.as_dict()
        # split_by_episode recovers the episodes' lengths, in order.
        assert [s.count for s in direct.split_by_episode()] == [len(e) for e in eps]


def test_sample_batch_new_obs_is_the_real_final_observation():
    s = fake_sampler(seed=22)
    batch = s.sample_batch(())["default_policy"]
    ends = batch["terminateds"] | batch["truncateds"]
    assert ends.any()
    # FakeEnv: new_obs = [t + 1, tag]; at an episode end that is the final observation.
    np.testing.assert_array_equal(batch["new_obs"][:, 0], batch["t"] + 1)
    np.testing.assert_array_equal(batch["new_obs"][:, 1], batch["obs"][:, 1])
    for row in np.nonzero(ends)[0]:
        length, _, _ = expected_episode(float(batch["obs"][row, 1]))
        assert batch["new_obs"][row, 0] == length


def test_sample_batch_num_episodes():
    s = fake_sampler(seed=23)
    mab = s.sample_batch((), num_episodes=3)
    batch = mab["default_policy"]
    parts = batch.split_by_episode()
    assert len(parts) >= 3 and all(p["terminateds"][-1] or p["truncateds"][-1] for p in parts)
    assert all(p["t"][0] == 0 for p in parts)


def test_sampler_compiles_its_rollout_once(monkeypatch):
    """The state from a reset and the state a rollout returns share one signature (env
    params of Python numbers used to make the second call compile again)."""
    env = js.make("CartPole-v1")
    pol = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    params = pol.init(jax.random.PRNGKey(0))
    s = js.Sampler(env, pol, num_envs=2, rollout_length=8)
    s.sample(params)  # compiles the rollout: the policy is traced here, and never again
    with no_policy_traces(monkeypatch, js.MLPPolicy):
        s.sample_batch(params)
        s.sample(params, num_episodes=1)  # resets
        s.sample(params)


@contextlib.contextmanager
def no_policy_traces(monkeypatch: pytest.MonkeyPatch, policy_cls: type) -> Iterator[None]:
    """Fails (``chex.assert_max_traces``) if ``policy_cls`` is traced inside the block: a
    rollout that compiles again traces its policy again."""
    with monkeypatch.context() as m:
        m.setattr(policy_cls, "__call__", chex.assert_max_traces(policy_cls.__call__, n=0))
        yield


def test_no_policy_traces_catches_a_recompile(monkeypatch):
    """The helper above really sees a compile: a new rollout shape traces the policy."""
    env = js.make("CartPole-v1")
    pol = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    params = pol.init(jax.random.PRNGKey(0))
    js.Sampler(env, pol, num_envs=2, rollout_length=8).sample(params)
    with pytest.raises(AssertionError, match="traced"), no_policy_traces(monkeypatch, js.MLPPolicy):
        js.Sampler(env, pol, num_envs=3, rollout_length=8).sample(params)


def test_sampled_episodes_build_their_buffers_once_whatever_is_touched_first():
    """sample() builds each episode's buffers on first access: the same buffer objects
    afterwards, the same data whichever column (or pickling, or an assignment) came first."""
    a, b, c = fake_sampler(seed=31), fake_sampler(seed=31), fake_sampler(seed=31)
    ea, eb, ec = a.sample(()), b.sample(()), c.sample(())
    assert len(ea) == len(eb) == len(ec) > 3
    for x, y, z in zip(ea, eb, ec, strict=True):
        assert x.observations is x.observations and x.actions is x.actions
        z.actions = y.actions  # an assignment first: the other columns are still this chunk's
        y2 = pickle.loads(pickle.dumps(y))  # pickling first
        for ep in (y2, z):
            assert (ep.id_, ep.t_started, ep.t, ep.is_terminated, ep.is_truncated) == (
                x.id_,
                x.t_started,
                x.t,
                x.is_terminated,
                x.is_truncated,
            )
            np.testing.assert_array_equal(ep.get_observations(), x.get_observations())
            np.testing.assert_array_equal(ep.get_rewards(), x.get_rewards())
            np.testing.assert_array_equal(ep.get_actions(), x.get_actions())
            assert ep.observations.lookback == x.observations.lookback
        check_chunk(z)


def test_a_lazy_episode_whose_build_fails_stays_lazy_and_builds_later():
    """An exception inside the deferred build of a column (e.g. KeyboardInterrupt) must
    not leave the episode half-built: the next access builds it and sees the same data."""
    from jaxsampler.episodes._sa_views import EpisodeViews

    ep = fake_sampler(seed=5).sample(())[0]
    want = fake_sampler(seed=5).sample(())[0]
    views = ep._view
    calls = []

    class Flaky(EpisodeViews):
        def column(self, key, name):
            calls.append(name)
            if len(calls) == 1:
                raise KeyboardInterrupt
            return views.column(key, name)

    ep._view = Flaky()
    with pytest.raises(KeyboardInterrupt):
        ep.get_observations(slice(0, None))
    np.testing.assert_array_equal(ep.get_observations(slice(0, None)), want.get_observations())
    np.testing.assert_array_equal(ep.get_rewards(0), want.get_rewards(0))
    assert calls == ["observations", "observations", "rewards"]


def test_infos_without_env_infos_are_separate_dicts():
    s = fake_sampler(seed=6)
    ep = s.sample(())[0]
    ep.get_infos(0)["note"] = "step 0 only"
    assert "note" not in ep.get_infos(1)
    rows = s.sample_batch(())["default_policy"]["infos"]
    rows[0]["x"] = 1
    assert all("x" not in r for r in rows[1:])


def test_a_one_agent_multi_agent_policy_keys_the_batch_by_its_policy_id():
    """Device and host samplers file a one-agent env's rows under the MultiAgentPolicy's id."""
    env = js.make("CartPole-v1")
    mlp = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    policy = js.policies.MultiAgentPolicy(env, {"red": mlp})
    params = policy.init(jax.random.PRNGKey(0))
    device = js.Sampler(env, policy, num_envs=2, rollout_length=8).sample_batch(params)
    with js.Sampler("gym:CartPole-v1", policy, num_envs=2, rollout_length=8) as host:
        assert (
            set(device.policy_batches) == set(host.sample_batch(params).policy_batches) == {"red"}
        )


def test_a_device_sampler_names_where_a_gym_id_belongs():
    env = js.make("CartPole-v1")
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    with pytest.raises(TypeError, match="gym:"):
        js.sampling.DeviceSampler("gym:CartPole-v1", pol)
