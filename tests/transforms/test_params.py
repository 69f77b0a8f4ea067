"""Per-env params (leaves with a leading ``[E]`` axis) and DomainRandomization.

References are independent of the rollout: a closed-form env (:class:`DriftEnv`) whose
trajectory follows from its params and the recorded actions by hand, and CartPole
re-stepped one transition at a time with ``env.step_env`` and the params of that env
and step.
"""

from __future__ import annotations

import dataclasses
import doctest
import functools
import textwrap
from pathlib import Path
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import jaxsampler as js
from jaxsampler.envs.base import SingleAgentEnv
from jaxsampler.envs.cartpole import CartPoleState
from jaxsampler.spaces import Box, Discrete
from jaxsampler.transforms import Context, StageState
from jaxsampler.transforms import params as params_module
from jaxsampler.transforms.params import DomainRandomization
from jaxsampler.types import NoInfo
from tests.devices import run_on_devices

ROOT = Path(__file__).resolve().parents[2]
E, T = 4, 24


# ----------------------------------------------------------------------------- a closed-form env


@struct.dataclass
class DriftState:
    x: jax.Array
    time: jax.Array


@struct.dataclass
class DriftParams:
    rate: Any = 1.0
    offset: Any = 0.0
    gain: Any = None  # float32[2]
    max_steps_in_episode: Any = 3


@dataclasses.dataclass(frozen=True)
class DriftEnv(SingleAgentEnv):
    """x starts at ``offset``; each step ``x += rate * (action + 1)``; obs = ``x * gain``;
    reward = x; truncated after ``max_steps_in_episode`` steps; no termination."""

    @property
    def default_params(self) -> DriftParams:
        return DriftParams(gain=np.array([1.0, -2.0], np.float32))

    @property
    def observation_space(self) -> Box:
        return Box(-np.inf, np.inf, (2,), np.float32)

    @property
    def action_space(self) -> Discrete:
        return Discrete(3)

    def reset_env(self, key, params):
        state = DriftState(jnp.asarray(params.offset, jnp.float32), jnp.zeros((), jnp.int32))
        return state.x * params.gain, state

    def step_env(self, key, state, action, params):
        x = state.x + params.rate * (action.astype(jnp.float32) + 1.0)
        return x * params.gain, state.replace(x=x), x, jnp.zeros((), jnp.bool_), NoInfo()


def per_env(params: DriftParams, e: int) -> DriftParams:
    """Env ``e``'s own params (numpy), from params that may have per-env leaves."""
    default = DriftEnv().default_params
    return jax.tree.map(
        lambda p, d: np.asarray(p)[e] if np.ndim(p) > np.ndim(d) else np.asarray(p),
        params,
        default,
    )


def simulate_drift(traj, params_at, x0: np.ndarray) -> dict[str, np.ndarray]:
    """The DriftEnv trajectory by hand from the recorded actions and resets.

    ``params_at(t, e)``: the params env ``e`` steps with at step ``t``; ``x0``: ``[E]``.
    """
    n_steps, n_envs = traj.is_reset.shape
    obs = np.zeros((n_steps + 1, n_envs, 2), np.float32)
    trunc = np.zeros((n_steps, n_envs), bool)
    for e in range(n_envs):
        x = np.float32(x0[e])
        time = int(traj.episode_step_0[e])
        obs[0, e] = x * np.asarray(params_at(0, e).gain, np.float32)
        for t in range(n_steps):
            p = params_at(t, e)
            if traj.is_reset[t, e]:
                x, time = np.float32(p.offset), 0
            else:
                a = int(traj.actions[t, e, 0])
                x = np.float32(x + np.float32(p.rate) * np.float32(a + 1))
                time += 1
                trunc[t, e] = time >= int(p.max_steps_in_episode)
            obs[t + 1, e] = x * np.asarray(p.gain, np.float32)
    return {"obs": obs, "truncated": trunc}


def random_policy(env):
    return js.RandomPolicy(env.observation_space, env.action_space)


# ----------------------------------------------------------------------------- CartPole by hand


