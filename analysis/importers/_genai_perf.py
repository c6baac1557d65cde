"""GenAI-Perf / AIPerf profile exports → request summaries (the mapping of :mod:`llmslo.analysis.importers`).

**GenAI-Perf** ``profile_export.json`` (written by Perf Analyzer): ``experiments[].requests[]`` with
``timestamp`` (ns), ``response_timestamps`` (ns) and ``response_outputs`` (OpenAI server-sent events, or
Triton ``text_output``). First/last token = the first/last response carrying content; complete = the last
response. Output tokens: the ``usage.completion_tokens`` a response carries, else one token per content
response (GenAI-Perf re-tokenizes the text with its tokenizer, which an import cannot do; the report
says which). ``tenant_class`` = the experiment's load level (``concurrency=10``).
- **AIPerf** ``profile_export.jsonl``: one record a line with ``metadata`` (``request_start_ns`` Unix ns,
``was_cancelled``), ``metrics`` (``{value, unit}``; ``time_to_first_token``, ``request_latency``,
``inter_chunk_latency``, ``output_sequence_length``, ``input_sequence_length``) and ``error``
(``code``, ``type``, ``message``). Last token = TTFT + Σ inter-chunk gaps when given, else the request
latency (then our TPOT equals AIPerf's inter_token_latency, (e2e − TTFT)/(N − 1)).
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections import Counter
from collections.abc import Mapping
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
    is_number,
    load_json,
    load_jsonl,
    make_report,
    model_name,
)
from llmslo.analysis.importers._types import Importer, ImportOptions, ImportReport

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


def _request_model(req: Mapping[str, Any]) -> str | None:
    inputs = req.get("request_inputs")
    payload = inputs.get("payload") if isinstance(inputs, dict) else None
    if isinstance(payload, str):
        try:
            obj = json.loads(payload)
        except json.JSONDecodeError:
            return None
        if isinstance(obj, dict) and isinstance(obj.get("model"), str):
            return str(obj["model"])
    return None


def _genai_perf(p: Path, data: Any, model: str | None, problems: Problems) -> tuple[pl.DataFrame, ImportReport]:
    experiments = data.get("experiments")
    if not isinstance(experiments, list):
        if any(k in data for k in ("time_to_first_token", "request_latency", "request_throughput")):
            raise problems.file("experiments", "missing",
                                "a GenAI-Perf/AIPerf summary (statistics only): import profile_export.json "
                                "(GenAI-Perf) or profile_export.jsonl (AIPerf), which hold per-request records")
        raise problems.file("experiments", "missing", "expected 'experiments': a list of load levels")
    found = None
    for exp in experiments:
        for req in (exp.get("requests") or []) if isinstance(exp, dict) else []:
            if isinstance(req, dict) and (found := _request_model(req)):
                break
        if found:
            break
    name, model_note = model_name(p, found, model)
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
            r.seconds("timestamp")
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
            rid = f"{p.name}#{e}.{r_i}"
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
                                 tenant_class=tenant))
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
    missing = ["HTTP status of failed requests (Perf Analyzer records responses only)"]
    if counts["no_prompt_tokens"]:
        missing.append(f"prompt token counts ({counts['no_prompt_tokens']} requests: prompt_tokens = 0)")
    note = ("arrival_unix_s = timestamp (Unix ns → s)" if epoch else
            "arrival_unix_s = (timestamp − first timestamp) in seconds from Unix time 0: the clock is not Unix "
            "time, offsets between requests are exact")
    report = make_report(p, "genai-perf", "GenAI-Perf profile export (Perf Analyzer)", read, builder, conversions,
                         missing, True, note)
    return builder.frame(), report


# ---- AIPerf (profile_export.jsonl) ---------------------------------------------------------------


def _metric_s(r: Reader, metrics: Mapping[str, Any], name: str) -> float | None:
    """A duration metric ``{value, unit}`` in seconds; None when absent."""
    m = metrics.get(name)
    if m is None:
        return None
    if not isinstance(m, dict) or not is_number(m.get("value")):
        r._bad(f"metrics.{name}", m, "type", f"metrics.{name} must be {{value: number, unit: ...}}")
        return None
    scale = _UNIT_TO_S.get(str(m.get("unit", "ms")).lower())
    if scale is None:
        r._bad(f"metrics.{name}.unit", m.get("unit"), "unit", f"metrics.{name}.unit must be one of ns, us, ms, s")
        return None
    value = float(m["value"])
    if not math.isfinite(value) or value < 0:
        r._bad(f"metrics.{name}", value, "negative", f"metrics.{name} must be a finite number >= 0")
        return None
    return value * scale


def _metric_count(r: Reader, metrics: Mapping[str, Any], *names: str) -> int | None:
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


def _aiperf(p: Path, records: list[Any], model: str | None, problems: Problems) -> tuple[pl.DataFrame, ImportReport]:
    name, model_note = model_name(p, None, model)
    builder = RowBuilder(name)
    counts: Counter[str] = Counter()
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
        r.seconds("request_start_ns")
        r.seconds("request_end_ns", required=False)
        start_ns = meta.get("request_start_ns")
        end_ns = meta.get("request_end_ns")  # ns, kept exact (integers) until the difference is taken
        if meta.get("benchmark_phase") not in (None, "profiling"):
            counts["skipped_phase"] += 1
            continue
        ttft = _metric_s(r, metrics, "time_to_first_token")
        latency = _metric_s(r, metrics, "request_latency")
        n_out = _metric_count(r, metrics, "output_sequence_length", "output_token_count")
        n_in = _metric_count(r, metrics, "input_sequence_length", "error_isl")
        icl_m = metrics.get("inter_chunk_latency")
        gaps: list[float] | None = None
        if isinstance(icl_m, dict) and isinstance(icl_m.get("value"), list):
            scale = _UNIT_TO_S.get(str(icl_m.get("unit", "ms")).lower(), 1e-3)
            if all(is_number(g) and math.isfinite(float(g)) and g >= 0 for g in icl_m["value"]):
                gaps = [float(g) * scale for g in icl_m["value"]]
            else:
                r._bad("metrics.inter_chunk_latency", None, "type", "inter_chunk_latency values must be numbers >= 0")
        error = rec.get("error")
        if error is not None and not isinstance(error, dict):
            r._bad("error", error, "type", "error must be null or {code, type, message}")
        if not r.ok or start_ns is None:
            continue
        if latency is None and is_number(end_ns):
            latency = (end_ns - start_ns) / NS_PER_S
            counts["derived_e2e"] += 1
        rid = f"{p.name}#{i}"
        arrival = start_ns / NS_PER_S
        if error is None and not meta.get("was_cancelled"):
            if ttft is None or n_out is None:
                if ttft is None:
                    r._bad("metrics.time_to_first_token", None, "missing",
                           "a successful record needs metrics.time_to_first_token")
                if n_out is None:
                    r._bad("metrics.output_sequence_length", None, "missing",
                           "a successful record needs metrics.output_sequence_length")
                continue
            if latency is not None:
                r.order("time_to_first_token", ttft, "request_latency", latency)
            last = ttft + sum(gaps) if gaps is not None else latency
            counts["last_from_icl" if gaps is not None else "last_from_latency"] += 1
            if not r.ok:
                continue
            builder.add(Measured(rid, arrival, "ok", n_in or 0, n_out, ttft, last, latency, itl_s=gaps))
            continue
        err = error or {}
        code = err.get("code") if isinstance(err.get("code"), int) else None
        text = " ".join(str(err.get(k) or "") for k in ("type", "message")).strip()
        finish, reject, etype = classify_failure(code, text)
        if meta.get("was_cancelled"):
            finish, reject = "client_cancel", None
        counts[f"fail:{finish}:{reject or etype}"] += 1
        got = n_out or 0
        builder.add(Measured(rid, arrival, finish, n_in or 0, got, ttft if got else None, None, latency,
                             reject_reason=reject, error_type=etype))
    problems.raise_if_any()
    conversions = [
        model_note,
        "Metric values converted from their units (ms, ns) to seconds; arrival_unix_s = request_start_ns / 1e9.",
    ]
    if counts["last_from_icl"]:
        conversions.append(f"last_token_s = time_to_first_token + Σ inter_chunk_latency ({counts['last_from_icl']} "
                           "requests); itl_s kept where there is one gap per token.")
    if counts["last_from_latency"]:
        conversions.append(
            f"{counts['last_from_latency']} request(s) have no inter_chunk_latency: last_token_s = request_latency, "
            "so TPOT = (e2e − TTFT)/(N − 1), AIPerf's inter_token_latency."
        )
    if counts["derived_e2e"]:
        conversions.append(f"e2e_s derived as request_end_ns − request_start_ns for {counts['derived_e2e']} "
                           "request(s) without request_latency.")
    for key, n in sorted(counts.items()):
        if key.startswith("fail:"):
            _, finish, what = key.split(":", 2)
            conversions.append(f"{n} failed request(s) → {finish} / {what} (from error.code and error.type).")
    if counts["skipped_phase"]:
        conversions.append(f"{counts['skipped_phase']} warm-up record(s) (benchmark_phase not 'profiling') skipped.")
    conversions.append("Successful requests → finish_reason stop (AIPerf does not record stop vs length).")
    report = make_report(p, "genai-perf", "AIPerf profile export (JSONL)", len(records), builder, conversions,
                         ["stop vs length"], True, "arrival_unix_s = metadata.request_start_ns (Unix ns → s).")
    return builder.frame(), report


def import_genai_perf(
    path: str | os.PathLike[str], *, model: str | None = None
) -> tuple[pl.DataFrame, ImportReport]:
    """Convert a GenAI-Perf ``profile_export.json`` or an AIPerf ``profile_export.jsonl`` (told apart by content).

    Raises :class:`~llmslo.analysis.importers.ImportFormatError` (nothing imported) for a summary
    export or a malformed record, naming the record and the field.
    """
    p = Path(path)
    problems = Problems(p)
    head = p.read_text(encoding="utf-8-sig", errors="replace")[:4096].lstrip() if p.is_file() else ""
    first_line = head.split("\n", 1)[0]
    if first_line.startswith("{") and '"metadata"' in first_line and first_line.rstrip().endswith("}"):
        return _aiperf(p, load_jsonl(p, problems), model, problems)
    data = load_json(p, problems)
    if not isinstance(data, dict):
        raise problems.file("-", "type", "expected a JSON object with 'experiments' (GenAI-Perf profile export)")
    return _genai_perf(p, data, model, problems)


def _detect_genai(path: Path, head: str) -> bool:
    text = head.lstrip()
    if text.startswith("{") and '"experiments"' in head and ('"requests"' in head or '"response_timestamps"' in head):
        return True
    first = text.split("\n", 1)[0]
    return first.startswith("{") and '"metadata"' in first and '"request_start_ns"' in first

def _convert(p: Path, o: ImportOptions) -> tuple[pl.DataFrame, ImportReport]:
    return import_genai_perf(p, model=o.model)


IMPORTER = Importer(
    "genai-perf", "GenAI-Perf profile_export.json (Perf Analyzer) or AIPerf profile_export.jsonl",
    convert=_convert, detect=_detect_genai,
)
