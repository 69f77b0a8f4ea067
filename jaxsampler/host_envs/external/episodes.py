"""The per-episode book-keeping of external envs, all under one lock.

:class:`_EpisodeBook` (the base of :class:`~jaxsampler.host_envs.external.ExternalEnvBase`)
holds the episode table and everything kept per episode: owners and their quotas
(``max_concurrent_episodes``, ``max_episodes_per_owner``), the steps each episode has for
the sampler (:class:`_Item`: pending, ready, in flight, idle), what one poll delivers, the
memory of finished ids (``max_finished_ids`` keyed 64-bit hashes), abandonment and the
reaping of silent episodes (``episode_timeout_s``, measured on a
:class:`~jaxsampler.host_envs.external.clock.RunningClock`, so time in which the process
itself did not run is not held against a client). One lock guards all of it, with the
two conditions that wait on it (the poller's and back pressure's); its methods expect the
lock held unless they say otherwise (the public queries take it).
"""

from __future__ import annotations

import _thread
import hashlib
import secrets
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from jaxsampler.constants import ALL_AGENTS
from jaxsampler.host_envs.base import MultiEnvDict, PollResult
from jaxsampler.host_envs.external.clock import RunningClock, process_clock
from jaxsampler.host_envs.external.errors import (
    CapacityError,
    EnvClosedError,
    EpisodeStateError,
    InvalidDataError,
    UnknownEpisodeError,
    _not_found,
    _short_id,
)

__all__ = ["Waiter"]


class Waiter:
    """One blocked ``get_action`` call; the sampler answers it with :meth:`set` (under the
    env lock, at most once). A bare pre-acquired lock rather than a ``threading.Event``:
    waking a caller is one ``release()``, no condition variable and no second lock."""

    __slots__ = ("_gate", "value", "error", "done", "callback")

    def __init__(self, callback: Callable[[], None] | None = None) -> None:
        self._gate = _thread.allocate_lock()
        self._gate.acquire()
        self.value: Any = None
        self.error: BaseException | None = None
        self.done = False  # set() was called
        #: called once by set() (under the env lock, in the answering thread): how an
        #: event loop learns of the answer without a thread blocked in wait()
        self.callback = callback

    def set(self) -> None:
        """Answers the call (``value`` or ``error`` set first); later calls do nothing."""
        if not self.done:
            self.done = True
            self.open()

    def claim(self) -> None:
        """Marks the call answered (under the env lock) without waking it yet: nobody can
        expire it any more, and :meth:`open` wakes it once its answer is durable (a
        journal's commit outside the lock)."""
        self.done = True

    def open(self) -> None:
        """Wakes the caller of an answered call (after :meth:`claim`, or from :meth:`set`)."""
        self._gate.release()
        if self.callback is not None:
            self.callback()

    def wait(self, timeout: float) -> bool:
        """True once answered (then the gate stays open for later calls); ``timeout`` -1:
        until then."""
        if self._gate.acquire(timeout=timeout):
            self._gate.release()
            return True
        return False


class _Item:
    """One step as the next poll of its episode will deliver it."""

    __slots__ = (
        "obs",
        "rewards",
        "infos",
        "terminated",
        "all_term",
        "all_trunc",
        "off_policy",
        "waiter",
    )

    def __init__(
        self,
        obs,
        rewards,
        infos,
        terminated,
        all_term=False,
        all_trunc=False,
        off_policy=None,
        waiter=None,
    ):
        self.obs, self.rewards, self.infos, self.terminated = obs, rewards, infos, terminated
        self.all_term, self.all_trunc, self.off_policy, self.waiter = (
            all_term,
            all_trunc,
            off_policy,
            waiter,
        )

    @property
    def final(self) -> bool:
        """Whether the step ends its episode (terminated or truncated)."""
        return self.all_term or self.all_trunc


class _Episode:
    """One running episode (or an ended one whose final step was not yet polled)."""

    __slots__ = (
        "eid",
        "owner",
        "training_enabled",
        "pending",
        "in_flight",
        "reward",
        "info",
        "seen",
        "done_agents",
        "blocked",
        "newly_done",
        "closed_reason",
        "last_obs",
        "agent_obs",
        "last_activity",
        "waiter",
    )

    def __init__(self, eid: str, training_enabled: bool, owner: Hashable | None, now: float):
        self.eid, self.training_enabled, self.owner = eid, training_enabled, owner
        self.pending: deque[_Item] = deque()
        self.in_flight: _Item | None = None
        self.reward: dict[Any, float] = {}
        self.info: dict[Any, dict] = {}
        self.seen: set = set()  # agents that sent an observation in this episode
        self.done_agents: set = set()
        self.newly_done: set = set()
        self.closed_reason: str | None = None  # set once no client call may follow
        self.last_obs: dict | None = None  # None until the first request: "never used"
        # Each agent's latest observation: an agent that acted and waits for its next one
        # (out of lockstep) gets it again when the episode is cut (abandoned).
        self.agent_obs: dict = {}
        self.last_activity = now  # running time (the book's clock) of its last call
        self.waiter: Waiter | None = None  # the caller blocked in get_action, if any
        self.blocked = 0  # callers waiting in log_action's back pressure


