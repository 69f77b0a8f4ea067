"""Write-ahead journal of a multi-agent external env: after a crash, :func:`recover` stores
every acknowledged *agent* step in the sampler's log exactly once, as
:class:`MultiAgentEpisode` chunks.

Client threads drive an :class:`ExternalMultiAgentEnv` whose agents act out of lockstep
(``a`` every step; ``b`` every other step, done before the episode ends; ``c`` joins late)
and record what the env acknowledged: per (episode, agent, agent step) the observation,
the action returned (or logged) and the rewards logged for the agent after it. The
sampler helpers are ``test_journal``'s and ``test_journal_checkpoint``'s (a sampler that
dies with its last outputs unwritten, one that checkpoints the journal); observations say
(client, episode, step, agent), so the log is checked against the clients' own record,
step by step: each acknowledged step once, with its action and reward, none invented.
"""

from __future__ import annotations

import threading
import warnings
from collections import Counter

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.constants import DEFAULT_POLICY_ID
from jaxsampler.episodes import MultiAgentEpisode
from jaxsampler.host_envs.external import ExternalEnv, ExternalMultiAgentEnv
from jaxsampler.offline import (
    CorruptLogError,
    OfflineWriter,
    RepeatedRunWarning,
    StepJournal,
    read_records,
    recover,
)
from tests.serving.test_journal import crashing_sampler, journal_entries
from tests.serving.test_journal_checkpoint import checkpointing_sampler
from tests.serving.test_multi_agent import ACT, AGENTS, OBS, obs_of, reward_of

SPACES = (OBS, ACT)


def ma_env(journal=None, **kwargs) -> ExternalMultiAgentEnv:
    return ExternalMultiAgentEnv(OBS, ACT, agent_ids=AGENTS, journal=journal, **kwargs)


class AgentAcks:
    """What the env acknowledged, by (episode id, agent, agent step): the observation, the
    action and the rewards logged for the agent after that action."""

    def __init__(self):
        self.lock = threading.Lock()
        self.steps: dict[tuple, dict] = {}
        self.seen: Counter = Counter()  # (episode id, agent) -> observations sent

    def acted(self, eid: str, obs: dict, actions: dict) -> None:
        with self.lock:
            for a, o in obs.items():
                t = self.seen[eid, a]
                self.seen[eid, a] += 1
                if a in actions:
                    key = (eid, a, t)
                    self.steps[key] = {"obs": key_of(o), "action": int(actions[a]), "reward": 0.0}

    def rewarded(self, eid: str, rewards: dict) -> None:
        with self.lock:
            for a, r in rewards.items():
                self.steps[eid, a, self.seen[eid, a] - 1]["reward"] += r

    def want(self) -> Counter:
        return Counter(
            (e, a, t, s["obs"], s["action"], s["reward"]) for (e, a, t), s in self.steps.items()
        )


def ma_sampler(env):
    """A host sampler over ``env`` and its policy's params."""
    policy = js.MLPPolicy(OBS, ACT, hidden_sizes=(4,))
    sampler = js.sampling.HostSampler(env, policy, seed=0, timeout_s=0.05)
    return sampler, policy.init(jax.random.PRNGKey(0))


def key_of(obs) -> tuple:
    return tuple(int(v) for v in np.asarray(obs))


