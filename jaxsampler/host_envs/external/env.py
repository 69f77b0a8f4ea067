"""The external env classes: :class:`ExternalEnvBase` (the simulator's calls, the sampler's
``poll`` / ``send_actions``) and its single- and multi-agent faces, :class:`ExternalEnv` and
:class:`ExternalMultiAgentEnv`. The package docstring (:mod:`jaxsampler.host_envs.external`)
describes how they behave."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from jaxsampler.constants import ALL_AGENTS, DEFAULT_AGENT_ID
from jaxsampler.episodes.ids import random_episode_id
from jaxsampler.host_envs.base import HostEnv, MultiEnvDict, PollResult
from jaxsampler.host_envs.external.checks import (
    MAX_REWARD,
    AgentChecks,
    _check_option,
    agent_space_table,
)
from jaxsampler.host_envs.external.clock import RunningClock
from jaxsampler.host_envs.external.episodes import Waiter, _Episode, _EpisodeBook
from jaxsampler.host_envs.external.errors import (
    EnvClosedError,
    EpisodeStateError,
    InvalidDataError,
    UnknownEpisodeError,
    WouldBlockError,
    _not_found,
    _short,
    _short_id,
)
from jaxsampler.host_envs.external.journaling import Journal, _Journaled
from jaxsampler.spaces import Space

__all__ = ["CLIENT_POLICY_INFO", "ExternalEnv", "ExternalEnvBase", "ExternalMultiAgentEnv"]

#: Info key of steps whose action a client computed with the served policy (local mode).
CLIENT_POLICY_INFO = "client_policy"


class ExternalEnvBase(_Journaled, _EpisodeBook, HostEnv):
    """Shared machinery of :class:`ExternalEnv` and :class:`ExternalMultiAgentEnv`, which
    differ only in how they wrap agent dicts. Its agent-dict methods (:meth:`submit`,
    :meth:`expire_waiter`, :meth:`log_agent_returns`, :meth:`end_agent_episode`) are what
    the policy server calls; they and :meth:`start_episode` / :meth:`abandon_episode`
    take an ``owner`` (any hashable, e.g. a client's identity): an episode started with
    an owner is invisible to callers that pass another owner (they get the same
    :class:`UnknownEpisodeError` as for an unknown id); ``owner=None`` (in-process
    callers) may use every episode. See :class:`ExternalEnv` for the options.

    The episode table, quotas, finished ids, abandonment and reaping are its base's
    (:class:`~jaxsampler.host_envs.external.episodes._EpisodeBook`, which also owns the one
    lock); this class adds the simulator's calls and the sampler's (``poll`` /
    ``send_actions``)."""

    #: whether the public methods take agent dicts (``ExternalMultiAgentEnv``)
    multi_agent = False
    #: episodes of clients that vanish end truncated with ``{"abandoned": True}``
    abandons_episodes = True

    def __init__(
        self,
        observation_space: Space | Mapping[Any, Space],
        action_space: Space | Mapping[Any, Space],
        agent_ids: tuple,
        *,
        max_wait_s: float = 0.002,
        action_timeout_s: float = 300.0,
        episode_timeout_s: float | None = 600.0,
        max_concurrent_episodes: int = 4096,
        max_episodes_per_owner: int | None = 1024,
        max_episode_id_len: int = 128,
        max_queued_steps: int = 256,
        max_finished_ids: int = 100_000,
        journal: Journal | None = None,
        defer_returns: bool = False,
        clock: RunningClock | None = None,
    ):
        _check_option("max_wait_s", max_wait_s, 0.0)
        _check_option("action_timeout_s", action_timeout_s, 0.0, strict=True)
        if episode_timeout_s is not None:
            _check_option("episode_timeout_s", episode_timeout_s, 0.0, strict=True)
        for name, value in (
            ("max_concurrent_episodes", max_concurrent_episodes),
            ("max_episode_id_len", max_episode_id_len),
            ("max_queued_steps", max_queued_steps),
            ("max_finished_ids", max_finished_ids),
        ) + (
            (("max_episodes_per_owner", max_episodes_per_owner),)
            if max_episodes_per_owner is not None
            else ()
        ):
            _check_option(name, value, 1, integer=True)
        self.agent_ids = tuple(agent_ids)
        self.observation_space, self.observation_spaces, obs_table = agent_space_table(
            observation_space, self.agent_ids, "observation_space", self.multi_agent
        )
        self.action_space, self.action_spaces, act_table = agent_space_table(
            action_space, self.agent_ids, "action_space", self.multi_agent
        )
        self._checks = AgentChecks(obs_table, act_table, self.agent_ids)
        super().__init__(
            max_concurrent_episodes=max_concurrent_episodes,
            max_episodes_per_owner=max_episodes_per_owner,
            max_finished_ids=max_finished_ids,
            episode_timeout_s=episode_timeout_s,
            clock=clock,
        )
        self.max_wait_s, self.action_timeout_s = float(max_wait_s), float(action_timeout_s)
        self.max_queued_steps = int(max_queued_steps)
        self.max_episode_id_len = int(max_episode_id_len)
        #: the HostEnv's sub-env count: an upper bound on concurrently running episodes
        self.num_envs = self.max_concurrent_episodes
        self._thread: threading.Thread | None = None
        self.journal = journal
        self.defer_returns = bool(defer_returns)
        #: a sampler names its episodes by this env's episode ids (so a journal's entries
        #: and the sampler's output name the same episodes); see ``journal``
        self.names_episodes = journal is not None
        self._journal_error: BaseException | None = None
        self._deferral = threading.local()  # see commits_deferred
        self._poll_thread: int | None = None  # the thread of the last poll

    # -- user loop (RLlib style) ---------------------------------------------------------

    def run(self) -> None:
        """Override with the simulator loop (start_episode -> get_action/log_action ->
        log_returns -> end_episode); :meth:`start` runs it in a daemon thread."""
        raise NotImplementedError(
            "subclass ExternalEnv and override run(), or call its methods from your threads"
        )

    def start(self) -> threading.Thread:
        """Runs :meth:`run` in a daemon thread (once) and returns the thread."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self.run, name=f"{type(self).__name__}.run", daemon=True
            )
            self._thread.start()
        return self._thread

    # -- simulator side ------------------------------------------------------------------

    def start_episode(
        self,
        episode_id: str | None = None,
        training_enabled: bool = True,
        *,
        owner: Hashable | None = None,
        allow_reuse: bool = False,
    ) -> str:
        """Registers a new episode and returns its id.

        Args:
            episode_id: a non-empty str of at most ``max_episode_id_len`` characters, or
                ``None`` for a fresh random one (``uuid4().hex``, from ``os.urandom``).
            training_enabled: ``False`` marks the episode's steps ``training_enabled:
                False`` in their infos.
            owner: who may use the episode (see the class docstring); counts against
                ``max_episodes_per_owner``.
            allow_reuse: start ``episode_id`` again although an episode of that id finished
                (completed or abandoned) in this run. Never with a ``journal``: its ids name
                one episode each (recovery finds the steps it stored by id), so a finished
                or journal-known id stays refused.

        Raises:
            InvalidDataError: a bad id. EpisodeStateError: the id is running, or finished
                (without ``allow_reuse``), or known to the journal.
            CapacityError: ``max_concurrent_episodes`` episodes run, or ``owner`` has
                ``max_episodes_per_owner``, even after abandoning timed-out episodes.
        """
        eid = random_episode_id() if episode_id is None else episode_id
        if not isinstance(eid, str) or not eid:
            raise InvalidDataError(f"episode_id must be a non-empty str, got {_short(eid)}")
        if len(eid) > self.max_episode_id_len:
            raise InvalidDataError(
                f"episode_id has {len(eid)} characters; at most {self.max_episode_id_len} "
                f"(max_episode_id_len) are allowed, got {_short(eid)}"
            )
        key = self._id_hash(eid)
        with self._lock:
            self._check_open()
            if eid in self._episodes:
                raise EpisodeStateError(f"Episode {eid} has already been started.")
            journaled = self.journal is not None
            if key in self._finished and (journaled or not allow_reuse):
                raise EpisodeStateError(
                    f"Episode {eid} has already completed"
                    + (
                        "; a journaled env never reuses an id (recovery finds steps by id)."
                        if journaled
                        else " (allow_reuse=True starts it again)."
                    )
                )
            if self.journal is not None and self.journal.known(eid):
                raise EpisodeStateError(
                    f"Episode {eid} ran before the server restarted; start a new episode"
                    + (
                        " (a journaled env never reuses an id: recovery finds steps by id)."
                        if allow_reuse
                        else "."
                    )
                )
            if self._quota_error(owner) is not None:
                self._reap_idle()  # a vanished client's episodes may be due (no poller needed)
                error = self._quota_error(owner)
                if error is not None:
                    raise error
            self._log({"op": "start", "e": eid, "training": bool(training_enabled)})
            ep = _Episode(eid, bool(training_enabled), owner, self.clock.now())
            self._episodes[eid] = ep
            if owner is not None:
                self._by_owner.setdefault(owner, {})[eid] = None
            self._refresh(ep)
        self._commit()
        return eid

    def _get_action(
        self,
        episode_id: str,
        obs: dict,
        *,
        timeout: float | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> dict:
        waiter = self.submit(episode_id, obs, None, None, want_action=True)
        assert waiter is not None  # a request that wants an action always has a waiter
        return self._wait(
            episode_id, waiter, self.action_timeout_s if timeout is None else timeout, cancelled
        )

    def submit(
        self,
        episode_id: str,
        obs: dict,
        action: dict | None,
        extra_infos: dict | None,
        want_action: bool,
        *,
        block: bool = True,
        on_answer: Callable[[], None] | None = None,
        owner: Hashable | None = None,
    ) -> Waiter | None:
        """Queues one request. ``block=False``: raise :class:`WouldBlockError` instead of
        waiting under back pressure. ``on_answer``: the waiter's callback (see
        :class:`Waiter`), set before the request becomes visible to the poller.
        ``owner``: see the class docstring."""
        obs = self._checks.obs(obs)
        if extra_infos is not None and (
            not isinstance(extra_infos, Mapping)
            or not set(extra_infos) <= set(obs)
            or not all(isinstance(v, Mapping) for v in extra_infos.values())
        ):
            raise InvalidDataError(
                f"info must be a dict agent -> dict for observing agents, got {_short(extra_infos)}"
            )
        entry: dict[str, Any] = {
            "op": "submit",
            "e": episode_id,
            "obs": obs,
            "action": None,
            "info": extra_infos,
            "want": bool(want_action),
        }
        pre = None if action is not None or self.journal is None else self._encoded(entry)
        with self._lock:
            ep = self._open_episode(episode_id, owner)
            self._check_done_agents(ep, obs)
            if action is not None:  # agents whose final observation this is need no action
                action = self._checks.actions(action, [a for a in obs if a not in ep.newly_done])
                # back pressure: the simulator may run ahead of the sampler only so far
                deadline = self.clock.now() + self.action_timeout_s
                while (
                    len(ep.pending) >= self.max_queued_steps
                    and not self._closed
                    and ep.closed_reason is None
                ):
                    if not block:
                        raise WouldBlockError(
                            f"episode {_short_id(episode_id)}: {len(ep.pending)} logged steps "
                            "wait to be polled"
                        )
                    left = deadline - self.clock.now()
                    if left <= 0:
                        why = (
                            f"{len(ep.pending)} logged steps not polled within "
                            f"{self.action_timeout_s} s"
                        )
                        self._abandon(ep, why)
                        raise TimeoutError(
                            f"episode {_short_id(episode_id)}: {why}; episode abandoned"
                        )
                    ep.blocked += 1  # a caller waiting here is not idle (episode_timeout_s)
                    try:
                        self._room.wait(left)
                    finally:
                        ep.blocked -= 1
                self._check_open()
                ep = self._open_episode(episode_id, owner)
            if action is not None:  # checked under the lock: encoded here
                entry["action"] = action
            self._log(entry, pre)
            waiter = Waiter(on_answer) if want_action else None
            item = self._make_item(ep, obs, off_policy=action, waiter=waiter)
            if extra_infos:
                for agent, extra in extra_infos.items():
                    item.infos[agent] = {**item.infos[agent], **extra}
            if want_action:
                ep.waiter = waiter
            self._push(ep, item)
        if not want_action:  # a get_action's step is acknowledged by its answer, which
            self._commit()  # send_actions commits (with this entry) before delivering it
        return waiter

    def _wait(
        self, episode_id: str, waiter: Waiter, timeout: float, cancelled: Callable[[], bool] | None
    ) -> dict:
        clock = self.clock  # a pause of the process does not count (see _EpisodeBook.clock)
        deadline = clock.now() + timeout
        while True:
            left = deadline - clock.now()
            step = left if cancelled is None else min(left, 0.1)
            if step > 0 and waiter.wait(step):
                break
            gone = cancelled is not None and cancelled()
            if left <= 0 or gone:
                why = "client disconnected" if gone else f"get_action timed out after {timeout} s"
                if not self.expire_waiter(episode_id, waiter, why):
                    waiter.wait(-1)  # answered meanwhile: woken once the answer is durable
                    break
                if gone:
                    raise ConnectionAbortedError(f"episode {episode_id}: {why}")
                raise TimeoutError(
                    f"episode {episode_id}: no action within {timeout} s; episode abandoned"
                )
        if waiter.error is not None:
            raise waiter.error
        return waiter.value

    def expire_waiter(
        self, episode_id: str, waiter: Waiter, why: str, owner: Hashable | None = None
    ) -> bool:
        """Gives up a waiting ``get_action`` (timeout, client gone): abandons its episode
        unless the answer came first. Returns whether it abandoned. ``owner``: see the
        class docstring (the waiter itself already identifies the call)."""
        with self._lock:
            if waiter.done:
                return False
            ep = self._episodes.get(episode_id)
            if ep is not None and not self._may_use(ep.owner, owner):
                raise UnknownEpisodeError(_not_found(episode_id))
            if ep is not None and ep.waiter is waiter:
                self._abandon(ep, why)
            else:  # not the episode's waiter any more (closed env): fail just this call
                waiter.error = EpisodeStateError(f"Episode {_short_id(episode_id)}: {why}.")
                waiter.set()
            return True

    def log_agent_returns(
        self,
        episode_id: str,
        rewards: Mapping,
        infos: Mapping | None,
        dones: Mapping | None,
        *,
        owner: Hashable | None = None,
        commit: bool = True,
    ) -> None:
        """``log_returns`` with agent dicts (what both public classes and the policy
        server call): rewards are checked and summed into each agent's pending reward.
        ``commit=False``: return without committing the journal (``defer_returns``).

        Raises :class:`InvalidDataError` (and changes nothing) for non-dict arguments,
        unknown agents, rewards that are not finite float32-range numbers or whose sum
        since the last step would leave that range, done flags that are not bools and,
        in the multi-agent env, rewards or done flags for agents that have not observed
        yet in this episode (such a reward would belong to no step);
        :class:`EpisodeStateError` for agents that are already done."""
        checked, newly_done = self._checks.returns(rewards, infos, dones)
        with self._lock:  # everything is checked before anything changes
            ep = self._open_episode(episode_id, owner)
            if ep.done_agents:
                touched = [*checked, *(infos or ()), *(newly_done or ())]
                done = [a for a in touched if a in ep.done_agents]
                if done:
                    raise EpisodeStateError(
                        f"episode {_short_id(episode_id)}: agents {done} are already done"
                    )
            if self.multi_agent:
                unseen = [a for a in [*checked, *(newly_done or ())] if a not in ep.seen]
                if unseen:
                    raise InvalidDataError(
                        f"episode {_short_id(episode_id)}: agents {sorted(map(str, unseen))} "
                        "have not observed yet in this episode; a reward or done flag for them "
                        "would belong to no step (send their first observation first)"
                    )
            acc = ep.reward
            sums = {a: acc.get(a, 0.0) + r for a, r in checked.items()} if acc else checked
            for a, total in sums.items():
                if not abs(total) <= MAX_REWARD:
                    raise InvalidDataError(
                        f"reward[{_short(a)}]: the rewards logged since the agent's last "
                        f"step would sum to {total}, outside float32 range "
                        f"(abs <= {MAX_REWARD:.4g}); the sum so far is kept"
                    )
            self._log(
                {
                    "op": "returns",
                    "e": episode_id,
                    "reward": checked,
                    "info": infos,
                    "done": None if newly_done is None else dict.fromkeys(newly_done, True),
                }
            )
            if acc:
                acc.update(sums)
            else:  # each value is in range (check_reward): so is the sum
                ep.reward = checked
            if infos:
                for a, i in infos.items():
                    ep.info[a] = dict(i)
            if newly_done:
                ep.newly_done |= newly_done
            ep.last_activity = self.clock.now()
        if commit:
            self._commit()

    def end_agent_episode(
        self,
        episode_id: str,
        obs: dict,
        truncated: bool,
        *,
        owner: Hashable | None = None,
        complete_waiting: bool = False,
    ) -> None:
        """``end_episode`` with an agent dict of final observations (what both public
        classes and the policy server call). ``complete_waiting``: a truncated end that
        leaves out an agent waiting for its next observation gives it its latest one again
        instead of being refused (the journal's replay of a journal written before the
        refusal existed)."""
        obs = self._checks.obs(obs, allow_empty=self.multi_agent)
        with self._lock:
            ep = self._open_episode(episode_id, owner)
            self._check_done_agents(ep, obs, final=True)
            waiting = self._waiting_agents(ep, obs) if truncated else {}
            if waiting and complete_waiting:
                obs, waiting = {**obs, **waiting}, {}
            if waiting:
                raise InvalidDataError(
                    f"episode {episode_id}: agents {list(waiting)} acted and wait for their "
                    "next observation; a truncated end_episode needs their final "
                    "observations too (RLlib bootstraps each agent from its own)"
                )
            self._log({"op": "end", "e": episode_id, "obs": obs, "truncated": bool(truncated)})
            item = self._make_item(ep, obs, final=True)
            if truncated:
                item.all_trunc = True
            else:
                item.all_term = True
                item.terminated = {a: True for a in obs}
            ep.closed_reason = "completed"
            self._push(ep, item)
        self._commit()

    # -- sampler side (HostEnv) ------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> PollResult:
        """Blocks until a request is ready (or ``timeout`` s pass, or the env is closed:
        then every dict is empty), waits up to ``max_wait_s`` for more, returns them all.
        The wait for more ends early once every used running episode has a request
        waiting (episodes that never sent a request are not waited for)."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._poll_thread = threading.get_ident()  # see checkpoint_journal
            self._settle_off_policy()
            self._reap_idle()
            while not self._ready and not self._closed:
                wait = None if end is None else end - time.monotonic()
                if wait is not None and wait <= 0:
                    break
                if self.episode_timeout_s is not None:
                    wait = min(wait if wait is not None else 1.0, 1.0)
                self._poller = "any"
                self._cond.wait(wait)
                self._poller = None
                self._reap_idle()
            if self._ready and self.max_wait_s > 0:
                batch_end = time.monotonic() + self.max_wait_s
                while self._idle and not self._closed:
                    left = batch_end - time.monotonic()
                    if left <= 0:
                        break
                    self._poller = "all"
                    self._cond.wait(left)
                    self._poller = None
            if self._ready and self.journal is not None:
                self._log({"op": "poll", "ready": list(self._ready)})
            return self._deliver()

    def _settle_off_policy(self) -> None:
        """At a poll: the ``log_action`` steps of the last poll count as answered (the
        sampler had its chance to answer them)."""
        if not self._offp_in_flight:
            return
        self._log({"op": "settle"})
        for eid in self._offp_in_flight:
            ep = self._episodes.get(eid)
            if ep is not None and ep.in_flight is not None and ep.in_flight.waiter is None:
                ep.in_flight = None
                self._refresh(ep)
        self._offp_in_flight.clear()

    def send_actions(self, actions: MultiEnvDict) -> None:
        """Answers the episodes of the last poll; unknown or unexpected env ids are counted in
        ``stats["dropped_actions"]`` and ignored (an abandoned episode's answer, say). The
        answer to a ``log_action`` step is ignored and may be left out: the next ``poll``
        treats such steps as answered. So is (and counted as dropped) the answer to a
        ``get_action`` given up while the sampler held it (timed out, or its client gone):
        that call was already answered with its error. An answered ``get_action`` restarts
        its episode's ``episode_timeout_s``."""
        journaled = self.journal is not None
        woken: list[Waiter] = []
        entry = {"op": "answer", "actions": dict(actions)}
        pre = self._encoded(entry) if journaled else None  # outside the lock
        with self._lock:
            if journaled:
                self._log(entry, pre)
            now = self.clock.now()
            for eid, acts in actions.items():
                ep = self._episodes.get(eid)
                if ep is None or ep.in_flight is None:
                    self.stats["dropped_actions"] += 1
                    continue
                item, ep.in_flight = ep.in_flight, None
                self._offp_in_flight.discard(eid)
                w = item.waiter
                if w is not None and w.done:  # given up while in flight (timeout, client
                    self.stats["dropped_actions"] += 1  # gone): answered with its error
                    w = None
                if w is not None:
                    ep.waiter = None
                    ep.last_activity = now
                    want = [a for a in item.obs if not item.terminated.get(a, False)]
                    missing = [a for a in want if a not in acts]
                    if missing:
                        w.error = RuntimeError(
                            f"episode {eid}: the sampler sent no action for agents {missing}"
                        )
                    else:
                        w.value = {a: acts[a] for a in want}
                    if journaled:  # woken once the answers are durable, outside the lock
                        w.claim()
                        woken.append(w)
                    else:
                        w.set()
                self._refresh(ep)
        if journaled:
            self._wake_durable(woken)

    def _wake_durable(self, woken: list[Waiter]) -> None:
        """Commits the journal (the answers are acknowledgements: durable first), then wakes
        their callers; outside the lock, so that clients record meanwhile and share the
        write. A failed commit closes the env, fails each of them instead and raises."""
        try:
            self._commit_now("the answers were not delivered")
        except EnvClosedError as e:
            for w in woken:
                w.value, w.error = None, e
                w.open()
            raise
        for w in woken:
            w.open()

    def _abandon(self, ep: _Episode, reason: str) -> None:
        self._log({"op": "abandon", "e": ep.eid, "reason": reason})
        super()._abandon(ep, reason)

    def _check_open(self) -> None:
        if self._closed and self._journal_error is not None:
            raise EnvClosedError(f"ExternalEnv closed: its journal failed ({self._journal_error})")
        super()._check_open()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """Fails every blocked caller with :class:`EnvClosedError` and wakes the poller.
        Idempotent."""
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if self._closed:
            return
        self._closed = True
        why = "ExternalEnv was closed"
        if self._journal_error is not None:
            why = f"ExternalEnv closed: its journal failed ({self._journal_error})"
        for ep in self._episodes.values():
            if ep.waiter is not None:
                ep.waiter.error = EnvClosedError(why)
                ep.waiter.set()
        self._cond.notify_all()
        self._room.notify_all()


class ExternalEnv(ExternalEnvBase):
    """A single-agent external env (agent id :data:`~jaxsampler.constants.DEFAULT_AGENT_ID`).

    Args:
        observation_space / action_space: jaxsampler spaces; observations are validated
            and cast to ``observation_space.dtype`` in the caller's thread.
        max_wait_s: after the first ready request, how long ``poll`` waits for more.
        action_timeout_s: how long ``get_action`` (and ``log_action`` under back pressure)
            waits; on timeout the episode is abandoned and ``TimeoutError`` is raised.
        episode_timeout_s: an episode with no simulator call for this long (600 s by
            default; ``None``: never) is abandoned (ends truncated, see the module
            docstring); a caller blocked in the env does not count as silent, and an
            answered ``get_action`` restarts the clock. This is also the lease of a client
            that vanished without a word (a crashed local-inference
            :class:`~jaxsampler.serving.client.PolicyClient`, say): its episodes free
            their slots after at most this long (plus up to 1 s, the sweep interval).
            Sweeps run in ``poll`` and in a ``start_episode`` that would be refused.
            Both timeouts count running time (``clock``): while the whole process does
            not run (``SIGSTOP``, a paused VM), no client is timed out, and after such a
            pause the sweep waits 2 s of running time, so that requests which arrived
            meanwhile are read first.
        max_concurrent_episodes: running episodes (and ended ones whose final step was
            not yet polled); ``start_episode`` beyond this raises ``CapacityError``. Also
            ``num_envs``.
        max_episodes_per_owner: the same bound per ``owner`` (1024 by default; ``None``:
            none), so that one client cannot take every slot; episodes started without an
            owner do not count.
        max_episode_id_len: longest accepted episode id (128 characters;
            ``InvalidDataError`` beyond).
        max_queued_steps: logged steps of one episode waiting to be polled before
            ``log_action`` blocks.
        max_finished_ids: finished episodes remembered (for the "already completed"
            error and :meth:`episode_status`), oldest forgotten first; an entry is a keyed
            64-bit hash of the id, about 180 bytes whatever the id's length (100,000:
            about 18 MB).
        journal: a write-ahead :class:`Journal` (:class:`~jaxsampler.offline.StepJournal`):
            each change is written to it before it takes effect, so every acknowledged
            step can be recovered after a crash (:func:`~jaxsampler.offline.recover`); ids
            the journal knows from an earlier run are refused by ``start_episode``, and a
            sampler names episodes by this env's ids (``names_episodes``). A failed journal
            write closes the env: the call raises :class:`EnvClosedError` and its change is
            not made. ``None`` (default): no journal.
        defer_returns: with a journal, an in-process ``log_returns`` returns without
            writing: its entry goes out with the next commit, at the latest the one
            before the episode's next answer or acknowledged call, so a killed process
            loses at most the rewards logged since then (which its simulator threads,
            dying with it, saw acknowledged); it saves a write per reward, and each write
            hands the GIL to another thread. ``False`` (default): each returns only once
            its entry is written. A policy server's requests commit before their answer
            either way.
        clock: the :class:`~jaxsampler.host_envs.external.clock.RunningClock` of both
            timeouts; default the process's one (ticked by a heartbeat thread, see
            :func:`~jaxsampler.host_envs.external.clock.process_clock`). A fake one in tests.

    Rewards must be numbers with ``abs(r) <= MAX_REWARD`` (the float32 maximum), and so
    must their sum over one step: a call that would break that raises
    ``InvalidDataError`` and changes nothing. All simulator-side methods are
    thread-safe; errors are raised in the calling thread and leave every other episode
    untouched. Once an episode's final step is polled, nothing of it is kept but its
    finished-memory entry.
    """

    def __init__(self, observation_space: Space, action_space: Space, **kwargs: Any):
        super().__init__(observation_space, action_space, (DEFAULT_AGENT_ID,), **kwargs)

    def get_action(self, episode_id: str, observation: Any) -> Any:
        """Queues ``observation`` (plus the rewards logged since the last step) and blocks
        until the sampler answers; returns the action."""
        return self._get_action(episode_id, {DEFAULT_AGENT_ID: observation})[DEFAULT_AGENT_ID]

    def log_action(
        self, episode_id: str, observation: Any, action: Any, *, info: dict | None = None
    ) -> None:
        """Records a step whose action the simulator chose (``off_policy_actions``);
        ``info`` entries are added to that step's info. Returns without waiting."""
        self.submit(
            episode_id,
            {DEFAULT_AGENT_ID: observation},
            {DEFAULT_AGENT_ID: action},
            None if info is None else {DEFAULT_AGENT_ID: info},
            False,
        )

    def log_returns(self, episode_id: str, reward: float, info: dict | None = None) -> None:
        """Adds ``reward`` to the previous action's reward (summed until the next step);
        ``info`` (a dict) becomes the next step's info."""
        self.log_agent_returns(
            episode_id,
            {DEFAULT_AGENT_ID: reward},
            None if info is None else {DEFAULT_AGENT_ID: info},
            None,
            commit=not self.defer_returns,
        )

    def end_episode(self, episode_id: str, observation: Any, *, truncated: bool = False) -> None:
        """Ends the episode with its final observation (terminated, or truncated)."""
        self.end_agent_episode(episode_id, {DEFAULT_AGENT_ID: observation}, truncated)


class ExternalMultiAgentEnv(ExternalEnvBase):
    """The multi-agent variant: dict observations / actions / rewards per agent.

    ``observation_space`` / ``action_space`` are one agent's (shared) spaces, or dicts
    ``agent id -> space`` for agents with their own spaces (then the env's
    ``observation_spaces`` / ``action_spaces`` hold them, its ``observation_space`` /
    ``action_space`` are ``None``, each agent's data is checked against its own space, and
    a sampler needs one policy per set of agents that share spaces), and ``agent_ids`` the
    possible agents in agent-index order. Other arguments as in
    :class:`ExternalEnv`. ``log_returns(..., multiagent_done_dict={agent: True})`` ends an
    agent early: its final observation must come in the next observation dict, after
    which it gets no action and may not observe again.

    Refused with :class:`InvalidDataError` (nothing changes, other episodes untouched):
    agents not in ``agent_ids``; dicts with more entries than there are agents;
    non-dict observations, actions, rewards, infos or done dicts; done flags that are
    not bools; observations of agents that are done; actions for agents other than the
    acting ones; and rewards or done flags for an agent that has not observed yet in
    this episode (RLlib would file such a reward before the agent's first step, where
    it trains nothing); and a truncated ``end_episode`` without the final observation of
    an agent that acted and still waits for its next one (RLlib bootstraps every truncated
    agent from its own final observation). Rewards or infos for an agent that is already
    done raise :class:`EpisodeStateError`. An abandoned episode gives every agent still in
    it its latest observation again, as its final one.
    """

    multi_agent = True

    def __init__(
        self,
        observation_space: Space | Mapping[Any, Space],
        action_space: Space | Mapping[Any, Space],
        *,
        agent_ids: Any,
        **kwargs: Any,
    ):
        agent_ids = tuple(agent_ids)
        if not agent_ids or len(set(agent_ids)) != len(agent_ids) or ALL_AGENTS in agent_ids:
            raise ValueError(
                f"agent_ids must be distinct and non-empty (not {ALL_AGENTS!r}), got {agent_ids}"
            )
        super().__init__(observation_space, action_space, agent_ids, **kwargs)

    def get_action(self, episode_id: str, observation_dict: dict) -> dict:
        """Blocks until the sampler answers; returns ``{agent: action}`` for the observing
        agents that are not done."""
        return self._get_action(episode_id, observation_dict)

    def log_action(
        self,
        episode_id: str,
        observation_dict: dict,
        action_dict: dict,
        *,
        info: dict | None = None,
    ) -> None:
        """Records a step with the simulator's own actions (one per observing agent);
        ``info`` (``{agent: dict}``) entries are added to that step's infos."""
        self.submit(episode_id, observation_dict, action_dict, info, False)

    def log_returns(
        self,
        episode_id: str,
        reward_dict: dict,
        info_dict: dict | None = None,
        multiagent_done_dict: dict | None = None,
    ) -> None:
        """Adds per-agent rewards; ``info_dict`` holds per-agent infos for the next step."""
        self.log_agent_returns(
            episode_id,
            reward_dict,
            info_dict,
            multiagent_done_dict,
            commit=not self.defer_returns,
        )

    def end_episode(
        self, episode_id: str, observation_dict: dict, *, truncated: bool = False
    ) -> None:
        """Ends the episode with the agents' final observations.

        Raises:
            InvalidDataError: ``truncated=True`` without the final observation of an agent
                that acted and waits for its next one (an agent out of lockstep that did
                not observe in the last step): each truncated agent needs its own.
        """
        self.end_agent_episode(episode_id, observation_dict, truncated)
