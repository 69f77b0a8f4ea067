"""Tiny envs and policies whose behaviour is known in closed form (for the core tests)."""

from __future__ import annotations

import dataclasses
import http.client
import threading
from collections import defaultdict
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from jaxsampler import spaces
from jaxsampler.constants import ALL_AGENTS
from jaxsampler.constants import DEFAULT_AGENT_ID as AGENT
from jaxsampler.envs.base import Env, SingleAgentEnv
from jaxsampler.policies.base import Policy
from jaxsampler.spaces import Box, Discrete
from jaxsampler.types import NoInfo, TimeStep


@struct.dataclass
class FakeState:
    time: jax.Array
    tag: jax.Array


@struct.dataclass
class FakeParams:
    term_len: int = 3
    max_steps_in_episode: int = 5
    nan_tag: float = 2.0  # observations become NaN at time 2 when tag > nan_tag


@dataclasses.dataclass(frozen=True)
class FakeEnv(SingleAgentEnv):
    """obs = [time, tag]; reward = action; tag ~ U(0, 1) drawn at reset.

    An episode with ``tag < 0.5`` terminates at ``time == term_len``; the others are
    truncated at ``max_steps_in_episode``. So the length and the end kind of every
    episode follow from its (observed) tag.
    """

    @property
    def default_params(self) -> FakeParams:
        return FakeParams()

    @property
    def observation_space(self) -> Box:
        return Box(-np.inf, np.inf, (2,), np.float32)

    @property
    def action_space(self) -> Discrete:
        return Discrete(3)

    def reset_env(self, key, params):
        tag = jax.random.uniform(key, (), jnp.float32)
        state = FakeState(jnp.zeros((), jnp.int32), tag)
        return self._obs(state.time, tag, params), state

    def step_env(self, key, state, action, params):
        time = state.time + 1
        terminated = (time == params.term_len) & (state.tag < 0.5)
        return (
            self._obs(time, state.tag, params),
            state,
            action.astype(jnp.float32),
            terminated,
            NoInfo(),
        )

    @staticmethod
    def _obs(time, tag, params):
        obs = jnp.stack([time.astype(jnp.float32), tag])
        return jnp.where((time == 2) & (tag > params.nan_tag), jnp.nan, obs)


def expected_episode(tag: float, params: FakeParams = FakeParams()) -> tuple[int, bool, bool]:
    """(length, terminated, truncated) of a FakeEnv episode with this tag."""
    if tag < 0.5 and params.term_len <= params.max_steps_in_episode:
        length = params.term_len
        return length, True, length >= params.max_steps_in_episode
    return params.max_steps_in_episode, False, True


@struct.dataclass
class TurnState:
    time: jax.Array


@dataclasses.dataclass(frozen=True)
class TurnEnv(Env):
    """Two agents take turns (agent 0 first); obs = [time]; the actor gets reward 1,
    the waiting agent reward 0.5; every episode lasts ``length`` steps (terminated)."""

    num_agents: ClassVar[int] = 2
    length: int = 4

    @property
    def default_params(self):
        return FakeParams()

    @property
    def observation_space(self) -> Box:
        return Box(-np.inf, np.inf, (1,), np.float32)

    @property
    def action_space(self) -> Discrete:
        return Discrete(2)

    def _ts(self, time, reward, done):
        turn = time % 2
        return TimeStep(
            obs=jnp.broadcast_to(time.astype(jnp.float32), (2, 1)),
            reward=reward,
            terminated=jnp.broadcast_to(done, (2,)),
            truncated=jnp.zeros((2,), jnp.bool_),
            acting=jnp.stack([turn == 0, turn == 1]) & ~done,
        )

    def reset(self, key, params=None):
        t = jnp.zeros((), jnp.int32)
        return TurnState(t), self._ts(t, jnp.zeros((2,), jnp.float32), jnp.asarray(False))

    def step(self, key, state, action, params=None):
        actor = state.time % 2
        reward = jnp.where(jnp.arange(2) == actor, 1.0, 0.5).astype(jnp.float32)
        t = state.time + 1
        return TurnState(t), self._ts(t, reward, t >= self.length)


