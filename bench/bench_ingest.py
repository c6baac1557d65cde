"""Ingest speed: llmslo ingest against plain DuckDB loads, and ingest into a large store against an empty one.

Three comparisons, each measured side by side in the same run (ours and its baseline alternate within
every repeat, their order swapping from one repeat to the next); a ratio is the median of the per-repeat
ratios ours/baseline; times are medians in seconds.

1. **Parquet file, fresh store.** ``--cli-rows`` rows (default 10,000,000) in one Parquet file, loaded
   into a fresh on-disk DuckDB file:

   * as processes: ``python -m llmslo.cli ingest FILE --db DB`` against ``python -c`` running
     ``CREATE TABLE request_summaries AS SELECT * FROM read_parquet(FILE)`` + ``CHECKPOINT``. Timed: the
     whole process, start to exit (so interpreter start and imports are on both sides); the CLI's
     ``CHECKPOINT`` is the one DuckDB runs when the store is closed (checked: no ``.wal`` is left). The CPU
     time of each process (user + sys) is printed too, with its own ratio: on 2 cores shared with other
     work the wall times of both sides follow the load (the same baseline took 5.2 s on a calm machine and
     8.7 s in a busy run), which the per-pair ratios cancel only in part; the CPU ratio hardly moves.
     ``--sections cli`` runs this comparison alone;
   * in this process: ``Store.ingest_files([FILE])`` + ``CHECKPOINT`` against the same ``CREATE TABLE
     ... AS SELECT`` + ``CHECKPOINT``; opening the file is not timed.

   Target: ours <= 1.5x the baseline, for both.

2. **New rows into a large store.** ``--new-rows`` rows (default 1,000,000) in a Parquet file, loaded
   with ``Store.ingest_files`` + ``CHECKPOINT`` into a store that already holds ``--stored-rows`` rows
   (default 30,000,000), against the same file into an empty store. The large store is built once
   through ``Store.ingest_frame`` (1M-row batches of :func:`synthetic_summaries`, not timed), settled
   with one more small write and ``CHECKPOINT`` (DuckDB's block upkeep from the build, see
   ``_build_store``), and **copied** (``shutil.copy`` then ``fsync``, not timed) to a fresh file before
   every timed run, so each run starts from the same store and its commit does not pay for writing the
   copy back. Two kinds of ids, each with its own large store:

   * ``sequential``: the ids of :func:`synthetic_summaries`, ``req-<seed>-<index>``; the stored batches
     use seeds 1, 2, ... (one per 1M rows), the new rows seed 0, so no new id is stored (every run
     checks that none was found stored);
   * ``random``: the same rows with ``request_id`` replaced by ``md5(request_id)`` (32 hex digits, like
     a UUID: no order, so no id range can rule out any stored batch).

   Target: ours into the large store <= 1.15x ours into the empty store.

3. **Throughput (kept from the earlier benchmark).** ``--rows`` rows (default 1,000,000) from an Arrow
   table and from Parquet into a fresh on-disk store, ``Store`` (validated) against a bare ``INSERT INTO
   request_summaries SELECT * FROM ...`` into a file with the same DDL; ingest call + ``CHECKPOINT``.
   Targets: >= 1,000,000 rows/s and <= 2x bare.

Not timed anywhere: generating the data, writing the Parquet files (row groups of 122,880 rows, snappy),
building and copying the large stores. A breakdown of the in-process llmslo time (stage / ids scan /
stored-id lookup / insert / checkpoint) is taken by wrapping ``Store`` methods in this process.
Everything is written under one temporary folder (``--tmp``), removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from llmslo.analysis import Store, summary_ddl
from llmslo.analysis.store._schema import SUMMARY_TABLE
from llmslo.bench._data import synthetic_batches, synthetic_summaries
from llmslo.bench._util import median, remove_db, spread, table, temp_dir

TARGET_CLI_RATIO = 1.5
TARGET_STORE_RATIO = 1.15
TARGET_ROWS_PER_S = 1_000_000
TARGET_RATIO = 2.0
PARQUET_ROW_GROUP = 122_880
BATCH_ROWS = 1_000_000

CTAS_SCRIPT = (
    "import sys, duckdb\n"
    "con = duckdb.connect(sys.argv[2])\n"
    "lit = \"'\" + sys.argv[1].replace(\"'\", \"''\") + \"'\"\n"
    f"con.execute(f'CREATE TABLE {SUMMARY_TABLE} AS SELECT * FROM read_parquet({{lit}})')\n"
    "con.execute('CHECKPOINT')\n"
    "con.close()\n"
)
"""The baseline process of comparison 1: ``python -c CTAS_SCRIPT FILE DB``."""

_PHASES: dict[str, float] = {}
_WRAPPED = {"_stage_frame": "stage", "_stage_file": "stage", "_ids_distinct": "ids", "_validate": "validate",
            "_sync_id_index": "sync", "_stored_among": "lookup", "_insert": "insert"}


def _install_phase_timers() -> None:
    """Accumulate the time spent in the main ``Store`` steps into ``_PHASES`` (seconds, this process only)."""
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


def _phases(total_s: float, checkpoint_s: float) -> dict[str, float]:
    """The phases of the last ``Store`` call, seconds; ``insert`` excludes the lookup it contains."""
    out = {k: _PHASES.get(k, 0.0) for k in ("stage", "ids", "validate", "sync", "lookup")}
    out["insert"] = _PHASES.get("insert", 0.0) - out["lookup"]
    out["checkpoint"] = checkpoint_s
    out["other"] = total_s - checkpoint_s - sum(v for k, v in _PHASES.items() if k != "lookup")
    return out


@contextmanager
def _temp_dir(parent: Path | None) -> Iterator[Path]:
    """A fresh folder (under ``parent``, else the system's temporary folder), removed with its files at the end."""
    if parent is None:
        with temp_dir() as path:
            yield path
        return
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="llmslo-bench-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _lit(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def _write_parquet(path: Path, rows: int, seed: int, *, random_ids: bool = False) -> None:
    """``rows`` synthetic summaries as one Parquet file, written 1M rows at a time."""
    writer: pq.ParquetWriter | None = None
    try:
        for n, s in synthetic_batches(rows, BATCH_ROWS, seed):
            batch = _random_ids(synthetic_summaries(n, s)) if random_ids else synthetic_summaries(n, s)
            if writer is None:
                writer = pq.ParquetWriter(path, batch.schema)
            writer.write_table(batch, row_group_size=PARQUET_ROW_GROUP)
    finally:
        if writer is not None:
            writer.close()


def _random_ids(t: pa.Table) -> pa.Table:
    """``t`` with each ``request_id`` replaced by its md5 (32 hex digits; distinct ids stay distinct)."""
    con = duckdb.connect()
    try:
        con.register("t", t)
        ids = con.sql("SELECT md5(request_id) AS request_id FROM t").to_arrow_table()["request_id"]
    finally:
        con.close()
    i = t.schema.get_field_index("request_id")
    return t.set_column(i, t.schema.field(i), ids.cast(pa.string()))


def _check_count(db: Path, n: int) -> None:
    con = duckdb.connect(str(db), read_only=True)
    try:
        count = con.sql(f"SELECT count(*) FROM {SUMMARY_TABLE}").fetchall()[0][0]
    finally:
        con.close()
    assert count == n, f"{db}: {count} rows, expected {n}"


# ---- 1. a Parquet file into a fresh store ----------------------------------------------------------


def _children_cpu_s() -> float:
    """User + system CPU seconds of this process's finished children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _process(argv: list[str]) -> dict[str, float]:
    """Run ``argv`` to its end; its wall seconds (start to exit) and CPU seconds (user + sys, all its threads)."""
    cpu0, t0 = _children_cpu_s(), time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    seconds, cpu = time.perf_counter() - t0, _children_cpu_s() - cpu0
    assert proc.returncode == 0, proc.stderr
    return {"seconds": seconds, "cpu_s": cpu}


def _cli_ours(parquet: Path, db: Path, n: int) -> dict[str, float]:
    remove_db(db)
    timed = _process([sys.executable, "-m", "llmslo.cli", "ingest", str(parquet), "--db", str(db)])
    assert not db.with_name(db.name + ".wal").exists(), "the CLI left a WAL: not checkpointed"
    _check_count(db, n)
    remove_db(db)
    return timed


def _cli_ctas(parquet: Path, db: Path, n: int) -> dict[str, float]:
    remove_db(db)
    timed = _process([sys.executable, "-c", CTAS_SCRIPT, str(parquet), str(db)])
    _check_count(db, n)
    remove_db(db)
    return timed


def _store_ingest(db: Path, n: int, *, parquet: Path | None = None, frame: pa.Table | None = None,
                  copy_of: Path | None = None) -> dict[str, float]:
    """``Store.ingest_*`` + CHECKPOINT into ``db`` (a copy of ``copy_of``, else a fresh store), seconds."""
    remove_db(db)
    if copy_of is not None:
        shutil.copy(copy_of, db)
        with db.open("rb+") as fh:  # the copy on disk now: its write-back is not charged to the timed commit
            os.fsync(fh.fileno())
    store = Store.open(db)
    try:
        before = store.count()
        _PHASES.clear()
        t0 = time.perf_counter()
        reports = store.ingest_files([parquet]) if parquet is not None else [store.ingest_frame(frame)]
        t1 = time.perf_counter()
        store.con.execute("CHECKPOINT")
        t2 = time.perf_counter()
        inserted = sum(r.rows_inserted for r in reports)
        assert inserted == n and sum(r.rows_already_stored for r in reports) == 0, reports
        assert store.count() == before + n
    finally:
        store.close()
        remove_db(db)
    return {"seconds": t2 - t0, **_phases(t2 - t0, t2 - t1)}


def _ctas(parquet: Path, db: Path, n: int) -> dict[str, float]:
    remove_db(db)
    con = duckdb.connect(str(db))
    try:
        t0 = time.perf_counter()
        con.execute(f"CREATE TABLE {SUMMARY_TABLE} AS SELECT * FROM read_parquet({_lit(parquet)})")
        con.execute("CHECKPOINT")
        seconds = time.perf_counter() - t0
        assert con.sql(f"SELECT count(*) FROM {SUMMARY_TABLE}").fetchall()[0][0] == n
    finally:
        con.close()
        remove_db(db)
    return {"seconds": seconds}


# ---- 2. new rows into a large store ----------------------------------------------------------------


def _build_store(db: Path, rows: int, *, random_ids: bool) -> float:
    """A store of ``rows`` summaries (seeds 1, 2, ...) built through ``Store.ingest_frame``; seconds taken."""
    t0 = time.perf_counter()
    with Store.open(db) as store:
        for n, seed in synthetic_batches(rows, BATCH_ROWS, seed=1):
            batch = synthetic_summaries(n, seed)
            report = store.ingest_frame(_random_ids(batch) if random_ids else batch, source=f"seed {seed}")
            assert report.rows_inserted == n, report
        store.con.execute("CHECKPOINT")
        # Settle the file: DuckDB does the block upkeep left by a session of appends at the next
        # checkpoint that has something to write (measured: 1.2 s on the 30M random-id store, whose
        # 32-character ids leave ~2,000 free blocks; 0.006 s once settled). Without this every timed
        # run on a fresh copy would pay it, into the CHECKPOINT that ends the timed ingest.
        store.set_meta("bench_built_unix_s", str(time.time()))
        store.con.execute("CHECKPOINT")
    return time.perf_counter() - t0


# ---- 3. throughput against a bare insert -----------------------------------------------------------


def _bare(db: Path, n: int, *, frame: pa.Table | None = None, parquet: Path | None = None) -> dict[str, float]:
    remove_db(db)
    con = duckdb.connect(str(db))
    try:
        con.execute(summary_ddl())
        t0 = time.perf_counter()
        if frame is not None:
            con.register("bench_src", frame)
            con.execute(f"INSERT INTO {SUMMARY_TABLE} SELECT * FROM bench_src")
        else:
            assert parquet is not None
            con.execute(f"INSERT INTO {SUMMARY_TABLE} SELECT * FROM read_parquet({_lit(parquet)})")
        con.execute("CHECKPOINT")
        seconds = time.perf_counter() - t0
        assert con.sql(f"SELECT count(*) FROM {SUMMARY_TABLE}").fetchall()[0][0] == n
    finally:
        con.close()
        remove_db(db)
    return {"seconds": seconds}


# ---- the run ---------------------------------------------------------------------------------------

Method = Callable[[], dict[str, float]]


def _paired(pairs: dict[str, tuple[Method, Method]], repeat: int, warmup: int,
            log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Run every (ours, baseline) pair ``warmup + repeat`` times, side by side; the figures of each pair."""
    samples: dict[str, tuple[list[dict[str, float]], list[dict[str, float]]]] = {k: ([], []) for k in pairs}
    for r in range(warmup + repeat):
        for name, (ours, base) in pairs.items():
            first, second = (ours, base) if r % 2 == 0 else (base, ours)
            a, b = first(), second()
            o, s = (a, b) if r % 2 == 0 else (b, a)
            tag = "warm-up" if r < warmup else f"repeat {r - warmup + 1}/{repeat}"
            cpu = (f" (CPU {o['cpu_s']:.2f} s, {s['cpu_s']:.2f} s, ratio {o['cpu_s'] / s['cpu_s']:.2f})"
                   if "cpu_s" in o else "")
            log(f"  {name} {tag}: ours {o['seconds']:.2f} s, baseline {s['seconds']:.2f} s, "
                f"ratio {o['seconds'] / s['seconds']:.2f}{cpu}; load avg {os.getloadavg()[0]:.1f}")
            if r >= warmup:
                samples[name][0].append(o)
                samples[name][1].append(s)
    out: dict[str, dict[str, Any]] = {}
    for name, (ours_s, base_s) in samples.items():
        o_secs = [s["seconds"] for s in ours_s]
        b_secs = [s["seconds"] for s in base_s]
        ratios = [o / b for o, b in zip(o_secs, b_secs, strict=True)]
        phase_keys = [k for k in ours_s[0] if k not in ("seconds", "cpu_s")]
        out[name] = {
            "ours_s": o_secs, "baseline_s": b_secs, "ratios": ratios,
            "ours_median_s": median(o_secs), "baseline_median_s": median(b_secs), "ratio": median(ratios),
            "phases_median_s": {k: median([s[k] for s in ours_s]) for k in phase_keys},
        }
        if "cpu_s" in ours_s[0]:
            o_cpu, b_cpu = [s["cpu_s"] for s in ours_s], [s["cpu_s"] for s in base_s]
            out[name].update({
                "ours_cpu_median_s": median(o_cpu), "baseline_cpu_median_s": median(b_cpu),
                "cpu_ratios": [o / b for o, b in zip(o_cpu, b_cpu, strict=True)],
            })
            out[name]["cpu_ratio"] = median(out[name]["cpu_ratios"])
    return out


def run(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    _install_phase_timers()
    sections = set(args.sections.split(","))
    tmp_parent = Path(args.tmp) if args.tmp else None
    figures: dict[str, Any] = {
        "repeat": args.repeat, "warmup": args.warmup, "threads": _threads(), "cpus": os.cpu_count(),
        "loadavg_1m_start": os.getloadavg()[0], "results": {}, "targets": {},
    }
    with _temp_dir(tmp_parent) as tmp:
        free_gb = shutil.disk_usage(tmp).free / 2**30
        figures["disk_free_gib_start"] = round(free_gb, 1)
        pairs: dict[str, tuple[Method, Method]] = {}
        if sections & {"parquet", "cli"}:
            n = args.cli_rows
            big = tmp / "cli.parquet"
            log(f"writing {n:,} rows to {big.name} ...")
            _write_parquet(big, n, seed=100)
            figures["cli_parquet_mib"] = round(big.stat().st_size / 2**20, 1)
            pairs["cli"] = (lambda: _cli_ours(big, tmp / "cli-ours.duckdb", n),
                            lambda: _cli_ctas(big, tmp / "cli-ctas.duckdb", n))
            figures["targets"]["cli"] = TARGET_CLI_RATIO
            if "parquet" in sections:
                pairs["inproc"] = (lambda: _store_ingest(tmp / "in-ours.duckdb", n, parquet=big),
                                   lambda: _ctas(big, tmp / "in-ctas.duckdb", n))
                figures["targets"]["inproc"] = TARGET_CLI_RATIO
        if "store" in sections:
            for kind in args.ids.split(","):
                random_ids = kind == "random"
                stored = tmp / f"stored-{kind}.duckdb"
                log(f"building the {args.stored_rows:,}-row store ({kind} ids) ...")
                figures[f"build_{kind}_s"] = _build_store(stored, args.stored_rows, random_ids=random_ids)
                figures[f"stored_{kind}_mib"] = round(stored.stat().st_size / 2**20, 1)
                new = tmp / f"new-{kind}.parquet"
                _write_parquet(new, args.new_rows, seed=0, random_ids=random_ids)
                name = f"store-{kind}"
                pairs[name] = (
                    lambda new=new, stored=stored: _store_ingest(tmp / "full.duckdb", args.new_rows, parquet=new,
                                                                 copy_of=stored),
                    lambda new=new: _store_ingest(tmp / "empty.duckdb", args.new_rows, parquet=new),
                )
                figures["targets"][name] = TARGET_STORE_RATIO
        if "throughput" in sections:
            rows = args.rows
            data = synthetic_summaries(rows, args.seed)
            small = tmp / "throughput.parquet"
            pq.write_table(data, small, row_group_size=PARQUET_ROW_GROUP)
            pairs["arrow"] = (lambda: _store_ingest(tmp / "t-ours.duckdb", rows, frame=data),
                              lambda: _bare(tmp / "t-bare.duckdb", rows, frame=data))
            pairs["parquet"] = (lambda: _store_ingest(tmp / "t-ours.duckdb", rows, parquet=small),
                                lambda: _bare(tmp / "t-bare.duckdb", rows, parquet=small))
            figures["targets"].update({"arrow": TARGET_RATIO, "parquet": TARGET_RATIO})
        log(f"timing {', '.join(pairs)} ({args.warmup} warm-up + {args.repeat} repeats) ...")
        figures["results"] = _paired(pairs, args.repeat, args.warmup, log)
        figures["disk_free_gib_min"] = round(min(free_gb, shutil.disk_usage(tmp).free / 2**30), 1)
    figures["loadavg_1m_end"] = os.getloadavg()[0]
    figures["args"] = vars(args)
    for name, res in figures["results"].items():
        res["pass"] = res["ratio"] <= figures["targets"][name]
        if name in ("arrow", "parquet"):
            res["rows_per_s"] = args.rows / res["ours_median_s"]
            res["pass"] = res["pass"] and res["rows_per_s"] >= TARGET_ROWS_PER_S
    return figures


def _threads() -> int:
    return int(duckdb.connect().sql("SELECT current_setting('threads')").fetchall()[0][0])


def render(f: dict[str, Any]) -> str:
    a = f["args"]
    labels = {
        "cli": (f"`llmslo ingest` {a['cli_rows']:,}-row Parquet, process",
                "`python -c` CREATE TABLE AS SELECT * FROM read_parquet + CHECKPOINT"),
        "inproc": (f"Store.ingest_files {a['cli_rows']:,}-row Parquet, in-process",
                   "CREATE TABLE AS SELECT * FROM read_parquet + CHECKPOINT, in-process"),
        "store-sequential": (f"{a['new_rows']:,} new rows into a {a['stored_rows']:,}-row store, sequential ids",
                             "the same rows into an empty store"),
        "store-random": (f"{a['new_rows']:,} new rows into a {a['stored_rows']:,}-row store, random (md5) ids",
                         "the same rows into an empty store"),
        "arrow": (f"Store.ingest_frame {a['rows']:,} rows (validated)", "bare INSERT ... SELECT * FROM arrow"),
        "parquet": (f"Store.ingest_files {a['rows']:,} rows (validated)",
                    "bare INSERT ... SELECT * FROM read_parquet"),
    }
    rows = []
    for name, res in f["results"].items():
        ours, base = labels[name]
        target = f"<= {f['targets'][name]:g}x"
        if name in ("arrow", "parquet"):
            target += f", >= {TARGET_ROWS_PER_S / 1e6:g}M rows/s ({res['rows_per_s'] / 1e6:.2f}M)"
        verdict = "PASS" if res["pass"] else "MISS"
        if name in ("arrow", "parquet"):
            verdict = (f"{'PASS' if res['ratio'] <= f['targets'][name] else 'MISS'} ratio, "
                       f"{'PASS' if res['rows_per_s'] >= TARGET_ROWS_PER_S else 'MISS'} rows/s")
        rows.append([ours, res["ours_median_s"], base, res["baseline_median_s"], f"{res['ratio']:.2f}x",
                     spread(res["ratios"]), target, verdict])
    head = (f"{f['repeat']} paired repeats (+{f['warmup']} warm-up), DuckDB threads={f['threads']}, "
            f"{f['cpus']} CPUs, load avg {f['loadavg_1m_start']:.1f} at start, {f['loadavg_1m_end']:.1f} at end; "
            f"free disk {f['disk_free_gib_start']} GiB at start\n"
            "median seconds; ratio = median of the per-repeat ratios ours/baseline (min..max of those ratios)")
    extra = []
    if "cli_parquet_mib" in f:
        extra.append(f"Parquet file of comparison 1: {f['cli_parquet_mib']} MiB")
    for kind in ("sequential", "random"):
        if f"build_{kind}_s" in f:
            extra.append(f"{kind}-id store: {f[f'stored_{kind}_mib']} MiB, built (not timed) in "
                         f"{f[f'build_{kind}_s']:.0f} s, copied (shutil.copy + fsync) before every timed run")
    out = [head, *extra, "",
           table(["figure (ours)", "median s", "baseline", "median s", "ratio", "ratios", "target", "pass"], rows),
           ""]
    for name, res in f["results"].items():
        if "cpu_ratio" in res:
            out += [f"{name}: CPU time (user + sys) of the processes, medians: ours {res['ours_cpu_median_s']:.2f} s, "
                    f"baseline {res['baseline_cpu_median_s']:.2f} s; ratio {res['cpu_ratio']:.2f}x "
                    f"({spread(res['cpu_ratios'])})", ""]
    phase_rows = []
    for name, res in f["results"].items():
        p = res["phases_median_s"]
        if "stage" in p:
            phase_rows.append([name, res["ours_median_s"], p["stage"], p["ids"], p["sync"], p["lookup"],
                               p["insert"], p["validate"], p["checkpoint"], p["other"]])
    if not phase_rows:
        return "\n".join(out)
    out += ["where the in-process llmslo time goes (median seconds per phase; ids = the scan of the input's ids "
            "and the duplicate check, sync = checking the id side tables, lookup = finding the ids already "
            "stored, insert = the chunked inserts with every row check, validate = the detailed validation "
            "(0 when every row is valid), other = mostly the COMMIT):",
            table(["figure", "total", "stage", "ids", "sync", "lookup", "insert", "validate", "checkpoint", "other"],
                  phase_rows)]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--cli-rows", type=int, default=10_000_000,
                        help="rows of the Parquet file of comparison 1 (default 10,000,000)")
    parser.add_argument("--stored-rows", type=int, default=30_000_000,
                        help="rows already in the large store of comparison 2 (default 30,000,000)")
    parser.add_argument("--new-rows", type=int, default=1_000_000,
                        help="new rows ingested in comparison 2 (default 1,000,000)")
    parser.add_argument("--ids", default="sequential,random",
                        help="id kinds of comparison 2: sequential, random or both (default both)")
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of comparison 3 (default 1,000,000)")
    parser.add_argument("--sections", default="parquet,store,throughput",
                        help="comparisons to run: parquet (1), store (2), throughput (3); default all; cli: the "
                             "processes of comparison 1 alone")
    parser.add_argument("--repeat", type=int, default=5, help="timed repeats of each pair (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs of each pair first (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tmp", default=None, help="folder for the temporary files (default: the system's)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args()
    if min(args.cli_rows, args.stored_rows, args.new_rows, args.rows, args.repeat) < 1 or args.warmup < 0:
        parser.error("row counts and --repeat must be >= 1, --warmup >= 0")
    if not set(args.ids.split(",")) <= {"sequential", "random"}:
        parser.error("--ids: sequential, random or sequential,random")
    if not set(args.sections.split(",")) <= {"parquet", "cli", "store", "throughput"}:
        parser.error("--sections: a comma-separated list of parquet, cli, store, throughput")

    def log(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    figures = run(args, log)
    print(json.dumps(figures, indent=2) if args.json else render(figures))


if __name__ == "__main__":
    main()
