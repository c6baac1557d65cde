"""``llmslo demo --engine llamacpp`` for a person: the engine run (:func:`llmslo.ops.run_engine_live`) checked
and printed.

:func:`engine_checks` says what the run proves, each claim with its figures: one client summary per attempt
(read from the client's store); the client's ``usage`` sums equal the engine's counter deltas exactly (prompt =
``prompt_tokens_total`` + ``prompt_tokens_cached_total``, completion = ``tokens_predicted_total``); the gateway's
summaries match the client's attempts one to one, each stream's TTFT at the gateway within the client's; the rules
load and evaluate without error and every dashboard query returns data; the burst queues (deferred > 0, the
client's TTFT grows) and goodput falls below the calm phase's. :func:`engine_run_dict` is the run's JSON (its
fields and the checks); :func:`print_engine_live` prints them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmslo.ops import ENGINE_COUNTERS

if TYPE_CHECKING:
    from rich.console import Console

    from llmslo.ops import EngineRun

__all__ = ["EngineCheck", "engine_checks", "engine_run_dict", "print_engine_live"]


@dataclass(frozen=True)
class EngineCheck:
    """One claim of the run, whether it held, and the figures behind it."""

    name: str
    passed: bool
    detail: str


def engine_checks(run: EngineRun) -> list[EngineCheck]:
    """Every claim of the run (module docstring), each with its figures."""
    attempts = run.attempts() if run.attempts_log.exists() else []
    return [_one_summary_each(run, attempts), _tokens_match(run, attempts), _gateway_matches(run, attempts),
            _deferred(run), *_queueing(run), _rules(run), _dashboards(run)]


def engine_run_dict(run: EngineRun) -> dict[str, Any]:
    """The run as JSON: :meth:`llmslo.ops.EngineRun.to_dict` and ``checks`` (each ``{"name", "passed",
    "detail"}``)."""
    return {**run.to_dict(), "checks": [asdict(c) for c in engine_checks(run)]}


def _one_summary_each(run: EngineRun, attempts: list[dict[str, Any]]) -> EngineCheck:
    rows = _client_ids(run.client_db) if run.client_db.exists() else []
    ids = [a["request_id"] for a in attempts]
    ok = bool(ids) and len(rows) == len(set(rows)) == len(ids) and set(rows) == set(ids)
    return EngineCheck("one client summary per attempt", ok,
                       f"{len(ids)} attempts, {len(rows)} client summaries ({len(set(rows))} distinct ids)")


def _tokens_match(run: EngineRun, attempts: list[dict[str, Any]]) -> EngineCheck:
    before, after = run.counters_before, run.counters_after
    if not all(k in before and k in after for k in ENGINE_COUNTERS):
        return EngineCheck("usage sums = engine counter deltas", False,
                           f"counters missing: before {sorted(before)}, after {sorted(after)}")
    sent = [a for a in attempts if a.get("sent_unix_s") is not None]
    missing = sum(1 for a in sent if a.get("status") == 200 and a.get("usage_completion_tokens") is None)
    prompt = sum(int(a.get("usage_prompt_tokens") or 0) for a in sent)
    completion = sum(int(a.get("usage_completion_tokens") or 0) for a in sent)
    prompt_total, prompt_cached, predicted = ENGINE_COUNTERS
    d_prompt = (after[prompt_total] - before[prompt_total]) + (after[prompt_cached] - before[prompt_cached])
    d_completion = after[predicted] - before[predicted]
    ok = missing == 0 and prompt == d_prompt and completion == d_completion and completion > 0
    return EngineCheck(
        "usage sums = engine counter deltas", ok,
        f"prompt: usage {prompt:,} vs prompt_tokens_total + prompt_tokens_cached_total +{d_prompt:,.0f}; "
        f"completion: usage {completion:,} vs tokens_predicted_total +{d_completion:,.0f}"
        + (f"; {missing} answered attempts without usage" if missing else ""))


def _gateway_matches(run: EngineRun, attempts: list[dict[str, Any]]) -> EngineCheck:
    """One gateway summary per attempt the client sent, the same finish, and each stream's TTFT at the gateway
    (from reading the request to passing the first token on) within the client's (from sending it to reading
    that token): both on the machine's monotonic clock."""
    name = "gateway summaries = client attempts, gateway TTFT <= client TTFT"
    rows = run.gateway_summaries() if run.gateway_rows.exists() else []
    gateway = {r["request_id"]: r for r in rows}
    sent = {a["request_id"]: a for a in attempts if a.get("sent_ns") is not None}
    if not sent or len(gateway) != len(rows) or set(gateway) != set(sent):
        return EngineCheck(name, False, f"{len(sent)} attempts sent, {len(rows)} gateway summaries "
                                        f"({len(gateway)} distinct ids, {len(set(gateway) & set(sent))} in common)")
    pairs = [(gateway[rid].get("ttft_s"), _client_ttft(a)) for rid, a in sent.items()]
    timed = [(g, c) for g, c in pairs if g is not None and c is not None]
    late = [(g, c) for g, c in timed if g > c]
    untimed = sum(1 for g, c in pairs if (g is None) != (c is None))  # a first token one side saw and the other not
    lead = _median([c - g for g, c in timed])
    ok = bool(timed) and not late and not untimed
    return EngineCheck(name, ok, f"{len(sent)} attempts, {len(rows)} gateway summaries, one to one; gateway TTFT "
                                 f"within the client's for {len(timed) - len(late)} of {len(timed)} streams"
                                 + (f" (median lead {lead * 1000:.2f} ms)" if lead is not None else "")
                                 + (f"; {untimed} with a first token on one side only" if untimed else ""))