@dataclasses.dataclass(frozen=True)
class CountingPolicy(Policy):
    """Recurrent state = steps since the episode start; extras["count"] = that state.

    Actions cycle 0, 1, 2 with the count, so they are known in closed form too.
    """

    observation_space: Box
    action_space: Discrete

    def init(self, key):
        return ()

    def initial_state(self, batch_shape):
        return jnp.zeros(tuple(batch_shape), jnp.int32)

    def __call__(self, params, obs, key, state):
        action = (state % self.action_space.n).astype(jnp.int32)
        return action, {"count": state}, state + 1


@dataclasses.dataclass(frozen=True)
class BadPolicy(Policy):
    """Returns actions of a configurable wrong shape / dtype / value."""

    observation_space: Box
    action_space: Discrete
    mode: str = "shape"

    def init(self, key):
        return ()

    def __call__(self, params, obs, key, state):
        E, A = obs.shape[:2]
        if self.mode == "shape":
            return jnp.zeros((E,), jnp.int32), {}, state
        if self.mode == "dtype":
            return jnp.zeros((E, A), jnp.float32), {}, state
        return jnp.full((E, A), 7, jnp.int32), {}, state  # out of Discrete(3)


def check_fake_trajectory(traj, params: FakeParams = FakeParams()) -> dict[str, int]:
    """Walks every env of a FakeEnv trajectory in plain Python and asserts the contract.

    Independent reference of the next-step auto-reset semantics: time counters, the real
    final observation (time = episode length, the episode's own tag), the reset step
    that follows every episode end, separate terminated/truncated flags, rewards =
    actions, acting masks. Returns counts of what it saw.
    """
    obs = np.asarray(traj.obs)
    T, E = np.asarray(traj.is_reset).shape
    act, rew = np.asarray(traj.actions), np.asarray(traj.rewards)
    term, trunc = np.asarray(traj.terminated), np.asarray(traj.truncated)
    acting, is_reset = np.asarray(traj.acting), np.asarray(traj.is_reset)
    seen = {"terminated": 0, "truncated": 0, "resets": 0, "steps": 0}
    for e in range(E):
        step = int(traj.episode_step_0[e])
        ended = False
        for t in range(T):
            time, tag = obs[t, e, 0]
            if is_reset[t, e]:
                assert ended or (t == 0 and step > 0), (t, e)
                assert not acting[t, e, 0] and rew[t, e, 0] == 0
                assert not term[t, e, 0] and not trunc[t, e, 0]
                assert obs[t + 1, e, 0, 0] == 0.0, "reset must start a fresh episode"
                assert obs[t + 1, e, 0, 1] != tag, "the new episode has its own tag"
                step, ended = 0, False
                seen["resets"] += 1
                continue
            assert not ended, (
                f"env {e} step {t}: the step after an episode end must be a reset step"
            )
            assert time == step, (t, e, time, step)
            length, is_term, is_trunc = expected_episode(float(tag), params)
            assert acting[t, e, 0]
            assert rew[t, e, 0] == float(act[t, e, 0])
            step += 1
            ended = step == length
            assert term[t, e, 0] == (ended and is_term), (t, e)
            assert trunc[t, e, 0] == (ended and is_trunc), (t, e)
            # The next slot holds the real next observation, the final one included.
            np.testing.assert_array_equal(obs[t + 1, e, 0], [step, tag])
            seen["steps"] += 1
            seen["terminated"] += int(ended and is_term)
            seen["truncated"] += int(ended and is_trunc)
    return seen


@struct.dataclass
class ChaosState:
    time: jax.Array
    done: jax.Array  # bool[A]
    uid: jax.Array  # float32[]: random episode tag


