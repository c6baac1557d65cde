"""Importing other tools' per-request benchmark results as request summaries.

Real data: the 19 LLMPerf leaderboard files and a vLLM benchmark summary under ../shared/real_data (tests
skip with a reason when the folder is missing). The vLLM, GenAI-Perf, AIPerf and guidellm files in
tests/fixtures/import/ are hand-written for these tests from each tool's documented output format; they are
not real tool outputs (see the README there).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import typer
from typer.testing import CliRunner

from llmslo.analysis import DEFAULT_TTFT_S, GoodputPolicy, ReportSpec, Store, build_report, polars_schema
from llmslo.analysis.importers import (
    ImportFormatError,
    ImportReport,
    UnknownKindError,
    convert_file,
    detect_kind,
    import_files,
    importers,
    recorded_imports,
)
from llmslo.analysis.importers._genai_perf import import_genai_perf
from llmslo.analysis.importers._guidellm import import_guidellm
from llmslo.analysis.importers._llmperf import import_llmperf
from llmslo.analysis.importers._vllm_bench import import_vllm_bench
from llmslo.cli._import import import_command

REAL = Path(__file__).resolve().parents[2] / "shared" / "real_data"
LLMPERF = REAL / "llmperf_leaderboard" / "individual"
VLLM_SUMMARIES = sorted((REAL / "vllm_memory_gap_bsc").glob("*/openai-infqps-*.json"))
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "import"
LLMPERF_QUANTILES = (0.25, 0.5, 0.75, 0.9, 0.95, 0.99)
"""The percentiles LLMPerf's summary reports, computed over successful requests with linear interpolation."""


def _llmperf_files() -> list[Path]:
    files = sorted(LLMPERF.glob("*.json"))
    if len(files) != 19:
        pytest.skip(f"the 19 LLMPerf leaderboard files are not in {LLMPERF}")
    return files


def _llmperf_way(path: Path, field: str) -> dict[float, float]:
    """LLMPerf's own summary figure: percentiles over the requests with error_code null, numpy linear."""
    values = [r[field] for r in json.loads(path.read_text()) if r["error_code"] is None]
    return {q: float(np.percentile(values, q * 100)) for q in LLMPERF_QUANTILES}


def _cli() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """Test command group."""

    app.command("import")(import_command)
    return app


def _run_import(*args: str) -> Any:
    return CliRunner().invoke(_cli(), ["import", *args])


def _row(frame: pl.DataFrame, i: int) -> dict[str, Any]:
    return frame.row(i, named=True)


# ---- LLMPerf on the real files --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llmperf_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, ImportReport]]:
    files = _llmperf_files()
    db = tmp_path_factory.mktemp("llmperf") / "llmperf.duckdb"
    reports: dict[str, ImportReport] = {}
    with Store.open(db) as store:
        for f in files:
            frame, report = import_llmperf(f)
            ingest = store.ingest_frame(frame, source=str(f))
            assert ingest.rows_inserted == report.rows_imported
            reports[f.stem] = report
    return db, reports


def test_every_llmperf_file_imports_without_loss(llmperf_store: tuple[Path, dict[str, ImportReport]]) -> None:
    db, reports = llmperf_store
    assert len(reports) == 19
    for path in _llmperf_files():
        report = reports[path.stem]
        n = len(json.loads(path.read_text()))
        assert report.rows_read == report.rows_imported == n, path.name
        assert report.arrivals_available is False
    with Store.open(db, read_only=True) as store:
        assert store.count() == sum(r.rows_read for r in reports.values())


