"""Request summaries over OTLP: ``RequestTracing`` spans, written as the Collector's ClickHouse exporter writes
them, become ``request_summaries`` rows through the materialized views of ``otel_summary_view_statements``.

No OpenTelemetry Collector runs here. What stands in for it: the SDK's own OTLP encoder turns the finished spans
into the ``ExportTraceServiceRequest`` a Collector's OTLP receiver decodes, and :func:`exporter_rows` turns that
message into the ``otel_traces`` rows the contrib ClickHouse exporter would insert, following its code
(``exporter_traces.go`` ``pushTraceData``: one row per span, ``Timestamp`` the start, ``Duration`` end minus
start in ns; ``internal/util.go`` ``AttributesToMap``: each attribute value through pdata's
``Value.AsString``). Everything after that (the table, the views, the summaries, the report) is ClickHouse
itself, embedded by chdb.
"""

from __future__ import annotations

import importlib.util
import json
import math
import random
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from llmslo.analysis import GoodputPolicy, ReportSpec, Store, build_report
from llmslo.analysis.store import (
    OTEL_REJECTED_TABLE,
    SUMMARY_TABLE,
    ClickHouseStore,
    StoreError,
    arrow_schema,
    otel_summary_select,
    otel_summary_view_sql,
    otel_summary_view_statements,
    otel_traces_ddl,
)
from llmslo.analysis.store._clickhouse_otel import CARRIED, NOT_CARRIED
from llmslo.telemetry import COLUMN_NAMES, COLUMNS, RequestTracing, SendQueue, StreamPolicy, Telemetry
from llmslo.tests._tools import need

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

BASE_UNIX_S = 1_748_736_000.0
"""2025-06-01T00:00:00Z, the wall clock of the fake telemetry at its monotonic zero (in the past: the views
refuse an arrival more than a day ahead of their clock)."""
PHASE_SPANS = ("llmslo.queue", "llmslo.prefill", "llmslo.decode")

# ---- the Collector's part, as its code does it ------------------------------------------------------------


