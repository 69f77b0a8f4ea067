"""Reward transforms against a NumPy re-implementation driven by the trajectory's raw rewards
and flags (one device, across calls, multi-agent out of lockstep, sharded over 2 CPU devices)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.transforms import Context, NormalizeObservation, build_pipeline
from jaxsampler.transforms.reward import ClipReward, NormalizeReward, ScaleReward
from tests.devices import run_on_devices
from tests.fakes import ChaosEnv, FakeEnv

ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- reference


def reference(trajs, final_acting, gamma, epsilon, clip, update=True, prior=()):
    """NumPy NormalizeReward over concatenated trajectories (float64).

    A transition of an agent ends at step ``t`` when the observation step ``t`` produced is
    one it acts on (``acting`` of slot ``t + 1``; for the last step the state's ``acting``)
    or its newly final one, unless it starts an episode (a reset step). Rewards of the
    steps in between (a waiting agent's) add to the transition under way.

    Returns ``(scaled rewards [T, E, A], counted returns 1-D)``; ``prior``: returns counted
    before (frozen statistics are computed from them).
    """
    raw = np.concatenate([np.asarray(t.raw_rewards, np.float64) for t in trajs])
    term = np.concatenate([np.asarray(t.terminated) for t in trajs])
    trunc = np.concatenate([np.asarray(t.truncated) for t in trajs])
    reset = np.concatenate([np.asarray(t.is_reset) for t in trajs])
    acting = np.concatenate([np.asarray(t.acting) for t in trajs])
    acting_next = np.concatenate([acting[1:], np.asarray(final_acting)[None]])
    T, E, A = raw.shape
    pending = np.zeros((E, A))  # rewards of the transition under way
    G = np.zeros((E, A))  # the agent's return at its last transition
    prev_done = np.zeros((E, A), bool)
    counted = list(prior)
    out = np.zeros_like(raw)
    for t in range(T):
        first = np.broadcast_to(reset[t][:, None], (E, A))
        done = term[t] | trunc[t]
        ends = (acting_next[t] | (done & ~prev_done)) & ~first
        pending = np.where(first, 0.0, pending + raw[t])
        G = np.where(first, 0.0, G)
        new_G = gamma * G + pending
        if update:
            counted += list(new_G[ends])
        var = np.var(counted) if counted else 1.0
        z = raw[t] / np.sqrt(var + epsilon)
        out[t] = z if clip is None else np.clip(z, -clip, clip)
        G = np.where(ends, new_G, G)
        pending = np.where(ends, 0.0, pending)
        G, pending = np.where(done, 0.0, G), np.where(done, 0.0, pending)
        prev_done = done
    return out, np.asarray(counted)


def assert_moments(m, values):
    np.testing.assert_equal(float(m.count), len(values))
    np.testing.assert_allclose(float(m.mean), np.mean(values), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(m.var), np.var(values), rtol=1e-4, atol=1e-6)


def run_calls(env, transforms, E, T, calls, seed=0, state=None):
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    rollout = js.jit_rollout(js.make_rollout(env, pol, E, T, transforms=transforms))
    if state is None:
        state = rollout.init(jax.random.PRNGKey(seed))
    trajs = []
    for _ in range(calls):
        state, traj = rollout((), state)
        trajs.append(jax.device_get(traj))
    return jax.device_get(state), trajs


# ----------------------------------------------------------------------------- NormalizeReward


@pytest.mark.parametrize("clip", [None, 0.8])
def test_normalize_reward_matches_numpy_across_calls(clip):
    tf = NormalizeReward(gamma=0.9, epsilon=1e-6, clip=clip)
    state, trajs = run_calls(FakeEnv(), (tf,), E=4, T=9, calls=2)
    assert sum(t.is_reset.sum() for t in trajs) >= 4  # several episode edges inside the calls
    want, counted = reference(trajs, state.acting, 0.9, 1e-6, clip)
    got = np.concatenate([t.rewards for t in trajs])
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
    assert_moments(state.transform_state.stages[0].shared, counted)
    # The raw buffer holds the env's rewards: FakeEnv's reward is its action (0 at resets).
    raw = np.concatenate([t.raw_rewards for t in trajs])
    acts = np.concatenate([t.actions for t in trajs]).astype(np.float32)
    reset = np.concatenate([t.is_reset for t in trajs])[..., None]
    np.testing.assert_array_equal(raw, np.where(reset, 0.0, acts))
    if clip is not None:
        assert np.isclose(np.abs(got).max(), clip)  # clipping happened somewhere


def test_normalize_reward_multi_agent_out_of_lockstep():
    """ChaosEnv rewards waiting agents too; agents finish at different steps."""
    tf = NormalizeReward(gamma=0.95, clip=None)
    state, trajs = run_calls(ChaosEnv(), (tf,), E=3, T=10, calls=2, seed=3)
    acting = np.concatenate([t.acting for t in trajs])
    raw = np.concatenate([t.raw_rewards for t in trajs])
    assert ((raw != 0) & ~acting).any()  # rewards received while waiting are exercised
    want, counted = reference(trajs, state.acting, 0.95, 1e-8, None)
    np.testing.assert_allclose(np.concatenate([t.rewards for t in trajs]), want, rtol=2e-5)
    assert_moments(state.transform_state.stages[0].shared, counted)


def test_two_calls_equal_one_call_of_twice_the_length():
    tf = NormalizeReward(gamma=0.9)
    s2, (a, b) = run_calls(FakeEnv(), (tf,), E=3, T=7, calls=2, seed=1)
    s1, (c,) = run_calls(FakeEnv(), (tf,), E=3, T=14, calls=1, seed=1)
    for field in ("rewards", "raw_rewards", "terminated", "is_reset"):
        joined = np.concatenate([getattr(a, field), getattr(b, field)])
        np.testing.assert_allclose(joined, getattr(c, field), rtol=1e-6, err_msg=field)
    for x, y in zip(
        jax.tree.leaves(s2.transform_state), jax.tree.leaves(s1.transform_state), strict=True
    ):
        np.testing.assert_allclose(x, y, rtol=1e-6)


def test_returns_restart_at_episode_edges_by_hand():
    """Hand-stepped: rewards 1, 2, 3 (terminal), reset, 4 with gamma 0.5 -> returns
    1, 2.5, 4.25, then 4 (the ended episode leaks nothing). Jitted and not, equal."""
    space = FakeEnv().observation_space
    pipe = build_pipeline((NormalizeReward(gamma=0.5, epsilon=0.25, clip=None),), space, space)
    f = np.zeros((1, 1), bool)
    steps = [  # reward, terminated, acting, first
        (0.0, False, True, True),  # the initial observation
        (1.0, False, True, False),
        (2.0, False, True, False),
        (3.0, True, True, False),
        (0.0, False, True, True),  # reset step: the next episode's first observation
        (4.0, False, True, False),
    ]

    def run(observe):
        state = pipe.init((1, 1))
        out = []
        for r, term, act, first in steps:
            state, seen = observe(
                state,
                jnp.zeros((1, 1, 2)),
                jnp.full((1, 1), r, jnp.float32),
                jnp.asarray(f | term),
                jnp.asarray(f),
                jnp.asarray(f | act),
                jnp.asarray([first]),
                jnp.zeros((1, 1), jnp.int32),
                Context(),
            )
            out.append(float(seen.reward[0, 0]))
        return state, np.asarray(out)

    state, out = run(pipe.observe_env)
    returns = np.array([1.0, 2.5, 4.25, 4.0])
    assert_moments(state.stages[0].shared, returns)
    var = np.array([np.var(returns[: k + 1]) for k in range(4)])
    np.testing.assert_allclose(
        out[[1, 2, 3, 5]], np.array([1.0, 2.0, 3.0, 4.0]) / np.sqrt(var + 0.25), rtol=1e-5
    )
    assert out[0] == 0.0 and out[4] == 0.0
    assert float(state.stages[0].rows[0, 0]) == 0.5 * 4.0
    jit_state, jit_out = run(jax.jit(pipe.observe_env, static_argnums=8))
    np.testing.assert_allclose(jit_out, out, rtol=1e-6)
    for x, y in zip(jax.tree.leaves(jit_state), jax.tree.leaves(state), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6)


def test_frozen_statistics():
    """update=False (and a frozen Context) read the statistics without changing them; the
    state of an updating rollout carries over to a frozen one (same state structure)."""
    env = FakeEnv()
    state, _ = run_calls(env, (NormalizeReward(gamma=0.9),), E=3, T=8, calls=1, seed=2)
    moments = state.transform_state.stages[0].shared
    assert float(moments.count) > 0
    frozen = NormalizeReward(gamma=0.9, update=False)
    state2, (traj,) = run_calls(env, (frozen,), E=3, T=8, calls=1, state=state)
    for x, y in zip(
        jax.tree.leaves(state2.transform_state.stages[0].shared),
        jax.tree.leaves(moments),
        strict=True,
    ):
        np.testing.assert_array_equal(x, y)
    want = np.clip(traj.raw_rewards / np.sqrt(float(moments.var) + 1e-8), -10, 10)
    np.testing.assert_allclose(traj.rewards, want, rtol=1e-6)
    # From scratch, frozen statistics are the identity (variance 1 before any sample).
    _, (fresh,) = run_calls(env, (frozen,), E=3, T=8, calls=1)
    np.testing.assert_allclose(fresh.rewards, fresh.raw_rewards / np.sqrt(1 + 1e-8), rtol=1e-6)
    # A frozen Context freezes an updating transform too.
    space = env.observation_space
    pipe = build_pipeline((NormalizeReward(),), space, space)
    st = pipe.init((2, 1))
    ones = jnp.ones((2, 1), jnp.bool_)
    st2, seen = pipe.observe_env(
        st,
        jnp.zeros((2, 1, 2)),
        jnp.full((2, 1), 3.0),
        ~ones,
        ~ones,
        ones,
        jnp.zeros((2,), jnp.bool_),
        jnp.zeros((2, 1), jnp.int32),
        Context(frozen=True),
    )
    assert float(st2.stages[0].shared.count) == 0.0
    np.testing.assert_allclose(seen.reward, 3.0 / np.sqrt(1 + 1e-8))
    np.testing.assert_allclose(st2.stages[0].rows, 0.99 * 3.0)  # the accumulators run on


def test_composition_with_normalize_observation():
    """Each transform in a pipeline gives what it gives alone (RandomPolicy ignores the
    observations, so the raw data are the same), in either order."""
    env = FakeEnv()
    kw = dict(E=3, T=10, calls=2, seed=4)
    _, obs_only = run_calls(env, (NormalizeObservation(),), **kw)
    s_rew, rew_only = run_calls(env, (NormalizeReward(),), **kw)
    for transforms in [
        (NormalizeObservation(), NormalizeReward()),
        (NormalizeReward(), NormalizeObservation()),
    ]:
        state, both = run_calls(env, transforms, **kw)
        i = [type(t) for t in transforms].index(NormalizeReward)
        for a, o, r in zip(both, obs_only, rew_only, strict=True):
            np.testing.assert_array_equal(a.raw_rewards, r.raw_rewards)
            np.testing.assert_array_equal(a.raw_obs, o.raw_obs)
            np.testing.assert_allclose(a.obs, o.obs, rtol=1e-6)
            np.testing.assert_allclose(a.rewards, r.rewards, rtol=1e-6)
        for x, y in zip(
            jax.tree.leaves(state.transform_state.stages[i]),
            jax.tree.leaves(s_rew.transform_state.stages[0]),
            strict=True,
        ):
            np.testing.assert_allclose(x, y, rtol=1e-6)


def test_scale_then_normalize_is_scale_invariant():
    """NormalizeReward divides by the returns' std: a constant factor before it cancels
    (up to epsilon), and the return variance grows by its square."""
    env = FakeEnv()
    s1, (t1,) = run_calls(env, (NormalizeReward(clip=None),), E=3, T=12, calls=1, seed=5)
    s2, (t2,) = run_calls(
        env, (ScaleReward(7.0), NormalizeReward(clip=None)), E=3, T=12, calls=1, seed=5
    )
    np.testing.assert_allclose(t2.rewards, t1.rewards, rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(t2.raw_rewards, t1.raw_rewards)  # the env's, not scaled
    v1 = s1.transform_state.stages[0].shared.var
    v2 = s2.transform_state.stages[1].shared.var
    np.testing.assert_allclose(v2, 49.0 * v1, rtol=1e-5)


# ----------------------------------------------------------------------------- stateless


@pytest.mark.parametrize(
    "tf, fn",
    [
        (ScaleReward(-0.5), lambda r: -0.5 * r),
        (ClipReward(0.5, 1.5), lambda r: np.clip(r, 0.5, 1.5)),
        (ClipReward(None, 1.0), lambda r: np.minimum(r, 1.0)),
        (ClipReward(sign=True), np.sign),
        (ClipReward(0.0, None, sign=True), lambda r: np.maximum(np.sign(r), 0.0)),
    ],
)
def test_stateless_reward_transforms(tf, fn):
    env = ChaosEnv()  # rewards 0 .. 2 in quarters
    state, (traj,) = run_calls(env, (ScaleReward(2.0), tf, ScaleReward(-1.0)), E=3, T=8, calls=1)
    assert tf.changes_reward and traj.raw_rewards is not None
    np.testing.assert_allclose(traj.rewards, -fn(2.0 * traj.raw_rewards), rtol=1e-6)
    assert traj.rewards.dtype == np.float32
    assert state.transform_state.stages[1] == js.transforms.StageState()  # nothing carried


# ----------------------------------------------------------------------------- jit, errors


def test_no_recompilation():
    env = FakeEnv()
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    rollout = js.make_rollout(
        env, pol, 3, 5, transforms=(NormalizeObservation(), NormalizeReward(), ClipReward())
    )

    @jax.jit
    @chex.assert_max_traces(n=1)
    def call(state):
        return rollout((), state)

    state = rollout.init(jax.random.PRNGKey(0))
    for _ in range(3):
        state, traj = call(state)
    call(rollout.init(jax.random.PRNGKey(1)))  # a fresh state of the same shapes
    assert traj.raw_rewards.shape == (5, 3, 1)


@pytest.mark.parametrize(
    "make, err, words",
    [
        (lambda: NormalizeReward(gamma=1.5), ValueError, "gamma must be in [0, 1]"),
        (lambda: NormalizeReward(gamma="0.9"), TypeError, "gamma must be a real number"),
        (lambda: NormalizeReward(epsilon=-1.0), ValueError, "epsilon must be >= 0"),
        (lambda: NormalizeReward(clip=0.0), ValueError, "clip must be > 0"),
        (lambda: NormalizeReward(update=1), TypeError, "update must be a bool"),
        (lambda: ScaleReward(float("inf")), ValueError, "scale must be finite"),
        (lambda: ScaleReward(None), TypeError, "scale must be a real number"),
        (lambda: ClipReward(1.0, -1.0), ValueError, "low must be <= high"),
        (lambda: ClipReward(float("nan"), 1.0), ValueError, "low must not be NaN"),
    ],
)
def test_bad_parameters(make, err, words):
    with pytest.raises(err, match=words.replace("[", r"\[").replace("]", r"\]")):
        make()


# ----------------------------------------------------------------------------- sharded

SHARDED = textwrap.dedent(
    """
    import jax, numpy as np
    import jaxsampler as js
    from jaxsampler.rollout import placement
    from jaxsampler.transforms import NormalizeObservation
    from jaxsampler.transforms.reward import NormalizeReward
    from tests.fakes import ChaosEnv, FakeEnv
    from tests.transforms.test_reward import reference, assert_moments
    assert jax.device_count() == 2, jax.devices()
    mesh = placement.env_mesh(2)
    for env, E in ((FakeEnv(), 6), (ChaosEnv(), 4)):
        pol = js.RandomPolicy(env.observation_space, env.action_space)
        tfs = (NormalizeObservation(), NormalizeReward(gamma=0.9, clip=2.0))
        rollout = js.jit_rollout(js.make_rollout(env, pol, E, 8, mesh=mesh, transforms=tfs))
        state = rollout.init(jax.random.PRNGKey(0))
        trajs = []
        for _ in range(2):
            state, traj = rollout((), state)
            trajs.append(jax.device_get(traj))
        moments = state.transform_state.stages[1].shared
        # Replicated: every device holds the same, global statistics.
        for leaf in jax.tree.leaves(moments):
            shards = [np.asarray(s.data) for s in leaf.addressable_shards]
            assert len(shards) == 2 and all(np.array_equal(shards[0], s) for s in shards)
        state = jax.device_get(state)
        want, counted = reference(trajs, state.acting, 0.9, 1e-8, 2.0)
        got = np.concatenate([t.rewards for t in trajs])
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
        assert_moments(state.transform_state.stages[1].shared, counted)
        raw = trajs[0].raw_rewards
        assert not np.array_equal(raw[:, : E // 2], raw[:, E // 2 :])  # shards differ
    print("SHARDED-REWARD-OK")
    """
)


def test_sharded_over_two_cpu_devices():
    run_on_devices(SHARDED, "SHARDED-REWARD-OK", timeout=300)
