"""Write-ahead journal: every acknowledged step of an external env ends up in the sampler's
offline log exactly once, even when the sampler's last outputs die with the process.

Client threads run episodes whose observations say (client, episode, step) and whose
rewards say the same, and record what the env acknowledged (each returned action, each
returned ``log_action`` / ``log_returns`` / ``end_episode``). A sampler thread writes its
episodes to an offline log but "crashes": the output of its last calls is never written,
and some episodes are left open by their clients. :func:`recover` must then fill the log
so that it holds each acknowledged step once, with the acknowledged observation, action
and reward, and nothing else.
"""

from __future__ import annotations

import threading
from collections import Counter

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.episodes import SampleBatch
from jaxsampler.host_envs.external import EpisodeStateError, ExternalEnv
from jaxsampler.offline import OfflineWriter, StepJournal, read_records, recover
from jaxsampler.spaces import Box, Discrete

OBS, ACT = Box(-1e6, 1e6, (3,), np.float32), Discrete(2)


def obs_of(cid: int, ep: int, t: int) -> np.ndarray:
    return np.array([cid, ep, t], np.float32)


def reward_of(cid: int, ep: int, t: int) -> float:
    return float(1000 * cid + 10 * ep + t)


class Acks:
    """What the env acknowledged, by (client, episode, step)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.steps: dict[tuple[int, int, int], dict] = {}

    def step(self, key: tuple, action: int) -> None:
        with self.lock:
            self.steps[key] = {"action": int(action), "reward": 0.0}

    def reward(self, key: tuple, r: float) -> None:
        with self.lock:
            self.steps[key]["reward"] += r


def run_client(env, acks, cid, episodes, steps, leave_open, ids):
    for ep in range(episodes):
        eid = env.start_episode(f"c{cid}e{ep}")
        ids.append(eid)
        for t in range(steps):
            if t == 2:  # an off-policy step: acknowledged when log_action returns
                env.log_action(eid, obs_of(cid, ep, t), 1)
                acks.step((cid, ep, t), 1)
            else:
                acks.step((cid, ep, t), env.get_action(eid, obs_of(cid, ep, t)))
            env.log_returns(eid, reward_of(cid, ep, t))
            acks.reward((cid, ep, t), reward_of(cid, ep, t))
        if not (leave_open and ep == episodes - 1):
            env.end_episode(eid, obs_of(cid, ep, steps))


def logged_steps(path):
    """(client, episode, step) -> every (action, reward) the log holds for it."""
    out: dict[tuple, list] = {}
    for rec in read_records(path):
        assert isinstance(rec, js.episodes.SingleAgentEpisode)
        obs, acts, rews = rec.get_observations(), rec.get_actions(), rec.get_rewards()
        for i in range(len(rec)):
            key = tuple(int(v) for v in obs[i])
            assert rec.id_ == f"c{key[0]}e{key[1]}"  # the env's id names the episode
            assert key[2] == rec.t_started + i
            out.setdefault(key, []).append((int(acts[i]), float(rews[i])))
    return out


def crashing_sampler(env, log, stop, lost_calls, spaces=(OBS, ACT)):
    """Samples and writes each call's episodes; the last ``lost_calls`` outputs are never
    written (they died with the process). ``spaces``: one agent's (observation, action)."""
    policy = js.MLPPolicy(*spaces, hidden_sizes=(4,))
    params = policy.init(jax.random.PRNGKey(0))
    sampler = js.sampling.HostSampler(env, policy, seed=0, timeout_s=0.05)
    outputs = []
    while not stop.is_set():
        outputs.append(sampler.sample(params, num_timesteps=4))
    with OfflineWriter(log) as writer:
        for episodes in outputs[: max(0, len(outputs) - lost_calls)]:
            for episode in episodes:
                writer.write(episode)
    return sampler


