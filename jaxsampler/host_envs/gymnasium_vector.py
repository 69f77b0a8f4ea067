"""Gymnasium's own vector envs (``SyncVectorEnv``, ``AsyncVectorEnv``) as a ``HostEnv``.

``AsyncVectorEnv`` steps its sub-envs in worker processes, so slow Python simulators run
in parallel while the policy still runs as one jitted, batched call. The vector env must
use Gymnasium's ``AutoresetMode.NEXT_STEP`` (the default): the step after an episode
ends returns the new episode's first observation (reward 0, action ignored), which is
exactly :mod:`jaxsampler.host_envs.base`'s next-step contract. Vector envs step in
lockstep, so every poll delivers every sub-env; sub-envs that reset take a placeholder
action that Gymnasium ignores. Create ``AsyncVectorEnv(..., context="spawn")`` (or
``"forkserver"``): forking a process in which JAX threads run can deadlock.

Failures (:mod:`jaxsampler.host_envs.failures`): a vector env that raises in ``reset`` /
``step`` is in an unknown state (``SyncVectorEnv`` stepped some sub-envs and not the
others; ``AsyncVectorEnv`` shut the failing worker process down), and Gymnasium cannot
restart one sub-env. So a failure is the *whole* vector env's: every running episode
ends truncated at its last good observation with ``info["env_error"]``, and then the
vector env is rebuilt (``"restart"``, from a factory) and reset with a fresh seed, or
closed for good (``"drop"``). ``step_timeout_s`` on an ``AsyncVectorEnv`` (unwrapped)
uses its own ``step_wait(timeout=)`` / ``reset_wait(timeout=)``; the hung worker
*processes* are then terminated (``close(terminate=True)``), so nothing is left running.
Any other vector env runs its calls on a worker thread that is abandoned if it hangs.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxsampler.constants import ALL_AGENTS, DEFAULT_AGENT_ID
from jaxsampler.host_envs.base import HostEnv, MultiEnvDict, PollResult
from jaxsampler.host_envs.failures import (
    WHOLE_ENV,
    FailureHandling,
    HostEnvError,
    OnEnvError,
    Outcome,
    SubEnvFailures,
    close_quietly,
    describe_error,
    run_calls,
    truncated_end,
)
from jaxsampler.spaces import ValueChecker

__all__ = ["GymnasiumVectorHostEnv"]


def _item(tree: Any, i: int) -> Any:
    if isinstance(tree, dict):
        return {k: _item(v, i) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_item(v, i) for v in tree)
    return tree[i]


def _infos_of(infos: dict, i: int) -> dict:
    """Sub-env ``i``'s info from Gymnasium's vectorised info dict (``k`` / ``_k`` masks)."""
    out = {}
    for k, v in (infos or {}).items():
        if k.startswith("_"):
            continue
        mask = infos.get("_" + k)
        if mask is not None and not bool(np.asarray(mask)[i]):
            continue
        out[k] = _infos_of(v, i) if isinstance(v, dict) else v[i]
    return out


def _terminate(vec: Any) -> None:
    """Closes ``vec`` for good, errors ignored: an ``AsyncVectorEnv`` (wrapped or not) has
    its worker processes terminated (they may hang), other vector envs are just closed."""
    from gymnasium.vector import AsyncVectorEnv

    if isinstance(getattr(vec, "unwrapped", None), AsyncVectorEnv):
        close_quietly(vec, terminate=True)
    else:
        close_quietly(vec)


class GymnasiumVectorHostEnv(HostEnv):
    """A ``gymnasium.vector.VectorEnv`` as a :class:`HostEnv` (single agent).

    Args:
        vector_env: a Gymnasium vector env with ``AutoresetMode.NEXT_STEP``, or a function
            without arguments that makes one (needed for ``on_env_error="restart"``).
        seed: the first reset's seed (sub-env ``i`` gets ``seed + i``, Gymnasium's rule).
        on_env_error: what a failure does (module docstring): ``"raise"`` (default) a
            :class:`HostEnvError`; ``"restart"``: every running episode ends truncated
            (``info["env_error"]``) and the vector env is rebuilt and reset with a fresh
            seed; ``"drop"``: the episodes end the same way and the env closes for good.
        max_env_restarts: ``"restart"``: failures in a row (no good step between them)
            that are tolerated; one more raises :class:`HostEnvError`.
        step_timeout_s: a ``reset`` / ``step`` that takes longer is a failure
            (``TimeoutError``); ``None``: no limit. Calling the factory is not limited.
        max_abandoned_threads: hung calls whose worker threads may be alive at once (not
            used by an unwrapped ``AsyncVectorEnv``, whose processes are terminated).
        check_observations: an observation that does not fit the observation space is a
            failure (of the whole vector env).

    Raises:
        ValueError: another auto-reset mode; spaces with no jaxsampler equivalent;
            ``on_env_error="restart"`` with a vector env object instead of a factory.
    """

    def __init__(
        self,
        vector_env: Any,
        *,
        seed: int | None = 0,
        on_env_error: OnEnvError = "raise",
        max_env_restarts: int = 3,
        step_timeout_s: float | None = None,
        max_abandoned_threads: int = 8,
        check_observations: bool = False,
    ):
        import gymnasium

        from jaxsampler.spaces import from_gymnasium_space

        #: the failure options (validated)
        self.failure_handling = FailureHandling(
            on_env_error,
            max_env_restarts,
            step_timeout_s,
            max_abandoned_threads,
            check_observations,
        )
        self._failures = SubEnvFailures(self.failure_handling)
        #: counts of failures and restarts (``by_env`` key ``-1``: the vector env)
        self.failure_stats = self._failures.stats
        factory: Callable[[], Any] | None = None
        if callable(vector_env) and not isinstance(vector_env, gymnasium.vector.VectorEnv):
            factory, vector_env = vector_env, vector_env()
        if on_env_error == "restart" and factory is None:
            raise ValueError(
                "on_env_error='restart' rebuilds the vector env after a failure: pass a "
                "function that makes it (e.g. lambda: gymnasium.vector.AsyncVectorEnv([...])) "
                "instead of the vector env object"
            )
        mode = vector_env.metadata.get("autoreset_mode", gymnasium.vector.AutoresetMode.NEXT_STEP)
        if str(getattr(mode, "value", mode)) != gymnasium.vector.AutoresetMode.NEXT_STEP.value:
            if factory is not None:  # made here: not the caller's to close
                _terminate(vector_env)
            raise ValueError(
                f"the vector env uses autoreset mode {mode!r}; jaxsampler needs "
                "AutoresetMode.NEXT_STEP "
                "(the default; pass autoreset_mode=gymnasium.vector.AutoresetMode.NEXT_STEP)"
            )
        self._factory = factory
        self._vec: Any = vector_env  # None after a failure, until rebuilt
        self._seed, self._base_seed = seed, seed
        self.num_envs = int(vector_env.num_envs)
        self.agent_ids = (DEFAULT_AGENT_ID,)
        self._gym_action_space = vector_env.single_action_space
        self.observation_space = from_gymnasium_space(vector_env.single_observation_space)
        self.action_space = from_gymnasium_space(vector_env.single_action_space)
        self._started = False
        self._resetting = np.zeros(self.num_envs, bool)  # done last step: this step resets
        self._awaiting: set[int] = set()
        self._actions: dict[int, Any] = {}
        self._closed = False
        self._obs_check = (
            ValueChecker(self.observation_space, values=True) if check_observations else None
        )
        self._last_obs: dict[int, Any] = {}  # sub-envs with a running episode -> last obs
        self._dropped = False

    @property
    def closed(self) -> bool:
        """``True`` once :meth:`close` ran or the env was dropped after a failure."""
        return self._closed or self._dropped

    def reset(self) -> None:
        """Drops every running episode: the next poll resets all sub-envs."""
        self._started = False
        self._awaiting.clear()
        self._actions.clear()
        self._last_obs.clear()

    def poll(self, timeout: float | None = None) -> PollResult:
        """Steps every sub-env at once (``timeout`` is ignored: the vector env is always
        ready; ``step_timeout_s`` bounds the call instead).

        Raises:
            HostEnvError: the vector env failed and ``on_env_error="raise"``, it failed more
                than ``max_env_restarts`` times in a row, or it was dropped earlier.
        """
        if self._failures.broken is not None:
            raise HostEnvError(self._failures.broken, method="poll")
        if self._dropped:
            raise HostEnvError(
                "poll(): the vector env was dropped after failing (on_env_error='drop'); the "
                f"last failure: {self.failure_stats.last_error}",
                method="poll",
            )
        if not self._started:
            return self._poll_reset()
        if self._awaiting:
            raise RuntimeError(
                f"poll(): answer sub-envs {sorted(self._awaiting)} with send_actions() first"
            )
        actions = [
            self._actions[i] if i in self._actions else self._gym_action_space.sample()
            for i in range(self.num_envs)
        ]
        self._actions.clear()
        batched = np.stack([np.asarray(x) for x in actions])
        result, exc, hung = self._invoke("step", batched)
        if exc is None:
            obs, rewards, terms, truncs, infos = result
            exc = self._bad_observations(obs)
        if exc is not None:
            return self._fail_step(exc, hung)
        self._failures.good_step(WHOLE_ENV)
        a = DEFAULT_AGENT_ID
        out = PollResult({}, {}, {}, {}, {}, {})
        was_resetting = self._resetting.copy()
        for i in range(self.num_envs):
            o = _item(obs, i)
            out.obs[i] = {a: o}
            out.infos[i] = {a: _infos_of(infos, i)}
            if was_resetting[i]:  # the new episode's first observation
                out.terminateds[i], out.truncateds[i] = {ALL_AGENTS: False}, {ALL_AGENTS: False}
                self._resetting[i] = False
                self._awaiting.add(i)
                self._last_obs[i] = o
                continue
            term, trunc = bool(terms[i]), bool(truncs[i])
            out.rewards[i] = {a: float(rewards[i])}
            out.terminateds[i], out.truncateds[i] = (
                {a: term, ALL_AGENTS: term},
                {a: trunc, ALL_AGENTS: trunc},
            )
            if term or trunc:
                self._resetting[i] = True
                self._last_obs.pop(i, None)
            else:
                self._awaiting.add(i)
                self._last_obs[i] = o
        return out

    def _poll_reset(self) -> PollResult:
        """Resets (rebuilding it first if it failed) the vector env; in ``"restart"`` mode
        a failed reset is retried on a rebuilt env."""
        while True:
            if self._vec is None:
                assert self._factory is not None  # only "restart" retires without dropping
                self._seed = self._failures.next_restart_seed(self._base_seed, WHOLE_ENV)
                try:
                    self._vec = self._factory()
                except Exception as make_error:
                    self._fail("make", make_error, False)
                    continue
            result, exc, hung = self._invoke("reset", self._seed)
            if exc is None:
                obs, infos = result
                exc = self._bad_observations(obs)
            if exc is None:
                break
            self._fail("reset", exc, hung)
            if self._dropped:
                return PollResult({}, {}, {}, {}, {}, {})
        self._seed = None  # later resets continue each sub-env's RNG
        self._started, self._resetting[:] = True, False
        a = DEFAULT_AGENT_ID
        out = PollResult({}, {}, {}, {}, {}, {})
        for i in range(self.num_envs):
            out.obs[i] = {a: _item(obs, i)}
            out.infos[i] = {a: _infos_of(infos, i)}
            out.terminateds[i], out.truncateds[i] = {ALL_AGENTS: False}, {ALL_AGENTS: False}
            self._last_obs[i] = out.obs[i][a]
        self._awaiting = set(range(self.num_envs))
        return out

    def _fail_step(self, exc: BaseException, hung: bool) -> PollResult:
        """Every running episode ends truncated at its last good observation."""
        error = describe_error(exc)
        ends = {i: truncated_end({DEFAULT_AGENT_ID: o}, error) for i, o in self._last_obs.items()}
        self._fail("step", exc, hung)
        out = PollResult({}, {}, {}, {}, {}, {})
        for i in sorted(ends):
            for field, value in zip(out[:5], ends[i]):  # obs, rewards, flags, infos
                field[i] = value
        return out

    def _invoke(self, method: str, arg: Any) -> Outcome:
        """One ``reset`` (``arg``: seed) or ``step`` (``arg``: actions) of the vector env,
        within ``step_timeout_s``."""
        from gymnasium.vector import AsyncVectorEnv

        vec, limit = self._vec, self.failure_handling.step_timeout_s
        if limit is not None and type(vec) is AsyncVectorEnv:
            try:
                if method == "reset":
                    vec.reset_async(seed=arg)
                    return vec.reset_wait(timeout=limit), None, False
                vec.step_async(arg)
                return vec.step_wait(timeout=limit), None, False
            except multiprocessing.TimeoutError:
                return None, TimeoutError(f"{method} timed out after {limit:g} s"), False
            except Exception as exc:
                return None, exc, False
        call = (lambda: vec.reset(seed=arg)) if method == "reset" else (lambda: vec.step(arg))
        what = {WHOLE_ENV: method}
        return run_calls(
            {WHOLE_ENV: call}, worker=self._failures.worker, timeout_s=limit, what=what
        )[WHOLE_ENV]

    def _bad_observations(self, obs: Any) -> Exception | None:
        if self._obs_check is None:
            return None
        for i in range(self.num_envs):
            try:
                self._obs_check(_item(obs, i), "observation", i)
            except ValueError as exc:
                return ValueError(f"sub-env {i}: {exc}")
        return None

    def _fail(self, method: str, exc: BaseException, hung: bool) -> None:
        """Counts a failure (raising :class:`HostEnvError` if told to or past a limit);
        retires the vector env: terminated (a hung one: never touched again), then
        rebuilt at the next poll (``"restart"``) or dropped."""
        vec = self._vec
        if hung or self.failure_handling.on_env_error != "raise":
            self._vec = None
            if vec is not None and not hung:
                _terminate(vec)
        # An AsyncVectorEnv that timed out still has the call pending in its processes.
        pending = hung or isinstance(exc, TimeoutError)
        self._failures.fail(WHOLE_ENV, method, exc, hung, pending)
        self._started = False
        self._awaiting.clear()
        self._actions.clear()
        self._last_obs.clear()
        if self.failure_handling.on_env_error == "drop":
            self._dropped = True

    def send_actions(self, actions: MultiEnvDict) -> None:
        """Answers the sub-envs of the last poll (all of those not done)."""
        a = DEFAULT_AGENT_ID
        for env_id, per_agent in actions.items():
            if env_id not in self._awaiting:
                raise KeyError(f"send_actions: env {env_id!r} is not waiting for an action")
            if not isinstance(per_agent, dict) or set(per_agent) != {a}:
                raise ValueError(
                    f"send_actions: env {env_id!r} needs an action for {a!r}, got {per_agent!r}"
                )
            action = np.asarray(per_agent[a])
            if not self._gym_action_space.contains(action.astype(self._gym_action_space.dtype)):
                raise ValueError(
                    f"send_actions: env {env_id!r}: {per_agent[a]!r} is not in "
                    f"{self._gym_action_space}"
                )
            self._actions[env_id] = action
        self._awaiting -= set(actions)

    def close(self) -> None:
        """Closes the vector env (an abandoned, hung one is never touched). Idempotent.

        Raises:
            HostEnvError: the vector env's ``close()`` raised (chained).
        """
        if self._closed:
            return
        self._closed = True
        self._failures.stop()
        vec, self._vec = self._vec, None
        if vec is None:
            return
        if self._failures.broken is not None:
            _terminate(vec)
            return
        try:
            vec.close()
        except Exception as exc:
            raise HostEnvError(
                f"close(): the vector env raised while closing: {describe_error(exc)}",
                method="close",
            ) from exc
