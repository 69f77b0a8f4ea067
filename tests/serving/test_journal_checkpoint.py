"""In-run checkpoints of the write-ahead journal: after ``env.checkpoint_journal(writer)``
the journal holds only the episodes running then (and the ids of the finished ones), and
recovery after a crash still stores every acknowledged step exactly once, reading the log
only from where it ended at the checkpoint.

The clients, acknowledgement records and log reader are ``test_journal``'s: observations
and rewards say (client, episode, step), so the log can be checked against what the env
acknowledged, step by step.
"""

from __future__ import annotations

import os
import threading

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.host_envs.external import EpisodeStateError, ExternalEnv
from jaxsampler.offline import (
    CorruptLogError,
    LogWriteError,
    OfflineWriter,
    StepJournal,
    read_records,
    recover,
)
from tests.serving.test_journal import (
    ACT,
    OBS,
    Acks,
    journal_entries,
    logged_steps,
    obs_of,
    run_client,
)


def checkpointing_sampler(env, log, stop, written_calls, every, done, spaces=(OBS, ACT)):
    """Writes each call's episodes and checkpoints every ``every`` calls, for the first
    ``written_calls`` calls; then samples on without writing (the outputs the crash
    loses) until one call after ``stop``. ``spaces``: one agent's (observation, action)."""
    policy = js.MLPPolicy(*spaces, hidden_sizes=(4,))
    params = policy.init(jax.random.PRNGKey(0))
    sampler = js.sampling.HostSampler(env, policy, seed=0, timeout_s=0.05)
    writer = OfflineWriter(log)
    calls, last = 0, False
    while not last:
        last = stop.is_set()  # one more call after the clients are done: it polls
        episodes = sampler.sample(params, num_timesteps=4)  # their final end_episode
        calls += 1
        if calls <= written_calls:
            for episode in episodes:
                writer.write(episode)
            if calls % every == 0:
                env.checkpoint_journal(writer)
                done.append(calls)
    writer._close_fd()  # the crash: no end frame


