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


def km_quantiles_sql(source_sql: str, group_cols: Sequence[str], quantiles: Sequence[float]) -> str:
    """SQL query computing Kaplan–Meier quantiles of ``t`` (seconds) per group of ``source_sql``.

    ``source_sql`` yields ``group_cols`` plus ``t`` (DOUBLE seconds, finite, ``>= 0``) and ``event``
    (BOOLEAN: TRUE observed at ``t``, FALSE right-censored at ``t``); see the module docstring for the
    estimator. It is inlined as ``FROM (source_sql)``, so it may contain ``?`` parameters.

    The query returns one row per group, ordered by the group columns (exactly one row when
    ``group_cols`` is empty, even for an empty source), with columns:

    * the group columns;
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
    labels = [quantile_label(q) for q in quantiles]
    if len(set(labels)) != len(labels):
        raise ValueError(f"duplicate quantiles: {list(quantiles)!r}")
    reserved = _RESERVED | set(labels)
    for g in groups:
        if g in reserved or g.startswith("_km_"):
            raise ValueError(f"group column name {g!r} is reserved")
    if len(set(groups)) != len(groups):
        raise ValueError(f"repeated group column: {groups!r}")

    gq = [_quote(g) for g in groups]
    gsel = "".join(f"{g}, " for g in gq)
    part = f"PARTITION BY {', '.join(gq)} " if gq else ""
    order_by = f"ORDER BY {', '.join(gq)}" if gq else ""
    group_by_final = f"GROUP BY {', '.join(gq)}" if gq else ""
    ordered = f"{part}ORDER BY _km_t"

    quantile_cols = "".join(
        f",\n  MIN(_km_t) FILTER (WHERE _km_d > 0 AND _km_s <= {_double((1.0 - float(q)) + KM_TOLERANCE)})"
        f" AS {_quote(label)}"
        for q, label in zip(quantiles, labels, strict=True)
    )
    bad = "_km_t IS NULL OR NOT isfinite(_km_t) OR _km_t < 0 OR _km_cnt <> _km_d + _km_c"
    message = "km_quantiles: every t must be finite, non-null and >= 0, and every event non-null"

    return f"""WITH _km_agg AS (
  SELECT {gsel}CAST(t AS DOUBLE) AS _km_t,
    COUNT(*) AS _km_cnt,
    COUNT(*) FILTER (WHERE CAST(event AS BOOLEAN)) AS _km_d,
    COUNT(*) FILTER (WHERE NOT CAST(event AS BOOLEAN)) AS _km_c
  FROM ({source_sql}) AS _km_source
  GROUP BY {gsel}_km_t
),
_km_risk AS (
  SELECT *,
    SUM(_km_cnt) OVER ({part}) AS _km_total,
    SUM(_km_cnt) OVER ({ordered} ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS _km_before
  FROM _km_agg
),
_km_alive AS (
  SELECT *,
    _km_total - COALESCE(_km_before, 0) - _km_d AS _km_m
  FROM _km_risk
),
_km_surv AS (
  SELECT *,
    (CAST(_km_m AS DOUBLE) / _km_total) * EXP(COALESCE(SUM(
      CASE WHEN _km_c > 0 AND _km_m > _km_c THEN LN(CAST(_km_m AS DOUBLE) / (_km_m - _km_c)) ELSE 0 END
    ) OVER ({ordered} ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)) AS _km_s
  FROM _km_alive
)
SELECT {gsel}
  CASE WHEN bool_or({bad}) THEN error('{message}')
    ELSE CAST(COALESCE(SUM(_km_cnt), 0) AS BIGINT) END AS n,
  CAST(COALESCE(SUM(_km_d), 0) AS BIGINT) AS n_events,
  CAST(COALESCE(SUM(_km_c), 0) AS BIGINT) AS n_censored{quantile_cols},
  MAX(_km_t) FILTER (WHERE _km_c > 0) AS max_censored_t
FROM _km_surv
{group_by_final}
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
