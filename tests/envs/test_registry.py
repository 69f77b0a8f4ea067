"""The env registry: every id builds and runs; unknown ids, bad ids and registration."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.envs import registry

BUILTIN_IDS = [
    "Acrobot-v1",
    "CartPole-v1",
    "MountainCar-v0",
    "MountainCarContinuous-v0",
    "Pendulum-v1",
]


@pytest.fixture
def clean_registry():
    """Restores the registry dict exactly, whatever the test did to it."""
    saved = dict(registry.REGISTRY)
    try:
        yield registry.REGISTRY
    finally:
        registry.REGISTRY.clear()
        registry.REGISTRY.update(saved)


def test_builtin_ids_are_registered():
    ids = js.envs.registered_ids()
    assert ids == sorted(ids)
    assert set(BUILTIN_IDS) <= set(ids)
    assert not any(i.startswith("gymnax:") for i in ids)


@pytest.mark.parametrize("env_id", js.envs.registered_ids())
def test_every_registered_id_builds_and_runs(env_id):
    env = js.make(env_id)
    assert isinstance(env, js.Env)
    assert env.name == env_id
    hash(env)  # static configuration

    @jax.jit
    def reset_and_step(key):
        k_reset, k_act, k_step = jax.random.split(key, 3)
        state, ts0 = env.reset(k_reset, env.default_params)
        action = env.action_space.sample_batch(k_act, (env.num_agents,))
        _, ts1 = env.step(k_step, state, action, env.default_params)
        return ts0, ts1

    ts0, ts1 = reset_and_step(jax.random.key(0))
    A = env.num_agents
    assert jax.tree.structure(ts0) == jax.tree.structure(ts1)
    for a, b in zip(jax.tree.leaves(ts0), jax.tree.leaves(ts1), strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
    space = env.observation_space
    for ts in (ts0, ts1):
        assert ts.obs.shape == (A,) + space.shape and ts.obs.dtype == space.dtype
        assert bool(jnp.all(jax.vmap(space.contains)(ts.obs)))
        assert ts.reward.shape == (A,) and ts.reward.dtype == jnp.float32
        assert ts.terminated.dtype == jnp.bool_ and ts.truncated.dtype == jnp.bool_
    assert not np.array_equal(np.asarray(ts0.obs), np.asarray(ts1.obs))  # the step moved the env
    assert not bool(ts1.truncated.any())  # one step is far from any built-in time limit


def test_make_builds_fresh_equal_envs():
    a, b = js.make("CartPole-v1"), js.make("CartPole-v1")
    assert a == b and hash(a) == hash(b)


@pytest.mark.parametrize(
    "bad,suggestion",
    [
        ("CartPole-v2", "'CartPole-v1'"),
        ("cartpole-v1", "'CartPole-v1'"),
        ("Pendulum-v0", "'Pendulum-v1'"),
        ("MountainCar-v1", "'MountainCar-v0'"),
    ],
)
def test_unknown_id_suggests_close_match(bad, suggestion):
    with pytest.raises(ValueError, match="unknown env id") as info:
        js.make(bad)
    msg = str(info.value)
    hint = msg.split("Registered:")[0]
    assert "Did you mean" in hint and suggestion in hint
    assert "Registered: " + ", ".join(js.envs.registered_ids()) in msg
    assert "gymnax:<id>" in msg


def test_unknown_id_without_close_match():
    with pytest.raises(ValueError, match="unknown env id 'zzzz'") as info:
        js.make("zzzz")
    assert "Did you mean" not in str(info.value)


@pytest.mark.parametrize("bad", [3, None, b"CartPole-v1", ("CartPole-v1",)])
def test_non_str_id_is_a_type_error(bad):
    with pytest.raises(TypeError, match="must be a str"):
        js.make(bad)


@dataclasses.dataclass(frozen=True)
class _Tagged(js.Env):
    tag: str = "default"

    @property
    def name(self) -> str:
        return f"Tagged-v0[{self.tag}]"


def test_register_adds_id_and_passes_kwargs(clean_registry):
    assert "Tagged-v0" not in js.envs.registered_ids()
    js.register("Tagged-v0", _Tagged)
    assert "Tagged-v0" in js.envs.registered_ids()
    assert js.make("Tagged-v0") == _Tagged()
    assert js.make("Tagged-v0", tag="x").tag == "x"


def test_register_refuses_duplicates_unless_overwrite(clean_registry):
    js.register("Tagged-v0", _Tagged)
    with pytest.raises(ValueError, match="already registered"):
        js.register("Tagged-v0", lambda **kw: _Tagged(tag="other"))
    assert js.make("Tagged-v0").tag == "default"  # unchanged by the refused call
    with pytest.raises(ValueError, match="already registered"):
        js.register("CartPole-v1", _Tagged)
    js.register("Tagged-v0", lambda **kw: _Tagged(tag="other"), overwrite=True)
    assert js.make("Tagged-v0").tag == "other"


def test_register_refuses_gymnax_prefix(clean_registry):
    before = dict(clean_registry)
    with pytest.raises(ValueError, match="reserved"):
        js.register("gymnax:Mine-v0", _Tagged)
    with pytest.raises(ValueError, match="reserved"):
        js.register("gymnax:Mine-v0", _Tagged, overwrite=True)
    assert clean_registry == before


def test_registry_restored_after_registration_tests():
    # Runs after the tests above (file order): nothing they added is left behind.
    assert "Tagged-v0" not in js.envs.registered_ids()
    assert js.envs.registered_ids() == sorted(registry.REGISTRY)


def test_make_jax_env_refuses_host_envs_and_passes_jax_envs():
    from jaxsampler.envs.registry import make_jax_env

    assert make_jax_env("Spread-v0", n=2) == js.make("Spread-v0", n=2)
    with pytest.raises(TypeError, match="host-stepped env .*js.Sampler samples 'gym:<id>'"):
        make_jax_env("gym:CartPole-v1")
    with pytest.raises(ValueError, match="unknown env id"):
        make_jax_env("NoSuchEnv-v0")
