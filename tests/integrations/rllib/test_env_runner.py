"""JaxEnvRunner against RLlib 2.60 itself: episode classes and counts, actions / logp /
dist inputs equal to RLlib's own module on the same observations, weight sync without
retracing, RLlib's action unsquashing, one ``algo.train()``, and bad input."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("ray.rllib", reason="JaxEnvRunner needs ray[rllib] (the rllib extra)")
torch = pytest.importorskip("torch", reason="JaxEnvRunner needs torch (the rllib extra)")

import jax  # noqa: E402
from ray.rllib.algorithms.algorithm import Algorithm  # noqa: E402
from ray.rllib.algorithms.ppo import PPOConfig  # noqa: E402
from ray.rllib.core.columns import Columns  # noqa: E402
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig  # noqa: E402
from ray.rllib.env.single_agent_episode import SingleAgentEpisode  # noqa: E402
from ray.rllib.utils.spaces.space_utils import clip_action, unsquash_action  # noqa: E402

import jaxsampler as js  # noqa: E402
from jaxsampler.integrations.rllib import JaxEnvRunner, JaxMultiAgentEnvRunner  # noqa: E402
from jaxsampler.integrations.rllib.runner_parts import ActionToEnv, action_transform  # noqa: E402

TOL = dict(rtol=1e-5, atol=1e-5)
SMALL = DefaultModelConfig(fcnet_hiddens=[16, 16])


def config(env="CartPole-v1", num_envs=4, fragment=8, model=SMALL, seed=0):
    return (
        PPOConfig()
        .environment(env)
        .env_runners(
            env_runner_cls=JaxEnvRunner,
            num_env_runners=0,
            num_envs_per_env_runner=num_envs,
            rollout_fragment_length=fragment,
        )
        .rl_module(model_config=model)
        .debugging(seed=seed)
    )


@pytest.fixture(scope="module")
def runner():
    r = JaxEnvRunner(config=config())
    yield r
    r.stop()


@pytest.fixture(scope="module")
def pendulum_runner():
    r = JaxEnvRunner(config=config("Pendulum-v1", num_envs=2, fragment=8))
    yield r
    r.stop()


def rllib_forward(module, obs, explore=False):
    """RLlib's module on a batch of observations: ``action_dist_inputs`` as numpy."""
    batch = {Columns.OBS: torch.as_tensor(np.asarray(obs, np.float32))}
    with torch.no_grad():
        out = module.forward_exploration(batch) if explore else module.forward_inference(batch)
    return out[Columns.ACTION_DIST_INPUTS].numpy()


def all_steps(episodes):
    """(obs_t, action_t, extras_t) of every step of every episode chunk."""
    obs, act, extras = [], [], {}
    for ep in episodes:
        obs.append(ep.get_observations(slice(0, len(ep))))
        act.append(ep.get_actions())
        for k in ep.extra_model_outputs:
            extras.setdefault(k, []).append(ep.get_extra_model_outputs(k))
    return (
        np.concatenate(obs),
        np.concatenate(act),
        {k: np.concatenate(v) for k, v in extras.items()},
    )


# ------------------------------------------------------------------------- episodes


def test_sample_returns_rllib_episodes_with_counts_and_flags(runner):
    runner.sample(num_timesteps=32, force_reset=True)  # one reset, then continuation
    first = runner.sample(num_timesteps=32)
    runner.get_metrics()  # counters are per reduce (what the Algorithm does each iteration)
    second = runner.sample(num_timesteps=32)
    for episodes in (first, second):
        assert episodes and all(type(e) is SingleAgentEpisode for e in episodes)
        assert all(e.is_numpy for e in episodes)
        steps = sum(len(e) for e in episodes)
        assert steps >= 32
        # done episodes first, then ongoing chunks with data
        done = [e.is_done for e in episodes]
        assert done == sorted(done, reverse=True)
        for e in episodes:
            assert len(e) > 0 and not (e.is_terminated and e.is_truncated)
            e.validate()
            assert set(e.extra_model_outputs) == {
                "action_dist_inputs",
                "action_logp",
                "weights_seq_no",
            }
            assert len(e.observations) == len(e) + 1 and len(e.actions) == len(e)
            # CartPole rewards are 1 per step; terminated when the pole falls
            np.testing.assert_array_equal(e.get_rewards(), np.ones(len(e)))
    # ongoing chunks of the first call continue in the second: same id, t_started = t
    ongoing = {e.id_: e for e in first if not e.is_done}
    continued = [e for e in second if e.id_ in ongoing]
    assert len(continued) == len(ongoing) == runner.num_envs
    for e in continued:
        assert e.t_started == ongoing[e.id_].t
        np.testing.assert_array_equal(e.get_observations(0), ongoing[e.id_].get_observations(-1))
    metrics = runner.get_metrics()
    assert metrics["num_env_steps_sampled"].peek() == sum(len(e) for e in second)


