"""Request summaries from OTLP spans: ClickHouse SQL over the OpenTelemetry Collector's ``otel_traces`` table.

A server traced by :class:`~llmslo.telemetry.RequestTracing` exports one span per request over OTLP; a
Collector with the contrib ClickHouse exporter (``exporter/clickhouseexporter``) writes every span as one row
of its traces table. :func:`otel_summary_view_statements` makes a materialized view that turns each request
span inserted there into one row of the store's :data:`~llmslo.analysis.store.SUMMARY_TABLE`, and a second
one that records every request span it could not turn into a valid summary in :data:`OTEL_REJECTED_TABLE`,
with the reason. A ClickHouse materialized view is an insert trigger: it sees the spans inserted after it
was made, never the ones stored before.

The exporter's table, as read in opentelemetry-collector-contrib (``exporter/clickhouseexporter``:
``internal/sqltemplates/traces_table.sql`` at f92a5763be13aeb59ecf6f8b47e31d54109191bb, ``traces_insert.sql`` at
61540ced55e993255df9bcfca48ed89a87d3914f, ``internal/util.go`` at 64079aac9170092935a20f1f96863317bcd98273, and the
``exporter_traces.go`` that inserts those columns with ``PrepareBatch``): one row per span; ``Timestamp``
(``DateTime64(9)``) is the span's start, ``Duration`` (``UInt64``) its end minus its start in nanoseconds;
``SpanAttributes`` and ``ResourceAttributes`` are ``Map(LowCardinality(String), String)`` filled by pdata's
``Value.AsString`` (opentelemetry-collector ``pdata/pcommon/value.go`` at daf47138592ca045540157db882ff8239f464eef):
strings as they are, integers in decimal, booleans ``true``/``false``, doubles in the shortest text that reads back
as the same double (fixed notation, exponent notation below 1e-6 and from 1e21), arrays and maps as JSON. Events are
the ``Events.Timestamp`` / ``Events.Name`` / ``Events.Attributes`` arrays. :func:`otel_traces_ddl` writes that table
(the columns and their types, without the exporter's indexes, codecs and TTL) for tests, or for a database where the
views must exist before the first Collector starts.

Which spans: the request span is the one span of a request carrying ``llmslo.request_id``; the phase
children (``llmslo.queue``, ``llmslo.prefill``, ``llmslo.decode``) and every other instrumentation's spans
carry none and give no row. How each summary column is filled (see :data:`CARRIED`):

* ``arrival_unix_s``: the span's start (``Timestamp``), whose nanoseconds the SDK rounded from the
  arrival: within one float step of the summary's (0.24 µs at today's Unix times);
* ``e2e_s``: ``Duration`` (the span ends at the terminal state), to the nanosecond;
* ``request_id``, ``model`` (``gen_ai.request.model``), ``version``, ``tenant_class``, ``finish_reason``,
  ``reject_reason``, ``error_type``, ``queue_s``, ``ttft_s``, ``client_ttft_s`` and the four token counts:
  the span's attributes (``llmslo.*``);
* ``last_token_s``, ``stream_paused_s``, ``stream_max_queued``: their attributes (``llmslo.last_token_s``, ...);
  ``itl_s``: the attribute ``llmslo.itl_s``, a list of doubles the tracing puts on the span when the telemetry
  records ITL gaps and ``RequestTracing(itl_gaps=True)`` asks for them (pdata writes a list as Go's JSON, read
  back with ``JSONExtract``); without it, no gaps
  (stored as the empty list, as the store stores every summary without gaps);
* ``backend``: the attribute ``llmslo.backend`` (a gateway's spans), else null;
* spans of an older llmslo, without those attributes: ``stream_paused_s`` and ``stream_max_queued`` are the
  contract's default ``0``, and ``last_token_s`` is rebuilt. With ``phase_spans=False`` the span's
  ``llmslo.decode.end`` event is the last token's own time, to the nanosecond; otherwise definitions.md's
  ``tpot_s = (last_token - first_token) / (generated_tokens - 1)`` solved for it, ``ttft_s + tpot_s *
  (generated_tokens - 1)`` (equal within float rounding, a few units in the last place); a reply of one token
  has its last token at its first (``last_token_s = ttft_s``); no first token, no last token (NULL);
* not in the span (see :data:`NOT_CARRIED`): ``client_e2e_s``, a figure of the client's clock, NULL as in every
  summary a server writes.

Checks: a request span becomes a summary only if the row it gives keeps every rule the store's ingest
checks (the contract's column rules, the plausible ranges and the cross-field :data:`~llmslo.telemetry.RULES`);
otherwise the view writes nothing to the summaries and the second view records the span's ids, its
``llmslo.request_id`` and the first broken rule in :data:`OTEL_REJECTED_TABLE`: a required attribute missing
(``llmslo.finish_reason``, a token count, ...), one that is no number, ``llmslo.itl_s`` that is no list of
numbers, a first token without a ``llmslo.ttft_s``, ... No span reaches the summaries as a row the contract
forbids, and none is lost unrecorded. The views do not deduplicate: a batch the Collector inserts twice (a
retried export) gives its summaries twice, as would a server sending both OTLP and the sink.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from llmslo.analysis.store._clickhouse import clickhouse_type
from llmslo.analysis.store._schema import SUMMARY_TABLE
from llmslo.analysis.store._store import StoreError
from llmslo.analysis.store._validation import ARRIVAL_MAX_AHEAD_S, ARRIVAL_MIN_UNIX_S, INTERVAL_MAX_S
from llmslo.telemetry import COLUMNS, COUNT_COLUMNS, FINISH_REASONS, INTERVAL_COLUMNS, REJECT_REASONS, RULES

__all__ = [
    "CARRIED",
    "NOT_CARRIED",
    "OTEL_REJECTED_TABLE",
    "OTEL_REJECTED_VIEW",
    "OTEL_SUMMARY_VIEW",
    "OTEL_TRACES_TABLE",
    "otel_rejected_ddl",
    "otel_summary_select",
    "otel_summary_view_sql",
    "otel_summary_view_statements",
    "otel_traces_ddl",
]

OTEL_TRACES_TABLE = "otel_traces"
"""The exporter's default ``traces_table_name``."""
OTEL_SUMMARY_VIEW = "llmslo_otel_summaries_mv"
"""The materialized view that writes a summary for each valid request span."""
OTEL_REJECTED_VIEW = "llmslo_otel_rejected_mv"
"""The materialized view that records each request span that gives no valid summary."""
OTEL_REJECTED_TABLE = "llmslo_otel_rejected"
"""Request spans that gave no summary: ``span_start`` (the span's ``Timestamp``), ``trace_id``, ``span_id``,
``span_name``, ``request_id`` (its ``llmslo.request_id``, maybe empty) and ``reason`` (the first broken rule)."""

