"""Multi-agent sampling: Sampler.sample() / sample_batch() against a plain Python loop.

The reference replays the same device buffers env step by env step through
``MultiAgentEpisode.add_env_reset`` / ``add_env_step`` (RLlib's stepping semantics:
hanging actions, rewards summed while an agent waits, late joiners, agents done at
different times) and ``cut``s ongoing episodes at every call boundary, as RLlib's env
runner does. The sampler builds the same chunks vectorized; both must agree field by
field, and ``sample_batch()`` must equal the batch made from ``sample()``'s episodes.
"""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.episodes.multi_agent import MultiAgentEpisode
from tests.fakes import ChaosEnv, CountingPolicy, TurnEnv
from tests.sampling.device.test_sampler import no_policy_traces

E, T, SEED = 3, 7, 4


def device_calls(env, policy, params, n_calls, seed=SEED):
    """The Sampler's rollout calls, replayed: (traj, acting and needs_reset after it)."""
    key = jax.random.PRNGKey(seed)
    key, k = jax.random.split(key)
    state = js.init_rollout_state(env, policy, E, k)
    rollout = jax.jit(js.make_rollout(env, policy, E, T))
    calls = []
    for _ in range(n_calls):
        state, traj = rollout(params, state)
        calls.append(
            (jax.device_get(traj), np.asarray(state.acting), np.asarray(state.needs_reset))
        )
    return calls


def reference_chunks(calls, env, horizon, mapping, cut=True, finished_log=None, rllib_flags=False):
    """Per call, the episode chunks of the reference loop in sample()'s order (with
    ``cut=False`` episodes are never cut; ``finished_log`` collects (env, episode)).

    As RLlib's env runner: at the end of a call the ongoing chunks' successors are cut,
    then every returned chunk loses its agents without a step (``len == 0``)."""
    ids, A = env.agent_ids, env.num_agents
    open_eps: dict[int, MultiAgentEpisode] = {}
    done: dict[int, set] = {}
    out = []
    for traj, next_acting, next_reset in calls:
        finished = []
        chunk = dict(open_eps)
        acting = np.concatenate([traj.acting, next_acting[None]], axis=0)
        is_reset = np.concatenate([traj.is_reset, next_reset[None]], axis=0)
        for t in range(T):
            for e in range(E):
                if traj.is_reset[t, e]:
                    continue
                obs = traj.obs[:, e]
                if e not in chunk:  # a new episode starts at obs[t]
                    ep = MultiAgentEpisode(agent_to_module_mapping_fn=lambda aid, _: mapping[aid])
                    ep.add_env_reset(
                        observations={ids[a]: obs[t, a] for a in range(A) if acting[t, e, a]}
                    )
                    chunk[e], done[e] = ep, set()
                ep = chunk[e]
                flags = traj.terminated[t, e] | traj.truncated[t, e]
                newly = [a for a in range(A) if flags[a] and ids[a] not in done[e]]
                all_done = bool(flags.all())
                ep.add_env_step(
                    {
                        ids[a]: obs[t + 1, a]
                        for a in range(A)
                        if a in newly
                        or (
                            not is_reset[t + 1, e] and acting[t + 1, e, a] and ids[a] not in done[e]
                        )
                    },
                    {ids[a]: traj.actions[t, e, a] for a in range(A) if acting[t, e, a]},
                    {
                        ids[a]: float(traj.rewards[t, e, a])
                        for a in range(A)
                        if ids[a] not in done[e]
                    },
                    # No "__all__": RLlib would OR it into the flags of every agent still
                    # active; jaxsampler keeps each agent's own flags (documented).
                    terminateds={ids[a]: True for a in newly if traj.terminated[t, e, a]},
                    truncateds={
                        ids[a]: True
                        for a in newly
                        if traj.truncated[t, e, a] and not traj.terminated[t, e, a]
                    },
                    extra_model_outputs={
                        ids[a]: {k: v[t, e, a] for k, v in traj.extras.items()}
                        for a in range(A)
                        if acting[t, e, a]
                    },
                )
                done[e] |= {ids[a] for a in newly}
                if not rllib_flags:  # each agent keeps the env's own flags (the default)
                    for a in newly:
                        sa = ep.agent_episodes.get(ids[a])
                        if sa is not None:
                            sa.is_terminated = bool(traj.terminated[t, e, a])
                            sa.is_truncated = bool(
                                traj.truncated[t, e, a] and not traj.terminated[t, e, a]
                            )
                # The episode ends when the env has every agent done. (RLlib also ends it
                # when every agent *seen so far* is done; agents may still join here.)
                ep.is_terminated = ep.is_terminated and all_done
                if all_done:
                    ep.is_truncated = bool(traj.truncated[t, e].any())  # truncateds["__all__"]
                    if finished_log is not None:
                        finished_log.append((e, ep))
                    finished.append((e, t, ep))
                    del chunk[e]
        open_eps = {e: (ep.cut(horizon) if cut else ep) for e, ep in chunk.items()}
        finished.sort(key=lambda x: x[:2])  # the sampler's order: env by env, then in time
        for _, _, ep in finished:
            ep.prune_empty_agents()
        if cut:
            for ep in chunk.values():
                ep.prune_empty_agents()
        out.append([ep for _, _, ep in finished] + [chunk[e] for e in sorted(chunk)])
    return out


