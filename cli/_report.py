"""The store commands: ``llmslo ingest`` (request summaries into a store), ``llmslo report`` and ``llmslo demo``."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from llmslo.cli._anomalies import (
    DatabaseOption,
    DbOption,
    FromOption,
    MemoryLimitOption,
    QueryProgress,
    RenamedEngineOption,
    SourceOption,
    ToOption,
    UrlOption,
    opened_database,
    refuse_renamed_engine,
)
from llmslo.cli._common import EXIT_INPUT, EXIT_USAGE, err, shown
from llmslo.cli._common import console as _console
from llmslo.cli._common import duration as _duration
from llmslo.cli._common import fail as _fail
from llmslo.cli._common import threshold as _threshold
from llmslo.cli._help import GROUP_COLUMNS
from llmslo.telemetry import COLUMNS, DEFAULT_TPOT_S, DEFAULT_TTFT_S, FINISH_REASONS, LlmsloError

if TYPE_CHECKING:
    from rich.progress import Progress
    from rich.table import Table

    from llmslo.analysis.report import GoodputPolicy, QuantileMethod, ReportSpec
    from llmslo.analysis.store import IngestReport
    from llmslo.telemetry import RecoveryReport

__all__ = ["demo", "ingest", "report"]


PROGRESS_DELAY_S = 1.0
"""A progress bar appears only for work that has already taken this long."""


class _LazyProgress:
    """A progress bar that shows itself only after ``PROGRESS_DELAY_S`` and only on a terminal."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and err().is_terminal
        self.start = time.monotonic()
        self.bar: Progress | None = None
        self.task: Any = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            if time.monotonic() - self.start < PROGRESS_DELAY_S:
                return
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(),
                                TextColumn("{task.completed:,}/{task.total:,} rows"), TimeElapsedColumn(),
                                console=err(), transient=True)
            self.bar.start()
            self.task = self.bar.add_task(stage, total=total)
        self.bar.update(self.task, description=stage, completed=done, total=total)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _policy(ttft: str | None, tpot: str | None, e2e: str | None, window: str | None,
            success: str, one_token_fails: bool) -> GoodputPolicy:
    from llmslo.analysis.report import GoodputPolicy

    win = _duration("window", window) if window is not None else None
    try:
        return GoodputPolicy(
            success=frozenset(s.strip() for s in success.split(",") if s.strip()),
            ttft_s=_threshold("ttft", ttft, DEFAULT_TTFT_S),
            tpot_s=_threshold("tpot", tpot, DEFAULT_TPOT_S),
            e2e_s=_threshold("e2e", e2e, None),
            one_token_passes_tpot=not one_token_fails,
            window_s=win,
        )
    except LlmsloError as exc:
        raise _fail(str(exc), EXIT_USAGE) from None


def _quantile_method(text: str) -> QuantileMethod:
    """The ``--quantiles`` value as a quantile method; exit 2 naming the choices for another."""
    from llmslo.analysis.report import QUANTILE_METHODS

    for method in QUANTILE_METHODS:
        if text == method:
            return method
    raise _fail(f"--quantiles: {text!r} is not one of {', '.join(QUANTILE_METHODS)} (linear: interpolation "
                "between order statistics, the default; nearest-rank: the value of rank ceil(q n))", EXIT_USAGE)


def _by(text: str | None) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip()) if text else ()


def _ingest_table(reports: list[IngestReport]) -> Table:
    from rich.table import Table

    t = Table(title="Ingest", title_justify="left")
    for col in ("file", "read", "inserted", "already stored", "conflicting", "rejected", "rejected rows written to"):
        t.add_column(col, justify="left" if col in ("file", "rejected rows written to") else "right")
    for r in reports:
        t.add_row(shown(r.source), f"{r.rows_read:,}", f"{r.rows_inserted:,}", f"{r.rows_already_stored:,}",
                  f"{r.rows_conflicting:,}", f"{r.rows_rejected:,}", shown(r.rejected_path or "-"))
    return t


def _recovery_json(report: RecoveryReport) -> dict[str, object]:
    return {"journal": str(report.journal), "recovered": report.recovered, "already_stored": report.already_stored,
            "torn_lines": report.torn_lines}


