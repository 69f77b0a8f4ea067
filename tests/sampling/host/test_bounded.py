"""HostSampler keeps no per-episode state after an episode ends.

External envs use episode ids as env ids, so a long-running server sees a new env id per
episode; any table keyed by env id (or episode id) that is not cleaned when the episode
ends grows without bound. Thousands of short episodes with never-repeating env ids go
through the sampler (one agent: tracks; two: the collector; a recurrent policy so per-agent
states are kept, off-policy steps and abandoned episodes); every container the sampler,
its books, its feed and the feed's collector hold must stay small, and the traced Python
memory must not grow with the number of episodes.
"""

from __future__ import annotations

import gc
import threading
import tracemalloc

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler import spaces
from jaxsampler.constants import ALL_AGENTS
from jaxsampler.host_envs.base import HostEnv, PollResult
from jaxsampler.host_envs.external import ExternalEnv
from jaxsampler.sampling import HostSampler

OBS = spaces.Box(-1.0, 1.0, (2,))
ACT = spaces.Discrete(2)


class FreshIds(HostEnv):
    """``k`` slots, each running episodes of 1-3 steps; every episode gets a new env id
    (``"ep<n>"``). Some steps are off-policy (with a caller logp), some episodes end
    truncated as abandoned."""

    observation_space, action_space = OBS, ACT

    def __init__(self, k: int = 4, agents: tuple = (js.constants.DEFAULT_AGENT_ID,), seed: int = 0):
        self.agent_ids, self.num_envs = agents, k
        self.rng = np.random.default_rng(seed)
        self.slots: list = [None] * k  # [env id, t, length]
        self.started = 0

    def poll(self, timeout=None):
        obs, rew, term, trunc, infos, offp = {}, {}, {}, {}, {}, {}
        for i, slot in enumerate(self.slots):
            if slot is None:
                slot = self.slots[i] = [f"ep{self.started}", 0, int(self.rng.integers(1, 4))]
                self.started += 1
                e = slot[0]
            else:
                e = slot[0]
                slot[1] += 1
                done = slot[1] >= slot[2]
                cut = done and self.rng.random() < 0.3
                rew[e] = dict.fromkeys(self.agent_ids, 1.0)
                term[e] = {
                    **dict.fromkeys(self.agent_ids, done and not cut),
                    ALL_AGENTS: done and not cut,
                }
                trunc[e] = {**dict.fromkeys(self.agent_ids, cut), ALL_AGENTS: cut}
                if done:
                    self.slots[i] = None
                    infos[e] = {a: {"abandoned": True} if cut else {} for a in self.agent_ids}
            obs[e] = {a: self.rng.uniform(-1, 1, 2).astype(np.float32) for a in self.agent_ids}
            if self.slots[i] is not None and self.rng.random() < 0.3:
                offp[e] = dict.fromkeys(self.agent_ids, np.int32(1))
                infos[e] = {a: {"action_logp": -0.5} for a in self.agent_ids}
        return PollResult(obs, rew, term, trunc, infos, offp)

    def send_actions(self, actions):
        pass


def _policy():
    policy = js.policies.RecurrentPolicy(OBS, ACT, hidden_size=4)
    rng = np.random.default_rng(0)
    shapes = jax.eval_shape(policy.init, jax.random.key(0))
    return policy, jax.tree.map(lambda x: rng.normal(0, 0.5, x.shape).astype(x.dtype), shapes)


def _containers(s: HostSampler) -> dict[str, int]:
    """Sizes of every dict / list / set the sampler, its books, its feed and the feed's
    collector hold (found by walking their attributes, so a new table is covered too)."""
    owners = {"sampler": s, "books": s._books, "feed": s.feed}
    if hasattr(s.feed, "collector"):
        owners["collector"] = s.feed.collector
    sizes = {}
    for name, obj in owners.items():
        for attr, v in vars(obj).items():
            if isinstance(v, (dict, list, set)):
                sizes[f"{name}.{attr}"] = len(v)
                if attr == "_queues":  # policy id -> queued agents
                    sizes[f"{name}.{attr}[*]"] = sum(len(q) for q in v.values())
    return sizes