def run_ma_client(env, acks, cid, episodes, stop_at=None, length=5, own_actions=False):
    """``episodes`` scripted episodes (see the module docstring); the last one stops after
    step ``stop_at`` (left open: the crash ends it) unless ``stop_at`` is None. Agent ``b``
    observes at steps 0 and 2, is done after step 2 and sends its final observation at 3;
    ``c`` joins at step 1; client 0 logs its own actions at step 2 (every client at every
    step with ``own_actions``: no sampler needed); odd clients end their episodes
    truncated."""
    for ep in range(episodes):
        eid = env.start_episode(f"c{cid}e{ep}")
        last = stop_at if ep == episodes - 1 and stop_at is not None else None
        live: set[str] = set()
        for k in range(length):
            seen = ["a"] + (["b"] if k in (0, 2, 3) else []) + (["c"] if k >= 1 else [])
            obs = {a: obs_of(cid, ep, k, a) for a in seen}
            acting = [a for a in seen if not (a == "b" and k == 3)]  # b's final observation
            if own_actions or (k == 2 and cid == 0):
                actions = {a: (k + AGENTS.index(a)) % 3 for a in acting}
                env.log_action(eid, obs, actions)
            else:
                actions = env.get_action(eid, obs)
            assert set(actions) == set(acting)
            acks.acted(eid, obs, actions)
            live = (live | set(seen)) - ({"b"} if k == 3 else set())
            rewards = {a: reward_of(cid, ep, k, a) for a in sorted(live)}
            env.log_returns(eid, rewards, multiagent_done_dict={"b": True} if k == 2 else None)
            acks.rewarded(eid, rewards)
            if k == last:
                break
        else:
            final = {a: obs_of(cid, ep, length, a) for a in sorted(live)}
            env.end_episode(eid, final, truncated=cid % 2 == 1)
            acks.acted(eid, final, {})


def logged(path) -> Counter:
    """Every agent step the log holds: (episode id, agent, step, obs, action, reward)."""
    out: Counter = Counter()
    for rec in read_records(path):
        assert isinstance(rec, MultiAgentEpisode)
        for a, sa in rec.agent_episodes.items():
            obs, acts, rews = sa.get_observations(), sa.get_actions(), sa.get_rewards()
            for i in range(len(sa)):
                key = key_of(obs[i])
                assert rec.id_ == f"c{key[0]}e{key[1]}" and key[3] == AGENTS.index(a)
                step = (rec.id_, a, sa.t_started + i, key, int(acts[i]), float(rews[i]))
                out[step] += 1
    return out


def run_clients(env, sampler, args, stops, episodes=3):
    """Client threads (one per entry of ``stops``) and a sampler thread
    ``sampler(env, *args, stop)``; returns the clients' acknowledgements once all ran."""
    acks, stop = AgentAcks(), threading.Event()
    th = threading.Thread(target=sampler, args=(env, *args[:1], stop, *args[1:]))
    th.start()
    clients = [
        threading.Thread(target=run_ma_client, args=(env, acks, c, episodes, s))
        for c, s in enumerate(stops)
    ]
    for c in clients:
        c.start()
    for c in clients:
        c.join(60)
    stop.set()
    th.join(60)
    return acks


@pytest.mark.filterwarnings("ignore::jaxsampler.offline.TruncatedLogWarning")
@pytest.mark.parametrize("lost_calls", [0, 3])
def test_every_acknowledged_agent_step_is_in_the_log_exactly_once_after_recovery(
    tmp_path, lost_calls
):
    """Clients 0 and 2 leave their last episode open (after step 1: ``b`` waits for its
    next observation; after step 3: ``b`` is done), the sampler dies with its last
    ``lost_calls`` outputs unwritten; recovery twice adds nothing the second time."""
    journal, log = tmp_path / "steps.journal", tmp_path / "data.log"
    env = ma_env(StepJournal(journal), max_wait_s=0.002)
    acks = run_clients(env, crashing_sampler, (log, lost_calls, SPACES), [1, None, 3, None])

    report = recover(journal, log, ma_env(), compact=False)
    want = acks.want()
    assert logged(log) == want  # each acknowledged agent step once, none invented
    assert report.acknowledged_steps == sum(want.values())
    assert report.acknowledged_steps == report.stored_steps + report.recovered_steps
    assert sorted(report.ended_by_crash) == ["c0e2", "c2e2"]
    if lost_calls:
        assert report.recovered_steps > 0
    again = recover(journal, log, ma_env())  # the whole journal again: the log has it all
    assert again.recovered_steps == 0 and again.stored_steps == report.acknowledged_steps
    assert again.compacted and recover(journal, log, ma_env()).episodes == 0
    assert logged(log) == want


