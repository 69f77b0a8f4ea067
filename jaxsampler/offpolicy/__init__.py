"""Off-policy training: a bridge from rollouts to flashbax replay buffers, and n-step and
V-trace targets with :func:`jaxsampler.postprocessing.gae`'s boundary rules.

* :mod:`~jaxsampler.offpolicy.items`: transitions and sequence steps of a
  :class:`~jaxsampler.types.Trajectory` (real final observations, validity masks,
  per-agent rows), and per-step recurrent states;
* :mod:`~jaxsampler.offpolicy.replay`: flashbax buffers whose items match a rollout
  (:func:`make_transition_buffer`, :func:`make_sequence_buffer`);
* :mod:`~jaxsampler.offpolicy.returns`: :func:`n_step_targets`, :func:`n_step_returns`,
  :func:`vtrace`;
* :mod:`~jaxsampler.offpolicy.segments`: the agent steps all of them share.

Needs the ``offpolicy`` extra (``pip install jaxsampler[offpolicy]``: flashbax and rlax),
imported only when a function that uses it runs, so ``import jaxsampler`` works without it.
Everything here is pure and usable inside the user's ``jit``.
"""

from __future__ import annotations

from jaxsampler.offpolicy.items import (
    ReplayTransition,
    SequenceStep,
    episode_ids,
    episode_starts,
    replay_policy_states,
    sequence_steps,
    transitions,
)
from jaxsampler.offpolicy.replay import (
    SequenceReplay,
    SequenceSample,
    TransitionReplay,
    check_batch,
    make_sequence_buffer,
    make_transition_buffer,
)
from jaxsampler.offpolicy.returns import (
    NStepTargets,
    VTraceOutput,
    compute_n_step_returns,
    compute_vtrace,
    n_step_returns,
    n_step_targets,
    vtrace,
)
from jaxsampler.offpolicy.segments import AgentSegments, agent_segments

__all__ = [
    "AgentSegments",
    "NStepTargets",
    "ReplayTransition",
    "SequenceReplay",
    "SequenceSample",
    "SequenceStep",
    "TransitionReplay",
    "VTraceOutput",
    "agent_segments",
    "check_batch",
    "compute_n_step_returns",
    "compute_vtrace",
    "episode_ids",
    "episode_starts",
    "make_sequence_buffer",
    "make_transition_buffer",
    "n_step_returns",
    "n_step_targets",
    "replay_policy_states",
    "sequence_steps",
    "transitions",
    "vtrace",
]
