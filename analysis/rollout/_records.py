"""Update records: one row per rolling-update step in the store's :data:`UPDATES_TABLE`, kept as data.

A record holds the four parts of an update (version information with artefact checksums, request impact,
the metric comparison before/after, the rollback record) plus the drain section (exactly the
``to_dict()`` of :class:`llmslo.controls.DrainRecord`), batch progress and the overlap window. Its JSON
shape is written out in ``docs/rollouts.md``.

Validation comes first and names the field path and the fix (``drain.wait_budget_s: must be a number >= 0
seconds, got 'x'``); unknown keys are errors at every level (a typo must not pass silently), and anything
else a person wants kept goes under ``extra``. Nothing is written until every record of an input has
passed; then all are written in one transaction. Storing is idempotent on ``update_id``: the same content
again is a no-op ("already stored"), other content under a stored id is refused naming the id.

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
    "started_unix_s", "ended_unix_s", "notes", "extra", "derived",
)
"""The top-level keys of an update record (``derived`` is computed; on input it must match)."""

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

_HEX64 = re.compile(r"[0-9a-fA-F]{64}")

_COLUMNS: tuple[tuple[str, str], ...] = (
    ("update_id", "VARCHAR PRIMARY KEY"),
    ("from_version", "VARCHAR NOT NULL"),
    ("to_version", "VARCHAR NOT NULL"),
    ("started_unix_s", "DOUBLE NOT NULL"),
    ("ended_unix_s", "DOUBLE NOT NULL"),
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
    the drain section fills when the file leaves it out). ``record`` is the completed record (the JSON shape
    of ``docs/rollouts.md``, without ``derived``); ``recorded_unix_s`` is when it was stored (no part of its
    content). Example::

        update = get_update(store.con, "2026-11-03-v1-v2-b1")
        start, end = update.window()
    """

    update_id: str
    from_version: str
    to_version: str
    started_unix_s: float
    ended_unix_s: float
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

    def window(self) -> tuple[float, float]:
        """The versions' overlap window ``(from, to)`` in Unix seconds; the update's start and end when the
        record gives no overlap (or only one of its ends)."""
        if self.overlap_from_unix_s is not None and self.overlap_to_unix_s is not None:
            return self.overlap_from_unix_s, self.overlap_to_unix_s
        return self.started_unix_s, self.ended_unix_s

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


def _object_at(value: object, path: str, allowed: Sequence[str]) -> Mapping[str, Any]:
    """``value`` as a JSON object whose keys are all ``allowed``; an unknown key is named with a suggestion."""
    if not isinstance(value, Mapping):
        raise _bad(path, f"must be a JSON object, got {_kind(value)}")
    for key in value:
        if not isinstance(key, str) or key not in allowed:
            near = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise _bad(_join(path, str(key)), f"unknown key; {hint}expected one of: {', '.join(allowed)}")
    return value


def _number(value: object) -> TypeGuard[int | float]:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _seconds(obj: Mapping[str, Any], key: str, path: str, *, required: bool = False) -> float | None:
    """A duration in seconds (a finite number >= 0); None when absent or null and not ``required``."""
    value = obj.get(key)
    if value is None and not required:
        return None
    if not _number(value) or value < 0:
        missing = "required; " if value is None else ""
        raise _bad(_join(path, key), f"{missing}must be a number >= 0 seconds, got {value!r}")
    return float(value)


def _count(obj: Mapping[str, Any], key: str, path: str, *, required: bool = False) -> int | None:
    """A request count (a whole number >= 0); None when absent or null and not ``required``."""
    value = obj.get(key)
    if value is None and not required:
        return None
    if not _number(value) or value < 0 or value != int(value):
        missing = "required; " if value is None else ""
        raise _bad(_join(path, key), f"{missing}must be a whole number >= 0 (a count of requests), got {value!r}")
    return int(value)


