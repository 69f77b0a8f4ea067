"""Typed host columns of one sampler call, and the episode segments found in them.

Both converters of :class:`~jaxsampler.sampling.device.DeviceSampler` start here: the
call's time-major chunks ``[T, E, A, ...]`` become env-major :class:`Columns`
``[E, H + T_total, ...]`` (``H`` lookback steps carried from the previous call come
first), and :func:`find_segments` cuts every env's steps into episode segments with
``np.nonzero`` over the ``is_reset`` flags. Everything is vectorized over steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from jaxsampler.episodes.lookback import tree_map
from jaxsampler.sampling.device.parallel import MIN_SPLIT_BYTES, current_pool
from jaxsampler.sampling.metrics import SamplerMetrics
from jaxsampler.types import NoInfo, Trajectory

__all__ = [
    "Columns",
    "FoundSegments",
    "InfoPath",
    "NextRows",
    "Segments",
    "build_columns",
    "check_chunks",
    "empty_infos",
    "find_segments",
    "info_for_obs",
    "info_leaves",
    "first_leaf",
    "no_gc",
    "obs_at",
    "obs_map",
    "unflatten",
    "with_transform_infos",
]

InfoPath = tuple[str, ...]
"""Where an env info leaf sits in the info pytree: ``("a", "b")`` is ``info["a"]["b"]``."""


@dataclasses.dataclass
class Columns:
    """Host columns of a call: one numpy array per rollout buffer field.

    Single-agent columns are ``[E, S, ...]`` (the agent axis dropped), ``obs`` with one
    time slot more than the others (or, with ``time_major_obs``, as the buffers hold it:
    ``[T_total + 1, E, ...]`` without the head, for a batch's row gathers). Multi-agent
    ones keep it, ``[E, S, A, ...]``, except ``obs``, which stays time-major as the
    buffers hold it, ``[T_total + 1, E, A, ...]``, the call's own slots only (no head: a
    row gather reads it in place, and transposing it costs more than the gather saves).
    ``infos`` are the env info leaves by path; the info at slot ``j`` came with the step
    at slot ``j`` (so with observation ``j + 1``).
    For ``Dict`` / ``Tuple`` observation spaces ``obs`` is a struct (dicts and tuples, as
    the rollout buffers hold it) of such arrays, one per leaf, all with the same leading
    axes: work on it leaf by leaf with :func:`obs_map`.
    """

    obs: Any  # an array, or a dict / tuple struct of arrays (nested spaces)
    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    is_reset: np.ndarray  # bool [E, S]: reset steps (no action, not a timestep)
    acting: np.ndarray | None = None  # multi-agent: bool [E, S, A]
    extras: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    infos: dict[InfoPath, np.ndarray] = dataclasses.field(default_factory=dict)
    time_major_obs: bool = False
    #: the env's own rewards where transforms change them (``Trajectory.raw_rewards``),
    #: for the metrics' returns; ``None``: ``rewards`` are the env's
    raw_rewards: np.ndarray | None = None

    @property
    def env_rewards(self) -> np.ndarray:
        """The env's own rewards (the metrics' returns are sums of these)."""
        return self.rewards if self.raw_rewards is None else self.raw_rewards

    def map(self, step: Callable[[np.ndarray], np.ndarray], obs: Callable) -> Columns:
        """The columns with ``step`` applied to every step column and ``obs`` to every
        observation leaf."""
        return Columns(
            obs=obs_map(obs, self.obs),
            actions=step(self.actions),
            rewards=step(self.rewards),
            terminated=step(self.terminated),
            truncated=step(self.truncated),
            is_reset=step(self.is_reset),
            acting=None if self.acting is None else step(self.acting),
            extras={k: step(v) for k, v in self.extras.items()},
            infos={k: step(v) for k, v in self.infos.items()},
            time_major_obs=self.time_major_obs,
            raw_rewards=None if self.raw_rewards is None else step(self.raw_rewards),
        )

    def tail(self, horizon: int) -> Columns:
        """The last ``horizon`` steps (copies), the next call's lookback head; for ``obs``
        the ``horizon`` observations before the last slot, which the next call repeats."""
        axis = 0 if self.time_major_obs else 1
        n_obs = first_leaf(self.obs).shape[axis]
        return self.map(
            lambda c: c[:, c.shape[1] - horizon :].copy(),
            lambda o: np.take(o, np.arange(n_obs - 1 - horizon, n_obs - 1), axis=axis),
        )


def obs_map(fn: Callable[..., Any], obs: Any, *rest: Any) -> Any:
    """``fn`` over the leaves of an observation column (an array: ``fn(obs)``; a dict /
    tuple struct of arrays: the same struct of ``fn``'s results), leaves of ``rest``
    (structs like ``obs``) passed alongside."""
    if type(obs) is np.ndarray:  # the common case: one isinstance check, no recursion
        return fn(obs, *rest)
    return tree_map(fn, obs, *rest)


@dataclasses.dataclass(frozen=True)
class NextRows:
    """A batch's ``new_obs`` column held as its ``obs`` column plus the few rows where a
    row's next observation is not the next row's: calling it builds the column.

    Row ``i`` of the built column is ``obs[i + 1]``, except rows ``rows`` (ascending),
    which are ``ends`` (the real next observations where a segment / an agent's run of
    rows ends; the last row must be one of them). It keeps only ``obs`` (the batch's own
    array, or a slice of it) and the end rows, never the call's buffers, so it can sit in
    a batch as a :class:`~jaxsampler.episodes.batch.Deferred` column's builder. ``obs``
    and ``ends`` are arrays, or dict / tuple structs of them (built leaf by leaf).

    :meth:`guard` makes ``obs``' arrays read-only until the column is built (then they
    are writable again): an in-place write to the batch's ``obs`` would otherwise show
    in a ``new_obs`` built after it, so it raises instead.
    """

    obs: Any  # [N, ...] (a struct of such arrays for nested spaces)
    rows: np.ndarray  # int [K], ascending, the last one N - 1 when N > 0
    ends: Any  # [K, ...], like obs

    def __post_init__(self) -> None:
        n, k = len(first_leaf(self.obs)), len(self.rows)
        if n and (not k or self.rows[-1] != n - 1):
            last = int(self.rows[-1]) if k else None
            raise ValueError(f"the last of {n} rows must be an end row, got end rows ending {last}")
        if len(first_leaf(self.ends)) != k:
            raise ValueError(f"{k} end rows but {len(first_leaf(self.ends))} end observations")

    def __call__(self) -> Any:
        """The built column: fresh C-contiguous arrays like ``obs``'s leaves."""
        rows = self.rows

        def shifted(o: np.ndarray, end: np.ndarray) -> np.ndarray:
            out = np.empty(o.shape, o.dtype)
            if len(o) > 1:
                out[:-1] = o[1:]  # one sequential copy, then the few end rows
            out[rows] = end
            return out

        built = obs_map(shifted, self.obs, self.ends)
        obs_map(_set_writeable, self.obs)
        return built

    def guard(self) -> NextRows:
        """Marks ``obs``' arrays read-only until this column is built; returns ``self``.
        (The arrays must be the batch's own ``obs`` column, not views taken of it.)"""
        obs_map(_set_read_only, self.obs)
        return self

    def slice(self, lo: int, hi: int) -> NextRows:
        """The column's rows ``lo:hi`` (row ``hi - 1`` must be an end row unless empty)."""
        i, j = np.searchsorted(self.rows, (lo, hi))
        return NextRows(
            obs_at(self.obs, slice(lo, hi)), self.rows[i:j] - lo, obs_at(self.ends, slice(i, j))
        )


