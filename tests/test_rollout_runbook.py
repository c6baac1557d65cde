"""The runbook's own update record (issue 26, item 2), through the installed ``llmslo`` as a person runs it.

Rules protected: the record shape teams copy into their runbooks (``tests/fixtures/rollout/update_runbook.json``,
the issue's text verbatim) is recorded as given, every field read as one of ours and none dropped; our own
shape still works; ``rollout show`` and ``rollout list`` (and their ``--json``) show every field given, in
either shape; a field llmslo does not know is kept and shown, not refused; a field of the wrong type is an
error naming the field as written, the type found, the type expected and the fix, and nothing is written;
``rollout compare --update`` works on a runbook-shaped record once the record says when the overlap was, and
says what is missing when it does not.

Every command runs ``.venv/bin/llmslo`` in a temporary working directory with relative paths.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmslo.analysis.store import Store
from llmslo.tests._rollout_rows import RolloutScenario, rollout_frame

LLMSLO = Path(sys.executable).parent / "llmslo"
FIXTURES = Path(__file__).parent / "fixtures" / "rollout"
RUNBOOK = FIXTURES / "update_runbook.json"
OURS = FIXTURES / "update_v1_v2.json"
RUNBOOK_ID = "2026-10-14T02:10Z-inference"
FROM, TO = "runtime-a/weights-7", "runtime-b/weights-8"

READ_AS = {
    "update_id": "update_id",
    "from_version": "versions.from",
    "to_version": "versions.to",
    "batch.updated": "batch.index",
    "batch.total": "batch.of",
    "drain.wait_budget_s": "drain.wait_budget_s",
    "drain.actual_drain_s": "drain.actual_drain_s",
    "drain.unregister_settle_s": "drain.unregister_settle_s",
    "drain.stream_conns_closed": "drain.terminated",
    "drain.close_reason.idle": "drain.closed_by_reason.idle",
    "drain.close_reason.max_inflight": "drain.closed_by_reason.max_inflight",
    "impact.terminated_requests": "impact.terminated",
    "impact.timed_out_requests": "impact.timed_out",
    "impact.requeued_tasks": "impact.requeued",
    "overlap_window_s": "overlap.duration_s",
    "rollback.triggered": "rollback.triggered",
    "rollback.reason": "rollback.reason",
    "rollback.cost_s": "rollback.cost_s",
}
"""Where each field of the runbook record is read in our shape (docs/rollouts.md has the same table)."""


def _run(cwd: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LLMSLO), *args], cwd=cwd, input=stdin, capture_output=True, text=True,
                          timeout=120, check=False)


def _ok(cwd: Path, *args: str) -> str:
    done = _run(cwd, *args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def _leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted path, value)`` of every field that is no object (an empty object counts as one)."""
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from _leaves(item, f"{path}.{key}" if path else key)
    else:
        yield path, value


def _at(record: dict[str, Any], path: str) -> Any:
    value: Any = record
    for key in path.split("."):
        value = value[key]
    return value


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _runbook() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(RUNBOOK.read_text())
    return data


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(RUNBOOK, work / "update_runbook.json")
    shutil.copy(OURS, work / "update_v1_v2.json")
    return work


def _write(cwd: Path, name: str, record: dict[str, Any]) -> str:
    (cwd / name).write_text(json.dumps(record, indent=1))
    return name


def _show_lines(cwd: Path, update_id: str) -> list[str]:
    return _ok(cwd, "rollout", "show", update_id, "--db", "s.duckdb").splitlines()


def _line_with(lines: list[str], *parts: str) -> str:
    found = [line for line in lines if all(p in line for p in parts)]
    assert found, (parts, "\n".join(lines))
    return found[0]


# ---- the runbook record, verbatim ---------------------------------------------------------------------------


def test_the_runbook_record_is_recorded_as_given(cwd: Path) -> None:
    out = _ok(cwd, "rollout", "record", "update_runbook.json", "--db", "s.duckdb")
    lines = out.splitlines()
    assert lines[0] == f"{RUNBOOK_ID} ({FROM} → {TO}): recorded", out
    assert "runbook shape" in lines[1] and "18 fields" in lines[1], out
    assert any("no start, end or overlap times" in line and "overlap_window_s" in line for line in lines), out
    assert lines[-1] == "store s.duckdb: 1 update record(s) written", out
    again = _ok(cwd, "rollout", "record", "update_runbook.json", "--db", "s.duckdb")
    assert again.splitlines()[0] == f"{RUNBOOK_ID} ({FROM} → {TO}): already stored, nothing written", again