def test_num_episodes_resets_and_returns_finished_episodes(runner):
    episodes = runner.sample(num_episodes=3)
    assert len(episodes) >= 3 and all(e.is_done and e.t_started == 0 for e in episodes)
    assert runner.get_metrics()["num_episodes"].peek() == len(episodes)
    # the next call starts from a fresh reset (as RLlib's runner does)
    assert all(e.t_started == 0 for e in runner.sample(num_timesteps=8))


def test_actions_logp_and_dist_inputs_come_from_the_rllib_module(runner):
    episodes = runner.sample(num_timesteps=32, explore=True)
    obs, act, extras = all_steps(episodes)
    logits = rllib_forward(runner.module, obs, explore=True)
    np.testing.assert_allclose(extras["action_dist_inputs"], logits, **TOL)
    logp = torch.log_softmax(torch.as_tensor(logits), -1).numpy()[np.arange(len(act)), act]
    np.testing.assert_allclose(extras["action_logp"], logp, **TOL)
    # greedy: the argmax of RLlib's inference logits
    episodes = runner.sample(num_timesteps=32, explore=False)
    obs, act, extras = all_steps(episodes)
    np.testing.assert_array_equal(act, rllib_forward(runner.module, obs).argmax(-1))


def test_random_actions_store_only_weights_seq_no(runner):
    episodes = runner.sample(num_timesteps=16, random_actions=True)
    assert all(set(e.extra_model_outputs) == {"weights_seq_no"} for e in episodes)
    assert all(gym.spaces.Discrete(2).contains(int(a)) for a in all_steps(episodes)[1])


def test_set_state_syncs_weights_without_retracing(runner):
    runner.sample(num_timesteps=4 * 8 + 1)  # a full chunk and a top-up: both compiled
    traces = runner.num_policy_traces
    state = runner.get_state()
    rl_state = {k: np.asarray(v) * -3.0 for k, v in state["rl_module"].items()}
    seq = state["weights_seq_no"] + 1
    w = next(k for k in rl_state if k.startswith("encoder.") and k.endswith("weight"))
    runner.set_state({"rl_module": {"default_policy": rl_state}, "weights_seq_no": seq})
    episodes = runner.sample(num_timesteps=32, explore=False)
    obs, act, extras = all_steps(episodes)
    # the RLlib module itself got the new weights (get_state / checkpoints) ...
    np.testing.assert_allclose(runner.get_state()["rl_module"][w], rl_state[w])
    # ... and the jitted policy acts with them
    np.testing.assert_array_equal(act, rllib_forward(runner.module, obs).argmax(-1))
    np.testing.assert_allclose(
        extras["action_dist_inputs"], rllib_forward(runner.module, obs), **TOL
    )
    assert set(extras["weights_seq_no"][-runner.num_envs :].tolist()) == {seq}
    assert runner.num_policy_traces == traces  # weights are data: no new trace
    # an older seq no. is ignored, as by RLlib's runner
    runner.set_state({"rl_module": {"default_policy": state["rl_module"]}, "weights_seq_no": 1})
    np.testing.assert_allclose(runner.get_state()["rl_module"][w], rl_state[w])


# ------------------------------------------------------------------------- continuous


@pytest.mark.parametrize("normalize, clip", [(True, False), (False, True)])
def test_env_receives_rllib_unsquashed_or_clipped_actions(normalize, clip):
    env = js.make("Pendulum-v1")
    space = env.action_space.to_gymnasium()
    transform = action_transform(space, normalize, clip)
    assert transform == ("unsquash" if normalize else "clip")
    wrapped = ActionToEnv(env, transform)
    key = jax.random.PRNGKey(0)
    state, _ = env.reset(key)
    raw = np.array([[-1.7], [-0.3], [0.2], [0.95], [2.5]], np.float32)
    for a in raw:
        ref = unsquash_action(a, space) if normalize else clip_action(a, space)
        _, ts_ref = env.step(key, state, ref[None])
        _, ts = wrapped.step(key, state, a[None])
        np.testing.assert_allclose(np.asarray(ts.reward), np.asarray(ts_ref.reward), **TOL)
        np.testing.assert_allclose(np.asarray(ts.obs), np.asarray(ts_ref.obs), **TOL)


