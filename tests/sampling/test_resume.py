"""Exact resume in a fresh process: k calls, save, load into a new sampler in another
process (another seed, other params), m calls == the uninterrupted k + m calls, bit for bit.

Fresh worker processes (tests/resume_worker.py) run side by side: a save worker makes
each job's uninterrupted reference run and a saving run; a load worker restores each
job's checkpoint as soon as it is written. They share a persistent XLA compilation
cache in the test's temporary directory, so each program compiles once per test run.
"""

from __future__ import annotations

import math
import os
import pickle
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from tests.processes import ROOT
from tests.resume_worker import JOBS, OTHER_SEED, PURE, SEED

ALL = list(JOBS) + list(PURE)
#: groups of jobs, each run by its own pair of workers (one group: on a 2-core machine
#: shared with other tests, more processes cost more start-up than they save)
GROUPS = [ALL]
assert sorted(sum(GROUPS, [])) == sorted(ALL)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("resume")
    env = dict(
        os.environ,
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
        PYTHONPATH=str(ROOT),
        JAXSAMPLER_TEST_JAX_CACHE=str(root / "xla_cache"),
    )
    procs = {
        f"{mode} {group}": subprocess.Popen(
            [sys.executable, "-m", "tests.resume_worker", mode, str(root), *jobs],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for group, jobs in enumerate(GROUPS)
        for mode in ("save", "load")
    }
    outs = {}
    try:
        for mode, p in procs.items():
            outs[mode] = p.communicate(timeout=600)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.communicate()
    for mode, p in procs.items():
        out, err = outs[mode]
        assert p.returncode == 0 and "WORKER OK" in out, (
            f"{mode} worker exited {p.returncode}:\n{out[-2000:]}\n{err[-4000:]}"
        )
    res = {}
    for name in ALL:
        res[name] = {}
        for mode in ("save", "load"):
            with open(root / name / f"{mode}.pkl", "rb") as f:
                res[name][mode] = pickle.load(f)
    return res


def assert_same(a: Any, b: Any, path: str = "") -> None:
    """Bit-for-bit equality of two plain-data trees (dtypes, shapes, bytes; NaN == NaN)."""
    if isinstance(a, dict):
        assert isinstance(b, dict), f"{path}: dict vs {type(b).__name__}"
        assert sorted(map(str, a)) == sorted(map(str, b)), f"{path}: keys {list(a)} vs {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{path}: {len(a)} items vs {b!r:.200}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), f"{path}: array vs {type(b).__name__}"
        assert (a.dtype, a.shape) == (b.dtype, b.shape), (
            f"{path}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        )
        if a.dtype == object:
            for i, (x, y) in enumerate(zip(a.ravel(), b.ravel(), strict=True)):
                assert_same(x, y, f"{path}[{i}]")
        else:
            assert a.tobytes() == b.tobytes(), f"{path}: {a.ravel()[:8]} vs {b.ravel()[:8]}"
    elif isinstance(a, float):
        assert isinstance(b, float), f"{path}: {a!r} vs {b!r}"
        assert a == b or (math.isnan(a) and math.isnan(b)), f"{path}: {a!r} vs {b!r}"
    else:
        assert type(a) is type(b) and a == b, f"{path}: {a!r} vs {b!r}"


def test_assert_same_sees_one_bit() -> None:
    a = {"x": [np.array([1.0, 2.0], np.float32)], "n": float("nan")}
    assert_same(a, {"x": [np.array([1.0, 2.0], np.float32)], "n": float("nan")})
    b = np.array([1.0, 2.0], np.float32)
    b.view(np.uint32)[1] ^= 1
    with pytest.raises(AssertionError):
        assert_same(a, {"x": [b], "n": float("nan")})
    with pytest.raises(AssertionError):
        assert_same(a, {"x": [np.array([1.0, 2.0], np.float64)], "n": float("nan")})


def _single(episode: dict[str, Any]) -> dict[str, Any]:
    """A (canonical) single-agent episode, or a multi-agent episode's first agent's."""
    if "MultiAgentEpisode" in episode:
        agents = episode["MultiAgentEpisode"]["agent_episodes"]
        return agents[sorted(agents)[0]]["SingleAgentEpisode"]
    return episode["SingleAgentEpisode"]


def _episodes(call: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    result = call["result"]
    assert isinstance(result, list), "not a sample() call"
    return [e[kind] for e in result]


@pytest.mark.parametrize("name", list(JOBS))
def test_resumed_run_equals_uninterrupted_run(results: dict, name: str) -> None:
    save, load = results[name]["save"], results[name]["load"]
    ref = save["reference"]
    assert len(ref) == len(JOBS[name].after)
    # non-vacuous: the calls after the save sampled steps and finished episodes
    assert sum(c["metrics"]["num_env_steps_sampled"] for c in ref) > 0
    assert sum(c["metrics"]["num_episodes_completed"] for c in ref) > 0
    assert_same(ref, load["resumed"], f"{name}: resumed")
    # saving does not disturb the sampler that saved
    assert_same(ref, save["continued"], f"{name}: continued after save")


@pytest.mark.parametrize("name", list(JOBS))
def test_extra_params_come_back(results: dict, name: str) -> None:
    save, load = results[name]["save"], results[name]["load"]
    assert_same(save["params"], load["params"], f"{name}: params")
    assert load["params_sharding_kept"]


@pytest.mark.parametrize("name", list(JOBS))
def test_no_recompilation_after_load(results: dict, name: str) -> None:
    load = results[name]["load"]
    # the first call after a load compiles what any fresh sampler's first call does;
    # after that, the restored state has the avals / shardings of a live one
    assert load["compiles"][1:] == [0] * (len(load["compiles"]) - 1)
    # loading into the warm sampler again and repeating the first call: nothing compiles,
    # and it returns what it returned the first time
    assert load["again_compiles"] == [0]
    assert_same(results[name]["save"]["reference"][:1], load["again"], f"{name}: again")


@pytest.mark.parametrize("name", ["cartpole", "transforms", "sharded", "spread_gru"])
def test_open_episodes_continue_across_the_save(results: dict, name: str) -> None:
    save, load = results[name]["save"], results[name]["load"]
    last = [_single(e) for e in save["before"][-1]["result"]]
    first = {e["id_"]: e for e in map(_single, load["resumed"][0]["result"])}
    open_ = [e for e in last if not (e["is_terminated"] or e["is_truncated"])]
    assert open_, "no episode was open at the save"
    for e in open_:
        cont = first[e["id_"]]  # the same id
        assert cont["t_started"] == e["t"]
        assert cont["observations"]["lookback"] == min(2, e["t"])  # episode_lookback_horizon=2
        # the lookback is the chunk's last steps
        k = cont["actions"]["lookback"]
        assert_same(e["actions"]["data"][-k:], cont["actions"]["data"][:k])


def test_turn_based_episode_continues_across_the_save(results: dict) -> None:
    save, load = results["tictactoe"]["save"], results["tictactoe"]["load"]
    last = _episodes(save["before"][-1], "MultiAgentEpisode")
    first = {e["id_"]: e for e in _episodes(load["resumed"][0], "MultiAgentEpisode")}
    hanging = [e for e in last if not e["is_terminated"] and e["_hanging_actions_end"]]
    assert hanging, "no open episode with a hanging action at the save"
    for e in hanging:
        cont = first[e["id_"]]
        assert cont["env_t_started"] == e["env_t"]
        assert cont["_len_lookback_buffers"] == min(2, e["env_t"])
        for aid in e["_hanging_actions_end"]:
            # the hanging action completes in the continuation: it is the agent's first
            # action after the lookback there
            sa = cont["agent_episodes"][aid]["SingleAgentEpisode"]
            lb = sa["actions"]["lookback"]
            assert_same(
                np.asarray(e["_hanging_actions_end"][aid]), np.asarray(sa["actions"]["data"][lb])
            )


def test_ids_do_not_depend_on_the_restoring_seed(results: dict) -> None:
    from jaxsampler.episodes.ids import EpisodeIds

    # the restoring samplers' own seed would give other ids
    assert EpisodeIds(SEED)(0, 0) != EpisodeIds(OTHER_SEED)(0, 0)
    prefix = EpisodeIds(SEED)(0, 0)[:14]
    ref = results["cartpole"]["load"]["resumed"]
    ids = [
        e["id_"]
        for c in ref
        if isinstance(c["result"], list)
        for e in _episodes(c, "SingleAgentEpisode")
    ]
    assert ids and all(i.startswith(prefix) for i in ids)


@pytest.mark.parametrize("name", list(PURE))
def test_pure_path_resumes_exactly(results: dict, name: str) -> None:
    save, load = results[name]["save"], results[name]["load"]
    assert_same(save["reference"], load["resumed"], f"{name}: resumed rollout")
    assert load["is_rollout_state"]
    assert load["sharding_kept"]
    if PURE[name] is not None:
        assert load["sharded_leaves"] > 0  # the state really was split over the mesh
    assert load["plain_types"] == ["ndarray"]  # like=None: numpy leaves, saved structure
    assert "transform_state" in load["plain_keys"]
