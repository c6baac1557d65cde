"""The report's queries: SQL over the summary table that returns the raw figures of each group.

The contract with :mod:`llmslo.analysis.report._report` is :class:`RawReport`: for every group, one row of
the main aggregate (counts, goodput, exact quantiles, bucket counts, token sums, success-only TTFT), and
where they exist the group's ITL distribution and censoring-aware (Kaplan–Meier) TTFT. Column names of
those rows (``<interval>__count``, ``__mean``, ``__q``, ``__max``, ``__le<i>``; ``so__n``, ``so__q``;
``n``, ``n_events``, ``n_censored``, ``p50``…, ``max_censored_t``) are this module's vocabulary.
Quantiles are exact, by one definition for the whole report (:func:`report_quantiles`): linear interpolation
between order statistics (numpy's default), or on request nearest rank (docs/definitions.md, "Quantiles").

The SQL is written once per database through :mod:`llmslo.analysis.databases`: :func:`fetch_raw` takes a DuckDB
connection (as it always did) or an :class:`~llmslo.analysis.databases.Database`, and every primitive that the
databases write differently comes from the database's :class:`~llmslo.analysis.databases.Dialect` (on DuckDB the
text is the same as before).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import duckdb

from llmslo.analysis.databases import Database, Dialect, as_database, km_quantiles_by_group_sql
from llmslo.analysis.report._policy import GoodputPolicy
from llmslo.analysis.report._provenance import stored_arrival_range, unplaceable_arrival
from llmslo.analysis.report._survival import (
    inverse_cdf_max_n,
    km_quantiles_by_id_sql,
    quantile_label,
)
from llmslo.analysis.store import SUMMARY_TABLE
from llmslo.telemetry import DEFAULT_BUCKETS_S, FINISH_REASONS, TPOT_SQL, ConfigurationError

__all__ = [
    "finite",
    "DEFAULT_QUANTILE_METHOD",
    "LATENCY_INTERVALS",
    "QUANTILES",
    "QUANTILE_METHODS",
    "QuantileMethod",
    "SURVIVOR_QUANTILES",
    "COMPARISON_PREFIXES",
    "TOKEN_COUNTS",
    "WINDOW_KEY",
    "RawReport",
    "bucket_bounds",
    "fetch_raw",
    "report_quantiles",
]

WINDOW_KEY = "window_start_unix_s"
LATENCY_INTERVALS: tuple[str, ...] = ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s", "client_ttft_s")
"""Intervals reported as distributions (``tpot_s`` derived; ``itl_s`` from the per-request gap lists)."""
QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.95, 0.99)
SURVIVOR_QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99)
COMPARISON_PREFIXES: tuple[str, ...] = ("so_", "s_at_", "gw_at_")
"""The survivor-bias comparison's columns of a censored group, each followed by a quantile label: the success-only
quantile (seconds), the Kaplan–Meier survival there and Greenwood's sum there."""
QuantileMethod = Literal["linear", "nearest-rank"]
"""How the report computes a quantile from a group's values (docs/definitions.md, "Quantiles")."""
QUANTILE_METHODS: tuple[QuantileMethod, ...] = ("linear", "nearest-rank")
DEFAULT_QUANTILE_METHOD: QuantileMethod = "linear"
"""Linear interpolation between order statistics (numpy's default, DuckDB's ``quantile_cont``)."""
TOKEN_COUNTS: tuple[str, ...] = ("prompt_tokens", "proposed_tokens", "generated_tokens", "sent_tokens")

ProgressCallback = Callable[[str], None]
"""``on_progress(stage)``, called as each query starts."""
Key = tuple[Any, ...]


@dataclass
class RawReport:
    """What the queries return: the span of the data and the raw rows of every group, keyed by group.

    ``client_clock_rows`` / ``server_clock_rows``: how many rows were measured on a client's clock
    (:data:`CLIENT_CLOCK_SQL`) and on the server's (:data:`SERVER_CLOCK_SQL`); the rest carry nothing that tells.

    The span (Unix seconds) runs from the first arrival to the last finish of the rows with arrival times
    (rows from imports without them are left out). ``main`` holds one row per group in group-key order,
    with ``no_arrival_rows`` (how many of its rows came from imports without arrival times) and
    ``no_arrival_imports`` (the request-id prefixes of those imports); ``itl`` and ``km`` are keyed by the
    tuple of the group's key values (a group absent from ``km`` has no admitted request).
    """

    keys: tuple[str, ...]
    n_total: int
    span_from_unix_s: float | None
    span_to_unix_s: float | None
    main: list[dict[str, Any]]
    itl: dict[Key, dict[str, Any]] = field(default_factory=dict)
    km: dict[Key, dict[str, Any]] = field(default_factory=dict)
    client_clock_rows: int = 0
    server_clock_rows: int = 0

    def key_of(self, row: dict[str, Any]) -> Key:
        return tuple(row[k] for k in self.keys)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def bucket_bounds(interval: str, policy: GoodputPolicy) -> tuple[float, ...]:
    """Default bounds of an interval plus the policy's threshold on it, sorted, seconds."""
    bounds = set(DEFAULT_BUCKETS_S[interval])
    threshold = {"ttft_s": policy.ttft_s, "tpot_s": policy.tpot_s, "e2e_s": policy.e2e_s}.get(interval)
    if threshold is not None:
        bounds.add(threshold)
    return tuple(sorted(bounds))


