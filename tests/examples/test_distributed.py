"""examples.ppo_distributed: PPO on a mesh over 2 jax.distributed processes (1 CPU device
each) is the same global computation as on 1 process with 2 devices; the params stay
identical across processes after every update; global episode counts are the sums of the
local ones; each process holds its own env slice (learning results:
benchmarks/results/ppo_distributed.md)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from examples import ppo_distributed as ex
from tests.processes import run_processes

# Each process: 3 tiny updates (QUICK: 4 global envs x 16 steps), recording after each
# update its copy of the params, every process's copy (allgather), its episode counts and
# its part of the trajectory.
SCRIPT = """
import json
import jaxsampler.rollout.distributed as dist
dist.initialize()
import jax, numpy as np
from jaxsampler.rollout import placement
import examples.ppo_distributed as ex
mesh = placement.env_mesh()
cfg = ex.QUICK
rec = []
def on_update(i, carry, stats, traj):
    flat = ex.flat_params(carry.params)
    every = dist.process_allgather(flat)
    ret, eps, total_eps, obs, term, trunc = placement.to_host(
        (stats.return_sum, stats.episodes, stats.total_episodes, traj.obs, traj.terminated,
         traj.truncated))
    rec.append(dict(params=flat.tolist(), every_equal=bool((every == every[0]).all()),
                    processes_seen=len(every), local_episodes=eps.tolist(),
                    local_return_sum=ret.tolist(), total_episodes=int(total_eps),
                    obs=obs.tolist(), ends=(term | trunc).sum(0)[:, 0].tolist()))
res = ex.train(cfg, mesh, seed=0, on_update=on_update, verify_replicas=True)
s = placement.local_env_slice(mesh, cfg.num_envs)
print("RESULT " + json.dumps(dict(process=jax.process_index(), slice=[s.start, s.stop],
      rec=rec, res=res)))
"""


def parse(out: str) -> dict:
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def reference(mesh_devices: int):
    """The same training on 1 process with ``mesh_devices`` local devices: per update the
    params and the global observations."""
    from jaxsampler.rollout import placement

    rec = []

    def on_update(i, carry, stats, traj):
        rec.append(
            dict(
                params=ex.flat_params(carry.params),
                obs=np.asarray(traj.obs),
                episodes=np.asarray(stats.episodes),
            )
        )

    res = ex.train(ex.QUICK, placement.env_mesh(mesh_devices), seed=0, on_update=on_update)
    return rec, res


def test_two_processes_match_one_process_with_two_devices():
    outs = run_processes(SCRIPT, "RESULT", n=2, devices=1, timeout=900)
    runs = sorted((parse(o) for o in outs), key=lambda r: r["process"])
    cfg = ex.QUICK
    updates = cfg.num_updates
    assert updates == 3 and [r["process"] for r in runs] == [0, 1]
    # Each process holds a contiguous half of the 4 envs.
    assert [r["slice"] for r in runs] == [[0, 2], [2, 4]]
    ref, ref_res = reference(2)
    assert len(ref) == updates
    for i in range(updates):
        a, b = runs[0]["rec"][i], runs[1]["rec"][i]
        # Params identical across processes after every update: each saw every copy equal
        # (allgather), and the two copies printed here are bit-identical too.
        assert a["every_equal"] and b["every_equal"] and a["processes_seen"] == 2
        np.testing.assert_array_equal(np.float32(a["params"]), np.float32(b["params"]))
        # The same global computation as 1 process x 2 devices.
        np.testing.assert_allclose(np.float32(a["params"]), ref[i]["params"], rtol=1e-5, atol=1e-6)
        for r, part in zip(runs, (a, b), strict=True):
            lo, hi = r["slice"]
            obs = np.float32(part["obs"])  # [T + 1, local envs, 1, 4]
            assert obs.shape == (cfg.rollout_length + 1, 2, 1, 4)
            # this process's envs are the global envs lo:hi of the reference
            np.testing.assert_allclose(obs, ref[i]["obs"][:, lo:hi], rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(part["local_episodes"], ref[i]["episodes"][lo:hi])
            # per-env counts are the episode ends in this process's trajectory
            np.testing.assert_array_equal(part["local_episodes"], part["ends"])
        # global count = sum of the local counts = the jit's own global reduction
        local_total = sum(a["local_episodes"]) + sum(b["local_episodes"])
        assert a["total_episodes"] == b["total_episodes"] == local_total
        assert runs[0]["res"]["episodes_per_update"][i] == local_total
        assert ref_res["episodes_per_update"][i] == local_total
    assert sum(runs[0]["res"]["episodes_per_update"]) > 0  # episodes did end
    # Both processes report the same global figures.
    for key in ("episodes_per_update", "learning_curve", "final_mean_return"):
        assert runs[0]["res"][key] == runs[1]["res"][key]
    np.testing.assert_allclose(
        runs[0]["res"]["final_mean_return"], ref_res["final_mean_return"], rtol=1e-6
    )
    # The gradient is all-reduced across the 2 processes (XLA inserted the collective);
    # on one device there is nothing to reduce.
    assert runs[0]["res"]["hlo_all_reduces"] > 0 and ref_res["hlo_all_reduces"] > 0
    assert runs[0]["res"]["processes"] == 2 and runs[0]["res"]["local_envs"] == 2


def test_one_device_is_the_same_run_up_to_rounding(tmp_path):
    """The env-stratified minibatches do not depend on the device count: 1 device trains
    the same params as 2 (float rounding aside); the report files are written."""
    one, one_res = reference(1)
    two, two_res = reference(2)
    assert one_res["hlo_all_reduces"] == 0
    assert one_res["episodes_per_update"] == two_res["episodes_per_update"]
    for a, b in zip(one, two, strict=True):
        np.testing.assert_allclose(a["params"], b["params"], rtol=1e-3, atol=1e-4)
    paths = []
    for name, res in (("one", one_res), ("two", two_res)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(res))
    ex.report(paths, tmp_path, "test")
    md = (tmp_path / "ppo_distributed.md").read_text()
    assert "| 1 process x 1 device |" in md and "| 1 process x 2 devices |" in md
    saved = json.loads((tmp_path / "ppo_distributed.json").read_text())
    assert set(saved["runs"]) == {"1 process x 1 device", "1 process x 2 devices"}
    assert (tmp_path / "ppo_distributed.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_sizes_are_named():
    import dataclasses

    from jaxsampler.rollout import placement

    mesh = placement.env_mesh(2)
    with pytest.raises(ValueError, match="num_envs=5 .* nearest valid: 4 or 6"):
        ex.make_trainer(dataclasses.replace(ex.QUICK, num_envs=5), mesh)
    with pytest.raises(ValueError, match="rollout_length=15 is not divisible by num_minibatches=2"):
        ex.make_trainer(dataclasses.replace(ex.QUICK, rollout_length=15), mesh)
    assert jax.device_count() == 2
    with pytest.raises(SystemExit):  # the CLI reports it as a usage error
        ex.main(["--quick", "--num-envs", "5"])
