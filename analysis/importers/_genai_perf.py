"""GenAI-Perf / AIPerf profile exports → request summaries (the mapping of :mod:`llmslo.analysis.importers`).

**GenAI-Perf** ``profile_export.json`` (written by Perf Analyzer): ``experiments[].requests[]`` with
``timestamp`` (ns), ``response_timestamps`` (ns) and ``response_outputs`` (OpenAI server-sent events, or
Triton ``text_output``). First/last token = the first/last response carrying content; complete = the last
response. Output tokens: the ``usage.completion_tokens`` a response carries, else one token per content
response (GenAI-Perf re-tokenizes the text with its tokenizer, which an import cannot do; the report
says which). ``tenant_class`` = the experiment's load level (``concurrency=10``). A reply with at least the
``max_tokens`` of its payload finished ``length``.
- **AIPerf** ``profile_export.jsonl``: one record a line with ``metadata``, ``metrics`` (``{value, unit}``)
and ``error`` (``code``, ``type``, ``message``). Two layouts: before October 2025 ``metadata.timestamp_ns``
(the request's start, Unix ns), ``credit_phase`` and metric ``ttft`` (also ``ttst``, ``request_latency``,
``inter_chunk_latency``, ``output_sequence_length`` = output + ``reasoning_token_count``); from then on
``metadata.request_start_ns``/``request_end_ns``, ``benchmark_phase``, ``was_cancelled`` and metric
``time_to_first_token``. Warm-up records (phase not ``profiling``), which AIPerf leaves out of its figures,
are imported only with ``keep_warmup_cooldown`` (``tenant_class`` ``warmup``). Last token = TTFT + Σ
inter-chunk gaps when given, else the request
latency (then our TPOT equals AIPerf's inter_token_latency, (e2e − TTFT)/(N − 1)). Output and prompt
tokens: the server's ``usage`` when the record carries it (metrics ``usage_completion_tokens``,
``usage_prompt_tokens``, ``{value, unit: "tokens"}``: AIPerf writes them when the endpoint returned usage),
else AIPerf's client tokenizer (``output_sequence_length``, ``input_sequence_length``); the report gives both
totals. ``itl_s`` = ``inter_chunk_latency`` (AIPerf's gaps between content responses, in the metric's
``unit``, converted to seconds) where there is one gap per output token; AIPerf records no tokens per chunk,
so gaps of chunks that carry several tokens cannot be token-weighted and are not imported.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from llmslo.analysis.importers._common import (
    DEFAULT_TENANT_CLASS,
    Measured,
    Problems,
    Reader,
    RowBuilder,
    as_float,
    classify_failure,
    id_prefix,
    is_number,
    limit_of,
    load_json,
    load_jsonl,
    make_report,
    model_name,
    quantile_note,
    stop_note,
)
from llmslo.analysis.importers._types import WARMUP_TENANT_CLASS, Importer, ImportOptions, ImportReport

__all__ = ["IMPORTER", "import_genai_perf"]

NS_PER_S = 1e9
EPOCH_NS_FLOOR = 1e17
"""Timestamps (ns) at or above this are Unix time (after 1973); below, a monotonic clock's."""
_UNIT_TO_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "seconds": 1.0}

# ---- GenAI-Perf (Perf Analyzer profile export) ----------------------------------------------------


def _sse_events(text: str) -> list[str]:
    """The ``data:`` payloads of a server-sent-events text, or the text itself when it is plain JSON."""
    if "data:" not in text:
        return [text] if text.strip() else []
    return [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]


def _content_and_usage(output: Any) -> tuple[bool, dict[str, Any] | None, str | None]:
    """``(has_content, usage, problem)`` of one element of ``response_outputs``."""
    if not isinstance(output, dict):
        return False, None, "must be a JSON object"
    if "text_output" in output:  # Triton
        text = output["text_output"]
        return isinstance(text, str) and text != "", None, None
    raw = output.get("response")
    if not isinstance(raw, str):
        return False, None, "needs a 'response' text (OpenAI) or 'text_output' (Triton)"
    content, usage = False, None
    for event in _sse_events(raw):
        if event == "[DONE]":
            continue
        try:
            obj = json.loads(event)
        except json.JSONDecodeError:
            return False, None, f"holds an event that is not JSON: {event[:40]!r}"
        if not isinstance(obj, dict):
            continue
        if isinstance(obj.get("usage"), dict):
            usage = obj["usage"]
        for choice in obj.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta") or choice.get("message") or {}
            text = delta.get("content") if isinstance(delta, dict) else None
            if (isinstance(text, str) and text) or (isinstance(choice.get("text"), str) and choice["text"]):
                content = True
    return content, usage, None


