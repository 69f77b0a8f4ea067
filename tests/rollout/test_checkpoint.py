"""jaxsampler.rollout.checkpoint: bad input, mismatches, the restricted loader, atomic saves,
extras, and what cannot be checkpointed."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.rollout import checkpoint
from jaxsampler.rollout.checkpoint import CheckpointError
from jaxsampler.transforms import NormalizeObservation
from tests.processes import ROOT

E, T = 4, 8


def _build(
    env: Any = "CartPole-v1",
    num_envs: int = E,
    seed: int = 0,
    transforms: Any = None,
    recurrent: bool = False,
    horizon: int = 1,
) -> tuple[js.Sampler, Any]:
    env = js.make(env) if isinstance(env, str) else env
    pipe = js.rollout.pipeline_of(env, transforms)
    cls = js.policies.RecurrentPolicy if recurrent else js.MLPPolicy
    size = {"hidden_size": 8} if recurrent else {"hidden_sizes": (8,)}
    policy = cls(pipe.observation_space, pipe.action_space, **size)
    sampler = js.Sampler(
        env,
        policy,
        num_envs=num_envs,
        rollout_length=T,
        seed=seed,
        transforms=transforms,
        episode_lookback_horizon=horizon,
    )
    return sampler, policy.init(jax.random.PRNGKey(1))


def _fingerprint(episodes: list[Any]) -> list[tuple[Any, ...]]:
    return [(e.id_, e.t_started, e.t, np.asarray(e.get_observations()).tobytes()) for e in episodes]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A sampler and a control built the same way, each one call in, and a good
    checkpoint of the sampler (with a params extra)."""
    root = tmp_path_factory.mktemp("ckpt")
    sampler, params = _build()
    control, _ = _build()
    sampler.sample(params)
    control.sample(params)
    good = sampler.save(root / "good", params=params)
    return {"sampler": sampler, "control": control, "params": params, "good": good, "root": root}


def _still_in_step(live: dict[str, Any]) -> None:
    """The sampler that refused a checkpoint samples what the untouched control does."""
    s, c, p = live["sampler"], live["control"], live["params"]
    assert _fingerprint(s.sample(p)) == _fingerprint(c.sample(p))


def _copy(live: dict[str, Any], name: str) -> Path:
    dst = live["root"] / name
    shutil.copytree(live["good"], dst)
    return dst


# ----------------------------------------------------------------------------- bad input


def _data_files(path: Path) -> list[Path]:
    return [p for p in (path / "arrays").rglob("*") if p.is_file() and p.parent.name == "d"]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # orbax's loop
def test_truncated_data_file(live: dict[str, Any]) -> None:
    path = _copy(live, "truncated")
    files = _data_files(path)
    assert files
    for f in files:
        data = f.read_bytes()
        f.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="incomplete or corrupt"):
        live["sampler"].load(path)
    _still_in_step(live)


def test_flipped_host_bytes_fail_the_digest(live: dict[str, Any]) -> None:
    # Rewrite the checkpoint with one bit of its host blob flipped, keeping the digest.
    tree, blob = checkpoint.restore(live["good"], with_host=True)
    meta = checkpoint.read_meta(live["good"])
    bad = bytearray(blob)
    bad[len(bad) // 2] ^= 0x10
    path = live["root"] / "flipped"
    checkpoint.save(path, tree, meta=meta, host=bytes(bad))
    header = path / "meta" / "metadata"
    patched = json.loads(header.read_text())
    assert patched["host_sha256"] != meta["host_sha256"]
    patched["host_sha256"] = meta["host_sha256"]
    header.write_text(json.dumps(patched))
    with pytest.raises(CheckpointError, match="SHA-256"):
        live["sampler"].load(path)
    _still_in_step(live)


def test_deleted_meta_file(live: dict[str, Any]) -> None:
    path = _copy(live, "no_meta")
    (path / "meta" / "metadata").unlink()
    with pytest.raises(CheckpointError, match="incomplete or corrupt"):
        live["sampler"].load(path)
    _still_in_step(live)


def test_random_directory_and_missing_path(live: dict[str, Any]) -> None:
    d = live["root"] / "random"
    d.mkdir()
    (d / "notes.txt").write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match="incomplete or corrupt"):
        live["sampler"].load(d)
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        live["sampler"].load(live["root"] / "nothing_here")
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        checkpoint.restore(live["root"] / "nothing_here")
    _still_in_step(live)


