"""The rollout row: one jitted ``lax.scan`` of env + policy into preallocated, time-major
buffers, and what runs beside it.

- :mod:`~jaxsampler.rollout.scan`: the frozen :class:`Rollout` bundle,
  :func:`make_rollout`, :func:`init_rollout_state`, :func:`jit_rollout`, composed of
  :mod:`~jaxsampler.rollout.keys` (the key schedule), :mod:`~jaxsampler.rollout.step`
  (one step), :mod:`~jaxsampler.rollout.buffers` (spec, allocation, writes),
  :mod:`~jaxsampler.rollout.state` (the start state), :mod:`~jaxsampler.rollout.compat`
  (static fit checks) and :mod:`~jaxsampler.rollout.debug` (``debug=True``);
- :mod:`~jaxsampler.rollout.placement`: the env axis over a mesh of devices and processes
  (``mesh=``);
- :mod:`~jaxsampler.rollout.distributed`: ``jax.distributed`` set-up for multi-process runs;
- :mod:`~jaxsampler.rollout.evaluation`: :func:`evaluate` (unbiased episodes, greedy actions);
- :mod:`~jaxsampler.rollout.check`: :func:`check_env`, the env contract checker;
- :mod:`~jaxsampler.rollout.checkpoint`: orbax checkpoints of rollout state (exact resume).

Everything here is pure JAX except checkpoint files and the distributed set-up.
"""

from jaxsampler.rollout import checkpoint, distributed, placement
from jaxsampler.rollout.check import EnvCheckError, EnvCheckReport, check_env
from jaxsampler.rollout.evaluation import EvalResult, evaluate
from jaxsampler.rollout.scan import (
    Rollout,
    RolloutDebugError,
    Transforms,
    allocate_trajectory,
    check_action,
    check_compatible,
    init_rollout_state,
    jit_rollout,
    make_rollout,
    pipeline_of,
    policy_action_zeros,
    trajectory_spec,
)

__all__ = [
    "EnvCheckError",
    "EnvCheckReport",
    "EvalResult",
    "Rollout",
    "RolloutDebugError",
    "Transforms",
    "allocate_trajectory",
    "check_action",
    "check_compatible",
    "check_env",
    "checkpoint",
    "distributed",
    "evaluate",
    "init_rollout_state",
    "jit_rollout",
    "make_rollout",
    "pipeline_of",
    "placement",
    "policy_action_zeros",
    "trajectory_spec",
]
