"""The two test tiers: which tests are integration tests (tests/conftest.py marks them).

The quick tier (plain ``pytest``) needs only the ``test`` extra. A test is an integration test
when it needs the ``integration`` extra (RLlib with torch, an env suite, W&B, the notebooks'
kernel, SB3 / TorchRL) or trains for long (the ``slow`` marker). Whole files are listed by path,
single tests by node id, so no test file has to change to move between tiers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

#: Files (or folders, ending in "/") whose every test is an integration test: what each needs.
INTEGRATION_PATHS: dict[str, str] = {
    "tests/integrations/rllib/": "RLlib with torch (the rllib extra)",
    "tests/integrations/gymnasium/test_trainers.py": "stable-baselines3 and TorchRL (torch)",
    "tests/episodes/test_rllib_differential_sa.py": "RLlib's own episodes as the reference",
    "tests/episodes/test_rllib_differential_ma.py": "RLlib's own episodes as the reference",
    "tests/sampling/device/test_rllib_compatible_ma.py": "RLlib's own episodes as the reference",
    "tests/examples/test_rllib_ppo.py": "examples/rllib_ppo.py trains with RLlib and torch",
    "tests/examples/test_selfplay.py": "Pgx (the pgx extra)",
    "tests/examples/test_ippo_mpe.py": "JaxMARL (the jaxmarl extra)",
    "tests/envs/adapters/test_brax.py": "Brax and MuJoCo (the brax extra)",
    "tests/envs/adapters/test_jumanji.py": "Jumanji (the jumanji extra)",
    "tests/envs/adapters/test_pgx.py": "Pgx (the pgx extra)",
    "tests/benchmarks/test_acting_budgets.py": "Pgx (the pgx extra)",
    "tests/benchmarks/test_notebook.py": "a Jupyter kernel (nbclient, ipykernel)",
    "tests/docs/test_hooks.py": "mkdocs (the docs extra)",
    "tests/docs/test_code_blocks_guides.py": (
        "a long run: every guide's and migration page's code, one process per page"
    ),
    "tests/docs/test_code_blocks_concepts.py": (
        "a long run: every concept page's code, one process per page"
    ),
    "tests/sampling/test_resume.py": "a long run: saved and resumed runs in subprocesses",
    "tests/benchmarks/test_offpolicy_hand.py": (
        "a long run: the hand-written off-policy baselines train and collect (benchmarks)"
    ),
    "tests/examples/test_durable_server.py": (
        "a long run: the durable-server example's kill and restart, end to end"
    ),
}

#: Single tests that are integration tests in a quick-tier file: node ids, with parameters
#: (one case) or without (every case).
INTEGRATION_TESTS: dict[str, str] = {
    "tests/test_package.py::test_moved_module_paths_import_with_a_deprecation_warning"
    "[jaxsampler.rllib.convert-jaxsampler.integrations.rllib.convert-to_rllib]": (
        "the old RLlib path imports RLlib"
    ),
    # The long runs: whole benchmarks, examples and resumed runs end to end (each tens of
    # seconds of compiles); the modules they use have quick tests of their own.
    "tests/envs/adapters/test_gymnax_compact.py::test_ppo_cnn_update_on_compact_frames_matches"
    "_float32": "a long run",
    "tests/benchmarks/test_host_side.py::test_quick_writes_the_schema": "a long run",
    "tests/benchmarks/test_groups.py::test_ppo_groups_quick_writes_runs_table_and_plot": (
        "a long run"
    ),
    "tests/benchmarks/test_groups.py::test_quick_writes_both_envs": (
        "JaxMARL (the jaxmarl extra): simple_tag is one of the two envs"
    ),
    "tests/rollout/test_checkpoint.py::test_checkpoint_benchmark_quick_writes_the_schema": (
        "a long run"
    ),
    "tests/benchmarks/test_scaling.py::test_gpu_quick_writes_the_schema": "a long run",
    "tests/benchmarks/test_scaling.py::test_scaling_quick_writes_the_schema": "a long run",
    "tests/benchmarks/test_host_side.py::test_gpu_host_part_runs_tiny_on_cpu": "a long run",
    "tests/benchmarks/test_host_threads.py::test_quick_writes_the_schema": "a long run",
    "tests/benchmarks/test_suites.py::test_quick_gymnax_writes_the_schema": "a long run",
    "tests/examples/test_dqn.py::test_quick_main_writes_results": "a long run",
    "tests/serving/test_journal_crash.py::test_answered_steps_survive_two_server_kills_exactly"
    "_once": "a long run: server processes killed and restarted under load",
    "tests/rollout/test_distributed.py::test_two_process_rollout_is_the_two_device_rollout"
    "_sliced": "a long run: two processes launched",
    "tests/cli/test_main.py::test_bench_says_why_gymnasium_did_not_run": "a long run",
    "tests/integrations/test_progress.py::test_bench_quiet_prints_only_the_table": "a long run",
    "tests/integrations/test_progress.py::test_bench_draws_a_bar_on_a_terminal": "a long run",
    "tests/test_vector_reset_pool.py::test_procmaze_start_distribution": (
        "a long run: a reset distribution over many mazes"
    ),
    "tests/examples/test_sac.py::test_quick_main_writes_results": "a long run",
    "tests/examples/test_impala_host.py::test_both_loops_train_end_to_end": "a long run",
    "tests/examples/test_distributed.py::test_two_processes_match_one_process_with_two_devices": (
        "a long run"
    ),
    "tests/examples/test_distributed.py::test_one_device_is_the_same_run_up_to_rounding": (
        "a long run"
    ),
    "tests/host_envs/external/test_limits.py::test_memory_does_not_grow_with_the_number_of"
    "_episodes": "a long run",
    "tests/examples/test_domain_randomization.py::test_quick_run_writes_results_with_both"
    "_variants": "a long run",
    "tests/integrations/test_loggers.py::test_real_wandb_offline": "W&B (the wandb extra)",
    "tests/envs/adapters/test_jaxmarl.py::test_real_jaxmarl_mpe_matches_stepping_by_hand": (
        "JaxMARL (the jaxmarl extra)"
    ),
    "tests/envs/adapters/test_jaxmarl.py::test_real_jaxmarl_groups_match_stepping_by_hand": (
        "JaxMARL (the jaxmarl extra)"
    ),
    "tests/benchmarks/test_host_side.py::test_copy_floor_and_object_counts_by_hand": (
        "the RLlib floor needs ray[rllib]"
    ),
}

#: Markers that make a test an integration test wherever it is: the long runs.
INTEGRATION_MARKERS = frozenset({"slow"})


def integration_reason(nodeid: str, markers: Iterable[str]) -> str | None:
    """Why the test ``nodeid`` (as pytest spells it, rootdir-relative) is an integration test.

    Returns:
        What it needs, or ``None`` for a quick-tier test.
    """
    path, _, name = nodeid.partition("::")
    for where, why in INTEGRATION_PATHS.items():
        if path == where or (where.endswith("/") and path.startswith(where)):
            return why
    why = INTEGRATION_TESTS.get(nodeid) or INTEGRATION_TESTS.get(f"{path}::{name.split('[')[0]}")
    if why is not None:
        return why
    slow = INTEGRATION_MARKERS.intersection(markers)
    return f"a long run (marked {sorted(slow)[0]})" if slow else None


def is_integration_file(path: str) -> bool:
    """Whether every test in the file ``path`` (rootdir-relative, "/"-separated) is listed."""
    return "::" not in path and integration_reason(path, ()) is not None


def selects_integration(matches: Callable[[frozenset[str]], bool] | None) -> bool:
    """Whether the ``-m`` expression can select an integration test, so that the files listed
    in :data:`INTEGRATION_PATHS` must be collected (they are not imported otherwise, so a quick
    install collects without import errors or skips).

    Args:
        matches: whether ``-m`` selects a test with the given marker names; ``None`` where there
            is no ``-m`` expression (every test is selected).
    """
    if matches is None:
        return True
    marked = ({"integration"}, {"integration", *INTEGRATION_MARKERS})
    return any(matches(frozenset(m)) for m in marked)
