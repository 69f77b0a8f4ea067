"""Single-agent ``sample_batch()`` rows gathered straight from one time-major chunk.

The common call (one rollout chunk, no ``num_episodes``, an env without infos) needs no
env-major copy of its columns: every batch row is one slot ``t * E + e`` of the
flattened time-major buffers, so one index array gathers the observations, the actions,
the rewards, the flags and every extra. Only the four flag / reward columns the episode
segments are cut from are transposed (small), and the call's lookback head is built
from its last ``H`` steps alone. The rows, their order and the carried state equal what
the general (env-major) path gives; :func:`applies` says when this path is taken.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np

from jaxsampler.episodes.batch import Deferred, SampleBatch
from jaxsampler.episodes.ids import EpisodeIds
from jaxsampler.sampling.device.columns import (
    Columns,
    NextRows,
    Segments,
    build_columns,
    empty_infos,
    find_segments,
    first_leaf,
    info_leaves,
    obs_map,
)
from jaxsampler.sampling.metrics import SamplerMetrics
from jaxsampler.types import Trajectory

__all__ = [
    "applies",
    "batch_columns",
    "deferred_ids",
    "episode_ids",
    "segments",
    "steps",
    "t_column",
    "tail_head",
]


def applies(chunks: Sequence[Trajectory], num_episodes: int | None, horizon: int) -> bool:
    """Whether :func:`segments` / :func:`batch_columns` serve this call: one chunk of at
    least ``horizon`` steps (its head comes from that chunk alone), no ``num_episodes``
    cut and no env infos (an info row needs the previous call's last info)."""
    if len(chunks) != 1 or num_episodes is not None:
        return False
    c = chunks[0]
    return np.shape(c.rewards)[0] >= horizon and not info_leaves(c.infos)


def _agent0(x: Any) -> np.ndarray:
    """A step field ``[T, E, A, ...]`` as agent 0's ``[T, E, ...]`` (a view)."""
    return np.asarray(x)[:, :, 0]


def _env_major(x: np.ndarray) -> np.ndarray:
    """``[T, E]`` as a C-contiguous ``[E, T]`` copy."""
    return np.ascontiguousarray(x.T)


def _time_slice(chunk: Trajectory, lo: int) -> Trajectory:
    """The chunk's steps ``lo:`` (observation slots ``lo:``), what :func:`tail_head`
    builds the next call's head from."""

    def steps(x: Any) -> Any:
        return None if x is None else np.asarray(x)[lo:]

    extras = chunk.extras if isinstance(chunk.extras, dict) else {}
    return dataclasses.replace(
        chunk,
        obs=obs_map(lambda o: np.asarray(o)[lo:], chunk.obs),
        actions=steps(chunk.actions),
        rewards=steps(chunk.rewards),
        terminated=steps(chunk.terminated),
        truncated=steps(chunk.truncated),
        acting=steps(chunk.acting),
        is_reset=steps(chunk.is_reset),
        extras={k: steps(v) for k, v in extras.items()},
        raw_rewards=steps(chunk.raw_rewards),
    )


def tail_head(chunk: Trajectory, horizon: int) -> Columns:
    """The next call's lookback head (:meth:`Columns.tail` of the call's columns) from a
    chunk of at least ``horizon`` steps: only its last ``horizon`` steps are copied."""
    T = int(np.shape(chunk.rewards)[0])
    tail = _time_slice(chunk, T - horizon)
    return build_columns([tail], None, {}, 0, multi_agent=False).tail(horizon)


def segments(
    chunk: Trajectory, partial_return: np.ndarray
) -> tuple[Segments, SamplerMetrics, np.ndarray]:
    """The chunk's episode segments, its metrics and the carried partial returns, as
    :func:`~jaxsampler.sampling.device.columns.find_segments` finds them without a
    ``num_episodes`` cut (lookbacks left at 0: a batch has none)."""
    rewards = chunk.rewards if chunk.raw_rewards is None else chunk.raw_rewards
    # Env-major views ([E, T], transposed, no copy): the flags are read at the segments'
    # ends only; is_reset and the rewards are copied once, where they are scanned.
    return find_segments(
        np.asarray(chunk.is_reset).T,
        _agent0(chunk.terminated).T,
        _agent0(chunk.truncated).T,
        _env_major(_agent0(rewards)),
        horizon=0,
        step0=np.asarray(chunk.episode_step_0),
        count0=np.asarray(chunk.episode_count_0),
        fresh=True,
        partial_return=partial_return,
        num_episodes=None,
    )


def episode_ids(
    ids: EpisodeIds, env: np.ndarray, count: np.ndarray, lens: np.ndarray
) -> np.ndarray:
    """The batch's ``eps_id`` column: each segment's id repeated over its rows, an object
    array of shared ``str`` (as a batch built from episodes holds it)."""
    return np.repeat(ids.many(env, count).astype(object), lens)


def deferred_ids(ids: EpisodeIds, seg: Segments) -> Deferred:
    """:func:`episode_ids` of the segments as a column built on its first read (most
    learners never read it); the ids are those of ``ids`` now, not after a reset."""
    return Deferred(partial(episode_ids, copy.copy(ids), seg.env, seg.count, seg.len))


_STEPS: dict[int, np.ndarray] = {}


def steps(n: int, step: int) -> np.ndarray:
    """``np.arange(0, n * step, step)`` (``int64``, read-only), sliced from a cached array
    that grows as needed: the row offsets every call adds, without a fresh megabyte
    (whose first touch costs page faults) per call."""
    cached = _STEPS.get(step)
    if cached is None or len(cached) < n:
        cached = np.arange(0, max(n, 1024) * step, step, dtype=np.int64)
        cached.flags.writeable = False
        _STEPS[step] = cached
    return cached[:n]


def t_column(t0: np.ndarray, lens: np.ndarray, n: int) -> np.ndarray:
    """The batch's ``t`` column: segment ``i``'s rows count up from ``t0[i]`` (``int64``)."""
    t = np.repeat(t0.astype(np.int64), lens)
    t += steps(n, 1)
    return t


def batch_columns(chunk: Trajectory, seg: Segments, ids: EpisodeIds) -> dict[str, Any]:
    """The ``SampleBatch`` columns of the segments' rows (in the segments' order), each
    gathered with one index from the chunk's time-major buffers."""
    E = np.shape(first_leaf(chunk.obs))[1]
    lens = seg.len
    n = int(lens.sum())
    first = np.cumsum(lens) - lens
    # Row r of segment i is step seg.start[i] + (r - first[i]) of env seg.env[i]: slot
    # (step * E + env) of the flattened buffers, observations and steps alike.
    index = np.repeat((seg.start - first) * E + seg.env, lens)
    index += steps(n, E)

    def rows(x: Any, at: np.ndarray) -> np.ndarray:
        a = _agent0(x)
        return np.take(a.reshape((-1,) + a.shape[2:]), at, axis=0)

    obs = obs_map(lambda o: rows(o, index), chunk.obs)
    # A row's new_obs is the next row's obs except at a segment's last row: new_obs is
    # built from the batch's obs on its first read, only those end rows gathered now.
    last = (first + lens - 1)[lens > 0]
    ends = obs_map(lambda o: rows(o, index[last] + E), chunk.obs)
    data: dict[str, Any] = {
        SampleBatch.OBS: obs,
        SampleBatch.NEXT_OBS: Deferred(NextRows(obs, last, ends).guard()),
        SampleBatch.ACTIONS: rows(chunk.actions, index),
        SampleBatch.REWARDS: rows(chunk.rewards, index),
        SampleBatch.TERMINATEDS: rows(chunk.terminated, index),
        SampleBatch.TRUNCATEDS: rows(chunk.truncated, index),
        SampleBatch.T: t_column(seg.t_started - first, lens, n),
        SampleBatch.EPS_ID: deferred_ids(ids, seg),
        SampleBatch.AGENT_INDEX: np.zeros(n, np.int64),
        SampleBatch.INFOS: Deferred(partial(empty_infos, n)),
    }
    extras = chunk.extras if isinstance(chunk.extras, dict) else {}
    for name in sorted(extras):
        data[name] = rows(extras[name], index)
    return data
