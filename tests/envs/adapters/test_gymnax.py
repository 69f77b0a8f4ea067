"""The gymnax adapter against gymnax itself.

Parity runs three things side by side, with the same keys and actions, for a few dozen
steps on envs with a small ``max_steps_in_episode`` (so episodes end inside the run):

* ``js.make("gymnax:<id>")`` (our ``reset`` / ``step``);
* the gymnax env stepped by hand: ``reset_env`` / ``step_env`` / ``is_truncated``;
* gymnax's public auto-resetting ``env.step``, whose ``info`` reports ``terminated``,
  ``truncated`` and the pre-reset ``final_observation``.

For gymnax's ``step(key)`` the transition uses ``split(key)[0]`` and the reset
``split(key)[1]``; the other two are given exactly those keys. Ours and the by-hand
reference run the same jitted computation and must agree bit for bit (observations,
rewards, flags, states, info). gymnax's ``step`` is a different XLA program (it fuses
the step with the reset and a select), which can move float results by an ulp, so its
floats are compared to 1e-6 (flags exactly), and it is always started from the
by-hand state so that such ulps cannot accumulate. The gymnax env object used as the
reference is built with ``gymnax.make`` independently of the one inside the adapter.
"""

from __future__ import annotations

import dataclasses

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler import spaces as S

#: env id -> max_steps_in_episode used for parity (small, so truncation happens).
LIMITS = {"CartPole-v1": 14, "Acrobot-v1": 9, "Pendulum-v1": 9, "Breakout-MinAtar": 8}
N_STEPS = 40


@dataclasses.dataclass
class Setup:
    env_id: str
    ours: js.envs.adapters.gymnax.GymnaxEnv
    ref: object  # the independent gymnax env
    params: object
    ours_reset: object
    ours_step: object
    ref_reset: object
    ref_step: object


_SETUPS: dict[str, Setup] = {}


def _setup(env_id: str) -> Setup:
    """Built once per env id for the whole module (each jitted function compiles once)."""
    if env_id not in _SETUPS:
        ours = js.make(f"gymnax:{env_id}")
        ref, ref_params = gymnax.make(env_id)
        params = ref_params.replace(max_steps_in_episode=LIMITS[env_id])

        def ref_step(key, state, action, params):
            obs, state, reward, terminated, info = ref.step_env(key, state, action, params)
            return obs, state, reward, terminated, ref.is_truncated(state, params), info

        _SETUPS[env_id] = Setup(
            env_id,
            ours,
            ref,
            params,
            jax.jit(ours.reset),
            jax.jit(ours.step),
            jax.jit(ref.reset_env),
            jax.jit(ref_step),
        )
    return _SETUPS[env_id]


def _actions(env_id: str, space: S.Space, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    if env_id == "CartPole-v1":
        # Push right until the pole falls (termination), then alternate (balances past the limit).
        return [np.int32(1) if t < 14 else np.int32(t % 2) for t in range(n)]
    if isinstance(space, S.Discrete):
        return [np.int32(rng.integers(space.n)) for _ in range(n)]
    return [rng.uniform(space.low, space.high).astype(np.float32) for _ in range(n)]


def _equal(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb, strict=True)
    )


