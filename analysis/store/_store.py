"""The request-summary store: one DuckDB file, versioned, loaded in bulk, idempotent on ``request_id``.

Ingest reads JSONL, CSV and Parquet files (or polars/Arrow frames), validates every row against the
contract and inserts in one transaction through Arrow/DuckDB bulk paths; nothing is committed before
every row has passed. Each column's type is read as the contract's by the rule ``report --source`` follows
too (:mod:`llmslo.analysis.store._input_types`: e.g. an exact decimal becomes a float when that loses nothing
beyond a microsecond). An input with any invalid row writes nothing unless ``skip_invalid`` is set; then
the valid rows are loaded and the rejected ones are written beside the input with their reasons. Rows
whose ``request_id`` is already stored are skipped: counted as already stored when their content equals
the stored row's, so re-ingesting a file adds nothing, and as conflicting (with the first ids) when it
differs; the stored row is kept either way. An empty input file, a column named like one ingest uses
internally, or text that is not UTF-8 is refused with the file (and the line) named, and nothing is
written; a store file that a failed command created is removed again (:meth:`Store.__exit__`).

What ingest costs follows its input, not the store: the rules are checked in the scan that feeds the
insert, and the stored ids are looked up once per input, before the first chunk, through two side
tables kept in the same transaction as the summaries. :data:`ID_RANGE_TABLE` holds the id range of
each loaded input: an input whose range meets none of them (ordered ids: time-based, sequential) holds
no stored id, and nothing more is read. Otherwise :data:`ID_HASH_TABLE` (one 8-byte hash per stored
row) is probed by a semi join whose hash table is built on the input's ids: for unordered ids (UUIDs)
that probe still reads 8 bytes per stored row, instead of every stored id string. The stored id
strings are read only when a hash matches.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from llmslo.analysis.store._input_types import lossy_decimals
from llmslo.analysis.store._schema import (
    META_TABLE,
    SUMMARY_TABLE,
    columns_added_since,
    duckdb_type,
    summary_ddl,
    table_names,
)
from llmslo.analysis.store._validation import (
    INVALID_ROW,
    ROW,
    ColumnPlan,
    Condition,
    InvalidInputError,
    RowError,
    any_violation,
    checked_select,
    column_plan,
    reserved_column_errors,
    typed_select,
    typed_select_fast,
    violation_conditions,
)
from llmslo.telemetry import COLUMN_NAMES, SCHEMA_VERSION, Column, LlmsloError
from llmslo.telemetry._files import create_temporary

if TYPE_CHECKING:
    import polars as pl

ProgressCallback = Callable[[str, int, int], None]
"""``on_progress(stage, done_rows, total_rows)``; called as work advances."""

INSERT_CHUNK_ROWS = 2_000_000
"""Rows per insert statement: large enough for bulk speed, small enough to report progress."""

ID_HASH_TABLE = "llmslo_request_id_hashes"
"""Side table of the store: one row ``h`` = DuckDB ``hash(request_id)`` (UBIGINT) per stored summary.

It lets ingest find the input ids already stored by scanning 8 bytes per stored row instead of every
stored id string. It is made the first time an input's id range meets a stored one (a store of
time-ordered ids may never need it), then kept in step by :class:`Store`; found out of step (rows written
around :class:`Store`, another DuckDB hash function) it is dropped and made again when needed.
"""
ID_RANGE_TABLE = "llmslo_request_id_ranges"
"""Side table of the store: ``(lo, hi, n)``, ``n`` stored rows whose ``request_id`` lies in ``[lo, hi]``.

