"""Floors of :mod:`benchmarks.host_side`'s cells: the least a call could cost on this machine.

Where a target of issue 28 is not met, these say how far the measured call is from what any
design would pay. Each floor is measured in the cell's own process right after its rounds
(the heap, the allocator and the page cache as the sides left them) and is put in the units
of the cell's ratios: ``(bare rollout + floor) / bare rollout``.

* Memory (``sample_batch`` and the bare rollout's host copy): a batch is new memory its
  caller keeps, so a call writes at least the batch's bytes once into freshly allocated
  memory. The floor copies that many bytes, span for span as the batch's arrays hold them
  (views of one buffer counted once, :func:`held_spans`), from a warm source into
  ``np.empty`` arrays allocated anew each repeat ("fresh"), and, for comparison, into
  arrays written before ("reused"); medians of the repeats. On this VM (Firecracker, free
  page reporting) pages a process frees go back to the host after about 2 s, and the host
  backs them anew on the next touch, at a few ms per MB: the batch's fresh copy is also
  timed after ``idle_s`` asleep ("cold"), which is what a call pays when its calls are
  further apart than that (``gap_s``: how long the other sides of a round run between two).
  The bare rollout's floor is its device compute plus its trajectory's bytes copied fresh
  (``jax.device_get`` makes a new host array per leaf on an accelerator; none on CPU).
* Objects (``sample+read``): ``sample()`` returns one episode object per episode (and one
  per agent episode of a multi-agent one), so the floor is creating that many objects
  (counted from one ``sample()`` of the cell), kept alive as the episodes are, with the
  cyclic GC enabled: (i) :class:`Minimal`, an object with ``__slots__`` that points at its
  data, made and then read as the ``sample+read`` side reads episodes (three getters, each
  one slice), the least any design can do; (ii) RLlib's own ``SingleAgentEpisode()`` (and
  ``MultiAgentEpisode()`` for each multi-agent episode), empty constructors, the least
  RLlib's classes cost. The minimal objects are also timed with the GC off (JSON only), to
  show the collector's share.

Batch bytes count only the arrays a batch holds when ``sample_batch()`` returns: a
column still in its lazy form (``jaxsampler.episodes.batch.Deferred``, e.g. ``new_obs``
or ``infos``) is skipped, not built, and is not part of the floor.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

MiB = 1 << 20


# --------------------------------------------------------------------------- batch bytes


def _is_deferred(v: Any) -> bool:
    try:
        from jaxsampler.episodes.batch import Deferred
    except ImportError:  # a checkout without lazy columns
        return False
    return type(v) is Deferred


def _arrays(obj: Any, seen: set[int]) -> Iterator[Any]:
    """Every numpy array in ``obj`` (a batch, mappings, lists), without building a lazy
    column: dicts are walked with ``dict.values`` (not a batch's own ``values``) and
    ``Deferred`` values are skipped."""
    import numpy as np

    if isinstance(obj, np.ndarray):
        yield obj
        return
    if id(obj) in seen or _is_deferred(obj):
        return
    seen.add(id(obj))
    if hasattr(obj, "policy_batches"):
        yield from _arrays(obj.policy_batches, seen)
    elif isinstance(obj, dict):
        for v in dict.values(obj):
            yield from _arrays(v, seen)
    elif isinstance(obj, Mapping):
        for v in obj.values():
            yield from _arrays(v, seen)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _arrays(v, seen)


def held_spans(obj: Any) -> list[int]:
    """The byte lengths of the disjoint memory spans the arrays in ``obj`` cover (views of
    one buffer merge into one span; empty arrays count nothing)."""
    import numpy as np

    bounds = getattr(np.lib, "array_utils", np).byte_bounds
    out: list[int] = []
    lo_run, hi_run = -1, -1
    for lo, hi in sorted(bounds(a) for a in _arrays(obj, set()) if a.size):
        if lo >= hi_run:
            if hi_run > lo_run:
                out.append(hi_run - lo_run)
            lo_run, hi_run = lo, hi
        else:
            hi_run = max(hi_run, hi)
    if hi_run > lo_run:
        out.append(hi_run - lo_run)
    return out


def batch_bytes(batch: Any) -> dict[str, int]:
    """``nbytes``: the sum of ``nbytes`` over every numpy array in ``batch`` (object arrays
    count 8 bytes an entry: their pointers); ``held``: the memory those arrays span, each
    byte once (views of one buffer, e.g. ``new_obs`` into the observation track, count
    once). Lazy (``Deferred``) columns are not built and count nothing."""
    arrays = list(_arrays(batch, set()))
    return {"nbytes": int(sum(a.nbytes for a in arrays)), "held": int(sum(held_spans(batch)))}


# --------------------------------------------------------------------------- memory floor


def copy_seconds(
    spans: Sequence[int], repeats: int, fresh: bool, idle_s: float = 0.0
) -> list[float]:
    """Seconds to copy ``spans`` bytes (one array per span) from a warm source, ``repeats``
    times: into arrays allocated anew each repeat (``fresh``) or into the same arrays,
    written once before; each repeat after ``idle_s`` seconds asleep. The fresh arrays live
    until the timing ends (as a batch does)."""
    import numpy as np

    if not spans:
        return [0.0] * repeats
    src = np.ones(max(spans), np.uint8)
    reused = [np.ones(n, np.uint8) for n in spans]
    out = []
    for _ in range(repeats):
        gc.collect()
        time.sleep(idle_s)
        t0 = time.perf_counter()
        kept = [np.empty(n, np.uint8) for n in spans] if fresh else reused
        for dst in kept:
            np.copyto(dst, src[: dst.size])
        out.append(time.perf_counter() - t0)
        del kept
    return out


def memory_floor(spans: Sequence[int], repeats: int, idle_s: float = 0.0) -> dict[str, Any]:
    """Medians (ms) of :func:`copy_seconds` into fresh memory back to back (``fresh``) and
    into reused memory; with ``idle_s`` > 0, also into fresh memory after that long asleep
    each time (``cold``: pages the process freed, once the VM's host has taken them back)."""
    fresh = copy_seconds(spans, repeats, fresh=True)
    reused = copy_seconds(spans, repeats, fresh=False)
    cold = copy_seconds(spans, repeats, fresh=True, idle_s=idle_s) if idle_s > 0 else []
    return {
        "bytes": int(sum(spans)),
        "spans": len(spans),
        "fresh_ms": statistics.median(fresh) * 1e3,
        "reused_ms": statistics.median(reused) * 1e3,
        "fresh_all_ms": [t * 1e3 for t in fresh],
        "reused_all_ms": [t * 1e3 for t in reused],
        **(
            {"idle_s": idle_s, "cold_ms": statistics.median(cold) * 1e3,
             "cold_all_ms": [t * 1e3 for t in cold]}
            if cold else {}
        ),
    }  # fmt: skip


# --------------------------------------------------------------------------- object floor


class Minimal:
    """The least an episode object can be: a slotted object pointing at its rows of a
    shared buffer (``source[start:stop]``), whose getters are one slice each."""

    __slots__ = ("source", "start", "stop")

    def __init__(self, source: Any, start: int, stop: int):
        self.source, self.start, self.stop = source, start, stop

    def get_observations(self) -> Any:
        """The episode's observations (one more than its steps)."""
        return self.source[self.start : self.stop + 1]

    def get_actions(self) -> Any:
        """The episode's actions."""
        return self.source[self.start : self.stop]

    def get_rewards(self) -> Any:
        """The episode's rewards."""
        return self.source[self.start : self.stop]


class MinimalMulti:
    """The least a multi-agent episode can be: a slotted object holding its agents'
    :class:`Minimal` episodes by agent id."""

    __slots__ = ("agent_episodes",)

    def __init__(self, agent_episodes: dict[Any, Minimal]):
        self.agent_episodes = agent_episodes


def count_episodes(episodes: Sequence[Any]) -> dict[str, int]:
    """``episodes``: how many ``sample()`` returned; ``multi``: how many of them are
    multi-agent; ``agent_episodes``: the agent episodes of the multi-agent ones."""
    multi = [ep for ep in episodes if hasattr(ep, "agent_episodes")]
    return {
        "episodes": len(episodes),
        "multi": len(multi),
        "agent_episodes": sum(len(ep.agent_episodes) for ep in multi),
    }


def creation_seconds(
    make: Callable[[], Any], repeats: int, gc_on: bool = True, steady: bool = False
) -> list[float]:
    """Seconds of ``make()`` (which builds and returns the objects), ``repeats`` times, with
    the cyclic GC on (or off); the result lives until the timing ends.

    ``steady``: as a sampling loop runs (``eps = sampler.sample()``), without a
    ``gc.collect()`` before each timing and with the previous result alive until the new
    one is made, after one untimed warm-up: the GC's full collections, which many new
    long-lived objects trigger and which walk every tracked object, are then paid at
    their steady rate (a fresh ``gc.collect()`` before each timing defers them)."""
    out = []
    was = gc.isenabled()
    try:
        if steady:
            gc.enable() if gc_on else gc.disable()
            prev = make()
            for _ in range(repeats):
                t0 = time.perf_counter()
                made = make()
                out.append(time.perf_counter() - t0)
                prev = made
            del prev, made
            return out
        for _ in range(repeats):
            gc.collect()
            gc.enable() if gc_on else gc.disable()
            t0 = time.perf_counter()
            made = make()
            out.append(time.perf_counter() - t0)
            gc.enable() if was else gc.disable()
            del made
    finally:
        gc.enable() if was else gc.disable()
    return out


def rllib_makers(counts: Mapping[str, int]) -> tuple[Callable[[], Any] | None, str]:
    """A maker of RLlib's empty episodes for ``counts`` (a ``SingleAgentEpisode()`` per
    single-agent episode and per agent episode, a ``MultiAgentEpisode()`` per multi-agent
    one), or None and why when ray is not installed."""
    try:
        from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
        from ray.rllib.env.single_agent_episode import SingleAgentEpisode
    except ImportError as e:
        return None, f"RLlib's episodes not timed: ray is not installed ({e})"
    MultiAgentEpisode(), SingleAgentEpisode()  # first calls (lazy imports) untimed
    n_sa = counts["episodes"] - counts["multi"] + counts["agent_episodes"]
    n_ma = counts["multi"]

    def make() -> tuple[list[Any], list[Any]]:
        return [MultiAgentEpisode() for _ in range(n_ma)], [
            SingleAgentEpisode() for _ in range(n_sa)
        ]

    return make, ""


def minimal_episodes(counts: Mapping[str, int]) -> Callable[[], list[Any]]:
    """A maker of :class:`Minimal` episodes for ``counts``: one per single-agent episode,
    and a :class:`MinimalMulti` over its share of the agent episodes per multi-agent one."""
    source = np.zeros(64, np.float32)
    n_sa = counts["episodes"] - counts["multi"]
    n_ma = counts["multi"]
    per = counts["agent_episodes"] // n_ma if n_ma else 0
    extra = counts["agent_episodes"] - per * n_ma

    def make() -> list[Any]:
        out: list[Any] = [Minimal(source, 0, 8) for _ in range(n_sa)]
        for i in range(n_ma):
            k = per + (i < extra)
            out.append(MinimalMulti({j: Minimal(source, 0, 8) for j in range(k)}))
        return out

    return make


def read_minimal(episodes: Sequence[Any]) -> list[Any]:
    """Reads each episode's (or agent episode's) observations, actions and rewards once,
    as the benchmark's ``sample+read`` side does; returns the episodes (kept alive)."""
    for ep in episodes:
        for sa in ep.agent_episodes.values() if type(ep) is MinimalMulti else (ep,):
            sa.get_observations(), sa.get_actions(), sa.get_rewards()
    return list(episodes)


def object_floor(counts: Mapping[str, int], repeats: int) -> dict[str, Any]:
    """Medians (ms) of creating one :class:`Minimal` per episode and agent episode (GC on
    and off), of creating and reading them as ``sample+read`` reads episodes (three
    getters each, GC on), and of RLlib's empty episodes (GC on; absent with a note
    without ray)."""
    n = counts["episodes"] + counts["agent_episodes"]
    make = minimal_episodes(counts)

    out: dict[str, Any] = {**counts, "objects": n}
    on = creation_seconds(make, repeats)
    off = creation_seconds(make, repeats, gc_on=False)
    read = creation_seconds(lambda: read_minimal(make()), repeats)
    steady = creation_seconds(lambda: read_minimal(make()), repeats, steady=True)
    out |= {
        "minimal_ms": statistics.median(on) * 1e3,
        "minimal_gc_off_ms": statistics.median(off) * 1e3,
        "minimal_read_ms": statistics.median(read) * 1e3,
        "minimal_read_steady_ms": statistics.median(steady) * 1e3,
    }
    rllib, why = rllib_makers(counts)
    if rllib is None:
        out["note"] = why
    else:
        out["rllib_ms"] = statistics.median(creation_seconds(rllib, repeats)) * 1e3
    return out


# --------------------------------------------------------------------------- per cell


def _ratio(rollout_s: float, extra_ms: float) -> float:
    return (rollout_s + extra_ms / 1e3) / rollout_s


def measure(
    sides: Sequence[str],
    summary: Mapping[str, Any],
    rollout: Callable[[], Any],
    sampler: Any,
    params: Any,
    repeats: int,
    idle_s: float = 0.0,
) -> dict[str, Any]:
    """The floors of one cell after its rounds, per side it timed: ``rollout`` (compute +
    the trajectory copied fresh), ``sample_batch`` (rollout + the batch copied fresh) and
    ``sample+read`` (rollout + the episode objects). ``summary`` is the cell's
    ``summarize()`` result (ratios and the median rollout); ``rollout`` returns
    ``(compute_s, copy_s, host trajectory)``. ``idle_s`` > 0 adds the batch's cold copy
    (:func:`memory_floor`); ``gap_s`` of a row is how long the other sides of a round ran
    between two of its calls (the sum of their medians)."""
    import jax

    base = summary["rollout"]
    rollout_s = base["median_s"]
    out: dict[str, Any] = {}
    if "rollout" in sides:
        _, _, host = rollout()
        mem = memory_floor(held_spans(jax.tree.leaves(host)), repeats)
        del host
        floor = (base["compute_s"] + mem["fresh_ms"] / 1e3) / rollout_s
        out["rollout"] = {
            "kind": "memory",
            "measured_ratio": 1.0,
            "floor_ratio": floor,
            "reused_ratio": (base["compute_s"] + mem["reused_ms"] / 1e3) / rollout_s,
            "copy_ms": base["copy_s"] * 1e3,
            **mem,
        }
    if "sample_batch" in sides:
        spans = held_spans(sampler.sample_batch(params))
        mem = memory_floor(spans, repeats, idle_s)
        out["sample_batch"] = {
            "kind": "memory",
            "measured_ratio": summary["sample_batch"]["ratio"],
            "floor_ratio": _ratio(rollout_s, mem["fresh_ms"]),
            "reused_ratio": _ratio(rollout_s, mem["reused_ms"]),
            "gap_s": sum(summary[s]["median_s"] for s in sides if s != "sample_batch"),
            **mem,
        }
        if "cold_ms" in mem:
            out["sample_batch"]["cold_ratio"] = _ratio(rollout_s, mem["cold_ms"])
    if "sample+read" in sides:
        counts = count_episodes(sampler.sample(params))
        obj = object_floor(counts, repeats)
        row = {
            "kind": "objects",
            "measured_ratio": summary["sample+read"]["ratio"],
            "floor_ratio": _ratio(rollout_s, obj["minimal_read_ms"]),
            **obj,
        }
        if "rllib_ms" in obj:
            row["rllib_ratio"] = _ratio(rollout_s, obj["rllib_ms"])
        out["sample+read"] = row
    return out


# --------------------------------------------------------------------------- tables


def what(side: str, f: Mapping[str, Any]) -> str:
    """One cell of the Floors table: what the floor of ``side`` is, with its figures."""
    if f["kind"] == "memory":
        cold = (
            f", after {f['idle_s']:g} s idle {f['cold_ms']:.1f} ms; the other sides of a round "
            f"run {f['gap_s']:.1f} s between two calls"
            if "cold_ms" in f
            else ""
        )
        text = (
            f"{f['bytes'] / MiB:.1f} MiB in {f['spans']} arrays written once into fresh "
            f"memory: {f['fresh_ms']:.1f} ms (reused memory {f['reused_ms']:.1f} ms{cold})"
        )
        if side != "rollout":
            return text
        below = " (below the floor: no copy made)" if f["copy_ms"] < f["fresh_ms"] else ""
        return f"compute + the trajectory's {text}; measured host copy {f['copy_ms']:.1f} ms{below}"
    agents = f" + {f['agent_episodes']} agent episodes" if f["multi"] else ""
    rllib = (
        f"RLlib's empty episodes {f['rllib_ms']:.1f} ms"
        if "rllib_ms" in f
        else f.get("note", "RLlib's episodes not timed")
    )
    read = (
        f", made and read (three getters each) {f['minimal_read_ms']:.1f} ms after a "
        "forced collection"
        if "minimal_read_ms" in f
        else ""
    )
    if "minimal_read_steady_ms" in f:  # (the floor: a sampling loop's steady GC cost)
        read += f", and in a steady loop {f['minimal_read_steady_ms']:.1f} ms"
    return (
        f"{f['episodes']} episodes{agents}: {f['objects']} slotted objects "
        f"{f['minimal_ms']:.1f} ms (GC off {f['minimal_gc_off_ms']:.1f} ms){read}; {rllib}"
    )


def floor_text(f: Mapping[str, Any]) -> str:
    """The floor ratio(s) of a row: memory ``fresh (cold c, reused r)``; objects
    ``minimal / RLlib``."""
    if f["kind"] == "memory":
        cold = f"cold {f['cold_ratio']:.2f}, " if "cold_ratio" in f else ""
        return f"{f['floor_ratio']:.2f} ({cold}reused {f['reused_ratio']:.2f})"
    rllib = f" / {f['rllib_ratio']:.2f}" if "rllib_ratio" in f else ""
    return f"{f['floor_ratio']:.2f}{rllib}"


def markdown_lines(res: Mapping[str, Any]) -> list[str]:
    """The Floors table and a sentence per unmet target that has a floor; nothing for a
    run without floors (an older JSON)."""
    rows = [r for r in res.get("cells", []) if r.get("floors")]
    if not rows:
        return []
    lines = [
        "",
        "## Floors",
        "",
        "The least each call could cost here, measured in the same process after the cell's "
        "rounds, as (bare rollout + floor) / bare rollout. Memory: the bytes the call returns "
        "(arrays held at return; lazy `Deferred` columns not built, not counted) written "
        "once into freshly allocated memory, back to back; in parentheses: the same after "
        "an idle pause (cold: on this VM, pages freed for about 2 s go back to the host, "
        "which backs them anew on the next touch, at a few ms per MB) and into reused memory. "
        "The rollout row is the device compute plus the trajectory's copy (on the CPU "
        "backend `jax.device_get` makes none). Objects: one object per episode and agent "
        "episode, GC on: a minimal slotted object, made and then read by three one-slice "
        "getters after a `gc.collect()`, as every measured side starts / RLlib's empty "
        "`SingleAgentEpisode()` (+ `MultiAgentEpisode()` per multi-agent episode). The "
        "same minimal objects in a steady loop (the previous call's objects alive until the "
        "new ones are made, no collection forced: the GC's full passes, which many new "
        "long-lived objects trigger, paid at their steady rate) are given too: a sampling "
        "loop that never forces a collection pays that rate, for jaxsampler's episodes too.",
        "",
        "| cell | side | measured / rollout | floor / rollout | what the floor is |",
        "|---|---|---:|---:|---|",
    ]
    for row in rows:
        for side, f in row["floors"].items():
            lines.append(
                f"| {row['cell']} | {side} | {f['measured_ratio']:.2f} | "
                f"{floor_text(f)} | {what(side, f)} |"
            )
    sentences = [s for t in res.get("targets", []) if (s := closeness(t, rows))]
    return lines + ["", *sentences] if sentences else lines


def _against(goal: float, floor: float) -> str:
    if floor > goal:
        return f"the target lies {floor - goal:.2f} below it: no design meets it here"
    return f"the target is {goal - floor:.2f} above it"


def closeness(target: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str:
    """For an unmet target with a floor: how close the measured figure is to the floor,
    and whether the target lies below it (and below the cold or RLlib floor); "" otherwise."""
    if target["met"] is not False:
        return ""
    f = next(
        (
            r["floors"][target["figure"]]
            for r in rows
            if r["cell"] == target["cell"] and target["figure"] in r["floors"]
        ),
        None,
    )
    if f is None:
        return ""
    value, goal, floor = target["value"], target["goal"], f["floor_ratio"]
    kind = "the batch written once into fresh memory" if f["kind"] == "memory" else (
        "one minimal object per episode, read by three one-slice getters"
    )  # fmt: skip
    conv = f"{(value - 1) / (floor - 1):.1f}x" if floor > 1 else "—"
    text = (
        f"- {target['label']}: measured {value:.2f}, target {goal:g}, floor {floor:.2f} "
        f"({kind}); {_against(goal, floor)}; the measured is {value - floor:.2f} rollouts "
        f"above the floor (its time beyond the rollout is {conv} the floor's)"
    )
    if "cold_ratio" in f:
        text += (
            f"; with the pages cold (calls over ~2 s apart: here {f['gap_s']:.1f} s) the "
            f"floor is {f['cold_ratio']:.2f} and {_against(goal, f['cold_ratio'])}"
        )
    if "rllib_ratio" in f:
        text += (
            f"; RLlib's own empty episodes alone give {f['rllib_ratio']:.2f}: "
            f"{_against(goal, f['rllib_ratio'])} for RLlib's classes"
        )
    return text + "."