def test_wrong_format_version(live: dict[str, Any]) -> None:
    path = _copy(live, "version")
    header = path / "meta" / "metadata"
    meta = json.loads(header.read_text())
    meta["format_version"] = checkpoint.FORMAT_VERSION + 1
    header.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"format version 2; this jaxsampler reads version 1"):
        live["sampler"].load(path)
    _still_in_step(live)


def test_extras_must_all_be_named(live: dict[str, Any]) -> None:
    with pytest.raises(CheckpointError, match=r"holds extras \['params'\]; asked for \['opt'\]"):
        live["sampler"].load(live["good"], opt=live["params"])
    _still_in_step(live)


# ----------------------------------------------------------------------------- mismatches


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_envs": 8}, "num_envs: checkpoint 4, this one 8"),
        ({"env": "Acrobot-v1"}, "env: checkpoint 'CartPole-v1', this one 'Acrobot-v1'"),
        (
            {"transforms": (NormalizeObservation(),)},
            "transforms: checkpoint [], this one ['NormalizeObservation(",
        ),
        ({"recurrent": True}, "policy: checkpoint 'MLPPolicy', this one 'RecurrentPolicy'"),
        ({"horizon": 3}, "episode_lookback_horizon: checkpoint 1, this one 3"),
    ],
)
def test_mismatch_names_both_values(live: dict[str, Any], kwargs: dict, message: str) -> None:
    other, _ = _build(**kwargs)
    before = other._checkpoint_parts()
    with pytest.raises(CheckpointError, match="differently configured sampler") as err:
        other.load(live["good"])
    assert message in str(err.value)
    after = other._checkpoint_parts()
    assert before[0].keys() == after[0].keys() and after[1]["ids"]["resets"] == 0


def test_like_structure_mismatch_names_the_leaf(live: dict[str, Any]) -> None:
    path = live["root"] / "tree"
    tree = {"a": np.zeros((3, 2), np.float32), "b": {"c": np.arange(4)}}
    checkpoint.save(path, tree)
    with pytest.raises(
        CheckpointError, match=r"leaf a was saved as float32\[3, 2\]; .*float32\[3\]"
    ):
        checkpoint.restore(path, like={"a": np.zeros(3, np.float32), "b": {"c": np.arange(4)}})
    with pytest.raises(CheckpointError, match=r"missing in the checkpoint: b/d"):
        checkpoint.restore(path, like={"a": tree["a"], "b": {"c": tree["b"]["c"], "d": tree["a"]}})
    with pytest.raises(CheckpointError, match=r"not expected: b/c"):
        checkpoint.restore(path, like={"a": tree["a"], "b": {}})


# ----------------------------------------------------------------------------- host blob


class _Evil:
    def __init__(self, cmd: str):
        self.cmd = cmd

    def __reduce__(self) -> Any:
        return (os.system, (self.cmd,))


def test_restricted_loader_refuses_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    blob = pickle.dumps({"x": _Evil(f"touch {marker}")})
    with pytest.raises(CheckpointError, match=r"posix\.system|os\.system"):
        checkpoint.load_host(blob)
    assert not marker.exists()
    # numpy's memmap (an ndarray subclass whose constructor opens files) is refused too
    mm = pickle.dumps(_Reduce(np.memmap, (str(tmp_path / "mm"), np.uint8, "w+", 0, (4,))))
    with pytest.raises(CheckpointError, match="numpy.memmap"):
        checkpoint.load_host(mm)
    assert not (tmp_path / "mm").exists()
    # and so is a jaxsampler class that is not plain data
    srv = pickle.dumps(_Reduce(js.serving.PolicyServer, ()))
    with pytest.raises(CheckpointError, match="PolicyServer"):
        checkpoint.load_host(srv)
    with pytest.raises(CheckpointError, match="host state cannot be read"):
        checkpoint.load_host(b"not a pickle")


