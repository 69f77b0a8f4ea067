"""``SampleBatch``, ``MultiAgentBatch`` and ``concat_samples``, RLlib-compatible.

Same constructor arguments, column names, counters, slicing and concatenation rules as
RLlib's classes in ray 2.60 (their documentation and recorded behaviour), written anew.
Where RLlib 2.60 has a bug that these classes do not copy, a note "RLlib deviation" sits
at the method concerned (``rows``, ``timeslices``, ``shuffle``).
"""

from __future__ import annotations

import copy as _copy
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from jaxsampler.constants import DEFAULT_POLICY_ID

__all__ = ["Deferred", "MultiAgentBatch", "SampleBatch", "concat_samples"]


class Deferred:
    """A :class:`SampleBatch` column built on its first read: ``build()`` makes the value.

    Put one as a column's value (``SampleBatch({"infos": Deferred(make_infos)})``) where
    building the column costs more than most readers need (one dict per row of an env
    without infos). Every way a batch hands out values builds it first and stores the
    result (``batch[k]``, ``get``, ``items``, ``values``, ``pop``, ``dict(batch)``,
    ``{**batch}``, copies, slices, concatenation, pickling, equality), so no reader ever
    sees the ``Deferred`` itself. It does not count as a column for the batch's length.
    """

    __slots__ = ("build",)

    def __init__(self, build: Any):
        self.build = build


def _is_state_key(k: str) -> bool:
    return k.startswith("state_in_") or k.startswith("state_out_")


def _first_len(v: Any) -> int | None:
    if isinstance(v, dict):
        for x in v.values():
            n = _first_len(x)
            if n is not None:
                return n
        return None
    if isinstance(v, np.ndarray):
        return v.shape[0] if v.ndim else None
    if isinstance(v, (list, tuple)):
        return len(v)
    return None


def _map_rows(v: Any, fn: Any) -> Any:
    """Applies ``fn`` to every array/list leaf (dicts are columns of sub-columns)."""
    if isinstance(v, dict):
        return {k: _map_rows(x, fn) for k, x in v.items()}
    return fn(v)


