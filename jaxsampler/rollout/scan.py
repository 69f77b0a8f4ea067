"""The rollout: env + policy in one ``lax.scan``, writing into preallocated buffers.

::

    rollout = js.make_rollout(env, policy, num_envs=64, rollout_length=128)
    state = js.init_rollout_state(env, policy, num_envs=64, key=key)
    state, traj = rollout(params, state)          # pure: call it inside your own jit

The buffers (:class:`~jaxsampler.types.Trajectory`) are scan carries updated in place;
pass the previous call's trajectory back (``rollout(params, state, traj)``) under a jit
that donates it (:func:`jit_rollout` does) and steady-state sampling allocates nothing.
See :mod:`jaxsampler.types` for the layout and the auto-reset contract.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from jaxsampler import vector
from jaxsampler.envs.base import Env
from jaxsampler.policies.base import Policy
from jaxsampler.rollout import placement
from jaxsampler.spaces import Box, Discrete, MultiDiscrete, Space, compatible
from jaxsampler.transforms.base import (
    Context,
    Pipeline,
    Transform,
    TransformState,
    build_pipeline,
)
from jaxsampler.types import RolloutState, Trajectory

__all__ = [
    "Rollout",
    "make_rollout",
    "init_rollout_state",
    "jit_rollout",
    "trajectory_spec",
    "allocate_trajectory",
    "check_compatible",
    "check_action",
    "RolloutDebugError",
    "pipeline_of",
]

#: What ``transforms=`` accepts: a :class:`~jaxsampler.transforms.Transform`, a sequence of
#: them (env side first), or an already bound :class:`~jaxsampler.transforms.Pipeline`.
Transforms = Transform | Pipeline | tuple[Transform, ...] | list[Transform] | None

#: ``(params, state, buffers=None) -> (state, traj)``: one rollout call.
RolloutFn = Callable[..., tuple[RolloutState, Trajectory]]
#: ``(key, env_params=None) -> state``: the state a rollout starts from.
InitFn = Callable[..., RolloutState]
#: ``(params, state) -> buffers``: zero-filled trajectory buffers.
AllocateFn = Callable[[Any, RolloutState], Trajectory]


class RolloutDebugError(FloatingPointError):
    """Raised by a ``debug=True`` rollout: a NaN/Inf or an out-of-space value was found."""


def _check_sizes(num_envs: Any, rollout_length: Any | None = None) -> None:
    if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
        raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
    if rollout_length is not None and (
        isinstance(rollout_length, bool)
        or not isinstance(rollout_length, (int, np.integer))
        or rollout_length < 1
    ):
        raise ValueError(f"rollout_length must be an int >= 1, got {rollout_length!r}")


def pipeline_of(env: Env, transforms: Transforms = None) -> Pipeline:
    """``transforms`` bound to ``env``'s spaces (:func:`jaxsampler.transforms.build_pipeline`)."""
    if isinstance(transforms, Pipeline):
        return transforms
    return build_pipeline(transforms, env.observation_space, env.action_space)


def check_compatible(env: Env, policy: Policy, transforms: Transforms = None) -> Pipeline:
    """Raises ``ValueError`` naming the mismatch if ``policy`` cannot drive ``env`` (through
    ``transforms``: the policy must fit the spaces the last transform hands on). Returns
    the bound pipeline."""
    if not isinstance(env, Env):
        raise TypeError(
            f"env must be a jaxsampler Env, got {type(env).__name__} (wrap gymnax envs with "
            "js.envs.from_gymnax)"
        )
    pipe = pipeline_of(env, transforms)
    label = f"env {env.name}" + (" after its transforms" if pipe else "")
    check_policy_fits(policy, env.agent_ids, pipe.observation_space, pipe.action_space, label)
    return pipe


def check_policy_fits(
    policy: Policy,
    agent_ids: tuple[Any, ...],
    observation_space: Space,
    action_space: Space,
    env_label: str,
) -> None:
    """Raises ``ValueError`` naming the mismatch if ``policy`` was built for other agent ids
    or spaces than an env's (device or host: ``env_label`` names it in the message)."""
    policy_agents = getattr(policy, "agent_ids", None)
    if policy_agents is not None and tuple(policy_agents) != tuple(agent_ids):
        raise ValueError(
            f"mismatched agent ids: {env_label} has {tuple(agent_ids)}, "
            f"policy {type(policy).__name__} was built for {tuple(policy_agents)}"
        )
    spaces = (("observation_space", observation_space), ("action_space", action_space))
    for what, env_space in spaces:
        pol_space = getattr(policy, what, None)
        if pol_space is None:
            continue
        if not compatible(env_space, pol_space):
            raise ValueError(
                f"mismatched {what.replace('_', ' ')}: {env_label} has {env_space!r}, "
                f"policy {type(policy).__name__} was built for {pol_space!r}"
            )


