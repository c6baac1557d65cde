"""Wait-budget advice for a drain, and the check of a drain configuration against the rules of the update.

The wait budget (``domain.md`` §4) comes from three inputs: the caller's timeout (waiting longer than the
caller does is pointless), the request-duration quantiles (the termination rate of a budget is about
``1 − coverage``), and the update window (each of the ``batches`` drained in series settles, then waits up
to the budget). :func:`advise_wait_budget` reads all three from the store:

* **durations**: ``e2e_s`` (seconds) of the admitted requests (every finish reason but ``rejected``),
  by arrival time. A request that ended ``deadline``, ``server_draining`` or ``client_cancel`` was cut: its
  natural duration is *at least* its ``e2e_s``, so it is right-censored there, and the Kaplan–Meier
  estimator (:func:`llmslo.analysis.report.km_quantiles`, and :func:`_survival_at` for the survival at a
  budget) uses it; ``stop``, ``length`` and ``error`` end a request by themselves (observed durations).
  The completed-only figures, which drop the cut requests, are given next to the estimate because they are
  what a naive reading gives (optimistic exactly when the long requests were cut).
* **streaming or not**: the request summary has no streaming flag. The one stored trace of a stream is
  ``stream_max_queued > 0``: the server's per-request send queue held at least one chunk, which only a
  streamed response has. When some rows carry it, those are ``streaming`` and the others
  ``non_streaming``, and each kind gets its own quantile (one budget must cover both: the advice takes the
  larger). When no row carries it (importers and sources without the send queue write 0) the store cannot
  tell the kinds apart, and one distribution (``all``) is given, with that note.
* **termination rate** of a budget ``b``: the share of admitted requests whose duration exceeds ``b``, the
  Kaplan–Meier ``S(b)``. This is the document's "1 − coverage" over request durations (not over the
  length-biased population in flight at one instant).
* **update window**: ``batches × (settle + budget)`` seconds, the longest a serial update takes when every
  batch waits its whole budget; the settle comes from ``settle_s`` or else the latest stored update's
  ``unregister_settle_s``.
* **observed curve**: from the stored update records (``list_updates``), each update's budget against its
  termination rate ``terminated / in_flight_at_start``.

:func:`check_drain_config` validates a drain configuration (the keys of ``llmslo.controls.DrainConfig``
plus ``overlap_window_s``, ``batches``, ``termination_grace_period_s`` and ``exit_margin_s``) against the
rules of the update: budget ≤ caller timeout, idle threshold above the observed p99.9 inter-token gap,
overlap window ≥ update window, and Kubernetes' grace period ≥ settle + budget + exit margin. The three of the
``need <= limit`` shape are :mod:`._rules`' (their one home, shared with ``llmslo.ops``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import duckdb

from llmslo.analysis.report import km_quantiles, quantile_label
from llmslo.analysis.rollout._records import RolloutInputError, UpdateRecord, list_updates
from llmslo.analysis.rollout._rules import (
    RuleVerdict,
    budget_verdict,
    grace_verdict,
    update_window_verdict,
)
from llmslo.analysis.store import SUMMARY_TABLE

CENSORING_REASONS: tuple[str, ...] = ("client_cancel", "deadline", "server_draining")
"""Finish reasons that cut a request short: its natural duration is at least its ``e2e_s`` (censored)."""

STREAMING_SQL = "stream_max_queued > 0"
"""What marks a stored request as streamed: its send queue held a chunk (no other column says so)."""

IDLE_GAP_QUANTILE = 0.999
"""The inter-token gap quantile the idle threshold must exceed (``check_drain_config``)."""

DEFAULT_SETTLE_S = 5.0
"""``DrainConfig.unregister_settle_s``'s default, used when no settle is given or stored (seconds)."""

DRAIN_DEFAULTS: Mapping[str, object] = {
    "wait_budget_s": 120.0,
    "unregister_settle_s": DEFAULT_SETTLE_S,
    "idle_threshold_s": 30.0,
    "max_inflight_s": 300.0,
    "caller_timeout_s": None,
    "normal_gap_s": None,
    "on_budget": "terminate",
    "poll_interval_s": 0.5,
    "requeue_tenant_classes": (),
}
"""The fields of ``llmslo.controls.DrainConfig`` and their defaults (a test keeps the two equal)."""

