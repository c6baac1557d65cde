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

Computation (all in SQL; no row reaches Python).

1. A group without a censored row needs no product at all: its KM q-quantile is the inverse empirical
   CDF, the order statistic ``x_(ceil(N q))`` of its ``N`` times. DuckDB's ``quantile_disc`` with
   DECIMAL fractions computes exactly that index in integer arithmetic. With the ``1e-12`` tolerance
   the KM rule picks the same order statistic as long as ``N · 10^s < 10^11`` where ``s`` is the number
   of decimals of ``q`` (then ``N q`` is either an integer or at least ``10^-s`` from the next one, far
   more than ``N · 1e-12``); :func:`inverse_cdf_max_n` is that bound. Such groups are answered by the
   grouping aggregate itself, without ranking their rows.
2. The other groups (censored rows, or too large for step 1) are numbered by an INTEGER id (DuckDB 2.0
   partitions a window about twice as fast by a 32-bit key as by a BIGINT, and several times faster
   than by text keys) and their rows ranked by one window sort,
   ``row_number() OVER (PARTITION BY id ORDER BY t DESC, event)``: the
   rank ``a`` of a row is the number of rows at or after it in time (at a tie censorings rank first,
   which puts events before censorings in time). Over the rows in time order the product telescopes::

       S after event row j = Π_{event rows i <= j} (a_i - 1) / a_i
                           = ((a_j - 1) / N) · Π_{censored rows i before j} a_i / (a_i - 1)

   (tied events multiply out to ``(n_u - d_u) / n_u``). The censoring factor is a window ``SUM`` of
   ``LN(a / (a - 1))`` over the censored rows only (each factor finite, ``a >= 2``; no ``LN(0)``:
   ``d = n`` simply gives ``a_j - 1 = 0``). Between two censored rows it is constant, so ``S`` is linear
   in ``a`` there and the first event row with ``S <= 1 - q`` is found by arithmetic; its time is read
   back by a join on ``(id, a)``. No per-group list is built, group keys are never sort keys, and the
   only sorts are the one ranking of those groups' rows and a smaller one over their censored rows.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import duckdb

from llmslo.analysis.databases._base import quantile_decimal

if TYPE_CHECKING:
    import polars as pl

__all__ = [
    "KM_TOLERANCE",
    "inverse_cdf_max_n",
    "km_quantiles",
    "km_quantiles_by_id_sql",
    "km_quantiles_sql",
    "quantile_decimal",
    "quantile_label",
]

KM_TOLERANCE = 1e-12
"""Slack in ``S(t) <= 1 - q + KM_TOLERANCE``: absorbs float rounding of the survival product."""
_TOLERANCE_DIGITS = 12
"""``KM_TOLERANCE == 10 ** -_TOLERANCE_DIGITS`` (used for the exact bound of :func:`inverse_cdf_max_n`)."""
_MAX_DECIMALS = 10
"""Quantiles with more decimals than this get no ``quantile_disc`` shortcut (every group goes through KM)."""

_NAME = re.compile(r'(?:[A-Za-z_][A-Za-z0-9_]*|"(?:[^"]|"")+")(?:\.(?:[A-Za-z_][A-Za-z0-9_]*|"(?:[^"]|"")+"))*')
_RESERVED = frozenset({"t", "event", "n", "n_events", "n_censored", "max_censored_t"})
_MESSAGE = "km_quantiles: every t must be finite, non-null and >= 0, and every event non-null"


@functools.lru_cache(maxsize=256)
def quantile_label(q: float) -> str:
    """Column label of the quantile ``q`` (a fraction in (0, 1)): ``"p"`` + the decimal digits of ``q``.

    The digits after ``0.`` of the shortest decimal form of ``q``, padded with zeros to at least two:
    0.5 → ``p50``, 0.9 → ``p90``, 0.95 → ``p95``, 0.99 → ``p99``, 0.999 → ``p999``, 0.9999 → ``p9999``,
    0.05 → ``p05``, 0.001 → ``p001``. For the usual quantiles this is the percentage without its dot;
    unlike that rule it is one-to-one (0.999 → ``p999`` but 0.0999 → ``p0999``).

    Raises ``ValueError`` unless ``0 < q < 1``.
    """
    digits = quantile_decimal(q).split(".", 1)[1]
    return "p" + digits.ljust(2, "0")