def _payload(req: Mapping[str, Any]) -> dict[str, Any] | None:
    """The request body GenAI-Perf sent (``request_inputs.payload``, a JSON text, OpenAI), or None."""
    inputs = req.get("request_inputs")
    payload = inputs.get("payload") if isinstance(inputs, dict) else None
    if isinstance(payload, str):
        try:
            obj = json.loads(payload)
        except json.JSONDecodeError:
            return None
        return obj if isinstance(obj, dict) else None
    return None


def _request_model(req: Mapping[str, Any]) -> str | None:
    obj = _payload(req)
    return str(obj["model"]) if obj is not None and isinstance(obj.get("model"), str) else None


def _request_limit(req: Mapping[str, Any]) -> int | None:
    """The ``max_tokens`` a request carried: in the OpenAI payload, or a Triton ``max_tokens`` input."""
    limit = limit_of(_payload(req))
    if limit is not None:
        return limit
    inputs = req.get("request_inputs")
    raw = inputs.get("max_tokens") if isinstance(inputs, dict) else None
    if isinstance(raw, list) and len(raw) == 1:
        raw = raw[0]
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0 else None


SUMMARY_KEYS = ("time_to_first_token", "request_latency", "request_throughput", "ttft")
"""Metric names that mark a GenAI-Perf/AIPerf summary (statistics only) at the top level or under ``records``."""


def _summary_only(data: Mapping[str, Any]) -> bool:
    """A GenAI-Perf ``profile_export_genai_perf.json`` or AIPerf ``profile_export_aiperf.json``: statistics,
    at the top level (GenAI-Perf, AIPerf from October 2025 on) or under ``records`` (earlier AIPerf)."""
    records = data.get("records")
    return any(k in data for k in SUMMARY_KEYS) or (
        isinstance(records, dict) and any(k in records for k in SUMMARY_KEYS))


