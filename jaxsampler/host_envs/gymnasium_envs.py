"""Adapters from Python envs to :class:`~jaxsampler.host_envs.base.HostEnv`.

* :class:`GymnasiumHostEnv`: single-agent Gymnasium envs (``reset(seed=)`` /
  5-tuple ``step``), agent id :data:`jaxsampler.constants.DEFAULT_AGENT_ID`;
* :class:`MultiAgentDictEnv`: multi-agent envs with dict observations, either RLlib's
  ``MultiAgentEnv`` API (``"__all__"`` in the done dicts) or PettingZoo's parallel API
  (``agents`` / ``possible_agents``, no ``"__all__"``).

Both step their sub-envs on the host, in-process, in lockstep: :meth:`poll` resets the
sub-envs that need it (the first poll, after an episode ended, after :meth:`reset`) and
steps the ones that :meth:`send_actions` answered, optionally on a thread pool
(``num_threads``); nothing happens in ``send_actions`` but checks. An episode's real
final observation comes in ``obs`` together with its done flags; the env resets at the
next poll and returns the new episode's first observations (next-step auto-reset, as in
the device rollout and Gymnasium's ``AutoresetMode.NEXT_STEP``).

Seeding: sub-env ``i`` is reset with ``seed=seed + i`` the first time, and with
``seed=None`` afterwards (its own RNG continues), as Gymnasium's vector envs do.

Not part of the ``HostEnv`` contract (an optional extra the host sampler uses when
present): :meth:`reset` drops every running episode; the next poll starts new ones.

Failures (``on_env_error``, ``max_env_restarts``, ``step_timeout_s``,
``check_observations``; :mod:`jaxsampler.host_envs.failures`): a sub-env whose ``step``
raises, hangs or returns a bad observation ends its running episode *truncated* at its
last good observation (``info["env_error"]``) and is rebuilt from its factory
(``"restart"``) or never stepped again (``"drop"``); the other sub-envs go on untouched
in the same poll. A failed ``reset`` is retried on a rebuilt env within the same poll.
The default, ``"raise"``, raises :class:`~jaxsampler.host_envs.failures.HostEnvError`.
"""

from __future__ import annotations

import concurrent.futures
import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from jaxsampler.constants import ALL_AGENTS, DEFAULT_AGENT_ID
from jaxsampler.host_envs.base import (
    HostEnv,
    MultiEnvDict,
    PollResult,
    agent_spaces,
    shared_and_own,
)
from jaxsampler.host_envs.failures import (
    FailureHandling,
    HostEnvError,
    OnEnvError,
    SubEnvFailures,
    close_quietly,
    describe_error,
    run_calls,
    truncated_end,
)
from jaxsampler.spaces import ValueChecker

__all__ = ["GymnasiumHostEnv", "MultiAgentDictEnv"]


def _is_factory(x: Any) -> bool:
    """An env class or a function that makes an env (not an env object)."""
    return isinstance(x, type) or (callable(x) and not hasattr(x, "step"))


def _make_all(
    envs: Any, num_envs: int | None, env_kwargs: dict | None
) -> tuple[list[Any], list[Callable[[], Any] | None]]:
    """Instantiates ``envs`` (an env id with ``num_envs``, or a sequence of factories /
    envs); returns the envs and, per env, its factory (``None`` for env objects)."""
    if isinstance(envs, str):
        import gymnasium

        n = 1 if num_envs is None else int(num_envs)
        if n < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs!r}")
        make = functools.partial(gymnasium.make, envs, **(env_kwargs or {}))
        return [make() for _ in range(n)], [make] * n
    if _is_factory(envs):
        envs = [envs] * (1 if num_envs is None else int(num_envs))
    if not isinstance(envs, Sequence) or isinstance(envs, (str, bytes)) or not envs:
        raise TypeError(
            "envs must be an env id, a factory, or a non-empty list of env factories / env objects"
        )
    if num_envs is not None and int(num_envs) != len(envs):
        raise ValueError(f"num_envs={num_envs} but {len(envs)} envs / factories were given")
    factories = [e if _is_factory(e) else None for e in envs]
    out = [e() if f is not None else e for e, f in zip(envs, factories)]
    for i, e in enumerate(out):
        if not (hasattr(e, "reset") and hasattr(e, "step")):
            raise TypeError(f"envs[{i}] ({type(e).__name__}) has no reset() / step()")
    return out, factories


