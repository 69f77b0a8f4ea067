"""Adapter: any gymnax environment as a jaxsampler :class:`~jaxsampler.envs.base.Env`.

The adapter calls gymnax's ``reset_env`` / ``step_env`` (not gymnax's auto-resetting
``step``): jaxsampler's vector layer does the auto-reset, so no reset is computed twice.
``terminated`` is what ``step_env`` reports; ``truncated`` is gymnax's
``is_truncated(state, params)`` (``state.time >= params.max_steps_in_episode``), kept
separate. gymnax 1.0's built-ins report natural termination only; an older-style env
whose ``is_terminal`` also includes the time limit reports ``terminated`` at the limit
as well, which the adapter cannot undo.

Spaces are built once, at construction, from the concrete construction params (never
inside traced code: Reacher-, Swimmer- and PointRobot-misc build their bounds with
``jnp.array``, which gives tracers under ``jax.jit``). Where gymnax's declared observation
space disagrees with what ``reset_env`` really emits, the adapter declares the truth:

* dtype/shape: taken from ``jax.eval_shape`` of ``reset_env`` (Catch-bsuite declares
  int32 but emits float32; FourRooms-misc declares float32 but emits int32);
* bounds (:data:`_BOUNDS`): MemoryChain-bsuite shows its context bits as ``2 * bit - 1``
  (so -1) under a declared low of 0; MetaMaze-misc's last-reward entry is ``params.reward``
  (10) under a declared high of 1; GaussianBandit-misc declares ``[0, 0, 0, 0]`` to
  ``[2, 1, 1, max_steps]`` for ``[last reward (Gaussian, unbounded), one-hot action (2),
  normalized time in [-1, 1]]``.

``info`` is gymnax's info dict; at reset it holds zeros of the same structure (so
``reset`` and ``step`` return identical pytrees).

Rendering: gymnax's own ``render`` draws with matplotlib on the host, which no jitted
rollout can call, so the adapter renders in JAX where it knows the env
(``can_render``; ``render(state, params) -> uint8[H, W, 3]``, jit- and vmap-safe):

* MinAtar (Asterix, Breakout, Freeway, Seaquest, SpaceInvaders): the observation grid
  (``env.get_obs(state)``, ``[10, 10, C]``), each cell drawn in the color of its
  lowest-numbered active channel (:data:`MINATAR_PALETTE`, channel ``c`` in color
  ``c``; no active channel: :data:`MINATAR_BACKGROUND`). MinAtar lists the player and
  the moving objects first, so they are drawn over bricks and trails. Each cell is
  ``MINATAR_CELL x MINATAR_CELL`` pixels (160 x 160 frames);
* classic control (CartPole-v1, Pendulum-v1, Acrobot-v1, MountainCar-v0,
  MountainCarContinuous-v0): gymnax's state mapped onto the built-in env of the same
  name (the same physics, other field names) and drawn by that env's renderer, with
  the params the two share by name;
* anything else: ``can_render`` is False and ``render`` raises ``NotImplementedError``.

Compact observations (``compact_obs=True``, or ``"uint8"`` / ``"bool"``): the adapter
casts every observation to a 1-byte dtype before handing it on, so the rollout's buffers,
episodes and batches hold 1 byte per entry instead of 4, and the observation space says so
(``Box(0, 1, (10, 10, 4), uint8)`` for Breakout-MinAtar). The policy receives that dtype;
the built-in policies (MLP, CNN, GRU) cast their network input to float32 inside the jit,
so they compute exactly what they compute on the float32 frames; a hand-written policy
must do the same (``obs.astype(jnp.float32)``). The cast is allowed only where it keeps
every value exactly (:func:`compact_observation_space`): a ``Box`` with finite bounds in
the target dtype's range (``[0, 255]`` for uint8, ``[0, 1]`` for bool) whose values are
whole numbers, known either from its integer / bool dtype or from how the env draws its
observations (:data:`WHOLE_NUMBER_FRAMES`: gymnax's MinAtar envs draw each frame in a
``bool`` or ``int32`` grid, or a float32 grid of ``set(1)`` / ``max(0 or 1)`` writes, and
only then cast to float32, so every entry is exactly 0 or 1). Anything else raises a
``ValueError`` naming the env and its space.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxsampler.envs.adapters.common import SuiteEnv, unknown_id, wrong_suite
from jaxsampler.spaces import Box, Space, from_gymnax_space
from jaxsampler.types import TimeStep

__all__ = [
    "COMPACT_DTYPES",
    "GymnaxEnv",
    "MINATAR_BACKGROUND",
    "MINATAR_CELL",
    "MINATAR_PALETTE",
    "WHOLE_NUMBER_FRAMES",
    "compact_observation_space",
    "from_gymnax",
    "make_gymnax",
]

#: RGB color of MinAtar channel ``c`` (up to 10 channels, Seaquest's count).
MINATAR_PALETTE = np.array(
    [
        [255, 214, 0],  # yellow
        [0, 200, 255],  # cyan
        [255, 64, 64],  # red
        [80, 220, 100],  # green
        [190, 120, 255],  # violet
        [255, 140, 0],  # orange
        [240, 240, 240],  # white
        [40, 110, 255],  # blue
        [255, 105, 180],  # pink
        [150, 150, 150],  # grey
    ],
    dtype=np.uint8,
)
#: RGB color of a MinAtar cell with no active channel.
MINATAR_BACKGROUND = np.array([16, 16, 24], dtype=np.uint8)
#: Pixels per MinAtar grid cell, in each direction.
MINATAR_CELL = 16

#: The dtypes ``compact_obs`` stores, by name (``compact_obs=True`` is ``"uint8"``).
COMPACT_DTYPES: dict[str, np.dtype] = {"uint8": np.dtype(np.uint8), "bool": np.dtype(np.bool_)}

#: Module prefixes of gymnax envs whose float observations are whole numbers by
#: construction (see the module docstring): MinAtar draws 0/1 frames.
WHOLE_NUMBER_FRAMES: tuple[str, ...] = ("gymnax.environments.minatar.",)


@dataclasses.dataclass(frozen=True, eq=False)
class GymnaxEnv(SuiteEnv):
    """Wraps ``env`` (a ``gymnax.environments.environment.Environment``).

    Args:
        env: the gymnax env object.
        params: its ``EnvParams``; defaults to ``env.default_params``. The spaces are
            derived from these params; other params may be passed to ``reset``/``step``.
        env_id: a display name.
        compact_obs: hold observations in a 1-byte dtype: ``False`` (the env's own dtype),
            ``True`` or ``"uint8"``, or ``"bool"`` (see the module docstring).

    Raises:
        ValueError: ``compact_obs`` on an env whose observations the cast would not keep
            exactly, or an unknown ``compact_obs`` value (the message names them).
    """

    compact_obs: bool | str = False

    suite: ClassVar[str] = "gymnax"

    def __post_init__(self) -> None:
        if self.params is None:
            object.__setattr__(self, "params", self.env.default_params)
        obs_space, act_space = _spaces(self.env, self.params)
        dtype = _compact_dtype(self.compact_obs)
        if dtype is not None:
            whole = type(self.env).__module__.startswith(WHOLE_NUMBER_FRAMES)
            obs_space = compact_observation_space(obs_space, dtype, whole, self.name)
        object.__setattr__(self, "_obs_dtype", dtype)
        self._set_spaces(obs_space, act_space)

    def _held(self, obs: Any) -> Any:
        """``obs`` (gymnax's, without the agent axis) with the agent axis added, in the
        compact dtype when ``compact_obs`` is on."""
        dtype = self.__dict__["_obs_dtype"]
        if dtype is None:
            return jax.tree.map(lambda x: jnp.asarray(x)[None], obs)
        return jnp.asarray(obs).astype(dtype)[None]

    @property
    def name(self) -> str:
        """``"gymnax:<env_id>"``, or gymnax's own ``env.name`` in place of ``env_id`` when none
        was given."""
        return f"gymnax:{self.env_id or self.env.name}"

    @property
    def can_render(self) -> bool:
        """Whether :meth:`render` draws this env (MinAtar and classic control)."""
        return _renderer(self.env) is not None

    @property
    def render_shape(self) -> tuple[int, int]:
        """The static ``(H, W)`` of :meth:`render`'s frames."""
        if not self.can_render:
            raise NotImplementedError(self._no_render())
        state, _ = jax.eval_shape(lambda: self.reset(jax.random.PRNGKey(0)))
        out = jax.eval_shape(self.render, state)
        return (int(out.shape[0]), int(out.shape[1]))

    def render(self, state: Any, params: Any = None) -> jax.Array:
        """One env's frame, ``uint8[H, W, 3]``, computed in JAX (jit- and vmap-safe).

        Raises:
            NotImplementedError: an env the adapter cannot draw (``can_render`` False).
        """
        draw = _renderer(self.env)
        if draw is None:
            raise NotImplementedError(self._no_render())
        return draw(self.env, state, self.params if params is None else params)

    def _no_render(self) -> str:
        return (
            f"{self.name} cannot render: the gymnax adapter draws MinAtar and classic-control "
            f"envs in JAX; {type(self.env).__name__}'s own render uses matplotlib on the host"
        )

    def _info_zeros(self, params: Any) -> Any:
        key = jax.random.PRNGKey(0)
        shapes = jax.eval_shape(
            lambda: self.env.step_env(
                key, self.env.reset_env(key, params)[1], self.action_space.zeros(), params
            )[4]
        )
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def reset(self, key: jax.Array, params: Any = None) -> tuple[Any, TimeStep]:
        """Starts an episode with gymnax's ``reset_env``, adding an agent axis of size 1.

        The reset ``info`` is zeros shaped like the step's (found with ``jax.eval_shape``), so
        reset and step return the same pytree. ``params`` defaults to the adapter's. Pure;
        safe under jit and vmap.
        """
        params = self.params if params is None else params
        obs, state = self.env.reset_env(key, params)
        return state, TimeStep(
            obs=self._held(obs),
            reward=jnp.zeros((1,), jnp.float32),
            terminated=jnp.zeros((1,), jnp.bool_),
            truncated=jnp.zeros((1,), jnp.bool_),
            acting=jnp.ones((1,), jnp.bool_),
            info=self._info_zeros(params),
        )

    def step(
        self, key: jax.Array, state: Any, action: Any, params: Any = None
    ) -> tuple[Any, TimeStep]:
        """One step of gymnax's ``step_env`` (no auto-reset) on ``action[0]``.

        ``terminated`` is what ``step_env`` reports, ``truncated`` gymnax's ``is_truncated``
        of the new state; every leaf gets an agent axis of size 1. ``params`` defaults to the
        adapter's. Pure; safe under jit and vmap.
        """
        params = self.params if params is None else params
        action = jax.tree.map(lambda a: a[0], action)
        obs, state, reward, terminated, info = self.env.step_env(key, state, action, params)
        truncated = self.env.is_truncated(state, params)
        info = jax.tree.map(jnp.asarray, info)
        return state, TimeStep(
            obs=self._held(obs),
            reward=jnp.reshape(reward, (1,)).astype(jnp.float32),
            terminated=jnp.reshape(terminated, (1,)).astype(jnp.bool_),
            truncated=jnp.reshape(truncated, (1,)).astype(jnp.bool_),
            acting=jnp.ones((1,), jnp.bool_),
            info=info,
        )


# --------------------------------------------------------------------------- spaces


def _time_bounds(params: Any) -> tuple[float, float]:
    """Range of the time entry of GaussianBandit/MetaMaze: ``t`` in ``[0, max_steps]``,
    or gymnax's ``2 * t / 100 - 1`` when ``params.normalize_time``."""
    t_max = float(params.max_steps_in_episode)
    if bool(params.normalize_time):
        return -1.0, max(1.0, 2.0 * t_max / 100.0 - 1.0)
    return 0.0, t_max


def _memory_chain(box: Box, params: Any) -> Box:
    low = np.array(box.low)
    low[2:] = -1.0  # context bits are shown as 2 * bit - 1
    return Box(low, box.high, box.shape, box.dtype)


def _meta_maze(box: Box, params: Any) -> Box:
    low, high = np.array(box.low), np.array(box.high)
    values = [0.0, float(params.reward), float(params.punishment)]
    values.append(values[1] + values[2])
    low[-2], high[-2] = min(values), max(values)  # last reward
    low[-1], high[-1] = _time_bounds(params)
    return Box(low, high, box.shape, box.dtype)


def _gaussian_bandit(box: Box, params: Any) -> Box:
    t_low, t_high = _time_bounds(params)
    return Box([-np.inf, 0.0, 0.0, t_low], [np.inf, 1.0, 1.0, t_high], box.shape, box.dtype)


#: gymnax class name -> correction of its declared observation Box (see the docstring).
_BOUNDS: dict[str, Callable[[Box, Any], Box]] = {
    "MemoryChain": _memory_chain,
    "MetaMaze": _meta_maze,
    "GaussianBandit": _gaussian_bandit,
}


def _spaces(env: Any, params: Any) -> tuple[Space, Space]:
    """``(observation_space, action_space)`` of gymnax's ``env`` under concrete ``params``,
    corrected where gymnax's declaration disagrees with what ``reset_env`` emits."""
    with jax.ensure_compile_time_eval():
        obs_space = from_gymnax_space(env.observation_space(params))
        act_space = from_gymnax_space(env.action_space(params))
    emitted = jax.eval_shape(lambda: env.reset_env(jax.random.PRNGKey(0), params)[0])
    if isinstance(obs_space, Box) and (
        obs_space.dtype != emitted.dtype or obs_space.shape != tuple(emitted.shape)
    ):
        low = np.broadcast_to(obs_space.low, emitted.shape)
        high = np.broadcast_to(obs_space.high, emitted.shape)
        obs_space = Box(low, high, tuple(emitted.shape), emitted.dtype)
    fix = _BOUNDS.get(type(env).__name__)
    if fix is not None and isinstance(obs_space, Box):
        obs_space = fix(obs_space, params)
    return obs_space, act_space


def _compact_dtype(option: bool | str) -> np.dtype | None:
    """The dtype ``compact_obs`` asks for, or ``None`` (off)."""
    if option is False:
        return None
    if option is True:
        return COMPACT_DTYPES["uint8"]
    if isinstance(option, str) and option in COMPACT_DTYPES:
        return COMPACT_DTYPES[option]
    raise ValueError(
        f"compact_obs must be False, True or one of {sorted(COMPACT_DTYPES)}, got {option!r}"
    )


def compact_observation_space(space: Space, dtype: Any, whole_numbers: bool, env: str) -> Box:
    """``space`` held in ``dtype`` (``uint8`` or ``bool``): the same shape and bounds.

    Args:
        space: the env's observation space.
        dtype: the compact dtype.
        whole_numbers: the env's observations are known to be whole numbers although the
            space's dtype is a float (e.g. MinAtar's 0/1 frames).
        env: the env's name, for the error message.

    Raises:
        ValueError: ``space`` is not a ``Box``, its bounds are not finite or not inside
            ``dtype``'s range (``[0, 255]``, ``[0, 1]`` for bool), or it is a float Box of
            an env not known to emit whole numbers; the message names the env and space.
    """
    dtype = np.dtype(dtype)
    top = 1 if dtype == np.bool_ else int(np.iinfo(dtype).max)
    why = None
    if not isinstance(space, Box):
        why = "only a Box observation can be held compactly"
    elif not space.is_bounded or np.any(space.low < 0) or np.any(space.high > top):
        why = f"its bounds are not inside [0, {top}], the range of {dtype.name}"
    elif np.issubdtype(space.dtype, np.floating) and not whole_numbers:
        why = (
            f"its dtype is {space.dtype.name} and {env} is not known to emit whole numbers "
            f"(known: the envs under {', '.join(p.rstrip('.') for p in WHOLE_NUMBER_FRAMES)})"
        )
    if why is not None:
        raise ValueError(
            f"compact_obs={dtype.name!r} would not keep the observations of {env} exactly: "
            f"{why}; its observation space is {space!r}"
        )
    assert isinstance(space, Box)
    return Box(space.low, space.high, space.shape, dtype)


# --------------------------------------------------------------------------- rendering

Renderer = Callable[[Any, Any, Any], jax.Array]


def minatar_frame(obs: jax.Array, cell: int = MINATAR_CELL) -> jax.Array:
    """``uint8[10 * cell, 10 * cell, 3]`` picture of a MinAtar observation ``[10, 10, C]``:
    each cell in the color of its lowest-numbered active channel (> 0.5), background
    where none is. Jit- and vmap-safe."""
    active = jnp.asarray(obs) > 0.5
    num_channels = active.shape[-1]
    if num_channels > len(MINATAR_PALETTE):
        raise ValueError(
            f"MinAtar observation has {num_channels} channels; the palette has "
            f"{len(MINATAR_PALETTE)} colors"
        )
    # 0: no channel; c + 1: channel c is the lowest active one.
    top = jnp.where(jnp.any(active, axis=-1), jnp.argmax(active, axis=-1) + 1, 0)
    table = jnp.asarray(np.concatenate([MINATAR_BACKGROUND[None], MINATAR_PALETTE]))
    img = table[top]
    return jnp.repeat(jnp.repeat(img, cell, axis=0), cell, axis=1)


def _render_minatar(env: Any, state: Any, params: Any) -> jax.Array:
    return minatar_frame(env.get_obs(state, params))


#: gymnax classic-control class -> (built-in module:class, {built-in field: gymnax field}).
_CLASSIC: dict[str, tuple[str, dict[str, str]]] = {
    "CartPole": (
        "jaxsampler.envs.cartpole:CartPole",
        {"x": "x", "x_dot": "x_dot", "theta": "theta", "theta_dot": "theta_dot"},
    ),
    "Pendulum": ("jaxsampler.envs.pendulum:Pendulum", {"theta": "theta", "theta_dot": "theta_dot"}),
    "Acrobot": (
        "jaxsampler.envs.acrobot:Acrobot",
        {
            "theta1": "joint_angle1",
            "theta2": "joint_angle2",
            "dtheta1": "velocity_1",
            "dtheta2": "velocity_2",
        },
    ),
    "MountainCar": (
        "jaxsampler.envs.mountain_car:MountainCar",
        {"position": "position", "velocity": "velocity"},
    ),
    "ContinuousMountainCar": (
        "jaxsampler.envs.mountain_car_continuous:MountainCarContinuous",
        {"position": "position", "velocity": "velocity"},
    ),
}


def _builtin_of(env: Any) -> tuple[Any, dict[str, str]] | None:
    """The built-in env that draws gymnax's classic-control ``env``, and the field map."""
    module = type(env).__module__
    entry = _CLASSIC.get(type(env).__name__)
    if entry is None or not module.startswith("gymnax.environments.classic_control"):
        return None
    path, fields = entry
    mod, cls = path.split(":")
    builtin = getattr(importlib.import_module(mod), cls)()
    if not getattr(builtin, "can_render", False):
        return None
    return builtin, fields


def builtin_state(env: Any, state: Any, params: Any) -> tuple[Any, Any, Any]:
    """``(builtin_env, builtin_state, builtin_params)``: gymnax classic-control ``state``
    and ``params`` as the built-in env's (fields renamed; params the two share by name,
    the built-in defaults for the rest). Jit- and vmap-safe.

    Raises:
        NotImplementedError: ``env`` is not one of the five classic-control envs (or its
            built-in counterpart cannot render).
    """
    found = _builtin_of(env)
    if found is None:
        raise NotImplementedError(f"no built-in renderer for gymnax {type(env).__name__}")
    builtin, fields = found
    default = builtin.default_params
    shared = {
        f.name: getattr(params, f.name)
        for f in dataclasses.fields(default)
        if hasattr(params, f.name)
    }
    values = {
        ours: jnp.asarray(getattr(state, theirs), jnp.float32) for ours, theirs in fields.items()
    }
    values["time"] = jnp.asarray(state.time, jnp.int32)
    state_cls = type(jax.eval_shape(lambda: builtin.reset(jax.random.PRNGKey(0))[0]))
    return builtin, state_cls(**values), default.replace(**shared)


def _render_classic(env: Any, state: Any, params: Any) -> jax.Array:
    builtin, ours, our_params = builtin_state(env, state, params)
    return builtin.render(ours, our_params)


def _renderer(env: Any) -> Renderer | None:
    """How the adapter draws gymnax's ``env``, or ``None``."""
    module = type(env).__module__
    if module.startswith("gymnax.environments.minatar") and hasattr(env, "get_obs"):
        return _render_minatar
    if _builtin_of(env) is not None:
        return _render_classic
    return None


def from_gymnax(
    env: Any, params: Any = None, env_id: str | None = None, compact_obs: bool | str = False
) -> GymnaxEnv:
    """Wraps a gymnax env object (and optionally its params) as a jaxsampler env.

    ``compact_obs``: hold observations in ``uint8`` (``True``) or ``bool`` (see
    :class:`GymnaxEnv`).

    Raises:
        TypeError: ``env`` is not a gymnax ``Environment`` (no ``reset_env``/``step_env``).
        ValueError: ``compact_obs`` would not keep the env's observations exactly.
    """
    if not hasattr(env, "step_env") or not hasattr(env, "reset_env"):
        raise wrong_suite("from_gymnax", "a gymnax Environment (gymnax.make(id)[0])", env)
    return GymnaxEnv(env, params, env_id, compact_obs)


def make_gymnax(env_id: str, compact_obs: bool | str = False, **kwargs: Any) -> GymnaxEnv:
    """``gymnax.make(env_id, **kwargs)`` wrapped as a jaxsampler env.

    ``compact_obs``: hold observations in ``uint8`` (``True``) or ``bool``, e.g.
    ``js.make("gymnax:Breakout-MinAtar", compact_obs=True)`` (see :class:`GymnaxEnv`).

    Raises:
        ValueError: ``env_id`` is not in ``gymnax.registered_envs`` (the message lists them),
            or ``compact_obs`` would not keep the env's observations exactly.
    """
    import gymnax

    if env_id not in gymnax.registered_envs:
        raise unknown_id("gymnax", env_id, gymnax.registered_envs)
    env, params = gymnax.make(env_id, **kwargs)
    return GymnaxEnv(env, params, env_id, compact_obs)
