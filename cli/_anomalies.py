"""``llmslo anomalies``: distribution changes of latency in the store, against a baseline.

Also what ``report`` and ``anomalies`` share to choose where the summaries are read (:func:`opened_database`):
a DuckDB store (``--db``), the sink's Parquet files (``--source``, out of core under ``--memory-limit``) or a
ClickHouse store (``--database clickhouse --url``), each restricted to ``--from``/``--to``, and the progress
bar of a long query (:class:`QueryProgress`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from llmslo.cli._common import EXIT_USAGE, err, parse_time, shown
from llmslo.cli._common import console as _console
from llmslo.cli._common import duration as _duration
from llmslo.cli._common import fail as _fail
from llmslo.cli._help import ANOMALY_METRICS
from llmslo.telemetry import LlmsloError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from llmslo.analysis.anomaly import AnomalyReport, TighteningSignal
    from llmslo.analysis.databases import Database, TimeRange

__all__ = [
    "DATABASES",
    "DbOption",
    "DatabaseOption",
    "FromOption",
    "MemoryLimitOption",
    "QueryProgress",
    "RenamedEngineOption",
    "SourceOption",
    "ToOption",
    "UrlOption",
    "anomalies_command",
    "opened_database",
    "refuse_renamed_engine",
]

DATABASES: tuple[str, ...] = ("duckdb", "clickhouse")
"""What ``--database`` accepts."""

DbOption = Annotated[Path | None, typer.Option(
    "--db", help="DuckDB store file (or --source, or --database clickhouse --url).", show_default=False)]
DatabaseOption = Annotated[str, typer.Option(
    "--database", help="Where the summaries are: duckdb (a store file, --db, or Parquet files, --source) or "
    "clickhouse (--url).")]
RenamedEngineOption = Annotated[str | None, typer.Option(
    "--engine", hidden=True, help="Renamed --database (--engine names an inference engine).", show_default=False)]
"""The storage option's old spelling, kept only to refuse it with the new one (:func:`refuse_renamed_engine`)."""
UrlOption = Annotated[str | None, typer.Option(
    "--url", help="ClickHouse store (with --database clickhouse): chdb:///FOLDER (embedded ClickHouse, the chdb "
    "package) or http://[USER:PASSWORD@]HOST:8123 (a server), plus ?database=NAME (default llmslo).",
    show_default=False)]
SourceOption = Annotated[str | None, typer.Option(
    "--source", help="Parquet files of the sink instead of a store, e.g. 'DIR/**/*.parquet' (quote it) or "
    "DIR: read lazily by DuckDB, date=/hour= partitions outside --from/--to are not opened.",
    show_default=False)]
MemoryLimitOption = Annotated[str | None, typer.Option(
    "--memory-limit", help="DuckDB's memory limit, e.g. 4GB or 512MiB: it spills to the temporary folder beyond "
    "it (--source or --db).", show_default=False)]
FromOption = Annotated[str | None, typer.Option(
    "--from", help="Only requests that arrived at or after this time: Unix seconds or ISO 8601 (UTC unless it "
    "says otherwise).", show_default=False)]
ToOption = Annotated[str | None, typer.Option(
    "--to", help="Only requests that arrived before this time: Unix seconds or ISO 8601.", show_default=False)]


def refuse_renamed_engine(value: str | None) -> None:
    """Exit 2 when the old ``--engine duckdb|clickhouse`` was given, naming ``--database``, its new spelling."""
    if value is not None:
        raise _fail(f"--engine {value}: the store option is now --database (--database {value}); --engine names "
                    "an inference engine (vllm, sglang, tgi, llamacpp, trtllm) on `rules generate` and "
                    "`dashboards generate`", EXIT_USAGE)


