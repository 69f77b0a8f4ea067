"""Action masking: masked policies act legally, with the masked distribution's log-probs
(against a NumPy masked softmax); ActionMaskFromInfo; MultiAgentPolicy pass-through;
RandomPolicy uniform over legal actions; check_env's mask checks."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import jaxsampler as js
from jaxsampler.envs.base import SingleAgentEnv
from jaxsampler.envs.tictactoe import TicTacToe
from jaxsampler.policies.mlp import MASKED_LOGIT, mask_logits
from jaxsampler.spaces import Box, Dict, Discrete, MultiDiscrete
from jaxsampler.transforms import TransformSpaceError
from jaxsampler.transforms.mask import ActionMaskFromInfo, masked_space

OBS = Box(-1.0, 1.0, (4,), np.float32)
ACT = Discrete(5)
MASKED = masked_space(OBS, ACT)


def np_masked_logp(logits: np.ndarray, legal: np.ndarray) -> np.ndarray:
    """Log-softmax over the legal entries only (-inf elsewhere); a row without legal
    entries is the plain log-softmax (nothing masked)."""
    legal = np.where(legal.any(-1, keepdims=True), legal, True)
    z = np.where(legal, logits.astype(np.float64), -np.inf)
    m = z.max(-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


def sharp_params(policy, key, scale=200.0):
    """Params whose logits are far from uniform (the actor head is initialised tiny)."""
    params = policy.init(key)
    head = params["params"]["actor_out"]
    head = {**head, "kernel": head["kernel"] * scale}
    return {"params": {**params["params"], "actor_out": head}}


def batch(key, n, legal):
    """``n`` observations with masks ``legal`` (``bool[n, 5]``), leaves ``[n, 1, ...]``."""
    obs = jax.random.uniform(key, (n, 1, 4), jnp.float32, -1.0, 1.0)
    return {"observations": obs, "action_mask": jnp.asarray(legal)[:, None]}


LEGAL = np.array(
    [
        [1, 0, 1, 0, 0],
        [0, 0, 0, 0, 1],
        [1, 1, 1, 1, 1],
        [0, 1, 1, 0, 1],
        [0, 0, 0, 0, 0],  # no legal action: masks nothing
        [1, 1, 0, 1, 0],
    ],
    bool,
)


@pytest.mark.parametrize("explore", [True, False])
def test_mlp_masked_logp_greedy_and_dist_inputs_match_numpy(explore):
    policy = js.MLPPolicy(MASKED, ACT, hidden_sizes=(16,), explore=explore)
    plain = js.MLPPolicy(OBS, ACT, hidden_sizes=(16,))  # the same network, no mask
    params = sharp_params(policy, jax.random.PRNGKey(0), scale=20.0)
    obs = batch(jax.random.PRNGKey(1), len(LEGAL), LEGAL)
    action, extras, _ = policy(params, obs, jax.random.PRNGKey(2), js.policies.NoState())
    raw, _, _ = plain.forward(params, obs["observations"])
    raw = np.asarray(raw)[:, 0]  # [n, 5], unmasked logits
    ref = np_masked_logp(raw, LEGAL)
    a = np.asarray(action)[:, 0]
    has_legal = LEGAL.any(-1)
    assert LEGAL[has_legal, a[has_legal]].all()
    np.testing.assert_allclose(
        np.asarray(extras["action_logp"])[:, 0], ref[np.arange(len(a)), a], rtol=1e-5, atol=1e-5
    )
    if not explore:  # greedy = argmax over the legal actions
        allowed = LEGAL | ~has_legal[:, None]  # a row without legal actions: unmasked
        np.testing.assert_array_equal(a, np.argmax(np.where(allowed, raw, -np.inf), -1))
    # action_dist_inputs are the masked logits: illegal -> MASKED_LOGIT, a full-False row
    # unchanged; a softmax over them is the masked distribution.
    want = np.where(LEGAL | ~has_legal[:, None], raw, MASKED_LOGIT)
    got = np.asarray(extras["action_dist_inputs"])[:, 0]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.nn.log_softmax(got))[LEGAL], ref[LEGAL], atol=1e-5)
    # log_prob of every action under the masked distribution.
    for act in range(5):
        lp = np.asarray(
            policy.log_prob(
                params, obs, jnp.full((len(LEGAL), 1), act, jnp.int32), js.policies.NoState()
            )
        )[:, 0]
        ok = LEGAL[:, act] | ~has_legal
        np.testing.assert_allclose(lp[ok], ref[ok, act], rtol=1e-5, atol=1e-5)
        assert np.all(lp[~ok] < -1e8)  # probability exactly 0 in float32
        assert np.all(np.exp(lp[~ok]) == 0)


def test_mlp_masked_sampling_frequencies_follow_the_masked_softmax():
    policy = js.MLPPolicy(MASKED, ACT, hidden_sizes=(16,))
    params = sharp_params(policy, jax.random.PRNGKey(3), scale=3.0)
    n = 4000
    legal = np.broadcast_to(np.array([1, 1, 0, 1, 0], bool), (n, 5))
    one = jax.random.uniform(jax.random.PRNGKey(4), (1, 1, 4), jnp.float32, -1, 1)
    obs = {"observations": jnp.broadcast_to(one, (n, 1, 4)), "action_mask": legal[:, None]}
    action, extras, _ = jax.jit(policy)(params, obs, jax.random.PRNGKey(5), js.policies.NoState())
    raw = np.asarray(js.MLPPolicy(OBS, ACT, hidden_sizes=(16,)).forward(params, one)[0])[0, 0]
    p = np.exp(np_masked_logp(raw[None], legal[:1]))[0]
    counts = np.bincount(np.asarray(action).ravel(), minlength=5)
    assert counts[~legal[0]].sum() == 0
    expected = n * p[legal[0]]
    assert expected.min() > 50, p  # the test needs every legal action to be visible
    chi2 = float(((counts[legal[0]] - expected) ** 2 / expected).sum())
    assert chi2 < 25.0, (counts, expected)  # df = 2: p-value ~ 4e-6
    # Jitted and eager agree.
    eager = policy(params, obs, jax.random.PRNGKey(5), js.policies.NoState())[0]
    np.testing.assert_array_equal(np.asarray(eager), np.asarray(action))


def test_recurrent_policy_masks_like_mlp():
    policy = js.policies.RecurrentPolicy(MASKED, ACT, hidden_size=8)
    plain = js.policies.RecurrentPolicy(OBS, ACT, hidden_size=8)
    params = policy.init(jax.random.PRNGKey(6))
    obs = batch(jax.random.PRNGKey(7), len(LEGAL), LEGAL)
    carry = jax.random.normal(jax.random.PRNGKey(8), (len(LEGAL), 1, 8))
    action, extras, new_carry = policy(params, obs, jax.random.PRNGKey(9), carry)
    _, x, plain_carry = plain(params, obs["observations"], jax.random.PRNGKey(9), carry)
    np.testing.assert_allclose(np.asarray(new_carry), np.asarray(plain_carry), rtol=1e-6)
    ref = np_masked_logp(np.asarray(x["action_dist_inputs"])[:, 0], LEGAL)
    a = np.asarray(action)[:, 0]
    has_legal = LEGAL.any(-1)
    assert LEGAL[has_legal, a[has_legal]].all()
    np.testing.assert_allclose(
        np.asarray(extras["action_logp"])[:, 0], ref[np.arange(len(a)), a], rtol=1e-5, atol=1e-5
    )
    lp = policy.log_prob(params, obs, action, carry)
    np.testing.assert_allclose(np.asarray(lp), np.asarray(extras["action_logp"]), rtol=1e-6)


def test_mask_logits_accepts_int_and_float_masks():
    logits = jnp.array([[1.0, 2.0, 3.0]])
    for mask in (
        jnp.array([[1, 0, 1]]),
        jnp.array([[1.0, 0.0, 1.0]]),
        jnp.array([[1, 0, 1]], bool),
    ):
        np.testing.assert_array_equal(
            np.asarray(mask_logits(logits, mask)), [[1.0, MASKED_LOGIT, 3.0]]
        )
    assert mask_logits(logits, None) is logits


def test_bad_masked_spaces_are_named():
    with pytest.raises(ValueError, match="keys"):
        js.MLPPolicy(Dict(observations=OBS, action_mask=Box(0, 1, (5,), bool), extra=OBS), ACT)
    with pytest.raises(ValueError, match=r"shape \(5,\)"):
        js.MLPPolicy(Dict(observations=OBS, action_mask=Box(0, 1, (4,), bool)), ACT)
    with pytest.raises(TypeError, match="Discrete or MultiDiscrete"):
        js.MLPPolicy(
            Dict(observations=OBS, action_mask=Box(0, 1, (2,), bool)), Box(-1.0, 1.0, (2,))
        )
    # RandomPolicy reads the mask only, so other entries (e.g. a FrameStack'ed Dict) may stay.
    wide = js.RandomPolicy(Dict(observations=OBS, action_mask=Box(0, 1, (5,), bool), x=OBS), ACT)
    obs = jax.tree.map(
        lambda z: jnp.zeros((64,) + z.shape, z.dtype), wide.observation_space.zeros()
    )
    obs["action_mask"] = jnp.zeros((64, 5), bool).at[:, 3].set(True)
    action, _, _ = wide(None, obs, jax.random.PRNGKey(0), None)
    assert (np.asarray(action) == 3).all()
    with pytest.raises(ValueError, match=r"shape \(5,\)"):
        js.RandomPolicy(Dict(action_mask=Box(0, 1, (4,), bool), x=OBS), ACT)


# --- RandomPolicy ----------------------------------------------------------------------


def chi2_uniform(counts: np.ndarray) -> float:
    expected = counts.sum() / len(counts)
    return float(((counts - expected) ** 2 / expected).sum())


def test_random_policy_uniform_over_legal_actions():
    n = 3000
    rows = np.array([[0, 1, 1, 0, 1], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], bool)
    legal = np.repeat(rows, n, axis=0)
    policy = js.RandomPolicy(MASKED, ACT)
    obs = batch(jax.random.PRNGKey(0), len(legal), legal)
    action = np.asarray(policy((), obs, jax.random.PRNGKey(1), js.policies.NoState())[0])[:, 0]
    for i, row in enumerate(rows):
        counts = np.bincount(action[i * n : (i + 1) * n], minlength=5)
        allowed = row if row.any() else np.ones(5, bool)  # all-False: uniform over all
        assert counts[~allowed].sum() == 0, (row, counts)
        if allowed.sum() > 1:
            assert chi2_uniform(counts[allowed]) < 25.0, (row, counts)  # df <= 4: p < 1e-4


def test_random_policy_multidiscrete_masks_each_dimension():
    space = MultiDiscrete([3, 4])
    policy = js.RandomPolicy(masked_space(OBS, space), space)
    n = 6000
    mask = np.array([1, 0, 1, 0, 1, 1, 0], bool)  # dim 0: {0, 2}; dim 1: {1, 2}
    obs = {
        "observations": jnp.zeros((n, 1, 4), jnp.float32),
        "action_mask": jnp.broadcast_to(mask, (n, 1, 7)),
    }
    action = np.asarray(policy((), obs, jax.random.PRNGKey(2), js.policies.NoState())[0])[:, 0]
    assert action.shape == (n, 2)
    for d, allowed in ((0, [0, 2]), (1, [1, 2])):
        counts = np.bincount(action[:, d], minlength=space.nvec[d])
        assert set(np.nonzero(counts)[0]) == set(allowed)
        assert chi2_uniform(counts[allowed]) < 20.0


def test_random_policy_without_mask_is_unchanged():
    policy = js.RandomPolicy(OBS, ACT)
    key = jax.random.PRNGKey(3)
    obs = jnp.zeros((7, 2, 4))
    a = policy((), obs, key, js.policies.NoState())[0]
    np.testing.assert_array_equal(np.asarray(a), np.asarray(ACT.sample_batch(key, (7, 2))))


# --- MultiAgentPolicy ------------------------------------------------------------------


def test_multi_agent_policy_passes_each_agent_its_own_mask():
    env = TicTacToe(masked_obs=True)
    x = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,), explore=False)
    o = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,), explore=False)
    mapping = {"agent_0": "x", "agent_1": "o"}
    policy = js.policies.MultiAgentPolicy(env, {"x": x, "o": o}, lambda aid, *a, **k: mapping[aid])
    params = {
        "x": sharp_params(x, jax.random.PRNGKey(0)),
        "o": sharp_params(o, jax.random.PRNGKey(1)),
    }
    E = 64
    rng = np.random.default_rng(0)
    legal = rng.random((E, 2, 9)) < 0.4
    legal[:, 0, 0] = True  # at least one legal action per agent
    legal[:, 1, 8] = True
    obs = {
        "observations": jnp.asarray(rng.random((E, 2, 27)), jnp.float32),
        "action_mask": jnp.asarray(legal),
    }
    action, extras, _ = policy(params, obs, jax.random.PRNGKey(2), policy.initial_state((E, 2)))
    action = np.asarray(action)
    for i, pid in enumerate(("x", "o")):
        raw = js.MLPPolicy(env.observation_space["observations"], env.action_space, (8,))
        logits = np.asarray(raw.forward(params[pid], obs["observations"][:, i])[0])
        np.testing.assert_array_equal(
            action[:, i], np.argmax(np.where(legal[:, i], logits, -np.inf), -1)
        )
        ref = np_masked_logp(logits, legal[:, i])
        np.testing.assert_allclose(
            np.asarray(extras["action_logp"])[:, i],
            ref[np.arange(E), action[:, i]],
            rtol=1e-5,
            atol=1e-5,
        )
    lp = policy.log_prob(params, obs, jnp.asarray(action), policy.initial_state((E, 2)))
    np.testing.assert_allclose(np.asarray(lp), np.asarray(extras["action_logp"]), rtol=1e-6)


def test_multi_agent_policy_for_transformed_spaces():
    env = TicTacToe()
    tf = (ActionMaskFromInfo(),)
    pipe = js.rollout.pipeline_of(env, tf)
    mlp = js.MLPPolicy(pipe.observation_space, pipe.action_space, hidden_sizes=(8,))
    with pytest.raises(ValueError, match="agent ids"):
        js.policies.MultiAgentPolicy(env, {"p": mlp})
    by_env = js.policies.MultiAgentPolicy(env, {"p": mlp}, transforms=tf)
    by_ids = js.policies.MultiAgentPolicy(env.agent_ids, {"p": mlp})
    assert by_env == by_ids
    with pytest.raises(ValueError, match="needs a jaxsampler Env"):
        js.policies.MultiAgentPolicy(env.agent_ids, {"p": mlp}, transforms=tf)


# --- TicTacToe: masked play never loses by an illegal move -------------------------------


def play(policy, transforms, env=TicTacToe(), E=32, T=90, seed=0):
    """Returns (mover rewards, mover's cell empty in the observation it acted on,
    number of moves) over all acting steps of a rollout."""
    params = policy.init(jax.random.PRNGKey(seed))
    rollout = js.make_rollout(env, policy, E, T, transforms=transforms)
    state = rollout.init(jax.random.PRNGKey(seed + 1))
    _, traj = jax.jit(rollout.run)(params, state)
    acting = np.asarray(traj.acting)  # [T, E, A]
    obs = traj.obs["observations"] if isinstance(traj.obs, dict) else traj.obs
    board = np.asarray(obs)[:-1]  # [T, E, A, 27]: what each agent saw
    action = np.asarray(traj.actions)
    empty = np.take_along_axis(board[..., 18:], action[..., None], -1)[..., 0] == 1
    return np.asarray(traj.rewards)[acting], empty[acting], int(acting.sum())


def test_tictactoe_masked_play_has_no_illegal_moves():
    env = TicTacToe()
    tf = (ActionMaskFromInfo(),)
    pipe = js.rollout.pipeline_of(env, tf)
    mlp = js.MLPPolicy(pipe.observation_space, pipe.action_space, hidden_sizes=(16,))
    policy = js.policies.MultiAgentPolicy(env, {"p": mlp}, transforms=tf)
    rewards, empty, moves = play(policy, tf)
    assert moves > 2000
    assert empty.all()  # every move went to an empty cell (the env's own board)
    assert not (rewards == -1.0).any()  # the mover gets -1 only for an illegal move

    # Unmasked, the same network plays illegal moves, and loses by them.
    plain = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(16,))
    rewards_u, empty_u, _ = play(plain, ())
    assert (~empty_u).sum() > 100
    np.testing.assert_array_equal(rewards_u == -1.0, ~empty_u)  # the two references agree


def test_tictactoe_masked_obs_option():
    env = js.make("TicTacToe-v0", masked_obs=True)
    assert env.observation_space == masked_space(Box(0.0, 1.0, (27,), np.float32), Discrete(9))
    mlp = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    rewards, empty, moves = play(mlp, (), env=env, E=16, T=40)
    assert moves > 300 and empty.all() and not (rewards == -1.0).any()
    # The mask equals the info's and the empty-cell plane.
    _, ts = env.reset(jax.random.PRNGKey(0))
    _, ts = env.step(jax.random.PRNGKey(1), _, jnp.array([4, 0]))
    np.testing.assert_array_equal(ts.obs["action_mask"], ts.info.action_mask)
    np.testing.assert_array_equal(ts.obs["action_mask"], ts.obs["observations"][:, 18:] == 1)


# --- ActionMaskFromInfo: bad input ---------------------------------------------------------


def test_action_mask_from_info_errors():
    cart = js.make("CartPole-v1")
    tf = (ActionMaskFromInfo(),)
    pipe = js.rollout.pipeline_of(cart, tf)
    pol = js.RandomPolicy(pipe.observation_space, pipe.action_space)
    with pytest.raises(ValueError, match=r"no entry 'action_mask'.*info is"):
        js.init_rollout_state(cart, pol, 2, jax.random.PRNGKey(0), transforms=tf)
    with pytest.raises(TransformSpaceError, match="Discrete or MultiDiscrete"):
        js.rollout.pipeline_of(js.make("Pendulum-v1"), tf)
    with pytest.raises(TransformSpaceError, match="already has"):
        js.rollout.pipeline_of(TicTacToe(masked_obs=True), tf)
    env = TicTacToe()
    bad = (ActionMaskFromInfo(path="legal"),)
    pipe = js.rollout.pipeline_of(env, bad)
    pol = js.RandomPolicy(pipe.observation_space, pipe.action_space)
    with pytest.raises(ValueError, match=r"no entry 'legal'.*TicTacToeInfo"):
        js.init_rollout_state(env, pol, 2, jax.random.PRNGKey(0), transforms=bad)


# --- check_env ---------------------------------------------------------------------------


@struct.dataclass
class CState:
    time: jax.Array


@struct.dataclass
class MaskInfo:
    action_mask: jax.Array


@dataclasses.dataclass(frozen=True)
class MaskedCounter(SingleAgentEnv):
    """obs = [time]; action ``time % 4`` is illegal; the info carries the mask. ``bug``
    breaks the mask: ``"shape"`` (3 entries), ``"none"`` (all False at time 2),
    ``"values"`` (int entries 2)."""

    bug: str = ""

    @property
    def default_params(self):
        return _Params()

    @property
    def observation_space(self) -> Box:
        return Box(0.0, 100.0, (1,), np.float32)

    @property
    def action_space(self) -> Discrete:
        return Discrete(4)

    def _info(self, time):
        legal = jnp.arange(4) != time % 4
        if self.bug == "shape":
            legal = legal[:3]
        if self.bug == "none":
            legal = legal & (time != 2)
        if self.bug == "values":
            return MaskInfo(legal.astype(jnp.int32) * 2)
        return MaskInfo(legal)

    def reset_env(self, key, params):
        t = jnp.zeros((), jnp.int32)
        return t.astype(jnp.float32)[None], CState(t)

    def reset_info(self, params):
        return self._info(jnp.zeros((), jnp.int32))

    def step_env(self, key, state, action, params):
        t = state.time + 1
        return t.astype(jnp.float32)[None], state, jnp.float32(0.0), jnp.bool_(False), self._info(t)


@struct.dataclass
class _Params:
    max_steps_in_episode: int = 8


def test_check_env_passes_on_masked_envs():
    for env in (TicTacToe(), TicTacToe(masked_obs=True), MaskedCounter()):
        report = js.check_env(env, num_envs=4)
        assert report.ok, str(report)
        assert "action mask" in report.checks_run


@pytest.mark.parametrize(
    "bug, needle",
    [
        ("shape", r"shape \(3,\) per env, expected \(1, 4\) or \(4,\)"),
        ("none", "no legal action"),
        ("values", "values other than 0/1"),
    ],
)
def test_check_env_flags_bad_masks(bug, needle):
    report = js.check_env(MaskedCounter(bug=bug), num_envs=4)
    assert not report.ok
    assert any(re.search(needle, p) for p in report.problems), str(report)


@dataclasses.dataclass(frozen=True)
class EmptyMaskTicTacToe(TicTacToe):
    """Masked observations whose mask is all False for the mover after two moves."""

    def agent_obs(self, agent_id, own, state, params):
        obs = super().agent_obs(agent_id, own, state, params)
        return {**obs, "action_mask": obs["action_mask"] & (state.time != 2)}


def test_check_env_flags_an_acting_agent_without_legal_moves_in_the_obs():
    report = js.check_env(EmptyMaskTicTacToe(masked_obs=True), num_envs=4)
    assert any("no legal action" in p and "'action_mask'" in p for p in report.problems), str(
        report
    )
