"""Exact comparison of RLlib 2.60 episodes (and of nested states): RLlib's own getters,
``get_state()`` and the fields behind them, shared by the RLlib integration tests."""

from __future__ import annotations

import numpy as np
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode as RlMultiAgentEpisode
from ray.rllib.env.single_agent_episode import SingleAgentEpisode as RlSingleAgentEpisode

__all__ = [
    "RL_MA_GETTERS",
    "RL_SA_GETTERS",
    "assert_rl_ma_equal",
    "assert_rl_sa_equal",
    "outcome",
    "rl_ma_state",
    "same",
]


def same(a, b, path="state"):
    """Deep equality of states: dicts by key, sequences item by item, arrays exactly (shape,
    dtype and values; NaN equal to NaN), everything else by ``==``."""
    if isinstance(a, dict) or isinstance(b, dict):
        assert isinstance(a, dict) and isinstance(b, dict), (path, type(a), type(b))
        assert list(a) == list(b), (path, list(a), list(b))
        for k in a:
            same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), (path, type(a), type(b))
        assert a.shape == b.shape and a.dtype == b.dtype, (path, a.shape, b.shape, a.dtype, b.dtype)
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), path
    elif isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), (path, type(a), type(b))
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{path}[{i}]")
    else:
        assert type(a) is type(b) and a == b, (path, a, b)


RL_SA_GETTERS = (
    lambda e: e.get_observations(),
    lambda e: e.get_observations(
        slice(-1 - e.observations.lookback, None), neg_index_as_lookback=True
    ),
    lambda e: e.get_actions(),
    lambda e: e.get_rewards(),
    lambda e: e.get_infos(),
    lambda e: {k: e.get_extra_model_outputs(k) for k in e.extra_model_outputs},
    lambda e: (len(e), e.t_started, e.t, e.id_, e.is_terminated, e.is_truncated, e.is_numpy),
    lambda e: (e.agent_id, e.module_id, e.multi_agent_episode_id, e.env_steps(), e.get_return()),
)


def assert_rl_sa_equal(a: RlSingleAgentEpisode, b: RlSingleAgentEpisode) -> None:
    assert type(a) is type(b) is RlSingleAgentEpisode
    for get in RL_SA_GETTERS:
        same(get(a), get(b))
    same(a.get_state(), b.get_state())
    assert a.observation_space == b.observation_space and a.action_space == b.action_space
    for col in ("observations", "infos", "actions", "rewards"):
        assert getattr(a, col) == getattr(b, col), col  # RLlib's buffer equality
    a.validate()
    b.validate()


def outcome(fn, *args):
    """``fn(*args)``'s value, or the type of the exception it raises."""
    try:
        return fn(*args)
    except Exception as err:
        return type(err)


RL_MA_GETTERS = (
    lambda e: e.get_observations(),
    lambda e: e.get_observations(-1),
    lambda e: e.get_observations(env_steps=False),
    lambda e: e.get_actions(env_steps=False),
    lambda e: e.get_rewards(env_steps=False),
    lambda e: e.get_infos(env_steps=False),
    lambda e: e.get_actions(),
    lambda e: e.get_rewards(),
    lambda e: e.get_terminateds(),
    lambda e: e.get_truncateds(),
    lambda e: sorted(e.get_agents_that_stepped()),
    lambda e: sorted(e.get_agents_to_act()),
    lambda e: (len(e), e.env_t_started, e.env_t, e.id_, e.is_done, e.agent_steps(), e.is_numpy),
    lambda e: (e.get_return(), e.get_return(include_hanging_rewards=True)),
    lambda e: (dict(e.agent_t_started), e.agent_episode_ids, sorted(e.agent_ids)),
    lambda e: {a: e.module_for(a) for a in sorted(e.agent_ids)},
)


def rl_ma_state(ep):
    state = ep.get_state()
    state["agent_episodes"] = dict(state["agent_episodes"])
    return state


def assert_rl_ma_equal(a, b):
    assert type(a) is type(b) is RlMultiAgentEpisode
    for get in RL_MA_GETTERS:
        same(outcome(get, a), outcome(get, b))
    same(rl_ma_state(a), rl_ma_state(b))
    a.validate()
    b.validate()
