"""RLlib 2.60's DQN with jaxsampler: the DQN module mirror against RLlib's own module,
``JaxEnvRunner`` with ``DQNConfig``, and DQN training on CartPole with it.

Every expected number comes from RLlib itself: ``compute_q_values``, ``forward_inference`` /
``forward_exploration`` actions, the module's own epsilon ``Scheduler``, RLlib's own
``SingleAgentEnvRunner`` for what episodes carry.
"""

from __future__ import annotations

import chex
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("ray.rllib", reason="the DQN mirror needs ray[rllib] (the rllib extra)")
torch = pytest.importorskip("torch", reason="the DQN mirror needs torch (the rllib extra)")

from ray.rllib.algorithms.dqn import DQNConfig  # noqa: E402
from ray.rllib.algorithms.dqn.torch.default_dqn_torch_rl_module import (  # noqa: E402
    DefaultDQNTorchRLModule,
)
from ray.rllib.core.columns import Columns  # noqa: E402
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig  # noqa: E402
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner  # noqa: E402
from ray.rllib.utils.schedules.scheduler import Scheduler  # noqa: E402

from jaxsampler.integrations.rllib import JaxEnvRunner, policy_from_rl_module  # noqa: E402
from jaxsampler.integrations.rllib.dqn_module import DQNModulePolicy  # noqa: E402
from jaxsampler.integrations.rllib.module import params_from_module_state  # noqa: E402
from tests.integrations.rllib.dqn_config import EPSILON, dqn_config  # noqa: E402

CARTPOLE_OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
TOL = dict(rtol=1e-5, atol=1e-5)

# (id, number of actions, DQNConfig.training kwargs, model config)
CASES = [
    ("default-dueling", 2, {}, {}),  # 256x256 tanh encoder, 256 relu heads
    ("dueling-small", 5, dict(dueling=True), dict(fcnet_hiddens=[16, 8], head_fcnet_hiddens=[6])),
    ("plain-q", 3, dict(dueling=False), dict(fcnet_hiddens=[12], fcnet_activation="relu")),
    (
        "layernorm-silu",
        4,
        dict(dueling=True),
        dict(
            fcnet_hiddens=[10],
            fcnet_activation="silu",
            fcnet_use_layernorm=True,
            head_fcnet_hiddens=[7, 5],
            head_fcnet_activation="tanh",
        ),
    ),
]


def _spec(n, training=None, model=None, epsilon=EPSILON, inference_only=True):
    config = (
        DQNConfig()
        .environment(observation_space=CARTPOLE_OBS, action_space=gym.spaces.Discrete(n))
        .training(epsilon=epsilon, **(training or {}))
        .rl_module(model_config=DefaultModelConfig(**(model or {})))
    )
    spec = config.get_rl_module_spec()
    spec.inference_only = inference_only
    return spec


def _module(n, training=None, model=None, seed=0, **kwargs):
    torch.manual_seed(seed)
    module = _spec(n, training, model, **kwargs).build()
    # Default initialisers give near-zero heads; randomise so the comparison is not trivial.
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return module


def _obs(n=64, seed=1):
    return np.random.default_rng(seed).normal(0.0, 1.5, (n, 4)).astype(np.float32)


def _rllib_q(module, obs):
    with torch.no_grad():
        out = module.compute_q_values({Columns.OBS: torch.from_numpy(np.array(obs))})
    return out["qf_preds"].numpy()


def _rllib_actions(module, obs, t=None):
    batch = {Columns.OBS: torch.from_numpy(np.array(obs))}
    with torch.no_grad():
        out = (
            module.forward_inference(batch) if t is None else module.forward_exploration(batch, t=t)
        )
    return out[Columns.ACTIONS].numpy()


# ------------------------------------------------------------------------- the module mirror


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_q_values_and_greedy_actions_equal_rllib(case):
    _, n, training, model = case
    module = _module(n, training, model)
    policy, params = policy_from_rl_module(module, explore=False, matmul_precision="highest")
    assert isinstance(policy, DQNModulePolicy)
    assert (policy.vf_head is not None) == module.uses_dueling
    obs = _obs()
    q = _rllib_q(module, obs)
    action, extras, _ = jax.jit(policy.__call__)(params, jnp.asarray(obs), jax.random.key(0), None)
    np.testing.assert_allclose(np.asarray(extras["qf_preds"]), q, **TOL)
    np.testing.assert_allclose(np.asarray(policy.q_values(params, obs)), q, **TOL)
    np.testing.assert_array_equal(np.asarray(action), _rllib_actions(module, obs))
    assert np.asarray(action).dtype == policy.action_space.dtype
    # the learner's full module mirrors the same (its target networks are not read)
    full = _spec(n, training, model, inference_only=False).build()
    full.set_state(module.get_state())
    full_policy, full_params = policy_from_rl_module(
        full, explore=False, matmul_precision="highest"
    )
    assert full_policy == policy
    np.testing.assert_allclose(np.asarray(full_policy.q_values(full_params, obs)), q, **TOL)


