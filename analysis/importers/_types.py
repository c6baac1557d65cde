"""The vocabulary of importers: options, the per-file report, the importer record, the errors.

A request-summary importer has ``convert``: one file in, one frame with exactly
:func:`~llmslo.analysis.store.polars_schema` and an :class:`ImportReport` out. An importer of another kind
of data (traces become arrival schedules) has ``run`` instead and stores what it produces itself,
returning one report per file. ``detect`` lets ``llmslo import auto`` recognise a file from its first bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmslo.analysis.store import InvalidInputError, RowError
from llmslo.telemetry import LlmsloError

if TYPE_CHECKING:
    import polars as pl

HEAD_BYTES = 256 * 1024
"""How much of a file :func:`~llmslo.analysis.importers.detect_kind` reads to recognise it."""


WARMUP_TENANT_CLASS = "warmup"
"""``tenant_class`` of kept requests that a tool ran before its measured window (``keep_warmup_cooldown``)."""
COOLDOWN_TENANT_CLASS = "cooldown"
"""``tenant_class`` of kept requests that a tool ran after its measured window (``keep_warmup_cooldown``)."""


@dataclass(frozen=True)
class ImportOptions:
    """Choices of the person importing.

    ``model`` overrides the model name found in the file. ``keep_warmup_cooldown``: requests a tool ran
    outside its measured window (guidellm's warm-up and cool-down, AIPerf's warm-up phase), which the tool
    left out of its own figures, are imported too, in ``tenant_class`` :data:`WARMUP_TENANT_CLASS` /
    :data:`COOLDOWN_TENANT_CLASS` (by default they are not imported, and the report says how many).
    """

    model: str | None = None
    keep_warmup_cooldown: bool = False


@dataclass(frozen=True)
class ImportReport:
    """What one imported file contributed, and how its figures were made to mean what llmslo's mean.

    ``rows_read`` counts the records found in the file, ``rows_imported`` the rows of the converted
    frame (rows the store already holds are skipped later and counted by the store). ``conversions``
    are sentences, each saying what was converted, how and for how many requests. ``missing_fields``
    names what the file does not record (and so what no figure from it can show).
    ``arrivals_available`` is false when the file has no request start times: every row then carries
    the same ``arrival_unix_s``, and windows and per-second rates cannot come from it (the report uses
    ``run_duration_s`` for rates, or gives null);
    ``arrival_note`` says which representation was used. ``finish_reasons`` counts rows per finish
    reason. ``id_prefix`` is the part before ``#`` of every ``request_id`` the import wrote (the first 16
    hex digits of the SHA-256 of the file's bytes; empty for imports that write no request summaries).
    ``run_duration_s`` is the run's duration in seconds as the file itself records it (None where it
    records none) and ``run_duration_note`` says where it came from, or why there is none.
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
    id_prefix: str = ""
    run_duration_s: float | None = None
    run_duration_note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        out = asdict(self)
        out["conversions"] = list(self.conversions)
        out["missing_fields"] = list(self.missing_fields)
        return out


Converter = Callable[[Path, ImportOptions], "tuple[pl.DataFrame, ImportReport]"]
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


def read_head(path: Path, size: int = HEAD_BYTES) -> str:
    """The first ``size`` bytes of a file as text (undecodable bytes replaced, a leading BOM dropped)."""
    with path.open("rb") as fh:
        raw = fh.read(size)
    return raw.decode("utf-8", errors="replace").lstrip("\ufeff")
