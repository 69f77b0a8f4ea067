"""n-step targets and V-trace vs a plain-Python reference (truncation, termination, cuts,
acting masks, agents done before their episode ends), vs rlax where rlax's own rules
apply (all acting, no truncation), and vs compute_gae's returns where they must agree."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax

import jaxsampler as js
from jaxsampler.offpolicy import (
    compute_n_step_returns,
    compute_vtrace,
    n_step_returns,
    n_step_targets,
    vtrace,
)
from jaxsampler.postprocessing import discounted_returns, gae
from tests.offpolicy import reference
from tests.test_postprocessing import make_fixture

TOL = {"rtol": 2e-5, "atol": 2e-5}


def early_done_fixture(seed: int, T: int = 16, E: int = 3):
    """Two agents; in some episodes agent 0 terminates (or is truncated) early and waits,
    flags sticky and not acting, while agent 1 plays on; rewards keep arriving for agent
    0 after its flag (they belong to no agent step). Same tuple as make_fixture."""
    rng = np.random.default_rng(seed)
    A = 2
    rewards = rng.normal(size=(T, E, A)).astype(np.float32)
    values = rng.normal(size=(T, E, A)).astype(np.float32)
    last_value = rng.normal(size=(E, A)).astype(np.float32)
    term, trunc = np.zeros((T, E, A), bool), np.zeros((T, E, A), bool)
    acting, is_reset = np.zeros((T, E, A), bool), np.zeros((T, E), bool)
    for e in range(E):
        t = 0
        while t < T:
            length = int(rng.integers(2, 7))
            early = int(rng.integers(0, length - 1)) if rng.random() < 0.7 else None
            early_flag = term if rng.random() < 0.5 else trunc
            for k in range(length):
                if t + k >= T:
                    break
                waiting = early is not None and k > early
                acting[t + k, e, 0] = not waiting and rng.random() < 0.7
                acting[t + k, e, 1] = True
                if early is not None and k >= early:
                    early_flag[t + k, e, 0] = True
            end = t + length - 1
            if end < T:
                (term if rng.random() < 0.5 else trunc)[end, e, 1] = True
                if early is None:
                    term[end, e, 0] = True
                if end + 1 < T:
                    is_reset[end + 1, e] = True
            t = end + 2
    return rewards, values, term, trunc, acting, is_reset, last_value


FIXTURES = {"gae_fixture": make_fixture, "early_done": early_done_fixture}


def _assert_has_every_boundary(fx):
    rewards, values, term, trunc, acting, is_reset, last_value = fx
    assert term.any() and trunc.any() and is_reset.any() and not acting[~is_reset].all()


@pytest.mark.parametrize("kind", sorted(FIXTURES))
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("n, gamma", [(1, 0.9), (3, 0.97), (5, 1.0)])
def test_n_step_matches_reference(kind, seed, n, gamma):
    fx = FIXTURES[kind](seed)
    _assert_has_every_boundary(fx)
    rewards, values, term, trunc, acting, is_reset, last_value = fx
    rsum, disc, index, ret = reference.n_step(
        *fx[:0], rewards, values, term, trunc, acting, is_reset, last_value, n, gamma
    )
    t = n_step_targets(rewards, term, trunc, acting, is_reset, n, gamma)
    np.testing.assert_allclose(t.reward_sum, rsum, **TOL)
    np.testing.assert_allclose(t.discount, disc, **TOL)
    np.testing.assert_array_equal(np.where(acting, t.bootstrap_index, 0), index)
    out = jax.jit(n_step_returns, static_argnames="n")(*fx, n=n, gamma=gamma)
    np.testing.assert_allclose(out, ret, **TOL)


def test_early_done_agent_ends_one_slot_after_its_flag():
    # The fixture's point: some agent-0 step ends before the next reset step or acting step.
    rewards, values, term, trunc, acting, is_reset, last_value = early_done_fixture(0)
    t = n_step_targets(rewards, term, trunc, acting, is_reset, 1, 0.9)
    idx = np.asarray(t.bootstrap_index)[..., 0]
    T = rewards.shape[0]
    early = [
        (s, e)
        for s, e in zip(*np.nonzero(acting[..., 0]), strict=True)
        if idx[s, e] < T and not is_reset[idx[s, e], e] and not acting[idx[s, e], e, 0]
    ]
    assert early


@pytest.mark.parametrize("seed", range(3))
def test_n_step_with_n_past_the_rollout_is_compute_gaes_discounted_return(seed):
    fx = make_fixture(seed)  # every agent's flags end at its episode's last step
    full = n_step_returns(*fx, n=fx[0].shape[0], gamma=0.95)
    np.testing.assert_allclose(full, discounted_returns(*fx, gamma=0.95), **TOL)


def plain_fixture(seed: int, T: int = 16, E: int = 3):
    """Single agent, acting at every step but the reset steps, episodes ending only by
    termination (and the cut): the cases rlax's sequence functions cover."""
    rng = np.random.default_rng(seed)
    fx = list(make_fixture(seed, T, E, 1))
    rewards, values, term, trunc, acting, is_reset, last_value = fx
    term = term | trunc
    trunc = np.zeros_like(trunc)
    acting = np.broadcast_to(~is_reset[..., None], acting.shape).copy()
    blogp = rng.normal(size=rewards.shape).astype(np.float32) - 1
    tlogp = blogp + rng.normal(scale=0.7, size=rewards.shape).astype(np.float32)
    return (rewards, values, term, trunc, acting, is_reset, last_value), blogp, tlogp


