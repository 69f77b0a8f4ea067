"""MultiAgentPolicy: static agent -> policy mapping, several policies in one jitted step."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.envs.spread import Spread
from jaxsampler.policies.base import NoState, Policy
from jaxsampler.spaces import Box, Discrete


@dataclasses.dataclass(frozen=True)
class TagPolicy(Policy):
    """action = params["action"]; extras["tag"] = params["tag"]; extras["width"] = the
    number of agents it was called on."""

    observation_space: Box
    action_space: Discrete
    extra_key: str = "tag"

    def init(self, key):
        return {"action": jnp.int32(0), "tag": jnp.float32(0.0)}

    def __call__(self, params, obs, key, state):
        batch = obs.shape[:2]
        action = jnp.full(batch, params["action"], jnp.int32)
        return (
            action,
            {
                self.extra_key: jnp.full(batch, params["tag"], jnp.float32),
                "width": jnp.full(batch, batch[1], jnp.float32),
            },
            state,
        )


ENV = Spread(4)
OBS, ACT = ENV.observation_space, ENV.action_space


def red_blue(aid: str) -> str:
    return "red" if aid in ("agent_0", "agent_2") else "blue"


def test_each_agent_acts_with_its_own_policy_on_only_its_agents():
    pol = js.policies.MultiAgentPolicy(
        ENV, {"red": TagPolicy(OBS, ACT), "blue": TagPolicy(OBS, ACT)}, red_blue
    )
    assert pol.agent_policy == ("red", "blue", "red", "blue")
    params = {
        "red": {"action": jnp.int32(3), "tag": jnp.float32(1.5)},
        "blue": {"action": jnp.int32(1), "tag": jnp.float32(-2.0)},
    }
    rollout = jax.jit(js.make_rollout(ENV, pol, num_envs=3, rollout_length=4))
    state = js.init_rollout_state(ENV, pol, 3, jax.random.PRNGKey(0))
    _, traj = rollout(params, state)
    np.testing.assert_array_equal(np.asarray(traj.actions[0, 0]), [3, 1, 3, 1])
    np.testing.assert_array_equal(
        np.asarray(traj.extras["tag"][:, :, :]), np.broadcast_to([1.5, -2.0, 1.5, -2.0], (4, 3, 4))
    )
    # Each policy saw exactly its 2 agents (not all 4).
    np.testing.assert_array_equal(np.asarray(traj.extras["width"]), 2.0)


def test_mlp_policies_match_calling_each_on_its_agents():
    mlp = js.MLPPolicy(OBS, ACT, hidden_sizes=(8,))
    pol = js.policies.MultiAgentPolicy(ENV, {"red": mlp, "blue": mlp}, red_blue)
    params = pol.init(jax.random.PRNGKey(1))
    assert set(params) == {"red", "blue"}
    obs = jax.random.normal(jax.random.PRNGKey(2), (5, 4) + OBS.shape)
    key = jax.random.PRNGKey(3)
    action, extras, _ = pol(params, obs, key, pol.initial_state((5, 4)))
    k_red, k_blue = jax.random.split(key, 2)
    a_red, x_red, _ = mlp(params["red"], obs[:, [0, 2]], k_red, NoState())
    a_blue, x_blue, _ = mlp(params["blue"], obs[:, [1, 3]], k_blue, NoState())
    np.testing.assert_array_equal(np.asarray(action)[:, [0, 2]], np.asarray(a_red))
    np.testing.assert_array_equal(np.asarray(action)[:, [1, 3]], np.asarray(a_blue))
    np.testing.assert_allclose(
        np.asarray(extras["vf_preds"])[:, [1, 3]], np.asarray(x_blue["vf_preds"]), rtol=1e-6
    )
    np.testing.assert_allclose(
        np.asarray(extras["action_logp"])[:, [0, 2]], np.asarray(x_red["action_logp"]), rtol=1e-6
    )
    # RLlib's action_dist_inputs pass through, each agent's from its own policy.
    assert extras["action_dist_inputs"].shape == (5, 4, ACT.n)
    np.testing.assert_allclose(
        np.asarray(extras["action_dist_inputs"])[:, [0, 2]],
        np.asarray(x_red["action_dist_inputs"]),
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        np.asarray(extras["action_dist_inputs"])[:, [1, 3]],
        np.asarray(x_blue["action_dist_inputs"]),
        rtol=1e-6,
    )


def test_missing_extras_are_zero_for_the_other_policy():
    pol = js.policies.MultiAgentPolicy(
        ENV,
        {"a": TagPolicy(OBS, ACT, "x"), "b": TagPolicy(OBS, ACT, "y")},
        lambda aid: "a" if aid == "agent_3" else "b",
    )
    params = {
        "a": {"action": jnp.int32(0), "tag": jnp.float32(7.0)},
        "b": {"action": jnp.int32(2), "tag": jnp.float32(5.0)},
    }
    action, extras, _ = pol(
        params, jnp.zeros((2, 4) + OBS.shape), jax.random.PRNGKey(0), pol.initial_state((2, 4))
    )
    np.testing.assert_array_equal(np.asarray(action[0]), [2, 2, 2, 0])
    np.testing.assert_array_equal(np.asarray(extras["x"][0]), [0, 0, 0, 7])
    np.testing.assert_array_equal(np.asarray(extras["y"][0]), [5, 5, 5, 0])


def test_single_policy_default_mapping():
    pol = js.policies.MultiAgentPolicy(ENV, {"shared": js.MLPPolicy(OBS, ACT, hidden_sizes=(8,))})
    assert pol.agent_policy == ("shared",) * 4
    assert pol.policy_mapping_fn("agent_2") == "shared"
    assert hash(pol) == hash(
        js.policies.MultiAgentPolicy(ENV, {"shared": js.MLPPolicy(OBS, ACT, hidden_sizes=(8,))})
    )


def rllib_red_blue(agent_id, episode, **kwargs):
    assert episode is None and not kwargs  # static mapping: no episode at construction
    return "red" if agent_id in ("agent_0", "agent_2") else "blue"


class Mapper:
    def __call__(self, agent_id, episode=None, *, worker=None):
        return red_blue(agent_id)


@pytest.mark.parametrize(
    "mapping_fn",
    [red_blue, rllib_red_blue, lambda aid, ep, **kw: red_blue(aid), Mapper()],
    ids=["one-arg", "rllib", "rllib-lambda", "callable-object"],
)
def test_rllib_and_one_argument_mapping_functions(mapping_fn):
    mlp = js.MLPPolicy(OBS, ACT, hidden_sizes=(8,))
    pol = js.policies.MultiAgentPolicy(ENV, {"red": mlp, "blue": mlp}, mapping_fn)
    assert pol.agent_policy == ("red", "blue", "red", "blue")
    assert pol.policy_mapping_fn("agent_1", None) == pol.policy_mapping_fn("agent_1") == "blue"


@pytest.mark.parametrize(
    "mapping_fn",
    [lambda: "red", lambda aid, ep, worker: "red", lambda *, agent_id: "red", "red"],
    ids=["no-args", "three-required", "keyword-only", "not-callable"],
)
def test_mapping_function_of_neither_signature_is_a_clear_error(mapping_fn):
    mlp = js.MLPPolicy(OBS, ACT, hidden_sizes=(8,))
    with pytest.raises(TypeError, match=r"policy_mapping_fn .*(must take RLlib|callable)"):
        js.policies.MultiAgentPolicy(ENV, {"red": mlp}, mapping_fn)


def test_bad_input_is_rejected_with_clear_errors():
    mlp = js.MLPPolicy(OBS, ACT, hidden_sizes=(8,))
    with pytest.raises(ValueError, match="unknown policy id 'green'"):
        js.policies.MultiAgentPolicy(ENV, {"red": mlp}, lambda aid: "green")
    with pytest.raises(ValueError, match="need a policy_mapping_fn"):
        js.policies.MultiAgentPolicy(ENV, {"red": mlp, "blue": mlp})
    with pytest.raises(ValueError, match="non-empty"):
        js.policies.MultiAgentPolicy(ENV, {})
    with pytest.raises(ValueError, match="observation space"):
        js.policies.MultiAgentPolicy(
            ENV, {"red": js.MLPPolicy(Box(-1, 1, (3,)), ACT)}, lambda aid: "red"
        )
    with pytest.raises(TypeError, match="not a jaxsampler Policy"):
        js.policies.MultiAgentPolicy(ENV, {"red": object()}, lambda aid: "red")
    # Built for other agent ids than the env's.
    pol = js.policies.MultiAgentPolicy(("a", "b", "c", "d"), {"red": mlp}, lambda aid: "red")
    with pytest.raises(ValueError, match="mismatched agent ids"):
        js.make_rollout(ENV, pol, num_envs=2, rollout_length=2)
    good = js.policies.MultiAgentPolicy(ENV, {"red": mlp, "blue": mlp}, red_blue)
    with pytest.raises(KeyError, match="no entry for policies"):
        good(
            {"red": mlp.init(jax.random.PRNGKey(0))},
            jnp.zeros((1, 4) + OBS.shape),
            jax.random.PRNGKey(0),
            good.initial_state((1, 4)),
        )
