"""Bad input to episodes: clear exceptions, and the episode left unchanged."""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler import SingleAgentEpisode


def make_episode(**kw):
    ep = SingleAgentEpisode(
        id_="e",
        observation_space=gym.spaces.Box(-1, 1, (2,), np.float32),
        action_space=gym.spaces.Discrete(3),
        **kw,
    )
    ep.add_env_reset(np.zeros(2, np.float32))
    ep.add_env_step(np.full(2, 0.5, np.float32), 1, 1.0, extra_model_outputs={"vf": 0.1})
    return ep


def snapshot(ep):
    state = ep.get_state()
    for k in ("observation_space", "action_space"):  # gymnasium caches things inside spaces
        state.pop(k)
    for k in ("observations", "actions"):
        state[k] = {**state[k], "space": None}
    return pickle.dumps(state)


def test_step_after_done_raises_and_changes_nothing():
    ep = make_episode()
    ep.add_env_step(
        np.zeros(2, np.float32), 0, 1.0, extra_model_outputs={"vf": 0.2}, terminated=True
    )
    before = snapshot(ep)
    with pytest.raises(AssertionError, match="already done"):
        ep.add_env_step(np.zeros(2, np.float32), 0, 1.0)
    assert snapshot(ep) == before


@pytest.mark.parametrize(
    "obs, action, match",
    [
        (np.full(2, 5.0, np.float32), 1, "observation .* is not in the observation space"),
        (np.zeros(3, np.float32), 1, "observation .* is not in the observation space"),
        (np.zeros(2, np.float32), 7, "action 7 is not in the action space"),
    ],
)
def test_validation_rejects_out_of_space_data_before_changing_anything(obs, action, match):
    ep = make_episode()
    before = snapshot(ep)
    with pytest.raises(ValueError, match=match):
        ep.add_env_step(obs, action, 1.0, extra_model_outputs={"vf": 0.3}, validate=True)
    assert snapshot(ep) == before
    ep.add_env_step(
        np.zeros(2, np.float32), 2, 1.0, extra_model_outputs={"vf": 0.3}, validate=True
    )  # valid data passes
    assert len(ep) == 2


def test_reset_validation_and_double_reset():
    ep = SingleAgentEpisode(observation_space=gym.spaces.Box(-1, 1, (2,), np.float32))
    with pytest.raises(ValueError, match="observation space"):
        ep.add_env_reset(np.full(2, 9.0, np.float32), validate=True)
    assert not ep.is_reset
    ep.add_env_reset(np.zeros(2, np.float32), validate=True)
    with pytest.raises(AssertionError):
        ep.add_env_reset(np.zeros(2, np.float32))


def test_mismatched_constructor_lengths():
    with pytest.raises(AssertionError):
        SingleAgentEpisode(
            observations=[0, 1, 2], actions=[1], rewards=[1.0, 2.0], len_lookback_buffer=0
        )
    with pytest.raises(AssertionError):
        SingleAgentEpisode(
            observations=[0, 1],
            actions=[1],
            rewards=[1.0],
            extra_model_outputs={"vf": [1.0, 2.0]},
            len_lookback_buffer=0,
        )
    with pytest.raises(ValueError, match="len_lookback_buffer"):
        SingleAgentEpisode(observations=[0, 1], actions=[1], rewards=[1.0], len_lookback_buffer=-1)


def test_out_of_range_getters_raise_index_error_unless_filled():
    ep = make_episode().to_numpy()
    for getter in (ep.get_observations, ep.get_actions, ep.get_rewards):
        with pytest.raises(IndexError):
            getter(5)
        with pytest.raises(IndexError):
            getter(-1, neg_index_as_lookback=True)  # no lookback here
    assert ep.get_actions(5, fill=-1) == -1
    with pytest.raises(KeyError, match="no extra model output 'nope'"):
        ep.get_extra_model_outputs("nope")
    with pytest.raises(ValueError, match="one_hot_discrete"):
        js.episodes.InfiniteLookbackBuffer([1, 2]).get(0, one_hot_discrete=True)


def test_cut_of_done_episode_and_negative_lookback():
    ep = make_episode()
    with pytest.raises(AssertionError):
        ep.cut(-1)
    ep.add_env_step(
        np.zeros(2, np.float32), 0, 1.0, extra_model_outputs={"vf": 0.2}, truncated=True
    )
    with pytest.raises(AssertionError, match="done"):
        ep.cut()


def test_state_round_trip_and_pickle():
    ep = make_episode()
    ep.custom_data["k"] = [1, 2]
    for copy in (SingleAgentEpisode.from_state(ep.get_state()), pickle.loads(pickle.dumps(ep))):
        assert copy.id_ == ep.id_ and len(copy) == len(ep) and copy.custom_data == {"k": [1, 2]}
        np.testing.assert_array_equal(copy.get_observations(), ep.get_observations())
        assert copy.get_extra_model_outputs("vf") == ep.get_extra_model_outputs("vf")
        assert copy.observations == ep.observations