def _unix(obj: Mapping[str, Any], key: str, path: str, *, now: float) -> float | None:
    """Wall-clock Unix seconds from the epoch to a day after ``now``; None when absent or null."""
    value = obj.get(key)
    if value is None:
        return None
    latest = now + ARRIVAL_MAX_AHEAD_S
    if not _number(value) or not ARRIVAL_MIN_UNIX_S <= value <= latest:
        hint = " (milliseconds? divide by 1000)" if _number(value) and value > latest else ""
        raise _bad(_join(path, key), f"must be Unix seconds between {ARRIVAL_MIN_UNIX_S:g} and a day from now "
                   f"({latest:.0f}){hint}, got {value!r}")
    return float(value)


def _name(obj: Mapping[str, Any], key: str, path: str, *, required: bool = False) -> str | None:
    """A non-blank identifier of at most :data:`UPDATE_ID_MAX_CHARS` characters; None when absent or null."""
    value = obj.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > UPDATE_ID_MAX_CHARS:
        missing = "required; " if value is None else ""
        raise _bad(_join(path, key), f"{missing}must be a non-blank string of at most {UPDATE_ID_MAX_CHARS} "
                   f"characters, got {_short(value)}")
    return value


def _text(obj: Mapping[str, Any], key: str, path: str) -> str | None:
    """Free text of at most :data:`TEXT_MAX_CHARS` characters; None when absent or null."""
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > TEXT_MAX_CHARS:
        raise _bad(_join(path, key), f"must be a string of at most {TEXT_MAX_CHARS:,} characters, got "
                   f"{_short(value)}")
    return value


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _versions(value: object) -> dict[str, Any]:
    path = "versions"
    obj = _object_at(value, path, ("from", "to", "artifacts"))
    artifacts: dict[str, str] = {}
    raw = obj.get("artifacts")
    if raw is not None:
        for name, digest in _object_map(raw, "versions.artifacts").items():
            where = f"versions.artifacts.{name}"
            if not name.strip() or len(name) > UPDATE_ID_MAX_CHARS:
                raise _bad(where, f"an artefact name must be non-blank and at most {UPDATE_ID_MAX_CHARS} characters")
            hexa = digest.removeprefix("sha256:") if isinstance(digest, str) else None
            if hexa is None or not _HEX64.fullmatch(hexa):
                raise _bad(where, "must be a SHA-256 checksum: 64 hexadecimal digits, optionally after 'sha256:' "
                           f"(as sha256sum prints it), got {_short(digest)}")
            artifacts[name] = hexa.lower()
    return {"from": _name(obj, "from", path, required=True), "to": _name(obj, "to", path, required=True),
            "artifacts": dict(sorted(artifacts.items()))}


def _object_map(value: object, path: str) -> Mapping[str, Any]:
    """A JSON object with any keys (a map), checked to be one."""
    if not isinstance(value, Mapping):
        raise _bad(path, f"must be a JSON object, got {_kind(value)}")
    return value


def _impact(value: object) -> dict[str, int | None]:
    path = "impact"
    obj = _object_at(value, path, ("terminated", "timed_out", "requeued", "in_flight"))
    out = {k: _count(obj, k, path, required=True) for k in ("terminated", "timed_out", "requeued")}
    out["in_flight"] = _count(obj, "in_flight", path)
    total = sum(v for k, v in out.items() if k != "in_flight" and v is not None)
    if out["in_flight"] is not None and total > out["in_flight"]:
        raise _bad("impact.in_flight", f"terminated + timed_out + requeued = {total} exceeds in_flight "
                   f"({out['in_flight']}): every one of them was in flight when the drain began; correct the counts")
    return out


