"""Shared pytest options and the fast loop.

``--update-golden`` rewrites golden files instead of comparing with them.

``--fast`` runs the developer loop (``.ci/check --fast``): the unit tests alone, in 1 to 1.5 minutes on 2 cores. It
leaves out every test marked ``slow``, ``integration`` or ``gpu``, and fails a test that starts a process (a
server, Prometheus, promtool, a browser, ``llmslo`` in a new interpreter), naming the test and the fix. The
tests that are slow are listed with the reason in :data:`SLOW` below, in this one place, and marked ``slow``
at collection. The full suite (``.ci/check``, CI, the README's test command) runs everything.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any, NoReturn

import pytest

# examples/server_asgi.py writes its summaries to ./summaries unless LLMSLO_SUMMARIES names a folder: a test that
# loads or runs it without naming one writes into a temporary folder, never into the checkout.
os.environ.setdefault("LLMSLO_SUMMARIES",
                      os.path.join(tempfile.gettempdir(), f"llmslo-example-summaries-{os.getpid()}"))

FAST_LEAVES_OUT = ("slow", "integration", "gpu")
"""Markers whose tests ``--fast`` leaves out."""

_CLI = "runs the llmslo command in a new Python process"
_PYTHON = "starts a new Python interpreter"
_SERVER = "starts an HTTP server and drives it"
_PROMETHEUS = "starts Prometheus"
_PROMTOOL = "runs promtool"
_CHDB = "loads into an embedded ClickHouse (chDB) too"
_HYPOTHESIS_STORE = "hypothesis: builds and reports a DuckDB store for every example"
_HYPOTHESIS = "hypothesis: hundreds of examples"
_STORE_PER_CASE = "a DuckDB store per case, over a second in all"
_RACES = "races threads or tasks many times over"
_POWER = "a statistical check: many stores or comparisons"
_WAITS = "waits out a timeout"
_REDIS = "starts redis-server"
_KILLED = "kills a Python process it started"

SLOW: dict[str, str] = {
    # whole modules: "test_x.py"
    "test_clickhouse_otel.py": _CHDB,
    "test_cli_check.py": _SERVER,
    "test_bench_floor_proxy.py": _SERVER,
    "test_bench_middleware.py": "starts uvicorn servers and drives them",
    "test_loadgen_keepalive.py::test_the_command_keeps_connections_unless_told_not_to": _CLI,
    "test_bench_gateway_base.py::test_another_checkouts_gateway_runs_from_it_beside_this_one": _SERVER,
    "test_bench_gateway_base.py::test_a_folder_that_is_not_a_checkout_is_refused": _PYTHON,
    "test_databases_primitives.py": _CHDB,
    "test_databases_report.py": "every report test again, on DuckDB and on a chDB copy (about 4 minutes)",
    "test_fleet_http.py": "serves an embedded ClickHouse over HTTP",
    "test_fleet_store.py": _CHDB,
    "test_bench_gpu_run.py::test_the_script_runs_the_engine_the_load_and_the_join_without_a_gpu": _SERVER,
    "test_gateway_redis.py": _REDIS,
    "test_gateway_drain_record.py::test_a_drain_record_needs_the_next_version_and_a_file": _CLI,
    "test_gateway_drain_record.py::test_the_drain_max_inflight_rule_reaches_the_gateway_from_the_flag_or_the_pool_file":
        _CLI,
    "test_gateway_paths.py::test_ten_thousand_api_keys_keep_the_key_table_and_its_memory_bounded":
        "10,000 requests through a gateway under tracemalloc (about 9 s)",
    "test_gateway_paths.py::test_a_backend_slower_than_the_ttft_bound_opens_its_breaker_and_new_requests_go_to_the_other":
        _WAITS,
    "test_gateway_paths.py::test_a_first_token_later_than_the_ttft_bound_counts_one_slow_ttft_failure_per_request_and_"
    "one_under_it_none": _WAITS,
    "test_gateway_paths.py::test_the_retry_after_of_a_full_queue_follows_how_fast_the_backend_drains_it": _WAITS,
    "test_rollout_plan.py::test_the_command_refuses_a_bad_plan_from_a_plain_folder": _CLI,
    "test_ops_prometheus.py": _PROMETHEUS,
    "test_rollout_runbook.py": _CLI,
    "test_walkthrough.py": _CLI,
    # single tests, every case of each: "test_x.py::test_name"
    "test_analysis_gpu.py::test_gpu_sample_succeeds_wherever_nvml_answers": "samples for two seconds",
    "test_analysis_import_bench.py::test_llmperf_report_command_reproduces_llmperfs_quantiles": _CLI,
    "test_analysis_import_bench.py::test_report_nearest_rank_reproduces_guidellms_own_percentiles": _CLI,
    "test_analysis_report.py::test_every_figure_is_the_same_when_every_group_goes_through_kaplan_meier":
        _HYPOTHESIS_STORE,
    "test_analysis_report.py::test_goodput_is_a_fraction_and_monotone_in_each_threshold": _HYPOTHESIS_STORE,
    "test_analysis_report.py::test_quantiles_equal_numpy_and_stay_inside_the_data": _HYPOTHESIS_STORE,
    "test_analysis_report.py::test_ttft_figures_match_numpy_and_a_plain_kaplan_meier_per_group": _HYPOTHESIS_STORE,
    "test_analysis_store.py::test_each_rule_rejects_its_bad_row_and_leaves_the_store_unchanged": _STORE_PER_CASE,
    "test_analysis_store.py::test_ingest_then_read_is_lossless": _HYPOTHESIS_STORE,
    "test_analysis_survival.py::test_matches_reference_km_hypothesis": _HYPOTHESIS,
    "test_analysis_survival.py::test_no_censoring_equals_numpy_inverted_cdf": _HYPOTHESIS,
    "test_analysis_survival.py::test_quantile_disc_with_decimal_fractions_is_the_km_quantile_without_censoring":
        _HYPOTHESIS,
    "test_analysis_survival.py::test_the_survivor_comparison_matches_a_plain_kaplan_meier_and_greenwood": _CHDB,
    "test_bench_gateway_start.py::test_the_command_prints_both_cases_and_the_ratio": _PYTHON,
    "test_bench_gateway_tokens.py::test_the_benchmark_prints_each_controller_per_phase_and_the_ratios": _PYTHON,
    "test_bench_pin.py::test_pin_gives_the_proxies_the_last_cpu_and_keeps_the_rest_for_everything_else": _PYTHON,
    "test_bench_pin.py::test_the_flag_is_in_the_help": _PYTHON,
    "test_cli.py::test_bad_arguments_get_a_clear_message_and_exit_code": _CLI,
    "test_cli.py::test_help_teaches_the_columns_and_durations": _CLI,
    "test_cli.py::test_ingest_takes_a_folder_of_summaries_as_its_jsonl_files": _CLI,
    "test_cli.py::test_invalid_file_exits_non_zero_names_the_row_and_writes_nothing": _CLI,
    "test_cli.py::test_report_by_backend_names_the_requests_no_backend_served": _CLI,
    "test_cli.py::test_report_json_has_the_documented_shape": _CLI,
    "test_cli.py::test_report_tables_and_csv": _CLI,
    "test_cli.py::test_without_the_analysis_stack_help_works_and_commands_give_the_install_hint": _CLI,
    "test_cli_anomalies.py::test_the_command_prints_the_rule_and_its_json": _CLI,
    "test_cli_anomalies.py::test_the_command_refuses_unplaceable_arrivals_and_too_many_windows_without_a_traceback":
        _CLI,
    "test_cli_anomalies.py::test_the_command_says_why_no_window_was_tested": _CLI,
    "test_cli_conventions.py::test_rules_check_json_gives_each_promtool_run": _PROMTOOL,
    "test_cli_lazy.py::test_a_command_help_imports_its_module_and_no_other_command": _CLI,
    "test_cli_lazy.py::test_the_top_level_help_imports_no_command_module": _CLI,
    "test_cli_output.py::test_anomalies_show_hostile_series_names_literally": _CLI,
    "test_cli_output.py::test_error_messages_show_hostile_names_literally": _CLI,
    "test_cli_output.py::test_report_tables_show_hostile_label_values_literally": _CLI,
    "test_cli_output.py::test_rules_output_shows_hostile_file_names_literally": _CLI,
    "test_cli_output.py::test_scrape_shows_hostile_label_values_literally": _CLI,
    "test_cli_output.py::test_trace_shows_hostile_model_names_literally": _CLI,
    "test_controls_drain.py::test_requests_arriving_while_the_drain_begins_are_admitted_or_refused_once": _RACES,
    "test_controls_redis.py::test_a_flushed_script_cache_is_reloaded_by_the_next_decision": _REDIS,
    "test_controls_redis.py::test_a_frozen_redis_costs_one_bounded_timeout_then_recovers": _REDIS,
    "test_controls_redis.py::test_importing_the_controls_does_not_import_redis": _PYTHON,
    "test_controls_redis.py::test_redis_keys_are_hashed_short_and_expire_once_full": _REDIS,
    "test_controls_redis.py::test_redis_killed_mid_run_admits_or_refuses_by_fail_mode_counted_without_hanging": _REDIS,
    "test_controls_redis.py::test_replicas_racing_on_one_bucket_admit_exactly_its_capacity": _REDIS,
    "test_controls_redis.py::test_the_redis_script_decides_exactly_as_the_in_process_buckets": _REDIS,
    "test_controls_redis.py::test_two_replicas_share_one_bucket": _REDIS,
    "test_controls_redis.py::test_with_redis_time_the_wait_is_the_time_until_the_bucket_refills": _REDIS,
    "test_dashboards_generate.py::test_generating_loads_no_telemetry_runtime_and_importing_needs_no_yaml": _PYTHON,
    "test_dashboards_generate.py::test_the_json_is_byte_deterministic_across_processes_and_hash_seeds": _PYTHON,
    "test_engines_profiles.py::test_importing_the_profiles_loads_no_runtime_and_no_analysis_stack": _PYTHON,
    "test_fleet_parquet.py::test_exact_quantiles_packed_into_queries_under_a_budget_give_the_same_report":
        _STORE_PER_CASE,
    "test_fleet_parquet.py::test_the_report_over_the_files_is_the_report_over_the_store": _STORE_PER_CASE,
    "test_importers_contract.py::test_importing_the_19_llmperf_files_says_each_sentence_once":
        "imports 19 real files into a store",
    "test_journal.py::test_a_failed_write_keeps_the_journal_for_the_next_attempt": _KILLED,
    "test_journal.py::test_a_killed_process_leaves_its_open_requests_and_recovery_makes_one_crash_row_each": _KILLED,
    "test_journal.py::test_a_new_journal_carries_what_a_killed_one_left_with_its_own_last_time": _KILLED,
    "test_journal.py::test_a_torn_last_line_is_skipped_counted_and_not_fatal": _KILLED,
    "test_journal.py::test_ingest_recover_loads_each_row_once_and_the_report_censors_the_one_without_a_token": _KILLED,
    "test_journal.py::test_requests_that_already_have_a_summary_get_no_second_row": _KILLED,
    "test_loadgen_attempt.py::test_an_endless_event_is_refused_not_held": "feeds 16 MiB through the SSE parser",
    "test_loadgen_causes.py::test_a_body_is_kept_as_received_and_its_control_characters_escaped_in_the_cause":
        _SERVER,
    "test_loadgen_causes.py::test_a_run_counts_its_causes": _SERVER,
    "test_loadgen_causes.py::test_an_empty_400_is_recorded_as_empty_with_its_status": _SERVER,
    "test_loadgen_causes.py::test_the_summary_says_why_ten_of_ten_failed": _SERVER,
    "test_loadgen_causes.py::test_the_summary_shows_several_causes_with_counts_and_bodies_literally": _SERVER,
    "test_loadgen_ids.py::test_a_server_that_takes_only_uuids_answers_every_request_of_the_installed_command": _CLI,
    "test_loadgen_ids.py::test_the_id_travels_in_the_configured_header_and_comes_back_in_its_echo": _SERVER,
    "test_loadgen_ids.py::test_the_installed_command_refuses_a_bad_header_name_before_sending": _CLI,
    "test_loadgen_ids.py::test_with_the_header_off_no_id_is_sent_and_the_rows_keep_their_uuids": _SERVER,
    "test_loadgen_surface.py::test_importing_the_load_generator_loads_no_analysis_stack_cli_or_server": _PYTHON,
    "test_middleware.py::test_importing_telemetry_loads_no_middleware_and_the_middleware_no_framework": _PYTHON,
    "test_ops_llamacpp.py::test_a_binary_and_model_named_relative_to_the_working_directory_are_the_ones_run":
        "starts a stand-in llama-server",
    "test_public_surface.py::test_contract_users_load_no_telemetry_runtime": _PYTHON,
    "test_public_surface.py::test_dependencies_point_the_documented_way": _PYTHON,
    "test_public_surface.py::test_help_and_version_load_no_analysis_stack": _PYTHON,
    "test_public_surface.py::test_importing_a_server_package_loads_no_heavy_dependency": _PYTHON,
    "test_public_surface.py::test_the_store_is_the_light_door_of_the_analysis": _PYTHON,
    "test_readme.py::test_ci_run_refuses_arguments_with_a_usage_line_and_runs_nothing": "runs .ci/run in bash",
    "test_readme.py::test_ci_run_without_arguments_runs_setup_then_check": "runs .ci/run in bash",
    "test_report_cli.py::test_the_table_says_why_rates_are_null": _CLI,
    "test_report_cli.py::test_until_sets_the_horizon_of_in_flight_requests": _CLI,
    "test_report_quantiles.py::test_the_clickhouse_path_gives_the_same_quantiles_by_each_definition": _CHDB,
    "test_report_quantiles.py::test_the_command_says_the_definition_when_it_is_not_the_default": _CLI,
    "test_report_rates.py::test_arrival_times_that_cannot_be_placed_give_a_clear_error": _STORE_PER_CASE,
    "test_report_rates.py::test_real_llmperf_files_record_no_duration_and_get_null_rates_with_the_reason":
        "imports real files into a store",
    "test_report_rates.py::test_the_command_reports_unplaceable_arrivals_and_too_many_windows_without_a_traceback":
        _CLI,
    "test_rollout_advice.py::test_worked_example_a_120s_budget_covers_about_99_percent_of_requests": _POWER,
    "test_rollout_compare.py::test_a_twenty_percent_ttft_shift_on_one_version_is_found_in_nine_of_ten_runs": _POWER,
    "test_rollout_compare.py::test_bad_arguments_are_refused_naming_the_field": _STORE_PER_CASE,
    "test_rollout_compare.py::test_cli_bad_command_lines_exit_2_naming_the_option": _STORE_PER_CASE,
    "test_rollout_compare.py::test_null_comparisons_give_at_most_two_false_regressions_in_fifty": _POWER,
    "test_rollout_records.py::test_a_bad_field_is_named_with_the_fix_and_nothing_is_written": _STORE_PER_CASE,
    "test_rollout_rules.py::test_checking_a_plan_in_ops_loads_no_analysis_stack": _PYTHON,
    "test_rules_cli.py::test_check_fails_on_a_rule_file_promtool_rejects": _PROMTOOL,
    "test_rules_cli.py::test_check_passes_generated_rules_and_their_proofs": _PROMTOOL,
    "test_rules_cli.py::test_proofs_in_another_folder_find_rules_under_a_folder_whose_name_reads_as_a_glob":
        _PROMTOOL,
    "test_rules_generator.py::test_output_is_byte_identical_in_a_fresh_interpreter_with_another_hash_seed": _PYTHON,
    "test_rules_promtool.py": _PROMTOOL,
    "test_rules_spec_limits.py::test_promtool_accepts_rules_with_the_longest_duration_the_spec_accepts": _PROMTOOL,
    "test_scrape_engines.py::test_installed_llmslo_scrape_compares_the_llamacpp_pair_without_a_rate_for_n_tokens_max":
        _CLI,
    "test_scrape_engines.py::test_installed_llmslo_scrape_reads_every_real_exposition": _CLI,
    "test_server_app.py::test_a_queue_timeout_answers_429_with_retry_after_and_says_deadline_as_its_summary_does":
        _WAITS,
    "test_server_cli.py::test_importing_the_server_loads_no_heavy_dependency_and_not_uvicorn": _PYTHON,
    "test_server_cli.py::test_without_the_serve_extra_the_command_says_how_to_install_it": _CLI,
    "test_store_ingest_guards.py::test_a_column_named_like_an_internal_one_is_refused": _STORE_PER_CASE,
    "test_store_ingest_guards.py::test_an_interval_longer_than_the_bound_is_rejected": _STORE_PER_CASE,
    "test_summary_encoding.py::test_the_benchmark_prints_both_encodings_for_each_length": _PYTHON,
    "test_telemetry_fold.py::test_batched_folds_expose_exactly_what_the_summaries_say": _HYPOTHESIS,
    "test_telemetry_lifecycle.py::test_racing_asyncio_tasks_always_leave_one_terminal_state_one_cleanup_and_one_"
    "summary": _RACES,
    "test_telemetry_lifecycle.py::test_racing_threads_always_leave_one_terminal_state_one_cleanup_and_one_summary":
        _RACES,
    "test_telemetry_lifecycle.py::test_the_server_verdict_agrees_with_the_analysis_goodput_policy": _HYPOTHESIS,
    "test_telemetry_otel.py::test_a_dead_collector_never_reaches_the_server_and_shutdown_ends_within_seconds": _WAITS,
    "test_telemetry_otel.py::test_importing_and_using_the_telemetry_without_tracing_loads_no_opentelemetry": _PYTHON,
    "test_telemetry_sink.py::test_close_counts_everything_while_a_duckdb_file_is_locked_by_another_process": _PYTHON,
    "test_telemetry_summary.py::test_python_rules_agree_with_their_sql_form": _HYPOTHESIS_STORE,
}
"""Tests the fast loop leaves out, with the reason: a whole module (``"test_x.py"``) or one test function with all
its cases (``"test_x.py::test_name"``). A test goes here when it starts a process (``--fast`` fails it otherwise)
or when all its cases together take over a second on 2 busy cores; pytest prints the slowest 20 on every run."""


def slow_reason(module: str, function: str) -> str | None:
    """Why test ``function`` of ``module`` (a file name, ``test_x.py``) is left out of the fast loop; None if it is
    not listed in :data:`SLOW`."""
    return SLOW.get(f"{module}::{function}") or SLOW.get(module)


def refuse_processes(nodeid: str) -> Callable[..., NoReturn]:
    """A ``subprocess.Popen.__init__`` that fails test ``nodeid`` instead of starting the process."""

    def refused(self: subprocess.Popen[Any], args: Any, *_: Any, **__: Any) -> NoReturn:
        self._child_created = False  # type: ignore[attr-defined]  # what Popen.__del__ reads
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        program = os.fsdecode(argv[0]) if argv else "?"
        pytest.fail(f"{nodeid} starts a process ({program}), and the fast loop (pytest --fast) starts none: "
                    "add the test to SLOW in tests/conftest.py with the reason")

    return refused


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="Rewrite golden files from the current output (review the diff before committing).")
    parser.addoption("--fast", action="store_true", default=False,
                     help="The developer loop: leave out the tests marked slow, integration or gpu (tests/conftest.py "
                          "lists the slow ones and why) and fail a test that starts a process.")


def _whole_module_is_slow(path: Path) -> bool:
    return path.name in SLOW


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``--fast``, a module listed whole in :data:`SLOW` is not imported at all (unless named on the command
    line)."""
    if config.getoption("--fast") and _whole_module_is_slow(collection_path):
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests listed in :data:`SLOW` ``slow``; with ``--fast``, leave out those of :data:`FAST_LEAVES_OUT`."""
    for item in items:
        if slow_reason(item.path.name, getattr(item, "originalname", item.name)) is not None:
            item.add_marker(pytest.mark.slow)
    if not config.getoption("--fast"):
        return
    left_out = [item for item in items if any(item.get_closest_marker(m) for m in FAST_LEAVES_OUT)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        kept = set(map(id, left_out))
        items[:] = [item for item in items if id(item) not in kept]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    """With ``--fast``, a test (its fixtures included) that starts a process fails, naming itself and the fix."""
    if not item.config.getoption("--fast"):
        return (yield)
    original = subprocess.Popen.__init__
    subprocess.Popen.__init__ = refuse_processes(item.nodeid)  # type: ignore[method-assign]
    try:
        return (yield)
    finally:
        subprocess.Popen.__init__ = original  # type: ignore[method-assign]


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    """True when the run was started with ``--update-golden``."""
    return bool(request.config.getoption("--update-golden"))
