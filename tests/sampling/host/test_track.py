"""HostSampler's single-agent path (list tracks) against the collector.

The tracks sample a scripted host env (sub-envs out of lockstep, episodes ending
terminated or truncated, off-policy actions, infos, reward-only polls); the reference is
the same env with a second agent that never shows up, which the sampler feeds through its
multi-agent path (the collector). With the same policy and seed, every ``sample()`` /
``sample_batch()`` call (mixed, lookback 0 and 2, ``num_episodes`` resets) must give the
same episodes (the collector's agent episodes), batches and metrics. The collector is
itself checked against the device sampler and RLlib's reference output in
``test_gymnasium.py``.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler import spaces
from jaxsampler.constants import ALL_AGENTS
from jaxsampler.episodes.ids import agent_episode_id
from jaxsampler.host_envs.base import HostEnv, PollResult
from jaxsampler.policies.base import Policy
from jaxsampler.sampling import HostSampler
from jaxsampler.sampling.host.track import Track

A = js.constants.DEFAULT_AGENT_ID


class Scripted(HostEnv):
    """``n`` sub-envs; each poll a random subset is ready. Episode lengths, end kinds,
    off-policy actions, infos and reward-only polls come from a seeded generator, and the
    observation depends on the actions sent (so a wrong action shows)."""

    observation_space = spaces.Box(-1e6, 1e6, (2,))
    action_space = spaces.Discrete(5)
    agent_ids = (A,)

    def __init__(
        self,
        n: int = 4,
        seed: int = 0,
        reward_only: bool = True,
        off_policy: bool = True,
        ready_p: float = 0.7,
    ):
        self.num_envs, self.reward_only, self.off_policy, self.ready_p = (
            n,
            reward_only,
            off_policy,
            ready_p,
        )
        self.rng = np.random.default_rng(seed)
        self.t = [None] * n  # None: not started
        self.limit = [0] * n
        self.last_action = [0] * n
        self.waiting = [False] * n  # an observation was delivered, its action not yet received

    def reset(self) -> None:
        self.t = [None] * self.num_envs
        self.waiting = [False] * self.num_envs

    def poll(self, timeout: float | None = None) -> PollResult:
        obs, rew, term, trunc, infos, offp = {}, {}, {}, {}, {}, {}
        ready = [
            e
            for e in range(self.num_envs)
            if not self.waiting[e] and self.rng.random() < self.ready_p
        ]
        for e in ready or [e for e in range(self.num_envs) if not self.waiting[e]][:1]:
            r = float(self.rng.integers(-3, 4))
            if self.t[e] is None:  # first observation
                self.t[e], self.limit[e] = 0, int(self.rng.integers(1, 9))
                obs[e] = {A: np.array([e, 0.0], np.float32)}
                infos[e] = {A: {"start": e}}
                self.waiting[e] = True
                continue
            if self.reward_only and self.rng.random() < 0.15:  # a reward, no observation yet
                rew[e] = {A: r}
                term[e] = {A: False, ALL_AGENTS: False}
                trunc[e] = {A: False, ALL_AGENTS: False}
                continue
            self.t[e] += 1
            done = self.t[e] >= self.limit[e]
            kind = self.rng.random()
            obs[e] = {A: np.array([e, self.t[e] * 10 + self.last_action[e]], np.float32)}
            rew[e] = {A: r}
            term[e] = {A: done and kind < 0.5, ALL_AGENTS: done and kind < 0.5}
            trunc[e] = {A: done and kind >= 0.5, ALL_AGENTS: done and kind >= 0.5}
            infos[e] = {A: {"t": self.t[e]}}
            if done:
                self.t[e] = None
            else:
                self.waiting[e] = True
                if self.rng.random() < 0.2 and self.off_policy:
                    offp[e] = {A: 4}
        return PollResult(obs, rew, term, trunc, infos, offp)

    def send_actions(self, actions):
        for e, acts in actions.items():
            assert self.waiting[e], e
            self.waiting[e] = False
            self.last_action[e] = int(acts[A])


@dataclasses.dataclass(frozen=True)
class Noisy(Policy):
    """Stochastic actions and two extras, so keys and extras must line up."""

    observation_space: object
    action_space: object

    def init(self, key):
        return ()

    def __call__(self, params, obs, key, state):
        import jax

        a = jax.random.randint(key, obs.shape[:2], 0, 4).astype(jnp.int32)
        return a, {"vf_preds": obs[..., 1] * 0.5, "action_logp": -a.astype(jnp.float32)}, state


CALLS = [
    ("eps", {}),
    ("batch", {}),
    ("eps", {"num_timesteps": 7}),
    ("batch", {"num_episodes": 3}),
    ("eps", {}),
    ("batch", {"num_timesteps": 11}),
    ("eps", {"num_episodes": 2}),
    ("batch", {}),
]


class WithSilentAgent(Scripted):
    """:class:`Scripted` with a second agent that never shows up: a multi-agent env to the
    sampler, so its one real agent goes through the collector."""

    agent_ids = (A, "silent")


def _run(fast: bool, horizon: int, reward_only: bool = True):
    env = (Scripted if fast else WithSilentAgent)(reward_only=reward_only)
    s = HostSampler(
        env,
        Noisy(env.observation_space, env.action_space),
        seed=3,
        episode_lookback_horizon=horizon,
        rollout_length=6,
        mark_off_policy=True,
    )
    assert type(s.feed).__name__ == ("TrackFeed" if fast else "CollectorFeed")
    out = []
    for kind, kw in CALLS:
        out.append((s.sample if kind == "eps" else s.sample_batch)((), **kw))
        out.append(s.metrics.as_dict())
    return out


def _same_buffer(g, w, what):
    assert g.lookback == w.lookback, what
    assert g.finalized == w.finalized, what
    if isinstance(w.data, list):
        assert g.data == w.data, what
    else:
        np.testing.assert_array_equal(g.data, w.data, err_msg=what)
        assert g.data.dtype == w.data.dtype, what


@pytest.mark.parametrize("horizon, reward_only", [(0, True), (2, False), (3, False)])
def test_track_path_equals_collector_path(horizon, reward_only, monkeypatch):
    """(Lookback counts agent steps on the tracks, env steps in the collector: the two
    differ only when an env sends reward-only polls, hence no lookback with those. The
    collector's chunks keep their step-less agent episodes here, so that every chunk of
    the tracks has its counterpart.)"""
    monkeypatch.setattr(js.MultiAgentEpisode, "prune_empty_agents", lambda self: self)
    fast, slow = _run(True, horizon, reward_only), _run(False, horizon, reward_only)
    n_eps = n_rows = 0
    for got, want in zip(fast, slow, strict=True):
        if isinstance(want, dict):  # metrics
            assert got == pytest.approx(want, nan_ok=True)
        elif isinstance(want, list):
            assert len(got) == len(want)
            for g, ma in zip(got, want, strict=True):
                assert type(g) is js.SingleAgentEpisode and type(ma) is js.MultiAgentEpisode
                assert list(ma.agent_episodes) == [A]
                w = ma.agent_episodes[A]
                assert (g.id_, len(g), g.t_started, g.t, g.is_terminated, g.is_truncated) == (
                    ma.id_,
                    len(w),
                    w.t_started,
                    w.t,
                    w.is_terminated,
                    w.is_truncated,
                )
                assert w.id_ == agent_episode_id(ma.id_, 0)
                assert (g.agent_id, g.module_id, g.multi_agent_episode_id) == (None, None, None)
                for name in ("observations", "actions", "rewards", "infos"):
                    _same_buffer(getattr(g, name), getattr(w, name), name)
                assert set(g.extra_model_outputs) == set(w.extra_model_outputs)
                assert set(w.extra_model_outputs) == (
                    {"vf_preds", "action_logp", "off_policy"} if len(w) else set()
                )
                for k in w.extra_model_outputs:
                    _same_buffer(g.extra_model_outputs[k], w.extra_model_outputs[k], k)
                n_eps += 1
        else:
            assert list(got.policy_batches) == list(want.policy_batches)
            assert (got.count, got.env_steps()) == (want.count, want.env_steps())
            for pid, w in want.policy_batches.items():
                g = got[pid]
                assert list(g) == list(w)
                for k in w:
                    if k == "infos":
                        assert g[k] == w[k]
                    elif k == "eps_id":  # the collector's rows carry the agent's episode id
                        assert [agent_episode_id(i, 0) for i in g[k]] == list(w[k])
                    else:
                        np.testing.assert_array_equal(g[k], w[k], err_msg=k)
                        assert g[k].dtype == w[k].dtype, k
                n_rows += len(w)
    assert n_eps > 10 and n_rows > 30


def test_reward_only_polls_sum_into_the_next_step():
    """A reward without an observation belongs to the step that the next observation ends
    (the hanging-step rule of MultiAgentEpisode)."""
    tr = Track("x", [np.zeros(2)], [{}])
    tr.hanging_reward += 2.0
    tr.step(1, {}, 0.5, np.ones(2), {})
    assert tr.rewards == [2.5] and tr.hanging_reward == 0.0
    succ = tr.cut(1)
    assert (succ.lookback, succ.t_started, len(succ), succ.rewards, len(succ.obs)) == (
        1,
        1,
        0,
        [2.5],
        2,
    )


@dataclasses.dataclass(frozen=True)
class ParamAction(Policy):
    """The action is the params (an int): shows which call's params chose it."""

    observation_space: object
    action_space: object

    def init(self, key):
        return 0

    def __call__(self, params, obs, key, state):
        return jnp.full(obs.shape[:2], params, jnp.int32), {}, state


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("kw", [{}, {"num_timesteps": 9}])
def test_each_call_acts_with_its_own_params(fast, kw):
    """The actions of a call's last observations come from the next call's params (both
    paths; the tracks answer each poll before recording it). Lockstep sub-envs, so every
    step of a call's chunk was chosen in that call."""
    env = (Scripted if fast else WithSilentAgent)(
        reward_only=False, off_policy=False, ready_p=1.0
    )  # lockstep
    s = HostSampler(env, ParamAction(env.observation_space, env.action_space), rollout_length=5)
    for p in (1, 2, 3):
        for ep in s.sample(p, **kw):
            for sa in [ep] if fast else ep.agent_episodes.values():
                assert sa.actions.data.tolist()[sa.actions.lookback :] == [p] * len(sa), (p, sa)


def test_one_agent_multi_agent_policy_and_episodes_ended_before_their_first_step():
    """A one-agent env with a MultiAgentPolicy files rows under its policy id; an episode
    whose first observation is already final (start_episode, then end_episode) is no
    episode: nothing is emitted, counted or left running, and no action is sent to it."""
    from jaxsampler.host_envs.external import ExternalEnv

    env = ExternalEnv(Scripted.observation_space, Scripted.action_space)
    pol = js.policies.MultiAgentPolicy(
        env.agent_ids, {"main": ParamAction(env.observation_space, env.action_space)}
    )
    s = HostSampler(env, pol, timeout_s=0.3)
    o = np.zeros(2, np.float32)
    for _ in range(3):
        env.end_episode(env.start_episode(), o)
    eid = env.start_episode()
    env.log_action(eid, o, 1)
    env.end_episode(eid, o)
    batch = s.sample_batch({"main": 2})
    assert list(batch.policy_batches) == ["main"]
    assert batch["main"]["actions"].tolist() == [1] and batch["main"]["terminateds"].tolist() == [
        True
    ]
    assert s.metrics.num_episodes_completed == 1 and env.stats["dropped_actions"] == 0
    assert not s.feed.running_ids() and not s.feed.books.returns
    env.close()
