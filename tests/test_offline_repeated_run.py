"""An appending writer warns when the same run is written to a log again (a sampler
restarted with the same seed and deterministic episode ids: its first output repeats the
steps the log's last session began with, so ``eps_id`` would name two episodes), and stays
silent for a fresh run, a resumed sampler's continuation and recovered steps."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.host_envs import GymnasiumHostEnv
from jaxsampler.offline import OfflineWriter, RepeatedRunWarning, read_records
from jaxsampler.sampling import HostSampler


def sampler(seed, deterministic_ids=None):
    henv = GymnasiumHostEnv([lambda: gym.make("CartPole-v1") for _ in range(2)], seed=0)
    policy = js.RandomPolicy(henv.observation_space, henv.action_space)
    return HostSampler(henv, policy, seed=seed, deterministic_ids=deterministic_ids)


def append(path, records):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with OfflineWriter(path, append=True) as writer:
            for r in records:
                writer.write(r)
    return [w for w in caught if issubclass(w.category, RepeatedRunWarning)]


@pytest.mark.parametrize("kind", ["episodes", "batches"])
def test_a_restarted_same_seed_sampler_is_named_and_a_fresh_one_is_not(tmp_path, kind):
    log = tmp_path / "log"

    def run(s):
        if kind == "episodes":
            return s.sample((), num_timesteps=16)
        return [s.sample_batch((), num_timesteps=16)]

    assert append(log, run(sampler(seed=3))) == []  # a new log: nothing to compare
    (warning,) = append(log, run(sampler(seed=3)))  # the same run again
    assert "same run is being written again" in str(warning.message)
    assert append(log, run(sampler(seed=4))) == []  # another seed: other ids
    assert append(log, run(sampler(seed=4, deterministic_ids=False))) == []
    assert len(list(read_records(log))) > 0  # the warning refuses nothing


def test_a_continued_run_and_a_continuation_chunk_pass(tmp_path):
    log = tmp_path / "log"
    s = sampler(seed=3)
    assert append(log, s.sample((), num_timesteps=16)) == []
    # the same sampler continues in a new writer session: its chunks go on the same
    # episodes (same ids, later steps), which is no repeat
    assert append(log, s.sample((), num_timesteps=16)) == []
    ep = js.SingleAgentEpisode(
        "a" * 32,
        observations=[np.zeros(2)] * 3,
        actions=[0, 1],
        rewards=[1.0, 1.0],
        len_lookback_buffer=0,
    )
    assert append(log, [ep]) == []
    later = js.SingleAgentEpisode(
        "a" * 32,
        observations=[np.zeros(2)] * 2,
        actions=[0],
        rewards=[1.0],
        t_started=2,
        len_lookback_buffer=0,
    )
    assert append(log, [later]) == []  # steps 2.. after 0..1: a continuation
    assert len(append(log, [later])) == 1  # step 2 again: a repeat
