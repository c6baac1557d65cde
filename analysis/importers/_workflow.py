"""The whole of ``llmslo import``: recognise, convert every file, then write summaries and provenance.

Every file is converted before anything is written, so a malformed file stops the import with nothing
stored. Then each converted file is validated and loaded through :meth:`Store.ingest_frame` (one
transaction per file; rows whose ``request_id`` is stored already are skipped and counted) and its
provenance is recorded in :data:`~llmslo.analysis.store.IMPORTS_TABLE`, keyed by the SHA-256 of the
file's bytes. Importers of other data (traces become arrival schedules) run last.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmslo.analysis.importers._common import content_sha256
from llmslo.analysis.importers._registry import detect_kind, importer_for
from llmslo.analysis.importers._types import ImportOptions, ImportReport, UnknownKindError
from llmslo.analysis.store import IMPORTS_TABLE, IngestReport, Store, imports_ddl, table_names

if TYPE_CHECKING:
    import polars as pl

__all__ = ["FileImport", "ImportResult", "import_files", "recorded_imports"]

ProgressCallback = Callable[[str, int, int], None]
"""``on_progress(stage, done_files, total_files)``."""

ADDED_COLUMNS: tuple[tuple[str, str], ...] = (
    ("id_prefix", "VARCHAR"),
    ("run_duration_s", "DOUBLE"),
    ("run_duration_note", "VARCHAR"),
)
"""Provenance columns added after the first release of the table, in order: a store created before gets them
(``ALTER TABLE ... ADD COLUMN IF NOT EXISTS``) before anything is inserted."""


@dataclass(frozen=True)
class FileImport:
    """One imported file: the importer's report and, for request summaries, what the store did with them
    (``ingest`` is None for importers that write something else, such as trace schedules)."""

    report: ImportReport
    ingest: IngestReport | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: the import report plus ``rows_inserted``, ``rows_already_stored`` and
        ``rows_conflicting`` (ids stored with other content, e.g. the same file under another ``--model``; the
        stored rows are kept), each null for importers that write no request summaries."""
        out = self.report.to_dict()
        out["rows_inserted"] = self.ingest.rows_inserted if self.ingest else None
        out["rows_already_stored"] = self.ingest.rows_already_stored if self.ingest else None
        out["rows_conflicting"] = self.ingest.rows_conflicting if self.ingest else None
        return out


@dataclass(frozen=True)
class ImportResult:
    """Every file of one import, in the order given, and the store's row count afterwards (None when no
    file held request summaries)."""

    files: tuple[FileImport, ...]
    store_rows: int | None

    def to_dict(self) -> dict[str, Any]:
        """The JSON of ``llmslo import --json``."""
        return {"files": [f.to_dict() for f in self.files], "store_rows": self.store_rows}


def import_files(
    files: Sequence[str | os.PathLike[str]],
    kind: str,
    db: str | os.PathLike[str],
    options: ImportOptions | None = None,
    *,
    on_progress: ProgressCallback | None = None,
) -> ImportResult:
    """Import ``files`` of ``kind`` (``auto``: each recognised from its content) into the store at ``db``.

    Raises :class:`UnknownKindError` for an unknown kind, a missing file or one ``auto`` does not
    recognise, and :class:`ImportFormatError` for a malformed file: in both cases before anything is
    written. :class:`~llmslo.analysis.store.StoreError` when the store cannot be opened or written.
    """
    options = options or ImportOptions()
    paths = [Path(f) for f in files]
    if kind != "auto":
        importer_for(kind)
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise UnknownKindError(f"no such file: {', '.join(missing)}")
    kinds = [detect_kind(p, store=db) if kind == "auto" else kind for p in paths]

    converted: list[tuple[int, Path, pl.DataFrame, ImportReport]] = []
    run_groups: dict[str, list[tuple[int, Path]]] = {}
    for i, (path, k) in enumerate(zip(paths, kinds, strict=True)):
        if on_progress:
            on_progress("converting", i, len(paths))
        importer = importer_for(k)
        if importer.convert is not None:
            frame, report = importer.convert(path, options)
            converted.append((i, path, frame, report))
        else:
            run_groups.setdefault(k, []).append((i, path))

    results: dict[int, FileImport] = {}
    store_rows: int | None = None
    if converted:
        with Store.open(db) as store:
            prepare_imports_table(store)
            for done, (i, path, frame, report) in enumerate(converted):
                if on_progress:
                    on_progress("loading", done, len(converted))
                ingest = store.ingest_frame(frame, source=str(path))
                _record(store, path, report, ingest)
                results[i] = FileImport(report, ingest)
            store_rows = store.count()
    for k, group in run_groups.items():
        runner = importer_for(k).run
        assert runner is not None  # an Importer has exactly one of convert and run
        reports = runner([p for _, p in group], Path(db), options)
        for (i, _), report in zip(group, reports, strict=True):
            results[i] = FileImport(report, None)
    return ImportResult(tuple(results[i] for i in sorted(results)), store_rows)


def prepare_imports_table(store: Store) -> None:
    """Create the provenance table, or add the columns a table from an older store lacks."""
    store.con.execute(imports_ddl())
    for name, sql_type in ADDED_COLUMNS:
        store.con.execute(f"ALTER TABLE {IMPORTS_TABLE} ADD COLUMN IF NOT EXISTS {name} {sql_type}")


def _record(store: Store, path: Path, report: ImportReport, ingest: IngestReport) -> None:
    values: dict[str, Any] = {
        "content_sha256": content_sha256(path), "source": report.source, "kind": report.kind,
        "tool": report.tool, "rows_read": report.rows_read, "rows_imported": report.rows_imported,
        "rows_inserted": ingest.rows_inserted, "rows_already_stored": ingest.rows_already_stored,
        "arrivals_available": report.arrivals_available, "arrival_note": report.arrival_note,
        "conversions": list(report.conversions), "missing_fields": list(report.missing_fields),
        "finish_reasons": dict(report.finish_reasons), "imported_unix_s": time.time(),
        "id_prefix": report.id_prefix, "run_duration_s": report.run_duration_s,
        "run_duration_note": report.run_duration_note,
    }
    names = ", ".join(values)
    marks = ", ".join("?" for _ in values)
    store.con.execute(f"INSERT OR REPLACE INTO {IMPORTS_TABLE} ({names}) VALUES ({marks})", list(values.values()))


def recorded_imports(store: Store) -> list[dict[str, Any]]:
    """The provenance rows of the store (empty for a store nothing was imported into), oldest first."""
    if IMPORTS_TABLE not in table_names(store.con):
        return []
    rel = store.con.sql(f"SELECT * FROM {IMPORTS_TABLE} ORDER BY imported_unix_s, source")
    names = list(rel.columns)
    return [dict(zip(names, row, strict=True)) for row in rel.fetchall()]