def assert_same_chunk(got: MultiAgentEpisode, want: MultiAgentEpisode):
    assert (len(got), got.env_t_started, got.env_t) == (len(want), want.env_t_started, want.env_t)
    assert (got.is_terminated, got.is_truncated) == (want.is_terminated, want.is_truncated)
    assert got._len_lookback_buffers == want._len_lookback_buffers
    assert set(got.agent_episodes) == set(want.agent_episodes)
    for aid, w in want.agent_episodes.items():
        g = got.agent_episodes[aid]
        assert (g.t_started, g.t, g.is_terminated, g.is_truncated) == (
            w.t_started,
            w.t,
            w.is_terminated,
            w.is_truncated,
        ), aid
        for col in ("observations", "actions", "rewards"):
            gb, wb = getattr(g, col), getattr(w, col)
            assert gb.lookback == wb.lookback, (aid, col)
            np.testing.assert_allclose(
                np.asarray(gb.data, np.float64),
                np.asarray(wb.data, np.float64),
                err_msg=f"{aid} {col}",
            )
        assert set(g.extra_model_outputs) == set(w.extra_model_outputs) or len(w) == 0
        for k, wb in w.extra_model_outputs.items():
            np.testing.assert_array_equal(
                np.asarray(g.extra_model_outputs[k].data), np.asarray(wb.data)
            )
        assert g.module_id == w.module_id
        assert got.env_t_to_agent_t[aid].data == want.env_t_to_agent_t[aid].data, aid
        assert got.env_t_to_agent_t[aid].lookback == want.env_t_to_agent_t[aid].lookback
    assert set(got._hanging_actions_end) == set(want._hanging_actions_end)
    for aid in want._hanging_actions_end:
        assert got._hanging_actions_end[aid] == want._hanging_actions_end[aid]
        assert got._hanging_rewards_end[aid] == pytest.approx(want._hanging_rewards_end[aid])
    assert got.get_return() == pytest.approx(want.get_return())
    assert got.agent_steps() == want.agent_steps()


@pytest.mark.parametrize("env_id", ["chaos", "turns", "TicTacToe-v0", "Goals-v0"])
@pytest.mark.parametrize("horizon", [0, 2])
def test_sample_matches_the_reference_loop(env_id, horizon):
    env = {"chaos": ChaosEnv(), "turns": TurnEnv(length=5)}.get(env_id) or js.make(env_id)
    if env_id == "TicTacToe-v0":  # random moves (illegal ones end the game)
        policy = js.RandomPolicy(env.observation_space, env.action_space)
    else:
        policy = CountingPolicy(env.observation_space, env.action_space)
    n_calls = 6 if env_id != "Goals-v0" else 12
    sampler = js.Sampler(
        env, policy, num_envs=E, rollout_length=T, seed=SEED, episode_lookback_horizon=horizon
    )
    got = [sampler.sample(()) for _ in range(n_calls)]
    mapping = dict.fromkeys(env.agent_ids, "default_policy")
    want = reference_chunks(device_calls(env, policy, (), n_calls), env, horizon, mapping)
    n_done = 0
    for g_call, w_call in zip(got, want, strict=True):
        assert len(g_call) == len(w_call)
        for g, w in zip(g_call, w_call, strict=True):
            assert_same_chunk(g, w)
            n_done += w.is_done
    assert n_done >= 2  # the fixture really ends episodes (and cuts others)


