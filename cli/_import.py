"""``llmslo import KIND FILES... --db PATH``: other tools' outputs into the request-summary store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from llmslo.cli._common import console as _console
from llmslo.cli._common import err as _err
from llmslo.cli._common import fail as _fail

if TYPE_CHECKING:
    from llmslo.analysis.importers import ImportResult


def _print(result: ImportResult, db: Path) -> None:
    from rich.markup import escape
    from rich.table import Table

    rows = [f.to_dict() for f in result.files]
    total = result.store_rows
    out = _console()
    t = Table(title="Import", title_justify="left")
    for col in ("file", "kind", "read", "imported", "inserted", "already stored", "finish reasons", "arrivals"):
        t.add_column(col, justify="left" if col in ("file", "kind", "finish reasons", "arrivals") else "right")
    for r in rows:
        reasons = ", ".join(f"{k} {v:,}" for k, v in r["finish_reasons"].items()) or "-"
        t.add_row(escape(r["source"]), escape(r["kind"]), f"{r['rows_read']:,}", f"{r['rows_imported']:,}",
                  "-" if r["rows_inserted"] is None else f"{r['rows_inserted']:,}",
                  "-" if r["rows_already_stored"] is None else f"{r['rows_already_stored']:,}",
                  escape(reasons), "yes" if r["arrivals_available"] else "[yellow]none[/yellow]")
    out.print(t)
    for r in rows:
        out.print(f"\n[bold]{escape(r['source'])}[/bold] ({escape(r['tool'])})", highlight=False)
        out.print("  conversions:", highlight=False)
        for sentence in r["conversions"]:
            out.print(f"   - {escape(sentence)}", highlight=False, soft_wrap=True)
        missing = ", ".join(r["missing_fields"]) or "nothing"
        out.print(f"  not in the file: {escape(missing)}", highlight=False, soft_wrap=True)
        out.print(f"  arrivals: {escape(r['arrival_note'])}", highlight=False, soft_wrap=True)
        if r["rows_read"] != r["rows_imported"]:
            out.print(f"  [yellow]{r['rows_read'] - r['rows_imported']:,} record(s) read but not imported "
                      "(see the conversions)[/yellow]", highlight=False)
    no_arrivals = [r["source"] for r in rows if not r["arrivals_available"]]
    if no_arrivals:
        _err().print(
            "[yellow]warning:[/yellow] " + escape(
                f"no request start times in {', '.join(no_arrivals)}: `llmslo report` windows, per-second rates "
                "(request and token goodput per second) and in-flight counts from these rows are meaningless; "
                "goodput fractions, counts and latency quantiles are sound."), highlight=False, soft_wrap=True)
    if total is not None:
        out.print(escape(f"\nstore {db}: {total:,} request summaries (report them: llmslo report --db {db} "
                         "--by model,finish_reason)"), highlight=False)


def import_command(
    kind: Annotated[str, typer.Argument(
        help="What the files are: vllm-bench, llmperf, genai-perf, guidellm (or another registered kind), "
        "or auto to recognise each file from its content.", show_default=False)],
    files: Annotated[list[Path], typer.Argument(help="Files to import.", show_default=False)],
    db: Annotated[Path, typer.Option("--db", help="DuckDB store file (created if missing).", show_default=False)],
    model: Annotated[str | None, typer.Option(
        "--model", help="Model name for every imported row (default: the name the file records, else the file "
        "name).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (for scripts).")] = False,
) -> None:
    """Import other tools' benchmark results as request summaries, converted to llmslo's definitions.

    Each file is converted (TTFT, TPOT, e2e, finish reasons and token counts mapped to the definitions llmslo
    prints beside every figure), validated like `llmslo ingest`, and loaded; a malformed file names the
    record and field and nothing is imported. A short report per file lists rows read and imported, every
    conversion applied and what the file does not record. Times are the tool's client-side measurements.
    Re-importing a file adds nothing (request ids come from the file name and the record's position); where each
    file came from is kept in the store (table llmslo_imports, keyed by the file's SHA-256).

    Kinds: vllm-bench (vLLM benchmark_serving.py / vllm bench serve JSON saved with --save-detailed),
    llmperf (LLMPerf individual responses), genai-perf (GenAI-Perf profile_export.json or AIPerf
    profile_export.jsonl), guidellm (guidellm benchmarks.json), other registered kinds, and auto.

    Example: llmslo import llmperf results/*_individual_responses.json --db bench.duckdb
    """
    from llmslo.analysis.importers import ImportOptions, UnknownKindError, import_files
    from llmslo.telemetry import LlmsloError

    try:
        result = import_files(files, kind, db, ImportOptions(model=model))
    except UnknownKindError as exc:
        raise _fail(str(exc), 2) from None
    except LlmsloError as exc:
        raise _fail(str(exc)) from None
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
        return
    _print(result, db)
