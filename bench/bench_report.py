"""Report speed: ``llmslo report`` as a process vs the bare DuckDB query as a process, same figures.

A store of ``--rows`` synthetic summaries (default 10,000,000) is built once (``Store.open`` for the
schema, then a bare ``INSERT INTO request_summaries SELECT * FROM <arrow batch>`` per generated batch of
1,000,000 rows; not timed), in a temporary directory or at ``--db`` (kept, and reused when it exists).

The figure (process start included on both sides, ``--repeat`` paired repeats, default 5, side by side,
order alternating):

(a) ``python -m llmslo.cli report --db DB --by model,finish_reason --json`` (stdout to a file), and
(b) ``python -c <open DB read-only with duckdb, run bare_main_sql(), fetchall()>``: the bare main
    aggregate, hand-written: one ``GROUP BY model, finish_reason`` with attempted, good, good generated
    tokens, one-token replies, count per finish reason, token sums and waste, and for ttft_s, tpot
    (derived), e2e_s, queue_s, client_ttft_s: count, avg, ``quantile_cont(x, [.5, .9, .95, .99])``, max
    and one ``count_if(x <= bound)`` per bucket bound; success-only TTFT count and quantiles (see
    :func:`bare_main_sql`). It computes no Kaplan–Meier and no span; the report does both.

Each process runs under a small runner (:data:`RUNNER`, the same on both sides) that writes its own peak
resident set size at exit (``VmHWM`` from ``/proc/self/status``; ``ru_maxrss`` is wrong here, see
``_util.peak_rss_mb``). Printed: the median wall time and median peak RSS of each, the ratios of the
medians, and the start-up alone (``python -m llmslo.cli --version``; the CLI on an empty store, i.e.
start-up plus the report's imports and queries on nothing; ``python -c 'import duckdb; connect'``).
Targets: report/bare <= 1.5x in time and in peak RSS.

Then, in this process (not part of the figure): ``build_report`` once per ``--inproc-repeat`` next to the
bare SQL on the same connection (``bare_main_sql`` plus the span query, the ``count(itl_s)`` check and a
hand-written row-level Kaplan–Meier query, :func:`bare_km_sql`), each query timed, for the table of where
the time goes; and pandas (``--pandas-repeat`` runs, default 1; 0 skips it): the needed columns loaded
once into a DataFrame (``con.sql(...).df()``, NOT timed), then the timed computation derives tpot and
good, ``groupby(["model", "finish_reason"])`` with count/mean/max, ``quantile([.5, .9, .95, .99])``
(linear, as quantile_cont), bucket counts, goodput, token sums, success-only TTFT quantiles, and
Kaplan–Meier per group with numpy (timed separately too).

Before the figures are trusted, the numbers of the CLI's JSON (from the first timed run) and of the
in-process report are checked against the bare SQL's, and against pandas' when it runs (counts and
token sums exactly, quantiles and maxima within 1e-9 s, means and rates within 1e-9 relative); the
script exits 1 on a difference.

The bare SQL is written the way one writes it for speed in DuckDB 2.0: ``count_if(cond)`` rather than
``count(*) FILTER (WHERE cond)`` (3x faster here for ~70 bucket counts), and the KM windows partitioned
by an integer group id rather than the VARCHAR group columns (several times faster).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd

from llmslo.analysis import GoodputPolicy, ReportSpec, Store, build_report
from llmslo.analysis.store._schema import SUMMARY_TABLE
from llmslo.bench._data import synthetic_batches, synthetic_summaries
from llmslo.bench._util import median, table, temp_dir
from llmslo.telemetry import DEFAULT_BUCKETS_S, FINISH_REASONS

KEYS: tuple[str, str] = ("model", "finish_reason")
QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.95, 0.99)
SURVIVOR_QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99)
KM_TOLERANCE = 1e-12
INTERVALS: tuple[str, ...] = ("ttft_s", "tpot_s", "e2e_s", "queue_s", "client_ttft_s")
TOKENS: tuple[str, ...] = ("prompt_tokens", "proposed_tokens", "generated_tokens", "sent_tokens")
TARGET_RATIO_BARE = 1.5
"""Report process / bare-query process, wall time (medians), start-up included on both sides."""
TARGET_RATIO_RSS = 1.5
"""Report process / bare-query process, peak RSS (medians of VmHWM)."""
QUANTILE_ABS_TOL = 1e-9
REL_TOL = 1e-9
BATCH_ROWS = 1_000_000

Flat = dict[str, Any]
"""One group's figures flattened to ``name -> value`` (the unit of comparison)."""
Figures = dict[tuple[str, str], Flat]


def _label(q: float) -> str:
    return "p" + repr(q).split(".", 1)[1].ljust(2, "0")


def _policy() -> GoodputPolicy:
    policy = GoodputPolicy()
    if policy.ttft_s is None or policy.tpot_s is None or policy.e2e_s is not None \
            or not policy.one_token_passes_tpot or policy.window_s is not None:
        raise SystemExit("the default GoodputPolicy changed shape: update the hand-written baselines")
    return policy


def _bounds(policy: GoodputPolicy) -> dict[str, tuple[float, ...]]:
    """Bucket bounds per interval: the default bounds plus the policy threshold (definitions)."""
    extra = {"ttft_s": policy.ttft_s, "tpot_s": policy.tpot_s}
    out = {}
    for name in INTERVALS:
        bounds = set(DEFAULT_BUCKETS_S[name])
        if extra.get(name) is not None:
            bounds.add(float(extra[name]))  # type: ignore[arg-type]
        out[name] = tuple(sorted(bounds))
    return out


