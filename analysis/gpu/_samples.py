"""GPU and engine time series in the store: the ``gpu_samples`` and ``engine_samples`` tables and importers.

Tables (created on demand with ``CREATE TABLE IF NOT EXISTS``; they do not change the request-summary
schema or its version):

``gpu_samples``: one row per GPU per sampling instant. ``time_unix_s`` (wall clock, Unix seconds), ``gpu``
(index or UUID as the source names it), ``source`` (``nvml``, ``nvidia-smi``, ``dmon``), ``util_gpu_pct``
(%, NVML utilisation or dmon SM activity), ``util_mem_pct`` (%, memory-controller activity),
``memory_used_bytes``, ``memory_total_bytes`` (bytes), ``power_w`` (W), ``temperature_c`` (°C),
``sm_clock_mhz``, ``mem_clock_mhz`` (MHz), ``throttle_reasons`` (NVML clocks-event bit mask; 0 = none).
Any measurement a source lacks is null.

``engine_samples``: the serving engine's own time series in long form: ``time_unix_s``, ``source``,
``name`` (e.g. ``gpu_cache_usage_perc``, ``num_requests_waiting``; cumulative counters keep their
``_total`` name) and ``value``.

``llmslo_gpu_imports``: one row per imported file, keyed by ``(content_sha256, kind)``: the SHA-256 of the
file's bytes (hex) and the kind it was read as, with the options that placed its samples in time
(``start_unix_s``, and ``interval_s`` for dmon), the table and rows written. It makes
:func:`import_gpu_file` idempotent: the same file imported again (under any name) as the same kind adds
nothing, and with other time options it is refused (its samples would be stored twice, at two times).

Importers (all return polars frames with exactly those columns):

* :func:`read_nvidia_smi_csv` — ``nvidia-smi --query-gpu=... --format=csv`` output: a header of field
  names with units in brackets, values with units and a leading space (``" 92 %"``, ``" 59620 MiB"``,
  ``" Not Active"``, ``[N/A]``); the time comes from a ``timestamp`` column (``YYYY/MM/DD HH:MM:SS.fff``,
  read as UTC) or a ``time [s]`` column (seconds from ``start_unix_s``).
* :func:`read_nvidia_smi_dmon` — ``nvidia-smi dmon`` output: two header lines (names, then units), either
  as printed (``#``-prefixed, whitespace separated) or converted to CSV; times from a ``time`` column
  (seconds from ``start_unix_s``), ``Date``/``Time`` columns (``-o DT``, UTC), or else one row per GPU every
  ``interval_s`` seconds from ``start_unix_s``.
* :func:`read_vllm_engine_csv` — the engine time series of a vLLM benchmark run (``time [s]`` then one
  column per engine metric, e.g. ``gpu_cache_usage_perc``, ``num_requests_waiting``).
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import math
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from llmslo.telemetry import ConfigurationError, LlmsloError

__all__ = [
    "ENGINE_TABLE",
    "GPU_COLUMNS",
    "GPU_IMPORTS_TABLE",
    "GPU_IMPORT_KINDS",
    "GPU_TABLE",
    "GpuFormatError",
    "GpuImport",
    "ensure_gpu_tables",
    "import_gpu_file",
    "read_nvidia_smi_csv",
    "read_nvidia_smi_dmon",
    "read_vllm_engine_csv",
    "store_engine_samples",
    "store_gpu_samples",
]

GPU_TABLE = "gpu_samples"
ENGINE_TABLE = "engine_samples"
GPU_IMPORTS_TABLE = "llmslo_gpu_imports"
"""One row per file :func:`import_gpu_file` wrote, keyed by ``(content_sha256, kind)`` (see the module doc)."""

GPU_COLUMNS: dict[str, str] = {
    "time_unix_s": "DOUBLE NOT NULL",
    "gpu": "VARCHAR NOT NULL",
    "source": "VARCHAR NOT NULL",
    "util_gpu_pct": "DOUBLE",
    "util_mem_pct": "DOUBLE",
    "memory_used_bytes": "DOUBLE",
    "memory_total_bytes": "DOUBLE",
    "power_w": "DOUBLE",
    "temperature_c": "DOUBLE",
    "sm_clock_mhz": "DOUBLE",
    "mem_clock_mhz": "DOUBLE",
    "throttle_reasons": "BIGINT",
}
"""Columns of ``gpu_samples`` and their DuckDB types (units in the module docstring)."""

_ENGINE_COLUMNS: dict[str, str] = {
    "time_unix_s": "DOUBLE NOT NULL", "source": "VARCHAR NOT NULL", "name": "VARCHAR NOT NULL", "value": "DOUBLE",
}
_POLARS = {"DOUBLE NOT NULL": pl.Float64, "DOUBLE": pl.Float64, "VARCHAR NOT NULL": pl.String, "BIGINT": pl.Int64}

GPU_IMPORT_KINDS: tuple[str, ...] = ("nvidia-smi", "dmon", "vllm-engine")
"""Kinds accepted by :func:`import_gpu_file`."""

# NVML clocks-event ("throttle") reason bits, as nvmlClocksEventReason* defines them.
_THROTTLE_BITS = {
    "gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
    "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80, "display_clock_setting": 0x100,
}
_MIB = 1024.0 * 1024.0
_UNIT_SCALE = {"mib": _MIB, "gib": 1024.0 * _MIB, "kib": 1024.0, "b": 1.0, "mb": 1e6, "gb": 1e9}


class GpuFormatError(LlmsloError, ValueError):
    """A GPU or engine file cannot be read in the format it was given as (the message says where and why)."""


def _empty_gpu() -> pl.DataFrame:
    return pl.DataFrame(schema={c: _POLARS[t] for c, t in GPU_COLUMNS.items()})


def _gpu_frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    schema = {c: _POLARS[t] for c, t in GPU_COLUMNS.items()}
    return pl.DataFrame([{c: r.get(c) for c in GPU_COLUMNS} for r in rows], schema=schema, orient="row")


def _number(text: str) -> float | None:
    """``" 59620 MiB"`` → 59620.0 (unit dropped), ``[N/A]``/``N/A``/empty → None."""
    t = text.strip()
    if not t or "N/A" in t or t == "-":
        return None
    m = re.match(r"^[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", t)
    if m is None:
        return None
    return float(m.group(0))


def _bytes(text: str, header_unit: str | None) -> float | None:
    value = _number(text)
    if value is None:
        return None
    unit = (re.sub(r"^[-+0-9.eE\s]+", "", text.strip()) or header_unit or "b").strip().lower()
    return value * _UNIT_SCALE.get(unit, 1.0)


def _active(text: str) -> bool | None:
    t = text.strip().lower()
    if t in ("active", "not active"):
        return t == "active"
    return None


def _utc(text: str) -> float:
    t = text.strip()
    for fmt in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S",
                "%Y%m%d %H:%M:%S"):
        try:
            return dt.datetime.strptime(t, fmt).replace(tzinfo=dt.UTC).timestamp()
        except ValueError:
            continue
    raise ValueError(f"unrecognised timestamp {t!r}")


def _field(header: str) -> tuple[str, str | None]:
    """``" memory.used [MiB]"`` → (``memory.used``, ``MiB``); a header that is not ``name [unit]`` is all name."""
    m = re.match(r"^\s*([^\[]*?)\s*(?:\[([^\]]*)\])?\s*$", header)
    if m is None or not m.group(1).strip():
        return header.strip(), None
    return m.group(1).strip(), m.group(2)


def read_nvidia_smi_csv(path: str | os.PathLike[str], *, start_unix_s: float = 0.0) -> pl.DataFrame:
    """Read ``nvidia-smi --query-gpu ... --format=csv`` output into ``gpu_samples`` rows (see the module doc).

    Raises :class:`GpuFormatError` naming the line of a row that cannot be read.
    """
    p = Path(path)
    with p.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader)
        except StopIteration:
            raise GpuFormatError(f"{p}: empty file") from None
        fields = [_field(h) for h in header]
        names = [f[0] for f in fields]
        if "timestamp" not in names and "time" not in names:
            raise GpuFormatError(f"{p}: no 'timestamp' or 'time [s]' column in the header ({', '.join(names)})")
        rows: list[dict[str, Any]] = []
        for line_no, values in enumerate(reader, start=2):
            if not values or all(not v.strip() for v in values):
                continue
            if len(values) != len(names):
                raise GpuFormatError(f"{p}:{line_no}: {len(values)} values for {len(names)} columns")
            try:
                rows.append(_smi_row(dict(zip(names, values, strict=True)), dict(fields), start_unix_s))
            except ValueError as exc:
                raise GpuFormatError(f"{p}:{line_no}: {exc}") from None
    return _gpu_frame(rows) if rows else _empty_gpu()


def _smi_row(v: dict[str, str], units: dict[str, str | None], start_unix_s: float) -> dict[str, Any]:
    row: dict[str, Any] = {"source": "nvidia-smi"}
    if "timestamp" in v:
        row["time_unix_s"] = _utc(v["timestamp"])
    else:
        t = _number(v["time"])
        if t is None:
            raise ValueError(f"time {v['time']!r} is not a number")
        row["time_unix_s"] = start_unix_s + t
    row["gpu"] = (v.get("index") or v.get("uuid") or v.get("pci.bus_id") or "0").strip()
    simple = {
        "utilization.gpu": "util_gpu_pct", "utilization.memory": "util_mem_pct", "power.draw": "power_w",
        "temperature.gpu": "temperature_c", "clocks.sm": "sm_clock_mhz", "clocks.current.sm": "sm_clock_mhz",
        "clocks.mem": "mem_clock_mhz", "clocks.current.memory": "mem_clock_mhz",
    }
    for name, col in simple.items():
        if name in v:
            row[col] = _number(v[name])
    for name, col in (("memory.used", "memory_used_bytes"), ("memory.total", "memory_total_bytes")):
        if name in v:
            row[col] = _bytes(v[name], units.get(name))
    mask: int | None = None
    for name, text in v.items():
        prefix = next((p for p in ("clocks_event_reasons.", "clocks_throttle_reasons.") if name.startswith(p)), None)
        if prefix is None:
            continue
        reason = name[len(prefix):]
        if reason == "active":
            bits = _number(text.replace("0x", "").strip()) if not text.strip().startswith("0x") else float(
                int(text.strip(), 16))
            if bits is not None:
                mask = int(bits)
            continue
        active = _active(text)
        if active is None or reason not in _THROTTLE_BITS:
            continue
        mask = (mask or 0) | (_THROTTLE_BITS[reason] if active else 0)
    row["throttle_reasons"] = mask
    return row


def read_nvidia_smi_dmon(
    path: str | os.PathLike[str], *, start_unix_s: float = 0.0, interval_s: float = 1.0
) -> pl.DataFrame:
    """Read ``nvidia-smi dmon`` output (printed or converted to CSV) into ``gpu_samples`` rows.

    ``sm`` (SM activity, %) becomes ``util_gpu_pct``, ``mem`` ``util_mem_pct``, ``pwr`` ``power_w``, ``gtemp``
    ``temperature_c``, ``pclk`` ``sm_clock_mhz``, ``mclk`` ``mem_clock_mhz``; a non-zero ``pviol`` sets the
    power-cap bit of ``throttle_reasons`` and ``tviol`` the thermal one. Raises :class:`GpuFormatError`.
    """
    p = Path(path)
    lines = [ln.rstrip("\n") for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if len(lines) < 2:
        raise GpuFormatError(f"{p}: expected two header lines (names, units) and data rows")

    def split(line: str) -> list[str]:
        body = line.lstrip("#").strip()
        return [c.strip() for c in body.split(",")] if "," in body else body.split()

    names = [n.lower() for n in split(lines[0])]
    if "gpu" not in names:
        raise GpuFormatError(f"{p}: no 'gpu' column in the first header line ({', '.join(names)})")
    data = [ln for ln in lines[2:] if not ln.lstrip().startswith("#")]
    rows: list[dict[str, Any]] = []
    seen_per_gpu: dict[str, int] = {}
    for line_no, line in enumerate(data, start=3):
        values = split(line)
        if len(values) != len(names):
            raise GpuFormatError(f"{p}: row {line_no}: {len(values)} values for {len(names)} columns")
        v = dict(zip(names, values, strict=True))
        gpu = v["gpu"]
        try:
            if "time" in v and "date" in v:
                t = _utc(f"{v['date']} {v['time']}")
            elif "time" in v:
                tt = _number(v["time"])
                if tt is None:
                    raise ValueError(f"time {v['time']!r} is not a number")
                t = start_unix_s + tt
            else:
                t = start_unix_s + interval_s * seen_per_gpu.get(gpu, 0)
        except ValueError as exc:
            raise GpuFormatError(f"{p}: row {line_no}: {exc}") from None
        seen_per_gpu[gpu] = seen_per_gpu.get(gpu, 0) + 1
        mask = None
        if "pviol" in v or "tviol" in v:
            pviol, tviol = _number(v.get("pviol", "0")) or 0.0, _number(v.get("tviol", "0")) or 0.0
            mask = (_THROTTLE_BITS["sw_power_cap"] if pviol > 0 else 0) | (
                _THROTTLE_BITS["sw_thermal_slowdown"] if tviol > 0 else 0)
        rows.append({
            "time_unix_s": t, "gpu": gpu, "source": "dmon",
            "util_gpu_pct": _number(v.get("sm", "")), "util_mem_pct": _number(v.get("mem", "")),
            "power_w": _number(v.get("pwr", "")), "temperature_c": _number(v.get("gtemp", "")),
            "sm_clock_mhz": _number(v.get("pclk", "")), "mem_clock_mhz": _number(v.get("mclk", "")),
            "throttle_reasons": mask,
        })
    return _gpu_frame(rows) if rows else _empty_gpu()


def read_vllm_engine_csv(path: str | os.PathLike[str], *, start_unix_s: float = 0.0) -> pl.DataFrame:
    """Read a vLLM engine time series (``time [s]`` + one column per metric) into ``engine_samples`` rows.

    Raises :class:`GpuFormatError` when the file has no ``time`` column or a value is not a number.
    """
    p = Path(path)
    with p.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        try:
            header = [_field(h)[0] for h in next(reader)]
        except StopIteration:
            raise GpuFormatError(f"{p}: empty file") from None
        if not header or header[0] != "time":
            raise GpuFormatError(f"{p}: the first column must be 'time [s]', found {header[:1]}")
        _check_metric_names(p, header[1:])
        times: list[float] = []
        names: list[str] = []
        values: list[float | None] = []
        for line_no, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) != len(header):
                raise GpuFormatError(f"{p}:{line_no}: {len(row)} values for {len(header)} columns")
            t = _number(row[0])
            if t is None:
                raise GpuFormatError(f"{p}:{line_no}: time {row[0]!r} is not a number")
            for name, text in zip(header[1:], row[1:], strict=True):
                times.append(start_unix_s + t)
                names.append(name)
                x = _number(text)
                values.append(x if x is None or math.isfinite(x) else None)
    return pl.DataFrame({"time_unix_s": times, "source": ["vllm"] * len(times), "name": names, "value": values},
                        schema={"time_unix_s": pl.Float64, "source": pl.String, "name": pl.String,
                                "value": pl.Float64})


_IMPORTS_COLUMNS: dict[str, str] = {
    "content_sha256": "VARCHAR NOT NULL", "kind": "VARCHAR NOT NULL", "source": "VARCHAR NOT NULL",
    "table_name": "VARCHAR NOT NULL", "start_unix_s": "DOUBLE NOT NULL", "interval_s": "DOUBLE",
    "rows_written": "BIGINT NOT NULL", "imported_unix_s": "DOUBLE NOT NULL",
}


def _check_metric_names(p: Path, names: list[str]) -> None:
    """Engine metric names become columns beside ``t``: each must be non-empty, unique and not ``t``."""
    seen: set[str] = set()
    for i, name in enumerate(names, start=2):
        if not name or name == "t" or name in seen:
            why = "is empty" if not name else "is the name of the time column" if name == "t" else "appears twice"
            raise GpuFormatError(f"{p}: column {i} of the header ({name!r}) {why}; rename it")
        seen.add(name)


def ensure_gpu_tables(con: duckdb.DuckDBPyConnection) -> None:
    """Create ``gpu_samples``, ``engine_samples`` and ``llmslo_gpu_imports`` if they are missing."""
    for table, cols in ((GPU_TABLE, GPU_COLUMNS), (ENGINE_TABLE, _ENGINE_COLUMNS)):
        body = ", ".join(f"{c} {t}" for c, t in cols.items())
        con.execute(f"CREATE TABLE IF NOT EXISTS {table} ({body})")
    body = ", ".join(f"{c} {t}" for c, t in _IMPORTS_COLUMNS.items())
    con.execute(f"CREATE TABLE IF NOT EXISTS {GPU_IMPORTS_TABLE} ({body}, PRIMARY KEY (content_sha256, kind))")


def _insert(con: duckdb.DuckDBPyConnection, table: str, cols: dict[str, str], frame: pl.DataFrame) -> int:
    ensure_gpu_tables(con)
    if frame.height == 0:
        return 0
    missing = [c for c in cols if c not in frame.columns]
    if missing:
        raise ConfigurationError(f"{table}: frame lacks columns {', '.join(missing)}")
    arrow = frame.select(list(cols)).to_arrow()
    name = f"__llmslo_{table}_in"
    con.register(name, arrow)
    try:
        con.execute(f"INSERT INTO {table} ({', '.join(cols)}) SELECT {', '.join(cols)} FROM {name}")
    finally:
        con.unregister(name)
    return frame.height


def store_gpu_samples(con: duckdb.DuckDBPyConnection, frame: pl.DataFrame) -> int:
    """Append GPU samples (columns :data:`GPU_COLUMNS`); returns the rows written."""
    return _insert(con, GPU_TABLE, GPU_COLUMNS, frame)


def store_engine_samples(con: duckdb.DuckDBPyConnection, frame: pl.DataFrame) -> int:
    """Append engine samples (``time_unix_s``, ``source``, ``name``, ``value``); returns the rows written."""
    return _insert(con, ENGINE_TABLE, _ENGINE_COLUMNS, frame)


@dataclass(frozen=True)
class GpuImport:
    """What :func:`import_gpu_file` did with one file.

    ``table`` is where its rows go (``gpu_samples`` or ``engine_samples``); ``content_sha256`` the SHA-256
    (hex) of its bytes; ``rows_written`` the rows added (0 when ``already_imported``: the same file was
    imported before as the same kind with the same options, and ``rows_recorded`` is what that import wrote).
    """

    source: str
    kind: str
    table: str
    content_sha256: str
    rows_written: int
    rows_recorded: int
    already_imported: bool

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary."""
        return asdict(self)


