"""Agent steps of ``[T, E, A]`` rollout buffers on the device: where each action's
transition ends, what it earned and how it ended.

One *agent step* starts at a step ``t`` where the agent acted and ends at ``end[t]``, the
first of

* the agent's next acting step (``obs[end]`` is what it saw next),
* one step after the first done flag at or after ``t`` (``obs[end]`` is the episode's real
  final observation: with next-step auto-reset it sits in the reset step's slot),
* the next reset step, or ``T`` (the rollout cut: ``obs[T]``).

Its reward is the sum of the agent's rewards over ``t .. end - 1`` (rewards that arrive
while it waits are credited to its action, as RLlib and
:func:`jaxsampler.postprocessing.gae` credit them), and its ``terminated`` /
``truncated`` flags are any of the flags over that range. This is the host sampler's
agent-step rule (:mod:`jaxsampler.sampling.device.agent_steps`), computed here with one
reverse scan so it runs inside the user's jit. For a single-agent env ``end[t] = t + 1``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

__all__ = ["AgentSegments", "agent_segments"]


@struct.dataclass
class AgentSegments:
    """Per ``[T, E, A]`` slot, the agent step that starts there (meaningful where the agent
    acted).

    Attributes:
        end: ``int32[T, E, A]``, the observation slot (``0 .. T``) the step ends at.
        reward: ``float32[T, E, A]``, the rewards over ``t .. end - 1``.
        terminated, truncated: ``bool[T, E, A]``, any flag over ``t .. end - 1``.
        continues: ``bool[T, E, A]``, the agent's next step starts at ``end`` in the same
            episode (no done flag, ``end < T`` and the agent acts there).
    """

    end: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    continues: jax.Array


def agent_segments(
    rewards: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    acting: jax.Array,
    is_reset: jax.Array,
) -> AgentSegments:
    """The agent steps of ``[T, E, A]`` buffers (see the module docstring).

    Args:
        rewards: ``float[T, E, A]``; terminated, truncated, acting: ``bool[T, E, A]``;
        is_reset: ``bool[T, E]`` (shapes are the caller's to check).

    Returns:
        :class:`AgentSegments`. Pure; safe under ``jit`` and ``vmap``.
    """
    T = rewards.shape[0]
    reset = jnp.broadcast_to(is_reset[..., None], rewards.shape)
    live = ~reset
    term = terminated & live
    trunc = truncated & live
    # A step k+1 is *passed through* by a step k's segment when k raised no done flag and
    # k+1 is neither an acting step nor a reset step.
    boundary_next = jnp.concatenate(
        [(acting | reset)[1:], jnp.ones((1,) + rewards.shape[1:], jnp.bool_)], axis=0
    )
    passes = ~(term | trunc) & ~boundary_next
    idx = jnp.broadcast_to(
        jnp.arange(T, dtype=jnp.int32).reshape((T,) + (1,) * (rewards.ndim - 1)), rewards.shape
    )

    def body(carry, x):
        end_n, r_n, term_n, trunc_n = carry
        r, tm, tr, p, i = x
        new = (
            jnp.where(p, end_n, i + 1),
            r + jnp.where(p, r_n, 0.0),
            tm | (p & term_n),
            tr | (p & trunc_n),
        )
        return new, new

    zeros = jnp.zeros(rewards.shape[1:], jnp.float32)
    no = jnp.zeros(rewards.shape[1:], jnp.bool_)
    init = (jnp.full(rewards.shape[1:], T, jnp.int32), zeros, no, no)
    xs = (rewards.astype(jnp.float32), term, trunc, passes, idx)
    _, (end, reward, seg_term, seg_trunc) = jax.lax.scan(body, init, xs, reverse=True)
    acting_at_end = jnp.take_along_axis(
        jnp.concatenate([acting, jnp.zeros((1,) + acting.shape[1:], jnp.bool_)], axis=0),
        end,
        axis=0,
    )
    continues = acting_at_end & ~(seg_term | seg_trunc)
    return AgentSegments(
        end=end, reward=reward, terminated=seg_term, truncated=seg_trunc, continues=continues
    )