@contextmanager
def opened_database(
    db: Path | None,
    database: str,
    url: str | None,
    source: str | None,
    memory_limit: str | None,
    from_time: str | None,
    to_time: str | None,
) -> Iterator[Database]:
    """The database the options name, open for the ``with`` block (closed after it).

    Options that do not go together (a second source, ``--url`` without ``--database clickhouse``, a memory
    limit for ClickHouse) and bad values exit 2 naming the option; a store or files that cannot be read
    exit 1, as does a ``--from``/``--to`` range that holds no stored request (the message says so, with the
    span the stored arrivals do cover: an empty selection is never printed as a result).
    """
    if database not in DATABASES:
        raise _fail(f"--database: {database!r} is not one of {', '.join(DATABASES)}", EXIT_USAGE)
    if database == "clickhouse":
        if url is None:
            raise _fail("--database clickhouse needs --url (chdb:///FOLDER or http://HOST:8123)", EXIT_USAGE)
        for name, value in (("--db", db), ("--source", source), ("--memory-limit", memory_limit)):
            if value is not None:
                raise _fail(f"{name} does not go with --database clickhouse (the store is --url; ClickHouse "
                            "manages its own memory)", EXIT_USAGE)
    else:
        if url is not None:
            raise _fail("--url names a ClickHouse store: add --database clickhouse", EXIT_USAGE)
        if (db is None) == (source is None):
            raise _fail("give one of --db (a DuckDB store) and --source (Parquet files)", EXIT_USAGE)
    from llmslo.analysis.databases import (
        ClickHouseDatabase,
        DuckDBDatabase,
        TimeRange,
        open_parquet,
        open_store_range,
        parse_memory_limit,
        quiet_progress,
    )
    from llmslo.analysis.store import Store, parse_clickhouse_url

    try:
        window = TimeRange(parse_time("from", from_time) if from_time is not None else None,
                           parse_time("to", to_time) if to_time is not None else None)
        limit = parse_memory_limit(memory_limit) if memory_limit is not None else None
        if url is not None:
            parse_clickhouse_url(url)
    except LlmsloError as exc:
        raise _fail(str(exc), EXIT_USAGE) from None
    try:
        opened: Database
        store = None
        if database == "clickhouse":
            assert url is not None
            opened = ClickHouseDatabase.open(url, time_range=window)
        elif source is not None:
            opened = open_parquet(source, memory_limit=limit, time_range=window)
        elif window.bounded or limit is not None:
            assert db is not None
            opened = open_store_range(db, window, memory_limit=limit)
        else:
            assert db is not None
            store = Store.open(db, read_only=True)
            quiet_progress(store.con)
            opened = DuckDBDatabase(store.con)
    except LlmsloError as exc:
        raise _fail(str(exc)) from None
    try:
        empty = window.bounded and not opened.tuples(f"SELECT 1 FROM {opened.summaries} LIMIT 1")
    except BaseException:
        opened.close()
        raise
    if empty:
        opened.close()
        raise _fail(_nothing_in_range(db, database, url, source, memory_limit, window))
    try:
        yield opened
    finally:
        opened.close()
        if store is not None:
            store.close()


def _utc(unix_s: float) -> str:
    return dt.datetime.fromtimestamp(unix_s, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _nothing_in_range(db: Path | None, database: str, url: str | None, source: str | None,
                      memory_limit: str | None, window: TimeRange) -> str:
    """Why a ``--from``/``--to`` selection is empty: the range asked for, and what the stored arrivals cover."""
    from llmslo.analysis.report import placeable_rows

    lo, hi = window.from_unix_s, window.to_unix_s
    asked = " ".join([*([f"from {_utc(lo)}"] if lo is not None else []), *([f"to {_utc(hi)}"] if hi is not None
                                                                           else [])])
    where = shown_source(db, database, url, source)
    with opened_database(db, database, url, source, memory_limit, None, None) as whole:
        try:
            placed = placeable_rows(whole)
            first, last, n = whole.tuples(
                f"SELECT min(arrival_unix_s), max(arrival_unix_s), count(*) FROM {whole.summaries} "
                f"WHERE {placed.condition}")[0]
        except LlmsloError as exc:
            return f"no stored request arrived in the range asked for ({asked} UTC); and {exc}"
    more = " more" if n else ""
    apart = (f"; {placed.left_out:,}{more} come from imports without arrival times and are in no range"
             if placed.left_out else "")
    if not n:
        return f"no stored request arrived in the range asked for ({asked} UTC): {where} holds no request with an " \
               f"arrival time{apart}"
    return (f"no stored request arrived in the range asked for ({asked} UTC): {where} holds {int(n):,} request(s) "
            f"with arrival times, from {_utc(float(first))} to {_utc(float(last))} UTC (first to last arrival); "
            f"choose --from/--to within that{apart}")


def shown_source(db: Path | None, database: str, url: str | None, source: str | None) -> str:
    """The summaries' place as the options named it (a ClickHouse URL without its password)."""
    if database == "clickhouse" and url is not None:
        from llmslo.analysis.store import parse_clickhouse_url

        return parse_clickhouse_url(url).shown
    return str(source) if source is not None else str(db)


class QueryProgress:
    """A progress bar on standard error for the queries of a report or a scan: the stage the caller names
    (``progress(stage)``) and how far the database's running query is (:meth:`Database.query_progress`, polled
    from a thread), shown only on a terminal and only once the work has taken ``delay_s`` seconds."""

    def __init__(self, database: Database, enabled: bool, *, delay_s: float = 1.0, poll_s: float = 0.2,
                 console: Console | None = None) -> None:
        self.database = database
        self.console = console or err()
        self.enabled = enabled and self.console.is_terminal
        self.delay_s = delay_s
        self.poll_s = poll_s
        self.stage = "reading"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, stage: str) -> None:
        self.stage = stage
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="llmslo-progress", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        if self._stop.wait(self.delay_s):
            return
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                      console=self.console, transient=True, auto_refresh=False) as bar:
            task = bar.add_task(self.stage, total=100.0)
            while True:
                done = self.database.query_progress()
                bar.update(task, description=self.stage, completed=done if done is not None else 0.0)
                bar.refresh()
                if self._stop.wait(self.poll_s):
                    return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _baseline(text: str) -> dict[str, object]:
    """``preceding``, ``preceding:N``, ``week`` or ``reference:START,END`` (Unix seconds)."""
    kind, _, arg = text.partition(":")
    if kind == "preceding":
        return {"baseline": "preceding", **({"baseline_windows": int(arg)} if arg else {})}
    if kind == "week" and not arg:
        return {"baseline": "week"}
    if kind == "reference" and "," in arg:
        lo, hi = arg.split(",", 1)
        return {"baseline": "reference", "reference_start_unix_s": float(lo), "reference_end_unix_s": float(hi)}
    raise ValueError(f"unrecognised baseline {text!r}")


