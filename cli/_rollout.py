"""``llmslo rollout``: record rolling updates in the store, list and show them, compare versions.

Every value read from a record reaches the terminal through :func:`shown` (an ``update_id`` of
``[link=…]`` or ``\\x1b[2J`` prints as those characters).
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from llmslo.cli._common import EXIT_INPUT, shown
from llmslo.cli._common import console as _console
from llmslo.cli._common import fail as _fail
from llmslo.cli._rollout_compare import compare_command
from llmslo.cli._rollout_run import run_command
from llmslo.telemetry import LlmsloError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from llmslo.analysis.rollout import UpdateRecord

__all__ = ["rollout_app"]

rollout_app = typer.Typer(
    name="rollout",
    help=(
        "Rolling updates, measured: keep a record of every update in the store (versions and artefact "
        "checksums, request impact, metrics before/after, rollback, the drain's figures, batch progress, "
        "the overlap window), list and show them, compare the versions during the overlap.\n\n"
        "Start with: llmslo rollout record update.json --db store.duckdb"
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
DbOption = Annotated[Path, typer.Option("--db", help="DuckDB store file.", show_default=False)]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object (for scripts).")]

STDIN = "-"
"""The FILE argument that reads standard input."""


def _read(file: str) -> bytes:
    """The bytes of ``file`` (standard input for ``-``); a missing or unreadable file exits 1 naming it."""
    if file == STDIN:
        return sys.stdin.buffer.read()
    path = Path(file)
    if not path.is_file():
        raise _fail(f"no such file {file}", EXIT_INPUT)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise _fail(f"cannot read {file}: {exc.strerror or exc}", EXIT_INPUT) from None


@rollout_app.command("record")
def record_command(
    file: Annotated[str, typer.Argument(metavar="FILE.json|-", show_default=False,
                                        help="An update record (JSON object) or a list of them; - reads standard "
                                        "input.")],
    db: DbOption,
    as_json: JsonOption = False,
) -> None:
    """Validate update records and store them (the store is created if missing).

    Two shapes are read: ours, and the runbook's (from_version, to_version, batch.updated/total,
    drain.stream_conns_closed/close_reason, impact.*_requests, overlap_window_s), kept as given.
    Every record is checked before anything is written; a field of the wrong type is an error naming
    the field, the type found and expected, and the fix. A field llmslo does not know is kept and
    listed. A record whose update_id is stored with the same content is skipped ("already stored");
    one stored with other content is refused. The shapes are in docs/rollouts.md. With --json:
    {"db", "records": [{"update_id", "status", "shape", "notes"}]}.
    """
    from llmslo.analysis.rollout import parse_update_json, record_updates

    name = "standard input" if file == STDIN else file
    data = _read(file)
    try:
        records = parse_update_json(data, source=name)
    except LlmsloError as exc:
        raise _fail(str(exc)) from None
    try:
        done = record_updates(db, records)
    except LlmsloError as exc:
        raise _fail(f"{name}: {exc}") from None
    if as_json:
        print(json.dumps({"db": str(db), "records": [
            {"update_id": d.update.update_id, "status": "already_stored" if d.already_stored else "recorded",
             "shape": d.update.shape, "notes": _record_notes(d.update, db)} for d in done]},
            indent=2, ensure_ascii=False))
        return
    out = _console()
    for d in done:
        u = d.update
        what = "already stored, nothing written" if d.already_stored else "recorded"
        out.print(f"{shown(u.update_id)} ({shown(u.from_version)} → {shown(u.to_version)}): {what}",
                  highlight=False)
        for note in _record_notes(u, db):
            out.print(f"  {shown(note)}", highlight=False)
    written = sum(not d.already_stored for d in done)
    out.print(f"store {shown(db)}: {written} update record(s) written", highlight=False)


def _record_notes(u: UpdateRecord, db: Path) -> list[str]:
    """What a person recording ``u`` should know: the shape it was read in, the fields kept but not read,
    and whether `rollout compare --update` can place it in time."""
    notes = []
    if u.shape == "runbook":
        notes.append(f"read in the runbook shape: {len(u.given_fields())} fields, each kept as given and read as "
                     f"ours (llmslo rollout show {u.update_id} --db {db} prints them)")
    unknown = u.unknown_fields()
    if unknown:
        notes.append("kept as given, not read by llmslo: " + ", ".join(
            path + (f" (did you mean {near!r}?)" if near else "") for path, _, near in unknown))
    if (timeless := _timeless_note(u)) is not None:
        notes.append(timeless)
    return notes


def _timeless_note(u: UpdateRecord) -> str | None:
    """What `rollout compare --update` lacks when the record says nothing of when the update happened."""
    if u.window() is not None:
        return None
    overlap = u.record.get("overlap") or {}
    length = overlap.get("duration_s")
    name = "overlap_window_s" if u.shape == "runbook" else "overlap.duration_s"
    said = "" if length is None else f" ({name} gives its length, {length:g} s, not when)"
    return (f"no start, end or overlap times{said}: `rollout compare --update` needs overlap.from_unix_s, or "
            "started_unix_s and ended_unix_s (under a new update_id); else compare with --from/--to")


def _utc(t: float | None) -> str:
    """Unix seconds as ``YYYY-MM-DD HH:MM:SS`` UTC (``-`` when unknown)."""
    return "-" if t is None else datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _num(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:g}{unit}"


def _drain_vs_budget(u: UpdateRecord) -> str:
    if u.actual_drain_s is None or u.wait_budget_s is None:
        return "-"
    return f"{u.actual_drain_s:.1f} / {u.wait_budget_s:g}"


def _rollback_cell(u: UpdateRecord) -> str:
    rollback = u.record.get("rollback")
    if rollback is None:
        return "-"
    return f"yes: {shown(rollback['reason'] or '')}" if rollback["triggered"] else "no"


def _batch_cell(index: int | None, of: int | None) -> str:
    if index is None:
        return "-"
    return f"{index}" + (f" of {of}" if of is not None else "")


def _list_table(updates: list[UpdateRecord]) -> Table:
    from rich.table import Table

    t = Table(title="Update records (times UTC; drain s / budget s)", title_justify="left")
    for col in ("id", "from → to", "started (UTC)", "batch", "drain s / budget", "terminated", "rollback"):
        t.add_column(col, justify="right" if col in ("drain s / budget", "terminated") else "left")
    for u in updates:
        t.add_row(shown(u.update_id), f"{shown(u.from_version)} → {shown(u.to_version)}", _utc(u.started_unix_s),
                  _batch_cell(u.batch_index, u.batches), _drain_vs_budget(u),
                  "-" if u.terminated is None else f"{u.terminated:,}", _rollback_cell(u))
    return t


def _stored(db: Path) -> list[UpdateRecord]:
    from llmslo.analysis.rollout import list_updates
    from llmslo.analysis.store import Store

    try:
        with Store.open(db, read_only=True) as store:
            return list_updates(store.con)
    except LlmsloError as exc:
        raise _fail(str(exc)) from None


@rollout_app.command("list")
def list_command(db: DbOption, as_json: JsonOption = False) -> None:
    """List the stored update records by start time (those without one last): id, versions, start,
    batch, drain time against the wait budget, terminated requests, rollback. With --json: {"db",
    "updates": [record, ...]}, each record as `rollout show --json` prints it."""
    updates = _stored(db)
    if as_json:
        print(json.dumps({"db": str(db), "updates": [u.to_dict() for u in updates]}, indent=2))
        return
    out = _console()
    if not updates:
        out.print(f"no update records in {shown(db)} (add one: llmslo rollout record FILE.json --db {shown(db)})",
                  highlight=False)
        return
    out.print(_list_table(updates))


def _share(part: int | None, whole: int | None) -> str:
    if part is None:
        return "-"
    return f"{part:,}" + (f" ({part / whole:.1%} of {whole:,} in flight)" if whole else "")


def _pairs(title: str, rows: list[tuple[str, str]]) -> Table:
    from rich.table import Table

    t = Table(title=title, title_justify="left", show_header=False)
    t.add_column("field")
    t.add_column("value")
    for key, value in rows:
        t.add_row(key, value)
    return t


def _versions_rows(rec: dict[str, Any]) -> list[tuple[str, str]]:
    v = rec["versions"]
    rows = [("from", shown(v["from"])), ("to", shown(v["to"]))]
    rows += [(f"artefact {shown(name)}", f"sha256 {digest}") for name, digest in v["artifacts"].items()]
    batch = rec.get("batch")
    if batch is not None:
        rows.append(("batch", _batch_cell(batch["index"], batch["of"])))
    overlap = rec.get("overlap") or {}
    rows += [("started (UTC)", _utc(rec["started_unix_s"])), ("ended (UTC)", _utc(rec["ended_unix_s"])),
             ("overlap from (UTC)", _utc(overlap.get("from_unix_s"))),
             ("overlap to (UTC)", _utc(overlap.get("to_unix_s")))]
    if overlap.get("duration_s") is not None:
        rows.append(("overlap length", _num(overlap["duration_s"], " s")))
    return rows


def _impact_rows(rec: dict[str, Any]) -> list[tuple[str, str]]:
    i = rec.get("impact")
    if i is None:
        return [("impact", "not recorded")]
    n = i["in_flight"]
    return [("in flight", _num(n)), *((k.replace("_", " "), _share(i[k], n)) for k in ("terminated", "timed_out",
                                                                                       "requeued"))]


def _metrics_table(rec: dict[str, Any]) -> Table | None:
    from rich.table import Table

    from llmslo.analysis.rollout import METRIC_KEYS

    m = rec.get("metrics")
    if m is None:
        return None
    t = Table(title="Metrics before and after", title_justify="left")
    for col in ("figure", "before", "after", "change"):
        t.add_column(col, justify="left" if col == "figure" else "right")
    for key in METRIC_KEYS:
        before, after = m["before"].get(key), m["after"].get(key)
        if before is None and after is None:
            continue
        change = f"{after - before:+g}" if before is not None and after is not None else "-"
        t.add_row(key, _num(before), _num(after), change)
    return t


def _rollback_rows(rec: dict[str, Any]) -> list[tuple[str, str]]:
    r = rec.get("rollback")
    if r is None:
        return [("rollback", "not recorded")]
    return [("triggered", "yes" if r["triggered"] else "no"), ("reason", shown(r["reason"] or "-")),
            ("cost", _num(r["cost_s"], " s") + (f"; {shown(r['cost'])}" if r["cost"] else ""))]


def _drain_rows(rec: dict[str, Any]) -> list[tuple[str, str]]:
    d = rec.get("drain")
    if d is None:
        return [("drain", "not recorded")]
    rows = [("wait budget", _num(d["wait_budget_s"], " s")), ("actual drain", _num(d["actual_drain_s"], " s")),
            ("unregister settle", _num(d["unregister_settle_s"], " s")), ("decision", shown(d["decision"] or "-")),
            ("in flight at start", _num(d["in_flight_at_start"]))]
    for key in ("closed_by_reason", "ended_by_reason"):
        counts = d[key]
        text = ", ".join(f"{shown(k)} {_value(v)}" for k, v in counts.items()) if counts else "-"
        rows.append((key.replace("_", " "), text))
    rows.append(("terminated (streams closed)", _num(d["terminated"])))
    rows += [(k.replace("_", " "), _num(d[k])) for k in ("timed_out", "requeued", "requeue_failed", "remaining")]
    return rows


def _value(value: object) -> str:
    """A value as given: text as it is, a whole count with thousands separators, anything else as JSON."""
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return shown(json.dumps(value, ensure_ascii=False))


def _as_given(value: object) -> str:
    """A value as it was written: text as it is, anything else as JSON."""
    return shown(value) if isinstance(value, str) else shown(json.dumps(value, ensure_ascii=False))


def _given_table(update: UpdateRecord) -> Table:
    from rich.table import Table

    t = Table(title="As given (the runbook shape): each field, its value, and the field of ours it is read as",
              title_justify="left")
    for col in ("field as given", "value", "read as"):
        t.add_column(col)
    for path, value, ours in update.given_fields():
        t.add_row(shown(path), _as_given(value), "kept as given, not read by llmslo" if ours is None else shown(ours))
    return t


def _unknown_table(update: UpdateRecord) -> Table | None:
    from rich.table import Table

    unknown = update.unknown_fields()
    if not unknown:
        return None
    t = Table(title="Other fields (kept as given, not read by llmslo)", title_justify="left")
    for col in ("field", "value", "note"):
        t.add_column(col)
    for path, value, near in unknown:
        t.add_row(shown(path), _as_given(value), f"did you mean {shown(near)!r}?" if near else "")
    return t


def _show(out: Console, update: UpdateRecord) -> None:
    rec = dict(update.record)
    out.print(f"update {shown(update.update_id)}", highlight=False)
    if update.shape == "runbook":
        out.print(_given_table(update))
    out.print(_pairs("Versions", _versions_rows(rec)))
    out.print(_pairs("Request impact", _impact_rows(rec)))
    metrics = _metrics_table(rec)
    out.print(metrics if metrics is not None else "Metrics before and after: not recorded", highlight=False)
    out.print(_pairs("Rollback", _rollback_rows(rec)))
    out.print(_pairs("Drain (process figures)", _drain_rows(rec)))
    if rec.get("notes"):
        out.print(f"notes: {shown(rec['notes'], newlines=True)}", highlight=False)
    if rec.get("extra") is not None:
        out.print(f"extra: {shown(json.dumps(rec['extra'], ensure_ascii=False))}", highlight=False)
    unknown = _unknown_table(update) if update.shape != "runbook" else None  # as given lists them already
    if unknown is not None:
        out.print(unknown)
    if (timeless := _timeless_note(update)) is not None:
        out.print(f"note: {shown(timeless)}", highlight=False)


@rollout_app.command("show")
def show_command(
    update_id: Annotated[str, typer.Argument(metavar="ID", help="The update_id.", show_default=False)],
    db: DbOption,
    as_json: JsonOption = False,
) -> None:
    """Show one update record: a record given in the runbook shape field by field as given (with the
    field of ours each is read as), then versions and artefacts, request impact with shares of the
    in-flight count, metrics before/after, rollback, the drain's figures, and the fields llmslo does
    not know. With --json: the record as stored (the object as given under "given" for the runbook
    shape), with "derived" (the shares and budget_used), which `rollout record` takes back unchanged."""
    from llmslo.analysis.rollout import get_update
    from llmslo.analysis.store import Store

    try:
        with Store.open(db, read_only=True) as store:
            update = get_update(store.con, update_id)
    except LlmsloError as exc:
        raise _fail(str(exc)) from None
    if update is None:
        raise _fail(f"no update {update_id!r} in {db}; `llmslo rollout list --db {db}` lists the stored ones")
    if as_json:
        print(json.dumps(update.to_dict(), indent=2, ensure_ascii=False))
        return
    _show(_console(), update)




rollout_app.command("compare")(compare_command)
rollout_app.command("run")(run_command)
