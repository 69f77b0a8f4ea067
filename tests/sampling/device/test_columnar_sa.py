"""Single-agent conversion input checks: a malformed trajectory raises a named error
before anything is converted or carried."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.sampling.device.columns import check_chunks
from tests.fakes import FakeEnv


def sampled(seed: int = 0) -> js.Sampler:
    env = FakeEnv()
    s = js.Sampler(
        env,
        js.RandomPolicy(env.observation_space, env.action_space),
        num_envs=3,
        rollout_length=4,
        seed=seed,
        episode_lookback_horizon=2,
    )
    s.sample(())
    return s


@pytest.mark.parametrize(
    "field, cut, shape",
    [
        ("actions", lambda x: x[:-1], (3, 3, 1)),  # T short by one
        ("rewards", lambda x: x[:, :-1], (4, 2, 1)),  # E short by one
        ("obs", lambda x: x[:-1], (4, 3, 1, 2)),  # T + 1 expected
        ("terminated", lambda x: x[:, :, None], (4, 3, 1, 1)),  # fine: trailing axes
    ],
)
def test_mismatched_leading_shapes_raise_a_value_error_naming_field_and_shapes(field, cut, shape):
    s = sampled()
    chunk = s.last_chunks[0]
    bad = dataclasses.replace(chunk, **{field: cut(np.asarray(getattr(chunk, field)))})
    assert np.shape(getattr(bad, field)) == shape
    if field == "terminated":
        check_chunks([bad])  # leading axes agree: accepted
        return
    state = s._convert.get_state()
    # (rewards set T, E and A: with rewards cut, the first other field is named instead)
    named = "actions has shape (4, 3, 1)" if field == "rewards" else f"{field} has shape {shape}"
    with pytest.raises(ValueError, match=re.escape(named)):
        s._convert.episodes([bad], None)
    with pytest.raises(ValueError, match=r"expected leading axes \["):
        s._convert.batch([bad], None)
    assert s._convert.get_state()["head"] is state["head"]  # nothing carried


def test_chunks_with_different_env_counts_and_a_bad_is_reset_are_rejected():
    s = sampled(1)
    chunk = s.last_chunks[0]
    fewer = dataclasses.replace(chunk, is_reset=np.asarray(chunk.is_reset)[:, :2])
    bad = r"chunk 1's is_reset has shape \(4, 2\), expected leading axes \[4, 3\]"
    with pytest.raises(ValueError, match=bad):
        check_chunks([chunk, fewer])
    flat = dataclasses.replace(chunk, is_reset=np.asarray(chunk.is_reset).reshape(-1))
    with pytest.raises(ValueError, match=r"is_reset has shape \(12,\)"):
        check_chunks([flat])
    check_chunks([chunk, chunk])  # well-formed chunks pass