def _run(s: HostSampler, params, env: FreshIds, episodes: int, bound: int) -> dict[str, int]:
    """Samples until ``episodes`` more episodes started; checks the sizes after every call."""
    worst: dict[str, int] = {}
    target = env.started + episodes
    while env.started < target:
        s.sample_batch(params, num_timesteps=40)
        for k, n in _containers(s).items():
            worst[k] = max(worst.get(k, 0), n)
    big = {k: n for k, n in worst.items() if n > bound}
    assert not big, f"tables grew with the episodes: {big}"
    return worst


@pytest.mark.parametrize(
    "agents,episodes",
    [(("agent0",), 2000), (("a", "b"), 1000)],
    ids=["track", "collector-2-agents"],
)
def test_thousands_of_episodes_with_fresh_env_ids_leave_no_state(agents, episodes):
    env = FreshIds(k=8, agents=agents)
    policy, params = _policy()
    s = HostSampler(env, policy, batch_sizes=(16,), mark_off_policy=True, mark_abandoned=True)
    cap = s._books.rank_capacity
    assert cap < 100  # so that thousands of env ids overflow it many times
    bound = cap + env.num_envs * len(agents)  # ranks are pruned past the capacity
    worst = _run(s, params, env, episodes, bound)
    assert s.off_policy_counts.given > 0
    assert worst["books.env_rank"] <= bound and len(s._books.env_rank) <= bound
    for k in ("books.actions", "books.off_policy", "books.returns"):
        assert worst[k] <= env.num_envs, (k, worst[k])
    assert worst["books.states"] <= env.num_envs * len(agents)


def test_traced_memory_does_not_grow_with_the_episodes():
    """tracemalloc: 2000 more episodes (after a warm-up that compiles and fills caches)
    leave the traced memory about where it was. Leaking one env id and its rank per
    episode (what the sampler did before) grows it by ~270 kB; running episodes and
    allocator noise account for ~40 kB."""
    env = FreshIds(k=8)
    policy, params = _policy()
    s = HostSampler(env, policy, batch_sizes=(8,), mark_off_policy=True, mark_abandoned=True)
    bound = s._books.rank_capacity + env.num_envs
    _run(s, params, env, 300, bound)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        _run(s, params, env, 2000, bound)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    print(f"traced memory growth over 2000 episodes: {grown} bytes")
    assert grown < 120_000, f"traced memory grew by {grown} bytes over 2000 episodes"


def test_external_env_with_a_simulator_thread_leaves_no_state():
    """The real thing, smaller: an ExternalEnv whose thread runs 1-2 step episodes
    (``get_action``, ``log_action``), some abandoned."""
    env = ExternalEnv(OBS, ACT, max_wait_s=0.0, max_concurrent_episodes=4)
    policy, params = _policy()
    s = HostSampler(env, policy, timeout_s=0.2, batch_sizes=(4,))
    assert s.mark_abandoned  # an external env can abandon episodes
    n_eps, stop = 600, threading.Event()

    def sim():
        rng = np.random.default_rng(1)
        for i in range(n_eps):
            eid = env.start_episode()
            o = rng.uniform(-1, 1, 2).astype(np.float32)
            env.log_action(eid, o, 1) if i % 3 == 0 else env.get_action(eid, o)
            env.log_returns(eid, 1.0)
            if i % 5 == 0:
                env.abandon_episode(eid)
            else:
                env.end_episode(eid, o)
        stop.set()

    th = threading.Thread(target=sim, daemon=True)
    th.start()
    steps = abandoned = 0
    worst: dict[str, int] = {}
    for _ in range(2000):  # a bound: the thread's 600 episodes take far fewer calls
        finished = stop.is_set()  # then every step is queued: a call without one ends it
        b = s.sample_batch(params, num_timesteps=20)
        if b.policy_batches:
            steps += len(b["default_policy"])
            abandoned += int(np.sum(b["default_policy"]["abandoned"]))
        for k, n in _containers(s).items():
            worst[k] = max(worst.get(k, 0), n)
        if finished and s.metrics.num_env_steps_sampled == 0:
            break
    th.join(5)
    env.close()
    assert steps == n_eps and abandoned == n_eps // 5
    big = {k: n for k, n in worst.items() if n > s._books.rank_capacity + env.num_envs}
    assert not big, big
