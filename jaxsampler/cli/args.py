"""Argument checking shared by the ``jaxsampler`` command and the launcher: a parser whose
errors are one line, and ``type=`` functions that turn a bad value into such an error.

Every ``type=`` function raises ``argparse.ArgumentTypeError`` with a message that says
what the option takes and what it got; argparse prefixes the option's name.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import NoReturn

__all__ = [
    "OneLineParser",
    "devices",
    "hidden_sizes",
    "nonnegative_float",
    "port",
    "positive_float",
    "positive_int",
    "seed",
    "widths",
]

#: The largest seed ``--seed`` takes (``jax.random.PRNGKey`` seeds are 32-bit here).
MAX_SEED = 2**32 - 1


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr, ``<command>: error: ...``
    with a pointer to ``--help``, and exit status 2 (argparse's own error prints the
    usage block first). Subparsers made from it are of this class too; give each
    ``command`` (the top-level program's name) so their errors start with it as well."""

    #: The name error lines start with (default: ``prog``).
    command: str | None = None

    def error(self, message: str) -> NoReturn:
        command = self.command or self.prog
        sub = self.prog[len(command) :].strip() if self.prog.startswith(command) else ""
        where = f"{sub}: " if sub else ""
        text = " ".join(f"{where}{message}".split())  # one line, whatever the message held
        sys.stderr.write(f"{command}: error: {text} (see {self.prog} --help)\n")
        sys.exit(2)


def _int(text: str, what: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}, got {text!r}") from None


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return _at_least_one(text, "must be an integer >= 1")


def seed(text: str) -> int:
    """An integer in ``[0, MAX_SEED]``."""
    what = f"must be an integer from 0 to {MAX_SEED}"
    value = _int(text, what)
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"{what}, got {text!r}")
    return value


def devices(text: str) -> str:
    """``"auto"`` or an integer >= 1 (returned as its decimal string)."""
    if text.strip().lower() == "auto":
        return "auto"
    return str(_at_least_one(text, "must be 'auto' or an integer >= 1"))


def _at_least_one(text: str, what: str) -> int:
    value = _int(text, what)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{what}, got {text!r}")
    return value


def _int_list(text: str, what: str) -> list[int]:
    parts = [p.strip() for p in text.split(",")]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}, got {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{what}, got {text!r}")
    return values


def widths(text: str) -> list[int]:
    """Comma-separated integers >= 1 (vector widths), at least one."""
    return _int_list(text, "widths must be comma-separated integers >= 1, e.g. 1,64,1024")


def hidden_sizes(text: str) -> tuple[int, ...]:
    """Comma-separated integers >= 1 (hidden layer sizes), at least one."""
    return tuple(_int_list(text, "must be comma-separated integers >= 1, e.g. 64,64"))


def _float(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}, got {text!r}") from None
    if math.isnan(value):
        raise argparse.ArgumentTypeError(f"{what}, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A number of seconds > 0 (``inf`` allowed)."""
    value = _float(text, "must be a number of seconds > 0")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def nonnegative_float(text: str) -> float:
    """A number of seconds >= 0."""
    value = _float(text, "must be a number of seconds >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text!r}")
    return value


def port(text: str) -> int:
    """A TCP port, 1..65535."""
    value = _int(text, "must be a port number from 1 to 65535")
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 1 to 65535, got {text!r}")
    return value