UPDATE_KEYS: Mapping[str, object] = {"overlap_window_s": None, "batches": 1, "termination_grace_period_s": None,
                                     "exit_margin_s": 0.0}
"""The keys a drain configuration file adds to ``DrainConfig``'s: the overlap window (seconds), the number of
batches drained in series, and Kubernetes' ``terminationGracePeriodSeconds`` with the time the processes
need to exit after the drain (seconds)."""

ON_BUDGET: tuple[str, ...] = ("terminate", "return_to_pool")
"""``DrainConfig.on_budget``'s allowed values."""

DEFINITIONS: Mapping[str, str] = {
    "duration": "e2e_s of admitted requests (finish - arrival, seconds); rejected requests excluded",
    "censored": "finish_reason in " + ", ".join(CENSORING_REASONS) + ": the natural duration is at least e2e_s",
    "quantile_s": "Kaplan-Meier quantile of the duration (censored requests count as 'at least e2e_s')",
    "completed_only": "the same figure over requests that ended by themselves only (drops the cut ones)",
    "termination_rate": "Kaplan-Meier share of admitted requests whose duration exceeds the budget "
                        "(1 - coverage)",
    "update_window_s": "batches x (settle + budget): a serial update where every batch waits its whole budget",
    "observed_termination_rate": "terminated / in_flight_at_start of a stored update",
    "streaming": f"{STREAMING_SQL} (the server's send queue held a chunk); no other stored column says so",
}
"""What each figure of :class:`BudgetAdvice` means, printed with it."""

Kind = Literal["all", "streaming", "non_streaming"]
Status = Literal["pass", "fail", "skipped"]


# ---- validation --------------------------------------------------------------------------------------------


