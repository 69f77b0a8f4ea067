"""The rollout: env + policy in one ``lax.scan``, writing into preallocated buffers.

::

    rollout = js.make_rollout(env, policy, num_envs=64, rollout_length=128)
    state = js.init_rollout_state(env, policy, num_envs=64, key=key)
    state, traj = rollout(params, state)          # pure: call it inside your own jit

The buffers (:class:`~jaxsampler.types.Trajectory`) are scan carries updated in place;
pass the previous call's trajectory back (``rollout(params, state, traj)``) under a jit
that donates it (:func:`jit_rollout` does) and steady-state sampling allocates nothing.
See :mod:`jaxsampler.types` for the layout and the auto-reset contract. The scan body is
composed of the parts in :mod:`~jaxsampler.rollout.keys`, :mod:`~jaxsampler.rollout.step`
and :mod:`~jaxsampler.rollout.buffers`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxsampler import vector
from jaxsampler.envs.base import Env
from jaxsampler.policies.base import Policy
from jaxsampler.rollout import placement
from jaxsampler.rollout.buffers import (
    allocate_trajectory,
    trajectory_spec,
    with_start,
    write,
    write_next_obs,
)
from jaxsampler.rollout.compat import (
    Transforms,
    check_action,
    check_compatible,
    check_sizes,
    pipeline_of,
)
from jaxsampler.rollout.compat import check_policy_fits as check_policy_fits
from jaxsampler.rollout.debug import RolloutDebugError, debug_rollout
from jaxsampler.rollout.keys import pool_key, step_keys
from jaxsampler.rollout.state import check_transform_state, init_on_mesh, init_state_and_info
from jaxsampler.rollout.state import policy_action_zeros as policy_action_zeros
from jaxsampler.rollout.step import advance, env_step, policy_step
from jaxsampler.transforms.base import Context, Pipeline
from jaxsampler.types import RolloutState, Trajectory

# The parts' public names stay importable from here, as before the split (the samplers and
# evaluation import check_policy_fits, init_state_and_info and policy_action_zeros so).
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

#: ``(params, state, buffers=None) -> (state, traj)``: one rollout call.
RolloutFn = Callable[..., tuple[RolloutState, Trajectory]]
#: ``(key, env_params=None) -> state``: the state a rollout starts from.
InitFn = Callable[..., RolloutState]
#: ``(params, state) -> buffers``: zero-filled trajectory buffers.
AllocateFn = Callable[[Any, RolloutState], Trajectory]


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
        return init_on_mesh(env, policy, num_envs, key, env_params, transforms, transform_state, m)
    state, _ = init_state_and_info(
        env, policy, num_envs, key, env_params, transforms, transform_state
    )
    return state


@dataclasses.dataclass(frozen=True)
class Rollout:
    """One env and policy at fixed sizes, as a frozen bundle of pure functions.

    Built by :func:`make_rollout` (or the deprecated ``js.make_sharded_rollout``); the
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
            randomization; at trace time, actions of the wrong shape or dtype,
            ``reset_pool`` with per-env params.
    """
    check_sizes(num_envs, rollout_length)
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
    randomizes = pipe.randomizes_params
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
        check_transform_state(pipe, state)
        state = place_state(state)
        buffers = allocate(params, state) if buffers is None else place_traj(buffers)
        starts = None
        if pool is not None:
            pool.check_params(env, state.env_params, E)
            replicated = (
                None if m is None else jax.sharding.NamedSharding(m, jax.sharding.PartitionSpec())
            )
            starts = pool.draw(
                env,
                pool_key(state.key),
                T,
                state.env_params,
                shard_axis=shard_axis,
                sharding=replicated,
            )
        init_pstate = policy.initial_state((E, A))
        buf0 = with_start(buffers, state)

        def body(
            carry: tuple[RolloutState, Trajectory], t: jax.Array
        ) -> tuple[tuple[RolloutState, Trajectory], None]:
            rs, buf = carry
            rs, buf = place_state(rs), place_traj(buf)
            keys = step_keys(rs.key, E, shard_axis=shard_axis, params_stream=randomizes)
            act = policy_step(policy, pipe, env, params, rs, keys.policy, init_pstate)
            transition, outcome = env_step(
                env, pipe, rs, act, keys, t, ctx=ctx, pool=pool, starts=starts
            )
            buf = write(buf, t, transition)
            rs = advance(rs, transition, outcome, keys.carry)
            return (place_state(rs), place_traj(buf)), None

        (state, buf), _ = jax.lax.scan(body, (state, buf0), jnp.arange(T, dtype=jnp.int32))
        raw_obs = state.raw_obs if pipe.changes_obs else None
        buf = write_next_obs(buf, jnp.int32(T), state.obs, raw_obs)
        return place_state(state), place_traj(buf)

    run: RolloutFn = debug_rollout(env, rollout, pipe) if debug else rollout
    return Rollout(
        E, T, A, run=run, init=init, allocate=allocate, debug=debug, pipeline=pipe, mesh=m
    )


def jit_rollout(rollout: Rollout) -> Rollout:
    """The same :class:`Rollout`, jitted, donating the state and the buffers.

    A call without ``buffers`` first allocates them with a small separate jitted
    function, so the rollout compiles once: the first call and the steady-state calls
    (which pass the previous trajectory back) share one executable. ``init`` is kept
    as it is (it runs once).

    Args:
        rollout: a :class:`Rollout` from :func:`make_rollout` (not ``debug=True``).

    Returns:
        The :class:`Rollout` with ``run`` jitted (``donate_argnums=(1, 2)``: the state
        and buffers passed in are consumed) and ``allocate`` jitted. Not itself for use
        under another jit (call ``rollout.run`` unjitted there).

    Raises:
        TypeError: ``rollout`` is not a :class:`Rollout`, or is a debug rollout.
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
