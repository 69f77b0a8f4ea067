"""Host-stepped multi-agent envs whose agents have their own spaces, through ``HostSampler``.

The reference is the env itself: every sub-env logs what it emitted (each agent's
observations and rewards) and what it received (each agent's action, checked against
that agent's own space as it arrives), and the sampler's episodes and batches must hold
exactly that, each agent in its own spaces: hunters observe 4 values and pick one of 5
moves, the runner observes 6 and moves by a continuous 2-vector.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")

import jaxsampler as js  # noqa: E402
from jaxsampler.host_envs import MultiAgentDictEnv  # noqa: E402
from jaxsampler.policies import MLPPolicy, MultiAgentPolicy  # noqa: E402
from jaxsampler.sampling import HostSampler  # noqa: E402
from jaxsampler.spaces import Box, Discrete  # noqa: E402

HUNTERS = ("hunter_0", "hunter_1")
AGENTS = (*HUNTERS, "runner")
MOVES = np.array([[0, 0], [1, 0], [-1, 0], [0, 1], [0, -1]], np.float32) * 0.5


class Hunt:
    """RLlib's dict API; every agent acts at every step. Hunters see themselves and the
    runner (``float32[4]``) and pick one of 5 moves; the runner sees itself and both
    hunters (``float32[6]``) and moves by ``float32[2]`` in ``[-1, 1]``. A catch (a hunter
    within 0.75 of the runner) terminates the episode; 6 steps truncate it."""

    possible_agents = list(AGENTS)

    def __init__(self, uid=0):
        self.uid = uid  # unseeded resets draw from (uid, episode number): no two alike
        box = gym.spaces.Box
        self.observation_spaces = {
            **{h: box(-50, 50, (4,), np.float32) for h in HUNTERS},
            "runner": box(-50, 50, (6,), np.float32),
        }
        self.action_spaces = {
            **{h: gym.spaces.Discrete(5) for h in HUNTERS},
            "runner": box(-1, 1, (2,), np.float32),
        }
        self.log: list[dict] = []  # one entry per episode: what was emitted and received

    def _obs(self):
        p, r = self.pos, self.pos["runner"]
        out = {h: np.concatenate([p[h], r]) for h in HUNTERS}
        out["runner"] = np.concatenate([r, p["hunter_0"], p["hunter_1"]])
        return out

    def _emit(self, obs, rewards=None):
        ep = self.log[-1]
        for a, o in obs.items():
            ep["obs"][a].append(o.copy())
            if rewards is not None:
                ep["rewards"][a].append(rewards[a])
        return obs

    def reset(self, *, seed=None, options=None):
        rng = np.random.default_rng(seed if seed is not None else (self.uid, len(self.log)))
        self.pos = {a: rng.uniform(-3, 3, 2).astype(np.float32) for a in AGENTS}
        self.t = 0
        self.log.append({k: {a: [] for a in AGENTS} for k in ("obs", "actions", "rewards")})
        return self._emit(self._obs()), {a: {} for a in AGENTS}

    def step(self, actions):
        assert set(actions) == set(AGENTS), actions
        for h in HUNTERS:  # each action arrives in its agent's own space
            assert isinstance(actions[h], int) and 0 <= actions[h] < 5, actions[h]
            self.pos[h] = self.pos[h] + MOVES[actions[h]]
        move = actions["runner"]
        assert isinstance(move, np.ndarray) and move.shape == (2,), move
        assert move.dtype == np.float32, move.dtype
        self.pos["runner"] = self.pos["runner"] + np.clip(move, -1, 1)
        for a in AGENTS:
            self.log[-1]["actions"][a].append(actions[a])
        self.t += 1
        gaps = [float(np.linalg.norm(self.pos[h] - self.pos["runner"])) for h in HUNTERS]
        rewards = {h: -g for h, g in zip(HUNTERS, gaps, strict=True)}
        rewards["runner"] = min(gaps)
        caught, timeout = min(gaps) < 0.75, self.t >= 6
        terms = {**dict.fromkeys(AGENTS, caught), "__all__": caught}
        truncs = {**dict.fromkeys(AGENTS, timeout and not caught)}
        truncs["__all__"] = timeout and not caught
        obs = self._emit(self._obs(), rewards)
        return obs, rewards, terms, truncs, {a: {} for a in AGENTS}


def _spaces():
    return (Box(-50, 50, (4,), np.float32), Discrete(5)), (
        Box(-50, 50, (6,), np.float32),
        Box(-1, 1, (2,), np.float32),
    )


def _policy(henv, mapping=None, hunter=None):
    (h_obs, h_act), (r_obs, r_act) = _spaces()
    policies = {
        "hunter": hunter or MLPPolicy(h_obs, h_act, (8,)),
        "runner": MLPPolicy(r_obs, r_act, (8,)),
    }
    return MultiAgentPolicy(
        henv, policies, mapping or (lambda a: "runner" if a == "runner" else "hunter")
    )


def _sampler(num_envs=2):
    envs = [Hunt(uid) for uid in range(num_envs)]
    henv = MultiAgentDictEnv(envs, seed=7)
    policy = _policy(henv)
    return HostSampler(henv, policy, rollout_length=10, seed=3), policy, envs


@pytest.fixture(scope="module")
def sampled():
    """Two calls of ``sample()`` (finished episodes and chunks cut at the call boundary)."""
    sampler, policy, envs = _sampler()
    params = policy.init(jax.random.PRNGKey(0))
    episodes = sampler.sample(params) + sampler.sample(params)
    sampler.close()
    return episodes, envs


def test_the_env_keeps_each_agents_own_spaces():
    henv = MultiAgentDictEnv([Hunt()])
    (h_obs, h_act), (r_obs, r_act) = _spaces()
    assert henv.observation_space is None and henv.action_space is None
    assert henv.observation_spaces == {"hunter_0": h_obs, "hunter_1": h_obs, "runner": r_obs}
    assert henv.action_spaces == {"hunter_0": h_act, "hunter_1": h_act, "runner": r_act}
    assert js.host_envs.agent_spaces(henv) == (henv.observation_spaces, henv.action_spaces)
    # agents that share their spaces keep the one shared space, as before
    shared = MultiAgentDictEnv([Hunt()], observation_space=h_obs, action_space=h_act)
    assert shared.observation_space == h_obs and shared.observation_spaces is None


def _whole_episodes(episodes, envs):
    """Every logged episode of the envs, keyed by its runner's first observation, with
    the sampler's chunks of that episode in order."""
    logs = {ep["obs"]["runner"][0].tobytes(): ep for env in envs for ep in env.log}
    found: dict[bytes, list] = {}
    for ep in episodes:
        first = ep.agent_episodes["runner"].get_observations(0)
        key = next(
            (
                k
                for k, v in logs.items()
                if any(first.tobytes() == o.tobytes() for o in v["obs"]["runner"])
            ),
            None,
        )
        assert key is not None, "an episode the envs never emitted"
        found.setdefault(key, []).append(ep)
    return logs, found


