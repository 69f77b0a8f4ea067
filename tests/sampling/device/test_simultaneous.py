"""The multi-agent conversion's path for calls in which the agents move together
(``jaxsampler.sampling.device.simultaneous``) against its general path: the same episodes
and batches, call after call, when the general path is forced; and the fast path taken
exactly where the agents are in lockstep."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import jaxsampler as js
import jaxsampler.sampling.device.multi as multi
from jaxsampler.envs.base import Env
from jaxsampler.envs.spread import Spread
from jaxsampler.sampling import DeviceSampler
from jaxsampler.sampling.device import agent_steps as agent_steps_module
from jaxsampler.sampling.device import parallel, single_rows
from jaxsampler.sampling.device.agent_steps import AgentCarry
from jaxsampler.sampling.device.columns import Columns
from jaxsampler.sampling.device.simultaneous import is_simultaneous
from jaxsampler.spaces import Box, Discrete
from jaxsampler.types import TimeStep
from tests.fakes import ChaosEnv, CountingPolicy, FakeParams, TurnEnv
from tests.sampling.device.test_overlap import assert_batches_equal, assert_episodes_equal

E, T = 5, 7


@struct.dataclass
class LockState:
    time: jax.Array
    uid: jax.Array  # float32[]: random episode tag


@dataclasses.dataclass(frozen=True)
class LockstepEnv(Env):
    """Three agents that all act at every step (``p_wait``: agent 1 sits a step out with
    that probability, and always on the observation of episode step ``wait_at``, which
    breaks the lockstep); the episode ends for all at once with
    probability ``p_end`` per step (terminated; agent 2 truncated instead at odd steps) or
    truncated at ``max_steps_in_episode``. Rewards are multiples of 1/4 (sums exact).
    obs = [time, agent index, episode tag]."""

    num_agents: ClassVar[int] = 3
    p_end: float = 0.2
    p_wait: float = 0.0
    wait_at: int = -1

    @property
    def default_params(self) -> FakeParams:
        return FakeParams(max_steps_in_episode=9)

    @property
    def observation_space(self) -> Box:
        return Box(-np.inf, np.inf, (3,), np.float32)

    @property
    def action_space(self) -> Discrete:
        return Discrete(3)

    def _ts(self, s: LockState, reward: Any, term: Any, trunc: Any, acting: Any) -> TimeStep:
        obs = jnp.stack(
            [
                jnp.broadcast_to(s.time.astype(jnp.float32), (3,)),
                jnp.arange(3, dtype=jnp.float32),
                jnp.broadcast_to(s.uid, (3,)),
            ],
            axis=-1,
        )
        return TimeStep(obs=obs, reward=reward, terminated=term, truncated=trunc, acting=acting)

    def reset(self, key: Any, params: Any = None) -> tuple[LockState, TimeStep]:
        s = LockState(jnp.zeros((), jnp.int32), jax.random.uniform(key))
        z = jnp.zeros((3,), jnp.bool_)
        return s, self._ts(s, jnp.zeros((3,), jnp.float32), z, z, jnp.ones((3,), jnp.bool_))

    def step(self, key: Any, state: LockState, action: Any, params: Any = None) -> Any:
        params = self.default_params if params is None else params
        k_end, k_rew, k_wait = jax.random.split(key, 3)
        t = state.time + 1
        ends = jax.random.bernoulli(k_end, self.p_end)
        by_time = (t >= params.max_steps_in_episode) & ~ends
        odd = (t % 2) == 1
        trunc2 = ends & odd
        term = jnp.stack([ends, ends, ends & ~trunc2])
        trunc = jnp.stack([by_time, by_time, by_time | trunc2])
        done = ends | by_time
        reward = (jnp.round(jax.random.uniform(k_rew, (3,)) * 8) / 4).astype(jnp.float32)
        wait = jax.random.bernoulli(k_wait, self.p_wait) | (t == self.wait_at)
        acting = jnp.stack([~done, ~done & ~wait, ~done])
        return LockState(t, state.uid), self._ts(
            LockState(t, state.uid), reward, term, trunc, acting
        )


def _two_policies(env: Any) -> tuple[Any, Any]:
    pol = js.policies.MultiAgentPolicy(
        env,
        {
            "p0": CountingPolicy(env.observation_space, env.action_space),
            "p1": CountingPolicy(env.observation_space, env.action_space),
        },
        lambda aid: "p1" if aid == "agent_0" else "p0",  # (ranks not in agent order)
    )
    return pol, {"p0": (), "p1": ()}


def _one_policy(env: Any) -> tuple[Any, Any]:
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    return pol, pol.init(jax.random.PRNGKey(0))


class _Paths:
    """Counts the calls that took the simultaneous path (``allow=False``: none may)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, allow: bool):
        self.fast = self.general = 0
        self.took: list[bool] = []  # per call: the fast path
        real = multi.is_simultaneous

        def check(*args: Any) -> bool:
            ok = allow and real(*args)
            self.fast += ok
            self.general += not ok
            self.took.append(ok)
            return ok

        monkeypatch.setattr(multi, "is_simultaneous", check)


