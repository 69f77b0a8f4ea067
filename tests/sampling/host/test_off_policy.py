"""Off-policy rows of the host sampler: their extras describe the recorded action.

A scripted lockstep host env takes, at random steps, its own action of one of four
kinds, written into the observation (``obs[0] = kind / 4``) so every batch row says what
it must hold:

* ``POLICY``: no own action (the policy's sample and its logp);
* ``LOGGED``: an own action, nothing else (``log_action``): ``action_logp`` is the
  log-probability of that action under the current policy, recomputed here in numpy
  (log-softmax of the logits / diagonal-Gaussian density of the mean and ``log_std``);
* ``CALLER``: an own action with ``info["action_logp"]``: that value;
* ``CLIENT``: a local-inference step (``info[CLIENT_POLICY_INFO]``): the client's
  ``action_logp`` and ``vf_preds``;
* ``BAD_CLIENT``: a client whose values do not fit (a string, a wrong shape): they are
  not used; the row is treated as ``LOGGED``.
"""

from __future__ import annotations

import dataclasses
import functools
import threading

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler import spaces
from jaxsampler.constants import ALL_AGENTS
from jaxsampler.host_envs.base import HostEnv, PollResult
from jaxsampler.host_envs.external import CLIENT_POLICY_INFO, ExternalEnv
from jaxsampler.policies.base import Policy
from jaxsampler.sampling import HostSampler

A = js.constants.DEFAULT_AGENT_ID
POLICY, LOGGED, CALLER, CLIENT, BAD_CLIENT = range(5)
CALLER_LOGP = -0.625
CLIENT_LOGP, CLIENT_VF = -1.5, 7.0
OBS = spaces.Box(-1.0, 1.0, (3,))
DISCRETE = spaces.Discrete(3)
BOX = spaces.Box(-2.0, 2.0, (2,))


def own_action(space, t):
    """The env's own action at step ``t`` (differs from step to step)."""
    if isinstance(space, spaces.Discrete):
        return np.int32(t % space.n)
    return np.full(space.shape, 0.25 * (t % 4) - 0.4, np.float32)


class Lockstep(HostEnv):
    """``n`` lockstep sub-envs, episodes of ``length`` steps; the step kind is random and
    sits in ``obs[0]`` (see the module docstring)."""

    observation_space = OBS

    def __init__(self, action_space, n=3, length=5, seed=0, kinds=(0, 1, 2, 3, 4), agents=(A,)):
        self.action_space, self.num_envs, self.length = action_space, n, length
        self.agent_ids = agents
        self.rng = np.random.default_rng(seed)
        self.kinds = kinds
        self.t = [None] * n

    def poll(self, timeout=None):
        obs, rew, term, trunc, infos, offp = {}, {}, {}, {}, {}, {}
        for e in range(self.num_envs):
            first = self.t[e] is None
            self.t[e] = 0 if first else self.t[e] + 1
            t = self.t[e]
            done = t >= self.length
            obs[e], infos[e] = {}, {}
            for a in self.agent_ids:
                kind = POLICY if done else int(self.rng.choice(self.kinds))
                x = self.rng.uniform(-1, 1, 2).astype(np.float32)
                obs[e][a] = np.concatenate([[kind / 4], x]).astype(np.float32)
                info: dict = {"t": t}
                if kind != POLICY:
                    offp.setdefault(e, {})[a] = own_action(self.action_space, t)
                if kind == CALLER:
                    info["action_logp"] = CALLER_LOGP
                elif kind == CLIENT:
                    info[CLIENT_POLICY_INFO] = {
                        "weights_version": 3,
                        "extra_model_outputs": {
                            "action_logp": np.float32(CLIENT_LOGP),
                            "vf_preds": np.float32(CLIENT_VF),
                            "other": np.zeros(5),  # not one of the policy's extras: ignored
                        },
                    }
                elif kind == BAD_CLIENT:
                    info[CLIENT_POLICY_INFO] = {
                        "weights_version": 3,
                        "extra_model_outputs": {"action_logp": "high", "vf_preds": np.zeros(3)},
                    }
                infos[e][a] = info
            if not first:
                rew[e] = dict.fromkeys(self.agent_ids, 1.0)
                term[e] = {**dict.fromkeys(self.agent_ids, done), ALL_AGENTS: done}
                trunc[e] = {**dict.fromkeys(self.agent_ids, False), ALL_AGENTS: False}
            if done:
                self.t[e] = None
        return PollResult(obs, rew, term, trunc, infos, offp)

    def send_actions(self, actions):
        for e in range(self.num_envs):
            if self.t[e] is not None:
                assert set(actions[e]) == set(self.agent_ids), e


