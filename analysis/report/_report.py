"""The report: latency distributions, goodput, survivor bias and tokens per group, from the store.

All figures follow definitions.md. One aggregate pass computes counts, goodput, exact quantiles
(linear interpolation, numpy's default), bucket counts and token sums; ITL gaps (a list per request)
and the censoring-aware TTFT (Kaplan–Meier) take one pass each. The result is a JSON-ready dict.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb

from llmslo.analysis.report._policy import GoodputPolicy
from llmslo.analysis.report._survival import km_quantiles, quantile_label
from llmslo.analysis.store import META_TABLE, SUMMARY_TABLE
from llmslo.telemetry import DEFAULT_BUCKETS_S, FINISH_REASONS, SCHEMA_VERSION, TPOT_SQL, ConfigurationError

GROUP_COLUMNS: tuple[str, ...] = ("model", "version", "tenant_class", "finish_reason")
"""Columns a report may be grouped by (plus time windows)."""
WINDOW_KEY = "window_start_unix_s"
LATENCY_INTERVALS: tuple[str, ...] = ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s", "client_ttft_s")
"""Intervals reported as distributions (``tpot_s`` derived; ``itl_s`` from the per-request gap lists)."""
QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.95, 0.99)
SURVIVOR_QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99)
SURVIVOR_TOLERANCE = 0.10
"""A success-only TTFT quantile is optimistic when the censoring-aware one exceeds it by more than this
fraction (docs/conventions.md, "Survivor bias")."""
SURVIVOR_MIN_REQUESTS = 20
"""Below this many admitted requests in a group the survivor-bias verdict is ``insufficient_data``."""
SHED_RISE = 0.05
"""Absolute rise of the shed/cancel fraction between consecutive windows that, with an improving
success-only TTFT p99, flags survivor bias."""
SHED_REASONS: tuple[str, ...] = ("rejected", "client_cancel", "deadline", "server_draining")
SHED_NOTABLE = 0.10
"""A shed/cancel fraction at or above this makes success-only latency unrepresentative on its own
(docs/conventions.md, "Survivor bias")."""
TOKEN_COUNTS: tuple[str, ...] = ("prompt_tokens", "proposed_tokens", "generated_tokens", "sent_tokens")

DEFINITIONS: dict[str, str] = {
    "ttft_s": "first token committed - arrival (server clock, includes queueing and prefill)",
    "tpot_s": "(last_token - first_token) / (generated_tokens - 1); undefined for <= 1 token",
    "itl_s": "gaps between token commits, token-weighted (a k-token commit gives k gaps of gap/k)",
    "e2e_s": "terminal state - arrival",
    "queue_s": "scheduled - arrival",
    "client_ttft_s": "first content chunk received - request sent (client clock)",
    "quantiles": "exact, linear interpolation between order statistics (numpy's default)",
    "latency_population": "every request for which the interval is defined, whatever its finish reason",
    "censoring_aware_ttft": "Kaplan-Meier over admitted requests; one that ended without a first token "
    "after e2e_s seconds is censored at e2e_s",
    "backpressure_waste_tokens": "generated_tokens - sent_tokens at the terminal state",
}

ProgressCallback = Callable[[str], None]


@dataclass(frozen=True)
class ReportSpec:
    """What to report: the policy (with its window), the grouping, the quantiles."""

    policy: GoodputPolicy
    by: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for key in self.by:
            if key not in GROUP_COLUMNS:
                raise ConfigurationError(
                    f"report --by: unknown column {key!r}; choose from {', '.join(GROUP_COLUMNS)}"
                )
        if len(set(self.by)) != len(self.by):
            raise ConfigurationError(f"report --by: a column is repeated in {','.join(self.by)}")

    @property
    def keys(self) -> tuple[str, ...]:
        return (*self.by, WINDOW_KEY) if self.policy.window_s is not None else self.by


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


def _dist_from_row(row: dict[str, Any], alias: str, bounds: Sequence[float]) -> dict[str, Any]:
    count = int(row[f"{alias}__count"] or 0)
    qvals = row[f"{alias}__q"] or [None] * len(QUANTILES)
    out: dict[str, Any] = {"count": count, "mean": _f(row[f"{alias}__mean"])}
    for q, v in zip(QUANTILES, qvals, strict=True):
        out[quantile_label(q)] = _f(v)
    out["max"] = _f(row[f"{alias}__max"])
    out["buckets"] = [{"le": b, "count": int(row[f"{alias}__le{i}"] or 0)} for i, b in enumerate(bounds)]
    out["buckets"].append({"le": "+Inf", "count": count})
    return out


def _f(value: Any) -> float | None:
    if value is None:
        return None
    x = float(value)
    return x if math.isfinite(x) else None


def _key_of(row: dict[str, Any], keys: Sequence[str]) -> tuple[Any, ...]:
    return tuple(row[k] for k in keys)


def _rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    rel = con.sql(sql)
    names = list(rel.columns)
    return [dict(zip(names, r, strict=True)) for r in rel.fetchall()]


def build_report(
    con: duckdb.DuckDBPyConnection,
    spec: ReportSpec,
    *,
    on_progress: ProgressCallback | None = None,
) -> dict[str, Any]:
    """Compute the report over the store open on ``con``; returns the JSON-ready result.

    Shape: ``policy``, ``rate_basis`` (window or data span, seconds), ``definitions``, ``totals`` and
    ``groups`` (each: ``keys``, ``attempted``, ``good``, ``in_flight``, ``goodput_fraction``,
    ``request_goodput_per_s``, ``token_goodput_per_s``, ``latency``, ``tokens``, ``survivor_bias``).
    """
    policy = spec.policy
    keys = spec.keys
    base = _base_sql(policy)
    group_by = f"GROUP BY {', '.join(keys)} ORDER BY {', '.join(keys)}" if keys else ""
    key_select = [*keys]

    span_row = con.sql(
        f"SELECT count(*), min(arrival_unix_s), max(arrival_unix_s + e2e_s) FROM {SUMMARY_TABLE}"
    ).fetchall()[0]
    n_total = int(span_row[0])
    if policy.window_s is not None:
        rate_basis: dict[str, Any] = {"kind": "window", "seconds": policy.window_s}
        seconds: float | None = policy.window_s
    else:
        span = float(span_row[2] - span_row[1]) if n_total else 0.0
        seconds = span if span > 0 else None
        rate_basis = {
            "kind": "span",
            "seconds": seconds,
            "from_unix_s": _f(span_row[1]),
            "to_unix_s": _f(span_row[2]),
            "note": "no --window: per-second rates divide by the span from the first arrival to the last finish",
        }

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
            itl_rows[_key_of(r, keys)] = r

    if on_progress:
        on_progress("censoring-aware TTFT")
    km_src = (
        f"SELECT {', '.join([*keys, 'coalesce(ttft_s, e2e_s) AS t', 'ttft_s IS NOT NULL AS event'])} "
        f"FROM ({base}) WHERE finish_reason <> 'rejected'"
    )
    km_frame = km_quantiles(con, km_src, keys, SURVIVOR_QUANTILES)
    km = {_key_of(r, keys): r for r in km_frame.to_dicts()}

    groups = [_group(row, keys, itl_rows.get(_key_of(row, keys)), km.get(_key_of(row, keys)), bounds,
                     seconds, policy) for row in main]
    _flag_shed_trend(groups, spec)
    totals = {
        "requests": n_total,
        "attempted": sum(g["attempted"] for g in groups),
        "good": sum(g["good"] for g in groups),
        "in_flight": sum(g["in_flight"] for g in groups),
    }
    settled_total = totals["attempted"] - totals["in_flight"]
    totals["goodput_fraction"] = totals["good"] / settled_total if settled_total else None
    return {
        "schema_version": SCHEMA_VERSION,
        "caveats": _import_caveats(con),
        "policy": policy.to_dict(),
        "group_by": list(keys),
        "rate_basis": rate_basis,
        "definitions": DEFINITIONS,
        "totals": totals,
        "groups": groups,
    }


def _import_caveats(con: duckdb.DuckDBPyConnection) -> list[str]:
    """What imported rows cannot support: recorded by ``llmslo import`` in the store's metadata."""
    rows = con.sql(f"SELECT key, value FROM {META_TABLE} WHERE key LIKE 'import:%' ORDER BY key").fetchall()
    out: list[str] = []
    no_arrivals: list[str] = []
    tools: set[str] = set()
    for key, value in rows:
        try:
            meta = json.loads(value)
        except json.JSONDecodeError:
            continue
        tools.add(str(meta.get("tool", "?")))
        if meta.get("arrivals_available") is False:
            no_arrivals.append(str(key).removeprefix("import:"))
    if tools:
        out.append(
            f"rows imported from {', '.join(sorted(tools))} hold the tool's client-side times in ttft_s/e2e_s "
            "(it recorded no server timestamps)"
        )
    if no_arrivals:
        shown = ", ".join(no_arrivals[:5]) + (f" and {len(no_arrivals) - 5} more" if len(no_arrivals) > 5 else "")
        out.append(
            f"{len(no_arrivals)} imported file(s) carry no arrival times ({shown}): windows, per-second rates "
            "and in-flight counts are not meaningful for their rows"
        )
    return out


