"""Policies: output shapes, extras, log-probabilities, determinism and constructor errors.

``action_logp`` is checked against an independent numpy recomputation from the
distribution inputs (``policy.forward`` for the MLP, the Flax module for the GRU):
log-softmax for ``Discrete``, the diagonal-Gaussian log-density for ``Box``. The
Gaussian ``log_std`` is set to non-zero values and the discrete logits are made
clearly non-uniform first, so a formula that ignored them would fail.

Every policy call goes through :func:`_call`, jitted with the policy as a static
argument, so each (policy, input shape) compiles once for the whole file.
"""

from __future__ import annotations

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler import spaces as S
from jaxsampler.policies import log_prob

OBS = S.Box(-1.0, 1.0, (4,))
DISCRETE = S.Discrete(3)
DISCRETE_START = S.Discrete(4, start=2)
BOX = S.Box(-2.0, 2.0, (2,))
HIDDEN = 8
LOG_STD = np.array([-0.7, 0.4], np.float32)
LOGIT_BIAS = {
    3: np.array([1.0, 0.0, -1.5], np.float32),
    4: np.array([0.5, -1.0, 1.2, 0.0], np.float32),
}


def _make(kind: str) -> js.Policy:
    if kind == "mlp_discrete":
        return js.MLPPolicy(OBS, DISCRETE, hidden_sizes=(HIDDEN,))
    if kind == "mlp_discrete_start":
        return js.MLPPolicy(OBS, DISCRETE_START, hidden_sizes=(HIDDEN,), activation="relu")
    if kind == "mlp_box":
        return js.MLPPolicy(OBS, BOX, hidden_sizes=(HIDDEN, HIDDEN))
    if kind == "gru_discrete":
        return js.policies.RecurrentPolicy(OBS, DISCRETE, hidden_size=HIDDEN)
    if kind == "gru_box":
        return js.policies.RecurrentPolicy(OBS, BOX, hidden_size=HIDDEN)
    raise AssertionError(kind)


KINDS = ["mlp_discrete", "mlp_discrete_start", "mlp_box", "gru_discrete", "gru_box"]


def _init(policy: js.Policy):
    """Params with non-trivial distribution parameters (see the module docstring)."""
    params = jax.tree.map(np.asarray, policy.init(jax.random.key(1)))
    inner = params["params"]
    if isinstance(policy.action_space, S.Discrete):
        inner["actor_out"]["bias"] = LOGIT_BIAS[policy.action_space.n]
    else:
        inner["log_std"] = LOG_STD
    return jax.tree.map(jnp.asarray, params)


@pytest.fixture(scope="module")
def setups():
    return {k: (_make(k), _init(_make(k))) for k in KINDS}


@functools.partial(jax.jit, static_argnums=0)
def _call(policy, params, obs, key, state):
    return policy(params, obs, key, state)


def _obs(batch_shape, seed=0):
    return jax.random.uniform(
        jax.random.key(100 + seed), tuple(batch_shape) + OBS.shape, minval=-1, maxval=1
    )


def _state(policy, batch_shape):
    return policy.initial_state(tuple(batch_shape))


def _dist_inputs(policy, params, obs, state):
    """``(dist_inputs, value, log_std)`` as numpy, for the MLP (forward) or the GRU (module)."""
    if isinstance(policy, js.MLPPolicy):
        out = policy.forward(params, obs)
    else:
        _, out = policy.module.apply(params, state, obs.reshape(obs.shape[:-1] + (-1,)))
    return tuple(None if o is None else np.asarray(o, np.float64) for o in out)


def _np_log_softmax(logits):
    z = logits - logits.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _np_gauss_logp(x, mean, log_std):
    z = (x - mean) / np.exp(log_std)
    return np.sum(-0.5 * z**2 - log_std - 0.5 * np.log(2 * np.pi), axis=-1)


