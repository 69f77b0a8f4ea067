"""The five classic-control envs against Gymnasium's reference implementations.

Parity tests use *teacher forcing*: before every step the jaxsampler state is set to
Gymnasium's (float64) state, rounded to float32, so float32 error never accumulates
and every step checks the dynamics from a known state. Gymnasium is stepped through
``gymnasium.make`` so its ``TimeLimit`` decides ``truncated``; the jaxsampler state's
``time`` is set to the number of steps Gymnasium has taken.

A few flags can legitimately differ between float32 and float64: when Gymnasium's new
state lies within ``THRESHOLD_TOL`` of a discontinuity (a termination threshold, or
MountainCar's left wall, which zeroes the velocity), that step is not compared. Every
parity test counts the steps it compared and asserts that skips are rare.

Each env's ``reset`` and ``step`` are jitted once (``_compiled``) and always called with
the same argument signature (params passed explicitly), so the file compiles ten
functions in all.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import zlib
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")

from jaxsampler.envs import Acrobot, CartPole, MountainCar, MountainCarContinuous, Pendulum  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5
#: Steps whose new (float64) state lies closer than this to a discontinuity are skipped.
THRESHOLD_TOL = 1e-5
KEY = jax.random.key(0)
PI = math.pi


def _wrap_pi(x):
    return (np.asarray(x) + PI) % (2 * PI) - PI


def _uniform(low, high):
    return lambda rng: rng.uniform(np.asarray(low, np.float64), np.asarray(high, np.float64))


# --- per-env knowledge: state layout, samplers, thresholds --------------------------


def _cartpole_edge(rng):
    # Cart or pole just inside/outside its threshold, moving either way.
    x = rng.choice([-1, 1]) * rng.uniform(2.3, 2.45)
    theta = rng.choice([-1, 1]) * rng.uniform(0.18, 0.23)
    if rng.random() < 0.5:
        x = rng.uniform(-1, 1)
    else:
        theta = rng.uniform(-0.1, 0.1)
    return np.array([x, rng.uniform(-3, 3), theta, rng.uniform(-3, 3)])


def _cartpole_margin(s):
    return min(abs(abs(s[0]) - 2.4), abs(abs(s[2]) - 12 * 2 * PI / 360))


def _pendulum_edge(rng):
    # Speed at the clip bound, angle at the wrap point of the cost.
    return np.array(
        [
            rng.choice([-1, 1]) * PI + rng.uniform(-0.05, 0.05),
            rng.choice([-1, 1]) * rng.uniform(7.5, 8.0),
        ]
    )


def _car_edge(goal):
    def sample(rng):
        if rng.random() < 0.5:  # close to the goal
            return np.array([rng.uniform(goal - 0.1, goal), rng.uniform(-0.01, 0.07)])
        return np.array([rng.uniform(-1.2, -1.1), rng.uniform(-0.07, 0.0)])  # the left wall

    return sample


def _car_margin(goal):
    def margin(s):
        pos, vel = float(s[0]), float(s[1])
        m = abs(pos - goal)
        if pos >= goal - THRESHOLD_TOL:
            m = min(m, abs(vel))
        # Exactly on the wall (Gymnasium's MountainCarContinuous keeps a float32 state)
        # is no ambiguity: both implementations clipped.
        if pos not in (-1.2, float(np.float32(-1.2))):
            m = min(m, abs(pos + 1.2))
        return m

    return margin


def _acrobot_height(s):
    return -math.cos(s[0]) - math.cos(s[1] + s[0])


def _acrobot_edge(rng):
    # Tip height near the termination height 1: needs |theta1| >= pi / 2.
    t1 = rng.choice([-1, 1]) * rng.uniform(PI / 2, PI)
    c = np.clip(-math.cos(t1) - rng.uniform(0.7, 1.3), -1.0, 1.0)
    t2 = _wrap_pi(rng.choice([-1, 1]) * math.acos(c) - t1)
    return np.array([t1, t2, rng.uniform(-1, 1), rng.uniform(-1, 1)])


@dataclasses.dataclass(frozen=True)
class Spec:
    make: Callable
    fields: tuple[str, ...]  # jaxsampler state fields, in the order of Gymnasium's state
    reset_low: tuple[float, ...]
    reset_high: tuple[float, ...]
    random_state: Callable  # rng -> float64 state, a wide spread of valid states
    edge_state: Callable  # rng -> float64 state near a threshold or bound
    margin: Callable  # new Gymnasium state -> distance to a discontinuity
    terminal_state: tuple[float, ...] | None  # a state whose next step surely terminates
    angle_fields: tuple[str, ...] = ()  # state fields wrapped into [-pi, pi]


SPECS: dict[str, Spec] = {
    "CartPole-v1": Spec(
        CartPole,
        ("x", "x_dot", "theta", "theta_dot"),
        (-0.05,) * 4,
        (0.05,) * 4,
        _uniform([-2.4, -3, -0.21, -3], [2.4, 3, 0.21, 3]),
        _cartpole_edge,
        _cartpole_margin,
        (2.39, 3.0, 0.0, 0.0),
    ),
    "Pendulum-v1": Spec(
        Pendulum,
        ("theta", "theta_dot"),
        (-PI, -1.0),
        (PI, 1.0),
        _uniform([-3 * PI, -8], [3 * PI, 8]),
        _pendulum_edge,
        lambda s: math.inf,
        None,
    ),
    "MountainCar-v0": Spec(
        MountainCar,
        ("position", "velocity"),
        (-0.6, 0.0),
        (-0.4, 0.0),
        _uniform([-1.2, -0.07], [0.5, 0.07]),
        _car_edge(0.5),
        _car_margin(0.5),
        (0.49, 0.07),
    ),
    "MountainCarContinuous-v0": Spec(
        MountainCarContinuous,
        ("position", "velocity"),
        (-0.6, 0.0),
        (-0.4, 0.0),
        _uniform([-1.2, -0.07], [0.45, 0.07]),
        _car_edge(0.45),
        _car_margin(0.45),
        (0.44, 0.07),
    ),
    "Acrobot-v1": Spec(
        Acrobot,
        ("theta1", "theta2", "dtheta1", "dtheta2"),
        (-0.1,) * 4,
        (0.1,) * 4,
        _uniform([-PI, -PI, -4 * PI, -9 * PI], [PI, PI, 4 * PI, 9 * PI]),
        _acrobot_edge,
        lambda s: abs(_acrobot_height(s) - 1.0),
        (PI, 0.0, 0.0, 0.0),
        angle_fields=("theta1", "theta2"),
    ),
}
ENV_IDS = list(SPECS)


#: How often each jitted entry point was traced (one trace = one compilation).
TRACES: collections.Counter = collections.Counter()


def _counted(fn: Callable, name: tuple[str, str]) -> Callable:
    def traced(*args):
        TRACES[name] += 1
        return fn(*args)

    return traced


@functools.cache
def _compiled(env_id: str):
    """The env and its jitted ``reset`` / ``step``, built once per env for the whole file."""
    env = SPECS[env_id].make()
    reset = jax.jit(_counted(env.reset, (env_id, "reset")))
    step = jax.jit(_counted(env.step, (env_id, "step")))
    return env, reset, step


def _rng(env_id: str, salt: str = "") -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(f"{env_id}/{salt}".encode()))


def _sample_action(env, rng: np.random.Generator, scale: float = 1.0):
    """A random action as (Gymnasium action, jaxsampler action with the agent axis)."""
    space = env.action_space
    if hasattr(space, "n"):
        a = int(rng.integers(space.n))
        return a, np.array([a], np.int32)
    a = (rng.uniform(space.low, space.high) * scale).astype(np.float32)
    return a, a[None]


def _js_state(template, spec: Spec, gym_state, time: int):
    values = np.asarray(gym_state, np.float64)
    fields = {f: np.float32(v) for f, v in zip(spec.fields, values, strict=True)}
    return template.replace(time=np.int32(time), **fields)


def _assert_state_close(spec: Spec, js_state, gym_state):
    gym_state = np.asarray(gym_state, np.float64)
    for f, g in zip(spec.fields, gym_state, strict=True):
        diff = float(getattr(js_state, f)) - g
        if f in spec.angle_fields and abs(g) > PI - THRESHOLD_TOL:
            # An angle wrapped into [-pi, pi] may land on the other end in float32.
            diff = float(_wrap_pi(diff))
        assert abs(diff) <= ATOL + RTOL * abs(g), f"state.{f}: {float(getattr(js_state, f))} vs {g}"


def _run_parity(
    env_id: str, starts: list, max_steps: int, rng: np.random.Generator, action_scale=1.0
):
    """Teacher-forced lockstep of jaxsampler and Gymnasium; returns per-step outcomes.

    ``starts`` are float64 initial states, or ``None`` to keep Gymnasium's reset state.
    Each episode runs until Gymnasium ends it or for ``max_steps`` steps.
    """
    env, reset, step = _compiled(env_id)
    spec = SPECS[env_id]
    params = env.default_params
    template, _ = reset(KEY, params)
    gym_env = gym.make(env_id, disable_env_checker=True)
    outcomes = {"compared": 0, "skipped": 0, "terminated": 0, "truncated": 0}
    for i, start in enumerate(starts):
        gym_env.reset(seed=int(rng.integers(2**31)))
        if start is not None:
            gym_env.unwrapped.state = np.array(start, np.float64)
        for t in range(max_steps):
            state = _js_state(template, spec, gym_env.unwrapped.state, t)
            gym_action, js_action = _sample_action(env, rng, action_scale)
            g_obs, g_rew, g_term, g_trunc, _ = gym_env.step(gym_action)
            new_state, ts = step(KEY, state, js_action, params)
            g_state = np.asarray(gym_env.unwrapped.state, np.float64)
            where = f"{env_id} episode {i} step {t} from {start}, action {gym_action}"
            if spec.margin(g_state) < THRESHOLD_TOL:
                outcomes["skipped"] += 1
            else:
                outcomes["compared"] += 1
                np.testing.assert_allclose(np.asarray(ts.obs[0]), g_obs, RTOL, ATOL, err_msg=where)
                np.testing.assert_allclose(float(ts.reward[0]), g_rew, RTOL, ATOL, err_msg=where)
                assert bool(ts.terminated[0]) == g_term, where
                assert bool(ts.truncated[0]) == g_trunc, where
                _assert_state_close(spec, new_state, g_state)
                assert int(new_state.time) == t + 1
                outcomes["terminated"] += int(g_term)
                outcomes["truncated"] += int(g_trunc)
            if g_term or g_trunc:
                break
    gym_env.close()
    return outcomes


# --- parity ---------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_parity_random_states(env_id):
    """Short teacher-forced runs from random states across the state space."""
    rng = _rng(env_id, "random")
    spec = SPECS[env_id]
    starts = [spec.random_state(rng) for _ in range(48)]
    out = _run_parity(env_id, starts, max_steps=8, rng=rng)
    assert out["compared"] >= 100
    assert out["skipped"] <= out["compared"] // 50


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_parity_near_thresholds(env_id):
    """States close to termination thresholds, clip bounds and walls, on both sides."""
    rng = _rng(env_id, "edge")
    spec = SPECS[env_id]
    starts = [spec.edge_state(rng) for _ in range(64)]
    out = _run_parity(env_id, starts, max_steps=3, rng=rng)
    assert out["compared"] >= 64
    assert out["skipped"] <= out["compared"] // 20
    if spec.terminal_state is not None:
        # The edge states really straddle the threshold: some end, some go on.
        assert 0 < out["terminated"] < out["compared"]


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_parity_full_episode_from_reset(env_id):
    """Whole episodes from Gymnasium's reset, random actions, up to the time limit."""
    rng = _rng(env_id, "episode")
    env, _, _ = _compiled(env_id)
    limit = env.default_params.max_steps_in_episode
    out = _run_parity(env_id, [None, None], max_steps=limit + 1, rng=rng)
    assert out["terminated"] + out["truncated"] >= 1
    if env_id in ("Pendulum-v1", "MountainCar-v0", "MountainCarContinuous-v0"):
        # Random actions never reach these goals, so both episodes hit the time limit
        # and the truncation flag was compared at step `limit` against TimeLimit's.
        assert out["truncated"] == 2 and out["compared"] == 2 * limit


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "MountainCarContinuous-v0"])
def test_parity_out_of_range_actions(env_id):
    """Box actions outside the space are clipped the way Gymnasium clips them."""
    rng = _rng(env_id, "clip")
    spec = SPECS[env_id]
    starts = [spec.random_state(rng) for _ in range(16)]
    out = _run_parity(env_id, starts, max_steps=4, rng=rng, action_scale=3.0)
    assert out["compared"] >= 16


