"""The README's commands walked as a newcomer runs them: the installed ``llmslo`` in a plain working folder,
relative paths, the demo's store and the real files of ``../shared/real_data`` (linked, never copied; a test
that needs them skips with the reason when they are missing).

Rules protected, one section each:

1. ``gpu correlate`` never correlates rows that cannot be placed in time: rows from imports without arrival
   times are left out (and counted), GPU/engine samples and requests are correlated only where they overlap
   (the overlap is said), no overlap is refused with the reason; ``gpu import`` of a file with relative times
   asks for ``--start`` instead of silently placing it in 1970.
3. Files other programs read (dashboards, the drain record, ``*.rejected.jsonl``) are written with the
   user's umask, as ``rules.yml`` and the Parquet files are.
4. Rows without arrival times sit in no window: a windowed report counts them apart, named as such.
5. ``--from/--to`` that hold no row is an error that says so and names the span the data covers.
6. ``ParquetSummaryWriter.write_table`` takes the store's own rows (nullability aside, values checked);
   a refusal names the field and the difference.
8. ``import auto`` on llmslo's own format points to ``llmslo ingest``; a scrape's quantile that only a
   bucket bounds is shown as that bound; a ClickHouse HTTP failure prints only the clear error.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmslo.tests._rows import ok_row

REAL = Path(__file__).resolve().parents[2] / "shared" / "real_data"
BSC = "rd/vllm_memory_gap_bsc/llama-2-13b_maxseqs128"
GPU_FILES = (("nvidia-smi", f"{BSC}/metrics_gpu_device_nvidia_smi_0_server_0.csv"),
             ("dmon", f"{BSC}/metrics_gpu_device_nvidia_smi_dom_0_server_0.csv"),
             ("vllm-engine", f"{BSC}/metrics_engine_server_0.csv"))
REQUEST_TARGETS = {"ttft_s", "tpot_s", "queue_s", "in_flight", "generated_tokens_per_s", "arrivals_per_s"}


def _llmslo() -> Path:
    exe = Path(sys.executable).parent / "llmslo"
    if not exe.is_file():
        pytest.skip(f"the installed llmslo command is not at {exe}")
    return exe


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A plain working folder; ``rd`` links to ``../shared/real_data`` when it exists (never a copy)."""
    if REAL.is_dir():
        (tmp_path / "rd").symlink_to(REAL, target_is_directory=True)
    return tmp_path


def _real(workdir: Path, relative: str) -> str:
    if not (workdir / relative).exists():
        pytest.skip(f"real data not available: {REAL} (../shared/real_data is missing)")
    return relative


def run(workdir: Path, *args: str, umask: int = 0o022) -> subprocess.CompletedProcess[str]:
    """``llmslo ARGS`` in ``workdir`` under ``umask``, as a person types it."""
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([str(_llmslo()), *args], cwd=workdir, capture_output=True, text=True, env=env,
                          timeout=300, check=False, preexec_fn=lambda: os.umask(umask))