# --------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("batch_shape", [(2, 3), (3,), (2, 3, 4)], ids=["EA", "flat", "rank3"])
@pytest.mark.parametrize("kind", ["mlp_discrete", "mlp_box", "gru_discrete"])
def test_output_shapes_and_extras(setups, kind, batch_shape):
    policy, params = setups[kind]
    state = _state(policy, batch_shape)
    action, extras, new_state = _call(policy, params, _obs(batch_shape), jax.random.key(0), state)
    space = policy.action_space
    assert action.shape == batch_shape + space.shape
    assert action.dtype == space.dtype
    assert set(extras) == {"action_dist_inputs", "action_logp", "vf_preds"}
    n = space.n if isinstance(space, S.Discrete) else 2 * int(np.prod(space.shape))
    for name, leaf in extras.items():
        assert leaf.shape == batch_shape + ((n,) if name == "action_dist_inputs" else ()), name
        assert leaf.dtype == jnp.float32, name
        assert np.all(np.isfinite(np.asarray(leaf))), name
    if isinstance(space, S.Discrete):
        a = np.asarray(action)
        assert np.all((a >= space.start) & (a < space.start + space.n))
    if kind.startswith("gru"):
        assert new_state.shape == batch_shape + (HIDDEN,) and new_state.dtype == jnp.float32
    else:
        assert new_state == js.policies.NoState()


def test_unbatched_observation(setups):
    policy, params = setups["mlp_discrete"]
    action, extras, _ = _call(policy, params, _obs(()), jax.random.key(0), js.policies.NoState())
    assert (
        action.shape == () and extras["action_logp"].shape == () and extras["vf_preds"].shape == ()
    )


# --------------------------------------------------------------------------- log-probs


