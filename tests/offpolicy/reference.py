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


def transition_rows(traj):
    """The transitions of a numpy'd Trajectory as [E * A, T] arrays (row e * A + a)."""
    obs, actions = np.asarray(traj.obs), np.asarray(traj.actions)
    rewards, term, trunc = (np.asarray(x) for x in (traj.rewards, traj.terminated, traj.truncated))
    acting, is_reset = np.asarray(traj.acting), np.asarray(traj.is_reset)
    T, E, A = rewards.shape
    out = {
        "obs": np.zeros((E * A, T) + obs.shape[3:], obs.dtype),
        "next_obs": np.zeros((E * A, T) + obs.shape[3:], obs.dtype),
        "action": np.zeros((E * A, T) + actions.shape[3:], actions.dtype),
        "reward": np.zeros((E * A, T), np.float32),
        "terminated": np.zeros((E * A, T), bool),
        "truncated": np.zeros((E * A, T), bool),
        "valid": np.zeros((E * A, T), bool),
    }
    for (e, a), steps in agent_steps(rewards, term, trunc, acting, is_reset).items():
        row = e * A + a
        for t in range(T):
            out["obs"][row, t] = obs[t, e, a]
            out["action"][row, t] = actions[t, e, a]
        for t0, end, r, tm, tr, _ in steps:
            out["next_obs"][row, t0] = obs[end, e, a]
            out["reward"][row, t0] = r
            out["terminated"][row, t0], out["truncated"][row, t0] = tm, tr
            out["valid"][row, t0] = True
    return out


def step_rows(traj):
    """The per-step rows of a numpy'd Trajectory for sequence buffers, [E * A, T] arrays,
    with episode ids and starts counted by walking each env's steps."""
    rewards, is_reset = np.asarray(traj.rewards), np.asarray(traj.is_reset)
    T, E, A = rewards.shape
    ids = np.zeros((E * A, T), np.int32)
    starts = np.zeros((E * A, T), bool)
    for e in range(E):
        count = int(traj.episode_count_0[e])
        start = int(traj.episode_step_0[e]) == 0 and not is_reset[0, e]
        for t in range(T):
            for a in range(A):
                ids[e * A + a, t] = count
                starts[e * A + a, t] = start
            start = bool(is_reset[t, e])
            count += int(is_reset[t, e])
    swap = lambda x: np.swapaxes(np.asarray(x), 0, 1).reshape((E * A, T) + np.shape(x)[3:])
    return {
        "obs": swap(np.asarray(traj.obs)[:T]),
        "reward": swap(rewards),
        "valid": swap(traj.acting),
        "terminated": swap(traj.terminated),
        "episode_id": ids,
        "episode_start": starts,
    }