def _close(a, b) -> None:
    """Same structure; leaves equal to 1e-6 (see the module docstring)."""
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("env_id", sorted(LIMITS))
def test_parity_with_gymnax(env_id):
    s = _setup(env_id)
    env, params = s.ref, s.params
    keys = jax.random.split(jax.random.PRNGKey(42), N_STEPS + 1)
    actions = _actions(env_id, s.ours.action_space, N_STEPS)

    ref_obs, ref_state = s.ref_reset(keys[0], params)
    our_state, ts = s.ours_reset(keys[0], params)
    assert _equal(ts.obs[0], ref_obs) and _equal(our_state, ref_state)

    ep_len, n_term, n_trunc = 0, 0, 0
    for t in range(N_STEPS):
        k_step, k_reset = jax.random.split(keys[t + 1])
        a = actions[t]
        # By hand.
        r_obs, r_state, r_rew, r_term, r_trunc, r_info = s.ref_step(k_step, ref_state, a, params)
        # Ours (agent axis of size 1).
        our_state, ts = s.ours_step(
            k_step, our_state, jax.tree.map(lambda x: jnp.asarray(x)[None], a), params
        )
        # gymnax's auto-resetting step.
        g_obs, g_state, g_rew, g_term, g_trunc, g_info = env.step(keys[t + 1], ref_state, a, params)
        ep_len += 1

        assert _equal(ts.obs[0], r_obs), t
        assert np.asarray(ts.reward)[0] == np.float32(r_rew), t
        assert bool(ts.terminated[0]) == bool(r_term), t
        assert bool(ts.truncated[0]) == bool(r_trunc), t
        assert _equal(our_state, r_state), t
        assert _equal(ts.info, r_info), t
        # The time limit lands exactly at max_steps_in_episode (an independent count).
        assert bool(ts.truncated[0]) == (ep_len >= LIMITS[env_id]), t

        assert bool(g_info["terminated"]) == bool(ts.terminated[0]), t
        assert bool(g_info["truncated"]) == bool(ts.truncated[0]), t
        _close(g_info["final_observation"], ts.obs[0])
        _close(g_rew, ts.reward[0])
        assert bool(g_term) == bool(ts.terminated[0]) and bool(g_trunc) == bool(ts.truncated[0]), t

        done = bool(ts.terminated[0] | ts.truncated[0])
        if done:
            n_term += int(bool(ts.terminated[0]))
            n_trunc += int(bool(ts.truncated[0]))
            ref_obs, ref_state = s.ref_reset(k_reset, params)
            our_state, ts = s.ours_reset(k_reset, params)
            assert _equal(ts.obs[0], ref_obs) and _equal(our_state, ref_state), t
            # gymnax reset with the same key: its returned obs/state are the new episode's.
            _close((g_obs, g_state), (ref_obs, ref_state))
            ep_len = 0
        else:
            ref_state = r_state
            _close((g_obs, g_state), (r_obs, r_state))

    assert n_trunc >= 1, "no episode reached the time limit"
    if env_id in ("CartPole-v1", "Breakout-MinAtar"):  # these runs also end by termination
        assert n_term >= 1, f"{env_id} never terminated"


@pytest.mark.parametrize("env_id", sorted(LIMITS))
def test_spaces_converted(env_id):
    s = _setup(env_id)
    for ours, theirs in [
        (s.ours.observation_space, s.ref.observation_space(s.ref.default_params)),
        (s.ours.action_space, s.ref.action_space(s.ref.default_params)),
    ]:
        if isinstance(theirs, gymnax.environments.spaces.Discrete):
            assert ours == S.Discrete(theirs.n)
        else:
            assert isinstance(ours, S.Box)
            assert ours.shape == tuple(theirs.shape)
            assert ours.dtype == np.dtype(theirs.dtype)
            np.testing.assert_array_equal(
                ours.low, np.broadcast_to(np.asarray(theirs.low, ours.dtype), ours.shape)
            )
            np.testing.assert_array_equal(
                ours.high, np.broadcast_to(np.asarray(theirs.high, ours.dtype), ours.shape)
            )
    assert s.ours.name == f"gymnax:{env_id}"


