"""How much of the learner's time an :class:`~jaxsampler.sampling.AsyncActor` hides: wall
time per iteration of a synchronous loop (sample, then learn) against the same loop with
sampling in the actor's thread, side by side.

Two settings:

* ``host``: Gymnasium's CartPole-v1 (``Sampler("gym:CartPole-v1", ...)``, 16 envs, 512
  steps per ``sample_batch``) feeding a jitted learner on the host;
* ``devices``: the pure-JAX CartPole's jitted rollout (``make_rollout``, 1024 envs x 64
  steps) on CPU device 0 and the learner's jit on CPU device 1 (the "Sebulba" layout; two
  XLA host devices on this machine's cores).

The learner is ``K`` steps of SGD on the policy's log-likelihood of the sampled actions,
with ``K`` calibrated so that one learn takes about as long as one sample (the case where
overlap helps most: the ideal is 2x). Per setting: ``sample`` and ``learn`` alone, the
synchronous iteration (ideally ``sample + learn``), the overlapped one (ideally
``max(sample, learn)``), the speed-up and its share of the ideal speed-up. Medians over
``--iterations`` iterations per loop, the two loops alternated ``--repeats`` times.

    python -m benchmarks.async_overlap           # writes results/async_overlap.*
    python -m benchmarks.async_overlap --quick   # smoke test, prints only
"""

from __future__ import annotations

import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
    )

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxsampler as js
from benchmarks import harness
from jaxsampler.sampling import AsyncActor


def make_learner(policy: Any, steps: int, device: Any = None) -> Callable:
    """``learn(params, obs, actions) -> params``: ``steps`` SGD steps on the negative
    log-likelihood of ``actions`` (jitted; runs where its inputs live)."""

    def nll(params, obs, actions):
        logits = policy.forward(params, obs)[0]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), actions[:, None], 1))

    @jax.jit
    def learn(params, obs, actions):
        def step(_, p):
            g = jax.grad(nll)(p, obs, actions)
            return jax.tree.map(lambda x, gx: x - 1e-3 * gx, p, g)

        return jax.lax.fori_loop(0, steps, step, params)

    return learn


def host_setting(quick: bool) -> dict[str, Any]:
    n_envs, rows = (4, 64) if quick else (16, 512)
    sampler = js.Sampler("gym:CartPole-v1", _policy(), num_envs=n_envs, seed=0)
    policy = sampler.policy

    def sample(params):
        batch = sampler.sample_batch(params, num_timesteps=rows)["default_policy"]
        return _fixed(batch["obs"], rows), _fixed(batch["actions"], rows)

    return {"name": "host", "sample": sample, "policy": policy, "close": sampler.close}


def devices_setting(quick: bool) -> dict[str, Any]:
    d0, d1 = jax.devices()[:2]
    env, policy = js.make("CartPole-v1"), _policy()
    n_envs, steps = (64, 16) if quick else (1024, 64)
    rollout = js.make_rollout(env, policy, n_envs, steps)
    state = [jax.device_put(rollout.init(jax.random.PRNGKey(0)), d0)]

    @jax.jit
    def run(params, st):
        st, traj = rollout(params, st)
        return st, traj.obs[:steps].reshape(-1, traj.obs.shape[-1]), traj.actions.reshape(-1)

    def sample(params):
        state[0], obs, actions = run(params, state[0])
        return obs, actions

    return {
        "name": "devices",
        "sample": sample,
        "policy": policy,
        "actor_device": d0,
        "learner_device": d1,
        "close": lambda: None,
    }


def _policy() -> js.MLPPolicy:
    env = js.make("CartPole-v1")
    return js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(64, 64))


def _fixed(x: np.ndarray, n: int) -> np.ndarray:
    """``x`` with exactly ``n`` rows (cut, or padded by repeating), so the learner never
    recompiles."""
    x = np.asarray(x)
    if len(x) >= n:
        return x[:n]
    return np.concatenate([x, x[np.arange(n - len(x)) % max(len(x), 1)]])


def _calibrate(policy: Any, params: Any, data: Any, target_s: float) -> int:
    """SGD steps for a learn of about ``target_s`` seconds (from the times of 1 and 65)."""
    times = {}
    for k in (1, 65):
        learn = make_learner(policy, k)
        _ready(learn(params, *data))
        times[k] = statistics.median(
            harness.timed(lambda f=learn: f(params, *data)) for _ in range(5)
        )
    per_step = max((times[65] - times[1]) / 64, 1e-7)
    return int(np.clip(round((target_s - times[1]) / per_step), 1, 100_000))


def _ready(x: Any) -> Any:
    return jax.block_until_ready(x)


