"""Write-ahead journal of an external env, and recovery of the steps a crash left unstored.

A served step is *acknowledged* when the client gets its answer: the action of a
``get_action``, the 200 of a ``log_action``, ``log_returns`` or ``end_episode``. Without a
journal, an acknowledged step lives only in the sampler's memory until the sampler's
output is written, so a server killed in between loses it. With one
(``ExternalEnv(..., journal=StepJournal(path))``) every change the env makes is written to
the journal *before* it takes effect, hence before it is acknowledged: the episode's
start, each observation (with its action for ``log_action``), each reward, the final
observation, each poll that hands steps to the sampler, each batch of answers and each
abandonment. An entry is in the OS's hands when the call returns (it survives the
server process being killed); ``fsync=True`` or a :class:`GroupCommit` makes entries
survive a machine crash too (see :class:`StepJournal`).

After a crash, :func:`recover` replays the journal into a fresh env of the same kind (the
env's own code, so each step comes out exactly as the sampler would have seen it), ends
the episodes the crash left open as truncated (their last acknowledged step kept), and
appends to the sampler's offline log every acknowledged step that the log does not hold
yet, as :class:`SingleAgentEpisode` chunks. Which steps the log holds is read from the
log itself (episode ids and step indices of its episodes and batches), so recovery can
run again after a crash during recovery and adds nothing twice: each acknowledged step
ends up in the log exactly once. For this the sampler names episodes by the env's
episode ids (an env with a journal sets ``names_episodes``; the host sampler then uses
them as ``eps_id``), and the env refuses ``start_episode`` of an id the journal already
holds, so ids never name two episodes.

Start each server run with the same journal (its new session follows the old ones;
recovery handles each session apart). A journal grows with every step until
:func:`recover` compacts it (by default) to the episode ids it held, so each recovery
replays what was written since the last one. Recovered steps carry no
``extra_model_outputs`` (the sampler's logp and value estimates died with it) and have
``"recovered": True`` in their infos. Multi-agent envs are journaled but
:func:`recover` handles single-agent journals only (it raises ``NotImplementedError``
for a multi-agent one).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from jaxsampler.episodes import MultiAgentBatch, SampleBatch, SingleAgentEpisode
from jaxsampler.episodes.codec import packb
from jaxsampler.host_envs.external import ExternalEnv, ExternalEnvBase
from jaxsampler.offline.frames import (
    CorruptLogError,
    TruncatedLogWarning,
    read_entries,
    read_records,
)
from jaxsampler.offline.writer import GroupCommit, OfflineWriter, _fsync_dir

__all__ = ["RecoveryReport", "StepJournal", "recover"]

#: info key marking the steps :func:`recover` wrote
RECOVERED_INFO = "recovered"
_CRASH_REASON = "the server stopped before the episode ended (recovered from its journal)"


class StepJournal:
    """The write-ahead journal an external env writes each change to before making it
    (see the module docstring); give it to the env: ``ExternalEnv(..., journal=j)``.

    Opening appends a new session to an existing journal (a torn last entry left by a
    crash is cut away with a :class:`~jaxsampler.offline.TornTailWarning`) and reads the
    episode ids it holds, which the env then refuses to start again.

    Entries are encoded as the env records them (under its lock) and go out as one frame,
    in one write, per :meth:`commit`, which the env runs before each acknowledgement: entries of
    concurrent calls share a write (group commit). Each commit also checks that the path
    still names the journal (:class:`~jaxsampler.offline.LogReplacedError` otherwise).

    Args:
        path: the journal file (an offline log of version 2 whose records are entries).
        fsync: ``False`` (default): a commit hands the entries to the OS, so a killed
            server loses nothing it acknowledged; ``True``: a commit also fsyncs (a machine
            crash loses nothing acknowledged either; an fsync per acknowledgement, slow on
            most disks); a :class:`GroupCommit`: fsync at a commit once N entries or N
            seconds are unsynced (a machine crash loses at most that window).

    Raises:
        CorruptLogError: the journal is damaged before its last entry.
    """

    def __init__(self, path: str | os.PathLike, *, fsync: bool | GroupCommit = False):
        self.path = str(path)
        self._known: set[str] = set()
        if os.path.exists(self.path) and os.path.getsize(self.path) > 0:
            for entry in _entries(self.path):
                _note_ids(entry, self._known)
        if not isinstance(fsync, (bool, GroupCommit)):
            raise TypeError(f"fsync must be a bool or a GroupCommit, got {fsync!r}")
        self.fsync = fsync
        self._lock = threading.Lock()
        self._unsynced = 0  # entries handed to the OS but not fsynced
        self._oldest = 0.0  # GroupCommit clock time of the oldest of them
        self._buffered: list[bytes] = []  # encoded entries of the next commit
        self._closed = False
        self._writer = OfflineWriter(self.path, append=True, flush="manual")
        self.record({"op": "open", "time": time.time(), "pid": os.getpid()})
        self.commit()

    def record(self, entry: dict[str, Any]) -> None:
        """Buffers one entry until the next :meth:`commit`."""
        payload = packb(entry)
        with self._lock:
            self._buffered.append(payload)

    def commit(self) -> None:
        """Hands every buffered entry to the OS in one write (and fsyncs as ``fsync``
        says); thread-safe.

        Raises:
            LogWriteError: writing failed (the journal ends intact, cut back to before the
                failed entries); :class:`~jaxsampler.offline.LogReplacedError`: the path no
                longer names the journal.
        """
        with self._lock:
            entries, self._buffered = self._buffered, []
            n = len(entries)
            if not n and not (self._unsynced and self.fsync is not False):
                return
            policy, writer = self.fsync, self._writer
            if n:  # one frame: a commit lands whole or (cut back after a failure) not at all
                writer._append(_array_head(n) + b"".join(entries), check_path=False)
            if policy is True:
                writer.sync()
                return
            writer.flush()
            if isinstance(policy, GroupCommit):
                if not self._unsynced:
                    self._oldest = policy.clock()
                self._unsynced += n
                if policy.due(self._unsynced, self._oldest):
                    writer.sync()
                    self._unsynced = 0

    def known(self, episode_id: str) -> bool:
        """Whether ``episode_id`` was started in an earlier session of this journal."""
        return episode_id in self._known

    def sync(self) -> None:
        """Writes and fsyncs every entry now."""
        self.commit()
        with self._lock:
            self._unsynced = 0
            self._writer.sync()

    def close(self) -> None:
        """Writes what is buffered, ends the session (an end frame) and closes the file;
        idempotent."""
        if not self._closed:
            self._closed = True
            self.commit()
        with self._lock:
            self._writer.close()

    def __enter__(self) -> StepJournal:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclasses.dataclass
class RecoveryReport:
    """What :func:`recover` found and did.

    Attributes:
        sessions: server runs found in the journal.
        episodes: episodes the journal holds.
        acknowledged_steps: acknowledged steps (with their next observation) in all.
        stored_steps: of these, those the log already held.
        recovered_steps: those appended now (``acknowledged - stored``).
        recovered_episodes: ids of the episodes that got recovered steps.
        ended_by_crash: ids of episodes a crash (or a server that stopped) left open.
    """

    sessions: int = 0
    episodes: int = 0
    acknowledged_steps: int = 0
    stored_steps: int = 0
    recovered_steps: int = 0
    recovered_episodes: list[str] = dataclasses.field(default_factory=list)
    ended_by_crash: list[str] = dataclasses.field(default_factory=list)
    compacted: bool = False


def recover(
    journal: str | os.PathLike,
    log: str | os.PathLike,
    env: ExternalEnvBase,
    *,
    compact: bool = True,
) -> RecoveryReport:
    """Appends to ``log`` every acknowledged step of ``journal`` that ``log`` lacks (see the
    module docstring). ``env`` is the env the new server will run (its spaces and kind are
    used for the replay; it is not changed). Run it before the new server serves (never
    while a server writes the journal). The log is synced before this returns.

    ``compact=True`` (default): once the log holds every step, the journal is replaced
    (atomically: a new file, fsynced, renamed over it) by one that keeps only the episode
    ids it held, which a server on it still refuses to start again. The next recovery
    then replays only what later runs wrote, instead of every run since the journal
    began. ``False`` keeps the journal as it is (say, to inspect it).

    Raises:
        NotImplementedError: a multi-agent env.
        CorruptLogError: the journal or the log is damaged, or the journal does not replay
            (it was not written by an env like ``env``).
    """
    if env.multi_agent:
        raise NotImplementedError("recover() handles single-agent journals only")
    journal, log = str(journal), str(log)
    report = RecoveryReport()
    episodes: list[_Steps] = []
    known: set[str] = set()
    for session in _sessions(journal, known):
        report.sessions += 1
        found, open_at_end = _replay(session, env, journal)
        episodes += found
        report.ended_by_crash += open_at_end
    has_log = episodes and os.path.exists(log) and os.path.getsize(log)
    stored = _stored_steps(log) if has_log else {}  # (nothing to look up: not read)
    chunks = []
    for ep in episodes:
        n = ep.num_steps()
        have = stored.get(ep.eid, set())
        report.episodes += 1
        report.acknowledged_steps += n
        missing = [t for t in range(n) if t not in have]
        report.stored_steps += n - len(missing)
        if missing:
            report.recovered_steps += len(missing)
            report.recovered_episodes.append(ep.eid)
            chunks += [ep.chunk(lo, hi, env) for lo, hi in _runs(missing)]
    if chunks:
        with OfflineWriter(log, append=True) as writer:
            for chunk in chunks:
                writer.write(chunk)
            writer.sync()
    if compact:
        _compact(journal, known)
        report.compacted = True
    return report


#: episode ids per entry of a compacted journal
_IDS_PER_ENTRY = 4096


def _compact(path: str, known: set[str]) -> None:
    """Replaces the journal by one holding only ``known`` (``ids`` entries), atomically."""
    tmp = f"{path}.compacting"
    ids = sorted(known)
    with OfflineWriter(tmp, fsync=True) as writer:
        for i in range(0, max(len(ids), 1), _IDS_PER_ENTRY):
            writer._append(packb({"op": "ids", "ids": ids[i : i + _IDS_PER_ENTRY]}))
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(os.path.abspath(path)))  # the rename survives a machine crash


def _note_ids(entry: dict, known: set[str]) -> None:
    """Adds the episode ids ``entry`` names as started (a start, or a compacted journal's
    ``ids``) to ``known``."""
    op = entry.get("op")
    if op == "start":
        known.add(str(entry["e"]))
    elif op == "ids":
        known.update(str(e) for e in entry["ids"])


# -- replay --------------------------------------------------------------------------------


def _entries(path: str) -> Iterator[dict]:
    """The journal's entries; the warnings of a crashed session are expected here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TruncatedLogWarning)
        for frame in read_entries(path):  # a commit's entries, or one entry (older journals)
            yield from frame if isinstance(frame, list) else (frame,)


