"""jaxsampler's benchmark scripts, a package run from the repository root.

Each script is a module: ``python -m benchmarks.throughput --quick`` (see ``README.md`` in
this folder). What they share lives in :mod:`benchmarks.harness` (formatting, timing, the
``--quick`` sizes, result files), :mod:`benchmarks.baselines` (the hand-written loops they
are measured against) and :mod:`benchmarks.serving_client` (the simulated serving clients).

Importing this package imports nothing else (``scaling.py``'s parent process never imports
JAX).
"""
