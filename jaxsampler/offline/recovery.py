"""Recovery of the steps a crash left unstored, from an external env's write-ahead journal.

After a crash, :func:`recover` replays the journal (:class:`~jaxsampler.offline.StepJournal`)
into a fresh env of the same kind (the env's own code, so each step comes out exactly as
the sampler would have seen it), ends the episodes the crash left open as truncated
(their last acknowledged step kept), and appends to the sampler's offline log every
acknowledged step that the log does not hold yet, as :class:`SingleAgentEpisode` chunks.
Which steps the log holds is read from the log itself (episode ids and step indices of
its episodes and batches), so recovery can run again after a crash during recovery and
adds nothing twice: each acknowledged step ends up in the log exactly once. For this the
sampler names episodes by the env's episode ids (an env with a journal sets
``names_episodes``; the host sampler then uses them as ``eps_id``), and the env refuses
``start_episode`` of an id the journal already holds, so ids never name two episodes.

After an in-run checkpoint (see :mod:`jaxsampler.offline.journal`) the journal holds the
episodes that ran at the checkpoint and what followed; the steps those episodes had handed
to the sampler before it count as stored (the checkpoint was taken once they were in the
log), and the log is read only from where it ended at the checkpoint.

Recovered steps carry no ``extra_model_outputs`` (the sampler's logp and value estimates
died with it) and have ``"recovered": True`` in their infos. Multi-agent envs are
journaled but :func:`recover` handles single-agent journals only (it raises
``NotImplementedError`` for a multi-agent one).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np

from jaxsampler.episodes import MultiAgentBatch, SampleBatch, SingleAgentEpisode
from jaxsampler.episodes.codec import _OBJECT
from jaxsampler.host_envs.external import ExternalEnv, ExternalEnvBase
from jaxsampler.offline.frames import (
    _FRAME_LEN,
    CorruptLogError,
    TruncatedLogWarning,
    _decode_record,
    _parse_head,
    _read_header,
    read_payloads,
    read_records,
)
from jaxsampler.offline.journal import _compact, _entries, _note_ids
from jaxsampler.offline.writer import OfflineWriter

__all__ = ["RecoveryReport", "recover"]

#: info key marking the steps :func:`recover` wrote
RECOVERED_INFO = "recovered"
_CRASH_REASON = "the server stopped before the episode ended (recovered from its journal)"


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
        compacted: whether the journal was compacted.
        log_read_from: the byte of the log its stored steps were read from (after a
            checkpoint: where the log ended then); 0: the whole log was read.
    """

    sessions: int = 0
    episodes: int = 0
    acknowledged_steps: int = 0
    stored_steps: int = 0
    recovered_steps: int = 0
    recovered_episodes: list[str] = dataclasses.field(default_factory=list)
    ended_by_crash: list[str] = dataclasses.field(default_factory=list)
    compacted: bool = False
    log_read_from: int = 0


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
    read_from = None  # the least log offset a session's lookups need (0: the whole log)
    for session in _sessions(journal, known):
        report.sessions += 1
        found, open_at_end, offset = _replay(session, env, journal)
        episodes += found
        report.ended_by_crash += open_at_end
        if found:
            read_from = offset if read_from is None else min(read_from, offset)
    has_log = read_from is not None and os.path.exists(log) and os.path.getsize(log)
    if has_log:
        read_from = _start_of_reading(log, read_from or 0)
        report.log_read_from = read_from
    stored = _stored_steps(log, read_from or None) if has_log else {}  # (none to look up)
    if not has_log or not read_from:  # the log says it all (or is gone): trust only it
        for ep in episodes:
            ep.stored_before = 0
    chunks = []
    for ep in episodes:
        n = ep.num_steps()
        have = stored.get(ep.eid, set())
        report.episodes += 1
        report.acknowledged_steps += n
        missing = [t for t in range(ep.stored_before, n) if t not in have]
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


# -- replay --------------------------------------------------------------------------------


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
        #: steps before this one were stored when the journal took its checkpoint
        self.stored_before = 0

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


