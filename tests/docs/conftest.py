import pytest


def pytest_configure(config: pytest.Config) -> None:
    # Registered here too, so the docs tests run (and -m selects) whether or not the
    # project-wide marker list has it yet.
    config.addinivalue_line("markers", "integration: needs an optional suite (RLlib, torch, ...)")
