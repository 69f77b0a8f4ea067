"""FrameStack, PrevActionsRewards, ClipActions, RescaleActions and FlattenObservation in the
rollout, each against an independent NumPy re-implementation driven from the
trajectory's raw observations, actions, rewards and flags; compositions; bad input."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import jaxsampler as js
from jaxsampler.envs.base import SingleAgentEnv
from jaxsampler.policies.base import Policy, batch_dims
from jaxsampler.policies.mlp import MLPPolicy
from jaxsampler.spaces import Box, Dict, Discrete, MultiDiscrete, Space, Tuple
from jaxsampler.transforms.actions import ClipActions, RescaleActions
from jaxsampler.transforms.base import (
    Context,
    Spaces,
    Transform,
    TransformSpaceError,
    build_pipeline,
)
from jaxsampler.transforms.flatten import FlattenObservation
from jaxsampler.transforms.normalize import NormalizeObservation
from jaxsampler.transforms.stack import FrameStack, PrevActionsRewards
from jaxsampler.types import NoInfo
from tests.fakes import ChaosEnv, FakeParams
from tests.transforms.test_observation import (
    concat_calls,
    normalized,
    running_moments,
    step_flags,
)

# ------------------------------------------------------------------------------- fakes


@struct.dataclass
class SampleState:
    time: jax.Array


@dataclasses.dataclass(frozen=True)
class SampleEnv(SingleAgentEnv):
    """obs = a fresh sample of ``obs_space`` at reset and every step; reward =
    ``k / 4 - 1`` for a random ``k`` in 0..8 (unrelated to the action); terminated with
    probability ``p_term`` per step, truncated at ``max_steps_in_episode`` (5)."""

    obs_space: Space = Box(-1.0, 1.0, (2,), np.float32)
    act_space: Space = Discrete(3)
    p_term: float = 0.2

    @property
    def default_params(self) -> FakeParams:
        return FakeParams()

    @property
    def observation_space(self) -> Space:
        return self.obs_space

    @property
    def action_space(self) -> Space:
        return self.act_space

    def reset_env(self, key, params):
        return self.obs_space.sample(key), SampleState(jnp.zeros((), jnp.int32))

    def step_env(self, key, state, action, params):
        k_obs, k_rew, k_term = jax.random.split(key, 3)
        reward = jax.random.randint(k_rew, (), 0, 9).astype(jnp.float32) / 4 - 1
        terminated = jax.random.bernoulli(k_term, self.p_term)
        return self.obs_space.sample(k_obs), state, reward, terminated, NoInfo()


ECHO_BOX = Box(np.array([-2.0, 0.0]), np.array([2.0, 10.0]), (2,), np.float32)


@dataclasses.dataclass(frozen=True)
class EchoEnv(SingleAgentEnv):
    """obs = the action the env received (zeros at reset); reward 0; truncated at 5."""

    act_space: Space = ECHO_BOX

    @property
    def default_params(self) -> FakeParams:
        return FakeParams()

    @property
    def observation_space(self) -> Box:
        return Box(-np.inf, np.inf, (2,), np.float32)

    @property
    def action_space(self) -> Space:
        return self.act_space

    def reset_env(self, key, params):
        return jnp.zeros((2,), jnp.float32), SampleState(jnp.zeros((), jnp.int32))

    def step_env(self, key, state, action, params):
        return action.astype(jnp.float32), state, jnp.float32(0), jnp.asarray(False), NoInfo()


@dataclasses.dataclass(frozen=True)
class WidePolicy(Policy):
    """Box actions ``4 * N(0, 1)``: often outside the action space's bounds."""

    observation_space: Space
    action_space: Box

    def init(self, key):
        return ()

    def __call__(self, params, obs, key, state):
        batch = batch_dims(obs, self.observation_space)
        action = 4.0 * jax.random.normal(key, batch + self.action_space.shape, jnp.float32)
        return action, {}, state


