"""Update records: one row per rolling-update step in the store's :data:`UPDATES_TABLE`, kept as data.

A record holds the four parts of an update (version information with artefact checksums, request impact,
the metric comparison before/after, the rollback record) plus the drain section (exactly the
``to_dict()`` of :class:`llmslo.controls.DrainRecord`), batch progress and the overlap window. Its JSON
shape is written out in ``docs/rollouts.md``.

Two shapes are read: ours, and the shorter one teams copy into their runbooks (``from_version``,
``to_version``, ``batch.updated``/``total``, ``drain.stream_conns_closed``/``close_reason``,
``impact.*_requests``, ``overlap_window_s``: :data:`RUNBOOK_FIELDS` says where each is read in ours). A
runbook-shaped record is stored read as ours, with the object as given under ``given``.

Validation comes first and names the field path as written, the type found and expected, and the fix
(``drain.wait_budget_s: must be a number >= 0 seconds, got '120s' (a string); ...``). A key llmslo does not
know is kept where it was given and shown, never refused (:meth:`UpdateRecord.unknown_fields` lists them,
with a near miss suggested). Nothing is written until every record of an input has passed; then all are
written in one transaction. Storing is idempotent on ``update_id``: the same content again is a no-op
("already stored"), other content under a stored id is refused naming the id.

A record is stored *completed*: parts the drain section implies (versions, impact, batch, start and end
times) are filled from it when the file leaves them out, so the two spellings of one update compare equal.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

import duckdb

from llmslo.analysis.store import ARRIVAL_MAX_AHEAD_S, ARRIVAL_MIN_UNIX_S, Store, StoreError
from llmslo.telemetry import DRAIN_CLOSE_REASONS, LlmsloError

UPDATES_TABLE = "llmslo_updates"
"""The store table of update records, one row per ``update_id`` (the whole record in ``record_json``)."""

UPDATE_ID_MAX_CHARS = 200
"""Longest accepted ``update_id`` (and version or artefact name), in characters."""

TEXT_MAX_CHARS = 10_000
"""Longest accepted free text (``rollback.reason``, ``rollback.cost``, ``notes``), in characters."""

RECORD_KEYS: tuple[str, ...] = (
    "update_id", "versions", "impact", "metrics", "rollback", "drain", "batch", "overlap",
    "started_unix_s", "ended_unix_s", "notes", "extra", "derived", "given",
)
"""The top-level keys of an update record (``derived`` is computed; on input it must match; ``given`` is the
object as given when it came in the runbook shape)."""

DRAIN_KEYS: tuple[str, ...] = (
    "from_version", "to_version", "batch", "batches", "started_unix_s", "wait_budget_s", "unregister_settle_s",
    "actual_drain_s", "in_flight_at_start", "closed_by_reason", "ended_by_reason", "terminated", "timed_out",
    "requeued", "requeue_failed", "remaining", "decision",
)
"""The keys of ``DrainRecord.to_dict()`` (llmslo.controls), the drain section's keys."""

DRAIN_REQUIRED: tuple[str, ...] = ("wait_budget_s", "actual_drain_s", "unregister_settle_s")
"""The drain keys a hand-written drain section must give (a ``DrainRecord.to_dict()`` gives them all)."""


DRAIN_DECISIONS: tuple[str, ...] = ("drained", "terminate", "return_to_pool")
"""The values of ``drain.decision`` (as ``llmslo.controls.DRAIN_DECISIONS``)."""

METRIC_KEYS: tuple[str, ...] = ("error_rate", "ttft_p50_s", "ttft_p99_s", "e2e_p99_s", "throughput_rps")
"""The figures of ``metrics.before`` / ``metrics.after``: a share in [0, 1], seconds, requests per second."""

IMPACT_KEYS: tuple[str, ...] = ("terminated", "timed_out", "requeued", "in_flight")
"""The keys of ``impact``: request counts."""

ROLLBACK_KEYS: tuple[str, ...] = ("triggered", "reason", "cost_s", "cost")
"""The keys of ``rollback``."""

OVERLAP_KEYS: tuple[str, ...] = ("from_unix_s", "to_unix_s", "duration_s")
"""The keys of ``overlap``: when both versions served, and for how long."""

_SCHEMA: dict[str, tuple[str, ...]] = {
    "": RECORD_KEYS, "versions": ("from", "to", "artifacts"), "impact": IMPACT_KEYS, "metrics": ("before", "after"),
    "metrics.before": METRIC_KEYS, "metrics.after": METRIC_KEYS, "rollback": ROLLBACK_KEYS, "drain": DRAIN_KEYS,
    "drain.closed_by_reason": DRAIN_CLOSE_REASONS, "batch": ("index", "of"), "overlap": OVERLAP_KEYS,
}
"""The keys llmslo reads in each object of a record, by the object's path; the objects not named here hold
any keys (``versions.artifacts``, ``drain.ended_by_reason``, ``extra``, ``given``) or are values."""

_FREE_MAPS: tuple[str, ...] = ("versions.artifacts", "drain.ended_by_reason", "extra", "given", "derived")

RUNBOOK_FIELDS: tuple[tuple[str, str], ...] = (
    ("from_version", "versions.from"),
    ("to_version", "versions.to"),
    ("batch.updated", "batch.index"),
    ("batch.total", "batch.of"),
    ("drain.stream_conns_closed", "drain.terminated"),
    ("drain.close_reason", "drain.closed_by_reason"),
    ("impact.terminated_requests", "impact.terminated"),
    ("impact.timed_out_requests", "impact.timed_out"),
    ("impact.requeued_tasks", "impact.requeued"),
    ("overlap_window_s", "overlap.duration_s"),
)
"""The runbook shape's own field names, each with the field of ours it is read as. Its other fields
(``update_id``, ``drain.wait_budget_s``, ``actual_drain_s``, ``unregister_settle_s``, ``rollback.*``) have
our names already. ``batch.updated`` of ``batch.total`` is read as the batch's index of the number of
batches (the update has done ``updated`` batches, this one included)."""

SHAPES: tuple[str, ...] = ("llmslo", "runbook")
"""The record shapes read: ours, and the runbook's (:data:`RUNBOOK_FIELDS`)."""

_HEX64 = re.compile(r"[0-9a-fA-F]{64}")

