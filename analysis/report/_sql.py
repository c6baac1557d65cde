"""The report's queries: SQL over the summary table that returns the raw figures of each group.

The contract with :mod:`llmslo.analysis.report._report` is :class:`RawReport`: for every group, one row of
the main aggregate (counts, goodput, exact quantiles, bucket counts, token sums, success-only TTFT), and
where they exist the group's ITL distribution and censoring-aware (Kaplan–Meier) TTFT. Column names of
those rows (``<interval>__count``, ``__mean``, ``__q``, ``__max``, ``__le<i>``; ``so__n``, ``so__q``;
``n``, ``n_events``, ``n_censored``, ``p50``…, ``max_censored_t``) are this module's vocabulary.
Quantiles are exact (``quantile_cont``: linear interpolation between order statistics, numpy's default).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb

from llmslo.analysis.report._policy import GoodputPolicy
from llmslo.analysis.report._survival import km_quantiles
from llmslo.analysis.store import SUMMARY_TABLE
from llmslo.telemetry import DEFAULT_BUCKETS_S, FINISH_REASONS, TPOT_SQL

__all__ = [
    "finite",
    "LATENCY_INTERVALS",
    "QUANTILES",
    "SURVIVOR_QUANTILES",
    "TOKEN_COUNTS",
    "WINDOW_KEY",
    "RawReport",
    "bucket_bounds",
    "fetch_raw",
]

WINDOW_KEY = "window_start_unix_s"
LATENCY_INTERVALS: tuple[str, ...] = ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s", "client_ttft_s")
"""Intervals reported as distributions (``tpot_s`` derived; ``itl_s`` from the per-request gap lists)."""
QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.95, 0.99)
SURVIVOR_QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99)
TOKEN_COUNTS: tuple[str, ...] = ("prompt_tokens", "proposed_tokens", "generated_tokens", "sent_tokens")

ProgressCallback = Callable[[str], None]
"""``on_progress(stage)``, called as each query starts."""
Key = tuple[Any, ...]


@dataclass
class RawReport:
    """What the queries return: the span of the data and the raw rows of every group, keyed by group.

    ``main`` holds one row per group in group-key order; ``itl`` and ``km`` are keyed by the tuple of the
    group's key values (a group absent from ``km`` has no admitted request).
    """

    keys: tuple[str, ...]
    n_total: int
    span_from_unix_s: float | None
    span_to_unix_s: float | None
    main: list[dict[str, Any]]
    itl: dict[Key, dict[str, Any]] = field(default_factory=dict)
    km: dict[Key, dict[str, Any]] = field(default_factory=dict)

    def key_of(self, row: dict[str, Any]) -> Key:
        return tuple(row[k] for k in self.keys)


def _lit(x: float) -> str:
    return f"CAST('{x!r}' AS DOUBLE)"


def bucket_bounds(interval: str, policy: GoodputPolicy) -> tuple[float, ...]:
    """Default bounds of an interval plus the policy's threshold on it, sorted, seconds."""
    bounds = set(DEFAULT_BUCKETS_S[interval])
    threshold = {"ttft_s": policy.ttft_s, "tpot_s": policy.tpot_s, "e2e_s": policy.e2e_s}.get(interval)
    if threshold is not None:
        bounds.add(threshold)
    return tuple(sorted(bounds))


def _base_sql(policy: GoodputPolicy) -> str:
    w = policy.window_s
    if w is None:
        window = "FALSE AS __in_flight"
    else:
        start = f"floor(arrival_unix_s / {_lit(w)}) * {_lit(w)}"
        window = f"{start} AS {WINDOW_KEY}, arrival_unix_s + e2e_s > {start} + {_lit(w)} AS __in_flight"
    return (
        f"SELECT *, {TPOT_SQL} AS tpot_s_derived, {policy.good_sql()} AS __good, {window} "
        f"FROM {SUMMARY_TABLE}"
    )


def _dist_aggregates(expr: str, alias: str, bounds: Sequence[float], where: str | None = None) -> list[str]:
    # count_if rather than count(*) FILTER: the same counts, about 3x faster in DuckDB 2.0 (bench_report.py)
    filt = f" FILTER (WHERE {where})" if where else ""
    qs = ", ".join(repr(q) for q in QUANTILES)
    parts = [
        f"count({expr}){filt} AS \"{alias}__count\"",
        f"avg({expr}){filt} AS \"{alias}__mean\"",
        f"quantile_cont({expr}, [{qs}]){filt} AS \"{alias}__q\"",
        f"max({expr}){filt} AS \"{alias}__max\"",
    ]
    for i, b in enumerate(bounds):
        cond = f"{expr} <= {_lit(b)}" + (f" AND {where}" if where else "")
        parts.append(f"coalesce(count_if({cond}), 0) AS \"{alias}__le{i}\"")
    return parts


