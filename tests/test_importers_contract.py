"""What every import promises: ids from the file's content, the provenance table (old stores too), safe input,
and a short command-line report."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from llmslo.analysis import Store
from llmslo.analysis.importers import ImportFormatError, convert_file, import_files, recorded_imports
from llmslo.analysis.store import IMPORTS_TABLE, imports_ddl
from llmslo.cli._import import group_facts, template
from llmslo.tests.test_analysis_import_bench import _run_import

REAL = Path(__file__).resolve().parent / "fixtures" / "importers_real"
HAND = Path(__file__).resolve().parent / "fixtures" / "import"
LLMPERF = Path(__file__).resolve().parents[2] / "shared" / "real_data" / "llmperf_leaderboard" / "individual"
OLD_COLUMNS = ("content_sha256", "source", "kind", "tool", "rows_read", "rows_imported", "rows_inserted",
               "rows_already_stored", "arrivals_available", "arrival_note", "conversions", "missing_fields",
               "finish_reasons", "imported_unix_s")
ADDED = (("id_prefix", "VARCHAR"), ("run_duration_s", "DOUBLE"), ("run_duration_note", "VARCHAR"))
OLD_DDL = (  # the provenance table as stores made before the run-duration columns have it
    f"CREATE TABLE {IMPORTS_TABLE} (content_sha256 VARCHAR PRIMARY KEY, source VARCHAR NOT NULL, "
    "kind VARCHAR NOT NULL, tool VARCHAR NOT NULL, rows_read BIGINT NOT NULL, rows_imported BIGINT NOT NULL, "
    "rows_inserted BIGINT NOT NULL, rows_already_stored BIGINT NOT NULL, arrivals_available BOOLEAN NOT NULL, "
    "arrival_note VARCHAR NOT NULL, conversions VARCHAR[] NOT NULL, missing_fields VARCHAR[] NOT NULL, "
    "finish_reasons MAP(VARCHAR, BIGINT) NOT NULL, imported_unix_s DOUBLE NOT NULL)"
)




def _columns(store: Store) -> list[tuple[str, str]]:
    return [(r[0], r[1]) for r in store.con.sql(
        "SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = ? ORDER BY column_index",
        params=[IMPORTS_TABLE]).fetchall()]


def _llmperf_files() -> list[Path]:
    files = sorted(LLMPERF.glob("*.json"))
    if len(files) != 19:
        pytest.skip(f"the 19 LLMPerf leaderboard files are not in {LLMPERF}")
    return files


# ---- request ids from the file's content -----------------------------------------------------------------


def test_two_runs_whose_files_share_a_name_both_land(tmp_path: Path) -> None:
    doc = json.loads((REAL / "genai_perf_profile_export.json").read_text())
    first, second = tmp_path / "run1" / "profile_export.json", tmp_path / "run2" / "profile_export.json"
    for path, shift in ((first, 0), (second, 7_000_000_000)):  # the second run, 7 s later
        for exp in doc["experiments"]:
            for req in exp["requests"]:
                req["timestamp"] += shift
                req["response_timestamps"] = [t + shift for t in req["response_timestamps"]]
        path.parent.mkdir()
        path.write_text(json.dumps(doc))
    db = tmp_path / "s.duckdb"
    a = import_files([first], "genai-perf", db).files[0]
    b = import_files([second], "genai-perf", db).files[0]
    assert a.ingest is not None and b.ingest is not None
    assert a.ingest.rows_inserted == b.ingest.rows_inserted == 16 and b.ingest.rows_already_stored == 0
    for f, path in ((a, first), (b, second)):
        assert f.report.id_prefix == hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    with Store.open(db, read_only=True) as store:
        prefixes = store.con.sql("SELECT DISTINCT split_part(request_id, '#', 1) FROM request_summaries").fetchall()
        joined = store.con.sql(
            f"SELECT i.source, count(*) FROM request_summaries r JOIN {IMPORTS_TABLE} i "
            "ON split_part(r.request_id, '#', 1) = i.id_prefix GROUP BY i.source ORDER BY i.source").fetchall()
    assert {p[0] for p in prefixes} == {a.report.id_prefix, b.report.id_prefix}
    assert joined == [(str(first), 16), (str(second), 16)]


def test_the_same_file_under_another_name_is_recognised_as_stored(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    copy = tmp_path / "renamed.json"
    shutil.copy(HAND / "guidellm_benchmarks_old.json", copy)
    import_files([HAND / "guidellm_benchmarks_old.json"], "guidellm", db)
    again = import_files([copy], "auto", db).files[0]
    assert again.ingest is not None
    assert again.ingest.rows_inserted == 0 and again.ingest.rows_already_stored == again.report.rows_imported == 4
    with Store.open(db, read_only=True) as store:
        assert [r["source"] for r in recorded_imports(store)] == [str(copy)]  # one file, one provenance record


# ---- the provenance table ---------------------------------------------------------------------------------


def test_provenance_records_id_prefix_and_run_duration(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    vllm = REAL / "vllm_bench_serve_detailed.json"
    import_files([vllm, REAL / "aiperf_2025-10_profile_export.jsonl"], "auto", db)
    with Store.open(db, read_only=True) as store:
        assert _columns(store)[len(OLD_COLUMNS):] == list(ADDED)
        rows = {Path(r["source"]).name: r for r in recorded_imports(store)}
    v = rows[vllm.name]
    assert v["run_duration_s"] == json.loads(vllm.read_text())["duration"]
    assert v["id_prefix"] == hashlib.sha256(vllm.read_bytes()).hexdigest()[:16]
    assert "duration" in v["run_duration_note"]
    a = rows["aiperf_2025-10_profile_export.jsonl"]
    assert a["run_duration_s"] is None and "none recorded" in a["run_duration_note"]


def test_a_store_from_before_gets_the_new_columns(tmp_path: Path) -> None:
    db = tmp_path / "old.duckdb"
    with Store.open(db) as store:
        store.con.execute(OLD_DDL)
        store.con.execute(f"INSERT INTO {IMPORTS_TABLE} VALUES ('abc', '/old/run.json', 'llmperf', 'LLMPerf', 1, 1, "
                          "1, 0, false, 'none', ['x'], ['y'], MAP {'stop': 1}, 1.0)")
        assert [c for c, _ in _columns(store)] == list(OLD_COLUMNS)
    import_files([REAL / "vllm_bench_serve_detailed.json"], "vllm-bench", db)
    with Store.open(db, read_only=True) as store:
        columns = _columns(store)
        rows = {r["source"]: r for r in recorded_imports(store)}
    fresh = tmp_path / "fresh.duckdb"
    with Store.open(fresh) as store:
        store.con.execute(imports_ddl())
        assert _columns(store) == columns  # a migrated table and a new one are the same
    assert [c for c, _ in columns] == [*OLD_COLUMNS, *(c for c, _ in ADDED)]
    old = rows["/old/run.json"]
    assert old["id_prefix"] is None and old["run_duration_s"] is None and old["run_duration_note"] is None
    new = rows[str(REAL / "vllm_bench_serve_detailed.json")]
    assert new["run_duration_s"] is not None and new["id_prefix"]


# ---- safe input -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "text"), [
    ("guidellm", '{"benchmarks": [], "benchmarks": [1]}'),
    ("vllm-bench", '{"ttfts": [0.1], "date": "20250101-000000", "ttfts": [0.2]}'),
    ("llmperf", '[{"ttft_s": 0.1, "error_code": null, "ttft_s": 0.2}]'),
    ("genai-perf", '{"experiments": [{"requests": [], "requests": []}]}'),
])
def test_a_key_named_twice_is_refused(tmp_path: Path, kind: str, text: str) -> None:
    path = tmp_path / "dup.json"
    path.write_text(text)
    db = tmp_path / "s.duckdb"
    with pytest.raises(ImportFormatError) as info:
        import_files([path], kind, db)
    assert "names the key" in str(info.value) and "twice" in str(info.value) and str(path) in str(info.value)
    assert info.value.errors[0].rule == "duplicate_key"
    assert not db.exists()


def test_a_key_named_twice_in_a_jsonl_record_names_its_line(tmp_path: Path) -> None:
    lines = (REAL / "aiperf_2025-10_profile_export.jsonl").read_text().splitlines()[:4]
    lines[2] = lines[2].replace('"credit_phase":"profiling"', '"credit_phase":"warmup","credit_phase":"profiling"')
    path = tmp_path / "dup.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ImportFormatError) as info:
        convert_file(path, "genai-perf")
    assert [(e.row, e.column, e.rule) for e in info.value.errors] == [(3, "credit_phase", "duplicate_key")]
    assert f"{path}: record 3, field credit_phase" in str(info.value)


def test_bad_utf8_names_the_line(tmp_path: Path) -> None:
    lines = (REAL / "aiperf_2025-10_profile_export.jsonl").read_bytes().split(b"\n")[:5]
    lines[3] = lines[3].replace(b"profiling", b"profil\xe9ng")
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    db = tmp_path / "s.duckdb"
    with pytest.raises(ImportFormatError) as info:
        import_files([path], "genai-perf", db)
    assert [(e.row, e.rule) for e in info.value.errors] == [(4, "encoding")]
    assert f"{path}: record 4" in str(info.value) and "line 4" in str(info.value) and "UTF-8" in str(info.value)
    whole = tmp_path / "latin1.json"
    whole.write_bytes(b'{"benchmarks": [\n  {"name": "caf\xe9"}]}')
    with pytest.raises(ImportFormatError, match=r"line 2 \(byte offset \d+\) is not valid UTF-8"):
        convert_file(whole, "guidellm")
    assert not db.exists()


@pytest.mark.parametrize("kind", ["vllm-bench", "llmperf", "genai-perf", "guidellm"])
@pytest.mark.parametrize("text", ["", "\n  \n"])
def test_an_empty_file_is_refused_clearly(tmp_path: Path, kind: str, text: str) -> None:
    path = tmp_path / ("empty.jsonl" if kind == "genai-perf" else "empty.json")
    path.write_text(text)
    db = tmp_path / "s.duckdb"
    with pytest.raises(ImportFormatError) as info:
        import_files([path], kind, db)
    assert "the file is empty" in str(info.value) and info.value.errors[0].rule == "empty"
    assert not db.exists()


# ---- the command's report --------------------------------------------------------------------------------------


def test_sentences_that_differ_only_in_counts_share_a_template() -> None:
    assert template("error_code 429 (130 requests) → rejected.") == ("error_code 429 ({} requests) → rejected.", [130])
    assert template("For 3 request(s) it fits; 2 of 5 successful request(s).")[1] == [3, 2, 5]
    rows = [{"source": f"/r/{n}.json", "conversions": [f"{n} request(s) → stop.", f"model = '{n}'."],
             "missing_fields": ["x"], "arrival_note": "none", "run_duration_s": None, "run_duration_note": "none",
             "rows_read": 1, "rows_imported": 1} for n in (3, 4)]
    facts = group_facts(rows)
    assert ("conversions", "7 request(s) → stop.", ["/r/3.json", "/r/4.json"]) in facts
    assert ("conversions", "model = '3', '4'.", ["/r/3.json", "/r/4.json"]) in facts  # one quoted value apart


def test_importing_the_19_llmperf_files_says_each_sentence_once(tmp_path: Path) -> None:
    files = _llmperf_files()
    db = tmp_path / "s.duckdb"
    result = _run_import("llmperf", *map(str, files), "--db", str(db))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) < 80, len(lines)  # one table row a file, each distinct sentence once
    sentences = [line for line in lines if line.startswith("   - ")]
    assert len(sentences) == len(set(sentences))
    stop = next(line for line in lines if "finish_reason stop" in line)
    expected = sum(sum(1 for r in json.loads(f.read_text()) if r["error_code"] is None) for f in files)
    assert f"   - {expected:,} successful request(s)" in stop and "(all 19 files)" in stop
    (model,) = [line for line in lines if "model = " in line]  # each file's own name, said in one sentence
    assert "model = 'anyscale_13b', 'anyscale_70b', 'anyscale_7b' and 16 more (from the file name" in model, model
    full = _run_import("llmperf", *map(str, files), "--db", str(tmp_path / "j.duckdb"), "--json")
    out = json.loads(full.stdout)["files"]
    assert len(out) == 19
    for f, row in zip(files, out, strict=True):  # --json keeps every file's own sentences and counts
        ok = sum(1 for r in json.loads(f.read_text()) if r["error_code"] is None)
        assert any(re.match(rf"{ok} successful request\(s\)", c) for c in row["conversions"]), f.name
        assert row["run_duration_s"] is None and row["id_prefix"]


def test_the_keep_warmup_cooldown_flag_reaches_the_importer(tmp_path: Path) -> None:
    guidellm = REAL / "guidellm_0.5.4_benchmarks.json"
    db = tmp_path / "s.duckdb"
    plain = _run_import("guidellm", str(guidellm), "--db", str(db), "--json")
    kept = _run_import("guidellm", str(guidellm), "--db", str(tmp_path / "k.duckdb"), "--keep-warmup-cooldown",
                       "--json")
    assert plain.exit_code == kept.exit_code == 0, plain.output + kept.output
    p, k = json.loads(plain.stdout)["files"][0], json.loads(kept.stdout)["files"][0]
    assert p["rows_imported"] < k["rows_imported"] == k["rows_read"] == p["rows_read"]
    with Store.open(tmp_path / "k.duckdb", read_only=True) as store:
        tenants = {r[0] for r in store.con.sql("SELECT DISTINCT tenant_class FROM request_summaries").fetchall()}
    assert {"warmup", "cooldown"} <= tenants
    text = _run_import("guidellm", str(guidellm), "--db", str(tmp_path / "t.duckdb"))
    flat = " ".join(text.stdout.split())
    assert "request(s) outside guidellm's measured window not imported" in flat
    assert "record(s) read but not imported" in flat