def _number(name: str, value: object) -> float:
    """``value`` as a finite float; :class:`RolloutInputError` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RolloutInputError(f"{name}: must be a finite number, got {value!r}")
    return float(value)


def _positive(name: str, value: object, *, zero: bool = False) -> float:
    """Seconds ``> 0`` (``>= 0`` with ``zero``); :class:`RolloutInputError` naming ``name`` otherwise."""
    number = _number(name, value)
    if number < 0 or (number == 0 and not zero):
        raise RolloutInputError(f"{name}: must be a number {'>= 0' if zero else '> 0'} seconds, got {value!r}")
    return number


def _quantile(value: object) -> float:
    q = _number("quantile", value)
    if not 0.0 < q < 1.0:
        raise RolloutInputError(f"quantile: must be strictly between 0 and 1 (e.g. 0.99), got {value!r}")
    return q


def _batches(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RolloutInputError(f"{name}: must be a whole number of batches >= 1, got {value!r}")
    return value


def _window(from_unix_s: float | None, to_unix_s: float | None) -> tuple[float | None, float | None]:
    lo = None if from_unix_s is None else _number("from_unix_s", from_unix_s)
    hi = None if to_unix_s is None else _number("to_unix_s", to_unix_s)
    if lo is not None and hi is not None and lo >= hi:
        raise RolloutInputError(f"from_unix_s: must be before to_unix_s, got {lo!r} >= {hi!r}")
    return lo, hi


# ---- the advice --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DurationFit:
    """The duration distribution of one kind of request and what a budget does to it (seconds, shares).

    ``quantile_s`` is the Kaplan–Meier quantile (None when the cut requests leave it unbounded: it is then
    at least ``quantile_at_least_s``); ``budget_s`` the budget this kind alone would need (the quantile
    rounded up to a whole second, capped by the caller timeout); ``termination_rate`` the Kaplan–Meier share
    of its requests longer than the advice's budget, ``completed_only_termination_rate`` the same share among
    the requests that ended by themselves (None without any).
    """

    kind: Kind
    admitted: int
    completed: int
    censored: int
    quantile_s: float | None
    quantile_at_least_s: float | None
    completed_only_quantile_s: float | None
    budget_s: float
    termination_rate: float
    completed_only_termination_rate: float | None

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind, "admitted": self.admitted, "completed": self.completed, "censored": self.censored,
            "quantile_s": self.quantile_s, "quantile_at_least_s": self.quantile_at_least_s,
            "completed_only_quantile_s": self.completed_only_quantile_s, "budget_s": self.budget_s,
            "termination_rate": self.termination_rate,
            "completed_only_termination_rate": self.completed_only_termination_rate,
        }


@dataclass(frozen=True)
class ObservedUpdate:
    """One stored update on the observed curve: its budget (seconds) and termination rate (a share); its start
    is None when the record gives none."""

    update_id: str
    started_unix_s: float | None
    wait_budget_s: float | None
    in_flight_at_start: int | None
    terminated: int | None
    termination_rate: float | None

    def to_dict(self) -> dict[str, object]:
        return {
            "update_id": self.update_id, "started_unix_s": self.started_unix_s,
            "wait_budget_s": self.wait_budget_s, "in_flight_at_start": self.in_flight_at_start,
            "terminated": self.terminated, "termination_rate": self.termination_rate,
        }


@dataclass(frozen=True)
class BudgetAdvice:
    """The advice of :func:`advise_wait_budget`; every time in seconds, every rate a share in [0, 1].

    ``recommended_budget_s``: the ``quantile`` of the duration (the larger of the kinds' when streaming and
    non-streaming are told apart), rounded up to a whole second and capped by ``caller_timeout_s``
    (``cap_binds`` says whether the cap decided). ``budget_s``: the budget evaluated (the recommended one
    unless another was asked for); ``termination_rate`` its Kaplan–Meier termination rate over all admitted
    requests and ``coverage`` = 1 − that; ``update_window_s`` = ``batches × (settle_s + budget_s)``.
    ``observed``: the stored updates' budget against termination rate, by budget.
    """

    caller_timeout_s: float
    quantile: float
    batches: int
    settle_s: float
    settle_source: str
    from_unix_s: float | None
    to_unix_s: float | None
    recommended_budget_s: float
    cap_binds: bool
    budget_s: float
    termination_rate: float
    coverage: float
    completed_only_termination_rate: float | None
    update_window_s: float
    overall: DurationFit
    by_kind: tuple[DurationFit, ...]
    observed: tuple[ObservedUpdate, ...]
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, object]:
        """The JSON of ``llmslo drain advise --json`` (seconds, shares)."""
        return {
            "caller_timeout_s": self.caller_timeout_s, "quantile": self.quantile,
            "quantile_label": quantile_label(self.quantile), "batches": self.batches,
            "settle_s": self.settle_s, "settle_source": self.settle_source,
            "from_unix_s": self.from_unix_s, "to_unix_s": self.to_unix_s,
            "recommended_budget_s": self.recommended_budget_s, "cap_binds": self.cap_binds,
            "budget_s": self.budget_s, "termination_rate": self.termination_rate, "coverage": self.coverage,
            "completed_only_termination_rate": self.completed_only_termination_rate,
            "update_window_s": self.update_window_s, "overall": self.overall.to_dict(),
            "by_kind": [k.to_dict() for k in self.by_kind],
            "observed": [o.to_dict() for o in self.observed],
            "notes": list(self.notes), "definitions": dict(DEFINITIONS),
        }


def _durations_sql(from_unix_s: float | None, to_unix_s: float | None) -> tuple[str, list[object]]:
    """A query yielding ``kind`` (streaming or not), ``t`` (``e2e_s``) and ``event`` (not cut) per admitted row."""
    where = ["finish_reason <> 'rejected'"]
    params: list[object] = []
    if from_unix_s is not None:
        where.append("arrival_unix_s >= ?")
        params.append(from_unix_s)
    if to_unix_s is not None:
        where.append("arrival_unix_s < ?")
        params.append(to_unix_s)
    cut = ", ".join(f"'{r}'" for r in CENSORING_REASONS)
    sql = (f"SELECT CASE WHEN {STREAMING_SQL} THEN 'streaming' ELSE 'non_streaming' END AS kind, "
           f"CAST(e2e_s AS DOUBLE) AS t, finish_reason NOT IN ({cut}) AS event "
           f"FROM {SUMMARY_TABLE} WHERE {' AND '.join(where)}")
    return sql, params


def _survival_at(con: duckdb.DuckDBPyConnection, source_sql: str, params: Sequence[object],
                 budget_s: float) -> dict[str, tuple[float, float | None]]:
    """Per ``kind`` of ``source_sql`` (and ``all``): Kaplan–Meier ``S(budget_s)`` and the completed-only share.

    ``S(b) = Π_{u <= b} (1 − d_u / n_u)`` over the distinct event times ``u`` (``d_u`` events at ``u``,
    ``n_u`` rows with ``t >= u``: at a tie censorings stay at risk, the convention of ``km_quantiles``); a
    request ending exactly at the budget is covered. The completed-only share is the fraction of the
    uncensored rows with ``t > b`` (None without any).
    """
    query = f"""WITH src AS MATERIALIZED ({source_sql}),
