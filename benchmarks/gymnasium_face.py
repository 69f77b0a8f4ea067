"""Env steps/s of ``js.to_gymnasium(..., num_envs=N)`` beside Gymnasium's own vector envs.

CartPole-v1 at ``N`` = 1, 16, 256, 1024 (``--sizes``), random actions, each side stepped
through its public ``step`` in rounds (the sides' order rotated each round; a round is as
many steps as fit in ``--round-s``); figures are medians over ``--rounds`` of env steps per
second (``N`` x vector steps / s, reset steps included), ratios the median of per-round ratios
(:func:`benchmarks.harness.paired_ratio`), so load that hits a whole round cancels.

Sides:

* ``face``: ``js.to_gymnasium("CartPole-v1", num_envs=N)`` (``NEXT_STEP`` auto-reset): one
  jitted call for the ``N`` envs, actions checked on the host, one device-to-host transfer,
  numpy outputs;
* ``floor``: the face's own jitted kernel (``integrations.gymnasium.kernels.step_next``) called
  on device-resident actions and blocked on, no host conversion: what the face costs
  above the bare jitted, vmapped step;
* ``sync``: ``gymnasium.vector.SyncVectorEnv`` of ``gymnasium.make("CartPole-v1")`` (Gymnasium's
  NumPy CartPole, one Python ``step`` per env);
* ``gym-vector``: ``gymnasium.make_vec("CartPole-v1", N, vectorization_mode="vector_entry_point")``
  (Gymnasium's own NumPy-vectorized ``CartPoleVectorEnv``);
* ``envpool``: ``envpool.make_gymnasium("CartPole-v1", num_envs=N)`` (C++ envs on a thread
  pool), where ``pip install envpool`` works.

    python -m benchmarks.gymnasium_face           # writes results/gymnasium_face.json/.md
    python -m benchmarks.gymnasium_face --quick   # smoke test, prints only
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks import harness

SIZES = harness.Sizes(
    full={"sizes": [1, 16, 256, 1024], "rounds": 7, "round_s": 0.3},
    quick={"sizes": [1, 16], "rounds": 2, "round_s": 0.05},
)
SIDES = ("face", "floor", "sync", "gym-vector", "envpool")


def _face(n: int) -> Callable[[np.ndarray], Any]:
    import jaxsampler as js

    envs = js.to_gymnasium("CartPole-v1", num_envs=n)
    envs.reset(seed=0)
    return envs.step


def _floor(n: int) -> Callable[[np.ndarray], Any]:
    import jax

    import jaxsampler as js
    from jaxsampler.integrations.gymnasium import kernels

    env = js.make("CartPole-v1")
    params = jax.device_put(env.default_params)
    chains = kernels.seed_chains(np.arange(n, dtype=np.uint64))
    chains, state, _ = kernels.reset_all(env, chains, params)
    carry = [chains, state, jax.numpy.zeros(n, bool)]

    def step(actions: Any) -> Any:
        chains, state, ts = kernels.step_next(env, carry[0], carry[1], actions, carry[2], params)
        carry[:] = chains, state, ts.terminated[:, 0] | ts.truncated[:, 0]
        return jax.block_until_ready(ts)

    return step


def _sync(n: int) -> Callable[[np.ndarray], Any]:
    import gymnasium

    envs = gymnasium.vector.SyncVectorEnv([lambda: gymnasium.make("CartPole-v1")] * n)
    envs.reset(seed=0)
    return envs.step


def _gym_vector(n: int) -> Callable[[np.ndarray], Any]:
    import gymnasium

    envs = gymnasium.make_vec("CartPole-v1", n, vectorization_mode="vector_entry_point")
    envs.reset(seed=0)
    return envs.step


def _envpool(n: int) -> Callable[[np.ndarray], Any] | None:
    try:
        import envpool
    except ImportError:
        return None
    envs = envpool.make_gymnasium("CartPole-v1", num_envs=n, seed=0)
    envs.reset()
    return envs.step


MAKERS = {
    "face": _face,
    "floor": _floor,
    "sync": _sync,
    "gym-vector": _gym_vector,
    "envpool": _envpool,
}


def _actions(side: str, n: int, count: int, rng: np.random.Generator) -> list[Any]:
    acts = rng.integers(0, 2, (count, n))
    if side == "floor":
        import jax

        return [jax.device_put(a.astype(np.int32)[:, None]) for a in acts]
    return [a.astype(np.int32) if side == "envpool" else a for a in acts]


def measure(n: int, rounds: int, round_s: float) -> dict[str, Any]:
    """Every side at ``N = n``: per-round env steps/s, their medians, and the paired ratios."""
    rng = np.random.default_rng(n)
    steps, per_step = {}, {}
    for side in SIDES:
        step = MAKERS[side](n)
        if step is None:
            harness.log(f"N={n}: {side} not installed, left out")
            continue
        warm = _actions(side, n, 20, rng)
        t0 = time.perf_counter()
        for a in warm:
            step(a)
        steps[side] = step
        per_step[side] = (time.perf_counter() - t0) / len(warm)
    rates: dict[str, list[float]] = {side: [] for side in steps}
    for r in range(rounds):
        for side in harness.rotated(list(steps), r):
            count = max(5, int(round_s / max(per_step[side], 1e-7)))
            acts = _actions(side, n, count, rng)
            t0 = time.perf_counter()
            for a in acts:
                steps[side](a)
            rates[side].append(n * count / (time.perf_counter() - t0))
    out: dict[str, Any] = {"num_envs": n, "steps_per_s": {}, "ratios": {}}
    for side, values in rates.items():
        out["steps_per_s"][side] = harness.median_min_max(values)
    for a, b in [("face", "sync"), ("face", "gym-vector"), ("face", "envpool"), ("face", "floor")]:
        if a in rates and b in rates:
            out["ratios"][f"{a}/{b}"] = harness.paired_ratio(rates[a], rates[b])
    harness.log(
        f"N={n}: "
        + ", ".join(f"{s} {harness.si(statistics.median(v))}/s" for s, v in rates.items())
    )
    return out


def markdown(res: dict[str, Any]) -> str:
    """The tables of a result."""
    sides = [s for s in SIDES if any(s in r["steps_per_s"] for r in res["rows"])]
    head = "| N | " + " | ".join(f"{s} steps/s" for s in sides)
    ratios = ["face/sync", "face/gym-vector", "face/envpool", "face/floor"]
    lines = [
        "# Gymnasium face: env steps/s beside Gymnasium's vector envs and EnvPool "
        "(benchmarks/gymnasium_face.py)",
        "",
        f"{res['date']} · commit {res['git'].get('commit', '?')[:10]} · `{res['command']}` · "
        f"{res['env']['cpu_count']} cores, load {res['load_before']:.1f} before / "
        f"{res['load_after']:.1f} after · medians of {res['rounds']} rounds",
        "",
        "CartPole-v1, random actions, each side through its public `step` (env steps/s = N x "
        "vector steps/s). `floor` is the face's jitted kernel on device-resident actions (no "
        "host work). Ratios: medians of per-round ratios (> 1: the face is faster).",
        "",
        head + " | " + " | ".join(ratios) + " |",
        "|---:|" + "---:|" * (len(sides) + len(ratios)),
    ]
    for row in res["rows"]:
        rate = [
            harness.si(row["steps_per_s"][s]["median"]) if s in row["steps_per_s"] else "—"
            for s in sides
        ]
        ratio = [harness.fmt(row["ratios"].get(k), ".2f") for k in ratios]
        lines.append(f"| {row['num_envs']} | " + " | ".join(rate + ratio) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=None)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--round-s", type=float, default=None)
    harness.add_quick_out(p, "gymnasium_face")
    args = SIZES.apply(p.parse_args(argv))
    from jaxsampler.cli.bench import environment_info

    res: dict[str, Any] = harness.stamp(
        "Gymnasium face against Gymnasium's vector envs", "gymnasium_face", argv
    )
    res["git"] = harness.git_state()
    res["env"] = environment_info()
    res["versions"] = harness.versions(["gymnasium", "envpool", "jax"])
    res["rounds"], res["round_s"] = args.rounds, args.round_s
    res["load_before"] = os.getloadavg()[0]
    res["rows"] = [measure(n, args.rounds, args.round_s) for n in args.sizes]
    res["load_after"] = os.getloadavg()[0]
    harness.finish(res, markdown(res), "gymnasium_face", harness.results_dir(args.out, args.quick))


if __name__ == "__main__":
    main()