def inverse_cdf_max_n(quantiles: Sequence[float]) -> int:
    """The group size (rows) below which, without censoring, the KM quantile is ``quantile_disc``.

    For a group of ``N`` uncensored times the KM rule (smallest event time with
    ``S <= 1 - q + KM_TOLERANCE``, ``S = (a - 1) / N`` one correctly rounded division) and the exact
    inverse empirical CDF (``x_(ceil(N q))``, DuckDB's ``quantile_disc`` with a DECIMAL fraction) pick
    the same order statistic whenever ``N · 10^s · 10 <= 10^12`` (``s``: the decimals of ``q``; the
    factor 10 leaves room for the float rounding): a miss would need ``q - k / N`` in
    ``(0, KM_TOLERANCE]``, but it is either 0 or at least ``10^-s / N``. Returns ``10 ** (11 - s)`` for
    the largest ``s`` among ``quantiles``, or 0 (no shortcut) when a quantile has more than 10 decimals
    or there is none. Raises ``ValueError`` for a quantile outside (0, 1).
    """
    if not quantiles:
        return 0
    decimals = max(len(quantile_decimal(q).split(".", 1)[1]) for q in quantiles)
    if decimals > _MAX_DECIMALS:
        return 0
    return int(10 ** (_TOLERANCE_DIGITS - 1 - decimals))


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _double(value: float) -> str:
    """An exact DOUBLE literal (parsed from the shortest round-trip string, not via DECIMAL)."""
    return f"CAST('{value!r}' AS DOUBLE)"


def _survival(a: str, n: str, ef: str) -> str:
    """S just after the event row of descending rank ``a`` (one expression, used everywhere)."""
    return f"((CAST(({a}) - 1 AS DOUBLE) / {n}) * {ef})"


def _checked_labels(quantiles: Sequence[float]) -> tuple[list[float], list[str]]:
    qs = [float(q) for q in quantiles]
    labels = [quantile_label(q) for q in qs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"duplicate quantiles: {list(quantiles)!r}")
    return qs, labels