def _deferred(run: EngineRun) -> EngineCheck:
    value = run.deferred_max
    return EngineCheck("the burst queues in the engine", value is not None and value > 0,
                       "max llamacpp:requests_deferred during the run: "
                       + ("unknown (no Prometheus)" if value is None else f"{value:g}"))


def _queueing(run: EngineRun) -> list[EngineCheck]:
    phases = run.phases()
    slo = run.plan.ttft_slo_ms / 1000
    figures = {}
    for name, attempts in phases.items():
        answered = sorted(t for t in (_client_ttft(a) for a in attempts) if t is not None)
        good = sum(1 for t in answered if t <= slo)
        figures[name] = (len(attempts), _median(answered), good / len(attempts) if attempts else math.nan)
    (nc, tc, gc), (nb, tb, gb) = figures["calm"], figures["burst"]
    grows = tc is not None and tb is not None and tb > tc
    falls = nc > 0 and nb > 0 and gb < gc
    return [
        EngineCheck("client TTFT grows in the burst", grows,
                    f"median client TTFT: calm {_fmt_s(tc)} ({nc} attempts), burst {_fmt_s(tb)} ({nb})"),
        EngineCheck("goodput falls in the burst", falls,
                    f"share with client TTFT <= {slo:g} s: calm {gc:.0%}, burst {gb:.0%}"),
    ]


def _rules(run: EngineRun) -> EngineCheck:
    if run.prometheus_note:
        return EngineCheck("engine rules evaluate without error", False, run.prometheus_note)
    bad = [(r["name"], r["health"], r["last_error"]) for r in run.rule_groups
           if r["health"] != "ok" or r["last_error"]]
    ok = bool(run.rule_groups) and not bad
    return EngineCheck("engine rules evaluate without error", ok,
                       f"{len(run.rule_groups)} rules loaded" + (f"; failing: {bad[:3]}" if bad else ""))


def _dashboards(run: EngineRun) -> EngineCheck:
    empty = [q for q in run.dashboard_queries if q["error"] or not q["series"]]
    ok = bool(run.dashboard_queries) and not empty
    return EngineCheck("every dashboard query returns data", ok,
                       f"{len(run.dashboard_queries)} queries"
                       + (f"; without data: {[(q['panel'], q['expr'], q['error']) for q in empty][:3]}"
                          if empty else ""))


def _client_ids(db: Path) -> list[str]:
    """The ``request_id`` of every summary in the client's store at ``db``."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return [str(r[0]) for r in con.sql("SELECT request_id FROM request_summaries").fetchall()]
    finally:
        con.close()


def _client_ttft(a: dict[str, Any]) -> float | None:
    """An attempt's TTFT as the client saw it, seconds (None: no chunk came)."""
    chunks, sent = a.get("chunk_ns") or [], a.get("sent_ns")
    return (int(chunks[0]) - int(sent)) / 1e9 if chunks and sent is not None else None


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def _fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"


def print_engine_live(run: EngineRun, out: Console) -> None:
    """The run for a person: each claim with its figures, then the files and what to explore."""
    from llmslo.cli._common import shown

    plan = run.plan
    out.print(shown(f"llama-server {run.url} behind llmslo gateway {run.gateway_url}: calm {plan.rate_per_s:g} "
                    f"req/s for {plan.calm_s:g} s, burst x{plan.burst_factor:g} for {plan.burst_s:g} s, calm "
                    f"{plan.after_burst_s:g} s"), highlight=False, soft_wrap=True)
    for check in engine_checks(run):
        out.print(shown(f"{'PASS' if check.passed else 'FAIL'}  {check.name}: {check.detail}"), highlight=False,
                  soft_wrap=True)
    out.print(shown(f"files: {run.folder} (client.duckdb, attempts.jsonl, gateway/, llamacpp-rules.yml, dashboards/, "
                    "llama-server.log, gateway.log, prometheus/)"), highlight=False, soft_wrap=True)
    out.print(shown(f"explore: llmslo report --db {run.client_db} --window 10s"), highlight=False, soft_wrap=True)
