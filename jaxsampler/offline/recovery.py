"""Recovery of the steps a crash left unstored, from an external env's write-ahead journal.

After a crash, :func:`recover` replays the journal (:class:`~jaxsampler.offline.StepJournal`)
into a fresh env of the same kind (the env's own code, so each step comes out exactly as
the sampler would have seen it), ends the episodes the crash left open as truncated
(their last acknowledged step kept), and appends to the sampler's offline log every
acknowledged step that the log does not hold yet, as :class:`SingleAgentEpisode` chunks,
or for a multi-agent env (:class:`~jaxsampler.host_envs.external.ExternalMultiAgentEnv`)
each acknowledged *agent* step as :class:`MultiAgentEpisode` chunks (see
:mod:`jaxsampler.offline._recovery_ma`: an agent's step may be stored while another
agent's step of the same env step is not, so a chunk holds, per agent, one run of its
missing steps). Which steps the log holds is read from the log itself (episode ids and
step indices of its episodes and batch rows; for a multi-agent log, episode id, agent and
the agent's step), so recovery can run again after a crash during recovery and adds
nothing twice: each acknowledged step ends up in the log exactly once. For this the
sampler names episodes by the env's episode ids (an env with a journal sets
``names_episodes``; the host sampler then uses them as ``eps_id``), and the env refuses
``start_episode`` of an id the journal already holds, so ids never name two episodes.

After an in-run checkpoint (see :mod:`jaxsampler.offline.journal`) the journal holds the
episodes that ran at the checkpoint and what followed; the steps those episodes had handed
to the sampler before it count as stored (the checkpoint was taken once they were in the
log), and the log is read only from where it ended at the checkpoint.

Recovered steps carry no ``extra_model_outputs`` (the sampler's logp and value estimates
died with it) and have ``"recovered": True`` in their infos. The sampler's agent-to-policy
mapping is not in the journal: recovered multi-agent chunks map each agent to the module
id ``recover(..., agent_module_ids=)`` gives it, and without one to the default policy.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import msgpack
import numpy as np

from jaxsampler.episodes import MultiAgentBatch, SampleBatch, SingleAgentEpisode
from jaxsampler.episodes.codec import _OBJECT
from jaxsampler.host_envs.external import ExternalEnvBase
from jaxsampler.offline._recovery_ma import agent_lines, ma_chunks, stored_keys
from jaxsampler.offline._replay import RECOVERED_INFO, _Steps, replay, runs, sessions
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
from jaxsampler.offline.journal import _compact
from jaxsampler.offline.writer import OfflineWriter

__all__ = ["RecoveryReport", "recover"]


@dataclasses.dataclass
class RecoveryReport:
    """What :func:`recover` found and did.

    Attributes:
        sessions: server runs found in the journal.
        episodes: episodes the journal holds.
        acknowledged_steps: acknowledged steps (with their next observation) in all; for
            a multi-agent env, agent steps.
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
    agent_module_ids: Mapping[Any, str] | None = None,
) -> RecoveryReport:
    """Appends to ``log`` every acknowledged step of ``journal`` that ``log`` lacks (see the
    module docstring). ``env`` is the env the new server will run, of the kind that wrote
    the journal (an :class:`~jaxsampler.host_envs.external.ExternalEnv`, or an
    :class:`~jaxsampler.host_envs.external.ExternalMultiAgentEnv` with the same agent ids;
    its spaces and kind are used for the replay; it is not changed). Run it before the new
    server serves (never while a server writes the journal). The log is synced before this
    returns. For a multi-agent env the report's step counts are agent steps.

    ``compact=True`` (default): once the log holds every step, the journal is replaced
    (atomically: a new file, fsynced, renamed over it) by one that keeps only the episode
    ids it held, which a server on it still refuses to start again. The next recovery
    then replays only what later runs wrote, instead of every run since the journal
    began. ``False`` keeps the journal as it is (say, to inspect it).

    ``agent_module_ids`` (multi-agent envs only): each agent id of ``env`` -> the module
    (policy) id the sampler mapped it to, given to the recovered chunks (say ``{a:
    policy.policy_mapping_fn(a) for a in env.agent_ids}`` for a
    :class:`~jaxsampler.policies.MultiAgentPolicy`); ``None``: every agent gets the
    default policy's id (the journal does not hold the sampler's mapping).

    Raises:
        CorruptLogError: the journal or the log is damaged, or the journal does not replay
            (it was not written by an env like ``env``: a single-agent journal given a
            multi-agent env, or the reverse, is named as such), or the log holds episodes
            of the other kind.
        ValueError: ``agent_module_ids`` given for a single-agent env, or not naming
            exactly ``env``'s agents (the missing and unknown ones are named).
    """
    modules = _modules(agent_module_ids, env)
    journal, log = str(journal), str(log)
    report = RecoveryReport()
    episodes: list[_Steps] = []
    known: set[str] = set()
    read_from = None  # the least log offset a session's lookups need (0: the whole log)
    for session in sessions(journal, known):
        report.sessions += 1
        found, offset = replay(session, env, journal)
        episodes += found
        report.ended_by_crash += [ep.eid for ep in found if ep.ended_by_crash]
        if found:
            read_from = offset if read_from is None else min(read_from, offset)
    has_log = read_from is not None and os.path.exists(log) and os.path.getsize(log)
    if has_log:
        read_from = _start_of_reading(log, read_from or 0)
        report.log_read_from = read_from
    stored: dict = {}  # (none to look up without a log)
    if has_log:
        stored = _stored_in(log, read_from or None, env)
    if not has_log or not read_from:  # the log says it all (or is gone): trust only it
        for ep in episodes:
            ep.polled_at_checkpoint = 0
    chunks: list[Any] = []
    for ep in episodes:
        report.episodes += 1
        new: list[Any]
        if env.multi_agent:
            lines = agent_lines(ep)
            have = {a: stored.get((ep.eid, a), set()) for a in lines}
            missing = _missing(report, lines, have)
            new = ma_chunks(ep, lines, missing, env, modules) if missing else []
        else:
            missing = _missing(report, {ep.eid: _SingleLine(ep)}, stored)
            new = [_chunk(ep, lo, hi, env) for lo, hi in runs(missing.get(ep.eid, []))]
        if new:
            report.recovered_episodes.append(ep.eid)
            chunks += new
    if chunks:
        with OfflineWriter(log, append=True) as writer:
            for chunk in chunks:
                writer.write(chunk)
            writer.sync()
    if compact:
        _compact(journal, known)
        report.compacted = True
    return report