def test_episodes_hold_each_agents_own_spaces_and_exactly_what_the_env_emitted(sampled):
    episodes, envs = sampled
    (h_obs, h_act), (r_obs, r_act) = _spaces()
    assert episodes and any(ep.is_done for ep in episodes)
    logs, found = _whole_episodes(episodes, envs)
    checked = 0
    for key, chunks in found.items():
        log = logs[key]
        for a in AGENTS:
            obs_space, act_space = (r_obs, r_act) if a == "runner" else (h_obs, h_act)
            parts = [c.agent_episodes[a] for c in chunks]
            assert all(p.observation_space == obs_space for p in parts)
            assert all(p.action_space == act_space for p in parts)
            # the chunks, joined at their shared boundary observation, are the env's log
            obs = np.concatenate(
                [parts[0].get_observations()] + [p.get_observations()[1:] for p in parts[1:]]
            )
            acts = np.concatenate([np.asarray(p.get_actions()) for p in parts])
            rews = np.concatenate([np.asarray(p.get_rewards()) for p in parts])
            n = len(acts)
            np.testing.assert_array_equal(obs, np.stack(log["obs"][a][: n + 1]))
            assert obs.shape[1:] == obs_space.shape and obs.dtype == np.float32
            np.testing.assert_allclose(rews, log["rewards"][a][:n], rtol=1e-6)
            if a == "runner":
                assert acts.shape == (n, 2) and acts.dtype == np.float32
                np.testing.assert_array_equal(acts, np.stack(log["actions"][a][:n]))
            else:
                assert acts.shape == (n,) and np.issubdtype(acts.dtype, np.integer)
                np.testing.assert_array_equal(acts, log["actions"][a][:n])
            checked += n
    assert checked >= 2 * 10 * len(AGENTS)  # two calls of 10 polls over 2 envs, every agent