@pytest.mark.parametrize("env_id", [e for e in ENV_IDS if SPECS[e].terminal_state is not None])
def test_terminal_state_terminates(env_id):
    env, reset, step = _compiled(env_id)
    spec = SPECS[env_id]
    params = env.default_params
    template, _ = reset(KEY, params)
    gym_env = gym.make(env_id, disable_env_checker=True).unwrapped
    if hasattr(env.action_space, "n"):
        actions = [(a, np.array([a], np.int32)) for a in range(env.action_space.n)]
    else:
        actions = [
            (np.array([u], np.float32), np.array([[u]], np.float32)) for u in (-1.0, 0.0, 1.0)
        ]
    for gym_action, js_action in actions:
        gym_env.reset(seed=0)
        gym_env.state = np.array(spec.terminal_state, np.float64)
        _, g_rew, g_term, _, _ = gym_env.step(gym_action)
        _, ts = step(KEY, _js_state(template, spec, spec.terminal_state, 0), js_action, params)
        assert g_term and bool(ts.terminated[0]) and not bool(ts.truncated[0])
        assert float(ts.reward[0]) == pytest.approx(g_rew)


# --- time limit -----------------------------------------------------------------------


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_default_time_limit_matches_gymnasium(env_id):
    env, _, _ = _compiled(env_id)
    assert env.name == env_id
    assert env.default_params.max_steps_in_episode == gym.spec(env_id).max_episode_steps


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_truncation_exactly_at_small_limit(env_id):
    env, reset, step = _compiled(env_id)
    limit = 7
    params = env.default_params.replace(max_steps_in_episode=limit)
    rng = _rng(env_id, "limit")
    state, ts = reset(KEY, params)
    assert not bool(ts.truncated[0]) and not bool(ts.terminated[0])
    for t in range(1, limit + 1):
        if env_id == "CartPole-v1":  # alternate pushes: the pole stays up for 7 steps
            js_action = np.array([t % 2], np.int32)
        else:  # no goal can be reached from the reset state within 7 steps
            js_action = _sample_action(env, rng)[1]
        state, ts = step(jax.random.fold_in(KEY, t), state, js_action, params)
        assert int(state.time) == t
        assert not bool(ts.terminated[0]), t
        assert bool(ts.truncated[0]) == (t == limit), t


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_truncation_at_default_limit_independent_of_termination(env_id):
    env, reset, step = _compiled(env_id)
    spec = SPECS[env_id]
    params = env.default_params
    limit = params.max_steps_in_episode
    template, _ = reset(KEY, params)
    if hasattr(env.action_space, "n"):
        action = np.array([1], np.int32)  # CartPole: push right; others: no torque/push
    else:
        action = np.zeros((1, 1), np.float32)
    # Two steps before the limit, the limit step, from a reset state.
    state = template.replace(time=np.int32(limit - 2))
    state, ts = step(KEY, state, action, params)
    assert int(state.time) == limit - 1 and not bool(ts.truncated[0])
    state, ts = step(KEY, state, action, params)
    assert int(state.time) == limit and bool(ts.truncated[0]) and not bool(ts.terminated[0])
    if spec.terminal_state is not None:
        # Terminating on the limit step sets both flags; one step earlier only one.
        for time, truncated in ((limit - 1, True), (limit - 2, False)):
            state = _js_state(template, spec, spec.terminal_state, time)
            _, ts = step(KEY, state, action, params)
            assert bool(ts.terminated[0])
            assert bool(ts.truncated[0]) == truncated


