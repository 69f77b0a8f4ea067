"""js.evaluate: exactly N episodes, each env's first, against closed forms and by-hand
stepping (NumPy, Gymnasium's CartPole), greedy actions, frozen transform statistics."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path
from typing import Any, ClassVar

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import jaxsampler as js
from jaxsampler.envs.base import SingleAgentEnv
from jaxsampler.envs.cartpole import CartPole
from jaxsampler.policies.base import Policy
from jaxsampler.spaces import Box, Discrete
from jaxsampler.transforms import NormalizeObservation
from jaxsampler.transforms.base import Context, Observed, Spaces, StageState, Transform
from jaxsampler.types import NoInfo
from tests.devices import run_on_devices
from tests.fakes import (
    ChaosEnv,
    CountingPolicy,
    FakeEnv,
    FakeParams,
    TurnEnv,
    expected_episode,
)

KEY = jax.random.PRNGKey(7)
ROOT = Path(__file__).resolve().parents[2]


def counting(env: Any) -> CountingPolicy:
    return CountingPolicy(env.observation_space, env.action_space)


def counting_return(length: int, n: int = 3) -> float:
    """Return of a FakeEnv episode under CountingPolicy: reward = action = t % n."""
    return float(sum(t % n for t in range(length)))


def reset_key(key: jax.Array, episode: int) -> jax.Array:
    """The documented reset key of episode ``i``: ``fold_in(split(key, 4)[0], i)``."""
    return jax.random.fold_in(jax.random.split(key, 4)[0], episode)


# --------------------------------------------------------------------------- test envs


@struct.dataclass
class EchoState:
    time: jax.Array


@struct.dataclass
class EchoParams:
    c: float = 0.0
    max_steps_in_episode: int = 4


@dataclasses.dataclass(frozen=True)
class EchoEnv(SingleAgentEnv):
    """obs = [time, c]; reward = the action (its sum for a Box action); truncated only."""

    continuous: bool = False

    @property
    def default_params(self) -> EchoParams:
        return EchoParams()

    @property
    def observation_space(self) -> Box:
        return Box(-np.inf, np.inf, (2,), np.float32)

    @property
    def action_space(self) -> Box | Discrete:
        return Box(-np.inf, np.inf, (1,), np.float32) if self.continuous else Discrete(3)

    def reset_env(self, key, params):
        time = jnp.zeros((), jnp.int32)
        return self._obs(time, params), EchoState(time)

    def step_env(self, key, state, action, params):
        # The base class advances state.time after step_env.
        reward = jnp.sum(action.astype(jnp.float32))
        return self._obs(state.time + 1, params), state, reward, jnp.bool_(False), NoInfo()

    @staticmethod
    def _obs(time, params):
        return jnp.stack([time.astype(jnp.float32), jnp.asarray(params.c, jnp.float32)])


@dataclasses.dataclass(frozen=True)
class MixPolicy(Policy):
    """Box action = obs[0] + 3 obs[1] of what it sees (so returns reveal the observations);
    ``explore`` adds N(0, 1) noise."""

    observation_space: Any
    action_space: Any
    explore: bool = True

    def init(self, key):
        return ()

    def __call__(self, params, obs, key, state):
        a = obs[..., 0:1] + 3.0 * obs[..., 1:2]
        if self.explore:
            a = a + jax.random.normal(key, a.shape)
        return a.astype(jnp.float32), {}, state


@dataclasses.dataclass(frozen=True)
class PushRight(Policy):
    """CartPole: always action 1."""

    observation_space: Any
    action_space: Any
    explore: bool = False

    def init(self, key):
        return ()

    def __call__(self, params, obs, key, state):
        return jnp.ones(obs.shape[:2], jnp.int32), {}, state


@dataclasses.dataclass(frozen=True)
class TimesHundred(Transform):
    """Multiplies rewards by 100 (a reward transform: evaluate must report raw returns)."""

    changes_reward: ClassVar[bool] = True

    def observe(self, spaces: Spaces, state: StageState, step: Observed, ctx: Context):
        return state, dataclasses.replace(step, reward=step.reward * 100.0)


# --------------------------------------------------------------------------- episodes


def biased_first_to_finish(lengths: list[int], n: int) -> float:
    """Mean length of "the first n episodes to finish" when env e repeats episodes of
    ``lengths[e]`` steps (with the one-step reset of the auto-reset contract)."""
    finished: list[tuple[int, int]] = []  # (finish time, length)
    for length in lengths:
        t = 0
        while t < 10 * max(lengths):
            t += length
            finished.append((t, length))
            t += 1
    finished.sort()
    return float(np.mean([length for _, length in finished[:n]]))


@pytest.mark.parametrize("num_envs", [None, 3, 1])
def test_each_env_contributes_its_first_episode(num_envs):
    """Per-episode time limits fix each episode's length; every episode is returned once,
    in order, whether each env runs one episode or envs take the next episodes in turn."""
    lengths = [1, 7, 2, 6, 3, 5, 1, 8]
    N = len(lengths)
    L = jnp.asarray(lengths, jnp.int32)
    params = FakeParams(term_len=L, max_steps_in_episode=L)
    env = FakeEnv()
    res = js.evaluate(
        env, counting(env), (), N, KEY, deterministic=False, env_params=params, num_envs=num_envs
    )
    assert res.num_episodes == N and res.returns.dtype == np.float64
    assert res.lengths.dtype == np.int64 and res.terminated.dtype == np.bool_
    np.testing.assert_array_equal(res.lengths, lengths)
    np.testing.assert_array_equal(res.returns, [counting_return(n) for n in lengths])
    assert res.truncated.all()  # every episode reached its time limit
    np.testing.assert_array_equal(res.env_params.max_steps_in_episode, lengths)
    assert res.env_params.nan_tag.shape == (N,)  # shared leaves broadcast per episode
    assert res.mean_length == np.mean(lengths)
    # "The first N to finish" would have a very different, short-biased mean.
    assert biased_first_to_finish(lengths, N) < 0.6 * np.mean(lengths)


def test_random_lengths_match_the_by_hand_reset_keys():
    """FakeEnv draws each episode's tag (so its length and end kind) at reset; the episode
    ``i`` is reset with the documented key, and the flags follow from the tag."""
    env, N = FakeEnv(), 12
    for num_envs in (12, 5):
        res = js.evaluate(env, counting(env), (), N, KEY, deterministic=False, num_envs=num_envs)
        for i in range(N):
            _, ts = env.reset(reset_key(KEY, i))
            length, term, trunc = expected_episode(float(ts.obs[0, 1]))
            assert res.lengths[i] == length
            assert res.terminated[i] == term and res.truncated[i] == trunc
            assert res.returns[i] == counting_return(length)
        assert res.env_params is None
    assert 0 < res.terminated.sum() < N  # both kinds occur: the check above is not vacuous


def test_max_steps_cuts_and_reports_truncated():
    env = FakeEnv()
    res = js.evaluate(env, counting(env), (), 6, KEY, deterministic=False, max_steps=2)
    np.testing.assert_array_equal(res.lengths, 2)
    assert res.truncated.all() and not res.terminated.any()
    np.testing.assert_array_equal(res.returns, counting_return(2))


def test_multi_agent_returns_sum_over_agents():
    """TurnEnv: 4 steps, per step the actor gets 1 and the waiting agent 0.5."""
    env = TurnEnv()
    pol = CountingPolicy(env.observation_space, env.action_space)
    res = js.evaluate(env, pol, (), 3, KEY, deterministic=False)
    np.testing.assert_array_equal(res.lengths, 4)
    np.testing.assert_array_equal(res.agent_returns, [[3.0, 3.0]] * 3)
    np.testing.assert_array_equal(res.returns, 6.0)
    assert res.terminated.all() and not res.truncated.any()


def chaos_by_hand(env: ChaosEnv, key: jax.Array, i: int) -> tuple[np.ndarray, int, bool, bool]:
    """Episode ``i`` of ChaosEnv stepped one env at a time with the documented keys
    (reset: ``fold_in(k_reset, i)``; step ``t``: ``fold_in(fold_in(k_step, i), t)``):
    per-agent returns, length, and the episode's flags (every agent terminated / some
    agent truncated), each agent's flags taken at its own last step."""
    k_reset, k_step = jax.random.split(key, 4)[:2]
    state, ts = env.reset(jax.random.fold_in(k_reset, i))
    returns, done = np.zeros(3), np.zeros(3, bool)
    term, trunc = np.zeros(3, bool), np.zeros(3, bool)
    t = 0
    while not done.all():
        step_key = jax.random.fold_in(jax.random.fold_in(k_step, i), t)
        state, ts = env.step(step_key, state, jnp.zeros((3,), jnp.int32))
        t += 1
        returns += np.asarray(ts.reward)
        ended = np.asarray(ts.terminated | ts.truncated)
        term = np.where(done, term, np.asarray(ts.terminated))
        trunc = np.where(done, trunc, np.asarray(ts.truncated))
        done |= ended
    return returns, t, bool(term.all()), bool(trunc.any())


