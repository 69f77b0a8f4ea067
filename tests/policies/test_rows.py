"""``where_rows``: a row-wise function on the masked rows only, at a fixed row budget.

Reference: the function on every row, masked with NumPy (``np.where``), in both the common
branch (the mask fits the budget) and the fallback (it does not); the policy's critic on
every row for ``act_on_rows(value_rows=...)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.envs.tictactoe import TicTacToe
from jaxsampler.policies.rows import extra_budget, extra_budgets, rows_pass


def rowwise(x):
    """Elementwise per row (exact whatever the batch): outputs of two shapes, a value."""
    return {"sq": x["a"] * x["a"] + 1.0, "first": x["b"][..., 0] - 2}, x["a"].sum(-1)


def inputs(E=5, A=3, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "a": rng.normal(size=(E, A, 4)).astype(np.float32),
        "b": rng.integers(0, 9, size=(E, A, 2)).astype(np.int32),
    }


@pytest.mark.parametrize("budget", [3, (1, 3), (1, 2, 3)])
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("extra", [0, 1, 2, 3, 6])  # 3 rows at most beyond the acting ones
def test_outputs_on_the_rows_and_values_where_the_mask_holds(k, extra, budget):
    rng = np.random.default_rng(10 * k + extra)
    tree = inputs()
    E, A = 5, 3
    rows = np.stack([rng.permutation(A)[:k] for _ in range(E)])
    on_rows = np.zeros((E, A), bool)
    np.put_along_axis(on_rows, rows, True, axis=1)
    mask = on_rows.copy()
    others = np.argwhere(~on_rows)
    mask[tuple(others[rng.permutation(len(others))[:extra]].T)] = True
    out_all, value_all = rowwise(tree)  # NumPy on every row: the reference
    want_out = {
        n: np.take_along_axis(v, rows.reshape(rows.shape + (1,) * (v.ndim - 2)), 1)
        for n, v in out_all.items()
    }
    want_value = np.where(mask, value_all, 0.0)
    fn = lambda t, r, m: rows_pass(rowwise, t, r, m, budget)
    args = (tree, jnp.asarray(rows, jnp.int32), jnp.asarray(mask))
    # (float rounding: under XLA's default optimization the jitted x * x + 1 is one fused
    # multiply-add, 1 ulp from NumPy's; a wrong row or a dropped value is far off)
    for out, value in (fn(*args), jax.jit(fn)(*args)):
        for name in want_out:
            np.testing.assert_allclose(np.asarray(out[name]), want_out[name], rtol=1e-6)
            assert out[name].dtype == want_out[name].dtype
        np.testing.assert_allclose(np.asarray(value), want_value, rtol=1e-6)
        assert not np.asarray(value)[~mask].any()  # (exactly 0 where no value is read)


def test_outputs_on_the_acting_rows_values_on_those_plus_the_budget_and_a_fallback():
    seen = []

    def spy(x):
        seen.append(x.shape[0])
        return x, x.sum(-1)

    x = jnp.ones((4, 2, 3))
    rows = jnp.zeros((4, 1), jnp.int32)
    mask = jnp.zeros((4, 2), bool).at[:, 0].set(True).at[1, 1].set(True)
    _, value = rows_pass(spy, x, rows, mask, 1)
    # the acting rows (outputs), those and the budget (values), the fallback (traced only)
    assert seen == [4, 4 + 1, 8]
    np.testing.assert_array_equal(np.asarray(value), np.where(np.asarray(mask), 3.0, 0.0))
    seen.clear()
    rows_pass(spy, x, rows, mask, 4)  # every other row fits: no fallback
    assert seen == [4, 8]
    seen.clear()
    rows_pass(spy, x, jnp.array([[0, 1]] * 4, jnp.int32), mask, 0)  # k == A
    assert seen == [4 * 2, 4 * 2]
    seen.clear()
    every = jnp.array([[0, 1]] * 4, jnp.int32)
    rows_pass(spy, x, every, mask, extra_budgets(4, 2, 2))  # k == A through extra_budgets
    assert seen == [4 * 2, 4 * 2]
    seen.clear()
    _, value = rows_pass(spy, x, rows, mask, np.int64(1))  # a numpy int budget
    np.testing.assert_array_equal(np.asarray(value), np.where(np.asarray(mask), 3.0, 0.0))
    seen.clear()
    _, value = rows_pass(spy, x, rows, mask, (2, 1))  # budgets, smallest first
    assert seen == [4, 4 + 1, 4 + 2, 8]  # the actor, each budget's critic, the fallback
    np.testing.assert_array_equal(np.asarray(value), np.where(np.asarray(mask), 3.0, 0.0))


@pytest.mark.parametrize(("needed", "rows_run"), [(0, 9), (1, 9), (2, 10), (3, 12), (5, 16)])
def test_the_critic_runs_on_the_smallest_budget_that_fits(needed, rows_run):
    """Eagerly, ``lax.switch`` runs only its chosen branch: its critic's row count says
    which budget it took (8 acting rows, budgets 1, 2, 4; 5 needed rows fit none)."""
    seen = []

    def spy(x):
        seen.append(x.shape[0])
        return x, x.sum(-1)

    mask = np.zeros((8, 2), bool)
    mask[:, 0] = True
    mask[:needed, 1] = True
    with jax.disable_jit():
        _, value = rows_pass(
            spy, jnp.ones((8, 2, 3)), jnp.zeros((8, 1), jnp.int32), jnp.asarray(mask), (4, 1, 2)
        )
    assert seen == [8, rows_run]  # the actor, then one critic pass
    np.testing.assert_array_equal(np.asarray(value), np.where(mask, 3.0, 0.0))


def test_extra_budget():
    assert extra_budgets(512, 2, 1) == (32, 64, 128)  # a sixteenth, an eighth, a quarter
    assert extra_budgets(6, 2, 1) == (1, 2)  # rounded up, distinct
    assert extra_budgets(4, 3, 3) == (0,)  # every row acts: the critic on those alone
    assert extra_budget(512, 2, 1) == 128
    assert extra_budget(6, 2, 1) == 2  # rounded up
    assert extra_budget(4, 3, 3) == 0  # every row acts
    with pytest.raises(ValueError, match="1 <= k <= A"):
        extra_budget(4, 2, 3)


def test_bad_input():
    x = jnp.ones((4, 2, 3))
    rows = jnp.zeros((4, 1), jnp.int32)
    with pytest.raises(ValueError, match=r"rows \[E, k\] and value_rows \[E, A\]"):
        rows_pass(lambda t: (t, t.sum(-1)), x, rows, jnp.ones((8,), bool), 1)
    with pytest.raises(ValueError, match="budget must lie in"):
        rows_pass(lambda t: (t, t.sum(-1)), x, rows, jnp.ones((4, 2), bool), 9)
    with pytest.raises(ValueError, match="budget must lie in"):
        rows_pass(lambda t: (t, t.sum(-1)), x, rows, jnp.ones((4, 2), bool), ())
    with pytest.raises(ValueError, match="1 <= k <= A"):
        extra_budgets(4, 2, 3)


def test_act_on_rows_values_match_the_critic_on_every_row():
    env = TicTacToe()
    policy = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    params = policy.init(jax.random.PRNGKey(0))
    E = 16
    obs = jax.random.bernoulli(jax.random.PRNGKey(1), 0.3, (E, 2) + env.observation_space.shape)
    obs = obs.astype(env.observation_space.dtype)
    rows = jnp.zeros((E, 1), jnp.int32)
    _, value, _ = policy.forward(params, obs)
    for n_reset in (0, 3, 10):  # 10 resetting envs overflow the budget (4 extra rows)
        needed = jnp.zeros((E, 2), bool).at[:, 0].set(True).at[:n_reset, 1].set(True)
        _, extras, _ = policy.act_on_rows(
            params, obs, jax.random.PRNGKey(2), None, rows, value_rows=needed
        )
        m = np.asarray(needed)
        np.testing.assert_allclose(
            np.asarray(extras["vf_preds"])[m], np.asarray(value)[m], rtol=1e-6, atol=1e-7
        )
        assert not np.asarray(extras["vf_preds"])[~m].any()
    assert policy.values_on_rows
    shared = js.policies.MultiAgentPolicy(env, {"shared": policy})
    assert (
        shared.values_on_rows
        and not js.RandomPolicy(env.observation_space, env.action_space).values_on_rows
    )


def test_a_gaussian_policy_acts_the_same_with_and_without_value_rows():
    obs_space = js.spaces.Box(-1.0, 1.0, (3,), np.float32)
    act_space = js.spaces.Box(-1.0, 1.0, (2,), np.float32)
    policy = js.MLPPolicy(obs_space, act_space, hidden_sizes=(8,))
    params = policy.init(jax.random.PRNGKey(0))
    obs = jax.random.normal(jax.random.PRNGKey(1), (6, 3, 3))
    rows = jnp.array([[0], [1], [2], [0], [1], [2]], jnp.int32)
    needed = jnp.zeros((6, 3), bool).at[jnp.arange(6), rows[:, 0]].set(True).at[0].set(True)
    key = jax.random.PRNGKey(2)
    a, x, _ = policy.act_on_rows(params, obs, key, None, rows, value_rows=needed)
    b, y, _ = policy.act_on_rows(params, obs, key, None, rows)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
    for name in ("action_dist_inputs", "action_logp"):
        np.testing.assert_allclose(np.asarray(x[name]), np.asarray(y[name]), rtol=1e-6, atol=1e-6)
    m = np.asarray(needed)
    np.testing.assert_allclose(
        np.asarray(x["vf_preds"])[m], np.asarray(y["vf_preds"])[m], rtol=1e-6, atol=1e-6
    )
    assert not np.asarray(x["vf_preds"])[~m].any()
