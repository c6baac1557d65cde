"""guidellm benchmark reports → request summaries (the mapping of :mod:`llmslo.analysis.importers`).

**guidellm** benchmark report JSON (``benchmarks[].requests.{successful, incomplete, errored}``), old
(``start_time``, ``first_token_time``, ``last_token_time``, ``end_time``, ``prompt_tokens``,
``output_tokens``, ``error``) and new (``info.timings.request_start``/``first_token_iteration``/
``last_token_iteration``/``request_end``, ``input_metrics``/``output_metrics``, ``info.error``) layouts.
Times are Unix seconds. ``incomplete`` requests were cancelled by guidellm at the benchmark's end →
``client_cancel``. guidellm's TPOT includes TTFT (÷ N) and its ITL is our TPOT; both are recomputed
from the raw times.

guidellm >= 0.5 lists every request it made, warm-up and cool-down included, but computes its metrics
only over the requests that overlap the measured window ``scheduler_metrics.measure_start_time`` →
``measure_end_time`` (a request counts when it ends at or after the start and starts at or before the
end). The others are not imported unless asked (``keep_warmup_cooldown``: ``tenant_class`` ``warmup`` /
``cooldown``). ``max_tokens`` is read from ``request_args`` (a reply that reached it finished ``length``).
The run's duration is guidellm's benchmark ``duration`` summed over the file's benchmarks: the measured
window in >= 0.5 (what guidellm divides its rates by); with warm-up and cool-down kept, the request span.
"""

from __future__ import annotations

import ast
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
    id_prefix,
    is_number,
    limit_of,
    load_json,
    make_report,
    model_name,
    quantile_note,
    stop_note,
)
from llmslo.analysis.importers._types import (
    COOLDOWN_TENANT_CLASS,
    WARMUP_TENANT_CLASS,
    Importer,
    ImportOptions,
    ImportReport,
)

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


def _request_limit(rec: Mapping[str, Any]) -> int | None:
    """The ``max_tokens`` the request carried: guidellm writes ``request_args`` as the text of a Python dict
    (``str(arguments.model_dump())``), read here as a literal (never executed); None when not recorded."""
    args: Any = rec.get("request_args")
    if isinstance(args, str):
        try:
            args = ast.literal_eval(args)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None
    if not isinstance(args, dict):
        return None
    return limit_of(args.get("body")) or limit_of(args)


def _measured_window(bench: Mapping[str, Any]) -> tuple[float, float] | None:
    """guidellm's measured window ``(measure_start_time, measure_end_time)``, Unix seconds (guidellm >= 0.5)."""
    metrics = bench.get("scheduler_metrics")
    if not isinstance(metrics, dict):
        return None
    start, end = as_float(metrics.get("measure_start_time")), as_float(metrics.get("measure_end_time"))
    if start is None or end is None or start <= 0 or end < start:
        return None
    return start, end


def _phase(window: tuple[float, float] | None, start: float, end: float | None) -> str | None:
    """``warmup`` / ``cooldown`` for a request outside the window by guidellm's own rule (a request counts when
    it ends at or after the window's start and starts at or before its end), None inside."""
    if window is None:
        return None
    if (end if end is not None else start) < window[0]:
        return WARMUP_TENANT_CLASS
    if start > window[1]:
        return COOLDOWN_TENANT_CLASS
    return None


def _guidellm_duration(benches: list[Any], keep: bool) -> tuple[float | None, str]:
    """The run's duration as guidellm recorded it, summed over the file's benchmarks (see the module docstring)."""
    windows = [_measured_window(b) if isinstance(b, dict) else None for b in benches]
    if keep and windows and all(w is not None for w in windows):
        spans = []
        for b in benches:
            sm = b["scheduler_metrics"]
            first, last = as_float(sm.get("request_start_time")), as_float(sm.get("request_end_time"))
            if first is None or last is None or first <= 0 or last < first:
                first, last = as_float(sm.get("start_time")), as_float(sm.get("end_time"))
            if first is None or last is None or last < first:
                return None, "none: a benchmark records no request span (scheduler_metrics)"
            spans.append(last - first)
        measured = sum(w[1] - w[0] for w in windows if w is not None)
        return sum(spans), (
            f"the sum over the file's {len(spans)} benchmark(s) of guidellm's request span (scheduler_metrics "
            "request_start_time → request_end_time), since warm-up and cool-down rows were kept; guidellm's own "
            f"rates divide by the measured windows, {measured:.6g} s in all"
        )
    values = [as_float(b.get("duration")) if isinstance(b, dict) else None for b in benches]
    if not values or any(v is None for v in values):
        return None, "none recorded: a benchmark has no 'duration'"
    what = ("measured window, measure_start_time → measure_end_time, what guidellm divides its rates by"
            if all(w is not None for w in windows) else "start_time → end_time")
    return sum(v for v in values if v is not None), (
        f"the sum of guidellm's benchmark 'duration' ({what}) over the file's {len(values)} benchmark(s)"
    )


