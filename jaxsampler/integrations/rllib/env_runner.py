"""``JaxEnvRunner``: an RLlib ``EnvRunner`` whose sampling is a jaxsampler ``Sampler``.

::

    from ray.rllib.algorithms.ppo import PPOConfig
    from jaxsampler.integrations.rllib import JaxEnvRunner

    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(env_runner_cls=JaxEnvRunner, num_env_runners=0, num_envs_per_env_runner=64)
    )
    algo = config.build_algo()
    algo.train()          # RLlib's learner, metrics and checkpoints; jaxsampler's rollouts

What the runner does, next to RLlib's ``SingleAgentEnvRunner``:

* **The env** resolves through :func:`jaxsampler.make`: built-in ids (``"CartPole-v1"``,
  ``"Pendulum-v1"``, ...) and suite ids (``"gymnax:<id>"``, ``"brax:<name>"``,
  ``"jumanji:<id>"``, ...) become a pure-JAX env sampled on the
  device in whole jitted chunks; ``"gym:<id>"``, Gymnasium ids that jaxsampler has no
  native env for, env creators registered with ``ray.tune.register_env`` and callables
  returning a Gymnasium env are stepped on the host (jaxsampler's host sampler, one
  jitted policy call per step). ``config.env_config`` goes to the env's constructor.
* **The module** is built from the config exactly as RLlib's runner builds it (inference
  only) and mirrored by
  :func:`jaxsampler.integrations.rllib.module.policy_from_rl_module` into a flax
  policy; every ``set_state`` that carries module weights updates the torch module (for
  ``get_state`` and checkpoints) and the flax params. Weights are data, so a weight sync
  never retraces the rollout (:attr:`JaxEnvRunner.num_policy_traces` counts traces).
* **Modules**: RLlib's default PPO module (``PPOConfig``) and default DQN module
  (``DQNConfig``; MLP encoder, dueling or plain Q heads, ``num_atoms=1``).
* **Actions**: ``explore=True`` samples from the action distribution (PPO) or is
  epsilon-greedy on the Q-values (DQN: with probability epsilon a uniformly random action,
  else the argmax; epsilon is the module's schedule at :meth:`JaxEnvRunner.timestep`, the
  lifetime env step at the start of the call, passed to the jitted rollout as data),
  ``explore=False`` acts greedily (argmax / mean), ``random_actions=True`` samples
  uniformly. Box actions
  follow RLlib's module-to-env defaults: with ``config.normalize_actions`` (default) the
  env receives ``low + (a + 1) * (high - low) / 2`` clipped to the bounds (bounded float
  Boxes), with ``config.clip_actions`` the clipped action; the episode stores the
  module's raw action either way.
* **Episodes**: ``sample()`` returns RLlib ``SingleAgentEpisode`` objects (via
  :func:`jaxsampler.integrations.rllib.convert.to_rllib`), finished ones first, then ongoing chunks
  that continue in the next call with the same ``id_`` and a lookback of
  ``config.episode_lookback_horizon`` steps. Extra model outputs are what RLlib's runner
  stores: ``action_dist_inputs``, ``action_logp`` and ``weights_seq_no`` for PPO,
  ``weights_seq_no`` alone for DQN (RLlib's replay buffers and DQN learner take these
  episodes as they take RLlib's own runner's).
* **Metrics** go through the runner's ``MetricsLogger`` under RLlib's keys
  (``num_env_steps_sampled(_lifetime)``, ``num_episodes(_lifetime)``,
  ``episode_return_mean/min/max``, ``episode_len_mean/min/max``, per-agent and
  per-module steps and returns, ``sample``/``time_between_sampling`` timers,
  ``weights_seq_no``), plus the time split of a call under ``jaxsampler``
  (``rollout_s``: device rollout and host copy; ``to_episodes_s``: buffers to
  jaxsampler episodes; ``to_rllib_s``: conversion to RLlib's classes).

Deviations from RLlib's runner, each forced by whole-chunk device sampling:

* ``sample(num_timesteps=N)`` runs one chunk of ``rollout_fragment_length`` steps per env,
  then short top-up chunks (1/16 of that) until ``N`` env steps are reached, so a call
  returns at least ``N`` steps and at most one top-up chunk more (RLlib: fewer than
  ``N + num_envs``);
* DQN's epsilon is fixed for a call: this runner passes ``t = (L // N) * N`` at the start
  of the call, with ``L`` its own lifetime env steps counted as they are sampled and ``N``
  the number of env runners; RLlib's runner passes ``(L // N + ts) * N`` at every vector
  step, with ``ts`` the call's steps so far and ``L`` as of the last state sync;
* ``episode_duration_sec_mean`` is each episode's share of the sampling wall time (the
  envs step together on the device; there is no per-episode clock);
* ``random_actions=True`` with normalized bounded Box actions samples uniformly in the
  module's ``[-1, 1]`` range (so the env sees uniform actions over its bounds) and stores
  that raw action, where RLlib stores the env-space sample;
* no per-step ``on_episode_*`` callbacks (the steps run on the device); ``on_sample_end``
  runs; custom env-to-module / module-to-env connectors are refused at construction.

The multi-agent variant is :class:`JaxMultiAgentEnvRunner`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Collection
from typing import Any

import gymnasium as gym
import numpy as np

from jaxsampler.integrations.rllib import require_rllib

require_rllib()

from ray.rllib.callbacks.utils import make_callback  # noqa: E402
from ray.rllib.core import (  # noqa: E402
    COMPONENT_ENV_TO_MODULE_CONNECTOR,
    COMPONENT_MODULE_TO_ENV_CONNECTOR,
    COMPONENT_RL_MODULE,
    DEFAULT_AGENT_ID,
    DEFAULT_MODULE_ID,
)
from ray.rllib.env import INPUT_ENV_SINGLE_SPACES, INPUT_ENV_SPACES  # noqa: E402
from ray.rllib.env.env_runner import EnvRunner  # noqa: E402
from ray.rllib.utils import force_list  # noqa: E402
from ray.rllib.utils.checkpoints import Checkpointable  # noqa: E402
from ray.rllib.utils.metrics import (  # noqa: E402
    EPISODE_DURATION_SEC_MEAN,
    EPISODE_LEN_MAX,
    EPISODE_LEN_MEAN,
    EPISODE_LEN_MIN,
    EPISODE_RETURN_MAX,
    EPISODE_RETURN_MEAN,
    EPISODE_RETURN_MIN,
    NUM_AGENT_STEPS_SAMPLED,
    NUM_AGENT_STEPS_SAMPLED_LIFETIME,
    NUM_ENV_STEPS_SAMPLED,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_EPISODES,
    NUM_EPISODES_LIFETIME,
    NUM_MODULE_STEPS_SAMPLED,
    NUM_MODULE_STEPS_SAMPLED_LIFETIME,
    SAMPLE_TIMER,
    TIME_BETWEEN_SAMPLING,
    WEIGHTS_SEQ_NO,
)

from jaxsampler.envs.base import Env  # noqa: E402
from jaxsampler.host_envs import GymnasiumHostEnv  # noqa: E402
from jaxsampler.integrations.rllib.runner_parts import (  # noqa: E402
    ActionToEnv,
    RunnerPolicy,
    UnsquashActions,
    action_transform,
    check_connectors,
    construction_error_spaces,
    raise_remote_construction_error,
    resolve_env,
    topup_length,
)
from jaxsampler.sampling.device import DeviceSampler  # noqa: E402
from jaxsampler.sampling.device.single import EpisodeColumns  # noqa: E402
from jaxsampler.sampling.host import HostSampler  # noqa: E402
from jaxsampler.spaces import from_gymnasium_space  # noqa: E402

__all__ = ["JaxEnvRunner"]

#: Extra model outputs RLlib's own runner stores for the default PPO module (for the DQN
#: module: none, its forward passes return only actions).
_RLLIB_EXTRAS = ("action_dist_inputs", "action_logp")
_MODE_EXPLORE, _MODE_GREEDY, _MODE_RANDOM = 0, 1, 2


class JaxEnvRunner(EnvRunner, Checkpointable):
    """RLlib's single-agent ``EnvRunner`` role, sampled by a jaxsampler ``Sampler``.

    Built by RLlib from ``config.env_runners(env_runner_cls=JaxEnvRunner, ...)``; see the
    module docstring for what it supports and where it deviates from RLlib's
    ``SingleAgentEnvRunner``.

    Args:
        config: the ``AlgorithmConfig`` (env, ``num_envs_per_env_runner``,
            ``rollout_fragment_length``, ``episode_lookback_horizon``, ``explore``,
            ``normalize_actions`` / ``clip_actions``, ``seed``, the RLModule spec).
        **kwargs: RLlib's ``worker_index``, ``num_workers``, ``spaces``, ...

    Raises:
        ValueError: a multi-agent config (use :class:`JaxMultiAgentEnvRunner`), custom
            connectors, no env, or an env id neither jaxsampler nor Gymnasium knows.
        TypeError: an env, space or RLModule the runner cannot mirror; the message names
            the supported ones.
    """

    #: whether this runner samples multi-agent envs (the subclass sets it)
    _multi_agent = False

    def __init__(self, *, config: Any, **kwargs: Any):
        super().__init__(config=config, **kwargs)
        # the driver's runner re-raises a remote runner's construction error (RLlib hands it
        # the remote runner's spaces first, see runner_parts.construction_error_spaces)
        raise_remote_construction_error(kwargs.get("spaces"))
        self._construction_error: Exception | None = None
        try:
            self._construct(kwargs)
        except Exception as e:
            if not self.worker_index:  # the local runner (in the driver): raise now
                raise
            # A remote runner (a Ray actor) stays up to hand the error to the driver: RLlib
            # would log it, take the actor out of service and fail later with IndexError.
            self._construction_error = e

    def _construct(self, kwargs: dict[str, Any]) -> None:
        """``__init__``'s work after RLlib's ``EnvRunner`` part."""
        if self.config.is_multi_agent and not self._multi_agent:
            raise ValueError(
                "JaxEnvRunner is single-agent; for config.multi_agent(...) use "
                "env_runner_cls=jaxsampler.integrations.rllib.JaxMultiAgentEnvRunner"
            )
        check_connectors(self.config)
        self.spaces = kwargs.get("spaces", {}) or {}
        self._callbacks = [cls() for cls in force_list(self.config.callbacks_class)]
        self.num_envs: int = int(self.config.num_envs_per_env_runner)
        self._fragment = int(self.config.get_rollout_fragment_length(self.worker_index))
        self.env: Any = None
        self._sampler: Any = None
        self.make_env()
        self._env_to_module = self.config.build_env_to_module_connector(
            spaces=self.get_spaces(), device=None
        )
        self._module_to_env = self.config.build_module_to_env_connector(spaces=self.get_spaces())
        self.module: Any = None
        self.make_module()
        self._weights_seq_no = 0
        self._needs_initial_reset = True
        self._time_after_sampling: float | None = None
        #: seconds of the last ``sample()``: ``rollout_s`` (device rollout and host copy,
        #: or host env steps), ``to_episodes_s`` (buffers -> episodes: RLlib's episodes
        #: built straight from the columns for pure-JAX envs, jaxsampler's for host envs),
        #: ``to_rllib_s`` (jaxsampler -> RLlib episodes; host envs only, else 0),
        #: ``bookkeeping_s`` (counters, metrics)
        self.last_sample_timing: dict[str, float] = {}
        # per-episode returns of the last device call's chunks (None: read the buffers)
        self._chunk_returns: list[float] | None = None
        # id_ -> [length, return, duration] of the chunks already returned, for metrics
        self._ongoing_for_metrics: dict[str, Any] = {}
        self._done_for_metrics: list[Any] = []
        self._build_sampler()

    # ------------------------------------------------------------------ construction

    def make_env(self) -> None:
        """Resolves ``config.env`` into a pure-JAX env (device sampler) or host envs.

        Sets ``self.env`` (the jaxsampler env, or the Gymnasium env factory for host
        envs) and the Gymnasium single spaces; a second call (RLlib re-making a failed
        env) closes the old sampler and builds a new one (all envs reset).
        """
        if self._sampler is not None:
            self._sampler.close()
            self._sampler = None
        resolved = resolve_env(
            self.config, self.worker_index, self.num_workers, multi_agent=self._multi_agent
        )
        self.env = resolved.env
        self._host_factory: Callable[[], Any] | None = resolved.host_factory
        self._gym_obs_space, self._gym_act_space = resolved.observation_space, resolved.action_space
        self._check_spaces()
        self._needs_initial_reset = True
        if getattr(self, "_js_policy", None) is not None or getattr(self, "_js_policies", None):
            self._build_sampler()  # a re-made env (e.g. after an env failure) samples again

    def _check_spaces(self) -> None:
        for what, space in (("observation", self._gym_obs_space), ("action", self._gym_act_space)):
            if not isinstance(space, (gym.spaces.Box, gym.spaces.Discrete)):
                raise TypeError(
                    f"{type(self).__name__} supports Box or Discrete {what} spaces (RLlib's "
                    f"default MLP module), got {space!r}"
                )

    def make_module(self) -> None:
        """Builds RLlib's (inference-only) RLModule from the config and mirrors it.

        Raises:
            TypeError: the module is not one :func:`policy_from_rl_module` supports.
        """
        from jaxsampler.integrations.rllib.module import policy_from_rl_module

        spec = self.config.get_rl_module_spec(spaces=self.get_spaces(), inference_only=True)
        self.module = spec.build()
        self._js_policy, params = policy_from_rl_module(self.module)
        self._params: Any = params

    def _build_sampler(self) -> None:
        obs_space = from_gymnasium_space(self._gym_obs_space)
        act_space = from_gymnasium_space(self._gym_act_space)
        transform = action_transform(
            self._gym_act_space, self.config.normalize_actions, self.config.clip_actions
        )
        self._policy = RunnerPolicy(
            observation_space=obs_space,
            action_space=act_space,
            explore_policy=_with_explore(self._js_policy, True),
            greedy_policy=_with_explore(self._js_policy, False),
            random_low=-1.0 if transform == "unsquash" else None,
            keep_extras=_rllib_extras(self._js_policy),
        )
        seed = 0 if self._seed is None else int(self._seed)
        horizon = int(self.config.episode_lookback_horizon)
        if isinstance(self.env, Env):
            env = self.env if transform == "none" else ActionToEnv(self.env, transform)
            self._sampler = DeviceSampler(
                env,
                self._policy,
                num_envs=self.num_envs,
                rollout_length=self._fragment,
                seed=seed,
                episode_lookback_horizon=horizon,
                topup_length=topup_length(self._fragment),
                episode_factory=self._episodes_from_columns,
            )
        else:
            factory = self._host_factory
            assert factory is not None
            if transform != "none":
                inner = factory

                def factory() -> Any:
                    return UnsquashActions(inner(), transform)

            self._sampler = HostSampler(
                GymnasiumHostEnv([factory] * self.num_envs, seed=seed),
                self._policy,
                rollout_length=topup_length(self._fragment),
                seed=seed,
                episode_lookback_horizon=horizon,
            )

    # ------------------------------------------------------------------ sampling

    def sample(
        self,
        *,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        explore: bool | None = None,
        random_actions: bool = False,
        force_reset: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        """Samples ``num_timesteps`` env steps or ``num_episodes`` episodes (RLlib's API).

        Args:
            num_timesteps: at least this many env steps (reset steps not counted).
            num_episodes: reset all envs, then sample until this many episodes ended.
            explore: sample actions (True) or act greedily (False); default
                ``config.explore``.
            random_actions: uniformly random actions instead of the module's.
            force_reset: reset all envs first (ongoing episodes are dropped).

        Neither count: ``rollout_fragment_length * num_envs`` steps with
        ``batch_mode="truncate_episodes"``, else ``num_envs`` episodes.

        Returns:
            RLlib ``SingleAgentEpisode`` objects, numpy'ized: finished episodes first,
            then the ongoing chunks (``t > 0``).
        """
        self._raise_construction_error()
        if num_timesteps is not None and num_episodes is not None:
            raise ValueError("sample(): give num_timesteps or num_episodes, not both")
        if self._time_after_sampling is not None:
            self.metrics.log_value(
                TIME_BETWEEN_SAMPLING, time.perf_counter() - self._time_after_sampling
            )
        self.metrics.log_value(WEIGHTS_SEQ_NO, self._weights_seq_no, window=1)
        with self.metrics.log_time(SAMPLE_TIMER):
            if explore is None:
                explore = self.config.explore
            if num_timesteps is None and num_episodes is None:
                if self.config.batch_mode == "truncate_episodes":
                    num_timesteps = self._fragment * self.num_envs
                else:
                    num_episodes = self.num_envs
            reset = force_reset or num_episodes is not None or self._needs_initial_reset
            if reset:
                self._ongoing_for_metrics.clear()
            self._chunk_returns = None
            if num_timesteps == 0 or num_episodes == 0:
                js_episodes: list[Any] = []
                steps, t0 = 0, time.perf_counter()
            else:
                mode = (
                    _MODE_RANDOM if random_actions else (_MODE_EXPLORE if explore else _MODE_GREEDY)
                )
                module_params = self._explore_params() if mode == _MODE_EXPLORE else self._params
                params = self._policy.call_params(module_params, mode, self._weights_seq_no)
                t0 = time.perf_counter()
                js_episodes = self._sampler.sample(
                    params,
                    num_timesteps=num_timesteps,
                    num_episodes=num_episodes,
                    force_reset=force_reset or self._needs_initial_reset,
                )
                steps = int(self._sampler.metrics.num_env_steps_sampled)
            self._needs_initial_reset = num_episodes is not None
            t1 = time.perf_counter()
            episodes = self._to_rllib(js_episodes)
            t2 = time.perf_counter()
            if random_actions:
                self._strip_model_outputs(episodes)
            self._bookkeep(episodes, steps, t1 - t0)
            split = getattr(self._sampler, "last_split", (t1 - t0, 0.0))
            self.last_sample_timing = {
                "rollout_s": split[0],
                "to_episodes_s": split[1],
                "to_rllib_s": t2 - t1,
                "bookkeeping_s": time.perf_counter() - t2,
            }
            self._log_split(self._sampler, t2 - t1)
            self.num_env_steps_sampled_lifetime += steps
            make_callback(
                "on_sample_end",
                callbacks_objects=self._callbacks,
                callbacks_functions=self.config.callbacks_on_sample_end,
                kwargs=dict(env_runner=self, metrics_logger=self.metrics, samples=episodes),
            )
        self._time_after_sampling = time.perf_counter()
        return episodes

    def _explore_params(self) -> Any:
        """The mirrored module's params for an exploring call: DQN's carry the epsilon of
        :meth:`timestep` (same structure and dtypes every call: no retrace)."""
        return self._js_policy.at_timestep(self._params, self.timestep())

    def timestep(self) -> int:
        """The lifetime env step RLlib's runner passes to ``forward_exploration`` at the
        start of a call (``t`` of DQN's epsilon schedule): this runner's lifetime count
        (the global one after each training iteration's state sync), rounded down to a
        multiple of the number of env runners as RLlib rounds it."""
        runners = self.config.num_env_runners or 1
        return int(self.num_env_steps_sampled_lifetime) // runners * runners

    def _to_rllib(self, episodes: list[Any]) -> list[Any]:
        """The sampler's episodes as RLlib's: device envs' already are (the sampler's
        episode factory), a host sampler's are converted here."""
        from jaxsampler.integrations.rllib.convert import to_rllib

        return episodes if self._chunk_returns is not None else to_rllib(episodes)

    def _episodes_from_columns(self, columns: EpisodeColumns) -> list[Any]:
        """The device sampler's episode factory: RLlib's episodes straight from the call's
        columns (:func:`~jaxsampler.integrations.rllib.convert.rllib_episodes`), and each chunk's
        return for the metrics, one vectorized pass over the reward column."""
        from jaxsampler.integrations.rllib.convert import rllib_episodes

        rewards = np.asarray(columns.rewards, np.float64)
        cum = np.zeros((rewards.shape[0], rewards.shape[1] + 1))
        np.cumsum(rewards, axis=1, out=cum[:, 1:])
        env = np.asarray(columns.env, np.intp)
        own = np.asarray(columns.first, np.intp) + np.asarray(columns.lookback, np.intp)
        stop = np.asarray(columns.stop, np.intp)
        self._chunk_returns = (cum[env, stop] - cum[env, own]).tolist()
        return rllib_episodes(columns)

    def _strip_model_outputs(self, episodes: list[Any]) -> None:
        """Random-action steps carry no module outputs (as in RLlib's runner)."""
        for ep in episodes:
            for key in self._policy.keep_extras:
                ep.extra_model_outputs.pop(key, None)

    def _bookkeep(self, episodes: list[Any], steps: int, wall_s: float) -> None:
        """Per-call counters now; per-episode stats kept for :meth:`get_metrics` (the
        chunks' returns as the episode factory computed them, else read off each chunk)."""
        returns = self._chunk_returns
        per_step_s = wall_s * self.num_envs / max(steps, 1)
        num_done = 0
        ongoing, done = self._ongoing_for_metrics, self._done_for_metrics
        pop = ongoing.pop
        if returns is None:
            returns = [_chunk_return(ep) for ep in episodes]
        for ep, ret in zip(episodes, returns):
            own = ep.t - ep.t_started
            length = own
            prev = pop(ep.id_, None)
            if prev is not None:
                length, ret = length + int(prev[0]), ret + prev[1]
                dur = prev[2] + own * per_step_s
            else:
                dur = own * per_step_s
            if ep.is_terminated or ep.is_truncated:
                num_done += 1
                done.append((length, ret, dur))
            else:
                ongoing[ep.id_] = [length, ret, dur]
        m = self.metrics
        m.log_value(NUM_ENV_STEPS_SAMPLED, steps, reduce="sum")
        m.log_value((NUM_AGENT_STEPS_SAMPLED, DEFAULT_AGENT_ID), steps, reduce="sum")
        m.log_value((NUM_MODULE_STEPS_SAMPLED, DEFAULT_MODULE_ID), steps, reduce="sum")
        m.log_value(NUM_EPISODES, num_done, reduce="sum")
        m.log_value(
            NUM_ENV_STEPS_SAMPLED_LIFETIME, steps, reduce="lifetime_sum", with_throughput=True
        )
        m.log_value(
            (NUM_AGENT_STEPS_SAMPLED_LIFETIME, DEFAULT_AGENT_ID), steps, reduce="lifetime_sum"
        )
        m.log_value(
            (NUM_MODULE_STEPS_SAMPLED_LIFETIME, DEFAULT_MODULE_ID), steps, reduce="lifetime_sum"
        )
        m.log_value(NUM_EPISODES_LIFETIME, num_done, reduce="lifetime_sum")

    def _log_split(self, sampler: Any, to_rllib_s: float) -> None:
        split = getattr(sampler, "last_split", None)
        if split is not None:
            self.metrics.log_value(("jaxsampler", "rollout_s"), split[0], window=1)
            self.metrics.log_value(("jaxsampler", "to_episodes_s"), split[1], window=1)
        self.metrics.log_value(("jaxsampler", "to_rllib_s"), to_rllib_s, window=1)

    def _metrics_window(self) -> int:
        """RLlib's smoothing window per runner: ``metrics_num_episodes_for_smoothing``
        spread over the env runners (at least 1)."""
        runners = self.config.num_env_runners or 1
        return max(1, math.ceil(self.config.metrics_num_episodes_for_smoothing / runners))

    def get_metrics(self) -> Any:
        """Logs the finished episodes' length / return / duration and returns the reduced
        metrics (RLlib's keys; see the module docstring)."""
        win = self._metrics_window()
        m = self.metrics
        for length, ret, dur in self._done_for_metrics:
            m.log_value(EPISODE_LEN_MEAN, length, window=win)
            m.log_value(EPISODE_RETURN_MEAN, ret, window=win)
            m.log_value(EPISODE_DURATION_SEC_MEAN, dur, window=win)
            m.log_value(("agent_episode_return_mean", DEFAULT_AGENT_ID), ret, window=win)
            m.log_value(("module_episode_return_mean", DEFAULT_MODULE_ID), ret, window=win)
            m.log_value(EPISODE_LEN_MIN, length, reduce="min", window=win)
            m.log_value(EPISODE_RETURN_MIN, ret, reduce="min", window=win)
            m.log_value(EPISODE_LEN_MAX, length, reduce="max", window=win)
            m.log_value(EPISODE_RETURN_MAX, ret, reduce="max", window=win)
        self._done_for_metrics.clear()
        return m.reduce()

    # ------------------------------------------------------------------ spaces, state

    def get_spaces(self) -> dict[str, Any]:
        """RLlib's spaces dict: vector env spaces, single spaces, and the module's (of a
        remote runner whose construction failed: its error, for the driver to raise)."""
        error = getattr(self, "_construction_error", None)
        if error is not None:
            return construction_error_spaces(error)
        obs, act = self._gym_obs_space, self._gym_act_space
        vec = gym.vector.utils.batch_space
        return {
            INPUT_ENV_SPACES: (vec(obs, self.num_envs), vec(act, self.num_envs)),
            INPUT_ENV_SINGLE_SPACES: (obs, act),
            DEFAULT_MODULE_ID: (obs, act),
        }

    def get_state(
        self,
        components: str | Collection[str] | None = None,
        *,
        not_components: str | Collection[str] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """RLlib's runner state: lifetime env steps, the module's state and
        ``weights_seq_no``, and the (default, stateless) connector pipelines' states."""
        self._raise_construction_error()
        state: dict[str, Any] = {
            NUM_ENV_STEPS_SAMPLED_LIFETIME: self.num_env_steps_sampled_lifetime
        }
        if self._check_component(COMPONENT_RL_MODULE, components, not_components):
            state[COMPONENT_RL_MODULE] = self.module.get_state(
                components=self._get_subcomponents(COMPONENT_RL_MODULE, components),
                not_components=self._get_subcomponents(COMPONENT_RL_MODULE, not_components),
                **kwargs,
            )
            state[WEIGHTS_SEQ_NO] = self._weights_seq_no
        if self._check_component(COMPONENT_ENV_TO_MODULE_CONNECTOR, components, not_components):
            state[COMPONENT_ENV_TO_MODULE_CONNECTOR] = self._env_to_module.get_state()
        if self._check_component(COMPONENT_MODULE_TO_ENV_CONNECTOR, components, not_components):
            state[COMPONENT_MODULE_TO_ENV_CONNECTOR] = self._module_to_env.get_state()
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Applies RLlib's runner state; module weights newer than ours (or
        ``weights_seq_no`` missing / 0) update the torch module and the flax params
        (same shapes: no retrace)."""
        import ray

        from jaxsampler.integrations.rllib.module import params_from_module_state

        if COMPONENT_ENV_TO_MODULE_CONNECTOR in state:
            self._env_to_module.set_state(state[COMPONENT_ENV_TO_MODULE_CONNECTOR])
        if COMPONENT_MODULE_TO_ENV_CONNECTOR in state:
            self._module_to_env.set_state(state[COMPONENT_MODULE_TO_ENV_CONNECTOR])
        if COMPONENT_RL_MODULE in state:
            seq = state.get(WEIGHTS_SEQ_NO, 0)
            if seq == 0 or self._weights_seq_no < seq:
                module_state = state[COMPONENT_RL_MODULE]
                if isinstance(module_state, ray.ObjectRef):
                    module_state = ray.get(module_state)
                if isinstance(module_state, dict) and DEFAULT_MODULE_ID in module_state:
                    module_state = module_state[DEFAULT_MODULE_ID]
                self.module.set_state(module_state)
                self._params = params_from_module_state(self._js_policy, module_state)
            if seq > 0:
                self._weights_seq_no = seq
        if NUM_ENV_STEPS_SAMPLED_LIFETIME in state:
            self.num_env_steps_sampled_lifetime = state[NUM_ENV_STEPS_SAMPLED_LIFETIME]

    def get_ctor_args_and_kwargs(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (), {"config": self.config}

    def get_metadata(self) -> dict[str, Any]:
        return Checkpointable.get_metadata(self)

    def get_checkpointable_components(self) -> list[tuple[str, Any]]:
        return [
            (COMPONENT_RL_MODULE, self.module),
            (COMPONENT_ENV_TO_MODULE_CONNECTOR, self._env_to_module),
            (COMPONENT_MODULE_TO_ENV_CONNECTOR, self._module_to_env),
        ]

    # ------------------------------------------------------------------ misc

    @property
    def num_policy_traces(self) -> int:
        """How often the sampling policy was traced (compiled); a weight sync adds none."""
        return self._policy.traces.count

    def _raise_construction_error(self) -> None:
        """A remote runner whose construction failed raises that error when it is asked to
        work (RLlib reads it from only one runner's spaces at ``build_algo()``; a restarted
        or other failed runner would otherwise fail later with an unrelated error)."""
        error = getattr(self, "_construction_error", None)
        if error is not None:
            raise error

    def assert_healthy(self) -> None:
        """Raises ``AssertionError`` unless the env, the module and the sampler exist (a
        remote runner whose construction failed passes: it stays up only to hand its
        error to the driver through :meth:`get_spaces`)."""
        if self._construction_error is not None:
            return
        assert self.env is not None and self.module is not None and self._sampler is not None

    def stop(self) -> None:
        """Closes the sampler (and its host envs, if any)."""
        if getattr(self, "_sampler", None) is not None:
            self._sampler.close()


def _with_explore(policy: Any, explore: bool) -> Any:
    """``policy`` with its ``explore`` switch set (a frozen dataclass field)."""
    if (
        dataclasses.is_dataclass(policy)
        and not isinstance(policy, type)
        and any(f.name == "explore" for f in dataclasses.fields(policy))
    ):
        return dataclasses.replace(policy, explore=explore)
    raise TypeError(
        f"the mirrored policy {type(policy).__name__} has no 'explore' switch; "
        "policy_from_rl_module must return a dataclass policy with an 'explore' field"
    )


def _rllib_extras(policy: Any) -> tuple[str, ...]:
    """The extra model outputs RLlib's own runner stores for the mirrored module: PPO's
    ``action_dist_inputs`` and ``action_logp``; none for DQN (its ``qf_preds`` stay in the
    rollout)."""
    from jaxsampler.integrations.rllib.dqn_module import DQNModulePolicy

    return () if isinstance(policy, DQNModulePolicy) else _RLLIB_EXTRAS


def _chunk_return(ep: Any) -> float:
    """``ep.get_return()`` of a numpy'ized RLlib episode chunk, read off the buffer."""
    rewards = ep.rewards
    data = rewards.data
    if isinstance(data, np.ndarray):
        return float(data[rewards.lookback :].sum(dtype=np.float64))
    return float(ep.get_return())
