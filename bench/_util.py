"""Small helpers shared by the benchmark scripts: medians, tables, temporary directories, RSS."""

from __future__ import annotations

import resource
import shutil
import statistics
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def spread(xs: Sequence[float]) -> str:
    """``min..max`` of a sample, for the tables."""
    return f"{min(xs):.3g}..{max(xs):.3g}" if xs else "-"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain fixed-width table: text left-aligned, numbers right-aligned."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(isinstance(r[i], int | float) or r[i] in ("", "-", None) for r in rows) for i in
               range(len(headers))]
    lines = []
    for k, r in enumerate(cells):
        parts = [c.rjust(w) if numeric[i] and k else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths,
                                                                                                strict=True))]
        lines.append("  ".join(parts).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v != v:  # NaN
            return "-"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


@contextmanager
def temp_dir(prefix: str = "llmslo-bench-") -> Iterator[Path]:
    """A fresh temporary directory, removed with everything in it at the end."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def remove_db(path: Path) -> None:
    """Delete a DuckDB file and its write-ahead log."""
    for p in (path, path.with_name(path.name + ".wal")):
        p.unlink(missing_ok=True)


def _proc_status_mb(field: str) -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, MiB.

    ``VmHWM`` from /proc, not ``getrusage().ru_maxrss``: on Linux a child started by fork + exec
    inherits the parent's high-water mark in ``ru_maxrss`` (measured: every child of a 900 MiB parent
    reported 892 MiB whatever it ran), while ``VmHWM`` belongs to the new address space only.
    Falls back to ``ru_maxrss`` where /proc is missing.
    """
    hwm = _proc_status_mb("VmHWM")
    if hwm == hwm:
        return hwm
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mb() -> float:
    """Current resident set size of this process, MiB (from /proc; NaN elsewhere)."""
    return _proc_status_mb("VmRSS")