def _metric_block(value: object, path: str) -> dict[str, float | None]:
    obj = _object_at(value, path, METRIC_KEYS)
    out: dict[str, float | None] = {}
    for key in METRIC_KEYS:
        v = obj.get(key)
        if key == "error_rate" and v is not None and not (_number(v) and 0 <= v <= 1):
            raise _bad(_join(path, key), f"must be a share between 0 and 1 (0.02 for 2 %), got {v!r}")
        if key == "throughput_rps" and v is not None and not (_number(v) and v >= 0):
            raise _bad(_join(path, key), f"must be a number >= 0 requests per second, got {v!r}")
        out[key] = float(v) if key in ("error_rate", "throughput_rps") and v is not None else None
        if key.endswith("_s"):
            out[key] = _seconds(obj, key, path)
    if all(v is None for v in out.values()):
        raise _bad(path, f"gives no figure; give at least one of {', '.join(METRIC_KEYS)}")
    p50, p99 = out["ttft_p50_s"], out["ttft_p99_s"]
    if p50 is not None and p99 is not None and p99 < p50:
        raise _bad(_join(path, "ttft_p99_s"), f"{p99:g} s is below ttft_p50_s ({p50:g} s): a higher quantile "
                   "cannot be lower; check which is which")
    return out


def _metrics(value: object) -> dict[str, Any]:
    obj = _object_at(value, "metrics", ("before", "after"))
    for side in ("before", "after"):
        if obj.get(side) is None:
            raise _bad(f"metrics.{side}", "required: a comparison needs the figures before and after the update "
                       "(leave metrics out when there is none)")
    return {"before": _metric_block(obj["before"], "metrics.before"),
            "after": _metric_block(obj["after"], "metrics.after")}


def _rollback(value: object) -> dict[str, Any]:
    path = "rollback"
    obj = _object_at(value, path, ("triggered", "reason", "cost_s", "cost"))
    triggered = obj.get("triggered")
    if not isinstance(triggered, bool):
        missing = "required; " if triggered is None else ""
        raise _bad("rollback.triggered", f"{missing}must be true or false, got {triggered!r}")
    reason = _text(obj, "reason", path)
    if triggered and not (reason or "").strip():
        raise _bad("rollback.reason", "required when triggered is true: say why the update was rolled back")
    return {"triggered": triggered, "reason": reason, "cost_s": _seconds(obj, "cost_s", path),
            "cost": _text(obj, "cost", path)}


def _counts_map(value: object, path: str, keys: Sequence[str] | None) -> dict[str, int] | None:
    """A map of counts (keys from ``keys`` when given, else any non-blank names); None when null."""
    if value is None:
        return None
    obj = _object_at(value, path, keys) if keys is not None else _object_map(value, path)
    out: dict[str, int] = {}
    for key in obj:
        if not key.strip() or len(key) > UPDATE_ID_MAX_CHARS:
            raise _bad(path, f"a key must be a non-blank name of at most {UPDATE_ID_MAX_CHARS} characters, "
                       f"got {_short(key)}")
        count = _count(obj, key, path, required=True)
        assert count is not None
        out[key] = count
    return out


def _drain(value: object, now: float) -> dict[str, Any]:
    path = "drain"
    obj = _object_at(value, path, DRAIN_KEYS)
    out: dict[str, Any] = {}
    for key in ("from_version", "to_version"):
        v = obj.get(key)
        if v is not None and (not isinstance(v, str) or len(v) > UPDATE_ID_MAX_CHARS):
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
    if decision is not None and decision not in DRAIN_DECISIONS:
        raise _bad("drain.decision", f"must be one of {', '.join(DRAIN_DECISIONS)}, got {_short(decision)}")
    out["decision"] = decision
    closed = out["closed_by_reason"]
    if closed is not None and out["terminated"] is not None and sum(closed.values()) != out["terminated"]:
        raise _bad("drain.terminated", f"{out['terminated']} is not the sum of drain.closed_by_reason "
                   f"({sum(closed.values())}): terminated counts the streams the drain closed, for every reason")
    return out


def _whole(value: object, where: str) -> int | None:
    """A whole number >= 1 (a batch number); None when null."""
    if value is None:
        return None
    if not _number(value) or value < 1 or value != int(value):
        raise _bad(where, f"must be a whole number >= 1 (batches count from 1), got {value!r}")
    return int(value)


