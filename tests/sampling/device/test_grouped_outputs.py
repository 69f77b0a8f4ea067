"""What a user receives from an env with agent groups: every agent's data in its own spaces.

The reference is the same sampler's carrier output (the converter with the unpacking
switched off), cut back by hand with NumPy slicing to each group's known sizes."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import jaxsampler as js
from jaxsampler.envs.base import GroupedMultiAgentEnv
from jaxsampler.envs.groups import AgentGroup
from jaxsampler.sampling.device import grouped as grouped_module
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
        # (nothing after the narrow agent's end, at its third step)
        return jnp.where((agent_id == 2) & (state.time > 3), 0.0, shared[agent_id])

    def agent_terminated(self, agent_id, own, state, params):
        return (agent_id == 2) & (state.time >= 3)

    def agent_acting(self, agent_id, own, state, params):
        return ~self.agent_terminated(agent_id, own, state, params) & ~self.agent_truncated(
            agent_id, own, state, params
        )


ENV = TwoGroups()


def test_the_fixture_env_is_a_valid_env():
    assert js.check_env(ENV, num_envs=4).ok


GROUP = {"w0": "wide", "w1": "wide", "n0": "narrow"}


def _policy(padded=False):
    """One MLP per group over the group's own spaces (``padded``: over the carrier's)."""
    layout = ENV.agent_layout
    policies = {
        g.name: js.MLPPolicy(
            layout.observation_space if padded else g.observation_space,
            layout.action_space if padded else g.action_space,
            (8,),
        )
        for g in layout.groups
    }
    return js.policies.MultiAgentPolicy(
        ENV, policies, policy_mapping_fn=lambda aid, *a, **k: GROUP[aid]
    )


PARAMS = _policy().init(jax.random.PRNGKey(0))


def _own_obs(aid, x):
    shape, size, _ = SHAPES[GROUP[aid]]
    x = np.asarray(x)
    return x[..., :size].reshape(*x.shape[:-1], *shape)


def _samplers(monkeypatch, padded=False):
    grouped = js.Sampler(ENV, _policy(padded), num_envs=3, rollout_length=4, seed=3)
    with monkeypatch.context() as m:
        m.setattr(grouped_module, "grouped_output", lambda *args: None)
        carrier = js.Sampler(ENV, _policy(padded), num_envs=3, rollout_length=4, seed=3)
    return grouped, carrier


def _own_extra(aid, key, x):
    """An extra cut back to its own width: the group's number of actions for the logits."""
    x = np.asarray(x)
    if key != "action_dist_inputs":
        return x
    return x[..., : SHAPES[GROUP[aid]][2]]


def test_episodes_hold_each_agents_own_spaces_and_data(monkeypatch):
    grouped, carrier = _samplers(monkeypatch)
    params = PARAMS
    for _ in range(3):  # chunks continue across calls
        got, want = grouped.sample(params), carrier.sample(params)
        assert len(got) == len(want)
        # finished chunks stay lazy: their copies unpack when they are built
        assert any("_lazy" in vars(g) for g in got)
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
                for key in ("action_dist_inputs", "action_logp", "vf_preds"):
                    own, full = sa.get_extra_model_outputs(key), ref.get_extra_model_outputs(key)
                    np.testing.assert_array_equal(own, _own_extra(aid, key, full))
                    assert np.all(np.asarray(full)[..., np.shape(own)[-1] :] == 0) or own.ndim < 2
                assert sa.is_terminated == ref.is_terminated
                assert (sa.t_started, sa.t) == (ref.t_started, ref.t)
                # the carrier's padding is zeros, and the own data is all of it
                padded = np.asarray(ref.get_observations())
                assert np.all(padded[..., SHAPES[GROUP[aid]][1] :] == 0)
            assert g.get_return() == w.get_return()


def test_batches_hold_each_policys_own_rows(monkeypatch):
    grouped, carrier = _samplers(monkeypatch)
    for _ in range(3):
        got, want = grouped.sample_batch(PARAMS), carrier.sample_batch(PARAMS)
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
            logits = b["action_dist_inputs"]
            assert logits.shape == (len(ref), SHAPES[pid][2])
            np.testing.assert_array_equal(
                logits, _own_extra(aid, "action_dist_inputs", ref["action_dist_inputs"])
            )


def test_a_policy_over_the_carrier_keeps_carrier_rows_in_its_batch(monkeypatch):
    # padded mode: each policy saw carrier rows, so its batch holds them; episodes still
    # give each agent its own spaces
    grouped, carrier = _samplers(monkeypatch, padded=True)
    params = _policy(padded=True).init(jax.random.PRNGKey(1))
    got, want = grouped.sample_batch(params), carrier.sample_batch(params)
    for pid, b in got.policy_batches.items():
        for col in ("obs", "new_obs", "actions", "action_dist_inputs"):
            np.testing.assert_array_equal(b[col], want.policy_batches[pid][col])
        assert b["obs"].shape[1:] == ENV.observation_space.shape
    eps = [ep for ep in grouped.sample(params) if "n0" in ep.agent_episodes]
    assert eps and all(ep.agent_episodes["n0"].get_observations().shape[1:] == (3,) for ep in eps)


def test_transforms_that_change_the_carrier_spaces_are_refused():
    with pytest.raises(ValueError, match="agent groups.*carrier observation space"):
        js.Sampler(
            ENV,
            js.policies.RandomPolicy(Box(-100, 100, (2, 4)), ENV.action_space),
            num_envs=2,
            rollout_length=2,
            transforms=(js.transforms.FrameStack(2),),
        )