def _replay(
    entries: list[dict], like: ExternalEnvBase, path: str
) -> tuple[list[_Steps], list, int]:
    """Replays one session's entries into a fresh env like ``like``; returns its episodes,
    the ids of those still open at its end (then ended as truncated), and the log offset
    from which its steps must be looked up (its checkpoint's; 0: the whole log)."""
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
    log_offset = 0

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
            elif op == "checkpoint":  # what the sampler had polled was in the log then
                for polled in steps.values():
                    polled.stored_before = max(len(polled.items) - 1, 0)
                log_offset = entry["log_offset"] or 0
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
    return list(steps.values()), open_at_end, log_offset


# -- what the log holds --------------------------------------------------------------------


def _start_of_reading(path: str, offset: int) -> int:
    """``offset`` if the log has a frame there (or ends there), else 0 (the whole log),
    with a warning: the log is not the one the checkpoint saw (repaired, or another)."""
    if not offset:
        return 0
    with open(path, "rb") as f:
        f.seek(offset)
        head = f.read(_FRAME_LEN)
    if head == b"" and os.path.getsize(path) == offset:
        return offset
    if len(head) == _FRAME_LEN and not isinstance(_parse_head(head), str):
        return offset
    warnings.warn(
        f"{path}: the journal's checkpoint says the log ended at byte {offset}, but the log "
        "has no record there (it was repaired or replaced since); reading the whole log",
        stacklevel=3,
    )
    return 0


def _stored_steps(path: str, offset: int | None = None) -> dict[str, set[int]]:
    """Episode id -> the step indices the offline log at ``path`` holds (from ``offset``
    on, or all). Single-agent episodes are read without decoding their arrays."""
    stored: dict[str, set[int]] = {}
    with warnings.catch_warnings():  # the sampler's writer crashed too: expected here
        warnings.simplefilter("ignore", TruncatedLogWarning)
        if path.endswith(".gz") or _version(path) != 2:
            records: Iterator[Any] = read_records(path, offset=offset)
        else:
            records = (_span(p) or _decode_record(p, path, 0) for p in read_payloads(path, offset))
        for record in records:
            if isinstance(record, tuple):  # (id, first step, end) of an episode
                stored.setdefault(record[0], set()).update(range(record[1], record[2]))
                continue
            batches = (
                record.policy_batches.values() if isinstance(record, MultiAgentBatch) else [record]
            )
            for r in batches:
                if isinstance(r, SingleAgentEpisode):
                    stored.setdefault(str(r.id_), set()).update(
                        range(r.t_started, r.t_started + len(r))
                    )
                elif isinstance(r, SampleBatch):
                    ids, ts = np.asarray(r["eps_id"]).tolist(), np.asarray(r["t"]).tolist()
                    for eid, t in zip(ids, ts):
                        stored.setdefault(str(eid), set()).add(int(t))
                else:  # a MultiAgentEpisode: not from a single-agent env
                    raise CorruptLogError(path, 0, "the log holds multi-agent episodes")
    return stored


def _span(payload: bytes) -> tuple[str, int, int] | None:
    """``(id, t_started, t)`` of a single-agent episode record, read from its state without
    decoding its buffers (their arrays are most of its bytes); None for any other record."""
    try:
        top = msgpack.unpackb(payload, ext_hook=msgpack.ExtType, raw=False, strict_map_key=False)
        if not isinstance(top, msgpack.ExtType) or top.code != _OBJECT:
            return None
        tag, state = msgpack.unpackb(
            top.data, ext_hook=msgpack.ExtType, raw=False, strict_map_key=False
        )
        if tag != "SingleAgentEpisode":
            return None
        return str(state["id_"]), int(state["t_started"]), int(state["t"])
    except Exception:  # not the shape expected: the full decoder says what is wrong
        return None


def _version(path: str) -> int:
    with open(path, "rb") as f:
        return _read_header(f, path)


def _runs(ts: list[int]) -> list[tuple[int, int]]:
    """Sorted step indices as ``[lo, hi)`` runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for t in ts:
        if runs and runs[-1][1] == t:
            runs[-1] = (runs[-1][0], t + 1)
        else:
            runs.append((t, t + 1))
    return runs
