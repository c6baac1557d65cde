"""The registry ``llmslo import KIND`` dispatches through: an explicit table of the built-in importers.

The built-in kinds are listed in :data:`BUILTIN_IMPORTERS` (one module per tool, plus the trace kinds);
another module adds its own with :func:`register_importer`. Nothing registers itself on import.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from llmslo.analysis.importers import _genai_perf, _guidellm, _llmperf, _vllm_bench
from llmslo.analysis.importers._traces import TRACE_IMPORTERS
from llmslo.analysis.importers._types import Importer, ImportOptions, ImportReport, UnknownKindError, read_head
from llmslo.telemetry import COLUMNS

if TYPE_CHECKING:
    import polars as pl

__all__ = ["BUILTIN_IMPORTERS", "convert_file", "detect_kind", "importer_for", "importers", "register_importer"]

BUILTIN_IMPORTERS: tuple[Importer, ...] = (
    _vllm_bench.IMPORTER,
    _llmperf.IMPORTER,
    _genai_perf.IMPORTER,
    _guidellm.IMPORTER,
    *TRACE_IMPORTERS,
)
"""The importers shipped with llmslo, in the order ``auto`` tries them."""

_REGISTRY: dict[str, Importer] = {i.kind: i for i in BUILTIN_IMPORTERS}


def register_importer(importer: Importer, *, replace: bool = False) -> None:
    """Make ``importer`` available as ``llmslo import <importer.kind>`` (and to ``auto`` if it can detect)."""
    if importer.kind == "auto":
        raise ValueError("'auto' is reserved for detection")
    if importer.kind in _REGISTRY and not replace and _REGISTRY[importer.kind] is not importer:
        raise ValueError(f"an importer for {importer.kind!r} is already registered")
    _REGISTRY[importer.kind] = importer


def importers() -> dict[str, Importer]:
    """Every registered importer by kind, in registration order."""
    return dict(_REGISTRY)


def importer_for(kind: str) -> Importer:
    """The importer of ``kind``; raises :class:`UnknownKindError` listing the known kinds."""
    known = importers()
    if kind not in known:
        raise UnknownKindError(f"unknown import kind {kind!r}; choose from {', '.join([*known, 'auto'])}")
    return known[kind]


def detect_kind(path: str | os.PathLike[str], *, store: str | os.PathLike[str] | None = None) -> str:
    """The import kind of a file, recognised from its content (not its name).

    Raises :class:`UnknownKindError` for a missing file or one no importer recognises; for a file already in
    llmslo's own request-summary format the message points to ``llmslo ingest`` (into ``store``, when given).
    """
    p = Path(path)
    if not p.is_file():
        raise UnknownKindError(f"{p}: no such file")
    head = read_head(p)
    for importer in importers().values():
        if importer.detect is not None and importer.detect(p, head):
            return importer.kind
    own = _own_format(p, head)
    if own is not None:
        raise UnknownKindError(
            f"{p}: this file is already in llmslo's request-summary format ({own} with the summary's columns), not "
            f"another tool's output: there is nothing to convert; load it with `llmslo ingest {p} --db "
            f"{store if store is not None else 'STORE'}`"
        )
    kinds = ", ".join(k for k, imp in importers().items() if imp.detect is not None)
    raise UnknownKindError(
        f"{p}: not recognised as any of {kinds}; name the kind explicitly (llmslo import KIND FILE)"
    )


_KEY = re.compile(r'"([^"\\]+)"\s*:')


def _own_format(p: Path, head: str) -> str | None:
    """``Parquet``, ``JSONL``, ``JSON`` or ``CSV`` when the file holds every required column of the request summary
    (what ``llmslo ingest`` reads), else None."""
    required = {c.name for c in COLUMNS if c.required}
    if head.startswith("PAR1"):
        import pyarrow.parquet as pq

        try:
            names = set(pq.read_schema(p).names)
        except Exception:  # not a readable Parquet file: not ours either
            return None
        return "Parquet" if required <= names else None
    text = head.lstrip()
    first = text.split("\n", 1)[0]
    if first.startswith("{"):
        return "JSONL" if required <= set(_KEY.findall(first)) else None
    if first.startswith("["):
        return "JSON" if required <= set(_KEY.findall(text)) else None
    names = {n.strip().strip('"') for n in first.split(",")}
    return "CSV" if required <= names else None


def convert_file(
    path: str | os.PathLike[str], kind: str = "auto", *, model: str | None = None,
    keep_warmup_cooldown: bool = False,
) -> tuple[pl.DataFrame, ImportReport]:
    """Convert one benchmark file of ``kind`` (``auto``: recognised from its content) to request summaries.

    ``model`` and ``keep_warmup_cooldown`` are those of :class:`ImportOptions`.

    Raises :class:`UnknownKindError` for an unknown kind, an unrecognised file or a kind that is not
    per-request results, and :class:`ImportFormatError` for a malformed file. Nothing is written.
    """
    p = Path(path)
    chosen = detect_kind(p) if kind == "auto" else kind
    importer = importer_for(chosen)
    if importer.convert is None:
        raise UnknownKindError(f"{chosen!r} files are not per-request benchmark results; use `llmslo import {chosen}`")
    return importer.convert(p, ImportOptions(model=model, keep_warmup_cooldown=keep_warmup_cooldown))