def _file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 (hex) of a file's bytes, read 1 MiB at a time."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _own_times(kind: str, path: Path) -> str | None:
    """The column that gives ``path``'s samples their own (absolute, UTC) times when read as ``kind``; None when
    its times are relative (seconds from the run's start, or one sample every ``interval_s``)."""
    if kind == "vllm-engine":
        return None
    with path.open(newline="", encoding="utf-8") as fh:
        first = next((line for line in fh if line.strip()), "")
    if kind == "nvidia-smi":
        names = {_field(h)[0] for h in next(csv.reader([first]), [])}
        return "timestamp" if "timestamp" in names else None
    body = first.lstrip("#").strip()
    names = {n.strip().lower() for n in (body.split(",") if "," in body else body.split())}
    return "Date/Time" if {"date", "time"} <= names else None


def _relative_start(kind: str, path: Path) -> str:
    """What ``path``'s times count from when they are relative, for the message that asks for ``--start``."""
    if kind == "dmon":
        return "its samples have no time column of their own (one every --interval) or only 'time' (seconds)"
    return "its 'time [s]' column counts seconds from the run's start"


def _read_kind(kind: str, path: Path, start_unix_s: float, interval_s: float) -> tuple[str, pl.DataFrame]:
    """``(table, frame)`` of ``path`` read as ``kind``."""
    if kind == "nvidia-smi":
        return GPU_TABLE, read_nvidia_smi_csv(path, start_unix_s=start_unix_s)
    if kind == "dmon":
        return GPU_TABLE, read_nvidia_smi_dmon(path, start_unix_s=start_unix_s, interval_s=interval_s)
    return ENGINE_TABLE, read_vllm_engine_csv(path, start_unix_s=start_unix_s)


