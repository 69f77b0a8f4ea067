"""GroupLayout and GroupedMultiAgentEnv: carrier spaces, slots, packing, refusals."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsampler.envs.base import GroupedMultiAgentEnv
from jaxsampler.envs.groups import AgentGroup, GroupLayout
from jaxsampler.spaces import Box, Discrete, MultiDiscrete

# A 2-D observation (2 x 3 = 6 values) next to a flat one of 4 values, in another dtype.
SCOUT_OBS = Box(np.arange(-6, 0).reshape(2, 3), np.arange(1, 7).reshape(2, 3), (2, 3), np.float32)
TANK_OBS = Box(np.array([-10, 0, -1, 0]), np.array([0, 10, 1, 100]), (4,), np.int8)
SCOUTS = AgentGroup("scout", ("s0", "s1", "s2"), SCOUT_OBS, Discrete(3))
TANKS = AgentGroup("tank", ("t0", "t1"), TANK_OBS, Discrete(7))


def layout() -> GroupLayout:
    return GroupLayout([SCOUTS, TANKS])


def test_carrier_spaces_hold_every_group():
    lay = layout()
    obs = lay.observation_space
    assert isinstance(obs, Box) and obs.shape == (6,) and obs.dtype == np.float32
    # Element-wise the widest bounds; a group without value at an index contributes 0.
    np.testing.assert_array_equal(obs.low, [-10, -5, -4, -3, -2, -1])
    np.testing.assert_array_equal(obs.high, [1, 10, 3, 100, 5, 6])
    assert lay.action_space == Discrete(7)
    assert lay.num_agents == 5 and lay.agent_ids == ("s0", "s1", "s2", "t0", "t1")
    assert lay.slots("scout") == (0, 3) and lay.slots("tank") == (3, 5)
    assert lay.group_of("t1") is TANKS and lay.group("scout") is SCOUTS
    assert lay.observation_spaces == {
        **dict.fromkeys(SCOUTS.agent_ids, SCOUT_OBS),
        "t0": TANK_OBS,
        "t1": TANK_OBS,
    }
    assert lay.action_spaces["s2"] == Discrete(3) and lay.action_spaces["t0"] == Discrete(7)
    assert not lay.identity
    assert "scout: 3" in repr(lay)


def test_int32_and_float32_groups_get_a_float32_carrier():
    # numpy promotes int32 with float32 to float64, which JAX (without x64) holds as float32
    ints = AgentGroup("ints", ("i0",), Box(0, 9, (2,), np.int32), Discrete(2))
    floats = AgentGroup("floats", ("f0",), Box(-1, 1, (3,)), Discrete(2))
    assert GroupLayout([ints, floats]).observation_space.dtype == np.float32
    wide = AgentGroup("wide", ("w0",), Box(-1, 1, (3,), np.float64), Discrete(2))
    assert GroupLayout([ints, wide]).observation_space.dtype == np.float64
    # int32 with uint32 promotes to int64: int32 too, for observations and Discrete actions
    uints = AgentGroup("u", ("u0",), Box(0, 9, (2,), np.uint32), Discrete(3, dtype=np.uint32))
    both = GroupLayout([ints, uints])
    assert both.observation_space.dtype == np.int32 and both.action_space.dtype == np.int32


def test_box_action_carrier():
    a = AgentGroup("a", ("a0",), Box(-1, 1, (2,)), Box(-1, 1, (3,)))
    b = AgentGroup("b", ("b0",), Box(-1, 1, (2,)), Box(np.array([0, -5]), np.array([2, 0]), (2,)))
    lay = GroupLayout([a, b])
    act = lay.action_space
    assert isinstance(act, Box) and act.shape == (3,)
    np.testing.assert_array_equal(act.low, [-1, -5, -1])
    np.testing.assert_array_equal(act.high, [2, 1, 1])
    x = np.array([[1.5, -4.0], [0.5, -0.5]], np.float32)
    packed = lay.pack_action("b", x)
    np.testing.assert_array_equal(packed, [[1.5, -4.0, 0.0], [0.5, -0.5, 0.0]])
    np.testing.assert_array_equal(lay.unpack_action("b", packed), x)
    np.testing.assert_array_equal(lay.unpack_agent_action("b0", packed), x)


def test_identical_groups_are_an_identity_layout():
    s = Box(-1, 1, (3,))
    lay = GroupLayout(
        [AgentGroup("a", ("x",), s, Discrete(2)), AgentGroup("b", ("y",), s, Discrete(2))]
    )
    assert lay.identity and lay.observation_space == s and lay.action_space == Discrete(2)


@pytest.mark.parametrize("xp", [np, jnp], ids=["numpy", "jax"])
def test_pack_unpack_round_trip_with_zero_padding(xp):
    lay = layout()
    rng = np.random.default_rng(0)
    scouts = xp.asarray(rng.uniform(-3, 3, (4, 3, 2, 3)).astype(np.float32))  # [E, A_g, 2, 3]
    tanks = xp.asarray(rng.integers(-10, 10, (4, 2, 4)).astype(np.int8))
    p_s, p_t = lay.pack_obs("scout", scouts), lay.pack_obs("tank", tanks)
    for packed in (p_s, p_t):
        assert type(packed) is type(scouts)  # numpy stays numpy, jax stays jax
        assert packed.dtype == np.float32
    assert p_s.shape == (4, 3, 6) and p_t.shape == (4, 2, 6)
    np.testing.assert_array_equal(np.asarray(p_s), np.asarray(scouts).reshape(4, 3, 6))
    np.testing.assert_array_equal(np.asarray(p_t)[..., :4], np.asarray(tanks))
    np.testing.assert_array_equal(np.asarray(p_t)[..., 4:], 0.0)  # padding
    back_s, back_t = lay.unpack_obs("scout", p_s), lay.unpack_obs("tank", p_t)
    assert back_s.shape == (4, 3, 2, 3) and back_t.dtype == np.int8
    np.testing.assert_array_equal(np.asarray(back_s), np.asarray(scouts))
    np.testing.assert_array_equal(np.asarray(back_t), np.asarray(tanks))
    np.testing.assert_array_equal(np.asarray(lay.unpack_agent_obs("t1", p_t)), np.asarray(tanks))
    # Discrete actions travel as themselves, in the carrier's dtype.
    acts = xp.asarray(np.array([[0, 6], [3, 1]], np.int32))
    np.testing.assert_array_equal(np.asarray(lay.pack_action("tank", acts)), np.asarray(acts))
    np.testing.assert_array_equal(np.asarray(lay.unpack_action("tank", acts)), np.asarray(acts))


def test_packing_traces_under_jit():
    lay = layout()
    x = jnp.ones((3, 2, 3), jnp.float32)
    out = jax.jit(lambda v: lay.unpack_obs("scout", lay.pack_obs("scout", v)))(x)
    np.testing.assert_array_equal(out, x)


def test_layouts_compare_and_hash_by_their_groups():
    assert layout() == layout() and hash(layout()) == hash(layout())
    assert layout() != GroupLayout([TANKS, SCOUTS])
    assert GroupLayout([TANKS, SCOUTS]).slots("tank") == (0, 2)  # declared order


@pytest.mark.parametrize(
    ("groups", "error", "match"),
    [
        ([], ValueError, "at least one group"),
        ([SCOUTS, dataclasses.replace(TANKS, name="scout")], ValueError, "names repeat"),
        ([SCOUTS, dataclasses.replace(TANKS, agent_ids=("t0", "s1"))], ValueError, "ids repeat"),
        (
            [dataclasses.replace(SCOUTS, observation_space=Discrete(4)), TANKS],
            TypeError,
            "'scout'.*not a Box",
        ),
        (
            [SCOUTS, dataclasses.replace(TANKS, action_space=Box(-1, 1, (2,)))],
            TypeError,
            "all Discrete or all Box",
        ),
        (
            [SCOUTS, dataclasses.replace(TANKS, action_space=Discrete(4, start=1))],
            ValueError,
            "'tank'.*start at 0",
        ),
        (
            [dataclasses.replace(SCOUTS, action_space=MultiDiscrete([2, 2])), TANKS],
            TypeError,
            "all Discrete or all Box",
        ),
    ],
    ids=["no groups", "names", "ids", "obs not Box", "mixed actions", "start", "multidiscrete"],
)
def test_bad_groups_are_refused(groups, error, match):
    with pytest.raises(error, match=match):
        GroupLayout(groups)


def test_an_empty_group_and_unknown_names_are_refused():
    with pytest.raises(ValueError, match="'empty' has no agents"):
        AgentGroup("empty", (), SCOUT_OBS, Discrete(2))
    with pytest.raises(KeyError, match="no agent group 'tanks'"):
        layout().slots("tanks")
    with pytest.raises(KeyError, match="no agent 'x'"):
        layout().group_of("x")


@dataclasses.dataclass(frozen=True)
class TwoGroups(GroupedMultiAgentEnv):
    """Scouts see their index and the tanks' summed action; tanks see their own slot."""

    num_agents: ClassVar[int] = 5

    @property
    def agent_groups(self):
        return (SCOUTS, TANKS)

    @property
    def default_params(self):
        return None

    def reset_world(self, key, params):
        return jnp.zeros((), jnp.float32)

    def step_world(self, key, state, action, params):
        acts = self.group_actions(action)
        assert acts["scout"].shape == (3,) and acts["tank"].shape == (2,)
        return state + jnp.sum(acts["tank"]).astype(jnp.float32), ()

    def group_obs(self, group, agent_id, own, state, params):
        if group == "scout":
            return jnp.full((2, 3), state + agent_id, jnp.float32)
        return jnp.stack([-agent_id, agent_id, 0 * agent_id, agent_id]).astype(jnp.int8)

    def agent_reward(self, agent_id, own, state, shared, params):
        return jnp.zeros((), jnp.float32)

    def agent_truncated(self, agent_id, own, state, params):
        return jnp.zeros((), jnp.bool_)


