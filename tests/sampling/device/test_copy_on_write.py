"""Episodes from the device sampler are views of one call's shared columns: mutating one
(set_*, add_env_step, cut() then mutating the successor) changes nothing else."""

from __future__ import annotations

import copy

import jax
import numpy as np

import jaxsampler as js
from tests.fakes import FakeEnv

E, T, H = 3, 3, 2


def sampler(seed: int = 3, policy: str = "random") -> js.Sampler:
    env = FakeEnv()
    if policy == "random":
        pol = js.RandomPolicy(env.observation_space, env.action_space)
    else:
        pol = js.MLPPolicy(env.observation_space, env.action_space, (4,))
    return js.Sampler(env, pol, num_envs=E, rollout_length=T, seed=seed, episode_lookback_horizon=H)


def snapshot(ep: js.SingleAgentEpisode) -> dict:
    """Everything an episode holds, lookback included, as deep copies."""
    return copy.deepcopy(
        {
            "id": ep.id_,
            "t": (ep.t_started, ep.t, ep.is_terminated, ep.is_truncated),
            "obs": np.asarray(ep.observations.data),
            "lookback": ep.observations.lookback,
            "actions": np.asarray(ep.actions.data),
            "rewards": np.asarray(ep.rewards.data),
            "infos": ep.infos.data,
            "extras": {k: np.asarray(v.data) for k, v in ep.extra_model_outputs.items()},
        }
    )


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            assert_same(a[k], b[k])
        elif isinstance(a[k], np.ndarray):
            np.testing.assert_array_equal(a[k], b[k])
        else:
            assert a[k] == b[k], k


def assert_batches_equal(x: js.MultiAgentBatch, y: js.MultiAgentBatch) -> None:
    bx, by = x["default_policy"], y["default_policy"]
    assert sorted(bx) == sorted(by)
    for k in bx:
        if k == "infos":
            assert bx[k] == by[k]
        else:
            np.testing.assert_array_equal(bx[k], by[k])


def params_of(s: js.Sampler) -> object:
    """The policy's params (``()`` for the random policy), the same for twin samplers."""
    return s.policy.init(jax.random.PRNGKey(0))


def ongoing_with_lookback(mutated: js.Sampler, twin: js.Sampler) -> tuple[list, object]:
    """Calls both samplers alike until ``mutated``'s call has an ongoing continuation
    chunk with lookback; returns that call's episodes and the chunk."""
    params = params_of(mutated)
    for _ in range(8):
        eps = mutated.sample(params)
        twin.sample(params)
        found = [e for e in eps if not e.is_done and e.observations.lookback > 0 and len(e) > 1]
        if found:
            return eps, found[0]
    raise AssertionError("no ongoing chunk with lookback in 8 calls")


def test_set_on_a_view_episode_changes_no_other_episode_array_or_later_call():
    params = ()
    mutated, twin = sampler(), sampler()
    eps, ep = ongoing_with_lookback(mutated, twin)
    chunks = copy.deepcopy(mutated.last_chunks)
    others = {id(e): snapshot(e) for e in eps if e is not ep}
    before = snapshot(ep)
    early_obs, early_rewards = ep.get_observations(), ep.get_rewards()
    early_actions = ep.get_actions()
    early = copy.deepcopy((early_obs, early_rewards, early_actions))

    ep.set_observations(new_data=np.full((2,), -7.0, np.float32), at_indices=0)
    ep.set_observations(
        new_data=np.full((2,), -8.0, np.float32), at_indices=-1, neg_index_as_lookback=True
    )
    ep.set_actions(new_data=np.array([2] * len(ep)), at_indices=slice(0, None))
    ep.set_rewards(new_data=np.float32(99.0), at_indices=-1)

    # the episode itself changed (lookback included) ...
    np.testing.assert_array_equal(ep.get_observations(0), [-7.0, -7.0])
    np.testing.assert_array_equal(ep.get_observations(-1, neg_index_as_lookback=True), [-8, -8])
    np.testing.assert_array_equal(ep.get_actions(), [2] * len(ep))
    assert ep.get_rewards(-1) == 99.0
    assert ep.observations.lookback == before["lookback"]
    # ... nothing else did: the other episodes, the arrays read before, the host chunks
    for e in eps:
        if e is not ep:
            assert_same(snapshot(e), others[id(e)])
    np.testing.assert_array_equal(early_obs, early[0])
    np.testing.assert_array_equal(early_rewards, early[1])
    np.testing.assert_array_equal(early_actions, early[2])
    for a, b in zip(jax.tree.leaves(mutated.last_chunks), jax.tree.leaves(chunks), strict=True):
        np.testing.assert_array_equal(a, b)
    # the next call (its continuation chunks' lookback comes from this call) is the twin's
    for e, w in zip(mutated.sample(params), twin.sample(params), strict=True):
        assert_same(snapshot(e), snapshot(w))
    assert_batches_equal(mutated.sample_batch(params), twin.sample_batch(params))


