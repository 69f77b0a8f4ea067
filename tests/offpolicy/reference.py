"""Plain-Python references for the off-policy tests: agent steps, transitions, n-step and
V-trace, written as loops over one (env, agent) timeline at a time."""

from __future__ import annotations

import numpy as np


def agent_steps(rewards, term, trunc, acting, is_reset):
    """{(e, a): [(t0, end, reward, terminated, truncated, continues), ...]} in time order.

    A step starts where the agent acted; it ends at the agent's next acting step, at the
    next reset step, one slot after a done flag, or at T."""
    T, E, A = rewards.shape
    out = {}
    for e in range(E):
        for a in range(A):
            steps = []
            for t0 in range(T):
                if not acting[t0, e, a]:
                    continue
                r, tm, tr, k = 0.0, False, False, t0
                while True:
                    r += float(rewards[k, e, a])
                    tm, tr = tm or bool(term[k, e, a]), tr or bool(trunc[k, e, a])
                    if term[k, e, a] or trunc[k, e, a]:
                        end = k + 1
                        break
                    k += 1
                    if k == T or acting[k, e, a] or is_reset[k, e]:
                        end = k
                        break
                cont = not (tm or tr) and end < T and bool(acting[end, e, a])
                steps.append((t0, end, r, tm, tr, cont))
            out[(e, a)] = steps
    return out


def value_at(values, last_value, slot, e, a):
    return float(last_value[e, a]) if slot == values.shape[0] else float(values[slot, e, a])


def n_step(rewards, values, term, trunc, acting, is_reset, last_value, n, gamma):
    """(reward_sum, discount, bootstrap_index, returns), each [T, E, A], 0 off the acting steps."""
    T, E, A = rewards.shape
    rsum, disc_out = np.zeros((T, E, A)), np.zeros((T, E, A))
    index, ret = np.zeros((T, E, A), int), np.zeros((T, E, A))
    for (e, a), steps in agent_steps(rewards, term, trunc, acting, is_reset).items():
        for i, (t0, *_rest) in enumerate(steps):
            g, disc, j = 0.0, 1.0, i
            for k in range(n):
                _, end, r, tm, _tr, cont = steps[j]
                g += disc * r
                disc *= gamma
                if tm or not cont or k == n - 1:
                    d = 0.0 if tm else disc
                    rsum[t0, e, a], disc_out[t0, e, a], index[t0, e, a] = g, d, end
                    ret[t0, e, a] = g + d * value_at(values, last_value, end, e, a)
                    break
                j += 1
                assert steps[j][0] == end  # the next agent step starts where this one ends
    return rsum, disc_out, index, ret


def vtrace(
    blogp,
    tlogp,
    rewards,
    values,
    term,
    trunc,
    acting,
    is_reset,
    last_value,
    gamma,
    lam,
    clip_rho,
    clip_pg,
):
    """(vs, pg_advantages), [T, E, A]: the IMPALA recursion backwards over each agent's steps."""
    T, E, A = rewards.shape
    vs, pg = np.zeros((T, E, A)), np.zeros((T, E, A))
    for (e, a), steps in agent_steps(rewards, term, trunc, acting, is_reset).items():
        next_vs = None
        for t0, end, r, tm, _tr, cont in reversed(steps):
            rho = float(np.exp(float(tlogp[t0, e, a]) - float(blogp[t0, e, a])))
            d = 0.0 if tm else gamma
            v, v_end = float(values[t0, e, a]), value_at(values, last_value, end, e, a)
            trace = d * lam * min(1.0, rho) * (next_vs - v_end) if cont else 0.0
            vs[t0, e, a] = v + min(clip_rho, rho) * (r + d * v_end - v) + trace
            boot = lam * next_vs + (1 - lam) * v_end if cont else v_end
            pg[t0, e, a] = min(clip_pg, rho) * (r + d * boot - v)
            next_vs = vs[t0, e, a]
    return vs, pg