def _batch_numbers(index: object, of: object, index_path: str, of_path: str) -> tuple[int | None, int | None]:
    """A 1-based batch ``index`` of ``of`` batches (either may be null)."""
    i, n = _whole(index, index_path), _whole(of, of_path)
    if i is not None and n is not None and i > n:
        raise _bad(index_path, f"batch {i} of {n}: the index cannot exceed the number of batches")
    return i, n


def _batch(value: object) -> dict[str, int | None]:
    obj = _object_at(value, "batch", ("index", "of"))
    if obj.get("index") is None:
        raise _bad("batch.index", "required: which batch this was, counting from 1")
    index, of = _batch_numbers(obj.get("index"), obj.get("of"), "batch.index", "batch.of")
    return {"index": index, "of": of}


def _overlap(value: object, now: float) -> dict[str, float | None]:
    obj = _object_at(value, "overlap", ("from_unix_s", "to_unix_s"))
    lo, hi = _unix(obj, "from_unix_s", "overlap", now=now), _unix(obj, "to_unix_s", "overlap", now=now)
    if lo is not None and hi is not None and hi < lo:
        raise _bad("overlap.to_unix_s", f"{hi!r} is before overlap.from_unix_s ({lo!r}); swap them")
    return {"from_unix_s": lo, "to_unix_s": hi}


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

    ``now`` (Unix seconds, default the clock) bounds the times: none may lie more than a day ahead. Raises
    :class:`RolloutInputError` naming the field path and the fix at the first problem found.
    """
    t = time.time() if now is None else now
    if not isinstance(record, Mapping):
        raise RolloutInputError(f"record: must be a JSON object, got {_kind(record)}")
    obj = _object_at(record, "", RECORD_KEYS)
    if (bad := _lone_surrogate(obj, "")) is not None:
        raise bad
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
    if extra is not None and not isinstance(extra, Mapping):
        raise _bad("extra", f"must be a JSON object (anything else to keep, as given), got {_kind(extra)}")
    try:
        rec["extra"] = json.loads(json.dumps(extra, allow_nan=False)) if extra is not None else None
    except (TypeError, ValueError):
        raise _bad("extra", "must hold JSON values only (objects, lists, strings, finite numbers, true, false, "
                   "null)") from None
    _complete(rec, drain)
    if rec["versions"] is None:
        raise _bad("versions", "required: {\"from\": ..., \"to\": ...} (or a drain section naming from_version "
                   "and to_version)")
    if rec["started_unix_s"] is None:
        raise _bad("started_unix_s", "required: Unix seconds when the update began (or a drain section with "
                   "started_unix_s)")
    if rec["ended_unix_s"] is None:
        raise _bad("ended_unix_s", "required: Unix seconds when the update ended (or a drain section with "
                   "started_unix_s and actual_drain_s)")
    if rec["ended_unix_s"] < rec["started_unix_s"]:
        raise _bad("ended_unix_s", f"{rec['ended_unix_s']!r} is before started_unix_s ({rec['started_unix_s']!r})")
    if obj.get("derived") is not None and _canonical(obj["derived"]) != _canonical(_derived(rec)):
        raise _bad("derived", "does not match the record: it is computed from impact and drain; leave it out")
    return rec


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


def _update(rec: Mapping[str, Any], recorded_unix_s: float | None) -> UpdateRecord:
    drain, impact = rec.get("drain") or {}, rec.get("impact") or {}
    overlap, batch, rollback = rec.get("overlap") or {}, rec.get("batch") or {}, rec.get("rollback")
    return UpdateRecord(
        update_id=rec["update_id"], from_version=rec["versions"]["from"], to_version=rec["versions"]["to"],
        started_unix_s=rec["started_unix_s"], ended_unix_s=rec["ended_unix_s"],
        overlap_from_unix_s=overlap.get("from_unix_s"), overlap_to_unix_s=overlap.get("to_unix_s"),
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
