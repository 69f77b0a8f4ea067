"""The rollout's parts alone: the key schedule, one step, the buffer writes, the debug
message. Tiny shapes; most checks trace abstractly (``jax.eval_shape``) or run eagerly."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import jaxsampler as js
from jaxsampler.policies.base import Policy
from jaxsampler.rollout import RolloutDebugError, buffers, debug, keys, pipeline_of, step
from jaxsampler.spaces import Box, Discrete
from jaxsampler.transforms import NormalizeObservation, NormalizeReward
from jaxsampler.transforms.base import Context
from jaxsampler.types import RolloutState, Trajectory
from tests.fakes import FakeEnv

E, T = 2, 8
KEY = jax.random.PRNGKey(3)


@dataclasses.dataclass(frozen=True)
class KeyPolicy(Policy):
    """Always action 1; ``extras["key"]`` is the key the policy was called with."""

    observation_space: Box
    action_space: Discrete

    def init(self, key):
        return ()

    def __call__(self, params, obs, key, state):
        batch = obs.shape[:2]
        key_leaf = jnp.broadcast_to(key, batch + (2,))  # a raw uint32[2] key
        return jnp.ones(batch, jnp.int32), {"key": key_leaf}, state


def same(a, b) -> bool:
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


# ----------------------------------------------------------------------------- keys


def test_step_keys_are_deterministic_and_all_streams_distinct():
    k1 = keys.step_keys(KEY, E, params_stream=True)
    k2 = keys.step_keys(KEY, E, params_stream=True)
    assert all(same(a, b) for a, b in zip(jax.tree.leaves(k1), jax.tree.leaves(k2), strict=True))
    assert k1.env_steps.shape == (E, 2) and k1.env_resets.shape == (E, 2)
    singles = [k1.carry, k1.policy, k1.reset, keys.pool_key(KEY)]
    rows = singles + list(k1.env_steps) + list(k1.env_resets)
    assert len({tuple(np.asarray(r).tolist()) for r in rows}) == len(rows)
    # The params stream, fold_in(reset, 1), is env 1's reset key: with partitionable
    # threefry split(k, E)[i] == fold_in(k, i). Pinned here because recorded
    # domain-randomized rollouts depend on it; changing it is a change of schedule.
    assert same(k1.params, k1.env_resets[1])
    assert not any(same(k1.params, r) for r in singles + list(k1.env_steps))


def test_the_params_stream_leaves_the_other_streams_as_they_were():
    plain, with_params = keys.step_keys(KEY, E), keys.step_keys(KEY, E, params_stream=True)
    assert plain.params is None and with_params.params is not None
    for name in ("carry", "policy", "env_steps", "reset", "env_resets"):
        assert same(getattr(plain, name), getattr(with_params, name)), name


def test_shards_fold_their_index_into_every_stream_but_the_carried_key():
    sharded = jax.vmap(
        lambda _: keys.step_keys(KEY, E, shard_axis="s", params_stream=True), axis_name="s"
    )(jnp.arange(2))
    unsharded = keys.step_keys(KEY, E, params_stream=True)
    for shard in (0, 1):
        assert same(sharded.carry[shard], unsharded.carry)
        for name in ("policy", "reset", "params"):
            want = jax.random.fold_in(getattr(unsharded, name), shard)
            assert same(getattr(sharded, name)[shard], want), name
        assert same(sharded.env_resets[shard], jax.random.split(sharded.reset[shard], E))
    for name in ("policy", "env_steps", "reset", "env_resets", "params"):
        assert not same(getattr(sharded, name)[0], getattr(sharded, name)[1]), name


@functools.cache
def key_rollout():
    env = FakeEnv()
    pol = KeyPolicy(env.observation_space, env.action_space)
    rollout = js.make_rollout(env, pol, E, T)
    state = rollout.init(KEY)
    return state, jax.jit(rollout.run)((), state)


def test_the_rollout_uses_the_key_schedule():
    """The policy's key, each reset env's key and the carried key at every step are the
    schedule's (FakeEnv's reset draws its tag from the env's reset key)."""
    start, (end, traj) = key_rollout()
    key = start.key
    seen_resets = 0
    for t in range(T):
        k = keys.step_keys(key, E)
        np.testing.assert_array_equal(traj.extras["key"][t], np.broadcast_to(k.policy, (E, 1, 2)))
        for e in np.flatnonzero(np.asarray(traj.is_reset[t])):
            tag = jax.random.uniform(k.env_resets[e], (), jnp.float32)
            assert same(traj.obs[t + 1, e, 0, 1], tag)
            seen_resets += 1
        key = k.carry
    assert seen_resets > 0
    assert same(end.key, key)


