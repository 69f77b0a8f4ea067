"""The environment protocol.

An :class:`Env` is static configuration (a frozen, hashable object) plus two pure
functions over **one** env::

    reset(key, params) -> (state, TimeStep)
    step(key, state, action, params) -> (state, TimeStep)

``action`` has shape ``[A, *action_space.shape]`` and every ``TimeStep`` leaf a leading
agent axis ``A = num_agents``. ``observation_space`` / ``action_space`` describe one
agent. Tunable numbers (time limit, physics constants) live in ``params``, a pytree, so
changing them never recompiles. Batching over envs happens in :mod:`jaxsampler.vector`.

Single-agent envs subclass :class:`SingleAgentEnv` and write plain one-agent logic
(``reset_env`` / ``step_env`` on unbatched arrays); the base class adds the agent axis of
size 1, the time limit and the terminated/truncated split.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from jaxsampler.constants import DEFAULT_AGENT_ID
from jaxsampler.spaces import Space
from jaxsampler.types import NoInfo, TimeStep

__all__ = ["Env", "EnvParams", "SingleAgentEnv"]

#: Agent id of single-agent envs on the host (RLlib uses the same default).


@struct.dataclass
class EnvParams:
    """Base of env parameters: the episode time limit (a traced number, not static)."""

    max_steps_in_episode: int = 500


class Env:
    """Base class of all jaxsampler envs. Subclasses must be hashable (frozen dataclasses)."""

    #: Number of agents on the agent axis.
    num_agents: ClassVar[int] = 1

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def agent_ids(self) -> tuple[str, ...]:
        """Host-side names of the agents, in agent-axis order."""
        if self.num_agents == 1:
            return (DEFAULT_AGENT_ID,)
        return tuple(f"agent_{i}" for i in range(self.num_agents))

    @property
    def default_params(self) -> Any:
        return EnvParams()

    @property
    def observation_space(self) -> Space:
        """Space of one agent's observation."""
        raise NotImplementedError

    @property
    def action_space(self) -> Space:
        """Space of one agent's action."""
        raise NotImplementedError

    def reset(self, key: jax.Array, params: Any = None) -> tuple[Any, TimeStep]:
        """Starts an episode. Pure; safe under jit and vmap."""
        raise NotImplementedError

    def step(
        self, key: jax.Array, state: Any, action: Any, params: Any = None
    ) -> tuple[Any, TimeStep]:
        """Advances one step with ``action`` of shape ``[A, *action_space.shape]``.

        Pure; safe under jit and vmap. Calling ``step`` on a finished episode is
        undefined; the vector layer resets instead (see :mod:`jaxsampler.types`).
        """
        raise NotImplementedError


class SingleAgentEnv(Env):
    """Helper base for single-agent envs written as one-agent, unbatched logic.

    Subclasses implement:

    * ``reset_env(key, params) -> (state, obs)``; ``state`` must have an int32 ``time``.
    * ``step_env(key, state, action, params) -> (state, obs, reward, terminated, info)``
      for an unbatched ``action`` (shape ``action_space.shape``). ``step_env`` does not
      touch ``state.time``: the base class counts steps and sets ``truncated`` once
      ``time >= params.max_steps_in_episode`` (independently of ``terminated``, as
      Gymnasium's ``TimeLimit`` does).
    * ``info`` must have the same structure after reset and step; ``reset_info``
      returns the reset-time value (default :class:`NoInfo`).
    """

    num_agents: ClassVar[int] = 1

    def reset_env(self, key: jax.Array, params: Any) -> tuple[Any, Any]:
        raise NotImplementedError

    def step_env(
        self, key: jax.Array, state: Any, action: jax.Array, params: Any
    ) -> tuple[Any, Any, jax.Array, jax.Array, Any]:
        raise NotImplementedError

    def reset_info(self, params: Any) -> Any:
        return NoInfo()

    def reset(self, key: jax.Array, params: Any = None) -> tuple[Any, TimeStep]:
        params = self.default_params if params is None else params
        state, obs = self.reset_env(key, params)
        ts = TimeStep(
            obs=jax.tree.map(lambda x: x[None], obs),
            reward=jnp.zeros((1,), jnp.float32),
            terminated=jnp.zeros((1,), jnp.bool_),
            truncated=jnp.zeros((1,), jnp.bool_),
            acting=jnp.ones((1,), jnp.bool_),
            info=self.reset_info(params),
        )
        return state, ts

    def step(
        self, key: jax.Array, state: Any, action: Any, params: Any = None
    ) -> tuple[Any, TimeStep]:
        params = self.default_params if params is None else params
        action = jax.tree.map(lambda a: a[0], action)  # drop the agent axis (A = 1)
        state, obs, reward, terminated, info = self.step_env(key, state, action, params)
        state = state.replace(time=state.time + 1)
        truncated = state.time >= params.max_steps_in_episode
        ts = TimeStep(
            obs=jax.tree.map(lambda x: x[None], obs),
            reward=jnp.reshape(reward, (1,)).astype(jnp.float32),
            terminated=jnp.reshape(terminated, (1,)).astype(jnp.bool_),
            truncated=jnp.reshape(truncated, (1,)).astype(jnp.bool_),
            acting=jnp.ones((1,), jnp.bool_),
            info=info,
        )
        return state, ts
