"""The schedules llmslo writes (``llmslo import azure|mooncake|burstgpt``, ``llmslo trace … --out``) replay with
``llmslo load URL --schedule FILE``, as the import and the trace command say, run as a person runs them: the
installed command, from a working folder of their own, relative paths. A file that is not such a schedule exits 1
naming the file, the column and the fix; flags that would reshape the schedule exit 2 before anything is read."""

from __future__ import annotations

import csv
import os
import re
import shlex
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from typer.testing import CliRunner

from llmslo.cli._app import app
from llmslo.tests._loadgen_server import ServerProcess
from llmslo.tests._loadgen_util import attempts_log, llmslo

pytestmark = pytest.mark.integration
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "traces"
REAL = Path(os.environ.get("LLMSLO_REAL_DATA", Path(__file__).resolve().parents[2] / "shared" / "real_data"))
AZURE = REAL / "azure" / "AzureLLMInferenceTrace_conv.csv"
REPLAY = re.compile(r"`(llmslo load URL --schedule [^`]+)`")
"""The replay command the import and the trace command print (URL is the reader's server)."""


def _replay(said: str, url: str) -> list[str]:
    """The arguments of the replay command in ``said``, as a person pastes it with their server's URL."""
    found = REPLAY.search(" ".join(said.split()))
    assert found is not None, said
    words = shlex.split(found.group(1))
    assert words[:3] == ["llmslo", "load", "URL"], words
    return ["load", url, *words[3:]]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess() as srv:
        yield srv


def _azure_rows(path: Path, n: int) -> list[tuple[float, int, int]]:
    """(offset from the first arrival in s, ContextTokens, GeneratedTokens) of the first ``n`` rows, read here
    with the standard library (the real file is in time order)."""
    rows: list[tuple[float, int, int]] = []
    with path.open(newline="") as fh:
        for record in csv.DictReader(fh):
            stamp = record["TIMESTAMP"]
            whole, _, frac = stamp.partition(".")
            t = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp() + float("0." + frac)
            rows.append((t, int(record["ContextTokens"]), int(record["GeneratedTokens"])))
            if len(rows) == n:
                break
    first = rows[0][0]
    return [(t - first, p, o) for t, p, o in rows]


def _follows(entries: list[dict[str, Any]], offsets: list[float], prompts: list[int], outputs: list[int]) -> None:
    """The attempts were scheduled at the file's offsets, sent on time, with the file's lengths."""
    by_index = sorted(entries, key=lambda e: int(e["index"]))
    assert [e["index"] for e in by_index] == list(range(len(offsets)))
    assert [e["scheduled_offset_s"] for e in by_index] == pytest.approx(offsets, abs=1e-6)
    start = by_index[0]["scheduled_ns"] - round(offsets[0] * 1e9)  # the run's start, client monotonic clock
    assert [(e["scheduled_ns"] - start) / 1e9 for e in by_index] == pytest.approx(offsets, abs=1e-6)
    late = [e["late_s"] for e in by_index]
    assert all(s is not None and 0 <= s < 1.0 for s in late), late  # sent at the scheduled time
    assert [e["prompt_words"] for e in by_index] == [max(1, p) for p in prompts]
    assert [e["max_tokens"] for e in by_index] == [max(1, o) for o in outputs]


# ---- what a person runs ----------------------------------------------------------------------------------


