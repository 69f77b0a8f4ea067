"""``MultiAgentEpisode``: one multi-agent episode (chunk), RLlib-compatible.

Same constructor arguments, methods, index semantics and errors as RLlib's class of that
name in ray 2.60 (its documentation and its recorded behaviour), written anew:

* one :class:`SingleAgentEpisode` per agent (``agent_episodes``), holding only the steps
  at which that agent acted; ``env_t_to_agent_t`` maps every env step to the agent's own
  timestep, or ``"S"`` where the agent had no observation;
* an agent that acted and has not yet received its next observation is *hanging*: its
  action, extra model outputs and the rewards it collects meanwhile wait in caches and
  become one agent step when the observation arrives (rewards are summed);
* getters index env steps by default (``env_steps=True``) and each agent's own
  timeline with ``env_steps=False``.

The class is put together from ``_ma_agents.py`` (its state and per-agent book-keeping),
``_ma_steps.py`` (stepping) and ``_ma_getters.py`` (``get_*`` / ``set_*``); chunks
(``cut``, ``slice``, ``concat_episode``) are here. Where RLlib 2.60 has a bug that this
class does not copy, a note "RLlib deviation (n)" sits at the code concerned, numbered
1-18 as ``tests/ma_differential.py`` leaves them out; two deliberate differences that are
not RLlib bugs are marked "Design choice".
"""

from __future__ import annotations

import copy
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxsampler.constants import ALL_AGENTS
from jaxsampler.episodes._ma_agents import (
    SKIP,
    MultiAgentEnvError,
    StaticModuleMapping,
    default_agent_to_module_mapping_fn,
)
from jaxsampler.episodes._ma_getters import _Getters
from jaxsampler.episodes._ma_steps import _Stepping
from jaxsampler.episodes._tree import tree_map
from jaxsampler.episodes.ids import random_episode_id
from jaxsampler.episodes.lookback import InfiniteLookbackBuffer
from jaxsampler.episodes.single_agent import SingleAgentEpisode, _empty_like

__all__ = ["MultiAgentEpisode", "MultiAgentEnvError", "SKIP", "StaticModuleMapping"]


