"""``python -m benchmarks.soak --quick`` runs (so CI exercises the script) and its step ledger
catches what it is meant to catch."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import soak as soak_module


@pytest.fixture(scope="module")
def soak():
    return soak_module


def test_ledger_catches_gaps_repeats_and_returning_ids(soak):
    led = soak.Ledger(max_ids=16)
    led.chunk("e1", 0, 5, False)
    led.chunk("e1", 5, 9, True)
    led.rows("e2", np.array([0, 1, 2]), False)
    led.end_call()
    with pytest.raises(soak.AccountingError, match="starts at 4, expected 0"):
        led.chunk("e3", 4, 6, False)  # its first chunk must start at 0
    led = soak.Ledger(max_ids=16)
    led.chunk("e1", 0, 5, False)
    led.end_call()
    with pytest.raises(soak.AccountingError, match="starts at 4, expected 5"):
        led.chunk("e1", 4, 6, False)  # a step returned twice
    led = soak.Ledger(max_ids=16)
    led.rows("e1", np.array([0, 1]), False)
    with pytest.raises(soak.AccountingError, match="expected 2..3"):
        led.rows("e1", np.array([3, 4]), False)  # step 2 lost
    led = soak.Ledger(max_ids=16)
    led.chunk("e1", 0, 3, True)
    led.end_call()
    led.chunk("e1", 0, 1, False)  # looks like a fresh episode, but the id finished before
    with pytest.raises(soak.AccountingError, match="came back"):
        led.end_call()


def test_growth_fits_the_window_after_warm_up(soak):
    xs = list(range(0, 101, 10))
    ys = [1000 * (x >= 10) + 7 * x for x in xs]  # a jump in the warm-up, then 7 per call
    g = soak.growth(xs, ys)
    assert g["slope"] == pytest.approx(7.0)
    assert g["fitted"] == pytest.approx(7.0 * 80)
    assert soak.growth(xs, [None] * len(xs))["slope"] is None


@pytest.mark.slow
def test_quick_run_writes_results_and_finds_nothing_wrong(soak, tmp_path):
    rc = soak.main(["--quick", "--samplers", "device", "host-ma", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "soak.json").read_text())
    assert res["failures"] == [] and rc == 0, res["failures"]
    phases = {(p["sampler"], p["method"]): p for p in res["samplers"]}
    assert set(phases) == {
        (s, m) for s in ("device", "host-ma") for m in ("sample", "sample_batch")
    }
    for p in phases.values():
        assert p["recompiles_after_first_call"] == 0 and not p["accounting_errors"]
        assert p["env_steps_returned"] >= p["calls"] * p["requested_per_call"]
        assert len(p["rss_bytes"]) == len(p["memory_calls"]) >= 3
    host = phases[("host-ma", "sample")]
    assert host["env_steps_returned"] == host["env_steps_reference"]  # the env's own count
    assert host["agent_steps_returned"] > host["env_steps_returned"]  # 3 agents, some waiting
    s = res["serving"]
    assert s["steps_sent"] >= s["steps_target"] and s["steps_sampled"] == s["steps_sent"]
    assert s["lost_steps"] == s["duplicated_steps"] == s["client_error_count"] == 0
    assert s["compiles_during_run"] == 0
    md = (tmp_path / "soak.md").read_text()
    assert "## Sampler soak" in md and "## Serving soak" in md and "benchmarks.soak" in md


def test_served_sampler_bookkeeping_stays_bounded():
    import threading

    import jax

    import jaxsampler as js
    from jaxsampler.spaces import Box, Discrete

    obs_space, act_space = Box(-1.0, 1.0, (2,), np.float32), Discrete(2)
    # At most 2 episodes at once: the sampler's rank table is sized from that (64 at least).
    env = js.host_envs.ExternalEnv(obs_space, act_space, max_wait_s=0.0, max_concurrent_episodes=2)
    policy = js.MLPPolicy(obs_space, act_space, hidden_sizes=(4,))
    params = policy.init(jax.random.PRNGKey(0))
    sampler = js.sampling.HostSampler(env, policy, timeout_s=0.05, batch_sizes=(1,))
    episodes, done = 150, threading.Event()

    def simulator() -> None:
        o = np.zeros(2, np.float32)
        for _ in range(episodes):
            eid = env.start_episode()
            env.get_action(eid, o)
            env.log_returns(eid, 1.0)
            env.end_episode(eid, o)
        done.set()

    th = threading.Thread(target=simulator, daemon=True)
    th.start()
    rows = 0
    while not done.is_set() or rows < episodes:
        rows += sampler.sample_batch(params, num_timesteps=16).agent_steps()
    th.join(10)
    assert rows == episodes  # every step came out once
    # Nothing runs any more: what the sampler keeps per env must not grow with the
    # number of episodes it ever served.
    books = sampler.feed.books
    assert books.rank_capacity < episodes
    assert len(books.env_rank) <= books.rank_capacity, len(books.env_rank)