def _ingest_json(reports: list[IngestReport], total: int, recovery: RecoveryReport | None = None) -> str:
    return json.dumps({
        **({"recovery": _recovery_json(recovery)} if recovery is not None else {}),
        "files": [
            {"file": r.source, "rows_read": r.rows_read, "rows_inserted": r.rows_inserted,
             "rows_already_stored": r.rows_already_stored, "rows_rejected": r.rows_rejected,
             "rejected_path": r.rejected_path, "rows_conflicting": r.rows_conflicting,
             "conflicting_ids": list(r.conflicting_ids)}
            for r in reports
        ],
        "store_rows": total,
    }, indent=2)


_COLUMNS_HELP = "; ".join(
    f"{c.name} ({c.kind}{', optional' if not c.required else ''}{', nullable' if c.nullable else ''})"
    for c in COLUMNS
)

TtftOption = Annotated[str | None, typer.Option(
    "--ttft", help=f"TTFT SLO (inclusive), e.g. 500ms, 2s; 'off' to ignore. (default: {DEFAULT_TTFT_S:g}s)")]
TpotOption = Annotated[str | None, typer.Option(
    "--tpot", help=f"TPOT SLO (inclusive), e.g. 100ms; 'off' to ignore. (default: {DEFAULT_TPOT_S * 1e3:g}ms)")]
E2eOption = Annotated[str | None, typer.Option("--e2e", help="End-to-end SLO, e.g. 30s (default: off)")]
ByOption = Annotated[str | None, typer.Option(
    "--by", help=f"Group by a comma-separated list of: {', '.join(GROUP_COLUMNS)}.")]
WindowOption = Annotated[str | None, typer.Option(
    "--window", help="Time windows aligned to multiples of this length in Unix time, e.g. 10s, 5m. A "
    "request belongs to the window of its arrival; rates divide by the window length.")]
SuccessOption = Annotated[str, typer.Option(
    "--success", help=f"Finish reasons that can be good (from: {', '.join(FINISH_REASONS)}).")]
OneTokenOption = Annotated[bool, typer.Option(
    "--one-token-fails", help="Replies of one token fail the TPOT condition (default: they pass).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object (for scripts).")]
CsvOption = Annotated[bool, typer.Option("--csv", help="Print one CSV row per group.")]
QuantilesOption = Annotated[str, typer.Option(
    "--quantiles", help="How every latency quantile is computed from the values: linear (interpolation between "
    "order statistics, numpy's default) or nearest-rank (the value of rank ceil(q n), always an observed value: "
    "reproduces guidellm's percentiles). The output names the definition when it is not linear.")]


def _recover(store: Any, journal: Path) -> RecoveryReport:
    """Recover the requests a crashed server left in ``journal`` into ``store`` (see :func:`ingest`)."""
    from llmslo.analysis.store import summary_table
    from llmslo.telemetry import JournalInUse, recover_journal

    def write(rows: list[dict[str, object]]) -> int:
        report = store.ingest_frame(summary_table(rows), source=f"journal {journal}")
        return int(report.rows_already_stored + report.rows_conflicting)

    try:
        return recover_journal(journal, write)
    except JournalInUse as exc:
        raise _fail(f"--recover: {exc}: recover it once that server has stopped") from None


def _summary_files(paths: list[Path]) -> list[Path]:
    """``paths`` with each folder replaced by its ``.jsonl`` files, by name (what ``--jsonl DIR`` writes); exit 1
    for a folder that has none."""
    out: list[Path] = []
    for path in paths:
        if not path.is_dir():
            out.append(path)
            continue
        found = sorted(f for f in path.glob("*.jsonl") if f.is_file())
        if not found:
            raise _fail(f"{path}: a folder without a .jsonl file (llmslo serve, gateway and load --jsonl {path} "
                        "write their summaries there as summaries-*.jsonl); give the summary files", EXIT_INPUT)
        out.extend(found)
    return out


