"""jaxsampler: RL experience sampling at accelerator speed.

Pure-JAX envs vmapped over an env axis and an agent axis, a jitted ``lax.scan`` rollout
into preallocated time-major buffers ``[T, E, A, ...]``, and host-side tooling.
"""

from jaxsampler import spaces
from jaxsampler.check import EnvCheckError, EnvCheckReport, check_env
from jaxsampler.env import DEFAULT_AGENT_ID, Env, EnvParams, SingleAgentEnv
from jaxsampler.envs.adapters.gymnax import GymnaxEnv, from_gymnax_env as from_gymnax
from jaxsampler.envs.adapters.jaxmarl import JaxMARLEnv, from_jaxmarl
from jaxsampler.host import InfiniteLookbackBuffer, Sampler, SamplerMetrics, SingleAgentEpisode
from jaxsampler.host.batch import MultiAgentBatch, SampleBatch, concat_samples
from jaxsampler.host.multi_agent_episode import MultiAgentEnvError, MultiAgentEpisode
from jaxsampler.hostenv import (
    ExternalEnv,
    ExternalMultiAgentEnv,
    GymnasiumVectorEnv,
    HostEnv,
    HostSampler,
    MultiAgentDictEnv,
    PolicyClient,
    PolicyServer,
    SampleCollector,
    read_batches,
    read_episodes,
    write_batches,
    write_episodes,
)
from jaxsampler.policies import MLPPolicy, MultiAgentPolicy, NoState, Policy, RandomPolicy, RecurrentPolicy
from jaxsampler.postprocessing import GAEOutput, compute_gae, discounted_returns, gae
from jaxsampler.registry import make, register, registered_ids
from jaxsampler.rollout import (
    RolloutDebugError,
    allocate_trajectory,
    init_rollout_state,
    jit_rollout,
    make_rollout,
)
from jaxsampler.types import AUTORESET_MODE, NoInfo, RolloutState, TimeStep, Trajectory

__version__ = "0.1.0"

__all__ = [
    "write_episodes",
    "write_batches",
    "read_episodes",
    "read_batches",
    "SampleCollector",
    "PolicyServer",
    "PolicyClient",
    "MultiAgentDictEnv",
    "HostSampler",
    "HostEnv",
    "GymnasiumVectorEnv",
    "ExternalMultiAgentEnv",
    "ExternalEnv",
    "AUTORESET_MODE",
    "DEFAULT_AGENT_ID",
    "Env",
    "EnvCheckError",
    "EnvCheckReport",
    "GymnaxEnv",
    "JaxMARLEnv",
    "InfiniteLookbackBuffer",
    "MultiAgentBatch",
    "MultiAgentEnvError",
    "MultiAgentEpisode",
    "MultiAgentPolicy",
    "EnvParams",
    "GAEOutput",
    "MLPPolicy",
    "NoInfo",
    "NoState",
    "Policy",
    "RandomPolicy",
    "RecurrentPolicy",
    "RolloutDebugError",
    "RolloutState",
    "SampleBatch",
    "Sampler",
    "SamplerMetrics",
    "SingleAgentEpisode",
    "SingleAgentEnv",
    "TimeStep",
    "Trajectory",
    "allocate_trajectory",
    "check_env",
    "compute_gae",
    "concat_samples",
    "discounted_returns",
    "from_gymnax",
    "from_jaxmarl",
    "gae",
    "init_rollout_state",
    "jit_rollout",
    "make",
    "make_rollout",
    "register",
    "registered_ids",
    "spaces",
]
