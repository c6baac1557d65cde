"""What every benchmark importer shares: reading fields with errors that name them, building rows.

A benchmark tool measures each request on the client: request sent → first content chunk → last content
chunk → response complete. :class:`Measured` holds one request in those terms (seconds from the request
being sent) and :class:`RowBuilder` turns it into a request-summary row by one rule for every tool:

- ``ttft_s`` / ``last_token_s`` / ``e2e_s`` hold the client-measured first chunk / last content chunk /
  response complete times (the files hold no server timestamps, and the report reads these columns);
  ``client_ttft_s`` / ``client_e2e_s`` repeat them so the origin stays visible. ``queue_s`` is null.
- A request that produced no token has ``ttft_s`` and ``last_token_s`` null; a rejected request produced
  nothing, whatever the file says about its tokens.
- An unknown duration (a failed request whose tool recorded none) is stored as a lower bound: the latest
  time the file does record for the request (its first chunk), else ``e2e_s = 0``; ``client_e2e_s`` is
  null. The contract needs a value and a lower bound claims nothing false.
- ``generated_tokens = sent_tokens`` = the tool's output-token count (what reached the client).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

import polars as pl

from llmslo.analysis.importers._types import ImportFormatError, ImportReport
from llmslo.analysis.store import RowError, polars_schema
from llmslo.telemetry import COLUMN_NAMES

EPS_S = 1e-6
"""Tolerance, seconds, for the ordering first chunk ≤ last chunk ≤ complete (floating-point sums)."""

UNKNOWN_VERSION = "unknown"
"""``version`` of imported rows when the file does not record one."""
DEFAULT_TENANT_CLASS = "benchmark"
"""``tenant_class`` of imported rows when the file records no load level."""

SERVER_COLUMNS_NOTE = (
    "Client-side measurements: ttft_s, last_token_s and e2e_s hold the client-measured times (request sent → "
    "first content chunk, last content chunk, response complete) and client_ttft_s/client_e2e_s repeat them; "
    "the file has no server timestamps, so these include network and client time and queue_s is null."
)

MISSING_SERVER_FIELDS: tuple[str, ...] = (
    "server-side timestamps (arrival, scheduled, first/last token commit)",
    "queue_s",
    "proposed_tokens (speculative decoding)",
    "stream_paused_s / stream_max_queued (server send queue)",
)

_HTTP_PHRASES = {s.phrase.lower(): s.value for s in HTTPStatus}
_HTTP_CODE_AT_START = re.compile(r"^\s*(?:http\s*)?([1-5]\d\d)\b", re.IGNORECASE)
_CODE_BEFORE_WORDS = re.compile(r"\b([1-5]\d\d)\s+(?=[A-Za-z])")
ERROR_TYPES_FIXED: tuple[str, ...] = ("client_timeout", "client_error", "no_first_token", "too_few_tokens")
"""The bounded ``error_type`` values besides ``http_<code>`` (100-599)."""


class Problems:
    """Collects the problems of one file; :meth:`raise_if_any` raises them together (nothing is imported)."""

    def __init__(self, source: Path) -> None:
        self.source = str(source)
        self.errors: list[RowError] = []

    def add(self, row: int | None, field: str, value: object, rule: str, message: str) -> None:
        shown = None if value is None else _shown(value)
        self.errors.append(RowError(self.source, row, field, shown, rule, message))

    def file(self, field: str, rule: str, message: str) -> ImportFormatError:
        """A whole-file problem, raised at once."""
        self.add(None, field, None, rule, message)
        return ImportFormatError(self.errors)

    def raise_if_any(self) -> None:
        if self.errors:
            raise ImportFormatError(self.errors)


def _shown(value: object) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 80 else text[:77] + "..."


ID_PREFIX_HEX = 16
"""Hex digits of the file's SHA-256 that make the ``request_id`` prefix (``<prefix>#<index>``)."""
_HASH_CHUNK_BYTES = 1 << 20


