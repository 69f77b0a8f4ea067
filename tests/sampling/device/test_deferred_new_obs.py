"""``sample_batch()``'s ``new_obs`` column is deferred: built on first read from the batch's
own ``obs`` plus the few end rows (a segment's / an agent's run's real next observation).

* :class:`NextRows` against an eager NumPy reference (nested observations, per-slice
  builds, zero rows, a bad end row);
* every batch (single-agent, multi-agent with agents out of lockstep and several policies,
  dict observations) holds a ``Deferred`` ``new_obs`` that keeps only the batch's obs and
  the end rows, and that builds, on first read, the episodes' observations shifted by
  one: per episode (per agent episode) of a twin sampler's ``sample()``.
"""

from __future__ import annotations

import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.episodes.batch import Deferred, SampleBatch
from jaxsampler.episodes.lookback import tree_map
from jaxsampler.sampling.device.columns import NextRows
from tests.fakes import ChaosEnv, CountingPolicy, FakeEnv
from tests.sampling.device.test_dict_obs import prev_actions_samplers, twin_samplers

E, T, H = 3, 4, 2


def eager_next(obs: np.ndarray, rows: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The reference: row ``i`` is ``obs[i + 1]`` unless ``i`` is in ``rows`` (a loop)."""
    out = np.zeros_like(obs)
    patch = dict(zip(rows.tolist(), ends, strict=True))
    for i in range(len(obs)):
        out[i] = patch[i] if i in patch else obs[i + 1]
    return out


def assert_same_array(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)


def test_next_rows_builds_the_shifted_column_with_the_end_rows_leaf_by_leaf():
    rng = np.random.default_rng(0)
    n = 9
    obs = {"a": rng.normal(size=(n, 3)).astype(np.float32), "b": (np.arange(n, dtype=np.int8),)}
    rows = np.array([2, 3, 6, 8])
    ends = {
        "a": rng.normal(size=(4, 3)).astype(np.float32),
        "b": (np.arange(4, dtype=np.int8) - 50,),
    }
    nr = NextRows(obs, rows, ends)
    got = nr()
    assert_same_array(got["a"], eager_next(obs["a"], rows, ends["a"]))
    assert_same_array(got["b"][0], eager_next(obs["b"][0], rows, ends["b"][0]))
    # a slice that ends at an end row builds exactly those rows of the whole column
    for lo, hi in ((0, 3), (3, 4), (4, 9), (7, 7)):
        part = nr.slice(lo, hi)()
        assert_same_array(part["a"], got["a"][lo:hi])
        assert_same_array(part["b"][0], got["b"][0][lo:hi])
    # the building does not write to obs
    assert obs["b"][0].tolist() == list(range(n))


def test_next_rows_of_zero_rows_and_a_missing_last_end_row():
    empty = NextRows(np.zeros((0, 2), np.float32), np.zeros(0, np.int64), np.zeros((0, 2)))
    assert_same_array(empty(), np.zeros((0, 2), np.float32))
    obs = np.arange(4.0)
    with pytest.raises(ValueError, match="last of 4 rows"):
        NextRows(obs, np.array([1]), np.array([9.0]))
    with pytest.raises(ValueError, match="last of 2 rows"):
        NextRows(obs, np.array([1, 3]), np.array([7.0, 9.0])).slice(1, 3)
    with pytest.raises(ValueError, match="2 end rows but 1"):
        NextRows(obs, np.array([1, 3]), np.array([9.0]))


def deferred_new_obs(b: SampleBatch) -> NextRows:
    """The unbuilt ``new_obs`` of a batch (fails if it was built)."""
    raw = dict.__getitem__(b, "new_obs")
    assert type(raw) is Deferred, type(raw)
    assert isinstance(raw.build, NextRows)
    return raw.build


def assert_holds_only_the_batch_obs(nr: NextRows, b: SampleBatch, max_ends: int) -> None:
    """The deferred column keeps the batch's obs (views of it) and at most ``max_ends``
    end rows, not the call's buffers."""
    obs = dict.__getitem__(b, "obs")
    for mine, theirs in zip(_leaves(nr.obs), _leaves(obs), strict=True):
        assert mine.shape == theirs.shape and np.shares_memory(mine, theirs)
    assert len(nr.rows) <= max_ends
    for end in _leaves(nr.ends):  # (per policy: a slice of the call's few end rows)
        root = end
        while isinstance(root.base, np.ndarray):
            root = root.base
        assert root.nbytes <= max_ends * end[:1].nbytes


def _leaves(x):
    out: list = []
    tree_map(out.append, x)
    return out


def shifted(obs_list: list) -> object:
    """The episodes' observations shifted by one, concatenated (leaf by leaf)."""
    return tree_map(lambda *o: np.concatenate([x[1:] for x in o]), *obs_list)


def assert_tree_equal(got, want) -> None:
    gl, wl = _leaves(got), _leaves(want)
    assert len(gl) == len(wl) > 0
    for g, w in zip(gl, wl, strict=True):
        assert_same_array(g, np.asarray(w))


def twins(make):
    return make(), make()


def sa_sampler() -> js.Sampler:
    env = FakeEnv()
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    return js.Sampler(env, pol, num_envs=E, rollout_length=T, seed=5, episode_lookback_horizon=H)


def test_single_agent_new_obs_is_deferred_and_equals_the_episodes_shifted():
    s_eps, s_bat = twins(sa_sampler)
    ended = 0
    for _ in range(4):
        eps = s_eps.sample(())
        b = s_bat.sample_batch(())["default_policy"]
        nr = deferred_new_obs(b)
        assert_holds_only_the_batch_obs(nr, b, max_ends=len(eps))
        obs_before = b["obs"].copy()
        assert_tree_equal(b["new_obs"], shifted([ep.get_observations() for ep in eps]))
        assert type(dict.__getitem__(b, "new_obs")) is np.ndarray  # built once, stored
        np.testing.assert_array_equal(b["obs"], obs_before)
        ended += sum(ep.is_done for ep in eps)
    assert ended >= 2  # end rows of finished episodes (real final observations) covered


def test_single_agent_dict_obs_new_obs_is_deferred_and_equals_the_episodes_shifted():
    s_bat, _ = prev_actions_samplers()
    s_eps, _ = prev_actions_samplers()
    for _ in range(3):
        b = s_bat.sample_batch(())["default_policy"]
        eps = s_eps.sample(())
        assert_holds_only_the_batch_obs(deferred_new_obs(b), b, max_ends=len(eps))
        want = shifted([ep.get_observations() for ep in eps])
        assert set(want) == {"observations", "prev_actions", "prev_rewards"}
        assert_tree_equal(b["new_obs"], want)


def agent_rows(episodes, agents_of_policy) -> object:
    """A policy's ``new_obs`` rows from ``sample()``'s episodes: episode by episode, then
    agent by agent (sorted ids), each agent episode's observations shifted by one."""
    obs = [
        sa.get_observations()
        for ep in episodes
        for aid, sa in sorted(ep.agent_episodes.items())
        if aid in agents_of_policy and len(sa)
    ]
    return shifted(obs) if obs else None


def chaos_sampler() -> js.Sampler:
    env = ChaosEnv()
    policy = js.policies.MultiAgentPolicy(
        env,
        {
            "p0": CountingPolicy(env.observation_space, env.action_space),
            "p1": CountingPolicy(env.observation_space, env.action_space),
        },
        lambda aid: "p0" if aid == "agent_0" else "p1",
    )
    return js.Sampler(env, policy, num_envs=E, rollout_length=7, seed=4, episode_lookback_horizon=1)


def test_multi_agent_new_obs_is_deferred_per_policy_and_equals_the_agent_episodes_shifted():
    s_eps, s_bat = twins(chaos_sampler)
    params = {"p0": (), "p1": ()}
    agents = {"p0": {"agent_0"}, "p1": {"agent_1", "agent_2"}}
    rows = 0
    for _ in range(4):
        eps = s_eps.sample(params)
        batch = s_bat.sample_batch(params)
        n_runs = sum(len(ep.agent_episodes) for ep in eps)
        unbuilt = dict(batch.policy_batches)
        for pid in ("p1", "p0"):  # each policy's column builds on its own
            b = unbuilt.pop(pid)
            nr = deferred_new_obs(b)
            assert_holds_only_the_batch_obs(nr, b, max_ends=n_runs)
            assert_tree_equal(b["new_obs"], agent_rows(eps, agents[pid]))
            for other in unbuilt.values():
                deferred_new_obs(other)
            rows += len(b)
    assert rows > 0


def test_multi_agent_dict_obs_new_obs_is_deferred_and_equals_the_agent_episodes_shifted():
    s_bat, _, params = twin_samplers("random")
    s_eps, _, _ = twin_samplers("random")
    for _ in range(3):
        batch = s_bat.sample_batch(params)
        eps = s_eps.sample(params)
        (b,) = batch.policy_batches.values()
        n_runs = sum(len(ep.agent_episodes) for ep in eps)
        assert_holds_only_the_batch_obs(deferred_new_obs(b), b, max_ends=n_runs)
        assert_tree_equal(b["new_obs"], agent_rows(eps, {"agent_0", "agent_1"}))


@pytest.mark.parametrize("make", [sa_sampler, chaos_sampler], ids=["single", "multi"])
def test_obs_is_read_only_until_new_obs_is_built_so_an_in_place_write_cannot_leak(make):
    # new_obs is built from obs: a write into obs before that read would show in new_obs
    # (RLlib's new_obs is its own array), so it raises; once built, obs is writable again
    # and writing to it leaves new_obs alone.
    s_bat, s_ref = twins(make)
    params = {"p0": (), "p1": ()} if make is chaos_sampler else ()
    for _ in range(2):
        batch, ref = s_bat.sample_batch(params), s_ref.sample_batch(params)
        for pid, b in batch.policy_batches.items():
            with pytest.raises(ValueError, match="read-only"):
                b["obs"][:] = 0
            want = ref[pid]["new_obs"].copy()
            np.testing.assert_array_equal(b["new_obs"], want)
            b["obs"][:] = -7  # writable now; new_obs keeps its values
            np.testing.assert_array_equal(b["new_obs"], want)


def test_multi_agent_infos_of_an_env_without_infos_are_deferred_separate_dicts():
    # ChaosEnv has no infos: each policy's infos column is built on first read, one
    # separate empty dict per row (as RLlib's and the episodes' infos: a write to one row's
    # dict changes no other row), the same as the agent episodes' infos.
    s_eps, s_bat = twins(chaos_sampler)
    params = {"p0": (), "p1": ()}
    agents = {"p0": {"agent_0"}, "p1": {"agent_1", "agent_2"}}
    for _ in range(3):
        eps = s_eps.sample(params)
        batch = s_bat.sample_batch(params)
        for pid, b in batch.policy_batches.items():
            assert type(dict.__getitem__(b, "infos")) is Deferred
            infos = b["infos"]
            assert infos == [{}] * len(b) and len(b) > 0
            assert len({id(d) for d in infos}) == len(infos)
            infos[0]["x"] = 1
            assert all(d == {} for d in infos[1:])
            want = [
                i
                for ep in eps
                for aid, sa in ep.agent_episodes.items()
                if aid in agents[pid]
                for i in sa.get_infos()[:-1]
            ]
            assert len(want) == len(infos) and all(d == {} for d in want)
