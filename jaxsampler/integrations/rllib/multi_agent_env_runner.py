"""``JaxMultiAgentEnvRunner``: RLlib's multi-agent ``EnvRunner`` role on a pure-JAX
multi-agent env, sampled by a jaxsampler ``Sampler``.

::

    config = (
        PPOConfig()
        .environment("Spread-v0")
        .multi_agent(
            policies={"p0", "p1"},
            policy_mapping_fn=lambda aid, episode, **kw: "p0" if aid == "agent_0" else "p1",
        )
        .env_runners(env_runner_cls=JaxMultiAgentEnvRunner, num_env_runners=0)
    )

Everything :class:`~jaxsampler.integrations.rllib.env_runner.JaxEnvRunner` says holds, per module:
RLlib's ``MultiRLModule`` is built from the config (inference only), each of its modules
mirrored by :func:`~jaxsampler.integrations.rllib.module.policy_from_rl_module`, and the agents are
mapped onto them by a :class:`jaxsampler.MultiAgentPolicy` (one jitted step for all
policies). ``sample()`` returns RLlib ``MultiAgentEpisode`` objects (built straight from the
chunks' column arrays, equal to ``to_rllib``'s);
metrics add RLlib's per-agent and per-module keys.

Agents' done flags are RLlib's by default (``rllib_compatible=True``): on an episode's
last step every agent stepped there is terminated, also at a time limit, as RLlib's
``MultiAgentEpisode`` records it, so the train batches (value targets included) are those
of RLlib's own runner; ``env_runner_cls=JaxMultiAgentEnvRunner.with_options(
rllib_compatible=False)`` keeps the env's own flags (a time limit truncates, and GAE
bootstraps there).

Limits: the env must be a pure-JAX multi-agent env (``Spread-v0``, ``TicTacToe-v0``,
``Goals-v0``, a suite id such as ``"jaxmarl:MPE_simple_spread_v3"``, a
``js.MultiAgentEnv``, ``js.envs.from_jaxmarl(...)``) whose agents share one
observation and one action space; ``policy_mapping_fn`` is called once per agent with
``episode=None`` (the mapping is static); ``num_timesteps`` counts env steps
(``count_steps_by="env_steps"``). Every ``js.make`` suite id resolves; the spaces must
still suit RLlib's default MLP module (``"pgx:<id>"`` games have masked ``Dict``
observations: ``TypeError`` naming the spaces).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

import gymnasium as gym
import numpy as np

from jaxsampler.integrations.rllib import require_rllib

require_rllib()

from ray.rllib.core import COMPONENT_RL_MODULE  # noqa: E402
from ray.rllib.env import INPUT_ENV_SINGLE_SPACES, INPUT_ENV_SPACES  # noqa: E402
from ray.rllib.utils.metrics import (  # noqa: E402
    EPISODE_AGENT_RETURN_MEAN,
    EPISODE_AGENT_STEPS,
    EPISODE_DURATION_SEC_MEAN,
    EPISODE_LEN_MAX,
    EPISODE_LEN_MEAN,
    EPISODE_LEN_MIN,
    EPISODE_MODULE_RETURN_MEAN,
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
    WEIGHTS_SEQ_NO,
)

from jaxsampler.integrations.rllib.env_runner import _RLLIB_EXTRAS, JaxEnvRunner, _with_explore  # noqa: E402
from jaxsampler.integrations.rllib.multi_episodes import (  # noqa: E402
    chunk_stats,
    rllib_multi_agent_episodes,
)
from jaxsampler.integrations.rllib.runner_parts import (  # noqa: E402
    RunnerPolicy,
    construction_error_spaces,
    topup_length,
)
from jaxsampler.policies.multi import MultiAgentPolicy  # noqa: E402
from jaxsampler.sampling.device import DeviceSampler  # noqa: E402
from jaxsampler.spaces import from_gymnasium_space  # noqa: E402

__all__ = ["JaxMultiAgentEnvRunner"]


class JaxMultiAgentEnvRunner(JaxEnvRunner):
    """RLlib's multi-agent ``EnvRunner`` role on a pure-JAX multi-agent env.

    Built by RLlib from ``config.env_runners(env_runner_cls=JaxMultiAgentEnvRunner)``;
    see the module docstring.

    Raises:
        TypeError: a host-stepped env, agents with different spaces, or a module
            :func:`~jaxsampler.integrations.rllib.module.policy_from_rl_module` cannot mirror.
        ValueError: an unknown env id, custom connectors, a mapping to an unknown module.
    """

    _multi_agent = True

    #: agents' done flags as RLlib's own ``MultiAgentEnvRunner`` records them (its
    #: ``MultiAgentEpisode.add_env_step``): on an episode's last step every agent stepped
    #: there is terminated, also on a time limit (and truncated too then), so the train
    #: batch, value targets included, is RLlib's (no bootstrap at a time limit). ``False``:
    #: each agent keeps the env's own flags (a time limit truncates, and GAE bootstraps
    #: from the value of the last observation). Default ``True``, what RLlib users switching
    #: runners want (the same batches as RLlib's runner); :meth:`with_options` sets it.
    rllib_compatible: bool = True

    @classmethod
    def with_options(cls, *, rllib_compatible: bool = True) -> type[JaxMultiAgentEnvRunner]:
        """A subclass with the given options, for ``config.env_runners(env_runner_cls=...)``
        (RLlib builds runners from a class; the options travel with it to Ray actors)::

            env_runner_cls=JaxMultiAgentEnvRunner.with_options(rllib_compatible=False)
        """
        if not isinstance(rllib_compatible, bool):
            raise TypeError(
                f"rllib_compatible must be a bool, got {type(rllib_compatible).__name__}"
            )
        name = f"{cls.__name__}(rllib_compatible={rllib_compatible})"
        return type(name, (cls,), {"rllib_compatible": rllib_compatible, "__module__": __name__})

    # ------------------------------------------------------------------ construction

    def _check_spaces(self) -> None:
        super()._check_spaces()
        env = self.env
        self.agent_ids: tuple[str, ...] = tuple(env.agent_ids)
        fn: Any = self.config.policy_mapping_fn
        if fn is type(self.config).DEFAULT_POLICY_MAPPING_FN:
            fn = type(self.config).DEFAULT_AGENT_TO_MODULE_MAPPING_FN
        self._mapping = {aid: fn(aid, None) for aid in self.agent_ids}
        unknown = sorted(set(self._mapping.values()) - set(self.config.policies))
        if unknown:
            raise ValueError(
                f"policy_mapping_fn maps agents to {unknown}, not in config.policies "
                f"{sorted(self.config.policies)}"
            )
        layout = getattr(env, "agent_layout", None)
        for mid in sorted(set(self._mapping.values())):
            if layout is None:
                break
            agents = [a for a in self.agent_ids if self._mapping[a] == mid]
            groups = sorted({layout.group_of(a).name for a in agents})
            if len(groups) > 1:
                raise TypeError(
                    f"module {mid!r} is mapped to agents {agents} of the agent groups {groups}, "
                    "whose spaces differ: map each module to the agents of one group"
                )

    def make_module(self) -> None:
        """Builds RLlib's (inference-only) ``MultiRLModule`` and mirrors every module."""
        from jaxsampler.integrations.rllib.module import RLModulePolicy, policy_from_rl_module

        spec = self.config.get_multi_rl_module_spec(spaces=self.get_spaces(), inference_only=True)
        self.module = spec.build()
        self._js_policies: dict[str, Any] = {}
        params: dict[str, Any] = {}
        for mid in sorted(set(self._mapping.values())):
            self._js_policies[mid], params[mid] = policy_from_rl_module(self.module[mid])
            if not isinstance(self._js_policies[mid], RLModulePolicy):
                raise TypeError(
                    f"JaxMultiAgentEnvRunner mirrors RLlib's default PPO module; module "
                    f"{mid!r} is a {type(self.module[mid]).__name__} (DQN is mirrored by the "
                    "single-agent JaxEnvRunner only)"
                )
        self._params = params

    def _explore_params(self) -> Any:
        """The mirrored modules' params as they are (PPO's exploration has no schedule)."""
        return self._params

    def _build_sampler(self) -> None:
        obs_space = from_gymnasium_space(self._gym_obs_space)
        act_space = from_gymnasium_space(self._gym_act_space)

        def mapped(explore: bool) -> MultiAgentPolicy:
            policies = {mid: _with_explore(p, explore) for mid, p in self._js_policies.items()}
            return MultiAgentPolicy(self.env, policies, lambda aid: self._mapping[aid])

        self._policy = RunnerPolicy(
            observation_space=obs_space,
            action_space=act_space,
            explore_policy=mapped(True),
            greedy_policy=mapped(False),
            random_low=None,
            keep_extras=_RLLIB_EXTRAS,
        )
        self._sampler = DeviceSampler(
            self.env,
            self._policy,
            num_envs=self.num_envs,
            rollout_length=self._fragment,
            seed=0 if self._seed is None else int(self._seed),
            episode_lookback_horizon=int(self.config.episode_lookback_horizon),
            rllib_compatible=self.rllib_compatible,
            topup_length=topup_length(self._fragment),
        )

    # ------------------------------------------------------------------ sampling

    def _strip_model_outputs(self, episodes: list[Any]) -> None:
        for ep in episodes:
            for sa in ep.agent_episodes.values():
                for key in _RLLIB_EXTRAS:
                    sa.extra_model_outputs.pop(key, None)

    def _to_rllib(self, episodes: list[Any]) -> list[Any]:
        """RLlib's ``MultiAgentEpisode`` chunks built straight from the sampler's chunks'
        column arrays (:func:`.multi_episodes.rllib_multi_agent_episodes`)."""
        return rllib_multi_agent_episodes(episodes)

    def _bookkeep(self, episodes: list[Any], steps: int, wall_s: float) -> None:
        """Per-call counters now; each chunk's length, duration and per-agent returns and
        steps (one vectorized pass, :func:`chunk_stats`) added to its episode's earlier
        chunks, and kept for :meth:`get_metrics` once the episode is done."""
        per_step_s = wall_s * self.num_envs / max(steps, 1)
        st = chunk_stats(episodes, self.agent_ids)
        length, returns, agent_steps, present = st.length, st.returns, st.steps, st.present
        # this call's agents (before adding earlier chunks)
        seen: np.ndarray = np.asarray(present.any(axis=0))
        per_agent = agent_steps.sum(axis=0)
        ongoing = self._ongoing_for_metrics
        ids = [ep.id_ for ep in episodes]
        prev_rows = [row for row, id_ in enumerate(ids) if id_ in ongoing]
        duration = length * per_step_s
        if prev_rows:  # chunks continuing an episode: add its earlier chunks' sums
            prev = [ongoing.pop(ids[row]) for row in prev_rows]
            rows = np.asarray(prev_rows, np.intp)
            length = length.copy()
            length[rows] += [p.length for p in prev]
            duration[rows] += [p.duration for p in prev]
            returns[rows] += np.stack([p.returns for p in prev])
            present[rows] |= np.stack([p.present for p in prev])
            agent_steps_total = agent_steps.copy()
            agent_steps_total[rows] += np.stack([p.steps for p in prev])
        else:
            agent_steps_total = agent_steps
        done = np.fromiter((ep.is_done for ep in episodes), bool, len(episodes))
        for row in np.flatnonzero(~done).tolist():
            ongoing[ids[row]] = _EpisodeSums(
                int(length[row]),
                float(duration[row]),
                returns[row],
                agent_steps_total[row],
                present[row],
            )
        if done.any():
            self._done_for_metrics.append(
                _EpisodeSums(
                    length[done],
                    duration[done],
                    returns[done],
                    agent_steps_total[done],
                    present[done],
                )
            )
        m = self.metrics
        m.log_value(NUM_ENV_STEPS_SAMPLED, steps, reduce="sum")
        m.log_value(
            NUM_ENV_STEPS_SAMPLED_LIFETIME, steps, reduce="lifetime_sum", with_throughput=True
        )
        num_done = int(done.sum())
        m.log_value(NUM_EPISODES, num_done, reduce="sum")
        m.log_value(NUM_EPISODES_LIFETIME, num_done, reduce="lifetime_sum")
        per_module: dict[str, int] = defaultdict(int)
        for a, aid in enumerate(self.agent_ids):
            if seen[a]:
                n = int(per_agent[a])
                m.log_value((NUM_AGENT_STEPS_SAMPLED, aid), n, reduce="sum")
                m.log_value((NUM_AGENT_STEPS_SAMPLED_LIFETIME, aid), n, reduce="lifetime_sum")
                per_module[self._mapping[aid]] += n
        for mid, n in per_module.items():
            m.log_value((NUM_MODULE_STEPS_SAMPLED, mid), n, reduce="sum")
            m.log_value((NUM_MODULE_STEPS_SAMPLED_LIFETIME, mid), n, reduce="lifetime_sum")

    def get_metrics(self) -> Any:
        """Logs the finished episodes' stats (RLlib's multi-agent keys) and returns the
        reduced metrics."""
        win = self._metrics_window()
        m = self.metrics
        aids = [str(a) for a in self.agent_ids]
        modules = [self._mapping[a] for a in self.agent_ids]
        for block in self._done_for_metrics:
            totals = block.returns.sum(axis=1).tolist()
            for i, (length, dur, rets, n, here) in enumerate(
                zip(
                    block.length.tolist(),
                    block.duration.tolist(),
                    block.returns.tolist(),
                    block.steps.tolist(),
                    block.present.tolist(),
                )
            ):
                module_returns: dict[str, float] = {}
                for mid, r, h in zip(modules, rets, here):
                    if h:
                        module_returns[mid] = module_returns.get(mid, 0.0) + r
                m.log_dict(
                    {
                        EPISODE_LEN_MEAN: length,
                        EPISODE_RETURN_MEAN: totals[i],
                        EPISODE_DURATION_SEC_MEAN: dur,
                        EPISODE_AGENT_RETURN_MEAN: {a: r for a, r, h in zip(aids, rets, here) if h},
                        EPISODE_AGENT_STEPS: {a: k for a, k, h in zip(aids, n, here) if h},
                        EPISODE_MODULE_RETURN_MEAN: module_returns,
                    },
                    window=win,
                )
                m.log_dict(
                    {EPISODE_LEN_MIN: length, EPISODE_RETURN_MIN: totals[i]},
                    reduce="min",
                    window=win,
                )
                m.log_dict(
                    {EPISODE_LEN_MAX: length, EPISODE_RETURN_MAX: totals[i]},
                    reduce="max",
                    window=win,
                )
        self._done_for_metrics.clear()
        return m.reduce()

    # ------------------------------------------------------------------ spaces, state

    def get_spaces(self) -> dict[str, Any]:
        """RLlib's spaces dict: per-agent ``Dict`` env spaces and each module's spaces (of
        a remote runner whose construction failed: its error, for the driver to raise)."""
        error = getattr(self, "_construction_error", None)
        if error is not None:
            return construction_error_spaces(error)
        obs, act = self._gym_obs_space, self._gym_act_space
        own = {aid: (obs, act) for aid in self.agent_ids}
        layout = getattr(self.env, "agent_layout", None)
        if layout is not None:  # agent groups: each agent's own spaces, each module its group's
            own = {
                aid: (
                    layout.observation_spaces[aid].to_gymnasium(),
                    layout.action_spaces[aid].to_gymnasium(),
                )
                for aid in self.agent_ids
            }
        env_obs = gym.spaces.Dict({aid: own[aid][0] for aid in self.agent_ids})
        env_act = gym.spaces.Dict({aid: own[aid][1] for aid in self.agent_ids})
        first: dict[str, tuple[Any, Any]] = {}
        for aid in self.agent_ids:
            first.setdefault(self._mapping[aid], own[aid])
        return {
            INPUT_ENV_SPACES: (env_obs, env_act),
            INPUT_ENV_SINGLE_SPACES: (env_obs, env_act),
            **{mid: first.get(mid, (obs, act)) for mid in self.config.policies},
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """RLlib's runner state; newer module weights update the ``MultiRLModule`` and
        every mirrored policy's params (no retrace)."""
        import ray

        from jaxsampler.integrations.rllib.module import params_from_module_state

        rest = {k: v for k, v in state.items() if k not in (COMPONENT_RL_MODULE, WEIGHTS_SEQ_NO)}
        super().set_state(rest)
        if COMPONENT_RL_MODULE in state:
            seq = state.get(WEIGHTS_SEQ_NO, 0)
            if seq == 0 or self._weights_seq_no < seq:
                module_state = state[COMPONENT_RL_MODULE]
                if isinstance(module_state, ray.ObjectRef):
                    module_state = ray.get(module_state)
                self.module.set_state(module_state)
                params = dict(self._params)
                for mid, policy in self._js_policies.items():
                    if mid in module_state:
                        params[mid] = params_from_module_state(policy, module_state[mid])
                self._params = params
            if seq > 0:
                self._weights_seq_no = seq


@dataclasses.dataclass
class _EpisodeSums:
    """An episode's sums over its chunks so far (scalars and ``[A]`` rows), or a block of
    finished episodes' (``[n]`` and ``[n, A]`` arrays)."""

    length: Any
    duration: Any
    returns: np.ndarray
    steps: np.ndarray
    present: np.ndarray
