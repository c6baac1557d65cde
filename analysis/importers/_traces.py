"""``llmslo import azure|mooncake|burstgpt``: a trace becomes an arrival schedule beside the store.

The trace readers live in :mod:`llmslo.analysis.workload`; this module turns their result into an import
(a schedule file written beside the store, no request summaries) with its report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from llmslo.analysis.importers._types import Detector, Importer, ImportOptions, ImportReport, Runner
from llmslo.analysis.workload import (
    SCHEDULE_SCHEMA,
    TRACE_KINDS,
    TRACE_NOTE,
    TraceSummary,
    read_trace,
    replay_command,
    trace_kind_of_line,
)

__all__ = ["TRACE_IMPORTERS", "schedule_path"]

# ---------------------------------------------------------------------------------------------------
# ``llmslo import azure|mooncake|burstgpt``: a schedule file beside the store, no request summaries

_TOOLS: Mapping[str, str] = {
    "azure": "Azure LLM inference trace (CSV)",
    "mooncake": "Mooncake trace (JSONL)",
    "burstgpt": "BurstGPT trace (CSV)",
}
_NO_LATENCY = ("queue_s", "ttft_s", "tpot_s", "itl_s", "e2e_s", "finish_reason")


def schedule_path(db: Path, source: Path) -> Path:
    """Where ``llmslo import`` writes the schedule of ``source``: ``<db stem>.<source stem>.schedule.parquet``
    beside the store (trace folders may be read-only)."""
    return db.with_name(f"{db.stem}.{source.stem}.schedule.parquet")


def _import_report(kind: str, source: Path, written: Path, summary: TraceSummary,
                   options: ImportOptions) -> ImportReport:
    figures = (f"{summary.requests:,} requests over {summary.duration_s:,.1f} s, mean rate "
               f"{(summary.mean_rate_per_s or 0.0):.3g}/s, inter-arrival CV "
               f"{'-' if summary.interarrival_cv is None else f'{summary.interarrival_cv:.3g}'}")
    conversions = [
        f"{TRACE_NOTE}; the schedule ({', '.join(SCHEDULE_SCHEMA)}"
        f"{', source_model' if summary.models else ''}) was written to {written}; replay it with "
        f"`{replay_command(written)}` (URL: your server)",
        f"arrival times became offset_s, seconds after the first arrival: {figures}",
        *summary.notes,
    ]
    if options.model is not None:
        conversions.append("--model is ignored: a schedule holds no model column"
                           + (" (the trace's own model names are kept in source_model)" if summary.models else ""))
    start = ""
    if summary.start_unix_s is not None:
        from datetime import UTC, datetime

        start = f"; first arrival {datetime.fromtimestamp(summary.start_unix_s, UTC).isoformat()}"
    return ImportReport(
        source=str(source), kind=kind, tool=_TOOLS[kind], rows_read=summary.requests,
        rows_imported=summary.requests, conversions=tuple(conversions), missing_fields=_NO_LATENCY,
        arrivals_available=True,
        arrival_note=f"kept as offsets in the schedule (replayed by llmslo load --schedule), not in the store{start}",
        run_duration_note=(f"not applicable: a schedule, not request summaries (the trace spans "
                           f"{summary.duration_s:,.1f} s)"),
    )


def _runner(kind: str) -> Runner:
    def run(paths: Sequence[Path], db: Path, options: ImportOptions) -> list[ImportReport]:
        read = [(p, *read_trace(kind, p)) for p in paths]  # every file is read before anything is written
        reports: list[ImportReport] = []
        used: set[Path] = set()
        for source, schedule, summary in read:
            target = schedule_path(db, source)
            n = 2
            while target in used:
                target = db.with_name(f"{db.stem}.{source.stem}-{n}.schedule.parquet")
                n += 1
            used.add(target)
            schedule.write_parquet(target)
            reports.append(_import_report(kind, source, target, summary, options))
        return reports

    return run


def _detector(kind: str) -> Detector:
    def detect(path: Path, head: str) -> bool:
        first = next((line for line in head.splitlines() if line.strip()), "")
        return trace_kind_of_line(first) == kind

    return detect


TRACE_IMPORTERS: tuple[Importer, ...] = tuple(
    Importer(kind, f"{_TOOLS[kind]}: becomes an arrival schedule, not request summaries",
             run=_runner(kind), detect=_detector(kind))
    for kind in TRACE_KINDS
)
"""The trace kinds of ``llmslo import``, in the order of :data:`~llmslo.analysis.workload.TRACE_KINDS`."""
