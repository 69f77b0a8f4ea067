"""``Sampler(mesh=...)`` over 2 processes (``jax.distributed`` on 127.0.0.1, 1 CPU device
each). Reference: the same sampler in this process on a 2-device mesh (the same global
envs, seed and calls). Process ``p`` must return exactly the reference's episodes and batch
rows of the envs in its slice (ids, lengths, flags, actions exactly; floats up to
rounding), make the same number of rollout calls, and its ``global_metrics()`` must be
the combination of both processes' local metrics (and the reference's metrics).
"""

from __future__ import annotations

import json
from typing import Any

import jax
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.rollout import placement
from tests.processes import run_processes

NUM_ENVS, T, SEED = 4, 16, 7
MARKER = "SAMPLER-MP-DONE"

# (method, kwargs) of the calls every process (and the reference) makes.
CALLS: list[tuple[str, dict[str, int]]] = [
    ("sample", {}),
    ("sample_batch", {}),
    ("sample", {"num_timesteps": 90}),
    ("sample", {"num_episodes": 3}),
    ("sample_batch", {"num_episodes": 5}),
    ("sample_batch", {"num_timesteps": 40}),
]


def make_sampler(mesh: Any) -> Any:
    env = js.make("CartPole-v1")
    pol = js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(8,))
    params = pol.init(jax.random.PRNGKey(1))
    return js.Sampler(env, pol, NUM_ENVS, T, seed=SEED, mesh=mesh), params


def episode_record(ep: js.SingleAgentEpisode) -> dict[str, Any]:
    return {
        "id": ep.id_,
        "t": [ep.t_started, ep.t, len(ep)],
        "flags": [bool(ep.is_terminated), bool(ep.is_truncated)],
        "actions": np.asarray(ep.actions.data).tolist(),
        "obs": np.asarray(ep.observations.data).tolist(),
        "rewards": np.asarray(ep.rewards.data).tolist(),
    }


def batch_record(batch: js.MultiAgentBatch) -> dict[str, Any]:
    b = batch.policy_batches["default_policy"]
    return {
        k: [str(x) for x in b[k]] if k == "eps_id" else np.asarray(b[k]).tolist()
        for k in ("eps_id", "t", "actions", "terminateds", "truncateds", "obs", "rewards")
    }


def run_calls(sampler: Any, params: Any, global_metrics: bool) -> list[dict[str, Any]]:
    out = []
    for method, kw in CALLS:
        result = getattr(sampler, method)(params, **kw)
        rec: dict[str, Any] = {"metrics": sampler.metrics.as_dict()}
        if method == "sample":
            rec["episodes"] = [episode_record(ep) for ep in result]
        else:
            rec["batch"] = batch_record(result)
        if global_metrics:
            rec["global"] = sampler.global_metrics().as_dict()
        out.append(rec)
    return out


SCRIPT = f"""
import jaxsampler.rollout.distributed as dist
dist.initialize()
import json, jax
from jaxsampler.rollout import placement
from tests.sampling.device.test_multiprocess import make_sampler, run_calls
assert jax.process_count() == 2 and jax.local_device_count() == 1
sampler, params = make_sampler(placement.env_mesh())
records = run_calls(sampler, params, global_metrics=True)
sl = sampler.local_envs
print(json.dumps({{"slice": [sl.start, sl.stop], "calls": records}}))
print({MARKER!r})
"""


def env_of(episode_id: str) -> int:
    return int(episode_id[18:24], 16)  # the id's stream field: the global env index


def close(got: Any, want: Any) -> None:
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-5)


def test_each_process_samples_its_own_envs_and_metrics_add_up():
    if jax.device_count() < 2:
        pytest.skip("the reference needs 2 XLA CPU devices")
    outs = run_processes(SCRIPT, MARKER, n=2, devices=1, timeout=300)
    procs = [json.loads(o.strip().splitlines()[-2]) for o in outs]
    assert [p["slice"] for p in procs] == [[0, 2], [2, 4]]

    sampler, params = make_sampler(placement.env_mesh(2))
    want = run_calls(sampler, params, global_metrics=False)

    for i, (method, kw) in enumerate(CALLS):
        where = f"call {i} {method}({kw})"
        ref = want[i]
        locals_ = [js.sampling.SamplerMetrics(**p["calls"][i]["metrics"]) for p in procs]
        combined = js.sampling.SamplerMetrics.combine(locals_)
        for p in procs:
            got = p["calls"][i]
            # Global metrics: the combination of the processes' local ones, equal on both
            # processes, and those of one process holding every env.
            assert got["global"] == combined.as_dict(), where
            assert got["metrics"]["num_rollout_calls"] == ref["metrics"]["num_rollout_calls"]
        assert combined.num_env_steps_sampled == sum(m.num_env_steps_sampled for m in locals_)
        assert combined.num_episodes_completed == sum(m.num_episodes_completed for m in locals_)
        for k, v in ref["metrics"].items():
            if isinstance(v, int):
                assert getattr(combined, k) == v, f"{where}: {k}"
            else:
                np.testing.assert_allclose(getattr(combined, k), v, rtol=1e-12, err_msg=k)

        for p in procs:
            lo, hi = p["slice"]
            got = p["calls"][i]
            if method == "sample":
                mine = [e for e in ref["episodes"] if lo <= env_of(e["id"]) < hi]
                assert mine, f"{where}: the reference has no episodes of envs {lo}..{hi - 1}"
                assert len(got["episodes"]) == len(mine), where
                for g, w in zip(got["episodes"], mine, strict=True):
                    assert (g["id"], g["t"], g["flags"]) == (w["id"], w["t"], w["flags"]), where
                    assert g["actions"] == w["actions"], where
                    close(g["obs"], w["obs"])
                    close(g["rewards"], w["rewards"])
            else:
                rows = [lo <= env_of(e) < hi for e in ref["batch"]["eps_id"]]
                gb, wb = got["batch"], ref["batch"]
                assert sum(rows) > 0 and len(gb["eps_id"]) == sum(rows), where
                for k in ("eps_id", "t", "actions", "terminateds", "truncateds"):
                    assert gb[k] == [x for x, r in zip(wb[k], rows, strict=True) if r], (
                        f"{where}: {k}"
                    )
                for k in ("obs", "rewards"):
                    close(gb[k], [x for x, r in zip(wb[k], rows, strict=True) if r])
        # Ids never collide across processes.
        ids = [
            {e["id"] for e in p["calls"][i]["episodes"]}
            if method == "sample"
            else set(p["calls"][i]["batch"]["eps_id"])
            for p in procs
        ]
        assert ids[0] and ids[1] and not ids[0] & ids[1], where
