"""The whole of ``llmslo import``: recognise, convert every file, then write summaries and provenance.

Every file is converted before anything is written, so a malformed file stops the import with nothing
stored. Then each converted file is validated and loaded through :meth:`Store.ingest_frame` (one
transaction per file; rows whose ``request_id`` is stored already are skipped and counted) and its
provenance is recorded in :data:`~llmslo.analysis.store.IMPORTS_TABLE`, keyed by the SHA-256 of the
file's bytes. Importers of other data (traces become arrival schedules) run last.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmslo.analysis.importers._registry import detect_kind, importer_for
from llmslo.analysis.importers._types import ImportOptions, ImportReport, UnknownKindError
from llmslo.analysis.store import IMPORTS_TABLE, IngestReport, Store, imports_ddl, table_names

if TYPE_CHECKING:
    import polars as pl

__all__ = ["FileImport", "ImportResult", "import_files", "recorded_imports"]

ProgressCallback = Callable[[str, int, int], None]
"""``on_progress(stage, done_files, total_files)``."""

_HASH_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class FileImport:
    """One imported file: the importer's report and, for request summaries, what the store did with them
    (``ingest`` is None for importers that write something else, such as trace schedules)."""

    report: ImportReport
    ingest: IngestReport | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: the import report plus ``rows_inserted`` and ``rows_already_stored`` (or null)."""
        out = self.report.to_dict()
        out["rows_inserted"] = self.ingest.rows_inserted if self.ingest else None
        out["rows_already_stored"] = self.ingest.rows_already_stored if self.ingest else None
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


def content_sha256(path: Path) -> str:
    """SHA-256 (hex) of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


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
    kinds = [detect_kind(p) if kind == "auto" else kind for p in paths]

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
            store.con.execute(imports_ddl())
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


def _record(store: Store, path: Path, report: ImportReport, ingest: IngestReport) -> None:
    store.con.execute(
        f"INSERT OR REPLACE INTO {IMPORTS_TABLE} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [content_sha256(path), report.source, report.kind, report.tool, report.rows_read, report.rows_imported,
         ingest.rows_inserted, ingest.rows_already_stored, report.arrivals_available, report.arrival_note,
         list(report.conversions), list(report.missing_fields), dict(report.finish_reasons), time.time()],
    )


def recorded_imports(store: Store) -> list[dict[str, Any]]:
    """The provenance rows of the store (empty for a store nothing was imported into), oldest first."""
    if IMPORTS_TABLE not in table_names(store.con):
        return []
    rel = store.con.sql(f"SELECT * FROM {IMPORTS_TABLE} ORDER BY imported_unix_s, source")
    names = list(rel.columns)
    return [dict(zip(names, row, strict=True)) for row in rel.fetchall()]
