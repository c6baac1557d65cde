"""The serving controls' metrics: each Telemetry reporting method, read back from the rendered /metrics text.

Every method is checked through the exposition a Prometheus would scrape (names, label values, bucket
counts, sums), including bad values: an unknown closed-set value is exposed as ``other``, an open label
beyond its bound as ``other``, a NaN/infinite/negative timing is dropped and counted by reason, a value of
the wrong type counts an internal error, and none of them raises into the caller.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from llmslo.telemetry import (
    BREAKER_STATES,
    DRAIN_CLOSE_REASONS,
    DRAIN_DURATION_BUCKETS_S,
    METRICS_BY_KEY,
    RATE_LIMIT_FAIL_MODES,
    REJECT_REASONS,
    RETRY_AFTER_BUCKETS_S,
    SHED_SIGNALS,
    LabelPolicy,
    Telemetry,
    render_metrics,
)


def _samples(tel: Telemetry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the plain-text exposition: (sample name, sorted labels) -> value."""
    text = render_metrics(tel.registry, "")[0].decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _series(tel: Telemetry, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of one series name, by sorted labels."""
    return {labels: v for (n, labels), v in _samples(tel).items() if n == name}


def _lbl(**labels: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def _errors(tel: Telemetry) -> float:
    return _series(tel, "llmslo_internal_errors_total")[()]


def _dropped(tel: Telemetry) -> dict[str, float]:
    return {dict(k)["reason"]: v for k, v in _series(tel, "llmslo_observations_dropped_total").items()}


def _buckets(tel: Telemetry, name: str, **labels: str) -> dict[str, float]:
    """Cumulative bucket counts of one histogram child, by ``le`` as rendered."""
    out: dict[str, float] = {}
    for key, v in _series(tel, f"{name}_bucket").items():
        d = dict(key)
        le = d.pop("le")
        if d == labels:
            out[le] = v
    return out


# ---- Retry-After --------------------------------------------------------------------------------------------


def test_retry_after_is_a_histogram_per_model_and_reject_reason_with_inclusive_bounds() -> None:
    tel = Telemetry()
    for seconds in (0.5, 3.0, 400.0):
        tel.observe_retry_after("llama", "rate_limited", seconds)
    tel.observe_retry_after("llama", "queue_full", 1)
    b = _buckets(tel, "llmslo_retry_after_seconds", model="llama", reject_reason="rate_limited")
    assert [float(le) for le in b if le != "+Inf"] == list(RETRY_AFTER_BUCKETS_S)
    assert b["0.5"] == 1  # a value equal to a bound counts in that bound's bucket
    assert b["2.0"] == 1 and b["5.0"] == 2 and b["300.0"] == 2 and b["+Inf"] == 3
    count = _series(tel, "llmslo_retry_after_seconds_count")
    total = _series(tel, "llmslo_retry_after_seconds_sum")
    assert count[_lbl(model="llama", reject_reason="rate_limited")] == 3
    assert total[_lbl(model="llama", reject_reason="rate_limited")] == pytest.approx(403.5)
    assert count[_lbl(model="llama", reject_reason="queue_full")] == 1


def test_retry_after_bounds_its_labels_unknown_reasons_and_models_become_other() -> None:
    tel = Telemetry(labels=LabelPolicy(max_values={"model": 1}))
    tel.observe_retry_after("llama", "no_such_reason", 1.0)
    tel.observe_retry_after("mistral", "draining", 1.0)
    count = _series(tel, "llmslo_retry_after_seconds_count")
    assert set(count) == {_lbl(model="llama", reject_reason="other"), _lbl(model="other", reject_reason="draining")}


@pytest.mark.parametrize(("value", "reason"), [(math.nan, "nan"), (math.inf, "infinite"), (-1.0, "negative")])
def test_a_bad_retry_after_is_dropped_and_counted_by_reason(value: float, reason: str) -> None:
    tel = Telemetry()
    tel.observe_retry_after("llama", "queue_full", value)
    assert _dropped(tel) == {reason: 1}
    assert _series(tel, "llmslo_retry_after_seconds_count") == {}
    assert _errors(tel) == 0


@pytest.mark.parametrize("value", ["3", None, True, [1.0]])
def test_a_retry_after_that_is_no_number_counts_an_internal_error_and_never_raises(value: object) -> None:
    tel = Telemetry()
    tel.observe_retry_after("llama", "queue_full", value)  # type: ignore[arg-type]
    assert _errors(tel) == 1
    assert _series(tel, "llmslo_retry_after_seconds_count") == {}


# ---- circuit breaker ------------------------------------------------------------------------------------------


def test_breaker_transitions_count_by_from_and_to_state() -> None:
    tel = Telemetry()
    tel.count_breaker_transition("upstream", "closed", "open")
    tel.count_breaker_transition("upstream", "open", "half_open")
    tel.count_breaker_transition("upstream", "half_open", "open")
    tel.count_breaker_transition("upstream", "open", "half_open")
    series = _series(tel, "llmslo_breaker_transitions_total")
    assert series == {
        _lbl(breaker="upstream", from_state="closed", to_state="open"): 1,
        _lbl(breaker="upstream", from_state="open", to_state="half_open"): 2,
        _lbl(breaker="upstream", from_state="half_open", to_state="open"): 1,
    }
    assert set(METRICS_BY_KEY["breaker_transitions"].allowed_values("to_state") or ()) == set(BREAKER_STATES)


def test_breaker_names_are_bounded_by_the_label_policy_and_unknown_states_are_other() -> None:
    tel = Telemetry(labels=LabelPolicy(max_values={"breaker": 1}))
    tel.count_breaker_transition("a", "closed", "tripped")
    tel.count_breaker_transition("b", "closed", "open")
    assert _series(tel, "llmslo_breaker_transitions_total") == {
        _lbl(breaker="a", from_state="closed", to_state="other"): 1,
        _lbl(breaker="other", from_state="closed", to_state="open"): 1,
    }


# ---- shedding and degradation ---------------------------------------------------------------------------------


def test_shed_requests_count_by_signal_with_unknown_signals_as_other() -> None:
    tel = Telemetry()
    for signal in (*SHED_SIGNALS, "queue", "moon_phase"):
        tel.count_shed("llama", signal, "batch")
    series = _series(tel, "llmslo_shed_requests_total")
    assert series == {
        _lbl(model="llama", signal="gpu", tenant_class="batch"): 1,
        _lbl(model="llama", signal="latency", tenant_class="batch"): 1,
        _lbl(model="llama", signal="queue", tenant_class="batch"): 2,
        _lbl(model="llama", signal="other", tenant_class="batch"): 1,
    }


def test_degradation_actions_are_bounded_by_the_label_policy() -> None:
    tel = Telemetry(labels=LabelPolicy(values={"action": ["cap_max_tokens"]}))
    tel.count_degraded("llama", "cap_max_tokens")
    tel.count_degraded("llama", "cap_max_tokens")
    tel.count_degraded("llama", "smaller_model")
    assert _series(tel, "llmslo_degraded_requests_total") == {
        _lbl(model="llama", action="cap_max_tokens"): 2,
        _lbl(model="llama", action="other"): 1,
    }


# ---- rate limiting --------------------------------------------------------------------------------------------


def test_rate_limit_store_errors_count_by_fail_mode() -> None:
    tel = Telemetry()
    for mode in (*RATE_LIMIT_FAIL_MODES, "open", "sideways"):
        tel.count_rate_limit_store_error(mode)
    assert _series(tel, "llmslo_rate_limit_store_errors_total") == {
        _lbl(fail_mode="open"): 2, _lbl(fail_mode="closed"): 1, _lbl(fail_mode="other"): 1}


# ---- drain ----------------------------------------------------------------------------------------------------


def test_drain_duration_is_an_unlabelled_histogram_with_the_catalogue_bounds() -> None:
    tel = Telemetry()
    for seconds in (0.2, 30.0, 45.0, 4000.0):
        tel.observe_drain(seconds)
    tel.observe_drain(math.nan)
    b = _buckets(tel, "llmslo_drain_duration_seconds")
    assert [float(le) for le in b if le != "+Inf"] == list(DRAIN_DURATION_BUCKETS_S)
    assert b["1.0"] == 1 and b["30.0"] == 2 and b["60.0"] == 3 and b["1800.0"] == 3 and b["+Inf"] == 4
    assert _series(tel, "llmslo_drain_duration_seconds_sum") == {(): pytest.approx(4075.2)}
    assert _dropped(tel) == {"nan": 1}


def test_drain_closed_streams_count_by_reason_narrowed_to_the_drain_reasons() -> None:
    tel = Telemetry()
    tel.count_drain_closed("idle", 3)
    tel.count_drain_closed("max_inflight")
    tel.count_drain_closed("budget_exhausted", 2)
    tel.count_drain_closed("queue_full")  # a reason of the shared label, but not a drain's
    assert _series(tel, "llmslo_drain_closed_streams_total") == {
        _lbl(reason="idle"): 3, _lbl(reason="max_inflight"): 1, _lbl(reason="budget_exhausted"): 2,
        _lbl(reason="other"): 1}
    assert METRICS_BY_KEY["drain_closed_streams"].allowed_values("reason") == DRAIN_CLOSE_REASONS


@pytest.mark.parametrize("n", [-1, 1.5, True, "2", None])
def test_a_bad_drain_count_is_dropped_as_invalid_count(n: object) -> None:
    tel = Telemetry()
    tel.count_drain_closed("idle", n)  # type: ignore[arg-type]
    assert _dropped(tel) == {"invalid_count": 1}
    assert _series(tel, "llmslo_drain_closed_streams_total") == {}


# ---- every method: guarded ----------------------------------------------------------------------------------

CALLS: dict[str, Callable[[Telemetry], None]] = {
    "observe_retry_after": lambda t: t.observe_retry_after("m", "queue_full", 1.0),
    "count_breaker_transition": lambda t: t.count_breaker_transition("b", "closed", "open"),
    "count_shed": lambda t: t.count_shed("m", "queue", "batch"),
    "count_degraded": lambda t: t.count_degraded("m", "cap_max_tokens"),
    "count_rate_limit_store_error": lambda t: t.count_rate_limit_store_error("open"),
    "observe_drain": lambda t: t.observe_drain(3.0),
    "count_drain_closed": lambda t: t.count_drain_closed("idle", 2),
}


@pytest.mark.parametrize("method", sorted(CALLS))
def test_a_failure_inside_the_metrics_is_counted_and_never_reaches_the_caller(
    method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tel = Telemetry()
    count = tel.metrics.count

    def broken(key: str, *args: object, **kwargs: object) -> None:
        if key == "internal_errors":  # the guard still counts the failure
            count(key)
            return
        raise RuntimeError("instrument broken")

    monkeypatch.setattr(tel.metrics, "count", broken)
    monkeypatch.setattr(tel.metrics, "observe", broken)
    CALLS[method](tel)
    assert tel.guard.error_count == 1
    assert _errors(tel) == 1


CALLS_KEYS = ("retry_after", "breaker_transitions", "shed_requests", "degraded_requests",
              "rate_limit_store_errors", "drain_duration", "drain_closed_streams")
"""The catalogue keys of the metrics the methods above report on."""

label_text = st.one_of(st.text(max_size=12), st.sampled_from(
    [*BREAKER_STATES, *SHED_SIGNALS, *RATE_LIMIT_FAIL_MODES, *DRAIN_CLOSE_REASONS, *REJECT_REASONS]))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(CALLS)), label_text, label_text, label_text,
                          st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 10**6))),
                max_size=40))
def test_any_arguments_never_raise_and_keep_the_series_within_the_declared_bounds(
    calls: list[tuple[str, str, str, str, float]]
) -> None:
    policy = LabelPolicy(max_values={"model": 2, "breaker": 2, "action": 2, "tenant_class": 2})
    tel = Telemetry(labels=policy)
    for method, a, b, c, x in calls:
        if method == "observe_retry_after":
            tel.observe_retry_after(a, b, x)
        elif method == "count_breaker_transition":
            tel.count_breaker_transition(a, b, c)
        elif method == "count_shed":
            tel.count_shed(a, b, c)
        elif method == "count_degraded":
            tel.count_degraded(a, b)
        elif method == "count_rate_limit_store_error":
            tel.count_rate_limit_store_error(a)
        elif method == "observe_drain":
            tel.observe_drain(x)
        else:
            tel.count_drain_closed(a, int(x) if isinstance(x, int) else 1)
    assert tel.guard.error_count == 0
    for key in CALLS_KEYS:
        metric = METRICS_BY_KEY[key]
        bound = 1
        for label in metric.labels:
            bound *= policy.bound(label, metric.allowed_values(label))
        children = {labels for (name, labels), _ in _samples(tel).items()
                    if name == (metric.count if metric.type == "histogram" else metric.name)}
        assert len(children) <= bound, metric.name