def rollout_run(env, tf, num_envs=3, length=6, calls=2, seed=0, policy=None, mlp=False):
    """Runs ``calls`` rollout calls; returns (pipeline, concatenated run, flags)."""
    pipe = js.rollout.pipeline_of(env, tf)
    if policy is not None:
        pol = policy(pipe.observation_space, pipe.action_space)
    elif mlp:
        pol = MLPPolicy(pipe.observation_space, pipe.action_space, (8,))
    else:
        pol = js.RandomPolicy(pipe.observation_space, pipe.action_space)
    params = pol.init(jax.random.PRNGKey(seed + 100))
    rollout = js.jit_rollout(js.make_rollout(env, pol, num_envs, length, transforms=tf))
    state = rollout.init(jax.random.PRNGKey(seed))
    trajs = []
    for _ in range(calls):
        state, traj = rollout(params, state)
        trajs.append(jax.device_get(traj))
    run = concat_calls(trajs, state)
    recorded, first, done = step_flags(run)
    assert run["is_reset"].any(), "the run should cross an episode end"
    return pipe, run, {"recorded": recorded, "first": first, "done": done}


def episode_starts(first: np.ndarray) -> np.ndarray:
    """``[N + 1, E]``: the slot that starts the episode each slot belongs to."""
    start = np.zeros(first.shape, int)
    for t in range(first.shape[0]):
        start[t] = np.where(first[t], t, start[t - 1] if t else 0)
    return start


def history_slots(flags: dict, t: int, e: int, a: int) -> list[int]:
    """The agent's recorded slots of its current episode before slot ``t``."""
    s = episode_starts(flags["first"])[t, e]
    return [r for r in range(s, t) if flags["recorded"][r, e, a]]


# ------------------------------------------------------------------ NumPy references


def framestack_ref(obs: np.ndarray, flags: dict, k: int) -> np.ndarray:
    """``[N + 1, E, A, k, ...]``: at slot ``t`` the agent's recorded observations of the
    episode before ``t``, then ``obs[t]``; the last ``k``, front-padded with the oldest."""
    out = np.zeros(obs.shape[:3] + (k,) + obs.shape[3:], obs.dtype)
    for t in range(obs.shape[0]):
        for e in range(obs.shape[1]):
            for a in range(obs.shape[2]):
                seq = (history_slots(flags, t, e, a) + [t])[-k:]
                seq = [seq[0]] * (k - len(seq)) + seq
                out[t, e, a] = obs[seq, e, a]
    return out