def cartpole_mismatches(env, traj, params_at) -> int:
    """Number of non-reset CartPole transitions whose next observation differs from
    ``env.step_env`` on the previous observation with ``params_at(t, e)`` (CartPole's
    state is its observation; its step uses no randomness)."""
    step = jax.jit(
        lambda obs, a, p: env.step_env(
            jax.random.PRNGKey(0), CartPoleState(*obs, jnp.zeros((), jnp.int32)), a, p
        )[0]
    )
    bad = 0
    n_steps, n_envs = traj.is_reset.shape
    for e in range(n_envs):
        for t in range(n_steps):
            if traj.is_reset[t, e]:
                continue
            want = np.asarray(step(traj.obs[t, e, 0], traj.actions[t, e, 0], params_at(t, e)))
            if not np.allclose(traj.obs[t + 1, e, 0], want, rtol=1e-5, atol=1e-6):
                bad += 1
    return bad


def cartpole_params_at_fixed(params):
    """``params_at`` for per-env params that stay fixed over the rollout."""
    default = js.make("CartPole-v1").default_params

    def own_params(e: int) -> Any:
        return jax.tree.map(
            lambda p, d: jnp.asarray(p)[e] if np.ndim(p) > np.ndim(d) else jnp.asarray(p),
            params,
            default,
        )

    own = [own_params(e) for e in range(E)]
    return lambda t, e: own[e]


def cartpole_params_at_recorded(traj):
    """``params_at`` from ``Trajectory.env_params`` (leaves ``[T, E]``)."""
    return lambda t, e: jax.tree.map(lambda x: jnp.asarray(x[t, e]), traj.env_params)


def per_env_cartpole_params():
    env = js.make("CartPole-v1")
    return dataclasses.replace(
        env.default_params,
        length=jnp.array([0.3, 0.5, 0.8, 1.2], jnp.float32),
        masscart=jnp.array([0.5, 1.0, 2.0, 3.0], jnp.float32),
    )


# ----------------------------------------------------------------------------- per-env params


@functools.cache
def cartpole_rollout(n_steps: int = T, transforms: tuple = ()):
    env = js.make("CartPole-v1")
    pol = random_policy(env)
    return env, pol, js.jit_rollout(js.make_rollout(env, pol, E, n_steps, transforms=transforms))


def test_per_env_cartpole_params_give_each_env_its_own_dynamics():
    env, pol, rollout = cartpole_rollout()
    params = per_env_cartpole_params()
    state = js.init_rollout_state(env, pol, E, jax.random.PRNGKey(0), env_params=params)
    np.testing.assert_array_equal(state.env_params.length, params.length)
    assert np.shape(state.env_params.gravity) == ()  # shared leaves stay shared
    state, traj = rollout((), state)
    traj = jax.device_get(traj)
    assert traj.is_reset.any()  # random actions: episodes end and restart within T
    assert cartpole_mismatches(env, traj, cartpole_params_at_fixed(params)) == 0
    # The check sees the params: every env stepped with env 0's params would not match.
    assert cartpole_mismatches(env, traj, lambda t, e: cartpole_params_at_fixed(params)(t, 0)) > 0
    # The params persist across calls.
    np.testing.assert_array_equal(state.env_params.masscart, params.masscart)


def test_mixed_shared_and_per_env_leaves_follow_the_closed_form():
    env = DriftEnv()
    pol = random_policy(env)
    params = DriftParams(
        rate=np.array([1.0, 2.0, 0.5, -1.0], np.float32),  # per env
        offset=np.float32(3.0),  # shared
        gain=np.array([[1.0, 2.0], [1.0, -1.0], [0.5, 0.5], [2.0, 0.0]], np.float32),  # per env
        max_steps_in_episode=np.array([2, 3, 3, 5], np.int32),  # per env (int)
    )
    rollout = js.make_rollout(env, pol, E, T)
    state = js.init_rollout_state(env, pol, E, jax.random.PRNGKey(1), env_params=params)
    _, traj = jax.jit(rollout)((), state)
    traj = jax.device_get(traj)
    want = simulate_drift(traj, lambda t, e: per_env(params, e), np.full(E, 3.0))
    np.testing.assert_allclose(traj.obs[:, :, 0], want["obs"], rtol=1e-6)
    np.testing.assert_array_equal(traj.truncated[:, :, 0], want["truncated"])
    # Each env's episodes have its own length: resets every max_steps + 1 steps.
    for e, m in enumerate(params.max_steps_in_episode):
        np.testing.assert_array_equal(
            np.flatnonzero(traj.is_reset[:, e]), np.arange(m, T, m + 1), err_msg=f"env {e}"
        )


