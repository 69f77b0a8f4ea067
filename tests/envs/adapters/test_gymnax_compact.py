"""``compact_obs`` on the gymnax adapter: 1-byte observations that change nothing else.

The reference of every comparison is the same env without the option (float32 frames),
run with the same seeds: a compact run must give the same actions, rewards and flags,
and observations that are equal after ``astype(float32)``. Each MinAtar env is also
checked to emit only 0 and 1 (what makes the cast exact), independently of the adapter.
"""

from __future__ import annotations

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.envs.adapters.gymnax import (
    WHOLE_NUMBER_FRAMES,
    GymnaxEnv,
    compact_observation_space,
    from_gymnax,
)
from jaxsampler.spaces import Box, Discrete

MINATAR = [e for e in gymnax.registered_envs if e.endswith("-MinAtar")]
E, T, LIMIT = 3, 24, 10  # a short time limit, so episodes end and reset inside the run


def _pair(env_id: str, compact: bool | str = True) -> tuple[GymnaxEnv, GymnaxEnv]:
    """(float32 env, compact env) of one gymnax env object and params (time limit LIMIT)."""
    env, params = gymnax.make(env_id)
    params = params.replace(max_steps_in_episode=LIMIT)
    return from_gymnax(env, params, env_id), from_gymnax(env, params, env_id, compact)


def _rollout(env: js.Env, policy: js.Policy, params: object, seed: int = 0):
    rollout = js.make_rollout(env, policy, E, T)
    state = rollout.init(jax.random.PRNGKey(seed))
    return jax.device_get(rollout(params, state)[1])


def _assert_same_run(ref, got) -> None:
    """Same actions, rewards, flags, extras; observations equal once cast to float32."""
    assert got.obs.dtype == np.uint8 and ref.obs.dtype == np.float32
    np.testing.assert_array_equal(got.obs.astype(np.float32), ref.obs)
    for name in ("actions", "rewards", "terminated", "truncated", "acting", "is_reset"):
        np.testing.assert_array_equal(getattr(got, name), getattr(ref, name), err_msg=name)
    jax.tree.map(np.testing.assert_array_equal, got.extras, ref.extras)


# ------------------------------------------------------------------------------- spaces


@pytest.mark.parametrize("option, dtype", [(True, np.uint8), ("uint8", np.uint8), ("bool", bool)])
def test_space_reports_the_stored_dtype(option, dtype):
    plain = js.make("gymnax:Breakout-MinAtar")
    env = js.make("gymnax:Breakout-MinAtar", compact_obs=option)
    space = env.observation_space
    assert isinstance(space, Box) and space.dtype == np.dtype(dtype)
    assert space.shape == plain.observation_space.shape == (10, 10, 4)
    np.testing.assert_array_equal(space.low.astype(np.float32), plain.observation_space.low)
    np.testing.assert_array_equal(space.high.astype(np.float32), plain.observation_space.high)
    _, ts = env.reset(jax.random.PRNGKey(0))
    assert ts.obs.dtype == np.dtype(dtype) and ts.obs.shape == (1, 10, 10, 4)
    assert env.action_space == plain.action_space


def test_integer_box_is_compacted_by_its_dtype():
    """FourRooms-misc emits int32 positions in [1, 11]: uint8 holds them exactly."""
    plain, env = _pair("FourRooms-misc")
    assert env.observation_space == Box(1, 11, (4,), np.uint8)
    key = jax.random.PRNGKey(3)
    np.testing.assert_array_equal(plain.reset(key)[1].obs, env.reset(key)[1].obs)


def test_option_is_part_of_the_env_identity():
    """Adapters of the same objects that differ in the option never share compiled code."""
    env, params = gymnax.make("Breakout-MinAtar")
    assert from_gymnax(env, params) != from_gymnax(env, params, compact_obs=True)
    assert from_gymnax(env, params, compact_obs=True) == from_gymnax(env, params, None, True)
    assert hash(from_gymnax(env, params, compact_obs="bool")) == hash(
        from_gymnax(env, params, compact_obs="bool")
    )


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "env_id, option, why",
    [
        ("CartPole-v1", True, "bounds are not inside [0, 255]"),  # real-valued, unbounded
        ("Catch-bsuite", True, "not known to emit whole numbers"),  # float [0, 1], not known
        ("FourRooms-misc", "bool", "bounds are not inside [0, 1]"),  # integers up to 11
        ("MemoryChain-bsuite", True, "bounds are not inside [0, 255]"),  # shows -1
    ],
)
def test_option_on_an_env_it_cannot_keep_exactly_raises(env_id, option, why):
    space = js.make(f"gymnax:{env_id}").observation_space
    with pytest.raises(ValueError) as err:
        js.make(f"gymnax:{env_id}", compact_obs=option)
    msg = str(err.value)
    assert f"gymnax:{env_id}" in msg and repr(space) in msg and why in msg


@pytest.mark.parametrize("option", ["int8", "float16", 1, None])
def test_unknown_option_value_raises(option):
    with pytest.raises(ValueError, match="compact_obs must be False, True or one of"):
        js.make("gymnax:Breakout-MinAtar", compact_obs=option)


def test_non_box_space_raises():
    with pytest.raises(ValueError, match="only a Box observation can be held compactly"):
        compact_observation_space(Discrete(3), np.uint8, True, "some-env")


