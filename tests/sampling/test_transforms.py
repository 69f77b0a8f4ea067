"""Samplers with transforms: what episodes, batches and metrics hold, on device and host envs."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.envs.cartpole import CartPole, CartPoleState
from jaxsampler.host_envs import HostEnv
from jaxsampler.host_envs.base import PollResult
from jaxsampler.rollout import pipeline_of
from jaxsampler.transforms import NormalizeObservation, Observed, StageState, Transform
from tests.fakes import FakeEnv

E, T = 3, 12


@dataclasses.dataclass(frozen=True)
class ScaleRewardForTest(Transform):
    """reward -> scale * reward + step count of the row's episode (a row state), so the
    test sees both the scaling and where rows restart."""

    scale: float = 0.5
    count: bool = True

    changes_reward = True

    def init_rows(self, spaces, batch_shape):
        return jnp.zeros(batch_shape, jnp.float32)

    def observe(self, spaces, state: StageState, step: Observed, ctx):
        count = jnp.where(step.first, 0.0, state.rows + step.recorded.astype(jnp.float32))
        reward = self.scale * step.reward + jnp.where(step.first | (not self.count), 0.0, count)
        return StageState(state.shared, count), dataclasses.replace(step, reward=reward)


def expected_scaled(raw: np.ndarray, scale: float = 0.5) -> np.ndarray:
    """What ScaleRewardForTest gives an episode's rewards (the i-th step's count is i + 1)."""
    return scale * raw + np.arange(1, len(raw) + 1, dtype=np.float32)


@dataclasses.dataclass(frozen=True)
class RandomLength(Transform):
    """Draws CartPole's pole ``length`` from U(0.3, 0.9) at every reset (test-local domain
    randomization)."""

    randomizes_params: ClassVar[bool] = True

    def reset_params(self, state, key, reset, params, ctx):
        new = jax.random.uniform(key, reset.shape, jnp.float32, 0.3, 0.9)
        length = jnp.where(reset, new, jnp.asarray(params.length, jnp.float32))
        return state, dataclasses.replace(params, length=length)


def mlp(env_or_pipe: Any, explore: bool = True) -> js.MLPPolicy:
    return js.MLPPolicy(
        env_or_pipe.observation_space, env_or_pipe.action_space, hidden_sizes=(8,), explore=explore
    )


# --------------------------------------------------------------------------- device


def test_device_episodes_hold_normalized_obs_and_metrics_the_env_returns():
    env = CartPole()
    tf = (NormalizeObservation(), ScaleRewardForTest())
    pipe = pipeline_of(env, tf)
    pol = mlp(pipe)
    params = pol.init(jax.random.PRNGKey(0))
    s = js.Sampler(env, pol, E, T, seed=1, transforms=tf)
    raw_returns, scaled_ok = [], 0
    for _ in range(4):
        eps = s.sample(params)
        assert all(ep.observation_space == pipe.observation_space for ep in eps)
        for ep in eps:
            obs = np.asarray(ep.observations.data)
            assert np.all(np.abs(obs) <= 10.0)  # clipped normalized values
            if ep.t_started == 0:
                # CartPole's reward is 1 per step: the scaled rewards follow in closed form.
                np.testing.assert_allclose(
                    np.asarray(ep.get_rewards()), expected_scaled(np.ones(len(ep), np.float32))
                )
                scaled_ok += 1
        if s.metrics.num_episodes_completed:
            raw_returns.append(s.metrics.episode_return_mean)
            # The metrics' returns are the env's (1 per step = the episode's length).
            assert s.metrics.episode_return_mean == s.metrics.episode_len_mean
    assert scaled_ok and raw_returns
    batch = s.sample_batch(params)["default_policy"]
    assert np.all(batch["rewards"] > 1.0), "batches hold the transformed rewards"


def test_device_statistics_equal_numpy_over_the_raw_observations_across_resets():
    env = CartPole()
    tf = (NormalizeObservation(clip=None),)
    pol = mlp(pipeline_of(env, tf))
    params = pol.init(jax.random.PRNGKey(0))
    s = js.sampling.DeviceSampler(env, pol, E, T, seed=3, transforms=tf)
    raw, counts = [], []
    # fresh, continued, reset (num_episodes), fresh again (after num_episodes)
    for fresh, kw in ((True, {}), (False, {}), (True, {"num_episodes": 2}), (True, {})):
        s.sample(params, **kw)
        chunks = s.last_chunks
        assert all(c.raw_obs is not None and c.raw_rewards is None for c in chunks)
        if fresh:  # the reset's first observations
            raw.append(np.asarray(chunks[0].raw_obs)[0, :, 0])
        # CartPole, one agent: every observation a step produces is recorded (acted on,
        # final, or a reset's first one); slot 0 of a chunk is the previous one's last.
        raw += [np.asarray(c.raw_obs)[1:, :, 0].reshape(-1, 4) for c in chunks]
        m = jax.device_get(s.transform_state.stages[0].shared[0])
        counts.append(int(m.count))
        all_raw = np.concatenate(raw)
        assert int(m.count) == len(all_raw), "the statistics continue across resets"
        np.testing.assert_allclose(m.mean, all_raw.mean(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(m.m2 / m.count, all_raw.var(0), rtol=1e-4, atol=1e-6)
        # The episodes' observations are the raw ones normalized (with the statistics of
        # their step, which are at least as old as the call's start).
    assert counts == sorted(counts)


def test_device_domain_randomization_puts_each_steps_params_in_infos():
    env = CartPole()
    tf = (RandomLength(),)
    pol = mlp(env)
    params = pol.init(jax.random.PRNGKey(0))
    s = js.Sampler(env, pol, E, 40, seed=2, transforms=tf)
    eps = s.sample(params)
    lengths = []
    for ep in eps:
        infos = ep.infos.data if not isinstance(ep.infos.data, list) else None
        assert infos is not None, "infos hold the env params"
        length = np.asarray(infos["env_params"]["length"])
        assert length.shape == (len(ep) + 1,)
        assert np.all(length == length[0]), "one episode, one pole length"
        assert 0.3 <= length[0] <= 0.9
        np.testing.assert_allclose(infos["env_params"]["masscart"], env.default_params.masscart)
        lengths.append(float(length[0]))
        # The dynamics ran with that length: CartPole's step from each (raw) observation
        # and action, with the recorded params, gives the next observation.
        obs = np.asarray(ep.observations.data)
        acts = np.asarray(ep.actions.data)
        p = dataclasses.replace(env.default_params, length=jnp.float32(length[0]))
        for t in range(len(ep)):
            st = CartPoleState(*[jnp.float32(v) for v in obs[t]], jnp.int32(0))
            nxt = env.step_env(jax.random.PRNGKey(0), st, jnp.int32(acts[t]), p)[0]
            np.testing.assert_allclose(np.asarray(nxt), obs[t + 1], rtol=1e-5, atol=1e-6)
    assert len(set(lengths)) == len(lengths), "a new length per episode"
    batch = s.sample_batch(params)["default_policy"]
    col = np.asarray(batch["infos"]["env_params"]["length"])
    assert col.shape == (len(batch),)
    for eid in set(batch["eps_id"].tolist()):
        rows = batch["eps_id"] == eid
        assert np.all(col[rows] == col[rows][0])


def test_device_multi_agent_rewards_and_env_params_in_infos():
    from tests.fakes import TurnEnv

    env = TurnEnv()
    tf = (ScaleRewardForTest(scale=2.0, count=False),)
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    s = js.Sampler(env, pol, 2, 9, seed=0, transforms=tf)
    plain = js.Sampler(env, pol, 2, 9, seed=0)
    for _ in range(2):  # (the second call continues the first's chunks)
        eps, ref = s.sample(()), plain.sample(())
        assert eps and all(isinstance(ep, js.MultiAgentEpisode) for ep in eps)
        assert [ep.id_ for ep in eps] == [ep.id_ for ep in ref]
        for ep, r in zip(eps, ref, strict=True):
            for aid, sa in ep.agent_episodes.items():
                ra = r.agent_episodes[aid]
                np.testing.assert_allclose(
                    np.asarray(sa.get_rewards()), 2.0 * np.asarray(ra.get_rewards())
                )
                np.testing.assert_array_equal(
                    np.asarray(sa.get_actions()), np.asarray(ra.get_actions())
                )
        # Metrics are the env's returns: the same as the untransformed sampler's.
        for f in ("episode_return_mean", "episode_len_mean", "num_episodes_completed"):
            np.testing.assert_equal(getattr(s.metrics, f), getattr(plain.metrics, f))
    b, rb = s.sample_batch(()), plain.sample_batch(())
    np.testing.assert_allclose(
        b["default_policy"]["rewards"], 2.0 * rb["default_policy"]["rewards"]
    )


# --------------------------------------------------------------------------- host


class ReplayHostEnv(HostEnv):
    """Replays a device rollout's raw env data poll by poll, lockstep: poll ``k`` is
    device step ``k`` (a reset step delivers the new episode's first observation only),
    and checks that the sampler sends the actions the device took (env side)."""

    agent_ids = ("agent_0",)

    def __init__(self, env: js.Env, traj: Any):
        self.observation_space, self.action_space = env.observation_space, env.action_space
        self.traj = jax.device_get(traj)
        self.num_envs = self.traj.is_reset.shape[1]
        self.k = -1
        self.mismatches = 0

    def poll(self, timeout=None):
        tr, a = self.traj, "agent_0"
        raw_obs = tr.obs if tr.raw_obs is None else tr.raw_obs
        raw_rew = tr.rewards if tr.raw_rewards is None else tr.raw_rewards
        obs, rew, term, trunc = {}, {}, {}, {}
        if self.k < 0:
            obs = {e: {a: np.asarray(raw_obs[0, e, 0])} for e in range(self.num_envs)}
        else:
            k = self.k
            for e in range(self.num_envs):
                obs[e] = {a: np.asarray(raw_obs[k + 1, e, 0])}
                if tr.is_reset[k, e]:
                    continue
                rew[e] = {a: float(raw_rew[k, e, 0])}
                te, tu = bool(tr.terminated[k, e, 0]), bool(tr.truncated[k, e, 0])
                term[e] = {a: te, "__all__": te}
                trunc[e] = {a: tu, "__all__": tu}
        self.k += 1
        return PollResult(obs, rew, term, trunc, {}, {})

    def send_actions(self, actions):
        k = self.k
        for e, per in actions.items():
            want = np.asarray(self.traj.actions[k, e, 0])
            self.mismatches += int(not np.array_equal(np.asarray(per["agent_0"]), want))


def _device_run(env, tf, pol, params, steps, seed=0):
    """A device rollout of ``steps`` steps and the state after it."""
    rollout = js.make_rollout(env, pol, E, steps, transforms=tf)
    state = rollout.init(jax.random.PRNGKey(seed))
    state, traj = jax.jit(rollout)(params, state)
    return state, traj


def test_host_env_gives_the_device_rollouts_normalized_obs_statistics_and_rewards():
    env = CartPole()
    tf = (NormalizeObservation(), ScaleRewardForTest())
    pipe = pipeline_of(env, tf)
    pol = mlp(pipe, explore=False)  # greedy: actions follow from the (normalized) obs
    params = pol.init(jax.random.PRNGKey(0))
    steps = 40
    dstate, traj = _device_run(env, tf, pol, params, steps)
    host = ReplayHostEnv(env, traj)
    hs = js.Sampler(host, pol, rollout_length=steps, transforms=tf)
    assert isinstance(hs, js.sampling.HostSampler)
    eps = hs.sample(params)
    assert host.mismatches == 0, "the host sampler sent the device's actions"
    # The same statistics (float32 tolerance).
    dm = jax.device_get(dstate.transform_state.stages[0].shared[0])
    hm = jax.device_get(hs.transforms.shared[0][0])
    assert int(hm.count) == int(dm.count)
    np.testing.assert_allclose(hm.mean, dm.mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(hm.m2, dm.m2, rtol=1e-4, atol=1e-5)
    # The same normalized observations and transformed rewards, episode by episode:
    # the device sampler on the same keys gives the same episodes.
    ds = js.sampling.DeviceSampler(env, pol, E, steps, seed=0, transforms=tf)
    ds._state = js.init_rollout_state(env, pol, E, jax.random.PRNGKey(0), transforms=tf)
    ds._convert.reset({})
    deps = ds.sample(params)
    assert len(deps) == len(eps)
    key = lambda ep: (float(np.asarray(ep.observations.data)[0, 0]), len(ep))
    for d, h in zip(sorted(deps, key=key), sorted(eps, key=key), strict=True):
        np.testing.assert_allclose(
            np.asarray(h.observations.data), np.asarray(d.observations.data), atol=2e-5
        )
        np.testing.assert_allclose(np.asarray(h.get_rewards()), np.asarray(d.get_rewards()))
        np.testing.assert_array_equal(np.asarray(h.actions.data), np.asarray(d.actions.data))
        assert (h.is_terminated, h.is_truncated) == (d.is_terminated, d.is_truncated)
    # Metrics: the env's own returns on both.
    assert hs.metrics.episode_return_mean == ds.metrics.episode_return_mean
    assert hs.metrics.num_episodes_completed == ds.metrics.num_episodes_completed > 0


def test_host_statistics_equal_numpy_over_every_polled_observation():
    env = FakeEnv()  # obs = [time, tag]
    tf = (NormalizeObservation(clip=None),)
    pol = mlp(pipeline_of(env, tf), explore=False)
    params = pol.init(jax.random.PRNGKey(1))
    _, traj = _device_run(env, tf, pol, params, 20, seed=4)
    host = ReplayHostEnv(env, traj)
    hs = js.sampling.HostSampler(host, pol, rollout_length=20, transforms=tf, batch_sizes=(2,))
    eps = hs.sample(params)
    assert host.mismatches == 0
    polled = [np.asarray(traj.raw_obs)[0, :, 0]]
    polled += [np.asarray(traj.raw_obs)[k + 1, :, 0] for k in range(20)]
    all_raw = np.concatenate(polled)
    m = jax.device_get(hs.transforms.shared[0][0])
    assert int(m.count) == len(all_raw) == E * 21  # rows split over 2-row calls too
    np.testing.assert_allclose(m.mean, all_raw.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m.m2 / m.count, all_raw.var(0), rtol=1e-4, atol=1e-6)
    # Episodes hold the observations normalized with the statistics of their poll.
    for ep in eps:
        assert np.all(np.isfinite(np.asarray(ep.observations.data)))
    # The returns of the metrics are the env's (FakeEnv: reward = action).
    for ep in eps:
        np.testing.assert_array_equal(np.asarray(ep.get_rewards()), np.asarray(ep.get_actions()))


def test_host_reward_transform_and_env_returns():
    env = FakeEnv()
    tf = (ScaleRewardForTest(scale=3.0),)
    pol = mlp(env, explore=False)
    params = pol.init(jax.random.PRNGKey(2))
    _, traj = _device_run(env, tf, pol, params, 16, seed=5)
    host = ReplayHostEnv(env, traj)
    hs = js.sampling.HostSampler(host, pol, transforms=tf)
    eps = hs.sample(params, num_timesteps=30)
    assert host.mismatches == 0
    finished = [ep for ep in eps if ep.is_done and ep.t_started == 0]
    assert finished
    for ep in eps:
        if ep.t_started == 0:
            raw = np.asarray(ep.get_actions(), np.float32)  # FakeEnv: reward = action
            np.testing.assert_allclose(np.asarray(ep.get_rewards()), expected_scaled(raw, 3.0))
    rets = [float(np.sum(np.asarray(ep.get_actions()))) for ep in finished]
    assert hs.metrics.episode_return_mean == pytest.approx(np.mean(rets))
    batch = hs.sample_batch(params, num_timesteps=6)["default_policy"]
    assert len(batch) and np.all(batch["rewards"] >= 3.0 * batch["actions"] + 1)


def test_host_rejects_domain_randomization_and_policies_for_the_raw_spaces():
    env = CartPole()
    _, traj = _device_run(env, (), mlp(env), mlp(env).init(jax.random.PRNGKey(0)), 2)
    host = ReplayHostEnv(env, traj)
    with pytest.raises(ValueError, match="RandomLength draws env params"):
        js.Sampler(host, mlp(env), transforms=(RandomLength(),))


def test_policy_for_the_untransformed_spaces_is_refused_naming_the_pipeline():
    @dataclasses.dataclass(frozen=True)
    class AddFeature(Transform):  # obs [4] -> [5]
        changes_obs = True

        def observation_space(self, spaces):
            return js.spaces.Box(-np.inf, np.inf, (5,), np.float32)

        def observe(self, spaces, state, step, ctx):
            obs = jnp.concatenate([step.obs, jnp.ones(step.obs.shape[:-1] + (1,))], -1)
            return state, dataclasses.replace(step, obs=obs)

    env = CartPole()
    with pytest.raises(ValueError, match=r"pipeline_of\(env, transforms\)\.observation_space"):
        js.Sampler(env, mlp(env), 2, 4, transforms=(AddFeature(),))
    _, traj = _device_run(env, (), mlp(env), mlp(env).init(jax.random.PRNGKey(0)), 2)
    with pytest.raises(ValueError, match=r"pipeline_of\(env, transforms\)\.observation_space"):
        js.Sampler(ReplayHostEnv(env, traj), mlp(env), transforms=(AddFeature(),))
    with pytest.raises(TypeError, match="transforms must be"):
        js.Sampler(env, mlp(env), 2, 4, transforms=("normalize",))


class TurnHostEnv(HostEnv):
    """Two agents take turns in 2 lockstep sub-envs: each poll has the mover's observation
    and rewards for both (reward-only for the waiting agent: 0.25, the mover: 1); agent
    ``b`` joins at the second poll; every episode ends after 4 steps, both agents seeing
    their final observation."""

    agent_ids = ("a", "b")
    num_envs = 2
    observation_space = js.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = js.spaces.Discrete(2)

    def __init__(self):
        self.t = dict.fromkeys(range(self.num_envs), -1)

    def poll(self, timeout=None):
        obs, rew, term, trunc = {}, {}, {}, {}
        for e in range(self.num_envs):
            t = self.t[e] = self.t[e] + 1
            o = np.array([t + 10 * e], np.float32)
            if t == 0:
                obs[e] = {"a": o}
                continue
            mover = "a" if t % 2 == 1 else "b"  # who acted on the previous observation
            rew[e] = {mover: 1.0, ("b" if mover == "a" else "a"): 0.25}
            done = t == 4
            obs[e] = {"a": o, "b": o} if done else {("b" if mover == "a" else "a"): o}
            term[e] = {"__all__": done}
            trunc[e] = {"__all__": False}
            if done:
                self.t[e] = -1
        return PollResult(obs, rew, term, trunc, {}, {})

    def send_actions(self, actions):
        pass

    def reset(self):
        self.t = dict.fromkeys(range(self.num_envs), -1)


def test_host_multi_agent_reward_transform_sees_reward_only_polls():
    pol = js.RandomPolicy(TurnHostEnv.observation_space, TurnHostEnv.action_space)
    tf = (ScaleRewardForTest(scale=2.0, count=False), NormalizeObservation())
    s = js.Sampler(TurnHostEnv(), pol, rollout_length=11, transforms=tf)
    plain = js.Sampler(TurnHostEnv(), pol, rollout_length=11)
    for _ in range(2):
        eps, ref = s.sample(()), plain.sample(())
        assert [ep.id_ for ep in eps] == [ep.id_ for ep in ref]
        n = 0
        for ep, r in zip(eps, ref, strict=True):
            for aid, sa in ep.agent_episodes.items():
                ra = r.agent_episodes[aid]
                # an agent's step reward sums the (scaled) rewards of its waiting polls
                np.testing.assert_allclose(
                    np.asarray(sa.get_rewards()), 2.0 * np.asarray(ra.get_rewards())
                )
                np.testing.assert_array_equal(
                    np.asarray(sa.get_actions()), np.asarray(ra.get_actions())
                )
                n += len(sa)
        assert n
        for f in ("episode_return_mean", "episode_len_mean", "num_episodes_completed"):
            np.testing.assert_equal(getattr(s.metrics, f), getattr(plain.metrics, f))
    assert s.metrics.num_episodes_completed > 0
    # The statistics count every observation delivered, once: 23 polls per env (the
    # first call's first poll, then 11 per call), one observation each, two on final ones.
    polled = [
        float(p % 5 + 10 * e) for e in range(2) for p in range(23) for _ in range(1 + (p % 5 == 4))
    ]
    m = jax.device_get(s.transforms.shared[1][0])
    assert int(m.count) == len(polled) == 54
    np.testing.assert_allclose(m.mean, [np.mean(polled)], rtol=1e-6)
    np.testing.assert_allclose(m.m2 / m.count, [np.var(polled)], rtol=1e-5)


@dataclasses.dataclass(frozen=True)
class RandomTag(Transform):
    """Draws FakeParams' ``nan_tag`` (unused by TurnEnv's dynamics) at every reset."""

    randomizes_params: ClassVar[bool] = True

    def reset_params(self, state, key, reset, params, ctx):
        new = jax.random.uniform(key, reset.shape, jnp.float32, 5.0, 6.0)
        tag = jnp.where(reset, new, jnp.asarray(params.nan_tag, jnp.float32))
        return state, dataclasses.replace(params, nan_tag=tag)


def test_device_multi_agent_episodes_carry_env_params_in_infos():
    from tests.fakes import TurnEnv

    env = TurnEnv()
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    s = js.Sampler(env, pol, 2, 11, seed=0, transforms=(RandomTag(),))
    tags = set()
    for _ in range(2):
        for ep in s.sample(()):
            per_episode = set()
            for sa in ep.agent_episodes.values():
                tag = np.asarray(sa.infos.data["env_params"]["nan_tag"])
                assert tag.shape == (len(sa.observations.data),)
                per_episode |= set(tag.tolist())
            if not ep.agent_episodes:
                continue
            assert len(per_episode) == 1, "one episode, one params draw, for every agent"
            (tag,) = per_episode
            assert 5.0 <= tag <= 6.0
            tags.add((ep.id_, tag))
    assert len({t for _, t in tags}) > 2
    batch = s.sample_batch(())["default_policy"]
    col = np.asarray(batch["infos"]["env_params"]["nan_tag"])
    assert col.shape == (len(batch),) and np.all((col >= 5.0) & (col <= 6.0))


def test_host_infos_carry_the_raw_obs_and_rewards():
    env = FakeEnv()
    tf = (NormalizeObservation(), ScaleRewardForTest(scale=3.0))
    pol = mlp(pipeline_of(env, tf), explore=False)
    params = pol.init(jax.random.PRNGKey(1))
    _, traj = _device_run(env, tf, pol, params, 10, seed=4)
    hs = js.sampling.HostSampler(ReplayHostEnv(env, traj), pol, rollout_length=10, transforms=tf)
    eps = hs.sample(params)
    stats = jax.device_get(hs.transforms.shared[0][0])
    assert eps
    for ep in eps:
        infos = ep.infos.data
        raw = np.stack([i["raw_obs"] for i in infos])
        assert raw.shape == (len(ep) + 1, 2)
        np.testing.assert_array_equal(raw[:, 0], np.arange(ep.t_started, ep.t + 1))  # time
        # The raw rewards behind the scaled ones (FakeEnv: reward = action).
        raw_r = np.array([i["raw_reward"] for i in infos[1:]], np.float32)
        np.testing.assert_array_equal(raw_r, np.asarray(ep.get_actions(), np.float32))
    # The last observation of a running episode is normalized with the final statistics.
    ep = eps[-1]
    last_raw = ep.infos.data[-1]["raw_obs"]
    z = (last_raw - stats.mean) / np.sqrt(stats.m2 / stats.count + 1e-8)
    np.testing.assert_allclose(
        np.asarray(ep.observations.data)[-1], np.clip(z, -10, 10), rtol=1e-5, atol=1e-5
    )
