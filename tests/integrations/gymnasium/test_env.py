"""js.to_gymnasium(id): Gymnasium's own checker passes on every built-in single-agent env and
warns no more than it does on Gymnasium's own env of the same id; seeding, actions, rendering and
bad input behave as Gymnasium's envs do."""

from __future__ import annotations

import warnings

import gymnasium
import jax
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import jaxsampler as js
from jaxsampler.envs.registry import registered_ids
from jaxsampler.integrations.gymnasium.convert import InvalidActionError

SINGLE_AGENT_IDS = [i for i in registered_ids() if js.make(i).num_agents == 1]


def _checker_warnings(env, **kwargs) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, **kwargs)
    return sorted({str(w.message) for w in caught})


def test_the_single_agent_ids_are_the_builtins_without_the_multi_agent_ones():
    assert set(SINGLE_AGENT_IDS) == {
        "Acrobot-v1",
        "CartPole-v1",
        "MountainCar-v0",
        "MountainCarContinuous-v0",
        "Pendulum-v1",
        "ProcMaze-v0",
    }


@pytest.mark.parametrize("env_id", SINGLE_AGENT_IDS)
def test_check_env_passes_and_warns_no_more_than_gymnasiums_own_env(env_id):
    face = js.to_gymnasium(env_id)
    assert isinstance(face, gymnasium.Env)
    ours = _checker_warnings(face)  # render modes checked through env.spec.make too
    if env_id in gymnasium.registry:
        # Gymnasium's own env of this id: its warnings are the space's (Pendulum's unnormalized
        # action Box), not the face's. Rendering it needs pygame, hence skip_render_check.
        reference = _checker_warnings(gymnasium.make(env_id).unwrapped, skip_render_check=True)
    else:
        reference = []
    assert set(ours) <= set(reference), set(ours) - set(reference)


def test_a_suite_id_passes_check_env_and_keeps_its_info():
    face = js.to_gymnasium("gymnax:CartPole-v1", render_mode="rgb_array")
    assert _checker_warnings(face) == []
    obs, info = face.reset(seed=0)
    assert info == {"discount": np.float32(0.0)}
    _, _, _, _, info = face.step(1)
    assert info == {"discount": np.float32(1.0)} and isinstance(info["discount"], np.float32)


def test_outputs_have_the_spaces_dtypes_and_python_scalars():
    face = js.to_gymnasium("MountainCar-v0")
    obs, info = face.reset(seed=3)
    assert obs.dtype == face.observation_space.dtype == np.float32 and obs.flags.writeable
    assert info == {}
    obs, reward, terminated, truncated, info = face.step(np.int64(2))
    assert obs in face.observation_space
    assert type(reward) is float and reward == -1.0
    assert type(terminated) is bool and type(truncated) is bool
    assert isinstance(face.action_space, gymnasium.spaces.Discrete) and face.action_space.n == 3


def test_seeded_resets_replay_the_same_episode_and_unseeded_ones_continue():
    face = js.to_gymnasium("CartPole-v1")
    actions = [0, 1, 1, 0, 1]

    def episode(seed):
        first, _ = face.reset(seed=seed)
        return [first] + [face.step(a)[0] for a in actions]

    a, b, c = episode(7), episode(7), episode(8)
    np.testing.assert_array_equal(np.stack(a), np.stack(b))
    assert not np.array_equal(a[0], c[0])
    face.reset(seed=7)
    second_1, _ = face.reset()
    face.reset(seed=7)
    second_2, _ = face.reset()
    np.testing.assert_array_equal(second_1, second_2)
    assert not np.array_equal(second_1, a[0])
    # An unseeded first reset draws from OS entropy: two fresh faces differ.
    assert not np.array_equal(js.to_gymnasium("CartPole-v1").reset()[0], a[0])


def test_the_episode_is_the_jaxsampler_envs_own_with_the_chain_keys():
    # Independent of the face: drive the env's own reset/step with the keys the face's chain
    # documents (seed s -> fold_in(key(s), 0); every reset/step takes split(chain)[1]).
    env = js.make("Pendulum-v1")
    face = js.to_gymnasium(env)
    obs, _ = face.reset(seed=11)
    chain = jax.random.fold_in(jax.random.key(11), 0)
    chain, k = jax.random.split(chain)
    state, ts = env.reset(k)
    np.testing.assert_array_equal(obs, np.asarray(ts.obs[0]))
    for torque in (0.5, -1.5, 2.0):
        obs, reward, *_ = face.step(np.array([torque], np.float32))
        chain, k = jax.random.split(chain)
        state, ts = env.step(k, state, np.array([[torque]], np.float32))
        np.testing.assert_allclose(obs, np.asarray(ts.obs[0]), rtol=1e-6, atol=1e-6)
        assert reward == pytest.approx(float(ts.reward[0]), rel=1e-6)


