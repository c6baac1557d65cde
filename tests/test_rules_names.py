"""The metric name catalogue the rules are generated from: naming conventions and declared label values."""

from __future__ import annotations

import re

import pytest

from llmslo.telemetry import (
    DEFAULT_BUCKETS_S,
    DRAIN_DURATION_BUCKETS_S,
    FINISH_REASONS,
    LABELS,
    METRICS,
    METRICS_BY_KEY,
    METRICS_BY_NAME,
    OVERFLOW_VALUE,
    RECORDING_RULES,
    REJECT_REASONS,
    RETRY_AFTER_BUCKETS_S,
    SLO_ERROR_RATIO,
    SLO_OBJECTIVE,
)

NAME = re.compile(r"^llmslo_[a-z][a-z0-9_]*[a-z]$")


@pytest.mark.parametrize("metric", METRICS, ids=lambda m: m.key)
def test_metric_names_are_llmslo_what_unit_and_counters_end_in_total(metric: object) -> None:
    from llmslo.telemetry import Metric

    assert isinstance(metric, Metric)
    assert NAME.match(metric.name) and ":" not in metric.name
    base = metric.name.removesuffix("_total")
    assert metric.name.endswith("_total") == (metric.type == "counter")
    if metric.unit:
        assert base.endswith(f"_{metric.unit}"), f"{metric.name} must end in its unit {metric.unit}"
    assert metric.help.endswith(".")
    assert metric.instrument_name == base if metric.type == "counter" else metric.instrument_name == metric.name


def test_keys_and_names_are_unique() -> None:
    assert len(METRICS_BY_KEY) == len(METRICS) == len(METRICS_BY_NAME)


def test_every_label_is_declared_with_a_closed_set_or_a_bound() -> None:
    for metric in METRICS:
        for label in metric.labels:
            declared = LABELS[label]
            assert declared.closed or declared.max_values > 0
            assert declared.bound >= 1
    assert LABELS["finish_reason"].values == FINISH_REASONS
    assert LABELS["reject_reason"].values == REJECT_REASONS
    assert not LABELS["model"].closed and LABELS["model"].bound == LABELS["model"].max_values + 1
    assert OVERFLOW_VALUE == "other"
    assert "request_id" not in LABELS


def test_a_metric_may_narrow_a_closed_label_and_rejects_labels_it_does_not_carry() -> None:
    assert METRICS_BY_KEY["summaries_dropped"].allowed_values("reason") == ("queue_full", "store_error")
    assert METRICS_BY_KEY["requests"].allowed_values("finish_reason") == FINISH_REASONS
    assert METRICS_BY_KEY["requests"].allowed_values("model") is None
    with pytest.raises(KeyError, match="has no label 'gpu'"):
        METRICS_BY_KEY["requests"].allowed_values("gpu")


def test_histograms_use_the_default_buckets_which_contain_the_common_slo_thresholds() -> None:
    histograms = [m for m in METRICS if m.type == "histogram"]
    per_request = [m for m in histograms if m.source is not None]
    assert {m.key for m in per_request} == {"ttft", "client_ttft", "tpot", "itl", "e2e", "queue"}
    for metric in per_request:
        assert metric.buckets_s == DEFAULT_BUCKETS_S[f"{metric.key}_s"]
    for metric in histograms:
        assert metric.bucket == f"{metric.name}_bucket" and metric.count == f"{metric.name}_count"
    assert {0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0} <= set(METRICS_BY_KEY["ttft"].buckets_s)
    assert METRICS_BY_KEY["retry_after"].buckets_s == RETRY_AFTER_BUCKETS_S
    assert METRICS_BY_KEY["drain_duration"].buckets_s == DRAIN_DURATION_BUCKETS_S
    assert {0.01, 0.02, 0.05, 0.1, 0.2} <= set(METRICS_BY_KEY["tpot"].buckets_s)
    with pytest.raises(AttributeError):
        _ = METRICS_BY_KEY["requests"].bucket


def test_the_catalogue_covers_what_servers_expose_and_the_alerts_read() -> None:
    expected = {
        "llmslo_prompt_tokens_total", "llmslo_proposed_tokens_total", "llmslo_generated_tokens_total",
        "llmslo_sent_tokens_total", "llmslo_requests_total", "llmslo_rejected_requests_total",
        "llmslo_terminal_signals_ignored_total", "llmslo_goodput_good_requests_total",
        "llmslo_goodput_attempted_requests_total", "llmslo_summaries_dropped_total", "llmslo_in_flight_requests",
        "llmslo_queued_requests", "llmslo_queue_capacity_requests", "llmslo_paused_streams", "llmslo_draining",
        "llmslo_breaker_state", "llmslo_gpu_memory_used_bytes", "llmslo_gpu_memory_total_bytes",
        "llmslo_retry_after_seconds", "llmslo_breaker_transitions_total", "llmslo_shed_requests_total",
        "llmslo_degraded_requests_total", "llmslo_rate_limit_store_errors_total", "llmslo_drain_duration_seconds",
        "llmslo_drain_closed_streams_total",
    }
    assert expected <= set(METRICS_BY_NAME)


def test_recording_rule_names_are_level_metric_operation_with_the_window() -> None:
    assert SLO_ERROR_RATIO.name("5m") == "llmslo:slo_error:ratio_rate5m"
    assert SLO_OBJECTIVE.name() == "llmslo:slo_objective:ratio"
    with pytest.raises(ValueError, match="needs window"):
        SLO_ERROR_RATIO.name()
    for rule in RECORDING_RULES:
        name = rule.name("1h" if rule.windowed else None)
        assert re.match(r"^llmslo:[a-z0-9_]+:[a-z0-9_]+$", name), name
