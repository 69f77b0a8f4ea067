"""Agent steps of a call in which the agents move together, built from its segments.

Most multi-agent envs are *simultaneous*: every agent acts at every env step and the
episode ends for all agents at once (MPE's Spread, most JaxMARL envs). Then an agent step
is exactly one env step: it starts at call step ``k`` and completes with the observation
of step ``k + 1``; its reward is the agent's reward at ``k``; its flags are the agent's
flags at ``k``; nothing hangs across calls. :func:`is_simultaneous` recognizes such a
call (a few whole-call boolean passes) and :func:`simultaneous_steps` builds its completed
agent steps straight in output order from the episode segments: one ``np.repeat``
expansion per field, instead of
:func:`~jaxsampler.sampling.device.agent_steps.agent_steps`'s general passes (scans over
the ``[E, S, A]`` slots for next actions, first flags and counts) followed by a counting
sort into output order. The steps, their segments and the carry are the same as the
general path gives (tested against it); rewards are the agent's own rewards in the
env's dtype where the general path takes float64 differences of running sums (cast to
float32 by every output: the same value, or one float32 ulp apart where the general path's
running sums grow large).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jaxsampler.sampling.device.agent_steps import AgentCarry, AgentSteps
from jaxsampler.sampling.device.columns import Columns, Segments
from jaxsampler.sampling.device.single_rows import expand_runs

__all__ = ["LockstepRows", "is_simultaneous", "simultaneous_steps"]


class LockstepRows(NamedTuple):
    """What :func:`simultaneous_steps` builds: the steps in output order, each row's
    segment (``pos``), the first row of each run of rows (one agent in one segment), the
    carry for the next call, and (``with_obs_rows``) each row's observation as a flat
    index into the call's time-major ``[T + 1, E, A, ...]`` observations."""

    steps: AgentSteps
    pos: np.ndarray
    runs: np.ndarray
    carry: AgentCarry
    obs_rows: np.ndarray | None = None


def is_simultaneous(cols: Columns, carry: AgentCarry, next_acting: np.ndarray) -> bool:
    """Whether every agent step of the call is one env step and none hangs.

    That holds when nothing hangs from the previous call, every agent acts at every live
    (non-reset) step, at each live step either every agent or none has a done flag, a
    done step is the call's last or is followed by a reset, no done agent of the previous
    call steps on without a reset, and every agent acts on the call's last observation
    where its episode runs on (it completes the steps of the last call step).

    Args:
        cols: the call's own multi-agent columns (``[E, L, A]``, see
            :func:`~jaxsampler.sampling.device.agent_steps.agent_steps`).
        carry: the previous call's carry.
        next_acting: ``bool[E, A]``, agents acting on the call's last observation.
    """
    assert cols.acting is not None, "multi-agent columns"
    if cols.acting.shape[1] == 0 or carry.pend.any():
        return False
    live = ~cols.is_reset
    live_slots = live[:, :, None]
    # (whole-array passes: reductions over the short agent axis cost several times more)
    if np.any(~cols.acting & live_slots):
        return False
    flags = cols.terminated | cols.truncated
    if np.any((flags != flags[:, :, :1]) & live_slots):
        return False
    done = flags[:, :, 0] & live
    if np.any(done[:, :-1] & live[:, 1:]):  # a live step after a done one
        return False
    if np.any(carry.done.any(axis=1) & live[:, 0]):
        return False
    runs_on = live[:, -1] & ~done[:, -1]
    return not np.any(runs_on[:, None] & ~next_acting)


