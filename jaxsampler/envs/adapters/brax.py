"""Adapter: a brax env as a jaxsampler :class:`~jaxsampler.envs.base.Env` (one agent).

``js.make("brax:<name>", backend=..., episode_length=..., **env_kwargs)`` builds brax's
own env (``brax.envs.get_environment``); ``js.envs.from_brax(env)`` wraps one you built.

* **Raw envs only.** The adapter steps the brax env itself, with no brax training
  wrapper: jaxsampler's vector layer resets finished episodes ("next-step" reset), so
  the final observation of every episode is kept. A brax env that has an
  ``AutoResetWrapper``, ``EpisodeWrapper``, ``VmapWrapper``, ``EvalWrapper`` or
  ``DomainRandomizationVmapWrapper`` anywhere in its ``.env`` chain is refused with a
  ``ValueError`` (auto-reset would overwrite the final observation, vmap would add a
  batch axis the vector layer adds itself, the episode wrapper would merge the time
  limit into ``done``); pass ``env.unwrapped`` and put the limit in the params. Other
  ``brax.envs.Wrapper`` subclasses (your own) are stepped as they are.
* **Time limit.** The adapter counts steps: :class:`BraxParams` ``.max_steps_in_episode``
  (default 1000, the episode length of brax's training scripts). brax's ``done`` is
  ``terminated``; ``truncated`` is ``steps >= max_steps_in_episode``, independently of
  ``terminated``, as everywhere in jaxsampler (both may be True on the last step; a
  learner bootstraps only where ``terminated`` is False). brax's ``EpisodeWrapper``
  instead reports ``truncation = 1 - done`` at the limit. No action repeat: wrap the env
  yourself if you want one.
* **Spaces.** Observation ``Box(-inf, inf, (observation_size,), float32)``; action
  ``Box(-1, 1, (action_size,), float32)``: every brax env takes actions in [-1, 1] (those
  with other actuator ranges rescale inside ``step``). The adapter clips actions to
  [-1, 1] before brax's ``step``, as jaxsampler's continuous envs clip to their bounds
  (policies store the unclipped sample, so its log-density stays exact); brax's own
  training squashes with tanh and never leaves the range, so in-range actions reach
  brax unchanged.
* **Info.** ``TimeStep.info`` is ``{"metrics": state.metrics}``: brax's per-step
  diagnostics (reward terms, velocities; float32 scalars), whose structure brax already
  keeps fixed from ``reset`` on; at reset they are brax's reset values. brax's ``info``
  dict is its internal carry (wrapper bookkeeping, random keys, ``time_out``, which in the
  raw envs repeats ``done``): it stays in the state (:class:`BraxState` ``.brax``), not
  in ``TimeStep.info``.
* **Keys.** ``reset`` passes its key to brax's ``reset``; brax's ``step`` is deterministic,
  so ``step`` ignores its key.
* **Rendering.** ``can_render`` is False: brax draws frames on the host (``brax.io.image``
  / MuJoCo's renderer from ``state.brax.pipeline_state``), which no jitted rollout can call.

Backends: every brax backend works on CPU (``"positional"``, ``"spring"``,
``"generalized"``, ``"mjx"``); ``make_brax`` defaults to :data:`DEFAULT_BACKEND`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsampler import spaces as js_spaces
from jaxsampler.envs.adapters.common import SuiteEnv, import_suite, unknown_id, wrong_suite
from jaxsampler.spaces import Space
from jaxsampler.types import TimeStep

__all__ = [
    "BACKENDS",
    "DEFAULT_BACKEND",
    "DEFAULT_EPISODE_LENGTH",
    "REFUSED_WRAPPERS",
    "BraxEnv",
    "BraxParams",
    "BraxState",
    "from_brax",
    "make_brax",
]

#: The physics backends of brax 0.14 (all run on CPU).
BACKENDS = ("generalized", "mjx", "positional", "spring")
#: The backend of ``js.make("brax:<name>")`` when none is given.
DEFAULT_BACKEND = "mjx"
#: The default ``max_steps_in_episode`` (brax's training default ``episode_length``).
DEFAULT_EPISODE_LENGTH = 1000
#: brax's training wrappers (``brax.envs.wrappers.training``) that ``from_brax`` refuses.
REFUSED_WRAPPERS = (
    "AutoResetWrapper",
    "EpisodeWrapper",
    "VmapWrapper",
    "EvalWrapper",
    "DomainRandomizationVmapWrapper",
)


@struct.dataclass
class BraxParams:
    """Params of the adapter: the time limit it owns (the brax env takes no params)."""

    max_steps_in_episode: int = DEFAULT_EPISODE_LENGTH


@struct.dataclass
class BraxState:
    """One env's state: brax's own ``State`` and the adapter's step counter.

    Attributes:
        brax: ``brax.envs.State`` (``pipeline_state``, ``obs``, ``reward``, ``done``,
            ``metrics``, ``info``), unbatched.
        time: ``int32[]``, steps taken in this episode.
    """

    brax: Any
    time: jax.Array


# One shared default instance: adapters compare params by identity, so two default-wrapped
# copies of the same brax env are equal (and share compiled code).
_DEFAULT_PARAMS = BraxParams()


def _refused_wrapper(env: Any) -> str | None:
    """The name of the first refused brax training wrapper in ``env``'s ``.env`` chain."""
    seen = 0
    while env is not None and seen < 100:  # a cycle guard; brax chains are short
        for cls in type(env).__mro__:
            if cls.__name__ in REFUSED_WRAPPERS and cls.__module__.startswith("brax."):
                return cls.__name__
        env = env.__dict__.get("env") if hasattr(env, "__dict__") else None
        seen += 1
    return None