# ---- (a) the report ---------------------------------------------------------------------------------


class _TimedRelation:
    """Forwards to a DuckDB relation; records the time from ``con.sql`` to the end of its fetch."""

    _FETCH = frozenset({"fetchall", "fetchone", "fetchmany", "pl", "df", "arrow", "fetchnumpy",
                        "fetch_arrow_table", "to_arrow_table", "fetchdf"})

    def __init__(self, rel: Any, sql: str, log: list[tuple[str, float]]) -> None:
        self._rel, self._sql, self._log, self._t0 = rel, sql, log, time.perf_counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._rel, name)
        if name not in self._FETCH:
            return attr

        def fetch(*args: Any, **kwargs: Any) -> Any:
            out = attr(*args, **kwargs)
            self._log.append((_classify(self._sql), time.perf_counter() - self._t0))
            return out

        return fetch


class _TimedConnection:
    """Forwards to a DuckDB connection, timing every query made through ``sql`` (per-query profile)."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self._con = con
        self.log: list[tuple[str, float]] = []

    def sql(self, query: str, *args: Any, **kwargs: Any) -> _TimedRelation:
        return _TimedRelation(self._con.sql(query, *args, **kwargs), query, self.log)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)


def _classify(sql: str) -> str:
    s = sql.lower()
    if "_km_" in s:
        return "km"
    if "unnest(itl_s)" in s:
        return "itl"
    if s.startswith("select exists"):
        return "presence"
    if "count(itl_s)" in s:
        return "itl_check"
    if "min(arrival_unix_s)" in s and "quantile" not in s:
        return "span"
    if "quantile_cont" in s:
        return "main"
    return "other"


def run_report(con: duckdb.DuckDBPyConnection) -> tuple[dict[str, Any], dict[str, float]]:
    """The report's JSON form (``Report.to_dict()``, as ``--json`` prints it), with seconds per query kind."""
    timed = _TimedConnection(con)
    report = build_report(timed, ReportSpec(_policy(), by=KEYS))  # type: ignore[arg-type]
    steps: dict[str, float] = {}
    for kind, seconds in timed.log:
        steps[kind] = steps.get(kind, 0.0) + seconds
    return report.to_dict(), steps


def flatten_report(report: dict[str, Any]) -> tuple[Figures, float | None]:
    out: Figures = {}
    for g in report["groups"]:
        flat: Flat = {
            k: g[k] for k in ("attempted", "good", "in_flight", "one_token_replies", "good_one_token_replies",
                              "request_goodput_per_s", "token_goodput_per_s")
        }
        flat.update({f"n_{r}": v for r, v in g["finish_reasons"].items()})
        flat.update({f"tokens.{k}": v for k, v in g["tokens"].items() if not k.endswith("_per_s")})
        for name in (*INTERVALS, "itl_s"):
            d = g["latency"][name]
            flat[f"{name}.count"] = d["count"]
            if name == "itl_s":
                continue
            for k in ("mean", *(_label(q) for q in QUANTILES), "max"):
                flat[f"{name}.{k}"] = d[k]
            for i, b in enumerate(d["buckets"]):
                flat[f"{name}.le{i}"] = b["count"]
            flat[f"{name}.bounds"] = tuple(b["le"] for b in d["buckets"])
        so = g["survivor_bias"]["ttft_success_only"]
        km = g["survivor_bias"]["ttft_censoring_aware"]
        flat["so.count"] = so["count"]
        flat.update({f"so.{_label(q)}": so[_label(q)] for q in SURVIVOR_QUANTILES})
        flat.update({f"km.{k}": km[k] for k in ("count", "events", "censored")})
        flat.update({f"km.{_label(q)}": km.get(_label(q)) for q in SURVIVOR_QUANTILES})
        flat["km.at_least_s"] = km.get("at_least_s")
        out[(g["keys"]["model"], g["keys"]["finish_reason"])] = flat
    return out, report["rate_basis"]["seconds"]


# ---- (b) bare DuckDB SQL ----------------------------------------------------------------------------

SPAN_SQL = f"SELECT count(*), min(arrival_unix_s), max(arrival_unix_s + e2e_s) FROM {SUMMARY_TABLE}"
ITL_CHECK_SQL = f"SELECT count(itl_s) FROM {SUMMARY_TABLE}"


