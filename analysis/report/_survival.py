"""Censoring-aware (Kaplan–Meier) quantiles of a duration, per group, computed inside DuckDB.

Why: a request that ended without a first token after waiting ``w`` seconds has a TTFT of *at least*
``w``. It is right-censored, not missing (see "Survivor bias" in ``definitions.md``). Dropping it makes
the latency look better exactly when the system sheds its slowest requests; the Kaplan–Meier estimator
uses it.

Input. ``source_sql`` is a query (``SELECT …``, ``FROM …``, ``VALUES …``) or a table or view name,
read exactly once, that yields the group columns plus

* ``t``: DOUBLE, the time in **seconds** (finite, ``>= 0``, non-null), and
* ``event``: BOOLEAN, TRUE when the event was observed at ``t`` (e.g. the first token came ``t`` seconds
  after arrival), FALSE when the row is censored at ``t`` (it was still waiting when it ended at ``t``).

Definition. Within a group, let ``u`` range over the distinct times at which at least one event
happened; ``d_u`` is the number of events at ``u`` and ``n_u`` the number of rows with time ``>= u``
(rows censored at ``u`` are still at risk at ``u``: at a tie, events are counted before censorings,
the standard convention). The Kaplan–Meier survival function is::

    S(t) = Π_{u <= t} (1 - d_u / n_u)

and the KM q-quantile is the smallest event time ``t`` with ``S(t) <= 1 - q`` (compared with a
tolerance of ``1e-12`` so that float rounding cannot move the answer across an exact tie). When
``S`` never falls that low (censoring too heavy to bound the quantile) the quantile is NULL; the
caller can then report "at least ``max_censored_t``". With no censoring ``S(t) = 1 - F(t)`` for the
empirical CDF ``F``, and the KM quantile equals the inverse empirical CDF
(``numpy.quantile(x, q, method="inverted_cdf")``).

Computation (all in SQL; no row reaches Python). One hash aggregate reads the source once and keeps,
per group, the totals and the group's rows as a list sorted by time descending, so that a row's list
index is its descending rank ``a`` (rows at or after it in time; at a tie censorings sort first, which
puts events before censorings in time). Over the rows in time order the product telescopes::

    S after event row j = Π_{event rows i <= j} (a_i - 1) / a_i
                        = ((a_j - 1) / N) · Π_{censored rows i before j} a_i / (a_i - 1)

(``N`` rows in the group; tied events multiply out to ``(n_u - d_u) / n_u``). The censoring factor is
a window ``SUM`` of ``LN(a / (a - 1))`` over the censored rows only (each factor finite, ``a >= 2``;
no ``LN(0)``: ``d = n`` simply gives ``a_j - 1 = 0``). Between two censored rows it is constant, so
``S`` is linear in ``a`` there and the first event row with ``S <= 1 - q`` is found by arithmetic and
read from the sorted list by index. Without censoring the factor is exactly 1 and
``S = (a_j - 1) / N`` is one correctly rounded division, so the result is the inverse empirical CDF.
Cost: one sort of the rows per group plus a window over the censored rows; group keys are never sort
keys (long string keys make DuckDB's sorts slow).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from decimal import Decimal

import duckdb
import polars as pl

__all__ = ["KM_TOLERANCE", "km_quantiles", "km_quantiles_sql", "quantile_label"]

KM_TOLERANCE = 1e-12
"""Slack in ``S(t) <= 1 - q + KM_TOLERANCE``: absorbs float rounding of the survival product."""

_NAME = re.compile(r'(?:[A-Za-z_][A-Za-z0-9_]*|"(?:[^"]|"")+")(?:\.(?:[A-Za-z_][A-Za-z0-9_]*|"(?:[^"]|"")+"))*')
_RESERVED = frozenset({"t", "event", "n", "n_events", "n_censored", "max_censored_t"})


def quantile_label(q: float) -> str:
    """Column label of the quantile ``q`` (a fraction in (0, 1)): ``"p"`` + the decimal digits of ``q``.

    The digits after ``0.`` of the shortest decimal form of ``q``, padded with zeros to at least two:
    0.5 → ``p50``, 0.9 → ``p90``, 0.95 → ``p95``, 0.99 → ``p99``, 0.999 → ``p999``, 0.9999 → ``p9999``,
    0.05 → ``p05``, 0.001 → ``p001``. For the usual quantiles this is the percentage without its dot;
    unlike that rule it is one-to-one (0.999 → ``p999`` but 0.0999 → ``p0999``).

    Raises ``ValueError`` unless ``0 < q < 1``.
    """
    qf = float(q)
    if not (math.isfinite(qf) and 0.0 < qf < 1.0):
        raise ValueError(f"quantile must be strictly between 0 and 1, got {q!r}")
    text = format(Decimal(repr(qf)), "f")  # shortest round-trip decimal, never in exponent form
    digits = text.split(".", 1)[1].rstrip("0")
    return "p" + digits.ljust(2, "0")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _double(value: float) -> str:
    """An exact DOUBLE literal (parsed from the shortest round-trip string, not via DECIMAL)."""
    return f"CAST('{value!r}' AS DOUBLE)"


def _survival(a: str, n: str, ef: str) -> str:
    """S just after the event row of descending rank ``a`` (one expression, used everywhere)."""
    return f"((CAST(({a}) - 1 AS DOUBLE) / {n}) * {ef})"


def km_quantiles_sql(source_sql: str, group_cols: Sequence[str], quantiles: Sequence[float]) -> str:
    """SQL query computing Kaplan–Meier quantiles of ``t`` (seconds) per group of ``source_sql``.

    ``source_sql`` yields ``group_cols`` plus ``t`` (DOUBLE seconds, finite, ``>= 0``) and ``event``
    (BOOLEAN: TRUE observed at ``t``, FALSE right-censored at ``t``); see the module docstring for the
    estimator. ``source_sql`` is a query or a table/view name; it appears once in the SQL and is read
    once, so it may contain ``?`` parameters and need not be deterministic.

    The query returns one row per group, ordered by the group columns (exactly one row when
    ``group_cols`` is empty, even for an empty source), with columns:

    * the group columns (NULL is a group value like any other);
    * ``n`` (BIGINT rows), ``n_events`` (BIGINT), ``n_censored`` (BIGINT);
    * one DOUBLE column per quantile, named by :func:`quantile_label`, in seconds: the KM quantile,
      NULL when the survival curve never falls to ``1 - q``;
    * ``max_censored_t`` (DOUBLE seconds): the largest censored time, NULL when nothing is censored.

    Running it raises an error (DuckDB ``InvalidInputException``) if a ``t`` is null, negative or not
    finite, or an ``event`` is null. Raises ``ValueError`` for a quantile outside (0, 1), two quantiles
    with the same label, or a group column that is reserved (``t``, ``event``, an output name, or a
    name starting with ``_km_``) or repeated.
    """
    groups = list(group_cols)
    qs = [float(q) for q in quantiles]
    labels = [quantile_label(q) for q in qs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"duplicate quantiles: {list(quantiles)!r}")
    reserved = _RESERVED | set(labels)
    for g in groups:
        if g in reserved or g.startswith("_km_"):
            raise ValueError(f"group column name {g!r} is reserved")
    if len(set(groups)) != len(groups):
        raise ValueError(f"repeated group column: {groups!r}")

    source = source_sql.strip() if _NAME.fullmatch(source_sql.strip()) else f"({source_sql})"
    gq = [_quote(g) for g in groups]
    gsel = "".join(f"{g}, " for g in gq)
    group_by = f"GROUP BY {', '.join(gq)}" if gq else ""
    order_by = f"ORDER BY {', '.join(f'agg.{g}' for g in gq)}" if gq else ""
    message = "km_quantiles: every t must be finite, non-null and >= 0, and every event non-null"
    bad = "_km_t IS NULL OR NOT isfinite(_km_t) OR _km_t < 0 OR _km_e IS NULL"
    # One row per group: totals, and (only if quantiles are wanted) every row of the group as a list
    # sorted by time descending, so that the list index of a row is its descending rank a = number of
    # rows at or after it in time. At a tie, censorings come first in this order (events before
    # censorings in time order), so a row censored at t is still at risk for the events at t.
    rows_list = (
        ",\n      list(struct_pack(t := _km_t, e := _km_e) ORDER BY _km_t DESC, _km_e) AS _km_rows" if qs else ""
    )
    head = f"""WITH _km_agg AS MATERIALIZED (
  SELECT ROW_NUMBER() OVER () AS _km_gid, *
  FROM (
    SELECT {gsel}COUNT(*) AS _km_n,
      COUNT(*) FILTER (WHERE _km_e) AS _km_ne,
      COUNT(*) FILTER (WHERE NOT _km_e) AS _km_nc,
      MAX(_km_t) FILTER (WHERE NOT _km_e) AS _km_maxc,
      COALESCE(bool_or({bad}), FALSE) AS _km_bad{rows_list}
    FROM (
      SELECT {gsel}CAST(t AS DOUBLE) AS _km_t, CAST(event AS BOOLEAN) AS _km_e
      FROM {source} AS _km_source
    ) AS _km_typed
    {group_by}
  ) AS _km_grouped
)"""
    tail = f"""SELECT {"".join(f"agg.{g}, " for g in gq)}
  CASE WHEN agg._km_bad THEN error('{message}') ELSE agg._km_n END AS n,
  agg._km_ne AS n_events, agg._km_nc AS n_censored,"""
    if not qs:
        return f"""{head}
{tail}
  agg._km_maxc AS max_censored_t