_COLUMNS: tuple[tuple[str, str], ...] = (
    ("update_id", "VARCHAR PRIMARY KEY"),
    ("from_version", "VARCHAR NOT NULL"),
    ("to_version", "VARCHAR NOT NULL"),
    ("started_unix_s", "DOUBLE"),
    ("ended_unix_s", "DOUBLE"),
    ("overlap_from_unix_s", "DOUBLE"),
    ("overlap_to_unix_s", "DOUBLE"),
    ("batch_index", "INTEGER"),
    ("batches", "INTEGER"),
    ("wait_budget_s", "DOUBLE"),
    ("actual_drain_s", "DOUBLE"),
    ("unregister_settle_s", "DOUBLE"),
    ("terminated", "BIGINT"),
    ("timed_out", "BIGINT"),
    ("requeued", "BIGINT"),
    ("in_flight_at_start", "BIGINT"),
    ("rollback_triggered", "BOOLEAN"),
    ("recorded_unix_s", "DOUBLE NOT NULL"),
    ("record_json", "VARCHAR NOT NULL"),
)
_COLUMN_NAMES = tuple(name for name, _ in _COLUMNS)


class RolloutInputError(LlmsloError, ValueError):
    """An update record (or its file) is invalid; the message names the field path and the fix."""


# ---- the record --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UpdateRecord:
    """One stored update: the table's columns and the whole (completed) record.

    Times are Unix seconds, durations seconds, impact figures request counts; ``None`` where the record
    does not say. ``wait_budget_s``, ``actual_drain_s`` and ``unregister_settle_s`` come from the drain
    section; ``terminated``, ``timed_out``, ``requeued`` and ``in_flight_at_start`` from ``impact`` (which
    the drain section fills when the file leaves it out). ``overlap_from_unix_s`` and ``overlap_to_unix_s``
    are the overlap's ends, one of them computed from the other and ``overlap.duration_s`` where the record
    gives only one. ``record`` is the completed record (the JSON shape of ``docs/rollouts.md``, without
    ``derived``); ``recorded_unix_s`` is when it was stored (no part of its content). Example::

        update = get_update(store.con, "2026-11-03-v1-v2-b1")
        start, end = update.window() or (None, None)
    """

    update_id: str
    from_version: str
    to_version: str
    started_unix_s: float | None
    ended_unix_s: float | None
    overlap_from_unix_s: float | None
    overlap_to_unix_s: float | None
    batch_index: int | None
    batches: int | None
    wait_budget_s: float | None
    actual_drain_s: float | None
    unregister_settle_s: float | None
    terminated: int | None
    timed_out: int | None
    requeued: int | None
    in_flight_at_start: int | None
    rollback_triggered: bool | None
    record: Mapping[str, Any]
    recorded_unix_s: float | None = None

    def window(self) -> tuple[float, float] | None:
        """The versions' overlap window ``(from, to)`` in Unix seconds; the update's start and end when the
        record does not place the overlap; None when it says neither (a runbook record gives the overlap's
        length, ``overlap_window_s``, but not when)."""
        if self.overlap_from_unix_s is not None and self.overlap_to_unix_s is not None:
            return self.overlap_from_unix_s, self.overlap_to_unix_s
        if self.started_unix_s is not None and self.ended_unix_s is not None:
            return self.started_unix_s, self.ended_unix_s
        return None

    @property
    def shape(self) -> str:
        """``runbook`` when the record came in the runbook shape (it keeps the object as given under
        ``given``), else ``llmslo``."""
        return "runbook" if isinstance(self.record.get("given"), Mapping) else "llmslo"

    def unknown_fields(self) -> list[tuple[str, Any, str | None]]:
        """``(path, value, near miss)`` of each field llmslo does not know, kept where it was given (the path as
        written; the near miss is a known key of the same object that the name resembles, else None)."""
        given = self.record.get("given")
        found = _unknown(self.record, "")
        if not isinstance(given, Mapping):
            return found
        return [(_written_path(path, given), value, near) for path, value, near in found]

    def given_fields(self) -> list[tuple[str, Any, str | None]]:
        """``(path as given, value, path read as)`` of every field of a runbook-shaped record as given (objects
        opened, lists and empty objects as one value), in the given order; the path read as is None for a
        field llmslo does not know (kept as given). Empty for a record in our shape."""
        given = self.record.get("given")
        return [(path, value, _read_as(path)) for path, value in _leaves(given, "")] \
            if isinstance(given, Mapping) else []

    def derived(self) -> dict[str, float | None]:
        """Figures computed from the record: the impact counts as shares of the in-flight count (None when
        that is unknown or 0) and ``budget_used``, the actual drain over the wait budget (None without one)."""
        return _derived(self.record)

    def to_dict(self) -> dict[str, Any]:
        """The completed record with ``derived`` added, JSON-ready (``llmslo rollout record`` takes it back as
        the same content)."""
        out: dict[str, Any] = json.loads(json.dumps(self.record))
        out["derived"] = self.derived()
        return out


@dataclass(frozen=True)
class RecordedUpdate:
    """What storing one record did: ``already_stored`` when the same content was stored under its id before
    (nothing was written for it)."""

    update: UpdateRecord
    already_stored: bool


# ---- reading JSON ------------------------------------------------------------------------------------------


class _Object(dict[str, Any]):
    """A JSON object that remembers the keys it held more than once."""

    duplicates: list[str]


