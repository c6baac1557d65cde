"""One duration parser serves CLI options, SLO specs and report policies."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmslo.rules._durations import parse_duration_s
from llmslo.rules._errors import SpecError
from llmslo.telemetry import format_duration, parse_duration


@pytest.mark.parametrize(("text", "seconds"), [
    ("250ms", 0.25), ("2s", 2.0), ("1.5m", 90.0), ("1h30m", 5400.0), ("30d", 2_592_000.0), ("1w", 604_800.0),
    ("500us", 0.0005), (" 2 s ", 2.0), (".5s", 0.5),
])
def test_durations_are_read_in_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "2", "2 parsecs", "s", "0s", "-1s", "1h-5m", "2sec"])
def test_a_bad_duration_is_named_with_the_accepted_forms(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


def test_specs_use_the_same_parser_and_name_the_field() -> None:
    assert parse_duration_s("1h30m", "slos[0].window") == parse_duration("1h30m")
    assert parse_duration_s(300, "scrape_interval") == 300.0
    with pytest.raises(SpecError, match=r"slos\[0\]\.window.*invalid duration"):
        parse_duration_s("5 minutes", "slos[0].window")


@given(st.integers(min_value=1, max_value=10**6), st.sampled_from(["ms", "s", "m", "h", "d"]))
def test_format_and_parse_round_trip(n: int, unit: str) -> None:
    seconds = parse_duration(f"{n}{unit}")
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)