def _km_ctes(rows: str, qs: Sequence[float], labels: Sequence[str], *, success: bool = False) -> str:
    """CTEs (text after ``WITH``, ending with ``_km_est``) computing KM quantiles per integer group.

    ``rows`` names a relation with ``_km_gid`` (INTEGER group id: DuckDB 2.0 partitions a window about
    twice as fast by a 32-bit key as by a BIGINT), ``_km_t`` (DOUBLE seconds, valid) and
    ``_km_e`` (BOOLEAN event). ``_km_tot`` and ``_km_est`` have one row per id present there:
    ``_km_tot`` the totals (``_km_n`` rows, ``_km_ne`` events, ``_km_nc`` censored, ``_km_maxc`` the
    largest censored time), ``_km_est`` ``_km_gid`` and one DOUBLE column per label (NULL where the
    curve never falls to ``1 - q``). With ``success`` the relation also has ``_km_s`` (BOOLEAN: a successful
    request), and ``_km_cmp`` has, per id, the comparison of :func:`km_quantiles_by_id_sql`.
    """
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
    pivot = ",\n    ".join(
        f"max(CASE WHEN tg._km_q = {i} THEN r._km_t END) AS {_quote(label)}" for i, label in enumerate(labels)
    )
    compare = _success_ctes(qs, labels) if success else ""
    return f"""_km_rows AS MATERIALIZED (
  SELECT _km_gid, _km_t, _km_e,{" _km_s," if success else ""}
    row_number() OVER (PARTITION BY _km_gid ORDER BY _km_t DESC, _km_e) AS _km_a
  FROM {rows}
),
_km_tot AS (
  SELECT _km_gid, count(*) AS _km_n, count_if(_km_e) AS _km_ne, count_if(NOT _km_e) AS _km_nc,
    max(_km_t) FILTER (WHERE NOT _km_e) AS _km_maxc
  FROM _km_rows GROUP BY _km_gid
),
_km_cens AS (
  SELECT _km_gid, _km_n, _km_a,
    LEAD(_km_a, 1, 0) OVER (PARTITION BY _km_gid ORDER BY _km_a DESC) AS _km_next,
    SUM(CASE WHEN _km_a > 1 AND _km_a <= _km_n THEN LN(CAST(_km_a AS DOUBLE) / (_km_a - 1)) ELSE 0 END)
      OVER (PARTITION BY _km_gid ORDER BY _km_a DESC ROWS UNBOUNDED PRECEDING) AS _km_f
  FROM (
    SELECT r._km_gid, tot._km_n, r._km_a
    FROM _km_rows AS r JOIN _km_tot AS tot ON r._km_gid = tot._km_gid
    WHERE NOT r._km_e
    UNION ALL
    SELECT _km_gid, _km_n, _km_n + 1 AS _km_a FROM _km_tot
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
_km_target AS (
  SELECT _km_gid, _km_q,
    CASE WHEN c < hi AND {_survival("c + 1", "n", "ef")} <= thr THEN c + 1
      WHEN {_survival("c", "n", "ef")} <= thr THEN c
      WHEN c > lo AND {_survival("c - 1", "n", "ef")} <= thr THEN c - 1
      ELSE lo END AS _km_a
  FROM _km_guess
),
_km_est AS (
  SELECT tg._km_gid,
    {pivot}
  FROM _km_rows AS r JOIN _km_target AS tg ON r._km_gid = tg._km_gid AND r._km_a = tg._km_a
  GROUP BY tg._km_gid
){compare}"""


def _success_ctes(qs: Sequence[float], labels: Sequence[str]) -> str:
    """CTEs (text starting with ``,``) over ``_km_rows`` with ``_km_s``: ``_km_cmp``, one row per id with, per
    label, ``so_<label>`` (the nearest-rank quantile of the successful events' times), ``s_at_<label>`` (the
    Kaplan–Meier survival at that time) and ``gw_at_<label>`` (Greenwood's sum there).

    Over the event rows at or before a time ``x``, in descending rank ``a``: ``S(x) = Π (a - 1) / a`` and
    Greenwood's sum ``Σ d_u / (n_u (n_u - d_u)) = Σ 1 / (a (a - 1))`` (tied events telescope into the terms
    of their time); an event row of rank 1 at or before ``x`` makes ``S(x) = 0``.
    """
    fractions = ", ".join(quantile_decimal(q) for q in qs)
    sums = []
    outs = []
    for i, label in enumerate(labels):
        at = f"so._km_so[{i + 1}]"
        upto = f"r._km_e AND r._km_t <= {at}"
        sums.append(f"""sum(CASE WHEN {upto} AND r._km_a > 1 THEN LN(CAST(r._km_a - 1 AS DOUBLE) / r._km_a) END)
      AS _km_l{i},
    sum(CASE WHEN {upto} AND r._km_a > 1 THEN 1.0 / (CAST(r._km_a AS DOUBLE) * (r._km_a - 1)) END) AS _km_g{i},
    count_if({upto} AND r._km_a = 1) AS _km_z{i},
    ANY_VALUE({at}) AS _km_x{i}""")
        outs.append(f"""_km_x{i} AS {_quote("so_" + label)},
    CASE WHEN _km_x{i} IS NULL THEN NULL WHEN _km_z{i} > 0 THEN 0.0 ELSE EXP(coalesce(_km_l{i}, 0.0)) END
      AS {_quote("s_at_" + label)},
    CASE WHEN _km_x{i} IS NULL THEN NULL ELSE coalesce(_km_g{i}, 0.0) END AS {_quote("gw_at_" + label)}""")
    sep = ",\n    "
    return f""",
_km_so AS (
  SELECT _km_gid, quantile_disc(_km_t, [{fractions}]) FILTER (WHERE _km_e AND _km_s) AS _km_so
  FROM _km_rows GROUP BY _km_gid
),
_km_cmp AS (
  SELECT _km_gid,
    {sep.join(outs)}
  FROM (
    SELECT r._km_gid,
    {sep.join(sums)}
    FROM _km_rows AS r JOIN _km_so AS so ON r._km_gid = so._km_gid
    GROUP BY r._km_gid
  ) AS _km_sums
)"""