def _genai_perf(p: Path, data: Any, model: str | None, problems: Problems) -> tuple[pl.DataFrame, ImportReport]:
    experiments = data.get("experiments")
    if not isinstance(experiments, list):
        if _summary_only(data):
            raise problems.file("experiments", "missing",
                                "the file holds summary statistics only, no per-request records (a GenAI-Perf/AIPerf "
                                "summary export): import profile_export.json (GenAI-Perf) or profile_export.jsonl "
                                "(AIPerf) from the same run folder, which hold one record per request")
        raise problems.file("experiments", "missing", "expected 'experiments': a list of load levels")
    found = None
    for exp in experiments:
        for req in (exp.get("requests") or []) if isinstance(exp, dict) else []:
            if isinstance(req, dict) and (found := _request_model(req)):
                break
        if found:
            break
    name, model_note = model_name(p, found, model)
    ids = id_prefix(p)
    builder = RowBuilder(name)
    counts: Counter[str] = Counter()
    all_ts: list[int | float] = []
    for exp in experiments:
        for req in (exp.get("requests") or []) if isinstance(exp, dict) else []:
            if isinstance(req, dict) and is_number(req.get("timestamp")):
                all_ts.append(req["timestamp"])
    epoch = bool(all_ts) and min(all_ts) >= EPOCH_NS_FLOOR
    base_ns: int | float = 0 if epoch else min(all_ts, default=0)
    read = 0
    for e, exp in enumerate(experiments):
        if not isinstance(exp, dict) or not isinstance(exp.get("requests"), list):
            problems.add(None, f"experiments[{e}].requests", None, "missing", "each experiment needs a requests list")
            continue
        info = exp.get("experiment")
        mode = info.get("mode") if isinstance(info, dict) else None
        tenant = f"{mode}={info.get('value')}" if isinstance(info, dict) and mode else DEFAULT_TENANT_CLASS
        for r_i, req in enumerate(exp["requests"]):
            read += 1
            row = read
            prefix = f"experiments[{e}].requests[{r_i}]."
            if not isinstance(req, dict):
                problems.add(row, prefix, req, "type", "a request must be a JSON object")
                continue
            r = Reader(problems, row, req, prefix=prefix)
            r.nanoseconds("timestamp")
            stamps = req.get("response_timestamps")
            outputs = req.get("response_outputs")
            if not isinstance(stamps, list) or not all(is_number(s) for s in stamps):
                r._bad("response_timestamps", stamps, "type", f"{prefix}response_timestamps must be a list of ns")
                continue
            if not isinstance(outputs, list) or len(outputs) != len(stamps):
                r._bad("response_outputs", None, "length",
                       f"{prefix}response_outputs must be a list as long as response_timestamps ({len(stamps)})")
                continue
            if not r.ok:
                continue
            start: int | float = req["timestamp"]  # ns; kept exact (integers) until differences are taken
            content_ts: list[int | float] = []
            usage: dict[str, Any] | None = None
            for k, (ts, out) in enumerate(zip(stamps, outputs, strict=True)):
                has, use, problem = _content_and_usage(out)
                if problem:
                    r._bad(f"response_outputs[{k}]", None, "format", f"{prefix}response_outputs[{k}] {problem}")
                    break
                usage = use or usage
                if has:
                    content_ts.append(ts)
                if ts < start:
                    r._bad(f"response_timestamps[{k}]", ts, "order", f"{prefix}response_timestamps[{k}] precedes "
                           "the request's timestamp")
                    break
            if not r.ok:
                continue
            arrival = (start - base_ns) / NS_PER_S
            rid = f"{ids}#{e}.{r_i}"
            prompt = usage.get("prompt_tokens") if usage else None
            completion = usage.get("completion_tokens") if usage else None
            if not (isinstance(prompt, int) and prompt >= 0):
                prompt = None
                counts["no_prompt_tokens"] += 1
            if isinstance(completion, int) and completion >= 0:
                n_out = completion
                counts["usage_tokens"] += 1
            else:
                n_out = len(content_ts)
                counts["chunk_tokens"] += 1
            complete = (stamps[-1] - start) / NS_PER_S if stamps else None
            if not content_ts:
                counts["no_content"] += 1
                builder.add(Measured(rid, arrival, "error", prompt or 0, 0, None, None, complete,
                                     error_type="no_first_token", tenant_class=tenant))
                continue
            first = (content_ts[0] - start) / NS_PER_S
            last = (content_ts[-1] - start) / NS_PER_S
            gaps = [(b - a) / NS_PER_S for a, b in itertools.pairwise(content_ts)]
            itl = gaps if isinstance(completion, int) and len(gaps) == n_out - 1 else None
            builder.add(Measured(rid, arrival, "ok", prompt or 0, n_out, first, last, complete, itl_s=itl,
                                 tenant_class=tenant, max_tokens=_request_limit(req)))
    problems.raise_if_any()
    conversions = [
        model_note,
        "First/last token = the first/last response carrying content (role-only and empty chunks skipped); "
        "e2e_s = the last response, [DONE] included; TPOT = (last − first)/(N − 1), which is GenAI-Perf's "
        "inter_token_latency when N counts the same tokens.",
        "tenant_class = the experiment's load level (mode=value).",
    ]
    if counts["usage_tokens"]:
        conversions.append(f"Output tokens from the server's usage.completion_tokens ({counts['usage_tokens']} "
                           "requests).")
    if counts["chunk_tokens"]:
        conversions.append(
            f"{counts['chunk_tokens']} request(s) carry no usage: output tokens = the number of content responses "
            "(one token per chunk assumed; GenAI-Perf re-tokenizes the text instead, which an import cannot), "
            "and itl_s is not imported for them."
        )
    if counts["no_content"]:
        conversions.append(f"{counts['no_content']} request(s) received no content → error / no_first_token.")
    if note := stop_note(builder, "GenAI-Perf", "content received"):
        conversions.append(note)
    conversions.append(GENAI_QUANTILES)
    missing = ["HTTP status of failed requests (Perf Analyzer records responses only)"]
    if counts["no_prompt_tokens"]:
        missing.append(f"prompt token counts ({counts['no_prompt_tokens']} requests: prompt_tokens = 0)")
    note = ("arrival_unix_s = timestamp (Unix ns → s)" if epoch else
            "arrival_unix_s = (timestamp − first timestamp) in seconds from Unix time 0: the clock is not Unix "
            "time, offsets between requests are exact")
    report = make_report(p, "genai-perf", "GenAI-Perf profile export (Perf Analyzer)", read, builder, conversions,
                         missing, True, note, id_prefix=ids, run_duration=(None, GENAI_NO_DURATION))
    return builder.frame(), report