@dataclasses.dataclass(frozen=True)
class ChaosEnv(Env):
    """Three agents, out of lockstep at random: each step a random subset of the agents
    that are not done acts (agent 0 always acts at reset, the others may join late);
    every agent not yet done is rewarded at random (acting or not); each agent finishes
    (terminated) with probability ``p_done`` per step, independently; the episode is
    truncated for the rest at ``max_steps_in_episode``. Flags are sticky.
    obs = [time, agent index, episode tag, done]."""

    num_agents: ClassVar[int] = 3
    p_done: float = 0.12

    @property
    def default_params(self):
        return FakeParams(max_steps_in_episode=9)

    @property
    def observation_space(self) -> Box:
        return Box(-np.inf, np.inf, (4,), np.float32)

    @property
    def action_space(self) -> Discrete:
        return Discrete(4)

    def _ts(self, s: ChaosState, reward, term, trunc, acting):
        obs = jnp.stack(
            [
                jnp.broadcast_to(s.time.astype(jnp.float32), (3,)),
                jnp.arange(3, dtype=jnp.float32),
                jnp.broadcast_to(s.uid, (3,)),
                s.done.astype(jnp.float32),
            ],
            axis=-1,
        )
        return TimeStep(obs=obs, reward=reward, terminated=term, truncated=trunc, acting=acting)

    def reset(self, key, params=None):
        k1, k2 = jax.random.split(key)
        s = ChaosState(jnp.zeros((), jnp.int32), jnp.zeros((3,), jnp.bool_), jax.random.uniform(k1))
        acting = jax.random.bernoulli(k2, 0.5, (3,)).at[0].set(True)
        z = jnp.zeros((3,), jnp.bool_)
        return s, self._ts(s, jnp.zeros((3,), jnp.float32), z, z, acting)

    def step(self, key, state, action, params=None):
        params = self.default_params if params is None else params
        k_done, k_act, k_rew = jax.random.split(key, 3)
        t = state.time + 1
        newly = jax.random.bernoulli(k_done, self.p_done, (3,)) & ~state.done
        term = state.done | newly  # sticky
        trunc = (t >= params.max_steps_in_episode) & ~term
        done = term | trunc
        reward = jnp.where(
            state.done, 0.0, jnp.round(jax.random.uniform(k_rew, (3,)) * 8) / 4
        ).astype(jnp.float32)
        acting = jax.random.bernoulli(k_act, 0.6, (3,)) & ~done
        s = ChaosState(t, done, state.uid)
        return s, self._ts(s, reward, term, trunc, acting)


# ------------------------------------------------------------- a served external env's kit
# Shared by the ExternalEnv tests and the policy-server tests: simulator threads that drive
# an ExternalEnv and record what they logged, and a minimal poll loop (the "sampler") that
# answers with a deterministic function of the observation and records what it was given.

OBS = spaces.Box(-1e6, 1e6, (3,))
ACT = spaces.Discrete(97)


def http_request(server, method: str, path: str, body=None, headers=None):
    """One request to ``server`` (a ``PolicyServer``) on a fresh connection:
    ``(status, response headers, body)``."""
    host, port = server.address[len("http://") :].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()
    finally:
        conn.close()


def answer(obs: np.ndarray) -> int:
    return int(round(float(obs[0]) * 7 + float(obs[1]) * 3 + float(obs[2]))) % 97