class MultiAgentEpisode(_Stepping, _Getters):
    """A multi-agent episode, or one chunk of it: one :class:`SingleAgentEpisode` per agent
    (``agent_episodes``) holding only the steps that agent acted, and per agent a map from
    env steps to its own steps (``env_t_to_agent_t``; :data:`SKIP` where it did not act).

    Steps are added with :meth:`add_env_reset` / :meth:`add_env_step` (dicts keyed by agent
    id, ``"__all__"`` in the done dicts); an agent that acts and gets no next observation
    hangs, and its rewards are summed until it does. Getters read by env step
    (``env_steps=True``) or by each agent's own steps, with the lookback, ``fill`` and
    ``neg_index_as_lookback`` rules of :class:`~jaxsampler.episodes.InfiniteLookbackBuffer`.
    :meth:`cut` starts the next chunk of a running episode; :meth:`to_numpy` freezes the
    data into arrays. Where RLlib 2.60 has a bug this class does not copy, a note "RLlib
    deviation (n)" in this package says what differs and why.

    Args:
        id_: the episode id (default: a fresh random one).
        observations, infos, actions, rewards, extra_model_outputs: initial data as lists of
            per-env-step dicts (``{agent_id: value}``; extras ``{agent_id: {key: value}}``),
            with one observation dict more than action dicts.
        observation_space, action_space: ``{agent_id: space}``.
        terminateds, truncateds: the done flags, per agent (dict) or for all (bool).
        env_t_started: the env step the data starts at (after the lookback).
        agent_t_started: each started agent's first own step (only agents that received
            an observation appear, as in RLlib).
        len_lookback_buffer: how many leading env steps are lookback (``"auto"``: all).
        agent_episode_ids, agent_module_ids: per-agent episode ids and module ids.
        agent_to_module_mapping_fn: ``(agent_id, episode) -> module_id``.
    """

    def __init__(
        self,
        id_: str | None = None,
        *,
        observations: list[dict] | None = None,
        observation_space: dict | None = None,
        infos: list[dict] | None = None,
        actions: list[dict] | None = None,
        action_space: dict | None = None,
        rewards: list[dict] | None = None,
        terminateds: dict | bool = False,
        truncateds: dict | bool = False,
        extra_model_outputs: list[dict] | None = None,
        env_t_started: int | None = None,
        agent_t_started: dict | None = None,
        len_lookback_buffer: int | str = "auto",
        agent_episode_ids: dict | None = None,
        agent_module_ids: dict | None = None,
        agent_to_module_mapping_fn: Callable[[Any, Any], Any] | None = None,
    ):
        self.id_ = id_ or random_episode_id()
        self.agent_to_module_mapping_fn = (
            agent_to_module_mapping_fn or default_agent_to_module_mapping_fn
        )
        self._agent_to_module_mapping = dict(agent_module_ids or {})
        self.observation_space = observation_space or {}
        self.action_space = action_space or {}
        self.env_t_started = env_t_started or 0
        self.env_t = self.env_t_started
        self._init_agent_state(agent_t_started, agent_episode_ids)
        self.is_terminated = False
        self.is_truncated = False
        self._len_lookback_buffers = 0
        self.custom_data = {}
        self._start_time = None
        self._last_step_time = None
        if observations:
            self._init_from_lists(
                observations,
                infos,
                actions or [],
                rewards or [],
                extra_model_outputs,
                terminateds,
                truncateds,
                len_lookback_buffer,
            )
        else:
            self.is_terminated = bool(
                terminateds.get(ALL_AGENTS, False) if isinstance(terminateds, dict) else terminateds
            )
            self.is_truncated = bool(
                truncateds.get(ALL_AGENTS, False) if isinstance(truncateds, dict) else truncateds
            )

    @classmethod
    def lazy(
        cls,
        id_: str,
        build: Callable[[MultiAgentEpisode, Any], None],
        key: Any,
        *,
        observation_space: dict,
        action_space: dict,
        agent_module_ids: dict,
        agent_to_module_mapping_fn: Callable[[Any, Any], Any],
        env_t_started: int,
        env_t: int,
        terminated: bool,
        truncated: bool,
    ) -> MultiAgentEpisode:
        """An episode whose per-agent state (agents' episodes, ``env_t_to_agent_t``,
        hanging caches, lookback) is filled by ``build(episode, key)`` on first access to
        any of it; until then only the ids, spaces, env steps and done flags are set (the
        samplers make thousands of episodes per call; most users read few of them).
        ``build`` starts from an episode without agents and must leave ``env_t`` and the
        done flags as given here."""
        ep = cls.__new__(cls)
        ep.__dict__["_lazy"] = (build, key)
        ep.id_ = id_
        ep.agent_to_module_mapping_fn = agent_to_module_mapping_fn
        ep._agent_to_module_mapping = dict(agent_module_ids)
        ep.observation_space, ep.action_space = observation_space, action_space
        ep.env_t_started, ep.env_t = env_t_started, env_t
        ep.is_terminated, ep.is_truncated = terminated, truncated
        ep.custom_data = {}
        ep._start_time = ep._last_step_time = None
        return ep

    # -- done flags --------------------------------------------------------------------

    @property
    def is_reset(self) -> bool:
        """Like RLlib's: whether any agent has an observation yet."""
        return bool(self.agent_episodes)

    def get_terminateds(self) -> dict:
        """Like RLlib's: each agent's ``is_terminated``, and the episode's under ``"__all__"``."""
        return {
            **{a: sa.is_terminated for a, sa in self.agent_episodes.items()},
            ALL_AGENTS: self.is_terminated,
        }

    def get_truncateds(self) -> dict:
        """Like RLlib's: each agent's ``is_truncated``, and the episode's under ``"__all__"``.

        RLlib deviation (3): ``"__all__"`` is :attr:`is_truncated` (RLlib's is
        ``is_terminated``)."""
        return {
            **{a: sa.is_truncated for a, sa in self.agent_episodes.items()},
            ALL_AGENTS: self.is_truncated,
        }

    def get_agents_that_stepped(self) -> set:
        """Agents with an observation at the last env step (see RLlib deviation (9) in
        ``_complete``: RLlib's also names agents terminated without a final observation)."""
        return {
            a
            for a, m in self.env_t_to_agent_t.items()
            if m.data and m.data[-1] != SKIP and a in self.agent_episodes
        }

    def prune_empty_agents(self) -> MultiAgentEpisode:
        """Removes the agent episodes without a step in this chunk (``len == 0``: e.g. an
        agent that acted and waits for its next observation), as RLlib's env runner does
        before returning a chunk; their maps and hanging caches stay (a ``cut`` successor
        made before continues them, and :meth:`concat_episode` of the successor restores
        them). Returns ``self``."""
        for aid in [a for a, sa in self.agent_episodes.items() if len(sa) == 0]:
            del self.agent_episodes[aid]
        return self

    def get_agents_to_act(self) -> set:
        """Agents with an observation at the last env step that are not done."""
        return {a for a in self.get_agents_that_stepped() if not self.agent_episodes[a].is_done}

    # -- counters, returns, conversion ---------------------------------------------------

    def __len__(self) -> int:
        return self.env_t - self.env_t_started

    def env_steps(self) -> int:
        """Like RLlib's: the env steps in this chunk, ``len(self)``."""
        return len(self)

    def agent_steps(self) -> int:
        """Completed agent steps (hanging ones excluded)."""
        return sum(len(sa) for sa in self.agent_episodes.values())

    def get_return(self, include_hanging_rewards: bool = False) -> float:
        """Like RLlib's: the sum of the agents' returns (lookback excluded), plus the
        rewards waiting in the hanging caches with ``include_hanging_rewards``.

        RLlib deviation (5): a ``cut`` successor does not count its predecessor's hanging
        rewards twice (see :meth:`cut`)."""
        ret = sum(sa.get_return() for sa in self.agent_episodes.values())
        if include_hanging_rewards:
            ret += sum(self._hanging_rewards_begin.values()) + sum(
                self._hanging_rewards_end.values()
            )
        return ret

    def get_duration_s(self) -> float:
        """Like RLlib's: seconds from ``add_env_reset`` to the last step (0.0 before)."""
        if self._start_time is None:
            return 0.0
        return (self._last_step_time or self._start_time) - self._start_time

    @property
    def is_numpy(self) -> bool:
        """Like RLlib's: whether the agents' episodes are numpy'ized.

        RLlib deviation (8): agents without a step yet are not asked (RLlib's is ``False``
        while one of them exists)."""
        stepped = [sa for sa in self.agent_episodes.values() if len(sa) > 0]
        return bool(stepped) and all(sa.is_numpy for sa in stepped)

    is_finalized = is_numpy

    def to_numpy(self) -> MultiAgentEpisode:
        """Like RLlib's: numpy'izes every agent's episode; returns ``self``."""
        for sa in self.agent_episodes.values():
            sa.to_numpy()
        return self

    finalize = to_numpy

    def get_sample_batch(self) -> Any:
        """``MultiAgentBatch`` keyed by agent id (as RLlib's), ``env_steps = len(self)``."""
        from jaxsampler.episodes.batch import MultiAgentBatch

        return MultiAgentBatch(
            {a: sa.get_sample_batch() for a, sa in self.agent_episodes.items() if len(sa) > 0},
            len(self),
        )

    # -- chunks --------------------------------------------------------------------------

    def cut(self, len_lookback_buffer: int = 0) -> MultiAgentEpisode:
        """The successor chunk (same ``id_``, ``len == 0``, ``env_t_started = self.env_t``)
        with ``len_lookback_buffer`` env steps of lookback, raised so that every hanging
        agent has an observation inside (its step then completes in the successor).

        For each hanging agent the lookback grows, where needed, to reach that agent's
        latest observation among the env steps at least ``len_lookback_buffer`` back from
        the end (the current env step counting as 1). As in RLlib, an observation within
        the last ``len_lookback_buffer - 1`` env steps does not count although it would be
        inside already: the successor may then get a longer lookback than asked, with an
        earlier observation of that agent too, reaching past this chunk's own start into
        its lookback. Without such an observation in the maps the asked length stays.

        RLlib deviation (4): ``cut(0)`` raises the lookback for hanging agents too (RLlib's
        search stops at once for 0, so their pending steps are lost).
        RLlib deviation (5): the successor starts with no rewards waiting for a first
        observation (RLlib copies this chunk's hanging rewards there, which the successor
        also holds as hanging, so ``get_return(include_hanging_rewards=True)`` counts them
        twice, until the agent is done).
        RLlib deviation (16): the lookback is at most the data there is (RLlib does not
        clip ``len_lookback_buffer``: the successor gets empty lookback env steps and
        other lookback indices).
        Design choice: done agents are not carried over (RLlib keeps them with only
        lookback data, which its env runner then prunes)."""
        if self.is_done:
            raise RuntimeError(
                "Can't call `MultiAgentEpisode.cut()` when the episode is already done!"
            )
        n = int(len_lookback_buffer)
        if n < 0:
            raise ValueError(f"len_lookback_buffer must be >= 0, got {n}")
        fast = self._cut_columns(n)
        return fast if fast is not None else self._cut_from_lists(n)

    def _cut_columns(self, n: int, numpy: bool = False) -> MultiAgentEpisode | None:
        """:meth:`cut` by slicing the agents' numpy'ized columns, for the common case it
        can take: nothing hanging, and every agent still running observed (and so acted)
        at each of the last ``n`` env steps; ``None`` otherwise (the same successor as
        :meth:`_cut_from_lists`, which rebuilds it step by step).

        ``numpy``: the successor's lookback columns as arrays (copies of the last rows)
        instead of lists of rows, as ``finalize()`` of every non-empty column (and of
        infos holding values) would make them: the samplers' successors, which the next
        call extends with arrays."""
        if (
            self._hanging_actions_end
            or self._hanging_rewards_end
            or self._hanging_rewards_begin
            or self._hanging_extra_model_outputs_end
        ):
            return None
        n = min(n, self._map_len() - 1)
        active = {a: sa for a, sa in self.agent_episodes.items() if not sa.is_done}
        for aid, sa in active.items():
            m = self.env_t_to_agent_t[aid].data
            if not _full_window(m, n, sa.t) or not _cuttable(sa, n):
                return None
        succ = MultiAgentEpisode(
            self.id_,
            observation_space=self.observation_space,
            action_space=self.action_space,
            env_t_started=self.env_t,
            agent_episode_ids={a: sa.id_ for a, sa in self.agent_episodes.items()},
            agent_module_ids=self.agent_to_module_mapping,
            agent_to_module_mapping_fn=self.agent_to_module_mapping_fn,
        )
        succ._len_lookback_buffers = n
        for aid, sa in active.items():
            t0 = sa.t
            succ.agent_episodes[aid] = _cut_agent(sa, n, self.id_, succ.module_for(aid), numpy)
            succ.agent_t_started[aid] = t0
            succ.env_t_to_agent_t[aid] = InfiniteLookbackBuffer(list(range(t0 - n, t0 + 1)), n)
        succ.custom_data = copy.deepcopy(self.custom_data)
        succ._start_time = succ._last_step_time = time.perf_counter()
        return succ

    def _cut_from_lists(self, n: int) -> MultiAgentEpisode:
        """:meth:`cut` through the list constructor (every case)."""
        last = self._map_len() - 1
        asked = n
        for aid in self._hanging_actions_end:
            n = max(n, _hanging_lookback(self.env_t_to_agent_t[aid].data, asked))
        n = min(n, last)  # RLlib deviation (16)
        active = [a for a, sa in self.agent_episodes.items() if not sa.is_done]
        keep = lambda steps: [{a: v for a, v in d.items() if a in active} for d in steps]
        observations = keep(self.get_observations(slice(-n - 1, None), return_list=True))
        if n > 0:
            actions = keep(self.get_actions(slice(-n, None), return_list=True))
            rewards = keep(self.get_rewards(slice(-n, None), return_list=True))
            extras = keep(self.get_extra_model_outputs(None, slice(-n, None), return_list=True))
        else:
            actions, rewards, extras = [], [], []
        successor = MultiAgentEpisode(
            self.id_,
            observations=observations,
            observation_space=self.observation_space,
            infos=keep(self.get_infos(slice(-n - 1, None), return_list=True)),
            actions=actions,
            action_space=self.action_space,
            rewards=rewards,
            extra_model_outputs=extras,
            env_t_started=self.env_t,
            agent_t_started={a: self.agent_episodes[a].t for a in active},
            len_lookback_buffer="auto",
            agent_episode_ids={a: sa.id_ for a, sa in self.agent_episodes.items()},
            agent_module_ids=self.agent_to_module_mapping,
            agent_to_module_mapping_fn=self.agent_to_module_mapping_fn,
        )
        successor.custom_data = copy.deepcopy(self.custom_data)
        if self.is_numpy:
            for sa in successor.agent_episodes.values():
                sa.observations.finalize()
                if len(sa.rewards.data):
                    sa.to_numpy()
        return successor

    def slice(self, slice_: slice, *, len_lookback_buffer: int | None = None) -> MultiAgentEpisode:
        """A new episode over env steps ``slice_`` (clipped to ``[0, len]``, step 1), with
        ``len_lookback_buffer`` env steps of lookback (default: this one's). Agents keep
        their done flags only if the slice ends where this episode ends."""
        if slice_.step not in (None, 1):
            raise ValueError("MultiAgentEpisode.slice() supports step 1 only")
        n = len(self)
        start = (
            0 if slice_.start is None else (slice_.start + n if slice_.start < 0 else slice_.start)
        )
        stop = n if slice_.stop is None else (slice_.stop + n if slice_.stop < 0 else slice_.stop)
        start, stop = max(0, min(start, n)), max(0, min(stop, n))
        stop = max(stop, start)
        lb_old = self._len_lookback_buffers
        lb = lb_old if len_lookback_buffer is None else int(len_lookback_buffer)
        lb = min(lb, lb_old + start)
        first = start - lb  # env step (episode-relative) of the first observation kept
        obs_idx = slice(first, stop + 1)
        act_idx = slice(first, stop)
        kw = {"neg_index_as_lookback": True, "return_list": True}
        done_here = stop == n
        agent_t_started = {}
        for aid, m in self.env_t_to_agent_t.items():
            upto = [v for v in m.data[: lb_old + start + 1] if v != SKIP]
            later = [v for v in m.data[lb_old + start + 1 :] if v != SKIP]
            if upto or later:
                agent_t_started[aid] = upto[-1] if upto else later[0]
        out = MultiAgentEpisode(
            self.id_,
            observations=self.get_observations(obs_idx, **kw),
            observation_space=self.observation_space,
            infos=self.get_infos(obs_idx, **kw),
            actions=self.get_actions(act_idx, **kw) if stop > first else [],
            action_space=self.action_space,
            rewards=self.get_rewards(act_idx, **kw) if stop > first else [],
            extra_model_outputs=self.get_extra_model_outputs(None, act_idx, **kw)
            if stop > first
            else [],
            terminateds={
                **{a: sa.is_terminated for a, sa in self.agent_episodes.items()},
                ALL_AGENTS: self.is_terminated,
            }
            if done_here
            else False,
            truncateds={
                **{a: sa.is_truncated for a, sa in self.agent_episodes.items()},
                ALL_AGENTS: self.is_truncated,
            }
            if done_here
            else False,
            env_t_started=self.env_t_started + start,
            agent_t_started=agent_t_started,
            len_lookback_buffer=lb,
            agent_episode_ids={a: sa.id_ for a, sa in self.agent_episodes.items()},
            agent_module_ids=self.agent_to_module_mapping,
            agent_to_module_mapping_fn=self.agent_to_module_mapping_fn,
        )
        if self.is_numpy:
            out.to_numpy()
        return out

    def __getitem__(self, item: Any) -> MultiAgentEpisode:
        if isinstance(item, slice):
            return self.slice(item)
        raise NotImplementedError(
            f"{type(self).__name__} does not support getting item '{item}'! Only slice objects "
            "allowed with the syntax: `episode[a:b]`."
        )

    def concat_episode(self, other: MultiAgentEpisode) -> None:
        """Appends ``other``, the next chunk of this episode (``other.env_t_started ==
        self.env_t``, same ``id_``). Agents done here are skipped; agents new in ``other``
        are added; the hanging caches become ``other``'s.

        RLlib deviation (6): steps that ``other`` completed are no longer hanging (RLlib
        keeps this chunk's caches for them)."""
        if other.id_ != self.id_:
            raise ValueError(
                f"cannot concat episodes with different ids ({self.id_} vs {other.id_})"
            )
        if self.is_done:
            raise ValueError("cannot concat onto a done episode")
        if self.env_t != other.env_t_started:
            raise ValueError(
                f"chunks do not meet: self.env_t={self.env_t}, "
                f"other.env_t_started={other.env_t_started}"
            )
        n_self = self._map_len()
        olb = other._len_lookback_buffers
        for aid, osa in other.agent_episodes.items():
            om = other.env_t_to_agent_t[aid]
            sa = self.agent_episodes.get(aid)
            if sa is not None and sa.is_done:
                continue
            if sa is None:
                self.agent_episodes[aid] = osa.slice(slice(0, len(osa)), len_lookback_buffer=0)
                self.agent_t_started[aid] = osa.t_started
                self._agent_episode_ids[aid] = osa.id_
                self._agent_to_module_mapping.setdefault(aid, osa.module_id)
                m = self.env_t_to_agent_t.get(aid)
                if m is not None:  # pruned here (no step yet): its map goes on
                    m.data = list(m.data) + list(om.data[olb + 1 :])
                else:
                    self.env_t_to_agent_t[aid] = InfiniteLookbackBuffer(
                        [SKIP] * (n_self - 1) + list(om.data[olb:]), self._len_lookback_buffers
                    )
                continue
            if len(osa) > 0:
                for k, buf in osa.extra_model_outputs.items():
                    if k not in sa.extra_model_outputs and sa.rewards.len_incl_lookback() == 0:
                        sa.extra_model_outputs[k] = InfiniteLookbackBuffer(_empty_like(buf), 0)
                sa.concat_episode(osa.slice(slice(0, len(osa)), len_lookback_buffer=0))
            self.env_t_to_agent_t[aid].data = list(self.env_t_to_agent_t[aid].data) + list(
                om.data[olb + 1 :]
            )
        for aid, m in self.env_t_to_agent_t.items():  # agents absent from other: no observation
            if aid not in other.agent_episodes:
                m.data = list(m.data) + [SKIP] * (other.env_t - other.env_t_started)
        # (other's caches replace these: RLlib deviation (6))
        self._hanging_actions_end = dict(other._hanging_actions_end)
        self._hanging_extra_model_outputs_end = defaultdict(
            dict, copy.deepcopy(dict(other._hanging_extra_model_outputs_end))
        )
        self._hanging_rewards_end = defaultdict(float, other._hanging_rewards_end)
        self.env_t = other.env_t
        self.is_terminated, self.is_truncated = other.is_terminated, other.is_truncated
        self._last_step_time = other._last_step_time

    # -- misc ----------------------------------------------------------------------------

    def print(self) -> None:
        """Prints which agents had an observation at which env step."""
        n = self._map_len() - self._len_lookback_buffers
        width = max([len(str(a)) for a in self.env_t_to_agent_t] + [2])
        print(("ts".ljust(width) + "".join(f"{t:>3} " for t in range(n))).rstrip())
        for aid, m in self.env_t_to_agent_t.items():
            cells = m.data[self._len_lookback_buffers :]
            print(
                (
                    str(aid).ljust(width) + "".join("   x" if v != SKIP else "    " for v in cells)
                ).rstrip()
            )

    def get_state(self) -> dict[str, Any]:
        """Like RLlib's: the episode's state (a deep copy), for :meth:`from_state`."""
        self._ensure_built()
        return copy.deepcopy({k: v for k, v in self.__dict__.items()})

    def __getstate__(self) -> dict[str, Any]:
        self._ensure_built()
        return self.__dict__

    @staticmethod
    def from_state(state: dict[str, Any]) -> MultiAgentEpisode:
        """Like RLlib's: the episode :meth:`get_state` returned ``state`` of."""
        ep = MultiAgentEpisode.__new__(MultiAgentEpisode)
        ep.__dict__.update(copy.deepcopy(state))
        return ep

    def __repr__(self) -> str:
        returns = {a: sa.get_return() for a, sa in self.agent_episodes.items()}
        return f"MAEps(len={len(self)} done={self.is_done} Rs={returns} id_={self.id_})"