def km_quantiles_by_id_sql(source_sql: str, quantiles: Sequence[float], *, success: bool = False) -> str:
    """SQL computing Kaplan–Meier quantiles of ``t`` (seconds) per integer group id, by the ranking method.

    ``source_sql`` (a query or a table/view name, read once) yields ``_km_gid`` (an integer group id that
    fits a 32-bit INTEGER),
    ``t`` (DOUBLE seconds, finite, ``>= 0``, non-null: not checked here) and ``event`` (BOOLEAN, TRUE
    observed at ``t``, FALSE right-censored at ``t``). The query returns one row per id present, ordered
    by id: ``_km_gid``, ``n`` (BIGINT rows), ``n_events``, ``n_censored``, one DOUBLE column per quantile
    named by :func:`quantile_label`, in seconds (NULL where the survival curve never falls to ``1 - q``),
    and ``max_censored_t`` (DOUBLE seconds, NULL when nothing is censored). It always runs step 2 of the module
    docstring (no ``quantile_disc`` shortcut): the caller sends only the groups that need it, e.g. those
    with censored rows. Raises ``ValueError`` for no quantile, a quantile outside (0, 1) or two with the
    same label.

    With ``success`` the source also yields ``success`` (BOOLEAN: the request succeeded), and the result has,
    per quantile label, the survivor-bias comparison (docs/definitions.md, "Survivor bias"): ``so_<label>``,
    the nearest-rank quantile of the times of the successful events (the success-only quantile, seconds; NULL
    without any), ``s_at_<label>``, the Kaplan–Meier survival at that time (the share of the group still
    waiting after it), and ``gw_at_<label>``, Greenwood's sum there (the variance of ``S`` is
    ``S² · gw``).
    """
    qs, labels = _checked_labels(quantiles)
    if not qs:
        raise ValueError("km_quantiles_by_id_sql needs at least one quantile")
    source = source_sql.strip() if _NAME.fullmatch(source_sql.strip()) else f"({source_sql})"
    cols = "".join(f"est.{_quote(label)}, " for label in labels)
    flag = ", CAST(success AS BOOLEAN) AS _km_s" if success else ""
    compared = "".join(f", cmp.{_quote(p + label)}" for label in labels for p in ("so_", "s_at_", "gw_at_"))
    joined = " LEFT JOIN _km_cmp AS cmp ON tot._km_gid = cmp._km_gid" if success else ""
    return f"""WITH _km_in AS (
  SELECT CAST(_km_gid AS INTEGER) AS _km_gid, CAST(t AS DOUBLE) AS _km_t, CAST(event AS BOOLEAN) AS _km_e{flag}
  FROM {source} AS _km_source
),
{_km_ctes("_km_in", qs, labels, success=success)}
SELECT tot._km_gid, tot._km_n AS n, tot._km_ne AS n_events, tot._km_nc AS n_censored,
  {cols}tot._km_maxc AS max_censored_t{compared if success else ""}
FROM _km_tot AS tot LEFT JOIN _km_est AS est ON tot._km_gid = est._km_gid{joined}
ORDER BY tot._km_gid"""