def _array_head(n: int) -> bytes:
    """The msgpack header of an array of ``n`` items: followed by ``n`` encoded entries, it
    encodes their list without decoding them again."""
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def _sessions(path: str, known: set[str]) -> Iterator[list[dict]]:
    """The journal's server runs (their entries after the ``open``); adds every episode id
    started in it (or kept by a compaction) to ``known``."""
    session: list[dict] | None = None
    for entry in _entries(path):
        _note_ids(entry, known)
        if entry.get("op") == "ids":
            continue  # a compacted journal's ids, before any session
        if entry.get("op") == "open":
            if session is not None:
                yield session
            session = []
        elif session is None:
            raise CorruptLogError(path, 0, "a journal entry before the first session start")
        else:
            session.append(entry)
    if session is not None:
        yield session


class _Steps:
    """One episode as the sampler saw it: the items polled, and the action of each."""

    def __init__(self, eid: str):
        self.eid = eid
        self.items: list[dict[str, Any]] = []
        self.actions: list[Any] = []

    def num_steps(self) -> int:
        """Steps with an action and a next observation: up to the first item without an
        action (it ends the episode as its final observation) or the final item."""
        for t, (item, action) in enumerate(zip(self.items, self.actions)):
            if item["final"] or action is None:
                return t
        return max(0, len(self.items) - 1)

    def chunk(self, lo: int, hi: int, env: ExternalEnvBase) -> SingleAgentEpisode:
        """Steps ``lo .. hi - 1`` as an episode chunk (ending the episode where ``hi`` is
        its last step)."""
        items = self.items[lo : hi + 1]
        last = self.items[hi]
        end = hi == self.num_steps()
        return SingleAgentEpisode(
            self.eid,
            observations=[i["obs"] for i in items],
            infos=[{**i["info"], RECOVERED_INFO: True} for i in items],
            actions=self.actions[lo:hi],
            rewards=[float(i["reward"]) for i in items[1:]],
            terminated=end and last["terminated"],
            truncated=end and not last["terminated"],
            t_started=lo,
            len_lookback_buffer=0,
            observation_space=env.observation_space,
            action_space=env.action_space,
        )