def simultaneous_steps(
    cols: Columns,
    carry: AgentCarry,
    episode_step0: np.ndarray,
    seg: Segments,
    rank: np.ndarray | None = None,
    with_steps: bool = True,
    with_obs_rows: bool = False,
) -> LockstepRows:
    """The completed agent steps of a simultaneous call (:func:`is_simultaneous`) in
    output order, each row's segment, and the carry for the next call.

    Rows are those of the segments ``seg`` (in its order), sorted by ``(rank[agent],)
    segment, agent, t`` as :func:`~jaxsampler.sampling.device.agent_steps.output_order`
    sorts the general path's rows.

    Args:
        cols: the call's own multi-agent columns.
        carry: the previous call's carry (nothing hanging).
        episode_step0: ``int[E]``, episode env step at the call's first step.
        seg: the call's kept episode segments, in output order.
        rank: ``int[A]``, each agent's policy rank to group rows by first (``None``: no
            grouping).
        with_steps: fill ``start_step`` / ``end_step`` (``False``: zero rows, as a batch
            reads neither).
        with_obs_rows: also give each row's observation index (a batch gathers by it).

    Returns:
        :class:`LockstepRows`; ``steps.reward`` holds the env's rewards in their own dtype.
        A large call's rows are expanded and gathered over the current host pool's
        threads (:func:`~jaxsampler.sampling.device.single_rows.expand_runs`).
    """
    assert cols.acting is not None, "multi-agent columns"
    E, L, A = cols.acting.shape
    G = len(seg)
    # Runs of rows (one agent in one segment), in output order; then each run expanded.
    if rank is None:
        run_g = np.repeat(np.arange(G), A)
        run_a = np.tile(np.arange(A), G)
    else:
        by_rank = [np.flatnonzero(rank == r) for r in np.unique(rank)]
        run_g = np.concatenate([np.repeat(np.arange(G), len(ag)) for ag in by_rank])
        run_a = np.concatenate([np.tile(ag, G) for ag in by_rank])
    run_e = seg.env[run_g].astype(np.int64)
    run_k = seg.start[run_g].astype(np.int64)
    run_len = seg.len[run_g].astype(np.int64)
    continues = run_k == 0  # the call's first step is live: the episode runs on
    # Row p of run r is the agent's step at call step run_k + p (slot run_k + 1 + p: slot
    # 0 is the carry): every field is a per-run value plus p times a step, expanded run
    # by run (split over the host threads where the call is large).
    t0 = np.where(continues, carry.n_act[run_e, run_a], 0)
    fields = [
        (run_e, 0),
        (run_a, 0),
        (run_k + 1, 1),  # slot
        (t0, 1),  # t
        ((run_e * L + run_k) * A + run_a, A),  # the row's [e, k, a] in the step columns
        (run_g, 0),  # pos
    ]
    if with_steps:
        step0 = np.asarray(episode_step0, np.int64)
        fields.append((np.where(continues, step0[run_e], 0), 1))  # start_step
    if with_obs_rows:  # the row's [k, e, a] in the time-major observations
        fields.append(((run_k * E + run_e) * A + run_a, E * A))
    # The rewards and flags (views of the call's part of the columns) made contiguous
    # once, then gathered range by range with the flat index.
    sources = [
        np.ascontiguousarray(c).reshape(-1) for c in (cols.rewards, cols.terminated, cols.truncated)
    ]
    n = int(run_len.sum())
    outs = [np.empty(n, x.dtype) for x in sources]

    def gather(lo: int, hi: int, parts: list[np.ndarray]) -> None:
        for x, out in zip(sources, outs):
            np.take(x, parts[4], out=out[lo:hi], mode="clip")

    expanded = expand_runs(run_len, fields, then=gather)
    e, a, slot, t, flat, pos = expanded[:6]
    if with_steps:
        start_step = expanded[6]
        end_step = start_step + 1
    else:
        start_step = end_step = np.empty(0, np.int64)
    steps = AgentSteps(
        env=e,
        agent=a,
        slot=slot,
        end=slot + 1,
        t=t,
        reward=outs[0],
        terminated=outs[1],
        truncated=outs[2],
        start_step=start_step,
        end_step=end_step,
    )
    obs_rows = expanded[-1] if with_obs_rows else None
    run_start = np.cumsum(run_len) - run_len  # each run's first row
    return LockstepRows(steps, pos, run_start, _next_carry(cols, carry), obs_rows)


def _next_carry(cols: Columns, carry: AgentCarry) -> AgentCarry:
    """The carry after a simultaneous call: nothing hangs; an agent is done where its
    episode ended at the call's last step; its steps in the running episode are the live
    steps since the env's last reset in the call (all of them, plus the carried count,
    where there was none)."""
    assert cols.acting is not None, "multi-agent columns"
    E, L, A = cols.acting.shape
    new = AgentCarry.empty(cols, E, A)
    last_live = ~cols.is_reset[:, -1]
    ended = (cols.terminated[:, -1] | cols.truncated[:, -1]).any(axis=1) & last_live
    new.done = np.repeat(ended[:, None], A, axis=1)
    any_reset = np.asarray(cols.is_reset.any(axis=1))
    last_reset = L - 1 - np.argmax(cols.is_reset[:, ::-1], axis=1)
    since = np.where(any_reset, L - 1 - last_reset, L).astype(np.int64)
    new.n_act = since[:, None] + np.where(any_reset[:, None], 0, carry.n_act)
    return new
