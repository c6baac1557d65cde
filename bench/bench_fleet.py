"""Fleet scale: ``llmslo report`` over partitioned Parquet under a memory limit, on chdb, and as rows grow.

Data: ``--rows`` synthetic summaries (``_data.synthetic_summaries``, batches of 1,000,000; batch k arrives on
day k) written once as the sink writes them, hive-partitioned by UTC hour (``ParquetSummaryWriter``,
``date=…/hour=…``), into a temporary folder under ``--tmp`` (default /tmp), deleted at the end (not timed).
Every figure is whole processes (start-up included), their wall time and peak RSS (``VmHWM``, written at exit
by ``bench_report.RUNNER``), medians of ``--repeat`` paired runs, order alternating.

1. Out of core: ``llmslo report --source DIR --to T --memory-limit LIMIT --by model,finish_reason --json``
   over the first N rows (``--to`` prunes the later days' partitions: their files are never opened), beside
   the bare DuckDB query over exactly those files (``bench_report.bare_main_sql``: one aggregate with the same
   quantiles, means, bucket counts and goodput; no Kaplan–Meier, no span) run twice: under the same
   ``memory_limit`` and without one. DuckDB does not spill the values of an exact quantile: under the limit the
   bare query fails once they do not fit, while the report packs its exact quantiles into queries that fit
   half the limit (``holistic_budget_bytes``). Targets: the report completes; its peak RSS <= the limit +
   :data:`MARGIN_MIB`; its time <= 1.5x the bare query's (the one without a limit where the limited one
   fails).
2. Scaling: the same report at each of ``--sizes`` (default 1M, 10M and ``--rows``): time and peak RSS, and
   time per million rows (linear or better: it does not grow with N).
3. chdb: ``llmslo report --database clickhouse --url chdb://…`` over ``--chdb-rows`` (default 10M) beside
   ``llmslo report --db`` over a DuckDB store of the same rows (both built by a bare insert of the same Arrow
   batches, not timed).

Before the figures are trusted, the JSON reports of every source over the same rows (Parquet, DuckDB store,
chdb) are compared figure by figure (``bench_report.compare``: counts exact, quantiles within 1e-9 s, means
and rates within 1e-9); the script exits 1 on a difference.

Run: ``nice -n 19 .venv/bin/python -m llmslo.bench.bench_fleet --rows 10000000`` (the 100M figure:
``--rows 100000000 --big-repeat 3``; about 6 GB of Parquet).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from llmslo.analysis.databases import parse_memory_limit
from llmslo.analysis.store import SUMMARY_TABLE, ClickHouseStore, ParquetSummaryWriter, Store
from llmslo.bench._data import START_UNIX_S, synthetic_batches, synthetic_summaries
from llmslo.bench._util import median, table
from llmslo.bench.bench_report import RUNNER, _policy, bare_main_sql, compare, flatten_report, run_process

KEYS = "model,finish_reason"
BATCH_ROWS = 1_000_000
DAY_S = 86_400.0
TARGET_RATIO = 1.5
"""Report / bare query, wall time (medians), start-up included on both sides."""
MARGIN_MIB = 512
"""What the report process may hold beyond DuckDB's memory limit: the interpreter and its imports (duckdb,
pyarrow, polars, rich: ~250 MiB, the `cli_empty` row) and DuckDB's allocations outside its buffer manager."""

BARE_PARQUET = """
import sys, duckdb
files, limit, sql_file, spill = sys.argv[1:5]
config = {"preserve_insertion_order": False, "temp_directory": spill}
if limit != "none":
    config["memory_limit"] = limit
con = duckdb.connect(config=config)
con.execute(f"CREATE VIEW request_summaries AS SELECT * FROM read_parquet({open(files).read()}, "
            "hive_partitioning = false)")
con.sql(open(sql_file).read()).fetchall()
"""
"""The bare side over Parquet: a view over the listed files (argv[1] holds the SQL list), the memory limit of
argv[2] (``none``: DuckDB's default), the SQL of argv[3]; every row fetched."""


def cli(*args: str) -> list[str]:
    return [sys.executable, "-c", RUNNER, "-m", "llmslo.cli", *args]


# ---- data -------------------------------------------------------------------------------------------------


def write_parquet(folder: Path, rows: int, seed: int) -> dict[str, Any]:
    """``rows`` synthetic summaries as the sink writes them (hive-partitioned by hour), in batches of 1M."""
    t0 = time.perf_counter()
    writer = ParquetSummaryWriter(folder, rotate_rows=BATCH_ROWS)
    for n, batch_seed in synthetic_batches(rows, BATCH_ROWS, seed):
        writer.write_table(synthetic_summaries(n, batch_seed))
    writer.close()
    size = sum(f.stat().st_size for f in writer.files)
    return {"files": len(writer.files), "gib": size / 2**30, "seconds": time.perf_counter() - t0}


def files_before(folder: Path, to_unix_s: float) -> list[str]:
    """The files of the partitions before ``to_unix_s`` (a day boundary): exactly the rows arriving before it."""
    day = time.strftime("%Y-%m-%d", time.gmtime(to_unix_s))
    return sorted(str(f) for f in folder.rglob("*.parquet") if f.parent.parent.name.removeprefix("date=") < day)