# ---- AIPerf (profile_export.jsonl) ---------------------------------------------------------------


def _unit_s(r: Reader, name: str, m: Mapping[str, Any]) -> float | None:
    """Seconds per unit of the metric ``name`` (``m["unit"]``: ns, us, ms or s; ms when absent); None after
    recording the problem for another unit."""
    scale = _UNIT_TO_S.get(str(m.get("unit", "ms")).lower())
    if scale is None:
        r._bad(f"metrics.{name}.unit", m.get("unit"), "unit", f"metrics.{name}.unit must be one of ns, us, ms, s")
    return scale


def _metric_s(r: Reader, metrics: Mapping[str, Any], *names: str) -> float | None:
    """A duration metric ``{value, unit}`` in seconds, under the first of ``names`` present; None when absent."""
    name = next((n for n in names if metrics.get(n) is not None), None)
    if name is None:
        return None
    m = metrics[name]
    if not isinstance(m, dict) or not is_number(m.get("value")):
        r._bad(f"metrics.{name}", m, "type", f"metrics.{name} must be {{value: number, unit: ...}}")
        return None
    scale = _unit_s(r, name, m)
    if scale is None:
        return None
    value = float(m["value"])
    if not math.isfinite(value) or value < 0:
        r._bad(f"metrics.{name}", value, "negative", f"metrics.{name} must be a finite number >= 0")
        return None
    return value * scale


def _metric_gaps_s(r: Reader, metrics: Mapping[str, Any], name: str) -> list[float] | None:
    """A list-of-durations metric ``{value: [..], unit}`` (AIPerf's ``inter_chunk_latency``) in seconds; None
    when absent (or after recording the problem of a value that is not a list of finite numbers >= 0)."""
    m = metrics.get(name)
    if m is None:
        return None
    if not isinstance(m, dict) or not isinstance(m.get("value"), list):
        r._bad(f"metrics.{name}", m, "type", f"metrics.{name} must be {{value: [numbers], unit: ...}}")
        return None
    scale = _unit_s(r, name, m)
    values = m["value"]
    bad = next((k for k, v in enumerate(values) if not (is_number(v) and math.isfinite(float(v)) and v >= 0)), None)
    if bad is not None:
        r._bad(f"metrics.{name}.value[{bad}]", values[bad], "type",
               f"metrics.{name}.value must be a list of finite numbers >= 0")
        return None
    return None if scale is None else [float(v) * scale for v in values]


def _metric_count(r: Reader, metrics: Mapping[str, Any], *names: str) -> int | None:
    """A count metric ``{value}`` (a whole number >= 0), under the first of ``names`` present; None when absent."""
    for name in names:
        m = metrics.get(name)
        if m is None:
            continue
        value = as_float(m.get("value")) if isinstance(m, dict) else None
        if value is None or value < 0 or value != int(value):
            r._bad(f"metrics.{name}", m, "type", f"metrics.{name}.value must be a whole number >= 0")
            return None
        return int(value)
    return None