@dataclasses.dataclass
class _Reduce:
    fn: Any
    args: tuple

    def __reduce__(self) -> Any:
        return (self.fn, self.args)


def test_host_blob_round_trip_by_reference() -> None:
    space = js.spaces.Box(-1.0, 1.0, (2,), np.float32)
    obj = {
        "a": np.arange(3),
        "space": space,
        "m": js.sampling.SamplerMetrics(num_env_steps_sampled=3),
    }
    out = checkpoint.load_host(checkpoint.dump_host(obj, {"space": space}), {"space": space})
    assert out["space"] is space and repr(out["m"]) == repr(obj["m"])  # (NaN fields)
    np.testing.assert_array_equal(out["a"], obj["a"])
    with pytest.raises(CheckpointError, match="refers to 'space', which this sampler lacks"):
        checkpoint.load_host(checkpoint.dump_host(obj, {"space": space}))


# ----------------------------------------------------------------------------- trees, extras


def test_extra_trees_round_trip_with_and_without_like(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    import optax

    params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
    opt = optax.adam(1e-3)
    state = opt.init(params)
    _, state = opt.update(params, state, params)  # a step: non-zero moments, count 1
    checkpoint.save(tmp_path / "c", {"x": jnp.zeros(2)}, extra={"params": params, "opt": state})
    out = checkpoint.restore_extra(tmp_path / "c", like={"params": params, "opt": state})
    assert jax.tree.structure(out["opt"]) == jax.tree.structure(state)  # NamedTuples kept
    for a, b in zip(
        jax.tree.leaves(out), jax.tree.leaves({"params": params, "opt": state}), strict=True
    ):
        assert a.dtype == b.dtype and a.sharding == b.sharding
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    plain = checkpoint.restore_extra(tmp_path / "c")
    assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(plain))
    np.testing.assert_array_equal(plain["opt"][0]["mu"]["w"], np.asarray(state[0].mu["w"]))
    assert checkpoint.restore_extra(tmp_path / "c", like=None).keys() == {"params", "opt"}
    # uncommitted leaves come back uncommitted (they mix with arrays on any device)
    assert not out["params"]["w"].committed
    # on a mesh: the like's sharding
    mesh = js.rollout.placement.env_mesh(2)
    sharded = jax.device_put(
        jnp.arange(8.0), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("env"))
    )
    checkpoint.save(tmp_path / "m", {"x": sharded})
    got = checkpoint.restore(tmp_path / "m", like={"x": sharded})["x"]
    assert got.sharding == sharded.sharding and np.array_equal(got, sharded)
    # none of it logs (orbax's log lines are silenced around each call)
    err = capfd.readouterr().err
    assert "WARNING" not in err and "absl" not in err, err[-2000:]


def test_sampler_load_returns_extras_and_restore_builds(live: dict[str, Any]) -> None:
    params = live["params"]
    restored = js.Sampler.restore(
        live["good"],
        js.make("CartPole-v1"),
        live["sampler"].policy,
        num_envs=E,
        rollout_length=T,
        seed=99,
    )
    try:
        assert restored.totals.calls == 1 and restored.metrics.num_env_steps_sampled > 0
        other, _ = _build(seed=5)
        extra = other.load(live["good"])
        for a, b in zip(jax.tree.leaves(extra["params"]), jax.tree.leaves(params), strict=True):
            np.testing.assert_array_equal(a, np.asarray(b))
    finally:
        restored.close()


