"""``Sampler(..., devices=/mesh=)``: the env axis split over devices, in-process (the test
process has 2 CPU devices). The reference is the same sampler on one device (no mesh): for
the same seed and calls, episodes and batches must match: ids, lengths, ``t``, flags,
actions and integer infos exactly; float observations, rewards and extras up to rounding
(measured: at most 1.8e-7 absolute on CartPole, 1.2e-6 on normalized observations, 1.2e-7
on TicTacToe, 0 on Spread; asserted with ``atol=1e-5``).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.envs.tictactoe import TicTacToe
from jaxsampler.rollout import placement
from jaxsampler.transforms import NormalizeObservation

pytestmark = pytest.mark.skipif(jax.device_count() < 2, reason="needs 2 XLA CPU devices")

ATOL = 1e-5


def same_tree(a: Any, b: Any, where: str) -> None:
    """Non-float leaves equal exactly; float leaves up to rounding."""
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert jax.tree.structure(a) == jax.tree.structure(b), where
    for x, y in zip(la, lb, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert x.shape == y.shape and x.dtype == y.dtype, where
        if np.issubdtype(x.dtype, np.floating):
            np.testing.assert_allclose(x, y, rtol=0, atol=ATOL, err_msg=where)
        else:
            np.testing.assert_array_equal(x, y, err_msg=where)


def sa_record(ep: js.SingleAgentEpisode) -> dict[str, Any]:
    return {
        "id": ep.id_,
        "t": (ep.t_started, ep.t, len(ep), ep.observations.lookback),
        "flags": (ep.is_terminated, ep.is_truncated),
        "obs": ep.observations.data,
        "actions": ep.actions.data,
        "rewards": ep.rewards.data,
        "infos": ep.infos.data,
        "extras": {k: v.data for k, v in ep.extra_model_outputs.items()},
    }


def record(ep: Any) -> dict[str, Any]:
    if isinstance(ep, js.SingleAgentEpisode):
        return sa_record(ep)
    return {
        "id": ep.id_,
        "t": (ep.env_t_started, ep.env_t),
        "flags": (ep.is_terminated, ep.is_truncated),
        "agents": {a: sa_record(sa) for a, sa in sorted(ep.agent_episodes.items())},
    }


def same_episodes(got: list[Any], want: list[Any], where: str) -> None:
    assert len(got) == len(want), where
    assert want, f"{where}: nothing sampled"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        rg, rw = record(g), record(w)
        assert rg["id"] == rw["id"] and rg["t"] == rw["t"] and rg["flags"] == rw["flags"]
        same_tree(rg, rw, f"{where}, episode {i}")


def same_batch(got: js.MultiAgentBatch, want: js.MultiAgentBatch, where: str) -> None:
    assert got.count == want.count and set(got.policy_batches) == set(want.policy_batches)
    for pid, wb in want.policy_batches.items():
        gb = got.policy_batches[pid]
        assert set(gb) == set(wb), where
        for k in wb:
            if k == "eps_id":
                assert list(gb[k]) == list(wb[k]), f"{where}: {k}"
            else:
                same_tree(gb[k], wb[k], f"{where}: {pid}/{k}")


def cartpole_mlp() -> tuple[Any, Any, Any]:
    env = js.make("CartPole-v1")
    pol = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    return env, pol, pol.init(jax.random.PRNGKey(1))


# A script of calls: (method, kwargs); both samplers make the same ones.
CALLS = [
    ("sample", {}),
    ("sample_batch", {}),
    ("sample", {"num_timesteps": 70}),
    ("sample_batch", {"num_episodes": 3}),
    ("sample", {}),
    ("sample", {"num_episodes": 2}),
    ("sample_batch", {"num_timesteps": 50}),
]


def run_calls(sampler: js.Sampler, params: Any, calls=CALLS) -> list[tuple[Any, dict]]:
    out = []
    for method, kw in calls:
        result = getattr(sampler, method)(params, **kw)
        out.append((result, sampler.metrics.as_dict()))
    return out


def compare_runs(make, params, calls=CALLS) -> None:
    """``make(devices=...)`` samplers on 1 device (no mesh), a 1-device mesh and a
    2-device mesh make ``calls``; everything must match the no-mesh run."""
    want = run_calls(make(), params, calls)
    for devices in (1, 2):
        got = run_calls(make(devices=devices), params, calls)
        for i, ((method, kw), (g, gm), (w, wm)) in enumerate(zip(calls, got, want, strict=True)):
            where = f"devices={devices}, call {i} {method}({kw})"
            if method == "sample":
                same_episodes(g, w, where)
            else:
                same_batch(g, w, where)
            same_tree(gm, wm, f"{where}: metrics")


def test_cartpole_episodes_and_batches_equal_one_device():
    env, pol, params = cartpole_mlp()
    compare_runs(lambda **kw: js.Sampler(env, pol, 4, 16, seed=3, **kw), params)


def test_transforms_topup_and_lookback_equal_one_device():
    env, pol, params = cartpole_mlp()

    def make(**kw):
        return js.Sampler(
            env,
            pol,
            4,
            12,
            seed=5,
            transforms=(NormalizeObservation(),),
            topup_length=5,
            episode_lookback_horizon=3,
            **kw,
        )

    compare_runs(make, params)
    # The normalizer's statistics are global: equal to one device's up to rounding.
    one, two = make(), make(devices=2)
    for s in (one, two):
        s.sample(params)
        s.sample(params)
    same_tree(
        jax.device_get(two.transform_state), jax.device_get(one.transform_state), "statistics"
    )


def test_recurrent_policy_equal_one_device():
    env = js.make("CartPole-v1")
    pol = js.policies.RecurrentPolicy(env.observation_space, env.action_space, hidden_size=4)
    params = pol.init(jax.random.PRNGKey(2))
    compare_runs(lambda **kw: js.Sampler(env, pol, 4, 10, seed=1, **kw), params, CALLS[:4])


def test_multi_agent_turns_equal_one_device():
    env = TicTacToe()
    pol = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    params = pol.init(jax.random.PRNGKey(3))
    calls = [("sample", {}), ("sample_batch", {}), ("sample", {"num_episodes": 3})]
    calls += [("sample_batch", {"num_timesteps": 30}), ("sample", {})]
    compare_runs(lambda **kw: js.Sampler(env, pol, 4, 6, seed=2, **kw), params, calls)


def test_spread_rllib_flags_equal_one_device():
    env = js.envs.Spread(n=2)
    pol = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    params = pol.init(jax.random.PRNGKey(4))
    calls = [("sample", {}), ("sample_batch", {}), ("sample", {"num_episodes": 2})]
    compare_runs(
        lambda **kw: js.Sampler(env, pol, 2, 20, seed=0, rllib_compatible=True, **kw),
        params,
        calls,
    )


def test_state_lives_on_the_mesh_and_mesh_equals_devices():
    env, pol, params = cartpole_mlp()
    mesh = placement.env_mesh(2)
    s = js.Sampler(env, pol, 4, 8, seed=0, mesh=mesh)
    assert s.mesh is mesh and s.local_envs == slice(0, 4)
    b = s.sample_batch(params)
    obs_sharding = s._state.obs.sharding
    assert obs_sharding.num_devices == 2 and not obs_sharding.is_fully_replicated
    d = js.Sampler(env, pol, 4, 8, seed=0, devices=jax.devices()[:2])
    same_batch(d.sample_batch(params), b, "mesh= vs devices=[...]")
    plain = js.Sampler(env, pol, 4, 8, seed=0)
    assert plain.mesh is None and plain.local_envs == slice(0, 4)


def test_global_metrics_of_one_process_are_the_metrics():
    env, pol, params = cartpole_mlp()
    s = js.Sampler(env, pol, 4, 30, seed=0, devices=2)
    s.sample(params)
    assert s.global_metrics() == s.metrics


def test_metrics_combine_weights_means_by_episodes():
    a, b, c = (
        js.sampling.SamplerMetrics(),
        js.sampling.SamplerMetrics(),
        js.sampling.SamplerMetrics(),
    )
    a.set_episode_stats(np.array([1.0, 2.0, 3.0]), np.array([10, 20, 30]))
    b.set_episode_stats(np.array([7.0]), np.array([5]))
    a.num_env_steps_sampled, b.num_env_steps_sampled, c.num_env_steps_sampled = 60, 9, 4
    a.num_episodes_ongoing, c.num_episodes_ongoing = 2, 1
    for m in (a, b, c):
        m.num_rollout_calls = 2
    got = js.sampling.SamplerMetrics.combine([a, b, c])
    union = js.sampling.SamplerMetrics(num_env_steps_sampled=73, num_episodes_ongoing=3)
    union.set_episode_stats(np.array([1.0, 2.0, 3.0, 7.0]), np.array([10, 20, 30, 5]))
    union.num_rollout_calls = 2
    assert got == union
    with pytest.raises(ValueError, match="at least one"):
        js.sampling.SamplerMetrics.combine([])


def test_bad_devices_and_meshes():
    env, pol, _ = cartpole_mlp()
    with pytest.raises(ValueError, match=r"num_envs=5 .* 2 devices.*nearest valid: 4 or 6"):
        js.Sampler(env, pol, 5, 8, devices=2)
    with pytest.raises(ValueError, match="not both"):
        js.Sampler(env, pol, 4, 8, devices=2, mesh=placement.env_mesh(2))
    with pytest.raises(TypeError, match="mesh= takes a jax.sharding.Mesh.*use devices="):
        js.Sampler(env, pol, 4, 8, mesh=2)
    with pytest.raises(TypeError, match="pass a Mesh as mesh="):
        js.Sampler(env, pol, 4, 8, devices=placement.env_mesh(2))
    with pytest.raises(TypeError, match="device count"):
        js.Sampler(env, pol, 4, 8, devices="gpu")
    with pytest.raises(ValueError, match="asked for 3 devices, 2 available"):
        js.Sampler(env, pol, 6, 8, devices=3)
    bad = jax.sharding.Mesh(np.asarray(jax.devices()[:2]), ("batch",))
    with pytest.raises(ValueError, match="'env' axis"):
        js.Sampler(env, pol, 4, 8, mesh=bad)


def test_host_envs_refuse_devices():
    gym = pytest.importorskip("gymnasium", reason="host envs need gymnasium")
    env = js.make("CartPole-v1")
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    with pytest.raises(ValueError, match="pure-JAX env"):
        js.Sampler([gym.make("CartPole-v1")], pol, devices=2)
    with pytest.raises(ValueError, match="pure-JAX env"):
        js.Sampler("gym:CartPole-v1", pol, 2, mesh=placement.env_mesh(2))


def test_episode_ids_with_a_stream_offset_are_the_global_envs_ids():
    from jaxsampler.episodes.ids import EpisodeIds

    whole, part = EpisodeIds(9), EpisodeIds(9, stream_offset=2)
    streams, counts = np.array([0, 1, 1]), np.array([0, 3, 2**33])  # the last: wide layout
    want = whole.many(streams + 2, counts)
    assert part.many(streams, counts).tolist() == want.tolist()
    assert [part(int(s), int(c)) for s, c in zip(streams, counts, strict=True)] == want.tolist()
    assert len(set(want.tolist()) | set(whole.many(streams, counts).tolist())) == 6
    with pytest.raises(ValueError, match=">= 0"):
        EpisodeIds(0, stream_offset=-1)
    with pytest.raises(TypeError, match="an int"):
        EpisodeIds(0, stream_offset=1.5)