def ingest(
    files: Annotated[list[Path] | None, typer.Argument(
        help="JSONL (.jsonl/.ndjson/.json), CSV or Parquet files; a folder stands for its .jsonl files (as "
        "llmslo serve, llmslo gateway and llmslo load --jsonl DIR write them).", show_default=False)] = None,
    db: DbOption = None,
    skip_invalid: Annotated[bool, typer.Option(
        "--skip-invalid",
        help="Load the valid rows; write rejected rows with reasons to FILE.rejected.jsonl.")] = False,
    as_json: JsonOption = False,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="Never show a progress bar.")] = False,
    database: Annotated[str, typer.Option(
        "--database", help="duckdb (a store file, --db) or clickhouse (--url).")] = "duckdb",
    url: UrlOption = None,
    engine: RenamedEngineOption = None,
    recover: Annotated[Path | None, typer.Option(
        "--recover", help="Also recover a server's journal folder (llmslo serve --journal): each request a "
        "crash left without a summary becomes one row (finish_reason error, error_type server_crash, e2e_s a "
        "lower bound). Ingest the server's summary files first (in the same command or before).",
        show_default=False)] = None,
) -> None:
    """Validate request summaries and load them into the store (created if missing).

    Every row is checked before anything is written: types, finish reasons, negative or NaN
    intervals, ttft_s > e2e_s, sent_tokens > generated_tokens, a ttft_s without a generated token,
    duplicate request_id. One invalid row and nothing is loaded (unless --skip-invalid). Rows whose
    request_id is already stored are skipped, so re-ingesting a file adds nothing. With --database
    clickhouse the same rules are checked before anything reaches ClickHouse (docs/fleet.md). With --recover
    DIR, after the files, the requests a crashed server left in its journal without a summary are loaded as
    one row each, and the journal is emptied (running it again adds nothing); see docs/server.md.
    """
    refuse_renamed_engine(engine)
    files = _summary_files(files or [])
    if not files and recover is None:
        raise _fail("give the summary files to load (or --recover DIR, a server's journal)", EXIT_USAGE)
    if recover is not None:
        from llmslo.telemetry import JournalInUse, ensure_journal_free

        if not recover.is_dir():
            raise _fail(f"--recover: no journal folder at {recover} (llmslo serve keeps it beside its summaries, "
                        "as FILE.journal or DIR.journal)", EXIT_INPUT)
        try:  # before anything is loaded: a refusal changes nothing
            ensure_journal_free(recover)
        except JournalInUse as exc:
            raise _fail(f"--recover: {exc}: recover it once that server has stopped", EXIT_INPUT) from None
    from llmslo.analysis.store import ClickHouseStore, InvalidInputError, Store, parse_clickhouse_url

    if database not in ("duckdb", "clickhouse"):
        raise _fail(f"--database: {database!r} is not one of duckdb, clickhouse", EXIT_USAGE)
    if database == "clickhouse" and (url is None or db is not None):
        raise _fail("--database clickhouse takes the store as --url (not --db)", EXIT_USAGE)
    if database == "duckdb" and (db is None or url is not None):
        raise _fail("give the store as --db FILE (or --database clickhouse --url URL)", EXIT_USAGE)
    try:
        parsed = parse_clickhouse_url(url) if url is not None else None
    except LlmsloError as exc:
        raise _fail(str(exc), EXIT_USAGE) from None
    progress = _LazyProgress(not (no_progress or as_json))
    try:
        store: Store | ClickHouseStore = (ClickHouseStore.open(parsed) if parsed is not None
                                          else Store.open(db or Path()))
        recovery: RecoveryReport | None = None
        with store:
            reports = store.ingest_files(files, skip_invalid=skip_invalid, on_progress=progress) if files else []
            if recover is not None:
                recovery = _recover(store, recover)
            total = store.count()
        where = store.url.shown if isinstance(store, ClickHouseStore) else str(db)
    except InvalidInputError as exc:
        raise _fail(str(exc)) from None
    except LlmsloError as exc:
        raise _fail(str(exc)) from None
    finally:
        progress.stop()
    if as_json:
        print(_ingest_json(reports, total, recovery))
        return
    out = _console()
    if reports:
        out.print(_ingest_table(reports))
    if recovery is not None:
        out.print(f"journal {shown(str(recovery.journal))}: {recovery.message()}", highlight=False)
    out.print(f"store {shown(where)}: {total:,} request summaries", highlight=False)
    if any(r.rows_rejected for r in reports):
        err().print("[yellow]some rows were rejected; see the .rejected.jsonl files for the reasons[/yellow]")
    for note in filter(None, (r.conflict_note() for r in reports)):
        err().print(f"[yellow]warning:[/yellow] {shown(note)}", highlight=False, soft_wrap=True)