def check_action(space: Space, action: Any, batch_shape: tuple[int, ...]) -> None:
    """Static check (shapes, dtypes) of a batched action; raises naming the problem.

    Args:
        space: one agent's action space.
        action: action pytree with leading ``batch_shape`` (e.g. ``(E, A)``); tracers are fine.
        batch_shape: the expected leading dims.
    """
    expected = jax.tree.map(
        lambda z: jax.ShapeDtypeStruct(tuple(batch_shape) + z.shape, z.dtype), space.zeros()
    )
    got_def: Any = jax.tree.structure(action)  # PyTreeDef: untyped for mypy
    if got_def != jax.tree.structure(expected):
        raise TypeError(
            f"action has structure {got_def}, expected {jax.tree.structure(expected)} for {space!r}"
        )
    for exp, got in zip(jax.tree.leaves(expected), jax.tree.leaves(action)):
        got_shape, got_dtype = tuple(np.shape(got)), jnp.result_type(got)
        if got_shape != exp.shape:
            raise ValueError(
                f"action has shape {got_shape}, expected {exp.shape} "
                f"(batch {tuple(batch_shape)} + action space {space!r}); refusing to broadcast"
            )
        if isinstance(space, (Discrete, MultiDiscrete)) or (
            isinstance(space, Box) and np.issubdtype(space.dtype, np.integer)
        ):
            if not jnp.issubdtype(got_dtype, jnp.integer):
                raise TypeError(
                    f"action dtype {got_dtype} is not an integer dtype, as {space!r} requires"
                )
        elif got_dtype != exp.dtype:
            raise TypeError(
                f"action dtype {got_dtype} does not match {space!r} (expected {exp.dtype})"
            )


def init_rollout_state(
    env: Env,
    policy: Policy,
    num_envs: int,
    key: jax.Array,
    env_params: Any = None,
    transforms: Transforms = None,
    transform_state: Any = None,
    *,
    mesh: placement.MeshLike = None,
) -> RolloutState:
    """Resets ``num_envs`` envs and returns the state a rollout starts from.

    Args:
        env, policy: as given to :func:`make_rollout`.
        num_envs: ``E``.
        key: a PRNG key (raw ``uint32[2]`` or typed); each env gets its own reset key.
        env_params: defaults to ``env.default_params``. Each leaf is shared by every env
            (the default leaf's shape) or per env (a leading ``[E]`` axis), e.g. one pole
            length per env: ``dataclasses.replace(p, length=jnp.linspace(0.4, 0.6, E))``.
        transforms: as given to :func:`make_rollout` (its ``init`` passes them): the
            first observations go through them and their state is initialised.
        transform_state: continue the statistics of this ``TransformState`` (e.g. the
            previous state's, when a sampler resets its envs: a reset discards episodes,
            not statistics): every transform's ``shared`` state is taken from it, except
            a randomizer's (its base params are ``env_params``); per-env ``rows`` start
            fresh. ``None``: fresh statistics.
        mesh: place the state on a mesh, the env axis split over its ``"env"`` axis (a
            :class:`~jax.sharding.Mesh`, devices, or a device count; see
            :mod:`jaxsampler.rollout.placement`). The state is computed by one jitted call whose
            outputs are laid out that way, so it also works on a mesh spanning processes
            (every process calls it with the same key). The values equal the unplaced
            state's up to float rounding.

    Jittable (``num_envs`` static) without ``mesh``.

    Raises:
        ValueError: an ``env_params`` leaf whose shape is neither the shared one nor
            ``[E, ...]`` (the message names the leaf and the shapes); ``num_envs`` not
            divisible by the mesh's device count (the nearest valid counts named).
    """
    m = placement.as_mesh(mesh)
    if m is not None:
        return _init_on_mesh(env, policy, num_envs, key, env_params, transforms, transform_state, m)
    state, _ = init_state_and_info(
        env, policy, num_envs, key, env_params, transforms, transform_state
    )
    return state


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray))


