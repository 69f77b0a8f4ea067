"""Pooled auto-reset (``make_rollout(..., reset_pool=...)``): the default mode's streams are
untouched, every fresh start is an entry of the pool computed independently here, the
starts follow the env's reset distribution, the auto-reset contract holds, and it works on a
mesh, under jit without retracing, and behind the Sampler."""

from __future__ import annotations

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import jaxsampler as js
from jaxsampler import vector
from jaxsampler.policies import RandomPolicy
from jaxsampler.transforms.params import DomainRandomization
from jaxsampler.vector import ResetPool
from tests.fakes import FakeEnv, check_fake_trajectory

CARTPOLE = js.make("CartPole-v1")
RANDOM = RandomPolicy(CARTPOLE.observation_space, CARTPOLE.action_space)


def run(env, policy, E, T, key, **kwargs):
    rollout = js.make_rollout(env, policy, E, T, **kwargs)
    state = rollout.init(key)
    return state, jax.device_get(jax.jit(rollout)((), state))


def reference_default(env, policy, E, T, state):
    """The default mode written out step by step: four streams split from the carried key,
    one reset and one step key per env, both computed, the reset selected."""
    key, obs, env_state, needs = state.key, state.obs, state.env_state, state.needs_reset
    actions, resets, observations = [], [], [obs]
    for _ in range(T):
        key, k_pol, k_step, k_reset = jax.random.split(key, 4)
        action, _, _ = policy((), obs, k_pol, ())
        s_state, s_ts = jax.vmap(env.step)(jax.random.split(k_step, E), env_state, action)
        r_state, r_ts = jax.vmap(env.reset)(jax.random.split(k_reset, E))
        env_state = vector.select_envs(needs, r_state, s_state)
        ts = vector.select_envs(needs, r_ts, s_ts)
        actions.append(action)
        resets.append(needs)
        obs = ts.obs
        observations.append(obs)
        needs = jnp.all(ts.terminated | ts.truncated, axis=-1)
    return np.stack(actions), np.stack(resets), np.stack(observations)


def test_default_mode_keeps_its_streams():
    E, T = 4, 40
    state, (_, traj) = run(CARTPOLE, RANDOM, E, T, jax.random.PRNGKey(3), reset_pool=None)
    actions, resets, obs = reference_default(CARTPOLE, RANDOM, E, T, state)
    assert resets.sum() >= 2, "the test needs resets"
    np.testing.assert_array_equal(traj.actions, actions)
    np.testing.assert_array_equal(traj.is_reset, resets)
    # The fresh starts are raw random draws: equal bit for bit.
    t, e = np.nonzero(resets)
    np.testing.assert_array_equal(traj.obs[t + 1, e], obs[t + 1, e])
    np.testing.assert_allclose(traj.obs, obs, atol=1e-5)


def pool_entries(env, state, pool: ResetPool, T):
    """The pool of one call, computed here: reset keys split from the fifth sibling of the
    call's first step's four streams."""
    k_pool = jax.random.split(state.key, 5)[4]
    keys = jax.random.split(k_pool, pool.num_blocks(T) * pool.size)
    _, ts = jax.vmap(env.reset)(keys)
    return np.asarray(ts.obs).reshape(pool.num_blocks(T), pool.size, *ts.obs.shape[1:])


def test_every_fresh_start_is_an_entry_of_its_block():
    E, T, pool = 8, 48, ResetPool(5, refresh_every=16)
    state, (_, traj) = run(CARTPOLE, RANDOM, E, T, jax.random.PRNGKey(0), reset_pool=pool)
    entries = pool_entries(CARTPOLE, state, pool, T)
    t_idx, e_idx = np.nonzero(traj.is_reset)
    assert len(t_idx) > 8, "the test needs resets"
    used = set()
    for t, e in zip(t_idx, e_idx, strict=True):
        block = t // 16
        match = np.nonzero((entries[block] == traj.obs[t + 1, e]).all(axis=(-2, -1)))[0]
        assert len(match) == 1, f"step {t} env {e}: the fresh start is no entry of block {block}"
        used.add((block, int(match[0])))
    assert len(used) > 3, "envs draw different entries"
    # Nothing else changes: the policy stream is the default mode's (RandomPolicy ignores
    # the observations), and every env's first episode is the same up to its first reset.
    _, (_, exact) = run(CARTPOLE, RANDOM, E, T, jax.random.PRNGKey(0))
    np.testing.assert_array_equal(traj.actions, exact.actions)
    first = np.argmax(np.asarray(exact.is_reset), axis=0)
    for e in range(E):
        np.testing.assert_array_equal(traj.obs[: first[e] + 1, e], exact.obs[: first[e] + 1, e])