FROM _km_agg AS agg
{order_by}"""

    # Row-level form of the product. Over the rows in time order, with a_i the descending rank,
    #   S after event row j = Π_{event rows i <= j} (a_i - 1) / a_i
    #                       = ((a_j - 1) / N) · Π_{censored rows i before j} a_i / (a_i - 1)
    # (tied events telescope into (n_u - d_u) / n_u). Between two consecutive censored rows the factor
    # E = Π a_i / (a_i - 1) is constant: the event rows there form a segment a in [lo, hi] on which S
    # is (a - 1) / N · E, so the first row with S <= 1 - q is found by arithmetic. Only the censored
    # rows (plus one sentinel per group at a = N + 1, which opens the first segment) need a window.
    thresholds = [_double((1.0 - q) + KM_TOLERANCE) for q in qs]
    picks = "".join(
        f""",
    arg_max(struct_pack(lo := _km_lo, hi := _km_hi, ef := _km_ef), _km_hi)
      FILTER (WHERE _km_lo <= _km_hi AND {_survival("_km_lo", "_km_n", "_km_ef")} <= {thr}) AS _km_s{i}"""
        for i, thr in enumerate(thresholds)
    )
    q_index = ", ".join(str(i) for i in range(len(qs)))
    q_thr = ", ".join(thresholds)
    q_pick = ", ".join(f"_km_s{i}" for i in range(len(qs)))
    quantile_out = "".join(
        f"\n  (agg._km_rows[tg._km_targets[{i + 1}]]).t AS {_quote(label)}," for i, label in enumerate(labels)
    )
    return f"""{head},