def content_sha256(path: Path) -> str:
    """SHA-256 (hex) of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def id_prefix(path: Path) -> str:
    """The ``request_id`` prefix of a file's rows: the first :data:`ID_PREFIX_HEX` hex digits of its SHA-256.

    Derived from the content, not the name: the same file imported again (under any name) gives the same
    ids, and two different files of the same name (GenAI-Perf always writes ``profile_export.json``) do not
    collide.
    """
    return content_sha256(path)[:ID_PREFIX_HEX]


class _DuplicateKey(ValueError):
    def __init__(self, key: str, keys: Sequence[str]) -> None:
        super().__init__(key)
        self.key = key
        self.keys = keys


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` that refuses an object naming a key twice (``json`` would keep the last silently)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key, [k for k, _ in pairs])
        out[key] = value
    return out


def _duplicate_message(exc: _DuplicateKey) -> str:
    shown = ", ".join(dict.fromkeys(exc.keys[:8]))
    return (f"a JSON object names the key {exc.key!r} twice (its keys: {shown}); which value is meant is "
            "ambiguous — fix the file so each key appears once")


def _read_text(path: Path, problems: Problems) -> str:
    """The file's text (UTF-8, a leading BOM dropped); bad UTF-8 and an empty file are whole-file problems.

    Bad bytes are named by line and byte offset, and the line is the record for JSON-lines files.
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise problems.file("-", "unreadable", f"cannot read the file: {exc}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        problems.add(line, "-", None, "encoding",
                     f"line {line} (byte offset {exc.start}) is not valid UTF-8 ({exc.reason}); save the file as "
                     "UTF-8")
        raise ImportFormatError(problems.errors) from None
    if not text.strip():
        raise problems.file("-", "empty", "the file is empty (no records); was the run cut short?")
    return text


def _decode_error(exc: json.JSONDecodeError) -> str:
    return f"not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"


def load_json(path: Path, problems: Problems) -> Any:
    """The parsed JSON of a file; malformed JSON (named by line and column), bad UTF-8, an empty file or a
    key repeated in one object is a whole-file problem."""
    text = _read_text(path, problems)
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise problems.file("-", "malformed_json", _decode_error(exc)) from None
    except _DuplicateKey as exc:
        raise problems.file(exc.key, "duplicate_key", _duplicate_message(exc)) from None


def load_json_documents(path: Path, problems: Problems) -> list[Any]:
    """One or more JSON values written one after another (``--append-result`` writes several objects)."""
    text = _read_text(path, problems)
    decoder = json.JSONDecoder(object_pairs_hook=_no_duplicate_keys)
    docs: list[Any] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            break
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise problems.file("-", "malformed_json", _decode_error(exc)) from None
        except _DuplicateKey as exc:
            where = f"result object {len(docs) + 1}: " if docs else ""
            raise problems.file(exc.key, "duplicate_key", where + _duplicate_message(exc)) from None
        docs.append(value)
    return docs