def test_save_refuses_an_existing_path_unless_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "c"
    checkpoint.save(path, {"v": np.zeros(2)})
    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        checkpoint.save(path, {"v": np.ones(2)})
    np.testing.assert_array_equal(checkpoint.restore(path)["v"], np.zeros(2))
    checkpoint.save(path, {"v": np.ones(3)}, overwrite=True)
    np.testing.assert_array_equal(checkpoint.restore(path)["v"], np.ones(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]  # no .new / .old left


def test_save_before_the_first_call_and_after_num_episodes(tmp_path: Path) -> None:
    sampler, params = _build(transforms=(NormalizeObservation(),))
    sampler.save(tmp_path / "fresh")
    assert checkpoint.read_meta(tmp_path / "fresh")["parts"] == ["key"]
    sampler.sample(params, num_episodes=2)
    assert sampler._state is None and sampler.transform_state is not None
    sampler.save(tmp_path / "episodes")
    assert checkpoint.read_meta(tmp_path / "episodes")["parts"] == ["carried", "key"]
    other, _ = _build(transforms=(NormalizeObservation(),), seed=7)
    other.load(tmp_path / "episodes")
    for a, b in zip(
        jax.tree.leaves(other.transform_state),
        jax.tree.leaves(sampler.transform_state),
        strict=True,
    ):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    assert _fingerprint(other.sample(params)) == _fingerprint(sampler.sample(params))


# ----------------------------------------------------------------------------- Checkpoints


def test_checkpoints_directory_keeps_the_newest(tmp_path: Path) -> None:
    ckpts = checkpoint.Checkpoints(tmp_path / "run", max_to_keep=2)
    assert ckpts.latest_step() is None
    for step in (1, 5, 10):
        ckpts.save(step, lambda p, s=step: checkpoint.save(p, {"s": np.array(s)}))
    assert ckpts.steps() == [5, 10] and ckpts.latest_step() == 10
    (ckpts.directory / "11.orbax-checkpoint-tmp-123").mkdir()
    (ckpts.directory / "notes").mkdir()
    assert ckpts.steps() == [5, 10]
    assert int(checkpoint.restore(ckpts.path(10))["s"]) == 10
    with pytest.raises(FileExistsError):
        ckpts.save(10, lambda p: checkpoint.save(p, {"s": np.array(0)}))
    with pytest.raises(ValueError, match="max_to_keep"):
        checkpoint.Checkpoints(tmp_path / "x", max_to_keep=0)


_KILLED_WRITER = """
import sys, time
from pathlib import Path
import numpy as np
from jaxsampler.rollout import checkpoint
from orbax.checkpoint._src.path import atomicity

ckpts = checkpoint.Checkpoints(sys.argv[1])
ckpts.save(1, lambda p: checkpoint.save(p, {"v": np.full(1000, 1.0)}))

async def hang(self):  # every file of step 2 is written; the rename never comes
    Path(sys.argv[2]).touch()
    time.sleep(600)

atomicity.AtomicRenameTemporaryPath.finalize = hang
ckpts.save(2, lambda p: checkpoint.save(p, {"v": np.full(1000, 2.0)}))
"""


def test_writer_killed_mid_save_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    run, event = tmp_path / "run", tmp_path / "writing"
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(run), str(event)],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not event.exists():
            assert child.poll() is None, f"writer exited early:\n{child.communicate()[1][-3000:]}"
            assert time.monotonic() < deadline, "the writer never reached step 2's write"
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == -signal.SIGKILL
    partial = [p for p in run.iterdir() if p.name.startswith("2.orbax-checkpoint-tmp")]
    assert partial and any(f.is_file() for f in partial[0].rglob("*"))  # a half-done write
    ckpts = checkpoint.Checkpoints(run)
    assert ckpts.steps() == [1] and ckpts.latest_step() == 1
    np.testing.assert_array_equal(checkpoint.restore(ckpts.path(1))["v"], np.full(1000, 1.0))
    # writing step 2 again works and clears the dead writer's leftovers
    ckpts.save(2, lambda p: checkpoint.save(p, {"v": np.full(1000, 3.0)}))
    assert ckpts.steps() == [1, 2]
    assert not [p for p in run.iterdir() if ".orbax-checkpoint-tmp" in p.name]
    np.testing.assert_array_equal(checkpoint.restore(ckpts.path(2))["v"], np.full(1000, 3.0))