def _init_on_mesh(
    env: Env,
    policy: Policy,
    num_envs: int,
    key: jax.Array,
    env_params: Any,
    transforms: Transforms,
    transform_state: Any,
    mesh: jax.sharding.Mesh,
) -> RolloutState:
    _check_sizes(num_envs)
    placement.check_divisible(int(num_envs), mesh)
    pipe = check_compatible(env, policy, transforms)
    # Array leaves of the params are arguments (they may be placed already); anything else
    # (Python numbers, static config) stays a constant of the trace.
    p_leaves, p_def = jax.tree.flatten(env.default_params if env_params is None else env_params)
    arrays = [x for x in p_leaves if _is_array(x)]

    def fn(k: jax.Array, arr: list[Any], ts: Any) -> RolloutState:
        it = iter(arr)
        leaves = [next(it) if _is_array(x) else x for x in p_leaves]
        params = jax.tree.unflatten(p_def, leaves)
        return init_rollout_state(env, policy, num_envs, k, params, pipe, ts)

    shape = jax.eval_shape(fn, key, arrays, transform_state)
    out: RolloutState = jax.jit(fn, out_shardings=placement.state_sharding(env, shape, mesh))(
        key, arrays, transform_state
    )
    return out


def init_state_and_info(
    env: Env,
    policy: Policy,
    num_envs: int,
    key: jax.Array,
    env_params: Any = None,
    transforms: Transforms = None,
    transform_state: Any = None,
) -> tuple[RolloutState, Any]:
    """:func:`init_rollout_state` plus the reset ``info`` of the first observations
    (leaves ``[E, ...]``), which no trajectory buffer holds."""
    _check_sizes(num_envs)
    pipe = check_compatible(env, policy, transforms)
    env_params = env.default_params if env_params is None else env_params
    vector.param_axes(env, env_params, num_envs)  # validates the shapes, naming the leaf
    key, reset_key = jax.random.split(key)
    tstate = pipe.init((num_envs, env.num_agents))
    if transform_state is not None:
        tstate = _continued(pipe, tstate, transform_state)
    if pipe.randomizes_params:
        assert tstate is not None
        key, params_key = jax.random.split(key)
        tstate, env_params = pipe.reset_params(
            tstate,
            params_key,
            jnp.ones((num_envs,), jnp.bool_),
            vector.broadcast_params(env, env_params, num_envs),
            Context(),
        )
    env_state, ts = vector.reset(env, jax.random.split(reset_key, num_envs), env_params)
    raw_obs = None
    obs = ts.obs
    if pipe:
        assert tstate is not None
        zeros = policy_action_zeros(pipe, (num_envs, env.num_agents))
        first = jnp.ones((num_envs,), jnp.bool_)
        tstate, seen = pipe.observe_timestep(tstate, ts, first, zeros, Context())
        obs = seen.obs
        if pipe.changes_obs:
            raw_obs = ts.obs
    # Called eagerly, an env whose reset puts one array in both its state and its
    # TimeStep would hand the same buffer twice to a rollout that donates the state.
    # (The transform state too: a randomizer keeps the caller's params as its base.)
    env_state, ts, obs, raw_obs, tstate = jax.tree.map(
        lambda x: jnp.array(x, copy=True), (env_state, ts, obs, raw_obs, tstate)
    )
    # Python-number params as arrays: the rollout's output state has arrays there, and a
    # jitted rollout would otherwise compile once more for the second call's signature.
    # Copied: the state is donated, and params that are already arrays (the user's, or
    # an env's own default_params) must survive the first call.
    env_params = jax.tree.map(lambda x: jnp.array(x, copy=True), env_params)
    state = RolloutState(
        env_state=env_state,
        obs=obs,
        acting=ts.acting,
        needs_reset=jnp.zeros((num_envs,), jnp.bool_),
        episode_count=jnp.zeros((num_envs,), jnp.int32),
        episode_step=jnp.zeros((num_envs,), jnp.int32),
        policy_state=policy.initial_state((num_envs, env.num_agents)),
        key=key,
        num_steps=jnp.zeros((), jnp.int32),
        env_params=env_params,
        transform_state=tstate,
        raw_obs=raw_obs,
    )
    return state, ts.info


def _continued(pipe: Pipeline, fresh: Any, old: Any) -> Any:
    """``fresh`` with every non-randomizing transform's ``shared`` state taken from ``old``
    (a ``TransformState``, or a ``RolloutState`` carrying one)."""
    if isinstance(old, RolloutState):
        old = old.transform_state
    ok = (
        fresh is not None
        and isinstance(old, type(fresh))
        and len(old.stages) == len(fresh.stages)
        and all(
            t.randomizes_params or _same_structure(p.shared, n.shared)
            for t, p, n in zip(pipe.transforms, old.stages, fresh.stages)
        )
    )
    if not ok:
        raise ValueError(
            "transform_state does not match the transforms "
            f"({[type(t).__name__ for t in pipe.transforms]}): pass the state of a rollout "
            "with the same transforms"
        )
    stages = tuple(
        new if t.randomizes_params else dataclasses.replace(new, shared=prev.shared)
        for t, new, prev in zip(pipe.transforms, fresh.stages, old.stages)
    )
    return dataclasses.replace(fresh, stages=stages)


