"""``SampleCollector``: per-agent experience in, episodes and batches out (RLlib's old API).

The method names and arguments are those of RLlib's old-stack ``SampleCollector`` (the
sampler-side object that gathers per-agent steps of many concurrent episodes, serves the
policies' inference inputs and builds the training batches). Internally every episode is a
jaxsampler :class:`MultiAgentEpisode`, fed with ``add_env_reset`` / ``add_env_step``, so
host-stepped and serving envs produce the same episode objects, and the same batch
columns, as the device :class:`jaxsampler.Sampler`.

Flow per env step (what :class:`jaxsampler.sampling.host.feeds.CollectorFeed` does for the
:class:`jaxsampler.sampling.host.HostSampler`)::

    # episode start, or an agent joining late:
    collector.add_init_obs(episode=ep, agent_id=a, env_id=e, policy_id=p, init_obs=obs)
    batch = collector.get_inference_input_dict(p)  # rows to act on: obs, env_id, agent_id, ...
    ...  # compute actions, step the env
    # once per agent with data this step:
    collector.add_action_reward_next_obs(
        ep.id_, a, e, p, agent_done,
        {"actions": ..., "rewards": ..., "new_obs": ..., "terminateds": ...,
         "truncateds": ..., "infos": ..., **extra_model_outputs},
    )
    collector.episode_step(ep, terminateds=env_terms, truncateds=env_truncs)  # once per step
    collector.postprocess_episode(ep, is_done=True)  # when the episode ended
    batch = collector.build_multi_agent_batch()  # or try_build_truncated_episode_...()

Semantics of one agent's values in an env step (the :class:`MultiAgentEpisode` rules):
``actions`` is the action the agent took on its previous observation (absent if it did
not act); ``new_obs`` is its next observation (absent while it waits: its step stays
*hanging* and the rewards it receives meanwhile are summed into it); any key other than
``actions``, ``rewards``, ``new_obs``, ``infos``, ``terminateds``, ``truncateds`` is an
extra model output of the action (``action_logp``, ``vf_preds``, ...).

Simplifications against RLlib (documented deviations):

* no view requirements: the inference input is the latest observation of each queued
  agent (plus ``env_id``, ``agent_id``, ``eps_id``, ``agent_index``, ``t``, ``infos``);
  no prev-action / prev-reward / state-in columns, no ``seq_lens``;
* no policy objects: ``postprocess_episode`` runs no ``postprocess_trajectory`` (GAE
  etc.), exploration or callbacks; it closes the episode's chunk (numpy'ized) and, for
  an ongoing episode, continues it in a ``cut`` successor (same ``id_``) with
  ``episode_lookback_horizon`` steps of lookback, like the device sampler;
* ``build_multi_agent_batch`` always returns a :class:`MultiAgentBatch` (RLlib unwraps a
  lone ``"default_policy"`` batch into a ``SampleBatch``) with the device path's columns;
  ``try_build_truncated_episode_multi_agent_batch`` returns ``[batch]`` once at least
  ``rollout_fragment_length`` steps are collected (not asserting "exactly");
* ``total_env_steps`` / ``total_agent_steps`` count every step not yet in a built batch
  (running chunks and postprocessed ones);
* when ``episode_step`` gets the env's ``"__all__"`` flags, they decide whether the
  episode is over (RLlib's episode also ends when every agent seen so far is done, which
  breaks envs whose agents join late); per-agent flags still come from the agents.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxsampler.constants import ALL_AGENTS, DEFAULT_POLICY_ID
from jaxsampler.episodes.batch import MultiAgentBatch, SampleBatch
from jaxsampler.episodes.lookback import batch as stack
from jaxsampler.episodes.lookback import tree_map
from jaxsampler.episodes.multi_agent import MultiAgentEpisode
from jaxsampler.sampling.metrics import check_lookback, check_positive_int

__all__ = [
    "ABANDONED",
    "SampleCollector",
    "concat_rows",
    "episodes_to_batch",
    "is_abandoned",
    "step_rows",
]

#: The info key an external env sets on the final observation of an abandoned episode
#: (its client went away; the episode ends truncated), and the batch column that marks
#: the last row of such an episode.
ABANDONED = "abandoned"

_STEP_KEYS = frozenset({"actions", "rewards", "new_obs", "infos", "terminateds", "truncateds"})


class _Pending:
    """One env step of one episode under construction (the ``add_env_step`` arguments)."""

    __slots__ = ("obs", "actions", "rewards", "infos", "terms", "truncs", "extras")

    def __init__(self) -> None:
        self.obs: dict = {}
        self.actions: dict = {}
        self.rewards: dict = {}
        self.infos: dict = {}
        self.terms: dict = {}
        self.truncs: dict = {}
        self.extras: dict = {}

    def __bool__(self) -> bool:
        return bool(self.obs or self.actions or self.rewards or self.terms or self.truncs)


class SampleCollector:
    """Collects agent steps of many concurrent episodes; see the module docstring.

    Args:
        rollout_fragment_length: steps (``count_steps_by``) per batch of
            :meth:`try_build_truncated_episode_multi_agent_batch`.
        count_steps_by: ``"env_steps"`` or ``"agent_steps"``.
        agent_ids: all agent ids in order (``agent_index`` = position); default: order of
            first appearance in each episode.
        episode_lookback_horizon: lookback env steps of the chunk that continues an
            ongoing episode after :meth:`postprocess_episode`.
        clip_rewards: ``True`` (sign), a float ``c`` (clip to ``[-c, c]``) or ``None``;
            applied to the ``rewards`` column of built batches (episodes keep raw rewards).
        policy_ids: order of the policy batches in built batches (others follow in order
            of first appearance).
    """

    def __init__(
        self,
        rollout_fragment_length: int = 200,
        *,
        count_steps_by: str = "env_steps",
        agent_ids: Sequence[Any] | None = None,
        episode_lookback_horizon: int = 1,
        clip_rewards: bool | float | None = None,
        policy_ids: Sequence[Any] | None = None,
    ):
        if count_steps_by not in ("env_steps", "agent_steps"):
            raise ValueError(
                f"count_steps_by must be 'env_steps' or 'agent_steps', got {count_steps_by!r}"
            )
        self.rollout_fragment_length = check_positive_int(
            "rollout_fragment_length", rollout_fragment_length
        )
        self.count_steps_by = count_steps_by
        self.agent_ids = tuple(agent_ids) if agent_ids is not None else None
        self.episode_lookback_horizon = check_lookback(episode_lookback_horizon)
        self.clip_rewards = clip_rewards
        self.policy_ids = tuple(policy_ids or ())
        self._episodes: dict[Any, MultiAgentEpisode] = {}  # running chunk per episode id
        self._env_of: dict[Any, Any] = {}
        self._reset: dict[Any, _Pending] = {}  # first observations, before the first env step
        self._step: dict[Any, _Pending] = {}
        self._queues: dict[
            Any, list[tuple]
        ] = {}  # policy id -> [(episode id, env id, agent id, obs, info)]
        self._built: list[MultiAgentEpisode] = []  # closed chunks not yet in a batch

    # -- feeding -----------------------------------------------------------------------

    def add_init_obs(
        self,
        *,
        episode: MultiAgentEpisode | Any,
        agent_id: Any,
        env_id: Any,
        policy_id: Any,
        init_obs: Any,
        init_infos: dict | None = None,
        t: int = -1,
    ) -> None:
        """The first observation of ``agent_id`` in ``episode`` (at the episode's start, or
        when the agent joins later); queues the agent for :meth:`get_inference_input_dict`.

        Args:
            episode: a :class:`MultiAgentEpisode` (new and empty, or already known), or an
                episode id (a new empty episode is then created with that id).
            t: ignored (kept for RLlib's signature); timesteps come from the episode.

        Raises:
            ValueError: the agent already has an observation in this episode, or the
                episode is mapped to another env id, or the agent to another policy.
        """
        ep = self._register(episode, env_id)
        eid = ep.id_
        self._map_policy(ep, agent_id, policy_id)
        started = ep.is_reset or ep.env_t > ep.env_t_started
        pending = self._step[eid] if started else self._reset.setdefault(eid, _Pending())
        if agent_id in ep.agent_episodes or agent_id in pending.obs:
            raise ValueError(
                f"add_init_obs: agent {agent_id!r} already has an observation in episode {eid!r}"
            )
        pending.obs[agent_id] = init_obs
        pending.infos[agent_id] = {} if init_infos is None else init_infos
        self._queues.setdefault(policy_id, []).append(
            (eid, env_id, agent_id, init_obs, pending.infos[agent_id])
        )

    def add_action_reward_next_obs(
        self,
        episode_id: Any,
        agent_id: Any,
        env_id: Any,
        policy_id: Any,
        agent_done: bool,
        values: dict[str, Any],
    ) -> None:
        """One agent's part of the current env step (see the module docstring for
        ``values``); queues the agent if it got ``new_obs`` and is not ``agent_done``."""
        ep = self._episode(episode_id)
        if self._env_of[ep.id_] != env_id:
            raise ValueError(
                f"episode {episode_id!r} runs in env {self._env_of[ep.id_]!r}, not {env_id!r}"
            )
        self._map_policy(ep, agent_id, policy_id)
        self._flush_reset(ep)
        p = self._step[ep.id_]
        if "actions" in values:
            p.actions[agent_id] = values["actions"]
            extras = {k: v for k, v in values.items() if k not in _STEP_KEYS}
            if extras:
                p.extras[agent_id] = extras
        if "rewards" in values:
            p.rewards[agent_id] = p.rewards.get(agent_id, 0.0) + float(values["rewards"])
        elif "actions" in values and "new_obs" in values:
            p.rewards.setdefault(agent_id, 0.0)
        term, trunc = bool(values.get("terminateds", False)), bool(values.get("truncateds", False))
        if term:
            p.terms[agent_id] = True
        if trunc:
            p.truncs[agent_id] = True
        if "new_obs" in values:
            p.obs[agent_id] = values["new_obs"]
            p.infos[agent_id] = values.get("infos") or {}
            if not (agent_done or term or trunc):
                self._queues.setdefault(policy_id, []).append(
                    (ep.id_, env_id, agent_id, values["new_obs"], p.infos[agent_id])
                )

    def episode_step(
        self,
        episode: MultiAgentEpisode | Any,
        terminateds: dict | None = None,
        truncateds: dict | None = None,
    ) -> None:
        """Ends the current env step of ``episode``: one ``add_env_step`` with the agents'
        data. ``terminateds`` / ``truncateds``: the env's dicts (``"__all__"`` and
        per-agent flags, OR-ed with those given per agent)."""
        ep = self._episode(episode)
        self._flush_reset(ep)
        p = self._step[ep.id_]
        terms, truncs = dict(p.terms), dict(p.truncs)
        for src, dst in ((terminateds or {}), terms), ((truncateds or {}), truncs):
            for a, v in src.items():
                if v:
                    dst[a] = True
        ep.add_env_step(
            p.obs,
            p.actions,
            p.rewards,
            p.infos,
            terminateds=terms,
            truncateds=truncs,
            extra_model_outputs=p.extras,
        )
        if (
            terminateds is not None
            and ALL_AGENTS in terminateds
            or truncateds is not None
            and ALL_AGENTS in truncateds
        ):
            env_done = bool(terms.get(ALL_AGENTS, False) or truncs.get(ALL_AGENTS, False))
            ep.is_terminated = ep.is_terminated and env_done
        self._step[ep.id_] = _Pending()

    # -- inference input ---------------------------------------------------------------

    def get_inference_input_dict(self, policy_id: Any) -> SampleBatch:
        """The agents of ``policy_id`` queued since the last call, in queue order, as a
        ``SampleBatch``: ``obs`` (stacked), ``env_id``, ``agent_id``, ``eps_id`` (the
        multi-agent episode id), ``agent_index``, ``t`` (the agent's timestep of that
        observation) and ``infos``; then clears the queue. Empty: ``SampleBatch()``.

        Raises:
            RuntimeError: an agent's episode has an env step not yet closed with
                :meth:`episode_step`.
        """
        entries = self._queues.get(policy_id, [])
        if not entries:
            return SampleBatch()
        for eid in dict.fromkeys(e[0] for e in entries):
            if self._step[eid]:
                raise RuntimeError(
                    f"episode {eid!r} has an open env step: call episode_step() before "
                    "get_inference_input_dict()"
                )
        del self._queues[policy_id]
        cols: dict[str, list] = {
            "env_id": [],
            "agent_id": [],
            "eps_id": [],
            "agent_index": [],
            "t": [],
        }
        for eid, env_id, aid, _, _ in entries:
            ep = self._episode(eid)
            self._flush_reset(ep)
            cols["env_id"].append(env_id)
            cols["agent_id"].append(aid)
            cols["eps_id"].append(eid)
            cols["agent_index"].append(self._agent_index(ep, aid))
            cols["t"].append(ep.agent_episodes[aid].t)
        out: dict[str, Any] = {
            k: _obj_array(v) for k, v in cols.items() if k in ("env_id", "agent_id", "eps_id")
        }
        out["agent_index"] = np.asarray(cols["agent_index"], np.int64)
        out["t"] = np.asarray(cols["t"], np.int64)
        out["obs"] = stack([e[3] for e in entries])
        out["infos"] = [e[4] for e in entries]
        return SampleBatch(out)

    # -- closing chunks and building batches ---------------------------------------------

    def postprocess_episode(
        self,
        episode: MultiAgentEpisode | Any,
        is_done: bool = False,
        check_dones: bool = False,
        build: bool = False,
    ) -> MultiAgentBatch | None:
        """Closes the episode's current chunk (numpy'ized) for the next batch.

        ``is_done``: the episode is over and forgotten; otherwise it continues in a ``cut``
        successor (same ``id_``, ``episode_lookback_horizon`` steps of lookback), and a
        chunk without steps is not closed. ``check_dones`` (with ``is_done``): raise
        ``ValueError`` unless the episode and all its agents are done. ``build``: return
        the batch of this episode's closed chunks (they leave the collector).
        """
        ep = self._episode(episode)
        eid = ep.id_
        if self._step[eid]:
            raise RuntimeError(f"episode {eid!r} has an open env step: call episode_step() first")
        self._flush_reset(ep)
        if is_done:
            if check_dones:
                not_done = [a for a, sa in ep.agent_episodes.items() if not sa.is_done]
                if not ep.is_done or not_done:
                    raise ValueError(
                        f"postprocess_episode(is_done=True, check_dones=True): episode {eid!r} "
                        f"is not done (is_terminated={ep.is_terminated}, "
                        f"is_truncated={ep.is_truncated}, agents not done: {not_done})"
                    )
            self._forget(eid)
            closed = ep
        elif len(ep) > 0:
            self._episodes[eid] = ep.cut(self.episode_lookback_horizon)
            closed = ep
        else:
            closed = None
        if closed is not None:
            closed.to_numpy()
            self._built.append(closed)
        if build:
            mine = [c for c in self._built if c.id_ == eid]
            self._built = [c for c in self._built if c.id_ != eid]
            return self._batch(mine, None)
        return None

    def discard_episode(self, episode: MultiAgentEpisode | Any) -> None:
        """Forgets a running episode and its queued agents; nothing of it is built."""
        eid = episode.id_ if isinstance(episode, MultiAgentEpisode) else episode
        if eid in self._episodes:
            self._forget(eid)

    def build_multi_agent_batch(self, env_steps: int | None = None) -> MultiAgentBatch:
        """All closed chunks as one ``MultiAgentBatch`` (policy id -> ``SampleBatch``, the
        device path's columns, rows chunk by chunk, then agent by agent, then by ``t``);
        ``env_steps`` defaults to the chunks' env steps. The chunks leave the collector."""
        chunks, self._built = self._built, []
        return self._batch(chunks, env_steps)

    def try_build_truncated_episode_multi_agent_batch(self) -> list[MultiAgentBatch]:
        """``[batch]`` once the collected steps reach ``rollout_fragment_length`` (running
        episodes are closed with ``postprocess_episode(is_done=False)`` unless the closed
        chunks alone suffice), else ``[]``. Episodes with an open env step stay as they are."""
        built = sum(self._count(c) for c in self._built)
        ongoing = sum(self._count(ep) for ep in self._episodes.values())
        if built + ongoing < self.rollout_fragment_length:
            return []
        if built < self.rollout_fragment_length:
            for eid, ep in list(self._episodes.items()):
                if len(ep) > 0 and not self._step[eid]:
                    self.postprocess_episode(eid, is_done=False)
        return [self.build_multi_agent_batch()]

    def pop_built_episodes(self) -> list[MultiAgentEpisode]:
        """The closed chunks (numpy'ized) in closing order, instead of a batch; they leave
        the collector."""
        chunks, self._built = self._built, []
        return chunks

    # -- counters ----------------------------------------------------------------------

    def total_env_steps(self) -> int:
        """Env steps collected and not yet built into a batch."""
        return sum(len(c) for c in self._built) + sum(len(ep) for ep in self._episodes.values())

    def total_agent_steps(self) -> int:
        """Completed agent steps collected and not yet built into a batch."""
        return sum(c.agent_steps() for c in self._built) + sum(
            ep.agent_steps() for ep in self._episodes.values()
        )

    def episode(self, episode_id: Any) -> MultiAgentEpisode:
        """The running chunk of an episode."""
        return self._episode(episode_id)

    @property
    def running_episodes(self) -> dict[Any, MultiAgentEpisode]:
        """Episode id -> running chunk."""
        return dict(self._episodes)

    # -- internals ---------------------------------------------------------------------

    def _count(self, ep: MultiAgentEpisode) -> int:
        return len(ep) if self.count_steps_by == "env_steps" else ep.agent_steps()

    def _register(self, episode: MultiAgentEpisode | Any, env_id: Any) -> MultiAgentEpisode:
        if isinstance(episode, MultiAgentEpisode):
            known = self._episodes.get(episode.id_)
            if known is not None and known is not episode:
                raise ValueError(f"another episode object with id {episode.id_!r} is running")
            ep = episode
        else:
            known = self._episodes.get(episode)
            ep = known if known is not None else MultiAgentEpisode(episode)
        if ep.id_ not in self._episodes:
            if ep.is_done:
                raise ValueError(f"episode {ep.id_!r} is already done")
            self._episodes[ep.id_] = ep
            self._env_of[ep.id_] = env_id
            self._step[ep.id_] = _Pending()
        elif self._env_of[ep.id_] != env_id:
            raise ValueError(
                f"episode {ep.id_!r} runs in env {self._env_of[ep.id_]!r}, not {env_id!r}"
            )
        return ep

    def _episode(self, episode: MultiAgentEpisode | Any) -> MultiAgentEpisode:
        eid = episode.id_ if isinstance(episode, MultiAgentEpisode) else episode
        try:
            return self._episodes[eid]
        except KeyError:
            raise KeyError(
                f"unknown or finished episode {eid!r}; start it with add_init_obs()"
            ) from None

    def _map_policy(self, ep: MultiAgentEpisode, agent_id: Any, policy_id: Any) -> None:
        ep.assign_module(agent_id, policy_id)

    def _flush_reset(self, ep: MultiAgentEpisode) -> None:
        p = self._reset.pop(ep.id_, None)
        if p is not None:
            ep.add_env_reset(observations=p.obs, infos=p.infos)

    def _forget(self, eid: Any) -> None:
        for d in (self._episodes, self._env_of, self._reset, self._step):
            d.pop(eid, None)
        for pid, q in self._queues.items():
            self._queues[pid] = [e for e in q if e[0] != eid]

    def _agent_index(self, ep: MultiAgentEpisode, aid: Any) -> int:
        if self.agent_ids is not None and aid in self.agent_ids:
            return self.agent_ids.index(aid)
        return list(ep.agent_episodes).index(aid)

    def _batch(self, chunks: list[MultiAgentEpisode], env_steps: int | None) -> MultiAgentBatch:
        out = episodes_to_batch(chunks, self.agent_ids, self.policy_ids, self.clip_rewards)
        if env_steps is not None:
            out.count = int(env_steps)
        return out


def _obj_array(values: list) -> np.ndarray:
    """Ids as an array: numbers/strings as such, anything else as objects."""
    arr = np.asarray(values)
    if arr.dtype.kind in "iuUS" and arr.ndim == 1:
        return arr
    out = np.empty(len(values), object)
    out[:] = values
    return out


def _column(x: Any) -> Any:
    """A buffer's get() result as arrays (a list of items is stacked)."""
    if isinstance(x, list):
        return stack(x) if x else np.zeros((0,))
    return x


def step_rows(
    obs: Any,
    actions: Any,
    rewards: Any,
    terminated: bool,
    truncated: bool,
    t_started: int,
    eps_id: str,
    agent_index: int,
    infos: list,
    extras: dict[str, Any],
    abandoned: bool | None = None,
) -> dict[str, Any]:
    """The batch rows of ``n`` agent steps (``n >= 1``): ``obs`` holds the ``n + 1``
    observations (stacked), the flags are those of the last step; the columns of
    :func:`episodes_to_batch`. ``abandoned`` (unless ``None``) adds the bool column
    :data:`ABANDONED`, ``True`` only on the last row and only if ``abandoned``."""
    n = len(rewards)
    flags = np.zeros(n, bool)
    rows: dict[str, Any] = {
        SampleBatch.OBS: tree_map(lambda x: x[:n], obs),
        SampleBatch.NEXT_OBS: tree_map(lambda x: x[1:], obs),
        SampleBatch.ACTIONS: actions,
        SampleBatch.REWARDS: np.asarray(rewards, np.float32).reshape(n),
        SampleBatch.TERMINATEDS: flags.copy(),
        SampleBatch.TRUNCATEDS: flags.copy(),
        SampleBatch.T: np.arange(t_started, t_started + n, dtype=np.int64),
        # An object array of one shared str: 8 bytes per row (a ``<U32`` one is 128).
        SampleBatch.EPS_ID: np.full(n, eps_id, dtype=object),
        SampleBatch.AGENT_INDEX: np.full(n, agent_index, np.int64),
        SampleBatch.INFOS: infos,
    }
    rows[SampleBatch.TERMINATEDS][-1] = terminated
    rows[SampleBatch.TRUNCATEDS][-1] = truncated
    rows.update(extras)
    if abandoned is not None:
        mark = flags.copy()
        mark[-1] = abandoned
        rows[ABANDONED] = mark
    return rows


def is_abandoned(info: Any) -> bool:
    """Whether an observation's info says its episode was abandoned (``{"abandoned":
    True}``, set by external envs on the final observation)."""
    return isinstance(info, dict) and info.get(ABANDONED) is True


def _agent_rows(sa: Any, index: int, mark_abandoned: bool = False) -> dict[str, Any]:
    n = len(sa)
    infos = sa.get_infos(slice(0, n))
    infos = (
        list(infos)
        if isinstance(infos, list)
        else [tree_map(lambda x, i=i: x[i], infos) for i in range(n)]
    )
    return step_rows(
        _column(sa.get_observations(slice(0, n + 1))),
        _column(sa.get_actions()),
        sa.get_rewards(),
        sa.is_terminated,
        sa.is_truncated,
        sa.t_started,
        sa.id_,
        index,
        infos,
        {k: _column(sa.get_extra_model_outputs(k)) for k in sa.extra_model_outputs},
        abandoned=(sa.is_truncated and is_abandoned(sa.get_infos(-1)) if mark_abandoned else None),
    )


def concat_rows(parts: list[Any]) -> Any:
    """One column of several row dicts joined (lists chained, arrays concatenated)."""
    if isinstance(parts[0], list):
        return [x for p in parts for x in p]
    return tree_map(lambda *xs: np.concatenate([np.asarray(x) for x in xs]), parts[0], *parts[1:])


def episodes_to_batch(
    episodes: Sequence[MultiAgentEpisode],
    agent_ids: Sequence[Any] | None = None,
    policy_ids: Sequence[Any] = (),
    clip_rewards: bool | float | None = None,
    mark_abandoned: bool = False,
) -> MultiAgentBatch:
    """The device path's ``MultiAgentBatch`` made from episode chunks: one row per
    completed agent step, keyed by policy (the agents' ``module_id``); rows chunk by
    chunk, then agent by agent (``agent_ids`` order), then by ``t``. Columns: ``obs``,
    ``new_obs``, ``actions``, ``rewards`` (float32), ``terminateds``, ``truncateds``,
    ``t``, ``eps_id`` (the agent's episode id, an object array of ``str``),
    ``agent_index``, ``infos`` (a list of dicts) and the extra model outputs;
    ``mark_abandoned`` adds the bool column :data:`ABANDONED` (the last row of an agent
    whose episode was abandoned: truncated, with ``{"abandoned": True}`` in the info of
    its final observation). ``env_steps`` is the chunks' env steps."""
    order = list(agent_ids or ())
    parts: dict[Any, list[dict]] = {pid: [] for pid in policy_ids}
    for ep in episodes:
        agents = sorted(
            ep.agent_episodes, key=lambda a: order.index(a) if a in order else len(order)
        )
        for aid in agents:
            sa = ep.agent_episodes[aid]
            if len(sa) == 0:
                continue
            index = order.index(aid) if aid in order else list(ep.agent_episodes).index(aid)
            pid = sa.module_id if sa.module_id is not None else ep.module_for(aid)
            parts.setdefault(DEFAULT_POLICY_ID if pid is None else pid, []).append(
                _agent_rows(sa, index, mark_abandoned)
            )
    batches = {}
    for pid, rows in parts.items():
        if not rows:
            continue
        cols = {k: concat_rows([r[k] for r in rows]) for k in rows[0]}
        if clip_rewards is True:
            cols[SampleBatch.REWARDS] = np.sign(cols[SampleBatch.REWARDS]).astype(np.float32)
        elif clip_rewards:
            c = float(clip_rewards)
            cols[SampleBatch.REWARDS] = np.clip(cols[SampleBatch.REWARDS], -c, c).astype(np.float32)
        batches[pid] = SampleBatch(cols)
    return MultiAgentBatch(batches, sum(len(ep) for ep in episodes))
