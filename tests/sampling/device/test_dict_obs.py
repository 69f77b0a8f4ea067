"""Device samplers on envs (and transforms) whose observations are dicts of arrays.

The reference for every test is an independent path: the same env with flat observations
sampled by the same (wrapped) policy, whose episodes go through the well-tested
single-array conversion; or the episode's own actions (``PrevActionsRewards``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.policies.base import Policy
from jaxsampler.rollout import pipeline_of
from jaxsampler.sampling.device.single import EpisodeColumns
from jaxsampler.transforms import PrevActionsRewards

E, T, H = 3, 4, 2  # tiny: TicTacToe and CartPole episodes span several calls


@dataclasses.dataclass(frozen=True)
class OnFlatTicTacToe(Policy):
    """A Dict-space TicTacToe policy run on the flat env: it builds the masked
    observation (the mask is the board's empty-cell plane), so both envs see the same
    actions for the same keys."""

    inner: Any
    observation_space: Any
    action_space: Any

    def init(self, key: jax.Array) -> Any:
        return self.inner.init(key)

    def initial_state(self, batch_shape: tuple[int, ...]) -> Any:
        return self.inner.initial_state(batch_shape)

    def __call__(self, params: Any, obs: Any, key: jax.Array, policy_state: Any) -> Any:
        return self.inner(params, self.masked(obs), key, policy_state)

    @staticmethod
    def masked(obs: Any) -> dict[str, Any]:
        return {"observations": obs, "action_mask": obs[..., 18:] == 1}

    # TicTacToe is turn-based: the rollout runs a policy that can on the mover's row only
    # (Env.max_acting), so the wrapper takes the inner policy's path there too.
    @property
    def acts_on_rows(self) -> bool:
        return self.inner.acts_on_rows

    def act_on_rows(
        self, params: Any, obs: Any, key: jax.Array, policy_state: Any, rows: Any
    ) -> Any:
        return self.inner.act_on_rows(params, self.masked(obs), key, policy_state, rows)


def tictactoe_policy(kind: str, space: Any, action_space: Any) -> Policy:
    if kind == "mlp":
        return js.MLPPolicy(space, action_space, hidden_sizes=(8,))
    return js.RandomPolicy(space, action_space)


def twin_samplers(kind: str) -> tuple[Any, Any, Any]:
    masked = js.make("TicTacToe-v0", masked_obs=True)
    flat = js.make("TicTacToe-v0")
    inner = tictactoe_policy(kind, masked.observation_space, masked.action_space)
    on_flat = OnFlatTicTacToe(inner, flat.observation_space, flat.action_space)
    params = inner.init(jax.random.PRNGKey(0))
    kw = dict(seed=7, episode_lookback_horizon=H)
    s_dict = js.Sampler(masked, inner, E, T, **kw)
    s_flat = js.Sampler(flat, on_flat, E, T, **kw)
    return s_dict, s_flat, params


def assert_dict_obs_match_flat(got: Any, flat: np.ndarray) -> None:
    """A masked TicTacToe observation struct against the flat env's observations."""
    assert set(got) == {"observations", "action_mask"}
    np.testing.assert_array_equal(got["observations"], flat)
    assert got["action_mask"].dtype == np.bool_
    np.testing.assert_array_equal(got["action_mask"], flat[..., 18:] == 1)


def assert_moves_fit_the_boards(obs: Any, actions: np.ndarray, new_obs: Any) -> None:
    """An env-side check that needs no sampler: each move was legal on the board it was
    made on (its mask), and its cell is taken on the mover's next board."""
    rows = np.arange(len(actions))
    assert obs["action_mask"][rows, actions].all()
    assert obs["observations"][rows, 18 + actions].all()  # the empty-cell plane
    assert not new_obs["observations"][rows, 18 + actions].any()
    assert not new_obs["action_mask"][rows, actions].any()


@pytest.mark.parametrize("kind", ["mlp", "random"])
def test_multi_agent_dict_obs_episodes_match_the_flat_env(kind):
    s_dict, s_flat, params = twin_samplers(kind)
    continued = with_lookback = 0
    for _ in range(3):  # fresh chunks, then continuations with lookback across calls
        got, ref = s_dict.sample(params), s_flat.sample(params)
        assert [ep.id_ for ep in got] == [ep.id_ for ep in ref]
        for ep, rf in zip(got, ref, strict=True):
            assert ep.env_t_started == rf.env_t_started and ep.env_t == rf.env_t
            assert ep.is_done == rf.is_done
            continued += ep.env_t_started > 0
            assert set(ep.agent_episodes) == set(rf.agent_episodes)
            for aid, sa in ep.agent_episodes.items():
                ra = rf.agent_episodes[aid]
                assert sa.observations.lookback == ra.observations.lookback
                with_lookback += sa.observations.lookback > 0
                # the whole buffer, lookback included
                assert_dict_obs_match_flat(sa.observations.data, np.asarray(ra.observations.data))
                assert_dict_obs_match_flat(sa.get_observations(), np.asarray(ra.get_observations()))
                np.testing.assert_array_equal(sa.get_actions(), ra.get_actions())
                np.testing.assert_array_equal(sa.get_rewards(), ra.get_rewards())
                assert sa.t_started == ra.t_started and len(sa) == len(ra)
                np.testing.assert_array_equal(
                    np.asarray(ep.env_t_to_agent_t[aid].data),
                    np.asarray(rf.env_t_to_agent_t[aid].data),
                )
                obs = sa.get_observations()
                assert_moves_fit_the_boards(
                    {k: v[:-1] for k, v in obs.items()},
                    np.asarray(sa.get_actions()),
                    {k: v[1:] for k, v in obs.items()},
                )
    assert continued and with_lookback, "the test must cover continuation chunks"


def test_multi_agent_dict_obs_batches_match_the_flat_env():
    s_dict, s_flat, params = twin_samplers("mlp")
    for _ in range(3):
        got, ref = s_dict.sample_batch(params), s_flat.sample_batch(params)
        assert set(got.policy_batches) == set(ref.policy_batches)
        for pid, b in got.policy_batches.items():
            r = ref[pid]
            assert len(b) == len(r) > 0
            assert_dict_obs_match_flat(b["obs"], r["obs"])
            assert_dict_obs_match_flat(b["new_obs"], r["new_obs"])
            for key in ("actions", "rewards", "terminateds", "truncateds", "t", "eps_id"):
                np.testing.assert_array_equal(b[key], r[key])
            assert_moves_fit_the_boards(b["obs"], b["actions"], b["new_obs"])


# --------------------------------------------------------------------------- single agent


def prev_actions_samplers(**kw: Any) -> tuple[Any, Any]:
    env = js.make("CartPole-v1")
    tf = (PrevActionsRewards(2),)
    pipe = pipeline_of(env, tf)
    s_tf = js.sampling.DeviceSampler(
        env,
        js.RandomPolicy(pipe.observation_space, pipe.action_space),
        E,
        T * 4,
        seed=3,
        episode_lookback_horizon=H,
        transforms=tf,
        **kw,
    )
    # The same draws without the transform (RandomPolicy's actions ignore the observation).
    s_raw = js.sampling.DeviceSampler(
        env,
        js.RandomPolicy(env.observation_space, env.action_space),
        E,
        T * 4,
        seed=3,
        episode_lookback_horizon=H,
    )
    return s_tf, s_raw


def expected_history(actions: np.ndarray, rewards: np.ndarray, n: int) -> tuple[Any, Any]:
    """``PrevActionsRewards(n)`` of every observation of a whole episode, from its own
    actions and rewards: observation ``t`` holds those of steps ``t - n .. t - 1``."""
    steps = len(actions)
    prev_a = np.zeros((steps + 1, n), np.int64)
    prev_r = np.zeros((steps + 1, n), np.float32)
    for t in range(steps + 1):
        for k in range(n):
            src = t - n + k
            if src >= 0:
                prev_a[t, k], prev_r[t, k] = actions[src], rewards[src]
    return prev_a, prev_r


def test_prev_actions_rewards_episodes_across_calls():
    s_tf, s_raw = prev_actions_samplers()
    whole: dict[str, dict[str, list]] = {}  # id -> the chunks' data, joined
    continued = 0
    for _ in range(4):
        got, ref = s_tf.sample(()), s_raw.sample(())
        assert [ep.id_ for ep in got] == [ep.id_ for ep in ref]
        for ep, rf in zip(got, ref, strict=True):
            obs = ep.get_observations()
            assert set(obs) == {"observations", "prev_actions", "prev_rewards"}
            # the raw observations, lookback included
            np.testing.assert_array_equal(
                ep.observations.data["observations"], rf.observations.data
            )
            np.testing.assert_array_equal(ep.get_actions(), rf.get_actions())
            assert ep.observations.lookback == rf.observations.lookback
            w = whole.setdefault(ep.id_, {"obs": [], "actions": [], "rewards": []})
            if ep.t_started > 0:
                continued += 1
                assert w["actions"], "a continuation follows its episode's earlier chunk"
                # its lookback is the end of the data before it (the head across calls)
                lb = ep.observations.lookback
                assert lb > 0
                seen = {k: np.concatenate([o[k] for o in w["obs"]]) for k in obs}
                for k in obs:
                    np.testing.assert_array_equal(
                        ep.observations.data[k][: lb + 1], seen[k][len(seen[k]) - lb - 1 :]
                    )
                obs = {k: v[1:] for k, v in obs.items()}  # (its first is the previous last)
            w["obs"].append(obs)
            w["actions"].append(np.asarray(ep.get_actions()))
            w["rewards"].append(np.asarray(ep.get_rewards()))
    assert continued
    for w in whole.values():
        obs = {k: np.concatenate([o[k] for o in w["obs"]]) for k in w["obs"][0]}
        actions, rewards = np.concatenate(w["actions"]), np.concatenate(w["rewards"])
        prev_a, prev_r = expected_history(actions, rewards, 2)
        np.testing.assert_array_equal(obs["prev_actions"], prev_a)
        np.testing.assert_array_equal(obs["prev_rewards"], prev_r)


def test_prev_actions_rewards_batch_rows_equal_the_episodes():
    s_batch, _ = prev_actions_samplers()
    s_eps, _ = prev_actions_samplers()
    for _ in range(3):  # the same rollouts: rows in the episodes' order
        batch = s_batch.sample_batch(())["default_policy"]
        eps = s_eps.sample(())
        for col, part in (("obs", slice(None, -1)), ("new_obs", slice(1, None))):
            assert isinstance(batch[col], dict)
            for k in ("observations", "prev_actions", "prev_rewards"):
                ref = np.concatenate([ep.get_observations()[k][part] for ep in eps])
                np.testing.assert_array_equal(batch[col][k], ref)
        np.testing.assert_array_equal(
            batch["actions"], np.concatenate([ep.get_actions() for ep in eps])
        )
        np.testing.assert_array_equal(
            batch["eps_id"], np.concatenate([[ep.id_] * len(ep) for ep in eps])
        )


def test_episode_factory_gets_dict_obs_columns():
    seen: list[EpisodeColumns] = []

    def factory(columns: EpisodeColumns) -> list[Any]:
        seen.append(columns)
        return list(range(len(columns.ids)))

    s_fac, _ = prev_actions_samplers(episode_factory=factory)
    s_eps, _ = prev_actions_samplers()
    for _ in range(2):
        s_fac.sample(())
        eps = s_eps.sample(())
        cols = seen[-1]
        assert isinstance(cols.obs, dict) and cols.ids == [ep.id_ for ep in eps]
        for i, ep in enumerate(eps):
            e, a, b = cols.env[i], cols.first[i], cols.stop[i]
            for k, v in ep.observations.data.items():  # lookback included
                np.testing.assert_array_equal(cols.obs[k][e, a : b + 1], v)
