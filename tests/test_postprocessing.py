"""GAE / discounted returns vs a plain-NumPy reference on fixtures with every boundary kind."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.postprocessing import compute_gae, discounted_returns, gae


def make_fixture(seed: int, T: int = 16, E: int = 4, A: int = 2):
    """Random buffers obeying the rollout contract: episodes of random length ending in
    termination or truncation (for all agents, or an agent terminated while waiting),
    one reset step after each end, random acting subsets, and a cut at T."""
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(T, E, A)).astype(np.float32)
    values = rng.normal(size=(T, E, A)).astype(np.float32)
    last_value = rng.normal(size=(E, A)).astype(np.float32)
    term = np.zeros((T, E, A), bool)
    trunc = np.zeros((T, E, A), bool)
    acting = np.zeros((T, E, A), bool)
    is_reset = np.zeros((T, E), bool)
    for e in range(E):
        t = 0
        while t < T:
            length = int(rng.integers(1, 6))
            for k in range(length):
                if t + k >= T:
                    break
                act = rng.random(A) < 0.6
                if not act.any():
                    act[rng.integers(A)] = True
                acting[t + k, e] = act
            end = t + length - 1
            if end < T:
                kind = rng.integers(3)
                if kind == 0:
                    term[end, e] = True
                elif kind == 1:
                    trunc[end, e] = True
                else:  # agent 0 terminated, the rest truncated
                    term[end, e, 0] = True
                    trunc[end, e, 1:] = True
                if end + 1 < T:
                    is_reset[end + 1, e] = True
            t = end + 2
    return rewards, values, term, trunc, acting, is_reset, last_value


def reference_gae(rewards, values, term, trunc, acting, is_reset, last_value, gamma, lam):
    """Per agent: build its own transitions (action -> its next observation) by a forward
    walk, then run the textbook GAE recursion backwards over them."""
    T, E, A = rewards.shape
    adv = np.zeros((T, E, A), np.float64)
    for e in range(E):
        for a in range(A):
            transitions = []  # (t0, reward sum, terminated, truncated, next value, ends at cut)
            for t0 in range(T):
                if not acting[t0, e, a]:
                    continue
                t1 = t0 + 1
                while t1 < T and not acting[t1, e, a] and not is_reset[t1, e]:
                    t1 += 1
                r = float(rewards[t0:t1, e, a].sum())
                tm = bool(term[t0:t1, e, a].any())
                tr = bool(trunc[t0:t1, e, a].any())
                nv = float(last_value[e, a]) if t1 == T else float(values[t1, e, a])
                transitions.append((t0, r, tm, tr, nv))
            running = 0.0
            for i in reversed(range(len(transitions))):
                t0, r, tm, tr, nv = transitions[i]
                delta = r + gamma * (0.0 if tm else nv) - float(values[t0, e, a])
                nxt = running if (i + 1 < len(transitions) and not (tm or tr)) else 0.0
                running = delta + gamma * lam * nxt
                adv[t0, e, a] = running
    return adv


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("gamma, lam", [(0.99, 0.95), (0.9, 1.0), (1.0, 0.0)])
def test_gae_matches_numpy_reference(seed, gamma, lam):
    fx = make_fixture(seed)
    rewards, values, term, trunc, acting, is_reset, last_value = fx
    kinds = (term.any(), trunc.any(), is_reset.any())
    assert all(kinds), "fixture must contain terminations, truncations and resets"
    out = jax.jit(gae, static_argnames=())(*fx, gamma, lam)
    ref = reference_gae(*fx, gamma, lam)
    np.testing.assert_allclose(out.advantages, ref, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(
        out.value_targets, np.where(acting, ref + values, 0.0), rtol=2e-5, atol=2e-5
    )
    assert np.all(np.asarray(out.advantages)[~acting] == 0)


def test_jit_and_no_jit_agree():
    fx = make_fixture(7)
    a = gae(*fx, 0.97, 0.9)
    b = jax.jit(gae)(*fx, 0.97, 0.9)
    np.testing.assert_allclose(a.advantages, b.advantages, rtol=1e-6, atol=1e-6)


def test_discounted_returns_single_agent_by_hand():
    # One env, one agent: steps 0-2 terminate (reset at 3), steps 4-5 truncate (reset at 6),
    # steps 7-8 are cut by the end of the rollout.
    T = 9
    r = np.arange(1, T + 1, dtype=np.float32).reshape(T, 1, 1)
    v = np.full((T, 1, 1), 100.0, np.float32)
    v[6] = 7.0  # value of the truncated episode's final observation (reset step 6)
    term = np.zeros((T, 1, 1), bool)
    trunc = np.zeros((T, 1, 1), bool)
    term[2] = True
    trunc[5] = True
    is_reset = np.zeros((T, 1), bool)
    is_reset[[3, 6]] = True
    acting = ~is_reset[..., None]
    last = np.full((1, 1), 3.0, np.float32)
    g = 0.5
    R = np.asarray(discounted_returns(r, v, term, trunc, acting, is_reset, last, g))[:, 0, 0]
    expect = np.zeros(T)
    expect[2] = 3
    expect[1] = 2 + g * 3
    expect[0] = 1 + g * expect[1]
    expect[5] = 6 + g * 7.0  # bootstrap from the final observation, not the next reset obs
    expect[4] = 5 + g * expect[5]
    expect[8] = 9 + g * 3.0  # the cut: bootstrap from last_value
    expect[7] = 8 + g * expect[8]
    np.testing.assert_allclose(R, expect, rtol=1e-6)


def test_compute_gae_on_a_real_rollout():
    env = js.make("CartPole-v1")
    pol = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    params = pol.init(jax.random.PRNGKey(0))
    state = js.init_rollout_state(env, pol, 4, jax.random.PRNGKey(1))
    state, traj = jax.jit(js.make_rollout(env, pol, 4, 64))(params, state)
    _, last_value, _ = pol.forward(params, state.obs)
    out = compute_gae(traj, last_value, 0.99, 0.95)
    ref = reference_gae(
        np.asarray(traj.rewards),
        np.asarray(traj.extras["vf_preds"]),
        np.asarray(traj.terminated),
        np.asarray(traj.truncated),
        np.asarray(traj.acting),
        np.asarray(traj.is_reset),
        np.asarray(last_value),
        0.99,
        0.95,
    )
    assert np.asarray(traj.is_reset).any()
    np.testing.assert_allclose(out.advantages, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "name, kwargs", [("gamma", {"gamma": 1.5}), ("gamma", {"gamma": -0.1}), ("lam", {"lam": 2.0})]
)
def test_bad_coefficients_are_named(name, kwargs):
    fx = make_fixture(0)
    with pytest.raises(ValueError, match=f"{name} must lie in"):
        gae(*fx, **kwargs)


def test_mismatched_shapes_are_named():
    rewards, values, term, trunc, acting, is_reset, last_value = make_fixture(0)
    with pytest.raises(ValueError, match="values has shape"):
        gae(rewards, values[:-1], term, trunc, acting, is_reset, last_value)
    with pytest.raises(ValueError, match="last_value has shape"):
        gae(rewards, values, term, trunc, acting, is_reset, last_value[:, :1])
    with pytest.raises(ValueError, match=r"rewards must have shape \[T, E, A\]"):
        gae(rewards[..., 0], values, term, trunc, acting, is_reset, last_value)
    with pytest.raises(KeyError, match="nope"):
        traj = js.Trajectory(
            rewards, None, rewards, term, trunc, acting, is_reset, {}, None, None, None, None
        )
        compute_gae(traj, last_value, value_key="nope")
