"""Host-side conversions of the Gymnasium face: spaces, observations, infos, actions, seeds.

Observations leave as numpy data of the Gymnasium space (its dtype: ``int64`` for a
``Discrete``, the ``Box``'s own dtype), in new, writeable arrays. Infos become dicts (a
dataclass info by its field names; :class:`~jaxsampler.types.NoInfo` is ``{}``), their leaves
numpy values. Actions are checked against the action space before they reach the device
(:class:`InvalidActionError`); ``Box`` bounds are not enforced, the env clips as Gymnasium's
continuous-control envs do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import gymnasium
import jax
import numpy as np

from jaxsampler import spaces as js_spaces
from jaxsampler.integrations.gymnasium import kernels
from jaxsampler.integrations.gymnasium.kernels import MAX_SEED

__all__ = [
    "InvalidActionError",
    "check_seed",
    "gymnasium_space",
    "host_action",
    "host_info",
    "host_obs",
    "masked_infos",
    "row",
    "vector_infos",
]


class InvalidActionError(gymnasium.error.InvalidAction, ValueError):
    """An action outside the action space (wrong structure, shape or kind of number, a
    ``Discrete`` / ``MultiDiscrete`` / integer ``Box`` value out of range, NaN in a float
    ``Box``). Both Gymnasium's ``InvalidAction`` and a ``ValueError``."""


def gymnasium_space(space: js_spaces.Space) -> gymnasium.spaces.Space:
    """``space`` as a ``gymnasium.spaces`` object (``space.to_gymnasium()``)."""
    return space.to_gymnasium()


def host_obs(space: gymnasium.spaces.Space, x: Any) -> Any:
    """Observation data ``x`` (numpy leaves, any leading batch axes) as new, writeable numpy
    data of the Gymnasium ``space``'s dtypes; a 0-d ``Discrete`` value is a numpy scalar."""
    if isinstance(space, gymnasium.spaces.Dict):
        return {k: host_obs(s, x[k]) for k, s in space.spaces.items()}
    if isinstance(space, gymnasium.spaces.Tuple):
        return tuple(host_obs(s, xi) for s, xi in zip(space.spaces, x))
    a = np.array(x, dtype=space.dtype)  # always a copy: device_get's arrays are read-only
    return a[()] if a.ndim == 0 and isinstance(space, gymnasium.spaces.Discrete) else a


def row(x: Any, i: int) -> Any:
    """Entry ``i`` of every leaf of the pytree ``x`` (its structure kept)."""
    return jax.tree.map(lambda leaf: leaf[i], x)


def host_info(info: Any) -> dict[str, Any]:
    """An env's info pytree (numpy leaves) as a dict: mappings by key, dataclasses by field
    name, sequences by position (``"0"``, ``"1"``, ...); :class:`NoInfo` is ``{}``."""
    if isinstance(info, Mapping):
        return {str(k): _info_value(v) for k, v in info.items()}
    if dataclasses.is_dataclass(info) and not isinstance(info, type):
        return {f.name: _info_value(getattr(info, f.name)) for f in dataclasses.fields(info)}
    if isinstance(info, (tuple, list)):
        return {str(i): _info_value(v) for i, v in enumerate(info)}
    return {"info": _info_value(info)}


def _info_value(v: Any) -> Any:
    if isinstance(v, (Mapping, tuple, list)) or (
        dataclasses.is_dataclass(v) and not isinstance(v, type)
    ):
        return host_info(v)
    a = np.array(v)
    return a[()] if a.ndim == 0 else a


def vector_infos(info: dict[str, Any], num_envs: int) -> dict[str, Any]:
    """A vector env's infos from batched leaves (``[N, ...]``): Gymnasium's layout, each key
    ``k`` with its mask ``"_k"`` (every env reports every key: all True)."""
    return masked_infos(info, np.ones(num_envs, np.bool_))


def masked_infos(info: dict[str, Any], mask: np.ndarray) -> dict[str, Any]:
    """Gymnasium's vector-info layout for the envs in ``mask`` only: each key ``k`` holds the
    batched values (zeros where ``mask`` is False) and ``"_k"`` a copy of ``mask``."""
    out: dict[str, Any] = {}
    for k, v in info.items():
        if isinstance(v, dict):
            out[k] = masked_infos(v, mask)
        else:
            v = np.asarray(v)
            out[k] = np.where(mask.reshape(mask.shape + (1,) * (v.ndim - 1)), v, np.zeros_like(v))
        out[f"_{k}"] = mask.copy()
    return out


