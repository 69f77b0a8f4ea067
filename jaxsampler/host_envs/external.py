"""``ExternalEnv`` / ``ExternalMultiAgentEnv``: a simulator drives the loop, a sampler polls.

The simulator calls, from any number of threads, ``start_episode``, ``get_action``
(blocks until the sampler answers), ``log_action`` (an action the simulator took itself),
``log_returns`` and ``end_episode`` (RLlib's ExternalEnv API). The sampler sees a
:class:`~jaxsampler.host_envs.base.HostEnv`: one sub-env per running episode,
``env_id`` = episode id. ``poll()`` blocks until at least one request is ready, then
waits at most ``max_wait_s`` for more (returning early once every running episode has a
request waiting), so concurrent ``get_action`` calls are answered by one batched policy
call; ``send_actions`` wakes exactly the callers answered.

Per episode, one poll delivers one step: the first request is the first observation;
each later request carries the rewards logged since the previous one; ``end_episode``
delivers the final observation with ``terminateds = {agent: True, "__all__": True}``
(``truncated=True`` gives the truncated flags instead). ``log_action`` steps arrive with
their action in ``off_policy_actions``; they do not block the caller (only when more than
``max_queued_steps`` steps of that episode wait to be polled: back pressure).

Deviations from RLlib, on purpose:

* infos belong to the step they were logged in (RLlib's infos stick to later steps);
* ``log_action`` returns at once instead of waiting up to 60 s for an ignored action;
* an episode whose client goes away (``abandon_episode``, ``get_action`` timeout, no call
  for ``episode_timeout_s``) ends as *truncated*: if its last request was not yet polled,
  that request becomes the final observation; otherwise the last observation is repeated.
  Its info has ``"abandoned": True``; nothing of other episodes is touched, and no
  episode stays open forever (RLlib leaks them);
* ids of finished episodes are remembered (for the "already completed" error) only up to
  ``max_finished_ids``, as fixed-size hashes, so memory stays bounded;
* every resource a client can take is bounded: episode ids (``max_episode_id_len``),
  running episodes overall and per ``owner`` (``max_concurrent_episodes``,
  ``max_episodes_per_owner``), their lifetime without calls (``episode_timeout_s``,
  600 s by default) and summed rewards (float32 range). An episode that never sent a
  request does not hold up ``poll``'s wait for more requests.

Owners: the policy server passes an ``owner`` (a client's identity) to
:meth:`ExternalEnvBase.start_episode` and to the agent-dict methods; another owner's
episodes then look unknown to it (:class:`UnknownEpisodeError`, the message of an
unknown id), and :meth:`ExternalEnvBase.abandon_owner` ends all episodes of a client that
went away. In-process callers pass no owner and may use every episode.

Locally inferred steps (:class:`~jaxsampler.serving.client.PolicyClient` in ``local``
mode) are ``log_action`` steps too (the ``off_policy_actions`` channel is how the
HostEnv protocol records an action the env side chose) whose info has
:data:`CLIENT_POLICY_INFO` = ``{"weights_version": int, "extra_model_outputs": {...}}``;
that key tells them apart from truly off-policy actions and carries behaviour logp and
policy version.
"""

from __future__ import annotations

import _thread
import hashlib
import math
import numbers
import reprlib
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import numpy as np

from jaxsampler.constants import ALL_AGENTS, DEFAULT_AGENT_ID
from jaxsampler.episodes.ids import random_episode_id
from jaxsampler.host_envs.base import HostEnv, MultiEnvDict, PollResult
from jaxsampler.spaces import Space, ValueChecker

__all__ = [
    "ExternalEnvBase",
    "ExternalEnv",
    "ExternalMultiAgentEnv",
    "ExternalEnvError",
    "UnknownEpisodeError",
    "EpisodeStateError",
    "InvalidDataError",
    "CapacityError",
    "WouldBlockError",
    "EnvClosedError",
    "CLIENT_POLICY_INFO",
    "Waiter",
    "check_reward",
    "MAX_REWARD",
]