def _space_key(space: Any) -> Any:
    from jaxsampler.spaces import Box

    if isinstance(space, Box):  # bounds may differ between sub-envs, shapes and dtypes may not
        return ("Box", space.shape, np.dtype(space.dtype))
    return space


def _is_space(x: Any) -> bool:
    from jaxsampler.spaces import Space

    return isinstance(x, Space) or type(x).__module__.startswith(("gymnasium", "gym."))


def _convert(space: Any, what: str) -> Any:
    from jaxsampler.spaces import Space, convert_space

    if isinstance(space, Space):
        return space
    try:
        return convert_space(space)
    except TypeError as exc:
        raise TypeError(
            f"cannot convert the {what} {space!r} into a jaxsampler space: {exc}"
        ) from None


#: The failure options' entries in the ``Args`` of :class:`GymnasiumHostEnv` and
#: :class:`MultiAgentDictEnv` (their docstrings say ``{failure_args}`` where they go).
_FAILURE_ARGS_DOC = """\
        on_env_error: what a failing sub-env does (:mod:`jaxsampler.host_envs.failures`):
            ``"raise"`` (default) a :class:`HostEnvError`; ``"restart"``: its episode ends
            truncated (``info["env_error"]``), the env is rebuilt from its factory (so
            envs must be given as an id, a class or a function) and reset with a fresh
            seed; ``"drop"``: its episode ends the same way and the sub-env is never
            stepped again.
        max_env_restarts: ``"restart"``: failures of one sub-env in a row (without a good
            step between them) that are tolerated; one more raises :class:`HostEnvError`.
        step_timeout_s: run every sub-env call on its own worker thread (``num_threads``
            then has no effect) and treat a call that takes longer as a failure
            (``TimeoutError``). A hung thread cannot be killed: it is abandoned, and its
            env object is never touched again.
        max_abandoned_threads: hung calls whose threads may be alive at once; one more
            raises :class:`HostEnvError`.
        check_observations: an observation that does not fit the observation space (wrong
            shape, NaN, an infinity where the space is bounded) is a failure of its
            sub-env (default: passed on; the sampler raises ``ValueError`` on a wrong shape
            and records NaNs).
"""
_T = TypeVar("_T", bound=type)


def _document_failure_args(cls: _T) -> _T:
    """Puts :data:`_FAILURE_ARGS_DOC` where the class docstring says ``{failure_args}``."""
    if cls.__doc__:  # None under python -OO
        cls.__doc__ = cls.__doc__.replace("        {failure_args}\n", _FAILURE_ARGS_DOC)
    return cls