def _hanging_lookback(m: list, asked: int) -> int:
    """The lookback (in env steps) that a ``cut(asked)`` needs for a hanging agent with
    map data ``m``: it reaches back to the agent's latest observation that is at least
    ``max(asked, 1)`` entries from the end of ``m`` (the last entry being 1 from the end);
    0 when there is none.

    An observation nearer the end than ``asked`` entries is passed over, as RLlib's
    ``cut`` passes it over, so the lookback may end up longer than ``asked`` although
    ``asked`` steps already held an observation of the agent.
    RLlib deviation (4): ``asked == 0`` searches as 1 does (RLlib's search for 0 looks
    at the chunk's first env step and stops there, losing the hanging agent's step)."""
    for back in range(max(asked, 1), len(m) + 1):
        if m[len(m) - back] != SKIP:
            return back - 1
    return 0


def _full_window(m: list, n: int, t: int) -> bool:
    """Whether map data ``m`` ends with the ``n + 1`` consecutive agent timesteps
    ``t - n .. t`` (an observation at each of the last ``n + 1`` env steps)."""
    if len(m) < n + 1:
        return False
    window = m[len(m) - n - 1 :]
    return window == list(range(t - n, t + 1))


def _cuttable(sa: SingleAgentEpisode, n: int) -> bool:
    """Whether ``sa``'s columns are numpy'ized and hold its last ``n`` steps."""
    cols = (sa.observations, sa.actions, sa.rewards, *sa.extra_model_outputs.values())
    return (
        all(b.finalized for b in cols)
        and sa.observations.len_incl_lookback() >= n + 1
        and sa.rewards.len_incl_lookback() >= n
    )