def test_success_only_ttft_and_e2e_quantiles_equal_llmperfs_own(
    llmperf_store: tuple[Path, dict[str, ImportReport]],
) -> None:
    db, _ = llmperf_store
    with Store.open(db, read_only=True) as store:
        report = build_report(store.con, ReportSpec(GoodputPolicy(), by=("model", "finish_reason"))).to_dict()
        by_model = build_report(store.con, ReportSpec(GoodputPolicy(), by=("model",))).to_dict()
        groups = {(g["keys"]["model"], g["keys"]["finish_reason"]): g for g in report["groups"]}
        survivors = {g["keys"]["model"]: g["survivor_bias"]["ttft_success_only"] for g in by_model["groups"]}
        for path in _llmperf_files():
            model = path.stem
            for field, column in (("ttft_s", "ttft_s"), ("end_to_end_latency_s", "e2e_s")):
                expected = _llmperf_way(path, field)
                latency = groups[(model, "stop")]["latency"][column]  # successes are the 'stop' group
                for q, label in ((0.5, "p50"), (0.9, "p90"), (0.95, "p95"), (0.99, "p99")):
                    assert latency[label] == pytest.approx(expected[q], rel=1e-12), (model, column, label)
                qs = ", ".join(repr(q) for q in LLMPERF_QUANTILES)
                got = store.con.sql(
                    f"SELECT quantile_cont({column}, [{qs}]) FROM request_summaries "
                    "WHERE model = ? AND finish_reason IN ('stop', 'length')", params=[model],
                ).fetchall()[0][0]
                assert got == pytest.approx([expected[q] for q in LLMPERF_QUANTILES], rel=1e-12), (model, column)
            # the survivor check's success-only TTFT is nearest-rank (docs/definitions.md, "Survivor bias"),
            # not LLMPerf's interpolation: the values it reads are the same, the definition is the check's own
            values = np.array([r[0] for r in store.con.sql(
                "SELECT ttft_s FROM request_summaries WHERE model = ? AND finish_reason IN ('stop', 'length') "
                "AND ttft_s IS NOT NULL", params=[model]).fetchall()])
            for q, label in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
                assert survivors[model][label] == float(np.quantile(values, q, method="inverted_cdf"))