class _LockstepEnv(HostEnv):
    """Shared machinery: which sub-envs reset / step at the next poll, checks of actions,
    and what happens when a sub-env fails (:mod:`jaxsampler.host_envs.failures`)."""

    def __init__(
        self,
        envs: list[Any],
        factories: list[Callable[[], Any] | None],
        seed: int | None,
        num_threads: int,
        failure: FailureHandling,
    ):
        given = [i for i, f in enumerate(factories) if f is None]
        if failure.on_env_error == "restart" and given:
            for env, f in zip(envs, factories):  # the envs made here are ours to close
                if f is not None:
                    close_quietly(env)
            raise ValueError(
                f"on_env_error='restart' rebuilds failed sub-envs from their factories, but "
                f"envs {given} were given as env objects: pass an env id, an env class or a "
                "function that makes the env (or use on_env_error='drop' / 'raise')"
            )
        self._envs: list[Any] = envs  # None: retired (failed, dropped or abandoned)
        self._factories = factories
        self.num_envs = len(envs)
        self._seed = seed
        self._seeded = [False] * self.num_envs
        self._needs_reset = [True] * self.num_envs
        self._awaiting: dict[int, tuple] = {}  # env_id -> agents that must act (last poll)
        self._actions: dict[int, dict] = {}
        threads = num_threads > 1 and failure.step_timeout_s is None  # else: one worker per env
        self._pool = concurrent.futures.ThreadPoolExecutor(num_threads) if threads else None
        self._closed = False
        #: the failure options (validated)
        self.failure_handling = failure
        self._failures = SubEnvFailures(failure)
        #: counts of failures, restarts and dropped sub-envs
        self.failure_stats = self._failures.stats
        #: agent id -> its observation check (``check_observations`` only)
        self._obs_checks = (
            {aid: ValueChecker(space, values=True) for aid, space in agent_spaces(self)[0].items()}
            if failure.check_observations
            else None
        )
        self._last_obs: list[dict] = [{} for _ in envs]  # live agents' last good observations
        self._rebuild: set[int] = set()  # rebuilt from the factory at their next reset
        self._dropped: set[int] = set()

    @property
    def closed(self) -> bool:
        """``True`` once :meth:`close` ran or every sub-env was dropped."""
        return self._closed or len(self._dropped) == self.num_envs

    # -- HostEnv -----------------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> PollResult:
        """Resets the sub-envs that need it and steps the answered ones; returns their data
        (``timeout`` is ignored: every answered sub-env is ready; ``step_timeout_s``
        bounds each sub-env call instead).

        Raises:
            HostEnvError: a sub-env failed and ``on_env_error="raise"``, it failed more
                than ``max_env_restarts`` times in a row, too many threads hung, or every
                sub-env was dropped.
        """
        if self._closed:
            raise RuntimeError("poll() on a closed env")
        if self._failures.broken is not None:
            raise HostEnvError(self._failures.broken, method="poll")
        ready = [
            i
            for i in range(self.num_envs)
            if i not in self._dropped and (self._needs_reset[i] or i in self._actions)
        ]
        if not ready:
            if len(self._dropped) == self.num_envs:
                raise HostEnvError(
                    "poll(): every sub-env was dropped after failing (on_env_error='drop'); "
                    f"the last failure: {self.failure_stats.last_error}",
                    method="poll",
                )
            raise RuntimeError(
                "poll(): no sub-env is ready; answer the last poll's observations with "
                "send_actions() first"
            )
        delivered = self._run_jobs({i: self._actions.pop(i, None) for i in ready})
        out = PollResult({}, {}, {}, {}, {}, {})
        for i in sorted(delivered):
            obs, rewards, terms, truncs, infos = delivered[i]
            out.obs[i], out.infos[i], out.terminateds[i], out.truncateds[i] = (
                obs,
                infos,
                terms,
                truncs,
            )
            if rewards is not None:
                out.rewards[i] = rewards
            done = bool(terms.get(ALL_AGENTS, False) or truncs.get(ALL_AGENTS, False))
            self._needs_reset[i] = done and i not in self._dropped
            if done:
                self._awaiting.pop(i, None)
                self._last_obs[i] = {}
            else:
                acting = tuple(a for a in obs if not (terms.get(a, False) or truncs.get(a, False)))
                if acting:
                    self._awaiting[i] = acting
                else:  # nobody acts at this step: the env steps on with an empty action dict
                    self._actions[i] = {}
        return out

    def send_actions(self, actions: MultiEnvDict) -> None:
        """Records actions for the next poll. Raises ``KeyError`` / ``ValueError`` (and
        records nothing) for unknown or unexpected env ids / agent ids, or bad actions."""
        checked = {}
        for env_id, per_agent in actions.items():
            if env_id not in self._awaiting:
                raise KeyError(
                    f"send_actions: env {env_id!r} is not waiting for actions (waiting: "
                    f"{sorted(self._awaiting)}); "
                    "answer only the sub-envs of the last poll whose episode is not done"
                )
            want = self._awaiting[env_id]
            if not isinstance(per_agent, dict) or set(per_agent) != set(want):
                got = (
                    sorted(map(str, per_agent))
                    if isinstance(per_agent, dict)
                    else type(per_agent).__name__
                )
                raise ValueError(
                    f"send_actions: env {env_id!r} needs actions for agents "
                    f"{sorted(map(str, want))}, got {got}"
                )
            checked[env_id] = {
                a: self._check_action(env_id, a, act) for a, act in per_agent.items()
            }
        for env_id, per_agent in checked.items():
            del self._awaiting[env_id]
            self._actions[env_id] = per_agent

    def reset(self) -> None:
        """Drops every running episode: the next poll starts a new one in every sub-env
        (dropped sub-envs stay dropped)."""
        self._needs_reset = [i not in self._dropped for i in range(self.num_envs)]
        self._awaiting.clear()
        self._actions.clear()

    def close(self) -> None:
        """Closes every sub-env (not the abandoned, hung ones: they are never touched).
        Idempotent.

        Raises:
            HostEnvError: some sub-envs' ``close()`` raised (all others are closed anyway;
                the first error is chained, every failed index is named).
        """
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        errors: list[tuple[int, BaseException]] = []
        for i, env in enumerate(self._envs):
            close = getattr(env, "close", None) if env is not None else None
            if close is None:
                continue
            outcome = run_calls(
                {i: close},
                worker=self._failures.worker,
                timeout_s=self.failure_handling.step_timeout_s,
                what={i: "close"},
            )[i]
            if outcome[1] is not None:
                errors.append((i, outcome[1]))
        self._failures.stop()
        if errors:
            i, exc = errors[0]
            raise HostEnvError(
                f"close(): sub-envs {[j for j, _ in errors]} raised while closing (all others "
                f"were closed); sub-env {i}: {describe_error(exc)}",
                env_index=i,
                method="close",
            ) from exc

    # -- failures ----------------------------------------------------------------------

    def _run_jobs(self, jobs: dict[int, dict | None]) -> dict[int, tuple]:
        """Runs the resets (``None``) and steps (actions) of one poll; returns each sub-env's
        poll data. Failed resets are retried on a rebuilt env (``"restart"``) in the same
        poll; failed steps end the episode (:func:`truncated_end`)."""
        delivered: dict[int, tuple] = {}
        while jobs:
            methods = {
                i: "step" if a is not None else ("restart" if i in self._rebuild else "reset")
                for i, a in jobs.items()
            }
            calls = {i: self._call(i, a) for i, a in jobs.items()}
            outcomes = run_calls(
                calls,
                pool=self._pool,
                worker=self._failures.worker,
                timeout_s=self.failure_handling.step_timeout_s,
                what=methods,
            )
            retry: dict[int, dict | None] = {}
            for i, (result, exc, hung) in outcomes.items():  # in env order, as the jobs
                method = methods[i]
                if exc is None:
                    env, raw = result
                    if method == "step":
                        data = self._from_step(i, env, raw)
                    else:
                        data = self._from_reset(i, env, raw)
                    if self._obs_checks is not None:
                        exc = self._bad_observation(i, data[0])
                    if exc is None:
                        if method == "step":
                            self._failures.good_step(i)
                            last = self._last_obs[i]
                            last.update(data[0])
                            if any(data[2].values()) or any(data[3].values()):  # agents done
                                for a in [a for a in last if data[2].get(a) or data[3].get(a)]:
                                    del last[a]
                        else:
                            if method == "restart":
                                self._envs[i] = env
                                self._rebuild.discard(i)
                            self._last_obs[i] = dict(data[0])
                        delivered[i] = data
                        continue
                    if method == "restart":  # a rebuilt env that gave a bad first observation
                        close_quietly(env)
                self._fail(i, method, exc, hung)
                if method == "step":
                    delivered[i] = truncated_end(self._last_obs[i], describe_error(exc))
                elif self.failure_handling.on_env_error == "restart":
                    retry[i] = None
            jobs = retry
        return delivered

    def _call(self, i: int, actions: dict | None) -> Callable[[], tuple[Any, Any]]:
        """The call that resets, rebuilds or steps sub-env ``i``: it returns ``(env, raw
        output)`` and touches nothing but that env object (it may run on a thread that
        is later abandoned)."""
        if actions is not None:
            env, arg = self._envs[i], self._step_arg(actions)
            return lambda: (env, env.step(arg))
        if i not in self._rebuild:
            env, seed = self._envs[i], self._next_seed(i)
            return lambda: (env, env.reset(seed=seed))
        factory, seed = self._factories[i], self._failures.next_restart_seed(self._seed, i)
        assert factory is not None  # checked at construction

        def rebuild() -> tuple[Any, Any]:
            env = factory()
            try:
                return env, env.reset(seed=seed)
            except BaseException:
                close_quietly(env)
                raise

        return rebuild

    def _bad_observation(self, i: int, obs: dict) -> Exception | None:
        """The error of the first observation that does not fit the observation space
        (wrong shape, NaN, ...), else ``None`` (``check_observations`` only)."""
        checks = self._obs_checks
        assert checks is not None
        for a, o in obs.items():
            try:
                checks[a](o, "observation", a)
            except ValueError as exc:
                return exc
        return None

    def _fail(self, i: int, method: str, exc: BaseException, hung: bool) -> None:
        """Counts a failure of sub-env ``i`` (raising :class:`HostEnvError` if told to or
        past a limit) and retires its env object: closed (errors ignored) unless it hung,
        then rebuilt at the next reset (``"restart"``) or dropped."""
        if hung:  # its thread may still run inside it: never touched again
            self._envs[i] = None
        self._failures.fail(i, method, exc, hung, pending=hung)
        env, self._envs[i] = self._envs[i], None
        if env is not None and method != "restart":  # a failed rebuild closed its own env
            close_quietly(env)
        self._awaiting.pop(i, None)
        self._actions.pop(i, None)
        if self.failure_handling.on_env_error == "drop":
            self._dropped.add(i)
            self._needs_reset[i] = False
        else:
            self._rebuild.add(i)

    # -- helpers -----------------------------------------------------------------------

    def _next_seed(self, i: int) -> int | None:
        if self._seeded[i] or self._seed is None:
            return None
        self._seeded[i] = True
        return int(self._seed) + i

    def _check_action(self, env_id: int, agent_id: Any, action: Any) -> Any:
        import gymnasium.spaces as gs

        space = self._gym_action_space(env_id, agent_id)
        if isinstance(space, gs.Discrete):
            arr = np.asarray(action)
            if arr.shape != () or not np.issubdtype(arr.dtype, np.integer):
                raise ValueError(
                    f"send_actions: env {env_id!r} agent {agent_id!r}: a Discrete action must be "
                    "an integer scalar, "
                    f"got {action!r}"
                )
            return int(arr)
        if isinstance(space, (gs.Box, gs.MultiDiscrete, gs.MultiBinary)):
            arr = np.asarray(action, dtype=space.dtype)
            if arr.shape != space.shape:
                raise ValueError(
                    f"send_actions: env {env_id!r} agent {agent_id!r}: action shape {arr.shape} "
                    "does not match "
                    f"the action space {space} (shape {space.shape})"
                )
            return arr
        return action

    def _gym_action_space(self, env_id: int, agent_id: Any) -> Any:
        raise NotImplementedError

    def _step_arg(self, actions: dict) -> Any:
        """What the sub-env's ``step`` takes, from the agents' actions."""
        raise NotImplementedError

    def _from_reset(self, i: int, env: Any, raw: Any) -> tuple:
        """Poll data ``(obs, None, terminateds, truncateds, infos)`` of a reset's output."""
        raise NotImplementedError

    def _from_step(self, i: int, env: Any, raw: Any) -> tuple:
        """Poll data ``(obs, rewards, terminateds, truncateds, infos)`` of a step's output."""
        raise NotImplementedError


