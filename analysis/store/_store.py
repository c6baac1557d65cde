"""The request-summary store: one DuckDB file, versioned, loaded in bulk, idempotent on ``request_id``.

Ingest reads JSONL, CSV and Parquet files (or polars/Arrow frames), validates every row against the
contract before anything is written, and inserts in one transaction through Arrow/DuckDB bulk paths.
An input with any invalid row writes nothing unless ``skip_invalid`` is set; then the valid rows are
loaded and the rejected ones are written beside the input with their reasons. Rows whose
``request_id`` is already stored are skipped (counted), so re-ingesting a file adds nothing.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from llmslo.analysis.store._schema import META_TABLE, SUMMARY_TABLE, summary_ddl
from llmslo.analysis.store._validation import (
    ROW,
    ColumnPlan,
    Condition,
    InvalidInputError,
    RowError,
    column_plan,
    typed_select,
    typed_select_fast,
    violation_conditions,
)
from llmslo.telemetry import COLUMN_NAMES, SCHEMA_VERSION, LlmsloError

if TYPE_CHECKING:
    import polars as pl

ProgressCallback = Callable[[str, int, int], None]
"""``on_progress(stage, done_rows, total_rows)``; called as work advances."""

INSERT_CHUNK_ROWS = 2_000_000
"""Rows per insert statement: large enough for bulk speed, small enough to report progress."""

SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".parquet": "parquet"}


class StoreError(LlmsloError):
    """The store cannot be opened or written (missing, locked, not an llmslo store)."""


class StoreVersionError(StoreError):
    """The store was written with another request-summary schema version."""


@dataclass(frozen=True)
class IngestReport:
    """What one input contributed: rows read, inserted, already stored, rejected (and where)."""

    source: str
    rows_read: int
    rows_inserted: int
    rows_already_stored: int
    rows_rejected: int
    rejected_path: str | None = None
    errors: list[RowError] = field(default_factory=list)


@dataclass
class _Input:
    source: str
    source_sql: str
    row_sql: str
    types: dict[str, str]
    json_column: str | None
    n_rows: int
    path: Path | None
    cleanup: list[str] = field(default_factory=list)


def _kind_of(path: Path) -> str:
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise StoreError(
            f"{path}: cannot tell the format from the suffix {path.suffix!r}; "
            f"use one of {', '.join(sorted(SUFFIXES))}"
        )
    return kind


def _first_bad_json_line(path: Path) -> tuple[int, str]:
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                return number, f"not valid JSON ({exc.msg} at column {exc.colno})"
            if not isinstance(obj, dict):
                return number, f"expected a JSON object, found {type(obj).__name__}"
    return 0, "unreadable"


class Store:
    """An open request-summary store (one DuckDB file).

    Example::

        with Store.open("summaries.duckdb") as store:
            reports = store.ingest_files(["day1.parquet"])

    Raises :class:`StoreError` when the file cannot be opened and :class:`StoreVersionError` when it
    holds another schema version.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, path: str) -> None:
        self.con = con
        self.path = path
        self._tmp = 0

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, create: bool = True, read_only: bool = False) -> Store:
        """Open (and with ``create``, initialise) the store at ``path``."""
        p = Path(path)
        if not p.exists() and (read_only or not create):
            raise StoreError(f"no store at {p}: create one with `llmslo ingest FILES --db {p}`")
        try:
            con = duckdb.connect(str(p), read_only=read_only)
        except duckdb.Error as exc:
            raise StoreError(f"cannot open store {p}: {exc}") from None
        store = cls(con, str(p))
        try:
            store._check_or_init(create=create and not read_only)
        except BaseException:
            con.close()
            raise
        return store

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _tables(self) -> set[str]:
        return {r[0] for r in self.con.sql("SELECT table_name FROM duckdb_tables()").fetchall()}

    def _check_or_init(self, *, create: bool) -> None:
        tables = self._tables()
        if META_TABLE in tables:
            rows = self.con.sql(
                f"SELECT value FROM {META_TABLE} WHERE key = 'schema_version'"
            ).fetchall()
            found = int(rows[0][0]) if rows else None
            if found != SCHEMA_VERSION:
                raise StoreVersionError(
                    f"store {self.path} has request-summary schema version {found}, this llmslo reads "
                    f"version {SCHEMA_VERSION}: re-ingest the source files into a new store "
                    f"(llmslo ingest FILES --db NEW.duckdb), or use the llmslo release that wrote it"
                )
            return
        if tables:
            raise StoreError(
                f"{self.path} is a DuckDB file but not an llmslo store (tables: {', '.join(sorted(tables))})"
            )
        if not create:
            raise StoreError(f"{self.path} is empty: create a store with `llmslo ingest FILES --db {self.path}`")
        self.con.execute("BEGIN TRANSACTION")
        self.con.execute(summary_ddl())
        self.con.execute(f"CREATE TABLE {META_TABLE} (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)")
        self.con.execute(
            f"INSERT INTO {META_TABLE} VALUES ('schema_version', ?), ('created_unix_s', ?)",
            [str(SCHEMA_VERSION), str(time.time())],
        )
        self.con.execute("COMMIT")

    def _one(self, sql: str) -> tuple[Any, ...]:
        """The single row of a query."""
        rows = self.con.sql(sql).fetchall()
        return tuple(rows[0])

    def meta(self, key: str) -> str | None:
        """A value recorded in the store's metadata table (e.g. ``schema_version``)."""
        rows = self.con.sql(f"SELECT value FROM {META_TABLE} WHERE key = ?", params=[key]).fetchall()
        return str(rows[0][0]) if rows else None

    def set_meta(self, key: str, value: str) -> None:
        """Record a metadata value (replacing an earlier one)."""
        self.con.execute(f"INSERT OR REPLACE INTO {META_TABLE} VALUES (?, ?)", [key, value])

    def count(self) -> int:
        """Number of stored summaries."""
        return int(self._one(f"SELECT count(*) FROM {SUMMARY_TABLE}")[0])

    # ---- staging -------------------------------------------------------------------------------

    def _name(self) -> str:
        self._tmp += 1
        return f"__llmslo_in_{self._tmp}"

    def _describe(self, source_sql: str) -> dict[str, str]:
        rel = self.con.sql(f"SELECT * FROM {source_sql} LIMIT 0")
        return {name: str(t) for name, t in zip(rel.columns, rel.types, strict=True)}

    def _count(self, source_sql: str) -> int:
        return int(self._one(f"SELECT count(*) FROM {source_sql}")[0])

    def _stage_frame(self, frame: pl.DataFrame | pa.Table, source: str) -> _Input:
        table = frame if isinstance(frame, pa.Table) else frame.to_arrow()  # a polars frame, not imported here
        if ROW in table.column_names:
            table = table.drop_columns([ROW])
        table = table.append_column(ROW, pa.array(np.arange(1, table.num_rows + 1, dtype=np.int64)))
        name = self._name()
        self.con.register(name, table)
        types = self._describe(name)
        types.pop(ROW, None)
        return _Input(source, name, ROW, types, None, table.num_rows, None, [name])

    def _stage_file(self, path: Path) -> _Input:
        if not path.is_file():
            raise StoreError(f"{path}: no such file")
        kind = _kind_of(path)
        name = self._name()
        lit = "'" + str(path).replace("'", "''") + "'"
        try:
            if kind == "parquet":
                try:
                    pq.read_metadata(path)
                except (pa.ArrowInvalid, OSError) as exc:
                    raise StoreError(f"{path}: not a readable Parquet file ({exc})") from None
                src = f"read_parquet({lit}, file_row_number = true)"
                types = self._describe(src)
                types.pop("file_row_number", None)
                return _Input(str(path), src, "(file_row_number + 1)", types, None, self._count(src), path)
            if kind == "csv":
                self.con.execute(
                    f"CREATE TEMP TABLE {name} AS SELECT row_number() OVER () AS {ROW}, * "
                    f"FROM read_csv({lit}, header = true, all_varchar = true, auto_detect = true)"
                )
                types = self._describe(name)
                types.pop(ROW, None)
                return _Input(str(path), name, ROW, types, None, self._count(name), path, [name])
            self.con.execute(
                f"CREATE TEMP TABLE {name} AS SELECT row_number() OVER () AS {ROW}, json AS __json "
                f"FROM read_json_objects({lit}, format = 'newline_delimited')"
            )
        except duckdb.Error as exc:
            if kind == "jsonl":
                line, why = _first_bad_json_line(path)
                raise InvalidInputError(
                    [RowError(str(path), line, "-", None, "malformed_json", why)], 1
                ) from None
            raise StoreError(f"{path}: cannot read as {kind.upper()}: {exc}") from None
        keys = self.con.sql(f"SELECT DISTINCT unnest(json_keys(__json)) FROM {name}").fetchall()
        types = {str(k[0]): "JSON" for k in keys}
        return _Input(str(path), name, ROW, types, "__json", self._count(name), path, [name])

    def _drop(self, inp: _Input) -> None:
        for name in inp.cleanup:
            if name.startswith("__llmslo_in_"):
                with suppress(duckdb.Error):
                    self.con.unregister(name)
                self.con.execute(f"DROP TABLE IF EXISTS {name}")

    def _row_set(self, rows: set[int]) -> str:
        """Register a set of row numbers as a one-column table ``r`` and return its name."""
        name = self._name()
        self.con.register(name, pa.table({"r": pa.array(sorted(rows), type=pa.int64())}))
        return name

    # ---- validation ----------------------------------------------------------------------------

    def _find_errors(
        self, inp: _Input, plans: list[ColumnPlan], conds: list[Condition]
    ) -> tuple[list[RowError], set[int]]:
        typed = typed_select(plans, inp.source_sql, inp.row_sql)
        selects = [
            f"SELECT {ROW} AS r, {i} AS c, __shown_{c.column} AS v FROM t WHERE {c.sql}"
            for i, c in enumerate(conds)
        ]
        selects.append(
            f"SELECT {ROW} AS r, -1 AS c, 'same as row ' || CAST(first_row AS VARCHAR) || ': ' || "
            f"request_id AS v FROM (SELECT {ROW}, request_id, "
            f"min({ROW}) OVER (PARTITION BY request_id) AS first_row FROM t) WHERE {ROW} <> first_row"
        )
        rows = self.con.sql(
            f"WITH t AS ({typed}) SELECT * FROM ({' UNION ALL '.join(selects)}) ORDER BY r, c"
        ).fetchall()
        errors: list[RowError] = []
        bad_rows: set[int] = set()
        for r, c, v in rows:
            bad_rows.add(int(r))
            if c == -1:
                errors.append(RowError(inp.source, int(r), "request_id", v, "duplicate_request_id",
                                       "request_id must be unique within the input"))
            else:
                cond = conds[c]
                errors.append(RowError(inp.source, int(r), cond.column, v, cond.rule, cond.message))
        return errors, bad_rows

    def _is_clean(self, inp: _Input, plans: list[ColumnPlan], conds: list[Condition]) -> bool:
        any_bad = " OR ".join(f"({c.sql})" for c in conds)
        row = self._one(
            f"SELECT count(*) FILTER (WHERE {any_bad}), count(*), count(DISTINCT request_id) "
            f"FROM ({typed_select_fast(plans, inp.source_sql)})"
        )
        return int(row[0]) == 0 and int(row[1]) == int(row[2])

    def _write_rejected(self, inp: _Input, errors: list[RowError], bad_rows: set[int]) -> str | None:
        if inp.path is None or not bad_rows:
            return None
        out = inp.path.with_name(inp.path.name + ".rejected.jsonl")
        by_row: dict[int, list[dict[str, Any]]] = {}
        for e in errors:
            if e.row is not None:
                by_row.setdefault(e.row, []).append(
                    {"rule": e.rule, "column": e.column, "value": e.value, "message": e.message}
                )
        wanted = self._row_set(bad_rows)
        record_sql = "__json" if inp.json_column else "CAST(to_json(s) AS VARCHAR)"
        inner = f"SELECT {inp.row_sql} AS __r, * FROM {inp.source_sql}"
        records = self.con.sql(
            f"SELECT __r, {record_sql} FROM ({inner}) s WHERE __r IN (SELECT r FROM {wanted}) ORDER BY __r"
        ).fetchall()
        fd, tmp = tempfile.mkstemp(prefix=out.name + ".", dir=out.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for r, text in records:
                record = json.loads(text)
                for key in ("__r", ROW, "file_row_number"):
                    record.pop(key, None)
                fh.write(json.dumps({"row": int(r), "errors": by_row.get(int(r), []), "record": record}) + "\n")
        os.replace(tmp, out)
        return str(out)

    # ---- ingest --------------------------------------------------------------------------------

    def ingest_files(
        self,
        paths: Sequence[str | os.PathLike[str]],
        *,
        skip_invalid: bool = False,
        on_progress: ProgressCallback | None = None,
    ) -> list[IngestReport]:
        """Validate and load JSONL/CSV/Parquet files in one transaction; see the module docstring."""
        return self._ingest([Path(p) for p in paths], skip_invalid, on_progress)

    def ingest_frame(
        self,
        frame: pl.DataFrame | pa.Table,
        *,
        source: str = "<frame>",
        skip_invalid: bool = False,
        on_progress: ProgressCallback | None = None,
    ) -> IngestReport:
        """Validate and load a polars or Arrow frame (rejected rows are returned, not written)."""
        return self._ingest([(frame, source)], skip_invalid, on_progress)[0]

    def _ingest(
        self,
        items: Sequence[Path | tuple[pl.DataFrame | pa.Table, str]],
        skip_invalid: bool,
        on_progress: ProgressCallback | None,
    ) -> list[IngestReport]:
        staged: list[_Input] = []
        try:
            for item in items:
                staged.append(self._stage_file(item) if isinstance(item, Path) else self._stage_frame(*item))
            total = sum(s.n_rows for s in staged)
            done = 0
            if on_progress:
                on_progress("validating", 0, total)
            checked: list[tuple[_Input, list[ColumnPlan], list[Condition], list[RowError], set[int]]] = []
            all_errors: list[RowError] = []
            n_bad = 0
            for inp in staged:
                plans, problems = column_plan(inp.source, inp.types, json_column=inp.json_column)
                if problems:  # a whole-input problem: no row of this input can be loaded
                    all_errors.extend(problems)
                    n_bad += inp.n_rows
                    checked.append((inp, plans, [], problems, set()))
                    continue
                conds = violation_conditions(plans)
                errors: list[RowError] = []
                bad_rows: set[int] = set()
                if not self._is_clean(inp, plans, conds):
                    errors, bad_rows = self._find_errors(inp, plans, conds)
                    all_errors.extend(errors)
                    n_bad += len(bad_rows)
                checked.append((inp, plans, conds, errors, bad_rows))
            whole_input_problem = any(e.row is None for e in all_errors)
            if all_errors and (not skip_invalid or whole_input_problem):
                raise InvalidInputError(all_errors, n_bad)
            reports: list[IngestReport] = []
            self.con.execute("BEGIN TRANSACTION")
            try:
                for inp, plans, _conds, errors, bad_rows in checked:
                    inserted, already = self._insert(inp, plans, bad_rows, on_progress, done, total)
                    done += inp.n_rows
                    rejected_path = self._write_rejected(inp, errors, bad_rows) if skip_invalid else None
                    reports.append(IngestReport(
                        inp.source, inp.n_rows, inserted, already, len(bad_rows), rejected_path, errors
                    ))
                self.con.execute("COMMIT")
            except BaseException:
                self.con.execute("ROLLBACK")
                raise
            return reports
        finally:
            for inp in staged:
                self._drop(inp)

    def _insert(
        self,
        inp: _Input,
        plans: list[ColumnPlan],
        bad_rows: set[int],
        on_progress: ProgressCallback | None,
        done_before: int,
        total: int,
    ) -> tuple[int, int]:
        cols = ", ".join(COLUMN_NAMES)
        values = ", ".join(f"{p.value} AS {p.column.name}" for p in plans)
        store_empty = self.count() == 0
        bad_table = self._row_set(bad_rows) if bad_rows else ""
        inserted = 0
        chunks = max(1, -(-inp.n_rows // INSERT_CHUNK_ROWS))
        for k in range(chunks):
            where: list[str] = []
            if chunks > 1:
                where.append(
                    f"{inp.row_sql} > {k * INSERT_CHUNK_ROWS} AND {inp.row_sql} <= {(k + 1) * INSERT_CHUNK_ROWS}"
                )
            if bad_rows:
                where.append(f"{inp.row_sql} NOT IN (SELECT r FROM {bad_table})")
            filt = f" WHERE {' AND '.join(where)}" if where else ""
            select = f"SELECT {values} FROM {inp.source_sql}{filt}"
            if not (store_empty and k == 0):
                select = (
                    f"SELECT * FROM ({select}) AS n WHERE NOT EXISTS "
                    f"(SELECT 1 FROM {SUMMARY_TABLE} AS s WHERE s.request_id = n.request_id)"
                )
            row = self.con.execute(f"INSERT INTO {SUMMARY_TABLE} ({cols}) {select}").fetchone()
            inserted += int(row[0]) if row else 0
            if on_progress:
                on_progress("loading", min(done_before + (k + 1) * INSERT_CHUNK_ROWS, done_before + inp.n_rows),
                            total)
        return inserted, inp.n_rows - len(bad_rows) - inserted


@contextmanager
def open_store(path: str | os.PathLike[str], *, read_only: bool = False) -> Iterator[Store]:
    """Context-manager form of :meth:`Store.open`."""
    store = Store.open(path, read_only=read_only, create=not read_only)
    try:
        yield store
    finally:
        store.close()