def test_grouped_env_packs_each_group_and_splits_actions():
    env = TwoGroups()
    assert env.agent_layout == layout() and env.agent_ids == layout().agent_ids
    assert env.observation_space == layout().observation_space
    assert env.action_space == Discrete(7)
    assert env.observation_spaces["t0"] == TANK_OBS and env.action_spaces["s0"] == Discrete(3)
    s, ts = jax.jit(env.reset)(jax.random.PRNGKey(0))
    s, ts = jax.jit(env.step)(jax.random.PRNGKey(1), s, jnp.array([2, 2, 2, 6, 5], jnp.int32))
    obs = np.asarray(ts.obs)
    assert obs.shape == (5, 6) and float(s) == 11.0
    np.testing.assert_array_equal(
        obs[:3], np.repeat(11.0 + np.arange(3)[:, None], 6, 1)
    )  # scouts: state + id
    np.testing.assert_array_equal(obs[3:], [[-3, 3, 0, 3, 0, 0], [-4, 4, 0, 4, 0, 0]])


def test_grouped_env_with_the_wrong_agent_count_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Miscounted(TwoGroups):
        num_agents: ClassVar[int] = 4

    with pytest.raises(ValueError, match="num_agents is 4 but its agent groups list 5"):
        _ = Miscounted().agent_layout
