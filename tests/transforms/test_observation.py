"""NormalizeObservation in the rollout, against float64 NumPy statistics over exactly the
raw observations that enter the agents' episodes (one device and 2 CPU devices)."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path
from typing import Any

import chex
import jax
import numpy as np

import jaxsampler as js
from jaxsampler.spaces import Box, Dict, Discrete, Tuple
from jaxsampler.transforms.base import Context, build_pipeline
from jaxsampler.transforms.normalize import NormalizeObservation
from tests.devices import run_on_devices
from tests.fakes import ChaosEnv, FakeEnv

ROOT = Path(__file__).resolve().parents[2]
EPS = 1e-8


# ----------------------------------------------------------------- NumPy reference helpers


def concat_calls(trajs: list[Any], final_state: Any) -> dict[str, Any]:
    """Consecutive rollout calls as one time line: ``obs`` ``[N + 1, E, A, ...]`` (raw env
    observations; each call's slot 0 is the previous call's last slot), per-step data
    ``[N, ...]``, ``acting_on [N + 1, E, A]`` (the agent acts on observation slot t)."""
    raw = [t.obs if t.raw_obs is None else t.raw_obs for t in trajs]
    rew = [np.asarray(t.rewards if t.raw_rewards is None else t.raw_rewards) for t in trajs]

    def slots(trees: list[Any]) -> Any:  # pytrees of [T + 1, ...] leaves, joined
        return jax.tree.map(
            lambda first, *rest: np.concatenate([np.asarray(first)] + [r[1:] for r in rest]),
            *trees,
        )

    def cat(field: str) -> Any:
        return jax.tree.map(
            lambda *xs: np.concatenate([np.asarray(x) for x in xs]),
            *[getattr(t, field) for t in trajs],
        )

    return {
        "obs": slots(raw),
        "seen": slots([t.obs for t in trajs]),
        "actions": cat("actions"),
        "rewards": np.concatenate(rew),
        "terminated": cat("terminated"),
        "truncated": cat("truncated"),
        "is_reset": cat("is_reset"),
        "acting_on": np.concatenate([cat("acting"), np.asarray(final_state.acting)[None]]),
    }


def step_flags(run: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(recorded, first, done)`` per observation slot, ``[N + 1, E, A]`` (``first``
    ``[N + 1, E]``), derived from the trajectory's flags alone: an observation is recorded
    if the agent acts on it or it is the agent's newly final one; slot 0 and the slot after
    every reset step start an episode."""
    n, num_envs = run["is_reset"].shape
    done = np.zeros(run["acting_on"].shape, bool)
    done[1:] = run["terminated"] | run["truncated"]
    first = np.zeros((n + 1, num_envs), bool)
    first[0] = True
    first[1:] = run["is_reset"]
    recorded = run["acting_on"].copy()
    recorded[1:] |= done[1:] & ~done[:-1]
    return recorded, first, done


def running_moments(x: np.ndarray, recorded: np.ndarray) -> tuple[np.ndarray, ...]:
    """Float64 ``(count, mean, var)`` after each slot, over every ``x[s, e, a]`` recorded
    at a slot ``s <= t`` (population variance; 1 before any sample)."""
    x = x.astype(np.float64)
    counts, means, variances = [], [], []
    for t in range(x.shape[0]):
        sel = x[: t + 1][recorded[: t + 1]]
        counts.append(len(sel))
        if len(sel):
            means.append(sel.mean(axis=0))
            variances.append(sel.var(axis=0))
        else:
            means.append(np.zeros(x.shape[3:]))
            variances.append(np.ones(x.shape[3:]))
    return np.array(counts), np.array(means), np.array(variances)


def normalized(x: np.ndarray, mean: np.ndarray, var: np.ndarray, clip: float | None) -> np.ndarray:
    """The reference normalization of slots ``x [N + 1, E, A, *s]`` with per-slot stats."""
    z = (x - mean[:, None, None]) / np.sqrt(var[:, None, None] + EPS)
    return z if clip is None else np.clip(z, -clip, clip)


def moments_of(state: Any, stage: int = 0, leaf: int = 0) -> Any:
    return state.transform_state.stages[stage].shared[leaf]


# ------------------------------------------------------------------------------ set-ups


def setup(env: Any, num_envs: int, length: int, tf: tuple, seed: int = 0) -> tuple:
    pipe = js.rollout.pipeline_of(env, tf)
    pol = js.RandomPolicy(pipe.observation_space, pipe.action_space)
    rollout = js.jit_rollout(js.make_rollout(env, pol, num_envs, length, transforms=tf))
    return rollout, rollout.init(jax.random.PRNGKey(seed))


def run_calls(rollout: Any, state: Any, calls: int) -> tuple[Any, list[Any]]:
    trajs = []
    for _ in range(calls):
        state, traj = rollout((), state)
        trajs.append(jax.device_get(traj))
    return state, trajs