def _items(buf: InfiniteLookbackBuffer, k: int, numpy: bool = False) -> Any:
    """The last ``k`` items of a numpy'ized buffer as a list (rows of a copy; ``numpy``:
    the copy itself)."""
    n = buf.len_incl_lookback()
    tail = tree_map(lambda x: np.array(x[n - k :]), buf.data)
    if numpy:
        return tail
    if isinstance(tail, np.ndarray):
        return list(tail)
    return [tree_map(lambda x, i=i: x[i], tail) for i in range(k)]


def _cut_agent(
    sa: SingleAgentEpisode, n: int, ma_id: str, module_id: Any, numpy: bool = False
) -> SingleAgentEpisode:
    """``sa``'s successor in a multi-agent ``cut`` with ``n`` lookback steps, as the list
    constructor makes it: observations numpy'ized, the other columns in list mode
    (``numpy``: as ``finalize()`` then makes them, see ``_cut_columns``)."""
    trusted = InfiniteLookbackBuffer.trusted
    infos = sa.infos
    k = infos.len_incl_lookback()
    info_items: Any
    if infos.finalized and numpy:
        info_items = tree_map(lambda x: np.array(x[k - n - 1 :]), infos.data)
    elif infos.finalized:
        info_items = [tree_map(lambda x, i=i: x[i], infos.data) for i in range(k - n - 1, k)]
    else:
        info_items = list(infos.data[k - n - 1 :])
    no_steps = n == 0
    actions = trusted([] if no_steps else _items(sa.actions, n, numpy), n, sa.actions.space)
    rewards = trusted([] if no_steps else _items(sa.rewards, n, numpy), n, sa.rewards.space)
    extras = {
        key: trusted(_items(b, n, numpy), n, b.space)
        for key, b in ({} if no_steps else sa.extra_model_outputs).items()
    }
    obs = sa.observations
    k = obs.len_incl_lookback()
    observations = tree_map(lambda x: np.array(x[k - n - 1 :]), obs.data)
    return SingleAgentEpisode.trusted(
        sa.id_,
        observations=trusted(observations, n, obs.space),
        infos=trusted(info_items, n),
        actions=actions,
        rewards=rewards,
        extra_model_outputs=extras,
        observation_space=sa.observation_space,
        action_space=sa.action_space,
        terminated=False,
        truncated=False,
        t_started=sa.t,
        agent_id=sa.agent_id,
        module_id=module_id,
        multi_agent_episode_id=ma_id,
        t=sa.t,
    )