def bare_main_sql(policy: GoodputPolicy) -> str:
    """The main aggregate by hand, in the fast DuckDB style: ``count_if`` / ``CASE``, no ``FILTER``.

    ``count_if`` of only NULLs is NULL in DuckDB, hence the ``coalesce(..., 0)``.
    """
    success = ", ".join(f"'{r}'" for r in sorted(policy.success))
    qs = ", ".join(repr(q) for q in QUANTILES)
    sqs = ", ".join(repr(q) for q in SURVIVOR_QUANTILES)
    aggs = [
        "count(*) AS attempted",
        "coalesce(count_if(good), 0) AS good",
        "coalesce(sum(CASE WHEN good THEN generated_tokens END), 0) AS good_generated_tokens",
        "coalesce(count_if(good AND generated_tokens <= 1), 0) AS good_one_token_replies",
        "coalesce(count_if(generated_tokens = 1), 0) AS one_token_replies",
    ]
    aggs += [f"coalesce(count_if(finish_reason = '{r}'), 0) AS n_{r}" for r in FINISH_REASONS]
    aggs += [f"coalesce(sum({c}), 0) AS tok_{c}" for c in TOKENS]
    aggs.append("coalesce(sum(generated_tokens - sent_tokens), 0) AS tok_waste")
    for x, bounds in _bounds(policy).items():
        aggs += [f"count({x}) AS {x}_count", f"avg({x}) AS {x}_mean", f"quantile_cont({x}, [{qs}]) AS {x}_q",
                 f"max({x}) AS {x}_max"]
        aggs += [f"coalesce(count_if({x} <= CAST('{b!r}' AS DOUBLE)), 0) AS {x}_le{i}"
                 for i, b in enumerate(bounds)]
    aggs.append("count(so_ttft_s) AS so_count")
    aggs.append(f"quantile_cont(so_ttft_s, [{sqs}]) AS so_q")
    agg_sql = ",\n  ".join(aggs)
    return f"""SELECT model, finish_reason,
  {agg_sql}
FROM (
  SELECT model, finish_reason, ttft_s, e2e_s, queue_s, client_ttft_s, {", ".join(TOKENS)}, tpot_s,
    CASE WHEN finish_reason IN ({success}) THEN ttft_s END AS so_ttft_s,
    finish_reason IN ({success}) AND coalesce(ttft_s <= {policy.ttft_s!r}, FALSE)
      AND (generated_tokens <= 1 OR coalesce(tpot_s <= {policy.tpot_s!r}, FALSE)) AS good
  FROM (
    SELECT *,
      CASE WHEN generated_tokens > 1 THEN (last_token_s - ttft_s) / (generated_tokens - 1) END AS tpot_s
    FROM {SUMMARY_TABLE}
  )
)
GROUP BY model, finish_reason
ORDER BY model, finish_reason"""


def bare_km_sql() -> str:
    """Kaplan–Meier TTFT quantiles per (model, finish_reason), written by hand, row by row.

    Each admitted request is a row with t = coalesce(ttft_s, e2e_s) and event = ttft_s IS NOT NULL. Within
    a group of N rows, a = the row's rank from the latest time (ties: censored rows after the events at
    the same t, so they are still at risk). The survival just after event row j is
    S_j = ((a_j - 1) / N) * prod_{censored i before j} a_i / (a_i - 1) (the event factors (a - 1) / a
    telescope; exact without censoring); the q-quantile is the smallest event time with
    S <= 1 - q + 1e-12 (docs/definitions). Groups are numbered by an integer id before the windows:
    partitioning and ordering on the VARCHAR group columns is several times slower in DuckDB 2.0.
    """
    picks = ",\n    ".join(
        f"min(CASE WHEN e AND s <= CAST('{(1.0 - q) + KM_TOLERANCE!r}' AS DOUBLE) THEN t END) AS {_label(q)}"
        for q in SURVIVOR_QUANTILES
    )
    log_factor = "CASE WHEN NOT r.e AND r.a > 1 THEN ln(CAST(r.a AS DOUBLE) / (r.a - 1)) ELSE 0 END"
    return f"""WITH grp AS (
  SELECT model, finish_reason, row_number() OVER (ORDER BY model, finish_reason) AS gid
  FROM (SELECT DISTINCT model, finish_reason FROM {SUMMARY_TABLE} WHERE finish_reason <> 'rejected')
),
ranked AS (
  SELECT g.gid, coalesce(s.ttft_s, s.e2e_s) AS t, s.ttft_s IS NOT NULL AS e,
    row_number() OVER (
      PARTITION BY g.gid ORDER BY coalesce(s.ttft_s, s.e2e_s) DESC, s.ttft_s IS NOT NULL
    ) AS a
  FROM {SUMMARY_TABLE} AS s JOIN grp AS g USING (model, finish_reason)
  WHERE s.finish_reason <> 'rejected'
),
tot AS (
  SELECT gid, count(*) AS n, count_if(e) AS n_events, count_if(NOT e) AS n_censored,
    max(CASE WHEN NOT e THEN t END) AS max_censored_t
  FROM ranked GROUP BY gid
),
surv AS (
  SELECT r.gid, r.t, r.e, (CAST(r.a - 1 AS DOUBLE) / tot.n) * exp(coalesce(sum({log_factor})
    OVER (PARTITION BY r.gid ORDER BY r.a DESC ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)) AS s
  FROM ranked AS r JOIN tot USING (gid)
),
qs AS (
  SELECT gid,
    {picks}
  FROM surv GROUP BY gid
)
SELECT g.model, g.finish_reason, tot.n, coalesce(tot.n_events, 0) AS n_events,
  coalesce(tot.n_censored, 0) AS n_censored,
  {", ".join(f"qs.{_label(q)}" for q in SURVIVOR_QUANTILES)}, tot.max_censored_t
FROM grp AS g JOIN tot USING (gid) LEFT JOIN qs USING (gid)
ORDER BY g.model, g.finish_reason"""


def _named_rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    rel = con.sql(sql)
    names = list(rel.columns)
    return [dict(zip(names, r, strict=True)) for r in rel.fetchall()]