REQUEST_SPAN_MARK = "llmslo.request_id"
"""The attribute only a request span carries (its phase children and other spans do not)."""

_TRACES_COLUMNS: tuple[tuple[str, str], ...] = (
    ("Timestamp", "DateTime64(9)"),
    ("TraceId", "String"),
    ("SpanId", "String"),
    ("ParentSpanId", "String"),
    ("TraceState", "String"),
    ("SpanName", "LowCardinality(String)"),
    ("SpanKind", "LowCardinality(String)"),
    ("ServiceName", "LowCardinality(String)"),
    ("ResourceAttributes", "Map(LowCardinality(String), String)"),
    ("ScopeName", "String"),
    ("ScopeVersion", "String"),
    ("SpanAttributes", "Map(LowCardinality(String), String)"),
    ("Duration", "UInt64"),
    ("StatusCode", "LowCardinality(String)"),
    ("StatusMessage", "String"),
    ("Events", "Nested(Timestamp DateTime64(9), Name LowCardinality(String), "
               "Attributes Map(LowCardinality(String), String))"),
    ("Links", "Nested(TraceId String, SpanId String, TraceState String, "
              "Attributes Map(LowCardinality(String), String))"),
)
"""The exporter's traces columns and their ClickHouse types, in its order."""

_STRINGS: Mapping[str, str] = {
    "request_id": "llmslo.request_id",
    "model": "gen_ai.request.model",
    "version": "llmslo.version",
    "tenant_class": "llmslo.tenant_class",
    "finish_reason": "llmslo.finish_reason",
    "reject_reason": "llmslo.reject_reason",
    "error_type": "llmslo.error_type",
}
_FLOATS: Mapping[str, str] = {"queue_s": "llmslo.queue_s", "ttft_s": "llmslo.ttft_s",
                              "client_ttft_s": "llmslo.client_ttft_s"}
_INTS: Mapping[str, str] = {c: f"llmslo.{c}" for c in
                            ("prompt_tokens", "proposed_tokens", "generated_tokens", "sent_tokens")}
