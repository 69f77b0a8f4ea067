"""Random single-agent call sequences run on two implementations side by side.

Used by ``tests/episodes/test_rllib_differential_sa.py`` (jaxsampler's ``InfiniteLookbackBuffer``
and ``SingleAgentEpisode`` against RLlib 2.60's own) and runnable as a script for a
broader exploratory run that prints the match rate::

    python -m tests.sa_differential 2000

Two kinds of programs, each driven by a ``numpy`` generator:

* **buffer programs**: an ``InfiniteLookbackBuffer`` over random items (no space,
  Discrete, Box or Dict space) with a random lookback, maybe finalized; then random
  ``get`` calls (None/int/list/slice indices incl. negative ones and steps,
  ``neg_index_as_lookback``, ``fill``, ``one_hot_discrete``), ``append`` / ``extend`` /
  ``pop`` / ``set`` / ``+``, ``finalize``, and the whole buffer compared after each.
* **episode programs**: a ``SingleAgentEpisode`` (Discrete/Box/Dict observations,
  Discrete/Box actions, or no spaces), built empty and reset, or from lists with a random
  ``len_lookback_buffer`` and ``t_started``; then ``add_env_step``, ``to_numpy``, getters,
  setters, ``cut``, ``slice`` / ``[a:b]``, ``concat_episode``, ``get_sample_batch`` and
  the counters, in random order.

Results are compared exactly (values, dtypes, container types) and so are errors (both
raise the same exception type, or neither raises). The comparison leaves out only the
RLlib 2.60 bugs noted as "RLlib deviation (Bn)" in ``jaxsampler.episodes.lookback`` (B1-B9,
the buffer's) and "(En)" in ``jaxsampler.episodes.single_agent`` (E1-E5, the episode's);
:func:`excused` names the one a call falls under. After a mutating call that raises on
both sides, or one excused, a program stops (RLlib may have written part of it).
"""

from __future__ import annotations

import copy
import re
import sys
from collections import Counter
from typing import Any

import numpy as np

from tests.ma_differential import loose, normalize

SPACES = ("none", "discrete", "box", "dict")
ACTION_SPACES = ("none", "discrete", "box")


def call(f: Any) -> Any:
    """``("ok", result)`` or ``("raise", exception type name)``."""
    try:
        return ("ok", f())
    except Exception as e:
        return ("raise", type(e).__name__)


def outcome(x: Any) -> Any:
    """What is compared of a ``call``: the normalized result, or that it raised (both
    raising counts as agreement, whatever the exception types)."""
    return ("raise",) if x[0] == "raise" else ("ok", normalize(x[1]))


def make_space(kind: str) -> Any:
    import gymnasium as gym

    if kind == "discrete":
        return gym.spaces.Discrete(5)
    if kind == "box":
        return gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
    if kind == "dict":
        return gym.spaces.Dict(
            {"a": gym.spaces.Discrete(3), "b": gym.spaces.Box(-10.0, 10.0, (2,), np.float32)}
        )
    return None


def make_item(kind: str, k: int) -> Any:
    """Item number ``k`` of a column whose space is ``kind`` (always inside the space)."""
    if kind == "discrete":
        return k % 5
    if kind == "box":
        return np.array([k % 7, -(k % 5)], np.float32)
    if kind == "dict":
        return {"a": k % 3, "b": np.array([k % 4, k % 3], np.float32)}
    return 10 + k


def stack(items: list[Any]) -> Any:
    """A batch of items as a numpy'ized buffer holds them."""
    if items and isinstance(items[0], dict):
        return {k: np.stack([np.asarray(i[k]) for i in items]) for k in items[0]}
    return np.array(items)


class Diverged(Exception):
    """The two sides' states differ: the rest of a program would only repeat it."""


