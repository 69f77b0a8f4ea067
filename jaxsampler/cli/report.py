"""What ``jaxsampler bench`` and ``jaxsampler envs`` print: the results table, the legend that
says what its numbers mean, the machine-load line, and the list of env ids and suite prefixes.
Plain functions of plain data (no JAX), so the text can be tested without measuring."""

from __future__ import annotations

import importlib.util
import os
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "GYM_MAX_STEPS",
    "GYM_MAX_WIDTH",
    "envs_listing",
    "gym_steps",
    "legend",
    "load_info",
    "load_line",
    "table",
]

#: The widest ``SyncVectorEnv`` the bench times (a Python loop: wider ones take minutes).
GYM_MAX_WIDTH = 256
#: The most env steps (width x steps) of one timed ``SyncVectorEnv`` call.
GYM_MAX_STEPS = 8192

#: An example id per ``"<prefix>:"`` (a prefix not listed gets ``<prefix>:<id>``).
SUITE_EXAMPLES = {
    "gymnax": "Breakout-MinAtar",
    "brax": "inverted_pendulum",
    "jumanji": "Game2048-v1",
    "pgx": "tic_tac_toe",
    "jaxmarl": "MPE_simple_spread_v3",
    "gym": "CartPole-v1",
}
#: The import name of a prefix's package where it is not the prefix itself.
SUITE_PACKAGES = {"gym": "gymnasium"}