def _replay(entries: list[dict], like: ExternalEnvBase, path: str) -> tuple[list[_Steps], list]:
    """Replays one session's entries into a fresh env like ``like``; returns its episodes
    and the ids of those still open at its end (then ended as truncated)."""
    env = ExternalEnv(
        like.observation_space,
        like.action_space,
        max_wait_s=0.0,
        episode_timeout_s=None,
        max_concurrent_episodes=1 << 30,
        max_episodes_per_owner=None,
        max_episode_id_len=1 << 20,
        max_queued_steps=1 << 30,
        max_finished_ids=1,
    )
    (agent,) = like.agent_ids
    steps: dict[str, _Steps] = {}

    def poll(expected: list | None) -> None:
        res = env.poll(timeout=0)
        if expected is not None and sorted(res.obs) != sorted(expected):
            raise CorruptLogError(path, 0, "the journal does not replay (a poll differs)")
        for eid, obs in res.obs.items():
            ep = steps[eid]
            ep.items.append(
                {
                    "obs": obs[agent],
                    "reward": res.rewards[eid].get(agent, 0.0),
                    "info": dict(res.infos[eid].get(agent) or {}),
                    "terminated": bool(res.terminateds[eid].get(agent, False)),
                    "final": bool(
                        res.terminateds[eid]["__all__"] or res.truncateds[eid]["__all__"]
                    ),
                }
            )
            offp = res.off_policy_actions.get(eid)
            ep.actions.append(None if offp is None else offp[agent])

    for entry in entries:
        op, eid = entry["op"], str(entry.get("e"))
        try:
            if op == "start":
                env.start_episode(eid, entry["training"])
                steps[eid] = _Steps(eid)
            elif op == "submit":
                env.submit(
                    eid, entry["obs"], entry["action"], entry["info"], entry["want"], block=False
                )
            elif op == "returns":
                env.log_agent_returns(eid, entry["reward"], entry["info"], entry["done"])
            elif op == "end":
                env.end_agent_episode(eid, entry["obs"], entry["truncated"])
            elif op == "settle":
                with env._lock:
                    env._settle_off_policy()
            elif op == "poll":
                poll(entry["ready"])
            elif op == "answer":
                for e, acts in entry["actions"].items():
                    ep = env._episodes.get(e)
                    if (
                        ep is not None
                        and ep.in_flight is not None
                        and ep.in_flight.waiter is not None
                    ):
                        steps[e].actions[-1] = acts[agent]
                env.send_actions(entry["actions"])
            elif op == "abandon":
                with env._lock:
                    env._abandon(env._episodes[eid], entry["reason"])
            else:
                raise CorruptLogError(path, 0, f"unknown journal entry {op!r}")
        except CorruptLogError:
            raise
        except Exception as e:
            raise CorruptLogError(path, 0, f"the journal does not replay at {op!r}: {e}") from e
    open_at_end = [eid for eid, ep in env._episodes.items() if ep.closed_reason is None]
    for eid in open_at_end:
        env.abandon_episode(eid, _CRASH_REASON)
    while env._ready or env._offp_in_flight:
        poll(None)
    return list(steps.values()), open_at_end