@pytest.mark.parametrize(
    "field, value, shape",
    [
        ("length", np.ones((E + 1,), np.float32), (E + 1,)),
        ("length", np.ones((E, 2), np.float32), (E, 2)),
        ("masscart", np.ones((2, E), np.float32), (2, E)),
    ],
)
def test_env_params_with_a_wrong_leading_axis_fail_naming_leaf_and_shapes(field, value, shape):
    env = js.make("CartPole-v1")
    pol = random_policy(env)
    bad = dataclasses.replace(env.default_params, **{field: value})
    with pytest.raises(ValueError) as info:
        js.init_rollout_state(env, pol, E, jax.random.PRNGKey(0), env_params=bad)
    msg = str(info.value)
    assert f".{field}" in msg and str(shape) in msg and "()" in msg and f"({E},)" in msg, msg
    # A state whose params were swapped afterwards fails in the rollout (at trace time).
    state = js.init_rollout_state(env, pol, E, jax.random.PRNGKey(0))
    state = dataclasses.replace(state, env_params=bad)
    with pytest.raises(ValueError, match=rf"\.{field} has shape"):
        js.make_rollout(env, pol, E, 4)((), state)


def test_changing_param_values_does_not_recompile():
    env = js.make("CartPole-v1")
    pol = random_policy(env)
    rollout = js.make_rollout(env, pol, E, 8)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def run(state):
        return rollout((), state)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def init(key, env_params):
        return js.init_rollout_state(env, pol, E, key, env_params)

    outs = []
    for i, scale in enumerate((1.0, 2.0, 0.5)):
        p = dataclasses.replace(
            per_env_cartpole_params(), length=per_env_cartpole_params().length * scale
        )
        state, traj = run(init(jax.random.PRNGKey(0), p))
        state, traj = run(state)
        outs.append(np.asarray(traj.obs))
        np.testing.assert_allclose(state.env_params.length, p.length, err_msg=f"call {i}")
    assert not np.array_equal(outs[0], outs[1])  # the values did reach the dynamics


# ----------------------------------------------------------------------------- DomainRandomization


def drift_sample(key, base):
    """offset in [base.offset, base.offset + 1), rate in [base.rate, 2 * base.rate)."""
    k1, k2 = jax.random.split(key)
    return base.replace(
        offset=base.offset + jax.random.uniform(k1, ()),
        rate=base.rate * jax.random.uniform(k2, (), minval=1.0, maxval=2.0),
    )


def cartpole_sample(key, base):
    k_len, k_mass = jax.random.split(key)
    return dataclasses.replace(
        base,
        length=jax.random.uniform(k_len, (), minval=0.25, maxval=0.75),
        masscart=jax.random.uniform(k_mass, (), minval=0.5, maxval=2.0),
    )


DRIFT_DR = DomainRandomization(drift_sample)
CARTPOLE_DR = DomainRandomization(cartpole_sample)


@functools.cache
def drift_dr_rollout(n_steps: int = T):
    env = DriftEnv()
    pol = random_policy(env)
    return env, pol, js.jit_rollout(js.make_rollout(env, pol, E, n_steps, transforms=(DRIFT_DR,)))


def drift_base():
    return DriftParams(
        rate=np.array([1.0, 2.0, 3.0, 4.0], np.float32),  # per-env base
        offset=np.float32(10.0),
        gain=np.array([1.0, -2.0], np.float32),
        max_steps_in_episode=np.int32(3),
    )


def drift_dr_state(seed: int = 0):
    env, pol, _ = drift_dr_rollout()
    return js.init_rollout_state(
        env, pol, E, jax.random.PRNGKey(seed), env_params=drift_base(), transforms=(DRIFT_DR,)
    )


