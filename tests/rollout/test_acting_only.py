"""Acting-only compute: an env that declares ``max_acting`` (turn-based games) gets its
policy run on the acting agents' rows only.

References: the same rollout with the bound removed (every row evaluated), a greedy policy
(no random draws) for bit-for-bit equality, the network's own ``forward`` and ``log_prob``
on the recorded observations for a sampling policy, the softmax probabilities for the
distribution of the draws, and NumPy's ``take_along_axis`` for the row helpers.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler import vector
from jaxsampler.envs.spread import Spread
from jaxsampler.envs.tictactoe import TicTacToe
from jaxsampler.rollout.debug import RolloutDebugError
from jaxsampler.rollout.step import acting_only


class EveryRow(TicTacToe):
    """TicTacToe without the bound: the policy runs on both players' rows."""

    max_acting = None


class CrowdedSpread(Spread):
    """Every agent acts at once, but the env claims one at most (a wrong declaration)."""

    max_acting = 1


def rollout_of(env, policy, num_envs=6, length=30):
    params = policy.init(jax.random.PRNGKey(0))
    rollout = js.make_rollout(env, policy, num_envs, length)
    _, traj = jax.jit(rollout)(params, rollout.init(jax.random.PRNGKey(1)))
    return params, jax.device_get(traj)


def mlp(env, explore=True):
    return js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,), explore=explore)


def test_rows_helpers_match_numpy():
    acting = np.array([[False, True, False], [True, False, True], [False, False, False]])
    rows = np.asarray(vector.acting_rows(jnp.asarray(acting), 2))
    # acting agents first, in agent order, then the others
    np.testing.assert_array_equal(rows, [[1, 0], [0, 2], [0, 1]])
    # k = 1 takes no sort: the first column of the stable sort, on every pattern of A = 3
    every = np.array(np.meshgrid(*[[False, True]] * 3)).reshape(3, -1).T
    one = np.asarray(vector.acting_rows(jnp.asarray(every), 1))
    np.testing.assert_array_equal(one[:, 0], np.argsort(~every, axis=-1, kind="stable")[:, 0])
    assert one.dtype == np.int32
    x = np.arange(3 * 3 * 2, dtype=np.float32).reshape(3, 3, 2)
    got = np.asarray(vector.gather_agents(jnp.asarray(x), jnp.asarray(rows)))
    np.testing.assert_array_equal(got, np.take_along_axis(x, rows[..., None], axis=1))
    back = np.asarray(vector.scatter_agents(jnp.asarray(got), jnp.asarray(rows), 3))
    want = np.zeros_like(x)
    np.put_along_axis(want, rows[..., None], got, axis=1)
    np.testing.assert_array_equal(back, want)


def test_a_greedy_policy_gives_the_every_row_trajectory():
    """The same actions, so the same games; the network's outputs agree to float rounding
    (XLA may round a matmul over E x 1 rows differently from one over E x 2)."""
    _, fast = rollout_of(TicTacToe(), mlp(TicTacToe(), explore=False))
    _, full = rollout_of(EveryRow(), mlp(EveryRow(), explore=False))
    act = full.acting
    assert act.sum() > 0 and full.is_reset.any()  # games ended and restarted in the call
    for field in ("obs", "rewards", "terminated", "truncated", "acting", "is_reset"):
        np.testing.assert_array_equal(getattr(fast, field), getattr(full, field))
    np.testing.assert_array_equal(fast.actions[act], full.actions[act])
    for name in full.extras:
        np.testing.assert_allclose(fast.extras[name][act], full.extras[name][act], rtol=1e-6)


