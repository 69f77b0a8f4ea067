"""Fresh-process worker of tests/sampling/test_resume.py (exact resume from checkpoints).

``python -m tests.resume_worker save DIR JOB...`` runs, for each job, the uninterrupted
reference (all calls, never saved) and a second, identically built sampler that makes the
``before`` calls, saves to ``DIR/JOB/ckpt`` (with ``params=`` as an extra tree) and makes
the ``after`` calls; ``... load DIR JOB...`` builds the job's sampler with *another* seed
and other params, loads the checkpoint (params included) and makes the ``after`` calls,
then loads the same checkpoint once more into the now warm sampler and repeats the first
``after`` call. Every call's output (episodes or batch, metrics, totals, compile count) is
written as plain numpy / dict data to ``DIR/JOB/<mode>.pkl`` for the test to compare bit
for bit. Jobs named ``pure_*`` do the same with ``js.rollout.checkpoint.save`` / ``restore`` of a
``RolloutState`` (with transform state) plus params in a hand-written loop.

The test passes ``JAXSAMPLER_TEST_JAX_CACHE`` (a persistent compilation cache shared by the
processes, so each program compiles once per test run).
"""

from __future__ import annotations

import os
import sys

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
    ).strip()

import dataclasses
import pickle
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

if os.environ.get("JAXSAMPLER_TEST_JAX_CACHE"):
    jax.config.update("jax_compilation_cache_dir", os.environ["JAXSAMPLER_TEST_JAX_CACHE"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)

import jaxsampler as js
from jaxsampler.episodes import MultiAgentBatch, MultiAgentEpisode, SingleAgentEpisode
from jaxsampler.episodes.lookback import InfiniteLookbackBuffer
from jaxsampler.transforms import (
    DomainRandomization,
    FrameStack,
    NormalizeObservation,
    NormalizeReward,
)

Call = tuple[str, dict[str, Any]]  # ("sample" | "batch", sample kwargs)
SAMPLE: Call = ("sample", {})
BATCH: Call = ("batch", {})

SEED, OTHER_SEED = 3, 1234  # the saver's seed; the restoring sampler's (different on purpose)


@dataclasses.dataclass
class Job:
    build: Callable[[int], tuple[js.Sampler, Any]]  # seed -> (sampler, params)
    before: list[Call]
    after: list[Call]


def _policy(env: Any, transforms: Any = None, recurrent: bool = False) -> Any:
    pipe = js.rollout.pipeline_of(env, transforms)
    if recurrent:
        return js.policies.RecurrentPolicy(pipe.observation_space, pipe.action_space, hidden_size=8)
    return js.MLPPolicy(pipe.observation_space, pipe.action_space, hidden_sizes=(8,))


def _sampler(env: Any, seed: int, *, transforms: Any = None, recurrent: bool = False, **kw: Any):
    policy = _policy(env, transforms, recurrent)
    params = policy.init(jax.random.PRNGKey(seed + 7))
    sampler = js.Sampler(env, policy, seed=seed, transforms=transforms, **kw)
    return sampler, params


def randomize_length(key: jax.Array, base: Any) -> Any:
    """Domain randomization of CartPole's pole half-length (module level: its repr is stable)."""
    return dataclasses.replace(base, length=jax.random.uniform(key, (), minval=0.3, maxval=0.7))


def _transforms() -> tuple[Any, ...]:
    return (
        DomainRandomization(randomize_length),
        FrameStack(2),
        NormalizeObservation(),
        NormalizeReward(gamma=0.9),
    )


def _cartpole(seed: int, **kw: Any) -> tuple[js.Sampler, Any]:
    kw.setdefault("num_envs", 4)
    kw.setdefault("rollout_length", 8)
    return _sampler(js.make("CartPole-v1"), seed, episode_lookback_horizon=2, **kw)


def _per_env_params() -> Any:
    base = js.make("CartPole-v1").default_params
    return dataclasses.replace(base, length=jnp.linspace(0.4, 0.6, 4))


def _sharded(seed: int) -> tuple[js.Sampler, Any]:
    return _cartpole(seed, transforms=_transforms(), devices=2, env_params=_per_env_params())


JOBS: dict[str, Job] = {
    # single-agent MLP: episodes open across the save, lookback 2
    "cartpole": Job(_cartpole, [SAMPLE, SAMPLE, SAMPLE], [SAMPLE, BATCH, SAMPLE]),
    # a save before the first call (no state yet: the load keeps only the random state)
    "fresh": Job(_cartpole, [], [SAMPLE, SAMPLE]),
    # topup chunks, sample / sample_batch mixed, num_timesteps calls on both sides
    "topup_mixed": Job(
        lambda seed: _cartpole(seed, topup_length=3),
        [("sample", {"num_timesteps": 40}), BATCH],
        [("batch", {"num_timesteps": 45}), SAMPLE, ("sample", {"num_timesteps": 37})],
    ),
    # domain randomization, frame stack, observation and reward normalization
    "transforms": Job(
        lambda seed: _cartpole(seed, transforms=_transforms()),
        [SAMPLE, BATCH, SAMPLE],
        [SAMPLE, SAMPLE, BATCH],
    ),
    # a save right after a num_episodes call (the state is gone; the transforms' is carried)
    "after_episodes": Job(
        lambda seed: _cartpole(seed, transforms=_transforms()),
        [SAMPLE, ("sample", {"num_episodes": 3})],
        [("sample", {"num_episodes": 2}), SAMPLE, BATCH],
    ),
    # the env axis split over 2 devices, with the transforms and per-env base params
    "sharded": Job(_sharded, [SAMPLE, BATCH, SAMPLE], [SAMPLE, BATCH]),
    # multi-agent (RLlib-compatible flags) with a recurrent (GRU) policy
    "spread_gru": Job(
        lambda seed: _sampler(
            js.make("Spread-v0"),
            seed,
            num_envs=2,
            rollout_length=8,
            rllib_compatible=True,
            recurrent=True,
            episode_lookback_horizon=2,
        ),
        [SAMPLE, BATCH, SAMPLE],
        [SAMPLE, BATCH, SAMPLE],
    ),
    # turn-based: odd chunk length, so saves fall mid-turn (hanging actions)
    "tictactoe": Job(
        lambda seed: _sampler(
            js.make("TicTacToe-v0"), seed, num_envs=4, rollout_length=5, episode_lookback_horizon=2
        ),
        [SAMPLE, SAMPLE, SAMPLE],
        [SAMPLE, SAMPLE, BATCH, SAMPLE],
    ),
}


# ----------------------------------------------------------------------------- outputs


def canon(obj: Any) -> Any:
    """``obj`` as plain data (dicts, lists, numpy arrays, Python scalars) for a bit-for-bit
    comparison: episodes through their full state (lookback buffers, hanging steps, ids,
    ``t_started``...), without wall-clock times."""
    if isinstance(obj, SingleAgentEpisode):
        state = obj.get_state()
    elif isinstance(obj, MultiAgentEpisode):
        state = obj.get_state()
        state["agent_to_module_mapping_fn"] = repr(state["agent_to_module_mapping_fn"])
    elif isinstance(obj, MultiAgentBatch):
        return {"env_steps": obj.env_steps(), "batches": canon(dict(obj.policy_batches))}
    elif isinstance(obj, InfiniteLookbackBuffer):
        return canon(obj.get_state())
    elif isinstance(obj, Mapping):
        return {k: canon(v) for k, v in obj.items()}
    elif isinstance(obj, (list, tuple)):
        return [canon(v) for v in obj]
    elif isinstance(obj, (np.ndarray, jax.Array, np.generic)):
        return np.asarray(obj)
    elif obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return canon(dataclasses.asdict(obj))
    else:
        return repr(obj)
    for k in ("_start_time", "_last_step_time"):
        state.pop(k, None)
    return {type(obj).__name__: canon(state)}


class Reports:
    def __init__(self) -> None:
        self.compiles: list[int] = []

    def on_sample_end(self, report: Any) -> None:
        self.compiles.append(report.num_compiles)


def _run(sampler: js.Sampler, params: Any, calls: list[Call]) -> list[dict[str, Any]]:
    out = []
    for kind, kw in calls:
        result = (sampler.sample if kind == "sample" else sampler.sample_batch)(params, **kw)
        out.append(
            {
                "result": canon(result),
                "metrics": canon(sampler.metrics),
                "totals": canon(sampler.totals),
            }
        )
    return out


def _with_reports(sampler: js.Sampler) -> Reports:
    rep = Reports()
    sampler.callbacks.append(rep)
    return rep


def save_job(name: str, job: Job, d: Path) -> dict[str, Any]:
    ref, params = job.build(SEED)
    reference = _run(ref, params, job.before + job.after)
    ref.close()
    sampler, params = job.build(SEED)
    before = _run(sampler, params, job.before)
    sampler.save(d / "ckpt", params=params)
    (d / "saved").touch()  # the load worker may start on this job
    after = _run(sampler, params, job.after)
    sampler.close()
    return {
        "reference": reference[len(job.before) :],
        "before": before,
        "continued": after,
        "params": canon(params),
    }


def load_job(name: str, job: Job, d: Path) -> dict[str, Any]:
    sampler, other_params = job.build(OTHER_SEED)
    rep = _with_reports(sampler)
    extra = sampler.load(d / "ckpt", params=other_params)
    params = extra["params"]
    same_sharding = all(
        a.sharding == b.sharding
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(other_params), strict=True)
    )
    resumed = _run(sampler, params, job.after)
    compiles = list(rep.compiles)
    sampler.load(d / "ckpt")  # again, into the warm sampler
    again = _run(sampler, params, job.after[:1])
    sampler.close()
    return {
        "resumed": resumed,
        "compiles": compiles,
        "again": again,
        "again_compiles": rep.compiles[len(compiles) :],
        "params": canon(params),
        "params_sharding_kept": same_sharding,
    }


