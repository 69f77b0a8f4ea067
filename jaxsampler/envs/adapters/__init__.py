"""Adapters that turn other JAX env suites into jaxsampler envs."""
