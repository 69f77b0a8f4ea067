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
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from jaxsampler.episodes.batch import Deferred, SampleBatch
from jaxsampler.episodes.ids import EpisodeIds
from jaxsampler.sampling.device.columns import (
    Columns,
    FoundSegments,
    NextRows,
    Segments,
    build_columns,
    empty_infos,
    find_segments,
    first_leaf,
    info_leaves,
    obs_map,
)
from jaxsampler.sampling.device.parallel import MIN_SHARD_SLOTS, HostPool, current_pool, splits
from jaxsampler.sampling.metrics import SamplerMetrics
from jaxsampler.types import Trajectory

__all__ = [
    "applies",
    "batch_columns",
    "deferred_ids",
    "episode_ids",
    "expand_runs",
    "segments",
    "steps",
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
    chunk: Trajectory, partial_return: np.ndarray, pool: HostPool | None = None
) -> tuple[Segments, SamplerMetrics, np.ndarray]:
    """The chunk's episode segments, its metrics and the carried partial returns, as
    :func:`~jaxsampler.sampling.device.columns.find_segments` finds them without a
    ``num_episodes`` cut (lookbacks left at 0: a batch has none). A large chunk is
    searched by contiguous env shards, one per thread of ``pool`` (``None``:
    :func:`~jaxsampler.sampling.device.parallel.current_pool`), then joined: the same
    segments in the same order (envs are independent)."""
    pool = current_pool() if pool is None else pool
    raw = chunk.rewards if chunk.raw_rewards is None else chunk.raw_rewards
    # Env-major views ([E, T], transposed, no copy): the flags are read at the segments'
    # ends only; the rewards are copied once per shard, where they are summed.
    is_reset = np.asarray(chunk.is_reset).T
    terminated, truncated = _agent0(chunk.terminated).T, _agent0(chunk.truncated).T
    rewards = _agent0(raw).T
    step0, count0 = np.asarray(chunk.episode_step_0), np.asarray(chunk.episode_count_0)
    E, T = is_reset.shape
    parts = min(pool.threads, E) if E * T >= MIN_SHARD_SLOTS else 1

    def shard(e0: int, e1: int) -> Callable[[], FoundSegments]:
        return lambda: find_segments(
            is_reset[e0:e1],
            terminated[e0:e1],
            truncated[e0:e1],
            np.ascontiguousarray(rewards[e0:e1]),
            horizon=0,
            step0=step0[e0:e1],
            count0=count0[e0:e1],
            fresh=True,
            partial_return=partial_return[e0:e1],
            num_episodes=None,
        )

    ranges = splits(E, parts)
    found = pool.run([shard(e0, e1) for e0, e1 in ranges])
    f = found[0] if len(found) == 1 else FoundSegments.join(found, [e0 for e0, _ in ranges])
    return f.summarized()


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


def expand_runs(
    lens: np.ndarray,
    columns: Sequence[tuple[np.ndarray, int]],
    pool: HostPool | None = None,
    then: Callable[[int, int, list[np.ndarray]], None] | None = None,
) -> list[np.ndarray]:
    """Per-run values expanded over the runs' rows (runs one after another, run ``r``
    ``lens[r]`` rows long): column ``(first, step)`` gives row ``p`` of run ``r`` the
    value ``first[r] + p * step`` (``int64``).

    An expansion of ``MIN_SHARD_SLOTS`` rows or more is split into contiguous ranges of
    whole runs, up to one per thread of ``pool`` (``None``:
    :func:`~jaxsampler.sampling.device.parallel.current_pool`); ``then(lo, hi, parts)``,
    if given, runs in the same thread right after each range (rows ``lo:hi``; ``parts``:
    the range's slices of the columns), e.g. gathers by the range's index.
    """
    pool = current_pool() if pool is None else pool
    n = int(lens.sum())
    start = np.cumsum(lens) - lens
    # (row r of run i is start[i] + p: its value is (first - start * step)[i] + r * step)
    bases = [np.asarray(f, np.int64) - start * step if step else f for f, step in columns]
    ranges = _segment_ranges(lens, n, pool.threads if n >= MIN_SHARD_SLOTS else 1)
    whole = len(ranges) == 1  # (one range makes the columns themselves)
    outs = [np.empty(0, np.int64) if whole else np.empty(n, np.int64) for _ in columns]

    def fill(r0: int, r1: int) -> Callable[[], None]:
        def run() -> None:
            lo, hi = (int(start[r0]), int(start[r1 - 1] + lens[r1 - 1])) if r1 > r0 else (0, 0)
            parts = []
            for j, (base, (_, step)) in enumerate(zip(bases, columns)):
                part = np.repeat(np.asarray(base, np.int64)[r0:r1], lens[r0:r1])
                if step:
                    part += steps(hi, step)[lo:hi]
                if whole:
                    outs[j] = part
                else:
                    outs[j][lo:hi] = part
                    part = outs[j][lo:hi]
                parts.append(part)
            if then is not None:
                then(lo, hi, parts)

        return run

    pool.run([fill(r0, r1) for r0, r1 in ranges])
    return outs


