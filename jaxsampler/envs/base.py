"""The environment protocol, and the two helper bases that env authors subclass.

An :class:`Env` is static configuration (a frozen, hashable object) plus two pure
functions over **one** env::

    reset(key, params) -> (state, TimeStep)
    step(key, state, action, params) -> (state, TimeStep)

``action`` has shape ``[A, *action_space.shape]`` and every ``TimeStep`` leaf a leading
agent axis ``A = num_agents``. ``observation_space`` / ``action_space`` describe one
agent. Tunable numbers (time limit, physics constants) live in ``params``, a pytree, so
changing them never recompiles. Batching over envs happens in :mod:`jaxsampler.vector`.

Env authors rarely write ``reset``/``step`` themselves:

* single-agent envs subclass :class:`SingleAgentEnv` and write plain one-agent logic
  (``reset_env`` / ``step_env`` on unbatched arrays, in gymnax's argument and return
  order); the base class adds the agent axis of size 1, the time limit and the
  terminated/truncated split;
* multi-agent envs subclass :class:`MultiAgentEnv`: the shared world dynamics are
  whole-array code, and each agent's observation, reward, acting flag and done flags
  are written once, for one agent id; the base class lifts them onto the agent axis
  with :func:`jaxsampler.vector.vmap_agents` over ``jnp.arange(num_agents)``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from jaxsampler import vector
from jaxsampler.constants import DEFAULT_AGENT_ID
from jaxsampler.envs.groups import AgentGroup, GroupLayout
from jaxsampler.spaces import Space
from jaxsampler.types import NoInfo, PyTree, TimeStep

__all__ = ["Env", "GroupedMultiAgentEnv", "MultiAgentEnv", "SingleAgentEnv"]


class Env:
    """Base class of all jaxsampler envs. Subclasses must be hashable (frozen dataclasses)."""

    #: Number of agents on the agent axis.
    num_agents: ClassVar[int] = 1
    #: At most this many agents act in any step (``None``: no bound declared). A turn-based
    #: game declares 1; the rollout then runs the policy on the acting agents' rows only
    #: (``E x max_acting`` instead of ``E x A``) when the policy can
    #: (:attr:`jaxsampler.policies.Policy.acts_on_rows`). ``check_env`` and ``debug=True``
    #: rollouts fail on a step where more agents act.
    max_acting: ClassVar[int | None] = None
    #: Every agent's episode ends at the same step (no agent is done while others play
    #: on), as in TicTacToe and every pgx game. A turn-based env (``max_acting``) that
    #: declares it lets the rollout run the critic only on the rows whose value is read
    #: (acting agents, and every agent of an env that resets): an agent done alone would
    #: be bootstrapped from an unread row. ``check_env`` fails a run that breaks it.
    agents_end_together: ClassVar[bool] = False

    @property
    def name(self) -> str:
        """Display name used in messages and reports: the class name unless a subclass
        overrides it (e.g. ``"CartPole-v1"``)."""
        return type(self).__name__

    @property
    def agent_ids(self) -> tuple[str, ...]:
        """Host-side names of the agents, in agent-axis order."""
        if self.num_agents == 1:
            return (DEFAULT_AGENT_ID,)
        return tuple(f"agent_{i}" for i in range(self.num_agents))

    @property
    def agent_layout(self) -> GroupLayout | None:
        """The env's agent groups, each with its own spaces (:mod:`jaxsampler.envs.groups`),
        or ``None``: every agent has :attr:`observation_space` and :attr:`action_space`."""
        return None

    @property
    def observation_spaces(self) -> dict[str, Space]:
        """``agent_id -> space``: each agent's own observation space (RLlib's
        ``MultiAgentEnv.observation_spaces``)."""
        layout = self.agent_layout
        if layout is not None:
            return dict(layout.observation_spaces)
        return {a: self.observation_space for a in self.agent_ids}

    @property
    def action_spaces(self) -> dict[str, Space]:
        """``agent_id -> space``: each agent's own action space."""
        layout = self.agent_layout
        if layout is not None:
            return dict(layout.action_spaces)
        return {a: self.action_space for a in self.agent_ids}

    @property
    def default_params(self) -> Any:
        """The params ``reset``/``step`` use when given none (a pytree, usually a
        ``flax.struct`` dataclass with a ``max_steps_in_episode`` field)."""
        raise NotImplementedError(f"{type(self).__name__} defines no default_params")

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

    def render(self, state: Any, params: Any = None) -> jax.Array:
        """Draws one env's state as an RGB frame.

        Args:
            state: the state of ONE env, unbatched (the pytree :meth:`reset` returns).
            params: the env's params (``default_params`` when None).

        Returns:
            ``uint8[H, W, 3]`` with ``(H, W) == render_shape``.

        Pure JAX; safe under jit and vmap (a batch of states renders with
        ``jax.vmap(env.render, in_axes=(0, None))(states, params)``). Envs that
        override this get ``can_render == True``.

        Raises:
            NotImplementedError: the env has no render (this default).
        """
        raise NotImplementedError(f"{self.name} has no render")

    @property
    def can_render(self) -> bool:
        """Whether :meth:`render` is implemented: True where a subclass overrides it.

        Wrappers that forward ``render`` to an inner env override this to ask that env.
        """
        return type(self).render is not Env.render

    @property
    def render_shape(self) -> tuple[int, int]:
        """The static ``(H, W)`` of :meth:`render`'s frames.

        By default found by tracing :meth:`render` on a reset state (no computation);
        envs override it with the known size.

        Raises:
            NotImplementedError: the env has no render.
        """
        if not self.can_render:
            raise NotImplementedError(f"{self.name} has no render")
        params = self.default_params

        def first_frame(key: jax.Array) -> jax.Array:
            state, _ = self.reset(key, params)
            return self.render(state, params)

        frame = jax.eval_shape(first_frame, jax.random.key(0))
        return (int(frame.shape[0]), int(frame.shape[1]))