def _base_sql(policy: GoodputPolicy, until_unix_s: float | None = None,
              arrivalless: Sequence[str] = (), dialect: Dialect | None = None,
              summaries: str = SUMMARY_TABLE) -> str:
    """Every summary row plus ``tpot_s_derived`` (:data:`TPOT_SQL`, seconds), ``__good`` (the policy's
    rule), ``__in_flight``, with windows :data:`WINDOW_KEY` (Unix seconds; NULL for a row from an import
    without arrival times: it sits in no window), and with ``arrivalless`` prefixes ``__import``: the prefix
    of a row that came from an import without arrival times, else NULL.

    A row belongs to the window of its arrival, whatever its duration. With a horizon ``until_unix_s``
    (Unix seconds) only rows that arrived by then are kept, and a row is in flight when it finished after
    it (``arrival_unix_s + e2e_s > until_unix_s``); without one, every stored row has reached its terminal
    state and none is in flight. ``__import`` comes from a join with the (few) prefixes, made only when
    there are some (:meth:`Dialect.tag_imports`). ``summaries`` is the relation read (the table, or a
    subquery of it over a time range).
    """
    d = dialect or Dialect()
    cols = [policy.good_sql().replace(f"({TPOT_SQL})", "tpot_s_derived") + " AS __good"]
    # (the rule's TPOT condition reads the derived column, computed once per row: the same expression)
    w = policy.window_s
    if w is not None:
        window = f"floor(arrival_unix_s / {d.double(w)}) * {d.double(w)}"
        if arrivalless:  # rows without arrival times sit in no window: NULL, a group of their own
            window = f"CASE WHEN __import IS NULL THEN {window} END"
        cols.append(f"{window} AS {WINDOW_KEY}")
    if until_unix_s is None:
        cols.append("FALSE AS __in_flight")
    else:
        cols.append(f"coalesce(arrival_unix_s + e2e_s > {d.double(until_unix_s)}, FALSE) AS __in_flight")
    source = f"(SELECT *, {TPOT_SQL} AS tpot_s_derived FROM {summaries}) AS __summaries"
    if arrivalless:
        source = d.tag_imports(source, arrivalless)
    where = f" WHERE arrival_unix_s <= {d.double(until_unix_s)}" if until_unix_s is not None else ""
    return f"SELECT *, {', '.join(cols)} FROM {source}{where}"


@dataclass
class _Query:
    """A grouped query in two layers: the aggregates per group, then a projection of them (the figures).

    ``inner`` are aggregate expressions with their aliases; ``outer`` expressions over those aliases (in
    order; a later one may use an earlier one's alias). An aggregate the projection does not transform
    is passed through by name.
    """

    inner: list[str] = field(default_factory=list)
    outer: list[str] = field(default_factory=list)

    def add(self, aggregate: str, alias: str) -> None:
        self.inner.append(f"{aggregate} AS {_quote(alias)}")
        self.outer.append(_quote(alias))

    def sql(self, keys: Sequence[str], source: str) -> str:
        group = f" GROUP BY {', '.join(keys)}" if keys else ""
        order = f" ORDER BY {', '.join(keys)}" if keys else ""
        return (f"SELECT {', '.join([*keys, *self.outer])} "
                f"FROM (SELECT {', '.join([*keys, *self.inner])} FROM ({source}) AS __rows{group}) AS __groups"
                f"{order}")


@dataclass(frozen=True)
class _Holistic:
    """An aggregate that holds every value of its group in memory (exact quantiles): its function (DuckDB SQL,
    without a filter), the condition it reads rows under (None: every row), the alias of its result, and the
    alias of the count of values it reads per group (for the memory estimate)."""

    function: str
    cond: str | None
    alias: str
    count_alias: str

    def aggregate(self) -> str:
        """The aggregate over its rows."""
        return self.function + (f" FILTER (WHERE {self.cond})" if self.cond is not None else "")


HOLISTIC_BYTES_PER_VALUE = 16
"""The estimate of what an exact quantile holds per value it reads, bytes: the value (8 bytes) in a vector
that may grow to twice its size. DuckDB 2.0 needs 20-22.5 bytes of its memory limit per value (``quantile_cont``
of 9-29 million doubles in 9 groups, the smallest limit that lets the query finish): the share of the limit
given to the quantiles (``HOLISTIC_SHARE``, 0.5) covers the difference."""


