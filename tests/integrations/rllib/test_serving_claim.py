"""The migration guide's serving pair has no runnable RLlib side: pin the reason it gives.

docs/migration/from-rllib.md says RLlib 2.60 ships no ``PolicyServerInput`` (only the old
stack's ``PolicyClient``) and that its new-stack external-env runner takes whole episodes from a
simulator that runs the policy itself. If a later RLlib brings a server back, this test fails
and the guide's pair should get its RLlib side.
"""

from __future__ import annotations

import importlib

import pytest


def test_rllib_ships_a_client_but_no_policy_server_input():
    import ray.rllib.env as rllib_env

    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("ray.rllib.env.policy_server_input")
    assert not hasattr(rllib_env, "PolicyServerInput")
    from ray.rllib.env.policy_client import PolicyClient  # the client half is still there

    assert callable(PolicyClient.get_action)


def test_the_new_stack_runner_takes_episodes_not_action_requests():
    from ray.rllib.env.env_runner import EnvRunner
    from ray.rllib.env.external.env_runner_server_for_external_inference import (
        EnvRunnerServerForExternalInference,
    )

    assert issubclass(EnvRunnerServerForExternalInference, EnvRunner)
    # It keeps the module only as a weights container: no per-request action method.
    for name in ("get_action", "compute_single_action", "start_episode"):
        assert not hasattr(EnvRunnerServerForExternalInference, name)
