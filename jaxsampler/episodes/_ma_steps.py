"""Stepping of :class:`~jaxsampler.episodes.multi_agent.MultiAgentEpisode`: the list
constructor, ``add_env_reset`` and ``add_env_step`` with the hanging agents' steps."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from jaxsampler.constants import ALL_AGENTS
from jaxsampler.episodes._ma_agents import SKIP, MultiAgentEnvError, _AgentBookkeeping
from jaxsampler.episodes.lookback import InfiniteLookbackBuffer

__all__: list[str] = []


class _Stepping(_AgentBookkeeping):
    """Adds env steps (one at a time, or from the constructor's lists) to the episode."""

    # -- construction from lists -------------------------------------------------------

    def _init_from_lists(
        self, observations, infos, actions, rewards, extras, terminateds, truncateds, lb
    ) -> None:
        n = len(rewards)
        if len(actions) != n or len(observations) != n + 1:
            raise ValueError(
                "need one observation dict more than action/reward dicts, got "
                f"{len(observations)} observations, "
                f"{len(actions)} actions, {len(rewards)} rewards"
            )
        infos = infos or [{} for _ in observations]
        extras = extras or [{} for _ in actions]
        lb = n if lb == "auto" else min(int(lb), n)
        agent_t_started = dict(self.agent_t_started)
        env_t_started = self.env_t_started
        self.agent_t_started = defaultdict(int)
        self.env_t_started = self.env_t = 0
        rewards = self._pre_observation_rewards(observations, actions, rewards)
        self.add_env_reset(observations=observations[0], infos=infos[0])
        for i in range(n):
            # An agent that observed but did not act (and is not hanging) is done.
            done = {
                a: True
                for a in observations[i]
                if a not in actions[i] and a not in self._hanging_actions_end
            }
            self.add_env_step(
                observations[i + 1],
                actions[i],
                rewards[i],
                infos[i + 1],
                terminateds=done,
                extra_model_outputs=extras[i],
            )
        # Move the first ``lb`` env steps into the lookback and switch to absolute agent timesteps.
        self._len_lookback_buffers = lb
        for aid, m in self.env_t_to_agent_t.items():
            real = [v for v in m.data[: lb + 1] if v != SKIP]
            sa_lb = max(real) if real else 0
            sa = self.agent_episodes[aid]
            t0 = agent_t_started.get(aid, 0)
            for buf in (
                sa.observations,
                sa.infos,
                sa.actions,
                sa.rewards,
                *sa.extra_model_outputs.values(),
            ):
                buf.lookback = sa_lb
            sa.t_started, sa.t = t0, t0 + sa.rewards.len_incl_lookback() - sa_lb
            m.data = [v if v == SKIP else v - sa_lb + t0 for v in m.data]
            m.lookback = lb
            self.agent_t_started[aid] = t0
        self.env_t_started = env_t_started
        self.env_t = env_t_started + n - lb
        # (as RLlib's list constructor: no begin cache; unspent waiting rewards hang; a
        # ``cut`` successor so starts without its predecessor's: RLlib deviation (5))
        self._hanging_rewards_begin = defaultdict(float)
        for aid, r in self.__dict__.pop("_pending_first_rewards").items():
            self._hanging_rewards_end[aid] += r
        for flags, attr in ((terminateds, "is_terminated"), (truncateds, "is_truncated")):
            if isinstance(flags, dict):
                for aid, v in flags.items():
                    if aid != ALL_AGENTS and aid in self.agent_episodes:
                        setattr(self.agent_episodes[aid], attr, bool(v))
                setattr(self, attr, bool(flags.get(ALL_AGENTS, False)) or getattr(self, attr))
            else:
                setattr(self, attr, bool(flags) or getattr(self, attr))

    def _pre_observation_rewards(self, observations, actions, rewards) -> list[dict]:
        """``rewards`` without those of agents before their first observation; as RLlib's
        list constructor, an agent named in ``agent_episode_ids`` gets them added to its
        first step's reward (or, if it takes none, left as its hanging reward), the
        others' are dropped."""
        known = set(self._agent_episode_ids)
        seen: set = set()
        pending: dict[Any, float] = {}
        out = []
        for i, rew in enumerate(rewards):
            seen.update(observations[i])
            step = {a: r for a, r in rew.items() if a in seen}
            for a, r in rew.items():
                if a not in seen and a in known:
                    pending[a] = pending.get(a, 0.0) + r
            for a in list(pending):
                if a in actions[i]:  # its first step: the rewards it waited for go to it
                    step[a] = pending.pop(a) + step.get(a, 0.0)
            out.append(step)
        self._pending_first_rewards = pending
        return out

    # -- stepping ----------------------------------------------------------------------

    def add_env_reset(self, *, observations: dict, infos: dict | None = None) -> None:
        """Like RLlib's: adds the first observations (and infos) of the episode."""
        assert not self.is_done, "The episode is already done."
        infos = infos or {}
        for aid, obs in observations.items():
            self._new_agent(aid, obs, infos.get(aid))
            self.env_t_to_agent_t[aid] = InfiniteLookbackBuffer([self.agent_t_started.get(aid, 0)])
        self._start_time = self._last_step_time = time.perf_counter()

    def add_env_step(
        self,
        observations: dict,
        actions: dict,
        rewards: dict,
        infos: dict | None = None,
        *,
        terminateds: dict | None = None,
        truncateds: dict | None = None,
        extra_model_outputs: dict | None = None,
    ) -> None:
        """Adds one env step: the actions taken (by the agents that acted), then the
        observations, rewards, infos and done flags the env returned."""
        if self.is_done:
            raise MultiAgentEnvError(
                "Cannot call `add_env_step` on a MultiAgentEpisode that is already done!"
            )
        infos, extras = infos or {}, extra_model_outputs or {}
        terminateds, truncateds = terminateds or {}, truncateds or {}
        all_term, all_trunc = (
            bool(terminateds.get(ALL_AGENTS, False)),
            bool(truncateds.get(ALL_AGENTS, False)),
        )
        self.env_t += 1
        map_len = self._map_len()
        # Every agent known before this step done (by its own flags, not "__all__"): the
        # episode is terminated, also when some of them were truncated (RLlib's rule) -
        # unless an agent joins in this step (Design choice: RLlib would end the episode
        # there and ignore the joiner).
        joins = any(
            a not in self.agent_episodes and not terminateds.get(a) and not truncateds.get(a)
            for a in observations
        )
        every_agent_done = (
            bool(self.agent_episodes)
            and not joins
            and all(
                sa.is_done or terminateds.get(a) or truncateds.get(a)
                for a, sa in self.agent_episodes.items()
            )
        )
        for aid, m in self.env_t_to_agent_t.items():
            if aid not in observations:
                m.append(SKIP)
        agents: dict[Any, None] = {}
        for d in (observations, actions, rewards, terminateds, truncateds):
            agents.update((a, None) for a in d if a != ALL_AGENTS)
        if all_term or all_trunc:
            agents.update((a, None) for a in self.agent_episodes)
        self.is_terminated = all_term or every_agent_done
        self.is_truncated = all_trunc
        for aid in agents:  # the episode's flags are OR'ed into every agent stepped here
            term = bool(terminateds.get(aid, False)) or self.is_terminated
            trunc = bool(truncateds.get(aid, False)) or self.is_truncated
            self._agent_step(
                aid, observations, actions, rewards, infos, extras, term, trunc, map_len
            )
            if term or trunc:  # a done agent's caches go (also its rewards before joining)
                for cache in (
                    self._hanging_actions_end,
                    self._hanging_extra_model_outputs_end,
                    self._hanging_rewards_end,
                    self._hanging_rewards_begin,
                ):
                    cache.pop(aid, None)
        self._last_step_time = time.perf_counter()

    def _agent_step(
        self, aid, observations, actions, rewards, infos, extras, term, trunc, map_len
    ) -> None:
        sa = self.agent_episodes.get(aid)
        has_obs, has_act = aid in observations, aid in actions
        reward = rewards.get(aid, 0.0)
        if sa is not None and sa.is_done:
            if has_obs or has_act or aid in rewards:
                raise MultiAgentEnvError(
                    f"Agent {aid} already had its `SingleAgentEpisode.is_done` set to True, but "
                    "still received "
                    f"data in a following step! obs={observations.get(aid)} act={actions.get(aid)} "
                    f"rew={rewards.get(aid)} info={infos.get(aid)} "
                    f"extra_model_outputs={extras.get(aid)}"
                )
            return
        hanging = aid in self._hanging_actions_end
        if has_obs and has_act:
            if aid not in rewards:
                raise MultiAgentEnvError(
                    f"Agent {aid} acted (and received next obs), but did NOT receive any reward "
                    "from the env!"
                )
            if sa is None:
                raise MultiAgentEnvError(
                    f"Agent {aid} acted without ever having received an observation"
                )
            total = self._hanging_rewards_end.pop(aid, 0.0) + reward
            self._hanging_actions_end.pop(aid, None)
            self._hanging_extra_model_outputs_end.pop(aid, None)
            self._complete(
                aid,
                observations[aid],
                infos.get(aid),
                actions[aid],
                total,
                extras.get(aid),
                term,
                trunc,
            )
        elif has_obs and hanging:
            self._complete(
                aid,
                observations[aid],
                infos.get(aid),
                self._hanging_actions_end.pop(aid),
                self._hanging_rewards_end.pop(aid, 0.0) + reward,
                self._hanging_extra_model_outputs_end.pop(aid, None),
                term,
                trunc,
            )
        elif has_obs:
            if sa is not None:
                raise MultiAgentEnvError(
                    f"Agent {aid} received an observation but did not act on its previous one"
                )
            if term or trunc:
                return  # an agent that arrives done never steps
            self._new_agent(aid, observations[aid], infos.get(aid))
            # mapped at its env step of this chunk (RLlib deviation (11): RLlib pads the map
            # of an agent joining a cut chunk by the absolute env_t)
            self.env_t_to_agent_t[aid] = InfiniteLookbackBuffer(
                [SKIP] * (map_len - 1) + [self.agent_t_started.get(aid, 0)],
                self._len_lookback_buffers,
            )
            self._hanging_rewards_begin[aid] += reward
        elif has_act:
            if sa is None:
                raise MultiAgentEnvError(
                    f"Agent {aid} acted without ever having received an observation"
                )
            self._hanging_actions_end[aid] = actions[aid]
            self._hanging_rewards_end[aid] = reward
            self._hanging_extra_model_outputs_end[aid] = dict(extras.get(aid) or {})
            self._finish_hanging(aid, term, trunc)
        else:  # a reward only: for the pending step, or before the agent's first observation
            if sa is None:
                self._hanging_rewards_begin[aid] += reward
            else:
                self._hanging_rewards_end[aid] += reward
            if hanging:
                self._finish_hanging(aid, term, trunc)
            elif (term or trunc) and sa is not None:
                if len(sa) == 0 and sa.observations.lookback == 0:
                    self._drop_agent(aid)
                else:
                    sa.is_terminated, sa.is_truncated = term, trunc
                    self._hanging_rewards_end.pop(aid, None)

    def _finish_hanging(self, aid: Any, term: bool, trunc: bool) -> None:
        """A hanging agent that is done without a next observation: terminated, its step
        completes with its last observation again (see :meth:`_complete`).

        RLlib deviation (10): this works in a ``cut`` chunk too, where that observation is
        in the lookback (RLlib loses the step and the agent's done flag: its successor has
        no "last added" observation)."""
        if trunc and not term:
            raise MultiAgentEnvError(
                f"Agent {aid} acted and then got truncated, but did NOT receive a last "
                "(truncation) observation, "
                "required for e.g. value function bootstrapping!"
            )
        if term:
            sa = self.agent_episodes[aid]
            self._complete(
                aid,
                sa.get_observations(-1),
                sa.get_infos(-1),
                self._hanging_actions_end.pop(aid),
                self._hanging_rewards_end.pop(aid, 0.0),
                self._hanging_extra_model_outputs_end.pop(aid, None),
                True,
                trunc,
                mapped=False,
            )

    def _complete(
        self, aid, obs, info, action, reward, extras, term, trunc, mapped: bool = True
    ) -> None:
        """Adds one agent step; ``mapped=False``: its observation (a terminated agent's
        last one, re-recorded) belongs to no env step, the agent's map keeps ``SKIP``.

        RLlib deviation (9): RLlib maps that observation to the *next* env step, so the
        agent's map is one entry too long: its env-step getters with negative indices and
        ``get_agents_that_stepped()`` are off by one (``get_observations(-1)`` shows the
        agent, ``get_actions(-1)`` leaves its last action out), its positive indices are
        not; ours give RLlib's positive-index result for every index."""
        sa = self.agent_episodes[aid]
        sa.add_env_step(
            obs,
            action,
            reward,
            info,
            terminated=term,
            truncated=trunc,
            extra_model_outputs=extras or None,
        )
        if mapped:
            self.env_t_to_agent_t[aid].append(len(sa) + self.agent_t_started[aid])
        else:
            self.agent_t_started.setdefault(aid, 0)
