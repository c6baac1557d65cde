"""Update records (``llmslo.analysis.rollout`` records part, ``llmslo rollout record|list|show``).

Rules protected: a record holds the four parts of the draining document plus the drain section, which is
exactly ``llmslo.controls.DrainRecord.to_dict()``, taken as is; every invalid field is refused with its path
and the fix, and nothing is written (no table row, no store file); a key llmslo does not know is kept where it
was given, with a near miss named; storing is
idempotent on ``update_id`` (same content: already stored; other content: a conflict naming the id); a list
is stored all or nothing; ``show --json`` gives back what ``record`` takes as the same content; data reaches
the terminal literally.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import duckdb
import pytest
from typer.testing import CliRunner

from llmslo.analysis.rollout import (
    UPDATES_TABLE,
    RolloutInputError,
    UpdateRecord,
    _records,
    get_update,
    list_updates,
    parse_update_json,
    record_update,
    record_updates,
    validate_update,
)
from llmslo.analysis.store import Store
from llmslo.cli._app import app
from llmslo.controls import DRAIN_DECISIONS, DrainRecord

EXAMPLE = Path(__file__).parent / "fixtures" / "rollout" / "update_v1_v2.json"
runner = CliRunner()


def _example() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(EXAMPLE.read_text())
    return data


def _drain_record(**changes: Any) -> DrainRecord:
    base = DrainRecord(
        from_version="v1", to_version="v2", batch=2, batches=3, started_unix_s=1_793_714_400.0,
        wait_budget_s=120.0, unregister_settle_s=5.0, actual_drain_s=42.5, in_flight_at_start=20,
        closed_by_reason={"idle": 1, "max_inflight": 1, "budget_exhausted": 0}, ended_by_reason={"stop": 15},
        terminated=2, timed_out=1, requeued=2, requeue_failed=0, remaining=0, decision="drained")
    return dataclasses.replace(base, **changes)


def _rows(db: Path) -> int:
    with duckdb.connect(str(db)) as con:
        return int(con.sql(f"SELECT count(*) FROM {UPDATES_TABLE}").fetchall()[0][0])


# ---- the shape ---------------------------------------------------------------------------------------------


def test_the_drain_section_knows_exactly_the_keys_and_values_of_the_controls_drain_record() -> None:
    assert list(_drain_record().to_dict()) == list(_records.DRAIN_KEYS)
    assert _records.DRAIN_DECISIONS == DRAIN_DECISIONS


def test_the_example_file_is_stored_and_read_back_with_its_columns(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    stored = record_update(db, _example())
    with Store.open(db, read_only=True) as store:
        (listed,) = list_updates(store.con)
        got = get_update(store.con, "2026-11-03-chat-v1-v2-batch1")
        assert get_update(store.con, "other") is None
    assert got is not None and listed.record == stored.record == got.record
    assert (got.from_version, got.to_version, got.batch_index, got.batches) == ("chat-v1.4.2", "chat-v1.5.0", 1, 4)
    assert (got.wait_budget_s, got.actual_drain_s, got.unregister_settle_s) == (120.0, 96.5, 5.0)
    assert (got.terminated, got.timed_out, got.requeued, got.in_flight_at_start) == (3, 1, 4, 57)
    assert got.rollback_triggered is False
    assert got.window() == (1_793_714_430.0, 1_793_716_200.0)  # the overlap, not the update's start and end
    assert got.derived()["terminated_share"] == pytest.approx(3 / 57)
    assert got.derived()["budget_used"] == pytest.approx(96.5 / 120)
    given = _example()
    assert {k: v for k, v in got.to_dict().items() if k != "derived"} == given


def test_a_drain_record_alone_fills_versions_impact_batch_and_times() -> None:
    drain = _drain_record()
    rec = validate_update({"update_id": "u", "drain": drain.to_dict()})
    assert rec["drain"] == drain.to_dict()
    assert rec["versions"] == {"from": "v1", "to": "v2", "artifacts": {}}
    assert rec["impact"] == {"terminated": 2, "timed_out": 1, "requeued": 2, "in_flight": 20}
    assert rec["batch"] == {"index": 2, "of": 3}
    assert rec["started_unix_s"] == drain.started_unix_s
    assert rec["ended_unix_s"] == drain.started_unix_s + 5.0 + 42.5


def test_without_an_overlap_the_window_is_the_update_itself(tmp_path: Path) -> None:
    got = record_update(tmp_path / "s.duckdb", {"update_id": "u", "drain": _drain_record().to_dict()})
    assert got.window() == (got.started_unix_s, got.ended_unix_s) and got.overlap_from_unix_s is None


def test_the_drain_implied_and_the_written_out_spelling_are_the_same_content(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    short = {"update_id": "u", "drain": _drain_record().to_dict()}
    long = validate_update(short)
    first, again = record_updates(db, short), record_updates(db, long)
    assert not first[0].already_stored and again[0].already_stored
    assert _rows(db) == 1


# ---- idempotency and conflicts -----------------------------------------------------------------------------


def test_storing_the_same_record_again_writes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    record_update(db, _example())
    (again,) = record_updates(db, _example())
    assert again.already_stored and _rows(db) == 1


def test_other_content_under_a_stored_id_is_a_conflict_naming_the_id_and_the_stored_record_stays(
        tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    first = record_update(db, _example())
    changed = _example()
    changed["impact"]["terminated"] = 5
    changed["drain"]["actual_drain_s"] = 100.0
    with pytest.raises(RolloutInputError, match=r"update_id '2026-11-03-chat-v1-v2-batch1': already stored with "
                       r"other content \(it differs in drain, impact\)"):
        record_update(db, changed)
    with Store.open(db, read_only=True) as store:
        assert [u.record for u in list_updates(store.con)] == [first.record]


def test_a_list_is_stored_all_or_nothing_and_the_error_names_the_index(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    good = {"update_id": "a", "drain": _drain_record().to_dict()}
    bad = {"update_id": "b", "drain": {**_drain_record().to_dict(), "actual_drain_s": -1}}
    with pytest.raises(RolloutInputError, match=r"^\[1\]\.drain\.actual_drain_s: must be a number >= 0 seconds"):
        record_updates(db, [good, bad])
    assert not db.exists()  # validation came before the store was opened
    record_update(db, {"update_id": "c", "drain": _drain_record().to_dict()})
    conflicting = {"update_id": "c", "drain": _drain_record(actual_drain_s=1.0).to_dict()}
    with pytest.raises(RolloutInputError, match=r"^\[1\]\.update_id 'c': already stored with other content"):
        record_updates(db, [good, conflicting])
    assert _rows(db) == 1  # "a" was inserted in the same transaction, then rolled back


def test_two_records_with_one_id_in_one_list_conflict_unless_they_are_equal(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    a = {"update_id": "x", "drain": _drain_record().to_dict()}
    done = record_updates(db, [a, copy.deepcopy(a)])
    assert [d.already_stored for d in done] == [False, True]
    with pytest.raises(RolloutInputError, match=r"\[1\]\.update_id 'x'"):
        record_updates(tmp_path / "t.duckdb", [a, {**a, "notes": "other"}])
    assert not (tmp_path / "t.duckdb").exists()  # the store this call created is removed again


# ---- bad input: the field named, nothing written ----------------------------------------------------------


def _set(path: str, value: Any) -> dict[str, Any]:
    rec = _example()
    *parents, last = path.split(".")
    target = rec
    for key in parents:
        target = target[key]
    if value is _DELETE:
        del target[last]
    else:
        target[last] = value
    return rec


_DELETE = object()

BAD = [
    ("update_id", _DELETE, r"^update_id: required; must be a non-blank string"),
    ("update_id", "  ", r"^update_id: must be a non-blank string"),
    ("update_id", 7, r"^update_id: must be a non-blank string .* got 7"),
    ("drain.wait_budget_s", "x", r"^drain\.wait_budget_s: must be a number >= 0 seconds, got 'x'"),
    ("drain.actual_drain_s", -3.0, r"^drain\.actual_drain_s: must be a number >= 0 seconds, got -3\.0"),
    ("drain.unregister_settle_s", True, r"^drain\.unregister_settle_s: must be a number >= 0 seconds, got True"),
    ("drain.wait_budget_s", _DELETE, r"^drain\.wait_budget_s: required; must be a number >= 0 seconds"),
    ("drain.terminated", 4, r"^drain\.terminated: 4 is not the sum of drain\.closed_by_reason \(3\)"),
    ("drain.decision", "kill", r"^drain\.decision: must be one of drained, terminate, return_to_pool"),
    ("drain.in_flight_at_start", 2.5, r"^drain\.in_flight_at_start: must be a whole number >= 0"),
    ("drain.batch", 0, r"^drain\.batch: must be a whole number >= 1"),
    ("drain.batch", 2, r"^drain\.batch: 2 differs from batch\.index \(1\)"),
    ("drain.from_version", "v0", r"^drain\.from_version: 'v0' differs from versions\.from \('chat-v1\.4\.2'\)"),
    ("drain.started_unix_s", 1_793_714_460_000.0, r"^drain\.started_unix_s: must be Unix seconds .*milliseconds\?"),
    ("impact.terminated", -1, r"^impact\.terminated: must be a whole number >= 0"),
    ("impact.requeued", _DELETE, r"^impact\.requeued: required; must be a whole number >= 0"),
    ("impact.in_flight", 5, r"^impact\.in_flight: terminated \+ timed_out \+ requeued = 8 exceeds in_flight \(5\)"),
    ("metrics.before.error_rate", 2, r"^metrics\.before\.error_rate: must be a share between 0 and 1"),
    ("metrics.after.ttft_p99_s", 0.1, r"^metrics\.after\.ttft_p99_s: 0\.1 s is below ttft_p50_s \(0\.47 s\)"),
    ("metrics.after.e2e_p99_s", "slow", r"^metrics\.after\.e2e_p99_s: must be a number >= 0 seconds"),
    ("metrics.after.throughput_rps", -2, r"^metrics\.after\.throughput_rps: must be a number >= 0 requests"),
    ("metrics.after", _DELETE, r"^metrics\.after: required"),
    ("metrics.before", {}, r"^metrics\.before: gives no figure"),
    ("rollback.triggered", "no", r"^rollback\.triggered: must be true or false, got 'no'"),
    ("rollback.triggered", True, r"^rollback\.reason: required when triggered is true"),
    ("rollback.cost_s", -5, r"^rollback\.cost_s: must be a number >= 0 seconds"),
    ("versions.artifacts.image", "abc", r"^versions\.artifacts\.image: must be a SHA-256 checksum"),
    ("versions.to", _DELETE, r"^versions\.to: required"),
    ("versions", [], r"^versions: must be a JSON object, got \[\] \(a list\); write it as an object"),
    ("batch.index", 5, r"^batch\.index: batch 5 of 4: the index cannot exceed"),
    ("overlap.to_unix_s", 1_000.0, r"^overlap\.to_unix_s: 1000\.0 is before overlap\.from_unix_s"),
    ("started_unix_s", -1, r"^started_unix_s: must be Unix seconds"),
    ("ended_unix_s", 1_793_714_399.0, r"^ended_unix_s: 1793714399\.0 is before started_unix_s"),
    ("extra", ["x"], r"^extra: must be a JSON object"),
    ("notes", 3, r"^notes: must be a string"),
    ("notes", "ok \ud800", r"^notes: holds the lone surrogate \\ud800 at character 4"),
    ("extra", {"k": ["\udc00"]}, r"^extra\.k\[0\]: holds the lone surrogate \\udc00"),
    ("derived", {"budget_used": 0.5}, r"^derived: does not match the record"),
    ("drain.closed_by_reason.drain_timeout", 1, r"^drain\.terminated: 3 is not the sum of drain\.closed_by_reason "
     r"\(4\)"),
]


@pytest.mark.parametrize(("path", "value", "message"), BAD, ids=[f"{p}={v!r}"[:60] for p, v, _ in BAD])
def test_a_bad_field_is_named_with_the_fix_and_nothing_is_written(tmp_path: Path, path: str, value: Any,
                                                                  message: str) -> None:
    db = tmp_path / "s.duckdb"
    with pytest.raises(RolloutInputError, match=message):
        record_update(db, _set(path, value))
    assert not db.exists()
    with Store.open(db) as store:  # an existing store: still nothing written, not even the table
        record_update(store, {"update_id": "other", "drain": _drain_record().to_dict()})
    with pytest.raises(RolloutInputError, match=message):
        record_update(db, _set(path, value))
    assert _rows(db) == 1


def test_a_record_that_is_no_object_is_refused() -> None:
    with pytest.raises(RolloutInputError, match=r"^record: must be a JSON object, got a list"):
        validate_update([1])
    with pytest.raises(RolloutInputError, match=r"^no update records: the list is empty"):
        record_updates(":memory:", [])


def test_a_record_without_versions_says_where_they_can_come_from_and_its_times_may_be_unknown(
        tmp_path: Path) -> None:
    with pytest.raises(RolloutInputError, match=r"^versions: required.*or from_version and to_version, or a drain "):
        validate_update({"update_id": "u", "started_unix_s": 1.0, "ended_unix_s": 2.0})
    got = record_update(tmp_path / "s.duckdb", {"update_id": "u", "versions": {"from": "a", "to": "b"}})
    assert (got.started_unix_s, got.ended_unix_s, got.window()) == (None, None, None)
    rec = {"update_id": "u", "drain": _drain_record(from_version="", to_version="").to_dict()}
    with pytest.raises(RolloutInputError, match=r"^versions: required"):  # a controller not told the versions
        validate_update(rec)


def test_a_key_llmslo_does_not_know_is_kept_where_it_was_given_with_a_near_miss_named(tmp_path: Path) -> None:
    given = _set("startd_unix_s", 1.0)
    given["impact"]["terminated_share"] = 0.1
    given["drain"]["closed_by_reason"]["drain_timeout"] = 0
    given["metrics"]["before"]["ttft_p95_s"] = {"by": "tenant"}
    got = record_update(tmp_path / "s.duckdb", given)
    assert got.unknown_fields() == [  # in the record's order, with the key of the same object it resembles
        ("impact.terminated_share", 0.1, "terminated"), ("metrics.before.ttft_p95_s", {"by": "tenant"}, "ttft_p99_s"),
        ("drain.closed_by_reason.drain_timeout", 0, None), ("startd_unix_s", 1.0, "started_unix_s")]
    assert {k: v for k, v in got.to_dict().items() if k != "derived"} == given and got.shape == "llmslo"


def test_a_table_made_when_times_were_required_takes_a_record_without_them(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    Store.open(db).close()
    with duckdb.connect(str(db)) as con:
        con.execute(_records.updates_ddl().replace("started_unix_s DOUBLE", "started_unix_s DOUBLE NOT NULL")
                    .replace("ended_unix_s DOUBLE", "ended_unix_s DOUBLE NOT NULL"))
    record_update(db, _example())
    got = record_update(db, {"update_id": "u", "versions": {"from": "a", "to": "b"}})
    assert got.started_unix_s is None and _rows(db) == 2


def test_a_sha256_prefix_and_upper_case_digits_are_one_checksum() -> None:
    digest = "AB" * 32
    rec = validate_update(_set("versions.artifacts.image", f"sha256:{digest}"))
    assert rec["versions"]["artifacts"]["image"] == digest.lower()


# ---- reading JSON ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "message"), [
    (b'{"update_id": "u",\n "drain": {,}}', r"^f\.json: not valid JSON at line 2 column 12: "),
    (b'{"update_id": "u", "impact": {"terminated": 1, "terminated": 2}}',
     r"^f\.json: impact: duplicate key 'terminated' in one object"),
    (b'[{"update_id": "a"}, {"update_id": "b", "update_id": "c"}]', r"^f\.json: \[1\]: duplicate key 'update_id'"),
    (b'{"update_id": "u", "started_unix_s": NaN}', r"^f\.json: NaN is not a JSON number"),
    (b"  \n", r"^f\.json: empty"),
    (b'{"update_id": "\xff"}', r"^f\.json: not UTF-8 text"),
    (b"[]", r"^f\.json: expected a JSON object .* got an empty list"),
    (b'[{"update_id": "a"}, 3]', r"^f\.json: \[1\]: must be a JSON object"),
    (b'"u"', r"^f\.json: expected a JSON object .* got a string"),
])
def test_bad_json_is_refused_naming_the_source_and_where(text: bytes, message: str) -> None:
    with pytest.raises(RolloutInputError, match=message):
        parse_update_json(text, source="f.json")


def test_one_object_or_a_list_of_objects_is_read() -> None:
    assert parse_update_json('{"a": 1}', source="x") == {"a": 1}
    assert parse_update_json(b'\xef\xbb\xbf[{"a": 1}, {"b": 2}]', source="x") == [{"a": 1}, {"b": 2}]


# ---- reading a store ---------------------------------------------------------------------------------------


def test_a_store_without_update_records_lists_none_read_only(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    Store.open(db).close()
    with Store.open(db, read_only=True) as store:
        assert list_updates(store.con) == [] and get_update(store.con, "u") is None


def test_updates_are_listed_by_start_time(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    later, earlier = _drain_record(started_unix_s=1_793_800_000.0), _drain_record()
    record_updates(db, [{"update_id": "a-later", "drain": later.to_dict()},
                        {"update_id": "z-earlier", "drain": earlier.to_dict()}])
    with Store.open(db, read_only=True) as store:
        assert [u.update_id for u in list_updates(store.con)] == ["z-earlier", "a-later"]
        assert all(isinstance(u, UpdateRecord) for u in list_updates(store.con))


# ---- the command line --------------------------------------------------------------------------------------


def _cli(*args: str, stdin: str | None = None) -> tuple[int, str]:
    result = runner.invoke(app, list(args), input=stdin)
    return result.exit_code, result.output


def test_record_list_and_show_through_the_command_line(tmp_path: Path) -> None:
    db = str(tmp_path / "s.duckdb")
    code, out = _cli("rollout", "record", str(EXAMPLE), "--db", db)
    assert code == 0 and "2026-11-03-chat-v1-v2-batch1 (chat-v1.4.2 → chat-v1.5.0): recorded" in out, out
    code, out = _cli("rollout", "record", str(EXAMPLE), "--db", db, "--json")
    assert code == 0 and json.loads(out)["records"] == [
        {"update_id": "2026-11-03-chat-v1-v2-batch1", "status": "already_stored", "shape": "llmslo", "notes": []}]
    code, out = _cli("rollout", "list", "--db", db)
    row = next(line for line in out.splitlines() if "2026-11-03-chat-v1-v2-batch1" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells == ["2026-11-03-chat-v1-v2-batch1", "chat-v1.4.2 → chat-v1.5.0", "2026-11-03 14:00:00", "1 of 4",
                     "96.5 / 120", "3", "no"], out
    code, out = _cli("rollout", "show", "2026-11-03-chat-v1-v2-batch1", "--db", db)
    assert code == 0, out
    for text in ("3 (5.3% of 57 in flight)", "idle 1, max_inflight 0, budget_exhausted 2", "96.5 s", "1 of 4",
                 "2026-11-03 14:00:30", "OPS-1234", "sha256 "):
        assert text in out, (text, out)
    code, out = _cli("rollout", "list", "--db", db, "--json")
    assert code == 0 and [u["update_id"] for u in json.loads(out)["updates"]] == ["2026-11-03-chat-v1-v2-batch1"]


def test_show_json_is_taken_back_by_record_as_the_same_content(tmp_path: Path) -> None:
    db = str(tmp_path / "s.duckdb")
    assert _cli("rollout", "record", str(EXAMPLE), "--db", db)[0] == 0
    code, shown_json = _cli("rollout", "show", "2026-11-03-chat-v1-v2-batch1", "--db", db, "--json")
    assert code == 0 and json.loads(shown_json)["derived"]["requeued_share"] == pytest.approx(4 / 57)
    code, out = _cli("rollout", "record", "-", "--db", db, "--json", stdin=shown_json)
    assert code == 0 and json.loads(out)["records"][0]["status"] == "already_stored", out


def test_record_reads_a_list_from_standard_input(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    batch = [{"update_id": f"b{i}", "drain": _drain_record(batch=i, batches=3).to_dict()} for i in (1, 2, 3)]
    code, out = _cli("rollout", "record", "-", "--db", str(db), stdin=json.dumps(batch))
    assert code == 0 and "3 update record(s) written" in out, out
    assert _rows(db) == 3


@pytest.mark.parametrize(("text", "message"), [
    ('{"update_id": "u", "drain": {"wait_budget_s": "x"', "not valid JSON at line 1 column"),
    ('{"update_id": "u", "update_id": "v"}', "duplicate key 'update_id'"),
    ('{"drain": {}}', "update_id: required"),
    ('{"update_id": "a\\ud800"}', "update_id: holds the lone surrogate \\ud800 at character 2"),
    ('[{"update_id": "u", "versions": {"from": "a", "to": "b"}, "started_unix_s": -5}]',
     "[0].started_unix_s: must be Unix seconds"),
])
def test_a_bad_file_exits_1_naming_the_file_and_field_and_leaves_nothing(tmp_path: Path, text: str,
                                                                         message: str) -> None:
    src = tmp_path / "in" / "u.json"
    src.parent.mkdir()
    src.write_text(text)
    code, out = _cli("rollout", "record", str(src), "--db", str(tmp_path / "s.duckdb"))
    flat = " ".join(out.split())
    assert code == 1 and flat.startswith(f"error: {src}: ") and message in flat, out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


@pytest.mark.parametrize("argv", [
    ["rollout", "record", "{tmp}/none.json", "--db", "{tmp}/s.duckdb"],
    ["rollout", "list", "--db", "{tmp}/none.duckdb"],
    ["rollout", "show", "u", "--db", "{tmp}/none.duckdb"],
], ids=lambda a: " ".join(a[:2]))
def test_a_missing_input_exits_1_naming_it_and_leaves_nothing(tmp_path: Path, argv: list[str]) -> None:
    code, out = _cli(*(a.format(tmp=tmp_path) for a in argv))
    assert code == 1 and "none." in out and out.startswith("error: "), out
    assert list(tmp_path.iterdir()) == []


def test_show_of_an_unknown_id_exits_1_and_says_how_to_list(tmp_path: Path) -> None:
    db = str(tmp_path / "s.duckdb")
    Store.open(db).close()
    code, out = _cli("rollout", "show", "nope", "--db", db)
    assert code == 1 and "no update 'nope'" in out and "rollout list" in out, out
    code, out = _cli("rollout", "list", "--db", db)
    assert code == 0 and "no update records" in out


def test_a_wrong_command_line_exits_2(tmp_path: Path) -> None:
    assert _cli("rollout", "record", "--db", str(tmp_path / "s.duckdb"))[0] == 2  # no FILE
    assert _cli("rollout", "show", "--db", str(tmp_path / "s.duckdb"))[0] == 2  # no ID
    assert list(tmp_path.iterdir()) == []


HOSTILE_ID = "[bold]u\x1b[2J:smile:"
HOSTILE_VERSION = "[link=http://x]v2[/link]\u202e"


def test_hostile_strings_are_shown_literally(tmp_path: Path) -> None:
    db = str(tmp_path / "s.duckdb")
    drain = _drain_record(from_version="v1", to_version=HOSTILE_VERSION).to_dict()
    rec = {"update_id": HOSTILE_ID, "drain": drain, "notes": "[red]note[/red]",
           "rollback": {"triggered": True, "reason": "[i]bad\x07[/i]"},
           "extra": {"[b]k": "\x1b]8;;http://x\x1b\\"}}
    code, out = _cli("rollout", "record", "-", "--db", db, stdin=json.dumps(rec))
    assert code == 0, out
    for argv in (["list", "--db", db], ["show", HOSTILE_ID, "--db", db]):
        code, out = _cli("rollout", *argv)
        assert code == 0, out
        assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out
        flat = out.replace("\n", "")
        assert "[bold]u\\x1b[2J:smile:" in "".join(flat.split()), out
        assert "[link=http://x]v2[/link]\\u202e" in "".join(flat.split()), out
    assert "[red]note[/red]" in out and "[i]bad\\x07[/i]" in out and "[b]k" in out


def test_the_documented_example_is_the_fixture_and_is_valid() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "rollouts.md").read_text()
    blocks = [b.split("```")[0] for b in doc.split("```json\n")[1:]]
    example, runbook = [json.loads(b) for b in blocks]
    assert example == _example()
    assert validate_update(example)["update_id"] == example["update_id"]
    runbook_file = EXAMPLE.with_name("update_runbook.json")
    assert doc.split("```json\n")[2].split("```")[0] == runbook_file.read_text()  # the text, as the issue quoted it
    assert validate_update(runbook)["given"] == runbook
