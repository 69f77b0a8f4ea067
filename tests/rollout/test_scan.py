"""The rollout: layout, auto-reset contract, determinism, continuation, compile and memory."""

from __future__ import annotations

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.types import Trajectory
from tests.fakes import (
    BadPolicy,
    CountingPolicy,
    FakeEnv,
    FakeParams,
    TurnEnv,
    check_fake_trajectory,
)

E, T = 4, 12


def tree_equal(a, b) -> bool:
    return jax.tree.structure(a) == jax.tree.structure(b) and all(
        np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


@functools.cache
def fake_setup(T: int = T, E: int = E):
    env = FakeEnv()
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    return env, pol, js.jit_rollout(js.make_rollout(env, pol, E, T))


def fresh_state(seed: int, E: int = E, params=None):
    env, pol, _ = fake_setup()
    return js.init_rollout_state(env, pol, E, jax.random.PRNGKey(seed), params)


def test_buffer_layout_is_time_major_with_agent_axis():
    env, pol, rollout = fake_setup()
    state, traj = rollout((), fresh_state(0))
    assert isinstance(traj, Trajectory)
    assert traj.obs.shape == (T + 1, E, 1, 2) and traj.obs.dtype == jnp.float32
    assert traj.actions.shape == (T, E, 1) and jnp.issubdtype(traj.actions.dtype, jnp.integer)
    assert traj.rewards.shape == (T, E, 1) and traj.rewards.dtype == jnp.float32
    for flags in (traj.terminated, traj.truncated, traj.acting):
        assert flags.shape == (T, E, 1) and flags.dtype == jnp.bool_
    assert traj.is_reset.shape == (T, E) and traj.is_reset.dtype == jnp.bool_
    assert traj.episode_count_0.dtype == jnp.int32 and traj.episode_step_0.shape == (E,)
    # The observation track's last slot is the state the next call starts from.
    np.testing.assert_array_equal(traj.obs[T], state.obs)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_autoreset_contract_matches_python_reference(seed):
    """Final observations are real, every episode end is followed by one reset step,
    terminated and truncated stay apart - checked env by env in plain Python."""
    _, _, rollout = fake_setup()
    state = fresh_state(seed)
    seen = {"terminated": 0, "truncated": 0, "resets": 0, "steps": 0}
    for _ in range(3):  # also across call boundaries
        state, traj = rollout((), state)
        for k, v in check_fake_trajectory(traj).items():
            seen[k] += v
    assert seen["terminated"] > 0 and seen["truncated"] > 0 and seen["resets"] > 0
    assert seen["steps"] + seen["resets"] == 3 * T * E


def test_terminated_and_truncated_on_the_same_step_are_both_kept():
    params = FakeParams(term_len=5, max_steps_in_episode=5)
    _, _, rollout = fake_setup()
    state, traj = rollout((), fresh_state(3, params=params))
    check_fake_trajectory(traj, params)
    both = np.asarray(traj.terminated & traj.truncated)
    assert both.any()


def traced_once(rollout: js.rollout.Rollout) -> js.rollout.Rollout:
    """``rollout`` whose pure function fails the test if it is traced a second time."""
    chex.clear_trace_counter()

    def run(params, state, buffers=None):
        return rollout.run(params, state, buffers)

    return dataclasses.replace(rollout, run=chex.assert_max_traces(run, n=1))


def test_env_params_are_traced_not_static():
    """Changing a param (time limit) reuses the compiled rollout."""
    env, pol, _ = fake_setup()
    rollout = js.jit_rollout(traced_once(js.make_rollout(env, pol, E, T)))
    state, traj = rollout((), fresh_state(4))
    check_fake_trajectory(traj)
    params = FakeParams(term_len=2, max_steps_in_episode=3)
    _, traj = rollout((), fresh_state(4, params=params), traj)
    check_fake_trajectory(traj, params)


def test_deterministic_for_a_fixed_seed():
    _, _, rollout = fake_setup()
    a = rollout((), fresh_state(5))
    b = rollout((), fresh_state(5))
    c = rollout((), fresh_state(6))
    assert tree_equal(a, b)
    assert not tree_equal(a[1].obs, c[1].obs)


def test_two_calls_of_t_equal_one_call_of_2t():
    env, pol, rollout = fake_setup()
    rollout2 = jax.jit(js.make_rollout(env, pol, E, 2 * T))
    s1, t1 = rollout((), fresh_state(7))
    count_1, step_1 = np.asarray(s1.episode_count), np.asarray(s1.episode_step)
    s2, t2 = rollout((), s1)  # s1 is donated here
    s_long, t_long = rollout2((), fresh_state(7))
    assert tree_equal(s2, s_long)
    for field in ("actions", "rewards", "terminated", "truncated", "acting", "is_reset", "extras"):
        joined = jax.tree.map(
            lambda a, b: jnp.concatenate([a, b]), getattr(t1, field), getattr(t2, field)
        )
        assert tree_equal(joined, getattr(t_long, field)), field
    np.testing.assert_array_equal(t1.obs[T], t2.obs[0])  # the shared slot
    np.testing.assert_array_equal(jnp.concatenate([t1.obs[:T], t2.obs]), t_long.obs)
    np.testing.assert_array_equal(t2.episode_count_0, count_1)
    np.testing.assert_array_equal(t2.episode_step_0, step_1)


def test_jit_and_no_jit_agree():
    env, pol, rollout = fake_setup()
    plain = js.make_rollout(env, pol, E, T)
    assert tree_equal(plain((), fresh_state(8)), rollout((), fresh_state(8)))


def test_usable_inside_the_callers_jit_and_scan():
    env, pol, _ = fake_setup()
    rollout = js.make_rollout(env, pol, E, T)

    @jax.jit
    def train(state):
        def it(s, _):
            s, traj = rollout((), s)
            return s, traj.rewards.sum()

        return jax.lax.scan(it, state, None, length=2)

    state, sums = train(fresh_state(9))
    s1, t1 = js.make_rollout(env, pol, E, T)((), fresh_state(9))
    s2, t2 = js.make_rollout(env, pol, E, T)((), s1)
    assert tree_equal(state, s2)
    np.testing.assert_allclose(sums, [t1.rewards.sum(), t2.rewards.sum()])


def test_repeated_calls_do_not_recompile():
    env, pol, _ = fake_setup()
    jitted = js.jit_rollout(traced_once(js.make_rollout(env, pol, E, T)))
    state, traj = jitted((), fresh_state(10))  # buffers allocated separately: the same signature
    state, traj = jitted((), state, traj)  # buffers passed back
    for _ in range(3):
        state, traj = jitted((), state, traj)
    state, traj = jitted((), fresh_state(11), traj)  # a fresh state of the same shape
    _, traj = jitted((), fresh_state(12))
    check_fake_trajectory(traj)


def test_a_traced_twice_rollout_is_caught():
    """The guard above is live: a second trace (new shapes) fails the test."""
    env, pol, _ = fake_setup()
    jitted = js.jit_rollout(traced_once(js.make_rollout(env, pol, E, T)))
    jitted((), fresh_state(10))
    with pytest.raises(AssertionError, match="traced > 1 times"):
        jitted((0.0,), fresh_state(10))  # other params structure: a second trace


def test_rollout_object_bundles_init_and_allocate_of_its_own_sizes():
    env, pol, _ = fake_setup()
    rollout = js.make_rollout(env, pol, E, T)
    assert (rollout.num_envs, rollout.rollout_length, rollout.num_agents) == (E, T, 1)
    state = rollout.init(jax.random.PRNGKey(18))
    assert tree_equal(state, fresh_state(18))
    buffers = rollout.allocate((), state)
    assert buffers.obs.shape == (T + 1, E, 1, 2) and not np.asarray(buffers.rewards).any()
    assert tree_equal(rollout((), state, buffers), rollout((), state))
    with pytest.raises(dataclasses.FrozenInstanceError):
        rollout.num_envs = 3  # type: ignore[misc]
    jitted = js.jit_rollout(rollout)
    assert isinstance(jitted, js.rollout.Rollout) and jitted.init is rollout.init
    assert tree_equal(jitted((), rollout.init(jax.random.PRNGKey(18))), rollout((), state))
    with pytest.raises(TypeError, match="Rollout"):
        js.jit_rollout(rollout.run)


def test_env_params_survive_the_donated_state():
    """The rollout state is donated; env params that are already arrays (the user's, or an
    env's own default_params such as gymnax Acrobot's torque array) are copied into it, so
    they survive the first call and later resets work."""
    env = js.make("gymnax:Acrobot-v1")
    assert any(isinstance(x, jax.Array) for x in jax.tree.leaves(env.default_params))
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    s = js.Sampler(env, pol, num_envs=2, rollout_length=8)
    s.sample(())
    s.sample((), force_reset=True)
    assert len(s.sample((), num_episodes=1)) >= 1
    cart = js.make("CartPole-v1")
    params = jax.tree.map(jnp.asarray, cart.default_params)
    s = js.Sampler(
        cart, js.RandomPolicy(cart.observation_space, cart.action_space), 2, 8, env_params=params
    )
    s.sample(())
    assert not any(x.is_deleted() for x in jax.tree.leaves(params))
    s.sample((), force_reset=True)


def test_jit_rollout_refuses_a_debug_rollout_with_a_reason():
    env, pol = FakeEnv(), js.RandomPolicy(FakeEnv().observation_space, FakeEnv().action_space)
    with pytest.raises(TypeError, match="debug=True rollout"):
        js.jit_rollout(js.make_rollout(env, pol, 2, 4, debug=True))


def test_buffers_are_donated_and_reused():
    _, _, rollout = fake_setup()
    state, traj = rollout((), fresh_state(12))
    pointers = [
        x.unsafe_buffer_pointer()
        for x in jax.tree.leaves(traj.replace(episode_count_0=None, episode_step_0=None))
    ]
    state, traj2 = rollout((), state, traj)
    reused = [
        x.unsafe_buffer_pointer()
        for x in jax.tree.leaves(traj2.replace(episode_count_0=None, episode_step_0=None))
    ]
    assert pointers == reused
    assert traj.rewards.is_deleted()


def test_policy_state_resets_at_episode_start_and_carries_across_calls():
    env = FakeEnv()
    pol = CountingPolicy(env.observation_space, env.action_space)
    rollout = jax.jit(js.make_rollout(env, pol, E, T))
    state = js.init_rollout_state(env, pol, E, jax.random.PRNGKey(13))
    for _ in range(2):
        pstate_0 = np.asarray(state.policy_state)
        state, traj = rollout((), state)
        count = np.asarray(traj.extras["count"])[..., 0]
        time = np.asarray(traj.obs[:T, :, 0, 0])
        live = ~np.asarray(traj.is_reset)
        # The count is the step index within the episode at every acting step.
        np.testing.assert_array_equal(count[live], time[live].astype(np.int32))
        np.testing.assert_array_equal(np.asarray(traj.actions)[..., 0][live], count[live] % 3)
        np.testing.assert_array_equal(traj.policy_state_0, pstate_0)
    assert int(state.episode_count.sum()) > 0


def test_agent_axis_records_out_of_lockstep_acting():
    env = TurnEnv(length=4)
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    state = js.init_rollout_state(env, pol, 2, jax.random.PRNGKey(14))
    _, traj = jax.jit(js.make_rollout(env, pol, 2, 10))((), state)
    assert traj.acting.shape == (10, 2, 2) and traj.obs.shape == (11, 2, 2, 1)
    # Steps 0-3: agents alternate; step 4: reset (nobody acts); steps 5-8 again; 9 reset.
    expected = np.array(
        [[1, 0], [0, 1], [1, 0], [0, 1], [0, 0], [1, 0], [0, 1], [1, 0], [0, 1], [0, 0]], bool
    )
    for e in range(2):
        np.testing.assert_array_equal(traj.acting[:, e], expected)
    np.testing.assert_array_equal(traj.is_reset[:, 0], ~expected.any(-1))
    np.testing.assert_array_equal(traj.terminated[3, 0], [True, True])
    np.testing.assert_array_equal(traj.rewards[0, 0], [1.0, 0.5])


def test_random_policy_actions_lie_in_the_action_space():
    _, _, rollout = fake_setup()
    _, traj = rollout((), fresh_state(15))
    acts = np.asarray(traj.actions)
    assert acts.min() >= 0 and acts.max() <= 2 and len(np.unique(acts)) == 3


def test_episode_ids_are_unique_across_envs_and_calls():
    """Each FakeEnv episode carries its own tag (drawn at reset, observed every step), an
    identity independent of the sampler's ids: across envs and calls, ids and tags must
    match one to one (one id per episode, its chunks in later calls keep it)."""
    env, pol, _ = fake_setup()
    sampler = js.Sampler(env, pol, num_envs=E, rollout_length=T, seed=16)
    tag_of_id: dict[str, float] = {}
    chunks = 0
    for _ in range(4):
        for ep in sampler.sample(()):
            tags = np.unique(np.asarray(ep.get_observations())[:, 1])
            assert len(tags) == 1, "a chunk holds one episode"
            assert tag_of_id.setdefault(ep.id_, float(tags[0])) == float(tags[0]), ep.id_
            chunks += 1
    tags = list(tag_of_id.values())
    assert len(set(tags)) == len(tags), "two episodes share an id"
    # Episodes last at most 5 steps plus one reset step: 4 calls of T steps in E envs
    # start at least E * 4 * T / 6 of them; some are cut by a call boundary.
    assert len(tag_of_id) >= E * 4 * T // 6
    assert chunks > len(tag_of_id)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("num_envs", [0, -1, 1.5, True, "4"])
def test_bad_num_envs(num_envs):
    env, pol, _ = fake_setup()
    with pytest.raises(ValueError, match="num_envs"):
        js.make_rollout(env, pol, num_envs, T)
    with pytest.raises(ValueError, match="num_envs"):
        js.init_rollout_state(env, pol, num_envs, jax.random.PRNGKey(0))


def test_bad_rollout_length():
    env, pol, _ = fake_setup()
    with pytest.raises(ValueError, match="rollout_length"):
        js.make_rollout(env, pol, E, 0)


def test_mismatched_spaces_are_named():
    env = FakeEnv()
    other = js.make("Pendulum-v1")
    pol = js.MLPPolicy(other.observation_space, other.action_space)
    with pytest.raises(ValueError, match="mismatched observation space"):
        js.make_rollout(env, pol, E, T)
    pol2 = js.RandomPolicy(env.observation_space, other.action_space)
    with pytest.raises(ValueError, match="mismatched action space"):
        js.make_rollout(env, pol2, E, T)


def test_state_width_must_match_rollout_width():
    env, pol, _ = fake_setup()
    rollout = js.make_rollout(env, pol, E, T)
    with pytest.raises(ValueError, match="built for 3 envs"):
        rollout((), js.init_rollout_state(env, pol, 3, jax.random.PRNGKey(0)))


@pytest.mark.parametrize(
    "mode, exc, match",
    [
        ("shape", ValueError, r"action has shape \(4,\), expected \(4, 1\)"),
        ("dtype", TypeError, "not an integer dtype"),
    ],
)
def test_wrong_action_shape_or_dtype_fails_at_trace_time(mode, exc, match):
    env = FakeEnv()
    pol = BadPolicy(env.observation_space, env.action_space, mode)
    rollout = jax.jit(js.make_rollout(env, pol, E, T))
    with pytest.raises(exc, match=match):
        rollout((), js.init_rollout_state(env, pol, E, jax.random.PRNGKey(0)))


def test_debug_mode_names_the_first_nan():
    env = FakeEnv()
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    params = FakeParams(nan_tag=0.3)
    state = js.init_rollout_state(env, pol, E, jax.random.PRNGKey(17), params)
    _, traj = js.make_rollout(env, pol, E, T)((), state)
    bad = np.argwhere(np.isnan(np.asarray(traj.obs[:T, :, 0, 0])))
    assert len(bad), "fixture must produce a NaN"
    t, e = bad[0]
    debug = js.make_rollout(env, pol, E, T, debug=True)
    with pytest.raises(
        js.rollout.RolloutDebugError, match=f"non-finite observation at step {t} .*env {e}, agent 0"
    ):
        debug((), state)
    # A clean run passes and returns the same data as the plain rollout.
    clean = js.init_rollout_state(env, pol, E, jax.random.PRNGKey(17))
    assert tree_equal(debug((), clean), js.make_rollout(env, pol, E, T)((), clean))


def test_debug_mode_reports_actions_outside_the_space():
    env = FakeEnv()
    pol = BadPolicy(env.observation_space, env.action_space, "value")
    debug = js.make_rollout(env, pol, E, T, debug=True)
    with pytest.raises(
        js.rollout.RolloutDebugError, match=r"action outside Discrete\(3\).*step 0 .*env 0, agent 0"
    ):
        debug((), js.init_rollout_state(env, pol, E, jax.random.PRNGKey(0)))


def test_recurrent_policy_logp_replays_with_resets_at_episode_starts():
    """Replaying the GRU over the stored observations, resetting its carry exactly at each
    episode's first observation, reproduces every stored action_logp (no off-by-one)."""
    env = FakeEnv()
    pol = js.policies.RecurrentPolicy(env.observation_space, env.action_space, hidden_size=4)
    params = pol.init(jax.random.PRNGKey(1))
    rollout = jax.jit(js.make_rollout(env, pol, 2, 9))
    state = js.init_rollout_state(env, pol, 2, jax.random.PRNGKey(2))
    state, _ = rollout(params, state)  # start the checked call mid-episode
    state, traj = rollout(params, state)
    from jaxsampler.policies.mlp import _flatten_obs, log_prob

    step = np.asarray(traj.episode_step_0).copy()
    carry = np.asarray(traj.policy_state_0)
    resets = np.asarray(traj.is_reset)
    checked = 0
    for t in range(9):
        obs = traj.obs[t]
        carry = np.where((step == 0)[:, None, None], 0.0, carry)
        new_carry, (dist, value, log_std) = pol.module.apply(
            params, jnp.asarray(carry), _flatten_obs(obs, env.observation_space)
        )
        logp = log_prob(env.action_space, dist, log_std, traj.actions[t])
        live = ~resets[t]
        np.testing.assert_allclose(
            np.asarray(logp)[live],
            np.asarray(traj.extras["action_logp"][t])[live],
            rtol=1e-5,
            atol=1e-6,
        )
        np.testing.assert_allclose(
            np.asarray(value)[live],
            np.asarray(traj.extras["vf_preds"][t])[live],
            rtol=1e-5,
            atol=1e-6,
        )
        checked += int(live.sum())
        carry = np.asarray(new_carry)
        step = np.where(resets[t], 0, step + 1)
    assert checked > 10 and resets.any()