def gym_steps(num_envs: int, rollout_length: int) -> int:
    """Steps per timed ``SyncVectorEnv`` call at ``num_envs`` (0: that width is not timed):
    ``rollout_length``, cut so that one call makes at most :data:`GYM_MAX_STEPS` env steps."""
    if num_envs > GYM_MAX_WIDTH:
        return 0
    return max(1, min(rollout_length, GYM_MAX_STEPS // num_envs))


def load_info() -> dict[str, Any]:
    """The load averages (``None`` where the OS has none) against the machine's cores;
    ``busy``: the 1-minute load exceeds half the cores."""
    cores = os.cpu_count() or 1
    try:
        one, five, fifteen = os.getloadavg()
    except (AttributeError, OSError):  # pragma: no cover - Windows
        return {"loadavg": None, "cpu_count": cores, "busy": False}
    return {"loadavg": [one, five, fifteen], "cpu_count": cores, "busy": one > cores / 2}


def load_line(info: Mapping[str, Any]) -> str:
    """One paragraph: how loaded the machine was, and what that means for the numbers."""
    if info["loadavg"] is None:  # pragma: no cover - Windows
        return "machine load: unknown on this OS."
    one, five, _ = info["loadavg"]
    head = (
        f"machine load before the run: {one:.2f} (1-minute average; 5-minute {five:.2f}) "
        f"on {info['cpu_count']} cores."
    )
    if info["busy"]:
        text = (
            f"{head} WARNING: more than half the cores were busy with other work, so the "
            "absolute rates above are low (several times below an idle machine's); trust the "
            "'vs' ratios, whose loops were timed in turn under the same load. Rows split over "
            "several devices suffer most (they need several free cores at once), and a heavy "
            "load makes the ratios noisy too: raise --repeats for steadier ones."
        )
    else:
        text = f"{head} Quiet enough for the absolute rates to mean something."
    return textwrap.fill(text, 96)


def _ratio(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The results table; the ``vs`` columns appear when some row has the ratio."""
    hand = any(r.get("vs_hand_written") is not None for r in rows)
    gym = any(r.get("vs_sync_vector_env") is not None for r in rows)
    head = (
        f"{'width':>7} {'devices':>7} {'actions/s':>12} {'env steps/s':>12} "
        f"{'compile s':>10} {'steps/call':>11}"
    )
    head += f" {'vs hand-written':>16}" if hand else ""
    head += f" {'vs SyncVectorEnv':>17}" if gym else ""
    lines = [head, "-" * len(head)]
    for r in rows:
        line = (
            f"{r['num_envs']:>7} {r['num_devices']:>7} {r['actions_per_s']:>12,.0f} "
            f"{r['env_steps_per_s']:>12,.0f} {r['compile_s']:>10.2f} "
            f"{r['num_envs'] * r['rollout_length']:>11,}"
        )
        line += f" {_ratio(r.get('vs_hand_written')):>16}" if hand else ""
        line += f" {_ratio(r.get('vs_sync_vector_env')):>17}" if gym else ""
        lines.append(line)
    return "\n".join(lines)


def legend(
    rows: Sequence[Mapping[str, Any]],
    repeats: int,
    hand_note: str | None,
    gym_note: str | None,
) -> str:
    """The paragraph under the table: the units, then each baseline (or why it did not run:
    ``hand_note`` / ``gym_note``, ``None`` when it ran)."""
    acting = [r["acting_fraction"] for r in rows]
    lo, hi = (f"{min(acting):.0%}", f"{max(acting):.0%}") if acting else ("", "")
    share = (
        f": here actions are {lo if lo == hi else f'{lo}-{hi}'} of env steps x agents"
        if acting
        else ""
    )
    parts = [
        "actions/s: agent actions taken per second, counted over all envs: env steps x "
        "agents that acted, so the reset steps (the step after an episode ends, where the env "
        f"restarts and nobody acts) do not count{share}. env steps/s: envs x steps per call / "
        "seconds per call, reset steps included. compile s: the first call (tracing, XLA "
        f"compilation and one run), outside the rates. Rates are medians of {repeats} timed "
        "calls; devices: the CPU devices the env axis was split over (--devices).",
    ]
    if hand_note is None:
        parts.append(
            "vs hand-written: the same rollout written by hand, as a gymnax / PureJaxRL user "
            "would (jax.vmap of the env's reset and step, lax.scan, the same policy params, "
            "random keys and T, on one device; it produces the same trajectory): its seconds "
            "per call / jaxsampler's, the two timed in turn (1.00 = same speed, above 1 = "
            "jaxsampler faster)."
        )
    else:
        parts.append(f"vs hand-written: not run ({hand_note}).")
    if gym_note is None:
        parts.append(
            "vs SyncVectorEnv: jaxsampler's actions/s / those of Gymnasium's SyncVectorEnv of "
            "the same env id (a Python loop, the same MLP weights in numpy, its own random "
            f"stream), timed in turn, at widths up to {GYM_MAX_WIDTH} and at most "
            f"{GYM_MAX_STEPS:,} env steps per call (fewer steps at large widths; '-': too wide "
            "to time in a short run)."
        )
    else:
        parts.append(f"vs SyncVectorEnv: not run ({gym_note}).")
    return "\n".join(textwrap.fill(p, 96) for p in parts)


def envs_listing(
    builtin: Iterable[str], prefixes: Iterable[str], jax_prefixes: Iterable[str]
) -> str:
    """The text of ``jaxsampler envs``: the built-in ids, then every ``"<prefix>:"`` with
    whether its package is installed and an example id. ``jax_prefixes``: those that give
    pure-JAX envs (the others are host-stepped)."""
    jax_kinds = set(jax_prefixes)
    lines = ["Built-in env ids (pure JAX; jaxsampler bench --env ID, jaxsampler check ID):"]
    lines += [f"  {i}" for i in builtin]
    lines += ["", 'Suite prefixes ("<prefix>:<id>"; the id is the suite\'s own name):']
    for p in prefixes:
        package = SUITE_PACKAGES.get(p, p)
        installed = importlib.util.find_spec(package) is not None
        state = "installed" if installed else "not installed"
        example = f"{p}:{SUITE_EXAMPLES.get(p, '<id>')}"
        if p in jax_kinds:
            note = "" if installed else f'pip install -e ".[{p}]"'
        else:
            note = "host-stepped Gymnasium envs: js.Sampler only, not bench/check"
        lines.append(f"  {p + ':':<9} {package:<10} {state:<13} e.g. {example:<28} {note}".rstrip())
    return "\n".join(lines)