class PollLoop:
    """A minimal sampler: polls, records every delivered step, answers with ``answer``."""

    def __init__(self, env, hold=lambda eid: False):
        self.env, self.hold = env, hold
        self.steps: dict = defaultdict(
            list
        )  # eid -> [(agent obs dict, rewards, term, trunc, infos, offp)]
        self.poll_sizes: list[int] = []
        self.stop = threading.Event()
        self.held: dict = {}
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            r = self.env.poll(timeout=0.05)
            if not r.obs:
                self._release()
                continue
            self.poll_sizes.append(len(r.obs))
            actions = {}
            for eid, obs in r.obs.items():
                self.steps[eid].append(
                    (
                        obs,
                        r.rewards[eid],
                        r.terminateds[eid],
                        r.truncateds[eid],
                        r.infos[eid],
                        r.off_policy_actions.get(eid),
                    )
                )
                if r.terminateds[eid][ALL_AGENTS] or r.truncateds[eid][ALL_AGENTS]:
                    continue
                acts = {a: answer(o) for a, o in obs.items() if not r.terminateds[eid].get(a)}
                if self.hold(eid):
                    self.held[eid] = acts
                else:
                    actions[eid] = acts
            self.env.send_actions(actions)
            self._release()

    def _release(self):
        for eid in [e for e in self.held if not self.hold(e)]:
            self.env.send_actions({eid: self.held.pop(eid)})

    def close(self):
        self.stop.set()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive()


def run_clients(n_threads, fn):
    barrier = threading.Barrier(n_threads)
    errors, logs = [], {}

    def target(cid):
        try:
            barrier.wait(timeout=10)
            logs[cid] = fn(cid)
        except BaseException as e:
            errors.append((cid, e))

    threads = [threading.Thread(target=target, args=(c,)) for c in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    return logs


def simulate(env, cid, n_episodes=3, n_steps=6):
    """One simulator thread; returns {eid: expected delivered steps}."""
    expected = {}
    rng = np.random.default_rng(cid)
    for e in range(n_episodes):
        eid = env.start_episode(episode_id=f"c{cid}-e{e}" if e % 2 else None)
        steps, pending_reward, pending_info = [], 0.0, {}
        for t in range(n_steps):
            obs = np.array([cid, e, t], np.float32)
            if rng.random() < 0.3:
                act = (answer(obs) + 1) % 97
                env.log_action(eid, obs, act)
                off = act
            else:
                assert env.get_action(eid, obs) == answer(obs)
                off = None
            steps.append(("step", obs, pending_reward, pending_info, off))
            pending_reward, pending_info = 0.0, {}
            for _ in range(int(rng.integers(0, 3))):
                r = float(rng.integers(-5, 5))
                pending_reward += r
                env.log_returns(eid, r, {"t": t} if r > 0 else None)
                if r > 0:
                    pending_info = {"t": t}
        final = np.array([cid, e, n_steps], np.float32)
        env.end_episode(eid, final)
        steps.append(("end", final, pending_reward, pending_info, None))
        expected[eid] = steps
    return expected


def wait_finished(env, eids, timeout=20.0):
    """Waits (bounded) until the poll loop delivered the final step of every episode."""
    ev = threading.Event()
    for _ in range(int(timeout / 0.005)):
        if all(env.episode_status(e) in ("completed", "abandoned") for e in eids):
            return
        ev.wait(0.005)
    raise AssertionError("episodes not finished in time")


def check_exactly_once(loop, logs, others=()):
    expected = {eid: s for log in logs.values() for eid, s in log.items()}
    assert set(loop.steps) - set(others) == set(expected), "episodes lost or invented"
    n = 0
    for eid, exp in expected.items():
        got = loop.steps[eid]
        assert len(got) == len(exp), eid
        for (kind, obs, rew, info, off), (g_obs, g_rew, g_term, g_trunc, g_info, g_off) in zip(
            exp, got, strict=True
        ):
            assert list(g_obs) == [AGENT]
            np.testing.assert_array_equal(g_obs[AGENT], obs)
            assert g_obs[AGENT].dtype == np.float32
            assert g_rew[AGENT] == pytest.approx(rew)
            assert g_info[AGENT] == info
            assert g_term == {AGENT: kind == "end", ALL_AGENTS: kind == "end"}
            assert g_trunc == {AGENT: False, ALL_AGENTS: False}
            assert (g_off is None) == (off is None)
            if off is not None:
                assert g_off == {AGENT: off}
            n += 1
    return n
