"""The ``jaxsampler`` command: how fast jaxsampler samples on this machine, env checks, env ids.

``jaxsampler bench`` (the default) times jaxsampler's jitted rollout of a built-in env
(CartPole-v1) with a 64x64 tanh MLP policy across vector widths, next to the same rollout
written by hand (``jax.vmap`` + ``lax.scan``, :mod:`jaxsampler.cli.baseline`) and, where
Gymnasium knows the env, Gymnasium's ``SyncVectorEnv``; it prints a table with the ratios,
a legend of its units and how loaded the machine was. Progress goes to stderr: a bar
(calls done, rate, ETA) on a terminal, plain lines otherwise, nothing with ``--quiet``;
the table goes to stdout.
``jaxsampler check ENV`` runs :func:`jaxsampler.check_env` on an env id and, when the env
can render, writes the first frame after a reset as a PNG and prints its path.
``jaxsampler envs`` lists the built-in env ids and the suite prefixes.

Every bad argument ends in one line on stderr, ``jaxsampler: error: ...``, and exit status 2.

On CPU, ``bench`` uses one XLA device per core by default (``--devices auto``) and
splits the env axis across them whenever the width is divisible; JAX reads that
setting when its backend starts, so it is applied before any computation.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from jaxsampler.cli import args as types

DEFAULT_WIDTHS = "1,64,1024,4096"
COMMANDS = ("bench", "check", "envs")
DESCRIPTION = (
    "Measures how fast jaxsampler samples RL experience on this machine: 'jaxsampler bench' "
    "(the default) times its jitted rollout across vector widths next to the same rollout "
    "written by hand and Gymnasium's SyncVectorEnv. 'jaxsampler check ENV' validates an env, "
    "'jaxsampler envs' lists the env ids."
)
EPILOG = """examples:
  jaxsampler bench                                # CartPole-v1, widths 1,64,1024,4096
  jaxsampler bench --widths 1,64 --repeats 3 --json results.json
  jaxsampler bench --env Pendulum-v1 --policy random --no-baseline
  jaxsampler check gymnax:Breakout-MinAtar
  jaxsampler envs"""

Error = Callable[[str], NoReturn]
#: The longest env error quoted from a suite (its id lists run to hundreds of characters).
_MAX_MESSAGE = 240


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


def _configure_devices(devices: str) -> None:
    """Asks XLA for one CPU device per core (``auto``) or N devices, unless already set."""
    if devices == "1" or "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return
    n = _cores() if devices == "auto" else int(devices)
    if n > 1:
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


def _parsers() -> tuple[types.OneLineParser, dict[str, types.OneLineParser]]:
    p = types.OneLineParser(
        prog="jaxsampler",
        description=textwrap.fill(DESCRIPTION, 80),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", metavar="{bench,check,envs}")
    b = sub.add_parser(
        "bench",
        help="time jaxsampler's rollout across vector widths next to a hand-written loop and "
        "Gymnasium (the default command)",
        description="Times jaxsampler's jitted rollout of one env and policy at each vector "
        "width, next to the same rollout written by hand (jax.vmap + lax.scan) and, where "
        "Gymnasium knows the env, its SyncVectorEnv; prints actions/s, env steps/s, compile "
        "time and the speed ratios, with what each means and how loaded the machine was.",
    )
    b.add_argument(
        "--env",
        default="CartPole-v1",
        help="env id: a built-in id or '<suite>:<id>' (see 'jaxsampler envs'; default CartPole-v1)",
    )
    b.add_argument(
        "--widths",
        type=types.widths,
        default=DEFAULT_WIDTHS,
        help=f"vector widths (number of envs), comma-separated (default {DEFAULT_WIDTHS})",
    )
    b.add_argument(
        "--rollout-length",
        type=types.positive_int,
        default=128,
        metavar="T",
        help="steps per rollout call, >= 1 (default 128)",
    )
    b.add_argument(
        "--repeats",
        type=types.positive_int,
        default=5,
        help="timed calls per width, >= 1; the median is reported (default 5)",
    )
    b.add_argument(
        "--policy",
        choices=["mlp", "random"],
        default="mlp",
        help="a tanh actor-critic MLP or uniform random actions (default mlp)",
    )
    b.add_argument(
        "--hidden",
        type=types.hidden_sizes,
        default="64,64",
        help="the MLP's hidden layer sizes, comma-separated (default 64,64)",
    )
    b.add_argument(
        "--devices",
        type=types.devices,
        default="auto",
        help="CPU devices to split the env axis over: 'auto' (one per core) or an integer "
        ">= 1 (default auto)",
    )
    b.add_argument(
        "--seed",
        type=types.seed,
        default=0,
        help=f"PRNG seed of the policy params and the envs, 0..{types.MAX_SEED} (default 0)",
    )
    b.add_argument(
        "--no-baseline",
        action="store_true",
        help="time jaxsampler alone (no hand-written loop, no Gymnasium)",
    )
    b.add_argument(
        "--no-gymnasium",
        action="store_true",
        help="skip Gymnasium's SyncVectorEnv (keep the hand-written loop)",
    )
    b.add_argument(
        "--json",
        metavar="PATH",
        help="also write the results as JSON to PATH ('-' for stdout; default: none)",
    )
    b.add_argument(
        "--quiet",
        action="store_true",
        help="no progress on stderr (only the table); the bar is off anyway when stderr "
        "is not a terminal or CI / JAXSAMPLER_QUIET is set (plain lines instead)",
    )
    c = sub.add_parser(
        "check",
        help="validate an env with jaxsampler.check_env and save its first rendered frame",
        description="Runs jaxsampler.check_env on an env (spaces, dtypes, reset/step "
        "structure, episode ends) and prints the report; when the env can render, writes the "
        "first frame after a reset as a PNG. Exit status 0: no problem found, 1: problems.",
    )
    c.add_argument("env", help="env id: a built-in id or '<suite>:<id>' (see 'jaxsampler envs')")
    frames = c.add_mutually_exclusive_group()
    frames.add_argument(
        "--frame",
        metavar="PATH",
        help="where to write the first rendered frame (.png; default: "
        "<tmp>/jaxsampler-check-<env>.png)",
    )
    frames.add_argument("--no-frame", action="store_true", help="do not render a frame")
    sub.add_parser(
        "envs",
        help="list the built-in env ids and the suite prefixes ('gymnax:', 'brax:', ...)",
        description="Lists the built-in env ids, then each suite prefix with whether its "
        "package is installed and an example id.",
    )
    subs = dict(sub.choices)
    for s in subs.values():
        s.command = "jaxsampler"
    return p, subs


def _env_error(env_id: str, e: Exception) -> str:
    """One line about an env id :func:`make_jax_env` refused."""
    from jaxsampler.envs.registry import KINDS, SUITES, registered_ids

    pointer = "'jaxsampler envs' lists the ids and suite prefixes"
    prefix, sep, _ = env_id.partition(":")
    if isinstance(e, ValueError) and not (sep and (prefix in SUITES or prefix in KINDS)):
        ids = registered_ids()
        by_lower = {i.lower(): i for i in ids}
        close = difflib.get_close_matches(env_id.lower(), list(by_lower), n=3)
        hint = f"; did you mean {', '.join(repr(by_lower[c]) for c in close)}?" if close else ""
        return f"unknown env id {env_id!r}{hint} ({pointer})"
    text = str(e) if isinstance(e, (ValueError, TypeError, ImportError)) else repr(e)
    text = " ".join(text.split())
    if len(text) > _MAX_MESSAGE:  # a suite's whole id list
        text = text[: _MAX_MESSAGE - 5].rsplit(",", 1)[0] + ", ..."
    if repr(env_id) not in text:
        text = f"env {env_id!r}: {text}"
    return f"{text} ({pointer})"


def _make_env(env_id: str, error: Error) -> Any:
    """The pure-JAX env ``env_id`` names, or a one-line error (exit 2)."""
    from jaxsampler.envs.registry import make_jax_env

    try:
        return make_jax_env(env_id)
    except Exception as e:  # a suite's own errors too: this is the command's boundary
        error(_env_error(env_id, e))


def _check_json_path(path: str | None, error: Error) -> None:
    if path is None or path == "-":
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        error(f"argument --json: {path!r} is a folder; give a file path")
    if not os.path.isdir(folder):
        error(f"argument --json: the folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK):
        error(f"argument --json: cannot write in {folder!r}")


def _gym_plan(env: Any, env_id: str, args: argparse.Namespace) -> tuple[str | None, str | None]:
    """``(Gymnasium id, None)`` when SyncVectorEnv is timed, else ``(None, why not)``."""
    from jaxsampler.cli.baseline import gym_id, hand_unsupported
    from jaxsampler.cli.report import GYM_MAX_WIDTH

    if args.no_baseline or args.no_gymnasium:
        return None, "--no-baseline" if args.no_baseline else "--no-gymnasium"
    name, why = gym_id(env_id)
    if name is None:
        return None, why
    why_not = hand_unsupported(env, args.policy)
    if why_not is not None:
        return None, why_not
    import gymnasium

    probe = gymnasium.make(name)
    shape = probe.observation_space.shape
    probe.close()
    if shape != env.observation_space.shape or env.num_agents != 1:
        return None, f"Gymnasium's {name} has other observations ({shape})"
    if min(args.widths) > GYM_MAX_WIDTH:
        return None, f"every width is above {GYM_MAX_WIDTH}, too wide for a Python loop"
    return name, None


def _bench(args: argparse.Namespace, error: Error) -> int:
    _configure_devices(args.devices)
    _check_json_path(args.json, error)
    from jaxsampler.cli import bench, report
    from jaxsampler.cli.baseline import hand_unsupported

    load = report.load_info()  # before this run adds its own load
    env = _make_env(args.env, error)
    import jax

    from jaxsampler.integrations.progress import progress

    hand_note = "--no-baseline" if args.no_baseline else hand_unsupported(env, args.policy)
    gym_name, gym_note = _gym_plan(env, args.env, args)
    ndev = jax.device_count()
    info = bench.environment_info()
    with progress(
        len(args.widths) * (args.repeats + 1),
        desc="bench",
        unit="call",
        quiet=True if args.quiet else None,
    ) as bar:

        def say(msg: str) -> None:
            if args.quiet:
                return
            if bar.quiet:
                print(msg, file=sys.stderr, flush=True)
            else:
                bar.write(msg)

        say(
            f"jaxsampler bench: {args.env}, {args.policy} policy "
            f"{args.hidden if args.policy == 'mlp' else ''}, "
            f"T={args.rollout_length}, backend {info['backend']} x{ndev} device(s)"
        )
        rows = []
        for i, w in enumerate(args.widths):
            n = ndev if ndev > 1 and w % ndev == 0 else 1
            say(
                f"[{i + 1}/{len(args.widths)}] width {w} on {n} device(s): compiling and timing ..."
            )
            bar.update(0, width=w)
            row = bench.compare_rollout(
                args.env,
                w,
                args.rollout_length,
                policy=args.policy,
                hidden_sizes=args.hidden,
                repeats=args.repeats,
                seed=args.seed,
                num_devices=n,
                hand_written=hand_note is None,
                gym_id=gym_name,
                gym_steps=report.gym_steps(w, args.rollout_length),
                on_call=lambda: bar.update(1),
            )
            say("      " + _summary(row))
            rows.append(row)
    print(report.table(rows))
    print()
    print(report.legend(rows, args.repeats, hand_note, gym_note))
    print(report.load_line(load))
    if args.json:
        payload = json.dumps(
            {
                "results": rows,
                "environment": info,
                "load": load,
                "baselines": {
                    "hand_written": hand_note or "ran",
                    "sync_vector_env": gym_note or "ran",
                },
                "argv": sys.argv[1:],
            },
            indent=2,
        )
        if args.json == "-":
            print(payload)
        else:
            with open(args.json, "w") as f:
                f.write(payload + "\n")
            if not args.quiet:
                print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _summary(row: dict[str, Any]) -> str:
    text = f"{row['actions_per_s']:,.0f} actions/s (compile {row['compile_s']:.2f} s)"
    if row["vs_hand_written"] is not None:
        text += f"; hand-written {row['hand_actions_per_s']:,.0f} ({row['vs_hand_written']:.2f}x)"
    if row["vs_sync_vector_env"] is not None:
        text += (
            f"; SyncVectorEnv {row['gym_actions_per_s']:,.0f} "
            f"(T={row['gym_steps_per_call']}, {row['vs_sync_vector_env']:.1f}x)"
        )
    return text


def _default_frame_path(env_id: str) -> str:
    import re
    import tempfile

    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", env_id)
    return os.path.join(tempfile.gettempdir(), f"jaxsampler-check-{safe}.png")


def _check(args: argparse.Namespace, error: Error) -> int:
    import jaxsampler as js
    from jaxsampler.integrations import video
    from jaxsampler.rollout.check import first_frame

    env = _make_env(args.env, error)
    frame_path = None
    if not args.no_frame and video.can_render(env):
        frame_path = args.frame or _default_frame_path(args.env)
        try:  # a bad --frame fails before the check runs
            video.check_output_path(frame_path, {".png"})
        except (OSError, ValueError) as e:
            error(f"argument --frame: {e}")
    report = js.check_env(env)
    print(report)
    if frame_path is not None and report.ok:
        frame = first_frame(env)
        assert frame is not None
        try:
            written = video.save_frame(frame_path, frame)
        except ImportError:
            print(
                f"first frame: not written ({frame.shape[1]}x{frame.shape[0]}): PNG files need "
                'imageio: pip install -e ".[video]"'
            )
        else:
            print(f"first frame: {written}")
    return 0 if report.ok else 1


def _envs() -> int:
    import jaxsampler.host_envs  # noqa: F401  (adds the "gym:" kind)
    from jaxsampler.cli.report import envs_listing
    from jaxsampler.envs.registry import KINDS, SUITES, registered_ids

    print(envs_listing(registered_ids(), [*SUITES, *KINDS], SUITES))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``jaxsampler`` command: ``bench`` (also with no subcommand, or options
    only), ``check ENV`` or ``envs``.

    Args:
        argv: the arguments after the program name (``None``: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 on success, 1 when ``check`` finds problems, 130 on Ctrl-C.
        Bad input (a bad option value, an unknown env id, an unusable ``--json`` or
        ``--frame`` path) prints one line, ``jaxsampler: error: ...``, and exits with
        status 2 through ``SystemExit``.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, subs = _parsers()
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        close = difflib.get_close_matches(argv[0], COMMANDS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        parser.error(f"unknown command {argv[0]!r}{hint} (commands: {', '.join(COMMANDS)})")
    if not argv or argv[0] not in (*COMMANDS, "-h", "--help"):
        argv = ["bench", *argv]  # bare `jaxsampler [options]`: bench
    args = parser.parse_args(argv)
    try:
        if args.command == "bench":
            return _bench(args, subs["bench"].error)
        if args.command == "check":
            return _check(args, subs["check"].error)
        return _envs()
    except KeyboardInterrupt:
        print("jaxsampler: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
