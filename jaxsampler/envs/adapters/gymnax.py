"""Adapter: any gymnax environment as a jaxsampler :class:`~jaxsampler.envs.base.Env`.

The adapter calls gymnax's ``reset_env`` / ``step_env`` (not gymnax's auto-resetting
``step``): jaxsampler's vector layer does the auto-reset, so no reset is computed twice.
``terminated`` is what ``step_env`` reports; ``truncated`` is gymnax's
``is_truncated(state, params)`` (``state.time >= params.max_steps_in_episode``), kept
separate. gymnax 1.0's built-ins report natural termination only; an older-style env
whose ``is_terminal`` also includes the time limit reports ``terminated`` at the limit
as well, which the adapter cannot undo.

``info`` is gymnax's info dict; at reset it holds zeros of the same structure (so
``reset`` and ``step`` return identical pytrees).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxsampler.envs.base import Env
from jaxsampler.spaces import Space, from_gymnax_space
from jaxsampler.types import TimeStep

__all__ = ["GymnaxEnv", "from_gymnax", "make_gymnax"]


@dataclasses.dataclass(frozen=True, eq=False)
class GymnaxEnv(Env):
    """Wraps ``env`` (a ``gymnax.environments.environment.Environment``).

    Args:
        env: the gymnax env object.
        params: its ``EnvParams``; defaults to ``env.default_params``. The spaces are
            derived from these params; other params may be passed to ``reset``/``step``.
        env_id: a display name.
    """

    env: Any
    params: Any = None
    env_id: str | None = None

    def __post_init__(self) -> None:
        if self.params is None:
            object.__setattr__(self, "params", self.env.default_params)

    # Hash/eq by identity of the wrapped env and params: envs are static configuration.
    def __hash__(self) -> int:
        return hash((id(self.env), id(self.params), self.env_id))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, GymnaxEnv)
            and other.env is self.env
            and other.params is self.params
            and other.env_id == self.env_id
        )

    @property
    def name(self) -> str:
        return f"gymnax:{self.env_id or self.env.name}"

    @property
    def default_params(self) -> Any:
        return self.params

    @property
    def observation_space(self) -> Space:
        return from_gymnax_space(self.env.observation_space(self.params))

    @property
    def action_space(self) -> Space:
        return from_gymnax_space(self.env.action_space(self.params))

    def _info_zeros(self, params: Any) -> Any:
        key = jax.random.PRNGKey(0)
        shapes = jax.eval_shape(
            lambda: self.env.step_env(
                key, self.env.reset_env(key, params)[1], self.action_space.zeros(), params
            )[4]
        )
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def reset(self, key: jax.Array, params: Any = None) -> tuple[Any, TimeStep]:
        params = self.params if params is None else params
        obs, state = self.env.reset_env(key, params)
        return state, TimeStep(
            obs=jax.tree.map(lambda x: jnp.asarray(x)[None], obs),
            reward=jnp.zeros((1,), jnp.float32),
            terminated=jnp.zeros((1,), jnp.bool_),
            truncated=jnp.zeros((1,), jnp.bool_),
            acting=jnp.ones((1,), jnp.bool_),
            info=self._info_zeros(params),
        )

    def step(
        self, key: jax.Array, state: Any, action: Any, params: Any = None
    ) -> tuple[Any, TimeStep]:
        params = self.params if params is None else params
        action = jax.tree.map(lambda a: a[0], action)
        obs, state, reward, terminated, info = self.env.step_env(key, state, action, params)
        truncated = self.env.is_truncated(state, params)
        info = jax.tree.map(jnp.asarray, info)
        return state, TimeStep(
            obs=jax.tree.map(lambda x: jnp.asarray(x)[None], obs),
            reward=jnp.reshape(reward, (1,)).astype(jnp.float32),
            terminated=jnp.reshape(terminated, (1,)).astype(jnp.bool_),
            truncated=jnp.reshape(truncated, (1,)).astype(jnp.bool_),
            acting=jnp.ones((1,), jnp.bool_),
            info=info,
        )


def from_gymnax(env: Any, params: Any = None, env_id: str | None = None) -> GymnaxEnv:
    """Wraps a gymnax env object (and optionally its params) as a jaxsampler env."""
    if not hasattr(env, "step_env") or not hasattr(env, "reset_env"):
        raise TypeError(f"expected a gymnax Environment, got {type(env).__name__}")
    return GymnaxEnv(env, params, env_id)


def make_gymnax(env_id: str, **kwargs: Any) -> GymnaxEnv:
    """``gymnax.make(env_id, **kwargs)`` wrapped as a jaxsampler env."""
    import gymnax

    if env_id not in gymnax.registered_envs:
        import difflib

        close = difflib.get_close_matches(env_id, gymnax.registered_envs, n=3)
        hint = f" Did you mean {', '.join(repr('gymnax:' + c) for c in close)}?" if close else ""
        raise ValueError(f"unknown gymnax env id {env_id!r}.{hint}")
    env, params = gymnax.make(env_id, **kwargs)
    return GymnaxEnv(env, params, env_id)
