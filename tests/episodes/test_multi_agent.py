"""MultiAgentEpisode beyond the reference examples: slicing, state, bad input, numpy mode."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import numpy as np
import pytest

from jaxsampler.episodes import MultiAgentEnvError, MultiAgentEpisode
from jaxsampler.spaces import Box, Discrete

STEPS: list[dict[str, Any]] = [
    dict(observations={"a0": 1}, actions={"a0": 0, "a1": 1}, rewards={"a0": 1.0, "a1": 0.5}),
    dict(
        observations={"a0": 2, "a1": 101, "a2": 200},
        actions={"a0": 1},
        rewards={"a0": 2.0, "a1": 0.25, "a2": 7.0},
    ),
    dict(
        observations={"a0": 3, "a1": 102, "a2": 201},
        actions={"a0": 2, "a1": 0, "a2": 2},
        rewards={"a0": 3.0, "a1": 1.0, "a2": 1.0},
    ),
    dict(
        observations={"a0": 4}, actions={"a0": 0, "a1": 1, "a2": 1}, rewards={"a0": 4.0, "a1": 2.0}
    ),
    dict(
        observations={"a0": 5, "a1": 103},
        actions={"a0": 1},
        rewards={"a0": 5.0, "a1": 3.0, "a2": 0.5},
    ),
    dict(
        observations={"a0": 6, "a1": 104, "a2": 202},
        actions={"a0": 2, "a1": 2},
        rewards={"a0": 6.0, "a1": 4.0, "a2": 1.0},
    ),
]


def module_of(aid, episode):
    return "m_" + aid


def build(upto=len(STEPS), **kw) -> MultiAgentEpisode:
    ep = MultiAgentEpisode("ma", agent_to_module_mapping_fn=module_of, **kw)
    ep.add_env_reset(observations={"a0": 0, "a1": 100})
    for s in STEPS[:upto]:
        ep.add_env_step(**s)
    return ep


def agent_data(ep):
    return {
        a: (
            sa.t_started,
            sa.t,
            list(np.asarray(sa.get_observations())),
            list(np.asarray(sa.get_actions())),
            list(np.asarray(sa.get_rewards())),
        )
        for a, sa in sorted(ep.agent_episodes.items())
    }


def test_cut_chunks_concatenate_back_and_slices_match_them():
    full = build()
    for cut_at in range(1, len(STEPS)):
        head = build(cut_at)
        hanging = bool(head._hanging_actions_end)
        tail = head.cut(len_lookback_buffer=1)
        for s in STEPS[cut_at:]:
            tail.add_env_step(**s)
        if (
            not hanging
        ):  # (a step hanging at the cut completes in the tail; a slice starts after it)
            assert agent_data(tail) == agent_data(full[cut_at:]), cut_at
        head.concat_episode(tail)
        assert agent_data(head) == agent_data(full)
        assert head.env_t_to_agent_t["a1"].data == full.env_t_to_agent_t["a1"].data
        assert head.get_return() == pytest.approx(full.get_return())
        assert head._hanging_actions_end == full._hanging_actions_end


def test_state_round_trip_and_pickle():
    ep = build(4)
    for other in (
        MultiAgentEpisode.from_state(ep.get_state()),
        MultiAgentEpisode.from_state(pickle.loads(pickle.dumps(ep.get_state()))),
    ):
        assert agent_data(other) == agent_data(ep)
        assert other._hanging_actions_end == ep._hanging_actions_end
        assert other.get_actions(-1) == ep.get_actions(-1)
    copy.deepcopy(ep).add_env_step(**STEPS[4])  # copies are independent
    assert len(ep) == 4


def test_numpy_mode_fill_and_one_hot_use_the_spaces():
    ep = build(
        4,
        observation_space={a: Box(-1e3, 1e3, (), np.float32) for a in ("a0", "a1", "a2")},
        action_space={a: Discrete(3) for a in ("a0", "a1", "a2")},
    )
    ep.to_numpy()
    assert ep.is_numpy
    got = ep.get_actions(slice(0, 4), fill=0, one_hot_discrete=True)
    np.testing.assert_array_equal(
        got["a1"], np.eye(3)[[1, 0, 0, 1]] * np.array([[1], [0], [1], [1]])
    )
    obs = ep.get_observations(slice(0, 5), fill=-1.0)
    assert list(obs["a2"]) == [-1, -1, 200, 201, -1]
    assert ep.get_actions(-1, env_steps=False) == {"a0": 0, "a1": 1, "a2": 1}  # hanging included
    assert {a: list(v) for a, v in ep.get_actions(env_steps=False).items()} == {
        "a0": [0, 1, 2, 0],
        "a1": [1, 0],
        "a2": [2],
    }


def test_bad_input_raises_clear_errors():
    ep = build(2)
    with pytest.raises(MultiAgentEnvError, match="did NOT receive any reward"):
        copy.deepcopy(ep).add_env_step({"a0": 9}, {"a0": 0}, {})
    with pytest.raises(MultiAgentEnvError, match="did not act on its previous one"):
        e2 = MultiAgentEpisode()
        e2.add_env_reset(observations={"x": 0})
        e2.add_env_step({"x": 1}, {}, {"x": 0.0})
    with pytest.raises(MultiAgentEnvError, match="truncated, but did NOT receive a last"):
        copy.deepcopy(ep).add_env_step(
            {"a0": 3}, {"a0": 0, "a1": 0}, {"a0": 0.0}, truncateds={"a1": True}
        )
    with pytest.raises(KeyError, match="unknown agent"):
        ep.set_actions(new_data={"zz": [1]})
    with pytest.raises(ValueError, match="one observation dict more"):
        MultiAgentEpisode(observations=[{"a": 0}], actions=[{"a": 0}], rewards=[{"a": 1.0}])
    with pytest.raises(ValueError, match="return_list"):
        ep.get_rewards(return_list=True, env_steps=False)
    with pytest.raises(ValueError, match="different ids"):
        ep.concat_episode(MultiAgentEpisode("other", env_t_started=ep.env_t))
    with pytest.raises(ValueError, match="do not meet"):
        ep.concat_episode(MultiAgentEpisode("ma", env_t_started=ep.env_t + 3))
    with pytest.raises(RuntimeError, match="already done"):
        ended = build(2)
        ended.add_env_step(
            {"a0": 3, "a1": 102},
            {"a0": 0, "a1": 0},
            {"a0": 0.0, "a1": 0.0},
            terminateds={"__all__": True},
        )
        ended.cut()


def test_terminated_agent_without_final_obs_and_agents_to_act():
    ep = build(1)  # a1 hanging
    ep.add_env_step({"a0": 2}, {"a0": 1}, {"a0": 1.0, "a1": 2.0}, terminateds={"a1": True})
    sa = ep.agent_episodes["a1"]
    assert (
        sa.is_terminated
        and list(sa.get_observations()) == [100, 100]
        and list(sa.get_rewards()) == [2.5]
    )
    assert ep.get_agents_to_act() == {"a0"} and not ep.is_done
    assert ep.get_terminateds() == {"a0": False, "a1": True, "__all__": False}
    ep.add_env_step({"a0": 3}, {"a0": 1}, {"a0": 1.0}, truncateds={"a0": True, "__all__": True})
    assert (
        ep.is_done and ep.get_truncateds()["__all__"] is True
    )  # RLlib returns is_terminated here (a bug)