def km_quantiles_sql(source_sql: str, group_cols: Sequence[str], quantiles: Sequence[float]) -> str:
    """SQL query computing Kaplan–Meier quantiles of ``t`` (seconds) per group of ``source_sql``.

    ``source_sql`` yields ``group_cols`` plus ``t`` (DOUBLE seconds, finite, ``>= 0``) and ``event``
    (BOOLEAN: TRUE observed at ``t``, FALSE right-censored at ``t``); see the module docstring for the
    estimator and the method (``quantile_disc`` for the groups without censoring, the ranking method
    for the others). ``source_sql`` is a query or a table/view name; it appears once in the SQL and is
    read once (its typed rows are materialised), so it may contain ``?`` parameters and need not be
    deterministic.

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
    qs, labels = _checked_labels(quantiles)
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
    order_by = f"ORDER BY {', '.join(f'grp.{g}' for g in gq)}" if gq else ""
    bad = "_km_t IS NULL OR NOT isfinite(_km_t) OR _km_t < 0 OR _km_e IS NULL"
    max_n = inverse_cdf_max_n(qs)
    disc = (
        f",\n    quantile_disc(_km_t, [{', '.join(quantile_decimal(q) for q in qs)}]) AS _km_disc"
        if max_n else ""
    )
    needs_km = f"(_km_nc > 0 OR _km_n >= {max_n})" if max_n else "TRUE"
    # One hash aggregate numbers the groups and answers the ones without censoring; their rows are never
    # ranked. The typed source is materialised so that it is read once.
    head = f"""WITH _km_typed AS MATERIALIZED (
  SELECT {gsel}CAST(t AS DOUBLE) AS _km_t, CAST(event AS BOOLEAN) AS _km_e FROM {source} AS _km_source
),
_km_grp AS MATERIALIZED (
  SELECT *, {needs_km} AS _km_needs, CAST(ROW_NUMBER() OVER () AS INTEGER) AS _km_gid
  FROM (
    SELECT {gsel}COUNT(*) AS _km_n,
      COUNT(*) FILTER (WHERE _km_e) AS _km_ne,
      COUNT(*) FILTER (WHERE NOT _km_e) AS _km_nc,
      MAX(_km_t) FILTER (WHERE NOT _km_e) AS _km_maxc,
      COALESCE(bool_or({bad}), FALSE) AS _km_bad{disc if qs else ""}
    FROM _km_typed
    {group_by}
  ) AS _km_grouped
)"""
    tail = f"""SELECT {"".join(f"grp.{g}, " for g in gq)}
  CASE WHEN grp._km_bad THEN error('{_MESSAGE}') ELSE grp._km_n END AS n,
  grp._km_ne AS n_events, grp._km_nc AS n_censored,"""
    if not qs:
        return f"""{head}
{tail}
  grp._km_maxc AS max_censored_t
FROM _km_grp AS grp
{order_by}"""

    match = " AND ".join(f"typed.{g} IS NOT DISTINCT FROM grp.{g}" for g in gq) or "TRUE"
    quantile_out = "".join(
        f"\n  CASE WHEN grp._km_needs THEN est.{_quote(label)} ELSE grp._km_disc[{i + 1}] END AS {_quote(label)},"
        if max_n else f"\n  est.{_quote(label)} AS {_quote(label)},"
        for i, label in enumerate(labels)
    )
    return f"""{head},
_km_ranked_in AS (
  SELECT grp._km_gid, typed._km_t, typed._km_e
  FROM _km_typed AS typed JOIN _km_grp AS grp ON {match}
  WHERE grp._km_needs
),
{_km_ctes("_km_ranked_in", qs, labels)}
{tail}{quantile_out}
  grp._km_maxc AS max_censored_t
FROM _km_grp AS grp LEFT JOIN _km_est AS est ON grp._km_gid = est._km_gid
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
