"""examples/sac.py: its soft TD targets against NumPy on every stored transition (truncations
at Pendulum's time limit bootstrap from the real final observation), the squashed-Gaussian
log-density against a numerical change of variables, and a quick training run (no learning
threshold: the full run's results are in benchmarks/results/sac_pendulum.md)."""

from __future__ import annotations

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js
from examples import sac

E, T, CALLS = 2, 8, 3


@pytest.fixture(scope="module")
def setup():
    env = js.make("Pendulum-v1")
    policy = sac.SquashedGaussianPolicy(env.observation_space, env.action_space, (16, 16))
    critic = sac.TwinQ((16, 16))
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    q = critic.init(k[1], jnp.zeros((1, 3)), jnp.zeros((1, 1)))
    learner = sac.Learner(
        actor=policy.init(k[0]),
        critic=q,
        target=critic.init(k[2], jnp.zeros((1, 3)), jnp.zeros((1, 1))),
        log_alpha=jnp.float32(-0.7),
    )
    return env, policy, critic, learner


def _np_mlp(params, x):
    layers = params["params"]
    names = sorted(layers, key=lambda k: int(k.split("_")[1]))
    x = np.asarray(x, np.float64)
    for n in names[:-1]:
        x = np.maximum(x @ np.asarray(layers[n]["kernel"]) + np.asarray(layers[n]["bias"]), 0)
    return x @ np.asarray(layers[names[-1]]["kernel"]) + np.asarray(layers[names[-1]]["bias"])


def test_critic_targets_on_every_stored_transition(setup):
    env, policy, critic, learner = setup
    rollout = js.make_rollout(env, policy, E, T)
    env_params = env.default_params.replace(max_steps_in_episode=10)  # truncations
    state = js.init_rollout_state(env, policy, E, jax.random.PRNGKey(1), env_params=env_params)
    replay = js.offpolicy.make_transition_buffer(
        jax.eval_shape(rollout, learner.actor, state)[1], CALLS * E * T, 4, 4
    )
    buf = replay.init()
    for _ in range(CALLS):
        state, traj = jax.jit(rollout)(learner.actor, state)
        buf = jax.jit(replay.add)(buf, traj)
    batch = jax.tree.map(lambda x: x[0], buf.experience)  # all stored items, [CALLS * E * T]
    key = jax.random.PRNGKey(5)
    y = jax.jit(sac.critic_targets, static_argnums=(0, 1, 5))(
        policy, critic, learner, batch, key, 0.97
    )
    b = jax.tree.map(np.asarray, batch)
    assert b.truncated[b.valid].sum() >= E and not b.terminated.any()
    out = _np_mlp(learner.actor, b.next_obs)
    mean, raw = out[:, :1], out[:, 1:]
    log_std = -5.0 + 0.5 * 7.0 * (np.tanh(raw) + 1.0)
    eps = np.asarray(jax.random.normal(key, (len(y), 1)), np.float64)  # the draw sample() makes
    u = mean + np.exp(log_std) * eps
    a_next = 2.0 * np.tanh(u)
    gauss = -0.5 * eps**2 - log_std - 0.5 * math.log(2 * math.pi)
    logp = (gauss - np.log(2.0 * (1.0 - np.tanh(u) ** 2))).sum(-1)  # |da/du| = 2 (1 - tanh^2)
    x = np.concatenate([b.next_obs, a_next], -1)
    tq = learner.target["params"]
    q_min = np.minimum(
        _np_mlp({"params": tq["q1"]}, x)[:, 0], _np_mlp({"params": tq["q2"]}, x)[:, 0]
    )
    expected = b.reward + 0.97 * (q_min - math.exp(-0.7) * logp)  # never terminated: bootstraps
    v = b.valid
    np.testing.assert_allclose(np.asarray(y)[v], expected[v], rtol=2e-4, atol=2e-4)


def test_squashed_log_density_integrates_the_action_density(setup):
    env, policy, _, learner = setup
    obs = jnp.asarray([[0.3, -0.9, 1.5]])
    # u ~ N(0.8, 0.62): far enough from 0 that the tanh's Jacobian matters
    last = learner.actor["params"]["Dense_2"]
    params = {"params": {**learner.actor["params"], "Dense_2": {
        "kernel": jnp.zeros_like(last["kernel"]), "bias": jnp.asarray([0.8, 0.3])}}}  # fmt: skip
    n = 200_000
    actions, logp = policy.sample(params, jnp.repeat(obs, n, 0), jax.random.PRNGKey(2))
    actions, logp = np.asarray(actions)[:, 0], np.asarray(logp)
    assert actions.min() >= -2.0 and actions.max() <= 2.0
    # the share of actions in a narrow bin ~ its width times the density exp(logp) there
    # (the change of variables through tanh and the rescaling to [-2, 2])
    edges = np.linspace(*np.quantile(actions, [0.02, 0.98]), 61)  # bins narrow to the spread
    hist, _ = np.histogram(actions, bins=edges)
    which = np.digitize(actions, edges) - 1
    checked = 0
    for b in np.nonzero(hist > 2_000)[0]:
        density = np.exp(logp[which == b]).mean()
        assert hist[b] / (n * np.diff(edges)[b]) == pytest.approx(density, rel=0.05)
        checked += 1
    assert checked >= 5
    greedy = js.policies.greedy(policy)(learner.actor, obs[None], jax.random.PRNGKey(0), None)[0]
    mean = policy.dist(learner.actor, obs)[0]
    np.testing.assert_allclose(np.asarray(greedy)[0, 0], 2.0 * np.tanh(np.asarray(mean)[0]), 1e-6)


def test_training_loop_stores_every_step_and_learns_the_temperature():
    cfg = dataclasses.replace(sac.SACConfig(**sac.QUICK), log_every=0)
    ts, m = jax.jit(sac.make_train(cfg))(jax.random.PRNGKey(0))
    added = cfg.num_iterations * cfg.steps_per_iteration
    assert added == cfg.buffer_size and bool(ts.buffer.is_full)
    valid = np.asarray(ts.buffer.experience.valid)
    # one reset step per 200-step episode, never at the start: 1024 steps over 4 envs
    # (256 each) hold one reset per env
    assert valid.sum() == added - cfg.num_envs
    loss = np.asarray(m["loss"])
    learning = np.nonzero(loss)[0]
    assert learning[0] == cfg.learning_starts // cfg.steps_per_iteration - 1
    alpha = np.asarray(m["alpha"])
    assert alpha[learning[0] - 1] == 1.0 and alpha[-1] < 1.0  # the temperature was learnt


def test_quick_main_writes_results(tmp_path):
    assert sac.main(["--quick", "--seeds", "0", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "sac_pendulum.json").read_text())
    assert res["env_steps_per_seed"] == 1_024 and res["seeds"] == [0]
    assert len(res["eval_returns_per_seed"][0]) == res["eval_episodes"] == 2
    assert all(-2_000 < r <= 0 for r in res["eval_returns_per_seed"][0])
    md = (tmp_path / "sac_pendulum.md").read_text()
    assert "eval mean return" in md and res["commit"][:10] in md