def run_bare(con: duckdb.DuckDBPyConnection) -> tuple[dict[str, Any], dict[str, float]]:
    """Every query of the baseline, timed one by one; returns the raw results and the step times."""
    policy = _policy()
    steps: dict[str, float] = {}
    out: dict[str, Any] = {}
    for kind, sql in (("span", SPAN_SQL), ("main", bare_main_sql(policy)), ("itl_check", ITL_CHECK_SQL),
                      ("km", bare_km_sql())):
        t0 = time.perf_counter()
        out[kind] = _named_rows(con, sql)
        steps[kind] = time.perf_counter() - t0
    return out, steps


def flatten_bare(raw: dict[str, Any]) -> tuple[Figures, float | None]:
    policy = _policy()
    span_row = raw["span"][0]
    values = list(span_row.values())
    seconds = float(values[2] - values[1]) if values[0] else None
    km = {(r["model"], r["finish_reason"]): r for r in raw["km"]}
    assert raw["itl_check"][0] and next(iter(raw["itl_check"][0].values())) == 0, "bench data has no itl_s"
    out: Figures = {}
    for r in raw["main"]:
        key = (r["model"], r["finish_reason"])
        flat: Flat = {
            "attempted": r["attempted"], "good": r["good"], "in_flight": 0,
            "one_token_replies": r["one_token_replies"],
            "good_one_token_replies": r["good_one_token_replies"],
            "request_goodput_per_s": r["good"] / seconds if seconds else None,
            "token_goodput_per_s": r["good_generated_tokens"] / seconds if seconds else None,
        }
        flat.update({f"n_{x}": r[f"n_{x}"] for x in FINISH_REASONS})
        flat.update({f"tokens.{c}": int(r[f"tok_{c}"]) for c in TOKENS})
        flat["tokens.backpressure_waste_tokens"] = int(r["tok_waste"])
        for x, bounds in _bounds(policy).items():
            flat[f"{x}.count"] = r[f"{x}_count"]
            flat[f"{x}.mean"] = r[f"{x}_mean"]
            qv = r[f"{x}_q"] or [None] * len(QUANTILES)
            flat.update({f"{x}.{_label(q)}": v for q, v in zip(QUANTILES, qv, strict=True)})
            flat[f"{x}.max"] = r[f"{x}_max"]
            for i in range(len(bounds)):
                flat[f"{x}.le{i}"] = r[f"{x}_le{i}"]
            flat[f"{x}.le{len(bounds)}"] = r[f"{x}_count"]
            flat[f"{x}.bounds"] = (*bounds, "+Inf")
        flat["itl_s.count"] = 0
        flat["so.count"] = r["so_count"]
        sq = r["so_q"] or [None] * len(SURVIVOR_QUANTILES)
        flat.update({f"so.{_label(q)}": v for q, v in zip(SURVIVOR_QUANTILES, sq, strict=True)})
        k = km.get(key)
        flat["km.count"] = int(k["n"]) if k else 0
        flat["km.events"] = int(k["n_events"]) if k else 0
        flat["km.censored"] = int(k["n_censored"]) if k else 0
        flat.update({f"km.{_label(q)}": (k[_label(q)] if k else None) for q in SURVIVOR_QUANTILES})
        flat["km.at_least_s"] = k["max_censored_t"] if k else None
        out[key] = flat
    return out, seconds


# ---- (c) pandas -------------------------------------------------------------------------------------

PANDAS_COLUMNS = ("model", "finish_reason", "arrival_unix_s", "ttft_s", "last_token_s", "e2e_s", "queue_s",
                  "client_ttft_s", *TOKENS)