def finite(value: Any) -> float | None:
    """``value`` as a float, or None when it is null, NaN or infinite."""
    if value is None:
        return None
    x = float(value)
    return x if math.isfinite(x) else None


def _rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    rel = con.sql(sql)
    names = list(rel.columns)
    return [dict(zip(names, r, strict=True)) for r in rel.fetchall()]


def fetch_raw(
    con: duckdb.DuckDBPyConnection,
    policy: GoodputPolicy,
    keys: tuple[str, ...],
    *,
    on_progress: ProgressCallback | None = None,
) -> RawReport:
    """Run the report's queries over the store open on ``con``, grouped by ``keys`` (columns, and
    :data:`WINDOW_KEY` when the policy has a window)."""
    base = _base_sql(policy)
    group_by = f"GROUP BY {', '.join(keys)} ORDER BY {', '.join(keys)}" if keys else ""
    key_select = [*keys]

    span_row = con.sql(
        f"SELECT count(*), min(arrival_unix_s), max(arrival_unix_s + e2e_s) FROM {SUMMARY_TABLE}"
    ).fetchall()[0]
    n_total = int(span_row[0])

    if on_progress:
        on_progress("aggregating")
    success = ", ".join(f"'{r}'" for r in sorted(policy.success))
    settled = "NOT __in_flight"
    aggs = [
        "count(*) AS attempted",
        "coalesce(count_if(__in_flight), 0) AS in_flight",
        f"coalesce(count_if(__good AND {settled}), 0) AS good",
        f"coalesce(sum(generated_tokens) FILTER (WHERE __good AND {settled}), 0) AS good_generated_tokens",
        f"coalesce(count_if(__good AND {settled} AND generated_tokens <= 1), 0) AS good_one_token",
        "coalesce(count_if(generated_tokens = 1), 0) AS one_token_replies",
    ]
    aggs += [
        f"coalesce(count_if({settled} AND finish_reason = '{r}'), 0) AS \"n_{r}\"" for r in FINISH_REASONS
    ]
    aggs += [f"coalesce(sum({c}), 0) AS \"sum_{c}\"" for c in TOKEN_COUNTS]
    aggs.append("coalesce(sum(generated_tokens - sent_tokens), 0) AS waste")
    interval_expr = {"ttft_s": "ttft_s", "tpot_s": "tpot_s_derived", "e2e_s": "e2e_s",
                     "queue_s": "queue_s", "client_ttft_s": "client_ttft_s"}
    bounds = {name: bucket_bounds(name, policy) for name in LATENCY_INTERVALS}
    for name, expr in interval_expr.items():
        aggs += _dist_aggregates(expr, name, bounds[name])
    sq = ", ".join(repr(q) for q in SURVIVOR_QUANTILES)
    aggs.append(f"count(ttft_s) FILTER (WHERE finish_reason IN ({success})) AS so__n")
    aggs.append(f"quantile_cont(ttft_s, [{sq}]) FILTER (WHERE finish_reason IN ({success})) AS so__q")
    main = _rows(con, f"SELECT {', '.join([*key_select, *aggs])} FROM ({base}) {group_by}")

    itl_rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    has_itl = con.sql(f"SELECT count(itl_s) FROM {SUMMARY_TABLE}").fetchall()[0][0] > 0
    if has_itl:
        if on_progress:
            on_progress("inter-token latency")
        inner = f"SELECT {', '.join([*keys, 'unnest(itl_s) AS g'])} FROM ({base}) WHERE itl_s IS NOT NULL"
        for r in _rows(con, f"SELECT {', '.join([*keys, *_dist_aggregates('g', 'itl_s', bounds['itl_s'])])} "
                            f"FROM ({inner}) {group_by}"):
            itl_rows[tuple(r[k] for k in keys)] = r

    if on_progress:
        on_progress("censoring-aware TTFT")
    km_src = (
        f"SELECT {', '.join([*keys, 'coalesce(ttft_s, e2e_s) AS t', 'ttft_s IS NOT NULL AS event'])} "
        f"FROM ({base}) WHERE finish_reason <> 'rejected'"
    )
    km_frame = km_quantiles(con, km_src, keys, SURVIVOR_QUANTILES)
    km = {tuple(r[k] for k in keys): r for r in km_frame.to_dicts()}
    return RawReport(keys, n_total, finite(span_row[1]), finite(span_row[2]), main, itl_rows, km)