def test_llmperf_report_command_reproduces_llmperfs_quantiles(tmp_path: Path) -> None:
    files = _llmperf_files()
    db = tmp_path / "cli.duckdb"
    result = _run_import("llmperf", *map(str, files), "--db", str(db), "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert [f["rows_read"] for f in out["files"]] == [f["rows_imported"] for f in out["files"]]
    assert [f["rows_inserted"] for f in out["files"]] == [f["rows_read"] for f in out["files"]]
    rep = subprocess.run([sys.executable, "-m", "llmslo.cli", "report", "--db", str(db), "--by", "model,finish_reason",
                          "--json"], capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr
    groups = {(g["keys"]["model"], g["keys"]["finish_reason"]): g for g in json.loads(rep.stdout)["groups"]}
    for path in files:
        for field, column in (("ttft_s", "ttft_s"), ("end_to_end_latency_s", "e2e_s")):
            expected = _llmperf_way(path, field)
            latency = groups[(path.stem, "stop")]["latency"][column]
            assert [latency[k] for k in ("p50", "p90", "p95", "p99")] == pytest.approx(
                [expected[q] for q in (0.5, 0.9, 0.95, 0.99)], rel=1e-12), (path.stem, column)


def test_goodput_reveals_the_rate_limited_provider_that_success_only_ttft_hides(
    llmperf_store: tuple[Path, dict[str, ImportReport]],
) -> None:
    db, reports = llmperf_store
    with Store.open(db, read_only=True) as store:
        report = build_report(store.con, ReportSpec(GoodputPolicy(), by=("model",))).to_dict()
    groups = {g["keys"]["model"]: g for g in report["groups"]}
    for model in ("lepton_7b", "lepton_13b", "lepton_70b"):
        g = groups[model]
        assert reports[model].finish_reasons == {"rejected": 130, "stop": 20}
        assert g["survivor_bias"]["accounting"]["rejected"] == 130
        success_only = g["survivor_bias"]["ttft_success_only"]
        assert success_only["count"] == 20
        assert success_only["p99"] < DEFAULT_TTFT_S  # the success-only summary looks healthy ...
        assert g["goodput_fraction"] <= 20 / 150  # ... while at most 13% of attempts were served well
    healthy = groups["fireworks_7b"]["goodput_fraction"]
    assert healthy > 0.9 > 0.2 > groups["lepton_13b"]["goodput_fraction"]


def test_llmperf_tpot_excludes_the_first_token() -> None:
    path = _llmperf_files()[0]
    raw = json.loads(path.read_text())[0]
    frame, report = import_llmperf(path)
    row = _row(frame, 0)
    n = raw["number_output_tokens"]
    assert row["last_token_s"] == pytest.approx(raw["inter_token_latency_s"] * n)
    tpot = (row["last_token_s"] - row["ttft_s"]) / (n - 1)
    assert tpot < raw["inter_token_latency_s"]  # LLMPerf's figure carries the TTFT, ours does not
    assert row["ttft_s"] == row["client_ttft_s"] == raw["ttft_s"]
    assert row["e2e_s"] == row["client_e2e_s"] == raw["end_to_end_latency_s"]
    assert any("includes TTFT and divides by N" in c for c in report.conversions)


def test_llmperf_failures_keep_what_they_measured_and_get_bounded_types() -> None:
    files = {p.stem: p for p in _llmperf_files()}
    frame, report = import_llmperf(files["bedrock_13b"])
    failed = frame.filter(pl.col("finish_reason") == "error")
    assert failed.height == 97 and set(failed["error_type"]) == {"too_few_tokens"}
    assert failed["ttft_s"].null_count() == 0 and (failed["generated_tokens"] > 0).all()
    assert (failed["last_token_s"] <= failed["e2e_s"]).all()
    assert any("left it undivided" in c for c in report.conversions)
    frame, _ = import_llmperf(files["together_13b"])
    err = frame.filter(pl.col("finish_reason") == "error")
    assert err["error_type"].to_list() == ["client_error"] and err["generated_tokens"].to_list() == [0]
    frame, _ = import_llmperf(files["lepton_13b"])
    rejected = frame.filter(pl.col("finish_reason") == "rejected")
    assert set(rejected["reject_reason"]) == {"rate_limited"}
    assert rejected["generated_tokens"].sum() == 0 and rejected["ttft_s"].null_count() == 130


# ---- vLLM ---------------------------------------------------------------------------------------------------


def test_vllm_detailed_result_maps_arrivals_failures_and_per_token_gaps() -> None:
    frame, report = import_vllm_bench(FIXTURES / "vllm_bench_serve_detailed.json")
    assert frame.schema == polars_schema()
    assert report.rows_read == report.rows_imported == 6
    assert report.arrivals_available is True
    assert report.finish_reasons == {"error": 1, "rejected": 1, "stop": 4}
    anchor = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC).timestamp() - 10.0
    assert frame["arrival_unix_s"].to_list() == pytest.approx([anchor + 0.25 * i for i in range(6)])
    assert set(frame["model"]) == {"meta-llama/Llama-3.1-8B-Instruct"}
    assert set(frame["tenant_class"]) == {"request_rate=4.0"}
    one_per_chunk, several_per_chunk, rejected, disconnected, one_token, _ = (_row(frame, i) for i in range(6))
    assert one_per_chunk["itl_s"] == pytest.approx([0.05] * 3)
    assert one_per_chunk["last_token_s"] == pytest.approx(0.35) and one_per_chunk["e2e_s"] == 0.36
    assert several_per_chunk["itl_s"] is None and several_per_chunk["last_token_s"] == pytest.approx(0.5)
    assert rejected["finish_reason"] == "rejected" and rejected["reject_reason"] == "rate_limited"
    assert disconnected["error_type"] == "client_error" and disconnected["client_ttft_s"] == 0.4
    assert disconnected["ttft_s"] is None and disconnected["e2e_s"] == 0.4  # a lower bound: its first chunk
    assert one_token["ttft_s"] == one_token["last_token_s"] == 0.25
    assert any("one chunk per token" in c for c in report.conversions)


def test_old_vllm_key_set_derives_e2e_and_says_arrivals_are_unavailable() -> None:
    frame, report = import_vllm_bench(FIXTURES / "vllm_benchmark_serving_old.json")
    assert "old key set" in report.tool and any("'request_goodput:'" in c for c in report.conversions)
    assert any("e2e_s derived as ttft + Σ itls" in c for c in report.conversions)
    assert report.arrivals_available is False and "in no window" in report.arrival_note
    assert frame["e2e_s"].to_list()[:2] == pytest.approx([0.7, 0.8])
    assert frame["model"][0] == "llama-2-7b"
    assert _row(frame, 2)["error_type"] == "http_400"
    assert len(set(frame["arrival_unix_s"])) == 1


def test_vllm_summary_without_per_request_arrays_is_refused_by_name(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"completed": 10, "duration": 5.0, "request_throughput": 2.0, "mean_ttft_ms": 10}))
    paths = [summary, *VLLM_SUMMARIES]
    for path in paths:
        with pytest.raises(ImportFormatError) as info:
            import_vllm_bench(path)
        message = str(info.value)
        assert str(path) in message and "field ttfts" in message and "--save-detailed" in message


def test_real_vllm_summary_is_recognised_and_refused() -> None:
    if not VLLM_SUMMARIES:
        pytest.skip(f"no vLLM benchmark summary under {REAL / 'vllm_memory_gap_bsc'}")
    assert detect_kind(VLLM_SUMMARIES[0]) == "vllm-bench"
    with pytest.raises(ImportFormatError, match="summary statistics only"):
        convert_file(VLLM_SUMMARIES[0])