def _object(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object()
    obj.duplicates = []
    for key, value in pairs:
        if key in obj and key not in obj.duplicates:
            obj.duplicates.append(key)
        obj[key] = value
    return obj


class _BadConstant(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _constant(name: str) -> Any:
    raise _BadConstant(name)


def _first_duplicate(value: Any, path: str) -> tuple[str, str] | None:
    """``(path of the object, key)`` of the first key given twice in one object, depth first."""
    if isinstance(value, _Object):
        if value.duplicates:
            return path, value.duplicates[0]
        for key, item in value.items():
            if (found := _first_duplicate(item, _join(path, key))) is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if (found := _first_duplicate(item, f"{path}[{i}]")) is not None:
                return found
    return None


def parse_update_json(data: str | bytes, *, source: str) -> dict[str, Any] | list[dict[str, Any]]:
    """The update record(s) of a JSON text: one object, or a list of objects (not yet validated).

    ``source`` names the input in messages (a file name, ``-`` for standard input). Raises
    :class:`RolloutInputError` naming ``source`` for text that is not UTF-8, is empty, is not JSON (with
    the line and column), uses ``NaN``/``Infinity``, repeats a key inside one object (with the object's
    path), or is neither an object nor a non-empty list of objects.
    """
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise RolloutInputError(f"{source}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                                    f"{exc.start}); save the file as UTF-8") from None
    if not data.strip():
        raise RolloutInputError(f"{source}: empty; expected a JSON object (one update record) or a list of them")
    try:
        value = json.loads(data, object_pairs_hook=_object, parse_constant=_constant)
    except json.JSONDecodeError as exc:
        raise RolloutInputError(f"{source}: not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") \
            from None
    except _BadConstant as exc:
        raise RolloutInputError(f"{source}: {exc.name} is not a JSON number; write a number, or null where the "
                                "field may be unknown") from None
    dup = _first_duplicate(value, "")
    if dup is not None:
        where, key = dup
        raise RolloutInputError(f"{source}: {where + ': ' if where else ''}duplicate key {key!r} in one object "
                                "(JSON would keep only the last); write it once")
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [dict(v) for v in value]
    if isinstance(value, list) and value:
        bad = next(i for i, v in enumerate(value) if not isinstance(v, dict))
        raise RolloutInputError(f"{source}: [{bad}]: must be a JSON object (an update record), got "
                                f"{_kind(value[bad])}")
    what = "an empty list" if isinstance(value, list) else _kind(value)
    raise RolloutInputError(f"{source}: expected a JSON object (one update record) or a list of them, got {what}")


# ---- validation --------------------------------------------------------------------------------------------


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _kind(value: object) -> str:
    """How JSON would name the type of ``value``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object" if isinstance(value, dict) else type(value).__name__


def _bad(path: str, message: str) -> RolloutInputError:
    return RolloutInputError(f"{path}: {message}")


def _object_at(value: object, path: str) -> Mapping[str, Any]:
    """``value`` as a JSON object (its keys strings); keys llmslo does not know are kept (see :func:`_keep`)."""
    if not isinstance(value, Mapping):
        raise _wrong(path, "a JSON object", value, "object")
    for key in value:
        if not isinstance(key, str):
            raise _bad(path, f"keys must be strings, got {key!r}")
    return value


def _keep(out: dict[str, Any], obj: Mapping[str, Any], path: str) -> dict[str, Any]:
    """``out`` with the keys of ``obj`` that llmslo does not read at ``path`` added as given."""
    known = _SCHEMA[path]
    for key, value in obj.items():
        if key not in known:
            out[key] = _json_value(value, _join(path, key))
    return out


def _json_value(value: object, path: str) -> Any:
    """``value`` as plain JSON data (a copy); refused when it holds anything JSON cannot write."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError):
        raise _bad(path, "must hold JSON values only (objects, lists, strings, finite numbers, true, false, "
                   "null)") from None


_WITH_UNIT = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?)\s*(ms|s|sec|m|min|h)\s*", re.IGNORECASE)
_UNIT_S = {"ms": 1e-3, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
Want = str  # "number", "seconds", "count", "bool", "string", "object"


def _json_number(text: str) -> str | None:
    """The JSON number ``text`` spells (``"3"``, ``" 2.5 "``), None when it spells none."""
    try:
        value = json.loads(text.strip())
    except ValueError:
        return None
    return json.dumps(value) if _number(value) else None


def _fix(value: object, want: Want) -> str:
    """How to write ``value`` as the type wanted."""
    if want in ("number", "seconds", "count"):
        if isinstance(value, str):
            if (number := _json_number(value)) is not None:
                return f"write it without quotes: {number}"
            unit = _WITH_UNIT.fullmatch(value)
            if want == "seconds" and unit is not None:
                seconds = float(unit[1]) * _UNIT_S[unit[2].lower()]
                return f"write the number of seconds without quotes or unit: {seconds:g}"
        if isinstance(value, bool):
            return "write a number: true and false are no numbers here"
        return {"number": "write a number, e.g. 0.5", "seconds": "write the number of seconds, e.g. 120",
                "count": "write a whole number, e.g. 3"}[want]
    if want == "bool":
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return f"write it without quotes: {value.strip().lower()}"
        return "write true or false, without quotes"
    if want == "string":
        if _number(value) or isinstance(value, bool):
            return f"write it in quotes: {json.dumps(json.dumps(value))}"
        return "write it as text in quotes"
    return 'write it as an object: {"name": value, ...}'


def _wrong(path: str, expected: str, value: object, want: Want) -> RolloutInputError:
    """A field of the wrong type: its path, the type expected and the one found, and the fix."""
    return _bad(path or "record", f"must be {expected}, got {_short(value)} ({_kind(value)}); {_fix(value, want)}")


def _number(value: object) -> TypeGuard[int | float]:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _seconds(obj: Mapping[str, Any], key: str, path: str, *, required: bool = False) -> float | None:
    """A duration in seconds (a finite number >= 0); None when absent or null and not ``required``."""
    value, where = obj.get(key), _join(path, key)
    if value is None:
        if required:
            raise _bad(where, "required; must be a number >= 0 seconds")
        return None
    if not _number(value):
        raise _wrong(where, "a number >= 0 seconds", value, "seconds")
    if value < 0:
        raise _bad(where, f"must be a number >= 0 seconds, got {value!r}")
    return float(value)


def _count(obj: Mapping[str, Any], key: str, path: str, *, required: bool = False) -> int | None:
    """A request count (a whole number >= 0); None when absent or null and not ``required``."""
    value, where = obj.get(key), _join(path, key)
    if value is None:
        if required:
            raise _bad(where, "required; must be a whole number >= 0 (a count of requests)")
        return None
    if not _number(value):
        raise _wrong(where, "a whole number >= 0 (a count of requests)", value, "count")
    if value < 0 or value != int(value):
        raise _bad(where, f"must be a whole number >= 0 (a count of requests), got {value!r}")
    return int(value)


def _unix(obj: Mapping[str, Any], key: str, path: str, *, now: float) -> float | None:
    """Wall-clock Unix seconds from the epoch to a day after ``now``; None when absent or null."""
    value, where = obj.get(key), _join(path, key)
    if value is None:
        return None
    latest = now + ARRIVAL_MAX_AHEAD_S
    expected = f"Unix seconds between {ARRIVAL_MIN_UNIX_S:g} and a day from now ({latest:.0f})"
    if not _number(value):
        raise _wrong(where, expected, value, "number")
    if not ARRIVAL_MIN_UNIX_S <= value <= latest:
        hint = " (milliseconds? divide by 1000)" if value > latest else ""
        raise _bad(where, f"must be {expected}{hint}, got {value!r}")
    return float(value)


def _name(obj: Mapping[str, Any], key: str, path: str, *, required: bool = False, also: str = "") -> str | None:
    """A non-blank identifier of at most :data:`UPDATE_ID_MAX_CHARS` characters; None when absent or null.
    ``also`` names where else the value may come from, for the message when it is missing."""
    value, where = obj.get(key), _join(path, key)
    expected = f"a non-blank string of at most {UPDATE_ID_MAX_CHARS} characters"
    if value is None:
        if required:
            raise _bad(where, f"required; must be {expected}{also}")
        return None
    if not isinstance(value, str):
        raise _wrong(where, expected, value, "string")
    if not value.strip() or len(value) > UPDATE_ID_MAX_CHARS:
        raise _bad(where, f"must be {expected}, got {_short(value)}")
    return value


def _text(obj: Mapping[str, Any], key: str, path: str) -> str | None:
    """Free text of at most :data:`TEXT_MAX_CHARS` characters; None when absent or null."""
    value, where = obj.get(key), _join(path, key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _wrong(where, f"a string of at most {TEXT_MAX_CHARS:,} characters", value, "string")
    if len(value) > TEXT_MAX_CHARS:
        raise _bad(where, f"must be a string of at most {TEXT_MAX_CHARS:,} characters, got {_short(value)}")
    return value


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _versions(value: object) -> dict[str, Any]:
    path = "versions"
    obj = _object_at(value, path)
    artifacts: dict[str, str] = {}
    raw = obj.get("artifacts")
    if raw is not None:
        for name, digest in _object_at(raw, "versions.artifacts").items():
            where = f"versions.artifacts.{name}"
            if not name.strip() or len(name) > UPDATE_ID_MAX_CHARS:
                raise _bad(where, f"an artefact name must be non-blank and at most {UPDATE_ID_MAX_CHARS} characters")
            if not isinstance(digest, str):
                raise _wrong(where, "a SHA-256 checksum (64 hexadecimal digits)", digest, "string")
            hexa = digest.removeprefix("sha256:")
            if not _HEX64.fullmatch(hexa):
                raise _bad(where, "must be a SHA-256 checksum: 64 hexadecimal digits, optionally after 'sha256:' "
                           f"(as sha256sum prints it), got {_short(digest)}")
            artifacts[name] = hexa.lower()
    out = {"from": _name(obj, "from", path, required=True, also=" (from_version in the runbook shape)"),
           "to": _name(obj, "to", path, required=True, also=" (to_version in the runbook shape)"),
           "artifacts": dict(sorted(artifacts.items()))}
    return _keep(out, obj, path)


def _impact(value: object) -> dict[str, Any]:
    path = "impact"
    obj = _object_at(value, path)
    out: dict[str, Any] = {k: _count(obj, k, path, required=True) for k in ("terminated", "timed_out", "requeued")}
    out["in_flight"] = _count(obj, "in_flight", path)
    total = sum(v for k, v in out.items() if k != "in_flight" and v is not None)
    if out["in_flight"] is not None and total > out["in_flight"]:
        raise _bad("impact.in_flight", f"terminated + timed_out + requeued = {total} exceeds in_flight "
                   f"({out['in_flight']}): every one of them was in flight when the drain began; correct the counts")
    return _keep(out, obj, path)


def _metric_block(value: object, path: str) -> dict[str, Any]:
    obj = _object_at(value, path)
    out: dict[str, Any] = {}
    for key in METRIC_KEYS:
        v, where = obj.get(key), _join(path, key)
        if key.endswith("_s"):
            out[key] = _seconds(obj, key, path)
            continue
        expected = ("a share between 0 and 1 (0.02 for 2 %)" if key == "error_rate"
                    else "a number >= 0 requests per second")
        if v is not None and not _number(v):
            raise _wrong(where, expected, v, "number")
        if v is not None and not (0 <= v <= 1 if key == "error_rate" else v >= 0):
            raise _bad(where, f"must be {expected}, got {v!r}")
        out[key] = None if v is None else float(v)
    if all(v is None for v in out.values()) and all(k in METRIC_KEYS for k in obj):
        raise _bad(path, f"gives no figure; give at least one of {', '.join(METRIC_KEYS)}")
    p50, p99 = out["ttft_p50_s"], out["ttft_p99_s"]
    if p50 is not None and p99 is not None and p99 < p50:
        raise _bad(_join(path, "ttft_p99_s"), f"{p99:g} s is below ttft_p50_s ({p50:g} s): a higher quantile "
                   "cannot be lower; check which is which")
    return _keep(out, obj, path)


def _metrics(value: object) -> dict[str, Any]:
    obj = _object_at(value, "metrics")
    for side in ("before", "after"):
        if obj.get(side) is None:
            raise _bad(f"metrics.{side}", "required: a comparison needs the figures before and after the update "
                       "(leave metrics out when there is none)")
    out = {"before": _metric_block(obj["before"], "metrics.before"),
           "after": _metric_block(obj["after"], "metrics.after")}
    return _keep(out, obj, "metrics")


def _rollback(value: object) -> dict[str, Any]:
    path = "rollback"
    obj = _object_at(value, path)
    triggered = obj.get("triggered")
    if triggered is None:
        raise _bad("rollback.triggered", "required; must be true or false")
    if not isinstance(triggered, bool):
        raise _wrong("rollback.triggered", "true or false", triggered, "bool")
    reason = _text(obj, "reason", path)
    if triggered and not (reason or "").strip():
        raise _bad("rollback.reason", "required when triggered is true: say why the update was rolled back")
    out = {"triggered": triggered, "reason": reason, "cost_s": _seconds(obj, "cost_s", path),
           "cost": _text(obj, "cost", path)}
    return _keep(out, obj, path)


def _counts_map(value: object, path: str, keys: Sequence[str] | None) -> dict[str, Any] | None:
    """A map of counts; None when null. With ``keys``, those are counts and any other key is kept as given;
    without, every key is a non-blank name and every value a count."""
    if value is None:
        return None
    obj = _object_at(value, path)
    out: dict[str, Any] = {}
    for key, item in obj.items():
        if keys is not None and key not in keys:
            out[key] = _json_value(item, _join(path, key))
            continue
        if not key.strip() or len(key) > UPDATE_ID_MAX_CHARS:
            raise _bad(path, f"a key must be a non-blank name of at most {UPDATE_ID_MAX_CHARS} characters, "
                       f"got {_short(key)}")
        out[key] = _count(obj, key, path, required=True)
    return out


def _closed_sum(closed: Mapping[str, Any]) -> int:
    """The streams closed, over every reason (one llmslo does not know counts when its value is a count)."""
    return sum(int(v) for v in closed.values() if _number(v) and v >= 0 and v == int(v))


def _drain(value: object, now: float) -> dict[str, Any]:
    path = "drain"
    obj = _object_at(value, path)
    out: dict[str, Any] = {}
    for key in ("from_version", "to_version"):
        v = obj.get(key)
        if v is not None and not isinstance(v, str):
            raise _wrong(_join(path, key), f"a string of at most {UPDATE_ID_MAX_CHARS} characters", v, "string")
        if v is not None and len(v) > UPDATE_ID_MAX_CHARS:
            raise _bad(_join(path, key), f"must be a string of at most {UPDATE_ID_MAX_CHARS} characters, "
                       f"got {_short(v)}")
        out[key] = v
    out["batch"], out["batches"] = _batch_numbers(obj.get("batch"), obj.get("batches"), "drain.batch",
                                                  "drain.batches")
    out["started_unix_s"] = _unix(obj, "started_unix_s", path, now=now)
    for key in ("wait_budget_s", "unregister_settle_s", "actual_drain_s"):
        out[key] = _seconds(obj, key, path, required=key in DRAIN_REQUIRED)
    out["in_flight_at_start"] = _count(obj, "in_flight_at_start", path)
    out["closed_by_reason"] = _counts_map(obj.get("closed_by_reason"), "drain.closed_by_reason", DRAIN_CLOSE_REASONS)
    out["ended_by_reason"] = _counts_map(obj.get("ended_by_reason"), "drain.ended_by_reason", None)
    for key in ("terminated", "timed_out", "requeued", "requeue_failed", "remaining"):
        out[key] = _count(obj, key, path)
    decision = obj.get("decision")
    if decision is not None and not isinstance(decision, str):
        raise _wrong("drain.decision", f"one of {', '.join(DRAIN_DECISIONS)}", decision, "string")
    if decision is not None and decision not in DRAIN_DECISIONS:
        raise _bad("drain.decision", f"must be one of {', '.join(DRAIN_DECISIONS)}, got {_short(decision)}")
    out["decision"] = decision
    closed = out["closed_by_reason"]
    if closed is not None and out["terminated"] is not None and _closed_sum(closed) != out["terminated"]:
        raise _bad("drain.terminated", f"{out['terminated']} is not the sum of drain.closed_by_reason "
                   f"({_closed_sum(closed)}): terminated counts the streams the drain closed, for every reason")
    return _keep(out, obj, path)


def _whole(value: object, where: str) -> int | None:
    """A whole number >= 1 (a batch number); None when null."""
    if value is None:
        return None
    if not _number(value):
        raise _wrong(where, "a whole number >= 1 (batches count from 1)", value, "count")
    if value < 1 or value != int(value):
        raise _bad(where, f"must be a whole number >= 1 (batches count from 1), got {value!r}")
    return int(value)


def _batch_numbers(index: object, of: object, index_path: str, of_path: str) -> tuple[int | None, int | None]:
    """A 1-based batch ``index`` of ``of`` batches (either may be null)."""
    i, n = _whole(index, index_path), _whole(of, of_path)
    if i is not None and n is not None and i > n:
        raise _bad(index_path, f"batch {i} of {n}: the index cannot exceed the number of batches")
    return i, n


def _batch(value: object) -> dict[str, Any]:
    obj = _object_at(value, "batch")
    if obj.get("index") is None:
        raise _bad("batch.index", "required: which batch this was, counting from 1 (batch.updated in the "
                   "runbook shape)")
    index, of = _batch_numbers(obj.get("index"), obj.get("of"), "batch.index", "batch.of")
    return _keep({"index": index, "of": of}, obj, "batch")


OVERLAP_TOLERANCE_S = 1e-3
"""How far ``overlap.duration_s`` may differ from ``to_unix_s - from_unix_s`` when a record gives all three."""


def _overlap(value: object, now: float) -> dict[str, Any]:
    obj = _object_at(value, "overlap")
    lo, hi = _unix(obj, "from_unix_s", "overlap", now=now), _unix(obj, "to_unix_s", "overlap", now=now)
    length = _seconds(obj, "duration_s", "overlap")
    if lo is not None and hi is not None and hi < lo:
        raise _bad("overlap.to_unix_s", f"{hi!r} is before overlap.from_unix_s ({lo!r}); swap them")
    if lo is not None and hi is not None and length is not None and abs(hi - lo - length) > OVERLAP_TOLERANCE_S:
        raise _bad("overlap.duration_s", f"{length:g} s differs from overlap.to_unix_s - overlap.from_unix_s "
                   f"({hi - lo:g} s); correct one of them, or leave one out")
    out: dict[str, Any] = {"from_unix_s": lo, "to_unix_s": hi}
    if length is not None:  # only when given: a record without it keeps the content it always had
        out["duration_s"] = length
    return _keep(out, obj, "overlap")


def _agree(given: object, implied: object, path: str, implied_path: str) -> None:
    if given is not None and implied is not None and given != implied:
        raise _bad(implied_path, f"{_short(implied)} differs from {path} ({_short(given)}); both describe the "
                   "same update: correct one of them")


def _complete(rec: dict[str, Any], drain: dict[str, Any] | None) -> None:
    """Fill what the drain section implies and the record left out; refuse where the two disagree."""
    if drain is None:
        return
    versions = rec["versions"]
    implied = {"from": drain["from_version"] or None, "to": drain["to_version"] or None}
    if versions is None and implied["from"] and implied["to"]:
        rec["versions"] = {"from": implied["from"], "to": implied["to"], "artifacts": {}}
    elif versions is not None:
        _agree(versions["from"], implied["from"], "versions.from", "drain.from_version")
        _agree(versions["to"], implied["to"], "versions.to", "drain.to_version")
    if rec["impact"] is None and all(drain[k] is not None for k in ("terminated", "timed_out", "requeued")):
        rec["impact"] = {"terminated": drain["terminated"], "timed_out": drain["timed_out"],
                         "requeued": drain["requeued"], "in_flight": drain["in_flight_at_start"]}
    if rec["batch"] is None and drain["batch"] is not None:
        rec["batch"] = {"index": drain["batch"], "of": drain["batches"]}
    elif rec["batch"] is not None:
        _agree(rec["batch"]["index"], drain["batch"], "batch.index", "drain.batch")
        _agree(rec["batch"]["of"], drain["batches"], "batch.of", "drain.batches")
    begun = drain["started_unix_s"]
    if rec["started_unix_s"] is None:
        rec["started_unix_s"] = begun
    if rec["ended_unix_s"] is None and begun is not None and drain["actual_drain_s"] is not None:
        rec["ended_unix_s"] = begun + drain["unregister_settle_s"] + drain["actual_drain_s"]


def _derived(rec: Mapping[str, Any]) -> dict[str, float | None]:
    impact = rec.get("impact") or {}
    n = impact.get("in_flight")
    out: dict[str, float | None] = {
        f"{k}_share": (impact[k] / n if n else None) for k in ("terminated", "timed_out", "requeued")
    }
    drain = rec.get("drain") or {}
    budget = drain.get("wait_budget_s")
    out["budget_used"] = drain["actual_drain_s"] / budget if budget else None
    return out


def validate_update(record: object, *, now: float | None = None) -> dict[str, Any]:
    """The completed, normalised form of one update record (see ``docs/rollouts.md``); validates only.

    ``record`` is in our shape or the runbook's (:data:`RUNBOOK_FIELDS`; the object as given is then kept
    under ``given``), or it is a stored record as ``llmslo rollout show --json`` prints it. Keys llmslo does
    not know are kept where they were given. ``now`` (Unix seconds, default the clock) bounds the times: none
    may lie more than a day ahead. Raises :class:`RolloutInputError` at the first problem found, naming the
    field as written, the type found and expected, and the fix.
    """
    t = time.time() if now is None else now
    if not isinstance(record, Mapping):
        raise RolloutInputError(f"record: must be a JSON object, got {_kind(record)}")
    obj = _object_at(record, "")
    if (bad := _lone_surrogate(obj, "")) is not None:
        raise bad
    if obj.get("given") is not None:
        return _from_given(obj, t)
    ours, read = _to_ours(obj)
    try:
        rec = _validate_ours(ours, t)
    except RolloutInputError as exc:
        raise RolloutInputError(_as_written(str(exc), read)) from None
    if read:
        rec["given"] = _json_value({k: v for k, v in obj.items() if k != "derived"}, "given")
    return rec


def _validate_ours(obj: Mapping[str, Any], t: float) -> dict[str, Any]:
    """:func:`validate_update` of a record in our shape."""
    rec: dict[str, Any] = {"update_id": _name(obj, "update_id", "", required=True)}
    rec["versions"] = _versions(obj["versions"]) if obj.get("versions") is not None else None
    rec["impact"] = _impact(obj["impact"]) if obj.get("impact") is not None else None
    rec["metrics"] = _metrics(obj["metrics"]) if obj.get("metrics") is not None else None
    rec["rollback"] = _rollback(obj["rollback"]) if obj.get("rollback") is not None else None
    drain = _drain(obj["drain"], t) if obj.get("drain") is not None else None
    rec["drain"] = drain
    rec["batch"] = _batch(obj["batch"]) if obj.get("batch") is not None else None
    rec["overlap"] = _overlap(obj["overlap"], t) if obj.get("overlap") is not None else None
    rec["started_unix_s"] = _unix(obj, "started_unix_s", "", now=t)
    rec["ended_unix_s"] = _unix(obj, "ended_unix_s", "", now=t)
    rec["notes"] = _text(obj, "notes", "")
    extra = obj.get("extra")
    rec["extra"] = _json_value(_object_at(extra, "extra"), "extra") if extra is not None else None
    _complete(rec, drain)
    if rec["versions"] is None:
        raise _bad("versions", "required: {\"from\": ..., \"to\": ...} (or from_version and to_version, or a drain "
                   "section naming them)")
    started, ended = rec["started_unix_s"], rec["ended_unix_s"]
    if started is not None and ended is not None and ended < started:
        raise _bad("ended_unix_s", f"{ended!r} is before started_unix_s ({started!r})")
    if obj.get("derived") is not None and _canonical(obj["derived"]) != _canonical(_derived(rec)):
        raise _bad("derived", "does not match the record: it is computed from impact and drain; leave it out")
    return _keep(rec, {k: v for k, v in obj.items() if k not in ("derived", "given")}, "")


def _from_given(obj: Mapping[str, Any], t: float) -> dict[str, Any]:
    """A stored runbook-shaped record as ``rollout show --json`` prints it: read from ``given``; the rest must
    be what ``given`` reads as."""
    given = obj["given"]
    if not isinstance(given, Mapping):
        raise _wrong("given", "a JSON object (the record as given, in the runbook shape)", given, "object")
    if given.get("given") is not None:
        raise _bad("given.given", "a record as given holds no given of its own; remove it")
    rec = validate_update(given, now=t)
    rest = {k: v for k, v in obj.items() if k != "derived"}
    if set(rest) != {"given"} and _canonical(rest) != _canonical(rec):
        raise _bad("given", f"the record's other fields are not what given reads as (they differ in "
                   f"{_differs(rest, rec)}); send the object under given alone, or the record without given")
    if obj.get("derived") is not None and _canonical(obj["derived"]) != _canonical(_derived(rec)):
        raise _bad("derived", "does not match the record: it is computed from impact and drain; leave it out")
    return rec


# ---- the runbook shape -------------------------------------------------------------------------------------


def _plain(value: object) -> Any:
    """A copy of ``value`` with its objects as dicts and its lists as lists (nothing else changed)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _dig(obj: dict[str, Any], parts: Sequence[str], *, create: bool = False) -> dict[str, Any] | None:
    """The object at ``parts`` under ``obj`` (made where missing with ``create``); None where it is not one."""
    at: Any = obj
    for part in parts:
        if create and at.get(part) is None:
            at[part] = {}
        at = at.get(part)
        if not isinstance(at, dict):
            return None
    return at if isinstance(at, dict) else None


def _to_ours(obj: Mapping[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """A copy of ``obj`` with the runbook's field names moved to ours, and ``(ours, as given)`` of each move.

    A field given under both names must hold the same value under both."""
    rec: dict[str, Any] = _plain(obj)
    read: list[tuple[str, str]] = []
    for given, ours in RUNBOOK_FIELDS:
        *given_parent, given_key = given.split(".")
        source = _dig(rec, given_parent)
        if source is None or given_key not in source:
            continue
        *our_parent, our_key = ours.split(".")
        target = _dig(rec, our_parent, create=True)
        if target is None:  # ours holds something else there: its own check names it
            continue
        value = source.pop(given_key)
        if target.get(our_key) is None:
            target[our_key] = value
        elif value is not None and _canonical(target[our_key]) != _canonical(value):
            raise _bad(given, f"{_short(value)} differs from {ours} ({_short(target[our_key])}); both name one "
                       "field: give it once")
        read.append((ours, given))
    return rec, read


def _as_written(message: str, read: Sequence[tuple[str, str]]) -> str:
    """``message`` with the paths of ours replaced by the names the record was written with."""
    for ours, given in sorted(read, key=lambda pair: -len(pair[0])):
        message = re.sub(rf"(?<![\w.]){re.escape(ours)}(?!\w)", given, message)
    return message


def _leaves(value: object, path: str) -> Iterator[tuple[str, Any]]:
    """``(path, value)`` of every field under ``value`` that is no non-empty object, in order."""
    if isinstance(value, Mapping) and value:
        for key, item in value.items():
            yield from _leaves(item, _join(path, str(key)))
    else:
        yield path, value


def _ours_path(path: str) -> str:
    """A path written in the runbook shape as the path of ours it is read as (other paths unchanged)."""
    for given, ours in RUNBOOK_FIELDS:
        if path == given or path.startswith(given + "."):
            return ours + path[len(given):]
    return path


def _read_as(path: str) -> str | None:
    """The field of ours a field written at ``path`` is read as; None for a field llmslo does not know."""
    ours = _ours_path(path)
    at = ""
    for part in ours.split("."):
        if at in _FREE_MAPS or at not in _SCHEMA:
            return ours
        if part not in _SCHEMA[at]:
            return None
        at = _join(at, part)
    return ours


def _near(key: str, path: str) -> str | None:
    """A known key of the object at ``path`` (ours or the runbook's) that ``key`` resembles."""
    names = list(_SCHEMA.get(path, ()))
    names += [given.rsplit(".", 1)[-1] for given, ours in RUNBOOK_FIELDS
              if _ours_path(given).rpartition(".")[0] == path]
    near = difflib.get_close_matches(key, [n for n in names if n not in ("derived", "given")], n=1)
    return near[0] if near else None


def _unknown(value: object, path: str) -> list[tuple[str, Any, str | None]]:
    """``(path, value, near miss)`` of each key under ``value`` (the object at ``path``) llmslo does not read."""
    if path in _FREE_MAPS or path not in _SCHEMA or not isinstance(value, Mapping):
        return []
    out: list[tuple[str, Any, str | None]] = []
    for key, item in value.items():
        where = _join(path, key)
        out += _unknown(item, where) if key in _SCHEMA[path] else [(where, item, _near(key, path))]
    return out


def _written_path(path: str, given: Mapping[str, Any]) -> str:
    """``path`` (ours) as the runbook-shaped record ``given`` wrote it."""
    for written, ours in RUNBOOK_FIELDS:
        if path == ours or path.startswith(ours + "."):
            candidate = written + path[len(ours):]
            parent = _dig(_plain(given), candidate.split(".")[:-1])
            if parent is not None and candidate.rsplit(".", 1)[-1] in parent:
                return candidate
    return path


def _lone_surrogate(value: object, path: str) -> RolloutInputError | None:
    """An error for the first string (or key) under ``value`` that is no text: a lone UTF-16 surrogate
    (JSON allows the escape ``\\ud800``; UTF-8, and so the store, does not)."""
    if isinstance(value, str):
        for i, ch in enumerate(value):
            if 0xD800 <= ord(ch) <= 0xDFFF:
                return _bad(path, f"holds the lone surrogate \\u{ord(ch):04x} at character {i + 1}, "
                            "which is no text (a \\u escape of half a character pair); fix or remove it")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            found = _lone_surrogate(key, path) or _lone_surrogate(item, _join(path, str(key)))
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if (found := _lone_surrogate(item, f"{path}[{i}]")) is not None:
                return found
    return None


def _canonical(value: object) -> str:
    """The JSON text two records are compared by (keys sorted)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# ---- the table ---------------------------------------------------------------------------------------------


def updates_ddl(table: str = UPDATES_TABLE) -> str:
    """``CREATE TABLE IF NOT EXISTS`` statement of the update-record table."""
    cols = ",\n    ".join(f"{name} {kind}" for name, kind in _COLUMNS)
    return f"CREATE TABLE IF NOT EXISTS {table} (\n    {cols}\n)"


def _has_table(con: duckdb.DuckDBPyConnection) -> bool:
    rows = con.sql("SELECT column_name FROM duckdb_columns() WHERE table_name = ? ORDER BY column_index",
                   params=[UPDATES_TABLE]).fetchall()
    if not rows:
        return False
    found = tuple(str(r[0]) for r in rows)
    if found != _COLUMN_NAMES:
        raise StoreError(f"table {UPDATES_TABLE} of this store has columns {', '.join(found)}, not those this "
                         "llmslo writes; record the updates into a new store")
    return True


def _overlap_ends(overlap: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """The overlap's ends, one computed from the other and the duration where only one is given."""
    lo, hi, length = overlap.get("from_unix_s"), overlap.get("to_unix_s"), overlap.get("duration_s")
    if length is not None and lo is not None and hi is None:
        hi = lo + length
    elif length is not None and hi is not None and lo is None:
        lo = hi - length
    return lo, hi


def _times_may_be_null(con: duckdb.DuckDBPyConnection) -> None:
    """Let a table made before records could leave out their times hold a record without them."""
    rows = con.sql("SELECT column_name FROM duckdb_columns() WHERE table_name = ? AND NOT is_nullable "
                   "AND column_name IN ('started_unix_s', 'ended_unix_s')", params=[UPDATES_TABLE]).fetchall()
    for (name,) in rows:
        con.execute(f"ALTER TABLE {UPDATES_TABLE} ALTER COLUMN {name} DROP NOT NULL")


def _update(rec: Mapping[str, Any], recorded_unix_s: float | None) -> UpdateRecord:
    drain, impact = rec.get("drain") or {}, rec.get("impact") or {}
    overlap, batch, rollback = rec.get("overlap") or {}, rec.get("batch") or {}, rec.get("rollback")
    overlap_from, overlap_to = _overlap_ends(overlap)
    return UpdateRecord(
        update_id=rec["update_id"], from_version=rec["versions"]["from"], to_version=rec["versions"]["to"],
        started_unix_s=rec["started_unix_s"], ended_unix_s=rec["ended_unix_s"],
        overlap_from_unix_s=overlap_from, overlap_to_unix_s=overlap_to,
        batch_index=batch.get("index"), batches=batch.get("of"), wait_budget_s=drain.get("wait_budget_s"),
        actual_drain_s=drain.get("actual_drain_s"), unregister_settle_s=drain.get("unregister_settle_s"),
        terminated=impact.get("terminated"), timed_out=impact.get("timed_out"), requeued=impact.get("requeued"),
        in_flight_at_start=impact.get("in_flight"),
        rollback_triggered=rollback["triggered"] if rollback is not None else None,
        record=rec, recorded_unix_s=recorded_unix_s)


def _row(update: UpdateRecord) -> list[Any]:
    values = {name: getattr(update, name, None) for name in _COLUMN_NAMES}
    values["record_json"] = json.dumps(update.record, ensure_ascii=False)  # in the documented order
    return [values[name] for name in _COLUMN_NAMES]


def _differs(stored: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    parts = [k for k in sorted(set(stored) | set(new)) if _canonical(stored.get(k)) != _canonical(new.get(k))]
    return ", ".join(parts) or "its text"


def _write(con: duckdb.DuckDBPyConnection, updates: list[tuple[str, UpdateRecord]]) -> list[RecordedUpdate]:
    """Insert each update not stored yet, in one transaction; refuse a stored id with other content."""
    done: list[RecordedUpdate] = []
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(updates_ddl())
        _has_table(con)
        _times_may_be_null(con)
        marks = ", ".join("?" * len(_COLUMN_NAMES))
        for where, update in updates:
            rows = con.execute(f"SELECT record_json, recorded_unix_s FROM {UPDATES_TABLE} WHERE update_id = ?",
                               [update.update_id]).fetchall()
            if rows:
                stored = json.loads(rows[0][0])
                if _canonical(stored) != _canonical(update.record):
                    raise RolloutInputError(
                        f"{where}update_id {update.update_id!r}: already stored with other content (it differs in "
                        f"{_differs(stored, update.record)}); the stored record was kept. Give a changed update a "
                        "new update_id")
                done.append(RecordedUpdate(_update(stored, float(rows[0][1])), already_stored=True))
                continue
            con.execute(f"INSERT INTO {UPDATES_TABLE} ({', '.join(_COLUMN_NAMES)}) VALUES ({marks})", _row(update))
            done.append(RecordedUpdate(update, already_stored=False))
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return done


Db = Store | duckdb.DuckDBPyConnection | str | os.PathLike[str]
"""Where records go: an open :class:`Store`, a DuckDB connection to one, or the path of a store file."""


def _validated(records: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> list[tuple[str, UpdateRecord]]:
    """Each record validated and completed, with the prefix its messages carry (``[2].`` in a list)."""
    now = recorded = time.time()
    if isinstance(records, Mapping):
        items: list[tuple[str, object]] = [("", records)]
    elif isinstance(records, Sequence) and not isinstance(records, (str, bytes)):
        if not records:
            raise RolloutInputError("no update records: the list is empty")
        items = [(f"[{i}].", r) for i, r in enumerate(records)]
    else:
        raise RolloutInputError(f"expected an update record (a JSON object) or a list of them, got {_kind(records)}")
    out: list[tuple[str, UpdateRecord]] = []
    for prefix, item in items:
        try:
            rec = validate_update(item, now=now)
        except RolloutInputError as exc:
            raise RolloutInputError(f"{prefix}{exc}") from None
        out.append((prefix, _update(rec, recorded)))
    return out


def record_updates(db: Db, records: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> list[RecordedUpdate]:
    """Validate every record, then store those not stored yet, all in one transaction.

    ``records`` is one record or a list of them (messages then start with the index, ``[2].drain...``).
    ``db`` is a :class:`Store`, a connection to one (not inside a transaction) or a store path (created if
    missing; a store file this call created is removed again when it fails). Raises
    :class:`RolloutInputError` for an invalid record or an ``update_id`` stored with other content, naming
    it; nothing is written then.
    """
    updates = _validated(records)
    if isinstance(db, Store):
        return _write(db.con, updates)
    if isinstance(db, duckdb.DuckDBPyConnection):
        return _write(db, updates)
    with Store.open(db) as store:
        return _write(store.con, updates)


def record_update(db: Db, record: Mapping[str, Any]) -> UpdateRecord:
    """Validate one update record and store it (idempotent on ``update_id``); the stored update.

    The same content under a stored ``update_id`` is a no-op; other content is refused. Example::

        from llmslo.controls import DrainController
        record = drain.run_blocking()
        record_update("store.duckdb", {"update_id": "2026-11-03-v1-v2-b1", "drain": record.to_dict()})

    Raises :class:`RolloutInputError` naming the field (or the conflicting id); nothing is written then.
    """
    (done,) = record_updates(db, record)
    return done.update


def _stored(con: duckdb.DuckDBPyConnection, where: str = "", params: Sequence[Any] = ()) -> Iterator[UpdateRecord]:
    if not _has_table(con):
        return
    rows = con.execute(f"SELECT record_json, recorded_unix_s FROM {UPDATES_TABLE} {where} "
                       "ORDER BY started_unix_s, update_id", list(params)).fetchall()
    for text, recorded in rows:
        yield _update(json.loads(text), float(recorded))


def list_updates(con: duckdb.DuckDBPyConnection) -> list[UpdateRecord]:
    """Every stored update, by start time (then id); empty when the store holds none (read-only is fine)."""
    return list(_stored(con))


def get_update(con: duckdb.DuckDBPyConnection, update_id: str) -> UpdateRecord | None:
    """The stored update ``update_id``; None when there is none."""
    return next(_stored(con, "WHERE update_id = ?", [update_id]), None)
