"""policy_from_rl_module / params_from_module_state against RLlib 2.60's own PPO torch module.

Every expected number here comes from RLlib's module itself (``forward_exploration``,
``forward_inference``, ``compute_values``, its action distribution class's ``logp`` and
``to_deterministic``), on random observations.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip(
    "ray.rllib", reason="the RLlib module mirror needs ray[rllib] (the rllib extra)"
)
torch = pytest.importorskip("torch", reason="the RLlib module mirror needs torch (the rllib extra)")

import gymnasium as gym  # noqa: E402
from ray.rllib.algorithms.ppo import PPOConfig  # noqa: E402
from ray.rllib.core.columns import Columns  # noqa: E402
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig  # noqa: E402

from jaxsampler.integrations.rllib import policy_from_rl_module  # noqa: E402
from jaxsampler.integrations.rllib.module import params_from_module_state  # noqa: E402
from jaxsampler.spaces import Discrete  # noqa: E402

CARTPOLE_OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
CARTPOLE_ACT = gym.spaces.Discrete(2)
PENDULUM_OBS = gym.spaces.Box(-8.0, 8.0, (3,), np.float32)
PENDULUM_ACT = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
BOX2_ACT = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

TOL = dict(rtol=1e-5, atol=1e-5)
# A Gaussian logp amplifies float32 rounding of the mean by (x - mean) / std**2.
LOGP_TOL = dict(rtol=1e-4, atol=1e-4)

# (id, obs space, action space, model config)
CASES = [
    ("cartpole-default", CARTPOLE_OBS, CARTPOLE_ACT, {}),  # 256x256 tanh, shared layers
    (
        "cartpole-shared-relu",
        CARTPOLE_OBS,
        CARTPOLE_ACT,
        dict(fcnet_hiddens=[16, 8], fcnet_activation="relu", vf_share_layers=True),
    ),
    (
        "cartpole-heads-layernorm",
        CARTPOLE_OBS,
        gym.spaces.Discrete(5),
        dict(
            fcnet_hiddens=[12],
            fcnet_activation="silu",
            head_fcnet_hiddens=[7, 5],
            head_fcnet_activation="tanh",
            fcnet_use_layernorm=True,
            head_fcnet_use_layernorm=True,
            vf_share_layers=False,
        ),
    ),
    (
        "pendulum-default",
        PENDULUM_OBS,
        PENDULUM_ACT,
        dict(fcnet_hiddens=[32, 32], vf_share_layers=False),
    ),
    (
        "pendulum-shared-free-log-std",
        PENDULUM_OBS,
        PENDULUM_ACT,
        dict(fcnet_hiddens=[16], vf_share_layers=True, free_log_std=True),
    ),
    (
        "box2-elu-heads",
        PENDULUM_OBS,
        BOX2_ACT,
        dict(fcnet_hiddens=[10, 6], fcnet_activation="elu", head_fcnet_hiddens=[4]),
    ),
    (
        "box2-free-log-std-separate",
        PENDULUM_OBS,
        BOX2_ACT,
        dict(fcnet_hiddens=[8], free_log_std=True, log_std_clip_param=0.5, vf_share_layers=False),
    ),
]


def _spec(obs_space, act_space, model_config, inference_only=False):
    config = (
        PPOConfig()
        .environment(observation_space=obs_space, action_space=act_space)
        .rl_module(model_config=DefaultModelConfig(**model_config))
    )
    spec = config.get_rl_module_spec()
    spec.inference_only = inference_only
    return spec


def _module(obs_space, act_space, model_config, seed=0, inference_only=False):
    torch.manual_seed(seed)
    module = _spec(obs_space, act_space, model_config, inference_only).build()
    # Default initialisers give near-zero heads; randomise so the comparison is not trivial.
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return module


def _obs(space, n=9, seed=1):
    return np.random.default_rng(seed).normal(0.0, 1.5, (n,) + space.shape).astype(np.float32)


def _rllib(module, obs):
    batch = {Columns.OBS: torch.from_numpy(obs)}
    with torch.no_grad():
        out = module.forward_exploration(batch)
        inference = module.forward_inference(batch)
        values = module.compute_values(batch) if hasattr(module, "vf") else None
    return out[Columns.ACTION_DIST_INPUTS], inference[Columns.ACTION_DIST_INPUTS], values


def _torch_action(action, space):
    a = torch.from_numpy(np.array(action))
    return a.to(torch.int64) if isinstance(space, gym.spaces.Discrete) else a.to(torch.float32)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_outputs_equal_rllib(case):
    _, obs_space, act_space, model_config = case
    module = _module(obs_space, act_space, model_config)
    policy, params = policy_from_rl_module(module, matmul_precision="highest")
    obs = _obs(obs_space)
    dist_inputs, inference_inputs, values = _rllib(module, obs)
    np.testing.assert_array_equal(dist_inputs.numpy(), inference_inputs.numpy())

    action, extras, _ = jax.jit(policy.__call__)(
        params, jnp.asarray(obs), jax.random.key(3), policy.initial_state((len(obs),))
    )
    assert set(extras) == {"action_dist_inputs", "action_logp", "vf_preds"}
    np.testing.assert_allclose(np.asarray(extras["action_dist_inputs"]), dist_inputs, **TOL)
    np.testing.assert_allclose(np.asarray(extras["vf_preds"]), values, **TOL)
    np.testing.assert_allclose(np.asarray(policy.values(params, obs)), values, **TOL)

    # The logp of the sampled actions, and of other given actions, is RLlib's.
    dist = module.get_exploration_action_dist_cls().from_logits(dist_inputs)
    np.testing.assert_allclose(
        np.asarray(extras["action_logp"]), dist.logp(_torch_action(action, act_space)), **LOGP_TOL
    )
    other = dist.sample()
    np.testing.assert_allclose(
        np.asarray(policy.log_prob(params, obs, other.numpy(), None)), dist.logp(other), **LOGP_TOL
    )
    assert action.shape == (len(obs),) + act_space.shape
    if isinstance(act_space, gym.spaces.Discrete):
        assert all(act_space.contains(int(a)) for a in np.asarray(action))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_greedy_actions_equal_rllib_deterministic(case):
    _, obs_space, act_space, model_config = case
    module = _module(obs_space, act_space, model_config, seed=4)
    policy, params = policy_from_rl_module(module, explore=False)
    obs = _obs(obs_space, n=32, seed=5)
    _, inference_inputs, _ = _rllib(module, obs)
    deterministic = (
        module.get_inference_action_dist_cls().from_logits(inference_inputs).to_deterministic()
    )
    expected = deterministic.sample().numpy()
    action, extras, _ = policy(params, jnp.asarray(obs), jax.random.key(0), None)
    if isinstance(act_space, gym.spaces.Discrete):
        np.testing.assert_array_equal(np.asarray(action), expected)
    else:
        np.testing.assert_allclose(np.asarray(action), expected, **TOL)
    # RLlib's deterministic distribution reports logp 0.
    np.testing.assert_array_equal(np.asarray(extras["action_logp"]), 0.0)


def test_discrete_samples_follow_rllib_distribution():
    module = _module(CARTPOLE_OBS, gym.spaces.Discrete(4), dict(fcnet_hiddens=[8]))
    policy, params = policy_from_rl_module(module)
    obs = np.repeat(_obs(CARTPOLE_OBS, n=1, seed=7), 20000, axis=0)
    action, _, _ = jax.jit(policy.__call__)(params, jnp.asarray(obs), jax.random.key(11), None)
    dist_inputs, _, _ = _rllib(module, obs[:1])
    probs = torch.softmax(dist_inputs[0], -1).numpy()
    freq = np.bincount(np.asarray(action), minlength=4) / len(obs)
    # 20000 draws: the standard error of a frequency is <= 0.0036; 0.02 is > 5 sigma.
    np.testing.assert_allclose(freq, probs, atol=0.02)


def test_gaussian_samples_follow_rllib_distribution():
    module = _module(PENDULUM_OBS, BOX2_ACT, dict(fcnet_hiddens=[8]))
    policy, params = policy_from_rl_module(module)
    obs = np.repeat(_obs(PENDULUM_OBS, n=1, seed=7), 20000, axis=0)
    action, _, _ = jax.jit(policy.__call__)(params, jnp.asarray(obs), jax.random.key(11), None)
    dist_inputs, _, _ = _rllib(module, obs[:1])
    mean, log_std = np.split(dist_inputs[0].numpy(), 2)
    std = np.exp(log_std)
    a = np.asarray(action)
    # Standard errors: std / sqrt(20000) for the mean, ~std / sqrt(2 * 20000) for the std.
    assert np.all(np.abs(a.mean(0) - mean) < 6 * std / np.sqrt(len(a))), (a.mean(0), mean)
    np.testing.assert_allclose(a.std(0), std, rtol=0.05)
    # Samples are unclipped, as RLlib's module samples them.
    assert a.shape == (20000, 2)


@pytest.mark.parametrize("shared", [False, True], ids=["separate", "shared"])
def test_inference_only_module_has_no_value(shared):
    model_config = dict(fcnet_hiddens=[8, 8], vf_share_layers=shared)
    full = _module(CARTPOLE_OBS, CARTPOLE_ACT, model_config, seed=2)
    light = _spec(CARTPOLE_OBS, CARTPOLE_ACT, model_config, inference_only=True).build()
    light.set_state(full.get_state(inference_only=True))
    policy, params = policy_from_rl_module(light)
    assert not policy.has_value and policy.critic_encoder is None
    obs = _obs(CARTPOLE_OBS)
    _, extras, _ = policy(params, jnp.asarray(obs), jax.random.key(0), None)
    assert set(extras) == {"action_dist_inputs", "action_logp"}
    np.testing.assert_allclose(
        np.asarray(extras["action_dist_inputs"]), _rllib(full, obs)[0], **TOL
    )
    with pytest.raises(ValueError, match="inference-only"):
        policy.values(params, obs)
    # The full module's state (learner side) syncs into it too (value keys ignored).
    p2 = params_from_module_state(policy, full.get_state())
    assert jax.tree.structure(p2) == jax.tree.structure(params)


@pytest.mark.parametrize("case", [CASES[0], CASES[4]], ids=[CASES[0][0], CASES[4][0]])
def test_weight_sync_after_optimizer_step(case):
    _, obs_space, act_space, model_config = case
    module = _module(obs_space, act_space, model_config, seed=8)
    policy, params = policy_from_rl_module(module)
    obs = _obs(obs_space, n=16, seed=9)

    traces = []

    @jax.jit
    def act(params, obs):
        traces.append(1)
        return policy(params, obs, jax.random.key(0), None)[1]

    before = act(params, jnp.asarray(obs))
    # One optimizer step on a PPO-like surrogate changes every tensor.
    opt = torch.optim.Adam(module.parameters(), lr=0.05)
    batch = {Columns.OBS: torch.from_numpy(obs)}
    out = module.forward_train(batch)
    loss = (
        out[Columns.ACTION_DIST_INPUTS].square().mean()
        + module.compute_values(batch, out.get(Columns.EMBEDDINGS)).square().mean()
    )
    if policy.free_log_std_key:
        loss = loss + module.pi.log_std.sum()
    opt.zero_grad()
    loss.backward()
    opt.step()

    for state in (module.get_state(), {"default_policy": module.get_state()}):
        new_params = params_from_module_state(policy, state)
        assert jax.tree.structure(new_params) == jax.tree.structure(params)
        assert all(
            a.shape == b.shape and a.dtype == b.dtype
            for a, b in zip(jax.tree.leaves(new_params), jax.tree.leaves(params), strict=True)
        )
        after = act(new_params, jnp.asarray(obs))
        dist_inputs, _, values = _rllib(module, obs)
        np.testing.assert_allclose(np.asarray(after["action_dist_inputs"]), dist_inputs, **TOL)
        np.testing.assert_allclose(np.asarray(after["vf_preds"]), values, **TOL)
        assert not np.allclose(after["action_dist_inputs"], before["action_dist_inputs"])
    assert len(traces) == 1  # the sync did not retrace

    # torch tensors (not numpy) are accepted as well.
    tensors = {k: torch.from_numpy(np.asarray(v)) for k, v in module.get_state().items()}
    np.testing.assert_array_equal(
        np.asarray(params_from_module_state(policy, tensors)["pi.net.mlp.0.weight"]),
        module.pi.net.mlp[0].weight.detach().numpy(),
    )


def test_weight_sync_bad_state():
    module = _module(CARTPOLE_OBS, CARTPOLE_ACT, {})
    policy, _ = policy_from_rl_module(module)
    state = module.get_state()
    del state["pi.net.mlp.0.weight"]
    with pytest.raises(KeyError, match="pi.net.mlp.0.weight"):
        params_from_module_state(policy, state)
    other = _module(CARTPOLE_OBS, CARTPOLE_ACT, dict(fcnet_hiddens=[8, 8])).get_state()
    with pytest.raises(ValueError, match="shape"):
        params_from_module_state(policy, other)


def test_spec_and_discrete_obs_override():
    spec = _spec(gym.spaces.Box(0.0, 1.0, (5,), np.float32), CARTPOLE_ACT, {})
    policy, params = policy_from_rl_module(spec)  # a spec is built
    assert policy.param_shapes["encoder.encoder.net.mlp.0.weight"] == (256, 5)  # shared default
    # Discrete observations, one-hot encoded (as RLlib's FlattenObservations connector does).
    module = _module(gym.spaces.Box(0.0, 1.0, (5,), np.float32), CARTPOLE_ACT, {}, seed=3)
    policy, params = policy_from_rl_module(module, observation_space=Discrete(5))
    obs = np.array([0, 3, 4, 1], np.int32)
    _, extras, _ = policy(params, jnp.asarray(obs), jax.random.key(0), None)
    dist_inputs, _, values = _rllib(module, np.eye(5, dtype=np.float32)[obs])
    np.testing.assert_allclose(np.asarray(extras["action_dist_inputs"]), dist_inputs, **TOL)
    np.testing.assert_allclose(np.asarray(extras["vf_preds"]), values, **TOL)
    with pytest.raises(ValueError, match="features"):
        policy_from_rl_module(module, observation_space=Discrete(4))


def test_unsupported_modules_raise():
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec

    with pytest.raises(TypeError, match="DefaultPPOTorchRLModule"):
        policy_from_rl_module(torch.nn.Linear(2, 2))
    lstm = _spec(CARTPOLE_OBS, CARTPOLE_ACT, dict(use_lstm=True, lstm_cell_size=8)).build()
    with pytest.raises(TypeError, match="LSTM|stateful"):
        policy_from_rl_module(lstm)
    spec = _spec(CARTPOLE_OBS, CARTPOLE_ACT, {})
    multi = MultiRLModuleSpec(rl_module_specs={"a": spec, "b": spec})
    with pytest.raises(TypeError, match="each sub-module"):
        policy_from_rl_module(multi)
    with pytest.raises(TypeError, match="each sub-module"):
        policy_from_rl_module(multi.build())
    # A module of another algorithm (SAC's default torch module; DQN's is mirrored, see
    # test_dqn.py, and its distributional variant is refused).
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.algorithms.sac import SACConfig

    sac = (
        SACConfig()
        .environment(observation_space=PENDULUM_OBS, action_space=PENDULUM_ACT)
        .get_rl_module_spec()
        .build()
    )
    with pytest.raises(TypeError, match="DefaultPPOTorchRLModule.*DefaultDQNTorchRLModule"):
        policy_from_rl_module(sac)
    dqn = (
        DQNConfig()
        .environment(observation_space=CARTPOLE_OBS, action_space=CARTPOLE_ACT)
        .training(num_atoms=5)
        .get_rl_module_spec()
        .build()
    )
    with pytest.raises(TypeError, match="distributional"):
        policy_from_rl_module(dqn)
    # A custom subclass that changes the forward pass is not the default module.
    from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import (
        DefaultPPOTorchRLModule,
    )

    class Custom(DefaultPPOTorchRLModule):
        def _forward(self, batch, **kwargs):
            return super()._forward(batch, **kwargs)

    spec.module_class = Custom
    with pytest.raises(TypeError, match="overrides _forward"):
        policy_from_rl_module(spec)
    spec.module_class = DefaultPPOTorchRLModule
    with pytest.raises(ValueError, match="matmul_precision"):
        policy_from_rl_module(spec, matmul_precision="fast")
    md = _spec(CARTPOLE_OBS, gym.spaces.MultiDiscrete([2, 3]), {}).build()
    with pytest.raises(TypeError, match="supported"):
        policy_from_rl_module(md)


@pytest.mark.parametrize("act_space", [gym.spaces.Discrete(3), BOX2_ACT], ids=["discrete", "box"])
@pytest.mark.parametrize("recurrent", [False, True], ids=["mlp", "gru"])
def test_js_policies_action_dist_inputs_are_rllibs_layout(act_space, recurrent):
    """``js.MLPPolicy`` / ``js.policies.RecurrentPolicy``'s ``action_dist_inputs``, read by
    RLlib's own
    action distribution class, give back the policy's ``action_logp`` (what RLlib's PPO loss
    does with these columns)."""
    from ray.rllib.core.distribution.torch.torch_distribution import (
        TorchCategorical,
        TorchDiagGaussian,
    )

    import jaxsampler as js
    from jaxsampler.spaces import from_gymnasium_space

    obs_space, space = from_gymnasium_space(PENDULUM_OBS), from_gymnasium_space(act_space)
    if recurrent:
        policy = js.policies.RecurrentPolicy(obs_space, space, hidden_size=8)
    else:
        policy = js.MLPPolicy(obs_space, space, hidden_sizes=(8,))
    params = policy.init(jax.random.key(0))
    if isinstance(space, Discrete):
        params["params"]["actor_out"]["bias"] = jnp.array([1.0, -0.5, 0.2])
    else:
        params["params"]["log_std"] = jnp.array([-0.6, 0.3])
    obs = jnp.asarray(_obs(PENDULUM_OBS, n=12))
    state = policy.initial_state((12,))
    action, extras, _ = policy(params, obs, jax.random.key(1), state)
    cls = TorchCategorical if isinstance(space, Discrete) else TorchDiagGaussian
    dist = cls.from_logits(torch.from_numpy(np.array(extras["action_dist_inputs"])))
    np.testing.assert_allclose(
        dist.logp(_torch_action(action, act_space)).numpy(), extras["action_logp"], **LOGP_TOL
    )
    if not isinstance(space, Discrete):
        np.testing.assert_allclose(dist._dist.scale.numpy(), np.exp([[-0.6, 0.3]] * 12), rtol=1e-6)