def test_a_crash_ends_open_episodes_truncated_and_closes_waiting_agents(tmp_path):
    """No sampler ran: every step is recovered. In ``c0e0``, ``b`` was done before the crash
    (its own terminated flag) and ``a`` and ``c`` end truncated (their last observation
    repeated, the env's abandonment rule); in ``c1e0``, ``b`` acted and waits for its next
    observation: it gets its last one again, so its acknowledged step is kept."""
    journal, log = tmp_path / "j", tmp_path / "log"
    env = ma_env(StepJournal(journal))
    acks = AgentAcks()
    run_ma_client(env, acks, 0, 1, stop_at=3, own_actions=True)  # b done; a, c wait
    run_ma_client(env, acks, 1, 1, stop_at=1, own_actions=True)  # b acted at 0 and waits
    report = recover(journal, log, ma_env())
    assert logged(log) == acks.want()
    assert report.ended_by_crash == ["c0e0", "c1e0"] and report.stored_steps == 0
    flags, last_obs, infos = {}, {}, []
    for rec in read_records(log):
        for a, sa in rec.agent_episodes.items():
            flags[rec.id_, a] = (sa.is_terminated, sa.is_truncated)
            last_obs[rec.id_, a] = key_of(sa.get_observations(-1))
            infos += list(sa.get_infos())
    assert flags == {
        ("c0e0", "a"): (False, True),
        ("c0e0", "b"): (True, False),
        ("c0e0", "c"): (False, True),
        ("c1e0", "a"): (False, True),
        ("c1e0", "b"): (False, True),
        ("c1e0", "c"): (False, True),
    }
    assert last_obs["c0e0", "b"] == key_of(obs_of(0, 0, 3, "b"))  # its own final one
    assert last_obs["c1e0", "b"] == key_of(obs_of(1, 0, 0, "b"))  # repeated: it waited
    assert last_obs["c1e0", "a"] == key_of(obs_of(1, 0, 1, "a"))
    assert infos and all(i["recovered"] for i in infos)


def test_an_agent_step_stored_without_its_env_steps_other_agents_is_completed(tmp_path):
    """A log whose chunks lack one agent (its rows died, the others' are stored): recovery
    adds exactly that agent's steps, as chunks of that agent alone (which share env steps
    with stored chunks but no agent step: no RepeatedRunWarning), and the rest stays."""
    journal, log = tmp_path / "j", tmp_path / "log"
    env = ma_env(StepJournal(journal), max_wait_s=0.0)
    acks = AgentAcks()
    sampler, params = ma_sampler(env)
    done = threading.Event()

    def client():
        run_ma_client(env, acks, 0, 2)
        done.set()

    th = threading.Thread(target=client)
    th.start()
    chunks = []
    while not done.is_set() or env.open_episodes:
        chunks += sampler.sample(params, num_timesteps=3)
    th.join()
    with OfflineWriter(log) as writer:
        for i, chunk in enumerate(chunks):
            if i % 2 == 0:
                chunk.agent_episodes.pop("a", None)  # a's steps of every other chunk die
            writer.write(chunk)
    with warnings.catch_warnings():  # agent steps of stored env steps repeat no step
        warnings.simplefilter("error", RepeatedRunWarning)
        report = recover(journal, log, ma_env(), compact=False)
    assert report.recovered_steps > 0 and report.stored_steps > 0
    assert logged(log) == acks.want()
    recovered = list(read_records(log))[len(chunks) :]
    assert recovered and all(set(r.agent_episodes) == {"a"} for r in recovered)
    assert recover(journal, log, ma_env()).recovered_steps == 0  # it reads them back


def test_batch_rows_of_a_multi_agent_log_count_as_stored(tmp_path):
    """A log of ``sample_batch()`` output: its rows (the agent's episode id, agent index and
    agent step) are what it holds; recovery adds the others as episode chunks."""
    journal, log = tmp_path / "j", tmp_path / "log"
    env = ma_env(StepJournal(journal), max_wait_s=0.0)
    acks = AgentAcks()
    run_ma_client(env, acks, 1, 1, own_actions=True)
    sampler, params = ma_sampler(env)
    batch = sampler.sample_batch(params, num_timesteps=3)
    rows = batch["default_policy"]
    assert rows.count > 0
    with OfflineWriter(log) as w:
        w.write(batch)
    report = recover(journal, log, ma_env())
    want = acks.want()
    assert report.stored_steps == rows.count
    assert report.recovered_steps == sum(want.values()) - rows.count > 0
    stored = Counter()
    for rec in read_records(log):
        if isinstance(rec, MultiAgentEpisode):
            for a, sa in rec.agent_episodes.items():
                stored.update((rec.id_, a, sa.t_started + i) for i in range(len(sa)))
        else:
            r = rec["default_policy"]
            agents = [AGENTS[i] for i in r["agent_index"].tolist()]
            stored.update(("c1e0", a, t) for a, t in zip(agents, r["t"].tolist(), strict=True))
    assert stored == Counter((e, a, t) for e, a, t, *_ in want)