def test_add_env_step_and_cut_on_a_view_episode_leave_the_rest_unchanged():
    mutated, twin = sampler(seed=4, policy="mlp"), sampler(seed=4, policy="mlp")
    params = params_of(mutated)
    eps, ep = ongoing_with_lookback(mutated, twin)
    before = snapshot(ep)
    others = {id(e): snapshot(e) for e in eps if e is not ep}
    assert ep.extra_model_outputs, "the MLP policy's extras are columns too"

    successor = ep.cut(len_lookback_buffer=2)
    # writing the successor's lookback (views of ep's last steps) leaves ep unchanged
    successor.set_observations(
        new_data=np.full((2,), -5.0, np.float32), at_indices=-1, neg_index_as_lookback=True
    )
    successor.set_rewards(new_data=np.float32(-1.0), at_indices=-1, neg_index_as_lookback=True)
    last = {k: np.zeros_like(v[-1]) for k, v in before["extras"].items()}
    successor.add_env_step(np.zeros(2, np.float32), 1, 1.0, extra_model_outputs=last)
    assert_same(snapshot(ep), before)

    ep.add_env_step(
        np.full(2, 3.0, np.float32),
        0,
        0.5,
        extra_model_outputs={k: np.asarray(v[-1]) for k, v in before["extras"].items()},
    )
    assert len(ep) == before["t"][1] - before["t"][0] + 1
    ep.set_observations(new_data=np.full((2,), -9.0, np.float32), at_indices=0)
    for e in eps:
        if e is not ep:
            assert_same(snapshot(e), others[id(e)])
    np.testing.assert_array_equal(successor.get_observations(), [before["obs"][-1], [0, 0]])
    np.testing.assert_array_equal(
        successor.get_observations(-1, neg_index_as_lookback=True), [-5.0, -5.0]
    )
    for e, w in zip(mutated.sample(params), twin.sample(params), strict=True):
        assert_same(snapshot(e), snapshot(w))


def test_default_getters_slice_without_building_and_match_the_buffers():
    """The fast default getters give what the built buffers' get() gives (same values,
    dtypes and shapes) and build no column, infos included."""
    fast, slow = sampler(seed=6, policy="mlp"), sampler(seed=6, policy="mlp")
    params = params_of(fast)
    for _ in range(2):
        fast_eps, slow_eps = fast.sample(params), slow.sample(params)
        for f, s in zip(fast_eps, slow_eps, strict=True):
            got = (
                f.get_observations(),
                f.get_actions(),
                f.get_rewards(),
                f.get_extra_model_outputs("vf_preds"),
            )
            want = (
                s.observations.get(),
                s.actions.get(),
                s.rewards.get(),
                s.extra_model_outputs["vf_preds"].get(),
            )
            for g, w in zip(got, want, strict=True):
                assert g.dtype == w.dtype and g.shape == w.shape
                np.testing.assert_array_equal(g, w)
            assert f.is_numpy and f.get_return() == s.get_return()
            # nothing was built for the fast reads (infos especially)
            assert f._observations is None and f._infos is None and f._rewards is None
            assert s.get_infos() == f.get_infos()