GUIDELLM_QUANTILES = quantile_note(
    "guidellm", "Percentiles.from_pdf in guidellm/schemas/statistics.py from guidellm 0.4 on, DistributionSummary "
    "in guidellm/objects/statistics.py before; up to the float rounding of its cumulative sum", nearest_rank=True)
"""How guidellm computes the percentiles of its ``metrics`` (vllm-project/guidellm, every version whose report
this importer reads)."""


def import_guidellm(
    path: str | os.PathLike[str], *, model: str | None = None, keep_warmup_cooldown: bool = False
) -> tuple[pl.DataFrame, ImportReport]:
    """Convert a guidellm benchmark report JSON (``benchmarks.json``: old and new layouts).

    Requests outside a benchmark's measured window (guidellm >= 0.5 ``scheduler_metrics``) are left out, as
    guidellm leaves them out of its own metrics; ``keep_warmup_cooldown`` imports them in ``tenant_class``
    ``warmup`` / ``cooldown``. Raises :class:`~llmslo.analysis.importers.ImportFormatError` (nothing
    imported) for a report without per-request records or a malformed record, naming benchmark, list, index
    and field.
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
    prefix = id_prefix(p)
    builder = RowBuilder(name)
    counts: Counter[str] = Counter()
    outside: Counter[tuple[str, str]] = Counter()
    read = 0
    sampled = False
    windows = 0
    for b, bench in enumerate(benches):
        requests = bench.get("requests") if isinstance(bench, dict) else None
        if not isinstance(requests, dict):
            problems.add(None, f"benchmarks[{b}].requests", None, "missing",
                         "each benchmark needs requests {successful, incomplete, errored}")
            continue
        assert isinstance(bench, dict)
        sampled = sampled or bench.get("request_samples") is not None or _sampled(bench, requests)
        window = _measured_window(bench)
        windows += window is not None
        strategy = _strategy_label(bench)
        j = -1
        for status, outcome in _GUIDELLM_STATUS.items():
            items = requests.get(status) or []
            if not isinstance(items, list):
                problems.add(None, f"benchmarks[{b}].requests.{status}", None, "type", "must be a list")
                continue
            for k, rec in enumerate(items):
                read += 1
                j += 1  # the record's place in its benchmark, whether imported or not: ids do not shift
                where = f"benchmarks[{b}].requests.{status}[{k}]."
                if not isinstance(rec, dict):
                    problems.add(read, where, rec, "type", "a request must be a JSON object")
                    continue
                r = Reader(problems, read, rec, prefix=where)
                names, (start, first, last, end) = _guidellm_times(rec, r)
                n_in = _guidellm_tokens(rec, r, "input")
                n_out = _guidellm_tokens(rec, r, "output")
                if start is None or not r.ok:
                    continue
                if outcome == "ok" and (end is None or n_out is None):
                    field = names[3] if end is None else "output_tokens"
                    r._bad(field, None, "missing", f"{where}{field}: a successful request needs it")
                    continue
                times = [start, first, last, end]
                for a_i, b_i in ((0, 1), (1, 2), (2, 3), (0, 3)):
                    r.order(names[a_i], times[a_i], names[b_i], times[b_i])
                if not r.ok:
                    continue
                phase = _phase(window, start, end)
                if phase is not None:
                    outside[(phase, status)] += 1
                    if not keep_warmup_cooldown:
                        continue
                tenant = phase or strategy
                rid = f"{prefix}#{b}.{j}"
                first_s, last_s, end_s = (None if t is None else t - start for t in (first, last, end))
                if outcome == "ok":
                    builder.add(Measured(rid, start, "ok", n_in or 0, n_out or 0, first_s, last_s, end_s,
                                         tenant_class=tenant, max_tokens=_request_limit(rec)))
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
        *_window_notes(outside, windows, len(benches), keep_warmup_cooldown),
    ]
    conversions.append(GUIDELLM_QUANTILES)
    if note := stop_note(builder, "guidellm", "status successful"):
        conversions.append(note)
    for key, n in sorted(counts.items()):
        status, finish, what = key.split(":", 2)
        why = " (cancelled by guidellm at the benchmark's end)" if status == "incomplete" else ""
        conversions.append(f"{n} {status} request(s) → {finish}{'' if what == '-' else ' / ' + what}{why}.")
    if sampled:
        conversions.append("guidellm kept a random sample of the requests (request_samples / --sample-requests): "
                           "every figure is over the sample, not all requests.")
    missing = ["per-token gaps (itl_s)"]
    if builder.notes["limit_known"] < builder.finish["stop"] + builder.finish["length"]:
        missing.insert(0, "stop vs length (max_tokens) for some successful requests")
    report = make_report(p, "guidellm", "guidellm benchmark report", read, builder, conversions, missing, True,
                         "arrival_unix_s = the request's start time (Unix seconds).", id_prefix=prefix,
                         run_duration=_guidellm_duration(benches, keep_warmup_cooldown))
    return builder.frame(), report


def _sampled(bench: Mapping[str, Any], requests: Mapping[str, Any]) -> bool:
    """True when the file holds fewer requests than guidellm made (``--sample-requests``, guidellm >= 0.5)."""
    made = _dig(bench, "scheduler_metrics", "requests_made", "total")
    held = sum(len(v) for k, v in requests.items() if k in _GUIDELLM_STATUS and isinstance(v, list))
    return is_number(made) and held < made


def _window_notes(outside: Counter[tuple[str, str]], windows: int, benches: int, keep: bool) -> list[str]:
    """What was done with the requests outside guidellm's measured windows."""
    if windows == 0:
        return ["The file records no measured window (guidellm < 0.5): every request is imported."]
    if not outside:
        return [f"Every request lies in its benchmark's measured window ({windows} of {benches} benchmark(s) "
                "record one): none excluded."]
    total = sum(outside.values())
    parts = []
    for phase, rule in ((WARMUP_TENANT_CLASS, "ended before measure_start_time"),
                        (COOLDOWN_TENANT_CLASS, "started after measure_end_time")):
        by_status = ", ".join(f"{n} {status}" for (ph, status), n in sorted(outside.items()) if ph == phase)
        if by_status:
            parts.append(f"{phase}: {sum(n for (ph, _), n in outside.items() if ph == phase)} ({by_status}) "
                         f"{rule}")
    detail = "; ".join(parts)
    if keep:
        return [f"{total} request(s) lie outside guidellm's measured window ({detail}); guidellm leaves them out "
                "of its own metrics. Kept as asked (keep_warmup_cooldown): tenant_class warmup / cooldown, so "
                "`llmslo report --by tenant_class` keeps them apart."]
    return [f"{total} request(s) outside guidellm's measured window not imported ({detail}): guidellm leaves "
            "them out of its own metrics, so llmslo's figures match guidellm's. `llmslo import "
            "--keep-warmup-cooldown` imports them in tenant_class warmup / cooldown."]


def _detect_guidellm(path: Path, head: str) -> bool:
    return head.lstrip().startswith("{") and '"benchmarks"' in head and (
        "generative" in head or "guidellm" in head or '"request_totals"' in head)

def _convert(p: Path, o: ImportOptions) -> tuple[pl.DataFrame, ImportReport]:
    return import_guidellm(p, model=o.model, keep_warmup_cooldown=o.keep_warmup_cooldown)


IMPORTER = Importer(
    "guidellm", "guidellm benchmark report JSON (benchmarks.json)", convert=_convert, detect=_detect_guidellm,
)
