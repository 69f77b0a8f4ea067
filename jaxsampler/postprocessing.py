"""Generalized advantage estimation and discounted returns over rollout buffers (jittable).

Works on the time-major ``[T, E, A]`` layout of :class:`~jaxsampler.types.Trajectory`
and gets every boundary right:

* **termination**: no bootstrap (the next state's value is 0);
* **truncation** (time limit): bootstrap from the value of the episode's *real* final
  observation. With jaxsampler's next-step auto-reset the policy is evaluated on that
  observation at the reset step that follows, so ``values[t + 1]`` already holds it —
  never the next episode's first observation;
* **rollout cut** (the chunk ends mid-episode): bootstrap from ``last_value``, the value
  of ``obs[T]``;
* **acting masks** (agents out of lockstep): each agent's advantages run over its own
  acting steps; rewards it receives while not acting are summed into its previous
  action's reward (RLlib's crediting), and its terminated/truncated flags raised while
  it waits end that action's transition. Non-acting and reset steps get advantage 0.

All functions are pure and safe under ``jit`` and ``vmap``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxsampler.types import Trajectory

__all__ = ["gae", "discounted_returns", "compute_gae", "GAEOutput"]


@struct.dataclass
class GAEOutput:
    """``advantages`` and ``value_targets`` (= advantages + values), ``float32[T, E, A]``;
    both 0 where the agent did not act."""

    advantages: jax.Array
    value_targets: jax.Array


def _check_coefficient(name: str, value: Any) -> None:
    try:
        v = float(value)
    except (TypeError, jax.errors.ConcretizationTypeError):
        return  # traced: cannot be checked while tracing
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {v}")


def _check_shapes(rewards: jax.Array, **arrays: jax.Array) -> None:
    if rewards.ndim != 3:
        raise ValueError(f"rewards must have shape [T, E, A], got {tuple(rewards.shape)}")
    T, E, A = rewards.shape
    want = {
        "values": (T, E, A),
        "terminated": (T, E, A),
        "truncated": (T, E, A),
        "acting": (T, E, A),
        "is_reset": (T, E),
        "last_value": (E, A),
    }
    for name, arr in arrays.items():
        if tuple(arr.shape) != want[name]:
            raise ValueError(
                f"{name} has shape {tuple(arr.shape)}, expected {want[name]} to match rewards "
                f"{tuple(rewards.shape)}"
            )


def gae(
    rewards: jax.Array,
    values: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    acting: jax.Array,
    is_reset: jax.Array,
    last_value: jax.Array,
    gamma: float = 0.99,
    lam: float = 0.95,
) -> GAEOutput:
    """GAE(gamma, lambda) over ``[T, E, A]`` buffers (see the module docstring).

    Args:
        rewards: ``float[T, E, A]``, reward of transition ``t``.
        values: ``float[T, E, A]``, value of ``obs[t]`` (``extras["vf_preds"]``; at reset
            steps the value of the ending episode's final observation).
        terminated, truncated: ``bool[T, E, A]``.
        acting: ``bool[T, E, A]``; is_reset: ``bool[T, E]``.
        last_value: ``float[E, A]``, value of ``obs[T]``.
        gamma: discount in [0, 1]; lam: GAE lambda in [0, 1].

    Raises:
        ValueError: mismatched shapes, or gamma/lam outside [0, 1] (naming the argument).
    """
    _check_coefficient("gamma", gamma)
    _check_coefficient("lam", lam)
    _check_shapes(
        rewards,
        values=values,
        terminated=terminated,
        truncated=truncated,
        acting=acting,
        is_reset=is_reset,
        last_value=last_value,
    )
    f32 = jnp.float32
    reset = jnp.broadcast_to(is_reset[..., None], rewards.shape)

    def step(carry, x):
        next_value, next_adv, acc_r, acc_term, acc_trunc = carry
        r, v, term, trunc, act, rst = x
        total_r = r + acc_r
        term_eff, trunc_eff = term | acc_term, trunc | acc_trunc
        not_term = 1.0 - term_eff.astype(f32)
        not_done = 1.0 - (term_eff | trunc_eff).astype(f32)
        delta = total_r + gamma * not_term * next_value - v
        adv = delta + gamma * lam * not_done * next_adv
        # Acting step: emit and restart accumulation. Reset step: v is the final obs's value,
        # the bootstrap for a truncated transition just before it. Otherwise: accumulate.
        new_value = jnp.where(act | rst, v, next_value)
        new_adv = jnp.where(act, adv, jnp.where(rst, 0.0, next_adv))
        new_acc_r = jnp.where(act | rst, 0.0, total_r)
        new_term = jnp.where(act | rst, False, term_eff)
        new_trunc = jnp.where(act | rst, False, trunc_eff)
        out = jnp.where(act, adv, 0.0)
        return (new_value, new_adv, new_acc_r, new_term, new_trunc), out

    zeros = jnp.zeros(last_value.shape, f32)
    no = jnp.zeros(last_value.shape, jnp.bool_)
    init = (last_value.astype(f32), zeros, zeros, no, no)
    xs = (rewards.astype(f32), values.astype(f32), terminated, truncated, acting, reset)
    _, adv = jax.lax.scan(step, init, xs, reverse=True)
    targets = jnp.where(acting, adv + values.astype(f32), 0.0)
    return GAEOutput(advantages=adv, value_targets=targets)


def discounted_returns(
    rewards: jax.Array,
    values: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    acting: jax.Array,
    is_reset: jax.Array,
    last_value: jax.Array,
    gamma: float = 0.99,
) -> jax.Array:
    """Discounted returns ``R_t = r_t + gamma * R_{t+1}`` with the same boundaries as
    :func:`gae`: 0 after a termination, the final observation's value after a truncation,
    ``last_value`` at the rollout cut. ``values`` matter only at those bootstrap points.
    ``float32[T, E, A]``, 0 where the agent did not act."""
    return gae(
        rewards, values, terminated, truncated, acting, is_reset, last_value, gamma, 1.0
    ).value_targets


def compute_gae(
    traj: Trajectory,
    last_value: jax.Array,
    gamma: float = 0.99,
    lam: float = 0.95,
    value_key: str = "vf_preds",
) -> GAEOutput:
    """:func:`gae` on a :class:`Trajectory` whose extras hold ``value_key``."""
    if value_key not in traj.extras:
        raise KeyError(
            f"the trajectory's extras have no {value_key!r} (have {sorted(traj.extras)})"
        )
    return gae(
        traj.rewards,
        traj.extras[value_key],
        traj.terminated,
        traj.truncated,
        traj.acting,
        traj.is_reset,
        last_value,
        gamma,
        lam,
    )