def np_log_softmax(logits):
    z = logits - logits.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def np_gauss_logp(x, mean, log_std):
    z = (x - mean) / np.exp(log_std)
    return np.sum(-0.5 * z**2 - log_std - 0.5 * np.log(2 * np.pi), axis=-1)


def np_logp(space, dist, log_std, actions):
    if isinstance(space, spaces.Discrete):
        return np.take_along_axis(np_log_softmax(dist), actions[:, None].astype(int), -1)[:, 0]
    return np_gauss_logp(actions.reshape(len(actions), -1), dist, log_std)


def _random_params(policy, seed=1):
    """Random params of the policy's shapes (no initializer runs: the orthogonal ones
    compile slowly, and any values do here)."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(policy.init, jax.random.key(0))
    return jax.tree.map(lambda x: rng.normal(0, 0.5, x.shape).astype(x.dtype), shapes)


def _params(policy):
    """Params with clearly non-uniform logits / a non-zero log_std, so a formula that
    ignored them would fail."""
    params = _random_params(policy)
    inner = params["params"]
    if isinstance(policy.action_space, spaces.Discrete):
        inner["actor_out"]["bias"] = np.array([1.0, 0.0, -1.5], np.float32)
    else:
        inner["log_std"] = np.array([-0.7, 0.4], np.float32)
    return params


@functools.partial(jax.jit, static_argnums=0)
def _gru_step(module, params, carry, x):
    return module.apply(params, carry, x)


def _expected_logp(batch, policy, params):
    """Per row: the logp the row must hold, and the vf_preds of the server forward pass."""
    obs = np.asarray(batch["obs"], np.float32)
    if isinstance(policy, js.policies.RecurrentPolicy):  # replay every episode's GRU carry
        dist = np.zeros((len(obs), js.policies.mlp.action_dim(policy.action_space)))
        value = np.zeros(len(obs))
        log_std = None
        for eid in dict.fromkeys(batch["eps_id"]):
            rows = np.flatnonzero(batch["eps_id"] == eid)
            assert batch["t"][rows[0]] == 0  # whole episodes (one call from the start)
            carry = policy.initial_state((1,))
            for r in rows:
                carry, (d, v, ls) = _gru_step(policy.module, params, carry, obs[r : r + 1])
                dist[r], value[r] = np.asarray(d)[0], np.asarray(v)[0]
                log_std = None if ls is None else np.asarray(ls, np.float64)
    else:
        d, v, ls = policy.forward(params, obs)
        dist, value = np.asarray(d, np.float64), np.asarray(v)
        log_std = None if ls is None else np.asarray(ls, np.float64)
    ref = np_logp(policy.action_space, dist, log_std, np.asarray(batch["actions"]))
    return ref, value


def _kinds(batch):
    return np.rint(np.asarray(batch["obs"])[:, 0] * 4).astype(int)


@pytest.mark.parametrize(
    "make,space",
    [
        (js.MLPPolicy, DISCRETE),
        (js.MLPPolicy, BOX),
        (js.policies.RecurrentPolicy, BOX),
        (js.policies.RecurrentPolicy, DISCRETE),
    ],
    ids=["mlp-discrete", "mlp-box", "gru-box", "gru-discrete"],
)
def test_off_policy_rows_hold_the_behaviour_logp(make, space):
    env = Lockstep(space)
    policy = make(OBS, space, **({"hidden_sizes": (8,)} if make is js.MLPPolicy else {}))
    params = _params(policy)
    s = HostSampler(env, policy, seed=1, rollout_length=24, mark_off_policy=True, batch_sizes=(4,))
    batch = s.sample_batch(params)["default_policy"]
    kinds = _kinds(batch)
    assert set(kinds) == {POLICY, LOGGED, CALLER, CLIENT, BAD_CLIENT}
    ref, value = _expected_logp(batch, policy, params)
    logp, vf = np.asarray(batch["action_logp"]), np.asarray(batch["vf_preds"])
    computed = np.isin(kinds, [POLICY, LOGGED, BAD_CLIENT])
    np.testing.assert_allclose(logp[computed], ref[computed], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(logp[kinds == CALLER], np.float32(CALLER_LOGP))
    np.testing.assert_array_equal(logp[kinds == CLIENT], np.float32(CLIENT_LOGP))
    server_vf = kinds != CLIENT
    np.testing.assert_allclose(vf[server_vf], value[server_vf], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(vf[kinds == CLIENT], np.float32(CLIENT_VF))
    # The recorded action is the env's own, and marked.
    own = kinds != POLICY
    np.testing.assert_array_equal(batch["off_policy"], own)
    for r in np.flatnonzero(own):
        np.testing.assert_array_equal(batch["actions"][r], own_action(space, batch["t"][r]))
    # The client's weights version stays in the row's info (not a column).
    assert all(
        batch["infos"][r][CLIENT_POLICY_INFO]["weights_version"] == 3
        for r in np.flatnonzero(kinds == CLIENT)
    )
    c = s.off_policy_counts
    n = {k: int(np.sum(kinds == k)) for k in range(5)}
    assert c.rows == n[LOGGED] + n[CALLER] + n[CLIENT] + n[BAD_CLIENT]
    assert c.computed_logp == n[LOGGED] + n[BAD_CLIENT]
    assert c.given == n[CALLER] + n[CLIENT] and c.rejected == 2 * n[BAD_CLIENT]
    assert c.nan_logp == 0


def test_on_policy_rows_are_unchanged_by_the_off_policy_path():
    """Without own actions nothing is recomputed: the rows equal a run of the unchanged
    policy call (no extra policy call)."""
    env = Lockstep(DISCRETE, kinds=(POLICY,))
    policy = js.MLPPolicy(OBS, DISCRETE, hidden_sizes=(8,))
    params = _params(policy)
    s = HostSampler(env, policy, seed=1, rollout_length=12, batch_sizes=(4,))
    batch = s.sample_batch(params)["default_policy"]
    ref, value = _expected_logp(batch, policy, params)
    np.testing.assert_allclose(batch["action_logp"], ref, rtol=1e-4, atol=1e-4)
    assert s.off_policy_counts.rows == 0 and "off_policy" not in batch


@dataclasses.dataclass(frozen=True)
class NoLogProb(Policy):
    """An MLP's step, but no ``log_prob``: the logp of an own action cannot be known."""

    inner: js.MLPPolicy

    @property
    def observation_space(self):
        return self.inner.observation_space

    @property
    def action_space(self):
        return self.inner.action_space

    def init(self, key):
        return self.inner.init(key)

    def __call__(self, params, obs, key, state):
        return self.inner(params, obs, key, state)