def test_domain_randomization_changes_params_exactly_at_resets():
    env, pol, rollout = drift_dr_rollout()
    state0 = drift_dr_state()
    # init drew for every env, from the base (per-env rate): all leaves now per env.
    p0 = jax.device_get(state0.env_params)
    assert p0.offset.shape == (E,) and p0.max_steps_in_episode.shape == (E,)
    assert np.all((p0.offset >= 10.0) & (p0.offset < 11.0)) and len(set(p0.offset)) == E
    assert np.all((p0.rate >= drift_base().rate) & (p0.rate < 2 * drift_base().rate))
    prev = p0
    state = state0
    for _ in range(2):  # across calls too
        state, traj = rollout((), state)
        traj = jax.device_get(traj)
        assert traj.env_params.offset.shape == (T, E) and traj.env_params.gain.shape == (T, E, 2)
        before = np.concatenate([prev.offset[None], traj.env_params.offset[:-1]])
        changed = traj.env_params.offset != before
        assert traj.is_reset.sum() >= 2 * E
        np.testing.assert_array_equal(changed, traj.is_reset)
        rate_before = np.concatenate([prev.rate[None], traj.env_params.rate[:-1]])
        np.testing.assert_array_equal(traj.env_params.rate != rate_before, traj.is_reset)
        # Every draw starts from the base (no drift over many episodes).
        assert np.all((traj.env_params.offset >= 10.0) & (traj.env_params.offset < 11.0))
        base_rate = drift_base().rate[None, :]
        assert np.all((traj.env_params.rate >= base_rate) & (traj.env_params.rate < 2 * base_rate))
        # Unrandomized leaves keep the base values.
        np.testing.assert_array_equal(traj.env_params.max_steps_in_episode, 3)
        # Each episode, its reset included, follows its recorded params.
        want = simulate_drift(
            traj,
            lambda t, e, traj=traj: jax.tree.map(lambda x: x[t, e], traj.env_params),
            np.asarray(traj.obs[0, :, 0, 0]),
        )
        np.testing.assert_allclose(traj.obs[:, :, 0], want["obs"], rtol=1e-6)
        np.testing.assert_array_equal(traj.truncated[:, :, 0], want["truncated"])
        reset_t, reset_e = np.nonzero(traj.is_reset)
        np.testing.assert_allclose(
            traj.obs[reset_t + 1, reset_e, 0, 0], traj.env_params.offset[reset_t, reset_e]
        )
        prev = jax.tree.map(lambda x: x[-1], traj.env_params)
        np.testing.assert_array_equal(state.env_params.offset, prev.offset)


def test_domain_randomized_cartpole_episodes_follow_their_recorded_params():
    env, pol, rollout = cartpole_rollout(64, (CARTPOLE_DR,))
    state = js.init_rollout_state(env, pol, E, jax.random.PRNGKey(3), transforms=(CARTPOLE_DR,))
    state, traj = rollout((), state)
    traj = jax.device_get(traj)
    assert traj.is_reset.any()
    length = traj.env_params.length
    assert np.all((length >= 0.25) & (length <= 0.75))
    assert np.all((traj.env_params.masscart >= 0.5) & (traj.env_params.masscart <= 2.0))
    assert len(np.unique(length)) > E  # new draws at the resets
    assert cartpole_mismatches(env, traj, cartpole_params_at_recorded(traj)) == 0
    # Sensitivity: the default params do not explain these trajectories.
    assert cartpole_mismatches(env, traj, lambda t, e: env.default_params) > 0


def test_domain_randomization_is_deterministic_and_2T_equals_T_plus_T():
    env, pol, rollout = drift_dr_rollout()
    _, _, rollout2 = drift_dr_rollout(2 * T)
    s_a, t_a1 = rollout((), drift_dr_state(7))
    s_a, t_a2 = rollout((), s_a)
    s_b, t_b = rollout2((), drift_dr_state(7))
    for name in ("env_params", "actions", "is_reset"):
        joined = jax.tree.map(
            lambda x, y: np.concatenate([x, y]), getattr(t_a1, name), getattr(t_a2, name)
        )
        chex.assert_trees_all_equal(joined, jax.device_get(getattr(t_b, name)))
    np.testing.assert_array_equal(np.concatenate([t_a1.obs[:-1], t_a2.obs]), t_b.obs)
    chex.assert_trees_all_equal(jax.device_get(s_a.env_params), jax.device_get(s_b.env_params))
    # Another seed draws other params.
    _, t_c = rollout((), drift_dr_state(8))
    assert not np.array_equal(t_c.env_params.offset, t_a1.env_params.offset)