def _pack(specs: Sequence[_Holistic], rows: list[dict[str, Any]], budget_bytes: int) -> list[list[_Holistic]]:
    """``specs`` into consecutive queries holding at most ``budget_bytes`` each (estimated from the counts of
    values in ``rows``), one spec at least per query."""
    batches: list[list[_Holistic]] = [[]]
    held = 0
    for spec in specs:
        need = HOLISTIC_BYTES_PER_VALUE * sum(int(r.get(spec.count_alias) or 0) for r in rows)
        if batches[-1] and held + need > budget_bytes:
            batches.append([])
            held = 0
        batches[-1].append(spec)
        held += need
    return [b for b in batches if b]


def report_quantiles(dialect: Dialect, expr: str, quantiles: Sequence[float], method: QuantileMethod,
                     cond: str | None = None) -> str:
    """The report's one quantile function: the SQL aggregate of the exact ``quantiles`` of ``expr`` (a list, in
    the unit of ``expr``; NULL or NaNs without values), over the rows where ``cond`` holds when given, by
    ``method``: ``linear`` (:meth:`Dialect.exact_quantiles`, linear interpolation between order statistics) or
    ``nearest-rank`` (:meth:`Dialect.nearest_rank_quantiles`, the value of rank ``ceil(n q)``). Every quantile
    the report computes from values goes through here. Raises ``ValueError`` for another method."""
    if method == "linear":
        return dialect.exact_quantiles(expr, quantiles, cond)
    if method == "nearest-rank":
        return dialect.nearest_rank_quantiles(expr, quantiles, cond)
    raise ValueError(f"quantile method {method!r} is not one of {', '.join(QUANTILE_METHODS)}")


def _add_distribution(query: _Query, dialect: Dialect, expr: str, alias: str, bounds: Sequence[float],
                      method: QuantileMethod, deferred: list[_Holistic] | None = None) -> None:
    """Mean, exact quantiles at :data:`QUANTILES` by ``method`` (:func:`report_quantiles`), max, count and
    cumulative bucket counts (``<alias>__le<i>``: values ``<= bound i``) of ``expr`` (seconds), as the database
    writes them (:meth:`Dialect.distribution`, its quantiles replaced). With ``deferred`` the quantiles are left
    out of ``query`` and listed there, to run apart (:func:`_run_holistic`)."""
    inner, outer = dialect.distribution(expr, alias, bounds, QUANTILES, with_quantiles=False)
    query.inner += inner
    query.outer += outer
    spec = _Holistic(report_quantiles(dialect, expr, QUANTILES, method), None, f"{alias}__q", f"{alias}__count")
    if deferred is None:
        query.add(spec.aggregate(), spec.alias)
    else:
        deferred.append(spec)


def _run_holistic(database: Database, source: str, keys: tuple[str, ...], rows: list[dict[str, Any]],
                  specs: Sequence[_Holistic], budget_bytes: int) -> None:
    """Compute ``specs`` over ``source`` grouped by ``keys`` and put their results into ``rows`` (matched by key).

    An exact quantile holds every value it reads in memory and DuckDB does not spill it; so that a report
    stays under the database's memory limit, the aggregates are packed into as few queries as fit
    ``budget_bytes`` (:func:`_pack`). A query that runs out of memory all the same is split in two and run
    again. Raises :class:`~llmslo.telemetry.ConfigurationError` naming ``--memory-limit`` when one of them
    alone does not fit DuckDB's limit.
    """
    for row in rows:
        for spec in specs:
            row.setdefault(spec.alias, None)
    if not rows or not specs:
        return
    by_key = {tuple(r[k] for k in keys): r for r in rows}
    queue = _pack(specs, rows, budget_bytes)
    while queue:
        batch = queue.pop(0)
        q = _Query()
        for spec in batch:
            q.add(spec.aggregate(), spec.alias)
        try:
            found = database.rows(q.sql(keys, source))
        except duckdb.OutOfMemoryException:
            if len(batch) > 1:  # the estimate was short: half the batch at a time
                half = len(batch) // 2
                queue[:0] = [batch[:half], batch[half:]]
                continue
            spec = batch[0]
            need = HOLISTIC_BYTES_PER_VALUE * sum(int(r.get(spec.count_alias) or 0) for r in rows)
            raise ConfigurationError(
                f"--memory-limit: the exact quantiles of {spec.alias.removesuffix('__q')} hold about "
                f"{need / 2**30:.1f} GiB of values, more than DuckDB's memory limit leaves for them (exact "
                "quantiles are held in memory, not spilled): raise --memory-limit, report a shorter --from/--to "
                "range, or use ClickHouse"
            ) from None
        for r in found:
            target = by_key.get(tuple(r[k] for k in keys))
            if target is not None:
                target.update({spec.alias: r[spec.alias] for spec in batch})