# ----------------------------------------------------------------------------- unsupported


def test_host_sampler_cannot_be_checkpointed(tmp_path: Path) -> None:
    env = js.make("CartPole-v1")
    policy = js.RandomPolicy(env.observation_space, env.action_space)
    with js.Sampler("gym:CartPole-v1", policy, num_envs=1) as sampler:
        with pytest.raises(
            NotImplementedError, match="HostSampler cannot be checkpointed.*pure-JAX"
        ):
            sampler.save(tmp_path / "c")
        with pytest.raises(NotImplementedError, match="HostSampler cannot be checkpointed"):
            sampler.load(tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_mesh_spanning_processes_cannot_be_checkpointed(
    live: dict[str, Any], tmp_path: Path
) -> None:
    # A real multi-process mesh costs a jax.distributed cluster; the guard reads this flag,
    # which the constructor sets from the mesh's devices' process indices.
    sampler = live["sampler"]
    sampler._spans_processes = True
    try:
        with pytest.raises(NotImplementedError, match="spans processes"):
            sampler.save(tmp_path / "c")
        with pytest.raises(NotImplementedError, match="spans processes"):
            sampler.load(live["good"])
    finally:
        sampler._spans_processes = False
    assert not (tmp_path / "c").exists()
    _still_in_step(live)


# ----------------------------------------------------------------------------- benchmark


def test_checkpoint_benchmark_quick_writes_the_schema(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.checkpoint", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads((tmp_path / "checkpoint.json").read_text())
    assert res["benchmark"] == "checkpoint" and res["config"]["quick"]
    rows = res["rows"]
    assert {(r["setup"].split()[0], r["what"]) for r in rows} == {
        (env, what) for env in ("CartPole-v1", "Spread-v0") for what in ("sampler", "pure")
    }
    for r in rows:
        assert r["disk_bytes"] > 0 and r["array_bytes"] > 0
        assert r["save_s"] > 0 and r["load_s"] > 0
        # the sampler's checkpoint holds the host blob (open chunks); the pure one has none
        assert (r["host_blob_bytes"] > 0) == (r["what"] == "sampler")
    assert "| setup | what | on disk MB |" in (tmp_path / "checkpoint.md").read_text()


def test_host_blob_written_before_the_sampling_split_still_loads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A blob pickled when SamplerMetrics lived in jaxsampler.sampling.base (and AgentCarry in
    # jaxsampler.sampling.agent_steps) names those modules; the loader maps them to today's.
    import types

    from jaxsampler.sampling.device.agent_steps import AgentCarry
    from jaxsampler.sampling.metrics import SamplerMetrics

    old_steps = types.ModuleType("jaxsampler.sampling.agent_steps")
    old_steps.AgentCarry = AgentCarry  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "jaxsampler.sampling.agent_steps", old_steps)
    monkeypatch.setattr(SamplerMetrics, "__module__", "jaxsampler.sampling.base")
    monkeypatch.setattr(AgentCarry, "__module__", "jaxsampler.sampling.agent_steps")
    metrics = SamplerMetrics(num_env_steps_sampled=7, episode_return_mean=1.5)
    blob = checkpoint.dump_host({"m": metrics})
    assert b"jaxsampler.sampling.base" in blob
    monkeypatch.undo()  # today's layout: the old module names no longer exist

    back = checkpoint.load_host(blob)["m"]
    assert type(back) is SamplerMetrics and repr(back) == repr(metrics)  # (NaN fields)
    with pytest.raises(CheckpointError, match="may not"):
        checkpoint.load_host(blob.replace(b"SamplerMetrics", b"SamplerMetricz"))
