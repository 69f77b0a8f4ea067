"""``python -m benchmarks.suites --quick`` runs one suite tiny and writes the promised JSON and
Markdown; its bookkeeping (agent-steps, the paired ratio) is checked by hand from the raw
figures, and a missing suite is skipped with its reason. No timing assertions."""

from __future__ import annotations

import dataclasses
import json
import statistics

import pytest


@pytest.fixture(scope="module")
def suites():
    pytest.importorskip("gymnax", reason="the gymnax suite is the one the smoke run uses")
    from benchmarks import suites

    return suites


def test_quick_gymnax_writes_the_schema(suites, tmp_path):
    suites.main(["--quick", "--suites", "gymnax", "--output-dir", str(tmp_path)])
    res = json.loads((tmp_path / "suites.json").read_text())
    assert res["config"]["widths"] == [8] and res["config"]["rollout_length"] == 8
    rec = res["suites"]["gymnax"]
    assert rec["status"] == "ok" and rec["env"] == "gymnax:Breakout-MinAtar"
    row = rec["by_width"]["8"]
    E, T = 8, 8
    # The hand-written loop acts in every env step; jaxsampler skips its reset steps.
    assert row["handwritten"]["agent_steps_per_call"] == E * T
    assert 0.5 * E * T < row["jaxsampler"]["agent_steps_per_call"] <= E * T
    assert row["acting_fraction"] == row["jaxsampler"]["agent_steps_per_call"] / (E * T)
    for side in ("jaxsampler", "handwritten"):
        s = row[side]
        assert len(s["times_s"]) == row["calls_per_round"] * res["config"]["repeats"]
        assert s["median_s"] == statistics.median(s["times_s"])
        assert s["agent_steps_per_s"] == pytest.approx(s["agent_steps_per_call"] / s["median_s"])
    ratios = [
        a / b
        for a, b in zip(
            row["jaxsampler"]["round_agent_steps_per_s"],
            row["handwritten"]["round_agent_steps_per_s"],
            strict=True,
        )
    ]
    assert row["ratio"] == pytest.approx(statistics.median(ratios))
    # the ratio's two factors: time per env step (both run E x T) and agent-steps per call
    per_step = [
        h / j
        for h, j in zip(
            row["handwritten"]["round_median_s"], row["jaxsampler"]["round_median_s"], strict=True
        )
    ]
    assert row["env_step_ratio"] == pytest.approx(statistics.median(per_step))
    assert row["floor"] == row["jaxsampler"]["agent_steps_per_call"] / (E * T)
    # one round of one call here, so no medians come between: ratio = per step x floor
    assert row["ratio"] == pytest.approx(row["env_step_ratio"] * row["floor"])
    md = (tmp_path / "suites.md").read_text()
    assert "| gymnax | `gymnax:Breakout-MinAtar` | 1 | 8 |" in md


def test_handwritten_gymnax_matches_gymnax_driven_by_hand(suites):
    """The baseline's first transition equals gymnax's own reset + step with the same keys."""
    import gymnax
    import jax
    import numpy as np

    import jaxsampler as js

    env = js.make("gymnax:Breakout-MinAtar")
    policy = js.MLPPolicy(env.observation_space, env.action_space, (8,))
    params = policy.init(jax.random.PRNGKey(1))
    run, carry, per_call = suites.gymnax_baseline(env, policy, 2, 1, seed=3)
    assert per_call == 2
    _, tr = run(params, carry)
    genv, gparams = gymnax.make("Breakout-MinAtar")
    key, k = jax.random.split(jax.random.PRNGKey(3))
    obs0, state0 = jax.vmap(genv.reset, in_axes=(0, None))(jax.random.split(k, 2), gparams)
    key, k_act, k_step = jax.random.split(key, 3)
    action, _, _ = policy(params, obs0[:, None], k_act, policy.initial_state(()))
    step = jax.vmap(genv.step, in_axes=(0, 0, 0, None))
    _, _, reward, term, trunc, _ = step(jax.random.split(k_step, 2), state0, action[:, 0], gparams)
    np.testing.assert_array_equal(tr.obs[0], np.asarray(obs0)[:, None])
    np.testing.assert_array_equal(tr.action[0], action)
    np.testing.assert_array_equal(tr.reward[0], reward)
    np.testing.assert_array_equal(tr.terminated[0], term)
    np.testing.assert_array_equal(tr.truncated[0], trunc)


def test_a_missing_suite_is_skipped_with_its_reason(suites, monkeypatch, capsys):
    fake = dataclasses.replace(suites.SUITES["gymnax"], name="nope", module="no_such_pkg")
    monkeypatch.setitem(suites.SUITES, "nope", fake)
    res = suites.run_benchmark(["nope"], widths=[8], rollout_length=8, repeats=1, target_s=0.0)
    assert res["suites"]["nope"]["status"].startswith("skipped: package 'no_such_pkg'")
    assert "skipping nope" in capsys.readouterr().err
    assert "skipped: package 'no_such_pkg'" in suites.markdown_table(res)
