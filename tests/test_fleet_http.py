"""The HTTP path: clickhouse-connect's requests (queries, Arrow inserts, external data) answered by ClickHouse
26.x (chdb) behind a local HTTP front end (``_clickhouse_http``): the store, the report and the sink writer
over ``http://``, as against a server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest

from llmslo.analysis import GoodputPolicy, ReportSpec, Store, build_report, polars_schema
from llmslo.analysis.databases import ClickHouseDatabase
from llmslo.analysis.store import ClickHouseError, ClickHouseStore, ClickHouseSummaryWriter
from llmslo.analysis.store import _clickhouse_client as client_module
from llmslo.telemetry import COLUMNS, SummarySink, Telemetry
from llmslo.tests._clickhouse_http import clickhouse_http
from llmslo.tests._databases_support import copy_to_clickhouse, differences, fresh_clickhouse
from llmslo.tests._rows import cancelled_row, ok_row, rejected_row

pytest.importorskip("clickhouse_connect", reason="the HTTP path needs clickhouse-connect")


def _frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    return pl.DataFrame([{c.name: r.get(c.name, c.default) for c in COLUMNS} for r in rows], schema=polars_schema())


ROWS = ([ok_row(i, ttft_s=0.1 + 0.01 * i, last_token_s=1.0 + 0.01 * i, e2e_s=1.5 + 0.01 * i) for i in range(60)]
        + [cancelled_row(100 + i, waited_s=2.0 + i) for i in range(6)] + [rejected_row(200 + i) for i in range(4)])


@pytest.fixture
def http_url() -> Any:
    # the first opens the process's chdb session, which the front end serves
    with fresh_clickhouse(), clickhouse_http(client_module._CHDB._session) as (url, server):
        yield url, server


def test_ingest_and_report_over_http_match_the_duckdb_store(tmp_path: Path, http_url: Any) -> None:
    url, server = http_url
    with ClickHouseStore.open(f"{url}?database=over_http") as store, Store.open(tmp_path / "s.duckdb") as duck:
        first = store.ingest_frame(_frame(ROWS))
        again = store.ingest_frame(_frame(ROWS))  # the ids travel as external data to the lookup
        assert (first.rows_inserted, again.rows_inserted, again.rows_already_stored) == (70, 0, 70)
        duck.ingest_frame(_frame(ROWS))
        for spec in (ReportSpec(GoodputPolicy()), ReportSpec(GoodputPolicy(window_s=20.0), by=("finish_reason",))):
            assert differences(build_report(duck.con, spec).to_dict(),
                               build_report(ClickHouseDatabase(store), spec).to_dict()) == []
        store.client.command("DROP DATABASE over_http")
    assert server.requests > 10  # it all went over HTTP


def test_the_sink_writer_inserts_over_http(http_url: Any) -> None:
    url, _ = http_url
    writer = ClickHouseSummaryWriter(f"{url}?database=sink_http")
    sink = SummarySink(writer, batch_rows=40)
    tel = Telemetry(sink=sink)
    for i in range(100):
        with tel.request(f"r{i}", model="m") as t:
            t.schedule()
            t.commit()
            t.finish("stop")
    sink.close(timeout_s=30)
    assert sink.written == 100 and writer.rows_written == 100 and writer.batches_written >= 3
    with ClickHouseStore.open(f"{url}?database=sink_http") as store:
        assert store.count() == 100
        store.client.command("DROP DATABASE sink_http")


def test_a_query_the_server_refuses_names_the_url_and_the_reason(http_url: Any) -> None:
    url, _ = http_url
    with ClickHouseStore.open(f"http://ana:secret@{url.removeprefix('http://')}?database=refusals") as store:
        with pytest.raises(ClickHouseError) as err:
            store.client.query_arrow("SELECT no_such_column FROM request_summaries")
        store.client.command("DROP DATABASE refusals")
    assert "no_such_column" in str(err.value) and "secret" not in str(err.value) and "ana@" in str(err.value)


def test_a_clickhouse_copy_reads_back_over_http_as_stored(tmp_path: Path, http_url: Any) -> None:
    url, _ = http_url
    with Store.open(tmp_path / "s.duckdb") as duck, fresh_clickhouse() as local:
        duck.ingest_frame(_frame(ROWS))
        copy_to_clickhouse(duck.con, local)
        with ClickHouseStore.open(f"{url}?database={local.url.database}", create=False) as remote:
            assert remote.count() == 70
            spec = ReportSpec(GoodputPolicy(), by=("finish_reason",))
            assert differences(build_report(ClickHouseDatabase(local), spec).to_dict(),
                               build_report(ClickHouseDatabase(remote), spec).to_dict()) == []