def _group(
    row: dict[str, Any],
    keys: Sequence[str],
    itl: dict[str, Any] | None,
    km: dict[str, Any] | None,
    bounds: dict[str, tuple[float, ...]],
    seconds: float | None,
    policy: GoodputPolicy,
) -> dict[str, Any]:
    attempted = int(row["attempted"])
    in_flight = int(row["in_flight"])
    good = int(row["good"])
    settled = attempted - in_flight
    latency: dict[str, Any] = {}
    for name in LATENCY_INTERVALS:
        if name == "itl_s":
            latency[name] = _dist_from_row(itl, name, bounds[name]) if itl else _empty_dist(bounds[name])
        else:
            latency[name] = _dist_from_row(row, name, bounds[name])
    by_reason = {r: int(row[f"n_{r}"]) for r in FINISH_REASONS}
    tokens: dict[str, Any] = {c: int(row[f"sum_{c}"]) for c in TOKEN_COUNTS}
    tokens["backpressure_waste_tokens"] = int(row["waste"])
    for c in TOKEN_COUNTS:
        tokens[f"{c}_per_s"] = tokens[c] / seconds if seconds else None
    survivor = _survivor(row, km, by_reason, attempted, in_flight)
    return {
        "keys": {k: (_f(row[k]) if k == WINDOW_KEY else row[k]) for k in keys},
        "attempted": attempted,
        "good": good,
        "in_flight": in_flight,
        "goodput_fraction": good / settled if settled else None,
        "request_goodput_per_s": good / seconds if seconds else None,
        "token_goodput_per_s": int(row["good_generated_tokens"]) / seconds if seconds else None,
        "one_token_replies": int(row["one_token_replies"]),
        "good_one_token_replies": int(row["good_one_token"]),
        "finish_reasons": by_reason,
        "latency": latency,
        "tokens": tokens,
        "survivor_bias": survivor,
    }