class SampleBatch(dict):
    """A dict of columns with equal leading length ``count`` (RLlib's column names)."""

    OBS = CUR_OBS = "obs"
    NEXT_OBS = "new_obs"
    ACTIONS = "actions"
    REWARDS = "rewards"
    TERMINATEDS = "terminateds"
    TRUNCATEDS = "truncateds"
    INFOS = "infos"
    EPS_ID = "eps_id"
    AGENT_INDEX = "agent_index"
    T = "t"
    ENV_ID = "env_id"
    UNROLL_ID = "unroll_id"
    ACTION_LOGP = "action_logp"
    ACTION_PROB = "action_prob"
    ACTION_DIST_INPUTS = "action_dist_inputs"
    VF_PREDS = "vf_preds"
    VALUES_BOOTSTRAPPED = "values_bootstrapped"
    SEQ_LENS = "seq_lens"
    PREV_ACTIONS = "prev_actions"
    PREV_REWARDS = "prev_rewards"
    DONES = "dones"

    def __init__(
        self,
        *args: Any,
        _time_major: bool | None = None,
        _max_seq_len: int | None = None,
        _zero_padded: bool = False,
        _is_training: bool | None = None,
        _num_grad_updates: float | None = None,
        **kwargs: Any,
    ):
        data = dict(*args, **kwargs)
        if self.DONES in data:
            raise KeyError(
                "SampleBatch cannot be constructed anymore with a `DONES` key! Instead, set the "
                "new "
                "TERMINATEDS and TRUNCATEDS keys. The values under DONES will then be "
                "automatically "
                "available as TERMINATEDS | TRUNCATEDS."
            )
        for k, v in data.items():
            if type(v) is Deferred:
                continue
            if k != self.INFOS and isinstance(v, (list, int, float, bool, np.number, np.bool_)):
                data[k] = np.array(v)
        super().__init__(data)
        self.time_major, self.max_seq_len, self.zero_padded = (
            _time_major,
            _max_seq_len,
            _zero_padded,
        )
        self.is_training, self.num_grad_updates = _is_training, _num_grad_updates
        self.count = self._count()

    def _count(self) -> int:
        seq_lens = dict.get(self, self.SEQ_LENS)
        if seq_lens is not None and len(seq_lens) > 0:
            return int(np.sum(seq_lens))
        for k, v in dict.items(self):  # (deferred columns stay unbuilt)
            if k == self.INFOS or k == self.SEQ_LENS or _is_state_key(k) or type(v) is Deferred:
                continue
            n = _first_len(v)
            if n is not None:
                return n
        return 0

    # -- counters --------------------------------------------------------------------

    def __len__(self) -> int:
        return self.count

    def env_steps(self) -> int:
        """Like RLlib's: the number of rows, ``count``."""
        return self.count

    def agent_steps(self) -> int:
        """Like RLlib's: the number of rows, ``count``."""
        return self.count

    def __repr__(self) -> str:
        return f"SampleBatch({self.count}: {list(self.keys())})"

    __str__ = __repr__

    # -- access ----------------------------------------------------------------------

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            return self._slice_rows(key)
        if key == self.DONES:
            # RLlib returns `terminateds` here (its comment claims terminateds | truncateds).
            key = self.TERMINATEDS
        value = dict.__getitem__(self, key)
        if type(value) is Deferred:
            value = value.build()
            dict.__setitem__(self, key, value)
        return value

    # Every dict read path that hands out values builds the deferred columns first
    # (overriding __iter__ also makes dict(batch) / {**batch} read through __getitem__).

    def _build_deferred(self) -> None:
        for k, v in list(dict.items(self)):
            if type(v) is Deferred:
                dict.__setitem__(self, k, v.build())

    def __iter__(self) -> Iterator[Any]:
        return dict.__iter__(self)

    def get(self, key: Any, default: Any = None) -> Any:
        """Like ``dict.get`` (a deferred column is built)."""
        return self[key] if key in self else default  # noqa: SIM401 (this is get)

    def items(self) -> Any:
        """Like ``dict.items`` (deferred columns are built first)."""
        self._build_deferred()
        return dict.items(self)

    def values(self) -> Any:
        """Like ``dict.values`` (deferred columns are built first)."""
        self._build_deferred()
        return dict.values(self)

    def pop(self, key: Any, *default: Any) -> Any:
        """Like ``dict.pop`` (a deferred column is built)."""
        if key in self:
            self[key]
        return dict.pop(self, key, *default)

    def popitem(self) -> tuple[Any, Any]:
        """Like ``dict.popitem`` (deferred columns are built first)."""
        self._build_deferred()
        return dict.popitem(self)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        """Like ``dict.setdefault`` (a deferred column is built)."""
        if key in self:
            return self[key]
        dict.__setitem__(self, key, default)
        return default

    def __eq__(self, other: object) -> bool:
        self._build_deferred()
        if isinstance(other, SampleBatch):
            other._build_deferred()
        return dict.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None

    def __reduce_ex__(self, protocol: Any) -> Any:
        self._build_deferred()
        return super().__reduce_ex__(protocol)

    def _slice_rows(self, s: slice) -> SampleBatch:
        start = s.start or 0
        stop = s.stop or self.count
        stop = min(stop, self.count) if stop >= 0 else stop
        return self._with_rows(lambda v: v[start:stop])

    def _with_rows(self, fn: Any) -> SampleBatch:
        out = SampleBatch({k: _map_rows(v, fn) for k, v in self.items()})
        out.time_major, out.max_seq_len, out.zero_padded = (
            self.time_major,
            self.max_seq_len,
            self.zero_padded,
        )
        out.is_training, out.num_grad_updates = self.is_training, self.num_grad_updates
        return out

    def slice(self, start: int, end: int) -> SampleBatch:
        """Rows ``start:end`` (no ``seq_lens`` support)."""
        return self._with_rows(lambda v: v[start:end])

    def columns(self, keys: Sequence[str]) -> list[Any]:
        """Like RLlib's: the columns ``keys``, in that order."""
        return [self[k] for k in keys]

    def rows(self) -> Iterator[dict[str, Any]]:
        """Like RLlib's: one ``{column: value}`` dict per row (``seq_lens`` left out, where
        RLlib's rows hold it as 1).

        RLlib deviation: ``infos`` holding dicts give each row its info dict (RLlib's
        descends into the dicts and indexes their values)."""
        for i in range(self.count):
            yield {
                k: _map_rows(v, lambda x, i=i: x[i]) for k, v in self.items() if k != self.SEQ_LENS
            }

    def copy(self, shallow: bool = False) -> SampleBatch:
        """Like RLlib's: a copy of the batch (the columns deep-copied unless ``shallow``)."""
        if shallow:
            return self._with_rows(lambda v: v)
        return self._with_rows(lambda v: _copy.deepcopy(v))

    # -- splitting -------------------------------------------------------------------

    def split_by_episode(self, key: str | None = None) -> list[SampleBatch]:
        """Splits where ``eps_id`` changes (or after ``terminateds | truncateds`` when there is
        no ``eps_id`` or ``key="dones"``); the last partial episode is kept."""
        n = self.count
        if n == 0:
            return []
        if key == self.EPS_ID or (key is None and self.EPS_ID in self):
            ids = np.asarray(self[self.EPS_ID])
            cuts = np.nonzero(ids[1:] != ids[:-1])[0] + 1
        else:
            done = np.asarray(self[self.TERMINATEDS], bool)
            if self.TRUNCATEDS in self:
                done = done | np.asarray(self[self.TRUNCATEDS], bool)
            cuts = np.nonzero(done[:-1])[0] + 1
        bounds = [0, *cuts.tolist(), n]
        return [self.slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]

    def timeslices(
        self, size: int | None = None, num_slices: int | None = None, k: int | None = None
    ) -> list[SampleBatch]:
        """Consecutive slices of ``size`` rows (the last may be shorter), or ``num_slices``
        near-equal slices (the remainder goes to the last ones).

        RLlib deviation: a ``count`` that ``size`` does not divide gives a shorter last
        slice (RLlib's loops forever)."""
        size = size if size is not None else k
        if size is not None:
            if size < 1:
                raise ValueError(f"size must be >= 1, got {size}")
            return [self.slice(a, min(a + size, self.count)) for a in range(0, self.count, size)]
        if num_slices is None or num_slices < 1:
            raise ValueError("give size (>= 1) or num_slices (>= 1)")
        base, extra = divmod(self.count, num_slices)
        sizes = [base + (1 if i >= num_slices - extra else 0) for i in range(num_slices)]
        out, a = [], 0
        for s in sizes:
            out.append(self.slice(a, a + s))
            a += s
        return out

    def shuffle(self) -> SampleBatch:
        """Permutes the rows in place (``np.random.permutation``); returns ``self``.

        RLlib deviation: ``infos`` are permuted with the other columns (RLlib leaves them
        in place)."""
        if dict.get(self, self.SEQ_LENS) is not None and not self.zero_padded:
            raise ValueError(
                "SampleBatch.shuffle() needs zero-padded sequences when seq_lens are present"
            )
        perm = np.random.permutation(self.count)
        for key, v in list(self.items()):
            if isinstance(v, list):
                dict.__setitem__(self, key, [v[i] for i in perm])
            else:
                dict.__setitem__(self, key, _map_rows(v, lambda x: x[perm]))
        return self

    # -- combining -------------------------------------------------------------------

    def concat(self, other: SampleBatch) -> SampleBatch:
        """Like RLlib's: a new batch of this one's rows followed by ``other``'s."""
        return _concat_sb([self, other])

    def as_multi_agent(self, module_id: str | None = None) -> MultiAgentBatch:
        """Like RLlib's: this batch as the only policy batch (of ``module_id``, default
        ``"default_policy"``) of a ``MultiAgentBatch``."""
        return MultiAgentBatch({module_id or DEFAULT_POLICY_ID: self}, self.count)