def test_time_limit_from_env_params_truncates_exactly_there():
    env = js.make("CartPole-v1")
    face = js.to_gymnasium(env, env_params=env.default_params.replace(max_steps_in_episode=4))
    face.reset(seed=0)
    flags = [face.step(i % 2)[2:4] for i in range(4)]
    assert flags == [(False, False)] * 3 + [(False, True)]


def test_actions_outside_the_space_raise_and_box_bounds_clip_as_gymnasium():
    face = js.to_gymnasium("CartPole-v1")
    face.reset(seed=0)
    for bad in (2, -1, 1.0, np.array([0, 1]), "left"):
        with pytest.raises(InvalidActionError):
            face.step(bad)
    assert issubclass(InvalidActionError, ValueError)
    assert issubclass(InvalidActionError, gymnasium.error.InvalidAction)
    pend = js.to_gymnasium("Pendulum-v1")
    with pytest.raises(InvalidActionError, match="NaN"):
        pend.reset(seed=0)
        pend.step(np.array([np.nan], np.float32))
    # A torque beyond the bounds is clipped by the env, as Gymnasium's Pendulum does.
    pend.reset(seed=0)
    beyond = pend.step(np.array([5.0], np.float32))
    pend.reset(seed=0)
    at_bound = pend.step(np.array([2.0], np.float32))
    np.testing.assert_array_equal(beyond[0], at_bound[0])
    assert beyond[1] == at_bound[1]


def test_step_or_render_before_reset_and_after_the_end():
    face = js.to_gymnasium("CartPole-v1", render_mode="rgb_array")
    with pytest.raises(gymnasium.error.ResetNeeded):
        face.step(0)
    with pytest.raises(gymnasium.error.ResetNeeded):
        face.render()
    face.reset(seed=0)
    while not face.step(0)[2]:
        pass
    with pytest.warns(UserWarning, match="after the episode ended"):
        face.step(0)


def test_render_is_the_envs_jax_renderer():
    env = js.make("CartPole-v1")
    face = js.to_gymnasium(env, render_mode="rgb_array")
    face.reset(seed=0)
    frame = face.render()
    assert frame.dtype == np.uint8 and frame.shape == (*env.render_shape, 3)
    chain, k = jax.random.split(jax.random.fold_in(jax.random.key(0), 0))
    state, _ = env.reset(k)
    np.testing.assert_array_equal(frame, np.asarray(env.render(state, env.default_params)))
    with pytest.warns(UserWarning, match="without a render mode"):
        assert js.to_gymnasium(env).render() is None


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: js.to_gymnasium("CartPol-v1"), ValueError, "unknown env id.*CartPole-v1"),
        (lambda: js.to_gymnasium("Spread-v0"), TypeError, "multi-agent.*js.Sampler"),
        (lambda: js.to_gymnasium("gym:CartPole-v1"), TypeError, "gymnasium.make"),
        (lambda: js.to_gymnasium(42), TypeError, "env or an env id"),
        (lambda: js.to_gymnasium(js.make("CartPole-v1"), x=1), TypeError, "need an env id"),
        (lambda: js.to_gymnasium("CartPole-v1", 0), ValueError, "num_envs must be >= 1"),
        (lambda: js.to_gymnasium("CartPole-v1", 2.0), TypeError, "num_envs must be an int"),
        (lambda: js.to_gymnasium("CartPole-v1", True), TypeError, "num_envs must be an int"),
        (lambda: js.to_gymnasium("CartPole-v1", render_mode="human"), ValueError, "render_mode"),
        (lambda: js.to_gymnasium("CartPole-v1").reset(seed=-1), ValueError, "seed"),
        (lambda: js.to_gymnasium("CartPole-v1").reset(seed=1.5), TypeError, "seed"),
    ],
)
def test_bad_input_is_a_one_line_error(call, error, match):
    with pytest.raises(error, match=match) as info:
        call()
    assert "\n" not in str(info.value)


def test_gymnasium_is_imported_on_first_use_only(monkeypatch):
    import subprocess
    import sys

    code = "import sys, jaxsampler; assert 'gymnasium' not in sys.modules, 'imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
    monkeypatch.setitem(sys.modules, "gymnasium", None)  # as if not installed
    with pytest.raises(ImportError, match=r'pip install -e "\.\[gymnasium\]"'):
        js.to_gymnasium("CartPole-v1")
