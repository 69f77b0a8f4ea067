"""An opponent pool for self-play: frozen snapshots of a policy and a random player, one pick
per episode.

Self-play against only the latest policy drifts towards play that is good against itself
and no better against weaker players (in tic-tac-toe: towards draws). An opponent pool keeps
past versions and a uniformly random (legal) player in the games the learner trains on.
:class:`OpponentPool` is a :class:`~jaxsampler.policies.Policy` like any other, so it goes
into a :class:`~jaxsampler.policies.MultiAgentPolicy` through the policy mapping::

    pool = js.policies.OpponentPool(mlp, size=8)
    policy = js.policies.MultiAgentPolicy(
        env, {"learner": mlp, "opponent": pool},
        lambda agent_id: "learner" if agent_id == "agent_0" else "opponent",
    )
    params = policy.init(key)
    ...                                              # train params["learner"]
    params["opponent"] = pool.push(params["opponent"], params["learner"])  # a snapshot

Its params hold ``size`` snapshot slots of the base policy's params (a ring: :meth:`push`
writes the oldest), how many are filled, and the probability of the random player. Each
agent row the pool plays (one per env in a two-player game) draws its opponent once per
episode, at the episode's first step (the rollout resets a policy's state there): the
random player with probability ``p_random``, else one of the filled slots uniformly. The
pick is a slot index kept in the policy state, so it holds for the whole episode, with one
exception: a :meth:`push` that overwrites the slot an episode plays switches that episode
to the new snapshot from the next step on (push between sampler calls, as often as the
ring allows, e.g. every few iterations). Pushing a snapshot or changing ``p_random``
changes params only: nothing recompiles.

The step evaluates the base policy once per slot (``size`` small forward passes, vmapped)
and the random player, then takes each row's pick. The extras (``action_logp`` and the
others) are those of the picked snapshot; on rows the random player plays they are zero,
except ``action_logp``, the random player's own (``-log`` of the number of legal
actions). The base policy must be stateless (a recurrent one would need a state per slot)
and act in a ``Discrete`` space (board and card games).

Costs and limits: the pool has a recurrent state, so a ``MultiAgentPolicy`` holding it
runs every policy on every agent row (no acting-only rows in turn-based games), and the pool
evaluates all ``size`` snapshots on its rows. It has no ``log_prob`` (the probability of a
given action depends on the pick), so such a ``MultiAgentPolicy`` has none either: recompute
the learner's log-probabilities with the learner policy's own ``log_prob`` on its rows.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxsampler.policies.base import NoState, Policy, RandomPolicy, batch_dims
from jaxsampler.spaces import Discrete, Space
from jaxsampler.transforms.mask import MASK_KEY, legal_actions, split_masked_space

__all__ = ["OpponentPool"]

#: the policy-state pick of a row whose episode has not drawn its opponent yet
_UNDRAWN = -1


@dataclasses.dataclass(frozen=True)
class OpponentPool(Policy):
    """Snapshots of ``base`` and a random legal player, one drawn per env and episode (see
    the module docstring).

    Args:
        base: the policy whose snapshots play; stateless (no recurrent state).
        size: snapshot slots, ``>= 1``.
        p_random: the initial probability of the random player (a param afterwards: set
            ``params["p_random"] = jnp.float32(p)`` to change it without a recompile).

    Raises:
        ValueError: ``size < 1`` or ``p_random`` outside ``[0, 1]``.
        TypeError: ``base`` is not a :class:`Policy`, has a recurrent state, or its action
            space is not ``Discrete``.
    """

    base: Policy
    size: int = 8
    p_random: float = 0.5
    observation_space: Space = dataclasses.field(init=False)
    action_space: Space = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.base, Policy):
            raise TypeError(f"base must be a Policy, got {type(self.base).__name__}")
        if jax.tree.leaves(self.base.initial_state((1,))):
            raise TypeError(
                f"OpponentPool needs a stateless base policy; {type(self.base).__name__} has "
                "a recurrent state (each snapshot slot would need its own)"
            )
        if int(self.size) != self.size or self.size < 1:
            raise ValueError(f"size must be an integer >= 1, got {self.size!r}")
        if not isinstance(self.base.action_space, Discrete):
            raise TypeError(
                "OpponentPool plays Discrete action spaces (board and card games), got "
                f"{self.base.action_space}"
            )
        if not 0.0 <= float(self.p_random) <= 1.0:
            raise ValueError(f"p_random must be in [0, 1], got {self.p_random!r}")
        object.__setattr__(self, "observation_space", self.base.observation_space)
        object.__setattr__(self, "action_space", self.base.action_space)

    @property
    def random_player(self) -> RandomPolicy:
        """The random player: uniform over the legal actions (or all, unmasked)."""
        return RandomPolicy(self.observation_space, self.action_space)

    def init(self, key: jax.Array) -> dict[str, Any]:
        """Params with ``base.init(key)`` in the first slot (``filled == 1``); the other
        slots hold copies until :meth:`push` overwrites them.

        Returns:
            ``{"snapshots": base params with a leading [size] axis, "filled": int32,
            "next": int32 (the slot push writes), "p_random": float32}``.
        """
        return self.seeded(self.base.init(key))

    def seeded(self, base_params: Any) -> dict[str, Any]:
        """Params with ``base_params`` as the one filled snapshot (see :meth:`init`)."""
        stack = jax.tree.map(lambda x: jnp.stack([jnp.asarray(x)] * self.size), base_params)
        return {
            "snapshots": stack,
            "filled": jnp.int32(1),
            "next": jnp.int32(1 % self.size),
            "p_random": jnp.float32(self.p_random),
        }

    def push(self, pool_params: dict[str, Any], base_params: Any) -> dict[str, Any]:
        """``pool_params`` with ``base_params`` written into the next slot (the oldest
        snapshot once all are filled). Pure; jittable.

        Raises:
            ValueError: ``base_params`` do not have the snapshots' structure or shapes.
        """
        snaps = pool_params["snapshots"]
        want, got = jax.tree.structure(snaps), jax.tree.structure(base_params)
        if got != want:  # type: ignore[operator]
            raise ValueError(f"base_params' structure {got} is not the snapshots' {want}")
        for s, p in zip(jax.tree.leaves(snaps), jax.tree.leaves(base_params), strict=True):
            if s.shape[1:] != jnp.shape(p):
                raise ValueError(
                    f"a leaf of shape {jnp.shape(p)} where the snapshots hold {s.shape[1:]}"
                )
        slot = pool_params["next"]
        write = lambda s, p: s.at[slot].set(jnp.asarray(p, s.dtype))
        snaps = jax.tree.map(write, snaps, base_params)
        return {
            **pool_params,
            "snapshots": snaps,
            "filled": jnp.minimum(pool_params["filled"] + 1, self.size).astype(jnp.int32),
            "next": ((slot + 1) % self.size).astype(jnp.int32),
        }

    def initial_state(self, batch_shape: tuple[int, ...]) -> jax.Array:
        """``int32[*batch_shape]`` picks, all undrawn (-1)."""
        return jnp.full(batch_shape, _UNDRAWN, jnp.int32)

    def draw(self, params: dict[str, Any], key: jax.Array, batch: tuple[int, ...]) -> jax.Array:
        """Fresh picks ``int32[*batch]``: ``size`` (the random player) with probability
        ``p_random``, else a filled slot in ``[0, filled)`` uniformly."""
        k_coin, k_slot = jax.random.split(key)
        coin = jax.random.uniform(k_coin, batch) < params["p_random"]
        slot = jax.random.randint(k_slot, batch, 0, jnp.maximum(params["filled"], 1))
        return jnp.where(coin, self.size, slot).astype(jnp.int32)

    def __call__(
        self, params: dict[str, Any], obs: Any, key: jax.Array, policy_state: jax.Array
    ) -> tuple[Any, dict[str, jax.Array], jax.Array]:
        batch = batch_dims(obs, self.observation_space)
        k_draw, k_base, k_rand = jax.random.split(key, 3)
        pick = jnp.where(policy_state < 0, self.draw(params, k_draw, batch), policy_state)

        def one(snapshot: Any) -> tuple[Any, dict[str, jax.Array]]:
            action, extras, _ = self.base(snapshot, obs, k_base, NoState())
            return action, extras

        actions, extras = jax.vmap(one)(params["snapshots"])  # leaves [size, *batch, ...]
        slot = jnp.minimum(pick, self.size - 1)

        def take(x: jax.Array) -> jax.Array:
            idx = slot.reshape((1, *batch) + (1,) * (x.ndim - 1 - len(batch)))
            return jnp.take_along_axis(x, idx, axis=0)[0]

        action, extras = jax.tree.map(take, (actions, extras))
        rand_action, _, _ = self.random_player(None, obs, k_rand, NoState())
        is_random = pick == self.size

        def choose(r: jax.Array, s: jax.Array) -> jax.Array:
            return jnp.where(is_random.reshape(batch + (1,) * (s.ndim - len(batch))), r, s)

        action = jax.tree.map(choose, rand_action, action)
        extras = {k: choose(jnp.zeros_like(v), v) for k, v in extras.items()}
        if "action_logp" in extras:
            uniform = self._uniform_logp(obs, batch)
            extras["action_logp"] = jnp.where(is_random, uniform, extras["action_logp"])
        return action, extras, pick

    def _uniform_logp(self, obs: Any, batch: tuple[int, ...]) -> jax.Array:
        """The random player's log-probability of its action: ``-log(#legal actions)``."""
        n = self.action_space.n  # type: ignore[attr-defined]  # Discrete (checked at init)
        if split_masked_space(self.observation_space, self.action_space, other_keys=True) is None:
            return jnp.full(batch, -jnp.log(n), jnp.float32)
        count = jnp.sum(legal_actions(obs[MASK_KEY]), axis=-1)
        count = jnp.where(count == 0, n, count)  # no legal action: all are drawn
        return -jnp.log(count.astype(jnp.float32))