def host_action(space: js_spaces.Space, x: Any, batch: tuple[int, ...], what: str) -> Any:
    """Checks an action (``batch`` leading axes) against the jaxsampler ``space`` and returns
    it as numpy data of the space's dtypes.

    Raises:
        InvalidActionError: wrong structure, shape or kind of number; a ``Discrete`` /
            ``MultiDiscrete`` / integer ``Box`` value out of range; NaN in a float ``Box``.
    """
    if isinstance(space, js_spaces.Dict):
        if not isinstance(x, Mapping) or set(x) != set(space.spaces):
            raise InvalidActionError(f"{what}: expected a dict with keys {sorted(space.spaces)}")
        return {k: host_action(s, x[k], batch, f"{what}[{k!r}]") for k, s in space.spaces.items()}
    if isinstance(space, js_spaces.Tuple):
        if not isinstance(x, (tuple, list)) or len(x) != len(space.spaces):
            raise InvalidActionError(f"{what}: expected a sequence of {len(space.spaces)} items")
        pairs = enumerate(zip(space.spaces, x))
        return tuple(host_action(s, xi, batch, f"{what}[{i}]") for i, (s, xi) in pairs)
    try:
        a = np.asarray(x)
    except Exception as e:  # ragged sequences
        raise InvalidActionError(f"{what}: not array-like ({e})") from None
    shape = tuple(batch) + tuple(space.shape)
    if a.shape != shape:
        raise InvalidActionError(f"{what} has shape {a.shape}, expected {shape} for {space!r}")
    integral = space.dtype.kind in "iu"
    if a.dtype.kind not in ("biu" if integral else "biuf"):
        kind = "integers" if integral else "numbers"
        raise InvalidActionError(f"{what} must hold {kind} for {space!r}, got dtype {a.dtype}")
    low: Any
    high: Any
    if isinstance(space, js_spaces.Discrete):
        low, high = space.start, space.start + space.n - 1
    elif isinstance(space, js_spaces.MultiDiscrete):
        low, high = np.zeros_like(space.nvec), space.nvec - 1
    elif isinstance(space, js_spaces.Box) and integral:
        low, high = space.low, space.high
    else:
        a = a.astype(space.dtype)
        if a.dtype.kind == "f" and np.isnan(a).any():
            raise InvalidActionError(f"{what} contains NaN")
        return a
    if a.size and (np.any(a < low) or np.any(a > high)):
        raise InvalidActionError(f"{what} = {_short(a)} lies outside {space!r}")
    return a.astype(space.dtype)


def _short(a: np.ndarray) -> str:
    s = repr(a.tolist())
    return s if len(s) <= 80 else s[:77] + "..."


def check_seed(seed: Any, what: str = "seed") -> int:
    """``seed`` as an int in ``[0, 2**64)``.

    Raises:
        TypeError: not an int (bools refused); ValueError: negative or 2**64 and above.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{what} must be an int or None, got {type(seed).__name__}")
    if not 0 <= int(seed) <= MAX_SEED:
        raise ValueError(f"{what} must lie in [0, 2**64), got {seed}")
    return int(seed)


def frames(face: Any) -> np.ndarray | None:
    """The frames of every env of ``face`` (a single or vector face: its ``render_mode``,
    ``_state``, ``jax_env`` and ``env_params``), ``uint8[N, H, W, 3]``; ``None``, with
    Gymnasium's warning, without a render mode.

    Raises:
        gymnasium.error.ResetNeeded: before the first ``reset``.
    """
    name = type(face).__name__
    if face.render_mode is None:
        gymnasium.logger.warn(
            f"{name}.render() without a render mode returns None: create the env with "
            "render_mode='rgb_array'"
        )
        return None
    if face._state is None:
        raise gymnasium.error.ResetNeeded(f"{name}: call reset() before render()")
    return np.array(kernels.render_all(face.jax_env, face._state, face.env_params))