def check_against_numpy(state: Any, trajs: list[Any], clip: float | None) -> dict[str, Any]:
    run = concat_calls(trajs, state)
    recorded, _, _ = step_flags(run)
    counts, means, variances = running_moments(run["obs"], recorded)
    m = moments_of(state)
    assert float(m.count) == counts[-1]
    np.testing.assert_allclose(np.asarray(m.mean), means[-1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(m.var), variances[-1], rtol=1e-4, atol=1e-6)
    # What the policy saw at every slot: the raw observation normalized with the
    # statistics of that step (updated first), the last step included.
    want = normalized(run["obs"], means, variances, clip)
    np.testing.assert_allclose(run["seen"], want, rtol=1e-4, atol=2e-4)
    return {"run": run, "recorded": recorded, "counts": counts}


# -------------------------------------------------------------------------------- tests


def test_single_agent_stats_after_one_and_several_calls():
    tf = (NormalizeObservation(clip=None),)
    rollout, state = setup(FakeEnv(), 3, 7, tf)
    state, trajs = run_calls(rollout, state, 1)
    out = check_against_numpy(state, trajs, None)
    # Single agent: every observation is recorded (the initial ones and every new one).
    assert out["recorded"].all() and out["counts"][-1] == 3 * 8
    state, more = run_calls(rollout, state, 2)
    out = check_against_numpy(state, trajs + more, None)
    assert out["counts"][-1] == 3 * (1 + 3 * 7)
    assert out["run"]["is_reset"].any(), "the run should cross episode ends"


def test_clipped_normalization_matches_numpy():
    tf = (NormalizeObservation(clip=1.5),)
    rollout, state = setup(FakeEnv(), 3, 6, tf, seed=3)
    state, trajs = run_calls(rollout, state, 2)
    out = check_against_numpy(state, trajs, 1.5)
    assert np.abs(out["run"]["seen"]).max() == np.float32(1.5)


def test_multi_agent_out_of_lockstep_counts_acting_and_final_observations():
    tf = (NormalizeObservation(clip=None),)
    rollout, state = setup(ChaosEnv(), 3, 9, tf, seed=1)
    state, trajs = run_calls(rollout, state, 2)
    out = check_against_numpy(state, trajs, None)
    recorded, run = out["recorded"], out["run"]
    # The fixture exercises what must be left out and what must be counted.
    assert not recorded.all(), "some agents wait"
    done = np.zeros_like(recorded)
    done[1:] = run["terminated"] | run["truncated"]
    newly_final = recorded & ~run["acting_on"]
    assert newly_final.any() and done[newly_final].all()


def test_tictactoe_counts_only_the_mover_and_final_boards():
    env = js.make("TicTacToe-v0")
    tf = (NormalizeObservation(clip=None),)
    rollout, state = setup(env, 2, 8, tf, seed=2)
    state, trajs = run_calls(rollout, state, 2)
    out = check_against_numpy(state, trajs, None)
    recorded = out["recorded"]
    # Exactly one agent moves per step, both see the final board.
    assert (recorded.sum(-1) >= 1).all() and (recorded.sum(-1) == 2).any()


def test_update_false_and_frozen_context_freeze_the_statistics():
    env = FakeEnv()
    rollout, state = setup(env, 3, 5, (NormalizeObservation(clip=None),))
    state, _ = rollout((), state)
    before = jax.device_get(moments_of(state))
    assert float(before.count) > 0
    # update=False: the same state shapes, the statistics untouched; obs normalized by them.
    frozen_tf = (NormalizeObservation(clip=None, update=False),)
    pipe = js.rollout.pipeline_of(env, frozen_tf)
    pol = js.RandomPolicy(pipe.observation_space, pipe.action_space)
    frozen = js.jit_rollout(js.make_rollout(env, pol, 3, 5, transforms=frozen_tf))
    state, traj = frozen((), state)
    after = jax.device_get(moments_of(state))
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True):
        np.testing.assert_array_equal(a, b)
    traj = jax.device_get(traj)
    want = (np.asarray(traj.raw_obs) - before.mean) / np.sqrt(np.asarray(before.var) + EPS)
    np.testing.assert_allclose(traj.obs[1:], want[1:], rtol=1e-5, atol=1e-5)
    # A frozen Context does the same for an updating transform.
    tstate = state.transform_state
    x = np.asarray(traj.raw_obs[-1])
    ones = np.ones(x.shape[:2], bool)
    step = dict(reward=np.zeros(x.shape[:2], np.float32), terminated=~ones, truncated=~ones)
    upd = js.rollout.pipeline_of(env, (NormalizeObservation(clip=None),))
    zeros = js.rollout.policy_action_zeros(upd, x.shape[:2])
    for ctx, changes in ((Context(frozen=True), False), (Context(), True)):
        new, seen = upd.observe_env(
            tstate, x, **step, acting=ones, first=~ones[:, 0], action=zeros, ctx=ctx
        )
        m = new.stages[0].shared[0]
        assert changes == (float(m.count) != float(before.count))
        if not changes:
            np.testing.assert_array_equal(np.asarray(m.mean), before.mean)
            want = (x - before.mean) / np.sqrt(np.asarray(before.var) + EPS)
            np.testing.assert_allclose(np.asarray(seen.obs), want, rtol=1e-5, atol=1e-5)


