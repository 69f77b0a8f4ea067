"""Group commit of the write-ahead journal (issue 32): concurrent commits share one write and
each returns only once its own entries are written; recording never waits for a write; the
sampler's answers are woken only after their commit, which runs outside the env's lock;
``defer_returns`` leaves an in-process reward to the next commit (a server's request still
commits before its answer); a group commit's fsync runs on its own thread, and a failed one
fails the journal.

A write is held back by blocking the journal writer's ``_append`` on an event, so each
test sees the state *during* a write without timing anything.
"""

from __future__ import annotations

import errno
import threading

import numpy as np
import pytest

from jaxsampler.episodes.codec import packb
from jaxsampler.host_envs.external import ExternalEnv
from jaxsampler.offline import GroupCommit, LogWriteError, StepJournal
from jaxsampler.offline import syncer as syncer_module
from tests.fakes import ACT, OBS, http_request

BOUND = 30.0  # generous bound of every join / wait: a hang fails instead of blocking the suite


def entries(path) -> list[dict]:
    from jaxsampler.offline.journal import _entries

    return list(_entries(str(path)))


class HeldWrites:
    """Counts the journal's writes (entries per write) and, while ``hold`` is set, blocks
    each write until ``release`` (``entered`` is set once a write is blocked)."""

    def __init__(self, journal: StepJournal):
        self.writer = journal._writer
        self.inner = self.writer._append
        self.sizes: list[int] = []
        self.hold = threading.Event()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.writer._append = self._append

    def _append(self, payload: bytes, check_path: bool = True) -> None:
        n = payload[0] & 0x0F if payload[0] & 0xF0 == 0x90 else int.from_bytes(payload[1:3], "big")
        self.sizes.append(n)
        if self.hold.is_set():
            self.entered.set()
            assert self.release.wait(BOUND)
        self.inner(payload, check_path)


def wait_until(cond) -> None:
    for _ in range(int(BOUND / 0.002)):
        if cond():
            return
        threading.Event().wait(0.002)
    raise AssertionError("condition not reached")


def test_concurrent_commits_share_one_write_and_return_after_it(tmp_path):
    journal = StepJournal(tmp_path / "j")
    writes = HeldWrites(journal)
    writes.hold.set()
    returned: list[int] = []

    def commit(i: int) -> None:
        journal.record({"op": "noop", "i": i})
        journal.commit()
        returned.append(i)

    leader = threading.Thread(target=commit, args=(0,))
    leader.start()
    assert writes.entered.wait(BOUND)  # the leader's write is in progress, held
    writes.hold.clear()
    followers = [threading.Thread(target=commit, args=(i,)) for i in range(1, 9)]
    for th in followers:
        th.start()
    # Recording goes on during the write: every follower's entry gets buffered.
    wait_until(lambda: len(journal._buffered) == 8)
    assert returned == []  # nobody's entries are written yet: nobody returned
    writes.release.set()
    for th in [leader, *followers]:
        th.join(BOUND)
        assert not th.is_alive()
    assert sorted(returned) == list(range(9))
    assert writes.sizes == [1, 8]  # the leader's entry, then one write for all eight
    journal.close()
    assert sorted(e["i"] for e in entries(tmp_path / "j") if e["op"] == "noop") == list(range(9))