both_ AS (SELECT kind, t, event FROM src UNION ALL SELECT 'all' AS kind, t, event FROM src),
per_t AS (SELECT kind, t, count(*) FILTER (WHERE event) AS d, count(*) AS m FROM both_ GROUP BY kind, t),
risk AS (SELECT kind, t, d, sum(m) OVER (PARTITION BY kind ORDER BY t DESC ROWS UNBOUNDED PRECEDING) AS n
         FROM per_t),
km AS (SELECT kind,
         CASE WHEN coalesce(bool_or(d = n) FILTER (WHERE t <= ? AND d > 0), false) THEN 0.0
              ELSE exp(coalesce(sum(ln(1.0 - d / n)) FILTER (WHERE t <= ? AND d > 0), 0.0)) END AS s
       FROM risk GROUP BY kind),
naive AS (SELECT kind, count(*) FILTER (WHERE event AND t > ?) / nullif(count(*) FILTER (WHERE event), 0) AS r
          FROM both_ GROUP BY kind)
SELECT km.kind, km.s, naive.r FROM km JOIN naive ON km.kind = naive.kind"""
    rows = con.execute(query, [*params, budget_s, budget_s, budget_s]).fetchall()
    # rounded to 12 digits: the float noise of the product must not show in a printed share
    return {str(k): (round(float(s), 12), None if r is None else round(float(r), 12)) for k, s, r in rows}


@dataclass
class _Fit:
    """One kind's counts and quantiles (seconds) as the queries give them."""

    admitted: int
    completed: int
    censored: int
    quantile_s: float | None
    at_least_s: float | None
    completed_only_s: float | None = None


def _quantiles(con: duckdb.DuckDBPyConnection, source_sql: str, params: Sequence[object], q: float) -> dict[str, _Fit]:
    """Per kind present and ``all``: counts, the KM quantile and its lower bound, the completed-only quantile."""
    label = quantile_label(q)
    out: dict[str, _Fit] = {}
    for groups, source in (([], f"SELECT t, event FROM ({source_sql})"), (["kind"], source_sql)):
        frame = km_quantiles(con, source, groups, [q], params)
        for row in frame.iter_rows(named=True):
            if row["n"]:
                out[str(row["kind"]) if groups else "all"] = _Fit(
                    int(row["n"]), int(row["n_events"]), int(row["n_censored"]), _opt_float(row[label]),
                    _opt_float(row["max_censored_t"]))
    naive = con.execute(
        f"SELECT kind, quantile_disc(t, {q!r}) FILTER (WHERE event) FROM ({source_sql}) GROUP BY ROLLUP (kind)",
        list(params)).fetchall()
    for kind, value in naive:
        key = "all" if kind is None else str(kind)
        if key in out:
            out[key].completed_only_s = _opt_float(value)
    return out


def _budget_for(quantile_s: float | None, caller_timeout_s: float) -> float:
    """The quantile rounded up to a whole second, capped by the caller timeout (the cap when unbounded)."""
    if quantile_s is None:
        return caller_timeout_s
    return min(float(math.ceil(quantile_s - 1e-9)) if quantile_s > 0 else 0.0, caller_timeout_s)


