"""check_env on envs with agent groups: each agent's observation in its own group's space,
zero carrier padding, a layout that builds; problems name the group and the agent."""

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
from jaxsampler.envs.groups import AgentGroup, GroupLayout
from jaxsampler.envs.predator_prey import PredatorPrey
from jaxsampler.rollout.check_groups import group_observation_problems
from jaxsampler.spaces import Box, Discrete


def test_predator_prey_passes_with_the_group_checks():
    report = js.check_env(PredatorPrey(n_predators=3), num_envs=4)
    assert report.ok, str(report)
    assert "agent groups: own observation spaces, zero padding" in report.checks_run


@dataclasses.dataclass(frozen=True)
class NearSighted(PredatorPrey):
    """Declares that predators see the prey within 0.5 only, but reports it anywhere. The
    carrier (widened by the prey's space) still holds those values: only the group check
    sees the problem."""

    @property
    def agent_groups(self):
        predator, prey = super().agent_groups
        near = Box(np.array([-1, -1, -0.5, -0.5]), np.array([1, 1, 0.5, 0.5]), (4,), np.float32)
        return (dataclasses.replace(predator, observation_space=near), prey)


@dataclasses.dataclass(frozen=True)
class LeakyPadding(PredatorPrey):
    """Writes 0.5 into the carrier padding of the second predator (inside the carrier)."""

    def all_obs(self, state, params):
        return super().all_obs(state, params).at[1, 4:].set(0.5)


def test_observation_outside_its_group_space_is_named():
    env = NearSighted()
    assert env.observation_space == PredatorPrey().observation_space  # same carrier
    report = js.check_env(env, num_envs=4)
    # Predators start at least 1 away from the prey along x: outside at the reset already.
    assert len(report.problems) == 1, str(report)
    problem = report.problems[0]
    assert "agent 'predator_0' (group 'predator') of env 0 at the reset" in problem
    assert "outside its group's space Box(" in problem


def test_nonzero_padding_is_named():
    report = js.check_env(LeakyPadding(), num_envs=4)
    assert len(report.problems) == 1, str(report)
    assert report.problems[0] == (
        "agent 'predator_1' (group 'predator') of env 0 at the reset: the carrier padding "
        "after its 4 observation values is not zero: [0.5, 0.5]"
    )
    with pytest.raises(js.rollout.EnvCheckError, match="carrier padding"):
        js.check_env(LeakyPadding(), num_envs=4, raise_on_error=True)


@dataclasses.dataclass(frozen=True)
class Miscounted(PredatorPrey):
    num_agents: ClassVar[int] = 2

    def __post_init__(self) -> None:
        pass  # keeps the wrong class-level count


def test_a_layout_that_does_not_build_is_reported_not_raised():
    report = js.check_env(Miscounted(), num_envs=2)
    assert report.problems == [
        "agent groups: PredatorPrey-v0: num_agents is 2 but its agent groups list 3 agents "
        "(['predator_0', 'predator_1', 'prey_0'])"
    ]


# --- the function itself, on hand-made records -----------------------------------------

LAYOUT = GroupLayout(
    [
        AgentGroup("unit", ("u0",), Box(0, 1, (2,), np.float32), Discrete(2)),
        AgentGroup("count", ("c0", "c1"), Box(-3, 3, (1,), np.int8), Discrete(2)),
    ]
)


def records(first, steps, alive):
    return {
        "first_obs": np.asarray(first, np.float32),
        "obs": np.asarray(steps, np.float32),
        "alive": np.asarray(alive, bool),
    }


GOOD = [[0.5, 1.0], [-3.0, 0.0], [2.0, 0.0]]  # one env: u0, c0, c1 carrier rows


def test_good_records_pass_and_steps_after_the_end_are_ignored():
    bad = [[5.0, 5.0], [0.5, 1.0], [9.0, 9.0]]
    rec = records([GOOD], [[GOOD], [bad]], [[True], [False]])  # step 2 is past the end
    assert group_observation_problems(LAYOUT, rec) == []


@pytest.mark.parametrize(
    ("row", "where", "expect"),
    [
        (0, [1.5, 0.0], "agent 'u0' (group 'unit') of env 0 at step 1: observation [1.5, 0.0]"),
        (0, [np.nan, 0.0], "agent 'u0' (group 'unit') of env 0 at step 1: observation [nan"),
        (2, [4.0, 0.0], "agent 'c1' (group 'count') of env 0 at step 1: observation [4.0]"),
        # 1.5 lies within [-3, 3] but is no int8: unpacking would truncate it.
        (1, [1.5, 0.0], "agent 'c0' (group 'count') of env 0 at step 1: observation [1.5]"),
        (2, [1.0, -0.25], "agent 'c1' (group 'count') of env 0 at step 1: the carrier padding"),
    ],
    ids=["above", "nan", "int above", "fraction", "padding"],
)
def test_each_violation_names_its_agent(row, where, expect):
    step = [list(r) for r in GOOD]
    step[row] = where
    problems = group_observation_problems(LAYOUT, records([GOOD], [[step]], [[True]]))
    assert len(problems) == 1 and problems[0].startswith(expect), problems


