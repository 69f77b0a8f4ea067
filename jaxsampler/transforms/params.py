"""Domain randomization: new env params for an env at each of its resets, inside the scan.

Per-env params (a leading ``[E]`` axis on a leaf of ``env_params``, see
:func:`jaxsampler.vector.param_axes`) let every env of a rollout run its own physics;
:class:`DomainRandomization` draws them, per env and per episode, with a user function,
without leaving the compiled loop and without recompiling.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxsampler import vector
from jaxsampler.transforms.base import Context, StageState, Transform

__all__ = ["DomainRandomization"]

#: ``sample_params_fn(key, base_params) -> params``, for one env (no env axis).
SampleParamsFn = Callable[[jax.Array, Any], Any]


def _describe(tree: Any) -> str:
    """``path: shape dtype`` of every leaf (what a message names), or the object's type."""
    try:
        leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    except Exception:  # pragma: no cover - not a pytree at all
        return type(tree).__name__
    if not leaves:
        return f"{type(tree).__name__} with no array leaves"
    parts = [
        f"{jax.tree_util.keystr(path) or '<root>'}: {tuple(np.shape(x))} {jnp.result_type(x)}"
        for path, x in leaves
    ]
    return f"{type(tree).__name__}({', '.join(parts)})"


@dataclasses.dataclass(frozen=True)
class DomainRandomization(Transform):
    """Draws new env params for an env at every one of its resets (domain randomization).

    ``sample_params_fn(key, base_params) -> params`` is written for **one** env: ``key``
    is that env's own PRNG key, ``base_params`` that env's params as the rollout state
    was initialised with them (``init_rollout_state(..., env_params=...)``, default
    ``env.default_params``; per-env leaves give each env its own base), and it returns
    the params of that env's next episode, with the structure, shapes (no env axis) and
    dtypes of ``base_params``. It is ``jax.vmap``-ped over the envs and must be pure and
    jittable.

    Semantics:

    * The initial state draws params for every env (``init_rollout_state`` /
      ``rollout.init``), so the first episode is randomized too.
    * Inside the rollout's scan, an env that resets this step (``needs_reset``) gets
      newly drawn params *before* it is reset, so the reset itself and the whole new
      episode run with them; the other envs keep theirs. Values change only inside the
      compiled loop: nothing recompiles, whatever is drawn.
    * Draws always start from the base params, never from the previous episode's
      draw, so they do not drift.
    * ``Trajectory.env_params`` records the params each env stepped with at each step
      (leaves ``[T, E, ...]``; every leaf per env): they change exactly at ``is_reset``
      steps, so the params of an episode are those of any of its steps.
      ``RolloutState.env_params`` holds the current ones.
    * The draws use their own PRNG stream (the rollout's other streams are the same as
      without randomization); with the env axis sharded each shard draws its own.
    * Observations, rewards and actions pass through unchanged; the position in the
      ``transforms`` tuple does not matter. Use one randomizer per pipeline (put every
      randomized param in its one ``sample_params_fn``).

    State: ``rows`` hold the base params, every leaf ``[E, ...]`` (per env, so the env
    axis can be sharded); ``shared`` is empty.

    Example (CartPole with a pole half-length in ``[0.25, 0.75]`` and a cart mass in
    ``[0.5, 2.0]``, drawn uniformly per episode)::

        >>> import dataclasses, jax
        >>> import jaxsampler as js
        >>> from jaxsampler.transforms.params import DomainRandomization
        >>> def sample(key, base):
        ...     k_len, k_mass = jax.random.split(key)
        ...     return dataclasses.replace(
        ...         base,
        ...         length=jax.random.uniform(k_len, (), minval=0.25, maxval=0.75),
        ...         masscart=jax.random.uniform(k_mass, (), minval=0.5, maxval=2.0),
        ...     )
        >>> env = js.make("CartPole-v1")
        >>> policy = js.RandomPolicy(env.observation_space, env.action_space)
        >>> rollout = js.make_rollout(env, policy, 8, 64, transforms=(DomainRandomization(sample),))
        >>> state, traj = rollout((), rollout.init(jax.random.PRNGKey(0)))
        >>> traj.env_params.length.shape  # one pole per env and step
        (64, 8)
        >>> bool(((traj.env_params.length >= 0.25) & (traj.env_params.length <= 0.75)).all())
        True

    Args:
        sample_params_fn: ``(key, base_params) -> params`` for one env (see above).

    Raises:
        TypeError: ``sample_params_fn`` is not callable (at construction).
        ValueError: at trace time (``init`` or the first rollout call), the env has no
            params to randomize, or ``sample_params_fn`` returned another structure,
            shapes or a float where the base has an integer leaf; the message names what
            it returned and what was expected.
    """

    sample_params_fn: SampleParamsFn

    randomizes_params = True

    def __post_init__(self) -> None:
        if not callable(self.sample_params_fn):
            raise TypeError(
                f"DomainRandomization(sample_params_fn): expected a function "
                f"(key, base_params) -> params, got {type(self.sample_params_fn).__name__}: "
                f"{self.sample_params_fn!r}"
            )

    def reset_params(
        self, state: StageState, key: jax.Array, reset: jax.Array, params: Any, ctx: Context
    ) -> tuple[StageState, Any]:
        """New params from ``sample_params_fn`` for the envs where ``reset`` (``bool[E]``) is
        set, each drawn from that env's base params; the others keep ``params``. The first
        call stores ``params`` as the base. Pure; jittable."""
        num_envs = reset.shape[0]
        if not jax.tree.leaves(params):
            raise ValueError(
                "DomainRandomization: the env has no params to randomize (env_params is "
                f"{params!r}); pass env_params= to init_rollout_state, or give the env "
                "default_params"
            )
        if isinstance(state.rows, tuple) and not state.rows:
            # The state's first draw (init_rollout_state): the params it was given, one
            # per env, become the base of every later draw.
            state = dataclasses.replace(state, rows=params)
        base = state.rows
        for leaf in jax.tree.leaves(base):
            if np.shape(leaf)[:1] != (num_envs,):  # pragma: no cover - the rollout's contract
                raise ValueError(
                    f"DomainRandomization: base params must be per env ([{num_envs}, ...]), "
                    f"got {_describe(base)}"
                )
        drawn = jax.vmap(self._sample_one)(jax.random.split(key, num_envs), base)
        return state, vector.select_envs(reset, drawn, params)

    def _sample_one(self, key: jax.Array, base: Any) -> Any:
        """One env's draw, checked against ``base`` (static: structure, shapes, dtypes)."""
        out = self.sample_params_fn(key, base)
        expected = jax.tree.structure(base)
        got: Any = jax.tree.structure(out)  # PyTreeDef: untyped for mypy
        if got != expected:
            raise ValueError(
                "DomainRandomization: sample_params_fn returned "
                f"{_describe(out)}, expected params like base_params, {_describe(base)} "
                f"(same structure; got {got}, expected {expected})"
            )
        fixed = []
        for (path, o), b in zip(
            jax.tree_util.tree_flatten_with_path(out)[0], jax.tree.leaves(base)
        ):
            o_shape, b_shape = tuple(np.shape(o)), tuple(np.shape(b))
            o_dtype, b_dtype = jnp.result_type(o), jnp.result_type(b)
            if o_shape != b_shape or (
                jnp.issubdtype(o_dtype, jnp.inexact) and not jnp.issubdtype(b_dtype, jnp.inexact)
            ):
                raise ValueError(
                    f"DomainRandomization: sample_params_fn returned "
                    f"{jax.tree_util.keystr(path)} with shape {o_shape} and dtype {o_dtype}, "
                    f"expected shape {b_shape} and dtype {b_dtype} (one env's params, no env "
                    f"axis); it returned {_describe(out)}, expected {_describe(base)}"
                )
            fixed.append(jnp.asarray(o).astype(b_dtype))
        return jax.tree.unflatten(expected, fixed)