# ----------------------------------------------------------------------------- one step


def abstract_step(transforms=()):
    """(state, transition, outcome, next state, trajectory spec) of one FakeEnv step, the
    step traced abstractly."""
    env = FakeEnv()
    pipe = pipeline_of(env, transforms)
    pol = js.RandomPolicy(pipe.observation_space, pipe.action_space)
    state = js.init_rollout_state(env, pol, E, KEY, None, pipe)

    def one(s: RolloutState):
        k = keys.step_keys(s.key, E, params_stream=pipe.randomizes_params)
        act = step.policy_step(pol, pipe, env, (), s, k.policy, pol.initial_state((E, 1)))
        transition, outcome = step.env_step(env, pipe, s, act, k, jnp.int32(0), ctx=Context())
        return transition, outcome, step.advance(s, transition, outcome, k.carry)

    transition, outcome, after = jax.eval_shape(one, state)
    spec = buffers.trajectory_spec(env, pol, T, (), state, pipe)
    return state, transition, outcome, after, spec


def test_a_transition_has_the_shapes_of_one_buffer_slot():
    state, tr, _, after, spec = abstract_step()
    assert tr.obs.shape == (E, 1, 2) and tr.obs.dtype == jnp.float32
    assert tr.actions.shape == (E, 1) and jnp.issubdtype(tr.actions.dtype, jnp.integer)
    assert tr.rewards.shape == (E, 1) and tr.rewards.dtype == jnp.float32
    for flags in (tr.terminated, tr.truncated, tr.acting):
        assert flags.shape == (E, 1) and flags.dtype == jnp.bool_
    assert tr.is_reset.shape == (E,) and tr.is_reset.dtype == jnp.bool_
    assert tr.raw_obs is None and tr.raw_rewards is None and tr.env_params is None
    for f in dataclasses.fields(tr):
        value = getattr(tr, f.name)
        for slot, leaf in zip(
            jax.tree.leaves(getattr(spec, f.name)), jax.tree.leaves(value), strict=True
        ):
            assert slot.shape[1:] == leaf.shape and slot.dtype == leaf.dtype, f.name
    # The next state keeps the state's layout.
    assert jax.tree.structure(after) == jax.tree.structure(state)
    for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(state), strict=True):
        assert a.shape == b.shape and a.dtype == jnp.result_type(b)


def test_transforms_add_the_raw_tracks_to_a_transition():
    _, tr, outcome, _, spec = abstract_step((NormalizeObservation(), NormalizeReward()))
    assert tr.raw_obs.shape == (E, 1, 2) and tr.raw_rewards.shape == (E, 1)
    assert spec.raw_obs.shape == (T + 1, E, 1, 2) and spec.raw_rewards.shape == (T, E, 1)
    assert outcome.raw_obs.shape == (E, 1, 2)


def test_advance_counts_episodes_and_steps_from_the_reset_flags():
    env = FakeEnv()
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    state = js.init_rollout_state(env, pol, E, KEY)
    state = dataclasses.replace(state, episode_step=jnp.array([4, 2], jnp.int32))
    flag = jnp.array([[False], [True]])
    tr = step.Transition(
        obs=state.obs,
        actions=jnp.zeros((E, 1), jnp.int32),
        rewards=jnp.zeros((E, 1)),
        terminated=flag,
        truncated=jnp.zeros((E, 1), jnp.bool_),
        acting=state.acting,
        is_reset=jnp.array([True, False]),
        extras={},
        infos=(),
    )
    out = step.Outcome(
        env_state=state.env_state,
        obs=state.obs,
        raw_obs=None,
        transform_state=None,
        env_params=state.env_params,
        acting=state.acting,
        policy_state=state.policy_state,
    )
    new_key = jax.random.PRNGKey(9)
    after = step.advance(state, tr, out, new_key)
    np.testing.assert_array_equal(after.needs_reset, [False, True])
    np.testing.assert_array_equal(after.episode_count, [1, 0])
    np.testing.assert_array_equal(after.episode_step, [0, 3])
    assert int(after.num_steps) == 1 and same(after.key, new_key)
    assert after.episode_count.dtype == jnp.int32 and after.episode_step.dtype == jnp.int32


# ----------------------------------------------------------------------------- buffers


