"""The state a rollout starts from, and the checks that a state fits a rollout.

Kept apart from the scan: samplers and evaluation build states (and need the reset
``info``) without building a rollout.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxsampler import vector
from jaxsampler.envs.base import Env
from jaxsampler.policies.base import Policy
from jaxsampler.rollout import placement
from jaxsampler.rollout.compat import Transforms, check_compatible, check_sizes
from jaxsampler.transforms.base import Context, Pipeline, TransformState
from jaxsampler.types import RolloutState

__all__ = [
    "init_state_and_info",
    "init_on_mesh",
    "check_transform_state",
    "policy_action_zeros",
    "same_structure",
]


def init_state_and_info(
    env: Env,
    policy: Policy,
    num_envs: int,
    key: jax.Array,
    env_params: Any = None,
    transforms: Transforms = None,
    transform_state: Any = None,
) -> tuple[RolloutState, Any]:
    """:func:`~jaxsampler.rollout.scan.init_rollout_state` (without ``mesh``) plus the
    reset ``info`` of the first observations, which no trajectory buffer holds.

    Args:
        env, policy, num_envs, key, env_params, transforms, transform_state: as for
            :func:`~jaxsampler.rollout.scan.init_rollout_state`.

    Returns:
        ``(state, info)``: the :class:`~jaxsampler.types.RolloutState` (leaves ``[E, ...]``;
        counters ``int32``, flags ``bool``) and the env's reset info (leaves ``[E, ...]``).
        Jittable with ``num_envs`` static.

    Raises:
        ValueError: bad ``num_envs``, mismatched spaces, an ``env_params`` leaf of neither
            the shared nor an ``[E, ...]`` shape, a ``transform_state`` of other transforms.
    """
    check_sizes(num_envs)
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


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray))


def init_on_mesh(
    env: Env,
    policy: Policy,
    num_envs: int,
    key: jax.Array,
    env_params: Any,
    transforms: Transforms,
    transform_state: Any,
    mesh: jax.sharding.Mesh,
) -> RolloutState:
    """:func:`init_state_and_info`'s state, computed by one jitted call whose outputs are
    laid out on ``mesh`` (the env axis over its ``"env"`` axis).

    Args:
        env, policy, num_envs, key, env_params, transforms, transform_state: as for
            :func:`init_state_and_info`.
        mesh: the mesh; it may span processes (each then calls this with the same key).

    Returns:
        The placed :class:`~jaxsampler.types.RolloutState`. Not for use under jit (it jits).

    Raises:
        ValueError: as :func:`init_state_and_info`, and ``num_envs`` not divisible by the
            mesh's device count.
    """
    check_sizes(num_envs)
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
        state, _ = init_state_and_info(env, policy, num_envs, k, params, pipe, ts)
        return state

    shape = jax.eval_shape(fn, key, arrays, transform_state)
    out: RolloutState = jax.jit(fn, out_shardings=placement.state_sharding(env, shape, mesh))(
        key, arrays, transform_state
    )
    return out


def check_transform_state(pipe: Pipeline, state: RolloutState) -> None:
    """Raises if ``state`` was built without ``pipe``'s transforms, so such a state fails
    here rather than deep in the scan.

    Args:
        pipe: the rollout's bound pipeline.
        state: the state about to be rolled out.

    Static (compares pytree structures); safe under jit.

    Raises:
        ValueError: another transform-state structure, or no ``raw_obs`` where the
            transforms change observations.
    """
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
    if not same_structure(got_state, want_state) or (pipe.changes_obs and state.raw_obs is None):
        names = [type(t).__name__ for t in pipe.transforms] or "no transforms"
        raise ValueError(
            f"state.transform_state does not match this rollout's transforms ({names}): build "
            "the state with rollout.init(key), or pass the same transforms= to "
            "init_rollout_state"
        )


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
            t.randomizes_params or same_structure(p.shared, n.shared)
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


def same_structure(a: Any, b: Any) -> bool:
    """Whether pytrees ``a`` and ``b`` have one structure (leaves not compared; static)."""
    want: Any = jax.tree.structure(b)  # PyTreeDef: untyped for mypy
    return bool(jax.tree.structure(a) == want)


def policy_action_zeros(pipe: Pipeline, batch_shape: tuple[int, ...]) -> Any:
    """An all-zeros batch of the policy's actions.

    Args:
        pipe: the bound pipeline; its ``action_space`` is the policy's.
        batch_shape: the leading dims, e.g. ``(E, A)``.

    Returns:
        The action pytree, leaves ``[*batch_shape, ...]`` of the space's dtypes. Jittable.
    """
    return jax.tree.map(
        lambda z: jnp.zeros(tuple(batch_shape) + z.shape, z.dtype), pipe.action_space.zeros()
    )