def _when(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.0f}%"


def _ms(x: float) -> str:
    return f"{x * 1e3:.3g}ms" if x < 1 else f"{x:.3g}s"


def _table(report: AnomalyReport) -> Table:
    from rich.table import Table

    t = Table(title="Latency distribution changes (UTC; before = the baseline before the run, after = the "
              "run's windows; statistic and p of the window that completed the run)", title_justify="left")
    for col in ("series", "from", "to", "windows", "statistic", "p (BH)", "n after / before", "p50 before→after",
                "p50", "p99 before→after", "p99"):
        t.add_column(col, justify="left" if col in ("series", "from", "to") else "right")
    for f in report.findings:
        t.add_row(shown(f.series), _when(f.first_start_unix_s), _when(f.end_unix_s), str(f.windows),
                  f"{f.statistic:.3f}", f"{f.p_adjusted:.2g}", f"{f.n_run:,} / {f.n_before:,}",
                  f"{_ms(f.p50_before_s)}→{_ms(f.p50_after_s)}", _pct(f.p50_change),
                  f"{_ms(f.p99_before_s)}→{_ms(f.p99_after_s)}", _pct(f.p99_change))
    return t


def _why_untested(report: AnomalyReport) -> list[str]:
    """Lines saying what the scan left out and, per series without a tested window, why."""
    lines = [f"note: {note}" for note in report.notes]
    lines += [f"{name}: no window tested: {reason}" for name, reason in report.untested.items()]
    if not report.windows and not report.notes:
        lines.append("no series: the store holds no request summaries")
    return lines


def _tightening_table(signals: dict[str, list[TighteningSignal]]) -> Table:
    from rich.table import Table

    t = Table(title="Composite tightening rule: windows where the signals agree (UTC)", title_justify="left")
    for col in ("series", "from", "to", "p99 rise", "failure slope /s", "outcome entropy", "agree"):
        t.add_column(col, justify="left" if col in ("series", "from", "to") else "right")
    for name, items in signals.items():
        for s in items:
            if s.fire:
                t.add_row(shown(name), _when(s.start_unix_s), _when(s.end_unix_s), _pct(s.p99_rise),
                          "-" if s.failure_slope is None else f"{s.failure_slope:.3g}",
                          "-" if s.entropy is None else f"{s.entropy:.2f}", str(s.agree))
    return t