def batch_from_episodes(episodes, policy_of):
    """The MultiAgentBatch made by hand from episodes (RLlib's get_sample_batch + new_obs)."""
    rows: dict = {}
    for ep in episodes:
        for aid, sa in sorted(ep.agent_episodes.items(), key=lambda kv: kv[0]):
            if len(sa) == 0:
                continue
            b = sa.get_sample_batch()
            cols = dict(b)
            cols["new_obs"] = sa.get_observations(slice(1, None))
            cols["agent_index"] = np.full(len(sa), int(aid.split("_")[1]))
            rows.setdefault(policy_of[aid], []).append(cols)
    out = {}
    for pid, parts in rows.items():
        out[pid] = {
            k: (
                np.concatenate([p[k] for p in parts])
                if k != "infos"
                else sum((list(p[k]) for p in parts), [])
            )
            for k in parts[0]
        }
    return out


@pytest.mark.parametrize("horizon", [0, 1])
def test_sample_batch_equals_the_batch_built_from_sample(horizon):
    env = ChaosEnv()
    policy = js.policies.MultiAgentPolicy(
        env,
        {
            "p0": CountingPolicy(env.observation_space, env.action_space),
            "p1": CountingPolicy(env.observation_space, env.action_space),
        },
        lambda aid: "p0" if aid == "agent_0" else "p1",
    )
    params = {"p0": (), "p1": ()}
    s_eps = js.Sampler(
        env, policy, num_envs=E, rollout_length=T, seed=SEED, episode_lookback_horizon=horizon
    )
    s_bat = js.Sampler(
        env, policy, num_envs=E, rollout_length=T, seed=SEED, episode_lookback_horizon=horizon
    )
    policy_of = {"agent_0": "p0", "agent_1": "p1", "agent_2": "p1"}
    for _ in range(4):
        episodes = s_eps.sample(params)
        batch = s_bat.sample_batch(params)
        assert isinstance(batch, js.MultiAgentBatch)
        want = batch_from_episodes(episodes, policy_of)
        assert batch.env_steps() == s_eps.metrics.num_env_steps_sampled
        assert batch.agent_steps() == sum(ep.agent_steps() for ep in episodes)
        for pid, w in want.items():
            g = batch[pid]
            # Rows are episode by episode, then agent by agent: same order as built by hand.
            for k in (
                "obs",
                "new_obs",
                "actions",
                "rewards",
                "terminateds",
                "truncateds",
                "t",
                "agent_index",
                "count",
            ):
                np.testing.assert_array_equal(
                    np.asarray(g[k]), np.asarray(w[k]), err_msg=f"{pid} {k}"
                )
            eps_from_batch = np.asarray(g["eps_id"])
            assert list(eps_from_batch) == list(w["eps_id"])


def test_continuation_chunks_keep_ids_and_concatenate_to_the_full_episode():
    env = ChaosEnv()
    policy = CountingPolicy(env.observation_space, env.action_space)
    sampler = js.Sampler(env, policy, num_envs=1, rollout_length=3, seed=1)
    seen: dict = {}
    for _ in range(8):
        for ep in sampler.sample(()):
            seen.setdefault(ep.id_, []).append(ep)
    multi = [chunks for chunks in seen.values() if len(chunks) > 1]
    assert multi
    for chunks in multi:
        for a, b in itertools.pairwise(chunks):
            assert a.env_t == b.env_t_started
            for aid, sa in b.agent_episodes.items():
                if aid in a.agent_episodes:
                    assert sa.id_ == a.agent_episodes[aid].id_