@pytest.mark.parametrize(
    "epsilon", [EPSILON, [(0, 1.0), (100, 0.5), (300, 0.0)], 0.25], ids=["default", "3pts", "fixed"]
)
def test_epsilon_is_rllibs_schedule(epsilon):
    module = _module(2, epsilon=epsilon)
    policy, params = policy_from_rl_module(module)
    scheduler = Scheduler(epsilon, framework="torch")  # what the module builds
    assert float(params["epsilon"]) == pytest.approx(float(scheduler.get_current_value()))
    for t in (0, 1, 99, 100, 101, 250, 299, 300, 2499, 2500, 2501, 10**7):
        expected = float(scheduler.update(t))
        assert policy.epsilon_at(t) == pytest.approx(expected, rel=1e-6, abs=1e-7), t
        assert float(policy.at_timestep(params, t)["epsilon"]) == pytest.approx(expected, rel=1e-6)
        # the module's own forward pass moves its schedule to the same value
        _rllib_actions(module, _obs(2), t=t)
        assert float(module.epsilon_schedule.get_current_value()) == pytest.approx(expected)


def test_exploration_is_rllibs_epsilon_greedy():
    """With epsilon 0 exploration is RLlib's greedy choice; with epsilon e each row takes a
    uniformly random action with probability e: both mirrors' action frequencies on one
    repeated observation agree with (1 - e) * [a = argmax] + e / n and with each other."""
    n = 4
    module = _module(n, epsilon=[(0, 1.0), (1000, 0.3), (2000, 0.0)], model=dict(fcnet_hiddens=[8]))
    policy, params = policy_from_rl_module(module)
    act = jax.jit(policy.__call__)
    obs = _obs(256, seed=3)
    greedy = _rllib_actions(module, obs)
    # t = 2000: epsilon 0, both explore greedily
    np.testing.assert_array_equal(_rllib_actions(module, obs, t=2000), greedy)
    a0, _, _ = act(policy.at_timestep(params, 2000), jnp.asarray(obs), jax.random.key(1), None)
    np.testing.assert_array_equal(np.asarray(a0), greedy)
    # t = 1000: epsilon 0.3
    rows = np.repeat(obs[:1], 20000, axis=0)
    ours, _, _ = act(policy.at_timestep(params, 1000), jnp.asarray(rows), jax.random.key(2), None)
    torch.manual_seed(0)
    theirs = _rllib_actions(module, rows, t=1000)
    expected = np.full(n, 0.3 / n)
    expected[greedy[0]] += 0.7
    # 20000 draws: a frequency's standard error is <= 0.0035; 0.02 is > 5 sigma.
    for actions in (np.asarray(ours), theirs):
        np.testing.assert_allclose(
            np.bincount(actions, minlength=n) / len(rows), expected, atol=0.02
        )


def test_epsilon_and_weight_sync_do_not_retrace():
    module = _module(3, model=dict(fcnet_hiddens=[8]))
    policy, params = policy_from_rl_module(module)
    obs = jnp.asarray(_obs(16))

    @jax.jit
    @chex.assert_max_traces(n=1)
    def act(params, obs, key):
        return policy(params, obs, key, None)

    for t in (0, 700, 2500, 9000):
        act(policy.at_timestep(params, t), obs, jax.random.key(t))
    greedy, _, _ = act(policy.with_epsilon(params, 0.0), obs, jax.random.key(1))
    np.testing.assert_array_equal(np.asarray(greedy), _rllib_actions(module, np.asarray(obs)))
    with torch.no_grad():
        for p in module.parameters():
            p.mul_(-2.0)
    synced = params_from_module_state(policy, module.get_state())
    assert jax.tree.structure(synced) == jax.tree.structure(params)
    _, extras, _ = act(policy.at_timestep(synced, 50), obs, jax.random.key(0))
    np.testing.assert_allclose(
        np.asarray(extras["qf_preds"]), _rllib_q(module, np.asarray(obs)), **TOL
    )


def test_unsupported_dqn_variants_raise_naming_what_is_supported():
    with pytest.raises(TypeError, match="distributional.*supported:.*DefaultDQNTorchRLModule"):
        policy_from_rl_module(_spec(2, dict(num_atoms=3)).build())
    lstm = _spec(2, model=dict(use_lstm=True, lstm_cell_size=8, max_seq_len=4)).build()
    with pytest.raises(TypeError, match="LSTM"):
        policy_from_rl_module(lstm)

    class Custom(DefaultDQNTorchRLModule):
        def _forward_exploration(self, batch, t):
            return super()._forward_exploration(batch, t)

    spec = _spec(2)
    spec.module_class = Custom
    with pytest.raises(TypeError, match="overrides _forward_exploration"):
        policy_from_rl_module(spec)


# ------------------------------------------------------------------------- JaxEnvRunner


def _runner_config(epsilon):
    return (
        dqn_config("jax")
        .training(epsilon=epsilon)
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[16], head_fcnet_hiddens=[8]))
    )


