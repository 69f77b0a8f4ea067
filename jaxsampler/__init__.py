"""jaxsampler: RL experience sampling at accelerator speed.

Pure-JAX envs vmapped over an env axis and an agent axis, a jitted ``lax.scan`` rollout
into preallocated time-major buffers ``[T, E, A, ...]``, and host-side samplers that
return RLlib's episodes and batches.

The top level holds the everyday path; everything else is reached through its layer.
The layers, top first (a layer imports only layers below it):

- :mod:`~jaxsampler.cli`: the ``jaxsampler`` command, its benchmark job, the launcher;
- :mod:`~jaxsampler.integrations`: RLlib, Gymnasium (:func:`to_gymnasium`), loggers, progress
  bars, video;
- :mod:`~jaxsampler.serving` and :mod:`~jaxsampler.offline`: the HTTP policy server and
  client; offline logs;
- :mod:`~jaxsampler.sampling`: the sampler family (:class:`Sampler`);
- :mod:`~jaxsampler.host_envs`: host-stepped envs (Gymnasium, external simulators);
- :mod:`~jaxsampler.episodes`: RLlib's data model in numpy;
- :mod:`~jaxsampler.offpolicy`: flashbax replay buffers filled from rollouts, n-step and
  V-trace targets (the ``offpolicy`` extra; reached as ``js.offpolicy``, outside
  ``__all__``, which holds the everyday path);
- :mod:`~jaxsampler.rollout`: the jitted scan, placement over devices, evaluation,
  ``check_env``, checkpoints;
- :mod:`~jaxsampler.postprocessing`: GAE and returns;
- :mod:`~jaxsampler.policies`, :mod:`~jaxsampler.transforms`, :mod:`~jaxsampler.envs`
  (built-in envs, suite adapters, the registry), :mod:`~jaxsampler.vector`;
- :mod:`~jaxsampler.spaces`, :mod:`~jaxsampler.types`, :mod:`~jaxsampler.constants`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types as _pytypes  # (jaxsampler.types would shadow the name "types")
import warnings
from collections.abc import Sequence
from typing import Any

from jaxsampler import (
    envs,
    episodes,
    host_envs,
    integrations,
    offline,
    policies,
    postprocessing,
    rollout,
    sampling,
    serving,
    spaces,
    transforms,
    vector,
)

# A layer like the ones above, reachable as js.offpolicy; kept out of __all__, which the
# package tests cap at the everyday path (the optional extra is imported lazily inside it).
from jaxsampler import offpolicy as offpolicy
from jaxsampler.envs.base import Env, MultiAgentEnv, SingleAgentEnv
from jaxsampler.envs.registry import make, register
from jaxsampler.episodes import MultiAgentBatch, MultiAgentEpisode, SampleBatch, SingleAgentEpisode
from jaxsampler.integrations.gymnasium import to_gymnasium
from jaxsampler.policies import CNNPolicy, MLPPolicy, Policy, RandomPolicy
from jaxsampler.postprocessing import compute_gae
from jaxsampler.rollout import (
    check_env,
    evaluate,
    init_rollout_state,
    jit_rollout,
    make_rollout,
)
from jaxsampler.sampling import Sampler
from jaxsampler.types import RolloutState, Trajectory

__version__ = "0.1.0"

__all__ = [
    "CNNPolicy",
    "Env",
    "MLPPolicy",
    "MultiAgentBatch",
    "MultiAgentEnv",
    "MultiAgentEpisode",
    "Policy",
    "RandomPolicy",
    "RolloutState",
    "SampleBatch",
    "Sampler",
    "SingleAgentEnv",
    "SingleAgentEpisode",
    "Trajectory",
    "check_env",
    "compute_gae",
    "envs",
    "episodes",
    "evaluate",
    "host_envs",
    "init_rollout_state",
    "integrations",
    "jit_rollout",
    "make",
    "make_rollout",
    "offline",
    "policies",
    "postprocessing",
    "register",
    "rollout",
    "sampling",
    "serving",
    "spaces",
    "to_gymnasium",
    "transforms",
    "vector",
]

#: Names the top level had before the layers were narrowed, and where they live now. They
#: still resolve, with a DeprecationWarning, for one release.
_MOVED: dict[str, str] = {
    "CorruptLogError": "jaxsampler.offline",
    "DEFAULT_AGENT_ID": "jaxsampler.constants",
    "DEFAULT_POLICY_ID": "jaxsampler.constants",
    "EnvCheckError": "jaxsampler.rollout",
    "EvalResult": "jaxsampler.rollout",
    "HostEnv": "jaxsampler.host_envs",
    "HostEnvError": "jaxsampler.host_envs",
    "InfiniteLookbackBuffer": "jaxsampler.episodes",
    "MultiAgentPolicy": "jaxsampler.policies",
    "NoState": "jaxsampler.policies",
    "RecurrentPolicy": "jaxsampler.policies",
    "RepairReport": "jaxsampler.offline",
    "ResetPool": "jaxsampler.vector",
    "SampleReport": "jaxsampler.sampling",
    "SamplerMetrics": "jaxsampler.sampling",
    "TimeStep": "jaxsampler.types",
    "TruncatedLogWarning": "jaxsampler.offline",
    "checkpoint": "jaxsampler.rollout",
    "concat_samples": "jaxsampler.episodes",
    "distributed": "jaxsampler.rollout",
    "from_brax": "jaxsampler.envs",
    "from_gymnax": "jaxsampler.envs",
    "from_jaxmarl": "jaxsampler.envs",
    "from_jumanji": "jaxsampler.envs",
    "from_pgx": "jaxsampler.envs",
    "greedy": "jaxsampler.policies",
    "loggers": "jaxsampler.integrations",
    "placement": "jaxsampler.rollout",
    "progress": "jaxsampler.integrations",
    "record_video": "jaxsampler.integrations",
    "registered_ids": "jaxsampler.envs",
    "repair_log": "jaxsampler.offline",
}


def make_sharded_rollout(*args: Any, **kwargs: Any) -> Any:
    """Deprecated: ``make_rollout(env, policy, num_envs, rollout_length, mesh=mesh)``."""
    warnings.warn(
        "js.make_sharded_rollout(env, policy, num_envs, rollout_length, mesh) is deprecated: "
        "use js.make_rollout(env, policy, num_envs, rollout_length, mesh=mesh)",
        DeprecationWarning,
        stacklevel=2,
    )
    names = ("env", "policy", "num_envs", "rollout_length", "mesh", "transforms")
    kwargs.update(zip(names, args))
    return make_rollout(**kwargs)


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        home = _MOVED[name]
        warnings.warn(
            f"jaxsampler.{name} moved: use {home}.{name} (the old name goes in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(home), name)
    raise AttributeError(f"module 'jaxsampler' has no attribute {name!r}")


#: Module paths that moved into their layer's folder, old prefix -> new prefix. Importing an
#: old path still works, with a DeprecationWarning, for one release.
_MOVED_MODULES: dict[str, str] = {
    "jaxsampler.check": "jaxsampler.rollout.check",
    "jaxsampler.checkpoint": "jaxsampler.rollout.checkpoint",
    "jaxsampler.codec": "jaxsampler.episodes.codec",
    "jaxsampler.distributed": "jaxsampler.rollout.distributed",
    "jaxsampler.evaluation": "jaxsampler.rollout.evaluation",
    "jaxsampler.loggers": "jaxsampler.integrations.loggers",
    "jaxsampler.placement": "jaxsampler.rollout.placement",
    "jaxsampler.progress": "jaxsampler.integrations.progress",
    "jaxsampler.registry": "jaxsampler.envs.registry",
    "jaxsampler.rllib": "jaxsampler.integrations.rllib",
    "jaxsampler.video": "jaxsampler.integrations.video",
}


def _new_name(fullname: str) -> str | None:
    for old, new in _MOVED_MODULES.items():
        if fullname == old or fullname.startswith(old + "."):
            return new + fullname[len(old) :]
    return None


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path as a thin alias of the module's new home."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: _pytypes.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = _new_name(fullname)
        if new is None:
            return None
        target_spec = importlib.util.find_spec(new)
        if target_spec is None:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, self, origin=target_spec.origin)
        if target_spec.submodule_search_locations is not None:
            spec.submodule_search_locations = []  # a package: its submodules come here too
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> _pytypes.ModuleType:
        new = _new_name(spec.name)
        assert new is not None
        warnings.warn(
            f"{spec.name} moved to {new} (the old path goes in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        target = importlib.import_module(new)
        alias = _pytypes.ModuleType(spec.name, target.__doc__)
        if hasattr(target, "__all__"):
            alias.__all__ = target.__all__  # type: ignore[attr-defined]
        if hasattr(target, "__path__"):
            alias.__path__ = []  # its submodules are aliases too (found by this finder)

        def forward(name: str) -> Any:
            if name.startswith("__"):  # module machinery stays the alias's own
                raise AttributeError(name)
            return getattr(target, name)

        alias.__getattr__ = forward  # type: ignore[method-assign]
        return alias

    def exec_module(self, module: _pytypes.ModuleType) -> None:
        pass


if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModuleFinder())