# cleaned first: the appended paragraph has no indentation, which would keep the docstring's own in the help
ingest.__doc__ = inspect.cleandoc(ingest.__doc__ or "") + f"\n\nColumns: {_COLUMNS_HELP}."


def _print_report(db: Path | None, spec: ReportSpec, as_json: bool, as_csv: bool, *, database: str = "duckdb",
                  url: str | None = None, source: str | None = None, memory_limit: str | None = None,
                  from_time: str | None = None, to_time: str | None = None, progress: bool = False) -> None:
    if as_json and as_csv:
        raise _fail("choose one of --json and --csv", EXIT_USAGE)
    from llmslo.analysis.report import build_report
    from llmslo.cli._render import render_report, report_csv

    with opened_database(db, database, url, source, memory_limit, from_time, to_time) as summaries:
        bar = QueryProgress(summaries, progress and not (as_json or as_csv))
        try:
            report = build_report(summaries, spec, on_progress=bar)
        except LlmsloError as exc:
            raise _fail(str(exc)) from None
        finally:
            bar.stop()
    if as_json:
        print(json.dumps(report.to_dict(), indent=2))
    elif as_csv:
        sys.stdout.write(report_csv(report))
    else:
        render_report(report, _console())


def report(
    db: DbOption = None,
    ttft: TtftOption = None,
    tpot: TpotOption = None,
    e2e: E2eOption = None,
    by: ByOption = None,
    window: WindowOption = None,
    success: SuccessOption = "stop,length",
    one_token_fails: OneTokenOption = False,
    as_json: JsonOption = False,
    as_csv: CsvOption = False,
    until: Annotated[float | None, typer.Option(
        "--until", help="Horizon, Unix seconds: report the requests that arrived by then; those that finished "
        "after it are in flight (default: when the data was taken, so no stored request is).")] = None,
    database: DatabaseOption = "duckdb",
    url: UrlOption = None,
    source: SourceOption = None,
    memory_limit: MemoryLimitOption = None,
    from_time: FromOption = None,
    to_time: ToOption = None,
    quantiles: QuantilesOption = "linear",
    no_progress: Annotated[bool, typer.Option("--no-progress", help="Never show a progress bar.")] = False,
    engine: RenamedEngineOption = None,
) -> None:
    """Latency distributions, goodput, survivor bias and token figures per group.

    Goodput counts every arrival (rejected, cancelled, timed out, failed) in the denominator; good
    means a success finish reason and every SLO met. Latency quantiles are exact: linear interpolation
    between order statistics, or with --quantiles nearest-rank the value of rank ceil(q n), as guidellm
    reports its percentiles (docs/definitions.md, "Quantiles"). The survivor-bias
    check compares TTFT over successful requests with a censoring-aware (Kaplan-Meier) estimate in
    which requests that ended without a first token count as "at least that long".

    The summaries come from a DuckDB store (--db), the sink's Parquet files read out of core (--source,
    --memory-limit) or ClickHouse (--database clickhouse --url), the same report from each (docs/fleet.md).

    Examples: llmslo report --db s.duckdb --ttft 2s --tpot 100ms --by model,version --window 5m;
    llmslo report --source 'sink/**/*.parquet' --memory-limit 4GB --from 2026-01-01 --to 2026-01-02
    """
    refuse_renamed_engine(engine)
    from llmslo.analysis.report import ReportSpec

    try:
        spec = ReportSpec(_policy(ttft, tpot, e2e, window, success, one_token_fails), by=_by(by),
                          until_unix_s=until, quantiles=_quantile_method(quantiles))
    except LlmsloError as exc:
        raise _fail(str(exc), EXIT_USAGE) from None
    _print_report(db, spec, as_json, as_csv, database=database, url=url, source=source, memory_limit=memory_limit,
                  from_time=from_time, to_time=to_time, progress=not no_progress)


