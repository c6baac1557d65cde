"""Request ids every server accepts: UUIDs (version 4 by default, time-ordered version 7 on request, built per RFC
9562), in a header whose name is configurable and which can be switched off. Against a server that refuses any id
but a UUID (as llama-cpp-python's does: 400 with an empty body), through the installed command; and the
client/server join (``llmslo serve`` keeps a UUID it is given as the row's id)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmslo.loadgen import (
    DEFAULT_REQUEST_ID_HEADER,
    LoadConfig,
    RequestIds,
    RequestShape,
    SpecError,
    Target,
    parse_request_id_header,
)
from llmslo.tests._loadgen_server import ServerProcess
from llmslo.tests._loadgen_util import MODEL, at, attempts_log, llmslo, run

UUID_TEXT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


# ---- the ids -------------------------------------------------------------------------------------------------


def test_uuid4_ids_are_random_version_4_uuids() -> None:
    ids = RequestIds()
    made = [ids.next() for _ in range(1000)]
    assert len(set(made)) == 1000
    assert all(UUID_TEXT.fullmatch(i) and uuid.UUID(i).version == 4 for i in made)


def test_uuid7_follows_rfc_9562_time_version_variant_and_random_bits() -> None:
    ids = RequestIds("uuid7")
    now_ns = 1_767_225_600_123_456_789  # 2026-01-01T00:00:00.123456789Z
    u = ids.uuid7(now_ns)
    assert u.version == 7 and u.variant == uuid.RFC_4122
    assert u.int >> 80 == now_ns // 1_000_000                            # unix_ts_ms, 48 bits
    assert (u.int >> 64) & 0xFFF == (now_ns % 1_000_000) * 4096 // 1_000_000  # sub-millisecond (method 3)
    assert len({ids.uuid7(now_ns + k).int & ((1 << 62) - 1) for k in range(64)}) == 64  # rand_b varies
    text = ids.next()
    assert UUID_TEXT.fullmatch(text) and uuid.UUID(text).version == 7


def test_uuid7_ids_of_a_run_sort_in_the_order_they_were_made_even_when_the_clock_stalls_or_goes_back() -> None:
    ids = RequestIds("uuid7")
    times = [5_000_000_000, 5_000_000_000, 5_000_000_100, 4_000_000_000, 5_000_000_000, 9_000_000_000]
    made = [str(ids.uuid7(t)) for t in times]
    assert made == sorted(made) and len(set(made)) == len(made)
    live = [ids.next() for _ in range(2000)]
    assert live == sorted(live)


def test_an_unknown_id_kind_is_refused_naming_the_flag() -> None:
    with pytest.raises(SpecError, match="--request-id: unknown kind 'uuid1'"):
        RequestIds("uuid1")
    with pytest.raises(SpecError, match="--request-id"):
        LoadConfig(Target.parse("http://127.0.0.1:1"), MODEL, request_id="serial")


def test_every_kind_of_id_is_one_llmslo_serve_keeps_so_client_and_server_rows_join() -> None:
    from llmslo.telemetry import valid_request_id

    for kind in ("uuid4", "uuid7"):
        assert valid_request_id(RequestIds(kind).next())


# ---- the header ----------------------------------------------------------------------------------------------


def test_the_header_name_is_checked_and_off_sends_none() -> None:
    assert parse_request_id_header("X-Correlation-Id") == "X-Correlation-Id"
    assert parse_request_id_header("off") is None and parse_request_id_header("OFF") is None
    for bad in ("X Request", "X-Id:", "", "é"):
        with pytest.raises(SpecError, match="--request-id-header: not a header name"):
            parse_request_id_header(bad)
    with pytest.raises(SpecError, match="for its own purpose"):
        parse_request_id_header("Authorization")
    assert RequestShape(MODEL).headers("abc")[DEFAULT_REQUEST_ID_HEADER] == "abc"
    assert RequestShape(MODEL, request_id_header="X-Trace").headers("abc")["X-Trace"] == "abc"
    none = RequestShape(MODEL, request_id_header=None).headers("abc")
    assert "abc" not in none.values() and not any("request-id" in k.lower() for k in none)


# ---- against a server ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess() as srv:
        yield srv


def test_the_id_travels_in_the_configured_header_and_comes_back_in_its_echo(server: ServerProcess) -> None:
    result, entries = run(server.url(id_header="X-Correlation-Id", tokens=2), at(0.0, 0.01),
                          request_id_header="X-Correlation-Id")
    for row, entry in zip(result.rows, entries, strict=True):
        seen = server.stats(row["request_id"])
        assert seen["headers"]["x-correlation-id"] == row["request_id"] and "x-request-id" not in seen["headers"]
        assert entry["server_request_id"] == row["request_id"]
        assert UUID_TEXT.fullmatch(row["request_id"])


def test_with_the_header_off_no_id_is_sent_and_the_rows_keep_their_uuids(server: ServerProcess) -> None:
    result, entries = run(server.url(tokens=2), at(0.0), request_id_header=None)
    (row,) = result.rows
    seen = server.stats("none")                  # the server got no id: it files the request under "none"
    assert seen["body"]["prompt"].split()[0] == "r0" and "x-request-id" not in seen["headers"]
    assert UUID_TEXT.fullmatch(row["request_id"]) and entries[0]["server_request_id"] is None
    assert row["finish_reason"] == "length"


def test_a_server_that_takes_only_uuids_answers_every_request_of_the_installed_command(
        tmp_path: Path, server: ServerProcess) -> None:
    """The user's report: llama-cpp-python's server answers 400 with an empty body to any X-Request-Id that is not
    a UUID, so every request failed. With UUIDs, v4 or v7, each is answered; the rows and the log keep the ids."""
    for kind in ("uuid4", "uuid7"):
        ran = llmslo("load", server.url(uuid_ids=1, tokens=3), "--rate", "50", "--max-requests", "10",
                     "--request-id", kind, "--db", "client.duckdb", "--attempts-log", f"{kind}.jsonl",
                     "--no-progress", cwd=tmp_path)
        assert ran.returncode == 0, ran.stderr
        assert "Successful requests (stop, length):          10" in ran.stdout, ran.stdout
        assert f"request ids: {kind} UUIDs, sent as X-Request-Id" in ran.stdout
        entries = attempts_log(tmp_path / f"{kind}.jsonl")
        assert [e["status"] for e in entries] == [200] * 10
        assert all(uuid.UUID(e["request_id"]).version == int(kind[-1]) for e in entries)
        assert all(e["server_request_id"] == e["request_id"] for e in entries)
    from llmslo.analysis.store import SUMMARY_TABLE, Store

    with Store.open(tmp_path / "client.duckdb", read_only=True) as store:
        ((stored,),) = store.con.sql(f"SELECT count(DISTINCT request_id) FROM {SUMMARY_TABLE}").fetchall()
    assert stored == 20


def test_the_installed_command_refuses_a_bad_header_name_before_sending(tmp_path: Path,
                                                                       server: ServerProcess) -> None:
    ran = llmslo("load", server.url(), "--rate", "5", "--max-requests", "2", "--request-id-header", "X Id",
                 "--attempts-log", "a.jsonl", cwd=tmp_path)
    assert ran.returncode == 2 and "error: --request-id-header" in " ".join(ran.stderr.split()), ran.stderr
    assert not (tmp_path / "a.jsonl").exists()
    ran = llmslo("load", server.url(), "--rate", "5", "--max-requests", "2", "--request-id", "serial",
                 cwd=tmp_path)
    assert ran.returncode == 2 and "error: --request-id" in ran.stderr, ran.stderr