def load_jsonl(path: Path, problems: Problems) -> list[Any]:
    """Every non-empty line of a JSON-lines file, parsed; a bad line (malformed, a key repeated, bad UTF-8)
    is named by its number, which is also the record number."""
    text = _read_text(path, problems)
    out: list[Any] = []
    for number, line in enumerate(text.split("\n"), start=1):  # not splitlines(): U+2028 may sit in a string
        if not line.strip():
            continue
        try:
            out.append(json.loads(line, object_pairs_hook=_no_duplicate_keys))
        except json.JSONDecodeError as exc:
            problems.add(number, "-", None, "malformed_json", f"line {number} is not valid JSON ({exc.msg})")
        except _DuplicateKey as exc:
            problems.add(number, exc.key, None, "duplicate_key", f"line {number}: {_duplicate_message(exc)}")
    problems.raise_if_any()
    return out


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def as_float(value: object) -> float | None:
    """``value`` as a finite float, or None when it is not a finite number (booleans are not numbers)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value)):
        return float(value)
    return None


class Reader:
    """Typed access to the fields of one record; every bad value is recorded with record and field named."""

    def __init__(self, problems: Problems, row: int, record: Mapping[str, Any], prefix: str = "") -> None:
        self.problems = problems
        self.row = row
        self.record = record
        self.prefix = prefix
        self.ok = True

    def _bad(self, name: str, value: object, rule: str, message: str) -> None:
        self.ok = False
        self.problems.add(self.row, self.prefix + name, value, rule, message)

    def seconds(self, name: str, *, required: bool = True, scale: float = 1.0) -> float | None:
        """A finite non-negative number of seconds (``value × scale``); None when absent or null."""
        if name not in self.record or self.record[name] is None:
            if required:
                self._bad(name, None, "missing", f"{self.prefix}{name} is required (a number of seconds)")
            return None
        value = self.record[name]
        if not is_number(value) or not math.isfinite(float(value)):
            self._bad(name, value, "type", f"{self.prefix}{name} must be a finite number")
            return None
        if value < 0:
            self._bad(name, value, "negative", f"{self.prefix}{name} must be >= 0")
            return None
        return float(value) * scale

    def nanoseconds(self, name: str, *, required: bool = True) -> int | float | None:
        """A finite non-negative timestamp in nanoseconds, returned unchanged (integers stay exact); None when
        absent or null."""
        if name not in self.record or self.record[name] is None:
            if required:
                self._bad(name, None, "missing", f"{self.prefix}{name} is required (a timestamp in nanoseconds)")
            return None
        value = self.record[name]
        if not is_number(value) or not math.isfinite(float(value)):
            self._bad(name, value, "type", f"{self.prefix}{name} must be a finite number of nanoseconds")
            return None
        if value < 0:
            self._bad(name, value, "negative", f"{self.prefix}{name} must be >= 0 (nanoseconds)")
            return None
        result: int | float = value
        return result

    def count(self, name: str, *, required: bool = True) -> int | None:
        """A non-negative whole number (an integral float is accepted); None when absent or null."""
        if name not in self.record or self.record[name] is None:
            if required:
                self._bad(name, None, "missing", f"{self.prefix}{name} is required (a token count)")
            return None
        value = self.record[name]
        if not is_number(value) or not math.isfinite(float(value)) or float(value) != int(value):
            self._bad(name, value, "type", f"{self.prefix}{name} must be a whole number")
            return None
        if value < 0:
            self._bad(name, value, "negative", f"{self.prefix}{name} must be >= 0")
            return None
        return int(value)

    def text(self, name: str, *, required: bool = False) -> str | None:
        if name not in self.record or self.record[name] is None:
            if required:
                self._bad(name, None, "missing", f"{self.prefix}{name} is required (text)")
            return None
        value = self.record[name]
        if not isinstance(value, str):
            self._bad(name, value, "type", f"{self.prefix}{name} must be text")
            return None
        return value

    def order(self, earlier: str, a: float | None, later: str, b: float | None) -> None:
        """Record a problem when ``a`` (field ``earlier``) exceeds ``b`` (field ``later``) beyond :data:`EPS_S`."""
        if a is not None and b is not None and a > b + EPS_S:
            self._bad(earlier, a, "order", f"{self.prefix}{earlier} ({a!r} s) exceeds {self.prefix}{later} ({b!r} s)")


def _code_with_phrase(text: str) -> int | None:
    """An HTTP status written with its reason phrase anywhere in ``text`` ("... '503 Service Unavailable' ...")."""
    lowered = text.lower()
    for m in _CODE_BEFORE_WORDS.finditer(text):
        code = int(m.group(1))
        phrase = next((p for p, c in _HTTP_PHRASES.items() if c == code), None)
        if phrase is not None and lowered.startswith(phrase, m.end()):
            return code
    return None


def classify_failure(code: int | None, message: str | None) -> tuple[str, str | None, str]:
    """``(finish_reason, reject_reason, error_type)`` of a failed request from an HTTP-like code and a message.

    HTTP 429 (or the phrase "Too Many Requests") → ``rejected`` / ``rate_limited``; 499 → ``client_cancel``;
    another code 100-599 (given; or the message is an HTTP reason phrase, starts with a code, or holds a code
    followed by its reason phrase) →
    ``error`` / ``http_<code>``; a message mentioning a timeout → ``client_timeout``; anything else →
    ``client_error``. ``error_type`` is always one of a bounded set (``http_<code>`` or
    :data:`ERROR_TYPES_FIXED`); it is returned for rejections too, for counting.
    """
    text = (message or "").strip()
    if code is None and text:
        code = _HTTP_PHRASES.get(text.lower())
        if code is None and (m := _HTTP_CODE_AT_START.match(text)):
            code = int(m.group(1))
        if code is None:
            code = _code_with_phrase(text)
    if code == 429:
        return "rejected", "rate_limited", "http_429"
    if code == 499:
        return "client_cancel", None, "http_499"
    if code is not None and 100 <= code <= 599:
        return "error", None, f"http_{code}"
    lowered = text.lower()
    if "timeout" in lowered or "timed out" in lowered:
        return "error", None, "client_timeout"
    return "error", None, "client_error"


@dataclass
class Measured:
    """One request as a client benchmark measured it; times are seconds from the request being sent.

    ``outcome``: ``ok``, ``rejected``, ``error`` or ``client_cancel``. ``first_s``/``last_s``: first and last
    content chunk (None: none received); ``complete_s``: response complete (None: unknown).
    ``output_tokens``: tokens received. ``itl_s``: token-weighted gaps when the file gives them per token.
    ``max_tokens``: the output-token limit the request carried, where the file records it (a success that
    reached it finished ``length``).
    """

    request_id: str
    arrival_unix_s: float
    outcome: str
    prompt_tokens: int
    output_tokens: int
    first_s: float | None
    last_s: float | None
    complete_s: float | None
    reject_reason: str | None = None
    error_type: str | None = None
    itl_s: list[float] | None = None
    tenant_class: str = DEFAULT_TENANT_CLASS
    max_tokens: int | None = None


class RowBuilder:
    """Accumulates request-summary rows (module docstring: the mapping) and counts what it did."""

    def __init__(self, model: str, version: str = UNKNOWN_VERSION) -> None:
        self.model = model
        self.version = version
        self.cols: dict[str, list[Any]] = {name: [] for name in COLUMN_NAMES}
        self.finish: Counter[str] = Counter()
        self.notes: Counter[str] = Counter()

    def add(self, m: Measured) -> None:
        finish = "stop" if m.outcome == "ok" else m.outcome
        if finish == "stop" and m.max_tokens is not None:
            self.notes["limit_known"] += 1
            if m.output_tokens >= m.max_tokens:
                finish = "length"
                self.notes["length"] += 1
        tokens = 0 if finish == "rejected" else m.output_tokens
        first, last = m.first_s, m.last_s
        if tokens > 0 and first is None:
            # a reply that arrived in one piece: its first token reached the client when it completed
            first = last = m.complete_s if m.complete_s is not None else 0.0
            self.notes["whole_reply"] += 1
        if tokens == 0:
            first = last = None
        if first is not None and last is None:
            last = first
        complete = m.complete_s
        known = [t for t in (m.first_s, m.last_s, first, last) if t is not None]
        e2e = complete if complete is not None else max(known, default=0.0)
        if complete is None and last is None:
            self.notes["unknown_duration"] += 1
        if first is not None and last is not None:
            last = max(last, first)  # tolerance-level disorder only: converters reject real disorder
            e2e = max(e2e, last)
        row: dict[str, Any] = {
            "request_id": m.request_id,
            "model": self.model,
            "version": self.version,
            "tenant_class": m.tenant_class,
            "arrival_unix_s": m.arrival_unix_s,
            "finish_reason": finish,
            "reject_reason": m.reject_reason if finish == "rejected" else None,
            "error_type": m.error_type if finish == "error" else None,
            "queue_s": None,
            "ttft_s": first,
            "last_token_s": last,
            "e2e_s": e2e,
            "prompt_tokens": m.prompt_tokens,
            "proposed_tokens": 0,
            "generated_tokens": tokens,
            "sent_tokens": tokens,
            "client_ttft_s": m.first_s if m.first_s is not None else first,
            "client_e2e_s": complete if complete is not None else last,
            "stream_paused_s": 0.0,
            "stream_max_queued": 0,
            "itl_s": m.itl_s if tokens > 1 and m.itl_s is not None and len(m.itl_s) == tokens - 1 else None,
            "backend": None,
        }
        for name in COLUMN_NAMES:
            self.cols[name].append(row[name])
        self.finish[finish] += 1

    def frame(self) -> pl.DataFrame:
        """The rows as a frame with exactly :func:`~llmslo.analysis.polars_schema`."""
        return pl.DataFrame(self.cols, schema=polars_schema())

    def common_notes(self) -> list[str]:
        """Sentences for what :meth:`add` did on its own (stop vs length, tokens without a first chunk,
        unknown durations)."""
        out: list[str] = []
        if self.notes["limit_known"]:
            known = self.notes["limit_known"]
            out.append(
                f"{self.notes['length']} of {known} successful request(s) that record their max_tokens produced at "
                "least that many tokens → finish_reason length; the others → stop."
            )
        if self.notes["whole_reply"]:
            out.append(
                f"{self.notes['whole_reply']} request(s) have tokens but no first-chunk time (a reply in one "
                "piece): their first and last token are taken at response complete."
            )
        if self.notes["unknown_duration"]:
            out.append(
                f"{self.notes['unknown_duration']} failed request(s) record no duration: e2e_s = the latest time "
                "the file does record for them (their first chunk), else 0 — a lower bound; client_e2e_s is null."
            )
        return out


def make_report(
    path: Path,
    kind: str,
    tool: str,
    rows_read: int,
    builder: RowBuilder,
    conversions: Sequence[str],
    missing: Sequence[str],
    arrivals_available: bool,
    arrival_note: str,
    *,
    id_prefix: str,
    run_duration: tuple[float | None, str],
) -> ImportReport:
    """The :class:`ImportReport` of a converted file; ``run_duration`` is ``(seconds or None, note)``."""
    return ImportReport(
        source=str(path),
        kind=kind,
        tool=tool,
        rows_read=rows_read,
        rows_imported=len(builder.cols["request_id"]),
        conversions=(SERVER_COLUMNS_NOTE, *conversions, *builder.common_notes()),
        missing_fields=(*missing, *MISSING_SERVER_FIELDS),
        arrivals_available=arrivals_available,
        arrival_note=arrival_note,
        finish_reasons=dict(sorted(builder.finish.items())),
        id_prefix=id_prefix,
        run_duration_s=run_duration[0],
        run_duration_note=run_duration[1],
    )


def quantile_note(tool: str, how: str, *, nearest_rank: bool = False) -> str:
    """The import report's sentence on the quantile definition of the percentiles ``tool`` reports (``how``:
    the code that computes them) and how ``llmslo report`` reproduces them (docs/definitions.md, "Quantiles")."""
    if nearest_rank:
        return (f"Quantiles: {tool} reports its percentiles by nearest rank ({how}), the smallest value whose "
                "cumulative share reaches p: `llmslo report --quantiles nearest-rank` reproduces them; by default "
                "llmslo report interpolates linearly between order statistics, which can differ from the tool's "
                "figure by up to the gap between two neighbouring values.")
    return (f"Quantiles: {tool} computes its percentiles by linear interpolation between order statistics "
            f"({how}), the definition llmslo report uses by default: its figures compare as they are.")


LIMIT_KEYS = ("max_tokens", "max_completion_tokens")
"""Request-body keys (OpenAI API) that carry the output-token limit."""


def limit_of(body: object) -> int | None:
    """The output-token limit a request body carries (``max_tokens``/``max_completion_tokens``), or None."""
    if not isinstance(body, Mapping):
        return None
    for key in LIMIT_KEYS:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def stop_note(builder: RowBuilder, tool: str, what: str) -> str | None:
    """The sentence for successes whose limit the file does not record: ``stop`` (None when there are none)."""
    n = builder.finish["stop"] - (builder.notes["limit_known"] - builder.notes["length"])
    if n <= 0:
        return None
    return (f"{n} successful request(s) ({what}) → finish_reason stop: the {tool} file records no max_tokens for "
            "them, so stop vs length is unknown (both count as success).")


NO_ARRIVALS_NOTE = (
    "The file records no request start times: arrival_unix_s = 0 for every row. The report places these rows "
    "in no window and divides their per-second rates (request/token goodput per second, throughput) by the "
    "run duration the file records, or gives them as null; counts, fractions and latency quantiles are not "
    "affected."
)

GENERIC_STEMS = frozenset({"profile_export", "benchmarks", "benchmark", "results", "result", "report", "output"})


def model_name(path: Path, found: str | None, override: str | None) -> tuple[str, str]:
    """``(model, sentence)``: ``--model`` if given, else the name the file records, else the file name.

    A name that is a filesystem path (``/models/llama-2-13b``) is reduced to its last part. A generic file
    stem (``profile_export``) gives way to its folder's name.
    """
    if override:
        return override, f"model = {override!r} (from --model)."
    if found:
        if found.startswith(("/", "./", "../", "~")) and "/" in found.rstrip("/"):
            short = found.rstrip("/").rsplit("/", 1)[-1]
            return short, f"model = {short!r}: the last part of the path {found!r} the file records."
        return found, f"model = {found!r} (recorded in the file)."
    stem = path.stem
    if stem in GENERIC_STEMS and path.resolve().parent.name:
        stem = path.resolve().parent.name
    return stem, f"model = {stem!r} (from the file name; the file records none; --model overrides)."