def test_out_of_lockstep_agents_match_stepping_by_hand():
    """ChaosEnv: agents finish at random steps (rewards ignore the actions); per-agent
    returns, the episode length (until the last agent is done) and the flags equal
    stepping each episode by hand."""
    env, N = ChaosEnv(), 6
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    res = js.evaluate(env, pol, (), N, KEY, deterministic=False, num_envs=4)
    for i in range(N):
        returns, length, term, trunc = chaos_by_hand(env, KEY, i)
        np.testing.assert_allclose(res.agent_returns[i], returns, rtol=1e-6)
        assert res.lengths[i] == length
        assert (res.terminated[i], res.truncated[i]) == (term, trunc)
    assert len(set(res.lengths.tolist())) > 1


# --------------------------------------------------------------------------- greedy


def echo_obs(c: float, length: int) -> np.ndarray:
    return np.stack([np.arange(length, dtype=np.float32), np.full(length, c, np.float32)], -1)


def test_greedy_discrete_is_the_argmax_of_the_logits():
    env = EchoEnv()
    pol = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    params = pol.init(jax.random.PRNGKey(3))
    cs = jnp.asarray([-3.0, -0.5, 0.7, 4.0], jnp.float32)
    ep = EchoParams(c=cs, max_steps_in_episode=4)
    res = js.evaluate(env, pol, params, 4, KEY, env_params=ep)
    np.testing.assert_array_equal(res.lengths, 4)
    for i, c in enumerate(np.asarray(cs)):
        logits = np.asarray(pol.forward(params, jnp.asarray(echo_obs(c, 4)))[0])
        assert res.returns[i] == float(np.argmax(logits, -1).sum())
    sampled = js.evaluate(env, pol, params, 4, KEY, env_params=ep, deterministic=False)
    assert not np.array_equal(sampled.returns, res.returns)