def _run(
    env: Any,
    make_policy: Any,
    kinds: list[str],
    allow: bool,
    length: int = T,
    calls: list[dict[str, Any]] | None = None,
    **kw: Any,
) -> Any:
    """Each of ``kinds`` called once (with ``calls``' keyword arguments, if given)."""
    with pytest.MonkeyPatch.context() as mp:
        paths = _Paths(mp, allow)
        pol, params = make_policy(env)
        s = DeviceSampler(env, pol, num_envs=E, rollout_length=length, seed=2, **kw)
        args = calls or [{}] * len(kinds)
        return [getattr(s, k)(params, **a) for k, a in zip(kinds, args, strict=True)], paths


def _assert_same(kinds: list[str], fast: list[Any], general: list[Any]) -> None:
    for kind, a, b in zip(kinds, fast, general, strict=True):
        if kind == "sample":
            assert_episodes_equal(a, b)
            continue
        assert_batches_equal(a, b)
        for pid in b.policy_batches:
            for k in b[pid]:
                u, v = a[pid][k], b[pid][k]
                if isinstance(v, np.ndarray):
                    assert u.dtype == v.dtype, (pid, k)


KINDS = {
    "batch": ["sample_batch"] * 4,
    "episodes": ["sample"] * 4,
    "mixed": ["sample", "sample_batch", "sample", "sample", "sample_batch"],
}


@pytest.mark.parametrize("kinds", sorted(KINDS))
@pytest.mark.parametrize("rllib_compatible", [False, True])
@pytest.mark.parametrize("policies", ["one", "two"])
def test_lockstep_calls_take_the_fast_path_and_match_the_general_one(
    kinds: str, rllib_compatible: bool, policies: str
) -> None:
    env = LockstepEnv()
    make = _one_policy if policies == "one" else _two_policies
    kw = {"rllib_compatible": rllib_compatible, "episode_lookback_horizon": 2}
    fast, paths = _run(env, make, KINDS[kinds], True, **kw)
    general, forced = _run(env, make, KINDS[kinds], False, **kw)
    assert paths.fast == len(KINDS[kinds]) and paths.general == 0
    assert forced.fast == 0
    _assert_same(KINDS[kinds], fast, general)


