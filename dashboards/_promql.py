"""PromQL for the dashboards: selectors over catalogue metrics with the dashboards' template variables.

Every metric name comes from the :mod:`llmslo.telemetry` catalogue (a :class:`~llmslo.telemetry.Metric`, its
``bucket``/``count`` series, or a :class:`~llmslo.telemetry.RecordingRule`); the only other series the
dashboards read are Prometheus's own (:data:`ALERTS`, :data:`UP`). Template variables appear as Grafana
writes them (``$job``, ``$__rate_interval``) and are substituted by Grafana before the query reaches
Prometheus.
"""

from __future__ import annotations

from collections.abc import Iterable

from llmslo.telemetry import Metric

Matcher = tuple[str, str, str]
"""(label, operator, value) with operator one of ``=``, ``!=``, ``=~``, ``!~``."""

ALERTS = "ALERTS"
"""Prometheus's series of pending and firing alerts (labels: ``alertname``, ``alertstate`` and the rule's)."""
UP = "up"
"""Prometheus's per-target scrape health series (1 when the last scrape succeeded)."""
PROMETHEUS_SERIES: tuple[str, ...] = (ALERTS, UP)
"""The series the dashboards read that Prometheus itself makes, not llmslo."""

RATE_INTERVAL = "$__rate_interval"
"""Grafana's range for ``rate()``: at least four scrape intervals, so a missed scrape leaves two samples."""
JOB = ("job", "=", "$job")
"""The ``job`` template variable (one Prometheus job: the service's scrape job)."""
MODEL = ("model", "=~", "$model")
"""The ``model`` template variable (several models, or All)."""


def quote(value: str) -> str:
    """A PromQL double-quoted string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def selector(name: str, matchers: Iterable[Matcher] = ()) -> str:
    """``name{a="x",b=~"y"}``, matchers sorted by label so the text is stable."""
    parts = [f"{label}{op}{quote(value)}" for label, op, value in sorted(matchers)]
    return f"{name}{{{','.join(parts)}}}" if parts else name


def filters(metric: Metric) -> list[Matcher]:
    """The template-variable matchers ``metric`` can take: ``job`` always (Prometheus adds it to every
    scraped series), ``model`` when the metric carries that label."""
    return [JOB, MODEL] if "model" in metric.labels else [JOB]


def series(metric: Metric, name: str | None = None, extra: Iterable[Matcher] = ()) -> str:
    """A selector of ``metric`` (or of its series ``name``: its ``_bucket``, ``_count``) with the dashboard's
    template variables and ``extra`` matchers."""
    return selector(name or metric.name, [*filters(metric), *extra])


def sum_rate(metric: Metric, by: Iterable[str] = (), name: str | None = None, extra: Iterable[Matcher] = ()) -> str:
    """``sum by (by) (rate(metric{...}[$__rate_interval]))``: events per second, summed over instances."""
    labels = ", ".join(by)
    grouping = f" by ({labels})" if labels else ""
    return f"sum{grouping} (rate({series(metric, name, extra)}[{RATE_INTERVAL}]))"


def quantile(metric: Metric, q: float) -> str:
    """The ``q`` quantile of a histogram over ``$__rate_interval``, from its buckets (a bucket estimate)."""
    return f"histogram_quantile({q:g}, {sum_rate(metric, ('le',), metric.bucket)})"
