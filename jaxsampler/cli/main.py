"""The ``jaxsampler`` command.

``jaxsampler bench`` (the default) samples a built-in env (CartPole-v1) with a 64x64 tanh
MLP policy across vector widths and prints actions/s, compile time and steps per width.
Progress goes to stderr: a bar (calls done, rate, ETA) on a terminal, plain lines
otherwise, nothing with ``--quiet``; the table goes to stdout.
``jaxsampler check ENV`` runs :func:`jaxsampler.check_env` on an env id and, when the env
can render, writes the first frame after a reset as a PNG and prints its path.
``jaxsampler envs`` lists the registered env ids.

On CPU, ``bench`` uses one XLA device per core by default (``--devices auto``) and
splits the env axis across them whenever the width is divisible; JAX reads that
setting when its backend starts, so it is applied before any computation.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

DEFAULT_WIDTHS = "1,64,1024,4096"


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


def _widths(text: str) -> list[int]:
    try:
        widths = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"widths must be comma-separated integers, got {text!r}"
        ) from None
    if not widths or any(w < 1 for w in widths):
        raise argparse.ArgumentTypeError(f"widths must be integers >= 1, got {text!r}")
    return widths


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jaxsampler", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command")
    b = sub.add_parser(
        "bench", help="throughput of the jitted rollout across vector widths (default)"
    )
    b.add_argument(
        "--env", default="CartPole-v1", help="env id (default CartPole-v1; 'gymnax:<id>' works)"
    )
    b.add_argument(
        "--widths",
        type=_widths,
        default=_widths(DEFAULT_WIDTHS),
        help=f"comma-separated (default {DEFAULT_WIDTHS})",
    )
    b.add_argument(
        "--rollout-length", type=int, default=128, help="steps per rollout call (default 128)"
    )
    b.add_argument(
        "--repeats", type=int, default=5, help="timed calls per width; the median is reported"
    )
    b.add_argument("--policy", choices=["mlp", "random"], default="mlp")
    b.add_argument("--hidden", default="64,64", help="MLP hidden sizes (default 64,64)")
    b.add_argument(
        "--devices", default="auto", help="'auto' (one CPU device per core), or a number"
    )
    b.add_argument("--seed", type=int, default=0)
    b.add_argument(
        "--json", metavar="PATH", help="also write the results as JSON to PATH ('-' for stdout)"
    )
    b.add_argument(
        "--quiet",
        action="store_true",
        help="no progress on stderr (only the table); the bar is off anyway when stderr "
        "is not a terminal or CI / JAXSAMPLER_QUIET is set (plain lines instead)",
    )
    c = sub.add_parser("check", help="validate an env with jaxsampler.check_env")
    c.add_argument("env", help="env id")
    c.add_argument(
        "--frame",
        metavar="PATH",
        help="where to write the first rendered frame (.png; default: "
        "<tmp>/jaxsampler-check-<env>.png)",
    )
    c.add_argument("--no-frame", action="store_true", help="do not render a frame")
    sub.add_parser("envs", help="list registered env ids")
    return p


def _table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'width':>7} {'devices':>7} {'actions/s':>12} {'env steps/s':>12} "
        f"{'compile s':>10} {'steps/call':>11}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['num_envs']:>7} {r['num_devices']:>7} {r['actions_per_s']:>12,.0f} "
            f"{r['env_steps_per_s']:>12,.0f} {r['compile_s']:>10.2f} "
            f"{r['num_envs'] * r['rollout_length']:>11,}"
        )
    return "\n".join(lines)


def _bench(args: argparse.Namespace) -> int:
    _configure_devices(args.devices)
    import jax

    from jaxsampler.cli import bench
    from jaxsampler.envs.registry import make_jax_env
    from jaxsampler.integrations.progress import progress

    if args.rollout_length < 1 or args.repeats < 1:
        print("error: --rollout-length and --repeats must be >= 1", file=sys.stderr)
        return 2
    try:
        make_jax_env(args.env)  # fail before any timing: unknown ids, host-stepped envs
    except (TypeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    hidden = tuple(int(h) for h in args.hidden.split(","))
    ndev = jax.device_count()
    info = bench.environment_info()
    # a bar on a terminal (messages above it); plain lines otherwise; --quiet: neither
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
            f"{hidden if args.policy == 'mlp' else ''}, "
            f"T={args.rollout_length}, backend {info['backend']} x{ndev} device(s)"
        )
        rows = []
        for i, w in enumerate(args.widths):
            n = ndev if ndev > 1 and w % ndev == 0 else 1
            say(
                f"[{i + 1}/{len(args.widths)}] width {w} on {n} device(s): compiling and timing ..."
            )
            bar.update(0, width=w)
            row = bench.measure_rollout(
                args.env,
                w,
                args.rollout_length,
                policy=args.policy,
                hidden_sizes=hidden,
                repeats=args.repeats,
                seed=args.seed,
                num_devices=n,
                on_call=lambda: bar.update(1),
            )
            say(f"      {row['actions_per_s']:,.0f} actions/s (compile {row['compile_s']:.2f} s)")
            rows.append(row)
    print(_table(rows))
    if args.json:
        payload = json.dumps({"results": rows, "environment": info, "argv": sys.argv[1:]}, indent=2)
        if args.json == "-":
            print(payload)
        else:
            with open(args.json, "w") as f:
                f.write(payload + "\n")
            if not args.quiet:
                print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _default_frame_path(env_id: str) -> str:
    import re
    import tempfile

    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", env_id)
    return os.path.join(tempfile.gettempdir(), f"jaxsampler-check-{safe}.png")


def _check(args: argparse.Namespace) -> int:
    import jaxsampler as js
    from jaxsampler.envs.registry import make_jax_env
    from jaxsampler.integrations import video
    from jaxsampler.rollout.check import first_frame

    try:
        env = make_jax_env(args.env)
    except (TypeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    frame_path = None
    if not args.no_frame and video.can_render(env):
        frame_path = args.frame or _default_frame_path(args.env)
        try:  # a bad --frame fails before the check runs
            video.check_output_path(frame_path, {".png"})
        except (OSError, ValueError) as e:
            print(f"error: --frame: {e}", file=sys.stderr)
            return 2
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


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``jaxsampler`` command: ``bench`` (also with no subcommand), ``check ENV``
    or ``envs``.

    Args:
        argv: the arguments after the program name (``None``: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 on success, 1 when ``check`` finds problems, 2 for bad input
        (an unknown env id, a bad option value or ``--frame`` path). Arguments argparse
        rejects exit with status 2 through ``SystemExit``.
    """
    args = _parser().parse_args(argv)
    if args.command in (None, "bench"):
        if args.command is None:  # bare `jaxsampler`: bench with defaults
            args = _parser().parse_args(["bench", *(argv or [])])
        return _bench(args)
    if args.command == "envs":
        from jaxsampler.envs.registry import registered_ids

        print("\n".join(registered_ids() + ["gymnax:<id>  (any gymnax env)"]))
        return 0
    if args.command == "check":
        return _check(args)
    return 2  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