# ---- GenAI-Perf / AIPerf / guidellm ---------------------------------------------------------------------------


def test_genai_perf_profile_export_uses_content_chunks_and_server_usage() -> None:
    frame, report = import_genai_perf(FIXTURES / "genai_perf_profile_export.json")
    assert frame.schema == polars_schema() and report.rows_read == report.rows_imported == 3
    with_usage, without_usage, empty = (_row(frame, i) for i in range(3))
    assert (with_usage["ttft_s"], with_usage["last_token_s"], with_usage["e2e_s"]) == pytest.approx((0.2, 0.3, 0.32))
    assert with_usage["generated_tokens"] == 3 and with_usage["prompt_tokens"] == 12
    assert with_usage["itl_s"] == pytest.approx([0.05, 0.05])
    assert with_usage["arrival_unix_s"] == pytest.approx(1_740_000_000.0)
    assert without_usage["generated_tokens"] == 2 and without_usage["itl_s"] is None
    assert empty["finish_reason"] == "error" and empty["error_type"] == "no_first_token"
    assert frame["tenant_class"].to_list() == ["concurrency=1", "concurrency=1", "concurrency=2"]
    assert set(frame["model"]) == {"llama-3-8b"}
    assert any("one token per chunk assumed" in c for c in report.conversions)


def test_aiperf_records_convert_units_and_classify_errors() -> None:
    frame, report = import_genai_perf(FIXTURES / "aiperf_profile_export.jsonl")
    assert report.tool.startswith("AIPerf") and report.rows_read == report.rows_imported == 5
    chunked, plain, limited, cancelled, failed = (_row(frame, i) for i in range(5))
    assert (chunked["ttft_s"], chunked["last_token_s"], chunked["e2e_s"]) == pytest.approx((0.1, 0.25, 0.3))
    assert chunked["itl_s"] == pytest.approx([0.05] * 3)
    tpot = (plain["last_token_s"] - plain["ttft_s"]) / (plain["generated_tokens"] - 1)
    assert tpot == pytest.approx(0.070)  # AIPerf's inter_token_latency of that record
    assert (limited["finish_reason"], limited["reject_reason"]) == ("rejected", "rate_limited")
    assert cancelled["finish_reason"] == "client_cancel" and cancelled["e2e_s"] == pytest.approx(1.0)
    assert (failed["finish_reason"], failed["error_type"]) == ("error", "http_500")
    assert chunked["arrival_unix_s"] == pytest.approx(1_759_813_207.0)


AIPERF_USAGE = FIXTURES / "aiperf_profile_export_usage.jsonl"
"""AIPerf records of a run that asked the server for usage (hand-written, the layout of AIPerf's
``usage_completion_tokens`` / ``usage_prompt_tokens`` record metrics): the server's counts differ from the client
tokenizer's in some records, one record carries no usage, one has fewer chunks than tokens."""


def _aiperf_metric(record: dict[str, Any], name: str) -> Any:
    m = record["metrics"].get(name)
    return None if m is None else m["value"]


def test_aiperf_token_counts_come_from_the_servers_usage_with_the_client_count_as_a_note() -> None:
    records = [json.loads(line) for line in AIPERF_USAGE.read_text().splitlines()]
    frame, report = import_genai_perf(AIPERF_USAGE)
    assert report.rows_imported == len(records)
    for i, rec in enumerate(records):
        row = _row(frame, i)
        usage_out = _aiperf_metric(rec, "usage_completion_tokens")
        client_out = _aiperf_metric(rec, "output_sequence_length")
        expected_out = usage_out if usage_out is not None else (client_out or 0)
        assert row["generated_tokens"] == row["sent_tokens"] == expected_out, i
        usage_in = _aiperf_metric(rec, "usage_prompt_tokens")
        client_in = _aiperf_metric(rec, "input_sequence_length") or _aiperf_metric(rec, "error_isl")
        assert row["prompt_tokens"] == (usage_in if usage_in is not None else client_in), i
    both = [r for r in records if _aiperf_metric(r, "usage_completion_tokens") is not None]
    server = sum(_aiperf_metric(r, "usage_completion_tokens") for r in both)
    client = sum(_aiperf_metric(r, "output_sequence_length") for r in both)
    assert server != client  # the fixture's point: the two counts differ
    note = next(c for c in report.conversions if c.startswith("output tokens: from the server's usage"))
    assert f"({len(both)} of {len(records)} records)" in note
    assert f"client tokenizer counted {client:,} output tokens" in note and f"the server counted {server:,}" in note
    rest = len(records) - len(both) - 1  # the failed record counts no output tokens at all
    assert any(c.startswith("output tokens: AIPerf's client tokenizer count") and f"for {rest} of {len(records)}"
               in c for c in report.conversions)
    assert any(c.startswith("prompt tokens: from the server's usage, metrics.usage_prompt_tokens")
               for c in report.conversions)


