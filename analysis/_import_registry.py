"""Importers of other tools' outputs: the registry ``llmslo import KIND`` dispatches through.

An importer is registered once under a ``kind`` (``llmperf``, ``vllm-bench``, ...). A request-summary
importer has ``convert``: one file in, one frame with exactly :func:`~llmslo.analysis.polars_schema` and an
:class:`ImportReport` out; the command line validates and loads the frame through
:meth:`~llmslo.analysis.Store.ingest_frame`. An importer of another kind of data (traces, arrival
schedules) has ``run`` instead and stores what it produces itself, returning one report per file.
``detect`` lets ``llmslo import auto`` recognise a file from its first bytes.

Importers in :data:`BUILTIN_MODULES` register themselves when first needed; another module registers
its own with :func:`register_importer`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from llmslo.analysis._validation import InvalidInputError, RowError
from llmslo.telemetry import LlmsloError

HEAD_BYTES = 256 * 1024
"""How much of a file :func:`detect_kind` reads to recognise it."""

BUILTIN_MODULES: tuple[str, ...] = ("llmslo.analysis._import_bench", "llmslo.analysis._import_traces")
"""Modules whose importers register themselves on import; a module that does not exist is skipped."""


@dataclass(frozen=True)
class ImportOptions:
    """Choices of the person importing: ``model`` overrides the model name found in the file."""

    model: str | None = None


@dataclass(frozen=True)
class ImportReport:
    """What one imported file contributed, and how its figures were made to mean what llmslo's mean.

    ``rows_read`` counts the records found in the file, ``rows_imported`` the rows of the converted
    frame (rows the store already holds are skipped later and counted by the store). ``conversions``
    are sentences, each saying what was converted, how and for how many requests. ``missing_fields``
    names what the file does not record (and so what no figure from it can show).
    ``arrivals_available`` is false when the file has no request start times: every row then carries
    the same ``arrival_unix_s`` and windows and per-second rates from it are meaningless;
    ``arrival_note`` says which representation was used. ``finish_reasons`` counts rows per finish
    reason.
    """

    source: str
    kind: str
    tool: str
    rows_read: int
    rows_imported: int
    conversions: tuple[str, ...]
    missing_fields: tuple[str, ...]
    arrivals_available: bool
    arrival_note: str
    finish_reasons: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        out = asdict(self)
        out["conversions"] = list(self.conversions)
        out["missing_fields"] = list(self.missing_fields)
        return out


Converter = Callable[[Path, ImportOptions], tuple[pl.DataFrame, ImportReport]]
"""``convert(path, options) -> (frame, report)``; raises :class:`ImportFormatError` for a malformed file."""
Runner = Callable[[Sequence[Path], Path, ImportOptions], list[ImportReport]]
"""``run(paths, db, options) -> reports`` for importers that store something other than request summaries."""
Detector = Callable[[Path, str], bool]
"""``detect(path, head) -> bool``; ``head`` is the file's first :data:`HEAD_BYTES` bytes as text."""


@dataclass(frozen=True)
class Importer:
    """One kind of input ``llmslo import`` understands. Exactly one of ``convert`` and ``run`` is set."""

    kind: str
    description: str
    convert: Converter | None = None
    run: Runner | None = None
    detect: Detector | None = None

    def __post_init__(self) -> None:
        if (self.convert is None) == (self.run is None):
            raise ValueError(f"importer {self.kind!r}: set exactly one of convert and run")


class ImportFormatError(InvalidInputError):
    """A file cannot be imported: the message names the file, the record and the field; nothing was written.

    ``errors`` lists the problems (:class:`~llmslo.analysis.RowError`, ``row`` the 1-based record number
    or None for the whole file); ``invalid_rows`` counts the records concerned.
    """

    def __init__(self, errors: Sequence[RowError], invalid_rows: int | None = None, shown: int = 20) -> None:
        self.errors = list(errors)
        self.invalid_rows = invalid_rows if invalid_rows is not None else len({e.row for e in self.errors})
        lines = [describe_problem(e) for e in self.errors[:shown]]
        if len(self.errors) > shown:
            lines.append(f"... and {len(self.errors) - shown} more problems")
        sources = sorted({e.source for e in self.errors})
        head = f"cannot import {', '.join(sources)}; nothing was imported."
        LlmsloError.__init__(self, head + "\n" + "\n".join(lines))


def describe_problem(e: RowError) -> str:
    """One line naming file, record (1-based; absent for a whole-file problem), field and value."""
    where = f"{e.source}: record {e.row}" if e.row is not None else e.source
    shown = "" if e.value is None else f" = {e.value!r}"
    return f"{where}, field {e.column}{shown}: {e.message} [{e.rule}]"


class UnknownKindError(LlmsloError):
    """An import kind that no importer provides, or a file ``auto`` does not recognise."""


_REGISTRY: dict[str, Importer] = {}
_loaded = False


def register_importer(importer: Importer, *, replace: bool = False) -> None:
    """Make ``importer`` available as ``llmslo import <importer.kind>`` (and to ``auto`` if it can detect)."""
    if importer.kind == "auto":
        raise ValueError("'auto' is reserved for detection")
    if importer.kind in _REGISTRY and not replace and _REGISTRY[importer.kind] is not importer:
        raise ValueError(f"an importer for {importer.kind!r} is already registered")
    _REGISTRY[importer.kind] = importer


def _load_builtin() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for name in BUILTIN_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # the module exists but something it needs does not: say so
                raise


def importers() -> dict[str, Importer]:
    """Every registered importer by kind, in registration order."""
    _load_builtin()
    return dict(_REGISTRY)


def importer_for(kind: str) -> Importer:
    """The importer of ``kind``; raises :class:`UnknownKindError` listing the known kinds."""
    known = importers()
    if kind not in known:
        raise UnknownKindError(f"unknown import kind {kind!r}; choose from {', '.join([*known, 'auto'])}")
    return known[kind]


def read_head(path: Path, size: int = HEAD_BYTES) -> str:
    """The first ``size`` bytes of a file as text (undecodable bytes replaced, a leading BOM dropped)."""
    with path.open("rb") as fh:
        raw = fh.read(size)
    return raw.decode("utf-8", errors="replace").lstrip("\ufeff")


def detect_kind(path: str | os.PathLike[str]) -> str:
    """The import kind of a file, recognised from its content (not its name).

    Raises :class:`UnknownKindError` for a missing file or one no importer recognises.
    """
    p = Path(path)
    if not p.is_file():
        raise UnknownKindError(f"{p}: no such file")
    head = read_head(p)
    for importer in importers().values():
        if importer.detect is not None and importer.detect(p, head):
            return importer.kind
    kinds = ", ".join(k for k, imp in importers().items() if imp.detect is not None)
    raise UnknownKindError(
        f"{p}: not recognised as any of {kinds}; name the kind explicitly (llmslo import KIND FILE)"
    )
