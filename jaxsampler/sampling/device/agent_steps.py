"""Agent steps of multi-agent rollout buffers, vectorized (no loop over time or agents).

In the buffers every agent has an observation slot at every env step; ``acting[t, e, a]``
says which agents acted. One *agent step* (RLlib's per-agent transition) of agent ``a``
starts at a step ``s`` where it acted and *completes* at the first of

* its next acting step ``s'`` (``new_obs = obs[s']``), or
* one step after its first done flag ``f >= s`` (``new_obs = obs[f + 1]``, the real final
  observation; ``terminateds`` / ``truncateds`` from step ``f``).

Its reward is the sum of the agent's rewards over ``s .. completion - 1``: rewards that
arrive while the agent waits are credited to its previous action, as RLlib does.
Rewards before an agent's first action and after its done flag belong to no step.

A step that has not completed by the end of a rollout call is *hanging*: its start
observation, action, extras and reward so far are carried (:class:`AgentCarry`) and it
completes in a later call. Flags are sticky (an env keeps reporting a done agent as done
until the episode ends; the episode ends when every agent is done).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxsampler.sampling.device.columns import Columns, InfoPath, obs_map
from jaxsampler.sampling.device.parallel import (
    MIN_SHARD_SLOTS,
    HostPool,
    current_pool,
    parallel_take,
)

__all__ = [
    "AgentCarry",
    "AgentSteps",
    "agent_steps",
    "agent_steps_sharded",
    "output_order",
    "take",
    "take_info",
    "take_obs",
]


@dataclasses.dataclass
class AgentCarry:
    """Per ``(env, agent)`` state of the episodes still running at the end of a call."""

    pend: np.ndarray  # bool[E, A]: a hanging step
    obs: Any  # [E, A, ...]: its start observation (a struct of such for nested spaces)
    action: np.ndarray
    extras: dict[str, np.ndarray]
    info: dict[InfoPath, np.ndarray]  # info leaves of its start observation
    reward: np.ndarray  # float64[E, A]: reward collected so far
    start: np.ndarray  # int64[E, A]: episode env step of its start observation
    done: np.ndarray  # bool[E, A]: the agent is done in the running episode
    n_act: np.ndarray  # int64[E, A]: agent steps started in the running episode (hanging included)

    @staticmethod
    def empty(cols: Columns, E: int, A: int) -> AgentCarry:
        """No hanging steps, no progress: the carry after a reset (shapes from ``cols``)."""

        def zeros(col: np.ndarray) -> np.ndarray:
            return np.zeros((E, A) + col.shape[3:], col.dtype)

        return AgentCarry(
            pend=np.zeros((E, A), bool),
            obs=obs_map(zeros, cols.obs),
            action=zeros(cols.actions),
            extras={k: zeros(c) for k, c in cols.extras.items()},
            info={k: _info_zeros(c, E, A) for k, c in cols.infos.items()},
            reward=np.zeros((E, A)),
            start=np.zeros((E, A), np.int64),
            done=np.zeros((E, A), bool),
            n_act=np.zeros((E, A), np.int64),
        )


def _info_zeros(col: np.ndarray, E: int, A: int) -> np.ndarray:
    per_agent = col.ndim >= 3 and col.shape[2] == A
    return np.zeros((E, A) + (col.shape[3:] if per_agent else col.shape[2:]), col.dtype)


@dataclasses.dataclass
class AgentSteps:
    """Completed agent steps of one call, one entry per step (``n`` of them).

    ``slot`` / ``done_slot`` index the augmented time axis: slot 0 is the carried hanging
    step, slot ``s >= 1`` is step ``s - 1`` of the call; ``end`` is the slot of the new
    observation (``obs`` slot ``end - 1`` of the call).
    """

    env: np.ndarray
    agent: np.ndarray
    slot: np.ndarray
    end: np.ndarray
    t: np.ndarray  # the agent's own timestep of the step within its episode
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    start_step: np.ndarray  # episode env step of the start observation
    end_step: np.ndarray  # episode env step of the new observation


def _index_dtype(largest: int) -> type[np.signedinteger]:
    """The narrowest signed int dtype holding ``0 .. largest`` (slot positions and counts of
    one call: the whole-call ``[E, S, A]`` passes move 2 or 4 bytes per slot, not 8)."""
    for dtype in (np.int16, np.int32):
        if largest <= np.iinfo(dtype).max:
            return dtype
    return np.int64


def _first_at_or_after(mask: np.ndarray, none: int) -> np.ndarray:
    """``[E, S, A]`` -> for each slot, the first slot ``>=`` it where ``mask`` holds (or
    ``none``, which must exceed every slot), in :func:`_index_dtype` of ``none + 1``."""
    dtype = _index_dtype(none + 1)
    idx = np.arange(mask.shape[1], dtype=dtype).reshape(1, -1, 1)
    pos = np.where(mask, idx, dtype(none))
    np.minimum.accumulate(pos[:, ::-1], axis=1, out=pos[:, ::-1])  # (in place: no new array)
    return pos


def agent_steps(
    cols: Columns, carry: AgentCarry, episode_step0: np.ndarray, next_acting: np.ndarray
) -> tuple[AgentSteps, AgentCarry]:
    """All agent steps completed in this call, and the carry for the next call.

    Args:
        cols: multi-agent env-major columns of the call's own steps (``acting``,
            ``is_reset``, per-agent ``rewards`` / ``terminated`` / ``truncated``,
            ``[E, L(, A)]``; ``obs`` time-major ``[L + 1, E, A, ...]``); ``actions``,
            ``extras`` and ``infos`` (these with a one-step head) only feed the new carry.
        carry: the previous call's carry (``AgentCarry.empty`` after a reset).
        episode_step0: ``int[E]``, episode env step at the call's first step.
        next_acting: ``bool[E, A]``, agents that act on the call's last observation (it
            then completes their previous step, as the observation arrived).
    """
    is_reset = cols.is_reset
    assert cols.acting is not None, "multi-agent columns"
    E, L = is_reset.shape
    A = cols.acting.shape[2]
    live = ~is_reset[:, :, None]
    acting = np.concatenate([carry.pend[:, None], cols.acting & live], axis=1)  # [E, L + 1, A]
    flags = np.concatenate([carry.done[:, None], (cols.terminated | cols.truncated) & live], axis=1)
    reset = np.concatenate([np.zeros((E, 1), bool), is_reset], axis=1)
    S = L + 1
    none = S + 1  # "no such slot": past every slot of the call
    count_dtype = _index_dtype(S)
    slots = np.arange(S)
    last_reset = np.maximum.accumulate(np.where(reset, slots, 0), axis=1)  # [E, S]

    reset_slot = reset[:, :, None]

    def since_episode_start(x: np.ndarray) -> np.ndarray:
        """Inclusive counts of ``x`` since the episode's first slot (``x`` is false at
        reset slots)."""
        c = np.cumsum(x, axis=1, dtype=count_dtype)  # counts are at most S
        # The count before the episode is c at its reset slot; c never decreases, so that is
        # the running maximum over reset slots (a scan, cheaper than a take_along_axis).
        before = np.where(reset_slot, c, count_dtype(0))
        c -= np.maximum.accumulate(before, axis=1, out=before)
        return c

    total_flags = since_episode_start(flags)
    valid = acting & (total_flags <= flags)  # no flag before the slot in its episode
    first_flag = _first_at_or_after(flags, none)
    still_in = total_flags[:, -1] == 0
    valid_next = np.concatenate(
        [valid, (next_acting & still_in)[:, None]], axis=1
    )  # + the last obs slot
    next_act = _first_at_or_after(valid_next, none)[:, 1:]
    end = np.minimum(next_act, first_flag + 1)
    complete = valid & (end <= S)
    count_incl = since_episode_start(valid)
    carried = carry.n_act - carry.pend  # [E, A]
    # Episode env step of each slot (slot s >= 1 is call step s - 1). A new observation
    # is one env step after the last step of its transition (same episode).
    step_of_slot = np.where(
        last_reset > 0, slots[None, :] - last_reset - 1, episode_step0[:, None] + slots[None, :] - 1
    )
    # Reward sums: csum[:, k] is the sum over slots before k (float64, summed in slot order).
    csum = np.empty((E, S + 1, A))
    csum[:, 0], csum[:, 1], csum[:, 2:] = 0.0, carry.reward, cols.rewards
    np.add.accumulate(csum[:, 1:], axis=1, out=csum[:, 1:])
    # The completed steps in the order of np.nonzero: (env, slot, agent); each row's env,
    # slot and agent by one masked read of a broadcast index (cheaper than a divmod).
    shape = (E, S, A)
    e = np.broadcast_to(np.arange(E).reshape(-1, 1, 1), shape)[complete]
    s = np.broadcast_to(slots.reshape(1, -1, 1), shape)[complete]
    a = np.broadcast_to(np.arange(A).reshape(1, 1, -1), shape)[complete]
    c = end[complete].astype(np.int64)
    last_flag = first_flag[complete]
    last_flag += 1
    by_flag = c == last_flag
    # Gathers with one flat index each (several times faster than three index arrays), the
    # indices built in place in two scratch rows: a fresh 8-byte-a-row array per operation
    # costs more here (new memory to fault in) than the arithmetic. Indices are in range by
    # construction ("clip" gathers write straight into their output).
    i1, i2 = np.empty(len(c), np.int64), np.empty(len(c), np.int64)
    ea = e * A
    ea += a
    at_s = e * S
    at_s += s
    np.subtract(c, 2, out=i1)  # the row's last call step, where its flags are
    np.minimum(i1, L - 1, out=i1)
    i1 += np.multiply(e, L, out=i2)
    i1 *= A
    i1 += a
    terminated = np.take(cols.terminated, i1, mode="clip")
    terminated &= by_flag
    truncated = np.take(cols.truncated, i1, mode="clip")
    truncated &= by_flag
    np.multiply(e, (S + 1) * A, out=i2)  # slot 0 of the row's (env, agent) in csum
    i2 += a
    np.multiply(c, A, out=i1)
    i1 += i2
    reward = np.take(csum, i1, mode="clip")
    np.multiply(s, A, out=i1)
    i1 += i2
    reward -= np.take(csum, i1, mode="clip")
    t = count_incl[complete].astype(np.int64)
    t -= 1  # steps before it in the episode, plus those of earlier calls if no reset since
    np.take(carried, ea, out=i2, mode="clip")
    i2[np.take(last_reset, at_s, out=i1, mode="clip") > 0] = 0
    t += i2
    start_step = np.take(step_of_slot, at_s, mode="clip")
    np.subtract(c, s, out=i1)
    i1 -= 1
    i1 += at_s
    end_step = np.take(step_of_slot, i1, mode="clip")
    end_step += 1
    carried_rows = np.flatnonzero(s == 0)  # the few rows that start with a carried step
    start_step[carried_rows] = np.take(carry.start, ea[carried_rows])
    steps = AgentSteps(
        env=e,
        agent=a,
        slot=s,
        end=c,
        t=t,
        reward=reward,
        terminated=terminated,
        truncated=truncated,
        start_step=start_step,
        end_step=end_step,
    )
    # The carry: hanging steps and per-agent progress of the episodes still running.
    hanging = valid & ~complete
    pend = hanging.any(axis=1)
    hs = np.argmax(hanging, axis=1)  # [E, A] slot of the hanging step (0 if none)
    ee, aa = np.nonzero(pend)
    sl = hs[ee, aa]
    new = AgentCarry.empty(cols, E, A)
    new.pend = pend

    def put_obs(dst: np.ndarray, col: np.ndarray, old: np.ndarray) -> None:
        dst[ee, aa] = take(col, old, ee, sl, aa, time_major=True)

    obs_map(put_obs, new.obs, cols.obs, carry.obs)  # (each leaf of a nested observation)
    new.action[ee, aa] = take(cols.actions, carry.action, ee, sl, aa)
    for k in new.extras:
        new.extras[k][ee, aa] = take(cols.extras[k], carry.extras[k], ee, sl, aa)
    for p in new.info:
        new.info[p][ee, aa] = take_info(cols.infos[p], carry.info[p], ee, sl, aa, A)
    new.reward[ee, aa] = csum[ee, S, aa] - csum[ee, sl, aa]
    new.start[ee, aa] = np.where(sl == 0, carry.start[ee, aa], step_of_slot[ee, sl])
    last = S - 1
    new.done = total_flags[:, last] > 0
    new.n_act = count_incl[:, last] + np.where(last_reset[:, last, None] > 0, 0, carried)
    return steps, new


def agent_steps_sharded(
    cols: Columns,
    carry: AgentCarry,
    episode_step0: np.ndarray,
    next_acting: np.ndarray,
    pool: HostPool | None = None,
) -> tuple[AgentSteps, AgentCarry]:
    """:func:`agent_steps` over contiguous env shards, one per thread of ``pool``
    (``None``: :func:`~jaxsampler.sampling.device.parallel.current_pool`), joined: the
    same steps in the same (env, slot, agent) order and the same carry. Envs are
    independent, and numpy releases the GIL in the bulk passes."""
    pool = current_pool() if pool is None else pool
    assert cols.acting is not None, "multi-agent columns"
    E, L, A = cols.acting.shape
    parts = min(pool.threads, E)
    if parts <= 1 or E * L * A < MIN_SHARD_SLOTS:
        return agent_steps(cols, carry, episode_step0, next_acting)
    edges = [E * i // parts for i in range(parts + 1)]

    def shard(e0: int, e1: int) -> Any:
        def run() -> tuple[AgentSteps, AgentCarry]:
            sub = cols.map(lambda c: c[e0:e1], lambda o: o[:, e0:e1])
            old = _carry_zip(lambda x: x[e0:e1], carry)
            return agent_steps(sub, old, episode_step0[e0:e1], next_acting[e0:e1])

        return run

    done = pool.run([shard(a, b) for a, b in zip(edges[:-1], edges[1:])])
    parts_steps = [st for st, _ in done]
    for e0, st in zip(edges[:-1], parts_steps):
        st.env += e0
    steps = AgentSteps(
        **{
            f.name: np.concatenate([getattr(st, f.name) for st in parts_steps])
            for f in dataclasses.fields(AgentSteps)
        }
    )
    return steps, _carry_zip(lambda *xs: np.concatenate(xs), *(c for _, c in done))


def _carry_zip(fn: Any, *carries: AgentCarry) -> AgentCarry:
    """The carry whose every array is ``fn`` of the carries' arrays at that place (each
    has the env axis first): one carry's env slice, or several carries joined."""
    first = carries[0]
    return AgentCarry(
        pend=fn(*(c.pend for c in carries)),
        obs=obs_map(fn, *(c.obs for c in carries)),
        action=fn(*(c.action for c in carries)),
        extras={k: fn(*(c.extras[k] for c in carries)) for k in first.extras},
        info={k: fn(*(c.info[k] for c in carries)) for k in first.info},
        reward=fn(*(c.reward for c in carries)),
        start=fn(*(c.start for c in carries)),
        done=fn(*(c.done for c in carries)),
        n_act=fn(*(c.n_act for c in carries)),
    )


