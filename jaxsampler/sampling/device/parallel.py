"""Host-side parallelism for a device sampler's conversion: a small thread pool and the
bulk numpy operations it splits (device-shard copies, row gathers).

numpy releases the GIL while it copies or gathers numeric arrays, so a few threads can
work on disjoint slices of one output at once. These helpers split by the env axis (the
unit a mesh shards) or by rows; they fall back to one plain call where splitting cannot
help (one thread, small arrays, object dtypes).
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

__all__ = [
    "MIN_SHARD_SLOTS",
    "MIN_SPLIT_BYTES",
    "HostPool",
    "current_pool",
    "host_pool",
    "parallel_take",
    "splits",
    "shards_to_host",
    "using_pool",
]

#: below this many bytes an operation runs in the calling thread (measured on 2 vCPUs: a
#: 2 MB gather took 0.1 ms in one thread and 0.28 ms split over two)
MIN_SPLIT_BYTES = 8 << 20

#: below this many ``(env, step, agent)`` slots (or batch rows) a conversion splits no work
#: by env shards or row ranges (each module that uses it holds its own copy of the value)
MIN_SHARD_SLOTS = 1 << 18


class HostPool:
    """A fixed set of worker threads that run slices of one bulk numpy operation.

    Args:
        threads: worker count (``1``: every operation runs in the calling thread).
    """

    def __init__(self, threads: int):
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an int >= 1, got {threads!r}")
        self.threads = threads
        self._pool = (
            ThreadPoolExecutor(threads, thread_name_prefix="jaxsampler-host")
            if threads > 1
            else None
        )

    def run(self, tasks: Sequence[Callable[[], Any]]) -> list[Any]:
        """Runs every task (the last one in the calling thread) and returns their
        results in order; the first task's exception is re-raised after all finished."""
        if self._pool is None or len(tasks) < 2:
            return [t() for t in tasks]
        futures: list[Future[Any]] = [self._pool.submit(t) for t in tasks[:-1]]
        last_exc: BaseException | None = None
        try:
            last = tasks[-1]()
        except BaseException as e:  # wait for the others before raising
            last_exc, last = e, None
        results = [f.result() for f in futures]
        if last_exc is not None:
            raise last_exc
        return results + [last]

    def close(self) -> None:
        """Stops the worker threads (idempotent)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
            self.threads = 1


_pools: dict[int, HostPool] = {}
_lock = threading.Lock()


def host_pool(threads: int | None = None) -> HostPool:
    """The process-wide pool of ``threads`` workers (shared by every sampler asking for
    that count). ``None``: one per local device, at most one per core (``os.cpu_count``)."""
    if threads is None:
        threads = max(1, min(jax.local_device_count(), os.cpu_count() or 1))
    with _lock:
        if threads not in _pools:
            _pools[threads] = HostPool(threads)
        return _pools[threads]


@atexit.register
def _close_pools() -> None:
    for p in _pools.values():
        p.close()


_SERIAL = HostPool(1)
_current: contextvars.ContextVar[HostPool] = contextvars.ContextVar(
    "jaxsampler_host_pool", default=_SERIAL
)


def current_pool() -> HostPool:
    """The pool that conversion code running now should split its bulk work over (set by
    the sampler around a conversion with :func:`using_pool`; a one-thread pool, i.e. no
    splitting, elsewhere)."""
    return _current.get()


@contextlib.contextmanager
def using_pool(pool: HostPool) -> Iterator[HostPool]:
    """Makes ``pool`` :func:`current_pool` inside the ``with`` block (this thread's context)."""
    token = _current.set(pool)
    try:
        yield pool
    finally:
        _current.reset(token)


def splits(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ``(start, stop)`` ranges covering ``range(n)`` (none empty)."""
    parts = max(1, min(parts, n))
    bounds = np.linspace(0, n, parts + 1).astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def parallel_take(
    col: np.ndarray, index: np.ndarray, pool: HostPool | None = None, out: np.ndarray | None = None
) -> np.ndarray:
    """``np.take(col, index, axis=0)``, its rows gathered by the pool's threads, each
    into its own slice of the output.

    The same values as ``np.take`` (indices must be in range: they are checked once, then
    each part gathers with ``mode="clip"``, which writes straight into ``out``, where the
    default ``"raise"`` mode would gather into a temporary buffer and copy; on one thread
    too). Small gathers and object columns run as one plain ``np.take``.

    Args:
        col: the column, rows on axis 0.
        index: int rows to gather, ``0 <= index < len(col)``.
        pool: the threads (``None``: :func:`current_pool`).
        out: where to write ``[len(index), *col.shape[1:]]`` (``None``: a new array).

    Raises:
        IndexError: an index out of range (checked once, before any part runs).
    """
    index = np.asarray(index)
    pool = current_pool() if pool is None else pool
    n = len(index)
    row_bytes = col.itemsize * int(np.prod(col.shape[1:], dtype=np.int64))
    if col.dtype == object or n * row_bytes < MIN_SPLIT_BYTES:
        return np.take(col, index, axis=0, out=out)
    if n and (int(index.min()) < -len(col) or int(index.max()) >= len(col)):
        bad = index[(index < -len(col)) | (index >= len(col))][0]
        raise IndexError(f"index {int(bad)} is out of bounds for {len(col)} rows")
    index = np.where(index < 0, index + len(col), index) if n and index.min() < 0 else index
    if out is None:
        out = np.empty((n,) + col.shape[1:], col.dtype)
    dest = out
    if pool.threads == 1:  # (one "clip" gather straight into out: no temporary)
        return np.take(col, index, axis=0, out=dest, mode="clip")

    def part(a: int, b: int) -> Callable[[], Any]:
        return lambda: np.take(col, index[a:b], axis=0, out=dest[a:b], mode="clip")

    pool.run([part(a, b) for a, b in splits(n, pool.threads)])
    return out


def shards_to_host(tree: Any, pool: HostPool | None = None) -> Any:
    """``jax.device_get`` of a tree of arrays, each leaf split over several devices of
    this process copied shard by shard into one numpy array by the pool's threads
    (``None``: :func:`current_pool`).

    A leaf held whole by one device (or replicated) comes back as ``np.asarray`` gives it
    (on a CPU device: without a copy); a leaf split over devices is assembled in place,
    one task per shard (no concatenation afterwards). Leaves that this process cannot see
    whole (a mesh spanning processes) are not handled here: use
    :func:`jaxsampler.rollout.placement.to_host`.

    Raises:
        ValueError: a leaf is not fully addressable by this process.
    """
    pool = current_pool() if pool is None else pool
    leaves, treedef = jax.tree.flatten(tree)
    out: list[Any] = []
    tasks: list[Callable[[], None]] = []
    for x in leaves:
        if not isinstance(x, jax.Array):
            out.append(x)
            continue
        if not x.is_fully_addressable:
            raise ValueError(
                f"shards_to_host: a leaf of shape {x.shape} spans processes; use "
                "jaxsampler.rollout.placement.to_host"
            )
        shards = _distinct_shards(x)
        if len(shards) < 2:
            out.append(np.asarray(x))
            continue
        dest = np.empty(x.shape, x.dtype)
        out.append(dest)
        tasks += [_copy_shard(dest, s) for s in shards]
    if tasks:
        pool.run(tasks)
    return jax.tree.unflatten(treedef, out)


def _distinct_shards(x: jax.Array) -> list[Any]:
    """One addressable shard per distinct index (replicas skipped)."""
    seen: dict[tuple[tuple[Any, Any, Any], ...], Any] = {}
    for s in x.addressable_shards:
        key = tuple((i.start, i.stop, i.step) for i in s.index)
        seen.setdefault(key, s)
    return list(seen.values())


def _copy_shard(dest: np.ndarray, shard: Any) -> Callable[[], None]:
    def copy() -> None:
        dest[shard.index] = np.asarray(shard.data)

    return copy