class Program:
    """One random program, applied call by call to both sides (``ref``: RLlib's)."""

    def __init__(self, seed: int, ref: Any, got: Any):
        self.rng = np.random.default_rng(seed)
        self.ref_mod, self.got_mod = ref, got  # objects with the two classes as attributes
        self.mismatches: list[tuple[str, Any, Any]] = []
        self.counts: Counter = Counter()
        self.k = 0  # item counter: every new item differs
        self.last_set_size = -1
        self.last_set_buf: Any = None
        self.slice_out_of_range = False
        self.sliced = False  # the episodes are slice() results

    def next_item(self, kind: str) -> Any:
        self.k += 1
        return make_item(kind, self.k)

    def check(
        self, label: str, f: Any, nial: bool = False, diverges: bool = False
    ) -> tuple[Any, Any]:
        """Compares ``f(side)`` on both sides; returns both results. ``diverges``: a
        difference means the two sides' states differ (the program stops there)."""
        r, g = call(lambda: f(self.ref)), call(lambda: f(self.got))
        if outcome(r) != outcome(g):
            reason = excused(self, label, r, g, nial)
            if reason:
                self.counts[f"excluded: {reason}"] += 1
                if diverges:  # (the states differ from here on)
                    raise Diverged(label)
                return r, g
            self.mismatches.append((label, r, g))
            if diverges:
                raise Diverged(label)
        self.counts["calls"] += 1
        return r, g

    def apply(self, label: str, f: Any) -> bool:
        """Runs a mutating ``f(side)`` on both; compares outcomes; True if both succeeded."""
        r, g = self.check(label, f, diverges=True)
        if r[0] == g[0] == "raise":  # (RLlib may have written part of it: stop here)
            raise Diverged(label)
        return r[0] == "ok" and g[0] == "ok"

    # -- random arguments -----------------------------------------------------------

    def index(self, n: int, allow_none: bool = True) -> Any:
        rng = self.rng
        m = n + 3
        kind = int(rng.integers(0 if allow_none else 1, 4))
        if kind == 0:
            return None
        if kind == 1:
            return int(rng.integers(-m, m))
        if kind == 2:
            return [int(i) for i in rng.integers(-m, m, size=int(rng.integers(0, 4)))]
        lo = None if rng.random() < 0.2 else int(rng.integers(-m, m))
        hi = None if rng.random() < 0.3 else int(rng.integers(-m, m + 1))
        step = 2 if rng.random() < 0.1 else None
        return slice(lo, hi, step)

    def get_kwargs(self, idx: Any, fill: Any, one_hot_ok: bool) -> dict[str, Any]:
        rng = self.rng
        kw: dict[str, Any] = {}
        if rng.random() < 0.4:
            kw["neg_index_as_lookback"] = True
        if idx is not None and rng.random() < 0.4:
            kw["fill"] = fill
        if one_hot_ok and rng.random() < 0.2:
            kw["one_hot_discrete"] = True
        return kw

    # -- buffer programs ------------------------------------------------------------

    def run_buffer(self, n_ops: int = 25) -> Program:
        try:
            self._run_buffer(n_ops)
        except Diverged:
            self.counts["diverged"] += 1
        return self

    def _run_buffer(self, n_ops: int) -> None:
        rng = self.rng
        kind = str(rng.choice(SPACES))
        space_given = kind != "none" and rng.random() < 0.8
        n = int(rng.integers(0, 6))
        items = [self.next_item(kind) for _ in range(n)]
        lb = int(rng.integers(0, n + 2))
        for side, mod in (("ref", self.ref_mod), ("got", self.got_mod)):
            space = make_space(kind) if space_given else None
            setattr(self, side, mod.InfiniteLookbackBuffer(copy.deepcopy(items), lb, space))
        self.kind = kind
        if n and rng.random() < 0.4:
            self.apply("finalize", lambda b: b.finalize())
        self.compare_buffer("init")
        for _ in range(n_ops):
            u = rng.random()
            n_all = self.ref.len_incl_lookback()
            if u < 0.6:
                idx = self.index(n_all)
                kw = self.get_kwargs(idx, -9, True)
                label = f"buf.get({idx}, {kw}) {self.desc()}"
                self.check(
                    label,
                    lambda b, idx=idx, kw=kw: b.get(idx, **kw),
                    kw.get("neg_index_as_lookback", False),
                )
                continue
            if u < 0.7:
                item = self.next_item(kind)
                self.apply("append", lambda b, item=item: b.append(copy.deepcopy(item)))
            elif u < 0.75:
                new = [self.next_item(kind) for _ in range(int(rng.integers(1, 3)))]
                fin = self.ref.finalized
                self.apply(
                    "extend",
                    lambda b, new=new, fin=fin: b.extend(stack(new) if fin else copy.deepcopy(new)),
                )
            elif u < 0.8 and n_all:
                i = int(rng.integers(-n_all, n_all))
                self.apply(f"pop({i})", lambda b, i=i: b.pop(i))
            elif u < 0.9:
                self.buffer_set(kind)
            elif u < 0.95:
                if not self.ref.finalized and n_all:
                    self.apply("finalize", lambda b: b.finalize())
            else:
                extra = [self.next_item(kind)]
                self.check(
                    "buf + list",
                    lambda b, extra=extra: state(b + copy.deepcopy(extra)),
                )
            self.compare_buffer("after mutation")

    def desc(self) -> str:
        space = "space" if self.ref.space is not None else "no space"
        return (
            f"[{self.kind} ({space}), lb={self.ref.lookback}, n={self.ref.len_incl_lookback()}, "
            f"fin={self.ref.finalized}]"
        )

    def new_data(self, kind: str, idx: Any, n_all: int, finalized: bool) -> Any:
        """New data for ``set(at_indices=idx)``: usually of the right size."""
        rng = self.rng
        if isinstance(idx, int):
            item = self.next_item(kind)
            return np.asarray(item) if finalized and not isinstance(item, dict) else item
        if isinstance(idx, list):
            size = len(idx)
        else:
            r = call(lambda: self.ref.get(idx if idx is not None else slice(None)))
            size = _size(r[1]) if r[0] == "ok" else 0
            if rng.random() < 0.15:
                size += 1
        self.last_set_size = size
        items = [self.next_item(kind) for _ in range(size)]
        if finalized:
            return stack(items) if items else empty_batch(self.ref.data)
        return items

    def buffer_set(self, kind: str) -> None:
        n_all = self.ref.len_incl_lookback()
        idx = self.index(n_all)
        nial = bool(self.rng.random() < 0.3)
        fin = self.ref.finalized
        self.last_set_buf = self.ref
        r = call(lambda: self.new_data(kind, idx, n_all, fin))
        if r[0] != "ok":
            return
        data = r[1]
        self.apply(
            f"buf.set(at_indices={idx}, nial={nial}) {self.desc()}",
            lambda b: b.set(copy.deepcopy(data), at_indices=idx, neg_index_as_lookback=nial),
        )

    def compare_buffer(self, label: str) -> None:
        self.check(f"buffer state {label} {self.desc()}", state, diverges=True)

    # -- episode programs -----------------------------------------------------------

    def run_episode(self, n_ops: int = 30) -> Program:
        try:
            self._run_episode(n_ops)
        except Diverged:
            self.counts["diverged"] += 1
        return self

    def _run_episode(self, n_ops: int) -> None:
        rng = self.rng
        self.okind = str(rng.choice(SPACES))
        self.akind = str(rng.choice(ACTION_SPACES))
        self.spaces = rng.random() < 0.8
        self.extras = rng.random() < 0.6
        self.build_episode()
        ops = [
            (0.3, self.ep_step),
            (0.6, self.ep_getter),
            (0.65, self.ep_to_numpy),
            (0.72, self.ep_setter),
            (0.8, self.ep_cut),
            (0.87, self.ep_slice),
            (0.92, self.ep_concat),
            (1.0, self.ep_sample_batch),
        ]
        for _ in range(n_ops):
            u = rng.random()
            op = next(f for p, f in ops if u < p)
            op()
            self.check(f"episode state after {op.__name__}", ep_state, diverges=True)
            self.check("get_return", lambda e: e.get_return())

    def ep_to_numpy(self) -> None:
        self.apply("to_numpy", _to_numpy)

    def ep_sample_batch(self) -> None:
        self.check("get_sample_batch", lambda e: batch_state(e.get_sample_batch()))

    def cls(self, side: str) -> Any:
        return (self.ref_mod if side == "ref" else self.got_mod).SingleAgentEpisode

    def ep_kwargs(self) -> dict[str, Any]:
        if not self.spaces:
            return {}
        return {
            "observation_space": make_space(self.okind),
            "action_space": make_space(self.akind),
        }

    def step_args(self) -> tuple[Any, ...]:
        rng = self.rng
        obs, act = self.next_item(self.okind), self.next_item(self.akind)
        rew = float(rng.integers(-4, 5)) / 4
        infos = {"k": self.k} if rng.random() < 0.5 else None
        extras = {"vf": float(rng.integers(0, 8)) / 8, "n": int(rng.integers(0, 3))}
        return obs, act, rew, infos, (extras if self.extras else None)

    def build_episode(self) -> None:
        rng = self.rng
        if rng.random() < 0.5:
            for side in ("ref", "got"):
                setattr(self, side, self.cls(side)(id_="e", **self.ep_kwargs()))
            obs = self.next_item(self.okind)
            infos = {"r": 1} if rng.random() < 0.5 else None
            self.apply("add_env_reset", lambda e: e.add_env_reset(copy.deepcopy(obs), infos))
            return
        n = int(rng.integers(0, 6))
        obs = [self.next_item(self.okind) for _ in range(n + 1)]
        act = [self.next_item(self.akind) for _ in range(n)]
        rew = [float(rng.integers(-4, 5)) / 4 for _ in range(n)]
        kw: dict[str, Any] = {}
        if rng.random() < 0.4:
            kw["infos"] = [{"i": i} for i in range(n + 1)]
        if self.extras:
            kw["extra_model_outputs"] = {
                "vf": [i / 8 for i in range(n)],
                "n": [i % 3 for i in range(n)],
            }
        lb = "auto" if rng.random() < 0.3 else int(rng.integers(0, n + 2))
        if rng.random() < 0.5:
            kw["t_started"] = int(rng.integers(0, 5))
        if rng.random() < 0.15:
            kw[str(rng.choice(["terminated", "truncated"]))] = True
        for side in ("ref", "got"):
            r = call(
                lambda side=side: self.cls(side)(
                    id_="e",
                    observations=copy.deepcopy(obs),
                    actions=copy.deepcopy(act),
                    rewards=list(rew),
                    len_lookback_buffer=lb,
                    **copy.deepcopy(kw),
                    **self.ep_kwargs(),
                )
            )
            setattr(self, side, r[1] if r[0] == "ok" else None)
        self.check("constructor", lambda e: e is None)
        if self.ref is None or self.got is None:  # (both raised: start over empty)
            for side in ("ref", "got"):
                setattr(self, side, self.cls(side)(id_="e", **self.ep_kwargs()))
            self.apply("add_env_reset", lambda e: e.add_env_reset(make_item(self.okind, 0)))

    def ep_step(self) -> None:
        obs, act, rew, infos, extras = self.step_args()
        u = self.rng.random()
        term, trunc = u < 0.05, 0.05 <= u < 0.1
        self.apply(
            "add_env_step",
            lambda e: e.add_env_step(
                copy.deepcopy(obs),
                copy.deepcopy(act),
                rew,
                copy.deepcopy(infos),
                terminated=term,
                truncated=trunc,
                extra_model_outputs=copy.deepcopy(extras),
            ),
        )

    def ep_getter(self) -> None:
        rng = self.rng
        what = str(
            rng.choice(["observations", "actions", "rewards", "infos", "extra_model_outputs"])
        )
        buf = {
            "observations": self.ref.observations,
            "actions": self.ref.actions,
            "rewards": self.ref.rewards,
            "infos": self.ref.infos,
        }.get(what, self.ref.rewards)
        idx = self.index(buf.len_incl_lookback())
        fill = {"f": 1} if what == "infos" else -9
        kw = self.get_kwargs(idx, fill, what in ("observations", "actions"))
        key = str(rng.choice(["vf", "n", "zz" if rng.random() < 0.1 else "vf"]))
        label = (
            f"get_{what}({idx}, {kw}) [{self.okind}/{self.akind} lb={buf.lookback} "
            f"n={buf.len_incl_lookback()} numpy={self.ref.is_numpy}]"
        )

        def f(e: Any) -> Any:
            if what == "extra_model_outputs":
                return e.get_extra_model_outputs(key, idx, **kw)
            return getattr(e, "get_" + what)(idx, **kw)

        self.check(label, f, kw.get("neg_index_as_lookback", False))

    def ep_setter(self) -> None:
        rng = self.rng
        what = str(rng.choice(["observations", "actions", "rewards", "extra_model_outputs"]))
        kind = {"observations": self.okind, "actions": self.akind}.get(what, "reward")
        buf = getattr(self.ref, what) if what != "extra_model_outputs" else None
        if buf is None:
            if "vf" not in self.ref.extra_model_outputs:
                return
            buf = self.ref.extra_model_outputs["vf"]
        n_all = buf.len_incl_lookback()
        idx = self.index(n_all)
        nial = bool(rng.random() < 0.3)
        fin = buf.finalized
        size: int
        if isinstance(idx, int):
            size = -1
        elif isinstance(idx, list):
            size = len(idx)
        else:
            r = call(lambda: buf.get(idx if idx is not None else slice(None)))
            size = _size(r[1]) if r[0] == "ok" else 0
            if rng.random() < 0.15:
                size += 1
        if kind == "reward":
            vals = [float(rng.integers(-4, 5)) / 4 for _ in range(max(size, 1))]
        else:
            vals = [self.next_item(kind) for _ in range(max(size, 1))]
        if size == -1:
            data: Any = vals[0]
            if fin and not isinstance(data, (dict, float)):
                data = np.asarray(data)
        else:
            vals = vals[:size]
            data = (stack(vals) if vals else empty_batch(buf.data)) if fin else vals
        kw = {"new_data": data, "at_indices": idx, "neg_index_as_lookback": nial}
        self.last_set_buf, self.last_set_size = buf, size
        label = (
            f"set_{what}(at_indices={idx}, nial={nial}) [numpy={fin} n={n_all} lb={buf.lookback}]"
        )

        def f(e: Any) -> None:
            kw2 = copy.deepcopy(kw)
            if what == "extra_model_outputs":
                return e.set_extra_model_outputs(key="vf", **kw2)
            return getattr(e, "set_" + what)(**kw2)

        self.apply(label, f)

    def ep_cut(self) -> None:
        n = int(self.rng.integers(0, 5))
        r, g = self.check(f"cut({n})", lambda e: ep_state(e.cut(n)))
        if r[0] == g[0] == "ok" and outcome(r) == outcome(g):
            self.ref, self.got = self.ref.cut(n), self.got.cut(n)

    def ep_slice(self) -> None:
        rng = self.rng
        n = len(self.ref)
        lo = None if rng.random() < 0.3 else int(rng.integers(-n - 1, n + 2))
        hi = None if rng.random() < 0.3 else int(rng.integers(-n - 1, n + 2))
        s = slice(lo, hi)
        lb = None if rng.random() < 0.5 else int(rng.integers(0, 4))
        sugar = lb is None and rng.random() < 0.5
        label = f"slice({s}, len_lookback_buffer={lb}) [n={n} lb={self.ref.rewards.lookback}]"
        a = 0 if lo is None else (lo + n if lo < 0 else lo)
        b = n if hi is None else (hi + n if hi < 0 else hi)
        self.slice_out_of_range = not 0 <= a <= b <= n

        def f(e: Any) -> Any:
            x = e[lo:hi] if sugar else e.slice(s, len_lookback_buffer=lb)
            return ep_state(x)

        self.check(label, f)
        if rng.random() < 0.3:  # continue with the slice
            r = [
                call(lambda side=side: getattr(self, side).slice(s, len_lookback_buffer=lb))
                for side in ("ref", "got")
            ]
            ok = r[0][0] == r[1][0] == "ok" and not self.slice_out_of_range
            if ok and not r[0][1].is_done:
                self.ref, self.got = r[0][1], r[1][1]
                self.sliced = True

    def ep_concat(self) -> None:
        """Cut, step the successor, concat it back onto the original."""
        rng = self.rng
        if self.ref.is_done or self.got.is_done:
            return
        n = int(rng.integers(0, 3))
        succ = [getattr(self, side).cut(n) for side in ("ref", "got")]
        for _ in range(int(rng.integers(0, 3))):
            obs, act, rew, infos, extras = self.step_args()
            term = rng.random() < 0.1
            for s in succ:
                s.add_env_step(
                    copy.deepcopy(obs),
                    copy.deepcopy(act),
                    rew,
                    copy.deepcopy(infos),
                    terminated=term,
                    extra_model_outputs=copy.deepcopy(extras),
                )
            if term:
                break
        if rng.random() < 0.3:
            for s in succ:
                s.to_numpy()
        pair = {"ref": succ[0], "got": succ[1]}
        label = f"concat_episode [numpy={self.ref.is_numpy}/{succ[0].is_numpy}]"
        self.apply(label, lambda e: e.concat_episode(pair["ref" if e is self.ref else "got"]))


