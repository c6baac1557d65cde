"""LLMPerf individual responses → request summaries (the mapping of :mod:`llmslo.analysis.importers`).

**LLMPerf** individual responses (a JSON list): ``inter_token_latency_s`` is LLMPerf's per-request mean
that includes TTFT and divides by N (the sum of chunk gaps since the request was sent, ÷ N). Its
product with N is the last chunk's arrival, so ``last_token_s = inter_token_latency_s × N`` and our TPOT
``(last_token_s − ttft_s)/(N − 1)`` excludes the first token. Where that product does not lie between
``ttft_s`` and ``end_to_end_latency_s`` but the value itself does (LLMPerf leaves it undivided for some
failed requests), ``last_token_s`` = the value; where neither does, ``last_token_s = e2e_s`` (TPOT then
equals vLLM bench's ``(e2e − TTFT)/(N − 1)``). ``error_code`` 429 → rejected; −100 ("output too few
tokens") → ``error``/``too_few_tokens`` with its times and tokens kept; other codes → ``http_<code>``
or ``client_error``. Failed requests with all times 0 had no response: 0 tokens (LLMPerf writes 1),
unknown duration.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import polars as pl

from llmslo.analysis.importers._common import (
    EPS_S,
    NO_ARRIVALS_NOTE,
    Measured,
    Problems,
    Reader,
    RowBuilder,
    classify_failure,
    id_prefix,
    load_json,
    make_report,
    model_name,
    quantile_note,
    stop_note,
)
from llmslo.analysis.importers._types import Importer, ImportOptions, ImportReport

__all__ = ["IMPORTER", "import_llmperf"]

NO_DURATION_NOTE = (
    "none recorded: an LLMPerf individual-responses file holds per-request measurements only (the run's "
    "duration is in its summary file, not here)"
)

# ---- LLMPerf ---------------------------------------------------------------------------------------

LLMPERF_TOO_FEW_TOKENS = -100
"""LLMPerf's ``error_code`` for a reply with fewer tokens than requested."""


def _llmperf_last_token(ttft: float, e2e: float, itl: float, n: int) -> tuple[float, str]:
    """``(last_token_s, how)`` from LLMPerf's ``inter_token_latency_s`` (see the module docstring)."""
    product = itl * n
    if ttft - EPS_S <= product <= e2e + EPS_S:
        return min(max(product, ttft), e2e), "times_n"
    if ttft - EPS_S <= itl <= e2e + EPS_S:
        return min(max(itl, ttft), e2e), "undivided"
    return e2e, "e2e"


