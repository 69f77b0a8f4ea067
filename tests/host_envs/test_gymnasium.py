"""Host-stepped envs through ``HostSampler``, against independent references.

* Gymnasium CartPole (host) vs the pure-JAX CartPole with ``js.Sampler`` (device): a
  deterministic policy, the Gymnasium envs replaying the device episodes' initial states,
  a short time limit so both ends (terminated, truncated) occur; the episodes and the
  batches must agree step by step (float64 vs float32 dynamics: observations to 1e-4).
* RLlib's documented ``SingleAgentEnvRunner`` output for a counting env (CountEnv)
  reproduced exactly.
* A turn-based multi-agent dict env (agents join late, wait, finish at different times)
  vs a plain ``add_env_reset`` / ``add_env_step`` loop over the same env; ``sample_batch``
  vs the batch built by hand from those episodes.
* The jitted policy compiles once per bucket; bad input gives clear errors.
"""

from __future__ import annotations

import dataclasses

import chex
import jax.numpy as jnp
import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")

import jaxsampler as js  # noqa: E402
from jaxsampler.envs.cartpole import CartPoleParams  # noqa: E402
from jaxsampler.episodes.multi_agent import MultiAgentEpisode  # noqa: E402
from jaxsampler.host_envs import GymnasiumHostEnv, MultiAgentDictEnv  # noqa: E402
from jaxsampler.policies.base import Policy  # noqa: E402
from jaxsampler.sampling import HostSampler  # noqa: E402
from tests.sampling.device.test_multi_agent import assert_same_chunk  # noqa: E402


@dataclasses.dataclass(frozen=True)
class PoleSign(Policy):
    """action = theta > 0; extras["theta"] = theta (a known, deterministic policy)."""

    observation_space: object
    action_space: object

    def init(self, key):
        return ()

    def __call__(self, params, obs, key, state):
        return (obs[..., 2] > 0).astype(jnp.int32), {"theta": obs[..., 2]}, state


class ReplayStarts(gym.Wrapper):
    """Resets to the given initial states (CartPole's observation is its state)."""

    def __init__(self, env, starts):
        super().__init__(env)
        self.starts = list(starts)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        if self.starts:
            s = np.asarray(self.starts.pop(0))
            self.env.unwrapped.state = s.astype(np.float64)
            obs = s.astype(np.float32)
        return obs, info


E, T, LIMIT = 3, 25, 40
#: sample() and sample_batch() calls, mixed (episodes continue across both).
KINDS = ("eps", "batch", "eps", "eps", "batch")


def _device_run(horizon):
    env = js.make("CartPole-v1")
    policy = PoleSign(env.observation_space, env.action_space)
    s = js.Sampler(
        env,
        policy,
        num_envs=E,
        rollout_length=T,
        seed=1,
        env_params=CartPoleParams(max_steps_in_episode=LIMIT),
        episode_lookback_horizon=horizon,
    )
    calls, metrics = [], []
    for kind in KINDS:
        calls.append(s.sample(()) if kind == "eps" else s.sample_batch(()))
        metrics.append(s.metrics)
    return s, calls, metrics


def _starts(sampler, calls):
    """Initial states per env, in episode order, from the device episodes' ids."""
    where = {sampler._episode_id(e, c): (e, c) for e in range(E) for c in range(64)}
    starts = {e: {} for e in range(E)}
    for out in calls:
        if isinstance(out, js.MultiAgentBatch):
            b = out["default_policy"]
            firsts = [
                (i, eid)
                for i, (eid, t) in enumerate(zip(b["eps_id"], b["t"], strict=True))
                if t == 0
            ]
            for i, eid in firsts:
                e, c = where[eid]
                starts[e][c] = b["obs"][i]
            continue
        for ep in out:
            if ep.t_started == 0:
                e, c = where[ep.id_]
                starts[e][c] = np.asarray(ep.get_observations(0))
    return [[starts[e][c] for c in sorted(starts[e])] for e in range(E)]


