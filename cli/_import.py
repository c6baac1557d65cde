"""``llmslo import KIND FILES... --db PATH``: other tools' outputs into the request-summary store."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from llmslo.cli._common import console as _console
from llmslo.cli._common import err as _err
from llmslo.cli._common import fail as _fail
from llmslo.cli._common import shown

if TYPE_CHECKING:
    from llmslo.analysis.importers import ImportResult


COUNT = re.compile(
    r"(?<![\w.'-])\d[\d,]*(?![\w.'%-])(?=(?:\s+(?:of\s+\d[\d,]*|[A-Za-z'-]+)){0,3}\s+\(?(?:request|record))"
)
"""A count of requests or records in a report sentence ("130 requests", "3 failed request(s)", "2 of 5 ...")."""


def template(sentence: str) -> tuple[str, list[int]]:
    """``(sentence with each request count as {}, the counts)``: sentences that differ only in their counts
    share a template and are printed once, with the counts summed."""
    counts = [int(m.group().replace(",", "")) for m in COUNT.finditer(sentence)]
    return COUNT.sub("{}", sentence.replace("{", "{{").replace("}", "}}")), counts


QUOTED = re.compile(r"'[^']*'")
"""A quoted value in a report sentence (a model name, a field's value)."""
SHOWN_VALUES = 3
"""How many of the values of sentences that differ in one quoted value are printed (the rest are counted)."""


def _merge_quoted(facts: list[tuple[str, str, list[str]]]) -> list[tuple[str, str, list[str]]]:
    """Sentences of one heading that differ only in their one quoted value (``model = 'x' (from the file
    name ...)`` for every file) become one sentence listing the values, first met first."""
    merged: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
    order: list[tuple[str, str]] = []
    for heading, sentence, sources in facts:
        quoted = QUOTED.findall(sentence)
        key = (heading, QUOTED.sub("{}", sentence.replace("{", "{{").replace("}", "}}"))) if len(quoted) == 1 \
            else (heading, "\0" + sentence)
        if key not in merged:
            merged[key] = ([], [])
            order.append(key)
        values, where = merged[key]
        values.extend(v for v in quoted if v not in values)
        where.extend(sources)
    out: list[tuple[str, str, list[str]]] = []
    for key in order:
        (heading, form), (values, sources) = key, merged[key]
        if form.startswith("\0"):
            out.append((heading, form[1:], sources))
            continue
        listed = ", ".join(values[:SHOWN_VALUES])
        if len(values) > SHOWN_VALUES:
            listed += f" and {len(values) - SHOWN_VALUES} more"
        out.append((heading, form.format(listed), sources))
    return out


HEADINGS = ("conversions", "not in the file", "arrivals", "run duration")
"""The parts of the printed import report, in order."""


def _facts(row: dict[str, Any]) -> list[tuple[str, str]]:
    """``(heading, sentence)`` of everything the import report says about one file, in printing order."""
    facts = [("conversions", c) for c in row["conversions"]]
    facts.append(("not in the file", ", ".join(row["missing_fields"]) or "nothing"))
    facts.append(("arrivals", row["arrival_note"]))
    duration, note = row["run_duration_s"], row["run_duration_note"]
    if duration is None:
        facts.append(("run duration", note or "none recorded"))
    else:
        facts.append(("run duration", f"{duration:,.6g} s" + (f" ({note})" if note else "")))
    if row["rows_read"] != row["rows_imported"]:
        facts.append(("conversions", f"{row['rows_read'] - row['rows_imported']:,} record(s) read but not imported "
                                     "(see the sentences above)."))
    return facts


def group_facts(rows: list[dict[str, Any]]) -> list[tuple[str, str, list[str]]]:
    """Every distinct sentence once: ``(heading, sentence, sources)``, counts summed over the files that share
    it, in the order first met. ``--json`` keeps each file's own sentences."""
    groups: dict[tuple[str, str], tuple[list[int], list[str]]] = {}
    for row in rows:
        for heading, sentence in _facts(row):
            key, counts = template(sentence)
            if (heading, key) not in groups:
                groups[(heading, key)] = ([0] * len(counts), [])
            totals, sources = groups[(heading, key)]
            for i, n in enumerate(counts):
                totals[i] += n
            sources.append(row["source"])
    order = {heading: i for i, heading in enumerate(HEADINGS)}
    ordered = sorted(groups.items(), key=lambda item: order[item[0][0]])  # stable: first met within a heading
    return _merge_quoted([(heading, key.format(*(f"{n:,}" for n in totals)), sources)
                          for (heading, key), (totals, sources) in ordered])


def _print(result: ImportResult, db: Path) -> None:
    from rich.table import Table

    rows = [f.to_dict() for f in result.files]
    total = result.store_rows
    out = _console()
    t = Table(title="Import", title_justify="left")
    for col in ("file", "kind", "read", "imported", "inserted", "already stored", "finish reasons", "arrivals"):
        t.add_column(col, justify="left" if col in ("file", "kind", "finish reasons", "arrivals") else "right")
    for r in rows:
        reasons = ", ".join(f"{k} {v:,}" for k, v in r["finish_reasons"].items()) or "-"
        t.add_row(shown(r["source"]), shown(r["kind"]), f"{r['rows_read']:,}", f"{r['rows_imported']:,}",
                  "-" if r["rows_inserted"] is None else f"{r['rows_inserted']:,}",
                  "-" if r["rows_already_stored"] is None else f"{r['rows_already_stored']:,}",
                  shown(reasons), "yes" if r["arrivals_available"] else "[yellow]none[/yellow]")
    out.print(t)
    tools = sorted({r["tool"] for r in rows})
    out.print(f"\n[bold]{shown(', '.join(tools))}[/bold]", highlight=False)
    heading = None
    for head, sentence, sources in group_facts(rows):
        if head != heading:
            out.print(f"  {shown(head)}:", highlight=False)
            heading = head
        where = ""
        if len(rows) > 1:
            where = (f" (all {len(sources)} files)" if len(sources) == len(rows) else
                     f" ({Path(sources[0]).name})" if len(sources) == 1 else
                     f" ({len(sources)} files: {', '.join(Path(s).name for s in sources)})")
        out.print(f"   - {shown(sentence + where)}", highlight=False, soft_wrap=True)
    for f in result.files:
        if f.ingest is not None and (note := f.ingest.conflict_note()):
            _err().print("[yellow]warning:[/yellow] " + shown(note), highlight=False, soft_wrap=True)
    no_arrivals = [Path(r["source"]).name for r in rows if not r["arrivals_available"]]
    if no_arrivals:
        named = ", ".join(no_arrivals[:SHOWN_VALUES])
        if len(no_arrivals) > SHOWN_VALUES:
            named += f" and {len(no_arrivals) - SHOWN_VALUES} more"
        _err().print(
            "[yellow]warning:[/yellow] " + shown(
                f"no request start times in {named}: `llmslo report` cannot place these rows in windows and "
                "gives their per-second rates only from the run duration a file records (else null, with the "
                "reason); goodput fractions, counts and latency quantiles are sound."),
            highlight=False, soft_wrap=True)
    if total is not None:
        out.print(shown(f"\nstore {db}: {total:,} request summaries (report them: llmslo report --db {db} "
                        "--by model,finish_reason)", newlines=True), highlight=False)


def import_command(
    kind: Annotated[str, typer.Argument(
        help="What the files are: vllm-bench, llmperf, genai-perf, guidellm (or another registered kind), "
        "or auto to recognise each file from its content.", show_default=False)],
    files: Annotated[list[Path], typer.Argument(help="Files to import.", show_default=False)],
    db: Annotated[Path, typer.Option("--db", help="DuckDB store file (created if missing).", show_default=False)],
    model: Annotated[str | None, typer.Option(
        "--model", help="Model name for every imported row (default: the name the file records, else the file "
        "name).")] = None,
    keep_warmup_cooldown: Annotated[bool, typer.Option(
        "--keep-warmup-cooldown", help="Also import the requests a tool ran outside its measured window "
        "(guidellm's warm-up and cool-down, AIPerf's warm-up), in tenant_class warmup / cooldown (see them with "
        "llmslo report --by tenant_class). By default they are left out, as the tool leaves them out of its own "
        "figures, and the report says how many.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (for scripts).")] = False,
) -> None:
    """Import other tools' benchmark results as request summaries, converted to llmslo's definitions.

    Each file is converted (TTFT, TPOT, e2e, finish reasons and token counts mapped to the definitions llmslo
    prints beside every figure), validated like `llmslo ingest`, and loaded; a malformed file names the
    record and field and nothing is imported. The report lists rows read and imported per file, then every
    conversion applied and what the files do not record, each sentence once (with the files it applies to;
    --json keeps every file's own). Times are the tool's client-side measurements. Re-importing a file adds
    nothing, under any name (request ids come from the file's content and the record's position: the first
    16 hex digits of its SHA-256, '#', the index), and two different files of the same name both land; where
    each file came from, and the run duration it records, is kept in the store (table llmslo_imports, keyed
    by the file's SHA-256).

    Kinds: vllm-bench (vLLM benchmark_serving.py / vllm bench serve JSON saved with --save-detailed),
    llmperf (LLMPerf individual responses), genai-perf (GenAI-Perf profile_export.json or AIPerf
    profile_export.jsonl), guidellm (guidellm benchmarks.json), other registered kinds, and auto.

    Example: llmslo import llmperf results/*_individual_responses.json --db bench.duckdb
    """
    from llmslo.analysis.importers import ImportOptions, UnknownKindError, import_files, importer_for
    from llmslo.telemetry import LlmsloError

    try:  # an unknown KIND is a usage error (exit 2); a missing or unrecognised file an input error (exit 1)
        if kind != "auto":
            importer_for(kind)
    except UnknownKindError as exc:
        raise _fail(str(exc), 2) from None
    try:
        result = import_files(files, kind, db, ImportOptions(model=model, keep_warmup_cooldown=keep_warmup_cooldown))
    except LlmsloError as exc:
        raise _fail(str(exc)) from None
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
        return
    _print(result, db)
