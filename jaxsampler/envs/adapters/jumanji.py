"""Adapter: a jumanji environment as a jaxsampler :class:`~jaxsampler.envs.base.Env`.

jumanji envs are ``reset(key) -> (state, TimeStep)`` and ``step(state, action) ->
(state, TimeStep)`` with a dm_env-style ``TimeStep`` (``step_type``, ``reward``,
``discount``, ``observation``, ``extras``). The adapter maps them like this:

* **Randomness** lives in jumanji's state (``state.key``), so ``step`` ignores the key
  jaxsampler passes; ``reset`` hands its key to jumanji unchanged. Driving jumanji by hand
  with the same reset key and actions gives bit-identical results.
* **Observations**: one leaf per field of jumanji's observation (a NamedTuple or
  dataclass; nested ones become nested ``Dict`` s), as a :class:`~jaxsampler.spaces.Dict`
  keyed by field name. Specs convert field by field: ``DiscreteArray`` -> ``Discrete``,
  ``MultiDiscreteArray`` -> ``MultiDiscrete``, ``BoundedArray`` -> ``Box`` with its bounds,
  ``Array`` -> unbounded ``Box``, each with the spec's dtype. An observation that is a
  bare array becomes a ``Dict`` with the one key ``"observations"``.
* **Action masks**: an env whose ``action_mask`` field fits jaxsampler's masked-observation
  convention gets the observation ``Dict(observations=Dict(<the other fields>),
  action_mask=bool[n])``: ``n`` entries for ``Discrete(n)`` actions, the per-dimension
  masks concatenated (``sum(nvec)``) for ``MultiDiscrete(nvec)``. ``MLPPolicy`` /
  ``RandomPolicy`` then act on legal actions only (``FlattenObservation`` first turns the
  inner ``Dict`` into one vector for the MLP). The masks that fit:

  - ``bool[n]`` with ``Discrete(n)`` actions (Snake, Game2048, TSP, ...): as is;
  - ``bool[k, m]`` with ``MultiDiscrete([m] * k)`` (a mask row per action entry:
    JobShop's machines, the agents of a multi-agent env): flattened to ``bool[k * m]``;
  - a *joint* mask ``bool[*nvec]`` with ``MultiDiscrete(nvec)`` (Minesweeper, Tetris,
    BinPack, Sudoku, FlatPack: one flag per combination) has no per-dimension form. With
    ``flat_actions`` (the default for such envs) the action space becomes
    ``Discrete(prod(nvec))``, the row-major index of the combination, and the mask
    ``bool[prod(nvec)]``.

  Otherwise (``flat_actions=False``, or a mask of another shape) the observation is the
  plain ``Dict`` of the fields, jumanji's mask renamed :data:`RAW_MASK_KEY`
  (``"jumanji_action_mask"``, as jumanji gives it), so that nothing mistakes it for a mask
  in jaxsampler's layout. An env without a mask gets the plain ``Dict`` as well.
* **Episode ends**: ``step_type == LAST`` with every discount 0 is ``terminated``;
  ``LAST`` with a nonzero discount is ``truncated`` (jumanji's own time limits). No
  auto-reset: the final observation is kept (the vector layer resets).
* **Reward**: ``float32[1]``; an env reporting a reward per jumanji agent (Connector) is
  summed (the team reward) in ``joint_agents`` mode.
* **info**: jumanji's ``extras`` (a dict, or ``{}``), with the structure ``step`` produces;
  ``reset`` fills it with its own extras where they match and zeros elsewhere.

**Multi-agent jumanji envs** (those with ``num_agents > 1``: RobotWarehouse,
LevelBasedForaging, Cleaner, Connector, MMST, SearchAndRescue) are refused by default:
their observations mix per-agent leaves with shared ones whose leading axis can equal the
agent count by chance (Connector's 10 x 10 grid with 10 agents), and some share one reward,
so no spec tells which leaves belong on jaxsampler's agent axis. ``joint_agents=True``
adapts them as one jaxsampler agent (``A = 1``) that sends jumanji's joint action
(``MultiDiscrete([n] * num_agents)``, masked per agent through the flattened per-agent
mask) and gets the team reward.

All functions are pure and safe under jit and vmap.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxsampler.constants import MASK_KEY, OBS_KEY
from jaxsampler.envs.adapters.common import SuiteEnv, import_suite, unknown_id, wrong_suite
from jaxsampler.spaces import Box, Dict, Discrete, MultiDiscrete, Space
from jaxsampler.types import TimeStep

__all__ = ["RAW_MASK_KEY", "JumanjiEnv", "convert_jumanji_spec", "from_jumanji", "make_jumanji"]

#: Key of a jumanji ``action_mask`` that does not fit jaxsampler's mask layout.
RAW_MASK_KEY = "jumanji_action_mask"

#: jumanji's ``StepType.LAST``.
_LAST = 2


def _fields(spec: Any) -> dict[str, Any]:
    """The child specs of a structured jumanji spec, in declaration order."""
    from jumanji import specs

    return {k: v for k, v in vars(spec).items() if isinstance(v, specs.Spec)}


def convert_jumanji_spec(spec: Any) -> Space:
    """A jumanji spec as a jaxsampler space (see the module docstring for the mapping).

    Raises:
        TypeError: not a jumanji spec, or a structured spec with no child specs.
    """
    from jumanji import specs

    if isinstance(spec, specs.DiscreteArray):
        return Discrete(int(spec.num_values), dtype=np.dtype(spec.dtype))
    if isinstance(spec, specs.MultiDiscreteArray):
        return MultiDiscrete(np.asarray(spec.num_values), dtype=np.dtype(spec.dtype))
    if isinstance(spec, specs.BoundedArray):
        low = np.broadcast_to(np.asarray(spec.minimum, np.float64), spec.shape)
        high = np.broadcast_to(np.asarray(spec.maximum, np.float64), spec.shape)
        return Box(low, high, spec.shape, np.dtype(spec.dtype))
    if isinstance(spec, specs.Array):
        dtype = np.dtype(spec.dtype)
        if dtype == np.bool_:
            return Box(0, 1, spec.shape, dtype)
        return Box(-np.inf, np.inf, spec.shape, dtype)
    if isinstance(spec, specs.Spec):
        children = _fields(spec)
        if not children:
            raise TypeError(f"convert_jumanji_spec: {spec!r} has no child specs")
        return Dict({k: convert_jumanji_spec(v) for k, v in children.items()})
    raise TypeError(f"convert_jumanji_spec: expected a jumanji spec, got {type(spec).__name__}")


def _as_dict(obs: Any) -> Any:
    """A jumanji observation (NamedTuple / dataclass, nested) as nested dicts of arrays."""
    if isinstance(obs, tuple) and hasattr(obs, "_asdict"):
        return {k: _as_dict(v) for k, v in obs._asdict().items()}
    if dataclasses.is_dataclass(obs) and not isinstance(obs, type):
        return {f.name: _as_dict(getattr(obs, f.name)) for f in dataclasses.fields(obs)}
    return jnp.asarray(obs)


@dataclasses.dataclass(frozen=True)
class _Layout:
    """How jumanji's observation and action map onto jaxsampler's (static facts)."""

    obs_space: Dict
    action_space: Space
    is_struct: bool  # jumanji's observation has fields (else one bare array)
    mask_kind: str  # "none" | "flat" (as is) | "rows" (k x m -> k*m) | "joint" | "other"
    flat_nvec: tuple[int, ...] | None  # joint actions as one Discrete index over these
    jumanji_action_dtype: Any


def _layout(env: Any, flat_actions: bool | None) -> _Layout:
    obs_spec, act_spec = env.observation_spec, env.action_spec
    action = convert_jumanji_spec(act_spec)
    children = _fields(obs_spec)
    if not children:
        obs: dict[str, Space] = {OBS_KEY: convert_jumanji_spec(obs_spec)}
    else:
        obs = {k: convert_jumanji_spec(v) for k, v in children.items()}
    mask = obs.get(MASK_KEY)
    kind, flat_nvec = "none", None
    if isinstance(mask, Box):
        shape = mask.shape
        nvec = (
            tuple(int(n) for n in action.nvec.ravel()) if isinstance(action, MultiDiscrete) else ()
        )
        joint = len(nvec) > 1 and shape == nvec
        if isinstance(action, Discrete) and shape == (action.n,):
            kind = "flat"
        elif joint and _num_jumanji_agents(env) == 1:  # (2, 2) for [2, 2] could be either
            kind = "joint"
        elif nvec and len(shape) == 2 and shape == (len(nvec), nvec[0]) and len(set(nvec)) == 1:
            kind = "rows"
        elif joint:
            kind = "joint"
        elif nvec and shape == (sum(nvec),):
            kind = "flat"
        else:
            kind = "other"
        if kind == "joint" and flat_actions is not False:
            flat_nvec = nvec
            action = Discrete(int(np.prod(nvec)), dtype=np.int32)
            kind = "flat_joint"
        if kind in ("rows", "flat_joint"):
            obs[MASK_KEY] = Box(0, 1, (int(np.prod(shape)),), np.bool_)
    if kind in ("joint", "other"):
        obs[RAW_MASK_KEY] = obs.pop(MASK_KEY)
    if kind in ("flat", "rows", "flat_joint"):
        # jaxsampler's masked-observation layout: every other field under "observations".
        mask_space = obs.pop(MASK_KEY)
        obs = {OBS_KEY: Dict(obs), MASK_KEY: mask_space}
    if flat_actions and flat_nvec is None:
        raise ValueError(
            f"flat_actions=True needs a MultiDiscrete action with a joint mask of shape nvec; "
            f"{type(env).__name__} has actions {action!r} and mask {mask!r}"
        )
    return _Layout(Dict(obs), action, bool(children), kind, flat_nvec, np.dtype(act_spec.dtype))


def _num_jumanji_agents(env: Any) -> int:
    n = getattr(env, "num_agents", 1)
    return int(n) if isinstance(n, (int, np.integer)) else 1


@dataclasses.dataclass(frozen=True, eq=False)
class JumanjiEnv(SuiteEnv):
    """Wraps ``env`` (a ``jumanji.Environment``); see the module docstring.

    Args:
        env: the jumanji env object (``jumanji.make(id)``).
        params: unused (jumanji envs take their configuration at construction); ``None``.
        env_id: a display name (default: the jumanji class name).
        flat_actions: joint-masked ``MultiDiscrete`` actions as one ``Discrete`` index
            (``None``: whenever the env has such a mask; ``False``: never; ``True``: required).
        joint_agents: accept a multi-agent jumanji env as one jaxsampler agent sending the
            joint action (see the module docstring).

    Raises:
        ValueError: a multi-agent jumanji env without ``joint_agents=True``, or
            ``flat_actions=True`` for an env without a joint mask.
    """

    flat_actions: bool | None = None
    joint_agents: bool = False

    suite: ClassVar[str] = "jumanji"

    def __post_init__(self) -> None:
        n = _num_jumanji_agents(self.env)
        if n > 1 and not self.joint_agents:
            raise ValueError(
                f"{type(self.env).__name__} is a multi-agent jumanji env ({n} agents); the "
                "jumanji adapter does not map jumanji agents onto jaxsampler's agent axis (their "
                "observations mix per-agent and shared leaves). Use "
                "js.envs.from_jumanji(env, joint_agents=True) (or js.make('jumanji:<id>', "
                "joint_agents=True)) for one jaxsampler agent sending jumanji's joint action"
            )
        object.__setattr__(self, "_layout", _layout(self.env, self.flat_actions))

    @property
    def observation_space(self) -> Space:
        """The observation ``Dict`` built from jumanji's spec at construction: jaxsampler's
        masked layout where the env's mask fits it, the plain fields otherwise (see the
        module docstring)."""
        return self._layout.obs_space  # type: ignore[attr-defined]

    @property
    def action_space(self) -> Space:
        """jumanji's action spec as a jaxsampler space, or ``Discrete(prod(nvec))`` with
        ``flat_actions`` (see the module docstring)."""
        return self._layout.action_space  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ conversions

    def _obs(self, observation: Any) -> dict[str, Any]:
        """jumanji's observation as this adapter's dict, leaves ``[1, ...]``."""
        lay: _Layout = self._layout  # type: ignore[attr-defined]
        obs = _as_dict(observation) if lay.is_struct else {OBS_KEY: jnp.asarray(observation)}
        if lay.mask_kind in ("flat", "rows", "flat_joint"):
            mask = obs.pop(MASK_KEY)
            obs = {OBS_KEY: obs, MASK_KEY: jnp.reshape(mask, (-1,))}
        elif lay.mask_kind in ("joint", "other"):
            obs[RAW_MASK_KEY] = obs.pop(MASK_KEY)
        return jax.tree.map(lambda x: x[None], obs)

    def jumanji_action(self, action: Any) -> jax.Array:
        """One jaxsampler action (no agent axis) as the action jumanji's ``step`` takes."""
        lay: _Layout = self._layout  # type: ignore[attr-defined]
        action = jnp.asarray(action)
        if lay.flat_nvec is not None:
            action = jnp.stack(jnp.unravel_index(action, lay.flat_nvec))
        return action.astype(lay.jumanji_action_dtype)

    def _info(self, extras: Any) -> dict[str, Any]:
        return {} if extras is None else dict(extras)

    def _info_like_step(self, reset_extras: Any) -> dict[str, Any]:
        """The step's info structure, filled from ``reset_extras`` where they match."""
        key = jax.random.PRNGKey(0)

        def shapes() -> Any:
            state, _ = self.env.reset(key)
            action = self.jumanji_action(self.action_space.zeros())
            return self._info(self.env.step(state, action)[1].extras)

        out = {}
        have = self._info(reset_extras)
        for k, s in jax.eval_shape(shapes).items():
            v = have.get(k)
            same = v is not None and jax.tree.structure(v) == jax.tree.structure(s)  # type: ignore[operator]
            same = same and all(
                jnp.shape(a) == b.shape and jnp.result_type(a) == b.dtype
                for a, b in zip(jax.tree.leaves(v), jax.tree.leaves(s))
            )
            out[k] = (
                jax.tree.map(jnp.asarray, v)
                if same
                else jax.tree.map(lambda t: jnp.zeros(t.shape, t.dtype), s)
            )
        return out

    # ------------------------------------------------------------------ protocol

    def reset(self, key: jax.Array, params: Any = None) -> tuple[Any, TimeStep]:
        """``jumanji_env.reset(key)``. Pure; safe under jit and vmap."""
        state, ts = self.env.reset(key)
        return state, TimeStep(
            obs=self._obs(ts.observation),
            reward=jnp.zeros((1,), jnp.float32),
            terminated=jnp.zeros((1,), jnp.bool_),
            truncated=jnp.zeros((1,), jnp.bool_),
            acting=jnp.ones((1,), jnp.bool_),
            info=self._info_like_step(ts.extras),
        )

    def step(
        self, key: jax.Array, state: Any, action: Any, params: Any = None
    ) -> tuple[Any, TimeStep]:
        """``jumanji_env.step(state, action[0])``; ``key`` is unused (jumanji's randomness
        is in ``state.key``). Pure; safe under jit and vmap."""
        state, ts = self.env.step(state, self.jumanji_action(jnp.asarray(action)[0]))
        last = jnp.asarray(ts.step_type) == _LAST
        terminated = last & jnp.all(jnp.asarray(ts.discount) == 0)
        reward = jnp.sum(jnp.asarray(ts.reward, jnp.float32))
        return state, TimeStep(
            obs=self._obs(ts.observation),
            reward=jnp.reshape(reward, (1,)),
            terminated=jnp.reshape(terminated, (1,)),
            truncated=jnp.reshape(last & ~terminated, (1,)),
            acting=jnp.ones((1,), jnp.bool_),
            info=jax.tree.map(jnp.asarray, self._info(ts.extras)),
        )