class SingleAgentEnv(Env):
    """Helper base for single-agent envs written as one-agent, unbatched logic.

    Subclasses implement, in gymnax's argument and return order:

    * ``reset_env(key, params) -> (obs, state)``; ``state`` must have an int32 ``time``.
    * ``step_env(key, state, action, params) -> (obs, state, reward, terminated, info)``
      for an unbatched ``action`` (shape ``action_space.shape``). ``terminated`` is the
      MDP's own end only: ``step_env`` does not touch ``state.time``; the base class
      counts steps and sets ``truncated`` once ``time >= params.max_steps_in_episode``
      (independently of ``terminated``, as Gymnasium's ``TimeLimit`` does).
    * ``info`` must have the same structure after reset and step; ``reset_info``
      returns the reset-time value (default :class:`NoInfo`).

    Porting a gymnax env: the signatures match, but gymnax's ``step_env`` increments
    ``state.time`` itself and returns ``done`` (termination or time limit); here the base
    class owns the clock, so drop that increment and return the termination alone, or
    episodes are cut at half the limit (:func:`jaxsampler.check_env` reports it).

    Note the order differs from :meth:`Env.reset` / :meth:`Env.step`, which return the
    state first: those are the library's batched protocol, these gymnax's.
    """

    num_agents: ClassVar[int] = 1

    def reset_env(self, key: jax.Array, params: Any) -> tuple[PyTree, Any]:
        """Starts an episode: ``(obs, state)`` for one agent, no agent axis."""
        raise NotImplementedError

    def step_env(
        self, key: jax.Array, state: Any, action: jax.Array, params: Any
    ) -> tuple[PyTree, Any, jax.Array, jax.Array, Any]:
        """One step: ``(obs, state, reward, terminated, info)``, no agent axis."""
        raise NotImplementedError

    def reset_info(self, params: Any) -> Any:
        """The ``info`` reported at reset (the structure ``step_env`` returns)."""
        return NoInfo()

    def reset(self, key: jax.Array, params: Any = None) -> tuple[Any, TimeStep]:
        """Starts an episode: :meth:`reset_env` with an agent axis of size 1 added.

        The reset :class:`TimeStep` has reward 0, both done flags False, ``acting`` True and
        :meth:`reset_info`'s info; ``params`` defaults to :attr:`default_params`. Pure; safe
        under jit and vmap.
        """
        params = self.default_params if params is None else params
        obs, state = self.reset_env(key, params)
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
        """One step of :meth:`step_env` on ``action[0]`` (``action``: ``[1, *action_space.shape]``).

        Advances ``state.time`` by one and sets ``truncated`` once it reaches
        ``params.max_steps_in_episode`` (independently of ``terminated``). Every
        :class:`TimeStep` leaf gets an agent axis of size 1 (reward ``float32[1]``, flags
        ``bool[1]``, ``acting`` True). Pure; safe under jit and vmap.
        """
        params = self.default_params if params is None else params
        action = jax.tree.map(lambda a: a[0], action)  # drop the agent axis (A = 1)
        obs, state, reward, terminated, info = self.step_env(key, state, action, params)
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