# --- structure, spaces, reset ---------------------------------------------------------


def _shape_dtype(tree):
    return jax.tree.map(lambda x: (x.shape, jnp.dtype(x.dtype)), tree)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_reset_and_step_share_structure_and_dtypes(env_id):
    env, _, _ = _compiled(env_id)
    params = env.default_params
    state0, ts0 = jax.eval_shape(env.reset, KEY, params)
    action = jnp.zeros((1, *env.action_space.shape), env.action_space.dtype)
    state1, ts1 = jax.eval_shape(env.step, KEY, state0, action, params)
    assert jax.tree.structure(ts0) == jax.tree.structure(ts1)
    assert _shape_dtype(ts0) == _shape_dtype(ts1)
    assert jax.tree.structure(state0) == jax.tree.structure(state1)
    assert _shape_dtype(state0) == _shape_dtype(state1)
    assert ts1.obs.shape == (1, *env.observation_space.shape) and ts1.obs.dtype == jnp.float32
    assert ts1.reward.shape == (1,) and ts1.reward.dtype == jnp.float32
    for flag in (ts1.terminated, ts1.truncated, ts1.acting):
        assert flag.shape == (1,) and flag.dtype == jnp.bool_
    assert state1.time.shape == () and state1.time.dtype == jnp.int32
    for f in SPECS[env_id].fields:
        leaf = getattr(state1, f)
        assert leaf.shape == () and leaf.dtype == jnp.float32, f


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_spaces_match_gymnasium(env_id):
    env, _, _ = _compiled(env_id)
    g = gym.make(env_id, disable_env_checker=True)
    obs, act = env.observation_space, env.action_space
    assert obs.shape == g.observation_space.shape and obs.dtype == np.float32
    finite = np.isfinite(g.observation_space.high)
    np.testing.assert_array_equal(obs.high[finite], g.observation_space.high[finite])
    np.testing.assert_array_equal(obs.low[finite], g.observation_space.low[finite])
    if hasattr(g.action_space, "n"):
        assert act.n == g.action_space.n and act.start == g.action_space.start
    else:
        assert act.shape == g.action_space.shape == (1,)
        np.testing.assert_array_equal(act.low, g.action_space.low)
        np.testing.assert_array_equal(act.high, g.action_space.high)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_reset_distribution(env_id):
    env, reset, _ = _compiled(env_id)
    spec = SPECS[env_id]
    params = env.default_params
    states, obs = [], []
    for i in range(128):
        s, ts = reset(jax.random.key(1000 + i), params)
        states.append([float(getattr(s, f)) for f in spec.fields])
        obs.append(np.asarray(ts.obs[0]))
        assert int(s.time) == 0
        assert (
            not bool(ts.terminated[0]) and not bool(ts.truncated[0]) and float(ts.reward[0]) == 0.0
        )
    states = np.array(states)
    low, high = np.array(spec.reset_low), np.array(spec.reset_high)
    assert np.all(states >= low) and np.all(states <= high)
    spread = high > low
    # A uniform draw of 128 values covers most of its interval (fails if degenerate).
    coverage = (states.max(0) - states.min(0))[spread] / (high - low)[spread]
    assert np.all(coverage > 0.8), coverage
    for o in obs[:16]:
        assert bool(env.observation_space.contains(o))
    if env_id == "CartPole-v1":
        assert np.all(np.abs(np.array(obs)) <= 0.05)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_reset_is_deterministic(env_id):
    env, reset, _ = _compiled(env_id)
    params = env.default_params
    s1, ts1 = reset(jax.random.key(7), params)
    s2, ts2 = reset(jax.random.key(7), params)
    _, ts3 = reset(jax.random.key(8), params)
    jax.tree.map(np.testing.assert_array_equal, (s1, ts1), (s2, ts2))
    assert not np.array_equal(np.asarray(ts1.obs), np.asarray(ts3.obs))


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_observations_stay_in_space(env_id):
    env, reset, step = _compiled(env_id)
    params = env.default_params
    rng = _rng(env_id, "space")
    state, ts = reset(KEY, params)
    for t in range(60):
        assert bool(env.observation_space.contains(ts.obs[0])), (t, ts.obs)
        if bool(ts.terminated[0]):
            break
        state, ts = step(jax.random.fold_in(KEY, t), state, _sample_action(env, rng)[1], params)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_jit_matches_eager(env_id):
    env, reset, step = _compiled(env_id)
    params = env.default_params
    action = _sample_action(env, _rng(env_id, "eager"))[1]
    state_j, _ = reset(KEY, params)
    state_e, _ = env.reset(KEY, params)
    jax.tree.map(np.testing.assert_array_equal, state_j, state_e)
    out_j = step(KEY, state_j, action, params)
    out_e = env.step(KEY, state_e, jnp.asarray(action), params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, RTOL, ATOL), out_j, out_e)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_one_compilation_per_entry_point(env_id):
    """Different states, actions and params values reuse the one compiled step."""
    env, reset, step = _compiled(env_id)
    rng = _rng(env_id, "compile")
    for limit in (3, 11):
        params = env.default_params.replace(max_steps_in_episode=limit)
        state, _ = reset(jax.random.key(limit), params)
        step(KEY, state, _sample_action(env, rng)[1], params)
    assert TRACES[(env_id, "reset")] == 1
    assert TRACES[(env_id, "step")] == 1