def test_two_calls_of_t_equal_one_call_of_2t():
    tf = (NormalizeObservation(),)
    short, s1 = setup(FakeEnv(), 3, 4, tf, seed=5)
    long, s2 = setup(FakeEnv(), 3, 8, tf, seed=5)
    s1, trajs = run_calls(short, s1, 2)
    s2, (whole,) = run_calls(long, s2, 1)
    np.testing.assert_array_equal(
        np.concatenate([trajs[0].obs, trajs[1].obs[1:]]), np.asarray(whole.obs)
    )
    np.testing.assert_array_equal(
        np.concatenate([trajs[0].raw_obs, trajs[1].raw_obs[1:]]), np.asarray(whole.raw_obs)
    )
    for a, b in zip(jax.tree.leaves(moments_of(s1)), jax.tree.leaves(moments_of(s2)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_no_recompilation_over_repeated_calls():
    env = ChaosEnv()
    tf = (NormalizeObservation(),)
    pipe = js.rollout.pipeline_of(env, tf)
    pol = js.RandomPolicy(pipe.observation_space, pipe.action_space)
    inner = js.make_rollout(env, pol, 2, 3, transforms=tf)
    chex.clear_trace_counter()
    counted = dataclasses.replace(inner, run=chex.assert_max_traces(inner.run, n=1))
    rollout = js.jit_rollout(counted)
    state, traj = rollout((), rollout.init(jax.random.PRNGKey(0)))
    for _ in range(3):
        state, traj = rollout((), state, traj)
    state, traj = rollout((), rollout.init(jax.random.PRNGKey(1)), traj)  # a fresh state
    assert float(moments_of(state).count) > 0


def test_rng_streams_unchanged_by_transforms():
    """The env and the policy draw the same numbers with and without transforms."""
    env = ChaosEnv()
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    plain = js.jit_rollout(js.make_rollout(env, pol, 3, 6))
    tf = (NormalizeObservation(),)
    with_tf = js.jit_rollout(js.make_rollout(env, pol, 3, 6, transforms=tf))
    sa, ta = run_calls(plain, plain.init(jax.random.PRNGKey(7)), 2)
    sb, tb = run_calls(with_tf, with_tf.init(jax.random.PRNGKey(7)), 2)
    for a, b in zip(ta, tb, strict=True):
        np.testing.assert_array_equal(a.obs, b.raw_obs)
        for field in ("actions", "rewards", "terminated", "truncated", "acting", "is_reset"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    np.testing.assert_array_equal(np.asarray(sa.key), np.asarray(sb.key))
    assert not np.array_equal(tb[0].obs, tb[0].raw_obs)


SHARDED = textwrap.dedent(
    """
    import jax, numpy as np
    import jaxsampler as js
    from jaxsampler.rollout import placement
    from jaxsampler.transforms.normalize import NormalizeObservation
    from tests.fakes import ChaosEnv, FakeEnv
    from tests.transforms.test_observation import check_against_numpy, moments_of, run_calls
    assert jax.device_count() == 2, jax.devices()
    mesh = placement.env_mesh(2)
    tf = (NormalizeObservation(clip=None),)
    for env, E, T in ((FakeEnv(), 4, 6), (ChaosEnv(), 4, 7)):
        pipe = js.rollout.pipeline_of(env, tf)
        pol = js.RandomPolicy(pipe.observation_space, pipe.action_space)
        rollout = js.jit_rollout(js.make_rollout(env, pol, E, T, mesh=mesh, transforms=tf))
        state = rollout.init(jax.random.PRNGKey(3))
        state, first = run_calls(rollout, state, 1)
        check_against_numpy(jax.device_get(state), first, None)
        state, more = run_calls(rollout, state, 1)
        out = check_against_numpy(jax.device_get(state), first + more, None)
        assert env.num_agents == 1 or not out["recorded"].all()
        m = moments_of(state)
        for leaf in (m.count, m.mean, m.m2):
            shards = [np.asarray(s.data) for s in leaf.addressable_shards]
            assert len(shards) == 2
            np.testing.assert_array_equal(shards[0], shards[1])
    print("SHARDED-NORMALIZE-OK")
    """
)


def test_sharded_statistics_equal_numpy_over_all_envs():
    run_on_devices(SHARDED, "SHARDED-NORMALIZE-OK", timeout=300)


def test_dict_observation_space_bounds():
    """Normalized float leaves get the clip bounds; integer leaves and the mask keep theirs."""
    space = Dict(
        pos=Box(0.0, 1.0, (2,), np.float32),
        count=Box(0, 9, (1,), np.int32),
        action_mask=Box(0.0, 1.0, (3,), np.float32),
    )
    pipe = build_pipeline((NormalizeObservation(clip=5.0),), space, Discrete(3))
    assert pipe.observation_space == Dict(
        pos=Box(-5.0, 5.0, (2,), np.float32),
        count=space["count"],
        action_mask=space["action_mask"],
    )
    unclipped = build_pipeline(
        (NormalizeObservation(clip=None),), Tuple([space["pos"]]), Discrete(3)
    )
    assert unclipped.observation_space == Tuple([Box(-np.inf, np.inf, (2,), np.float32)])