@pytest.mark.parametrize(
    "options",
    [{}, {"host_threads": 2}, {"host_threads": 3, "split": True}, {"prefetch": True}],
    ids=["plain", "threads", "split", "prefetch"],
)
def test_counted_calls_on_the_fast_path(
    options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # num_timesteps (several chunks), num_episodes (segments cut at the count, the next
    # call resets) and plain calls, with two host threads or a prefetched chunk; "split":
    # three threads with the size thresholds at zero, so the fast path expands and
    # gathers its rows in ranges over the threads (and the general path splits too).
    options, ranges = dict(options), []
    split = options.pop("split", False)
    if split:
        monkeypatch.setattr(single_rows, "MIN_SHARD_SLOTS", 0)
        monkeypatch.setattr(agent_steps_module, "MIN_SHARD_SLOTS", 0)
        monkeypatch.setattr(parallel, "MIN_SPLIT_BYTES", 0)
        real = single_rows._segment_ranges
        monkeypatch.setattr(
            single_rows, "_segment_ranges", lambda *a: ranges.append(len(real(*a))) or real(*a)
        )
    calls = [
        ("sample_batch", {"num_timesteps": 3 * E * T}),
        ("sample", {}),
        ("sample_batch", {"num_episodes": 3}),
        ("sample", {"num_episodes": 4}),
        ("sample", {"num_timesteps": 2 * E * T}),
        ("sample_batch", {}),
    ]
    kinds, kw = [k for k, _ in calls], [a for _, a in calls]
    fast, paths = _run(LockstepEnv(), _two_policies, kinds, True, calls=kw, **options)
    general, _ = _run(LockstepEnv(), _two_policies, kinds, False, calls=kw, **options)
    assert paths.fast == paths.fast + paths.general >= len(kinds)
    _assert_same(kinds, fast, general)
    if split:
        assert max(ranges) == 3  # rows expanded in three ranges


def test_calls_switch_between_the_paths_with_the_same_carry() -> None:
    # Agent 1 sits out a step now and then: calls with such a step (or a step of agent 1
    # left hanging into the next call) take the general path, the others the fast one;
    # the carry passes between them.
    env = LockstepEnv(p_wait=0.03)
    kinds = KINDS["mixed"] * 3
    fast, paths = _run(env, _two_policies, kinds, True)
    general, _ = _run(env, _two_policies, kinds, False)
    assert paths.fast > 0 and paths.general > 0, (paths.fast, paths.general)
    _assert_same(kinds, fast, general)


def test_an_agent_waiting_on_the_calls_last_observation_leaves_its_step_hanging() -> None:
    # The first call's steps are in lockstep, but agent 1 does not act on the observation
    # after its last step: that step hangs into the next call (the general path's
    # carry), so the first call may not take the fast path.
    env = LockstepEnv(p_end=0.0, wait_at=T)
    for kinds in (["sample_batch", "sample"], ["sample", "sample_batch"]):
        fast, paths = _run(env, _two_policies, kinds, True)
        general, _ = _run(env, _two_policies, kinds, False)
        assert not paths.took[0]
        _assert_same(kinds, fast, general)


@pytest.mark.parametrize("kind", ["sample_batch", "sample"])
def test_a_call_without_rows(kind: str) -> None:
    # One step per call and episodes of one fixed length: every env ends on the same step,
    # so the next call's only step is every env's reset step and the call has no rows.
    env = LockstepEnv(p_end=0.0)
    kinds = [kind] * 12
    fast, paths = _run(env, _two_policies, kinds, True, length=1)
    general, _ = _run(env, _two_policies, kinds, False, length=1)
    assert paths.fast == len(kinds)
    if kind == "sample_batch":
        assert any(b.agent_steps() == 0 for b in fast)
    _assert_same(kinds, fast, general)


def _columns(E: int, L: int, A: int) -> Columns:
    """Lockstep columns: every agent acts at every step, no flags, no resets."""
    z = np.zeros((E, L, A), bool)
    return Columns(
        obs=np.zeros((L + 1, E, A, 1), np.float32),
        actions=np.zeros((E, L, A), np.int32),
        rewards=np.zeros((E, L, A), np.float32),
        terminated=z.copy(),
        truncated=z.copy(),
        is_reset=np.zeros((E, L), bool),
        acting=~z,
    )


def test_is_simultaneous_refuses_each_break_of_lockstep() -> None:
    E, L, A = 2, 4, 3
    cols = _columns(E, L, A)
    carry = AgentCarry.empty(cols, E, A)
    acting_next = np.ones((E, A), bool)
    assert is_simultaneous(cols, carry, acting_next)

    def refused(change: Any, next_acting: np.ndarray = acting_next, pend: bool = False) -> bool:
        c, old = _columns(E, L, A), AgentCarry.empty(cols, E, A)
        change(c, old)
        old.pend[1, 2] = pend
        return not is_simultaneous(c, old, next_acting)

    def done_at(k: int, agents: slice = slice(None)) -> Any:
        return lambda c, old: c.terminated[0, k].__setitem__(agents, True)

    def reset_at(k: int) -> Any:
        return lambda c, old: c.is_reset.__setitem__((0, k), True)

    assert refused(lambda c, old: c.acting.__setitem__((1, 2, 0), False))  # one waits
    assert refused(done_at(1, slice(0, 2)))  # agent 2 runs on
    assert refused(done_at(L - 1, slice(0, 2)))  # ... into the next call
    assert refused(done_at(1))  # a live step after the done one
    assert refused(lambda c, old: None, pend=True)  # a step hangs from before
    assert refused(lambda c, old: old.done.__setitem__(0, True))  # stepping on when done
    missing = acting_next.copy()
    missing[1, 0] = False
    assert refused(lambda c, old: None, next_acting=missing)  # a last step would hang
    # and the same situations where they break nothing
    assert not refused(lambda c, old: (done_at(1)(c, old), reset_at(2)(c, old)))
    ended = acting_next.copy()
    ended[0] = False
    assert not refused(done_at(L - 1), next_acting=ended)  # done at the end: none acts
    assert not refused(lambda c, old: (old.done.__setitem__(0, True), reset_at(0)(c, old)))
    assert not refused(
        lambda c, old: (reset_at(L - 1)(c, old), c.acting.__setitem__((0, L - 1), False))
    )  # a reset step's agents need not act


@pytest.mark.parametrize("env", [ChaosEnv(), TurnEnv(length=5)], ids=["chaos", "turns"])
def test_agents_out_of_lockstep_never_take_the_fast_path(env: Any) -> None:
    _, paths = _run(env, _one_policy, KINDS["mixed"], True)
    assert paths.fast == 0


def test_spread_takes_the_fast_path() -> None:
    env = Spread(3)
    kinds = KINDS["mixed"]
    fast, paths = _run(env, _one_policy, kinds, True)
    general, _ = _run(env, _one_policy, kinds, False)
    assert paths.fast == len(kinds)
    _assert_same(kinds, fast, general)
