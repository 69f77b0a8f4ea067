"""One jaxsampler env as a ``gymnasium.Env`` (:class:`JaxGymnasiumEnv`), and what both faces share.

Seeding follows Gymnasium: ``reset(seed=s)`` seeds :attr:`np_random` (``super().reset``) and
starts the env's key chain at ``s`` (:func:`.kernels.seed_chains`);
``reset()`` continues the chain (the first unseeded reset draws the chain's seed from
:attr:`np_random`, i.e. from OS entropy). Every reset and step takes the next key of the chain,
so equal seeds and equal actions give bit-identical episodes.
"""

from __future__ import annotations

import re
from typing import Any

import gymnasium
import jax
import numpy as np
from gymnasium.envs.registration import EnvSpec

from jaxsampler.envs.base import Env, MultiAgentEnv
from jaxsampler.envs.registry import make
from jaxsampler.integrations.gymnasium import kernels
from jaxsampler.integrations.gymnasium.convert import (
    check_seed,
    frames,
    gymnasium_space,
    host_action,
    host_info,
    host_obs,
    row,
)

__all__ = ["RENDER_FPS", "JaxGymnasiumEnv", "face_metadata", "resolve_env", "resolve_params"]

#: ``metadata["render_fps"]`` of every face (the frame rate of ``js.integrations.record_video``).
RENDER_FPS = 30


def resolve_env(env_or_id: Any, make_kwargs: dict[str, Any], where: str) -> Env:
    """The single-agent pure-JAX env behind a face: ``env_or_id`` itself or ``js.make`` of it.

    Raises:
        ValueError, ImportError: as :func:`jaxsampler.make` (unknown id, suite not installed).
        TypeError: not an env or an id; keyword arguments beside an env object; a
            host-stepped ``"gym:<id>"`` env; a multi-agent env.
    """
    if isinstance(env_or_id, str):
        if env_or_id.startswith("gym:"):
            raise TypeError(
                f"{where}: {env_or_id!r} is a Gymnasium env already; use "
                f"gymnasium.make({env_or_id[4:]!r}) directly"
            )
        env = make(env_or_id, **make_kwargs)
    elif isinstance(env_or_id, Env):
        if make_kwargs:
            raise TypeError(
                f"{where}: keyword arguments {sorted(make_kwargs)} go to js.make and need an env "
                "id, not an env object"
            )
        env = env_or_id
    else:
        raise TypeError(
            f"{where}: expected a jaxsampler env or an env id, got {type(env_or_id).__name__}"
        )
    if not isinstance(env, Env):
        raise TypeError(f"{where}: {env_or_id!r} is not a pure-JAX env ({type(env).__name__})")
    if isinstance(env, MultiAgentEnv) or env.num_agents != 1:
        raise TypeError(
            f"{where}: {env.name} is a multi-agent env ({env.num_agents} agents) and Gymnasium "
            "has no multi-agent interface; sample it with js.Sampler (MultiAgentEpisode, "
            "MultiAgentBatch) or train it in RLlib through "
            "jaxsampler.integrations.rllib.JaxMultiAgentEnvRunner"
        )
    return env


def resolve_params(env: Env, env_params: Any) -> Any:
    """``env_params`` (``env.default_params`` when None), placed on the device once."""
    return jax.device_put(env.default_params if env_params is None else env_params)


def face_metadata(env: Env) -> dict[str, Any]:
    """Gymnasium metadata: ``"rgb_array"`` rendering where the env has a JAX renderer."""
    return {"render_modes": ["rgb_array"] if env.can_render else [], "render_fps": RENDER_FPS}


def check_render_mode(env: Env, render_mode: str | None, where: str) -> None:
    """Raises ``ValueError`` for a render mode the env does not offer."""
    modes = face_metadata(env)["render_modes"]
    if render_mode is not None and render_mode not in modes:
        raise ValueError(
            f"{where}: render_mode={render_mode!r} is not offered by {env.name}: "
            f"choose None{''.join(f' or {m!r}' for m in modes)}"
        )


def _spec_id(name: str) -> str:
    safe = re.sub(r"[^\w.-]", "_", name)
    return f"jaxsampler/{safe}"