def _go_float(f: float) -> str:
    """pdata's ``float64AsString``: the shortest text that reads back as ``f``, fixed notation unless
    ``|f| < 1e-6`` or ``|f| >= 1e21`` (then exponent notation with no leading zero in the exponent)."""
    if math.isinf(f) or math.isnan(f):
        return f"json: unsupported value: {'NaN' if math.isnan(f) else ('+Inf' if f > 0 else '-Inf')}"
    if f != 0 and (abs(f) < 1e-6 or abs(f) >= 1e21):
        mantissa, exponent = repr(f).split("e")
        return f"{mantissa}e{exponent[0]}{int(exponent[1:])}"  # Go's 'e' -1 writes at least two exponent digits
    text = format(Decimal(repr(f)), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _go_json(raw: Any) -> str:
    """Go's ``json.Marshal`` of a slice or map from ``AsRaw``: compact, map keys sorted, ``<>&`` escaped."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):
            return _go_float(v)
        if isinstance(v, int):
            return str(v)
        if isinstance(v, list):
            return "[" + ",".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ",".join(f"{value(k)}:{value(v[k])}" for k in sorted(v)) + "}"
        if v is None:
            return "null"
        text = json.dumps(str(v), ensure_ascii=False)
        for ch, code in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                         ("\u2029", "\\u2029")):
            text = text.replace(ch, code)
        return text

    return value(raw)


def _raw(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_raw(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _raw(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


def as_string(v: AnyValue) -> str:
    """pdata's ``Value.AsString``: strings as they are, ints in decimal, bools ``true``/``false``, doubles by
    :func:`_go_float`, bytes in base64, arrays and maps as Go's JSON."""
    kind = v.WhichOneof("value")
    if kind is None:
        return ""
    if kind == "string_value":
        return v.string_value
    if kind == "bool_value":
        return "true" if v.bool_value else "false"
    if kind == "double_value":
        return _go_float(v.double_value)
    if kind == "int_value":
        return str(v.int_value)
    if kind == "bytes_value":
        import base64
        return base64.b64encode(v.bytes_value).decode()
    return _go_json(_raw(v))


def _attrs(kvs: Any) -> dict[str, str]:
    return {kv.key: as_string(kv.value) for kv in kvs}


_KINDS = {ProtoSpan.SPAN_KIND_UNSPECIFIED: "Unspecified", ProtoSpan.SPAN_KIND_INTERNAL: "Internal",
          ProtoSpan.SPAN_KIND_SERVER: "Server", ProtoSpan.SPAN_KIND_CLIENT: "Client",
          ProtoSpan.SPAN_KIND_PRODUCER: "Producer", ProtoSpan.SPAN_KIND_CONSUMER: "Consumer"}
_STATUS = {0: "Unset", 1: "Ok", 2: "Error"}


def exporter_rows(spans: Any) -> list[dict[str, Any]]:
    """The ``otel_traces`` rows the exporter writes for finished SDK spans, through their OTLP message."""
    request = encode_spans(spans)
    rows = []
    for rs in request.resource_spans:
        resource = _attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                rows.append({
                    "Timestamp": s.start_time_unix_nano, "TraceId": s.trace_id.hex(), "SpanId": s.span_id.hex(),
                    "ParentSpanId": s.parent_span_id.hex(), "TraceState": s.trace_state, "SpanName": s.name,
                    "SpanKind": _KINDS[s.kind], "ServiceName": resource.get("service.name", ""),
                    "ResourceAttributes": resource, "ScopeName": ss.scope.name, "ScopeVersion": ss.scope.version,
                    "SpanAttributes": _attrs(s.attributes),
                    "Duration": (s.end_time_unix_nano - s.start_time_unix_nano) % 2**64,
                    "StatusCode": _STATUS[s.status.code], "StatusMessage": s.status.message,
                    "Events.Timestamp": [e.time_unix_nano for e in s.events],
                    "Events.Name": [e.name for e in s.events],
                    "Events.Attributes": [_attrs(e.attributes) for e in s.events],
                    "Links.TraceId": [ln.trace_id.hex() for ln in s.links],
                    "Links.SpanId": [ln.span_id.hex() for ln in s.links],
                    "Links.TraceState": [ln.trace_state for ln in s.links],
                    "Links.Attributes": [_attrs(ln.attributes) for ln in s.links],
                })
    return rows


def _lit(value: Any, column: str) -> str:
    if column.endswith("Timestamp"):
        if isinstance(value, list):
            return "[" + ", ".join(_lit(v, column) for v in value) + "]"
        return f"fromUnixTimestamp64Nano(toInt64({int(value)}))"
    if isinstance(value, dict):
        return "map(" + ", ".join(f"{_lit(k, '')}, {_lit(v, '')}" for k, v in value.items()) + ")"
    if isinstance(value, list):
        return "[" + ", ".join(_lit(v, column) for v in value) + "]"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def insert_spans(store: ClickHouseStore, rows: list[dict[str, Any]], table: str = "otel_traces") -> None:
    """One ``INSERT`` of the rows into the traces table (the exporter sends a batch as one insert)."""
    names = list(rows[0])
    values = ",\n".join("(" + ", ".join(_lit(r[n], n) for n in names) + ")" for r in rows)
    store.client.command(f"INSERT INTO {table} ({', '.join(f'`{n}`' for n in names)}) VALUES {values}")


# ---- the server's part: real telemetry over a fake clock ------------------------------------------------------


class Clock:
    """A monotonic clock in ns that moves only when told; the wall clock follows it from :data:`BASE_UNIX_S`."""

    def __init__(self) -> None:
        self.ns = 3_000_000_000_017

    def __call__(self) -> int:
        return self.ns

    def wall(self) -> float:
        return BASE_UNIX_S + 0.123456789 + (self.ns - 3_000_000_000_017) / 1e9

    def advance(self, ns: int) -> None:
        self.ns += ns


class Traced:
    """A telemetry whose spans go to memory and whose summaries go to a list."""

    def __init__(self, *, phase_spans: bool = True) -> None:
        self.clock = Clock()
        self.spans = InMemorySpanExporter()
        self.provider = TracerProvider(resource=Resource.create({"service.name": "llm-server"}))
        self.provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.summaries: list[dict[str, Any]] = []
        self.tel = Telemetry(tracing=RequestTracing(tracer_provider=self.provider, metrics=False,
                                                    phase_spans=phase_spans, server_address="llm.example.com",
                                                    server_port=443, itl_gaps=True),
                             sink=self.summaries.append, version="v7", clock_ns=self.clock,
                             clock_unix_s=self.clock.wall, record_itl=True)

    def serve(self) -> None:
        """Requests of every shape the lifecycle records (streamed, one token, a multi-token commit, speculative
        decoding, failed, rejected, cancelled before a token, a deadline in the queue, backpressure), some under
        an HTTP server span of another instrumentation, as in a real server."""
        tel, step = self.tel, self.clock.advance
        http = self.provider.get_tracer("http.server")
        with http.start_as_current_span("POST /v1/chat/completions", attributes={"http.route": "/v1/chat"}):
            t = tel.start("r01-stream", model="llama-3-8b", tenant_class="interactive", prompt_tokens=17)
            step(1_234_567)
            t.admit()
            step(3_141_593)
            t.schedule()
            for gap in (87_654_321, 12_345_678, 9_876_543, 11_111_111, 13_579_135, 10_101_010):
                step(gap)
                t.commit()
                t.send()
            t.report_client_ttft(0.1015873)
            step(777_777)
            t.finish("stop")
        t = tel.start("r02-one-token", model="llama-3-8b", prompt_tokens=3)
        t.admit()
        step(2_000_003)
        t.schedule()
        step(45_678_901)
        t.commit()
        t.send()
        step(1_000_001)
        t.finish("length")
        t = tel.start("r03-one-commit", model="mistral-7b", version="v8", tenant_class="batch", prompt_tokens=40)
        t.schedule()
        step(66_666_667)
        t.commit(4)
        t.send(4)
        step(3_333_333)
        t.finish("stop")
        t = tel.start("r04-speculative", model="mistral-7b", version="v8", prompt_tokens=9)
        t.schedule()
        for gap in (55_555_555, 20_202_021, 19_191_919):
            step(gap)
            t.commit(2, proposed=3)
            t.send(2)
        t.finish("stop")
        with http.start_as_current_span("POST /v1/chat/completions"):
            t = tel.start("r05-error", model="llama-3-8b", prompt_tokens=5)
            t.schedule()
            step(70_000_001)
            t.commit()
            step(5_000_003)
            t.finish("error", error_type="EngineCrash")
        step(999_999)
        tel.start("r06-rejected", model="llama-3-8b", prompt_tokens=11).reject("rate_limited")
        t = tel.start("r07-cancel", model="llama-3-8b", prompt_tokens=2)
        t.admit()
        t.schedule()
        step(250_000_017)
        t.finish("client_cancel")
        t = tel.start("r08-deadline-queued", model="llama-3-8b", tenant_class="batch", prompt_tokens=8)
        t.admit()
        step(2_000_000_011)
        t.finish("deadline")
        t = tel.start("r09-backpressure", model="llama-3-8b", prompt_tokens=30)
        t.schedule()
        queue: SendQueue[str] = SendQueue(t, StreamPolicy(capacity=8))
        for gap in (33_333_333, 8_888_889, 8_765_432, 9_012_345, 8_000_009):
            step(gap)
            t.commit()
            queue.put("chunk")  # the transport takes none: the queue deepens to 5
        t.stream_paused_ns += 4_321_987  # what SendQueue.wait_credit adds when the producer waited for credit
        t.send(3)
        step(123_457)
        t.finish("server_draining")

    def rows(self) -> list[dict[str, Any]]:
        return exporter_rows(self.spans.get_finished_spans())


# ---- the store --------------------------------------------------------------------------------------------------


@pytest.fixture
def store() -> Iterator[ClickHouseStore]:
    """A fresh ClickHouse store (chdb) with the exporter's traces table and the views applied."""
    need(None if importlib.util.find_spec("chdb") else "chdb is not installed (pip install chdb)")
    from llmslo.tests._databases_support import fresh_clickhouse

    with fresh_clickhouse() as ch:
        ch.client.command(otel_traces_ddl())
        for statement in otel_summary_view_statements():
            ch.client.command(statement)
        yield ch


def _stored(store: ClickHouseStore) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = store.client.query_arrow(
        f"SELECT {', '.join(COLUMN_NAMES)} FROM {SUMMARY_TABLE} ORDER BY request_id").to_pylist()
    return rows


def _rejected(store: ClickHouseStore) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = store.client.query_arrow(
        f"SELECT request_id, span_name, reason FROM {OTEL_REJECTED_TABLE} ORDER BY request_id").to_pylist()
    return rows


def _expected(summary: dict[str, Any]) -> dict[str, Any]:
    """A sink summary as the store holds it: absent columns at the contract's default, no gaps as []."""
    row = {c.name: summary.get(c.name, c.default) for c in COLUMNS}
    row["itl_s"] = row["itl_s"] or []
    return row


def _mismatches(want: dict[str, Any], got: dict[str, Any], rebuilt: bool = False) -> list[str]:
    """Where a stored summary differs from the sink's: exact, but for ``arrival_unix_s``, the span's start in ns,
    rounded from the arrival: within one float step. The attribute figures (``ttft_s``, ``last_token_s``, the
    ITL gaps, ...) travel as Go's shortest text, which reads back exactly; ``e2e_s`` is the span's duration in
    ns, exact too. ``rebuilt``: spans without ``llmslo.last_token_s`` (an older llmslo), whose last token the
    view rebuilds from TTFT and TPOT: within 1e-12 relative."""
    out = []
    for name in COLUMN_NAMES:
        w, g = want[name], got[name]
        if name == "arrival_unix_s":
            ok = abs(w - g) <= math.ulp(w)
        elif rebuilt and name == "last_token_s" and w is not None and g is not None:
            ok = math.isclose(w, g, rel_tol=1e-12, abs_tol=0)
        else:
            ok = type(w) is type(g) and w == g
        if not ok:
            out.append(f"{want['request_id']}.{name}: summary {w!r}, from the span {g!r}")
    return out


# ---- the tests ----------------------------------------------------------------------------------------------------


def test_request_spans_become_the_summaries_the_sink_got_field_by_field(store: ClickHouseStore) -> None:
    traced = Traced()
    traced.serve()
    rows = traced.rows()
    insert_spans(store, rows)
    stored = _stored(store)
    want = sorted((_expected(s) for s in traced.summaries), key=lambda r: r["request_id"])
    assert [r["request_id"] for r in stored] == [r["request_id"] for r in want]
    problems = [p for w, g in zip(want, stored, strict=True) for p in _mismatches(w, g)]
    assert not problems, "\n".join(problems)
    assert _rejected(store) == []
    # the route carries these figures for real: none of them is a default the view put in
    assert {r["finish_reason"] for r in stored} == {"stop", "length", "error", "rejected", "client_cancel",
                                                    "deadline", "server_draining"}
    assert {(r["model"], r["version"]) for r in stored} == {("llama-3-8b", "v7"), ("mistral-7b", "v8")}
    assert any(r["client_ttft_s"] is not None for r in stored) and any(r["proposed_tokens"] > 0 for r in stored)
    assert any(r["sent_tokens"] < r["generated_tokens"] for r in stored)
    assert any(len(r["itl_s"]) > 2 for r in stored) and any(r["stream_max_queued"] == 5 for r in stored)
    assert any(r["stream_paused_s"] > 0 for r in stored)


OLDER_ATTRIBUTES = ("llmslo.last_token_s", "llmslo.stream_paused_s", "llmslo.stream_max_queued", "llmslo.itl_s")
"""The attributes the request spans of an older llmslo did not carry yet."""


@pytest.mark.parametrize("phase_spans", [True, False])
def test_spans_without_the_last_token_and_stream_attributes_still_give_their_summaries(
        store: ClickHouseStore, phase_spans: bool) -> None:
    traced = Traced(phase_spans=phase_spans)
    traced.serve()
    rows = [{**r, "SpanAttributes": {k: v for k, v in r["SpanAttributes"].items() if k not in OLDER_ATTRIBUTES}}
            for r in traced.rows()]
    insert_spans(store, rows)
    stored = _stored(store)
    want = sorted(({**_expected(s), "stream_paused_s": 0.0, "stream_max_queued": 0, "itl_s": []}
                   for s in traced.summaries), key=lambda r: r["request_id"])
    # the last token is rebuilt from TTFT and TPOT, or with phase_spans=False read from the decode end event
    problems = [p for w, g in zip(want, stored, strict=True) for p in _mismatches(w, g, rebuilt=phase_spans)]
    assert not problems, "\n".join(problems)
    assert _rejected(store) == []
    rebuilt = [r for r in stored if r["generated_tokens"] > 1]
    assert rebuilt and all(r["last_token_s"] is not None for r in rebuilt)


def test_phase_children_and_other_instrumentations_spans_give_no_summary(store: ClickHouseStore) -> None:
    traced = Traced()
    traced.serve()
    rows = traced.rows()
    names = [r["SpanName"] for r in rows]
    assert set(PHASE_SPANS) <= set(names) and "POST /v1/chat/completions" in names  # they are in the batch
    insert_spans(store, rows)
    (n_spans,) = store.client.query_arrow("SELECT count() AS n FROM otel_traces").column("n").to_pylist()
    assert n_spans == len(rows)
    assert store.count() == len(traced.summaries) == 9
    assert _rejected(store) == []


def test_the_report_over_the_otlp_summaries_equals_the_report_over_the_sinks(
        store: ClickHouseStore, tmp_path: Path) -> None:
    from llmslo.analysis.databases import ClickHouseDatabase

    traced = Traced()
    traced.serve()
    insert_spans(store, traced.rows())
    spec = ReportSpec(GoodputPolicy(ttft_s=0.1, tpot_s=0.015), by=("model", "version"))
    from_spans = build_report(ClickHouseDatabase(store), spec).to_dict()
    with Store.open(tmp_path / "sink.duckdb") as duck:
        frame = pa.Table.from_pylist([{c.name: s.get(c.name, c.default) for c in COLUMNS} for s in traced.summaries],
                                     schema=arrow_schema())
        duck.ingest_frame(frame)
        from_sink = build_report(duck.con, spec).to_dict()
    problems = _differences(from_sink, from_spans)
    assert not problems, "\n".join(problems)
    assert from_spans["totals"]["attempted"] == 9 and len(from_spans["groups"]) == 2


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two reports differ: exact but for floats, within 1e-6 relative (the arrivals move by up to one
    float step, 0.24 µs, so rates over a span of seconds move by about 1e-7)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a for d in _differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} vs {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        return [] if math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9) else [f"{path}: {a!r} vs {b!r}"]
    return [] if a == b and type(a) is type(b) else [f"{path}: {a!r} vs {b!r}"]


