"""The jumanji adapter against jumanji's own jitted reset/step, driven by hand."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.transforms.flatten import FlattenObservation

jumanji = pytest.importorskip("jumanji", reason="the jumanji adapter tests need jumanji")

LAST = 2


def drive(env, jenv, actions_of, steps, seed=0):
    """Steps the adapter and jumanji side by side (reset on LAST on both); yields
    (adapter TimeStep, jumanji TimeStep) per step."""
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    jreset, jstep = jax.jit(jenv.reset), jax.jit(jenv.step)
    key = jax.random.PRNGKey(seed)
    s, ts = reset(key)
    js_, jts = jreset(key)
    out = [(ts, jts)]
    for t in range(steps):
        a = actions_of(jax.random.fold_in(key, t), jts)
        s, ts = step(key, s, a[None])
        js_, jts = jstep(js_, env.jumanji_action(a))
        out.append((ts, jts))
        if int(jts.step_type) == LAST:
            key = jax.random.fold_in(key, 1000 + t)
            s, ts = reset(key)
            js_, jts = jreset(key)
    return out


def jumanji_fields(obs):
    return {k: np.asarray(v) for k, v in obs._asdict().items()}


def test_snake_bit_exact_with_ends():
    jenv = jumanji.make("Snake-v1", num_rows=8, num_cols=8, time_limit=3)
    env = js.envs.from_jumanji(jenv, env_id="Snake-v1")
    assert isinstance(env.action_space, js.spaces.Discrete)

    def legal_random(k, jts):
        return jax.random.categorical(k, jnp.where(jts.observation.action_mask, 0.0, -1e9))

    ends = {"terminated": 0, "truncated": 0}
    for ts, jts in drive(env, jenv, legal_random, 40):
        ref = jumanji_fields(jts.observation)
        np.testing.assert_array_equal(np.asarray(ts.obs["action_mask"])[0], ref.pop("action_mask"))
        for k, v in ref.items():
            np.testing.assert_array_equal(np.asarray(ts.obs["observations"][k])[0], v)
        assert ts.reward.dtype == jnp.float32
        assert float(ts.reward[0]) == float(jts.reward)
        last = int(jts.step_type) == LAST
        term = last and float(jts.discount) == 0.0
        assert bool(ts.terminated[0]) == term
        assert bool(ts.truncated[0]) == (last and not term)
        ends["terminated"] += term
        ends["truncated"] += last and not term
    # Snake reports its time limit as a termination (discount 0), so only ends of that kind.
    assert ends["terminated"] > 0, ends


def test_rubiks_multidiscrete_bit_exact():
    jenv = jumanji.make("RubiksCube-v0")
    env = js.envs.from_jumanji(jenv)
    assert isinstance(env.action_space, js.spaces.MultiDiscrete)
    assert env.observation_space["cube"].dtype == np.int8

    def rand(k, jts):
        return env.action_space.sample(k)

    for ts, jts in drive(env, jenv, rand, 6):
        for k, v in jumanji_fields(jts.observation).items():
            np.testing.assert_array_equal(np.asarray(ts.obs[k])[0], v)
        assert float(ts.reward[0]) == float(jts.reward)
        assert not bool(ts.terminated[0]) and not bool(ts.truncated[0])


@pytest.mark.slow
@pytest.mark.parametrize("env_id", ["Snake-v1", "RubiksCube-v0"])
def test_check_env(env_id):
    report = js.check_env(js.make(f"jumanji:{env_id}"), num_envs=2, num_steps=8)
    assert report.ok, str(report)


def test_masking_policy_takes_only_legal_actions():
    env = js.make("jumanji:Snake-v1", num_rows=5, num_cols=5, time_limit=10)
    tf = (FlattenObservation(),)
    pipe = js.rollout.pipeline_of(env, tf)
    policy = js.MLPPolicy(pipe.observation_space, pipe.action_space, hidden_sizes=(8,))
    params = policy.init(jax.random.PRNGKey(0))
    rollout = js.make_rollout(env, policy, 4, 30, transforms=tf)
    _, traj = jax.jit(rollout.run)(params, rollout.init(jax.random.PRNGKey(1)))
    mask = np.asarray(traj.obs["action_mask"])[:-1]  # [T, E, A, 4]
    action = np.asarray(traj.actions)  # [T, E, A]
    acting = np.asarray(traj.acting)
    legal = np.take_along_axis(mask, action[..., None], -1)[..., 0]
    assert (~mask).any(), "the rollout never saw an illegal action to avoid"
    assert legal[acting].all()


def test_joint_mask_becomes_discrete_index():
    env = js.make("jumanji:Minesweeper-v0")
    assert env.action_space == js.spaces.Discrete(100)
    assert env.observation_space["action_mask"].shape == (100,)
    np.testing.assert_array_equal(np.asarray(env.jumanji_action(jnp.int32(37))), [3, 7])


def test_adapters_with_other_options_are_other_envs():
    """Envs key jit caches: adapters of one jumanji env that differ in an option (here the
    action layout) must not compare equal, or they would share compiled code."""
    import jumanji

    raw = jumanji.make("Minesweeper-v0")
    flat, joint = js.envs.from_jumanji(raw), js.envs.from_jumanji(raw, flat_actions=False)
    assert flat.action_space != joint.action_space
    assert flat != joint
    assert flat == js.envs.from_jumanji(raw) and hash(flat) == hash(js.envs.from_jumanji(raw))


def test_bad_input():
    with pytest.raises(ValueError, match="Snake-v1"):
        js.make("jumanji:nope")
    with pytest.raises(TypeError, match="jumanji Environment"):
        js.envs.from_jumanji(object())
    with pytest.raises(ValueError, match="joint_agents=True"):
        js.make("jumanji:RobotWarehouse-v0")
    env = js.make("jumanji:RobotWarehouse-v0", joint_agents=True)
    assert env.observation_space["action_mask"].shape == (20,)