def test_answers_wake_after_their_commit_which_does_not_hold_the_env_lock(tmp_path):
    env = ExternalEnv(OBS, ACT, max_wait_s=0.0, journal=StepJournal(tmp_path / "j"))
    env.start_episode("a")
    waiter = env.submit("a", {"default_agent": np.zeros(3, np.float32)}, None, None, True)
    assert list(env.poll(timeout=BOUND).obs) == ["a"]
    writes = HeldWrites(env.journal)
    writes.hold.set()
    sampler = threading.Thread(target=env.send_actions, args=({"a": {"default_agent": 1}},))
    sampler.start()
    assert writes.entered.wait(BOUND)  # the answers' commit is writing
    assert env.episode_status("a") == "running"  # the env's lock is free meanwhile
    with env.commits_deferred() as deferral:  # a client records meanwhile
        env.start_episode("b")
        deferral.covered = True  # (its commit would wait for the held write)
    assert not waiter.wait(0)  # answered, but not woken before its answer is stored
    assert env.expire_waiter("a", waiter, "client gone") is False  # nor can it be expired
    writes.hold.clear()
    writes.release.set()
    sampler.join(BOUND)
    assert waiter.wait(BOUND) and waiter.value == {"default_agent": 1}
    env.close()
    ops = [e["op"] for e in entries(tmp_path / "j")]
    assert "answer" in ops and "abandon" not in ops


def test_defer_returns_writes_an_in_process_reward_with_the_next_commit(tmp_path):
    path = tmp_path / "j"
    env = ExternalEnv(OBS, ACT, max_wait_s=0.0, journal=StepJournal(path), defer_returns=True)
    env.start_episode("a")
    size = path.stat().st_size
    env.log_returns("a", 2.5)
    assert path.stat().st_size == size  # buffered, not written
    waiter = env.submit("a", {"default_agent": np.zeros(3, np.float32)}, None, None, True)
    assert path.stat().st_size == size  # a get_action waits for its answer's commit
    env.poll(timeout=BOUND)
    env.send_actions({"a": {"default_agent": 0}})
    assert waiter.wait(BOUND)
    ops = [(e["op"], e.get("reward")) for e in entries(path)]
    assert ops[-4:] == [
        ("returns", {"default_agent": 2.5}),
        ("submit", None),
        ("poll", None),
        ("answer", None),
    ]
    env.close()


def test_defer_returns_does_not_change_a_servers_acknowledgement(tmp_path):
    from jaxsampler.serving.server import PolicyServer

    path = tmp_path / "j"
    env = ExternalEnv(OBS, ACT, journal=StepJournal(path), defer_returns=True)
    server = PolicyServer(env, port=0)
    try:
        status, _, _ = http_request(server, "POST", "/start_episode", packb({"episode_id": "s"}))
        assert status == 200
        body = packb({"episode_id": "s", "reward": 1.5})
        status, _, _ = http_request(server, "POST", "/log_returns", body)
        assert status == 200
        # The 200 came after the write: the entry is in the file now.
        assert [e["reward"] for e in entries(path) if e["op"] == "returns"] == [
            {"default_agent": 1.5}
        ]
    finally:
        server.close()


def test_a_group_commits_fsync_runs_off_the_committing_thread(tmp_path, monkeypatch):
    synced_in: list[int] = []
    real_fsync = syncer_module.os.fsync

    def fsync(fd: int) -> None:
        synced_in.append(threading.get_ident())
        real_fsync(fd)

    monkeypatch.setattr(syncer_module.os, "fsync", fsync)
    journal = StepJournal(tmp_path / "j", fsync=GroupCommit(records=2))
    journal.record({"op": "noop"})
    journal.commit()  # 2 unsynced with the open entry: due
    wait_until(lambda: journal._syncer.syncs >= 1)
    assert synced_in and threading.get_ident() not in synced_in
    journal.close()


def test_a_failed_background_fsync_fails_the_journal(tmp_path, monkeypatch):
    def fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    journal = StepJournal(tmp_path / "j", fsync=GroupCommit(records=1))
    monkeypatch.setattr(syncer_module.os, "fsync", fsync)
    journal.record({"op": "noop"})
    journal.commit()  # acknowledged: in the OS's hands; its fsync fails later
    wait_until(lambda: journal._syncer.error is not None)
    journal.record({"op": "noop"})
    with pytest.raises(LogWriteError, match="fsync failed") as e:
        journal.commit()
    assert e.value.failed and e.value.__cause__.errno == errno.EIO
    journal._writer._close_fd()