def fresh_starts(traj):
    t, e = np.nonzero(traj.is_reset)
    return traj.obs[t + 1, e, 0]


def test_fresh_starts_follow_the_reset_distribution():
    # P much larger than the starts one block serves: duplicates are rare and the starts
    # tend to independent draws from the reset distribution.
    E, T = 64, 256
    _, (_, traj) = run(
        CARTPOLE, RANDOM, E, T, jax.random.PRNGKey(1), reset_pool=ResetPool(4096, 32)
    )
    starts = fresh_starts(traj)
    assert len(starts) > 400
    _, direct = jax.vmap(CARTPOLE.reset)(jax.random.split(jax.random.PRNGKey(2), 4000))
    direct_obs = np.asarray(direct.obs[:, 0])
    for d in range(4):
        assert stats.ks_2samp(starts[:, d], direct_obs[:, d]).pvalue > 1e-3, d
    # Control: the test sees the correlation of a tiny pool (two entries per call).
    _, (_, tiny) = run(CARTPOLE, RANDOM, E, T, jax.random.PRNGKey(1), reset_pool=2)
    low = [stats.ks_2samp(fresh_starts(tiny)[:, d], direct_obs[:, d]).pvalue for d in range(4)]
    assert max(low) < 1e-6
    assert len(np.unique(fresh_starts(tiny)[:, 0])) == 2


def test_procmaze_start_distribution():
    # Where the agent starts (16 cells) and how far its goal is: pooled vs direct resets.
    env = js.make("ProcMaze-v0", size=4)
    policy = RandomPolicy(env.observation_space, env.action_space)
    params = env.default_params.replace(max_steps_in_episode=8)
    rollout = js.make_rollout(env, policy, 32, 64, reset_pool=ResetPool(1024, 16))
    state = rollout.init(jax.random.PRNGKey(0), params)
    _, traj = jax.device_get(jax.jit(rollout)((), state))
    starts = fresh_starts(traj)
    _, direct = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(jax.random.PRNGKey(9), 2000), params
    )
    direct_obs = np.asarray(direct.obs[:, 0])

    def cell(obs):
        r, c = np.rint(obs[:, 0] * 8).astype(int) // 2, np.rint(obs[:, 1] * 8).astype(int) // 2
        return r * 4 + c

    got = np.bincount(cell(starts), minlength=16)
    want = np.bincount(cell(direct_obs), minlength=16) / len(direct_obs) * len(starts)
    assert len(starts) > 150
    assert stats.chisquare(got, want).pvalue > 1e-3
    far = np.abs(starts[:, :2] - starts[:, 2:4]).sum(-1)
    far_direct = np.abs(direct_obs[:, :2] - direct_obs[:, 2:4]).sum(-1)
    assert stats.ks_2samp(far, far_direct).pvalue > 1e-3


def test_auto_reset_contract_holds():
    # The closed-form FakeEnv check: reset steps, counters, real final observations.
    env = FakeEnv()
    policy = RandomPolicy(env.observation_space, env.action_space)
    rollout = js.make_rollout(env, policy, 6, 30, reset_pool=ResetPool(256, 10))
    state = rollout.init(jax.random.PRNGKey(0))
    state1, traj = jax.jit(rollout)((), state)
    seen = check_fake_trajectory(jax.device_get(traj))
    assert seen["resets"] > 10 and seen["terminated"] > 0 and seen["truncated"] > 0
    np.testing.assert_array_equal(
        state1.episode_count, np.asarray(traj.is_reset).sum(0) + np.asarray(state.episode_count)
    )
    # And across calls (the episode continues; the next call draws a new pool).
    _, traj2 = jax.jit(rollout)((), state1)
    check_fake_trajectory(jax.device_get(traj2))


