"""Off-policy targets over rollout buffers: n-step returns and V-trace (jittable).

Same ``[T, E, A]`` layout and the same boundary rules as
:func:`jaxsampler.postprocessing.gae`:

* **termination**: no bootstrap;
* **truncation**: bootstrap from the value of the episode's *real final observation*
  (next-step auto-reset puts it in the reset step's slot, so ``values`` there holds it);
* **rollout cut**: bootstrap from ``last_value`` (the value of ``obs[T]``);
* **acting masks**: each agent's targets run over its own agent steps
  (:mod:`jaxsampler.offpolicy.segments`): rewards received while it waits are credited to
  its previous action, a done flag raised while it waits ends that action's step, and the
  discount is applied once per agent step. Non-acting and reset steps get 0.

The one difference from ``gae``: an agent whose done flag is raised while its episode
goes on (other agents still acting) ends its step one slot after the flag, where its real
final observation is (the host sampler's rule), not at the reset step; the two agree
whenever an agent's done flags are raised at its episode's last step, as in every
built-in env.

All functions are pure and safe under ``jit`` and ``vmap``; shapes and dtypes are checked
at trace time.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsampler.offpolicy._extra import require
from jaxsampler.offpolicy.segments import agent_segments
from jaxsampler.postprocessing import _check_coefficient, _check_shapes
from jaxsampler.types import Trajectory

__all__ = [
    "NStepTargets",
    "VTraceOutput",
    "n_step_targets",
    "n_step_returns",
    "compute_n_step_returns",
    "vtrace",
    "compute_vtrace",
]

_FLAGS = ("terminated", "truncated", "acting", "is_reset")


@struct.dataclass
class NStepTargets:
    """What an n-step target needs besides a value: ``target = reward_sum + discount *
    V(obs[bootstrap_index])``, with ``V(obs[T])`` the rollout cut's value.

    Attributes:
        reward_sum: ``float32[T, E, A]``, the discounted reward sum over the agent's next
            ``n`` agent steps (fewer where its episode ends or the rollout is cut).
        discount: ``float32[T, E, A]``, ``gamma ** m`` over the ``m`` agent steps summed,
            0 after a termination.
        bootstrap_index: ``int32[T, E, A]``, the observation slot (``0 .. T``) to bootstrap
            from: the agent's observation ``n`` agent steps on, the real final observation
            of a truncated episode, or ``T`` at the cut.

    All three are 0 where the agent did not act.
    """

    reward_sum: jax.Array
    discount: jax.Array
    bootstrap_index: jax.Array


@struct.dataclass
class VTraceOutput:
    """V-trace targets and policy-gradient advantages, ``float32[T, E, A]``, 0 where the
    agent did not act.

    Attributes:
        vs: the V-trace value targets.
        pg_advantages: ``min(clip_pg_rho_threshold, rho) * (q - values)``.
        rhos: the unclipped importance ratios ``exp(target_logp - behaviour_logp)`` (1
            where the agent did not act).
    """

    vs: jax.Array
    pg_advantages: jax.Array
    rhos: jax.Array


def _check_inputs(rewards: Any, floats: dict[str, Any], flags: dict[str, Any]) -> None:
    for name, arr in {"rewards": rewards, **floats, **flags}.items():
        if not hasattr(arr, "shape") or not hasattr(arr, "dtype"):
            raise TypeError(f"{name} must be an array, got {type(arr).__name__}")
    known = {k: v for k, v in {**floats, **flags}.items() if k in ("values", "last_value")}
    _check_shapes(rewards, **known, **flags)
    for name, arr in floats.items():
        if name not in known and tuple(arr.shape) != tuple(rewards.shape):
            raise ValueError(
                f"{name} has shape {tuple(arr.shape)}, expected {tuple(rewards.shape)} to "
                f"match rewards {tuple(rewards.shape)}"
            )
    for name, arr in {"rewards": rewards, **floats}.items():
        if not jnp.issubdtype(arr.dtype, jnp.floating):
            raise TypeError(f"{name} must have a floating dtype, got {arr.dtype}")
    for name, arr in flags.items():
        if arr.dtype != jnp.bool_:
            raise TypeError(f"{name} must have dtype bool, got {arr.dtype}")


def _check_n(n: Any) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a Python int >= 1 (static), got {n!r}")


def n_step_targets(
    rewards: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    acting: jax.Array,
    is_reset: jax.Array,
    n: int,
    gamma: float = 0.99,
) -> NStepTargets:
    """Reward sums, discounts and bootstrap slots of n-step targets (see the module
    docstring for the boundaries).

    A replay learner bootstraps later with its own (target) network:
    ``reward_sum + discount * q_target(obs[bootstrap_index])``. rlax's
    ``n_step_bootstrapped_returns`` returns only the bootstrapped number, needs the values
    up front, and knows neither acting masks nor truncation (one discount sequence cannot
    say "bootstrap here, then stop"), so this walks the agent steps itself; the tests
    compare it with rlax where both apply.

    Args:
        rewards: ``float[T, E, A]``.
        terminated, truncated, acting: ``bool[T, E, A]``; is_reset: ``bool[T, E]``.
        n: agent steps per target (a static Python int >= 1).
        gamma: discount in [0, 1] (a float or a traced scalar).

    Returns:
        :class:`NStepTargets`. Cost: ``n`` gathers over the buffers.

    Raises:
        ValueError: mismatched shapes, ``n`` not an int >= 1, gamma outside [0, 1].
        TypeError: a non-array input, or a wrong dtype (flags must be bool, rewards float).
    """
    _check_n(n)
    _check_coefficient("gamma", gamma)
    flags = {"terminated": terminated, "truncated": truncated, "acting": acting}
    _check_inputs(rewards, {}, {**flags, "is_reset": is_reset})
    seg = agent_segments(rewards, terminated, truncated, acting, is_reset)
    T = rewards.shape[0]
    take = lambda x, pos: jnp.take_along_axis(x, pos, axis=0)
    pos = jnp.broadcast_to(
        jnp.arange(T, dtype=jnp.int32).reshape((T,) + (1,) * (rewards.ndim - 1)), rewards.shape
    )
    alive = acting
    disc = jnp.ones(rewards.shape, jnp.float32)
    reward_sum = jnp.zeros(rewards.shape, jnp.float32)
    discount = jnp.zeros(rewards.shape, jnp.float32)
    boot = jnp.zeros(rewards.shape, jnp.int32)
    for k in range(n):
        reward_sum = reward_sum + jnp.where(alive, disc * take(seg.reward, pos), 0.0)
        disc = disc * gamma
        cont = take(seg.continues, pos)
        ending = alive & (~cont if k < n - 1 else True)
        boot = jnp.where(ending, take(seg.end, pos), boot)
        discount = jnp.where(ending, jnp.where(take(seg.terminated, pos), 0.0, disc), discount)
        alive = alive & cont
        pos = jnp.where(alive, take(seg.end, pos), pos)
    return NStepTargets(reward_sum=reward_sum, discount=discount, bootstrap_index=boot)


def _at_slots(values: jax.Array, last_value: jax.Array, index: jax.Array) -> jax.Array:
    """``values`` extended by ``last_value`` at slot ``T``, read at ``index`` (``[T, E, A]``)."""
    ext = jnp.concatenate([values, last_value[None]], axis=0).astype(jnp.float32)
    return jnp.take_along_axis(ext, index, axis=0)


def n_step_returns(
    rewards: jax.Array,
    values: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    acting: jax.Array,
    is_reset: jax.Array,
    last_value: jax.Array,
    n: int,
    gamma: float = 0.99,
) -> jax.Array:
    """n-step bootstrapped returns ``reward_sum + discount * V(obs[bootstrap_index])`` of
    :func:`n_step_targets`, with ``V`` read from ``values`` (and ``last_value`` at the cut).

    Args:
        rewards: ``float[T, E, A]``.
        values: ``float[T, E, A]``, the value of ``obs[t]`` (at reset steps: the ending
            episode's final observation, as the rollout's ``vf_preds`` hold it).
        terminated, truncated, acting: ``bool[T, E, A]``; is_reset: ``bool[T, E]``.
        last_value: ``float[E, A]``, the value of ``obs[T]``.
        n: agent steps per return (static int >= 1); gamma: discount in [0, 1].

    Returns:
        ``float32[T, E, A]``, 0 where the agent did not act. Pure; jit- and vmap-safe.

    Raises:
        ValueError / TypeError: as :func:`n_step_targets`, and for ``values`` /
            ``last_value`` of the wrong shape or a non-float dtype.
    """
    _check_inputs(rewards, {"values": values, "last_value": last_value}, {})
    t = n_step_targets(rewards, terminated, truncated, acting, is_reset, n, gamma)
    out = t.reward_sum + t.discount * _at_slots(values, last_value, t.bootstrap_index)
    return jnp.where(acting, out, 0.0)


def compute_n_step_returns(
    traj: Trajectory,
    last_value: jax.Array,
    n: int,
    gamma: float = 0.99,
    value_key: str = "vf_preds",
) -> jax.Array:
    """:func:`n_step_returns` on a :class:`~jaxsampler.types.Trajectory` whose extras hold
    ``value_key``.

    Raises:
        KeyError: the extras have no ``value_key``; and as :func:`n_step_returns`.
    """
    values = _extra(traj, value_key)
    return n_step_returns(
        traj.rewards,
        values,
        traj.terminated,
        traj.truncated,
        traj.acting,
        traj.is_reset,
        last_value,
        n,
        gamma,
    )


def vtrace(
    behaviour_logp: jax.Array,
    target_logp: jax.Array,
    rewards: jax.Array,
    values: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    acting: jax.Array,
    is_reset: jax.Array,
    last_value: jax.Array,
    gamma: float = 0.99,
    lam: float = 1.0,
    clip_rho_threshold: float = 1.0,
    clip_pg_rho_threshold: float = 1.0,
) -> VTraceOutput:
    """V-trace (IMPALA, Espeholt et al. 2018) over each agent's own steps.

    With ``rho = exp(target_logp - behaviour_logp)``, ``c = lam * min(1, rho)`` (``c-bar``
    is 1, as in rlax), ``d = gamma`` per agent step (0 after a termination) and ``V'`` the
    value of the observation the agent step ends at (:mod:`~jaxsampler.offpolicy.segments`):
    ``vs - V = min(clip_rho_threshold, rho) * (r + d V' - V) + d c (vs' - V')`` where the
    trace continues only while the episode does (it stops, bootstrapping from ``V'``, at
    a truncation and at the rollout cut), and
    ``pg_advantage = min(clip_pg_rho_threshold, rho) * (r + d (lam vs' + (1 - lam) V') - V)``
    (rlax's ``lam`` mixing; ``vs' = V'`` where the trace stops).

    The trace itself is ``rlax.vtrace``: fed the agent steps' rewards, their bootstrap
    values ``V'``, ``lam`` cut to 0 where the trace stops (truncation, cut) and
    ``sample_mask = acting`` it gets truncation and acting masks right. rlax's
    ``vtrace_td_error_and_advantage`` does not: its policy-gradient bootstrap reads the
    *next row's* value and target, which after a truncation is the next episode's first
    observation and under an acting mask another agent step's slot, so the advantages
    are computed here.

    Args:
        behaviour_logp: ``float[T, E, A]``, log-probability of each action under the policy
            that sampled it (the trajectory's ``extras["action_logp"]``).
        target_logp: ``float[T, E, A]``, its log-probability under the policy being learnt.
        rewards: ``float[T, E, A]``; values: ``float[T, E, A]`` under the learnt policy's
            critic (at reset steps, the value of the ending episode's final observation).
        terminated, truncated, acting: ``bool[T, E, A]``; is_reset: ``bool[T, E]``.
        last_value: ``float[E, A]``, the value of ``obs[T]``.
        gamma: discount; lam: trace mixing, both in [0, 1].
        clip_rho_threshold, clip_pg_rho_threshold: clipping of ``rho`` in the targets and
            in the policy-gradient advantages.

    Returns:
        :class:`VTraceOutput` (targets carry no stop-gradient; wrap the inputs or outputs
        in ``jax.lax.stop_gradient`` as the loss needs). Pure; jit- and vmap-safe.

    Raises:
        ValueError: mismatched shapes (naming the argument), gamma or lam outside [0, 1].
        TypeError: a non-array input or a wrong dtype (flags bool, the rest float).
        ImportError: rlax is not installed (``pip install jaxsampler[offpolicy]``).
    """
    rlax = require("rlax")
    _check_coefficient("gamma", gamma)
    _check_coefficient("lam", lam)
    floats = {
        "behaviour_logp": behaviour_logp,
        "target_logp": target_logp,
        "values": values,
        "last_value": last_value,
    }
    flags = {"terminated": terminated, "truncated": truncated, "acting": acting}
    _check_inputs(rewards, floats, {**flags, "is_reset": is_reset})
    f32 = jnp.float32
    seg = agent_segments(rewards, terminated, truncated, acting, is_reset)
    log_rho = jnp.where(acting, target_logp.astype(f32) - behaviour_logp.astype(f32), 0.0)
    rhos = jnp.exp(log_rho)
    values = values.astype(f32)
    v_end = _at_slots(values, last_value, seg.end)
    d = jnp.where(seg.terminated, 0.0, jnp.asarray(gamma, f32))
    lam_t = jnp.where(seg.continues, jnp.asarray(lam, f32), 0.0)

    def row(v_tm1, v_t, r_t, d_t, rho, lam_row, mask):
        return rlax.vtrace(
            v_tm1, v_t, r_t, d_t, rho, lam_row, clip_rho_threshold, False, sample_mask=mask
        )

    over_rows = jax.vmap(jax.vmap(row, in_axes=1, out_axes=1), in_axes=1, out_axes=1)
    errors = over_rows(values, v_end, seg.reward, d, rhos, lam_t, acting)
    vs = jnp.where(acting, errors + values, 0.0)
    vs_next = _at_slots(vs, last_value, seg.end)  # read only where the trace continues
    q_boot = jnp.where(seg.continues, lam * vs_next + (1.0 - lam) * v_end, v_end)
    q = seg.reward + d * q_boot
    pg = jnp.minimum(jnp.asarray(clip_pg_rho_threshold, f32), rhos) * (q - values)
    return VTraceOutput(vs=vs, pg_advantages=jnp.where(acting, pg, 0.0), rhos=rhos)


def compute_vtrace(
    traj: Trajectory,
    target_logp: jax.Array,
    values: jax.Array,
    last_value: jax.Array,
    gamma: float = 0.99,
    lam: float = 1.0,
    clip_rho_threshold: float = 1.0,
    clip_pg_rho_threshold: float = 1.0,
    logp_key: str = "action_logp",
) -> VTraceOutput:
    """:func:`vtrace` on a :class:`~jaxsampler.types.Trajectory`: the behaviour
    log-probabilities are its ``extras[logp_key]``; ``target_logp``, ``values`` (``[T, E,
    A]``) and ``last_value`` (``[E, A]``) come from the learner's current params.

    Raises:
        KeyError: the extras have no ``logp_key``; and as :func:`vtrace`.
    """
    return vtrace(
        _extra(traj, logp_key),
        target_logp,
        traj.rewards,
        values,
        traj.terminated,
        traj.truncated,
        traj.acting,
        traj.is_reset,
        last_value,
        gamma,
        lam,
        clip_rho_threshold,
        clip_pg_rho_threshold,
    )


def _extra(traj: Trajectory, key: str) -> jax.Array:
    if not isinstance(traj.extras, dict) or key not in traj.extras:
        have = sorted(traj.extras) if isinstance(traj.extras, dict) else traj.extras
        raise KeyError(f"the trajectory's extras have no {key!r} (have {have})")
    return traj.extras[key]
