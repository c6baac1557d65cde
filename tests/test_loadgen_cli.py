"""``llmslo load`` as a person runs it: bad flags exit 2 naming the flag (nothing created), an unreachable target
exits 1 (nothing created), a run writes one summary per attempt to the store and prints the vllm-bench-style
table beside the report (or one JSON object), SIGTERM stops it without losing a summary, a real trace
replays; data from the server is shown literally."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmslo.cli._app import app
from llmslo.tests._loadgen_server import ServerProcess

pytestmark = pytest.mark.integration
REAL = Path(os.environ.get("LLMSLO_REAL_DATA", Path(__file__).resolve().parents[2] / "shared" / "real_data"))
AZURE = REAL / "azure" / "AzureLLMInferenceTrace_conv.csv"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess() as srv:
        yield srv


def load(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["load", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _store_rows(db: Path) -> list[dict[str, object]]:
    from llmslo.analysis.store import SUMMARY_TABLE, Store

    with Store.open(db, read_only=True) as store:
        frame = store.con.sql(f"SELECT * FROM {SUMMARY_TABLE} ORDER BY request_id").pl()
    rows: list[dict[str, object]] = frame.to_dicts()
    return rows


# ---- bad flags -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "flag"), [
    ([], "--rate"),
    (["--rate", "0", "--max-requests", "5"], "--rate"),
    (["--rate", "5"], "--duration"),
    (["--rate", "5", "--max-requests", "0"], "--max-requests"),
    (["--rate", "5", "--duration", "soon"], "--duration"),
    (["--rate", "5", "--max-requests", "5", "--arrivals", "uniform"], "--arrivals"),
    (["--rate", "5", "--max-requests", "5", "--arrivals", "gamma"], "--burstiness"),
    (["--rate", "5", "--max-requests", "5", "--burstiness", "2"], "--burstiness"),
    (["--rate", "5", "--max-requests", "5", "--burst", "3x60s"], "--burst"),
    (["--rate", "5", "--max-requests", "5", "--ramp", "0s"], "--ramp"),
    (["--rate", "5", "--max-requests", "5", "--prompt-tokens", "0"], "--prompt-tokens"),
    (["--rate", "5", "--max-requests", "5", "--output-tokens", "9-2"], "--output-tokens"),
    (["--rate", "5", "--max-requests", "5", "--slow-reader", "0.1"], "--slow-reader"),
    (["--rate", "5", "--max-requests", "5", "--slow-reader", "2@20"], "--slow-reader"),
    (["--rate", "5", "--max-requests", "5", "--cancel", "0.1@never"], "--cancel"),
    (["--rate", "5", "--max-requests", "5", "--timeout", "5"], "--timeout"),
    (["--rate", "5", "--max-requests", "5", "--goodput", "ttft=500"], "--goodput"),
    (["--rate", "5", "--max-requests", "5", "--endpoint", "embeddings"], "--endpoint"),
    (["--rate", "5", "--max-requests", "5", "--max-concurrency", "0"], "--max-concurrency"),
    (["--rate", "5", "--max-requests", "5", "--slow-rcvbuf", "0"], "--slow-rcvbuf"),
    (["--rate", "5", "--max-requests", "5", "--model", ""], "--model"),
    (["--rate", "5", "--max-requests", "5", "--version", ""], "--version"),
    (["--rate", "5", "--max-requests", "5", "--stop-wait", "-1s"], "--stop-wait"),
    (["--trace-kind", "sharegpt", "x.csv"], "--trace-kind"),
    (["--trace-kind", "azure", "x.csv", "--rate", "5"], "--rate"),
])
def test_a_bad_flag_exits_2_naming_it_and_creates_nothing(tmp_path: Path, args: list[str], flag: str) -> None:
    db, log = tmp_path / "s.duckdb", tmp_path / "attempts.jsonl"
    code, _, err = load(f"http://127.0.0.1:{_closed_port()}", *args, "--db", str(db), "--attempts-log", str(log))
    assert code == 2, err
    assert f"error: {flag}" in " ".join(err.split()), err
    assert not db.exists() and not log.exists()


def test_a_bad_url_exits_2_with_the_accepted_form() -> None:
    code, _, err = load("ftp://example.org", "--rate", "5", "--max-requests", "5")
    assert code == 2 and "URL" in err and "accepted form" in err


def test_an_unreachable_target_exits_1_and_creates_nothing(tmp_path: Path) -> None:
    db, log = tmp_path / "s.duckdb", tmp_path / "attempts.jsonl"
    code, _, err = load(f"http://127.0.0.1:{_closed_port()}", "--rate", "5", "--max-requests", "3",
                        "--db", str(db), "--attempts-log", str(log))
    assert code == 1 and "cannot reach" in err and "nothing was sent" in err
    assert not db.exists() and not log.exists()


def test_a_missing_trace_or_a_store_of_another_kind_exits_1(tmp_path: Path, server: ServerProcess) -> None:
    code, _, err = load(server.url(), "--trace-kind", "azure", str(tmp_path / "none.csv"))
    assert code == 1 and "no such file" in err
    other = tmp_path / "other.duckdb"
    other.write_text("not a store")
    code, _, err = load(server.url(), "--rate", "5", "--max-requests", "2", "--db", str(other))
    assert code == 1 and "--db" in err
    assert other.read_text() == "not a store"


# ---- a run -----------------------------------------------------------------------------------------------


def test_a_run_writes_one_summary_per_attempt_and_prints_both_tables(tmp_path: Path, server: ServerProcess) -> None:
    db, log = tmp_path / "s.duckdb", tmp_path / "attempts.jsonl"
    code, out, err = load(server.url(tokens=6), "--rate", "40", "--max-requests", "15", "--seed", "3",
                          "--db", str(db), "--attempts-log", str(log), "--goodput", "ttft:500 tpot:50",
                          "--tenant-class", "batch", "--version", "run-1")
    assert code == 0, err
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    stored = _store_rows(db)
    assert len(entries) == len(stored) == 15
    assert {e["request_id"] for e in entries} == {r["request_id"] for r in stored}
    assert {(r["version"], r["tenant_class"], r["finish_reason"]) for r in stored} == {("run-1", "batch", "length")}
    assert "Serving Benchmark Result" in out and "Successful requests (stop, length):          15" in out
    assert "Goodput by all requests" in out and "unlike vllm bench" in out


def test_json_prints_one_object_with_the_run_the_table_and_the_report(server: ServerProcess) -> None:
    code, out, err = load(server.url(tokens=4), "--rate", "40", "--max-requests", "8", "--json",
                          "--goodput", "e2el:5000")
    assert code == 0, err
    doc = json.loads(out)
    assert set(doc) == {"run", "load", "report"}
    assert doc["load"]["attempted"] == 8 and doc["load"]["good"] == 8
    assert doc["report"]["totals"]["attempted"] == 8
    assert doc["report"]["policy"]["e2e_s"] == 5.0
    assert doc["run"]["config"]["api_key"] is False and doc["run"]["sent"] == 8


def test_refusals_and_failures_stay_in_the_figures(server: ServerProcess) -> None:
    code, out, err = load(server.url(status=500), "--rate", "100", "--max-requests", "10", "--json",
                          "--goodput", "ttft:500")
    assert code == 0, err                                      # failed requests: the run still completed
    doc = json.loads(out)
    assert doc["load"]["attempted"] == 10 and doc["load"]["goodput_fraction"] == 0.0
    assert doc["load"]["finish"].get("error", 0) + doc["load"]["finish"].get("rejected", 0) == 10
    assert doc["report"]["totals"]["attempted"] == 10


def test_data_from_flags_and_servers_is_shown_literally(server: ServerProcess) -> None:
    hostile = "[link=https://evil.example]x[/link]\x1b[31m"
    code, out, err = load(server.url(tokens=2), "--rate", "40", "--max-requests", "2", "--model", hostile,
                          "--version", "v[bold]1")
    assert code == 0, err
    assert "[link=https://evil.example]x[/link]\\x1b[31m" in out and "v[bold]1" in out
    assert "\x1b[31m" not in out


# ---- stopping and traces -----------------------------------------------------------------------------------


def test_sigterm_stops_the_run_and_every_summary_is_written(tmp_path: Path, server: ServerProcess) -> None:
    """Streams of 2 s at 20 arrivals/s: SIGTERM once some have ended, so dozens are in flight; those the
    stop's 0.5 s wait does not see end are hung up, and every attempt sent has its summary in the store."""
    db, log = tmp_path / "s.duckdb", tmp_path / "attempts.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmslo.cli", "load", server.url(tps=50, tokens=100), "--rate", "20",
         "--max-requests", "400", "--db", str(db), "--attempts-log", str(log), "--stop-wait", "500ms", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if log.exists() and len(log.read_text().splitlines()) >= 3:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, err
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    stored = _store_rows(db)
    doc = json.loads(out)
    assert doc["run"]["stopped_by"] == "SIGTERM" and doc["run"]["unsent"] > 0
    assert len(stored) == len(entries) == doc["load"]["attempted"] == 400 - doc["run"]["unsent"]
    assert {e["request_id"] for e in entries} == {r["request_id"] for r in stored}
    hung = [e for e in entries if e["hangup"] == "stop"]
    assert doc["run"]["hung_up_at_stop"] == len(hung)
    # hung up mid-reply: client_cancel; one whose last token had arrived keeps the server's finish reason
    assert all((e["finish_reason"] == "client_cancel") == (e["server_finish_reason"] is None) for e in hung)
    assert any(e["finish_reason"] == "client_cancel" for e in hung)