def test_aiperf_inter_chunk_latency_fills_itl_s_in_seconds_where_there_is_one_gap_per_token() -> None:
    records = [json.loads(line) for line in AIPERF_USAGE.read_text().splitlines()]
    frame, report = import_genai_perf(AIPERF_USAGE)
    to_s = {"ms": 1e-3, "ns": 1e-9}
    kept = dropped = only_by_usage = 0
    for i, rec in enumerate(records):
        icl = rec["metrics"].get("inter_chunk_latency")
        row = _row(frame, i)
        if icl is None:
            assert row["itl_s"] is None
            continue
        gaps = [g * to_s[icl["unit"]] for g in icl["value"]]
        assert row["last_token_s"] == pytest.approx(row["ttft_s"] + sum(gaps), rel=1e-12)
        usage = _aiperf_metric(rec, "usage_completion_tokens")
        client = _aiperf_metric(rec, "output_sequence_length")
        tokens = usage if usage is not None else client
        if len(gaps) == tokens - 1:  # one gap per token of the server's count (the client's without usage)
            assert row["itl_s"] == pytest.approx(gaps, rel=1e-12), i
            kept += 1
            only_by_usage += len(gaps) != client - 1  # the client tokenizer's count would have left it empty
        else:  # chunks of several tokens: the token weighting is unknown
            assert row["itl_s"] is None, i
            dropped += 1
    assert kept >= 2 and dropped >= 1 and only_by_usage >= 1
    assert any("itl_s = inter_chunk_latency" in c and f"for {kept} request(s)" in c for c in report.conversions)
    assert any(c.startswith(f"itl_s not imported for {dropped} request(s)") for c in report.conversions)


@pytest.mark.parametrize(("metric", "value", "field", "rule"), [
    ("inter_chunk_latency", {"value": [40.0, 50.0], "unit": "minutes"}, "metrics.inter_chunk_latency.unit", "unit"),
    ("inter_chunk_latency", {"value": [40.0, None], "unit": "ms"}, "metrics.inter_chunk_latency.value[1]", "type"),
    ("usage_completion_tokens", {"value": -3, "unit": "tokens"}, "metrics.usage_completion_tokens", "type"),
    ("usage_prompt_tokens", {"value": 5.5, "unit": "tokens"}, "metrics.usage_prompt_tokens", "type"),
])
def test_a_bad_aiperf_usage_or_gap_list_is_refused_by_name(tmp_path: Path, metric: str, value: Any, field: str,
                                                           rule: str) -> None:
    lines = AIPERF_USAGE.read_text().splitlines()
    rec = json.loads(lines[0])
    rec["metrics"][metric] = value
    lines[0] = json.dumps(rec)
    bad = tmp_path / "profile_export.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(ImportFormatError) as info:
        import_genai_perf(bad)
    assert (1, field, rule) in {(e.row, e.column, e.rule) for e in info.value.errors}


def _llmperf_file(tmp_path: Path) -> Path:
    path = tmp_path / "run_individual_responses.json"
    path.write_text(json.dumps([
        {"error_code": None, "error_msg": "", "ttft_s": 0.2, "end_to_end_latency_s": 1.0,
         "inter_token_latency_s": 0.05, "number_input_tokens": 10, "number_output_tokens": 20},
    ] * 3))
    return path


@pytest.mark.parametrize(("name", "tool", "nearest"), [
    ("vllm_bench_serve_detailed.json", "vLLM bench", False),
    ("genai_perf_profile_export.json", "GenAI-Perf", False),
    ("aiperf_profile_export.jsonl", "AIPerf", False),
    ("guidellm_benchmarks_old.json", "guidellm", True),
    ("guidellm_benchmarks_new.json", "guidellm", True),
    ("llmperf", "LLMPerf", False),
])
def test_every_import_report_says_which_quantile_definition_the_tool_uses(tmp_path: Path, name: str, tool: str,
                                                                           nearest: bool) -> None:
    path = _llmperf_file(tmp_path) if name == "llmperf" else FIXTURES / name
    _, report = convert_file(path)
    (note,) = [c for c in report.conversions if c.startswith("Quantiles:")]
    assert note.startswith(f"Quantiles: {tool} ")
    if nearest:
        assert "by nearest rank" in note and "`llmslo report --quantiles nearest-rank` reproduces them" in note
    else:
        assert "by linear interpolation between order statistics" in note and "uses by default" in note


