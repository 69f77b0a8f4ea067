"""The tools row: the ``jaxsampler`` command (:mod:`~jaxsampler.cli.main`), its main
benchmark job (:mod:`~jaxsampler.cli.bench`) and the local multi-process launcher
(:mod:`~jaxsampler.cli.launch`)."""

from jaxsampler.cli.main import main

__all__ = ["main"]