def _run_main(database: Database, query: _Query, keys: tuple[str, ...], source: str, deferred: list[_Holistic],
              inline: int) -> tuple[list[dict[str, Any]], list[_Holistic]]:
    """The rows of the main aggregate ``query``, which also holds the first ``inline`` of the ``deferred`` exact
    quantiles (as many as fit the budget however many values they read), and the quantiles left to compute. When
    that runs out of memory all the same, the main aggregate runs again without them."""
    if inline and deferred:
        holding = _Query(list(query.inner), list(query.outer))
        for spec in deferred[:inline]:
            holding.add(spec.aggregate(), spec.alias)
        try:
            return database.rows(holding.sql(keys, source)), deferred[inline:]
        except duckdb.OutOfMemoryException:
            pass
    return database.rows(query.sql(keys, source)), deferred


def finite(value: Any) -> float | None:
    """``value`` as a float, or None when it is null, NaN or infinite."""
    if value is None:
        return None
    x = float(value)
    return x if math.isfinite(x) else None


_INTERVAL_EXPR: dict[str, str] = {"ttft_s": "ttft_s", "tpot_s": "tpot_s_derived", "e2e_s": "e2e_s",
                                  "queue_s": "queue_s", "client_ttft_s": "client_ttft_s"}
"""The main aggregate's expression of each interval (over :func:`_base_sql`); ``itl_s`` has its own pass."""
CLIENT_CLOCK_SQL = ("queue_s IS NULL AND (coalesce(ttft_s = client_ttft_s, FALSE) "
                    "OR (ttft_s IS NULL AND coalesce(e2e_s = client_e2e_s, FALSE)))")
"""A row measured on a client's clock: its times are the client's own (``client_ttft_s`` repeats ``ttft_s``;
without a first token, ``client_e2e_s`` repeats ``e2e_s``: ``llmslo load``'s rows, and rows imported from
benchmark tools' files), and it has no ``queue_s`` (a client cannot see the server's queue). A server's row may
carry its clients' figures too (the simulated demo's refusals and early cancels do), but on another clock than
its own intervals, so they differ."""
SERVER_CLOCK_SQL = "queue_s IS NOT NULL OR (ttft_s IS NOT NULL AND NOT coalesce(ttft_s = client_ttft_s, FALSE))"
"""A row measured on the server's clock: it has a ``queue_s``, or a ``ttft_s`` that is not its ``client_ttft_s``
(``llmslo serve``'s rows, and any server's through the telemetry). A row neither this nor
:data:`CLIENT_CLOCK_SQL` (no first token and no queue time) tells nothing of its clock."""


def clock_conditions(present: Mapping[str, bool]) -> tuple[str | None, str | None]:
    """:data:`CLIENT_CLOCK_SQL` and :data:`SERVER_CLOCK_SQL` with every term on a column that is null in every row
    (``present``: the pre-pass's answers) resolved, so the aggregate never reads such a column; None for a
    condition that no row can meet."""
    queue, ttft, c_ttft, c_e2e = (present[k] for k in ("queue_s", "ttft_s", "client_ttft_s", "client_e2e_s"))
    same = [*(["coalesce(ttft_s = client_ttft_s, FALSE)"] if ttft and c_ttft else []),
            *([f"({'ttft_s IS NULL AND ' if ttft else ''}coalesce(e2e_s = client_e2e_s, FALSE))"] if c_e2e else [])]
    client: str | None = None
    if same:
        client = " AND ".join([*(["queue_s IS NULL"] if queue else []), f"({' OR '.join(same)})"])
    either = ["queue_s IS NOT NULL"] if queue else []
    if ttft:
        either.append("(ttft_s IS NOT NULL AND NOT coalesce(ttft_s = client_ttft_s, FALSE))" if c_ttft
                      else "ttft_s IS NOT NULL")
    return client, " OR ".join(either) or None


ADMITTED = "finish_reason <> 'rejected'"
"""A row the censoring-aware TTFT counts: admitted (every finish reason but ``rejected``)."""
def _presence(dialect: Dialect) -> dict[str, str]:
    """What the pre-pass asks of the summary table: does a row exist where this holds?"""
    return {
        "ttft_s": "ttft_s IS NOT NULL",
        "tpot_s": "generated_tokens > 1 AND ttft_s IS NOT NULL AND last_token_s IS NOT NULL",  # TPOT_SQL non-null
        "e2e_s": "e2e_s IS NOT NULL",
        "queue_s": "queue_s IS NOT NULL",
        "client_ttft_s": "client_ttft_s IS NOT NULL",
        "client_e2e_s": "client_e2e_s IS NOT NULL",  # for the clock only (no distribution of its own)
        "itl_s": dialect.has_elements("itl_s"),
    }


def _presence_sql(dialect: Dialect, summaries: str = SUMMARY_TABLE, probes: dict[str, str] | None = None) -> str:
    """One row of booleans, one per :func:`_presence` entry (:meth:`Dialect.presence`). Each DuckDB ``EXISTS``
    stops at the first matching row, and DuckDB skips row groups whose statistics say a column is all null,
    so the pre-pass costs milliseconds where a ``count()`` would scan every row."""
    return dialect.presence(_presence(dialect) if probes is None else probes, summaries)


