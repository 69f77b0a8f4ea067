"""examples.ppo_domain_randomization in --quick mode: the result files' structure, that
training ran (with randomized physics in the randomized run only), and that the evaluation
gives every held-out episode its own params (checked against CartPole stepped by hand)."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np

import jaxsampler as js
from examples import ppo_domain_randomization as ex
from jaxsampler.envs.cartpole import CartPoleState


def test_quick_run_writes_results_with_both_variants(tmp_path):
    assert ex.main(["--quick", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "ppo_domain_randomization.json").read_text())
    assert res["quick"] is True and res["seeds"] == 2
    lengths, masses = res["eval_lengths_m"], res["eval_masscarts_kg"]
    per_cell = res["eval_episodes_per_cell"]
    assert res["eval_episodes_per_policy"] == len(lengths) * len(masses) * per_cell
    assert set(res["variants"]) == set(ex.VARIANTS) == {"randomized", "randomized_wide", "default"}
    cfg = res["config"]
    n_updates = max(1, cfg["total_timesteps"] // (cfg["num_envs"] * cfg["rollout_length"]))
    for name, v in res["variants"].items():
        assert v["domain_randomization"] is (ex.VARIANTS[name] is not None)
        assert v["train_wall_s"] > 0 and v["env_steps_per_s"] > 0
        assert len(v["per_seed"]) == 2
        for s in v["per_seed"]:
            assert len(s["learning_curve"]) == n_updates
            # CartPole pays 1 per step: completed episodes return at least a few steps.
            assert s["final_train_return"] >= 1
            grid = np.asarray(s["eval_return_grid"])
            assert grid.shape == (len(lengths), len(masses))
            assert np.all((grid >= 1) & (grid <= 500))
        assert np.asarray(v["eval_return_grid_mean_over_seeds"]).shape == grid.shape
        ranges = ex.VARIANTS[name]
        if ranges is None:
            assert "train_length_mean" not in v["per_seed"][0]
            continue
        # The randomized runs trained on their ranges (means of the recorded params).
        assert v["train_length_range_m"] == list(ranges.length)
        for s in v["per_seed"]:
            assert ranges.length[0] < s["train_length_mean"] < ranges.length[1]
            assert ranges.masscart[0] < s["train_masscart_mean"] < ranges.masscart[1]
            assert s["train_length_mean"] != 0.5
    md = (tmp_path / "ppo_domain_randomization.md").read_text()
    for name in ex.VARIANTS:
        assert f"| {name} |" in md and "policy, mean over seeds" in md
    png = (tmp_path / "ppo_domain_randomization.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def hand_length(env, length: float, masscart: float) -> int:
    """Steps until CartPole terminates under a constant push left (action 0), from the
    upright rest state, stepped by hand with ``env.step_env``."""
    p = dataclasses.replace(env.default_params, length=length, masscart=masscart)
    step = jax.jit(lambda s: env.step_env(None, s, jnp.int32(0), p))
    s = CartPoleState(*(jnp.zeros(()),) * 4, jnp.zeros((), jnp.int32))
    for t in range(1, 501):
        _, s, _, terminated, _ = step(s)
        if terminated:
            return t
    return 500


def test_evaluation_gives_each_episode_its_own_params():
    """A zero-weight policy's greedy action is always 0 (argmax of equal logits), so each
    held-out episode's length follows from its pole and cart: compare with CartPole
    stepped by hand (the random initial state moves it by a few steps)."""
    env = js.make("CartPole-v1")
    policy = ex.make_policy(ex.PPOConfig(), env)
    params = jax.tree.map(jnp.zeros_like, policy.init(jax.random.PRNGKey(0)))
    cells = [(0.1, 0.5), (0.1, 3.0), (0.5, 0.5), (0.5, 3.0), (2.0, 0.5), (2.0, 3.0)]
    grid = ex.eval_grid((0.1, 0.5, 2.0), (0.5, 3.0), 1)  # length-major, as ``cells``
    np.testing.assert_allclose(grid.length, [c[0] for c in cells])
    np.testing.assert_allclose(grid.masscart, [c[1] for c in cells])
    returns, lengths = ex.evaluate_episodes(env, policy, params, grid, 6, jax.random.PRNGKey(1))
    assert returns.shape == lengths.shape == (6,)
    np.testing.assert_array_equal(returns, lengths)  # reward 1 per step
    want = np.array([hand_length(env, *c) for c in cells])
    assert len(set(want.tolist())) >= 4  # the cells differ: the check sees the params
    assert np.all(np.abs(lengths - want) <= np.maximum(2, 0.3 * want)), (lengths, want)


def test_sample_params_draw_in_their_ranges():
    base = js.make("CartPole-v1").default_params
    keys = jax.random.split(jax.random.PRNGKey(0), 4000)
    for name, ranges in ex.VARIANTS.items():
        if ranges is None:
            continue
        drawn = jax.vmap(ex.make_sample_params(ranges), in_axes=(0, None))(keys, base)
        for field, (lo, hi) in (("length", ranges.length), ("masscart", ranges.masscart)):
            x = np.asarray(getattr(drawn, field))
            assert np.all((x >= lo * (1 - 1e-6)) & (x <= hi * (1 + 1e-6))), (name, field)
            # Median: geometric mean of the bounds (log-uniform) or arithmetic (uniform).
            mid = np.sqrt(lo * hi) if ranges.log else (lo + hi) / 2
            assert abs(np.median(x) - mid) < 0.05 * mid, (name, field, np.median(x), mid)
        np.testing.assert_array_equal(drawn.gravity, np.float32(base.gravity))  # rest: the base