def test_without_log_prob_the_logp_of_own_actions_is_nan():
    env = Lockstep(DISCRETE, kinds=(POLICY, LOGGED, CALLER))
    inner = js.MLPPolicy(OBS, DISCRETE, hidden_sizes=(8,))
    policy = NoLogProb(inner)
    assert inner.has_log_prob and not policy.has_log_prob
    params = _params(inner)
    s = HostSampler(env, policy, seed=1, rollout_length=20, batch_sizes=(4,))
    assert s.logp_fns == {}
    batch = s.sample_batch(params)["default_policy"]
    kinds, logp = _kinds(batch), np.asarray(batch["action_logp"])
    assert np.all(np.isnan(logp[kinds == LOGGED])) and np.sum(kinds == LOGGED) > 0
    np.testing.assert_array_equal(logp[kinds == CALLER], np.float32(CALLER_LOGP))
    ref, _ = _expected_logp(batch, inner, params)
    np.testing.assert_allclose(logp[kinds == POLICY], ref[kinds == POLICY], rtol=1e-4, atol=1e-4)
    assert s.off_policy_counts.nan_logp == np.sum(kinds == LOGGED)


def test_policy_log_prob_matches_numpy_and_multi_agent_dispatches():
    """``Policy.log_prob`` of given actions against numpy; ``MultiAgentPolicy.log_prob``
    evaluates each agent under its own policy (agents interleaved: a permutation)."""
    red = js.MLPPolicy(OBS, DISCRETE, hidden_sizes=(8,))
    blue = js.MLPPolicy(OBS, DISCRETE, hidden_sizes=(4,), activation="relu")
    agents = ("a0", "a1", "a2")
    multi = js.policies.MultiAgentPolicy(
        agents, {"red": red, "blue": blue}, lambda a: "blue" if a == "a1" else "red"
    )
    params = _random_params(multi)
    obs = jax.random.uniform(jax.random.key(1), (2, 3, 3), minval=-1, maxval=1)
    actions = np.array([[0, 2, 1], [2, 1, 0]], np.int32)
    got = np.asarray(jax.jit(multi.log_prob)(params, obs, actions, multi.initial_state((2, 3))))
    assert got.shape == (2, 3) and multi.has_log_prob
    for j, pol in zip(range(3), (red, blue, red), strict=True):
        pid = "blue" if j == 1 else "red"
        dist = np.asarray(pol.forward(params[pid], obs[:, j])[0], np.float64)
        np.testing.assert_allclose(
            got[:, j], np_logp(DISCRETE, dist, None, actions[:, j]), rtol=1e-5
        )
    assert not js.policies.MultiAgentPolicy(
        agents, {"r": js.RandomPolicy(OBS, DISCRETE)}
    ).has_log_prob
    with pytest.raises(NotImplementedError, match="log_prob"):
        js.RandomPolicy(OBS, DISCRETE).log_prob((), obs, actions, js.policies.NoState())


