"""benchmarks/offpolicy_baselines.py (the off-policy examples written by hand) against
jaxsampler: its n-step targets against ``jaxsampler.offpolicy.n_step_targets`` on the same
trajectory, its same-step auto-reset against CartPole's end conditions, its buffer items
against the example's learner; benchmarks/offpolicy_hand.py's record and result file; the
plots drawn from the committed result files."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import harness, offpolicy_hand, plot_offpolicy
from benchmarks import offpolicy_baselines as hand
from examples import dqn, sac
from jaxsampler import offpolicy

E, T, N, GAMMA = 3, 16, 3, 0.9
RESULTS = harness.RESULTS_DIR


def _tiny_dqn() -> dqn.DQNConfig:
    """The example's quick sizes, CartPole at a 12-step limit in the tests that collect."""
    return dqn.DQNConfig(**{**dqn.QUICK, "num_envs": E, "rollout_length": T})


@pytest.fixture(scope="module")
def collected():
    """One hand-collected iteration of random actions (epsilon 1) on CartPole cut at 12
    steps, so that both terminations and truncations occur, and the envs before it."""
    cfg = _tiny_dqn()
    parts = dqn.make_parts(cfg)
    env = parts.env
    params = env.default_params.replace(max_steps_in_episode=12)
    online = parts.policy.init(jax.random.PRNGKey(0))["q"]

    def act(p, obs, key):
        return jax.random.randint(key, obs.shape[:2], 0, 2).astype(env.action_space.dtype)

    run = jax.jit(hand.hand_rollout(env, params, E, T * 4, act))
    envs = hand.reset_envs(env, params, E, jax.random.PRNGKey(1))
    _, steps = run((online, jnp.float32(1.0)), envs)
    return jax.tree.map(np.asarray, steps)


def test_collection_has_terminations_and_truncations(collected):
    assert collected.terminated.any() and collected.truncated.any()


def test_auto_reset_keeps_the_real_final_observation(collected):
    """Where an episode goes on, next_obs is the next step's obs; where it ends, next_obs is
    the pre-reset observation (out of CartPole's bounds after a termination), and the next
    obs is a fresh reset (every component within CartPole's reset range of 0.05)."""
    s = collected
    done = (s.terminated | s.truncated)[:-1]
    np.testing.assert_array_equal(s.next_obs[:-1][~done], s.obs[1:][~done])
    fell = (np.abs(s.next_obs[..., 0]) > 2.4) | (np.abs(s.next_obs[..., 2]) > 0.2095)
    np.testing.assert_array_equal(fell, s.terminated)
    assert (np.abs(s.obs[1:][done]) <= 0.05).all()
    assert not (s.next_obs[:-1][done] == s.obs[1:][done]).all(-1).any()


@pytest.mark.parametrize("n", [1, 2, N, 5])
def test_n_step_targets_equal_jaxsampler_n_step_targets(collected, n):
    """The hand-written targets against jaxsampler's on the same trajectory (no reset steps,
    every step acting, the cut at the end): equal sums and discounts, and the bootstrap
    observation the one after jaxsampler's bootstrap slot."""
    s = collected
    total, discount, boot = jax.jit(hand.n_step, static_argnums=(4, 5))(
        s.reward, s.terminated, s.truncated, s.next_obs, n, GAMMA
    )
    flags = lambda x: jnp.asarray(x)[..., None]
    ref = offpolicy.n_step_targets(
        flags(s.reward), flags(s.terminated), flags(s.truncated), flags(np.ones_like(s.reward,
        bool)), jnp.zeros(s.reward.shape, bool), n, GAMMA,
    )  # fmt: skip
    np.testing.assert_allclose(total, ref.reward_sum[..., 0], rtol=1e-6)
    np.testing.assert_allclose(discount, ref.discount[..., 0], rtol=1e-6)
    slot = np.asarray(ref.bootstrap_index[..., 0]) - 1  # obs slot t + 1 is next_obs[t]
    expected = np.take_along_axis(s.next_obs, slot[..., None], axis=0)
    np.testing.assert_array_equal(np.asarray(boot), expected)
    # both ends exercised: terminations (no bootstrap) and full n-step windows
    assert (np.asarray(discount) == 0).any() and np.isclose(discount, GAMMA**n).any()


def test_dqn_items_fit_the_examples_buffer_and_learner(collected):
    """The hand items go into the example's buffer (same structure, shapes, dtypes) and the
    example's Double-DQN targets read them: a sampled item's target is its n-step reward
    plus discount times the target network's value of its bootstrap observation."""
    cfg = dataclasses.replace(_tiny_dqn(), rollout_length=T * 4)
    parts = dqn.make_parts(cfg)
    items = hand.dqn_items(jax.tree.map(jnp.asarray, collected), N, GAMMA)
    buf = parts.replay.init()
    offpolicy.check_batch(items, buf, rows_must_match=False)
    buf = jax.jit(parts.replay.buffer.add)(buf, items)
    batch = parts.replay.sample(buf, jax.random.PRNGKey(2))
    online = parts.policy.init(jax.random.PRNGKey(3))["q"]
    y = dqn.td_targets(parts.policy, online, online, batch)
    q = parts.policy.q_values(online, batch.extras["n_step_obs"]).max(-1)
    expected = batch.extras["n_step_reward"] + batch.extras["n_step_discount"] * q
    np.testing.assert_allclose(np.asarray(y), np.asarray(expected), rtol=1e-5, atol=1e-6)
    assert bool(batch.valid.all())