@pytest.mark.filterwarnings("ignore::jaxsampler.offline.TruncatedLogWarning")
def test_every_acknowledged_agent_step_is_stored_once_after_checkpoints_and_a_crash(tmp_path):
    journal, log = tmp_path / "steps.journal", tmp_path / "data.log"
    env = ma_env(StepJournal(journal), max_wait_s=0.002)
    calls: list[int] = []
    acks = run_clients(env, checkpointing_sampler, (log, 6, 2, calls, SPACES), [1, None, 3, None])
    assert calls == [2, 4, 6]
    (marker,) = [e for e in journal_entries(journal) if e["op"] == "checkpoint"]
    report = recover(journal, log, ma_env())
    assert logged(log) == acks.want()
    assert report.log_read_from == marker["log_offset"] > 0
    assert report.recovered_steps > 0
    assert sorted(report.ended_by_crash) == ["c0e2", "c2e2"]


@pytest.mark.filterwarnings("ignore::jaxsampler.offline.TruncatedLogWarning")
def test_steps_stored_before_a_checkpoint_count_as_stored_by_the_journals_say(tmp_path):
    """Episodes that run through a checkpoint: the log is read only from the checkpoint's
    offset, so their steps stored before it are known from the journal alone (the steps
    the sampler had polled then); none of them is stored again, the lost ones are."""
    journal, log = tmp_path / "j", tmp_path / "log"
    env = ma_env(StepJournal(journal), max_wait_s=0.0)
    acks = AgentAcks()
    for cid, stop_at in enumerate([None, 3, None, 1]):  # every step queued up front
        run_ma_client(env, acks, cid, 2, stop_at, own_actions=True)
    sampler, params = ma_sampler(env)
    writer = OfflineWriter(log)
    for _ in range(2):  # written, each call followed by a checkpoint
        for episode in sampler.sample(params, num_timesteps=8):
            writer.write(episode)
        env.checkpoint_journal(writer)
    while env.open_episodes > 2:  # polled but never written (the two left open stay)
        sampler.sample(params, num_timesteps=8)
    writer._close_fd()  # the crash
    (marker,) = [e for e in journal_entries(journal) if e["op"] == "checkpoint"]
    kept = {e["e"] for e in journal_entries(journal) if e["op"] == "start"}
    assert kept & {rec.id_ for rec in read_records(log)}  # running, with stored steps

    report = recover(journal, log, ma_env())
    assert logged(log) == acks.want()
    assert report.log_read_from == marker["log_offset"] > 0
    assert report.stored_steps > 0 and report.recovered_steps > 0


def test_an_unanswered_get_action_is_the_final_observation(tmp_path):
    """The sampler polled a get_action and died before answering it (its entries made
    durable by another call's commit): the steps before are recovered, the unanswered
    observation ends them, truncated; the agent that waited gets its last observation
    again; nothing is invented."""
    journal, log = tmp_path / "j", tmp_path / "log"
    env = ma_env(StepJournal(journal))
    acks = AgentAcks()
    run_ma_client(env, acks, 0, 1, stop_at=0, own_actions=True)  # a and b acted at step 0
    obs = {a: obs_of(0, 0, 1, a) for a in ("a", "c")}
    env.submit("c0e0", obs, None, None, True)  # b waits for its next observation
    assert set(env.poll(timeout=0).obs["c0e0"]) == {"a", "b"}
    assert set(env.poll(timeout=0).obs["c0e0"]) == {"a", "c"}  # in flight, never answered
    env.journal.commit()  # (another client's call commits what was recorded so far)
    report = recover(journal, log, ma_env())
    assert logged(log) == acks.want() and report.recovered_steps == 2
    ends = {
        a: (key_of(sa.get_observations(-1)), sa.is_truncated)
        for rec in read_records(log)
        for a, sa in rec.agent_episodes.items()
    }
    assert ends == {"a": (key_of(obs["a"]), True), "b": (key_of(obs_of(0, 0, 0, "b")), True)}