# -- what the log holds --------------------------------------------------------------------


def _stored_steps(path: str) -> dict[str, set[int]]:
    """Episode id -> the step indices the offline log at ``path`` holds."""
    stored: dict[str, set[int]] = {}
    with warnings.catch_warnings():  # the sampler's writer crashed too: expected here
        warnings.simplefilter("ignore", TruncatedLogWarning)
        records = list(read_records(path))
    for record in records:
        batches = (
            record.policy_batches.values() if isinstance(record, MultiAgentBatch) else [record]
        )
        for r in batches:
            if isinstance(r, SingleAgentEpisode):
                stored.setdefault(str(r.id_), set()).update(
                    range(r.t_started, r.t_started + len(r))
                )
            elif isinstance(r, SampleBatch):
                for eid, t in zip(np.asarray(r["eps_id"]).tolist(), np.asarray(r["t"]).tolist()):
                    stored.setdefault(str(eid), set()).add(int(t))
            else:  # a MultiAgentEpisode: not from a single-agent env
                raise CorruptLogError(path, 0, "the log holds multi-agent episodes")
    return stored


def _runs(ts: list[int]) -> list[tuple[int, int]]:
    """Sorted step indices as ``[lo, hi)`` runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for t in ts:
        if runs and runs[-1][1] == t:
            runs[-1] = (runs[-1][0], t + 1)
        else:
            runs.append((t, t + 1))
    return runs
