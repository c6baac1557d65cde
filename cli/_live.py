"""``llmslo demo --live`` for a person: the live run (:func:`llmslo.ops.run_live`) printed.

:func:`print_live` shows three views of the same requests (the client's, the server's summaries, Prometheus's
counters), the alerts, the drain and the files; :func:`finish_counts` counts a store's summaries by finish
reason through the report (``llmslo.analysis.report.build_report``), the one count every view of a run shows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from llmslo.ops import LiveRun

__all__ = ["finish_counts", "print_live"]


def _offset(run: LiveRun, t: float | None) -> str:
    return "-" if t is None else f"{t - run.started_unix_s:+.1f} s"


def print_live(run: LiveRun, out: Console) -> None:
    """The live run for a person: three views of the same requests, the alerts, the drain, the files."""
    from rich.table import Table

    from llmslo.cli._common import shown

    server = _counts(run.server_db)
    client = _counts(run.client_db, run.long_client_db)
    prom = run.prometheus.requests_by_finish_reason if run.prometheus is not None else {}
    plan = run.plan
    out.print(f"phases: calm 0-{plan.calm_s:g} s, burst x{plan.burst_factor:g} {plan.calm_s:g}-"
              f"{plan.calm_s + plan.burst_s:g} s, calm, long reply at {_offset(run, run.long_stream_unix_s)}, "
              f"SIGTERM at {_offset(run, run.sigterm_unix_s)}", highlight=False)
    table = Table(title="The same requests, three views", title_justify="left")
    for col in ("finish reason", "client (llmslo load)", "server summaries", "Prometheus llmslo_requests_total"):
        table.add_column(col, justify="left" if col == "finish reason" else "right")
    for reason in sorted(set(server) | set(client) | set(prom)):
        table.add_row(shown(reason), f"{client.get(reason, 0):,}", f"{server.get(reason, 0):,}",
                      f"{prom[reason]:,}" if reason in prom else "-")
    out.print(table)
    if run.prometheus is not None:
        by_reason = ", ".join(f"{k} {v:,}" for k, v in sorted(run.prometheus.rejected_by_reason.items()))
        out.print(shown(f"rejected by the server, by reason (Prometheus llmslo_rejected_requests_total): "
                        f"{by_reason or 'none'}"), highlight=False, soft_wrap=True)
    refused = (run.load_json or {}).get("run", {}).get("refused")
    out.print(f"client rejected includes {refused if refused is not None else 'the'} arrival(s) the client's "
              "breaker held back (circuit_open) while it honoured a Retry-After: never sent, so the server has no "
              "summary of them", highlight=False, soft_wrap=True)
    if run.prometheus_note:
        out.print(shown(run.prometheus_note), highlight=False)
    alerts = Table(title="Alerts (seconds from the first arrival)", title_justify="left")
    for col in ("alert", "pending", "firing", "resolved"):
        alerts.add_column(col)
    for a in run.alerts:
        if a.firing_unix_s is not None:
            alerts.add_row(shown(a.name), _offset(run, a.pending_unix_s), _offset(run, a.firing_unix_s),
                           _offset(run, a.resolved_unix_s))
    out.print(alerts)
    try:
        drain = json.loads(run.drain_record.read_text())["drain"]
    except (OSError, ValueError, KeyError):
        out.print("drain: no drain record was written", highlight=False)
    else:
        cut = ", ".join(f"{k} {v}" for k, v in drain.get("closed_by_reason", {}).items())
        out.print(shown(f"drain: {drain.get('decision')} after settle {drain.get('unregister_settle_s')} s; "
                        f"{drain.get('in_flight_at_start')} in flight when it began, closed by reason: {cut}; "
                        f"terminated {drain.get('terminated')}"), highlight=False)
    out.print(shown(f"files: {run.folder} (server.duckdb, client.duckdb, attempts.jsonl, long-client.duckdb, "
                    f"{run.long_attempts_log.name}, drain-record.json, live-rules.yml, prometheus/, run.json)"),
              highlight=False)
    out.print(shown(f"explore: llmslo report --db {run.server_db} --window 10s   |   "
                    f"llmslo report --db {run.client_db} --window 10s   |   llmslo app --db {run.server_db}"),
              highlight=False, soft_wrap=True)


def _counts(*dbs: Path) -> dict[str, int]:
    """Summaries by finish reason, summed over the stores of ``dbs`` that exist (as the report counts them)."""
    counts: dict[str, int] = {}
    for db in dbs:
        if db.exists():
            for reason, n in finish_counts(db).get((), {}).items():
                counts[reason] = counts.get(reason, 0) + n
    return counts


def finish_counts(db: Path, by: tuple[str, ...] = ()) -> dict[tuple[str, ...], dict[str, int]]:
    """Summaries by finish reason (reasons with none left out) in each group of ``by`` (columns of
    ``llmslo.analysis.report.GROUP_COLUMNS``; the key is the group's values, ``()`` without ``by``), as the
    report counts them."""
    from llmslo.analysis.report import GoodputPolicy, ReportSpec, build_report
    from llmslo.analysis.store import Store

    with Store.open(db, read_only=True) as store:
        report = build_report(store.con, ReportSpec(GoodputPolicy(), by=by))
    return {tuple(str(g.keys[k]) for k in by): {r: n for r, n in g.finish_reasons.items() if n}
            for g in report.groups}
