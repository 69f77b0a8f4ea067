"""Many processes as one sampler: JAX's own multi-controller runtime (``jax.distributed``).

Each process runs the same program. After :func:`initialize`, ``jax.devices()`` lists every
process's devices, a mesh over them (:func:`jaxsampler.placement.env_mesh`) spans all
processes, and a rollout on that mesh steps each process's envs on its own devices, with
reductions over envs as cross-process collectives. On CPU the collectives go through gloo
(TCP), so tests and a laptop run several processes on 127.0.0.1.

``python -m jaxsampler.launch -n 2 script.py`` starts the processes with the variables
below set; ``initialize()`` without arguments reads them.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

__all__ = [
    "ENV_COORDINATOR",
    "ENV_NUM_PROCESSES",
    "ENV_PROCESS_ID",
    "ENV_TIMEOUT",
    "initialize",
    "is_initialized",
    "process_allgather",
    "process_sum",
]

#: ``host:port`` of process 0's coordinator.
ENV_COORDINATOR = "JAXSAMPLER_COORDINATOR"
#: How many processes take part.
ENV_NUM_PROCESSES = "JAXSAMPLER_NUM_PROCESSES"
#: This process's index, ``0 .. n-1``.
ENV_PROCESS_ID = "JAXSAMPLER_PROCESS_ID"
#: Seconds to wait for the others (``timeout_s`` of :func:`initialize`).
ENV_TIMEOUT = "JAXSAMPLER_TIMEOUT"

_initialized = False


def is_initialized() -> bool:
    """Whether :func:`initialize` ran in this process (with more than one process)."""
    return _initialized


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    timeout_s: float = 60.0,
) -> None:
    """Joins this process to the others (``jax.distributed.initialize``), CPU collectives
    through gloo. Arguments default to the ``JAXSAMPLER_*`` variables that
    ``python -m jaxsampler.launch`` sets; with none set and none given it does nothing
    (one process). Call it before anything else touches JAX devices.

    Raises:
        ValueError: arguments missing or out of range.
        TimeoutError: the coordinator or a peer did not answer within ``timeout_s``.
    """
    global _initialized
    env = os.environ
    coordinator_address = coordinator_address or env.get(ENV_COORDINATOR)
    if num_processes is None and ENV_NUM_PROCESSES in env:
        num_processes = int(env[ENV_NUM_PROCESSES])
    if process_id is None and ENV_PROCESS_ID in env:
        process_id = int(env[ENV_PROCESS_ID])
    if coordinator_address is None and num_processes is None and process_id is None:
        return
    if coordinator_address is None or num_processes is None or process_id is None:
        raise ValueError(
            "initialize needs coordinator_address, num_processes and process_id (or the "
            f"{ENV_COORDINATOR} / {ENV_NUM_PROCESSES} / {ENV_PROCESS_ID} variables)"
        )
    if num_processes < 1 or not 0 <= process_id < num_processes:
        raise ValueError(f"process_id={process_id} is not in 0..{num_processes - 1}")
    if num_processes == 1:
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=max(1, int(timeout_s)),
    )
    _initialized = True


def process_allgather(tree: Any) -> Any:
    """Every process's ``tree`` (host values of the same structure and shapes), stacked on a
    new leading axis ``[num_processes, ...]``, on every process."""
    if jax.process_count() == 1:
        return jax.tree.map(lambda x: np.asarray(x)[None], tree)
    from jax.experimental import multihost_utils

    return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree, tiled=False))


def process_sum(tree: Any) -> Any:
    """The sum over processes of ``tree`` (host values), on every process."""
    return jax.tree.map(lambda x: x.sum(axis=0), process_allgather(tree))
