"""The brax adapter against brax itself: the same keys and actions through brax's own jitted
reset/step and through the adapter give the same observations, rewards and flags (the
adapter's time limit cuts the episode; brax's done is termination), js.check_env passes,
a rollout keeps brax's real final observation, and bad input gets clear errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

brax_envs = pytest.importorskip("brax.envs", reason="brax is not installed (extra 'brax')")

import jaxsampler as js  # noqa: E402
from jaxsampler.envs.adapters import brax as adapter  # noqa: E402

LIMIT = 5  # tiny time limit: an 8-step drive crosses it
NAME = "inverted_pendulum"


@pytest.fixture(scope="module")
def env():
    return js.make(f"brax:{NAME}", episode_length=LIMIT)


@pytest.fixture(scope="module")
def jitted(env):
    return jax.jit(env.reset), jax.jit(env.step)


def _actions(n: int) -> np.ndarray:
    # In range, so the adapter's clip leaves them as brax gets them.
    return np.random.default_rng(0).uniform(-1, 1, (n, 1, 1)).astype(np.float32)


def test_spaces_and_params(env):
    assert env.name == f"brax:{NAME}" and env.num_agents == 1
    assert env.backend == adapter.DEFAULT_BACKEND
    assert env.default_params.max_steps_in_episode == LIMIT
    obs, act = env.observation_space, env.action_space
    assert obs.shape == (env.env.observation_size,) and obs.dtype == np.float32
    assert np.all(np.isinf(obs.low)) and np.all(np.isinf(obs.high))
    assert act.shape == (env.env.action_size,) and act.dtype == np.float32
    assert np.all(act.low == -1) and np.all(act.high == 1)
    assert not env.can_render
    assert js.make(f"brax:{NAME}").default_params.max_steps_in_episode == 1000


def test_bit_exact_against_brax_across_the_time_limit(env, jitted):
    reset, step = jitted
    b_reset, b_step = jax.jit(env.env.reset), jax.jit(env.env.step)
    key = jax.random.PRNGKey(3)
    state, ts = reset(key)
    b = b_reset(key)
    np.testing.assert_array_equal(ts.obs[0], b.obs)
    assert ts.reward.shape == (1,) and float(ts.reward[0]) == 0.0
    assert not ts.terminated[0] and not ts.truncated[0] and ts.acting[0]
    for t, a in enumerate(_actions(LIMIT + 3)):
        state, ts = step(jax.random.PRNGKey(100 + t), state, jnp.asarray(a))
        b = b_step(b, jnp.asarray(a[0]))
        np.testing.assert_array_equal(ts.obs[0], b.obs)
        np.testing.assert_array_equal(ts.reward[0], b.reward)
        assert bool(ts.terminated[0]) == bool(b.done)
        # The adapter's own limit, independent of brax's done.
        assert bool(ts.truncated[0]) == (t + 1 >= LIMIT)
        assert int(state.time) == t + 1
        # info: brax's metrics, same structure as at reset.
        assert set(ts.info["metrics"]) == set(b.metrics)


def test_params_change_the_limit_without_new_env(env, jitted):
    reset, step = jitted
    state, _ = reset(jax.random.PRNGKey(0))
    params = adapter.BraxParams(max_steps_in_episode=jnp.int32(2))
    flags = []
    for a in _actions(3):
        state, ts = step(jax.random.PRNGKey(0), state, jnp.asarray(a), params)
        flags.append(bool(ts.truncated[0]))
    assert flags == [False, True, True]


def test_actions_are_clipped_to_the_box(env, jitted):
    reset, step = jitted
    state, _ = reset(jax.random.PRNGKey(1))
    _, ts = step(jax.random.PRNGKey(0), state, jnp.full((1, 1), 7.0))
    b = jax.jit(env.env.step)(state.brax, jnp.ones((1,)))
    np.testing.assert_array_equal(ts.obs[0], b.obs)


@pytest.mark.slow
def test_rollout_keeps_brax_final_observation(env):
    """Each env's first episode in a rollout, replayed in brax with the rollout's actions:
    every observation up to the episode's end is brax's own (the last one is brax's real
    final observation, not a reset), the end flags are brax's ``done`` / the time limit,
    and the step after the end is the reset step."""
    policy = js.MLPPolicy(env.observation_space, env.action_space, (8,))
    rollout = js.make_rollout(env, policy, num_envs=2, rollout_length=LIMIT + 3)
    state0 = rollout.init(jax.random.PRNGKey(0))
    start = jax.tree.map(np.array, state0.env_state.brax)  # a host copy: the call donates
    _, traj = rollout(policy.init(jax.random.PRNGKey(1)), state0)
    b_step = jax.jit(env.env.step)
    for e in range(2):
        b = jax.tree.map(lambda x, e=e: jnp.asarray(x[e]), start)
        t = 0
        while True:  # replay until the episode ends (the pole falls or the limit cuts it)
            b = b_step(b, jnp.clip(traj.actions[t, e, 0], -1, 1))
            np.testing.assert_array_equal(traj.obs[t + 1, e, 0], b.obs)
            assert bool(traj.terminated[t, e, 0]) == bool(b.done > 0)
            assert bool(traj.truncated[t, e, 0]) == (t + 1 >= LIMIT)
            if bool(traj.terminated[t, e, 0] | traj.truncated[t, e, 0]):
                break
            t += 1
        assert t < LIMIT
        assert bool(traj.is_reset[t + 1, e]) and not bool(traj.acting[t + 1, e, 0])
        assert not np.array_equal(traj.obs[t + 1, e, 0], traj.obs[t + 2, e, 0])


@pytest.mark.slow
def test_check_env(env):
    report = js.check_env(env, num_envs=2)
    assert report.ok, str(report)


# ------------------------------------------------------------------------- bad input


def test_unknown_id_lists_brax_ids():
    with pytest.raises(ValueError, match="unknown brax env id 'nope'") as e:
        js.make("brax:nope")
    for name in ("ant", "humanoid", "inverted_pendulum"):
        assert name in str(e.value)
    with pytest.raises(ValueError, match="Did you mean 'brax:hopper'"):
        js.make("brax:hoper")


def test_unknown_backend_and_bad_length():
    with pytest.raises(ValueError, match="unknown brax backend 'warp'.*generalized"):
        js.make(f"brax:{NAME}", backend="warp")
    with pytest.raises(ValueError, match="positive int"):
        js.make(f"brax:{NAME}", episode_length=0)


def test_wrong_suite_is_a_type_error():
    gymnax = pytest.importorskip("gymnax", reason="gymnax is not installed")
    gym_env, _ = gymnax.make("CartPole-v1")
    with pytest.raises(TypeError, match="from_brax expected a brax env.*gymnax"):
        js.envs.from_brax(gym_env)
    with pytest.raises(TypeError, match="from_brax expected a brax env"):
        js.envs.from_brax(object())
    with pytest.raises(TypeError, match="needs no adapter"):
        js.envs.from_brax(js.make("CartPole-v1"))


def test_training_wrappers_are_refused(env):
    from brax.envs.wrappers import training

    raw = env.env
    wrapped = {
        "EpisodeWrapper": training.EpisodeWrapper(raw, 10, 1),
        "AutoResetWrapper": training.AutoResetWrapper(training.EpisodeWrapper(raw, 10, 1)),
        "VmapWrapper": training.VmapWrapper(raw),
    }
    for name, w in wrapped.items():
        with pytest.raises(ValueError, match=f"{name}.*env.unwrapped"):
            js.envs.from_brax(w)
    # The documented way out: the raw env, with the limit in the adapter's params.
    ok = js.envs.from_brax(wrapped["AutoResetWrapper"].unwrapped, episode_length=10)
    assert ok.env is raw and ok.default_params.max_steps_in_episode == 10
    with pytest.raises(ValueError, match="not both"):
        js.envs.from_brax(raw, adapter.BraxParams(), episode_length=3)


def test_missing_brax_is_an_import_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "brax", None)  # import brax now raises ImportError
    with pytest.raises(ImportError, match=r'pip install -e "\.\[brax\]"'):
        adapter.make_brax(NAME)