def test_every_runbook_field_is_read_as_ours_and_none_is_dropped(cwd: Path) -> None:
    assert [path for path, _ in _leaves(_runbook())] == list(READ_AS)  # the table names every field
    _ok(cwd, "rollout", "record", "update_runbook.json", "--db", "s.duckdb")
    shown = json.loads(_ok(cwd, "rollout", "show", RUNBOOK_ID, "--db", "s.duckdb", "--json"))
    assert shown["given"] == _runbook()  # verbatim: names, values, nulls
    for given, ours in READ_AS.items():
        assert _at(shown, ours) == _at(_runbook(), given), (given, ours)
    assert shown["impact"]["in_flight"] is None and shown["derived"]["budget_used"] == pytest.approx(52 / 120)
    assert shown["started_unix_s"] is None and shown["ended_unix_s"] is None


def test_show_prints_every_runbook_field_with_its_name_value_and_where_it_is_read(cwd: Path) -> None:
    _ok(cwd, "rollout", "record", "update_runbook.json", "--db", "s.duckdb")
    lines = _show_lines(cwd, RUNBOOK_ID)
    assert lines[0] == f"update {RUNBOOK_ID}", lines[0]
    for given, value in _leaves(_runbook()):
        _line_with(lines, f" {given} ", f" {_text(value)} ", f" {READ_AS[given]} ")
    _line_with(lines, "batch", "3 of 12")
    _line_with(lines, "overlap length", "260 s")
    _line_with(lines, "closed by reason", "idle 3, max_inflight 1")


def test_list_prints_the_runbook_record_and_its_json_holds_it_as_given(cwd: Path) -> None:
    _ok(cwd, "rollout", "record", "update_runbook.json", "--db", "s.duckdb")
    out = _ok(cwd, "rollout", "list", "--db", "s.duckdb")
    row = _line_with(out.splitlines(), RUNBOOK_ID)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells == [RUNBOOK_ID, f"{FROM} → {TO}", "-", "3 of 12", "52.0 / 120", "0", "no"], out
    (listed,) = json.loads(_ok(cwd, "rollout", "list", "--db", "s.duckdb", "--json"))["updates"]
    assert listed["given"] == _runbook() and listed["versions"]["from"] == FROM


def test_show_json_is_taken_back_by_record_as_the_same_content(cwd: Path) -> None:
    _ok(cwd, "rollout", "record", "update_runbook.json", "--db", "s.duckdb")
    shown = _ok(cwd, "rollout", "show", RUNBOOK_ID, "--db", "s.duckdb", "--json")
    done = _run(cwd, "rollout", "record", "-", "--db", "s.duckdb", "--json", stdin=shown)
    assert done.returncode == 0 and json.loads(done.stdout)["records"][0]["status"] == "already_stored", done


# ---- our shape, and fields llmslo does not know ------------------------------------------------------------


@pytest.mark.parametrize("base", ["runbook", "ours"])
def test_a_field_llmslo_does_not_know_is_kept_and_shown_not_refused(cwd: Path, base: str) -> None:
    record = _runbook() if base == "runbook" else json.loads(OURS.read_text())
    record["change_ticket"] = "CHG-4711"
    record["drain"]["pod"] = "inference-7f9c"
    record["impact"]["retried_by_client"] = 5
    name = _write(cwd, "u.json", record)
    out = _ok(cwd, "rollout", "record", name, "--db", "s.duckdb")
    lines = out.splitlines()
    versions = f"{FROM} → {TO}" if base == "runbook" else "chat-v1.4.2 → chat-v1.5.0"
    assert lines[0] == f"{record['update_id']} ({versions}): recorded", out
    kept = _line_with(lines, "kept as given, not read by llmslo")
    for path in ("change_ticket", "drain.pod", "impact.retried_by_client"):
        assert path in kept, out
    update_id = record["update_id"]
    shown = json.loads(_ok(cwd, "rollout", "show", update_id, "--db", "s.duckdb", "--json"))
    assert shown["change_ticket"] == "CHG-4711" and shown["drain"]["pod"] == "inference-7f9c"
    assert shown["impact"]["retried_by_client"] == 5
    if base == "ours":  # our shape is stored as given, no copy under "given"
        assert {k: v for k, v in shown.items() if k != "derived"} == record
    else:
        assert shown["given"] == record
    text = _show_lines(cwd, update_id)
    _line_with(text, "change_ticket", "CHG-4711")
    _line_with(text, "drain.pod", "inference-7f9c")
    _line_with(text, "impact.retried_by_client", "5")
    (listed,) = json.loads(_ok(cwd, "rollout", "list", "--db", "s.duckdb", "--json"))["updates"]
    assert listed == shown