@pytest.mark.parametrize("normalize, clip", [(True, False), (False, True), (True, True)])
def test_action_transform_equals_rllibs(normalize, clip):
    import jax.numpy as jnp

    from jaxsampler.integrations.rllib.runner_parts import _apply

    space = gym.spaces.Box(np.array([-3.0, 0.5], np.float32), np.array([1.0, 4.0], np.float32))
    raw = np.random.default_rng(0).normal(0.0, 2.0, (64, 2)).astype(np.float32)
    ref = np.stack([unsquash_action(a, space) if normalize else clip_action(a, space) for a in raw])
    transform = action_transform(space, normalize, clip)
    got = jax.jit(lambda a: _apply(jnp, a, space.low, space.high, transform))(raw)
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-6, atol=1e-6)
    # unbounded Boxes and Discrete spaces pass actions through, as in RLlib
    assert action_transform(gym.spaces.Box(-np.inf, np.inf, (2,)), True, False) == "none"
    assert action_transform(gym.spaces.Discrete(3), True, True) == "none"


def test_box_actions_store_the_module_raw_action(pendulum_runner):
    r = pendulum_runner
    episodes = r.sample(num_timesteps=16, explore=False)
    obs, act, extras = all_steps(episodes)
    dist = rllib_forward(r.module, obs)
    np.testing.assert_allclose(extras["action_dist_inputs"], dist, **TOL)
    np.testing.assert_allclose(act[:, 0], dist[:, 0], **TOL)  # the mean, not unsquashed
    episodes = r.sample(num_timesteps=16, random_actions=True)
    act = all_steps(episodes)[1]
    assert act.min() >= -1.0 and act.max() <= 1.0  # module range; the env sees [-2, 2]


# ------------------------------------------------------------------------- host envs


def test_gymnasium_ids_use_the_host_sampler():
    r = JaxEnvRunner(config=config("gym:CartPole-v1", num_envs=2, fragment=8))
    try:
        assert not isinstance(r.env, js.Env)
        episodes = r.sample(num_timesteps=16)
        assert sum(len(e) for e in episodes) >= 16
        assert all(type(e) is SingleAgentEpisode and e.is_numpy for e in episodes)
        obs, act, extras = all_steps(episodes)
        np.testing.assert_allclose(
            extras["action_dist_inputs"], rllib_forward(r.module, obs), **TOL
        )
    finally:
        r.stop()


# ------------------------------------------------------------------------- algorithm


def test_one_ppo_iteration_trains_and_reports_rllib_metrics(tmp_path):
    cfg = config(num_envs=4, fragment=16).training(
        train_batch_size_per_learner=64, minibatch_size=32, num_epochs=1
    )
    algo = cfg.build_algo()
    try:
        before = algo.env_runner.get_state()["rl_module"]
        result = algo.train()
        er = result["env_runners"]
        assert er["num_env_steps_sampled_lifetime"] >= 64
        assert er["num_env_steps_sampled"] >= 64
        for key in ("episode_return_mean", "episode_len_mean", "num_episodes"):
            assert key in er
        assert np.isfinite(result["learners"]["default_policy"]["policy_loss"])
        # the learner's update reached the runner (RLlib's weight sync -> set_state)
        after = algo.env_runner.get_state()
        assert after["weights_seq_no"] >= 1
        changed = [
            not np.allclose(np.asarray(before[k]), np.asarray(v))
            for k, v in after["rl_module"].items()
        ]
        assert any(changed)
        path = algo.save_to_path(str(tmp_path / "ckpt"))
    finally:
        algo.stop()
    # RLlib's checkpoint restores the runner: module weights and the mirrored policy's
    restored = Algorithm.from_checkpoint(path)
    try:
        r = restored.env_runner
        assert isinstance(r, JaxEnvRunner)
        state = r.get_state()
        for k, v in after["rl_module"].items():
            np.testing.assert_allclose(np.asarray(state["rl_module"][k]), np.asarray(v))
        obs, act, _ = all_steps(r.sample(num_timesteps=16, explore=False))
        np.testing.assert_array_equal(act, rllib_forward(r.module, obs).argmax(-1))
        assert state["num_env_steps_sampled_lifetime"] == after["num_env_steps_sampled_lifetime"]
    finally:
        restored.stop()


# ------------------------------------------------------------------------- bad input


