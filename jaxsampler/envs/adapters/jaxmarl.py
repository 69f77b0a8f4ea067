"""Adapter: a JaxMARL-style multi-agent env as a jaxsampler :class:`~jaxsampler.envs.base.Env`.

The wrapped object is duck-typed; it needs what JaxMARL's ``MultiAgentEnv`` provides:

* ``agents``: the agent names (their order becomes the agent axis), ``num_agents``;
* ``reset(key) -> (obs_dict, state)``;
* ``step_env(key, state, actions_dict) -> (obs_dict, state, reward_dict, done_dict,
  info)``, the transition without JaxMARL's internal auto-reset (jaxsampler's vector
  layer resets). Objects without ``step_env`` are stepped with ``step`` instead, which
  in JaxMARL resets internally: the final observation of an episode is then the next
  episode's first one;
* ``observation_space(agent)`` / ``action_space(agent)`` returning gymnax-like spaces
  (JaxMARL's, gymnax's or jaxsampler's Box / Discrete / MultiDiscrete / Dict / Tuple).

Agents that share one observation space and one action space (MPE's ``simple_spread``,
SMAX, Overcooked, ...) sit on the agent axis in ``env.agents`` order with that space, and
the adapter has no :attr:`~jaxsampler.envs.base.Env.agent_layout`. Agents whose spaces
differ (``simple_tag``'s adversaries and prey, ``halfcheetah_6x1``'s joints) become *agent
groups* (:mod:`jaxsampler.envs.groups`): agents with equal (observation, action) spaces form
one group, named after the agents (``"adversary"``, ``"agent"``; ``"group_<i>"`` where the
names do not say it), groups in order of their first agent in ``env.agents``. The agent
axis runs group by group, so where a group's agents are not contiguous in ``env.agents``
(``hopper_3x1``: ``agent_0, agent_2, agent_1``) :attr:`agent_ids` gives the axis order, and
every dict (observations, actions, rewards, dones) is matched by agent name both ways. The
axis holds the layout's carrier spaces: each agent's observation flattened and padded with
zeros, each action unpacked to the agent's own space before it reaches JaxMARL (a discrete
carrier action is passed as is: a policy must not send an agent an index beyond its own
``Discrete(n)``). :attr:`observation_spaces` / :attr:`action_spaces` give each agent's own
space. Groups carry Box observations and actions that are all Discrete or all Box; other
mixes are refused with the agents and their spaces named.

Dicts become arrays on the agent axis, in :attr:`agent_ids` order. JaxMARL agents act in
lockstep, so ``acting`` is every agent that is not done (``get_avail_actions`` is not
used: legality masks are the wrapped env's business). JaxMARL reports one ``done`` per
agent and no truncation: ``done[agent]`` becomes ``terminated`` (also when JaxMARL ends
an episode because of its own step limit, e.g. MPE's ``max_steps``). The flags are made
sticky: a done agent stays terminated, stops acting, gets reward 0 and keeps its last
observation for the rest of the episode. ``done["__all__"]`` ends the episode: every
agent is terminated then. The wrapped env still gets an action for every agent each step
(JaxMARL's API expects one), done agents' included: whatever the policy output for them.

The adapter's own time limit, :class:`JaxMARLParams` ``.max_steps_in_episode`` (default:
none in practice), truncates every agent still going. For a real truncation signal,
build the JaxMARL env with a step limit it never reaches and put the limit here.

``info`` is the wrapped env's info pytree (leaves as arrays, as JaxMARL orders them: not
reordered into groups); ``reset`` returns zeros of the same structure so that ``reset`` and
``step`` return identical pytrees.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsampler import spaces as js_spaces
from jaxsampler.envs.adapters.common import SuiteEnv, import_suite, unknown_id
from jaxsampler.envs.groups import AgentGroup, GroupLayout
from jaxsampler.spaces import Space
from jaxsampler.types import TimeStep

__all__ = [
    "JaxMARLEnv",
    "JaxMARLParams",
    "JaxMARLState",
    "convert_jaxmarl_space",
    "from_jaxmarl",
    "make_jaxmarl",
]

#: Default adapter time limit: the largest int32, i.e. no limit in practice.
NO_TIME_LIMIT = 2**31 - 1


@struct.dataclass
class JaxMARLParams:
    """Params of the adapter: its own time limit (the JaxMARL env takes no params)."""

    max_steps_in_episode: int = NO_TIME_LIMIT


# One shared default instance: wrappers compare params by identity, so two default-wrapped
# copies of the same JaxMARL env are equal (and share compiled code).
_DEFAULT_PARAMS = JaxMARLParams()


@struct.dataclass
class JaxMARLState:
    env_state: Any  # the wrapped env's state
    obs: Any  # leaves [A, ...], the last observation (frozen for done agents)
    terminated: jax.Array  # bool[A], sticky
    truncated: jax.Array  # bool[A], sticky
    time: jax.Array  # int32[], steps taken by the adapter


def convert_jaxmarl_space(space: Any) -> Space:
    """Converts a JaxMARL (or gymnax, Gymnasium, jaxsampler) space into a jaxsampler space.

    JaxMARL's spaces are matched by class name and attributes (``Discrete.n``,
    ``MultiDiscrete.num_categories``, ``Box.low/high/shape/dtype``, ``Dict.spaces``,
    ``Tuple.spaces``), so jaxmarl need not be importable.

    Raises:
        TypeError: an unsupported space type.
    """
    if isinstance(space, Space):
        return space
    module = type(space).__module__
    if module.startswith(("gymnax", "gymnasium")):
        return js_spaces.convert_space(space)
    kind = type(space).__name__
    if kind == "Discrete":
        return js_spaces.Discrete(int(space.n), dtype=np.dtype(getattr(space, "dtype", np.int32)))
    if kind == "MultiDiscrete":
        return js_spaces.MultiDiscrete(np.asarray(space.num_categories))
    if kind == "Box":
        shape = tuple(np.atleast_1d(space.shape).tolist())  # Hanabi's Box has a bare int shape
        return js_spaces.Box(
            np.asarray(space.low), np.asarray(space.high), shape, np.dtype(space.dtype)
        )
    if kind == "Dict":
        return js_spaces.Dict({k: convert_jaxmarl_space(v) for k, v in space.spaces.items()})
    if kind == "Tuple":
        return js_spaces.Tuple([convert_jaxmarl_space(v) for v in space.spaces])
    raise TypeError(f"convert_jaxmarl_space: unsupported space type {module}.{kind}")


def _agent_spaces(env: Any, what: str) -> dict[str, Space]:
    """``agent -> converted space`` for ``what`` in ``("observation_space", "action_space")``."""
    return {a: convert_jaxmarl_space(getattr(env, what)(a)) for a in env.agents}


def _group_names(members: list[list[str]]) -> list[str]:
    """One name per group: its agents' shared name without the ``_<index>`` suffix
    (``adversary_0, adversary_1`` -> ``"adversary"``) where every group has a distinct one,
    else ``"group_<i>"``."""
    stems = [{re.sub(r"_\d+$", "", a) for a in agents} for agents in members]
    names = [next(iter(s)) for s in stems if len(s) == 1]
    if len(names) == len(members) and len(set(names)) == len(names):
        return names
    return [f"group_{i}" for i in range(len(members))]


def _jaxmarl_layout(env: Any) -> GroupLayout | None:
    """The agent groups of a JaxMARL env whose agents' spaces differ; ``None`` when every
    agent has the same observation space and the same action space.

    Raises:
        TypeError, ValueError: the spaces differ in a way agent groups cannot carry (the
            message lists every agent's spaces).
    """
    agents = list(env.agents)
    obs, act = _agent_spaces(env, "observation_space"), _agent_spaces(env, "action_space")
    keys: list[tuple[Space, Space]] = []
    members: list[list[str]] = []
    for a in agents:
        key = (obs[a], act[a])
        if key not in keys:
            keys.append(key)
            members.append([])
        members[keys.index(key)].append(a)
    if len(keys) == 1:
        return None
    groups = [
        AgentGroup(name, tuple(ids), o, s)
        for name, ids, (o, s) in zip(_group_names(members), members, keys, strict=True)
    ]
    try:
        return GroupLayout(groups)
    except (TypeError, ValueError) as e:
        listed = "; ".join(f"{a!r}: observation {obs[a]!r}, action {act[a]!r}" for a in agents)
        raise type(e)(
            f"from_jaxmarl: the agents' spaces differ, and agent groups cannot carry them ({e}). "
            f"Agents: {listed}"
        ) from e


def _stack(tree_dict: Any, agents: tuple[str, ...]) -> Any:
    """``{agent: leaves [...]}`` -> leaves ``[A, ...]`` in ``agents`` order."""
    return jax.tree.map(
        lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *[tree_dict[a] for a in agents]
    )


def _select_agents(mask: jax.Array, on_true: Any, on_false: Any) -> Any:
    """Leaf-wise ``where(mask[a], on_true, on_false)`` for leaves ``[A, ...]``."""

    def sel(a: jax.Array, b: jax.Array) -> jax.Array:
        return jnp.where(mask.reshape(mask.shape + (1,) * (a.ndim - 1)), a, b)

    return jax.tree.map(sel, on_true, on_false)


@dataclasses.dataclass(frozen=True, eq=False)
class JaxMARLEnv(SuiteEnv):
    """Wraps a JaxMARL-style multi-agent env (see the module docstring).

    Args:
        env: the JaxMARL env object (it must be hashable or usable as static config).
        params: adapter params; defaults to ``JaxMARLParams()`` (no time limit).
        env_id: a display name (default: the wrapped class name).
    """

    suite: ClassVar[str] = "jaxmarl"

    def __post_init__(self) -> None:
        for attr in ("agents", "reset", "observation_space", "action_space"):
            if not hasattr(self.env, attr):
                raise TypeError(
                    f"from_jaxmarl: {type(self.env).__name__} has no {attr!r}; expected a JaxMARL "
                    "MultiAgentEnv"
                )
        if not hasattr(self.env, "step_env") and not hasattr(self.env, "step"):
            raise TypeError(
                f"from_jaxmarl: {type(self.env).__name__} has neither 'step_env' nor 'step'"
            )
        agents = tuple(self.env.agents)
        if not agents:
            raise ValueError("from_jaxmarl: the env has no agents")
        declared = getattr(self.env, "num_agents", len(agents))
        if int(declared) != len(agents):
            raise ValueError(
                f"from_jaxmarl: env.num_agents={declared} but env.agents lists {len(agents)} agents"
            )
        layout = _jaxmarl_layout(self.env)
        object.__setattr__(self, "num_agents", len(agents))
        object.__setattr__(self, "_layout", layout)
        if layout is None:
            object.__setattr__(self, "_agents", agents)
            only = agents[0]
            self._set_spaces(
                convert_jaxmarl_space(self.env.observation_space(only)),
                convert_jaxmarl_space(self.env.action_space(only)),
            )
        else:
            object.__setattr__(self, "_agents", layout.agent_ids)
            self._set_spaces(layout.observation_space, layout.action_space)
        if self.params is None:
            object.__setattr__(self, "params", _DEFAULT_PARAMS)

    @property
    def agent_ids(self) -> tuple[str, ...]:
        """The JaxMARL agent names, in agent-axis order (group by group where agents differ)."""
        return self._agents  # type: ignore[attr-defined]

    @property
    def agent_layout(self) -> GroupLayout | None:
        """The agent groups where the JaxMARL agents' spaces differ, else ``None``."""
        layout: GroupLayout | None = self.__dict__["_layout"]
        return layout

    def _obs_rows(self, obs_dict: Any) -> Any:
        """JaxMARL's ``{agent: obs}`` as the agent axis: stacked, or packed group by group."""
        layout = self.agent_layout
        if layout is None:
            return _stack(obs_dict, self._agents)  # type: ignore[attr-defined]
        return jnp.concatenate(
            [layout.pack_obs(g.name, _stack(obs_dict, g.agent_ids)) for g in layout.groups]
        )

    def _action_dict(self, action: Any) -> dict[str, Any]:
        """The agent axis's actions as JaxMARL's ``{agent: action}`` (each in its own space)."""
        layout = self.agent_layout
        if layout is None:
            agents = self._agents  # type: ignore[attr-defined]
            return {a: jax.tree.map(lambda x, i=i: x[i], action) for i, a in enumerate(agents)}
        out = {}
        for g in layout.groups:
            start, stop = layout.slots(g.name)
            own = layout.unpack_action(g.name, action[start:stop])
            out.update({a: own[j] for j, a in enumerate(g.agent_ids)})
        return out

    def _step_fn(self) -> Any:
        return self.env.step_env if hasattr(self.env, "step_env") else self.env.step

    def _info_zeros(self) -> Any:
        key = jax.random.PRNGKey(0)
        actions = {a: space.zeros() for a, space in self.action_spaces.items()}
        shapes = jax.eval_shape(lambda: self._step_fn()(key, self.env.reset(key)[1], actions)[4])
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def reset(self, key: jax.Array, params: Any = None) -> tuple[JaxMARLState, TimeStep]:
        """Resets the wrapped env. Pure; safe under jit and vmap."""
        A = self.num_agents
        obs_dict, env_state = self.env.reset(key)

        def flags() -> jax.Array:
            return jnp.zeros((A,), jnp.bool_)

        # The state and the TimeStep share no array: under an eager (un-jitted) vmap a shared
        # array comes out as one buffer in both, which a rollout donating its state rejects.
        s = JaxMARLState(
            env_state, self._obs_rows(obs_dict), flags(), flags(), jnp.zeros((), jnp.int32)
        )
        return s, TimeStep(
            obs=self._obs_rows(obs_dict),
            reward=jnp.zeros((A,), jnp.float32),
            terminated=flags(),
            truncated=flags(),
            acting=jnp.ones((A,), jnp.bool_),
            info=self._info_zeros(),
        )

    def step(
        self, key: jax.Array, state: JaxMARLState, action: Any, params: Any = None
    ) -> tuple[JaxMARLState, TimeStep]:
        """Steps the wrapped env with ``action`` leaves ``[A, ...]`` (carrier actions where
        the agents are grouped).

        Pure; safe under jit and vmap.
        """
        params = self.params if params is None else params
        agents = self._agents  # type: ignore[attr-defined]
        actions = self._action_dict(action)
        obs_dict, env_state, reward, done, info = self._step_fn()(key, state.env_state, actions)
        going = ~(state.terminated | state.truncated)
        done_now = jnp.stack([jnp.asarray(done[a], jnp.bool_) for a in agents])
        done_now = done_now | jnp.asarray(done.get("__all__", jnp.all(done_now)), jnp.bool_)
        time = state.time + 1
        terminated = state.terminated | (going & done_now)
        truncated = state.truncated | (going & ~done_now & (time >= params.max_steps_in_episode))
        obs = _select_agents(going, self._obs_rows(obs_dict), state.obs)
        rewards = jnp.stack([jnp.asarray(reward[a], jnp.float32) for a in agents])
        s = JaxMARLState(env_state, obs, terminated, truncated, time)
        return s, TimeStep(
            obs=obs,
            reward=jnp.where(going, rewards, 0.0).astype(jnp.float32),
            terminated=terminated,
            truncated=truncated,
            acting=~(terminated | truncated),
            info=jax.tree.map(jnp.asarray, info),
        )


def from_jaxmarl(
    env: Any, params: JaxMARLParams | None = None, env_id: str | None = None
) -> JaxMARLEnv:
    """Wraps a JaxMARL ``MultiAgentEnv`` (or any object with its API) as a jaxsampler env.

    Args:
        env: e.g. ``jaxmarl.make("MPE_simple_spread_v3")``.
        params: adapter params (:class:`JaxMARLParams`), e.g. a time limit that truncates.
        env_id: a display name.

    Raises:
        TypeError: ``env`` lacks the JaxMARL API, or its agents' spaces differ in a way agent
            groups cannot carry (a non-Box observation, Discrete and Box actions mixed).
        ValueError: likewise (a Discrete action space not starting at 0).
    """
    return JaxMARLEnv(env, params, env_id)


def make_jaxmarl(env_id: str, params: JaxMARLParams | None = None, **kwargs: Any) -> JaxMARLEnv:
    """``jaxmarl.make(env_id, **kwargs)`` wrapped as a jaxsampler env (``js.make("jaxmarl:<id>")``).

    Args:
        env_id: a JaxMARL id (``jaxmarl.registered_envs``), e.g. ``"MPE_simple_spread_v3"``.
        params: adapter params (:class:`JaxMARLParams`), e.g. a time limit that truncates.
        **kwargs: passed to ``jaxmarl.make``.

    Raises:
        ImportError: jaxmarl is not installed (``pip install -e ".[jaxmarl]"``).
        ValueError: an id JaxMARL does not register (the message lists them).
    """
    jaxmarl = import_suite("jaxmarl", "jaxmarl")
    if env_id not in jaxmarl.registered_envs:
        raise unknown_id("jaxmarl", env_id, jaxmarl.registered_envs)
    return JaxMARLEnv(jaxmarl.make(env_id, **kwargs), params, env_id)