@struct.dataclass
class _LastState:
    time: jnp.ndarray
    last: jnp.ndarray  # int32[2]: each agent's last action


@struct.dataclass
class _LastParams:
    max_steps_in_episode: int = 5


@dataclasses.dataclass(frozen=True)
class LastAction(GroupedMultiAgentEnv):
    """Each agent sees its own last action: a correct env whose narrow group's observation
    space (0 or 1) is only kept when that group acts within its own Discrete(2)."""

    num_agents: ClassVar[int] = 2
    narrow_dtype: ClassVar = np.float32
    offset: ClassVar[int] = 0  # the narrow agent sees offset + its last action

    @property
    def agent_groups(self):
        narrow = Box(self.offset, self.offset + 1, (1,), self.narrow_dtype)
        return (
            AgentGroup("wide", ("w0",), Box(0, 9, (1,)), Discrete(9)),
            AgentGroup("narrow", ("n0",), narrow, Discrete(2)),
        )

    @property
    def default_params(self):
        return _LastParams()

    def reset_world(self, key, params):
        return _LastState(jnp.zeros((), jnp.int32), jnp.zeros((2,), jnp.int32))

    def step_world(self, key, state, action, params):
        return _LastState(state.time + 1, action.astype(jnp.int32)), None

    def group_obs(self, group, agent_id, own, state, params):
        v = state.last[agent_id][None]
        if group == "narrow":
            return (self.offset + v).astype(self.narrow_dtype)
        return v.astype(jnp.float32)

    def agent_reward(self, agent_id, own, state, shared, params):
        return jnp.float32(0)


@dataclasses.dataclass(frozen=True)
class IntNarrow(LastAction):
    narrow_dtype: ClassVar = np.int32
    offset: ClassVar[int] = 40


def test_check_env_acts_in_each_groups_own_action_space():
    # a draw from the carrier Discrete(9) would give n0 actions 2..8, outside Discrete(2)
    report = js.check_env(LastAction(), raise_on_error=False)
    assert report.problems == []
    layout = LastAction().agent_layout
    drawn = np.asarray(layout.sample_actions(jax.random.PRNGKey(0), (2000,)))
    assert drawn.shape == (2000, 2)
    assert set(drawn[:, 0].tolist()) == set(range(9)) and set(drawn[:, 1].tolist()) == {0, 1}


def test_normalizing_an_int_groups_observations_is_refused_everywhere():
    # the normalized floats would be cast back to the int group's dtype on unpacking
    env = IntNarrow()
    layout = env.agent_layout
    assert layout.observation_space.dtype == np.float32  # int32 with float32 groups
    norm = (js.transforms.NormalizeObservation(),)
    pols = {g.name: js.RandomPolicy(g.observation_space, g.action_space) for g in layout.groups}
    match = r"agent groups \['narrow'\] whose observations are \['int32'\]"
    with pytest.raises(ValueError, match=match):
        js.policies.MultiAgentPolicy(
            env, pols, lambda aid: layout.group_of(aid).name, transforms=norm
        )
    pol = js.policies.MultiAgentPolicy(env, pols, lambda aid: layout.group_of(aid).name)
    with pytest.raises(ValueError, match=match):
        js.make_rollout(env, pol, 2, 2, transforms=norm)
    with pytest.raises(ValueError, match=match):
        js.Sampler(env, pol, num_envs=2, rollout_length=2, transforms=norm)
    # groups all in the carrier's dtype normalize, on every path alike
    float_env = LastAction()
    fpols = {
        g.name: js.RandomPolicy(g.observation_space, g.action_space)
        for g in float_env.agent_layout.groups
    }
    fpol = js.policies.MultiAgentPolicy(
        float_env, fpols, lambda aid: float_env.agent_layout.group_of(aid).name
    )
    sampler = js.Sampler(float_env, fpol, num_envs=2, rollout_length=3, transforms=norm)
    batch = sampler.sample_batch({"wide": (), "narrow": ()})
    assert batch["narrow"]["obs"].shape[1:] == (1,)