def _empty_distribution(alias: str, bounds: Sequence[float]) -> dict[str, Any]:
    """The main-row keys of an interval that is null in every row: what its aggregates would return."""
    out: dict[str, Any] = {f"{alias}__count": 0, f"{alias}__mean": None, f"{alias}__q": None,
                           f"{alias}__max": None}
    out.update({f"{alias}__le{i}": 0 for i in range(len(bounds))})
    return out


def _match(keys: Sequence[str], left: str, right: str) -> str:
    return " AND ".join(f"{left}.{k} IS NOT DISTINCT FROM {right}.{k}" for k in keys) or "TRUE"


def fetch_raw(
    con: duckdb.DuckDBPyConnection | Database,
    policy: GoodputPolicy,
    keys: tuple[str, ...],
    *,
    until_unix_s: float | None = None,
    arrivalless: Sequence[str] = (),
    on_progress: ProgressCallback | None = None,
    check_arrivals: bool = False,
    quantiles: QuantileMethod = DEFAULT_QUANTILE_METHOD,
) -> RawReport:
    """Run the report's queries over the store open on ``con`` (a DuckDB connection or a database), grouped by
    ``keys`` (columns, and
    :data:`WINDOW_KEY` when the policy has a window), at the horizon ``until_unix_s`` (Unix seconds;
    None: when the data was taken, so no stored row is in flight), telling apart the rows whose
    ``request_id`` prefix is one of ``arrivalless`` (imports without arrival times).

    The table is aggregated once; only ITL and censoring take a second look, each at what it needs:

    1. a pre-pass of ``EXISTS`` probes (milliseconds): which intervals have a value somewhere and whether
       ``itl_s`` is stored. An interval null everywhere costs nothing further (count 0, mean, quantiles
       and max None, buckets 0);
    2. the main aggregate, one hash aggregate over the groups: counts, goodput, token sums; for each
       interval mean, exact quantiles, max and the bucket counts (one ``histogram`` each); the span
       (first arrival, last arrival + ``e2e_s``, Unix seconds: min and max of the groups' own);
       success-only TTFT; the rows measured on a client's clock and on the server's (which clock the
       report's definitions speak of); and per group its admitted and censored counts and the Kaplan–Meier TTFT
       quantiles it has when nothing is censored: the inverse empirical CDF of ``ttft_s`` over its
       admitted rows (``quantile_disc`` with DECIMAL fractions, exact; see
       :mod:`~llmslo.analysis.report._survival`);
    3. only when some ``itl_s`` is stored, the ITL pass over the unnested gaps;
    4. only when some group has censored rows, Kaplan–Meier by the ranking method over the admitted
       rows of those groups, and of no other group (:func:`_censoring_aware`).

    Under a memory budget (:attr:`Database.holistic_budget_bytes`), when the exact quantiles of step 2 could
    together exceed it, the main aggregate holds only as many as fit it even if every row held a value of each,
    and the others run apart in as few queries as fit it (:func:`_run_holistic`).

    On a database without the ``quantile_disc`` shortcut (ClickHouse), step 2 computes no inverse CDF and
    step 4 runs for every group with admitted rows (one array per group: see
    :func:`~llmslo.analysis.databases.km_quantiles_by_group_sql`).

    The finish reasons are the closed set and never null (the store's contract); bucket counts assume
    finite values (the store holds no others). With ``check_arrivals`` (only without a horizon: every row
    is aggregated) the main aggregate also counts the rows whose arrival time cannot be placed, and
    :func:`~llmslo.analysis.report.stored_arrival_range` raises its error naming them when there are any.

    ``quantiles`` is the definition of every quantile computed from values (:func:`report_quantiles`): the
    latency distributions and ITL. The survivor check's two TTFT estimates are nearest-rank whatever it is: the
    success-only TTFT (:meth:`~llmslo.analysis.databases.Dialect.nearest_rank_quantiles`) and the Kaplan–Meier
    TTFT, a step function (without censoring, the nearest-rank quantile).
    """
    if quantiles not in QUANTILE_METHODS:
        raise ConfigurationError(f"report --quantiles: {quantiles!r} is not one of {', '.join(QUANTILE_METHODS)}")
    database = as_database(con)
    d = database.dialect
    text = d.text
    base = _base_sql(policy, until_unix_s, arrivalless, d, database.summaries)
    bounds = {name: bucket_bounds(name, policy) for name in LATENCY_INTERVALS}
    probes = {k: v for k, v in _presence(d).items() if k not in database.empty_lists}
    present = {k: bool(v) for k, v in zip(probes, database.tuples(_presence_sql(d, database.summaries, probes))[0],
                                          strict=True)}
    present.update({k: False for k in _presence(d) if k not in probes})
    budget = database.holistic_budget_bytes
    inline = 0  # how many exact quantiles the main aggregate holds, when the others are deferred
    if budget is not None:
        # every exact quantile inside the main aggregate, unless together they could exceed the budget (an upper
        # bound: every row holds a value of every one of them); then as many as fit it at that bound
        (rows,) = database.tuples(f"SELECT count(*) FROM {database.summaries}")[0]
        quantiled = sum(v for k, v in present.items() if k in LATENCY_INTERVALS)
        if HOLISTIC_BYTES_PER_VALUE * int(rows) * (quantiled + 2) <= budget:
            budget = None
        else:
            inline = budget // (HOLISTIC_BYTES_PER_VALUE * int(rows))

    if on_progress:
        on_progress("aggregating")
    horizon = until_unix_s is not None  # only a horizon before a row's finish makes it in flight
    # Grouped by finish reason, a group's rows all have its reason: successful or not, admitted or not.
    by_reason = "finish_reason" in keys
    success = ", ".join(text(r) for r in sorted(policy.success))
    good = "__good AND NOT __in_flight" if horizon else "__good"
    q = _Query()
    filled: dict[str, Any] = {}
    q.add("count(*)", "attempted")
    if horizon:
        q.add(d.count_if("__in_flight"), "in_flight")
    else:
        q.outer.append("0 AS in_flight")
    q.add(d.count_if(good), "good")
    q.add(d.sum_where("generated_tokens", good), "good_generated_tokens")
    q.add(d.count_if(f"{good} AND generated_tokens <= 1"), "good_one_token")
    q.add(d.count_if("generated_tokens = 1"), "one_token_replies")
    # settled requests per finish reason (from the group key when it is one), and the rejected ones,
    # settled or not, to count the admitted
    if by_reason:
        q.outer += [f"CASE WHEN finish_reason = {text(r)} THEN attempted - in_flight ELSE 0 END AS "
                    f"{_quote('n_' + r)}" for r in FINISH_REASONS]
        q.outer.append("CASE WHEN finish_reason = 'rejected' THEN attempted ELSE 0 END AS __rejected")
    else:
        settled = "NOT __in_flight AND " if horizon else ""
        for r in FINISH_REASONS:
            q.add(d.count_if(f"{settled}finish_reason = {text(r)}"), f"n_{r}")
        if horizon:
            q.add(d.count_if("finish_reason = 'rejected'"), "__rejected")
        else:
            q.outer.append('"n_rejected" AS __rejected')
    if arrivalless:
        q.add("count(__import)", "no_arrival_rows")
        q.add(d.distinct_sorted("__import"), "no_arrival_imports")
        q.add(d.min_where("arrival_unix_s", "__import IS NULL"), "__span_from")
        q.add(d.max_where("arrival_unix_s + e2e_s", "__import IS NULL"), "__span_to")
    else:
        filled.update({"no_arrival_rows": 0, "no_arrival_imports": []})
        q.add(d.min_of("arrival_unix_s"), "__span_from")
        q.add(d.max_of("arrival_unix_s + e2e_s"), "__span_to")
    for c in TOKEN_COUNTS:
        q.add(f"coalesce(sum({c}), 0)", f"sum_{c}")
    q.add("coalesce(sum(generated_tokens - sent_tokens), 0)", "waste")
    if check_arrivals:
        q.add(d.count_if(unplaceable_arrival(d)), "__unplaceable")
    for cond, alias in zip(clock_conditions(present), ("__client_clock", "__server_clock"), strict=True):
        if cond is None:
            q.outer.append(f"0 AS {alias}")
        else:
            q.add(d.count_if(cond), alias)
    deferred: list[_Holistic] | None = [] if budget is not None else None
    for name, expr in _INTERVAL_EXPR.items():
        if present[name]:
            _add_distribution(q, d, expr, name, bounds[name], quantiles, deferred)
        else:
            filled.update(_empty_distribution(name, bounds[name]))
    so_from_disc = by_reason and d.inverse_cdf_shortcut
    if present["ttft_s"]:
        successful = f"finish_reason IN ({success})"
        # the success-only TTFT is always a nearest-rank quantile, whatever the report's method: the
        # Kaplan-Meier quantile's definition (docs/definitions.md, "Survivor bias"), so that the survivor check
        # compares one definition and, without censoring, the two agree
        if so_from_disc:
            # a group of one finish reason: its successful rows with a TTFT are its admitted rows with one, so
            # its success-only quantiles are the inverse CDF below (read back per row), not a second sort
            q.outer.append(f"CASE WHEN {successful} THEN ttft_s__count ELSE 0 END AS so__n")
        else:
            q.add(d.count_where("ttft_s", successful), "so__n")
            if deferred is None:
                q.add(d.nearest_rank_quantiles("ttft_s", SURVIVOR_QUANTILES, successful), "so__q")
            else:
                deferred.append(_Holistic(d.nearest_rank_quantiles("ttft_s", SURVIVOR_QUANTILES), successful,
                                          "so__q", "so__n"))
        # Kaplan-Meier without censoring = inverse empirical CDF over the admitted rows, exactly
        # (DECIMAL fractions: DuckDB computes the index ceil(n q) - 1 in integer arithmetic).
        if d.inverse_cdf_shortcut:
            disc = _Holistic(d.nearest_rank_quantiles("ttft_s", SURVIVOR_QUANTILES), None if by_reason else ADMITTED,
                             "__inverse_cdf_q", "__admitted_ttft")
            if deferred is None:
                q.add(disc.aggregate(), "__inverse_cdf_q")
            else:
                deferred.append(disc)
        else:
            q.outer.append("NULL AS __inverse_cdf_q")
        if by_reason:
            q.outer.append("ttft_s__count AS __admitted_ttft")
        else:
            q.add(d.count_where("ttft_s", ADMITTED), "__admitted_ttft")  # the same filter
    else:
        filled.update({"so__n": 0, "so__q": None})
        q.outer += ["NULL AS __inverse_cdf_q", "0 AS __admitted_ttft"]
    main, rest = _run_main(database, q, keys, base, deferred or [], inline)
    if check_arrivals:
        unplaceable = sum(int(row.pop("__unplaceable") or 0) for row in main)
        if unplaceable:
            stored_arrival_range(database)  # raises ReportDataError naming the rows
    if budget is not None:
        if on_progress and rest:
            on_progress("exact quantiles")
        _run_holistic(database, base, keys, main, rest, budget)

    n_total = client_clock = server_clock = 0
    span_from: float | None = None
    span_to: float | None = None
    admitted_groups: dict[Key, _AdmittedGroup] = {}
    for row in main:
        row.update(filled)
        row["no_arrival_imports"] = list(row["no_arrival_imports"] or [])
        n_total += row["attempted"]
        client_clock += int(row.pop("__client_clock") or 0)
        server_clock += int(row.pop("__server_clock") or 0)
        lo, hi = row.pop("__span_from"), row.pop("__span_to")
        span_from = lo if span_from is None or (lo is not None and lo < span_from) else span_from
        span_to = hi if span_to is None or (hi is not None and hi > span_to) else span_to
        # admitted = attempted - rejected (finish_reason is never null in the store); censored: admitted
        # without a TTFT
        admitted = row["attempted"] - row.pop("__rejected")
        with_ttft, disc = row.pop("__admitted_ttft"), row.pop("__inverse_cdf_q")
        if so_from_disc and present["ttft_s"]:
            row["so__q"] = disc if row["finish_reason"] in policy.success else None
        if admitted:
            admitted_groups[tuple(row[k] for k in keys)] = _AdmittedGroup(admitted, admitted - with_ttft, disc)

    itl_rows: dict[Key, dict[str, Any]] = {}
    if present["itl_s"]:
        if on_progress:
            on_progress("inter-token latency")
        itl = _Query()
        itl_deferred: list[_Holistic] | None = [] if budget is not None else None
        _add_distribution(itl, d, "g", "itl_s", bounds["itl_s"], quantiles, itl_deferred)
        gaps = (f"SELECT {', '.join([*keys, d.unnest('itl_s') + ' AS g'])} FROM ({base}) "
                f"WHERE {d.has_elements('itl_s')}")
        found = database.rows(itl.sql(keys, gaps))
        if itl_deferred is not None and budget is not None:
            _run_holistic(database, gaps, keys, found, itl_deferred, budget)
        for itl_row in found:
            itl_rows[tuple(itl_row[k] for k in keys)] = itl_row

    km = _censoring_aware(database, base, keys, admitted_groups, on_progress,
                          successful=f"finish_reason IN ({success})")
    return RawReport(keys, n_total, finite(span_from), finite(span_to), main, itl_rows, km, client_clock, server_clock)


