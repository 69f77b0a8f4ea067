"""End to end: HTTP clients -> PolicyServer -> HostSampler -> MultiAgentBatch.

Concurrent remote clients run episodes whose observations identify (client, episode,
step); a HostSampler thread keeps sampling the server. Every logged step must appear
exactly once in the output batches, with its reward, in the right episode, and the
off-policy (``log_action``) steps must carry the client's action and be marked.
"""

from __future__ import annotations

import threading

import jax
import numpy as np

import jaxsampler as js
from jaxsampler.spaces import Box, Discrete

OBS, ACT = Box(-1e6, 1e6, (3,), np.float32), Discrete(2)
CLIENTS, EPISODES, STEPS = 6, 2, 5


def obs_of(cid: int, ep: int, t: int) -> np.ndarray:
    return np.array([cid, ep, t], np.float32)


def test_http_clients_to_sampler_batches_exactly_once():
    env = js.host_envs.ExternalEnv(OBS, ACT, max_wait_s=0.005)
    server = js.serving.PolicyServer(env, port=0)
    policy = js.MLPPolicy(OBS, ACT, hidden_sizes=(8,))
    params = policy.init(jax.random.PRNGKey(0))
    sampler = js.sampling.HostSampler(
        server, policy, seed=0, timeout_s=0.2, mark_off_policy=True, batch_sizes=(8,)
    )
    batches, stop = [], threading.Event()

    def sample_forever():
        while not stop.is_set():
            batches.append(sampler.sample_batch(params, num_timesteps=8))

    def client(cid: int):
        c = js.serving.PolicyClient(server.address)
        for ep in range(EPISODES):
            eid = c.start_episode(f"c{cid}e{ep}")
            for t in range(STEPS):
                if t == 2:  # an off-policy step: the client's own action
                    c.log_action(eid, obs_of(cid, ep, t), 1)
                else:
                    assert c.get_action(eid, obs_of(cid, ep, t)) in (0, 1)
                c.log_returns(eid, float(100 * cid + 10 * ep + t))
            c.end_episode(eid, obs_of(cid, ep, STEPS))
        c.close()

    worker = threading.Thread(target=sample_forever, daemon=True)
    worker.start()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)

    # Drain: keep sampling until every step has come out (bounded).
    def rows():
        out = [b["default_policy"] for b in batches if b.agent_steps()]
        return sum(sb.count for sb in out), out

    for _ in range(100):
        if rows()[0] >= CLIENTS * EPISODES * STEPS:
            break
        threading.Event().wait(0.05)
    stop.set()
    worker.join(10)
    server.close()
    total, parts = rows()
    assert total == CLIENTS * EPISODES * STEPS
    obs = np.concatenate([sb["obs"] for sb in parts])
    new_obs = np.concatenate([sb["new_obs"] for sb in parts])
    rewards = np.concatenate([sb["rewards"] for sb in parts])
    actions = np.concatenate([sb["actions"] for sb in parts])
    off = np.concatenate([sb["off_policy"] for sb in parts])
    term = np.concatenate([sb["terminateds"] for sb in parts])
    eps = np.concatenate([sb["eps_id"] for sb in parts])
    keys = {tuple(o) for o in obs.astype(int).tolist()}
    assert len(keys) == total  # exactly once: every (client, episode, step) once
    assert keys == {
        (c, e, t) for c in range(CLIENTS) for e in range(EPISODES) for t in range(STEPS)
    }
    np.testing.assert_array_equal(new_obs[:, 2], obs[:, 2] + 1)  # the next obs of the same episode
    np.testing.assert_array_equal(new_obs[:, :2], obs[:, :2])
    np.testing.assert_allclose(rewards, 100 * obs[:, 0] + 10 * obs[:, 1] + obs[:, 2])
    np.testing.assert_array_equal(off, obs[:, 2] == 2)
    assert np.all(actions[obs[:, 2] == 2] == 1)
    np.testing.assert_array_equal(term, obs[:, 2] == STEPS - 1)
    # No episode merged or split: one eps_id per (client, episode), never shared.
    by_episode: dict = {}
    for o, e in zip(obs.astype(int).tolist(), eps.tolist(), strict=True):
        by_episode.setdefault((o[0], o[1]), set()).add(e)
    assert all(len(v) == 1 for v in by_episode.values())
    assert len({next(iter(v)) for v in by_episode.values()}) == CLIENTS * EPISODES


def test_remote_log_action_carries_the_callers_logp_into_the_batch():
    """``PolicyClient.log_action(..., info={"action_logp": x})`` over HTTP: the sampler
    records ``x`` for that row (not its own sample's logp), and batches from a server get
    the ``abandoned`` column (a server's episodes can be abandoned)."""
    env = js.host_envs.ExternalEnv(OBS, ACT, max_wait_s=0.0)
    server = js.serving.PolicyServer(env, port=0)
    policy = js.MLPPolicy(OBS, ACT, hidden_sizes=(8,))
    params = policy.init(jax.random.PRNGKey(0))
    sampler = js.sampling.HostSampler(server, policy, seed=0, timeout_s=0.5, batch_sizes=(1,))
    assert sampler.mark_abandoned
    done = threading.Event()

    def simulator():
        with js.serving.PolicyClient(server.address) as c:
            eid = c.start_episode()
            c.log_action(eid, obs_of(0, 0, 0), 1, info={"action_logp": -0.125})
            c.log_returns(eid, 1.0)
            c.get_action(eid, obs_of(0, 0, 1))
            c.end_episode(eid, obs_of(0, 0, 2))
        done.set()

    th = threading.Thread(target=simulator, daemon=True)
    th.start()
    rows = []
    for _ in range(100):  # a bound, in case a step went missing
        finished = done.is_set()
        b = sampler.sample_batch(params, num_timesteps=1)
        if "default_policy" in b.policy_batches:
            rows.append(b["default_policy"])
        if finished and sampler.metrics.num_env_steps_sampled == 0:
            break
    th.join(10)
    server.close()
    batch = js.episodes.concat_samples(rows)
    t = np.asarray(batch["obs"])[:, 2]
    logged, own = int(np.flatnonzero(t == 0)[0]), int(np.flatnonzero(t == 1)[0])
    assert batch["actions"][logged] == 1
    assert batch["action_logp"][logged] == np.float32(-0.125)
    # The policy's own step: the logp of the action it sampled (a log-probability of one of
    # two actions: negative, above log(1e-6)).
    assert -14 < float(batch["action_logp"][own]) < 0
    np.testing.assert_array_equal(batch["abandoned"], [False, False])