def test_domain_randomization_does_not_recompile():
    env, pol, _ = drift_dr_rollout()
    rollout = js.make_rollout(env, pol, E, 8, transforms=(DRIFT_DR,))
    run = jax.jit(chex.assert_max_traces(lambda s: rollout((), s), n=1))
    state = drift_dr_state()
    seen = set()
    for _ in range(3):
        state, traj = run(state)
        seen |= set(np.asarray(traj.env_params.offset).ravel().tolist())
    assert len(seen) > 2 * E  # new values drawn, one executable


def test_domain_randomization_needs_its_state():
    env, pol, _ = drift_dr_rollout()
    plain = js.init_rollout_state(env, pol, E, jax.random.PRNGKey(0))
    rollout = js.make_rollout(env, pol, E, 4, transforms=(DRIFT_DR,))
    with pytest.raises(ValueError, match="does not match this rollout's transforms"):
        rollout((), plain)


def wrong_structure(key, base):
    return {"length": jax.random.uniform(key, ())}


def wrong_shape(key, base):
    return dataclasses.replace(base, length=jax.random.uniform(key, (3,)))


def float_for_int(key, base):
    return dataclasses.replace(base, max_steps_in_episode=jax.random.uniform(key, ()) * 500)


@pytest.mark.parametrize(
    "fn, fragments",
    [
        (wrong_structure, ["returned dict(['length']: () float32)", "CartPoleParams(", ".length"]),
        (wrong_shape, [".length with shape (3,)", "expected shape ()"]),
        (float_for_int, [".max_steps_in_episode", "float32", "int32"]),
    ],
)
def test_bad_sample_params_fn_fails_at_trace_time_naming_what_it_returned(fn, fragments):
    env = js.make("CartPole-v1")
    pol = random_policy(env)
    dr = DomainRandomization(fn)
    init = jax.jit(lambda k: js.init_rollout_state(env, pol, E, k, transforms=(dr,)))
    with pytest.raises(ValueError) as info:
        jax.eval_shape(init, jax.random.PRNGKey(0))  # tracing alone raises
    msg = str(info.value)
    assert msg.startswith("DomainRandomization: sample_params_fn returned"), msg
    for frag in fragments:
        assert frag in msg, (frag, msg)


def test_bad_domain_randomization_arguments():
    with pytest.raises(TypeError, match="expected a function"):
        DomainRandomization(0.5)  # type: ignore[arg-type]
    dr = DomainRandomization(drift_sample)
    stage = StageState()
    with pytest.raises(ValueError, match="no params to randomize"):
        dr.reset_params(stage, jax.random.PRNGKey(0), jnp.ones(2, bool), None, Context())