def test_external_env_log_action_and_abandoned_episode_end_to_end():
    """An ExternalEnv driven by a thread: ``log_action`` steps (one with a caller logp),
    ``get_action`` steps, one episode ended, one abandoned. The batch's ``action_logp``
    follows the rules, and the abandoned episode's last row is marked."""
    env = ExternalEnv(OBS, DISCRETE, max_wait_s=0.0)
    policy = js.MLPPolicy(OBS, DISCRETE, hidden_sizes=(8,))
    params = _params(policy)
    s = HostSampler(env, policy, seed=0, timeout_s=0.5, batch_sizes=(1, 2))
    assert s.mark_abandoned
    o = [np.array([0.1 * i, -0.2, 0.3], np.float32) for i in range(6)]
    done = threading.Event()

    def sim():
        e1 = env.start_episode("done-one")
        env.log_action(e1, o[0], 2)  # LOGGED
        env.log_action(e1, o[1], 1, info={"action_logp": CALLER_LOGP})  # CALLER
        env.get_action(e1, o[2])  # POLICY
        env.end_episode(e1, o[3])
        e2 = env.start_episode("gone")
        env.log_action(e2, o[4], 0)
        env.get_action(e2, o[5])
        env.abandon_episode(e2)
        done.set()

    th = threading.Thread(target=sim, daemon=True)
    th.start()
    rows = []
    for _ in range(100):  # a bound, in case the sampler missed a step
        finished = done.is_set()  # then every step is queued: a call without one ends it
        b = s.sample_batch(params, num_timesteps=1)
        if "default_policy" in b.policy_batches:
            rows.append(b["default_policy"])
        if finished and s.metrics.num_env_steps_sampled == 0:
            break
    th.join(5)
    batch = js.episodes.concat_samples(rows)
    first = np.asarray(batch["obs"])[:, 0]  # o[i][0] = 0.1 * i tells the episodes apart
    eps = {round(float(first[batch["eps_id"] == e][0]), 1): e for e in set(batch["eps_id"])}
    d = np.flatnonzero(batch["eps_id"] == eps[0.0])  # "done-one"
    g = np.flatnonzero(batch["eps_id"] == eps[0.4])  # "gone"
    assert (len(d), len(g)) == (3, 2)
    ref, _ = _expected_logp(batch, policy, params)
    logp = np.asarray(batch["action_logp"])
    np.testing.assert_array_equal(batch["actions"][d[:2]], [2, 1])
    np.testing.assert_allclose(logp[d[[0, 2]]], ref[d[[0, 2]]], rtol=1e-4, atol=1e-4)
    assert logp[d[1]] == np.float32(CALLER_LOGP)
    np.testing.assert_allclose(logp[g], ref[g], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(batch["abandoned"][d], [False, False, False])
    np.testing.assert_array_equal(batch["abandoned"][g], [False, True])
    assert batch["truncateds"][g[-1]] and not batch["terminateds"][g[-1]]
    env.close()


def test_multi_agent_policy_rows_use_each_agents_own_policy():
    """Two agents, two policies (``MultiAgentPolicy``): an own action's logp is computed
    with the agent's policy; each policy's batch against its own numpy reference."""
    agents = ("a0", "a1")
    env = Lockstep(DISCRETE, agents=agents)
    pols = {
        "red": js.MLPPolicy(OBS, DISCRETE, hidden_sizes=(8,)),
        "blue": js.MLPPolicy(OBS, DISCRETE, hidden_sizes=(4,), activation="relu"),
    }
    multi = js.policies.MultiAgentPolicy(agents, pols, lambda a: "red" if a == "a0" else "blue")
    params = {pid: _params(p) for pid, p in pols.items()}
    s = HostSampler(env, multi, seed=2, rollout_length=18, batch_sizes=(4,))
    assert set(s.logp_fns) == {"red", "blue"}
    batch = s.sample_batch(params)
    for pid, p in pols.items():
        sb = batch[pid]
        kinds = _kinds(sb)
        ref, _ = _expected_logp(sb, p, params[pid])
        logp = np.asarray(sb["action_logp"])
        computed = np.isin(kinds, [POLICY, LOGGED, BAD_CLIENT])
        assert np.sum(kinds == LOGGED) > 0
        np.testing.assert_allclose(logp[computed], ref[computed], rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(logp[kinds == CALLER], np.float32(CALLER_LOGP))
        np.testing.assert_array_equal(logp[kinds == CLIENT], np.float32(CLIENT_LOGP))


class WrongShape(Lockstep):
    """Takes an own action of the wrong shape (a buggy env)."""

    def poll(self, timeout=None):
        res = super().poll(timeout)
        for acts in res.off_policy_actions.values():
            for a in acts:
                acts[a] = np.zeros(5, np.float32)
        return res


def test_an_own_action_outside_the_action_space_is_a_clear_error():
    env = WrongShape(BOX, kinds=(LOGGED,))
    policy = js.MLPPolicy(OBS, BOX, hidden_sizes=(4,))
    s = HostSampler(env, policy, rollout_length=4, batch_sizes=(4,))
    with pytest.raises(ValueError, match=r"env 0: the off-policy action of agent .* does not fit"):
        s.sample_batch(_params(policy))
    assert s._unrecorded == []  # nothing was sent, nothing is left to record