def _default_trace() -> Path | None:
    """The Azure trace the demo replays when no --trace is given: under ``LLMSLO_REAL_DATA`` when that is set
    (and only there), else under ``../shared/real_data`` beside the checkout or the working folder; None (the
    demo's synthetic arrivals) when there is none."""
    env = os.environ.get("LLMSLO_REAL_DATA")
    here = Path(__file__).resolve().parents[1]
    roots = [Path(env)] if env else [here.parent / "shared" / "real_data", Path.cwd().parent / "shared" / "real_data"]
    for root in roots:
        candidate = root / "azure" / "AzureLLMInferenceTrace_conv.csv"
        if candidate.is_file():
            return candidate
    return None


def demo(
    ctx: typer.Context,
    db: Annotated[Path, typer.Option("--db", help="Where to write the demo store (replaced if it is a "
                                     "previous demo store).")] = Path("llmslo-demo.duckdb"),
    trace: Annotated[Path | None, typer.Option(
        "--trace", help="Azure LLM inference trace CSV for arrivals and lengths (default: "
        "azure/AzureLLMInferenceTrace_conv.csv under $LLMSLO_REAL_DATA, else under ../shared/real_data, when "
        "present; else synthetic arrivals, and the demo's first line says which ran)")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Random seed of the simulation.")] = 0,
    ttft: TtftOption = None,
    tpot: TpotOption = None,
    by: ByOption = None,
    window: Annotated[str | None, typer.Option("--window", help="Report windows.")] = "5m",
    live: Annotated[bool, typer.Option(
        "--live", help="Run it for real instead (about 70 s): llmslo serve under llmslo load through a burst and "
        "a SIGTERM drain, scraped by a real Prometheus with the rules of examples/live-slo.yaml (needs the "
        "'serve' extra and Debian's prometheus).")] = False,
    rollout: Annotated[bool, typer.Option(
        "--rollout", help="Run a rolling update for real instead (about 75 s): llmslo serve v1 behind llmslo "
        "gateway under load, then llmslo rollout run to a slower v2 (both serve, v1 drained and stopped), the "
        "gateway's summaries ingested into one store, the update recorded and the versions compared by llmslo "
        "rollout compare (needs the 'serve' extra).")] = False,
    same_speed: Annotated[bool, typer.Option(
        "--same-speed", help="With --rollout: v2 runs the same engine as v1 (the null run: its verdict should "
        "be lossless).")] = False,
    engine: Annotated[str | None, typer.Option(
        "--engine", help="Run it on a real engine instead (about 90 s): llamacpp, llama.cpp's llama-server with "
        "SmolLM2-135M under llmslo load through a burst above its slots, scraped by a real Prometheus with the "
        "rules 'llmslo rules generate --engine llamacpp' makes; it checks usage against the engine's counters "
        "(build the engine once with .ci/build-llama-server).", metavar="ENGINE", show_default=False)] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", help="With --live or --rollout: the folder for the run's files (must not hold an earlier run; "
        "default: a new llmslo-live-<time> or llmslo-rollout-<time> folder here).", show_default=False)] = None,
    as_json: JsonOption = False,
) -> None:
    """Simulate a server through an overload burst, load the summaries into a fresh store, report.

    Arrivals and lengths come from the Azure production trace when it is available. During the
    burst the queue fills (429s) and waiting clients give up before their first token; TTFT over
    successful requests then looks healthy while the censoring-aware view shows the truth.

    With --live the same story runs on real processes on 127.0.0.1: the reference server, the load
    generator (calm, a burst, calm, then SIGTERM to the server while the load goes on) and a Prometheus
    evaluating the generated alerts. It prints the finish reasons as the client, the server's summaries
    and Prometheus counted them, the alerts that fired and resolved, and the drain. The options only the
    simulation reads (--db, --trace, --seed, --ttft, --tpot, --by, --window) do not go with --live.

    With --rollout a rolling update runs on real processes, through llmslo gateway and the path of llmslo
    rollout run: v1 alone, then v2 (25 % slower per engine step; the same with --same-speed) added beside
    it, then v1 drained while a long reply is still streaming from it, then v2 alone. It prints the requests
    by version, the drain with its three numbers, and the verdict of llmslo rollout compare with the
    regressions it found (v2's slowdown; none with --same-speed). The simulation's options do not go with
    --rollout either.
    """
    runs = [name for name, on in (("--live", live), ("--rollout", rollout), ("--engine", engine is not None)) if on]
    if len(runs) > 1:
        raise _fail(f"{' and '.join(runs)} are different runs: choose one", EXIT_USAGE)
    if same_speed and not rollout:
        raise _fail("--same-speed goes with --rollout", EXIT_USAGE)
    if engine is not None:
        if engine != "llamacpp":
            raise _fail(f"--engine {engine!r}: the demo runs on llamacpp (llama.cpp's llama-server), the one engine "
                        "that builds and runs on a CPU here; for vLLM, SGLang, TGI or trtllm-serve point "
                        "llmslo load at your server and generate rules with llmslo rules generate --engine",
                        EXIT_USAGE)
        _refuse_simulation_options(ctx, "--engine")
        _demo_engine(out, as_json)
        return
    if live or rollout:
        _refuse_simulation_options(ctx, "--live" if live else "--rollout")  # before anything starts
        if live:
            _demo_live(out, as_json)
        else:
            _demo_rollout(out, same_speed, as_json)
        return
    if out is not None:
        raise _fail("--out goes with --live, --rollout or --engine", EXIT_USAGE)
    from llmslo.analysis.report import ReportSpec
    from llmslo.analysis.store import Store
    from llmslo.analysis.workload import demo_workload_note, simulate_demo_workload

    try:  # the command line first: a bad option changes nothing
        spec = ReportSpec(_policy(ttft, tpot, None, window, "stop,length", False), by=_by(by))
    except LlmsloError as exc:
        raise _fail(str(exc), EXIT_USAGE) from None
    trace = trace or _default_trace()
    if trace is not None and not trace.is_file():
        raise _fail(f"--trace: no such file {trace}", EXIT_INPUT)
    if db.exists() and _store_origin(db) != "demo":
        raise _fail(f"{db} exists and is not a demo store; pass another --db", EXIT_INPUT)
    say = err() if as_json else _console()
    try:
        source = demo_workload_note(trace)  # where the arrivals come from, and the timeline made of them
        say.print(f"simulating the workload ({shown(source)})", highlight=False, soft_wrap=True)
        frame = simulate_demo_workload(trace, seed=seed)
    except LlmsloError as exc:
        raise _fail(str(exc)) from None
    db.unlink(missing_ok=True)  # a previous demo store: replaced
    Path(str(db) + ".wal").unlink(missing_ok=True)
    try:  # straight from memory: the demo leaves no file but the store
        with Store.open(db) as store:
            store.set_meta("origin", "demo")
            reports = [store.ingest_frame(frame, source=f"simulated workload (seed {seed})")]
    except LlmsloError as exc:
        raise _fail(str(exc)) from None
    say.print(_ingest_table(reports))
    _print_report(db, spec, as_json, False)
    say.print(f"store: {shown(db)} (explore it: llmslo report --db {shown(db)} --by model --window 1m)",
              highlight=False)