def _box(size: Any) -> Space:
    """jaxsampler space of brax's ``observation_size`` (an int, a shape or a dict of them)."""
    if isinstance(size, Mapping):
        return js_spaces.Dict({k: _box(v) for k, v in size.items()})
    shape = (int(size),) if np.ndim(size) == 0 else tuple(int(s) for s in size)
    return js_spaces.Box(-np.inf, np.inf, shape, np.float32)


@dataclasses.dataclass(frozen=True, eq=False)
class BraxEnv(SuiteEnv):
    """Wraps ``env`` (a raw ``brax.envs.Env``) as a single-agent jaxsampler env.

    Args:
        env: the brax env (no brax training wrappers; see the module docstring).
        params: :class:`BraxParams`; defaults to one shared ``BraxParams()`` (1000 steps).
        env_id: a display name (``name`` is ``"brax:<env_id>"``).
    """

    suite: ClassVar[str] = "brax"

    def __post_init__(self) -> None:
        if self.params is None:
            object.__setattr__(self, "params", _DEFAULT_PARAMS)

    @property
    def backend(self) -> str:
        """The brax physics backend the wrapped env runs on."""
        return str(self.env.backend)

    @property
    def observation_space(self) -> Space:
        """``Box(-inf, inf, (observation_size,), float32)`` (a ``Dict`` of such boxes where brax
        reports a dict of sizes)."""
        return _box(self.env.observation_size)

    @property
    def action_space(self) -> Space:
        """``Box(-1, 1, (action_size,), float32)``: the range every brax env takes."""
        return js_spaces.Box(-1.0, 1.0, (int(self.env.action_size),), np.float32)

    def _timestep(self, s: Any, reward: jax.Array, terminated: jax.Array, truncated: jax.Array):
        return TimeStep(
            obs=jax.tree.map(lambda x: jnp.asarray(x, jnp.float32)[None], s.obs),
            reward=jnp.reshape(reward, (1,)).astype(jnp.float32),
            terminated=jnp.reshape(terminated, (1,)),
            truncated=jnp.reshape(truncated, (1,)),
            acting=jnp.ones((1,), jnp.bool_),
            info={"metrics": jax.tree.map(jnp.asarray, dict(s.metrics))},
        )

    def reset(self, key: jax.Array, params: Any = None) -> tuple[BraxState, TimeStep]:
        """brax's ``reset(key)`` with the step counter at 0; ``info`` holds brax's reset
        metrics. ``params`` is unused. Pure; safe under jit and vmap."""
        s = self.env.reset(key)
        no = jnp.zeros((), jnp.bool_)
        ts = self._timestep(s, jnp.zeros((), jnp.float32), no, no)
        return BraxState(brax=s, time=jnp.zeros((), jnp.int32)), ts

    def step(
        self, key: jax.Array, state: BraxState, action: Any, params: Any = None
    ) -> tuple[BraxState, TimeStep]:
        """brax's ``step`` on ``action[0]`` clipped to ``[-1, 1]`` (``key`` is unused: brax steps
        deterministically). ``terminated`` is brax's ``done``; ``truncated`` is ``time >=
        params.max_steps_in_episode``. Pure; safe under jit and vmap."""
        params = self.params if params is None else params
        s = self.env.step(state.brax, jnp.clip(jnp.asarray(action, jnp.float32)[0], -1.0, 1.0))
        time = state.time + 1
        terminated = jnp.asarray(s.done) > 0
        truncated = time >= params.max_steps_in_episode
        return BraxState(brax=s, time=time), self._timestep(s, s.reward, terminated, truncated)