class MultiAgentBatch:
    """``policy id -> SampleBatch`` plus the number of env steps they came from."""

    def __init__(self, policy_batches: dict[Any, SampleBatch], env_steps: int):
        for pid, b in policy_batches.items():
            if not isinstance(b, SampleBatch):
                raise TypeError(f"policy batch {pid!r} is {type(b).__name__}, not a SampleBatch")
        self.policy_batches = policy_batches
        self.count = int(env_steps)

    def env_steps(self) -> int:
        """Like RLlib's: the env steps the batches came from, ``count``."""
        return self.count

    def __len__(self) -> int:
        return self.count

    def agent_steps(self) -> int:
        """Like RLlib's: the rows of all policy batches together."""
        return sum(b.count for b in self.policy_batches.values())

    def __getitem__(self, pid: Any) -> SampleBatch:
        return self.policy_batches[pid]

    def copy(self) -> MultiAgentBatch:
        """Like RLlib's: a copy with every policy batch copied."""
        return MultiAgentBatch({k: v.copy() for k, v in self.policy_batches.items()}, self.count)

    def as_multi_agent(self) -> MultiAgentBatch:
        """Like RLlib's: ``self``."""
        return self

    @staticmethod
    def wrap_as_needed(
        policy_batches: dict[Any, SampleBatch], env_steps: int
    ) -> SampleBatch | MultiAgentBatch:
        """Like RLlib's: the only batch if it is ``"default_policy"``'s, else a
        ``MultiAgentBatch`` of them."""
        if len(policy_batches) == 1 and DEFAULT_POLICY_ID in policy_batches:
            return policy_batches[DEFAULT_POLICY_ID]
        return MultiAgentBatch(policy_batches, env_steps)

    def timeslices(self, k: int) -> list[MultiAgentBatch]:
        """Slices of ``k`` env steps: rows grouped by ``(eps_id, t)`` after sorting every
        policy's rows by ``(eps_id, t, agent_index)``; needs those three columns."""
        rows = []
        for pid, b in self.policy_batches.items():
            for col in (SampleBatch.EPS_ID, SampleBatch.T, SampleBatch.AGENT_INDEX):
                if col not in b:
                    raise KeyError(
                        f"MultiAgentBatch.timeslices needs column {col!r} (missing in {pid!r})"
                    )
            for i in range(b.count):
                rows.append(
                    (
                        b[SampleBatch.EPS_ID][i],
                        b[SampleBatch.T][i],
                        b[SampleBatch.AGENT_INDEX][i],
                        pid,
                        i,
                    )
                )
        rows.sort(key=lambda r: (r[0], r[1], r[2]))
        steps: list[list[tuple]] = []
        for r in rows:
            if not steps or (steps[-1][0][0], steps[-1][0][1]) != (r[0], r[1]):
                steps.append([])
            steps[-1].append(r)
        out = []
        for a in range(0, len(steps), k):
            chunk = [r for step in steps[a : a + k] for r in step]
            batches = {}
            for pid in dict.fromkeys(r[3] for r in chunk):
                idx = np.array([r[4] for r in chunk if r[3] == pid])
                src = self.policy_batches[pid]
                batches[pid] = src._with_rows(
                    lambda v, idx=idx: [v[i] for i in idx] if isinstance(v, list) else v[idx]
                )
            out.append(MultiAgentBatch(batches, len(steps[a : a + k])))
        return out

    def __repr__(self) -> str:
        return f"MultiAgentBatch({self.policy_batches}, env_steps={self.count})"

    __str__ = __repr__