@_document_failure_args
class GymnasiumHostEnv(_LockstepEnv):
    """Single-agent Gymnasium envs as a :class:`HostEnv` (see the module docstring).

    Args:
        envs: a registered Gymnasium id (made ``num_envs`` times with ``env_kwargs``), a
            factory (called ``num_envs`` times), or a list of factories and/or env objects.
        num_envs: number of sub-envs (with an id or one factory; else it must match).
        seed: sub-env ``i`` is first reset with ``seed + i`` (``None``: unseeded).
        env_kwargs: keyword arguments of ``gymnasium.make`` (with an id).
        num_threads: step the sub-envs on a thread pool of this size (``<= 1``: in the
            calling thread). Worth it only for envs that release the GIL.
        {failure_args}

    Raises:
        TypeError / ValueError: not envs, sub-envs with different observation or action
            space shapes, spaces that have no jaxsampler equivalent.
    """

    def __init__(
        self,
        envs: Any,
        num_envs: int | None = None,
        *,
        seed: int | None = 0,
        env_kwargs: dict | None = None,
        num_threads: int = 0,
        on_env_error: OnEnvError = "raise",
        max_env_restarts: int = 3,
        step_timeout_s: float | None = None,
        max_abandoned_threads: int = 8,
        check_observations: bool = False,
    ):
        failure = FailureHandling(
            on_env_error,
            max_env_restarts,
            step_timeout_s,
            max_abandoned_threads,
            check_observations,
        )
        made, factories = _make_all(envs, num_envs, env_kwargs)
        self.agent_ids = (DEFAULT_AGENT_ID,)
        spaces = []
        for i, e in enumerate(made):
            obs_space = _convert(e.observation_space, f"observation space of envs[{i}]")
            act_space = _convert(e.action_space, f"action space of envs[{i}]")
            spaces.append((obs_space, act_space))
        self.observation_space, self.action_space = spaces[0]
        for i, (o, a) in enumerate(spaces[1:], 1):
            if _space_key(o) != _space_key(self.observation_space) or _space_key(a) != _space_key(
                self.action_space
            ):
                raise ValueError(
                    f"all sub-envs must share their spaces: envs[0] has {self.observation_space!r} "
                    "/ "
                    f"{self.action_space!r}, envs[{i}] has {o!r} / {a!r}"
                )
        super().__init__(made, factories, seed, num_threads, failure)

    @property
    def envs(self) -> list[Any]:
        """The sub-env objects (index = ``env_id``; ``None`` while a failed sub-env waits for
        its rebuild, and for dropped or abandoned ones)."""
        return list(self._envs)

    def _gym_action_space(self, env_id: int, agent_id: Any) -> Any:
        return self._envs[env_id].action_space

    def _step_arg(self, actions: dict) -> Any:
        return actions[DEFAULT_AGENT_ID]

    def _from_reset(self, i: int, env: Any, raw: Any) -> tuple:
        obs, info = raw
        a = DEFAULT_AGENT_ID
        return {a: obs}, None, {ALL_AGENTS: False}, {ALL_AGENTS: False}, {a: dict(info or {})}

    def _from_step(self, i: int, env: Any, raw: Any) -> tuple:
        a = DEFAULT_AGENT_ID
        obs, reward, terminated, truncated, info = raw
        term, trunc = bool(terminated), bool(truncated)
        return (
            {a: obs},
            {a: float(reward)},
            {a: term, ALL_AGENTS: term},
            {a: trunc, ALL_AGENTS: trunc},
            {a: dict(info or {})},
        )