def _set_read_only(x: np.ndarray) -> None:
    x.flags.writeable = False


def _set_writeable(x: np.ndarray) -> None:
    x.flags.writeable = True  # (the batch's own arrays or views of a writable base)


def obs_at(obs: Any, index: Any) -> Any:
    """``obs[index]`` of an observation column, leaf by leaf for a nested one."""
    if type(obs) is np.ndarray:
        return obs[index]
    return tree_map(lambda x: x[index], obs)


def first_leaf(obs: Any) -> np.ndarray:
    """The first leaf of an observation struct (the array itself for one array)."""
    while isinstance(obs, (dict, tuple)):
        if not obs:
            raise ValueError("an empty Dict / Tuple observation has no leaves to sample")
        obs = next(iter(obs.values())) if isinstance(obs, dict) else obs[0]
    return obs


def _obs_leaf(x: Any, min_ndim: int) -> np.ndarray:
    """A rollout buffer's observation leaf as numpy, with a clear error where the
    observation is a pytree the samplers cannot split (not a dict, tuple or array)."""
    arr = np.asarray(x)
    if arr.ndim < min_ndim:
        raise TypeError(
            f"the rollout's observations hold a {type(x).__name__} leaf of shape {arr.shape}; "
            f"the samplers take observations that are arrays [T + 1, E, A, ...] or dicts / "
            f"tuples of such arrays (Box, Discrete, ..., Dict and Tuple spaces): make the "
            f"env return its observation as an array or a dict / tuple of arrays"
        )
    return arr


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """Skips cyclic-GC passes while thousands of small (acyclic) objects are built."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def empty_infos(n: int) -> list[dict[str, Any]]:
    """``n`` separate empty info dicts: a batch's infos column for an env without infos
    (built on first read, as a :class:`~jaxsampler.episodes.batch.Deferred` column)."""
    return [{} for _ in range(n)]


def info_leaves(infos: Any, prefix: InfoPath = ()) -> list[tuple[InfoPath, Any]]:
    """``(path, leaf)`` pairs of an env info pytree (dicts and dataclasses by field name)."""
    if isinstance(infos, NoInfo):
        return []
    if isinstance(infos, dict):
        items = sorted(infos.items())
    elif dataclasses.is_dataclass(infos):
        items = [(f.name, getattr(infos, f.name)) for f in dataclasses.fields(infos)]
    else:
        return [(prefix or ("info",), infos)]
    out = []
    for k, v in items:
        out += info_leaves(v, prefix + (str(k),))
    return out


def unflatten(flat: dict[InfoPath, Any]) -> dict[str, Any]:
    """The nested info dict of ``{path: leaf}``."""
    tree: dict[str, Any] = {}
    for path, v in flat.items():
        node = tree
        *parents, last = path
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = v
    return tree


def info_tree(value: Any) -> Any:
    """A pytree as nested info dicts: dict keys as they are, dataclass fields by name,
    tuple / list entries by their index (``"0"``, ``"1"``, ...); numpy leaves."""
    if isinstance(value, dict):
        return {str(k): info_tree(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: info_tree(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return {str(i): info_tree(v) for i, v in enumerate(value)}
    return np.asarray(value)


def with_transform_infos(infos: Any, **entries: Any) -> dict[str, Any]:
    """The env's info pytree as nested dicts (the same :func:`info_leaves` paths) with
    ``entries`` added at the top (``None`` values skipped), e.g. ``env_params=...``.

    Raises:
        ValueError: the env's info already has an entry of that name.
    """
    tree = unflatten(dict(info_leaves(infos)))
    for key, value in entries.items():
        if value is None:
            continue
        if key in tree:
            raise ValueError(
                f"the env's info has an entry {key!r}, where the sampler puts the transforms' "
                f"{key}; rename the env's info entry"
            )
        tree[key] = info_tree(value)
    return tree


def info_for_obs(col: np.ndarray, e: Any, j: np.ndarray) -> np.ndarray:
    """Env info of observation slots ``j`` (env-major column): recorded with step ``j - 1``;
    zeros for slot 0, whose info the buffers do not hold."""
    values = col[e, np.maximum(j - 1, 0)]
    first = (j == 0).reshape(j.shape + (1,) * (values.ndim - j.ndim))
    return np.where(first, np.zeros((), values.dtype), values)


def build_columns(
    chunks: Sequence[Trajectory],
    head: Columns | None,
    reset_info: dict[InfoPath, np.ndarray],
    horizon: int,
    multi_agent: bool,
    time_major_obs: bool | None = None,
) -> Columns:
    """Env-major columns ``[E, H + T_total(+1 for obs), ...]`` of the call's chunks.

    Args:
        chunks: the call's host copies of the rollout buffers, in order.
        head: the previous call's :meth:`Columns.tail` (``None`` after a reset: zeros).
        reset_info: info leaves of the reset observations (the head's last info slot
            after a reset).
        horizon: ``H``, lookback steps before the call's first step.
        multi_agent: keep the agent axis (``obs`` time-major, without the head); else
            agent 0's values.
        time_major_obs: ``obs`` as the buffers hold it, ``[T_total + 1, E, ...]`` without
            the head (no transpose: a single-agent batch gathers its rows from it); by
            default as ``multi_agent``.
    """
    check_chunks(chunks)
    H = horizon
    agent: Any = slice(None) if multi_agent else 0
    time_major = multi_agent if time_major_obs is None else time_major_obs
    first = chunks[0]

    def cat(parts: list[np.ndarray], old: np.ndarray | None) -> np.ndarray:
        return _env_major(parts, old, H)

    def col(get: Callable[[Trajectory], np.ndarray], old: np.ndarray | None) -> np.ndarray:
        return cat([get(c) for c in chunks], old)

    def info_head(path: InfoPath) -> np.ndarray | None:
        if head is not None:
            return head.infos[path]
        if not H or path not in reset_info:
            return None
        # The first observations' info (from the reset) sits in the head's last slot.
        start = reset_info[path]
        out = np.zeros((start.shape[0], H) + start.shape[1:], start.dtype)
        out[:, -1] = start
        return out

    # obs: T + 1 slots per call; consecutive calls share one (the next call's first).
    # A nested observation is one such column per leaf.
    def obs_column(old_obs: np.ndarray | None, *leaves: Any) -> np.ndarray:
        parts = [_obs_leaf(x, 3)[:, :, agent] for x in leaves]
        parts = [p[:-1] for p in parts[:-1]] + [parts[-1]]
        if time_major:  # as the buffers hold it: no copy at all for a one-chunk call
            return parts[0] if len(parts) == 1 else np.concatenate(parts)
        return cat(parts, old_obs)

    trees = [c.obs for c in chunks]
    if type(trees[0]) is not np.ndarray and isinstance(trees[0], (dict, tuple)):
        if head is None:
            obs = tree_map(lambda *leaves: obs_column(None, *leaves), *trees)
        else:
            obs = tree_map(obs_column, head.obs, *trees)
    else:
        obs = obs_column(None if head is None else head.obs, *trees)

    def old(name: str) -> np.ndarray | None:
        return None if head is None else getattr(head, name)

    def field(name: str) -> np.ndarray:
        if name in ("is_reset", "acting"):  # no agent axis to select / keep as is
            return col(lambda c: np.asarray(getattr(c, name)), old(name))
        return col(lambda c: np.asarray(getattr(c, name))[:, :, agent], old(name))

    def extra(k: str) -> np.ndarray:
        return col(
            lambda c: np.asarray(c.extras[k])[:, :, agent],
            None if head is None else head.extras[k],
        )

    def info(path: InfoPath) -> np.ndarray:
        return col(lambda c: _info_get(c.infos, path), info_head(path))

    extras = first.extras if isinstance(first.extras, dict) else {}
    return Columns(
        obs=obs,
        actions=field("actions"),
        rewards=field("rewards"),
        terminated=field("terminated"),
        truncated=field("truncated"),
        is_reset=field("is_reset"),
        acting=field("acting") if multi_agent else None,
        extras={k: extra(k) for k in sorted(extras)},
        infos={path: info(path) for path, _ in info_leaves(first.infos)},
        time_major_obs=time_major,
        raw_rewards=None if first.raw_rewards is None else field("raw_rewards"),
    )


def _env_major(parts: Sequence[np.ndarray], head: np.ndarray | None, H: int) -> np.ndarray:
    """``[E, H + sum(T_i), ...]``: the lookback head (zeros if none) then each part,
    transposed; a large column is filled by :func:`~.parallel.current_pool`'s threads,
    each transposing its own range of envs."""
    E = parts[0].shape[1]
    total = sum(p.shape[0] for p in parts)
    result = np.empty((E, H + total) + parts[0].shape[2:], parts[0].dtype)
    # An item of several values (an observation vector) moves as one opaque unit: a
    # transpose of [T, E] units copies whole items instead of one value at a time.
    out, src, old = _units(result), [_units(p) for p in parts], None
    if head is not None:
        old = _units(head)
    inputs = list(parts) + ([] if head is None else [head])
    if any(a.ndim != out.ndim for a in src + ([] if old is None else [old])) or any(
        a.dtype != result.dtype for a in inputs
    ):  # (an input not viewable as units, or of another dtype: cast value by value)
        out, src, old = result, list(parts), head
    pool = current_pool()

    def fill(a: int, b: int) -> None:
        if old is None:
            out[a:b, :H] = np.zeros((), out.dtype)
        else:
            out[a:b, :H] = old[a:b]
        pos = H
        for p in src:
            out[a:b, pos : pos + p.shape[0]] = p[:, a:b].swapaxes(0, 1)
            pos += p.shape[0]

    if pool.threads == 1 or out.nbytes < MIN_SPLIT_BYTES or out.dtype == object:
        fill(0, E)
    else:
        bounds = np.linspace(0, E, min(pool.threads, E) + 1).astype(int).tolist()
        pool.run([functools.partial(fill, a, b) for a, b in zip(bounds[:-1], bounds[1:])])
    return result


def _units(x: np.ndarray) -> np.ndarray:
    """``x`` ``[A, B, ...]`` as ``[A, B]`` opaque items of its trailing values (a view),
    where its trailing axes are C-contiguous and hold several numeric values; else
    ``x`` itself."""
    if x.ndim < 3 or not x.size or x.dtype.hasobject or x.dtype.fields is not None:
        return x
    size = x.itemsize
    for n, stride in zip(x.shape[:1:-1], x.strides[:1:-1]):
        if stride != size:
            return x
        size *= n
    if size <= x.itemsize:
        return x
    # (the trailing axes merge without a copy: they are contiguous)
    flat = x.reshape(x.shape[:2] + (-1,))
    return flat.view(np.dtype((np.void, size)))[:, :, 0]


_STEP_FIELDS = ("actions", "rewards", "terminated", "truncated", "acting", "raw_rewards")


def check_chunks(chunks: Sequence[Trajectory]) -> None:
    """Checks the leading axes of a call's chunks before any column is allocated: every
    step field ``[T, E, A, ...]``, ``is_reset`` ``[T, E]``, extras ``[T, E, ...]``, infos
    ``[T, E, ...]`` and observation leaves ``[T + 1, E, ...]`` of a chunk agree on ``T``
    and ``E``, the agent axis ``A`` agrees between the step fields, and ``E`` is the same
    in every chunk (shapes only: no value is read).

    Raises:
        ValueError: no chunks, or a field whose leading shape disagrees (the message
            names the chunk, the field, its shape and the expected axes).
    """
    if not chunks:
        raise ValueError("a sampler call converts at least one rollout chunk, got none")
    E0: int | None = None
    for k, c in enumerate(chunks):
        rewards = np.shape(c.rewards)
        if len(rewards) < 3:
            raise ValueError(
                f"malformed trajectory: chunk {k}'s rewards have shape {rewards}, "
                "expected [T, E, A]"
            )
        T, E, A = rewards[:3]
        if E0 is None:
            E0 = E
        elif E != E0:
            raise ValueError(f"malformed trajectory: chunk {k} holds {E} envs, chunk 0 holds {E0}")
        want: list[tuple[str, Any, tuple[int, ...]]] = [
            (name, getattr(c, name), (T, E, A)) for name in _STEP_FIELDS
        ]
        want.append(("is_reset", c.is_reset, (T, E)))
        want += [(f"obs{p}", x, (T + 1, E)) for p, x in _leaf_items(c.obs)]
        want += [(f"extras{p}", x, (T, E)) for p, x in _leaf_items(c.extras)]
        want += [(f"infos{p}", x, (T, E)) for p, x in _leaf_items(c.infos)]
        for name, leaf, lead in want:
            if leaf is None:
                continue
            shape = np.shape(leaf)
            if tuple(shape[: len(lead)]) != lead:
                axes = ", ".join(map(str, lead))
                raise ValueError(
                    f"malformed trajectory: chunk {k}'s {name} has shape {tuple(shape)}, "
                    f"expected leading axes [{axes}] (T={T}, E={E}, A={A} from its rewards)"
                )


def _leaf_items(tree: Any) -> list[tuple[str, Any]]:
    """``(path, leaf)`` of a pytree of arrays (``""`` for a bare array; ``NoInfo`` and
    ``None`` have none)."""
    if tree is None or isinstance(tree, NoInfo):
        return []
    if isinstance(tree, dict):
        return [(f"[{k!r}]{p}", x) for k, v in tree.items() for p, x in _leaf_items(v)]
    if isinstance(tree, (tuple, list)):
        return [(f"[{i}]{p}", x) for i, v in enumerate(tree) for p, x in _leaf_items(v)]
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        return [
            (f".{f.name}{p}", x)
            for f in dataclasses.fields(tree)
            for p, x in _leaf_items(getattr(tree, f.name))
        ]
    return [("", tree)]


def _info_get(infos: Any, path: InfoPath) -> np.ndarray:
    for k in path:
        if isinstance(infos, dict):
            infos = infos[k]
        elif dataclasses.is_dataclass(infos):
            infos = getattr(infos, k)
    return np.asarray(infos)


# --------------------------------------------------------------------------- segments


@dataclasses.dataclass(frozen=True)
class Segments:
    """Episode segments of a call (runs of non-reset steps of one env), output order:
    the finished ones first, each group by (env, start). One entry per segment."""

    env: np.ndarray  # int: the env
    start: np.ndarray  # int: first step, counted from the call's first (head excluded)
    len: np.ndarray  # int: steps in the call
    lookback: np.ndarray  # int: lookback steps the chunk gets (continuations only)
    t_started: np.ndarray  # int: the episode's timestep at the segment's first step
    term: np.ndarray  # bool: ended terminated in this call
    trunc: np.ndarray  # bool: ended truncated in this call
    count: np.ndarray  # int: the episode's number within its env (for its id)

    def __len__(self) -> int:
        return len(self.env)

    @property
    def done(self) -> np.ndarray:
        """Whether each segment ended (terminated or truncated)."""
        return self.term | self.trunc


def segment_sums(values: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """``float64`` sums of ``values.reshape(-1)[starts[i] : starts[i] + lens[i]]`` for
    every ``i`` (ascending, non-overlapping runs, each ``lens[i] >= 1``): one reduction
    over the flat values, no masked copy of them."""
    flat = values.reshape(-1)
    if not len(starts):
        return np.zeros(0)
    # reduceat over (start, stop) pairs: the even entries are the runs' sums, the odd
    # ones (the gaps between runs) are dropped; a stop at the very end is left out (the
    # last run then reaches the end by itself).
    bounds = np.empty(2 * len(starts), np.int64)
    bounds[0::2], bounds[1::2] = starts, starts + lens
    if bounds[-1] == len(flat):
        bounds = bounds[:-1]
    return np.add.reduceat(flat, bounds, dtype=np.float64)[0::2]


@dataclasses.dataclass(frozen=True)
class FoundSegments:
    """What :func:`find_segments` finds: the segments, the returns of the finished ones
    (``float64``, the first ``len(returns)`` of ``seg``), the call's live steps and the
    carried partial returns (``float64[E]``)."""

    seg: Segments
    returns: np.ndarray
    n_live: int
    carried: np.ndarray

    def summarized(self) -> tuple[Segments, SamplerMetrics, np.ndarray]:
        """``(segments, metrics, carried returns)``: what a converter keeps of a call."""
        return self.seg, self.metrics(), self.carried

    def metrics(self) -> SamplerMetrics:
        """The call's :class:`SamplerMetrics` (steps and the finished episodes' stats)."""
        n_fin = len(self.returns)
        m = SamplerMetrics(num_env_steps_sampled=self.n_live, num_agent_steps_sampled=self.n_live)
        m.set_episode_stats(self.returns, (self.seg.t_started + self.seg.len)[:n_fin])
        m.num_episodes_ongoing = len(self.seg) - n_fin
        return m

    @staticmethod
    def join(parts: Sequence[FoundSegments], env0: Sequence[int]) -> FoundSegments:
        """The segments of consecutive env ranges (part ``i``'s envs start at ``env0[i]``)
        found one range at a time, as one search over all of them finds them: the
        finished segments of every part, then the ongoing ones (envs in order). Searches
        without a ``num_episodes`` cut only (a cut's step depends on every env)."""
        fin = [len(p.returns) for p in parts]

        def field(name: str) -> np.ndarray:
            cols = [getattr(p.seg, name) for p in parts]
            if name == "env":
                cols = [c + e0 for c, e0 in zip(cols, env0)]
            return np.concatenate(
                [c[:k] for c, k in zip(cols, fin)] + [c[k:] for c, k in zip(cols, fin)]
            )

        seg = Segments(**{f.name: field(f.name) for f in dataclasses.fields(Segments)})
        return FoundSegments(
            seg,
            np.concatenate([p.returns for p in parts]),
            sum(p.n_live for p in parts),
            np.concatenate([p.carried for p in parts]),
        )


def find_segments(
    is_reset: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    rewards: np.ndarray,
    *,
    horizon: int,
    step0: np.ndarray,
    count0: np.ndarray,
    fresh: bool,
    partial_return: np.ndarray,
    num_episodes: int | None,
    cutoff: int | None = None,
) -> FoundSegments:
    """Episode segments of the call, the returns of the finished ones, its live steps and
    the carried partial returns (:meth:`FoundSegments.summarized`: the segments, the
    call's metrics and the carried returns).

    Args:
        is_reset, terminated, truncated, rewards: env-level columns ``[E, H + T]`` (a
            multi-agent episode is done when every agent is).
        horizon: ``H``, head steps before the call's first step.
        step0, count0: ``int[E]``, episode step and episode count at the call's first step.
        fresh: no head from a previous call (after a reset): continuations get no lookback.
        partial_return: ``float64[E]``, returns of the episodes running into the call.
        num_episodes: keep only the episodes finished up to the step at which this many
            had finished (and no ongoing chunks), as ``sample(num_episodes=N)`` returns.
        cutoff: with ``num_episodes``, the step (counted from the call's first, head
            excluded) at which the count was reached, decided by the caller (a sampler
            whose count runs over several processes' envs: these envs may have finished
            fewer than ``num_episodes``); ``None``: found here from these envs.

    Returns:
        :class:`FoundSegments`; its ``carried`` is the returns so far of the episodes
        still running at the call's end (zeros elsewhere).
    """
    H = horizon
    E, width_h = is_reset.shape
    total = width_h - H
    live = ~is_reset[:, H:]
    # Segments are the runs of live steps of each env: with a dead slot padded on both
    # sides of every env's row, the flattened row's changes alternate start, stop.
    width = total + 2
    pad = np.zeros((E, width), bool)
    pad[:, 1:-1] = live
    flat_pad = pad.reshape(-1)
    edges = np.flatnonzero(flat_pad[1:] != flat_pad[:-1])
    seg_env, seg_start = np.divmod(edges[0::2] + 1, width)
    seg_start -= 1
    seg_end = edges[1::2] - seg_env * width - 1  # inclusive
    seg_len = seg_end - seg_start + 1
    # Resets of the env before each segment: its dead (reset) steps before the segment's
    # start, i.e. the start less the steps of the env's earlier segments (segments come
    # by env, then start: no pass over the steps).
    before = np.cumsum(seg_len) - seg_len  # steps of all earlier segments
    new_env = np.ones(len(seg_env), bool)
    new_env[1:] = seg_env[1:] != seg_env[:-1]
    # each segment's env's first segment
    env_first = np.maximum.accumulate(np.where(new_env, np.arange(len(seg_env)), 0))
    count = count0[seg_env] + seg_start - (before - before[env_first])
    continues = (seg_start == 0) & (step0[seg_env] > 0)
    t_started = np.where(continues, step0[seg_env], 0)
    lookback = np.where(continues, np.minimum(0 if fresh else H, step0[seg_env]), 0)
    term_end, trunc_end = terminated[seg_env, H + seg_end], truncated[seg_env, H + seg_end]
    is_done = term_end | trunc_end  # (a segment's last step is live)
    term, trunc = term_end & is_done, trunc_end & is_done
    # Returns: each segment's sum plus what earlier calls accumulated.
    seg_sum = segment_sums(rewards, seg_env * width_h + H + seg_start, seg_len)
    seg_return = seg_sum + np.where(continues, partial_return[seg_env], 0.0)
    if num_episodes is not None:  # stop at the step where the count reached N
        if cutoff is None:
            by_end = np.lexsort((seg_env, seg_end))
            finished = by_end[is_done[by_end]]
            cutoff = int(seg_end[finished[num_episodes - 1]])
        keep = is_done & (seg_end <= cutoff)
    else:
        keep = np.ones(len(seg_env), bool)
    ongoing = ~is_done & (seg_end == total - 1)
    carried = np.zeros_like(partial_return)
    carried[seg_env[ongoing]] = seg_return[ongoing]
    fin = keep & is_done
    order = np.concatenate([np.flatnonzero(fin), np.flatnonzero(keep & ~is_done)])
    seg = Segments(
        env=seg_env[order],
        start=seg_start[order],
        len=seg_len[order],
        lookback=lookback[order],
        t_started=t_started[order],
        term=term[order],
        trunc=trunc[order],
        count=count[order],
    )
    return FoundSegments(seg, seg_return[fin], int(np.count_nonzero(live)), carried)