@dataclass(frozen=True)
class _AdmittedGroup:
    """What the main aggregate knows of a group's admitted rows: how many, how many censored (no TTFT),
    and ``quantile_disc`` of their TTFTs at :data:`SURVIVOR_QUANTILES` (seconds; None without any)."""

    n: int
    n_censored: int
    inverse_cdf: list[float] | None


_MAX_IN_LIST = 64
"""Above this many distinct values a key column gets no ``IN`` filter in the Kaplan–Meier scan."""


def _sql_type(values: Sequence[Any]) -> str:
    """The DuckDB type of a key column, from its values (group columns are VARCHAR, windows DOUBLE)."""
    kinds = {type(v) for v in values if v is not None}
    if kinds <= {str}:
        return "VARCHAR"
    if kinds <= {float, int} and float in kinds:
        return "DOUBLE"
    if kinds == {int}:
        return "BIGINT"
    raise TypeError(f"report group keys must be text or numbers, got {sorted(k.__name__ for k in kinds)}")


def _in_list(key: str, values: Sequence[Any]) -> str | None:
    """``b.<key> IN (...)`` over the distinct text ``values``: a superset filter that DuckDB pushes into
    the scan; None for other keys (windows) or too many values."""
    distinct = set(values)
    if _sql_type(values) != "VARCHAR" or len(distinct) > _MAX_IN_LIST:
        return None
    literals = ", ".join(_text(v) for v in sorted(v for v in distinct if v is not None))
    parts = [f"b.{key} IN ({literals})"] if literals else []
    if None in distinct:
        parts.append(f"b.{key} IS NULL")
    return "(" + " OR ".join(parts) + ")"