def _same_structure(a: Any, b: Any) -> bool:
    want: Any = jax.tree.structure(b)  # PyTreeDef: untyped for mypy
    return bool(jax.tree.structure(a) == want)


def policy_action_zeros(pipe: Pipeline, batch_shape: tuple[int, ...]) -> Any:
    """An all-zeros batch of the policy's actions, leaves ``[*batch_shape, ...]``."""
    return jax.tree.map(
        lambda z: jnp.zeros(tuple(batch_shape) + z.shape, z.dtype), pipe.action_space.zeros()
    )


def _step_outputs(
    env: Env, policy: Policy, params: Any, state: RolloutState, pipe: Pipeline
) -> tuple[Any, Any, Any]:
    """Abstract (action, extras, info) of one step, via ``jax.eval_shape``."""
    num_envs = state.needs_reset.shape[0]
    key = jax.random.PRNGKey(0)
    action, extras, _ = jax.eval_shape(policy, params, state.obs, key, state.policy_state)
    check_action(pipe.action_space, action, state.acting.shape)
    env_action = jax.eval_shape(pipe.to_env, action)
    check_action(env.action_space, env_action, state.acting.shape)
    _, ts = jax.eval_shape(
        lambda s, a: vector.step(env, jax.random.split(key, num_envs), s, a, state.env_params),
        state.env_state,
        env_action,
    )
    return action, extras, ts.info


def trajectory_spec(
    env: Env,
    policy: Policy,
    rollout_length: int,
    params: Any,
    state: RolloutState,
    transforms: Transforms = None,
) -> Trajectory:
    """Shapes and dtypes (``jax.ShapeDtypeStruct`` leaves) of the rollout's buffers."""
    pipe = pipeline_of(env, transforms)
    action, extras, info = _step_outputs(env, policy, params, state, pipe)
    T = rollout_length
    E, A = state.acting.shape

    def tm(x: Any, extra: int = 0) -> Any:
        return jax.tree.map(
            lambda leaf: jax.ShapeDtypeStruct((T + extra,) + tuple(leaf.shape), leaf.dtype), x
        )

    def sd(x: Any) -> Any:
        return jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(tuple(leaf.shape), leaf.dtype), x)

    def spec(shape: tuple[int, ...], dtype: Any) -> Any:  # a Trajectory of specs, not arrays
        return jax.ShapeDtypeStruct(shape, dtype)

    flags = spec((T, E, A), jnp.bool_)
    return Trajectory(
        obs=tm(state.obs, 1),
        actions=tm(action),
        rewards=spec((T, E, A), jnp.float32),
        terminated=flags,
        truncated=flags,
        acting=flags,
        is_reset=spec((T, E), jnp.bool_),
        extras=tm(extras),
        infos=tm(info),
        episode_count_0=spec((E,), jnp.int32),
        episode_step_0=spec((E,), jnp.int32),
        policy_state_0=sd(state.policy_state),
        raw_obs=tm(state.raw_obs, 1) if pipe.changes_obs else None,
        raw_rewards=spec((T, E, A), jnp.float32) if pipe.changes_reward else None,
        env_params=tm(state.env_params) if pipe.randomizes_params else None,
    )


def allocate_trajectory(
    env: Env,
    policy: Policy,
    rollout_length: int,
    params: Any,
    state: RolloutState,
    transforms: Transforms = None,
) -> Trajectory:
    """Zero-filled buffers for ``rollout_length`` steps (jittable)."""
    spec = trajectory_spec(env, policy, rollout_length, params, state, transforms)
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), spec)


def _write(buf: Any, t: jax.Array, value: Any) -> Any:
    return jax.tree.map(
        lambda b, v: jax.lax.dynamic_update_index_in_dim(b, v.astype(b.dtype), t, 0), buf, value
    )


