"""``examples/ippo_mpe.py``: both collection paths see the same JaxMARL env, GAE is right,
and a quick run of both samplers writes the result schema (learning results:
benchmarks/results/ippo_mpe.md). Needs jaxmarl (the integration tier)."""

from __future__ import annotations

import dataclasses
import json

import jax
import jaxmarl
import numpy as np
import pytest

import jaxsampler as js
from examples import ippo_mpe, ppo

# JaxMARL's MPE ends an episode when its step counter, read before the step increments it,
# reaches max_steps=25: 26 transitions, steps 0..25.
EPISODE = 26
E, T = 3, 32  # the first episode, its reset step and part of the next
GAMMA, LAM = 0.99, 0.95
CFG = dataclasses.replace(
    ippo_mpe.JAXMARL_CONFIG, num_envs=E, rollout_length=T, gamma=GAMMA, gae_lambda=LAM
)


@pytest.fixture(scope="module")
def rollouts():
    """The first rollout of each path on the same key and params: jaxsampler's trajectory
    and batch, the hand-written loop's batch, the key, and each path's value of the
    observation its next rollout starts from (the GAE bootstrap)."""
    env = js.make(CFG.env_id)
    policy = ppo.make_policy(CFG, env)
    params = policy.init(jax.random.PRNGKey(3))
    key = jax.random.PRNGKey(11)
    rollout = js.make_rollout(env, policy, E, T)
    _, traj = jax.jit(rollout)(params, rollout.init(key))
    init_js, run_js = ppo.jaxsampler_sampler(CFG, env, policy)
    _, batch_js = jax.jit(run_js)(params, init_js(key))
    init_h, run_h = ippo_mpe.jaxmarl_sampler(CFG, env, policy)
    carry_h, batch_h = jax.jit(run_h)(params, init_h(key))
    last_obs_h = np.stack([np.asarray(carry_h[0][a]) for a in env.agent_ids], 1)
    last_value = lambda obs: np.asarray(policy.forward(params, obs)[1])
    to_np = lambda tree: jax.tree.map(np.asarray, tree)
    return {
        "traj": to_np(traj),
        "js": to_np(batch_js),
        "hand": to_np(batch_h),
        "key": key,
        "last_value_js": last_value(traj.obs[T]),
        "last_value_hand": last_value(last_obs_h),
    }


def _final_obs_by_hand(actions: np.ndarray, key: jax.Array, env_id: int) -> np.ndarray:
    """Env ``env_id``'s observation after its first episode, stepped in Python with
    JaxMARL's own ``reset`` (the reset key jaxsampler's ``init`` gives it) and ``step_env``
    (no auto-reset), from the recorded actions ``int[26, A]``."""
    menv = jaxmarl.make(ippo_mpe.ENV_ID)
    _, k_reset = jax.random.split(key)
    _, state = menv.reset(jax.random.split(k_reset, E)[env_id])
    for a in actions:
        act = {name: a[i] for i, name in enumerate(menv.agents)}
        obs, state, _, _, _ = menv.step_env(jax.random.PRNGKey(0), state, act)
    return np.stack([np.asarray(obs[name]) for name in menv.agents])


def test_first_episode_is_the_same_in_both_paths(rollouts):
    traj, batch_js, batch_h, key = (rollouts[k] for k in ("traj", "js", "hand", "key"))
    steps = EPISODE
    for name in ("obs", "actions", "rewards", "values", "logp"):
        np.testing.assert_allclose(
            batch_js[name][:steps], batch_h[name][:steps], rtol=1e-5, atol=1e-6, err_msg=name
        )
    assert len(np.unique(batch_js["actions"][:steps])) > 1  # a sampled policy, not constant
    # The episode ends at step 25 for every agent in both paths, and nowhere before.
    assert batch_js["done"][: steps - 1].sum() == 0 and batch_h["done"][: steps - 1].sum() == 0
    assert batch_js["done"][steps - 1].all() and batch_h["done"][steps - 1].all()
    # jaxsampler keeps the real final observation (JaxMARL's step_env stepped by hand);
    # JaxMARL's step returns the next episode's first one in its place.
    for e in range(E):
        final = _final_obs_by_hand(batch_h["actions"][:steps, e], key, e)
        np.testing.assert_allclose(traj.obs[steps, e], final, rtol=1e-5, atol=1e-6)
    # Next-step reset: step 26 is a masked reset step, nobody acts, reward 0, no done.
    assert not traj.acting[steps].any() and traj.is_reset[steps].all()
    assert (batch_js["rewards"][steps] == 0).all() and not batch_js["done"][steps].any()
    # New episodes start at rest (MPE's obs begin with the agent's own velocity).
    np.testing.assert_array_equal(traj.obs[steps + 1, :, :, :2], 0.0)
    np.testing.assert_array_equal(batch_h["obs"][steps, :, :, :2], 0.0)
    assert np.abs(traj.obs[steps, :, :, :2]).max() > 0  # the final obs is not a start
    # One episode ended per env in each path (the reset step counts as none).
    assert batch_js["done"].any(-1).sum() == E and batch_h["done"].any(-1).sum() == E