def test_without_phase_spans_the_decode_end_event_gives_the_last_token_to_the_nanosecond(
        store: ClickHouseStore) -> None:
    traced = Traced(phase_spans=False)
    traced.serve()
    rows = traced.rows()
    assert not set(PHASE_SPANS) & {r["SpanName"] for r in rows}
    insert_spans(store, rows)
    got = {r["request_id"]: r["last_token_s"] for r in _stored(store)}
    want = {s["request_id"]: s["last_token_s"] for s in traced.summaries}
    assert got == want  # exactly: both are the same nanoseconds divided by 1e9
    assert sum(v is not None for v in want.values()) == 6


def _without(key: str) -> Any:
    return lambda row: {**row, "SpanAttributes": {k: v for k, v in row["SpanAttributes"].items() if k != key}}


def _with(key: str, value: str) -> Any:
    return lambda row: {**row, "SpanAttributes": {**row["SpanAttributes"], key: value}}


def _later(days: int) -> Any:
    return lambda row: {**row, "Timestamp": row["Timestamp"] + days * 86_400 * 10**9}


@pytest.mark.parametrize(("request_id", "change", "rule"), [
    ("r01-stream", _without("llmslo.finish_reason"),
     "missing: attribute llmslo.finish_reason is missing or empty"),
    ("r01-stream", _without("gen_ai.request.model"), "missing: attribute gen_ai.request.model is missing"),
    ("r02-one-token", _without("llmslo.generated_tokens"),
     "type: attribute llmslo.generated_tokens is missing or not an integer"),
    ("r03-one-commit", _with("llmslo.prompt_tokens", "12.5"), "type: attribute llmslo.prompt_tokens"),
    ("r01-stream", _without("llmslo.ttft_s"), "token_without_ttft:"),
    ("r01-stream", _with("llmslo.last_token_s", "0.001"), "ttft_after_last_token:"),
    ("r01-stream", _with("llmslo.last_token_s", "twelve"), "type: attribute llmslo.last_token_s is not a finite"),
    ("r01-stream", _with("llmslo.itl_s", "[0.01,-0.5]"), "negative_itl:"),
    ("r01-stream", _with("llmslo.itl_s", "[0.01,3000000]"), "interval_too_long: every itl_s gap"),
    ("r01-stream", _with("llmslo.itl_s", '[0.01,"a"]'), "type: attribute llmslo.itl_s is not a list of numbers"),
    ("r01-stream", _with("llmslo.itl_s", "json: unsupported value: NaN"), "type: attribute llmslo.itl_s"),
    ("r09-backpressure", _with("llmslo.stream_max_queued", "2.5"),
     "type: attribute llmslo.stream_max_queued is not an integer"),
    ("r09-backpressure", _with("llmslo.stream_paused_s", "-1"), "negative: stream_paused_s must be >= 0"),
    ("r05-error", _with("llmslo.ttft_s", "json: unsupported value: +Inf"),
     "type: attribute llmslo.ttft_s is not a finite number"),
    ("r05-error", _with("llmslo.queue_s", "-0.5"), "negative: queue_s must be >= 0"),
    ("r06-rejected", _without("llmslo.reject_reason"), "rejected_without_reason:"),
    ("r06-rejected", _with("llmslo.reject_reason", "overloaded"), "not_allowed: attribute llmslo.reject_reason"),
    ("r07-cancel", _with("llmslo.finish_reason", "cancelled"), "not_allowed: attribute llmslo.finish_reason"),
    ("r09-backpressure", _with("llmslo.sent_tokens", "9"), "sent_exceeds_generated:"),
    ("r08-deadline-queued", _later(3650), "implausible_arrival:"),
])
def test_a_request_span_that_breaks_the_contract_gives_no_summary_and_is_recorded_with_the_rule(
        store: ClickHouseStore, request_id: str, change: Any, rule: str) -> None:
    traced = Traced()
    traced.serve()
    rows = [change(r) if r["SpanAttributes"].get("llmslo.request_id") == request_id else r for r in traced.rows()]
    insert_spans(store, rows)
    stored = {r["request_id"] for r in _stored(store)}
    assert stored == {s["request_id"] for s in traced.summaries} - {request_id}  # the others still arrive
    (rejected,) = _rejected(store)
    assert rejected["request_id"] == request_id and rejected["span_name"].startswith("chat ")
    assert rejected["reason"].startswith(rule), rejected["reason"]


