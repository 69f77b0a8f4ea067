"""js.to_gymnasium(id, num_envs=N) against Gymnasium's own SyncVectorEnv over N single faces:
the same observations, rewards, flags and infos, bit for bit, under both auto-reset modes
(final observations where Gymnasium puts them), for seeds, masked resets and frames; plus the
auto-reset rules checked directly at a time limit, and one trace for all N envs."""

from __future__ import annotations

import dataclasses

import gymnasium
import jax
import numpy as np
import pytest
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import jaxsampler as js
from jaxsampler.envs.cartpole import CartPole
from jaxsampler.integrations.gymnasium import kernels
from jaxsampler.integrations.gymnasium.convert import InvalidActionError

N = 4
MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP]


def _cartpole(limit):
    env = js.make("CartPole-v1")
    return env, env.default_params.replace(max_steps_in_episode=limit)


def _pendulum(limit):
    env = js.make("Pendulum-v1")
    return env, env.default_params.replace(max_steps_in_episode=limit)


def _gymnax_cartpole(limit):
    env = js.make("gymnax:CartPole-v1")
    return env, env.default_params.replace(max_steps_in_episode=limit)


# (env, params) builders: short time limits, so that episodes end by termination and by
# truncation within a few dozen steps; gymnax's CartPole reports an info ("discount").
ENVS = {"CartPole": _cartpole, "Pendulum": _pendulum, "gymnax-CartPole": _gymnax_cartpole}
LIMITS = {"CartPole": 15, "Pendulum": 6, "gymnax-CartPole": 12}


def _pair(name, mode, render_mode=None):
    env, params = ENVS[name](LIMITS[name])
    ours = js.to_gymnasium(env, N, env_params=params, autoreset_mode=mode, render_mode=render_mode)
    reference = SyncVectorEnv(
        [
            lambda: js.to_gymnasium(env, env_params=params, render_mode=render_mode)
            for _ in range(N)
        ],
        autoreset_mode=mode,
    )
    return ours, reference


def _same(ours, ref, what):
    assert data_equivalence(ours, ref, exact=True), f"{what}:\nours {ours!r}\nref  {ref!r}"


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("name", list(ENVS))
def test_steps_equal_sync_vector_env_over_single_faces(name, mode):
    ours, ref = _pair(name, mode)
    assert ours.metadata["autoreset_mode"] == ref.metadata["autoreset_mode"] == mode
    assert ours.single_observation_space == ref.single_observation_space
    assert ours.action_space == ref.action_space
    assert ours.observation_space == ref.observation_space
    _same(ours.reset(seed=5), ref.reset(seed=5), "reset")
    rng = np.random.default_rng(0)
    ended = {"terminated": 0, "truncated": 0}
    for t in range(40):
        if name == "Pendulum":
            actions = rng.uniform(-2, 2, (N, 1)).astype(np.float32)
        else:
            actions = rng.integers(0, 2, N)
        out, expected = ours.step(actions), ref.step(actions)
        for part, a, b in zip(
            ("obs", "reward", "term", "trunc", "infos"), out, expected, strict=True
        ):
            _same(a, b, f"step {t} {part}")
        ended["terminated"] += int(out[2].sum())
        ended["truncated"] += int(out[3].sum())
        if t == 20:  # unseeded resets continue each env's chain
            _same(ours.reset(), ref.reset(), "reset()")
    assert ended["truncated"] > 0
    assert name == "Pendulum" or ended["terminated"] > 0


def test_seed_lists_and_masked_resets_equal_sync_vector_env():
    ours, ref = _pair("CartPole", AutoresetMode.NEXT_STEP)
    _same(ours.reset(seed=0), ref.reset(seed=0), "reset(seed=0)")
    _same(ours.step(np.ones(N, int)), ref.step(np.ones(N, int)), "step")
    seeds = [3, None, 9, None]  # None: that env continues its chain
    _same(ours.reset(seed=seeds), ref.reset(seed=seeds), "reset(seed=list)")
    for t in range(6):
        actions = np.array([t % 2, 1, 0, 1])
        _same(ours.step(actions), ref.step(actions), f"step {t}")
    mask = np.array([False, True, False, True])
    out = ours.reset(seed=[None, 4, None, 6], options={"reset_mask": mask})
    expected = ref.reset(seed=[None, 4, None, 6], options={"reset_mask": mask})
    _same(out, expected, "masked reset")
    for t in range(6):
        _same(ours.step(np.ones(N, int)), ref.step(np.ones(N, int)), f"after mask {t}")