def _gae_numpy(rewards, values, done, acting, last_value):
    """GAE(gamma, lambda) written out per env and agent, backwards over time: a step where
    the agent does not act (a reset step) is skipped, ``done`` ends the return."""
    adv = np.zeros_like(rewards, np.float64)
    Tn, En, An = rewards.shape
    for e in range(En):
        for a in range(An):
            next_v, next_adv = float(last_value[e, a]), 0.0
            for t in reversed(range(Tn)):
                if not acting[t, e, a]:
                    continue
                keep = 0.0 if done[t, e, a] else 1.0
                delta = rewards[t, e, a] + GAMMA * next_v * keep - values[t, e, a]
                next_adv = delta + GAMMA * LAM * keep * next_adv
                next_v = float(values[t, e, a])
                adv[t, e, a] = next_adv
    return adv


def test_gae_targets_equal_a_numpy_reimplementation(rollouts):
    traj, batch_js, batch_h = rollouts["traj"], rollouts["js"], rollouts["hand"]
    # jaxsampler: bootstrap from the value of obs[T]; compared on the rows that act.
    acting = traj.acting
    assert not acting.all()  # the reset step is in there
    adv = _gae_numpy(
        batch_js["rewards"],
        batch_js["values"],
        batch_js["done"],
        acting,
        rollouts["last_value_js"],
    )
    np.testing.assert_allclose(
        batch_js["targets"][acting], (adv + batch_js["values"])[acting], rtol=1e-4, atol=1e-4
    )
    np.testing.assert_allclose(batch_js["advantages"][acting], adv[acting], rtol=1e-4, atol=1e-4)
    # The hand loop: every row acts; it bootstraps from its auto-reset's observation.
    adv_h = _gae_numpy(
        batch_h["rewards"],
        batch_h["values"],
        batch_h["done"],
        np.ones_like(acting),
        rollouts["last_value_hand"],
    )
    np.testing.assert_allclose(batch_h["targets"], adv_h + batch_h["values"], rtol=1e-4, atol=1e-4)


def test_quick_run_of_both_samplers_writes_the_schema(tmp_path):
    assert ippo_mpe.main(["--compare", "--quick", "--seeds", "2", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "ippo_mpe.json").read_text())
    assert {r["sampler"] for r in res["runs"]} == {"jaxsampler", "hand"}
    assert sorted((r["seed"], r["sampler"]) for r in res["runs"]) == [
        (0, "hand"),
        (0, "jaxsampler"),
        (1, "hand"),
        (1, "jaxsampler"),
    ]
    # interleaved: seed 0 jaxsampler then hand, seed 1 the other way round
    assert [r["sampler"] for r in res["runs"]] == ["jaxsampler", "hand", "hand", "jaxsampler"]
    updates = res["env_steps_per_seed"] // (
        res["config"]["num_envs"] * res["config"]["rollout_length"]
    )
    for r in res["runs"]:
        assert r["wall_s"] > 0 and r["episodes"] > 0
        assert np.isfinite(r["final_return"]) and np.isfinite(r["first_return"])
        assert len(r["curve"]) == updates
    assert set(res["compile_s"]) == {"jaxsampler", "hand"}
    assert res["summary"]["wall_ratio_jaxsampler_over_hand"] > 0
    assert res["jaxmarl_config"]["total_timesteps"] == 10_000_000
    for field in ("commit", "changed", "machine", "versions", "measured_at", "command", "date"):
        assert field in res, field
    md = (tmp_path / "ippo_mpe.md").read_text()
    assert "| 0 | jaxsampler |" in md and "| 1 | hand |" in md
    assert (tmp_path / "ippo_mpe.png").stat().st_size > 0