def test_a_real_trace_replays_through_the_command(tmp_path: Path, server: ServerProcess) -> None:
    if not AZURE.is_file():
        pytest.skip(f"real data missing: {AZURE} (see ../shared/real_data/README.md)")
    log = tmp_path / "attempts.jsonl"
    code, out, err = load(server.url(), "--trace-kind", "azure", str(AZURE), "--max-requests", "12",
                          "--burst", "20x@0s+1h", "--output-tokens", "4", "--attempts-log", str(log), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["run"]["schedule"]["arrivals"] == 12 and "azure trace" in doc["run"]["schedule"]["source"]
    from llmslo.analysis.workload import read_trace

    frame, _ = read_trace("azure", AZURE)
    entries = sorted((json.loads(line) for line in log.read_text().splitlines()), key=lambda e: e["index"])
    assert [e["prompt_words"] for e in entries] == [max(1, p) for p in frame["input_tokens"].to_list()[:12]]
    assert [e["scheduled_offset_s"] for e in entries] == pytest.approx([o / 20 for o in
                                                                        frame["offset_s"].to_list()[:12]])


# ---- missing extras --------------------------------------------------------------------------------------


def _without(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    code = (f"import sys\nsys.modules[{module!r}] = None  # as if not installed\n"
            f"sys.argv = ['llmslo', 'load', *{args!r}]\nfrom llmslo.cli import main\nmain()")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_without_httpx_the_command_gives_the_serve_install_hint(server: ServerProcess) -> None:
    ran = _without("httpx", server.url(), "--rate", "5", "--max-requests", "2")
    assert ran.returncode == 1 and "pip install 'llmslo[serve]'" in ran.stderr and "Traceback" not in ran.stderr


def test_without_the_analysis_extra_the_run_goes_on_and_db_gives_the_hint(tmp_path: Path,
                                                                          server: ServerProcess) -> None:
    ran = _without("duckdb", server.url(tokens=2), "--rate", "40", "--max-requests", "3", "--json")
    assert ran.returncode == 0, ran.stderr
    doc = json.loads(ran.stdout)
    assert doc["report"] is None and doc["load"]["completed"] == 3
    assert any("'analysis' extra" in n for n in doc["run"]["notes"])
    db = tmp_path / "s.duckdb"
    ran = _without("duckdb", server.url(), "--rate", "5", "--max-requests", "2", "--db", str(db))
    assert ran.returncode == 1 and "--db needs the 'analysis' extra" in ran.stderr and not db.exists()