def _to_numpy(e: Any) -> None:
    e.to_numpy()


def empty_batch(data: Any) -> Any:
    """A batch of no items shaped like numpy'ized ``data``."""
    if isinstance(data, dict):
        return {k: v[:0].copy() for k, v in data.items()}
    return data[:0].copy()


def _size(x: Any) -> int:
    if isinstance(x, dict):
        return len(next(iter(x.values()))) if x else 0
    return len(x)


def state(b: Any) -> Any:
    """A buffer's comparable content."""
    return {"data": b.data, "lookback": b.lookback, "finalized": b.finalized, "len": len(b)}


def ep_state(e: Any) -> Any:
    cols = {k: state(getattr(e, k)) for k in ("observations", "infos", "actions", "rewards")}
    cols["extras"] = {k: state(v) for k, v in e.extra_model_outputs.items()}
    return {
        "cols": cols,
        "t": (e.t, e.t_started, len(e), e.env_steps(), e.agent_steps()),
        "flags": (e.is_terminated, e.is_truncated, e.is_done, e.is_numpy, e.is_reset),
    }


def batch_state(b: Any) -> Any:
    return {"cols": dict(b), "count": b.count}


def excused(p: Program, label: str, r: Any, g: Any, nial: bool) -> str | None:
    """The documented RLlib 2.60 bug behind a difference (None: a real mismatch)."""
    if nial and r[0] == "ok" and g == ("raise", "IndexError"):
        return "B1 (numpy'ized neg_index_as_lookback past the lookback wraps around)"
    if r[0] == "raise" and g[0] == "ok" and re.search(r"get\w*\(\[\],", label):
        return "B2 (numpy'ized get([]) raises)"
    if (
        r[0] == "raise"
        and g[0] == "ok"
        and "one_hot_discrete" in label
        and (_empty(g[1]) or (" n=0" in label and "fin=True" in label))
    ):
        return "B3 (one_hot_discrete of an empty numpy'ized selection raises)"
    if r[0] == "raise" and g[0] == "ok" and label.startswith(("buf.set", "set_")):
        buf = p.last_set_buf
        if buf.finalized and type(buf.space).__name__ == "Dict":
            return "B5 (set on a numpy'ized buffer with a Dict space always fails)"
        if buf.finalized and buf.space is not None and p.last_set_size == 0:
            return "B6 (set of an empty range of a numpy'ized buffer with a space raises)"
        if buf.lookback > buf.len_incl_lookback():
            return "B9 (set with a lookback longer than the data, after pop, miscounts)"
        if buf.finalized and isinstance(buf.data, dict) and "at_indices=[" in label:
            return "B8 (list at_indices on a numpy'ized struct buffer index new_data by position)"
    if (
        re.match(r"(buf\.)?get\w*\(\[", label)
        and "'fill'" in label
        and r[0] == g[0] == "ok"
        and loose(r[1]) == loose(g[1])
    ):
        return "B7 (numpy'ized list indices with fill: the dtype is the first item's)"
    sliced_fill = label.startswith("get_rewards(") and "'fill'" in label and p.sliced
    if sliced_fill and r[0] == g[0] == "ok" and loose(r[1]) == loose(g[1]):
        return "E5 (slice() drops the rewards' space: fill items come back raw)"
    if label == "get_sample_batch" and len(p.ref) == 0:
        return "E1 (get_data_dict of a len-0 episode has one terminateds/truncateds row)"
    chunk_fails = label.startswith(("cut(", "slice(")) and r[0] == "raise" and g[0] == "ok"
    if chunk_fails and p.okind == "dict" and p.ref.observations.finalized:
        return "E2 (cut/slice of a numpy'ized episode with Dict observations fail)"
    if label.startswith("cut(") and r[0] == "raise" and g[0] == "ok":
        obs = p.ref.observations
        if obs.finalized and obs.len_incl_lookback() == 0:
            return "E3 (the constructor rejects an empty ndarray of observations)"
    if label.startswith("slice(") and p.slice_out_of_range:
        return (
            "E4 (reversed slices or bounds outside [-len, len] give columns of different lengths)"
        )
    if r == ("raise", "AssertionError") and g[0] == "ok" and " n=0" in label and "slice(" in label:
        return "B4 (a slice ending before an empty buffer trips an internal assertion)"
    return None