def load_pandas(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    return con.sql(f"SELECT {', '.join(PANDAS_COLUMNS)} FROM {SUMMARY_TABLE}").df()


def _km_numpy(t: np.ndarray, event: np.ndarray) -> dict[str, Any]:
    """Kaplan–Meier TTFT quantiles of one group (same estimator and product form as the SQL)."""
    n = len(t)
    out: dict[str, Any] = {"km.count": n, "km.events": int(event.sum()), "km.censored": int(n - event.sum())}
    out["km.at_least_s"] = float(t[~event].max()) if out["km.censored"] else None
    if n == 0:
        out.update({f"km.{_label(q)}": None for q in SURVIVOR_QUANTILES})
        return out
    times, inverse = np.unique(t, return_inverse=True)
    d = np.bincount(inverse, weights=event, minlength=len(times)).astype(np.int64)
    c = np.bincount(inverse, minlength=len(times)).astype(np.int64) - d
    m = n - np.cumsum(d + c) + c
    with np.errstate(divide="ignore", invalid="ignore"):
        term = np.where((c > 0) & (m > c), np.log(m / np.maximum(m - c, 1)), 0.0)
    log_before = np.concatenate(([0.0], np.cumsum(term)[:-1]))
    s = (m / n) * np.exp(log_before)
    for q in SURVIVOR_QUANTILES:
        hit = np.flatnonzero((d > 0) & (s <= (1.0 - q) + KM_TOLERANCE))
        out[f"km.{_label(q)}"] = float(times[hit[0]]) if len(hit) else None
    return out


def run_pandas(df: pd.DataFrame, policy: GoodputPolicy) -> tuple[Figures, float | None, dict[str, float]]:
    """Every figure of the comparison from the loaded frame; times the KM part separately."""
    t0 = time.perf_counter()
    gen = df["generated_tokens"]
    tpot = ((df["last_token_s"] - df["ttft_s"]) / (gen - 1)).where(gen > 1)
    success = df["finish_reason"].isin(sorted(policy.success))
    good = success & (df["ttft_s"] <= policy.ttft_s) & ((gen <= 1) | (tpot <= policy.tpot_s))
    work = pd.DataFrame({
        "model": df["model"], "finish_reason": df["finish_reason"],
        "ttft_s": df["ttft_s"], "tpot_s": tpot, "e2e_s": df["e2e_s"], "queue_s": df["queue_s"],
        "client_ttft_s": df["client_ttft_s"], "good": good,
        "good_generated_tokens": gen.where(good, 0), "good_one_token_replies": good & (gen <= 1),
        "one_token_replies": gen == 1, "so_ttft": df["ttft_s"].where(success),
        **{f"tokens.{c}": df[c] for c in TOKENS},
        "tokens.backpressure_waste_tokens": gen - df["sent_tokens"],
    })
    g = work.groupby(list(KEYS), sort=True)
    sums = g[["good", "good_generated_tokens", "good_one_token_replies", "one_token_replies",
              *(f"tokens.{c}" for c in (*TOKENS, "backpressure_waste_tokens"))]].sum()
    sizes = g.size()
    stats = {x: g[x].agg(["count", "mean", "max"]) for x in INTERVALS}
    quants = {x: g[x].quantile(list(QUANTILES)).unstack() for x in INTERVALS}
    buckets = {}
    for x, bounds in _bounds(policy).items():
        flags = pd.DataFrame({f"le{i}": work[x] <= b for i, b in enumerate(bounds)})
        buckets[x] = flags.groupby([work["model"], work["finish_reason"]], sort=True).sum()
    so_count = g["so_ttft"].count()
    so_q = g["so_ttft"].quantile(list(SURVIVOR_QUANTILES)).unstack()
    span_s = float((df["arrival_unix_s"] + df["e2e_s"]).max() - df["arrival_unix_s"].min())
    t1 = time.perf_counter()
    admitted = df[df["finish_reason"] != "rejected"]
    km_t = admitted["ttft_s"].fillna(admitted["e2e_s"]).to_numpy()
    km_event = admitted["ttft_s"].notna().to_numpy()
    km: dict[tuple[str, str], dict[str, Any]] = {}
    for key, idx in admitted.groupby(list(KEYS), sort=True).indices.items():
        km[key] = _km_numpy(km_t[idx], km_event[idx])
    t2 = time.perf_counter()

    seconds = span_s if span_s > 0 else None
    out: Figures = {}
    for key in sizes.index:
        s = sums.loc[key]
        flat: Flat = {
            "attempted": int(sizes.loc[key]), "good": int(s["good"]), "in_flight": 0,
            "one_token_replies": int(s["one_token_replies"]),
            "good_one_token_replies": int(s["good_one_token_replies"]),
            "request_goodput_per_s": int(s["good"]) / seconds if seconds else None,
            "token_goodput_per_s": int(s["good_generated_tokens"]) / seconds if seconds else None,
        }
        flat.update({f"n_{r}": int(sizes.loc[key]) if key[1] == r else 0 for r in FINISH_REASONS})
        flat.update({f"tokens.{c}": int(s[f"tokens.{c}"]) for c in (*TOKENS, "backpressure_waste_tokens")})
        for x, bounds in _bounds(policy).items():
            st = stats[x].loc[key]
            count = int(st["count"])
            flat[f"{x}.count"] = count
            flat[f"{x}.mean"] = float(st["mean"]) if count else None
            flat.update({f"{x}.{_label(q)}": (float(quants[x].loc[key, q]) if count else None)
                         for q in QUANTILES})
            flat[f"{x}.max"] = float(st["max"]) if count else None
            for i in range(len(bounds)):
                flat[f"{x}.le{i}"] = int(buckets[x].loc[key, f"le{i}"])
            flat[f"{x}.le{len(bounds)}"] = count
            flat[f"{x}.bounds"] = (*bounds, "+Inf")
        flat["itl_s.count"] = 0
        flat["so.count"] = int(so_count.loc[key])
        flat.update({f"so.{_label(q)}": (float(so_q.loc[key, q]) if flat["so.count"] else None)
                     for q in SURVIVOR_QUANTILES})
        empty_km = {"km.count": 0, "km.events": 0, "km.censored": 0, "km.at_least_s": None,
                    **{f"km.{_label(q)}": None for q in SURVIVOR_QUANTILES}}
        flat.update(km.get(key, empty_km))
        out[key] = flat
    return out, seconds, {"latency_goodput": t1 - t0, "km": t2 - t1}


# ---- comparison -------------------------------------------------------------------------------------


def compare(ours: Figures, theirs: Figures, ours_s: float | None, theirs_s: float | None) -> list[str]:
    """Differences between two sets of figures (empty when they agree within the tolerances)."""
    problems: list[str] = []
    if (ours_s is None) != (theirs_s is None) or (ours_s and theirs_s and not math.isclose(
            ours_s, theirs_s, rel_tol=REL_TOL)):
        problems.append(f"rate basis seconds {ours_s} vs {theirs_s}")
    if set(ours) != set(theirs):
        problems.append(f"groups differ: {sorted(set(ours) ^ set(theirs))}")
    for key in sorted(set(ours) & set(theirs)):
        a, b = ours[key], theirs[key]
        for name in sorted(set(a) | set(b)):
            if name not in a or name not in b:
                problems.append(f"{key} {name}: present on one side only")
                continue
            x, y = a[name], b[name]
            if x is None or y is None:
                ok = x is None and y is None
            elif isinstance(x, tuple | int) and isinstance(y, tuple | int):
                ok = x == y  # bucket bounds, counts, token sums: exact
            elif name.endswith((".mean", "_per_s")):
                ok = math.isclose(float(x), float(y), rel_tol=REL_TOL)
            else:
                ok = abs(float(x) - float(y)) <= QUANTILE_ABS_TOL
            if not ok:
                problems.append(f"{key} {name}: {x!r} vs {y!r}")
    return problems


def _n_figures(figures: Figures) -> int:
    return sum(len(v) for v in figures.values())


# ---- store, child processes, driver -----------------------------------------------------------------


def build_store(path: Path, rows: int, seed: int) -> dict[str, float]:
    """A store of ``rows`` generated summaries, inserted batch by batch with a bare INSERT."""
    t_gen = t_ins = 0.0
    with Store.open(path) as store:
        for n, batch_seed in synthetic_batches(rows, BATCH_ROWS, seed):
            t0 = time.perf_counter()
            batch = synthetic_summaries(n, batch_seed)
            t1 = time.perf_counter()
            store.con.register("bench_batch", batch)
            store.con.execute(f"INSERT INTO {SUMMARY_TABLE} SELECT * FROM bench_batch")
            store.con.unregister("bench_batch")
            t_ins += time.perf_counter() - t1
            t_gen += t1 - t0
            del batch
        store.con.execute("CHECKPOINT")
        assert store.count() == rows
    return {"generate_s": t_gen, "insert_s": t_ins, "file_mib": path.stat().st_size / 2**20}


# ---- processes: the figure ---------------------------------------------------------------------------

RUNNER = r"""
import atexit, os, sys
def _write_peak():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                with open(os.environ["LLMSLO_BENCH_PEAK_FILE"], "w") as out:
                    out.write(line.split()[1])
atexit.register(_write_peak)
if sys.argv[1] == "-m":
    import runpy
    sys.argv = sys.argv[2:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    code = sys.argv[1]
    sys.argv = ["-c", *sys.argv[2:]]
    exec(compile(code, "<bench>", "exec"), {"__name__": "__main__"})
"""
"""``python -c RUNNER -m MODULE ARGS...`` runs ``python -m MODULE ARGS...``; ``python -c RUNNER CODE ARGS...``
runs ``python -c CODE ARGS...``. Either way the process writes its peak RSS (``VmHWM``, KiB) at exit to
the file named by ``$LLMSLO_BENCH_PEAK_FILE``."""

BARE_CODE = """
import sys, duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
with open(sys.argv[2]) as f:
    con.sql(f.read()).fetchall()
"""
"""The bare side: open the store read-only, run the SQL in the file ``argv[2]``, fetch every row."""

STARTUP_CODE = "import sys, duckdb; duckdb.connect(sys.argv[1], read_only=True)"


def report_command(db: Path) -> list[str]:
    """The report side, as the user runs it (wrapped by :data:`RUNNER`)."""
    return [sys.executable, "-c", RUNNER, "-m", "llmslo.cli", "report", "--db", str(db),
            "--by", ",".join(KEYS), "--json"]


def bare_command(db: Path, sql_file: Path) -> list[str]:
    return [sys.executable, "-c", RUNNER, BARE_CODE, str(db), str(sql_file)]


def run_process(cmd: list[str], tmp: Path, stdout: Path | None = None) -> dict[str, Any]:
    """Run ``cmd`` once (wrapped by ``RUNNER``): wall seconds, peak RSS in MiB, and whether it succeeded (with
    the last line of its error, and the end of its stderr, when it did not)."""
    peak_file = tmp / "peak.kib"
    peak_file.unlink(missing_ok=True)
    env = {**os.environ, "LLMSLO_BENCH_PEAK_FILE": str(peak_file)}
    with open(stdout or os.devnull, "w") as out:
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, text=True, env=env, check=False)
        seconds = time.perf_counter() - t0
    peak = int(peak_file.read_text()) / 1024.0 if peak_file.exists() else float("nan")
    error = None
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        error = next((line for line in reversed(lines) if "Error" in line or "error" in line), lines[-1] if lines
                     else f"exit {proc.returncode}")
    return {"seconds": seconds, "peak_rss_mb": peak, "ok": proc.returncode == 0, "error": error,
            "stderr": proc.stderr[-3000:] if error is not None else None}


