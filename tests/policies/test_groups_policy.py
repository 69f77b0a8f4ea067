"""Policies mapped to agent groups: each policy runs on its group's own spaces, unpacked from
and packed back into the carrier rows; the random policy draws from each group's own space."""

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
from jaxsampler.envs.spread import Spread
from jaxsampler.policies import MultiAgentPolicy, NoState, RandomPolicy
from jaxsampler.policies.groups import unpad_extra
from jaxsampler.policies.multi import random_policy
from jaxsampler.spaces import Box, Discrete

HUNTER_OBS, HUNTER_ACT = Box(-50.0, 50.0, (2, 3)), Discrete(5)
RUNNER_OBS, RUNNER_ACT = Box(-50.0, 50.0, (4,)), Discrete(9)


@struct.dataclass
class GState:
    pos: jax.Array  # float32[A]
    last: jax.Array  # float32[A], each agent's last own action
    time: jax.Array  # int32[]


@struct.dataclass
class GParams:
    max_steps_in_episode: int = 6


@dataclasses.dataclass(frozen=True)
class HuntersAndRunner(GroupedMultiAgentEnv):
    """Two hunters (obs (2, 3), Discrete(5)) and a runner (obs (4,), Discrete(9)) on a line;
    each moves by its own action, observations show positions, the clock and last actions."""

    num_agents: ClassVar[int] = 3

    @property
    def agent_groups(self) -> tuple[AgentGroup, ...]:
        return (
            AgentGroup("hunter", ("hunter_0", "hunter_1"), HUNTER_OBS, HUNTER_ACT),
            AgentGroup("runner", ("runner_0",), RUNNER_OBS, RUNNER_ACT),
        )

    @property
    def default_params(self) -> GParams:
        return GParams()

    def reset_world(self, key, params):
        pos = jax.random.uniform(key, (3,), jnp.float32, -1.0, 1.0)
        return GState(pos, jnp.zeros((3,), jnp.float32), jnp.int32(0))

    def step_world(self, key, state, action, params):
        acts = self.group_actions(action)
        hunter = (acts["hunter"] - 2).astype(jnp.float32) * 0.1
        runner = (acts["runner"] - 4).astype(jnp.float32) * 0.05
        last = jnp.concatenate([acts["hunter"], acts["runner"]]).astype(jnp.float32)
        pos = state.pos + jnp.concatenate([hunter, runner])
        return GState(pos, last, state.time + 1), ()

    def agent_rows(self, state):
        return (state.pos, state.last)

    def group_obs(self, group, agent_id, own, state, params):
        pos, last = own
        t = state.time.astype(jnp.float32)
        if group == "hunter":
            return jnp.stack(
                [jnp.full((3,), pos), jnp.stack([t, agent_id.astype(jnp.float32), last])]
            )
        return jnp.stack([pos, jnp.mean(state.pos), t, last])

    def agent_reward(self, agent_id, own, state, shared, params):
        return -jnp.abs(own[0])


ENV = HuntersAndRunner()
GROUP_OF = {"hunter_0": "hunter", "hunter_1": "hunter", "runner_0": "runner"}
HUNTER_MLP = js.MLPPolicy(HUNTER_OBS, HUNTER_ACT, hidden_sizes=(8,))
RUNNER_MLP = js.MLPPolicy(RUNNER_OBS, RUNNER_ACT, hidden_sizes=(8,))


def by_group(agent_id: str) -> str:
    return GROUP_OF[agent_id]


def group_policy() -> MultiAgentPolicy:
    return MultiAgentPolicy(ENV, {"hunter": HUNTER_MLP, "runner": RUNNER_MLP}, by_group)


def hand_unpack(carrier_obs):
    """The carrier rows [..., 3, 6] cut by hand into each group's own observations."""
    x = np.asarray(carrier_obs)
    return x[..., :2, :6].reshape(*x.shape[:-2], 2, 2, 3), x[..., 2:, :4]


def run(pol, params, num_envs=4, length=12, seed=0):
    rollout = jax.jit(js.make_rollout(ENV, pol, num_envs=num_envs, rollout_length=length))
    state = js.init_rollout_state(ENV, pol, num_envs, jax.random.PRNGKey(seed))
    return rollout(params, state)[1]