@dataclasses.dataclass(frozen=True)
class Rollout:
    """One env and policy at fixed sizes, as a frozen bundle of pure functions.

    Built by :func:`make_rollout` (or :func:`jaxsampler.scale.make_sharded_rollout`); the
    state initialiser and the buffer allocator come from the same object that runs, so
    their sizes cannot disagree with the rollout's::

        rollout = js.make_rollout(env, policy, num_envs=64, rollout_length=128)
        state = rollout.init(key)
        state, traj = rollout(params, state)

    Attributes:
        num_envs: ``E``, the env axis width (global, for a sharded rollout).
        rollout_length: ``T``, steps per call.
        num_agents: ``A``, the agent axis width.
        run: ``(params, state, buffers) -> (state, traj)``, what ``__call__`` runs.
        init: ``(key, env_params=None) -> RolloutState``: resets the ``E`` envs.
        allocate: ``(params, state) -> Trajectory``: zero-filled buffers of the shapes
            ``run`` writes (jittable).
        debug: ``run`` checks values on the host after each call (``debug=True`` of
            :func:`make_rollout`); such a rollout jits itself and cannot be jitted again.
        pipeline: the transforms the rollout runs, bound to the env's spaces
            (:class:`~jaxsampler.transforms.Pipeline`; empty without transforms).
        mesh: the mesh the env axis is split over (``mesh=`` of :func:`make_rollout`),
            or ``None``.
    """

    num_envs: int
    rollout_length: int
    num_agents: int
    run: RolloutFn
    init: InitFn
    allocate: AllocateFn
    debug: bool = False
    pipeline: Pipeline | None = None
    mesh: jax.sharding.Mesh | None = None

    def __call__(
        self, params: Any, state: RolloutState, buffers: Trajectory | None = None
    ) -> tuple[RolloutState, Trajectory]:
        """Runs ``T`` steps from ``state``; see :func:`make_rollout`. Pure and jittable."""
        return self.run(params, state, buffers)