# ---- a field of the wrong type ------------------------------------------------------------------------------


def _runbook_with(path: str, value: Any) -> dict[str, Any]:
    record = _runbook()
    *parents, last = path.split(".")
    target = record
    for key in parents:
        target = target[key]
    target[last] = value
    return record


WRONG = [
    ("drain.wait_budget_s", "120s", "a string", "a number", "write the number of seconds without quotes or unit"),
    ("impact.terminated_requests", "0", "a string", "a whole number", "write it without quotes: 0"),
    ("batch.updated", "3", "a string", "a whole number", "write it without quotes: 3"),
    ("overlap_window_s", "260", "a string", "a number", "write it without quotes: 260"),
    ("from_version", 7, "a number", "a non-blank string", 'write it in quotes: "7"'),
    ("rollback.triggered", "false", "a string", "true or false", "write it without quotes: false"),
    ("drain.close_reason", [3, 1], "a list", "a JSON object", "write it as an object"),
]


@pytest.mark.parametrize(("path", "value", "found", "expected", "fix"), WRONG, ids=[w[0] for w in WRONG])
def test_a_field_of_the_wrong_type_is_named_with_the_types_and_the_fix_and_nothing_is_written(
        cwd: Path, path: str, value: Any, found: str, expected: str, fix: str) -> None:
    name = _write(cwd, "bad.json", _runbook_with(path, value))
    done = _run(cwd, "rollout", "record", name, "--db", "s.duckdb")
    first = done.stderr.splitlines()[0] if done.stderr else ""
    assert done.returncode == 1 and first.startswith(f"error: bad.json: {path}: "), (done.stdout, done.stderr)
    for part in (f"got {_text(value)!r}" if isinstance(value, str) else f"got {value!r}", f"({found})", expected,
                 fix):
        assert part in first, (part, first)
    assert sorted(p.name for p in cwd.iterdir()) == ["bad.json", "update_runbook.json", "update_v1_v2.json"]
    _ok(cwd, "rollout", "record", "update_v1_v2.json", "--db", "s.duckdb")  # an existing store stays as it was
    before = _ok(cwd, "rollout", "list", "--db", "s.duckdb", "--json")
    assert _run(cwd, "rollout", "record", name, "--db", "s.duckdb").returncode == 1
    assert _ok(cwd, "rollout", "list", "--db", "s.duckdb", "--json") == before


# ---- compare on a runbook-shaped record ---------------------------------------------------------------------


OVERLAP_FROM = 1_791_943_800.0  # 2026-10-14 02:10 UTC, the time in the runbook record's id


@pytest.fixture
def store(cwd: Path) -> Path:
    scenario = RolloutScenario(n_baseline=400, n_window=400, baseline_s=1800.0, window_s=260.0,
                               versions=(FROM, TO), start_unix_s=OVERLAP_FROM - 1800.0)
    with Store.open(cwd / "s.duckdb") as s:
        s.ingest_frame(rollout_frame(11, scenario))
    return cwd / "s.duckdb"


def test_compare_needs_to_know_when_the_overlap_was_and_says_so(cwd: Path) -> None:
    """A store whose summaries are of other versions cannot place the overlap either: the refusal says what the
    record lacks, what the store lacks, and the ways out."""
    scenario = RolloutScenario(n_baseline=100, n_window=100, baseline_s=600.0, window_s=260.0,
                               start_unix_s=OVERLAP_FROM - 600.0)  # versions v1 and v2, not the record's
    with Store.open(cwd / "s.duckdb") as s:
        s.ingest_frame(rollout_frame(11, scenario))
    _ok(cwd, "rollout", "record", "update_runbook.json", "--db", "s.duckdb")
    done = _run(cwd, "rollout", "compare", "--db", "s.duckdb", "--update", RUNBOOK_ID)
    assert done.returncode == 1, (done.stdout, done.stderr)
    first = done.stderr.splitlines()[0]
    for part in (RUNBOOK_ID, "overlap_window_s", "260 s", "overlap.from_unix_s", "--from",
                 f"holds no summary of version {FROM!r} or {TO!r}"):
        assert part in first, (part, first)


