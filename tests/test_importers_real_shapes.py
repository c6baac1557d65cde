"""Real-shape result files of each tool: our import + ``build_report`` reproduce the figures the tool wrote.

The files are in tests/fixtures/importers_real/ (README there: where each comes from). Tolerances:

- means, and quantiles the tool computes with linear interpolation (AIPerf, vLLM bench, GenAI-Perf, all
  numpy's default): relative 1e-9, float rounding only (the files hold the same values in ms or ns, we
  convert to seconds);
- guidellm's percentiles are inverse-CDF values (the smallest sample whose cumulative share reaches p),
  ours interpolate linearly: the two lie within one gap between neighbouring order statistics, which is
  the tolerance asserted (and guidellm's value must be one of the samples).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from llmslo.analysis import GoodputPolicy, ReportSpec, Store, build_report
from llmslo.analysis.importers import (
    ImportFormatError,
    ImportOptions,
    convert_file,
    detect_kind,
    import_files,
)
from llmslo.analysis.importers._genai_perf import import_genai_perf
from llmslo.analysis.importers._guidellm import import_guidellm
from llmslo.analysis.importers._vllm_bench import import_vllm_bench, parse_vllm_date

REAL = Path(__file__).resolve().parent / "fixtures" / "importers_real"
HAND = Path(__file__).resolve().parent / "fixtures" / "import"
GUIDELLM = REAL / "guidellm_0.5.4_benchmarks.json"
AIPERF = REAL / "aiperf_2025-10_profile_export.jsonl"
AIPERF_SUMMARY = REAL / "aiperf_2025-10_profile_export_aiperf.json"
VLLM = REAL / "vllm_bench_serve_detailed.json"
GENAI = REAL / "genai_perf_profile_export.json"
GENAI_SUMMARY = REAL / "genai_perf_profile_export_genai_perf.json"
REL = 1e-9


def _groups(db: Path, by: tuple[str, ...]) -> dict[tuple[str, ...], dict[str, Any]]:
    with Store.open(db, read_only=True) as store:
        report = build_report(store.con, ReportSpec(GoodputPolicy(), by=by)).to_dict()
    return {tuple(str(g["keys"][k]) for k in by): g for g in report["groups"]}


def _values(db: Path, column: str, where: str, params: list[Any]) -> list[float]:
    with Store.open(db, read_only=True) as store:
        rows = store.con.sql(f"SELECT {column} FROM request_summaries WHERE {where} AND {column} IS NOT NULL "
                             f"ORDER BY {column}", params=params).fetchall()
    return [float(r[0]) for r in rows]


def _within_one_order_statistic(ours: float, theirs: float, values: list[float], q: float) -> None:
    """``theirs`` (an inverse-CDF quantile) is a sample, and ``ours`` (linear) lies within one gap of it."""
    assert any(math.isclose(theirs, v, rel_tol=REL) for v in values)
    k = math.floor(q * (len(values) - 1))
    lo, hi = max(k - 1, 0), min(k + 2, len(values) - 1)
    gap = max(b - a for a, b in zip(values[lo:hi], values[lo + 1:hi + 1], strict=True))
    assert abs(ours - theirs) <= gap + 1e-12


# ---- guidellm >= 0.5: warm-up and cool-down -------------------------------------------------------------


def test_guidellm_ttft_equals_guidellms_own_metrics(tmp_path: Path) -> None:
    doc = json.loads(GUIDELLM.read_text())
    db = tmp_path / "g.duckdb"
    import_files([GUIDELLM], "auto", db)
    groups = _groups(db, ("tenant_class",))
    assert set(groups) == {("concurrent@4",), ("concurrent@2",)}
    for bench in doc["benchmarks"]:
        theirs = bench["metrics"]["time_to_first_token_ms"]["successful"]
        tenant = f"concurrent@{bench['config']['strategy']['streams']}"
        ttft = groups[(tenant,)]["latency"]["ttft_s"]
        assert ttft["count"] == theirs["count"] == bench["metrics"]["request_totals"]["successful"]
        assert ttft["mean"] * 1000 == pytest.approx(theirs["mean"], rel=REL)
        values = [v * 1000 for v in _values(db, "ttft_s", "tenant_class = ? AND finish_reason IN ('stop', 'length')",
                                            [tenant])]
        _within_one_order_statistic(ttft["p99"] * 1000, theirs["percentiles"]["p99"], values, 0.99)
        _within_one_order_statistic(ttft["p50"] * 1000, theirs["percentiles"]["p50"], values, 0.5)


def test_guidellm_report_says_how_many_were_left_out_and_why() -> None:
    doc = json.loads(GUIDELLM.read_text())
    frame, report = import_guidellm(GUIDELLM)
    listed = sum(len(b["requests"][s]) for b in doc["benchmarks"] for s in ("successful", "errored", "incomplete"))
    counted = sum(b["metrics"]["request_totals"]["total"] for b in doc["benchmarks"])
    assert report.rows_read == listed and report.rows_imported == frame.height == counted < listed
    note = next(c for c in report.conversions if "outside guidellm's measured window" in c)
    assert note.startswith(f"{listed - counted} request(s) outside guidellm's measured window not imported")
    assert "ended before measure_start_time" in note and "started after measure_end_time" in note
    assert "--keep-warmup-cooldown" in note
    assert report.run_duration_s == pytest.approx(sum(b["duration"] for b in doc["benchmarks"]))
    assert "measured window" in report.run_duration_note


def test_guidellm_keep_warmup_cooldown_puts_them_in_their_own_tenant_classes(tmp_path: Path) -> None:
    doc = json.loads(GUIDELLM.read_text())
    db = tmp_path / "g.duckdb"
    result = import_files([GUIDELLM], "guidellm", db, ImportOptions(keep_warmup_cooldown=True))
    report = result.files[0].report
    assert report.rows_imported == report.rows_read
    groups = _groups(db, ("tenant_class",))
    assert {("warmup",), ("cooldown",)} <= set(groups)
    for bench in doc["benchmarks"]:  # the measured groups are unchanged
        tenant = f"concurrent@{bench['config']['strategy']['streams']}"
        theirs = bench["metrics"]["time_to_first_token_ms"]["successful"]
        assert groups[(tenant,)]["latency"]["ttft_s"]["mean"] * 1000 == pytest.approx(theirs["mean"], rel=REL)
    spans = sum(b["scheduler_metrics"]["request_end_time"] - b["scheduler_metrics"]["request_start_time"]
                for b in doc["benchmarks"])
    assert report.run_duration_s == pytest.approx(spans)
    assert "Kept as asked" in " ".join(report.conversions)
    window = {(b, r["request_id"]) for b, bench in enumerate(doc["benchmarks"])
              for s in ("successful", "errored", "incomplete") for r in bench["requests"][s]
              if r["request_end_time"] < bench["scheduler_metrics"]["measure_start_time"]}
    with Store.open(db, read_only=True) as store:
        warm = store.con.sql("SELECT count(*) FROM request_summaries WHERE tenant_class = 'warmup'").fetchall()
    assert warm[0][0] == len(window)


def test_guidellm_replies_that_reach_max_tokens_finish_length() -> None:
    doc = json.loads(GUIDELLM.read_text())
    frame, report = import_guidellm(GUIDELLM, keep_warmup_cooldown=True)
    expected = []
    for bench in doc["benchmarks"]:
        for rec in bench["requests"]["successful"]:
            limit = 64  # the body of every request in this file carries 'max_tokens': 64 (request_args)
            assert "'max_tokens': 64" in rec["request_args"]
            expected.append("length" if rec["output_tokens"] >= limit else "stop")
    ok = frame.filter(frame["finish_reason"].is_in(["stop", "length"]))
    assert sorted(ok["finish_reason"].to_list()) == sorted(expected)
    assert 0 < expected.count("length") < len(expected)
    assert (ok.filter(ok["finish_reason"] == "length")["generated_tokens"] >= 64).all()
    assert any("→ finish_reason length" in c for c in report.conversions)


# ---- AIPerf: both layouts, and its summary file ----------------------------------------------------------


def test_aiperf_autumn_2025_records_reproduce_aiperfs_own_summary(tmp_path: Path) -> None:
    summary = json.loads(AIPERF_SUMMARY.read_text())["records"]
    assert detect_kind(AIPERF) == "genai-perf"
    db = tmp_path / "a.duckdb"
    result = import_files([AIPERF], "auto", db)
    report = result.files[0].report
    assert report.rows_read == report.rows_imported == 100
    assert report.finish_reasons == {"client_cancel": summary["error_request_count"]["avg"],
                                     "stop": summary["request_count"]["avg"]}
    stop = _groups(db, ("finish_reason",))[("stop",)]["latency"]
    for ours, tag in ((stop["ttft_s"], "ttft"), (stop["e2e_s"], "request_latency"),
                      (stop["tpot_s"], "inter_token_latency")):
        assert ours["count"] == summary[tag]["count"], tag
        for stat in ("mean", "p50", "p90", "p99"):
            theirs = summary[tag]["avg" if stat == "mean" else stat]
            assert ours[stat] * 1000 == pytest.approx(theirs, rel=1e-6 if tag == "inter_token_latency" else REL), (
                tag, stat)  # AIPerf's ITL uses request_latency, ours ttft + Σ inter_chunk_latency (ms rounding)
    with Store.open(db, read_only=True) as store:
        tokens = store.con.sql("SELECT avg(generated_tokens) FROM request_summaries WHERE finish_reason = 'stop'"
                               ).fetchall()
    assert tokens[0][0] == pytest.approx(summary["output_sequence_length"]["avg"], rel=REL)  # reasoning included
    assert report.run_duration_s is None and "profile_export_aiperf.json" in report.run_duration_note


def test_aiperf_records_of_both_layouts_import() -> None:
    old, old_report = import_genai_perf(AIPERF)
    new, new_report = import_genai_perf(HAND / "aiperf_profile_export.jsonl")
    assert "timestamp_ns" in old_report.arrival_note and "request_start_ns" in new_report.arrival_note
    first = json.loads(AIPERF.read_text().splitlines()[0])
    assert old["arrival_unix_s"][0] == pytest.approx(first["metadata"]["timestamp_ns"] / 1e9)
    assert new.height == 5 and old.height == 100


def test_aiperf_warmup_records_are_left_out_unless_kept(tmp_path: Path) -> None:
    lines = AIPERF.read_text().splitlines()
    for i in (1, 2):  # two records of a warm-up phase, as AIPerf marks them
        rec = json.loads(lines[i])
        rec["metadata"]["credit_phase"] = "warmup"
        lines[i] = json.dumps(rec)
    path = tmp_path / "warm.jsonl"
    path.write_text("\n".join(lines) + "\n")
    frame, report = import_genai_perf(path)
    assert frame.height == 98 and any("2 warm-up record(s)" in c and "not imported" in c for c in report.conversions)
    kept, _ = import_genai_perf(path, keep_warmup_cooldown=True)
    assert kept.height == 100 and kept["tenant_class"].to_list().count("warmup") == 2


@pytest.mark.parametrize("path", [AIPERF_SUMMARY, GENAI_SUMMARY], ids=["aiperf-records", "genai-perf"])
def test_summary_exports_are_refused_as_statistics_only(path: Path) -> None:
    assert detect_kind(path) == "genai-perf"
    for kind in ("auto", "genai-perf"):
        with pytest.raises(ImportFormatError) as info:
            convert_file(path, kind)
        message = str(info.value)
        assert "summary statistics only, no per-request records" in message, message
        assert "profile_export.jsonl" in message and str(path) in message


def test_a_missing_nanosecond_timestamp_is_named_in_nanoseconds(tmp_path: Path) -> None:
    rec = json.loads(AIPERF.read_text().splitlines()[3])
    del rec["metadata"]["timestamp_ns"]
    path = tmp_path / "no_start.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    with pytest.raises(ImportFormatError) as info:
        import_genai_perf(path)
    message = str(info.value)
    assert "record 1, field metadata.request_start_ns" in message
    assert "nanoseconds" in message and "seconds)" not in message.replace("nanoseconds)", "")
    genai = json.loads(GENAI.read_text())
    genai["experiments"][0]["requests"][0]["timestamp"] = "soon"
    (tmp_path / "g.json").write_text(json.dumps(genai))
    with pytest.raises(ImportFormatError, match="must be a finite number of nanoseconds"):
        import_genai_perf(tmp_path / "g.json")


# ---- vLLM bench ------------------------------------------------------------------------------------------


def test_vllm_detailed_result_reproduces_vllms_own_ttft_and_e2el(tmp_path: Path) -> None:
    doc = json.loads(VLLM.read_text())
    db = tmp_path / "v.duckdb"
    result = import_files([VLLM], "auto", db)
    report = result.files[0].report
    assert report.finish_reasons == {"error": doc["failed"], "stop": doc["completed"]}
    assert report.run_duration_s == doc["duration"] and "'duration'" in report.run_duration_note
    stop = _groups(db, ("finish_reason",))[("stop",)]["latency"]
    assert stop["ttft_s"]["count"] == doc["completed"]
    for ours, name in ((stop["ttft_s"], "ttft"), (stop["e2e_s"], "e2el")):
        assert ours["mean"] * 1000 == pytest.approx(doc[f"mean_{name}_ms"], rel=REL)
        assert ours["p50"] * 1000 == pytest.approx(doc[f"median_{name}_ms"], rel=REL)
        assert ours["p99"] * 1000 == pytest.approx(doc[f"p99_{name}_ms"], rel=REL)


@pytest.mark.parametrize(("date", "end_unix_s"), [
    ("20251014-093015", 1_760_434_215.0),
    ("2025-10-14T09:30:15Z", 1_760_434_215.0),
    ("2025-10-14T11:30:15+02:00", 1_760_434_215.0),
    ("2025-10-14T09:30:15.250Z", 1_760_434_215.25),
    ("2025-10-14T09:30:15", 1_760_434_215.0),
])
def test_vllm_dates_of_both_forms_anchor_the_arrivals(tmp_path: Path, date: str, end_unix_s: float) -> None:
    doc = json.loads(VLLM.read_text())
    doc["date"] = date
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc))
    frame, report = import_vllm_bench(path)
    assert min(frame["arrival_unix_s"]) == pytest.approx(end_unix_s - doc["duration"])
    assert repr(date) in report.arrival_note
    parsed = parse_vllm_date(date)
    assert parsed is not None and ("read as UTC" in parsed[1]) == (date[-1].isdigit() and "+" not in date)


def test_an_unreadable_vllm_date_is_said_and_anchors_nothing(tmp_path: Path) -> None:
    doc = json.loads(VLLM.read_text())
    doc["date"] = "Tuesday"
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc))
    frame, report = import_vllm_bench(path)
    assert "'Tuesday' is neither YYYYMMDD-HHMMSS nor ISO 8601" in report.arrival_note
    assert min(frame["arrival_unix_s"]) == 0.0


# ---- GenAI-Perf ------------------------------------------------------------------------------------------


def test_genai_perf_ttft_matches_its_summary_and_max_tokens_gives_length(tmp_path: Path) -> None:
    summary = json.loads(GENAI_SUMMARY.read_text())["time_to_first_token"]
    db = tmp_path / "gp.duckdb"
    result = import_files([GENAI], "auto", db)
    report = result.files[0].report
    ttft = _groups(db, ("model",))[("llama-3.1-8b-instruct",)]["latency"]["ttft_s"]  # every request succeeded
    assert ttft["mean"] * 1000 == pytest.approx(summary["avg"], rel=REL)
    assert ttft["p50"] * 1000 == pytest.approx(summary["p50"], rel=REL)
    assert ttft["p99"] * 1000 == pytest.approx(summary["p99"], rel=REL)
    doc = json.loads(GENAI.read_text())
    expected = {"length": 0, "stop": 0}
    for exp in doc["experiments"]:
        for req in exp["requests"]:
            limit = json.loads(req["request_inputs"]["payload"])["max_tokens"]
            usage = json.loads(req["response_outputs"][-2]["response"][len("data: "):])["usage"]
            expected["length" if usage["completion_tokens"] >= limit else "stop"] += 1
    assert report.finish_reasons == expected and expected["length"] > 0
    assert report.run_duration_s is None and report.run_duration_note
