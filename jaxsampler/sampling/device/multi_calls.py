"""Whole-call helpers of the multi-agent converter (:mod:`.multi`): the checks on a call's
chunks, the reorder of its agent steps, each run's fields for the view-built chunks, and
the per-policy row slices of a batch."""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

import numpy as np

from jaxsampler.episodes.batch import Deferred, SampleBatch
from jaxsampler.episodes.lookback import tree_map
from jaxsampler.sampling.device.agent_steps import AgentSteps, output_order
from jaxsampler.sampling.device.columns import NextRows, Segments, check_chunks, empty_infos
from jaxsampler.sampling.device.parallel import MIN_SPLIT_BYTES, current_pool
from jaxsampler.sampling.device.single_rows import expand_runs
from jaxsampler.types import Trajectory

__all__ = [
    "BATCH_FIELDS",
    "FIELDS",
    "NO_INFOS",
    "Runs",
    "check_trajectory",
    "in_output_order",
    "reorder_steps",
    "run_table",
    "slice_rows",
]

FIELDS = [f.name for f in dataclasses.fields(AgentSteps)]
#: the fields a batch reads (episodes read all of them)
BATCH_FIELDS = [name for name in FIELDS if name not in ("start_step", "end_step")]


def check_trajectory(chunks: list[Trajectory], num_envs: int, num_agents: int) -> None:
    """Raises ``ValueError`` before any conversion allocates when a chunk's rewards do not
    hold this converter's ``[T, num_envs, num_agents]`` or the chunks' fields disagree on
    their leading axes (:func:`~jaxsampler.sampling.device.columns.check_chunks`)."""
    for k, c in enumerate(chunks):
        shape = tuple(np.shape(c.rewards))
        if shape[1:3] != (num_envs, num_agents):
            raise ValueError(
                f"malformed trajectory: chunk {k}'s rewards have shape {shape}, expected "
                f"[T, {num_envs}, {num_agents}] (this sampler's num_envs, num_agents)"
            )
    check_chunks(chunks)


def reorder_steps(
    steps: AgentSteps, order: np.ndarray, names: list[str] | None = None
) -> AgentSteps:
    """``steps`` with its fields ``names`` (default: all) gathered at ``order`` and the
    others emptied (zero rows: a batch reads no ``start_step`` / ``end_step``); the
    fields split over the current pool's threads where they are large."""
    names = FIELDS if names is None else names
    cols = [getattr(steps, name) for name in names]
    pool = current_pool()

    def gather(part: list[np.ndarray]) -> Any:
        # (indices are row numbers of the steps: a "clip" gather, no bounds pass needed)
        return lambda: [np.take(c, order, mode="clip") for c in part]

    if pool.threads == 1 or len(order) * 8 * len(cols) < MIN_SPLIT_BYTES:
        out = gather(cols)()
    else:
        done = pool.run([gather(cols[i :: pool.threads]) for i in range(pool.threads)])
        out = [np.empty(0)] * len(cols)
        for i, got in enumerate(done):
            out[i :: pool.threads] = got
    empty = {k: getattr(steps, k)[:0] for k in FIELDS if k not in names}
    return dataclasses.replace(steps, **dict(zip(names, out)), **empty)


@dataclasses.dataclass(frozen=True)
class Runs:
    """Per run of rows of a call (one agent's steps in one segment), as Python lists:
    what the call's view-built chunks read (:func:`run_table`)."""

    agent: list[int]
    term: list[bool]  # the run's last step's flags
    trunc: list[bool]
    t0: list[int]  # the agent timestep of its first step, and one past its last
    t1: list[int]


def run_table(ctx: Any) -> Runs:
    """The call's :class:`Runs` (``ctx``: its converter context), made once, on the first
    view-built chunk, for all of them."""
    steps, data = ctx.cs.steps, ctx.data
    r0, r1 = data.run_start, data.run_stop
    t0 = steps.t[r0]
    runs = Runs(
        agent=steps.agent[r0].tolist(),
        term=steps.terminated[r1 - 1].tolist(),
        trunc=steps.truncated[r1 - 1].tolist(),
        t0=t0.tolist(),
        t1=(t0 + (r1 - r0)).tolist(),
    )
    ctx.tables["runs"] = runs
    return runs


NO_INFOS = object()  # the infos column of an env without infos, before the rows are sliced


def slice_rows(data: dict[str, Any], lo: int, hi: int, unpack: Any = None) -> dict[str, Any]:
    """Rows ``lo:hi`` of every column (views); nested columns (infos, dict / tuple
    observations) leaf by leaf; ``new_obs`` (:class:`NextRows`) as a deferred column of
    those rows, over the slice's own ``obs`` views (read-only until it is built).
    ``unpack``: the policy's :data:`~jaxsampler.sampling.device.grouped.Unpack` (an env
    with agent groups), applied to its observations, actions and padded extras."""
    out = {
        k: tree_map(lambda x: x[lo:hi], v)
        for k, v in data.items()
        if k != "_next_infos" and type(v) is not NextRows and v is not NO_INFOS
    }
    obs_fn = None
    if unpack is not None:
        obs_fn, act_fn, extra_fns = unpack
        if obs_fn is not None:
            out[SampleBatch.OBS] = obs_fn(out[SampleBatch.OBS])
        if act_fn is not None:
            out[SampleBatch.ACTIONS] = act_fn(out[SampleBatch.ACTIONS])
        for k, fn in extra_fns.items():
            if k in out:
                out[k] = fn(out[k])
    if data.get(SampleBatch.INFOS) is NO_INFOS:  # an env without infos
        out[SampleBatch.INFOS] = Deferred(partial(empty_infos, hi - lo))
    nxt = data.get(SampleBatch.NEXT_OBS)
    if type(nxt) is NextRows:
        part = nxt.slice(lo, hi)
        ends = part.ends if obs_fn is None else obs_fn(part.ends)
        part = NextRows(out[SampleBatch.OBS], part.rows, ends).guard()
        out[SampleBatch.NEXT_OBS] = Deferred(part)
    return {k: out[k] for k in data if k in out}  # (the columns' order)


def in_output_order(
    steps: AgentSteps, seg: Segments, env_shape: tuple[int, int], A: int, rank: np.ndarray | None
) -> tuple[np.ndarray, AgentSteps]:
    """Each step's segment and the steps, both in output order (see
    :func:`~jaxsampler.sampling.device.agent_steps.output_order`; ``rank`` given: a
    batch's, only :data:`BATCH_FIELDS` kept); rows outside the kept segments dropped.

    Args:
        steps: the call's agent steps in (env, slot, agent) order.
        seg: the call's kept segments, in output order.
        env_shape: ``(E, L)``, envs and call steps.
        A: agents.
        rank: ``int[A]``, each agent's policy rank to group rows by first (``None``: no
            grouping).
    """
    E, L = env_shape
    # Each step belongs to the segment of its first call step (the carried ones: step 0).
    seg_of_step = np.full((E, L), -1, np.int64)
    lens = seg.len
    env, step, of = expand_runs(lens, [(seg.env, 0), (seg.start, 1), (np.arange(len(lens)), 0)])
    seg_of_step[env, step] = of
    pos = np.take(seg_of_step, steps.env * L + np.maximum(steps.slot - 1, 0))
    order = output_order(pos, steps.agent, steps.t, len(seg), A, rank)
    steps = reorder_steps(steps, order, BATCH_FIELDS if rank is not None else None)
    return pos[order], steps