def _censoring_aware(
    database: Database,
    base: str,
    keys: tuple[str, ...],
    admitted: dict[Key, _AdmittedGroup],
    on_progress: ProgressCallback | None,
    *,
    successful: str,
) -> dict[Key, dict[str, Any]]:
    """Each group's Kaplan–Meier TTFT row (its key columns, ``n``, ``n_events``, ``n_censored``, the
    quantiles and ``max_censored_t`` in seconds), keyed by group; groups without admitted rows are absent.

    A group without censored rows (and fewer rows than
    :func:`~llmslo.analysis.report._survival.inverse_cdf_max_n`) is answered by the main aggregate's
    ``quantile_disc``. The others, if any, get one Kaplan–Meier query by the ranking method
    (:func:`~llmslo.analysis.report._survival.km_quantiles_by_id_sql`) over their admitted rows only: the
    i-th of them gets the INTEGER id i (the window's partition key), its key values travel as the i-th
    elements of list parameters, and each text key column also filters the scan by the values it takes
    among them (a superset DuckDB pushes into the scan; the join on all keys then picks the rows).

    A database without the shortcut (ClickHouse) answers every admitted group by
    :func:`~llmslo.analysis.databases.km_quantiles_by_group_sql`: one query grouped by the keys.

    A group with censored rows also gets the survivor-bias comparison (``so_<label>``, ``s_at_<label>``,
    ``gw_at_<label>``: the success-only quantile, the survival there, Greenwood's sum there), over its rows
    where ``successful`` (SQL) holds; a group without censored rows needs none (the two estimates agree).
    """
    labels = [quantile_label(q) for q in SURVIVOR_QUANTILES]
    max_n = inverse_cdf_max_n(SURVIVOR_QUANTILES)
    shortcut = database.dialect.inverse_cdf_shortcut
    km: dict[Key, dict[str, Any]] = {}
    ranked: list[Key] = []
    for key, g in admitted.items():
        if g.n_censored or g.n >= max_n or not shortcut:
            ranked.append(key)
            continue
        quantiles = g.inverse_cdf if g.inverse_cdf is not None else [None] * len(labels)
        km[key] = {**dict(zip(keys, key, strict=True)), "n": g.n, "n_events": g.n, "n_censored": 0,
                   **dict(zip(labels, quantiles, strict=True)), "max_censored_t": None}
    if not ranked:
        return km
    if on_progress:
        on_progress("censoring-aware TTFT")
    compared = tuple(p + label for label in labels for p in COMPARISON_PREFIXES)
    fields = ("n", "n_events", "n_censored", *labels, "max_censored_t", *compared)
    if not shortcut:
        wanted = set(ranked)
        source = (f"SELECT {''.join(f'{k}, ' for k in keys)}coalesce(ttft_s, e2e_s) AS t, ttft_s IS NOT NULL AS event, "
                  f"{successful} AS success FROM ({base}) AS b WHERE {ADMITTED}")
        for r in database.rows(km_quantiles_by_group_sql(source, keys, SURVIVOR_QUANTILES, labels, success=True)):
            key = tuple(r[k] for k in keys)
            if key in wanted:
                km[key] = {**dict(zip(keys, key, strict=True)), **{c: r[c] for c in fields}}
        return km
    # group i gets id i; its key values are the i-th elements of list parameters, read over range(n) so
    # that DuckDB knows how many groups there are (with unnest(?) it guesses one, and then builds its
    # hash join on the wrong side when the ranks are read back)
    columns = [[key[i] for key in ranked] for i in range(len(keys))]
    ids = ", ".join(["CAST(_km_i AS INTEGER) AS _km_gid",
                     *(f"(CAST(? AS {_sql_type(v)}[]))[_km_i + 1] AS {k}" for k, v in zip(keys, columns, strict=True))])
    where = [f"b.{ADMITTED}", *(f for k, v in zip(keys, columns, strict=True) if (f := _in_list(k, v)))]
    source = (
        f"SELECT g._km_gid, coalesce(b.ttft_s, b.e2e_s) AS t, b.ttft_s IS NOT NULL AS event, "
        f"b.{successful} AS success "
        f"FROM ({base}) AS b JOIN _km_g AS g ON {_match(keys, 'b', 'g')} WHERE {' AND '.join(where)}"
    )
    sql = (
        f"WITH _km_g AS MATERIALIZED (SELECT {ids} FROM range({len(ranked)}) AS _km_range(_km_i)),\n"
        f"_km_res AS ({km_quantiles_by_id_sql(source, SURVIVOR_QUANTILES, success=True)})\n"
        f"SELECT _km_gid, {', '.join(fields)} FROM _km_res"
    )
    for r in database.rows(sql, columns) if columns else database.rows(sql):
        key = ranked[int(r["_km_gid"])]
        km[key] = {**dict(zip(keys, key, strict=True)), **{c: r[c] for c in fields}}
    return km