_REPORT_AFTERWARDS = "for other values, report on the run's stores afterwards: llmslo report --db FOLDER/server.duckdb"
SIMULATION_ONLY: dict[str, tuple[str, str]] = {
    "db": ("--db", "the live run writes its stores into its --out folder"),
    "trace": ("--trace", "the live run's arrivals come from llmslo load (calm, a burst, calm), not from a trace"),
    "seed": ("--seed", "the live run's plan has seeds of its own"),
    "ttft": ("--ttft", f"the live run's alerts use the SLOs of examples/live-slo.yaml; {_REPORT_AFTERWARDS} --ttft"),
    "tpot": ("--tpot", f"the live run's alerts use the SLOs of examples/live-slo.yaml; {_REPORT_AFTERWARDS} --tpot"),
    "by": ("--by", f"the live run reports the server's summaries as one group; {_REPORT_AFTERWARDS} --by"),
    "window": ("--window", f"the live run reports in 10 s windows; {_REPORT_AFTERWARDS} --window"),
}
"""The options of ``llmslo demo`` that only the simulated demo reads, by parameter name: (the option, why
``--live`` has no use for it)."""


def _refuse_simulation_options(ctx: typer.Context, mode: str) -> None:
    """Exit 2 naming, one line each, every option of :data:`SIMULATION_ONLY` given on the command line with
    ``mode`` (``--live`` or ``--rollout``)."""
    if mode == "--live":
        refused = [f"{option} does not go with --live: {why}" for name, (option, why) in SIMULATION_ONLY.items()
                   if _given(ctx, name)]
    elif mode == "--engine":
        refused = [f"{option} does not go with --engine: the engine run's plan is fixed; report on its store "
                   f"afterwards: llmslo report --db FOLDER/client.duckdb" for name, (option, _) in
                   SIMULATION_ONLY.items() if _given(ctx, name)]
    else:
        refused = [f"{option} does not go with --rollout: the rolling update's plan is fixed; report on its store "
                   f"afterwards: llmslo report --db FOLDER/rollout.duckdb" for name, (option, _) in
                   SIMULATION_ONLY.items() if _given(ctx, name)]
    if refused:
        raise _fail("\n".join(refused), EXIT_USAGE)


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the parameter ``name`` was given on the command line (not left at its default)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def _demo_live(out: Path | None, as_json: bool) -> None:
    from llmslo.cli._live import print_live
    from llmslo.ops import LiveRunError, run_live

    folder = out if out is not None else Path(time.strftime("llmslo-live-%Y%m%d-%H%M%S"))
    say = err() if as_json else _console()
    try:
        run = run_live(folder, prometheus_required=False,
                       say=lambda line: say.print(shown(line), highlight=False, soft_wrap=True))
    except LiveRunError as exc:
        raise _fail(str(exc)) from None
    if as_json:
        print(json.dumps(run.to_dict(), indent=2, default=str))
        return
    print_live(run, _console())
    from llmslo.analysis.report import ReportSpec

    _console().print("the server's summaries in 10 s windows (the burst's windows are the ones to look at):",
                     highlight=False)
    _print_report(run.server_db, ReportSpec(_policy(None, None, None, "10s", "stop,length", False)), False, False)


