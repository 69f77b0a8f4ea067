"""jaxsampler envs behind Gymnasium's API, for Gymnasium-based trainers (SB3, CleanRL, TorchRL).

::

    env = js.to_gymnasium("CartPole-v1")                  # a gymnasium.Env
    envs = js.to_gymnasium("CartPole-v1", num_envs=256)  # a gymnasium.vector.VectorEnv

Needs Gymnasium (``pip install -e ".[gymnasium]"``); importing this package does not import
it, :func:`to_gymnasium` does. The parts:

- :mod:`~jaxsampler.integrations.gymnasium.kernels`: the jitted device side (pure JAX);
- :mod:`~jaxsampler.integrations.gymnasium.convert`: spaces, observations, infos, actions;
- :mod:`~jaxsampler.integrations.gymnasium.env`: :class:`JaxGymnasiumEnv`, one env;
- :mod:`~jaxsampler.integrations.gymnasium.vector`: :class:`JaxGymnasiumVectorEnv`, ``N`` envs
  stepped by one jitted call, with Gymnasium's ``NEXT_STEP`` or ``SAME_STEP`` auto-reset.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

# public name -> submodule that defines it (imported, with Gymnasium, on first use)
_EXPORTS = {
    "InvalidActionError": "convert",
    "JaxGymnasiumEnv": "env",
    "JaxGymnasiumVectorEnv": "vector",
}

__all__ = sorted([*_EXPORTS, "to_gymnasium"])

_INSTALL = 'pip install -e ".[gymnasium]"'


def to_gymnasium(
    env_or_id: Any,
    num_envs: int | None = None,
    *,
    env_params: Any = None,
    render_mode: str | None = None,
    autoreset_mode: Any = "NextStep",
    **make_kwargs: Any,
) -> Any:
    """A single-agent jaxsampler env as a ``gymnasium.Env`` or a ``gymnasium.vector.VectorEnv``.

    Args:
        env_or_id: a jaxsampler env, or an id :func:`jaxsampler.make` knows (``"CartPole-v1"``,
            ``"gymnax:Acrobot-v1"``, ...).
        num_envs: ``None`` for one env (:class:`~.env.JaxGymnasiumEnv`); an int ``N >= 1`` for a
            vector env of ``N`` envs stepped together by one jitted call
            (:class:`~.vector.JaxGymnasiumVectorEnv`).
        env_params: the env's params (default ``env.default_params``), e.g. another time limit;
            for a vector env, leaves may carry a leading ``[N]`` (one value per env).
        render_mode: ``None`` or ``"rgb_array"`` (frames from the env's JAX renderer).
        autoreset_mode: the vector env's ``gymnasium.vector.AutoresetMode`` (or its value):
            ``NEXT_STEP`` (default, as ``SyncVectorEnv``) or ``SAME_STEP``. Ignored without
            ``num_envs``.
        **make_kwargs: passed to :func:`jaxsampler.make` with an id.

    Returns:
        A ``gymnasium.Env`` (``num_envs=None``) or a ``gymnasium.vector.VectorEnv`` whose
        ``metadata["autoreset_mode"]`` is the mode it honours.

    Raises:
        ImportError: Gymnasium is not installed (the message gives the install command).
        TypeError: ``num_envs`` not an int; a multi-agent env (the message names the
            alternatives); a ``"gym:<id>"`` id (already a Gymnasium env); not an env.
        ValueError: ``num_envs < 1``; an unknown id (the registry's error, with close
            matches); an unsupported render or auto-reset mode.
    """
    if num_envs is not None and (
        isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer))
    ):
        raise TypeError(f"to_gymnasium: num_envs must be an int or None, got {num_envs!r}")
    if num_envs is not None and int(num_envs) < 1:
        raise ValueError(f"to_gymnasium: num_envs must be >= 1, got {num_envs}")
    try:
        import gymnasium  # noqa: F401
    except ImportError as e:
        raise ImportError(f"to_gymnasium needs Gymnasium: {_INSTALL}") from e
    if num_envs is None:
        from jaxsampler.integrations.gymnasium.env import JaxGymnasiumEnv

        return JaxGymnasiumEnv(
            env_or_id, env_params=env_params, render_mode=render_mode, **make_kwargs
        )
    from jaxsampler.integrations.gymnasium.vector import JaxGymnasiumVectorEnv

    return JaxGymnasiumVectorEnv(
        env_or_id,
        int(num_envs),
        env_params=env_params,
        render_mode=render_mode,
        autoreset_mode=autoreset_mode,
        **make_kwargs,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(
            f"module 'jaxsampler.integrations.gymnasium' has no attribute {name!r}"
        )
    return getattr(importlib.import_module(f"jaxsampler.integrations.gymnasium.{module}"), name)


def __dir__() -> list[str]:
    return __all__