def _next_values(values, last_value):
    return np.concatenate([values[1:], last_value[None]], axis=0)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("n", [1, 2, 4])
def test_n_step_matches_rlax_where_both_apply(seed, n):
    fx, _, _ = plain_fixture(seed)
    rewards, values, term, trunc, acting, is_reset, last_value = fx
    gamma = 0.9
    ours = np.asarray(n_step_returns(*fx, n=n, gamma=gamma))
    v_t = _next_values(values, last_value)
    for e in range(rewards.shape[1]):
        theirs = rlax.n_step_bootstrapped_returns(
            rewards[:, e, 0], gamma * (1.0 - term[:, e, 0]), v_t[:, e, 0], n
        )
        live = acting[:, e, 0]
        np.testing.assert_allclose(ours[live, e, 0], np.asarray(theirs)[live], **TOL)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("lam, clip_rho, clip_pg", [(1.0, 1.0, 1.0), (0.9, 2.0, 0.5)])
def test_vtrace_matches_rlax_where_both_apply(seed, lam, clip_rho, clip_pg):
    fx, blogp, tlogp = plain_fixture(seed)
    rewards, values, term, trunc, acting, is_reset, last_value = fx
    gamma = 0.95
    out = vtrace(
        blogp,
        tlogp,
        *fx,
        gamma=gamma,
        lam=lam,
        clip_rho_threshold=clip_rho,
        clip_pg_rho_threshold=clip_pg,
    )
    v_t = _next_values(values, last_value)
    for e in range(rewards.shape[1]):
        theirs = rlax.vtrace_td_error_and_advantage(
            values[:, e, 0],
            v_t[:, e, 0],
            rewards[:, e, 0],
            (gamma * (1.0 - term[:, e, 0])).astype(np.float32),
            np.exp(tlogp[:, e, 0] - blogp[:, e, 0]),
            lam,
            clip_rho,
            clip_pg,
        )
        live = acting[:, e, 0]
        vs = np.asarray(theirs.errors) + values[:, e, 0]
        np.testing.assert_allclose(np.asarray(out.vs)[live, e, 0], vs[live], **TOL)
        np.testing.assert_allclose(
            np.asarray(out.pg_advantages)[live, e, 0],
            np.asarray(theirs.pg_advantage)[live],
            **TOL,
        )


@pytest.mark.parametrize("kind", sorted(FIXTURES))
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("lam, clip_rho, clip_pg", [(1.0, 1.0, 1.0), (0.8, 1.5, 0.7)])
def test_vtrace_matches_reference(kind, seed, lam, clip_rho, clip_pg):
    fx = FIXTURES[kind](seed)
    _assert_has_every_boundary(fx)
    rng = np.random.default_rng(100 + seed)
    blogp = rng.normal(size=fx[0].shape).astype(np.float32) - 1
    tlogp = blogp + rng.normal(scale=0.7, size=fx[0].shape).astype(np.float32)
    out = jax.jit(vtrace)(blogp, tlogp, *fx, 0.93, lam, clip_rho, clip_pg)
    vs, pg = reference.vtrace(blogp, tlogp, *fx, 0.93, lam, clip_rho, clip_pg)
    np.testing.assert_allclose(out.vs, vs, **TOL)
    np.testing.assert_allclose(out.pg_advantages, pg, **TOL)
    acting = fx[4]
    assert np.all(np.asarray(out.vs)[~acting] == 0)


@pytest.mark.parametrize("seed", range(3))
def test_on_policy_vtrace_targets_are_compute_gaes_lambda_returns(seed):
    fx = make_fixture(seed)
    logp = np.zeros(fx[0].shape, np.float32)
    out = vtrace(logp, logp, *fx, gamma=0.97, lam=0.9)
    np.testing.assert_allclose(out.vs, gae(*fx, 0.97, 0.9).value_targets, **TOL)