def _drain_count(update: UpdateRecord, name: str) -> int | None:
    """A count of the record's drain section (``terminated``, ``in_flight_at_start``), None when absent."""
    drain = update.record.get("drain")
    value = drain.get(name) if isinstance(drain, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _observed(updates: Sequence[UpdateRecord], from_unix_s: float | None,
              to_unix_s: float | None) -> tuple[ObservedUpdate, ...]:
    """The stored updates started in ``[from, to)``, by budget: ``terminated / in_flight_at_start`` each.

    The counts come from the record's impact section, else from its drain section."""
    found = []
    for u in updates:
        start = u.started_unix_s  # a record without a start lies in no chosen period
        if (from_unix_s is not None and (start is None or start < from_unix_s)) or \
                (to_unix_s is not None and (start is None or start >= to_unix_s)):
            continue
        n = u.in_flight_at_start if u.in_flight_at_start is not None else _drain_count(u, "in_flight_at_start")
        k = u.terminated if u.terminated is not None else _drain_count(u, "terminated")
        found.append(ObservedUpdate(u.update_id, u.started_unix_s, u.wait_budget_s, n, k,
                                    k / n if k is not None and n else None))
    return tuple(sorted(found, key=lambda o: (o.wait_budget_s is None, o.wait_budget_s or 0.0,
                                              o.started_unix_s is None, o.started_unix_s or 0.0)))


def _stored_settle(updates: Sequence[UpdateRecord]) -> float | None:
    """The latest stored update's ``unregister_settle_s`` (seconds), None when no update holds one.

    ``updates`` come by start time (``list_updates``), so the last one holding a settle is the latest; a
    record without a start counts only when none has one, the last stored of them."""
    held = [u for u in updates if u.unregister_settle_s is not None]
    timed = [u for u in held if u.started_unix_s is not None]
    untimed = sorted((u for u in held if u.started_unix_s is None), key=lambda u: u.recorded_unix_s or 0.0)
    latest = timed[-1] if timed else (untimed[-1] if untimed else None)
    return None if latest is None else latest.unregister_settle_s


def advise_wait_budget(
    con: duckdb.DuckDBPyConnection,
    *,
    caller_timeout_s: float,
    quantile: float = 0.99,
    batches: int = 1,
    settle_s: float | None = None,
    from_unix_s: float | None = None,
    to_unix_s: float | None = None,
    budget_s: float | None = None,
) -> BudgetAdvice:
    """The wait budget for a drain, from the stored request durations and the caller's timeout (seconds).

    ``caller_timeout_s`` caps the budget; ``quantile`` (in (0, 1)) is the share of requests the budget should
    cover; ``batches`` (>= 1) the instances drained in series; ``settle_s`` the discovery settle per batch
    (default: the latest stored update's ``unregister_settle_s``, else 5 s); ``from_unix_s``/``to_unix_s``
    restrict to requests that arrived (and updates that started) in ``[from, to)``; ``budget_s`` evaluates
    another budget than the recommended one. See the module docstring for the estimators.

    Example::

        advice = advise_wait_budget(store.con, caller_timeout_s=300, batches=4)
        advice.recommended_budget_s, advice.termination_rate, advice.update_window_s

    Raises :class:`RolloutInputError` naming the argument for a bad value, or when no admitted request is
    stored in the window (nothing to base a budget on).
    """
    timeout = _positive("caller_timeout_s", caller_timeout_s)
    q = _quantile(quantile)
    n_batches = _batches("batches", batches)
    lo, hi = _window(from_unix_s, to_unix_s)
    asked = None if budget_s is None else _positive("budget_s", budget_s)
    given_settle = None if settle_s is None else _positive("settle_s", settle_s, zero=True)
    notes: list[str] = []

    source, params = _durations_sql(lo, hi)
    fits = _quantiles(con, source, params, q)
    if "all" not in fits:
        raise RolloutInputError("no admitted request is stored"
                                + (" in the window" if lo is not None or hi is not None else "")
                                + ": nothing to base a wait budget on; ingest request summaries first")
    kinds = [k for k in ("streaming", "non_streaming") if k in fits]
    if kinds == ["non_streaming"]:
        notes.append(f"the store cannot tell streaming from non-streaming requests (no row has {STREAMING_SQL}):"
                     " one distribution for all")
    elif kinds == ["streaming"]:
        notes.append("every stored request was streamed: one distribution for all")
    split = len(kinds) == 2
    budgets = {k: _budget_for(f.quantile_s, timeout) for k, f in fits.items()}
    recommended = max(budgets[k] for k in kinds) if split else budgets["all"]
    raw = [fits[k].quantile_s for k in (kinds if split else ["all"])]
    cap_binds = any(r is None or r > timeout for r in raw)
    if cap_binds:
        notes.append(f"the caller timeout ({timeout:g} s) caps the budget: the {quantile_label(q)} duration is "
                     "longer, and waiting longer than the caller does is pointless")
    for k, f in fits.items():
        if f.quantile_s is None:
            notes.append(f"{k}: so many long requests were cut that the {quantile_label(q)} duration is unbounded "
                         f"(at least {f.at_least_s or 0.0:g} s)")
    chosen = recommended if asked is None else asked
    if asked is not None and not (over := budget_verdict(asked, timeout)).holds:
        notes.append(over.message)
    surv = _survival_at(con, source, params, chosen)

    def fit(kind: Kind) -> DurationFit:
        f, (s, naive) = fits[kind], surv[kind]
        return DurationFit(
            kind=kind, admitted=f.admitted, completed=f.completed, censored=f.censored, quantile_s=f.quantile_s,
            quantile_at_least_s=f.at_least_s if f.quantile_s is None else None,
            completed_only_quantile_s=f.completed_only_s, budget_s=budgets[kind], termination_rate=s,
            completed_only_termination_rate=naive)

    updates = list_updates(con)
    if given_settle is not None:
        settle, settle_source = given_settle, "given"
    elif (stored := _stored_settle(updates)) is not None:
        settle, settle_source = stored, "latest stored update's unregister_settle_s"
    else:
        settle, settle_source = DEFAULT_SETTLE_S, "DrainConfig default (no stored update holds one)"
    overall = fit("all")
    return BudgetAdvice(
        caller_timeout_s=timeout, quantile=q, batches=n_batches, settle_s=settle, settle_source=settle_source,
        from_unix_s=lo, to_unix_s=hi, recommended_budget_s=recommended, cap_binds=cap_binds, budget_s=chosen,
        termination_rate=overall.termination_rate, coverage=1.0 - overall.termination_rate,
        completed_only_termination_rate=overall.completed_only_termination_rate,
        update_window_s=n_batches * (settle + chosen), overall=overall,
        by_kind=(fit("streaming"), fit("non_streaming")) if split else (), observed=_observed(updates, lo, hi),
        notes=tuple(notes))


def _opt_float(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


# ---- the configuration check ---------------------------------------------------------------------------------

DRAIN_RULES: tuple[str, ...] = ("budget_within_caller_timeout", "idle_above_gap_p999", "overlap_covers_update_window",
                                 "grace_covers_drain")
"""The rules :func:`check_drain_config` checks, in order."""


@dataclass(frozen=True)
class DrainCheck:
    """One rule of :data:`DRAIN_RULES` applied to a drain configuration.

    ``status``: ``pass``, ``fail`` or ``skipped`` (an input the rule needs is absent; ``message`` says which).
    ``values``: the figures the rule compared (seconds, batches); ``fix``: what to change when it fails.
    """

    rule: str
    status: Status
    values: Mapping[str, float | int | None]
    message: str
    fix: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {"rule": self.rule, "status": self.status, "values": dict(self.values), "message": self.message,
                "fix": self.fix}


@dataclass(frozen=True)
class _Config:
    wait_budget_s: float
    unregister_settle_s: float
    idle_threshold_s: float | None
    caller_timeout_s: float | None
    normal_gap_s: float | None
    overlap_window_s: float | None
    batches: int
    termination_grace_period_s: float | None
    exit_margin_s: float


def _optional_seconds(name: str, value: object) -> float | None:
    return None if value is None else _positive(name, value)


def _parse_config(config: Mapping[str, object]) -> _Config:
    """Every key known and every value of the right type (the rules are checked later, all of them)."""
    if not isinstance(config, Mapping):
        raise RolloutInputError(f"the drain configuration must be a mapping of keys to values, got {config!r}")
    known = {**DRAIN_DEFAULTS, **UPDATE_KEYS}
    unknown = sorted(str(k) for k in config if k not in known)
    if unknown:
        raise RolloutInputError(f"{', '.join(unknown)}: unknown key(s); allowed: {', '.join(sorted(known))}")
    c = {**known, **config}
    for name in ("max_inflight_s", "poll_interval_s"):
        if name == "poll_interval_s" or c[name] is not None:
            _positive(name, c[name])
    if c["on_budget"] not in ON_BUDGET:
        raise RolloutInputError(f"on_budget: must be one of {', '.join(ON_BUDGET)}, got {c['on_budget']!r}")
    classes = c["requeue_tenant_classes"]
    if classes is None:
        classes = ()
    if isinstance(classes, str) or not isinstance(classes, (list, tuple)) \
            or not all(isinstance(x, str) and x for x in classes):
        raise RolloutInputError(f"requeue_tenant_classes: must be a list of tenant class names, got {classes!r}")
    return _Config(
        wait_budget_s=_positive("wait_budget_s", c["wait_budget_s"]),
        unregister_settle_s=_positive("unregister_settle_s", c["unregister_settle_s"], zero=True),
        idle_threshold_s=_optional_seconds("idle_threshold_s", c["idle_threshold_s"]),
        caller_timeout_s=_optional_seconds("caller_timeout_s", c["caller_timeout_s"]),
        normal_gap_s=_optional_seconds("normal_gap_s", c["normal_gap_s"]),
        overlap_window_s=None if c["overlap_window_s"] is None
        else _positive("overlap_window_s", c["overlap_window_s"], zero=True),
        batches=_batches("batches", c["batches"]),
        termination_grace_period_s=_optional_seconds("termination_grace_period_s", c["termination_grace_period_s"]),
        exit_margin_s=_positive("exit_margin_s", c["exit_margin_s"], zero=True),
    )


def _bound_check(rule: str, values: Mapping[str, float | int | None], verdict: RuleVerdict | None,
                 skipped: str) -> DrainCheck:
    """A ``need <= limit`` rule of :mod:`._rules` as a :class:`DrainCheck`: ``skipped`` (with that message) when
    its limit is not set (``verdict`` None), else passed or failed as the verdict says."""
    if verdict is None:
        return DrainCheck(rule, "skipped", values, skipped)
    return DrainCheck(rule, "pass" if verdict.holds else "fail", values, verdict.message, verdict.fix)


def _budget_rule(cfg: _Config) -> DrainCheck:
    budget, timeout = cfg.wait_budget_s, cfg.caller_timeout_s
    return _bound_check(DRAIN_RULES[0], {"wait_budget_s": budget, "caller_timeout_s": timeout},
                        None if timeout is None else budget_verdict(budget, timeout),
                        "caller_timeout_s is not set: set it to the callers' timeout (seconds) to check the budget "
                        "against it")


def _stored_gap(con: duckdb.DuckDBPyConnection) -> tuple[float | None, int]:
    """The p99.9 of the stored inter-token gaps (``itl_s`` of admitted requests, seconds) and their count."""
    row = con.execute(
        f"SELECT quantile_disc(g, {IDLE_GAP_QUANTILE!r}), count(g) FROM "
        f"(SELECT unnest(itl_s) AS g FROM {SUMMARY_TABLE} WHERE itl_s IS NOT NULL AND finish_reason <> 'rejected')"
    ).fetchone()
    if row is None or not row[1]:
        return None, 0
    return float(row[0]), int(row[1])


def _idle_rule(cfg: _Config, con: duckdb.DuckDBPyConnection | None) -> DrainCheck:
    rule, idle = DRAIN_RULES[1], cfg.idle_threshold_s
    gap, n = _stored_gap(con) if con is not None else (None, 0)
    source = f"p99.9 of {n:,} stored itl_s gaps"
    if gap is None and cfg.normal_gap_s is not None:
        gap, source = cfg.normal_gap_s, "normal_gap_s (no stored itl_s gap" + (")" if con is not None else
                                                                                 ": no store given)")
    values = {"idle_threshold_s": idle, "gap_p999_s": gap, "gaps": n}
    if idle is None:
        return DrainCheck(rule, "skipped", values, "idle_threshold_s is null: streams are never closed as idle")
    if gap is None:
        why = "the store holds no itl_s gap" if con is not None else "no store given (--db)"
        return DrainCheck(rule, "skipped", values, f"{why} and normal_gap_s is not set: nothing to compare "
                                                   "idle_threshold_s with")
    if idle > gap:
        return DrainCheck(rule, "pass", values, f"idle_threshold_s {idle:g} s > {source} ({gap:g} s)")
    return DrainCheck(rule, "fail", values,
                      f"idle_threshold_s {idle:g} s is not above the {source} ({gap:g} s): healthy streams "
                      "would be closed as idle", f"raise idle_threshold_s above {gap:g}")


def _overlap_rule(cfg: _Config) -> DrainCheck:
    overlap, window = cfg.overlap_window_s, cfg.batches * (cfg.unregister_settle_s + cfg.wait_budget_s)
    values = {"overlap_window_s": overlap, "update_window_s": window, "batches": cfg.batches,
              "unregister_settle_s": cfg.unregister_settle_s, "wait_budget_s": cfg.wait_budget_s}
    verdict = None if overlap is None else update_window_verdict(cfg.batches, cfg.unregister_settle_s,
                                                                 cfg.wait_budget_s, overlap)
    return _bound_check(DRAIN_RULES[2], values, verdict, "overlap_window_s is not set: set how long the previous "
                                                         "version is kept (seconds) to check it")


def _grace_rule(cfg: _Config) -> DrainCheck:
    grace = cfg.termination_grace_period_s
    values = {"termination_grace_period_s": grace,
              "needed_s": cfg.unregister_settle_s + cfg.wait_budget_s + cfg.exit_margin_s,
              "unregister_settle_s": cfg.unregister_settle_s, "wait_budget_s": cfg.wait_budget_s,
              "exit_margin_s": cfg.exit_margin_s}
    verdict = None if grace is None else grace_verdict(cfg.unregister_settle_s, cfg.wait_budget_s,
                                                       cfg.exit_margin_s, grace)
    return _bound_check(DRAIN_RULES[3], values, verdict, "termination_grace_period_s is not set: set the pods' "
                                                         "terminationGracePeriodSeconds to check it against the drain")


def evaluate_drain_config(config: Mapping[str, object], *,
                          con: duckdb.DuckDBPyConnection | None = None) -> list[DrainCheck]:
    """Every rule of :data:`DRAIN_RULES` applied to ``config``: passed, failed or skipped.

    Same arguments and errors as :func:`check_drain_config`."""
    cfg = _parse_config(config)
    return [_budget_rule(cfg), _idle_rule(cfg, con), _overlap_rule(cfg), _grace_rule(cfg)]


def check_drain_config(config: Mapping[str, object], *,
                       con: duckdb.DuckDBPyConnection | None = None) -> list[DrainCheck]:
    """The rules of :data:`DRAIN_RULES` that ``config`` breaks (empty when none does).

    ``config`` holds the keys of ``llmslo.controls.DrainConfig`` (seconds; absent keys take its defaults)
    plus ``overlap_window_s`` (seconds the previous version is kept) and ``batches`` (instances drained in
    series, default 1). With ``con`` (a store) the idle threshold is compared with the p99.9 of the stored
    ``itl_s`` gaps, else with ``normal_gap_s``. A rule whose input is absent is skipped (see
    :func:`evaluate_drain_config`).

    Example::

        check_drain_config({"wait_budget_s": 400, "caller_timeout_s": 300})[0].fix
        # 'lower wait_budget_s to at most 300'

    Raises :class:`RolloutInputError` naming the key for an unknown key or a value of the wrong type.
    """
    return [c for c in evaluate_drain_config(config, con=con) if c.status == "fail"]