def make_rollout(
    env: Env,
    policy: Policy,
    num_envs: int,
    rollout_length: int,
    *,
    debug: bool = False,
    shard_axis: str | None = None,
    transforms: Transforms = None,
    mesh: placement.MeshLike = None,
    reset_pool: vector.ResetPool | int | None = None,
) -> Rollout:
    """Builds the rollout of ``policy`` in ``num_envs`` copies of ``env``.

    Args:
        env: the env (static configuration; its params live in ``state.env_params``).
        policy: the policy (static configuration; its params are the ``params`` argument).
        num_envs: ``E``, the env axis width.
        rollout_length: ``T``, steps per call.
        debug: if True, the returned object runs a host-side function (jitted internally
            with ``checkify``) that raises :class:`RolloutDebugError` naming the field,
            step, env and agent of the first NaN/Inf (in observations, rewards, float
            actions or extras), the first observation outside ``env.observation_space``
            and the first action outside ``env.action_space`` taken by an acting agent.
            Not for use inside your own jit.
        shard_axis: for a rollout you run inside your own ``jax.shard_map``: the mesh
            axis its env axis is a slice of. Each shard folds its axis index into its PRNG
            keys and the transforms reduce their statistics over that axis. ``num_envs``
            is then the per-shard width. (``mesh=`` needs none of this.)
        mesh: split the env axis over a mesh (a :class:`~jax.sharding.Mesh` with an
            ``"env"`` axis, devices, or a device count; :mod:`jaxsampler.rollout.placement`).
            ``num_envs`` stays the global width; the state (``rollout.init``) and the
            trajectory are sharded arrays and XLA partitions the jitted scan, so each
            device steps its own envs and reductions over envs (the transforms'
            statistics) are collectives. The random streams are those of the unsharded
            rollout: results differ across device counts by float rounding only. The
            mesh may span processes (``jax.distributed``): every process then calls the
            rollout with the same params and holds its own devices' envs.
        transforms: env->policy and policy->env transforms run inside the scan
            (:mod:`jaxsampler.transforms`, env side first), e.g.
            ``(FrameStack(4), NormalizeObservation())``. The policy must be built for the
            spaces they hand on; their state is ``state.transform_state``. ``obs`` and
            ``rewards`` of the trajectory hold what the policy saw; ``raw_obs`` /
            ``raw_rewards`` the env's own values, and ``env_params`` the params each
            env stepped with under domain randomization.
        reset_pool: ``None`` (default): every env computes its own reset (exact
            auto-reset). A :class:`~jaxsampler.vector.ResetPool` (or an int ``P``): each
            call computes ``P`` fresh resets (again every ``refresh_every`` steps) and
            envs that need a reset take a random one by gather; cheaper when the env's
            reset is expensive. Each start is a draw from the env's reset distribution,
            but starts taken from one pool may coincide (see ``ResetPool``). Its key is
            the fifth sibling of each call's first step's four streams, so the other
            streams are those of the default mode. Not with per-env params or domain
            randomization (``ValueError``). On a mesh the pool is replicated.

    Returns:
        A :class:`Rollout`. Calling it, ``rollout(params, state, buffers=None)``, runs
        ``T`` steps from ``state`` (a :class:`RolloutState`, e.g. from
        ``rollout.init(key)``) and returns the new state and a :class:`Trajectory` of
        shape ``[T, E, A, ...]`` (``obs``: ``T + 1``). ``buffers`` (a previous trajectory
        of the same shapes) is overwritten in place when donated. Pure and jittable; no
        Python branching on traced values; shapes are checked at trace time.

    Raises:
        ValueError / TypeError: bad sizes, mismatched spaces, ``num_envs`` not divisible
        by the mesh (the nearest valid counts named), ``reset_pool`` with domain
        randomization; at trace time, actions of the wrong shape or dtype, ``reset_pool``
        with per-env params.
    """
    _check_sizes(num_envs, rollout_length)
    pipe = check_compatible(env, policy, transforms)
    pool = vector.as_reset_pool(reset_pool)
    if pool is not None and pipe.randomizes_params:
        raise ValueError(
            "reset_pool= cannot be used with domain randomization (transforms "
            f"{[type(t).__name__ for t in pipe.transforms if t.randomizes_params]} draw new "
            "env params for each reset env, and a pooled reset is built with one set of "
            "params): use the exact auto-reset (reset_pool=None)"
        )
    T, E, A = int(rollout_length), int(num_envs), env.num_agents
    ctx = Context(axis_name=shard_axis)
    m = placement.as_mesh(mesh)
    if m is not None:
        if shard_axis is not None:
            raise ValueError("pass mesh= or shard_axis=, not both")
        placement.check_divisible(E, m)

    def place_state(state: RolloutState) -> RolloutState:
        if m is None:
            return state
        out: RolloutState = placement.constrain(state, placement.state_sharding(env, state, m))
        return out

    def place_traj(traj: Trajectory) -> Trajectory:
        if m is None:
            return traj
        out: Trajectory = placement.constrain(traj, placement.traj_sharding(traj, m))
        return out

    def allocate(params: Any, state: RolloutState) -> Trajectory:
        return place_traj(allocate_trajectory(env, policy, T, params, state, pipe))

    def init(key: jax.Array, env_params: Any = None) -> RolloutState:
        return init_rollout_state(env, policy, E, key, env_params, pipe, mesh=m)

    def rollout(
        params: Any, state: RolloutState, buffers: Trajectory | None = None
    ) -> tuple[RolloutState, Trajectory]:
        if state.needs_reset.shape != (E,):
            raise ValueError(
                f"state was built for {state.needs_reset.shape[0]} envs, rollout for {E}"
            )
        _check_transform_state(pipe, state)
        state = place_state(state)
        buffers = allocate(params, state) if buffers is None else place_traj(buffers)
        starts = None
        if pool is not None:
            pool.check_params(env, state.env_params, E)
            replicated = (
                None if m is None else jax.sharding.NamedSharding(m, jax.sharding.PartitionSpec())
            )
            # split(key, 5)[4]: a sibling of the first step's four streams, none of them.
            k_pool = jax.random.split(state.key, 5)[4]
            starts = pool.draw(
                env, k_pool, T, state.env_params, shard_axis=shard_axis, sharding=replicated
            )
        init_pstate = policy.initial_state((E, A))
        has_pstate = len(jax.tree.leaves(init_pstate)) > 0
        buf0 = dataclasses.replace(
            buffers,
            episode_count_0=state.episode_count,
            episode_step_0=state.episode_step,
            policy_state_0=state.policy_state,
        )

        def body(
            carry: tuple[RolloutState, Trajectory], t: jax.Array
        ) -> tuple[tuple[RolloutState, Trajectory], None]:
            rs, buf = carry
            rs, buf = place_state(rs), place_traj(buf)
            key, k_pol, k_step, k_reset = jax.random.split(rs.key, 4)
            # A fifth stream only for randomized params: other streams stay as they were.
            k_params = jax.random.fold_in(k_reset, 1) if pipe.randomizes_params else None
            if shard_axis is not None:  # distinct streams per shard, same carried key
                shard = jax.lax.axis_index(shard_axis)
                k_pol, k_step, k_reset = (
                    jax.random.fold_in(k, shard) for k in (k_pol, k_step, k_reset)
                )
                if k_params is not None:
                    k_params = jax.random.fold_in(k_params, shard)
            # Separate splits: an env whose step ignores its key lets XLA drop that work.
            step_keys, reset_keys = jax.random.split(k_step, E), jax.random.split(k_reset, E)
            pstate = rs.policy_state
            if has_pstate:
                pstate = vector.select_envs(rs.episode_step == 0, init_pstate, pstate)
            action, extras, pstate = policy(params, rs.obs, k_pol, pstate)
            check_action(pipe.action_space, action, (E, A))
            env_action = pipe.to_env(action) if pipe.changes_action else action
            check_action(env.action_space, env_action, (E, A))
            tstate, env_params = rs.transform_state, rs.env_params
            if pipe.randomizes_params:
                assert k_params is not None
                tstate, env_params = pipe.reset_params(
                    tstate, k_params, rs.needs_reset, env_params, ctx
                )
            if pool is None or starts is None:
                env_state, ts = vector.autoreset_step(
                    env, step_keys, reset_keys, rs.env_state, env_action, rs.needs_reset, env_params
                )
            else:  # k_reset picks each env's pool entry; reset_keys go unused (XLA drops them)
                env_state, ts = pool.autoreset_step(
                    env,
                    step_keys,
                    k_reset,
                    t,
                    starts,
                    rs.env_state,
                    env_action,
                    rs.needs_reset,
                    env_params,
                )
            obs, reward = ts.obs, ts.reward
            if pipe:
                tstate, seen = pipe.observe_timestep(tstate, ts, rs.needs_reset, action, ctx)
                obs, reward = seen.obs, seen.reward
            acting = rs.acting & ~rs.needs_reset[:, None]
            if pipe.changes_obs:
                buf = dataclasses.replace(buf, raw_obs=_write(buf.raw_obs, t, rs.raw_obs))
            if pipe.changes_reward:
                buf = dataclasses.replace(buf, raw_rewards=_write(buf.raw_rewards, t, ts.reward))
            if pipe.randomizes_params:
                buf = dataclasses.replace(buf, env_params=_write(buf.env_params, t, env_params))
            buf = dataclasses.replace(
                buf,
                obs=_write(buf.obs, t, rs.obs),
                actions=_write(buf.actions, t, action),
                rewards=_write(buf.rewards, t, reward),
                terminated=_write(buf.terminated, t, ts.terminated),
                truncated=_write(buf.truncated, t, ts.truncated),
                acting=_write(buf.acting, t, acting),
                is_reset=_write(buf.is_reset, t, rs.needs_reset),
                extras=_write(buf.extras, t, extras),
                infos=_write(buf.infos, t, ts.info),
            )
            done = jnp.all(ts.terminated | ts.truncated, axis=-1)
            rs = dataclasses.replace(
                rs,
                env_state=env_state,
                obs=obs,
                raw_obs=ts.obs if pipe.changes_obs else rs.raw_obs,
                transform_state=tstate,
                env_params=env_params,
                acting=ts.acting,
                needs_reset=done,
                episode_count=rs.episode_count + rs.needs_reset.astype(jnp.int32),
                episode_step=jnp.where(rs.needs_reset, 0, rs.episode_step + 1),
                policy_state=pstate,
                key=key,
                num_steps=rs.num_steps + 1,
            )
            return (place_state(rs), place_traj(buf)), None

        (state, buf), _ = jax.lax.scan(body, (state, buf0), jnp.arange(T, dtype=jnp.int32))
        buf = dataclasses.replace(buf, obs=_write(buf.obs, jnp.int32(T), state.obs))
        if pipe.changes_obs:
            buf = dataclasses.replace(buf, raw_obs=_write(buf.raw_obs, jnp.int32(T), state.raw_obs))
        return place_state(state), place_traj(buf)

    run: RolloutFn = _debug_rollout(env, rollout, pipe) if debug else rollout
    return Rollout(
        E, T, A, run=run, init=init, allocate=allocate, debug=debug, pipeline=pipe, mesh=m
    )


