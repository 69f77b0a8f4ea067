"""Transforms: batched, stateful env->policy and policy->env steps inside the rollout.

::

    from jaxsampler.transforms import FrameStack, NormalizeObservation, NormalizeReward
    transforms = (FrameStack(4), NormalizeObservation(), NormalizeReward())  # env side first
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
from jaxsampler.transforms.params import DomainRandomization
from jaxsampler.transforms.reward import ClipReward, NormalizeReward, ScaleReward
from jaxsampler.transforms.stack import FrameStack, PrevActionsRewards

__all__ = [
    "ActionMaskFromInfo",
    "ClipActions",
    "ClipReward",
    "Context",
    "DomainRandomization",
    "FlattenObservation",
    "FrameStack",
    "NormalizeObservation",
    "NormalizeReward",
    "Observed",
    "Pipeline",
    "PrevActionsRewards",
    "RescaleActions",
    "RunningMoments",
    "ScaleReward",
    "Spaces",
    "StageState",
    "Transform",
    "TransformSpaceError",
    "TransformState",
    "build_pipeline",
]