@pytest.mark.parametrize("lost_calls", [0, 3])
def test_every_acknowledged_step_is_in_the_log_exactly_once_after_recovery(tmp_path, lost_calls):
    journal, log = tmp_path / "steps.journal", tmp_path / "data.log"
    env = ExternalEnv(OBS, ACT, max_wait_s=0.002, journal=StepJournal(journal))
    acks, stop, ids = Acks(), threading.Event(), []
    sampler_thread = threading.Thread(target=crashing_sampler, args=(env, log, stop, lost_calls))
    sampler_thread.start()
    clients = [
        threading.Thread(target=run_client, args=(env, acks, c, 3, 6, c % 2 == 0, ids))
        for c in range(4)
    ]
    for th in clients:
        th.start()
    for th in clients:
        th.join(60)
    stop.set()
    sampler_thread.join(60)
    # The crash: nothing is closed; the journal's entries are in the OS's hands.

    report = recover(journal, log, ExternalEnv(OBS, ACT))
    got = logged_steps(log)
    want = {k: [(v["action"], v["reward"])] for k, v in acks.steps.items()}
    assert got == want  # each acknowledged step once, with its action and reward
    assert report.acknowledged_steps == len(want) == report.stored_steps + report.recovered_steps
    assert sorted(report.ended_by_crash) == sorted(f"c{c}e2" for c in (0, 2))
    if lost_calls:
        assert report.recovered_steps > 0

    again = recover(journal, log, ExternalEnv(OBS, ACT))  # idempotent
    assert again.recovered_steps == 0 and logged_steps(log) == got


def test_open_and_crash_ended_episodes_end_truncated_with_their_last_step(tmp_path):
    journal, log = tmp_path / "j", tmp_path / "log"
    env = ExternalEnv(OBS, ACT, journal=StepJournal(journal))
    eid = env.start_episode("a")
    env.log_action(eid, obs_of(0, 0, 0), 1)
    env.log_returns(eid, 5.0)
    env.log_action(eid, obs_of(0, 0, 1), 0)
    env.log_returns(eid, 7.0)
    # no sampler ever ran: everything is recovered
    report = recover(journal, log, ExternalEnv(OBS, ACT))
    assert report.recovered_steps == 2 and report.ended_by_crash == ["a"]
    (ep,) = list(read_records(log))
    assert ep.is_truncated and not ep.is_terminated
    np.testing.assert_array_equal(ep.get_actions(), [1, 0])
    np.testing.assert_array_equal(ep.get_rewards(), [5.0, 7.0])
    # the last observation is repeated as the final one (the abandonment rule)
    np.testing.assert_array_equal(ep.get_observations()[-1], obs_of(0, 0, 1))
    assert all(i["recovered"] for i in ep.get_infos())


def test_a_restarted_env_refuses_pre_restart_ids_and_sessions_replay_apart(tmp_path):
    journal, log = tmp_path / "j", tmp_path / "log"
    env = ExternalEnv(OBS, ACT, journal=StepJournal(journal))
    env.start_episode("old")
    env.log_action("old", obs_of(0, 0, 0), 1)
    env2 = ExternalEnv(OBS, ACT, journal=StepJournal(journal))  # the restarted server
    with pytest.raises(EpisodeStateError, match="before the server restarted"):
        env2.start_episode("old")
    env2.start_episode("new")
    env2.log_action("new", obs_of(1, 0, 0), 0)
    env2.end_episode("new", obs_of(1, 0, 1))
    report = recover(journal, log, ExternalEnv(OBS, ACT))
    assert report.sessions == 2 and report.ended_by_crash == ["old"]
    eps = {e.id_: e for e in read_records(log)}
    assert eps["new"].is_terminated and eps["old"].is_truncated


def test_a_failing_journal_closes_the_env_and_nothing_is_acknowledged(tmp_path):
    class Full:
        def record(self, entry):
            if entry["op"] == "submit":
                raise OSError(28, "No space left on device")

        def commit(self):
            pass

        def known(self, eid):
            return False

    env = ExternalEnv(OBS, ACT, journal=Full())
    env.start_episode("a")
    with pytest.raises(js.host_envs.external.EnvClosedError, match="journal failed"):
        env.log_action("a", obs_of(0, 0, 0), 1)
    with pytest.raises(js.host_envs.external.EnvClosedError, match="journal failed"):
        env.start_episode("b")