AIPERF_TTFT = ("time_to_first_token", "ttft")
"""AIPerf's TTFT metric: ``time_to_first_token`` (from October 2025), ``ttft`` (before)."""
AIPERF_START = ("request_start_ns", "timestamp_ns")
"""The request's start (Unix ns) in ``metadata``: ``request_start_ns`` (from October 2025), ``timestamp_ns``."""
AIPERF_NO_DURATION = (
    "none recorded: profile_export.jsonl holds per-request records only (AIPerf's benchmark_duration, first "
    "request sent → last response, is in profile_export_aiperf.json); the rows' arrival times span the run"
)
GENAI_NO_DURATION = (
    "none recorded: a GenAI-Perf profile export holds per-request records only (GenAI-Perf's benchmark "
    "duration is the span of those timestamps, which the rows' arrival times carry)"
)


AIPERF_USAGE_OUT = "usage_completion_tokens"
AIPERF_USAGE_IN = "usage_prompt_tokens"
"""AIPerf's record metrics of the server's ``usage`` (``{value, unit: "tokens"}``; ``UsageCompletionTokensMetric``,
``UsagePromptTokensMetric``): the last ``usage.completion_tokens`` (reasoning tokens included, as the OpenAI API
counts them) and ``usage.prompt_tokens`` the responses carried; absent when the server sent no usage."""


@dataclass(frozen=True)
class _AiperfTokens:
    """One record's token counts: the server's ``usage`` and AIPerf's client tokenizer's (None: not recorded).

    ``client_out`` is output_sequence_length (output + reasoning tokens), else output_token_count +
    reasoning_token_count; ``reasoning``: it includes reasoning tokens the record counts apart."""

    usage_out: int | None
    client_out: int | None
    reasoning: bool
    usage_in: int | None
    client_in: int | None

    @property
    def out_from_usage(self) -> bool:
        """The output count is the server's: its usage, unless it says 0 while the client counted tokens."""
        return self.usage_out is not None and (self.usage_out > 0 or not self.client_out)

    @property
    def output(self) -> int | None:
        """Output tokens: the server's usage (:attr:`out_from_usage`), else the client tokenizer's count."""
        return self.usage_out if self.out_from_usage else self.client_out

    @property
    def prompt(self) -> int | None:
        """Prompt tokens: the server's usage when recorded, else the client tokenizer's count."""
        return self.usage_in if self.usage_in is not None else self.client_in


def _aiperf_tokens(r: Reader, metrics: Mapping[str, Any]) -> _AiperfTokens:
    """The record's token counts (:class:`_AiperfTokens`); a bad count is recorded as a problem."""
    osl = _metric_count(r, metrics, "output_sequence_length")
    reasoning = metrics.get("reasoning_token_count") is not None
    client_out = osl
    if osl is None:
        out = _metric_count(r, metrics, "output_token_count")
        think = _metric_count(r, metrics, "reasoning_token_count")
        client_out = None if out is None and think is None else (out or 0) + (think or 0)
        reasoning = think is not None
    return _AiperfTokens(_metric_count(r, metrics, AIPERF_USAGE_OUT), client_out, reasoning,
                         _metric_count(r, metrics, AIPERF_USAGE_IN),
                         _metric_count(r, metrics, "input_sequence_length", "error_isl"))


def _tally_tokens(counts: Counter[str], tokens: _AiperfTokens) -> None:
    """Count where an imported record's token counts came from (and the client's count beside the server's)."""
    counts["records"] += 1
    if tokens.out_from_usage:
        counts["out_usage"] += 1
        if tokens.client_out is not None:
            counts["out_both"] += 1
            counts["out_both_usage_sum"] += tokens.usage_out or 0
            counts["out_both_client_sum"] += tokens.client_out
    elif tokens.client_out is not None:
        counts["out_client"] += 1
        counts["reasoning"] += tokens.reasoning
        counts["out_usage_zero"] += tokens.usage_out == 0
    if tokens.usage_in is not None:
        counts["in_usage"] += 1
        if tokens.client_in is not None:
            counts["in_both"] += 1
            counts["in_both_usage_sum"] += tokens.usage_in
            counts["in_both_client_sum"] += tokens.client_in