def measure(setting: dict[str, Any], iterations: int, repeats: int) -> dict[str, Any]:
    policy, sample = setting["policy"], setting["sample"]
    actor_dev, learner_dev = setting.get("actor_device"), setting.get("learner_device")
    params = policy.init(jax.random.PRNGKey(0))
    if actor_dev is not None:
        params = jax.device_put(params, actor_dev)
    put = (lambda x: jax.device_put(x, learner_dev)) if learner_dev is not None else (lambda x: x)
    learner_params = put(params)

    data = put(_ready(sample(params)))  # compile the sampler
    sample_s = statistics.median(harness.timed(lambda: _ready(sample(params))) for _ in range(5))
    steps = _calibrate(policy, learner_params, data, sample_s)
    learn = make_learner(policy, steps)
    _ready(learn(learner_params, *data))
    learn_s = statistics.median(
        harness.timed(lambda: learn(learner_params, *data)) for _ in range(5)
    )
    harness.log(
        f"{setting['name']}: sample {sample_s * 1e3:.1f} ms, learn {learn_s * 1e3:.1f} ms "
        f"({steps} SGD steps)"
    )

    def sync_loop() -> float:
        p = learner_params
        times = []
        for _ in range(iterations):
            t0 = time.perf_counter()
            batch = put(sample(p if actor_dev is None else jax.device_put(p, actor_dev)))
            p = _ready(learn(p, *batch))
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def async_loop() -> float:
        p = learner_params
        times = []
        with AsyncActor(
            sample, params, max_queue=1, actor_device=actor_dev, learner_device=learner_dev
        ) as actor:
            actor.get(timeout=600)  # warm: the first sample has no learn to hide behind
            for _ in range(iterations):
                t0 = time.perf_counter()
                s = actor.get(timeout=600)
                p = _ready(learn(p, *s.data))
                actor.update(p)
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    sync_s, async_s = [], []
    for r in range(repeats):
        for name in harness.alternated(["sync", "async"], r):
            (sync_s if name == "sync" else async_s).append(
                sync_loop() if name == "sync" else async_loop()
            )
    setting["close"]()
    row = {
        "setting": setting["name"],
        "sample_s": sample_s,
        "learn_s": learn_s,
        "sgd_steps": steps,
        "sync_iter_s": statistics.median(sync_s),
        "async_iter_s": statistics.median(async_s),
        "speedup": harness.paired_ratio(sync_s, async_s),
    }
    row["ideal_speedup"] = (sample_s + learn_s) / max(sample_s, learn_s)
    row["share_of_ideal"] = (row["speedup"] - 1) / max(row["ideal_speedup"] - 1, 1e-9)
    harness.log(
        f"{setting['name']}: sync {row['sync_iter_s'] * 1e3:.1f} ms/iter, async "
        f"{row['async_iter_s'] * 1e3:.1f} ms/iter: {row['speedup']:.2f}x "
        f"(ideal {row['ideal_speedup']:.2f}x)"
    )
    return row


def markdown(res: dict[str, Any]) -> str:
    md = (
        f"# {res['benchmark']}\n\n{res['date']} · `{res['command']}` · {os.cpu_count()} CPUs · "
        f"medians over {res['iterations']} iterations, loops alternated {res['repeats']} times "
        f"· wall {res['wall_s']:.0f} s\n\n"
        "A synchronous loop (sample, then learn) against the same loop with sampling in an"
        " `AsyncActor` thread. *host*: Gymnasium CartPole-v1 through the host sampler, the"
        " learner's jit on the host; *devices*: the pure-JAX CartPole's jitted rollout on CPU"
        " device 0, the learner's jit on CPU device 1. The learner's SGD steps are calibrated"
        " so that a learn takes about as long as a sample; *ideal*: (sample + learn) / max("
        "sample, learn); *share*: how much of the ideal gain the overlap got.\n\n"
        "| setting | sample ms | learn ms | sync ms/iter | async ms/iter | speed-up "
        "| ideal | share of ideal |\n|---|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    for r in res["rows"]:
        md += (
            f"| {r['setting']} | {r['sample_s'] * 1e3:.1f} | {r['learn_s'] * 1e3:.1f} | "
            f"{r['sync_iter_s'] * 1e3:.1f} | {r['async_iter_s'] * 1e3:.1f} | "
            f"{r['speedup']:.2f}x | {r['ideal_speedup']:.2f}x | "
            f"{100 * r['share_of_ideal']:.0f}% |\n"
        )
    return md


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, print only")
    args = ap.parse_args()
    if args.quick:
        args.iterations, args.repeats = 3, 1
    t0 = time.perf_counter()
    res: dict[str, Any] = harness.stamp("Sampling overlapped with the learner", "async_overlap")
    res["rows"] = [
        measure(make(args.quick), args.iterations, args.repeats)
        for make in (host_setting, devices_setting)
    ]
    res["iterations"], res["repeats"] = args.iterations, args.repeats
    res["wall_s"] = time.perf_counter() - t0
    out = None if args.quick else harness.RESULTS_DIR
    harness.finish(res, markdown(res), "async_overlap", out)


if __name__ == "__main__":
    main()
