"""Test support for the database suites: a DuckDB store copied into ClickHouse (chdb), and reports compared.

chdb embeds one ClickHouse per process, bound to one folder: every test of a pytest process shares
:func:`chdb_folder`, each copy in a database of its own (dropped afterwards).
"""

from __future__ import annotations

import atexit
import itertools
import math
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import pytest

from llmslo.analysis.databases import ClickHouseDatabase
from llmslo.analysis.store import META_TABLE, SUMMARY_TABLE, ClickHouseStore

chdb = pytest.importorskip("chdb", reason="the database suites need chdb (embedded ClickHouse): pip install chdb")

REL_TOL = 1e-12
"""Floats that both databases compute exactly (quantiles by interpolation, means, rates) agree to this."""

_FOLDER: list[Path] = []
_COUNTER = itertools.count()


def chdb_folder() -> Path:
    """The one chdb folder of this test process (removed at exit)."""
    if not _FOLDER:
        folder = Path(tempfile.mkdtemp(prefix="llmslo-chdb-tests-"))
        atexit.register(shutil.rmtree, folder, True)
        _FOLDER.append(folder)
    return _FOLDER[0]


def chdb_url(name: str | None = None) -> str:
    """A store URL in the shared folder, in a fresh database."""
    return f"chdb://{chdb_folder()}?database={name or f'llmslo_test_{next(_COUNTER)}'}"


@contextmanager
def fresh_clickhouse(name: str | None = None) -> Iterator[ClickHouseStore]:
    """A new, empty ClickHouse store (its database dropped at the end)."""
    url = chdb_url(name)
    store = ClickHouseStore.open(url)
    try:
        yield store
    finally:
        store.client.command(f"DROP DATABASE IF EXISTS {store.url.database}")
        store.close()


_CH_TYPES = {"VARCHAR": "String", "DOUBLE": "Float64", "BIGINT": "Int64", "BOOLEAN": "Bool", "INTEGER": "Int32"}


def _clickhouse_type(duck: str) -> str:
    if duck.endswith("[]"):
        return f"Array({_CH_TYPES[duck[:-2]]})"
    if duck.startswith("MAP("):
        key, value = (t.strip() for t in duck[4:-1].split(","))
        return f"Map({_CH_TYPES[key]}, {_CH_TYPES[value]})"
    return f"Nullable({_CH_TYPES[duck]})"


def _underlying(con: Any) -> duckdb.DuckDBPyConnection:
    """The DuckDB connection behind a recording or timing wrapper (``.con`` / ``._con``)."""
    while not isinstance(con, duckdb.DuckDBPyConnection):
        con = getattr(con, "con", None) or con._con
    return con


def copy_to_clickhouse(con: Any, store: ClickHouseStore) -> None:
    """Every table of the DuckDB store on ``con`` into ``store``, row for row (no validation: a store may hold
    rows that ingest would refuse, and the copy must too). The summaries go into the ClickHouse DDL; the other
    tables into tables of the same columns."""
    duck = _underlying(con)
    client = store.client
    tables = [str(r[0]) for r in duck.sql("SELECT table_name FROM duckdb_tables() WHERE NOT internal").fetchall()]
    for table in tables:
        data = duck.sql(f"SELECT * FROM {table}").to_arrow_table()
        if table == SUMMARY_TABLE:
            if data.num_rows:
                client.insert_arrow(SUMMARY_TABLE, data)
            continue
        if table == META_TABLE:
            client.command(f"TRUNCATE TABLE {META_TABLE}")
        else:
            types = duck.sql(f"SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = '{table}' "
                             "ORDER BY column_index").fetchall()
            cols = ", ".join(f"`{name}` {_clickhouse_type(str(kind))}" for name, kind in types)
            client.command(f"CREATE TABLE {table} ({cols}) ENGINE = MergeTree ORDER BY tuple()")
        if data.num_rows:
            client.insert_arrow(table, data)


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two JSON-like values differ: exact for everything but floats, which must agree to
    :data:`REL_TOL` (relative, or absolute near zero)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return [f"{path}: {len(a)} vs {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        same = (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=REL_TOL, abs_tol=REL_TOL)
        return [] if same else [f"{path}: {a!r} vs {b!r}"]
    if type(a) is not type(b) or a != b:
        return [f"{path}: {a!r} ({type(a).__name__}) vs {b!r} ({type(b).__name__})"]
    return []


def fingerprint(con: Any) -> tuple[tuple[str, int, int], ...]:
    """What the DuckDB store on ``con`` holds, in brief: per table its rows and the sum of their hashes."""
    duck = _underlying(con)
    tables = sorted(str(r[0]) for r in duck.sql("SELECT table_name FROM duckdb_tables() WHERE NOT internal").fetchall())
    out = []
    for table in tables:
        n, h = duck.sql(f"SELECT count(*), coalesce(sum(hash(t)), 0) FROM {table} AS t").fetchall()[0]
        out.append((table, int(n), int(h)))
    return tuple(out)


class _Copies:
    """The ClickHouse copy of the last store compared, kept while the store holds the same rows (a test
    usually reports one store several ways)."""

    def __init__(self) -> None:
        self.key: tuple[tuple[str, int, int], ...] | None = None
        self.store: ClickHouseStore | None = None

    def of(self, con: Any) -> ClickHouseStore:
        key = fingerprint(con)
        if self.store is not None and key == self.key:
            return self.store
        if self.store is not None:
            self.store.client.command(f"DROP DATABASE IF EXISTS {self.store.url.database}")
            self.store.close()
            self.store = None
        store = ClickHouseStore.open(chdb_url())
        copy_to_clickhouse(con, store)
        self.store, self.key = store, key
        return store


_COPIES = _Copies()


def on_both_databases(build: Callable[..., Any]) -> Callable[..., Any]:
    """``build(con, spec, ...)`` that also runs on a ClickHouse copy of the store and asserts the same result:
    the same ``to_dict()`` (see :func:`differences`), or the same error (type and message)."""

    def both(con: Any, *args: Any, **kwargs: Any) -> Any:
        error: Exception | None = None
        try:
            result = build(con, *args, **kwargs)
        except Exception as exc:  # re-raised below, after ClickHouse said the same
            error = exc
        database = ClickHouseDatabase(_COPIES.of(con))
        if error is not None:
            with pytest.raises(type(error)) as other:
                build(database, *args, **kwargs)
            assert str(other.value) == str(error)
            raise error
        theirs = build(database, *args, **kwargs)
        problems = differences(result.to_dict(), theirs.to_dict())
        assert not problems, "DuckDB and ClickHouse disagree:\n" + "\n".join(problems[:30])
        return result

    return both