def _modules(given: Mapping[Any, str] | None, env: ExternalEnvBase) -> dict | None:
    """``given`` checked against ``env``'s agents (see :func:`recover`)."""
    if given is None:
        return None
    if not env.multi_agent:
        raise ValueError("agent_module_ids is for a multi-agent env; this env has one agent")
    if not isinstance(given, Mapping):
        raise ValueError(f"agent_module_ids must be a dict agent -> module id, got {given!r}")
    agents = list(env.agent_ids)
    missing = [a for a in agents if a not in given]
    unknown = [a for a in given if a not in agents]
    if missing or unknown:
        raise ValueError(
            f"agent_module_ids must name exactly the env's agents {agents}: "
            f"missing {missing}, unknown {unknown}"
        )
    return dict(given)


def _missing(
    report: RecoveryReport, lines: Mapping[Any, Any], stored: Mapping[Any, set[int]]
) -> dict[Any, list[int]]:
    """Key -> the acknowledged steps of ``lines[key]`` (``num_steps`` of them, the first
    ``stored_before`` stored at a checkpoint) that ``stored[key]`` lacks; counted in
    ``report``."""
    missing = {}
    for key, line in lines.items():
        have = stored.get(key, set())
        n = line.num_steps
        todo = [t for t in range(line.stored_before, n) if t not in have]
        report.acknowledged_steps += n
        report.stored_steps += n - len(todo)
        report.recovered_steps += len(todo)
        if todo:
            missing[key] = todo
    return missing


# -- single-agent chunks -------------------------------------------------------------------


