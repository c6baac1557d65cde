"""The SLO spec: defaults, and configuration errors that name the field and say how to fix it."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from llmslo.rules import DEFAULT_BURN_ALERTS, SpecError, load_spec, parse_spec, parse_spec_text
from llmslo.telemetry import ConfigurationError

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "chat-slo.yaml"


def spec(**changes: Any) -> dict[str, Any]:
    """A minimal valid spec with ``changes`` applied (``None`` removes a key)."""
    base: dict[str, Any] = {
        "version": "llmslo/v1",
        "service": "chat",
        "objectives": [{"name": "ttft", "kind": "latency", "metric": "ttft", "threshold": "2s", "objective": 99}],
    }
    for key, value in changes.items():
        if value is None:
            base.pop(key, None)
        else:
            base[key] = value
    return base


def objective(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": "ttft", "kind": "latency", "metric": "ttft", "threshold": "2s", "objective": 99}
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def error(data: dict[str, Any]) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return info.value


def test_the_example_spec_loads_with_the_workbook_alerts_and_a_30_day_period() -> None:
    s = load_spec(EXAMPLE)
    assert s.service == "chat" and s.period_s == 30 * 86400
    assert s.burn_alerts == DEFAULT_BURN_ALERTS
    assert [(o.name, o.kind, o.objective) for o in s.objectives] == [
        ("goodput", "goodput", Decimal(99)), ("ttft", "latency", Decimal(99)), ("tpot", "latency", Decimal(99))]
    assert s.objectives[1].threshold_s == 2.0 and s.objectives[2].threshold_s == 0.1
    assert dict(s.objectives[0].selector) == {"model": "chat", "slo_class": "interactive"}


def test_defaults_fill_period_scrape_and_job_from_the_service() -> None:
    s = parse_spec(spec())
    assert (s.period_s, s.scrape_interval_s, s.evaluation_interval_s, s.job) == (2592000, 30, 60, "chat")
    assert s.operational.queue_saturation is not None and s.operational.queue_saturation.for_s == 60


def test_spec_errors_are_configuration_errors_naming_the_field() -> None:
    exc = error(spec(objectives=[objective(objective=100)]))
    assert isinstance(exc, ConfigurationError)
    assert exc.path == "objectives[0].objective"
    assert str(exc).startswith("objectives[0].objective: must be a percentage strictly between 0 and 100")


@pytest.mark.parametrize("value", [0, 100, -1, 100.5, "abc"])
def test_an_objective_outside_zero_to_hundred_is_rejected(value: object) -> None:
    assert error(spec(objectives=[objective(objective=value)])).path == "objectives[0].objective"


def test_a_90_percent_slo_cannot_page_at_14_4x_and_the_message_says_so() -> None:
    exc = error(spec(objectives=[objective(objective=90)]))
    assert exc.path == "objectives[0].objective"
    assert "a 90% SLO cannot page at 14.4×" in str(exc)
    assert "144%" in str(exc) and "below 10×" in str(exc)


def test_burn_rate_times_budget_of_exactly_one_is_rejected_because_it_could_never_fire() -> None:
    alerts = [{"severity": "ticket", "burn_rate": 10, "long_window": "1h", "short_window": "5m"}]
    exc = error(spec(objectives=[objective(objective=90)], burn_alerts=alerts))
    assert "cannot open a ticket at 10×" in str(exc)


def test_a_window_shorter_than_four_scrape_intervals_is_rejected() -> None:
    exc = error(spec(scrape={"interval": "2m"}))
    assert exc.path == "burn_alerts (default)[0].short_window"
    assert "5m is shorter than 4 × the scrape interval (2m)" in str(exc)
    exc = error(spec(operational={"rejections": {"window": "1m"}}))
    assert exc.path == "operational.rejections.window"


def test_a_latency_threshold_that_is_not_a_bucket_bound_names_the_nearest_bounds() -> None:
    exc = error(spec(objectives=[objective(threshold="1.5s")]))
    assert exc.path == "objectives[0].threshold"
    assert "1.5s is not a bucket bound of llmslo_ttft_seconds" in str(exc)
    assert "nearest bounds: 1s and 2s" in str(exc)
    assert "the largest" not in str(error(spec(objectives=[objective(threshold="120s")])))
    assert "nearest bounds: 60s" in str(error(spec(objectives=[objective(threshold="120s")])))


def test_thresholds_read_in_milliseconds_or_seconds_match_the_bounds_exactly() -> None:
    for written in ("100ms", 0.1, "0.1s"):
        s = parse_spec(spec(objectives=[objective(name="tpot", metric="tpot", threshold=written)]))
        assert s.objectives[0].threshold_s == 0.1


def test_an_unknown_metric_is_rejected_with_the_known_histograms() -> None:
    exc = error(spec(objectives=[objective(metric="ttfb")]))
    assert exc.path == "objectives[0].metric"
    assert "unknown latency metric 'ttfb'" in str(exc) and "ttft (llmslo_ttft_seconds)" in str(exc)


@pytest.mark.parametrize("metric", ["retry_after", "llmslo_drain_duration_seconds"])
def test_the_serving_controls_histograms_are_no_latency_metric(metric: str) -> None:
    exc = error(spec(objectives=[objective(metric=metric, threshold="10s")]))
    assert exc.path == "objectives[0].metric"
    assert f"unknown latency metric {metric!r}" in str(exc)
    assert "retry_after" not in str(exc).split("known:")[1] and "ttft (llmslo_ttft_seconds)" in str(exc)


def test_an_unknown_label_or_label_value_is_rejected() -> None:
    exc = error(spec(selector={"user_id": "42"}))
    assert exc.path == "selector.user_id" and "unknown label" in str(exc)
    exc = error(spec(objectives=[objective(selector={"finish_reason": "timeout"})]))
    assert exc.path == "objectives[0].selector.finish_reason" and "unknown value 'timeout'" in str(exc)


def test_a_label_the_objectives_metric_does_not_carry_is_rejected() -> None:
    exc = error(spec(objectives=[objective(selector={"slo_class": "interactive"})]))
    assert exc.path == "objectives[0].selector.slo_class"
    assert "llmslo_ttft_seconds has no label 'slo_class'" in str(exc)


def test_unknown_fields_and_a_wrong_version_are_rejected() -> None:
    assert error(spec(objectivs=[])).path == "objectivs"
    assert error(spec(objectives=[objective(treshold="2s")])).path == "objectives[0].treshold"
    assert error(spec(version="sloth/v1")).path == "version"


def test_rule_labels_may_not_shadow_metric_or_slo_labels() -> None:
    assert error(spec(labels={"model": "x"})).path == "labels.model"
    assert error(spec(labels={"severity": "x"})).path == "labels.severity"


def test_availability_bad_reasons_come_from_the_closed_finish_reason_set() -> None:
    ok = parse_spec(spec(objectives=[{"name": "errors", "kind": "availability", "objective": 99.9,
                                      "bad": ["rejected", "error"]}]))
    assert ok.objectives[0].bad == ("rejected", "error")
    exc = error(spec(objectives=[{"name": "errors", "kind": "availability", "objective": 99.9, "bad": ["stop"]}]))
    assert exc.path == "objectives[0].bad[0]"


def test_invalid_yaml_and_duplicate_objective_names_are_reported() -> None:
    with pytest.raises(SpecError, match="not valid YAML"):
        parse_spec_text("version: [", "broken.yaml")
    assert error(spec(objectives=[objective(), objective()])).path == "objectives[1].name"


def test_burn_alert_windows_must_be_ordered_and_within_the_period() -> None:
    alerts = [{"severity": "page", "burn_rate": 2, "long_window": "5m", "short_window": "1h"}]
    assert error(spec(burn_alerts=alerts)).path == "burn_alerts[0].short_window"
    alerts = [{"severity": "page", "burn_rate": 2, "long_window": "40d", "short_window": "1h"}]
    assert error(spec(burn_alerts=alerts)).path == "burn_alerts[0].long_window"


def test_operational_alerts_can_be_tuned_or_disabled() -> None:
    s = parse_spec(spec(operational={"gpu_memory": False, "queue_saturation": {"threshold": "90%", "for": "2m"}}))
    assert s.operational.gpu_memory is None
    assert s.operational.queue_saturation is not None
    assert (s.operational.queue_saturation.threshold, s.operational.queue_saturation.for_s) == (Decimal("0.9"), 120)
    assert error(spec(operational={"queue_saturation": {"threshold": 1.5}})).path == (
        "operational.queue_saturation.threshold")