GUIDELLM_REAL = Path(__file__).resolve().parent / "fixtures" / "importers_real" / "guidellm_0.5.4_benchmarks.json"
"""Written by guidellm 0.5.4's own code (its README): guidellm's own percentiles, by nearest rank."""


def test_report_nearest_rank_reproduces_guidellms_own_percentiles(tmp_path: Path) -> None:
    doc = json.loads(GUIDELLM_REAL.read_text())
    db = tmp_path / "g.duckdb"
    imported = _run_import("guidellm", str(GUIDELLM_REAL), "--db", str(db))
    assert imported.exit_code == 0, imported.output
    assert "by nearest rank" in imported.stdout  # the import report says which definition guidellm uses

    def ttft_ms(*args: str) -> dict[str, dict[str, float]]:
        rep = subprocess.run([sys.executable, "-m", "llmslo.cli", "report", "--db", str(db), "--by", "tenant_class",
                              "--json", *args], capture_output=True, text=True, timeout=300)
        assert rep.returncode == 0, rep.stderr
        groups = json.loads(rep.stdout)["groups"]
        return {g["keys"]["tenant_class"]: {k: g["latency"]["ttft_s"][k] * 1000 for k in ("p50", "p90", "p95", "p99")}
                for g in groups}

    nearest, linear = ttft_ms("--quantiles", "nearest-rank"), ttft_ms()
    differ = 0
    for bench in doc["benchmarks"]:
        tenant = f"concurrent@{bench['config']['strategy']['streams']}"
        theirs = bench["metrics"]["time_to_first_token_ms"]["successful"]["percentiles"]
        for label in ("p50", "p90", "p95", "p99"):
            assert nearest[tenant][label] == pytest.approx(theirs[label], rel=1e-9), (tenant, label)
        differ += linear[tenant]["p95"] != pytest.approx(theirs["p95"], rel=1e-6)
    assert differ == len(doc["benchmarks"])  # linear interpolation gives another p95 in every benchmark


@pytest.mark.parametrize("name", ["guidellm_benchmarks_old.json", "guidellm_benchmarks_new.json"])
def test_guidellm_reports_of_both_layouts_import(name: str) -> None:
    frame, report = import_guidellm(FIXTURES / name)
    assert frame.schema == polars_schema() and report.rows_read == report.rows_imported
    ok = _row(frame, 0)
    assert ok["finish_reason"] == "stop" and ok["arrival_unix_s"] == pytest.approx(1_740_000_000.0)
    tpot = (ok["last_token_s"] - ok["ttft_s"]) / (ok["generated_tokens"] - 1)
    if name.endswith("old.json"):
        assert (ok["ttft_s"], ok["last_token_s"], ok["e2e_s"]) == pytest.approx((0.3, 0.8, 0.9))
        assert tpot == pytest.approx(0.125)  # guidellm's inter_token_latency; its TPOT would be 0.16
        assert report.finish_reasons == {"client_cancel": 1, "error": 1, "stop": 2}
        assert frame.filter(pl.col("finish_reason") == "error")["error_type"].to_list() == ["http_503"]
        assert set(frame["tenant_class"]) == {"constant@2"} and ok["model"] == "Qwen/Qwen2.5-7B-Instruct"
    else:
        assert (ok["ttft_s"], ok["last_token_s"], ok["e2e_s"]) == pytest.approx((0.2, 0.6, 0.65))
        assert report.finish_reasons == {"rejected": 1, "stop": 1}
        assert set(frame["tenant_class"]) == {"concurrent@4"}


# ---- detection, malformed files, the command ------------------------------------------------------------------


def test_each_format_is_recognised_from_its_content(tmp_path: Path) -> None:
    expected = {
        "vllm_bench_serve_detailed.json": "vllm-bench",
        "vllm_benchmark_serving_old.json": "vllm-bench",
        "genai_perf_profile_export.json": "genai-perf",
        "aiperf_profile_export.jsonl": "genai-perf",
        "aiperf_profile_export_usage.jsonl": "genai-perf",
        "guidellm_benchmarks_old.json": "guidellm",
        "guidellm_benchmarks_new.json": "guidellm",
    }
    for name, kind in expected.items():
        assert detect_kind(FIXTURES / name) == kind, name
    if LLMPERF.is_dir():
        assert {detect_kind(p) for p in LLMPERF.glob("*.json")} == {"llmperf"}
    text = tmp_path / "notes.txt"
    text.write_text("nothing to see here\n")
    with pytest.raises(UnknownKindError, match="not recognised"):
        detect_kind(text)
    assert {"vllm-bench", "llmperf", "genai-perf", "guidellm"} <= set(importers())