def test_greedy_continuous_is_the_gaussian_mean():
    env = EchoEnv(continuous=True)
    pol = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    params = pol.init(jax.random.PRNGKey(4))
    cs = jnp.asarray([-1.0, 0.0, 2.0], jnp.float32)
    res = js.evaluate(env, pol, params, 3, KEY, env_params=EchoParams(c=cs))
    for i, c in enumerate(np.asarray(cs)):
        mean = np.asarray(pol.forward(params, jnp.asarray(echo_obs(c, 4)))[0])
        np.testing.assert_allclose(res.returns[i], mean.sum(), rtol=1e-5, atol=1e-6)


def test_greedy_recurrent_policy_matches_stepping_it_by_hand():
    """The GRU carry is threaded through the episode: the actions equal the greedy
    policy stepped by hand over the (known) observations."""
    env = EchoEnv()
    pol = js.policies.RecurrentPolicy(env.observation_space, env.action_space, hidden_size=4)
    params = pol.init(jax.random.PRNGKey(5))
    cs = np.asarray([-2.0, 1.0, 3.0], np.float32)
    res = js.evaluate(env, pol, params, 3, KEY, env_params=EchoParams(c=jnp.asarray(cs)))
    g = js.policies.greedy(pol)
    for i, c in enumerate(cs):
        carry, total = g.initial_state((1, 1)), 0
        for obs in echo_obs(c, 4):
            action, _, carry = g(params, jnp.asarray(obs)[None, None], KEY, carry)
            total += int(action[0, 0])
        assert res.returns[i] == total