@pytest.mark.parametrize("env_id", ["chaos", "TicTacToe-v0"])
def test_chunks_concatenate_to_the_uncut_episode(env_id):
    """concat_episode of an episode's sample() chunks equals the episode stepped without cuts."""
    env = ChaosEnv() if env_id == "chaos" else js.make(env_id)
    policy = CountingPolicy(env.observation_space, env.action_space)
    n_calls = 8
    sampler = js.Sampler(
        env, policy, num_envs=E, rollout_length=T, seed=SEED, episode_lookback_horizon=1
    )
    chunks: dict = {}
    for _ in range(n_calls):
        for ep in sampler.sample(()):
            chunks.setdefault(ep.id_, []).append(ep)
    log: list = []
    reference_chunks(
        device_calls(env, policy, (), n_calls),
        env,
        0,
        dict.fromkeys(env.agent_ids, "default_policy"),
        cut=False,
        finished_log=log,
    )
    count = {}
    checked = multi = 0
    for e, want in log:
        c = count[e] = count.get(e, -1) + 1
        parts = chunks[sampler._episode_id(e, c)]
        got = parts[0]
        for part in parts[1:]:
            got.concat_episode(part)
        assert_same_chunk(got, want)
        checked += 1
        multi += len(parts) > 1
    assert checked >= 4 and multi >= 2


def test_infos_belong_to_each_agents_observations():
    """TicTacToe's info.action_mask ([A, 9], split per agent) equals the legal-move part of
    the observation it came with, in every chunk (new ones and continuations) and row."""
    env = js.make("TicTacToe-v0")
    policy = js.RandomPolicy(env.observation_space, env.action_space)
    sampler = js.Sampler(env, policy, num_envs=2, rollout_length=5, seed=3)
    checked = 0
    for _ in range(4):
        for ep in sampler.sample(()):
            for sa in ep.agent_episodes.values():
                assert sa.infos.finalized
                mask = sa.infos.data["action_mask"]
                np.testing.assert_array_equal(
                    mask, np.asarray(sa.observations.data)[:, 18:27] > 0.5
                )
                checked += len(mask)
    batch = js.Sampler(env, policy, num_envs=2, rollout_length=5, seed=3).sample_batch(())[
        "default_policy"
    ]
    np.testing.assert_array_equal(batch["infos"]["action_mask"], batch["obs"][:, 18:27] > 0.5)
    assert checked > 20


def test_num_episodes_num_timesteps_metrics_and_no_recompile(monkeypatch):
    env = js.make("Goals-v0", n=2)
    mlp = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    policy = js.policies.MultiAgentPolicy(
        env, {"a": mlp, "b": mlp}, lambda aid: "a" if aid == "agent_0" else "b"
    )
    params = policy.init(jax.random.PRNGKey(0))
    sampler = js.Sampler(env, policy, num_envs=4, rollout_length=16, seed=0)
    eps = sampler.sample(params, num_episodes=5)
    done = [ep for ep in eps if ep.is_done]
    assert (
        len(done) == sampler.metrics.num_episodes_completed >= 5
    )  # all that ended at the step the 5th did
    assert all(ep.env_t_started == 0 for ep in done)
    for ep in done:  # every agent finished, each with its own flags, under its own module
        assert set(ep.agent_episodes) == {"agent_0", "agent_1"}
        assert all(sa.is_done for sa in ep.agent_episodes.values())
        assert ep.agent_to_module_mapping == {"agent_0": "a", "agent_1": "b"}
        assert ep.agent_episodes["agent_1"].module_id == "b"
    batch = sampler.sample_batch(params, num_timesteps=100)
    m = sampler.metrics
    assert m.num_env_steps_sampled >= 100 and batch.env_steps() == m.num_env_steps_sampled
    assert m.num_agent_steps_sampled == batch.agent_steps() > 0
    assert set(batch.policy_batches) == {"a", "b"}
    assert set(np.unique(batch["a"]["agent_index"])) <= {0} and set(
        np.unique(batch["b"]["agent_index"])
    ) <= {1}
    with no_policy_traces(monkeypatch, js.MLPPolicy):  # repeated calls never recompile
        for _ in range(3):
            sampler.sample(params)
            sampler.sample_batch(params)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("by_policy", [False, True])