def test_values_are_kept_where_bootstraps_read_them():
    """Games cut by a 4-move limit: at the reset step nobody acts, but GAE bootstraps each
    truncated player from its final observation's value, so ``vf_preds`` must hold every
    agent's value at reset steps and the mover's at the others (as evaluating every row
    does); a waiting player's is 0 (nothing reads it); the advantages match."""
    env_params = TicTacToe().default_params.replace(max_steps_in_episode=4)
    policy = mlp(TicTacToe(masked_obs=True), explore=False)  # legal moves: games go on
    trajs = []
    for env in (TicTacToe(masked_obs=True), EveryRow(masked_obs=True)):
        params = policy.init(jax.random.PRNGKey(0))
        rollout = js.make_rollout(env, policy, 6, 30)
        state = rollout.init(jax.random.PRNGKey(1), env_params=env_params)
        trajs.append(jax.device_get(jax.jit(rollout)(params, state)[1]))
    fast, full = trajs
    assert (full.truncated & ~full.terminated).any()  # some games hit the limit
    read = full.acting | full.is_reset[..., None]
    assert (~read).any()
    np.testing.assert_allclose(
        fast.extras["vf_preds"][read], full.extras["vf_preds"][read], rtol=1e-6
    )
    assert not fast.extras["vf_preds"][~read].any()
    last = jnp.zeros(full.rewards.shape[1:])
    got, want = (js.compute_gae(t, last) for t in (fast, full))
    np.testing.assert_allclose(got.advantages, want.advantages, rtol=1e-5, atol=1e-6)


def test_a_sampling_policy_records_the_networks_outputs_for_its_own_actions():
    env = TicTacToe()
    policy = mlp(env)
    params, traj = rollout_of(env, policy)
    act = traj.acting
    obs = traj.obs[:-1]
    dist, value, _ = policy.forward(params, obs)  # every row, on the recorded observations
    np.testing.assert_allclose(
        traj.extras["action_dist_inputs"][act], np.asarray(dist)[act], rtol=1e-6, atol=1e-6
    )
    np.testing.assert_allclose(
        traj.extras["vf_preds"][act], np.asarray(value)[act], rtol=1e-6, atol=1e-6
    )
    logp = policy.log_prob(params, obs, jnp.asarray(traj.actions), None)
    np.testing.assert_allclose(
        traj.extras["action_logp"][act], np.asarray(logp)[act], rtol=1e-5, atol=1e-6
    )
    # every agent's value at reset steps (GAE bootstraps from them), 0 for a waiting one
    read = act | traj.is_reset[..., None]
    np.testing.assert_allclose(
        traj.extras["vf_preds"][read], np.asarray(value)[read], rtol=1e-6, atol=1e-6
    )
    assert not traj.extras["vf_preds"][~read].any()
    # where one player moves, the other's row was skipped by the actor: zeros, never
    # another agent's output
    skipped = ~act & (act.sum(-1, keepdims=True) == 1)
    assert skipped.any()
    assert not traj.extras["action_logp"][skipped].any() and not traj.actions[skipped].any()


def test_draws_on_rows_follow_the_policys_distribution():
    """One observation, 20,000 envs: the frequency of each action is its softmax
    probability (to within 5 standard errors)."""
    env = TicTacToe()
    policy = mlp(env)
    params = policy.init(jax.random.PRNGKey(3))
    E = 20_000
    one = jnp.zeros(env.observation_space.shape, jnp.float32).at[::2].set(1.0)
    obs = jnp.broadcast_to(one, (E, 2) + one.shape)
    rows = jnp.ones((E, 1), jnp.int32)  # agent 1 acts everywhere
    action, extras, _ = policy.act_on_rows(params, obs, jax.random.PRNGKey(4), None, rows)
    probs = np.asarray(jax.nn.softmax(policy.forward(params, one[None])[0][0]))
    freq = np.bincount(np.asarray(action[:, 1]), minlength=9) / E
    assert np.all(np.abs(freq - probs) <= 5 * np.sqrt(probs * (1 - probs) / E) + 1e-9)
    assert not np.asarray(action[:, 0]).any()  # agent 0 was not evaluated


def test_which_policies_run_on_acting_rows_only():
    env = TicTacToe()
    feed_forward = mlp(env)
    pstate = feed_forward.initial_state((2, 2))
    assert acting_only(env, feed_forward, pstate) == 1
    assert acting_only(EveryRow(), feed_forward, pstate) is None
    shared = js.policies.MultiAgentPolicy(env, {"shared": feed_forward})
    assert acting_only(env, shared, shared.initial_state((2, 2))) == 1
    two = js.policies.MultiAgentPolicy(
        env,
        {"x": feed_forward, "o": feed_forward},
        policy_mapping_fn=lambda a: "x" if a == "agent_0" else "o",
    )
    assert acting_only(env, two, two.initial_state((2, 2))) is None  # each agent its own policy
    recurrent = js.policies.RecurrentPolicy(env.observation_space, env.action_space, hidden_size=4)
    assert acting_only(env, recurrent, recurrent.initial_state((2, 2))) is None

    class Noisy(js.MLPPolicy):  # acts its own way: the rollout must call its __call__
        def __call__(self, params, obs, key, policy_state):
            return super().__call__(params, obs, key, policy_state)

    noisy = Noisy(env.observation_space, env.action_space, hidden_sizes=(8,))
    assert not noisy.acts_on_rows and acting_only(env, noisy, pstate) is None