class JaxGymnasiumEnv(gymnasium.Env):
    """A single-agent jaxsampler env behind Gymnasium's ``Env`` API (numpy in, numpy out).

    Each ``reset`` / ``step`` is one call of a jitted kernel shared by every face of an equal
    env (:mod:`~jaxsampler.integrations.gymnasium.kernels`) and one device-to-host transfer.

    Args:
        env: a jaxsampler env, or an id for :func:`jaxsampler.make`.
        env_params: the env's params (a pytree like ``env.default_params``, which is used
            when None), e.g. another time limit.
        render_mode: ``None`` or ``"rgb_array"`` (frames from the env's JAX renderer; only
            for envs with ``can_render``).
        **make_kwargs: passed to :func:`jaxsampler.make` with an id.

    Attributes:
        jax_env: the jaxsampler env; env_params: its params (on the device).

    Raises:
        TypeError: see :func:`resolve_env` (multi-agent, host-stepped, not an env).
        ValueError: an unknown id (the registry's error); a render mode the env lacks.

    Actions outside the action space raise
    :class:`~jaxsampler.integrations.gymnasium.convert.InvalidActionError` (a ``ValueError``
    and Gymnasium's ``InvalidAction``); ``Box`` actions beyond their bounds pass and the env
    clips them. ``step`` or ``render`` before ``reset`` raise ``gymnasium.error.ResetNeeded``.
    Stepping on after an episode ended warns once and continues the finished episode.
    ``reset(options=...)`` is accepted and ignored.
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": RENDER_FPS}

    def __init__(
        self,
        env: Env | str,
        *,
        env_params: Any = None,
        render_mode: str | None = None,
        **make_kwargs: Any,
    ):
        self.jax_env = resolve_env(env, make_kwargs, "JaxGymnasiumEnv")
        check_render_mode(self.jax_env, render_mode, "JaxGymnasiumEnv")
        self.env_params = resolve_params(self.jax_env, env_params)
        self.metadata = face_metadata(self.jax_env)
        self.render_mode = render_mode
        self._action_space = self.jax_env.action_space
        self.observation_space = gymnasium_space(self.jax_env.observation_space)
        self.action_space = gymnasium_space(self._action_space)
        self.spec = EnvSpec(
            id=_spec_id(self.jax_env.name),
            entry_point="jaxsampler.integrations.gymnasium.env:JaxGymnasiumEnv",
            kwargs={"env": self.jax_env, "env_params": env_params},
        )
        self._chain: jax.Array | None = None
        self._state: Any = None
        self._ended = False
        self._warned = False

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Starts an episode.

        Args:
            seed: an int in ``[0, 2**64)`` re-seeds the env (same seed, same episodes);
                ``None`` continues from the last seed (or from OS entropy at first).
            options: ignored.

        Returns:
            ``(observation, info)``: numpy data of :attr:`observation_space`, a dict.

        Raises:
            TypeError, ValueError: a seed that is not an int in range.
        """
        if seed is not None:
            seed = check_seed(seed)
        super().reset(seed=seed)
        if seed is not None:
            self._chain = kernels.seed_chains(np.array([seed], np.uint64))
        elif self._chain is None:
            drawn = self.np_random.integers(0, 2**64, dtype=np.uint64)
            self._chain = kernels.seed_chains(np.array([drawn], np.uint64))
        self._chain, self._state, ts = kernels.reset_all(self.jax_env, self._chain, self.env_params)
        obs, info = jax.device_get((ts.obs, ts.info))
        self._ended = self._warned = False
        return host_obs(self.observation_space, row(row(obs, 0), 0)), host_info(row(info, 0))

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Advances the episode by one step.

        Args:
            action: an element of :attr:`action_space` (numpy data or Python numbers).

        Returns:
            ``(observation, reward, terminated, truncated, info)``: the observation as numpy
            data of :attr:`observation_space`, the reward a float, the flags bools (the time
            limit of ``env_params`` sets ``truncated``; both may be True), info a dict.

        Raises:
            gymnasium.error.ResetNeeded: before the first ``reset``.
            InvalidActionError: an action outside the action space.
        """
        if self._state is None:
            raise gymnasium.error.ResetNeeded("JaxGymnasiumEnv: call reset() before step()")
        if self._ended and not self._warned:
            gymnasium.logger.warn(
                "JaxGymnasiumEnv.step() after the episode ended (terminated or truncated): "
                "call reset(); stepping on continues the finished episode"
            )
            self._warned = True
        act = host_action(self._action_space, action, (), "action")
        act = jax.tree.map(lambda a: a[None, None], act)
        self._chain, self._state, ts = kernels.step_plain(
            self.jax_env, self._chain, self._state, act, self.env_params
        )
        obs, reward, terminated, truncated, info = jax.device_get(
            (ts.obs, ts.reward, ts.terminated, ts.truncated, ts.info)
        )
        terminated, truncated = bool(terminated[0, 0]), bool(truncated[0, 0])
        self._ended = self._ended or terminated or truncated
        return (
            host_obs(self.observation_space, row(row(obs, 0), 0)),
            float(reward[0, 0]),
            terminated,
            truncated,
            host_info(row(info, 0)),
        )

    def render(self) -> np.ndarray | None:  # type: ignore[override]
        """The current state drawn by the env's JAX renderer.

        Returns:
            ``uint8[H, W, 3]`` with ``render_mode="rgb_array"``; ``None`` (and a warning)
            without a render mode, as Gymnasium's envs do.

        Raises:
            gymnasium.error.ResetNeeded: before the first ``reset``.
        """
        drawn = frames(self)
        return None if drawn is None else drawn[0]

    def close(self) -> None:
        """Drops the episode's device state (closing twice is fine)."""
        self._state = None
        self._chain = None
