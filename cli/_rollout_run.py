"""``llmslo rollout run``: a rolling update of a gateway's pool, batch by batch, recorded and compared.

The work is :class:`llmslo.ops.RolloutRunner` (through the gateway's admin API); this module reads the flags,
prints each step, and at the end stores what happened: the gateway's request summaries (``--summaries``, its
JSONL folder) ingested into ``--db``, one update record per drained backend, and ``rollout compare`` over the
update's span.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from llmslo.cli._common import EXIT_INPUT, shown
from llmslo.cli._common import console as _console
from llmslo.cli._common import err as _err
from llmslo.cli._common import fail as _fail
from llmslo.telemetry import LlmsloError

if TYPE_CHECKING:
    from llmslo.analysis.rollout import VersionComparison
    from llmslo.ops import RolloutResult

__all__ = ["run_command"]

def run_command(
    plan_file: Annotated[Path, typer.Option("--plan", help="The plan (YAML or JSON); see the example above.",
                                            show_default=False)],
    db: Annotated[Path | None, typer.Option(
        "--db", help="Store the update records here (and the summaries of --summaries), then compare.",
        show_default=False)] = None,
    summaries: Annotated[Path | None, typer.Option(
        "--summaries", help="The gateway's JSONL summaries folder (llmslo gateway --jsonl), ingested into --db "
        "before the comparison (read at the end; none yet: nothing ingested).", show_default=False)] = None,
    rollback: Annotated[bool, typer.Option(
        "--rollback", help="Run the plan the other way, to -> from: the same path, versions swapped.")] = False,
    update_id: Annotated[str | None, typer.Option(
        "--update-id", help="The records' key prefix (default: rollout-<UTC time>).", show_default=False)] = None,
    min_count: Annotated[int, typer.Option(
        "--min-count", help="The comparison's fewest requests or samples per side for a test.")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (for scripts).")] = False,
) -> None:
    """Update a pool behind llmslo gateway batch by batch: start the new version, add it, drain the old, stop it.

    Before anything changes the plan is checked: wait_budget_s <= caller_timeout_s, settle + budget <=
    max_overlap_window_s, and both versions' artefacts (program, model file and its SHA-256) present, so that a
    rollback stays possible. Each batch prints three numbers per drained backend: the actual drain time, the
    requests terminated, and the removal propagation delay (removal from the pool to the last new request it
    got). When a budget runs out with terminate_on_budget false, the backend returns to the pool and the update
    stops (exit 1). When the gateway's admin API fails during a drain, the backend is put back in the pool (or
    the message names it and the command that does), the failure goes into its update record, and the update
    stops (exit 1). --rollback runs the same path the other way. With --db: the records are stored (one per
    drained backend; llmslo rollout show) and llmslo rollout compare runs over the update's span.

    Plan example:

    \b
    gateway: http://127.0.0.1:9101          # the gateway's admin API (llmslo gateway --admin-port)
    batch_size: 1
    from: {version: v1, slots: 4, model: old.gguf,
           command: [llama-server, --model, "{model}", --port, "{port}", --parallel, "4"]}
    to:   {version: v2, slots: 4, model: new.gguf,
           command: [llama-server, --model, "{model}", --port, "{port}", --parallel, "4"]}
    drain: {caller_timeout_s: 60, wait_budget_s: 30, idle_threshold_s: 5, poll_interval_s: 0.1,
            unregister_settle_s: 2, max_overlap_window_s: 120, terminate_on_budget: true}
    """
    from llmslo.ops import RolloutRunner, load_plan

    if summaries is not None and db is None:
        raise _fail("--summaries needs --db (the store they are ingested into)", 2)

    def say(line: str) -> None:
        _err().print(shown(line), highlight=False)

    try:
        plan = load_plan(plan_file)
        result = RolloutRunner(plan, say).run(rollback=rollback, update_id=update_id)
    except LlmsloError as exc:
        raise _fail(str(exc), EXIT_INPUT) from None
    out: dict[str, Any] = {"update": result.to_dict()}
    if db is not None:
        out.update(_store(db, summaries, result.records(plan), result, min_count))
    if as_json:
        print(json.dumps(out, indent=2, ensure_ascii=False))
    else:
        _print(result, out, db)
    if result.outcome == "failed":
        raise _fail(str(result.failure), EXIT_INPUT)
    if result.outcome != "done":
        raise typer.Exit(1)


def _store(db: Path, summaries: Path | None, records: list[dict[str, Any]], result: RolloutResult,
           min_count: int) -> dict[str, Any]:
    """Ingest the gateway's summaries, store the records, compare the versions over the update's span."""
    from llmslo.analysis.report import GoodputPolicy
    from llmslo.analysis.rollout import compare_versions, record_updates
    from llmslo.analysis.store import Store

    done: dict[str, Any] = {"db": str(db)}
    try:
        if summaries is not None:  # read at the end: the gateway creates the folder with its first summary
            files = sorted(p for p in summaries.iterdir() if p.suffix in (".jsonl", ".ndjson")) \
                if summaries.is_dir() else []
            with Store.open(db) as store:
                reports = store.ingest_files(files) if files else []
            done["summaries_ingested"] = sum(r.rows_inserted for r in reports)
        stored = record_updates(db, records)
        done["records"] = [r.update.update_id for r in stored]
        end = result.ended_unix_s or result.started_unix_s
        with Store.open(db, read_only=True) as store:
            comparison: VersionComparison = compare_versions(
                store.con, from_unix_s=result.started_unix_s, to_unix_s=end, policy=GoodputPolicy(),
                alpha=0.01, min_side_count=min_count)
        done["comparison"] = comparison.to_dict()
    except LlmsloError as exc:
        raise _fail(f"{db}: {exc}", EXIT_INPUT) from None
    return done


def _print(result: RolloutResult, out: dict[str, Any], db: Path | None) -> None:
    from rich.table import Table

    console = _console()
    table = Table(title=f"{'Rollback' if result.rollback else 'Update'} {result.from_version} → "
                        f"{result.to_version}: {result.outcome}")
    for col in ("batch", "old backend", "new backend(s)", "drain s", "terminated", "propagation s", "decision",
                "overlap s"):
        table.add_column(col, justify="right" if col.endswith(("s", "terminated")) else "left")
    for b in result.batches:
        for d in b.drained:
            overlap = "-" if b.overlap_s is None else f"{b.overlap_s:.2f}"
            table.add_row(f"{b.index}/{b.of}", shown(d.backend), shown(", ".join(b.new)), f"{d.actual_drain_s:.2f}",
                          str(d.terminated), f"{d.propagation_s:.3f}",
                          "failed" if d.failure else shown(str(d.drain.get("decision"))), overlap)
    console.print(table)
    if db is None:
        return
    if "summaries_ingested" in out:
        console.print(f"{out['summaries_ingested']:,} request summaries ingested into {shown(db)}", highlight=False)
    console.print(f"{len(out['records'])} update record(s) stored in {shown(db)}: "
                  f"{shown(', '.join(out['records']))}", highlight=False)
    comparison = out["comparison"]
    verdict = comparison.get("verdict")
    console.print(f"rollout compare over the update ({result.from_version} vs {result.to_version}): "
                  f"{shown(str(verdict))}", highlight=False)
    for reason in comparison.get("reasons", [])[:5]:
        console.print(f"  {shown(str(reason))}", highlight=False)
    sys.stdout.flush()