def _aiperf(
    p: Path, records: list[Any], options: ImportOptions, problems: Problems
) -> tuple[pl.DataFrame, ImportReport]:
    if not records:
        raise problems.file("-", "empty", "the file holds no records")
    name, model_note = model_name(p, None, options.model)
    prefix = id_prefix(p)
    builder = RowBuilder(name)
    counts: Counter[str] = Counter()
    schemas: Counter[str] = Counter()
    for i, rec in enumerate(records):
        row = i + 1
        if not isinstance(rec, dict) or not isinstance(rec.get("metadata"), dict):
            problems.add(row, "metadata", None, "missing", "each line needs a 'metadata' object")
            continue
        meta = rec["metadata"]
        metrics = rec.get("metrics") or {}
        if not isinstance(metrics, dict):
            problems.add(row, "metrics", metrics, "type", "metrics must be an object")
            continue
        r = Reader(problems, row, meta, prefix="metadata.")
        top = Reader(problems, row, rec)  # the record's metrics and error, named from the record's top level
        start_key = next((k for k in AIPERF_START if meta.get(k) is not None), AIPERF_START[0])
        start_ns = r.nanoseconds(start_key)  # ns, kept exact (integers) until differences are taken
        end_ns = r.nanoseconds("request_end_ns", required=False)
        schemas[start_key] += 1
        phase = meta.get("benchmark_phase", meta.get("credit_phase"))
        tenant = DEFAULT_TENANT_CLASS
        if phase not in (None, "profiling"):
            counts["outside_phase"] += 1
            if not options.keep_warmup_cooldown:
                continue
            tenant = WARMUP_TENANT_CLASS
        ttft = _metric_s(top, metrics, *AIPERF_TTFT)
        latency = _metric_s(top, metrics, "request_latency")
        tokens = _aiperf_tokens(top, metrics)
        n_out, n_in = tokens.output, tokens.prompt
        gaps = _metric_gaps_s(top, metrics, "inter_chunk_latency")  # between content responses, seconds
        error = rec.get("error")
        if error is not None and not isinstance(error, dict):
            top._bad("error", error, "type", "error must be null or {code, type, message}")
        if not (r.ok and top.ok) or start_ns is None:
            continue
        if latency is None and end_ns is not None:
            latency = (end_ns - start_ns) / NS_PER_S
            counts["derived_e2e"] += 1
        rid = f"{prefix}#{i}"
        arrival = start_ns / NS_PER_S
        if error is None and not meta.get("was_cancelled"):
            if ttft is None or n_out is None:
                if ttft is None:
                    top._bad("metrics.time_to_first_token", None, "missing",
                           "a successful record needs metrics.time_to_first_token (or metrics.ttft)")
                if n_out is None:
                    top._bad("metrics.output_sequence_length", None, "missing",
                           "a successful record needs metrics.output_sequence_length (or output_token_count)")
                continue
            if latency is not None:
                top.order("metrics.time_to_first_token", ttft, "metrics.request_latency", latency)
            last = ttft + sum(gaps) if gaps is not None else latency
            if not top.ok:
                continue
            counts["last_from_icl" if gaps is not None else "last_from_latency"] += 1
            if gaps is not None and n_out > 1:  # the row keeps them when there is one gap per output token
                counts["itl_kept" if len(gaps) == n_out - 1 else "itl_dropped"] += 1
            _tally_tokens(counts, tokens)
            builder.add(Measured(rid, arrival, "ok", n_in or 0, n_out, ttft, last, latency, itl_s=gaps,
                                 tenant_class=tenant))
            continue
        err = error or {}
        code = err.get("code") if isinstance(err.get("code"), int) else None
        text = " ".join(str(err.get(k) or "") for k in ("type", "message")).strip()
        finish, reject, etype = classify_failure(code, text)
        if meta.get("was_cancelled"):
            finish, reject = "client_cancel", None
        counts[f"fail:{finish}:{reject or etype}"] += 1
        _tally_tokens(counts, tokens)
        got = n_out or 0
        builder.add(Measured(rid, arrival, finish, n_in or 0, got, ttft if got else None, None, latency,
                             reject_reason=reject, error_type=etype, tenant_class=tenant))
    problems.raise_if_any()
    return builder.frame(), _aiperf_report(p, len(records), builder, counts, schemas, model_note, prefix, options)