def timed_process(cmd: list[str], tmp: Path, stdout: Path | None = None) -> dict[str, float]:
    """Run ``cmd`` once: wall seconds from start to exit (seen from here), peak RSS in MiB (its VmHWM); a
    failure stops the benchmark."""
    run = run_process(cmd, tmp, stdout)
    if not run["ok"]:
        raise SystemExit(f"{' '.join(cmd[:1] + cmd[3:])} failed:\n{run['stderr']}")
    return {"seconds": run["seconds"], "peak_rss_mb": run["peak_rss_mb"]}


def run_processes(db: Path, tmp: Path, repeat: int) -> tuple[dict[str, list[dict[str, float]]], dict[str, Any]]:
    """``repeat`` paired runs of (a) the CLI report and (b) the bare query, order alternating; then the
    start-up figures. Returns the runs per kind and the CLI's JSON of the first run."""
    sql_file = tmp / "bare_main.sql"
    sql_file.write_text(bare_main_sql(_policy()))
    empty = tmp / "empty.duckdb"
    if not empty.exists():
        Store.open(empty).close()
    out_json = tmp / "report.json"
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in ("report", "bare", "cli_version", "cli_empty",
                                                               "bare_startup")}
    first: dict[str, Any] | None = None
    for r in range(repeat):
        sides = [("report", report_command(db)), ("bare", bare_command(db, sql_file))]
        for kind, cmd in sides if r % 2 == 0 else sides[::-1]:
            runs[kind].append(timed_process(cmd, tmp, out_json if kind == "report" else None))
            if kind == "report" and first is None:
                first = json.loads(out_json.read_text())
    for _ in range(repeat):
        runs["cli_version"].append(timed_process([sys.executable, "-c", RUNNER, "-m", "llmslo.cli", "--version"],
                                                 tmp))
        runs["cli_empty"].append(timed_process(report_command(empty), tmp))
        runs["bare_startup"].append(timed_process([sys.executable, "-c", RUNNER, STARTUP_CODE, str(db)], tmp))
    assert first is not None
    return runs, first