def _empty_dist(bounds: Sequence[float]) -> dict[str, Any]:
    out: dict[str, Any] = {"count": 0, "mean": None}
    out.update({quantile_label(q): None for q in QUANTILES})
    out["max"] = None
    out["buckets"] = [{"le": b, "count": 0} for b in bounds] + [{"le": "+Inf", "count": 0}]
    return out


def _survivor(
    row: dict[str, Any],
    km: dict[str, Any] | None,
    by_reason: dict[str, int],
    attempted: int,
    in_flight: int,
) -> dict[str, Any]:
    rejected = by_reason["rejected"]
    admitted = attempted - rejected
    # attempted comes from count(*), each finish reason from its own filter: a row with a finish reason
    # outside the closed set (a store written by something else) would make them disagree.
    unbalanced: list[str] = []
    ended = sum(by_reason.values())
    if ended + in_flight != attempted:
        unbalanced.append(
            f"attempted ({attempted}) != requests with a known finish reason ({ended}) + in flight ({in_flight})"
        )
    settled = attempted - in_flight
    shed = sum(by_reason[r] for r in SHED_REASONS)
    so_q = row["so__q"] or [None] * len(SURVIVOR_QUANTILES)
    success_only: dict[str, Any] = {"count": int(row["so__n"] or 0)}
    success_only.update({quantile_label(q): _f(v) for q, v in zip(SURVIVOR_QUANTILES, so_q, strict=True)})
    aware: dict[str, Any] = {"count": 0, "events": 0, "censored": 0}
    if km is not None:
        aware = {"count": int(km["n"]), "events": int(km["n_events"]), "censored": int(km["n_censored"])}
        aware.update({quantile_label(q): _f(km[quantile_label(q)]) for q in SURVIVOR_QUANTILES})
        aware["at_least_s"] = _f(km["max_censored_t"])
    reasons: list[str] = []
    if aware["count"] < SURVIVOR_MIN_REQUESTS or success_only["count"] == 0:
        verdict = "insufficient_data"
        reasons.append(
            f"{aware['count']} admitted request(s), {success_only['count']} successful with a first token: "
            f"a verdict needs at least {SURVIVOR_MIN_REQUESTS} admitted and one successful"
        )
    else:
        verdict = "consistent"
        for q in SURVIVOR_QUANTILES[1:]:
            label = quantile_label(q)
            so, ca = success_only[label], aware.get(label)
            if so is None:
                continue
            if ca is None:
                verdict = "optimistic"
                reasons.append(
                    f"TTFT {label}: success-only {so:.3g}s, but too many requests ended without a first "
                    f"token to bound it: at least {aware['at_least_s']:.3g}s"
                )
            elif ca > so * (1 + SURVIVOR_TOLERANCE):
                verdict = "optimistic"
                reasons.append(
                    f"TTFT {label}: success-only {so:.3g}s vs censoring-aware {ca:.3g}s "
                    f"(+{(ca / so - 1) * 100:.0f}%, tolerance {SURVIVOR_TOLERANCE * 100:.0f}%)"
                )
    shed_fraction = shed / settled if settled else None
    if verdict != "insufficient_data" and shed_fraction is not None and shed_fraction >= SHED_NOTABLE:
        verdict = "optimistic"
        reasons.append(
            f"{shed_fraction:.0%} of settled requests were rejected, cancelled, timed out or drained "
            f"(at or above {SHED_NOTABLE:.0%}): success-only latency describes only the rest"
        )
    return {
        "accounting": {
            "attempted": attempted,
            "rejected": rejected,
            "admitted": admitted,
            "in_flight": in_flight,
            **{r: v for r, v in by_reason.items() if r != "rejected"},
            "balanced": not unbalanced,
            "unbalanced": unbalanced,
        },
        "shed_cancel_fraction": shed_fraction,
        "ttft_success_only": success_only,
        "ttft_censoring_aware": aware,
        "verdict": verdict,
        "reasons": reasons,
    }


def _flag_shed_trend(groups: list[dict[str, Any]], spec: ReportSpec) -> None:
    """With windows: flag a window whose shed/cancel fraction rose while success-only TTFT p99 fell."""
    if spec.policy.window_s is None:
        return
    series: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for g in groups:
        series.setdefault(tuple(g["keys"][k] for k in spec.by), []).append(g)
    label = quantile_label(SURVIVOR_QUANTILES[-1])
    for items in series.values():
        items.sort(key=lambda g: g["keys"][WINDOW_KEY])
        for prev, cur in itertools.pairwise(items):
            sp, sc = prev["survivor_bias"], cur["survivor_bias"]
            fp, fc = sp["shed_cancel_fraction"], sc["shed_cancel_fraction"]
            tp, tc = sp["ttft_success_only"][label], sc["ttft_success_only"][label]
            if None in (fp, fc, tp, tc) or sc["verdict"] == "insufficient_data":
                continue
            if fc - fp >= SHED_RISE and tc < tp:
                sc["verdict"] = "optimistic"
                sc["reasons"].append(
                    f"shed/cancel fraction rose {fp:.1%} -> {fc:.1%} while success-only TTFT {label} "
                    f"improved {tp:.3g}s -> {tc:.3g}s"
                )