def test_bad_input_fails_at_construction_naming_alternatives():
    with pytest.raises(ValueError, match="unknown env id.*gymnax"):
        JaxEnvRunner(config=config("NoSuchEnv-v9"))
    with pytest.raises(ValueError, match="JaxMultiAgentEnvRunner"):
        JaxEnvRunner(config=config("Spread-v0"))
    cfg = config().env_runners(env_to_module_connector=lambda env, spaces, device: [])
    with pytest.raises(ValueError, match="custom connectors"):
        JaxEnvRunner(config=cfg)
    cfg = config().multi_agent(policies={"p"}, policy_mapping_fn=lambda aid, ep, **kw: "p")
    with pytest.raises(ValueError, match="JaxMultiAgentEnvRunner"):
        JaxEnvRunner(config=cfg)
    with pytest.raises(TypeError, match="Box or Discrete"):
        JaxEnvRunner(config=config("gym:Blackjack-v1"))  # Tuple observations
    with pytest.raises(TypeError, match="supported|support"):  # an LSTM encoder
        JaxEnvRunner(config=config(model=DefaultModelConfig(use_lstm=True)))
    with pytest.raises(TypeError, match="MultiAgentEnvRunner"):  # a host-stepped env
        JaxMultiAgentEnvRunner(config=config("gym:CartPole-v1"))
    r = JaxEnvRunner(config=config())
    try:
        with pytest.raises(ValueError, match="not both"):
            r.sample(num_timesteps=4, num_episodes=1)
        r.make_env()  # what RLlib does after an env failure: a fresh sampler, fresh episodes
        assert all(e.t_started == 0 for e in r.sample(num_timesteps=4))
    finally:
        r.stop()


# ------------------------------------------------------------------------- suite ids

#: one id of each suite ``js.make`` knows, and whether it is multi-agent
SUITE_IDS = [
    ("gymnax:CartPole-v1", False),
    ("brax:ant", False),
    ("jumanji:Snake-v1", False),
    ("pgx:tic_tac_toe", True),
    ("jaxmarl:MPE_simple_spread_v3", True),
]


@pytest.mark.parametrize("env_id,multi", SUITE_IDS)
def test_every_suite_id_resolves_to_the_env_js_make_builds(env_id, multi):
    """Both runners take every ``"<suite>:<id>"`` that ``js.make`` takes (suites not
    installed: the suite's own ImportError, not "unknown env id")."""
    from jaxsampler.envs.registry import SUITES
    from jaxsampler.integrations.rllib.runner_parts import resolve_env

    assert {s.partition(":")[0] for s, _ in SUITE_IDS} == set(SUITES)
    try:
        ref = js.make(env_id)
    except ImportError as e:
        with pytest.raises(ImportError, match=str(e)[:20]):
            resolve_env(config(env_id), 0, 0, multi_agent=multi)
        return
    got = resolve_env(config(env_id), 0, 0, multi_agent=multi)
    assert type(got.env) is type(ref) and got.env.agent_ids == ref.agent_ids
    assert got.observation_space == ref.observation_space.to_gymnasium()
    if multi:  # the single-agent runner names the multi-agent one
        with pytest.raises(ValueError, match="JaxMultiAgentEnvRunner"):
            resolve_env(config(env_id), 0, 0)


def test_single_agent_runner_samples_a_suite_env():
    r = JaxEnvRunner(config=config("gymnax:CartPole-v1", num_envs=2))
    try:
        episodes = r.sample(num_timesteps=16, random_actions=True)
        assert sum(len(e) for e in episodes) >= 16
        assert all(type(e) is SingleAgentEpisode for e in episodes)
    finally:
        r.stop()


def test_a_remote_runners_construction_error_travels_to_the_drivers_runner():
    """Without Ray: a runner built as remote runner 1 with a bad config stays up and answers
    ``get_spaces()`` with its error; the driver's runner, which RLlib builds with those
    spaces, raises it (``test_remote_runners.py`` runs the same through ``build_algo()``)."""
    bad = config(model=DefaultModelConfig(use_lstm=True))
    with pytest.raises(TypeError, match="policy_from_rl_module") as local:
        JaxEnvRunner(config=bad)
    remote = JaxEnvRunner(config=bad, worker_index=1, num_workers=1)
    remote.assert_healthy()
    spaces = remote.get_spaces()
    for work in (remote.sample, remote.get_state):  # asked to work, it raises the error too
        with pytest.raises(TypeError, match="policy_from_rl_module"):
            work()
    remote.stop()
    with pytest.raises(TypeError) as driver:
        JaxEnvRunner(config=config(), worker_index=0, num_workers=1, spaces=spaces)
    assert str(driver.value) == str(local.value)
    ma = config("gym:CartPole-v1").multi_agent(
        policies={"p"}, policy_mapping_fn=lambda *a, **k: "p"
    )
    spaces = JaxMultiAgentEnvRunner(config=ma, worker_index=1, num_workers=1).get_spaces()
    with pytest.raises(TypeError, match="MultiAgentEnvRunner"):
        JaxMultiAgentEnvRunner(config=ma, worker_index=0, num_workers=1, spaces=spaces)