# ---- store, driver ------------------------------------------------------------------------------------


def con_threads() -> int:
    return int(duckdb.connect().sql("SELECT current_setting('threads')").fetchall()[0][0])


def _med(runs: list[dict[str, float]], key: str) -> float:
    return median([x[key] for x in runs])


def run(rows: int, repeat: int, inproc_repeat: int, pandas_repeat: int, seed: int,
        db_path: Path | None) -> dict[str, Any]:
    policy = _policy()
    with temp_dir() as tmp:
        db = db_path or tmp / "report.duckdb"
        if db.exists():
            with Store.open(db, read_only=True) as store:
                rows = store.count()
            built: dict[str, Any] = {"reused": str(db)}
        else:
            t0 = time.perf_counter()
            built = build_store(db, rows, seed)
            built["total_s"] = time.perf_counter() - t0

        runs, cli_json = run_processes(db, tmp, repeat)

        store = Store.open(db, read_only=True)
        con = store.con
        inproc: dict[str, list[float]] = {"report": [], "bare": []}
        steps: dict[str, list[dict[str, float]]] = {"report": [], "bare": []}
        results: dict[str, Any] = {}
        for r in range(inproc_repeat):
            for kind in (("report", "bare") if r % 2 == 0 else ("bare", "report")):
                t = time.perf_counter()
                if kind == "report":
                    report, st = run_report(con)
                    results.setdefault("report", flatten_report(report))
                else:
                    raw, st = run_bare(con)
                    results.setdefault("bare", flatten_bare(raw))
                inproc[kind].append(time.perf_counter() - t)
                steps[kind].append(st)
        pandas_s: list[float] = []
        pandas_steps: list[dict[str, float]] = []
        load_s = None
        if pandas_repeat:
            t0 = time.perf_counter()
            frame = load_pandas(con)
            load_s = time.perf_counter() - t0
            for _ in range(pandas_repeat):
                t = time.perf_counter()
                figures, seconds, st = run_pandas(frame, policy)
                pandas_s.append(time.perf_counter() - t)
                pandas_steps.append(st)
                results.setdefault("pandas", (figures, seconds))
            del frame
        store.close()

    rep, rep_s = results["report"]
    bare, bare_s = results["bare"]
    cli, cli_s = flatten_report(cli_json)
    checks = {
        "cli_json_vs_bare": compare(cli, bare, cli_s, bare_s),
        "report_vs_bare": compare(rep, bare, rep_s, bare_s),
    }
    if pandas_repeat:
        checks["report_vs_pandas"] = compare(rep, results["pandas"][0], rep_s, results["pandas"][1])
    med = {k: {"seconds": _med(v, "seconds"), "peak_rss_mb": _med(v, "peak_rss_mb")} for k, v in runs.items()}
    ratio_s = med["report"]["seconds"] / med["bare"]["seconds"]
    ratio_rss = med["report"]["peak_rss_mb"] / med["bare"]["peak_rss_mb"]
    step_kinds = sorted({k for v in steps.values() for x in v for k in x})
    return {
        "rows": rows, "repeat": repeat, "inproc_repeat": inproc_repeat, "pandas_repeat": pandas_repeat,
        "seed": seed, "groups": len(rep), "threads": con_threads(), "loadavg_1m": os.getloadavg()[0],
        "store": built, "processes": runs, "median": med,
        "report_over_bare_seconds": ratio_s, "report_over_bare_peak_rss": ratio_rss,
        "inproc_seconds": inproc,
        "inproc_steps_median_s": {k: {s: median([x.get(s, 0.0) for x in v]) for s in step_kinds
                                      if any(s in x for x in v)} for k, v in steps.items()},
        "pandas_seconds": pandas_s, "pandas_load_s": load_s,
        "pandas_km_median_s": median([x["km"] for x in pandas_steps]) if pandas_steps else None,
        "verification": {"figures_per_method": _n_figures(rep),
                         **{k: {"equal": not v, "n_problems": len(v), "problems": v[:20]} for k, v in checks.items()}},
        "targets": {"report_over_bare_max": TARGET_RATIO_BARE, "peak_rss_ratio_max": TARGET_RATIO_RSS,
                    "meets_seconds": ratio_s <= TARGET_RATIO_BARE, "meets_rss": ratio_rss <= TARGET_RATIO_RSS},
    }