class MultiAgentEnv(Env):
    """Helper base for multi-agent envs: whole-array world, per-agent logic per agent id.

    The world (positions, a board, the clock) is one state pytree stepped by whole-array
    code; what each agent sees and gets is written once, for one agent, and lifted onto
    the agent axis with :func:`jaxsampler.vector.vmap_agents` over
    ``jnp.arange(num_agents)`` (the way :class:`SingleAgentEnv` lifts one-agent logic).
    Subclasses implement:

    * ``reset_world(key, params) -> state``: a new world.
    * ``step_world(key, state, action, params) -> (state, shared)``: the world dynamics
      under every agent's action (``action``: ``[A, *action_space.shape]``; the actions
      of agents that are not acting must be ignored). ``shared`` is any pytree of this
      step's facts the agents' rewards read (a team reward, who moved), ``()`` if none.
    * ``agent_rows(state)``: the agent-major part of ``state`` (a pytree, leaves
      ``[A, ...]``, default ``()``); each per-agent function gets its own row as ``own``.
      ``vmap`` hands out these rows as slices, where ``x[agent_id]`` would be a gather:
      read your own data from ``own``, other agents' from ``state``.
    * ``agent_obs(agent_id, own, state, params)``: one agent's observation.
    * ``agent_reward(agent_id, own, state, shared, params)``: one agent's reward (a
      scalar) for the step that produced ``state``.
    * optionally ``agent_terminated`` / ``agent_truncated`` / ``agent_acting``
      ``(agent_id, own, state, params)`` (scalars; by default: never terminated,
      truncated once ``state.time >= params.max_steps_in_episode``, acting while
      neither), and ``info(state, params)`` (whole-env, default :class:`NoInfo`).

    ``agent_id`` is a traced ``int32[]`` index on the agent axis, so per-agent code
    selects with it (``jnp.where``, indexing), never with Python ``if``. At reset every
    agent's reward is 0 and its flags are False. Per-agent flags must be sticky once an
    agent is done (keep them in ``state``); the episode ends when every agent is
    terminated or truncated. Reset and step are pure; safe under jit and vmap.
    """

    def reset_world(self, key: jax.Array, params: Any) -> Any:
        """A new world: one env's state pytree at an episode start (subclasses implement it).

        Whole-array code, no agent lifting; the agents' first observations are then read from
        the returned state by :meth:`agent_obs`. Pure; safe under jit and vmap.
        """
        raise NotImplementedError

    def step_world(self, key: jax.Array, state: Any, action: Any, params: Any) -> tuple[Any, Any]:
        """Advances the world one step under every agent's action (subclasses implement it).

        Args:
            key: this step's PRNG key.
            state: the world before the step.
            action: ``[A, *action_space.shape]``; entries of agents that are not acting must be
                ignored.
            params: the env's params.

        Returns:
            ``(state, shared)``: the new world and a pytree of this step's facts that
            :meth:`agent_reward` reads (``()`` if none). Pure; safe under jit and vmap.
        """
        raise NotImplementedError

    def agent_rows(self, state: Any) -> PyTree:
        """The agent-major part of ``state`` (leaves ``[A, ...]``), handed to each per-agent
        function as its own slice ``own``; default ``()`` (everything is read from ``state``)."""
        return ()

    def agent_obs(self, agent_id: jax.Array, own: Any, state: Any, params: Any) -> PyTree:
        """One agent's observation (an element of :attr:`observation_space`, no agent axis).

        ``agent_id`` is a traced ``int32[]``; ``own`` is the agent's row of :meth:`agent_rows`.
        Subclasses implement it; it runs under ``vmap`` over the agent ids.
        """
        raise NotImplementedError

    def agent_reward(
        self, agent_id: jax.Array, own: Any, state: Any, shared: Any, params: Any
    ) -> jax.Array:
        """One agent's reward (a scalar) for the step that produced ``state``.

        ``shared`` is what :meth:`step_world` returned with ``state``. Not called at reset,
        where every reward is 0. Subclasses implement it; it runs under ``vmap`` over the
        agent ids.
        """
        raise NotImplementedError

    def agent_terminated(self, agent_id: jax.Array, own: Any, state: Any, params: Any) -> jax.Array:
        """Whether the agent is terminated (``bool[]``); by default never. Must stay True once
        set (keep the flag in ``state``)."""
        return jnp.zeros((), jnp.bool_)

    def agent_truncated(self, agent_id: jax.Array, own: Any, state: Any, params: Any) -> jax.Array:
        """Whether the agent is truncated (``bool[]``); by default once ``state.time >=
        params.max_steps_in_episode``."""
        return jnp.asarray(state.time >= params.max_steps_in_episode)

    def agent_acting(self, agent_id: jax.Array, own: Any, state: Any, params: Any) -> jax.Array:
        """Whether the agent acts on this observation (``bool[]``); by default while it is
        neither terminated nor truncated. Turn-based envs override it."""
        terminated = self.agent_terminated(agent_id, own, state, params)
        return ~(terminated | self.agent_truncated(agent_id, own, state, params))

    def info(self, state: Any, params: Any) -> PyTree:
        """The whole env's ``info`` (no agent axis), of the same structure after reset and step;
        by default :class:`NoInfo`."""
        return NoInfo()

    def for_each_agent(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(agent_id, *args)`` for every agent id, stacked on a leading agent axis.

        ``args`` are shared by all agents (not split); the outputs get a leading ``[A]``.
        Public so world code can reuse per-agent functions (e.g. to store each agent's
        observation in the state).
        """
        lifted = vector.vmap_agents(fn, in_axes=(0,) + (None,) * len(args))
        return lifted(jnp.arange(self.num_agents, dtype=jnp.int32), *args)

    def _lift(self, fn: Callable[..., Any], state: Any, *args: Any) -> Any:
        """``fn(agent_id, own, state, *args)`` for every agent: ids and ``agent_rows``
        mapped, the rest shared."""
        lifted = vector.vmap_agents(fn, in_axes=(0, 0) + (None,) * (1 + len(args)))
        ids = jnp.arange(self.num_agents, dtype=jnp.int32)
        return lifted(ids, self.agent_rows(state), state, *args)

    def all_obs(self, state: Any, params: Any) -> PyTree:
        """Every agent's observation of ``state``, on the agent axis (:meth:`agent_obs` lifted)."""
        return self._lift(self.agent_obs, state, params)

    def reset_timestep(self, state: Any, params: Any) -> TimeStep:
        """The :class:`TimeStep` of a freshly reset ``state`` (reward 0, flags False)."""
        a = self.num_agents
        return TimeStep(
            obs=self.all_obs(state, params),
            reward=jnp.zeros((a,), jnp.float32),
            terminated=jnp.zeros((a,), jnp.bool_),
            truncated=jnp.zeros((a,), jnp.bool_),
            acting=self._lift(self.agent_acting, state, params).astype(jnp.bool_),
            info=self.info(state, params),
        )

    def reset(self, key: jax.Array, params: Any = None) -> tuple[Any, TimeStep]:
        """Starts an episode: :meth:`reset_world`, then the agents' observations and acting
        flags on the agent axis (:meth:`reset_timestep`: reward 0, done flags False).

        ``params`` defaults to :attr:`default_params`. Pure; safe under jit and vmap.
        """
        params = self.default_params if params is None else params
        state = self.reset_world(key, params)
        return state, self.reset_timestep(state, params)

    def step(
        self, key: jax.Array, state: Any, action: Any, params: Any = None
    ) -> tuple[Any, TimeStep]:
        """Steps the world (:meth:`step_world`), then evaluates every per-agent function on the
        new state.

        Returns ``(state, timestep)`` with :class:`TimeStep` leaves ``[A, ...]`` (reward
        ``float32[A]``, flags ``bool[A]``) and :meth:`info`. ``params`` defaults to
        :attr:`default_params`. Pure; safe under jit and vmap.
        """
        params = self.default_params if params is None else params
        state, shared = self.step_world(key, state, action, params)
        reward = self._lift(self.agent_reward, state, shared, params)
        ts = TimeStep(
            obs=self.all_obs(state, params),
            reward=reward.astype(jnp.float32),
            terminated=self._lift(self.agent_terminated, state, params).astype(jnp.bool_),
            truncated=self._lift(self.agent_truncated, state, params).astype(jnp.bool_),
            acting=self._lift(self.agent_acting, state, params).astype(jnp.bool_),
            info=self.info(state, params),
        )
        return state, ts


class GroupedMultiAgentEnv(MultiAgentEnv):
    """A :class:`MultiAgentEnv` whose agents come in groups with their own spaces.

    Subclasses declare :attr:`agent_groups` (:class:`jaxsampler.envs.groups.AgentGroup` s, in
    agent-axis order; :attr:`num_agents` must equal the agents they list) and write each
    agent's observation per group, instead of :meth:`agent_obs`:

    * ``group_obs(group, agent_id, own, state, params)``: one agent of group ``group`` (a
      static ``str``: branch on it with Python ``if``) sees an element of that group's
      observation space. ``agent_id`` is the agent's traced index on the whole agent axis;
      ``own`` its row of :meth:`agent_rows`. It runs under ``vmap`` over the group's agents.

    ``step_world`` gets the carrier actions ``[A, ...]``; :meth:`group_actions` turns them into
    each group's own actions. Rewards and flags are scalars, written per agent as before.
    The rollout carries the carrier spaces (:attr:`observation_space`,
    :attr:`action_space`); :attr:`observation_spaces` / :attr:`action_spaces` give each
    agent's own, and episodes, batches and policies mapped to a group see those.
    """

    @property
    def agent_groups(self) -> tuple[AgentGroup, ...]:
        """The agent groups, in agent-axis order (subclasses implement it)."""
        raise NotImplementedError

    @property
    def agent_layout(self) -> GroupLayout:
        layout = _layout(tuple(self.agent_groups))
        if layout.num_agents != self.num_agents:
            raise ValueError(
                f"{self.name}: num_agents is {self.num_agents} but its agent groups list "
                f"{layout.num_agents} agents ({list(layout.agent_ids)})"
            )
        return layout

    @property
    def agent_ids(self) -> tuple[str, ...]:
        return self.agent_layout.agent_ids

    @property
    def observation_space(self) -> Space:
        """The carrier observation space of the agent axis (every group's, flattened, padded)."""
        return self.agent_layout.observation_space

    @property
    def action_space(self) -> Space:
        """The carrier action space of the agent axis."""
        return self.agent_layout.action_space

    def group_obs(
        self, group: str, agent_id: jax.Array, own: Any, state: Any, params: Any
    ) -> PyTree:
        """One agent of ``group``'s observation, in that group's space (subclasses implement it)."""
        raise NotImplementedError

    def group_actions(self, action: Any) -> dict[str, Any]:
        """``group -> [A_g, *that group's action shape]``: the carrier actions ``[A, ...]`` of
        :meth:`step_world` split by group and unpacked to each group's own space."""
        layout = self.agent_layout
        out = {}
        for g in layout.groups:
            start, stop = layout.slots(g.name)
            out[g.name] = layout.unpack_action(g.name, action[start:stop])
        return out

    def all_obs(self, state: Any, params: Any) -> PyTree:
        layout = self.agent_layout
        rows = self.agent_rows(state)
        parts = []
        for g in layout.groups:
            start, stop = layout.slots(g.name)
            fn = functools.partial(self.group_obs, g.name)
            lifted = vector.vmap_agents(fn, in_axes=(0, 0, None, None))
            ids = jnp.arange(start, stop, dtype=jnp.int32)
            own = jax.tree.map(lambda x, a=start, b=stop: x[a:b], rows)
            parts.append(layout.pack_obs(g.name, lifted(ids, own, state, params)))
        return jnp.concatenate(parts, axis=0)


@functools.lru_cache(maxsize=256)
def _layout(groups: tuple[AgentGroup, ...]) -> GroupLayout:
    """One layout per distinct groups (building one checks them)."""
    return GroupLayout(groups)