def test_env_carries_the_groups_in_padded_rows():
    layout = ENV.agent_layout
    assert layout.observation_space.shape == (6,)
    assert layout.action_space == Discrete(9)
    _, ts = ENV.reset(jax.random.PRNGKey(0))
    hunters, runner = hand_unpack(ts.obs)
    np.testing.assert_array_equal(np.asarray(ts.obs)[2, 4:], 0.0)
    assert hunters.shape == (2, 2, 3) and runner.shape == (1, 4)


def test_each_policy_is_built_for_its_groups_spaces_and_the_params_show_it():
    pol = group_policy()
    assert pol.policy_groups == ("hunter", "runner")
    assert pol.observation_space == ENV.observation_space
    assert pol.action_space == ENV.action_space
    params = pol.init(jax.random.PRNGKey(0))
    hunter, runner = params["hunter"]["params"], params["runner"]["params"]
    assert hunter["actor_0"]["kernel"].shape == (6, 8)  # 2 x 3 observation, flattened
    assert hunter["actor_out"]["kernel"].shape == (8, 5)
    assert runner["actor_0"]["kernel"].shape == (4, 8)
    assert runner["actor_out"]["kernel"].shape == (8, 9)


def test_rollout_matches_each_group_policy_applied_by_hand_to_its_own_rows():
    pol = group_policy()
    params = pol.init(jax.random.PRNGKey(1))
    traj = run(pol, params, num_envs=4, length=12)
    actions = np.asarray(traj.actions)  # [T, E, 3]
    assert actions.shape == (12, 4, 3)
    assert actions[..., :2].min() >= 0 and actions[..., :2].max() < 5
    assert actions[..., 2].min() >= 0 and actions[..., 2].max() < 9
    assert actions[..., 2].max() >= 5  # the runner uses its wider range
    # The env saw each agent's own action (its observation reports the last one).
    obs = np.asarray(traj.obs)
    hunters, runner = hand_unpack(obs[1:])
    reset = np.asarray(traj.is_reset)
    fresh = ~reset  # a step that acted (not a reset step) leads to obs[t + 1]
    np.testing.assert_array_equal(hunters[..., 1, 2][fresh], actions[..., :2][fresh])
    np.testing.assert_array_equal(runner[..., 0, 3][fresh], actions[..., 2][fresh])
    # The network outputs recorded at every step are each group's MLP on its own rows.
    hunters_t, runner_t = hand_unpack(obs[:-1])
    logits_h, value_h, _ = HUNTER_MLP.forward(params["hunter"], jnp.asarray(hunters_t))
    logits_r, value_r, _ = RUNNER_MLP.forward(params["runner"], jnp.asarray(runner_t))
    dist = np.asarray(traj.extras["action_dist_inputs"])
    assert dist.shape == (12, 4, 3, 9)
    np.testing.assert_allclose(dist[..., :2, :5], logits_h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dist[..., 2:, :], logits_r, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(dist[..., :2, 5:], 0.0)  # padded beyond the hunters' 5
    values = np.asarray(traj.extras["vf_preds"])
    np.testing.assert_allclose(values[..., :2], value_h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(values[..., 2:], value_r, rtol=1e-5, atol=1e-6)
    logp_h = jax.nn.log_softmax(logits_h)
    want = np.take_along_axis(np.asarray(logp_h), actions[..., :2, None], -1)[..., 0]
    np.testing.assert_allclose(traj.extras["action_logp"][..., :2], want, rtol=1e-5, atol=1e-5)


def test_step_equals_the_sub_policies_steps_with_the_same_keys():
    pol = group_policy()
    params = pol.init(jax.random.PRNGKey(2))
    obs = run(pol, params, num_envs=5, length=3).obs[2]  # [E, 3, 6] real carrier rows
    key = jax.random.PRNGKey(7)
    action, extras, _ = jax.jit(pol)(params, obs, key, pol.initial_state((5, 3)))
    k_h, k_r = jax.random.split(key, 2)
    hunters, runner = hand_unpack(obs)
    a_h, x_h, _ = HUNTER_MLP(params["hunter"], jnp.asarray(hunters), k_h, NoState())
    a_r, x_r, _ = RUNNER_MLP(params["runner"], jnp.asarray(runner), k_r, NoState())
    np.testing.assert_array_equal(action[:, :2], a_h)
    np.testing.assert_array_equal(action[:, 2:], a_r)
    assert action.dtype == ENV.action_space.dtype
    for k in ("action_logp", "vf_preds"):
        np.testing.assert_allclose(extras[k][:, :2], x_h[k], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(extras[k][:, 2:], x_r[k], rtol=1e-5, atol=1e-6)
    dist = extras["action_dist_inputs"]
    np.testing.assert_allclose(dist[:, :2, :5], x_h["action_dist_inputs"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(dist[:, :2, 5:], 0.0)
    np.testing.assert_allclose(dist[:, 2:], x_r["action_dist_inputs"], rtol=1e-5, atol=1e-6)
    # log_prob unpacks the carrier actions per policy, as the step does.
    logp = pol.log_prob(params, obs, action, pol.initial_state((5, 3)))
    want_h = HUNTER_MLP.log_prob(params["hunter"], jnp.asarray(hunters), a_h, NoState())
    want_r = RUNNER_MLP.log_prob(params["runner"], jnp.asarray(runner), a_r, NoState())
    np.testing.assert_allclose(logp[:, :2], want_h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logp[:, 2:], want_r, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logp, extras["action_logp"], rtol=1e-5, atol=1e-6)


def test_extra_shapes_give_each_policys_true_widths_to_cut_back_to():
    pol = group_policy()
    assert pol.extra_shapes == {
        "hunter": {"action_dist_inputs": (5,), "action_logp": (), "vf_preds": ()},
        "runner": {"action_dist_inputs": (9,), "action_logp": (), "vf_preds": ()},
    }
    per_agent = pol.agent_extra_shapes
    assert per_agent["hunter_1"]["action_dist_inputs"] == (5,)
    assert per_agent["runner_0"]["action_dist_inputs"] == (9,)
    padded = np.arange(2 * 3 * 9, dtype=np.float32).reshape(2, 3, 9)
    cut = unpad_extra(padded[:, 1], per_agent["hunter_1"]["action_dist_inputs"])
    np.testing.assert_array_equal(cut, padded[:, 1, :5])
    assert unpad_extra(padded[:, 2], (9,)).shape == (2, 9)
    assert unpad_extra(np.zeros((4,)), ()).shape == (4,)


def test_random_policy_draws_each_group_from_its_own_space_and_covers_it():
    pol = random_policy(ENV)
    assert isinstance(pol, MultiAgentPolicy) and pol.policy_groups == ("hunter", "runner")
    obs = jnp.zeros((2000, 3, 6), jnp.float32)
    action, extras, _ = jax.jit(pol)(
        pol.init(jax.random.PRNGKey(0)), obs, jax.random.PRNGKey(3), pol.initial_state((2000, 3))
    )
    action = np.asarray(action)
    assert extras == {}
    assert set(np.unique(action[:, :2])) == set(range(5))
    assert set(np.unique(action[:, 2])) == set(range(9))
    traj = run(pol, pol.init(jax.random.PRNGKey(0)), num_envs=8, length=20)
    acts = np.asarray(traj.actions)
    assert acts[..., :2].max() < 5 and acts[..., 2].max() < 9 and acts.min() >= 0


def test_random_policy_without_groups_is_the_plain_random_policy():
    env = Spread(3)
    assert random_policy(env) == RandomPolicy(env.observation_space, env.action_space)


def test_one_policy_over_the_carrier_plays_every_group_padded():
    carrier = js.MLPPolicy(ENV.observation_space, ENV.action_space, hidden_sizes=(8,))
    pol = MultiAgentPolicy(ENV, {"shared": carrier})
    assert pol.policy_groups == (None,)
    params = pol.init(jax.random.PRNGKey(0))
    traj = run(pol, params, num_envs=2, length=5)
    logits, _, _ = carrier.forward(params["shared"], traj.obs[:-1])
    np.testing.assert_allclose(traj.extras["action_dist_inputs"], logits, rtol=1e-5, atol=1e-6)
    # A carrier policy may also sit beside a group policy.
    mixed = MultiAgentPolicy(ENV, {"hunter": HUNTER_MLP, "runner": carrier}, by_group)
    assert mixed.policy_groups == ("hunter", None)
    run(mixed, mixed.init(jax.random.PRNGKey(1)), num_envs=2, length=3)


def test_a_policy_spanning_two_groups_is_refused_naming_agents_and_groups():
    with pytest.raises(ValueError) as err:
        MultiAgentPolicy(ENV, {"all": HUNTER_MLP})
    msg = str(err.value)
    assert "policy 'all'" in msg and "several agent groups" in msg
    for name in ("hunter", "runner", "hunter_0", "hunter_1", "runner_0"):
        assert repr(name) in msg


@pytest.mark.parametrize(
    "policy, group_space",
    [
        (js.MLPPolicy(RUNNER_OBS, HUNTER_ACT, hidden_sizes=(4,)), repr(HUNTER_OBS)),
        (js.MLPPolicy(HUNTER_OBS, Discrete(9), hidden_sizes=(4,)), repr(HUNTER_ACT)),
    ],
)
def test_a_policy_built_for_other_spaces_than_its_group_is_refused(policy, group_space):
    with pytest.raises(ValueError) as err:
        MultiAgentPolicy(ENV, {"hunter": policy, "runner": RUNNER_MLP}, by_group)
    msg = str(err.value)
    assert "agent group 'hunter'" in msg and "'hunter_0', 'hunter_1'" in msg
    assert group_space in msg
    assert repr(policy.observation_space) in msg and repr(policy.action_space) in msg


def test_transforms_that_change_the_spaces_are_refused_the_others_run():
    pol = group_policy()
    with pytest.raises(ValueError, match="agent groups.*FrameStack"):
        js.make_rollout(ENV, pol, 2, 3, transforms=(js.transforms.FrameStack(2),))
    with pytest.raises(ValueError, match="agent groups.*FrameStack"):
        MultiAgentPolicy(
            ENV,
            {"hunter": HUNTER_MLP, "runner": RUNNER_MLP},
            by_group,
            transforms=(js.transforms.FrameStack(2),),
        )
    keep = (js.transforms.NormalizeObservation(), js.transforms.ScaleReward(0.5))
    pol = MultiAgentPolicy(
        ENV, {"hunter": HUNTER_MLP, "runner": RUNNER_MLP}, by_group, transforms=keep
    )
    rollout = jax.jit(js.make_rollout(ENV, pol, 2, 4, transforms=keep))
    state = js.init_rollout_state(ENV, pol, 2, jax.random.PRNGKey(0), transforms=keep)
    _, traj = rollout(pol.init(jax.random.PRNGKey(0)), state)
    acts = np.asarray(traj.actions)
    assert acts[..., :2].max() < 5
    np.testing.assert_allclose(
        traj.rewards, 0.5 * np.asarray(traj.raw_rewards), rtol=1e-5, atol=1e-6
    )


def test_agent_ids_instead_of_the_env_point_to_the_groups():
    with pytest.raises(ValueError, match="declare agent groups in the env and pass the env"):
        MultiAgentPolicy(ENV.agent_ids, {"hunter": HUNTER_MLP, "runner": RUNNER_MLP}, by_group)


def test_command_line_random_policy_is_group_aware():
    from jaxsampler.cli.baseline import hand_unsupported
    from jaxsampler.cli.bench import _make_policy

    assert _make_policy(ENV, "random", (8,)) == random_policy(ENV)
    assert "agent groups" in str(hand_unsupported(ENV, "random"))
    assert hand_unsupported(ENV, "mlp") is None  # both loops run the MLP on the carrier


@dataclasses.dataclass(frozen=True)
class HuntersOnly(GroupedMultiAgentEnv):
    """One group whose (2, 3) observations ride a flat carrier (only its layout is used)."""

    num_agents: ClassVar[int] = 2

    @property
    def agent_groups(self) -> tuple[AgentGroup, ...]:
        return (AgentGroup("hunter", ("hunter_0", "hunter_1"), HUNTER_OBS, HUNTER_ACT),)


def test_one_group_policy_acting_on_rows_unpacks_like_the_step():
    env = HuntersOnly()
    pol = MultiAgentPolicy(env, {"hunter": HUNTER_MLP})
    assert pol.policy_groups == ("hunter",) and pol.acts_on_rows
    params = pol.init(jax.random.PRNGKey(0))
    obs = jax.random.normal(jax.random.PRNGKey(1), (4, 2, 6))
    rows = jnp.array([[0], [1], [1], [0]], jnp.int32)
    key = jax.random.PRNGKey(2)
    action, extras, _ = pol.act_on_rows(params, obs, key, pol.initial_state((4, 2)), rows)
    (k,) = jax.random.split(key, 1)
    own = jnp.asarray(np.asarray(obs).reshape(4, 2, 2, 3))
    want, want_x, _ = HUNTER_MLP.act_on_rows(params["hunter"], own, k, NoState(), rows)
    np.testing.assert_array_equal(action, want)
    np.testing.assert_allclose(extras["vf_preds"], want_x["vf_preds"], rtol=1e-5, atol=1e-6)