def test_every_importer_returns_exactly_the_summary_schema() -> None:
    for path in sorted(FIXTURES.glob("*.json*")):
        frame, report = convert_file(path)
        assert frame.schema == polars_schema(), path.name
        assert report.rows_imported == frame.height and report.conversions and report.missing_fields


def _llmperf_record(**overrides: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "error_code": None, "error_msg": "", "inter_token_latency_s": 0.02, "ttft_s": 0.5,
        "end_to_end_latency_s": 3.5, "request_output_throughput_token_per_s": 40.0, "number_total_tokens": 700,
        "number_output_tokens": 150, "number_input_tokens": 550,
    }
    record.update(overrides)
    return record


def test_a_malformed_llmperf_file_names_file_record_and_field_and_imports_nothing(tmp_path: Path) -> None:
    good = tmp_path / "good_7b.json"
    good.write_text(json.dumps([_llmperf_record()]))
    bad = tmp_path / "bad_7b.json"
    missing = _llmperf_record()
    del missing["ttft_s"]
    bad.write_text(json.dumps([_llmperf_record(), _llmperf_record(), missing, _llmperf_record(),
                               _llmperf_record(ttft_s="fast"), _llmperf_record(ttft_s=9.0)]))
    with pytest.raises(ImportFormatError) as info:
        import_llmperf(bad)
    found = {(e.row, e.column, e.rule) for e in info.value.errors}
    assert found == {(3, "ttft_s", "missing"), (5, "ttft_s", "type"), (6, "ttft_s", "order")}
    assert f"{bad}: record 3, field ttft_s" in str(info.value)
    db = tmp_path / "s.duckdb"
    result = _run_import("llmperf", str(good), str(bad), "--db", str(db))
    assert result.exit_code == 1
    assert "record 5, field ttft_s = 'fast'" in result.stderr and "nothing was imported" in result.stderr
    assert not db.exists()  # the good file was not loaded either


def test_malformed_files_of_the_other_formats_name_record_and_field(tmp_path: Path) -> None:
    vllm = json.loads((FIXTURES / "vllm_bench_serve_detailed.json").read_text())
    vllm["itls"] = vllm["itls"][:5]
    (tmp_path / "short.json").write_text(json.dumps(vllm))
    vllm = json.loads((FIXTURES / "vllm_bench_serve_detailed.json").read_text())
    vllm["ttfts"][3] = -1.0
    (tmp_path / "negative.json").write_text(json.dumps(vllm))
    lines = (FIXTURES / "aiperf_profile_export.jsonl").read_text().splitlines()
    lines[1] = lines[1][:40]
    (tmp_path / "cut.jsonl").write_text("\n".join(lines) + "\n")
    guide = json.loads((FIXTURES / "guidellm_benchmarks_old.json").read_text())
    guide["benchmarks"][0]["requests"]["successful"][1]["start_time"] = "yesterday"
    (tmp_path / "guide.json").write_text(json.dumps(guide))
    genai = json.loads((FIXTURES / "genai_perf_profile_export.json").read_text())
    genai["experiments"][0]["requests"][1]["response_outputs"].pop()
    (tmp_path / "genai.json").write_text(json.dumps(genai))
    cases = [
        (import_vllm_bench, "short.json", None, "itls", "length"),
        (import_vllm_bench, "negative.json", 4, "ttfts", "negative"),
        (import_genai_perf, "cut.jsonl", 2, "-", "malformed_json"),
        (import_guidellm, "guide.json", 2, "benchmarks[0].requests.successful[1].start_time", "type"),
        (import_genai_perf, "genai.json", 2, "experiments[0].requests[1].response_outputs", "length"),
    ]
    for convert, name, row, field, rule in cases:
        with pytest.raises(ImportFormatError) as info:
            convert(tmp_path / name)
        assert (row, field, rule) in {(e.row, e.column, e.rule) for e in info.value.errors}, name
        assert str(tmp_path / name) in str(info.value)


