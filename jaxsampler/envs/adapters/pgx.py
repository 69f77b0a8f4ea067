"""Adapter: pgx board games (and pgx's single-player games) as jaxsampler envs.

``js.envs.from_pgx(pgx.make("tic_tac_toe"))`` or ``js.make("pgx:tic_tac_toe")``. The pgx env's
players become the agent axis, ``A = env.num_players`` (``agent_0`` is pgx player 0);
single-player games (``2048``, ``minatar-*``) have ``A = 1``.

What one step does (pgx's own ``init(key)`` / ``step(state, action, key)``; the adapter's
state *is* the pgx ``State``):

* the action is ``int32[A]``, one entry per agent; only the entry of
  ``state.current_player`` is played, the others are ignored (as for
  :class:`~jaxsampler.envs.tictactoe.TicTacToe`). The step key is passed to pgx, so
  stochastic games (``2048``, ``backgammon``, the poker games) draw their chance events
  from the sampler's per-env key;
* ``acting`` is the one-hot of ``current_player``, and nobody once the game is over (pgx
  keeps a player id at terminal states: it is masked, never read);
* ``reward[A]`` is pgx's ``state.rewards``: every player's reward at every step, the
  waiting player's included. On the host a reward of an agent that is not acting is
  credited to that agent's last action (RLlib's hanging rewards), so a multi-agent
  episode's per-agent return is pgx's cumulative reward of that player;
* ``terminated`` is pgx's ``terminated`` for every agent (a game ends for all players at
  once); ``truncated`` is pgx's ``truncated``, or the adapter's own time limit
  (:class:`PgxParams` ``.max_steps_in_episode``, counted in pgx's ``_step_count``; default:
  none), for games not terminated. pgx punishes an illegal move by ending the game (the
  mover gets ``-1``, the others ``+1``), which passes through unchanged;
* observations are per agent: agent ``i`` gets ``env.observe(state, i)``, its own view
  (pgx's ``state.observation`` is only the current player's). No auto-reset: the final
  observation is kept.

By default (``masked_obs=True``) each agent's observation is a masked observation
``Dict(observations=<pgx observation>, action_mask=bool[num_actions])`` holding pgx's
``legal_action_mask`` (the same mask for every agent; all True at terminal states, as pgx
sets it), so masking policies (``js.RandomPolicy``, ``js.MLPPolicy`` on that space) play
only legal moves. ``masked_obs=False`` gives the plain pgx observation. The observation
keeps pgx's dtype (``bool`` boards are ``Box(0, 1, bool)``). ``info`` is empty. pgx draws
with SVG on the host, so the adapter has no ``render``.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsampler.constants import MASK_KEY, OBS_KEY
from jaxsampler.envs.adapters.common import SuiteEnv, import_suite, unknown_id, wrong_suite
from jaxsampler.spaces import Box, Dict, Discrete
from jaxsampler.types import NoInfo, TimeStep

__all__ = ["PgxEnv", "PgxParams", "from_pgx", "make_pgx", "pgx_observation_space"]

#: Default adapter time limit: the largest int32, i.e. no limit in practice.
NO_TIME_LIMIT = 2**31 - 1


@struct.dataclass
class PgxParams:
    """Params of the adapter: its own time limit in moves (pgx envs take no params)."""

    max_steps_in_episode: int = NO_TIME_LIMIT


# One shared default instance: adapters compare params by identity, so two default-wrapped
# copies of the same pgx env are equal (and share compiled code).
_DEFAULT_PARAMS = PgxParams()


def pgx_observation_space(shape: tuple[int, ...], dtype: Any) -> Box:
    """The ``Box`` of a pgx observation of ``shape`` and ``dtype``: ``[0, 1]`` for bool,
    the dtype's range for ints, unbounded for floats."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return Box(0, 1, shape, np.bool_)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return Box(info.min, info.max, shape, dtype)
    return Box(-np.inf, np.inf, shape, dtype)


def _observe(env: Any, state: Any, player_id: jax.Array) -> jax.Array:
    # pgx 2.x warns that the player argument of `observe` is deprecated; it is the only
    # public way to get the waiting player's view, so the warning is silenced here.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*player_id.*", category=DeprecationWarning)
        return env.observe(state, player_id)