@pytest.mark.parametrize("env_id", sorted(LIMITS))
def test_reset_and_step_timesteps_match(env_id):
    s = _setup(env_id)
    key = jax.random.PRNGKey(3)
    state, ts0 = s.ours_reset(key, s.params)
    action = s.ours.action_space.sample_batch(key, (1,))
    _, ts1 = s.ours_step(key, state, action, s.params)
    assert jax.tree.structure(ts0) == jax.tree.structure(ts1)
    for a, b in zip(jax.tree.leaves(ts0), jax.tree.leaves(ts1), strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
    assert set(ts0.info) == {"discount"} and ts0.info["discount"].dtype == jnp.float32
    space = s.ours.observation_space
    for ts in (ts0, ts1):
        assert ts.obs.shape == (1,) + space.shape and ts.obs.dtype == space.dtype
        assert bool(space.contains(ts.obs[0]))
        assert ts.reward.shape == (1,) and ts.reward.dtype == jnp.float32
        assert ts.terminated.dtype == jnp.bool_ and ts.truncated.dtype == jnp.bool_
        assert bool(ts.acting.all())
    assert float(ts0.reward[0]) == 0.0 and not bool(ts0.terminated[0] | ts0.truncated[0])


def test_from_gymnax_with_custom_params():
    ref, default = gymnax.make("Pendulum-v1")
    params = default.replace(max_torque=1.0, max_steps_in_episode=5)
    env = js.envs.from_gymnax(ref, params)
    assert isinstance(env, js.envs.adapters.gymnax.GymnaxEnv) and env.default_params is params
    assert env.action_space == S.Box(-1.0, 1.0, (1,))  # the space follows the params
    assert js.envs.from_gymnax(ref).action_space == S.Box(-2.0, 2.0, (1,))
    assert env.name == "gymnax:Pendulum-v1"

    @jax.jit
    def run(key, torque):
        """Five steps with a constant torque, default (custom) params."""
        state, ts = env.reset(key)

        def body(state, k):
            state, ts = env.step(k, state, jnp.full((1, 1), torque, jnp.float32))
            return state, (ts.obs[0], ts.truncated[0])

        return jax.lax.scan(body, state, jax.random.split(key, 6))[1]

    obs_big, trunc = run(jax.random.PRNGKey(0), 2.0)
    obs_one, _ = run(jax.random.PRNGKey(0), 1.0)
    # Truncation exactly at the custom limit of 5 steps.
    np.testing.assert_array_equal(np.asarray(trunc), [False] * 4 + [True, True])
    # max_torque = 1 clips a torque of 2 to 1: the trajectories coincide.
    np.testing.assert_array_equal(np.asarray(obs_big)[:5], np.asarray(obs_one)[:5])
    # Independent check against gymnax with the default params (torque 2 not clipped).
    o, st = ref.reset_env(jax.random.PRNGKey(0), default)
    assert np.array_equal(np.asarray(env.reset(jax.random.PRNGKey(0))[1].obs[0]), np.asarray(o))
    o2 = ref.step_env(jax.random.split(jax.random.PRNGKey(0), 6)[0], st, jnp.array([2.0]), default)[
        0
    ]
    assert not np.allclose(np.asarray(o2), np.asarray(obs_big)[0])


def test_from_gymnax_rejects_non_env():
    with pytest.raises(TypeError, match="gymnax Environment"):
        js.envs.from_gymnax(object())


@pytest.mark.parametrize(
    "bad,suggestion",
    [("CartPole-v2", "gymnax:CartPole-v1"), ("Breakout-Minatar", "gymnax:Breakout-MinAtar")],
)
def test_unknown_gymnax_id(bad, suggestion):
    with pytest.raises(ValueError, match=f"unknown gymnax env id.*{suggestion}"):
        js.make(f"gymnax:{bad}")


# --------------------------------------------------------------------------- rollout


def test_rollout_over_gymnax_cartpole_keeps_final_observations():
    """A jitted rollout; every episode end is replayed through gymnax's ``step_env``.

    CartPole's state is its observation (plus ``time``), so each step of the buffers can
    be replayed from the recorded observation and action.
    """
    env = js.make("gymnax:CartPole-v1")
    policy = js.RandomPolicy(env.observation_space, env.action_space)
    E, T = 4, 64
    rollout = jax.jit(js.make_rollout(env, policy, num_envs=E, rollout_length=T))
    state = js.init_rollout_state(env, policy, num_envs=E, key=jax.random.PRNGKey(0))
    _, traj = rollout((), state)
    obs = np.asarray(traj.obs[:, :, 0])  # [T + 1, E, 4]
    term = np.asarray(traj.terminated[:, :, 0])
    trunc = np.asarray(traj.truncated[:, :, 0])
    is_reset = np.asarray(traj.is_reset)
    actions = np.asarray(traj.actions[:, :, 0])
    assert obs.shape == (T + 1, E, 4) and actions.shape == (T, E)

    ends = np.argwhere(term | trunc)
    assert len(ends) >= E, "random CartPole episodes last ~20 steps: expected several ends"
    p = env.default_params
    for t, e in ends:
        final = obs[t + 1, e]
        # The real terminal observation, not a reset one (resets lie in [-0.05, 0.05]^4).
        assert np.abs(final).max() > 0.05, (t, e)
        assert abs(final[0]) > p.x_threshold or abs(final[2]) > p.theta_threshold_radians, (t, e)
        if t + 1 < T:
            assert is_reset[t + 1, e] and not traj.acting[t + 1, e, 0]
            assert np.all(np.abs(obs[t + 2, e]) <= 0.05), (t, e)  # the new episode's start

    ref, _ = gymnax.make("CartPole-v1")
    EnvState = type(ref.reset_env(jax.random.PRNGKey(0), p)[1])
    step = jax.jit(ref.step_env)
    for e in range(E):
        for t in range(T):
            if is_reset[t, e]:
                assert not term[t, e] and not trunc[t, e] and float(traj.rewards[t, e, 0]) == 0.0
                continue
            x, x_dot, theta, theta_dot = obs[t, e]
            st = EnvState(time=jnp.int32(0), x=x, x_dot=x_dot, theta=theta, theta_dot=theta_dot)
            r_obs, _, r_rew, r_term, _ = step(
                jax.random.PRNGKey(0), st, jnp.int32(actions[t, e]), p
            )
            np.testing.assert_allclose(obs[t + 1, e], np.asarray(r_obs), rtol=1e-6, atol=1e-6)
            assert float(traj.rewards[t, e, 0]) == float(r_rew)
            assert bool(term[t, e]) == bool(r_term), (t, e)