def test_deterministic_needs_a_greedy_policy():
    env = FakeEnv()
    rand = js.RandomPolicy(env.observation_space, env.action_space)
    with pytest.raises(TypeError, match="cannot act greedily"):
        js.evaluate(env, rand, (), 2, KEY)
    res = js.evaluate(env, rand, (), 2, KEY, deterministic=False)
    assert res.num_episodes == 2


# --------------------------------------------------------------------------- transforms


def normalized(obs: np.ndarray, mean: np.ndarray, var: np.ndarray) -> np.ndarray:
    z = (obs.astype(np.float32) - mean) / np.sqrt(var + np.float32(1e-8))
    return np.clip(z, -10.0, 10.0)


def test_frozen_statistics_from_a_training_state():
    """The eval observations are normalized with exactly the training statistics, at every
    step (MixPolicy's actions, hence the returns, reveal them), and never updated."""
    env = EchoEnv(continuous=True)
    tf = (NormalizeObservation(),)
    pipe = js.rollout.pipeline_of(env, tf)
    pol = MixPolicy(pipe.observation_space, pipe.action_space)
    train_params = EchoParams(c=jnp.asarray([1.0, 2.0, 6.0]), max_steps_in_episode=3)
    rollout = js.make_rollout(env, pol, 3, 7, transforms=tf)
    state = rollout.init(KEY, train_params)
    state, _ = jax.jit(rollout)((), state)
    moments = state.transform_state.stages[0].shared[0]
    mean, var = np.asarray(moments.mean), np.asarray(moments.var)
    assert float(moments.count) > 0 and not np.allclose(mean, 0)

    cs = np.asarray([-2.0, 0.5, 3.0, 8.0], np.float32)
    ep = EchoParams(c=jnp.asarray(cs), max_steps_in_episode=5)
    res = js.evaluate(env, pol, (), 4, KEY, transforms=tf, transform_state=state, env_params=ep)
    for i, c in enumerate(cs):
        z = normalized(echo_obs(c, 5), mean, var)
        np.testing.assert_allclose(res.returns[i], (z[:, 0] + 3 * z[:, 1]).sum(), rtol=1e-5)
    # The bare transform_state works the same, as do 2 envs taking 2 episodes each.
    again = js.evaluate(
        env,
        pol,
        (),
        4,
        KEY,
        transforms=tf,
        transform_state=state.transform_state,
        env_params=ep,
        num_envs=2,
    )
    np.testing.assert_array_equal(again.returns, res.returns)
    # The training state is left as it was.
    np.testing.assert_array_equal(state.transform_state.stages[0].shared[0].mean, mean)

    # Without a state: fresh statistics (mean 0, variance 1), still frozen.
    fresh = js.evaluate(env, pol, (), 4, KEY, transforms=tf, env_params=ep)
    for i, c in enumerate(cs):
        z = normalized(echo_obs(c, 5), np.zeros(2, np.float32), np.ones(2, np.float32))
        np.testing.assert_allclose(fresh.returns[i], (z[:, 0] + 3 * z[:, 1]).sum(), rtol=1e-5)