def import_llmperf(path: str | os.PathLike[str], *, model: str | None = None) -> tuple[pl.DataFrame, ImportReport]:
    """Convert an LLMPerf individual-responses file (``<provider>_<size>.json``: a JSON list of requests).

    Returns the request-summary frame and the import report; raises
    :class:`~llmslo.analysis.importers.ImportFormatError` (nothing imported) when a record lacks a
    field or holds a wrong value, naming the record (1-based) and the field.
    """
    p = Path(path)
    problems = Problems(p)
    data = load_json(p, problems)
    if isinstance(data, dict):
        hint = " (an LLMPerf summary file? import the *_individual_responses.json beside it)" if any(
            str(k).startswith("results_") for k in data) else ""
        raise problems.file("-", "not_a_list", f"expected a JSON list of per-request results{hint}")
    if not isinstance(data, list):
        raise problems.file("-", "not_a_list", "expected a JSON list of per-request results")
    if not data:
        raise problems.file("-", "empty", "the list holds no requests; was the run cut short?")
    name, model_note = model_name(p, None, model)
    prefix = id_prefix(p)
    builder = RowBuilder(name)
    how: Counter[str] = Counter()
    codes: Counter[int] = Counter()
    no_response = 0
    for i, rec in enumerate(data):
        row = i + 1
        if not isinstance(rec, dict):
            problems.add(row, "-", rec, "type", f"record {row} must be a JSON object")
            continue
        r = Reader(problems, row, rec)
        if "error_code" not in rec:
            r._bad("error_code", None, "missing", "error_code is required (null for a successful request)")
        code = rec.get("error_code")
        if code is not None and not (isinstance(code, int) and not isinstance(code, bool)):
            r._bad("error_code", code, "type", "error_code must be null or a whole number")
            code = None
        ttft = r.seconds("ttft_s")
        e2e = r.seconds("end_to_end_latency_s")
        itl = r.seconds("inter_token_latency_s")
        n_in = r.count("number_input_tokens")
        n_out = r.count("number_output_tokens")
        msg = r.text("error_msg")
        r.order("ttft_s", ttft, "end_to_end_latency_s", e2e)
        if not r.ok or ttft is None or e2e is None or itl is None or n_in is None or n_out is None:
            continue
        rid = f"{prefix}#{i}"
        responded = ttft > 0 or e2e > 0
        if rec.get("error_code") is None:
            m = Measured(rid, 0.0, "ok", n_in, n_out, ttft, None, e2e)
        else:
            assert isinstance(code, int)
            codes[code] += 1
            if code == LLMPERF_TOO_FEW_TOKENS:
                finish, reject, etype = "error", None, "too_few_tokens"
            else:
                finish, reject, etype = classify_failure(code if 100 <= code <= 599 else None, None)
                if not 100 <= code <= 599:
                    finish, reject, etype = classify_failure(None, msg) if msg else ("error", None, "client_error")
            if not responded:
                no_response += 1
            m = Measured(rid, 0.0, finish, n_in, n_out if responded else 0, ttft if responded else None,
                         None, e2e if responded else None, reject_reason=reject, error_type=etype)
        if m.first_s is not None and m.output_tokens > 0:
            assert m.complete_s is not None
            m.last_s, way = _llmperf_last_token(m.first_s, m.complete_s, itl, m.output_tokens)
            how[way] += 1
        builder.add(m)
    problems.raise_if_any()
    conversions = [model_note]
    if how["times_n"]:
        conversions.append(
            f"inter_token_latency_s is LLMPerf's per-request mean that includes TTFT and divides by N (chunk gaps "
            f"since the request was sent, ÷ N): last_token_s = inter_token_latency_s × N (the last chunk), so "
            f"TPOT = (last_token_s − ttft_s)/(N − 1) excludes the first token ({how['times_n']} requests)."
        )
    if how["undivided"]:
        conversions.append(
            f"For {how['undivided']} request(s) inter_token_latency_s × N exceeds the request's duration while the "
            "value itself lies between ttft_s and end_to_end_latency_s (LLMPerf left it undivided): "
            "last_token_s = inter_token_latency_s."
        )
    if how["e2e"]:
        conversions.append(
            f"For {how['e2e']} request(s) inter_token_latency_s fits neither reading: last_token_s = "
            "end_to_end_latency_s, so their TPOT is (e2e − TTFT)/(N − 1) (vLLM bench's definition)."
        )
    if note := stop_note(builder, "LLMPerf", "error_code null"):
        conversions.append(note)
    for code, n in sorted(codes.items()):
        if code == LLMPERF_TOO_FEW_TOKENS:
            conversions.append(
                f"error_code -100 ('Output too few tokens', {n} requests) → error / too_few_tokens; their "
                "measured times and tokens are kept (LLMPerf drops them from its summary)."
            )
        elif code == 429:
            conversions.append(f"error_code 429 ({n} requests) → rejected / rate_limited.")
        elif 100 <= code <= 599:
            conversions.append(f"error_code {code} ({n} requests) → error / http_{code}.")
        else:
            conversions.append(f"error_code {code} ({n} requests) → error / client_error (or client_timeout "
                               "when error_msg says so).")
    if no_response:
        conversions.append(
            f"{no_response} failed request(s) have all times 0 (no response): generated_tokens = 0 (LLMPerf "
            "writes 1 for them)."
        )
    conversions.append(
        "Token counts are LLMPerf's re-tokenization of the received text: generated_tokens = sent_tokens = "
        "number_output_tokens; prompt_tokens = number_input_tokens. request_output_throughput_token_per_s "
        "is not imported (the report derives rates)."
    )
    conversions.append(LLMPERF_QUANTILES)
    missing = ("request start times (arrival_unix_s)", "stop vs length", "per-token gaps (itl_s)")
    report = make_report(p, "llmperf", "LLMPerf individual responses", len(data), builder, conversions,
                         missing, False, NO_ARRIVALS_NOTE, id_prefix=prefix, run_duration=(None, NO_DURATION_NOTE))
    return builder.frame(), report


LLMPERF_QUANTILES = quantile_note(
    "LLMPerf", "pandas Series.quantile with its default interpolation, in metrics_summary of token_benchmark_ray.py")
"""How LLMPerf computes the percentiles of its summary (ray-project/llmperf, token_benchmark_ray.py)."""


def _detect_llmperf(path: Path, head: str) -> bool:
    text = head.lstrip()
    return text.startswith("[") and '"end_to_end_latency_s"' in head and '"ttft_s"' in head

def _convert(p: Path, o: ImportOptions) -> tuple[pl.DataFrame, ImportReport]:
    return import_llmperf(p, model=o.model)


IMPORTER = Importer(
    "llmperf", "LLMPerf individual responses (a JSON list per run)", convert=_convert, detect=_detect_llmperf,
)
