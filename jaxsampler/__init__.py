"""jaxsampler: RL experience sampling at accelerator speed.

Pure-JAX envs vmapped over an env axis and an agent axis, a jitted ``lax.scan`` rollout
into preallocated time-major buffers ``[T, E, A, ...]``, and host-side samplers that
return RLlib's episodes and batches.

The top level holds the everyday path. The layers, bottom to top, are subpackages:
:mod:`~jaxsampler.spaces`, :mod:`~jaxsampler.vector`, :mod:`~jaxsampler.envs`
(pure-JAX envs, adapters), :mod:`~jaxsampler.policies`, :mod:`~jaxsampler.placement`
(the env axis over a mesh of devices and processes), :mod:`~jaxsampler.distributed`
(``jax.distributed`` set-up), :mod:`~jaxsampler.rollout`, :mod:`~jaxsampler.scale`,
:mod:`~jaxsampler.postprocessing`, :mod:`~jaxsampler.evaluation`
(``evaluate``: unbiased episodes, greedy actions, frozen statistics),
:mod:`~jaxsampler.episodes` (RLlib's data model in numpy), :mod:`~jaxsampler.host_envs`
(host-stepped envs), :mod:`~jaxsampler.sampling` (the sampler family),
:mod:`~jaxsampler.serving` (HTTP policy server and client), :mod:`~jaxsampler.offline` (logs),
:mod:`~jaxsampler.loggers` (JSON lines, TensorBoard, W&B: sampler callbacks),
:mod:`~jaxsampler.progress` (progress bars), :mod:`~jaxsampler.checkpoint` (orbax
checkpoints: exact resume) and :mod:`~jaxsampler.video` (``record_video``: rendered
episodes as MP4 or GIF).
"""

from jaxsampler import (
    checkpoint,
    distributed,
    episodes,
    host_envs,
    loggers,
    offline,
    placement,
    policies,
    postprocessing,
    progress,
    rollout,
    sampling,
    serving,
    spaces,
    transforms,
)
from jaxsampler.check import EnvCheckError, check_env
from jaxsampler.constants import DEFAULT_AGENT_ID, DEFAULT_POLICY_ID
from jaxsampler.envs.adapters.brax import from_brax
from jaxsampler.envs.adapters.gymnax import from_gymnax
from jaxsampler.envs.adapters.jaxmarl import from_jaxmarl
from jaxsampler.envs.adapters.jumanji import from_jumanji
from jaxsampler.envs.adapters.pgx import from_pgx
from jaxsampler.envs.base import Env, MultiAgentEnv, SingleAgentEnv
from jaxsampler.episodes import (
    InfiniteLookbackBuffer,
    MultiAgentBatch,
    MultiAgentEpisode,
    SampleBatch,
    SingleAgentEpisode,
    concat_samples,
)
from jaxsampler.evaluation import EvalResult, evaluate
from jaxsampler.host_envs import HostEnv, HostEnvError
from jaxsampler.offline import CorruptLogError, RepairReport, TruncatedLogWarning, repair_log
from jaxsampler.policies import (
    CNNPolicy,
    MLPPolicy,
    MultiAgentPolicy,
    NoState,
    Policy,
    RandomPolicy,
    RecurrentPolicy,
)
from jaxsampler.policies.greedy import greedy
from jaxsampler.postprocessing import compute_gae
from jaxsampler.registry import make, register, registered_ids
from jaxsampler.rollout import init_rollout_state, jit_rollout, make_rollout
from jaxsampler.sampling import Sampler, SamplerMetrics
from jaxsampler.sampling.callbacks import SampleReport
from jaxsampler.scale import make_sharded_rollout
from jaxsampler.types import RolloutState, TimeStep, Trajectory
from jaxsampler.vector import ResetPool
from jaxsampler.video import record_video

__version__ = "0.1.0"

__all__ = [
    "CorruptLogError",
    "DEFAULT_AGENT_ID",
    "DEFAULT_POLICY_ID",
    "Env",
    "EnvCheckError",
    "EvalResult",
    "HostEnv",
    "HostEnvError",
    "InfiniteLookbackBuffer",
    "CNNPolicy",
    "MLPPolicy",
    "MultiAgentBatch",
    "MultiAgentEnv",
    "MultiAgentEpisode",
    "MultiAgentPolicy",
    "NoState",
    "Policy",
    "RandomPolicy",
    "RecurrentPolicy",
    "RepairReport",
    "ResetPool",
    "RolloutState",
    "SampleBatch",
    "SampleReport",
    "Sampler",
    "SamplerMetrics",
    "SingleAgentEnv",
    "SingleAgentEpisode",
    "TimeStep",
    "Trajectory",
    "TruncatedLogWarning",
    "check_env",
    "checkpoint",
    "compute_gae",
    "concat_samples",
    "distributed",
    "episodes",
    "evaluate",
    "from_brax",
    "from_gymnax",
    "from_jaxmarl",
    "from_jumanji",
    "from_pgx",
    "greedy",
    "host_envs",
    "init_rollout_state",
    "loggers",
    "jit_rollout",
    "make",
    "make_rollout",
    "make_sharded_rollout",
    "offline",
    "placement",
    "policies",
    "postprocessing",
    "progress",
    "record_video",
    "register",
    "registered_ids",
    "repair_log",
    "rollout",
    "sampling",
    "serving",
    "spaces",
    "transforms",
]