def test_minatar_is_the_known_whole_number_family():
    env, _ = gymnax.make("Breakout-MinAtar")
    assert type(env).__module__.startswith(WHOLE_NUMBER_FRAMES)
    env, _ = gymnax.make("Catch-bsuite")
    assert not type(env).__module__.startswith(WHOLE_NUMBER_FRAMES)


# -------------------------------------------------------------------- same runs, 1 byte


def _check_family_member(env_id: str) -> None:
    plain, compact = _pair(env_id)
    policy = js.RandomPolicy(plain.observation_space, plain.action_space)
    ref = _rollout(plain, policy, None)
    # What makes the cast exact, checked on gymnax's own float frames: only 0 and 1.
    assert set(np.unique(ref.obs)) <= {0.0, 1.0}
    assert ref.is_reset.any(), "the time limit should reset envs inside the run"
    got = _rollout(compact, js.RandomPolicy(compact.observation_space, compact.action_space), None)
    _assert_same_run(ref, got)


def test_breakout_compact_run_equals_float32_run():
    _check_family_member("Breakout-MinAtar")


@pytest.mark.slow
@pytest.mark.parametrize("env_id", [e for e in MINATAR if e != "Breakout-MinAtar"])
def test_minatar_family_compact_run_equals_float32_run(env_id):
    _check_family_member(env_id)


@pytest.mark.parametrize("explore", [False, True])
def test_cnn_policy_acts_identically_on_compact_frames(explore):
    """The CNN casts its input to float32: same params and keys, same actions and outputs
    (greedy and sampled), so nothing the learner sees moves."""
    plain, compact = _pair("Breakout-MinAtar")
    ref_policy = js.CNNPolicy(plain.observation_space, plain.action_space, explore=explore)
    policy = js.CNNPolicy(compact.observation_space, compact.action_space, explore=explore)
    params = ref_policy.init(jax.random.PRNGKey(1))
    _assert_same_run(_rollout(plain, ref_policy, params), _rollout(compact, policy, params))


def test_check_env_accepts_compact_minatar():
    report = js.check_env(js.make("gymnax:Breakout-MinAtar", compact_obs=True))
    assert report.ok, report


# ---------------------------------------------------------------- samplers and learners


def test_device_sampler_episodes_and_batches_hold_the_compact_dtype():
    plain, compact = _pair("Breakout-MinAtar")
    out = {}
    for name, env in (("plain", plain), ("compact", compact)):
        policy = js.RandomPolicy(env.observation_space, env.action_space)
        sampler = js.Sampler(env, policy, num_envs=E, rollout_length=T, seed=5)
        batch = sampler.sample_batch(None)["default_policy"]
        episodes = sampler.sample(None)
        out[name] = (batch, episodes)
    (ref_b, ref_eps), (b, eps) = out["plain"], out["compact"]
    for col in ("obs", "new_obs"):
        assert b[col].dtype == np.uint8 and b[col].nbytes * 4 == ref_b[col].nbytes
        np.testing.assert_array_equal(b[col].astype(np.float32), ref_b[col])
    for col in ("actions", "rewards", "terminateds", "truncateds", "t"):
        np.testing.assert_array_equal(b[col], ref_b[col], err_msg=col)
    assert len(eps) == len(ref_eps) and eps
    for ep, ref in zip(eps, ref_eps, strict=True):
        got = ep.get_observations()
        assert got.dtype == np.uint8
        np.testing.assert_array_equal(got.astype(np.float32), ref.get_observations())
        np.testing.assert_array_equal(ep.get_actions(), ref.get_actions())
        np.testing.assert_array_equal(ep.get_rewards(), ref.get_rewards())


def test_ppo_cnn_update_on_compact_frames_matches_float32():
    """One PPO update of examples/ppo.py's CNN learner (tiny shapes): the loss and the
    gradient on the compact batch equal those on the float32 batch, and the step moves
    the params."""
    from examples import ppo

    cfg = ppo.PPOConfig(
        env_id="gymnax:Breakout-MinAtar",
        num_envs=2,
        rollout_length=8,
        update_epochs=1,
        num_minibatches=1,
        hidden_sizes=(8,),
        activation="relu",
        policy="cnn",
    )
    plain, compact = _pair("Breakout-MinAtar")
    grads, losses = {}, {}
    for name, env in (("plain", plain), ("compact", compact)):
        policy = ppo.make_policy(cfg, env)
        params = policy.init(jax.random.PRNGKey(0))
        init, sample = ppo.jaxsampler_sampler(cfg, env, policy)
        _, batch = jax.jit(sample)(params, init(jax.random.PRNGKey(1)))
        assert batch["obs"].dtype == (np.uint8 if name == "compact" else np.float32)
        flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[3:]), batch)
        loss_fn = ppo.make_loss(cfg, policy)
        losses[name], grads[name] = jax.jit(jax.value_and_grad(loss_fn))(params, flat)
        tx = ppo.make_optimizer(cfg)
        epochs = jax.jit(ppo.make_epochs(cfg, loss_fn, tx))
        new_params, _ = epochs(params, tx.init(params), flat, jax.random.PRNGKey(2))
        moved = jax.tree.leaves(jax.tree.map(lambda a, b: jnp.any(a != b), params, new_params))
        assert any(bool(m) for m in moved)
    assert np.isfinite(losses["compact"])
    np.testing.assert_array_equal(losses["compact"], losses["plain"])
    jax.tree.map(np.testing.assert_array_equal, grads["compact"], grads["plain"])
