"""``debug=True``: checkify checks of a rollout's trajectory, raised on the host.

Apart from the scan because they run after it, on the whole trajectory: the scan body
stays free of checks, and a rollout without ``debug`` traces none of this.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import checkify

from jaxsampler.envs.base import Env
from jaxsampler.transforms.base import Pipeline
from jaxsampler.types import RolloutState, Trajectory

__all__ = ["RolloutDebugError", "debug_checks", "debug_rollout", "raise_if_failed"]

#: ``(params, state, buffers=None) -> (state, traj)``: one rollout call.
RolloutFn = Callable[..., tuple[RolloutState, Trajectory]]


class RolloutDebugError(FloatingPointError):
    """Raised by a ``debug=True`` rollout: a NaN/Inf or an out-of-space value was found."""


def _first_bad(bad: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(any, flat index of the first True)`` of a bool array ``[T, E, A]``."""
    flat = bad.reshape(-1)
    return jnp.any(flat), jnp.argmax(flat)


def debug_checks(env: Env, traj: Trajectory, pipe: Pipeline) -> None:
    """Adds ``checkify`` checks that fail on the trajectory's earliest bad value.

    Checked: non-finite float observations, rewards, actions and extras; observations
    (the env's own) outside ``env.observation_space``; actions of acting agents outside
    the policy's action space; a step where more agents act than the env's
    ``max_acting``. Only the earliest (in ``[T, E, A]`` order) of all the
    candidates fails, with a message naming it and its step, env and agent.

    Args:
        env: the env (its observation space).
        traj: the call's trajectory (``obs`` ``[T + 1, E, A, ...]``, the rest ``[T, ...]``).
        pipe: the bound pipeline (its action space is the policy's).

    Must be traced under ``checkify.checkify(..., errors=checkify.user_checks)``.
    """
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
    k = getattr(env, "max_acting", None)
    if k is not None:  # the policy ran on k rows per env: more acting agents got no action
        crowded = jnp.sum(traj.acting, axis=-1, keepdims=True) > k
        candidates.append(
            (
                f"more agents acting than the env's max_acting={k} (acting agent)",
                crowded & traj.acting,
            )
        )
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


def raise_if_failed(err: checkify.Error) -> None:
    """Raises :class:`RolloutDebugError` with ``err``'s message, if a check failed.

    The message is checkify's without the source location it appends (`` (`check`
    failed at ...)``). Host-side: not for use under jit.
    """
    msg = err.get()
    if msg is not None:
        raise RolloutDebugError(msg.split(" (`check`")[0].strip())


def debug_rollout(env: Env, rollout: RolloutFn, pipe: Pipeline) -> RolloutFn:
    """``rollout`` checked by :func:`debug_checks` after each call.

    Args:
        env: the env (its observation space).
        rollout: the pure rollout function ``(params, state, buffers=None) -> (state,
            traj)``.
        pipe: the bound pipeline.

    Returns:
        A host-side function of the same signature that runs ``rollout`` and the checks
        in one jitted ``checkify`` call (compiled once per argument signature) and raises
        :class:`RolloutDebugError` naming the first bad value. Not for use under jit.
    """

    def checked(
        params: Any, state: RolloutState, buffers: Trajectory | None = None
    ) -> tuple[RolloutState, Trajectory]:
        state, traj = rollout(params, state, buffers)
        debug_checks(env, traj, pipe)
        return state, traj

    jitted = jax.jit(checkify.checkify(checked, errors=checkify.user_checks))

    def run(
        params: Any, state: RolloutState, buffers: Trajectory | None = None
    ) -> tuple[RolloutState, Trajectory]:
        err, out = jitted(params, state, buffers)
        raise_if_failed(err)
        return out

    return run