def _aiperf_report(
    p: Path, n_records: int, builder: RowBuilder, counts: Counter[str], schemas: Counter[str], model_note: str,
    prefix: str, options: ImportOptions,
) -> ImportReport:
    start_keys = " / ".join(f"metadata.{k}" for k in AIPERF_START if schemas[k])
    layouts = [text for key, text in (
        ("timestamp_ns", "AIPerf before October 2025: timestamp_ns, credit_phase, ttft"),
        ("request_start_ns", "AIPerf from October 2025: request_start_ns, benchmark_phase, time_to_first_token"),
    ) if schemas[key]]
    conversions = [
        model_note,
        f"Metric values converted from their units (ms, ns) to seconds; arrival_unix_s = {start_keys} / 1e9 "
        f"({'; '.join(layouts)}).",
    ]
    conversions += _aiperf_token_notes(counts)
    if counts["last_from_icl"]:
        conversions.append(f"last_token_s = time_to_first_token + Σ inter_chunk_latency ({counts['last_from_icl']} "
                           "requests).")
    if counts["itl_kept"]:
        conversions.append(
            f"itl_s = inter_chunk_latency (AIPerf's gaps between content responses, converted from its unit to "
            f"seconds) for {counts['itl_kept']} request(s) with one gap per output token."
        )
    if counts["itl_dropped"]:
        conversions.append(
            f"itl_s not imported for {counts['itl_dropped']} request(s) whose inter_chunk_latency has not one gap per "
            "output token (chunks that carry several tokens): AIPerf records no tokens per chunk, and llmslo's "
            "ITL is token-weighted."
        )
    if counts["last_from_latency"]:
        conversions.append(
            f"{counts['last_from_latency']} request(s) have no inter_chunk_latency: last_token_s = request_latency, "
            "so TPOT = (e2e − TTFT)/(N − 1), AIPerf's inter_token_latency."
        )
    if counts["reasoning"]:
        conversions.append(
            f"{counts['reasoning']} request(s) counted by the client carry reasoning tokens: generated_tokens = "
            "sent_tokens = AIPerf's output_sequence_length (output + reasoning tokens), the N its "
            "inter_token_latency divides by."
        )
    if counts["derived_e2e"]:
        conversions.append(f"e2e_s derived as request_end_ns − request_start_ns for {counts['derived_e2e']} "
                           "request(s) without request_latency.")
    for key, n in sorted(counts.items()):
        if key.startswith("fail:"):
            _, finish, what = key.split(":", 2)
            conversions.append(f"{n} failed request(s) → {finish} / {what} (from error.code and error.type).")
    if counts["outside_phase"]:
        conversions.append(
            f"{counts['outside_phase']} warm-up record(s) (phase not 'profiling'), which AIPerf leaves out of its "
            "own figures: " + ("kept as asked, tenant_class warmup." if options.keep_warmup_cooldown else
                               "not imported (`llmslo import --keep-warmup-cooldown` keeps them, tenant_class "
                               "warmup).")
        )
    if note := stop_note(builder, "AIPerf's profile_export.jsonl", "no error"):
        conversions.append(note)
    conversions.append(AIPERF_QUANTILES)
    return make_report(p, "genai-perf", "AIPerf profile export (JSONL)", n_records, builder, conversions,
                       ["stop vs length (max_tokens is in inputs.json, not here)"], True,
                       f"arrival_unix_s = {start_keys} (Unix ns → s).", id_prefix=prefix,
                       run_duration=(None, AIPERF_NO_DURATION))