def test_spans_stored_before_the_views_load_with_the_views_select(store: ClickHouseStore) -> None:
    traced = Traced()
    traced.serve()
    store.client.command("CREATE TABLE early_traces AS otel_traces")
    insert_spans(store, traced.rows(), table="early_traces")
    assert store.count() == 0  # the views watch otel_traces only, and only what is inserted after them
    store.client.command(f"INSERT INTO {SUMMARY_TABLE} {otel_summary_select('early_traces')}")
    want = sorted((_expected(s) for s in traced.summaries), key=lambda r: r["request_id"])
    problems = [p for w, g in zip(want, _stored(store), strict=True) for p in _mismatches(w, g)]
    assert store.count() == 9 and not problems, "\n".join(problems)


def test_every_summary_column_is_carried_or_said_not_to_be() -> None:
    assert set(CARRIED) | set(NOT_CARRIED) == set(COLUMN_NAMES) and not set(CARRIED) & set(NOT_CARRIED)
    script = otel_summary_view_sql()
    assert script.count(";\n") == 3 and "TO `request_summaries`" in script and "FROM `otel_traces`" in script
    assert "FROM `otel`.`spans`" in otel_summary_view_sql("otel.spans")


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"traces_table": "otel traces"}, "traces_table"),
    ({"summary_table": "a.b.c"}, "summary_table"),
    ({"rejected_table": "x;DROP TABLE y"}, "rejected_table"),
])
def test_a_bad_table_name_raises_naming_the_argument(kwargs: dict[str, str], field: str) -> None:
    with pytest.raises(StoreError, match=f"^{field}: .* is no table name; give NAME or DATABASE.NAME"):
        otel_summary_view_statements(**kwargs)