# Finished-episode memory: a keyed 64-bit hash of the id -> state | owner tag, so that an
# entry costs the same few dozen bytes whatever the id's length.
_COMPLETED, _ABANDONED = 1, 2
_STATE_NAMES = {_COMPLETED: "completed", _ABANDONED: "abandoned"}


class _EpisodeBook:
    """The episode table of an external env and its book-keeping (see the module docstring).

    Args:
        max_concurrent_episodes / max_episodes_per_owner / max_finished_ids /
            episode_timeout_s: see :class:`~jaxsampler.host_envs.external.ExternalEnv`
            (checked there).
        clock: the clock of idle times and deadlines; default :func:`process_clock`.
    """

    #: the env's agents (set by the env)
    agent_ids: tuple[Any, ...]

    def __init__(
        self,
        *,
        max_concurrent_episodes: int,
        max_episodes_per_owner: int | None,
        max_finished_ids: int,
        episode_timeout_s: float | None,
        clock: RunningClock | None = None,
    ):
        self.max_concurrent_episodes = int(max_concurrent_episodes)
        self.max_episodes_per_owner = (
            None if max_episodes_per_owner is None else int(max_episodes_per_owner)
        )
        self.max_finished_ids = int(max_finished_ids)
        self.episode_timeout_s = None if episode_timeout_s is None else float(episode_timeout_s)
        #: the clock of ``episode_timeout_s`` and ``action_timeout_s`` (running time: pauses
        #: of the whole process do not count; see :mod:`~jaxsampler.host_envs.external.clock`)
        self.clock = process_clock() if clock is None else clock
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # the poller waits here
        self._room = threading.Condition(self._lock)  # log_action back pressure waits here
        self._episodes: dict[str, _Episode] = {}
        self._by_owner: dict[Hashable, dict[str, None]] = {}  # owner -> its episodes (ordered)
        self._hash_key = secrets.token_bytes(16)  # ids an attacker picks cannot collide
        self._finished: OrderedDict[int, int] = OrderedDict()  # id hash -> state | owner tag
        self._ready: dict[str, None] = {}  # episodes with a deliverable request (ordered, FIFO)
        self._idle: set[str] = set()  # used running episodes a request may still come from
        self._offp_in_flight: set[str] = set()
        self._next_reap = 0.0  # running time of the next episode_timeout_s sweep
        self._closed = False
        self._poller: str | None = (
            None  # what a poll() blocked in _cond waits for: "any" / "all" requests
        )
        self.stats = {"polls": 0, "steps_delivered": 0, "abandoned": 0, "dropped_actions": 0}

    # -- abandonment and queries (public) ------------------------------------------------

    def abandon_episode(
        self,
        episode_id: str,
        reason: str = "abandoned by the caller",
        owner: Hashable | None = None,
    ) -> bool:
        """Ends a running episode as truncated because its client went away (see
        :mod:`jaxsampler.host_envs.external`); a blocked ``get_action`` of it raises.
        Returns whether it abandoned.

        With ``owner=None``, unknown and finished ids are a no-op. With an ``owner``, an
        id that is unknown or belongs to another owner raises :class:`UnknownEpisodeError`;
        the owner's own finished episodes are a no-op."""
        with self._lock:
            ep = self._episodes.get(episode_id)
            if ep is None:
                if owner is not None and not self._finished_by(episode_id, owner):
                    raise UnknownEpisodeError(_not_found(episode_id))
                return False
            if not self._may_use(ep.owner, owner):
                raise UnknownEpisodeError(_not_found(episode_id))
            if ep.closed_reason is None:
                self._abandon(ep, reason)
                return True
            return False

    def abandon_owner(self, owner: Hashable, reason: str = "client gone") -> int:
        """Abandons every running episode of ``owner`` (a client that went away for good)
        and returns how many; their blocked calls raise."""
        if owner is None:
            raise ValueError("abandon_owner needs an owner (None would mean every episode)")
        with self._lock:
            eids = list(self._by_owner.get(owner, ()))
            n = 0
            for eid in eids:
                ep = self._episodes.get(eid)
                if ep is not None and ep.closed_reason is None:
                    self._abandon(ep, reason)
                    n += 1
            return n

    def episode_status(self, episode_id: str) -> str:
        """``"running"``, ``"finishing"`` (ended, final step not yet polled), ``"completed"``,
        ``"abandoned"`` or ``"unknown"``."""
        with self._lock:
            ep = self._episodes.get(episode_id)
            if ep is not None:
                return "running" if ep.closed_reason is None else "finishing"
            entry = self._finished.get(self._id_hash(episode_id))
            return "unknown" if entry is None else _STATE_NAMES[entry & 3]

    def running_episodes(self) -> list[str]:
        """Ids of the running episodes (not ended, not abandoned)."""
        with self._lock:
            return [e for e, ep in self._episodes.items() if ep.closed_reason is None]

    @property
    def open_episodes(self) -> int:
        """Episodes held in memory: running ones and ended ones whose final step was not
        yet polled (what ``max_concurrent_episodes`` bounds)."""
        return len(self._episodes)

    def table_sizes(self) -> dict[str, int]:
        """Sizes of the internal tables (a leak check: with no episode open, all but
        ``finished``, which ``max_finished_ids`` bounds, are 0)."""
        with self._lock:
            return {
                "episodes": len(self._episodes),
                "owners": len(self._by_owner),
                "ready": len(self._ready),
                "idle": len(self._idle),
                "offp_in_flight": len(self._offp_in_flight),
                "finished": len(self._finished),
            }

    # -- internals (called with the lock held unless noted) ------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise EnvClosedError("ExternalEnv was closed")

    @staticmethod
    def _may_use(ep_owner: Hashable | None, owner: Hashable | None) -> bool:
        return owner is None or ep_owner is None or ep_owner == owner

    def _id_hash(self, eid: Any) -> int:  # no lock needed
        """A keyed 64-bit hash of an episode id (the finished memory's key)."""
        if not isinstance(eid, str):
            return -1  # no str id hashes to it: never found
        data = eid.encode("utf-8", "surrogatepass")
        return int.from_bytes(hashlib.blake2b(data, digest_size=8, key=self._hash_key).digest())

    def _finished_state(self, eid: Any, owner: Hashable | None) -> str | None:
        """The finished state of ``eid`` as ``owner`` may see it (None: unknown to it)."""
        entry = self._finished.get(self._id_hash(eid))
        if entry is None:
            return None
        tag = entry >> 2
        if owner is not None and tag and tag != _owner_tag(owner):
            return None
        return _STATE_NAMES[entry & 3]

    def _finished_by(self, eid: Any, owner: Hashable) -> bool:
        return self._finished_state(eid, owner) is not None

    def _quota_error(self, owner: Hashable | None) -> CapacityError | None:
        """The error a start by ``owner`` gets now, if any."""
        if len(self._episodes) >= self.max_concurrent_episodes:
            return CapacityError(
                f"{len(self._episodes)} episodes are running; max_concurrent_episodes="
                f"{self.max_concurrent_episodes} allowed (end or abandon some first)"
            )
        limit = self.max_episodes_per_owner
        if owner is not None and limit is not None:
            n = len(self._by_owner.get(owner, ()))
            if n >= limit:
                return CapacityError(
                    f"this client runs {n} episodes; max_episodes_per_owner={limit} allowed "
                    "(end or abandon some first)"
                )
        return None

    def _open_episode(self, eid: str, owner: Hashable | None = None) -> _Episode:
        self._check_open()
        ep = self._episodes.get(eid)
        if ep is None or (owner is not None and ep.owner is not None and ep.owner != owner):
            state = None if ep is not None else self._finished_state(eid, owner)
            if state == "completed":
                raise EpisodeStateError(f"Episode {_short_id(eid)} has already completed.")
            if state == "abandoned":
                raise EpisodeStateError(
                    f"Episode {_short_id(eid)} was abandoned (client timeout or disconnect)."
                )
            raise UnknownEpisodeError(_not_found(eid))
        if ep.closed_reason == "completed":
            raise EpisodeStateError(f"Episode {eid} has already completed.")
        if ep.closed_reason is not None:
            raise EpisodeStateError(f"Episode {eid} was abandoned ({ep.closed_reason}).")
        if ep.waiter is not None:
            raise EpisodeStateError(
                f"Episode {eid}: a get_action call is still waiting for its action."
            )
        return ep

    def _check_done_agents(self, ep: _Episode, obs: dict, final: bool = False) -> None:
        if not (ep.done_agents or ep.newly_done):
            return
        again = [a for a in obs if a in ep.done_agents]
        if again:
            raise InvalidDataError(
                f"episode {ep.eid}: agents {again} are done and cannot observe again"
            )
        missing = [a for a in ep.newly_done if a not in obs]
        if missing and not final:
            raise InvalidDataError(
                f"episode {ep.eid}: agents {missing} were marked done; their final "
                "observations must be in this observation dict"
            )

    def _make_item(
        self,
        ep: _Episode,
        obs: dict,
        off_policy: dict | None = None,
        waiter: Waiter | None = None,
        final: bool = False,
    ) -> _Item:
        rewards = dict.fromkeys(obs, 0.0)
        if ep.reward:
            rewards.update(ep.reward)
            ep.reward = {}
        if ep.info:
            infos = {a: ep.info.pop(a, {}) for a in obs}
        else:
            infos = {a: {} for a in obs}
        if not ep.training_enabled:
            infos = {a: {**i, "training_enabled": False} for a, i in infos.items()}
        if ep.newly_done:
            terminated = {a: (a in ep.newly_done) for a in obs}
            ep.done_agents |= ep.newly_done
            ep.newly_done = set()
        else:
            terminated = dict.fromkeys(obs, False)
        if len(ep.seen) < len(self.agent_ids):
            ep.seen.update(obs)
        ep.last_obs = obs
        ep.agent_obs.update(obs)
        return _Item(obs, rewards, infos, terminated, off_policy=off_policy, waiter=waiter)

    def _push(self, ep: _Episode, item: _Item) -> None:
        ep.pending.append(item)
        ep.last_activity = self.clock.now()
        if ep.in_flight is None:  # what _refresh does for an episode with a pending item
            self._ready[ep.eid] = None
        self._idle.discard(ep.eid)
        # Wake the poller only when it can act: it waits for any request, or for the last
        # running episode to send one (a wake-up per request costs two thread switches).
        if self._poller == "any" or (self._poller == "all" and not self._idle):
            self._cond.notify()

    def _refresh(self, ep: _Episode) -> None:
        eid = ep.eid
        if ep.in_flight is None and ep.pending:
            self._ready[eid] = None
        else:
            self._ready.pop(eid, None)
        # Idle: poll's batching wait expects a request from it. An episode that never sent
        # one may never do so (its client may be gone): it is not waited for.
        if (
            ep.in_flight is None
            and not ep.pending
            and ep.closed_reason is None
            and ep.last_obs is not None
        ):
            self._idle.add(eid)
        else:
            self._idle.discard(eid)

    def _deliver(self) -> PollResult:
        obs: MultiEnvDict = {}
        rew: MultiEnvDict = {}
        term: MultiEnvDict = {}
        trunc: MultiEnvDict = {}
        infos: MultiEnvDict = {}
        offp: MultiEnvDict = {}
        ready, self._ready = list(self._ready), {}
        episodes = self._episodes
        for eid in ready:
            ep = episodes[eid]
            item = ep.pending.popleft()
            obs[eid], rew[eid], infos[eid] = item.obs, item.rewards, item.infos
            flags = dict(item.terminated)
            flags[ALL_AGENTS] = item.all_term
            term[eid] = flags
            if item.all_trunc:  # an agent that terminated in this step is not truncated
                flags = {a: not t for a, t in item.terminated.items()}
            else:
                flags = dict.fromkeys(item.obs, False)
            flags[ALL_AGENTS] = item.all_trunc
            trunc[eid] = flags
            if item.off_policy is not None:
                offp[eid] = item.off_policy
            if item.final:
                self._drop(ep, _COMPLETED if ep.closed_reason == "completed" else _ABANDONED)
                continue
            if all(item.terminated.values()):  # every observing agent is done: nothing to answer
                if item.waiter is not None:
                    ep.waiter, item.waiter.value = None, {}
                    item.waiter.set()
                self._refresh(ep)
            else:  # in flight until answered: neither ready nor idle (it had a pending item)
                ep.in_flight = item
                if item.waiter is None:
                    self._offp_in_flight.add(eid)
        self.stats["polls"] += 1
        self.stats["steps_delivered"] += len(ready)
        if ready:
            self._room.notify_all()
        return PollResult(obs, rew, term, trunc, infos, offp)

    def _drop(self, ep: _Episode, state: int) -> None:
        """Forgets a finished episode: all that stays is its finished-memory entry."""
        eid = ep.eid
        del self._episodes[eid]
        self._idle.discard(eid)
        self._ready.pop(eid, None)
        self._offp_in_flight.discard(eid)
        if ep.owner is not None:
            mine = self._by_owner[ep.owner]
            del mine[eid]
            if not mine:
                del self._by_owner[ep.owner]
        tag = 0 if ep.owner is None else _owner_tag(ep.owner)
        self._finished[self._id_hash(eid)] = tag << 2 | state
        while len(self._finished) > self.max_finished_ids:
            self._finished.popitem(last=False)

    def _abandon(self, ep: _Episode, reason: str) -> None:
        ep.closed_reason = reason
        self.stats["abandoned"] += 1
        w = ep.waiter
        if w is not None:
            ep.waiter = None
            if not w.done:
                w.error = EpisodeStateError(f"Episode {ep.eid} was abandoned ({reason}).")
                w.set()
        last = ep.pending[-1] if ep.pending else None
        if last is not None and last.waiter is not None:
            # The request was never polled: it becomes the (exact) final observation.
            last.waiter, last.all_trunc = None, True
            for a, r in ep.reward.items():  # none can be logged while a get_action waits
                last.rewards[a] = last.rewards.get(a, 0.0) + r
            ep.reward = {}
            for a, o in self._waiting_agents(ep, last.obs).items():
                last.obs[a], last.terminated[a] = o, False
                last.rewards.setdefault(a, 0.0)
                info = ep.info.pop(a, {})  # logged for it since its last observation
                if not ep.training_enabled:
                    info = {**info, "training_enabled": False}
                last.infos[a] = info
            for a in last.infos:
                last.infos[a] = {**last.infos[a], "abandoned": True}
        elif ep.last_obs is not None:
            # Repeat the last observation of every agent still in the episode: those of
            # the last step and those waiting since an earlier one (an agent whose final
            # observation was already delivered must not observe again).
            item = self._make_item(ep, self._waiting_agents(ep, {}))
            item.all_trunc = True
            item.terminated = {a: False for a in item.obs}
            for a in item.infos:
                item.infos[a] = {**item.infos[a], "abandoned": True}
            ep.pending.append(item)
        else:  # nothing was ever sent: the sampler never heard of it
            self._drop(ep, _ABANDONED)
        if ep.eid in self._episodes:
            self._refresh(ep)
        self._cond.notify()
        self._room.notify_all()

    def _waiting_agents(self, ep: _Episode, obs: dict) -> dict:
        """The latest observation of each agent (in agent order) that observed in ``ep``, is
        not done and has none in ``obs``: it acted and waits for its next observation,
        which a truncated end must give it (RLlib bootstraps from it). An agent marked done
        whose final observation has not come yet is waiting too."""
        done = ep.done_agents
        return {
            a: ep.agent_obs[a]
            for a in self.agent_ids
            if a in ep.agent_obs and a not in done and a not in obs
        }

    def _reap_idle(self) -> None:
        """Abandons episodes with no call for ``episode_timeout_s`` of running time (not
        those with a caller blocked in the env). A sweep visits every episode, so it runs at
        most four times per timeout and at most once a second (``poll`` and a refused start
        call it). After a pause of the process (see :attr:`clock`) it waits until the process
        ran for :func:`_reap_settle_s` again, so that requests which arrived during the pause
        are read (and count as calls) before anyone is blamed for silence."""
        timeout = self.episode_timeout_s
        if timeout is None:
            return
        clock = self.clock
        clock.tick()  # a pause not yet seen by the heartbeat is seen here
        now = clock.now()
        if now < self._next_reap or clock.steady_for() < _reap_settle_s(clock):
            return
        self._next_reap = now + min(1.0, timeout / 4)
        for ep in _idle_episodes(self._episodes.values(), now - timeout):
            self._abandon(ep, f"no call for {timeout} s")


def _reap_settle_s(clock: RunningClock) -> float:
    """Running seconds the reaper waits after a detected pause before it sweeps: twice the
    clock's ``max_gap_s`` (the event loop reads the sockets that filled meanwhile first)."""
    return 2 * clock.max_gap_s


def _idle_episodes(episodes: Iterable[_Episode], limit: float) -> list[_Episode]:
    """The running episodes whose last call was before ``limit`` (running time) and that
    nobody waits in: no blocked ``get_action``, no caller held by back pressure."""
    return [
        ep
        for ep in episodes
        if ep.closed_reason is None
        and ep.waiter is None
        and not ep.blocked
        and ep.last_activity < limit
    ]


def _owner_tag(owner: Hashable) -> int:
    """An owner's tag in the finished memory: its 64-bit hash with bit 64 set, so never
    0 (which means "no owner")."""
    return (hash(owner) & 0xFFFF_FFFF_FFFF_FFFF) | 1 << 64