# ----------------------------------------------------------------------------- pure path


def _pure(mesh: int | None) -> tuple[Any, Any, Any]:
    """The rollout of the ``transforms`` job's sampler (``mesh=2``: of the ``sharded``
    job's), built by hand: the same programs, so they compile once per test run."""
    env = js.make("CartPole-v1")
    transforms = _transforms()
    policy = _policy(env, transforms)
    rollout = js.jit_rollout(js.make_rollout(env, policy, 4, 8, transforms=transforms, mesh=mesh))
    params = None if mesh is None else _per_env_params()
    return rollout, policy, lambda key: rollout.init(key, params)


def _traj(traj: Any) -> Any:
    return canon(dataclasses.asdict(js.rollout.placement.to_host(traj)))


def pure_save(mesh: int | None, d: Path) -> dict[str, Any]:
    rollout, policy, init = _pure(mesh)
    params = policy.init(jax.random.PRNGKey(1))
    state, traj = None, None
    out: dict[str, Any] = {"reference": []}
    state = init(jax.random.PRNGKey(0))
    for i in range(4):
        if i == 2:
            js.rollout.checkpoint.save(d / "ckpt", {"rollout": state, "params": params})
            (d / "saved").touch()
        state, traj = rollout(params, state, traj)
        if i >= 2:
            out["reference"].append(_traj(traj))
    return out