def _is_brax_env(env: Any) -> bool:
    try:
        from brax.envs.base import Env as BraxBase
    except ImportError:  # brax missing: nothing can be a brax env
        return False
    return isinstance(env, BraxBase)


def from_brax(
    env: Any,
    params: BraxParams | None = None,
    env_id: str | None = None,
    *,
    episode_length: int | None = None,
) -> BraxEnv:
    """Wraps a raw brax env object as a jaxsampler env.

    Args:
        env: a ``brax.envs.Env`` (e.g. ``brax.envs.get_environment("ant")``).
        params: the adapter's :class:`BraxParams`.
        env_id: a display name.
        episode_length: shorthand for ``params=BraxParams(max_steps_in_episode=...)``.

    Raises:
        TypeError: ``env`` is not a brax env.
        ValueError: ``env`` carries one of brax's training wrappers
            (:data:`REFUSED_WRAPPERS`), or both ``params`` and ``episode_length`` given, or
            ``episode_length < 1``.
    """
    if not _is_brax_env(env):
        raise wrong_suite(
            "from_brax", "a brax env (brax.envs.get_environment(name), brax.envs.Env)", env
        )
    wrapper = _refused_wrapper(env)
    if wrapper is not None:
        raise ValueError(
            f"from_brax needs a brax env without brax's training wrappers, got one with "
            f"{wrapper}: jaxsampler resets episodes itself (keeping the final observation), "
            "batches envs itself and owns the time limit. Pass env.unwrapped and set the "
            "limit with episode_length=... (or BraxParams(max_steps_in_episode=...))"
        )
    if episode_length is not None:
        if params is not None:
            raise ValueError("from_brax: give params or episode_length, not both")
        params = BraxParams(max_steps_in_episode=_check_length(episode_length))
    return BraxEnv(env, params, env_id)


def _check_length(episode_length: int) -> int:
    if int(episode_length) != episode_length or episode_length < 1:
        raise ValueError(f"episode_length must be a positive int, got {episode_length!r}")
    return int(episode_length)


def make_brax(
    env_id: str,
    backend: str = DEFAULT_BACKEND,
    episode_length: int = DEFAULT_EPISODE_LENGTH,
    **env_kwargs: Any,
) -> BraxEnv:
    """``brax.envs.get_environment(env_id, backend=backend, **env_kwargs)`` as a jaxsampler
    env with a time limit of ``episode_length`` steps.

    Raises:
        ImportError: brax is not installed (the message gives the pip command).
        ValueError: ``env_id`` is not a registered brax env (the message lists them), an
            unknown ``backend`` (the message lists :data:`BACKENDS`), or
            ``episode_length < 1``.
    """
    import_suite("brax", "brax")
    from brax import envs

    ids = sorted(getattr(envs, "_envs", {}))
    if env_id not in ids:
        raise unknown_id("brax", env_id, ids)
    if backend not in BACKENDS:
        raise ValueError(f"unknown brax backend {backend!r}; brax has: {', '.join(BACKENDS)}")
    params = (
        _DEFAULT_PARAMS
        if episode_length == DEFAULT_EPISODE_LENGTH
        else BraxParams(max_steps_in_episode=_check_length(episode_length))
    )
    env = envs.get_environment(env_id, backend=backend, **env_kwargs)
    return BraxEnv(env, params, env_id)