def prev_ref(run: dict, flags: dict, n: int, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(prev_actions [N + 1, E, A, n, ...], prev_rewards [N + 1, E, A, n])``: one entry per
    earlier recorded observation of the agent's episode: the action the agent took on it
    (minus ``start``; 0 if it was final) and the rewards summed up to the next one."""
    acts, rews, done = run["actions"], run["rewards"], flags["done"]
    n1, num_envs, num_agents = flags["recorded"].shape
    pa = np.zeros((n1, num_envs, num_agents, n) + acts.shape[3:], acts.dtype)
    pr = np.zeros((n1, num_envs, num_agents, n), np.float32)
    for t in range(n1):
        for e in range(num_envs):
            for a in range(num_agents):
                seq = history_slots(flags, t, e, a) + [t]
                entries = []
                for r, nxt in zip(seq[:-1], seq[1:], strict=True):
                    act = 0 * acts[r, e, a] if done[r, e, a] else acts[r, e, a] - start
                    entries.append((act, rews[r:nxt, e, a].sum()))
                for i, (act, rew) in enumerate(entries[-n:][::-1]):
                    pa[t, e, a, n - 1 - i] = act
                    pr[t, e, a, n - 1 - i] = rew
    return pa, pr


def flatten_ref(space: Space, x: Any) -> np.ndarray:
    """NumPy flattening: Box raveled, Discrete / MultiDiscrete one-hot, Dict sorted keys."""
    if isinstance(space, Dict):
        return np.concatenate([flatten_ref(space[k], x[k]) for k in sorted(space.spaces)], -1)
    if isinstance(space, Tuple):
        return np.concatenate(
            [flatten_ref(s, xi) for s, xi in zip(space.spaces, x, strict=True)], -1
        )
    x = np.asarray(x)
    if isinstance(space, Discrete):
        return np.eye(space.n, dtype=np.float32)[x - space.start]
    batch = x.shape[: x.ndim - len(space.shape)]
    if isinstance(space, MultiDiscrete):
        flat = x.reshape(batch + (-1,))
        nvec = space.nvec.ravel()
        return np.concatenate(
            [np.eye(int(m), dtype=np.float32)[flat[..., j]] for j, m in enumerate(nvec)], -1
        )
    return x.reshape(batch + (-1,)).astype(np.float32)


# --------------------------------------------------------------------------- FrameStack


def test_framestack_single_agent_matches_numpy():
    env = SampleEnv()
    pipe, run, flags = rollout_run(env, (FrameStack(3),))
    assert flags["recorded"].all()
    want = framestack_ref(run["obs"], flags, 3)
    np.testing.assert_array_equal(run["seen"], want)
    # Episode starts fill every slot with the first observation; final ones keep history.
    starts = np.argwhere(flags["first"])
    assert all((run["seen"][t, e, 0] == run["obs"][t, e, 0]).all() for t, e in starts)
    space = pipe.observation_space
    assert space == Box(-1.0, 1.0, (3, 2), np.float32)


def test_framestack_multi_agent_pushes_only_recorded_frames():
    env = ChaosEnv()
    _, run, flags = rollout_run(env, (FrameStack(3),), length=9, seed=1)
    assert not flags["recorded"].all()
    np.testing.assert_array_equal(run["seen"], framestack_ref(run["obs"], flags, 3))


def test_framestack_dict_stacks_each_box_and_keeps_the_mask():
    obs_space = Dict(
        pos=Box(-1.0, 1.0, (2,), np.float32),
        grid=Box(0, 4, (2, 2), np.int32),
        action_mask=Box(0, 1, (3,), np.int32),
    )
    env = SampleEnv(obs_space=obs_space)
    pipe, run, flags = rollout_run(env, (FrameStack(2),), length=5)
    space = pipe.observation_space
    assert space["pos"] == Box(-1.0, 1.0, (2, 2), np.float32)
    assert space["grid"] == Box(0, 4, (2, 2, 2), np.int32)
    assert space["action_mask"] == obs_space["action_mask"]
    for key in ("pos", "grid"):
        want = framestack_ref(run["obs"][key], flags, 2)
        np.testing.assert_array_equal(run["seen"][key], want)
    np.testing.assert_array_equal(run["seen"]["action_mask"], run["obs"]["action_mask"])
    tup = build_pipeline(FrameStack(2), Tuple([Box(0.0, 1.0, (1,)), Box(-2.0, 2.0, ())]), ECHO_BOX)
    assert tup.observation_space == Tuple([Box(0.0, 1.0, (2, 1)), Box(-2.0, 2.0, (2,))])


# -------------------------------------------------------------------- PrevActionsRewards


def test_prev_actions_rewards_single_agent_discrete_matches_numpy():
    env = SampleEnv(act_space=Discrete(3, start=1))
    pipe, run, flags = rollout_run(env, (PrevActionsRewards(2),))
    pa, pr = prev_ref(run, flags, 2, start=1)
    np.testing.assert_array_equal(run["seen"]["prev_actions"], pa)
    np.testing.assert_array_equal(run["seen"]["prev_rewards"], pr)
    np.testing.assert_array_equal(run["seen"]["observations"], run["obs"])
    space = pipe.observation_space
    assert space["prev_actions"] == MultiDiscrete([3, 3])
    assert space["prev_rewards"] == Box(-np.inf, np.inf, (2,), np.float32)
    assert space["observations"] == env.observation_space
    # The independent, direct reading for one agent: the last steps of the episode.
    start = episode_starts(flags["first"])
    for t, e in [(t, e) for t in range(pa.shape[0]) for e in range(pa.shape[1])]:
        steps = [j for j in (t - 2, t - 1) if j >= start[t, e]]
        got = [int(x) for x in pa[t, e, 0][2 - len(steps) :]]
        assert got == [int(run["actions"][j, e, 0]) - 1 for j in steps]
        assert not pa[t, e, 0][: 2 - len(steps)].any()


def test_prev_actions_rewards_box_actions_are_the_policys_own():
    env = EchoEnv()
    tf = (PrevActionsRewards(3), ClipActions())
    pipe, run, flags = rollout_run(env, tf, policy=WidePolicy)
    pa, pr = prev_ref(run, flags, 3)
    np.testing.assert_array_equal(run["seen"]["prev_actions"], pa)
    np.testing.assert_array_equal(run["seen"]["prev_rewards"], pr)
    assert pipe.observation_space["prev_actions"] == Box(-np.inf, np.inf, (3, 2), np.float32)
    assert (np.abs(pa) > 2).any(), "unclipped policy actions"


def test_prev_actions_rewards_multi_agent_accumulates_waiting_rewards():
    env = ChaosEnv()
    _, run, flags = rollout_run(env, (PrevActionsRewards(2),), length=9, seed=2)
    pa, pr = prev_ref(run, flags, 2)
    np.testing.assert_array_equal(run["seen"]["prev_actions"], pa)
    np.testing.assert_allclose(run["seen"]["prev_rewards"], pr, rtol=0, atol=1e-6)
    # Some entries sum the rewards of several steps (an agent that waited).
    rec = flags["recorded"]
    waited = [
        (t, e, a)
        for t, e, a in np.argwhere(rec)
        if len(h := history_slots(flags, t, e, a)) and t - h[-1] > 1
    ]
    assert waited


def test_prev_actions_rewards_hoists_the_action_mask():
    obs_space = Dict(pos=Box(-1.0, 1.0, (2,)), action_mask=Box(0, 1, (3,), np.bool_))
    pipe = build_pipeline((PrevActionsRewards(2), FlattenObservation()), obs_space, Discrete(3))
    space = pipe.observation_space
    assert set(space.spaces) == {"observations", "action_mask"}
    assert space["observations"] == Box(
        [-1, -1] + [0] * 6 + [-np.inf] * 2, [1, 1] + [1] * 6 + [np.inf] * 2, (10,)
    )
    mid = pipe.spaces[1].obs
    assert set(mid.spaces) == {"observations", "prev_actions", "prev_rewards", "action_mask"}


# ------------------------------------------------------------------ Clip / RescaleActions


def echo_run(tf, policy):
    _, run, flags = rollout_run(EchoEnv(), tf, policy=policy)
    step = ~run["is_reset"]  # steps whose action reached the env (not a reset)
    return run, run["obs"][1:][step], run["actions"][step]


def test_clip_actions_env_gets_clipped_trajectory_keeps_policy_action():
    run, received, taken = echo_run((ClipActions(),), WidePolicy)
    assert ((taken < ECHO_BOX.low) | (taken > ECHO_BOX.high)).any()
    np.testing.assert_array_equal(received, np.clip(taken, ECHO_BOX.low, ECHO_BOX.high))


@pytest.mark.parametrize("low, high", [(-1.0, 1.0), (0.0, 4.0)])
def test_rescale_actions_maps_policy_bounds_onto_the_env(low, high):
    tf = (RescaleActions(low, high),)
    pipe = js.rollout.pipeline_of(EchoEnv(), tf)
    assert pipe.action_space == Box(low, high, (2,), np.float32)
    run, received, taken = echo_run(tf, js.RandomPolicy)
    assert (taken >= low).all() and (taken <= high).all()
    span = ECHO_BOX.high.astype(np.float64) - ECHO_BOX.low
    want = ECHO_BOX.low + (taken.astype(np.float64) - low) / (high - low) * span
    np.testing.assert_allclose(received, want, rtol=1e-6, atol=1e-6)
    ends = RescaleActions(low, high).to_env(pipe.spaces[0], jnp.array([[low, low], [high, high]]))
    np.testing.assert_allclose(ends, [ECHO_BOX.low, ECHO_BOX.high], rtol=1e-6)


def test_clip_after_rescale():
    """Env side first: the policy's action is rescaled, then clipped."""
    run, received, taken = echo_run((ClipActions(), RescaleActions()), WidePolicy)
    scaled = ECHO_BOX.low + (taken.astype(np.float64) + 1) / 2 * (ECHO_BOX.high - ECHO_BOX.low)
    np.testing.assert_allclose(
        received, np.clip(scaled, ECHO_BOX.low, ECHO_BOX.high), rtol=1e-6, atol=1e-6
    )
    assert (np.abs(taken) > 1).any()


# ------------------------------------------------------------------ FlattenObservation

STRUCT = Dict(
    pos=Box(-1.0, 1.0, (2,), np.float32),
    kind=Discrete(3, start=1),
    multi=MultiDiscrete([2, 3]),
    grid=Box(0, 5, (2, 2), np.int32),
    action_mask=Box(0, 1, (3,), np.int32),
)


def test_flatten_dict_with_mask_matches_numpy():
    env = SampleEnv(obs_space=STRUCT)
    pipe, run, _ = rollout_run(env, (FlattenObservation(),), length=4)
    rest = Dict({k: v for k, v in STRUCT.spaces.items() if k != "action_mask"})
    want = flatten_ref(rest, {k: v for k, v in run["obs"].items() if k != "action_mask"})
    np.testing.assert_array_equal(run["seen"]["observations"], want)
    np.testing.assert_array_equal(run["seen"]["action_mask"], run["obs"]["action_mask"])
    # Sorted keys: grid (4), kind (3 one-hot), multi (2 + 3 one-hot), pos (2).
    low = [0] * 4 + [0] * 3 + [0] * 5 + [-1, -1]
    high = [5] * 4 + [1] * 3 + [1] * 5 + [1, 1]
    space = pipe.observation_space
    assert space["observations"] == Box(low, high, (14,), np.float32)
    assert space["action_mask"] == STRUCT["action_mask"]


def test_flatten_tuple_and_plain_spaces():
    space = Tuple([Box(-3.0, 3.0, (1, 2)), Discrete(4), MultiDiscrete([[2], [2]])])
    env = SampleEnv(obs_space=space)
    pipe, run, _ = rollout_run(env, (FlattenObservation(),), length=4)
    np.testing.assert_array_equal(run["seen"], flatten_ref(space, run["obs"]))
    assert pipe.observation_space == Box([-3] * 2 + [0] * 8, [3] * 2 + [1] * 8, (10,))
    flat = build_pipeline(FlattenObservation(), Discrete(5), Discrete(2)).observation_space
    assert flat == Box(0.0, 1.0, (5,), np.float32)


# ------------------------------------------------------------------------ compositions


def test_framestack_then_normalize_with_mlp_policy():
    env = SampleEnv(obs_space=Box(-2.0, 3.0, (2,), np.float32))
    tf = (FrameStack(4), NormalizeObservation())
    pipe, run, flags = rollout_run(env, tf, mlp=True)
    assert pipe.observation_space == Box(-10.0, 10.0, (4, 2), np.float32)
    stacked = framestack_ref(run["obs"], flags, 4)
    _, means, variances = running_moments(stacked, flags["recorded"])
    want = normalized(stacked, means, variances, 10.0)
    np.testing.assert_allclose(run["seen"], want, rtol=1e-4, atol=2e-4)


def test_prev_actions_rewards_then_flatten_with_mlp_policy():
    env = SampleEnv()
    tf = (PrevActionsRewards(2), FlattenObservation())
    pipe, run, flags = rollout_run(env, tf, mlp=True)
    pa, pr = prev_ref(run, flags, 2)
    mid = pipe.spaces[1].obs
    want = flatten_ref(mid, {"observations": run["obs"], "prev_actions": pa, "prev_rewards": pr})
    np.testing.assert_array_equal(run["seen"], want)
    assert pipe.observation_space.shape == (2 + 2 * 3 + 2,)


# ------------------------------------------------------------------ purity and jit


@pytest.mark.parametrize(
    "tf", [FrameStack(2), PrevActionsRewards(2), FlattenObservation()], ids=lambda t: repr(t)
)
def test_observe_jitted_equals_eager(tf):
    env = ChaosEnv()
    pipe = build_pipeline((tf,), env.observation_space, env.action_space)
    num_envs, num_agents = 2, 3
    state0 = pipe.init((num_envs, num_agents))
    keys = jax.random.split(jax.random.PRNGKey(0), 4)

    def steps(state):
        outs = []
        for i, key in enumerate(keys):
            ks = jax.random.split(key, 4)
            obs = jax.random.normal(ks[0], (num_envs, num_agents, 4))
            reward = jax.random.normal(ks[1], (num_envs, num_agents))
            acting = jax.random.bernoulli(ks[2], 0.6, (num_envs, num_agents))
            action = jax.random.randint(ks[3], (num_envs, num_agents), 0, 4)
            no = jnp.zeros((num_envs, num_agents), jnp.bool_)
            first = jnp.full((num_envs,), i == 0)
            state, seen = pipe.observe_env(
                state, obs, reward, no, no, acting, first, action, Context()
            )
            outs.append(seen.obs)
        return state, outs

    eager = steps(state0)
    jitted = jax.jit(steps)(state0)
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


# --------------------------------------------------------------------------- bad input


class OddSpace(Space):
    shape = ()
    dtype = np.dtype(np.float32)

    def _key(self) -> tuple:
        return ()

    def __repr__(self) -> str:
        return "OddSpace()"


@pytest.mark.parametrize(
    "tf, obs, act, names",
    [
        (FrameStack(2), Discrete(3), Discrete(2), ["FrameStack(2)", "Discrete(3)"]),
        (
            FrameStack(3),
            Dict(pos=Box(0.0, 1.0, (2,)), kind=Discrete(4)),
            Discrete(2),
            ["FrameStack(3)", "obs['kind'] is Discrete(4)", "Dict("],
        ),
        (
            FrameStack(2),
            Dict(action_mask=Box(0, 1, (2,), np.bool_)),
            Discrete(2),
            ["FrameStack(2)", "action mask"],
        ),
        (ClipActions(), ECHO_BOX, Discrete(2), ["ClipActions()", "Discrete(2)"]),
        (ClipActions(), ECHO_BOX, Box(0, 3, (2,), np.int32), ["ClipActions()", "int32"]),
        (RescaleActions(), ECHO_BOX, Discrete(4), ["RescaleActions(-1.0, 1.0)", "Discrete(4)"]),
        (
            RescaleActions(),
            ECHO_BOX,
            Box(np.array([0.0, -np.inf]), np.array([1.0, 1.0])),
            ["RescaleActions(-1.0, 1.0)", "bounded", "-inf"],
        ),
        (
            FlattenObservation(),
            Tuple([Box(0.0, 1.0, (2,)), OddSpace()]),
            Discrete(2),
            ["FlattenObservation()", "obs[1] is OddSpace()"],
        ),
        (
            FlattenObservation(),
            Dict(action_mask=Box(0, 1, (2,), np.bool_)),
            Discrete(2),
            ["FlattenObservation()", "nothing to flatten"],
        ),
        (
            PrevActionsRewards(2),
            ECHO_BOX,
            Tuple([Discrete(2), Discrete(3)]),
            ["PrevActionsRewards(2)", "Tuple(Discrete(2), Discrete(3))"],
        ),
    ],
)
def test_bad_spaces_fail_when_the_pipeline_is_built(tf, obs, act, names):
    with pytest.raises(TransformSpaceError) as err:
        build_pipeline((tf,), obs, act)
    for name in names:
        assert name in str(err.value), (name, str(err.value))


def test_bad_space_fails_at_make_rollout():
    env = js.make("CartPole-v1")
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    with pytest.raises(TransformSpaceError, match=r"ClipActions\(\).*Discrete\(2\)"):
        js.make_rollout(env, pol, 2, 3, transforms=(ClipActions(),))
    env = SampleEnv(obs_space=Discrete(3))
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    with pytest.raises(TransformSpaceError, match=r"FrameStack\(4\).*Discrete\(3\)"):
        js.make_rollout(env, pol, 2, 3, transforms=(FrameStack(4),))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: FrameStack(0), "k must be an int >= 1"),
        (lambda: FrameStack(2.5), "k must be an int >= 1"),  # type: ignore[arg-type]
        (lambda: PrevActionsRewards(0), "n must be an int >= 1"),
        (lambda: RescaleActions(1.0, 1.0), "low < high"),
        (lambda: RescaleActions(0.0, float("inf")), "finite"),
    ],
)
def test_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@dataclasses.dataclass(frozen=True)
class ShowPolicyAction(Transform):
    """Test transform: its observation space is the policy's action space."""

    def observation_space(self, spaces: Spaces) -> Space:
        return spaces.policy_action


def test_observation_spaces_are_derived_with_the_policys_action_space():
    """A transform listed before an action transform sees the policy's action space."""
    pipe = build_pipeline((ShowPolicyAction(), RescaleActions(0.0, 4.0)), ECHO_BOX, ECHO_BOX)
    assert pipe.action_space == Box(0.0, 4.0, (2,), np.float32)
    assert pipe.observation_space == pipe.action_space
    assert all(s.policy_action == pipe.action_space for s in pipe.spaces)
    assert [s.action for s in pipe.spaces] == [ECHO_BOX, ECHO_BOX]
