"""The multi-agent envs written on ``MultiAgentEnv`` (per-agent logic lifted with
``vector.vmap_agents``) give bit for bit what their earlier whole-array versions gave.

``tests/data/ma_envs_recorded.npz`` holds rollouts (random policy, auto-reset included)
recorded from the whole-array implementations before they were rewritten; running this
file as a script records them again from whatever the envs are now.
"""

from __future__ import annotations

import pathlib

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.envs.goals import Goals
from jaxsampler.envs.spread import Spread
from jaxsampler.envs.tictactoe import TicTacToe

RECORDED = pathlib.Path(__file__).parent / "data" / "ma_envs_recorded.npz"
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
def test_rollout_is_bit_identical_to_the_whole_array_version(name):
    recorded = np.load(RECORDED)
    now = run(name)
    expected = sorted(k for k in recorded.files if k.startswith(name + "["))
    assert sorted(now) == expected
    for key in expected:
        np.testing.assert_array_equal(now[key], recorded[key], err_msg=key)
    assert any(v.any() for k, v in now.items() if "rewards" in k)


if __name__ == "__main__":
    np.savez_compressed(RECORDED, **{k: v for name in CASES for k, v in run(name).items()})