def _empty(x: Any) -> bool:
    leaves = list(x.values()) if isinstance(x, dict) else [x]
    return all(isinstance(v, np.ndarray) and v.size == 0 for v in leaves)


def explore(n: int, ref: Any, got: Any, verbose: int = 0) -> tuple[int, int, Counter, Counter]:
    """Runs ``n`` buffer and ``n`` episode programs; returns (calls, mismatching calls,
    mismatches by call, excluded calls by bug)."""
    calls = bad = 0
    kinds: Counter = Counter()
    excl: Counter = Counter()
    shown = 0
    for seed in range(n):
        for run in ("run_buffer", "run_episode"):
            p = getattr(Program(seed, ref, got), run)()
            calls += p.counts["calls"]
            bad += len(p.mismatches)
            for k, v in p.counts.items():
                if k.startswith("excluded"):
                    excl[k] += v
            for label, r, g in p.mismatches:
                kinds[label.split("(")[0].split(" [")[0]] += 1
                if shown < verbose:
                    shown += 1
                    print(f"seed {seed} {run}: {label}\n   rllib: {r}\n   ours:  {g}")
    return calls, bad, kinds, excl


class RLlibClasses:
    """RLlib's two classes as attributes (imported on first use)."""

    def __init__(self) -> None:
        from ray.rllib.env.single_agent_episode import SingleAgentEpisode
        from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer

        self.SingleAgentEpisode = SingleAgentEpisode
        self.InfiniteLookbackBuffer = InfiniteLookbackBuffer


class OurClasses:
    def __init__(self) -> None:
        from jaxsampler.episodes.lookback import InfiniteLookbackBuffer
        from jaxsampler.episodes.single_agent import SingleAgentEpisode

        self.SingleAgentEpisode = SingleAgentEpisode
        self.InfiniteLookbackBuffer = InfiniteLookbackBuffer


if __name__ == "__main__":  # pragma: no cover - the exploratory run
    import warnings

    warnings.filterwarnings("ignore")
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    verbose = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    calls, bad, kinds, excl = explore(n, RLlibClasses(), OurClasses(), verbose)
    print(
        f"{n}+{n} programs, {calls} compared calls, {bad} mismatches: "
        f"match rate {1 - bad / max(calls, 1):.4f}"
    )
    print("mismatches by call:", dict(kinds.most_common()))
    print("excluded:", dict(excl))