def test_render_frames_equal_the_single_faces():
    ours, ref = _pair("CartPole", AutoresetMode.NEXT_STEP, render_mode="rgb_array")
    ours.reset(seed=1), ref.reset(seed=1)
    for _ in range(3):
        ours.step(np.zeros(N, int)), ref.step(np.zeros(N, int))
    frames = ours.render()
    assert isinstance(frames, tuple) and len(frames) == N
    assert frames[0].dtype == np.uint8 and frames[0].shape == (200, 300, 3)
    _same(frames, ref.render(), "frames")
    assert not np.array_equal(frames[0], frames[1])


def _is_cartpole_start(obs):
    return bool(np.all(np.abs(obs) <= 0.05))


def test_next_step_rule_at_a_time_limit():
    # Gymnasium's NEXT_STEP rule, checked directly: the limit step returns the final
    # observation with truncated set; the next step ignores the action and returns a new
    # episode's first observation with reward 0 and both flags False.
    env, params = _cartpole(5)
    envs = js.to_gymnasium(env, N, env_params=params)
    envs.reset(seed=0)
    for _ in range(4):
        obs, reward, term, trunc, _ = envs.step(np.array([0, 1, 0, 1]))
    obs, reward, term, trunc, infos = envs.step(np.array([0, 1, 0, 1]))
    assert trunc.all() and not term.any() and (reward == 1.0).all()
    assert not any(_is_cartpole_start(o) for o in obs)
    obs, reward, term, trunc, infos = envs.step(np.array([1, 1, 1, 1]))
    assert (reward == 0.0).all() and not term.any() and not trunc.any()
    assert reward.dtype == np.float64 and term.dtype == trunc.dtype == np.bool_
    assert all(_is_cartpole_start(o) for o in obs) and infos == {}


def test_same_step_rule_at_a_time_limit():
    env, params = _cartpole(5)
    envs = js.to_gymnasium(env, N, env_params=params, autoreset_mode="SameStep")
    envs.reset(seed=0)
    for _ in range(4):
        last, *_ = envs.step(np.array([0, 1, 0, 1]))
    obs, reward, term, trunc, infos = envs.step(np.array([0, 1, 0, 1]))
    assert trunc.all() and (reward == 1.0).all()
    assert all(_is_cartpole_start(o) for o in obs)  # already the next episode
    assert infos["_final_obs"].all() and infos["_final_info"].all() and infos["final_info"] == {}
    assert not any(_is_cartpole_start(o) for o in infos["final_obs"])
    # the final observation is one step on from the last one (x moves by tau * x_dot)
    for final, prev in zip(infos["final_obs"], last, strict=True):
        assert final[0] == pytest.approx(prev[0] + 0.02 * prev[1], abs=1e-6)


def test_all_envs_step_in_one_trace_of_one_jitted_call():
    traces = []

    @dataclasses.dataclass(frozen=True)
    class TracedCartPole(CartPole):
        def step_env(self, key, state, action, params):
            traces.append(1)  # runs while tracing only
            return super().step_env(key, state, action, params)

    envs = js.to_gymnasium(TracedCartPole(), 16)
    envs.reset(seed=0)
    envs.step(np.zeros(16, int))
    size = kernels.step_next._cache_size()
    for t in range(10):
        envs.step(np.full(16, t % 2))
    assert len(traces) == 1 and kernels.step_next._cache_size() == size


def test_vector_bad_input():
    envs = js.to_gymnasium("CartPole-v1", 2)
    with pytest.raises(gymnasium.error.ResetNeeded):
        envs.step(np.zeros(2, int))
    envs.reset(seed=0)
    with pytest.raises(InvalidActionError, match="shape"):
        envs.step(np.zeros(3, int))
    with pytest.raises(InvalidActionError, match="outside"):
        envs.step(np.array([0, 2]))
    with pytest.raises(ValueError, match="reset_mask"):
        envs.reset(options={"reset_mask": np.zeros(2, bool)})
    with pytest.raises(ValueError, match="2 seeds"):
        envs.reset(seed=[1, 2, 3])
    with pytest.raises(ValueError, match="AutoresetMode"):
        js.to_gymnasium("CartPole-v1", 2, autoreset_mode="Disabled")
    with pytest.raises(ValueError, match="env_params"):
        env = js.make("CartPole-v1")
        params = env.default_params.replace(max_steps_in_episode=np.arange(3))
        js.to_gymnasium(env, 2, env_params=params)


def test_per_env_params_give_each_env_its_own_time_limit():
    env = js.make("CartPole-v1")
    limits = np.array([2, 3], np.int32)
    params = env.default_params.replace(max_steps_in_episode=limits)
    envs = js.to_gymnasium(env, 2, env_params=params)
    envs.reset(seed=0)
    truncs = [envs.step(np.zeros(2, int))[3].tolist() for _ in range(3)]
    assert truncs == [[False, False], [True, False], [False, True]]
    assert isinstance(jax.tree.leaves(envs.env_params)[0], jax.Array)
