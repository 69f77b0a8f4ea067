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
from jaxsampler.policies.rows import row_budget, where_rows


def rowwise(x):
    """Elementwise per row (exact whatever the batch), two outputs of different shapes."""
    return {"sq": x["a"] * x["a"] + 1.0, "first": x["b"][..., 0] - 2}


def inputs(E=5, A=3, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "a": rng.normal(size=(E, A, 4)).astype(np.float32),
        "b": rng.integers(0, 9, size=(E, A, 2)).astype(np.int32),
    }


def reference(tree, mask):
    out = rowwise(tree)  # NumPy on every row
    return {
        "sq": np.where(mask[..., None], out["sq"], 0.0),
        "first": np.where(mask, out["first"], 0),
    }


@pytest.mark.parametrize("count", [0, 3, 6, 7, 15])  # budget 6: fits up to 6, then falls back
def test_masked_rows_get_the_functions_outputs_and_the_others_zeros(count):
    tree = inputs()
    mask = np.zeros(15, bool)
    mask[np.random.default_rng(count).permutation(15)[:count]] = True
    mask = mask.reshape(5, 3)
    want = reference(tree, mask)
    fn = lambda t, m: where_rows(rowwise, t, m, 6)
    for got in (fn(tree, jnp.asarray(mask)), jax.jit(fn)(tree, jnp.asarray(mask))):
        for name in want:
            np.testing.assert_array_equal(np.asarray(got[name]), want[name])
            assert got[name].dtype == want[name].dtype


def test_the_function_sees_only_the_budget_when_the_mask_fits():
    seen = []

    def spy(x):
        seen.append(x.shape)
        return x.sum(-1)

    x = jnp.ones((4, 2, 3))
    mask = jnp.zeros((4, 2), bool).at[1, 1].set(True)
    out = where_rows(spy, x, mask, 5)
    assert (5, 3) in seen and (8, 3) in seen  # the two branches of the cond
    np.testing.assert_array_equal(np.asarray(out), np.where(np.asarray(mask), 3.0, 0.0))
    seen.clear()
    where_rows(spy, x, mask, 8)  # the budget covers every row: no cond, one pass
    assert seen == [(8, 3)]


def test_row_budget():
    assert row_budget(512, 2, 1) == 512 + 128
    assert row_budget(6, 2, 1) == 6 + 2  # rounded up
    assert row_budget(4, 3, 3) == 12  # every row
    with pytest.raises(ValueError, match="1 <= k <= A"):
        row_budget(4, 2, 3)


def test_bad_input():
    x = jnp.ones((4, 2, 3))
    with pytest.raises(ValueError, match=r"\[E, A\] mask"):
        where_rows(lambda t: t, x, jnp.ones((8,), bool), 4)
    with pytest.raises(ValueError, match="budget must lie in"):
        where_rows(lambda t: t, x, jnp.ones((4, 2), bool), 9)


def test_act_on_rows_values_match_the_critic_on_every_row():
    env = TicTacToe()
    policy = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    params = policy.init(jax.random.PRNGKey(0))
    E = 16
    obs = jax.random.bernoulli(jax.random.PRNGKey(1), 0.3, (E, 2) + env.observation_space.shape)
    obs = obs.astype(env.observation_space.dtype)
    rows = jnp.zeros((E, 1), jnp.int32)
    _, value, _ = policy.forward(params, obs)
    for n_reset in (0, 3, 10):  # 10 resetting envs overflow the budget (16 + 4 rows)
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