def test_class_docstring_example_runs():
    result = doctest.testmod(params_module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_evaluate_with_domain_randomization_records_each_episodes_params():
    """``js.evaluate`` with the randomizer: one draw per episode, from the base, and each
    episode's return is within the bounds its recorded params allow (DriftEnv: the three
    steps of an episode return ``3 * offset + rate * (sum of 6 .. 18)``)."""
    env = DriftEnv()
    base = dataclasses.replace(drift_base(), rate=np.float32(2.0))
    n = 10
    res = js.evaluate(
        env,
        random_policy(env),
        (),
        n,
        jax.random.PRNGKey(0),
        deterministic=False,
        transforms=(DRIFT_DR,),
        env_params=base,
        num_envs=4,  # episodes 4.. start at resets inside the loop
    )
    off, rate = np.asarray(res.env_params.offset), np.asarray(res.env_params.rate)
    assert off.shape == rate.shape == (n,) and len(set(off.tolist())) == n
    assert np.all((off >= 10.0) & (off < 11.0)) and np.all((rate >= 2.0) & (rate < 4.0))
    np.testing.assert_array_equal(res.lengths, 3)
    lo, hi = 3 * off + 6 * rate, 3 * off + 18 * rate
    assert np.all((res.returns >= lo - 1e-4) & (res.returns <= hi + 1e-4)), (res.returns, lo, hi)


# ----------------------------------------------------------------------------- two devices

SHARDED = textwrap.dedent(
    """
    import dataclasses
    import jax, numpy as np
    from jax.sharding import PartitionSpec as P
    import jaxsampler as js
    from jaxsampler.rollout import placement
    from tests.transforms.test_params import (
        DRIFT_DR, E, T, DriftEnv, DriftParams, cartpole_mismatches, cartpole_params_at_fixed,
        drift_base, per_env, per_env_cartpole_params, simulate_drift,
    )
    assert jax.device_count() == 2, jax.devices()
    mesh = placement.env_mesh(2)

    # Per-env params, split over the devices: each env steps with its own.
    env = js.make("CartPole-v1"); pol = js.RandomPolicy(env.observation_space, env.action_space)
    params = per_env_cartpole_params()
    rollout = js.jit_rollout(js.make_rollout(env, pol, E, T, mesh=mesh))
    state = rollout.init(jax.random.PRNGKey(0), params)
    assert state.env_params.length.sharding.spec == P("env"), state.env_params.length.sharding
    assert state.env_params.gravity.sharding.spec == P()
    state, traj = rollout((), state)
    traj = jax.device_get(traj)
    assert traj.is_reset.any()
    assert cartpole_mismatches(env, traj, cartpole_params_at_fixed(params)) == 0
    np.testing.assert_array_equal(state.env_params.length, params.length)

    # Mixed leaves on the closed-form env.
    denv = DriftEnv(); dpol = js.RandomPolicy(denv.observation_space, denv.action_space)
    dparams = DriftParams(rate=np.array([1.0, 2.0, 0.5, -1.0], np.float32), offset=np.float32(3.0),
                          gain=np.array([1.0, -2.0], np.float32),
                          max_steps_in_episode=np.array([2, 3, 3, 5], np.int32))
    drollout = js.jit_rollout(js.make_rollout(denv, dpol, E, T, mesh=mesh))
    _, dtraj = drollout((), drollout.init(jax.random.PRNGKey(1), dparams))
    dtraj = jax.device_get(dtraj)
    want = simulate_drift(dtraj, lambda t, e: per_env(dparams, e), np.full(E, 3.0))
    np.testing.assert_allclose(dtraj.obs[:, :, 0], want["obs"], rtol=1e-6)

    # Domain randomization, sharded: params split on the env axis, own streams per shard.
    rr = js.jit_rollout(js.make_rollout(denv, dpol, E, T, mesh=mesh, transforms=(DRIFT_DR,)))
    s = rr.init(jax.random.PRNGKey(2), drift_base())
    assert s.env_params.offset.sharding.spec == P("env")
    assert s.transform_state.stages[0].rows.rate.sharding.spec == P("env")
    prev = jax.device_get(s.env_params)
    for _ in range(2):
        s, tr = rr((), s)
        assert tr.env_params.offset.sharding.spec == P(None, "env"), tr.env_params.offset.sharding
        tr = jax.device_get(tr)
        before = np.concatenate([prev.offset[None], tr.env_params.offset[:-1]])
        np.testing.assert_array_equal(tr.env_params.offset != before, tr.is_reset)
        at = lambda t, e, tr=tr: jax.tree.map(lambda x: x[t, e], tr.env_params)
        want = simulate_drift(tr, at, np.asarray(tr.obs[0, :, 0, 0]))
        np.testing.assert_allclose(tr.obs[:, :, 0], want["obs"], rtol=1e-6)
        base_rate = drift_base().rate[None, :]
        assert np.all((tr.env_params.rate >= base_rate) & (tr.env_params.rate < 2 * base_rate))
        # Envs 0 and 2 are each shard's first env and reset at the same steps: with one
        # stream for both shards they would draw the same offsets.
        np.testing.assert_array_equal(tr.is_reset[:, 0], tr.is_reset[:, 2])
        r = tr.is_reset[:, 0]
        assert r.any() and not np.any(tr.env_params.offset[r, 0] == tr.env_params.offset[r, 2])
        prev = jax.tree.map(lambda x: x[-1], tr.env_params)
    print("SHARDED-PARAMS-OK")
    """
)


def test_per_env_params_and_domain_randomization_sharded_over_two_devices():
    run_on_devices(SHARDED, "SHARDED-PARAMS-OK", timeout=600)