SHARDED_SCRIPT = textwrap.dedent(
    """
    import jax, numpy as np
    import jaxsampler as js
    from jaxsampler.rollout import placement
    from jaxsampler.transforms import NormalizeObservation
    from tests.rollout.test_evaluation import EchoEnv, EchoParams, MixPolicy, echo_obs, normalized
    assert jax.device_count() == 2, jax.devices()
    env = EchoEnv(continuous=True); tf = (NormalizeObservation(),)
    pol = MixPolicy(env.observation_space, env.action_space)
    ro = js.make_rollout(env, pol, 4, 5, mesh=placement.env_mesh(2), transforms=tf)
    state = ro.init(jax.random.PRNGKey(0), EchoParams(c=jax.numpy.asarray([1., 2., 4., 9.])))
    state, _ = jax.jit(ro)((), state)
    m = state.transform_state.stages[0].shared[0]
    mean, var = np.asarray(m.mean), np.asarray(m.var)
    assert float(m.count) == 4 * 6, float(m.count)  # every env's 6 observations
    res = js.evaluate(env, pol, (), 2, jax.random.PRNGKey(1), transforms=tf,
                      transform_state=state, env_params=EchoParams(c=jax.numpy.asarray([0., 5.])))
    for i, c in enumerate([0.0, 5.0]):
        z = normalized(echo_obs(c, 4), mean, var)
        np.testing.assert_allclose(res.returns[i], (z[:, 0] + 3 * z[:, 1]).sum(), rtol=1e-5)
    print("SHARDED-EVAL-OK")
    """
)


@pytest.mark.slow
def test_frozen_statistics_from_a_sharded_training_state():
    """The statistics of a rollout whose env axis is split over 2 devices (replicated on
    both) are used as they are."""
    run_on_devices(SHARDED_SCRIPT, "SHARDED-EVAL-OK", timeout=300)


def test_returns_are_the_raw_rewards():
    env = FakeEnv()
    plain = js.evaluate(env, counting(env), (), 5, KEY, deterministic=False)
    scaled = js.evaluate(
        env, counting(env), (), 5, KEY, deterministic=False, transforms=(TimesHundred(),)
    )
    np.testing.assert_array_equal(scaled.returns, plain.returns)
    assert plain.returns.max() > 0


def test_transform_state_of_other_transforms_fails():
    env = EchoEnv(continuous=True)
    tf = (NormalizeObservation(),)
    pol = MixPolicy(env.observation_space, env.action_space)
    state = js.init_rollout_state(env, pol, 2, KEY, transforms=(TimesHundred(),))
    with pytest.raises(ValueError, match="does not match the transforms"):
        js.evaluate(env, pol, (), 2, KEY, transforms=tf, transform_state=state)
    with pytest.raises(ValueError, match="without transforms"):
        js.evaluate(env, pol, (), 2, KEY, transform_state=state)


@dataclasses.dataclass(frozen=True)
class RandomC(Transform):
    """Domain randomization of EchoEnv: a new ``c ~ U(-2, 2)`` at every reset."""

    randomizes_params: ClassVar[bool] = True

    def reset_params(self, state, key, reset, params, ctx):
        c = jax.random.uniform(key, reset.shape, jnp.float32, -2.0, 2.0)
        return state, dataclasses.replace(params, c=jnp.where(reset, c, params.c))


