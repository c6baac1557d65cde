"""The report: latency distributions, goodput, survivor bias and tokens per group, from the store.

All figures follow definitions.md. :mod:`~llmslo.analysis.report._sql` runs the queries; this module
judges each group (goodput rates, the survivor-bias verdict, the shed trend across windows) and returns
the typed :class:`~llmslo.analysis.report.Report`.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from llmslo.analysis.databases import Database, as_database
from llmslo.analysis.report._model import (
    Accounting,
    Bucket,
    CensoringAwareTtft,
    Clock,
    Distribution,
    Group,
    GroupRateBasis,
    QuantileComparison,
    RateBasis,
    Report,
    SuccessOnlyTtft,
    SurvivorBias,
    Tokens,
    Totals,
    Verdict,
)
from llmslo.analysis.report._policy import GoodputPolicy
from llmslo.analysis.report._provenance import (
    ARRIVAL_MAX_UNIX_S,
    ARRIVAL_MIN_UNIX_S,
    ArrivallessImport,
    arrivalless_imports,
    check_window_count,
    stored_arrival_range,
)
from llmslo.analysis.report._sql import (
    DEFAULT_QUANTILE_METHOD,
    LATENCY_INTERVALS,
    QUANTILE_METHODS,
    QUANTILES,
    SURVIVOR_QUANTILES,
    TOKEN_COUNTS,
    WINDOW_KEY,
    ProgressCallback,
    QuantileMethod,
    RawReport,
    bucket_bounds,
    fetch_raw,
    finite,
)
from llmslo.analysis.report._survival import quantile_label
from llmslo.analysis.store import IMPORTS_TABLE, META_TABLE
from llmslo.telemetry import FINISH_REASONS, SCHEMA_VERSION, ConfigurationError, format_duration

GROUP_COLUMNS: tuple[str, ...] = ("model", "version", "tenant_class", "finish_reason", "backend")
"""Columns a report may be grouped by (plus time windows)."""
SURVIVOR_TOLERANCE = 0.10
"""A success-only TTFT quantile is optimistic when the censoring-aware one exceeds it by more than this
fraction (docs/conventions.md, "Survivor bias")."""
SURVIVOR_MIN_REQUESTS = 20
"""Below this many admitted requests in a group the survivor-bias verdict is ``insufficient_data``."""
SURVIVOR_MIN_BEYOND = 5
"""A TTFT quantile ``q`` is compared only when the group's admitted requests ``n`` put at least this many beyond
it, ``n (1 - q) >= 5``: p90 from 50 admitted requests, p99 from 500 (docs/conventions.md, "Survivor bias")."""
SURVIVOR_Z = 2.576
"""The one-sided 99.5 % normal quantile: the band (in standard errors) a difference must exceed to be called
bias rather than sampling (Greenwood's variance for a quantile's share; the pooled binomial one for a rise of
the shed/cancel fraction)."""
SHED_RISE = 0.05
"""Absolute rise of the shed/cancel fraction between consecutive windows that, with an improving
success-only TTFT p99, flags survivor bias (when the rise is also beyond :data:`SURVIVOR_Z` standard errors)."""
SHED_REASONS: tuple[str, ...] = ("rejected", "client_cancel", "deadline", "server_draining")
SHED_NOTABLE = 0.10
"""A shed/cancel fraction at or above this makes success-only latency unrepresentative on its own
(docs/conventions.md, "Survivor bias")."""

DEFINITIONS: dict[str, str] = {
    "clock": "the server's: rows measured by the server (a queue_s, or a ttft_s of its own apart from "
             "client_ttft_s), as llmslo serve and the telemetry write them",
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
"""The definitions of a report over rows measured by the server (:func:`definitions_for` words them for the
clock the rows were measured on)."""
QUANTILE_DEFINITIONS: dict[QuantileMethod, str] = {
    "linear": DEFINITIONS["quantiles"],
    "nearest-rank": "NEAREST RANK (--quantiles nearest-rank, not the default): exact, the smallest value whose rank "
                    "is at least ceil(q n) among the group's n values, always an observed value (numpy's "
                    "inverted_cdf), as guidellm reports its percentiles",
}
"""The ``quantiles`` definition of a report by its quantile method (docs/definitions.md, "Quantiles")."""
CLIENT_DEFINITIONS: dict[str, str] = {
    "ttft_s": "first content chunk received - request sent (client clock: includes the network and the server's "
              "queueing and prefill)",
    "tpot_s": "(last content chunk - first content chunk) / (generated_tokens - 1), received; undefined for "
              "<= 1 token",
    "itl_s": "gaps between content chunks received, token-weighted (a chunk of k tokens gives k gaps of gap/k)",
    "e2e_s": "end of the attempt (last byte received, or the client's hang-up) - request sent (client clock)",
    "queue_s": "scheduled - arrival, a server's figure: none on these rows",
}
"""What the server-clock definitions become over rows measured by a client (``llmslo load``'s, imported
benchmark files')."""


def definitions_for(clock: Clock, quantiles: QuantileMethod = DEFAULT_QUANTILE_METHOD) -> dict[str, str]:
    """The report's definitions worded for ``clock``: the server's (:data:`DEFINITIONS`), a client's
    (:data:`CLIENT_DEFINITIONS` in their place), both for mixed rows, and how the clock was told; ``quantiles``
    the quantile method (:data:`QUANTILE_DEFINITIONS`)."""
    out = dict(DEFINITIONS)
    out["quantiles"] = QUANTILE_DEFINITIONS[quantiles]
    rest = clock.rows - clock.client_rows - clock.server_rows
    untold = f"; {rest:,} carry no time that tells (e.g. refusals)" if rest else ""
    if clock.kind == "client":
        out.update(CLIENT_DEFINITIONS)
        out["clock"] = (f"the client's: {clock.client_rows:,} of {clock.rows:,} rows were measured by a client "
                        f"(ttft_s repeated in client_ttft_s, or e2e_s in client_e2e_s, and no queue_s), as llmslo "
                        f"load and the benchmark importers write them{untold}")
    elif clock.kind == "mixed":
        out["clock"] = (f"MIXED: {clock.client_rows:,} rows were measured by a client (their times repeated in "
                        f"the client_ columns, no queue_s) and {clock.server_rows:,} by the server{untold}; their "
                        "intervals are on different clocks, so figures that pool them mean neither: keep them apart "
                        "(a store each, or --by version)")
        for name, text in CLIENT_DEFINITIONS.items():
            out[name] = f"server rows: {out[name]}; client rows: {text}"
    elif clock.kind == "server":
        out["clock"] = (f"the server's: {clock.server_rows:,} of {clock.rows:,} rows were measured by the server "
                        f"(a queue_s, or a ttft_s apart from client_ttft_s){untold}")
    else:
        out["clock"] = (f"not told by the rows: none of the {clock.rows:,} has a queue_s, a ttft_s or a client "
                        "figure; the definitions are the server's")
    return out

__all__ = [
    "CLIENT_DEFINITIONS",
    "DEFINITIONS",
    "GROUP_COLUMNS",
    "LATENCY_INTERVALS",
    "QUANTILES",
    "QUANTILE_DEFINITIONS",
    "WINDOW_KEY",
    "ReportSpec",
    "build_report",
    "definitions_for",
]


@dataclass(frozen=True)
class ReportSpec:
    """What to report: the policy (with its window), the grouping, and the horizon ``until_unix_s``
    (Unix seconds): only requests that arrived by then are reported, and those that finished after it
    are in flight. None (the default) is when the data was taken: every stored request has reached its
    terminal state, none is in flight. ``quantiles``: the definition of every quantile the report computes
    from values, ``linear`` (the default) or ``nearest-rank`` (docs/definitions.md, "Quantiles")."""

    policy: GoodputPolicy
    by: tuple[str, ...] = ()
    until_unix_s: float | None = None
    quantiles: QuantileMethod = DEFAULT_QUANTILE_METHOD

    def __post_init__(self) -> None:
        if self.quantiles not in QUANTILE_METHODS:
            raise ConfigurationError(
                f"report --quantiles: {self.quantiles!r} is not one of {', '.join(QUANTILE_METHODS)} (linear: "
                "interpolation between order statistics, the default; nearest-rank: the value of rank ceil(q n))"
            )
        until = self.until_unix_s
        if until is not None and not (math.isfinite(until) and ARRIVAL_MIN_UNIX_S <= until <= ARRIVAL_MAX_UNIX_S):
            raise ConfigurationError(
                f"report --until: must be Unix seconds between {ARRIVAL_MIN_UNIX_S:.0f} (1970) and "
                f"{ARRIVAL_MAX_UNIX_S:.0f} (the year 9999), got {until!r}"
            )
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


def build_report(
    con: duckdb.DuckDBPyConnection | Database,
    spec: ReportSpec,
    *,
    on_progress: ProgressCallback | None = None,
) -> Report:
    """Compute the report over the store open on ``con``: a DuckDB connection (``Store.con``) or an
    :class:`~llmslo.analysis.databases.Database` (ClickHouse, partitioned Parquet); the same report either way.

    ``on_progress(stage)`` is called as each query starts. ``Report.to_dict()`` is the JSON of
    ``llmslo report --json``: ``policy``, ``until_unix_s`` (the horizon), ``rate_basis`` (window or data
    span, seconds, and the groups that divide by something else), ``definitions``, ``totals`` and
    ``groups`` (each: ``keys``, ``attempted``, ``good``, ``in_flight``, ``goodput_fraction``,
    ``request_goodput_per_s``, ``token_goodput_per_s``, ``latency``, ``tokens``, ``survivor_bias``,
    ``rate_basis``).

    Raises :class:`~llmslo.analysis.report.ReportDataError` when a stored arrival time cannot be placed
    in time, and :class:`ConfigurationError` when the window gives more windows than a report holds.
    """
    policy = spec.policy
    database = as_database(con)
    # the arrival times are checked first where the windows or the horizon need them; otherwise the main
    # aggregate counts the unplaceable ones (the same rule, no scan of its own)
    check_arrivals_after = policy.window_s is None and spec.until_unix_s is None
    if not check_arrivals_after:
        arrivals = stored_arrival_range(database)
        if policy.window_s is not None:
            check_window_count(database, policy.window_s, arrivals, until_unix_s=spec.until_unix_s)
    imports = arrivalless_imports(database)
    raw = fetch_raw(database, policy, spec.keys, until_unix_s=spec.until_unix_s, arrivalless=tuple(imports),
                    on_progress=on_progress, check_arrivals=check_arrivals_after, quantiles=spec.quantiles)
    span = _span(raw, policy, spec.until_unix_s)
    bounds = {name: bucket_bounds(name, policy) for name in LATENCY_INTERVALS}
    groups = [_group(row, raw, bounds, _group_rate(row, spec, span.seconds, imports)) for row in raw.main]
    _flag_shed_trend(groups, spec)
    rate_basis = RateBasis(span.kind, span.seconds, span.from_unix_s, span.to_unix_s, span.note,
                           _rate_exceptions(groups))
    attempted = sum(g.attempted for g in groups)
    in_flight = sum(g.in_flight for g in groups)
    good = sum(g.good for g in groups)
    settled = attempted - in_flight
    totals = Totals(raw.n_total, attempted, good, in_flight, good / settled if settled else None)
    clock = Clock(raw.n_total, raw.client_clock_rows, raw.server_clock_rows)
    return Report(SCHEMA_VERSION, tuple(_import_caveats(database)), policy, spec.keys, rate_basis,
                  definitions_for(clock, spec.quantiles), totals, tuple(groups), spec.until_unix_s, clock,
                  spec.quantiles)


def _span(raw: RawReport, policy: GoodputPolicy, until_unix_s: float | None) -> RateBasis:
    """The report's rule for rows with arrival times: the window, or the span from their first arrival
    to their last finish (to the horizon when there is one), seconds."""
    if policy.window_s is not None:
        return RateBasis("window", policy.window_s)
    lo, hi = raw.span_from_unix_s, raw.span_to_unix_s
    if until_unix_s is not None and lo is not None:
        hi = until_unix_s
    span = hi - lo if lo is not None and hi is not None else 0.0
    to = "the horizon (--until)" if until_unix_s is not None else "the last finish"
    return RateBasis("span", span if span > 0 else None, lo, hi,
                     f"no --window: per-second rates divide by the span from the first arrival to {to} "
                     "of the rows with arrival times")


def _files(imports: Sequence[ArrivallessImport]) -> str:
    names = sorted({f for i in imports for f in i.files})
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _group_rate(
    row: dict[str, Any],
    spec: ReportSpec,
    span_s: float | None,
    imports: Mapping[str, ArrivallessImport],
) -> GroupRateBasis:
    """What the group's per-second rates divide by (seconds), or why they are null.

    Rows from imports without arrival times have no time base of their own: a group made only of them
    divides by the run durations those imports recorded (their sum), when every one recorded one; in a
    window, or mixed with rows that have arrival times, their rates are null. Other groups divide by the
    window (its part before the horizon) or the span of the rows with arrival times.
    """
    attempted = int(row["attempted"])
    n_none = int(row["no_arrival_rows"])
    mine = [imports[p] for p in row["no_arrival_imports"]]
    window_s = spec.policy.window_s
    if window_s is not None:
        if n_none:  # (such rows have a NULL window: they make groups of their own)
            return GroupRateBasis("none", None, f"{n_none:,} row(s) come from imports without arrival times "
                                  f"({_files(mine)}): they cannot be placed in windows, so they sit in no window, "
                                  "counted apart")
        start = float(row[WINDOW_KEY])
        seen = window_s if spec.until_unix_s is None else min(window_s, spec.until_unix_s - start)
        if seen <= 0:
            return GroupRateBasis("none", None, "the horizon (--until) is at the window's start")
        if seen < window_s:
            return GroupRateBasis("window", seen, f"the horizon (--until) ends this window after "
                                  f"{format_duration(seen)}")
        return GroupRateBasis("window", window_s)
    if n_none == 0:
        if span_s is None:
            return GroupRateBasis("span", None, "the rows with arrival times span no time")
        return GroupRateBasis("span", span_s)
    if n_none < attempted:
        return GroupRateBasis("none", None, f"the group mixes {attempted - n_none:,} row(s) with arrival times "
                              f"and {n_none:,} from imports without them ({_files(mine)}): no common time base")
    problems = sorted({i.problem for i in mine if i.problem is not None})
    if problems:
        shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
        files = tuple(sorted({f for i in mine if i.problem is not None for f in i.files}))
        reason = f"rows from imports without arrival times: {shown}"
        return GroupRateBasis("none", None, f"{reason} ({_files(mine)})", reason, files)
    total = math.fsum(i.run_duration_s for i in mine if i.run_duration_s is not None)
    return GroupRateBasis("run_duration", total,
                          f"rows from imports without arrival times ({_files(mine)}): per-second rates divide "
                          f"by the run duration(s) their files recorded, {format_duration(total)} in all")


def _label(keys: Mapping[str, Any]) -> str:
    return ", ".join("no window" if k == WINDOW_KEY and v is None else f"{k}={v}"
                     for k, v in keys.items()) or "all requests"


def _rate_exceptions(groups: Sequence[Group]) -> tuple[str, ...]:
    """One sentence per distinct reason: which groups (up to three named), the reason and its files."""
    by_reason: dict[str, list[Group]] = {}
    for g in groups:
        basis = g.rate_basis
        if basis.note is not None:
            by_reason.setdefault(basis.reason or basis.note, []).append(g)
    out: list[str] = []
    for reason, items in by_reason.items():
        named = "; ".join(_label(g.keys) for g in items[:3])
        more = f" and {len(items) - 3} more" if len(items) > 3 else ""
        files = sorted({f for g in items for f in g.rate_basis.files})
        where = ""
        if files:
            where = f" (files: {', '.join(files[:5])}" + (f" and {len(files) - 5} more)" if len(files) > 5 else ")")
        out.append(f"{len(items)} group(s) ({named}{more}): {reason}{where}")
    return tuple(out)


def _distribution(row: dict[str, Any] | None, alias: str, bounds: Sequence[float]) -> Distribution:
    if row is None:
        return Distribution(0, None, {quantile_label(q): None for q in QUANTILES}, None,
                            (*(Bucket(b, 0) for b in bounds), Bucket("+Inf", 0)))
    count = int(row[f"{alias}__count"] or 0)
    qvals = row[f"{alias}__q"] or [None] * len(QUANTILES)
    quantiles = {quantile_label(q): finite(v) for q, v in zip(QUANTILES, qvals, strict=True)}
    buckets = tuple(Bucket(b, int(row[f"{alias}__le{i}"] or 0)) for i, b in enumerate(bounds))
    return Distribution(count, finite(row[f"{alias}__mean"]), quantiles, finite(row[f"{alias}__max"]),
                        (*buckets, Bucket("+Inf", count)))


def _import_caveats(database: Database) -> list[str]:
    """What imported rows cannot support, from the provenance that ``llmslo import`` recorded.

    Read from :data:`~llmslo.analysis.store.IMPORTS_TABLE`; a store written before that table existed
    kept the same facts as JSON under ``import:<file name>`` keys of its metadata table, read as well.
    """
    tables = database.tables()
    tools: set[str] = set()
    no_arrivals: list[str] = []
    if IMPORTS_TABLE in tables:
        for tool, source, arrivals in database.tuples(
            f"SELECT tool, source, arrivals_available FROM {IMPORTS_TABLE} ORDER BY source"
        ):
            tools.add(str(tool))
            if not arrivals:
                no_arrivals.append(Path(str(source)).name)
    for key, value in database.tuples(f"SELECT key, value FROM {META_TABLE} WHERE key LIKE 'import:%' ORDER BY key"):
        try:
            meta = json.loads(value)
        except json.JSONDecodeError:
            continue
        tools.add(str(meta.get("tool", "?")))
        if meta.get("arrivals_available") is False:
            no_arrivals.append(str(key).removeprefix("import:"))
    out: list[str] = []
    if tools:
        out.append(
            f"rows imported from {', '.join(sorted(tools))} hold the tool's client-side times in ttft_s/e2e_s "
            "(it recorded no server timestamps)"
        )
    if no_arrivals:
        shown = ", ".join(no_arrivals[:5]) + (f" and {len(no_arrivals) - 5} more" if len(no_arrivals) > 5 else "")
        out.append(
            f"{len(no_arrivals)} imported file(s) carry no arrival times ({shown}): their rows sit in no window "
            "(a windowed report counts them apart) and in-flight counts at a horizon (--until) are not meaningful "
            "for them; their per-second rates divide by the run durations the files recorded, or are null "
            "(rate_basis says which)"
        )
    return out


def _group(
    row: dict[str, Any],
    raw: RawReport,
    bounds: dict[str, tuple[float, ...]],
    rate: GroupRateBasis,
) -> Group:
    key = raw.key_of(row)
    attempted = int(row["attempted"])
    in_flight = int(row["in_flight"])
    good = int(row["good"])
    settled = attempted - in_flight
    latency = {name: _distribution(raw.itl.get(key) if name == "itl_s" else row, name, bounds[name])
               for name in LATENCY_INTERVALS}
    by_reason = {r: int(row[f"n_{r}"]) for r in FINISH_REASONS}
    seconds = rate.seconds
    sums = {c: int(row[f"sum_{c}"]) for c in TOKEN_COUNTS}
    per_s = {c: (sums[c] / seconds if seconds else None) for c in TOKEN_COUNTS}
    tokens = Tokens(
        sums["prompt_tokens"], sums["proposed_tokens"], sums["generated_tokens"], sums["sent_tokens"],
        int(row["waste"]), per_s["prompt_tokens"], per_s["proposed_tokens"], per_s["generated_tokens"],
        per_s["sent_tokens"],
    )
    return Group(
        keys={k: (finite(row[k]) if k == WINDOW_KEY else row[k]) for k in raw.keys},
        attempted=attempted,
        good=good,
        in_flight=in_flight,
        goodput_fraction=good / settled if settled else None,
        request_goodput_per_s=good / seconds if seconds else None,
        token_goodput_per_s=int(row["good_generated_tokens"]) / seconds if seconds else None,
        one_token_replies=int(row["one_token_replies"]),
        good_one_token_replies=int(row["good_one_token"]),
        finish_reasons=by_reason,
        latency=latency,
        tokens=tokens,
        survivor_bias=_survivor(row, raw.km.get(key), by_reason, attempted, in_flight),
        rate_basis=rate,
    )


def _survivor(
    row: dict[str, Any],
    km: dict[str, Any] | None,
    by_reason: dict[str, int],
    attempted: int,
    in_flight: int,
) -> SurvivorBias:
    rejected = by_reason["rejected"]
    # attempted comes from count(*), each finish reason from its own filter: a row with a finish reason
    # outside the closed set (a store written by something else) would make them disagree.
    unbalanced: list[str] = []
    ended = sum(by_reason.values())
    if ended + in_flight != attempted:
        unbalanced.append(
            f"attempted ({attempted}) != requests with a known finish reason ({ended}) + in flight ({in_flight})"
        )
    accounting = Accounting(attempted, rejected, attempted - rejected, in_flight,
                            {r: v for r, v in by_reason.items() if r != "rejected"}, tuple(unbalanced))
    settled = attempted - in_flight
    shed = sum(by_reason[r] for r in SHED_REASONS)
    so_q = row["so__q"] or [None] * len(SURVIVOR_QUANTILES)
    success_only = SuccessOnlyTtft(
        int(row["so__n"] or 0), {quantile_label(q): finite(v) for q, v in zip(SURVIVOR_QUANTILES, so_q, strict=True)}
    )
    labels = [quantile_label(q) for q in SURVIVOR_QUANTILES]
    if km is None:
        aware = CensoringAwareTtft(0, 0, 0, dict.fromkeys(labels), None)
    else:
        aware = CensoringAwareTtft(int(km["n"]), int(km["n_events"]), int(km["n_censored"]),
                                   {label: finite(km[label]) for label in labels}, finite(km["max_censored_t"]))
    reasons: list[str] = []
    comparisons: dict[str, QuantileComparison] = {}
    verdict: Verdict
    if aware.count < SURVIVOR_MIN_REQUESTS or success_only.count == 0:
        verdict = "insufficient_data"
        reasons.append(
            f"{aware.count} admitted request(s), {success_only.count} successful with a first token: "
            f"a verdict needs at least {SURVIVOR_MIN_REQUESTS} admitted and one successful"
        )
    elif aware.censored == 0:
        verdict = "consistent"  # one quantile definition: without censoring the two estimates are the same
    else:
        assert km is not None
        comparisons = {label: _compare_quantile(q, label, success_only, aware, km)
                       for q, label in zip(SURVIVOR_QUANTILES[1:], labels[1:], strict=True)}
        judged = [c for c in comparisons.values() if c.judged]
        verdict = "optimistic" if any(c.optimistic for c in judged) else "consistent"
        reasons += [c.reason for c in judged if c.optimistic]
        if not judged:
            verdict = "insufficient_data"
            reasons.append(
                f"{aware.censored} of {aware.count} admitted requests censored, but too few requests to judge a "
                f"tail quantile: {', '.join(c.reason for c in comparisons.values())}"
            )
    shed_fraction = shed / settled if settled else None
    enough = aware.count >= SURVIVOR_MIN_REQUESTS and success_only.count > 0
    if enough and shed_fraction is not None and shed_fraction >= SHED_NOTABLE:
        verdict = "optimistic"
        reasons.append(
            f"{shed_fraction:.0%} of settled requests were rejected, cancelled, timed out or drained "
            f"(at or above {SHED_NOTABLE:.0%}): success-only latency describes only the rest"
        )
    return SurvivorBias(accounting, shed_fraction, success_only, aware, verdict, reasons, comparisons)


def _compare_quantile(q: float, label: str, success_only: SuccessOnlyTtft, aware: CensoringAwareTtft,
                      km: dict[str, Any]) -> QuantileComparison:
    """The survivor check of one TTFT quantile of a group with censored requests (docs/definitions.md,
    "Survivor bias"): is the share of admitted requests that waited longer than the success-only quantile
    (Kaplan–Meier's survival there) above ``1 - q`` by more than :data:`SURVIVOR_Z` Greenwood standard errors,
    and the censoring-aware quantile more than :data:`SURVIVOR_TOLERANCE` above the success-only one?"""
    allowed = 1.0 - q
    so = success_only.quantiles[label]
    ca = aware.quantiles[label]
    need = math.ceil(SURVIVOR_MIN_BEYOND / allowed - 1e-9)
    if aware.count < need or so is None:
        why = (f"{label} needs {need} admitted requests ({SURVIVOR_MIN_BEYOND} beyond it), this group has "
               f"{aware.count}" if so is not None else f"{label}: no successful request with a first token")
        return QuantileComparison(label, allowed, None, None, False, False, why)
    share = finite(km.get(f"s_at_{label}"))
    gw = finite(km.get(f"gw_at_{label}"))
    if share is None or gw is None:  # no comparison computed (no successful event): nothing to judge
        return QuantileComparison(label, allowed, None, None, False, False, f"{label}: not computed")
    band = SURVIVOR_Z * share * math.sqrt(gw)
    beyond = share - allowed > band if band > 0 else share - allowed > 0
    material = ca is None or ca > so * (1 + SURVIVOR_TOLERANCE)
    waited = (f"{share:.1%} of admitted requests waited longer (Kaplan–Meier), where at most {allowed:.0%} would "
              f"(+{band:.1%} sampling band)")
    if ca is None:
        reason = (f"TTFT {label}: success-only {so:.3g}s, but {waited}; the censoring-aware {label} is unbounded: "
                  f"at least {aware.at_least_s or 0.0:.3g}s")
    else:
        reason = (f"TTFT {label}: success-only {so:.3g}s vs censoring-aware {ca:.3g}s "
                  f"({(ca / so - 1) * 100:+.0f}%, tolerance {SURVIVOR_TOLERANCE * 100:.0f}%); {waited}")
    return QuantileComparison(label, allowed, share, band, True, beyond and material, reason)


def _rise_beyond_sampling(p1: float, n1: int, p2: float, n2: int) -> bool:
    """Whether a fraction rising from ``p1`` (of ``n1``) to ``p2`` (of ``n2``) rose by more than
    :data:`SURVIVOR_Z` standard errors of the pooled binomial difference."""
    if n1 <= 0 or n2 <= 0:
        return False
    pooled = (p1 * n1 + p2 * n2) / (n1 + n2)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    return p2 - p1 > SURVIVOR_Z * se if se > 0 else p2 > p1


def _flag_shed_trend(groups: list[Group], spec: ReportSpec) -> None:
    """With windows: flag a window whose shed/cancel fraction rose while success-only TTFT p99 fell."""
    if spec.policy.window_s is None:
        return
    series: dict[tuple[Any, ...], list[Group]] = {}
    for g in groups:
        if g.keys[WINDOW_KEY] is not None:  # rows without arrival times sit in no window: no series
            series.setdefault(tuple(g.keys[k] for k in spec.by), []).append(g)
    label = quantile_label(SURVIVOR_QUANTILES[-1])
    for items in series.values():
        items.sort(key=lambda g: g.keys[WINDOW_KEY])
        for prev, cur in itertools.pairwise(items):
            sp, sc = prev.survivor_bias, cur.survivor_bias
            fp, fc = sp.shed_cancel_fraction, sc.shed_cancel_fraction
            tp, tc = sp.ttft_success_only.quantiles[label], sc.ttft_success_only.quantiles[label]
            if fp is None or fc is None or tp is None or tc is None or sc.verdict == "insufficient_data":
                continue
            n1 = sp.accounting.attempted - sp.accounting.in_flight
            n2 = sc.accounting.attempted - sc.accounting.in_flight
            if fc - fp >= SHED_RISE and tc < tp and _rise_beyond_sampling(fp, n1, fc, n2):
                sc.verdict = "optimistic"
                sc.reasons.append(
                    f"shed/cancel fraction rose {fp:.1%} -> {fc:.1%} while success-only TTFT {label} "
                    f"improved {tp:.3g}s -> {tc:.3g}s"
                )