def ok(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    res = run(workdir, *args)
    assert res.returncode == 0, f"llmslo {' '.join(args)}: exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    return res


def flat(text: str) -> str:
    """``text`` with its line wrapping undone (rich wraps long messages)."""
    return " ".join(text.split())


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def varied_rows(n: int, start_unix_s: float, every_s: float = 0.5) -> list[dict[str, Any]]:
    """``n`` successful requests ``every_s`` apart from ``start_unix_s``, with TTFTs that vary."""
    out = []
    for i in range(n):
        ttft = 0.2 + (i * 37 % 11) * 0.1
        out.append(ok_row(i, arrival_unix_s=start_unix_s + i * every_s, ttft_s=ttft, last_token_s=ttft + 1.0,
                          e2e_s=ttft + 1.1))
    return out


# ---- 1. gpu correlate: only what can be placed in time, and only where it overlaps ----------------------


def _import_gpu(workdir: Path, db: str, *start: str) -> None:
    for kind, file in GPU_FILES:
        ok(workdir, "gpu", "import", kind, _real(workdir, file), "--db", db, *start)


def test_gpu_import_of_relative_times_asks_for_start_and_writes_nothing(workdir: Path) -> None:
    for kind, file in GPU_FILES:
        res = run(workdir, "gpu", "import", kind, _real(workdir, file), "--db", "g.duckdb")
        assert res.returncode == 1, res.stdout
        said = flat(res.stderr)
        assert "relative" in said and "--start" in said and file in said, said
    assert not (workdir / "g.duckdb").exists()  # nothing written, no store left behind


def test_llmperf_rows_without_arrival_times_are_not_correlated_with_gpu_samples(workdir: Path) -> None:
    files = sorted(p.name for p in (workdir / "rd/llmperf_leaderboard/individual").glob("*.json")) if (
        workdir / "rd").exists() else []
    if not files:
        pytest.skip(f"real data not available: {REAL} (../shared/real_data is missing)")
    ok(workdir, "import", "llmperf", *(f"rd/llmperf_leaderboard/individual/{f}" for f in files), "--db", "s.duckdb")
    _import_gpu(workdir, "s.duckdb", "--start", "0")
    _import_gpu(workdir, "gpu-only.duckdb", "--start", "0")
    both = json.loads(ok(workdir, "gpu", "correlate", "--db", "s.duckdb", "--json").stdout)
    alone = json.loads(ok(workdir, "gpu", "correlate", "--db", "gpu-only.duckdb", "--json").stdout)
    assert not {c["target"] for c in both["correlations"]} & REQUEST_TARGETS
    assert both["correlations"] == alone["correlations"]  # unrelated summaries change nothing
    assert both["overlap"]["requests_without_arrival"] == 2845
    text = flat(ok(workdir, "gpu", "correlate", "--db", "s.duckdb").stdout)
    assert "in_flight" not in text
    assert "2,845 request summaries" in text and "no arrival times" in text


def test_requests_and_samples_that_do_not_overlap_are_refused_with_both_spans(workdir: Path) -> None:
    base = 1_739_898_929.0  # 2025-02-18 17:15:29 UTC
    write_rows(workdir / "rows.jsonl", varied_rows(400, base))
    ok(workdir, "ingest", "rows.jsonl", "--db", "s.duckdb")
    _import_gpu(workdir, "s.duckdb", "--start", "0")  # placed in 1970: no overlap with the requests
    for extra in ((), ("--json",)):
        res = run(workdir, "gpu", "correlate", "--db", "s.duckdb", *extra)
        assert res.returncode == 1 and res.stdout == "", res.stdout
        said = flat(res.stderr)
        assert "do not overlap" in said and "1970-01-01" in said and "2025-02-18" in said and "--start" in said


def test_requests_and_samples_are_correlated_over_their_overlap_which_is_said(workdir: Path) -> None:
    base = 1_739_898_929.0
    write_rows(workdir / "rows.jsonl", varied_rows(400, base + 100))
    ok(workdir, "ingest", "rows.jsonl", "--db", "s.duckdb")
    _import_gpu(workdir, "s.duckdb", "--start", "2025-02-18T17:15:29Z")
    out = json.loads(ok(workdir, "gpu", "correlate", "--db", "s.duckdb", "--json").stdout)
    ov = out["overlap"]
    assert ov["samples_from_unix_s"] == pytest.approx(base + 0.123, abs=0.01)
    assert ov["requests_from_unix_s"] == base + 100
    assert ov["overlap_s"] == pytest.approx(ov["requests_to_unix_s"] - ov["requests_from_unix_s"])
    assert out["buckets"] <= 202  # the grid covers the overlap only (about 201 s), not the samples' 330 s
    assert {c["target"] for c in out["correlations"]} <= REQUEST_TARGETS
    text = flat(ok(workdir, "gpu", "correlate", "--db", "s.duckdb").stdout)
    assert "overlap" in text and "2025-02-18 17:17:09" in text


# ---- 3. files other programs read are written with the user's umask -------------------------------------

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_dashboards_and_rejected_rows_follow_the_umask_as_rules_do(workdir: Path, umask: int) -> None:
    (workdir / "chat-slo.yaml").write_text((EXAMPLES / "chat-slo.yaml").read_text())
    res = run(workdir, "dashboards", "generate", "--spec", "chat-slo.yaml", "-o", "dashboards/", umask=umask)
    assert res.returncode == 0, res.stderr
    res = run(workdir, "rules", "generate", "chat-slo.yaml", "-o", "rules.yml", umask=umask)
    assert res.returncode == 0, res.stderr
    write_rows(workdir / "messy.jsonl", [ok_row(0), ok_row(1, ttft_s=-1.0)])
    res = run(workdir, "ingest", "messy.jsonl", "--db", "s.duckdb", "--skip-invalid", umask=umask)
    assert res.returncode == 0, res.stderr
    expected = 0o666 & ~umask
    written = [*sorted((workdir / "dashboards").iterdir()), workdir / "messy.jsonl.rejected.jsonl",
               workdir / "rules.yml"]
    assert len(written) >= 4
    assert {p.name: oct(_mode(p)) for p in written} == {p.name: oct(expected) for p in written}


@pytest.mark.slow
def test_the_drain_record_follows_the_umask(workdir: Path) -> None:
    pytest.importorskip("uvicorn", reason="the serve extra installs uvicorn: pip install 'llmslo[serve]'")
    env = {**os.environ, "NO_COLOR": "1"}
    proc = subprocess.Popen([str(_llmslo()), "serve", "--port", "0", "--drain-settle", "50ms", "--exit-linger",
                             "50ms", "--drain-record", "drain.json", "--next-version", "v2"], cwd=workdir,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            preexec_fn=lambda: os.umask(0o022))
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("serving "):
                break
        proc.send_signal(15)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert oct(_mode(workdir / "drain.json")) == oct(0o644)


# ---- 4. rows without arrival times sit in no window ------------------------------------------------------


def _llmperf(workdir: Path, db: str, *names: str) -> None:
    folder = workdir / "rd/llmperf_leaderboard/individual"
    files = sorted(p.name for p in folder.glob("*.json")) if folder.is_dir() else []
    if not files:
        pytest.skip(f"real data not available: {REAL} (../shared/real_data is missing)")
    chosen = [f for f in files if not names or f in names]
    ok(workdir, "import", "llmperf", *(f"rd/llmperf_leaderboard/individual/{f}" for f in chosen), "--db", db)


def test_a_windowed_report_counts_rows_without_arrival_times_apart_in_no_window(workdir: Path) -> None:
    _llmperf(workdir, "s.duckdb")
    base = 1_700_000_000.0
    write_rows(workdir / "rows.jsonl", varied_rows(1200, base))  # 10 minutes of requests with arrival times
    ok(workdir, "ingest", "rows.jsonl", "--db", "s.duckdb")
    doc = json.loads(ok(workdir, "report", "--db", "s.duckdb", "--window", "5m", "--json").stdout)
    windows = [g["keys"]["window_start_unix_s"] for g in doc["groups"]]
    assert 0.0 not in windows  # no 1970 window
    assert windows == [base - base % 300 + 300 * k for k in range(len(windows) - 1)] + [None]
    apart = doc["groups"][-1]
    assert apart["attempted"] == 2845 and apart["rate_basis"]["kind"] == "none"
    assert "no window" in apart["rate_basis"]["note"] and "arrival times" in apart["rate_basis"]["note"]
    assert sum(g["attempted"] for g in doc["groups"][:-1]) == 1200
    text = ok(workdir, "report", "--db", "s.duckdb", "--window", "5m").stdout
    assert "1970-01-01" not in text
    rows = [line for line in text.splitlines() if "no arrival time" in line]
    assert rows and "2,845" in rows[0]
    # the import, the rate note and the caveat say the same: no window
    said = flat(text)
    assert "sit in no window" in said and "windows and in-flight counts are not meaningful" not in said


def test_a_windowed_report_by_model_puts_each_models_unplaced_rows_apart(workdir: Path) -> None:
    _llmperf(workdir, "s.duckdb", "anyscale_13b.json", "lepton_7b.json")
    doc = json.loads(ok(workdir, "report", "--db", "s.duckdb", "--window", "1m", "--by", "model", "--json").stdout)
    assert [(g["keys"]["model"], g["keys"]["window_start_unix_s"]) for g in doc["groups"]] == [
        ("anyscale_13b", None), ("lepton_7b", None)]


# ---- 5. a range that holds nothing is an error that says what the data covers -----------------------------


@pytest.fixture
def demo_store(workdir: Path) -> str:
    """The demo's store, made by the command (the Azure trace when ../shared/real_data has it)."""
    ok(workdir, "demo", "--db", "demo.duckdb")
    return "demo.duckdb"


@pytest.mark.parametrize("command", [["report"], ["report", "--json"], ["anomalies", "--metric", "ttft"]])
def test_the_readmes_from_to_on_data_of_other_dates_says_no_row_matched(workdir: Path, demo_store: str,
                                                                        command: list[str]) -> None:
    res = run(workdir, *command, "--db", demo_store, "--from", "2026-12-01T00:00:00", "--to", "2026-12-02T00:00:00")
    assert res.returncode == 1, res.stdout
    assert res.stdout == ""
    said = flat(res.stderr)
    assert "no stored request arrived" in said and "2026-12-01 00:00:00" in said and "2026-12-02 00:00:00" in said
    assert "19,366 request" in said or "18,000 request" in said  # the demo's rows, with the span they cover
    assert "2023-11-14" in said and "choose --from/--to" in said


def test_a_range_that_holds_rows_reports_them_as_before(workdir: Path, demo_store: str) -> None:
    doc = json.loads(ok(workdir, "report", "--db", demo_store, "--from", "2023-11-14T22:30:00", "--to",
                        "2023-11-14T22:40:00", "--json").stdout)
    assert 0 < doc["totals"]["attempted"] < 19_366


def test_parquet_files_of_other_dates_say_no_row_matched_with_their_span(workdir: Path) -> None:
    pytest.importorskip("pyarrow")
    from llmslo.analysis.store import ParquetSummaryWriter
    from llmslo.telemetry import COLUMNS

    writer = ParquetSummaryWriter(workdir / "summaries")
    writer.write([{c.name: r.get(c.name, c.default) for c in COLUMNS} for r in varied_rows(50, 1_700_000_000.0)])
    writer.close()
    res = run(workdir, "report", "--source", "summaries/**/*.parquet", "--from", "2026-12-01T00:00:00", "--to",
              "2026-12-02T00:00:00", "--memory-limit", "1GB")
    assert res.returncode == 1 and res.stdout == ""
    said = flat(res.stderr)
    assert "no stored request arrived" in said and "50 request" in said and "2023-11-14 22:13:20" in said


# ---- 6. a store's own rows can be exported -------------------------------------------------------------


def _stored_table(path: Path) -> Any:
    import duckdb

    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.sql("SELECT * FROM request_summaries ORDER BY request_id").to_arrow_table()
    finally:
        con.close()


def test_the_stores_own_rows_export_to_parquet_and_report_the_same(workdir: Path, demo_store: str) -> None:
    from llmslo.analysis.store import ParquetSummaryWriter, arrow_schema

    table = _stored_table(workdir / demo_store)
    assert not table.schema.equals(arrow_schema())  # DuckDB marks every column nullable
    writer = ParquetSummaryWriter(workdir / "export")
    writer.write_table(table)
    writer.close()
    stored = json.loads(ok(workdir, "report", "--db", demo_store, "--json").stdout)
    exported = json.loads(ok(workdir, "report", "--source", "export/**/*.parquet", "--json").stdout)
    assert exported["totals"] == stored["totals"] and exported["totals"]["requests"] == table.num_rows
    for name, dist in stored["groups"][0]["latency"].items():  # means may differ in the last bits (summed in
        got = exported["groups"][0]["latency"][name]            # another order); the rest is exact
        assert {k: v for k, v in got.items() if k != "mean"} == {k: v for k, v in dist.items() if k != "mean"}
        assert got["mean"] == pytest.approx(dist["mean"], rel=1e-12)


def test_a_table_the_writer_cannot_take_is_refused_naming_the_field_and_the_difference(tmp_path: Path) -> None:
    import pyarrow as pa

    from llmslo.analysis.store import ParquetSummaryWriter, arrow_schema, summary_table
    from llmslo.telemetry import COLUMNS

    good = summary_table([{c.name: ok_row(i).get(c.name, c.default) for c in COLUMNS} for i in range(3)])
    plain = pa.table({f.name: good.column(f.name) for f in arrow_schema()})  # every field nullable
    writer = ParquetSummaryWriter(tmp_path / "out")
    cases = [
        (plain.drop_columns(["e2e_s"]), r"field 'e2e_s' is missing"),
        (plain.append_column("colour", pa.array(["red"] * 3)), r"field 'colour' is not in arrow_schema\(\)"),
        (plain.set_column(plain.schema.get_field_index("prompt_tokens"), "prompt_tokens",
                          pa.array([1.0, 2.0, 3.0])), r"field 'prompt_tokens' is double; arrow_schema\(\) has int64"),
        (plain.set_column(plain.schema.get_field_index("model"), "model", pa.array(["a", None, "c"])),
         r"field 'model' holds 1 null \(first at row 1\); arrow_schema\(\) says it is never null"),
    ]
    for table, message in cases:
        with pytest.raises(ValueError, match=message):
            writer.write_table(table)
    writer.close()
    assert writer.files == []  # nothing written by a refused table
    writer = ParquetSummaryWriter(tmp_path / "out")
    writer.write_table(plain.select(list(reversed(plain.schema.names))))  # the order of the fields is free
    writer.close()
    assert len(writer.files) == 1


# ---- 8. small things a user notices ------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["jsonl", "csv", "parquet"])
def test_import_auto_on_llmslos_own_format_points_to_ingest(workdir: Path, suffix: str) -> None:
    import polars as pl

    from llmslo.analysis.store import polars_schema
    from llmslo.telemetry import COLUMNS

    rows = [{c.name: r.get(c.name, c.default) for c in COLUMNS} for r in varied_rows(5, 1_700_000_000.0)]
    frame = pl.DataFrame(rows, schema=polars_schema()).drop("itl_s")
    path = workdir / f"summaries.{suffix}"
    {"jsonl": frame.write_ndjson, "csv": frame.write_csv, "parquet": frame.write_parquet}[suffix](path)
    res = run(workdir, "import", "auto", path.name, "--db", "s.duckdb")
    assert res.returncode == 1, res.stdout
    said = flat(res.stderr)
    assert f"llmslo ingest {path.name} --db s.duckdb" in said and "name the kind" not in said
    assert not (workdir / "s.duckdb").exists()
    ok(workdir, "ingest", path.name, "--db", "s.duckdb")  # where it points works


def test_a_quantile_a_bucket_only_bounds_is_shown_as_the_bound_not_a_linear_guess(workdir: Path) -> None:
    sglang = _real(workdir, "rd/prometheus/sglang_llama3.1-8b_metrics_docs_example.prom.txt")
    doc = json.loads(ok(workdir, "scrape", sglang, "--json").stdout)
    (func,) = [h for h in doc["histograms"] if h["metric"] == "sglang:func_latency_seconds"]
    assert func["mean"] == pytest.approx(4.514771912145079 / 14007)  # 0.32 ms: every observation is tiny
    for q in func["quantiles"].values():  # all but one of 14,007 observations lie in (0, 0.05]
        assert (q["kind"], q["value"], q["bucket_lower"], q["bucket_upper"]) == ("bounded", 0.05, 0.0, 0.05)
        assert q["label"].startswith(("p50 ≤ 0.05", "p90 ≤ 0.05", "p99 ≤ 0.05"))
    (tpot,) = [h for h in doc["histograms"] if h["metric"] == "sglang:time_per_output_token_seconds"]
    assert all(q["kind"] == "interpolated" for q in tpot["quantiles"].values())  # a spread histogram: as before
    text = ok(workdir, "scrape", sglang).stdout
    (row,) = [line for line in text.splitlines() if "sglang:func_latency_seconds" in line]
    assert row.count("≤50ms") == 3 and "25ms" not in row and "45ms" not in row


def test_the_sum_bounds_a_buckets_mean_from_both_sides() -> None:
    from llmslo.analysis.scrape import bucket_quantile

    inf = float("inf")
    buckets = [(1.0, 0.0), (2.0, 100.0), (inf, 100.0)]  # 100 observations in (1, 2]
    assert bucket_quantile(0.5, buckets, total_sum=150.0).kind == "interpolated"  # a mean of 1.5: spread
    low = bucket_quantile(0.5, buckets, total_sum=100.5)  # a mean of 1.005: all at the bottom
    assert (low.kind, low.value, low.bucket_lower, low.bucket_upper) == ("bounded", 2.0, 1.0, 2.0)
    assert "in (1, 2]" in low.label()
    assert bucket_quantile(0.5, buckets, total_sum=199.5).kind == "bounded"  # a mean of 1.995: all at the top
    assert bucket_quantile(0.5, buckets).kind == "interpolated"  # no sum: PromQL's estimate, as before
    # an observation above the highest bound leaves the bucket's mean unbounded from below: no "top" verdict
    assert bucket_quantile(0.5, [(1.0, 0.0), (2.0, 100.0), (inf, 101.0)], total_sum=250.0).kind == "interpolated"


def test_a_clickhouse_server_that_cannot_be_reached_prints_only_the_clear_error(workdir: Path) -> None:
    pytest.importorskip("clickhouse_connect", reason="the clickhouse extra: pip install 'llmslo[clickhouse]'")
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    write_rows(workdir / "rows.jsonl", varied_rows(3, 1_700_000_000.0))
    for args in (["report", "--database", "clickhouse", "--url", url],
                 ["ingest", "rows.jsonl", "--database", "clickhouse", "--url", url]):
        res = run(workdir, *args)
        assert res.returncode == 1 and res.stdout == ""
        assert "Unexpected Http Driver Exception" not in res.stderr
        assert res.stderr.startswith("error: ") and "cannot connect" in res.stderr, res.stderr


# ---- 7. docs and outputs that say what ran ------------------------------------------------------------------


def test_the_demo_says_its_fixed_start_and_the_squeezed_burst_beside_the_trace_it_replays(workdir: Path) -> None:
    trace = _real(workdir, "rd/azure/AzureLLMInferenceTrace_conv.csv")
    res = ok(workdir, "demo", "--db", "demo.duckdb", "--trace", trace, "--json")
    said = flat(res.stderr)
    assert f"arrivals and lengths from {trace}" in said
    assert "the trace starts 2023-11-16 18:15:46 UTC" in said  # the file's own first arrival
    assert "replayed from a fixed start, 2023-11-14 22:13:20 UTC" in said
    assert "12 min of its arrivals squeezed into 3 min (a 4× burst)" in said
    doc = json.loads(res.stdout)
    first = min(g["keys"]["window_start_unix_s"] for g in doc["groups"])
    assert first == 1_700_000_000.0 - 1_700_000_000.0 % 300  # the windows start where the note says


def test_the_demo_without_real_data_runs_on_synthetic_arrivals_and_says_so(workdir: Path) -> None:
    """A clone with no ../shared/real_data beside it (here: LLMSLO_REAL_DATA names an empty folder) still runs
    the README's demo, on synthetic arrivals, and its first line says which workload ran."""
    (workdir / "empty").mkdir()
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "LLMSLO_REAL_DATA": str(workdir / "empty")}
    res = subprocess.run([str(_llmslo()), "demo", "--db", "demo.duckdb", "--json"], cwd=workdir, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    first = flat(res.stderr.splitlines()[0] if res.stderr else "")
    assert first.startswith("simulating the workload (synthetic arrivals: no trace found; Poisson at 5 req/s")
    assert "AzureLLMInferenceTrace" not in res.stderr
    assert json.loads(res.stdout)["totals"]["attempted"] > 0


def test_the_synthetic_demo_says_the_same_of_its_poisson_arrivals() -> None:
    from llmslo.analysis.workload import demo_workload_note

    note = demo_workload_note(None)
    assert note.startswith("synthetic arrivals: no trace found; Poisson at 5 req/s")
    assert "from a fixed start, 2023-11-14 22:13:20 UTC" in note and "a 4× burst" in note


def test_a_reingested_id_with_other_content_is_conflicting_as_the_conventions_say(workdir: Path) -> None:
    write_rows(workdir / "day1.jsonl", varied_rows(5, 1_700_000_000.0))
    ok(workdir, "ingest", "day1.jsonl", "--db", "s.duckdb")
    changed = varied_rows(5, 1_700_000_000.0)
    changed[2]["prompt_tokens"] = 999  # the same request_id, other content
    write_rows(workdir / "day1-fixed.jsonl", changed)
    res = ok(workdir, "ingest", "day1-fixed.jsonl", "--db", "s.duckdb", "--json")
    (f,) = json.loads(res.stdout)["files"]
    assert (f["rows_already_stored"], f["rows_conflicting"], f["conflicting_ids"]) == (4, 1, ["req-2"])
    assert "request_id that is stored with other content" in flat(run(workdir, "ingest", "day1-fixed.jsonl",
                                                                      "--db", "s.duckdb").stderr)
    conventions = flat((Path(__file__).resolve().parents[1] / "docs" / "conventions.md").read_text())
    idempotence = conventions[conventions.index("**Idempotence**"):conventions.index("**Atomicity**")]
    assert "conflicting" in idempotence and "whatever its other values" not in idempotence
