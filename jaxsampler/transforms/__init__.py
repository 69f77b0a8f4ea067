"""Transforms: batched, stateful env->policy and policy->env steps inside the rollout.

::

    from jaxsampler.transforms import FrameStack, NormalizeObservation
    transforms = (FrameStack(4), NormalizeObservation())      # env side first
    space = js.rollout.pipeline_of(env, transforms).observation_space  # what the policy sees
    rollout = js.make_rollout(env, policy, 64, 128, transforms=transforms)

See :mod:`jaxsampler.transforms.base` for the protocol (state, spaces, what a transform
sees of a step) and each transform's docstring for its exact semantics.
"""

from jaxsampler.transforms.actions import ClipActions, RescaleActions
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
from jaxsampler.transforms.flatten import FlattenObservation
from jaxsampler.transforms.mask import ActionMaskFromInfo
from jaxsampler.transforms.normalize import NormalizeObservation, RunningMoments
from jaxsampler.transforms.stack import FrameStack, PrevActionsRewards

__all__ = [
    "ActionMaskFromInfo",
    "ClipActions",
    "Context",
    "FlattenObservation",
    "FrameStack",
    "NormalizeObservation",
    "Observed",
    "Pipeline",
    "PrevActionsRewards",
    "RescaleActions",
    "RunningMoments",
    "Spaces",
    "StageState",
    "Transform",
    "TransformSpaceError",
    "TransformState",
    "build_pipeline",
]
