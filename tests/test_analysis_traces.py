"""Production traces become one arrival schedule and a load summary; malformed files name file, line, field.

Fixtures in ``tests/fixtures/traces`` are hand-written (see its README): the Azure and Mooncake layouts of
the published traces, and BurstGPT's documented columns (no BurstGPT file is kept here). Real-data tests
read ``../shared/real_data`` and skip when it is missing.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import typer
from typer.testing import CliRunner

from llmslo.analysis.importers import ImportOptions, detect_kind, importer_for, schedule_path
from llmslo.analysis.workload._traces import (
    SCHEDULE_SCHEMA,
    TRACE_KINDS,
    TRACE_NOTE,
    TraceFormatError,
    detect_trace_kind,
    read_trace,
    summarize_schedule,
)
from llmslo.cli._traces import trace_command

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "traces"
REAL = Path(__file__).resolve().parents[2] / "shared" / "real_data"


def _real(relative: str) -> Path:
    path = REAL / relative
    if not path.is_file():
        pytest.skip(f"real data not available: {path} (../shared/real_data is missing)")
    return path


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---------------------------------------------------------------------------------------------------
# the schedule format


@pytest.mark.parametrize(("kind", "name"), [
    ("azure", "azure_small.csv"), ("mooncake", "mooncake_small.jsonl"), ("burstgpt", "burstgpt_small.csv"),
])
def test_every_trace_kind_gives_the_same_schedule_columns_starting_at_zero(kind: str, name: str) -> None:
    schedule, summary = read_trace(kind, FIXTURES / name)
    assert list(schedule.columns)[:4] == list(SCHEDULE_SCHEMA)
    assert dict(schedule.schema) == {**SCHEDULE_SCHEMA, **({"source_model": pl.String()} if kind == "burstgpt"
                                                           else {})}
    offsets = schedule["offset_s"].to_list()
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    assert summary.kind == kind and summary.requests == schedule.height == 5


def test_azure_timestamps_keep_seven_fractional_digits_and_are_read_as_utc() -> None:
    schedule, summary = read_trace("azure", FIXTURES / "azure_small.csv")
    assert schedule["offset_s"][1] == pytest.approx(1e-7, abs=1e-12)
    assert schedule["offset_s"].to_list()[2:] == pytest.approx([0.5, 3.0, 60.0])
    assert summary.start_unix_s == pytest.approx(
        datetime(2023, 11, 16, 18, 15, 46, 680590, tzinfo=UTC).timestamp(), abs=1e-6)
    assert schedule["prefix_ids"].null_count() == 5 and "source_model" not in schedule.columns
    assert summary.zero_output_requests == 1


def test_mooncake_prefix_ids_and_sharing_are_counted_in_arrival_order() -> None:
    schedule, summary = read_trace("mooncake", FIXTURES / "mooncake_small.jsonl")
    assert schedule["offset_s"].to_list() == [0.0, 0.0, 1.5, 2.0, 4.0]
    assert schedule["prefix_ids"].to_list()[2] == [0, 1]
    p = summary.prefix
    assert p is not None
    # first blocks 0, 0, 0, 3, 3: requests 2, 3 and 5 share theirs with an earlier request
    assert p.first_block_shared_fraction == pytest.approx(3 / 5)
    # longest already-seen prefixes: 0, 1 ([0]), 2 ([0, 1]), 0, 1 ([3]) of 2 + 2 + 2 + 1 + 3 blocks
    assert p.prefix_block_hit_fraction == pytest.approx(4 / 10)
    assert (p.blocks_total, p.unique_blocks, p.block_tokens) == (10, 6, 512)
    assert summary.notes == ()


def test_burstgpt_fixture_keeps_the_model_and_counts_failed_requests() -> None:
    schedule, summary = read_trace("burstgpt", FIXTURES / "burstgpt_small.csv")
    assert schedule["offset_s"].to_list() == [0.0, 40.0, 113.0, 113.0, 125.0]
    assert schedule["source_model"].to_list() == ["ChatGPT", "ChatGPT", "GPT-4", "ChatGPT", "GPT-4"]
    assert summary.models == {"ChatGPT": 3, "GPT-4": 2}
    assert summary.zero_output_requests == 1
    assert summary.prefix is None and summary.start_unix_s is None


def test_summary_figures_match_a_hand_computed_schedule() -> None:
    # gaps 1, 1, 1, 7 -> mean 2.5, population sd sqrt(((1.5**2) * 3 + 4.5**2) / 4)
    offsets = [0.0, 1.0, 2.0, 3.0, 10.0]
    frame = pl.DataFrame({
        "offset_s": offsets, "input_tokens": [10, 20, 30, 40, 50], "output_tokens": [1, 2, 3, 4, 100],
        "prefix_ids": [None] * 5,
    }, schema=dict(SCHEDULE_SCHEMA))
    s = summarize_schedule(frame, kind="test", source="hand", bucket_s=5.0)
    assert s.duration_s == 10.0 and s.mean_rate_per_s == pytest.approx(0.5)
    assert s.interarrival_cv == pytest.approx(math.sqrt((1.5**2 * 3 + 4.5**2) / 4) / 2.5)
    assert [(b.start_s, b.requests) for b in s.rate_over_time] == [(0.0, 4), (5.0, 0), (10.0, 1)]
    assert s.rate_over_time[0].rate_per_s == pytest.approx(0.8)
    assert s.peak_to_mean_1s == pytest.approx(1.0 / 0.5)  # busiest second holds 1 request
    assert s.peak_to_mean_60s == pytest.approx((5 / 60) / 0.5)
    assert s.input_tokens.p50 == 30.0 and s.input_tokens.p90 == pytest.approx(46.0)
    assert s.output_tokens.max == 100 and s.output_tokens.p99 == pytest.approx(np.quantile([1, 2, 3, 4, 100], 0.99))


def test_a_single_request_has_no_rate_and_no_burstiness() -> None:
    frame = pl.DataFrame({"offset_s": [0.0], "input_tokens": [5], "output_tokens": [1], "prefix_ids": [None]},
                         schema=dict(SCHEDULE_SCHEMA))
    s = summarize_schedule(frame, kind="test", source="one")
    assert (s.duration_s, s.mean_rate_per_s, s.interarrival_cv, s.peak_to_mean_1s) == (0.0, None, None, None)


def test_rows_out_of_time_order_are_sorted_and_the_summary_says_so(tmp_path: Path) -> None:
    path = _write(tmp_path, "t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                  "2023-11-16 18:00:02.0000000,2,2\n2023-11-16 18:00:00.0000000,1,1\n"
                  "2023-11-16 18:00:03.0000000,3,3\n")
    schedule, summary = read_trace("azure", path)
    assert schedule["input_tokens"].to_list() == [1, 2, 3]
    assert schedule["offset_s"].to_list() == [0.0, 2.0, 3.0]
    assert any("sorted by arrival" in n for n in summary.notes)


def test_summary_json_is_serialisable_and_says_a_trace_is_not_request_summaries() -> None:
    _, summary = read_trace("mooncake", FIXTURES / "mooncake_small.jsonl")
    doc = json.loads(json.dumps(summary.to_dict()))
    assert doc["what"] == TRACE_NOTE and "not request summaries" in doc["what"]
    assert doc["prefix"]["block_tokens"] == 512 and doc["rate_over_time"][0]["requests"] == 5


@pytest.mark.parametrize(("name", "kind"), [
    ("azure_small.csv", "azure"), ("mooncake_small.jsonl", "mooncake"), ("burstgpt_small.csv", "burstgpt"),
])
def test_detect_trace_kind_recognises_each_format_and_auto_reads_it(name: str, kind: str) -> None:
    assert detect_trace_kind(FIXTURES / name) == kind
    assert read_trace("auto", FIXTURES / name)[1].kind == kind


def test_unknown_kind_and_unrecognised_file_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown trace kind 'sharegpt'"):
        read_trace("sharegpt", FIXTURES / "azure_small.csv")
    other = _write(tmp_path, "x.csv", "a,b\n1,2\n")
    assert detect_trace_kind(other) is None
    with pytest.raises(TraceFormatError, match="not recognised as any trace kind"):
        read_trace("auto", other)


# ---------------------------------------------------------------------------------------------------
# malformed files: file, line and field named, nothing returned

AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_OK = "2023-11-16 18:15:46.6805900,374,44\n"
BURST_HEAD = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
BURST_OK = "5,ChatGPT,472,18,490,Conversation log\n"


@pytest.mark.parametrize(("kind", "text", "line", "field", "expected"), [
    ("azure", AZURE_HEAD + AZURE_OK + "2023-11-16 18:15:47,abc,3\n", 3, "ContextTokens", "whole number"),
    ("azure", AZURE_HEAD + AZURE_OK + AZURE_OK + "2023-11-16 18:15:47,10,-3\n", 4, "GeneratedTokens", "non-negative"),
    ("azure", AZURE_HEAD + AZURE_OK + "2023-11-16 18:15:47,10.5,3\n", 3, "ContextTokens", "whole number"),
    ("azure", AZURE_HEAD + "16/11/2023 18:15,10,3\n", 2, "TIMESTAMP", "expected a time"),
    ("azure", AZURE_HEAD + AZURE_OK + "2023-11-16 18:15:47,,3\n", 3, "ContextTokens", "whole number"),
    ("azure", "TIMESTAMP,Context,GeneratedTokens\n" + AZURE_OK, 1, "ContextTokens", "did you mean 'Context'"),
    ("azure", AZURE_HEAD + AZURE_OK + "2023-11-16 18:15:47,10,3,9\n", 3, None, "expected 3 fields"),
    ("burstgpt", BURST_HEAD + BURST_OK + "-1,ChatGPT,1,1,2,API log\n", 3, "Timestamp", "non-negative"),
    ("burstgpt", BURST_HEAD + BURST_OK + "7,,1,1,2,API log\n", 3, "Model", "model name"),
    ("burstgpt", BURST_HEAD + BURST_OK + "7,GPT-4,1,x,2,API log\n", 3, "Response tokens", "whole number"),
    ("mooncake", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1, "input_len\n',
     2, None, "not a JSON object"),
    ("mooncake", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n[1, 2]\n', 2, None, "JSON object"),
    ("mooncake", '{"timestamp": "0", "input_length": 5, "output_length": 1}\n', 1, "timestamp", "milliseconds"),
    ("mooncake", '\n{"timestamp": 3, "output_length": 1}\n', 2, "input_length", "missing"),
    ("mooncake", '{"timestamp": 3, "input_length": -5, "output_length": 1}\n', 1, "input_length", "whole number"),
    ("mooncake", '{"timestamp": 3, "input_length": 5, "output_length": true}\n', 1, "output_length", "whole number"),
    ("mooncake", '{"timestamp": 3, "input_length": 5, "output_length": 1, "hash_ids": [1, "a"]}\n', 1, "hash_ids",
     "integer block hashes"),
])
def test_malformed_trace_names_file_line_and_field(tmp_path: Path, kind: str, text: str, line: int,
                                                   field: str | None, expected: str) -> None:
    path = _write(tmp_path, f"bad.{'jsonl' if kind == 'mooncake' else 'csv'}", text)
    with pytest.raises(TraceFormatError) as info:
        read_trace(kind, path)
    err = info.value
    assert (err.source, err.line, err.field) == (str(path), line, field)
    message = str(err)
    assert str(path) in message and f"line {line}" in message and expected in message
    assert message.endswith("nothing was read") or "more line(s)" in message


def test_malformed_csv_counts_the_other_bad_lines(tmp_path: Path) -> None:
    path = _write(tmp_path, "bad.csv", AZURE_HEAD + "2023-11-16 18:15:47,x,3\n2023-11-16 18:15:48,y,3\n" + AZURE_OK)
    with pytest.raises(TraceFormatError, match=r"line 2, field 'ContextTokens'.*\(1 more line\(s\) have problems\)"):
        read_trace("azure", path)


@pytest.mark.parametrize(("kind", "text", "expected"), [
    ("azure", "", "empty"),
    ("azure", AZURE_HEAD, "no requests"),
    ("mooncake", "\n\n", "no requests"),
])
def test_empty_traces_are_refused(tmp_path: Path, kind: str, text: str, expected: str) -> None:
    with pytest.raises(TraceFormatError, match=expected):
        read_trace(kind, _write(tmp_path, "empty.txt", text))


def test_blank_lines_in_a_csv_are_skipped_and_line_numbers_stay_true(tmp_path: Path) -> None:
    path = _write(tmp_path, "t.csv", AZURE_HEAD + AZURE_OK + "\n" + "2023-11-16 18:15:49,oops,1\n\n")
    with pytest.raises(TraceFormatError) as info:
        read_trace("azure", path)
    assert info.value.line == 4


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="no such file"):
        read_trace("mooncake", tmp_path / "absent.jsonl")


# ---------------------------------------------------------------------------------------------------
# real data


def test_azure_conversation_trace_reads_all_19366_requests() -> None:
    schedule, s = read_trace("azure", _real("azure/AzureLLMInferenceTrace_conv.csv"))
    assert s.requests == schedule.height == 19_366
    assert schedule["offset_s"].is_sorted() and schedule["offset_s"][0] == 0.0
    assert datetime.fromtimestamp(s.start_unix_s or 0, UTC).isoformat().startswith("2023-11-16T18:15:46.6805")
    assert 3_400 < s.duration_s < 3_600 and s.mean_rate_per_s == pytest.approx(s.requests / s.duration_s)
    assert s.interarrival_cv is not None and s.interarrival_cv > 1.0  # burstier than Poisson
    assert s.peak_to_mean_1s is not None and s.peak_to_mean_60s is not None
    assert s.peak_to_mean_1s > s.peak_to_mean_60s > 1.0
    assert sum(b.requests for b in s.rate_over_time) == 19_366
    assert s.input_tokens.p50 <= s.input_tokens.p90 <= s.input_tokens.p99 <= s.input_tokens.max
    assert s.notes == ()


def test_azure_code_trace_reads_all_8819_requests_and_is_burstier_than_conversation() -> None:
    _, code = read_trace("azure", _real("azure/AzureLLMInferenceTrace_code.csv"))
    _, conv = read_trace("azure", _real("azure/AzureLLMInferenceTrace_conv.csv"))
    assert code.requests == 8_819
    assert code.interarrival_cv is not None and conv.interarrival_cv is not None
    assert code.interarrival_cv > conv.interarrival_cv
    assert code.output_tokens.p50 < conv.output_tokens.p50  # code completions are short


def test_mooncake_conversation_trace_reads_12031_requests_with_shared_prefixes() -> None:
    schedule, s = read_trace("mooncake", _real("mooncake/conversation_trace.jsonl"))
    assert s.requests == schedule.height == 12_031
    assert schedule["prefix_ids"].null_count() == 0
    p = s.prefix
    assert p is not None and p.requests_with_prefix_ids == 12_031 and p.block_tokens == 512
    assert p.first_block_shared_fraction is not None and p.first_block_shared_fraction > 0.99
    assert p.prefix_block_hit_fraction is not None and 0.0 < p.prefix_block_hit_fraction < 1.0
    assert s.notes == ()  # every request has ceil(input_length / 512) blocks
    assert 3_400 < s.duration_s < 3_600


# ---------------------------------------------------------------------------------------------------
# ``llmslo import KIND``: trace kinds are registered and produce a schedule, not request summaries


@pytest.mark.parametrize(("name", "kind"), [
    ("azure_small.csv", "azure"), ("mooncake_small.jsonl", "mooncake"), ("burstgpt_small.csv", "burstgpt"),
])
def test_import_registry_recognises_trace_files(name: str, kind: str) -> None:
    assert detect_kind(FIXTURES / name) == kind
    importer = importer_for(kind)
    assert importer.convert is None and importer.run is not None
    assert "arrival schedule, not request summaries" in importer.description


def test_importing_traces_writes_schedules_beside_the_store_and_no_summaries(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    run = importer_for("burstgpt").run
    assert run is not None
    [report] = run([FIXTURES / "burstgpt_small.csv"], db, ImportOptions(model="ignored"))
    written = schedule_path(db, FIXTURES / "burstgpt_small.csv")
    assert written == tmp_path / "s.burstgpt_small.schedule.parquet" and written.is_file()
    assert pl.read_parquet(written).equals(read_trace("burstgpt", FIXTURES / "burstgpt_small.csv")[0])
    assert (report.kind, report.rows_read, report.rows_imported) == ("burstgpt", 5, 5)
    assert TRACE_NOTE in report.conversions[0] and str(written) in report.conversions[0]
    assert any("--model is ignored" in c for c in report.conversions)
    assert {"ttft_s", "e2e_s", "finish_reason"} <= set(report.missing_fields)
    assert not db.exists()  # nothing goes into the store


def test_importing_a_malformed_trace_writes_nothing(tmp_path: Path) -> None:
    bad = _write(tmp_path, "bad.csv", AZURE_HEAD + "2023-11-16 18:15:47,x,3\n")
    run = importer_for("azure").run
    assert run is not None and set(TRACE_KINDS) == {"azure", "mooncake", "burstgpt"}
    with pytest.raises(TraceFormatError, match="line 2"):
        run([FIXTURES / "azure_small.csv", bad], tmp_path / "s.duckdb", ImportOptions())
    assert not list(tmp_path.glob("*.parquet"))


# ---------------------------------------------------------------------------------------------------
# the command


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("trace")(trace_command)
    app.command("noop")(lambda: None)
    return app


def test_trace_command_prints_json_and_writes_a_parquet_schedule(tmp_path: Path) -> None:
    out = tmp_path / "schedule.parquet"
    res = CliRunner().invoke(_app(), ["trace", "burstgpt", str(FIXTURES / "burstgpt_small.csv"), "--json",
                                      "--out", str(out), "--bucket", "1m"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["requests"] == 5 and doc["bucket_s"] == 60.0 and doc["schedule_written_to"] == str(out)
    written = pl.read_parquet(out)
    assert written.equals(read_trace("burstgpt", FIXTURES / "burstgpt_small.csv")[0])


def test_trace_command_prints_a_readable_summary() -> None:
    res = CliRunner().invoke(_app(), ["trace", "mooncake", str(FIXTURES / "mooncake_small.jsonl")])
    assert res.exit_code == 0, res.stderr
    assert "arrival schedule" in res.stdout and "prefix blocks of 512 tokens" in res.stdout
    assert "inter-arrival CV" in res.stdout


@pytest.mark.parametrize(("args", "expected"), [
    (["trace", "sharegpt", "x"], "unknown trace kind"),
    (["trace", "azure", "x.csv", "--bucket", "soon"], "--bucket"),
    (["trace", "azure", "x.csv", "--out", "s.txt"], "--out"),
])
def test_trace_command_refuses_bad_arguments_with_exit_code_2(args: list[str], expected: str) -> None:
    res = CliRunner().invoke(_app(), args)
    assert res.exit_code == 2 and expected in res.stderr


def test_trace_command_reports_a_malformed_file_with_exit_code_1(tmp_path: Path) -> None:
    bad = _write(tmp_path, "bad.csv", AZURE_HEAD + "2023-11-16 18:15:47,x,3\n")
    res = CliRunner().invoke(_app(), ["trace", "azure", str(bad)])
    assert res.exit_code == 1 and "line 2" in res.stderr and "ContextTokens" in res.stderr