@pytest.mark.parametrize("kind", KINDS)
def test_action_logp_matches_independent_recomputation(setups, kind):
    policy, params = setups[kind]
    batch_shape = (2, 3)
    obs = _obs(batch_shape, seed=1)
    state = _state(policy, batch_shape)
    if kind.startswith("gru"):  # a non-zero carry, so the check covers the recurrent input
        state = jax.random.normal(jax.random.key(7), state.shape)
    action, extras, _ = _call(policy, params, obs, jax.random.key(3), state)
    dist, value, log_std = _dist_inputs(policy, params, obs, state)
    act = np.asarray(action)
    space = policy.action_space
    if isinstance(space, S.Discrete):
        assert log_std is None
        expected = np.take_along_axis(_np_log_softmax(dist), (act - space.start)[..., None], -1)[
            ..., 0
        ]
    else:
        np.testing.assert_allclose(log_std, LOG_STD, rtol=1e-6)
        expected = _np_gauss_logp(act.reshape(act.shape[:-1] + (-1,)), dist, log_std)
    np.testing.assert_allclose(np.asarray(extras["action_logp"]), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(extras["vf_preds"]), value, rtol=1e-5, atol=1e-6)
    # RLlib's layout: the logits, or concat(mean, log_std) with log_std at every step.
    rllib_inputs = np.asarray(extras["action_dist_inputs"])
    if log_std is None:
        np.testing.assert_allclose(rllib_inputs, dist, rtol=1e-6, atol=1e-6)
    else:
        d = dist.shape[-1]
        np.testing.assert_allclose(rllib_inputs[..., :d], dist, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(rllib_inputs[..., d:], np.broadcast_to(LOG_STD, dist.shape))
    lp = log_prob(
        space,
        jnp.asarray(dist, jnp.float32),
        None if log_std is None else jnp.asarray(log_std, jnp.float32),
        action,
    )
    np.testing.assert_allclose(np.asarray(lp), expected, rtol=1e-5, atol=1e-5)


def test_log_prob_of_other_actions():
    """``log_prob`` for actions the policy did not pick, against numpy."""
    logits = np.array([[0.3, -1.0, 2.0, 0.0], [1.0, 1.0, -3.0, 0.5]], np.float32)
    actions = np.array([2 + 1, 2 + 3], np.int32)  # Discrete(4, start=2)
    got = np.asarray(log_prob(DISCRETE_START, jnp.asarray(logits), None, jnp.asarray(actions)))
    ref = _np_log_softmax(logits.astype(np.float64))[[0, 1], [1, 3]]
    np.testing.assert_allclose(got, ref, rtol=1e-5)
    mean = np.array([[0.5, -1.0]], np.float32)
    x = np.array([[1.5, 0.0]], np.float32)
    got = np.asarray(log_prob(BOX, jnp.asarray(mean), jnp.asarray(LOG_STD), jnp.asarray(x)))
    np.testing.assert_allclose(got, _np_gauss_logp(x, mean, LOG_STD), rtol=1e-5)


@functools.partial(jax.jit, static_argnums=0)
def _log_prob(policy, params, obs, action, state):
    return policy.log_prob(params, obs, action, state)


@pytest.mark.parametrize("kind", KINDS)
def test_log_prob_method_of_given_actions_matches_numpy(setups, kind):
    """``Policy.log_prob`` of actions the policy did not sample (the GRU with a non-zero
    carry, the state before the step) against numpy from the distribution inputs."""
    policy, params = setups[kind]
    batch_shape = (2, 3)
    obs = _obs(batch_shape, seed=4)
    state = _state(policy, batch_shape)
    if kind.startswith("gru"):
        state = jax.random.normal(jax.random.key(8), state.shape)
    space = policy.action_space
    if isinstance(space, S.Discrete):
        act = (np.arange(6).reshape(batch_shape) % space.n + space.start).astype(space.dtype)
    else:
        act = np.linspace(-1.5, 1.5, 12, dtype=np.float32).reshape(batch_shape + space.shape)
    got = np.asarray(_log_prob(policy, params, obs, jnp.asarray(act), state))
    dist, _, log_std = _dist_inputs(policy, params, obs, state)
    if isinstance(space, S.Discrete):
        ref = np.take_along_axis(_np_log_softmax(dist), (act - space.start)[..., None], -1)[..., 0]
    else:
        ref = _np_gauss_logp(act.reshape(act.shape[:-1] + (-1,)), dist, log_std)
    assert got.shape == batch_shape and policy.has_log_prob
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_random_policy_has_no_log_prob():
    policy = js.RandomPolicy(OBS, DISCRETE)
    assert not policy.has_log_prob
    with pytest.raises(NotImplementedError, match="RandomPolicy does not implement log_prob"):
        policy.log_prob((), _obs((2,)), np.zeros(2, np.int32), js.policies.NoState())


# --------------------------------------------------------------------------- explore


@pytest.mark.parametrize("kind", ["mlp_discrete_start", "mlp_box", "gru_discrete"])
def test_explore_false_is_greedy(setups, kind):
    policy, params = setups[kind]
    greedy = dataclasses.replace(policy, explore=False)
    batch_shape = (2, 3)
    obs = _obs(batch_shape, seed=2)
    state = _state(policy, batch_shape)
    action, extras, _ = _call(greedy, params, obs, jax.random.key(0), state)
    action2, _, _ = _call(greedy, params, obs, jax.random.key(1), state)
    np.testing.assert_array_equal(np.asarray(action), np.asarray(action2))  # key-independent
    dist, _, log_std = _dist_inputs(policy, params, obs, state)
    space = policy.action_space
    if isinstance(space, S.Discrete):
        np.testing.assert_array_equal(np.asarray(action), dist.argmax(-1) + space.start)
        expected = _np_log_softmax(dist).max(-1)
    else:
        np.testing.assert_allclose(
            np.asarray(action), dist.reshape(batch_shape + space.shape), rtol=1e-6, atol=1e-7
        )
        expected = _np_gauss_logp(dist, dist, log_std)
    np.testing.assert_allclose(np.asarray(extras["action_logp"]), expected, rtol=1e-5)


@pytest.mark.parametrize("kind", ["mlp_discrete", "mlp_box", "gru_discrete"])
def test_same_key_same_actions(setups, kind):
    policy, params = setups[kind]
    batch_shape = (2, 3, 4)
    obs, state = _obs(batch_shape), _state(policy, batch_shape)
    a1, e1, _ = _call(policy, params, obs, jax.random.key(5), state)
    a2, e2, _ = _call(policy, params, obs, jax.random.key(5), state)
    a3, _, _ = _call(policy, params, obs, jax.random.key(6), state)
    np.testing.assert_array_equal(np.asarray(a1), np.asarray(a2))
    np.testing.assert_array_equal(np.asarray(e1["action_logp"]), np.asarray(e2["action_logp"]))
    # 24 discrete draws with every probability <= 0.72: all equal with chance < 0.72^24 ~ 4e-4.
    assert not np.array_equal(np.asarray(a1), np.asarray(a3))


def test_jit_and_eager_agree(setups):
    policy, params = setups["mlp_box"]
    obs = _obs((2, 3))
    eager = policy(params, obs, jax.random.key(4), js.policies.NoState())
    jitted = _call(policy, params, obs, jax.random.key(4), js.policies.NoState())
    chex.assert_trees_all_close(eager, jitted, rtol=1e-6, atol=1e-6)


def test_traced_once_per_shape(setups):
    policy, params = setups["mlp_discrete"]

    @jax.jit
    @chex.assert_max_traces(n=1)
    def act(params, obs, key):
        return policy(params, obs, key, js.policies.NoState())

    for seed in range(3):  # fresh batches and keys of the same shape
        act(params, _obs((2, 3), seed=seed), jax.random.key(seed))


# --------------------------------------------------------------------------- statistics


def test_discrete_frequencies_match_softmax(setups):
    policy, params = setups["mlp_discrete"]
    n = 20000
    obs = jnp.broadcast_to(_obs((1,), seed=3), (n,) + OBS.shape)
    action, _, _ = _call(policy, params, obs, jax.random.key(11), js.policies.NoState())
    probs = np.exp(_np_log_softmax(_dist_inputs(policy, params, obs[:1], None)[0][0]))
    assert probs.max() - probs.min() > 0.3  # the logit bias makes this a real test
    freq = np.bincount(np.asarray(action), minlength=3) / n
    sd = np.sqrt(probs * (1 - probs) / n)
    np.testing.assert_array_less(np.abs(freq - probs), 5 * sd)


def test_gaussian_sample_moments(setups):
    policy, params = setups["mlp_box"]
    n = 20000
    obs = jnp.broadcast_to(_obs((1,), seed=3), (n,) + OBS.shape)
    action, _, _ = _call(policy, params, obs, jax.random.key(12), js.policies.NoState())
    mean = _dist_inputs(policy, params, obs[:1], None)[0][0]
    a = np.asarray(action, np.float64)
    std = np.exp(LOG_STD.astype(np.float64))
    np.testing.assert_array_less(np.abs(a.mean(0) - mean), 5 * std / np.sqrt(n))
    np.testing.assert_allclose(a.std(0), std, rtol=0.03)
    # Stored unclipped (documented): with std exp(0.4) ~ 1.5 about 18% of the second
    # coordinate falls outside the action bounds [-2, 2].
    assert a.shape == (n, 2) and (np.abs(a[:, 1]) > 2).mean() > 0.1


# --------------------------------------------------------------------------- recurrent


def test_recurrent_state(setups):
    policy, params = setups["gru_discrete"]
    batch_shape = (2, 3)
    s0 = policy.initial_state(batch_shape)
    assert s0.shape == (2, 3, HIDDEN) and s0.dtype == jnp.float32
    assert not np.any(np.asarray(s0))
    obs = _obs(batch_shape, seed=4)
    key = jax.random.key(2)
    _, e1, s1 = _call(policy, params, obs, key, s0)
    assert s1.shape == s0.shape and s1.dtype == jnp.float32
    assert np.all(np.any(np.asarray(s1) != 0, axis=-1))  # every env/agent's carry moved
    # Same obs and key from the advanced carry: the outputs depend on the state.
    _, e2, s2 = _call(policy, params, obs, key, s1)
    assert not np.allclose(np.asarray(e1["vf_preds"]), np.asarray(e2["vf_preds"]))
    assert not np.allclose(np.asarray(s1), np.asarray(s2))
    # Batch elements are independent: the first row alone gives the same outputs.
    _, e_row, s_row = _call(policy, params, obs[0], key, s0[0])
    assert s_row.shape == (3, HIDDEN)
    np.testing.assert_allclose(np.asarray(s_row), np.asarray(s1[0]), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(e_row["vf_preds"]), np.asarray(e1["vf_preds"][0]), rtol=1e-6, atol=1e-6
    )


# --------------------------------------------------------------------------- random policy


@pytest.mark.parametrize(
    "action_space",
    [
        S.Discrete(3, start=1),
        S.Box(-1.0, 1.0, (2,)),
        S.MultiDiscrete([2, 3]),
        S.Dict(a=S.Discrete(2), b=S.Box(0.0, 1.0, (1,))),
    ],
    ids=["discrete", "box", "multidiscrete", "dict"],
)
def test_random_policy_actions_in_space(action_space):
    policy = js.RandomPolicy(OBS, action_space)
    assert policy.init(jax.random.key(0)) == ()
    obs = _obs((2, 3))
    action, extras, state = _call(policy, (), obs, jax.random.key(0), js.policies.NoState())
    assert extras == {} and state == js.policies.NoState()
    for leaf, sub in zip(
        jax.tree.leaves(action), jax.tree.leaves(action_space.zeros()), strict=True
    ):
        assert leaf.shape == (2, 3) + sub.shape and leaf.dtype == sub.dtype
    flat = jax.tree.map(lambda x: x.reshape((6,) + x.shape[2:]), action)
    assert bool(jnp.all(jax.vmap(action_space.contains)(flat)))
    first = jax.tree.leaves(action)[0]
    assert np.unique(np.asarray(first).reshape(6, -1), axis=0).shape[0] > 1  # not constant


def test_random_policy_discrete_observations():
    policy = js.RandomPolicy(S.Discrete(5), S.Box(0.0, 1.0, (3,)))
    obs = jnp.zeros((4, 1), jnp.int32)  # [E, A] of scalar observations
    action, _, _ = policy((), obs, jax.random.key(0), js.policies.NoState())
    assert action.shape == (4, 1, 3)


# --------------------------------------------------------------------------- observations


def test_discrete_observation_is_one_hot():
    """A Discrete(5, start=1) observation equals the one-hot Box observation, same params."""
    d_pol = js.MLPPolicy(S.Discrete(5, start=1), DISCRETE, hidden_sizes=(HIDDEN,))
    b_pol = js.MLPPolicy(S.Box(0.0, 1.0, (5,)), DISCRETE, hidden_sizes=(HIDDEN,))
    params = d_pol.init(jax.random.key(0))
    obs = jnp.array([[1, 3], [5, 2]], jnp.int32)
    one_hot = jnp.asarray(np.eye(5, dtype=np.float32)[np.asarray(obs) - 1])
    for got, ref in zip(
        d_pol.forward(params, obs)[:2], b_pol.forward(params, one_hot)[:2], strict=True
    ):
        assert got.shape[:2] == (2, 2)
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- construction


@pytest.mark.parametrize(
    "build,exc,match",
    [
        (lambda: js.MLPPolicy(OBS, S.MultiDiscrete([2, 2])), TypeError, "Discrete or float Box"),
        (
            lambda: js.MLPPolicy(OBS, S.Box(0, 3, (2,), np.int32)),
            TypeError,
            "Discrete or float Box",
        ),
        (lambda: js.MLPPolicy(OBS, S.Dict(a=S.Discrete(2))), TypeError, "Discrete or float Box"),
        (lambda: js.MLPPolicy(S.Dict(a=OBS), DISCRETE), TypeError, "observation space"),
        (lambda: js.MLPPolicy(S.MultiDiscrete([2]), DISCRETE), TypeError, "observation space"),
        (lambda: js.MLPPolicy(OBS, DISCRETE, activation="sigmoid"), ValueError, "activation"),
        (
            lambda: js.policies.RecurrentPolicy(OBS, S.MultiDiscrete([2, 2])),
            TypeError,
            "Discrete or float Box",
        ),
        (
            lambda: js.policies.RecurrentPolicy(S.Tuple([OBS]), DISCRETE),
            TypeError,
            "observation space",
        ),
    ],
    ids=[
        "md_action",
        "int_box_action",
        "dict_action",
        "dict_obs",
        "md_obs",
        "activation",
        "gru_md_action",
        "gru_tuple_obs",
    ],
)
def test_constructor_errors(build, exc, match):
    with pytest.raises(exc, match=match):
        build()


def test_policies_are_hashable_frozen_static_config():
    a = js.MLPPolicy(OBS, DISCRETE, hidden_sizes=[HIDDEN, HIDDEN])
    b = js.MLPPolicy(S.Box(-1.0, 1.0, (4,)), S.Discrete(3), hidden_sizes=(HIDDEN, HIDDEN))
    assert a.hidden_sizes == (HIDDEN, HIDDEN)  # a list is normalised to a tuple
    assert a == b and hash(a) == hash(b)
    assert a != dataclasses.replace(a, explore=False)
    assert a != js.MLPPolicy(OBS, DISCRETE, hidden_sizes=(HIDDEN,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.explore = False
    r1, r2 = (
        js.policies.RecurrentPolicy(OBS, DISCRETE, hidden_size=4),
        js.policies.RecurrentPolicy(OBS, DISCRETE, hidden_size=4),
    )
    assert r1 == r2 and hash(r1) == hash(r2)
    assert hash(js.RandomPolicy(OBS, DISCRETE)) == hash(js.RandomPolicy(OBS, S.Discrete(3)))
    assert len({a, b, r1, r2}) == 2

    traces = []

    @functools.partial(jax.jit, static_argnums=0)
    def width(policy, x):
        traces.append(policy)
        return x + len(policy.hidden_sizes)

    width(a, 1.0)
    width(b, 2.0)  # equal policy, new object: no retrace
    assert len(traces) == 1