def test_batches_give_each_policy_its_agents_spaces():
    sampler, policy, envs = _sampler()
    params = policy.init(jax.random.PRNGKey(1))
    batch = sampler.sample_batch(params)
    sampler.close()
    hunter, runner = batch.policy_batches["hunter"], batch.policy_batches["runner"]
    for name, agents, rows in (("hunter", HUNTERS, hunter), ("runner", ("runner",), runner)):
        # every row is an (observation, action) pair the envs logged for one of its agents
        logged = {
            (o.tobytes(), np.asarray(a, rows["actions"].dtype).tobytes())
            for env in envs
            for ep in env.log
            for agent in agents
            for o, a in zip(ep["obs"][agent][:-1], ep["actions"][agent], strict=True)
        }
        pairs = zip(rows["obs"], rows["actions"], strict=True)
        got = {(o.tobytes(), a.tobytes()) for o, a in pairs}
        assert got and got <= logged, name
    assert hunter["obs"].shape[1:] == (4,) and runner["obs"].shape[1:] == (6,)
    assert hunter["new_obs"].shape[1:] == (4,) and runner["new_obs"].shape[1:] == (6,)
    assert hunter["actions"].ndim == 1 and np.issubdtype(hunter["actions"].dtype, np.integer)
    assert runner["actions"].shape[1:] == (2,) and runner["actions"].dtype == np.float32
    assert len(hunter["obs"]) == 2 * len(runner["obs"])  # two hunters per runner, lockstep


def test_bad_input_names_the_agents_and_their_spaces():
    henv = MultiAgentDictEnv([Hunt()])
    (h_obs, h_act), (r_obs, r_act) = _spaces()
    with pytest.raises(ValueError, match="have their own spaces.*'runner'"):
        HostSampler(henv, MLPPolicy(h_obs, h_act, (8,)))
    with pytest.raises(ValueError, match="'hunter' is mapped to agents of different spaces"):
        HostSampler(henv, _policy(henv, mapping=lambda a: "hunter"))
    wrong = MLPPolicy(Box(-50, 50, (5,), np.float32), h_act, (8,))
    with pytest.raises(ValueError, match=r"mismatched observation space.*policy 'hunter'"):
        HostSampler(henv, _policy(henv, hunter=wrong))
    with pytest.raises(ValueError, match="transforms= bind to one"):
        HostSampler(henv, _policy(henv), transforms=[js.transforms.ClipActions()])
    with pytest.raises(ValueError, match="transforms= bind to one space"):
        MultiAgentPolicy(
            henv,
            {"p": MLPPolicy(h_obs, h_act, (8,))},
            transforms=[js.transforms.ClipActions()],
        )
    henv.close()


class BoundsOnly(Hunt):
    """:class:`Hunt` whose second hunter sees a wider Box (same shape and dtype)."""

    def __init__(self, uid=0):
        super().__init__(uid)
        self.observation_spaces["hunter_1"] = gym.spaces.Box(-80, 80, (4,), np.float32)