class _SingleLine:
    """The steps of a single-agent episode: with an action and a next observation, up to
    its last item (:meth:`_Steps.last_index`); those before its checkpoint were stored."""

    def __init__(self, ep: _Steps):
        self.num_steps = max(ep.last_index(), 0)
        self.stored_before = max(ep.polled_at_checkpoint - 1, 0)


def _chunk(ep: _Steps, lo: int, hi: int, env: ExternalEnvBase) -> SingleAgentEpisode:
    """Steps ``lo .. hi - 1`` of a single-agent episode as an episode chunk (ending the
    episode where ``hi`` is its last step)."""
    (agent,) = env.agent_ids
    items = ep.items[lo : hi + 1]
    last = ep.items[hi]
    terminated = last["terminated"][agent]
    end = hi == ep.last_index()
    return SingleAgentEpisode(
        ep.eid,
        observations=[i["obs"][agent] for i in items],
        infos=[{**i["infos"][agent], RECOVERED_INFO: True} for i in items],
        actions=[a[agent] for a in ep.actions[lo:hi]],  # type: ignore[index]
        rewards=[float(i["rewards"].get(agent, 0.0)) for i in items[1:]],
        terminated=end and terminated,
        truncated=end and not terminated,
        t_started=lo,
        len_lookback_buffer=0,
        observation_space=env.observation_space,
        action_space=env.action_space,
    )


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


def _stored_in(path: str, offset: int | None, env: ExternalEnvBase) -> dict:
    """What the log holds of ``env``'s kind: episode id -> step indices (single-agent), or
    ``(episode id, agent)`` -> the agent's step indices (multi-agent)."""
    if not env.multi_agent:
        return _stored_steps(path, offset)
    agents = env.agent_ids
    return _read_stored(path, offset, lambda r: stored_keys(r, agents, path))


def _stored_steps(path: str, offset: int | None = None) -> dict[str, set[int]]:
    """Episode id -> the step indices the single-agent offline log at ``path`` holds (from
    ``offset`` on, or all). Episodes are read without decoding their arrays."""
    return _read_stored(path, offset, lambda r: _single_keys(r, path))


def _read_stored(
    path: str, offset: int | None, keys: Callable[[Any], Iterable[tuple[Any, Iterable[int]]]]
) -> dict:
    """Key -> step indices over the log's records (from ``offset`` on, or all), ``keys``
    naming those of one record (a single-agent episode's span comes as ``(id, first
    step, end)``, read without decoding its arrays; a batch's policy batches one by one)."""
    stored: dict[Any, set[int]] = {}
    with warnings.catch_warnings():  # the sampler's writer crashed too: expected here
        warnings.simplefilter("ignore", TruncatedLogWarning)
        if path.endswith(".gz") or _version(path) != 2:
            records: Iterator[Any] = read_records(path, offset=offset)
        else:
            records = (_span(p) or _decode_record(p, path, 0) for p in read_payloads(path, offset))
        for record in records:
            parts = (
                record.policy_batches.values() if isinstance(record, MultiAgentBatch) else [record]
            )
            for part in parts:
                for key, steps in keys(part):
                    stored.setdefault(key, set()).update(steps)
    return stored


def _single_keys(record: Any, path: str) -> Iterable[tuple[str, Iterable[int]]]:
    """``(episode id, steps)`` of what one record of a single-agent log holds."""
    if isinstance(record, tuple):  # (id, first step, end) of an episode
        yield record[0], range(record[1], record[2])
    elif isinstance(record, SingleAgentEpisode):
        yield str(record.id_), range(record.t_started, record.t_started + len(record))
    elif isinstance(record, SampleBatch):
        ids, ts = np.asarray(record["eps_id"]).tolist(), np.asarray(record["t"]).tolist()
        for eid, t in zip(ids, ts, strict=True):
            yield str(eid), (int(t),)
    else:  # a MultiAgentEpisode: not from a single-agent env
        raise CorruptLogError(
            path,
            0,
            "the log holds multi-agent episodes (a multi-agent env's log), "
            "not the episodes of a single-agent env",
        )


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