def _earlier_import(con: duckdb.DuckDBPyConnection, sha: str, kind: str) -> tuple[Any, ...] | None:
    rows = con.execute(
        f"SELECT source, table_name, start_unix_s, interval_s, rows_written FROM {GPU_IMPORTS_TABLE} "
        "WHERE content_sha256 = ? AND kind = ?", [sha, kind]).fetchall()
    return tuple(rows[0]) if rows else None


def import_gpu_file(
    con: duckdb.DuckDBPyConnection,
    kind: str,
    path: str | os.PathLike[str],
    *,
    start_unix_s: float | None = None,
    interval_s: float = 1.0,
) -> GpuImport:
    """Read ``path`` as ``kind`` (one of :data:`GPU_IMPORT_KINDS`) and append it to its table, once.

    A file whose times are relative (a ``time [s]`` column of seconds from the run's start, or dmon rows without
    a time of their own) is placed at ``start_unix_s`` (Unix seconds of its time 0), which it then needs: without
    one it is refused rather than placed in 1970, where it would line up with nothing of its run. A file with
    its own times (nvidia-smi's ``timestamp``, dmon's ``Date``/``Time``) takes none.

    Idempotent: keyed by the SHA-256 of the file's bytes and ``kind`` (:data:`GPU_IMPORTS_TABLE`), a file
    imported before with the same ``start_unix_s`` (and, for dmon, ``interval_s``; seconds) writes nothing.
    The rows and their record are written in one transaction (``con`` must not be inside one).

    Raises :class:`ConfigurationError` for an unknown kind, and :class:`GpuFormatError` for an unreadable
    file, relative times without ``start_unix_s`` (or a ``start_unix_s`` for a file with its own times), or a
    file imported before with other time options; nothing is written then.
    """
    if kind not in GPU_IMPORT_KINDS:
        raise ConfigurationError(f"unknown GPU import kind {kind!r}; choose from {', '.join(GPU_IMPORT_KINDS)}")
    p = Path(path)
    try:
        own = _own_times(kind, p)
    except (OSError, UnicodeDecodeError) as exc:
        raise GpuFormatError(f"{p}: cannot read it as {kind}: {exc}") from None
    if own is None and start_unix_s is None:
        raise GpuFormatError(
            f"{p}: the times are relative ({_relative_start(kind, p)}) and the file says nothing of when that "
            "was: pass --start with the Unix time (or ISO 8601 time, UTC unless it says otherwise) of its time 0, "
            "so that its samples line up with the requests of the same run (--start 0 keeps them relative, at "
            "1970-01-01, where they line up only with other files imported with --start 0)")
    if own is not None and start_unix_s is not None:
        raise GpuFormatError(f"{p}: --start applies only to relative times; this file has its own ({own!r} "
                             "column, UTC): leave --start out")
    start_s = 0.0 if start_unix_s is None else float(start_unix_s)
    sha = _file_sha256(p)
    interval = float(interval_s) if kind == "dmon" else None
    ensure_gpu_tables(con)
    earlier = _earlier_import(con, sha, kind)
    if earlier is not None:
        source, table, start, before_interval, rows = earlier
        if start == start_s and before_interval == interval:
            return GpuImport(str(p), kind, str(table), sha, 0, int(rows), True)
        options = f"--start {start:g}" + (f" --interval {before_interval:g}s" if before_interval is not None else "")
        raise GpuFormatError(
            f"{p}: this file was imported before as {kind} from {source} with {options} ({int(rows):,} rows); "
            "importing it again with other time options would store its samples twice, at two times"
        )
    table, frame = _read_kind(kind, p, start_s, interval_s)
    con.execute("BEGIN TRANSACTION")
    try:
        written = _insert(con, table, GPU_COLUMNS if table == GPU_TABLE else _ENGINE_COLUMNS, frame)
        con.execute(f"INSERT INTO {GPU_IMPORTS_TABLE} ({', '.join(_IMPORTS_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [sha, kind, str(p), table, start_s, interval, written, time.time()])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return GpuImport(str(p), kind, table, sha, written, written, False)