def anomalies_command(
    db: DbOption = None,
    metric: Annotated[list[str] | None, typer.Option(
        "--metric", help=f"Latency to scan (repeatable): {', '.join(ANOMALY_METRICS)}. (default: ttft)")] = None,
    baseline: Annotated[str, typer.Option(
        "--baseline", help="preceding[:N] (the N windows before, default 12), week (same window a week "
        "earlier) or reference:START,END (Unix seconds).")] = "preceding",
    window: Annotated[str, typer.Option("--window", help="Window length, e.g. 300s, 5m.")] = "5m",
    step: Annotated[str | None, typer.Option("--step", help="Step between windows (default: the window).")] = None,
    test: Annotated[str, typer.Option("--test", help="ks, anderson or mannwhitney.")] = "ks",
    alpha: Annotated[float, typer.Option("--alpha", help="Level after Benjamini-Hochberg across series.")] = 0.01,
    consecutive: Annotated[int, typer.Option("--consecutive", help="Flagged windows in a row for a finding.")] = 2,
    by: Annotated[str, typer.Option("--by", help="Series per value of: model, version, tenant_class "
                                    "(comma-separated; empty for one series).")] = "model",
    tightening: Annotated[bool, typer.Option(
        "--tightening", help="Also evaluate the composite tightening rule (p99 rise, failure-rate slope and "
        "outcome-mix entropy must agree; docs/anomalies.md) on the first --metric.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (for scripts).")] = False,
    database: DatabaseOption = "duckdb",
    url: UrlOption = None,
    source: SourceOption = None,
    memory_limit: MemoryLimitOption = None,
    from_time: FromOption = None,
    to_time: ToOption = None,
    engine: RenamedEngineOption = None,
) -> None:
    """Find windows whose latency distribution moved away from a baseline (docs/anomalies.md).

    Each window (by arrival time) is tested against its baseline with a two-sample test; it is flagged
    only with enough samples, a significant result after Benjamini-Hochberg across series, and a large
    effect (p50 or p99 moved by the configured share and absolute amount); a finding needs
    --consecutive flagged windows in a row. Every finding prints its statistic, p-value, sample sizes
    and quantiles before and after.
    """
    refuse_renamed_engine(engine)
    from llmslo.analysis.anomaly import AnomalyConfig, detect_anomalies, detect_tightening
    from llmslo.analysis.databases import DuckDBDatabase

    try:
        cfg = AnomalyConfig(window_s=_duration("window", window),
                            step_s=_duration("step", step) if step is not None else None,
                            test=test, alpha=alpha, consecutive=consecutive,  # type: ignore[arg-type]
                            **_baseline(baseline))  # type: ignore[arg-type]
    except (ValueError, LlmsloError) as exc:
        raise _fail(str(exc), 2) from None
    groups = tuple(s.strip() for s in by.split(",") if s.strip())
    if tightening and database != "duckdb":
        raise _fail("--tightening reads DuckDB stores and Parquet sources (--db, --source), not ClickHouse",
                    EXIT_USAGE)
    with opened_database(db, database, url, source, memory_limit, from_time, to_time) as summaries:
        try:
            report = detect_anomalies(summaries, cfg, metrics=tuple(metric or ["ttft"]), by=groups)
            signals = {}
            if tightening:
                assert isinstance(summaries, DuckDBDatabase)
                signals = detect_tightening(summaries.con, anomaly=cfg, metric=(metric or ["ttft"])[0], by=groups)
        except LlmsloError as exc:
            raise _fail(str(exc), 2 if isinstance(exc, ValueError) else 1) from None
    if as_json:
        out_json = report.to_dict()
        if tightening:
            out_json["tightening"] = {name: [dataclasses.asdict(x) for x in items] for name, items in signals.items()}
        print(json.dumps(out_json, indent=2))
        return
    out = _console()
    if report.findings:
        out.print(_table(report))
    tested = sum(1 for ws in report.windows.values() for w in ws if w.enough_samples)
    out.print(f"{len(report.findings)} finding(s) in {len(report.windows)} series, {tested} windows tested "
              f"({cfg.test.upper()}, alpha {cfg.alpha:g} after BH, {consecutive} consecutive, "
              f"baseline {shown(baseline)})")
    for line in _why_untested(report):
        out.print(f"  {shown(line)}")
    if tightening:
        fired = sum(1 for items in signals.values() for s in items if s.fire)
        if fired:
            out.print(_tightening_table(signals))
        windows = sum(len(items) for items in signals.values())
        out.print(f"composite tightening rule: fired in {fired} of {windows} windows")