@_document_failure_args
class MultiAgentDictEnv(_LockstepEnv):
    """Multi-agent dict-API envs (RLlib's or PettingZoo's parallel API) as a :class:`HostEnv`.

    Each sub-env has ``reset(seed=...) -> (obs_dict, info_dict)`` (a bare ``obs_dict`` is
    accepted too) and ``step(action_dict) -> (obs, rewards, terminateds, truncateds,
    infos)``. Agents may be absent from any dict. Without an ``"__all__"`` key (PettingZoo)
    the episode is over when ``env.agents`` is empty (envs without ``agents``: when every
    agent that received an observation is done); it then counts as truncated if some agent
    was truncated at that step and as terminated otherwise.

    Args:
        envs: a list of env factories and/or env objects (or one factory and ``num_envs``).
        num_envs: number of sub-envs (with one factory).
        agent_ids: all possible agent ids in a fixed order (the agent index); default
            ``env.possible_agents``, else ``env.agents`` after construction, else
            ``env.get_agent_ids()``.
        observation_space / action_space: one space for every agent (Gymnasium or
            jaxsampler); default from the env, per agent: ``get_observation_space(aid)``,
            ``observation_spaces[aid]``, ``observation_space(aid)`` (PettingZoo), a
            ``Dict`` keyed by agent id, or one shared space. Agents whose spaces differ
            keep their own in ``observation_spaces`` / ``action_spaces`` (``agent id ->
            space``). Where only Box bounds differ, the shared space is the first
            agent's (one policy serves them all); where shapes or dtypes differ it is
            ``None``, and a :class:`~jaxsampler.sampling.host.HostSampler` needs a
            :class:`~jaxsampler.MultiAgentPolicy` whose policies each serve agents of
            one shape and dtype.
        seed: sub-env ``i`` is first reset with ``seed + i``.
        num_threads: step the sub-envs on a thread pool of this size.
        {failure_args}
    """

    def __init__(
        self,
        envs: Any,
        num_envs: int | None = None,
        *,
        agent_ids: Sequence[Any] | None = None,
        observation_space: Any = None,
        action_space: Any = None,
        seed: int | None = 0,
        num_threads: int = 0,
        on_env_error: OnEnvError = "raise",
        max_env_restarts: int = 3,
        step_timeout_s: float | None = None,
        max_abandoned_threads: int = 8,
        check_observations: bool = False,
    ):
        failure = FailureHandling(
            on_env_error,
            max_env_restarts,
            step_timeout_s,
            max_abandoned_threads,
            check_observations,
        )
        made, factories = _make_all(envs, num_envs, None)
        first = made[0]
        if agent_ids is None:
            for get in (
                lambda e: e.possible_agents,
                lambda e: e.agents,
                lambda e: e.get_agent_ids(),
            ):
                try:
                    agent_ids = get(first)
                except (AttributeError, NotImplementedError, TypeError):
                    continue
                if agent_ids:
                    break
            if not agent_ids:
                raise ValueError("cannot infer the agent ids from the env: pass agent_ids=[...]")
        self.agent_ids = tuple(agent_ids)
        if len(set(self.agent_ids)) != len(self.agent_ids):
            raise ValueError(f"agent_ids has duplicates: {self.agent_ids}")
        self.observation_space, self.observation_spaces = self._spaces(
            first, observation_space, "observation"
        )
        self.action_space, self.action_spaces = self._spaces(first, action_space, "action")
        self._gym_act = {
            aid: space.to_gymnasium() if hasattr(space, "to_gymnasium") else None
            for aid, space in agent_spaces(self)[1].items()
        }
        self._live: list[set] = [set() for _ in made]
        super().__init__(made, factories, seed, num_threads, failure)

    def _spaces(self, env: Any, given: Any, what: str) -> tuple[Any, dict[Any, Any] | None]:
        """``(shared space, agent id -> space)``: ``(space, None)`` when every agent has
        the same space (or ``given``); otherwise the agents' own spaces, with the first
        agent's as the shared one where one policy can serve them all (bounds differ) and
        ``None`` where it cannot (shapes or dtypes differ)."""
        if given is not None:
            return _convert(given, f"{what} space"), None
        plural = getattr(env, f"{what}_spaces", None)
        per_agent: list[Any] = []
        for aid in self.agent_ids:
            space = None
            getter = getattr(env, f"get_{what}_space", None)
            if callable(getter):
                try:
                    space = getter(aid)
                except (KeyError, NotImplementedError, TypeError, AttributeError):
                    space = None
            if space is None and isinstance(plural, dict):
                space = plural.get(aid)
            attr = getattr(env, f"{what}_space", None)
            if space is None and attr is not None:
                if _is_space(attr):  # one space, or a Dict keyed by agent id (RLlib's old API)
                    spaces = getattr(attr, "spaces", None)
                    space = spaces[aid] if isinstance(spaces, dict) and aid in spaces else attr
                elif callable(attr):  # PettingZoo: observation_space(agent)
                    space = attr(aid)
            if space is None:
                raise ValueError(
                    f"cannot find the {what} space of agent {aid!r}: pass {what}_space=..."
                )
            per_agent.append(_convert(space, f"{what} space of agent {aid!r}"))
        return shared_and_own(dict(zip(self.agent_ids, per_agent, strict=True)))

    def _gym_action_space(self, env_id: int, agent_id: Any) -> Any:
        return self._gym_act[agent_id]

    def _check_agents(self, i: int, *dicts: dict) -> None:
        for d in dicts:
            for a in d:
                if a != ALL_AGENTS and a not in self.agent_ids:
                    raise ValueError(
                        f"sub-env {i} returned data for agent {a!r}, which is not one of agent_ids "
                        f"{self.agent_ids}"
                    )

    def _step_arg(self, actions: dict) -> Any:
        return actions

    def _from_reset(self, i: int, env: Any, out: Any) -> tuple:
        obs, infos = out if isinstance(out, tuple) and len(out) == 2 else (out, {})
        obs, infos = dict(obs), dict(infos or {})
        self._check_agents(i, obs, infos)
        self._live[i] = set(obs)
        return (
            obs,
            None,
            {ALL_AGENTS: False},
            {ALL_AGENTS: False},
            {a: infos.get(a, {}) for a in obs},
        )

    def _from_step(self, i: int, env: Any, raw: Any) -> tuple:
        obs, rewards, terms, truncs, infos = raw
        obs, rewards = dict(obs), {a: float(r) for a, r in dict(rewards).items()}
        terms = {a: bool(v) for a, v in dict(terms).items()}
        truncs = {a: bool(v) for a, v in dict(truncs).items()}
        infos = {a: v for a, v in dict(infos or {}).items() if a != ALL_AGENTS}
        self._check_agents(i, obs, rewards, terms, truncs, infos)
        live = self._live[i]
        live.update(obs)
        newly_done = {a for a in live if terms.get(a, False) or truncs.get(a, False)}
        live -= newly_done
        if ALL_AGENTS not in terms and ALL_AGENTS not in truncs:
            agents = getattr(env, "agents", None)
            over = (len(agents) == 0) if agents is not None else not live
            any_trunc = any(v for a, v in truncs.items() if not terms.get(a, False))
            terms[ALL_AGENTS], truncs[ALL_AGENTS] = over and not any_trunc, over and any_trunc
        else:
            terms.setdefault(ALL_AGENTS, False)
            truncs.setdefault(ALL_AGENTS, False)
        return obs, rewards, terms, truncs, {a: infos[a] for a in infos}


