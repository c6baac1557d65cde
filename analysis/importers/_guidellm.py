"""guidellm benchmark reports → request summaries (the mapping of :mod:`llmslo.analysis.importers`).

**guidellm** benchmark report JSON (``benchmarks[].requests.{successful, incomplete, errored}``), old
(``start_time``, ``first_token_time``, ``last_token_time``, ``end_time``, ``prompt_tokens``,
``output_tokens``, ``error``) and new (``info.timings.request_start``/``first_token_iteration``/
``last_token_iteration``/``request_end``, ``input_metrics``/``output_metrics``, ``info.error``) layouts.
Times are Unix seconds. ``incomplete`` requests were cancelled by guidellm at the benchmark's end →
``client_cancel``. guidellm's TPOT includes TTFT (÷ N) and its ITL is our TPOT; both are recomputed
from the raw times.
"""

from __future__ import annotations

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
    classify_failure,
    is_number,
    load_json,
    make_report,
    model_name,
)
from llmslo.analysis.importers._types import Importer, ImportOptions, ImportReport

__all__ = ["IMPORTER", "import_guidellm"]

NS_PER_S = 1e9
EPOCH_NS_FLOOR = 1e17
"""Timestamps (ns) at or above this are Unix time (after 1973); below, a monotonic clock's."""
_UNIT_TO_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "seconds": 1.0}

# ---- guidellm ----------------------------------------------------------------------------------------