def from_jumanji(
    env: Any,
    params: Any = None,
    env_id: str | None = None,
    *,
    flat_actions: bool | None = None,
    joint_agents: bool = False,
) -> JumanjiEnv:
    """Wraps a jumanji env object (``jumanji.make(id)``) as a jaxsampler env.

    Args:
        env: the jumanji env.
        params: unused; jumanji envs take no params.
        env_id: a display name.
        flat_actions, joint_agents: see :class:`JumanjiEnv`.

    Raises:
        TypeError: ``env`` is not a ``jumanji.Environment``.
        ValueError: a multi-agent env without ``joint_agents=True`` (see :class:`JumanjiEnv`).
    """
    jumanji = import_suite("jumanji", "jumanji")
    if not isinstance(env, jumanji.Environment):
        raise wrong_suite("from_jumanji", "a jumanji Environment (jumanji.make(id))", env)
    return JumanjiEnv(env, params, env_id, flat_actions, joint_agents)


def make_jumanji(
    env_id: str,
    *,
    flat_actions: bool | None = None,
    joint_agents: bool = False,
    **kwargs: Any,
) -> JumanjiEnv:
    """``jumanji.make(env_id, **kwargs)`` wrapped as a jaxsampler env (``js.make("jumanji:<id>")``).

    Raises:
        ImportError: jumanji is not installed (``pip install -e ".[jumanji]"``).
        ValueError: an id jumanji does not register (the message lists them), or a
            multi-agent env without ``joint_agents=True``.
    """
    jumanji = import_suite("jumanji", "jumanji")
    ids = jumanji.registered_environments()
    if env_id not in ids:
        raise unknown_id("jumanji", env_id, ids)
    env = jumanji.make(env_id, **kwargs)
    return JumanjiEnv(env, None, env_id, flat_actions, joint_agents)