def take(
    col: np.ndarray,
    carried: np.ndarray,
    e: np.ndarray,
    slot: np.ndarray,
    a: np.ndarray,
    offset: int = 0,
    time_major: bool = False,
) -> np.ndarray:
    """Values of an ``[E, L(+1), A, ...]`` column (``time_major``: ``[L(+1), E, A, ...]``)
    at augmented ``slot`` (0 = the carry); ``offset`` time slots come before the call's first."""
    j = np.subtract(slot, 1, dtype=np.int64)
    np.maximum(j, 0, out=j)
    if offset:
        j += offset
    # (one flat gather, split over the current pool's threads where it is large; its
    # index built in place in j: a fresh array per operation costs more, new memory to
    # fault in, than the arithmetic)
    if time_major and col.flags.c_contiguous:  # straight from the buffers
        S, E, A = col.shape[:3]
        j *= E
        j += e
        j *= A
        j += a
        out = parallel_take(col.reshape((S * E * A,) + col.shape[3:]), j)
    elif time_major:
        out = col[j, e, a]
    elif col.flags.c_contiguous:  # (much faster than three index arrays)
        E, S, A = col.shape[:3]
        j += np.multiply(e, S)
        j *= A
        j += a
        out = parallel_take(col.reshape((E * S * A,) + col.shape[3:]), j)
    else:
        out = col[e, j, a]
    # then patch the few carried rows
    first = np.flatnonzero(slot == 0)
    if len(first):
        out[first] = carried[e[first], a[first]]
    return out