def test_more_agents_acting_than_declared_is_an_error_not_a_dropped_action():
    env = CrowdedSpread()
    report = js.check_env(env, raise_on_error=False)
    assert any("max_acting=1" in p for p in report.problems)
    policy = mlp(env)
    rollout = js.make_rollout(env, policy, 2, 3, debug=True)
    with pytest.raises(RolloutDebugError, match="max_acting=1"):
        rollout(policy.init(jax.random.PRNGKey(0)), rollout.init(jax.random.PRNGKey(1)))


@dataclasses.dataclass(frozen=True)
class RowsOnly(js.policies.Policy):
    """An ``act_on_rows`` written for ``rows`` alone (``values_on_rows`` stays False)."""

    inner: Any
    observation_space: Any
    action_space: Any

    def init(self, key):
        return self.inner.init(key)

    def initial_state(self, batch_shape):
        return self.inner.initial_state(batch_shape)

    def __call__(self, params, obs, key, policy_state):
        return self.inner(params, obs, key, policy_state)

    def act_on_rows(self, params, obs, key, policy_state, rows):
        return self.inner.act_on_rows(params, obs, key, policy_state, rows)


def test_a_policy_that_takes_rows_alone_still_gives_every_agents_value():
    env = TicTacToe()
    inner = mlp(env)
    wrapped = RowsOnly(inner, env.observation_space, env.action_space)
    assert wrapped.acts_on_rows and not wrapped.values_on_rows
    params, fast = rollout_of(env, inner)
    _, full = rollout_of(env, wrapped)
    for field in ("obs", "actions", "rewards", "acting", "is_reset"):
        np.testing.assert_array_equal(getattr(fast, field), getattr(full, field))
    _, value, _ = inner.forward(params, full.obs[:-1])
    np.testing.assert_allclose(full.extras["vf_preds"], np.asarray(value), rtol=1e-6, atol=1e-6)
    read = fast.acting | fast.is_reset[..., None]
    np.testing.assert_allclose(
        fast.extras["vf_preds"][read], full.extras["vf_preds"][read], rtol=1e-6, atol=1e-7
    )


class ApartTicTacToe(TicTacToe):
    """TicTacToe that does not declare that its players end together."""

    agents_end_together = False


def test_an_env_whose_agents_may_end_apart_gets_every_rows_value():
    # Without the declaration an agent could be done while the others play on, and
    # n-step returns would bootstrap it from a row that is no reset step: every row's
    # value is computed (the actor still runs on the acting rows only).
    policy = mlp(TicTacToe(), explore=False)
    _, apart = rollout_of(ApartTicTacToe(), policy)
    _, full = rollout_of(EveryRow(), policy)
    assert (~(full.acting | full.is_reset[..., None])).any()  # rows nobody reads exist
    np.testing.assert_allclose(apart.extras["vf_preds"], full.extras["vf_preds"], rtol=1e-6)


@dataclasses.dataclass(frozen=True)
class ClaimsTogether(js.make("Goals-v0").__class__):
    """Goals-v0 (agents finish at different times) wrongly declaring they end together."""

    agents_end_together = True


def test_check_env_refuses_agents_ending_apart_under_the_declaration():
    report = js.check_env(ClaimsTogether())
    assert "every agent's episode ends at the same step" in report.checks_run
    assert any("agents_end_together=True" in p for p in report.problems), report.problems
    ok = js.check_env(TicTacToe())
    assert "every agent's episode ends at the same step" in ok.checks_run
    assert not any("agents_end_together" in p for p in ok.problems), ok.problems