def _host_sampler(starts, horizon):
    fns = [
        lambda s=s: ReplayStarts(gym.make("CartPole-v1", max_episode_steps=LIMIT), s)
        for s in starts
    ]
    henv = GymnasiumHostEnv(fns, seed=0)
    space = js.make("CartPole-v1")
    return HostSampler(
        henv,
        PoleSign(space.observation_space, space.action_space),
        seed=1,
        episode_lookback_horizon=horizon,
        rollout_length=T,
    )


def _assert_same_episodes(got_eps, want_eps, ids, ends):
    assert len(got_eps) == len(want_eps)
    for g, w in zip(got_eps, want_eps, strict=True):
        assert isinstance(g, js.SingleAgentEpisode)
        assert (len(g), g.t_started, g.t) == (len(w), w.t_started, w.t)
        assert (g.is_terminated, g.is_truncated) == (w.is_terminated, w.is_truncated)
        assert g.observations.lookback == w.observations.lookback == g.actions.lookback
        assert ids.setdefault(g.id_, w.id_) == w.id_  # continuation chunks keep their id
        np.testing.assert_allclose(g.observations.data, w.observations.data, atol=1e-4)
        np.testing.assert_array_equal(g.actions.data, w.actions.data)
        np.testing.assert_array_equal(g.rewards.data, w.rewards.data)
        np.testing.assert_allclose(
            g.extra_model_outputs["theta"].data, w.extra_model_outputs["theta"].data, atol=1e-4
        )
        ends["term"] += bool(w.is_terminated)
        ends["trunc"] += bool(w.is_truncated)


def _assert_same_batch(got, want, ids):
    assert isinstance(got, js.MultiAgentBatch) and list(got.policy_batches) == ["default_policy"]
    assert got.env_steps() == want.env_steps()
    g, w = got["default_policy"], want["default_policy"]
    assert set(g) == set(w)
    for k in ("obs", "new_obs", "theta"):
        np.testing.assert_allclose(g[k], w[k], atol=1e-4, err_msg=k)
    for k in ("actions", "rewards", "terminateds", "truncateds", "t", "agent_index"):
        np.testing.assert_array_equal(g[k], w[k], err_msg=k)
        assert g[k].dtype == w[k].dtype, k
    for a, b in zip(g["eps_id"], w["eps_id"], strict=True):  # the same episodes (and boundaries)
        assert ids.setdefault(a, b) == b


@pytest.mark.parametrize("horizon", [0, 2])
def test_gymnasium_cartpole_equals_device_cartpole(horizon):
    """Episodes and batches, call by call (sample() and sample_batch() mixed)."""
    dev, dev_calls, dev_metrics = _device_run(horizon)
    host = _host_sampler(_starts(dev, dev_calls), horizon)
    ids: dict = {}
    ends = {"term": 0, "trunc": 0}
    for call, (kind, want) in enumerate(zip(KINDS, dev_calls, strict=True)):
        if kind == "eps":
            _assert_same_episodes(host.sample(()), want, ids, ends)
        else:
            _assert_same_batch(host.sample_batch(()), want, ids)
        for k in (
            "num_env_steps_sampled",
            "num_agent_steps_sampled",
            "num_episodes_completed",
            "num_episodes_ongoing",
            "episode_len_mean",
            "episode_return_mean",
        ):
            assert getattr(host.metrics, k) == pytest.approx(
                getattr(dev_metrics[call], k), nan_ok=True
            ), (call, k)
    assert ends["term"] >= 2 and ends["trunc"] >= 2
    assert len(set(ids.values())) == len(ids)


# --- RLlib's documented SingleAgentEnvRunner output (reference section 7) ------------