def test_agents_whose_bounds_differ_share_a_policy_and_keep_their_own_bounds():
    wide = Box(-80, 80, (4,), np.float32)
    (h_obs, h_act), _ = _spaces()
    henv = MultiAgentDictEnv([BoundsOnly(0)], seed=1)
    assert henv.observation_space is None and henv.observation_spaces["hunter_1"] == wide
    sampler = HostSampler(henv, _policy(henv), rollout_length=6)  # one policy, both hunters
    policy = sampler.policy
    episodes = sampler.sample(policy.init(jax.random.PRNGKey(0)))
    sampler.close()
    for ep in episodes:
        assert ep.agent_episodes["hunter_0"].observation_space == h_obs
        assert ep.agent_episodes["hunter_1"].observation_space == wide


class SameObservations(Hunt):
    """Every agent observes ``float32[4]``; the runner still moves by ``float32[2]``."""

    def __init__(self, uid=0):
        super().__init__(uid)
        self.observation_spaces["runner"] = self.observation_spaces["hunter_0"]

    def _obs(self):
        return {a: o[:4] for a, o in super()._obs().items()}


def test_agents_that_share_observations_but_not_actions():
    (h_obs, h_act), (_, r_act) = _spaces()
    henv = MultiAgentDictEnv([SameObservations(0)], seed=2)
    assert henv.observation_space == h_obs and henv.observation_spaces is None
    assert henv.action_space is None and henv.action_spaces["runner"] == r_act
    policy = MultiAgentPolicy(
        henv,
        {"hunter": MLPPolicy(h_obs, h_act, (8,)), "runner": MLPPolicy(h_obs, r_act, (8,))},
        lambda a: "runner" if a == "runner" else "hunter",
    )
    sampler = HostSampler(henv, policy, rollout_length=6)
    episodes = sampler.sample(policy.init(jax.random.PRNGKey(0)))
    sampler.close()
    assert episodes
    for ep in episodes:
        runner = ep.agent_episodes["runner"]
        assert runner.observation_space == h_obs and runner.action_space == r_act
        assert np.asarray(runner.get_actions()).shape[1:] == (2,)


class Misshapen(Hunt):
    """:class:`Hunt` that sends the runner a hunter's observation after two steps."""

    def step(self, actions):
        obs, *rest = super().step(actions)
        if self.t >= 2:
            obs["runner"] = obs["hunter_0"]
        return (obs, *rest)


def test_each_agents_observations_are_checked_against_its_own_space():
    henv = MultiAgentDictEnv([Misshapen(0)], check_observations=True)
    sampler = HostSampler(henv, _policy(henv), rollout_length=6)
    # (with the hunters' check for every agent, the first step's runner would fail instead)
    with pytest.raises(js.host_envs.HostEnvError, match=r"runner'\] shape \(4,\).*\(6,\)"):
        sampler.sample(sampler.policy.init(jax.random.PRNGKey(0)))
    sampler.close()


def test_equal_spaces_given_per_agent_only_and_a_policy_of_own_spaces_on_a_shared_env():
    (h_obs, h_act), _ = _spaces()
    henv = MultiAgentDictEnv([Hunt(0)], observation_space=h_obs, action_space=h_act)
    henv.observation_space = henv.action_space = None  # RLlib's style: the dicts alone
    henv.observation_spaces = dict.fromkeys(AGENTS, h_obs)
    henv.action_spaces = dict.fromkeys(AGENTS, h_act)
    sampler = HostSampler(henv, MLPPolicy(h_obs, h_act, (8,)))  # one policy serves all
    assert not sampler.own_spaces
    sampler.close()
    own = _policy(MultiAgentDictEnv([Hunt(1)]))  # built for the hunt's own spaces
    with pytest.raises(ValueError, match=r"mismatched observation space.*policy 'runner'"):
        HostSampler(MultiAgentDictEnv([Hunt(2)], observation_space=h_obs, action_space=h_act), own)