def take_obs(obs: Any, carried: Any, e: np.ndarray, slot: np.ndarray, a: np.ndarray) -> Any:
    """:func:`take` (``time_major``) over every leaf of an observation column: an array,
    or a dict / tuple struct of arrays (with ``carried`` of the same struct)."""
    return obs_map(lambda col, old: take(col, old, e, slot, a, time_major=True), obs, carried)


def take_info(
    col: np.ndarray, carried: np.ndarray, e: np.ndarray, slot: np.ndarray, a: np.ndarray, A: int
) -> np.ndarray:
    """Info of the observation at augmented ``slot`` (0 = the carry).

    ``col`` has a one-step head: index ``j`` holds the info recorded with the step before
    observation slot ``j``, i.e. the info that came with that observation. Info leaves
    with an agent axis (``[E, T, A, ...]``) are split per agent; the others are given
    whole to every agent.
    """
    per_agent = col.ndim >= 3 and col.shape[2] == A
    j = np.maximum(slot - 1, 0)
    out = col[e, j, a] if per_agent else col[e, j]
    first = np.flatnonzero(slot == 0)
    if len(first):
        out[first] = carried[e[first], a[first]]
    return out


def output_order(
    pos: np.ndarray,
    agent: np.ndarray,
    t: np.ndarray,
    num_segments: int,
    num_agents: int,
    rank: np.ndarray | None = None,
) -> np.ndarray:
    """The rows of the kept segments (``pos >= 0``) sorted by ``(rank[agent],) pos, agent,
    t`` without a sort: one counting pass.

    A ``(segment, agent)`` group's completed steps have consecutive ``t`` (an agent's steps
    are numbered in order, and only its last one in a call can be left hanging), so a
    row's place is its group's start plus ``t`` minus the group's smallest ``t``.

    Args:
        pos: ``int[n]``, each row's segment (output position), ``-1`` for dropped ones.
        agent, t: ``int[n]``, each row's agent index and the agent's timestep.
        num_segments, num_agents: segments (``pos < num_segments``) and ``A``.
        rank: ``int[A]``, each agent's policy rank to group by first (``None``: no grouping).

    Returns:
        ``int64[k]``: row indices in output order (``k`` kept rows).
    """
    keep = np.flatnonzero(pos >= 0)
    group = np.take(pos, keep) * num_agents + np.take(agent, keep)
    n_groups = num_segments * num_agents
    if rank is not None:
        group += np.take(rank, np.take(agent, keep)) * n_groups
        n_groups *= int(rank.max()) + 1 if len(rank) else 1
    tk = np.take(t, keep)
    counts = np.bincount(group, minlength=n_groups)
    first_t = np.full(n_groups, np.iinfo(np.int64).max)
    np.minimum.at(first_t, group, tk)
    place = (np.cumsum(counts) - counts)[group] + (tk - first_t[group])
    order = np.empty(len(keep), np.int64)
    order[place] = keep
    return order