def build_stores(db: Path, ch: Path, rows: int, seed: int) -> dict[str, float]:
    """A DuckDB store and a chdb store of the same ``rows`` (bare inserts of the same batches, not timed)."""
    t0 = time.perf_counter()
    with Store.open(db) as duck, ClickHouseStore.open(f"chdb://{ch}") as click:
        for n, batch_seed in synthetic_batches(rows, BATCH_ROWS, seed):
            batch = synthetic_summaries(n, batch_seed)
            duck.con.register("bench_batch", batch)
            duck.con.execute(f"INSERT INTO {SUMMARY_TABLE} SELECT * FROM bench_batch")
            duck.con.unregister("bench_batch")
            click.client.insert_arrow(SUMMARY_TABLE, batch)
        duck.con.execute("CHECKPOINT")
        assert duck.count() == click.count() == rows
    return {"seconds": time.perf_counter() - t0, "duckdb_mib": db.stat().st_size / 2**20,
            "chdb_mib": sum(f.stat().st_size for f in ch.rglob("*") if f.is_file()) / 2**20}


# ---- figures ----------------------------------------------------------------------------------------------


def _med(runs: list[dict[str, Any]], key: str) -> float:
    return median([r[key] for r in runs if r["ok"]])


def out_of_core(data: Path, tmp: Path, rows: int, limit: str, repeat: int) -> dict[str, Any]:
    """Figure 1 (and one row of figure 2) for the first ``rows`` rows."""
    to = START_UNIX_S + (rows // BATCH_ROWS) * DAY_S
    listed = tmp / f"files-{rows}.sql"
    listed.write_text("[" + ", ".join("'" + f.replace("'", "''") + "'" for f in files_before(data, to)) + "]")
    sql = tmp / "bare.sql"
    sql.write_text(bare_main_sql(_policy()))
    spill = tmp / "spill"
    spill.mkdir(exist_ok=True)
    out_json = tmp / f"report-{rows}.json"
    sides = {
        "report": cli("report", "--source", str(data), "--to", repr(to), "--memory-limit", limit, "--by", KEYS,
                      "--json", "--no-progress"),
        "bare_limited": [sys.executable, "-c", RUNNER, BARE_PARQUET, str(listed), limit, str(sql), str(spill)],
        "bare": [sys.executable, "-c", RUNNER, BARE_PARQUET, str(listed), "none", str(sql), str(spill)],
    }
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
    for r in range(repeat):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for kind in order:
            runs[kind].append(run_process(sides[kind], tmp, out_json if kind == "report" else None))
            print(f"  {rows:,} rows, {kind}: {runs[kind][-1]}", file=sys.stderr, flush=True)
    report_ok = all(x["ok"] for x in runs["report"])
    return {"rows": rows, "runs": runs, "report_ok": report_ok,
            "report_json": json.loads(out_json.read_text()) if report_ok else None}


def chdb_figure(db: Path, ch: Path, tmp: Path, repeat: int) -> dict[str, Any]:
    sides = {"duckdb": cli("report", "--db", str(db), "--by", KEYS, "--json", "--no-progress"),
             "chdb": cli("report", "--database", "clickhouse", "--url", f"chdb://{ch}", "--by", KEYS, "--json",
                         "--no-progress")}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
    outputs = {k: tmp / f"{k}.json" for k in sides}
    for r in range(repeat):
        for kind in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            runs[kind].append(run_process(sides[kind], tmp, outputs[kind]))
            print(f"  chdb figure, {kind}: {runs[kind][-1]}", file=sys.stderr, flush=True)
    return {"runs": runs, "json": {k: json.loads(p.read_text()) for k, p in outputs.items()
                                   if all(x["ok"] for x in runs[k])}}


def verify(reports: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """Each report against the first, figure by figure."""
    names = list(reports)
    base, base_s = flatten_report(reports[names[0]])
    out = {}
    for name in names[1:]:
        other, other_s = flatten_report(reports[name])
        out[f"{names[0]}_vs_{name}"] = compare(base, other, base_s, other_s)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    limit_bytes = parse_memory_limit(args.memory_limit)
    sizes = sorted({*(int(s) for s in args.sizes.split(",") if s), args.rows})
    if any(s % BATCH_ROWS or s > args.rows for s in sizes) or args.chdb_rows % BATCH_ROWS:
        raise SystemExit("--sizes and --chdb-rows must be multiples of 1,000,000, at most --rows")
    root = Path(tempfile.mkdtemp(prefix="llmslo-bench-fleet-", dir=args.tmp))
    try:
        data = root / "parquet"
        print(f"writing {args.rows:,} summaries under {data} ...", file=sys.stderr, flush=True)
        written = write_parquet(data, args.rows, args.seed)
        startup = [run_process(cli("--version"), root) for _ in range(args.repeat)]
        scaling = [out_of_core(data, root, n, args.memory_limit, args.repeat if n < 50_000_000 else args.big_repeat)
                   for n in sizes]
        chdb: dict[str, Any] = {}
        checks: dict[str, list[str]] = {}
        if args.chdb_rows:
            db, ch = root / "store.duckdb", root / "chdb"
            built = build_stores(db, ch, args.chdb_rows, args.seed)
            chdb = {"built": built, **chdb_figure(db, ch, root, args.repeat)}
            same = next((s for s in scaling if s["rows"] == args.chdb_rows and s["report_ok"]), None)
            reports = dict(chdb["json"])
            if same is not None:
                reports["parquet"] = same["report_json"]
            if len(reports) > 1:
                checks = verify(reports)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for s in scaling:
        s.pop("report_json", None)
    chdb.pop("json", None)
    return {"rows": args.rows, "memory_limit": args.memory_limit, "memory_limit_mib": limit_bytes / 2**20,
            "repeat": args.repeat, "written": written, "startup": startup, "scaling": scaling, "chdb": chdb,
            "verification": checks, "loadavg_1m": os.getloadavg()[0]}


def render(f: dict[str, Any]) -> str:
    limit_mib = f["memory_limit_mib"]
    w = f["written"]
    out = [f"synthetic summaries as the sink writes them: {w['files']} files, {w['gib']:.2f} GiB of Parquet, "
           f"written in {w['seconds']:.0f} s; load avg {f['loadavg_1m']:.1f}; start-up (llmslo --version) "
           f"{_med(f['startup'], 'seconds'):.2f} s, {_med(f['startup'], 'peak_rss_mb'):.0f} MiB", ""]
    rows: list[list[object]] = []
    for s in f["scaling"]:
        r, lim, bare = (s["runs"][k] for k in ("report", "bare_limited", "bare"))
        rep_s, bare_s = _med(r, "seconds"), _med(bare, "seconds")
        lim_txt = f"{_med(lim, 'seconds'):.1f} s" if all(x["ok"] for x in lim) else "fails: " + str(
            next(x["error"] for x in lim if not x["ok"]))[:60]
        rows.append([f"{s['rows']:,}", rep_s, _med(r, "peak_rss_mb"), rep_s / (s["rows"] / 1e6),
                     f"{rep_s / bare_s:.2f}x", bare_s, _med(bare, "peak_rss_mb"), lim_txt])
    out.append(f"1-2. llmslo report --source (hive Parquet) --memory-limit {f['memory_limit']} --by {KEYS}: "
               "whole processes, medians")
    out.append(table(["rows", "report s", "report peak MiB", "s per 1M rows", "report / bare", "bare s (no limit)",
                      "bare peak MiB", "bare under the limit"], rows))
    top = f["scaling"][-1]
    peak = _med(top["runs"]["report"], "peak_rss_mb")
    ratio = _med(top["runs"]["report"], "seconds") / _med(top["runs"]["bare"], "seconds")
    out += ["", f"targets at {top['rows']:,} rows: completes {'PASS' if top['report_ok'] else 'MISS'}; peak RSS "
            f"{peak:,.0f} MiB <= limit {limit_mib:,.0f} + {MARGIN_MIB} MiB: "
            f"{'PASS' if peak <= limit_mib + MARGIN_MIB else 'MISS'}; time {ratio:.2f}x the bare query <= "
            f"{TARGET_RATIO}x: {'PASS' if ratio <= TARGET_RATIO else 'MISS'}"]
    if f["chdb"]:
        c = f["chdb"]
        d, h = c["runs"]["duckdb"], c["runs"]["chdb"]
        b = c["built"]
        out += ["", f"3. the same report on chdb (embedded ClickHouse) and on a DuckDB store, same rows "
                f"(stores: DuckDB {b['duckdb_mib']:.0f} MiB, chdb {b['chdb_mib']:.0f} MiB)",
                table(["database", "s", "peak MiB"], [["duckdb (--db)", _med(d, "seconds"), _med(d, "peak_rss_mb")],
                                                   ["chdb (--database clickhouse)", _med(h, "seconds"),
                                                    _med(h, "peak_rss_mb")]])]
    for name, problems in f["verification"].items():
        out.append(f"verification {name}: {'EQUAL' if not problems else f'{len(problems)} DIFFERENCES'}")
        out += [f"  {p}" for p in problems[:20]]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="summaries written (default 10M)")
    parser.add_argument("--sizes", default="1000000,10000000", help="row counts of the scaling table (<= --rows)")
    parser.add_argument("--chdb-rows", type=int, default=10_000_000, help="rows of the chdb figure (0 skips it)")
    parser.add_argument("--memory-limit", default="4GB", help="the report's --memory-limit (default 4GB)")
    parser.add_argument("--repeat", type=int, default=3, help="paired runs per figure below 50M rows")
    parser.add_argument("--big-repeat", type=int, default=1,
                        help="paired runs per figure at 50M rows and more (3 at 100M: about 6 minutes)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tmp", default="/tmp", help="where the data is written (and deleted afterwards)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    figures = run(args)
    print(json.dumps(figures, indent=2, default=str) if args.json else render(figures))
    if any(figures["verification"].values()) or not figures["scaling"][-1]["report_ok"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