def test_acrobot_nips_dynamics_match_gymnasium():
    """The static ``book_or_nips`` switch selects Gymnasium's other equations of motion."""
    env = Acrobot(book_or_nips="nips")
    spec = SPECS["Acrobot-v1"]
    step = jax.jit(env.step)
    book_step = _compiled("Acrobot-v1")[2]
    params = env.default_params
    template, _ = env.reset(KEY, params)
    gym_env = gym.make("Acrobot-v1", disable_env_checker=True).unwrapped
    gym_env.book_or_nips = "nips"
    gym_env.reset(seed=0)
    rng = _rng("Acrobot-v1", "nips")
    differs = False
    for _ in range(16):
        start = spec.random_state(rng)
        gym_env.state = start.copy()
        a = int(rng.integers(3))
        g_obs, _, _, _, _ = gym_env.step(a)
        state, action = _js_state(template, spec, start, 0), np.array([a], np.int32)
        _, ts = step(KEY, state, action, params)
        np.testing.assert_allclose(np.asarray(ts.obs[0]), g_obs, RTOL, ATOL)
        _, ts_book = book_step(KEY, state, action, params)
        differs |= not np.allclose(np.asarray(ts_book.obs[0]), g_obs, RTOL, ATOL)
    assert differs  # the two variants really are different dynamics
    with pytest.raises(ValueError):
        Acrobot(book_or_nips="other")