def test_a_journal_or_log_of_the_other_kind_is_refused_by_name(tmp_path):
    sa_journal, ma_journal, log = tmp_path / "sa", tmp_path / "ma", tmp_path / "log"
    env = ExternalEnv(OBS, ACT, journal=StepJournal(sa_journal))
    env.start_episode("s")
    env.log_action("s", obs_of(0, 0, 0, "a"), 1)
    with pytest.raises(CorruptLogError, match="single-agent env .*recover it with an ExternalEnv"):
        recover(sa_journal, log, ma_env())
    run_ma_client(ma_env(StepJournal(ma_journal)), AgentAcks(), 0, 1, 0, own_actions=True)
    with pytest.raises(CorruptLogError, match="multi-agent env .*ExternalMultiAgentEnv"):
        recover(ma_journal, log, ExternalEnv(OBS, ACT))
    other = ExternalMultiAgentEnv(OBS, ACT, agent_ids=("x", "y"))
    with pytest.raises(CorruptLogError, match=r"names agents \['a', 'b'\] that the env lacks"):
        recover(ma_journal, log, other)
    recover(sa_journal, log, ExternalEnv(OBS, ACT))  # a single-agent log
    with pytest.raises(CorruptLogError, match="holds single-agent episodes"):
        recover(ma_journal, log, ma_env())
    assert any(e["op"] == "start" for e in journal_entries(ma_journal))  # not compacted


def test_recovered_chunks_carry_the_module_ids_given_and_the_default_without(tmp_path):
    """``agent_module_ids`` names each agent's policy in the recovered chunks, read back from
    the log; without it every agent gets the default policy's id. The steps are the same."""
    steps, modules = {}, {"a": "runner", "b": "chaser", "c": "chaser"}
    for given in (None, modules):
        journal, log = tmp_path / f"j{given is None}", tmp_path / f"log{given is None}"
        env = ma_env(StepJournal(journal))
        acks = AgentAcks()
        run_ma_client(env, acks, 0, 2, stop_at=3, own_actions=True)
        recover(journal, log, ma_env(), agent_module_ids=given)
        assert logged(log) == acks.want()
        seen = {
            (a, rec.agent_episodes[a].module_id, rec.module_for(a))
            for rec in read_records(log)
            for a in rec.agent_episodes
        }
        want = given or dict.fromkeys(AGENTS, DEFAULT_POLICY_ID)
        assert seen == {(a, want[a], want[a]) for a in AGENTS}
        steps[given is None] = logged(log)
    assert steps[True] == steps[False]


@pytest.mark.parametrize(
    ("env", "given", "match"),
    [
        ("sa", {"a": "p"}, "for a multi-agent env"),
        ("ma", {"a": "p", "b": "p"}, r"missing \['c'\], unknown \[\]"),
        ("ma", {"a": "p", "b": "p", "c": "p", "x": "p"}, r"missing \[\], unknown \['x'\]"),
        ("ma", ["a", "b", "c"], "must be a dict agent -> module id"),
    ],
)
def test_bad_agent_module_ids_are_named_before_anything_is_written(tmp_path, env, given, match):
    journal, log = tmp_path / "j", tmp_path / "log"
    run_ma_client(ma_env(StepJournal(journal)), AgentAcks(), 0, 1, 1, own_actions=True)
    like = ExternalEnv(OBS, ACT) if env == "sa" else ma_env()
    with pytest.raises(ValueError, match=match):
        recover(journal, log, like, agent_module_ids=given)
    assert not log.exists()
    assert any(e["op"] == "start" for e in journal_entries(journal))  # not compacted
