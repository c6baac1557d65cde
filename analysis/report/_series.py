"""Empirical distribution curves of the report's latency intervals, for plotting.

:func:`latency_ecdf` samples the empirical CDF of one interval per group at evenly spaced probabilities,
from exact order statistics, over the same population as the report's distributions (every request for
which the interval is defined, whatever its finish reason; ITL token-weighted from the stored gaps).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import duckdb

from llmslo.analysis.report._report import GROUP_COLUMNS, LATENCY_INTERVALS
from llmslo.analysis.store import SUMMARY_TABLE
from llmslo.telemetry import TPOT_SQL, ConfigurationError

__all__ = ["ECDF_MAX_POINTS", "Ecdf", "latency_ecdf"]

ECDF_MAX_POINTS = 1000
"""The most probabilities one curve is sampled at."""

_EXPR: dict[str, str] = {"ttft_s": "ttft_s", "tpot_s": f"({TPOT_SQL})", "e2e_s": "e2e_s", "queue_s": "queue_s",
                         "client_ttft_s": "client_ttft_s", "itl_s": "unnest(itl_s)"}


@dataclass(frozen=True)
class Ecdf:
    """The empirical CDF of ``interval`` over one group (``keys``: column values), ``count`` values.

    ``values_s[i]`` (seconds) is the smallest value ``v`` with ``F(v) >= fractions[i]``, ``F`` the empirical
    CDF (the inverse empirical CDF: an exact order statistic, numpy's ``inverted_cdf`` quantile); the first
    point is the minimum at fraction 0, the last the maximum at fraction 1.
    """

    keys: Mapping[str, Any]
    interval: str
    count: int
    values_s: tuple[float, ...]
    fractions: tuple[float, ...]


def _fractions(points: int) -> list[Decimal]:
    return [Decimal(k) / Decimal(points) for k in range(1, points + 1)]


def latency_ecdf(
    con: duckdb.DuckDBPyConnection, interval: str, *, by: Sequence[str] = (), points: int = 200
) -> list[Ecdf]:
    """The empirical CDF of ``interval`` (one of :data:`~llmslo.analysis.report.LATENCY_INTERVALS`) per
    group of ``by`` (columns of :data:`~llmslo.analysis.report.GROUP_COLUMNS`), sampled at the ``points``
    probabilities ``1/points, 2/points, ..., 1`` plus the minimum; groups in key order, a group without a
    defined value left out.

    Raises :class:`~llmslo.telemetry.ConfigurationError` for an unknown interval or column, a repeated
    column, or ``points`` outside ``[1, ECDF_MAX_POINTS]``.
    """
    if interval not in LATENCY_INTERVALS:
        raise ConfigurationError(
            f"latency_ecdf: unknown interval {interval!r}; choose from {', '.join(LATENCY_INTERVALS)}")
    for column in by:
        if column not in GROUP_COLUMNS:
            raise ConfigurationError(f"latency_ecdf: unknown column {column!r}; choose from {', '.join(GROUP_COLUMNS)}")
    if len(set(by)) != len(by):
        raise ConfigurationError(f"latency_ecdf: a column is repeated in {','.join(by)}")
    if not (isinstance(points, int) and 1 <= points <= ECDF_MAX_POINTS):
        raise ConfigurationError(f"latency_ecdf: points must be an integer in [1, {ECDF_MAX_POINTS}], got {points!r}")
    fractions = _fractions(points)
    keys = list(by)
    cols = ", ".join([*keys, f"{_EXPR[interval]} AS x"])
    group = f" GROUP BY {', '.join(keys)} ORDER BY {', '.join(keys)}" if keys else ""
    listed = ", ".join(str(f) for f in fractions)
    sql = (f"SELECT {', '.join([*keys, 'count(x) AS n', 'min(x) AS lo', f'quantile_disc(x, [{listed}]) AS q'])} "
           f"FROM (SELECT {cols} FROM {SUMMARY_TABLE}) AS v WHERE x IS NOT NULL{group}")
    out: list[Ecdf] = []
    for row in con.sql(sql).fetchall():
        key_values, (n, lo, qs) = row[: len(keys)], row[len(keys):]
        if not n:
            continue
        values = (float(lo), *(float(v) for v in qs))
        out.append(Ecdf(dict(zip(keys, key_values, strict=True)), interval, int(n), values,
                        (0.0, *(float(f) for f in fractions))))
    return out