def concat_samples(
    samples: Sequence[SampleBatch | MultiAgentBatch],
) -> SampleBatch | MultiAgentBatch:
    """Concatenates batches; any ``MultiAgentBatch`` input makes the result one (env steps
    add up)."""
    if any(isinstance(s, MultiAgentBatch) for s in samples):
        return _concat_ma([s.as_multi_agent() for s in samples])
    return _concat_sb([s for s in samples if isinstance(s, SampleBatch)])


def _concat_sb(samples: Sequence[SampleBatch]) -> SampleBatch:
    batches = [s for s in samples if s.count > 0]
    if not batches:
        return SampleBatch()
    first = batches[0]
    for attr in ("zero_padded", "time_major", "max_seq_len"):
        if len({getattr(b, attr) for b in batches}) > 1:
            raise ValueError(f"cannot concat SampleBatches with different {attr}")
    out: dict[str, Any] = {}
    for key in first:
        cols = [b[key] for b in batches]  # KeyError if a later batch lacks it
        if isinstance(cols[0], list):
            out[key] = [x for c in cols for x in c]
        else:
            out[key] = _concat_col(cols)
    res = SampleBatch(
        out,
        _time_major=first.time_major,
        _max_seq_len=first.max_seq_len,
        _zero_padded=first.zero_padded,
    )
    ngu = [b.num_grad_updates for b in batches]
    if all(g is not None for g in ngu):
        res.num_grad_updates = float(
            np.average(np.asarray(ngu, np.float64), weights=[b.count for b in batches])
        )
    return res


def _concat_col(cols: list[Any]) -> Any:
    if isinstance(cols[0], dict):
        return {k: _concat_col([c[k] for c in cols]) for k in cols[0]}
    return np.concatenate([np.asarray(c) for c in cols])


def _concat_ma(batches: list[MultiAgentBatch]) -> MultiAgentBatch:
    per_policy: dict[Any, list[SampleBatch]] = {}
    env_steps = 0
    for mb in batches:
        env_steps += mb.env_steps()
        for pid, b in mb.policy_batches.items():
            per_policy.setdefault(pid, []).append(b)
    return MultiAgentBatch({pid: _concat_sb(bs) for pid, bs in per_policy.items()}, env_steps)
