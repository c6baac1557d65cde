"""The report's footer describes the rows it shows: over rows written by ``llmslo load`` (the client's clock) it
says the client's clock and words TTFT, ITL and e2e as the client measured them; over server rows, the server's;
over both in one store, that they are mixed. Which clock is read from the stored rows themselves: a client row
repeats its ``ttft_s`` in ``client_ttft_s``, carries a client figure and has no ``queue_s``; a server row has a
``queue_s`` or a ``ttft_s`` of its own. Through the installed commands, from a temporary working directory."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmslo.tests._loadgen_server import ServerProcess
from llmslo.tests._loadgen_util import llmslo
from llmslo.tests._rows import ok_row, rejected_row

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess() as srv:
        yield srv


def _footer(out: str) -> dict[str, str]:
    """The report's definitions as printed: ``name: text`` lines after the totals."""
    lines = out[out.index("\nRates: "):].splitlines()[2:]
    return dict(line.split(": ", 1) for line in lines if ": " in line)


def _load(cwd: Path, url: str, db: str, n: int = 12) -> None:
    ran = llmslo("load", url, "--rate", "50", "--max-requests", str(n), "--db", db, "--no-progress", cwd=cwd)
    assert ran.returncode == 0, ran.stderr


def _server_rows(cwd: Path, name: str = "server.jsonl") -> str:
    start = time.time() - 3600
    rows = [ok_row(i, arrival_unix_s=start + i) for i in range(8)] + [rejected_row(100, arrival_unix_s=start)]
    (cwd / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return name


def test_a_report_over_load_rows_says_the_client_clock(tmp_path: Path, server: ServerProcess) -> None:
    _load(tmp_path, server.url(tokens=4), "client.duckdb")
    ran = llmslo("report", "--db", "client.duckdb", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    footer = _footer(ran.stdout)
    assert footer["clock"].startswith("the client's: 12 of 12 rows were measured by a client"), footer
    assert footer["ttft_s"].startswith("first content chunk received - request sent (client clock")
    assert footer["e2e_s"].startswith("end of the attempt (last byte received, or the client's hang-up)")
    assert "server clock" not in ran.stdout and "token commits" not in ran.stdout
    ran = llmslo("report", "--db", "client.duckdb", "--json", cwd=tmp_path)
    doc = json.loads(ran.stdout)
    assert doc["clock"] == {"kind": "client", "rows": 12, "client_rows": 12, "server_rows": 0}
    assert doc["definitions"]["ttft_s"] == footer["ttft_s"]


def test_failed_load_rows_are_on_the_client_clock_too(tmp_path: Path, server: ServerProcess) -> None:
    """10 × HTTP 400 with an empty body: no token, but the answer arrived, so each row has its client_e2e_s."""
    _load(tmp_path, server.url(status=400, body_hex=""), "client.duckdb", n=10)
    ran = llmslo("report", "--db", "client.duckdb", "--json", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["clock"]["kind"] == "client"


def test_a_report_over_server_rows_keeps_the_server_clock(tmp_path: Path) -> None:
    ran = llmslo("ingest", _server_rows(tmp_path), "--db", "server.duckdb", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    ran = llmslo("report", "--db", "server.duckdb", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    footer = _footer(ran.stdout)
    assert footer["clock"] == ("the server's: 8 of 9 rows were measured by the server (a queue_s, or a ttft_s "
                               "apart from client_ttft_s); 1 carry no time that tells (e.g. refusals)"), footer
    assert footer["ttft_s"] == "first token committed - arrival (server clock, includes queueing and prefill)"


def test_client_and_server_rows_in_one_store_are_called_mixed(tmp_path: Path, server: ServerProcess) -> None:
    _load(tmp_path, server.url(tokens=4), "both.duckdb", n=6)
    ran = llmslo("ingest", _server_rows(tmp_path), "--db", "both.duckdb", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    ran = llmslo("report", "--db", "both.duckdb", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    footer = _footer(ran.stdout)
    assert footer["clock"].startswith("MIXED: 6 rows were measured by a client (their times repeated in the "
                                      "client_ columns, no queue_s) and 8 by the server"), footer
    assert footer["ttft_s"].startswith("server rows: first token committed - arrival (server clock")
    assert "client rows: first content chunk received - request sent (client clock" in footer["ttft_s"]


def test_the_simulated_demo_is_on_the_servers_clock_though_its_refusals_carry_client_figures(tmp_path: Path) -> None:
    """The simulated demo's rows are the server's; its refusals and early cancels have no first token and no
    queue time but do carry the clients' figures: they tell nothing of the clock (not 'a client measured
    them', which made the footer say MIXED)."""
    ran = llmslo("demo", "--db", "demo.duckdb", "--json", cwd=tmp_path, timeout_s=300)
    assert ran.returncode == 0, ran.stderr
    clock = json.loads(ran.stdout)["clock"]
    assert clock["kind"] == "server" and clock["client_rows"] == 0 and clock["server_rows"] > 10_000, clock
