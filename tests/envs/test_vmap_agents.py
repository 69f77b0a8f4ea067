"""The multi-agent envs written on ``MultiAgentEnv`` (per-agent logic lifted with
``vector.vmap_agents``) give bit for bit what their earlier whole-array versions gave.

``tests/data/ma_envs_recorded.npz`` holds rollouts (random policy, auto-reset included)
recorded from the whole-array implementations before they were rewritten; running this
file as a script records them again from whatever the envs are now.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import jaxsampler as js
from jaxsampler import vector
from jaxsampler.envs.base import MultiAgentEnv
from jaxsampler.envs.goals import Goals
from jaxsampler.envs.spread import Spread
from jaxsampler.envs.tictactoe import TicTacToe
from jaxsampler.spaces import Box, Discrete
from tests import full_opt

RECORDED = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "ma_envs_recorded.npz"
CASES = {
    "spread3": lambda: Spread(n=3),
    "spread8": lambda: Spread(n=8),
    "goals1": lambda: Goals(n=1),
    "goals4": lambda: Goals(n=4),
    "tictactoe": lambda: TicTacToe(),
}
E, T = 8, 60


def run(name: str) -> dict[str, np.ndarray]:
    """A jitted random-policy rollout of case ``name``: every buffer and the final state."""
    env = CASES[name]()
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    rollout = js.make_rollout(env, pol, E, T)
    state, traj = jax.jit(rollout)((), rollout.init(jax.random.PRNGKey(7)))
    leaves = jax.tree_util.tree_leaves_with_path((traj, state.env_state, state.obs))
    return {f"{name}{jax.tree_util.keystr(p)}": np.asarray(x) for p, x in leaves}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rollout_is_bit_identical_to_the_whole_array_version(name, request):
    if full_opt.fast_compile():  # the recording was made with XLA's default optimization
        full_opt.rerun_with_full_optimization(request.node.nodeid)
        return
    recorded = np.load(RECORDED)
    now = run(name)
    expected = sorted(k for k in recorded.files if k.startswith(name + "["))
    assert sorted(now) == expected
    for key in expected:
        np.testing.assert_array_equal(now[key], recorded[key], err_msg=key)
    assert any(v.any() for k, v in now.items() if "rewards" in k)


@struct.dataclass
class RelayState:
    score: jax.Array  # float32[3], each agent's running total
    done: jax.Array  # bool[3], sticky
    time: jax.Array  # int32[]


@struct.dataclass
class RelayParams:
    max_steps_in_episode: int = 10


@dataclasses.dataclass(frozen=True)
class Relay(MultiAgentEnv):
    """3 agents. Agent ``i`` earns ``(i + 1) * action``; it terminates once ``time > i``;
    its observation is ``[i, time, own score]``. The per-agent functions assert that they
    see one agent (a scalar id), so only the base class's lifting can batch them."""

    num_agents: ClassVar[int] = 3

    @property
    def default_params(self) -> RelayParams:
        return RelayParams()

    @property
    def observation_space(self) -> Box:
        return Box(-np.inf, np.inf, (3,), np.float32)

    @property
    def action_space(self) -> Discrete:
        return Discrete(2)

    def reset_world(self, key, params):
        return RelayState(jnp.zeros(3, jnp.float32), jnp.zeros(3, bool), jnp.zeros((), jnp.int32))

    def step_world(self, key, state, action, params):
        gain = jnp.where(state.done, 0.0, (jnp.arange(3) + 1.0) * action)
        time = state.time + 1
        done = state.done | (time > jnp.arange(3))
        return RelayState(state.score + gain, done, time), gain

    def agent_rows(self, state):
        return state.score, state.done

    def agent_obs(self, agent_id, own, state, params):
        assert agent_id.shape == () and own[0].shape == ()
        return jnp.stack([agent_id.astype(jnp.float32), state.time.astype(jnp.float32), own[0]])

    def agent_reward(self, agent_id, own, state, shared, params):
        return shared[agent_id]

    def agent_terminated(self, agent_id, own, state, params):
        return own[1]


def test_multi_agent_env_lifts_one_agent_functions_with_vmap_agents(monkeypatch):
    lifted = []
    real = vector.vmap_agents
    monkeypatch.setattr(vector, "vmap_agents", lambda *a, **k: lifted.append(1) or real(*a, **k))
    env = Relay()
    s, ts = env.reset(jax.random.PRNGKey(0))
    assert lifted, "the base class lifts through vector.vmap_agents"
    np.testing.assert_array_equal(ts.obs, [[0, 0, 0], [1, 0, 0], [2, 0, 0]])
    assert ts.acting.all() and not (ts.terminated | ts.truncated).any()
    step = jax.jit(env.step)
    s, ts = step(jax.random.PRNGKey(1), s, jnp.array([1, 1, 0]))
    np.testing.assert_array_equal(ts.reward, [1.0, 2.0, 0.0])
    np.testing.assert_array_equal(ts.obs[:, 2], [1.0, 2.0, 0.0])
    np.testing.assert_array_equal(ts.terminated, [True, False, False])
    np.testing.assert_array_equal(ts.acting, [False, True, True])  # default: not done
    eager = env.step(jax.random.PRNGKey(2), s, jnp.array([1, 1, 1]))
    s, ts = step(jax.random.PRNGKey(2), s, jnp.array([1, 1, 1]))
    assert all(
        np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves((s, ts)), strict=True)
    )
    np.testing.assert_array_equal(ts.reward, [0.0, 2.0, 3.0])  # a done agent earns nothing
    assert not ts.truncated.any()  # default truncation: time >= max_steps_in_episode
    report = js.check_env(env, num_envs=4)
    assert report.ok, str(report)


if __name__ == "__main__":
    np.savez_compressed(RECORDED, **{k: v for name in CASES for k, v in run(name).items()})