def crash_run(tmp_path, written_calls=8, every=2, clients=4, episodes=3, steps=6):
    journal, log = tmp_path / "steps.journal", tmp_path / "data.log"
    env = ExternalEnv(OBS, ACT, max_wait_s=0.002, journal=StepJournal(journal))
    acks, stop, ids, done = Acks(), threading.Event(), [], []
    sampler = threading.Thread(
        target=checkpointing_sampler, args=(env, log, stop, written_calls, every, done)
    )
    sampler.start()
    threads = [
        threading.Thread(target=run_client, args=(env, acks, c, episodes, steps, c % 2 == 0, ids))
        for c in range(clients)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    stop.set()
    sampler.join(60)
    return journal, log, acks, ids, done


def test_every_acknowledged_step_is_stored_once_after_checkpoints_and_a_crash(tmp_path):
    journal, log, acks, ids, done = crash_run(tmp_path)
    assert done == [2, 4, 6, 8]
    entries = journal_entries(journal)
    started = {e["e"] for e in entries if e["op"] == "start"}
    assert started < set(ids)  # episodes finished before the last checkpoint were dropped
    marker = [e for e in entries if e["op"] == "checkpoint"]
    assert len(marker) == 1 and marker[0]["log_offset"] > 0

    report = recover(journal, log, ExternalEnv(OBS, ACT))
    want = {k: [(v["action"], v["reward"])] for k, v in acks.steps.items()}
    assert logged_steps(log) == want  # each acknowledged step once, action and reward
    assert report.log_read_from == marker[0]["log_offset"]
    assert report.recovered_steps > 0  # the unwritten calls' steps came from the journal
    assert report.episodes == len(started) < len(ids)
    assert sorted(report.ended_by_crash) == sorted(f"c{c}e2" for c in (0, 2))
    # every id stays refused, the dropped ones included
    restarted = ExternalEnv(OBS, ACT, journal=StepJournal(journal))
    for eid in ids:
        with pytest.raises(EpisodeStateError, match="before the server restarted"):
            restarted.start_episode(eid)


def test_checkpoints_without_a_crash_lose_nothing_and_recovery_adds_nothing(tmp_path):
    """Every call written and a checkpoint after each: recovery finds every step stored
    but the last of each episode the clients left open (its next observation never came:
    the crash ends it, repeating the last one)."""
    journal, log, acks, ids, done = crash_run(tmp_path, written_calls=10**6, every=1)
    report = recover(journal, log, ExternalEnv(OBS, ACT))
    want = {k: [(v["action"], v["reward"])] for k, v in acks.steps.items()}
    assert logged_steps(log) == want
    assert sorted(report.recovered_episodes) == sorted(report.ended_by_crash) == ["c0e2", "c2e2"]
    assert report.recovered_steps == 2 and report.log_read_from > 0


def test_a_log_that_lost_its_tail_is_read_whole_and_the_running_episodes_recovered(tmp_path):
    """A log that ends before the checkpoint's offset (replaced, or cut by a crash of a
    machine that lost what was not on disk): recovery warns, reads the whole log and trusts
    only it, so every acknowledged step of the episodes the journal still holds is stored
    again, once."""
    journal, log, acks, ids, done = crash_run(tmp_path)
    kept = {e["e"] for e in journal_entries(journal) if e["op"] == "start"}
    first = next(iter(read_records(log)))
    with OfflineWriter(log) as writer:  # replaced by a shorter log
        writer.write(first)
    with pytest.warns(UserWarning, match="has no record there"):
        report = recover(journal, log, ExternalEnv(OBS, ACT))
    assert report.log_read_from == 0
    got = logged_steps(log)
    for (cid, ep, t), v in acks.steps.items():
        if f"c{cid}e{ep}" in kept:
            assert got[cid, ep, t] == [(v["action"], v["reward"])]


def test_a_checkpoint_comes_from_the_polling_thread_of_a_checkpointing_journal(tmp_path):
    with pytest.raises(TypeError, match="StepJournal"):
        ExternalEnv(OBS, ACT).checkpoint_journal()
    env = ExternalEnv(OBS, ACT, journal=StepJournal(tmp_path / "j"))
    env.start_episode("a")
    env.poll(timeout=0)  # this thread polls
    errors = []

    def other():
        try:
            env.checkpoint_journal()
        except RuntimeError as e:
            errors.append(e)

    th = threading.Thread(target=other)
    th.start()
    th.join()
    assert errors and "thread that polls" in str(errors[0])
    env.checkpoint_journal()  # the polling thread may, without a log (read whole later)
    (marker,) = [e for e in journal_entries(tmp_path / "j") if e["op"] == "checkpoint"]
    assert marker["log_offset"] is None


def test_a_failed_checkpoint_leaves_the_journal_whole_and_the_env_serving(tmp_path, monkeypatch):
    path = tmp_path / "j"
    env = ExternalEnv(OBS, ACT, journal=StepJournal(path))
    env.start_episode("a")
    env.log_action("a", obs_of(0, 0, 0), 1)
    before = path.read_bytes()

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(LogWriteError, match="No space left") as info:
        env.checkpoint_journal()
    monkeypatch.undo()
    assert info.value.errno == 28 and not info.value.failed
    assert path.read_bytes() == before and not (tmp_path / "j.checkpoint").exists()
    env.log_returns("a", 2.0)  # still serving, on the same journal
    env.end_episode("a", obs_of(0, 0, 1))
    report = recover(path, tmp_path / "log", ExternalEnv(OBS, ACT))
    assert report.recovered_steps == 1
    (ep,) = list(read_records(tmp_path / "log"))
    assert list(ep.get_rewards()) == [2.0] and ep.is_terminated


def test_a_crash_inside_a_checkpoint_leaves_a_temporary_file_the_next_open_removes(tmp_path):
    path = tmp_path / "j"
    env = ExternalEnv(OBS, ACT, journal=StepJournal(path))
    env.start_episode("a")
    env.log_action("a", obs_of(0, 0, 0), 1)
    (tmp_path / "j.checkpoint").write_bytes(b"half a checkpoint")  # killed mid-write
    StepJournal(path).close()  # the restart
    assert not (tmp_path / "j.checkpoint").exists()
    report = recover(path, tmp_path / "log", ExternalEnv(OBS, ACT))
    assert report.recovered_steps == 1 and report.ended_by_crash == ["a"]


def test_running_episodes_replay_across_checkpoints_with_their_polls_and_answers(tmp_path):
    """An episode that runs through several checkpoints: its get_action answers and an
    off-policy step polled before them replay from the rewritten journal, and only the
    step still unstored is recovered (the earlier ones count as stored)."""
    journal, log = tmp_path / "j", tmp_path / "log"
    env = ExternalEnv(OBS, ACT, max_wait_s=0.0, journal=StepJournal(journal))
    env.start_episode("c0e0")
    env.start_episode("c1e0")
    policy = js.MLPPolicy(OBS, ACT, hidden_sizes=(4,))
    params = policy.init(jax.random.PRNGKey(0))
    sampler = js.sampling.HostSampler(env, policy, seed=0, timeout_s=0.05)
    acks = Acks()
    writer = OfflineWriter(log)

    def client():
        for t in range(6):
            if t == 1:
                env.log_action("c0e0", obs_of(0, 0, t), 1)
                acks.step((0, 0, t), 1)
            else:
                acks.step((0, 0, t), env.get_action("c0e0", obs_of(0, 0, t)))
            env.log_returns("c0e0", float(t))
            acks.reward((0, 0, t), float(t))

    env.log_action("c1e0", obs_of(1, 0, 0), 0)
    acks.step((1, 0, 0), 0)
    env.end_episode("c1e0", obs_of(1, 0, 1))
    th = threading.Thread(target=client)
    th.start()
    checkpoints = 0
    while th.is_alive() or env.stats["steps_delivered"] < 8:
        for episode in sampler.sample(params, num_timesteps=1):
            writer.write(episode)
        env.checkpoint_journal(writer)
        checkpoints += 1
    th.join()
    assert checkpoints >= 3 and env.journal.checkpoints == checkpoints
    entries = journal_entries(journal)
    assert {e["e"] for e in entries if e["op"] == "start"} == {"c0e0"}
    assert any(e["op"] == "ids" and "c1e0" in e["ids"] for e in entries)
    report = recover(journal, log, ExternalEnv(OBS, ACT))
    assert report.ended_by_crash == ["c0e0"]
    want = {k: [(v["action"], v["reward"])] for k, v in acks.steps.items()}
    assert logged_steps(log) == want
    assert report.recovered_steps == 1  # the last step: its next observation never came


def test_read_records_from_a_writers_offset(tmp_path):
    path = tmp_path / "log"
    eps = [js.episodes.SingleAgentEpisode(f"e{i}", observations=[np.zeros(3)]) for i in range(3)]
    with OfflineWriter(path) as writer:
        writer.write(eps[0])
        offset = writer.offset
        writer.write(eps[1])
        writer.write(eps[2])
    assert [r.id_ for r in read_records(path, offset=offset)] == ["e1", "e2"]
    with pytest.raises(CorruptLogError, match="no record marker"):
        list(read_records(path, offset=offset + 1))
    with pytest.raises(ValueError, match="uncompressed version-2"):
        list(read_records(path, offset=0))
    with OfflineWriter(tmp_path / "log.gz") as gz:
        assert gz.offset is None


def test_checkpoints_keep_an_earlier_unrecovered_run_and_say_what_it_costs(tmp_path):
    """A server started on a journal whose last run was never recovered: its checkpoints
    copy that run along (and warn once that they do), and recovery still finds both."""
    import warnings

    path, log = tmp_path / "j", tmp_path / "log"
    old = ExternalEnv(OBS, ACT, journal=StepJournal(path))
    old.start_episode("c9e0")
    old.log_action("c9e0", obs_of(9, 0, 0), 1)  # then a crash, and no recovery
    env = ExternalEnv(OBS, ACT, journal=StepJournal(path))
    env.start_episode("c1e0")
    env.log_action("c1e0", obs_of(1, 0, 0), 0)
    env.end_episode("c1e0", obs_of(1, 0, 1))
    env.poll(timeout=0)  # this thread polls
    with pytest.warns(RuntimeWarning, match="1 earlier server run"):
        env.checkpoint_journal()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env.checkpoint_journal()
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)]
    report = recover(path, log, ExternalEnv(OBS, ACT))
    assert report.sessions == 2 and report.recovered_steps == 2
    assert sorted(logged_steps(log)) == [(1, 0, 0), (9, 0, 0)]


def test_recovery_reads_episode_spans_without_decoding_their_arrays(tmp_path):
    """What the log holds, as recovery reads it (episode records by their state's id and
    step range only), equals what the fully decoded records say."""
    from jaxsampler.offline.frames import read_payloads
    from jaxsampler.offline.recovery import _span, _stored_steps

    journal, log, acks, ids, done = crash_run(tmp_path)
    want: dict[str, set] = {}
    for rec in read_records(log):
        want.setdefault(rec.id_, set()).update(range(rec.t_started, rec.t_started + len(rec)))
    assert _stored_steps(str(log)) == want
    assert all(_span(p) is not None for p in read_payloads(str(log)))
    batch = js.episodes.SampleBatch({"eps_id": np.array(["a"]), "t": np.array([0])})
    from jaxsampler.episodes.codec import packb

    assert _span(packb(batch)) is None  # other records take the full decoder