def tiny_buffers(rng: np.random.Generator, raw: bool) -> Trajectory:
    def arr(shape, dtype):
        return jnp.asarray(rng.normal(size=shape) * 10).astype(dtype)

    return Trajectory(
        obs=arr((T + 1, E, 1, 2), jnp.float32),
        actions=arr((T, E, 1), jnp.int32),
        rewards=arr((T, E, 1), jnp.float32),
        terminated=arr((T, E, 1), jnp.bool_),
        truncated=arr((T, E, 1), jnp.bool_),
        acting=arr((T, E, 1), jnp.bool_),
        is_reset=arr((T, E), jnp.bool_),
        extras={"logp": arr((T, E, 1), jnp.float32), "n": arr((T, E, 1, 3), jnp.int32)},
        infos={"x": arr((T, E), jnp.float32)},
        episode_count_0=arr((E,), jnp.int32),
        episode_step_0=arr((E,), jnp.int32),
        policy_state_0=(),
        raw_obs=arr((T + 1, E, 1, 2), jnp.float32) if raw else None,
        raw_rewards=arr((T, E, 1), jnp.float32) if raw else None,
    )


def tiny_transition(rng: np.random.Generator, raw: bool) -> step.Transition:
    def arr(shape, dtype):
        return jnp.asarray(rng.normal(size=shape) * 10).astype(dtype)

    return step.Transition(
        raw_obs=arr((E, 1, 2), jnp.float32) if raw else None,
        raw_rewards=arr((E, 1), jnp.float32) if raw else None,
        obs=arr((E, 1, 2), jnp.float32),
        actions=arr((E, 1), jnp.float32),  # cast to the buffer's int32, as the scan does
        rewards=arr((E, 1), jnp.float32),
        terminated=arr((E, 1), jnp.bool_),
        truncated=arr((E, 1), jnp.bool_),
        acting=arr((E, 1), jnp.bool_),
        is_reset=arr((E,), jnp.bool_),
        extras={"logp": arr((E, 1), jnp.float32), "n": arr((E, 1, 3), jnp.int32)},
        infos={"x": arr((E,), jnp.float32)},
    )


def numpy_write(buf: Trajectory, t: int, tr: step.Transition) -> Trajectory:
    """The reference: a copy of every buffer, slot ``t`` of each written track set."""
    out = jax.tree.map(np.array, buf)
    for f in dataclasses.fields(tr):
        value = getattr(tr, f.name)
        if value is None:
            continue
        for b, v in zip(jax.tree.leaves(getattr(out, f.name)), jax.tree.leaves(value), strict=True):
            b[t] = np.asarray(v).astype(b.dtype)
    return out


@pytest.mark.parametrize(("t", "raw"), [(0, False), (5, True), (T - 1, True)])
def test_write_matches_a_numpy_reference(t, raw):
    rng = np.random.default_rng(t)
    buf, tr = tiny_buffers(rng, raw=True), tiny_transition(rng, raw)
    want = numpy_write(buf, t, tr)
    got = jax.jit(buffers.write)(buf, jnp.int32(t), tr)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
    if not raw:  # tracks the transition does not carry are left as they were
        np.testing.assert_array_equal(got.raw_obs, buf.raw_obs)


def test_write_next_obs_fills_the_extra_observation_slot():
    rng = np.random.default_rng(1)
    buf = tiny_buffers(rng, raw=True)
    obs, raw = jnp.ones((E, 1, 2)), jnp.full((E, 1, 2), 2.0)
    got = buffers.write_next_obs(buf, jnp.int32(T), obs, raw)
    np.testing.assert_array_equal(got.obs[T], obs)
    np.testing.assert_array_equal(got.raw_obs[T], raw)
    np.testing.assert_array_equal(got.obs[:T], buf.obs[:T])
    kept = buffers.write_next_obs(buf, jnp.int32(T), obs)
    np.testing.assert_array_equal(kept.raw_obs, buf.raw_obs)


def test_with_start_stamps_the_start_counters():
    env = FakeEnv()
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    state = js.init_rollout_state(env, pol, E, KEY)
    state = dataclasses.replace(state, episode_count=jnp.array([3, 1], jnp.int32))
    got = buffers.with_start(tiny_buffers(np.random.default_rng(2), raw=False), state)
    np.testing.assert_array_equal(got.episode_count_0, [3, 1])
    np.testing.assert_array_equal(got.episode_step_0, state.episode_step)


# ----------------------------------------------------------------------------- debug


def test_a_failed_check_raises_its_message_without_the_source_location():
    def bad(x):
        checkify.check(x > 0, "bad value at step {t}", t=x)

    err, _ = checkify.checkify(bad, errors=checkify.user_checks)(jnp.int32(-1))
    with pytest.raises(debug.RolloutDebugError) as info:
        debug.raise_if_failed(err)
    assert str(info.value) == "bad value at step -1"
    ok, _ = checkify.checkify(bad, errors=checkify.user_checks)(jnp.int32(1))
    debug.raise_if_failed(ok)  # no failure: no error
    assert RolloutDebugError is debug.RolloutDebugError
