"""Censoring-aware (Kaplan–Meier) quantiles of a duration, per group, computed inside DuckDB.

Why: a request that ended without a first token after waiting ``w`` seconds has a TTFT of *at least*
``w``. It is right-censored, not missing (see "Survivor bias" in ``definitions.md``). Dropping it makes
the latency look better exactly when the system sheds its slowest requests; the Kaplan–Meier estimator
uses it.

Input. ``source_sql`` is any SQL table expression (a table name, or a subquery without the
parentheses) that yields the group columns plus

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

Computation (all in SQL, no rows pulled into Python): rows are first aggregated to one row per
distinct ``(group, t)`` with counts ``d`` (events) and ``c`` (censorings); one window pass gives the
number at risk ``n``; a second gives the survival. The product is evaluated in a telescoped form that
is exact without censoring and never takes ``LN(0)``. With ``m_i = n_i - d_i`` (rows alive just after
``t_i``, including those censored at ``t_i``) and ``n_{i+1} = m_i - c_i``::

    S(t_j) = Π_{i<=j} m_i / n_i = (m_j / N) · Π_{i<j, c_i>0} m_i / (m_i - c_i)

where ``N`` is the group's row count; the remaining product (over censorings only, every factor
``> 1`` and finite) is a window ``SUM`` of logarithms. Without censoring it is exactly 1, so
``S(t_j) = m_j / N`` is one correctly rounded division; ``d = n`` simply gives ``m = 0``, ``S = 0``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import Decimal

import duckdb
import polars as pl

__all__ = ["KM_TOLERANCE", "km_quantiles", "km_quantiles_sql", "quantile_label"]

KM_TOLERANCE = 1e-12
"""Slack in ``S(t) <= 1 - q + KM_TOLERANCE``: absorbs float rounding of the survival product."""

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


def _null_safe_on(left: str, right: str, groups: Sequence[str]) -> str:
    return " AND ".join(f"{left}.{g} IS NOT DISTINCT FROM {right}.{g}" for g in groups) or "TRUE"


def _survival(a: str, n: str, ef: str) -> str:
    """S just after the event row with descending rank ``a`` (one expression, used everywhere)."""
    return f"((CAST({a} - 1 AS DOUBLE) / {n}) * {ef})"


def km_quantiles_sql(source_sql: str, group_cols: Sequence[str], quantiles: Sequence[float]) -> str:
    """SQL query computing Kaplan–Meier quantiles of ``t`` (seconds) per group of ``source_sql``.

    ``source_sql`` yields ``group_cols`` plus ``t`` (DOUBLE seconds, finite, ``>= 0``) and ``event``
    (BOOLEAN: TRUE observed at ``t``, FALSE right-censored at ``t``); see the module docstring for the
    estimator. It is inlined once as ``FROM (source_sql)``, so it may contain ``?`` parameters.

    The query returns one row per group, ordered by the group columns (exactly one row when
    ``group_cols`` is empty, even for an empty source), with columns:

    * the group columns (a NULL group value is a group of its own);
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

    gq = [_quote(g) for g in groups]

    def sel(alias: str = "") -> str:  # "g1, g2, " (possibly qualified), or ""
        prefix = f"{alias}." if alias else ""
        return "".join(f"{prefix}{g}, " for g in gq)

    part = f"PARTITION BY {', '.join(gq)} " if gq else ""
    group_by = f"GROUP BY {', '.join(gq)}" if gq else ""
    group_by_s = f"GROUP BY {', '.join(f's.{g}' for g in gq)}" if gq else ""
    order_by = f"ORDER BY {', '.join(f'tot.{g}' for g in gq)}" if gq else ""
    message = "km_quantiles: every t must be finite, non-null and >= 0, and every event non-null"

    # _km_w: every row with its descending rank a (a = rows at or after it in time order; at a tie,
    # events come before censorings, so a censored row at t is still at risk for the events at t).
    # _km_tot: per-group totals. Row-level form of the product: over rows in time order,
    # S after event row j = Π_{event rows i<=j} (a_i - 1) / a_i = ((a_j - 1) / N) · Π_{censored i<j} a_i/(a_i-1)
    # (ties of events telescope into (n_u - d_u) / n_u). Between two censored rows the censoring factor
    # E is constant, so each such segment of event rows is a linear piece of S and the first row with
    # S <= 1 - q is found by arithmetic; only the censored rows need a second window.
    head = f"""WITH _km_w AS MATERIALIZED (
  SELECT {sel()}_km_t, _km_e,
    ROW_NUMBER() OVER ({part}ORDER BY _km_t DESC, _km_e) AS _km_a
  FROM (
    SELECT {sel()}CAST(t AS DOUBLE) AS _km_t, CAST(event AS BOOLEAN) AS _km_e
    FROM ({source_sql}) AS _km_source
  ) AS _km_typed
),
_km_tot AS (
  SELECT {sel()}COUNT(*) AS _km_n,
    COUNT(*) FILTER (WHERE _km_e) AS _km_ne,
    COUNT(*) FILTER (WHERE NOT _km_e) AS _km_nc,
    MAX(_km_t) FILTER (WHERE NOT _km_e) AS _km_maxc,
    COALESCE(MAX(_km_a) FILTER (WHERE NOT _km_e), 0) AS _km_a1,
    COALESCE(bool_or(_km_t IS NULL OR NOT isfinite(_km_t) OR _km_t < 0 OR _km_e IS NULL), FALSE) AS _km_bad
  FROM _km_w
  {group_by}
)"""
    if not qs:
        return f"""{head}
SELECT {sel("tot")}
  CASE WHEN tot._km_bad THEN error('{message}') ELSE tot._km_n END AS n,
  tot._km_ne AS n_events, tot._km_nc AS n_censored, tot._km_maxc AS max_censored_t
FROM _km_tot AS tot
{order_by}"""

    thresholds = [_double((1.0 - q) + KM_TOLERANCE) for q in qs]
    picks = "".join(
        f""",
    arg_max(struct_pack(lo := s._km_lo, hi := s._km_hi, ef := s._km_ef), s._km_hi)
      FILTER (WHERE s._km_lo <= s._km_hi AND {_survival("s._km_lo", "tot._km_n", "s._km_ef")} <= {thr})
      AS _km_s{i}"""
        for i, thr in enumerate(thresholds)
    )
    targets = "\n  UNION ALL\n".join(
        f"""  SELECT {sel()}{i} AS _km_q,
    CASE WHEN c < hi AND {_survival("c + 1", "n", "ef")} <= {thr} THEN c + 1
      WHEN {_survival("c", "n", "ef")} <= {thr} THEN c
      WHEN c > lo AND {_survival("c - 1", "n", "ef")} <= {thr} THEN c - 1
      ELSE lo END AS _km_a
  FROM (
    SELECT {sel()}n, lo, hi, ef,
      LEAST(GREATEST(CAST(FLOOR({thr} * n / ef) AS BIGINT) + 1, lo), hi) AS c
    FROM (
      SELECT {sel()}_km_n AS n, _km_s{i}['lo'] AS lo, _km_s{i}['hi'] AS hi, _km_s{i}['ef'] AS ef
      FROM _km_pick WHERE _km_s{i} IS NOT NULL
    ) AS _km_p
  ) AS _km_c"""
        for i, thr in enumerate(thresholds)
    )
    quantile_cols = "".join(
        f"{',' if i else ''}\n    MIN(_km_t) FILTER (WHERE _km_q = {i}) AS {_quote(label)}"
        for i, label in enumerate(labels)
    )
    quantile_out = "".join(f"qs.{_quote(label)}, " for label in labels)
    return f"""{head},
_km_cens AS (
  SELECT {sel()}_km_a,
    LEAD(_km_a, 1, 0) OVER ({part}ORDER BY _km_a DESC) AS _km_next,
    SUM(CASE WHEN _km_a > 1 THEN LN(CAST(_km_a AS DOUBLE) / (_km_a - 1)) ELSE 0 END)
      OVER ({part}ORDER BY _km_a DESC ROWS UNBOUNDED PRECEDING) AS _km_f
  FROM _km_w
  WHERE NOT _km_e
),
_km_seg AS (
  SELECT {sel()}_km_next + 1 AS _km_lo, _km_a - 1 AS _km_hi, EXP(_km_f) AS _km_ef FROM _km_cens
  UNION ALL
  SELECT {sel()}_km_a1 + 1 AS _km_lo, _km_n AS _km_hi, CAST(1 AS DOUBLE) AS _km_ef FROM _km_tot
),
_km_pick AS (
  SELECT {sel("s")}ANY_VALUE(tot._km_n) AS _km_n{picks}
  FROM _km_seg AS s JOIN _km_tot AS tot ON {_null_safe_on("s", "tot", gq)}
  {group_by_s}
),
_km_target AS (
{targets}
),
_km_hit AS (
  SELECT {sel("p")}p._km_q, w._km_t
  FROM _km_target AS p JOIN _km_w AS w ON {_null_safe_on("p", "w", gq)} AND w._km_a = p._km_a
),
_km_qs AS (
  SELECT {sel()}{quantile_cols}
  FROM _km_hit
  {group_by}
)
SELECT {sel("tot")}
  CASE WHEN tot._km_bad THEN error('{message}') ELSE tot._km_n END AS n,
  tot._km_ne AS n_events, tot._km_nc AS n_censored,
  {quantile_out}tot._km_maxc AS max_censored_t
FROM _km_tot AS tot LEFT JOIN _km_qs AS qs ON {_null_safe_on("tot", "qs", gq)}
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
    return rel.pl()