def _dig(obj: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(k)
    return obj


def _guidellm_model(doc: Mapping[str, Any], bench: Mapping[str, Any]) -> str | None:
    for path in (("worker", "backend_model"), ("config", "model"), ("args", "model"), ("config", "backend", "model")):
        value = _dig(bench, *path)
        if isinstance(value, str) and value:
            return value
    value = _dig(doc, "args", "model")
    return value if isinstance(value, str) and value else None


def _strategy_label(bench: Mapping[str, Any]) -> str:
    strategy = _dig(bench, "args", "strategy") or _dig(bench, "config", "strategy") or _dig(bench, "scheduler",
                                                                                            "strategy")
    if not isinstance(strategy, dict):
        return DEFAULT_TENANT_CLASS
    kind = strategy.get("type_") or strategy.get("type") or "strategy"
    for key in ("rate", "streams", "max_concurrency"):
        if is_number(strategy.get(key)):
            return f"{kind}@{strategy[key]:g}"
    return str(kind)


_GUIDELLM_STATUS = {"successful": "ok", "incomplete": "client_cancel", "errored": "error"}


def _guidellm_times(rec: Mapping[str, Any], r: Reader) -> tuple[list[str], list[float | None]]:
    """Field names and values ``(start, first token, last token, end)``, Unix seconds, old or new layout."""
    timings = _dig(rec, "info", "timings")
    if isinstance(timings, dict):
        t = Reader(r.problems, r.row, timings, prefix=r.prefix + "info.timings.")
        start_name = "request_start" if timings.get("request_start") is not None else "resolve_start"
        end_name = "request_end" if timings.get("request_end") is not None else "resolve_end"
        names = [start_name, "first_token_iteration", "last_token_iteration", end_name]
        values = [t.seconds(start_name), t.seconds(names[1], required=False), t.seconds(names[2], required=False),
                  t.seconds(end_name, required=False)]
        r.ok = r.ok and t.ok
        return ["info.timings." + n for n in names], values
    names = ["start_time", "first_token_time", "last_token_time", "end_time"]
    return names, [r.seconds(names[0]), r.seconds(names[1], required=False), r.seconds(names[2], required=False),
                   r.seconds(names[3], required=False)]


def _guidellm_tokens(rec: Mapping[str, Any], r: Reader, side: str) -> int | None:
    old = "prompt_tokens" if side == "input" else "output_tokens"
    if rec.get(old) is not None:
        return r.count(old)
    metrics = rec.get(f"{side}_metrics")
    if isinstance(metrics, dict):
        m = Reader(r.problems, r.row, metrics, prefix=r.prefix + f"{side}_metrics.")
        for key in ("total_tokens", "text_tokens"):
            if metrics.get(key) is not None:
                value = m.count(key)
                r.ok = r.ok and m.ok
                return value
    if side == "output" and is_number(_dig(rec, "info", "timings", "token_iterations")):
        return int(_dig(rec, "info", "timings", "token_iterations"))
    return None


def import_guidellm(path: str | os.PathLike[str], *, model: str | None = None) -> tuple[pl.DataFrame, ImportReport]:
    """Convert a guidellm benchmark report JSON (``benchmarks.json``: old and new layouts).

    Raises :class:`~llmslo.analysis.importers.ImportFormatError` (nothing imported) for a report
    without per-request records or a malformed record, naming benchmark, list, index and field.
    """
    p = Path(path)
    problems = Problems(p)
    doc = load_json(p, problems)
    benches = doc.get("benchmarks") if isinstance(doc, dict) else None
    if not isinstance(benches, list):
        raise problems.file("benchmarks", "missing", "expected a JSON object with 'benchmarks' (a guidellm report; "
                            "save it as .json: YAML and CSV reports are not read)")
    found = next((m for b in benches if isinstance(b, dict) and (m := _guidellm_model(doc, b))), None)
    name, model_note = model_name(p, found, model)
    builder = RowBuilder(name)
    counts: Counter[str] = Counter()
    read = 0
    sampled = False
    for b, bench in enumerate(benches):
        requests = bench.get("requests") if isinstance(bench, dict) else None
        if not isinstance(requests, dict):
            problems.add(None, f"benchmarks[{b}].requests", None, "missing",
                         "each benchmark needs requests {successful, incomplete, errored}")
            continue
        assert isinstance(bench, dict)
        sampled = sampled or bench.get("request_samples") is not None
        tenant = _strategy_label(bench)
        j = 0
        for status, outcome in _GUIDELLM_STATUS.items():
            items = requests.get(status) or []
            if not isinstance(items, list):
                problems.add(None, f"benchmarks[{b}].requests.{status}", None, "type", "must be a list")
                continue
            for k, rec in enumerate(items):
                read += 1
                prefix = f"benchmarks[{b}].requests.{status}[{k}]."
                if not isinstance(rec, dict):
                    problems.add(read, prefix, rec, "type", "a request must be a JSON object")
                    continue
                r = Reader(problems, read, rec, prefix=prefix)
                names, (start, first, last, end) = _guidellm_times(rec, r)
                n_in = _guidellm_tokens(rec, r, "input")
                n_out = _guidellm_tokens(rec, r, "output")
                if start is None or not r.ok:
                    continue
                if outcome == "ok" and (end is None or n_out is None):
                    field = names[3] if end is None else "output_tokens"
                    r._bad(field, None, "missing", f"{prefix}{field}: a successful request needs it")
                    continue
                times = [start, first, last, end]
                for a_i, b_i in ((0, 1), (1, 2), (2, 3), (0, 3)):
                    r.order(names[a_i], times[a_i], names[b_i], times[b_i])
                if not r.ok:
                    continue
                rid = f"{p.name}#{b}.{j}"
                j += 1
                first_s, last_s, end_s = (None if t is None else t - start for t in (first, last, end))
                if outcome == "ok":
                    builder.add(Measured(rid, start, "ok", n_in or 0, n_out or 0, first_s, last_s, end_s,
                                         tenant_class=tenant))
                    continue
                message = rec.get("error") if isinstance(rec.get("error"), str) else _dig(rec, "info", "error")
                if outcome == "client_cancel":
                    finish, reject, etype = "client_cancel", None, None
                else:
                    finish, reject, etype = classify_failure(None, message if isinstance(message, str) else None)
                counts[f"{status}:{finish}:{reject or etype or '-'}"] += 1
                got = (n_out or 0) if first is not None else 0
                builder.add(Measured(rid, start, finish, n_in or 0, got, first_s, last_s, end_s,
                                     reject_reason=reject, error_type=etype, tenant_class=tenant))
    problems.raise_if_any()
    conversions = [
        model_note,
        "Times are guidellm's own Unix timestamps: ttft_s = first token − start, last_token_s = last token − "
        "start, e2e_s = end − start. guidellm's TPOT ((last − start)/N, TTFT included) is not used; our TPOT "
        "(last − first)/(N − 1) equals guidellm's ITL.",
        "tenant_class = the benchmark's scheduling strategy (e.g. constant@5, concurrent@8).",
        f"{builder.finish['stop']} successful request(s) → finish_reason stop (guidellm does not record stop vs "
        "length).",
    ]
    for key, n in sorted(counts.items()):
        status, finish, what = key.split(":", 2)
        why = " (cancelled by guidellm at the benchmark's end)" if status == "incomplete" else ""
        conversions.append(f"{n} {status} request(s) → {finish}{'' if what == '-' else ' / ' + what}{why}.")
    if sampled:
        conversions.append("guidellm kept a random sample of the requests (request_samples): every figure is over "
                           "the sample, not all requests.")
    report = make_report(p, "guidellm", "guidellm benchmark report", read, builder, conversions,
                         ["stop vs length", "per-token gaps (itl_s)"], True,
                         "arrival_unix_s = the request's start time (Unix seconds).")
    return builder.frame(), report


def _detect_guidellm(path: Path, head: str) -> bool:
    return head.lstrip().startswith("{") and '"benchmarks"' in head and (
        "generative" in head or "guidellm" in head or '"request_totals"' in head)

def _convert(p: Path, o: ImportOptions) -> tuple[pl.DataFrame, ImportReport]:
    return import_guidellm(p, model=o.model)


IMPORTER = Importer(
    "guidellm", "guidellm benchmark report JSON (benchmarks.json)", convert=_convert, detect=_detect_guidellm,
)