#: Info key of steps whose action a client computed with the served policy (local mode).
CLIENT_POLICY_INFO = "client_policy"


class ExternalEnvError(ValueError):
    """Base of the errors raised in the simulator's thread (a ``ValueError``, as in RLlib)."""


class UnknownEpisodeError(ExternalEnvError):
    """The episode id was never started (or is too old to be remembered)."""


class EpisodeStateError(ExternalEnvError):
    """The call does not fit the episode's state: already started, already completed or
    abandoned, or another call of the same episode is still waiting."""


class InvalidDataError(ExternalEnvError):
    """An observation, action or reward does not match the spaces / expected types."""


class WouldBlockError(ExternalEnvError):
    """A non-blocking ``log_action`` found the episode's queue full (back pressure); the
    call changed nothing and may be retried where blocking is allowed."""


class CapacityError(ExternalEnvError):
    """``max_concurrent_episodes`` episodes are already running, or the caller's owner
    already runs ``max_episodes_per_owner``; the message names the bound."""


class EnvClosedError(RuntimeError):
    """The env was closed."""


# -- validation ------------------------------------------------------------------------


# Bounded reprs for error messages: whatever a client sends (a megabyte string, a dict of
# 10,000 keys, deep nesting), the message stays short and costs little to build.
_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlevel = 60, 60, 3


def _short(x: Any) -> str:
    s = _REPR.repr(x)
    return s if len(s) <= 80 else s[:77] + "..."


#: Largest reward magnitude: rewards end in float32 columns, where larger values are inf.
MAX_REWARD = float(np.finfo(np.float32).max)


def check_reward(r: Any, agent: Any) -> float:
    """``r`` as a float; :class:`InvalidDataError` unless it is a real number (not a
    string) that is finite and within float32 range (``abs(r) <= MAX_REWARD``)."""
    if type(r) is float:  # the common case, first
        v = r
    else:
        try:
            if isinstance(r, (str, bytes, bytearray)):
                raise TypeError
            v = float(r)
        except (TypeError, ValueError, OverflowError):
            raise InvalidDataError(
                f"reward[{_short(agent)}]: reward must be a number, got {_short(r)}"
            ) from None
    if not abs(v) <= MAX_REWARD:  # also catches NaN
        raise InvalidDataError(
            f"reward[{_short(agent)}]: reward must be finite and within float32 range "
            f"(abs <= {MAX_REWARD:.4g}), got {v}"
        )
    return v


def _check_flag(d: Any, what: str, agent: Any) -> bool:
    if not isinstance(d, (bool, np.bool_)):
        raise InvalidDataError(f"{what}[{_short(agent)}] must be a bool, got {_short(d)}")
    return bool(d)


# -- internal state --------------------------------------------------------------------


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
        if not self.done:
            self.done = True
            self._gate.release()
            if self.callback is not None:
                self.callback()

    def wait(self, timeout: float) -> bool:
        """True once answered (then the gate stays open for later calls)."""
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
        return self.all_term or self.all_trunc


class _Episode:
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
        "last_activity",
        "waiter",
    )

    def __init__(self, eid: str, training_enabled: bool, owner: Hashable | None):
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
        self.last_activity = time.monotonic()
        self.waiter: Waiter | None = None  # the caller blocked in get_action, if any
        self.blocked = 0  # callers waiting in log_action's back pressure


# Finished-episode memory: a keyed 64-bit hash of the id -> state | owner tag, so that an
# entry costs the same few dozen bytes whatever the id's length.
_COMPLETED, _ABANDONED = 1, 2
_STATE_NAMES = {_COMPLETED: "completed", _ABANDONED: "abandoned"}


