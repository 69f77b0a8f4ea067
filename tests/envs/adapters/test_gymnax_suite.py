"""Every registered gymnax env through ``js.make("gymnax:<id>")`` and ``js.check_env``.

* ``test_check_env_outcome`` (here and, for MinAtar, in ``test_gymnax_suite_minatar.py``):
  ``check_env``'s verdict on each env equals :data:`EXPECTED`
  ("ok", or a substring of the one problem it reports), so a new false positive and a
  fixed gymnax defect both fail the test.
* ``test_matches_gymnax_by_hand``: for a few envs, the adapter's jitted ``reset``/``step``
  against gymnax's own ``reset_env``/``step_env``/``is_truncated`` (jitted separately, on
  an independently built env object) with the same keys and actions: obs, reward,
  terminated and truncated bit for bit.
"""

from __future__ import annotations

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler import spaces as S

#: Envs left out of the sweep, with the reason (printed by the skip).
EXCLUDED = {
    "MNISTBandit-bsuite": "downloads the MNIST data set at construction (no network in CI)",
}

#: check_env's outcome per env: "ok", or a substring of the problem it reports.
EXPECTED = {
    "CartPole-v1": "ok",
    "Pendulum-v1": "ok",
    "Acrobot-v1": "ok",
    "MountainCar-v0": "ok",
    "MountainCarContinuous-v0": "ok",
    "Asterix-MinAtar": "ok",
    "Breakout-MinAtar": "ok",
    "Freeway-MinAtar": "ok",
    "Seaquest-MinAtar": "ok",
    "SpaceInvaders-MinAtar": "ok",
    "Catch-bsuite": "ok",  # adapter declares the float32 gymnax really emits
    "DeepSea-bsuite": "ok",
    # gymnax's defect: the time-remaining entry is 1 - time / memory_length, which XLA
    # compiles to -1.49e-8 (not 0) on the last step, below the (correct) low of 0.
    "MemoryChain-bsuite": "observation outside Box",
    # gymnax's defect: the same 1 - time / chain_length rounding (-1.49e-8 on the last step).
    "UmbrellaChain-bsuite": "observation outside Box",
    "DiscountingChain-bsuite": "ok",
    "SimpleBandit-bsuite": "ok",
    "FourRooms-misc": "ok",  # adapter declares the int32 gymnax really emits
    "MetaMaze-misc": "ok",  # adapter widens the last-reward bound
    "PointRobot-misc": "ok",
    "BernoulliBandit-misc": "ok",
    "GaussianBandit-misc": "ok",  # adapter declares the real bounds
    "Reacher-misc": "ok",
    "Swimmer-misc": "ok",
    "Pong-misc": "ok",
    "FrozenLake-misc": "ok",
}

#: Small check_env shapes: enough for every listed problem to show (all by step 64).
CHECK_ARGS = {"num_envs": 2, "num_steps": 64}


def test_table_covers_every_registered_env():
    assert set(EXPECTED) | set(EXCLUDED) == set(gymnax.registered_envs)


#: The MinAtar part of the sweep (the slowest to compile) runs from its own file,
#: tests/envs/adapters/test_gymnax_suite_minatar.py, so that the two test workers share the sweep.
MINATAR = [e for e in gymnax.registered_envs if e.endswith("-MinAtar")]


def assert_outcome(env_id: str) -> None:
    """``check_env`` on ``gymnax:<env_id>`` reports what :data:`EXPECTED` says."""
    if env_id in EXCLUDED:
        pytest.skip(f"{env_id} left out: {EXCLUDED[env_id]}")
    report = js.check_env(js.make(f"gymnax:{env_id}"), **CHECK_ARGS)
    want = EXPECTED[env_id]
    if want == "ok":
        assert report.ok, str(report)
    else:
        assert len(report.problems) == 1 and want in report.problems[0], str(report)


@pytest.mark.slow
@pytest.mark.parametrize("env_id", [e for e in gymnax.registered_envs if e not in MINATAR])
def test_check_env_outcome(env_id):
    assert_outcome(env_id)


# --------------------------------------------------------------------------- by hand

BY_HAND = ["Reacher-misc", "Breakout-MinAtar", "Catch-bsuite", "GaussianBandit-misc"]
NUM_STEPS = 12


def _actions(space: S.Space, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    if isinstance(space, S.Discrete):
        return [np.int32(rng.integers(space.n)) for _ in range(n)]
    assert isinstance(space, S.Box)
    return [rng.uniform(space.low, space.high).astype(space.dtype) for _ in range(n)]


@pytest.mark.parametrize("env_id", BY_HAND)
def test_matches_gymnax_by_hand(env_id):
    ours = js.make(f"gymnax:{env_id}")
    ref, params = gymnax.make(env_id)  # independent of the adapter's env object
    params = params.replace(max_steps_in_episode=NUM_STEPS // 2)  # truncation shows up

    def ref_step(key, state, action):
        obs, state, reward, terminated, _ = ref.step_env(key, state, action, params)
        return obs, state, reward, terminated, ref.is_truncated(state, params)

    reset, step = jax.jit(ours.reset), jax.jit(ours.step)
    ref_reset, ref_step_j = jax.jit(ref.reset_env), jax.jit(ref_step)
    key = jax.random.PRNGKey(3)
    state, ts = reset(key, params)
    obs, ref_state = ref_reset(key, params)
    np.testing.assert_array_equal(ts.obs[0], obs)
    assert ts.obs.dtype == ours.observation_space.zeros().dtype
    for t, action in enumerate(_actions(ours.action_space, NUM_STEPS)):
        k = jax.random.fold_in(key, t)
        state, ts = step(k, state, jnp.asarray(action)[None], params)
        obs, ref_state, reward, terminated, truncated = ref_step_j(k, ref_state, action)
        np.testing.assert_array_equal(ts.obs[0], obs)
        np.testing.assert_array_equal(ts.reward[0], np.float32(reward))
        assert bool(ts.terminated[0]) == bool(terminated)
        assert bool(ts.truncated[0]) == bool(truncated)
        if bool(terminated) or bool(truncated):  # no auto-reset here: restart both by hand
            key = jax.random.fold_in(key, 1000 + t)
            state, ts = reset(key, params)
            obs, ref_state = ref_reset(key, params)
            np.testing.assert_array_equal(ts.obs[0], obs)


def test_spaces_built_from_concrete_params():
    """Reacher's gymnax action space is built with jnp.array (tracers under jit): the
    adapter's spaces are concrete and usable inside a jitted function."""
    env = js.make("gymnax:Reacher-misc")
    assert env.action_space == S.Box(-1.0, 1.0, (2,))
    out = jax.jit(lambda k: env.action_space.sample(k))(jax.random.PRNGKey(0))
    assert out.shape == (2,)
    with pytest.raises(TypeError, match="traced bounds"):
        jax.jit(lambda p: S.from_gymnax_space(env.env.action_space(p)))(env.params)


def test_declared_dtypes_are_emitted():
    for env_id, dtype in (("Catch-bsuite", np.float32), ("FourRooms-misc", np.int32)):
        env = js.make(f"gymnax:{env_id}")
        _, ts = jax.jit(env.reset)(jax.random.PRNGKey(0))
        assert env.observation_space.dtype == dtype == ts.obs.dtype
