"""The request-summary contract: the per-row validator and its SQL twin agree, rule by rule."""

from __future__ import annotations

import math
from typing import Any

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmslo.telemetry import (
    COLUMN_NAMES,
    COLUMNS,
    FINISH_REASONS,
    RULES,
    TPOT_SQL,
    tpot_s,
    validate_summary,
)
from llmslo.tests._rows import BREAKERS, cancelled_row, ok_row, rejected_row


def test_valid_rows_have_no_violation() -> None:
    assert validate_summary(ok_row()) == []
    assert validate_summary(rejected_row()) == []
    assert validate_summary(cancelled_row()) == []


@pytest.mark.parametrize(("rule", "column", "overrides"), BREAKERS, ids=[f"{b[0]}-{b[1]}" for b in BREAKERS])
def test_each_rule_rejects_its_bad_row(rule: str, column: str, overrides: dict[str, Any]) -> None:
    found = {(v.rule, v.column) for v in validate_summary(ok_row(**overrides))}
    assert (rule, column) in found


def test_missing_and_unknown_columns_are_named() -> None:
    row = ok_row()
    del row["e2e_s"]
    row["ttft"] = 0.5
    found = {(v.rule, v.column) for v in validate_summary(row)}
    assert ("missing", "e2e_s") in found
    assert ("unknown_column", "ttft") in found


def test_nan_interval_is_not_finite() -> None:
    found = {(v.rule, v.column) for v in validate_summary(ok_row(e2e_s=math.nan))}
    assert ("non_finite", "e2e_s") in found


def test_tpot_excludes_first_token_and_is_undefined_for_one_token() -> None:
    assert tpot_s(0.5, 1.5, 11) == pytest.approx(0.1)
    assert tpot_s(0.5, 0.5, 1) is None
    assert tpot_s(None, None, 0) is None


def test_columns_are_unique_and_documented() -> None:
    assert len(set(COLUMN_NAMES)) == len(COLUMN_NAMES)
    assert all(c.doc for c in COLUMNS)
    assert "tpot_s" not in COLUMN_NAMES  # derived, never stored twice


_CON = duckdb.connect()
_maybe_time = st.one_of(st.none(), st.floats(min_value=-1, max_value=5, allow_nan=False))
_count = st.integers(min_value=-1, max_value=4)


@st.composite
def _rows(draw: st.DrawFn) -> dict[str, Any]:
    return ok_row(
        finish_reason=draw(st.sampled_from(FINISH_REASONS)),
        reject_reason=draw(st.one_of(st.none(), st.just("queue_full"))),
        queue_s=draw(_maybe_time), ttft_s=draw(_maybe_time), last_token_s=draw(_maybe_time),
        e2e_s=draw(st.floats(min_value=0, max_value=5)),
        generated_tokens=draw(_count), sent_tokens=draw(_count),
        itl_s=draw(st.one_of(st.none(), st.lists(st.floats(min_value=-1, max_value=1), max_size=3))),
    )


@settings(max_examples=300, deadline=None)
@given(_rows())
def test_python_rules_agree_with_their_sql_form(row: dict[str, Any]) -> None:
    con = _CON
    cols = ["finish_reason", "reject_reason", "queue_s", "ttft_s", "last_token_s", "e2e_s",
            "generated_tokens", "sent_tokens", "itl_s"]
    types = ["VARCHAR", "VARCHAR", "DOUBLE", "DOUBLE", "DOUBLE", "DOUBLE", "BIGINT", "BIGINT", "DOUBLE[]"]
    select = ", ".join(f"CAST(? AS {t}) AS {c}" for c, t in zip(cols, types, strict=True))
    checks = ", ".join(f"coalesce({r.sql}, FALSE)" for r in RULES)
    got = con.sql(f"SELECT {checks} FROM (SELECT {select})", params=[row[c] for c in cols]).fetchall()[0]
    for rule, sql_says in zip(RULES, got, strict=True):
        assert bool(sql_says) == rule.check(row), rule.name


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=0, max_value=10), st.floats(min_value=0, max_value=10), st.integers(0, 1000))
def test_tpot_sql_matches_python(ttft: float, decode: float, n: int) -> None:
    last = ttft + decode
    got = _CON.sql(
        f"SELECT {TPOT_SQL} FROM (SELECT ?::DOUBLE AS ttft_s, ?::DOUBLE AS last_token_s, "
        "?::BIGINT AS generated_tokens)", params=[ttft, last, n],
    ).fetchall()[0][0]
    want = tpot_s(ttft, last, n)
    assert (got is None) == (want is None)
    if want is not None:
        assert got == pytest.approx(want, rel=1e-12)
