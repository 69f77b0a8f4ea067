"""js.CNNPolicy: shapes, the network and the distribution against a NumPy reference,
masking, and a js.Sampler rollout on Breakout-MinAtar.

The reference recomputes the whole network from the params with NumPy (a VALID 3x3
convolution written as a sum over kernel offsets, ReLU, dense layers), then the
log-softmax / diagonal-Gaussian log-density of the sampled actions, so a wrong conv
layout, head or log-probability would fail.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler import spaces as S

GRID = S.Box(0.0, 1.0, (5, 6, 2))
DISCRETE = S.Discrete(3)
BOX = S.Box(-1.0, 1.0, (2,))


def _np_forward(params, obs):
    """NumPy actor-critic of the default CNNPolicy layout: ``obs [B, H, W, C]``."""
    p = jax.tree.map(np.asarray, params)["params"]
    k = p["conv"]["kernel"]  # [kh, kw, C, F]
    kh, kw = k.shape[:2]
    b, h, w, _ = obs.shape
    out = np.zeros((b, h - kh + 1, w - kw + 1, k.shape[-1]), np.float64)
    for i in range(kh):
        for j in range(kw):
            out += np.einsum(
                "bhwc,cf->bhwf", obs[:, i : i + h - kh + 1, j : j + w - kw + 1], k[i, j]
            )
    x = np.maximum(out + p["conv"]["bias"], 0).reshape(b, -1)

    def head(name):
        y = np.maximum(x @ p[f"{name}_0"]["kernel"] + p[f"{name}_0"]["bias"], 0)
        return y @ p[f"{name}_out"]["kernel"] + p[f"{name}_out"]["bias"]

    return head("actor"), head("critic")[:, 0], p.get("log_std")


def _np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.fixture(scope="module")
def obs():
    return np.asarray(jax.random.bernoulli(jax.random.key(3), 0.4, (4, 2, *GRID.shape)), np.float32)


def _params(policy):
    params = jax.tree.map(np.asarray, policy.init(jax.random.key(1)))
    # Clearly non-uniform heads, so a formula that ignored the logits would fail.
    out = params["params"]["actor_out"]
    out["kernel"] = np.random.default_rng(0).normal(0, 0.5, out["kernel"].shape).astype(np.float32)
    if "log_std" in params["params"]:
        params["params"]["log_std"] = np.array([-0.6, 0.3], np.float32)
    return params


def test_discrete_shapes_network_and_logp_match_numpy(obs):
    pol = js.CNNPolicy(GRID, DISCRETE, hidden_sizes=(8,), conv_features=4)
    params = _params(pol)
    action, extras, _ = jax.jit(pol)(params, obs, jax.random.key(0), js.policies.NoState())
    assert action.shape == (4, 2) and action.dtype == DISCRETE.dtype
    assert extras["action_logp"].shape == extras["vf_preds"].shape == (4, 2)
    assert extras["action_dist_inputs"].shape == (4, 2, 3)
    logits, value, _ = _np_forward(params, obs.reshape(8, *GRID.shape))
    np.testing.assert_allclose(
        extras["action_dist_inputs"].reshape(8, 3), logits, rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(extras["vf_preds"].reshape(8), value, rtol=1e-4, atol=1e-5)
    a = np.asarray(action).reshape(8)
    ref = _np_log_softmax(logits)[np.arange(8), a]
    np.testing.assert_allclose(extras["action_logp"].reshape(8), ref, rtol=1e-4, atol=1e-5)
    other = (action + 1) % 3
    np.testing.assert_allclose(
        pol.log_prob(params, obs, other, js.policies.NoState()).reshape(8),
        _np_log_softmax(logits)[np.arange(8), np.asarray(other).reshape(8)],
        rtol=1e-4,
        atol=1e-5,
    )


def test_box_actions_gaussian_logp_matches_numpy(obs):
    pol = js.CNNPolicy(GRID, BOX, hidden_sizes=(8,), conv_features=4)
    params = _params(pol)
    action, extras, _ = pol(params, obs, jax.random.key(0), js.policies.NoState())
    assert action.shape == (4, 2, 2) and extras["action_dist_inputs"].shape == (4, 2, 4)
    mean, _, log_std = _np_forward(params, obs.reshape(8, *GRID.shape))
    z = (np.asarray(action).reshape(8, 2) - mean) / np.exp(log_std)
    ref = np.sum(-0.5 * z**2 - log_std - 0.5 * np.log(2 * np.pi), -1)
    np.testing.assert_allclose(extras["action_logp"].reshape(8), ref, rtol=1e-4, atol=1e-4)


def test_masked_actions_are_legal_and_logp_is_the_masked_softmax(obs):
    space = S.Dict({"observations": GRID, "action_mask": S.Box(0, 1, (3,), np.bool_)})
    pol = js.CNNPolicy(space, DISCRETE, hidden_sizes=(8,), conv_features=4)
    params = _params(pol)
    mask = np.zeros((4, 2, 3), bool)
    mask[..., 1] = True
    mask[0, 0] = [True, False, True]
    action, extras, _ = pol(
        params, {"observations": obs, "action_mask": mask}, jax.random.key(2), js.policies.NoState()
    )
    assert mask.reshape(8, 3)[np.arange(8), np.asarray(action).reshape(8)].all()
    logits, _, _ = _np_forward(params, obs.reshape(8, *GRID.shape))
    masked = np.where(mask.reshape(8, 3), logits, -np.inf)
    ref = _np_log_softmax(masked)[np.arange(8), np.asarray(action).reshape(8)]
    np.testing.assert_allclose(extras["action_logp"].reshape(8), ref, rtol=1e-4, atol=1e-5)


def test_sampler_rollout_on_breakout_minatar():
    pytest.importorskip("gymnax", reason="Breakout-MinAtar comes from gymnax")
    env = js.make("gymnax:Breakout-MinAtar")
    pol = js.CNNPolicy(env.observation_space, env.action_space, hidden_sizes=(8,), conv_features=4)
    params = pol.init(jax.random.key(0))
    sb = js.Sampler(env, pol, num_envs=2, rollout_length=8, seed=0).sample_batch(params)
    sb = sb["default_policy"]
    # 16 env steps, less the reset steps between episodes.
    assert sb["obs"].shape[1:] == (10, 10, 4) and 0 < sb.count <= 16
    assert set(np.unique(sb["actions"])) <= {0, 1, 2}
    # The stored logp is that of the stored action at the stored observation.
    logits, value, _ = _np_forward(params, np.asarray(sb["obs"], np.float32))
    ref = _np_log_softmax(logits)[np.arange(sb.count), np.asarray(sb["actions"])]
    np.testing.assert_allclose(sb["action_logp"], ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(sb["vf_preds"], value, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "build, exc, match",
    [
        (lambda: js.CNNPolicy(S.Box(0.0, 1.0, (4,)), DISCRETE), TypeError, "rank 3"),
        (lambda: js.CNNPolicy(GRID, S.MultiDiscrete([2, 2])), TypeError, "Discrete"),
        (lambda: js.CNNPolicy(GRID, DISCRETE, kernel_size=6), ValueError, "larger"),
        (lambda: js.CNNPolicy(GRID, DISCRETE, activation="nope"), ValueError, "activation"),
        (lambda: js.CNNPolicy(GRID, DISCRETE, hidden_sizes=(0,)), ValueError, ">= 1"),
    ],
)
def test_constructor_errors(build, exc, match):
    with pytest.raises(exc, match=match):
        build()