def test_compare_places_a_runbook_overlap_by_the_versions_stored_summaries(cwd: Path) -> None:
    """The runbook record says how long the versions overlapped, not when; the store's summaries say it: from
    the first arrival of the new version to the last of the old one. The comparison runs over that, and says so."""
    import polars as pl

    scenario = RolloutScenario(n_baseline=400, n_window=400, baseline_s=1800.0, window_s=260.0,
                               versions=(FROM, TO), start_unix_s=OVERLAP_FROM - 1800.0)
    frame = rollout_frame(11, scenario)
    # before the overlap only the old version served; within it both
    frame = frame.with_columns(pl.when(pl.col("arrival_unix_s") < OVERLAP_FROM).then(pl.lit(FROM))
                               .otherwise(pl.col("version")).alias("version"))
    with Store.open(cwd / "s.duckdb") as s:
        s.ingest_frame(frame)
    _ok(cwd, "rollout", "record", "update_runbook.json", "--db", "s.duckdb")
    result = json.loads(_ok(cwd, "rollout", "compare", "--db", "s.duckdb", "--update", RUNBOOK_ID, "--json"))
    lo, hi = result["window"]["from_unix_s"], result["window"]["to_unix_s"]
    first_new = frame.filter(pl.col("version") == TO)["arrival_unix_s"].min()
    last_old = frame.filter(pl.col("version") == FROM)["arrival_unix_s"].max()
    assert (lo, hi) == (first_new, last_old)
    assert OVERLAP_FROM <= lo < hi <= OVERLAP_FROM + 260 and hi - lo > 250
    assert any("taken from the stored summaries" in n and "its length as 260 s" in n for n in result["notes"]), (
        result["notes"])
    assert {o["version"] for o in result["outcomes"]} == {FROM, TO}


def test_compare_works_on_a_runbook_record_that_says_when_the_overlap_began(cwd: Path, store: Path) -> None:
    record = _runbook()
    record["overlap"] = {"from_unix_s": OVERLAP_FROM}
    name = _write(cwd, "u.json", record)
    out = _ok(cwd, "rollout", "record", name, "--db", "s.duckdb")
    assert "no start, end or overlap times" not in out, out
    result = json.loads(_ok(cwd, "rollout", "compare", "--db", "s.duckdb", "--update", RUNBOOK_ID, "--json"))
    assert (result["window"]["from_unix_s"], result["window"]["to_unix_s"]) == (OVERLAP_FROM, OVERLAP_FROM + 260)
    update = result["process"]["update"]
    assert (update["from_version"], update["to_version"], update["batch_index"], update["batches"]) == (
        FROM, TO, 3, 12)
    assert (update["wait_budget_s"], update["actual_drain_s"], update["unregister_settle_s"]) == (120, 52, 10)
    assert (update["terminated"], update["timed_out"], update["requeued"]) == (0, 2, 11)
    assert {o["version"] for o in result["outcomes"]} == {FROM, TO}
    assert result["verdict"] in ("lossless", "regression", "insufficient_data")
    text = _ok(cwd, "rollout", "compare", "--db", "s.duckdb", "--update", RUNBOOK_ID)
    assert text.splitlines()[0].startswith(f"update {RUNBOOK_ID}: overlap window 2026-10-14 02:10:00 to "
                                           "2026-10-14 02:14:20 UTC"), text


def test_a_runbook_record_without_times_still_serves_an_explicit_compare_and_the_drain_advice(
        cwd: Path, store: Path) -> None:
    _ok(cwd, "rollout", "record", "update_runbook.json", "--db", "s.duckdb")
    result = json.loads(_ok(cwd, "rollout", "compare", "--db", "s.duckdb", "--from", str(OVERLAP_FROM), "--to",
                            str(OVERLAP_FROM + 260), "--json"))
    assert result["window"]["excluded_from_baseline"] == []
    assert any(RUNBOOK_ID in note and "no times" in note for note in result["notes"]), result["notes"]
    advice = json.loads(_ok(cwd, "drain", "advise", "--db", "s.duckdb", "--caller-timeout", "300s", "--json"))
    assert (advice["settle_s"], advice["settle_source"]) == (10, "latest stored update's unregister_settle_s")
    (observed,) = advice["observed"]
    assert (observed["update_id"], observed["started_unix_s"], observed["wait_budget_s"]) == (RUNBOOK_ID, None, 120)