def _check_transform_state(pipe: Pipeline, state: RolloutState) -> None:
    """A state built without this rollout's transforms fails here, not deep in the scan."""
    want_state = pipe.init((1, 1))
    got_state = state.transform_state
    if (
        pipe.randomizes_params
        and isinstance(want_state, TransformState)
        and isinstance(got_state, TransformState)
        and len(want_state.stages) == len(got_state.stages)
    ):
        # A randomizer's state is filled by its first draw (it keeps the params the state
        # was initialised with), so its structure follows the env's params.
        want_state = dataclasses.replace(
            want_state,
            stages=tuple(
                g if t.randomizes_params else w
                for t, w, g in zip(pipe.transforms, want_state.stages, got_state.stages)
            ),
        )
    if not _same_structure(got_state, want_state) or (pipe.changes_obs and state.raw_obs is None):
        names = [type(t).__name__ for t in pipe.transforms] or "no transforms"
        raise ValueError(
            f"state.transform_state does not match this rollout's transforms ({names}): build "
            "the state with rollout.init(key), or pass the same transforms= to "
            "init_rollout_state"
        )


def jit_rollout(rollout: Rollout) -> Rollout:
    """The same :class:`Rollout`, jitted, donating the state and the buffers.

    A call without ``buffers`` first allocates them with a small separate jitted
    function, so the rollout compiles once: the first call and the steady-state calls
    (which pass the previous trajectory back) share one executable. ``init`` is kept
    as it is (it runs once).
    """
    if not isinstance(rollout, Rollout):
        raise TypeError(
            f"jit_rollout takes the Rollout that make_rollout returns, got {type(rollout).__name__}"
        )
    if rollout.debug:
        raise TypeError(
            "jit_rollout: a debug=True rollout checks its values on the host after each call, "
            "which cannot run under jit; call it directly (its steps are jitted inside)"
        )
    jitted = jax.jit(rollout.run, donate_argnums=(1, 2))
    allocate = jax.jit(rollout.allocate)

    def call(
        params: Any, state: RolloutState, buffers: Trajectory | None = None
    ) -> tuple[RolloutState, Trajectory]:
        if buffers is None:
            buffers = allocate(params, state)
        return jitted(params, state, buffers)

    return dataclasses.replace(rollout, run=call, allocate=allocate)