One row per loaded input; the rows together cover every stored row. An input whose id range meets none
of them holds no stored id, which ingest then knows without reading :data:`ID_HASH_TABLE`.
"""
ID_RANGES_MAX = 1024
"""Rows of :data:`ID_RANGE_TABLE` past which ingest merges neighbouring ranges (8 into 1)."""
REBUILD_RANGE_ROWS = 122_880
"""Stored rows per range when :data:`ID_RANGE_TABLE` is rebuilt from the summaries (one row group)."""
MEMORY_CHECK_MAX_ROWS = 50_000_000
"""Inputs of up to this many rows have their id hashes checked for repeats in memory (8 bytes a row, twice)."""
POLARS_CHECK_MIN_ROWS = 1_000_000
"""Inputs of at least this many rows have their id hashes counted by polars, on every core; smaller ones are sorted
in numpy, so that a server whose sink writes small batches never loads polars."""
ID_HASH_CHECK_KEY = "request_id_hash_check"
"""Metadata key: ``hash()`` of a fixed text when :data:`ID_HASH_TABLE` was built (detects a new hash function)."""
_HASH_PROBE = "llmslo request_id hash check"
CONFLICT_IDS_KEPT = 10
"""How many conflicting ``request_id`` values an :class:`IngestReport` lists (the first, in input order)."""

SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".parquet": "parquet"}


class StoreError(LlmsloError):
    """The store cannot be opened or written (missing, locked, not an llmslo store)."""


class StoreVersionError(StoreError):
    """The store was written with another request-summary schema version."""


class _NeedsUpgrade(Exception):
    """A store of an older schema version opened without write access: reopen it to upgrade it first."""


@dataclass(frozen=True)
class IngestReport:
    """What one input contributed: rows read, inserted, already stored, rejected (and where), conflicting.

    ``rows_already_stored`` counts rows whose ``request_id`` was stored with the same content (a re-ingest);
    ``rows_conflicting`` those whose ``request_id`` was stored with other content (the stored row is kept),
    and ``conflicting_ids`` lists the first :data:`CONFLICT_IDS_KEPT` of their ids, in input order.
    """

    source: str
    rows_read: int
    rows_inserted: int
    rows_already_stored: int
    rows_rejected: int
    rejected_path: str | None = None
    errors: list[RowError] = field(default_factory=list)
    rows_conflicting: int = 0
    conflicting_ids: tuple[str, ...] = ()

    def conflict_note(self) -> str | None:
        """A sentence on the conflicting rows for a person (None when there are none)."""
        if not self.rows_conflicting:
            return None
        more = ", ..." if self.rows_conflicting > len(self.conflicting_ids) else ""
        return (f"{self.source}: {self.rows_conflicting:,} row(s) have a request_id that is stored with other "
                f"content (first: {', '.join(self.conflicting_ids)}{more}); the stored rows were kept. Give "
                "changed requests new ids, or ingest the corrected file into a new store.")


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
    ids: str | None = None
    """Temp table ``(r, h)``: row number and ``hash(request_id)`` of every input row (see ``_id_table``)."""
    id_range: tuple[Any, ...] = (None, None)
    """Smallest and largest ``request_id`` of the input (None, None when it has none)."""


@dataclass
class _Checked:
    """An input with its column plans, its row rules and what validation found (nothing on the fast path)."""

    inp: _Input
    plans: list[ColumnPlan]
    conds: list[Condition]
    errors: list[RowError]
    bad_rows: set[int]


@dataclass
class _IdIndex:
    """What one ingest transaction knows of the id side tables."""

    stored: int
    """Rows stored, including those this transaction inserted so far."""
    hashes: bool
    """Whether :data:`ID_HASH_TABLE` exists and holds the hash of every stored row."""


def _hashes_distinct(hashes: np.ndarray[Any, np.dtype[np.uint64]]) -> bool:
    """True when no value of ``hashes`` (64-bit id hashes) repeats.

    From :data:`POLARS_CHECK_MIN_ROWS` values polars counts the distinct ones on every core (measured on 10M
    hashes: 0.2 s, against 0.65 s for numpy's sort on one core; polars is imported here, about 0.1 s);
    fewer are sorted in numpy and neighbours compared.
    """
    if len(hashes) >= POLARS_CHECK_MIN_ROWS:
        import polars as pl  # here: importing the store loads no polars

        counted = pl.Series("h", hashes)
        return counted.n_unique() == counted.len()
    ordered = np.sort(hashes)
    return not bool(np.any(ordered[1:] == ordered[:-1]))


def _id_value(plans: Sequence[ColumnPlan]) -> str:
    """SQL of the converted ``request_id`` (the value that is inserted)."""
    return next(p.value for p in plans if p.column.name == "request_id")


def _kind_of(path: Path) -> str:
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise StoreError(
            f"{path}: cannot tell the format from the suffix {path.suffix!r}; "
            f"use one of {', '.join(sorted(SUFFIXES))}"
        )
    return kind


def _not_utf8(raw: bytes) -> str | None:
    """Why the bytes of one line are not UTF-8 text (None when they are)."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return (f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line); "
                "save the file as UTF-8")
    return None


def _first_bad_json_line(path: Path) -> tuple[int, str, str] | None:
    """``(line, rule, why)`` of the first line of a JSONL file that is no UTF-8 JSON object, None if none is."""
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            why = _not_utf8(raw)
            if why is not None:
                return number, "not_utf8", why
            line = raw.decode("utf-8")
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                return number, "malformed_json", f"not valid JSON ({exc.msg} at column {exc.colno})"
            if not isinstance(obj, dict):
                return number, "malformed_json", f"expected a JSON object, found {type(obj).__name__}"
    return None


def _first_bad_utf8_line(path: Path) -> tuple[int, str] | None:
    """``(line, why)`` of the first line of a text file that is not UTF-8, None if every line is."""
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            why = _not_utf8(raw)
            if why is not None:
                return number, why
    return None