def _span(xs: list[float], digits: int) -> str:
    """``min..max`` with a fixed number of decimals (``_util.spread`` switches to exponents)."""
    return f"{min(xs):,.{digits}f}..{max(xs):,.{digits}f}" if xs else "-"


def _verdict(ok: bool | None) -> str:
    return "PASS" if ok else "MISS"


def render(f: dict[str, Any]) -> str:
    med, runs, t = f["median"], f["processes"], f["targets"]
    st = f["store"]
    built = (f"reused store {st['reused']}" if "reused" in st else
             f"store built in {st['total_s']:.1f} s (generate {st['generate_s']:.1f} s, bare insert "
             f"{st['insert_s']:.1f} s, {st['file_mib']:.0f} MiB)")
    out = [
        f"llmslo report over {f['rows']:,} summaries by model, finish_reason ({f['groups']} groups); "
        f"{f['repeat']} paired process runs, order alternating; DuckDB threads={f['threads']}, "
        f"load avg {f['loadavg_1m']:.1f}",
        built,
        "",
        "the figure: whole processes, start-up included (medians; ratio = ratio of the medians)",
        table(["figure", "report (CLI)", "baseline (bare query)", "ratio", "target", "result"], [
            ["wall time, s", med["report"]["seconds"], med["bare"]["seconds"],
             f"{f['report_over_bare_seconds']:.2f}x", f"<= {TARGET_RATIO_BARE}x", _verdict(t["meets_seconds"])],
            ["peak RSS (VmHWM), MiB", med["report"]["peak_rss_mb"], med["bare"]["peak_rss_mb"],
             f"{f['report_over_bare_peak_rss']:.2f}x", f"<= {TARGET_RATIO_RSS}x", _verdict(t["meets_rss"])],
        ]),
        "",
        "every run (s, MiB):",
        table(["process", "median s", "min..max s", "median peak MiB", "min..max MiB"], [
            [label, med[k]["seconds"], _span([x["seconds"] for x in runs[k]], 3), med[k]["peak_rss_mb"],
             _span([x["peak_rss_mb"] for x in runs[k]], 0)]
            for k, label in (("report", "llmslo report --by model,finish_reason --json"),
                             ("bare", "python -c <duckdb: bare main aggregate>"),
                             ("cli_version", "start-up: python -m llmslo.cli --version"),
                             ("cli_empty", "start-up + imports: llmslo report on an empty store"),
                             ("bare_startup", "start-up: python -c 'import duckdb; connect'"))
        ]),
        "",
        "in this process (not the figure), median s per query:",
    ]
    sm = f["inproc_steps_median_s"]
    kinds = [k for k in ("presence", "span", "main", "itl_check", "itl", "km", "other")
             if k in sm["report"] or k in sm["bare"]]
    rows: list[list[object]] = [[k, sm["report"].get(k), sm["bare"].get(k)] for k in kinds]
    rows.append(["total", median(f["inproc_seconds"]["report"]), median(f["inproc_seconds"]["bare"])])
    out.append(table(["query", "build_report", "bare SQL (main + row-level KM)"], rows))
    if f["pandas_repeat"]:
        ps = median(f["pandas_seconds"])
        out += ["", f"pandas (frame loaded in {f['pandas_load_s']:.1f} s, not timed): {ps:.1f} s incl. KM "
                f"{f['pandas_km_median_s']:.1f} s; pandas / in-process report = "
                f"{ps / median(f['inproc_seconds']['report']):.1f}x"]
    out.append("")
    v = f["verification"]
    for name in ("cli_json_vs_bare", "report_vs_bare", "report_vs_pandas"):
        if name not in v:
            continue
        c = v[name]
        state = "EQUAL" if c["equal"] else f"{c['n_problems']} DIFFERENCES"
        out.append(f"verification {name}: {state} ({f['groups']} groups, {v['figures_per_method']} figures; "
                   f"counts exact, quantiles within {QUANTILE_ABS_TOL:g} s, means/rates within {REL_TOL:g} rel)")
        out += [f"  {p}" for p in c["problems"]]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="summaries in the store (default 10M)")
    parser.add_argument("--repeat", type=int, default=5, help="paired process runs (default 5, at least 5 "
                        "for the figure)")
    parser.add_argument("--inproc-repeat", type=int, default=1,
                        help="in-process runs of build_report and the bare SQL (default 1)")
    parser.add_argument("--pandas-repeat", type=int, default=1, help="timed pandas runs (default 1; 0 skips)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--db", type=Path, help="store to use: built there (and kept) unless it exists")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if args.rows < 1 or args.repeat < 1 or args.inproc_repeat < 1 or args.pandas_repeat < 0:
        parser.error("--rows, --repeat and --inproc-repeat must be >= 1, --pandas-repeat >= 0")
    figures = run(args.rows, args.repeat, args.inproc_repeat, args.pandas_repeat, args.seed, args.db)
    print(json.dumps(figures, indent=2, default=str) if args.json else render(figures))
    if not all(c["equal"] for k, c in figures["verification"].items() if k != "figures_per_method"):
        sys.exit(1)


if __name__ == "__main__":
    main()