@pytest.mark.parametrize(("value", "text"), [
    (0.1, "0.1"), (2.0, "2"), (1e-7, "1e-7"), (1.5e-7, "1.5e-7"), (123456.789, "123456.789"),
    (1e16, "10000000000000000"), (1e21, "1e+21"), (0.0, "0"), (-3.25, "-3.25"),
])
def test_doubles_are_written_as_pdata_writes_them(value: float, text: str) -> None:
    assert _go_float(value) == text


def test_the_exporters_double_text_reads_back_as_the_same_double_in_clickhouse(store: ClickHouseStore) -> None:
    """Why the attribute figures need no tolerance: 20,000 doubles from 1e-9 s to 1e6 s, written as pdata writes
    them and read with ``toFloat64OrNull`` as the view reads them, come back bit for bit."""
    rng = random.Random(16)
    values = [rng.uniform(0.5, 1.0) * 10.0 ** rng.randint(-9, 6) for _ in range(20_000)]
    texts = pa.table({"i": list(range(len(values))), "t": [_go_float(v) for v in values]})
    ref = store.client.external_ref("texts")
    back = store.client.query_arrow(f"SELECT toFloat64OrNull(t) AS v FROM {ref} ORDER BY i",
                                    external={"texts": texts}).column("v").to_pylist()
    assert back == values