# --------------------------------------------------------------------------- debug mode


def _first_bad(bad: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(any, flat index of the first True)`` of a bool array ``[T, E, A]``."""
    flat = bad.reshape(-1)
    return jnp.any(flat), jnp.argmax(flat)


def _debug_checks(env: Env, traj: Trajectory, pipe: Pipeline) -> None:
    T, E, A = traj.rewards.shape
    candidates: list[tuple[str, jax.Array]] = []

    def nonfinite(name: str, tree: Any) -> None:
        for i, leaf in enumerate(jax.tree.leaves(tree)):
            if jnp.issubdtype(leaf.dtype, jnp.inexact):
                bad = ~jnp.isfinite(leaf.reshape(leaf.shape[:3] + (-1,))).all(-1)
                where = "" if i == 0 else f"[leaf {i}]"
                # [:T]: the observation track's extra slot T is the next call's slot 0.
                candidates.append((f"non-finite {name}{where}", bad[:T]))

    nonfinite("observation", traj.obs)
    nonfinite("reward", traj.rewards)
    nonfinite("action", traj.actions)
    for k in sorted(traj.extras) if isinstance(traj.extras, dict) else []:
        nonfinite(f"extra model output {k!r}", traj.extras[k])
    # The env's own observations against its space; actions against the policy's space.
    raw = traj.obs if traj.raw_obs is None else traj.raw_obs
    obs_in = jax.vmap(jax.vmap(jax.vmap(env.observation_space.contains)))(raw)
    candidates.append((f"observation outside {env.observation_space!r}", ~obs_in[:T]))
    act_space = pipe.action_space
    act_in = jax.vmap(jax.vmap(jax.vmap(act_space.contains)))(traj.actions)
    candidates.append((f"action outside {act_space!r} (acting agent)", ~act_in & traj.acting))
    firsts = [(name, *_first_bad(bad)) for name, bad in candidates]
    big = jnp.int32(T * E * A)
    earliest = jnp.min(jnp.stack([jnp.where(found, idx, big) for _, found, idx in firsts]))
    for name, found, idx in firsts:
        t, e, a = idx // (E * A), (idx // A) % E, idx % A
        checkify.check(
            ~(found & (idx == earliest)),
            name + " at step {t} (of this call), env {e}, agent {a}",
            t=t,
            e=e,
            a=a,
        )


def _debug_rollout(env: Env, rollout: RolloutFn, pipe: Pipeline) -> RolloutFn:
    def checked(
        params: Any, state: RolloutState, buffers: Trajectory | None = None
    ) -> tuple[RolloutState, Trajectory]:
        state, traj = rollout(params, state, buffers)
        _debug_checks(env, traj, pipe)
        return state, traj

    jitted = jax.jit(checkify.checkify(checked, errors=checkify.user_checks))

    def debug_rollout(
        params: Any, state: RolloutState, buffers: Trajectory | None = None
    ) -> tuple[RolloutState, Trajectory]:
        err, out = jitted(params, state, buffers)
        msg = err.get()
        if msg is not None:
            raise RolloutDebugError(msg.split(" (`check`")[0].strip())
        return out

    return debug_rollout
