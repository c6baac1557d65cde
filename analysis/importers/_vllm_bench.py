"""vLLM benchmark results → request summaries (the mapping of :mod:`llmslo.analysis.importers`).

**vLLM** ``benchmark_serving.py`` / ``vllm bench serve --save-result --save-detailed``: per-request
arrays ``ttfts``, ``itls`` (chunk gaps), ``input_lens``, ``output_lens``, ``errors`` and, where present,
``latencies``/``e2els`` and ``start_times``. ``last_token_s = ttft + Σ itls`` (the last chunk); without a
per-request latency, ``e2e_s`` is derived as that same time and the report says so. ``itl_s`` is kept
only where there is one gap per token (``len(itls) = N − 1``). The old ``"request_goodput:"`` key (with a
colon) is recognised. A file saved without ``--save-detailed`` holds no per-request data and is refused.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl

from llmslo.analysis.importers._common import (
    NO_ARRIVALS_NOTE,
    UNKNOWN_VERSION,
    Measured,
    Problems,
    Reader,
    RowBuilder,
    as_float,
    classify_failure,
    id_prefix,
    is_number,
    load_json_documents,
    make_report,
    model_name,
    quantile_note,
    stop_note,
)
from llmslo.analysis.importers._types import Importer, ImportOptions, ImportReport

__all__ = ["IMPORTER", "import_vllm_bench"]

# ---- vLLM benchmark_serving / vllm bench serve --------------------------------------------------------

VLLM_ARRAYS = ("ttfts", "itls", "input_lens", "output_lens", "errors")
"""Per-request arrays of a detailed vLLM result (``--save-detailed``; older versions always wrote them)."""
VLLM_E2E_KEYS = ("latencies", "e2els")


def parse_vllm_date(date: str) -> tuple[float, str] | None:
    """``(unix_s, how)`` of a vLLM result's ``date``: ``YYYYMMDD-HHMMSS`` (what vLLM writes: local time, no zone)
    or ISO 8601 (``2026-09-04T20:33:17Z``, with an offset or fractional seconds). A time without a zone is
    read as UTC and ``how`` says so; None when the text is neither form."""
    text = date.strip()
    try:
        moment = datetime.strptime(text, "%Y%m%d-%H%M%S")
    except ValueError:
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            return None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC).timestamp(), "local time with no zone recorded, read as UTC"
    return moment.timestamp(), "with its UTC offset"


def _vllm_anchor(doc: Mapping[str, Any]) -> tuple[float, str]:
    """``(unix_s, sentence)``: the calendar time the run started, from ``date`` minus ``duration``."""
    date = doc.get("date")
    parsed = parse_vllm_date(date) if isinstance(date, str) else None
    if parsed is not None:
        end, how = parsed
        dur = as_float(doc.get("duration"))
        start = end - dur if dur is not None else end
        return start, f"calendar anchor: the file's date {date!r} (the run's end, {how}) minus its duration"
    if isinstance(date, str):
        return 0.0, (f"calendar anchor: none (the file's date {date!r} is neither YYYYMMDD-HHMMSS nor ISO 8601; "
                     "Unix time 0)")
    return 0.0, "calendar anchor: none recorded (Unix time 0)"


def _vllm_duration(docs: list[Any]) -> tuple[float | None, str]:
    """The run's duration as vLLM bench recorded it: ``duration`` (seconds from the first request sent until
    every request finished, vLLM's divisor for request_throughput), summed over the file's result objects."""
    values = [as_float(d.get("duration")) if isinstance(d, dict) else None for d in docs]
    if not values or any(v is None for v in values):
        return None, "none recorded: a result object has no 'duration'"
    total = sum(v for v in values if v is not None)
    if len(values) == 1:
        return total, "vLLM bench's 'duration' (first request sent → every request done; its throughput divisor)"
    return total, (f"the sum of vLLM bench's 'duration' over the file's {len(values)} result objects (each: first "
                   "request sent → every request done)")


def _vllm_load_label(doc: Mapping[str, Any]) -> str:
    parts = []
    for key in ("request_rate", "max_concurrency", "burstiness"):
        value = doc.get(key)
        if value is not None and not (key == "burstiness" and value == 1.0):
            parts.append(f"{key}={value}")
    return " ".join(parts) or "benchmark"


def _vllm_run(
    prefix: str, doc: Any, run: int, n_runs: int, problems: Problems, builder: RowBuilder, counts: Counter[str],
    anchor_note: list[str],
) -> int:
    """Convert one result object of a vLLM file into ``builder``; returns the number of requests read."""
    where = f"run {run + 1}: " if n_runs > 1 else ""
    if not isinstance(doc, dict):
        problems.add(None, "-", None, "type", f"{where}expected a JSON object (a vLLM benchmark result)")
        return 0
    present = [k for k in VLLM_ARRAYS if k in doc]
    if "ttfts" not in doc:
        summary = "the file holds summary statistics only" if "completed" in doc or "mean_ttft_ms" in doc else (
            "not a vLLM benchmark result")
        problems.add(None, "ttfts", None, "missing",
                     f"{where}no per-request arrays ({', '.join(VLLM_ARRAYS)}): {summary}; vLLM writes them with "
                     "--save-result --save-detailed (older versions always did)")
        return 0
    e2e_key = next((k for k in VLLM_E2E_KEYS if k in doc), None)
    arrays = [k for k in (*present, *([e2e_key] if e2e_key else []), "start_times") if k in doc]
    lengths = {}
    for k in arrays:
        if not isinstance(doc[k], list):
            problems.add(None, k, None, "type", f"{where}{k} must be a list (one entry per request)")
        else:
            lengths[k] = len(doc[k])
    if len(set(lengths.values())) > 1:
        n_ttfts = lengths.get("ttfts")
        for k, n in lengths.items():
            if n != n_ttfts:
                problems.add(None, k, n, "length",
                             f"{where}{k} has {n} entries but ttfts has {n_ttfts}: the arrays must align per request")
    for k in ("input_lens", "output_lens"):
        if k not in doc:
            problems.add(None, k, None, "missing", f"{where}{k} is required (per-request token counts)")
    if "itls" not in doc and e2e_key is None:
        problems.add(None, "itls", None, "missing", f"{where}itls (or latencies) is required to place the last token")
    if problems.errors:
        return 0
    n = lengths["ttfts"]
    anchor, note = _vllm_anchor(doc)
    starts = doc.get("start_times")
    has_starts = isinstance(starts, list)
    start_values = [v for v in (as_float(s) for s in starts) if v is not None] if isinstance(starts, list) else []
    if has_starts:
        counts["arrivals"] += n
        anchor_note.append(note)
    else:
        counts["no_arrivals"] += n
    tenant = _vllm_load_label(doc)
    first_start: float | None = None
    if has_starts:
        first_start = min(start_values, default=0.0)
    errors = doc.get("errors")
    for i in range(n):
        row = i + 1
        rec: dict[str, Any] = {k: doc[k][i] for k in arrays}
        r = Reader(problems, row, rec, prefix=where)
        ttft = r.seconds("ttfts")
        n_in = r.count("input_lens")
        n_out = r.count("output_lens")
        latency = r.seconds(e2e_key, required=False) if e2e_key else None
        gaps: list[float] | None = None
        if "itls" in rec:
            raw = rec["itls"]
            if not isinstance(raw, list) or not all(is_number(g) and math.isfinite(float(g)) and g >= 0 for g in raw):
                r._bad("itls", raw, "type", f"{where}itls[{i}] must be a list of non-negative numbers (seconds)")
            else:
                gaps = [float(g) for g in raw]
        start = r.seconds("start_times", required=True) if has_starts else None
        err: object = errors[i] if isinstance(errors, list) else None
        if err is not None and not isinstance(err, str):
            r._bad("errors", err, "type", f"{where}errors[{i}] must be text or null")
            err = None
        if not r.ok or ttft is None or n_in is None or n_out is None:
            continue
        arrival = anchor + (start - first_start if start is not None and first_start is not None else 0.0)
        rid = f"{prefix}#{i}" if n_runs == 1 else f"{prefix}#{run}.{i}"
        failed = bool(err) if errors is not None else n_out == 0
        if not failed:
            last = ttft + sum(gaps) if gaps is not None else latency
            assert last is not None
            if latency is not None:
                r.order("ttfts", ttft, e2e_key or "latencies", latency)
                if gaps is not None:
                    r.order("itls", last, e2e_key or "latencies", latency)
                complete = latency
            else:
                complete = last
                counts["derived_e2e"] += 1
            if not r.ok:
                continue
            if gaps is not None and n_out > 1:
                counts["itl_kept" if len(gaps) == n_out - 1 else "itl_dropped"] += 1
            builder.add(Measured(rid, arrival, "ok", n_in, n_out, ttft if n_out > 0 else None, last, complete,
                                 itl_s=gaps, tenant_class=tenant))
        else:
            finish, reject, etype = classify_failure(None, str(err) if err else None)
            if "valid chunk" in str(err or "") or "first token" in str(err or "").lower():
                finish, etype = "error", "no_first_token"
            counts[f"fail:{finish}:{reject or etype}"] += 1
            builder.add(Measured(rid, arrival, finish, n_in, 0, ttft if ttft > 0 else None, None, latency or None,
                                 reject_reason=reject, error_type=etype, tenant_class=tenant))
    if errors is None:
        counts["no_errors_array"] += n
    return n


VLLM_QUANTILES = quantile_note(
    "vLLM bench", "numpy.percentile with its default method, in calculate_metrics of vllm/benchmarks/serve.py")
"""How vLLM bench computes the percentiles it saves (vllm-project/vllm, vllm/benchmarks/serve.py)."""


def import_vllm_bench(
    path: str | os.PathLike[str], *, model: str | None = None
) -> tuple[pl.DataFrame, ImportReport]:
    """Convert a vLLM ``benchmark_serving.py`` / ``vllm bench serve`` result JSON with per-request arrays.

    A file written with ``--append-result`` (several result objects) is read run by run. Raises
    :class:`~llmslo.analysis.importers.ImportFormatError` for a summary-only file (no
    ``--save-detailed``), arrays of different lengths, or a bad entry (named by request and array).
    """
    p = Path(path)
    problems = Problems(p)
    docs = load_json_documents(p, problems)
    prefix = id_prefix(p)
    first = docs[0] if isinstance(docs[0], dict) else {}
    found_model = first.get("model_id") or first.get("model")
    version = first.get("version") if isinstance(first.get("version"), str) and first.get("version") else None
    name, model_note = model_name(p, found_model if isinstance(found_model, str) else None, model)
    builder = RowBuilder(name, version or UNKNOWN_VERSION)
    counts: Counter[str] = Counter()
    anchors: list[str] = []
    read = 0
    for run, doc in enumerate(docs):
        read += _vllm_run(prefix, doc, run, len(docs), problems, builder, counts, anchors)
    problems.raise_if_any()
    old_keys = any(isinstance(d, dict) and "request_goodput:" in d for d in docs)
    tool = "vLLM benchmark_serving.py (old key set: 'request_goodput:')" if old_keys else "vLLM bench serve"
    conversions = [model_note]
    if version:
        conversions.append(f"version = {version!r} (from the file's metadata).")
    if len(docs) > 1:
        conversions.append(f"{len(docs)} result objects (--append-result): request ids carry the run number.")
    conversions.append(
        "last_token_s = ttft + Σ itls (the last chunk's arrival, client clock); TPOT = (last_token_s − "
        "ttft_s)/(N − 1), which equals vLLM bench's (latency − TTFT)/(N − 1) where latency is the last chunk, "
        "but is null (never 0) for N ≤ 1."
    )
    if counts["derived_e2e"]:
        conversions.append(
            f"No per-request latency in the file: e2e_s derived as ttft + Σ itls (the last content chunk; the "
            f"time until the stream closed is not recorded) for {counts['derived_e2e']} request(s)."
        )
    if counts["itl_kept"]:
        conversions.append(f"itl_s = itls for {counts['itl_kept']} request(s) with one chunk per token.")
    if counts["itl_dropped"]:
        conversions.append(
            f"itl_s not imported for {counts['itl_dropped']} request(s): their itls are gaps between stream chunks "
            "that carry several tokens (vLLM bench's ITL is per chunk, ours is token-weighted)."
        )
    conversions.append(VLLM_QUANTILES)
    if note := stop_note(builder, "vLLM bench", "empty error"):
        conversions.append(note)
    for key, n in sorted(counts.items()):
        if key.startswith("fail:"):
            _, finish, what = key.split(":", 2)
            conversions.append(f"{n} failed request(s) → {finish} / {what} (from the error text).")
    if counts["no_errors_array"]:
        conversions.append(f"No errors array: {counts['no_errors_array']} request(s) judged by output_lens > 0.")
    if old_keys:
        conversions.append(
            "The file uses the old key 'request_goodput:' (with a colon). vLLM bench's goodput counts successful "
            "requests only, per second of benchmark; llmslo's goodput keeps failures in the denominator."
        )
    conversions.append(
        "Token counts: generated_tokens = sent_tokens = output_lens (the server's usage or vLLM's "
        "re-tokenization); prompt_tokens = input_lens. Failed requests have output_lens 0."
    )
    available = counts["no_arrivals"] == 0
    if available:
        arrival_note = ("arrival_unix_s = anchor + (start_times − first start_time): offsets between requests are "
                        f"the tool's own (perf_counter); {anchors[0]}.")
    else:
        arrival_note = (NO_ARRIVALS_NOTE.replace("arrival_unix_s = 0", "arrival_unix_s = the run's calendar anchor")
                        + " (This vLLM version writes no start_times.)")
    missing = ["stop vs length"]
    if not available:
        missing.insert(0, "request start times (start_times)")
    if not any(k in d for d in docs if isinstance(d, dict) for k in ("latencies", "e2els")):
        missing.append("per-request latency (latencies)")
    report = make_report(p, "vllm-bench", tool, read, builder, conversions, missing, available, arrival_note,
                         id_prefix=prefix, run_duration=_vllm_duration(docs))
    return builder.frame(), report


def _detect_vllm(path: Path, head: str) -> bool:
    text = head.lstrip()
    if not text.startswith("{") or '"experiments"' in head or '"benchmarks"' in head:
        return False
    return '"ttfts"' in head or ('"request_throughput"' in head and '"completed"' in head)

def _convert(p: Path, o: ImportOptions) -> tuple[pl.DataFrame, ImportReport]:
    return import_vllm_bench(p, model=o.model)


IMPORTER = Importer(
    "vllm-bench", "vLLM benchmark_serving.py / vllm bench serve result JSON saved with --save-detailed",
    convert=_convert, detect=_detect_vllm,
)