def test_the_schedule_an_azure_import_writes_replays_with_the_command_it_prints(tmp_path: Path,
                                                                                server: ServerProcess) -> None:
    if not AZURE.is_file():
        pytest.skip(f"real data missing: {AZURE} (see ../shared/real_data/README.md)")
    imported = llmslo("import", "azure", str(AZURE), "--db", "s.duckdb", cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
    replay = _replay(imported.stdout, server.url())  # the import names the exact command
    schedule = "s.AzureLLMInferenceTrace_conv.schedule.parquet"
    assert replay == ["load", server.url(), "--schedule", schedule] and (tmp_path / schedule).is_file()

    ran = llmslo(*replay, "--max-requests", "20", "--attempts-log", "attempts.jsonl", "--no-progress", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0].startswith(f"target: {server.url()}")
    assert lines[1].startswith(f"schedule: schedule file {schedule}, replayed as written (offsets and lengths; "
                               "19,366 arrivals in the file): 20 arrivals over "), lines[1]
    expected = _azure_rows(AZURE, 20)
    entries = attempts_log(tmp_path / "attempts.jsonl")
    _follows(entries, [o for o, _, _ in expected], [p for _, p, _ in expected], [o for _, _, o in expected])
    for e in entries:  # what the server got: the trace's lengths
        body = server.stats(e["request_id"])["body"]
        assert (len(body["prompt"].split()), body["max_tokens"]) == (e["prompt_words"], e["max_tokens"])


@pytest.mark.parametrize("suffix", ["parquet", "jsonl"])
def test_a_schedule_written_by_trace_out_replays_as_written(tmp_path: Path, server: ServerProcess,
                                                             suffix: str) -> None:
    trace = tmp_path / "traces" / "mooncake_small.jsonl"
    trace.parent.mkdir()
    trace.write_bytes((FIXTURES / "mooncake_small.jsonl").read_bytes())
    written = llmslo("trace", "mooncake", "traces/mooncake_small.jsonl", "--out", f"sched.{suffix}", cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    replay = _replay(written.stdout, server.url())
    assert replay == ["load", server.url(), "--schedule", f"sched.{suffix}"]

    ran = llmslo(*replay, "--attempts-log", "a.jsonl", "--no-progress", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[1].startswith(f"schedule: schedule file sched.{suffix}, replayed as written")
    assert "note: prefix_ids (5 arrivals) are not replayed" in " ".join(ran.stdout.split())
    _follows(attempts_log(tmp_path / "a.jsonl"), [0.0, 0.0, 1.5, 2.0, 4.0], [1000, 600, 1024, 300, 1536],
             [10, 20, 5, 7, 1])


def test_duration_cuts_a_schedule_short_and_zero_lengths_are_sent_as_one(tmp_path: Path,
                                                                          server: ServerProcess) -> None:
    written = llmslo("trace", "azure", str(FIXTURES / "azure_small.csv"), "--out", "s.parquet", cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    ran = llmslo("load", server.url(), "--schedule", "s.parquet", "--duration", "10s", "--attempts-log", "a.jsonl",
                 "--no-progress", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "the schedule records 1 output length(s) of 0 tokens: sent as 1 token" in " ".join(ran.stdout.split())
    _follows(attempts_log(tmp_path / "a.jsonl"), [0.0, 1e-7, 0.5, 3.0], [374, 396, 879, 100], [44, 109, 55, 0])


# ---- files that are not such a schedule, and flags that make no sense with one ---------------------------------


def load(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["load", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, " ".join(result.stderr.split())


UNREACHABLE = "http://127.0.0.1:9"
"""Never reached: the schedule is read, and refused, before the target is probed."""


def _schedule(**columns: pl.Series) -> pl.DataFrame:
    base = {"offset_s": pl.Series([0.0, 0.5, 1.0]), "input_tokens": pl.Series([3, 4, 5]),
            "output_tokens": pl.Series([6, 7, 8])}
    return pl.DataFrame({**base, **columns})


def test_a_file_without_a_schedule_column_names_the_file_the_column_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "sched.parquet"
    _schedule().drop("output_tokens").write_parquet(path)
    code, _, err = load(UNREACHABLE, "--schedule", str(path))
    assert code == 1
    assert err.startswith(f"error: --schedule: {path}: column 'output_tokens' is missing"), err
    assert "the file has offset_s, input_tokens" in err
    assert "llmslo trace KIND TRACE --out FILE.parquet" in err and "llmslo import KIND TRACE --db STORE" in err


@pytest.mark.parametrize(("column", "values", "said"), [
    ("input_tokens", pl.Series(["3", "4", "5"]), "column 'input_tokens' is String; expected whole numbers of tokens"),
    ("output_tokens", pl.Series([6.0, 7.0, 8.0]), "column 'output_tokens' is Float64; expected whole numbers"),
    ("offset_s", pl.Series(["0", "1", "2"]), "column 'offset_s' is String; expected seconds after the start"),
])
def test_a_column_of_the_wrong_type_is_named_with_its_type(tmp_path: Path, column: str, values: pl.Series,
                                                           said: str) -> None:
    path = tmp_path / "sched.parquet"
    _schedule(**{column: values}).write_parquet(path)
    code, _, err = load(UNREACHABLE, "--schedule", str(path))
    assert code == 1 and f"{path}: {said}" in err, err


@pytest.mark.parametrize(("columns", "said"), [
    ({"offset_s": pl.Series([0.0, 2.0, 1.0])}, "row 3: offset_s 1.0 is before the previous arrival"),
    ({"offset_s": pl.Series([0.0, float("nan"), 1.0])}, "row 2: offset_s nan is not a finite number"),
    ({"offset_s": pl.Series([-1.0, 0.0, 1.0])}, "row 1: offset_s -1.0 is negative"),
    ({"input_tokens": pl.Series([3, None, 5])}, "row 2: input_tokens is empty"),
    ({"output_tokens": pl.Series([6, -7, 8])}, "row 2: output_tokens -7 is negative"),
])
def test_a_bad_value_names_its_row(tmp_path: Path, columns: dict[str, pl.Series], said: str) -> None:
    path = tmp_path / "sched.parquet"
    _schedule(**columns).write_parquet(path)
    code, _, err = load(UNREACHABLE, "--schedule", str(path))
    assert code == 1 and f"{path}: {said}" in err, err


def test_a_trace_a_store_export_or_another_file_given_as_a_schedule_says_what_it_is(tmp_path: Path) -> None:
    code, _, err = load(UNREACHABLE, "--schedule", str(FIXTURES / "azure_small.csv"))
    assert code == 1 and f"{FIXTURES / 'azure_small.csv'}: an azure trace, not an arrival schedule" in err, err
    assert f"--trace-kind azure {FIXTURES / 'azure_small.csv'}" in err

    summaries = tmp_path / "rows.parquet"
    pl.DataFrame({"request_id": ["a"], "arrival_unix_s": [1.0], "ttft_s": [0.1]}).write_parquet(summaries)
    code, _, err = load(UNREACHABLE, "--schedule", str(summaries))
    assert code == 1 and "holds request summaries (llmslo ingest loads them), not an arrival schedule" in err, err

    for name, content in (("junk.bin", b"\x00\x01garbage"), ("empty.parquet", b"")):
        (tmp_path / name).write_bytes(content)
        code, _, err = load(UNREACHABLE, "--schedule", str(tmp_path / name))
        assert code == 1 and f"{tmp_path / name}: " in err and "Parquet" in err and "JSON lines" in err, err

    empty = tmp_path / "none.parquet"
    _schedule().head(0).write_parquet(empty)
    code, _, err = load(UNREACHABLE, "--schedule", str(empty))
    assert code == 1 and f"{empty}: the schedule holds no arrivals" in err, err

    code, _, err = load(UNREACHABLE, "--schedule", str(tmp_path / "missing.parquet"))
    assert code == 1 and f"--schedule: no such file {tmp_path / 'missing.parquet'}" in err, err


def test_a_schedule_given_as_a_trace_points_to_schedule(tmp_path: Path) -> None:
    path = tmp_path / "s.azure_small.schedule.parquet"
    _schedule().write_parquet(path)
    code, _, err = load(UNREACHABLE, "--trace-kind", "azure", str(path))
    assert code == 1 and "not UTF-8" not in err, err
    assert f"{path}: a Parquet file, not an azure trace" in err
    assert f"llmslo load URL --schedule {path}" in err


@pytest.mark.parametrize(("args", "flag"), [
    (["--rate", "5"], "--rate"),
    (["--arrivals", "gamma"], "--arrivals"),
    (["--burstiness", "2"], "--burstiness"),
    (["--burst", "3x@1s+1s"], "--burst"),
    (["--ramp", "10s"], "--ramp"),
    (["--prompt-tokens", "10"], "--prompt-tokens"),
    (["--output-tokens", "10"], "--output-tokens"),
    (["--trace-kind", "azure", "t.csv"], "--trace-kind"),
])
def test_flags_that_would_reshape_a_schedule_exit_2_before_it_is_read(tmp_path: Path, args: list[str],
                                                                      flag: str) -> None:
    db = tmp_path / "client.duckdb"
    code, _, err = load(UNREACHABLE, "--schedule", str(tmp_path / "never-read.parquet"), *args, "--db", str(db))
    assert code == 2 and err.startswith(f"error: {flag}: "), err
    assert "--schedule" in err and "as written" in err
    assert not db.exists()