def test_randomized_params_are_recorded_per_episode():
    """With a transform that draws params at resets, each episode reports the params it
    ran with: MixPolicy's return over 4 steps is sum(t + 3c) = 6 + 12c."""
    env = EchoEnv(continuous=True)
    pol = MixPolicy(env.observation_space, env.action_space)
    res = js.evaluate(env, pol, (), 5, jax.random.key(3), transforms=(RandomC(),), num_envs=2)
    c = res.env_params.c
    assert c.shape == (5,) and len(set(c.tolist())) == 5  # a fresh draw per episode
    np.testing.assert_allclose(res.returns, 6.0 + 12.0 * c, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(res.lengths, 4)


# --------------------------------------------------------------------------- env params


def gym_cartpole_length(init: np.ndarray, length: float, limit: int = 500) -> int:
    """Steps until Gymnasium's CartPole (pole half-length ``length``) terminates, pushing
    right from state ``init``."""
    gym = pytest.importorskip("gymnasium", reason="Gymnasium's CartPole is the reference")
    genv = gym.make("CartPole-v1").unwrapped
    genv.reset(seed=0)
    genv.length = length
    genv.polemass_length = genv.masspole * length
    genv.state = np.asarray(init, np.float64)
    for t in range(1, limit + 1):
        _, _, terminated, _, _ = genv.step(1)
        if terminated:
            return t
    return limit


def test_per_episode_cartpole_params_match_gymnasium():
    """Episode i runs with pole length i: its length equals Gymnasium's CartPole with
    that pole length, from the episode's own initial state."""
    env = CartPole()
    pole = np.asarray([0.2, 0.5, 1.0, 2.5, 6.0], np.float32)
    params = dataclasses.replace(env.default_params, length=jnp.asarray(pole))
    pol = PushRight(env.observation_space, env.action_space)
    res = js.evaluate(env, pol, (), len(pole), KEY, env_params=params, num_envs=2)
    want = []
    for i, length in enumerate(pole):
        state, _ = env.reset(reset_key(KEY, i), env.default_params)
        init = [float(state.x), float(state.x_dot), float(state.theta), float(state.theta_dot)]
        want.append(gym_cartpole_length(np.asarray(init), float(length)))
    np.testing.assert_array_equal(res.lengths, want)
    np.testing.assert_array_equal(res.returns, want)  # reward 1 per step
    assert len(set(want)) > 2  # the pole lengths matter
    np.testing.assert_allclose(res.env_params.length, pole)


# --------------------------------------------------------------------------- compilation


def test_a_second_call_does_not_compile_again():
    counted = chex.assert_max_traces(CountingPolicy.__call__, n=1)

    @dataclasses.dataclass(frozen=True)
    class Counted(CountingPolicy):
        def __call__(self, params, obs, key, state):
            return counted(self, params, obs, key, state)

    env = FakeEnv()
    pol = Counted(env.observation_space, env.action_space)
    L = jnp.asarray([2, 3, 4, 5, 2], jnp.int32)
    for seed, limit in ((0, 5), (1, 3), (2, 4)):  # new keys, params values, step bounds
        js.evaluate(
            env,
            pol,
            (),
            5,
            jax.random.PRNGKey(seed),
            deterministic=False,
            env_params=FakeParams(term_len=L, max_steps_in_episode=L + seed),
            num_envs=2,
            max_steps=limit,
        )


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("n", [0, -1, 2.5, True, "3"])
def test_bad_num_episodes(n):
    env = FakeEnv()
    with pytest.raises(ValueError, match="num_episodes must be an int >= 1"):
        js.evaluate(env, counting(env), (), n, KEY, deterministic=False)


def test_env_params_with_another_leading_axis_names_the_shapes():
    env = FakeEnv()
    bad = FakeParams(term_len=jnp.asarray([3, 4, 5]))
    with pytest.raises(ValueError, match=r"term_len has shape \(3,\).*\(4,\).*num_episodes=4"):
        js.evaluate(env, counting(env), (), 4, KEY, deterministic=False, env_params=bad)


def test_bad_num_envs_and_key():
    env = FakeEnv()
    with pytest.raises(ValueError, match="num_envs"):
        js.evaluate(env, counting(env), (), 2, KEY, deterministic=False, num_envs=0)
    with pytest.raises(TypeError, match="PRNG key"):
        js.evaluate(env, counting(env), (), 2, 0, deterministic=False)


def test_repr_and_summary():
    env = FakeEnv()
    res = js.evaluate(env, counting(env), (), 4, KEY, deterministic=False)
    assert repr(res).startswith("EvalResult(num_episodes=4, mean_return=")
    d = res.as_dict()
    assert d["num_episodes"] == 4 and d["episode_return_mean"] == pytest.approx(res.mean_return)
    assert d["episode_len_mean"] == pytest.approx(np.mean(res.lengths))
    assert d["episode_return_std"] == pytest.approx(np.std(res.returns))
    assert d["num_terminated"] + d["num_truncated"] >= 1