#: Keyword arguments of :func:`make_gym` that configure the host env (the others go to
#: ``gymnasium.make``).
_HOST_ENV_OPTIONS = (
    "num_threads",
    "on_env_error",
    "max_env_restarts",
    "step_timeout_s",
    "max_abandoned_threads",
    "check_observations",
)


def make_gym(
    env_id: str, num_envs: int | None = 1, *, seed: int = 0, **kwargs: Any
) -> GymnasiumHostEnv:
    """``js.make("gym:<env_id>", ...)``: ``num_envs`` Gymnasium envs stepped on the host.

    Args:
        env_id: a Gymnasium id.
        num_envs: sub-envs (``None``: 1).
        seed: seed of the first sub-env (the others count up).
        **kwargs: ``num_threads`` and the failure options (``on_env_error``,
            ``max_env_restarts``, ``step_timeout_s``, ``max_abandoned_threads``,
            ``check_observations``) go to :class:`GymnasiumHostEnv`, the rest to
            ``gymnasium.make``.
    """
    host_options = {k: kwargs.pop(k) for k in _HOST_ENV_OPTIONS if k in kwargs}
    return GymnasiumHostEnv(
        env_id,
        1 if num_envs is None else num_envs,
        seed=seed,
        env_kwargs=kwargs or None,
        **host_options,
    )