def test_sample_batch_rows_count_as_stored(tmp_path):
    """A log of ``sample_batch()`` output: its (eps_id, t) rows are what it holds."""
    journal, log = tmp_path / "j", tmp_path / "log"
    env = ExternalEnv(OBS, ACT, journal=StepJournal(journal))
    env.start_episode("a")
    for t in range(3):
        env.log_action("a", obs_of(0, 0, t), t % 2)
    env.end_episode("a", obs_of(0, 0, 3))
    policy = js.MLPPolicy(OBS, ACT, hidden_sizes=(4,))
    sampler = js.sampling.HostSampler(env, policy, seed=0, timeout_s=0.05)
    batch = sampler.sample_batch(policy.init(jax.random.PRNGKey(0)), num_timesteps=2)
    rows = batch["default_policy"]
    assert isinstance(rows, SampleBatch) and set(rows["eps_id"]) == {"a"}
    with OfflineWriter(log) as w:
        w.write(batch)
    report = recover(journal, log, ExternalEnv(OBS, ACT))
    assert report.acknowledged_steps == 3
    assert report.stored_steps == rows.count and report.recovered_steps == 3 - rows.count
    stored = Counter()
    for rec in read_records(log):
        if isinstance(rec, js.episodes.SingleAgentEpisode):
            stored.update(range(rec.t_started, rec.t_started + len(rec)))
        else:
            stored.update(rec["default_policy"]["t"].tolist())
    assert stored == Counter(range(3))


def test_a_failing_commit_fails_the_call_and_the_answers_it_would_acknowledge(tmp_path):
    """The commit runs before an acknowledgement: when it fails, the caller gets the error,
    a get_action waiting for its answer gets it too, and the env is closed."""

    class DiskFull:
        fail = False

        def record(self, entry):
            pass

        def commit(self):
            if self.fail:
                raise OSError(28, "No space left on device")

        def known(self, eid):
            return False

    journal = DiskFull()
    env = ExternalEnv(OBS, ACT, journal=journal)
    env.start_episode("a")
    waiter = env.submit("a", {"default_agent": obs_of(0, 0, 0)}, None, None, True)
    res = env.poll(timeout=0)
    assert list(res.obs) == ["a"]
    journal.fail = True
    with pytest.raises(js.host_envs.external.EnvClosedError, match="answers were not delivered"):
        env.send_actions({"a": {"default_agent": 1}})
    assert waiter.done and waiter.value is None  # never answered with an action
    assert "journal failed" in str(waiter.error)
    with pytest.raises(js.host_envs.external.EnvClosedError, match="No space left"):
        env.log_returns("a", 1.0)


def test_the_journal_writes_once_per_commit_and_notices_a_replaced_file(tmp_path):
    from jaxsampler.offline import LogReplacedError

    path = tmp_path / "j"
    env = ExternalEnv(OBS, ACT, journal=StepJournal(path))
    env.start_episode("a")
    size = path.stat().st_size
    env.journal.record({"op": "noop"})  # buffered: not written until a commit
    assert path.stat().st_size == size
    env.log_action("a", obs_of(0, 0, 0), 1)  # commits both
    assert path.stat().st_size > size
    path.rename(tmp_path / "moved")
    with pytest.raises(js.host_envs.external.EnvClosedError, match="LogReplacedError"):
        env.log_returns("a", 1.0)
    assert isinstance(env._journal_error, LogReplacedError)


def test_deferred_commits_write_once_at_the_end_or_leave_it_to_the_answer(tmp_path):
    """commits_deferred: the block's calls write nothing until it ends (then one write), or,
    when ``covered``, nothing at all until send_actions commits before its answer; an error
    leaving the block still commits; blocks do not nest. Every entry reaches the file."""
    path = tmp_path / "j"
    env = ExternalEnv(OBS, ACT, journal=StepJournal(path))
    env.start_episode("a")
    env.start_episode("b")
    size = path.stat().st_size
    with env.commits_deferred():
        env.log_returns("a", 1.0)
        env.log_returns("b", 2.0)
        assert path.stat().st_size == size  # not yet
    assert path.stat().st_size > size  # both, at the block's end
    size = path.stat().st_size
    with env.commits_deferred() as deferral:
        env.log_returns("a", 3.0)
        env.submit("a", {"default_agent": obs_of(0, 0, 0)}, None, None, True)
        deferral.covered = True
    assert path.stat().st_size == size  # the answer will acknowledge them
    assert env.poll(timeout=1.0)[0].keys() == {"a"}
    env.send_actions({"a": {"default_agent": 1}})
    assert path.stat().st_size > size  # written before the answer was delivered
    size = path.stat().st_size
    with pytest.raises(ValueError, match="boom"), env.commits_deferred():
        env.log_returns("b", 4.0)
        raise ValueError("boom")
    assert path.stat().st_size > size
    with env.commits_deferred(), pytest.raises(RuntimeError, match="nest"), env.commits_deferred():
        pass
    env.close()
    ops = [e["op"] for e in journal_entries(path)]
    assert ops.count("returns") == 4 and ops.count("answer") == 1