@dataclasses.dataclass(frozen=True, eq=False)
class PgxEnv(SuiteEnv):
    """Wraps a pgx ``Env`` (see the module docstring).

    Args:
        env: the pgx env, e.g. ``pgx.make("connect_four")``.
        params: adapter params; defaults to ``PgxParams()`` (no time limit).
        env_id: a display name (default: pgx's ``env.id``).
        masked_obs: observations are ``Dict(observations=..., action_mask=...)``.

    Raises:
        TypeError: ``env`` is not a pgx ``Env``.
    """

    masked_obs: bool = True

    suite: ClassVar[str] = "pgx"
    #: pgx's games are played in turns: only ``current_player`` moves.
    max_acting: ClassVar[int | None] = 1
    agents_end_together: ClassVar[bool] = True  # (the game ends for both players)

    def __post_init__(self) -> None:
        pgx = import_suite("pgx", "pgx")
        if not isinstance(self.env, pgx.Env):
            raise wrong_suite("from_pgx", "a pgx.Env (e.g. pgx.make('tic_tac_toe'))", self.env)
        if self.params is None:
            object.__setattr__(self, "params", _DEFAULT_PARAMS)
        if self.env_id is None:
            object.__setattr__(self, "env_id", str(self.env.id))
        object.__setattr__(self, "num_agents", int(self.env.num_players))
        first = jax.eval_shape(self.env.init, jax.random.key(0))
        obs = pgx_observation_space(tuple(first.observation.shape), first.observation.dtype)
        n = int(first.legal_action_mask.shape[-1])
        masked = Dict({OBS_KEY: obs, MASK_KEY: Box(0, 1, (n,), np.bool_)})
        self._set_spaces(masked if self.masked_obs else obs, Discrete(n))

    def observe(self, state: Any) -> Any:
        """Every agent's observation of a pgx ``state``: leaves ``[A, ...]`` (with
        ``masked_obs``, a dict of ``"observations"`` and the ``"action_mask"``). Pure."""
        A = self.num_agents
        obs = jax.vmap(lambda i: _observe(self.env, state, i))(jnp.arange(A, dtype=jnp.int32))
        if not self.masked_obs:
            return obs
        mask = jnp.broadcast_to(state.legal_action_mask, (A,) + state.legal_action_mask.shape)
        return {OBS_KEY: obs, MASK_KEY: mask}

    def _timestep(self, state: Any, params: PgxParams) -> TimeStep:
        A = self.num_agents
        terminated = jnp.broadcast_to(jnp.asarray(state.terminated, jnp.bool_), (A,))
        limit = jnp.asarray(state._step_count >= params.max_steps_in_episode, jnp.bool_)
        truncated = jnp.broadcast_to(
            ~terminated & (jnp.asarray(state.truncated, jnp.bool_) | limit), (A,)
        )
        ids = jnp.arange(A, dtype=jnp.int32)
        acting = (ids == state.current_player) & ~(terminated | truncated)
        return TimeStep(
            obs=self.observe(state),
            reward=jnp.asarray(state.rewards, jnp.float32).reshape((A,)),
            terminated=terminated,
            truncated=truncated,
            acting=acting,
            info=NoInfo(),
        )

    def reset(self, key: jax.Array, params: PgxParams | None = None) -> tuple[Any, TimeStep]:
        """pgx's ``init(key)``: the pgx ``State`` and its :class:`TimeStep`. Pure; safe
        under jit and vmap."""
        params = self.params if params is None else params
        state = self.env.init(key)
        return state, self._timestep(state, params)

    def step(
        self, key: jax.Array, state: Any, action: jax.Array, params: PgxParams | None = None
    ) -> tuple[Any, TimeStep]:
        """pgx's ``step(state, action[current_player], key)`` for ``action: int[A]``.

        Pure; safe under jit and vmap.
        """
        params = self.params if params is None else params
        player = jnp.clip(state.current_player, 0, self.num_agents - 1)
        # the mover's entry by a masked sum, not an index: one elementwise op under vmap
        # where a gather would be a separate kernel per step (the same integer)
        ids = jnp.arange(self.num_agents, dtype=jnp.int32)
        action = jnp.asarray(action, jnp.int32).reshape((self.num_agents,))
        move = jnp.sum(jnp.where(ids == player, action, 0))
        state = self.env.step(state, move, key)
        return state, self._timestep(state, params)


def from_pgx(
    env: Any, params: PgxParams | None = None, env_id: str | None = None, masked_obs: bool = True
) -> PgxEnv:
    """Wraps a pgx ``Env`` as a jaxsampler env (players on the agent axis).

    Args:
        env: e.g. ``pgx.make("tic_tac_toe")``.
        params: adapter params (:class:`PgxParams`), e.g. a time limit that truncates.
        env_id: a display name (default: pgx's id).
        masked_obs: publish the legal-action mask in the observation (default True).

    Raises:
        ImportError: pgx is not installed (``pip install -e ".[pgx]"``).
        TypeError: ``env`` is not a pgx ``Env``.
    """
    return PgxEnv(env, params, env_id, masked_obs)


def make_pgx(
    env_id: str, params: PgxParams | None = None, masked_obs: bool = True, **kwargs: Any
) -> PgxEnv:
    """``pgx.make(env_id)`` wrapped as a jaxsampler env (``js.make("pgx:<id>")``).

    Args:
        env_id: a pgx id (``pgx.available_envs()``), e.g. ``"connect_four"``.
        params: adapter params (:class:`PgxParams`).
        masked_obs: publish the legal-action mask in the observation (default True).
        **kwargs: passed to ``pgx.make``.

    Raises:
        ImportError: pgx is not installed (``pip install -e ".[pgx]"``).
        ValueError: an id pgx does not offer (the message lists them).
    """
    pgx = import_suite("pgx", "pgx")
    ids = tuple(pgx.available_envs())
    if env_id not in ids:
        raise unknown_id("pgx", env_id, ids)
    return PgxEnv(pgx.make(env_id, **kwargs), params, env_id, masked_obs)
