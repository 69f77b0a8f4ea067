"""The built-in policies on 1-byte observations (e.g. ``js.make("gymnax:...",
compact_obs=True)``): the same params give exactly what they give on the float32 copies.

The reference is the same policy built for the float32 space of the same shape and
bounds, run on ``obs.astype(float32)``.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.spaces import Box, Discrete

SHAPE = (5, 5, 3)


def _obs(dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """(compact ``[2, 4, *SHAPE]`` 0/1 observations, their float32 copies)."""
    bits = jax.random.bernoulli(jax.random.PRNGKey(7), 0.4, (2, 4, *SHAPE))
    compact = np.asarray(bits).astype(dtype)
    return compact, compact.astype(np.float32)


def _policies(dtype: np.dtype) -> list[tuple[js.Policy, js.Policy]]:
    """(policy for the compact space, the same policy for the float32 space)."""
    action = Discrete(4)
    compact, plain = Box(0, 1, SHAPE, dtype), Box(0, 1, SHAPE, np.float32)
    kinds = [
        lambda s: js.CNNPolicy(s, action, conv_features=4, hidden_sizes=(8,)),
        lambda s: js.MLPPolicy(s, action, hidden_sizes=(8,)),
        lambda s: js.policies.RecurrentPolicy(s, action, hidden_size=8),
    ]
    return [(k(compact), k(plain)) for k in kinds]


@pytest.mark.parametrize("dtype", [np.uint8, np.bool_])
def test_actor_critics_give_float32_results_on_compact_obs(dtype):
    compact, plain = _obs(np.dtype(dtype))
    key = jax.random.PRNGKey(3)
    for policy, ref in _policies(np.dtype(dtype)):
        params = ref.init(jax.random.PRNGKey(0))
        np.testing.assert_array_equal(  # the params do not depend on the space's dtype
            jax.tree.leaves(policy.init(jax.random.PRNGKey(0)))[0], jax.tree.leaves(params)[0]
        )
        state = ref.initial_state((2, 4))
        got = policy(params, compact, key, state)
        want = ref(params, plain, key, state)
        jax.tree.map(np.testing.assert_array_equal, got, want)
        for leaf in jax.tree.leaves(got[1]):  # extras: logits, logp, values stay float32
            assert leaf.dtype == np.float32
        logp = policy.log_prob(params, compact, got[0], state)
        np.testing.assert_array_equal(logp, ref.log_prob(params, plain, got[0], state))


def test_random_policy_accepts_compact_obs():
    compact, _ = _obs(np.dtype(np.uint8))
    policy = js.RandomPolicy(Box(0, 1, SHAPE, np.uint8), Discrete(4))
    action, _, _ = policy(None, compact, jax.random.PRNGKey(0), ())
    assert action.shape == (2, 4) and np.all((action >= 0) & (action < 4))
