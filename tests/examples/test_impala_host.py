"""examples/impala_host.py: its row-wise V-trace against a plain-Python reference and, on
policy, against GAE; and both training loops (AsyncActor and synchronous) end to end in
quick mode."""

from __future__ import annotations

import numpy as np
import pytest

from examples import impala_host, ppo_host


def rows(seed: int, n: int = 40):
    rng = np.random.default_rng(seed)
    ends = rng.random(n) < 0.15
    ends[-1] = True
    term = ends & (rng.random(n) < 0.5)  # some chunks end terminated, others cut/truncated
    return {
        "rewards": rng.normal(size=n).astype(np.float32),
        "values": rng.normal(size=n).astype(np.float32),
        "next_values": rng.normal(size=n).astype(np.float32),
        "terminateds": term,
        "ends": ends,
        "log_rhos": rng.normal(scale=0.5, size=n).astype(np.float32),
    }


def reference(b, gamma, lam):
    """V-trace by the paper's explicit sum, chunk by chunk, in plain Python (float64):
    ``vs_t = V_t + sum_{s >= t} (prod_{t <= i < s} d_i c_i) delta_s`` over the chunk,
    ``delta_s = min(1, rho_s) (r_s + d_s V'_s - V_s)``, ``c_i = lam min(1, rho_i)``,
    ``d = gamma`` (0 after a termination); the advantage bootstraps from ``vs_{t+1}``
    inside the chunk and from ``V'`` at its end."""
    n = len(b["rewards"])
    vs, pg = np.zeros(n), np.zeros(n)
    rho = np.exp(b["log_rhos"].astype(np.float64))
    d = np.where(b["terminateds"], 0.0, gamma)
    r, v, nv = (b[k].astype(np.float64) for k in ("rewards", "values", "next_values"))
    delta = np.minimum(1.0, rho) * (r + d * nv - v)
    start = 0
    for stop in np.flatnonzero(b["ends"]) + 1:
        for t in range(start, stop):
            total, weight = 0.0, 1.0
            for s_ in range(t, stop):
                total += weight * delta[s_]
                weight *= d[s_] * lam * min(1.0, rho[s_])
            vs[t] = v[t] + total
        for t in range(start, stop):
            boot = nv[t] if t == stop - 1 else lam * vs[t + 1] + (1 - lam) * nv[t]
            pg[t] = min(1.0, rho[t]) * (r[t] + d[t] * boot - v[t])
        start = stop
    return vs, pg


def consistent(b):
    """Inside a chunk, next_values[t] must be values[t + 1] (the same observation)."""
    b = dict(b)
    nv = b["next_values"].copy()
    inner = ~b["ends"][:-1]
    nv[:-1][inner] = b["values"][1:][inner]
    b["next_values"] = nv
    return b


@pytest.mark.parametrize("lam", [1.0, 0.9])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batch_vtrace_matches_the_definition(seed, lam):
    b = consistent(rows(seed))
    vs, pg = impala_host.batch_vtrace(
        b["rewards"],
        b["values"],
        b["next_values"],
        b["terminateds"],
        b["ends"],
        b["log_rhos"],
        0.97,
        lam,
    )
    want_vs, want_pg = reference(b, 0.97, lam)
    np.testing.assert_allclose(np.asarray(vs), want_vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(pg), want_pg, rtol=1e-5, atol=1e-5)


def test_on_policy_vtrace_is_gae():
    """rho = 1 everywhere: vs are GAE(lam)'s value targets and the advantages GAE's."""
    b = consistent(rows(5))
    vs, pg = impala_host.batch_vtrace(
        b["rewards"],
        b["values"],
        b["next_values"],
        b["terminateds"],
        b["ends"],
        np.zeros_like(b["log_rhos"]),
        0.99,
        0.95,
    )
    adv = ppo_host.batch_gae(
        b["rewards"], b["values"], b["next_values"], b["terminateds"], b["ends"], 0.99, 0.95
    )
    np.testing.assert_allclose(np.asarray(pg), np.asarray(adv), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(vs), np.asarray(adv) + b["values"], rtol=1e-5, atol=1e-5)


def test_both_loops_train_end_to_end(capsys):
    assert impala_host.main(["--quick", "--compare", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "async seed 0" in out and "sync seed 0" in out and "mean lag" in out