def _demo_engine(out: Path | None, as_json: bool) -> None:
    from llmslo.cli._live_engine import engine_checks, engine_run_dict, print_engine_live
    from llmslo.ops import run_engine_live

    folder = out if out is not None else Path(time.strftime("llmslo-engine-%Y%m%d-%H%M%S"))
    say = err() if as_json else _console()
    try:
        run = run_engine_live(folder, say=lambda line: say.print(shown(line), highlight=False, soft_wrap=True))
    except LlmsloError as exc:  # LiveRunError, and EngineNotFound with the way to build the engine
        raise _fail(str(exc)) from None
    if as_json:
        print(json.dumps(engine_run_dict(run), indent=2, default=str))
    else:
        print_engine_live(run, _console())
    if not all(check.passed for check in engine_checks(run)):
        raise _fail(f"the engine run's checks did not all pass (files in {folder})")


def _demo_rollout(out: Path | None, same_speed: bool, as_json: bool) -> None:
    from llmslo.cli._live_rollout import print_live_rollout
    from llmslo.ops import LiveRolloutPlan, LiveRunError, run_live_rollout

    folder = out if out is not None else Path(time.strftime("llmslo-rollout-%Y%m%d-%H%M%S"))
    plan = LiveRolloutPlan()
    if same_speed:
        plan = dataclasses.replace(plan, v2_speed=plan.v1_speed)
    say = err() if as_json else _console()
    try:
        run = run_live_rollout(folder, plan, say=lambda line: say.print(shown(line), highlight=False, soft_wrap=True))
    except LiveRunError as exc:
        raise _fail(str(exc)) from None
    if as_json:
        print(json.dumps(run.to_dict(), indent=2, default=str))
        return
    print_live_rollout(run, _console())


def _store_origin(db: Path) -> str | None:
    """The ``origin`` the store at ``db`` records (``demo`` for a demo store); ``None`` if it is no store."""
    from llmslo.analysis.store import Store, StoreError

    try:
        with Store.open(db, read_only=True) as old:
            return old.meta("origin")
    except StoreError:
        return None