class CountEnv(gym.Env):
    """obs = 100 * k + t (k = reset count), reward = t, the episode ends after L steps."""

    def __init__(self, L=3, trunc=False):
        self.observation_space = gym.spaces.Box(-1e4, 1e4, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.L, self.trunc, self.k = L, trunc, 0

    def reset(self, *, seed=None, options=None):
        self.k += 1
        self.t = 0
        return np.array([self.k * 100.0], np.float32), {"reset": self.k}

    def step(self, action):
        self.t += 1
        done = self.t >= self.L
        return (
            np.array([self.k * 100.0 + self.t], np.float32),
            float(self.t),
            done and not self.trunc,
            done and self.trunc,
            {"t": self.t},
        )


def _show(eps, ids):
    return [
        (
            ids.setdefault(e.id_, f"ep{len(ids)}"),
            e.t_started,
            e.t,
            len(e),
            e.observations.lookback,
            np.asarray(e.observations.data).ravel().tolist(),
            np.asarray(e.rewards.data).tolist(),
            bool(e.is_terminated),
            bool(e.is_truncated),
        )
        for e in eps
    ]


def test_matches_rllib_single_agent_env_runner_reference_output():
    henv = GymnasiumHostEnv([lambda: CountEnv(3, trunc=True)])
    policy = js.RandomPolicy(henv.observation_space, henv.action_space)
    s, ids = HostSampler(henv, policy, episode_lookback_horizon=2), {}
    got = [_show(s.sample((), num_timesteps=2), ids) for _ in range(3)]
    got.append(_show(s.sample((), num_episodes=1), ids))
    got.append(_show(s.sample((), num_timesteps=2), ids))
    assert got == [
        [("ep0", 0, 2, 2, 0, [100.0, 101.0, 102.0], [1.0, 2.0], False, False)],
        [
            ("ep0", 2, 3, 1, 2, [100.0, 101.0, 102.0, 103.0], [1.0, 2.0, 3.0], False, True),
            ("ep1", 0, 1, 1, 0, [200.0, 201.0], [1.0], False, False),
        ],
        [("ep1", 1, 3, 2, 1, [200.0, 201.0, 202.0, 203.0], [1.0, 2.0, 3.0], False, True)],
        [("ep2", 0, 3, 3, 0, [300.0, 301.0, 302.0, 303.0], [1.0, 2.0, 3.0], False, True)],
        [("ep3", 0, 2, 2, 0, [400.0, 401.0, 402.0], [1.0, 2.0], False, False)],
    ]
    henv = GymnasiumHostEnv([lambda: CountEnv(3)] * 2)
    s, ids = HostSampler(henv, policy, episode_lookback_horizon=1), {}
    eps = s.sample((), num_timesteps=3)
    assert eps[0].get_infos() == [
        {"reset": 1},
        {"t": 1},
        {"t": 2},
    ]  # infos come with their observation
    first = _show(eps, ids)
    assert s.metrics.num_env_steps_sampled == 4
    second = _show(s.sample((), num_timesteps=3), ids)
    assert s.metrics.num_env_steps_sampled == 4
    assert first == [
        ("ep0", 0, 2, 2, 0, [100.0, 101.0, 102.0], [1.0, 2.0], False, False),
        ("ep1", 0, 2, 2, 0, [100.0, 101.0, 102.0], [1.0, 2.0], False, False),
    ]
    assert second == [
        ("ep0", 2, 3, 1, 1, [101.0, 102.0, 103.0], [2.0, 3.0], True, False),
        ("ep1", 2, 3, 1, 1, [101.0, 102.0, 103.0], [2.0, 3.0], True, False),
        ("ep2", 0, 1, 1, 0, [200.0, 201.0], [1.0], False, False),
        ("ep3", 0, 1, 1, 0, [200.0, 201.0], [1.0], False, False),
    ]
    assert s.sample((), num_timesteps=3)[0].get_infos() == [{"t": 1}, {"t": 2}, {"t": 3}]


def test_gymnasium_adapter_seeds_final_obs_and_next_step_reset():
    henv = GymnasiumHostEnv("CartPole-v1", 2, seed=7, env_kwargs={"max_episode_steps": 3})
    first = henv.poll()
    for i in range(2):
        want, _ = gym.make("CartPole-v1").reset(seed=7 + i)
        np.testing.assert_array_equal(first.obs[i][js.constants.DEFAULT_AGENT_ID], want)
    aid = js.constants.DEFAULT_AGENT_ID
    for t in range(3):
        henv.send_actions({0: {aid: 1}, 1: {aid: 0}})
        r = henv.poll()
        assert r.truncateds[0] == {aid: t == 2, "__all__": t == 2}
        assert r.rewards[0] == {aid: 1.0}
    final = np.asarray(henv.envs[0].unwrapped.state, np.float32)
    np.testing.assert_array_equal(r.obs[0][aid], final)  # the real final observation
    with pytest.raises(KeyError, match="not waiting"):
        henv.send_actions({0: {aid: 1}})  # a done env needs no action
    r = henv.poll()  # next-step auto-reset: the new episode's first observation
    assert set(r.obs) == {0, 1} and r.rewards == {} and r.terminateds[0] == {"__all__": False}
    assert np.all(np.abs(r.obs[0][aid]) <= 0.05)
    with pytest.raises(ValueError, match="integer scalar"):
        henv.send_actions({0: {aid: np.zeros(2)}, 1: {aid: 0}})
    with pytest.raises(ValueError, match="needs actions for agents"):
        henv.send_actions({0: {"someone": 0}, 1: {aid: 0}})
    with pytest.raises(RuntimeError, match="no sub-env is ready"):
        henv.poll()
    henv.close()


# --- multi-agent dict env --------------------------------------------------------------

AGENTS = ("a0", "a1", "a2")


class TurnDictEnv:
    """RLlib dict API. a0 observes at even steps, a1 (joins at step 1) at odd steps and
    terminates at step 3, a2 (joins at step 2) every third step; every live agent gets a
    reward each step (waiting ones too). The episode ends at step L (5..8, random) with
    every live agent observing: terminated for even k, truncated for odd k."""

    possible_agents = AGENTS

    def __init__(self):
        self.observation_space = gym.spaces.Box(-1e3, 1e3, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self.k, self.rng = 0, np.random.default_rng(0)

    def _obs(self, a):
        return np.array([self.k, self.t, AGENTS.index(a)], np.float32)

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.k += 1
        self.t, self.L, self.live = 0, int(self.rng.integers(5, 9)), {"a0"}
        return {"a0": self._obs("a0")}, {"a0": {"k": self.k}}

    def step(self, actions):
        rewards = {a: 1.0 + AGENTS.index(a) + float(actions.get(a, 0)) for a in self.live}
        self.t += 1
        t = self.t
        if t == 1:
            self.live.add("a1")
        if t == 2:
            self.live.add("a2")
        seen = {
            a
            for a in self.live
            if (a == "a0" and t % 2 == 0)
            or (a == "a1" and t % 2 == 1)
            or (a == "a2" and t % 3 == 2)
        }
        terms, truncs = {}, {}
        if t == 3 and "a1" in self.live:
            terms["a1"] = True
            seen.add("a1")
        if t >= self.L:
            seen |= self.live
            flags = terms if self.k % 2 == 0 else truncs
            flags.update(dict.fromkeys(self.live, True))
            flags["__all__"] = True
        terms.setdefault("__all__", False)
        truncs.setdefault("__all__", False)
        self.live -= {a for a in self.live if terms.get(a) or truncs.get(a)}
        return (
            {a: self._obs(a) for a in seen},
            rewards,
            terms,
            truncs,
            {a: {"t": t} for a in seen},
        )


def _action(obs):
    return int((obs[1] + obs[2]) % 3)


@dataclasses.dataclass(frozen=True)
class ModPolicy(Policy):
    """action = (t + agent index) % 3; extras["v"] = 10 k + t."""

    observation_space: object
    action_space: object

    def init(self, key):
        return ()

    def __call__(self, params, obs, key, state):
        action = ((obs[..., 1] + obs[..., 2]) % 3).astype(jnp.int32)
        return action, {"v": obs[..., 0] * 10 + obs[..., 1]}, state


def _ma_policy(henv, split=True):
    p = ModPolicy(henv.observation_space, henv.action_space)
    mapping = (lambda aid: "p0" if aid == "a0" else "p1") if split else None
    return js.policies.MultiAgentPolicy(
        henv.agent_ids, {"p0": p, "p1": p} if split else {"p": p}, mapping
    )


def _reference(num_envs, calls, length, horizon, rllib_flags=False):
    """The HostSampler's chunks, by hand: each env stepped in plain Python, one slot per
    poll (a reset or a step), episodes cut at every call boundary."""
    envs = [TurnDictEnv() for _ in range(num_envs)]
    running, out = {}, []
    for call in range(calls):
        finished = []
        chunks = dict(running)
        for slot in range(
            length + (1 if call == 0 else 0)
        ):  # the first call also polls the first reset
            for e, env in enumerate(envs):
                if e not in chunks:
                    obs, infos = env.reset(seed=e if env.k == 0 else None)
                    ep = MultiAgentEpisode(
                        agent_to_module_mapping_fn=lambda aid, _: "p0" if aid == "a0" else "p1"
                    )
                    ep.add_env_reset(observations=obs, infos=infos)
                    chunks[e], env.acting = ep, obs
                    continue
                ep = chunks[e]
                actions = {a: _action(o) for a, o in env.acting.items()}
                extras = {a: {"v": np.float32(o[0] * 10 + o[1])} for a, o in env.acting.items()}
                obs, rewards, terms, truncs, infos = env.step(actions)
                done_before = {a for a, sa in ep.agent_episodes.items() if sa.is_done}
                ep.add_env_step(
                    obs,
                    actions,
                    rewards,
                    infos,
                    terminateds=terms,
                    truncateds=truncs,
                    extra_model_outputs=extras,
                )
                if not rllib_flags:  # the default: an agent's own flags OR "__all__"
                    for a, sa in ep.agent_episodes.items():
                        if sa.is_done and a not in done_before:
                            sa.is_terminated = bool(terms.get(a) or terms["__all__"])
                            sa.is_truncated = bool(truncs.get(a) or truncs["__all__"])
                env.acting = {a: o for a, o in obs.items() if not (terms.get(a) or truncs.get(a))}
                if terms["__all__"] or truncs["__all__"]:
                    finished.append((e, slot, ep))
                    del chunks[e]
        finished.sort(key=lambda x: x[:2])
        # As RLlib's env runner: successors are cut first, then the returned chunks lose
        # their agents without a step.
        running = {e: (ep.cut(horizon) if len(ep) > 0 else ep) for e, ep in chunks.items()}
        returned = [ep for *_, ep in finished] + [
            chunks[e] for e in sorted(chunks) if len(chunks[e]) > 0
        ]
        out.append([ep.prune_empty_agents() for ep in returned])
    return out


def _batch_by_hand(episodes):
    parts: dict = {}
    for ep in episodes:
        for aid in sorted(ep.agent_episodes, key=AGENTS.index):
            sa = ep.agent_episodes[aid]
            if len(sa) == 0:
                continue
            cols = dict(sa.get_sample_batch())
            cols["new_obs"] = sa.get_observations(slice(1, None))
            cols["agent_index"] = np.full(len(sa), AGENTS.index(aid))
            parts.setdefault("p0" if aid == "a0" else "p1", []).append(cols)

    def cat(ps, k):
        return (
            sum((list(p[k]) for p in ps), [])
            if k == "infos"
            else np.concatenate([np.asarray(p[k]) for p in ps])
        )

    return {pid: {k: cat(ps, k) for k in ps[0]} for pid, ps in parts.items()}


@pytest.mark.parametrize("horizon,rllib_compatible", [(0, False), (2, False), (2, True)])
def test_multi_agent_dict_env_equals_the_plain_add_env_step_loop(horizon, rllib_compatible):
    n_envs, calls, length = 2, 5, 6
    henv = MultiAgentDictEnv([TurnDictEnv for _ in range(n_envs)], seed=0)
    assert henv.agent_ids == AGENTS
    s = HostSampler(
        henv,
        _ma_policy(henv),
        episode_lookback_horizon=horizon,
        rollout_length=length,
        rllib_compatible=rllib_compatible,
    )
    want = _reference(n_envs, calls, length, horizon, rllib_flags=rllib_compatible)
    ids, done, truncated = {}, 0, 0
    for call in range(calls):
        got = s.sample({"p0": (), "p1": ()})
        assert len(got) == len(want[call]), call
        for g, w in zip(got, want[call], strict=True):
            assert isinstance(g, MultiAgentEpisode)
            # The reference chunks' ids are random: map them, one to one and stable.
            assert ids.setdefault(w.id_, g.id_) == g.id_
            assert_same_chunk(g, w)
            for aid, sa in g.agent_episodes.items():
                assert sa.id_ == f"{g.id_}{AGENTS.index(aid):04x}" and sa.module_id == (
                    "p0" if aid == "a0" else "p1"
                )
                assert sa.get_infos() == w.agent_episodes[aid].get_infos()
            done += g.is_done
            truncated += g.is_truncated
        assert s.metrics.num_agent_steps_sampled == sum(w.agent_steps() for w in want[call])
    assert len(set(ids.values())) == len(ids)
    assert done >= 4 and truncated >= 1


def test_multi_agent_sample_batch_equals_the_batch_built_from_episodes():
    n_envs, length = 2, 6
    make = lambda: MultiAgentDictEnv([TurnDictEnv for _ in range(n_envs)], seed=0)
    henv_a, henv_b = make(), make()
    s_eps = HostSampler(henv_a, _ma_policy(henv_a), rollout_length=length)
    s_bat = HostSampler(henv_b, _ma_policy(henv_b), rollout_length=length)
    for _ in range(4):
        episodes = s_eps.sample({"p0": (), "p1": ()})
        batch = s_bat.sample_batch({"p0": (), "p1": ()})
        assert list(batch.policy_batches) == ["p0", "p1"]
        assert batch.env_steps() == s_eps.metrics.num_env_steps_sampled
        assert batch.agent_steps() == sum(ep.agent_steps() for ep in episodes)
        want = _batch_by_hand(episodes)
        for pid, w in want.items():
            g = batch[pid]
            for k in (
                "obs",
                "new_obs",
                "actions",
                "rewards",
                "terminateds",
                "truncateds",
                "t",
                "agent_index",
                "v",
                "eps_id",
            ):
                np.testing.assert_array_equal(
                    np.asarray(g[k]), np.asarray(w[k]), err_msg=f"{pid} {k}"
                )
            assert list(g["infos"]) == list(w["infos"])


def _max_traces_policy(henv, n):
    """``_ma_policy(henv, split=False)`` whose policy fails once it is traced more than
    ``n`` times (each compile of the sampler's jitted policy call traces it once)."""
    counted = chex.assert_max_traces(ModPolicy.__call__, n=n)

    @dataclasses.dataclass(frozen=True)
    class Counted(ModPolicy):
        def __call__(self, params, obs, key, state):
            return counted(self, params, obs, key, state)

    return js.policies.MultiAgentPolicy(
        henv.agent_ids, {"p": Counted(henv.observation_space, henv.action_space)}
    )


def test_policy_compiles_once_per_bucket_with_varying_ready_agents():
    henv = MultiAgentDictEnv([TurnDictEnv for _ in range(3)], seed=0)
    s = HostSampler(henv, _max_traces_policy(henv, 1), rollout_length=10, batch_sizes=(8,))
    counts = set()
    orig = s.feed.collector.get_inference_input_dict

    def spy(pid):
        rows = orig(pid)
        counts.add(rows.count)
        return rows

    s.feed.collector.get_inference_input_dict = spy
    for _ in range(4):
        s.sample({"p": ()})  # one bucket: traced once, whatever the number of rows
    assert len(counts - {0}) >= 3  # really different numbers of agents to act
    # Default buckets (powers of two up to 3 envs x 3 agents): one compile per bucket, at most.
    s = HostSampler(henv, _max_traces_policy(henv, 5), rollout_length=10)
    assert s.batch_sizes == (1, 2, 4, 8, 16)
    for _ in range(4):
        s.sample({"p": ()}, force_reset=True)


def test_recurrent_state_is_kept_per_agent_and_reset_per_episode():
    from tests.fakes import CountingPolicy  # state = steps the agent acted in its episode

    henv = MultiAgentDictEnv([TurnDictEnv for _ in range(2)], seed=0)
    s = HostSampler(
        henv, CountingPolicy(henv.observation_space, henv.action_space), rollout_length=7
    )
    checked = 0
    for _ in range(3):
        for ep in s.sample(()):
            for sa in ep.agent_episodes.values():
                if len(sa) == 0:
                    continue
                count = np.asarray(sa.get_extra_model_outputs("count"))
                np.testing.assert_array_equal(count, np.arange(sa.t_started, sa.t))
                np.testing.assert_array_equal(sa.get_actions(), count % 3)
                checked += len(count)
    assert checked > 20


# --- bad input ---------------------------------------------------------------------------


class WrongShapeEnv(CountEnv):
    def step(self, action):
        obs, *rest = super().step(action)
        return (np.zeros(5, np.float32), *rest)


def test_bad_input_gives_clear_errors():
    henv = GymnasiumHostEnv("CartPole-v1", 2)
    obs_space = henv.observation_space
    with pytest.raises(ValueError, match="mismatched action space"):
        HostSampler(henv, js.MLPPolicy(obs_space, js.spaces.Discrete(3)))
    with pytest.raises(ValueError, match="mismatched observation space"):
        HostSampler(
            henv, js.RandomPolicy(js.spaces.Box(-1, 1, (5,), np.float32), henv.action_space)
        )
    mad = MultiAgentDictEnv([TurnDictEnv])
    other = js.policies.MultiAgentPolicy(
        ("x", "y"), {"p": ModPolicy(mad.observation_space, mad.action_space)}
    )
    with pytest.raises(ValueError, match="mismatched agent ids"):
        HostSampler(mad, other)
    s = HostSampler(
        GymnasiumHostEnv([lambda: WrongShapeEnv()]),
        js.RandomPolicy(js.spaces.Box(-1e4, 1e4, (1,), np.float32), js.spaces.Discrete(2)),
    )
    with pytest.raises(
        ValueError, match=r"env 0: observation\['default_agent'\] shape \(5,\) does not match"
    ):
        s.sample((), num_timesteps=3)
    with pytest.raises(ValueError, match="not both"):
        s.sample((), num_timesteps=1, num_episodes=1)

    @dataclasses.dataclass(frozen=True)
    class BadShape(Policy):
        observation_space: object
        action_space: object

        def init(self, key):
            return ()

        def __call__(self, params, obs, key, state):
            return jnp.zeros(obs.shape[:1], jnp.int32), {}, state

    s = HostSampler(henv, BadShape(obs_space, henv.action_space))
    with pytest.raises(ValueError, match="action has shape"):
        s.sample(())

    class Intruder(TurnDictEnv):
        def step(self, actions):
            obs, *rest = super().step(actions)
            return ({**obs, "ghost": obs.get("a0", np.zeros(3, np.float32))}, *rest)

    s = HostSampler(
        MultiAgentDictEnv([Intruder], agent_ids=AGENTS),
        ModPolicy(mad.observation_space, mad.action_space),
    )
    with pytest.raises(ValueError, match="'ghost'"):
        s.sample(())
    mixed = MultiAgentDictEnv([_MixedSpaces])  # agents keep their own spaces
    assert mixed.observation_space is None and mixed.observation_spaces["a2"].shape == (4,)
    with pytest.raises(ValueError, match="have their own spaces"):
        HostSampler(mixed, ModPolicy(mad.observation_space, mad.action_space))


class _MixedSpaces:
    """PettingZoo-style spaces; one agent's observation space differs."""

    possible_agents = AGENTS

    def observation_space(self, agent):
        return gym.spaces.Box(-1, 1, (3 if agent != "a2" else 4,), np.float32)

    def action_space(self, agent):
        return gym.spaces.Discrete(3)

    def reset(self, seed=None, options=None):
        raise NotImplementedError

    def step(self, actions):
        raise NotImplementedError


# --- PettingZoo parallel API --------------------------------------------------------------


class ParallelTurns:
    """PettingZoo parallel API: no "__all__"; ``agents`` empties when the episode ends.
    Both agents act every step; p1 terminates at step 2, p0 is truncated at step 4."""

    possible_agents = ["p0", "p1"]

    def observation_space(self, agent):
        return gym.spaces.Box(-10, 10, (3,), np.float32)

    def action_space(self, agent):
        return gym.spaces.Discrete(3)

    def reset(self, seed=None, options=None):
        self.t, self.agents = 0, list(self.possible_agents)
        return {a: np.array([0, 0, i], np.float32) for i, a in enumerate(self.agents)}, {
            a: {} for a in self.agents
        }

    def step(self, actions):
        self.t += 1
        obs = {
            a: np.array([self.t, actions[a], i], np.float32)
            for i, a in enumerate(self.possible_agents)
            if a in self.agents
        }
        terms = {a: a == "p1" and self.t == 2 for a in obs}
        truncs = {a: a == "p0" and self.t == 4 for a in obs}
        rewards = {a: float(self.t) for a in obs}
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, {a: {} for a in obs}


def test_pettingzoo_parallel_env_derives_all_done():
    henv = MultiAgentDictEnv([ParallelTurns])
    assert henv.agent_ids == ("p0", "p1")
    s = HostSampler(henv, ModPolicy(henv.observation_space, henv.action_space))
    eps = s.sample((), num_episodes=2)
    assert len(eps) == 2 and s.metrics.num_episodes_completed == 2
    for ep in eps:
        assert len(ep) == 4 and ep.is_truncated
        p0, p1 = ep.agent_episodes["p0"], ep.agent_episodes["p1"]
        assert (len(p0), p0.is_truncated, p0.is_terminated) == (4, True, False)
        assert (len(p1), p1.is_terminated, p1.is_truncated) == (2, True, False)
        np.testing.assert_array_equal(p1.get_rewards(), [1.0, 2.0])
        assert ep.get_return() == pytest.approx(1 + 2 + 3 + 4 + 1 + 2)


class LoggedActions(GymnasiumHostEnv):
    """Env 0 takes its own action (always 1), as ExternalEnv.log_action does."""

    def poll(self, timeout=None):
        res = super().poll(timeout)
        for e in res.obs:
            if e == 0 and not (res.terminateds[e]["__all__"] or res.truncateds[e]["__all__"]):
                res.off_policy_actions[e] = {js.constants.DEFAULT_AGENT_ID: 1}
        return res


@dataclasses.dataclass(frozen=True)
class Zeros(Policy):
    observation_space: object
    action_space: object

    def init(self, key):
        return ()

    def __call__(self, params, obs, key, state):
        return jnp.zeros(obs.shape[:2], jnp.int32), {"vf_preds": obs[..., 0]}, state


def test_off_policy_actions_are_sent_recorded_and_marked():
    henv = LoggedActions([lambda: CountEnv(4), lambda: CountEnv(4)])
    s = HostSampler(
        henv,
        Zeros(henv.observation_space, henv.action_space),
        mark_off_policy=True,
        rollout_length=9,
    )
    batch = s.sample_batch(())["default_policy"]
    marked = batch["off_policy"]
    assert (
        marked.dtype == bool and marked.sum() == (~marked).sum() == 8
    )  # env 0's steps, env 1's steps
    for eid in set(batch["eps_id"]):  # one episode runs in one env: all or nothing
        assert len(set(marked[batch["eps_id"] == eid])) == 1
    np.testing.assert_array_equal(batch["actions"][marked], 1)  # the env's own action, recorded
    np.testing.assert_array_equal(batch["actions"][~marked], 0)  # the policy's
    np.testing.assert_array_equal(
        batch["vf_preds"], batch["obs"][:, 0]
    )  # the policy's extras are kept


@pytest.mark.parametrize("horizon", [0, 1])
def test_multi_agent_host_chunks_are_rllib_runner_chunks(horizon):
    """Every chunk numpy'ized, none with an agent episode without a step (TurnDictEnv's
    agents wait for their turn across call boundaries), every agent step in one chunk."""
    from tests.sampling.device.test_multi_agent import assert_rllib_runner_chunks

    henv = MultiAgentDictEnv([TurnDictEnv for _ in range(2)], seed=0)
    s = HostSampler(henv, _ma_policy(henv), episode_lookback_horizon=horizon, rollout_length=5)
    calls = [s.sample({"p0": (), "p1": ()}) for _ in range(6)]
    assert assert_rllib_runner_chunks(calls, None) >= 3
