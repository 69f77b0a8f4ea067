"""A policy server that loses no answered step: a write-ahead journal, an offline log, and
recovery whenever it starts.

    python -m examples.durable_server --dir runs/serve --port 9900

Simulators connect with ``js.serving.PolicyClient("127.0.0.1:9900")``. The server keeps two
files in ``--dir``: ``steps.journal``, where the env writes every change before a client
hears of it, and ``data.log``, the offline log a host sampler fills with the episodes it
collects (read it with ``js.offline.read_records``). Whatever happens to the process:

* **start:** if the journal exists, :func:`jaxsampler.offline.recover` first appends to the
  log every answered step the last run did not store (a crash, a kill, a full disk), ends
  the episodes it left open as truncated, and compacts the journal; then it serves, and
  ids of earlier runs stay refused (clients get ``ServerRestartedError``);
* **SIGTERM / SIGINT:** the server stops taking requests, the sampler's last output is
  written, and the same recovery runs at once, so the log is complete when it exits (0);
* **a failure while serving** (a full disk under the journal or the log, the log deleted):
  every client is told at once with a named error, and the process exits 1 after storing
  what it can;
* **while serving**, every ``--checkpoint-s`` seconds (after a sample call's episodes are
  in the log) the journal is checkpointed (``env.checkpoint_journal(writer)``): it shrinks
  to the episodes running then, so recovery after a crash replays only those and what
  followed, and reads the log only from where it ended then, however long the server ran.

It prints one JSON line when it serves (``{"event": "ready", "address", "startup_s",
"compile_s", "recovery"}``: ``startup_s`` from process start, imports, recovery and
compilation included; ``compile_s`` the first sample call's, which compiles;
``recovery`` the :class:`~jaxsampler.offline.RecoveryReport` with its ``seconds``) and
one when it stops. The spaces and policy here are a demo's
(``--obs-dim`` floats in, ``--num-actions`` discrete actions out, a small MLP): put your
simulator's spaces and your policy in :func:`make_env` and :func:`make_policy`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

import jaxsampler as js
from jaxsampler.host_envs.external import ExternalEnv
from jaxsampler.offline import GroupCommit, OfflineWriter, StepJournal, recover
from jaxsampler.spaces import Box, Discrete

T0 = time.monotonic()  # the process's start, near enough (imports excluded by a little)
FSYNC = {"none": False, "group": GroupCommit(seconds=0.01), "always": True}


def make_env(args: argparse.Namespace, journal: StepJournal | None = None) -> ExternalEnv:
    """The served env (a fresh one, without journal, is what recovery replays into)."""
    obs = Box(-1e6, 1e6, (args.obs_dim,), np.float32)
    return ExternalEnv(obs, Discrete(args.num_actions), max_wait_s=0.002, journal=journal)


def make_policy(env: ExternalEnv) -> js.MLPPolicy:
    return js.MLPPolicy(env.observation_space, env.action_space, hidden_sizes=(32,))


def recover_into_log(args: argparse.Namespace, files: dict[str, Path]) -> dict[str, Any]:
    """Runs recovery if there is a journal; its report as a dict (empty: nothing to do)."""
    if not files["journal"].exists():
        return {}
    t0 = time.monotonic()
    report = recover(files["journal"], files["log"], make_env(args))
    return dataclasses.asdict(report) | {
        "recovered_episodes": len(report.recovered_episodes),
        "ended_by_crash": len(report.ended_by_crash),
        "seconds": time.monotonic() - t0,
    }


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def serve(
    args: argparse.Namespace, files: dict[str, Path], stop: threading.Event, recovery: dict
) -> None:
    """Serves until ``stop`` is set; an exception (a failed write) ends it after every
    client was told (``sampler_alive``). ``recovery``: the start's report, for the ready
    line."""
    journal = StepJournal(files["journal"], fsync=FSYNC[args.fsync])
    env = make_env(args, journal)
    server = js.serving.PolicyServer(env, host=args.host, port=args.port)
    policy = make_policy(env)
    params = policy.init(jax.random.PRNGKey(args.seed))
    sampler = js.sampling.HostSampler(server, policy, seed=args.seed, timeout_s=0.1)
    t0 = time.monotonic()
    sampler.sample(params, num_timesteps=1)  # compiles before the first client
    compile_s = time.monotonic() - t0
    try:
        with OfflineWriter(files["log"], append=True) as writer, server.sampler_alive():
            say(
                "ready",
                address=server.address,
                startup_s=time.monotonic() - T0,
                compile_s=compile_s,
                recovery=recovery,
            )
            last = time.monotonic()
            while not stop.is_set():
                for episode in sampler.sample(params, num_timesteps=args.timesteps):
                    writer.write(episode)
                if args.checkpoint_s and time.monotonic() - last >= args.checkpoint_s:
                    env.checkpoint_journal(writer)  # every polled step is in the log now
                    last = time.monotonic()
    finally:
        server.close()
        journal.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", type=Path, required=True, help="where the journal and log live")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: any free port (see the ready line)")
    p.add_argument("--obs-dim", type=int, default=3)
    p.add_argument("--num-actions", type=int, default=2)
    p.add_argument("--timesteps", type=int, default=256, help="steps per sample() call")
    p.add_argument(
        "--fsync",
        choices=sorted(FSYNC),
        default="none",
        help="journal fsync: none (a killed process loses nothing answered), "
        "group (10 ms group commit), always (each answer waits for the disk)",
    )
    p.add_argument(
        "--checkpoint-s",
        type=float,
        default=5.0,
        help="seconds between in-run journal checkpoints (0: none; recovery then replays "
        "the whole run)",
    )
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    files = {"journal": args.dir / "steps.journal", "log": args.dir / "data.log"}
    recovery = recover_into_log(args, files)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    failure = None
    try:
        serve(args, files, stop, recovery)
    except Exception as e:  # told to every client already; store what can be stored
        failure = f"{type(e).__name__}: {e}"
    try:
        final = recover_into_log(args, files)
    except Exception as e:  # e.g. the disk is still full: the next start recovers
        final = {"error": f"{type(e).__name__}: {e}"}
    say("stopped", failure=failure, recovery=final)
    return 0 if failure is None else 1


if __name__ == "__main__":
    sys.exit(main())