def test_the_import_command_reports_conversions_and_warns_without_arrivals(tmp_path: Path) -> None:
    files = _llmperf_files()
    db = tmp_path / "s.duckdb"
    lepton = next(f for f in files if f.stem == "lepton_13b")
    result = _run_import("auto", str(lepton), str(FIXTURES / "guidellm_benchmarks_old.json"), "--db", str(db))
    assert result.exit_code == 0, result.output
    assert "inter_token_latency_s is LLMPerf's per-request mean" in result.stdout
    assert "rejected 130, stop 20" in result.stdout and "not in the file:" in result.stdout
    assert "no request start times" in result.stderr and "lepton_13b.json" in result.stderr
    again = _run_import("llmperf", str(lepton), "--db", str(db), "--json")
    assert again.exit_code == 0, again.output
    row = json.loads(again.stdout)["files"][0]
    assert row["rows_inserted"] == 0 and row["rows_already_stored"] == 150  # request ids from content + index
    with Store.open(db, read_only=True) as store:
        records = {Path(r["source"]).name: r for r in recorded_imports(store)}
        assert store.meta("import:lepton_13b.json") is None  # provenance lives in its own table, not meta strings
    assert set(records) == {"lepton_13b.json", "guidellm_benchmarks_old.json"}  # the re-import replaced its record
    lepton_record = records["lepton_13b.json"]
    assert lepton_record["arrivals_available"] is False and lepton_record["rows_read"] == 150
    assert lepton_record["rows_inserted"] == 0 and lepton_record["rows_already_stored"] == 150
    assert lepton_record["content_sha256"] == hashlib.sha256(lepton.read_bytes()).hexdigest()
    assert records["guidellm_benchmarks_old.json"]["arrivals_available"] is True
    renamed = _run_import("llmperf", str(lepton), "--db", str(db), "--model", "other-name")
    assert renamed.exit_code == 0, renamed.output  # the same ids with other content: kept as stored, and said
    assert "150 row(s) have a request_id that is stored with other content" in " ".join(renamed.stderr.split())


def test_the_import_command_rejects_unknown_kinds_and_missing_files(tmp_path: Path) -> None:
    unknown = _run_import("perf-magic", str(FIXTURES / "aiperf_profile_export.jsonl"), "--db", str(tmp_path / "s.db"))
    assert unknown.exit_code == 2 and "unknown import kind 'perf-magic'" in unknown.stderr
    missing = _run_import("auto", str(tmp_path / "nope.json"), "--db", str(tmp_path / "s.db"))
    assert missing.exit_code == 1 and "no such file" in missing.stderr
    assert not (tmp_path / "s.db").exists()


def test_import_files_records_provenance_that_the_report_turns_into_caveats(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    no_arrivals = tmp_path / "run_individual_responses.json"
    no_arrivals.write_text(json.dumps([
        {"error_code": None, "error_msg": "", "ttft_s": 0.2, "end_to_end_latency_s": 1.0,
         "inter_token_latency_s": 0.05, "number_input_tokens": 10, "number_output_tokens": 20},
    ] * 3))
    result = import_files([no_arrivals, FIXTURES / "guidellm_benchmarks_old.json"], "auto", db)
    assert [f.report.kind for f in result.files] == ["llmperf", "guidellm"]
    assert result.store_rows == sum(f.ingest.rows_inserted for f in result.files if f.ingest)
    with Store.open(db, read_only=True) as store:
        caveats = build_report(store.con, ReportSpec(GoodputPolicy())).caveats
    assert any("LLMPerf" in c and "guidellm" in c for c in caveats), caveats
    assert any("1 imported file(s) carry no arrival times (run_individual_responses.json)" in c for c in caveats)


def test_a_store_from_before_the_imports_table_keeps_its_caveats(tmp_path: Path) -> None:
    db = tmp_path / "old.duckdb"
    with Store.open(db) as store:
        store.set_meta("import:old_run.json", json.dumps({"tool": "LLMPerf individual responses",
                                                           "arrivals_available": False}))
        caveats = build_report(store.con, ReportSpec(GoodputPolicy())).caveats
    assert any("(old_run.json)" in c for c in caveats), caveats


def test_import_files_writes_nothing_when_a_later_file_is_malformed(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    bad = tmp_path / "broken.json"
    bad.write_text('{"benchmarks": [{"requests": {"successful": [{"start_time": "soon"}]}}], "generative": 1}')
    with pytest.raises(ImportFormatError):
        import_files([FIXTURES / "guidellm_benchmarks_old.json", bad], "guidellm", db)
    assert not db.exists()