def test_output_order_equals_a_lexsort(seed, by_policy):
    """The counting order of the agent steps equals sorting by ((rank,) segment, agent, t)."""
    from jaxsampler.sampling.device.multi import output_order

    rng = np.random.default_rng(seed)
    S, A = 7, 3
    rank = rng.integers(0, 2, A) if by_policy else None
    pos, agent, t = [], [], []
    for p in range(-1, S):  # -1: a dropped segment
        for a in range(A):
            n, t0 = int(rng.integers(0, 5)), int(rng.integers(0, 9))
            pos += [p] * n
            agent += [a] * n
            t += list(range(t0, t0 + n))  # an agent's steps in a segment: consecutive t
    perm = rng.permutation(len(pos))  # any input order
    pos, agent, t = (np.array(x, np.int64)[perm] for x in (pos, agent, t))
    keys = (t, agent, pos) + ((rank[agent],) if by_policy else ())
    want = np.lexsort(keys)
    want = want[pos[want] >= 0]
    np.testing.assert_array_equal(output_order(pos, agent, t, S, A, rank), want)


def assert_rllib_runner_chunks(calls_of_episodes, action_dtype) -> int:
    """What RLlib's MultiAgentEnvRunner returns: every chunk numpy'ized (columns are
    arrays, ``is_numpy``), no agent episode without a step, and every agent step of an
    episode in exactly one chunk (a step left hanging at a call's end completes in a later
    chunk). Returns the number of continuation chunks seen."""
    seen: dict = {}
    continuations = 0
    for episodes in calls_of_episodes:
        for ep in episodes:
            continuations += ep.env_t_started > 0
            assert ep.is_numpy or not ep.agent_episodes
            for aid, sa in ep.agent_episodes.items():
                assert len(sa) > 0, (ep.id_, aid)
                for buf in (sa.observations, sa.actions, sa.rewards):
                    assert buf.finalized and isinstance(buf.data, np.ndarray)
                assert all(b.finalized for b in sa.extra_model_outputs.values())
                assert sa.actions.data.dtype == (action_dtype or sa.actions.data.dtype)
                action_dtype = sa.actions.data.dtype  # one dtype in every chunk
                assert sa.rewards.data.dtype.kind == "f"
                seen.setdefault((ep.id_, aid), []).extend(range(sa.t_started, sa.t))
    for key, ts in seen.items():
        assert ts == list(range(len(ts))), key  # each step once, none lost
    return continuations


@pytest.mark.parametrize("env_id", ["chaos", "TicTacToe-v0"])
@pytest.mark.parametrize("horizon", [0, 1])
def test_chunks_are_numpy_without_empty_agents_from_every_call(env_id, horizon):
    env = ChaosEnv() if env_id == "chaos" else js.make(env_id)
    policy = CountingPolicy(env.observation_space, env.action_space)
    sampler = js.Sampler(
        env, policy, num_envs=E, rollout_length=5, seed=SEED, episode_lookback_horizon=horizon
    )
    calls = [sampler.sample(()) for _ in range(6)]
    dtype = np.asarray(env.action_space.zeros()).dtype
    assert assert_rllib_runner_chunks(calls, dtype) >= 3
    # chunks batch like RLlib's: every column concatenates into arrays
    from jaxsampler.sampling.host.collector import episodes_to_batch

    for episodes in calls[1:]:
        b = episodes_to_batch(episodes, env.agent_ids)["default_policy"]
        assert isinstance(b["actions"], np.ndarray) and b["actions"].dtype == dtype
        assert isinstance(b["rewards"], np.ndarray) and len(b["rewards"]) == b.count
