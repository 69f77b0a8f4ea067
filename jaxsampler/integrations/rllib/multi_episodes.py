"""RLlib ``MultiAgentEpisode`` objects straight from the column arrays of jaxsampler's
multi-agent episode chunks, and each chunk's per-agent returns and lengths in one
vectorized pass: the two halves of ``JaxMultiAgentEnvRunner.sample()``'s host side.

:func:`rllib_multi_agent_episodes` gives, field by field, what
:func:`~jaxsampler.integrations.rllib.convert.to_rllib` gives for the same chunks (a test
compares every getter of both), with a fraction of its Python work: each agent's
``SingleAgentEpisode`` and its buffers are built inline over the agent's arrays (numpy
views, not copies), the spaces and the per-episode dicts that all chunks of a call share
are converted once per call, and the cyclic garbage collector waits meanwhile.

:func:`chunk_stats` reads the chunks' rewards as one concatenated column and returns the
``(chunk, agent)`` returns, step counts and presence as arrays, so the runner's metrics
need no per-agent getter call (RLlib's ``get_return()`` costs ~15 us per agent).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxsampler.episodes.multi_agent import MultiAgentEpisode as JsMultiAgentEpisode
from jaxsampler.integrations.rllib import require_rllib
from jaxsampler.sampling.device.columns import no_gc

require_rllib()

from ray.rllib.env.multi_agent_episode import (  # noqa: E402
    MultiAgentEpisode as RlMultiAgentEpisode,
)
from ray.rllib.env.single_agent_episode import (  # noqa: E402
    SingleAgentEpisode as RlSingleAgentEpisode,
)
from ray.rllib.env.utils.infinite_lookback_buffer import (  # noqa: E402
    InfiniteLookbackBuffer as RlBuffer,
)

from jaxsampler.integrations.rllib.convert import (  # noqa: E402
    _JS_DEFAULT_MAPPING,
    _RL_DEFAULT_MAPPING,
    _Spaces,
)

__all__ = ["ChunkStats", "chunk_stats", "rllib_multi_agent_episodes"]


class _SpaceMemo:
    """``(gymnasium space, RLlib struct)`` per jaxsampler space, with a one-entry cache per
    column kind in front of :class:`_Spaces` (the buffers of one column kind almost always
    hold the same space object, so the common case is one identity test)."""

    __slots__ = ("_spaces", "_last")

    def __init__(self, spaces: _Spaces) -> None:
        self._spaces = spaces
        self._last: dict[str, tuple[Any, Any, Any]] = {}

    def get(self, kind: str, space: Any) -> tuple[Any, Any]:
        hit = self._last.get(kind)
        if hit is not None and hit[0] is space:
            return hit[1], hit[2]
        gym_space, struct = self._spaces.rl(space)
        self._last[kind] = (space, gym_space, struct)
        return gym_space, struct


def rllib_multi_agent_episodes(
    episodes: Sequence[JsMultiAgentEpisode],
) -> list[RlMultiAgentEpisode]:
    """RLlib ``MultiAgentEpisode`` objects with every field of ``episodes``' chunks.

    Equal, getter by getter, to ``to_rllib(list(episodes))`` (the numpy columns are shared
    as views; list-mode columns and env-step maps are copied shallowly, the hanging caches
    and the per-episode dicts copied, as ``to_rllib`` does), but built inline: per agent
    only RLlib's episode, its buffers and its extras dict are made.

    Args:
        episodes: jaxsampler ``MultiAgentEpisode`` chunks (one sampler call's).

    Returns:
        One RLlib episode per chunk, in order.

    Raises:
        TypeError: an item is not a jaxsampler ``MultiAgentEpisode``, or holds a space
            that has no gymnasium equivalent.
    """
    for i, ep in enumerate(episodes):
        if not isinstance(ep, JsMultiAgentEpisode):
            raise TypeError(
                f"rllib_multi_agent_episodes: item {i} is a {type(ep).__name__}, not a "
                "jaxsampler MultiAgentEpisode"
            )
    spaces = _Spaces()
    memo = _SpaceMemo(spaces)
    per_agent: dict[int, tuple[Any, Any]] = {}  # id(js dict of spaces) -> (dict, rl dict)
    new_buf, new_sa = RlBuffer.__new__, RlSingleAgentEpisode.__new__
    new_ma = RlMultiAgentEpisode.__new__
    out: list[RlMultiAgentEpisode] = []
    append = out.append

    def rl_spaces(value: Any) -> Any:
        """An episode's per-agent (or single) space, converted once per call."""
        hit = per_agent.get(id(value))
        if hit is None or hit[0] is not value:
            if isinstance(value, dict):
                conv: Any = {k: spaces.to_gym(v) for k, v in value.items()}
            else:
                conv = spaces.to_gym(value)
            hit = per_agent[id(value)] = (value, conv)
        conv = hit[1]
        return dict(conv) if type(conv) is dict else conv

    def buffer(b: Any, kind: str) -> Any:
        """RLlib's buffer over a jaxsampler buffer's data (a list is copied shallowly)."""
        x: Any = new_buf(RlBuffer)
        data = b.data
        if type(data) is list:
            x.data, x.finalized = list(data), False
        else:
            x.data, x.finalized = data, True
        x.lookback = b.lookback
        x._space, x._space_struct = memo.get(kind, b.space)
        return x

    # The agents' column buffers almost always share one space object per column: the
    # last one seen and its conversion are kept in locals (one identity test per buffer).
    obs_js = act_js = rew_js = object()
    obs_rl = act_rl = rew_rl = (None, None)
    obs_space_js = act_space_js = object()
    obs_space_rl = act_space_rl = None
    ndarray = np.ndarray
    with no_gc():  # tens of thousands of small acyclic objects: no cyclic-GC passes
        for ep in episodes:
            ma: Any = new_ma(RlMultiAgentEpisode)
            ma.id_ = ep.id_
            fn = ep.agent_to_module_mapping_fn
            ma.agent_to_module_mapping_fn = _RL_DEFAULT_MAPPING if fn is _JS_DEFAULT_MAPPING else fn
            ma._agent_to_module_mapping = ep.agent_to_module_mapping  # (a copy)
            ma.observation_space = rl_spaces(ep.observation_space)
            ma.action_space = rl_spaces(ep.action_space)
            ma.env_t_started, ma.env_t = ep.env_t_started, ep.env_t
            ma.agent_t_started = defaultdict(int, ep.agent_t_started)
            maps = ma.env_t_to_agent_t = defaultdict(RlBuffer)
            for aid, m in ep.env_t_to_agent_t.items():
                maps[aid] = buffer(m, "map")
            ma._hanging_actions_end = dict(ep._hanging_actions_end)
            ma._hanging_extra_model_outputs_end = defaultdict(
                dict, {k: dict(v) for k, v in ep._hanging_extra_model_outputs_end.items()}
            )
            ma._hanging_rewards_end = defaultdict(float, ep._hanging_rewards_end)
            ma._hanging_rewards_begin = defaultdict(float, ep._hanging_rewards_begin)
            ma.is_terminated, ma.is_truncated = ep.is_terminated, ep.is_truncated
            ma.agent_episodes = agents = {}
            y: Any
            for aid, sa in ep.agent_episodes.items():
                x: Any = new_sa(RlSingleAgentEpisode)
                x.id_, x.agent_id, x.module_id, x.multi_agent_episode_id = (
                    sa.id_,
                    sa.agent_id,
                    sa.module_id,
                    sa.multi_agent_episode_id,
                )
                # observations, actions, rewards: numpy'ized columns (else the general path)
                b = sa.observations
                if type(b.data) is ndarray:
                    if (space := b.space) is not obs_js:
                        obs_js, obs_rl = space, memo.get("obs", space)
                    y = x.observations = new_buf(RlBuffer)
                    y.data, y.finalized, y.lookback = b.data, True, b.lookback
                    y._space, y._space_struct = obs_rl
                else:
                    x.observations = buffer(b, "obs")
                b = sa.actions
                if type(b.data) is ndarray:
                    if (space := b.space) is not act_js:
                        act_js, act_rl = space, memo.get("act", space)
                    y = x.actions = new_buf(RlBuffer)
                    y.data, y.finalized, y.lookback = b.data, True, b.lookback
                    y._space, y._space_struct = act_rl
                else:
                    x.actions = buffer(b, "act")
                b = sa.rewards
                if type(b.data) is ndarray:
                    if (space := b.space) is not rew_js:
                        rew_js, rew_rl = space, memo.get("rew", space)
                    y = x.rewards = new_buf(RlBuffer)
                    y.data, y.finalized, y.lookback = b.data, True, b.lookback
                    y._space, y._space_struct = rew_rl
                else:
                    x.rewards = buffer(b, "rew")
                x.infos = buffer(sa.infos, "infos")
                x.extra_model_outputs = extras = {}
                for k, b in sa.extra_model_outputs.items():
                    if b.space is None and type(b.data) is ndarray:
                        y = extras[k] = new_buf(RlBuffer)
                        y.data, y.finalized, y.lookback = b.data, True, b.lookback
                        y._space = y._space_struct = None
                    else:
                        extras[k] = buffer(b, "extra")
                space = sa.observation_space
                if space is not obs_space_js:
                    obs_space_js, obs_space_rl = space, memo.get("obs_space", space)[0]
                space = sa.action_space
                if space is not act_space_js:
                    act_space_js, act_space_rl = space, memo.get("act_space", space)[0]
                x._observation_space, x._action_space = obs_space_rl, act_space_rl
                x.is_terminated, x.is_truncated = sa.is_terminated, sa.is_truncated
                x.t_started, x.t = sa.t_started, sa.t
                x._custom_data = dict(sa.custom_data)
                x._start_time, x._last_step_time = sa.step_times
                x._last_added_observation = x._last_added_infos = None
                agents[aid] = x
            ma._len_lookback_buffers = ep._len_lookback_buffers
            ma._custom_data = dict(ep.custom_data)
            ma._start_time, ma._last_step_time = ep._start_time, ep._last_step_time
            append(ma)
    return out


@dataclasses.dataclass(frozen=True)
class ChunkStats:
    """Per ``(chunk, agent)`` sums of one call's multi-agent episode chunks.

    Attributes:
        length: ``int64[M]``, each chunk's own env steps (``len(episode)``).
        returns: ``float64[M, A]``, each agent's return in the chunk (0 where absent).
        steps: ``int64[M, A]``, each agent's own steps in the chunk.
        present: ``bool[M, A]``, whether the agent has an episode in the chunk.
    """

    length: np.ndarray
    returns: np.ndarray
    steps: np.ndarray
    present: np.ndarray


def chunk_stats(episodes: Sequence[Any], agent_ids: Sequence[Any]) -> ChunkStats:
    """:class:`ChunkStats` of numpy'ized RLlib (or jaxsampler) multi-agent chunks.

    Each agent's return is the sum of its own rewards (the lookback excluded) in float64,
    computed for all agents at once from one concatenated reward column.

    Args:
        episodes: ``MultiAgentEpisode`` chunks whose agents' rewards are arrays.
        agent_ids: the columns of the result, in order.

    Raises:
        ValueError: a chunk holds an agent not in ``agent_ids``.
        TypeError: an agent's rewards are a list (not numpy'ized).
    """
    column = {aid: i for i, aid in enumerate(agent_ids)}
    M, A = len(episodes), len(agent_ids)
    length = np.empty(M, np.int64)
    rows: list[int] = []
    cols: list[int] = []
    own: list[int] = []
    arrays: list[np.ndarray] = []
    for m, ep in enumerate(episodes):
        length[m] = ep.env_t - ep.env_t_started
        for aid, sa in ep.agent_episodes.items():
            a = column.get(aid)
            if a is None:
                raise ValueError(
                    f"chunk_stats: episode {ep.id_!r} holds agent {aid!r}, not one of "
                    f"{list(agent_ids)}"
                )
            rewards = sa.rewards
            data = rewards.data
            if type(data) is not np.ndarray:
                raise TypeError(
                    f"chunk_stats: agent {aid!r} of episode {ep.id_!r} has list-mode "
                    "rewards; numpy'ize the episode first"
                )
            rows.append(m)
            cols.append(a)
            own.append(rewards.lookback)
            arrays.append(data)
    returns = np.zeros((M, A), np.float64)
    steps = np.zeros((M, A), np.int64)
    present = np.zeros((M, A), bool)
    if arrays:
        sizes = np.fromiter(map(len, arrays), np.int64, len(arrays))
        ends = np.cumsum(sizes)
        cum = np.zeros(int(ends[-1]) + 1, np.float64)
        np.cumsum(np.concatenate(arrays), dtype=np.float64, out=cum[1:])
        starts = ends - sizes + np.asarray(own, np.int64)
        r, c = np.asarray(rows, np.intp), np.asarray(cols, np.intp)
        returns[r, c] = cum[ends] - cum[starts]
        steps[r, c] = ends - starts
        present[r, c] = True
    return ChunkStats(length, returns, steps, present)