def test_runner_acts_with_rllibs_epsilon_at_the_lifetime_step():
    """``JaxEnvRunner`` with ``DQNConfig``: episodes carry what RLlib's own runner stores
    (only ``weights_seq_no``); at a lifetime step where RLlib's epsilon is 0 every action is
    the argmax of RLlib's module on the episode's observations; at step 0 (epsilon 1) about
    half are not; a weight sync changes the actions without a retrace."""
    epsilon = [(0, 1.0), (100, 0.0)]
    runner = JaxEnvRunner(config=_runner_config(epsilon))
    rllib = SingleAgentEnvRunner(config=_runner_config(epsilon).env_runners(env_runner_cls=None))
    try:
        theirs = rllib.sample(num_timesteps=32)
        ours = runner.sample(num_timesteps=32)  # lifetime step 0: epsilon 1.0
        assert {k for e in theirs for k in e.extra_model_outputs} == {"weights_seq_no"}
        assert {k for e in ours for k in e.extra_model_outputs} == {"weights_seq_no"}

        def obs_and_actions(episodes):
            obs = np.concatenate([e.get_observations(slice(0, len(e))) for e in episodes])
            return obs, np.concatenate([e.get_actions() for e in episodes])

        obs, act = obs_and_actions(ours)
        assert np.mean(act != _rllib_actions(runner.module, obs)) > 0.2  # about 0.5
        runner.sample(num_timesteps=4 * 8 + 1)  # a full chunk and a top-up: both compiled
        traces = runner.num_policy_traces
        runner.set_state({"num_env_steps_sampled_lifetime": 100})
        assert runner.timestep() == 100
        obs, act = obs_and_actions(runner.sample(num_timesteps=32))
        np.testing.assert_array_equal(act, _rllib_actions(runner.module, obs))
        # a weight sync (what the algorithm sends after an update)
        state = runner.get_state()["rl_module"]
        new = {k: -3.0 * np.asarray(v) for k, v in state.items()}
        runner.set_state({"rl_module": {"default_policy": new}, "weights_seq_no": 5})
        episodes = runner.sample(num_timesteps=32)
        obs, act = obs_and_actions(episodes)
        np.testing.assert_array_equal(act, _rllib_actions(runner.module, obs))
        assert {int(e.get_extra_model_outputs("weights_seq_no")[-1]) for e in episodes} == {5}
        assert runner.num_policy_traces == traces
        # explore=False: greedy whatever the epsilon
        runner.set_state({"num_env_steps_sampled_lifetime": 0})
        obs, act = obs_and_actions(runner.sample(num_timesteps=32, explore=False))
        np.testing.assert_array_equal(act, _rllib_actions(runner.module, obs))
    finally:
        runner.stop()
        rllib.stop()


#: Iterations of 500 env steps, and the mean return (RLlib's ``episode_return_mean``: the
#: last 20 episodes, exploration on) that the best of the last 4 iterations reaches with
#: either runner. Measured with this config, seeds 0-4, best of iterations 13-16:
#: JaxEnvRunner 74-168, RLlib's SingleAgentEnvRunner 63-237 (random play: ~22).
TRAIN_ITERATIONS = 16
TARGET_RETURN = 50.0


@pytest.fixture
def one_torch_thread():
    """torch on one thread: on two shared cores its default (one thread per core) fights
    XLA's thread pool and makes each learner update about 10x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_dqn_trains_on_cartpole_with_jax_env_runner(one_torch_thread):
    algo = dqn_config("jax", seed=0).build_algo()
    # RLlib seeds its replay buffer's sampling from the OS; seeded, the run repeats
    algo.local_replay_buffer.rng = np.random.default_rng(0)
    try:
        assert isinstance(algo.env_runner, JaxEnvRunner)
        returns = []
        for _ in range(TRAIN_ITERATIONS):
            result = algo.train()
            returns.append(result["env_runners"].get("episode_return_mean", np.nan))
        er = result["env_runners"]
        assert er["num_env_steps_sampled_lifetime"] >= 500 * TRAIN_ITERATIONS
        assert np.isfinite(result["learners"]["default_policy"]["qf_loss"])
        assert algo.env_runner.get_state()["weights_seq_no"] > 0
        # epsilon has reached the schedule's end value (2500 steps)
        runner = algo.env_runner
        assert runner._js_policy.epsilon_at(runner.timestep()) == EPSILON[-1][1]
        assert returns[0] < TARGET_RETURN  # the first iteration acts at random (epsilon ~1)
        assert max(returns[-4:]) >= TARGET_RETURN, returns
    finally:
        algo.stop()


def test_multi_agent_runner_refuses_dqn_modules():
    from jaxsampler.integrations.rllib import JaxMultiAgentEnvRunner

    config = (
        DQNConfig()
        .environment("Spread-v0")
        .env_runners(env_runner_cls=JaxMultiAgentEnvRunner, num_env_runners=0)
        .multi_agent(policies={"p"}, policy_mapping_fn=lambda aid, ep, **kw: "p")
    )
    with pytest.raises(TypeError, match="DQN is mirrored by the single-agent JaxEnvRunner"):
        JaxMultiAgentEnvRunner(config=config)
