"""``to_rllib`` episodes in RLlib 2.60's own replay buffers.

Episodes sampled by jaxsampler on CartPole with a 12-step time limit (so both terminations
and truncations occur, and chunks are cut at every call's end) go through ``to_rllib`` into
RLlib's ``EpisodeReplayBuffer`` and ``PrioritizedEpisodeReplayBuffer``; n-step transitions
sampled back out (what DQN's training step asks for: ``sample_episodes=True``, ``n_step``,
``gamma``) are checked row by row against a reference built in plain NumPy from the sampler's
raw time-major buffers (``Sampler.last_chunks``), never from the episode objects under test.

In RLlib 2.60 such a sample is a list of ``SingleAgentEpisode`` objects of length 1: two
observations (``o_t`` and ``o_{t+k}``), one action ``a_t``, one reward (the discounted sum
of the ``k`` rewards), the done flags of ``o_{t+k}``, ``t_started = t`` and the extra model
outputs ``n_step`` and ``weights``. ``EpisodeReplayBuffer`` shortens ``k = min(n, L - t)``
at the end of the ``L`` steps stored so far (and then, in 2.60, drops the done flag of a
shortened row); the prioritized buffer draws again instead.
Without ``sample_episodes`` the plain buffer returns a dict of ``[B, T]`` sequences, also
checked here.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

pytest.importorskip("ray.rllib", reason="RLlib's replay buffers need ray[rllib] (the rllib extra)")
pytest.importorskip("torch", reason="jaxsampler.integrations.rllib needs torch (the rllib extra)")

from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.replay_buffers import (
    EpisodeReplayBuffer,
    PrioritizedEpisodeReplayBuffer,
)

import jaxsampler as js
from jaxsampler.integrations.rllib.convert import to_rllib

GAMMA = 0.9
TIME_LIMIT = 12
NUM_ENVS, ROLLOUT_LENGTH, NUM_CALLS = 6, 10, 4


def _key(obs):
    """An observation as a dict key (CartPole's float32 states do not repeat)."""
    return np.asarray(obs, np.float32).tobytes()


def reference_episodes(chunks_per_call):
    """Every env's episodes read off the raw buffers of consecutive calls, in NumPy.

    The buffers use the next-step auto-reset: after a step with ``terminated`` or
    ``truncated``, ``obs[t + 1]`` is the episode's real final observation and step
    ``t + 1`` is a reset step (``is_reset``) whose ``obs[t + 2]`` starts the next episode.

    Returns:
        a list of dicts ``obs`` (``[L + 1, 4]``), ``actions``, ``rewards`` (``[L]``),
        ``terminated``, ``truncated`` (the flags of the last step; both False while the
        episode is still running when sampling stops).
    """
    per_env = [[] for _ in range(NUM_ENVS)]
    open_eps = [None] * NUM_ENVS
    last_obs = None
    for chunks in chunks_per_call:
        for chunk in chunks:
            obs = np.asarray(chunk.obs)[:, :, 0]  # [T + 1, E, 4] (A = 1 squeezed)
            actions = np.asarray(chunk.actions)[:, :, 0]
            rewards = np.asarray(chunk.rewards)[:, :, 0]
            term = np.asarray(chunk.terminated)[:, :, 0]
            trunc = np.asarray(chunk.truncated)[:, :, 0]
            reset = np.asarray(chunk.is_reset)
            if last_obs is not None:  # a call continues where the last one stopped
                np.testing.assert_array_equal(obs[0], last_obs)
            last_obs = obs[-1]
            for e in range(NUM_ENVS):
                for t in range(len(rewards)):
                    if open_eps[e] is None:
                        if reset[t, e]:
                            continue  # the reset step: obs[t + 1] starts the next one
                        open_eps[e] = dict(obs=[obs[t, e]], actions=[], rewards=[])
                    assert not reset[t, e]
                    ep = open_eps[e]
                    np.testing.assert_array_equal(ep["obs"][-1], obs[t, e])
                    ep["obs"].append(obs[t + 1, e])
                    ep["actions"].append(int(actions[t, e]))
                    ep["rewards"].append(float(rewards[t, e]))
                    if term[t, e] or trunc[t, e]:
                        # an episode that terminates on the time limit's step is
                        # terminated, not truncated (an RLlib episode holds one flag)
                        ep.update(
                            terminated=bool(term[t, e]),
                            truncated=bool(trunc[t, e] and not term[t, e]),
                        )
                        per_env[e].append(ep)
                        open_eps[e] = None
                    else:
                        ep.update(terminated=False, truncated=False)
    for e, ep in enumerate(open_eps):
        if ep is not None:
            per_env[e].append(ep)
    episodes = [ep for eps in per_env for ep in eps]
    for ep in episodes:
        ep["obs"] = np.stack(ep["obs"])
        ep["rewards"] = np.asarray(ep["rewards"])
    return episodes


def reference_steps(episodes):
    """``obs bytes -> (episode index, t)`` for every step's observation ``o_t``."""
    index = {}
    for i, ep in enumerate(episodes):
        for t in range(len(ep["actions"])):
            key = _key(ep["obs"][t])
            assert key not in index, "CartPole observations repeated: keys not unique"
            index[key] = (i, t)
    return index


def n_step_row(ep, t, n):
    """The reference transition at step ``t`` of ``ep`` with up to ``n`` steps."""
    length = len(ep["actions"])
    k = min(n, length - t)
    reward = sum(GAMMA**j * ep["rewards"][t + j] for j in range(k))
    # RLlib 2.60's EpisodeReplayBuffer slices [t, t + n) and keeps the done flags only when
    # the slice stops exactly at the episode's end (t + n == L): a shortened row (t + n > L)
    # reaches the final observation without its flag. The prioritized buffer never shortens.
    at_end = t + n == length
    return dict(
        obs=ep["obs"][t],
        action=ep["actions"][t],
        reward=reward,
        next_obs=ep["obs"][t + k],
        terminated=at_end and ep["terminated"],
        truncated=at_end and ep["truncated"],
        k=k,
    )


@pytest.fixture(scope="module")
def sampled():
    """Four calls of jaxsampler's ``Sampler`` on CartPole with a 12-step limit: the RLlib
    episodes (``to_rllib`` of each call's episodes) and the reference built from the
    calls' raw buffers."""
    env = js.make("CartPole-v1")
    policy = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    params = policy.init(jax.random.PRNGKey(1))
    sampler = js.Sampler(
        env,
        policy,
        num_envs=NUM_ENVS,
        rollout_length=ROLLOUT_LENGTH,
        seed=3,
        env_params=env.default_params.replace(max_steps_in_episode=TIME_LIMIT),
    )
    calls, chunks = [], []
    for _ in range(NUM_CALLS):
        calls.append(to_rllib(sampler.sample(params)))
        chunks.append(list(sampler.last_chunks))
    sampler.close()
    episodes = reference_episodes(chunks)
    # The data covers what the test is about: both kinds of episode end, and episodes cut
    # at a call's end (continued in the next call, and still open at the last one's end).
    assert any(ep["terminated"] for ep in episodes)
    assert any(ep["truncated"] for ep in episodes)
    assert any(not (ep["terminated"] or ep["truncated"]) for ep in episodes)
    assert any(e.t_started > 0 for call in calls[1:] for e in call)
    return calls, episodes


def _filled(buffer_cls, calls):
    buffer = buffer_cls(capacity=100_000)
    buffer.rng = np.random.default_rng(0)  # RLlib seeds it from the OS otherwise
    for call in calls:
        buffer.add(call)
    return buffer


def _check_rows(rows, episodes, n, *, full_n_only):
    """Every sampled row equals the reference; returns the (episode, t) keys seen."""
    index = reference_steps(episodes)
    seen = set()
    ids_of = {}
    for row in rows:
        assert type(row) is SingleAgentEpisode and len(row) == 1
        i, t = index[_key(row.get_observations(0))]
        ref = n_step_row(episodes[i], t, n)
        if full_n_only:
            assert ref["k"] == n  # the prioritized buffer never shortens n
        np.testing.assert_array_equal(row.get_observations(0), ref["obs"])
        np.testing.assert_array_equal(row.get_observations(-1), ref["next_obs"])
        assert int(row.get_actions(0)) == ref["action"]
        np.testing.assert_allclose(float(row.get_rewards(0)), ref["reward"], rtol=1e-6)
        assert (row.is_terminated, row.is_truncated) == (ref["terminated"], ref["truncated"])
        assert row.t_started == t
        # RLlib's n_step column holds the requested n, also where it shortened it
        np.testing.assert_array_equal(row.get_extra_model_outputs("n_step"), [n])
        np.testing.assert_allclose(row.get_extra_model_outputs("weights"), [1.0])
        # the plain buffer keeps the stored episode's id_ (one per reference episode: the
        # chunks of an episode were concatenated); the prioritized one makes fresh ids
        if not full_n_only:
            assert ids_of.setdefault(i, row.id_) == row.id_
        seen.add((i, t))
    assert len(set(ids_of.values())) == len(ids_of)
    return seen


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize(
    "buffer_cls",
    [EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer],
    ids=["plain", "prioritized"],
)
def test_n_step_transitions_equal_the_raw_buffers(sampled, buffer_cls, n):
    calls, episodes = sampled
    buffer = _filled(buffer_cls, calls)
    total = sum(len(ep["actions"]) for ep in episodes)
    assert buffer.get_num_timesteps() == total
    # one buffer episode per episode: the call-end chunks were concatenated
    assert buffer.get_num_episodes() == len(episodes)
    prioritized = buffer_cls is PrioritizedEpisodeReplayBuffer
    rows = []
    for _ in range(8):  # DQN's call: sample_episodes=True, n_step, gamma (beta for PER)
        kwargs = dict(beta=0.0) if prioritized else dict(sample_episodes=True)
        rows += buffer.sample(num_items=256, n_step=n, gamma=GAMMA, **kwargs)
    seen = _check_rows(rows, episodes, n, full_n_only=prioritized)
    # 2048 seeded draws over ~200 steps: every step that can be sampled was
    possible = {
        (i, t)
        for i, ep in enumerate(episodes)
        for t in range(len(ep["actions"]))
        if not prioritized or t + n <= len(ep["actions"])
    }
    assert seen == possible
    # and at every truncation the next observation is the episode's REAL final one, not
    # the first observation of the episode the env was reset to
    truncated_rows = [r for r in rows if r.is_truncated]
    assert truncated_rows
    firsts = {_key(ep["obs"][0]) for ep in episodes}
    for row in truncated_rows:
        i, _ = reference_steps(episodes)[_key(row.get_observations(0))]
        np.testing.assert_array_equal(row.get_observations(-1), episodes[i]["obs"][-1])
        assert _key(row.get_observations(-1)) not in firsts


def test_sequence_batches_equal_the_raw_buffers(sampled):
    """``sample()`` without ``sample_episodes``: a dict of ``[B, T]`` rows of consecutive
    steps; a row that reaches an episode's end goes on with another episode from its first
    observation. Each segment (``is_first`` to the next) is checked against the reference:
    observations, actions (the last repeated at the final observation), rewards (the one
    received on arriving at each observation; 0.0 at an episode's start) and the flags."""
    calls, episodes = sampled
    buffer = _filled(EpisodeReplayBuffer, calls)
    batch = buffer.sample(batch_size_B=64, batch_length_T=8)
    assert set(batch) == {
        "obs",
        "actions",
        "rewards",
        "is_first",
        "is_last",
        "is_terminated",
        "is_truncated",
    }
    assert batch["obs"].shape == (64, 8, 4) and batch["is_first"].shape == (64, 8)
    index = {}
    for i, ep in enumerate(episodes):
        for t, o in enumerate(ep["obs"]):
            index.setdefault(_key(o), (i, t))
    truncated_ends = 0
    for b in range(64):
        starts = [int(s) for s in np.flatnonzero(batch["is_first"][b])]
        assert starts[0] == 0
        for s, stop in zip(starts, starts[1:] + [8], strict=True):
            i, t = index[_key(batch["obs"][b, s])]
            ep = episodes[i]
            if s > 0:
                assert t == 0  # a continuation starts at an episode's first observation
            length = len(ep["actions"])
            m = stop - s
            np.testing.assert_array_equal(batch["obs"][b, s:stop], ep["obs"][t : t + m])
            acts = ep["actions"] + [ep["actions"][-1]]
            np.testing.assert_array_equal(batch["actions"][b, s:stop], acts[t : t + m])
            rew = [0.0 if t + j == 0 else ep["rewards"][t + j - 1] for j in range(m)]
            np.testing.assert_allclose(batch["rewards"][b, s:stop], rew)
            reaches_end = t + m - 1 == length
            assert bool(batch["is_terminated"][b, stop - 1]) == (reaches_end and ep["terminated"])
            assert bool(batch["is_truncated"][b, stop - 1]) == (reaches_end and ep["truncated"])
            assert not batch["is_terminated"][b, s : stop - 1].any()
            assert not batch["is_truncated"][b, s : stop - 1].any()
            truncated_ends += int(reaches_end and ep["truncated"])
    assert truncated_ends > 0  # a truncated episode's real final observation was in a row