def _unreadable(path: Path, kind: str, exc: duckdb.Error) -> LlmsloError:
    """The error for an input DuckDB cannot read: the first bad line when there is one, else DuckDB's reason.

    Rows are numbered as ingest numbers them: a JSONL row is its line, a CSV row the line after the header.
    """
    if kind == "jsonl":
        bad = _first_bad_json_line(path)
        if bad is not None:
            line, rule, why = bad
            return InvalidInputError([RowError(str(path), line, "-", None, rule, why)], 1)
    elif kind == "csv":
        found = _first_bad_utf8_line(path)
        if found is not None:
            line, why = found
            row = line - 1 if line > 1 else None
            return InvalidInputError([RowError(str(path), row, "-", None, "not_utf8", f"line {line}: {why}")], 1)
    return StoreError(f"{path}: cannot read as {kind.upper()}: {exc}")


def _content_hash() -> str:
    """SQL of a row's 64-bit content hash: DuckDB ``hash()`` over every contract column, in storage order."""
    return f"hash({', '.join(COLUMN_NAMES)})"


def _first_bad_parquet_utf8(path: Path) -> tuple[int, str] | None:
    """``(row, column)`` of the first string value of a Parquet file that is not UTF-8, None if there is none.

    Arrow's full validation finds the row group and column; only that column of that group is decoded value
    by value (the error path: a file DuckDB refused to read).
    """
    pf = pq.ParquetFile(path)
    names = [f.name for f in pf.schema_arrow if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
    first = 1
    for group in range(pf.num_row_groups):
        table = pf.read_row_group(group, columns=names)
        for name in names:
            column = table.column(name)
            try:
                column.validate(full=True)
                continue
            except pa.ArrowInvalid:
                pass
            binary = pa.binary() if pa.types.is_string(column.type) else pa.large_binary()
            values = [v for chunk in column.chunks for v in chunk.view(binary).to_pylist()]
            for k, raw in enumerate(values):
                if raw is not None and _not_utf8(raw) is not None:
                    return first + k, name
        first += table.num_rows
    return None


def _failed(staged: Sequence[_Input], exc: duckdb.Error) -> LlmsloError:
    """The error for an ingest DuckDB could not carry out: a Parquet value that is not UTF-8 with its row,
    else DuckDB's reason (nothing was written either way)."""
    for inp in staged:
        if inp.path is not None and inp.path.suffix.lower() == ".parquet" and "UTF" in str(exc).upper():
            found = _first_bad_parquet_utf8(inp.path)
            if found is not None:
                row, column = found
                return InvalidInputError([RowError(inp.source, row, column, None, "not_utf8",
                                                   f"{column} is not UTF-8 text; write the file with UTF-8 strings")],
                                         1)
    sources = ", ".join(inp.source for inp in staged)
    return StoreError(f"ingest of {sources} failed, nothing was written: {exc}")


def _quoted(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def _discard(path: Path) -> None:
    """Remove a store file and its DuckDB write-ahead log."""
    path.unlink(missing_ok=True)
    Path(str(path) + ".wal").unlink(missing_ok=True)


class Store:
    """An open request-summary store (one DuckDB file).

    Example::

        with Store.open("summaries.duckdb") as store:
            reports = store.ingest_files(["day1.parquet"])

    Raises :class:`StoreError` when the file cannot be opened and :class:`StoreVersionError` when it
    holds another schema version. A store file created by :meth:`open` and still empty when a ``with``
    block leaves by an exception is removed again (a failed command leaves no store behind).
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, path: str) -> None:
        self.con = con
        self.path = path
        self._tmp = 0
        self._created = False

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, create: bool = True, read_only: bool = False) -> Store:
        """Open (and with ``create``, initialise) the store at ``path``."""
        p = Path(path)
        created = not p.exists()
        if created and (read_only or not create):
            raise StoreError(f"no store at {p}: create one with `llmslo ingest FILES --db {p}`")
        try:
            con = duckdb.connect(str(p), read_only=read_only)
        except duckdb.Error as exc:
            if created:
                _discard(p)
            raise StoreError(f"cannot open store {p}: {exc}") from None
        store = cls(con, str(p))
        store._created = created
        try:
            store._check_or_init(create=create and not read_only)
        except _NeedsUpgrade:
            con.close()
            with cls.open(p, create=True) as writable:  # an older schema: upgraded once, for writing
                del writable
            return cls.open(p, create=create, read_only=read_only)
        except BaseException:
            con.close()
            if created:
                _discard(p)
            raise
        return store

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        """Close; when an exception leaves the block and :meth:`open` created the file, remove it (and its
        ``.wal``) if it still holds no row in any table (an ingest that failed: nothing was committed)."""
        discard = exc_type is not None and self._created and self._holds_nothing()
        self.close()
        if discard:
            _discard(Path(self.path))

    def _holds_nothing(self) -> bool:
        """True when no table but the metadata holds a row (False when that cannot be told)."""
        try:
            return all(int(self._one(f"SELECT count(*) FROM {_quoted(t)}")[0]) == 0
                       for t in table_names(self.con) if t != META_TABLE)
        except duckdb.Error:
            return False

    def _check_or_init(self, *, create: bool) -> None:
        tables = table_names(self.con)
        if META_TABLE in tables:
            rows = self.con.sql(
                f"SELECT value FROM {META_TABLE} WHERE key = 'schema_version'"
            ).fetchall()
            found = int(rows[0][0]) if rows else None
            if found != SCHEMA_VERSION:
                added = columns_added_since(found)
                if added is None:
                    raise StoreVersionError(
                        f"store {self.path} has request-summary schema version {found}, this llmslo reads "
                        f"version {SCHEMA_VERSION}: re-ingest the source files into a new store "
                        f"(llmslo ingest FILES --db NEW.duckdb), or use the llmslo release that wrote it"
                    )
                if not create:
                    raise _NeedsUpgrade(found)
                self._upgrade(added)
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

    def _upgrade(self, added: tuple[Column, ...]) -> None:
        """Add the columns an older schema version lacks (null in the rows already stored), in one transaction."""
        self.con.execute("BEGIN TRANSACTION")
        for c in added:
            self.con.execute(f"ALTER TABLE {SUMMARY_TABLE} ADD COLUMN IF NOT EXISTS {c.name} {duckdb_type(c)}")
        self.con.execute(f"UPDATE {META_TABLE} SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION)])
        self.con.execute("COMMIT")

    def _one(self, sql: str, params: dict[str, Any] | None = None) -> tuple[Any, ...]:
        """The single row of a query."""
        rows = self.con.execute(sql, params).fetchall() if params else self.con.sql(sql).fetchall()
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
        reserved = reserved_column_errors(source, table.column_names)
        if reserved:
            raise InvalidInputError(reserved, table.num_rows)
        table = table.append_column(ROW, pa.array(np.arange(1, table.num_rows + 1, dtype=np.int64)))
        name = self._name()
        self.con.register(name, table)
        types = self._describe(name)
        types.pop(ROW, None)
        return _Input(source, name, ROW, types, None, table.num_rows, None, [name])

    def _stage_file(self, path: Path) -> _Input:
        """Make ``path`` readable as a table with row numbers; raises for a file that cannot be ingested at all.

        :class:`StoreError` for a missing, empty or unreadable file; :class:`InvalidInputError` naming the
        row for a line that is not UTF-8 (or not a JSON object), and for a column of a reserved name
        (``RESERVED_COLUMNS``).
        """
        if path.is_dir():
            raise StoreError(f"{path}: a folder, not a file: give the summary files in it")
        if not path.is_file():
            raise StoreError(f"{path}: no such file")
        kind = _kind_of(path)
        if path.stat().st_size == 0:
            raise StoreError(f"{path}: the file is empty (0 bytes): nothing to ingest; leave it out")
        try:
            inp = self._read_file(path, kind)
        except duckdb.Error as exc:
            raise _unreadable(path, kind, exc) from None
        reserved = reserved_column_errors(inp.source, inp.types)  # JSONL keys (the other kinds: _read_file)
        if reserved:
            self._drop(inp)
            raise InvalidInputError(reserved, inp.n_rows)
        if inp.n_rows == 0:
            self._drop(inp)
            what = {"csv": "a header without rows", "jsonl": "no JSON object", "parquet": "a schema without rows"}
            raise StoreError(f"{path}: the file holds {what[kind]}: nothing to ingest; leave it out")
        return inp

    def _read_file(self, path: Path, kind: str) -> _Input:
        """Stage one file of ``kind``; its ``types`` name every column of the file.

        A Parquet or CSV column of a reserved name is refused here, before the row numbers (which would
        collide with it) are added; JSONL keys are checked by the caller.
        """
        name = self._name()
        lit = "'" + str(path).replace("'", "''") + "'"
        if kind == "parquet":
            try:
                pq.read_metadata(path)
            except (pa.ArrowInvalid, OSError) as exc:
                raise StoreError(f"{path}: not a readable Parquet file ({exc})") from None
            # a file of the hive-partitioned sink (date=…/hour=… folders) holds every column itself: the
            # folder names are not read as columns
            plain = f"read_parquet({lit}, hive_partitioning = false)"
            types = self._describe(plain)
            self._refuse_reserved(str(path), types, plain)
            src = f"read_parquet({lit}, file_row_number = true, hive_partitioning = false)"
            return _Input(str(path), src, "(file_row_number + 1)", types, None, self._count(src), path)
        if kind == "csv":
            csv_sql = f"read_csv({lit}, header = true, all_varchar = true, auto_detect = true)"
            types = self._describe(csv_sql)
            self._refuse_reserved(str(path), types, csv_sql)
            self.con.execute(f"CREATE TEMP TABLE {name} AS SELECT row_number() OVER () AS {ROW}, * FROM {csv_sql}")
            return _Input(str(path), name, ROW, types, None, self._count(name), path, [name])
        self.con.execute(
            f"CREATE TEMP TABLE {name} AS SELECT row_number() OVER () AS {ROW}, json AS __json "
            f"FROM read_json_objects({lit}, format = 'newline_delimited')"
        )
        keys = self.con.sql(f"SELECT DISTINCT unnest(json_keys(__json)) FROM {name}").fetchall()
        types = {str(k[0]): "JSON" for k in keys}
        return _Input(str(path), name, ROW, types, "__json", self._count(name), path, [name])

    def _refuse_reserved(self, source: str, names: Iterable[str], source_sql: str) -> None:
        """Raise :class:`InvalidInputError` when a column of ``source_sql`` has a reserved name."""
        reserved = reserved_column_errors(source, names)
        if reserved:
            raise InvalidInputError(reserved, self._count(source_sql))

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
        row = self._one(
            f"SELECT count(*) FILTER (WHERE {any_violation(conds)}), count(*), count(DISTINCT request_id) "
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
        fd, tmp = create_temporary(out.parent, out.name + ".")  # the umask's mode: others may read it
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for r, text in records:
                record = json.loads(text)
                for key in ("__r", ROW, "file_row_number"):
                    record.pop(key, None)
                fh.write(json.dumps({"row": int(r), "errors": by_row.get(int(r), []), "record": record}) + "\n")
        os.replace(tmp, out)
        return str(out)

    # ---- the request_id side tables ------------------------------------------------------------

    def _id_hash_check(self) -> str:
        """DuckDB's ``hash()`` of a fixed text: changes if a DuckDB release changes the hash function."""
        return str(self._one(f"SELECT hash('{_HASH_PROBE}')")[0])

    def _sync_id_index(self) -> _IdIndex:
        """Check the id side tables against the summaries; return what ingest can rely on.

        Runs inside the ingest transaction. :data:`ID_RANGE_TABLE` is rebuilt from the summaries (one
        scan of their ``request_id``) when it is missing (a store written before it existed) or its
        counts differ from the summary table's (rows written or deleted around :class:`Store`); once it
        has grown past :data:`ID_RANGES_MAX` rows, neighbouring ranges are merged. :data:`ID_HASH_TABLE`
        is dropped when its count differs or it was written with another hash function
        (:meth:`_id_hash_check`); it is built again only when an input needs it
        (:meth:`_build_id_hashes`). Otherwise this reads a few counts (metadata, no scan).
        """
        stored = self.count()
        tables = table_names(self.con)
        ranges_ok = ID_RANGE_TABLE in tables and int(
            self._one(f"SELECT coalesce(sum(n), 0) FROM {ID_RANGE_TABLE}")[0]) == stored
        if not ranges_ok:
            self.con.execute(
                f"CREATE OR REPLACE TABLE {ID_RANGE_TABLE} "
                "(lo VARCHAR NOT NULL, hi VARCHAR NOT NULL, n BIGINT NOT NULL)"
            )
            if stored:
                self.con.execute(
                    f"INSERT INTO {ID_RANGE_TABLE} SELECT min(request_id), max(request_id), count(*) "
                    f"FROM {SUMMARY_TABLE} GROUP BY rowid // {REBUILD_RANGE_ROWS}"
                )
        elif int(self._one(f"SELECT count(*) FROM {ID_RANGE_TABLE}")[0]) > ID_RANGES_MAX:
            merged = self._name()
            self.con.execute(
                f"CREATE TEMP TABLE {merged} AS SELECT min(lo) AS lo, max(hi) AS hi, sum(n)::BIGINT AS n "
                f"FROM (SELECT *, (row_number() OVER (ORDER BY lo, hi) - 1) // 8 AS g FROM {ID_RANGE_TABLE}) "
                "GROUP BY g"
            )
            self.con.execute(f"DELETE FROM {ID_RANGE_TABLE}")
            self.con.execute(f"INSERT INTO {ID_RANGE_TABLE} SELECT lo, hi, n FROM {merged}")
            self.con.execute(f"DROP TABLE {merged}")
        hashes = ID_HASH_TABLE in tables
        if hashes and not (
            self.meta(ID_HASH_CHECK_KEY) == self._id_hash_check()
            and int(self._one(f"SELECT count(*) FROM {ID_HASH_TABLE}")[0]) == stored
        ):
            self.con.execute(f"DROP TABLE {ID_HASH_TABLE}")
            hashes = False
        return _IdIndex(stored, hashes)

    def _build_id_hashes(self, index: _IdIndex) -> None:
        """Create :data:`ID_HASH_TABLE` from the summaries (one scan of their ``request_id``), in the transaction.

        Done the first time an input's id range meets a stored range (unordered ids), so that a store
        whose ids never overlap (time-ordered ids) neither writes nor keeps the hashes.
        """
        self.con.execute(f"CREATE OR REPLACE TABLE {ID_HASH_TABLE} (h UBIGINT NOT NULL)")
        self.con.execute(f"INSERT INTO {ID_HASH_TABLE} SELECT hash(request_id) FROM {SUMMARY_TABLE}")
        self.set_meta(ID_HASH_CHECK_KEY, self._id_hash_check())
        index.hashes = True

    def _id_table(self, inp: _Input, plans: list[ColumnPlan]) -> str:
        """The temp table ``(r, h)`` of the input's row numbers and request_id hashes (made once, when needed).

        One scan of the input's ``request_id`` column (Parquet reads that column only).
        """
        if inp.ids is None:
            inp.ids = self._name()
            inp.cleanup.append(inp.ids)
            self.con.execute(
                f"CREATE TEMP TABLE {inp.ids} AS SELECT {inp.row_sql} AS r, hash({_id_value(plans)}) AS h "
                f"FROM {inp.source_sql}"
            )
        return inp.ids

    def _ids_distinct(self, inp: _Input, plans: list[ColumnPlan], *, stage: bool) -> bool:
        """True when no request_id hash of the input repeats, so no id does; reads the input's id range too.

        With ``stage`` the hashes are kept in the input's id table (:meth:`_id_table`, wanted later when
        the store has :data:`ID_HASH_TABLE`), else they are hashed straight from the input. Up to
        :data:`MEMORY_CHECK_MAX_ROWS` rows they are checked in memory (:func:`_hashes_distinct`); above,
        DuckDB counts them (it can spill to disk). A repeated hash is a duplicate id or, about once in 10^6
        inputs of 10M rows, a 64-bit collision; either way the detailed validation then decides. The
        smallest and largest id come from the Parquet statistics where DuckDB can use them.
        """
        rid = _id_value(plans)
        inp.id_range = self._one(f"SELECT min({rid}), max({rid}) FROM {inp.source_sql}")
        hashes = (f"SELECT h FROM {self._id_table(inp, plans)}" if stage
                  else f"SELECT hash({rid}) AS h FROM {inp.source_sql}")
        if inp.n_rows <= MEMORY_CHECK_MAX_ROWS:
            return _hashes_distinct(self.con.sql(hashes).fetchnumpy()["h"])
        n, distinct = self._one(f"SELECT count(*), count(DISTINCT h) FROM ({hashes})")
        return int(n) == int(distinct)

    def _stored_among(self, inp: _Input, plans: list[ColumnPlan], index: _IdIndex) -> str | None:
        """Name of a temp table ``(request_id, ch)`` of the stored request_ids that the input holds too, with
        the content hash of each stored row (:func:`_content_hash`); None if there are none.

        First the id ranges of the stored batches (:data:`ID_RANGE_TABLE`, a few rows): when none
        meets the input's range (ordered ids: time-based, sequential) nothing more is read. Else the
        input's id hashes are the build side of a semi join that :data:`ID_HASH_TABLE` probes (8 bytes
        per stored row, filtered by the join's Bloom filter pushed into the scan): no stored id string
        is read unless a hash matches. Only then are the stored ids with a matching hash, within the
        input's range, read from the summaries, so that a 64-bit collision cannot skip a new row.
        """
        lo, hi = inp.id_range
        if lo is None or not index.stored:
            return None
        overlapping = self._one(
            f"SELECT count(*) FROM {ID_RANGE_TABLE} WHERE hi >= $lo AND lo <= $hi", {"lo": lo, "hi": hi}
        )[0]
        if int(overlapping) == 0:
            return None
        if not index.hashes:
            self._build_id_hashes(index)
        matched = self._name()
        inp.cleanup.append(matched)
        self.con.execute(
            f"CREATE TEMP TABLE {matched} AS SELECT DISTINCT s.h FROM {ID_HASH_TABLE} AS s "
            f"WHERE s.h IN (SELECT h FROM {self._id_table(inp, plans)})"
        )
        if int(self._one(f"SELECT count(*) FROM {matched}")[0]) == 0:
            return None
        stored = self._name()
        inp.cleanup.append(stored)
        self.con.execute(
            f"CREATE TEMP TABLE {stored} AS SELECT request_id, {_content_hash()} AS ch FROM {SUMMARY_TABLE} "
            f"WHERE request_id BETWEEN $lo AND $hi AND hash(request_id) IN (SELECT h FROM {matched})",
            {"lo": lo, "hi": hi},
        )
        return stored

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
        """Stage, validate and load ``items`` in one transaction.

        The fast path assumes the input is valid: one scan of each input's ids (duplicates within the
        input, and the hashes that find ids already stored), then the insert, whose scan checks every
        rule on every row and aborts on the first invalid one. Any invalid row (or a whole-input
        problem) rolls that back and takes the detailed path: every input is validated in full, the
        errors are listed (and raised unless ``skip_invalid``), and the valid rows are loaded.
        """
        staged: list[_Input] = []
        try:
            for item in items:
                staged.append(self._stage_file(item) if isinstance(item, Path) else self._stage_frame(*item))
            total = sum(s.n_rows for s in staged)
            if on_progress:
                on_progress("validating", 0, total)
            planned = [self._plan(inp) for inp in staged]
            if not any(problems for _, problems in planned):
                stage = ID_HASH_TABLE in table_names(self.con)  # its lookups and updates will want the input's hashes
                clean = all(self._ids_distinct(inp, plans, stage=stage)
                            for inp, (plans, _) in zip(staged, planned, strict=True))
                if clean:
                    fast = [_Checked(inp, plans, violation_conditions(plans), [], set())
                            for inp, (plans, _) in zip(staged, planned, strict=True)]
                    try:
                        return self._load(fast, True, skip_invalid, on_progress, total)
                    except duckdb.Error as exc:
                        if INVALID_ROW not in str(exc):
                            raise
                    if on_progress:
                        on_progress("validating", 0, total)
            checked = self._validate(staged, planned, skip_invalid)
            return self._load(checked, False, skip_invalid, on_progress, total)
        except duckdb.Error as exc:  # not a broken rule: DuckDB could not read an input (or write the store)
            raise _failed(staged, exc) from None
        finally:
            for inp in staged:
                self._drop(inp)

    def _plan(self, inp: _Input) -> tuple[list[ColumnPlan], list[RowError]]:
        """How each contract column of ``inp`` is read (:func:`column_plan`), and the whole-input problems: those
        of its columns, and an exact decimal that a float cannot hold to a microsecond (:func:`lossy_decimals`)."""
        plans, problems = column_plan(inp.source, inp.types, json_column=inp.json_column)
        if inp.json_column is None:
            problems += [RowError(inp.source, None, d.column, d.value, "lossy_decimal", d.message())
                         for d in lossy_decimals(self.con, inp.source_sql, inp.row_sql, inp.types)]
        return plans, problems

    def _validate(
        self, staged: list[_Input], planned: list[tuple[list[ColumnPlan], list[RowError]]], skip_invalid: bool
    ) -> list[_Checked]:
        """The detailed validation of every input; raises :class:`InvalidInputError` as the contract says."""
        checked: list[_Checked] = []
        all_errors: list[RowError] = []
        n_bad = 0
        for inp, (plans, problems) in zip(staged, planned, strict=True):
            if problems:  # a whole-input problem: no row of this input can be loaded
                all_errors.extend(problems)
                n_bad += inp.n_rows
                checked.append(_Checked(inp, plans, [], problems, set()))
                continue
            conds = violation_conditions(plans)
            errors: list[RowError] = []
            bad_rows: set[int] = set()
            if not self._is_clean(inp, plans, conds):
                errors, bad_rows = self._find_errors(inp, plans, conds)
                all_errors.extend(errors)
                n_bad += len(bad_rows)
            checked.append(_Checked(inp, plans, conds, errors, bad_rows))
        whole_input_problem = any(e.row is None for e in all_errors)
        if all_errors and (not skip_invalid or whole_input_problem):
            raise InvalidInputError(all_errors, n_bad)
        return checked

    def _load(
        self, checked: list[_Checked], check_rows: bool, skip_invalid: bool,
        on_progress: ProgressCallback | None, total: int,
    ) -> list[IngestReport]:
        """Insert the inputs in one transaction (rolled back on any error); with ``check_rows`` the insert
        validates each row itself (see :func:`checked_select`)."""
        reports: list[IngestReport] = []
        done = 0
        id_tables = [c.inp.ids for c in checked]  # temp tables made inside the transaction go with a rollback
        self.con.execute("BEGIN TRANSACTION")
        try:
            index = self._sync_id_index()
            for c in checked:
                if c.inp.id_range == (None, None):
                    rid = _id_value(c.plans)
                    c.inp.id_range = self._one(f"SELECT min({rid}), max({rid}) FROM {c.inp.source_sql}")
                inserted, already, conflicts = self._insert(c, check_rows, index, on_progress, done, total)
                done += c.inp.n_rows
                rejected_path = self._write_rejected(c.inp, c.errors, c.bad_rows) if skip_invalid else None
                reports.append(IngestReport(
                    c.inp.source, c.inp.n_rows, inserted, already - conflicts[0], len(c.bad_rows), rejected_path,
                    c.errors, conflicts[0], conflicts[1],
                ))
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            for c, name in zip(checked, id_tables, strict=True):
                c.inp.ids = name
            raise
        return reports

    def _insert(
        self,
        c: _Checked,
        check_rows: bool,
        index: _IdIndex,
        on_progress: ProgressCallback | None,
        done_before: int,
        total: int,
    ) -> tuple[int, int, tuple[int, tuple[str, ...]]]:
        """Insert one input's valid rows whose id is not stored yet, in chunks.

        Returns (inserted, skipped as stored, (conflicting, their first ids)); the skipped rows include
        the conflicting ones. The stored ids are looked up once, before the first chunk
        (:meth:`_stored_among`); when the input holds none (the common case) the chunks are inserted
        without any per-row lookup, and nothing is compared. Then the input's id range goes into
        :data:`ID_RANGE_TABLE` and, where the store keeps them, the hashes of the inserted rows into
        :data:`ID_HASH_TABLE`.
        """
        inp, plans, bad_rows = c.inp, c.plans, c.bad_rows
        cols = ", ".join(COLUMN_NAMES)
        values = ", ".join(f"{p.value} AS {p.column.name}" for p in plans)
        already = self._stored_among(inp, plans, index)
        bad_table = self._row_set(bad_rows) if bad_rows else ""
        if bad_table:
            inp.cleanup.append(bad_table)
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
            if check_rows:
                select = checked_select(plans, c.conds, inp.source_sql, filt, exclude_ids=already)
            else:
                select = f"SELECT {values} FROM {inp.source_sql}{filt}"
                if already:
                    select = (f"SELECT * FROM ({select}) AS n "
                              f"WHERE n.request_id NOT IN (SELECT request_id FROM {already})")
            row = self.con.execute(f"INSERT INTO {SUMMARY_TABLE} ({cols}) {select}").fetchone()
            inserted += int(row[0]) if row else 0
            if on_progress:
                on_progress("loading", min(done_before + (k + 1) * INSERT_CHUNK_ROWS, done_before + inp.n_rows),
                            total)
        keep = [f"r NOT IN (SELECT r FROM {bad_table})"] if bad_rows else []
        if index.hashes and already:
            self.con.execute(
                f"INSERT INTO {ID_HASH_TABLE} SELECT hash(rid) FROM (SELECT {inp.row_sql} AS r, "
                f"{_id_value(plans)} AS rid FROM {inp.source_sql}) "
                f"WHERE {' AND '.join([*keep, f'rid NOT IN (SELECT request_id FROM {already})'])}"
            )
        elif index.hashes:
            filt = f" WHERE {keep[0]}" if keep else ""
            self.con.execute(f"INSERT INTO {ID_HASH_TABLE} SELECT h FROM {self._id_table(inp, plans)}{filt}")
        if inserted:
            lo, hi = inp.id_range
            self.con.execute(f"INSERT INTO {ID_RANGE_TABLE} VALUES (?, ?, ?)", [lo, hi, inserted])
        index.stored += inserted
        conflicts = self._conflicts(inp, plans, already, bad_table) if already else (0, ())
        return inserted, inp.n_rows - len(bad_rows) - inserted, conflicts

    def _conflicts(
        self, inp: _Input, plans: list[ColumnPlan], already: str, bad_table: str
    ) -> tuple[int, tuple[str, ...]]:
        """Rows of the input whose ``request_id`` is stored (``already``) with other content: their number
        and the first :data:`CONFLICT_IDS_KEPT` ids, in input order.

        Run only when the input holds stored ids, over those rows alone. First one scan of them: the sum of
        their content hashes against the sum of the stored rows' (kept in ``already``); equal sums mean
        identical content (a re-ingest; a changed row going unnoticed takes a 64-bit collision, and its
        stored row is kept either way). Otherwise, or with rejected rows to leave out, the converted values
        of each input row are compared column by column with the stored row, nulls equal to nulls.
        """
        values = ", ".join(f"{p.value} AS {p.column.name}" for p in plans)
        if not bad_table:
            same = self._one(
                f"SELECT (SELECT sum(ch) FROM {already}) IS NOT DISTINCT FROM (SELECT sum({_content_hash()}) "
                f"FROM (SELECT {values} FROM {inp.source_sql}) WHERE request_id IN (SELECT request_id FROM {already}))"
            )[0]
            if same:
                return 0, ()
        keep = f" AND n.__r NOT IN (SELECT r FROM {bad_table})" if bad_table else ""
        differs = " OR ".join(f"n.{c} IS DISTINCT FROM s.{c}" for c in COLUMN_NAMES if c != "request_id")
        lo, hi = inp.id_range
        rows = self.con.execute(
            f"SELECT count(*) OVER () AS n, n.request_id FROM (SELECT {inp.row_sql} AS __r, {values} "
            f"FROM {inp.source_sql}) AS n "
            f"JOIN (SELECT * FROM {SUMMARY_TABLE} WHERE request_id BETWEEN $lo AND $hi "
            f"AND request_id IN (SELECT request_id FROM {already})) AS s ON s.request_id = n.request_id "
            f"WHERE n.request_id IN (SELECT request_id FROM {already}){keep} AND ({differs}) "
            f"ORDER BY n.__r LIMIT {CONFLICT_IDS_KEPT}",
            {"lo": lo, "hi": hi},
        ).fetchall()
        return (int(rows[0][0]), tuple(str(r[1]) for r in rows)) if rows else (0, ())


@contextmanager
def open_store(path: str | os.PathLike[str], *, read_only: bool = False) -> Iterator[Store]:
    """Context-manager form of :meth:`Store.open`."""
    store = Store.open(path, read_only=read_only, create=not read_only)
    try:
        yield store
    finally:
        store.close()