def test_jit_and_no_jit_agree():
    fx = early_done_fixture(5)
    a = n_step_returns(*fx, n=3, gamma=0.9)
    b = jax.jit(n_step_returns, static_argnames="n")(*fx, n=3, gamma=0.9)
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    logp = np.full(fx[0].shape, -0.5, np.float32)
    c = vtrace(logp, logp * 0.5, *fx)
    d = jax.jit(vtrace)(logp, logp * 0.5, *fx)
    np.testing.assert_allclose(c.vs, d.vs, rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def cartpole_rollout():
    env = js.make("CartPole-v1")
    params_env = env.default_params.replace(max_steps_in_episode=12)
    pol = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    params = pol.init(jax.random.PRNGKey(0))
    state = js.init_rollout_state(env, pol, 3, jax.random.PRNGKey(1), env_params=params_env)
    state, traj = jax.jit(js.make_rollout(env, pol, 3, 16))(params, state)
    _, last_value, _ = pol.forward(params, state.obs)
    return traj, last_value


def test_on_a_real_rollout(cartpole_rollout):
    traj, last_value = cartpole_rollout
    np_ = {
        k: np.asarray(getattr(traj, k))
        for k in ("rewards", "terminated", "truncated", "acting", "is_reset")
    }
    assert np_["terminated"].any() and np_["truncated"].any()
    values = np.asarray(traj.extras["vf_preds"])
    args = (
        np_["rewards"],
        values,
        np_["terminated"],
        np_["truncated"],
        np_["acting"],
        np_["is_reset"],
        np.asarray(last_value),
    )
    *_, ret = reference.n_step(*args, 3, 0.99)
    np.testing.assert_allclose(compute_n_step_returns(traj, last_value, 3, 0.99), ret, **TOL)
    blogp = np.asarray(traj.extras["action_logp"])
    tlogp = blogp - 0.3
    out = compute_vtrace(traj, jnp.asarray(tlogp), jnp.asarray(values), last_value, 0.99, 0.95)
    vs, pg = reference.vtrace(blogp, tlogp, *args, 0.99, 0.95, 1.0, 1.0)
    np.testing.assert_allclose(out.vs, vs, **TOL)
    np.testing.assert_allclose(out.pg_advantages, pg, **TOL)


# --- bad input -------------------------------------------------------------------------


def test_wrong_shapes_are_named():
    rewards, values, term, trunc, acting, is_reset, last_value = make_fixture(0)
    with pytest.raises(ValueError, match="truncated has shape"):
        n_step_targets(rewards, term, trunc[:-1], acting, is_reset, 2)
    with pytest.raises(ValueError, match="last_value has shape"):
        n_step_returns(rewards, values, term, trunc, acting, is_reset, last_value[:1], 2)
    with pytest.raises(ValueError, match=r"rewards must have shape \[T, E, A\]"):
        n_step_targets(rewards[..., 0], term, trunc, acting, is_reset, 2)
    with pytest.raises(ValueError, match="target_logp has shape"):
        vtrace(rewards, rewards[:, :1], rewards, values, term, trunc, acting, is_reset, last_value)
    with pytest.raises(ValueError, match="is_reset has shape"):
        vtrace(rewards, rewards, rewards, values, term, trunc, acting, is_reset[:, :1], last_value)


def test_wrong_dtypes_are_named():
    rewards, values, term, trunc, acting, is_reset, last_value = make_fixture(0)
    with pytest.raises(TypeError, match="terminated must have dtype bool, got float32"):
        n_step_targets(rewards, term.astype(np.float32), trunc, acting, is_reset, 2)
    with pytest.raises(TypeError, match="rewards must have a floating dtype, got int32"):
        n_step_targets(rewards.astype(np.int32), term, trunc, acting, is_reset, 2)
    with pytest.raises(TypeError, match="behaviour_logp must have a floating dtype"):
        vtrace(acting, rewards, rewards, values, term, trunc, acting, is_reset, last_value)
    with pytest.raises(TypeError, match="values must be an array, got list"):
        n_step_returns(rewards, values.tolist(), term, trunc, acting, is_reset, last_value, 2)


@pytest.mark.parametrize("n", [0, -1, 2.0, True])
def test_bad_n_is_a_value_error(n):
    rewards, values, term, trunc, acting, is_reset, last_value = make_fixture(0)
    with pytest.raises(ValueError, match="n must be a Python int >= 1"):
        n_step_targets(rewards, term, trunc, acting, is_reset, n)


def test_bad_coefficients_and_missing_extras_are_named(cartpole_rollout):
    rewards, values, term, trunc, acting, is_reset, last_value = make_fixture(0)
    with pytest.raises(ValueError, match="gamma must lie in"):
        n_step_targets(rewards, term, trunc, acting, is_reset, 2, gamma=1.5)
    with pytest.raises(ValueError, match="lam must lie in"):
        vtrace(rewards, rewards, *make_fixture(0), lam=-0.5)
    traj, last = cartpole_rollout
    with pytest.raises(KeyError, match="no 'q'"):
        compute_n_step_returns(traj, last, 2, value_key="q")
    with pytest.raises(KeyError, match="no 'logp'"):
        compute_vtrace(traj, traj.rewards, traj.rewards, last, logp_key="logp")