def batch_columns(
    chunk: Trajectory, seg: Segments, ids: EpisodeIds, pool: HostPool | None = None
) -> dict[str, Any]:
    """The ``SampleBatch`` columns of the segments' rows (in the segments' order), each
    gathered with one index from the chunk's time-major buffers. The rows are filled in
    contiguous ranges of whole segments, up to one per thread of ``pool`` (``None``:
    :func:`~jaxsampler.sampling.device.parallel.current_pool`) where the call is large:
    each range builds its own slice of the index and gathers every column's rows."""
    E = np.shape(first_leaf(chunk.obs))[1]
    lens = seg.len
    n = int(lens.sum())
    first = np.cumsum(lens) - lens
    extras = chunk.extras if isinstance(chunk.extras, dict) else {}
    names = sorted(extras)
    steps_in = [chunk.actions, chunk.rewards, chunk.terminated, chunk.truncated]
    steps_in += [extras[k] for k in names]
    sources = [_flat_rows(x) for x in steps_in]
    obs_in = obs_map(_flat_rows, chunk.obs)
    obs = obs_map(lambda o: np.empty((n,) + o.shape[1:], o.dtype), obs_in)
    outs = [np.empty((n,) + x.shape[1:], x.dtype) for x in sources]

    def gather(lo: int, hi: int, parts: list[np.ndarray]) -> None:
        index = parts[0]
        # (indices in range by construction: "clip" gathers straight into the output)
        obs_map(lambda o, out: np.take(o, index, 0, out[lo:hi], "clip"), obs_in, obs)
        for x, out in zip(sources, outs):
            np.take(x, index, 0, out[lo:hi], "clip")

    # Row p of segment i is step seg.start[i] + p of env seg.env[i]: slot (step * E + env)
    # of the flattened buffers, observations and steps alike; its t counts on from
    # t_started.
    _, t = expand_runs(lens, [(seg.start * E + seg.env, E), (seg.t_started, 1)], pool, gather)
    # A row's new_obs is the next row's obs except at a segment's last row: new_obs is
    # built from the batch's obs on its first read, only those end rows gathered now
    # (a segment's next observation is slot (start + len) * E + env).
    at_end = lens > 0
    last = (first + lens - 1)[at_end]
    after = ((seg.start + lens) * E + seg.env)[at_end]
    ends = obs_map(lambda o: np.take(o, after, axis=0), obs_in)
    actions, rewards, terminated, truncated = outs[:4]
    data: dict[str, Any] = {
        SampleBatch.OBS: obs,
        SampleBatch.NEXT_OBS: Deferred(NextRows(obs, last, ends).guard()),
        SampleBatch.ACTIONS: actions,
        SampleBatch.REWARDS: rewards,
        SampleBatch.TERMINATEDS: terminated,
        SampleBatch.TRUNCATEDS: truncated,
        SampleBatch.T: t,
        SampleBatch.EPS_ID: deferred_ids(ids, seg),
        SampleBatch.AGENT_INDEX: np.zeros(n, np.int64),
        SampleBatch.INFOS: Deferred(partial(empty_infos, n)),
    }
    for name, col in zip(names, outs[4:]):
        data[name] = col
    return data


def _flat_rows(x: Any) -> np.ndarray:
    """Agent 0's ``[T(+1), E, ...]`` of a ``[T(+1), E, A, ...]`` buffer as ``[T(+1) * E,
    ...]`` rows (a view where the buffer allows it)."""
    a = _agent0(x)
    return a.reshape((-1,) + a.shape[2:])


def _segment_ranges(lens: np.ndarray, n: int, parts: int) -> list[tuple[int, int]]:
    """Up to ``parts`` contiguous ranges of whole segments with about ``n / parts`` rows
    each, covering every segment (one range when ``parts`` is 1)."""
    if parts <= 1 or len(lens) < 2:
        return [(0, len(lens))]
    cuts = np.searchsorted(np.cumsum(lens), np.linspace(0, n, parts + 1)[1:-1], side="right")
    bounds = np.unique(np.concatenate([[0], cuts, [len(lens)]]))
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
