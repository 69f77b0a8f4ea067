"""A griffe extension for the API reference: docstrings completed at import time.

:class:`jaxsampler.host_envs.GymnasiumHostEnv` and ``MultiAgentDictEnv`` share the entries
of their failure options: their source docstrings say ``{failure_args}`` where the
``_document_failure_args`` decorator puts them when the module is imported. griffe reads the
source, so this extension makes the same substitution.
"""

from __future__ import annotations

from typing import Any

import griffe

MARKER = "{failure_args}"


class FailureArgs(griffe.Extension):
    """Replaces ``{failure_args}`` in class docstrings with the shared entries."""

    def on_class_members(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        """Substitutes the marker in one class docstring (no-op elsewhere)."""
        if cls.docstring is None or MARKER not in cls.docstring.value:
            return
        from jaxsampler.host_envs import gymnasium_envs

        entries = _dedent(gymnasium_envs._FAILURE_ARGS_DOC)
        cls.docstring.value = cls.docstring.value.replace(MARKER + "\n", entries).replace(
            MARKER, entries.rstrip("\n")
        )


def _dedent(block: str) -> str:
    """The shared entries at the indentation of griffe's cleaned docstring (4, not 8)."""
    return "".join(line[4:] + "\n" if line.strip() else "\n" for line in block.splitlines())