_TPOT = "llmslo.tpot_s"
_DECODE_END = "llmslo.decode.end"
_LAST_TOKEN = "llmslo.last_token_s"
_PAUSED = "llmslo.stream_paused_s"
_QUEUED = "llmslo.stream_max_queued"
_BACKEND = "llmslo.backend"
_ITL = "llmslo.itl_s"

CARRIED: Mapping[str, str] = {
    **_STRINGS, **_FLOATS, **_INTS,
    "arrival_unix_s": "the span's start (Timestamp)",
    "e2e_s": "the span's Duration",
    "last_token_s": f"{_LAST_TOKEN}; without it (spans of an older llmslo) the {_DECODE_END} event, or "
                    f"{_FLOATS['ttft_s']} + {_TPOT} * (generated_tokens - 1)",
    "stream_paused_s": f"{_PAUSED} (without it: 0, the contract's default)",
    "stream_max_queued": f"{_QUEUED} (without it: 0, the contract's default)",
    "itl_s": f"{_ITL}, a list of doubles, with record_itl and itl_gaps=True (without it: [], no gaps)",
    "backend": f"{_BACKEND}, on a gateway's spans (without it: NULL)",
}
"""Each summary column the span carries, and where it is read from."""
NOT_CARRIED: Mapping[str, str] = {
    "client_e2e_s": "NULL (a figure of the client's clock: a server's summaries have none either)",
}
"""Each summary column the span does not carry, and what the view writes instead."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _table(name: str, field: str) -> str:
    """``name`` (``table`` or ``database.table``) quoted for ClickHouse; :class:`StoreError` when it is none."""
    parts = name.split(".") if isinstance(name, str) else [""]
    if not 1 <= len(parts) <= 2 or not all(_NAME.fullmatch(p) for p in parts):
        raise StoreError(f"{field}: {name!r} is no table name; give NAME or DATABASE.NAME (letters, digits, _)")
    return ".".join(f"`{p}`" for p in parts)


def _text(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _attr(key: str) -> str:
    return f"SpanAttributes[{_text(key)}]"


def _has(key: str) -> str:
    return f"mapContains(SpanAttributes, {_text(key)})"


def _float(key: str) -> str:
    """The attribute as a double, NULL when absent or no number."""
    return f"if({_has(key)}, toFloat64OrNull({_attr(key)}), NULL)"


def _last_token_sql() -> str:
    """``last_token_s`` (see the module docstring): its attribute; without it the decode end event inside the span,
    else from TTFT and TPOT."""
    return (f"multiIf({_has(_LAST_TOKEN)}, last_token_attr, ttft_s IS NULL, NULL, decode_end_ns BETWEEN 0 AND "
            "Duration, decode_end_ns / 1e9, generated_tokens = 1, ttft_s, generated_tokens > 1, "
            "ttft_s + tpot_s * (generated_tokens - 1), NULL)")


def _helpers() -> dict[str, str]:
    """Columns the summary columns are computed from: the TPOT and last-token attributes and the decode end
    event's offset from the span's start (nanoseconds; NULL without the event)."""
    event = f"indexOf(Events.Name, {_text(_DECODE_END)})"
    return {"tpot_s": _float(_TPOT), "last_token_attr": _float(_LAST_TOKEN),
            "decode_end_ns": f"if({event} > 0, toUnixTimestamp64Nano(Events.Timestamp[{event}]) - "
                             "toUnixTimestamp64Nano(Timestamp), NULL)"}


def _values() -> dict[str, str]:
    """The SQL of every summary column over one span row of the traces table."""
    out = {c: f"if({_has(k)}, {_attr(k)}, NULL)" if c in ("reject_reason", "error_type") else _attr(k)
           for c, k in _STRINGS.items()}
    out.update({c: _float(k) for c, k in _FLOATS.items()})
    out.update({c: f"toInt64OrNull({_attr(k)})" for c, k in _INTS.items()})
    proposed = _INTS["proposed_tokens"]
    out["proposed_tokens"] = f"if({_has(proposed)}, toInt64OrNull({_attr(proposed)}), 0)"  # absent: the default
    out["arrival_unix_s"] = "toUnixTimestamp64Nano(Timestamp) / 1e9"
    out["e2e_s"] = "toFloat64(Duration) / 1e9"
    out["last_token_s"] = _last_token_sql()
    out["client_e2e_s"] = "NULL"
    out["stream_paused_s"] = f"if({_has(_PAUSED)}, toFloat64OrNull({_attr(_PAUSED)}), 0.0)"
    out["stream_max_queued"] = f"if({_has(_QUEUED)}, toInt64OrNull({_attr(_QUEUED)}), 0)"
    out["itl_s"] = f"if({_has(_ITL)}, JSONExtract({_attr(_ITL)}, 'Array(Float64)'), CAST([], 'Array(Float64)'))"
    out["backend"] = f"if({_has(_BACKEND)}, {_attr(_BACKEND)}, NULL)"  # only a gateway's spans carry one
    missing = [c.name for c in COLUMNS if c.name not in out]
    assert not missing, f"summary columns without a source in the span: {missing}"
    return out


def _checks() -> list[tuple[str, str]]:
    """``(condition, reason)`` for every rule a span's row can break, true when broken; the reason names the rule
    and the attribute. Conditions are over the columns of :func:`_values` (NULL counts as not broken)."""
    out: list[tuple[str, str]] = []
    for column, key in _STRINGS.items():
        if column not in ("reject_reason", "error_type"):
            out.append((f"{column} = ''", f"missing: attribute {key} is missing or empty (summary column {column})"))
    for column, key in {**_INTS, "stream_max_queued": _QUEUED}.items():
        what = "not an integer" if column in ("proposed_tokens", "stream_max_queued") else "missing or not an integer"
        out.append((f"{column} IS NULL", f"type: attribute {key} is {what} (summary column {column})"))
    for key in (*_FLOATS.values(), _TPOT, _LAST_TOKEN, _PAUSED):
        out.append((f"{_has(key)} AND NOT coalesce(isFinite(toFloat64OrNull({_attr(key)})), 0)",
                    f"type: attribute {key} is not a finite number"))
    numbers = "('Int64', 'UInt64', 'Double')"
    out.append((f"{_has(_ITL)} AND NOT (JSONType({_attr(_ITL)}) = 'Array' AND arrayAll(g -> JSONType(g) IN "
                f"{numbers}, JSONExtractArrayRaw({_attr(_ITL)})))",
                f"type: attribute {_ITL} is not a list of numbers (summary column itl_s)"))
    out.append((f"finish_reason NOT IN ({', '.join(map(_text, FINISH_REASONS))})",
                f"not_allowed: attribute {_STRINGS['finish_reason']} must be one of: {', '.join(FINISH_REASONS)}"))
    out.append((f"reject_reason IS NOT NULL AND reject_reason NOT IN ({', '.join(map(_text, REJECT_REASONS))})",
                f"not_allowed: attribute {_STRINGS['reject_reason']} must be one of: {', '.join(REJECT_REASONS)}"))
    out.append((f"arrival_unix_s < {ARRIVAL_MIN_UNIX_S!r} OR arrival_unix_s > toUnixTimestamp(now()) + "
                f"{ARRIVAL_MAX_AHEAD_S!r}", "implausible_arrival: the span starts before 1970 or more than a day "
                                            "after now (Timestamp)"))
    for column in (c.name for c in COLUMNS if c.kind in ("float", "int") and c.name not in NOT_CARRIED):
        if column in INTERVAL_COLUMNS or column in COUNT_COLUMNS:
            out.append((f"coalesce({column} < 0, 0)", f"negative: {column} must be >= 0"))
        if column in INTERVAL_COLUMNS:
            out.append((f"coalesce({column} > {INTERVAL_MAX_S!r}, 0)",
                        f"interval_too_long: {column} must be at most {INTERVAL_MAX_S:,.0f} s (30 days)"))
    out.append((f"arrayExists(g -> g > {INTERVAL_MAX_S!r}, itl_s)",
                 f"interval_too_long: every itl_s gap must be at most {INTERVAL_MAX_S:,.0f} s (30 days)"))
    for rule in RULES:
        # the one rule over the gaps is DuckDB's list SQL: ClickHouse writes it with its array functions
        sql = "arrayExists(g -> NOT (isFinite(g) AND g >= 0), itl_s)" if rule.name == "negative_itl" else rule.sql
        assert "itl_s" not in sql or rule.name == "negative_itl", f"rule {rule.name}: no ClickHouse form of its SQL"
        out.append((f"coalesce(({sql}), 0)", f"{rule.name}: {rule.message}"))
    return out


def _source(traces: str) -> str:
    """The request spans of ``traces`` with every summary column and ``llmslo_violation`` (empty when valid)."""
    cols = ",\n    ".join(f"{sql} AS {name}" for name, sql in {**_helpers(), **_values()}.items())
    checks = "".join(f"\n      {cond}, {_text(reason)}," for cond, reason in _checks())
    return (f"SELECT Timestamp AS span_start, TraceId AS trace_id, SpanId AS span_id, SpanName AS span_name,\n"
            f"    {cols},\n    multiIf({checks}\n      '') AS llmslo_violation\n"
            f"  FROM {traces} WHERE {_has(REQUEST_SPAN_MARK)}")


def otel_summary_select(traces_table: str = OTEL_TRACES_TABLE) -> str:
    """The ``SELECT`` of the summaries view alone: one row per valid request span of ``traces_table``, the
    contract's columns in its order and types. Run it as ``INSERT INTO request_summaries <it>`` to load spans
    stored before the view existed (once: the views never deduplicate)."""
    traces = _table(traces_table, "traces_table")
    cols = ",\n  ".join(
        f"CAST({c.name if c.nullable else f'assumeNotNull({c.name})'} AS {clickhouse_type(c)}) AS {c.name}"
        for c in COLUMNS)
    return f"SELECT\n  {cols}\nFROM (\n  {_source(traces)}\n) WHERE llmslo_violation = ''"


def otel_rejected_ddl(table: str = OTEL_REJECTED_TABLE) -> str:
    """``CREATE TABLE`` of the rejected request spans (see :data:`OTEL_REJECTED_TABLE`), partitioned by day."""
    return (f"CREATE TABLE IF NOT EXISTS {_table(table, 'rejected_table')} (\n"
            "  span_start DateTime64(9),\n  trace_id String,\n  span_id String,\n"
            "  span_name LowCardinality(String),\n  request_id String,\n  reason String\n"
            ") ENGINE = MergeTree\nPARTITION BY toDate(span_start)\nORDER BY span_start")


def otel_summary_view_statements(traces_table: str = OTEL_TRACES_TABLE, summary_table: str = SUMMARY_TABLE,
                                 rejected_table: str = OTEL_REJECTED_TABLE) -> tuple[str, str, str]:
    """The three statements to run, in order, one at a time: the rejected spans' table, the summaries view
    (``TO summary_table``) and the rejected spans' view, both over ``traces_table``. Names are ``NAME`` or
    ``DATABASE.NAME``; both tables must exist (the store's, and the exporter's or :func:`otel_traces_ddl`'s),
    and the views are made in the session's current database. Raises :class:`StoreError` for a bad name.

    Example::

        with ClickHouseStore.open("http://clickhouse:8123?database=llmslo") as store:
            for statement in otel_summary_view_statements("otel.otel_traces"):
                store.client.command(statement)
    """
    traces = _table(traces_table, "traces_table")
    summaries = _table(summary_table, "summary_table")
    rejected = _table(rejected_table, "rejected_table")
    summary_view = (f"CREATE MATERIALIZED VIEW IF NOT EXISTS `{OTEL_SUMMARY_VIEW}` TO {summaries} AS\n"
                    f"{otel_summary_select(traces_table)}")
    rejected_view = (f"CREATE MATERIALIZED VIEW IF NOT EXISTS `{OTEL_REJECTED_VIEW}` TO {rejected} AS\n"
                     "SELECT span_start, trace_id, span_id, span_name, request_id, llmslo_violation AS reason\n"
                     f"FROM (\n  {_source(traces)}\n) WHERE llmslo_violation != ''")
    return otel_rejected_ddl(rejected_table), summary_view, rejected_view


def otel_summary_view_sql(traces_table: str = OTEL_TRACES_TABLE, summary_table: str = SUMMARY_TABLE,
                          rejected_table: str = OTEL_REJECTED_TABLE) -> str:
    """:func:`otel_summary_view_statements` as one script (each statement ends with ``;``), for
    ``clickhouse-client --multiquery``.

    Example::

        python -c "from llmslo.analysis.store import otel_summary_view_sql; print(otel_summary_view_sql())"
    """
    return "".join(f"{s};\n\n" for s in otel_summary_view_statements(traces_table, summary_table, rejected_table))


def otel_traces_ddl(table: str = OTEL_TRACES_TABLE) -> str:
    """``CREATE TABLE`` of the exporter's traces table: its columns and types (module docstring), ``MergeTree``
    partitioned by the span's day as the exporter's; without its indexes, codecs and TTL."""
    cols = ",\n  ".join(f"{name} {kind}" for name, kind in _TRACES_COLUMNS)
    return (f"CREATE TABLE IF NOT EXISTS {_table(table, 'traces_table')} (\n  {cols}\n) ENGINE = MergeTree\n"
            "PARTITION BY toDate(Timestamp)\nORDER BY (ServiceName, SpanName, toDateTime(Timestamp))")
