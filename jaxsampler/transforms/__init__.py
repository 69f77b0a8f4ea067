"""Transforms: batched, stateful env->policy and policy->env steps inside the rollout.

::

    from jaxsampler.transforms import NormalizeObservation
    rollout = js.make_rollout(env, policy, 64, 128, transforms=(NormalizeObservation(),))

See :mod:`jaxsampler.transforms.base` for the protocol (state, spaces, what a transform
sees of a step) and each transform's docstring for its exact semantics.
"""

from jaxsampler.transforms.base import (
    Context,
    Observed,
    Pipeline,
    Spaces,
    StageState,
    Transform,
    TransformSpaceError,
    TransformState,
    build_pipeline,
)
from jaxsampler.transforms.normalize import NormalizeObservation, RunningMoments

__all__ = [
    "Context",
    "NormalizeObservation",
    "Observed",
    "Pipeline",
    "RunningMoments",
    "Spaces",
    "StageState",
    "Transform",
    "TransformSpaceError",
    "TransformState",
    "build_pipeline",
]
