"""Ingest throughput: llmslo ``Store`` (validation included) vs a bare DuckDB ``INSERT ... SELECT *``.

Four methods, run side by side in every repeat (their order rotates), each into a fresh on-disk file:

* ``Store.ingest_frame(arrow_table)`` (stage, validate every rule, insert in one transaction) vs the bare
  baseline ``INSERT INTO request_summaries SELECT * FROM <registered arrow table>`` into a file with the
  same DDL (``summary_ddl()``), no validation;
* ``Store.ingest_files([parquet])`` vs the bare ``INSERT INTO request_summaries SELECT * FROM
  read_parquet(...)``;
* for reference, the same bare Arrow insert into an in-memory database, without a CHECKPOINT (no file,
  no compression): what is left of the on-disk cost once DuckDB's compressed writes are taken out.

Timed: the ingest call plus a ``CHECKPOINT`` (the data is on disk at the end), for both sides. Not
timed: creating the file and the table (``Store.open`` / ``connect`` + DDL), generating the data and
writing the Parquet file (once, row groups of 122,880 rows, snappy). Figures are medians over the
repeats; the ratio is the median of the per-repeat ratios ours/bare (same repeat, side by side).
A breakdown of the llmslo time (stage / validate / insert / checkpoint) is taken by wrapping the
``Store`` methods in this process. Targets: >= 1,000,000 rows/s and <= 2x bare.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from llmslo.analysis import Store, summary_ddl
from llmslo.analysis.store._schema import SUMMARY_TABLE
from llmslo.bench._data import synthetic_summaries
from llmslo.bench._util import median, remove_db, spread, table, temp_dir

TARGET_ROWS_PER_S = 1_000_000
TARGET_RATIO = 2.0
PARQUET_ROW_GROUP = 122_880

_PHASES: dict[str, float] = {}
_WRAPPED = {"_stage_frame": "stage", "_stage_file": "stage", "_is_clean": "validate",
            "_find_errors": "validate", "_insert": "insert"}


def _install_phase_timers() -> None:
    """Accumulate the time spent in the main ``Store`` steps into ``_PHASES`` (this process only)."""
    for method, phase in _WRAPPED.items():
        original = getattr(Store, method)
        if getattr(original, "__bench_wrapped__", False):
            continue

        def make(fn: Callable[..., Any], phase: str) -> Callable[..., Any]:
            @wraps(fn)
            def timed(*args: Any, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    _PHASES[phase] = _PHASES.get(phase, 0.0) + time.perf_counter() - t0

            timed.__bench_wrapped__ = True  # type: ignore[attr-defined]
            return timed

        setattr(Store, method, make(original, phase))


def _ours(
    db: Path, n: int, *, frame: pa.Table | None = None, parquet: Path | None = None
) -> dict[str, float]:
    store = Store.open(db)
    try:
        _PHASES.clear()
        t0 = time.perf_counter()
        if frame is not None:
            reports = [store.ingest_frame(frame)]
        else:
            assert parquet is not None
            reports = store.ingest_files([parquet])
        t1 = time.perf_counter()
        store.con.execute("CHECKPOINT")
        t2 = time.perf_counter()
        inserted = sum(r.rows_inserted for r in reports)
        assert inserted == n, f"inserted {inserted} of {n} rows"
        assert store.count() == n
    finally:
        store.close()
        remove_db(db)
    out = {"seconds": t2 - t0, "checkpoint": t2 - t1}
    out.update({k: _PHASES.get(k, 0.0) for k in ("stage", "validate", "insert")})
    out["other"] = (t1 - t0) - sum(_PHASES.values())
    return out


def _bare(
    db: Path | None, n: int, *, frame: pa.Table | None = None, parquet: Path | None = None
) -> dict[str, float]:
    """The bare insert into a file (or, with ``db=None``, into an in-memory database: no compression)."""
    con = duckdb.connect(str(db) if db is not None else ":memory:")
    try:
        con.execute(summary_ddl())
        t0 = time.perf_counter()
        if frame is not None:
            con.register("bench_src", frame)
            con.execute(f"INSERT INTO {SUMMARY_TABLE} SELECT * FROM bench_src")
        else:
            assert parquet is not None
            lit = "'" + str(parquet).replace("'", "''") + "'"
            con.execute(f"INSERT INTO {SUMMARY_TABLE} SELECT * FROM read_parquet({lit})")
        t1 = time.perf_counter()
        if db is not None:  # an in-memory CHECKPOINT compresses in memory: not part of the reference
            con.execute("CHECKPOINT")
        t2 = time.perf_counter()
        count = con.sql(f"SELECT count(*) FROM {SUMMARY_TABLE}").fetchall()[0][0]
        assert count == n, f"bare inserted {count} of {n} rows"
    finally:
        con.close()
        if db is not None:
            remove_db(db)
    return {"seconds": t2 - t0, "checkpoint": t2 - t1, "insert": t1 - t0}


def run(rows: int, repeat: int, warmup: int, seed: int) -> dict[str, Any]:
    _install_phase_timers()
    with temp_dir() as tmp:
        data = synthetic_summaries(rows, seed)
        parquet = tmp / "summaries.parquet"
        pq.write_table(data, parquet, row_group_size=PARQUET_ROW_GROUP)
        methods: dict[str, Callable[[Path], dict[str, float]]] = {
            "arrow/llmslo": lambda db: _ours(db, rows, frame=data),
            "arrow/bare": lambda db: _bare(db, rows, frame=data),
            "arrow/bare-memory": lambda db: _bare(None, rows, frame=data),
            "parquet/llmslo": lambda db: _ours(db, rows, parquet=parquet),
            "parquet/bare": lambda db: _bare(db, rows, parquet=parquet),
        }
        names = list(methods)
        samples: dict[str, list[dict[str, float]]] = {k: [] for k in names}
        for r in range(warmup + repeat):
            order = names[r % len(names):] + names[: r % len(names)]
            for name in order:
                result = methods[name](tmp / f"{name.replace('/', '_')}.duckdb")
                if r >= warmup:
                    samples[name].append(result)
        parquet_mb = parquet.stat().st_size / 2**20
    figures: dict[str, Any] = {
        "rows": rows, "repeat": repeat, "warmup": warmup, "seed": seed, "threads": _threads(),
        "loadavg_1m": os.getloadavg()[0],
        "parquet_mib": round(parquet_mb, 1), "arrow_mib": round(data.nbytes / 2**20, 1), "methods": {},
    }
    for name in names:
        secs = [s["seconds"] for s in samples[name]]
        entry: dict[str, Any] = {
            "median_s": median(secs), "min_s": min(secs), "max_s": max(secs), "seconds": secs,
            "rows_per_s": rows / median(secs),
            "phases_median_s": {k: median([s[k] for s in samples[name]]) for k in samples[name][0]
                                if k != "seconds"},
        }
        figures["methods"][name] = entry
    for source in ("arrow", "parquet"):
        ours, bare = samples[f"{source}/llmslo"], samples[f"{source}/bare"]
        ratios = [o["seconds"] / b["seconds"] for o, b in zip(ours, bare, strict=True)]
        m = figures["methods"][f"{source}/llmslo"]
        m["ratio_vs_bare"] = median(ratios)
        m["ratios"] = ratios
        m["meets_rows_per_s"] = m["rows_per_s"] >= TARGET_ROWS_PER_S
        m["meets_ratio"] = m["ratio_vs_bare"] <= TARGET_RATIO
    return figures


def _threads() -> int:
    return int(duckdb.connect().sql("SELECT current_setting('threads')").fetchall()[0][0])


def render(f: dict[str, Any]) -> str:
    labels = {
        "arrow/llmslo": "llmslo Store.ingest_frame (validated)",
        "arrow/bare": "bare INSERT ... SELECT * FROM arrow",
        "arrow/bare-memory": "  same into :memory:, no CHECKPOINT (reference)",
        "parquet/llmslo": "llmslo Store.ingest_files (validated)",
        "parquet/bare": "bare INSERT ... SELECT * FROM read_parquet",
    }
    rows = []
    for name, label in labels.items():
        m = f["methods"][name]
        ratio = m.get("ratio_vs_bare")
        rows.append([name.split("/")[0], label, m["median_s"], spread(m["seconds"]), m["rows_per_s"],
                     f"{ratio:.2f}x" if ratio is not None else ""])
    head = (f"ingest {f['rows']:,} rows into a fresh on-disk store, {f['repeat']} repeats (+{f['warmup']} "
            f"warm-up), DuckDB threads={f['threads']}, load avg {f['loadavg_1m']:.1f}; "
            f"Arrow {f['arrow_mib']} MiB, "
            f"Parquet {f['parquet_mib']} MiB\n"
            "timed: ingest call + CHECKPOINT; median seconds, min..max, rows/s of the median, "
            "median of paired ratios ours/bare")
    out = [head, "", table(["source", "method", "median s", "min..max", "rows/s", "ours/bare"], rows), ""]
    phase_rows = []
    for name in ("arrow/llmslo", "parquet/llmslo"):
        p = f["methods"][name]["phases_median_s"]
        phase_rows.append([name, p["stage"], p["validate"], p["insert"], p["checkpoint"], p["other"]])
    for name in ("arrow/bare", "arrow/bare-memory", "parquet/bare"):
        p = f["methods"][name]["phases_median_s"]
        phase_rows.append([name, None, None, p["insert"], p["checkpoint"], None])
    out += ["where the time goes (median seconds per phase):",
            table(["method", "stage", "validate", "insert", "checkpoint", "other"], phase_rows), ""]
    for source in ("arrow", "parquet"):
        m = f["methods"][f"{source}/llmslo"]
        out.append(
            f"target {source}: {m['rows_per_s']:,.0f} rows/s (>= {TARGET_ROWS_PER_S:,}: "
            f"{'PASS' if m['meets_rows_per_s'] else 'MISS'}), {m['ratio_vs_bare']:.2f}x bare "
            f"(<= {TARGET_RATIO:g}x: {'PASS' if m['meets_ratio'] else 'MISS'})"
        )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows to ingest (default 1,000,000)")
    parser.add_argument("--repeat", type=int, default=5, help="timed repeats of each method (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs of each method first (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if args.rows < 1 or args.repeat < 1 or args.warmup < 0:
        parser.error("--rows and --repeat must be >= 1, --warmup >= 0")
    figures = run(args.rows, args.repeat, args.warmup, args.seed)
    print(json.dumps(figures, indent=2) if args.json else render(figures))


if __name__ == "__main__":
    main()