@pytest.mark.parametrize("name", ["dqn", "sac"])
def test_hand_training_runs_with_the_examples_parts(name):
    """A tiny hand-written training run: the example's learner steps (loss reported after
    ``learning_starts``), returns of finished episodes counted, the greedy params fit the
    example's policy."""
    mod, make = {"dqn": (dqn, hand.make_hand_dqn), "sac": (sac, hand.make_hand_sac)}[name]
    cfg = (dqn.DQNConfig if name == "dqn" else sac.SACConfig)(**{**mod.QUICK, "log_every": 0})
    parts = mod.make_parts(cfg)
    ht = make(cfg, parts)
    state, metrics = jax.jit(ht.train)(jax.random.PRNGKey(0))
    loss, episodes = np.asarray(metrics["loss"]), np.asarray(metrics["episodes"])
    assert loss.shape == (cfg.num_iterations,)
    before = (np.arange(1, cfg.num_iterations + 1) * cfg.steps_per_iteration) < cfg.learning_starts
    assert (loss[before] == 0).all() and (loss[~before] != 0).all()
    assert episodes.sum() > 0 and np.isfinite(np.asarray(metrics["return_sum"])).all()
    obs = jnp.zeros((1,) + parts.env.observation_space.shape)
    action = parts.policy(ht.greedy(state), obs, jax.random.PRNGKey(0), None)[0]
    assert action.shape == (1,) + parts.env.action_space.shape


def _check_record(rec: dict, algos: list[str], seeds: int) -> None:
    """The offpolicy_hand record's schema, and its summary figures recomputed from its runs."""
    at = rec["measured_at"]
    assert {"commit", "date", "machine", "load"} <= set(at)
    assert set(rec["algos"]) == set(algos)
    for a in rec["algos"].values():
        assert len(a["seeds"]) == seeds and set(a["compile_s"]) == set(offpolicy_hand.VARIANTS)
        by = {(r["variant"], r["seed"]): r for r in a["runs"]}
        assert len(by) == len(a["runs"]) == 2 * seeds
        ratios = [by["jaxsampler", s]["wall_s"] / by["hand", s]["wall_s"] for s in a["seeds"]]
        np.testing.assert_allclose(a["ratio_per_seed"], ratios)
        assert a["ratio_median"] == pytest.approx(float(np.median(ratios)))
        orders = [[by[v, s]["order"] for v in offpolicy_hand.VARIANTS] for s in a["seeds"]]
        assert orders[:2] == [[0, 1], [1, 0]]  # alternating
        c = a["collection"]
        assert set(c["s_per_iteration"]) == set(offpolicy_hand.VARIANTS) and c["ratio"] > 0
        for r in a["runs"]:
            assert len(r["eval_returns"]) == a["config"]["eval_episodes"]
            assert r["eval_mean_return"] == pytest.approx(np.mean(r["eval_returns"]))


def test_committed_result_file_has_the_schema():
    rec = json.loads((RESULTS / "offpolicy_hand.json").read_text())
    _check_record(rec, ["dqn", "sac"], 3)
    assert rec["algos"]["dqn"]["env_steps_per_run"] == dqn.DQNConfig().total_timesteps
    assert (RESULTS / "offpolicy_hand.md").read_text().count("| median |") == 2


def test_summarize_on_known_runs():
    algo = offpolicy_hand.algos(quick=True)["dqn"]
    runs = [
        {"variant": v, "seed": s, "order": o, "wall_s": w, "eval_mean_return": m,
         "eval_returns": [m, m], "train_return_curve": []}
        for v, s, o, w, m in [("jaxsampler", 0, 0, 2.0, 500.0), ("hand", 0, 1, 1.0, 480.0),
                              ("hand", 1, 0, 4.0, 400.0), ("jaxsampler", 1, 1, 3.0, 476.0),
                              ("jaxsampler", 2, 0, 5.0, 10.0), ("hand", 2, 1, 5.0, 475.0)]
    ]  # fmt: skip
    got = offpolicy_hand.summarize(algo, [0, 1, 2], runs, {"jaxsampler": 1.0, "hand": 2.0})
    assert got["ratio_per_seed"] == [2.0, 0.75, 1.0] and got["ratio_median"] == 1.0
    assert got["wall_s_median"] == {"jaxsampler": 3.0, "hand": 4.0}
    assert got["reached_target"] == {"jaxsampler": 2, "hand": 2}


def test_plots_draw_from_the_committed_result_files(tmp_path: Path):
    paths = plot_offpolicy.plot_all(RESULTS, tmp_path)
    assert [p.name for p in paths] == ["dqn_cartpole.png", "sac_pendulum.png", "impala_host.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000