class ExternalEnvBase(HostEnv):
    """Shared machinery of :class:`ExternalEnv` and :class:`ExternalMultiAgentEnv`, which
    differ only in how they wrap agent dicts. Its agent-dict methods (:meth:`submit`,
    :meth:`expire_waiter`, :meth:`log_agent_returns`, :meth:`end_agent_episode`) are what
    the policy server calls; they and :meth:`start_episode` / :meth:`abandon_episode`
    take an ``owner`` (any hashable, e.g. a client's identity): an episode started with
    an owner is invisible to callers that pass another owner (they get the same
    :class:`UnknownEpisodeError` as for an unknown id); ``owner=None`` (in-process
    callers) may use every episode. See :class:`ExternalEnv` for the options."""

    #: whether the public methods take agent dicts (``ExternalMultiAgentEnv``)
    multi_agent = False
    #: episodes of clients that vanish end truncated with ``{"abandoned": True}``
    abandons_episodes = True

    def __init__(
        self,
        observation_space: Space,
        action_space: Space,
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
        self.observation_space, self.action_space = observation_space, action_space
        self._obs_check, self._act_check = (
            ValueChecker(observation_space, error=InvalidDataError),
            ValueChecker(action_space, error=InvalidDataError),
        )
        self.agent_ids = tuple(agent_ids)
        self._agent_set = frozenset(self.agent_ids)
        self.max_wait_s, self.action_timeout_s = float(max_wait_s), float(action_timeout_s)
        self.episode_timeout_s = None if episode_timeout_s is None else float(episode_timeout_s)
        self.max_concurrent_episodes, self.max_queued_steps = (
            int(max_concurrent_episodes),
            int(max_queued_steps),
        )
        self.max_episodes_per_owner = (
            None if max_episodes_per_owner is None else int(max_episodes_per_owner)
        )
        self.max_episode_id_len = int(max_episode_id_len)
        self.max_finished_ids = int(max_finished_ids)
        #: the HostEnv's sub-env count: an upper bound on concurrently running episodes
        self.num_envs = self.max_concurrent_episodes
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
        self._next_reap = 0.0  # monotonic time of the next episode_timeout_s sweep
        self._closed = False
        self._thread: threading.Thread | None = None
        self._poller: str | None = (
            None  # what a poll() blocked in _cond waits for: "any" / "all" requests
        )
        self.stats = {"polls": 0, "steps_delivered": 0, "abandoned": 0, "dropped_actions": 0}

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
    ) -> str:
        """Registers a new episode and returns its id.

        Args:
            episode_id: a non-empty str of at most ``max_episode_id_len`` characters, or
                ``None`` for a fresh random one (``uuid4().hex``, from ``os.urandom``).
            training_enabled: ``False`` marks the episode's steps ``training_enabled:
                False`` in their infos.
            owner: who may use the episode (see the class docstring); counts against
                ``max_episodes_per_owner``.

        Raises:
            InvalidDataError: a bad id. EpisodeStateError: the id is running or finished.
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
            if key in self._finished:
                raise EpisodeStateError(f"Episode {eid} has already completed.")
            if self._quota_error(owner) is not None:
                self._reap_idle()  # a vanished client's episodes may be due (no poller needed)
                error = self._quota_error(owner)
                if error is not None:
                    raise error
            ep = _Episode(eid, bool(training_enabled), owner)
            self._episodes[eid] = ep
            if owner is not None:
                self._by_owner.setdefault(owner, {})[eid] = None
            self._refresh(ep)
        return eid

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
        obs = self._check_obs(obs)
        if extra_infos is not None and (
            not isinstance(extra_infos, Mapping)
            or not set(extra_infos) <= set(obs)
            or not all(isinstance(v, Mapping) for v in extra_infos.values())
        ):
            raise InvalidDataError(
                f"info must be a dict agent -> dict for observing agents, got {_short(extra_infos)}"
            )
        with self._lock:
            ep = self._open_episode(episode_id, owner)
            self._check_done_agents(ep, obs)
            if action is not None:  # agents whose final observation this is need no action
                action = self._check_actions(action, [a for a in obs if a not in ep.newly_done])
                # back pressure: the simulator may run ahead of the sampler only so far
                deadline = time.monotonic() + self.action_timeout_s
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
                    left = deadline - time.monotonic()
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
            waiter = Waiter(on_answer) if want_action else None
            item = self._make_item(ep, obs, off_policy=action, waiter=waiter)
            if extra_infos:
                for agent, extra in extra_infos.items():
                    item.infos[agent] = {**item.infos[agent], **extra}
            if want_action:
                ep.waiter = waiter
            self._push(ep, item)
            return waiter

    def _wait(
        self, episode_id: str, waiter: Waiter, timeout: float, cancelled: Callable[[], bool] | None
    ) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            step = left if cancelled is None else min(left, 0.1)
            if step > 0 and waiter.wait(step):
                break
            gone = cancelled is not None and cancelled()
            if left <= 0 or gone:
                why = "client disconnected" if gone else f"get_action timed out after {timeout} s"
                if not self.expire_waiter(episode_id, waiter, why):
                    break  # answered meanwhile
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
    ) -> None:
        """``log_returns`` with agent dicts (what both public classes and the policy
        server call): rewards are checked and summed into each agent's pending reward.

        Raises :class:`InvalidDataError` (and changes nothing) for non-dict arguments,
        unknown agents, rewards that are not finite float32-range numbers or whose sum
        since the last step would leave that range, done flags that are not bools and,
        in the multi-agent env, rewards or done flags for agents that have not observed
        yet in this episode (such a reward would belong to no step);
        :class:`EpisodeStateError` for agents that are already done."""
        ids = self._agent_set
        if not isinstance(rewards, Mapping):
            raise InvalidDataError(f"rewards must be a dict agent -> reward, got {_short(rewards)}")
        if len(rewards) > len(ids):
            self._too_many(rewards, "rewards")
        checked = {
            (a if a in ids else self._check_agent(a)): check_reward(r, a)
            for a, r in rewards.items()
        }
        if infos is not None:
            self._check_infos(infos)
        newly_done = None if dones is None else self._check_dones(dones)
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
            if acc:
                sums = {a: acc.get(a, 0.0) + r for a, r in checked.items()}
                for a, total in sums.items():
                    if not abs(total) <= MAX_REWARD:
                        raise InvalidDataError(
                            f"reward[{_short(a)}]: the rewards logged since the agent's last "
                            f"step would sum to {total}, outside float32 range "
                            f"(abs <= {MAX_REWARD:.4g}); the sum so far is kept"
                        )
                acc.update(sums)
            else:  # each value is in range (check_reward): so is the sum
                ep.reward = checked
            if infos:
                for a, i in infos.items():
                    ep.info[a] = dict(i)
            if newly_done:
                ep.newly_done |= newly_done
            ep.last_activity = time.monotonic()

    def _check_infos(self, infos: Any) -> None:  # no lock needed
        if not isinstance(infos, Mapping):
            raise InvalidDataError(f"infos must be a dict agent -> dict, got {_short(infos)}")
        if len(infos) > len(self.agent_ids):
            self._too_many(infos, "infos")
        for a, i in infos.items():
            self._check_agent(a)
            if not isinstance(i, Mapping):
                raise InvalidDataError(
                    f"infos[{_short(a)}] must be a dict, got {_short(i)} (infos must be a "
                    "dict agent -> dict)"
                )

    def _check_dones(self, dones: Any) -> set:  # no lock needed
        """The agents a ``multiagent_done_dict`` marks done (``"__all__"`` is ignored)."""
        if not isinstance(dones, Mapping):
            raise InvalidDataError(
                f"multiagent_done_dict must be a dict agent -> bool, got {_short(dones)}"
            )
        if len(dones) > len(self.agent_ids) + 1:
            self._too_many(dones, "multiagent_done_dict")
        newly_done = set()
        for a, d in dones.items():
            if a != ALL_AGENTS:
                self._check_agent(a)
            if _check_flag(d, "multiagent_done_dict", a) and a != ALL_AGENTS:
                newly_done.add(a)
        return newly_done

    def end_agent_episode(
        self, episode_id: str, obs: dict, truncated: bool, *, owner: Hashable | None = None
    ) -> None:
        """``end_episode`` with an agent dict of final observations (what both public
        classes and the policy server call)."""
        obs = self._check_obs(obs, allow_empty=self.multi_agent)
        with self._lock:
            ep = self._open_episode(episode_id, owner)
            self._check_done_agents(ep, obs, final=True)
            item = self._make_item(ep, obs, final=True)
            if truncated:
                item.all_trunc = True
            else:
                item.all_term = True
                item.terminated = {a: True for a in obs}
            ep.closed_reason = "completed"
            self._push(ep, item)

    def abandon_episode(
        self,
        episode_id: str,
        reason: str = "abandoned by the caller",
        owner: Hashable | None = None,
    ) -> bool:
        """Ends a running episode as truncated because its client went away (see the module
        docstring); a blocked ``get_action`` of it raises. Returns whether it abandoned.

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

    # -- sampler side (HostEnv) ------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> PollResult:
        """Blocks until a request is ready (or ``timeout`` s pass, or the env is closed:
        then every dict is empty), waits up to ``max_wait_s`` for more, returns them all.
        The wait for more ends early once every used running episode has a request
        waiting (episodes that never sent a request are not waited for)."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            for eid in self._offp_in_flight:  # the sampler had its chance to answer them
                ep = self._episodes.get(eid)
                if ep is not None and ep.in_flight is not None and ep.in_flight.waiter is None:
                    ep.in_flight = None
                    self._refresh(ep)
            self._offp_in_flight.clear()
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
            return self._deliver()

    def send_actions(self, actions: MultiEnvDict) -> None:
        """Answers the episodes of the last poll; unknown or unexpected env ids are counted in
        ``stats["dropped_actions"]`` and ignored (an abandoned episode's answer, say). The
        answer to a ``log_action`` step is ignored and may be left out: the next ``poll``
        treats such steps as answered. An answered ``get_action`` restarts its episode's
        ``episode_timeout_s``."""
        with self._lock:
            now = time.monotonic()
            for eid, acts in actions.items():
                ep = self._episodes.get(eid)
                if ep is None or ep.in_flight is None:
                    self.stats["dropped_actions"] += 1
                    continue
                item, ep.in_flight = ep.in_flight, None
                self._offp_in_flight.discard(eid)
                w = item.waiter
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
                    w.set()
                self._refresh(ep)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Fails every blocked caller with :class:`EnvClosedError` and wakes the poller.
        Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for ep in self._episodes.values():
                if ep.waiter is not None:
                    ep.waiter.error = EnvClosedError("ExternalEnv was closed")
                    ep.waiter.set()
            self._cond.notify_all()
            self._room.notify_all()

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

    def _check_agent(self, agent: Any) -> Any:
        if agent not in self._agent_set:
            raise InvalidDataError(
                f"unknown agent id {_short(agent)}; expected one of {list(self.agent_ids)}"
            )
        return agent

    def _too_many(self, d: Mapping, what: str) -> None:
        raise InvalidDataError(
            f"{what} has {len(d)} entries; there are only {len(self.agent_ids)} agents "
            f"{list(self.agent_ids)}"
        )

    def _check_obs(self, obs: Any, allow_empty: bool = False) -> dict:  # no lock needed
        if not isinstance(obs, Mapping) or not (obs or allow_empty):
            raise InvalidDataError(
                f"observations must be a non-empty dict agent -> obs, got {_short(obs)}"
            )
        check, ids = self._obs_check, self._agent_set
        if len(obs) > len(ids):
            self._too_many(obs, "observations")
        return {
            (a if a in ids else self._check_agent(a)): check(o, "observation", a)
            for a, o in obs.items()
        }

    def _check_actions(self, actions: Any, agents: list) -> dict:
        if (
            not isinstance(actions, Mapping)
            or len(actions) != len(agents)
            or set(actions) != set(agents)
        ):
            raise InvalidDataError(
                f"actions must be a dict with the acting agents {agents}, got {_short(actions)}"
            )
        check = self._act_check
        return {a: check(x, "action", a) for a, x in actions.items()}

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
        return _Item(obs, rewards, infos, terminated, off_policy=off_policy, waiter=waiter)

    def _push(self, ep: _Episode, item: _Item) -> None:
        ep.pending.append(item)
        ep.last_activity = time.monotonic()
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
            for a in last.infos:
                last.infos[a] = {**last.infos[a], "abandoned": True}
        elif ep.last_obs is not None:
            # Repeat the last observation of the agents still in the episode (an agent
            # whose final observation was already delivered must not observe again).
            done = ep.done_agents
            item = self._make_item(ep, {a: o for a, o in ep.last_obs.items() if a not in done})
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

    def _reap_idle(self) -> None:
        """Abandons episodes with no call for ``episode_timeout_s`` (not those with a
        caller blocked in the env). A sweep visits every episode, so it runs at most four
        times per timeout and at most once a second (``poll`` and a refused start call it)."""
        timeout = self.episode_timeout_s
        if timeout is None:
            return
        now = time.monotonic()
        if now < self._next_reap:
            return
        self._next_reap = now + min(1.0, timeout / 4)
        limit = now - timeout
        for ep in list(self._episodes.values()):
            if (
                ep.closed_reason is None
                and ep.waiter is None
                and not ep.blocked
                and ep.last_activity < limit
            ):
                self._abandon(ep, f"no call for {timeout} s")


def _owner_tag(owner: Hashable) -> int:
    """An owner's tag in the finished memory: its 64-bit hash with bit 64 set, so never
    0 (which means "no owner")."""
    return (hash(owner) & 0xFFFF_FFFF_FFFF_FFFF) | 1 << 64


def _short_id(eid: Any) -> str:
    return eid if isinstance(eid, str) and len(eid) <= 140 else _short(eid)


def _not_found(eid: Any) -> str:
    return f"Episode {_short_id(eid)} not found."


def _check_option(
    name: str, value: Any, low: float, *, strict: bool = False, integer: bool = False
) -> None:
    ok_type = isinstance(value, numbers.Integral if integer else numbers.Real)
    if (
        isinstance(value, bool)
        or not ok_type
        or not math.isfinite(value)
        or value < low
        or (strict and value == low)
    ):
        kind = "an int" if integer else "a finite number"
        rel = ">" if strict else ">="
        raise ValueError(f"{name} must be {kind} {rel} {low}, got {value!r}")


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
        )

    def end_episode(self, episode_id: str, observation: Any, *, truncated: bool = False) -> None:
        """Ends the episode with its final observation (terminated, or truncated)."""
        self.end_agent_episode(episode_id, {DEFAULT_AGENT_ID: observation}, truncated)


class ExternalMultiAgentEnv(ExternalEnvBase):
    """The multi-agent variant: dict observations / actions / rewards per agent.

    ``observation_space`` / ``action_space`` are one agent's (shared) spaces and
    ``agent_ids`` the possible agents in agent-index order. Other arguments as in
    :class:`ExternalEnv`. ``log_returns(..., multiagent_done_dict={agent: True})`` ends an
    agent early: its final observation must come in the next observation dict, after
    which it gets no action and may not observe again.

    Refused with :class:`InvalidDataError` (nothing changes, other episodes untouched):
    agents not in ``agent_ids``; dicts with more entries than there are agents;
    non-dict observations, actions, rewards, infos or done dicts; done flags that are
    not bools; observations of agents that are done; actions for agents other than the
    acting ones; and rewards or done flags for an agent that has not observed yet in
    this episode (RLlib would file such a reward before the agent's first step, where
    it trains nothing). Rewards or infos for an agent that is already done raise
    :class:`EpisodeStateError`.
    """

    multi_agent = True

    def __init__(
        self, observation_space: Space, action_space: Space, *, agent_ids: Any, **kwargs: Any
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
        self.log_agent_returns(episode_id, reward_dict, info_dict, multiagent_done_dict)

    def end_episode(
        self, episode_id: str, observation_dict: dict, *, truncated: bool = False
    ) -> None:
        """Ends the episode with the agents' final observations."""
        self.end_agent_episode(episode_id, observation_dict, truncated)
