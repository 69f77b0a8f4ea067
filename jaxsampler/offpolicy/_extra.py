"""The ``offpolicy`` extra: flashbax and rlax, imported only when a function needs them."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["require"]


def require(name: str) -> ModuleType:
    """Imports ``name`` (``"flashbax"`` or ``"rlax"``).

    Raises:
        ImportError: it is not installed; the message names the extra to install.
    """
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise ImportError(
            f"jaxsampler.offpolicy needs {name}: pip install jaxsampler[offpolicy]"
        ) from err