def _aiperf_token_notes(counts: Counter[str]) -> list[str]:
    """The import report's sentences on where the records' token counts came from: the server's usage when the
    record carries it (the client tokenizer's count kept as a note), else AIPerf's client tokenizer."""
    out: list[str] = []
    n = counts["records"]
    if counts["out_usage"]:
        seen = ""
        if counts["out_both"]:
            seen = (f"; AIPerf's client tokenizer counted {counts['out_both_client_sum']:,} output tokens "
                    f"(output_sequence_length) where the server counted {counts['out_both_usage_sum']:,}, over the "
                    f"{counts['out_both']} of them that carry both (the client count is not imported)")
        out.append(f"output tokens: from the server's usage, metrics.usage_completion_tokens, reasoning tokens "
                   f"included ({counts['out_usage']} of {n} records){seen}.")
    if counts["out_client"]:
        zero = (f" ({counts['out_usage_zero']} of them say usage_completion_tokens 0 while the client counted "
                "tokens)") if counts["out_usage_zero"] else ""
        out.append(f"output tokens: AIPerf's client tokenizer count, output_sequence_length (output + reasoning "
                   f"tokens), for {counts['out_client']} of {n} records, which carry no usable server usage"
                   f"{zero}.")
    if counts["in_usage"]:
        seen = ""
        if counts["in_both"]:
            seen = (f"; AIPerf's client tokenizer counted {counts['in_both_client_sum']:,} prompt tokens "
                    f"(input_sequence_length) where the server counted {counts['in_both_usage_sum']:,}, over the "
                    f"{counts['in_both']} of them that carry both")
        rest = "; the others: input_sequence_length" if counts["in_usage"] < n else ""
        out.append(f"prompt tokens: from the server's usage, metrics.usage_prompt_tokens ({counts['in_usage']} of "
                   f"{n} records){seen}{rest}.")
    return out


AIPERF_QUANTILES = quantile_note(
    "AIPerf", "numpy.percentile with its default method, in MetricArray.to_result of aiperf/metrics/metric_dicts.py")
"""How AIPerf computes the percentiles of its summary (ai-dynamo/aiperf, aiperf/metrics/metric_dicts.py)."""
GENAI_QUANTILES = quantile_note(
    "GenAI-Perf", "numpy.percentile with its default method, in Statistics of genai_perf/metrics/statistics.py")
"""How GenAI-Perf computes the percentiles of its summary (triton-inference-server/perf_analyzer)."""


def import_genai_perf(
    path: str | os.PathLike[str], *, model: str | None = None, keep_warmup_cooldown: bool = False
) -> tuple[pl.DataFrame, ImportReport]:
    """Convert a GenAI-Perf ``profile_export.json`` or an AIPerf ``profile_export.jsonl`` (told apart by content).

    Raises :class:`~llmslo.analysis.importers.ImportFormatError` (nothing imported) for a summary
    export or a malformed record, naming the record and the field.
    """
    p = Path(path)
    problems = Problems(p)
    first = _first_line(p)
    if first.startswith("{") and '"metadata"' in first and first.endswith("}"):
        options = ImportOptions(model=model, keep_warmup_cooldown=keep_warmup_cooldown)
        return _aiperf(p, load_jsonl(p, problems), options, problems)
    data = load_json(p, problems)
    if not isinstance(data, dict):
        raise problems.file("-", "type", "expected a JSON object with 'experiments' (GenAI-Perf profile export)")
    return _genai_perf(p, data, model, problems)


def _first_line(path: Path) -> str:
    """The file's first non-empty line, whole (an AIPerf record can be longer than any fixed head)."""
    try:
        with path.open("r", encoding="utf-8-sig", errors="replace") as fh:
            for line in fh:
                if line.strip():
                    return line.strip()
    except OSError:
        return ""
    return ""


def _detect_genai(path: Path, head: str) -> bool:
    text = head.lstrip()
    if text.startswith("{") and '"experiments"' in head and ('"requests"' in head or '"response_timestamps"' in head):
        return True
    first = text.split("\n", 1)[0]
    if first.startswith("{") and '"metadata"' in first and any(f'"{k}"' in first for k in AIPERF_START):
        return True
    # a summary export (statistics only): recognised so that importing it says what to import instead
    return text.startswith("{") and '"input_config"' in head and any(f'"{k}"' in head for k in SUMMARY_KEYS)

def _convert(p: Path, o: ImportOptions) -> tuple[pl.DataFrame, ImportReport]:
    return import_genai_perf(p, model=o.model, keep_warmup_cooldown=o.keep_warmup_cooldown)


IMPORTER = Importer(
    "genai-perf", "GenAI-Perf profile_export.json (Perf Analyzer) or AIPerf profile_export.jsonl",
    convert=_convert, detect=_detect_genai,
)
