"""What a user receives from an env with agent groups: every agent's data in its own spaces.

The reference is the same sampler's carrier output (the converter with the unpacking
switched off), cut back by hand with NumPy slicing to each group's known sizes."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import jaxsampler as js
from jaxsampler.envs.base import GroupedMultiAgentEnv
from jaxsampler.envs.groups import AgentGroup
from jaxsampler.sampling.device import sampler as sampler_module
from jaxsampler.spaces import Box, Discrete

#: each group's observation shape, its flat size, its number of actions
SHAPES = {"wide": ((2, 2), 4, 4), "narrow": ((3,), 3, 2)}


@struct.dataclass
class _State:
    time: jnp.ndarray
    total: jnp.ndarray  # float32[A]: the sum of each agent's actions so far


@struct.dataclass
class _Params:
    max_steps_in_episode: int = 5


@dataclasses.dataclass(frozen=True)
class TwoGroups(GroupedMultiAgentEnv):
    """Two "wide" agents see a 2x2 observation and pick one of 4 actions; one "narrow"
    agent sees 3 numbers, picks one of 2 and is terminated at its third step."""

    num_agents: ClassVar[int] = 3

    @property
    def agent_groups(self) -> tuple[AgentGroup, ...]:
        return (
            AgentGroup("wide", ("w0", "w1"), Box(-100, 100, (2, 2)), Discrete(4)),
            AgentGroup("narrow", ("n0",), Box(-100, 100, (3,)), Discrete(2)),
        )

    @property
    def default_params(self) -> _Params:
        return _Params()

    def reset_world(self, key, params):
        return _State(jnp.zeros((), jnp.int32), jnp.zeros((3,), jnp.float32))

    def step_world(self, key, state, action, params):
        acts = self.group_actions(action)
        moved = jnp.concatenate([acts["wide"], acts["narrow"] % 2]).astype(jnp.float32)
        return _State(state.time + 1, state.total + moved), moved

    def group_obs(self, group, agent_id, own, state, params):
        base = state.total[agent_id] + 10.0 * agent_id + 0.5 * state.time
        if group == "wide":
            return base + jnp.arange(4, dtype=jnp.float32).reshape(2, 2)
        return base - jnp.arange(3, dtype=jnp.float32)

    def agent_reward(self, agent_id, own, state, shared, params):
        return shared[agent_id]

    def agent_terminated(self, agent_id, own, state, params):
        return (agent_id == 2) & (state.time >= 3)

    def agent_acting(self, agent_id, own, state, params):
        return ~self.agent_terminated(agent_id, own, state, params) & ~self.agent_truncated(
            agent_id, own, state, params
        )


ENV = TwoGroups()
GROUP = {"w0": "wide", "w1": "wide", "n0": "narrow"}


def _policy():
    """One random policy per group, over the carrier spaces."""
    layout = ENV.agent_layout
    rnd = js.policies.RandomPolicy(layout.observation_space, layout.action_space)
    return js.policies.MultiAgentPolicy(
        ENV, {"wide": rnd, "narrow": rnd}, policy_mapping_fn=lambda aid, *a, **k: GROUP[aid]
    )


def _own_obs(aid, x):
    shape, size, _ = SHAPES[GROUP[aid]]
    x = np.asarray(x)
    return x[..., :size].reshape(*x.shape[:-1], *shape)


def _samplers(monkeypatch):
    grouped = js.Sampler(ENV, _policy(), num_envs=3, rollout_length=4, seed=3)
    with monkeypatch.context() as m:
        m.setattr(sampler_module, "grouped_layout", lambda env, pipe: None)
        carrier = js.Sampler(ENV, _policy(), num_envs=3, rollout_length=4, seed=3)
    return grouped, carrier


def test_episodes_hold_each_agents_own_spaces_and_data(monkeypatch):
    grouped, carrier = _samplers(monkeypatch)
    params = {"wide": None, "narrow": None}
    for _ in range(3):  # chunks continue across calls
        got, want = grouped.sample(params), carrier.sample(params)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.id_ == w.id_ and set(g.agent_episodes) == set(w.agent_episodes)
            for aid, sa in g.agent_episodes.items():
                ref = w.agent_episodes[aid]
                own = ENV.observation_spaces[aid]
                assert g.observation_space[aid] == own == sa.observation_space
                assert g.action_space[aid] == ENV.action_spaces[aid] == sa.action_space
                obs = sa.get_observations()
                np.testing.assert_array_equal(obs, _own_obs(aid, ref.get_observations()))
                assert obs.shape[1:] == SHAPES[GROUP[aid]][0]
                acts = sa.get_actions()
                np.testing.assert_array_equal(acts, ref.get_actions())
                assert np.all(acts < SHAPES[GROUP[aid]][2]) or aid == "n0"
                np.testing.assert_array_equal(sa.get_rewards(), ref.get_rewards())
                assert sa.is_terminated == ref.is_terminated
                assert (sa.t_started, sa.t) == (ref.t_started, ref.t)
                # the carrier's padding is zeros, and the own data is all of it
                padded = np.asarray(ref.get_observations())
                assert np.all(padded[..., SHAPES[GROUP[aid]][1] :] == 0)
            assert g.get_return() == w.get_return()


def test_batches_hold_each_policys_own_rows(monkeypatch):
    grouped, carrier = _samplers(monkeypatch)
    for _ in range(3):
        params = {"wide": None, "narrow": None}
        got, want = grouped.sample_batch(params), carrier.sample_batch(params)
        assert set(got.policy_batches) == {"wide", "narrow"}
        for pid, b in got.policy_batches.items():
            ref = want.policy_batches[pid]
            aid = "w0" if pid == "wide" else "n0"
            shape = SHAPES[pid][0]
            for col in ("obs", "new_obs"):
                assert b[col].shape == (len(ref), *shape)
                np.testing.assert_array_equal(b[col], _own_obs(aid, ref[col]))
            np.testing.assert_array_equal(b["actions"], ref["actions"])
            np.testing.assert_array_equal(b["rewards"], ref["rewards"])
            np.testing.assert_array_equal(b["eps_id"], ref["eps_id"])


def test_transforms_that_change_the_carrier_spaces_are_refused():
    with pytest.raises(ValueError, match="agent groups.*carrier observation space"):
        js.Sampler(
            ENV,
            js.policies.RandomPolicy(Box(-100, 100, (2, 4)), ENV.action_space),
            num_envs=2,
            rollout_length=2,
            transforms=(js.transforms.FrameStack(2),),
        )
