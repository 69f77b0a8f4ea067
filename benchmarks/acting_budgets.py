"""The acting-only critic's budgets, side by side: one budget against a choice of three.

In a turn-based rollout the policy's critic runs on the acting rows plus a budget of the
rows whose value is read (every agent of an env that resets: GAE bootstraps a truncated
agent from its final observation). Until the budgets were tiered the budget was fixed at
a quarter of the waiting rows; now each step takes the smallest of a sixteenth, an eighth
and a quarter that the needed rows fit (``jaxsampler.policies.rows.extra_budgets``). Three
sides run in interleaved rounds in one process, on the same pgx game, network and widths
as ``benchmarks/suites.py``:

* ``budgets``: jaxsampler as it is;
* ``one budget``: jaxsampler with ``jaxsampler/policies/rows.py`` as it was at the base
  commit (``--base``, default ``4f900ed``: one budget, a quarter), loaded with
  ``harness.module_at`` and patched into the policy while its rollout is built;
* ``hand-written``: ``benchmarks/suites.py``'s ``vmap`` + ``lax.scan`` loop of the game.

Per cell: each jaxsampler side's time per env step against the hand-written loop's
(hand-written seconds per call over jaxsampler's; both run E x T env steps), its
agent-steps/s ratio (that times the floor of next-step auto-reset, see
``benchmarks/suites.py``), and budgets over one budget, all medians over rounds of the
within-round ratios.

    python -m benchmarks.acting_budgets                 # full run, writes results/
    python -m benchmarks.acting_budgets --quick         # smoke run, prints
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Iterator, Sequence
from typing import Any

import jax

import jaxsampler as js
import jaxsampler.policies.mlp as mlp
from benchmarks import harness, suites
from jaxsampler.policies import MLPPolicy

GAMES = ("pgx", "pgx_connect_four")  # suites.SUITES keys
SIZES = harness.Sizes(
    full={"widths": [64, 512], "repeats": 9, "calls": 5, "rollout_length": 128},
    quick={"widths": [8], "repeats": 2, "calls": 1, "rollout_length": 8},
)


@contextlib.contextmanager
def rows_module(mod: Any) -> Iterator[None]:
    """The policy's ``rows_pass`` / ``extra_budgets`` taken from ``mod`` (the module at
    the base commit) while a rollout is built (it traces and compiles then)."""
    saved = mlp.rows_pass, mlp.extra_budgets
    budgets = getattr(mod, "extra_budgets", None) or (lambda *a: mod.extra_budget(*a))
    mlp.rows_pass, mlp.extra_budgets = mod.rows_pass, budgets
    try:
        yield
    finally:
        mlp.rows_pass, mlp.extra_budgets = saved


def measure(game: str, E: int, T: int, repeats: int, calls: int, base: Any) -> dict[str, Any]:
    """The three sides of one game at width ``E``, interleaved round by round."""
    suite = suites.SUITES[game]
    env = js.make(suite.env_id)
    policy = MLPPolicy(env.observation_space, env.action_space, (64, 64))
    params = policy.init(jax.random.PRNGKey(0))
    sides = {"budgets": suites.jaxsampler_side(env, policy, params, E, T, 0)}
    with rows_module(base):
        sides["one budget"] = suites.jaxsampler_side(env, policy, params, E, T, 0)
    sides["hand-written"] = suites.handwritten_side(suite, env, policy, params, E, T, 0)
    for side in sides.values():
        jax.block_until_ready(side.call())
    for r in range(repeats):
        for name in harness.alternated(list(sides), r):
            sides[name].round(calls)
    hand = sides["hand-written"].round_s
    row: dict[str, Any] = {"calls_per_round": calls}
    for name in ("budgets", "one budget"):
        s = sides[name]
        row[name] = {
            "per_env_step": harness.paired_ratio(hand, s.round_s),
            "ratio": harness.paired_ratio(s.round_rate, sides["hand-written"].round_rate),
            "median_s": statistics.median(s.round_s),
            "round_median_s": s.round_s,
        }
    row["hand-written"] = {"median_s": statistics.median(hand), "round_median_s": hand}
    row["budgets_over_one"] = harness.paired_ratio(
        sides["one budget"].round_s, sides["budgets"].round_s
    )
    harness.log(
        f"  {game} E={E}: per env step {row['budgets']['per_env_step']:.2f} (budgets) vs "
        f"{row['one budget']['per_env_step']:.2f} (one budget); budgets / one "
        f"{row['budgets_over_one']:.2f}"
    )
    return row


def markdown_table(results: dict[str, Any]) -> str:
    cfg = results["config"]
    md = f"# {results['benchmark']}\n\n"
    md += (
        f"{results['date']} · `{results['command']}` · T={cfg['rollout_length']} · "
        f"{cfg['repeats']} interleaved rounds of {cfg['calls']} calls · base "
        f"`{cfg['base']}` · wall {results['wall_s']:.0f} s\n\n"
        "| game | E | per env step, budgets | per env step, one budget | **budgets / one** "
        "| agent-steps/s ratio, budgets | ratio, one budget |\n"
        "|---|---:|---:|---:|---:|---:|---:|\n"
    )
    for game, by_width in results["games"].items():
        for E, row in by_width.items():
            b, o = row["budgets"], row["one budget"]
            md += (
                f"| `{suites.SUITES[game].env_id}` | {E} | {b['per_env_step']:.2f} "
                f"| {o['per_env_step']:.2f} | **{row['budgets_over_one']:.2f}** "
                f"| {b['ratio']:.2f} | {o['ratio']:.2f} |\n"
            )
    md += (
        "\nPer env step: the hand-written loop's seconds per call over the side's (1 = as "
        "fast as the loop per env step). Budgets / one: one budget's seconds per call over "
        "the budgets' (above 1: the budgets are faster). Agent-steps/s ratio: against the "
        "hand-written loop, as in `suites.md` (at most the floor of next-step auto-reset: "
        "0.88 for tic-tac-toe, 0.96 for connect-four). Medians over rounds of the "
        "within-round ratios; the sides run in turn in one process.\n"
    )
    return md


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--widths", type=int, nargs="+", help="env counts E (default 64 512)")
    p.add_argument("--repeats", type=int, help="interleaved rounds (default 9)")
    p.add_argument("--calls", type=int, help="calls per side per round (default 5)")
    p.add_argument("--rollout-length", type=int, help="T (default 128)")
    p.add_argument("--base", default="4f900ed", help="commit whose rows.py is one budget")
    harness.add_quick_out(p, "acting_budgets")
    args = SIZES.apply(p.parse_args(argv))
    base = harness.module_at(args.base, "jaxsampler/policies/rows.py", "rows_one_budget")
    if base is None:
        raise SystemExit(f"acting_budgets: no jaxsampler/policies/rows.py at {args.base}")
    t0 = time.perf_counter()
    games = {
        game: {
            str(E): measure(game, E, args.rollout_length, args.repeats, args.calls, base)
            for E in args.widths
        }
        for game in GAMES
    }
    results = {
        **harness.stamp(
            "Acting-only critic: one budget vs the smallest of three, against the "
            "hand-written loop",
            "acting_budgets",
            argv,
        ),
        "config": {
            "widths": args.widths,
            "repeats": args.repeats,
            "calls": args.calls,
            "rollout_length": args.rollout_length,
            "base": args.base,
            "policy": "MLPPolicy (64, 64) tanh actor-critic",
        },
        "games": games,
        "wall_s": time.perf_counter() - t0,
    }
    harness.finish(
        results,
        markdown_table(results),
        "acting_budgets",
        harness.results_dir(args.out, args.quick),
    )


if __name__ == "__main__":
    main()