def journal_entries(path):
    from jaxsampler.offline.journal import _entries

    return list(_entries(str(path)))


def test_recovery_compacts_the_journal_to_its_ids_and_the_next_replays_only_the_new_run(
    tmp_path,
):
    """After recover() the journal holds only episode ids (still refused), a second recover
    finds nothing to replay, and a crash of the next run is recovered from that run alone;
    compact=False leaves the journal's bytes as they were."""
    journal, log = tmp_path / "j", tmp_path / "log"
    env = ExternalEnv(OBS, ACT, journal=StepJournal(journal))
    for i in range(3):
        env.start_episode(f"e{i}")
        env.log_action(f"e{i}", obs_of(0, i, 0), 1)
        env.end_episode(f"e{i}", obs_of(0, i, 1))
    env.start_episode("open")
    env.log_action("open", obs_of(0, 9, 0), 0)  # a crash leaves it open
    big = journal.stat().st_size
    before = journal.read_bytes()
    kept = recover(journal, log, ExternalEnv(OBS, ACT), compact=False)
    assert journal.read_bytes() == before and not kept.compacted
    first = recover(journal, log, ExternalEnv(OBS, ACT))
    assert first.compacted and first.recovered_steps == 0  # the log had them all already
    assert kept.recovered_steps == 4 and journal.stat().st_size < big
    assert not (tmp_path / "j.compacting").exists()
    again = recover(journal, log, ExternalEnv(OBS, ACT))
    assert (again.sessions, again.episodes, again.recovered_steps) == (0, 0, 0)

    env2 = ExternalEnv(OBS, ACT, journal=StepJournal(journal))  # the next run
    for old in ("e0", "open"):
        with pytest.raises(EpisodeStateError, match="before the server restarted"):
            env2.start_episode(old)
    env2.start_episode("new")
    env2.log_action("new", obs_of(1, 0, 0), 1)
    third = recover(journal, log, ExternalEnv(OBS, ACT))
    assert (third.sessions, third.episodes, third.recovered_steps) == (1, 1, 1)
    steps = Counter(
        (rec.id_, rec.t_started + i) for rec in read_records(log) for i in range(len(rec))
    )
    assert steps == Counter(
        {("e0", 0): 1, ("e1", 0): 1, ("e2", 0): 1, ("open", 0): 1, ("new", 0): 1}
    )


@pytest.mark.parametrize("journaled", [False, True], ids=["no-journal", "journal"])
def test_an_answer_to_a_get_action_given_up_while_in_flight_is_dropped(tmp_path, journaled):
    """A ``get_action`` whose wait ends (its timeout; the same path as a client gone) after
    the sampler polled its step but before the answer: the answer is dropped and counted,
    the caller keeps its TimeoutError, and the sampler goes on (with a journal it used to
    wake the finished call a second time and die of ``release unlocked lock``). The
    journal replays to the same result: no acknowledged step."""
    journal = tmp_path / "j"
    env = ExternalEnv(
        OBS, ACT, action_timeout_s=0.2, journal=StepJournal(journal) if journaled else None
    )
    env.start_episode("e")
    told: list[BaseException] = []

    def call() -> None:
        try:
            env.get_action("e", obs_of(0, 0, 0))
        except TimeoutError as e:
            told.append(e)

    caller = threading.Thread(target=call)
    caller.start()
    polled = env.poll(timeout=30)
    assert list(polled.obs) == ["e"]  # the step is in flight now
    caller.join(30)
    assert len(told) == 1 and "abandoned" in str(told[0])
    env.send_actions({"e": {js.constants.DEFAULT_AGENT_ID: 1}})  # raised before the fix
    assert env.stats["dropped_actions"] == 1
    end = env.poll(timeout=30)
    assert end.truncateds["e"][js.constants.ALL_AGENTS]
    assert env.episode_status("e") == "abandoned"
    env.start_episode("f")  # the env still serves
    if journaled:
        report = recover(journal, tmp_path / "log", ExternalEnv(OBS, ACT))
        assert (report.episodes, report.acknowledged_steps) == (2, 0)