_km_cens AS (
  SELECT _km_gid, _km_n, _km_a,
    LEAD(_km_a, 1, 0) OVER (PARTITION BY _km_gid ORDER BY _km_a DESC) AS _km_next,
    SUM(CASE WHEN _km_a > 1 AND _km_a <= _km_n THEN LN(CAST(_km_a AS DOUBLE) / (_km_a - 1)) ELSE 0 END)
      OVER (PARTITION BY _km_gid ORDER BY _km_a DESC ROWS UNBOUNDED PRECEDING) AS _km_f
  FROM (
    SELECT _km_gid, _km_n, _km_a
    FROM (
      SELECT _km_gid, _km_n, UNNEST(_km_rows) AS _km_x, generate_subscripts(_km_rows, 1) AS _km_a
      FROM _km_agg
    ) AS _km_all
    WHERE NOT _km_x.e
    UNION ALL
    SELECT _km_gid, _km_n, _km_n + 1 AS _km_a FROM _km_agg
  ) AS _km_c
),
_km_pick AS (
  SELECT _km_gid, ANY_VALUE(_km_n) AS _km_n{picks}
  FROM (
    SELECT _km_gid, _km_n, _km_next + 1 AS _km_lo, _km_a - 1 AS _km_hi, EXP(_km_f) AS _km_ef FROM _km_cens
  ) AS _km_seg
  GROUP BY _km_gid
),
_km_guess AS (
  SELECT _km_gid, _km_q, n, thr, seg['lo'] AS lo, seg['hi'] AS hi, seg['ef'] AS ef,
    LEAST(GREATEST(CAST(FLOOR(thr * n / seg['ef']) AS BIGINT) + 1, seg['lo']), seg['hi']) AS c
  FROM (
    SELECT _km_gid, _km_n AS n,
      UNNEST([{q_index}]) AS _km_q, UNNEST([{q_thr}]) AS thr, UNNEST([{q_pick}]) AS seg
    FROM _km_pick
  ) AS _km_unpivot
),
_km_tg AS (
  SELECT _km_gid,
    list(
      CASE WHEN c < hi AND {_survival("c + 1", "n", "ef")} <= thr THEN c + 1
        WHEN {_survival("c", "n", "ef")} <= thr THEN c
        WHEN c > lo AND {_survival("c - 1", "n", "ef")} <= thr THEN c - 1
        ELSE lo END
      ORDER BY _km_q
    ) AS _km_targets
  FROM _km_guess
  GROUP BY _km_gid
)
{tail}{quantile_out}
  agg._km_maxc AS max_censored_t
FROM _km_agg AS agg LEFT JOIN _km_tg AS tg ON agg._km_gid = tg._km_gid
{order_by}"""


def km_quantiles(
    con: duckdb.DuckDBPyConnection,
    source_sql: str,
    group_cols: Sequence[str],
    quantiles: Sequence[float],
    params: Sequence[object] | None = None,
) -> pl.DataFrame:
    """Run :func:`km_quantiles_sql` on ``con`` and return its result as a polars frame.

    ``params`` are bound to the ``?`` placeholders of ``source_sql``. Times in and out are seconds.
    """
    query = km_quantiles_sql(source_sql, group_cols, quantiles)
    rel = con.sql(query, params=list(params)) if params is not None else con.sql(query)
    frame: pl.DataFrame = rel.pl()
    return frame