def test_jitted_rollout_does_not_retrace():
    rollout = js.make_rollout(CARTPOLE, RANDOM, 4, 16, reset_pool=8)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def call(state):
        return rollout((), state)

    state = rollout.init(jax.random.PRNGKey(0))
    for _ in range(3):
        state, _ = call(state)
    call(rollout.init(jax.random.PRNGKey(1)))  # a fresh state of the same shapes
    chex.clear_trace_counter()


def test_on_a_mesh_the_pool_is_replicated_and_results_match():
    E, T, pool = 8, 32, ResetPool(16, 8)
    sharded = js.make_rollout(CARTPOLE, RANDOM, E, T, reset_pool=pool, mesh=2)
    state = sharded.init(jax.random.PRNGKey(0))
    fn = jax.jit(sharded)
    _, traj = fn((), state)
    _, (_, single) = run(CARTPOLE, RANDOM, E, T, jax.random.PRNGKey(0), reset_pool=pool)
    assert traj.obs.sharding.spec[1] == "env"
    np.testing.assert_array_equal(np.asarray(traj.actions), single.actions)
    np.testing.assert_array_equal(np.asarray(traj.is_reset), single.is_reset)
    np.testing.assert_allclose(np.asarray(traj.obs), single.obs, atol=1e-4)
    # The gather reads each device's own copy of the pool: the pooled rollout adds no
    # collective to the default one's.
    default = jax.jit(js.make_rollout(CARTPOLE, RANDOM, E, T, mesh=2))
    compiled = (("pool", fn), ("exact", default))
    hlo = {name: f.lower((), state).compile().as_text() for name, f in compiled}
    for op in ("all-gather", "all-to-all", "collective-permute", "all-reduce"):
        assert hlo["pool"].count(op) <= hlo["exact"].count(op), op


def test_sampler_episodes_start_from_the_pool(monkeypatch):
    # The Sampler runs whatever make_rollout builds: with a pool, its episodes are the
    # pooled rollout's (pass-through stand-in until the Sampler takes reset_pool=).
    from jaxsampler.sampling.device import sampler as device

    pool = ResetPool(64)
    monkeypatch.setattr(device, "make_rollout", functools.partial(js.make_rollout, reset_pool=pool))
    sampler = js.Sampler(CARTPOLE, RANDOM, num_envs=4, rollout_length=64, seed=0)
    episodes = sampler.sample(())
    done = [ep for ep in episodes if ep.is_done]
    assert len(done) >= 4
    lengths = [len(ep) for ep in done]
    assert all(ep.observations[0].shape == (4,) for ep in done)
    assert all(np.abs(ep.observations[0]).max() <= 0.05 for ep in episodes)
    assert min(lengths) >= 1
    sampler.close()


def test_bad_input():
    with pytest.raises(ValueError, match="size must be an int >= 1"):
        ResetPool(0)
    with pytest.raises(ValueError, match="refresh_every must be an int >= 1"):
        ResetPool(4, refresh_every=0)
    with pytest.raises(TypeError, match="reset_pool= takes None"):
        js.make_rollout(CARTPOLE, RANDOM, 4, 8, reset_pool="big")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="reset_pool= takes None"):
        js.make_rollout(CARTPOLE, RANDOM, 4, 8, reset_pool=True)  # type: ignore[arg-type]

    def sample(key, base):
        return dataclasses.replace(base, length=jax.random.uniform(key, (), minval=0.4))

    with pytest.raises(ValueError, match="domain randomization.*DomainRandomization"):
        js.make_rollout(
            CARTPOLE, RANDOM, 4, 8, reset_pool=4, transforms=(DomainRandomization(sample),)
        )
    rollout = js.make_rollout(CARTPOLE, RANDOM, 4, 8, reset_pool=4)
    per_env = dataclasses.replace(CARTPOLE.default_params, length=jnp.linspace(0.4, 0.6, 4))
    state = rollout.init(jax.random.PRNGKey(0), per_env)
    with pytest.raises(ValueError, match=r"env_params\.length is per env"):
        rollout((), state)