def pure_load(mesh: int | None, d: Path) -> dict[str, Any]:
    rollout, policy, init = _pure(mesh)
    like = {"rollout": init(jax.random.PRNGKey(99)), "params": policy.init(jax.random.PRNGKey(5))}
    tree = js.rollout.checkpoint.restore(d / "ckpt", like=like)
    out: dict[str, Any] = {
        "is_rollout_state": isinstance(tree["rollout"], js.RolloutState),
        "sharding_kept": all(
            a.sharding == b.sharding
            for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(like), strict=True)
        ),
        "sharded_leaves": sum(
            len(a.sharding.device_set) > 1 for a in jax.tree.leaves(tree["rollout"])
        ),
        "resumed": [],
    }
    state, params, traj = tree["rollout"], tree["params"], None
    for _ in range(2):
        state, traj = rollout(params, state, traj)
        out["resumed"].append(_traj(traj))
    # like=None: the saved structure with numpy leaves
    plain = js.rollout.checkpoint.restore(d / "ckpt")
    out["plain_types"] = sorted({type(x).__name__ for x in jax.tree.leaves(plain)})
    out["plain_keys"] = sorted(plain["rollout"])
    return out


PURE = {"pure": None, "pure_mesh": 2}


def main(argv: list[str]) -> None:
    import time

    mode, root, names = argv[0], Path(argv[1]), argv[2:]
    t0 = time.perf_counter()
    for name in names:
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        if mode == "load":  # runs alongside the save worker: wait for its checkpoint
            deadline = time.monotonic() + 600
            while not (d / "saved").exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no checkpoint of {name} in {d}")
                time.sleep(0.05)
        if name in PURE:
            out = (pure_save if mode == "save" else pure_load)(PURE[name], d)
        else:
            out = (save_job if mode == "save" else load_job)(name, JOBS[name], d)
        with open(d / f"{mode}.tmp", "wb") as f:
            pickle.dump(out, f)
        os.replace(d / f"{mode}.tmp", d / f"{mode}.pkl")
        print(f"{mode} {name} done at {time.perf_counter() - t0:.1f} s", flush=True)
    print("WORKER OK", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
