"""``N`` jaxsampler envs as one ``gymnasium.vector.VectorEnv`` (:class:`JaxGymnasiumVectorEnv`).

All ``N`` envs step in one jitted call (no per-env Python loop) and come back in one
device-to-host transfer. The auto-reset mode is declared in ``metadata["autoreset_mode"]`` and
honoured as Gymnasium's ``SyncVectorEnv`` honours it, env by env:

* ``AutoresetMode.NEXT_STEP`` (default): the step that ends an episode returns its final
  observation in the batch; the *next* step resets that env instead of stepping it (its
  action is ignored) and returns the new episode's first observation, reward 0,
  ``terminated = truncated = False`` and the reset's info.
* ``AutoresetMode.SAME_STEP``: the step that ends an episode resets the env at once; the batch
  holds the new episode's first observation, ``infos["final_obs"]`` (an object array, None
  where no episode ended) the final observation, ``infos["final_info"]`` the final info, each
  with its ``"_final_obs"`` / ``"_final_info"`` mask; reward and flags are the final step's.

Infos follow Gymnasium's vector layout: each key ``k`` batched over the envs, with a bool mask
``"_k"``. Seeds follow ``SyncVectorEnv``: ``reset(seed=s)`` seeds env ``i`` with ``s + i``, a list
seeds env by env, ``None`` continues each env's key chain; env ``i`` then produces exactly the
episodes of ``JaxGymnasiumEnv`` reset with its seed and given the same actions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium
import jax
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from jaxsampler import vector as js_vector
from jaxsampler.envs.base import Env
from jaxsampler.integrations.gymnasium import kernels
from jaxsampler.integrations.gymnasium.convert import (
    check_seed,
    frames,
    gymnasium_space,
    host_action,
    host_info,
    host_obs,
    masked_infos,
    row,
    vector_infos,
)
from jaxsampler.integrations.gymnasium.env import (
    check_render_mode,
    face_metadata,
    resolve_env,
    resolve_params,
)

__all__ = ["JaxGymnasiumVectorEnv"]

_MODES = (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP)


def _mode(value: Any) -> AutoresetMode:
    try:
        mode = value if isinstance(value, AutoresetMode) else AutoresetMode(value)
    except ValueError:
        mode = None
    if mode not in _MODES:
        raise ValueError(
            f"JaxGymnasiumVectorEnv: autoreset_mode must be AutoresetMode.NEXT_STEP or "
            f"AutoresetMode.SAME_STEP, got {value!r}"
        )
    return mode


def _squeeze_agent(tree: Any) -> Any:
    return jax.tree.map(lambda x: x[:, 0], tree)


class JaxGymnasiumVectorEnv(gymnasium.vector.VectorEnv):
    """``N`` copies of a single-agent jaxsampler env behind Gymnasium's ``VectorEnv`` API.

    Args:
        env: a jaxsampler env, or an id for :func:`jaxsampler.make`.
        num_envs: ``N >= 1``.
        env_params: the env's params (``env.default_params`` when None); leaves may carry a
            leading ``[N]`` (one value per env).
        render_mode: ``None`` or ``"rgb_array"``: :meth:`render` returns ``N`` frames.
        autoreset_mode: ``AutoresetMode.NEXT_STEP`` (default) or ``SAME_STEP`` (or their
            values ``"NextStep"`` / ``"SameStep"``).
        **make_kwargs: passed to :func:`jaxsampler.make` with an id.

    Raises:
        TypeError: ``num_envs`` not an int; see also
            :func:`~jaxsampler.integrations.gymnasium.env.resolve_env`.
        ValueError: ``num_envs < 1``; an unknown id; an unsupported render or auto-reset
            mode; ``env_params`` leaves of another shape than shared or per env.

    Actions outside the action space raise
    :class:`~jaxsampler.integrations.gymnasium.convert.InvalidActionError`; ``step`` /
    ``render`` before ``reset`` raise ``gymnasium.error.ResetNeeded``.
    """

    def __init__(
        self,
        env: Env | str,
        num_envs: int,
        *,
        env_params: Any = None,
        render_mode: str | None = None,
        autoreset_mode: Any = AutoresetMode.NEXT_STEP,
        **make_kwargs: Any,
    ):
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)):
            raise TypeError(f"JaxGymnasiumVectorEnv: num_envs must be an int, got {num_envs!r}")
        if num_envs < 1:
            raise ValueError(f"JaxGymnasiumVectorEnv: num_envs must be >= 1, got {num_envs}")
        self.jax_env = resolve_env(env, make_kwargs, "JaxGymnasiumVectorEnv")
        check_render_mode(self.jax_env, render_mode, "JaxGymnasiumVectorEnv")
        self.autoreset_mode = _mode(autoreset_mode)
        self.num_envs = int(num_envs)
        self.env_params = resolve_params(self.jax_env, env_params)
        js_vector.param_axes(self.jax_env, self.env_params, self.num_envs)  # shapes checked
        self.metadata = {**face_metadata(self.jax_env), "autoreset_mode": self.autoreset_mode}
        self.render_mode = render_mode
        self._action_space = self.jax_env.action_space
        self.single_observation_space = gymnasium_space(self.jax_env.observation_space)
        self.single_action_space = gymnasium_space(self._action_space)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._chains: jax.Array | None = None
        self._state: Any = None
        self._obs: Any = None  # the last observations, on the device (for masked resets)
        self._needs_reset = np.zeros(self.num_envs, np.bool_)

    # ------------------------------------------------------------------ reset

    def _seeds(self, seed: int | Sequence[int | None] | None) -> list[int | None] | None:
        if seed is None:
            return None
        if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
            first = check_seed(seed)
            check_seed(first + self.num_envs - 1, f"seed + num_envs - 1 ({first} + ...)")
            return [first + i for i in range(self.num_envs)]
        if not isinstance(seed, Sequence) or isinstance(seed, str):
            raise TypeError(f"seed must be an int, a list of ints / None or None, got {seed!r}")
        if len(seed) != self.num_envs:
            raise ValueError(f"seed: a list of {self.num_envs} seeds expected, got {len(seed)}")
        return [None if s is None else check_seed(s, f"seed[{i}]") for i, s in enumerate(seed)]

    def _start_chains(self, seeds: list[int | None] | None) -> jax.Array:
        """Each env's chain: new for seeded envs (and for all at the first reset), else kept."""
        if seeds is None and self._chains is not None:
            return self._chains
        seeds = seeds or [None] * self.num_envs
        fresh = [s is not None or self._chains is None for s in seeds]
        values = np.array(
            [
                s if s is not None else self.np_random.integers(0, 2**64, dtype=np.uint64)
                for s in seeds
            ],
            np.uint64,
        )
        chains = kernels.seed_chains(values)
        if all(fresh):
            return chains
        return kernels.select_jit(np.array(fresh), chains, self._chains)

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Resets the envs (all, or those of ``options["reset_mask"]``).

        Args:
            seed: ``None`` (each env continues its key chain; OS entropy at the first reset),
                an int ``s`` (env ``i`` gets ``s + i``) or a list of ``N`` ints / None.
            options: ``{"reset_mask": bool[N]}`` resets only those envs (the others keep
                their episode and observation; only the reset envs report infos); other
                options are ignored.

        Returns:
            ``(observations, infos)``: a batch of :attr:`single_observation_space` data and
            Gymnasium's vector infos.

        Raises:
            TypeError, ValueError: bad seeds; a reset mask that is not ``bool[N]`` with a
                True entry.
            gymnasium.error.ResetNeeded: a reset mask before the first full reset.
        """
        seeds = self._seeds(seed)
        super().reset(seed=seed if isinstance(seed, (int, np.integer)) else None)
        mask = self._reset_mask(options)
        chains = self._start_chains(seeds)
        chains, state, ts = kernels.reset_all(self.jax_env, chains, self.env_params)
        if mask is None:
            self._chains, self._state, self._obs = chains, state, ts.obs
            self._needs_reset[:] = False
            mask = np.ones(self.num_envs, np.bool_)
        else:
            self._chains, self._state, self._obs = kernels.select_jit(
                mask, (chains, state, ts.obs), (self._chains, self._state, self._obs)
            )
            self._needs_reset[mask] = False
        obs, info = jax.device_get((self._obs, ts.info))
        obs = host_obs(self.single_observation_space, _squeeze_agent(obs))
        return obs, masked_infos(host_info(info), mask)

    def _reset_mask(self, options: dict[str, Any] | None) -> np.ndarray | None:
        if not options or "reset_mask" not in options:
            return None
        mask = options["reset_mask"]
        if not (
            isinstance(mask, np.ndarray)
            and mask.dtype == np.bool_
            and mask.shape == (self.num_envs,)
            and mask.any()
        ):
            raise ValueError(
                f"options['reset_mask'] must be a numpy bool[{self.num_envs}] array with at "
                f"least one True entry, got {mask!r}"
            )
        if self._state is None:
            raise gymnasium.error.ResetNeeded(
                "JaxGymnasiumVectorEnv: reset every env (no reset_mask) before a masked reset"
            )
        return mask

    # ------------------------------------------------------------------ step

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Steps every env, with the declared auto-reset (see the module docstring).

        Args:
            actions: a batch of :attr:`single_action_space` elements (leading axis ``N``).

        Returns:
            ``(observations, rewards, terminations, truncations, infos)``: observations as a
            batch of :attr:`single_observation_space` data, rewards ``float64[N]``, the flags
            ``bool[N]``, infos in Gymnasium's vector layout.

        Raises:
            gymnasium.error.ResetNeeded: before the first ``reset``.
            InvalidActionError: actions outside the action space (every env's action is
                checked, including those a reset ignores).
        """
        if self._state is None:
            raise gymnasium.error.ResetNeeded("JaxGymnasiumVectorEnv: call reset() before step()")
        act = host_action(self._action_space, actions, (self.num_envs,), "actions")
        act = jax.tree.map(lambda a: a[:, None], act)
        if self.autoreset_mode == AutoresetMode.NEXT_STEP:
            return self._step_next(act)
        return self._step_same(act)

    def _step_next(self, act: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        self._chains, self._state, ts = kernels.step_next(
            self.jax_env, self._chains, self._state, act, self._needs_reset, self.env_params
        )
        self._obs = ts.obs
        obs, reward, terminated, truncated, info = jax.device_get(
            (ts.obs, ts.reward, ts.terminated, ts.truncated, ts.info)
        )
        terminated, truncated = terminated[:, 0], truncated[:, 0]
        self._needs_reset = terminated | truncated
        return (
            host_obs(self.single_observation_space, _squeeze_agent(obs)),
            reward[:, 0].astype(np.float64),
            terminated,
            truncated,
            vector_infos(host_info(info), self.num_envs),
        )

    def _step_same(self, act: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        self._chains, self._state, self._obs, info, final, done = kernels.step_same(
            self.jax_env, self._chains, self._state, act, self.env_params
        )
        obs, info, final_obs, final_info, reward, terminated, truncated, done = jax.device_get(
            (
                self._obs,
                info,
                final.obs,
                final.info,
                final.reward,
                final.terminated,
                final.truncated,
                done,
            )
        )
        infos: dict[str, Any] = {}
        if done.any():
            space = self.single_observation_space
            finals = host_obs(space, _squeeze_agent(final_obs))
            infos["final_obs"] = np.full(self.num_envs, None, dtype=object)
            for i in np.flatnonzero(done):  # only the envs whose episode ended
                infos["final_obs"][i] = row(finals, int(i))
            infos["_final_obs"] = done.copy()
            infos["final_info"] = masked_infos(host_info(final_info), done)
            infos["_final_info"] = done.copy()
        infos.update(vector_infos(host_info(info), self.num_envs))
        return (
            host_obs(self.single_observation_space, _squeeze_agent(obs)),
            reward[:, 0].astype(np.float64),
            terminated[:, 0],
            truncated[:, 0],
            infos,
        )

    # ------------------------------------------------------------------ render, close

    def render(self) -> tuple[np.ndarray, ...] | None:  # type: ignore[override]
        """Every env's current state drawn by the env's JAX renderer (one jitted call).

        Returns:
            ``N`` frames ``uint8[H, W, 3]`` with ``render_mode="rgb_array"``; ``None`` (and a
            warning) without a render mode.

        Raises:
            gymnasium.error.ResetNeeded: before the first ``reset``.
        """
        drawn = frames(self)
        return None if drawn is None else tuple(drawn)

    def close_extras(self, **kwargs: Any) -> None:
        """Drops the envs' device state."""
        self._state = self._chains = self._obs = None
