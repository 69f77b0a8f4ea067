"""The replay half of :func:`~jaxsampler.offline.recover`: a journal's sessions, replayed into
a fresh external env of the kind that wrote them (single- or multi-agent), give each
episode's steps exactly as the sampler polled them (:class:`_Steps`). Which of those steps
the log lacks, and the chunks that add them, are :mod:`~jaxsampler.offline.recovery`'s
(single-agent) and :mod:`~jaxsampler.offline._recovery_ma`'s (multi-agent) business."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from jaxsampler.constants import ALL_AGENTS, DEFAULT_AGENT_ID
from jaxsampler.host_envs.base import agent_spaces
from jaxsampler.host_envs.external import ExternalEnv, ExternalEnvBase, ExternalMultiAgentEnv
from jaxsampler.offline.frames import CorruptLogError
from jaxsampler.offline.journal import _entries, _note_ids

__all__: list[str] = []

#: info key marking the steps recovery wrote
RECOVERED_INFO = "recovered"
CRASH_REASON = "the server stopped before the episode ended (recovered from its journal)"
#: journal entries whose agent dicts name the agents of the env that wrote them
_AGENT_DICTS = {
    "submit": ("obs", "action", "info"),
    "returns": ("reward", "info", "done"),
    "end": ("obs",),
}


def sessions(path: str, known: set[str]) -> Iterator[list[dict]]:
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
    """One episode as the sampler saw it: the items polled (agent dicts, see
    :meth:`add_item`) and the actions of each (``{agent: action}``; ``None`` while a
    ``get_action`` waits for its answer, and for good if it never got one)."""

    def __init__(self, eid: str):
        self.eid = eid
        self.items: list[dict[str, Any]] = []
        self.actions: list[dict | None] = []
        #: items polled when the journal took its checkpoint: the steps they completed
        #: were stored in the log then
        self.polled_at_checkpoint = 0
        #: whether the crash (or a server that stopped) left the episode open
        self.ended_by_crash = False

    def add_item(self, obs: dict, rewards: dict, infos: dict, terms: dict, truncs: dict) -> None:
        """Adds one polled step (a poll's dicts for this episode)."""
        self.items.append(
            {
                "obs": dict(obs),
                "rewards": dict(rewards),
                "infos": {a: dict(infos.get(a) or {}) for a in obs},
                "terminated": {a: bool(terms.get(a, False)) for a in obs},
                "all_term": bool(terms.get(ALL_AGENTS, False)),
                "all_trunc": bool(truncs.get(ALL_AGENTS, False)),
            }
        )

    def last_index(self) -> int:
        """The index of the item that ends the episode as the log keeps it: the first final
        item or the first without its actions (a ``get_action`` the crash left unanswered:
        its observation is the final one), else the last item; -1 without items."""
        for i, (item, action) in enumerate(zip(self.items, self.actions, strict=True)):
            if item["all_term"] or item["all_trunc"] or action is None:
                return i
        return len(self.items) - 1


def fresh_env(like: ExternalEnvBase) -> ExternalEnvBase:
    """An env of ``like``'s kind, spaces and agents that replays anything a journal holds
    (no timeouts, no quotas, no back pressure)."""
    options: dict[str, Any] = {
        "max_wait_s": 0.0,
        "episode_timeout_s": None,
        "max_concurrent_episodes": 1 << 30,
        "max_episodes_per_owner": None,
        "max_episode_id_len": 1 << 20,
        "max_queued_steps": 1 << 30,
        "max_finished_ids": 1,
    }
    if like.multi_agent:
        obs_spaces, act_spaces = agent_spaces(like)  # agents with their own spaces keep them
        return ExternalMultiAgentEnv(obs_spaces, act_spaces, agent_ids=like.agent_ids, **options)
    return ExternalEnv(like.observation_space, like.action_space, **options)


def check_agents(entry: dict, env: ExternalEnvBase, path: str) -> None:
    """Raises :class:`CorruptLogError` naming the mismatch when ``entry`` names agents that
    ``env`` lacks: a journal of another kind of env (single- vs multi-agent) or agents."""
    named: set = set()
    for key in _AGENT_DICTS.get(entry["op"], ()):
        if isinstance(entry.get(key), dict):
            named.update(entry[key])
    unknown = sorted(map(str, named - set(env.agent_ids)))
    if not unknown:
        return
    if not env.multi_agent:
        why = (
            f"the journal was written by a multi-agent env (agents {unknown} ...), not a "
            "single-agent one: recover it with an ExternalMultiAgentEnv of its agent ids"
        )
    elif unknown == [DEFAULT_AGENT_ID]:
        why = (
            "the journal was written by a single-agent env (agent "
            f"{DEFAULT_AGENT_ID!r}), not a multi-agent one: recover it with an ExternalEnv"
        )
    else:
        why = f"the journal names agents {unknown} that the env lacks (its agent_ids: "
        why += f"{list(env.agent_ids)}): it was written by another env"
    raise CorruptLogError(path, 0, why)


def replay(entries: list[dict], like: ExternalEnvBase, path: str) -> tuple[list[_Steps], int]:
    """Replays one session's entries into a fresh env like ``like``; returns its episodes
    (those still open at its end are then ended as truncated and marked
    ``ended_by_crash``) and the log offset from which its steps must be looked up (its
    checkpoint's; 0: the whole log)."""
    env = fresh_env(like)
    steps: dict[str, _Steps] = {}
    log_offset = 0

    def poll(expected: list | None) -> None:
        res = env.poll(timeout=0)
        if expected is not None and sorted(res.obs) != sorted(expected):
            raise CorruptLogError(path, 0, "the journal does not replay (a poll differs)")
        for eid, obs in res.obs.items():
            ep = steps[eid]
            terms = res.terminateds[eid]
            ep.add_item(obs, res.rewards[eid], res.infos[eid], terms, res.truncateds[eid])
            offp = res.off_policy_actions.get(eid)
            if offp is not None:
                ep.actions.append(dict(offp))
            elif all(terms.get(a, False) for a in obs):  # nobody acts on it
                ep.actions.append({})
            else:  # until its answer
                ep.actions.append(None)

    for entry in entries:
        op, eid = entry["op"], str(entry.get("e"))
        check_agents(entry, like, path)
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
                # Journals written before truncated ends were refused without every waiting
                # agent's observation: such an end gives them their latest one again.
                env.end_agent_episode(eid, entry["obs"], entry["truncated"], complete_waiting=True)
            elif op == "settle":
                with env._lock:
                    env._settle_off_policy()
            elif op == "poll":
                poll(entry["ready"])
            elif op == "answer":
                for e, acts in entry["actions"].items():
                    answered = _answered(env, e, acts)
                    if answered is not None:
                        steps[e].actions[-1] = answered
                env.send_actions(entry["actions"])
            elif op == "checkpoint":  # what the sampler had polled was in the log then
                for polled in steps.values():
                    polled.polled_at_checkpoint = len(polled.items)
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
        steps[eid].ended_by_crash = True
        env.abandon_episode(eid, CRASH_REASON)
    while env._ready or env._offp_in_flight:
        poll(None)
    return list(steps.values()), log_offset


def _answered(env: ExternalEnvBase, eid: str, actions: dict) -> dict | None:
    """The actions a ``get_action`` of episode ``eid`` waiting for this answer gets (those
    of its acting agents), or None: no such call waits (none was made, or it was given up
    while in flight: timed out, its client gone), or the answer lacks an agent's action
    (the call then fails): nothing is acknowledged."""
    ep = env._episodes.get(eid)
    if ep is None or ep.in_flight is None or ep.in_flight.waiter is None:
        return None
    if ep.in_flight.waiter.done:
        return None
    item = ep.in_flight
    want = [a for a in item.obs if not item.terminated.get(a, False)]
    if not all(a in actions for a in want):
        return None
    return {a: actions[a] for a in want}


def runs(ts: list[int]) -> list[tuple[int, int]]:
    """Sorted step indices as ``[lo, hi)`` runs of consecutive ones."""
    out: list[tuple[int, int]] = []
    for t in ts:
        if out and out[-1][1] == t:
            out[-1] = (out[-1][0], t + 1)
        else:
            out.append((t, t + 1))
    return out
